"""plugins/plugin_utils/llama_rpc_k8s.py: the plan grouped for the Kubernetes manifests."""

from __future__ import annotations

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import llama_rpc_k8s as k
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import PlanError, parse

X64, ARM = "1" * 64, "2" * 64
RELEASES = {
    "b1": {
        "ubuntu-x64": {"url": "http://m/x64.tgz", "sha256": X64},
        "ubuntu-arm64": {"url": "http://m/arm.tgz", "sha256": ARM},
    }
}
FACTS = {
    "head": {"arch": "x86_64"},
    "a": {"kube_arch": "amd64"},
    "b": {"arch": "x86_64"},
    "pi": {"arch": "aarch64"},
}


def host(name, role, total, usable=1000.0, reserve=64.0, threads=4):
    return {
        "name": name,
        "role": role,
        "predicted_mib": {"total": total},
        "usable_mib": usable,
        "reserve_mib": reserve,
        "threads": threads,
    }


def plan(**over):
    p = {
        "head": "head",
        "workers": ["a", "b", "pi"],
        "hosts": [
            host("head", "head", 100.4),
            host("a", "worker", 200.2, usable=500, threads=4),
            host("b", "worker", 150.0, usable=700, reserve=100, threads=2),
            host("pi", "worker", 90.0, usable=300, threads=4),
        ],
        "fallbacks": [
            {
                "workers": ["a", "pi"],
                "ok": True,
                "hosts": [host("a", "worker", 310.5), host("pi", "worker", 120.0)],
            },
            {"workers": ["b"], "ok": False, "reason": "short", "hosts": [host("b", "worker", 9999.0)]},
        ],
        "model": {
            "url": "http://m/model.gguf",
            "sha256": "3" * 64,
            "file": "/x/model.gguf",
            "bytes": 3 * (1 << 30) + 1,
        },
    }
    p.update(over)
    return p


def test_workers_are_grouped_by_kubernetes_architecture() -> None:
    groups = k.worker_groups(plan(), FACTS)
    assert {a: g["workers"] for a, g in groups.items()} == {"amd64": ["a", "b"], "arm64": ["pi"]}


def test_request_is_the_largest_need_over_plan_and_ok_fallbacks_only() -> None:
    groups = k.worker_groups(plan(), FACTS)
    assert groups["amd64"]["request_mib"] == 311  # a's fallback 310.5, rounded up; b's refused 9999 ignored
    assert groups["arm64"]["request_mib"] == 120


def test_limit_is_the_largest_usable_minus_reserve_and_threads_the_smallest() -> None:
    groups = k.worker_groups(plan(), FACTS)
    assert groups["amd64"]["limit_mib"] == 600  # b: 700 - 100 > a: 500 - 64
    assert groups["amd64"]["threads"] == 2
    arm = {key: groups["arm64"][key] for key in ("workers", "request_mib", "limit_mib", "threads")}
    assert arm == {"workers": ["pi"], "request_mib": 120, "limit_mib": 236, "threads": 4}
    # a CPU plan: no -d, no environment, no device, no node pinning (the DaemonSet of old)
    assert (groups["arm64"]["args"], groups["arm64"]["env"], groups["arm64"]["limits"]) == ([], [], {})
    assert (groups["arm64"]["nodes"], groups["arm64"]["avoid"], groups["arm64"]["pin"]) == ([], [], "arm64")


@pytest.mark.parametrize(
    ("fact", "arch"),
    [
        ({"kube_arch": "arm"}, "arm"),
        ({"arch": "aarch64"}, "arm64"),
        ({"arch": "x86_64"}, "amd64"),
        ({}, "amd64"),
    ],
)
def test_kube_arch(fact, arch) -> None:
    assert k.kube_arch(fact) == arch


def test_facts_pin_every_architecture_and_list_one_daemonset_each() -> None:
    facts = k.k8s_facts(plan(), FACTS, RELEASES, "b1", output_dir="/out/")
    assert facts["problems"] == []
    assert facts["llama_cpp"] == {
        "amd64": {"flavour": "ubuntu-x64", "url": "http://m/x64.tgz", "sha256": X64},
        "arm64": {"flavour": "ubuntu-arm64", "url": "http://m/arm.tgz", "sha256": ARM},
    }
    daemonsets = [m for m in facts["manifests"] if m["kind"] == "DaemonSet"]
    assert [(m["arch"], m["file"]) for m in daemonsets] == [
        ("amd64", "llama-rpc-08-daemonset-amd64.yaml"),
        ("arm64", "llama-rpc-08-daemonset-arm64.yaml"),
    ]
    assert facts["manifests"][0]["kind"] == "Namespace"
    assert [m["kind"] for m in facts["manifests"] if m["secret"]] == ["Secret"]
    assert facts["head"] == {
        "name": "head",
        "arch": "amd64",
        "request_mib": 101,
        "pin": "amd64",
        "env": [],
        "limits": {},
        "image": "",
    }
    assert facts["model"] == {
        "url": "http://m/model.gguf",
        "sha256": "3" * 64,
        "file": "model.gguf",
        "size": 3 * (1 << 30) + 1,  # the pods' download stops there
    }
    assert facts["pvc_size"] == "6Gi"  # 3 GiB + 1 byte -> 4, + 2
    assert facts["manifest_dir"] == "/out/manifests" and facts["key_file"] == "/out/llama-rpc-api-key"


def test_the_head_architecture_needs_a_pin_too() -> None:
    p = plan(workers=["pi"])
    facts = k.k8s_facts(p, FACTS, {"b1": {"ubuntu-arm64": RELEASES["b1"]["ubuntu-arm64"]}}, "b1")
    assert facts["problems"] == [
        "llama.cpp build b1 has no url and 64-hex sha256 for ubuntu-x64 (amd64) in llama_rpc_k8s_llama_cpp_releases"
    ]


def test_problems_name_what_the_pods_would_lack() -> None:
    p = plan(model={"file": "m.gguf", "sha256": "nope"})
    bad = {"b1": {"ubuntu-x64": {"url": "http://m/x64.tgz", "sha256": "short"}}}
    problems = k.k8s_facts(p, {**FACTS, "pi": {"arch": "riscv64"}}, bad, "b1")["problems"]
    assert "no llama.cpp release flavour for the architecture riscv64" in problems
    assert any("ubuntu-x64 (amd64)" in m for m in problems)
    assert any("no model url" in m for m in problems)
    assert "the plan has no 64-hex model sha256" in problems
    assert k.k8s_facts(plan(), FACTS, RELEASES, "")["problems"][0].startswith("llama_rpc_k8s_llama_cpp_build")


def test_a_given_model_url_and_claim_size_win() -> None:
    facts = k.k8s_facts(plan(), FACTS, RELEASES, "b1", model_url="http://other/m.gguf", pvc_size="50Gi")
    assert facts["model"]["url"] == "http://other/m.gguf" and facts["pvc_size"] == "50Gi"


def test_a_plan_without_workers_lists_llama_server_alone_with_static_discovery() -> None:
    """The head alone holds the model: nothing for workers, and no Role to list pods with."""
    alone = plan(workers=[], hosts=[host("head", "head", 100.4)], fallbacks=[])
    facts = k.k8s_facts(alone, FACTS, RELEASES, "b1")
    assert facts["problems"] == []
    assert facts["archs"] == {} and set(facts["llama_cpp"]) == {"amd64"}
    assert facts["workerless"] is True and facts["discovery"] == "static"
    kinds = [m["kind"] for m in facts["manifests"]]
    assert kinds == [
        "Namespace", "Secret", "ConfigMap", "ServiceAccount", "PersistentVolumeClaim", "Deployment", "Service",
    ]  # fmt: skip
    with_workers = k.k8s_facts(plan(), FACTS, RELEASES, "b1")
    assert with_workers["workerless"] is False and with_workers["discovery"] == "kubernetes"
    assert {"Role", "RoleBinding", "NetworkPolicy", "DaemonSet"} <= {
        m["kind"] for m in with_workers["manifests"]
    }


def test_the_plan_is_read_typed_once_and_a_bad_one_is_named() -> None:
    """A parsed Plan gives what its dict gives; a plan that cannot be read names the field."""
    assert k.k8s_facts(parse(plan()), FACTS, RELEASES, "b1") == k.k8s_facts(plan(), FACTS, RELEASES, "b1")
    with pytest.raises(PlanError, match=r"workers must be names of worker rows of hosts, got \['zz'\]"):
        k.k8s_facts(plan(workers=["zz"]), FACTS, RELEASES, "b1")
    broken = plan(fallbacks=[{"ok": True, "hosts": [{"name": "a", "predicted_mib": "lots"}]}])
    with pytest.raises(PlanError, match=r"fallbacks\[0\]\.hosts\[0\]\.predicted_mib"):
        k.worker_groups(broken, FACTS)


def gpu_plan(head_gpu=False):
    """``a`` offers Vulkan0 then its CPU, ``b`` and ``pi`` their CPU; the head its own Vulkan0 too."""
    p = plan()
    p["version"] = 2
    for row in p["hosts"]:
        row["layers"] = {"head": [0, 0], "a": [0, 2], "b": [2, 4], "pi": [4, 6]}[row["name"]]
        row["devices"] = [
            {"name": "CPU", "backend": "cpu", "type": "cpu", "layers": row["layers"], "report_name": "CPU"}
        ]
    p["hosts"][1]["devices"] = [
        {"name": "Vulkan0", "backend": "vulkan", "type": "gpu", "layers": [0, 1], "report_name": "RPC0"},
        {"name": "CPU", "backend": "cpu", "type": "cpu", "layers": [1, 2], "report_name": "RPC1"},
    ]
    if head_gpu:
        p["hosts"][0]["devices"].insert(
            0, {"name": "Vulkan0", "backend": "vulkan", "type": "gpu", "layers": [0, 0], "output_layer": True}
        )
    return p


VULKAN = {"ubuntu-vulkan-x64": {"url": "http://m/vk.tgz", "sha256": "4" * 64}}
GPU_RELEASES = {"b1": {**RELEASES["b1"], **VULKAN}}


def test_a_gpu_worker_gets_its_own_daemonset_with_its_devices_env_and_resource() -> None:
    """The old code refused this plan ("a: the plan puts layers on Vulkan0; the Kubernetes target
    serves CPU devices only so far"); now ``a`` is served as the systemd unit serves it."""
    envs = {"a": {"GGML_VK_VISIBLE_DEVICES": "0"}}
    facts = k.k8s_facts(gpu_plan(), FACTS, GPU_RELEASES, "b1", envs=envs)
    assert facts["problems"] == []
    groups = facts["archs"]
    assert sorted(groups) == ["amd64", "amd64-vulkan-0", "arm64"]
    gpu = groups["amd64-vulkan-0"]
    assert gpu["workers"] == gpu["nodes"] == ["a"]
    assert gpu["args"] == ["-d", "Vulkan0,CPU"]
    assert gpu["env"] == [{"name": "GGML_VK_VISIBLE_DEVICES", "value": "0"}]
    assert gpu["limits"] == {"gpu.intel.com/i915": 1}
    assert (gpu["arch"], gpu["pin"], gpu["request_mib"], gpu["threads"]) == ("amd64", "vulkan-amd64", 311, 4)
    assert facts["llama_cpp"]["vulkan-amd64"] == {
        "flavour": "ubuntu-vulkan-x64",
        **VULKAN["ubuntu-vulkan-x64"],
    }
    # the CPU DaemonSet of the architecture keeps off the GPU worker's node; arm64 has none to avoid
    assert groups["amd64"]["workers"] == ["b"] and groups["amd64"]["avoid"] == ["a"]
    assert (groups["amd64"]["args"], groups["amd64"]["limits"], groups["arm64"]["avoid"]) == ([], {}, [])
    # the CPU head keeps the CPU pin; the DaemonSets are listed by their keys
    assert facts["head"]["pin"] == "amd64" and facts["head"]["limits"] == {}
    daemonsets = [m for m in facts["manifests"] if m["kind"] == "DaemonSet"]
    assert [(m["arch"], m["file"]) for m in daemonsets] == [
        ("amd64", "llama-rpc-08-daemonset-amd64.yaml"),
        ("amd64-vulkan-0", "llama-rpc-08-daemonset-amd64-vulkan-0.yaml"),
        ("arm64", "llama-rpc-08-daemonset-arm64.yaml"),
    ]


def test_a_gpu_backend_runs_in_its_own_image_when_given() -> None:
    images = {"vulkan": "registry.example/llama-vulkan:1"}
    facts = k.k8s_facts(gpu_plan(head_gpu=True), FACTS, GPU_RELEASES, "b1", images=images)
    assert facts["archs"]["amd64-vulkan-0"]["image"] == facts["head"]["image"] == images["vulkan"]
    assert facts["archs"]["amd64"]["image"] == facts["archs"]["arm64"]["image"] == ""
    assert k.k8s_facts(gpu_plan(), FACTS, GPU_RELEASES, "b1", images=images)["head"]["image"] == ""


def test_the_head_gpu_gets_its_resource_env_and_the_vulkan_pin() -> None:
    facts = k.k8s_facts(
        gpu_plan(head_gpu=True), FACTS, GPU_RELEASES, "b1", envs={"head": {"GGML_VK_VISIBLE_DEVICES": 0}}
    )
    assert facts["problems"] == []
    head = facts["head"]
    assert (head["pin"], head["limits"]) == ("vulkan-amd64", {"gpu.intel.com/i915": 1})
    assert head["env"] == [{"name": "GGML_VK_VISIBLE_DEVICES", "value": "0"}]


def test_two_gpu_workers_serving_alike_share_a_daemonset_others_do_not() -> None:
    p = gpu_plan()
    p["hosts"][2]["devices"] = [
        {"name": "Vulkan0", "backend": "vulkan", "type": "gpu", "layers": [2, 3], "report_name": "RPC2"},
        {"name": "CPU", "backend": "cpu", "type": "cpu", "layers": [3, 4], "report_name": "RPC3"},
    ]
    alike = k.k8s_facts(p, FACTS, GPU_RELEASES, "b1")["archs"]
    assert alike["amd64-vulkan-0"]["nodes"] == ["a", "b"] and "amd64" not in alike
    other = k.k8s_facts(p, FACTS, GPU_RELEASES, "b1", envs={"b": {"GGML_VK_VISIBLE_DEVICES": "1"}})["archs"]
    assert other["amd64-vulkan-0"]["nodes"] == ["a"] and other["amd64-vulkan-1"]["nodes"] == ["b"]


def test_a_missing_gpu_pin_or_a_mixed_host_is_a_problem_naming_it() -> None:
    problems = k.k8s_facts(gpu_plan(), FACTS, RELEASES, "b1")["problems"]
    assert problems == [
        "llama.cpp build b1 has no url and 64-hex sha256 for ubuntu-vulkan-x64 (amd64) in "
        "llama_rpc_k8s_llama_cpp_releases"
    ]
    p = gpu_plan()
    p["hosts"][1]["devices"][1].update(name="CUDA0", backend="cuda", type="gpu")
    (problem,) = k.k8s_facts(p, FACTS, GPU_RELEASES, "b1")["problems"]
    assert problem.startswith("a: the plan puts layers on devices of several backends (cuda, vulkan)")

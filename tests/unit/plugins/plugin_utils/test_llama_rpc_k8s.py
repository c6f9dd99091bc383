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
    assert groups["arm64"] == {"workers": ["pi"], "request_mib": 120, "limit_mib": 236, "threads": 4}


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
    assert facts["head"] == {"name": "head", "arch": "amd64", "request_mib": 101}
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


def test_a_plan_with_a_gpu_device_is_refused_on_kubernetes_naming_the_host() -> None:
    """The pods serve CPU devices only so far: a GPU plan is a problem, not a wrong DaemonSet."""
    p = plan()
    p["version"] = 2
    for row in p["hosts"]:
        row["layers"] = {"head": [0, 0], "a": [0, 2], "b": [2, 4], "pi": [4, 6]}[row["name"]]
        row["devices"] = [
            {"name": "CPU", "backend": "cpu", "type": "cpu", "layers": row["layers"], "report_name": "CPU"}
        ]
    a = p["hosts"][1]
    a["devices"] = [
        {"name": "Vulkan0", "backend": "vulkan", "type": "gpu", "layers": [0, 1], "report_name": "RPC0"},
        {"name": "CPU", "backend": "cpu", "type": "cpu", "layers": [1, 2], "report_name": "RPC1"},
    ]
    problems = k.k8s_facts(p, FACTS, RELEASES, "b1")["problems"]
    assert [x.split(";")[0] for x in problems] == ["a: the plan puts layers on Vulkan0"]

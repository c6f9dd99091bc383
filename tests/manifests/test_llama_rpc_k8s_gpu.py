"""The ``kubernetes`` target of llmfleet.cluster.llama_rpc for a GPU fleet, rendered for real by
playbooks/render.yml (tests/fixtures/llama_rpc_k8s/gpu: a head with a Vulkan GPU, a worker
offering its Vulkan GPU and its CPU, a CPU worker; the planner plans them over devices).

- every object passes ``kubernetes-validate --strict`` for Kubernetes 1.33 and 1.37;
- the GPU worker gets its own DaemonSet: the plan's ``-d`` list (plan.json's own device names of
  that host, in its order), ``llmfleet_llama_cpp_env``, the device plugin's resource, the Vulkan
  pin, and a node affinity to its own node, which the CPU DaemonSet keeps off;
- the head's llama-server gets the Vulkan pin, the environment and its GPU's resource, and its
  ``--device`` / ``--tensor-split`` come only from plan.json (the supervisor's arguments carry none);
- (slow) the GPU worker container's command, arguments and environment, read from the rendered
  YAML, run with the pinned Vulkan rpc-server on Mesa's lavapipe: it offers the plan's devices in
  the plan's order (loopback, no container, a few seconds).

The old code refused this plan ("the Kubernetes target serves CPU devices only so far").
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.manifests.test_llama_rpc_k8s import (
    BUILD,
    FIXTURES,
    K8S_VERSIONS,
    ROOT,
    Rendered,
    _render,
    containers,
    inventory_facts,
    selects,
    whatif_vars,
)
from tests.support.k8s_validate import assert_valid

GPU_FLEET = FIXTURES / "gpu"
VULKAN_PIN = {"url": "http://mirror.example.internal/vulkan-x64.tar.gz", "sha256": "c" * 64}
VULKAN_RPC_SERVER = ROOT / ".cache" / "llama.cpp-vulkan" / "bin" / "ggml-rpc-server"
LAVAPIPE = list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json"))


VULKAN_IMAGE = "registry.example.internal/llmfleet-vulkan:bookworm"


def gpu_vars() -> dict:
    extra = whatif_vars()
    extra["llama_cpp_releases"][BUILD]["ubuntu-vulkan-x64"] = VULKAN_PIN
    extra["llama_rpc_k8s_gpu_images"] = {"vulkan": VULKAN_IMAGE}
    return extra


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Rendered:
    return _render(tmp_path_factory, GPU_FLEET, gpu_vars(), "gpu")


def plan_row(rendered: Rendered, name: str) -> dict:
    (row,) = [h for h in rendered.plan["hosts"] if h["name"] == name]
    return row


def daemonset(rendered: Rendered, name: str) -> dict:
    return rendered.one("DaemonSet", "llama-rpc-server-" + name)


def node_terms(pod_spec: dict) -> list[dict]:
    affinity = pod_spec.get("affinity", {}).get("nodeAffinity", {})
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return [e for t in terms for e in t["matchExpressions"]]


def gpu_worker() -> str:
    facts = inventory_facts(GPU_FLEET)
    (name,) = [
        n for n, f in facts.items() if n != "head1" and any(d["backend"] != "cpu" for d in f["devices"])
    ]
    return name


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_of_the_gpu_fleet_passes_kubernetes_validate_strict(rendered, version) -> None:
    assert sorted(d["metadata"]["name"] for d in rendered.kind("DaemonSet")) == [
        "llama-rpc-server-amd64",
        "llama-rpc-server-amd64-vulkan-0",
    ]
    assert_valid(rendered.files, version)


def test_the_plan_puts_layers_on_the_gpus_of_the_worker_and_the_head(rendered) -> None:
    """The fixture is what it claims: the planner gave both GPUs layers (else the test proves little)."""
    worker = plan_row(rendered, gpu_worker())
    assert [d["name"] for d in worker["devices"]] == ["Vulkan0", "CPU"]
    assert all(d["layers"][1] > d["layers"][0] for d in worker["devices"])
    head = plan_row(rendered, rendered.plan["head"])
    assert any(d["backend"] == "vulkan" and d["layers"][1] > d["layers"][0] for d in head["devices"])


def test_the_gpu_worker_serves_its_planned_devices_on_its_own_node(rendered) -> None:
    name = gpu_worker()
    row = plan_row(rendered, name)
    ds = daemonset(rendered, "amd64-vulkan-0")
    spec = ds["spec"]["template"]["spec"]
    assert selects(ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"])
    (server,) = spec["containers"]
    # -d: plan.json's own device names of this host, in its order (what --device RPC<n> counts)
    assert server["args"][-2:] == ["-d", ",".join(d["name"] for d in row["devices"])]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["GGML_VK_VISIBLE_DEVICES"] == "0"  # llmfleet_llama_cpp_env of the host
    assert server["image"] == VULKAN_IMAGE  # the init containers keep the role's python image
    assert containers(spec)["llama-cpp"]["image"] != VULKAN_IMAGE
    gpus = sum(1 for d in row["devices"] if d["backend"] == "vulkan" and d["type"] != "cpu")
    assert server["resources"]["limits"]["gpu.intel.com/i915"] == gpus == 1
    assert node_terms(spec) == [{"key": "kubernetes.io/hostname", "operator": "In", "values": [name]}]
    fetch = containers(spec)["llama-cpp"]
    keys = {e["name"]: e["valueFrom"]["configMapKeyRef"]["key"] for e in fetch["env"]}
    assert keys["LLAMA_CPP_URL"] == "llama-cpp-vulkan-amd64-url"
    data = rendered.configmap["data"]
    assert data["llama-cpp-vulkan-amd64-url"] == VULKAN_PIN["url"]
    assert data["llama-cpp-vulkan-amd64-sha256"] == VULKAN_PIN["sha256"]
    assert (
        ds["spec"]["template"]["metadata"]["annotations"]["llmfleet.io/llama-cpp-sha256"]
        == VULKAN_PIN["sha256"]
    )


def test_the_cpu_daemonset_keeps_off_the_gpu_workers_node_and_serves_as_before(rendered) -> None:
    spec = daemonset(rendered, "amd64")["spec"]["template"]["spec"]
    assert node_terms(spec) == [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [gpu_worker()]}
    ]
    (server,) = spec["containers"]
    assert "-d" not in server["args"] and server["args"][-1] == "--cache"
    assert set(server["resources"]["limits"]) == {"memory"} and server["image"] != VULKAN_IMAGE
    assert {e["name"] for e in server["env"]} == {"LLAMA_CACHE", "GGML_NO_BACKTRACE"}
    keys = {e["valueFrom"]["configMapKeyRef"]["key"] for e in containers(spec)["llama-cpp"]["env"]}
    assert keys == {"llama-cpp-amd64-url", "llama-cpp-amd64-sha256"}


def test_the_head_uses_its_gpu_with_the_plans_own_device_arguments(rendered) -> None:
    deployment = rendered.deployment
    spec = deployment["spec"]["template"]["spec"]
    server = containers(spec)["llama-server"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert server["resources"]["limits"] == {"gpu.intel.com/i915": 1}
    assert server["image"] == VULKAN_IMAGE
    keys = {e["valueFrom"]["configMapKeyRef"]["key"] for e in containers(spec)["llama-cpp"]["env"]}
    assert keys == {"llama-cpp-vulkan-amd64-url", "llama-cpp-vulkan-amd64-sha256"}
    # --device / --tensor-split: plan.json's, which the supervisor passes on; never in the manifest
    assert not {"--device", "--tensor-split"} & set(server["args"])
    args = rendered.plan["llama_server_args"]
    assert args[args.index("--device") + 1].split(",")[0] == "Vulkan0"
    owners = env["LLMFLEET_K8S_OWNERS"].split(",")
    assert sorted(owners) == sorted(d["metadata"]["name"] for d in rendered.kind("DaemonSet"))


@pytest.mark.slow
@pytest.mark.skipif(not VULKAN_RPC_SERVER.is_file(), reason="no Vulkan build in .cache/llama.cpp-vulkan")
@pytest.mark.skipif(not LAVAPIPE, reason="no Mesa lavapipe (mesa-vulkan-drivers)")
def test_the_rendered_gpu_worker_command_serves_the_planned_devices_for_real(rendered, tmp_path) -> None:
    """The GPU worker container's command, args and env from the YAML, run with the pinned Vulkan
    rpc-server (lavapipe is its Vulkan0 here): it offers Vulkan0 then CPU, the plan's order."""
    row = plan_row(rendered, gpu_worker())
    (server,) = daemonset(rendered, "amd64-vulkan-0")["spec"]["template"]["spec"]["containers"]
    argv = [*server["command"], *server["args"]]
    assert argv[0] == "/opt/llama.cpp/current/llmfleet-rpc-server"
    argv[0] = str(VULKAN_RPC_SERVER)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        argv[argv.index("--port") + 1] = str(free.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_")}
    env.update({e["name"]: e["value"] for e in server["env"]})
    env["LLAMA_CACHE"] = str(tmp_path / "cache")  # the pod's hostPath is not here; --cache stays
    env["LD_LIBRARY_PATH"] = str(VULKAN_RPC_SERVER.parent)
    proc = subprocess.Popen(
        ["stdbuf", "-oL", "-eL", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    timer = threading.Timer(60, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:  # it prints its devices, then serves until stopped
            lines.append(line)
            if "transport" in line:
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    out = "".join(lines)
    served = [line.strip() for line in out.partition("Devices:")[2].splitlines() if line.strip()]
    listed = [line.split(":")[0] for line in served[: len(row["devices"])]]
    assert listed == [d["name"] for d in row["devices"]] == ["Vulkan0", "CPU"], out

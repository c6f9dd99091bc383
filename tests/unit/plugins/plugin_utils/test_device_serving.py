"""A host serves the devices the plan gave it: rpc-server's -d, the environment, the device nodes.

Plans come from the planner itself on recorded machines (tests/fixtures/hosts): the NVIDIA
desktop (Vulkan0 + its CPU), the AMD APU laptop and the CPU NAS.
"""

from __future__ import annotations

import copy

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_serving import (
    ServingError,
    gpu_workers,
    k8s_serving,
    serving,
)

from tests.support.host_trees import recorded_hosts
from tests.unit.plugins.plugin_utils.test_placement import host, layout

DESKTOP, NAS = "rtx3060-desktop", "celeron-nas"


@pytest.fixture(scope="module")
def gpu_plan() -> dict:
    """The NAS as the head, the desktop as a worker offering Vulkan0 and its CPU."""
    root = recorded_hosts()
    nas = P.host_from_fact(NAS, hostinfo.probe(str(root / NAS)))
    desktop = P.host_from_fact(DESKTOP, hostinfo.probe(str(root / DESKTOP)), address="10.0.0.2")
    return P.plan_llama_cpp(layout(n_layer=60, layer_mib=300), nas, [desktop])


@pytest.fixture(scope="module")
def cpu_plan() -> dict:
    return P.plan_llama_cpp(layout(n_layer=8, layer_mib=100), host("h", 300), [host("w", 4096)])


def test_a_gpu_worker_offers_exactly_its_planned_devices_in_order(gpu_plan) -> None:
    got = serving(gpu_plan, DESKTOP, "ubuntu-vulkan-x64", {"GGML_VK_VISIBLE_DEVICES": 0})
    assert got["args"] == ["-d", "Vulkan0,CPU"]
    # the head's --device RPC0,RPC1 counts exactly these, in this order
    args = gpu_plan["llama_server_args"]
    assert args[args.index("--device") + 1] == "RPC0,RPC1"
    assert got["env"] == ["GGML_VK_VISIBLE_DEVICES=0"]
    assert got["gpu"] is True
    assert got["device_allow"] == ["char-drm rw", "char-nvidia-frontend rw", "char-nvidia-uvm rw"]
    assert got["groups"] == ["render", "video"]
    service = got["unit_lines"]["service"].splitlines()
    assert "PrivateDevices=false" in service and "DevicePolicy=closed" in service
    assert "PrivateDevices=true" not in service
    assert "Environment=GGML_VK_VISIBLE_DEVICES=0" in service
    assert got["unit_lines"]["args"] == " -d Vulkan0,CPU"


def test_a_cpu_head_of_a_gpu_fleet_keeps_its_sandbox(gpu_plan) -> None:
    got = serving(gpu_plan, NAS, "ubuntu-x64")
    assert got == {
        "devices": ["CPU"],
        "args": [],
        "env": [],
        "device_allow": [],
        "groups": [],
        "gpu": False,
        "unit_lines": {"args": "", "service": "PrivateDevices=true"},
    }


def test_a_cpu_only_worker_of_a_cpu_build_keeps_todays_command_line(cpu_plan) -> None:
    got = serving(cpu_plan, "w", "ubuntu-x64")
    assert got["args"] == [] and got["unit_lines"]["args"] == ""
    assert got["unit_lines"]["service"] == "PrivateDevices=true"


def test_a_gpu_build_planned_on_its_cpu_alone_is_told_so(cpu_plan) -> None:
    """rpc-server of a GPU build offers its GPUs and not its CPU unless -d says otherwise."""
    got = serving(cpu_plan, "w", "ubuntu-vulkan-x64")
    assert got["args"] == ["-d", "CPU"]
    assert got["device_allow"] == [] and got["gpu"] is False


def test_a_device_the_build_lacks_is_refused_naming_host_device_and_build(gpu_plan) -> None:
    with pytest.raises(ServingError, match=r"rtx3060-desktop: .*Vulkan0.*ubuntu-x64 is a CPU build"):
        serving(gpu_plan, DESKTOP, "ubuntu-x64")
    with pytest.raises(
        ServingError, match=r"rtx3060-desktop: .*Vulkan0 \(vulkan\).*ubuntu-cuda-x64 carries cuda"
    ):
        serving(gpu_plan, DESKTOP, "ubuntu-cuda-x64")
    # a source build: its backend is not known from the name
    assert serving(gpu_plan, DESKTOP, "source")["args"] == ["-d", "Vulkan0,CPU"]


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"GGML VK": "0"}, "not an environment variable name"),
        ({"GGML_VK_VISIBLE_DEVICES": "0\nExecStartPre=/bin/sh"}, "line break"),
        ({"A": ["0"]}, "string or a number"),
        (["GGML_VK_VISIBLE_DEVICES=0"], "mapping"),
    ],
)
def test_a_bad_environment_is_refused_naming_the_host(gpu_plan, env, match) -> None:
    with pytest.raises(ServingError, match="rtx3060-desktop: .*" + match):
        serving(gpu_plan, DESKTOP, "ubuntu-vulkan-x64", env)


def test_a_host_outside_the_plan_is_named(gpu_plan) -> None:
    with pytest.raises(ServingError, match="stranger is not in the plan"):
        serving(gpu_plan, "stranger")


def test_kubernetes_serves_a_gpu_worker_as_systemd_does(gpu_plan) -> None:
    """The container gets the unit's -d list and environment, and the device plugin's resource
    (the old code refused the plan: ``k8s_problems``)."""
    env = {"GGML_VK_VISIBLE_DEVICES": 0}
    got = k8s_serving(gpu_plan, DESKTOP, "ubuntu-vulkan-x64", env)
    unit = serving(gpu_plan, DESKTOP, "ubuntu-vulkan-x64", env)
    assert got["args"] == unit["args"] == ["-d", "Vulkan0,CPU"]
    assert got["env"] == [{"name": "GGML_VK_VISIBLE_DEVICES", "value": "0"}]
    assert got["limits"] == {"gpu.intel.com/i915": 1}
    assert (got["backend"], got["gpu"]) == ("vulkan", True)
    amd = k8s_serving(gpu_plan, DESKTOP, "ubuntu-vulkan-x64", env, {"vulkan": "amd.com/gpu"})
    assert amd["limits"] == {"amd.com/gpu": 1}
    # the CPU head of this fleet asks for no device
    head = k8s_serving(gpu_plan, NAS, "ubuntu-x64", env)
    assert (head["args"], head["limits"], head["gpu"]) == ([], {}, False)
    with pytest.raises(ServingError, match=r"rtx3060-desktop: .*Vulkan0 .*a CPU build"):
        k8s_serving(gpu_plan, DESKTOP, "ubuntu-x64", env)


@pytest.mark.parametrize(
    ("backend", "kind", "resource"),
    [("cuda", "gpu", {"nvidia.com/gpu": 1}), ("rocm", "igpu", {"amd.com/gpu": 1}), ("vulkan", "cpu", {})],
)
def test_each_backend_asks_for_its_device_plugins_resource(gpu_plan, backend, kind, resource) -> None:
    """CUDA: nvidia.com/gpu; ROCm: amd.com/gpu; a CPU-type Vulkan device (lavapipe): nothing."""
    plan = copy.deepcopy(gpu_plan)
    (row,) = [h for h in plan["hosts"] if h["name"] == DESKTOP]
    name = {"cuda": "CUDA0", "rocm": "ROCm0", "vulkan": "Vulkan0"}[backend]
    row["devices"][0].update(name=name, backend=backend, type=kind)
    got = k8s_serving(plan, DESKTOP, f"ubuntu-{backend}-x64")
    assert got["limits"] == resource
    assert got["args"] == ["-d", name + ",CPU"]


def test_the_workers_that_serve_a_gpu_are_the_rows_with_gpu_devices(gpu_plan) -> None:
    """The llama_rpc role's serve_plan restarts these (a Jinja loop over plan_serving(w).gpu
    before, issue #29): the desktop offering Vulkan0 and its CPU is one, a CPU-only worker is not,
    and a plan without workers has none."""
    root = recorded_hosts()
    nas = P.host_from_fact(NAS, hostinfo.probe(str(root / NAS)))
    desktop = P.host_from_fact(DESKTOP, hostinfo.probe(str(root / DESKTOP)), address="10.0.0.2")
    both = P.plan_llama_cpp(layout(n_layer=60, layer_mib=800), nas, [desktop, host("w", 40960)])
    assert both["workers"] == [DESKTOP, "w"]
    assert [d["name"] for d in both["hosts"][2]["devices"]] == ["CPU"]
    assert gpu_workers(both) == [DESKTOP]
    assert [w for w in both["workers"] if serving(both, w)["gpu"]] == gpu_workers(both)
    assert gpu_workers(gpu_plan) == [DESKTOP]
    alone = P.plan_llama_cpp(layout(n_layer=8, layer_mib=30), nas, [])
    assert alone["workers"] == [] and gpu_workers(alone) == []

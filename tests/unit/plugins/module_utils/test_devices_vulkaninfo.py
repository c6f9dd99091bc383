"""The probe's Vulkan prediction before a build is installed (module_utils/devices.py, vulkaninfo).

A test host whose only Vulkan device is Mesa's lavapipe (inventories/demo-gpu) keeps the CPU
flavour by the verdict; the inventory chooses the Vulkan flavour (llama_cpp_flavour) and the probe
predicts that build's devices from the Vulkan loader's own listing, with llama.cpp's rule for
GGML_VK_VISIBLE_DEVICES (ggml-vulkan.cpp of the pinned source). tests/fixtures/devices/lavapipe/
vulkaninfo.txt is bookworm's vulkaninfo (vulkan-tools 1.3.239) with lavapipe (Mesa 22.3.6).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import devices as dev
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import DeviceError
from ansible_collections.llmfleet.cluster.plugins.module_utils.hostinfo import Tree

from tests.support.host_trees import recorded_hosts

FIXTURES = recorded_hosts()
LAVAPIPE = Path(__file__).resolve().parents[3] / "fixtures" / "devices" / "lavapipe"
VULKANINFO = (LAVAPIPE / "vulkaninfo.txt").read_text()
LLVMPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"

# A desktop's discrete card (with VK_EXT_memory_budget: budget and usage per heap) before lavapipe,
# in the shape vulkaninfo prints (only the lines the parser reads, and a few it must skip).
TWO_DEVICES = """==========
VULKANINFO
==========

Device Properties and Extensions:
=================================
GPU0:
VkPhysicalDeviceProperties:
---------------------------
\tapiVersion        = 1.3.277 (4206869)
\tdeviceType        = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName        = NVIDIA GeForce RTX 3060

VkPhysicalDeviceMemoryProperties:
=================================
memoryHeaps: count = 2
\tmemoryHeaps[0]:
\t\tsize   = 12884901888 (0x300000000) (12.00 GiB)
\t\tbudget = 12465471488 (0x2e7000000) (11.61 GiB)
\t\tusage  = 402653184 (0x18000000) (384.00 MiB)
\t\tflags: count = 1
\t\t\tMEMORY_HEAP_DEVICE_LOCAL_BIT
\tmemoryHeaps[1]:
\t\tsize   = 16777216000 (0x3e8000000) (15.63 GiB)
\t\tbudget = 16777216000 (0x3e8000000) (15.63 GiB)
\t\tusage  = 0 (0x00000000) (0.00 B)
\t\tflags:
\t\t\tNone
memoryTypes: count = 1
\tmemoryTypes[0]:
\t\theapIndex     = 0
\t\tpropertyFlags = 0x0001: count = 1
\t\t\tMEMORY_PROPERTY_DEVICE_LOCAL_BIT

GPU1:
VkPhysicalDeviceProperties:
---------------------------
\tdeviceType        = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName        = llvmpipe (LLVM 15.0.6, 256 bits)

VkPhysicalDeviceMemoryProperties:
=================================
memoryHeaps: count = 1
\tmemoryHeaps[0]:
\t\tsize   = 2147483648 (0x80000000) (2.00 GiB)
\t\tflags: count = 1
\t\t\tMEMORY_HEAP_DEVICE_LOCAL_BIT
"""


def test_vulkaninfo_lists_lavapipe_as_a_cpu_type_device_with_its_heap() -> None:
    found = dev.parse_vulkaninfo(VULKANINFO)
    assert found == [
        {
            "index": 0,
            "type": "cpu",
            "description": LLVMPIPE,
            "heaps": [{"size": 2048 * dev.MIB, "budget": None, "usage": None, "device_local": True}],
        }
    ]


def test_llamas_rule_skips_lavapipe_unless_ggml_vk_visible_devices_names_it() -> None:
    found = dev.parse_vulkaninfo(VULKANINFO)
    # the installed build's own listings (tests/fixtures/devices/lavapipe) say the same
    assert dev.parse_list_devices((LAVAPIPE / "llama-server-list-devices.txt").read_text()) == []
    assert dev.from_vulkaninfo(found, None, 4096) == []
    listed = dev.parse_list_devices(
        (LAVAPIPE / "GGML-VK-VISIBLE-DEVICES-0-llama-server-list-devices.txt").read_text()
    )
    predicted = dev.from_vulkaninfo(found, "0", 4096)
    assert [
        (d["name"], d["description"], d["memory_total_mib"], d["memory_free_mib"]) for d in predicted
    ] == [(e["name"], e["description"], e["total_mib"], e["free_mib"]) for e in listed]
    assert (predicted[0]["type"], predicted[0]["uma"], predicted[0]["source"]) == ("gpu", True, "vulkaninfo")
    # its memory is the host's: never more than the host's usable memory
    assert dev.from_vulkaninfo(found, "0", 900)[0]["memory_free_mib"] == 900
    with pytest.raises(DeviceError, match=r"GGML_VK_VISIBLE_DEVICES=1: '1' is not the index of one of the 1"):
        dev.from_vulkaninfo(found, "1", 4096)


def test_a_discrete_card_comes_first_and_its_budget_is_its_free_memory() -> None:
    found = dev.parse_vulkaninfo(TWO_DEVICES)
    assert [(g["index"], g["type"]) for g in found] == [(0, "discrete"), (1, "cpu")]
    # by default the GPUs only, the host-visible heap left out (not device-local)
    (card,) = dev.from_vulkaninfo(found, None, 28000)
    assert (card["name"], card["memory_total_mib"], card["memory_free_mib"], card["uma"]) == (
        "Vulkan0",
        12288,
        (12465471488 - 402653184) // dev.MIB,
        False,
    )
    # named: in the variable's order, lavapipe first
    assert [(d["name"], d["description"]) for d in dev.from_vulkaninfo(found, "1,0", 28000)] == [
        ("Vulkan0", LLVMPIPE),
        ("Vulkan1", "NVIDIA GeForce RTX 3060"),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("GPU0:\n", "no 'Device Properties and Extensions:' part"),
        ("Device Properties and Extensions:\nGPU0:\n\tdeviceName = x\n", "GPU0 lacks its deviceType"),
        (
            "Device Properties and Extensions:\nGPU0:\n\tdeviceType = PHYSICAL_DEVICE_TYPE_TOASTER\n",
            "deviceType 'PHYSICAL_DEVICE_TYPE_TOASTER'",
        ),
        (
            "Device Properties and Extensions:\nGPU0:\n\tdeviceType = PHYSICAL_DEVICE_TYPE_CPU\n"
            "\tdeviceName = x\n",
            "GPU0 lacks its memory heaps",
        ),
    ],
)
def test_a_vulkaninfo_it_cannot_read_is_named(text: str, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        dev.parse_vulkaninfo(text)


def runner(root: Path, vulkaninfo: str):
    """The machine's recorded outputs with no build installed, and vulkaninfo's output."""
    recorded = dev.recorded_runner(Tree(str(root)))

    def run(key):
        if key == "list_devices":
            return None, None
        if key == "vulkaninfo":
            return vulkaninfo, None
        return recorded(key)

    return run


def test_the_probe_predicts_the_chosen_vulkan_flavours_lavapipe_as_the_build_lists_it() -> None:
    """The demo-gpu hosts: the verdict keeps the CPU flavour (no PCI GPU), the inventory chooses
    the Vulkan one, and the probe's prediction is what that build lists once installed."""
    root = FIXTURES / "lavapipe-container"
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    fact = hostinfo.probe(str(root), run=runner(root, VULKANINFO), flavour="ubuntu-vulkan-x64", env=env)
    assert fact["backends"]["llama_cpp"]["flavour"] == "ubuntu-x64"  # the verdict is unchanged
    assert (
        fact["devices_source"] == "predicted for the ubuntu-vulkan-x64 build (vulkan backend) from vulkaninfo"
    )
    installed = hostinfo.probe(str(root))  # the recorded listing of the installed Vulkan build
    assert [dict(d, source=None) for d in fact["devices"]] == [
        dict(d, source=None) for d in installed["devices"]
    ]
    assert [d["name"] for d in fact["devices"]] == ["Vulkan0", "CPU"]
    assert hostinfo.check_given(fact) == []
    # without the variable, llama.cpp would skip lavapipe: the CPU alone
    fact = hostinfo.probe(str(root), run=runner(root, VULKANINFO), flavour="ubuntu-vulkan-x64")
    assert [d["name"] for d in fact["devices"]] == ["CPU"]
    # the verdict's flavour (CPU) runs no vulkaninfo
    fact = hostinfo.probe(str(root), run=runner(root, "not read"), env=env)
    assert [d["name"] for d in fact["devices"]] == ["CPU"]
    # a host without vulkaninfo: sysfs, which sees no PCI GPU here
    fact = hostinfo.probe(str(root), run=runner(root, None), flavour="ubuntu-vulkan-x64", env=env)
    assert fact["devices_source"].endswith("from sysfs")
    assert [d["name"] for d in fact["devices"]] == ["CPU"]

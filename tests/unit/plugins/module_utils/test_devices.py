"""The devices of the probe fact (module_utils/devices.py) on recorded GPU machines.

Each GPU tree of tests/fixtures/hosts/ (README: "GPU machines") keeps the outputs of the installed
build's ``llama-server --list-devices`` and of nvidia-smi under ``recorded/``. The expected device
lists below are written from what each machine is: its cards, llama.cpp's names and order, which
device shares the host's RAM, and the host's usable memory for the CPU device.
"""

from __future__ import annotations

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import devices as dev
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import DeviceError
from ansible_collections.llmfleet.cluster.plugins.module_utils.hostinfo import HostInfoError, Tree

from tests.support.host_trees import recorded_hosts, tree_names

FIXTURES = recorded_hosts()


def device(name, description, kind, total, free, uma, source="llama-server", pci=None):
    backend = {"Vul": "vulkan", "CUD": "cuda", "ROC": "rocm", "CPU": "cpu"}[name[:3]]
    out = {
        "name": name,
        "backend": backend,
        "description": description,
        "type": kind,
        "memory_total_mib": total,
        "memory_free_mib": free,
        "uma": uma,
        "source": source,
    }
    if pci:
        out["pci_address"] = pci
    return out


def cpu(description, total, usable):
    return device("CPU", description, "cpu", total, usable, False, "probe")


# machine -> the devices llama.cpp's installed build lists, as the fact carries them (CPU last).
LISTED = {
    # NVIDIA consumer, Vulkan build: one discrete device
    "rtx3060-desktop": [
        device("Vulkan0", "NVIDIA GeForce RTX 3060", "gpu", 12502, 11922, False, pci="0000:07:00.0"),
        cpu("AMD Ryzen 5 5600X 6-Core Processor", 32034, 25600),
    ],
    # NVIDIA datacenter, CUDA build: two devices in PCI order
    "a100-server": [
        device("CUDA0", "NVIDIA A100-SXM4-80GB", "gpu", 81050, 80627, False, pci="0000:07:00.0"),
        device("CUDA1", "NVIDIA A100-SXM4-80GB", "gpu", 81050, 80627, False, pci="0000:0f:00.0"),
        cpu("AMD EPYC 7763 64-Core Processor", 257772, 244140),
    ],
    # AMD discrete + the CPU's own Raphael iGPU: the iGPU is an igpu whose memory is the host's
    "rx7900xtx-desktop": [
        device(
            "Vulkan0", "AMD Radeon RX 7900 XTX (RADV NAVI31)", "gpu", 24560, 23302, False, pci="0000:03:00.0"
        ),
        device(
            "Vulkan1",
            "AMD Radeon Graphics (RADV RAPHAEL_MENDOCINO)",
            "igpu",
            32189,
            31858,
            True,
            pci="0000:13:00.0",
        ),
        cpu("AMD Ryzen 7 7800X3D 8-Core Processor", 63355, 51200),
    ],
    # AMD APU: the 780M offers 17780 MiB but the host has 16384 usable: it never offers more
    "ryzen7840u-laptop": [
        device("Vulkan0", "AMD Radeon 780M (RADV PHOENIX)", "igpu", 17998, 16384, True, pci="0000:c1:00.0"),
        cpu("AMD Ryzen 7 7840U w/ Radeon  780M Graphics", 27804, 16384),
    ],
    # Intel Arc (xe, local memory) first, the UHD 770 (0000:00:02.0, shares RAM) second
    "arc-a770-desktop": [
        device(
            "Vulkan0", "Intel(R) Arc(tm) A770 Graphics (DG2)", "gpu", 15930, 15614, False, pci="0000:03:00.0"
        ),
        device(
            "Vulkan1", "Intel(R) UHD Graphics 770 (RPL-S)", "igpu", 23914, 19968, True, pci="0000:00:02.0"
        ),
        cpu("13th Gen Intel(R) Core(TM) i5-13600K", 31886, 26624),
    ],
    # lavapipe: llama.cpp types it gpu, but its 2048 MiB are the container's 960 usable MiB
    "lavapipe-container": [
        device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", 2048, 960, True),
        cpu("AMD EPYC 7B13", 1024, 960),
    ],
}

# machine -> (flavour, the devices predicted from nvidia-smi and sysfs when no build is installed)
PREDICTED = {
    "rtx3060-desktop": (
        "ubuntu-vulkan-x64",
        [
            device(
                "Vulkan0", "NVIDIA GeForce RTX 3060", "gpu", 12288, 11828, False, "nvidia-smi", "0000:07:00.0"
            ),
            LISTED["rtx3060-desktop"][-1],
        ],
    ),
    "nvidia-rtx3090": (
        "ubuntu-vulkan-x64",
        [
            device(
                "Vulkan0", "NVIDIA GeForce RTX 3090", "gpu", 24576, 24251, False, "nvidia-smi", "0000:0b:00.0"
            ),
            cpu("AMD Ryzen 9 5950X 16-Core Processor", 128751, 122880),
        ],
    ),
    "a100-server": (
        "ubuntu-vulkan-x64",
        [
            device(
                "Vulkan0", "NVIDIA A100-SXM4-80GB", "gpu", 81920, 81037, False, "nvidia-smi", "0000:07:00.0"
            ),
            device(
                "Vulkan1", "NVIDIA A100-SXM4-80GB", "gpu", 81920, 81037, False, "nvidia-smi", "0000:0f:00.0"
            ),
            LISTED["a100-server"][-1],
        ],
    ),
    # VRAM total - used; the APU: carve-out + GTT (as RADV and llama.cpp count an iGPU's heaps)
    "rx7900xtx-desktop": (
        "ubuntu-vulkan-x64",
        [
            device(
                "Vulkan0", "AMD GPU [1002:744c]", "gpu", 24560, 24560 - 1124, False, "sysfs", "0000:03:00.0"
            ),
            device(
                "Vulkan1",
                "AMD GPU [1002:164e]",
                "igpu",
                512 + 31677,
                490 + 31663,
                True,
                "sysfs",
                "0000:13:00.0",
            ),
            LISTED["rx7900xtx-desktop"][-1],
        ],
    ),
    "ryzen7840u-laptop": (
        "ubuntu-vulkan-x64",
        [
            device(
                "Vulkan0", "AMD GPU [1002:15bf]", "igpu", 4096 + 13902, 16384, True, "sysfs", "0000:c1:00.0"
            ),
            LISTED["ryzen7840u-laptop"][-1],
        ],
    ),
    # Intel graphics keep the CPU flavour: its build has no GPU device
    "arc-a770-desktop": ("ubuntu-x64", [LISTED["arc-a770-desktop"][-1]]),
    "lavapipe-container": ("ubuntu-x64", [LISTED["lavapipe-container"][-1]]),
    "zen4-desktop": ("ubuntu-x64", [cpu("AMD Ryzen 9 7950X 16-Core Processor", 63488, 57344)]),
    "n100-minipc": ("ubuntu-x64", [cpu("Intel(R) N100", 6144, 6144 - 1536)]),
}


def without_build(root):
    """The recorded tool outputs of a machine, as if llama.cpp were not installed yet."""
    recorded = dev.recorded_runner(Tree(str(root)))
    return lambda key: (None, None) if key == "list_devices" else recorded(key)


@pytest.mark.parametrize("name", sorted(LISTED))
def test_the_installed_builds_listing_is_the_device_list(name: str) -> None:
    fact = hostinfo.probe(str(FIXTURES / name))
    assert fact["devices"] == LISTED[name]
    assert fact["devices_source"] == "llama-server --list-devices"
    assert fact["devices"][-1]["memory_free_mib"] == fact["memory"]["usable_mib"]
    assert hostinfo.check_given(fact) == []  # a probed fact passes the what-if boundary


@pytest.mark.parametrize("name", sorted(PREDICTED))
def test_without_a_build_nvidia_smi_and_sysfs_predict_the_flavours_devices(name: str) -> None:
    flavour, want = PREDICTED[name]
    fact = hostinfo.probe(str(FIXTURES / name), run=without_build(FIXTURES / name))
    assert fact["backends"]["llama_cpp"]["flavour"] == flavour
    assert fact["devices"] == want
    assert fact["devices_source"].startswith(f"predicted for the {flavour} build")


@pytest.mark.parametrize("name", sorted(set(LISTED) | set(PREDICTED)))
def test_memory_shared_with_the_host_is_one_pool(name: str) -> None:
    """A uma device never offers more than the CPU device (the host's usable memory), and a
    device with memory of its own is never uma: the planner sees the host's RAM once."""
    for run in (None, without_build(FIXTURES / name)):
        devices = hostinfo.probe(str(FIXTURES / name), run=run)["devices"]
        host = devices[-1]
        assert host["name"] == "CPU" and [d["name"] for d in devices].count("CPU") == 1
        for d in devices[:-1]:
            assert d["uma"] == (d["type"] == "igpu" or d["description"].startswith("llvmpipe"))
            if d["uma"]:
                assert d["memory_free_mib"] <= host["memory_free_mib"]


@pytest.mark.parametrize("name", tree_names())
def test_every_probed_fact_passes_the_what_if_boundary(name: str) -> None:
    """A probed fact copied into an inventory (what-if) is accepted as it is."""
    fact = hostinfo.probe(str(FIXTURES / name))
    assert hostinfo.check_given(fact) == []
    assert dev.host_devices(name, fact) == fact["devices"]


def test_a_host_without_gpus_or_build_has_the_cpu_device_only() -> None:
    fact = hostinfo.probe(str(FIXTURES / "podman-v2"))
    assert fact["devices"] == [
        cpu("11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", 512, fact["memory"]["usable_mib"])
    ]
    assert fact["devices_source"] == "predicted for the ubuntu-x64 build (no GPU backend) from sysfs"


def test_a_failed_listing_falls_back_and_says_why() -> None:
    root = FIXTURES / "rtx3060-desktop"
    recorded = dev.recorded_runner(Tree(str(root)))

    def run(key):
        if key == "list_devices":
            return None, "llama-server --list-devices failed (rc 134): ggml_vulkan: device lost"
        return recorded(key)

    fact = hostinfo.probe(str(root), run=run)
    assert fact["devices"] == PREDICTED["rtx3060-desktop"][1]
    assert fact["devices_source"].endswith(
        "(llama-server --list-devices failed (rc 134): ggml_vulkan: device lost)"
    )


def test_a_cpu_build_lists_no_device_and_keeps_the_cpu() -> None:
    fact = hostinfo.probe(
        str(FIXTURES / "podman-v2"),
        run=lambda key: ("Available devices:\n  (none)\n", None) if key == "list_devices" else (None, None),
    )
    assert [d["name"] for d in fact["devices"]] == ["CPU"]
    assert fact["devices_source"] == "llama-server --list-devices"


# --------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------


def test_list_devices_format_of_the_pinned_source() -> None:
    text = (
        "load_backend: loaded RPC backend from /opt/llmfleet/llama.cpp/current/libggml-rpc.so\n"
        "Available devices:\n"
        "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)\n"
        "  BLAS: OpenBLAS (0 MiB, 0 MiB free)\n"
    )
    assert dev.parse_list_devices(text) == [
        {
            "name": "Vulkan0",
            "description": "llvmpipe (LLVM 15.0.6, 256 bits)",
            "total_mib": 2048,
            "free_mib": 2048,
        },
        {"name": "BLAS", "description": "OpenBLAS", "total_mib": 0, "free_mib": 0},
    ]
    assert dev.parse_list_devices("Available devices:\n  (none)\n") == []


def test_left_out_devices_are_named() -> None:
    # rpc-server's own listing (on an unknown -d) includes the CPU; llama.cpp's BLAS is no device here
    listed = dev.parse_list_devices(
        "Available devices:\n  Vulkan0: NVIDIA GeForce RTX 3060 (12502 MiB, 11922 MiB free)\n"
        "  BLAS: OpenBLAS (0 MiB, 0 MiB free)\n  CPU: AMD Ryzen 5 5600X 6-Core Processor (32034 MiB, 30000 MiB free)\n"
    )
    devices, skipped = dev.from_listing(listed, [], 25600)
    assert [d["name"] for d in devices] == ["Vulkan0"]
    assert skipped == ["BLAS", "CPU"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("error: unknown argument: --list-devices\n", "no 'Available devices:' line"),
        ("Available devices:\n  Vulkan0: RTX (12 GiB)\n", "'  Vulkan0: RTX (12 GiB)'"),
    ],
)
def test_a_malformed_listing_fails_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(
        DeviceError,
        match="cannot parse llama-server --list-devices: .*"
        + message.replace("(", r"\(").replace(")", r"\)"),
    ):
        dev.parse_list_devices(text)


def test_a_malformed_listing_fails_the_probe_naming_it() -> None:
    with pytest.raises(HostInfoError, match="cannot parse llama-server --list-devices"):
        hostinfo.probe(str(FIXTURES / "podman-v2"), run=lambda key: ("Available devices:\n  garbage\n", None))


def test_nvidia_smi_csv() -> None:
    rows = dev.parse_nvidia_smi(
        "0, 00000000:07:00.0, NVIDIA A100-SXM4-80GB, 81920, 81037\n1, 00000000:0F:00.0, NVIDIA GH200 480GB, [N/A], [N/A]\n"
    )
    assert rows == [
        {
            "index": 0,
            "pci_address": "0000:07:00.0",
            "name": "NVIDIA A100-SXM4-80GB",
            "total_mib": 81920,
            "free_mib": 81037,
        },
        {
            "index": 1,
            "pci_address": "0000:0f:00.0",
            "name": "NVIDIA GH200 480GB",
            "total_mib": None,
            "free_mib": None,
        },
    ]
    with pytest.raises(DeviceError, match="cannot parse nvidia-smi: line 1 'NVIDIA-SMI has failed'"):
        dev.parse_nvidia_smi("NVIDIA-SMI has failed\n")


def test_a_gpu_whose_memory_no_tool_reports_offers_nothing() -> None:
    gpus = [
        {
            "vendor": "nvidia",
            "pci_address": "0000:01:00.0",
            "driver": "nvidia",
            "model": "NVIDIA GPU [10de:2204]",
        }
    ]
    gpus[0]["details"] = {"integrated": False, "vram_total_mib": None, "vram_free_mib": None}
    (only,) = dev.from_hardware(gpus, None, "vulkan", 1000)
    assert (only["memory_total_mib"], only["memory_free_mib"], only["source"]) == (0, 0, "unknown")


def test_flavour_backends() -> None:
    assert dev.flavour_backend("ubuntu-vulkan-x64") == "vulkan"
    assert dev.flavour_backend("source-cuda") == "cuda"
    assert dev.flavour_backend("ubuntu-rocm-x64") == "rocm"
    assert dev.flavour_backend("ubuntu-x64") is None
    assert dev.flavour_backend(None) is None


# --------------------------------------------------------------------------------------------
# Given (what-if) devices
# --------------------------------------------------------------------------------------------

APU = {
    "arch": "x86_64",
    "cpus": 16,
    "memory": {"usable_mib": 16384},
    "backends": {"llama_cpp": {"status": "release"}, "vllm_cpu": {"status": "supported"}},
    "devices": [
        {
            "name": "Vulkan0",
            "backend": "vulkan",
            "description": "AMD Radeon 780M (RADV PHOENIX)",
            "type": "igpu",
            "memory_total_mib": 17998,
            "memory_free_mib": 16000,
            "uma": True,
        },
        {
            "name": "CPU",
            "backend": "cpu",
            "description": "AMD Ryzen 7 7840U",
            "type": "cpu",
            "memory_total_mib": 27804,
            "memory_free_mib": 16384,
            "uma": False,
        },
    ],
}


def bad(**changes):
    fact = {**APU, "devices": [dict(d) for d in APU["devices"]]}
    for key, value in changes.items():
        index, field = key.split("__")
        fact["devices"][int(index[1:])][field] = value
    return fact


def test_a_given_device_list_passes() -> None:
    assert hostinfo.check_given(APU) == []
    assert dev.host_devices("laptop", APU) == APU["devices"]


@pytest.mark.parametrize(
    ("fact", "message"),
    [
        (
            bad(d0__name="GPU0"),
            "llmfleet_host.devices[0] (GPU0).name 'GPU0' is not a llama.cpp vulkan device name (e.g. Vulkan0)",
        ),
        (
            bad(d0__backend="metal"),
            "llmfleet_host.devices[0] (Vulkan0).backend is 'metal', expected one of vulkan, cuda, rocm, cpu",
        ),
        (
            bad(d0__uma=False),
            "llmfleet_host.devices[0] (Vulkan0) is an igpu: its memory is the host's RAM, uma must be true",
        ),
        (
            bad(d0__memory_free_mib="16 GiB"),
            "llmfleet_host.devices[0] (Vulkan0).memory_free_mib must be an integer >= 0 (MiB), got '16 GiB'",
        ),
        (bad(d0__memory_free_mib=20000), "memory_free_mib 20000 is more than its memory_total_mib 17998"),
        (
            bad(d0__memory_free_mib=17000),
            "(Vulkan0).memory_free_mib 17000 is more than the host's usable 16384 MiB",
        ),
        (bad(d1__memory_free_mib=20000), "(CPU).memory_free_mib 20000 differs from memory.usable_mib 16384"),
        (bad(d1__type="gpu"), "llmfleet_host.devices[1] (CPU).type 'gpu' does not go with backend 'cpu'"),
        (
            {**APU, "devices": list(reversed(APU["devices"]))},
            "must end with the one CPU device (CPU devices at [0])",
        ),
        (
            {**APU, "devices": []},
            "llmfleet_host.devices must be a non-empty list of devices (CPU last), got []",
        ),
        (
            {**APU, "devices": [{"name": "CPU"}]},
            "llmfleet_host.devices[0] (CPU) lacks backend, description, type",
        ),
    ],
)
def test_given_devices_are_checked_at_the_boundary(fact: dict, message: str) -> None:
    assert any(message in problem for problem in hostinfo.check_given(fact)), hostinfo.check_given(fact)
    with pytest.raises(DeviceError) as err:
        dev.host_devices("laptop", fact)
    assert str(err.value).startswith("host laptop: ")
    assert message in str(err.value)


def test_a_fact_without_devices_is_its_cpu() -> None:
    fact = {
        "arch": "x86_64",
        "cpus": 2,
        "cpu_model": "Intel(R) N100",
        "memory": {"total_mib": 8000, "usable_mib": 6000},
    }
    assert dev.host_devices("nas", fact) == [cpu("Intel(R) N100", 8000, 6000)]
    with pytest.raises(
        DeviceError,
        match=r"host nas: llmfleet_host.memory.usable_mib is missing or not an integer \('6 GiB'\)",
    ):
        dev.host_devices("nas", {"memory": {"usable_mib": "6 GiB"}})


# --------------------------------------------------------------------------------------------
# The summary line
# --------------------------------------------------------------------------------------------


def test_the_summary_lists_the_devices() -> None:
    line = hostinfo.summary(hostinfo.probe(str(FIXTURES / "rx7900xtx-desktop")))
    assert (
        "devices Vulkan0 AMD Radeon RX 7900 XTX (RADV NAVI31) 23302/24560 MiB, "
        "Vulkan1 AMD Radeon Graphics (RADV RAPHAEL_MENDOCINO) 31858/32189 MiB uma, CPU 51200/63355 MiB  llama_cpp="
    ) in line
    # a CPU-only host keeps its line as it was
    assert "devices" not in hostinfo.summary(hostinfo.probe(str(FIXTURES / "podman-v2")))
    assert (
        "devices Vulkan0 AMD Radeon 780M (RADV PHOENIX) 16000/17998 MiB uma, CPU 16384/27804 MiB"
        in hostinfo.summary(APU)
    )


def test_a_rocm_listing_is_matched_to_the_amd_cards_in_pci_order() -> None:
    """A ROCm build (HIP: the CUDA backend under the name ROCm) on the RX 7900 XTX machine."""
    tree = Tree(str(FIXTURES / "rx7900xtx-desktop"))
    gpus = [dict(g, details=dev.gpu_details(tree, g, 63355)) for g in hostinfo.pci_accelerators(tree)]
    listed = dev.parse_list_devices(
        "Available devices:\n  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24472 MiB free)\n"
        "  ROCm1: AMD Radeon Graphics (512 MiB, 490 MiB free)\n"
    )
    devices, skipped = dev.from_listing(listed, gpus, 51200)
    assert [(d["name"], d["backend"], d["type"], d["uma"], d["pci_address"]) for d in devices] == [
        ("ROCm0", "rocm", "gpu", False, "0000:03:00.0"),
        ("ROCm1", "rocm", "igpu", True, "0000:13:00.0"),
    ]
    assert skipped == []

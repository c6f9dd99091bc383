"""The host probe on recorded machine trees (tests/fixtures/hosts/) and on this machine.

The expected values below are written from what each recorded machine is (its CPU's documented
features, the memory and cgroup limits the tree was given, its distribution's glibc), not copied
from the probe's output. tests/fixtures/hosts/README.md describes every tree.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
from ansible_collections.llmfleet.cluster.plugins.module_utils.hostinfo import HostInfoError

from tests.support.host_trees import recorded_hosts

FIXTURES = recorded_hosts()  # tests/fixtures/hosts/ with the machines' names (see its README)

AVX2 = ["avx", "avx2", "f16c", "fma"]
AMX = ["amx_tile", "amx_int8", "amx_bf16"]
AVX512_ZEN4 = [*AVX2, "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx512vl"]

# machine -> expected fact values (memory in MiB). "limit"/"usage" are the binding cgroup level.
EXPECTED = {
    "xeon-spr": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(
            [*AVX2, *AMX, "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]
        ),
        "cpus": 8,
        "numa_nodes": 2,
        "available": 245760,
        "limit": None,
        "usable": 245760,
        "glibc": "2.35",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("supported", "x86_64"),
        "default_ipv4": "10.0.1.15",
        "addresses": {"docker0": ["172.17.0.1"], "eth0": ["10.0.1.15"]},
        "gpus": [],
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "os": ("ubuntu", "22.04"),
    },
    "zen4-desktop": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(AVX512_ZEN4),
        "cpus": 32,
        "numa_nodes": 1,
        "available": 57344,
        "limit": None,
        "usable": 57344,
        "glibc": "2.38",
        # the Raphael iGPU (512 MiB carve-out) is listed but does not switch to Vulkan
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("supported", "x86_64"),
        "default_ipv4": "192.168.1.20",
        "addresses": {"enp5s0": ["192.168.1.20"]},
        "gpus": [("amd", "amdgpu", 512)],
        "cpu_model": "AMD Ryzen 9 7950X 16-Core Processor",
        "os": ("fedora", "39"),
    },
    "zen3-desktop": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(AVX2),
        "cpus": 16,
        "numa_nodes": 1,
        "available": 28672,
        "limit": None,
        "usable": 28672,
        "glibc": "2.36",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("limited", "x86_64"),
        "default_ipv4": "192.168.1.21",
        "addresses": {"enp6s0": ["192.168.1.21"], "wg0": ["10.8.0.2"]},
        "gpus": [],
        "cpu_model": "AMD Ryzen 7 5800X 8-Core Processor",
        "os": ("debian", "12"),
    },
    "n100-minipc": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted([*AVX2, "avx_vnni"]),
        "cpus": 2,  # 4 cores, CPUQuota=200% on llm.slice
        "numa_nodes": 1,
        "available": 12288,
        "limit": 6144,  # MemoryMax=6G on the parent slice, not on the probe's own scope
        "usage": 1536,
        "usable": 6144 - 1536,
        "glibc": "2.39",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("limited", "x86_64"),
        "default_ipv4": "192.168.1.30",
        "addresses": {"enp1s0": ["192.168.1.30"]},
        "gpus": [("intel", "i915", None)],
        "cpu_model": "Intel(R) N100",
        "os": ("ubuntu", "24.04"),
    },
    "celeron-nas": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": [],
        "cpus": 4,
        "numa_nodes": 1,
        "available": 6144,
        "limit": None,  # cgroup v1 "unlimited" is 9223372036854771712
        "usable": 6144,
        "glibc": "2.31",
        "llama_cpp": ("source", "source"),
        "vllm_cpu": ("unsupported", None),
        "default_ipv4": "192.168.1.40",
        "addresses": {"enp2s0": ["192.168.1.40"], "enp3s0": ["10.10.10.2"]},
        "gpus": [("intel", "i915", None)],
        "cpu_model": "Intel(R) Celeron(R) CPU  J1900  @ 1.99GHz",
        "os": ("debian", "11"),
    },
    "graviton2": {
        "arch": "aarch64",
        "kube_arch": "arm64",
        "isa": ["dotprod", "neon"],
        "cpus": 4,
        "numa_nodes": 1,
        "available": 14848,
        "limit": None,
        "usable": 14848,
        "glibc": "2.34",  # Amazon Linux 2023: older than the release binaries need
        "llama_cpp": ("source", "source"),
        "vllm_cpu": ("limited", "arm64"),
        "default_ipv4": "172.31.5.10",
        "addresses": {"ens5": ["172.31.5.10"]},
        "gpus": [],
        "cpu_model": "ARM Neoverse-N1",
        "os": ("amzn", "2023"),
    },
    "graviton3": {
        "arch": "aarch64",
        "kube_arch": "arm64",
        "isa": ["bf16", "dotprod", "i8mm", "neon", "sve"],
        "cpus": 6,  # a pod limited to 6 of 8 CPUs (cpu.max 600000 100000)
        "numa_nodes": 1,
        "available": 28672,
        "limit": 20480,
        "usage": 11264,
        "usable": 20480 - 11264,
        "glibc": "2.39",
        "llama_cpp": ("release", "ubuntu-arm64"),
        "vllm_cpu": ("supported", "arm64"),
        "default_ipv4": "10.42.1.7",
        "addresses": {"eth0": ["10.42.1.7"]},  # a /32 pod address: the default route's device
        "gpus": [],
        "cpu_model": "ARM Neoverse-V1",
        "os": ("ubuntu", "24.04"),
    },
    "rpi4": {
        "arch": "armv7l",
        "kube_arch": "arm",
        "isa": ["neon"],
        "cpus": 4,
        "numa_nodes": 1,
        "available": 3456,
        "limit": None,  # cgroup_disable=memory: no memory controller at all
        "usable": 3456,
        "glibc": "2.31",
        "llama_cpp": ("source", "source"),
        "vllm_cpu": ("unsupported", None),
        "default_ipv4": "192.168.1.60",
        "addresses": {"eth0": ["192.168.1.60"], "wlan0": ["192.168.50.61"]},
        "gpus": [],
        "cpu_model": "ARM Cortex-A72",
        "os": ("raspbian", "11"),
    },
    # 32-bit Raspberry Pi OS 12 on the 64-bit kernel: kernel.arch aarch64, an armhf (EM_ARM) libc.
    "rpi4-armhf": {
        "arch": "armv7l",
        "kube_arch": "arm",
        "isa": ["neon"],
        "cpus": 4,
        "numa_nodes": 1,
        "available": 7040,
        "limit": None,
        "usable": 7040,
        "glibc": "2.36",
        "llama_cpp": ("source", "source"),  # no 32-bit ARM release; ubuntu-arm64 cannot run here
        "vllm_cpu": ("unsupported", None),
        "default_ipv4": "192.168.1.62",
        "addresses": {"eth0": ["192.168.1.62"]},
        "gpus": [],
        "cpu_model": "ARM Cortex-A72",
        "os": ("raspbian", "12"),
    },
    "rpi5": {
        "arch": "aarch64",
        "kube_arch": "arm64",
        "isa": ["dotprod", "neon"],
        "cpus": 4,
        "numa_nodes": 1,
        "available": 7168,
        "limit": None,
        "usable": 7168,
        "glibc": "2.36",
        "llama_cpp": ("release", "ubuntu-arm64"),
        "vllm_cpu": ("limited", "arm64"),
        "default_ipv4": "192.168.1.51",  # eth0's default route has the lower metric
        "addresses": {"eth0": ["192.168.1.51"], "wlan0": ["192.168.2.50"]},
        "gpus": [],
        "cpu_model": "ARM Cortex-A76",
        "os": ("debian", "12"),
    },
    "rpi-zero": {
        "arch": "armv6l",
        "kube_arch": "arm",
        "isa": [],
        "cpus": 1,
        "numa_nodes": 1,
        "available": 330,
        "limit": None,
        "usable": 330,
        "glibc": "2.31",  # from the GLIBC_2.N symbol versions: this libc has no banner
        "llama_cpp": ("unsupported", None),
        "vllm_cpu": ("unsupported", None),
        "default_ipv4": "192.168.1.70",
        "addresses": {"wlan0": ["192.168.1.70"]},
        "gpus": [],
        "cpu_model": "ARMv6-compatible processor rev 7 (v6l)",
        "os": ("raspbian", "11"),
    },
    "nvidia-rtx3090": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(AVX2),
        "cpus": 32,
        "numa_nodes": 1,
        "available": 122880,
        "limit": None,
        "usable": 122880,
        "glibc": "2.35",
        "llama_cpp": ("release", "ubuntu-vulkan-x64"),
        "vllm_cpu": ("limited", "x86_64"),
        "default_ipv4": "192.168.1.80",
        "addresses": {"enp4s0": ["192.168.1.80"]},
        "gpus": [("nvidia", "nvidia", None)],
        "cpu_model": "AMD Ryzen 9 5950X 16-Core Processor",
        "os": ("ubuntu", "22.04"),
    },
    "docker-v1": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(AVX2),
        "cpus": 2,  # --cpus 1.5 on 16 CPUs: two threads at 75 %
        "numa_nodes": 1,
        "available": 51200,
        "limit": 2048,
        "usage": 300,
        "usable": 2048 - 300,
        "glibc": "2.36",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("limited", "x86_64"),
        "default_ipv4": "172.17.0.3",
        "addresses": {"eth0": ["172.17.0.3"]},
        "gpus": [],
        "cpu_model": "AMD Ryzen 7 5800X 8-Core Processor",
        "os": ("debian", "12"),
    },
    "podman-v2": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted([*AVX2, "avx512f", "avx512bw", "avx512vl", "avx512_vnni"]),  # Tiger Lake: no bf16
        "cpus": 2,  # --cpuset-cpus=0-1 of 8 online
        "numa_nodes": 1,
        "available": 11264,
        "limit": 512,
        "usage": 32,
        "usable": 480,
        "glibc": "2.36",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("supported", "x86_64"),
        "default_ipv4": "10.89.0.3",
        "addresses": {"eth0": ["10.89.0.3"]},
        "gpus": [],
        "cpu_model": "11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz",
        "os": ("debian", "12"),
    },
    # A serving fleet's head (cgroup v1, no cgroup namespace): usage_in_bytes 340 MiB includes 250 MiB
    # of file page cache (the downloaded model); llama-server holds 96 MiB resident, 48 of it anonymous.
    "podman-v1-head": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(AVX2),
        "cpus": 2,
        "numa_nodes": 1,
        "available": 12288,
        "limit": 352,
        "usage": 340 - 200 - 50,  # usage minus the page cache (total_inactive_file, total_active_file)
        "usable": (352 - 90) + 48,  # plus llama-server's anonymous memory, which a redeploy replaces
        "glibc": "2.36",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("limited", "x86_64"),
        "default_ipv4": "10.89.1.2",
        "addresses": {"eth0": ["10.89.1.2"]},
        "gpus": [],
        "cpu_model": "AMD Ryzen 7 5800X 8-Core Processor",
        "os": ("debian", "12"),
    },
    # A serving worker (cgroup v2 namespace): memory.current 150 MiB with 76 MiB file cache,
    # ggml-rpc-server 70 MiB resident, 35 of it anonymous.
    "podman-v2-worker": {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted([*AVX2, "avx512f", "avx512bw", "avx512vl", "avx512_vnni"]),
        "cpus": 2,
        "numa_nodes": 1,
        "available": 11264,
        "limit": 224,
        "usage": 150 - 40 - 36,
        "usable": (224 - 74) + 35,
        "glibc": "2.36",
        "llama_cpp": ("release", "ubuntu-x64"),
        "vllm_cpu": ("supported", "x86_64"),
        "default_ipv4": "10.89.1.3",
        "addresses": {"eth0": ["10.89.1.3"]},
        "gpus": [],
        "cpu_model": "11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz",
        "os": ("debian", "12"),
    },
}


def gpu_machine(cpus, isa, available, glibc, flavour, vllm, address, gpus, cpu_model, os_release, **extra):
    """The GPU machines of issue #32 (their devices: test_devices.py): login sessions, no limit."""
    want = {
        "arch": "x86_64",
        "kube_arch": "amd64",
        "isa": sorted(isa),
        "cpus": cpus,
        "numa_nodes": 1,
        "available": available,
        "limit": None,
        "usable": available,
        "glibc": glibc,
        "llama_cpp": ("release", flavour),
        "vllm_cpu": (vllm, "x86_64"),
        "default_ipv4": address,
        "addresses": {"enp5s0": [address]},
        "gpus": gpus,
        "cpu_model": cpu_model,
        "os": os_release,
    }
    want.update(extra)
    return want


VULKAN = "ubuntu-vulkan-x64"
EXPECTED.update(
    {
        "rtx3060-desktop": gpu_machine(
            12,
            AVX2,
            25600,
            "2.35",
            VULKAN,
            "limited",
            "192.168.1.81",
            [("nvidia", "nvidia", None)],
            "AMD Ryzen 5 5600X 6-Core Processor",
            ("ubuntu", "22.04"),
        ),
        "a100-server": gpu_machine(
            16,
            AVX2,
            244140,
            "2.35",
            VULKAN,
            "limited",
            "10.0.2.11",
            [("nvidia", "nvidia", None)] * 2,
            "AMD EPYC 7763 64-Core Processor",
            ("ubuntu", "22.04"),
        ),
        # the 7900 XTX switches to Vulkan; the CPU's own iGPU (512 MiB carve-out) is listed too
        "rx7900xtx-desktop": gpu_machine(
            16,
            AVX512_ZEN4,
            51200,
            "2.39",
            VULKAN,
            "supported",
            "192.168.1.82",
            [("amd", "amdgpu", 24560), ("amd", "amdgpu", 512)],
            "AMD Ryzen 7 7800X3D 8-Core Processor",
            ("ubuntu", "24.04"),
        ),
        # a 4 GiB carve-out is past the 2 GiB a Vulkan verdict needs
        "ryzen7840u-laptop": gpu_machine(
            16,
            AVX512_ZEN4,
            16384,
            "2.39",
            VULKAN,
            "supported",
            "192.168.1.83",
            [("amd", "amdgpu", 4096)],
            "AMD Ryzen 7 7840U w/ Radeon  780M Graphics",
            ("ubuntu", "24.04"),
        ),
        # Intel graphics keep the CPU flavour (the Vulkan build was installed by hand)
        "arc-a770-desktop": gpu_machine(
            20,
            [*AVX2, "avx_vnni"],
            26624,
            "2.39",
            "ubuntu-x64",
            "limited",
            "192.168.1.84",
            [("intel", "i915", None), ("intel", "xe", None)],
            "13th Gen Intel(R) Core(TM) i5-13600K",
            ("ubuntu", "24.04"),
        ),
        "lavapipe-container": gpu_machine(
            2,
            AVX2,
            19531,
            "2.36",
            "ubuntu-x64",
            "limited",
            "10.89.2.3",
            [],
            "AMD EPYC 7B13",
            ("debian", "12"),
            limit=1024,
            usage=64,
            usable=1024 - 64,
            addresses={"eth0": ["10.89.2.3"]},
        ),
    }
)

MACHINES = sorted(EXPECTED)


@pytest.fixture(scope="module")
def facts() -> dict:
    return {name: hostinfo.probe(str(FIXTURES / name)) for name in MACHINES}


def test_every_recorded_tree_has_expectations() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == MACHINES
    assert len(MACHINES) >= 8


@pytest.mark.parametrize("name", MACHINES)
def test_cpu(facts: dict, name: str) -> None:
    fact, want = facts[name], EXPECTED[name]
    assert fact["arch"] == want["arch"]
    assert fact["kube_arch"] == want["kube_arch"]
    assert fact["isa"] == want["isa"]
    assert fact["cpus"] == want["cpus"]
    assert fact["numa_nodes"] == want["numa_nodes"]
    assert fact["cpu_model"] == want["cpu_model"]
    assert isinstance(fact["cpu_bogomips"], float) and fact["cpu_bogomips"] > 0


@pytest.mark.parametrize("name", MACHINES)
def test_memory(facts: dict, name: str) -> None:
    memory, want = facts[name]["memory"], EXPECTED[name]
    assert memory["available_mib"] == want["available"]
    assert memory["cgroup_limit_mib"] == want["limit"]
    if want["limit"] is not None:
        assert memory["cgroup_usage_mib"] == want["usage"]
    assert memory["usable_mib"] == want["usable"]
    assert memory["usable_mib"] <= memory["available_mib"] <= memory["total_mib"]


@pytest.mark.parametrize("name", MACHINES)
def test_verdicts(facts: dict, name: str) -> None:
    backends, want = facts[name]["backends"], EXPECTED[name]
    assert (backends["llama_cpp"]["status"], backends["llama_cpp"]["flavour"]) == want["llama_cpp"]
    assert (backends["vllm_cpu"]["status"], backends["vllm_cpu"]["image_arch"]) == want["vllm_cpu"]
    assert backends["llama_cpp"]["reason"] and backends["vllm_cpu"]["reason"]
    assert facts[name]["glibc"] == want["glibc"]


@pytest.mark.parametrize("name", MACHINES)
def test_identity_network_and_accelerators(facts: dict, name: str) -> None:
    fact, want = facts[name], EXPECTED[name]
    assert fact["addresses"] == want["addresses"]
    assert fact["default_ipv4"] == want["default_ipv4"]
    assert [(g["vendor"], g["driver"], g["memory_mib"]) for g in fact["accelerators"]] == want["gpus"]
    assert (fact["os"]["id"], fact["os"]["version"]) == want["os"]
    assert fact["hostname"] == (FIXTURES / name / "proc/sys/kernel/hostname").read_text().strip()


def test_nvidia_model_comes_from_the_driver(facts: dict) -> None:
    (gpu,) = facts["nvidia-rtx3090"]["accelerators"]
    assert gpu["model"] == "NVIDIA GeForce RTX 3090"
    assert gpu["pci_id"] == "10de:2204"
    assert "vulkan" in facts["nvidia-rtx3090"]["backends"]["llama_cpp"]["reason"].lower()


def test_raspberry_pi_models_and_userland(facts: dict) -> None:
    assert facts["rpi5"]["machine"] == "Raspberry Pi 5 Model B Rev 1.0"
    assert facts["rpi4"]["kernel_arch"] == "armv7l"  # inferred from cpuinfo: no kernel.arch here
    assert facts["rpi-zero"]["kernel_arch"] == "armv6l"


def test_summary_line(facts: dict) -> None:
    line = hostinfo.summary(facts["podman-v2"])
    assert line.startswith("x86_64  2 cpus  usable 480 MiB (cgroup 512)  isa avx,avx2,")
    assert line.endswith("llama_cpp=ubuntu-x64  vllm_cpu=supported")
    assert "gpu NVIDIA GeForce RTX 3090" in hostinfo.summary(facts["nvidia-rtx3090"])
    assert "(MemAvailable of " in hostinfo.summary(facts["zen3-desktop"])
    assert hostinfo.summary(facts["rpi-zero"]).endswith("llama_cpp=unsupported  vllm_cpu=unsupported")


def test_runnable_backends(facts: dict) -> None:
    assert hostinfo.runnable_backends(facts["rpi-zero"]) == []
    assert hostinfo.runnable_backends(facts["rpi4"]) == ["llama_cpp"]
    assert hostinfo.runnable_backends(facts["graviton3"]) == ["llama_cpp", "vllm_cpu"]


# --- memory arithmetic on modified copies of the trees ----------------------------------------------


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target, symlinks=True)
    return target


def test_memavailable_wins_when_the_cgroup_has_more_room(tmp_path: Path) -> None:
    root = _copy(tmp_path, "podman-v2")
    (root / "sys/fs/cgroup/memory.max").write_text(str(100 * 1024**3) + "\n")
    memory = hostinfo.probe(str(root))["memory"]
    assert memory["cgroup_limit_mib"] == 102400
    assert memory["usable_mib"] == memory["available_mib"] == 11264
    assert "usable 11264 MiB (MemAvailable of 15729, cgroup 102400)" in hostinfo.summary(
        hostinfo.probe(str(root))
    )


def test_the_tightest_level_of_the_hierarchy_binds(tmp_path: Path) -> None:
    root = _copy(tmp_path, "n100-minipc")
    # the scope gets its own 1 GiB limit with 8 MiB used: tighter than the slice's 4608 MiB room
    (root / "sys/fs/cgroup/llm.slice/probe.scope/memory.max").write_text("1073741824\n")
    memory = hostinfo.probe(str(root))["memory"]
    assert (memory["cgroup_limit_mib"], memory["cgroup_usage_mib"], memory["usable_mib"]) == (1024, 8, 1016)


def test_a_looser_inner_limit_does_not_hide_the_parents(tmp_path: Path) -> None:
    root = _copy(tmp_path, "n100-minipc")
    # the scope's own 5 GiB (5112 MiB free) is looser than the slice's 6 GiB with 1.5 GiB used
    (root / "sys/fs/cgroup/llm.slice/probe.scope/memory.max").write_text(str(5 * 1024**3) + "\n")
    memory = hostinfo.probe(str(root))["memory"]
    assert (memory["cgroup_limit_mib"], memory["cgroup_usage_mib"], memory["usable_mib"]) == (
        6144,
        1536,
        4608,
    )


def test_usage_above_the_limit_leaves_nothing(tmp_path: Path) -> None:
    root = _copy(tmp_path, "docker-v1")
    (root / "sys/fs/cgroup/memory/memory.usage_in_bytes").write_text(str(2200 * 1024**2) + "\n")
    assert hostinfo.probe(str(root))["memory"]["usable_mib"] == 0


def test_cgroup_v2_max_everywhere_is_unlimited(tmp_path: Path) -> None:
    root = _copy(tmp_path, "podman-v2")
    (root / "sys/fs/cgroup/memory.max").write_text("max\n")
    memory = hostinfo.probe(str(root))["memory"]
    assert memory["cgroup_limit_mib"] is None
    assert memory["cgroup_usage_mib"] == 32
    assert memory["usable_mib"] == memory["available_mib"]


# --- a serving fleet: page cache and our own llama.cpp processes ------------------------------------


def test_page_cache_is_not_counted_as_used_v1() -> None:
    # Without our own processes counted back: limit - (usage - total_inactive_file - total_active_file)
    # = 352 - 90. Counting the raw usage_in_bytes (340 MiB, mostly the model's page cache) would leave
    # 12 MiB; the kubelet's working set (only the inactive cache left out) 212 MiB.
    memory = hostinfo.probe(str(FIXTURES / "podman-v1-head"), own_processes=())["memory"]
    assert (memory["cgroup_raw_usage_mib"], memory["cgroup_usage_mib"]) == (340, 90)
    assert (memory["reclaimable_mib"], memory["own_processes"]) == (0, [])
    assert memory["usable_mib"] == 262


def test_page_cache_is_not_counted_as_used_v2() -> None:
    memory = hostinfo.probe(str(FIXTURES / "podman-v2-worker"), own_processes=[])["memory"]
    assert (memory["cgroup_raw_usage_mib"], memory["cgroup_usage_mib"]) == (150, 74)
    assert memory["usable_mib"] == 224 - 74


def test_v1_reads_the_hierarchical_totals_not_the_local_counters(tmp_path: Path) -> None:
    # cgroup v1's hierarchical counters are total_*_file; the local inactive_file/active_file do not count
    root = _copy(tmp_path, "podman-v1-head")
    stat = root / "sys/fs/cgroup/memory/memory.stat"
    stat.write_text("".join(line + "\n" for line in stat.read_text().splitlines() if "total_" not in line))
    memory = hostinfo.probe(str(root), own_processes=())["memory"]
    assert memory["cgroup_usage_mib"] == 340
    assert memory["usable_mib"] == 12


def test_our_own_servers_count_as_usable() -> None:
    head = hostinfo.probe(str(FIXTURES / "podman-v1-head"))["memory"]
    # llama-server pid 63: 96 MiB resident, 48 of them mapped from the model file (page cache, already
    # available); the supervisor (python3), systemd and a zombie llama-server do not count
    assert head["own_processes"] == ["llama-server[63]"]
    assert (head["reclaimable_mib"], head["usable_mib"]) == (48, 262 + 48)
    worker = hostinfo.probe(str(FIXTURES / "podman-v2-worker"))["memory"]
    assert worker["own_processes"] == ["ggml-rpc-server[44]"]
    assert (worker["reclaimable_mib"], worker["usable_mib"]) == (35, 150 + 35)


def test_the_process_names_are_an_option() -> None:
    root = str(FIXTURES / "podman-v1-head")
    assert hostinfo.probe(root, own_processes=["ggml-rpc-server"])["memory"]["usable_mib"] == 262
    memory = hostinfo.probe(root, own_processes=["llama-server", "python3"])["memory"]
    assert memory["own_processes"] == ["python3[57]", "llama-server[63]"]
    assert memory["reclaimable_mib"] == 48 + 10


def test_the_measure_does_not_move_with_the_cache(tmp_path: Path) -> None:
    # the same cache turning from inactive to active (read again) leaves usable memory where it was
    root = _copy(tmp_path, "podman-v1-head")
    stat = root / "sys/fs/cgroup/memory/memory.stat"
    text = stat.read_text()
    mib = 1024**2
    text = text.replace(f"total_inactive_file {200 * mib}", f"total_inactive_file {20 * mib}")
    text = text.replace(f"total_active_file {50 * mib}", f"total_active_file {230 * mib}")
    stat.write_text(text)
    assert hostinfo.probe(str(root))["memory"]["usable_mib"] == 262 + 48


def test_the_file_backed_part_is_read_from_rssfile(tmp_path: Path) -> None:
    mib = 1024**2
    free = hostinfo.usable_memory(8000 * mib, 5000 * mib, {"limit": None}, 100 * mib, 60 * mib)
    assert (free["reclaimable_mib"], free["usable_mib"]) == (40, 5040)
    # a kernel without the Rss* lines: all of VmRSS counts as anonymous
    root = _copy(tmp_path, "podman-v2-worker")
    status = root / "proc/44/status"
    status.write_text(
        "".join(line + "\n" for line in status.read_text().splitlines() if not line.startswith("Rss"))
    )
    assert hostinfo.probe(str(root))["memory"]["reclaimable_mib"] == 70


def test_usable_never_exceeds_the_limit_or_memtotal(tmp_path: Path) -> None:
    root = _copy(tmp_path, "podman-v2-worker")
    # nothing but cache charged, and 35 MiB of rpc-server counted back: still at most the 224 MiB limit
    (root / "sys/fs/cgroup/memory.current").write_text(str(20 * 1024**2) + "\n")
    memory = hostinfo.probe(str(root))["memory"]
    assert (memory["cgroup_usage_mib"], memory["reclaimable_mib"], memory["usable_mib"]) == (0, 35, 224)
    # no cgroup limit: MemAvailable + our servers, capped at MemTotal
    assert (
        hostinfo.usable_memory(1000 * 1024**2, 990 * 1024**2, {"limit": None}, 50 * 1024**2)["usable_mib"]
        == 1000
    )
    assert (
        hostinfo.usable_memory(1000 * 1024**2, 500 * 1024**2, {"limit": None}, 50 * 1024**2)["usable_mib"]
        == 550
    )


def test_malformed_memory_stat_and_vmrss_are_named(tmp_path: Path) -> None:
    root = _copy(tmp_path, "podman-v2-worker")
    (root / "sys/fs/cgroup/memory.stat").write_text("anon 1\ninactive_file lots\n")
    with pytest.raises(
        HostInfoError, match=r"cannot parse .*/sys/fs/cgroup/memory.stat: 'inactive_file lots'"
    ):
        hostinfo.probe(str(root))
    root = _copy(tmp_path / "b", "podman-v2-worker")
    status = root / "proc/44/status"
    status.write_text(status.read_text().replace("VmRSS:\t    71680 kB", "VmRSS:\t  71680 pages"))
    with pytest.raises(HostInfoError, match=r"cannot parse .*/proc/44/status: 'VmRSS: 71680 pages'"):
        hostinfo.probe(str(root))


def test_old_glibc_and_musl_mean_a_source_build(tmp_path: Path) -> None:
    verdict = hostinfo.llama_cpp_verdict("x86_64", "glibc", "2.34", [])
    assert (verdict["status"], verdict["flavour"]) == ("source", "source")
    assert "2.34" in verdict["reason"] and "2.35" in verdict["reason"]
    assert hostinfo.llama_cpp_verdict("x86_64", "glibc", "2.35", [])["flavour"] == "ubuntu-x64"
    assert hostinfo.llama_cpp_verdict("aarch64", "glibc", "2.40", [])["flavour"] == "ubuntu-arm64"
    assert hostinfo.llama_cpp_verdict("aarch64", "musl", None, [])["status"] == "source"
    assert hostinfo.llama_cpp_verdict("riscv64", "glibc", "2.39", [])["status"] == "source"
    assert hostinfo.llama_cpp_verdict("i686", "glibc", "2.39", [])["status"] == "unsupported"
    # an AMD card with real VRAM switches to Vulkan, a small iGPU carve-out does not
    dgpu = {"vendor": "amd", "driver": "amdgpu", "memory_mib": 16384}
    igpu = {"vendor": "amd", "driver": "amdgpu", "memory_mib": 512}
    assert hostinfo.llama_cpp_verdict("x86_64", "glibc", "2.39", [dgpu])["flavour"] == "ubuntu-vulkan-x64"
    assert hostinfo.llama_cpp_verdict("x86_64", "glibc", "2.39", [igpu])["flavour"] == "ubuntu-x64"
    root = _copy(tmp_path, "graviton2")
    (root / "usr/lib64/libc.so.6").unlink()
    (root / "lib").mkdir(exist_ok=True)
    (root / "lib/ld-musl-aarch64.so.1").write_bytes(b"")
    fact = hostinfo.probe(str(root))
    assert (fact["libc"], fact["glibc"], fact["backends"]["llama_cpp"]["status"]) == ("musl", None, "source")


def test_vllm_cpu_verdicts() -> None:
    assert hostinfo.vllm_cpu_verdict("x86_64", ["avx", "avx2"])["status"] == "limited"
    assert hostinfo.vllm_cpu_verdict("x86_64", ["avx"])["status"] == "unsupported"
    assert hostinfo.vllm_cpu_verdict("x86_64", ["avx512f"])["status"] == "supported"
    assert hostinfo.vllm_cpu_verdict("aarch64", ["neon", "bf16"])["image_arch"] == "arm64"
    assert hostinfo.vllm_cpu_verdict("aarch64", [])["status"] == "unsupported"
    assert hostinfo.vllm_cpu_verdict("armv7l", ["neon"])["status"] == "unsupported"


# --- parsers ----------------------------------------------------------------------------------------


def test_isa_normalisation_keeps_only_listed_features() -> None:
    assert hostinfo.normalise_isa("x86_64", ["sse4_2", "avx2", "avx512_fp16", "amx_tile"]) == [
        "amx_tile",
        "avx2",
    ]
    assert hostinfo.normalise_isa("aarch64", ["fp", "asimd", "asimddp", "svei8mm", "sve2", "sme"]) == [
        "dotprod",
        "neon",
        "sme",
        "sve2",
    ]
    assert hostinfo.normalise_isa("armv7l", ["half", "neon", "vfpv4"]) == ["neon"]
    assert hostinfo.normalise_isa("riscv64", ["rv64imafdc"]) == []


def test_isa_is_what_every_cpu_reports() -> None:
    text = (
        "processor : 0\nFeatures : fp asimd asimddp\nCPU architecture: 8\n\n"
        "processor : 1\nFeatures : fp asimd\nCPU architecture: 8\n"
    )
    processors, _unused = hostinfo.parse_cpuinfo(text, "cpuinfo")
    assert len(processors) == 2
    words = set(processors[0]["Features"].split()) & set(processors[1]["Features"].split())
    assert hostinfo.normalise_isa("aarch64", words) == ["neon"]


def test_parse_cpulist() -> None:
    assert hostinfo.parse_cpulist("0-3,8,10-11\n", "x") == [0, 1, 2, 3, 8, 10, 11]
    assert hostinfo.parse_cpulist("", "x") == []
    with pytest.raises(HostInfoError, match=r"cannot parse /sys/x: '3-1'"):
        hostinfo.parse_cpulist("3-1", "/sys/x")


def test_mountinfo_unescapes_paths() -> None:
    (mount,) = hostinfo.parse_mountinfo(
        "31 26 0:26 /a\\040b /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n", "mountinfo"
    )
    assert mount == {
        "root": "/a b",
        "mountpoint": "/sys/fs/cgroup",
        "fstype": "cgroup2",
        "options": ["rw", "nsdelegate"],
    }


def test_cgroup_chain_walks_up_to_the_visible_root() -> None:
    mount = {"root": "/", "mountpoint": "/sys/fs/cgroup", "fstype": "cgroup2", "options": []}
    assert hostinfo._chain(mount, "/a.slice/b.scope") == [
        "/sys/fs/cgroup/a.slice/b.scope",
        "/sys/fs/cgroup/a.slice",
        "/sys/fs/cgroup",
    ]
    bound = {"root": "/docker/abc", "mountpoint": "/sys/fs/cgroup/memory", "fstype": "cgroup", "options": []}
    assert hostinfo._chain(bound, "/docker/abc") == ["/sys/fs/cgroup/memory"]
    assert hostinfo._chain(bound, "/docker/abc/sub") == ["/sys/fs/cgroup/memory/sub", "/sys/fs/cgroup/memory"]
    # outside the cgroup namespace: only the namespace root can be read
    assert hostinfo._chain(mount, "/../../user.slice") == ["/sys/fs/cgroup"]


def test_addresses_follow_routes_metrics_and_the_kernel() -> None:
    routes = hostinfo.parse_route(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        "wlan0\t00000000\t0100A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
        "eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        "eth0\t0000A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
        "wlan0\t0000A8C0\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0\n",
        "route",
    )
    local = ["127.0.0.1", "192.168.0.7", "192.168.0.9", "100.64.0.5"]
    addresses, default = hostinfo.interface_addresses(local, routes)
    # the route table alone cannot tell eth0 and wlan0 apart on one subnet ...
    assert addresses == {"eth0": ["192.168.0.7", "192.168.0.9", "100.64.0.5"]}
    assert default == "192.168.0.7"
    # ... the kernel's own list (live hosts) can
    known = {"192.168.0.7": "wlan0", "192.168.0.9": "eth0", "100.64.0.5": "tailscale0"}
    addresses, default = hostinfo.interface_addresses(local, routes, known)
    assert addresses == {"eth0": ["192.168.0.9"], "tailscale0": ["100.64.0.5"], "wlan0": ["192.168.0.7"]}
    assert default == "192.168.0.9"
    assert hostinfo.interface_addresses(["127.0.0.1"], []) == ({}, None)
    assert hostinfo.interface_addresses(["10.0.0.2"], []) == ({"unknown": ["10.0.0.2"]}, "10.0.0.2")


def test_glibc_version_from_banner_or_symbols() -> None:
    banner = b"\0GNU C Library (Ubuntu GLIBC 2.35-0ubuntu3) stable release version 2.35.\n"
    assert hostinfo.glibc_version_from_bytes(b"GLIBC_2.9\0GLIBC_2.17\0" + banner) == "2.35"
    assert hostinfo.glibc_version_from_bytes(b"GLIBC_2.9\0GLIBC_2.17\0GLIBC_2.3.4\0") == "2.17"
    assert hostinfo.glibc_version_from_bytes(b"nothing here") is None


def test_os_release_quotes_and_comments() -> None:
    parsed = hostinfo.parse_os_release("# c\nID=fedora\nVERSION_ID=\"39\"\nNAME='Fedora Linux'\n\n")
    assert parsed == {"ID": "fedora", "VERSION_ID": "39", "NAME": "Fedora Linux"}


def test_given_facts_are_checked() -> None:
    good = {
        "arch": "aarch64",
        "cpus": 8,
        "memory": {"usable_mib": 30000},
        "backends": {"llama_cpp": {"status": "release"}, "vllm_cpu": {"status": "supported"}},
    }
    assert hostinfo.check_given(good) == []
    assert hostinfo.check_given("x") == ["llmfleet_host must be a mapping, got str"]
    bad = {
        "arch": "aarch64",
        "cpus": True,
        "memory": {},
        "isa": "neon",
        "backends": {"llama_cpp": {"status": "fast"}},
    }
    problems = hostinfo.check_given(bad)
    assert "llmfleet_host.cpus must be int, got True" in problems
    assert "llmfleet_host.memory.usable_mib is missing" in problems
    assert "llmfleet_host.backends.vllm_cpu.status is missing" in problems
    assert any(p.startswith("llmfleet_host.isa must be a list") for p in problems)
    assert any("'fast', expected one of release, source, unsupported" in p for p in problems)


# --- failures name the file -------------------------------------------------------------------------


def test_malformed_meminfo_names_the_file_and_line(tmp_path: Path) -> None:
    root = _copy(tmp_path, "rpi5")
    lines = (root / "proc/meminfo").read_text().splitlines()
    lines[2] = "MemAvailable: abc kB"
    (root / "proc/meminfo").write_text("\n".join(lines) + "\n")
    with pytest.raises(HostInfoError) as err:
        hostinfo.probe(str(root))
    assert str(err.value) == f"cannot parse {root}/proc/meminfo: line 3 'MemAvailable: abc kB'"


def test_missing_cpuinfo_is_named(tmp_path: Path) -> None:
    root = _copy(tmp_path, "rpi5")
    (root / "proc/cpuinfo").unlink()
    with pytest.raises(HostInfoError, match=r"cannot read .*/rpi5/proc/cpuinfo: no such file"):
        hostinfo.probe(str(root))


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    root = _copy(tmp_path, "graviton3")
    (root / "proc/meminfo").unlink()
    (root / "proc/meminfo").mkdir()  # unreadable even for root
    with pytest.raises(HostInfoError, match=r"cannot read .*/graviton3/proc/meminfo: Is a directory"):
        hostinfo.probe(str(root))


@pytest.mark.parametrize(
    ("machine", "rel", "content", "message"),
    [
        (
            "graviton3",
            "sys/fs/cgroup/memory.max",
            "lots\n",
            r"cannot parse .*/sys/fs/cgroup/memory.max: 'lots'",
        ),
        (
            "graviton3",
            "sys/fs/cgroup/cpu.max",
            "600000\n",
            r"cannot parse .*/sys/fs/cgroup/cpu.max: '600000'",
        ),
        (
            "docker-v1",
            "sys/fs/cgroup/memory/memory.usage_in_bytes",
            "\n",
            r"cannot parse .*/sys/fs/cgroup/memory/memory.usage_in_bytes: ''",
        ),
        (
            "rpi5",
            "proc/net/route",
            "Iface\tDestination\neth0\tzz\n",
            r"cannot parse .*/proc/net/route: line 2",
        ),
        ("rpi5", "etc/os-release", "ID=debian\nthis is not os-release\n", r"os-release: line 2 'this is"),
        ("rpi5", "proc/self/cgroup", "garbage\n", r"cannot parse .*/proc/self/cgroup: line 1 'garbage'"),
        ("rpi5", "proc/cpuinfo", "\n", r"cannot parse .*/proc/cpuinfo: no processor entries"),
        ("rpi5", "proc/meminfo", "MemFree: 1 kB\n", r"cannot parse .*/proc/meminfo: no MemTotal line"),
        (
            "rpi5",
            "lib/aarch64-linux-gnu/libc.so.6",
            "\x7fELF",
            r"cannot find the glibc version in .*libc.so.6",
        ),
        ("rpi5", "sys/devices/system/cpu/online", "0-x\n", r"cannot parse .*/cpu/online: '0-x'"),
    ],
)
def test_malformed_files_are_named(
    tmp_path: Path, machine: str, rel: str, content: str, message: str
) -> None:
    root = _copy(tmp_path, machine)
    (root / rel).write_text(content)
    with pytest.raises(HostInfoError, match=message):
        hostinfo.probe(str(root))


def test_live_names_drop_the_root_prefix() -> None:
    assert hostinfo.Tree("/").show("proc/meminfo") == "/proc/meminfo"
    assert hostinfo.Tree("/x/y").show("proc/meminfo") == "/x/y/proc/meminfo"


# --- this machine, checked against independent sources ----------------------------------------------


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux")
def test_this_machine() -> None:
    fact = hostinfo.probe("/", "/tmp")
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
    assert fact["memory"]["total_mib"] == total
    memory = fact["memory"]
    # llama.cpp servers running here (e.g. in test containers) count back as reclaimable
    assert memory["available_mib"] <= total
    # (+ 1: each value is rounded down to MiB on its own)
    assert 0 <= memory["usable_mib"] <= min(total, memory["available_mib"] + memory["reclaimable_mib"] + 1)
    if not memory["own_processes"]:
        assert memory["reclaimable_mib"] == 0
    assert fact["arch"] == os.uname().machine
    assert fact["hostname"] == socket.gethostname()
    assert 1 <= fact["cpus"] <= len(os.sched_getaffinity(0))
    statvfs = os.statvfs("/tmp")
    assert abs(fact["disk_free_mib"] - statvfs.f_bavail * statvfs.f_frsize // (1024 * 1024)) < 64
    if fact["default_ipv4"] is not None:
        assert any(fact["default_ipv4"] in found for found in fact["addresses"].values())


# --- the userland's architecture from its C library's ELF header -------------------------------------


def _elf_header(machine: int, elf_class: int) -> bytes:
    return b"\x7fELF" + bytes([elf_class, 1, 1, 0]) + bytes(8) + b"\x03\x00" + machine.to_bytes(2, "little")


def test_qemu_user_arm64_userland_on_x86_kernel_gets_arm64_build(tmp_path: Path) -> None:
    # qemu-user: kernel.arch and cpuinfo are the x86 host's; the libc (lib64, no triplet) is aarch64.
    root = _copy(tmp_path, "zen4-desktop")
    libc = root / "lib64" / "libc.so.6"
    body = libc.read_bytes()
    libc.write_bytes(_elf_header(183, 2) + body[20:])
    fact = hostinfo.probe(str(root))
    assert fact["kernel_arch"] == "x86_64"
    assert fact["arch"] == "aarch64"
    assert fact["backends"]["llama_cpp"]["flavour"] == "ubuntu-arm64"


def test_x86_64_userland_on_an_arm64_kernel_gets_the_x86_build(tmp_path: Path) -> None:
    # The other way round (qemu-user x86_64 on an arm64 machine): the x86_64 libc decides.
    root = _copy(tmp_path, "graviton3")
    libc = root / "usr" / "lib" / "aarch64-linux-gnu" / "libc.so.6"
    libc.write_bytes(_elf_header(62, 2) + libc.read_bytes()[20:])
    fact = hostinfo.probe(str(root))
    assert (fact["kernel_arch"], fact["arch"]) == ("aarch64", "x86_64")
    assert fact["backends"]["llama_cpp"]["flavour"] == "ubuntu-x64"
    assert "arm64" not in " ".join(fact["backends"]["llama_cpp"]["flavours"])


def test_elf_machine_reads_class_and_machine() -> None:
    assert hostinfo.elf_machine(_elf_header(62, 2)) == "x86_64"
    assert hostinfo.elf_machine(_elf_header(183, 2)) == "aarch64"
    assert hostinfo.elf_machine(_elf_header(40, 1)) == "armv7l"
    assert hostinfo.elf_machine(_elf_header(0, 2)) is None  # recorded trees' stand-in headers
    assert hostinfo.elf_machine(b"#!/bin/sh\n" + bytes(20)) is None
    assert hostinfo.elf_machine(b"\x7fELF") is None


def test_recorded_32bit_pi_os_on_the_64bit_kernel_builds_from_source_and_says_why(facts: dict) -> None:
    # The recorded tree as it is: kernel.arch aarch64, the armhf C library's ELF header (EM_ARM).
    fact = facts["rpi4-armhf"]
    assert (fact["kernel_arch"], fact["arch"]) == ("aarch64", "armv7l")
    llama = fact["backends"]["llama_cpp"]
    assert (llama["status"], llama["flavour"], llama["flavours"]) == ("source", "source", ["source"])
    assert llama["reason"].startswith("32-bit ARM userland (armv7l) on a 64-bit aarch64 kernel")
    assert "no 32-bit ARM release" in llama["reason"] and "ubuntu-arm64 cannot run" in llama["reason"]
    assert hostinfo.summary(fact).endswith("llama_cpp=source  vllm_cpu=unsupported")
    # A 32-bit kernel says only that no release fits this architecture.
    assert facts["rpi4"]["backends"]["llama_cpp"]["reason"].startswith("no release asset for armv7l")


def test_the_release_assets_have_no_32bit_arm_flavour() -> None:
    # llama.cpp's Linux release assets (../shared/facts/llama-cpp-rpc.md, "Release tarballs"):
    # ubuntu-x64, ubuntu-arm64, ubuntu-vulkan-x64, ubuntu-vulkan-arm64, ubuntu-rocm-7.2-x64. No armhf:
    # the probe never names a release flavour for a 32-bit ARM userland, whatever its kernel.
    for arch in ("armv7l", "armv8l", "armv6l"):
        assert hostinfo.release_flavour(arch) is None
        for kernel in (arch, "aarch64"):
            verdict = hostinfo.llama_cpp_verdict(arch, "glibc", "2.36", [], kernel_arch=kernel)
            assert verdict["flavour"] in ("source", None) and verdict["flavours"] in (["source"], [])


def test_32bit_arm_userland_on_64bit_kernel_never_gets_arm64_build(tmp_path: Path) -> None:
    # Raspberry Pi OS 32-bit on its 64-bit kernel: the armhf libc decides, not kernel.arch.
    root = _copy(tmp_path, "rpi4")
    (root / "proc" / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "sys" / "kernel" / "arch").write_text("aarch64\n")
    libc = root / "lib" / "arm-linux-gnueabihf" / "libc.so.6"
    libc.write_bytes(_elf_header(40, 1) + libc.read_bytes()[20:])
    fact = hostinfo.probe(str(root))
    assert (fact["kernel_arch"], fact["arch"]) == ("aarch64", "armv7l")
    assert fact["backends"]["llama_cpp"]["flavour"] == "source"
    assert "arm64" not in " ".join(fact["backends"]["llama_cpp"]["flavours"])

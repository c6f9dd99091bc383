# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's compute devices as llama.cpp sees them: the ``devices`` part of ``llmfleet_host``.

Pure Python (3.9+, standard library only), no Ansible imports: the probe (hostinfo.py) calls it on
the managed hosts, the unit tests on recorded outputs, and the planner (``host_devices``) on the
controller. docs/probe.md ("Devices") says where each figure comes from.

A device is ``{name, backend, description, type, memory_total_mib, memory_free_mib, uma}``:

- ``name``: llama.cpp's own device name (``Vulkan0``, ``CUDA0``, ``ROCm0``, ``CPU``), the name
  ``-d``/``--device`` takes;
- ``backend``: ``vulkan``, ``cuda``, ``rocm`` or ``cpu``;
- ``description``: llama.cpp's description (the driver's device name, the CPU's model);
- ``type``: llama.cpp's own device type (ggml_backend_dev_type): ``gpu``, ``igpu`` (an
  integrated GPU: llama.cpp uses iGPUs only when there is no ``gpu``) or ``cpu``;
- ``memory_total_mib``/``memory_free_mib``: what the device offers (MiB);
- ``uma``: its memory is the host's RAM (an iGPU/APU, or a CPU-type Vulkan device such as
  lavapipe, which llama.cpp types ``gpu``); false for the CPU device, which is that memory. Such
  memory is not a second pool: whatever a plan
  puts on the ``uma`` devices and on the CPU device together must fit the CPU device's
  ``memory_free_mib`` (the host's usable memory), and each ``uma`` device's own
  ``memory_free_mib`` is already capped at it.

The list is in llama.cpp's device order with the CPU device last; optional keys: ``source``
(where the memory figures come from) and ``pci_address``.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

MIB = 1024 * 1024

# llama.cpp device name prefix -> backend. Other devices llama.cpp may list (BLAS, RPC, SYCL,
# Metal, ...) are not offered by llmfleet's builds and are left out (named in ``skipped``).
BACKEND_PREFIXES = (("Vulkan", "vulkan"), ("CUDA", "cuda"), ("ROCm", "rocm"))
BACKENDS = ("vulkan", "cuda", "rocm", "cpu")
DEVICE_TYPES = ("gpu", "igpu", "cpu")
DEVICE_KEYS = ("name", "backend", "description", "type", "memory_total_mib", "memory_free_mib", "uma")

# Vulkan drivers that run on the CPU (VK_PHYSICAL_DEVICE_TYPE_CPU): their "VRAM" is the host's RAM.
CPU_VULKAN_DRIVERS = ("llvmpipe", "SwiftShader")

# Drivers with a Vulkan driver beside them (NVIDIA's proprietary one, RADV, ANV).
VULKAN_DRIVERS = ("nvidia", "amdgpu", "i915", "xe")

# Where the installed pinned build lives (roles/llama_cpp: llama_cpp_install_dir + /current).
LLAMA_CPP_DIR = "/opt/llmfleet/llama.cpp/current"

# The commands the probe runs on a live host, and where a recorded machine tree keeps their output.
NVIDIA_SMI_QUERY = "--query-gpu=index,pci.bus_id,name,memory.total,memory.free"
COMMANDS = {
    "list_devices": ("llama-server", "--list-devices"),
    "nvidia_smi": ("nvidia-smi", NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"),
    "vulkaninfo": ("vulkaninfo",),
}
RECORDED = {
    "list_devices": "recorded/llama-server--list-devices.txt",
    "nvidia_smi": "recorded/nvidia-smi.csv",
    "vulkaninfo": "recorded/vulkaninfo.txt",
}
# Seconds a listing may take (Vulkan and CUDA initialise every device) and bytes read of its output
# (vulkaninfo prints some 60 KiB per device: its own, larger bound).
COMMAND_TIMEOUT_S = 60
OUTPUT_LIMIT = 64 * 1024
OUTPUT_LIMITS = {"vulkaninfo": 1024 * 1024}

# llama.cpp's own variable naming the Vulkan devices it uses (indices into the Vulkan loader's
# order); without it, it takes the discrete and integrated GPUs and skips CPU-type ones (lavapipe).
VK_VISIBLE_ENV = "GGML_VK_VISIBLE_DEVICES"


def output_limit(key: str) -> int:
    """Bytes of a COMMANDS key's output that are read."""
    return OUTPUT_LIMITS.get(key, OUTPUT_LIMIT)


# amdgpu's gpu_metrics table: format revision 1 is a discrete GPU's, 2 and 3 an APU's
# (drivers/gpu/drm/amd/include/kgd_pp_interface.h, gpu_metrics_v1_x / v2_x / v3_x).
AMD_APU_METRICS_REVISIONS = (2, 3)
# Without gpu_metrics: less VRAM than this is an APU's carve-out (as the Vulkan verdict assumes).
AMD_CARVE_OUT_MAX_MIB = 2048

_LINE = re.compile(r"^\s+(?P<name>\S+): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
_NAME = {backend: re.compile(r"^%s\d+$" % prefix) for prefix, backend in BACKEND_PREFIXES}
_NAME["cpu"] = re.compile(r"^CPU$")
# Integrated Intel graphics always sit at bus 0, device 2 (0000:00:02.0).
_INTEL_IGPU_SLOT = re.compile(r"^[0-9a-f]{4}:00:02\.0$")

Runner = Callable[[str], Tuple[Optional[str], Optional[str]]]


class DeviceError(Exception):
    """A device report is malformed, or a given device list is wrong (the message names it)."""


# --------------------------------------------------------------------------------------------
# Parsers of the tools' outputs
# --------------------------------------------------------------------------------------------


def parse_list_devices(text: str, source: str = "llama-server --list-devices") -> List[Dict[str, Any]]:
    """``llama-server --list-devices`` (common/arg.cpp) -> [{name, description, total_mib, free_mib}].

    The pinned build prints ``Available devices:`` then one ``  <name>: <description> (<total> MiB,
    <free> MiB free)`` line per non-CPU device, or ``  (none)``. Lines before the header (a build's
    own chatter on stdout) are skipped; after it every line must be a device.
    """
    lines = text[:OUTPUT_LIMIT].splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().lower() == "available devices:"), None)
    if start is None:
        raise DeviceError("cannot parse %s: no 'Available devices:' line" % source)
    found: List[Dict[str, Any]] = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.strip() == "(none)":
            continue
        match = _LINE.match(line)
        if not match:
            raise DeviceError("cannot parse %s: %r" % (source, line))
        found.append(
            {
                "name": match.group("name"),
                "description": match.group("desc"),
                "total_mib": int(match.group("total")),
                "free_mib": int(match.group("free")),
            }
        )
    return found


def parse_nvidia_smi(text: str, source: str = "nvidia-smi") -> List[Dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,pci.bus_id,name,memory.total,memory.free
    --format=csv,noheader,nounits`` -> [{index, pci_address, name, total_mib, free_mib}].

    nvidia-smi prints the bus id with an 8-digit domain (``00000000:0B:00.0``); it becomes the
    sysfs form (``0000:0b:00.0``). A memory field nvidia-smi cannot read (``[N/A]``) is None.
    """
    found: List[Dict[str, Any]] = []
    for number, line in enumerate(text[:OUTPUT_LIMIT].splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if (
            len(fields) != 5
            or not fields[0].isdigit()
            or not re.match(r"^[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:", fields[1])
        ):
            raise DeviceError("cannot parse %s: line %d %r" % (source, number, line))
        domain, rest = fields[1].split(":", 1)
        memory = []
        for value in fields[3:]:
            if value.isdigit():
                memory.append(int(value))
            elif value.startswith("["):  # [N/A], [Not Supported]
                memory.append(None)
            else:
                raise DeviceError("cannot parse %s: line %d %r" % (source, number, line))
        found.append(
            {
                "index": int(fields[0]),
                "pci_address": ("%04x:%s" % (int(domain, 16), rest)).lower(),
                "name": fields[2],
                "total_mib": memory[0],
                "free_mib": memory[1],
            }
        )
    return found


_VK_GPU = re.compile(r"^GPU(\d+):\s*$")
_VK_FIELD = re.compile(r"^\s+(deviceType|deviceName)\s*=\s*(.*?)\s*$")
_VK_HEAP = re.compile(r"^\s+memoryHeaps\[\d+\]:\s*$")
_VK_BYTES = re.compile(r"^\s+(size|budget|usage)\s*=\s*(\d+)")
_VK_TYPES = {
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": "discrete",
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": "integrated",
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": "virtual",
    "PHYSICAL_DEVICE_TYPE_CPU": "cpu",
    "PHYSICAL_DEVICE_TYPE_OTHER": "other",
}


def parse_vulkaninfo(text: str, source: str = "vulkaninfo") -> List[Dict[str, Any]]:
    """``vulkaninfo`` (the Vulkan SDK's tool; Debian's vulkan-tools) -> the physical devices in the
    loader's order: [{index, type (discrete, integrated, virtual, cpu, other), description,
    heaps: [{size, budget, usage, device_local}]}] (bytes; budget and usage None without
    VK_EXT_memory_budget).

    Read from its ``Device Properties and Extensions`` part: a ``GPU<n>:`` line per device, its
    ``deviceType`` and ``deviceName``, and each ``memoryHeaps[i]`` with its ``size`` (``budget``,
    ``usage``) and flags. Lines before that part (instance, layers, surfaces) are skipped.
    """
    lines = text[: OUTPUT_LIMITS["vulkaninfo"]].splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.strip() == "Device Properties and Extensions:"), None
    )
    if start is None:
        raise DeviceError("cannot parse %s: no 'Device Properties and Extensions:' part" % source)
    found: List[Dict[str, Any]] = []
    heap: Optional[Dict[str, Any]] = None
    for line in lines[start + 1 :]:
        gpu = _VK_GPU.match(line)
        if gpu:
            found.append({"index": int(gpu.group(1)), "type": None, "description": None, "heaps": []})
            heap = None
            continue
        if not found:
            continue
        current = found[-1]
        field = _VK_FIELD.match(line)
        if field and current[{"deviceType": "type", "deviceName": "description"}[field.group(1)]] is None:
            if field.group(1) == "deviceType":
                if field.group(2) not in _VK_TYPES:
                    raise DeviceError(
                        "cannot parse %s: GPU%d deviceType %r" % (source, current["index"], field.group(2))
                    )
                current["type"] = _VK_TYPES[field.group(2)]
            else:
                current["description"] = field.group(2)
            continue
        if _VK_HEAP.match(line):
            heap = {"size": None, "budget": None, "usage": None, "device_local": False}
            current["heaps"].append(heap)
            continue
        if heap is not None:
            value = _VK_BYTES.match(line)
            if value:
                heap[value.group(1)] = int(value.group(2))
            elif line.strip() == "MEMORY_HEAP_DEVICE_LOCAL_BIT":
                heap["device_local"] = True
            elif not line.startswith("\t\t"):  # the heap's own lines are indented twice or more
                heap = None
    for number, gpu in enumerate(found):
        if gpu["index"] != number or gpu["type"] is None or gpu["description"] is None:
            raise DeviceError(
                "cannot parse %s: GPU%d lacks its deviceType or deviceName" % (source, gpu["index"])
            )
        if not gpu["heaps"] or any(h["size"] is None for h in gpu["heaps"]):
            raise DeviceError("cannot parse %s: GPU%d lacks its memory heaps' sizes" % (source, gpu["index"]))
    return found


def parse_gpu_metrics_revision(data: bytes) -> Optional[int]:
    """The format revision of amdgpu's gpu_metrics (header: u16 size, u8 format, u8 content)."""
    return data[2] if len(data) >= 4 else None


# --------------------------------------------------------------------------------------------
# sysfs: memory and integration of the PCI GPUs (hostinfo.pci_accelerators lists them)
# --------------------------------------------------------------------------------------------


def _sysfs_int(tree: Any, rel: str) -> Optional[int]:
    text = tree.read(rel, required=False)
    if text is None:
        return None
    value = text.strip()
    try:
        return int(value, 0)  # decimal, or 0x... (xe prints some sizes in hex)
    except ValueError:
        raise DeviceError("cannot parse %s: %r" % (tree.show(rel), value)) from None


def gpu_details(tree: Any, gpu: Dict[str, Any], host_total_mib: int) -> Dict[str, Any]:
    """What sysfs says of one accelerator: {integrated, vram_total_mib, vram_free_mib, gtt_*}.

    amdgpu: ``mem_info_vram_total``/``_used`` and ``mem_info_gtt_total``/``_used`` (bytes); an APU
    (gpu_metrics format 2 or 3, else less than 2 GiB of VRAM) is integrated. Intel: integrated at
    0000:00:02.0; the xe driver gives a discrete card's ``tile0/physical_vram_size_bytes``.
    NVIDIA: memory from nvidia-smi, not sysfs.
    """
    base = "sys/bus/pci/devices/%s/" % gpu["pci_address"]
    out: Dict[str, Any] = {
        "integrated": False,
        "vram_total_mib": None,
        "vram_free_mib": None,
        "gtt_total_mib": None,
        "gtt_free_mib": None,
    }
    if gpu["vendor"] == "amd":
        values = {
            key: _sysfs_int(tree, base + "mem_info_" + key)
            for key in ("vram_total", "vram_used", "gtt_total", "gtt_used")
        }
        for kind in ("vram", "gtt"):
            total, used = values[kind + "_total"], values[kind + "_used"]
            if total is not None:
                out[kind + "_total_mib"] = total // MIB
                out[kind + "_free_mib"] = max(0, total - (used or 0)) // MIB
        revision = None
        if tree.exists(base + "gpu_metrics"):
            revision = parse_gpu_metrics_revision(tree.read_bytes(base + "gpu_metrics"))
        if revision is not None and revision > 0:
            out["integrated"] = revision in AMD_APU_METRICS_REVISIONS
        else:
            out["integrated"] = (out["vram_total_mib"] or 0) < AMD_CARVE_OUT_MAX_MIB
    elif gpu["vendor"] == "intel":
        vram = _sysfs_int(tree, base + "tile0/physical_vram_size_bytes")
        if vram:
            out["vram_total_mib"] = out["vram_free_mib"] = vram // MIB
        out["integrated"] = not vram and bool(_INTEL_IGPU_SLOT.match(gpu["pci_address"]))
        if out["integrated"]:
            # ANV's heap for an integrated GPU: half of the RAM up to 4 GiB, else three quarters.
            out["vram_total_mib"] = host_total_mib // 2 if host_total_mib <= 4096 else host_total_mib * 3 // 4
            out["vram_free_mib"] = out["vram_total_mib"]
    return out


def vulkan_order(gpus: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The GPUs a Vulkan build enumerates, in its order: discrete before integrated (the Vulkan
    loader's sort on Linux), then by PCI address. Only GPUs with a Vulkan-capable driver bound."""
    usable = [g for g in gpus if g.get("driver") in VULKAN_DRIVERS]
    return sorted(usable, key=lambda g: (bool(g["details"]["integrated"]), g["pci_address"]))


def _vendor_of(description: str) -> Optional[str]:
    words = description.lower()
    if words.startswith(tuple(d.lower() for d in CPU_VULKAN_DRIVERS)):
        return "cpu"
    for vendor, marks in (("nvidia", ("nvidia",)), ("amd", ("amd", "radeon")), ("intel", ("intel",))):
        if any(mark in words for mark in marks):
            return vendor
    return None


def backend_of(name: str) -> Optional[str]:
    """The backend of a llama.cpp device name (``Vulkan0`` -> ``vulkan``), None for others."""
    for backend, pattern in _NAME.items():
        if pattern.match(name):
            return backend
    return None


def flavour_backend(flavour: Optional[str]) -> Optional[str]:
    """The GPU backend a llama.cpp flavour carries (``ubuntu-vulkan-x64`` -> ``vulkan``)."""
    words = re.split(r"[^a-z0-9]+", (flavour or "").lower())
    for backend, marks in (("vulkan", ("vulkan",)), ("cuda", ("cuda",)), ("rocm", ("rocm", "hip"))):
        if any(mark in words for mark in marks):
            return backend
    return None


# --------------------------------------------------------------------------------------------
# The device list
# --------------------------------------------------------------------------------------------


def _device(
    name: str,
    backend: str,
    description: str,
    kind: str,
    total: int,
    free: int,
    uma: bool,
    source: str,
    host_usable_mib: int,
    pci_address: Optional[str] = None,
) -> Dict[str, Any]:
    free = min(free, total)
    if uma:
        free = min(free, host_usable_mib)  # its memory is the host's: never more than the host has
    device = {
        "name": name,
        "backend": backend,
        "description": description,
        "type": kind,
        "memory_total_mib": int(total),
        "memory_free_mib": int(max(0, free)),
        "uma": bool(uma),
        "source": source,
    }
    if pci_address:
        device["pci_address"] = pci_address
    return device


def from_listing(
    listed: Sequence[Dict[str, Any]], gpus: Sequence[Dict[str, Any]], host_usable_mib: int
) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Devices from the installed build's own listing; sysfs only says which are integrated.

    A listed device is matched to a PCI GPU of its backend's vendors, in that backend's order
    (Vulkan: by the vendor in its description, discrete first; CUDA: NVIDIA; ROCm: AMD). Returns
    (devices, names left out: the CPU line of an rpc-server listing, BLAS, RPC, ...).
    """
    pools: Dict[str, List[Dict[str, Any]]] = {}
    for gpu in vulkan_order(gpus):
        pools.setdefault("vulkan:" + gpu["vendor"], []).append(gpu)
    for gpu in sorted(gpus, key=lambda g: g["pci_address"]):
        pools.setdefault(
            {"nvidia": "cuda", "amd": "rocm"}.get(gpu["vendor"], "-") + ":" + gpu["vendor"], []
        ).append(gpu)
    devices: List[Dict[str, Any]] = []
    skipped: List[str] = []
    for entry in listed:
        backend = backend_of(entry["name"])
        if backend in (None, "cpu"):
            skipped.append(entry["name"])
            continue
        vendor = _vendor_of(entry["description"]) if backend == "vulkan" else None
        if backend == "cuda":
            vendor = "nvidia"
        elif backend == "rocm":
            vendor = "amd"
        cpu_type = vendor == "cpu"
        pool = pools.get("%s:%s" % (backend, vendor), [])
        gpu = pool.pop(0) if pool and not cpu_type else None
        integrated = bool(gpu and gpu["details"]["integrated"])
        devices.append(
            _device(
                entry["name"],
                backend,
                entry["description"],
                "igpu" if integrated else "gpu",
                entry["total_mib"],
                entry["free_mib"],
                integrated or cpu_type,
                "llama-server",
                host_usable_mib,
                gpu["pci_address"] if gpu else None,
            )
        )
    return devices, skipped


def vulkan_selection(found: Sequence[Dict[str, Any]], visible: Optional[str]) -> List[Dict[str, Any]]:
    """The Vulkan devices the pinned build uses, in its order (ggml-vulkan.cpp, ggml_vk_instance_init).

    ``visible`` (GGML_VK_VISIBLE_DEVICES): the loader's indices it names, in that order, of any type
    (a CPU-type device too); an index out of range is an error, as llama.cpp throws. Without it:
    every discrete and integrated GPU (two drivers of one GPU are not told apart here: llama.cpp
    keeps one by deviceUUID, which vulkaninfo's part read here does not give), else the first
    device that is not CPU-type; a CPU-type device (lavapipe) alone gives none.
    """
    if visible is not None and str(visible).strip():
        chosen = []
        for word in str(visible).replace(",", " ").split():
            if not word.isdigit() or int(word) >= len(found):
                raise DeviceError(
                    "%s=%s: %r is not the index of one of the %d Vulkan devices vulkaninfo lists"
                    % (VK_VISIBLE_ENV, visible, word, len(found))
                )
            chosen.append(found[int(word)])
        return chosen
    gpus = [d for d in found if d["type"] in ("discrete", "integrated")]
    if gpus:
        return gpus
    return [d for d in found if d["type"] != "cpu"][:1]


def from_vulkaninfo(
    found: Sequence[Dict[str, Any]], visible: Optional[str], host_usable_mib: int
) -> List[Dict[str, Any]]:
    """Devices the Vulkan build will see, from the Vulkan loader's own listing (no build yet).

    Named ``Vulkan<i>`` in llama.cpp's order (vulkan_selection); memory as
    ggml_backend_vk_get_device_memory counts it: the device-local heaps (every heap of an
    integrated GPU), free = budget - usage where the driver reports a budget, else the size. An
    integrated GPU is an ``igpu``; a CPU-type device (lavapipe) llama.cpp types ``gpu``; both share
    the host's RAM (``uma``).
    """
    devices = []
    for index, gpu in enumerate(vulkan_selection(found, visible)):
        integrated = gpu["type"] == "integrated"
        total = free = 0
        for heap in gpu["heaps"]:
            if integrated or heap["device_local"]:
                total += heap["size"]
                if heap["budget"] is not None:
                    free += max(0, heap["budget"] - (heap["usage"] or 0))
                else:
                    free += heap["size"]
        devices.append(
            _device(
                "Vulkan%d" % index,
                "vulkan",
                gpu["description"],
                "igpu" if integrated else "gpu",
                total // MIB,
                free // MIB,
                integrated or gpu["type"] == "cpu",
                "vulkaninfo",
                host_usable_mib,
            )
        )
    return devices


def from_hardware(
    gpus: Sequence[Dict[str, Any]],
    nvidia: Optional[Sequence[Dict[str, Any]]],
    backend: Optional[str],
    host_usable_mib: int,
) -> List[Dict[str, Any]]:
    """Devices the ``backend`` build will see, predicted from nvidia-smi and sysfs (no build yet).

    Vulkan: every GPU with a Vulkan driver, discrete first (llama.cpp's Vulkan backend takes
    discrete and integrated GPUs); an integrated GPU's memory is VRAM + GTT (RADV) or ANV's heap,
    as llama.cpp sums every heap of an integrated GPU. CUDA: the NVIDIA GPUs in nvidia-smi's (PCI)
    order. ROCm: the AMD GPUs by PCI address. A figure no tool gives is 0 (``source: unknown``).
    """
    smi = {g["pci_address"]: g for g in nvidia or []}
    if backend == "vulkan":
        chosen = vulkan_order(gpus)
        prefix = "Vulkan"
    elif backend == "cuda":
        chosen = sorted((g for g in gpus if g["vendor"] == "nvidia"), key=lambda g: g["pci_address"])
        prefix = "CUDA"
    elif backend == "rocm":
        chosen = sorted((g for g in gpus if g["vendor"] == "amd"), key=lambda g: g["pci_address"])
        prefix = "ROCm"
    else:
        return []
    devices = []
    for index, gpu in enumerate(chosen):
        details = gpu["details"]
        integrated = bool(details["integrated"])
        description = gpu.get("model") or ""
        total = free = None
        source = "sysfs"
        if gpu["vendor"] == "nvidia" and gpu["pci_address"] in smi:
            row = smi[gpu["pci_address"]]
            description, total, free, source = row["name"], row["total_mib"], row["free_mib"], "nvidia-smi"
        elif integrated and gpu["vendor"] == "amd" and details["vram_total_mib"] is not None:
            total = details["vram_total_mib"] + (details["gtt_total_mib"] or 0)
            free = (details["vram_free_mib"] or 0) + (details["gtt_free_mib"] or 0)
        elif details["vram_total_mib"] is not None:
            total, free = details["vram_total_mib"], details["vram_free_mib"]
            source = "estimate" if integrated else "sysfs"
        if total is None or free is None:
            total, free, source = 0, 0, "unknown"
        devices.append(
            _device(
                "%s%d" % (prefix, index),
                backend,
                description,
                "igpu" if integrated else "gpu",
                total,
                free,
                integrated,
                source,
                host_usable_mib,
                gpu["pci_address"],
            )
        )
    return devices


def cpu_device(description: str, total_mib: int, usable_mib: int) -> Dict[str, Any]:
    """The CPU device: the host's memory as the probe computes it (usable: MemAvailable, cgroup
    limits, llmfleet's own servers counted back), not the whole machine's as llama.cpp reports it."""
    return {
        "name": "CPU",
        "backend": "cpu",
        "description": description,
        "type": "cpu",
        "memory_total_mib": int(max(total_mib, usable_mib)),
        "memory_free_mib": int(usable_mib),
        "uma": False,
        "source": "probe",
    }


def probe_devices(
    run: Runner,
    tree: Any,
    gpus: Sequence[Dict[str, Any]],
    flavour: Optional[str],
    cpu_description: str,
    memory: Dict[str, Any],
    env: Optional[Dict[str, Any]] = None,
) -> Tuple[List[Dict[str, Any]], str]:
    """The host's devices (CPU last) and a line saying where they come from.

    ``run(key)`` returns (stdout, None), (None, why it failed) or (None, None) when the tool is
    not there, for the keys of COMMANDS. The installed build's ``--list-devices`` is the ground
    truth; without it, what the host's flavour will see is predicted: for a Vulkan flavour from
    ``vulkaninfo`` (the Vulkan loader's own devices, with ``env``'s GGML_VK_VISIBLE_DEVICES, the
    environment the servers run with) where it is installed, else from nvidia-smi and sysfs.
    ``memory`` is the fact's (``total_mib``: MemTotal, ``cgroup_limit_mib``, ``usable_mib``).
    """
    host_total_mib = memory["total_mib"]
    host_usable_mib = memory["usable_mib"]
    limit = memory.get("cgroup_limit_mib")
    ceiling = host_total_mib if limit is None else min(host_total_mib, limit)
    annotated = [dict(g, details=gpu_details(tree, g, host_total_mib)) for g in gpus]
    notes: List[str] = []
    nvidia: Optional[List[Dict[str, Any]]] = None
    if any(g["vendor"] == "nvidia" for g in gpus):
        text, why = run("nvidia_smi")
        if text is not None:
            nvidia = parse_nvidia_smi(text)
        elif why:
            notes.append(why)
    text, why = run("list_devices")
    if text is not None:
        devices, skipped = from_listing(parse_list_devices(text), annotated, host_usable_mib)
        source = "llama-server --list-devices"
        if skipped:
            notes.append("left out: %s" % ", ".join(skipped))
    else:
        if why:
            notes.append(why)
        backend = flavour_backend(flavour)
        vulkan = None
        if backend == "vulkan":
            text, why = run("vulkaninfo")
            if text is not None:
                vulkan = parse_vulkaninfo(text)
            elif why:
                notes.append(why)
        if vulkan is not None:
            devices = from_vulkaninfo(vulkan, (env or {}).get(VK_VISIBLE_ENV), host_usable_mib)
            tool = "vulkaninfo"
        else:
            devices = from_hardware(annotated, nvidia, backend, host_usable_mib)
            tool = "nvidia-smi and sysfs" if nvidia is not None else "sysfs"
        source = "predicted for the %s build (%s) from %s" % (
            flavour or "unknown",
            "%s backend" % backend if backend else "no GPU backend",
            tool,
        )
    devices.append(cpu_device(cpu_description, ceiling, host_usable_mib))
    if notes:
        source += " (%s)" % "; ".join(notes)
    return devices, source


def command_argv(key: str, llama_cpp_dir: str = LLAMA_CPP_DIR) -> List[str]:
    """The command line of a COMMANDS key (llama-server from the installed build's directory)."""
    argv = list(COMMANDS[key])
    if key == "list_devices":
        argv[0] = llama_cpp_dir.rstrip("/") + "/" + argv[0]
    return argv


def recorded_runner(tree: Any) -> Runner:
    """A runner for a recorded machine tree: the outputs under ``recorded/`` (None when absent)."""

    def run(key: str) -> Tuple[Optional[str], Optional[str]]:
        return tree.read(RECORDED[key], required=False), None

    return run


# --------------------------------------------------------------------------------------------
# Given (what-if) devices, validated at the boundary
# --------------------------------------------------------------------------------------------


def device_problems(devices: Any, usable_mib: Any = None) -> List[str]:
    """Problems with a ``llmfleet_host.devices`` list (empty when it has the probe's shape)."""
    where = "llmfleet_host.devices"
    if not isinstance(devices, list) or not devices:
        return ["%s must be a non-empty list of devices (CPU last), got %r" % (where, devices)]
    problems: List[str] = []
    names: List[str] = []
    for index, device in enumerate(devices):
        at = "%s[%d]" % (where, index)
        if not isinstance(device, dict):
            problems.append("%s must be a mapping, got %r" % (at, device))
            continue
        missing = [k for k in DEVICE_KEYS if k not in device]
        if missing:
            problems.append("%s (%s) lacks %s" % (at, device.get("name", "?"), ", ".join(missing)))
            continue
        name, backend, kind = device["name"], device["backend"], device["type"]
        at = "%s[%d] (%s)" % (where, index, name)
        if backend not in BACKENDS:
            problems.append("%s.backend is %r, expected one of %s" % (at, backend, ", ".join(BACKENDS)))
        elif not isinstance(name, str) or not _NAME[backend].match(name):
            problems.append(
                "%s.name %r is not a llama.cpp %s device name (e.g. %s)"
                % (
                    at,
                    name,
                    backend,
                    {"vulkan": "Vulkan0", "cuda": "CUDA0", "rocm": "ROCm0", "cpu": "CPU"}[backend],
                )
            )
        if kind not in DEVICE_TYPES:
            problems.append("%s.type is %r, expected one of %s" % (at, kind, ", ".join(DEVICE_TYPES)))
        elif (kind == "cpu") != (backend == "cpu"):
            problems.append("%s.type %r does not go with backend %r" % (at, kind, backend))
        if not isinstance(device["description"], str):
            problems.append("%s.description must be a string, got %r" % (at, device["description"]))
        if not isinstance(device["uma"], bool):
            problems.append("%s.uma must be true or false, got %r" % (at, device["uma"]))
        elif kind == "igpu" and not device["uma"]:
            problems.append("%s is an igpu: its memory is the host's RAM, uma must be true" % at)
        values = {}
        for key in ("memory_total_mib", "memory_free_mib"):
            value = device[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append("%s.%s must be an integer >= 0 (MiB), got %r" % (at, key, value))
            else:
                values[key] = value
        if len(values) == 2 and values["memory_free_mib"] > values["memory_total_mib"]:
            problems.append(
                "%s.memory_free_mib %d is more than its memory_total_mib %d"
                % (at, values["memory_free_mib"], values["memory_total_mib"])
            )
        if name in names:
            problems.append("%s: the name %r is listed twice" % (at, name))
        names.append(name)
    if problems:
        return problems
    cpus = [i for i, d in enumerate(devices) if d["backend"] == "cpu"]
    if cpus != [len(devices) - 1]:
        problems.append("%s must end with the one CPU device (CPU devices at %s)" % (where, cpus or "none"))
    elif isinstance(usable_mib, int) and devices[-1]["memory_free_mib"] != usable_mib:
        problems.append(
            "%s[%d] (CPU).memory_free_mib %d differs from memory.usable_mib %d: the CPU device's "
            "memory is the host's usable memory"
            % (where, len(devices) - 1, devices[-1]["memory_free_mib"], usable_mib)
        )
    if isinstance(usable_mib, int):
        for index, device in enumerate(devices[:-1]):
            if device["uma"] and device["memory_free_mib"] > usable_mib:
                problems.append(
                    "%s[%d] (%s).memory_free_mib %d is more than the host's usable %d MiB: a uma "
                    "device's memory is the host's RAM"
                    % (where, index, device["name"], device["memory_free_mib"], usable_mib)
                )
    return problems


def host_devices(host: str, fact: Any) -> List[Dict[str, Any]]:
    """The devices of a host's ``llmfleet_host`` (probed or given), validated, CPU last.

    A fact without ``devices`` (a what-if host written before devices existed) has one: the CPU
    with ``memory.usable_mib``. Raises DeviceError naming the host and the bad value.
    """
    if not isinstance(fact, dict):
        raise DeviceError("host %s: llmfleet_host is missing or not a mapping" % host)
    memory = fact.get("memory") if isinstance(fact.get("memory"), dict) else {}
    usable = memory.get("usable_mib")
    if "devices" not in fact:
        if not isinstance(usable, int) or isinstance(usable, bool):
            raise DeviceError(
                "host %s: llmfleet_host.memory.usable_mib is missing or not an integer (%r)" % (host, usable)
            )
        total = memory.get("total_mib") if isinstance(memory.get("total_mib"), int) else usable
        return [cpu_device(str(fact.get("cpu_model") or "CPU"), total, usable)]
    problems = device_problems(fact["devices"], usable)
    if problems:
        raise DeviceError("host %s: %s" % (host, "; ".join(problems)))
    return [dict(d) for d in fact["devices"]]


def devices_summary(devices: Sequence[Dict[str, Any]]) -> str:
    """``Vulkan0 NVIDIA GeForce RTX 3060 11922/12502 MiB, CPU 28000/32000 MiB`` (uma marked)."""
    parts = []
    for device in devices:
        label = (
            device["name"]
            if device["backend"] == "cpu"
            else "%s %s" % (device["name"], device["description"])
        )
        parts.append(
            "%s %s/%s MiB%s"
            % (label, device["memory_free_mib"], device["memory_total_mib"], " uma" if device["uma"] else "")
        )
    return ", ".join(parts)

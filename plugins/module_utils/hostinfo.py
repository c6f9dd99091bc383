# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read what a Linux host can do from /proc, /sys and /etc: the llmfleet host fact.

Pure Python (3.9+, standard library only), no Ansible imports: it runs on the managed
hosts inside the ``llmfleet.cluster.host_facts`` module and in the unit tests, where
``root`` points at a recorded machine tree under tests/fixtures/hosts/.

Every parser takes the text and the name of the file it came from, so a malformed file
fails with ``HostInfoError("cannot parse /proc/meminfo: line 3 'MemTotal: abc'")``.
"""

from __future__ import annotations

import math
import os
import re
import socket
import struct
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import (
    DeviceError,
    Runner,
    device_problems,
    devices_summary,
    probe_devices,
    recorded_runner,
)

MIB = 1024 * 1024

# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX * page size (9223372036854771712 with
# 4 KiB pages); anything at or above 2**60 bytes is treated as unlimited.
CGROUP_UNLIMITED_BYTES = 2**60

# The llama.cpp Linux release assets are built on Ubuntu 22.04 (glibc 2.35).
RELEASE_MIN_GLIBC = "2.35"

X86_FEATURES = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)

# Linux arm/arm64 hwcap names (Documentation/arch/arm64/elf_hwcaps.rst) -> normalised name.
ARM_FEATURES = {
    "asimd": "neon",
    "neon": "neon",  # 32-bit ARM kernels call it neon
    "asimddp": "dotprod",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
}

KUBE_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv8l": "arm",
    "armv6l": "arm",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}

# Debian/Ubuntu multiarch triplets -> the uname machine of a userland built for them.
TRIPLETS = {
    "x86_64-linux-gnu": "x86_64",
    "aarch64-linux-gnu": "aarch64",
    "arm-linux-gnueabihf": "armv7l",
    "i386-linux-gnu": "i686",
    "riscv64-linux-gnu": "riscv64",
    "powerpc64le-linux-gnu": "ppc64le",
    "s390x-linux-gnu": "s390x",
}

# Architectures with a Linux release asset, and architectures where llama.cpp builds from source.
RELEASE_ASSET_ARCH = {"x86_64": "x64", "aarch64": "arm64"}
SOURCE_ARCHES = ("armv7l", "armv8l", "riscv64", "ppc64le", "s390x", "loongarch64")

# CPU implementer/part codes (arch/arm64/include/asm/cputype.h) for the cores we meet.
ARM_PARTS = {
    ("0x41", "0xd03"): "ARM Cortex-A53",
    ("0x41", "0xd04"): "ARM Cortex-A35",
    ("0x41", "0xd05"): "ARM Cortex-A55",
    ("0x41", "0xd07"): "ARM Cortex-A57",
    ("0x41", "0xd08"): "ARM Cortex-A72",
    ("0x41", "0xd09"): "ARM Cortex-A73",
    ("0x41", "0xd0a"): "ARM Cortex-A75",
    ("0x41", "0xd0b"): "ARM Cortex-A76",
    ("0x41", "0xd0c"): "ARM Neoverse-N1",
    ("0x41", "0xd0d"): "ARM Cortex-A77",
    ("0x41", "0xd40"): "ARM Neoverse-V1",
    ("0x41", "0xd41"): "ARM Cortex-A78",
    ("0x41", "0xd49"): "ARM Neoverse-N2",
    ("0x41", "0xd4f"): "ARM Neoverse-V2",
    ("0x61", "0x022"): "Apple M1 Icestorm",
    ("0x61", "0x023"): "Apple M1 Firestorm",
    ("0xc0", "0xac3"): "Ampere-1",
}

# Process names (/proc/<pid>/comm, at most 15 characters) of the llama.cpp servers llmfleet runs:
# a redeploy replaces them, so the probe counts their resident memory as usable.
OWN_PROCESSES = ("ggml-rpc-server", "rpc-server", "llama-server")

GPU_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}

GPU_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}

# A GPU makes the Vulkan release asset the better llama.cpp flavour when NVIDIA's driver is
# bound, or amdgpu with at least this much dedicated VRAM (integrated Radeon graphics carve out
# 512 MiB by default). Intel graphics and smaller carve-outs are listed but keep the CPU flavour.
VULKAN_MIN_AMD_VRAM_MIB = 2048


class HostInfoError(Exception):
    """A file under the probed root is missing, unreadable or malformed (the message names it)."""


# --------------------------------------------------------------------------------------------
# Reading files under a root
# --------------------------------------------------------------------------------------------


class Tree:
    """Files of one machine: the live host (root "/") or a recorded tree."""

    def __init__(self, root: str = "/") -> None:
        self.root = root or "/"

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def show(self, rel: str) -> str:
        """The name used in messages: the real path (prefixed with the root when replaying)."""
        return "/" + rel.lstrip("/") if self.root == "/" else self.path(rel)

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def read(self, rel: str, required: bool = True) -> Optional[str]:
        try:
            with open(self.path(rel), encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            if required:
                raise HostInfoError("cannot read %s: no such file" % self.show(rel)) from None
            return None
        except OSError as err:
            raise HostInfoError("cannot read %s: %s" % (self.show(rel), err.strerror or err)) from None

    def read_bytes(self, rel: str) -> bytes:
        try:
            with open(self.path(rel), "rb") as handle:
                return handle.read()
        except OSError as err:
            raise HostInfoError("cannot read %s: %s" % (self.show(rel), err.strerror or err)) from None

    def listdir(self, rel: str) -> List[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            return []
        except OSError as err:
            raise HostInfoError("cannot list %s: %s" % (self.show(rel), err.strerror or err)) from None

    def link_name(self, rel: str) -> Optional[str]:
        """The last component of a symlink's target (a bound driver), or None."""
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except OSError:
            return None


def _bad_line(name: str, number: int, line: str) -> HostInfoError:
    return HostInfoError("cannot parse %s: line %d %r" % (name, number, line))


def _bad_value(name: str, value: str) -> HostInfoError:
    return HostInfoError("cannot parse %s: %r" % (name, value))


def _lines(text: str) -> Iterable[Tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        yield number, line


# --------------------------------------------------------------------------------------------
# Pure parsers
# --------------------------------------------------------------------------------------------


def parse_meminfo(text: str, name: str = "/proc/meminfo") -> Dict[str, int]:
    """/proc/meminfo -> {key: bytes}. Values given in kB are converted to bytes."""
    values: Dict[str, int] = {}
    for number, line in _lines(text):
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not key.strip() or not fields or len(fields) > 2 or not fields[0].isdigit():
            raise _bad_line(name, number, line)
        unit = fields[1] if len(fields) == 2 else ""
        if unit not in ("", "kB"):
            raise _bad_line(name, number, line)
        values[key.strip()] = int(fields[0]) * (1024 if unit == "kB" else 1)
    if "MemTotal" not in values:
        raise HostInfoError("cannot parse %s: no MemTotal line" % name)
    return values


def parse_cpuinfo(text: str, name: str = "/proc/cpuinfo") -> Tuple[List[Dict[str, str]], Dict[str, str]]:
    """/proc/cpuinfo -> (one dict per processor, the machine-wide lines such as Hardware/Model)."""
    processors: List[Dict[str, str]] = []
    extra: Dict[str, str] = {}
    block: Dict[str, str] = {}

    def close() -> None:
        if not block:
            return
        if "processor" in block:
            processors.append(dict(block))
        else:
            extra.update(block)
        block.clear()

    for number, line in _lines(text):
        if not line.strip():
            close()
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise _bad_line(name, number, line)
        key = key.strip()
        # 32-bit ARM kernels print "processor : N" for every core, then one more block.
        if key == "processor" and "processor" in block:
            close()
        block[key] = value.strip()
    close()
    if not processors:
        raise HostInfoError("cannot parse %s: no processor entries" % name)
    return processors, extra


def parse_cpulist(text: str, name: str) -> List[int]:
    """A kernel CPU or node list ("0-3,8,10-11") -> sorted ids. An empty list is valid."""
    ids: List[int] = []
    value = text.strip()
    if not value:
        return ids
    for part in value.split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise _bad_value(name, value)
        start = int(low)
        stop = int(high) if sep else start
        if stop < start:
            raise _bad_value(name, value)
        ids.extend(range(start, stop + 1))
    return sorted(set(ids))


def parse_key_value(text: str, name: str, separator: str = ":") -> Dict[str, str]:
    """Lines of "Key<sep> value" (e.g. /proc/self/status) -> dict."""
    values: Dict[str, str] = {}
    for number, line in _lines(text):
        if not line.strip():
            continue
        key, sep, value = line.partition(separator)
        if not sep or not key.strip():
            raise _bad_line(name, number, line)
        values[key.strip()] = value.strip()
    return values


def parse_os_release(text: str, name: str = "/etc/os-release") -> Dict[str, str]:
    """os-release(5): KEY=value lines, values optionally quoted; comments and blanks allowed."""
    values: Dict[str, str] = {}
    for number, line in _lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not re.match(r"^[A-Z0-9_]+$", key):
            raise _bad_line(name, number, line)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values


def parse_proc_cgroup(text: str, name: str = "/proc/self/cgroup") -> List[Tuple[str, List[str], str]]:
    """/proc/self/cgroup -> [(hierarchy id, controllers, path)]; v2 is id "0" with no controllers."""
    entries: List[Tuple[str, List[str], str]] = []
    for number, line in _lines(text):
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise _bad_line(name, number, line)
        controllers = [c for c in parts[1].split(",") if c]
        entries.append((parts[0], controllers, parts[2]))
    return entries


def _unescape_mount(value: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


def parse_mountinfo(text: str, name: str = "/proc/self/mountinfo") -> List[Dict[str, Any]]:
    """/proc/self/mountinfo -> [{root, mountpoint, fstype, options}] (proc(5) format)."""
    mounts: List[Dict[str, Any]] = []
    for number, line in _lines(text):
        if not line.strip():
            continue
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        rest = tail.split()
        if not sep or len(fields) < 6 or len(rest) < 2:
            raise _bad_line(name, number, line)
        mounts.append(
            {
                "root": _unescape_mount(fields[3]),
                "mountpoint": _unescape_mount(fields[4]),
                "fstype": rest[0],
                "options": rest[2].split(",") if len(rest) > 2 else [],
            }
        )
    return mounts


def parse_fib_trie(text: str) -> List[str]:
    """/proc/net/fib_trie -> the host's local IPv4 addresses (leaves marked "/32 host LOCAL")."""
    found: List[str] = []
    leaf: Optional[str] = None
    for _unused, line in _lines(text):
        match = re.search(r"\|-- (\d+\.\d+\.\d+\.\d+)\s*$", line)
        if match:
            leaf = match.group(1)
            continue
        if leaf and re.search(r"/32 host LOCAL", line) and leaf not in found:
            found.append(leaf)
    return found


def _hex_ipv4(value: str, name: str, number: int, line: str) -> int:
    try:
        return struct.unpack("!I", struct.pack("<I", int(value, 16)))[0]
    except (ValueError, struct.error):
        raise _bad_line(name, number, line) from None


def parse_route(text: str, name: str = "/proc/net/route") -> List[Dict[str, Any]]:
    """/proc/net/route -> [{iface, dest, gateway, mask, flags, metric}] with addresses as ints."""
    routes: List[Dict[str, Any]] = []
    for number, line in _lines(text):
        fields = line.split()
        if not fields or fields[0] == "Iface":
            continue
        if len(fields) < 8:
            raise _bad_line(name, number, line)
        try:
            flags = int(fields[3], 16)
            metric = int(fields[6])
        except ValueError:
            raise _bad_line(name, number, line) from None
        routes.append(
            {
                "iface": fields[0],
                "dest": _hex_ipv4(fields[1], name, number, line),
                "gateway": _hex_ipv4(fields[2], name, number, line),
                "flags": flags,
                "metric": metric,
                "mask": _hex_ipv4(fields[7], name, number, line),
            }
        )
    return routes


def _ip_int(address: str) -> int:
    return struct.unpack("!I", socket.inet_aton(address))[0]


def live_interface_of() -> Dict[str, str]:
    """{address: interface} from the kernel (SIOCGIFCONF) for the live host; {} when unavailable.

    The route table cannot tell two interfaces on one subnet apart; the kernel's own list can.
    Only used when the probe reads the live host (root "/"), never for a recorded tree.
    """
    try:
        import array
        import fcntl
    except ImportError:  # pragma: no cover - non-Linux
        return {}
    size = 40 if struct.calcsize("P") == 8 else 32  # struct ifreq
    buffer = array.array("B", bytes(size * 256))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("iP", len(buffer), buffer.buffer_info()[0])
            length = struct.unpack("iP", fcntl.ioctl(sock.fileno(), 0x8912, request))[0]
    except OSError:
        return {}
    data = buffer.tobytes()[:length]
    found: Dict[str, str] = {}
    for offset in range(0, length - size + 1, size):
        name = data[offset : offset + 16].split(b"\0", 1)[0].decode("ascii", "replace")
        address = socket.inet_ntoa(data[offset + 20 : offset + 24])
        found.setdefault(address, name.split(":", 1)[0])
    return found


def interface_addresses(
    local: Sequence[str], routes: Sequence[Dict[str, Any]], known: Optional[Dict[str, str]] = None
) -> Tuple[Dict[str, List[str]], Optional[str]]:
    """Map local non-loopback IPv4 addresses to interfaces; pick the default-route address.

    An address belongs to the interface of the most specific non-default route that contains
    it, unless ``known`` (the kernel's own {address: interface}, live hosts only) says otherwise;
    an address no route covers (a /32 pod address) goes to the default route's interface.
    The default address is the one on the default route's interface (the one in the
    gateway's subnet when there are several), else the first non-loopback address.
    """
    up_routes = [r for r in routes if r["flags"] & 0x1]
    defaults = sorted((r for r in up_routes if r["dest"] == 0 and r["mask"] == 0), key=lambda r: r["metric"])
    # An address no subnet route covers (a /32 pod address) belongs to the default route's device.
    fallback = defaults[0]["iface"] if defaults else "unknown"
    by_iface: Dict[str, List[str]] = {}
    for address in local:
        value = _ip_int(address)
        if (value >> 24) == 127:
            continue
        best: Optional[Dict[str, Any]] = None
        for route in up_routes:
            if route["mask"] == 0 or (value & route["mask"]) != route["dest"]:
                continue
            if (
                best is None
                or route["mask"] > best["mask"]
                or (route["mask"] == best["mask"] and route["metric"] < best["metric"])
            ):
                best = route
        iface = best["iface"] if best else fallback
        if known and address in known:
            iface = known[address]
        by_iface.setdefault(iface, [])
        if address not in by_iface[iface]:
            by_iface[iface].append(address)
    addresses = {iface: by_iface[iface] for iface in sorted(by_iface)}

    for route in defaults:
        candidates = addresses.get(route["iface"], [])
        if not candidates:
            continue
        for address in candidates:
            subnet = [
                r
                for r in up_routes
                if r["iface"] == route["iface"]
                and r["mask"]
                and (_ip_int(address) & r["mask"]) == r["dest"]
                and (route["gateway"] & r["mask"]) == r["dest"]
            ]
            if subnet:
                return addresses, address
        return addresses, candidates[0]
    for iface in addresses:
        if iface != "unknown" or len(addresses) == 1:
            return addresses, addresses[iface][0]
    return addresses, None


# --------------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------------


def normalise_isa(arch: str, flags: Iterable[str]) -> List[str]:
    """Kernel feature flags -> the normalised feature names llmfleet cares about (sorted)."""
    present = set(flags)
    if arch in ("x86_64", "i686", "i386"):
        return sorted(f for f in X86_FEATURES if f in present)
    if arch.startswith("arm") or arch == "aarch64":
        return sorted({ARM_FEATURES[f] for f in present if f in ARM_FEATURES})
    return []


def arch_from_cpuinfo(processors: Sequence[Dict[str, str]], name: str) -> str:
    """Infer the uname machine from cpuinfo when /proc/sys/kernel/arch is absent."""
    first = processors[0]
    model = first.get("model name", "")
    for suffix, arch in (("(v6l)", "armv6l"), ("(v7l)", "armv7l")):
        if model.endswith(suffix):
            return arch
    if "vendor_id" in first or "flags" in first:
        return "x86_64" if " lm " in " %s " % first.get("flags", "") else "i686"
    arch = first.get("CPU architecture", "")
    if arch == "8" or arch.startswith("AArch64"):
        return "aarch64"
    if arch == "7":
        return "armv7l"
    if arch in ("6", "5TEJ"):
        return "armv6l"
    if "isa" in first and "rv64" in first["isa"]:
        return "riscv64"
    raise HostInfoError("cannot tell the architecture from %s" % name)


def cpu_model(processors: Sequence[Dict[str, str]], extra: Dict[str, str]) -> str:
    first = processors[0]
    if first.get("model name") and not first["model name"].startswith("ARMv"):
        return first["model name"]
    part = ARM_PARTS.get((first.get("CPU implementer", "").lower(), first.get("CPU part", "").lower()))
    if part:
        return part
    for key in ("model name", "cpu model", "uarch", "Hardware"):
        value = first.get(key) or extra.get(key)
        if value:
            return value
    return "unknown"


def cpu_bogomips(processors: Sequence[Dict[str, str]], name: str) -> Optional[float]:
    first = processors[0]
    for key in ("bogomips", "BogoMIPS"):
        if key in first:
            try:
                return float(first[key])
            except ValueError:
                raise _bad_value(name, "%s: %s" % (key, first[key])) from None
    return None


# --------------------------------------------------------------------------------------------
# cgroups
# --------------------------------------------------------------------------------------------


def cgroup_chain(
    tree: Tree,
    entries: Sequence[Tuple[str, List[str], str]],
    mounts: Sequence[Dict[str, Any]],
    controller: str,
) -> Tuple[Optional[int], List[str]]:
    """The cgroup directories (leaf first, up to the visible mount root) holding ``controller``.

    cgroup v1 is used when the controller has its own v1 hierarchy (hybrid hosts), else the
    unified v2 hierarchy when its cgroup.controllers lists the controller. Returns (version, directories) or (None, []) when neither is mounted.
    """
    for hid, controllers, path in entries:
        if hid != "0" and controller in controllers:
            for mount in mounts:
                if mount["fstype"] == "cgroup" and controller in mount["options"]:
                    return 1, _chain(mount, path)
    for hid, controllers, path in entries:
        if hid == "0" and not controllers:
            for mount in mounts:
                if mount["fstype"] == "cgroup2":
                    available = tree.read(
                        mount["mountpoint"].rstrip("/") + "/cgroup.controllers", required=False
                    )
                    if available is not None and controller not in available.split():
                        return None, []  # hybrid host: the unified tree holds no controllers
                    return 2, _chain(mount, path)
    return None, []


def _chain(mount: Dict[str, Any], path: str) -> List[str]:
    root = mount["root"].rstrip("/")
    top = mount["mountpoint"].rstrip("/") or "/"
    if "/.." in path:  # outside our cgroup namespace: only the namespace root is visible
        return [top]
    if root and (path == root or path.startswith(root + "/")):
        rel = path[len(root) :]
    elif not root:
        rel = path
    else:
        rel = ""
    parts = [p for p in rel.split("/") if p]
    dirs = []
    for depth in range(len(parts), -1, -1):
        dirs.append("/".join([top.rstrip("/"), *parts[:depth]]) or "/")
    return dirs


def _read_int(tree: Tree, rel: str, allow_max: bool = False) -> Optional[int]:
    """An integer file (or "max" when allowed -> None). Missing file -> HostInfoError."""
    text = tree.read(rel)
    value = (text or "").strip()
    if allow_max and value == "max":
        return None
    try:
        return int(value)
    except ValueError:
        raise _bad_value(tree.show(rel), value) from None


def _file_cache(tree: Tree, directory: str, version: int) -> Tuple[int, int]:
    """(inactive, active) file page cache charged to a cgroup (memory.stat); 0 when absent.

    cgroup v1 reports the hierarchy's totals as ``total_inactive_file`` / ``total_active_file``;
    v2 reports ``inactive_file`` / ``active_file`` (hierarchical already). Page cache is what
    MemAvailable counts as available too: the kernel reclaims it before it OOM-kills anything.
    """
    rel = directory + "/memory.stat"
    text = tree.read(rel, required=False)
    if text is None:
        return 0, 0
    stats = parse_key_value(text, tree.show(rel), separator=" ")
    prefix = "total_" if version == 1 else ""
    values = []
    for key in (prefix + "inactive_file", prefix + "active_file"):
        try:
            values.append(int(stats.get(key, "0")))
        except ValueError:
            raise _bad_value(tree.show(rel), "%s %s" % (key, stats[key])) from None
    return values[0], values[1]


def cgroup_memory(tree: Tree, version: Optional[int], dirs: Sequence[str]) -> Dict[str, Any]:
    """The binding memory limit along the chain: the level with the least room (limit - usage).

    ``usage`` is the usage file minus the clean-or-not file page cache of memory.stat (inactive
    and active; never below 0): what the kernel cannot drop before it OOM-kills. ``raw_usage``
    is the usage file itself; ``active_file`` the active page cache it left out.
    """
    if version == 1:
        limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
    elif version == 2:
        limit_file, usage_file = "memory.max", "memory.current"
    else:
        return {"version": None, "limit": None, "usage": None, "raw_usage": None, "active_file": 0}

    def working_set(directory: str) -> Tuple[int, int, int]:
        raw = _read_int(tree, directory + "/" + usage_file) or 0
        inactive, active = _file_cache(tree, directory, version)
        return max(0, raw - inactive - active), raw, active

    binding: Optional[Tuple[int, Tuple[int, int, int]]] = None
    leaf: Optional[Tuple[int, int, int]] = None
    for index, directory in enumerate(dirs):
        limit_rel = directory + "/" + limit_file
        usage_rel = directory + "/" + usage_file
        if index == 0 and tree.exists(usage_rel):
            leaf = working_set(directory)
        if not tree.exists(limit_rel):
            continue
        limit = _read_int(tree, limit_rel, allow_max=(version == 2))
        if limit is None or limit >= CGROUP_UNLIMITED_BYTES:
            continue
        level = working_set(directory)
        if binding is None or limit - level[0] < binding[0] - binding[1][0]:
            binding = (limit, level)
    if binding is None:
        return {
            "version": version,
            "limit": None,
            "usage": leaf[0] if leaf else None,
            "raw_usage": leaf[1] if leaf else None,
            "active_file": leaf[2] if leaf else 0,
        }
    limit, (usage, raw, active) = binding
    return {"version": version, "limit": limit, "usage": usage, "raw_usage": raw, "active_file": active}


def own_processes_rss(tree: Tree, names: Sequence[str]) -> Tuple[int, int, List[str]]:
    """Resident memory of the processes whose /proc/<pid>/comm is one of ``names``.

    These are llmfleet's own llama.cpp servers: a redeploy replaces them, so the memory they hold
    is memory the plan may use. Returns (VmRSS bytes, the file-backed part of it (RssFile, e.g.
    the mapped model; 0 on kernels without the Rss* lines), ["name[pid]", ...]). Processes that
    exit while being read, and zombies (no VmRSS), are skipped.
    """
    wanted = set(names)
    total = 0
    file_backed = 0
    found: List[str] = []
    if not wanted:
        return 0, 0, found
    pids = [p for p in tree.listdir("proc") if p.isdigit()]
    for pid in sorted(pids, key=int):
        comm = tree.read("proc/%s/comm" % pid, required=False)
        if comm is None or comm.strip() not in wanted:
            continue
        status_rel = "proc/%s/status" % pid
        text = tree.read(status_rel, required=False)
        if text is None:
            continue
        status = parse_key_value(text, tree.show(status_rel))
        if "VmRSS" not in status:
            continue
        values = {}
        for key in ("VmRSS", "RssFile"):
            if key not in status:
                continue
            fields = status[key].split()
            if len(fields) != 2 or not fields[0].isdigit() or fields[1] != "kB":
                raise _bad_value(tree.show(status_rel), "%s: %s" % (key, status[key]))
            values[key] = int(fields[0]) * 1024
        total += values["VmRSS"]
        file_backed += min(values.get("RssFile", 0), values["VmRSS"])
        found.append("%s[%s]" % (comm.strip(), pid))
    return total, file_backed, found


def cgroup_cpu_quota(tree: Tree, version: Optional[int], dirs: Sequence[str]) -> Optional[float]:
    """The tightest CPU quota along the chain, in CPUs (None when unlimited)."""
    quotas: List[float] = []
    for directory in dirs:
        if version == 2:
            rel = directory + "/cpu.max"
            if not tree.exists(rel):
                continue
            value = (tree.read(rel) or "").split()
            if len(value) != 2 or not value[1].isdigit() or not (value[0] == "max" or value[0].isdigit()):
                raise _bad_value(tree.show(rel), " ".join(value))
            if value[0] != "max" and int(value[1]) > 0:
                quotas.append(int(value[0]) / int(value[1]))
        elif version == 1:
            quota_rel = directory + "/cpu.cfs_quota_us"
            period_rel = directory + "/cpu.cfs_period_us"
            if not tree.exists(quota_rel):
                continue
            quota = _read_int(tree, quota_rel)
            period = _read_int(tree, period_rel)
            if quota is not None and period and quota > 0:
                quotas.append(quota / period)
    return min(quotas) if quotas else None


# --------------------------------------------------------------------------------------------
# libc, OS, accelerators, disk
# --------------------------------------------------------------------------------------------


def version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def glibc_version_from_bytes(data: bytes) -> Optional[str]:
    """The version in libc.so.6: its banner, else the highest GLIBC_2.N symbol version."""
    match = re.search(rb"release version (\d+\.\d+)", data)
    if match:
        return match.group(1).decode()
    versions = {m.decode() for m in re.findall(rb"GLIBC_(2\.\d+)(?![\d.])", data)}
    if versions:
        return max(versions, key=version_tuple)
    return None


# ELF e_machine (and class) -> the uname machine of a userland built for it (elf.h EM_*).
ELF_MACHINES = {
    (62, 2): "x86_64",
    (3, 1): "i686",
    (183, 2): "aarch64",
    (40, 1): "armv7l",
    (243, 2): "riscv64",
    (21, 2): "ppc64le",
    (22, 2): "s390x",
    (258, 2): "loongarch64",
}


def elf_machine(data: bytes) -> Optional[str]:
    """The uname machine an ELF file is built for, from its header; None when it is not a
    known ELF header (EM_NONE, too short). The userland's architecture is that of its C library,
    which under qemu-user or a 32-bit userland on a 64-bit kernel differs from the kernel's."""
    if len(data) < 20 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    machine = struct.unpack("<H" if data[5] == 1 else ">H", data[18:20])[0]
    return ELF_MACHINES.get((machine, data[4]))


def find_libc(tree: Tree, kernel_arch: str) -> Dict[str, Any]:
    """Locate the C library: -> {libc: glibc|musl|None, glibc: "2.36"|None, userland_arch}."""
    triplets = sorted(TRIPLETS, key=lambda t: (TRIPLETS[t] != kernel_arch, t))
    candidates = []
    for triplet in triplets:
        for base in ("lib", "usr/lib"):
            candidates.append(("%s/%s/libc.so.6" % (base, triplet), TRIPLETS[triplet]))
    for rel in ("lib64/libc.so.6", "usr/lib64/libc.so.6", "lib/libc.so.6", "usr/lib/libc.so.6"):
        candidates.append((rel, kernel_arch))
    for rel, arch in candidates:
        if tree.exists(rel):
            data = tree.read_bytes(rel)
            # The ELF header outranks the path and the kernel (qemu-user: x86 kernel, arm64 libc).
            arch = elf_machine(data[:64]) or arch
            if arch.startswith("arm") and kernel_arch.startswith("arm"):
                arch = kernel_arch  # Raspbian's armhf is built for armv6: the kernel says which
            version = glibc_version_from_bytes(data)
            if version is None:
                raise HostInfoError("cannot find the glibc version in %s" % tree.show(rel))
            return {"libc": "glibc", "glibc": version, "userland_arch": arch}
    for entry in tree.listdir("lib"):
        match = re.match(r"^ld-musl-(.+)\.so\.1$", entry)
        if match:
            arch = {"armhf": "armv7l"}.get(match.group(1), match.group(1))
            return {"libc": "musl", "glibc": None, "userland_arch": arch}
    return {"libc": None, "glibc": None, "userland_arch": kernel_arch}


def pci_accelerators(tree: Tree) -> List[Dict[str, Any]]:
    """NVIDIA / AMD / Intel display controllers from /sys/bus/pci/devices (PCI class 0x03xxxx)."""
    found: List[Dict[str, Any]] = []
    base = "sys/bus/pci/devices"
    for address in tree.listdir(base):
        device = "%s/%s" % (base, address)
        pci_class = (tree.read(device + "/class", required=False) or "").strip().lower()
        if not pci_class.startswith("0x03"):
            continue
        vendor_id = (tree.read(device + "/vendor") or "").strip().lower()
        vendor = GPU_VENDORS.get(vendor_id)
        if vendor is None:
            continue
        device_id = (tree.read(device + "/device") or "").strip().lower()
        driver = tree.link_name(device + "/driver")
        model: Optional[str] = None
        memory_mib: Optional[int] = None
        if vendor == "nvidia":
            info = tree.read("proc/driver/nvidia/gpus/%s/information" % address, required=False)
            if info:
                model = parse_key_value(
                    info, tree.show("proc/driver/nvidia/gpus/%s/information" % address)
                ).get("Model")
        product = tree.read(device + "/product_name", required=False)
        if not model and product and product.strip():
            model = product.strip()
        vram_rel = device + "/mem_info_vram_total"
        if tree.exists(vram_rel):
            vram = _read_int(tree, vram_rel)
            memory_mib = vram // MIB if vram else None
        found.append(
            {
                "vendor": vendor,
                "model": model or "%s GPU [%s:%s]" % (GPU_NAMES[vendor], vendor_id[2:], device_id[2:]),
                "pci_address": address,
                "pci_id": "%s:%s" % (vendor_id[2:], device_id[2:]),
                "driver": driver,
                "memory_mib": memory_mib,
            }
        )
    return found


def vulkan_worthy(gpu: Dict[str, Any]) -> bool:
    """Whether this accelerator should switch llama.cpp to the Vulkan release asset."""
    if gpu.get("driver") == "nvidia":
        return True
    return gpu.get("driver") == "amdgpu" and (gpu.get("memory_mib") or 0) >= VULKAN_MIN_AMD_VRAM_MIB


def disk_free_mib(tree: Tree, path: str) -> Optional[int]:
    """Free space (for unprivileged users) of the filesystem holding ``path`` or its nearest parent."""
    current = tree.path(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current.rstrip("/")) or "/"
        if parent == current:
            return None
        current = parent
    try:
        stat = os.statvfs(current)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize // MIB


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------


def release_flavour(arch: Optional[str]) -> Optional[str]:
    """The CPU release asset flavour of llama.cpp (``ubuntu-x64``, ``ubuntu-arm64``) for an
    architecture, by its kernel name (``x86_64``) or its Kubernetes name (``amd64``); None when
    llama.cpp publishes no release binary for it."""
    for uname, asset in RELEASE_ASSET_ARCH.items():
        if arch in (uname, KUBE_ARCH[uname]):
            return "ubuntu-%s" % asset
    return None


def llama_cpp_verdict(
    arch: str,
    libc: Optional[str],
    glibc: Optional[str],
    accelerators: Sequence[Dict[str, Any]],
    min_glibc: str = RELEASE_MIN_GLIBC,
    kernel_arch: Optional[str] = None,
) -> Dict[str, Any]:
    """Which llama.cpp build runs here: a release asset flavour, ``source``, or nothing.

    ``arch`` is the userland's (its C library's), which decides: a 32-bit ARM userland on a 64-bit
    kernel (``kernel_arch`` aarch64) builds from source, as llama.cpp publishes no 32-bit ARM release.
    """
    asset_arch = RELEASE_ASSET_ARCH.get(arch)
    if asset_arch:
        if libc != "glibc" or glibc is None:
            return {
                "status": "source",
                "flavour": "source",
                "flavours": ["source"],
                "reason": "no glibc found (%s): the release binaries need glibc >= %s"
                % (libc or "unknown libc", min_glibc),
            }
        if version_tuple(glibc) < version_tuple(min_glibc):
            return {
                "status": "source",
                "flavour": "source",
                "flavours": ["source"],
                "reason": "glibc %s is older than %s, which the release binaries need" % (glibc, min_glibc),
            }
        cpu = release_flavour(arch)
        gpus = [a for a in accelerators if vulkan_worthy(a)]
        if gpus:
            return {
                "status": "release",
                "flavour": "ubuntu-vulkan-%s" % asset_arch,
                "flavours": ["ubuntu-vulkan-%s" % asset_arch, cpu, "source"],
                "reason": "%s GPU with the %s driver: the Vulkan build offloads to it"
                % (gpus[0]["vendor"], gpus[0]["driver"]),
            }
        return {
            "status": "release",
            "flavour": cpu,
            "flavours": [cpu, "source"],
            "reason": "%s with glibc %s >= %s" % (arch, glibc, min_glibc),
        }
    if arch in SOURCE_ARCHES:
        reason = (
            "no release asset for %s (llama.cpp's Linux releases are x64 and arm64 only): build from source"
            % arch
        )
        if arch.startswith("arm") and kernel_arch == "aarch64":
            # Raspberry Pi OS 32-bit on its 64-bit kernel: uname says aarch64, every program is armhf.
            reason = (
                "32-bit ARM userland (%s) on a 64-bit aarch64 kernel: llama.cpp publishes no 32-bit ARM "
                "release, and ubuntu-arm64 cannot run on this userland: build from source (or install "
                "the 64-bit OS for ubuntu-arm64)" % arch
            )
        return {
            "status": "source",
            "flavour": "source",
            "flavours": ["source"],
            "reason": reason,
        }
    return {
        "status": "unsupported",
        "flavour": None,
        "flavours": [],
        "reason": "llama.cpp has no release asset and no supported source build for %s" % arch,
    }


def vllm_cpu_verdict(arch: str, isa: Sequence[str]) -> Dict[str, Any]:
    """vLLM's CPU backend: supported / limited / unsupported, with the image architecture tag."""
    features = set(isa)
    if arch == "x86_64":
        if "avx512f" in features:
            return {"status": "supported", "image_arch": "x86_64", "reason": "x86_64 with avx512f"}
        if "avx2" in features:
            return {
                "status": "limited",
                "image_arch": "x86_64",
                "reason": "avx2 without avx512f: vLLM's CPU backend runs with a limited feature set",
            }
        return {"status": "unsupported", "image_arch": None, "reason": "x86_64 without avx2"}
    if arch == "aarch64":
        if "bf16" in features:
            return {"status": "supported", "image_arch": "arm64", "reason": "arm64 with bf16 (ARMv8.6-A)"}
        if "neon" in features:
            return {
                "status": "limited",
                "image_arch": "arm64",
                "reason": "arm64 NEON without bf16: no bfloat16, the recommended dtype",
            }
        return {"status": "unsupported", "image_arch": None, "reason": "arm64 without NEON"}
    return {
        "status": "unsupported",
        "image_arch": None,
        "reason": "vLLM publishes CPU images for x86_64 and arm64 only, not %s" % arch,
    }


# --------------------------------------------------------------------------------------------
# The fact
# --------------------------------------------------------------------------------------------


def _mib(value: Optional[int]) -> Optional[int]:
    return None if value is None else value // MIB


def usable_memory(
    total: int, available: int, cgroup: Dict[str, Any], resident: int = 0, resident_file: int = 0
) -> Dict[str, Any]:
    """The memory part of the fact (MiB) from bytes: what a model may take on this host.

    usable = min(MemAvailable, cgroup limit - cgroup usage without page cache) + reclaimable,
    never more than the cgroup limit or MemTotal. ``reclaimable`` is the anonymous memory of our
    own llama.cpp processes (``resident - resident_file``: VmRSS minus RssFile), which a redeploy
    replaces; their file-backed pages (the mapped model) are page cache, counted as available
    by both terms already.
    """
    usable = available
    reclaimable = max(0, resident - resident_file)
    if cgroup.get("limit") is not None:
        usable = min(available, max(0, cgroup["limit"] - (cgroup.get("usage") or 0)))
    ceiling = total if cgroup.get("limit") is None else min(total, cgroup["limit"])
    usable = min(usable + reclaimable, ceiling)
    return {
        "total_mib": _mib(total),
        "available_mib": _mib(available),
        "cgroup_version": cgroup.get("version"),
        "cgroup_limit_mib": _mib(cgroup.get("limit")),
        "cgroup_usage_mib": _mib(cgroup.get("usage")),
        "cgroup_raw_usage_mib": _mib(cgroup.get("raw_usage")),
        "reclaimable_mib": _mib(reclaimable),
        "usable_mib": _mib(usable),
    }


def probe(
    root: str = "/",
    disk_path: str = "/",
    min_glibc: str = RELEASE_MIN_GLIBC,
    own_processes: Sequence[str] = OWN_PROCESSES,
    run: Optional[Runner] = None,
    flavour: Optional[str] = None,
    env: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Read the machine under ``root`` and return the ``llmfleet_host`` fact.

    ``own_processes`` are the process names (/proc/<pid>/comm) of llmfleet's own servers whose
    resident memory counts as usable (``memory.reclaimable_mib``). ``run`` runs the device tools
    (devices.COMMANDS: the installed build's ``llama-server --list-devices``, nvidia-smi,
    vulkaninfo); by default a recorded tree's ``recorded/`` outputs are read, and on the live root
    nothing runs. ``flavour``: the llama.cpp flavour the host will install when the inventory
    chooses it (``llama_cpp_flavour``), else the verdict's: the devices are predicted for it until
    a build is installed. ``env``: the environment the servers run with (GGML_VK_VISIBLE_DEVICES).
    """
    tree = Tree(root)

    processors, extra = parse_cpuinfo(tree.read("proc/cpuinfo") or "", tree.show("proc/cpuinfo"))
    arch_text = tree.read("proc/sys/kernel/arch", required=False)
    if arch_text and arch_text.strip():
        kernel_arch = arch_text.strip()
    elif tree.root == "/":
        kernel_arch = os.uname().machine
    else:
        kernel_arch = arch_from_cpuinfo(processors, tree.show("proc/cpuinfo"))

    libc = find_libc(tree, kernel_arch)
    arch = libc["userland_arch"]
    flags: Optional[set] = None
    for proc in processors:
        words = set((proc.get("flags") or proc.get("Features") or "").split())
        flags = words if flags is None else flags & words
    isa = normalise_isa(arch, flags or set())

    # CPUs: online, narrowed by the affinity mask and the cgroup CPU quota.
    online_text = tree.read("sys/devices/system/cpu/online", required=False)
    online = (
        parse_cpulist(online_text, tree.show("sys/devices/system/cpu/online"))
        if online_text is not None
        else list(range(len(processors)))
    )
    usable_cpus = list(online)
    status_text = tree.read("proc/self/status", required=False)
    if status_text is not None:
        status = parse_key_value(status_text, tree.show("proc/self/status"))
        if "Cpus_allowed_list" in status:
            allowed = parse_cpulist(status["Cpus_allowed_list"], tree.show("proc/self/status"))
            usable_cpus = [c for c in allowed if c in online] or allowed
    cgroup_text = tree.read("proc/self/cgroup", required=False)
    mount_text = tree.read("proc/self/mountinfo", required=False)
    entries = parse_proc_cgroup(cgroup_text, tree.show("proc/self/cgroup")) if cgroup_text else []
    mounts = parse_mountinfo(mount_text, tree.show("proc/self/mountinfo")) if mount_text else []
    cpu_version, cpu_dirs = cgroup_chain(tree, entries, mounts, "cpu")
    quota = cgroup_cpu_quota(tree, cpu_version, cpu_dirs)
    cpus = len(usable_cpus)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota - 1e-9)))
    cpus = max(cpus, 1)

    nodes_text = tree.read("sys/devices/system/node/online", required=False)
    numa_nodes = (
        len(parse_cpulist(nodes_text, tree.show("sys/devices/system/node/online"))) if nodes_text else 1
    )

    # Memory: MemAvailable and the binding cgroup limit.
    meminfo = parse_meminfo(tree.read("proc/meminfo") or "", tree.show("proc/meminfo"))
    if "MemAvailable" not in meminfo:
        raise HostInfoError(
            "cannot parse %s: no MemAvailable line (kernel < 3.14)" % tree.show("proc/meminfo")
        )
    mem_version, mem_dirs = cgroup_chain(tree, entries, mounts, "memory")
    cgroup = cgroup_memory(tree, mem_version, mem_dirs)
    resident, resident_file, own = own_processes_rss(tree, own_processes)
    memory = usable_memory(meminfo["MemTotal"], meminfo["MemAvailable"], cgroup, resident, resident_file)
    memory["own_processes"] = own

    accelerators = pci_accelerators(tree)

    os_text = tree.read("etc/os-release", required=False)
    os_name = "etc/os-release"
    if os_text is None:
        os_text = tree.read("usr/lib/os-release", required=False)
        os_name = "usr/lib/os-release"
    os_release = parse_os_release(os_text, tree.show(os_name)) if os_text is not None else {}

    hostname = (tree.read("proc/sys/kernel/hostname", required=False) or "").strip()
    if not hostname:
        hostname = (tree.read("etc/hostname", required=False) or "").strip()
    trie = tree.read("proc/net/fib_trie", required=False)
    route_text = tree.read("proc/net/route", required=False)
    addresses, default_ipv4 = interface_addresses(
        parse_fib_trie(trie) if trie else [],
        parse_route(route_text, tree.show("proc/net/route")) if route_text else [],
        live_interface_of() if tree.root == "/" else None,
    )

    machine = (tree.read("sys/firmware/devicetree/base/model", required=False) or "").strip("\x00\n ")
    if not machine:
        machine = (
            extra.get("Model", "")
            or (tree.read("sys/class/dmi/id/product_name", required=False) or "").strip()
        )

    fact: Dict[str, Any] = {
        "hostname": hostname or None,
        "addresses": addresses,
        "default_ipv4": default_ipv4,
        "arch": arch,
        "kernel_arch": kernel_arch,
        "kube_arch": KUBE_ARCH.get(arch, arch),
        "machine": machine or None,
        "cpu_model": cpu_model(processors, extra),
        "cpu_bogomips": cpu_bogomips(processors, tree.show("proc/cpuinfo")),
        "isa": isa,
        "cpus": cpus,
        "cpus_online": len(online),
        "cpu_quota": None if quota is None else round(quota, 3),
        "numa_nodes": max(numa_nodes, 1),
        "memory": memory,
        "accelerators": accelerators,
        "libc": libc["libc"],
        "glibc": libc["glibc"],
        "os": {
            "id": os_release.get("ID"),
            "version": os_release.get("VERSION_ID"),
            "name": os_release.get("PRETTY_NAME"),
        },
        "disk_path": disk_path,
        "disk_free_mib": disk_free_mib(tree, disk_path),
    }
    fact["backends"] = {
        "llama_cpp": llama_cpp_verdict(
            arch, libc["libc"], libc["glibc"], accelerators, min_glibc, kernel_arch
        ),
        "vllm_cpu": vllm_cpu_verdict(arch, isa),
    }
    if run is None:
        run = recorded_runner(tree) if tree.root != "/" else (lambda key: (None, None))
    try:
        fact["devices"], fact["devices_source"] = probe_devices(
            run,
            tree,
            accelerators,
            flavour or fact["backends"]["llama_cpp"].get("flavour"),
            fact["cpu_model"],
            memory,
            env,
        )
    except DeviceError as err:
        raise HostInfoError(str(err)) from None
    return fact


# --------------------------------------------------------------------------------------------
# Inventory-given facts (what-if planning) and the one-line summary
# --------------------------------------------------------------------------------------------

REQUIRED_GIVEN = (
    ("arch", str),
    ("cpus", int),
    ("memory.usable_mib", int),
    ("backends.llama_cpp.status", str),
    ("backends.vllm_cpu.status", str),
)


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            raise KeyError(dotted)
        data = data[part]
    return data


def check_given(fact: Any) -> List[str]:
    """Problems with an inventory-supplied ``llmfleet_host`` (empty when it has the probe's shape)."""
    if not isinstance(fact, dict):
        return ["llmfleet_host must be a mapping, got %s" % type(fact).__name__]
    problems = []
    for key, kind in REQUIRED_GIVEN:
        try:
            value = _lookup(fact, key)
        except KeyError:
            problems.append("llmfleet_host.%s is missing" % key)
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            problems.append("llmfleet_host.%s must be %s, got %r" % (key, kind.__name__, value))
    if "isa" in fact and not (isinstance(fact["isa"], list) and all(isinstance(i, str) for i in fact["isa"])):
        problems.append("llmfleet_host.isa must be a list of feature names, got %r" % (fact["isa"],))
    statuses = {
        "backends.llama_cpp.status": ("release", "source", "unsupported"),
        "backends.vllm_cpu.status": ("supported", "limited", "unsupported"),
    }
    for key, allowed in statuses.items():
        try:
            value = _lookup(fact, key)
        except KeyError:
            continue
        if isinstance(value, str) and value not in allowed:
            problems.append("llmfleet_host.%s is %r, expected one of %s" % (key, value, ", ".join(allowed)))
    if "devices" in fact:
        memory = fact.get("memory") if isinstance(fact.get("memory"), dict) else {}
        problems.extend(device_problems(fact["devices"], memory.get("usable_mib")))
    return problems


def runnable_backends(fact: Dict[str, Any]) -> List[str]:
    """Backends whose verdict is not ``unsupported``."""
    backends = fact.get("backends") or {}
    return [
        name
        for name in ("llama_cpp", "vllm_cpu")
        if (backends.get(name) or {}).get("status") not in (None, "unsupported")
    ]


def summary(fact: Dict[str, Any]) -> str:
    """One line: arch, cpus, usable memory (and its cause), ISA, accelerators, the devices (when
    there is more than the CPU), backend verdicts."""
    memory = fact.get("memory") or {}
    usable = memory.get("usable_mib")
    limit = memory.get("cgroup_limit_mib")
    if limit is not None and usable is not None and usable == memory.get("available_mib"):
        cause = "MemAvailable of %s, cgroup %s" % (memory.get("total_mib"), limit)
    elif limit is not None:
        cause = "cgroup %s" % limit
    elif memory.get("available_mib") is not None:
        cause = "MemAvailable of %s" % memory.get("total_mib")
    else:
        cause = "given"
    parts = [
        str(fact.get("arch")),
        "%s cpus" % fact.get("cpus"),
        "usable %s MiB (%s)" % (usable, cause),
        "isa %s" % (",".join(fact.get("isa") or []) or "-"),
    ]
    for gpu in fact.get("accelerators") or []:
        mem = " %s MiB" % gpu["memory_mib"] if gpu.get("memory_mib") else ""
        parts.append("gpu %s%s" % (gpu.get("model"), mem))
    devices = fact.get("devices")
    if isinstance(devices, list) and len(devices) > 1 and not device_problems(devices):
        parts.append("devices %s" % devices_summary(devices))
    backends = fact.get("backends") or {}
    llama = backends.get("llama_cpp") or {}
    vllm = backends.get("vllm_cpu") or {}
    llama_word = llama.get("flavour") if llama.get("status") in ("release", "source") else llama.get("status")
    parts.append("llama_cpp=%s" % llama_word)
    parts.append("vllm_cpu=%s" % vllm.get("status"))
    return "  ".join(parts)

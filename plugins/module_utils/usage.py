# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Resource usage of a host and of its systemd units, from cgroup and /proc counters.

Pure parsers over the text of kernel files plus a small reader that takes every path
relative to a ``root`` directory, so that tests replay trees recorded on real hosts.

What is measured (the method of the vLLM seed, generalised):

- CPU seconds of the whole host: the cgroup that holds PID 1 (a container's own cgroup,
  or the root cgroup of a bare host), from cgroup v1 ``cpuacct.usage`` (nanoseconds) or
  cgroup v2 ``cpu.stat`` ``usage_usec``; when neither file is readable, the busy time in
  ``/proc/stat``.
- CPU seconds and memory of one systemd unit: its own cgroup (v1 ``cpuacct.usage``,
  ``memory.usage_in_bytes`` / ``memory.max_usage_in_bytes``; v2 ``cpu.stat``,
  ``memory.current`` / ``memory.peak``). Where systemd could not create the unit's cgroup
  in a controller (a container whose v1 controllers are mounted read-only), the processes
  listed in the unit's cgroup are summed instead (``/proc/PID/stat`` utime + stime,
  ``/proc/PID/status`` VmRSS / VmHWM) and the result says so (``source: proc``).
- Network bytes: ``/proc/net/dev`` receive / transmit byte counters of the interfaces whose
  names match a regular expression (loopback never counts).

Runs on the managed hosts' Python (3.9+): no newer syntax.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

DEFAULT_INTERFACE_PATTERN = r"^(eth|ens|enp|eno|wl|veth).*"
NS_PER_S = 1_000_000_000
US_PER_S = 1_000_000


class UsageError(Exception):
    """A counter file that is missing or does not read as expected."""


# --------------------------------------------------------------------------- parsers


def _int_text(text: str, what: str) -> int:
    value = text.strip()
    try:
        return int(value)
    except ValueError:
        raise UsageError("%s: expected an integer, read %r" % (what, value[:60])) from None


def cpu_seconds_v1(cpuacct_usage: str) -> float:
    """CPU seconds from a cgroup v1 ``cpuacct.usage`` (total nanoseconds)."""
    return _int_text(cpuacct_usage, "cpuacct.usage") / NS_PER_S


def parse_flat_keyed(text: str, what: str) -> Dict[str, int]:
    """Parse a cgroup 'flat keyed' file (``key value`` per line), as ``cpu.stat``."""
    result = {}  # type: Dict[str, int]
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise UsageError("%s line %d: expected 'key value', read %r" % (what, number, line))
        result[fields[0]] = _int_text(fields[1], "%s line %d" % (what, number))
    return result


def cpu_seconds_v2(cpu_stat: str) -> float:
    """CPU seconds from a cgroup v2 ``cpu.stat`` (``usage_usec``)."""
    stat = parse_flat_keyed(cpu_stat, "cpu.stat")
    if "usage_usec" not in stat:
        raise UsageError("cpu.stat: no usage_usec line")
    return stat["usage_usec"] / US_PER_S


def proc_stat_busy_seconds(proc_stat: str, clk_tck: int) -> float:
    """Busy CPU seconds of the whole machine from ``/proc/stat`` (all but idle and iowait)."""
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [_int_text(f, "/proc/stat cpu") for f in fields[1:]]
            # user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
            busy = sum(ticks[:8]) - sum(ticks[3:5])
            return busy / float(clk_tck)
    raise UsageError("/proc/stat: no 'cpu' line")


def proc_pid_cpu_seconds(pid_stat: str, clk_tck: int) -> float:
    """CPU seconds (utime + stime) of one process from ``/proc/PID/stat``."""
    # The command name (field 2) is in parentheses and may contain spaces and ')'.
    end = pid_stat.rfind(")")
    if end < 0:
        raise UsageError("/proc/PID/stat: no ')' after the command name")
    fields = pid_stat[end + 1 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    if len(fields) < 13:
        raise UsageError("/proc/PID/stat: %d fields after the command name, need 13" % len(fields))
    return (_int_text(fields[11], "utime") + _int_text(fields[12], "stime")) / float(clk_tck)


def proc_pid_memory(pid_status: str) -> Tuple[int, int]:
    """(resident bytes, peak resident bytes) of one process from ``/proc/PID/status``."""
    values = {}  # type: Dict[str, int]
    for line in pid_status.splitlines():
        key, _unused, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            number = rest.split()
            if len(number) != 2 or number[1] != "kB":
                raise UsageError("/proc/PID/status: %s is not 'N kB': %r" % (key, rest.strip()))
            values[key] = _int_text(number[0], key) * 1024
    # Kernel threads have neither line; they hold no user memory.
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def parse_net_dev(text: str, pattern: str = DEFAULT_INTERFACE_PATTERN) -> Dict[str, Dict[str, int]]:
    """Receive / transmit byte counters of the interfaces whose name matches ``pattern``.

    ``lo`` is never included, whatever the pattern says.
    """
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise UsageError("interface pattern %r is not a regular expression: %s" % (pattern, exc)) from exc
    result = {}  # type: Dict[str, Dict[str, int]]
    for number, line in enumerate(text.splitlines(), 1):
        if ":" not in line or "|" in line:
            continue  # the two header lines
        name, _unused, counters = line.partition(":")
        name = name.strip()
        if name == "lo" or not regex.search(name):
            continue
        fields = counters.split()
        if len(fields) < 16:
            raise UsageError("/proc/net/dev line %d (%s): %d counters, need 16" % (number, name, len(fields)))
        result[name] = {
            "rx_bytes": _int_text(fields[0], "rx bytes of " + name),
            "tx_bytes": _int_text(fields[8], "tx bytes of " + name),
        }
    return result


def parse_mountinfo(text: str) -> List[Dict[str, object]]:
    """The cgroup mounts of ``/proc/PID/mountinfo``, later mounts last.

    Each entry: ``version`` (1 or 2), ``root`` (the cgroup path mounted), ``mountpoint`` and
    ``controllers`` (v1: the comma-separated super options naming controllers, with
    ``name=systemd`` for the named hierarchy; v2: empty).
    """
    mounts = []  # type: List[Dict[str, object]]
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        pre, sep, post = line.partition(" - ")
        if not sep:
            raise UsageError("mountinfo line %d: no ' - ' separator" % number)
        pre_fields = pre.split()
        post_fields = post.split()
        if len(pre_fields) < 5 or len(post_fields) < 2:
            raise UsageError("mountinfo line %d: too few fields" % number)
        fstype = post_fields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        # v1 super options name the controllers (cpu, cpuacct, memory, name=systemd, ...).
        options = post_fields[2].split(",") if len(post_fields) > 2 else []
        controllers = [o for o in options if o not in ("rw", "ro")]
        mounts.append(
            {
                "version": 2 if fstype == "cgroup2" else 1,
                "root": _unescape(pre_fields[3]),
                "mountpoint": _unescape(pre_fields[4]),
                "controllers": controllers if fstype == "cgroup" else [],
            }
        )
    # A later mount on the same mountpoint hides the earlier one.
    visible = {}  # type: Dict[str, Dict[str, object]]
    for mount in mounts:
        visible.pop(str(mount["mountpoint"]), None)
        visible[str(mount["mountpoint"])] = mount
    return list(visible.values())


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_proc_cgroup(text: str) -> Dict[str, str]:
    """Map hierarchy key to cgroup path from ``/proc/PID/cgroup``.

    Keys: each v1 controller (``cpuacct``, ``memory``, ``name=systemd``, ...) and ``""`` for
    the v2 unified hierarchy.
    """
    result = {}  # type: Dict[str, str]
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise UsageError("/proc/PID/cgroup line %d: expected 'id:controllers:path'" % number)
        _unused, controllers, path = parts
        if controllers == "":
            result[""] = path
        for controller in controllers.split(","):
            if controller:
                result[controller] = path
    return result


def system_base(path: str) -> str:
    """The cgroup that holds the whole (container) system, from PID 1's cgroup path."""
    if path.rstrip("/").endswith("/init.scope"):
        return path.rstrip("/")[: -len("/init.scope")] or "/"
    return path or "/"


def resolve_cgroup_dir(mounts: Sequence[Mapping[str, object]], key: str, path: str) -> Optional[str]:
    """Directory (absolute, as seen by the host) of cgroup ``path`` in hierarchy ``key``.

    ``key`` is a v1 controller (``cpuacct``, ``memory``, ``name=systemd``) or ``""`` for v2.
    None when no visible mount of that hierarchy contains ``path``.
    """
    best = None  # type: Optional[Tuple[int, str]]
    for mount in mounts:
        if key == "":
            if mount["version"] != 2:
                continue
        elif mount["version"] != 1 or key not in list(mount["controllers"]):  # type: ignore[call-overload]
            continue
        root = str(mount["root"]).rstrip("/")
        if path != root and not path.startswith(root + "/"):
            continue
        rel = path[len(root) :].lstrip("/")
        candidate = os.path.join(str(mount["mountpoint"]), rel) if rel else str(mount["mountpoint"])
        if best is None or len(root) > best[0]:
            best = (len(root), candidate)
    return best[1] if best else None


# --------------------------------------------------------------------------- arithmetic


def delta(before: Mapping[str, object], after: Mapping[str, object]) -> Dict[str, object]:
    """Difference of two samples of :func:`sample` (after - before).

    Returns ``seconds`` (wall time), ``cpu_seconds`` of the host, ``rx_bytes`` / ``tx_bytes``
    summed over the interfaces present in both samples, ``interfaces`` per interface, and
    ``units`` with ``cpu_seconds`` per unit present in both. A counter that went backwards
    (a restarted unit, a recreated interface) raises :class:`UsageError`.
    """
    result = {
        "seconds": round(_num(after, "time") - _num(before, "time"), 3),
        "cpu_seconds": _non_negative(_num(after, "cpu_seconds") - _num(before, "cpu_seconds"), "host CPU"),
    }  # type: Dict[str, object]
    interfaces = {}  # type: Dict[str, Dict[str, int]]
    before_if = before.get("interfaces") or {}
    after_if = after.get("interfaces") or {}
    for name in sorted(set(before_if) & set(after_if)):  # type: ignore[arg-type]
        entry = {}
        for counter in ("rx_bytes", "tx_bytes"):
            entry[counter] = int(
                _non_negative(after_if[name][counter] - before_if[name][counter], "%s %s" % (name, counter))  # type: ignore[index]
            )
        interfaces[name] = entry
    result["interfaces"] = interfaces
    result["rx_bytes"] = sum(e["rx_bytes"] for e in interfaces.values())
    result["tx_bytes"] = sum(e["tx_bytes"] for e in interfaces.values())
    units = {}  # type: Dict[str, Dict[str, object]]
    before_units = before.get("units") or {}
    after_units = after.get("units") or {}
    for name in sorted(set(before_units) & set(after_units)):  # type: ignore[arg-type]
        b, a = before_units[name], after_units[name]  # type: ignore[index]
        if not a.get("active") or not b.get("active"):
            continue
        units[name] = {
            "cpu_seconds": _non_negative(a["cpu_seconds"] - b["cpu_seconds"], "unit %s CPU" % name),
        }
    result["units"] = units
    return result


def _num(sample: Mapping[str, object], key: str) -> float:
    value = sample.get(key)
    if not isinstance(value, (int, float)):
        raise UsageError("sample has no number %r" % key)
    return float(value)


def _non_negative(value: float, what: str) -> float:
    if value < -1e-9:
        raise UsageError("%s counter went backwards by %s: restarted between the samples?" % (what, -value))
    return round(max(value, 0.0), 6)


# --------------------------------------------------------------------------- reading a tree


class Tree:
    """Read kernel files below ``root`` (``/`` on a live host, a recorded tree in tests)."""

    def __init__(self, root: str = "/"):
        self.root = root

    def path(self, absolute: str) -> str:
        return os.path.join(self.root, absolute.lstrip("/"))

    def read(self, absolute: str) -> str:
        try:
            with open(self.path(absolute), encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError as exc:
            raise UsageError("cannot read %s: %s" % (self.path(absolute), exc.strerror or exc)) from exc

    def read_optional(self, absolute: str) -> Optional[str]:
        try:
            return self.read(absolute)
        except UsageError:
            return None

    def isdir(self, absolute: str) -> bool:
        return os.path.isdir(self.path(absolute))

    def subdirs(self, absolute: str) -> List[str]:
        try:
            names = sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []
        return [
            os.path.join(absolute, n) for n in names if os.path.isdir(self.path(os.path.join(absolute, n)))
        ]


class Hierarchy:
    """The cgroup layout seen by PID 1 of a host."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.mounts = parse_mountinfo(tree.read("/proc/1/mountinfo"))
        self.paths = parse_proc_cgroup(tree.read("/proc/1/cgroup"))
        self.v1 = any(m["version"] == 1 and "cpuacct" in list(m["controllers"]) for m in self.mounts)  # type: ignore[call-overload]

    def dir(self, key: str, path: str) -> Optional[str]:
        return resolve_cgroup_dir(self.mounts, key, path)

    def base(self, key: str) -> str:
        return system_base(self.paths.get(key, self.paths.get("", "/")))

    def unit_path(self, unit: str) -> Tuple[str, str]:
        """(hierarchy key, cgroup path) of a system unit in the hierarchy systemd manages."""
        key = "name=systemd" if "name=systemd" in self.paths else ""
        base = self.base(key).rstrip("/")
        return key, base + "/system.slice/" + unit


def _cpu_of_dir(tree: Tree, hierarchy: Hierarchy, cgroup_path: str, v1_key: str) -> Optional[float]:
    """CPU seconds of one cgroup, from v1 cpuacct or v2 cpu.stat; None when not accounted."""
    directory = hierarchy.dir(v1_key, cgroup_path)
    if directory is not None:
        text = tree.read_optional(directory + "/cpuacct.usage")
        if text is not None:
            return cpu_seconds_v1(text)
    directory = hierarchy.dir("", cgroup_path)
    if directory is not None:
        text = tree.read_optional(directory + "/cpu.stat")
        if text is not None and "usage_usec" in text:
            return cpu_seconds_v2(text)
    return None


# (hierarchy key, current file, peak file): cgroup v1 memory controller, then v2.
_MEMORY_FILES = (
    ("memory", "memory.usage_in_bytes", "memory.max_usage_in_bytes"),
    ("", "memory.current", "memory.peak"),
)


def _memory_of_dir(tree: Tree, hierarchy: Hierarchy, cgroup_path: str) -> Optional[Tuple[int, Optional[int]]]:
    for key, current_file, peak_file in _MEMORY_FILES:
        directory = hierarchy.dir(key, cgroup_path)
        if directory is None:
            continue
        current = tree.read_optional(directory + "/" + current_file)
        if current is None:
            continue
        peak = tree.read_optional(directory + "/" + peak_file)
        return _int_text(current, current_file), (_int_text(peak, peak_file) if peak is not None else None)
    return None


def _unit_pids(tree: Tree, unit_dir: str) -> List[int]:
    pids = []  # type: List[int]
    stack = [unit_dir]
    while stack:
        directory = stack.pop()
        text = tree.read_optional(directory + "/cgroup.procs") or ""
        pids.extend(int(p) for p in text.split() if p.isdigit())
        stack.extend(tree.subdirs(directory))
    return sorted(set(pids))


def sample_unit(tree: Tree, hierarchy: Hierarchy, unit: str, clk_tck: int) -> Dict[str, object]:
    """CPU seconds and memory of one systemd unit (``active: false`` when it has no cgroup)."""
    key, path = hierarchy.unit_path(unit)
    unit_dir = hierarchy.dir(key, path)
    if unit_dir is None or not tree.isdir(unit_dir):
        return {"active": False, "cgroup": path}
    pids = _unit_pids(tree, unit_dir)
    if not pids:
        return {"active": False, "cgroup": path}
    result = {"active": True, "cgroup": path, "pids": pids}  # type: Dict[str, object]
    cpu = _cpu_of_dir(tree, hierarchy, path, "cpuacct")
    memory = _memory_of_dir(tree, hierarchy, path)
    per_proc = None  # type: Optional[Tuple[float, int, int]]
    if cpu is None or memory is None:
        per_proc = _sum_processes(tree, pids, clk_tck)
    if cpu is None:
        result["cpu_seconds"] = round(per_proc[0], 6)  # type: ignore[index]
        result["cpu_source"] = "proc"
    else:
        result["cpu_seconds"] = round(cpu, 6)
        result["cpu_source"] = "cgroup"
    if memory is None:
        result["memory_bytes"] = per_proc[1]  # type: ignore[index]
        result["memory_peak_bytes"] = per_proc[2]  # type: ignore[index]
        result["memory_source"] = "proc"
    else:
        result["memory_bytes"] = memory[0]
        result["memory_peak_bytes"] = memory[1]
        result["memory_source"] = "cgroup"
    return result


def _sum_processes(tree: Tree, pids: Iterable[int], clk_tck: int) -> Tuple[float, int, int]:
    cpu, rss, hwm = 0.0, 0, 0
    for pid in pids:
        stat = tree.read_optional("/proc/%d/stat" % pid)
        status = tree.read_optional("/proc/%d/status" % pid)
        if stat is None or status is None:
            continue  # exited between listing and reading
        cpu += proc_pid_cpu_seconds(stat, clk_tck)
        one_rss, one_hwm = proc_pid_memory(status)
        rss += one_rss
        hwm += one_hwm
    return cpu, rss, hwm


def sample(
    root: str = "/",
    units: Sequence[str] = (),
    interface_pattern: str = DEFAULT_INTERFACE_PATTERN,
    clk_tck: int = 100,
    now: float = 0.0,
) -> Dict[str, object]:
    """One sample of the host: CPU seconds, interface bytes and the named units."""
    tree = Tree(root)
    hierarchy = Hierarchy(tree)
    base_key = "cpuacct" if hierarchy.v1 else ""
    cpu = _cpu_of_dir(tree, hierarchy, hierarchy.base(base_key), "cpuacct")
    if cpu is None:
        cpu = proc_stat_busy_seconds(tree.read("/proc/stat"), clk_tck)
        cpu_source = "proc"
    else:
        cpu_source = "cgroup"
    memory = _memory_of_dir(tree, hierarchy, hierarchy.base("memory" if hierarchy.v1 else ""))
    return {
        "time": now,
        "cgroup_version": 1 if hierarchy.v1 else 2,
        "cpu_seconds": round(cpu, 6),
        "cpu_source": cpu_source,
        "memory_bytes": memory[0] if memory else None,
        "interfaces": parse_net_dev(tree.read("/proc/net/dev"), interface_pattern),
        "units": {unit: sample_unit(tree, hierarchy, unit, clk_tck) for unit in units},
    }


# --------------------------------------------------------------------------- the verify table

MIB = 1024 * 1024


def holds_layers(plan_host: Mapping[str, object]) -> bool:
    """True when the plan gives this host repeating layers or the output layer."""
    layers = plan_host.get("layers") or [0, 0]
    try:
        first, last = int(layers[0]), int(layers[1])  # type: ignore[index]
    except (TypeError, ValueError, IndexError):
        raise UsageError(
            "plan host %s: layers %r is not [first, last]" % (plan_host.get("name"), layers)
        ) from None
    return last > first or bool(plan_host.get("output_layer"))


def _layers_text(plan_host: Mapping[str, object]) -> str:
    layers = plan_host.get("layers") or [0, 0]
    first, last = int(layers[0]), int(layers[1])  # type: ignore[index]
    text = "%d-%d" % (first, last - 1) if last > first else "-"
    if plan_host.get("output_layer"):
        text += "+out"
    return text


# llama.cpp's buffer report as llama-server logs it when it loads the model, e.g.
#   load_tensors:   RPC0[10.90.0.3:50052] model buffer size =    20.31 MiB
#   llama_kv_cache:        CPU KV buffer size =    24.00 MiB
#   llama_context:   RPC0[10.90.0.3:50052] compute buffer size =    12.88 MiB
# (a worker's buffers are named by its --rpc endpoint; the head's are CPU, CPU_Mapped, ...).
BUFFER_LINE = re.compile(
    r"(?:load_tensors|llama_kv_cache\w*|llama_context|sched_reserve):\s+(\S+)\s+"
    r"(model|KV|compute|output) buffer size\s*=\s*([0-9.]+) MiB"
)
RPC_BUFFER_NAME = re.compile(r"^RPC\d+\[([^\]]+)\]")
BUFFER_KINDS = ("model", "KV", "compute", "output")


def parse_buffer_report(log_text: str) -> Dict[str, Dict[str, float]]:
    """Buffer name -> kind -> MiB of the last model load in llama-server's log.

    A load logs its model buffers, then KV and compute: a model buffer after a KV or compute
    one starts a newer load (the supervisor restarts llama-server on another placement), and
    only the last one is kept.
    """
    loads = []  # type: List[Dict[str, Dict[str, float]]]
    after_model = True
    for line in log_text.splitlines():
        found = BUFFER_LINE.search(line)
        if not found:
            continue
        name, kind, mib = found.group(1), found.group(2), float(found.group(3))
        if not loads or (kind == "model" and not after_model):
            loads.append({})
        after_model = kind == "model"
        per_kind = loads[-1].setdefault(name, {})
        per_kind[kind] = round(per_kind.get(kind, 0.0) + mib, 2)
    return loads[-1] if loads else {}


def buffers_of_host(
    buffers: Mapping[str, Mapping[str, float]], plan_host: Mapping[str, object]
) -> Dict[str, float]:
    """The MiB per kind the head's log shows on this plan host: a worker's RPC buffers named by
    its endpoint, the head's own (every buffer that is not an RPC one)."""
    endpoint = plan_host.get("endpoint")
    total = {}  # type: Dict[str, float]
    for name, kinds in buffers.items():
        rpc = RPC_BUFFER_NAME.match(name)
        if plan_host.get("role") == "head":
            mine = rpc is None
        else:
            mine = rpc is not None and bool(endpoint) and rpc.group(1) == str(endpoint)
        if mine:
            for kind, mib in kinds.items():
                total[kind] = round(total.get(kind, 0.0) + mib, 2)
    return total


def _buffers_text(buffers: Mapping[str, float]) -> str:
    if not buffers:
        return "-"
    return "/".join("%.1f" % buffers.get(kind, 0.0) for kind in ("model", "KV", "compute"))


# The goal a device's prediction must meet against llama.cpp's report (issue #32, the same goal as
# bench/planner_accuracy.py's): never below the report by more than 5 %, never above it by more
# than 15 % + 16 MiB (reported x 0.95 <= predicted <= reported x 1.15 + 16).
DEVICE_BAND_LOW = 0.05
DEVICE_BAND_HIGH = 0.15
DEVICE_BAND_SLACK_MIB = 16.0


def device_buffers(
    plan: Mapping[str, object], buffers: Mapping[str, Mapping[str, float]]
) -> Tuple[List[Dict[str, object]], List[str]]:
    """Each planned device's buffers from the head's report against the plan's prediction.

    A device is found by its ``report_name`` (plan.json version 2): ``CPU`` and ``Vulkan0`` on the
    head, ``RPC<i>[<endpoint>]`` for a worker's. The head's host-side buffers that no device of
    the plan is named after (``CPU_Mapped``, ``CPU_REPACK``, ``Vulkan_Host``, ``CUDA_Host``: the
    weights llama.cpp keeps in the head's RAM, its pinned staging memory) are the head's CPU's;
    an RPC buffer of no planned device is a failure. Reported MiB: model + KV + compute + output
    (the logits buffer, on the head's CPU). A device whose weights are mmapped (``CPU_Mapped``:
    llama.cpp reports the file range it maps, not memory) is checked on KV + compute + output
    against the predicted KV + compute, its weights shown, not compared. Without a buffer report
    (no log read) or without devices in the plan (version 1), nothing is checked.
    """
    hosts = plan.get("hosts")
    if not buffers or not isinstance(hosts, list):
        return [], []
    devices = []  # type: List[Tuple[str, Mapping[str, object]]]
    for h in hosts:
        for d in (h.get("devices") or []) if isinstance(h, Mapping) else []:
            if isinstance(d, Mapping):
                devices.append((str(h.get("name")), d))
    if not devices:
        return [], []
    named = {str(d.get("report_name") or d.get("name")): i for i, (_host, d) in enumerate(devices)}
    head_cpu = next(
        (
            named[str(d.get("report_name") or d.get("name"))]
            for host, d in devices
            if host == str(plan.get("head")) and d.get("backend", "cpu") == "cpu"
        ),
        None,
    )
    reported = {}  # type: Dict[int, Dict[str, float]]
    failures = []  # type: List[str]
    for name, kinds in buffers.items():
        if name in named:
            index = named[name]  # type: Optional[int]
        elif RPC_BUFFER_NAME.match(name):
            failures.append(
                "%s: buffers on a device the plan does not have (%s MiB)" % (name, _kinds_text(kinds))
            )
            continue
        else:
            index = head_cpu
        if index is None:
            failures.append("%s: a head buffer but the plan's head has no CPU device" % name)
            continue
        total = reported.setdefault(index, {})
        for kind, mib in kinds.items():
            key = "mapped" if kind == "model" and name.endswith("_Mapped") else kind
            total[key] = round(total.get(key, 0.0) + float(mib), 2)
    rows = []  # type: List[Dict[str, object]]
    for i, (host, d) in enumerate(devices):
        predicted = d.get("predicted_mib") or {}
        planned = float(predicted.get("total") or 0.0) if isinstance(predicted, Mapping) else 0.0
        got = reported.get(i)
        mapped = None  # type: Optional[float]
        by_kind = isinstance(predicted, Mapping) and ("kv" in predicted or "compute" in predicted)
        if got and "mapped" in got and not by_kind:
            got = dict(got)
            got["model"] = round(got.get("model", 0.0) + got.pop("mapped"), 2)
        if got and "mapped" in got:
            # mmapped weights: llama.cpp reports the file range it maps (from the first to the last
            # tensor it keeps), not memory, and copies out of it (CPU_REPACK) are weights too: the
            # weights are not compared, the rest (KV, compute, output) against KV + compute.
            got = dict(got)
            mapped = got.pop("mapped")
            got.pop("model", None)
            if isinstance(predicted, Mapping):
                planned = float(predicted.get("kv") or 0.0) + float(predicted.get("compute") or 0.0)
        layers = d.get("layers") or [0, 0]
        has_layers = isinstance(layers, (list, tuple)) and len(layers) == 2 and layers[1] > layers[0]
        total = round(sum(got.values()), 2) if got else None
        low = (total or 0.0) * (1 - DEVICE_BAND_LOW)
        high = (total or 0.0) * (1 + DEVICE_BAND_HIGH) + DEVICE_BAND_SLACK_MIB
        row = {
            "host": host,
            "device": str(d.get("name")),
            "report_name": str(d.get("report_name") or d.get("name")),
            "layers": list(layers) if isinstance(layers, (list, tuple)) else layers,
            "reported_mib": dict(got) if got else {},
            "reported_total_mib": total,
            "predicted_mib": planned,
            "goal_mib": [round(low, 2), round(high, 2)],
            "mapped_mib": mapped,
            "ok": total is not None and low <= planned <= high,
        }  # type: Dict[str, object]
        if total is None:
            if has_layers or planned > DEVICE_BAND_SLACK_MIB:
                failures.append(
                    "%s device %s (%s): no buffers in llama-server's report, the plan predicts %.1f MiB"
                    % (host, row["device"], row["report_name"], planned)
                )
            else:
                row["ok"] = True  # nothing planned, nothing reported
        elif not row["ok"]:
            failures.append(
                "%s device %s (%s): llama.cpp reports %.1f MiB (%s), the plan predicts %.1f MiB: "
                "outside the goal [%.1f, %.1f] (95 %% of the report to 115 %% + 16 MiB)"
                % (host, row["device"], row["report_name"], total, _kinds_text(got or {}), planned, low, high)
            )
        rows.append(row)
    return rows, failures


def _kinds_text(kinds: Mapping[str, float]) -> str:
    return " + ".join("%s %.2f" % (k, float(v)) for k, v in sorted(kinds.items()) if float(v)) or "0"


def render_device_table(rows: Sequence[Mapping[str, object]]) -> str:
    """The per-device table: llama.cpp's buffer report against the plan's prediction."""
    header = ("host", "device", "report name", "layers", "reported MiB", "predicted MiB", "goal MiB", "ok")
    lines = [header]
    for row in rows:
        layers = row.get("layers") or [0, 0]
        band = row.get("goal_mib") or [0, 0]
        lines.append(
            (
                str(row["host"]),
                str(row["device"]),
                str(row["report_name"]),
                "%s-%s" % (layers[0], layers[1] - 1) if layers[1] > layers[0] else "-",  # type: ignore[index,operator]
                _fmt(row.get("reported_total_mib"), "%.1f")
                + ("" if row.get("mapped_mib") is None else " +%.1f mapped" % row["mapped_mib"]),  # type: ignore[operator]
                _fmt(row.get("predicted_mib"), "%.1f"),
                "%.1f-%.1f" % (band[0], band[1]),  # type: ignore[index]
                "yes" if row.get("ok") else "NO",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def report(
    plan: Mapping[str, object],
    samples: Mapping[str, Sequence[Mapping[str, object]]],
    units: Mapping[str, str],
    response: Optional[Mapping[str, object]] = None,
    elapsed: Optional[float] = None,
    min_cpu_seconds: float = 0.01,
    min_bytes: int = 1024,
    builds: Optional[Mapping[str, str]] = None,
    server_log: Optional[str] = None,
) -> Dict[str, object]:
    """The per-host verify table and the failures it shows.

    ``samples`` maps each host to three samples of :func:`sample`: before the idle window,
    after it (= before the request) and after the request. ``units`` maps a plan role
    (``head``, ``worker``) to the llama.cpp unit sampled on such hosts; hosts outside the plan
    were sampled for the worker unit. ``response`` is the JSON body of the chat completion and
    ``elapsed`` its wall time (for servers without ``timings``, as vLLM). A worker that holds layers fails when its unit was not
    running, used less than ``min_cpu_seconds`` of CPU during the request, or moved fewer than
    ``min_bytes`` more bytes (rx + tx) during the request than during the idle window.
    ``builds`` maps a host to its installed llama.cpp flavour and ``server_log`` is the head's
    llama-server log, whose buffer report (:func:`parse_buffer_report`) each row shows for its
    host; a sample's ``machine`` is the host's ``uname -m``.
    """
    plan_hosts = plan.get("hosts")
    if not isinstance(plan_hosts, list) or not plan_hosts:
        raise UsageError("the plan has no list 'hosts'")
    buffers = parse_buffer_report(server_log or "")
    by_name = {str(h.get("name")): h for h in plan_hosts}
    order = [str(h.get("name")) for h in plan_hosts] + sorted(set(samples) - set(by_name))
    rows = []  # type: List[Dict[str, object]]
    failures = []  # type: List[str]
    for name in order:
        plan_host = by_name.get(name, {"name": name, "role": "unused", "layers": [0, 0]})
        role = str(plan_host.get("role", "unused"))
        unit = units.get(role if role in units else "worker", "")
        row = {
            "host": name,
            "role": role,
            "layers": _layers_text(plan_host),
            "holds_layers": role != "unused" and holds_layers(plan_host),
            "unit": unit,
            "build": (builds or {}).get(name),
            "buffers_mib": buffers_of_host(buffers, plan_host) if role != "unused" else {},
        }  # type: Dict[str, object]
        predicted = plan_host.get("predicted_mib") or {}
        row["planned_mib"] = predicted.get("total") if isinstance(predicted, dict) else None
        host_samples = samples.get(name)
        if not host_samples or len(host_samples) != 3:
            row["sampled"] = False
            rows.append(row)
            if role != "unused":
                failures.append("%s: no usage samples (unreachable?)" % name)
            continue
        row["sampled"] = True
        row["machine"] = host_samples[2].get("machine")
        idle = delta(host_samples[0], host_samples[1])
        request = delta(host_samples[1], host_samples[2])
        row.update(
            {
                "idle_seconds": idle["seconds"],
                "request_seconds": request["seconds"],
                "host_cpu_idle": idle["cpu_seconds"],
                "host_cpu_request": request["cpu_seconds"],
                "rx_idle": idle["rx_bytes"],
                "tx_idle": idle["tx_bytes"],
                "rx_request": request["rx_bytes"],
                "tx_request": request["tx_bytes"],
                "interfaces": sorted(request["interfaces"]),  # type: ignore[arg-type]
            }
        )
        last_unit = (host_samples[2].get("units") or {}).get(unit) if unit else None  # type: ignore[union-attr]
        unit_idle = idle["units"].get(unit) if unit else None  # type: ignore[union-attr]
        unit_request = request["units"].get(unit) if unit else None  # type: ignore[union-attr]
        row["unit_active"] = bool(last_unit and last_unit.get("active"))
        row["unit_cpu_idle"] = unit_idle["cpu_seconds"] if unit_idle else None
        row["unit_cpu_request"] = unit_request["cpu_seconds"] if unit_request else None
        if row["unit_active"]:
            used = last_unit.get("memory_bytes")  # type: ignore[union-attr]
            peak = last_unit.get("memory_peak_bytes")  # type: ignore[union-attr]
            row["used_mib"] = round(used / MIB, 1) if isinstance(used, int) else None
            row["peak_mib"] = round(peak / MIB, 1) if isinstance(peak, int) else None
            row["memory_source"] = last_unit.get("memory_source")  # type: ignore[union-attr]
        else:
            row["used_mib"] = row["peak_mib"] = None
        planned = row["planned_mib"]
        worst = row["peak_mib"] if row["peak_mib"] is not None else row["used_mib"]
        row["used_vs_plan"] = (
            round(float(worst) / float(planned), 2)  # type: ignore[arg-type]
            if isinstance(worst, (int, float)) and isinstance(planned, (int, float)) and planned > 0
            else None
        )
        if role == "worker" and row["holds_layers"]:
            moved_idle = int(row["rx_idle"]) + int(row["tx_idle"])  # type: ignore[call-overload]
            moved = int(row["rx_request"]) + int(row["tx_request"])  # type: ignore[call-overload]
            if not row["unit_active"]:
                failures.append(
                    "%s: %s is not running but the plan gives it layers %s" % (name, unit, row["layers"])
                )
            elif (row["unit_cpu_request"] or 0.0) < min_cpu_seconds:
                failures.append(
                    "%s: %s used %.3f CPU seconds during the request (< %s): it did no work"
                    % (name, unit, row["unit_cpu_request"] or 0.0, min_cpu_seconds)
                )
            if moved - moved_idle < min_bytes:
                failures.append(
                    "%s: %d bytes moved during the request vs %d idle on %s: no traffic crossed to it"
                    % (name, moved, moved_idle, ",".join(row["interfaces"]) or "no matching interface")  # type: ignore[arg-type]
                )
        elif role == "head" and not row["unit_active"]:
            failures.append("%s: %s is not running on the head" % (name, unit))
        rows.append(row)
    device_rows, device_failures = device_buffers(plan, buffers)
    failures.extend(device_failures)
    result = {"rows": rows, "failures": failures, "devices": device_rows}  # type: Dict[str, object]
    result["tokens"] = tokens_from_response(response, elapsed)
    result["text"] = render_table(rows, result["tokens"])  # type: ignore[arg-type]
    if device_rows:
        result["text"] += "\n\nllama.cpp's buffers per device against the plan:\n" + render_device_table(
            device_rows
        )
    return result


def tokens_from_response(
    response: Optional[Mapping[str, object]], elapsed: Optional[float] = None
) -> Dict[str, object]:
    """Token counts and speeds of one chat completion.

    llama-server reports its own ``timings`` (prompt and generation measured separately); a
    server without them (vLLM) gives only ``usage``, so the generation speed is the completion
    tokens over the request's wall time (``source: wall``), prompt processing included.
    """
    if not response:
        return {}
    timings = response.get("timings")
    if isinstance(timings, dict) and timings:
        keys = (
            "prompt_n",
            "prompt_ms",
            "prompt_per_second",
            "predicted_n",
            "predicted_ms",
            "predicted_per_second",
        )
        result = {k: timings[k] for k in keys if isinstance(timings.get(k), (int, float))}  # type: Dict[str, object]
        result["source"] = "server"
        return result
    used = response.get("usage")
    if isinstance(used, dict) and isinstance(used.get("completion_tokens"), int):
        result = {
            "prompt_n": used.get("prompt_tokens"),
            "predicted_n": used["completion_tokens"],
            "source": "wall",
        }
        if elapsed and elapsed > 0:
            result["predicted_per_second"] = round(used["completion_tokens"] / float(elapsed), 2)
        return result
    return {}


def _fmt(value: object, pattern: str = "%.2f") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return pattern % value
    return str(value)


def _bytes(value: object) -> str:
    if not isinstance(value, int):
        return "-"
    for unit, size in (("MB", 1000000), ("kB", 1000)):
        if value >= size:
            return "%.1f %s" % (value / float(size), unit)
    return "%d B" % value


def render_table(rows: Sequence[Mapping[str, object]], tokens: Mapping[str, object]) -> str:
    """The table verify prints: one line per host, idle vs request."""
    header = (
        "host",
        "role",
        "layers",
        "cpu s idle",
        "cpu s req",
        "host cpu idle/req",
        "rx idle",
        "tx idle",
        "rx req",
        "tx req",
        "used MiB",
        "peak MiB",
        "plan MiB",
        "peak/plan",
        "arch",
        "build",
        "buffers MiB model/KV/compute",
    )
    lines = [header]
    for row in rows:
        described = (
            _fmt(row.get("machine")),
            _fmt(row.get("build")),
            _buffers_text(row.get("buffers_mib") or {}),  # type: ignore[arg-type]
        )
        if not row.get("sampled"):
            lines.append(
                (str(row["host"]), str(row["role"]), str(row["layers"]))
                + ("-",) * 9
                + (
                    _fmt(row.get("planned_mib"), "%.1f"),
                    "-",
                )
                + described
            )
            continue
        lines.append(
            (
                str(row["host"]),
                str(row["role"]),
                str(row["layers"]),
                _fmt(row.get("unit_cpu_idle")),
                _fmt(row.get("unit_cpu_request")),
                "%s/%s" % (_fmt(row.get("host_cpu_idle")), _fmt(row.get("host_cpu_request"))),
                _bytes(row.get("rx_idle")),
                _bytes(row.get("tx_idle")),
                _bytes(row.get("rx_request")),
                _bytes(row.get("tx_request")),
                _fmt(row.get("used_mib"), "%.1f"),
                _fmt(row.get("peak_mib"), "%.1f"),
                _fmt(row.get("planned_mib"), "%.1f"),
                _fmt(row.get("used_vs_plan")),
                *described,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in lines]
    first = next((r for r in rows if r.get("sampled")), None)
    if first is not None:
        out.append(
            "windows: idle %.1f s, request %.1f s; cpu s = the llama.cpp unit's CPU seconds"
            % (float(first["idle_seconds"]), float(first["request_seconds"]))  # type: ignore[arg-type]
        )
    if tokens:
        out.append(
            "%s: prompt %s tokens at %s tokens/s, generated %s tokens at %s tokens/s"
            % (
                "server timings" if tokens.get("source") == "server" else "wall clock (no server timings)",
                _fmt(tokens.get("prompt_n")),
                _fmt(tokens.get("prompt_per_second"), "%.1f"),
                _fmt(tokens.get("predicted_n")),
                _fmt(tokens.get("predicted_per_second"), "%.1f"),
            )
        )
    return "\n".join(out)

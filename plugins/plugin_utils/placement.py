# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The placement math: which hosts hold which layers, and the memory each host will use.

Pure, typed, stdlib only. Inputs are plain data: the model layout (``GgufLayout.to_dict()`` from
gguf_layout.py), the hosts (name, role, usable MiB, cpus, address, port) and the options
(context, parallel slots, cache types, reserve, output-layer policy). The result is the plan
(docs/plan-format.md) or a ``PlacementError`` carrying the table and the MiB missing per host.

The rule llama.cpp applies (src/llama-model.cpp, see docs/planner.md): n_layer + 1 slots (the
repeating layers, then the output layer); the first ``n_layer + 1 - ngl`` slots stay on the head's
CPU; slot ``il`` of the rest goes to the first RPC device whose cumulative float32 fraction of the
tensor split is greater than ``(il - cpu_slots) / ngl``. Token embeddings always stay on the head.

The memory model (calibrated against one llama.cpp commit) is memory_model.py's docstring.

Split by concern, each its own module (import a name from the module that defines it):
constants.py (limits and defaults), placement_hosts.py (the inputs), split_rule.py (llama.cpp's
rule), memory_model.py (the calibrated memory model), placement_search.py (the fewest hosts that
fit), placement_render.py (rows, table, llama-server's arguments, vLLM stages); this file keeps the
plan itself: keep-previous, the fallbacks and make_plan.
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import DeviceError, host_devices
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import calibration, targets
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import (
    DEFAULT_GPU_RESERVE_MIB,
    DEFAULT_RESERVE_MIB,
    DEFAULT_RPC_PORT,
    MIB,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import (
    device_placer_for,
    has_gpus,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import Placement, _pp_extra
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Host,
    Model,
    Options,
    PlacementError,
    hosts_from_dicts,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import (
    check_options,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import (
    plan_entry,
    render_device_table,
    render_table,
    vllm_partition,
    vllm_spread,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_search import place

__metaclass__ = type


# A placement strategy: (model, head, candidate workers, options) -> (placement, reasons, reasons
# per left-out worker). ``place`` (fewest hosts, memory) is the default; the speed objective
# passes its own (plugins/plugin_utils/speed_search.py). It raises PlacementError when nothing fits.
Placer = Callable[[Model, Host, List[Host], Options], Tuple[Placement, List[str], Dict[str, str]]]
# Extra plan fields computed from the chosen placement (the speed prediction; its ``warnings`` are
# added to the plan's).
Annotate = Callable[[Placement, Model, Options], Dict[str, Any]]

NOT_NEEDED = "not needed: the model fits on fewer hosts"
# plan.json's format (docs/plan-format.md): 2 lists each host's devices
PLAN_VERSION = 2


def uncalibrated_warnings(entry: Dict[str, Any]) -> List[str]:
    """One warning per host device whose backend's memory model is not measured on the pinned build."""
    out = []
    for row in entry.get("hosts") or []:
        for dev in row.get("devices") or []:
            if not dev.get("calibrated", True):
                out.append(
                    "%s %s: the %s memory model is not calibrated on the pinned llama.cpp build (compute"
                    " buffers guessed generously); check the load against the plan"
                    % (row["name"], dev["name"], dev["backend"])
                )
    return out


def memory_placer(
    model: Model, head: Host, workers: List[Host], opts: Options
) -> Tuple[Placement, List[str], Dict[str, str]]:
    placement, reasons = place(model, head, workers, opts)
    return placement, reasons, {}


def plan_llama_cpp(
    layout: Dict[str, Any],
    head: Dict[str, Any],
    workers: Sequence[Dict[str, Any]],
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = DEFAULT_RESERVE_MIB,
    fallbacks: bool = True,
    placer: Optional[Placer] = None,
    annotate: Optional[Annotate] = None,
) -> Dict[str, Any]:
    """The whole plan (docs/plan-format.md) minus the fields the role adds (model, target, backend).

    Raises PlacementError (with ``table`` and ``missing``) when nothing fits, ValueError on bad input.
    """
    opts = Options.from_dict(check_options(options))
    opts.check()
    model = Model.from_layout(layout)
    head_host, worker_hosts = hosts_from_dicts(head, workers, reserve_mib)
    warnings: List[str] = []
    devices_by_host = {str(h["name"]): h.get("devices") or [] for h in [head, *workers]}
    gpus = device_placer_for(head, workers)
    if gpus is not None:
        # some host offers a GPU: every device a slot (device_placement.py; for speed, device_speed.py)
        if placer is None:
            placer = gpus
        elif not getattr(placer, "over_devices", False):
            raise ValueError("this fleet has GPUs: its placement strategy must place devices, not hosts")
    placer = placer or memory_placer
    placement, reasons, left_out = placer(model, head_host, worker_hosts, opts)
    entry = plan_entry(placement, model, opts)
    used = {h.name for h in placement.workers}
    plan: Dict[str, Any] = {
        "version": PLAN_VERSION,
        "context": opts.context,
        "parallel": opts.parallel,
        "head": head_host.name,
        **entry,
        "unused": [
            {"name": h.name, "reason": left_out.get(h.name, NOT_NEEDED)}
            for h in worker_hosts
            if h.name not in used
        ],
        "vllm": vllm_spread(model, head_host, worker_hosts, opts)
        if opts.vllm_hosts == "all"
        else vllm_partition(placement, model, opts),
        "reasons": reasons,
        "table": render_table(entry["hosts"]),
    }
    if has_gpus(devices_by_host):
        plan["table"] += "\n\n" + render_device_table(entry["hosts"])
    if layout.get("weights_dtype_bytes"):
        # A Hugging Face checkpoint says its element width; the lws role scales to the served dtype.
        plan["vllm"]["weights_dtype_bytes"] = int(layout["weights_dtype_bytes"])
    if annotate is not None:
        extra = annotate(placement, model, opts)
        warnings += extra.pop("warnings", [])
        plan.update(extra)
    choice = calibration.for_build(opts.llama_cpp_build)
    plan["llama_cpp"] = choice.to_dict()
    plan["warnings"] = ([choice.warning] if choice.warning else []) + warnings + uncalibrated_warnings(entry)
    plan["fallbacks"] = fallback_plans(model, head_host, placement.workers, opts, placer) if fallbacks else []
    plan["planned_with"] = planned_with(
        head_host, worker_hosts, opts, reserve_mib, device_inputs(head, workers)
    )
    return plan


def device_inputs(head: Dict[str, Any], workers: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per host with GPUs, the device inputs a plan records (planned_with): each device's name,
    backend and total MiB, and the VRAM reserve. A CPU-only host records none (as before)."""
    out: Dict[str, Dict[str, Any]] = {}
    for h in [head, *workers]:
        devices = h.get("devices") or []
        if any(d.get("backend") != "cpu" for d in devices):
            out[str(h["name"])] = {
                "devices": [
                    "%s %s %s" % (d.get("name"), d.get("backend"), d.get("memory_total_mib")) for d in devices
                ],
                "gpu_reserve_mib": float(h.get("gpu_reserve_mib", DEFAULT_GPU_RESERVE_MIB)),
            }
    return out


def planned_with(
    head: Host,
    workers: Sequence[Host],
    opts: Options,
    reserve_mib: float,
    devices: Optional[Dict[str, Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """The inputs a plan was computed from, except the measurements (usable MiB).

    Recorded in the plan so that a later run can tell whether the same inputs would be planned
    again (``keep_previous``): the options, the default reserve and every candidate host with its
    address, port, cpus, reserve and speed (and, for a host with GPUs, its devices and VRAM reserve).
    """
    return {
        "options": dataclasses.asdict(opts),
        "reserve_mib": float(reserve_mib),
        "hosts": [
            {
                "name": h.name,
                "role": h.role,
                "address": h.address,
                "port": h.port,
                "cpus": h.cpus,
                "reserve_mib": h.reserve_mib,
                "speed": h.speed,
                **(devices or {}).get(h.name, {}),
            }
            for h in [head, *workers]
        ],
    }


def _changed_inputs(
    previous: Dict[str, Any],
    layout: Dict[str, Any],
    model: Dict[str, Any],
    recorded_now: Dict[str, Any],
    backend: str,
    target: str,
) -> List[str]:
    """Why the previous plan was made from other inputs than these (empty: the same inputs)."""
    changes: List[str] = []
    before = previous.get("model") or {}
    file_name = model.get("file") or _basename(model.get("url")) or model.get("hf_dir")
    for key, now in (
        ("sha256", model.get("sha256")),
        ("url", model.get("url") or None),
        ("file", file_name),
        ("bytes", layout.get("file_bytes")),
        ("n_layer", layout.get("n_layer")),
    ):
        if before.get(key) != now:
            changes.append("model %s %r -> %r" % (key, before.get(key), now))
    for key, now in (("backend", backend), ("target", target)):
        if previous.get(key) != now:
            changes.append("%s %r -> %r" % (key, previous.get(key), now))
    recorded = previous.get("planned_with")
    if not isinstance(recorded, dict):
        return [*changes, "the previous plan does not record its inputs (planned_with)"]
    options_before = recorded.get("options") or {}
    for key, now in sorted(recorded_now["options"].items()):
        if options_before.get(key) != now:
            changes.append("option %s %r -> %r" % (key, options_before.get(key), now))
    if recorded.get("reserve_mib") != recorded_now["reserve_mib"]:
        changes.append("reserve_mib %r -> %r" % (recorded.get("reserve_mib"), recorded_now["reserve_mib"]))
    hosts_before = {h.get("name"): h for h in recorded.get("hosts") or [] if isinstance(h, dict)}
    hosts_now = {h["name"]: h for h in recorded_now["hosts"]}
    for name in sorted(set(hosts_before) - set(hosts_now)):
        changes.append("host %s is no longer a candidate" % name)
    for name in sorted(set(hosts_now) - set(hosts_before)):
        changes.append("host %s is a new candidate" % name)
    for name in sorted(set(hosts_now) & set(hosts_before)):
        for key, now in sorted(hosts_now[name].items()):
            if hosts_before[name].get(key) != now:
                changes.append("%s %s %r -> %r" % (name, key, hosts_before[name].get(key), now))
    return changes


def keep_previous(
    previous: Any,
    layout: Dict[str, Any],
    model: Dict[str, Any],
    head: Dict[str, Any],
    workers: Sequence[Dict[str, Any]],
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = DEFAULT_RESERVE_MIB,
    backend: str = "llama_cpp",
    target: str = "systemd",
) -> Dict[str, Any]:
    """Whether the previous plan still stands for these inputs and the current measurements.

    It stands when it was made from the same inputs (the model by sha256, file and size; backend,
    target, options, reserves; the same head and candidate workers with the same addresses, ports,
    cpus and speeds, as recorded in its ``planned_with``) and every host it uses still has room for
    its predicted total while keeping at least half of its reserve:
    ``usable now - reserve - predicted total >= -reserve / 2``. Usable memory moves between runs
    (the deployed services, journals); re-planning on every move would rewrite the plan and
    restart services, and a fresh plan keeps the whole reserve.

    Returns ``{"keep": bool, "reasons": [...], "hosts": rows with the current usable and headroom,
    "table": those rows as text}`` (``hosts`` and ``table`` are empty when the inputs changed).
    """
    opts = Options.from_dict(check_options(options))
    opts.check()
    head_host, worker_hosts = hosts_from_dicts(head, workers, reserve_mib)
    if not isinstance(previous, dict) or not previous:
        return {"keep": False, "reasons": ["no previous plan"], "hosts": [], "table": ""}
    if (
        previous.get("version") != PLAN_VERSION
        or not isinstance(previous.get("hosts"), list)
        or not previous["hosts"]
    ):
        return {
            "keep": False,
            "reasons": ["the previous plan is not a version %d plan with hosts" % PLAN_VERSION],
            "hosts": [],
            "table": "",
        }
    changes = _changed_inputs(
        previous,
        layout,
        model,
        planned_with(head_host, worker_hosts, opts, reserve_mib, device_inputs(head, workers)),
        backend,
        target,
    )
    if changes:
        return {
            "keep": False,
            "reasons": ["the inputs changed: " + "; ".join(changes)],
            "hosts": [],
            "table": "",
        }
    current = {h.name: h for h in [head_host, *worker_hosts]}
    devices_now = {str(h["name"]): h.get("devices") or [] for h in [head, *workers]}
    gpu_reserves = {
        str(h["name"]): float(h.get("gpu_reserve_mib", DEFAULT_GPU_RESERVE_MIB)) for h in [head, *workers]
    }
    rows: List[Dict[str, Any]] = []
    short: List[str] = []
    for row in previous["hosts"]:
        host = current[row["name"]]
        total = float(row["predicted_mib"]["total"])
        headroom = round(host.budget_mib - total, 1)
        rows.append(
            {
                **row,
                "usable_mib": round(host.usable_mib, 1),
                "reserve_mib": round(host.reserve_mib, 1),
                "headroom_mib": headroom,
            }
        )
        # A kept plan may use up to half of a host's reserve: measurements move between runs (the
        # deployed services themselves, journals, caches); a fresh plan always keeps the whole reserve.
        if headroom < -host.reserve_mib / 2.0:
            short.append(
                "%s needs %.1f MiB but has %.0f usable - %.0f reserve now (%.1f MiB short; a kept plan"
                " may use half the reserve)"
                % (host.name, total, host.usable_mib, host.reserve_mib, -headroom)
            )
        short.extend(_gpus_short(row, devices_now.get(host.name) or [], gpu_reserves.get(host.name)))
    table = render_table(rows)
    if short:
        return {
            "keep": False,
            "reasons": ["a host shrank below its prediction: " + "; ".join(short)],
            "hosts": rows,
            "table": table,
        }
    tightest = min(rows, key=lambda r: r["headroom_mib"])
    return {
        "keep": True,
        "reasons": [
            "same model, options and hosts, and every host still fits its predicted total with at least"
            " half of its reserve (least headroom now %.1f MiB on %s)"
            % (tightest["headroom_mib"], tightest["name"])
        ],
        "hosts": rows,
        "table": table,
    }


def _gpus_short(
    row: Dict[str, Any], devices_now: Sequence[Dict[str, Any]], reserve: Optional[float]
) -> List[str]:
    """A kept plan's discrete GPUs that no longer have room for their buffers (free now less the VRAM
    reserve, of which a kept plan may use half, as for a host's RAM); a uma device is in the RAM check."""
    now = {str(d.get("name")): d for d in devices_now}
    out = []
    for dev in row.get("devices") or []:
        got = now.get(str(dev.get("name")))
        if dev.get("backend", "cpu") == "cpu" or (
            dev["layers"][1] <= dev["layers"][0] and not dev["output_layer"]
        ):
            continue
        if got is None:
            out.append("%s %s is gone" % (row["name"], dev["name"]))
            continue
        if got.get("uma"):
            continue
        keep = float(reserve if reserve is not None else DEFAULT_GPU_RESERVE_MIB)
        need = float(dev["predicted_mib"]["total"])
        free = float(got.get("memory_free_mib") or 0)
        if free - keep - need < -keep / 2.0:
            out.append(
                "%s %s needs %.1f MiB but has %.0f free - %.0f reserve now (a kept plan may use half the"
                " reserve)" % (row["name"], dev["name"], need, free, keep)
            )
    return out


def fallback_plans(
    model: Model, head: Host, used: List[Host], opts: Options, placer: Optional[Placer] = None
) -> List[Dict[str, Any]]:
    """One entry per single lost worker: the used workers but that one (sorted by the lost name).

    ``workers`` is the set left, the supervisor's key; ``lost`` the worker gone. One worker or
    none: no fallback. When two or more are lost at once the supervisor finds no entry for the
    set and waits (docs/planner.md). Linear in the used workers (was one per subset: 2^n - 2).
    """
    out: List[Dict[str, Any]] = []
    if len(used) < 2:
        return out
    placer = placer or memory_placer
    opts = dataclasses.replace(opts, min_workers=0)
    for lost in sorted(used, key=lambda h: h.name):
        subset = [h for h in used if h is not lost]
        names = sorted(h.name for h in subset)
        try:
            placement, _reasons, _left = placer(model, head, subset, opts)
        except PlacementError as err:
            detail = (
                ", ".join("%s %.1f MiB" % (k, v) for k, v in err.missing.items())
                or "no whole-layer split fits"
            )
            out.append(
                {
                    "workers": names,
                    "lost": lost.name,
                    "ok": False,
                    "reason": "%s cannot hold the model: missing %s" % ("+".join(names), detail),
                }
            )
            continue
        entry = plan_entry(placement, model, opts)
        out.append(
            {**entry, "workers": names, "lost": lost.name, "used_workers": entry["workers"], "ok": True}
        )
    return out


def output_facts(layout: Dict[str, Any], options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The model's width and, from the memory model, what a worker needs to hold the output layer:
    its weights (``output_mib``), the largest tensor it loads (``output_largest_mib``), and the
    compute every host adds when llama.cpp turns on pipeline parallelism (``pipeline_extra_mib``)."""
    model = Model.from_layout(layout)
    opts = Options.from_dict(check_options(options or {}))
    return {
        "n_embd": model.n_embd,
        "output_mib": round((model.output_bytes + model.output_norm_bytes) / MIB, 3),
        "output_largest_mib": round(model.output_bytes / MIB, 3),
        "pipeline_extra_mib": round(_pp_extra(model, opts, True) / MIB, 3),
    }


def _basename(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    return path.rstrip("/").split("?")[0].rsplit("/", 1)[-1] or None


def make_plan(
    layout: Dict[str, Any],
    model: Dict[str, Any],
    head: Dict[str, Any],
    workers: Sequence[Dict[str, Any]],
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = DEFAULT_RESERVE_MIB,
    backend: str = "llama_cpp",
    target: str = "systemd",
    placer: Optional[Placer] = None,
    annotate: Optional[Annotate] = None,
) -> Dict[str, Any]:
    """The complete plan (docs/plan-format.md, docs/plan.schema.json).

    ``model`` is the inventory's ``llmfleet_model`` ({name, file or url, sha256}). Raises
    PlacementError when nothing fits and ValueError on bad input (both name the value at fault).
    """
    if backend not in ("llama_cpp", "vllm"):
        raise ValueError("backend must be llama_cpp or vllm, got %r" % (backend,))
    if target not in targets.names():
        raise ValueError("target must be %s, got %r" % (" or ".join(targets.names()), target))
    if not isinstance(model, dict) or not (model.get("file") or model.get("url") or model.get("hf_dir")):
        raise ValueError("llmfleet_model needs a file or a url (or an hf_dir), got %r" % (model,))
    sha = model.get("sha256")
    if sha is not None and (
        not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)
    ):
        raise ValueError("llmfleet_model.sha256 must be 64 lowercase hex digits, got %r" % (sha,))
    body = plan_llama_cpp(layout, head, workers, options, reserve_mib, placer=placer, annotate=annotate)
    file_name = model.get("file") or _basename(model.get("url")) or model.get("hf_dir")
    plan: Dict[str, Any] = {
        "version": PLAN_VERSION,
        "backend": backend,
        "target": target,
        "context": body["context"],
        "parallel": body["parallel"],
        "model": {
            "name": str(model.get("name") or _basename(file_name) or "model"),
            "file": file_name,
            "url": model.get("url") or None,
            "sha256": sha,
            "bytes": layout.get("file_bytes"),
            "n_layer": int(layout["n_layer"]),
            "n_vocab": int(layout.get("n_vocab") or 0),
            "tied_output": bool(layout.get("tied_output")),
            "architecture": str(layout.get("architecture") or ""),
        },
    }
    if backend == "llama_cpp":
        # what playbooks/profile.yml needs to move the output layer in its measuring placement
        # (profile.output_moved) and to price an activation row: from the memory model, once
        plan["model"].update(output_facts(layout, options))
    for key, value in body.items():
        if key not in plan:
            plan[key] = value
    return plan


def _capped_devices(
    name: str, devices: Sequence[Mapping[str, Any]], caps: Mapping[str, Any]
) -> List[Dict[str, Any]]:
    """``devices`` with each GPU named in ``caps`` offering at most that many MiB (host_from_fact)."""
    if not isinstance(caps, Mapping):
        raise ValueError(
            "host %s: llmfleet_device_memory_mib must map device names to MiB, got %r" % (name, caps)
        )
    gpus = [d["name"] for d in devices if d.get("backend") != "cpu"]
    out = [dict(d) for d in devices]
    for dev, cap in caps.items():
        if dev not in gpus:
            raise ValueError(
                "host %s: llmfleet_device_memory_mib names %s, which is not one of its GPUs (%s)"
                % (name, dev, ", ".join(gpus) or "none")
            )
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 <= cap < float("inf"):
            raise ValueError(
                "host %s: llmfleet_device_memory_mib.%s must be a number of MiB >= 0, got %r"
                % (name, dev, cap)
            )
        for d in out:
            if d["name"] == dev:
                d["memory_free_mib"] = min(int(d.get("memory_free_mib") or 0), int(cap))
    return out


def host_from_fact(
    name: str,
    fact: Any,
    address: Optional[str] = None,
    port: Optional[int] = None,
    reserve_mib: Optional[float] = None,
    speed: Optional[Any] = None,
    gpu_reserve_mib: Optional[float] = None,
    device_memory_mib: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """One placement host from a probe fact (``llmfleet_host``: memory.usable_mib, cpus, default_ipv4,
    devices). A fact with GPUs among its ``devices`` gives the host its ``devices`` (validated by
    devices.host_devices) and ``gpu_reserve_mib`` (VRAM kept free on each of its GPUs, default
    device_placement.DEFAULT_GPU_RESERVE_MIB); a CPU-only host has neither and plans as before.
    ``device_memory_mib`` (``llmfleet_device_memory_mib``): device name -> the most MiB the plan may
    give that GPU (its ``memory_free_mib`` is capped there: an iGPU's share of the RAM it shares,
    VRAM another program needs); a name the host does not list or a value that is not a number
    >= 0 is refused, naming the host, the device and the value."""
    if not isinstance(fact, dict):
        raise ValueError(
            "host %s has no llmfleet_host fact (probe it, or define llmfleet_host for what-if planning)"
            % name
        )
    memory = fact.get("memory") or {}
    usable = memory.get("usable_mib") if isinstance(memory, dict) else None
    if not isinstance(usable, (int, float)) or isinstance(usable, bool) or usable < 0:
        raise ValueError(
            "host %s: llmfleet_host.memory.usable_mib is missing or not a number (%r)" % (name, usable)
        )
    cpus = fact.get("cpus") or 1
    addr = address or fact.get("default_ipv4")
    out: Dict[str, Any] = {
        "name": name,
        "usable_mib": float(usable),
        "cpus": int(cpus),
        "address": addr,
        "port": int(port) if port else DEFAULT_RPC_PORT,
    }
    if reserve_mib is not None:
        out["reserve_mib"] = float(reserve_mib)
    if "devices" in fact:
        try:
            devices = host_devices(name, fact)
        except DeviceError as err:
            raise ValueError(str(err)) from err
        if any(d.get("backend") != "cpu" for d in devices):
            out["devices"] = devices
            if gpu_reserve_mib is not None:
                if (
                    isinstance(gpu_reserve_mib, bool)
                    or not isinstance(gpu_reserve_mib, (int, float))
                    or gpu_reserve_mib < 0
                ):
                    raise ValueError(
                        "host %s: llmfleet_gpu_reserve_mib must be a number >= 0, got %r"
                        % (name, gpu_reserve_mib)
                    )
                out["gpu_reserve_mib"] = float(gpu_reserve_mib)
    if device_memory_mib:
        out["devices"] = _capped_devices(name, out.get("devices") or [], device_memory_mib)
    if isinstance(speed, dict):
        out["speed"] = dict(speed)  # measured figures, validated by the planner (plugin_utils/speed.py)
    elif speed:
        out["speed"] = float(speed)
    return out

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measuring placements of playbooks/profile.yml (docs/profile.md), from the served plan.

Controller only, pure. Each is the served plan with another split, made by the plan itself
(:meth:`plan.Plan.with_split`): its rows, and llama-server's arguments from the one builder
(placement_render.split_args, checked against llama.cpp's split rule), followed by the plan's
other options and ``--poll 0``. What changes is chosen here: the workers the plan leaves out get
layers (:func:`measuring_plan`), the output layer moves (:func:`output_moved`); the memory check
of a move is the plan's own figures (its rows' predicted MiB and headroom, the model's
``output_mib``, ``output_largest_mib`` and ``pipeline_extra_mib`` from the memory model).
"""

from __future__ import absolute_import, annotations, division, print_function

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import DEFAULT_RPC_PORT
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan, PlanError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import MEASURE_THREADS, ProfileError

__metaclass__ = type

MEASURE_LAYERS = 2
# the margin a worker holding the output layer alone keeps when it is given repeating layers
TOP_UP_MIB = 8.0
# llama-server's polling level while measuring: its threads sleep while they wait for the workers
MEASURE_POLL = 0


def _parse(plan: Mapping[str, Any]) -> Plan:
    try:
        return Plan.from_dict(plan)
    except PlanError as err:
        raise ProfileError(str(err)) from err


def _total(mib: Mapping[str, Any]) -> float:
    return sum(float(mib.get(k) or 0.0) for k in ("weights", "kv", "compute", "process", "peak"))


def _take(counts: List[int], take: int, head_layers: int, name: str) -> int:
    """Take ``take`` layers for ``name`` from the head (first), then one at a time from the worker
    with the most (never its last); returns the head's layers left."""
    from_head = min(take, head_layers)
    take -= from_head
    while take > 0:
        i = max(range(len(counts)), key=lambda j: counts[j]) if counts else None
        if i is None or counts[i] <= 1:
            raise ProfileError("%s: no layers left to give it in the measuring placement" % name)
        counts[i] -= 1
        take -= 1
    return head_layers - from_head


def measuring_plan(
    plan: Mapping[str, Any], add: Sequence[str], layers_each: int = MEASURE_LAYERS
) -> Dict[str, Any]:
    """The served plan changed so that one request measures every host's compute honestly.

    ``add``: workers the plan leaves out (no layers, so no compute figure from the served plan):
    each gets ``layers_each`` repeating layers, taken from the head's CPU (then from the worker
    with the most layers), at the front of the ``--rpc`` list; every other host keeps its layers
    and the output layer stays where it is. Every worker is measured at ``MEASURE_THREADS`` (1)
    rpc-server thread (``threads``; ``serving_threads`` keeps the plan's): rpc-server has no
    ``--poll``, and with more threads its CPU seconds are mostly its threads spinning (playbooks/
    profile.yml runs a served worker's unit at one thread through a runtime drop-in, see
    :func:`profile.single_thread_dropin`). ``--poll 0``: llama-server's CPU threads sleep while
    they wait for the workers instead of spinning, so the head's CPU seconds are its work
    (docs/profile.md). The result is a plan the supervisor serves (no fallbacks: the measuring
    run needs every host) with ``hosts[].layers`` and ``predicted_mib.weights`` of the new split,
    for :func:`profile.compute_figures`.
    """
    served = _parse(plan)
    n_layer = served.model.n_layer
    if n_layer is None:
        raise ProfileError("the plan's model has no n_layer (%r)" % (n_layer,))
    devices = list(served.workers)
    rpc = served.split_value("--rpc")
    if rpc is not None and rpc.split(",") != [str(d.endpoint) for d in devices]:
        raise ProfileError("the plan's --rpc %r names an endpoint that no worker has" % rpc)
    counts = served.worker_layers
    head_layers = served.head_layers
    # the average repeating layer's weights (for the new split's predicted_mib.weights)
    per = [
        float(d.predicted_mib["weights"]) / d.layer_count
        for d in devices
        if d.layer_count and not d.output_layer and d.predicted_mib.get("weights")
    ]
    avg = sum(per) / len(per) if per else 0.0
    new: List[Dict[str, Any]] = []
    for name in add:
        if served.host(name) is not None:
            raise ProfileError("%s: already in the plan, cannot add it to the measuring placement" % name)
        info = served.candidate(name)
        if not info or not info.get("address"):
            raise ProfileError("%s: not in the plan's planned_with.hosts (no address to reach it)" % name)
        port = int(info.get("port") or DEFAULT_RPC_PORT)
        head_layers = _take(counts, layers_each, head_layers, name)
        new.append(
            {
                "name": name,
                "role": "worker",
                "address": info["address"],
                "port": port,
                "endpoint": "%s:%d" % (info["address"], port),
                "threads": MEASURE_THREADS,
                "serving_threads": int(info.get("cpus") or 1),
                "output_layer": False,
                "measuring": True,
            }
        )
    # a worker that holds the output layer alone gets repeating layers too (its layers are priced
    # from a request without the output layer, output_apart), when its headroom takes them
    # (each layer's weights and about as much KV, and the compute of a worker with layers)
    plain = [(d, c) for d, c in zip(devices, counts) if c and not d.output_layer and d.predicted_mib]
    topped: Dict[str, Dict[str, float]] = {}
    for i, d in enumerate(devices):
        if counts[i] or not d.output_layer or not plain:
            continue
        # the memory model's shape (weights + process + max(kv + compute, the largest tensor)):
        # the layers' weights, their KV at a plain worker's rate and a plain worker's compute
        mib = d.predicted_mib
        ref, ref_count = plain[0]
        kv = mib.get("kv", 0.0) + layers_each * ref.predicted_mib.get("kv", 0.0) / ref_count
        compute = max(mib.get("compute", 0.0), ref.predicted_mib.get("compute", 0.0))
        largest = mib.get("peak", 0.0) + mib.get("kv", 0.0) + mib.get("compute", 0.0)
        grown = (
            mib.get("weights", 0.0) + layers_each * avg + mib.get("process", 0.0) + max(kv + compute, largest)
        )
        if grown + TOP_UP_MIB > (d.budget_mib or 0.0):
            continue
        topped[d.name] = {"kv": round(kv, 2), "compute": round(compute, 2), "largest": largest}
        take = layers_each
        from_head = min(take, head_layers)
        head_layers -= from_head
        take -= from_head
        while take > 0:
            j = max(range(len(counts)), key=lambda k: counts[k])
            if counts[j] <= 1:
                break
            counts[j] -= 1
            counts[i] += 1
            take -= 1
        counts[i] += from_head
    all_counts = [layers_each] * len(new) + counts
    if head_layers + sum(all_counts) != n_layer:
        raise ProfileError("the measuring split %s does not give the layers of %d" % (all_counts, n_layer))
    head = served.row(served.head)
    head_mib = dict(head.get("predicted_mib") or {})
    if "weights" in head_mib:
        head_mib["weights"] = round(float(head_mib["weights"]) - (served.head_layers - head_layers) * avg, 2)
    head["predicted_mib"] = head_mib
    placed = []
    for h, c in zip([*new, *(served.row(d) for d in devices)], all_counts):
        if not h.get("measuring"):
            # every worker measured at one rpc-server thread (profile.yml restarts a served one
            # that runs more): a multi-thread rpc-server's CPU seconds are its threads polling
            h["serving_threads"] = h.get("threads")
            h["threads"] = MEASURE_THREADS
        mib = dict(h.get("predicted_mib") or {})
        old = served.layer_counts().get(h["name"], 0)
        extra = float(mib.get("weights") or 0) - old * avg if h.get("output_layer") else 0.0
        mib["weights"] = round(c * avg + max(0.0, extra), 2)
        grown = topped.get(h["name"])
        if grown:
            mib["kv"], mib["compute"] = grown["kv"], grown["compute"]
            mib["peak"] = round(max(0.0, grown["largest"] - grown["kv"] - grown["compute"]), 2)
            mib["total"] = round(_total(mib), 2)
        h["predicted_mib"] = mib
        placed.append(h)
    others = [served.row(h) for h in served.hosts if h.role == "worker" and h not in devices]
    try:
        out = served.with_split(
            placed, head_layers, all_counts, served.output_on_head, head, others, poll=MEASURE_POLL
        )
    except (AssertionError, ValueError) as err:
        raise ProfileError("the measuring split does not give the layers %s: %s" % (all_counts, err)) from err
    out["fallbacks"] = []
    out["measuring"] = {
        "added": list(add),
        "layers_each": layers_each,
        "poll": MEASURE_POLL,
        "worker_threads": MEASURE_THREADS,
    }
    return out


def output_moved(
    plan: Mapping[str, Any],
    quotas: Optional[Mapping[str, Any]] = None,
    only: Optional[Sequence[str]] = None,
) -> Optional[Dict[str, Any]]:
    """A measuring placement (:func:`measuring_plan`) with the output layer on another host, or
    None when it fits nowhere else.

    Output on the head -> on a worker (it goes last in ``--rpc``: llama.cpp's output slot is the
    last device's; the ``-ot`` override dropped): a worker without a CPU quota below one CPU
    (``quotas``: host -> its quota) first, so that the request is not bound by a quota, then the
    one with the most room left; output on a worker -> on the head, through the ``-ot``
    override. ``only``: the workers it may go to (default every worker of the placement). Every
    other host keeps its layers. The memory check is the plan's own figures
    (``model.output_mib``, ``output_largest_mib`` and, when llama.cpp would start pipelining,
    ``pipeline_extra_mib`` on every host), against each host's budget (its predicted total +
    headroom): a move that the memory model does not fit is not made."""
    served = _parse(plan)
    model = served.model
    output_mib = model.output_mib
    used = list(served.workers)
    if not output_mib or output_mib <= 0 or not used:
        return None
    head = served.head
    others = [served.row(h) for h in served.hosts if h.role == "worker" and h not in used]
    if head.output_layer:
        pipelined = len(used) > 1 and served.head_layers == 0
        extra = (model.pipeline_extra_mib or 0.0) if pipelined else 0.0
        for h in [head, *used]:
            if h.budget_mib is not None and _total(h.predicted_mib) + extra > h.budget_mib:
                return None
        room = []
        for w in used:
            mib = dict(served.row(w).get("predicted_mib") or {})
            largest = max(model.output_largest_mib or 0.0, w.predicted_mib.get("peak", 0.0))
            mib["weights"] = round(float(mib.get("weights") or 0.0) + output_mib, 2)
            mib["compute"] = round(float(mib.get("compute") or 0.0) + extra, 2)
            mib["peak"] = round(max(0.0, largest - float(mib.get("kv") or 0.0) - float(mib["compute"])), 2)
            mib["total"] = round(_total(mib), 2)
            left = w.budget_mib - mib["total"] if w.budget_mib is not None else -1.0
            if left >= 0 and (only is None or w.name in only):
                room.append((not quotad(quotas, w.name), left, w.name, mib))
        if not room:
            return None
        _free, _left, name, mib = max(room)
        order = [w for w in used if w.name != name] + [w for w in used if w.name == name]
        rows = [dict(served.row(w), **({"predicted_mib": mib} if w.name == name else {})) for w in order]
        out = served.with_split(
            rows, served.head_layers, [w.layer_count for w in order], False, others=others, poll=MEASURE_POLL
        )
        moved_to = name
    else:
        holder = used[-1]
        if not holder.output_layer:
            return None
        head_row = served.row(head)
        if not model.tied_output:
            head_mib = dict(head_row.get("predicted_mib") or {})
            head_mib["weights"] = round(float(head_mib.get("weights") or 0.0) + output_mib, 2)
            head_mib["total"] = round(_total(head_mib), 2)
            if head_mib["total"] > (head.budget_mib or 0.0):
                return None
            head_row["predicted_mib"] = head_mib
        rows = [served.row(w) for w in used]
        mib = dict(rows[-1].get("predicted_mib") or {})
        mib["weights"] = round(max(0.0, float(mib.get("weights") or 0.0) - output_mib), 2)
        rows[-1]["predicted_mib"] = mib
        out = served.with_split(
            rows, served.head_layers, served.worker_layers, True, head_row, others, poll=MEASURE_POLL
        )
        moved_to = head.name
    out["measuring"] = dict(out.get("measuring") or {}, output_moved_to=moved_to)
    return out


def quotad(quotas: Optional[Mapping[str, Any]], name: str) -> bool:
    """Whether a host runs under a CPU quota below one CPU (its requests may be the quota's)."""
    q = (quotas or {}).get(name)
    return isinstance(q, (int, float)) and not isinstance(q, bool) and q < 1.0


def measuring_placements(
    measuring: Mapping[str, Any], quotas: Optional[Mapping[str, Any]] = None
) -> List[Dict[str, Any]]:
    """The measuring placements (docs/profile.md), the same split each, the output layer moved:

    1. on the head (moved there when the served plan has it on a worker and the head can take it);
    2. on a worker (:func:`output_moved`: one without a CPU quota first, so that the request is
       bound by the chain and prices the head);
    3. on the quota'd worker with the most room, when that is not the second's: there a quota
       makes the output layer's cost the fleet's rate, so it is measured, not priced.

    Fewer when the output layer fits on fewer hosts, and only the first when the plan keeps the
    output layer on the head (``llmfleet_output_layer: head``: no plan of the fleet puts it
    elsewhere, so its cost there is not needed)."""
    first = dict(measuring)
    if not _parse(first).head.output_layer:
        first = output_moved(first, quotas) or first
        if not _parse(first).head.output_layer:
            return [first]
    if _parse(first).options.get("output_layer") == "head":
        return [first]
    out = [first]
    second = output_moved(first, quotas)
    if second is None:
        return out
    out.append(second)
    moved_to = second["measuring"]["output_moved_to"]
    throttled = [w for w in _parse(first).names[1:] if quotad(quotas, w) and w != moved_to]
    third = output_moved(first, quotas, only=throttled) if throttled else None
    if third is not None:
        out.append(third)
    return out


def measuring_request(
    plan: Mapping[str, Any],
    add: Sequence[Any] = (),
    layers_each: int = MEASURE_LAYERS,
    request: Any = 0,
    quotas: Optional[Mapping[str, Any]] = None,
    output_apart: bool = True,
    devices: bool = True,
) -> Any:
    """The measuring plan (``request`` 0), the placement of measured request 1, 2 or 3 ({} when
    the plan makes fewer), with ``request`` ``devices`` the list of :func:`device_pairs` of
    request 1's placement, or with ``request`` ``all`` every placement the profile role serves
    from one measuring plan (:func:`measuring_requests`; ``output_apart`` and ``devices`` apply
    to it only) (filter ``llmfleet.cluster.profile_measuring_plan``)."""
    if str(request) not in ("0", "1", "2", "3", "devices", "all"):
        raise ProfileError("request must be 0, 1, 2, 3, devices or all, got %r" % (request,))
    measuring = measuring_plan(plan or {}, [str(a) for a in add or []], int(layers_each))
    if request == "all":
        return measuring_requests(measuring, int(layers_each), quotas, output_apart, devices)
    if request == "devices":
        return device_pairs(measuring_placements(measuring, quotas or {})[0], int(layers_each))
    if int(request) == 0:
        return measuring
    placements = measuring_placements(measuring, quotas or {})
    return placements[int(request) - 1] if int(request) <= len(placements) else {}


def measuring_requests(
    measuring: Mapping[str, Any],
    layers_each: int = MEASURE_LAYERS,
    quotas: Optional[Mapping[str, Any]] = None,
    output_apart: bool = True,
    devices: bool = True,
) -> Dict[str, List[Dict[str, Any]]]:
    """Every placement the profile role serves, the measuring placements made once:
    ``requests`` the placements of requests 1, 2 and 3 ({} for each the plan does not make), or
    with ``output_apart`` false the measuring plan itself then {} twice (one request, the output
    layer where the plan has it); ``devices`` the :func:`device_pairs` of request 1's placement
    ([] when ``devices`` is false)."""
    placements = measuring_placements(measuring, quotas or {}) if (output_apart or devices) else []
    requests: List[Dict[str, Any]] = list(placements[:3]) if output_apart else [dict(measuring)]
    return {
        "requests": [*requests, {}, {}, {}][:3],
        "devices": device_pairs(placements[0], int(layers_each)) if devices else [],
    }


def _layer_mib(devices: Sequence[Any]) -> float:
    """MiB of one repeating layer (weights and KV) by the cheapest of ``devices`` that hold layers:
    a device's own average also carries what only it holds (the head's CPU: the token embeddings
    and the output weights)."""
    rates = [
        (float(d.predicted_mib.get("weights") or 0.0) + float(d.predicted_mib.get("kv") or 0.0))
        / d.layer_count
        for d in devices
        if d.layer_count
    ]
    return min(rates) if rates else 0.0


def _room(device: Any) -> Optional[float]:
    """What ``device`` may still take (its budget minus its predicted total), None when unknown."""
    total = device.predicted_mib.get("total")
    if device.budget_mib is None or total is None:
        return None
    return float(device.budget_mib) - float(total)


def _unpriced(about: Mapping[str, Any], why: str) -> Dict[str, Any]:
    """The entry of a device that cannot be priced by a pair: no placement, its reason."""
    reason = "not measured: %s device %s: %s" % (about["host"], about["device"], why)
    return {"measuring": {"device": dict(about, reason=reason)}}


def device_pairs(placement: Mapping[str, Any], layers_each: int = MEASURE_LAYERS) -> List[Dict[str, Any]]:
    """The measuring placements that price each device other than a CPU (docs/profile.md, "Per
    device"): per such device of a host that also serves its CPU, two placements of ``placement``
    (the first measured request's) that differ only in where ``k`` of that host's layers run, on
    the device and on the host's CPU; every host keeps its count, the other devices their layers.

    A device holding layers moves ``k`` of them (all, less one when it holds the output layer, so
    that the output layer stays where it is; fewer when the CPU's memory room is smaller); one
    holding none takes ``k = layers_each`` of its host's CPU layers (fewer when its own room is).
    Each placement says what it is in ``measuring.device``: ``host``, ``device``, ``layers`` (k)
    and ``on`` (``device`` or ``cpu``). A device that cannot be priced so (its host serves no CPU
    device, holds no layers, or no layer fits) is left out with ``measuring.device.reason`` on a
    placement-less entry ``{"measuring": {"device": {..., "reason": ...}}}``.

    When two devices or more moved their own layers (their on-device side is ``placement``
    itself), one more placement ends the list: every such device's ``k`` layers on its host's
    CPU at once (``measuring.devices_on_cpu``: each one's ``host``, ``device`` and ``layers``),
    where each host's CPU room takes them all; :func:`profile_figures.devices_together` reads
    what the devices cost together beyond the sum of their pairs from it."""
    served = _parse(placement)
    workers = [served.row(w) for w in served.workers]
    others = [served.row(h) for h in served.hosts if h.role == "worker" and h not in served.workers]

    def measured(device_layers: Dict[str, List[int]], **marks: Any) -> Dict[str, Any]:
        """``placement`` with these hosts' devices split so, no fallbacks, ``marks`` in ``measuring``."""
        got = served.with_split(
            workers,
            served.head_layers,
            served.worker_layers,
            served.output_on_head,
            others=others,
            poll=MEASURE_POLL,
            device_layers=device_layers,
        )
        got["fallbacks"] = []
        got["measuring"] = dict(got.get("measuring") or {}, **marks)
        return got

    out: List[Dict[str, Any]] = []
    # host -> the splits of its devices with every moved device's layers on its CPU (for the
    # request with every device that held layers emptied at once)
    emptied: Dict[str, List[int]] = {}
    moved: List[Dict[str, Any]] = []
    needed: Dict[str, float] = {}
    fits = True
    emptied_side: Dict[str, Any] = {}
    for host in served.hosts:
        if host.role == "worker" and host not in served.workers:
            continue
        devices = list(host.devices)
        cpus = [i for i, d in enumerate(devices) if d.backend == "cpu"]
        for j, dev in enumerate(devices):
            if dev.backend == "cpu":
                continue
            about = {"host": host.name, "device": dev.name}
            if not cpus:
                out.append(_unpriced(about, "its host serves no CPU device to compare it with"))
                continue
            c = cpus[0]
            counts = [d.layer_count for d in devices]
            if counts[j]:
                # its own layers move: their MiB are the device's, from the host's RAM already
                # when the device's memory is that RAM (uma)
                k = counts[j] - (1 if dev.output_layer else 0)
                per, room = _layer_mib([dev]), None if dev.uma else _room(devices[c])
            else:
                k = min(int(layers_each), counts[c])
                per, room = _layer_mib(devices), _room(dev)
            if room is not None and per > 0:
                k = min(k, int(room // per))
            if k < 1:
                why = "no layer of %s can move between it and the CPU (%s layers, room %s MiB)" % (
                    host.name,
                    counts,
                    "unknown" if room is None else "%.1f" % room,
                )
                out.append(_unpriced(about, why))
                continue
            on_device = list(counts)
            if not counts[j]:
                on_device[j], on_device[c] = k, counts[c] - k
            on_cpu = list(on_device)
            on_cpu[j], on_cpu[c] = on_device[j] - k, on_device[c] + k
            if counts[j]:
                # its on-device side is the first request's placement itself
                split = emptied.setdefault(host.name, list(counts))
                split[j], split[c] = split[j] - k, split[c] + k
                moved.append(dict(about, layers=k))
                if room is not None:
                    # the CPU's room must take every device's layers of the host at once
                    needed[host.name] = needed.get(host.name, 0.0) + k * per
                    fits = fits and needed[host.name] <= room
            for on, split in (("device", on_device), ("cpu", on_cpu)):
                got = measured({host.name: split}, device=dict(about, layers=k, on=on))
                out.append(got)
                if counts[j] and on == "cpu":
                    emptied_side = got
    if len(moved) == 1:
        # the one device's pair: its CPU side uses no device, the request the head's token
        # time is taken from (profile_figures.head_token_from_none)
        emptied_side["measuring"]["devices_on_cpu"] = moved
    if len(moved) > 1 and fits:
        # every such device's layers on its host's CPU at once: what the devices cost together
        # beyond the sum of their pairs (profile_figures.devices_together)
        out.append(measured(emptied, devices_on_cpu=moved))
    return out

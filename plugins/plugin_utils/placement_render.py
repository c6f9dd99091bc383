# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan's output: its host rows and table, llama-server's placement arguments, the vLLM stages
(pure).
"""

from __future__ import absolute_import, annotations, division, print_function

import math
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import MIB
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import (
    Placement,
    Prediction,
    kv_bytes,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Host, Model, Options
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.split_rule import (
    rpc_device_names,
    rpc_report_names,
    tensor_split_for,
    verify_split,
)

__metaclass__ = type

# llama-server's tensor override that keeps the output layer (a tied one is token_embd) on the
# head's CPU
OUTPUT_ON_HEAD_ARGS = ("-ot", r"^(output|token_embd)\.weight$=CPU")


def _rows(
    head: Host,
    workers: List[Host],
    head_layers: int,
    counts: List[int],
    output_on_head: bool,
    preds: List[Prediction],
) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    start = 0
    for i, (host, pred) in enumerate(zip([head, *workers], preds)):
        count = head_layers if i == 0 else counts[i - 1]
        holds_output = (i == 0 and (output_on_head or not workers)) or (
            i == len(workers) and i > 0 and not output_on_head
        )
        row: Dict[str, Any] = {
            "name": host.name,
            "role": host.role,
            "endpoint": host.endpoint,
            "address": host.address,
            "layers": [start, start + count],
            "output_layer": bool(holds_output),
            "threads": host.cpus,
            "predicted_mib": pred.mib(),
            "usable_mib": round(host.usable_mib, 1),
            "reserve_mib": round(host.reserve_mib, 1),
            "headroom_mib": round(host.budget_mib - pred.total / MIB, 1),
        }
        if host.role == "worker":
            row["port"] = host.port
        rows.append(row)
        start += count
    return rows


def render_table(rows: List[Dict[str, Any]]) -> str:
    """The plan as a fixed-width text table (also used in errors)."""
    head = (
        "host",
        "role",
        "layers",
        "out",
        "weights",
        "kv",
        "compute",
        "total",
        "usable",
        "reserve",
        "headroom",
    )
    lines = [head]
    for r in rows:
        first, last = r["layers"]
        layers = "-" if last <= first else "%d-%d" % (first, last - 1)
        p = r["predicted_mib"]
        lines.append(
            (
                r["name"],
                r["role"],
                layers,
                "yes" if r["output_layer"] else "",
                "%.1f" % p["weights"],
                "%.1f" % p["kv"],
                "%.1f" % p["compute"],
                "%.1f" % p["total"],
                "%.0f" % r["usable_mib"],
                "%.0f" % r.get("reserve_mib", 0),
                "%.1f" % r["headroom_mib"],
            )
        )
    return _fixed_width(lines, 4)


def _fixed_width(lines: Sequence[Sequence[str]], left: int) -> str:
    """Rows (the first the heading) as fixed-width text: the first ``left`` columns left-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for n, line in enumerate(lines):
        out.append(
            "  ".join(
                c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def render_device_table(rows: List[Dict[str, Any]]) -> str:
    """The plan's devices as a fixed-width text table, one row per device (also used in errors)."""
    head = (
        "host",
        "device",
        "report",
        "backend",
        "layers",
        "out",
        "weights",
        "kv",
        "compute",
        "total",
        "budget",
    )
    lines = [head]
    for r in rows:
        for d in r.get("devices") or []:
            first, last = d["layers"]
            p = d["predicted_mib"]
            lines.append(
                (
                    r["name"],
                    d["name"],
                    d["report_name"],
                    d["backend"] + ("" if d.get("calibrated", True) else " (uncalibrated)"),
                    "-" if last <= first else "%d-%d" % (first, last - 1),
                    "yes" if d["output_layer"] else "",
                    "%.1f" % p["weights"],
                    "%.1f" % p["kv"],
                    "%.1f" % p["compute"],
                    "%.1f" % p["total"],
                    "%.1f" % d["budget_mib"],
                )
            )
    return _fixed_width(lines, 6)


def split_args(
    endpoints: Sequence[str],
    head_layers: int,
    worker_layers: Sequence[int],
    output_on_head: bool,
    devices: Optional[Sequence[str]] = None,
) -> List[str]:
    """llama-server's placement arguments, built here and nowhere else (the plan, its fallbacks,
    profile's measuring placements): ``--rpc`` (the workers' endpoints in order),
    ``--tensor-split`` (each worker's repeating layers, the output slot on the last one), ``-ngl``
    (every slot but the head's layers), ``-sm layer`` and, with the output layer on the head, the
    override that keeps it there; ``-ngl 0`` with no worker. The split is checked against
    llama.cpp's rule (split_rule.verify_split) before it is returned.

    With ``devices`` (a device placement: the names llama-server knows them by, in the chain's
    order, split_rule.device_chain) ``head_layers`` is what the head's CPU holds and
    ``worker_layers`` holds one count per device: ``--rpc`` comes first (llama.cpp registers the
    RPC devices while it parses ``--rpc``, and ``--device`` looks them up by name), then
    ``--device`` and a tensor split over those devices."""
    if devices is not None:
        return _device_split_args(endpoints, devices, head_layers, worker_layers, output_on_head)
    if not endpoints:
        return ["-ngl", "0"]
    if len(endpoints) != len(worker_layers):
        raise ValueError("%d endpoints for %d layer counts" % (len(endpoints), len(worker_layers)))
    n_layer = head_layers + sum(worker_layers)
    ngl = n_layer + 1 - head_layers
    slot_counts = list(worker_layers)
    slot_counts[-1] += 1  # the output slot goes to the last device with a share
    ts = tensor_split_for(slot_counts)
    verify_split(ts, slot_counts, n_layer, ngl)
    args = ["--rpc", ",".join(endpoints), "--tensor-split", ts, "-ngl", str(ngl), "-sm", "layer"]
    if output_on_head:
        args += list(OUTPUT_ON_HEAD_ARGS)
    return args


def _device_split_args(
    endpoints: Sequence[str],
    devices: Sequence[str],
    cpu_layers: int,
    counts: Sequence[int],
    output_on_head: bool,
) -> List[str]:
    if len(devices) != len(counts):
        raise ValueError("%d devices for %d layer counts" % (len(devices), len(counts)))
    args: List[str] = ["--rpc", ",".join(endpoints)] if endpoints else []
    if not devices or sum(counts) == 0:
        return [*args, "--device", "none", "-ngl", "0"]
    n_layer = cpu_layers + sum(counts)
    ngl = n_layer + 1 - cpu_layers
    slot_counts = list(counts)
    last = max(i for i, c in enumerate(slot_counts) if c > 0)
    slot_counts[last] += 1  # the output slot goes to the last device with a share
    ts = tensor_split_for(slot_counts)
    verify_split(ts, slot_counts, n_layer, ngl)
    args += ["--device", ",".join(devices), "--tensor-split", ts, "-ngl", str(ngl), "-sm", "layer"]
    if output_on_head:
        args += list(OUTPUT_ON_HEAD_ARGS)
    return args


def device_rows(p: Placement, model: Model, opts: Options) -> List[List[Dict[str, Any]]]:
    """Each host's ``devices`` (plan.json version 2), head first: the devices a placement uses,
    in llama.cpp's order, each named as the host lists it (``name``) and as the head's buffer
    report prints it (``report_name``: the head's own devices by their names, a worker's as
    ``RPC<i>[<endpoint>]``, ``i`` its place in its rpc-server's ``-d`` list:
    split_rule.rpc_report_names). ``--device`` names a worker's devices otherwise (``RPC<n>``
    over every endpoint: split_rule.rpc_device_names, in llama_args)."""
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import backend_model

    out: List[List[Dict[str, Any]]] = []
    if p.devices is None:
        # a CPU-only placement: each host's one device, its CPU
        for i, (host, pred) in enumerate(zip(p.hosts(), p.predictions)):
            first = 0 if i == 0 else p.head_layers + sum(p.worker_layers[: i - 1])
            count = p.head_layers if i == 0 else p.worker_layers[i - 1]
            output = (i == 0 and (p.output_on_head or not p.workers)) or (
                i == len(p.workers) and i > 0 and not p.output_on_head
            )
            mib = pred.mib()
            out.append(
                [
                    {
                        "name": "CPU",
                        "report_name": "CPU"
                        if i == 0
                        else rpc_report_names([host.endpoint or ""], [1])[0][0],
                        "backend": "cpu",
                        "type": "cpu",
                        "layers": [first, first + count],
                        "output_layer": bool(output),
                        "predicted_mib": {
                            "weights": mib["weights"],
                            "kv": mib["kv"],
                            "compute": mib["compute"],
                            "total": round(mib["weights"] + mib["kv"] + mib["compute"], 2),
                        },
                        "budget_mib": round(host.budget_mib - mib["process"] - mib["peak"], 1),
                        "calibrated": True,
                    }
                ]
            )
        return out
    rpc_names = rpc_report_names(
        [h.endpoint or "" for h in p.workers], [sum(1 for s in row if s.used) for row in p.devices[1:]]
    )
    for i, row in enumerate(p.devices):
        got = []
        kept = [s for s in row if s.used or (i == 0 and s.dev.is_cpu)]
        names = [s.dev.name for s in kept] if i == 0 else rpc_names[i - 1]
        for share, report in zip(kept, names):
            mib = share.prediction.mib()
            got.append(
                {
                    "name": share.dev.name,
                    "report_name": report,
                    "backend": share.dev.backend,
                    "type": share.dev.type,
                    "layers": [share.first, share.first + share.count],
                    "output_layer": bool(share.output),
                    "predicted_mib": {
                        "weights": mib["weights"],
                        "kv": mib["kv"],
                        "compute": mib["compute"],
                        "total": round(mib["weights"] + mib["kv"] + mib["compute"], 2),
                    },
                    "budget_mib": round(share.budget_mib, 1),
                    "calibrated": backend_model(share.dev.backend)[1],
                    **({"uma": True} if share.dev.uma and not share.dev.is_cpu else {}),
                    **({"cpu_driver": True} if share.dev.cpu_driver else {}),
                }
            )
        # llama.cpp's order: the head's CPU holds the first slots, then its GPUs
        if i == 0:
            got = got[-1:] + got[:-1]
        out.append(got)
    return out


def option_args(opts: Options) -> List[str]:
    """llama-server's arguments that do not depend on the split: context, slots, cache types."""
    args = ["-c", str(opts.context), "-np", str(opts.parallel)]
    if opts.cache_type_k != "f16":
        args += ["--cache-type-k", opts.cache_type_k]
    if opts.cache_type_v != "f16":
        args += ["--cache-type-v", opts.cache_type_v]
    return args


def llama_args(p: Placement, model: Model, opts: Options) -> Dict[str, Any]:
    """The plan's argument fields for a placement: :func:`split_args` + :func:`option_args`."""
    if p.head_layers + sum(p.worker_layers) != model.n_layer:
        raise ValueError(
            "the placement holds %d layers of %d" % (p.head_layers + sum(p.worker_layers), model.n_layer)
        )
    endpoints = [h.endpoint or "" for h in p.workers]
    if p.devices is not None:
        chain = [s for s in p.devices[0][:-1] if s.used]
        for row in p.devices[1:]:
            chain.extend(s for s in row if s.used)
        names = [s.dev.name for s in p.devices[0][:-1] if s.used]
        for got in rpc_device_names([sum(1 for s in row if s.used) for row in p.devices[1:]]):
            names += got
        counts = [s.count for s in chain]
        cpu_layers = p.devices[0][-1].count
        args = split_args(endpoints, cpu_layers, counts, p.output_on_head, devices=names)
        slot_counts = list(counts)
        if any(counts):
            slot_counts[max(i for i, c in enumerate(counts) if c > 0)] += 1
        return {
            "rpc": ",".join(endpoints),
            "tensor_split": tensor_split_for(slot_counts) if any(counts) else "",
            "layer_counts": list(p.worker_layers),
            "slot_counts": slot_counts,
            "devices": names,
            "llama_server_args": args + option_args(opts),
        }
    args = split_args(endpoints, p.head_layers, p.worker_layers, p.output_on_head)
    slot_counts = list(p.worker_layers)
    if slot_counts:
        slot_counts[-1] += 1
    return {
        "rpc": ",".join(endpoints),
        "tensor_split": tensor_split_for(slot_counts) if slot_counts else "",
        "layer_counts": list(p.worker_layers),
        "slot_counts": slot_counts,
        "llama_server_args": args + option_args(opts),
    }


def _vllm_stages(hosts: List[Host], weights: List[float], model: Model, opts: Options) -> Dict[str, Any]:
    """One pipeline stage per host, layers in proportion to `weights` with every stage holding at
    least one layer (largest remainder); KV space per rank for the context, in whole GiB (>= 1)."""
    hosts, weights = hosts[: model.n_layer], weights[: model.n_layer]
    rest = model.n_layer - len(hosts)
    total_w = sum(weights) or 1
    shares = [rest * w / total_w for w in weights]
    extra = [math.floor(s) for s in shares]
    for i in sorted(range(len(hosts)), key=lambda i: (shares[i] - extra[i], -i), reverse=True)[
        : rest - sum(extra)
    ]:
        extra[i] += 1
    counts = [1 + e for e in extra]
    start, kv_max, weights_mib = 0, 0.0, []
    for i, c in enumerate(counts):
        kv_max = max(kv_max, kv_bytes(model, range(start, start + c), opts))
        # What vLLM's rank i loads: its own layers, the embedding on the first rank, the final norm
        # and the lm_head on the last (a tied lm_head is the embedding again there).
        stage = sum(model.layer_bytes[start : start + c])
        if i == 0:
            stage += model.token_embd_bytes
        if i == len(counts) - 1:
            stage += model.output_bytes + model.output_norm_bytes
        weights_mib.append(round(stage / MIB, 3))
        start += c
    return {
        "pipeline_size": len(hosts),
        "pp_layer_partition": ",".join(str(c) for c in counts),
        "stages": [h.name for h in hosts],
        "kvcache_space_gib": max(1, math.ceil(kv_max / (1024.0 * MIB))),
        "stage_weights_mib": weights_mib,
    }


def vllm_partition(p: Placement, model: Model, opts: Options) -> Dict[str, Any]:
    """vLLM stages from the llama.cpp placement: one rank per host it uses (the head is rank 0),
    layers in proportion to that plan's layer counts."""
    return _vllm_stages(p.hosts(), [float(p.head_layers), *map(float, p.worker_layers)], model, opts)


def vllm_spread(model: Model, head: Host, workers: List[Host], opts: Options) -> Dict[str, Any]:
    """vLLM stages over the head and every worker (fastest first), layers in proportion to each
    host's budget (the lws target: the user chose the nodes)."""
    hosts = [head, *sorted(workers, key=lambda h: h.rank)]
    return _vllm_stages(hosts, [max(h.budget_mib, 1.0) for h in hosts], model, opts)


def plan_entry(p: Placement, model: Model, opts: Options) -> Dict[str, Any]:
    args = llama_args(p, model, opts)
    rows = _rows(p.head, p.workers, p.head_layers, p.worker_layers, p.output_on_head, p.predictions)
    for row, devices in zip(rows, device_rows(p, model, opts)):
        row["devices"] = devices
    return {"hosts": rows, "workers": [h.name for h in p.workers], **args}

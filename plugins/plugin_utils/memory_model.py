# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory model (its measured constants keyed by llama.cpp build in calibration.py, read
through ``Options.calibration``; docs/planner-accuracy.md):

- weights: the bytes of the tensors a host holds (the output layer where it lands; on the head
  the token embeddings, mapped from the file);
- KV: per layer, cells x (K + V row bytes of the cache type); full-attention layers have
  ``pad(context, 256)`` cells; sliding-window layers ``parallel x min(context/parallel,
  pad(window + ubatch, 256))``;
- compute: a worker 16 x n_ff x ubatch bytes + the attention masks (2 x ubatch bytes per cell of
  one sequence, for the full and the sliding window) + 0.5 MiB; the head 8 x n_embd x ubatch +
  the masks (+ the worker term when its CPU holds layers);
- process: the process itself at rest (rpc-server, llama-server);
- peak: while loading, a worker holds a staging copy of the tensor it is receiving, so its worst
  case is weights + max(KV + compute, largest tensor received) + process; ``peak`` is the part of
  that above weights + KV + compute + process;
- and a reserve per host (``llmfleet_reserve_mib``) kept free for the rest of the system.
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import CACHE_TYPES, KV_PAD, MIB
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Host, Model, Options

__metaclass__ = type


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _row_bytes(n: int, cache_type: str) -> float:
    block, size = CACHE_TYPES[cache_type]
    return n / block * size


def kv_cells(model: Model, il: int, opts: Options) -> int:
    ctx = _pad(opts.context, KV_PAD)
    if model.sliding_window > 0 and model.swa_layers[il]:
        per_seq = max(ctx // opts.parallel, 1)
        return opts.parallel * min(per_seq, _pad(model.sliding_window + opts.ubatch, KV_PAD))
    return ctx


def kv_bytes(model: Model, layers: range, opts: Options) -> float:
    total = 0.0
    for il in layers:
        cells = kv_cells(model, il, opts)
        k = _row_bytes(model.head_dim_k * model.n_head_kv[il], opts.cache_type_k)
        v = _row_bytes(model.head_dim_v * model.n_head_kv[il], opts.cache_type_v)
        total += cells * (k + v)
    return total


def _mask_bytes(model: Model, opts: Options) -> float:
    ubatch = min(opts.ubatch, opts.context)
    per_seq = max(_pad(opts.context, KV_PAD) // opts.parallel, 1)
    cells = per_seq
    if model.sliding_window > 0 and any(model.swa_layers):
        cells += min(per_seq, _pad(model.sliding_window + opts.ubatch, KV_PAD))
    return 2.0 * ubatch * cells


def _pp_extra(model: Model, opts: Options, pp: bool) -> float:
    """Extra compute buffer per device when llama.cpp pipelines: copies of the masks and inputs."""
    if not pp:
        return 0.0
    ubatch = min(opts.ubatch, opts.context)
    return (opts.calibration.pp_copies - 1) * (_mask_bytes(model, opts) + 4.0 * model.n_embd * ubatch)


def worker_compute_bytes(model: Model, opts: Options, pp: bool = False) -> float:
    ubatch = min(opts.ubatch, opts.context)
    return (
        16.0 * model.n_ff * ubatch
        + _mask_bytes(model, opts)
        + opts.calibration.compute_slack_mib * MIB
        + _pp_extra(model, opts, pp)
    )


def head_compute_bytes(model: Model, opts: Options, holds_layers: bool, pp: bool = False) -> float:
    ubatch = min(opts.ubatch, opts.context)
    base = 8.0 * model.n_embd * ubatch + _mask_bytes(model, opts) + _pp_extra(model, opts, pp)
    if holds_layers:
        base += 16.0 * model.n_ff * ubatch + opts.calibration.compute_slack_mib * MIB
    return base


def output_only_compute_bytes(model: Model, opts: Options) -> float:
    """A worker that holds only the output layer computes little more than the logits."""
    return 4.0 * model.n_vocab * opts.parallel + opts.calibration.compute_slack_mib * MIB


def pipelined(n_workers: int, head_layers: int, output_on_head: bool) -> bool:
    """Whether llama.cpp enables pipeline parallelism for this placement (see Calibration.pp_copies)."""
    return n_workers > 1 and head_layers == 0 and not output_on_head


@dataclasses.dataclass(frozen=True)
class Prediction:
    weights: float
    kv: float
    compute: float
    process: float
    peak: float

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.compute + self.process + self.peak

    def mib(self) -> Dict[str, float]:
        return {
            "weights": round(self.weights / MIB, 2),
            "kv": round(self.kv / MIB, 2),
            "compute": round(self.compute / MIB, 2),
            "process": round(self.process / MIB, 2),
            "peak": round(self.peak / MIB, 2),
            "total": round(self.total / MIB, 2),
        }


class _Costs:
    """Prefix sums over the layers for one model and options: O(1) range costs in the search."""

    def __init__(self, model: Model, opts: Options):
        self.model = model
        self.opts = opts
        self.w = [0.0]
        self.kv = [0.0]
        for il in range(model.n_layer):
            self.w.append(self.w[-1] + model.layer_bytes[il])
            self.kv.append(self.kv[-1] + kv_bytes(model, range(il, il + 1), opts))
        # sparse table for the largest tensor over a range of layers
        self.table = [list(model.layer_largest)]
        span = 1
        while span * 2 <= model.n_layer:
            prev = self.table[-1]
            self.table.append([max(prev[i], prev[i + span]) for i in range(len(prev) - span)])
            span *= 2
        self.head_cache: Dict[Tuple[Host, bool, bool], Optional[int]] = {}
        self.output_only = output_only_compute_bytes(model, opts)
        self.worker_compute = {
            False: worker_compute_bytes(model, opts),
            True: worker_compute_bytes(model, opts, True),
        }

    def largest(self, start: int, end: int) -> float:
        if end <= start:
            return 0.0
        k = (end - start).bit_length() - 1
        row = self.table[k]
        return float(max(row[start], row[end - (1 << k)]))

    def worker_total(self, start: int, end: int, output: bool, pp: bool = False) -> float:
        m = self.model
        if end <= start and not output:
            return self.opts.calibration.worker_process_mib * MIB
        weights = self.w[end] - self.w[start]
        largest = self.largest(start, end)
        if output:
            weights += m.output_bytes + m.output_norm_bytes
            largest = max(largest, float(m.output_bytes))
        kv = self.kv[end] - self.kv[start]
        compute = self.worker_compute[pp] if end > start else self.output_only
        return weights + self.opts.calibration.worker_process_mib * MIB + max(kv + compute, largest)


def predict_worker(model: Model, layers: range, output: bool, opts: Options, pp: bool = False) -> Prediction:
    """A worker (rpc-server) holding ``layers`` (and the output layer when ``output``)."""
    weights = float(sum(model.layer_bytes[il] for il in layers))
    largest = max([model.layer_largest[il] for il in layers] or [0])
    if output:
        weights += model.output_bytes + model.output_norm_bytes
        largest = max(largest, model.output_bytes)
    if not layers and not output:
        return Prediction(0.0, 0.0, 0.0, opts.calibration.worker_process_mib * MIB, 0.0)
    kv = kv_bytes(model, layers, opts)
    compute = worker_compute_bytes(model, opts, pp) if layers else output_only_compute_bytes(model, opts)
    peak = max(0.0, largest - (kv + compute))
    return Prediction(weights, kv, compute, opts.calibration.worker_process_mib * MIB, peak)


def predict_head(model: Model, layers: range, output: bool, opts: Options, pp: bool = False) -> Prediction:
    """The head (llama-server): token embeddings, its own CPU layers, the output when kept there."""
    weights = float(model.token_embd_bytes + model.other_bytes + sum(model.layer_bytes[il] for il in layers))
    if output:
        # a tied output layer on the head is the token embeddings again, mapped from the same
        # pages of the file (measured: the CPU_Mapped buffer does not grow)
        weights += model.output_norm_bytes + (0 if model.tied_output else model.output_bytes)
    kv = kv_bytes(model, layers, opts)
    compute = head_compute_bytes(model, opts, holds_layers=bool(layers), pp=pp)
    return Prediction(weights, kv, compute, opts.calibration.head_process_mib * MIB, 0.0)


@dataclasses.dataclass
class Placement:
    head: Host
    workers: List[Host]  # --rpc order; the last one holds the output slot
    head_layers: int
    worker_layers: List[int]
    output_on_head: bool  # kept on the head with a tensor override (or no workers at all)
    predictions: List[Prediction]  # head first, then workers (a device placement: each host's RAM)
    # a device placement (device_placement.py): per host (head first) its device shares
    devices: Optional[List[List[Any]]] = None

    @property
    def n_layer(self) -> int:
        return self.head_layers + sum(self.worker_layers)

    def hosts(self) -> List[Host]:
        return [self.head, *self.workers]

    def fits(self) -> bool:
        if self.devices is not None:
            from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import overflows

            return not overflows(self)
        return all(p.total <= h.budget_mib * MIB for h, p in zip(self.hosts(), self.predictions))

    def min_headroom_ratio(self) -> float:
        return min(
            (h.budget_mib * MIB - p.total) / max(h.budget_mib * MIB, 1.0)
            for h, p in zip(self.hosts(), self.predictions)
        )

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

The memory model (calibrated against llama.cpp 0c1e570, docs/planner-accuracy.md):

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
import itertools
import math
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils import targets
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import (
    check_hosts,
    check_options,
)

__metaclass__ = type

MIB = 1024 * 1024
KV_PAD = 256
WORKER_PROCESS_MIB = 6.0
HEAD_PROCESS_MIB = 30.0
COMPUTE_SLACK_MIB = 0.5
# llama.cpp's scheduler keeps this many copies of the graph inputs when it pipelines over
# several devices (GGML_SCHED_MAX_COPIES), which it does with more than one RPC device, every
# layer offloaded (-ngl > n_layer) and no tensor override.
PP_COPIES = 4
DEFAULT_RPC_PORT = 50052
DEFAULT_RESERVE_MIB = 64
# Search limits: subsets of more workers than this are chosen greedily, orders beyond this count
# are not enumerated (the speed order and the output choice are still tried).
MAX_EXACT_WORKERS = 10
MAX_ORDERS = 120

CACHE_TYPES: Dict[str, Tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}


class PlacementError(Exception):
    """No placement fits. ``table`` holds the best attempt's host rows, ``missing`` MiB per host."""

    def __init__(
        self,
        message: str,
        table: Optional[List[Dict[str, Any]]] = None,
        missing: Optional[Dict[str, float]] = None,
    ):
        super().__init__(message)
        self.table = table or []
        self.missing = missing or {}


# ---------------------------------------------------------------------------------------------
# Inputs


def budget_mib(usable_mib: Any, reserve_mib: Any) -> float:
    """What the plan may put on a host: its usable MiB minus its reserve (missing counts as 0)."""
    return float(usable_mib or 0) - float(reserve_mib or 0)


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    role: str  # head | worker
    usable_mib: float
    cpus: int = 1
    address: Optional[str] = None
    port: int = DEFAULT_RPC_PORT
    reserve_mib: float = DEFAULT_RESERVE_MIB
    speed: float = 0.0  # higher is faster; defaults to cpus

    @property
    def budget_mib(self) -> float:
        return budget_mib(self.usable_mib, self.reserve_mib)

    @property
    def endpoint(self) -> Optional[str]:
        if self.role == "head" or not self.address:
            return None
        addr = self.address
        if ":" in addr and not addr.startswith("["):
            addr = "[%s]" % addr
        return "%s:%d" % (addr, self.port)

    @property
    def rank(self) -> Tuple[float, float, str]:
        # sort key: fastest first, then the most room, then by name (stable, deterministic)
        return (-(self.speed or self.cpus), -self.usable_mib, self.name)


@dataclasses.dataclass(frozen=True)
class Options:
    context: int = 4096
    parallel: int = 1
    ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    output_layer: str = "auto"  # auto | worker | head
    link_mbit: Optional[float] = None
    head_layers: bool = True
    slow_link_mbit: float = 1000.0
    # vLLM stages: "fewest" follows the llama.cpp placement's hosts; "all" spreads over the head and
    # every candidate worker in proportion to their budgets (the lws target: the user chose the nodes)
    vllm_hosts: str = "fewest"
    min_workers: int = 0  # use at least this many workers (spare capacity, so fallbacks can fit)
    # auto | speed | memory: what the planner optimises once the memory fits (plugin_utils/speed_search.py);
    # the memory search here ignores it, it is recorded so that a change re-plans (planned_with)
    objective: str = "auto"

    def check(self) -> None:
        if self.context <= 0:
            raise ValueError("context must be positive, got %r" % self.context)
        if self.parallel <= 0:
            raise ValueError("parallel must be positive, got %r" % self.parallel)
        if self.ubatch <= 0:
            raise ValueError("ubatch must be positive, got %r" % self.ubatch)
        for name in (self.cache_type_k, self.cache_type_v):
            if name not in CACHE_TYPES:
                raise ValueError("unknown cache type %r (one of %s)" % (name, ", ".join(sorted(CACHE_TYPES))))
        if self.output_layer not in ("auto", "worker", "head"):
            raise ValueError("output_layer must be auto, worker or head, got %r" % self.output_layer)
        if self.objective not in ("auto", "speed", "memory"):
            raise ValueError("objective must be auto, speed or memory, got %r" % (self.objective,))


@dataclasses.dataclass(frozen=True)
class Model:
    """The parts of a layout the math reads (a view over ``GgufLayout.to_dict()``)."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_vocab: int
    n_head_kv: Tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    sliding_window: int
    swa_layers: Tuple[bool, ...]
    layer_bytes: Tuple[int, ...]
    layer_largest: Tuple[int, ...]
    token_embd_bytes: int
    output_bytes: int
    output_norm_bytes: int
    other_bytes: int
    tied_output: bool = False

    @classmethod
    def from_layout(cls, layout: Dict[str, Any]) -> Model:
        try:
            n_layer = int(layout["n_layer"])
            kv = layout["n_head_kv"]
            kv = [int(kv)] * n_layer if isinstance(kv, (int, float)) else [int(v) for v in kv]
            swa = layout.get("swa_layers") or [False] * n_layer
            largest = layout.get("layer_largest_tensor") or layout["layer_bytes"]
            model = cls(
                n_layer=n_layer,
                n_embd=int(layout["n_embd"]),
                n_ff=int(layout.get("n_ff") or 0),
                n_vocab=int(layout.get("n_vocab") or 0),
                n_head_kv=tuple(kv),
                head_dim_k=int(layout["head_dim_k"]),
                head_dim_v=int(layout.get("head_dim_v") or layout["head_dim_k"]),
                sliding_window=int(layout.get("sliding_window") or 0),
                swa_layers=tuple(bool(s) for s in swa),
                layer_bytes=tuple(int(b) for b in layout["layer_bytes"]),
                layer_largest=tuple(int(b) for b in largest),
                token_embd_bytes=int(layout["token_embd_bytes"]),
                output_bytes=int(layout["output_bytes"]),
                output_norm_bytes=int(layout.get("output_norm_bytes") or 0),
                other_bytes=int(layout.get("other_bytes") or 0),
                tied_output=bool(layout.get("tied_output")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError("model layout is incomplete or malformed: %s" % err) from err
        for field in ("n_head_kv", "swa_layers", "layer_bytes", "layer_largest"):
            if len(getattr(model, field)) != n_layer:
                raise ValueError(
                    "model layout: %s has %d entries for %d layers"
                    % (field, len(getattr(model, field)), n_layer)
                )
        if n_layer <= 0:
            raise ValueError("model layout: n_layer must be positive")
        return model


def hosts_from_dicts(
    head: Dict[str, Any], workers: Sequence[Dict[str, Any]], reserve_mib: float = DEFAULT_RESERVE_MIB
) -> Tuple[Host, List[Host]]:
    """Build Host objects from plain dicts ({name, usable_mib, cpus, address, port, reserve_mib, speed}).

    ``speed`` is either a number (the relative speed that orders hosts, ``llmfleet_speed``) or the
    measured figures ``{ms_per_layer, rtt_ms, mbit_s}``, which the speed objective reads and
    validates (plugins/plugin_utils/speed.py); figures leave the relative speed at its default.
    """
    head, workers, reserve_mib = check_hosts(head, workers, reserve_mib)  # refuses bad input by name

    def one(data: Dict[str, Any], role: str) -> Host:
        if "name" not in data:
            raise ValueError("a host entry has no name: %r" % (data,))
        try:
            usable = float(data["usable_mib"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                "host %s: usable_mib is missing or not a number (%r)" % (data["name"], data.get("usable_mib"))
            ) from err
        return Host(
            name=str(data["name"]),
            role=role,
            usable_mib=usable,
            cpus=int(data.get("cpus") or 1),
            address=data.get("address"),
            port=int(data.get("port") or DEFAULT_RPC_PORT),
            reserve_mib=float(data["reserve_mib"])
            if data.get("reserve_mib") is not None
            else float(reserve_mib),
            speed=_relative_speed(data),
        )

    names = [head.get("name")] + [w.get("name") for w in workers]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError("host names must be unique, repeated: %s" % ", ".join(map(str, dupes)))
    return one(head, "head"), [one(w, "worker") for w in workers]


def _relative_speed(data: Dict[str, Any]) -> float:
    value = data.get("speed")
    if value is None or isinstance(value, dict):
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(
            "host %s: speed must be a number or the figures {ms_per_layer, rtt_ms, mbit_s}, got %r"
            % (data.get("name"), value)
        ) from err


# ---------------------------------------------------------------------------------------------
# llama.cpp's split rule (float32, as in llama-model.cpp) and its inverse


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def assign_slots(tensor_split: Sequence[float], n_layer: int, ngl: int) -> List[int]:
    """Device index per slot (n_layer + 1 slots) as llama.cpp assigns them; -1 means the head's CPU.

    ``tensor_split`` has one weight per RPC device (``--rpc`` order). An all-zero split is not
    modelled here (it uses each device's reported memory): the planner never emits one.
    """
    n_dev = len(tensor_split)
    if n_dev == 0 or ngl <= 0:
        return [-1] * (n_layer + 1)
    if all(float(x) == 0.0 for x in tensor_split):
        raise ValueError("an all-zero tensor split is decided by llama.cpp from reported memory")
    splits: List[float] = []
    total = _f32(0.0)
    for x in tensor_split:
        total = _f32(total + _f32(float(x)))
        splits.append(total)
    splits = [_f32(s / total) for s in splits]
    cpu_slots = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    out: List[int] = []
    for il in range(n_layer + 1):
        if il < cpu_slots or il - cpu_slots >= act:
            out.append(-1)
            continue
        x = _f32(_f32(float(il - cpu_slots)) / act)
        # upper_bound: first index whose value is greater than x
        out.append(next((i for i, s in enumerate(splits) if s > x), n_dev))
    return out


def tensor_split_for(slot_counts: Sequence[int]) -> str:
    """The ``--tensor-split`` string that gives each RPC device exactly ``slot_counts[i]`` slots.

    Using the counts themselves makes llama.cpp's cumulative fractions exactly count/total, so
    the upper_bound lands on the intended device (the self-check in :func:`verify_split` proves
    it for every plan).
    """
    if not slot_counts or any(c < 0 for c in slot_counts) or sum(slot_counts) == 0:
        raise ValueError("slot counts must be non-negative with a positive sum: %r" % (list(slot_counts),))
    return ",".join(str(int(c)) for c in slot_counts)


def verify_split(tensor_split: str, slot_counts: Sequence[int], n_layer: int, ngl: int) -> None:
    ts = [float(x) for x in tensor_split.split(",")]
    slots = assign_slots(ts, n_layer, ngl)
    got = [slots.count(i) for i in range(len(ts))]
    if got != list(slot_counts):
        raise AssertionError("tensor split %s gives %r, wanted %r" % (tensor_split, got, list(slot_counts)))


# ---------------------------------------------------------------------------------------------
# Memory model


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
    return (PP_COPIES - 1) * (_mask_bytes(model, opts) + 4.0 * model.n_embd * ubatch)


def worker_compute_bytes(model: Model, opts: Options, pp: bool = False) -> float:
    ubatch = min(opts.ubatch, opts.context)
    return (
        16.0 * model.n_ff * ubatch
        + _mask_bytes(model, opts)
        + COMPUTE_SLACK_MIB * MIB
        + _pp_extra(model, opts, pp)
    )


def head_compute_bytes(model: Model, opts: Options, holds_layers: bool, pp: bool = False) -> float:
    ubatch = min(opts.ubatch, opts.context)
    base = 8.0 * model.n_embd * ubatch + _mask_bytes(model, opts) + _pp_extra(model, opts, pp)
    if holds_layers:
        base += 16.0 * model.n_ff * ubatch + COMPUTE_SLACK_MIB * MIB
    return base


def output_only_compute_bytes(model: Model, opts: Options) -> float:
    """A worker that holds only the output layer computes little more than the logits."""
    return 4.0 * model.n_vocab * opts.parallel + COMPUTE_SLACK_MIB * MIB


def pipelined(n_workers: int, head_layers: int, output_on_head: bool) -> bool:
    """Whether llama.cpp enables pipeline parallelism for this placement (see PP_COPIES)."""
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
            return WORKER_PROCESS_MIB * MIB
        weights = self.w[end] - self.w[start]
        largest = self.largest(start, end)
        if output:
            weights += m.output_bytes + m.output_norm_bytes
            largest = max(largest, float(m.output_bytes))
        kv = self.kv[end] - self.kv[start]
        compute = self.worker_compute[pp] if end > start else self.output_only
        return weights + WORKER_PROCESS_MIB * MIB + max(kv + compute, largest)


def predict_worker(model: Model, layers: range, output: bool, opts: Options, pp: bool = False) -> Prediction:
    """A worker (rpc-server) holding ``layers`` (and the output layer when ``output``)."""
    weights = float(sum(model.layer_bytes[il] for il in layers))
    largest = max([model.layer_largest[il] for il in layers] or [0])
    if output:
        weights += model.output_bytes + model.output_norm_bytes
        largest = max(largest, model.output_bytes)
    if not layers and not output:
        return Prediction(0.0, 0.0, 0.0, WORKER_PROCESS_MIB * MIB, 0.0)
    kv = kv_bytes(model, layers, opts)
    compute = worker_compute_bytes(model, opts, pp) if layers else output_only_compute_bytes(model, opts)
    peak = max(0.0, largest - (kv + compute))
    return Prediction(weights, kv, compute, WORKER_PROCESS_MIB * MIB, peak)


def predict_head(model: Model, layers: range, output: bool, opts: Options, pp: bool = False) -> Prediction:
    """The head (llama-server): token embeddings, its own CPU layers, the output when kept there."""
    weights = float(model.token_embd_bytes + model.other_bytes + sum(model.layer_bytes[il] for il in layers))
    if output:
        # a tied output layer on the head is the token embeddings again, mapped from the same
        # pages of the file (measured: the CPU_Mapped buffer does not grow)
        weights += model.output_norm_bytes + (0 if model.tied_output else model.output_bytes)
    kv = kv_bytes(model, layers, opts)
    compute = head_compute_bytes(model, opts, holds_layers=bool(layers), pp=pp)
    return Prediction(weights, kv, compute, HEAD_PROCESS_MIB * MIB, 0.0)


# ---------------------------------------------------------------------------------------------
# The search


@dataclasses.dataclass
class Placement:
    head: Host
    workers: List[Host]  # --rpc order; the last one holds the output slot
    head_layers: int
    worker_layers: List[int]
    output_on_head: bool  # kept on the head with a tensor override (or no workers at all)
    predictions: List[Prediction]  # head first, then workers

    @property
    def n_layer(self) -> int:
        return self.head_layers + sum(self.worker_layers)

    def hosts(self) -> List[Host]:
        return [self.head, *self.workers]

    def fits(self) -> bool:
        return all(p.total <= h.budget_mib * MIB for h, p in zip(self.hosts(), self.predictions))

    def min_headroom_ratio(self) -> float:
        return min(
            (h.budget_mib * MIB - p.total) / max(h.budget_mib * MIB, 1.0)
            for h, p in zip(self.hosts(), self.predictions)
        )


def _predict_all(
    model: Model,
    head: Host,
    workers: List[Host],
    head_layers: int,
    counts: List[int],
    output_on_head: bool,
    opts: Options,
) -> List[Prediction]:
    pp = pipelined(len(workers), head_layers, output_on_head)
    preds = [predict_head(model, range(0, head_layers), output_on_head or not workers, opts, pp)]
    start = head_layers
    for i, count in enumerate(counts):
        is_last = i == len(counts) - 1
        preds.append(
            predict_worker(model, range(start, start + count), is_last and not output_on_head, opts, pp)
        )
        start += count
    return preds


def _fill(
    costs: _Costs,
    head_layers: int,
    workers: List[Host],
    output_on_head: bool,
    ratio: float,
    last_ratio: Optional[float] = None,
) -> Optional[List[int]]:
    """Greedy contiguous fill after the head's layers: each worker takes what fits in ``ratio`` of
    its budget (at least one layer unless it is the last); the last takes the rest, within ``ratio``.
    Greedy is optimal for feasibility because a host's total only grows as it takes more layers.
    """
    n = costs.model.n_layer
    pp = pipelined(len(workers), head_layers, output_on_head)
    counts: List[int] = []
    start = head_layers
    for i, worker in enumerate(workers):
        if i == len(workers) - 1:
            limit = ratio if last_ratio is None else last_ratio
            if costs.worker_total(start, n, not output_on_head, pp) > worker.budget_mib * MIB * limit:
                return None
            counts.append(n - start)
            return counts
        budget = worker.budget_mib * MIB * ratio
        # leave at least one layer for every later worker that is not the last
        most = n - start - (len(workers) - 2 - i)
        take = 0
        while take < most and costs.worker_total(start, start + take + 1, False, pp) <= budget:
            take += 1
        if take == 0:
            return None
        counts.append(take)
        start += take
    return None


def may_fit(costs: _Costs, head: Host, workers: Sequence[Host]) -> bool:
    """A necessary condition for any placement on these hosts (no split, order or output choice
    fits when it fails): their room after each host's fixed part (the head's embeddings and
    compute, a worker's compute and process) holds every layer's weights and KV. A search skips
    the sets that fail it; the result is the same, found sooner."""
    m, opts = costs.model, costs.opts
    need = costs.w[m.n_layer] + costs.kv[m.n_layer]
    room = max(head.budget_mib * MIB - predict_head(m, range(0), False, opts).total, 0.0)
    fixed = costs.worker_compute[False] + WORKER_PROCESS_MIB * MIB
    room += sum(max(w.budget_mib * MIB - fixed, 0.0) for w in workers)
    return room >= need


def _head_layers(costs: _Costs, head: Host, output_on_head: bool, n_workers: int) -> Optional[int]:
    """How many leading layers the head's CPU takes: all that fit in its budget (or none by policy).
    Depends on the head, the output choice and whether there is more than one worker: memoised
    per search."""
    key = (head, output_on_head, n_workers > 1)
    if key not in costs.head_cache:
        costs.head_cache[key] = _head_layers_uncached(costs, head, output_on_head, n_workers)
    return costs.head_cache[key]


def _head_layers_uncached(costs: _Costs, head: Host, output_on_head: bool, n_workers: int) -> Optional[int]:
    model, opts = costs.model, costs.opts
    budget = head.budget_mib * MIB
    if predict_head(model, range(0), output_on_head, opts).total > budget:
        return None
    pp0 = pipelined(n_workers, 0, output_on_head)
    if not opts.head_layers or predict_head(model, range(0, 1), output_on_head, opts).total > budget:
        # no layer on the head: llama.cpp may pipeline, which costs the head more compute memory
        return 0 if predict_head(model, range(0), output_on_head, opts, pp0).total <= budget else None
    lo, hi = 0, model.n_layer
    while lo < hi:  # the head's total grows with every layer: binary search the largest that fits
        mid = (lo + hi + 1) // 2
        if predict_head(model, range(0, mid), output_on_head, opts).total <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _balanced(costs: _Costs, head: Host, workers: List[Host], output_on_head: bool) -> Optional[Placement]:
    """The feasible fill with the most even use of the workers (binary search on the fill ratio)."""
    model, opts = costs.model, costs.opts
    head_out = output_on_head or not workers
    head_layers = _head_layers(costs, head, head_out, len(workers))
    if head_layers is None:
        return None
    if not workers:
        if head_layers != model.n_layer:
            return None
        counts: List[int] = []
    else:
        best = _fill(costs, head_layers, workers, output_on_head, 1.0)
        if best is None:
            return None
        # 1: the lowest fill ratio every worker can stay under
        lo, hi = 0.0, 1.0
        for _unused in range(20):
            mid = (lo + hi) / 2
            got = _fill(costs, head_layers, workers, output_on_head, mid)
            if got is None:
                lo = mid
            else:
                hi, best = mid, got
        # 2: with the last worker (the output holder) kept under that ratio, even out the others
        top, lo = hi, 0.0
        for _unused in range(20):
            mid = (lo + hi) / 2
            got = _fill(costs, head_layers, workers, output_on_head, mid, last_ratio=top)
            if got is None:
                lo = mid
            else:
                hi, best = mid, got
        counts = best
    preds = _predict_all(model, head, workers, head_layers, counts, output_on_head, opts)
    placement = Placement(head, list(workers), head_layers, counts, head_out, preds)
    return placement if placement.fits() else None


def _orders(workers: Sequence[Host]) -> List[List[Host]]:
    """Candidate --rpc orders for one set of workers: each worker as the last (output) one, the
    others fastest first; then other permutations up to MAX_ORDERS."""
    base = sorted(workers, key=lambda h: h.rank)
    by_room = sorted(base, key=lambda h: (-h.budget_mib, h.rank))
    seen: List[Tuple[str, ...]] = []
    out: List[List[Host]] = []
    for last in by_room:
        order = [h for h in base if h is not last] + [last]
        key = tuple(h.name for h in order)
        if key not in seen:
            seen.append(key)
            out.append(order)
    if len(base) <= 4:
        for perm in itertools.permutations(base):
            if len(out) >= MAX_ORDERS:
                break
            key = tuple(h.name for h in perm)
            if key not in seen:
                seen.append(key)
                out.append(list(perm))
    return out


def _subsets(workers: List[Host], size: int) -> List[Tuple[Host, ...]]:
    ranked = sorted(workers, key=lambda h: h.rank)
    if len(ranked) > MAX_EXACT_WORKERS:
        return [tuple(ranked[:size]), tuple(sorted(ranked, key=lambda h: -h.budget_mib)[:size])]
    combos = list(itertools.combinations(ranked, size))
    index = {h.name: i for i, h in enumerate(ranked)}
    combos.sort(key=lambda c: sorted(index[h.name] for h in c))
    return combos


def _output_choices(opts: Options) -> List[bool]:
    if opts.output_layer == "head":
        return [True]
    if opts.output_layer == "worker":
        return [False]
    slow = opts.link_mbit is not None and opts.link_mbit < opts.slow_link_mbit
    return [True, False] if slow else [False, True]


def place(model: Model, head: Host, workers: List[Host], opts: Options) -> Tuple[Placement, List[str]]:
    """The placement on the fewest hosts that fit, or PlacementError. Returns (placement, reasons)."""
    opts.check()
    costs = _Costs(model, opts)
    reasons: List[str] = []
    for size in range(min(max(opts.min_workers, 0), len(workers)), len(workers) + 1):
        # within one size: the preferred output placement first, then the fastest subset
        for output_on_head in _output_choices(opts) if size else [True]:
            for subset in _subsets(workers, size) if size else [()]:
                if size and not may_fit(costs, head, subset):
                    continue
                best: Optional[Placement] = None
                for order in _orders(subset) if size else [[]]:
                    got = _balanced(costs, head, order, output_on_head)
                    if got is not None and (
                        best is None or got.min_headroom_ratio() > best.min_headroom_ratio() + 1e-9
                    ):
                        best = got
                if best is not None:
                    reasons.extend(_explain(best, workers, opts))
                    return best, reasons
    raise _refusal(model, head, workers, opts)


def _explain(p: Placement, candidates: List[Host], opts: Options) -> List[str]:
    out: List[str] = []
    used = {h.name for h in p.workers}
    if not p.workers:
        out.append("the head %s holds the whole model: no RPC worker is needed" % p.head.name)
    elif p.output_on_head:
        why = "the link is slow (%s Mbit/s)" % opts.link_mbit if opts.link_mbit is not None else "policy"
        out.append("output layer kept on the head %s with a tensor override: %s" % (p.head.name, why))
    else:
        out.append(
            "output layer on %s: the last worker in --rpc order, chosen for its room" % p.workers[-1].name
        )
    if p.head_layers:
        out.append(
            "the head %s holds layers 0-%d on its own CPU (its RAM is used before any worker)"
            % (p.head.name, p.head_layers - 1)
        )
    for h in candidates:
        if h.name not in used:
            out.append("%s left out: not needed, the model fits on fewer hosts" % h.name)
    if len(p.workers) > 1:
        out.append(
            "workers in --rpc order: %s (fastest first, the output holder last)"
            % ", ".join(h.name for h in p.workers)
        )
    return out


def _refusal(model: Model, head: Host, workers: List[Host], opts: Options) -> PlacementError:
    """The error for a fleet that cannot hold the model: the best attempt on all hosts."""
    order = sorted(workers, key=lambda h: h.rank)
    if order:
        last = max(order, key=lambda h: h.budget_mib)
        order = [h for h in order if h is not last] + [last]
    # spread the layers in proportion to each worker's budget (the head first, greedily)
    head_out = not order or opts.output_layer == "head"
    head_layers = 0
    if opts.head_layers:
        while (
            head_layers < model.n_layer
            and predict_head(model, range(0, head_layers + 1), head_out, opts).total <= head.budget_mib * MIB
        ):
            head_layers += 1
    if not order:
        head_layers = model.n_layer
        counts: List[int] = []
    else:
        rest = model.n_layer - head_layers
        budgets = [max(h.budget_mib, 1.0) for h in order]
        shares = [rest * b / sum(budgets) for b in budgets]
        counts = [math.floor(s) for s in shares]
        for i in sorted(range(len(order)), key=lambda i: shares[i] - counts[i], reverse=True)[
            : rest - sum(counts)
        ]:
            counts[i] += 1
    preds = _predict_all(model, head, order, head_layers, counts, head_out, opts)
    rows = _rows(head, order, head_layers, counts, head_out, preds)
    missing = {r["name"]: round(-r["headroom_mib"], 1) for r in rows if r["headroom_mib"] < 0}
    need = sum(p.total for p in preds) / MIB
    have = sum(h.budget_mib for h in [head, *order])
    msg = (
        "the model does not fit on this fleet: it needs about %.0f MiB, the hosts offer %.0f MiB after reserves"
        % (need, have)
    )
    if missing:
        msg += "; missing: " + ", ".join("%s %.1f MiB" % (k, v) for k, v in missing.items())
    else:
        msg += "; no split into whole layers fits every host"
    return PlacementError(msg + "\n" + render_table(rows), rows, missing)


# ---------------------------------------------------------------------------------------------
# Output: plan rows, arguments, fallbacks, vLLM


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
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        out.append(
            "  ".join(
                c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def llama_args(p: Placement, model: Model, opts: Options) -> Dict[str, Any]:
    """--rpc, --tensor-split, -ngl, -sm, -ot, -c, -np for a placement (checked against the rule)."""
    n = model.n_layer
    args: List[str] = []
    rpc = ",".join(h.endpoint or "" for h in p.workers)
    ts = ""
    slot_counts: List[int] = []
    if p.workers:
        ngl = n + 1 - p.head_layers
        slot_counts = list(p.worker_layers)
        slot_counts[-1] += 1  # the output slot goes to the last device with a share
        ts = tensor_split_for(slot_counts)
        verify_split(ts, slot_counts, n, ngl)
        args += ["--rpc", rpc, "--tensor-split", ts, "-ngl", str(ngl), "-sm", "layer"]
        if p.output_on_head:
            args += ["-ot", r"^(output|token_embd)\.weight$=CPU"]
    else:
        args += ["-ngl", "0"]
    args += ["-c", str(opts.context), "-np", str(opts.parallel)]
    if opts.cache_type_k != "f16":
        args += ["--cache-type-k", opts.cache_type_k]
    if opts.cache_type_v != "f16":
        args += ["--cache-type-v", opts.cache_type_v]
    return {
        "rpc": rpc,
        "tensor_split": ts,
        "layer_counts": list(p.worker_layers),
        "slot_counts": slot_counts,
        "llama_server_args": args,
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
    return {"hosts": rows, "workers": [h.name for h in p.workers], **args}


# A placement strategy: (model, head, candidate workers, options) -> (placement, reasons, reasons
# per left-out worker). ``place`` (fewest hosts, memory) is the default; the speed objective
# passes its own (plugins/plugin_utils/speed_search.py). It raises PlacementError when nothing fits.
Placer = Callable[[Model, Host, List[Host], Options], Tuple[Placement, List[str], Dict[str, str]]]
# Extra plan fields computed from the chosen placement (the speed prediction).
Annotate = Callable[[Placement, Model, Options], Dict[str, Any]]

NOT_NEEDED = "not needed: the model fits on fewer hosts"


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
    opts = Options(**check_options(options))
    opts.check()
    model = Model.from_layout(layout)
    head_host, worker_hosts = hosts_from_dicts(head, workers, reserve_mib)
    placer = placer or memory_placer
    placement, reasons, left_out = placer(model, head_host, worker_hosts, opts)
    entry = plan_entry(placement, model, opts)
    used = {h.name for h in placement.workers}
    plan: Dict[str, Any] = {
        "version": 1,
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
    if layout.get("weights_dtype_bytes"):
        # A Hugging Face checkpoint says its element width; the lws role scales to the served dtype.
        plan["vllm"]["weights_dtype_bytes"] = int(layout["weights_dtype_bytes"])
    if annotate is not None:
        plan.update(annotate(placement, model, opts))
    plan["fallbacks"] = fallback_plans(model, head_host, placement.workers, opts, placer) if fallbacks else []
    plan["planned_with"] = planned_with(head_host, worker_hosts, opts, reserve_mib)
    return plan


def planned_with(head: Host, workers: Sequence[Host], opts: Options, reserve_mib: float) -> Dict[str, Any]:
    """The inputs a plan was computed from, except the measurements (usable MiB).

    Recorded in the plan so that a later run can tell whether the same inputs would be planned
    again (``keep_previous``): the options, the default reserve and every candidate host with its
    address, port, cpus, reserve and speed.
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
    opts = Options(**check_options(options))
    opts.check()
    head_host, worker_hosts = hosts_from_dicts(head, workers, reserve_mib)
    if not isinstance(previous, dict) or not previous:
        return {"keep": False, "reasons": ["no previous plan"], "hosts": [], "table": ""}
    if previous.get("version") != 1 or not isinstance(previous.get("hosts"), list) or not previous["hosts"]:
        return {
            "keep": False,
            "reasons": ["the previous plan is not a version 1 plan with hosts"],
            "hosts": [],
            "table": "",
        }
    changes = _changed_inputs(
        previous, layout, model, planned_with(head_host, worker_hosts, opts, reserve_mib), backend, target
    )
    if changes:
        return {
            "keep": False,
            "reasons": ["the inputs changed: " + "; ".join(changes)],
            "hosts": [],
            "table": "",
        }
    current = {h.name: h for h in [head_host, *worker_hosts]}
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
        "version": 1,
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
    for key, value in body.items():
        if key not in plan:
            plan[key] = value
    return plan


def host_from_fact(
    name: str,
    fact: Any,
    address: Optional[str] = None,
    port: Optional[int] = None,
    reserve_mib: Optional[float] = None,
    speed: Optional[Any] = None,
) -> Dict[str, Any]:
    """One placement host from a probe fact (``llmfleet_host``: memory.usable_mib, cpus, default_ipv4)."""
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
    if isinstance(speed, dict):
        out["speed"] = dict(speed)  # measured figures, validated by the planner (plugin_utils/speed.py)
    elif speed:
        out["speed"] = float(speed)
    return out

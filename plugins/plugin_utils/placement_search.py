# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The search: the fewest hosts (then the most balanced) that hold the model, each within its
budget; the refusal naming the MiB missing per host (pure).
"""

from __future__ import absolute_import, annotations, division, print_function

import itertools
import math
from typing import List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import (
    MEMORY_EXACT_WORKERS,
    MEMORY_MAX_ORDERS,
    MIB,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import (
    Placement,
    Prediction,
    _Costs,
    pipelined,
    predict_head,
    predict_worker,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Host,
    Model,
    Options,
    PlacementError,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import _rows, render_table

__metaclass__ = type


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
    fixed = costs.worker_compute[False] + opts.calibration.worker_process_mib * MIB
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


def _memory_orders(workers: Sequence[Host]) -> List[List[Host]]:
    """Candidate --rpc orders for one set of workers: each worker as the last (output) one, the
    others fastest first; then other permutations up to MEMORY_MAX_ORDERS."""
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
            if len(out) >= MEMORY_MAX_ORDERS:
                break
            key = tuple(h.name for h in perm)
            if key not in seen:
                seen.append(key)
                out.append(list(perm))
    return out


def _subsets(workers: List[Host], size: int) -> List[Tuple[Host, ...]]:
    ranked = sorted(workers, key=lambda h: h.rank)
    if len(ranked) > MEMORY_EXACT_WORKERS:
        return [tuple(ranked[:size]), tuple(sorted(ranked, key=lambda h: -h.budget_mib)[:size])]
    combos = list(itertools.combinations(ranked, size))
    index = {h.name: i for i, h in enumerate(ranked)}
    combos.sort(key=lambda c: sorted(index[h.name] for h in c))
    return combos


def _memory_output_choices(opts: Options) -> List[bool]:
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
        for output_on_head in _memory_output_choices(opts) if size else [True]:
            for subset in _subsets(workers, size) if size else [()]:
                if size and not may_fit(costs, head, subset):
                    continue
                best: Optional[Placement] = None
                for order in _memory_orders(subset) if size else [[]]:
                    got = _balanced(costs, head, order, output_on_head)
                    if got is not None and (
                        best is None or got.min_headroom_ratio() > best.min_headroom_ratio() + 1e-9
                    ):
                        best = got
                if best is not None:
                    reasons.extend(_explain_memory(best, workers, opts))
                    return best, reasons
    raise _memory_refusal(model, head, workers, opts)


def _explain_memory(p: Placement, candidates: List[Host], opts: Options) -> List[str]:
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


def _memory_refusal(model: Model, head: Host, workers: List[Host], opts: Options) -> PlacementError:
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

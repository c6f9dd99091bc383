# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Place for speed: among the placements that fit memory, the fastest (docs/planner.md, "Speed").

The memory model and its checks are placement.py's, unchanged: a candidate is kept only when
``Placement.fits()`` holds for it, exactly as for the memory objective. The search:

- worker sets: every subset of the candidates (at least ``min_workers``) up to
  ``SPEED_EXACT_WORKERS`` candidates; beyond, the prefixes of the candidates ranked by time per layer
  (and, second, by room), a documented heuristic;
- ``--rpc`` orders: every order of a set of up to ``SPEED_MAX_PERMUTED`` workers; beyond, each worker of
  the set as the last one (the output holder), the others fastest first;
- the output layer on the head or on the last worker (``output_layer`` policy permitting);
- for one order and output holder, the split with the least compute time that fits, by dynamic
  programming over (worker, first layer): exact, as the time of a split is the sum of its hosts'
  layers x ms_per_layer and each host's memory grows with its range of layers.

Sets are tried by a lower bound (their link terms + every layer at the fastest host's cost) and
the search stops once the bound reaches the best time found. The memory placement is always a
candidate, so the speed objective never refuses what the memory objective places and is never
predicted slower than it.
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import (
    DEFAULT_RESERVE_MIB,
    MIB,
    SPEED_EXACT_WORKERS,
    SPEED_MAX_LAST,
    SPEED_MAX_PERMUTED,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import device_placer_for
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_speed import DeviceSpeedPlacer
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import (
    Placement,
    _Costs,
    pipelined,
    predict_head,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Host,
    Model,
    Options,
    PlacementError,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_search import (
    _predict_all,
    may_fit,
    place,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed import (
    Estimate,
    Figures,
    assumed_devices,
    estimate,
    estimate_placement,
    figures_for,
    link_terms,
    links_bound,
    output_layer_equivalents,
    speed_output_choices,
)

__metaclass__ = type

INF = float("inf")


@dataclasses.dataclass
class Best:
    ms: float = INF
    placement: Optional[Placement] = None


class Reach:
    """What a worker of a given budget can hold, from the memory model, memoised per search (the
    same budgets recur over sets, orders and fallbacks).

    ``ends(budget, pp)[s]``: the furthest end e such that layers s..e-1 fit without the output (a
    host's total only grows with its range, so one pass of two pointers finds every s);
    ``last(budget, holds, pp)[s]``: whether layers s..n-1 (and the output when ``holds``) fit.
    """

    def __init__(self, costs: _Costs):
        self.costs = costs
        self._ends: Dict[Tuple[float, bool], List[int]] = {}
        self._last: Dict[Tuple[float, bool, bool], List[bool]] = {}

    def ends(self, budget: float, pp: bool) -> List[int]:
        key = (budget, pp)
        if key not in self._ends:
            n = self.costs.model.n_layer
            out = [0] * (n + 1)
            e = 0
            for s in range(n + 1):
                e = max(e, s)
                while e < n and self.costs.worker_total(s, e + 1, False, pp) <= budget:
                    e += 1
                out[s] = e
            self._ends[key] = out
        return self._ends[key]

    def last(self, budget: float, holds: bool, pp: bool) -> List[bool]:
        key = (budget, holds, pp)
        if key not in self._last:
            n = self.costs.model.n_layer
            self._last[key] = [
                (s < n or holds) and self.costs.worker_total(s, n, holds, pp) <= budget for s in range(n + 1)
            ]
        return self._last[key]


def _worker_table(
    reach: Reach,
    workers: Sequence[Host],
    figures: Dict[str, Figures],
    output_on_head: bool,
    pp: bool,
    limits: Optional[Dict[str, int]] = None,
) -> Tuple[List[List[float]], List[List[int]]]:
    """g[i][s]: least compute ms for layers s..n-1 on workers i..k-1 in this order (INF: no fit);
    take[i][s]: the layers worker i takes in that optimum. A worker in the chain holds at least
    one layer, the last one may hold the output alone. ``limits``: host -> the most layers it may
    take (a quota'd host under a target time per token, :func:`_split_under_caps`)."""
    n = reach.costs.model.n_layer
    k = len(workers)
    limits = limits or {}
    g = [[INF] * (n + 1) for _unused in range(k + 1)]
    take = [[0] * (n + 1) for _unused in range(k + 1)]
    g[k][n] = 0.0
    for i in range(k - 1, -1, -1):
        w = workers[i]
        budget = w.budget_mib * MIB
        ms = figures[w.name].ms_per_layer
        most = limits.get(w.name, n)
        row, row_take = g[i], take[i]
        if i == k - 1:
            fits = reach.last(budget, not output_on_head, pp)
            for s in range(n + 1):
                if fits[s] and n - s <= most:
                    row[s] = (n - s) * ms
                    row_take[s] = n - s
            continue
        ends = reach.ends(budget, pp)
        if most < n:
            ends = [min(e, s + most) for s, e in enumerate(ends)]
        nxt = g[i + 1]
        for s in range(n):
            best, best_t = INF, 0
            for e in range(s + 1, ends[s] + 1):
                rest = nxt[e]
                if rest < INF and (e - s) * ms + rest < best - 1e-12:
                    best, best_t = (e - s) * ms + rest, e - s
            row[s], row_take[s] = best, best_t
    return g, take


def _fastest_split(
    reach: Reach,
    head: Host,
    workers: List[Host],
    figures: Dict[str, Figures],
    output_on_head: bool,
    limits: Optional[Dict[str, int]] = None,
) -> Optional[Tuple[float, int, List[int]]]:
    """(compute ms, head layers, worker layers) of the split with the least compute that fits, for
    one --rpc order and output holder (each host within its ``limits``), or None."""
    model, opts = reach.costs.model, reach.costs.opts
    n, k = model.n_layer, len(workers)
    head_out = output_on_head or not workers
    budget = head.budget_mib * MIB
    head_ms = figures[head.name].ms_per_layer
    limits = limits or {}
    if any(v < 0 for v in limits.values()):
        return None  # a holder whose cap is above the target with the output alone
    tables: Dict[bool, Tuple[List[List[float]], List[List[int]]]] = {}
    best: Optional[Tuple[float, int, List[int]]] = None
    for h in range(0, min(n if opts.head_layers else 0, limits.get(head.name, n)) + 1):
        pp = pipelined(k, h, head_out)
        if predict_head(model, range(0, h), head_out, opts, pp).total > budget:
            if h > 0:
                break  # the head's total only grows with its layers
            continue
        if not workers:
            if h == n:
                best = (h * head_ms, h, [])
            continue
        if pp not in tables:
            tables[pp] = _worker_table(reach, workers, figures, output_on_head, pp, limits)
        g, take = tables[pp]
        if g[0][h] == INF:
            continue
        total = h * head_ms + g[0][h]
        if best is None or total < best[0] - 1e-12:
            counts, s = [], h
            for i in range(k):
                counts.append(take[i][s])
                s += take[i][s]
            best = (total, h, counts)
    return best


def _split_under_caps(
    reach: Reach,
    head: Host,
    workers: List[Host],
    figures: Dict[str, Figures],
    output_on_head: bool,
) -> Optional[Tuple[float, int, List[int]]]:
    """(ms, head layers, worker layers) of the fastest split for one order and output holder,
    the CPU quota caps counted (speed.py: ms per token = max(the chain, every cap)); without a
    quota'd host, :func:`_fastest_split`'s answer (its ms the compute alone).

    The least-compute split is the answer when no cap binds. Else the target T of the caps is
    searched: under T each quota'd host may hold at most the layers whose cap stays within T, and
    the least-compute split under those limits has a chain S(T) that only falls as T grows; the
    best time is where S(T) meets T, found by bisection over the caps' own values (each host's
    cap at 0..n layers)."""
    model = reach.costs.model
    n = model.n_layer
    head_out = output_on_head or not workers
    eq = output_layer_equivalents(model)
    holder = head.name if head_out else workers[-1].name
    hosts = [head, *workers]
    capped = [h for h in hosts if figures[h.name].cpu_quota]
    if not capped:
        return _fastest_split(reach, head, workers, figures, output_on_head)  # the chain is the time

    def timed(limits: Optional[Dict[str, int]]) -> Optional[Tuple[float, float, int, List[int]]]:
        got = _fastest_split(reach, head, workers, figures, output_on_head, limits)
        if got is None:
            return None
        _c, h, counts = got
        est = estimate(model, head, workers, h, counts, head_out, figures)
        if est is None:
            return None
        return est.ms_per_token, est.chain_ms, h, counts

    free = timed(None)
    if free is None or free[0] <= free[1] + 1e-9:
        return None if free is None else (free[0], free[2], free[3])
    targets = sorted(
        {
            c
            for w in capped
            for layers in range(n + 1)
            for c in [
                figures[w.name].cap_ms(layers, figures[w.name].output_cpu(eq) if w.name == holder else 0.0)
            ]
            if c is not None and c > 0
        }
    )

    def limits_at(target: float) -> Dict[str, int]:
        return {
            w.name: figures[w.name].max_layers(
                target, figures[w.name].output_cpu(eq) if w.name == holder else 0.0
            )
            or 0
            for w in capped
        }

    seen: Dict[int, Optional[Tuple[float, float, int, List[int]]]] = {}

    def at(i: int) -> Optional[Tuple[float, float, int, List[int]]]:
        if i not in seen:
            seen[i] = timed(limits_at(targets[i] * (1 + 1e-9)))
        return seen[i]

    # the first target whose chain is within it: there the time is at most the target; below
    # it the time is the chain, least at the largest target below (both are looked at)
    lo, hi = 0, len(targets) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        got = at(mid)
        if got is not None and got[1] <= targets[mid] + 1e-9:
            hi = mid - 1
        else:
            lo = mid + 1
    best = free
    for i in (lo - 1, lo):
        if 0 <= i < len(targets):
            got = at(i)
            if got is not None and got[0] < best[0] - 1e-9:
                best = got
    return best[0], best[2], best[3]


def _speed_orders(
    workers: Sequence[Host], figures: Dict[str, Figures], output_on_head: bool
) -> List[List[Host]]:
    """Every order of a small set; beyond, the others fastest first and as the last one: each worker
    (up to SPEED_EXACT_WORKERS), else the SPEED_MAX_LAST with the most room and the cheapest links."""
    ranked = sorted(workers, key=lambda w: (figures[w.name].ms_per_layer, w.name))
    if len(ranked) <= SPEED_MAX_PERMUTED:
        return [list(p) for p in itertools.permutations(ranked)]
    lasts = ranked
    if len(ranked) > SPEED_EXACT_WORKERS:
        by_room = sorted(ranked, key=lambda w: (-w.budget_mib, w.name))
        by_link = sorted(
            ranked, key=lambda w: (figures[w.name].transfer_ms(1.0), figures[w.name].rtt_ms, w.name)
        )
        lasts = list(
            dict.fromkeys([*by_room[:SPEED_MAX_LAST], *([] if output_on_head else by_link[:SPEED_MAX_LAST])])
        )
    return [[w for w in ranked if w is not last] + [last] for last in lasts]


def _compute_bound(
    costs: _Costs,
    head: Host,
    workers: Sequence[Host],
    figures: Dict[str, Figures],
    head_room: float,
    layer_min: float,
) -> Optional[float]:
    """A lower bound of the compute ms of any split over these hosts (None: no split fits): every
    host holds at most room / (the cheapest layer's weights + KV) layers, the fastest fill first."""
    n = costs.model.n_layer
    fixed = costs.worker_compute[False] + costs.opts.calibration.worker_process_mib * MIB
    caps = []
    if costs.opts.head_layers:
        caps.append((figures[head.name].ms_per_layer, int(max(head_room, 0.0) // max(layer_min, 1.0))))
    for w in workers:
        room = max(w.budget_mib * MIB - fixed, 0.0)
        caps.append((figures[w.name].ms_per_layer, int(room // max(layer_min, 1.0))))
    left, total = n, 0.0
    for ms, cap in sorted(caps):
        take = min(cap, left)
        total += take * ms
        left -= take
        if not left:
            return total
    return None


def _candidate_sets(workers: List[Host], figures: Dict[str, Figures], lo: int) -> List[Tuple[Host, ...]]:
    if len(workers) <= SPEED_EXACT_WORKERS:
        return [c for size in range(lo, len(workers) + 1) for c in itertools.combinations(workers, size)]
    by_speed = sorted(workers, key=lambda w: (figures[w.name].ms_per_layer, -w.budget_mib, w.name))
    by_room = sorted(workers, key=lambda w: (-w.budget_mib, figures[w.name].ms_per_layer, w.name))
    out: List[Tuple[Host, ...]] = []
    seen = set()
    for size in range(lo, len(workers) + 1):
        for ranked in (by_speed, by_room):
            combo = tuple(ranked[:size])
            key = frozenset(w.name for w in combo)
            if key not in seen:
                seen.add(key)
                out.append(combo)
    return out


def fastest(
    model: Model,
    head: Host,
    workers: List[Host],
    opts: Options,
    figures: Dict[str, Figures],
    reach: Optional[Reach] = None,
) -> Optional[Placement]:
    """The fastest placement that fits memory (None when none fits). ``reach`` may carry the
    memo of an earlier search with the same model and options (the fallbacks)."""
    if (
        reach is None
        or reach.costs.model is not model
        or dataclasses.replace(reach.costs.opts, min_workers=opts.min_workers) != opts
    ):
        reach = Reach(_Costs(model, opts))
    costs = reach.costs
    lo = min(max(opts.min_workers, 0), len(workers))
    n = model.n_layer
    head_room = head.budget_mib * MIB - predict_head(model, range(0), False, opts).total
    layer_min = min(costs.w[i + 1] - costs.w[i] + costs.kv[i + 1] - costs.kv[i] for i in range(n))
    # every placement pays the head's per-token time and the output layer on one of the hosts
    eq = output_layer_equivalents(model)
    token = figures[head.name].token_ms or 0.0
    candidates = []
    for combo in _candidate_sets(workers, figures, lo):
        if not may_fit(costs, head, combo):
            continue  # this set cannot hold the layers, whatever the split
        compute = _compute_bound(costs, head, combo, figures, head_room, layer_min)
        if compute is None:
            continue
        for out in speed_output_choices(opts) if combo else [True]:
            holders = [head] if out or not combo else combo
            output = min(figures[h.name].output_time(eq) for h in holders)
            bound = token + output + links_bound(model, combo, figures, out) + compute
            candidates.append((bound, len(combo), [w.name for w in combo], combo, out))
    candidates.sort(key=lambda c: (c[0], c[1], c[2], c[4]))
    best = Best()
    for bound, _size, _names, combo, out in candidates:
        if bound >= best.ms - 1e-9:
            break
        for order in _speed_orders(combo, figures, out) if combo else [[]]:
            got = _split_under_caps(reach, head, order, figures, out)
            if got is None:
                continue
            _ms, h, counts = got
            head_out = out or not order
            est = estimate(model, head, order, h, counts, head_out, figures)
            ms = est.ms_per_token if est is not None else INF
            if ms < best.ms - 1e-9:
                preds = _predict_all(model, head, order, h, counts, head_out, opts)
                placement = Placement(head, list(order), h, counts, head_out, preds)
                if placement.fits():
                    best = Best(ms, placement)
    return best.placement


def _left_out_reason(w: Host, p: Placement, figures: Dict[str, Figures], model: Model) -> str:
    used = [(h, n) for h, n in zip(p.hosts(), [p.head_layers, *p.worker_layers]) if n > 0]
    ref = min(used, key=lambda hn: figures[hn[0].name].ms_per_layer)[0] if used else p.head
    mine, theirs = figures[w.name].ms_per_layer, figures[ref.name].ms_per_layer
    capped = figures[w.name].cap_ms(1.0)
    if capped is not None and capped > mine and capped > theirs * 1.05:
        return (
            "its CPU quota %g caps it at %.4g ms per layer (%.4g ms of CPU a layer), %.1fx %s's %g ms;"
            " the model fits without it"
            % (
                figures[w.name].cpu_quota,
                capped,
                capped * figures[w.name].cpu_quota,
                capped / theirs,
                ref.name,
                theirs,
            )
        )
    if mine > theirs * 1.05:
        return "%.1fx slower per layer than %s (%g vs %g ms); the model fits without it" % (
            mine / theirs,
            ref.name,
            mine,
            theirs,
        )
    link = link_terms(model, w.name, figures[w.name], False)
    return (
        "its link would add %.2f ms per token (rtt %g ms, %g Mbit/s), more than its layers save;"
        " the model fits without it" % (link["total_ms"], figures[w.name].rtt_ms, figures[w.name].mbit_s)
    )


def speed_placer(figures: Dict[str, Figures]) -> P.Placer:
    """A placement strategy for placement.plan_llama_cpp: the fastest, else the memory placement."""

    memo: Dict[str, Reach] = {}

    def placer(
        model: Model, head: Host, workers: List[Host], opts: Options
    ) -> Tuple[Placement, List[str], Dict[str, str]]:
        # the fallbacks differ from the plan in min_workers only: one memo of what fits
        key = repr(dataclasses.replace(opts, min_workers=0))
        if key not in memo or memo[key].costs.model is not model:
            memo[key] = Reach(_Costs(model, dataclasses.replace(opts, min_workers=0)))
        try:
            memory, memory_reasons = place(model, head, workers, opts)
        except PlacementError:
            memory, memory_reasons = None, []
        found = fastest(model, head, workers, opts, figures, memo[key])
        mem_est = estimate_placement(memory, model, figures) if memory is not None else None
        est = estimate_placement(found, model, figures) if found is not None else None
        if (
            found is None
            or est is None
            or (mem_est is not None and mem_est.ms_per_token <= est.ms_per_token + 1e-9)
        ):
            if memory is None:
                raise _speed_refusal(model, head, workers, opts)
            line = "objective speed: the memory placement is the fastest that fits"
            if mem_est is not None:
                line += " (predicted %.2f tokens/s)" % (1000.0 / mem_est.ms_per_token)
            return memory, [line, *memory_reasons], {}
        reasons = _explain_speed(found, est, mem_est, figures, model)
        used = {w.name for w in found.workers}
        left = {w.name: _left_out_reason(w, found, figures, model) for w in workers if w.name not in used}
        return found, reasons, left

    return placer


def _speed_refusal(model: Model, head: Host, workers: List[Host], opts: Options) -> PlacementError:
    try:
        place(model, head, workers, opts)
    except PlacementError as err:
        return err
    return PlacementError("the model does not fit on this fleet")


def _explain_speed(
    p: Placement, est: Estimate, mem_est: Optional[Estimate], figures: Dict[str, Figures], model: Model
) -> List[str]:
    out = [
        "objective speed: predicted %.2f tokens/s (%.2f ms per token)%s"
        % (
            1000.0 / est.ms_per_token,
            est.ms_per_token,
            "; the memory placement: %.2f tokens/s" % (1000.0 / mem_est.ms_per_token) if mem_est else "",
        )
    ]
    if not p.workers:
        out.append("the head %s holds the whole model: every worker would make a token slower" % p.head.name)
    elif p.output_on_head:
        last = p.workers[-1]
        logits = link_terms(model, last.name, figures[last.name], True)["logits_ms"]
        out.append(
            "output layer kept on the head %s with a tensor override: the logits would cost %.2f ms per token"
            " over %s's link" % (p.head.name, logits, last.name)
        )
    else:
        logits = est.links[-1]["logits_ms"]
        out.append(
            "output layer on %s (the last in --rpc order): the logits cost %.2f ms per token over its link;"
            " the fastest choice that fits" % (p.workers[-1].name, logits)
        )
    if p.head_layers:
        out.append("the head %s holds layers 0-%d on its own CPU" % (p.head.name, p.head_layers - 1))
    if p.workers:
        out.append(
            "workers in --rpc order: %s (layers %s: the fastest split that fits)"
            % (", ".join(w.name for w in p.workers), ",".join(map(str, p.worker_layers)))
        )
    out.append("bottleneck: %s" % est.bottleneck())
    return out


def resolve_objective(objective: str, names: Sequence[str], figures: Dict[str, Figures]) -> str:
    """auto -> speed when every candidate host has figures, else memory; speed without them: error."""
    missing = [n for n in names if n not in figures]
    if objective == "memory":
        return "memory"
    if objective == "speed":
        if missing:
            raise ValueError(
                "objective speed: host(s) %s have no speed figures {ms_per_layer, rtt_ms, mbit_s}"
                " (measure them, or use the objective auto or memory)" % ", ".join(missing)
            )
        return "speed"
    if objective == "auto":
        return "memory" if missing else "speed"
    raise ValueError("objective must be auto, speed or memory, got %r" % (objective,))


def make_plan(
    layout: Dict[str, Any],
    model: Dict[str, Any],
    head: Dict[str, Any],
    workers: Sequence[Dict[str, Any]],
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = DEFAULT_RESERVE_MIB,
    backend: str = "llama_cpp",
    target: str = "systemd",
) -> Dict[str, Any]:
    """placement.make_plan under ``options['objective']`` (auto, speed, memory; default auto).

    The plan gains ``objective`` (the one used) and ``speed`` (the prediction of the chosen
    placement: tokens_per_second, ms_per_token, ttft_s, bottleneck, per-host and per-link terms;
    null when a host it uses has no figures).
    """
    options = dict(options or {})
    objective = str(options.get("objective") or "auto")
    figures = figures_for(head, workers)
    names = [str(head.get("name"))] + [str(w.get("name")) for w in workers]
    used_objective = resolve_objective(objective, names, figures)

    def annotate(p: Placement, m: Model, _opts: Options) -> Dict[str, Any]:
        est = estimate_placement(p, m, figures)
        out: Dict[str, Any] = {
            "objective": used_objective,
            "speed": est.to_plan() if est is not None else None,
        }
        if est is not None and p.devices is not None:
            out["warnings"] = assumed_devices(est)
        return out

    placer: Optional[P.Placer] = None
    if used_objective == "speed":
        # a fleet with GPUs: the search over devices (device_speed.py); else over hosts
        gpus = device_placer_for(head, workers)
        placer = DeviceSpeedPlacer(gpus, figures) if gpus is not None else speed_placer(figures)
    return P.make_plan(
        layout, model, head, workers, options, reserve_mib, backend, target, placer=placer, annotate=annotate
    )

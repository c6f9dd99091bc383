# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Place for speed over devices: a fleet with GPUs (docs/planner.md, "Speed per device").

The memory model and its checks are device_placement.py's, unchanged: a candidate is kept only
when ``Placement.fits()`` holds for it. What a layer costs on each device is speed.py's
(:func:`speed.device_cost`: measured, the host's CPU figure for its CPU device, else an assumed
default of the device's kind); the time of a placement is :func:`speed.estimate_devices`.

The search, within the host speed search's limits (constants.py):

- worker sets: every subset of the candidates (at least ``min_workers``) up to
  ``SPEED_EXACT_WORKERS`` candidates; beyond, the prefixes of the candidates ranked by their
  cheapest device and by their room (a heuristic, as for CPU-only fleets);
- ``--rpc`` orders: each worker of the set as the last one (it holds the output layer), the others
  cheapest first: on devices the order changes only where the output layer goes;
- the output layer on the head (``-ot``) or on the last device with layers (``output_layer``
  policy permitting), and for the last worker both its CPU and its last GPU as that device;
- for each, the layers go to the cheapest devices first, each up to what the fill estimates fits
  it (``DevicePlacer.place`` with a cost; the estimate is on the safe side);
- then moves between two devices, kept while the exact memory model fits them and the
  prediction falls, from the fastest fills first and from those that did not fit, within
  ``REFINE_TOTAL`` placements. A heuristic: tests/unit/plugins/plugin_utils/test_device_speed.py
  holds it to a brute force on small fleets.

Sets are tried by a lower bound (their links, every layer on the cheapest devices their room
could hold, the cheapest output layer) and the search stops once the bound reaches the best time
found. The memory placement (GPU memory first) is always a candidate, so the speed objective
never refuses what the memory objective places and is never predicted slower than it. CPU quota
caps are counted in every prediction, but the split is not searched under them (the CPU search
is): a quota'd host's GPU usually takes its layers anyway.
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
import itertools
from typing import Dict, List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import MIB, SPEED_EXACT_WORKERS
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import (
    Dev,
    DevicePlacer,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import Placement
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Host,
    Model,
    Options,
    PlacementError,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed import (
    Estimate,
    Figures,
    device_cost,
    estimate_devices,
    link_terms,
    links_bound,
    output_layer_equivalents,
    speed_output_choices,
)

__metaclass__ = type

INF = float("inf")
# The placements one refinement by moves may try, and all refinements of one search together.
REFINE_TRIES = 200
REFINE_TOTAL = 1200


class DeviceSpeedPlacer:
    """A Placer (placement.py) over devices for the speed objective: the fastest that fits."""

    over_devices = True

    def __init__(self, devices: DevicePlacer, figures: Dict[str, Figures]):
        self.devices = devices
        self.figures = figures

    def cost(self, dev: Dev) -> float:
        """A device's ms per layer (speed.device_cost)."""
        return device_cost(
            self.figures[dev.host], dev.name, dev.backend, dev.type, dev.cpu_driver
        ).ms_per_layer

    def __call__(
        self, model: Model, head: Host, workers: List[Host], opts: Options
    ) -> Tuple[Placement, List[str], Dict[str, str]]:
        try:
            memory, memory_reasons, _left = self.devices(model, head, workers, opts)
        except PlacementError:
            memory, memory_reasons = None, []
        found = self.fastest(model, head, workers, opts)
        mem_est = estimate_devices(model, memory, self.figures) if memory is not None else None
        est = estimate_devices(model, found, self.figures) if found is not None else None
        if (
            found is None
            or est is None
            or (mem_est is not None and mem_est.ms_per_token <= est.ms_per_token + 1e-9)
        ):
            if memory is None:
                self.devices(model, head, workers, opts)  # raises the device refusal
                raise PlacementError("the model does not fit on the devices of these hosts")
            line = "objective speed: the memory placement (GPU memory first) is the fastest that fits"
            if mem_est is not None:
                line += " (predicted %.2f tokens/s)" % (1000.0 / mem_est.ms_per_token)
            return memory, [line, *memory_reasons], {}
        used = {w.name for w in found.workers}
        left = {w.name: self._left_out(w, model) for w in workers if w.name not in used}
        return found, explain(found, est, mem_est), left

    def fastest(self, model: Model, head: Host, workers: List[Host], opts: Options) -> Optional[Placement]:
        """The fastest device placement that fits (None: none found)."""
        lo = min(max(opts.min_workers, 0), len(workers))
        per_layer = self.devices.per_layer(model, opts)
        eq = output_layer_equivalents(model)
        token = self.figures[head.name].token_ms or 0.0
        candidates = []
        for combo in self._sets(workers, lo):
            bound = self._compute_bound(model, [head, *combo], per_layer)
            if bound is None:
                continue  # even every device's whole room cannot hold the layers
            output = min(self._output_ms(d, eq) for h in [head, *combo] for d in self.devices.devs(h))
            for out in speed_output_choices(opts) if combo else [True, False]:
                links = links_bound(model, combo, self.figures, out)
                candidates.append(
                    (token + bound + output + links, len(combo), [w.name for w in combo], combo, out)
                )
        candidates.sort(key=lambda c: (c[0], c[1], c[2], c[4]))
        best_ms, best = INF, None
        # the fill of every candidate whose bound is below the best fill found
        filled: List[Tuple[float, float, List[Host], Options, Placement]] = []
        for bound, _size, _names, combo, out in candidates:
            if bound >= best_ms - 1e-9:
                break
            o = dataclasses.replace(opts, output_layer="head" if out else "worker")
            for order in self._orders(combo):
                for limits in self._holder_limits(order, out):
                    p = self.devices.place(model, head, list(order), o, cost=self.cost, limits=limits)
                    ms = self._ms(model, p)
                    filled.append((ms, bound, list(order), o, p))
                    if ms < best_ms - 1e-9:
                        best_ms, best = ms, p
        # then moves from the fills, the fastest first, then those that did not fit (the fill's
        # room per device is an estimate) by their bound, within REFINE_TOTAL placements in all
        fitting = sorted((f for f in filled if f[0] < INF), key=lambda f: f[0])
        unfit = sorted((f for f in filled if f[0] == INF), key=lambda f: f[1])
        left = REFINE_TOTAL
        for ms, bound, order, o, p in [*fitting, *unfit]:
            if left <= 0:
                break
            if bound >= best_ms - 1e-9:
                continue
            p, ms, used = self._refine(model, head, order, o, p, ms, min(REFINE_TRIES, left))
            left -= used
            if ms < best_ms - 1e-9:
                best_ms, best = ms, p
        return best

    def _ms(self, model: Model, p: Placement) -> float:
        """The predicted ms per token of a placement that fits and uses every worker, else INF."""
        if not p.fits() or any(not any(s.used for s in row) for row in p.devices[1:]):
            return INF  # a worker left without a layer is a smaller set, tried on its own
        est = estimate_devices(model, p, self.figures)
        return est.ms_per_token if est is not None else INF

    def _refine(
        self, model: Model, head: Host, order: List[Host], opts: Options, p: Placement, ms: float, budget: int
    ) -> Tuple[Placement, float, int]:
        """Moves of layers from a dearer device to a cheaper one, kept while the prediction falls
        and the exact memory model fits them (the fill's room per device is an estimate: the
        largest layer, a pipelined compute buffer); from a fill that does not fit, moves in any
        direction until one fits. Each move tries the most layers first, then halves; at most
        ``budget`` placements."""
        shares = [s for row in p.devices for s in row]
        keys = [(s.dev.host, s.dev.name) for s in shares]
        cost = {k: self.cost(s.dev) for k, s in zip(keys, shares)}
        counts = {k: s.count for k, s in zip(keys, shares)}
        tries = 0
        improved = True
        while improved and tries < budget:
            improved = False
            for a in sorted((k for k in keys if counts[k] > 0), key=lambda k: -cost[k]):
                # to a cheaper device; any other while it does not fit (the fill's room is an estimate)
                dest = [k for k in keys if k != a and (cost[k] < cost[a] or ms == INF)]
                for b in sorted(dest, key=lambda k: cost[k]):
                    step = counts[a]
                    while step >= 1 and tries < budget:
                        tries += 1
                        trial = dict(counts)
                        trial[a] -= step
                        trial[b] += step
                        q = self.devices.place(model, head, order, opts, counts=trial)
                        got = self._ms(model, q)
                        if got < ms - 1e-9:
                            p, ms, counts, improved = q, got, trial, True
                            break
                        step //= 2
                    if improved:
                        break
                if improved:
                    break
        return p, ms, tries

    def _sets(self, workers: List[Host], lo: int) -> List[Tuple[Host, ...]]:
        if len(workers) <= SPEED_EXACT_WORKERS:
            return [c for size in range(lo, len(workers) + 1) for c in itertools.combinations(workers, size)]
        by_cost = sorted(workers, key=lambda w: (self._cheapest(w), w.name))
        by_room = sorted(workers, key=lambda w: (-self._room(w), w.name))
        out: List[Tuple[Host, ...]] = []
        seen = set()
        for size in range(lo, len(workers) + 1):
            for ranked in (by_cost, by_room):
                key = frozenset(w.name for w in ranked[:size])
                if key not in seen:
                    seen.add(key)
                    out.append(tuple(ranked[:size]))
        return out

    def _orders(self, combo: Sequence[Host]) -> List[List[Host]]:
        ranked = sorted(combo, key=lambda w: (self._cheapest(w), w.name))
        return [[w for w in ranked if w is not last] + [last] for last in ranked] or [[]]

    def _holder_limits(
        self, order: Sequence[Host], output_on_head: bool
    ) -> List[Optional[Dict[Tuple[str, str], int]]]:
        """The fill as it comes, and, when the output layer goes to the last worker and that worker
        has a GPU, the same with its CPU kept empty (the output layer then lands on its GPU)."""
        if output_on_head or not order:
            return [None]
        last = order[-1]
        if all(d.is_cpu for d in self.devices.devs(last)):
            return [None]
        return [None, {(last.name, "CPU"): 0}]

    def _cheapest(self, host: Host) -> float:
        return min(self.cost(d) for d in self.devices.devs(host))

    def _room(self, host: Host) -> float:
        return host.budget_mib + sum(
            max(d.own_budget_mib, 0.0) for d in self.devices.devs(host) if not d.is_cpu and not d.uma
        )

    def _output_ms(self, dev: Dev, eq: float) -> float:
        fig = self.figures[dev.host]
        if dev.is_cpu:
            return fig.output_time(eq)
        cost = device_cost(fig, dev.name, dev.backend, dev.type, dev.cpu_driver)
        return cost.output_ms if cost.output_ms is not None else eq * cost.ms_per_layer

    def _compute_bound(self, model: Model, hosts: Sequence[Host], per_layer: float) -> Optional[float]:
        """A lower bound of the layers' compute on these hosts: every device holds at most its own
        room (a discrete GPU's budget, else the host's whole pool) / the largest layer, the
        cheapest first (None: even that cannot hold the layers)."""
        caps = []
        for h in hosts:
            for d in self.devices.devs(h):
                room = h.budget_mib if d.is_cpu or d.uma else d.own_budget_mib
                if d.uma and not d.is_cpu:
                    room = min(room, d.own_budget_mib)
                caps.append((self.cost(d), int(max(room, 0.0) * MIB // max(per_layer, 1.0))))
        left, total = model.n_layer, 0.0
        for ms, cap in sorted(caps):
            take = min(cap, left)
            total += take * ms
            left -= take
            if not left:
                return total
        return None

    def _left_out(self, w: Host, model: Model) -> str:
        fig = self.figures[w.name]
        cheapest = min(self.devices.devs(w), key=self.cost)
        link = link_terms(model, w.name, fig, False)["total_ms"]
        return (
            "its devices (the cheapest %s at %.4g ms per layer) do not pay for its link (%.2f ms per token);"
            " the model fits faster without it" % (cheapest.name, self.cost(cheapest), link)
        )


def explain(p: Placement, est: Estimate, mem_est: Optional[Estimate]) -> List[str]:
    """The speed plan's reasons: the prediction against the memory placement's, each device's
    layers and cost, the output layer's device and the bottleneck."""
    out = [
        "objective speed: predicted %.2f tokens/s (%.2f ms per token)%s"
        % (
            1000.0 / est.ms_per_token,
            est.ms_per_token,
            "; the memory placement (GPU memory first): %.2f tokens/s" % (1000.0 / mem_est.ms_per_token)
            if mem_est
            else "",
        ),
        "every device a slot, the cheapest per layer first (a device's ms per layer: measured, its host's"
        " CPU figure, or an assumed default)",
    ]
    for h in est.hosts:
        for d in h.get("devices") or []:
            if d["layers"]:
                out.append(
                    "%s %s: %d layers at %.4g ms per layer (%s)"
                    % (h["name"], d["name"], d["layers"], d["ms_per_layer"], d["priced"])
                )
            if "output_ms" in d:
                out.append(
                    "output layer on %s %s: %.2f ms per token" % (h["name"], d["name"], d["output_ms"])
                )
    out.append("bottleneck: %s" % est.bottleneck())
    return out

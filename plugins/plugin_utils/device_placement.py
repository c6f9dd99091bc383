# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The placement over devices (GPUs, iGPUs, CPUs) rather than hosts (pure; docs/planner.md).

Used when some candidate host offers a device other than its CPU (``llmfleet_host.devices``);
a fleet of CPU-only hosts is planned by placement_search.py exactly as before.

The chain of devices llama.cpp walks (split_rule.device_chain): the head's CPU holds the first
``n_layer + 1 - ngl`` slots, then the devices of ``--device`` in that order hold the rest by the
tensor split. The plan passes ``--device`` itself: the head's own GPUs first, then each worker's
devices (an rpc-server offers its devices in its ``-d`` order, the GPUs then the CPU), so that
every host's layers stay one contiguous range.

Which device gets how many layers: GPU memory first, then RAM. Every GPU of every host used
(head included) takes the layers it can hold within ``memory_free_mib - gpu_reserve_mib``; the
rest goes to RAM, the head's CPU first, then the workers' CPUs in ``--rpc`` order. A uma device
(an APU, lavapipe) and the CPU share the host's one pool: ``usable - reserve``. The fewest
workers that fit are used, those with the most GPU memory first.
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import CPU_VULKAN_DRIVERS
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import DEFAULT_GPU_RESERVE_MIB, MIB
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import (
    Placement,
    Prediction,
    head_compute_bytes,
    kv_bytes,
    output_only_compute_bytes,
    worker_compute_bytes,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Host,
    Model,
    Options,
    PlacementError,
)

__metaclass__ = type


# Per backend: (compute-buffer factor over the CPU model, calibrated). Weights and KV are the
# same bytes on every backend (bench/vulkan_buffers.md: identical on the pinned build); Vulkan's
# compute buffers measured 0.90-1.12x the CPU model there. CUDA/ROCm/others are not measured:
# a generous factor, ``calibrated: false`` and a warning in the plan.
BACKEND_MODEL: Dict[str, Tuple[float, bool]] = {
    "cpu": (1.0, True),
    "vulkan": (1.12, True),
    "cuda": (1.5, False),
    "rocm": (1.5, False),
}
UNKNOWN_BACKEND = (1.5, False)


def backend_model(backend: str) -> Tuple[float, bool]:
    """(compute factor, calibrated) of a backend."""
    return BACKEND_MODEL.get(backend, UNKNOWN_BACKEND)


@dataclasses.dataclass(frozen=True)
class Dev:
    """One device of a host as the planner sees it."""

    host: str
    name: str  # as the host lists it: Vulkan0, CUDA0, CPU
    backend: str
    type: str  # gpu | igpu | cpu
    uma: bool
    free_mib: float
    reserve_mib: float
    cpu_driver: bool = False  # a Vulkan driver that runs on the CPU (lavapipe): its work is the CPU's

    @property
    def is_cpu(self) -> bool:
        return self.backend == "cpu"

    @property
    def own_budget_mib(self) -> float:
        """Its own memory cap (a uma device also draws on the host's pool)."""
        return self.free_mib - self.reserve_mib


@dataclasses.dataclass
class Share:
    """A device's part of a placement."""

    dev: Dev
    count: int = 0
    first: int = 0
    output: bool = False
    prediction: Prediction = dataclasses.field(default_factory=lambda: Prediction(0.0, 0.0, 0.0, 0.0, 0.0))
    budget_mib: float = 0.0

    @property
    def used(self) -> bool:
        return self.count > 0 or self.output


def host_devs(
    host: Host, devices: Optional[Sequence[Mapping[str, Any]]], gpu_reserve_mib: float
) -> List[Dev]:
    """A host's devices, GPUs first in the host's order, the CPU last (one CPU always)."""
    out: List[Dev] = []
    for d in devices or []:
        if d.get("backend") == "cpu":
            continue
        out.append(
            Dev(
                host=host.name,
                name=str(d["name"]),
                backend=str(d.get("backend") or "vulkan"),
                type=str(d.get("type") or "gpu"),
                uma=bool(d.get("uma")),
                free_mib=float(d.get("memory_free_mib") or 0),
                reserve_mib=0.0 if d.get("uma") else float(gpu_reserve_mib),
                cpu_driver=any(drv in str(d.get("description") or "") for drv in CPU_VULKAN_DRIVERS),
            )
        )
    out.append(Dev(host.name, "CPU", "cpu", "cpu", True, host.usable_mib, host.reserve_mib))
    return out


def has_gpus(devices_by_host: Mapping[str, Sequence[Mapping[str, Any]]]) -> bool:
    return any(d.get("backend") != "cpu" for devs in devices_by_host.values() for d in devs or [])


def device_placer_for(
    head: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]
) -> Optional[DevicePlacer]:
    """The device placer of a fleet whose hosts offer a GPU (their ``devices``), else None."""
    devices_by_host = {str(h["name"]): h.get("devices") or [] for h in [head, *workers]}
    if not has_gpus(devices_by_host):
        return None
    return DevicePlacer(
        devices_by_host,
        {str(h["name"]): float(h.get("gpu_reserve_mib", DEFAULT_GPU_RESERVE_MIB)) for h in [head, *workers]},
    )


class DevicePlacer:
    """A Placer (placement.py) over devices: ``(model, head, workers, opts)`` -> placement."""

    over_devices = True  # plans a fleet with GPUs (placement.plan_llama_cpp refuses a host placer there)

    def __init__(
        self, devices_by_host: Mapping[str, Sequence[Mapping[str, Any]]], gpu_reserve: Mapping[str, float]
    ):
        self.devices_by_host = devices_by_host
        self.gpu_reserve = gpu_reserve
        self._per_layer_memo: Dict[Tuple[int, str], Tuple[Model, float]] = {}

    def devs(self, host: Host) -> List[Dev]:
        return host_devs(
            host,
            self.devices_by_host.get(host.name),
            self.gpu_reserve.get(host.name, DEFAULT_GPU_RESERVE_MIB),
        )

    def __call__(
        self, model: Model, head: Host, workers: List[Host], opts: Options
    ) -> Tuple[Placement, List[str], Dict[str, str]]:
        def vram(h: Host) -> float:
            return sum(max(d.own_budget_mib, 0.0) for d in self.devs(h) if not d.is_cpu and not d.uma)

        order = sorted(workers, key=lambda h: (-vram(h), h.rank))
        for size in range(min(max(opts.min_workers, 0), len(order)), len(order) + 1):
            got = self.place(model, head, order[:size], opts)
            if got.fits():
                return got, self.explain(got), {}
        # the last attempt used every worker: the refusal shows it
        raise refusal(self.place(model, head, order, opts), model, opts)

    def place(
        self,
        model: Model,
        head: Host,
        workers: List[Host],
        opts: Options,
        cost: Optional[Callable[[Dev], float]] = None,
        limits: Optional[Mapping[Tuple[str, str], int]] = None,
        counts: Optional[Mapping[Tuple[str, str], int]] = None,
    ) -> Placement:
        """The placement on ``head`` + ``workers`` (it may not fit: see Placement.fits).

        Without ``cost``: GPU memory first, then RAM. With ``cost`` (a device's ms per layer, the
        speed search): the devices take layers cheapest first, each up to what fits it.
        ``limits``: (host, device name) -> the most layers that device may take. ``counts``:
        (host, device name) -> exactly its layers (summing to n_layer; the speed search's moves,
        whose fit ``fits()`` checks with the exact model rather than the fill's estimate)."""
        hosts = [head, *workers]
        output_on_head = opts.output_layer == "head"
        shares: List[List[Share]] = [[Share(d) for d in self.devs(h)] for h in hosts]
        # the chain: the head's CPU first, then the head's GPUs, then each worker's devices
        chain: List[Share] = [*shares[0][:-1]]
        for row in shares[1:]:
            chain.extend(row)
        head_cpu = shares[0][-1]
        per_layer = self.per_layer(model, opts)
        pools = {h.name: (h.budget_mib * MIB) for h in hosts}
        host_fixed = self._host_fixed(model, opts, hosts, head)

        def capacity(share: Share, output: bool) -> int:
            d = share.dev
            factor = backend_model(d.backend)[0]
            # pipelined or not is known only at the end: priced as pipelined (the larger)
            fixed = worker_compute_bytes(model, opts, True) * factor
            if output:
                fixed += model.output_bytes + model.output_norm_bytes
            if d.is_cpu or d.uma:
                room = pools_left[d.host]
                if not d.is_cpu:
                    room = min(room, d.own_budget_mib * MIB)
            else:
                room = d.own_budget_mib * MIB
            if share is head_cpu and not opts.head_layers:
                return 0  # llmfleet_head_layers: false keeps the head's CPU free of layers
            if share is head_cpu:
                # the head's CPU already holds the embeddings and its compute buffer: what its
                # layers add (and the output layer kept there with -ot)
                fixed = head_compute_bytes(model, opts, True, True) - head_compute_bytes(model, opts, False)
                if output_on_head:
                    fixed += model.output_norm_bytes + (0 if model.tied_output else model.output_bytes)
            if room - fixed < per_layer or per_layer <= 0:
                return 0
            return int((room - fixed) // per_layer)

        if cost is None:
            # GPU memory first: every non-CPU device of every host in chain order; then RAM: the
            # head's CPU, then the workers' CPUs in --rpc order
            fill = [*(c for c in chain if not c.dev.is_cpu), head_cpu, *(c for c in chain if c.dev.is_cpu)]
        else:
            fill = sorted([head_cpu, *chain], key=lambda c: cost(c.dev))  # stable: chain order on ties
        limits = limits or {}
        rest = model.n_layer
        output_dev: Optional[Share] = None
        for _attempt in range(4):
            pools_left = {n: pools[n] - host_fixed[n] for n in pools}
            for s in [*chain, head_cpu]:
                s.count = 0
            rest = model.n_layer
            if counts is not None:
                for s in fill:
                    s.count = counts.get((s.dev.host, s.dev.name), 0)
                    rest -= s.count
                fill_rest: List[Share] = []
            else:
                fill_rest = fill
            for s in fill_rest:
                if rest == 0:
                    break
                most = limits.get((s.dev.host, s.dev.name), rest)
                s.count = max(0, min(rest, most, capacity(s, s is output_dev)))
                rest -= s.count
                if (s.dev.uma or s.dev.is_cpu) and s.count:
                    # one pool with the host's RAM: what it takes, the host's other devices cannot
                    factor = backend_model(s.dev.backend)[0]
                    pools_left[s.dev.host] -= (
                        s.count * per_layer + worker_compute_bytes(model, opts, True) * factor
                    )
            if rest > 0:
                # nothing more fits: the rest on the head's CPU (the refusal names what is missing)
                target = head_cpu if not workers else chain[-1]
                target.count += rest
                rest = 0
            if counts is None:
                self._give_every_worker_a_layer(shares, head_cpu, chain)
            holders = [s for s in chain if s.count > 0]
            new_out = None if output_on_head or not holders else holders[-1]
            if new_out is output_dev:
                break
            output_dev = new_out
        for s in [head_cpu, *chain]:
            s.output = s is output_dev
        if output_dev is None:
            head_cpu.output = True
            output_on_head = True
        # positions: the head's CPU first, then the chain
        first = 0
        for s in [head_cpu, *chain]:
            s.first = first
            first += s.count
        # llama.cpp pipelines when every slot is offloaded over more than one device and no tensor
        # is overridden (src/llama-context.cpp; memory_model.pipelined for hosts)
        pp = head_cpu.count == 0 and not output_on_head and sum(1 for s in chain if s.used) > 1
        preds = self._predict(model, opts, hosts, shares, output_on_head, pp)
        return Placement(
            head=head,
            workers=list(workers),
            head_layers=sum(s.count for s in shares[0]),
            worker_layers=[sum(s.count for s in row) for row in shares[1:]],
            output_on_head=output_on_head,
            predictions=preds,
            devices=shares,
        )

    @staticmethod
    def _give_every_worker_a_layer(shares: List[List[Share]], head_cpu: Share, chain: List[Share]) -> None:
        """Every worker placed holds a layer: the fill takes the head's RAM before the workers' CPUs,
        so a worker set forced by ``min_workers`` could leave one empty (its rpc-server would offer
        no device). An empty worker's CPU takes one layer from the device holding the most (the
        fit is checked afterwards with the exact model, as for every placement)."""
        for row in shares[1:]:
            if any(s.count for s in row):
                continue
            donors = [s for s in [head_cpu, *chain] if s.count > 1]
            if not donors:
                return
            donor = max(donors, key=lambda s: s.count)
            donor.count -= 1
            row[-1].count += 1

    def per_layer(self, model: Model, opts: Options) -> float:
        """The largest layer's weights and KV (memoised: the speed search places many times)."""
        key = (id(model), repr(opts))
        memo = self._per_layer_memo
        if key not in memo:
            memo[key] = (
                model,
                max(
                    (
                        model.layer_bytes[il] + kv_bytes(model, range(il, il + 1), opts)
                        for il in range(model.n_layer)
                    ),
                    default=0.0,
                ),
            )
        return memo[key][1]

    def _host_fixed(self, model: Model, opts: Options, hosts: List[Host], head: Host) -> Dict[str, float]:
        """What each host's RAM pool holds before any layer: the process, the head's embeddings."""
        out = {}
        for h in hosts:
            if h is head:
                out[h.name] = (
                    model.token_embd_bytes
                    + model.other_bytes
                    + head_compute_bytes(model, opts, holds_layers=False, pp=True)
                    + opts.calibration.head_process_mib * MIB
                )
            else:
                out[h.name] = opts.calibration.worker_process_mib * MIB + max(model.layer_largest or [0])
        return out

    def _predict(
        self,
        model: Model,
        opts: Options,
        hosts: List[Host],
        shares: List[List[Share]],
        output_on_head: bool,
        pp: bool,
    ) -> List[Prediction]:
        """Each device's buffers and budget, and each host's RAM pool (the host predictions)."""
        preds: List[Prediction] = []
        for i, (host, row) in enumerate(zip(hosts, shares)):
            is_head = i == 0
            ram = Prediction(0.0, 0.0, 0.0, 0.0, 0.0)
            largest = 0.0
            for s in row:
                layers = range(s.first, s.first + s.count)
                factor = backend_model(s.dev.backend)[0]
                weights = float(sum(model.layer_bytes[il] for il in layers))
                largest = max([largest, *(float(model.layer_largest[il]) for il in layers)])
                kv = kv_bytes(model, layers, opts)
                if is_head and s.dev.is_cpu:
                    weights += model.token_embd_bytes + model.other_bytes
                    if s.output:
                        weights += model.output_norm_bytes + (0 if model.tied_output else model.output_bytes)
                    compute = head_compute_bytes(model, opts, holds_layers=bool(layers), pp=pp)
                else:
                    if s.output:
                        weights += model.output_bytes + model.output_norm_bytes
                        largest = max(largest, float(model.output_bytes))
                    if layers:
                        compute = worker_compute_bytes(model, opts, pp) * factor
                    elif s.output:
                        compute = output_only_compute_bytes(model, opts) * factor
                    else:
                        compute = 0.0
                s.prediction = Prediction(weights, kv, compute, 0.0, 0.0)
                if s.dev.is_cpu or s.dev.uma:
                    ram = Prediction(ram.weights + weights, ram.kv + kv, ram.compute + compute, 0.0, 0.0)
            process = (
                opts.calibration.head_process_mib if is_head else opts.calibration.worker_process_mib
            ) * MIB
            # a worker stages the tensor it receives in RAM before its device takes it
            cpu_share = row[-1].prediction
            peak = 0.0 if is_head else max(0.0, largest - (cpu_share.kv + cpu_share.compute))
            host_pred = Prediction(ram.weights, ram.kv, ram.compute, process, peak)
            preds.append(host_pred)
            pool_left = host.budget_mib - host_pred.total / MIB
            for s in row:
                own = s.prediction.total / MIB
                if s.dev.is_cpu:
                    s.budget_mib = own + pool_left
                elif s.dev.uma:
                    s.budget_mib = min(s.dev.own_budget_mib, own + pool_left)
                else:
                    s.budget_mib = s.dev.own_budget_mib
        return preds

    @staticmethod
    def explain(p: Placement) -> List[str]:
        out = ["every device a slot: GPU memory first (every host's GPUs), then RAM (the head's CPU first)"]
        for row in p.devices or []:
            for s in row:
                if s.count:
                    out.append(
                        "%s %s holds layers %d-%d%s"
                        % (
                            s.dev.host,
                            s.dev.name,
                            s.first,
                            s.first + s.count - 1,
                            " in its own memory" if not s.dev.is_cpu and not s.dev.uma else "",
                        )
                    )
                if s.output:
                    out.append(
                        "output layer on %s %s: the last device that holds layers" % (s.dev.host, s.dev.name)
                    )
        if p.output_on_head:
            out.append("output layer kept on the head %s's CPU" % p.head.name)
        return out


def overflows(p: Placement) -> Dict[str, float]:
    """``<host> device <name>`` -> MiB missing, for every device whose buffers exceed its budget
    (a host's RAM pool, shared by its CPU and its uma devices, is named as its CPU)."""
    out: Dict[str, float] = {}
    for host, row, pred in zip(p.hosts(), p.devices, p.predictions):
        for s in row:
            # a uma device's share of the host's pool is the CPU's figure: here only its own cap
            cap = s.dev.own_budget_mib if s.dev.uma else s.budget_mib
            over = s.prediction.total / MIB - cap
            if s.used and s.prediction.total > cap * MIB and not s.dev.is_cpu:
                out["%s device %s" % (host.name, s.dev.name)] = _up(over)
        if pred.total > host.budget_mib * MIB:  # as Placement.fits
            out["%s device CPU" % host.name] = _up(pred.total / MIB - host.budget_mib)
    return out


def _up(mib: float) -> float:
    """MiB missing, rounded up to 0.1 (a shortfall is never shown as 0.0)."""
    return math.ceil(mib * 10.0 - 1e-9) / 10.0


def refusal(p: Placement, model: Model, opts: Options) -> PlacementError:
    """The error for a fleet whose devices cannot hold the model: each device short of room with
    its host and the MiB missing, and the best attempt (every host) as the table."""
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import (
        plan_entry,
        render_device_table,
    )

    missing = overflows(p)
    detail = "; ".join("%s: %.1f MiB missing" % (k, v) for k, v in sorted(missing.items()))
    try:
        rows = plan_entry(p, model, opts)["hosts"]
    except ValueError:
        rows = []
    return PlacementError(
        "the model does not fit on the devices of these hosts (GPU memory first, then RAM): %s\n%s"
        % (detail, render_device_table(rows)),
        table=rows,
        missing=missing,
    )

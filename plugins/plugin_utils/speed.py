# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The time-per-token model of a placement (docs/planner.md, "Speed").

Inputs are the measured figures of each host (``speed`` in the host dicts the plan role passes,
written by the measurement side, docs/planner.md "Speed figures"):

- ``ms_per_layer``: decode time per layer per token of THIS model on that host;
- ``rtt_ms`` and ``mbit_s``: the link head <-> host (absent for the head);
- ``cpu_quota`` (optional): the host's CFS CPU quota in CPUs, and ``cpu_ms_per_layer`` (optional,
  default ``ms_per_layer``): the CPU time per layer per token it spends (its threads' sum);
- ``output_ms`` (optional) and ``output_cpu_ms`` (optional): the output layer's own time (and CPU
  time) per token on that host, measured (profile.py); without them the output layer is priced
  by its weight in repeating layers (:func:`output_layer_equivalents`) x ``ms_per_layer``;
- ``token_ms`` (optional, the head's): the fleet's per-token time outside the layers and the
  links (llama-server's own work per token: sampling, driving the RPC devices, waiting on them),
  measured as what a real request's time per token has beyond the other terms (profile.py).

``ms_per_layer`` is the UNTHROTTLED time: what a layer takes while the host has quota left. A CFS
quota is a cap, not a slowdown: a host computes at full speed until it has used its quota in the
period, then the whole chain waits for it. So a quota'd host bounds the rate of tokens
(``cpu_ms_per_layer x its layers / cpu_quota`` ms per token at least) without slowing a token
below that rate.

In a layer split every token passes every host in turn. llama.cpp's RPC devices are driven by the
head: the activations go to a worker over its link, it computes its layers, and the result comes
back over the same link before the next worker is sent anything. So per token:

    chain_ms     = token_ms of the head
                 + sum over hosts of layers x ms_per_layer
                 + output_ms of its holder (else its weight in layers x the holder's ms_per_layer)
                 + sum over used workers of (rtt_ms + 2 x activation_ms)
                 (the output holder: rtt_ms + activation_ms + logits_ms)
    ms_per_token = max(chain_ms, max over quota'd hosts of their cap_ms)
    cap_ms       = (its layers x cpu_ms_per_layer + output_cpu_ms if it holds the output) / cpu_quota

where ``activation_ms = n_embd x 4 bytes / throughput`` (one row of float32 in, one out) and
``logits_ms = n_vocab x 4 bytes / throughput`` of the last worker's link: that worker sends back
the logits instead of the activation row. The hops head -> w1 -> ... -> wk -> head are
these k round trips: hop w_i -> w_i+1 passes the head.

Time to first token for a prompt of ``prompt_tokens`` tokens (one batch):
``token_ms + prompt_tokens x compute + sum(rtt) + prompt_tokens x activation terms + logits_ms`` (the rows of
every prompt token pass every link; the logits of the last token only). Prefill is
counted at the decode cost per token, an upper bound: on a CPU a batch reuses each weight it reads,
so prompt processing is usually faster per token than generation.
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import (
    DEVICE_SPEED_DEFAULTS,
    SPEED_LIMITS,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import Placement
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Host, Model

__metaclass__ = type

SPEED_KEYS = (
    "ms_per_layer",
    "rtt_ms",
    "mbit_s",
    "cpu_quota",
    "cpu_ms_per_layer",
    "output_ms",
    "output_cpu_ms",
    "token_ms",
    "devices",
)
# the optional figures of any host (checked like ms_per_layer when given)
OPTIONAL_KEYS = ("cpu_quota", "cpu_ms_per_layer", "output_ms", "output_cpu_ms", "token_ms")
# a device's figures in ``speed.devices`` (keyed by its llama.cpp name: Vulkan0, CUDA0 ...)
DEVICE_KEYS = ("ms_per_layer", "output_ms")
PROMPT_TOKENS = 128
FLOAT_BYTES = 4


@dataclasses.dataclass(frozen=True)
class DeviceFigures:
    """One device's measured figures (profile.json ``devices``, docs/profile.md): its decode time
    per layer per token of this model, and the output layer's there (None: priced by weight)."""

    ms_per_layer: float
    output_ms: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Figures:
    """The measured figures of one host (``rtt_ms``/``mbit_s`` None on the head).

    ``ms_per_layer``: unthrottled time per layer per token; ``cpu_quota``: the CFS quota in CPUs
    (None: no quota); ``cpu_ms_per_layer``: CPU time per layer per token (None: ``ms_per_layer``,
    one thread); ``output_ms``/``output_cpu_ms``: the output layer's measured time and CPU time
    per token here (None: priced by its weight); ``token_ms``: the head's per-token time outside
    layers and links (None: 0)."""

    ms_per_layer: float
    rtt_ms: Optional[float] = None
    mbit_s: Optional[float] = None
    cpu_quota: Optional[float] = None
    cpu_ms_per_layer: Optional[float] = None
    output_ms: Optional[float] = None
    output_cpu_ms: Optional[float] = None
    token_ms: Optional[float] = None
    # the host's non-CPU devices measured apart (name -> figures); the CPU device is the host's
    devices: Optional[Dict[str, DeviceFigures]] = dataclasses.field(default=None, compare=False)

    @property
    def cpu_per_layer(self) -> float:
        return self.cpu_ms_per_layer if self.cpu_ms_per_layer is not None else self.ms_per_layer

    def output_time(self, equivalents: float) -> float:
        """The output layer's ms per token here: measured, else its weight in layers priced."""
        return self.output_ms if self.output_ms is not None else equivalents * self.ms_per_layer

    def output_cpu(self, equivalents: float) -> float:
        """The output layer's CPU ms per token here (measured, else from its time, else its weight)."""
        if self.output_cpu_ms is not None:
            return self.output_cpu_ms
        if self.output_ms is not None:
            return self.output_ms * self.cpu_per_layer / self.ms_per_layer
        return equivalents * self.cpu_per_layer

    def cap_ms(self, layers: float, output_cpu_ms: float = 0.0) -> Optional[float]:
        """The least ms per token the quota allows for ``layers`` repeating layers plus
        ``output_cpu_ms`` of CPU for the output layer (None without a quota)."""
        if not self.cpu_quota:
            return None
        return (layers * self.cpu_per_layer + output_cpu_ms) / self.cpu_quota

    def max_layers(self, ms: float, output_cpu_ms: float = 0.0) -> Optional[int]:
        """The most layers (besides ``output_cpu_ms`` of output work) whose cap stays within ``ms``
        per token (None without a quota; -1 when the output work alone is above it)."""
        if not self.cpu_quota:
            return None
        return math.floor((ms * self.cpu_quota - output_cpu_ms) / self.cpu_per_layer + 1e-9)

    def transfer_ms(self, n_bytes: float) -> float:
        """Milliseconds to send ``n_bytes`` over this host's link (0 without a link: the head)."""
        if not self.mbit_s:
            return 0.0
        return n_bytes * 8.0 / (self.mbit_s * 1e6) * 1000.0


def _number(host: str, key: str, value: Any, upper: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and 0.0 < value <= upper
    if not ok:
        raise ValueError(
            "host %s: speed.%s must be a finite number > 0 and <= %g, got %r" % (host, key, upper, value)
        )
    return value


def figures_of(data: Dict[str, Any], role: str) -> Optional[Figures]:
    """The validated figures of one host dict, or None when it has none.

    A host without ``speed``, or with a number there (the relative ``llmfleet_speed``), has no
    figures. A worker needs all three; the head needs ``ms_per_layer`` (a link given for it is
    checked and ignored: the head has no link to itself).
    """
    name = data.get("name")
    value = data.get("speed")
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return None
    if not isinstance(value, dict):
        raise ValueError(
            "host %s: speed must be the figures {ms_per_layer, rtt_ms, mbit_s}, got %r" % (name, value)
        )
    unknown = sorted(set(value) - set(SPEED_KEYS))
    if unknown:
        raise ValueError("host %s: speed has unknown keys %s" % (name, ", ".join(map(str, unknown))))
    ms = _number(name, "ms_per_layer", value.get("ms_per_layer"), SPEED_LIMITS["ms_per_layer"])
    extra: Dict[str, Any] = {}
    for key in OPTIONAL_KEYS:
        if value.get(key) is not None:
            extra[key] = _number(name, key, value[key], SPEED_LIMITS[key])
    if value.get("devices") is not None:
        extra["devices"] = _devices_of(name, value["devices"])
    if role == "head":
        for key in ("rtt_ms", "mbit_s"):
            if value.get(key) is not None:
                _number(name, key, value[key], SPEED_LIMITS[key])
        return Figures(ms, **extra)
    if "token_ms" in extra:
        raise ValueError("host %s: speed.token_ms is the head's figure, not a worker's" % name)
    rtt = _number(name, "rtt_ms", value.get("rtt_ms"), SPEED_LIMITS["rtt_ms"])
    mbit = _number(name, "mbit_s", value.get("mbit_s"), SPEED_LIMITS["mbit_s"])
    return Figures(ms, rtt, mbit, **extra)


def _devices_of(host: str, value: Any) -> Dict[str, DeviceFigures]:
    """``speed.devices``: device name -> {ms_per_layer, output_ms (optional)}, each checked."""
    if not isinstance(value, dict):
        raise ValueError(
            "host %s: speed.devices must map a device name to {ms_per_layer, output_ms}, got %r"
            % (host, value)
        )
    out: Dict[str, DeviceFigures] = {}
    for dev, figs in value.items():
        where = "%s device %s" % (host, dev)
        if not isinstance(figs, dict):
            raise ValueError(
                "host %s: speed.devices.%s must be {ms_per_layer, output_ms}, got %r" % (host, dev, figs)
            )
        unknown = sorted(set(figs) - set(DEVICE_KEYS))
        if unknown:
            raise ValueError(
                "host %s: speed.devices.%s has unknown keys %s" % (host, dev, ", ".join(map(str, unknown)))
            )
        ms = _number(where, "ms_per_layer", figs.get("ms_per_layer"), SPEED_LIMITS["ms_per_layer"])
        output = figs.get("output_ms")
        out[str(dev)] = DeviceFigures(
            ms, _number(where, "output_ms", output, SPEED_LIMITS["output_ms"]) if output is not None else None
        )
    return out


@dataclasses.dataclass(frozen=True)
class DeviceCost:
    """What a layer costs on one device (docs/planner.md, "Speed per device").

    ``priced``: ``measured`` (the profile's figure for the device), ``host CPU`` (the CPU device:
    the host's own figure) or ``assumed: <factor>x the host's CPU (<kind>)`` (no figure: the
    documented default of its kind, constants.DEVICE_SPEED_DEFAULTS). ``on_cpu``: it runs on the
    host's CPUs (the CPU device, a Vulkan driver on the CPU), so its work counts in a CPU quota."""

    ms_per_layer: float
    output_ms: Optional[float]
    priced: str
    on_cpu: bool

    @property
    def assumed(self) -> bool:
        return self.priced.startswith("assumed")


def device_kind(backend: str, dev_type: str, cpu_driver: bool) -> str:
    """The key of a device's default cost: ``cpu_driver`` (a Vulkan driver running on the CPU),
    ``igpu`` (an integrated GPU), else its backend (a discrete GPU)."""
    if cpu_driver:
        return "cpu_driver"
    if dev_type == "igpu":
        return "igpu"
    return backend


def device_cost(fig: Figures, name: str, backend: str, dev_type: str, cpu_driver: bool = False) -> DeviceCost:
    """A device's cost per layer on a host with figures ``fig``: the CPU device is the host's own
    figure; another device its measured figure, else the default of its kind x the host's CPU."""
    if backend == "cpu":
        return DeviceCost(fig.ms_per_layer, fig.output_ms, "host CPU", True)
    measured = (fig.devices or {}).get(name)
    if measured is not None:
        return DeviceCost(measured.ms_per_layer, measured.output_ms, "measured", cpu_driver)
    kind = device_kind(backend, dev_type, cpu_driver)
    factor = DEVICE_SPEED_DEFAULTS.get(kind, DEVICE_SPEED_DEFAULTS["vulkan"])
    return DeviceCost(
        fig.ms_per_layer * factor, None, "assumed: %gx the host's CPU (%s)" % (factor, kind), cpu_driver
    )


def figures_for(head: Dict[str, Any], workers: Sequence[Dict[str, Any]]) -> Dict[str, Figures]:
    """Host name -> validated figures, for the hosts that carry figures."""
    out: Dict[str, Figures] = {}
    for data, role in [(head, "head"), *((w, "worker") for w in workers)]:
        got = figures_of(data, role)
        if got is not None:
            out[str(data.get("name"))] = got
    return out


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The predicted time per token of one placement, term by term (milliseconds)."""

    hosts: List[Dict[str, Any]]  # name, layers, ms_per_layer, compute_ms (, cpu_quota, cap_ms)
    links: List[Dict[str, Any]]  # name, rtt_ms, mbit_s, latency_ms, activation_ms, logits_ms, total_ms
    prompt_tokens: int
    capped: Optional[Dict[str, Any]] = None  # the host entry with the largest cap_ms (None: no quota)
    token_ms: float = 0.0  # the head's per-token time outside layers and links

    @property
    def compute_ms(self) -> float:
        return sum(h["compute_ms"] for h in self.hosts)

    @property
    def chain_ms(self) -> float:
        """A token's pass through every host and link, no host throttled."""
        return self.token_ms + self.compute_ms + sum(link["total_ms"] for link in self.links)

    @property
    def cap(self) -> Optional[Dict[str, Any]]:
        """The quota'd host with the largest cap (None when no host has a quota)."""
        return self.capped

    @property
    def ms_per_token(self) -> float:
        cap = self.cap
        return max(self.chain_ms, cap["cap_ms"]) if cap is not None else self.chain_ms

    @property
    def ttft_ms(self) -> float:
        n = self.prompt_tokens
        # a quota'd host processes the whole batch at its quota's rate when that is the slower
        compute = sum(max(h["compute_ms"], h.get("cap_ms") or 0.0) for h in self.hosts)
        return (
            self.token_ms
            + n * compute
            + sum(link["latency_ms"] + n * link["activation_ms"] + link["logits_ms"] for link in self.links)
        )

    def bottleneck(self) -> str:
        cap = self.cap
        if cap is not None and cap["cap_ms"] >= self.chain_ms:
            cpu = cap["cap_ms"] * cap["cpu_quota"]
            return "%s CPU quota %g: %.1f ms of CPU per token caps the fleet at %.1f tokens/s" % (
                cap["name"],
                cap["cpu_quota"],
                cpu,
                1000.0 / cap["cap_ms"],
            )
        terms = [("%s compute" % h["name"], h["compute_ms"]) for h in self.hosts]
        if self.token_ms > 0 and self.hosts:
            terms.append(("%s per-token work" % self.hosts[0]["name"], self.token_ms))
        terms += [("link head-%s" % link["name"], link["total_ms"]) for link in self.links]
        name, value = max(terms, key=lambda t: t[1])
        share = value / self.ms_per_token if self.ms_per_token > 0 else 0.0
        return "%s: %.2f ms of %.2f ms per token (%.0f%%)" % (name, value, self.ms_per_token, 100 * share)

    def to_plan(self) -> Dict[str, Any]:
        ms = self.ms_per_token
        return {
            "tokens_per_second": round(1000.0 / ms, 2) if ms > 0 else None,
            "ms_per_token": round(ms, 3),
            "chain_ms": round(self.chain_ms, 3),
            "token_ms": round(self.token_ms, 3),
            "ttft_s": round(self.ttft_ms / 1000.0, 3),
            "ttft_prompt_tokens": self.prompt_tokens,
            "bottleneck": self.bottleneck(),
            "hosts": [
                {k: (round(v, 3) if isinstance(v, float) else v) for k, v in h.items()} for h in self.hosts
            ],
            "links": [
                {k: (round(v, 3) if isinstance(v, float) else v) for k, v in link.items()}
                for link in self.links
            ],
        }


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the time model reads of a model: the width of an activation row (``n_embd``) and of
    the logits (``n_vocab``), and the output layer's decode work in repeating layers
    (:func:`output_layer_equivalents` of the model's layout; 1.0 when only a plan's figures are
    known, as profile.py prices a request: its output layer is measured, not weighed)."""

    n_embd: int
    n_vocab: int
    output_equivalents: float = 1.0

    @classmethod
    def of(cls, model: Model) -> Shape:
        return cls(model.n_embd, model.n_vocab, output_layer_equivalents(model))


def link_terms(model: Any, name: str, fig: Figures, holds_output: bool) -> Dict[str, Any]:
    """One worker's link per token: its round trip, the activation row in and out (the output
    holder sends the logits back instead of a row). ``model``: a Model or a :class:`Shape`."""
    row = fig.transfer_ms(model.n_embd * FLOAT_BYTES)
    activation = row if holds_output else 2.0 * row
    logits = fig.transfer_ms(model.n_vocab * FLOAT_BYTES) if holds_output else 0.0
    latency = fig.rtt_ms or 0.0
    return {
        "name": name,
        "rtt_ms": fig.rtt_ms,
        "mbit_s": fig.mbit_s,
        "latency_ms": latency,
        "activation_ms": activation,
        "logits_ms": logits,
        "total_ms": latency + activation + logits,
    }


def estimate(
    model: Model,
    head: Host,
    workers: Sequence[Host],
    head_layers: int,
    worker_layers: Sequence[int],
    output_on_head: bool,
    figures: Dict[str, Figures],
    prompt_tokens: int = PROMPT_TOKENS,
) -> Optional[Estimate]:
    """The estimate of a placement given by its parts, or None when a used host has no figures."""
    return estimate_split(
        Shape.of(model),
        head.name,
        [w.name for w in workers],
        head_layers,
        worker_layers,
        output_on_head,
        figures,
        prompt_tokens,
    )


def estimate_split(
    shape: Shape,
    head: str,
    workers: Sequence[str],
    head_layers: int,
    worker_layers: Sequence[int],
    output_on_head: bool,
    figures: Dict[str, Figures],
    prompt_tokens: int = PROMPT_TOKENS,
) -> Optional[Estimate]:
    """The estimate of a split given by host names (a plan's, :mod:`plan`): the head's layers,
    each worker's in ``--rpc`` order, where the output layer is; None when a used host has no
    figures."""
    hosts: List[Dict[str, Any]] = []
    links: List[Dict[str, Any]] = []
    head_fig = figures.get(head)
    if head_fig is None:
        return None
    hosts.append(
        {
            "name": head,
            "layers": head_layers,
            "ms_per_layer": head_fig.ms_per_layer,
            "compute_ms": head_layers * head_fig.ms_per_layer,
        }
    )
    for i, (w, count) in enumerate(zip(workers, worker_layers)):
        fig = figures.get(w)
        if fig is None:
            return None
        hosts.append(
            {
                "name": w,
                "layers": count,
                "ms_per_layer": fig.ms_per_layer,
                "compute_ms": count * fig.ms_per_layer,
            }
        )
        links.append(link_terms(shape, w, fig, i == len(workers) - 1 and not output_on_head))
    # the output layer's own compute, on its holder (the head, or the last worker): measured
    # there, else its weight in repeating layers at the holder's ms per layer
    holder = hosts[0] if output_on_head or not workers else hosts[-1]
    holder_fig = figures[holder["name"]]
    equivalents = shape.output_equivalents
    holder["output_layer_equivalents"] = equivalents
    holder["output_ms"] = holder_fig.output_time(equivalents)
    holder["output_priced"] = "figures" if holder_fig.output_ms is not None else "by weight"
    holder["compute_ms"] += holder["output_ms"]
    capped = None
    for h in hosts:
        fig = figures[h["name"]]
        if not fig.cpu_quota:
            continue
        output_cpu = fig.output_cpu(equivalents) if h is holder else 0.0
        cap = fig.cap_ms(h["layers"], output_cpu) if h["layers"] > 0 or output_cpu > 0 else None
        if cap is not None:
            h["cpu_quota"] = fig.cpu_quota
            h["cap_ms"] = cap
            if capped is None or cap > capped["cap_ms"]:
                capped = h
    return Estimate(hosts, links, prompt_tokens, capped, head_fig.token_ms or 0.0)


def estimate_devices(
    model: Model, p: Placement, figures: Dict[str, Figures], prompt_tokens: int = PROMPT_TOKENS
) -> Optional[Estimate]:
    """The estimate of a device placement (device_placement.py; ``p.devices`` set), or None when a
    used host has no figures.

    The chain adds the devices in order on each host: each device's layers at its own cost
    (:func:`device_cost`: measured, the host's CPU figure, or an assumed default), the output
    layer at its holder device's cost. A hop between two devices of one host crosses no network
    (the head's own GPUs are local; a worker's devices are one rpc-server, which copies between
    them itself); a worker's link is paid once, as on a CPU-only fleet. A CPU quota caps the
    work of the devices that run on the host's CPUs (its CPU, a Vulkan driver on the CPU)."""
    shape = Shape.of(model)
    equivalents = shape.output_equivalents
    hosts: List[Dict[str, Any]] = []
    links: List[Dict[str, Any]] = []
    capped: Optional[Dict[str, Any]] = None
    head_fig = figures.get(p.head.name)
    if head_fig is None or p.devices is None:
        return None
    for i, (host, row) in enumerate(zip(p.hosts(), p.devices)):
        fig = figures.get(host.name)
        if fig is None:
            return None
        entry: Dict[str, Any] = {
            "name": host.name,
            "layers": sum(s.count for s in row),
            "ms_per_layer": fig.ms_per_layer,
            "compute_ms": 0.0,
            "devices": [],
        }
        cpu_ms = 0.0
        holds_output = False
        for s in row:
            if not s.used and not (i == 0 and s.dev.is_cpu):
                continue
            cost = device_cost(fig, s.dev.name, s.dev.backend, s.dev.type, s.dev.cpu_driver)
            dev = {
                "name": s.dev.name,
                "backend": s.dev.backend,
                "layers": s.count,
                "ms_per_layer": cost.ms_per_layer,
                "priced": cost.priced,
                "compute_ms": s.count * cost.ms_per_layer,
            }
            # CPU ms per ms of time on a device that runs on the host's CPUs (its quota's share)
            cpu_ratio = fig.cpu_per_layer / fig.ms_per_layer
            work = s.count * cost.ms_per_layer * cpu_ratio if cost.on_cpu else 0.0
            if s.output:
                holds_output = True
                if s.dev.is_cpu:
                    output_ms, measured = fig.output_time(equivalents), fig.output_ms is not None
                    output_cpu = fig.output_cpu(equivalents)
                else:
                    measured = cost.output_ms is not None
                    output_ms = cost.output_ms if measured else equivalents * cost.ms_per_layer
                    output_cpu = output_ms * cpu_ratio if cost.on_cpu else 0.0
                dev["output_ms"] = output_ms
                dev["compute_ms"] += output_ms
                entry["output_layer_equivalents"] = equivalents
                entry["output_ms"] = output_ms
                entry["output_priced"] = "figures" if measured else "by weight"
                work += output_cpu
            entry["compute_ms"] += dev["compute_ms"]
            entry["devices"].append(dev)
            cpu_ms += work
        if fig.cpu_quota and cpu_ms > 0:
            entry["cpu_quota"] = fig.cpu_quota
            entry["cap_ms"] = cpu_ms / fig.cpu_quota
            if capped is None or entry["cap_ms"] > capped["cap_ms"]:
                capped = entry
        hosts.append(entry)
        if i > 0:
            links.append(link_terms(shape, host.name, fig, holds_output))
    return Estimate(hosts, links, prompt_tokens, capped, head_fig.token_ms or 0.0)


def assumed_devices(est: Estimate) -> List[str]:
    """One line per device of a prediction priced by an assumed default, not a measured figure."""
    return [
        "%s %s: no measured speed figure, priced at %s = %.4g ms per layer (an assumption: measure"
        " it with playbooks/profile.yml or give llmfleet_profile.devices)"
        % (h["name"], d["name"], d["priced"].split(": ", 1)[1], d["ms_per_layer"])
        for h in est.hosts
        for d in h.get("devices") or []
        if d["priced"].startswith("assumed") and (d["layers"] or "output_ms" in d)
    ]


def output_layer_equivalents(model: Model) -> float:
    """The output layer's decode work in repeating layers: its weight over the average layer's.

    Decode on a CPU reads every weight once per token, so work follows weight bytes; a small
    model's output (n_vocab x n_embd) outweighs many layers (Gemma 3 270M: 178 MB against 3.8 MB
    a layer, about 47 layers), so where it goes decides the speed."""
    if not model.layer_bytes:
        return 1.0
    average = sum(model.layer_bytes) / float(len(model.layer_bytes))
    return max(1.0, model.output_bytes / average) if average > 0 else 1.0


def estimate_placement(
    p: Placement, model: Model, figures: Dict[str, Figures], prompt_tokens: int = PROMPT_TOKENS
) -> Optional[Estimate]:
    """The estimate of a placement: over its devices when it has them (a fleet with GPUs)."""
    if p.devices is not None:
        return estimate_devices(model, p, figures, prompt_tokens)
    return estimate(
        model, p.head, p.workers, p.head_layers, p.worker_layers, p.output_on_head, figures, prompt_tokens
    )


def links_bound(
    model: Any, workers: Sequence[Host], figures: Dict[str, Figures], output_on_head: bool
) -> float:
    """The link terms of a set, the cheapest output holder assumed (order does not change the rest)."""
    if not workers:
        return 0.0
    plain = [link_terms(model, w.name, figures[w.name], False)["total_ms"] for w in workers]
    if output_on_head:
        return sum(plain)
    holding = [link_terms(model, w.name, figures[w.name], True)["total_ms"] for w in workers]
    return sum(plain) + min(hd - pl for hd, pl in zip(holding, plain))


def speed_output_choices(opts: Any) -> List[bool]:
    """Where the speed search tries the output layer: as ``opts.output_layer`` says, else both."""
    if opts.output_layer == "head":
        return [True]
    if opts.output_layer == "worker":
        return [False]
    return [True, False]

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan as a typed object: plan.json (docs/plan-format.md) parsed once, at the boundary.

Controller only, pure. :meth:`Plan.from_dict` checks what the readers of a plan rely on (the
hosts, their roles and layer ranges, the workers in ``--rpc`` order, the model's figures, the
arguments) and refuses a plan it cannot read with a :class:`PlanError` naming the field and the
value (``plan: hosts[1].layers must be [first, last) with 0 <= first <= last, got [3, 1]``).
profile.py and tune.py read plans only through it: the head, the workers, the layers per host,
the placement the time model prices, llama-server's arguments, and the same plan with another
split (:meth:`Plan.with_split`, whose arguments come from the one builder,
placement_render.split_args).

A host holds devices (:class:`Device`): plan.json version 2 lists them per host (``devices``,
in llama.cpp's order); a version 1 plan is still read, each host one CPU holding its layers.
"""

from __future__ import absolute_import, annotations, division, print_function

import copy
import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import DEVICE_TYPES
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import budget_mib
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import (
    OUTPUT_ON_HEAD_ARGS,
    split_args,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.split_rule import (
    rpc_device_names,
    rpc_report_names,
)

__metaclass__ = type

ROLES = ("head", "worker")
VERSIONS = (1, 2)  # plan.json versions read: 2 lists each host's devices, 1 has one CPU per host
# llama-server options that say where the layers go (split_args writes them) and its polling level
SPLIT_OPTIONS = (
    "--rpc",
    "--device",
    "-dev",
    "--tensor-split",
    "-ts",
    "-ngl",
    "--n-gpu-layers",
    "-sm",
    "--split-mode",
)
POLL_OPTIONS = ("--poll", "--poll-batch")


class PlanError(ValueError):
    """A plan that cannot be read (the message names the field and the value)."""


class PlanEmpty(PlanError):
    """A plan dict without host rows (``hosts`` absent or empty: nothing planned or deployed yet);
    ``value`` is what ``hosts`` held."""

    def __init__(self, value: Any) -> None:
        super().__init__("plan: hosts must be a non-empty list of host rows, got %r" % (value,))
        self.value = value


def _fail(field: str, what: str, value: Any) -> PlanError:
    return PlanError("plan: %s must be %s, got %r" % (field, what, value))


def _int(value: Any, field: str, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise _fail(field, "an integer >= %d" % lo, value)
    return value


def _number(value: Any, field: str) -> Optional[float]:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok:
        raise _fail(field, "a finite number", value)
    return float(value)


def _text(value: Any, field: str, optional: bool = True) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(field, "a non-empty string", value)
    return value


@dataclasses.dataclass(frozen=True)
class Device:
    """One entry of a host's ``devices`` (plan.json version 2): where some of its layers run.

    ``name`` is the device as the host lists it (``Vulkan0``, ``CPU``: what an rpc-server's
    ``-d`` takes), ``report_name`` as the head's llama.cpp prints it in its buffer report
    (``Vulkan0``, ``CPU`` on the head; ``RPC<i>[<endpoint>]`` for a worker's device, ``i`` its
    place in the worker's ``-d`` list: ``RPC0[10.0.0.2:50052]``),
    ``layers`` [first, last) of the repeating layers, ``predicted_mib`` its buffers (weights, kv,
    compute, total) and ``budget_mib`` what it may hold; ``calibrated`` whether its backend's
    memory model is measured on the pinned build; ``uma`` whether its memory is the host's RAM,
    ``cpu_driver`` whether it runs on the host's CPUs (a Vulkan driver on the CPU)."""

    name: str
    layers: Tuple[int, int]
    output_layer: bool
    report_name: str = ""
    backend: str = "cpu"
    type: str = "cpu"
    predicted_mib: Mapping[str, float] = dataclasses.field(default_factory=dict)
    budget_mib: Optional[float] = None
    calibrated: bool = True
    # a device whose memory is the host's RAM (an iGPU, lavapipe), and one that runs on the host's
    # CPUs (a Vulkan driver on the CPU): plan.json says each only when true
    uma: bool = False
    cpu_driver: bool = False

    @property
    def kind(self) -> str:
        """``gpu``, ``igpu`` or ``cpu`` (its type)."""
        return self.type

    @property
    def layer_count(self) -> int:
        return self.layers[1] - self.layers[0]

    @classmethod
    def from_dict(cls, row: Any, field: str) -> Device:
        if not isinstance(row, Mapping):
            raise _fail(field, "a device dict", row)
        name = str(_text(row.get("name"), field + ".name", optional=False))
        span = _span(row.get("layers"), field + ".layers")
        mib = row.get("predicted_mib") or {}
        if not isinstance(mib, Mapping):
            raise _fail(field + ".predicted_mib", "a dict of MiB", mib)
        kind = row.get("type", "cpu")
        if kind not in DEVICE_TYPES:
            raise _fail(field + ".type", "one of " + ", ".join(DEVICE_TYPES), kind)
        return cls(
            name=name,
            layers=span,
            output_layer=bool(row.get("output_layer")),
            report_name=str(_text(row.get("report_name"), field + ".report_name") or name),
            backend=str(_text(row.get("backend"), field + ".backend") or "cpu"),
            type=str(kind),
            predicted_mib={
                str(k): _number(v, "%s.predicted_mib.%s" % (field, k))
                for k, v in mib.items()
                if v is not None
            },
            budget_mib=_number(row.get("budget_mib"), field + ".budget_mib"),
            calibrated=bool(row.get("calibrated", True)),
            uma=bool(row.get("uma", False)),
            cpu_driver=bool(row.get("cpu_driver", False)),
        )


def _span(span: Any, field: str) -> Tuple[int, int]:
    if (
        not isinstance(span, (list, tuple))
        or len(span) != 2
        or any(isinstance(x, bool) or not isinstance(x, int) for x in span)
        or not 0 <= span[0] <= span[1]
    ):
        raise _fail(field, "[first, last) with 0 <= first <= last", span)
    return (span[0], span[1])


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """One row of the plan's ``hosts``."""

    name: str
    role: str  # head | worker
    layers: Tuple[int, int]
    output_layer: bool
    endpoint: Optional[str] = None
    address: Optional[str] = None
    threads: Optional[int] = None
    predicted_mib: Mapping[str, float] = dataclasses.field(default_factory=dict)
    headroom_mib: Optional[float] = None
    usable_mib: Optional[float] = None
    # plan.json version 2's devices; empty for a version 1 row (its one CPU, see ``devices``)
    listed_devices: Tuple[Device, ...] = ()

    @property
    def layer_count(self) -> int:
        """The repeating layers it holds."""
        return self.layers[1] - self.layers[0]

    @property
    def devices(self) -> Tuple[Device, ...]:
        """Its devices in llama.cpp's order (a version 1 row: one CPU holding its layers)."""
        if self.listed_devices:
            return self.listed_devices
        return (Device("CPU", self.layers, self.output_layer, report_name="CPU"),)

    def device_names(self) -> List[str]:
        """Its devices as the host names them (an rpc-server's ``-d`` list: ``Vulkan0,CPU``)."""
        return [d.name for d in self.devices]

    @property
    def gpu_devices(self) -> Tuple[Device, ...]:
        """Its devices other than the CPU."""
        return tuple(d for d in self.devices if d.backend != "cpu")

    @property
    def budget_mib(self) -> Optional[float]:
        """Its memory budget: its predicted total + headroom (None when the row has no figures)."""
        total = self.predicted_mib.get("total")
        if self.headroom_mib is None or total is None:
            return None
        return float(self.headroom_mib) + float(total)

    @classmethod
    def from_dict(cls, row: Any, field: str, role: str) -> HostPlan:
        if not isinstance(row, Mapping):
            raise _fail(field, "a host dict", row)
        name = _text(row.get("name"), field + ".name", optional=False)
        role = row.get("role", role)
        if role not in ROLES:
            raise _fail(field + ".role", "head or worker", role)
        span = _span(row.get("layers", [0, 0]), field + ".layers")
        threads = row.get("threads")
        mib = row.get("predicted_mib") or {}
        if not isinstance(mib, Mapping):
            raise _fail(field + ".predicted_mib", "a dict of MiB", mib)
        listed = row.get("devices")
        devices: Tuple[Device, ...] = ()
        if listed is not None:
            if not isinstance(listed, list) or not listed:
                raise _fail(field + ".devices", "a non-empty list of devices", listed)
            devices = tuple(Device.from_dict(d, "%s.devices[%d]" % (field, i)) for i, d in enumerate(listed))
            held = sum(d.layer_count for d in devices)
            outside = [
                d.name
                for d in devices
                if d.layer_count and not span[0] <= d.layers[0] <= d.layers[1] <= span[1]
            ]
            if held != span[1] - span[0] or outside:
                raise _fail(
                    field + ".devices",
                    "devices holding the host's layers %r between them" % (list(span),),
                    [[d.name, list(d.layers)] for d in devices],
                )
            names = [d.name for d in devices]
            if len(set(names)) != len(names):
                raise _fail(field + ".devices", "devices with unique names", names)
        return cls(
            name=str(name),
            role=str(role),
            layers=(span[0], span[1]),
            output_layer=bool(row.get("output_layer")),
            endpoint=_text(row.get("endpoint"), field + ".endpoint"),
            address=_text(row.get("address"), field + ".address"),
            threads=_int(threads, field + ".threads", 1) if threads is not None else None,
            predicted_mib={
                str(k): _number(v, "%s.predicted_mib.%s" % (field, k))
                for k, v in mib.items()
                if v is not None
            },
            headroom_mib=_number(row.get("headroom_mib"), field + ".headroom_mib"),
            usable_mib=_number(row.get("usable_mib"), field + ".usable_mib"),
            listed_devices=devices,
        )


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """The plan's ``model``: what profile and tune read of it."""

    n_layer: Optional[int] = None
    n_embd: int = 0
    n_vocab: int = 0
    tied_output: bool = True
    output_mib: Optional[float] = None
    output_largest_mib: Optional[float] = None
    pipeline_extra_mib: Optional[float] = None

    @classmethod
    def from_dict(cls, data: Any) -> ModelPlan:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise _fail("model", "a dict", data)
        n_layer = data.get("n_layer")
        return cls(
            n_layer=_int(n_layer, "model.n_layer", 1) if n_layer is not None else None,
            n_embd=_int(data.get("n_embd") or 0, "model.n_embd"),
            n_vocab=_int(data.get("n_vocab") or 0, "model.n_vocab"),
            tied_output=bool(data.get("tied_output", True)),
            output_mib=_number(data.get("output_mib"), "model.output_mib"),
            output_largest_mib=_number(data.get("output_largest_mib"), "model.output_largest_mib"),
            pipeline_extra_mib=_number(data.get("pipeline_extra_mib"), "model.pipeline_extra_mib"),
        )


def _partition(value: Any) -> Tuple[int, ...]:
    """``vllm.pp_layer_partition`` (``"13,13"`` or a list) -> (13, 13): one positive count a stage."""
    parts = (
        list(value) if isinstance(value, (list, tuple)) else [p for p in str(value).split(",") if p.strip()]
    )
    try:
        counts = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise PlanError(
            "plan: vllm.pp_layer_partition %r is not a comma-separated list of integers" % (value,)
        ) from None
    if not counts or any(c <= 0 for c in counts):
        raise PlanError(
            "plan: vllm.pp_layer_partition %r must have one positive layer count per stage" % (value,)
        )
    return counts


def _whole(value: Any, field: str) -> int:
    """A count of the ``vllm`` section as an int (a number given as text is read)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PlanError("plan: %s is %r, expected a number" % (field, value)) from None


@dataclasses.dataclass(frozen=True)
class VllmPlan:
    """The plan's ``vllm`` section (the lws target): which host holds each pipeline stage, its
    layers (VLLM_PP_LAYER_PARTITION), the KV cache space per rank, each stage's weights as the
    planner computed them, and the stored element width of the weights."""

    stages: Tuple[str, ...]
    layer_counts: Tuple[int, ...]
    kvcache_space_gib: int
    stage_weights_mib: Tuple[float, ...]
    weights_dtype_bytes: int = 2  # a GGUF plan: 16-bit; a Hugging Face checkpoint says its own

    @property
    def pipeline_size(self) -> int:
        return len(self.stages)

    @property
    def partition(self) -> str:
        """VLLM_PP_LAYER_PARTITION: ``13,13``."""
        return ",".join(str(c) for c in self.layer_counts)

    @classmethod
    def from_dict(cls, data: Any, n_layer: Optional[int]) -> VllmPlan:
        """Parse ``vllm`` (checked against the model's ``n_layer``); :class:`PlanError` names the
        field and the value, in this order: the partition, the pipeline size and the stages, the
        layer sum, the KV space, the stage weights."""
        if not data or not isinstance(data, Mapping):
            raise PlanError(
                "plan: llmfleet_plan has no 'vllm' section (was the plan computed for the lws target?)"
            )
        counts = _partition(data.get("pp_layer_partition"))
        stages = data.get("stages") or []
        if not isinstance(stages, list) or any(not isinstance(h, str) or not h for h in stages):
            raise _fail("vllm.stages", "a list of host names", stages)
        size = _whole(data.get("pipeline_size"), "vllm.pipeline_size")
        if size != len(counts) or (stages and len(stages) != size):
            raise PlanError(
                "plan: vllm.pipeline_size %d disagrees with pp_layer_partition %r and stages %s"
                % (size, data.get("pp_layer_partition"), stages)
            )
        if not stages:
            raise PlanError("plan: vllm.stages is empty: the plan must name the host of every stage")
        if len(set(stages)) != len(stages):
            raise PlanError("plan: vllm.stages %s names a host twice: one rank per node" % (stages,))
        if n_layer is not None and sum(counts) != n_layer:
            raise PlanError(
                "plan: vllm.pp_layer_partition %r sums to %d, the model has %d layers"
                % (data.get("pp_layer_partition"), sum(counts), n_layer)
            )
        kv = _whole(data.get("kvcache_space_gib"), "vllm.kvcache_space_gib")
        if kv < 1:
            raise PlanError(
                "plan: vllm.kvcache_space_gib is %d: vLLM's CPU backend needs at least 1 GiB" % kv
            )
        weights = data.get("stage_weights_mib")
        if not isinstance(weights, list) or len(weights) != len(counts):
            raise PlanError(
                "plan: vllm.stage_weights_mib is %r, expected one figure per stage (%d):"
                " re-plan with playbooks/plan.yml (the planner computes each stage's weights)"
                % (weights, len(counts))
            )
        for rank, value in enumerate(weights):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise PlanError("plan: vllm.stage_weights_mib[%d] is %r, expected MiB >= 0" % (rank, value))
        stored = data.get("weights_dtype_bytes") or 2
        return cls(
            stages=tuple(stages),
            layer_counts=counts,
            kvcache_space_gib=kv,
            stage_weights_mib=tuple(float(w) for w in weights),
            weights_dtype_bytes=max(1, _whole(stored, "vllm.weights_dtype_bytes")),
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """A parsed plan: its rows, the head, the used workers in ``--rpc`` order, the model and the
    arguments; ``data`` is plan.json as read (:meth:`to_dict` gives it back, a copy)."""

    hosts: Tuple[HostPlan, ...]
    head: HostPlan
    workers: Tuple[HostPlan, ...]
    model: ModelPlan
    llama_server_args: Tuple[str, ...]
    data: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Parse a plan dict (plan.json, ``llmfleet_plan``); :class:`PlanError` names the field.

        The head is the row named by ``head`` (else the row whose role is head, else the first);
        a row without a role is the head's or a worker's by that. The workers are the rows of
        ``workers`` (when the plan lists them, else every worker row), in the rows' order."""
        if not isinstance(data, Mapping):
            raise _fail("(the plan)", "a dict", data)
        version = data.get("version", 1)
        if version not in VERSIONS:
            raise _fail("version", " or ".join(map(str, VERSIONS)), version)
        rows = data.get("hosts")
        if not rows:
            raise PlanEmpty(rows)
        if not isinstance(rows, list):
            raise _fail("hosts", "a non-empty list of host rows", rows)
        head_name = data.get("head")
        if head_name is None:
            head_name = next(
                (r.get("name") for r in rows if isinstance(r, Mapping) and r.get("role") == "head"),
                rows[0].get("name") if isinstance(rows[0], Mapping) else None,
            )
        hosts = []
        for i, row in enumerate(rows):
            default = "head" if isinstance(row, Mapping) and row.get("name") == head_name else "worker"
            hosts.append(HostPlan.from_dict(row, "hosts[%d]" % i, default))
        names = [h.name for h in hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise _fail("hosts", "rows with unique names", dupes)
        heads = [h for h in hosts if h.role == "head"]
        if len(heads) != 1 or heads[0].name != head_name:
            raise _fail(
                "head", "the name of the one head row (%s)" % ", ".join(h.name for h in heads), head_name
            )
        listed = data.get("workers")
        if listed is None:
            used = [h for h in hosts if h.role == "worker"]
        else:
            if not isinstance(listed, list) or any(not isinstance(n, str) for n in listed):
                raise _fail("workers", "a list of host names", listed)
            unknown = [n for n in listed if n not in names or n == head_name]
            if unknown:
                raise _fail("workers", "names of worker rows of hosts", unknown)
            used = [h for h in hosts if h.role == "worker" and h.name in listed]
        args = data.get("llama_server_args") or []
        if not isinstance(args, list) or any(not isinstance(a, (str, int, float)) for a in args):
            raise _fail("llama_server_args", "a list of strings", args)
        return cls(
            hosts=tuple(hosts),
            head=heads[0],
            workers=tuple(used),
            model=ModelPlan.from_dict(data.get("model")),
            llama_server_args=tuple(str(a) for a in args),
            data=data,
        )

    def to_dict(self) -> Dict[str, Any]:
        """plan.json as it was read (a deep copy: the caller may change it)."""
        return copy.deepcopy(dict(self.data))

    @property
    def table(self) -> str:
        """The placement table the planner wrote (``table``; "" when the plan has none)."""
        return str(self.data.get("table") or "")

    @property
    def warnings(self) -> Tuple[str, ...]:
        """The planner's warnings (``warnings``: an uncalibrated backend, a host left out)."""
        got = self.data.get("warnings") or []
        if not isinstance(got, list):
            raise _fail("warnings", "a list of strings", got)
        return tuple(str(w) for w in got)

    # ------------------------------------------------------------------ the placement

    @property
    def head_layers(self) -> int:
        return self.head.layer_count

    @property
    def worker_layers(self) -> List[int]:
        """The used workers' repeating layers, in ``--rpc`` order."""
        return [w.layer_count for w in self.workers]

    @property
    def output_on_head(self) -> bool:
        """Whether the head holds the output layer on its CPU (or no used worker holds it): what
        :meth:`with_split`'s ``output_on_head`` takes. A head whose own GPU holds it (a version 2
        plan of the head alone: the last device with layers) does not keep it on its CPU."""
        if any(d.output_layer for d in self.head.gpu_devices):
            return False
        return self.head.output_layer or not any(w.output_layer for w in self.workers)

    @property
    def names(self) -> List[str]:
        """The head, then the used workers in ``--rpc`` order."""
        return [self.head.name, *(w.name for w in self.workers)]

    def layer_counts(self) -> Dict[str, int]:
        """Host -> the repeating layers it holds (every row)."""
        return {h.name: h.layer_count for h in self.hosts}

    def host(self, name: str) -> Optional[HostPlan]:
        return next((h for h in self.hosts if h.name == name), None)

    def row(self, host: HostPlan) -> Dict[str, Any]:
        """A copy of the row of plan.json that ``host`` was read from (every field, kept as is)."""
        return copy.deepcopy(dict(self.data["hosts"][self.hosts.index(host)]))

    @property
    def options(self) -> Mapping[str, Any]:
        """The options the plan was made with (``planned_with.options``; empty when not recorded)."""
        got = (self.data.get("planned_with") or {}).get("options")
        return got if isinstance(got, Mapping) else {}

    def candidate(self, name: str) -> Optional[Mapping[str, Any]]:
        """A candidate host the plan was made from (``planned_with.hosts``: address, port, cpus)."""
        hosts = (self.data.get("planned_with") or {}).get("hosts") or []
        return next((h for h in hosts if isinstance(h, Mapping) and h.get("name") == name), None)

    # ------------------------------------------------------------------ the arguments

    def option_args(self) -> List[str]:
        """llama-server's arguments without the split (``--rpc``, ``--tensor-split``, ``-ngl``,
        ``-sm``, the output override) and without ``--poll``: the options the split keeps."""
        args = list(self.llama_server_args)
        out: List[str] = []
        i = 0
        while i < len(args):
            key, eq, _value = args[i].partition("=")
            if key in SPLIT_OPTIONS or key in POLL_OPTIONS:
                i += 1 if eq else 2
                continue
            if tuple(args[i : i + 2]) == OUTPUT_ON_HEAD_ARGS:
                i += 2
                continue
            out.append(args[i])
            i += 1
        return out

    def split_value(self, option: str) -> Optional[str]:
        """The value of one split option in the plan's arguments (None when absent)."""
        args = list(self.llama_server_args)
        for i, arg in enumerate(args):
            key, eq, value = arg.partition("=")
            if key == option:
                return value if eq else (args[i + 1] if i + 1 < len(args) else None)
        return None

    def with_split(
        self,
        workers: Sequence[Mapping[str, Any]],
        head_layers: int,
        counts: Sequence[int],
        output_on_head: bool,
        head: Optional[Mapping[str, Any]] = None,
        others: Sequence[Mapping[str, Any]] = (),
        poll: Optional[int] = None,
        device_layers: Optional[Mapping[str, Sequence[int]]] = None,
    ) -> Dict[str, Any]:
        """This plan (a dict) with another split: ``workers`` (rows, in ``--rpc`` order) holding
        ``counts`` repeating layers each after the head's ``head_layers``, the output layer on the
        head or the last worker; ``head`` replaces the head's row, ``others`` are rows of hosts
        the split does not use. Each row's ``layers`` and ``output_layer`` are set here, the
        arguments are split_args's followed by the plan's other options (and ``--poll poll``).

        A host whose row lists several devices (plan.json version 2: a worker offering
        ``Vulkan0,CPU``, a head with its CPU and its GPU) splits its layers over them in the
        row's order, llama.cpp's (the head's CPU first): ``device_layers`` names, per such host,
        the layers each device holds (``{"desktop": [30, 4]}``, summing to the host's count); a
        host it does not name keeps each device's layers when its own count is unchanged and is
        refused otherwise. Every device of a row stays in it (a worker's running rpc-server
        offers them all: the head's ``RPC<n>`` names count them), one with no layers gets a zero
        share. Such a plan's arguments carry ``--device`` and a tensor split per device
        (split_args with ``devices``); a plan whose every host is one CPU keeps the split over
        hosts."""
        if len(workers) != len(counts):
            raise PlanError("plan: %d workers for %d layer counts" % (len(workers), len(counts)))
        out = self.to_dict()
        head_row = dict(head) if head is not None else self.row(self.head)
        head_row["layers"] = [0, head_layers]
        head_row["output_layer"] = bool(output_on_head or not workers)
        placed = []
        first = head_layers
        for i, (row, count) in enumerate(zip(workers, counts)):
            row = dict(row, layers=[first, first + count])
            row["output_layer"] = not output_on_head and i == len(workers) - 1
            placed.append(row)
            first += count
        if self.split_value("--device") is not None or not all(_one_cpu_row(r) for r in [head_row, *placed]):
            head_row, placed, args = _device_split(head_row, placed, output_on_head, device_layers or {})
        else:
            head_row = _one_cpu(head_row, "CPU")
            placed = [_one_cpu(row, "RPC0[%s]" % row.get("endpoint")) for row in placed]
            args = split_args(
                [str(w.get("endpoint")) for w in placed], head_layers, list(counts), output_on_head
            )
        args += self.option_args()
        if poll is not None:
            args += ["--poll", str(poll)]
        out["hosts"] = [head_row, *placed, *others]
        out["workers"] = [str(w["name"]) for w in placed]
        out["llama_server_args"] = args
        return out

    # ------------------------------------------------------------------ what the targets render

    def fallback_hosts(self) -> Tuple[HostPlan, ...]:
        """The host rows of the fallbacks the planner found ok (``fallbacks[i].hosts``), parsed."""
        fallbacks = self.data.get("fallbacks") or []
        if not isinstance(fallbacks, list):
            raise _fail("fallbacks", "a list of fallback dicts", fallbacks)
        out: List[HostPlan] = []
        for i, fallback in enumerate(fallbacks):
            if not isinstance(fallback, Mapping):
                raise _fail("fallbacks[%d]" % i, "a fallback dict", fallback)
            if fallback.get("ok"):
                for j, row in enumerate(fallback.get("hosts") or []):
                    out.append(HostPlan.from_dict(row, "fallbacks[%d].hosts[%d]" % (i, j), "worker"))
        return tuple(out)

    def allowed_mib(self, host: HostPlan) -> float:
        """What the plan may put on ``host``: its row's usable MiB minus its reserve (0 when absent)."""
        row = self.data["hosts"][self.hosts.index(host)]
        return budget_mib(row.get("usable_mib"), row.get("reserve_mib"))

    @property
    def vllm(self) -> VllmPlan:
        """The ``vllm`` section (the lws target's stages), parsed; :class:`PlanError` when the plan
        has none or it is inconsistent (with itself or the model's layers)."""
        return VllmPlan.from_dict(self.data.get("vllm"), self.model.n_layer)

    @property
    def model_file(self) -> Dict[str, Any]:
        """The model's file as the plan names it: ``url``, ``sha256``, ``file`` ("" when absent) and
        ``bytes`` (0 when unknown)."""
        model = self.data.get("model") or {}
        size = model.get("bytes") or 0
        return {
            "url": str(model.get("url") or ""),
            "sha256": str(model.get("sha256") or ""),
            "file": str(model.get("file") or ""),
            "bytes": _int(size, "model.bytes"),
        }


def _one_cpu_row(row: Mapping[str, Any]) -> bool:
    """Whether a row is one CPU: no ``devices`` (version 1) or exactly one, of the CPU backend."""
    devices = row.get("devices")
    if devices is None:
        return True
    return (
        isinstance(devices, list)
        and len(devices) == 1
        and isinstance(devices[0], Mapping)
        and devices[0].get("backend", "cpu") == "cpu"
    )


def _one_cpu(row: Dict[str, Any], report_name: str) -> Dict[str, Any]:
    """A row of :meth:`Plan.with_split` with its ``devices`` following its new layers: a host
    whose one device is its CPU (a split over hosts does not move layers between devices)."""
    devices = row.get("devices")
    if devices is None:
        return row
    return dict(
        row,
        devices=[
            dict(
                devices[0],
                layers=list(row["layers"]),
                output_layer=bool(row["output_layer"]),
                report_name=report_name,
            )
        ],
    )


def _row_devices(row: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A row's devices in llama.cpp's order (a version 1 row: its one CPU)."""
    devices = row.get("devices")
    if devices is None:
        return [{"name": "CPU", "backend": "cpu"}]
    if not isinstance(devices, list) or not devices or not all(isinstance(d, Mapping) for d in devices):
        raise _fail("host %s: devices" % row.get("name"), "a non-empty list of device dicts", devices)
    return [dict(d) for d in devices]


def _device_counts(
    row: Mapping[str, Any], devices: Sequence[Mapping[str, Any]], given: Optional[Sequence[int]]
) -> List[int]:
    """The layers each of a row's devices holds in :meth:`Plan.with_split` (see there)."""
    name = row.get("name")
    count = row["layers"][1] - row["layers"][0]
    names = [d.get("name") for d in devices]
    if given is not None:
        got = list(given) if isinstance(given, (list, tuple)) else None
        if (
            got is None
            or len(got) != len(devices)
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in got)
            or sum(got) != count
        ):
            raise PlanError(
                "plan: host %s: device_layers %r must give each of its devices %s a layer count >= 0,"
                " %d in all" % (name, given, names, count)
            )
        return got
    if len(devices) == 1:
        return [count]
    held = [
        _span(d.get("layers", [0, 0]), "host %s: devices[%d].layers" % (name, i))
        for i, d in enumerate(devices)
    ]
    kept = [last - first for first, last in held]
    if sum(kept) != count:
        raise PlanError(
            "plan: host %s holds devices %s (%s layers): say how its %d layers split over them"
            " (with_split's device_layers)" % (name, names, kept, count)
        )
    return kept


def _device_split(
    head_row: Dict[str, Any],
    placed: List[Dict[str, Any]],
    output_on_head: bool,
    device_layers: Mapping[str, Sequence[int]],
) -> Tuple[Dict[str, Any], List[Dict[str, Any]], List[str]]:
    """:meth:`Plan.with_split` over devices: the rows with each device's ``layers``,
    ``output_layer`` and ``report_name``, and split_args over the device chain (the head's
    devices after its CPU by their names, then every worker's as ``RPC<n>``)."""
    rows = [head_row, *placed]
    unknown = sorted(set(device_layers) - {str(r.get("name")) for r in rows})
    if unknown:
        raise PlanError("plan: device_layers names hosts the split does not use: %s" % ", ".join(unknown))
    listed = [_row_devices(r) for r in rows]
    shares = [_device_counts(r, d, device_layers.get(str(r.get("name")))) for r, d in zip(rows, listed)]
    head_devices = listed[0]
    cpus = [i for i, d in enumerate(head_devices) if d.get("backend", "cpu") == "cpu"]
    if cpus not in ([], [0]):
        raise PlanError(
            "plan: host %s: the head's CPU must be its first device (llama.cpp's order), got %s"
            % (head_row.get("name"), [d.get("name") for d in head_devices])
        )
    on_cpu = 1 if cpus else 0
    # the chain --device names: the head's devices after its CPU, then each worker's devices
    chain = [(0, j) for j in range(on_cpu, len(head_devices))]
    chain += [(i, j) for i in range(1, len(rows)) for j in range(len(listed[i]))]
    counts = [shares[i][j] for i, j in chain]
    names = [str(head_devices[j].get("name")) for _i, j in chain[: len(head_devices) - on_cpu]]
    for got in rpc_device_names([len(d) for d in listed[1:]]) if placed else []:
        names += got
    endpoints = [str(w.get("endpoint")) for w in placed]
    cpu_layers = shares[0][0] if on_cpu else 0
    args = split_args(endpoints, cpu_layers, counts, output_on_head, devices=names)
    holders = [k for k, c in enumerate(counts) if c > 0]
    # the output layer: on the head's first device (its CPU) with -ot or when no device holds
    # layers, else on the last device that does (llama.cpp's output slot)
    output = (0, 0) if output_on_head or not holders else chain[holders[-1]]
    reports = [[str(d.get("name")) for d in head_devices]]
    reports += rpc_report_names(endpoints, [len(d) for d in listed[1:]]) if placed else []
    out_rows = []
    for i, (row, devices) in enumerate(zip(rows, listed)):
        row = dict(row, output_layer=output[0] == i)
        first = row["layers"][0]
        if row.get("devices") is not None:
            placed_devices = []
            for j, (device, count) in enumerate(zip(devices, shares[i])):
                placed_devices.append(
                    dict(
                        device,
                        layers=[first, first + count],
                        output_layer=output == (i, j),
                        report_name=reports[i][j],
                    )
                )
                first += count
            row["devices"] = placed_devices
        out_rows.append(row)
    return out_rows[0], out_rows[1:], args


def parse(data: Any) -> Plan:
    """:meth:`Plan.from_dict`."""
    return Plan.from_dict(data)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """The planner's answer when it places nothing (``ok: false``): why (``msg``), the table of
    what it tried as text, and the MiB missing per host (docs/planner.md)."""

    msg: str
    table_text: str = ""
    missing: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def parse_answer(data: Any) -> Any:
    """The planner's answer parsed: a :class:`Refusal` when it says ``ok: false``, else the
    :class:`Plan` (:func:`parse`; a :class:`PlanError` names the field at fault)."""
    if isinstance(data, Mapping) and not data.get("ok", True):
        missing = data.get("missing") or {}
        return Refusal(
            msg=str(data.get("msg") or "no placement"),
            table_text=str(data.get("table_text") or ""),
            missing=dict(missing) if isinstance(missing, Mapping) else {},
        )
    return parse(data)

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The placement's inputs: the hosts, the options and the model's layout (pure; the constants are
constants.py's).
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils import calibration
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import (
    CACHE_TYPES,
    DEFAULT_RESERVE_MIB,
    DEFAULT_RPC_PORT,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import (
    PlanInputError,
    check_hosts,
)

__metaclass__ = type


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


def plan_option(
    setting: Optional[str] = None,
    lo: Optional[float] = None,
    hi: Optional[float] = None,
    choices: Tuple[str, ...] = (),
    unset: Any = None,
) -> Dict[str, Any]:
    """The metadata of a field of :class:`Options`, the planner's options table
    (``dataclasses.field(default=..., metadata=plan_option(...))``; the field's default is the
    option's one default): ``setting`` the fleet-wide variable (``llmfleet_*``) the inventory sets
    it with (its default in fleet_defaults.py is the field's, the plan role reads it through the
    lookup ``llmfleet.cluster.plan_options``); ``lo``/``hi`` bound a number, ``choices`` a string;
    ``unset`` is the setting's value that means "not given" (the option's default then)."""
    return {"setting": setting, "lo": lo, "hi": hi, "choices": tuple(choices), "unset": unset}


@dataclasses.dataclass(frozen=True)
class Options:
    """The planner's options, one table: each field's default, fleet-wide setting and bounds
    (:func:`plan_option`). An option added here with a ``setting`` reaches the planner from the
    inventory with no other file changed (fleet_defaults.py, the plan_options lookup, the plan
    role and the checks read this table); docs/planner.md's inputs table names it."""

    context: int = dataclasses.field(default=4096, metadata=plan_option("llmfleet_context"))
    parallel: int = dataclasses.field(default=1, metadata=plan_option("llmfleet_parallel"))
    ubatch: int = 512
    cache_type_k: str = dataclasses.field(default="f16", metadata=plan_option("llmfleet_cache_type_k"))
    cache_type_v: str = dataclasses.field(default="f16", metadata=plan_option("llmfleet_cache_type_v"))
    output_layer: str = dataclasses.field(
        default="auto", metadata=plan_option("llmfleet_output_layer")
    )  # auto, worker, head
    link_mbit: Optional[float] = dataclasses.field(
        default=None, metadata=plan_option("llmfleet_link_mbit", unset=0)
    )
    head_layers: bool = dataclasses.field(default=True, metadata=plan_option("llmfleet_head_layers"))
    slow_link_mbit: float = 1000.0
    # vLLM stages: "fewest" follows the llama.cpp placement's hosts; "all" spreads over the head and
    # every candidate worker in proportion to their budgets (the lws target: the user chose the nodes)
    vllm_hosts: str = "fewest"
    # use at least this many workers (spare capacity, so fallbacks can fit)
    min_workers: int = dataclasses.field(default=0, metadata=plan_option("llmfleet_min_workers"))
    # auto | speed | memory: what the planner optimises once the memory fits (plugin_utils/speed_search.py);
    # the memory search here ignores it, it is recorded so that a change re-plans (planned_with)
    objective: str = dataclasses.field(default="auto", metadata=plan_option("llmfleet_plan_objective"))
    # the inventory's pinned llama.cpp build (llama_cpp_build; "" - none): chooses the memory
    # model's calibration (calibration.py); recorded so that another build re-plans (planned_with)
    llama_cpp_build: str = ""

    @property
    def calibration(self) -> calibration.Calibration:
        """The calibrated constants the memory model uses for this build (calibration.for_build)."""
        return calibration.for_build(self.llama_cpp_build).calibration

    @classmethod
    def from_dict(cls, options: Dict[str, Any]) -> Options:
        """The options from a checked dict (placement_inputs.check_options): a name the table does
        not have, or a value outside a field's ``lo``/``hi``/``choices``, is refused naming it."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in options if k not in fields)
        if unknown:
            raise PlanInputError(
                "options: %s not a planner option (known: %s)"
                % (", ".join(unknown) + (" is" if len(unknown) == 1 else " are"), ", ".join(sorted(fields)))
            )
        for name, value in options.items():
            meta = fields[name].metadata
            if meta.get("choices") and value not in meta["choices"]:
                raise PlanInputError(
                    "options: %s must be one of %s, got %r" % (name, ", ".join(meta["choices"]), value)
                )
            if meta.get("lo") is not None or meta.get("hi") is not None:
                lo, hi = meta.get("lo"), meta.get("hi")
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
                    raise PlanInputError(
                        "options: %s must be a number in [%s, %s], got %r" % (name, lo, hi, value)
                    )
        return cls(**options)

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


def planner_settings() -> Dict[str, Tuple[str, Any]]:
    """Fleet-wide setting -> (the option it sets, its default), from :class:`Options`' table."""
    out: Dict[str, Tuple[str, Any]] = {}
    for f in dataclasses.fields(Options):
        setting = f.metadata.get("setting")
        if setting:
            out[setting] = (f.name, f.metadata["unset"] if f.metadata.get("unset") is not None else f.default)
    return out


def planner_options(value: Any) -> Dict[str, Any]:
    """The options the inventory sets through the fleet-wide settings: option -> ``value(setting)``
    (the play's value, None when it sets none), read as the field's type; an option whose setting
    is unset, or set to its ``unset`` value, is left out (the planner's default holds)."""
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(Options):
        setting = f.metadata.get("setting")
        given = value(setting) if setting else None
        if given is None or (f.metadata.get("unset") is not None and given == f.metadata["unset"]):
            continue
        kind = str(f.type)
        try:
            if "bool" in kind:
                given = (
                    given
                    if isinstance(given, bool)
                    else str(given).strip().lower() in ("1", "true", "yes", "on")
                )
            elif "int" in kind:
                given = int(given)
            elif "float" in kind:
                given = float(given)
            else:
                given = str(given)
        except (TypeError, ValueError):
            raise PlanInputError(
                "%s must be of type %s (the planner's option %s), got %r" % (setting, kind, f.name, given)
            ) from None
        out[f.name] = given
    return out


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

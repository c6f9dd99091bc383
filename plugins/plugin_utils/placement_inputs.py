# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one typed, validated boundary between the inventory and the plan (controller only).

Every host dict and every option goes through here before the planner reads it, so the plan
never carries an unusable command line: every number is finite and in its range, addresses are
IP addresses (``ipaddress``) or RFC 1123 host names (no comma, space or port), ports are
1-65535 (0 and 70000 are refused, never defaulted), every worker has an address and no two
workers share an RPC endpoint. Each refusal is a PlanInputError (a ValueError) naming the host
or the option and the value, e.g. ``host w1: usable_mib must be a finite number, got nan``.

Keys this module does not know (``speed``, ``role``, future ones) pass through unchanged, so the
planner's own reading of them stays where it is.
"""

from __future__ import absolute_import, annotations, division, print_function

import ipaddress
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import (
    DEFAULT_RPC_PORT,
    MAX_MBIT_S,
)

__metaclass__ = type

MIB_PER_TIB = 1024 * 1024
# Memory, in MiB: usable and reserve between 0 and 64 TiB.
MAX_MIB = 64 * MIB_PER_TIB
MAX_CPUS = 4096
MAX_CONTEXT = 1 << 24
MAX_PARALLEL = 1024
MAX_UBATCH = 1 << 16
MAX_WORKERS = 1024
_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class PlanInputError(ValueError):
    """A host or an option the plan cannot be made from (the message names it and its value)."""


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # nan, inf, -inf
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def finite_number(value: Any, what: str, key: str, lo: float, hi: float) -> float:
    """``value`` as a float in [lo, hi]; numbers given as strings (inventory values) are read."""
    number: Optional[float] = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value) if not isinstance(value, int) or abs(value) < 1 << 63 else math.inf
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise PlanInputError("%s: %s must be a finite number, got %s" % (what, key, _show(value)))
    if not lo <= number <= hi:
        raise PlanInputError(
            "%s: %s must be between %s and %s, got %s" % (what, key, _num(lo), _num(hi), _show(value))
        )
    return number


def integer(value: Any, what: str, key: str, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi] (integral floats and digit strings accepted, bools not)."""
    number: Optional[int] = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 20:
        number = int(value.strip())
    if number is None:
        raise PlanInputError("%s: %s must be an integer, got %s" % (what, key, _show(value)))
    if not lo <= number <= hi:
        raise PlanInputError("%s: %s must be between %d and %d, got %s" % (what, key, lo, hi, _show(value)))
    return number


def _num(x: float) -> str:
    return "%d" % x if float(x).is_integer() else "%g" % x


def address(value: Any, what: str) -> str:
    """An IP address (IPv6 with or without brackets) or an RFC 1123 host name, normalised."""
    if not isinstance(value, str) or not value.strip():
        raise PlanInputError(
            "%s: address must be an IP address or a host name, got %s" % (what, _show(value))
        )
    text = value.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    labels = name.split(".")
    if len(name) <= 253 and all(_LABEL_RE.match(label) for label in labels) and not labels[-1].isdigit():
        return name.lower()
    hint = ""
    if re.search(r":\d+$", text) and "::" not in text:
        hint = " (the port goes in port / llmfleet_rpc_port)"
    elif re.search(r"[,\s]", text):
        hint = " (one address per host)"
    raise PlanInputError(
        "%s: address must be an IP address or an RFC 1123 host name, got %s%s" % (what, _show(value), hint)
    )


def port(value: Any, what: str) -> int:
    """An RPC port 1-65535; absent (None) means the default, 0 is refused."""
    if value is None:
        return DEFAULT_RPC_PORT
    return integer(value, what, "port", 1, 65535)


def endpoint(addr: str, rpc_port: int) -> str:
    return "[%s]:%d" % (addr, rpc_port) if ":" in addr else "%s:%d" % (addr, rpc_port)


def check_host(data: Any, role: str) -> Dict[str, Any]:
    """One host dict, validated and normalised (a copy; unknown keys pass through unchanged)."""
    if not isinstance(data, dict):
        raise PlanInputError("a %s entry must be a dict, got %s" % (role, _show(data)))
    name = data.get("name")
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > 253
        or re.search(r"[\x00-\x1f\x7f]", name)
    ):
        raise PlanInputError("a %s entry has no usable name: %s" % (role, _show(name)))
    what = "host %s" % name
    out = dict(data)
    if "usable_mib" not in data or data["usable_mib"] is None:
        raise PlanInputError("%s: usable_mib is missing" % what)
    out["usable_mib"] = finite_number(data["usable_mib"], what, "usable_mib", 0, MAX_MIB)
    if data.get("reserve_mib") is not None:
        out["reserve_mib"] = finite_number(data["reserve_mib"], what, "reserve_mib", 0, MAX_MIB)
    if data.get("cpus") is not None:
        out["cpus"] = integer(data["cpus"], what, "cpus", 1, MAX_CPUS)
    if "port" in data:
        out["port"] = port(data["port"], what)
    addr = data.get("address")
    if addr is None or (isinstance(addr, str) and not addr.strip()):
        if role == "worker":
            raise PlanInputError(
                "%s: a worker needs an address (llmfleet_rpc_address, or the probe's default_ipv4), got %s"
                % (what, _show(addr))
            )
        out["address"] = None
    else:
        out["address"] = address(addr, what)
    return out


def check_reserve(reserve_mib: Any) -> float:
    return finite_number(reserve_mib, "options", "reserve_mib", 0, MAX_MIB)


def check_hosts(
    head: Any, workers: Any, reserve_mib: Any = 64
) -> Tuple[Dict[str, Any], List[Dict[str, Any]], float]:
    """The head and the workers, validated: names unique, every worker at its own endpoint."""
    reserve = check_reserve(reserve_mib)
    if workers is None:
        workers = []
    if not isinstance(workers, (list, tuple)):
        raise PlanInputError("workers must be a list of host dicts, got %s" % _show(workers))
    if len(workers) > MAX_WORKERS:
        raise PlanInputError("workers: at most %d, got %d" % (MAX_WORKERS, len(workers)))
    head_out = check_host(head, "head")
    workers_out = [check_host(w, "worker") for w in workers]
    seen_names: Dict[str, str] = {}
    for h in [head_out, *workers_out]:
        if h["name"] in seen_names:
            raise PlanInputError("host names must be unique, repeated: %s" % h["name"])
        seen_names[h["name"]] = h["name"]
    seen: Dict[str, str] = {}
    for w in workers_out:
        ep = endpoint(w["address"], w.get("port") or DEFAULT_RPC_PORT)
        if ep in seen:
            raise PlanInputError("hosts %s and %s: both at the RPC endpoint %s" % (seen[ep], w["name"], ep))
        seen[ep] = w["name"]
    return head_out, workers_out, reserve


_INT_OPTIONS = {
    "context": (1, MAX_CONTEXT),
    "ubatch": (1, MAX_UBATCH),
    "min_workers": (0, MAX_WORKERS),
}


def check_options(options: Any) -> Dict[str, Any]:
    """The placement options, validated (a copy; None means the default; unknown keys pass)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise PlanInputError("options must be a dict, got %s" % _show(options))
    out = {k: v for k, v in options.items() if not (v is None and k != "link_mbit")}
    for key, (lo, hi) in _INT_OPTIONS.items():
        if key in out:
            out[key] = integer(out[key], "options", key, lo, hi)
    if "parallel" in out:
        out["parallel"] = integer(out["parallel"], "options", "parallel (-np)", 1, MAX_PARALLEL)
        context = out.get("context", 4096)
        if out["parallel"] > context:
            raise PlanInputError(
                "options: parallel (-np) %d is more than the context %d (each slot gets context / -np cells)"
                % (out["parallel"], context)
            )
    if out.get("link_mbit") is not None:
        out["link_mbit"] = finite_number(out["link_mbit"], "options", "link_mbit", 0.001, MAX_MBIT_S)
    if "slow_link_mbit" in out:
        out["slow_link_mbit"] = finite_number(
            out["slow_link_mbit"], "options", "slow_link_mbit", 0.001, MAX_MBIT_S
        )
    if "head_layers" in out and not isinstance(out["head_layers"], bool):
        raise PlanInputError("options: head_layers must be true or false, got %s" % _show(out["head_layers"]))
    for key, choices in (
        ("output_layer", ("auto", "worker", "head")),
        ("vllm_hosts", ("fewest", "all")),
    ):
        if key in out and out[key] not in choices:
            raise PlanInputError(
                "options: %s must be one of %s, got %s" % (key, ", ".join(choices), _show(out[key]))
            )
    for key in ("cache_type_k", "cache_type_v", "llama_cpp_build"):
        if key in out and not isinstance(out[key], str):
            raise PlanInputError("options: %s must be a string, got %s" % (key, _show(out[key])))
    if len(out.get("llama_cpp_build") or "") > 100:
        raise PlanInputError(
            "options: llama_cpp_build is longer than 100 characters: %s" % _show(out["llama_cpp_build"])
        )
    return out


def check_plan_inputs(
    head: Any, workers: Sequence[Any], options: Any = None, reserve_mib: Any = 64
) -> Tuple[Dict[str, Any], List[Dict[str, Any]], Dict[str, Any], float]:
    """Everything make_plan reads from the inventory, validated in one call."""
    opts = check_options(options)
    head_out, workers_out, reserve = check_hosts(head, workers, reserve_mib)
    return head_out, workers_out, opts, reserve

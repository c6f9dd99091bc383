# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan role's computation as one step (roles/plan, filter ``llmfleet.cluster.plan``).

Controller only, pure: no Ansible import. From the inventory's host variables, the model layout,
the speed profile and the plan of an earlier run it reads each host's figures
(:func:`speed_figures`), builds the placement hosts (:func:`hosts_from_vars`), decides whether
the earlier plan still stands (``placement.keep_previous``) and, when not, computes a fresh one
(``speed_search.make_plan``); it returns the plan with the lines the role prints. Errors are
:class:`PlanStepError` whose message starts with the step that refused (``plan_hosts``,
``profile_speed``, ``plan_keep``, ``plan_placement``), as the separate filters said before.
"""

from __future__ import absolute_import, annotations, division, print_function

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import DEFAULT_RPC_PORT
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_serving import build_problems
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import host_from_fact, keep_previous
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import PlacementError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import PlanInputError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import port as check_port
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import render_table
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import (
    Plan,
    PlanError,
    Refusal,
    parse_answer,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import ProfileError, speeds
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.rpc_fleet import host_flavour
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed_search import make_plan

__metaclass__ = type


class PlanStepError(ValueError):
    """An input the plan cannot be made from; the message names the step, the host and the value."""


def _get(hostvars: Any, key: str) -> Any:
    """A host variable, or None when the host does not set it (hostvars raise KeyError)."""
    try:
        return hostvars[key]
    except (KeyError, TypeError):
        return None


def _host_vars(hostvars: Mapping[str, Any], name: str, step: str) -> Any:
    try:
        return hostvars[name]
    except KeyError as err:
        raise PlanStepError("%s: host %s is not in the inventory" % (step, name)) from err


def hosts_from_vars(
    names: Sequence[str],
    hostvars: Mapping[str, Any],
    port: int = DEFAULT_RPC_PORT,
    speeds_by_host: Optional[Mapping[str, Any]] = None,
) -> List[Dict[str, Any]]:
    """The placement host dicts of ``names`` from their ``llmfleet_*`` host variables.

    Reads ``llmfleet_host`` (the probe fact or the inventory's what-if value),
    ``llmfleet_rpc_address``, ``llmfleet_rpc_port`` (default ``port``; 0 or 70000 refused naming
    the host, never replaced), ``llmfleet_reserve_mib`` and ``llmfleet_speed``; a host named in
    ``speeds_by_host`` with a dict carries that dict as its ``speed``.
    """
    out: List[Dict[str, Any]] = []
    for name in names or []:
        hv = _host_vars(hostvars, name, "plan_hosts")
        try:
            rpc_port = _get(hv, "llmfleet_rpc_port")
            # 0 is refused like 70000, not taken for "unset" (only an absent value is)
            rpc_port = check_port(port if rpc_port is None else rpc_port, "host %s" % name)
            out.append(
                host_from_fact(
                    str(name),
                    _get(hv, "llmfleet_host"),
                    address=_get(hv, "llmfleet_rpc_address"),
                    port=rpc_port,
                    reserve_mib=_get(hv, "llmfleet_reserve_mib"),
                    speed=_get(hv, "llmfleet_speed"),
                    gpu_reserve_mib=_get(hv, "llmfleet_gpu_reserve_mib"),
                    device_memory_mib=_get(hv, "llmfleet_device_memory_mib"),
                )
            )
        except (PlanInputError, TypeError, ValueError) as err:
            raise PlanStepError("plan_hosts: %s" % err) from err
        if speeds_by_host and isinstance(speeds_by_host.get(name), dict):
            out[-1]["speed"] = dict(speeds_by_host[name])
    return out


def speed_figures(
    names: Sequence[str],
    head: str,
    hostvars: Mapping[str, Any],
    profile: Optional[Mapping[str, Any]] = None,
    build: str = "",
    model_sha256: str = "",
) -> Dict[str, Any]:
    """Each host's speed figures (``profile.speeds``) from profile.json and ``llmfleet_profile``."""
    facts: Dict[str, Any] = {}
    given: Dict[str, Any] = {}
    for name in names or []:
        hv = _host_vars(hostvars, name, "profile_speed")
        facts[name] = _get(hv, "llmfleet_host")
        given[name] = _get(hv, "llmfleet_profile")
    try:
        return speeds(
            list(names or []), head, profile or None, facts, given, build or "", model_sha256 or None
        )
    except ProfileError as err:
        raise PlanStepError("profile_speed: %s" % err) from err


def placement(
    layout: Any,
    model: Dict[str, Any],
    head: Dict[str, Any],
    workers: Optional[Sequence[Dict[str, Any]]] = None,
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = 64,
    backend: str = "llama_cpp",
    target: str = "systemd",
) -> Dict[str, Any]:
    """The plan, or when the model does not fit ``{ok: false, msg, table, table_text, missing}``."""
    if not isinstance(layout, dict):
        raise PlanStepError("plan_placement: the input must be a model layout dict, got %r" % type(layout))
    try:
        return make_plan(
            layout, model, head, list(workers or []), dict(options or {}), float(reserve_mib), backend, target
        )
    except PlacementError as err:
        return {
            "ok": False,
            "msg": str(err).split("\n", 1)[0],
            "table": err.table,
            "table_text": render_table(err.table) if err.table else "",
            "missing": err.missing,
        }
    except (ValueError, TypeError) as err:
        raise PlanStepError("plan_placement: %s" % err) from err


def keep(
    previous: Any,
    layout: Any,
    model: Any,
    head: Any,
    workers: Optional[Sequence[Dict[str, Any]]] = None,
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = 64,
    backend: str = "llama_cpp",
    target: str = "systemd",
) -> Dict[str, Any]:
    """``placement.keep_previous`` with its inputs checked: ``{keep, reasons, hosts, table}``."""
    if not isinstance(layout, dict) or not isinstance(model, dict) or not isinstance(head, dict):
        raise PlanStepError("plan_keep: layout, model and head must be dicts")
    try:
        return keep_previous(
            previous,
            layout,
            model,
            head,
            list(workers or []),
            dict(options or {}),
            float(reserve_mib),
            backend,
            target,
        )
    except (KeyError, ValueError, TypeError) as err:
        raise PlanStepError("plan_keep: %s" % err) from err


def builds_refusal(
    plan: Any, names: Sequence[str], hostvars: Mapping[str, Any], table: str = ""
) -> Optional[Dict[str, Any]]:
    """The refusal (``{ok: false, msg, table_text, missing}``) of a plan (a :class:`plan.Plan` or
    its dict) that puts layers on a device whose backend a host's llama.cpp build lacks
    (device_serving.build_problem, the check the llama_rpc role makes again when it writes the
    units), or None when every build serves its devices. Each host's flavour is read as the
    llama_cpp role reads it (rpc_fleet.host_flavour)."""
    flavours = {name: host_flavour(_host_vars(hostvars, name, "plan_devices")) for name in names}
    try:
        problems = build_problems(plan, flavours)
    except PlanError as err:
        raise PlanStepError("plan_devices: %s" % err) from err
    if not problems:
        return None
    return {
        "ok": False,
        "msg": "; ".join(problems)
        + ". Install a build that carries the device's backend on that host (llama_cpp_flavour,"
        " docs/artifacts.md) or plan it without that device (llmfleet_host.devices)",
        "table": None,
        "table_text": table,
        "missing": {},
    }


def run(
    layout: Any,
    model: Dict[str, Any],
    head: str,
    workers: Sequence[str],
    hostvars: Mapping[str, Any],
    options: Optional[Dict[str, Any]] = None,
    reserve_mib: float = 64,
    backend: str = "llama_cpp",
    target: str = "systemd",
    port: int = DEFAULT_RPC_PORT,
    profile: Optional[Mapping[str, Any]] = None,
    build: str = "",
    previous: Optional[Mapping[str, Any]] = None,
    replan: bool = False,
    previous_path: str = "plan.json",
) -> Dict[str, Any]:
    """The plan role's computation: figures, hosts, keep or re-plan, and what to print.

    ``profile``: profile.json parsed ({} when there is none), or None when the role reads no
    speed figures (``plan_use_profile: false``, or its tag skipped): then no host gets figures
    from a profile or from ``llmfleet_profile``. ``previous``: the earlier run's plan.json parsed
    (None or {} when there is none); ignored when ``replan``.

    Returns ``plan`` (llmfleet_plan: the kept or the fresh plan, or the refusal dict with
    ``ok: false``), ``ok``, ``kept``, ``computed`` (whether a fresh plan was made), ``keep``
    (keep_previous's verdict), ``speed`` (the figures: ``speed``, ``source``, ``remeasure``) and
    ``lines`` (the table, the verdict and the plan's warnings, as the role prints them).
    """
    names = [head, *list(workers or [])]
    if profile is None:
        figures: Dict[str, Any] = {"speed": {}, "source": {}, "remeasure": []}
    else:
        model_sha256 = (model or {}).get("sha256") if isinstance(model, dict) else None
        figures = speed_figures(names, head, hostvars, profile, build, model_sha256 or "")
    by_host = figures.get("speed") or {}
    head_host = hosts_from_vars([head], hostvars, port, by_host)[0]
    worker_hosts = hosts_from_vars(list(workers or []), hostvars, port, by_host)
    earlier = {} if replan or not previous else dict(previous)
    verdict = keep(earlier, layout, model, head_host, worker_hosts, options, reserve_mib, backend, target)
    kept = bool(verdict.get("keep"))
    if kept:
        plan = earlier
        line = "kept the previous plan (%s): %s" % (previous_path, "; ".join(verdict.get("reasons") or []))
    else:
        plan = placement(layout, model, head_host, worker_hosts, options, reserve_mib, backend, target)
        why = "plan_replan is set" if replan else "; ".join(verdict.get("reasons") or [])
        line = "re-planned: %s" % why
    try:
        answer = parse_answer(plan)
    except PlanError as err:
        raise PlanStepError("%s: %s" % ("plan_keep" if kept else "plan_placement", err)) from err
    if kept:
        shown = verdict.get("table") or ""
    else:
        shown = answer.table_text if isinstance(answer, Refusal) else answer.table
    if isinstance(answer, Plan) and backend == "llama_cpp":
        refused = builds_refusal(answer, names, hostvars, shown)
        if refused is not None:
            plan, answer = refused, parse_answer(refused)
    ok = isinstance(answer, Plan)
    warnings = ["WARNING: %s" % w for w in answer.warnings] if isinstance(answer, Plan) else []
    return {
        "plan": plan,
        "ok": ok,
        "kept": kept,
        "computed": not kept,
        "keep": verdict,
        "speed": figures,
        "lines": [*str(shown).split("\n"), line, *warnings],
    }

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tuning a running fleet for speed (playbooks/tune.yml, docs/tune.md).

Controller only. Three steps, each a pure function of plain data:

- :func:`predict`: the predicted tokens/s of ANY plan dict (the running one, planned by memory
  before a profile existed, included) under the fleet's current speed figures, with the time
  model of :mod:`speed` (the plan's own ``speed`` was computed with older figures, or none).
- :func:`decide`: redeploy the speed plan only when its predicted gain over the running plan is
  more than ``min_gain`` (a fraction: 0.10 = 10 %); the reason is a sentence for the output.
- :func:`report`: tune.json from the measured rounds (the two plans alternated: A, B, A, B, so
  that the machine's drift weighs on both), the measured gain against ``min_gain`` (the speed
  plan is kept only when it is confirmed) and the before/after table.
- :func:`needs_profile`: whether tune.yml must measure (profile.yml) before it re-plans, or can
  reuse the figures of profile.json.
"""

from __future__ import absolute_import, annotations, division, print_function

import math
import statistics
from typing import Any, Dict, List, Mapping, Sequence

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import Dev, Share
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import Placement
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Host, Model
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import (
    Plan,
    PlanEmpty,
    PlanError,
    Refusal,
    parse,
    parse_answer,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed import (
    Shape,
    estimate_devices,
    estimate_split,
    figures_of,
)

__metaclass__ = type

# The measured order of the two plans when the speed plan is deployed: the running plan (A)
# first, as it is, then the new one (B), then each once more; the fleet ends on B.
SCHEDULE = ("before", "after", "before", "after")
PROFILE_MODES = ("auto", "always", "never")


class TuneError(ValueError):
    """A plan or a measurement tune cannot use (the message names the host or the value)."""


def _plan(plan: Mapping[str, Any]) -> Plan:
    """The plan parsed (plan.parse), or :class:`TuneError` naming the field at fault."""
    try:
        return parse(plan)
    except PlanEmpty as err:
        raise TuneError(
            "the plan has no hosts (got %r): run playbooks/site.yml first" % (err.value,)
        ) from None
    except PlanError as err:
        raise TuneError(str(err)) from err


def needs_profile(
    plan: Mapping[str, Any], figures: Mapping[str, Any], mode: Any = "auto", hosts: Sequence[str] = ()
) -> Dict[str, Any]:
    """Whether tune.yml measures the fleet (profile.yml) before it re-plans.

    ``figures``: profile_speed's result for the fleet's hosts (``speed``: host -> figures,
    ``remeasure``: why a host's figures cannot be used). ``hosts``: every host the speed re-plan
    may use (the head and every worker of the inventory; default the running plan's), since the
    speed objective refuses a candidate without figures. ``mode``: ``always`` measures,
    ``never`` reuses profile.json as it is (a host without figures then fails the prediction,
    named), ``auto`` measures unless every one of those hosts has usable figures: a second run
    on a tuned fleet restarts nothing. Returns ``measure`` and ``reason``."""
    mode = str(mode).lower() if not isinstance(mode, bool) else ("always" if mode else "never")
    if mode not in PROFILE_MODES:
        raise TuneError("tune_profile must be one of %s, got %r" % (", ".join(PROFILE_MODES), mode))
    if mode == "always":
        return {"measure": True, "reason": "tune_profile is always: measuring the running plan"}
    if mode == "never":
        return {"measure": False, "reason": "tune_profile is never: the figures of profile.json as they are"}
    running = list(_plan(plan).names)
    names = running + [str(h) for h in hosts or () if str(h) not in running]
    speed = figures.get("speed") or {}
    missing = [name for name in names if name not in speed]
    if not missing:
        return {
            "measure": False,
            "reason": "profile.json has usable figures for every host of the fleet (%s): "
            "reusing them (tune_profile=always measures again)" % ", ".join(names),
        }
    why = [r for r in figures.get("remeasure") or [] if str(r).split(":", 1)[0] in missing]
    return {
        "measure": True,
        "reason": "measuring the running plan: no usable figures for %s%s"
        % (
            ", ".join(missing),
            " (%s)" % "; ".join(why)
            if why
            else (" (not in profile.json)" if speed else " (no profile.json)"),
        ),
    }


def predict(
    plan: Mapping[str, Any], speed: Mapping[str, Mapping[str, Any]], layout: Mapping[str, Any]
) -> Dict[str, Any]:
    """The predicted ``tokens_per_second`` / ``ms_per_token`` / ``ttft_s`` / ``bottleneck`` of a
    plan under ``speed`` (host -> {ms_per_layer, rtt_ms, mbit_s}, profile_speed's ``speed``).

    Raises :class:`TuneError` naming a host the plan uses that has no (usable) figures."""
    parsed = _plan(plan)
    model = Model.from_layout(dict(layout))
    figures = {}
    for i, name in enumerate(parsed.names):
        try:
            fig = figures_of({"name": name, "speed": speed.get(name)}, "head" if i == 0 else "worker")
        except ValueError as err:
            raise TuneError(str(err)) from err
        if fig is None:
            raise TuneError(
                "host %s: no speed figures to predict the plan with (measure it: playbooks/profile.yml)"
                % name
            )
        figures[name] = fig
    if any(h.gpu_devices for h in [parsed.head, *parsed.workers]):
        est = estimate_devices(model, _device_placement(parsed), figures)
    else:
        est = estimate_split(
            Shape.of(model),
            parsed.head.name,
            [w.name for w in parsed.workers],
            parsed.head_layers,
            parsed.worker_layers,
            parsed.output_on_head,
            figures,
        )
    if est is None:
        raise TuneError("the plan uses a host without speed figures (measure it: playbooks/profile.yml)")
    return est.to_plan()


def _device_placement(parsed: Plan) -> Placement:
    """The placement a plan with devices serves, as speed.estimate_devices reads it: each host's
    devices (llama.cpp's order) with their layers, the output layer's holder, and whether a device
    runs on its host's CPUs (its work counts in a CPU quota)."""
    hosts = [parsed.head, *parsed.workers]
    shares = [
        [
            Share(
                Dev(h.name, d.name, d.backend, d.type, d.uma, 0.0, 0.0, d.cpu_driver),
                count=d.layer_count,
                first=d.layers[0],
                output=d.output_layer,
            )
            for d in h.devices
        ]
        for h in hosts
    ]
    return Placement(
        Host(parsed.head.name, "head", 0.0),
        [Host(w.name, "worker", 0.0) for w in parsed.workers],
        parsed.head_layers,
        parsed.worker_layers,
        parsed.output_on_head,
        [],
        devices=shares,
    )


def _workers_of(plan: Mapping[str, Any]) -> List[Any]:
    """What the workers' rpc-servers are started with: name, endpoint, threads and devices (its
    ``-d`` list) of each worker the plan uses (sorted). Two plans with the same list differ only in
    the head's arguments."""
    return sorted(
        (w.name, str(w.endpoint), str(w.threads), ",".join(w.device_names())) for w in _plan(plan).workers
    )


def decide(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    speed: Mapping[str, Mapping[str, Any]],
    layout: Mapping[str, Any],
    min_gain: float = 0.10,
    previous: Any = None,
) -> Dict[str, Any]:
    """Whether to redeploy ``after`` (the speed plan) in place of ``before`` (the running plan).

    ``previous``: the tune.json of the last run (or None). When it measured this same speed plan
    against this same running plan and did not keep it (its measured gain not above its
    ``min_gain``), the plan is not redeployed again: the reason quotes that verdict (pass
    ``previous=None``, ``tune_retry``, to measure it again).

    Returns ``redeploy``, ``head_only`` (the two plans start the same workers the same way: only
    the head's llama-server arguments differ, so serving either is the head's plan.json and a
    restart), ``gain`` (predicted after / before - 1), both predictions, the ``schedule`` of
    measured rounds and ``reason``."""
    try:
        min_gain = float(min_gain)
    except (TypeError, ValueError) as err:
        raise TuneError("tune_min_gain must be a number >= 0, got %r" % (min_gain,)) from err
    if not math.isfinite(min_gain) or min_gain < 0:
        raise TuneError("tune_min_gain must be a number >= 0, got %r" % (min_gain,))
    try:
        answer = parse_answer(after)
    except PlanError:
        answer = None  # predict() names the field at fault
    if isinstance(answer, Refusal):
        raise TuneError("the speed plan failed: %s" % answer.msg)
    pred_before = predict(before, speed, layout)
    pred_after = predict(after, speed, layout)
    args_before, args_after = list(_plan(before).llama_server_args), list(_plan(after).llama_server_args)
    same = args_before == args_after
    gain = pred_after["tokens_per_second"] / pred_before["tokens_per_second"] - 1.0
    rejected = (
        isinstance(previous, Mapping)
        and previous.get("redeployed") is True
        and previous.get("gain_confirmed") is False
        and [str(a) for a in (previous.get("before") or {}).get("llama_server_args") or []] == args_before
        and [str(a) for a in (previous.get("after") or {}).get("llama_server_args") or []] == args_after
    )
    if same:
        redeploy = False
        reason = (
            "the fleet already runs the speed plan (the same llama-server arguments): nothing to redeploy"
        )
    elif gain > min_gain and rejected:
        redeploy = False
        reason = (
            "no redeploy: this speed plan was measured against the running plan before and not kept (%s); "
            "tune_retry=true measures it again" % previous.get("verdict")
        )
    elif gain > min_gain:
        redeploy = True
        reason = (
            "redeploy: the speed plan is predicted %.0f%% faster (%.2f -> %.2f tokens/s), above %.0f%%"
            % (
                100 * gain,
                pred_before["tokens_per_second"],
                pred_after["tokens_per_second"],
                100 * min_gain,
            )
        )
    else:
        redeploy = False
        reason = (
            "no redeploy: the speed plan is predicted %+.0f%% (%.2f -> %.2f tokens/s), not above %.0f%%"
            % (100 * gain, pred_before["tokens_per_second"], pred_after["tokens_per_second"], 100 * min_gain)
        )
    return {
        "redeploy": redeploy,
        "head_only": redeploy and _workers_of(before) == _workers_of(after),
        "gain": round(gain, 4),
        "min_gain": min_gain,
        "predicted_before": pred_before,
        "predicted_after": pred_after,
        "schedule": list(SCHEDULE) if redeploy else ["before"],
        "reason": reason,
    }


def _measure(name: str, summary: Mapping[str, Any]) -> Dict[str, float]:
    """tokens/s and TTFT (medians) of one round from api_bench's summary."""

    def median(key: str) -> float:
        block = summary.get(key) or {}
        value = block.get("median") if isinstance(block, Mapping) else None
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
        if not ok:
            raise TuneError(
                "round %s: %s median must be a finite number > 0, got %r (ok requests: %r)"
                % (name, key, value, summary.get("ok"))
            )
        return float(value)

    return {"tokens_per_second": median("output_tps"), "ttft_s": median("ttft_seconds")}


def report(
    decision: Mapping[str, Any],
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    rounds: Sequence[Mapping[str, Any]],
) -> Dict[str, Any]:
    """tune.json: ``before`` and ``after`` (measured tokens/s and TTFT, the median over that plan's
    rounds, and its ``llama_server_args``), ``predicted_tokens_per_second`` of each, ``ratio``
    (after / before, measured), the rounds, the decision and the table (a list of lines).

    ``rounds``: one ``{plan: before|after, summary: <api_bench summary>}`` per measured round.
    Without a redeploy ``after`` is the running plan, measured by the same rounds."""
    measured: Dict[str, List[Dict[str, float]]] = {"before": [], "after": []}
    shown: List[Dict[str, Any]] = []
    for i, entry in enumerate(rounds):
        which = entry.get("plan")
        if which not in measured:
            raise TuneError("round %d: plan must be before or after, got %r" % (i + 1, which))
        m = _measure("%d (%s)" % (i + 1, which), entry.get("summary") or {})
        measured[which].append(m)
        shown.append(dict(m, plan=which))
    if not measured["before"]:
        raise TuneError("no measured round of the running plan")
    redeployed = bool(decision.get("redeploy"))
    if redeployed and not measured["after"]:
        raise TuneError("the speed plan was deployed but no round measured it")
    if not redeployed:
        measured["after"] = measured["before"]
        after = before

    def side(which: str, plan: Mapping[str, Any], predicted: Mapping[str, Any]) -> Dict[str, Any]:
        runs = measured[which]
        return {
            "tokens_per_second": round(statistics.median(r["tokens_per_second"] for r in runs), 3),
            "ttft_s": round(statistics.median(r["ttft_s"] for r in runs), 4),
            "predicted_tokens_per_second": predicted.get("tokens_per_second"),
            "llama_server_args": list(_plan(plan).llama_server_args),
            "rounds": len(runs),
        }

    pred_after = decision["predicted_after"] if redeployed else decision["predicted_before"]
    out_before = side("before", before, decision["predicted_before"])
    out_after = side("after", after, pred_after)
    ratio = out_after["tokens_per_second"] / out_before["tokens_per_second"]
    min_gain = float(decision.get("min_gain") or 0.0)
    measured_gain = ratio - 1.0
    if redeployed:
        # rounded: 11 / 10 - 1 is 0.10000000000000009 in floating point, not above 10 %
        confirmed = round(measured_gain, 6) > min_gain
        verdict = (
            "%s: the speed plan measured %+.0f%% (%.2f -> %.2f tokens/s, medians of %d and %d rounds), %s %.0f%%"
            % (
                "kept" if confirmed else "not kept, the running plan is served again",
                100 * measured_gain,
                out_before["tokens_per_second"],
                out_after["tokens_per_second"],
                out_before["rounds"],
                out_after["rounds"],
                "above" if confirmed else "not above",
                100 * min_gain,
            )
        )
    else:
        confirmed = None
        verdict = "nothing redeployed: %.2f tokens/s measured over %d round%s" % (
            out_before["tokens_per_second"],
            out_before["rounds"],
            "" if out_before["rounds"] == 1 else "s",
        )
    out = {
        "before": out_before,
        "after": out_after,
        "predicted_tokens_per_second": {
            "before": out_before["predicted_tokens_per_second"],
            "after": out_after["predicted_tokens_per_second"],
        },
        "ratio": round(ratio, 3),
        "measured_gain": round(measured_gain, 4),
        "gain_confirmed": confirmed,
        "verdict": verdict,
        "redeployed": redeployed,
        "predicted_gain": decision.get("gain"),
        "min_gain": decision.get("min_gain"),
        "reason": decision.get("reason"),
        "rounds": shown,
    }
    out["table"] = table(out)
    return out


def table(result: Mapping[str, Any]) -> List[str]:
    """The before/after table as lines of fixed-width text."""
    lines = [
        "%-7s %12s %12s %8s  %s" % ("plan", "tokens/s", "predicted", "ttft s", "llama-server arguments"),
    ]
    for which in ("before", "after"):
        side = result[which]
        predicted = side.get("predicted_tokens_per_second")
        lines.append(
            "%-7s %12.2f %12s %8.3f  %s"
            % (
                which,
                side["tokens_per_second"],
                "%.2f" % predicted if isinstance(predicted, (int, float)) else "-",
                side["ttft_s"],
                " ".join(side["llama_server_args"]),
            )
        )
    lines.append(
        "measured after/before: %.2fx over %d rounds (%s); %s"
        % (
            result["ratio"],
            len(result["rounds"]),
            ", ".join(r["plan"] for r in result["rounds"]),
            result.get("reason"),
        )
    )
    if result.get("verdict"):
        lines.append(str(result["verdict"]))
    return lines

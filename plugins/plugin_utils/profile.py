# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's speed profile (<llmfleet_output_dir>/profile.json, docs/profile.schema.json).

Controller only. Three steps:

- :func:`compute_figures`: a host's decode cost in ms per layer per token, from one real request
  (the verify role's CPU samples of each llama.cpp unit before and after it, the head's
  ``timings`` and the plan that served it).
- :func:`build_profile`: the figures plus the link probe's, with the fingerprints they belong to
  (each host's hardware, the llama.cpp build, the model's sha256) and when they were measured.
- :func:`speeds`: the per-host ``speed`` dicts the planner reads (``ms_per_layer``, a quota'd
  host's ``cpu_quota`` and ``cpu_ms_per_layer``, and for a worker ``rtt_ms`` and ``mbit_s`` of
  its link to the head), from the profile or, for a what-if
  host, from its inventory's ``llmfleet_profile``. A figure that is stale (the host, the build or
  the model changed), zero, negative, not finite, or a 0 Mbit link is never used: the host is
  listed in ``remeasure`` with the reason (or, for inventory figures, refused with an error).
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import OUTPUT_ON_HEAD_ARGS

# 2: the output layer measured apart (output_ms, output_cpu_ms), the head's token_ms; a version 1
# profile priced every layer of the output layer's holder by weight: its hosts are re-measured
PROFILE_VERSION = 2
REMEASURE_HINT = "re-measure with playbooks/profile.yml"
# Sane upper bounds: above these a figure is a unit mistake, not a slow machine.
LIMITS = {
    "ms_per_layer": 60000.0,
    "output_ms": 60000.0,
    "output_cpu_ms": 60000.0,
    "token_ms": 60000.0,
    "cpu_ms_per_layer": 60000.0,
    "cpu_quota": 4096.0,
    "rtt_ms": 60000.0,
    "mbit_s": 1000000.0,
}
# The compute figures that go into the planner's speed dict besides ms_per_layer (when present).
QUOTA_KEYS = ("cpu_quota", "cpu_ms_per_layer")
OUTPUT_KEYS = ("output_ms", "output_cpu_ms", "token_ms")
SPEED_FIGURE_KEYS = ("ms_per_layer", *QUOTA_KEYS, *OUTPUT_KEYS)
# What identifies a host's hardware: when any of these changes, its figures are stale.
FINGERPRINT_KEYS = (
    "arch",
    "cpu_model",
    "cpus",
    "cpus_online",
    "cpu_quota",
    "isa",
    "total_mib",
    "cgroup_limit_mib",
)
MIN_TOKENS = 4
MIN_CPU_SECONDS = 0.01
# rpc-server's threads when measured: with more than one, its CPU seconds are mostly its threads
# polling (molecule/tune, 2 threads: 10.68 CPU s for 8 layers over 64 tokens; 1 thread: 0.94)
MEASURE_THREADS = 1


class ProfileError(Exception):
    """A profile or a figure that cannot be used (the message names the host and the value)."""


def fingerprint(fact: Mapping[str, Any]) -> Dict[str, Any]:
    """What identifies a host (from its ``llmfleet_host`` fact): CPUs, their model, memory."""
    memory = fact.get("memory") or {}
    isa = fact.get("isa")
    return {
        "arch": fact.get("arch"),
        "cpu_model": fact.get("cpu_model"),
        "cpus": fact.get("cpus"),
        "cpus_online": fact.get("cpus_online"),
        "cpu_quota": fact.get("cpu_quota"),
        "isa": sorted(isa) if isinstance(isa, list) else None,
        "total_mib": memory.get("total_mib") if isinstance(memory, dict) else None,
        "cgroup_limit_mib": memory.get("cgroup_limit_mib") if isinstance(memory, dict) else None,
    }


def fingerprint_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
    """The fingerprint fields that differ, as "field old -> new"."""
    return [
        "%s %s -> %s" % (key, _show(old.get(key)), _show(new.get(key)))
        for key in FINGERPRINT_KEYS
        if old.get(key) != new.get(key)
    ]


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "[]"
    return str(value)


def check_figure(host: str, key: str, value: Any, where: str) -> float:
    """``value`` as a float, or :class:`ProfileError` naming the host, the field and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError("%s: %s %r in %s is not a number" % (host, key, value, where))
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ProfileError("%s: %s is %s in %s (not a finite number)" % (host, key, number, where))
    if number <= 0:
        what = "a 0 Mbit link" if key == "mbit_s" else "not positive"
        raise ProfileError("%s: %s is %s in %s (%s)" % (host, key, value, where, what))
    limit = LIMITS.get(key)
    if limit is not None and number > limit:
        raise ProfileError("%s: %s is %s in %s (above the sane bound %s)" % (host, key, value, where, limit))
    return number


# --------------------------------------------------------------------------- compute cost


def _layer_count(h: Mapping[str, Any]) -> int:
    """The repeating layers a plan row holds (its ``layers`` [first, last))."""
    first, last = (h.get("layers") or [0, 0])[:2]
    return max(0, int(last) - int(first))


def _layer_equivalents(plan_hosts: Sequence[Mapping[str, Any]], tied_output: bool = True) -> Dict[str, float]:
    """Per host: its repeating layers, plus the output layer counted by its weight in layers.

    Decode reads every weight once per token, so a host's work follows its weight bytes; the
    output layer (vocab x n_embd) weighs many layers on a small model. The average repeating
    layer is read off the hosts without the output layer; the head's own weights (which hold the
    token embedding, a lookup and no work) are left out."""
    per_layer = []
    for h in plan_hosts:
        held = _layer_count(h)
        weights = (h.get("predicted_mib") or {}).get("weights")
        if h.get("role") == "worker" and not h.get("output_layer") and held and weights:
            per_layer.append(float(weights) / held)
    avg = sum(per_layer) / len(per_layer) if per_layer else None
    out = {}
    for h in plan_hosts:
        count = float(_layer_count(h))
        if h.get("output_layer"):
            weights = (h.get("predicted_mib") or {}).get("weights")
            extra = 1.0
            if avg and weights:
                # a worker's weights beyond its layers are the output layer; the head's are the
                # token embedding (a lookup, no work) plus the output: the same tensor when the
                # output is tied, else two of about the same size
                beyond = float(weights) - count * avg
                if h.get("role") != "worker" and not tied_output:
                    beyond /= 2.0
                extra = max(1.0, beyond / avg)
            count += extra
        out[str(h.get("name"))] = count
    return out


def request_costs(
    plan: Mapping[str, Any],
    samples: Mapping[str, Sequence[Mapping[str, Any]]],
    timings: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    units: Mapping[str, str],
) -> Dict[str, Dict[str, Any]]:
    """Each planned host's CPU ms per generated token during one measured request.

    ``samples``: host -> the verify role's three ``host_usage`` samples (before and after the
    idle window, after the request). ``timings``: llama-server's ``timings`` of that request
    (``prompt_ms``, ``predicted_ms``, ``predicted_n``). ``facts``: host -> ``llmfleet_host``.

    Per host: ``cpu_ms`` = the unit's CPU seconds during the request x the decode share of the
    request's time (predicted_ms over prompt_ms + predicted_ms) x 1000 / the tokens, with its
    ``layers`` (repeating layers held), ``output`` (holds the output layer), ``parallel`` (the
    CPUs its threads run on at once: min(threads, the CPU count)) and ``cpu_quota``; a host whose
    figure cannot be made gets ``reason`` ("not measured: <host>: <why>") instead.
    """
    tokens = timings.get("predicted_n")
    predicted_ms = timings.get("predicted_ms")
    prompt_ms = timings.get("prompt_ms") or 0.0
    out: Dict[str, Dict[str, Any]] = {}
    for h in plan.get("hosts") or []:
        if not isinstance(h, dict):
            continue
        name = str(h.get("name"))
        role = str(h.get("role"))
        unit = units.get(role, "")

        def fail(why: str, name: str = name) -> None:
            out[name] = {"reason": "not measured: %s: %s" % (name, why)}

        layers = _layer_count(h)
        if layers <= 0 and not h.get("output_layer") and role != "head":
            # (the head works every token: its CPU is measured even without layers)
            fail("holds no layers in the plan")
            continue
        if not isinstance(tokens, (int, float)) or tokens < MIN_TOKENS:
            fail("the request generated %r tokens (at least %d needed)" % (tokens, MIN_TOKENS))
            continue
        if not isinstance(predicted_ms, (int, float)) or predicted_ms <= 0:
            fail("the request has no timings.predicted_ms (%r)" % (predicted_ms,))
            continue
        host_samples = samples.get(name) or []
        if len(host_samples) != 3:
            fail("no usage samples around the request")
            continue
        before = (host_samples[1].get("units") or {}).get(unit) or {}
        after = (host_samples[2].get("units") or {}).get(unit) or {}
        if "cpu_seconds" not in before or "cpu_seconds" not in after:
            fail("unit %s was not sampled" % unit)
            continue
        cpu = float(after["cpu_seconds"]) - float(before["cpu_seconds"])
        if cpu < MIN_CPU_SECONDS:
            fail("unit %s used %.4f CPU seconds during the request" % (unit, cpu))
            continue
        threads = h.get("threads")
        if role == "worker" and isinstance(threads, (int, float)) and threads > MEASURE_THREADS:
            fail(
                "rpc-server ran with %s threads: its CPU seconds are mostly its threads polling, not"
                " its work (playbooks/profile.yml measures every worker at %d thread)"
                % (threads, MEASURE_THREADS)
            )
            continue
        fact = facts.get(name) or {}
        quota = fact.get("cpu_quota")
        quota = (
            float(quota)
            if isinstance(quota, (int, float)) and not isinstance(quota, bool) and quota > 0
            else None
        )
        # the CPUs its threads run on at once while it has quota left (the fact's cpus is the
        # CPU count, at most the quota rounded up): the quota caps the rate, it does not slow a
        # thread down (speed.py)
        cpus = float(fact.get("cpus") or 1)
        parallel = min(float(threads), cpus) if isinstance(threads, (int, float)) and threads > 0 else cpus
        decode_share = float(predicted_ms) / (float(predicted_ms) + float(prompt_ms))
        out[name] = {
            "role": role,
            "layers": layers,
            "output": bool(h.get("output_layer")),
            "cpu_ms": cpu * decode_share * 1000.0 / float(tokens),
            "cpu_seconds": round(cpu, 4),
            "tokens": int(tokens),
            "cpu_quota": quota,
            "parallel": parallel,
            "threads": int(threads) if isinstance(threads, (int, float)) and threads > 0 else None,
            "decode_share": round(decode_share, 4),
        }
    return out


def compute_figures(
    plan: Mapping[str, Any],
    samples: Mapping[str, Sequence[Mapping[str, Any]]],
    timings: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    units: Mapping[str, str],
    costs: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> Dict[str, Dict[str, Any]]:
    """Each planned host's ms per layer per token from ONE measured request (no second request
    with the output layer moved: :func:`output_apart` does better when there is one).

    The CPU ms per token of :func:`request_costs` over the host's layer equivalents is
    ``cpu_ms_per_layer``; over the CPUs its threads run on at once it is ``ms_per_layer``, the
    unthrottled time. A CFS quota is not divided in: it is recorded as ``cpu_quota`` and the
    time model caps the rate with it (a host that used 1.4 % of a CPU under a 0.25 quota was never
    throttled: its time is its CPU time). The output layer's holder counts it by its weight in
    layers (:func:`_layer_equivalents`). ``costs``: the request's :func:`request_costs`, when the
    caller has them already.
    """
    plan_hosts = [h for h in plan.get("hosts") or [] if isinstance(h, dict)]
    equivalents = _layer_equivalents(plan_hosts, bool((plan.get("model") or {}).get("tied_output", True)))
    if costs is None:
        costs = request_costs(plan, samples, timings, facts, units)
    out: Dict[str, Dict[str, Any]] = {}
    for name, got in costs.items():
        layers = equivalents.get(name, 0.0)
        if layers <= 0:
            out[name] = {"reason": "not measured: %s: holds no layers in the plan" % name}
            continue
        if "reason" in got:
            out[name] = got
            continue
        cpu_ms = got["cpu_ms"] / layers
        out[name] = _figure(got, cpu_ms, layers)
    return out


def _figure(got: Mapping[str, Any], cpu_ms: float, layers: float) -> Dict[str, Any]:
    return {
        "ms_per_layer": round(cpu_ms / got["parallel"], 4),
        "cpu_ms_per_layer": round(cpu_ms, 4),
        "cpu_quota": got["cpu_quota"],
        "cpu_seconds": got["cpu_seconds"],
        "tokens": got["tokens"],
        "layer_equivalents": round(layers, 3),
        "parallel_cpus": round(got["parallel"], 3),
        "threads": got["threads"],
        "decode_share": got["decode_share"],
    }


def output_apart(
    costs: Sequence[Mapping[str, Mapping[str, Any]]],
) -> Tuple[Dict[str, Dict[str, Any]], Optional[float]]:
    """Each worker's figures from requests through the same split that differ only in where the
    output layer is.

    ``costs``: :func:`request_costs` of each measuring placement (:func:`measuring_placements`),
    in order. On a worker that holds the output layer in one request, ``output_cpu_ms`` = its CPU
    ms per token in that request - in one where it does not hold it (its repeating layers are the
    same: everything else it does per token cancels). A worker's ``cpu_ms_per_layer`` comes from
    a request in which it holds repeating layers and no output layer (the most layers). The head
    is not priced from its CPU seconds here (llama-server's threads burn CPU while they wait on
    the workers): :func:`head_figures` prices it from the requests' wall time.

    Returns (host -> figures or ``reason``, for the workers; the output layer's measured cost in
    that worker's repeating layers on the first worker that gave one, None when none did).
    """
    out: Dict[str, Dict[str, Any]] = {}
    per_layer: Dict[str, float] = {}
    names = sorted({n for c in costs for n in c})
    for name in names:
        rows = [c.get(name) or {} for c in costs]
        if not any(r.get("role") == "worker" for r in rows):
            continue
        plain = [r for r in rows if "cpu_ms" in r and r["layers"] > 0 and not r["output"]]
        if plain:
            best = max(plain, key=lambda r: r["layers"])
            per_layer[name] = best["cpu_ms"] / best["layers"]
            out[name] = _figure(best, per_layer[name], float(best["layers"]))
        else:
            why = [r["reason"] for r in rows if "reason" in r]
            out[name] = {
                "reason": why[0]
                if why
                else "not measured: %s: it held no repeating layer without the output layer" % name
            }
    ratio = None
    for c in costs:
        for name, with_it in sorted(c.items()):
            if name not in per_layer or "cpu_ms" not in with_it or not with_it["output"]:
                continue
            without = next(
                (r for r in (d.get(name) or {} for d in costs) if "cpu_ms" in r and not r["output"]), None
            )
            if without is None:
                continue
            cost = (
                with_it["cpu_ms"]
                - without["cpu_ms"]
                - (with_it["layers"] - without["layers"]) * per_layer[name]
            )
            if cost * with_it["tokens"] / 1000.0 < MIN_CPU_SECONDS:
                out[name]["output_reason"] = (
                    "not measured: %s: the output layer added %.3f CPU ms a token (%.3f with it, %.3f without)"
                    % (name, cost, with_it["cpu_ms"], without["cpu_ms"])
                )
                continue
            out[name]["output_cpu_ms"] = round(cost, 4)
            out[name]["output_ms"] = round(cost / with_it["parallel"], 4)
            if ratio is None:
                ratio = cost / per_layer[name]
    return out, (round(ratio, 3) if ratio is not None else None)


def _placement_of(plan: Mapping[str, Any]) -> Tuple[str, List[str], int, List[int], bool]:
    """(head, workers in --rpc order, head layers, worker layers, output on the head) of a plan."""
    hosts = [h for h in plan.get("hosts") or [] if isinstance(h, dict)]
    used = set(plan.get("workers") or [])
    head = next(h for h in hosts if h.get("role") == "head")
    workers = [h for h in hosts if h.get("role") == "worker" and h.get("name") in used]
    on_head = bool(head.get("output_layer")) or not any(w.get("output_layer") for w in workers)
    return (
        str(head["name"]),
        [str(w["name"]) for w in workers],
        _layer_count(head),
        [_layer_count(w) for w in workers],
        on_head,
    )


def predict_request(plan: Mapping[str, Any], figures: Mapping[str, Mapping[str, Any]]) -> Optional[Any]:
    """speed.estimate of the placement a plan serves, with these figures (``figures``: host ->
    the planner's speed dict; a head without one counts nothing), or None when a worker it uses
    has none."""
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed

    head, workers, head_layers, worker_layers, on_head = _placement_of(plan)
    model = plan.get("model") or {}
    view = SimpleNamespace(
        n_embd=int(model.get("n_embd") or 0),
        n_vocab=int(model.get("n_vocab") or 0),
        layer_bytes=(),
        output_bytes=0,
    )
    figs = {}
    for name in [head, *workers]:
        given = dict(figures.get(name) or {})
        if name == head:
            given = {k: v for k, v in given.items() if k not in ("rtt_ms", "mbit_s")}
            if not given:
                # the head unpriced: nothing of its own in the chain (what head_figures measures)
                given = {"ms_per_layer": 1e-9, "output_ms": 1e-9}
        try:
            got = speed.figures_of(dict(name=name, speed=given), "head" if name == head else "worker")
        except ValueError:
            return None  # a link not measured: no prediction
        if got is None:
            return None
        figs[name] = got
    return speed.estimate(
        view,
        SimpleNamespace(name=head),
        [SimpleNamespace(name=w) for w in workers],
        head_layers,
        worker_layers,
        on_head,
        figs,
    )


def _speed_dict(figures: Mapping[str, Any], link: Mapping[str, Any]) -> Dict[str, float]:
    out = {k: float(figures[k]) for k in SPEED_FIGURE_KEYS if figures.get(k) is not None}
    for key in ("rtt_ms", "mbit_s"):
        if link.get(key) is not None:
            out[key] = float(link[key])
    return out


def _ms_per_token(timings: Mapping[str, Any]) -> Optional[float]:
    """A request's decode ms per token from llama-server's timings (None: too few tokens)."""
    n, ms = timings.get("predicted_n"), timings.get("predicted_ms")
    if not isinstance(n, (int, float)) or n < MIN_TOKENS or not isinstance(ms, (int, float)) or ms <= 0:
        return None
    return float(ms) / float(n)


def head_figures(
    requests: Sequence[Tuple[Mapping[str, Any], Mapping[str, Any]]],
    workers: Mapping[str, Mapping[str, Any]],
    links: Mapping[str, Mapping[str, Any]],
    ratio: Optional[float],
) -> Dict[str, Any]:
    """The head's figures from the requests' wall time: each request's measured ms per token
    less every worker's terms (their layers and output layer, their links: the time model with
    the workers' figures) is the head's part of a token (its ``residual``). A request bound by a
    worker's CPU quota gives none (its time is the quota's).

    With a residual with the output layer on the head (``on``) and one with it on a worker
    (``off``): the output layer's time on the head ``output_ms`` = on - off; the head's layers at
    the output layer's measured ratio (``ms_per_layer`` = output_ms / ``ratio``); ``token_ms`` =
    off - the head's layers. With one residual only, or no ratio, the head's layers are priced
    like the median worker's (and its output layer at ``ratio`` of them, or by weight).

    Returns ``figures`` (the head's speed figures, or None), ``residuals``, ``reason`` and
    ``check``: the time model (with these figures) against each request.
    """
    speed_of = {
        name: _speed_dict(fig, links.get(name) or {})
        for name, fig in workers.items()
        if "ms_per_layer" in fig
    }
    residuals: Dict[str, Any] = {}
    for i, (plan, timings) in enumerate(requests):
        measured = _ms_per_token(timings)
        est = predict_request(plan, speed_of) if measured is not None else None
        if est is None or (est.capped is not None and est.capped["cap_ms"] > est.chain_ms):
            continue
        _head, _workers, layers, _counts, on_head = _placement_of(plan)
        residuals.setdefault(
            "on" if on_head else "off",
            {"request": i, "ms": round(measured - est.chain_ms, 3), "head_layers": layers},
        )
    result: Dict[str, Any] = {"figures": None, "residuals": residuals, "reason": None, "check": []}
    if not residuals or not ratio:
        result["reason"] = (
            "no measuring request was bound by the chain (each by a CPU quota, or failed)"
            if not residuals
            else "the output layer was not measured on a worker: the head is priced from its CPU seconds"
        )
        return result
    medians = sorted(float(f["ms_per_layer"]) for f in workers.values() if "ms_per_layer" in f)
    median = medians[len(medians) // 2] if medians else None
    figs: Dict[str, float] = {}
    if "on" in residuals and "off" in residuals:
        output = residuals["on"]["ms"] - residuals["off"]["ms"]
        if output > 0:
            figs = {"output_ms": output, "ms_per_layer": output / ratio}
        else:
            result["reason"] = (
                "the output layer on the head measured %.3f ms a token: priced like a worker" % output
            )
    if not figs:
        if median is None:
            result["reason"] = "no worker figure to price the head's layers"
            return result
        figs = {"ms_per_layer": median, "output_ms": ratio * median}
    base = residuals.get("off") or residuals["on"]
    token = (
        base["ms"]
        - base["head_layers"] * figs["ms_per_layer"]
        - (figs["output_ms"] if "off" not in residuals else 0.0)
    )
    if token > 0:
        figs["token_ms"] = token
    result["figures"] = {k: round(v, 4) for k, v in figs.items()}
    for i, (plan, timings) in enumerate(requests):
        measured = _ms_per_token(timings)
        est = predict_request(plan, dict(speed_of, **{_placement_of(plan)[0]: result["figures"]}))
        if measured is None or est is None:
            continue
        result["check"].append(
            {
                "request": i,
                "predicted_ms_per_token": round(est.ms_per_token, 3),
                "measured_ms_per_token": round(measured, 3),
                "error_pct": round(100.0 * (est.ms_per_token - measured) / measured, 1),
                "bound_by": "quota"
                if est.capped is not None and est.capped["cap_ms"] > est.chain_ms
                else "chain",
            }
        )
    return result


def measure(
    plan: Mapping[str, Any],
    samples: Mapping[str, Sequence[Mapping[str, Any]]],
    timings: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    units: Mapping[str, str],
    links: Mapping[str, Mapping[str, Any]],
    moved: Any = None,
) -> Dict[str, Any]:
    """Every host's compute figures from the measuring request and, when there were more, the
    requests with the output layer moved (``moved``: one or a list of ``plan``, ``samples``,
    ``timings``): host -> figures or ``reason`` (the head's from :func:`head_figures`, with
    ``token_ms``), and ``output_layers`` and ``token`` (how the head was priced) for the profile.
    Without a usable second request, every host's figure is the first request's CPU seconds over
    its layers, the output layer counted by its weight (:func:`compute_figures`)."""
    first = request_costs(plan, samples, timings, facts, units)
    single = compute_figures(plan, samples, timings, facts, units, first)
    others = [
        m for m in ([moved] if isinstance(moved, Mapping) else list(moved or [])) if m and m.get("plan")
    ]
    if not others:
        return {"hosts": single, "output_layers": None, "token": None}
    requests = [(plan, timings)] + [(m["plan"], m.get("timings") or {}) for m in others]
    costs = [first] + [
        request_costs(m["plan"], m.get("samples") or {}, m.get("timings") or {}, facts, units) for m in others
    ]
    workers, ratio = output_apart(costs)
    figures: Dict[str, Dict[str, Any]] = {}
    for name, fig in single.items():
        got = workers.get(name)
        if got is None:
            figures[name] = fig  # the head, for now
        elif "reason" in got and "ms_per_layer" in fig:
            # the other requests gave nothing for this worker: the first request's figure, its
            # output layer (if it held it) priced by weight
            figures[name] = dict(fig, output_reason=got["reason"])
        else:
            figures[name] = got
    head = next((str(h.get("name")) for h in plan.get("hosts") or [] if h.get("role") == "head"), None)
    priced = head_figures(
        requests,
        {k: v for k, v in figures.items() if k != head},
        links,
        ratio,
    )
    if head is not None and priced["figures"]:
        kept = {
            k: v for k, v in (first.get(head) or {}).items() if k in ("cpu_seconds", "tokens", "decode_share")
        }
        figures[head] = dict(kept, priced_by="wall time", **priced["figures"])
    token = {k: priced[k] for k in ("residuals", "reason", "check")}
    token["token_ms"] = (priced["figures"] or {}).get("token_ms")
    return {"hosts": figures, "output_layers": ratio, "token": token}


# --------------------------------------------------------------------------- the profile


def build_profile(
    previous: Optional[Mapping[str, Any]],
    build: str,
    model: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    compute: Mapping[str, Mapping[str, Any]],
    links: Mapping[str, Mapping[str, Any]],
    now: str,
    fleet: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """profile.json after one measuring run.

    ``fleet``: :func:`measure`'s ``output_layers`` and ``token`` (written as they are; the
    previous profile's ``output_layers`` is kept when this run could not make one).

    Hosts measured now get their fingerprint, the figures that were made and ``measured_at``;
    what could not be measured is kept in ``not_measured`` (each reason names the host). The
    previous profile's hosts are kept when they were not measured now and their build and model
    are the same (a stale entry is caught by :func:`speeds` when it is read). Every figure written
    is checked (:func:`check_figure`): a bad one raises :class:`ProfileError`.
    """
    sha = model.get("sha256")
    hosts: Dict[str, Any] = {}
    same = bool(
        previous
        and previous.get("version") == PROFILE_VERSION
        and previous.get("build") == build
        and (previous.get("model") or {}).get("sha256") == sha
    )
    if previous and same:
        hosts.update({k: dict(v) for k, v in (previous.get("hosts") or {}).items() if isinstance(v, dict)})
    for name in sorted(set(compute) | set(links)):
        fact = facts.get(name)
        if not isinstance(fact, dict):
            continue
        entry: Dict[str, Any] = {"fingerprint": fingerprint(fact), "measured_at": now, "not_measured": []}
        old = hosts.get(name) or {}
        if old.get("fingerprint") == entry["fingerprint"]:
            # same hardware: keep a figure this run could not make
            for key in ("compute", "link"):
                if key in old:
                    entry[key] = old[key]
        figures = compute.get(name) or {}
        if "ms_per_layer" in figures:
            check_figure(name, "ms_per_layer", figures["ms_per_layer"], "the measured request")
            for key in (*QUOTA_KEYS, *OUTPUT_KEYS):
                if figures.get(key) is not None:
                    check_figure(name, key, figures[key], "the measured request")
            entry["compute"] = {k: v for k, v in figures.items() if k != "output_reason"}
            entry["compute"]["measured_at"] = now
            if figures.get("output_reason"):
                entry["not_measured"].append(figures["output_reason"])
        elif figures.get("reason"):
            entry["not_measured"].append(figures["reason"])
        link = links.get(name) or {}
        if link.get("measured"):
            for key in ("rtt_ms", "mbit_s"):
                check_figure(name, key, link.get(key), "the link probe")
            entry["link"] = {
                k: link[k]
                for k in ("rtt_ms", "rtt_ms_min", "mbit_s", "mbit_s_to_host", "mbit_s_from_host")
                if k in link
            }
            entry["link"]["measured_at"] = now
        elif link.get("reason"):
            entry["not_measured"].append(link["reason"])
        hosts[name] = entry
    fleet = fleet or {}
    ratio = fleet.get("output_layers")
    if ratio is not None:
        check_figure("the fleet", "output_layers", ratio, "the two measuring requests")
    elif previous and same:
        ratio = previous.get("output_layers")
    return {
        "version": PROFILE_VERSION,
        "measured_at": now,
        "build": build,
        "model": {"name": model.get("name"), "sha256": sha},
        "output_layers": ratio,
        "token": fleet.get("token"),
        "hosts": hosts,
    }


def _profile_staleness(profile: Mapping[str, Any], build: str, model_sha256: Optional[str]) -> Optional[str]:
    if profile.get("version") != PROFILE_VERSION:
        return "profile.json version %r (this collection reads %d)" % (
            profile.get("version"),
            PROFILE_VERSION,
        )
    if build and profile.get("build") != build:
        return "the llama.cpp build changed (%s -> %s)" % (profile.get("build"), build)
    sha = (profile.get("model") or {}).get("sha256")
    if model_sha256 and sha != model_sha256:
        return "the model changed (sha256 %s -> %s)" % (str(sha)[:12], str(model_sha256)[:12])
    return None


def _figures(
    name: str, entry: Mapping[str, Any], is_head: bool, ratio: Optional[float] = None
) -> Tuple[Dict[str, float], List[str]]:
    """The speed dict of one profile entry, or the reasons it cannot be used. ``ratio``: the
    profile's ``output_layers`` (the output layer's measured cost in repeating layers), which
    prices the output layer on a host where it was not measured."""
    speed: Dict[str, float] = {}
    problems: List[str] = []
    compute = entry.get("compute") or {}
    link = entry.get("link") or {}
    try:
        if "ms_per_layer" not in compute:
            problems.append("no compute figure")
        else:
            speed["ms_per_layer"] = check_figure(
                name, "ms_per_layer", compute["ms_per_layer"], "profile.json"
            )
            quota = (entry.get("fingerprint") or {}).get("cpu_quota")
            if "cpu_ms_per_layer" not in compute and quota and compute.get("priced_by") != "wall time":
                # written before the quota was a cap: its ms_per_layer is CPU time over the quota
                problems.append(
                    "compute figure measured before the CPU quota %s was a cap (no cpu_ms_per_layer)" % quota
                )
            if compute.get("cpu_quota") is not None:
                for key in QUOTA_KEYS:
                    if compute.get(key) is not None:
                        speed[key] = check_figure(name, key, compute[key], "profile.json")
            for key in OUTPUT_KEYS if is_head else OUTPUT_KEYS[:2]:
                if compute.get(key) is not None:
                    speed[key] = check_figure(name, key, compute[key], "profile.json")
            if "output_ms" not in speed and ratio is not None:
                # not measured here: the output layer's measured cost in layers at this host's figure
                speed["output_ms"] = round(ratio * speed["ms_per_layer"], 4)
                cpu = compute.get("cpu_ms_per_layer")
                if cpu is not None:
                    speed["output_cpu_ms"] = round(
                        ratio * check_figure(name, "cpu_ms_per_layer", cpu, "profile.json"), 4
                    )
        if not is_head:
            if not link:
                problems.append("no link figures")
            else:
                for key in ("rtt_ms", "mbit_s"):
                    speed[key] = check_figure(name, key, link.get(key), "profile.json")
    except ProfileError as err:
        problems.append(str(err).split(": ", 1)[1])
    return speed, problems


def speeds(
    names: Sequence[str],
    head: str,
    profile: Optional[Mapping[str, Any]],
    facts: Mapping[str, Optional[Mapping[str, Any]]],
    given: Mapping[str, Optional[Mapping[str, Any]]],
    build: str,
    model_sha256: Optional[str],
) -> Dict[str, Any]:
    """The ``speed`` dict of each host that has usable figures.

    ``facts``: host -> its ``llmfleet_host`` (measured hosts: the probe's; used for the
    fingerprint). ``given``: host -> its inventory's ``llmfleet_profile`` (what-if hosts, or a
    user's own figures): used as they are, after the same checks; a bad one raises
    :class:`ProfileError` naming the host (the user wrote it). Profile figures that cannot be
    used leave the host without figures and put it in ``remeasure`` with the reason.

    Returns ``speed`` (host -> dict), ``source`` (host -> profile | inventory) and ``remeasure``.
    """
    out: Dict[str, Dict[str, float]] = {}
    source: Dict[str, str] = {}
    remeasure: List[str] = []
    stale = _profile_staleness(profile, build, model_sha256) if profile else None
    entries = (profile or {}).get("hosts") or {}
    for name in names:
        is_head = name == head
        figures = given.get(name)
        if figures:
            if not isinstance(figures, dict):
                raise ProfileError("%s: llmfleet_profile %r is not a dict" % (name, figures))
            speed = {
                "ms_per_layer": check_figure(
                    name, "ms_per_layer", figures.get("ms_per_layer"), "llmfleet_profile"
                )
            }
            if not is_head:
                for key in ("rtt_ms", "mbit_s"):
                    speed[key] = check_figure(name, key, figures.get(key), "llmfleet_profile")
            if figures.get("cpu_quota") is not None:
                for key in QUOTA_KEYS:
                    if figures.get(key) is not None:
                        speed[key] = check_figure(name, key, figures[key], "llmfleet_profile")
            for key in OUTPUT_KEYS if is_head else OUTPUT_KEYS[:2]:
                if figures.get(key) is not None:
                    speed[key] = check_figure(name, key, figures[key], "llmfleet_profile")
            if not is_head and figures.get("token_ms") is not None:
                raise ProfileError(
                    "%s: llmfleet_profile token_ms is the head's figure, not a worker's" % name
                )
            out[name], source[name] = speed, "inventory"
            continue
        if not profile:
            continue
        entry = entries.get(name)
        if not isinstance(entry, dict):
            remeasure.append("%s: not in profile.json: %s" % (name, REMEASURE_HINT))
            continue
        if stale:
            remeasure.append("%s: profile.json is stale (%s): %s" % (name, stale, REMEASURE_HINT))
            continue
        fact = facts.get(name)
        changes = fingerprint_changes(entry.get("fingerprint") or {}, fingerprint(fact)) if fact else []
        if changes:
            remeasure.append(
                "%s: the host changed since it was measured (%s): %s"
                % (name, "; ".join(changes), REMEASURE_HINT)
            )
            continue
        ratio = profile.get("output_layers")
        try:
            ratio = check_figure(name, "output_layers", ratio, "profile.json") if ratio is not None else None
        except ProfileError as err:
            remeasure.append(
                "%s: figures not used (%s): %s" % (name, str(err).split(": ", 1)[1], REMEASURE_HINT)
            )
            continue
        speed, problems = _figures(name, entry, is_head, ratio)
        if problems:
            remeasure.append("%s: figures not used (%s): %s" % (name, "; ".join(problems), REMEASURE_HINT))
            continue
        out[name], source[name] = speed, "profile"
    return {"speed": out, "source": source, "remeasure": remeasure}


# --------------------------------------------------------------------------- measuring placement

MEASURE_LAYERS = 2
# the margin a worker holding the output layer alone keeps when it is given repeating layers
TOP_UP_MIB = 8.0
# Split options the measuring placement rewrites (and llama-server's polling level).
_SPLIT_OPTIONS = {"--rpc": "rpc", "--tensor-split": "ts", "-ts": "ts", "-ngl": "ngl", "--n-gpu-layers": "ngl"}
_POLL_OPTIONS = ("--poll", "--poll-batch")


def _split_args(args: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """``args`` without the split options and ``--poll``, and the split options' values."""
    rest: List[str] = []
    found: Dict[str, str] = {}
    skip = None
    for arg in args:
        if skip is not None:
            if skip:
                found[skip] = str(arg)
            skip = None
            continue
        key, eq, value = str(arg).partition("=")
        if key in _SPLIT_OPTIONS or key in _POLL_OPTIONS:
            name = _SPLIT_OPTIONS.get(key, "")
            if eq:
                if name:
                    found[name] = value
            else:
                skip = name
            continue
        rest.append(str(arg))
    return rest, found


def measuring_plan(
    plan: Mapping[str, Any], add: Sequence[str], layers_each: int = MEASURE_LAYERS
) -> Dict[str, Any]:
    """The served plan changed so that one request measures every host's compute honestly.

    ``add``: workers the plan leaves out (no layers, so no compute figure from the served plan):
    each gets ``layers_each`` repeating layers, taken from the head's CPU (then from the worker
    with the most layers), at the front of the ``--rpc`` list; every other host keeps its layers
    and the output layer stays where it is. Every worker is measured at ``MEASURE_THREADS`` (1)
    rpc-server thread (``threads``; ``serving_threads`` keeps the plan's): rpc-server has no
    ``--poll``, and with more threads its CPU seconds are mostly its threads spinning (playbooks/
    profile.yml runs a served worker's unit at one thread through a runtime drop-in, see
    :func:`single_thread_dropin`). ``--poll 0``: llama-server's CPU threads sleep while
    they wait for the workers instead of spinning, so the head's CPU seconds are its work
    (docs/profile.md). The result is a plan the supervisor serves (no fallbacks: the measuring
    run needs every host) with ``hosts[].layers`` and ``predicted_mib.weights`` of the new split,
    for :func:`compute_figures`.
    """
    model = plan.get("model") or {}
    n_layer = model.get("n_layer")
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise ProfileError("the plan's model has no n_layer (%r)" % (n_layer,))
    hosts = [dict(h) for h in plan.get("hosts") or [] if isinstance(h, dict)]
    head = next((h for h in hosts if h.get("role") == "head"), None)
    if head is None:
        raise ProfileError("the plan has no head host")
    known = {h.get("name") for h in hosts}
    planned = {
        h.get("name"): h for h in ((plan.get("planned_with") or {}).get("hosts") or []) if isinstance(h, dict)
    }
    rest, split = _split_args(plan.get("llama_server_args") or [])
    workers = [h for h in hosts if h.get("role") == "worker" and h.get("name") in (plan.get("workers") or [])]
    by_endpoint = {h.get("endpoint"): h for h in workers}
    devices = [by_endpoint.get(e) for e in split.get("rpc", "").split(",") if e]
    if None in devices:
        raise ProfileError("the plan's --rpc %r names an endpoint that no worker has" % split.get("rpc"))
    counts = [_layer_count(d) for d in devices]
    outputs = [bool(d.get("output_layer")) for d in devices]
    head_layers = _layer_count(head)
    # the average repeating layer's weights (for the new split's predicted_mib.weights)
    per = [
        float((d.get("predicted_mib") or {}).get("weights") or 0) / c
        for d, c, o in zip(devices, counts, outputs)
        if c and not o and (d.get("predicted_mib") or {}).get("weights")
    ]
    avg = sum(per) / len(per) if per else 0.0
    new: List[Dict[str, Any]] = []
    for name in add:
        if name in known:
            raise ProfileError("%s: already in the plan, cannot add it to the measuring placement" % name)
        info = planned.get(name)
        if not info or not info.get("address"):
            raise ProfileError("%s: not in the plan's planned_with.hosts (no address to reach it)" % name)
        port = int(info.get("port") or 50052)
        take = layers_each
        from_head = min(take, head_layers)
        head_layers -= from_head
        take -= from_head
        while take > 0:
            i = max(range(len(counts)), key=lambda j: counts[j]) if counts else None
            if i is None or counts[i] <= 1:
                raise ProfileError("%s: no layers left to give it in the measuring placement" % name)
            counts[i] -= 1
            take -= 1
        new.append(
            {
                "name": name,
                "role": "worker",
                "address": info["address"],
                "port": port,
                "endpoint": "%s:%d" % (info["address"], port),
                "threads": MEASURE_THREADS,
                "serving_threads": int(info.get("cpus") or 1),
                "output_layer": False,
                "measuring": True,
            }
        )
    # a worker that holds the output layer alone gets repeating layers too (its layers are priced
    # from a request without the output layer, output_apart), when its headroom takes them
    # (each layer's weights and about as much KV, and the compute of a worker with layers)
    plain = [(d, c) for d, c, o in zip(devices, counts, outputs) if c and not o and d.get("predicted_mib")]
    topped: Dict[str, Dict[str, float]] = {}
    for i, d in enumerate(devices):
        if counts[i] or not outputs[i] or not plain:
            continue
        # the memory model's shape (weights + process + max(kv + compute, the largest tensor)):
        # the layers' weights, their KV at a plain worker's rate and a plain worker's compute
        mib = d.get("predicted_mib") or {}
        ref, ref_count = plain[0]
        ref_mib = ref.get("predicted_mib") or {}
        kv = float(mib.get("kv") or 0.0) + layers_each * float(ref_mib.get("kv") or 0.0) / ref_count
        compute = max(float(mib.get("compute") or 0.0), float(ref_mib.get("compute") or 0.0))
        largest = (
            float(mib.get("peak") or 0.0) + float(mib.get("kv") or 0.0) + float(mib.get("compute") or 0.0)
        )
        grown = (
            float(mib.get("weights") or 0.0)
            + layers_each * avg
            + float(mib.get("process") or 0.0)
            + max(kv + compute, largest)
        )
        if grown + TOP_UP_MIB > (_budget(d) or 0.0):
            continue
        topped[d.get("name")] = {"kv": round(kv, 2), "compute": round(compute, 2), "largest": largest}
        take = layers_each
        from_head = min(take, head_layers)
        head_layers -= from_head
        take -= from_head
        while take > 0:
            j = max(range(len(counts)), key=lambda k: counts[k])
            if counts[j] <= 1:
                break
            counts[j] -= 1
            counts[i] += 1
            take -= 1
        counts[i] += from_head
    order = new + devices
    all_counts = [layers_each] * len(new) + counts
    # the output layer is llama.cpp's last slot, on the last --rpc device (the plan's output
    # holder, or the head's CPU through the plan's -ot override, which stays in the arguments)
    ngl = sum(all_counts) + 1
    ts = [float(c) for c in all_counts]
    if ts:
        ts[-1] += 1.0
    # the split as llama.cpp assigns it (slot n_layer is the output layer)
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import assign_slots

    slots = assign_slots(ts, n_layer, ngl) if order else [-1] * (n_layer + 1)
    got = [slots[:n_layer].count(i) for i in range(len(order))]
    if got != all_counts or slots[:head_layers].count(-1) != head_layers:
        raise ProfileError("the measuring split %s does not give the layers %s" % (ts, all_counts))
    out = copy.deepcopy(dict(plan))
    head_mib = dict(head.get("predicted_mib") or {})
    lost = (_layer_count(head) - head_layers) * avg
    if "weights" in head_mib:
        head_mib["weights"] = round(float(head_mib["weights"]) - lost, 2)
    head = dict(head, layers=[0, head_layers], predicted_mib=head_mib)
    first = head_layers
    placed = []
    for h, c in zip(order, all_counts):
        h = dict(h)
        if not h.get("measuring"):
            # every worker measured at one rpc-server thread (profile.yml restarts a served one
            # that runs more): a multi-thread rpc-server's CPU seconds are its threads polling
            h["serving_threads"] = h.get("threads")
            h["threads"] = MEASURE_THREADS
        mib = dict(h.get("predicted_mib") or {})
        old = _layer_count(h)
        extra = float(mib.get("weights") or 0) - old * avg if h.get("output_layer") else 0.0
        mib["weights"] = round(c * avg + max(0.0, extra), 2)
        grown = topped.get(h.get("name"))
        if grown:
            mib["kv"], mib["compute"] = grown["kv"], grown["compute"]
            mib["peak"] = round(max(0.0, grown["largest"] - grown["kv"] - grown["compute"]), 2)
            mib["total"] = round(_total(mib), 2)
        h["layers"] = [first, first + c]
        h["predicted_mib"] = mib
        first += c
        placed.append(h)
    others = [h for h in hosts if h.get("role") == "worker" and h not in devices]
    out["hosts"] = [head, *placed, *others]
    out["workers"] = [h["name"] for h in placed]
    out["fallbacks"] = []
    out["llama_server_args"] = (
        (["--rpc", ",".join(h["endpoint"] for h in placed)] if placed else [])
        + (["--tensor-split", ",".join("%g" % x for x in ts), "-ngl", str(ngl)] if placed else [])
        + rest
        + ["--poll", "0"]
    )
    out["measuring"] = {
        "added": list(add),
        "layers_each": layers_each,
        "poll": 0,
        "worker_threads": MEASURE_THREADS,
    }
    return out


def _budget(h: Mapping[str, Any]) -> Optional[float]:
    """A host's memory budget from its plan row (its predicted total + headroom; None for a
    worker the measuring placement added, which has no row of the plan)."""
    mib = h.get("predicted_mib") or {}
    if h.get("headroom_mib") is None or mib.get("total") is None:
        return None
    return float(h["headroom_mib"]) + float(mib["total"])


def _total(mib: Mapping[str, Any]) -> float:
    return sum(float(mib.get(k) or 0.0) for k in ("weights", "kv", "compute", "process", "peak"))


def output_moved(
    plan: Mapping[str, Any],
    quotas: Optional[Mapping[str, Any]] = None,
    only: Optional[Sequence[str]] = None,
) -> Optional[Dict[str, Any]]:
    """A measuring placement (:func:`measuring_plan`) with the output layer on another host, or
    None when it fits nowhere else.

    Output on the head -> on a worker (it goes last in ``--rpc``: llama.cpp's output slot is the
    last device's; the ``-ot`` override dropped): a worker without a CPU quota below one CPU
    (``quotas``: host -> its quota) first, so that the request is not bound by a quota, then the
    one with the most room left; output on a worker -> on the head, through the ``-ot``
    override. ``only``: the workers it may go to (default every worker of the placement). Every
    other host keeps its layers. The memory check is the plan's own figures
    (``model.output_mib``, ``output_largest_mib`` and, when llama.cpp would start pipelining,
    ``pipeline_extra_mib`` on every host), against each host's budget (its predicted total +
    headroom): a move that the memory model does not fit is not made."""
    quotas = quotas or {}

    def free(name: str) -> bool:
        return not quotad(quotas, name)

    model = plan.get("model") or {}
    output_mib = model.get("output_mib")
    if not isinstance(output_mib, (int, float)) or output_mib <= 0:
        return None
    hosts = [dict(h) for h in plan.get("hosts") or [] if isinstance(h, dict)]
    head = next((h for h in hosts if h.get("role") == "head"), None)
    used = [h for h in hosts if h.get("role") == "worker" and h.get("name") in (plan.get("workers") or [])]
    if head is None or not used:
        return None
    rest, split = _split_args(plan.get("llama_server_args") or [])
    on_head = bool(head.get("output_layer"))
    out = copy.deepcopy(dict(plan))
    if on_head:
        head_layers = _layer_count(head)
        pipelined = len(used) > 1 and head_layers == 0
        extra = float(model.get("pipeline_extra_mib") or 0.0) if pipelined else 0.0
        for h in [head, *used]:
            budget = _budget(h)
            if budget is not None and _total(h.get("predicted_mib") or {}) + extra > budget:
                return None
        room = []
        for w in used:
            mib = dict(w.get("predicted_mib") or {})
            largest = max(float(model.get("output_largest_mib") or 0.0), float(mib.get("peak") or 0.0))
            mib["weights"] = round(float(mib.get("weights") or 0.0) + float(output_mib), 2)
            mib["compute"] = round(float(mib.get("compute") or 0.0) + extra, 2)
            mib["peak"] = round(max(0.0, largest - float(mib.get("kv") or 0.0) - float(mib["compute"])), 2)
            mib["total"] = round(_total(mib), 2)
            budget = _budget(w)
            left = budget - mib["total"] if budget is not None else -1.0
            if left >= 0 and (only is None or w["name"] in only):
                room.append((free(w["name"]), left, w["name"], mib))
        if not room:
            return None
        _free, _left, name, mib = max(room)
        order = [w for w in used if w["name"] != name] + [w for w in used if w["name"] == name]
        first = head_layers
        placed = []
        for w in order:
            count = _layer_count(w)
            w = dict(w, layers=[first, first + count], output_layer=w["name"] == name)
            if w["name"] == name:
                w["predicted_mib"] = mib
            first += count
            placed.append(w)
        head["output_layer"] = False
        counts = [_layer_count(w) for w in placed]
        ts = [float(c) for c in counts]
        ts[-1] += 1.0
        rest = [a for i, a in enumerate(rest) if not _is_override(rest, i)]
        args = [
            "--rpc",
            ",".join(w["endpoint"] for w in placed),
            "--tensor-split",
            ",".join("%g" % x for x in ts),
        ]
        args += ["-ngl", split.get("ngl") or str(sum(counts) + 1)]
        moved_to = name
    else:
        holder = used[-1]
        if not holder.get("output_layer"):
            return None
        head_mib = dict(head.get("predicted_mib") or {})
        if not model.get("tied_output"):
            head_mib["weights"] = round(float(head_mib.get("weights") or 0.0) + float(output_mib), 2)
            head_mib["total"] = round(_total(head_mib), 2)
            if head_mib["total"] > (_budget(head) or 0.0):
                return None
        head = dict(head, output_layer=True, predicted_mib=head_mib)
        mib = dict(holder.get("predicted_mib") or {})
        mib["weights"] = round(max(0.0, float(mib.get("weights") or 0.0) - float(output_mib)), 2)
        placed = [dict(w) for w in used]
        placed[-1] = dict(holder, output_layer=False, predicted_mib=mib)
        args = [
            "--rpc",
            split.get("rpc", ""),
            "--tensor-split",
            split.get("ts", ""),
            "-ngl",
            split.get("ngl", ""),
        ]
        rest = [*OUTPUT_ON_HEAD_ARGS, *rest]
        moved_to = head["name"]
    others = [h for h in hosts if h.get("role") == "worker" and h not in used]
    out["hosts"] = [head, *placed, *others]
    out["workers"] = [w["name"] for w in placed]
    out["llama_server_args"] = args + rest + ["--poll", "0"]
    out["measuring"] = dict(out.get("measuring") or {}, output_moved_to=moved_to)
    return out


def quotad(quotas: Optional[Mapping[str, Any]], name: str) -> bool:
    """Whether a host runs under a CPU quota below one CPU (its requests may be the quota's)."""
    q = (quotas or {}).get(name)
    return isinstance(q, (int, float)) and not isinstance(q, bool) and q < 1.0


def measuring_placements(
    measuring: Mapping[str, Any], quotas: Optional[Mapping[str, Any]] = None
) -> List[Dict[str, Any]]:
    """The measuring placements (docs/profile.md), the same split each, the output layer moved:

    1. on the head (moved there when the served plan has it on a worker and the head can take it);
    2. on a worker (:func:`output_moved`: one without a CPU quota first, so that the request is
       bound by the chain and prices the head);
    3. on the quota'd worker with the most room, when that is not the second's: there a quota
       makes the output layer's cost the fleet's rate, so it is measured, not priced.

    Fewer when the output layer fits on fewer hosts, and only the first when the plan keeps the
    output layer on the head (``llmfleet_output_layer: head``: no plan of the fleet puts it
    elsewhere, so its cost there is not needed)."""
    first = dict(measuring)
    options = (first.get("planned_with") or {}).get("options") or {}
    head = next((h for h in first.get("hosts") or [] if h.get("role") == "head"), {})
    if not head.get("output_layer"):
        first = output_moved(first, quotas) or first
        head = next((h for h in first.get("hosts") or [] if h.get("role") == "head"), {})
        if not head.get("output_layer"):
            return [first]
    if options.get("output_layer") == "head":
        return [first]
    out = [first]
    second = output_moved(first, quotas)
    if second is None:
        return out
    out.append(second)
    moved_to = second["measuring"]["output_moved_to"]
    throttled = [w for w in first.get("workers") or [] if quotad(quotas, w) and w != moved_to]
    third = output_moved(first, quotas, only=throttled) if throttled else None
    if third is not None:
        out.append(third)
    return out


def _is_override(args: Sequence[str], i: int) -> bool:
    """Whether args[i] is the output-on-head override or its value."""
    here = str(args[i])
    if here == OUTPUT_ON_HEAD_ARGS[0] and i + 1 < len(args) and str(args[i + 1]) == OUTPUT_ON_HEAD_ARGS[1]:
        return True
    return here == OUTPUT_ON_HEAD_ARGS[1] and i > 0 and str(args[i - 1]) == OUTPUT_ON_HEAD_ARGS[0]


PROFILE_DROPIN = "/run/systemd/system/llmfleet-rpc-server.service.d/50-llmfleet-profile-threads.conf"


def single_thread_dropin(unit_text: str, host: str, threads: int = MEASURE_THREADS) -> str:
    """The systemd drop-in that runs an installed rpc-server unit with ``--threads threads``, or
    "" when its ExecStart already does (nothing to change).

    ``unit_text``: the unit file the llama_rpc role installed. The drop-in clears ExecStart and
    gives the same command line with the thread count replaced; :class:`ProfileError` (naming the
    host) when the unit has no ExecStart or no ``--threads``."""
    lines = [line for line in str(unit_text).splitlines() if line.startswith("ExecStart=")]
    if len(lines) != 1:
        raise ProfileError("%s: the rpc-server unit has %d ExecStart lines (1 expected)" % (host, len(lines)))
    argv = lines[0][len("ExecStart=") :].split()
    if "--threads" not in argv[:-1]:
        raise ProfileError("%s: the rpc-server unit's ExecStart has no --threads: %s" % (host, lines[0]))
    i = argv.index("--threads") + 1
    if argv[i] == str(threads):
        return ""
    argv[i] = str(threads)
    return (
        "# llmfleet playbooks/profile.yml: rpc-server measured at %d thread(s) (docs/profile.md);\n"
        "# removed when the measuring request is done (a runtime drop-in: gone at reboot too)\n"
        "[Service]\nExecStart=\nExecStart=%s\n" % (threads, " ".join(argv))
    )

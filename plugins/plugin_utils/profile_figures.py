# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The compute figures of a fleet, from the requests playbooks/profile.yml measures (docs/profile.md).

Controller only, pure. :func:`measure` is the whole step: :func:`request_costs` (each host's CPU
ms per token in one request: the verify role's CPU samples of each llama.cpp unit before and
after it, the head's ``timings`` and the plan that served it), :func:`compute_figures` (one
request: ms per layer, the output layer counted by its weight), :func:`output_apart` (the
requests of measuring.measuring_placements, the output layer measured where it moved) and
:func:`head_figures` (the head priced from the requests' wall time with the time model,
speed.estimate_split). The plans are read through plan.Plan; profile.build_profile writes what
this makes into profile.json.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan, PlanEmpty, PlanError, parse
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import (
    MEASURE_THREADS,
    SPEED_FIGURE_KEYS,
    ProfileError,
    build_profile,
    device_figures,
)

MIN_TOKENS = 4
MIN_CPU_SECONDS = 0.01


def _parse(plan: Mapping[str, Any]) -> Optional[Plan]:
    """The plan parsed (plan.parse), None for a plan without hosts (nothing measured), or
    :class:`ProfileError` naming the field at fault."""
    try:
        return parse(plan)
    except PlanEmpty:
        return None
    except PlanError as err:
        raise ProfileError(str(err)) from err


def _layer_equivalents(plan: Plan) -> Dict[str, float]:
    """Per host: its repeating layers, plus the output layer counted by its weight in layers.

    Decode reads every weight once per token, so a host's work follows its weight bytes; the
    output layer (vocab x n_embd) weighs many layers on a small model. The average repeating
    layer is read off the hosts without the output layer; the head's own weights (which hold the
    token embedding, a lookup and no work) are left out."""
    per_layer = [
        h.predicted_mib["weights"] / h.layer_count
        for h in plan.hosts
        if h.role == "worker" and not h.output_layer and h.layer_count and h.predicted_mib.get("weights")
    ]
    avg = sum(per_layer) / len(per_layer) if per_layer else None
    out = {}
    for h in plan.hosts:
        count = float(h.layer_count)
        if h.output_layer:
            weights = h.predicted_mib.get("weights")
            extra = 1.0
            if avg and weights:
                # a worker's weights beyond its layers are the output layer; the head's are the
                # token embedding (a lookup, no work) plus the output: the same tensor when the
                # output is tied, else two of about the same size
                beyond = weights - count * avg
                if h.role != "worker" and not plan.model.tied_output:
                    beyond /= 2.0
                extra = max(1.0, beyond / avg)
            count += extra
        out[h.name] = count
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
    served = _parse(plan)
    for h in served.hosts if served else ():
        name, role = h.name, h.role
        unit = units.get(role, "")

        def fail(why: str, name: str = name) -> None:
            out[name] = {"reason": "not measured: %s: %s" % (name, why)}

        layers = h.layer_count
        if layers <= 0 and not h.output_layer and role != "head":
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
        threads = h.threads
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
            "output": h.output_layer,
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
    served = _parse(plan)
    equivalents = _layer_equivalents(served) if served else {}
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


def predict_request(plan: Mapping[str, Any], figures: Mapping[str, Mapping[str, Any]]) -> Optional[Any]:
    """speed.estimate_split of the placement a plan serves, with these figures (``figures``: host
    -> the planner's speed dict; a head without one counts nothing), or None when a worker it uses
    has none. The output layer is priced by its figures (measured here), else as one layer."""
    served = _parse(plan)
    if served is None:
        return None
    head = served.head.name
    figs = {}
    for name in served.names:
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
    return speed.estimate_split(
        speed.Shape(served.model.n_embd, served.model.n_vocab),
        head,
        [w.name for w in served.workers],
        served.head_layers,
        served.worker_layers,
        served.output_on_head,
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
        served = _parse(plan)
        if served is None:
            continue
        residuals.setdefault(
            "on" if served.output_on_head else "off",
            {"request": i, "ms": round(measured - est.chain_ms, 3), "head_layers": served.head_layers},
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
        served = _parse(plan)
        if served is None:
            continue
        est = predict_request(plan, dict(speed_of, **{served.head.name: result["figures"]}))
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
    served = _parse(plan)
    head = served.head.name if served else None
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


def measured_devices(
    requests: Sequence[Mapping[str, Any]], figures: Mapping[str, Mapping[str, Any]]
) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Host -> device -> its figures (:func:`profile.device_figures`) or ``reason``, from the
    device requests (each ``plan``, one of measuring.device_pairs's placements, and its
    ``timings``): the pair of one device, on it and on its host's CPU, and the host's CPU figure
    of this run (``figures``, :func:`measure`'s hosts)."""
    pairs: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for req in requests or []:
        about = ((req.get("plan") or {}).get("measuring") or {}).get("device") or {}
        if not about.get("host") or not about.get("device"):
            continue
        pair = pairs.setdefault((str(about["host"]), str(about["device"])), {})
        if about.get("reason"):
            pair["reason"] = str(about["reason"])
        else:
            pair["layers"] = about.get("layers")
            pair[str(about.get("on"))] = _ms_per_token(req.get("timings") or {})
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for (host, dev), pair in sorted(pairs.items()):
        at = "not measured: %s device %s: " % (host, dev)
        cpu = (figures.get(host) or {}).get("ms_per_layer")
        if "reason" in pair:
            got: Dict[str, Any] = {"reason": pair["reason"]}
        elif pair.get("device") is None or pair.get("cpu") is None:
            got = {"reason": at + "a request of its pair made too few tokens or none"}
        elif cpu is None:
            got = {"reason": at + "its host's CPU has no figure from this run"}
        else:
            try:
                got = device_figures(host, dev, cpu, pair["device"], pair["cpu"], pair["layers"])
            except ProfileError as err:
                got = {"reason": "not measured: %s" % err}
        out.setdefault(host, {})[dev] = got
    return out


def _without_devices(requests: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The device request that uses no device (``measuring.devices_on_cpu``: measuring.device_pairs
    makes at most one), or None."""
    for req in requests or []:
        if ((req.get("plan") or {}).get("measuring") or {}).get("devices_on_cpu"):
            return req
    return None


def devices_together(
    requests: Sequence[Mapping[str, Any]], priced: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """``priced`` (:func:`measured_devices`) with what the devices cost together beyond the sum of
    their pairs spread over their layers: from the device request with every device that moved
    its own layers emptied at once (measuring.device_pairs's last, ``measuring.devices_on_cpu``),
    ``together = the first placement's ms per token (the mean of the pairs' on-device sides) -
    that request's - the sum of the pairs' differences``, and each of those devices' ``ms_per_layer``
    gains ``together / (their layers)``. The model then gives both the first placement (every
    device used) and that request (none) their measured times; one device used alone is priced
    a share of ``together`` high. Devices that run on the CPUs of one machine (lavapipe in the
    test hosts, which share two cores) cost more together than apart; on separate machines
    ``together`` is about zero. Unchanged without such a request, when a listed device has no
    figure, or when a figure would not stay above zero."""
    out = {h: {d: dict(f) for d, f in devs.items()} for h, devs in priced.items()}
    req = _without_devices(requests) or {}
    listed = ((req.get("plan") or {}).get("measuring") or {}).get("devices_on_cpu") or []
    # one device: its pair's CPU side is that request, nothing is left to spread
    emptied = _ms_per_token(req.get("timings") or {}) if len(listed) > 1 else None
    if emptied is None:
        return out
    figs = [out.get(str(d.get("host")), {}).get(str(d.get("device"))) or {} for d in listed]
    if any("ms_per_layer" not in f for f in figs):
        return out
    on = sum(float(f["ms_per_token_on_device"]) for f in figs) / len(figs)
    pairs = sum(float(f["ms_per_token_on_device"]) - float(f["ms_per_token_on_cpu"]) for f in figs)
    together = on - emptied - pairs
    per = together / sum(int(f["layers"]) for f in figs)
    if any(float(f["ms_per_layer"]) + per <= 0 for f in figs):
        return out
    for f in figs:
        f["pair_ms_per_layer"] = f["ms_per_layer"]
        f["ms_per_layer"] = round(float(f["ms_per_layer"]) + per, 4)
        f["together_ms"] = round(together, 3)
        f["ms_per_token_none"] = round(emptied, 3)
    return out


CPU_ALONE_KEYS = (
    "ms_per_layer",
    "cpu_ms_per_layer",
    "cpu_seconds",
    "tokens",
    "layer_equivalents",
    "parallel_cpus",
    "threads",
    "decode_share",
)


def cpu_alone(
    requests: Sequence[Mapping[str, Any]],
    figures: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, Mapping[str, Any]],
    units: Mapping[str, str],
) -> Dict[str, Dict[str, Any]]:
    """``figures`` with a worker's CPU figure taken from a device request in which its devices
    other than the CPU hold no layers (the ``cpu`` side of a pair that moved them all; each
    request ``plan``, ``samples``, ``timings``), ``cpu_alone`` set: rpc-server's CPU seconds
    through the first request also count the work of a device that runs on the host's CPUs (a
    Vulkan driver on the CPU: lavapipe), which the device's own figure prices. The output layer's
    figures stay the first request's; a worker without such a request keeps its figure."""
    out = {k: dict(v) for k, v in figures.items()}
    done = set()
    for req in requests or []:
        plan = req.get("plan") or {}
        about = (plan.get("measuring") or {}).get("device") or {}
        name = about.get("host")
        if about.get("on") != "cpu" or name in done or "ms_per_layer" not in (out.get(name) or {}):
            continue
        served = _parse(plan)
        host = served.host(str(name)) if served else None
        if host is None or host.role != "worker" or any(d.layer_count for d in host.gpu_devices):
            continue
        fig = (
            compute_figures(plan, req.get("samples") or {}, req.get("timings") or {}, facts, units).get(name)
            or {}
        )
        if "ms_per_layer" in fig:
            out[name].update({k: fig[k] for k in CPU_ALONE_KEYS if k in fig}, cpu_alone=True)
            done.add(name)
    return out


def head_token_from_none(
    requests: Sequence[Mapping[str, Any]],
    hosts: Mapping[str, Mapping[str, Any]],
    links: Mapping[str, Mapping[str, Any]],
) -> Optional[float]:
    """The head's token time from the device request that uses no device other than a CPU (the
    one with ``measuring.devices_on_cpu``: every device that held layers emptied at once, or the
    CPU side of the one device's pair): its measured ms per token less the time model's other
    terms of it (every host's layers and output layer at their CPU figures, ``hosts``, and the
    links). None when there is no such request, it made too few tokens, a device still holds a
    layer or the output layer in it, a host it uses has no figure, or a CPU quota bound it."""
    req = _without_devices(requests)
    if req is None:
        return None
    plan = req.get("plan") or {}
    served = _parse(plan)
    measured = _ms_per_token(req.get("timings") or {})
    if served is None or measured is None:
        return None
    used = [served.head, *served.workers]
    if any(d.layer_count or d.output_layer for h in used for d in h.gpu_devices):
        return None
    if any("ms_per_layer" not in (hosts.get(h.name) or {}) for h in used):
        return None
    speed_of = {h.name: _speed_dict(hosts[h.name], links.get(h.name) or {}) for h in used}
    speed_of[served.head.name].pop("token_ms", None)  # the unknown
    est = predict_request(plan, speed_of)
    if est is None or (est.capped is not None and est.capped["cap_ms"] > est.chain_ms):
        return None
    return measured - est.chain_ms


def head_token_shift(
    plan: Mapping[str, Any],
    fitted: Mapping[str, Mapping[str, Any]],
    hosts: Mapping[str, Mapping[str, Any]],
    devices: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> float:
    """What the head's ``token_ms`` gains when the hosts of the first request (``plan``) are priced
    per device (``devices``; a worker's CPU by ``hosts``, :func:`cpu_alone`) instead of at one
    figure each (``fitted``, what :func:`head_figures` fitted the head's token time with): the
    fitted cost of each host's layers less the device-priced one, so that the time model gives
    the first request the time it measured. A device without a figure is priced at its host's."""
    served = _parse(plan)
    shift = 0.0
    for h in served.hosts if served else ():
        if h.role == "worker" and h not in served.workers:
            continue
        old = (fitted.get(h.name) or {}).get("ms_per_layer")
        new = (hosts.get(h.name) or {}).get("ms_per_layer")
        if old is None or new is None:
            continue
        priced = 0.0
        for d in h.devices:
            fig = (devices.get(h.name) or {}).get(d.name) or {}
            priced += d.layer_count * (
                fig["ms_per_layer"] if d.backend != "cpu" and "ms_per_layer" in fig else new
            )
        shift += h.layer_count * float(old) - priced
    return shift


def profile_from_run(
    samples: Optional[Mapping[str, Any]],
    plan: Mapping[str, Any],
    timings: Optional[Mapping[str, Any]],
    facts: Optional[Mapping[str, Any]],
    units: Optional[Mapping[str, Any]],
    build: Any,
    model: Optional[Mapping[str, Any]],
    now: Any,
    links: Optional[Mapping[str, Any]] = None,
    previous: Optional[Mapping[str, Any]] = None,
    moved: Optional[Any] = None,
    devices: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Dict[str, Any]:
    """profile.json after a measuring run: :func:`measure`'s figures (a worker's CPU figure from
    its device pair's CPU side, :func:`cpu_alone`) and the devices' (:func:`measured_devices` over
    the ``devices`` requests, :func:`devices_together`) put into ``build_profile`` (filter
    ``llmfleet.cluster.profile_build``). With devices priced, the head's token time is what the
    request without devices left (:func:`head_token_from_none`), else the fitted one moved by
    :func:`head_token_shift`."""
    got = measure(plan, samples or {}, timings or {}, facts or {}, units or {}, links or {}, moved or None)
    hosts = cpu_alone(devices or [], got["hosts"], facts or {}, units or {})
    priced = devices_together(devices or [], measured_devices(devices or [], hosts))
    served = _parse(plan)
    head = served.head.name if served else None
    token_ms = (hosts.get(head) or {}).get("token_ms")
    none = (
        head_token_from_none(devices or [], hosts, links or {})
        if priced and "ms_per_layer" in (hosts.get(head) or {})
        else None
    )
    if none is not None:
        # the head's own time of a token: what the placement without devices left
        row = {k: v for k, v in hosts[head].items() if k != "token_ms"}
        if token_ms is not None:
            row["token_ms_fitted"] = token_ms
        if none > 0:
            row["token_ms"] = round(none, 4)
        hosts[head] = row
    elif token_ms is not None and priced:
        shift = head_token_shift(plan, got["hosts"], hosts, priced)
        if token_ms + shift > 0:
            hosts[head] = dict(hosts[head], token_ms=round(token_ms + shift, 4), token_ms_fitted=token_ms)
    return build_profile(
        previous or None,
        str(build),
        model or {},
        facts or {},
        hosts,
        links or {},
        str(now),
        {"output_layers": got["output_layers"], "token": got["token"]},
        priced,
    )

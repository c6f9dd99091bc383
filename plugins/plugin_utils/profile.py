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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

PROFILE_VERSION = 1
REMEASURE_HINT = "re-measure with playbooks/profile.yml"
# Sane upper bounds: above these a figure is a unit mistake, not a slow machine.
LIMITS = {
    "ms_per_layer": 60000.0,
    "cpu_ms_per_layer": 60000.0,
    "cpu_quota": 4096.0,
    "rtt_ms": 60000.0,
    "mbit_s": 1000000.0,
}
# The compute figures that go into the planner's speed dict besides ms_per_layer (when present).
QUOTA_KEYS = ("cpu_quota", "cpu_ms_per_layer")
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


def _layer_equivalents(plan_hosts: Sequence[Mapping[str, Any]], tied_output: bool = True) -> Dict[str, float]:
    """Per host: its repeating layers, plus the output layer counted by its weight in layers.

    Decode reads every weight once per token, so a host's work follows its weight bytes; the
    output layer (vocab x n_embd) weighs many layers on a small model. The average repeating
    layer is read off the hosts without the output layer; the head's own weights (which hold the
    token embedding, a lookup and no work) are left out."""
    per_layer = []
    for h in plan_hosts:
        first, last = (h.get("layers") or [0, 0])[:2]
        weights = (h.get("predicted_mib") or {}).get("weights")
        if h.get("role") == "worker" and not h.get("output_layer") and last > first and weights:
            per_layer.append(float(weights) / (last - first))
    avg = sum(per_layer) / len(per_layer) if per_layer else None
    out = {}
    for h in plan_hosts:
        first, last = (h.get("layers") or [0, 0])[:2]
        count = float(max(0, last - first))
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


def compute_figures(
    plan: Mapping[str, Any],
    samples: Mapping[str, Sequence[Mapping[str, Any]]],
    timings: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    units: Mapping[str, str],
) -> Dict[str, Dict[str, Any]]:
    """Each planned host's ms per layer per token from one measured request.

    ``samples``: host -> the verify role's three ``host_usage`` samples (before and after the
    idle window, after the request). ``timings``: llama-server's ``timings`` of that request
    (``prompt_ms``, ``predicted_ms``, ``predicted_n``). ``facts``: host -> ``llmfleet_host``.

    The unit's CPU seconds during the request, times the decode share of the request's time
    (predicted_ms over prompt_ms + predicted_ms), over the tokens and the host's layer
    equivalents, is ``cpu_ms_per_layer``; over the CPUs its threads run on at once (min(threads,
    the CPU count)) it is ``ms_per_layer``, the unthrottled time. A CFS quota is not divided in:
    it is recorded as ``cpu_quota`` and the time model caps the rate with it (a host that used
    1.4 % of a CPU under a 0.25 quota was never throttled: its time is its CPU time). A host whose
    figure cannot be made gets ``reason`` ("not measured: <host>: <why>") instead.
    """
    tokens = timings.get("predicted_n")
    predicted_ms = timings.get("predicted_ms")
    prompt_ms = timings.get("prompt_ms") or 0.0
    plan_hosts = [h for h in plan.get("hosts") or [] if isinstance(h, dict)]
    equivalents = _layer_equivalents(plan_hosts, bool((plan.get("model") or {}).get("tied_output", True)))
    out: Dict[str, Dict[str, Any]] = {}
    for h in plan_hosts:
        name = str(h.get("name"))
        role = str(h.get("role"))
        unit = units.get(role, "")

        def fail(why: str, name: str = name) -> None:
            out[name] = {"reason": "not measured: %s: %s" % (name, why)}

        layers = equivalents.get(name, 0.0)
        if layers <= 0:
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
        cpu_ms = cpu * decode_share * 1000.0 / float(tokens) / layers
        out[name] = {
            "ms_per_layer": round(cpu_ms / parallel, 4),
            "cpu_ms_per_layer": round(cpu_ms, 4),
            "cpu_quota": quota,
            "cpu_seconds": round(cpu, 4),
            "tokens": int(tokens),
            "layer_equivalents": round(layers, 3),
            "parallel_cpus": round(parallel, 3),
            "threads": int(threads) if isinstance(threads, (int, float)) and threads > 0 else None,
            "decode_share": round(decode_share, 4),
        }
    return out


# --------------------------------------------------------------------------- the profile


def build_profile(
    previous: Optional[Mapping[str, Any]],
    build: str,
    model: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    compute: Mapping[str, Mapping[str, Any]],
    links: Mapping[str, Mapping[str, Any]],
    now: str,
) -> Dict[str, Any]:
    """profile.json after one measuring run.

    Hosts measured now get their fingerprint, the figures that were made and ``measured_at``;
    what could not be measured is kept in ``not_measured`` (each reason names the host). The
    previous profile's hosts are kept when they were not measured now and their build and model
    are the same (a stale entry is caught by :func:`speeds` when it is read). Every figure written
    is checked (:func:`check_figure`): a bad one raises :class:`ProfileError`.
    """
    sha = model.get("sha256")
    hosts: Dict[str, Any] = {}
    if previous and previous.get("build") == build and (previous.get("model") or {}).get("sha256") == sha:
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
            for key in QUOTA_KEYS:
                if figures.get(key) is not None:
                    check_figure(name, key, figures[key], "the measured request")
            entry["compute"] = dict(figures, measured_at=now)
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
    return {
        "version": PROFILE_VERSION,
        "measured_at": now,
        "build": build,
        "model": {"name": model.get("name"), "sha256": sha},
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


def _figures(name: str, entry: Mapping[str, Any], is_head: bool) -> Tuple[Dict[str, float], List[str]]:
    """The speed dict of one profile entry, or the reasons it cannot be used."""
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
            if "cpu_ms_per_layer" not in compute and quota:
                # written before the quota was a cap: its ms_per_layer is CPU time over the quota
                problems.append(
                    "compute figure measured before the CPU quota %s was a cap (no cpu_ms_per_layer)" % quota
                )
            if compute.get("cpu_quota") is not None:
                for key in QUOTA_KEYS:
                    if compute.get(key) is not None:
                        speed[key] = check_figure(name, key, compute[key], "profile.json")
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
        speed, problems = _figures(name, entry, is_head)
        if problems:
            remeasure.append("%s: figures not used (%s): %s" % (name, "; ".join(problems), REMEASURE_HINT))
            continue
        out[name], source[name] = speed, "profile"
    return {"speed": out, "source": source, "remeasure": remeasure}


# --------------------------------------------------------------------------- measuring placement

MEASURE_LAYERS = 2
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
    counts = [max(0, (d.get("layers") or [0, 0])[1] - (d.get("layers") or [0, 0])[0]) for d in devices]
    outputs = [bool(d.get("output_layer")) for d in devices]
    head_layers = max(0, (head.get("layers") or [0, 0])[1] - (head.get("layers") or [0, 0])[0])
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
    lost = (max(0, (head.get("layers") or [0, 0])[1] - (head.get("layers") or [0, 0])[0]) - head_layers) * avg
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
        old = (h.get("layers") or [0, 0])[1] - (h.get("layers") or [0, 0])[0] if h.get("layers") else 0
        extra = float(mib.get("weights") or 0) - old * avg if h.get("output_layer") else 0.0
        mib["weights"] = round(c * avg + max(0.0, extra), 2)
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

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's speed profile (<llmfleet_output_dir>/profile.json, docs/profile.schema.json).

Controller only. Two steps (the figures themselves are made from the measured requests by
profile_figures.py, through the placements of measuring.py):

- :func:`build_profile`: the figures of profile_figures.measure plus the link probe's, with the fingerprints they belong to
  (each host's hardware, the llama.cpp build, the model's sha256) and when they were measured.
- :func:`speeds`: the per-host ``speed`` dicts the planner reads (``ms_per_layer``, a quota'd
  host's ``cpu_quota`` and ``cpu_ms_per_layer``, and for a worker ``rtt_ms`` and ``mbit_s`` of
  its link to the head), from the profile or, for a what-if
  host, from its inventory's ``llmfleet_profile``. A figure that is stale (the host, the build or
  the model changed), zero, negative, not finite, or a 0 Mbit link is never used: the host is
  listed in ``remeasure`` with the reason (or, for inventory figures, refused with an error).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import SPEED_LIMITS

# 2: the output layer measured apart (output_ms, output_cpu_ms), the head's token_ms; a version 1
# profile priced every layer of the output layer's holder by weight: its hosts are re-measured
PROFILE_VERSION = 2
REMEASURE_HINT = "re-measure with playbooks/profile.yml"
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
# A device's figures (profile.json ``hosts.<h>.devices.<name>``; the planner's ``speed.devices``)
DEVICE_FIGURE_KEYS = ("ms_per_layer", "output_ms")
# rpc-server's threads when measured: with more than one, its CPU seconds are mostly its threads
# polling (molecule/tune, 2 threads: 10.68 CPU s for 8 layers over 64 tokens; 1 thread: 0.94)
MEASURE_THREADS = 1


class ProfileError(Exception):
    """A profile or a figure that cannot be used (the message names the host and the value)."""


def fingerprint(fact: Mapping[str, Any]) -> Dict[str, Any]:
    """What identifies a host (from its ``llmfleet_host`` fact): CPUs, their model, memory, and
    for a host with a GPU its devices (name, description, total MiB; a CPU-only host records
    none, so a profile written before devices were fingerprinted still reads)."""
    memory = fact.get("memory") or {}
    isa = fact.get("isa")
    gpus = [
        "%s %s %s" % (d.get("name"), d.get("description"), d.get("memory_total_mib"))
        for d in fact.get("devices") or []
        if isinstance(d, dict) and d.get("backend") != "cpu"
    ]
    return {
        **({"devices": gpus} if gpus else {}),
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
        for key in (*FINGERPRINT_KEYS, "devices")
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
    limit = SPEED_LIMITS.get(key)
    if limit is not None and number > limit:
        raise ProfileError("%s: %s is %s in %s (above the sane bound %s)" % (host, key, value, where, limit))
    return number


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
    devices: Optional[Mapping[str, Mapping[str, Mapping[str, Any]]]] = None,
) -> Dict[str, Any]:
    """profile.json after one measuring run.

    ``devices``: host -> device name -> its figures (:func:`device_figures`), for the devices
    other than the CPU that this run measured (written under the host's ``devices``), or
    ``reason`` for one it could not (kept in ``not_measured``).

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
    for name in sorted(set(compute) | set(links) | set(devices or {})):
        fact = facts.get(name)
        if not isinstance(fact, dict):
            continue
        entry: Dict[str, Any] = {"fingerprint": fingerprint(fact), "measured_at": now, "not_measured": []}
        old = hosts.get(name) or {}
        if old.get("fingerprint") == entry["fingerprint"]:
            # same hardware: keep a figure this run could not make
            for key in ("compute", "link", "devices"):
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
        for dev, got in sorted(((devices or {}).get(name) or {}).items()):
            if got.get("reason"):
                entry["not_measured"].append(got["reason"])
                continue
            for key in DEVICE_FIGURE_KEYS:
                if got.get(key) is not None:
                    check_figure("%s device %s" % (name, dev), key, got[key], "the measured requests")
            entry.setdefault("devices", {})[dev] = {**got, "measured_at": now}
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
) -> Tuple[Dict[str, Any], List[str]]:
    """The speed dict of one profile entry, or the reasons it cannot be used. ``ratio``: the
    profile's ``output_layers`` (the output layer's measured cost in repeating layers), which
    prices the output layer on a host where it was not measured."""
    speed: Dict[str, Any] = {}
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
        if entry.get("devices") is not None:
            speed["devices"] = _device_speeds(name, entry["devices"], "profile.json")
        if not is_head:
            if not link:
                problems.append("no link figures")
            else:
                for key in ("rtt_ms", "mbit_s"):
                    speed[key] = check_figure(name, key, link.get(key), "profile.json")
    except ProfileError as err:
        problems.append(str(err).split(": ", 1)[1])
    return speed, problems


def _device_speeds(name: str, value: Any, where: str) -> Dict[str, Dict[str, float]]:
    """``devices`` of a profile entry or an inventory's ``llmfleet_profile``: device name ->
    {ms_per_layer, output_ms (optional)}, each figure checked (:class:`ProfileError` naming the
    host, the device and the value)."""
    if not isinstance(value, dict):
        raise ProfileError("%s: devices %r in %s is not a dict of device figures" % (name, value, where))
    out: Dict[str, Dict[str, float]] = {}
    for dev, figures in value.items():
        try:
            if not isinstance(figures, dict):
                raise ProfileError("%s: figures %r in %s are not a dict" % (name, figures, where))
            got = {"ms_per_layer": check_figure(name, "ms_per_layer", figures.get("ms_per_layer"), where)}
            if figures.get("output_ms") is not None:
                got["output_ms"] = check_figure(name, "output_ms", figures["output_ms"], where)
        except ProfileError as err:
            raise ProfileError("%s: device %s: %s" % (name, dev, str(err).split(": ", 1)[1])) from err
        out[str(dev)] = got
    return out


def device_figures(
    host: str, device: str, cpu_ms_per_layer: float, on_device_ms: float, on_cpu_ms: float, layers: int
) -> Dict[str, Any]:
    """A device's ms per layer from two measured requests through one placement that differ only
    in where ``layers`` repeating layers of ``host`` run: on ``device`` (``on_device_ms`` per token)
    and on the host's CPU (``on_cpu_ms``). Every other term of the two requests is the same, so
    ``ms_per_layer = cpu_ms_per_layer + (on_device_ms - on_cpu_ms) / layers`` (wall time: a GPU's
    time is not CPU seconds). docs/profile.md, "Per device"; :class:`ProfileError` names the host,
    the device and the value when the figure cannot be made."""
    at = "%s device %s" % (host, device)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ProfileError("%s: %r layers moved: at least one is needed to price a device" % (at, layers))
    cpu = check_figure(at, "ms_per_layer", cpu_ms_per_layer, "the host's CPU figure")
    on_device = check_figure(at, "ms_per_token", on_device_ms, "the request on the device")
    on_cpu = check_figure(at, "ms_per_token", on_cpu_ms, "the request on the CPU")
    ms = cpu + (on_device - on_cpu) / layers
    if ms <= 0:
        raise ProfileError(
            "%s: %d layers on it made a token %.3f ms faster than on the CPU (%.3f ms a layer there):"
            " more than the layers cost, so the requests are too noisy to price it (measure more tokens)"
            % (at, layers, on_cpu - on_device, cpu)
        )
    return {
        "ms_per_layer": round(check_figure(at, "ms_per_layer", ms, "the measured requests"), 4),
        "layers": layers,
        "ms_per_token_on_device": on_device,
        "ms_per_token_on_cpu": on_cpu,
    }


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
    out: Dict[str, Dict[str, Any]] = {}
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
            speed: Dict[str, Any] = {
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
            if figures.get("devices") is not None:
                speed["devices"] = _device_speeds(name, figures["devices"], "llmfleet_profile")
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


# --------------------------------------------------------------------------- the measuring units


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

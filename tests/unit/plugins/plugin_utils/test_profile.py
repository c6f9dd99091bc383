"""The speed profile (plugins/plugin_utils/profile.py): figures, fingerprints, refusals."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import jsonschema
import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile as prof
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile_figures as figs

SCHEMA = json.loads((Path(__file__).resolve().parents[4] / "docs" / "profile.schema.json").read_text())
SHA = "a" * 64
NOW = "2026-12-01T18:00:00Z"
UNITS = {"head": "llama-server", "worker": "rpc-server"}


def fact(cpus=2, quota=None, model="Xeon", limit=512):
    return {
        "arch": "x86_64",
        "cpu_model": model,
        "cpus": cpus,
        "cpus_online": 2,
        "cpu_quota": quota,
        "isa": ["avx2", "avx"],
        "memory": {"total_mib": 15000, "cgroup_limit_mib": limit, "usable_mib": 400},
    }


FACTS = {"head": fact(), "w1": fact(), "w2": fact(cpus=1, quota=0.25)}

PLAN = {
    "hosts": [
        {
            "name": "head",
            "role": "head",
            "layers": [0, 2],
            "output_layer": False,
            "threads": 2,
            "predicted_mib": {"weights": 180.0},
        },
        {
            "name": "w1",
            "role": "worker",
            "layers": [2, 10],
            "output_layer": False,
            "threads": 1,
            "predicted_mib": {"weights": 16.0},
        },
        # 6 layers of 2 MiB + a 20 MiB output layer: 6 + 10 layer equivalents
        {
            "name": "w2",
            "role": "worker",
            "layers": [10, 16],
            "output_layer": True,
            "threads": 1,
            "predicted_mib": {"weights": 32.0},
        },
    ]
}


def window(unit, before, after):
    return [
        {"units": {unit: {"cpu_seconds": 0.0}}},
        {"units": {unit: {"cpu_seconds": before}}},
        {"units": {unit: {"cpu_seconds": after}}},
    ]


SAMPLES = {
    "head": window("llama-server", 1.0, 1.5),
    "w1": window("rpc-server", 2.0, 3.6),
    "w2": window("rpc-server", 0.0, 0.8),
}
# 40 tokens; 900 of the 1000 ms decoding
TIMINGS = {"prompt_ms": 100.0, "predicted_ms": 900.0, "predicted_n": 40}


def test_ms_per_layer_from_the_cpu_seconds_of_a_request() -> None:
    figures = figs.compute_figures(PLAN, SAMPLES, TIMINGS, FACTS, UNITS)
    # w1 (one rpc-server thread): 1.6 CPU s * 0.9 decode = 1.44 s = 1440 ms / 40 tokens / 8 layers
    assert figures["w1"]["ms_per_layer"] == pytest.approx(4.5)
    assert figures["w1"]["cpu_ms_per_layer"] == pytest.approx(4.5) and figures["w1"]["cpu_quota"] is None
    assert figures["w1"]["threads"] == 1
    # w2 (one thread, a 0.25 quota): 0.8 * 0.9 = 0.72 s = 720 ms / 40 / (6 + 10 output
    # equivalents) = 1.125 ms, its unthrottled time; the quota is a cap, recorded, not divided in
    # (the old figure 720 / 0.25 = 4.5 made a never-throttled host 4x slower than it was)
    assert figures["w2"]["layer_equivalents"] == pytest.approx(16.0)
    assert figures["w2"]["ms_per_layer"] == pytest.approx(1.125)
    assert figures["w2"]["cpu_ms_per_layer"] == pytest.approx(1.125)
    assert figures["w2"]["cpu_quota"] == 0.25
    # head: 0.5 * 0.9 / 2 = 225 ms / 40 / 2 layers = 2.8125
    assert figures["head"]["ms_per_layer"] == pytest.approx(2.8125)


def test_a_host_without_work_is_named_not_measured() -> None:
    samples = dict(SAMPLES, w1=window("rpc-server", 2.0, 2.0))
    figures = figs.compute_figures(PLAN, samples, TIMINGS, FACTS, UNITS)
    assert "ms_per_layer" not in figures["w1"]
    assert figures["w1"]["reason"].startswith("not measured: w1: unit rpc-server used 0.0000 CPU seconds")
    short = figs.compute_figures(PLAN, SAMPLES, dict(TIMINGS, predicted_n=1), FACTS, UNITS)
    assert all("tokens" in v["reason"] for v in short.values())


def profile():
    figures = figs.compute_figures(PLAN, SAMPLES, TIMINGS, FACTS, UNITS)
    links = {
        "w1": {
            "measured": True,
            "rtt_ms": 0.4,
            "mbit_s": 900.0,
            "mbit_s_to_host": 950.0,
            "mbit_s_from_host": 900.0,
        },
        "w2": {"measured": True, "rtt_ms": 0.5, "mbit_s": 20.0},
    }
    return prof.build_profile(None, "b0c1e570", {"name": "m", "sha256": SHA}, FACTS, figures, links, NOW)


def use(p, facts=None, given=None, build="b0c1e570", sha=SHA):
    return prof.speeds(
        ["head", "w1", "w2"], "head", p, FACTS if facts is None else facts, given or {}, build, sha
    )


def test_the_profile_matches_its_schema_and_gives_the_speed_dicts() -> None:
    p = profile()
    jsonschema.validate(p, SCHEMA)
    result = use(p)
    assert result["remeasure"] == []
    assert result["speed"]["head"] == {"ms_per_layer": pytest.approx(2.8125)}
    assert result["speed"]["w1"] == {"ms_per_layer": pytest.approx(4.5), "rtt_ms": 0.4, "mbit_s": 900.0}
    assert result["speed"]["w2"] == {
        "ms_per_layer": pytest.approx(1.125),
        "cpu_quota": 0.25,
        "cpu_ms_per_layer": pytest.approx(1.125),
        "rtt_ms": 0.5,
        "mbit_s": 20.0,
    }
    assert result["source"] == {"head": "profile", "w1": "profile", "w2": "profile"}


def test_a_changed_host_is_marked_for_re_measuring_by_name() -> None:
    facts = dict(FACTS, w2=fact(cpus=1, quota=0.5))
    result = use(profile(), facts=facts)
    assert "w2" not in result["speed"] and "w1" in result["speed"]
    assert result["remeasure"] == [
        "w2: the host changed since it was measured (cpu_quota 0.25 -> 0.5): re-measure with playbooks/profile.yml"
    ]


@pytest.mark.parametrize(
    "build, sha, why",
    [
        ("b9999999", SHA, "the llama.cpp build changed (b0c1e570 -> b9999999)"),
        ("b0c1e570", "b" * 64, "the model changed"),
    ],
)
def test_a_changed_build_or_model_makes_every_host_stale(build, sha, why) -> None:
    result = use(profile(), build=build, sha=sha)
    assert result["speed"] == {}
    assert len(result["remeasure"]) == 3
    assert all(why in line for line in result["remeasure"])
    assert [line.split(":")[0] for line in result["remeasure"]] == ["head", "w1", "w2"]


@pytest.mark.parametrize(
    "where, key, value",
    [
        ("compute", "ms_per_layer", 0.0),
        ("compute", "ms_per_layer", -1.5),
        ("compute", "ms_per_layer", math.nan),
        ("compute", "ms_per_layer", math.inf),
        ("compute", "ms_per_layer", "fast"),
        ("link", "mbit_s", 0.0),
        ("link", "rtt_ms", -0.1),
        ("link", "rtt_ms", math.nan),
    ],
)
def test_odd_figures_in_the_profile_are_not_used_and_the_host_is_named(where, key, value) -> None:
    p = copy.deepcopy(profile())
    p["hosts"]["w1"][where][key] = value
    result = use(p)
    assert "w1" not in result["speed"]
    assert "w2" in result["speed"]
    assert len(result["remeasure"]) == 1
    line = result["remeasure"][0]
    assert line.startswith(f"w1: figures not used ({key} is ") or line.startswith(
        f"w1: figures not used ({key} {value!r}"
    )
    assert "re-measure" in line


def test_a_zero_mbit_link_says_so() -> None:
    p = copy.deepcopy(profile())
    p["hosts"]["w2"]["link"]["mbit_s"] = 0
    assert "a 0 Mbit link" in use(p)["remeasure"][0]


def test_a_worker_without_link_figures_gets_none() -> None:
    p = copy.deepcopy(profile())
    del p["hosts"]["w2"]["link"]
    result = use(p)
    assert "w2" not in result["speed"]
    assert result["remeasure"] == [
        "w2: figures not used (no link figures): re-measure with playbooks/profile.yml"
    ]


@pytest.mark.parametrize("value", [0, -3, math.nan, 1e9])
def test_odd_figures_are_refused_when_the_profile_is_written(value) -> None:
    figures = figs.compute_figures(PLAN, SAMPLES, TIMINGS, FACTS, UNITS)
    links = {"w1": {"measured": True, "rtt_ms": 0.4, "mbit_s": value}}
    with pytest.raises(prof.ProfileError, match=r"^w1: mbit_s is "):
        prof.build_profile(None, "b0c1e570", {"sha256": SHA}, FACTS, figures, links, NOW)


def test_what_if_hosts_carry_their_figures_in_the_inventory() -> None:
    given = {"w2": {"ms_per_layer": 9.0, "rtt_ms": 3.0, "mbit_s": 40}}
    result = prof.speeds(["head", "w1", "w2"], "head", None, FACTS, given, "b0c1e570", SHA)
    assert result["speed"] == {"w2": {"ms_per_layer": 9.0, "rtt_ms": 3.0, "mbit_s": 40.0}}
    assert result["source"] == {"w2": "inventory"}
    with pytest.raises(prof.ProfileError, match=r"^w2: mbit_s is 0 in llmfleet_profile \(a 0 Mbit link\)"):
        prof.speeds(
            ["w2"], "head", None, FACTS, {"w2": {"ms_per_layer": 9.0, "rtt_ms": 3.0, "mbit_s": 0}}, "", None
        )
    with pytest.raises(prof.ProfileError, match=r"^w2: ms_per_layer is nan"):
        prof.speeds(["w2"], "head", None, FACTS, {"w2": {"ms_per_layer": math.nan}}, "", None)


def test_a_later_run_keeps_figures_it_could_not_make_for_the_same_hardware() -> None:
    first = profile()
    later = prof.build_profile(
        first,
        "b0c1e570",
        {"sha256": SHA},
        FACTS,
        {"w1": {"reason": "not measured: w1: no usage samples around the request"}},
        {"w1": {"measured": False, "reason": "not measured: w1 (10.0.0.2:4000): no answer within 3.0 s"}},
        "2026-12-02T00:00:00Z",
    )
    assert later["hosts"]["w1"]["compute"] == first["hosts"]["w1"]["compute"]
    assert later["hosts"]["w1"]["not_measured"][1].startswith("not measured: w1 (10.0.0.2:4000)")
    # a new build drops the old figures
    rebuilt = prof.build_profile(first, "b1111111", {"sha256": SHA}, FACTS, {}, {}, NOW)
    assert rebuilt["hosts"] == {}


@pytest.mark.parametrize(("tied", "head_weights"), [(True, 24.0), (False, 44.0)])
def test_the_output_layer_on_the_head_counts_by_its_weight(tied, head_weights) -> None:
    # the head: 2 layers of 2 MiB and a 20 MiB output (tied: the token embedding itself; untied: a
    # 20 MiB embedding besides it), so 2 + 10 layer equivalents; the workers hold no output
    plan = copy.deepcopy(PLAN)
    plan["model"] = {"tied_output": tied}
    plan["hosts"][0].update(output_layer=True, predicted_mib={"weights": head_weights})
    plan["hosts"][2].update(output_layer=False, predicted_mib={"weights": 12.0})
    figures = figs.compute_figures(plan, SAMPLES, TIMINGS, FACTS, UNITS)
    assert figures["head"]["layer_equivalents"] == pytest.approx(12.0)
    # 0.5 CPU s * 0.9 / 2 CPUs = 225 ms / 40 tokens / 12 = 0.46875
    assert figures["head"]["ms_per_layer"] == pytest.approx(0.46875, abs=1e-4)
    assert figures["w2"]["layer_equivalents"] == pytest.approx(6.0)


def test_a_quota_d_figure_of_the_old_model_is_re_measured_and_an_unquota_d_one_kept() -> None:
    """Before the quota was a cap, ms_per_layer was CPU time over the quota (no cpu_ms_per_layer):
    such a figure of a quota'd host would be read as 4x its unthrottled time."""
    p = profile()
    for name in ("w1", "w2"):
        for key in ("cpu_ms_per_layer", "cpu_quota"):
            p["hosts"][name]["compute"].pop(key)
    result = use(p)
    assert "w1" in result["speed"] and "w2" not in result["speed"]
    assert result["remeasure"] == [
        "w2: figures not used (compute figure measured before the CPU quota 0.25 was a cap"
        " (no cpu_ms_per_layer)): re-measure with playbooks/profile.yml"
    ]


def test_inventory_quota_figures_are_checked_and_passed_on() -> None:
    given = {"w2": {"ms_per_layer": 1.0, "rtt_ms": 1.0, "mbit_s": 10.0, "cpu_quota": 0.1}}
    assert use(profile(), given=given)["speed"]["w2"] == dict(given["w2"])
    with pytest.raises(prof.ProfileError, match=r"w2: cpu_quota is 0 in llmfleet_profile"):
        use(profile(), given={"w2": dict(given["w2"], cpu_quota=0)})


def test_a_multi_thread_rpc_server_is_not_trusted() -> None:
    """A 2-thread rpc-server's CPU seconds are mostly its threads polling (molecule/tune: 10.68 CPU
    s for 8 layers at 2 threads, 0.94 at 1): its figure is not made, the host is named."""
    plan = copy.deepcopy(PLAN)
    plan["hosts"][1]["threads"] = 2
    figures = figs.compute_figures(plan, SAMPLES, TIMINGS, FACTS, UNITS)
    assert "ms_per_layer" not in figures["w1"]
    assert figures["w1"]["reason"] == (
        "not measured: w1: rpc-server ran with 2 threads: its CPU seconds are mostly its threads"
        " polling, not its work (playbooks/profile.yml measures every worker at 1 thread)"
    )
    # the head's llama-server runs --poll 0 in the measuring placement: its threads are trusted
    assert figures["head"]["ms_per_layer"] == pytest.approx(2.8125)


UNIT = """[Service]
Type=simple
ExecStart=/opt/llmfleet/llama.cpp/current/rpc-server --host 10.0.0.3 --port 50052 --threads 4 --cache
Restart=always
"""


def test_the_drop_in_runs_a_served_rpc_server_at_one_thread() -> None:
    dropin = prof.single_thread_dropin(UNIT, "w1")
    assert (
        "[Service]\nExecStart=\nExecStart=/opt/llmfleet/llama.cpp/current/rpc-server --host 10.0.0.3"
        in dropin
    )
    assert dropin.endswith("--port 50052 --threads 1 --cache\n")
    assert prof.single_thread_dropin(UNIT.replace("--threads 4", "--threads 1"), "w1") == ""
    with pytest.raises(prof.ProfileError, match="w1: the rpc-server unit's ExecStart has no --threads"):
        prof.single_thread_dropin(UNIT.replace("--threads 4 ", ""), "w1")
    with pytest.raises(prof.ProfileError, match="w1: the rpc-server unit has 0 ExecStart lines"):
        prof.single_thread_dropin("[Service]\n", "w1")


GPU = {
    "name": "Vulkan0",
    "backend": "vulkan",
    "description": "NVIDIA GeForce RTX 3060",
    "memory_total_mib": 12502,
}
CPU_DEV = {"name": "CPU", "backend": "cpu", "description": "Xeon", "memory_total_mib": 15000}


def test_a_device_is_priced_from_two_requests_that_move_its_layers() -> None:
    """4 layers on the GPU instead of the CPU (2.0 ms a layer there) made a token 7.2 ms faster:
    the GPU costs 2.0 - 7.2 / 4 = 0.2 ms a layer."""
    got = prof.device_figures("w1", "Vulkan0", 2.0, 42.8, 50.0, 4)
    assert got["ms_per_layer"] == pytest.approx(0.2)
    # a slow device (lavapipe): the same layers made the token slower
    assert prof.device_figures("w1", "Vulkan0", 2.0, 90.0, 50.0, 4)["ms_per_layer"] == pytest.approx(12.0)
    with pytest.raises(
        prof.ProfileError, match=r"^w1 device Vulkan0: 4 layers on it made a token 9.000 ms faster"
    ):
        prof.device_figures("w1", "Vulkan0", 2.0, 41.0, 50.0, 4)
    with pytest.raises(prof.ProfileError, match=r"^w1 device Vulkan0: 0 layers moved"):
        prof.device_figures("w1", "Vulkan0", 2.0, 41.0, 50.0, 0)


def test_device_figures_reach_the_profile_and_the_speed_dicts() -> None:
    facts = dict(FACTS, w1=dict(fact(), devices=[GPU, CPU_DEV]))
    figures = figs.compute_figures(PLAN, SAMPLES, TIMINGS, FACTS, UNITS)
    links = {
        "w1": {"measured": True, "rtt_ms": 0.4, "mbit_s": 900.0},
        "w2": {"measured": True, "rtt_ms": 0.5, "mbit_s": 20.0},
    }
    devices = {"w1": {"Vulkan0": prof.device_figures("w1", "Vulkan0", 4.5, 42.8, 50.0, 4)}}
    p = prof.build_profile(
        None, "b0c1e570", {"name": "m", "sha256": SHA}, facts, figures, links, NOW, devices=devices
    )
    jsonschema.validate(p, SCHEMA)
    assert p["hosts"]["w1"]["fingerprint"]["devices"] == ["Vulkan0 NVIDIA GeForce RTX 3060 12502"]
    assert "devices" not in p["hosts"]["w2"]["fingerprint"]  # a CPU-only host: as before
    result = use(p, facts=facts)
    assert result["speed"]["w1"]["devices"] == {"Vulkan0": {"ms_per_layer": pytest.approx(2.7)}}
    # another GPU in the host: its figures are stale
    swapped = dict(facts, w1=dict(fact(), devices=[dict(GPU, description="AMD Radeon RX 7900 XTX"), CPU_DEV]))
    assert "w1" not in use(p, facts=swapped)["speed"]
    # a bad device figure in profile.json: the host is named, not used
    bad = copy.deepcopy(p)
    bad["hosts"]["w1"]["devices"]["Vulkan0"]["ms_per_layer"] = -1
    assert use(bad, facts=facts)["remeasure"] == [
        "w1: figures not used (device Vulkan0: ms_per_layer is -1 in profile.json (not positive)):"
        " re-measure with playbooks/profile.yml"
    ]


def test_a_profile_without_devices_still_reads_on_a_cpu_only_fleet() -> None:
    """Old profiles (no devices, no device fingerprint) give the same speed dicts as before."""
    p = profile()
    assert all("devices" not in h and "devices" not in h["fingerprint"] for h in p["hosts"].values())
    assert all("devices" not in s for s in use(p)["speed"].values())


def test_inventory_device_figures_are_checked_and_passed_on() -> None:
    given = {
        "w1": {"ms_per_layer": 4.0, "rtt_ms": 1.0, "mbit_s": 900, "devices": {"CUDA0": {"ms_per_layer": 0.3}}}
    }
    result = prof.speeds(["head", "w1"], "head", None, FACTS, given, "b0c1e570", SHA)
    assert result["speed"]["w1"]["devices"] == {"CUDA0": {"ms_per_layer": 0.3}}
    given["w1"]["devices"] = {"CUDA0": {"ms_per_layer": 0}}
    with pytest.raises(prof.ProfileError, match=r"^w1: device CUDA0: ms_per_layer is 0 in llmfleet_profile"):
        prof.speeds(["head", "w1"], "head", None, FACTS, given, "b0c1e570", SHA)

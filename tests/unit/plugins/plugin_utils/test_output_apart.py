"""The output layer measured apart and the head priced from wall time (issue #15).

A fleet with known costs is "measured" twice - the output layer on the head, then on a worker -
and the figures profile.py makes from the two requests must be those costs, not the output
layer's weight in layers; the time model with them must give back the measured requests.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import measuring as meas
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile as prof
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile_figures as figs

SCHEMA = json.loads((Path(__file__).resolve().parents[4] / "docs" / "profile.schema.json").read_text())
UNITS = {"head": "llama-server", "worker": "rpc-server"}
SHA = "c" * 64

# The fleet's true costs, what the two requests below are made of. Workers: CPU ms per token
# (one rpc-server thread: their CPU time is their time).
FAST_LAYER = 1.2  # fast, one full CPU
FAST_OUTPUT = 24.0  # the output layer on fast: 20 of its layers (its weight would say 47)
NAS_LAYER = 1.5  # nas, a quarter of a CPU
# The head (wall ms per token; its CPU seconds are NOT its time: they include its threads
# waiting on the workers, so the samples below give it a figure unrelated to these):
HEAD_OUTPUT = 10.0
HEAD_OWN = 15.0  # llama-server's own work and waits per token, outside layers and links
TOKENS = 40
N_EMBD, N_VOCAB = 1024, 262144
MBIT = 1000.0
RTT = 0.5


def fact(cpus, quota=None):
    return {
        "arch": "x86_64",
        "cpu_model": "Xeon",
        "cpus": cpus,
        "cpus_online": 2,
        "cpu_quota": quota,
        "isa": ["avx2"],
        "memory": {"total_mib": 15000, "cgroup_limit_mib": 480, "usable_mib": 400},
    }


FACTS = {"head": fact(1, 1.0), "fast": fact(1, 1.0), "nas": fact(1, 0.25)}
LINKS = {
    "fast": {"measured": True, "rtt_ms": RTT, "mbit_s": MBIT},
    "nas": {"measured": True, "rtt_ms": RTT, "mbit_s": MBIT},
}


def transfer(n_bytes):
    return n_bytes * 8 / (MBIT * 1e6) * 1000.0


def plan(output_on):
    """head (no layers), nas 2 layers, fast 16 layers (last in --rpc: it holds the output layer
    when a worker does)."""

    def row(name, role, layers):
        return {
            "name": name,
            "role": role,
            "layers": layers,
            "output_layer": output_on == name,
            "threads": 1,
            "predicted_mib": {"weights": 3.6 * (layers[1] - layers[0]) + (170.0 if output_on == name else 0)},
        }

    return {
        "model": {"n_layer": 18, "n_embd": N_EMBD, "n_vocab": N_VOCAB, "tied_output": True},
        "workers": ["nas", "fast"],
        "hosts": [row("head", "head", [0, 0]), row("nas", "worker", [0, 2]), row("fast", "worker", [2, 18])],
    }


def wall_ms(output_on):
    """The true time per token of each request: every term of the chain."""
    links = 2 * RTT + 2 * transfer(N_EMBD * 4)  # nas: a row each way
    if output_on == "head":
        links += 2 * transfer(N_EMBD * 4)
        head = HEAD_OUTPUT
        fast = 16 * FAST_LAYER
    else:
        links += transfer(N_EMBD * 4) + transfer(N_VOCAB * 4)
        head = 0.0
        fast = 16 * FAST_LAYER + FAST_OUTPUT
    return HEAD_OWN + head + fast + 2 * NAS_LAYER + links


def window(unit, cpu_ms_per_token):
    return [
        {"units": {unit: {"cpu_seconds": 0.0}}},
        {"units": {unit: {"cpu_seconds": 10.0}}},
        {"units": {unit: {"cpu_seconds": 10.0 + cpu_ms_per_token * TOKENS / 1000.0}}},
    ]


def samples(output_on):
    fast = 16 * FAST_LAYER + (FAST_OUTPUT if output_on == "fast" else 0.0)
    return {
        # the head's CPU: mostly its threads spinning, as measured on demo-uneven (about the same
        # with and without the output layer)
        "head": window("llama-server", 70.0),
        "fast": window("rpc-server", fast),
        "nas": window("rpc-server", 2 * NAS_LAYER),
    }


def timings(output_on):
    return {"prompt_ms": 0.0, "predicted_ms": wall_ms(output_on) * TOKENS, "predicted_n": TOKENS}


def measured(second_timings=None):
    moved = {"plan": plan("fast"), "samples": samples("fast"), "timings": second_timings or timings("fast")}
    return figs.measure(plan("head"), samples("head"), timings("head"), FACTS, UNITS, LINKS, moved)


def made_profile(got):
    return prof.build_profile(
        None,
        "b0c1e570",
        {"name": "m", "sha256": SHA},
        FACTS,
        got["hosts"],
        LINKS,
        "2026-12-03T08:00:00Z",
        {"output_layers": got["output_layers"], "token": got["token"]},
    )


def test_the_output_layer_is_measured_where_it_moved_not_priced_by_weight() -> None:
    got = measured()
    hosts = got["hosts"]
    assert hosts["fast"]["cpu_ms_per_layer"] == pytest.approx(FAST_LAYER, abs=1e-3)
    assert hosts["nas"]["cpu_ms_per_layer"] == pytest.approx(NAS_LAYER, abs=1e-3)
    assert hosts["fast"]["output_cpu_ms"] == pytest.approx(FAST_OUTPUT, abs=1e-3)
    assert got["output_layers"] == pytest.approx(FAST_OUTPUT / FAST_LAYER, abs=1e-3)
    assert "output_ms" not in hosts["nas"]


def test_the_head_is_priced_from_the_requests_wall_time_not_its_cpu() -> None:
    head = measured()["hosts"]["head"]
    assert head["priced_by"] == "wall time"
    # the output layer's time on the head: the difference of the two residuals
    assert head["output_ms"] == pytest.approx(HEAD_OUTPUT, abs=2e-3)
    # its layers at the ratio the output layer measured on fast
    assert head["ms_per_layer"] == pytest.approx(HEAD_OUTPUT / (FAST_OUTPUT / FAST_LAYER), abs=1e-3)
    # what is left of a token when the head holds no layer and no output layer
    assert head["token_ms"] == pytest.approx(HEAD_OWN, abs=2e-3)
    # not its CPU seconds (70 ms a token of them)
    assert "cpu_ms_per_layer" not in head and "cpu_quota" not in head


def test_the_model_gives_back_both_requests() -> None:
    got = measured()
    checks = {c["request"]: c for c in got["token"]["check"]}
    for i, where in enumerate(("head", "fast")):
        assert checks[i]["bound_by"] == "chain"
        assert checks[i]["measured_ms_per_token"] == pytest.approx(wall_ms(where), abs=1e-3)
        assert checks[i]["predicted_ms_per_token"] == pytest.approx(wall_ms(where), abs=0.01)
    p = made_profile(got)
    jsonschema.validate(p, SCHEMA)
    use = prof.speeds(["head", "fast", "nas"], "head", p, FACTS, {}, "b0c1e570", SHA)
    assert use["remeasure"] == []
    s = use["speed"]
    assert s["fast"]["output_ms"] == pytest.approx(FAST_OUTPUT, abs=1e-3)
    assert s["head"]["output_ms"] == pytest.approx(HEAD_OUTPUT, abs=2e-3)
    assert s["head"]["token_ms"] == pytest.approx(HEAD_OWN, abs=2e-3)
    # nas never held it: the measured ratio of its own layers
    assert s["nas"]["output_ms"] == pytest.approx(FAST_OUTPUT / FAST_LAYER * NAS_LAYER, abs=1e-2)
    # the planner's model on request 1's placement gives back its time
    est = figs.predict_request(plan("head"), s)
    assert est.ms_per_token == pytest.approx(wall_ms("head"), abs=0.01)


def test_a_request_bound_by_a_quota_gives_no_residual() -> None:
    # the output layer on nas (a quarter of a CPU): its time is nas's quota, not the chain's
    p2 = plan("head")
    p2["hosts"][1]["output_layer"] = True
    p2["hosts"][0]["output_layer"] = False
    p2["workers"] = ["fast", "nas"]
    p2["hosts"] = [p2["hosts"][0], p2["hosts"][2], p2["hosts"][1]]
    nas_cpu = 2 * NAS_LAYER + 30.0
    second = dict(samples("head"), nas=window("rpc-server", nas_cpu))
    moved = {
        "plan": p2,
        "samples": second,
        "timings": {"prompt_ms": 0.0, "predicted_ms": 140.0 * TOKENS, "predicted_n": TOKENS},
    }
    got = figs.measure(plan("head"), samples("head"), timings("head"), FACTS, UNITS, LINKS, moved)
    assert got["output_layers"] == pytest.approx(30.0 / NAS_LAYER, abs=1e-3)
    assert list(got["token"]["residuals"]) == ["on"]
    head = got["hosts"]["head"]
    # one residual: the head's layers priced like the median worker, its output layer at the ratio
    assert head["ms_per_layer"] == pytest.approx(NAS_LAYER, abs=1e-3)
    assert head["output_ms"] == pytest.approx(30.0, abs=1e-3)
    check = {c["request"]: c for c in got["token"]["check"]}[1]
    assert check["bound_by"] == "quota"
    assert check["predicted_ms_per_token"] == pytest.approx(nas_cpu / 0.25, abs=0.01)


def test_a_failed_second_request_keeps_the_first_requests_figures() -> None:
    got = measured(second_timings={"predicted_ms": 0.0, "predicted_n": 0})
    assert got["output_layers"] is None and got["token"]["token_ms"] is None
    assert "not measured on a worker" in got["token"]["reason"]
    # every host keeps its figure from request 1 (the head's from its CPU seconds, as with one
    # request); no output layer figure is invented
    assert all("ms_per_layer" in got["hosts"][n] for n in ("head", "fast", "nas"))
    assert got["hosts"]["fast"]["cpu_ms_per_layer"] == pytest.approx(FAST_LAYER, abs=1e-3)
    assert not any("output_ms" in got["hosts"][n] for n in ("head", "fast", "nas"))


def test_an_output_layer_that_cost_nothing_is_not_a_figure() -> None:
    moved = {"plan": plan("fast"), "samples": samples("head"), "timings": timings("fast")}
    got = figs.measure(plan("head"), samples("head"), timings("head"), FACTS, UNITS, LINKS, moved)
    assert "output_cpu_ms" not in got["hosts"]["fast"]
    assert got["hosts"]["fast"]["output_reason"].startswith(
        "not measured: fast: the output layer added 0.000"
    )
    assert got["output_layers"] is None


@pytest.mark.parametrize("key, value", [("output_ms", 0.0), ("output_ms", -3.0), ("token_ms", float("nan"))])
def test_odd_output_figures_in_the_profile_are_refused_with_the_host_named(key, value) -> None:
    p = copy.deepcopy(made_profile(measured()))
    p["hosts"]["head"]["compute"][key] = value
    use = prof.speeds(["head", "fast", "nas"], "head", p, FACTS, {}, "b0c1e570", SHA)
    assert "head" not in use["speed"]
    assert use["remeasure"][0].startswith(f"head: figures not used ({key}")


def test_a_version_1_profile_is_re_measured() -> None:
    p = made_profile(measured())
    p["version"] = 1
    use = prof.speeds(["head", "fast", "nas"], "head", p, FACTS, {}, "b0c1e570", SHA)
    assert use["speed"] == {}
    assert all("profile.json version 1" in line for line in use["remeasure"])


# --------------------------------------------------------------------------- the second placement


def served(output_on_head, nas_headroom=300.0):
    """A measuring placement: head, then fast and nas in --rpc order (nas last)."""
    mib = {"weights": 32.4, "kv": 36.0, "compute": 40.0, "process": 6.0, "peak": 0.0, "total": 114.4}
    nas_mib = dict(mib)
    if not output_on_head:
        nas_mib = dict(mib, weights=202.4, total=284.4)
    ot = ["-ot", r"^(output|token_embd)\.weight$=CPU"] if output_on_head else []
    return {
        "model": {
            "n_layer": 18,
            "tied_output": True,
            "output_mib": 170.0,
            "output_largest_mib": 168.0,
            "pipeline_extra_mib": 16.0,
        },
        "workers": ["fast", "nas"],
        "hosts": [
            {
                "name": "head",
                "role": "head",
                "layers": [0, 0],
                "output_layer": output_on_head,
                "predicted_mib": {
                    "weights": 170.0,
                    "kv": 0.0,
                    "compute": 26.0,
                    "process": 30.0,
                    "total": 226.0,
                },
                "headroom_mib": 40.0,
            },
            {
                "name": "fast",
                "role": "worker",
                "endpoint": "10.0.0.2:50052",
                "layers": [0, 9],
                "output_layer": False,
                "predicted_mib": mib,
                "headroom_mib": 60.0,
            },
            {
                "name": "nas",
                "role": "worker",
                "endpoint": "10.0.0.3:50052",
                "layers": [9, 18],
                "output_layer": not output_on_head,
                "predicted_mib": nas_mib,
                "headroom_mib": nas_headroom,
            },
        ],
        "llama_server_args": [
            *("--rpc", "10.0.0.2:50052,10.0.0.3:50052", "--tensor-split", "9,10", "-ngl", "19"),
            *("-sm", "layer", *ot, "-c", "4096", "--poll", "0"),
        ],
        "measuring": {"added": []},
    }


def test_the_output_layer_moves_from_the_head_to_the_worker_with_room() -> None:
    moved = meas.output_moved(served(output_on_head=True))
    assert moved is not None
    assert moved["measuring"]["output_moved_to"] == "nas"
    # a worker without a quota first, when it has the room: the request is then not the quota's
    p = served(output_on_head=True)
    p["hosts"][1]["headroom_mib"] = 400.0
    assert meas.output_moved(p, {"nas": 0.25, "fast": 1.0})["measuring"]["output_moved_to"] == "fast"
    assert meas.output_moved(p, {})["measuring"]["output_moved_to"] == "fast"  # the most room
    args = moved["llama_server_args"]
    assert "-ot" not in args and args[args.index("--rpc") + 1] == "10.0.0.2:50052,10.0.0.3:50052"
    assert args[args.index("--tensor-split") + 1] == "9,10"
    assert args[-2:] == ["--poll", "0"] and args.count("--poll") == 1
    rows = {h["name"]: h for h in moved["hosts"]}
    assert rows["nas"]["output_layer"] and not rows["head"]["output_layer"]
    assert rows["nas"]["layers"] == [9, 18] and rows["fast"]["layers"] == [0, 9]
    assert rows["nas"]["predicted_mib"]["weights"] == pytest.approx(32.4 + 170.0)


def test_the_holder_goes_last_in_rpc_order_when_it_was_not() -> None:
    p = served(output_on_head=True, nas_headroom=50.0)
    p["hosts"][1]["headroom_mib"] = 400.0  # fast has the room now
    moved = meas.output_moved(p)
    assert moved is not None and moved["measuring"]["output_moved_to"] == "fast"
    args = moved["llama_server_args"]
    assert args[args.index("--rpc") + 1] == "10.0.0.3:50052,10.0.0.2:50052"
    rows = {h["name"]: h for h in moved["hosts"]}
    assert rows["nas"]["layers"] == [0, 9] and rows["fast"]["layers"] == [9, 18]
    assert [h["name"] for h in moved["hosts"]] == ["head", "nas", "fast"]


def test_no_room_anywhere_moves_nothing() -> None:
    assert meas.output_moved(served(output_on_head=True, nas_headroom=50.0)) is None


def test_the_pair_puts_the_output_on_the_head_first_and_on_a_worker_second() -> None:
    first, second = meas.measuring_placements(served(output_on_head=False), {"nas": 0.25})
    assert {h["name"]: h["output_layer"] for h in first["hosts"]}["head"]
    assert {h["name"]: h["output_layer"] for h in second["hosts"]}["nas"]
    # no room on any worker: one request only
    assert len(meas.measuring_placements(served(output_on_head=True, nas_headroom=50.0))) == 1


def test_the_output_layer_moves_from_a_worker_to_the_head() -> None:
    moved = meas.output_moved(served(output_on_head=False))
    assert moved is not None and moved["measuring"]["output_moved_to"] == "head"
    args = moved["llama_server_args"]
    assert args[args.index("-ot") + 1] == r"^(output|token_embd)\.weight$=CPU"
    assert args[args.index("--tensor-split") + 1] == "9,10"
    rows = {h["name"]: h for h in moved["hosts"]}
    assert rows["head"]["output_layer"] and not rows["nas"]["output_layer"]
    assert rows["nas"]["predicted_mib"]["weights"] == pytest.approx(32.4)


def test_a_fleet_that_keeps_the_output_on_the_head_is_measured_once() -> None:
    p = served(output_on_head=True)
    p["planned_with"] = {"options": {"output_layer": "head"}}
    placements = meas.measuring_placements(p)
    assert len(placements) == 1 and placements[0]["llama_server_args"] == p["llama_server_args"]


def test_a_quota_d_worker_with_room_gets_a_request_of_its_own() -> None:
    # fast (no quota) takes the output layer in request 2; nas (a quarter of a CPU) in request 3
    p = served(output_on_head=True)
    p["hosts"][1]["headroom_mib"] = 400.0
    placements = meas.measuring_placements(p, {"nas": 0.25, "fast": 1.0})
    assert [x["measuring"].get("output_moved_to") for x in placements[1:]] == ["fast", "nas"]
    # the same split in all three
    for x in placements:
        assert x["llama_server_args"][x["llama_server_args"].index("--tensor-split") + 1] == "9,10"
    # without a quota'd worker, or when the quota'd one is the second's, no third
    assert len(meas.measuring_placements(p, {})) == 2
    p["hosts"][1]["headroom_mib"] = 60.0
    assert len(meas.measuring_placements(p, {"nas": 0.25})) == 2


def test_three_requests_measure_the_output_layer_on_the_quota_d_worker_too() -> None:
    # request 3: the output layer on nas costs 22 CPU ms a token there (fast's ratio, 20 layers,
    # at nas's 1.5 ms a layer would price it at 30: the quota makes that 4x worse in the cap)
    p3 = plan("head")
    p3["hosts"][0]["output_layer"] = False
    p3["hosts"][1]["output_layer"] = True
    p3["workers"] = ["fast", "nas"]
    p3["hosts"] = [p3["hosts"][0], p3["hosts"][2], p3["hosts"][1]]
    third = {
        "plan": p3,
        "samples": dict(samples("head"), nas=window("rpc-server", 2 * NAS_LAYER + 22.0)),
        "timings": {"prompt_ms": 0.0, "predicted_ms": 100.0 * TOKENS, "predicted_n": TOKENS},
    }
    second = {"plan": plan("fast"), "samples": samples("fast"), "timings": timings("fast")}
    got = figs.measure(plan("head"), samples("head"), timings("head"), FACTS, UNITS, LINKS, [second, third])
    assert got["hosts"]["nas"]["output_cpu_ms"] == pytest.approx(22.0, abs=1e-3)
    assert got["hosts"]["fast"]["output_cpu_ms"] == pytest.approx(FAST_OUTPUT, abs=1e-3)
    # the ratio is the first worker's (fast, request 2); the head still from requests 1 and 2
    assert got["output_layers"] == pytest.approx(FAST_OUTPUT / FAST_LAYER, abs=1e-3)
    assert got["hosts"]["head"]["token_ms"] == pytest.approx(HEAD_OWN, abs=2e-3)
    check = {c["request"]: c for c in got["token"]["check"]}[2]
    assert check["bound_by"] == "quota" and check["predicted_ms_per_token"] == pytest.approx(
        (2 * NAS_LAYER + 22.0) / 0.25, abs=0.01
    )
    # and speeds() hands nas its measured figure, not the ratio's
    use = prof.speeds(["head", "fast", "nas"], "head", made_profile(got), FACTS, {}, "b0c1e570", SHA)
    assert use["speed"]["nas"]["output_cpu_ms"] == pytest.approx(22.0, abs=1e-3)

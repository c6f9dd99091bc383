"""The measuring placement (plugins/plugin_utils/profile.py: measuring_plan, docs/profile.md).

A worker the served plan leaves out has no layers, so the served plan's request gives it no
compute figure and the speed objective refuses the fleet (issue #15, demo-uneven's wifi)."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import measuring as meas
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile as prof
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile_figures as figs
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.measuring import measuring_plan
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.split_rule import assign_slots

UNITS = {"head": "llama-server", "worker": "rpc-server"}
FACT = {"arch": "x86_64", "cpus": 1, "cpu_quota": 1.0, "memory": {}}


def planned(name, role, address):
    return {"name": name, "role": role, "address": address, "port": 50052, "cpus": 1}


# demo-uneven's memory plan: head 0-6, fast 6-18 (12 layers of 3.6 MiB), nas the output layer
# only, wifi left out; -ngl 13 over the 19 slots (18 layers + output): 12 on fast, 1 on nas
SERVED = {
    "model": {"n_layer": 18, "tied_output": True},
    "head": "head",
    "workers": ["fast", "nas"],
    "llama_server_args": [
        "--rpc",
        "10.0.0.7:50052,10.0.0.9:50052",
        "--tensor-split",
        "12,1",
        "-ngl",
        "13",
        "-sm",
        "layer",
        "-c",
        "4096",
        "--poll",
        "50",
    ],
    "fallbacks": [{"workers": ["fast"], "llama_server_args": ["--rpc", "10.0.0.7:50052"]}],
    "hosts": [
        {
            "name": "head",
            "role": "head",
            "layers": [0, 6],
            "output_layer": False,
            "threads": 1,
            "predicted_mib": {"weights": 191.6},
        },
        {
            "name": "fast",
            "role": "worker",
            "layers": [6, 18],
            "output_layer": False,
            "threads": 1,
            "endpoint": "10.0.0.7:50052",
            "address": "10.0.0.7",
            "port": 50052,
            "predicted_mib": {"weights": 43.2},
        },
        {
            "name": "nas",
            "role": "worker",
            "layers": [18, 18],
            "output_layer": True,
            "threads": 1,
            "endpoint": "10.0.0.9:50052",
            "address": "10.0.0.9",
            "port": 50052,
            "predicted_mib": {"weights": 170.0},
        },
    ],
    "planned_with": {
        "hosts": [
            planned("head", "head", "10.0.0.6"),
            planned("fast", "worker", "10.0.0.7"),
            planned("wifi", "worker", "10.0.0.8"),
            planned("nas", "worker", "10.0.0.9"),
        ]
    },
}


def window(unit, before, after):
    return [
        {"units": {unit: {"cpu_seconds": 0.0}}},
        {"units": {unit: {"cpu_seconds": before}}},
        {"units": {unit: {"cpu_seconds": after}}},
    ]


SAMPLES = {
    "head": window("llama-server", 1.0, 1.4),
    "fast": window("rpc-server", 0.0, 0.96),
    "wifi": window("rpc-server", 0.0, 0.5),
    "nas": window("rpc-server", 0.0, 2.0),
}
TIMINGS = {"prompt_ms": 0.0, "predicted_ms": 5000.0, "predicted_n": 20}
FACTS = {"head": FACT, "fast": FACT, "wifi": FACT, "nas": dict(FACT, cpu_quota=0.25)}


def test_the_served_plan_gives_a_left_out_worker_no_figure() -> None:
    """Why the measuring placement exists: the old profile measured through the served plan."""
    figures = figs.compute_figures(SERVED, SAMPLES, TIMINGS, FACTS, UNITS)
    assert "wifi" not in figures


def test_the_left_out_worker_gets_layers_from_the_head_and_everything_else_stays() -> None:
    m = meas.measuring_plan(SERVED, ["wifi"])
    layers = {h["name"]: h["layers"] for h in m["hosts"]}
    assert layers == {"head": [0, 4], "wifi": [4, 6], "fast": [6, 18], "nas": [18, 18]}
    assert [h["name"] for h in m["hosts"] if h.get("output_layer")] == ["nas"]
    args = m["llama_server_args"]
    assert args[args.index("--rpc") + 1] == "10.0.0.8:50052,10.0.0.7:50052,10.0.0.9:50052"
    assert args[args.index("--tensor-split") + 1] == "2,12,1"
    assert args[args.index("-ngl") + 1] == "15"
    # the split as llama.cpp assigns it: head CPU 0-3, wifi 4-5, fast 6-17, nas the output
    slots = assign_slots([2, 12, 1], 18, 15)
    assert slots == [-1] * 4 + [0] * 2 + [1] * 12 + [2]
    # --poll 0 once (the served plan's --poll 50 replaced), the other options kept
    assert args.count("--poll") == 1 and args[args.index("--poll") + 1] == "0"
    assert args[args.index("-c") + 1] == "4096" and "layer" in args
    assert m["workers"] == ["wifi", "fast", "nas"] and m["fallbacks"] == []
    assert m["measuring"]["added"] == ["wifi"]
    wifi = next(h for h in m["hosts"] if h["name"] == "wifi")
    assert wifi["endpoint"] == "10.0.0.8:50052" and wifi["threads"] == 1
    # 2 layers of the average 3.6 MiB (fast's 43.2 / 12); the head gives up as much
    assert wifi["predicted_mib"]["weights"] == pytest.approx(7.2)
    head = next(h for h in m["hosts"] if h["name"] == "head")
    assert head["predicted_mib"]["weights"] == pytest.approx(191.6 - 7.2)
    # the served plan itself is not changed
    assert SERVED["hosts"][0]["layers"] == [0, 6] and "measuring" not in SERVED


def test_one_request_through_it_measures_every_host() -> None:
    m = meas.measuring_plan(SERVED, ["wifi"])
    figures = figs.compute_figures(m, SAMPLES, TIMINGS, FACTS, UNITS)
    # wifi: 0.5 CPU s / 1 CPU = 500 ms / 20 tokens / 2 layers = 12.5 ms per layer
    assert figures["wifi"]["ms_per_layer"] == pytest.approx(12.5)
    # fast: 960 ms / 20 / 12 = 4.0
    assert figures["fast"]["ms_per_layer"] == pytest.approx(4.0)
    # head: 400 ms / 20 / 4 layers (not 6: two are on wifi now) = 5.0
    assert figures["head"]["ms_per_layer"] == pytest.approx(5.0)
    # nas: 2.0 / 0.25 = 8000 ms / 20 / (170 - 0) / 3.6 output equivalents
    assert figures["nas"]["layer_equivalents"] == pytest.approx(170.0 / 3.6, rel=1e-3)


def test_nothing_to_add_still_sleeps_instead_of_polling() -> None:
    m = meas.measuring_plan(SERVED, [])
    args = m["llama_server_args"]
    assert args[args.index("--tensor-split") + 1] == "12,1" and args[args.index("-ngl") + 1] == "13"
    assert args[-2:] == ["--poll", "0"] and args.count("--poll") == 1


def test_a_worker_without_an_address_is_named() -> None:
    with pytest.raises(prof.ProfileError, match="attic: not in the plan's planned_with"):
        meas.measuring_plan(SERVED, ["attic"])
    with pytest.raises(prof.ProfileError, match="fast: already in the plan"):
        meas.measuring_plan(SERVED, ["fast"])


def test_layers_come_from_the_largest_worker_when_the_head_has_none() -> None:
    served = dict(SERVED, hosts=[dict(SERVED["hosts"][0], layers=[0, 0]), *SERVED["hosts"][1:]])
    served["llama_server_args"] = [
        "--rpc",
        "10.0.0.7:50052,10.0.0.9:50052",
        "--tensor-split",
        "18,1",
        "-ngl",
        "19",
    ]
    served["hosts"][1] = dict(served["hosts"][1], layers=[0, 18], predicted_mib={"weights": 64.8})
    m = meas.measuring_plan(served, ["wifi"])
    layers = {h["name"]: h["layers"] for h in m["hosts"]}
    assert layers == {"head": [0, 0], "wifi": [0, 2], "fast": [2, 18], "nas": [18, 18]}
    assert m["llama_server_args"][3] == "2,16,1"


def test_every_worker_is_measured_at_one_rpc_server_thread() -> None:
    """A served worker at 4 threads and an added one with 2 CPUs: both measured at 1 thread
    (rpc-server has no --poll: more threads spin), the serving count kept beside it."""
    served = copy.deepcopy(SERVED)
    next(h for h in served["hosts"] if h["name"] == "fast")["threads"] = 4
    for h in served["planned_with"]["hosts"]:
        if h["name"] == "wifi":
            h["cpus"] = 2
    m = measuring_plan(served, ["wifi"])
    workers = {h["name"]: h for h in m["hosts"] if h["role"] == "worker"}
    assert {n: h["threads"] for n, h in workers.items()} == {"wifi": 1, "fast": 1, "nas": 1}
    assert workers["fast"]["serving_threads"] == 4 and workers["wifi"]["serving_threads"] == 2
    assert m["measuring"]["worker_threads"] == 1
    head = next(h for h in m["hosts"] if h["role"] == "head")
    assert "serving_threads" not in head


def workerless_plan() -> dict:
    """A plan whose head holds every layer and the output layer (no worker used)."""
    served = copy.deepcopy(SERVED)
    served["workers"] = []
    served["hosts"] = [dict(SERVED["hosts"][0], layers=[0, 18], output_layer=True)]
    served["llama_server_args"] = ["-ngl", "0", "-sm", "layer", "-c", "4096", "-np", "1"]
    return served


def test_a_workerless_plan_keeps_its_output_layer_on_the_head_when_a_worker_is_added() -> None:
    """The rows say the output layer stays on the head: the arguments must say so too (the
    override), not hand llama.cpp's output slot to the added worker (the old hand-built split
    did: -ngl 3 with no -ot put the output layer on wifi)."""
    m = measuring_plan(workerless_plan(), ["wifi"])
    assert [h["name"] for h in m["hosts"] if h.get("output_layer")] == ["head"]
    args = m["llama_server_args"]
    assert args[:6] == ["--rpc", "10.0.0.8:50052", "--tensor-split", "3", "-ngl", "3"]
    assert args[args.index("-ot") + 1] == r"^(output|token_embd)\.weight$=CPU"
    # nothing added: the plan's own -ngl 0 stays (the old split dropped it)
    assert measuring_plan(workerless_plan(), [])["llama_server_args"] == [
        *("-ngl", "0", "-c", "4096", "-np", "1", "--poll", "0")
    ]

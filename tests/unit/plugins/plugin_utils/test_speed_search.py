"""Place for speed (plugins/plugin_utils/speed_search.py): against brute force, the objective
choice, the reasons for hosts left out, the fallbacks and the plan time of a large fleet."""

import itertools
import json
import os
import sys
import time

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed as S
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed_search as SS
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import Placement
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Model,
    Options,
    PlacementError,
    hosts_from_dicts,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_search import _predict_all, place
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.plugins.plugin_utils.test_placement import host, layout

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
MODEL = {"name": "tiny", "file": "tiny.gguf"}


def fig(ms, rtt=None, mbit=None):
    return {"ms_per_layer": ms} if rtt is None else {"ms_per_layer": ms, "rtt_ms": rtt, "mbit_s": mbit}


def with_speed(d, **speed):
    return {**d, "speed": fig(**speed)}


def compositions(total, parts, last_may_be_empty):
    """Every split of ``total`` layers into ``parts`` contiguous counts (each >= 1, the last >= 0
    when it may hold the output alone)."""
    if parts == 0:
        if total == 0:
            yield ()
        return
    if parts == 1:
        if total >= 1 or (total == 0 and last_may_be_empty):
            yield (total,)
        return
    for first in range(1, total + 1):
        for rest in compositions(total - first, parts - 1, last_may_be_empty):
            yield (first, *rest)


def brute_force(model, head, workers, opts, figures):
    """The least predicted ms per token over every subset, order, output holder, head share and
    split that fits (placement.py's memory check), or None."""
    best = None
    n = model.n_layer
    outputs = {"head": [True], "worker": [False], "auto": [True, False]}[opts.output_layer]
    for size in range(len(workers) + 1):
        for combo in itertools.combinations(workers, size):
            for order in itertools.permutations(combo):
                for out in outputs if order else [True]:
                    for h in range(n + 1) if opts.head_layers else [0]:
                        for counts in compositions(n - h, len(order), not out):
                            head_out = out or not order
                            preds = _predict_all(model, head, list(order), h, list(counts), head_out, opts)
                            p = Placement(head, list(order), h, list(counts), head_out, preds)
                            if not p.fits():
                                continue
                            ms = S.estimate_placement(p, model, figures).ms_per_token
                            if best is None or ms < best:
                                best = ms
    return best


def assert_fastest_is_brute_force(model, head_d, ws_d, head_layers, output):
    """The search's placement fits and is as fast as the brute-force optimum (both refuse alike);
    returns (head, workers, options, figures, the search's placement)."""
    head, ws = hosts_from_dicts(head_d, ws_d, reserve_mib=4)
    opts = Options(context=256, head_layers=head_layers, output_layer=output)
    figures = S.figures_for(head_d, ws_d)
    expected = brute_force(model, head, ws, opts, figures)
    got = SS.fastest(model, head, ws, opts, figures)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.fits()
        assert S.estimate_placement(got, model, figures).ms_per_token == pytest.approx(expected, rel=1e-9)
    return head, ws, opts, figures, got


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n_layer=st.integers(2, 6),
    head_usable=st.integers(20, 90),
    workers=st.lists(
        st.tuples(
            st.integers(20, 90),
            st.sampled_from([0.5, 1.0, 2.0, 4.0]),
            st.sampled_from([0.2, 2.0, 20.0]),
            st.sampled_from([1.0, 10.0, 1000.0]),
        ),
        min_size=0,
        max_size=3,
    ),
    head_ms=st.sampled_from([0.5, 1.0, 3.0]),
    head_layers=st.booleans(),
    output=st.sampled_from(["auto", "worker", "head"]),
)
def test_the_speed_search_equals_brute_force(n_layer, head_usable, workers, head_ms, head_layers, output):
    lay = layout(n_layer=n_layer, layer_mib=10, embd_mib=5, out_mib=8)
    model = Model.from_layout(lay)
    head_d = with_speed(host("head", head_usable), ms=head_ms)
    ws_d = [
        with_speed(host(f"w{i}", u), ms=ms, rtt=rtt, mbit=mbit)
        for i, (u, ms, rtt, mbit) in enumerate(workers)
    ]
    head, ws, opts, figures, got = assert_fastest_is_brute_force(model, head_d, ws_d, head_layers, output)
    if got is None:
        return
    # and through the planner: never refused when the memory objective places, never slower than it
    try:
        memory = place(model, head, ws, opts)[0]
    except PlacementError:
        memory = None
    placer = SS.speed_placer(figures)
    chosen = placer(model, head, ws, opts)[0]
    assert chosen.fits()
    if memory is not None:
        mem_ms = S.estimate_placement(memory, model, figures).ms_per_token
        assert S.estimate_placement(chosen, model, figures).ms_per_token <= mem_ms + 1e-9


def uneven(**opts):
    """A head, a fast worker with little room, a slow NAS with the most room and a far laptop."""
    head = with_speed(host("head", 200), ms=1.0)
    ws = [
        with_speed(host("fast", 150, cpus=2), ms=1.0, rtt=0.5, mbit=1000.0),
        with_speed(host("nas", 600, cpus=8), ms=4.0, rtt=0.5, mbit=1000.0),
        with_speed(host("laptop", 150, cpus=4), ms=1.0, rtt=40.0, mbit=20.0),
    ]
    return SS.make_plan(layout(n_layer=12, layer_mib=20), MODEL, head, ws, {"context": 512, **opts}, 16)


def test_speed_leaves_the_slow_host_out_with_its_reason_and_memory_does_not():
    fast = uneven()
    assert fast["objective"] == "speed"
    assert "nas" not in fast["workers"] and "laptop" not in fast["workers"]
    reasons = {u["name"]: u["reason"] for u in fast["unused"]}
    assert reasons["nas"] == "4.0x slower per layer than head (4 vs 1 ms); the model fits without it"
    assert reasons["laptop"].startswith("its link would add 40.")
    slow = uneven(objective="memory")
    assert slow["objective"] == "memory" and slow["workers"] == ["nas"]  # the most CPUs, room for all
    assert slow["speed"]["ms_per_token"] > fast["speed"]["ms_per_token"]
    assert fast["speed"]["bottleneck"] and fast["speed"]["hosts"][0]["name"] == "head"


def test_auto_is_speed_only_when_every_candidate_has_figures():
    head = with_speed(host("head", 200), ms=1.0)
    a = with_speed(host("a", 300), ms=1.0, rtt=1.0, mbit=1000.0)
    b = host("b", 300)  # no figures
    lay = layout(n_layer=12, layer_mib=20)
    assert SS.make_plan(lay, MODEL, head, [a], {"context": 512}, 16)["objective"] == "speed"
    mixed = SS.make_plan(lay, MODEL, head, [a, b], {"context": 512}, 16)
    assert mixed["objective"] == "memory"
    with pytest.raises(ValueError, match="objective speed: host\\(s\\) b have no speed figures"):
        SS.make_plan(lay, MODEL, head, [a, b], {"context": 512, "objective": "speed"}, 16)
    with pytest.raises(ValueError, match="objective must be auto, speed or memory, got 'fast'"):
        SS.make_plan(lay, MODEL, head, [a], {"context": 512, "objective": "fast"}, 16)
    # the objective is an input: recorded in planned_with, so changing it re-plans
    assert mixed["planned_with"]["options"]["objective"] == "auto"


def test_fallbacks_one_per_used_worker_under_both_objectives():
    head = with_speed(host("head", 60), ms=1.0)
    ws = [with_speed(host(n, 100), ms=1.0 + i, rtt=1.0, mbit=1000.0) for i, n in enumerate("abcd")]
    opts = {"head_layers": False, "context": 512, "min_workers": 4}
    for objective in ("speed", "memory"):
        plan = SS.make_plan(
            layout(n_layer=8, layer_mib=10), MODEL, head, ws, {**opts, "objective": objective}, 8
        )
        used = plan["workers"]
        assert len(plan["fallbacks"]) == len(used) >= 2
        assert sorted(f["lost"] for f in plan["fallbacks"]) == sorted(used)
        for f in plan["fallbacks"]:
            assert f["workers"] == sorted(set(used) - {f["lost"]})


def test_the_plan_validates_and_shows_the_speed_terms():
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(ROOT, "docs", "plan.schema.json"), encoding="utf-8") as handle:
        schema = json.load(handle)
    plan = uneven()
    jsonschema.validate(json.loads(json.dumps(plan)), schema)
    memory = uneven(objective="memory")
    jsonschema.validate(json.loads(json.dumps(memory)), schema)
    assert memory["speed"] is not None  # figures present: the memory plan is predicted too


def test_a_64_host_fleet_plans_in_bounded_cpu_time():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import planner_scale
    finally:
        sys.path.pop(0)
    head, workers = planner_scale.fleet(64)
    start = time.process_time()
    plan = SS.make_plan(planner_scale.layout(), MODEL, head, workers, {"context": 2048}, 32)
    cpu = time.process_time() - start
    assert plan["objective"] == "speed" and len(plan["workers"]) >= 20
    assert len(plan["fallbacks"]) == len(plan["workers"])
    # the bench measures about 7 CPU s here; the bound is generous so that load cannot flake it
    assert cpu < 60, cpu


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n_layer=st.integers(2, 6),
    head_usable=st.integers(20, 90),
    workers=st.lists(
        st.tuples(
            st.integers(20, 90),
            st.sampled_from([0.25, 0.5, 1.0, 2.0]),
            st.sampled_from([None, 0.05, 0.25, 0.5]),
        ),
        min_size=0,
        max_size=3,
    ),
    head_quota=st.sampled_from([None, 0.1, 1.0]),
    head_layers=st.booleans(),
    output=st.sampled_from(["auto", "worker", "head"]),
)
def test_the_speed_search_equals_brute_force_under_cpu_quotas(
    n_layer, head_usable, workers, head_quota, head_layers, output
):
    """With quota'd hosts the time is max(the chain, each quota's cap): the search must still find
    the brute-force optimum (a search that minimises compute alone loads the quota'd host)."""
    lay = layout(n_layer=n_layer, layer_mib=10, embd_mib=5, out_mib=8)
    model = Model.from_layout(lay)

    def speed(ms, quota, **link):
        out = {"ms_per_layer": ms, **link}
        if quota is not None:
            out["cpu_quota"] = quota
        return out

    head_d = {**host("head", head_usable), "speed": speed(1.0, head_quota)}
    ws_d = [
        {**host(f"w{i}", u), "speed": speed(ms, q, rtt_ms=0.5, mbit_s=1000.0)}
        for i, (u, ms, q) in enumerate(workers)
    ]
    assert_fastest_is_brute_force(model, head_d, ws_d, head_layers, output)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n_layer=st.integers(2, 6),
    head_usable=st.integers(20, 90),
    workers=st.lists(
        st.tuples(
            st.integers(20, 90),
            st.sampled_from([0.5, 1.0, 2.0]),
            st.sampled_from([None, 0.25, 1.0]),
            st.sampled_from([None, 0.5, 6.0, 40.0]),
        ),
        min_size=0,
        max_size=3,
    ),
    head_output=st.sampled_from([None, 0.5, 6.0, 40.0]),
    token_ms=st.sampled_from([None, 3.0, 50.0]),
    head_layers=st.booleans(),
    output=st.sampled_from(["auto", "worker", "head"]),
)
def test_the_speed_search_equals_brute_force_with_measured_output_and_head_time(
    n_layer, head_usable, workers, head_output, token_ms, head_layers, output
):
    """Measured output layers (cheaper or dearer than their weight, under a quota too) and the
    head's per-token time: the search's bounds and caps must still find the brute-force optimum."""
    lay = layout(n_layer=n_layer, layer_mib=10, embd_mib=5, out_mib=8)
    model = Model.from_layout(lay)

    def speed(ms, quota=None, out=None, **more):
        given = {"ms_per_layer": ms, "cpu_quota": quota, "output_ms": out, **more}
        return {k: v for k, v in given.items() if v is not None}

    head_d = {**host("head", head_usable), "speed": speed(1.0, out=head_output, token_ms=token_ms)}
    ws_d = [
        {**host(f"w{i}", u), "speed": speed(ms, q, o, rtt_ms=0.5, mbit_s=1000.0)}
        for i, (u, ms, q, o) in enumerate(workers)
    ]
    assert_fastest_is_brute_force(model, head_d, ws_d, head_layers, output)


def test_a_measured_output_layer_moves_to_where_it_is_cheap():
    """By weight the output layer costs about a layer on either host; measured, it costs the head
    30 ms and fast 2 ms: the speed plan puts it on fast (its logits cost 0.03 ms over fast's link)."""
    lay = layout(n_layer=6, layer_mib=10, embd_mib=5, out_mib=8)
    head = {**host("head", 60), "speed": {"ms_per_layer": 1.0, "output_ms": 30.0, "token_ms": 5.0}}
    ws = [
        {
            **host("fast", 400),
            "speed": {"ms_per_layer": 1.0, "output_ms": 2.0, "rtt_ms": 0.1, "mbit_s": 10000.0},
        },
        {**host("slow", 400), "speed": {"ms_per_layer": 3.0, "rtt_ms": 0.1, "mbit_s": 10000.0}},
    ]
    plan = SS.make_plan(lay, MODEL, head, ws, {"context": 256, "objective": "speed"}, 4)
    rows = {h["name"]: h for h in plan["hosts"]}
    assert rows["fast"]["output_layer"] and plan["workers"] == ["fast"]
    # 6 layers x 1 + the output 2 + the head's 5 + the link (0.1 + a row + the logits)
    assert plan["speed"]["ms_per_token"] == pytest.approx(13.1, abs=0.1)
    assert plan["speed"]["token_ms"] == 5.0


def test_a_quota_that_binds_moves_layers_off_the_quota_d_host():
    """nas computes a layer in 0.5 ms (unthrottled) but has 0.1 CPU: k layers there cost 0.5k ms
    of CPU a token, so its quota caps the fleet at 5k ms per token. fast (1 ms a layer) has room
    for 8 of the 12 layers, so nas must hold 4 at least: 20 ms, 50 tokens/s. A search that
    minimises the unthrottled compute alone gives nas all it can hold (11 layers: 55 ms)."""
    lay = layout(n_layer=12, layer_mib=10, embd_mib=5, out_mib=8)
    head = {**host("head", 60), "speed": {"ms_per_layer": 1.0}}
    ws = [
        {**host("fast", 100), "speed": {"ms_per_layer": 1.0, "rtt_ms": 0.1, "mbit_s": 10000.0}},
        {
            **host("nas", 400),
            "speed": {"ms_per_layer": 0.5, "cpu_quota": 0.1, "rtt_ms": 0.1, "mbit_s": 10000.0},
        },
    ]
    opts = {"context": 256, "objective": "speed", "output_layer": "head"}
    plan = SS.make_plan(lay, MODEL, head, ws, opts, 4)
    counts = {h["name"]: h["layers"][1] - h["layers"][0] for h in plan["hosts"] if h.get("layers")}
    assert counts["nas"] == 4 and counts["fast"] == 8
    assert plan["speed"]["ms_per_token"] == pytest.approx(20.0)
    assert (
        plan["speed"]["bottleneck"]
        == "nas CPU quota 0.1: 2.0 ms of CPU per token caps the fleet at 50.0 tokens/s"
    )
    assert "bottleneck: " + plan["speed"]["bottleneck"] in plan["reasons"]

"""The placement math: llama.cpp's rule (against the independent emulation), the search
(against a brute-force oracle), the memory model and the plan's shape."""

import itertools
import json

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import MIB
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.memory_model import (
    head_compute_bytes,
    kv_bytes,
    pipelined,
    predict_head,
    predict_worker,
    worker_compute_bytes,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
    Model,
    Options,
    PlacementError,
    hosts_from_dicts,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_search import _memory_output_choices
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.split_rule import (
    assign_slots,
    tensor_split_for,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import llama_split


def layout(
    n_layer=8, layer_mib=10.0, embd_mib=5.0, out_mib=5.0, tied=False, swa_every=0, n_ff=512, largest_frac=0.3
):
    lb = int(layer_mib * MIB)
    return {
        "n_layer": n_layer,
        "n_embd": 256,
        "n_ff": n_ff,
        "n_vocab": 1000,
        "n_head_kv": [2] * n_layer,
        "head_dim_k": 64,
        "head_dim_v": 64,
        "sliding_window": 512 if swa_every else 0,
        "swa_layers": [bool(swa_every) and (il % swa_every) < swa_every - 1 for il in range(n_layer)],
        "layer_bytes": [lb] * n_layer,
        "layer_largest_tensor": [int(lb * largest_frac)] * n_layer,
        "token_embd_bytes": int(embd_mib * MIB),
        "output_bytes": int(embd_mib * MIB) if tied else int(out_mib * MIB),
        "output_norm_bytes": 1024,
        "other_bytes": 0,
        "tied_output": tied,
    }


def host(name, usable, cpus=2, port=50052):
    return {
        "name": name,
        "usable_mib": usable,
        "cpus": cpus,
        "address": f"10.0.0.{sum(map(ord, name)) % 200 + 2}",
        "port": port,
    }


# ---------------------------------------------------------------------------------------------
# llama.cpp's rule


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        # measured on llama.cpp with the tiny 8-layer model on 3 workers (facts file)
        ([1, 1, 6], [2, 1, 6]),
        ([6, 1, 1], [7, 1, 1]),
        ([0, 1, 1], [0, 5, 4]),
    ],
)
def test_rule_matches_measurements(split, expected):
    slots = assign_slots(split, 8, 99)
    assert [slots.count(i) for i in range(3)] == expected
    assert slots[8] == 2  # the output layer lands on the last device with a share
    assert llama_split.layer_counts(split, 8, 99)[1] == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.floats(min_value=0.0, max_value=1000.0, allow_nan=False, width=32), min_size=1, max_size=8
    ).filter(lambda xs: sum(xs) > 0),
    st.integers(min_value=1, max_value=200),
    st.integers(min_value=0, max_value=260),
)
def test_assign_slots_equals_independent_emulation(split, n_layer, ngl):
    ours = assign_slots(split, n_layer, ngl)
    theirs = llama_split.slot_devices(split, n_layer, ngl)
    assert ours == theirs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=16), st.integers(0, 40))
def test_tensor_split_round_trips_through_llama_cpp_rule(layers, head_layers):
    if sum(layers) + head_layers == 0:
        layers = [1]
    # the plan only emits splits where every worker but the last has layers
    layers = [max(c, 1) for c in layers[:-1]] + [layers[-1]]
    slots = list(layers)
    slots[-1] += 1
    n_layer = sum(layers) + head_layers
    ts = tensor_split_for(slots)
    cpu, per_device, out_dev = llama_split.layer_counts(
        llama_split.parse_tensor_split(ts), n_layer, n_layer + 1 - head_layers
    )
    assert cpu == head_layers
    assert per_device == slots
    assert out_dev == len(slots) - 1


# ---------------------------------------------------------------------------------------------
# The search against a brute-force oracle


def oracle_fits(model, head, workers, opts):
    """Is there ANY placement (worker subset, --rpc order, head layers, counts, output host)
    whose every host fits its budget? Exhaustive over small fleets."""
    n = model.n_layer

    def budget(h):
        return h.budget_mib * MIB

    out_choices = _memory_output_choices(opts)
    head_range = range(0, n + 1) if opts.head_layers else [0]
    for k in head_range:
        # no workers: everything on the head
        if k == n and predict_head(model, range(0, n), True, opts).total <= budget(head):
            return True
    for size in range(1, len(workers) + 1):
        for subset in itertools.combinations(workers, size):
            for order in itertools.permutations(subset):
                for out_on_head in out_choices:
                    for k in head_range:
                        pp = pipelined(size, k, out_on_head)
                        if predict_head(model, range(0, k), out_on_head, opts, pp).total > budget(head):
                            continue
                        rest = n - k
                        for cuts in itertools.combinations_with_replacement(range(rest + 1), size - 1):
                            bounds = [k, *[k + c for c in cuts], n]
                            ok = True
                            for i, w in enumerate(order):
                                last = i == size - 1
                                pred = predict_worker(
                                    model, range(bounds[i], bounds[i + 1]), last and not out_on_head, opts, pp
                                )
                                if pred.total > budget(w):
                                    ok = False
                                    break
                            if ok:
                                return True
    return False


fleet = st.lists(st.integers(min_value=20, max_value=160), min_size=0, max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_layer=st.integers(1, 7),
    layer_mib=st.floats(1.0, 30.0),
    embd_mib=st.floats(0.5, 60.0),
    tied=st.booleans(),
    swa=st.sampled_from([0, 2, 3]),
    head_mib=st.integers(60, 260),
    workers=fleet,
    head_layers=st.booleans(),
    output_layer=st.sampled_from(["worker", "head", "auto"]),
    context=st.sampled_from([256, 1024, 4096]),
)
def test_plan_is_exact_and_refuses_only_when_nothing_fits(
    n_layer, layer_mib, embd_mib, tied, swa, head_mib, workers, head_layers, output_layer, context
):
    lay = layout(n_layer, layer_mib, embd_mib, embd_mib * 0.7, tied, swa)
    opts = {"context": context, "head_layers": head_layers, "output_layer": output_layer}
    head = host("head", head_mib)
    ws = [host(f"w{i}", m) for i, m in enumerate(workers)]
    model = Model.from_layout(lay)
    h, wh = hosts_from_dicts(head, ws, 16)
    expected = oracle_fits(model, h, wh, Options(**opts))
    try:
        plan = P.plan_llama_cpp(lay, head, ws, opts, reserve_mib=16, fallbacks=False)
    except PlacementError as err:
        assert not expected, "refused although a placement fits"
        assert err.table
        return
    assert expected, "planned although the oracle finds nothing that fits"
    # every host within its usable memory minus its reserve
    for row in plan["hosts"]:
        assert row["predicted_mib"]["total"] <= row["usable_mib"] - row["reserve_mib"] + 0.01
        assert row["headroom_mib"] >= -0.01
    # the arguments, run through the independent emulation, give exactly the planned layers
    args = plan["llama_server_args"]
    cpu, per_device, out_dev = llama_split.from_args(args, n_layer)
    head_row, worker_rows = plan["hosts"][0], plan["hosts"][1:]
    planned = [r["layers"][1] - r["layers"][0] for r in worker_rows]
    if worker_rows:
        assert cpu == head_row["layers"][1] - head_row["layers"][0]
        slots = list(planned)
        slots[-1] += 1
        assert per_device == slots
        assert out_dev == len(worker_rows) - 1
        assert ("-ot" in args) == head_row["output_layer"]
        assert worker_rows[-1]["output_layer"] != head_row["output_layer"]
    else:
        assert head_row["layers"] == [0, n_layer] and head_row["output_layer"]
    # contiguous ranges covering every layer once, in --rpc order
    bounds = [r["layers"] for r in plan["hosts"]]
    assert bounds[0][0] == 0 and bounds[-1][1] == n_layer
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert sum(int(x) for x in plan["vllm"]["pp_layer_partition"].split(",")) == n_layer


def test_fewest_hosts_and_one_fallback_per_lost_worker():
    lay = layout(n_layer=12, layer_mib=20)
    head = host("head", 100)
    ws = [host("a", 150, cpus=4), host("b", 150, cpus=2), host("c", 150, cpus=1), host("d", 150, cpus=1)]
    plan = P.plan_llama_cpp(lay, head, ws, {"head_layers": False}, reserve_mib=16)
    # 240 MiB of layers + output: two 150 MiB workers are not enough, three are; fastest first
    assert plan["workers"] == ["a", "b", "c"] or sorted(plan["workers"]) == ["a", "b", "c"]
    assert [u["name"] for u in plan["unused"]] == ["d"]
    # one fallback per single lost worker (the rest, keyed by the set left), not one per subset
    assert len(plan["fallbacks"]) == len(plan["workers"]) == 3
    subsets = {(f["lost"], tuple(f["workers"])) for f in plan["fallbacks"]}
    assert subsets == {("c", ("a", "b")), ("b", ("a", "c")), ("a", ("b", "c"))}
    assert all(not f["ok"] and "missing" in f["reason"] for f in plan["fallbacks"])


def test_fallbacks_that_fit_carry_verified_arguments():
    lay = layout(n_layer=8, layer_mib=10)
    head = host("head", 60)
    ws = [host("a", 100), host("b", 100), host("c", 100)]
    # fewest hosts would use two workers; min_workers spreads over three so that any two still fit
    plan = P.plan_llama_cpp(
        lay, head, ws, {"head_layers": False, "context": 512, "min_workers": 3}, reserve_mib=8
    )
    assert len(plan["workers"]) == 3
    oks = [f for f in plan["fallbacks"] if f["ok"]]
    assert sorted(tuple(f["workers"]) for f in oks) == [("a", "b"), ("a", "c"), ("b", "c")]
    for f in oks:
        assert set(f["used_workers"]) <= set(f["workers"])
        _cpu, per_device, _unused = llama_split.from_args(f["llama_server_args"], 8)
        rows = f["hosts"][1:]
        assert per_device[:-1] == [r["layers"][1] - r["layers"][0] for r in rows][:-1]


def test_head_ram_is_used_first():
    lay = layout(n_layer=10, layer_mib=10)
    plan = P.plan_llama_cpp(lay, host("head", 400), [host("w", 400)], {}, reserve_mib=16)
    assert plan["workers"] == []
    assert plan["llama_server_args"][:2] == ["-ngl", "0"]
    plan = P.plan_llama_cpp(lay, host("head", 120), [host("w", 400)], {}, reserve_mib=16)
    head_row = plan["hosts"][0]
    assert head_row["layers"][1] > 0
    ngl = int(plan["llama_server_args"][plan["llama_server_args"].index("-ngl") + 1])
    assert ngl == 10 + 1 - head_row["layers"][1]


def test_output_layer_goes_where_the_room_is():
    # Gemma-like: the tied output layer dominates; the big worker must be last in --rpc
    lay = layout(n_layer=18, layer_mib=3.8, embd_mib=170, tied=True, swa_every=6, n_ff=2048)
    ws = [host("big", 480), host("s1", 130, cpus=4), host("s2", 130, cpus=4)]
    plan = P.plan_llama_cpp(lay, host("head", 300), ws, {"head_layers": False}, reserve_mib=16)
    assert plan["hosts"][-1]["name"] == "big" and plan["hosts"][-1]["output_layer"]
    assert any("output layer on big" in r for r in plan["reasons"])


def test_slow_link_keeps_output_on_head():
    lay = layout(n_layer=8, layer_mib=10, embd_mib=40)
    ws = [host("w", 200)]
    plan = P.plan_llama_cpp(
        lay, host("head", 200), ws, {"head_layers": False, "link_mbit": 100}, reserve_mib=16
    )
    assert plan["hosts"][0]["output_layer"] and "-ot" in plan["llama_server_args"]
    plan = P.plan_llama_cpp(lay, host("head", 200), ws, {"head_layers": False}, reserve_mib=16)
    assert plan["hosts"][1]["output_layer"] and "-ot" not in plan["llama_server_args"]


def test_refusal_names_missing_mib_per_host():
    lay = layout(n_layer=8, layer_mib=50)
    with pytest.raises(PlacementError) as err:
        P.plan_llama_cpp(
            lay, host("head", 100), [host("w1", 120), host("w2", 150)], {"head_layers": False}, reserve_mib=16
        )
    assert err.value.missing and all(v > 0 for v in err.value.missing.values())
    assert "missing" in str(err.value) and "w1" in str(err.value)
    assert {r["name"] for r in err.value.table} == {"head", "w1", "w2"}


def test_kv_cache_follows_llama_cpp_for_gemma_shape():
    # measured (llama.cpp 0c1e570, -np 1): Gemma 3 270M, 18 layers, 3 dense: KV 12 + 15 MiB at 4096
    lay = layout(n_layer=18, swa_every=6)
    lay.update({"n_head_kv": [1] * 18, "head_dim_k": 256, "head_dim_v": 256})
    model = Model.from_layout(lay)
    opts = Options(context=4096)
    full = [il for il in range(18) if not model.swa_layers[il]]
    swa = [il for il in range(18) if model.swa_layers[il]]
    assert sum(kv_bytes(model, range(il, il + 1), opts) for il in full) == 12 * MIB
    assert sum(kv_bytes(model, range(il, il + 1), opts) for il in swa) == 15 * MIB
    # -np 4: 4 streams of 1024 cells each for the sliding-window layers (measured 60 MiB)
    opts4 = Options(context=4096, parallel=4)
    assert sum(kv_bytes(model, range(il, il + 1), opts4) for il in swa) == 60 * MIB
    # q8_0 cache: 34/32 bytes per element instead of 2
    q8 = Options(context=4096, cache_type_k="q8_0", cache_type_v="q8_0")
    assert kv_bytes(model, range(5, 6), q8) == 4096 * 2 * 256 * 34 / 32


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="usable_mib"):
        P.plan_llama_cpp(layout(), {"name": "h"}, [], {})
    with pytest.raises(ValueError, match="unique"):
        P.plan_llama_cpp(layout(), host("h", 100), [host("h", 100)], {})
    with pytest.raises(ValueError, match="cache type"):
        P.plan_llama_cpp(layout(), host("h", 100), [], {"cache_type_k": "q3"})
    with pytest.raises(ValueError, match="layer_bytes"):
        P.plan_llama_cpp({**layout(), "layer_bytes": [1]}, host("h", 100), [], {})
    with pytest.raises(ValueError, match="llmfleet_host"):
        P.host_from_fact("w9", None)


# Buffer sizes llama.cpp 0c1e570 reported (-lv 4, MiB) in runs on this machine, with the
# shapes of the generated models and of Gemma 3 270M: (shape, context, parallel, devices,
# worker compute, head CPU compute).
MEASURED_COMPUTE = [
    ({"n_embd": 256, "n_ff": 512}, 512, 1, 1, 5.01, 1.51),
    ({"n_embd": 256, "n_ff": 512}, 2048, 1, 1, 6.51, 3.01),
    ({"n_embd": 256, "n_ff": 512}, 4096, 1, 1, 8.51, 5.01),
    ({"n_embd": 256, "n_ff": 512}, 2048, 2, 1, 5.51, 2.01),
    ({"n_embd": 256, "n_ff": 512}, 2048, 1, 3, 14.04, 10.55),
    ({"n_embd": 128, "n_ff": 384}, 2048, 1, 1, 5.01, 2.51),
    ({"n_embd": 192, "n_ff": 512}, 4096, 1, 1, 8.13, 4.76),
    ({"n_embd": 640, "n_ff": 2048, "swa": 512}, 1024, 1, 1, 18.52, 4.52),
    ({"n_embd": 640, "n_ff": 2048, "swa": 512}, 8192, 1, 1, 25.52, 11.52),
    ({"n_embd": 640, "n_ff": 2048, "swa": 512}, 4096, 4, 1, 18.52, 4.52),
    ({"n_embd": 640, "n_ff": 2048, "swa": 512}, 4096, 1, 2, 41.57, 26.33),
]


@pytest.mark.parametrize(("shape", "context", "parallel", "devices", "worker", "head"), MEASURED_COMPUTE)
def test_compute_model_against_llama_cpp_reports(shape, context, parallel, devices, worker, head):
    lay = layout(n_layer=6, swa_every=6 if shape.get("swa") else 0, n_ff=shape["n_ff"])
    lay["n_embd"] = shape["n_embd"]
    model = Model.from_layout(lay)
    opts = Options(context=context, parallel=parallel)
    pp = pipelined(devices, 0, False)
    got_worker = worker_compute_bytes(model, opts, pp) / MIB
    got_head = head_compute_bytes(model, opts, holds_layers=False, pp=pp) / MIB
    # never more than 5% below what llama.cpp allocates, at most 1 MiB above
    assert worker * 0.95 <= got_worker <= worker + 1.0
    assert head * 0.95 <= got_head <= head + 1.0


# ---------------------------------------------------------------------------------------------
# vLLM stages


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_layer=st.integers(min_value=2, max_value=64),
    usable=st.lists(st.integers(min_value=2000, max_value=64000), min_size=1, max_size=5),
)
def test_vllm_spread_covers_every_layer_once_in_proportion(n_layer, usable):
    lay = layout(n_layer=n_layer, layer_mib=1)
    head = host("head", usable[0])
    ws = [host(f"w{i}", u) for i, u in enumerate(usable[1:])]
    vllm = P.plan_llama_cpp(lay, head, ws, {"vllm_hosts": "all"}, reserve_mib=16)["vllm"]
    counts = [int(c) for c in vllm["pp_layer_partition"].split(",")]
    assert sum(counts) == n_layer
    assert all(c >= 1 for c in counts)
    assert vllm["pipeline_size"] == len(counts) == min(n_layer, len(usable))
    assert vllm["stages"][0] == "head"
    # a host with at least twice the memory of another never gets fewer layers
    budgets = dict(zip(["head", *[w["name"] for w in ws]], usable))
    by_host = dict(zip(vllm["stages"], counts))
    for a, b in itertools.permutations(by_host, 2):
        if budgets[a] >= 2 * budgets[b]:
            assert by_host[a] >= by_host[b], (by_host, budgets)


def test_vllm_spread_splits_equal_nodes_evenly_and_fewest_uses_one_stage():
    lay = layout(n_layer=26, layer_mib=30)
    head, ws = host("a", 30000), [host("b", 30000)]
    assert (
        P.plan_llama_cpp(lay, head, ws, {"vllm_hosts": "all"}, reserve_mib=16)["vllm"]["pp_layer_partition"]
        == "13,13"
    )
    assert P.plan_llama_cpp(lay, head, ws, {}, reserve_mib=16)["vllm"]["pp_layer_partition"] == "26"


# ---------------------------------------------------------------------------------------------
# A sticky plan: keep the previous plan while it was made from the same inputs and still fits

STICKY_MODEL = {"name": "m", "url": "http://mirror/m.gguf", "sha256": "ab" * 32}
STICKY_OPTS = {"head_layers": False, "context": 512, "min_workers": 3}


def sticky_fleet(head_mib=60.0, a=100.0, b=100.0, c=100.0):
    return host("head", head_mib), [host("a", a), host("b", b), host("c", c)]


def sticky_plan(**usable):
    lay = layout(n_layer=8, layer_mib=10)
    lay["file_bytes"] = 123456789
    head, ws = sticky_fleet(**usable)
    plan = P.make_plan(lay, STICKY_MODEL, head, ws, STICKY_OPTS, 8, "llama_cpp", "systemd")
    # what the role reads back from plan.json
    return lay, json.loads(json.dumps(plan))


def keep(previous, lay, head, ws, model=None, opts=None, reserve=8, target="systemd"):
    model = STICKY_MODEL if model is None else model
    opts = STICKY_OPTS if opts is None else opts
    return P.keep_previous(previous, lay, model, head, ws, opts, reserve, "llama_cpp", target)


def test_the_plan_records_the_inputs_it_was_made_from():
    _lay, plan = sticky_plan()
    recorded = plan["planned_with"]
    assert recorded["options"]["context"] == 512 and recorded["options"]["min_workers"] == 3
    assert recorded["reserve_mib"] == 8
    assert [(h["name"], h["role"], h["port"]) for h in recorded["hosts"]] == [
        ("head", "head", 50052),
        ("a", "worker", 50052),
        ("b", "worker", 50052),
        ("c", "worker", 50052),
    ]
    assert all("usable_mib" not in h for h in recorded["hosts"])  # measurements are not inputs


def test_the_worker_order_changes_neither_the_placement_nor_the_kept_plan():
    lay = layout(n_layer=8, layer_mib=10)
    lay["file_bytes"] = 123456789
    head = host("head", 60)
    ws = [host("a", 100, cpus=2), host("b", 130, cpus=4), host("c", 100, cpus=2), host("d", 90, cpus=1)]
    plans = [
        json.loads(
            json.dumps(P.make_plan(lay, STICKY_MODEL, head, order, STICKY_OPTS, 8, "llama_cpp", "systemd"))
        )
        for order in (ws, ws[::-1], [ws[2], ws[0], ws[3], ws[1]])
    ]
    # the same --rpc order and split whatever order the workers come in ...
    for plan in plans[1:]:
        assert plan["llama_server_args"] == plans[0]["llama_server_args"]
        assert plan["workers"] == plans[0]["workers"] and plan["hosts"] == plans[0]["hosts"]
    # ... planned_with records them in the order given (the role gives the inventory's) ...
    assert [h["name"] for h in plans[1]["planned_with"]["hosts"]] == ["head", "d", "c", "b", "a"]
    # ... and a plan recorded in another order stands for the same hosts (compared by name)
    verdict = keep(plans[1], lay, head, ws)
    assert verdict["keep"], verdict["reasons"]


def test_a_plan_that_still_fits_is_kept_when_memory_moves():
    lay, previous = sticky_plan()
    # every host measures a few MiB less on the second run: a fresh plan would differ ...
    head, ws = sticky_fleet(57, 97.5, 99, 96)
    fresh = P.make_plan(lay, STICKY_MODEL, head, ws, STICKY_OPTS, 8, "llama_cpp", "systemd")
    assert [r["usable_mib"] for r in fresh["hosts"]] != [r["usable_mib"] for r in previous["hosts"]]
    # ... but the previous one still fits every host, so it stands
    verdict = keep(previous, lay, head, ws)
    assert verdict["keep"], verdict["reasons"]
    assert "every host still fits" in verdict["reasons"][0]
    # the table shows the current measurements against the kept predictions
    rows = {r["name"]: r for r in verdict["hosts"]}
    for row in previous["hosts"]:
        now = rows[row["name"]]
        assert now["predicted_mib"] == row["predicted_mib"] and now["layers"] == row["layers"]
        assert now["headroom_mib"] == pytest.approx(
            now["usable_mib"] - 8 - row["predicted_mib"]["total"], abs=0.06
        )
    assert [rows[n]["usable_mib"] for n in ("head", "a", "b", "c")] == [57, 97.5, 99, 96]
    assert "97" in verdict["table"] or "98" in verdict["table"]


def test_a_host_that_shrank_below_its_prediction_forces_a_new_plan():
    lay, previous = sticky_plan()
    b_total = next(r for r in previous["hosts"] if r["name"] == "b")["predicted_mib"]["total"]
    # reserve 8: a kept plan may use up to 4 MiB of it; half a MiB more is too much
    head, ws = sticky_fleet(b=b_total + 4 - 0.5)
    verdict = keep(previous, lay, head, ws)
    assert not verdict["keep"]
    assert verdict["reasons"][0].startswith("a host shrank below its prediction: b needs")
    assert "4.5 MiB short" in verdict["reasons"][0]
    # exactly half the reserve left still stands; a fresh plan would need the whole reserve
    head, ws = sticky_fleet(b=b_total + 4)
    assert keep(previous, lay, head, ws)["keep"]
    # a host that shrank far below (the head measured 145 MiB less) re-plans
    head, ws = sticky_fleet(head_mib=10)
    assert not keep(previous, lay, head, ws)["keep"]


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"model": {**STICKY_MODEL, "sha256": "cd" * 32}}, "model sha256"),
        ({"model": {**STICKY_MODEL, "url": "http://mirror/other.gguf"}}, "model url"),
        ({"opts": {**STICKY_OPTS, "context": 1024}}, "option context 512 -> 1024"),
        ({"opts": {**STICKY_OPTS, "output_layer": "head"}}, "option output_layer 'auto' -> 'head'"),
        ({"opts": {**STICKY_OPTS, "cache_type_k": "q8_0"}}, "option cache_type_k"),
        ({"reserve": 16}, "reserve_mib 8.0 -> 16.0"),
        ({"target": "kubernetes"}, "target 'systemd' -> 'kubernetes'"),
        ({"port": 50099}, "b port 50052 -> 50099"),
        ({"address": "10.9.9.9"}, "b address"),
        ({"drop": "c"}, "host c is no longer a candidate"),
        ({"add": "d"}, "host d is a new candidate"),
        ({"bytes": 1}, "model bytes 123456789 -> 1"),
    ],
)
def test_changed_inputs_force_a_new_plan(change, expect):
    lay, previous = sticky_plan()
    head, ws = sticky_fleet()
    if "port" in change:
        ws[1]["port"] = change["port"]
    if "address" in change:
        ws[1]["address"] = change["address"]
    if "drop" in change:
        ws = [w for w in ws if w["name"] != change["drop"]]
    if "add" in change:
        ws.append(host(change["add"], 100))
    if "bytes" in change:
        lay = {**lay, "file_bytes": change["bytes"]}
    verdict = keep(
        previous,
        lay,
        head,
        ws,
        model=change.get("model", STICKY_MODEL),
        opts=change.get("opts", STICKY_OPTS),
        reserve=change.get("reserve", 8),
        target=change.get("target", "systemd"),
    )
    assert not verdict["keep"]
    assert verdict["reasons"][0].startswith("the inputs changed: ")
    assert expect in verdict["reasons"][0]


def test_no_usable_previous_plan_means_a_new_plan():
    lay, previous = sticky_plan()
    head, ws = sticky_fleet()
    assert keep(None, lay, head, ws)["reasons"] == ["no previous plan"]
    assert not keep({}, lay, head, ws)["keep"]
    assert not keep({**previous, "version": 1}, lay, head, ws)["keep"]
    older = {k: v for k, v in previous.items() if k != "planned_with"}
    verdict = keep(older, lay, head, ws)
    assert not verdict["keep"] and "does not record its inputs" in verdict["reasons"][0]

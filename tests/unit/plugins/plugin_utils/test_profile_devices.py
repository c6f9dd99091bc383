"""Each device priced by the profile (docs/profile.md, "Per device"): the pair of measuring
placements per device (measuring.device_pairs) and the figures made from their requests
(profile_figures.measured_devices), into profile.json."""

from __future__ import annotations

import copy

import jsonschema
import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import measuring as meas
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile as prof
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile_figures as figs
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan

from tests.unit.plugins.plugin_utils import test_plan
from tests.unit.plugins.plugin_utils.test_device_placement import check_split
from tests.unit.plugins.plugin_utils.test_profile import CPU_DEV, FACTS, GPU, NOW, SCHEMA, SHA, fact


@pytest.fixture(scope="module")
def gpu_plans() -> dict:
    """test_plan's plans of recorded GPU machines (its fixture's function)."""
    return test_plan.gpu_plans.__wrapped__()


def _layers(plan: dict) -> dict:
    return {
        h.name: [(d.name, d.layer_count, d.output_layer) for d in h.devices]
        for h in Plan.from_dict(plan).hosts
    }


def test_a_worker_gpu_is_measured_by_two_placements_that_move_only_its_layers(gpu_plans) -> None:
    """The NAS head and the RTX 3060 desktop offering Vulkan0 and its CPU: one pair, the same
    split but the desktop's 37 Vulkan0 layers on its CPU in the second; every other device keeps
    its layers, the output layer stays, and llama.cpp's rule gives each device what its row says."""
    pairs = meas.measuring_request(gpu_plans["worker"], request="devices")
    assert [p["measuring"]["device"] for p in pairs] == [
        {"host": "pc2", "device": "Vulkan0", "layers": 37, "on": "device"},
        {"host": "pc2", "device": "Vulkan0", "layers": 37, "on": "cpu"},
    ]
    on_device, on_cpu = (_layers(p) for p in pairs)
    assert on_device["pc2"] == [("Vulkan0", 37, False), ("CPU", 4, False)]
    assert on_cpu["pc2"] == [("Vulkan0", 0, False), ("CPU", 41, False)]
    assert on_device["nas"] == on_cpu["nas"]
    for p in pairs:
        check_split(p, 60)
        # the worker's rpc-server keeps serving both devices: --device still counts two
        args = p["llama_server_args"]
        assert args[args.index("--device") + 1] == "RPC0,RPC1"
        assert args[-2:] == ["--poll", "0"] and p["fallbacks"] == []
    args = pairs[1]["llama_server_args"]
    assert args[args.index("--tensor-split") + 1] == "0,42"


def test_a_head_gpu_keeps_the_output_layer_and_what_the_cpu_has_room_for(gpu_plans) -> None:
    """The desktop alone: its Vulkan0 holds 37 layers and the output layer; one layer stays with
    the output layer, and the CPU's room (its budget less its predicted total) caps how many move;
    where no layer fits (the head of two desktops) the device is named with the room, not measured."""
    alone = meas.measuring_request(gpu_plans["alone"], request="devices")
    moved = alone[0]["measuring"]["device"]["layers"]
    assert 1 <= moved < 37
    cpu, gpu = Plan.from_dict(alone[0]).hosts[0].devices
    room = cpu.budget_mib - cpu.predicted_mib["total"]
    # a layer moved off Vulkan0 takes what it took there: Vulkan0's weights and KV per layer
    per = (gpu.predicted_mib["weights"] + gpu.predicted_mib["kv"]) / 37
    assert moved == int(room // per)
    assert [d[1:] for d in _layers(alone[1])["head"]] == [(63 + moved, False), (37 - moved, True)]
    for p in alone:
        check_split(p, 100)
    two = meas.measuring_request(gpu_plans["two"], request="devices")
    assert two[0] == {
        "measuring": {
            "device": {
                "host": "head",
                "device": "Vulkan0",
                "reason": "not measured: head device Vulkan0: no layer of head can move between it and the"
                " CPU ([84, 37] layers, room 123.5 MiB)",
            }
        }
    }
    assert [p["measuring"]["device"]["on"] for p in two[1:]] == ["device", "cpu"]


def test_a_cpu_only_fleet_has_no_device_requests(gpu_plans) -> None:
    from tests.unit.plugins.plugin_utils.test_profile_measuring import SERVED

    assert meas.measuring_request(SERVED, request="devices") == []


def _req(on, ms_per_token, host="w1", layers=4, tokens=40):
    timings = {"predicted_n": tokens, "predicted_ms": ms_per_token * tokens} if ms_per_token else {}
    return {
        "plan": {"measuring": {"device": {"host": host, "device": "Vulkan0", "layers": layers, "on": on}}},
        "timings": timings,
    }


def test_each_device_is_priced_from_its_pair_or_named_with_why_not() -> None:
    """w1's GPU: 4 layers on it made a token 7.2 ms faster than on its CPU (2.0 ms a layer): 0.2 ms
    a layer. A pair whose request made no tokens, a host without a CPU figure, a noisy pair and a
    device the placements left out each give a reason naming the host and the device."""
    cpu = {"w1": {"ms_per_layer": 2.0}, "w2": {"reason": "not measured: w2: holds no layers"}}
    got = figs.measured_devices(
        [
            _req("device", 42.8),
            _req("cpu", 50.0),
            _req("device", 30.0, host="w2"),
            _req("cpu", 31.0, host="w2"),
            _req("device", 40.0, host="w3"),
            _req("cpu", None, host="w3"),
            _req("device", 10.0, host="w4"),
            _req("cpu", 50.0, host="w4"),
            {
                "plan": {
                    "measuring": {
                        "device": {"host": "w5", "device": "Vulkan0", "reason": "not measured: w5 ..."}
                    }
                },
                "timings": {},
            },
        ],
        dict(cpu, w3={"ms_per_layer": 2.0}, w4={"ms_per_layer": 2.0}),
    )
    assert got["w1"]["Vulkan0"]["ms_per_layer"] == pytest.approx(0.2)
    assert got["w1"]["Vulkan0"]["layers"] == 4
    assert got["w2"]["Vulkan0"] == {
        "reason": "not measured: w2 device Vulkan0: its host's CPU has no figure from this run"
    }
    assert got["w3"]["Vulkan0"] == {
        "reason": "not measured: w3 device Vulkan0: a request of its pair made too few tokens or none"
    }
    assert got["w4"]["Vulkan0"]["reason"].startswith(
        "not measured: w4 device Vulkan0: 4 layers on it made a token 40.000 ms faster"
    )
    assert got["w5"]["Vulkan0"] == {"reason": "not measured: w5 ..."}


def test_measured_devices_reach_profile_json_and_the_reasons_its_not_measured() -> None:
    facts = dict(FACTS, w1=dict(fact(), devices=[GPU, CPU_DEV]), w2=dict(fact(), devices=[GPU, CPU_DEV]))
    compute = {"w1": {"ms_per_layer": 2.0}, "w2": {"ms_per_layer": 2.0}}
    devices = figs.measured_devices(
        [
            _req("device", 42.8),
            _req("cpu", 50.0),
            _req("device", 42.8, host="w2"),
            _req("cpu", None, host="w2"),
        ],
        compute,
    )
    p = prof.build_profile(
        None, "b0c1e570", {"name": "m", "sha256": SHA}, facts, compute, {}, NOW, devices=devices
    )
    jsonschema.validate(p, SCHEMA)
    assert p["hosts"]["w1"]["devices"]["Vulkan0"]["ms_per_layer"] == pytest.approx(0.2)
    assert "devices" not in p["hosts"]["w2"]
    assert p["hosts"]["w2"]["not_measured"] == [
        "not measured: w2 device Vulkan0: a request of its pair made too few tokens or none"
    ]


def _samples(cpu_seconds: float, unit: str = "rpc-server") -> list:
    return [{"units": {unit: {"cpu_seconds": s}}} for s in (0.0, 1.0, 1.0 + cpu_seconds)]


def test_a_worker_cpu_figure_comes_from_its_pair_request_with_every_layer_on_its_cpu(gpu_plans) -> None:
    """pc2's rpc-server ran lavapipe's work for its Vulkan0 layers in the first request: its CPU
    figure is taken from the pair's CPU side, where Vulkan0 held none (0.82 CPU seconds, 90 % of
    the request decoding, 40 tokens, 41 layers at one thread), and its device priced on that."""
    units = {"head": "llama-server", "worker": "rpc-server"}
    pairs = meas.measuring_request(gpu_plans["worker"], request="devices")
    timings = {"prompt_ms": 100.0, "predicted_ms": 900.0, "predicted_n": 40}
    requests = [
        {"plan": pairs[0], "samples": {"pc2": _samples(5.0)}, "timings": dict(timings, predicted_ms=1200.0)},
        {"plan": pairs[1], "samples": {"pc2": _samples(0.82)}, "timings": timings},
    ]
    first = {
        "pc2": {"ms_per_layer": 3.7, "cpu_ms_per_layer": 3.7, "output_ms": 6.0},
        "nas": {"ms_per_layer": 1.0},
    }
    facts = {"pc2": {"cpus": 4, "cpu_quota": None}, "nas": {"cpus": 2}}
    got = figs.cpu_alone(requests, first, facts, units)
    expected = 0.82 * (900.0 / 1000.0) * 1000.0 / 40 / 41
    assert got["pc2"]["ms_per_layer"] == pytest.approx(expected, abs=1e-4)
    assert got["pc2"]["cpu_alone"] is True and got["pc2"]["output_ms"] == 6.0
    assert got["nas"] == first["nas"] and first["pc2"]["ms_per_layer"] == 3.7
    devices = figs.measured_devices(requests, got)
    # 37 layers on Vulkan0 made a token (1200 - 900) / 40 = 7.5 ms slower than on the CPU
    assert devices["pc2"]["Vulkan0"]["ms_per_layer"] == pytest.approx(expected + 7.5 / 37, abs=1e-4)
    # a pair whose CPU side kept device layers (the head's of two desktops: room for none) changes nothing
    assert figs.cpu_alone(requests[:1], first, facts, units) == first


def test_the_head_token_time_is_moved_by_what_pricing_per_device_changes(gpu_plans) -> None:
    """The head's token time was fitted with pc2's 41 layers at one figure, 3.0 ms (its CPU
    seconds, lavapipe's work in them); priced per device they cost 37 x 0.8 (Vulkan0) + 4 x 0.5
    (its CPU alone) = 31.6 ms: the head's token time gains the 91.4 ms difference, so the model
    still gives the first request its measured time. The NAS head is priced as it was."""
    first = meas.measuring_request(gpu_plans["worker"], request="devices")[0]
    fitted = {"nas": {"ms_per_layer": 1.0, "token_ms": 5.0}, "pc2": {"ms_per_layer": 3.0}}
    hosts = {"nas": fitted["nas"], "pc2": {"ms_per_layer": 0.5, "cpu_alone": True}}
    devices = {"pc2": {"Vulkan0": {"ms_per_layer": 0.8}}}
    assert figs.head_token_shift(first, fitted, hosts, devices) == pytest.approx(
        41 * 3.0 - 37 * 0.8 - 4 * 0.5
    )
    # a device without a figure is priced at its host's CPU figure: only the CPU change counts
    assert figs.head_token_shift(first, fitted, hosts, {}) == pytest.approx(41 * (3.0 - 0.5))
    # nothing priced anew: no shift
    assert figs.head_token_shift(first, fitted, fitted, {}) == 0.0


def test_a_device_whose_memory_is_the_host_ram_moves_all_its_layers(gpu_plans) -> None:
    """The head of two desktops had no CPU room for a layer of its Vulkan0; were that Vulkan0 uma
    (an APU's iGPU, lavapipe: plan.json's ``uma``), its layers are in the host's RAM already, so
    all 37 move to the CPU and its pair is measured."""
    import copy

    plan = copy.deepcopy(gpu_plans["two"])
    plan["hosts"][0]["devices"][1]["uma"] = True
    assert Plan.from_dict(plan).hosts[0].devices[1].uma
    pairs = meas.measuring_request(plan, request="devices")
    assert pairs[0]["measuring"]["device"] == {
        "host": "head",
        "device": "Vulkan0",
        "layers": 37,
        "on": "device",
    }
    assert [d[1] for d in _layers(pairs[1])["head"]] == [121, 0]


def test_a_lavapipe_device_says_so_in_the_plan() -> None:
    """The planner writes uma and cpu_driver on a device row where they hold (lavapipe: both), and
    a discrete GPU's row carries neither."""
    from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P

    from tests.support.host_trees import recorded_hosts
    from tests.unit.plugins.plugin_utils.test_plan import layout

    pc = hostinfo.probe(str(recorded_hosts() / "rtx3060-desktop"))
    nas = hostinfo.probe(str(recorded_hosts() / "celeron-nas"))
    lavapipe = {
        "name": "Vulkan0",
        "backend": "vulkan",
        "description": "llvmpipe (LLVM 15.0.6, 256 bits)",
        "type": "gpu",
        "memory_total_mib": 2048,
        "memory_free_mib": 2048,
        "uma": True,
    }
    cpu = [d for d in pc["devices"] if d["backend"] == "cpu"]
    lava = dict(pc, devices=[lavapipe, *cpu])
    model = {"name": "big", "url": "http://mirror/models/big.gguf", "sha256": "c" * 64}
    plan = P.make_plan(
        layout(n_layer=160, layer_mib=300),
        model,
        P.host_from_fact("head", nas),
        [P.host_from_fact("pc", pc, address="10.0.0.3"), P.host_from_fact("w", lava, address="10.0.0.2")],
    )
    rows = {(h["name"], d["name"]): d for h in plan["hosts"] for d in h["devices"]}
    assert rows[("w", "Vulkan0")]["uma"] is True and rows[("w", "Vulkan0")]["cpu_driver"] is True
    assert "uma" not in rows[("pc", "Vulkan0")] and "cpu_driver" not in rows[("pc", "Vulkan0")]
    assert "uma" not in rows[("w", "CPU")]


def test_all_is_the_separate_calls_made_from_one_measuring_plan(gpu_plans, monkeypatch) -> None:
    """request='all' (the profile role's one call, issue #29) gives what requests 1-3 (padded
    with {}) and 'devices' give one by one, on the RTX 3060 worker's plan: request 2 moves the
    output layer to pc2, and Vulkan0 is priced by a pair. The measuring plan and its placements
    are made once (the separate calls made each four times)."""
    plan, quotas = gpu_plans["worker"], {"pc2": 0.25}
    separate = {
        "requests": [meas.measuring_request(plan, request=r, quotas=quotas) for r in (1, 2, 3)],
        "devices": meas.measuring_request(plan, request="devices", quotas=quotas),
    }
    assert separate["requests"][1]["measuring"]["output_moved_to"] == "pc2"
    assert separate["requests"][2] == {}
    assert [p["measuring"]["device"]["on"] for p in separate["devices"]] == ["device", "cpu"]
    calls = {"measuring_plan": 0, "measuring_placements": 0}

    def counting(name):
        real = getattr(meas, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return counted

    for name in calls:
        monkeypatch.setattr(meas, name, counting(name))
    assert meas.measuring_request(plan, request="all", quotas=quotas) == separate
    assert calls == {"measuring_plan": 1, "measuring_placements": 1}
    # profile_output_apart: false serves the measuring plan alone; profile_devices: false no pair
    alone = meas.measuring_request(plan, request="all", quotas=quotas, output_apart=False, devices=False)
    assert calls == {"measuring_plan": 2, "measuring_placements": 1}
    assert alone == {"requests": [meas.measuring_request(plan, request=0), {}, {}], "devices": []}
    apart = meas.measuring_request(plan, request="all", quotas=quotas, output_apart=False)
    assert apart["devices"] == separate["devices"]
    assert apart["requests"][0]["measuring"] == alone["requests"][0]["measuring"]


def test_devices_that_moved_their_layers_are_also_emptied_at_once(gpu_plans) -> None:
    """The head of two desktops with a uma Vulkan0 and pc2's Vulkan0 each move their 37 layers:
    after their two pairs, one more placement has both emptied at once (each host's split its
    pair's CPU side), named by ``measuring.devices_on_cpu``; a fleet with one such device (the
    NAS head and pc2) gets none, its pair's CPU side is that placement already."""
    import copy

    plan = copy.deepcopy(gpu_plans["two"])
    plan["hosts"][0]["devices"][1]["uma"] = True
    got = meas.measuring_request(plan, request="devices")
    assert len(got) == 5
    last = got[-1]
    assert "device" not in last["measuring"]
    assert last["measuring"]["devices_on_cpu"] == [
        {"host": "head", "device": "Vulkan0", "layers": 37},
        {"host": "pc2", "device": "Vulkan0", "layers": 37},
    ]
    assert _layers(last)["head"] == _layers(got[1])["head"]
    assert _layers(last)["pc2"] == _layers(got[3])["pc2"]
    assert [d[1] for d in _layers(last)["head"]] == [121, 0]
    assert [d[1] for d in _layers(last)["pc2"]] == [0, 79]
    check_split(last, 200)
    assert last["llama_server_args"][-2:] == ["--poll", "0"] and last["fallbacks"] == []
    assert len(meas.measuring_request(gpu_plans["worker"], request="devices")) == 2


def _pair(host, on_device, on_cpu, layers=3):
    return [
        {
            "plan": {
                "measuring": {"device": {"host": host, "device": "Vulkan0", "layers": layers, "on": on}}
            },
            "timings": {"predicted_n": 40, "predicted_ms": ms * 40},
        }
        for on, ms in (("device", on_device), ("cpu", on_cpu))
    ]


def test_what_devices_cost_together_beyond_their_pairs_is_spread_over_their_layers() -> None:
    """demo-gpu's figures (2026-12-05, the machine alone): both lavapipe devices in use 134 ms a
    token, the head's emptied 99, w1's emptied 94, both emptied 35. The pairs say 35 and 40 ms;
    together they cost 24 ms more, 4 ms on each of their 6 layers, so that the model gives the
    placement with both (134) and with none (35) their measured times."""
    cpu = {"head": {"ms_per_layer": 0.5}, "w1": {"ms_per_layer": 0.4}}
    emptied = {
        "plan": {
            "measuring": {
                "devices_on_cpu": [
                    {"host": "head", "device": "Vulkan0", "layers": 3},
                    {"host": "w1", "device": "Vulkan0", "layers": 3},
                ]
            }
        },
        "timings": {"predicted_n": 40, "predicted_ms": 35.0 * 40},
    }
    requests = _pair("head", 134.0, 99.0) + _pair("w1", 134.0, 94.0) + [emptied]
    pairs = figs.measured_devices(requests, cpu)
    assert pairs["head"]["Vulkan0"]["ms_per_layer"] == pytest.approx(0.5 + 35.0 / 3, abs=1e-4)
    got = figs.devices_together(requests, pairs)
    assert got["head"]["Vulkan0"]["ms_per_layer"] == pytest.approx(0.5 + 35.0 / 3 + 4.0, abs=1e-4)
    assert got["w1"]["Vulkan0"]["ms_per_layer"] == pytest.approx(0.4 + 40.0 / 3 + 4.0, abs=1e-4)
    assert got["w1"]["Vulkan0"]["together_ms"] == pytest.approx(24.0)
    assert got["w1"]["Vulkan0"]["pair_ms_per_layer"] == pairs["w1"]["Vulkan0"]["ms_per_layer"]
    # both devices' 6 layers moved to the CPUs: the model's difference is the measured 134 - 35
    moved = sum(3 * (got[h]["Vulkan0"]["ms_per_layer"] - cpu[h]["ms_per_layer"]) for h in ("head", "w1"))
    assert moved == pytest.approx(134.0 - 35.0, abs=1e-3)
    # without the emptied request, or with a device of it unpriced, the pairs' figures stay
    assert figs.devices_together(requests[:4], pairs) == pairs
    unpriced = dict(pairs, w1={"Vulkan0": {"reason": "not measured: w1 device Vulkan0: noisy"}})
    assert figs.devices_together(requests, unpriced) == unpriced
    # a saving together larger than a device's own price is left out, not priced below zero
    cheap = [*requests[:4], dict(emptied, timings={"predicted_n": 40, "predicted_ms": 133.0 * 40})]
    assert figs.devices_together(cheap, pairs) == pairs


def test_the_head_token_time_is_what_the_placement_without_devices_left(gpu_plans) -> None:
    """The NAS head and pc2 (one Vulkan0 that moved its 37 layers): its pair's CPU side uses no
    device, so it is the request the head's token time comes from: 40 tokens at 80 ms, less the
    model's terms of that placement (the NAS's 19 layers at 1.0 ms, pc2's 41 at 0.5, the output
    layer on the head at 6.0 ms and pc2's link) leave the head's own time. The fitted token time
    is kept as token_ms_fitted; one that would be zero or below is left out."""
    pairs = meas.measuring_request(gpu_plans["worker"], request="devices")
    assert "devices_on_cpu" not in pairs[0]["measuring"]
    assert pairs[1]["measuring"]["devices_on_cpu"] == [{"host": "pc2", "device": "Vulkan0", "layers": 37}]
    served = Plan.from_dict(pairs[1])
    head_layers = served.head.layer_count
    assert served.head.output_layer and head_layers + 41 == 60
    hosts = {
        "nas": {"ms_per_layer": 1.0, "output_ms": 6.0, "token_ms": 30.0},
        "pc2": {"ms_per_layer": 0.5},
    }
    links = {"pc2": {"rtt_ms": 1.0, "mbit_s": 1000.0}}
    timings = {"predicted_n": 40, "predicted_ms": 80.0 * 40}
    got = figs.head_token_from_none([{"plan": pairs[1], "timings": timings}], hosts, links)
    est = figs.predict_request(
        pairs[1], {"nas": {"ms_per_layer": 1.0, "output_ms": 6.0}, "pc2": dict(hosts["pc2"], **links["pc2"])}
    )
    assert got == pytest.approx(80.0 - est.chain_ms)
    # its layers, its output layer, pc2's layers, pc2's round trip (and a little of transfer)
    assert 80.0 - got == pytest.approx(head_layers * 1.0 + 6.0 + 41 * 0.5 + 1.0, abs=0.1)
    # the pair's device side uses Vulkan0, and a request without the mark is not read
    assert figs.head_token_from_none([{"plan": pairs[0], "timings": timings}], hosts, links) is None
    # a request whose device still holds a layer is not the placement without devices
    held = copy.deepcopy(pairs[1])
    held["hosts"][1]["devices"][0]["layers"] = [19, 20]
    held["hosts"][1]["devices"][1]["layers"] = [20, 60]
    assert figs.head_token_from_none([{"plan": held, "timings": timings}], hosts, links) is None
    # a request faster than the model's other terms of it leaves less than nothing (profile_from_run
    # then writes no token_ms)
    assert (
        figs.head_token_from_none(
            [{"plan": pairs[1], "timings": {"predicted_n": 40, "predicted_ms": 10.0 * 40}}], hosts, links
        )
        < 0
    )

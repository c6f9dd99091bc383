"""Speed per device: the time model over devices and the speed search among them (device_speed.py),
on what-if fleets of recorded machines (tests/fixtures/hosts)."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed as S
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed_search
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import DEVICE_SPEED_DEFAULTS

from tests.support.host_trees import recorded_hosts
from tests.unit.plugins.plugin_utils.test_placement import host, layout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
MODEL = {"name": "big", "url": "http://mirror/models/big.gguf", "sha256": "c" * 64}
DESKTOP, LAPTOP, NAS, LAVAPIPE = "rtx3060-desktop", "ryzen7840u-laptop", "celeron-nas", "lavapipe-container"
LINK = {"rtt_ms": 1.0, "mbit_s": 1000.0}


@pytest.fixture(scope="module")
def facts() -> dict:
    root = recorded_hosts()
    return {n: hostinfo.probe(str(root / n)) for n in (DESKTOP, LAPTOP, NAS, LAVAPIPE)}


def layers_on(plan) -> dict:
    """(host, device) -> its layer count, every device of the plan."""
    return {
        (h["name"], d["name"]): d["layers"][1] - d["layers"][0] for h in plan["hosts"] for d in h["devices"]
    }


def validate(plan) -> None:
    with open(os.path.join(ROOT, "docs", "plan.schema.json"), encoding="utf-8") as handle:
        jsonschema.validate(json.loads(json.dumps(plan)), json.load(handle))


def gpu_fleet(facts, igpu_ms=2.0):
    """Desktop head (RTX 3060 measured 0.1 ms a layer, its CPU 1.0), the APU laptop (its iGPU
    measured ``igpu_ms``, its CPU 4.0) and the CPU NAS (8.0)."""
    head = P.host_from_fact(DESKTOP, facts[DESKTOP])
    laptop = P.host_from_fact(LAPTOP, facts[LAPTOP], address="10.0.0.2")
    nas = P.host_from_fact(NAS, facts[NAS], address="10.0.0.3")
    head["speed"] = {"ms_per_layer": 1.0, "devices": {"Vulkan0": {"ms_per_layer": 0.1}}}
    laptop["speed"] = {"ms_per_layer": 4.0, **LINK, "devices": {"Vulkan0": {"ms_per_layer": igpu_ms}}}
    nas["speed"] = {"ms_per_layer": 8.0, **LINK}
    return head, [laptop, nas]


def plan_both(lay, head, workers, **options):
    return [
        speed_search.make_plan(lay, MODEL, head, workers, {"objective": objective, **options})
        for objective in ("memory", "speed")
    ]


def test_a_slow_igpu_gets_fewer_layers_under_speed_and_the_plan_is_faster(facts) -> None:
    """160 x 300 MiB: the memory plan fills every GPU first (the iGPU 53 layers, then the head's
    RAM); the speed plan fills the cheapest first (the 3060, then the desktop's CPU at 1.0 ms, then
    the iGPU at 2.0) and is predicted faster. Today's code plans the GPU fleet for memory."""
    head, ws = gpu_fleet(facts)
    memory, speed = plan_both(layout(n_layer=160, layer_mib=300), head, ws)
    mem, fast = layers_on(memory), layers_on(speed)
    assert speed["objective"] == "speed" and memory["objective"] == "memory"
    assert mem[(LAPTOP, "Vulkan0")] == 53 and mem[(DESKTOP, "CPU")] == 70
    assert fast[(LAPTOP, "Vulkan0")] < mem[(LAPTOP, "Vulkan0")]
    assert fast[(DESKTOP, "Vulkan0")] == mem[(DESKTOP, "Vulkan0")] == 37  # the fast GPU stays full
    assert fast[(DESKTOP, "CPU")] > mem[(DESKTOP, "CPU")]
    assert speed["speed"]["tokens_per_second"] > memory["speed"]["tokens_per_second"]
    # the prediction is over devices: each device's layers at its own cost
    by_host = {h["name"]: h for h in speed["speed"]["hosts"]}
    igpu = next(d for d in by_host[LAPTOP]["devices"] if d["name"] == "Vulkan0")
    assert (igpu["ms_per_layer"], igpu["priced"]) == (2.0, "measured")
    assert by_host[LAPTOP]["compute_ms"] == pytest.approx(
        sum(d["compute_ms"] for d in by_host[LAPTOP]["devices"])
    )
    # one link per worker used, none between the head's own devices
    assert [link["name"] for link in speed["speed"]["links"]] == [LAPTOP]
    assert not any("does not price devices" in w for w in speed["warnings"])
    assert any(r.startswith("objective speed: predicted") for r in speed["reasons"])
    validate(speed)
    validate(memory)


def test_the_chain_adds_each_hosts_devices_and_one_link_per_worker(facts) -> None:
    """The estimate of the memory plan above, term by term."""
    head, ws = gpu_fleet(facts)
    memory, _speed = plan_both(layout(n_layer=160, layer_mib=300), head, ws)
    est = memory["speed"]
    # desktop: 70 CPU layers at 1.0, 37 GPU layers at 0.1; laptop: 53 iGPU layers at 2.0 + the
    # output layer (by weight: 1 layer) on its iGPU; the laptop's link with the logits
    link = est["links"][0]
    assert est["hosts"][0]["compute_ms"] == pytest.approx(70 * 1.0 + 37 * 0.1, abs=1e-3)
    assert est["hosts"][1]["compute_ms"] == pytest.approx(53 * 2.0 + 2.0, abs=1e-3)
    assert est["chain_ms"] == pytest.approx(70 + 3.7 + 108 + link["total_ms"], abs=1e-2)
    assert link["logits_ms"] > 0  # the laptop holds the output layer: it sends the logits


def test_a_device_slower_than_its_hosts_cpu_gets_fewer_layers(facts) -> None:
    """A measured iGPU slower than its own host's CPU (6.0 ms against 4.0): the memory plan fills it
    first; the speed plan gives the laptop's CPU its layers first."""
    head, ws = gpu_fleet(facts, igpu_ms=6.0)
    memory, speed = plan_both(layout(n_layer=160, layer_mib=300), head, ws)
    mem, fast = layers_on(memory), layers_on(speed)
    assert fast.get((LAPTOP, "Vulkan0"), 0) < mem[(LAPTOP, "Vulkan0")]
    assert fast.get((LAPTOP, "CPU"), 0) > mem.get((LAPTOP, "CPU"), 0)
    assert speed["speed"]["tokens_per_second"] > memory["speed"]["tokens_per_second"]


def test_lavapipe_is_priced_slower_than_the_cpu_and_the_plan_says_it_is_assumed(facts) -> None:
    """A worker offering lavapipe (a Vulkan driver on the CPU) beside its CPU, no figure for the
    device: it is assumed DEVICE_SPEED_DEFAULTS['cpu_driver'] x its CPU, so the speed plan keeps
    its layers on the CPU backend where the memory plan puts them on lavapipe first."""
    head = host("head", 400)
    worker = P.host_from_fact(LAVAPIPE, facts[LAVAPIPE], address="10.0.0.9")
    head["speed"] = {"ms_per_layer": 1.0}
    worker["speed"] = {"ms_per_layer": 1.0, **LINK}
    memory, speed = plan_both(layout(n_layer=16, layer_mib=40), head, [worker])
    mem, fast = layers_on(memory), layers_on(speed)
    assert mem[(LAVAPIPE, "Vulkan0")] > 0
    assert fast.get((LAVAPIPE, "Vulkan0"), 0) < mem[(LAVAPIPE, "Vulkan0")]
    assert speed["speed"]["tokens_per_second"] > memory["speed"]["tokens_per_second"]
    (line,) = [w for w in memory["warnings"] if "no measured speed figure" in w]
    factor = DEVICE_SPEED_DEFAULTS["cpu_driver"]
    assert line.startswith(f"{LAVAPIPE} Vulkan0: no measured speed figure, priced at {factor:g}x")
    validate(speed)


def test_device_costs_measured_host_cpu_or_assumed_per_kind() -> None:
    fig = S.figures_of(
        {"name": "w", "speed": {"ms_per_layer": 2.0, **LINK, "devices": {"CUDA1": {"ms_per_layer": 0.3}}}},
        "worker",
    )
    assert S.device_cost(fig, "CPU", "cpu", "cpu").priced == "host CPU"
    assert S.device_cost(fig, "CUDA1", "cuda", "gpu").ms_per_layer == 0.3
    cuda0 = S.device_cost(fig, "CUDA0", "cuda", "gpu")
    assert cuda0.assumed and cuda0.ms_per_layer == pytest.approx(2.0 * DEVICE_SPEED_DEFAULTS["cuda"])
    assert S.device_cost(fig, "Vulkan0", "vulkan", "igpu").ms_per_layer == pytest.approx(
        2.0 * DEVICE_SPEED_DEFAULTS["igpu"]
    )
    lava = S.device_cost(fig, "Vulkan0", "vulkan", "gpu", cpu_driver=True)
    assert lava.on_cpu and lava.ms_per_layer > fig.ms_per_layer


@pytest.mark.parametrize(
    "devices, message",
    [
        ([], "speed.devices must map a device name"),
        ({"Vulkan0": 1.0}, "speed.devices.Vulkan0 must be"),
        (
            {"Vulkan0": {"ms_per_layer": 0}},
            "host w device Vulkan0: speed.ms_per_layer must be a finite number > 0",
        ),
        ({"Vulkan0": {"ms_per_layer": 1.0, "tflops": 9}}, "speed.devices.Vulkan0 has unknown keys tflops"),
    ],
)
def test_bad_device_figures_are_refused_naming_the_host_and_device(devices, message) -> None:
    with pytest.raises(ValueError, match=message):
        S.figures_of({"name": "w", "speed": {"ms_per_layer": 1.0, **LINK, "devices": devices}}, "worker")


def test_a_fast_gpu_keeps_the_model_and_the_fallbacks_are_device_plans(facts) -> None:
    """40 x 300 MiB fits the desktop alone: the speed plan uses no worker (their links and slower
    devices cost more); 185 layers need every host, and each fallback is a device plan."""
    head, ws = gpu_fleet(facts)
    plan = speed_search.make_plan(layout(n_layer=40, layer_mib=300), MODEL, head, ws, {"objective": "speed"})
    assert [h["name"] for h in plan["hosts"]] == [DESKTOP]
    assert {u["name"] for u in plan["unused"]} == {LAPTOP, NAS}
    big = speed_search.make_plan(layout(n_layer=185, layer_mib=300), MODEL, head, ws, {"objective": "speed"})
    assert {h["name"] for h in big["hosts"]} == {DESKTOP, LAPTOP, NAS}
    # the output layer on the cheapest device that can hold it: the head's CPU (1.0 ms, with -ot)
    assert big["hosts"][0]["devices"][0]["name"] == "CPU" and big["hosts"][0]["devices"][0]["output_layer"]
    assert len(big["fallbacks"]) == 2 and all(
        "devices" in h for f in big["fallbacks"] if f["ok"] for h in f["hosts"]
    )
    validate(big)


def test_a_host_placer_is_refused_on_a_gpu_fleet(facts) -> None:
    head, ws = gpu_fleet(facts)
    with pytest.raises(ValueError, match="this fleet has GPUs"):
        P.plan_llama_cpp(layout(n_layer=40, layer_mib=300), head, ws, placer=P.memory_placer)


def _compositions(n, k):
    if k == 1:
        yield (n,)
        return
    for i in range(n + 1):
        for rest in _compositions(n - i, k - 1):
            yield (i, *rest)


def _small_gpu_fleet(rng):
    """A head and 1-2 workers of 60-150 MiB, each maybe with a GPU of ~20-70 MiB (some iGPUs),
    random measured costs: a few layers of 10 MiB must be spread."""

    def gpu(uma):
        free = 60 if uma else rng.choice([600, 620, 650])
        return {
            "name": "Vulkan0",
            "backend": "vulkan",
            "description": "g",
            "type": "igpu" if uma else "gpu",
        } | {
            "memory_total_mib": free,
            "memory_free_mib": free,
            "uma": uma,
        }

    head = host("head", rng.choice([60, 90, 150]))
    head["speed"] = {"ms_per_layer": rng.uniform(0.5, 4)}
    if rng.random() < 0.5:
        head.update(devices=[gpu(False)], gpu_reserve_mib=580)
        head["speed"]["devices"] = {"Vulkan0": {"ms_per_layer": rng.uniform(0.1, 6)}}
    workers = []
    for k in range(rng.randint(1, 2)):
        w = host(f"w{k}", rng.choice([60, 90, 150]))
        w["speed"] = {"ms_per_layer": rng.uniform(0.5, 4), "rtt_ms": rng.uniform(0.1, 3), "mbit_s": 1000.0}
        if rng.random() < 0.7:
            w.update(devices=[gpu(rng.random() < 0.3)], gpu_reserve_mib=580)
            w["speed"]["devices"] = {"Vulkan0": {"ms_per_layer": rng.uniform(0.1, 6)}}
        workers.append(w)
    return head, workers


def test_the_device_search_equals_a_brute_force_on_small_fleets() -> None:
    """Against every worker set, --rpc order, output holder and count per device (the exact
    memory model deciding what fits) on 60 random small fleets (a fixed seed): the same time.
    The search is a heuristic (docs/planner.md, "Speed per device"); by a script run once it
    matched 654 of 658 such fleets over three seeds, the misses up to 19 % slower."""
    import dataclasses
    import itertools
    import random

    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_placement import device_placer_for
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_speed import DeviceSpeedPlacer
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import (
        Model,
        Options,
        hosts_from_dicts,
    )

    rng = random.Random(3)
    compared = 0
    for _trial in range(60):
        n = rng.randint(3, 6)
        head, workers = _small_gpu_fleet(rng)
        placer = device_placer_for(head, workers)
        if placer is None:
            continue
        model, opts = Model.from_layout(layout(n_layer=n, layer_mib=10)), Options(context=512)
        hh, wh = hosts_from_dicts(head, workers, 8)
        figures = S.figures_for(head, workers)
        searched = DeviceSpeedPlacer(placer, figures)
        got, _reasons, _left = searched(model, hh, wh, opts)
        got_ms = S.estimate_devices(model, got, figures).ms_per_token
        best = None
        for size in range(len(wh) + 1):
            for order in itertools.permutations(wh, size):
                keys = [(d.host, d.name) for h in [hh, *order] for d in placer.devs(h)]
                for out in ("head", "worker"):
                    o = dataclasses.replace(opts, output_layer=out)
                    for counts in _compositions(n, len(keys)):
                        p = placer.place(model, hh, list(order), o, counts=dict(zip(keys, counts)))
                        ms = searched._ms(model, p)
                        best = ms if best is None else min(best, ms)
        compared += 1
        assert got_ms == pytest.approx(best, rel=1e-9), (head, workers)
    assert compared >= 30


def test_a_cpu_quota_caps_the_devices_that_run_on_the_cpu_only(facts) -> None:
    """A quota'd laptop: its cap counts its CPU's layers, not its GPU's (the memory plan puts its
    layers on the iGPU alone: no cap; the speed plan moves some to its CPU: capped)."""
    head, ws = gpu_fleet(facts, igpu_ms=6.0)
    ws[0]["speed"].update(cpu_quota=0.5, cpu_ms_per_layer=4.0)
    memory, speed = plan_both(layout(n_layer=160, layer_mib=300), head, ws)
    for plan in (memory, speed):
        (laptop,) = [h for h in plan["speed"]["hosts"] if h["name"] == LAPTOP]
        cpu_layers = sum(d["layers"] for d in laptop["devices"] if d["name"] == "CPU")
        assert laptop.get("cap_ms", 0.0) == pytest.approx(cpu_layers * 4.0 / 0.5, abs=1e-3)
    assert "cap_ms" not in next(h for h in memory["speed"]["hosts"] if h["name"] == LAPTOP)
    assert next(h for h in speed["speed"]["hosts"] if h["name"] == LAPTOP)["cap_ms"] > 0

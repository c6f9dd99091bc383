"""tune.yml's decisions and report (plugins/plugin_utils/tune.py), on cases computed by hand."""

from __future__ import annotations

import math

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.profile import (
    tune_decide,
    tune_needs_profile,
    tune_report,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import tune as T

from tests.unit.plugins.plugin_utils.test_placement import layout

# n_embd 256 -> an activation row is 1024 bytes; at 8 Mbit/s one byte takes 1 microsecond.
LAYOUT = layout(n_layer=8)
SPEED = {
    "head": {"ms_per_layer": 2.0},
    "fast": {"ms_per_layer": 1.0, "rtt_ms": 1.0, "mbit_s": 8.0},
    "nas": {"ms_per_layer": 4.0, "rtt_ms": 1.0, "mbit_s": 8.0},
}


def plan(fast, nas, args):
    """A two-worker plan, the output layer on the head (the shape of molecule/tune's plans)."""
    return {
        "head": "head",
        "hosts": [
            {"name": "head", "layers": [0, 0], "output_layer": True},
            {
                "name": "fast",
                "layers": [0, fast],
                "output_layer": False,
                "endpoint": "10.0.0.2:50052",
                "threads": 2,
            },
            {
                "name": "nas",
                "layers": [fast, fast + nas],
                "output_layer": False,
                "endpoint": "10.0.0.3:50052",
                "threads": 1,
            },
        ],
        "workers": ["fast", "nas"],
        "llama_server_args": ["--tensor-split", args],
    }


MEMORY = plan(4, 4, "4,4")
SPEEDY = plan(7, 1, "7,1")


def test_predict_any_plan_with_the_current_figures():
    got = T.predict(MEMORY, SPEED, LAYOUT)
    # compute 4 x 1 + 4 x 4 = 20; the output layer on the head: its 5 MiB weigh less than one
    # 10 MiB layer, so one layer at the head's 2 ms; each link rtt 1 + a row in and out 2 x 1.024
    assert got["ms_per_token"] == pytest.approx(20 + 2 + 2 * (1 + 2.048), abs=1e-3)
    assert got["tokens_per_second"] == pytest.approx(1000 / 28.096, abs=0.01)
    got = T.predict(SPEEDY, SPEED, LAYOUT)
    assert got["ms_per_token"] == pytest.approx(7 + 4 + 2 + 2 * 3.048, abs=1e-3)


def test_redeploy_above_the_threshold_with_the_schedule_a_b_a_b():
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10)
    # 28.096 / 19.096 - 1 = 47.1 %
    assert d["redeploy"] is True
    assert d["gain"] == pytest.approx(28.096 / 19.096 - 1, abs=1e-3)
    assert d["schedule"] == ["before", "after", "before", "after"]
    assert d["reason"].startswith("redeploy: the speed plan is predicted 47% faster")
    # the same two workers, started the same way: only the head's arguments change
    assert d["head_only"] is True


def test_a_speed_plan_that_changes_a_worker_is_not_head_only():
    for change in ({"threads": 1}, {"endpoint": "10.0.0.9:50052"}):
        other = dict(SPEEDY, hosts=[dict(h, **change) if h["name"] == "fast" else h for h in SPEEDY["hosts"]])
        d = T.decide(MEMORY, other, SPEED, LAYOUT, 0.10)
        assert d["redeploy"] is True and d["head_only"] is False, change
    # a worker left out by the speed plan: its rpc-server is no longer needed
    fewer = dict(SPEEDY, workers=["fast"])
    fewer["hosts"] = [h if h["name"] != "nas" else dict(h, layers=[8, 8]) for h in SPEEDY["hosts"]]
    fewer["hosts"][1] = dict(fewer["hosts"][1], layers=[0, 8])
    d = T.decide(MEMORY, fewer, SPEED, LAYOUT, 0.10)
    assert d["head_only"] is False
    # nothing to redeploy is never head_only
    assert T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.60)["head_only"] is False


def test_no_redeploy_at_or_below_the_threshold():
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.60)
    assert d["redeploy"] is False and d["schedule"] == ["before"]
    assert d["reason"].startswith("no redeploy: the speed plan is predicted +47%")
    assert "not above 60%" in d["reason"]


def test_the_same_arguments_are_never_redeployed():
    d = T.decide(SPEEDY, dict(SPEEDY), SPEED, LAYOUT, 0.0)
    assert d["redeploy"] is False and d["gain"] == 0
    assert "already runs the speed plan" in d["reason"]


def test_a_host_without_figures_is_named():
    with pytest.raises(T.TuneError, match="host nas: no speed figures"):
        T.predict(MEMORY, {k: v for k, v in SPEED.items() if k != "nas"}, LAYOUT)
    with pytest.raises(AnsibleFilterError, match=r"tune_decide: host fast: speed\.mbit_s must be"):
        tune_decide(MEMORY, SPEEDY, dict(SPEED, fast={"ms_per_layer": 1, "rtt_ms": 1, "mbit_s": 0}), LAYOUT)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "x"])
def test_a_bad_threshold_is_refused(bad):
    with pytest.raises(T.TuneError, match="tune_min_gain"):
        T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, bad)


def summary(tps, ttft=0.5):
    return {"ok": 2, "output_tps": {"median": tps}, "ttft_seconds": {"median": ttft}}


def test_report_takes_the_median_of_each_plans_rounds():
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10)
    rounds = [
        {"plan": "before", "summary": summary(10.0, 0.8)},
        {"plan": "after", "summary": summary(16.0, 0.4)},
        {"plan": "before", "summary": summary(12.0, 1.0)},
        {"plan": "after", "summary": summary(20.0, 0.6)},
    ]
    r = tune_report(d, MEMORY, SPEEDY, rounds)
    assert r["before"]["tokens_per_second"] == 11.0 and r["after"]["tokens_per_second"] == 18.0
    assert r["before"]["ttft_s"] == 0.9 and r["after"]["ttft_s"] == 0.5
    assert r["ratio"] == pytest.approx(18 / 11, abs=1e-3)
    assert r["before"]["llama_server_args"] == ["--tensor-split", "4,4"]
    assert r["after"]["llama_server_args"] == ["--tensor-split", "7,1"]
    assert r["predicted_tokens_per_second"]["after"] == pytest.approx(1000 / 19.096, abs=0.01)
    assert r["redeployed"] is True
    assert r["table"][1].split()[:3] == ["before", "11.00", "%.2f" % (1000 / 28.096)]
    assert r["table"][-2].startswith(
        "measured after/before: 1.64x over 4 rounds (before, after, before, after)"
    )
    # 18 / 11 - 1 = 63.6 % > 10 %: the speed plan stays
    assert r["measured_gain"] == pytest.approx(7 / 11, abs=1e-4)
    assert r["gain_confirmed"] is True
    assert r["verdict"] == (
        "kept: the speed plan measured +64% (11.00 -> 18.00 tokens/s, medians of 2 and 2 rounds), above 10%"
    )
    assert r["table"][-1] == r["verdict"]


@pytest.mark.parametrize(
    ("after_tps", "confirmed", "shown"),
    # medians 10 -> 10.9 is +9 %, 10 -> 11.5 is +15 %; at exactly 10 % (11.0) not above
    [(10.9, False, "+9%"), (11.0, False, "+10%"), (11.5, True, "+15%"), (7.0, False, "-30%")],
)
def test_the_measured_gain_is_held_to_min_gain(after_tps, confirmed, shown):
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10)
    rounds = [
        {"plan": "before", "summary": summary(9.0)},
        {"plan": "after", "summary": summary(after_tps - 1)},
        {"plan": "before", "summary": summary(11.0)},
        {"plan": "after", "summary": summary(after_tps + 1)},
    ]
    r = T.report(d, MEMORY, SPEEDY, rounds)
    assert r["before"]["tokens_per_second"] == 10.0
    assert r["gain_confirmed"] is confirmed
    assert r["verdict"].startswith("kept: " if confirmed else "not kept, the running plan is served again: ")
    assert f"measured {shown} (10.00 -> {after_tps:.2f}" in r["verdict"]
    assert r["verdict"].endswith("above 10%" if confirmed else "not above 10%")


def test_report_without_a_redeploy_is_the_running_plan_on_both_sides():
    d = T.decide(SPEEDY, SPEEDY, SPEED, LAYOUT)
    r = T.report(d, SPEEDY, MEMORY, [{"plan": "before", "summary": summary(18.0)}])
    assert r["redeployed"] is False and r["ratio"] == 1.0
    assert r["after"]["llama_server_args"] == ["--tensor-split", "7,1"]
    assert "nothing to redeploy" in r["table"][-2]
    assert r["gain_confirmed"] is None
    assert r["verdict"] == "nothing redeployed: 18.00 tokens/s measured over 1 round"


@pytest.mark.parametrize("tps", [0, -1.0, math.nan, None])
def test_a_round_without_a_usable_measurement_is_named(tps):
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT)
    rounds = [{"plan": "before", "summary": summary(10.0)}, {"plan": "after", "summary": summary(tps)}]
    with pytest.raises(T.TuneError, match=r"round 2 \(after\): output_tps median"):
        T.report(d, MEMORY, SPEEDY, rounds)


def test_a_redeploy_without_a_round_of_the_speed_plan_is_refused():
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT)
    with pytest.raises(AnsibleFilterError, match="no round measured it"):
        tune_report(d, MEMORY, SPEEDY, [{"plan": "before", "summary": summary(10.0)}])


FRESH = {"speed": dict(SPEED), "remeasure": []}


def test_auto_reuses_a_profile_with_figures_for_every_host_of_the_plan():
    got = T.needs_profile(MEMORY, FRESH, "auto")
    assert got["measure"] is False
    assert "every host of the fleet (head, fast, nas)" in got["reason"]
    # a host in the plan without figures: measure, and say which and why
    stale = {
        "speed": {k: v for k, v in SPEED.items() if k != "nas"},
        "remeasure": ["nas: the host changed since it was measured (cpu_quota 1 -> 0.25): run profile.yml"],
    }
    got = T.needs_profile(MEMORY, stale, "auto")
    assert got["measure"] is True
    assert got["reason"].startswith(
        "measuring the running plan: no usable figures for nas (nas: the host changed"
    )
    got = T.needs_profile(MEMORY, {"speed": {}, "remeasure": []}, "auto")
    assert got["measure"] is True and "head, fast, nas (no profile.json)" in got["reason"]


def test_auto_measures_when_a_worker_the_plan_leaves_out_has_no_figures():
    """The speed re-plan may use every worker of the inventory and refuses one without figures:
    a profile.json with figures for the running plan's hosts only (a measuring run that failed on
    the left-out worker) is measured again, naming that worker (make demo-tune-check's wifi)."""
    got = T.needs_profile(MEMORY, FRESH, "auto", hosts=["head", "fast", "wifi", "nas"])
    assert got["measure"] is True
    assert got["reason"] == "measuring the running plan: no usable figures for wifi (not in profile.json)"
    with_wifi = {"speed": {**SPEED, "wifi": dict(SPEED["nas"])}, "remeasure": []}
    got = tune_needs_profile(MEMORY, with_wifi, "auto", hosts=["head", "fast", "wifi", "nas"])
    assert got["measure"] is False and "(head, fast, nas, wifi)" in got["reason"]


def test_always_and_never_override_the_profile():
    assert T.needs_profile(MEMORY, FRESH, "always")["measure"] is True
    assert T.needs_profile(MEMORY, {"speed": {}}, "never")["measure"] is False
    assert T.needs_profile(MEMORY, FRESH, True)["measure"] is True
    with pytest.raises(T.TuneError, match="tune_profile must be one of auto, always, never, got 'sometimes'"):
        T.needs_profile(MEMORY, FRESH, "sometimes")
    with pytest.raises(AnsibleFilterError, match="tune_needs_profile: tune_profile must be one of"):
        tune_needs_profile(MEMORY, FRESH, "sometimes")
    assert tune_needs_profile(MEMORY, FRESH)["measure"] is False


def test_a_speed_plan_measured_and_not_kept_is_not_redeployed_again():
    d = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10)
    rounds = [{"plan": p, "summary": summary(10.0)} for p in ("before", "after", "before", "after")]
    last = T.report(d, MEMORY, SPEEDY, rounds)
    assert last["gain_confirmed"] is False
    again = T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10, previous=last)
    assert again["redeploy"] is False and again["schedule"] == ["before"]
    assert again["reason"].startswith(
        "no redeploy: this speed plan was measured against the running plan before"
    )
    assert last["verdict"] in again["reason"]
    # another speed plan, a kept one, or no previous run: decided on the prediction as before
    other = plan(6, 2, "6,2")
    assert T.decide(MEMORY, other, SPEED, LAYOUT, 0.10, previous=last)["redeploy"] is True
    kept = dict(last, gain_confirmed=True)
    assert T.decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10, previous=kept)["redeploy"] is True
    assert tune_decide(MEMORY, SPEEDY, SPEED, LAYOUT, 0.10, previous=None)["redeploy"] is True


def test_a_refused_speed_plan_and_a_plan_without_hosts_are_named():
    """The plans are read through plan.parse_answer / plan.parse: the planner's refusal says why,
    a plan without hosts says what to run."""
    refused = {"ok": False, "msg": "w1 misses 12 MiB", "table_text": "", "missing": {"w1": 12}}
    with pytest.raises(T.TuneError, match=r"^the speed plan failed: w1 misses 12 MiB$"):
        T.decide(MEMORY, refused, SPEED, LAYOUT)
    for empty in ({}, {"hosts": []}):
        with pytest.raises(
            T.TuneError, match=r"the plan has no hosts \(got (None|\[\])\): run playbooks/site.yml"
        ):
            T.predict(empty, SPEED, LAYOUT)
    with pytest.raises(T.TuneError, match=r"plan: hosts\[0\]\.name must be a non-empty string"):
        T.predict({"hosts": [{"role": "head"}]}, SPEED, LAYOUT)


def _with_devices(p, fast_gpu, fast_cpu):
    """``p`` as plan.json version 2: fast offers Vulkan0 and its CPU (``fast_gpu`` + ``fast_cpu``
    of its layers, in that order), the head and nas their CPU."""
    rows = []
    for h in p["hosts"]:
        first, last = h["layers"]
        if h["name"] == "fast":
            assert fast_gpu + fast_cpu == last - first
            devices = [
                {"name": "Vulkan0", "backend": "vulkan", "type": "gpu", "layers": [first, first + fast_gpu]},
                {"name": "CPU", "backend": "cpu", "type": "cpu", "layers": [first + fast_gpu, last]},
            ]
        else:
            devices = [{"name": "CPU", "backend": "cpu", "type": "cpu", "layers": [first, last]}]
        devices[-1]["output_layer"] = h["output_layer"]
        rows.append(dict(h, devices=devices))
    return dict(p, version=2, hosts=rows)


def test_a_plan_with_devices_is_predicted_per_device():
    """fast's Vulkan0 measured at 0.25 ms a layer against its CPU's 1.0: the 4 layers of fast split
    3 on the GPU and 1 on the CPU cost 3 x 0.25 + 1 x 1.0 = 1.75 ms instead of 4 (the rest as in
    test_predict_any_plan_with_the_current_figures: nas 16, the head's output 2, the links 6.096).
    Before this, a GPU plan was predicted as if every layer ran on its host's CPU."""
    speed = dict(SPEED, fast=dict(SPEED["fast"], devices={"Vulkan0": {"ms_per_layer": 0.25}}))
    got = T.predict(_with_devices(MEMORY, 3, 1), speed, LAYOUT)
    assert got["ms_per_token"] == pytest.approx(1.75 + 16 + 2 + 2 * (1 + 2.048), abs=1e-3)
    # every layer on fast's CPU: the CPU-only figure again
    got = T.predict(_with_devices(MEMORY, 0, 4), speed, LAYOUT)
    assert got["ms_per_token"] == pytest.approx(4 + 16 + 2 + 2 * (1 + 2.048), abs=1e-3)


def test_a_speed_plan_that_changes_a_workers_devices_is_not_head_only():
    """fast's rpc-server offers Vulkan0 and its CPU in the running plan and its CPU alone in the
    speed plan: its -d list changes, so the round must redeploy it, not only the head (on
    demo-gpu, a head-only round served the speed plan's --device over the old -d list)."""
    before = _with_devices(MEMORY, 2, 2)
    after = _with_devices(SPEEDY, 0, 7)
    after["hosts"][1]["devices"] = [after["hosts"][1]["devices"][1]]
    speed = dict(SPEED, fast=dict(SPEED["fast"], devices={"Vulkan0": {"ms_per_layer": 3.0}}))
    d = T.decide(before, after, speed, LAYOUT, 0.10)
    assert d["redeploy"] is True and d["head_only"] is False
    # the same devices on every worker: only the head's arguments change
    same = _with_devices(SPEEDY, 2, 5)
    assert T.decide(before, same, speed, LAYOUT, 0.0)["head_only"] is True

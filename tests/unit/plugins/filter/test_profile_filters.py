"""The profile filters and plan_hosts' speeds (what the plan role passes to the planner)."""

from __future__ import annotations

import math

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.plan import plan_hosts
from ansible_collections.llmfleet.cluster.plugins.filter.profile import (
    profile_build,
    profile_measuring_plan,
    profile_speed,
)

SHA = "c" * 64


def fact(cpus):
    return {
        "arch": "x86_64",
        "cpu_model": "N100",
        "cpus": cpus,
        "memory": {"usable_mib": 300},
        "default_ipv4": "10.0.0.9",
    }


HOSTVARS = {
    "head": {"llmfleet_host": fact(2)},
    "w1": {"llmfleet_host": fact(1)},
    # a what-if worker with figures in the inventory
    "future": {
        "llmfleet_host": fact(8),
        "llmfleet_profile": {"ms_per_layer": 0.5, "rtt_ms": 2, "mbit_s": 100},
    },
}


def made_profile():
    plan = {
        "hosts": [
            {"name": "head", "role": "head", "layers": [0, 0], "predicted_mib": {"weights": 100}},
            {
                "name": "w1",
                "role": "worker",
                "layers": [0, 10],
                "output_layer": True,
                "threads": 1,
                "predicted_mib": {"weights": 30},
            },
        ]
    }
    samples = {
        "w1": [{"units": {"rpc": {"cpu_seconds": 0}}}] * 2 + [{"units": {"rpc": {"cpu_seconds": 1.1}}}]
    }
    facts = {k: v["llmfleet_host"] for k, v in HOSTVARS.items()}
    links = {"w1": {"measured": True, "rtt_ms": 1.0, "mbit_s": 50.0}}
    return profile_build(
        samples,
        plan,
        {"predicted_ms": 1000.0, "prompt_ms": 100.0, "predicted_n": 10},
        facts,
        {"head": "srv", "worker": "rpc"},
        "b1",
        {"name": "m", "sha256": SHA},
        "2026-12-01T00:00:00Z",
        links=links,
    )


def test_profile_to_planner_hosts() -> None:
    p = made_profile()
    # 1.1 CPU s * 1000/1100 decode / 1 CPU = 1000 ms / 10 tokens / 11 layers (10 + output as 1)
    assert p["hosts"]["w1"]["compute"]["ms_per_layer"] == pytest.approx(100 / 11, rel=1e-3)
    # the head held no layers in that plan: no figure, and the profile says why
    assert p["hosts"]["head"]["not_measured"] == ["not measured: head: holds no layers in the plan"]
    result = profile_speed(
        ["head", "w1", "future"], "head", HOSTVARS, profile=p, build="b1", model_sha256=SHA
    )
    assert result["source"] == {"w1": "profile", "future": "inventory"}
    assert result["remeasure"] == [
        "head: figures not used (no compute figure): re-measure with playbooks/profile.yml"
    ]
    hosts = plan_hosts(["w1", "future"], HOSTVARS, speeds=result["speed"])
    assert hosts[0]["speed"] == {
        "ms_per_layer": pytest.approx(9.0909, rel=1e-3),
        "rtt_ms": 1.0,
        "mbit_s": 50.0,
    }
    assert hosts[1]["speed"] == {"ms_per_layer": 0.5, "rtt_ms": 2.0, "mbit_s": 100.0}
    # without speeds nothing changes (the planner of today reads a number there)
    assert "speed" not in plan_hosts(["w1"], HOSTVARS)[0]


def test_a_changed_host_is_named_and_gets_no_speed() -> None:
    hostvars = dict(HOSTVARS, w1={"llmfleet_host": fact(4)})
    result = profile_speed(
        ["head", "w1"], "head", hostvars, profile=made_profile(), build="b1", model_sha256=SHA
    )
    assert "w1" not in result["speed"]
    assert result["remeasure"][-1].startswith("w1: the host changed since it was measured (cpus 1 -> 4)")


def test_odd_inventory_figures_fail_naming_the_host() -> None:
    hostvars = dict(
        HOSTVARS, future={"llmfleet_host": fact(8), "llmfleet_profile": {"ms_per_layer": math.nan}}
    )
    with pytest.raises(AnsibleFilterError, match=r"profile_speed: future: ms_per_layer is nan"):
        profile_speed(["future"], "head", hostvars)


def test_profile_build_refuses_a_zero_mbit_link() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"profile_build: w1: mbit_s is 0.0 in the link probe \(a 0 Mbit link\)"
    ):
        profile_build(
            {},
            {"hosts": []},
            {},
            {"w1": fact(1)},
            {},
            "b1",
            {"sha256": SHA},
            "now",
            links={"w1": {"measured": True, "rtt_ms": 1.0, "mbit_s": 0.0}},
        )


def test_profile_build_measures_the_output_layer_apart_from_a_second_request() -> None:
    """The filter's ``moved``: the output layer on w1 in the first request, on the head in the
    second; w1's layers priced without it, its output layer measured (not its weight), the head
    priced from the two requests' wall time."""

    def plan(output_on_w1):
        return {
            "model": {"n_embd": 64, "n_vocab": 1000},
            "workers": ["w1"],
            "hosts": [
                {"name": "head", "role": "head", "layers": [0, 0], "output_layer": not output_on_w1},
                {
                    "name": "w1",
                    "role": "worker",
                    "layers": [0, 10],
                    "output_layer": output_on_w1,
                    "threads": 1,
                },
            ],
        }

    def window(unit, seconds):
        return [{"units": {unit: {"cpu_seconds": 0}}}] * 2 + [{"units": {unit: {"cpu_seconds": seconds}}}]

    # 10 tokens: 100 ms a token with the output layer on w1, 84 with it on the head
    first_timings = {"predicted_ms": 1000.0, "prompt_ms": 0.0, "predicted_n": 10}
    second_timings = {"predicted_ms": 840.0, "prompt_ms": 0.0, "predicted_n": 10}
    # w1: 10 layers = 0.5 CPU s (5 ms a layer a token), its output layer +0.3 s (30 ms a token)
    first = {"head": window("server", 0.7), "w1": window("rpc", 0.8)}
    second = {"head": window("server", 0.7), "w1": window("rpc", 0.5)}
    facts = {k: v["llmfleet_host"] for k, v in HOSTVARS.items()}
    got = profile_build(
        first,
        plan(True),
        first_timings,
        facts,
        {"head": "server", "worker": "rpc"},
        "b0c1e570",
        {"name": "m", "sha256": SHA},
        "2026-12-03T08:00:00Z",
        links={"w1": {"measured": True, "rtt_ms": 1.0, "mbit_s": 50.0}},
        moved={"plan": plan(False), "samples": second, "timings": second_timings},
    )
    w1 = got["hosts"]["w1"]["compute"]
    assert w1["cpu_ms_per_layer"] == pytest.approx(5.0) and w1["output_cpu_ms"] == pytest.approx(30.0)
    assert got["output_layers"] == pytest.approx(6.0)
    # what each request has beyond w1's terms (a 64 x 4-byte row at 50 Mbit/s, the logits 1000 x 4)
    row, logits = 64 * 4 * 8 / 50e6 * 1000, 1000 * 4 * 8 / 50e6 * 1000
    off = 100.0 - (10 * 5.0 + 30.0 + 1.0 + row + logits)
    on = 84.0 - (10 * 5.0 + 1.0 + 2 * row)
    head = got["hosts"]["head"]["compute"]
    assert head["priced_by"] == "wall time"
    assert head["output_ms"] == pytest.approx(on - off, abs=1e-3)
    assert head["ms_per_layer"] == pytest.approx((on - off) / 6.0, abs=1e-3)
    assert head["token_ms"] == pytest.approx(off, abs=1e-3)
    assert got["token"]["residuals"] == {
        "off": {"request": 0, "ms": pytest.approx(off, abs=1e-3), "head_layers": 0},
        "on": {"request": 1, "ms": pytest.approx(on, abs=1e-3), "head_layers": 0},
    }


def test_the_measuring_filter_makes_every_placement_in_one_call() -> None:
    """request='all' (the profile role's one call): the role's booleans as Ansible passes them,
    a word that is not one named."""
    from tests.unit.plugins.plugin_utils import test_plan

    plan = test_plan.gpu_plans.__wrapped__()["worker"]
    made = profile_measuring_plan(plan, request="all", output_apart="false", devices="no")
    assert made == {"requests": [profile_measuring_plan(plan), {}, {}], "devices": []}
    assert profile_measuring_plan(plan, request="all")["devices"] == profile_measuring_plan(
        plan, request="devices"
    )
    with pytest.raises(AnsibleFilterError, match="maybe"):
        profile_measuring_plan(plan, request="all", devices="maybe")
    with pytest.raises(AnsibleFilterError, match="devices or all, got 'some'"):
        profile_measuring_plan(plan, request="some")

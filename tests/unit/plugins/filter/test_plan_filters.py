"""The thin filters over the placement math."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.plan_fallback import plan_fallback
from ansible_collections.llmfleet.cluster.plugins.filter.plan_hosts import plan_hosts
from ansible_collections.llmfleet.cluster.plugins.filter.plan_placement import plan_placement
from ansible_collections.llmfleet.cluster.plugins.filter.split_layers import split_layers
from ansible_collections.llmfleet.cluster.plugins.filter.tensor_split import tensor_split

from tests.support import llama_split
from tests.unit.plugins.plugin_utils.test_placement import host, layout

MODEL = {"name": "tiny", "url": "http://mirror/models/tiny.gguf", "sha256": "b" * 64}


def test_tensor_split_filter():
    assert tensor_split([6, 6, 6]) == "6,6,7"
    value = tensor_split([3, 4], head_layers=2)
    assert llama_split.layer_counts([float(x) for x in value.split(",")], 9, 8) == (2, [3, 5], 1)
    with pytest.raises(AnsibleFilterError, match="non-negative"):
        tensor_split([-1, 2])


def test_split_layers_filter_applies_the_rule():
    assert split_layers("1,1,6", n_layer=8) == {
        "cpu_slots": 0,
        "slots": [2, 1, 6],
        "layers": [2, 1, 5],
        "output_device": 2,
    }
    assert split_layers([1, 1], n_layer=4, ngl=3)["cpu_slots"] == 2
    with pytest.raises(AnsibleFilterError):
        split_layers("a,b", n_layer=4)


def test_plan_placement_and_fallback_lookup():
    ws = [host("a", 100), host("b", 100), host("c", 100)]
    opts = {"head_layers": False, "context": 512, "min_workers": 3}
    plan = plan_placement(layout(n_layer=8, layer_mib=10), MODEL, host("head", 60), ws, opts, reserve_mib=8)
    assert "ok" not in plan
    assert plan["model"]["file"] == "tiny.gguf" and plan["model"]["url"] == MODEL["url"]
    assert plan_fallback(plan, ["c", "b", "a"])["llama_server_args"] == plan["llama_server_args"]
    entry = plan_fallback(plan, ["c", "a"])
    assert entry["ok"] and entry["workers"] == ["a", "c"]
    assert not plan_fallback(plan, ["zz"])["ok"]


def test_plan_placement_refusal_is_data():
    out = plan_placement(
        layout(n_layer=8, layer_mib=50), MODEL, host("head", 60), [host("a", 100)], {"head_layers": False}
    )
    assert out["ok"] is False
    assert out["missing"]["a"] > 0
    assert "a " in out["table_text"] and "missing" in out["msg"]
    with pytest.raises(AnsibleFilterError, match="file or a url"):
        plan_placement(layout(), {"name": "x"}, host("head", 60), [])


def test_plan_hosts_reads_probe_facts_and_overrides():
    hostvars = {
        "w1": {"llmfleet_host": {"memory": {"usable_mib": 321}, "cpus": 4, "default_ipv4": "10.1.0.5"}},
        "w2": {
            "llmfleet_host": {"memory": {"usable_mib": 100}, "cpus": 1, "default_ipv4": "10.1.0.6"},
            "llmfleet_rpc_address": "192.168.1.6",
            "llmfleet_rpc_port": 50099,
            "llmfleet_reserve_mib": 10,
        },
        "w3": {},
    }
    out = plan_hosts(["w1", "w2"], hostvars)
    assert out[0] == {"name": "w1", "usable_mib": 321.0, "cpus": 4, "address": "10.1.0.5", "port": 50052}
    assert out[1]["address"] == "192.168.1.6" and out[1]["port"] == 50099 and out[1]["reserve_mib"] == 10.0
    with pytest.raises(AnsibleFilterError, match="w3 has no llmfleet_host"):
        plan_hosts(["w3"], hostvars)
    with pytest.raises(AnsibleFilterError, match="not in the inventory"):
        plan_hosts(["nope"], hostvars)

"""The thin filters over the placement math."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.plan import (
    plan_gpu_workers,
    plan_hosts,
    plan_placement,
)

from tests.unit.plugins.plugin_utils.test_placement import host, layout

MODEL = {"name": "tiny", "url": "http://mirror/models/tiny.gguf", "sha256": "b" * 64}


def test_plan_placement_and_its_fallbacks():
    ws = [host("a", 100), host("b", 100), host("c", 100)]
    opts = {"head_layers": False, "context": 512, "min_workers": 3}
    plan = plan_placement(layout(n_layer=8, layer_mib=10), MODEL, host("head", 60), ws, opts, reserve_mib=8)
    assert "ok" not in plan
    assert plan["model"]["file"] == "tiny.gguf" and plan["model"]["url"] == MODEL["url"]
    entry = next(e for e in plan["fallbacks"] if e["workers"] == ["a", "c"])
    assert entry["ok"] and entry["lost"] == "b"


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


def test_a_gpu_fleet_through_the_filters_gives_a_version_2_plan_that_plan_py_reads():
    """plan_hosts reads the devices of recorded machines' facts (and llmfleet_gpu_reserve_mib),
    plan_placement plans them, plan.py reads the plan back with every device."""
    from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan

    from tests.support.host_trees import recorded_hosts

    root = recorded_hosts()
    hostvars = {
        name: {"llmfleet_host": hostinfo.probe(str(root / name)), "llmfleet_rpc_address": f"10.0.0.{i}"}
        for i, name in enumerate(("rtx3060-desktop", "ryzen7840u-laptop", "celeron-nas"), start=2)
    }
    hostvars["rtx3060-desktop"]["llmfleet_gpu_reserve_mib"] = 1024
    head, *workers = plan_hosts(["rtx3060-desktop", "ryzen7840u-laptop", "celeron-nas"], hostvars)
    assert [d["name"] for d in head["devices"]] == ["Vulkan0", "CPU"] and head["gpu_reserve_mib"] == 1024.0
    assert "devices" not in workers[1]  # the NAS: CPU only, planned as before
    data = plan_placement(layout(n_layer=185, layer_mib=300), MODEL, head, workers)
    assert data["version"] == 2
    plan = Plan.from_dict(data)
    assert [h.device_names() for h in plan.hosts] == [["CPU", "Vulkan0"], ["Vulkan0"], ["CPU"]]
    assert [d.report_name for h in plan.hosts for d in h.devices] == [
        "CPU",
        "Vulkan0",
        "RPC0[10.0.0.3:50052]",
        "RPC0[10.0.0.4:50052]",
    ]
    assert plan.head.devices[1].budget_mib == 11922 - 1024
    assert plan.split_value("--device") == "Vulkan0,RPC0,RPC1"
    assert sum(d.layer_count for h in plan.hosts for d in h.devices) == 185


def test_plan_gpu_workers_names_a_plan_it_cannot_read():
    with pytest.raises(AnsibleFilterError, match=r"^plan_gpu_workers: plan: workers must be .*nowhere"):
        plan_gpu_workers({"version": 2, "head": "h", "hosts": [{"name": "h"}], "workers": ["nowhere"]})

"""The typed boundary between the inventory and the plan (issue #14, item 5).

Each refusal goes through the planner's public entry (make_plan, as the plan_placement filter
calls it) or the plan_hosts filter, so it fails on code that plans from such input, and checks
that the message names the host or option and the value. One good-input control plans.
"""

from __future__ import annotations

import json
import math

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.plan import plan_hosts
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement_inputs as PI

MIB = 1024 * 1024
MODEL = {"name": "tiny", "url": "http://mirror/models/tiny.gguf", "sha256": "c" * 64}


def layout(n_layer: int = 8, layer_mib: float = 10.0) -> dict:
    lb = int(layer_mib * MIB)
    return {
        "n_layer": n_layer,
        "n_embd": 256,
        "n_ff": 512,
        "n_vocab": 1000,
        "n_head_kv": [2] * n_layer,
        "head_dim_k": 64,
        "head_dim_v": 64,
        "sliding_window": 0,
        "swa_layers": [False] * n_layer,
        "layer_bytes": [lb] * n_layer,
        "layer_largest_tensor": [lb // 3] * n_layer,
        "token_embd_bytes": 5 * MIB,
        "output_bytes": 5 * MIB,
        "output_norm_bytes": 1024,
        "other_bytes": 0,
        "tied_output": False,
        "file_bytes": n_layer * lb + 10 * MIB,
        "architecture": "llama",
    }


def head(**over) -> dict:
    return {"name": "head", "usable_mib": 60.0, "cpus": 2, **over}


def worker(name: str, last: int, **over) -> dict:
    return {"name": name, "usable_mib": 100.0, "cpus": 2, "address": f"10.0.0.{last}", "port": 50052, **over}


def fleet() -> list[dict]:
    return [worker("w1", 3), worker("w2", 4), worker("w3", 5)]


OPTS = {"head_layers": False, "context": 512}


def plan(head_=None, workers=None, options=None, reserve_mib=8):
    return P.make_plan(
        layout(),
        MODEL,
        head_ or head(),
        fleet() if workers is None else workers,
        OPTS if options is None else options,
        reserve_mib,
    )


def refused(match: str, **kw) -> None:
    with pytest.raises(ValueError, match=match):
        plan(**kw)


def test_control_good_input_plans_and_keeps_unknown_keys() -> None:
    ws = fleet()
    ws[0]["speed"] = 3.5  # a key the boundary does not know passes through to the planner
    ws[1]["address"] = "W2.lan."  # a host name, normalised
    ws[2]["address"] = "[fd00::5]"  # IPv6, brackets accepted
    ws[2]["usable_mib"] = "100"  # inventory values may come as strings
    out = plan(workers=ws, options={**OPTS, "min_workers": 3})
    json.dumps(out, allow_nan=False)  # plan.json is written with allow_nan=False
    endpoints = {"w1": "10.0.0.3:50052", "w2": "w2.lan:50052", "w3": "[fd00::5]:50052"}
    assert sorted(out["workers"]) == ["w1", "w2", "w3"]
    assert out["rpc"] == ",".join(endpoints[w] for w in out["workers"])
    recorded = {h["name"]: h for h in out["planned_with"]["hosts"]}
    assert recorded["w1"]["speed"] == 3.5
    head_out, workers_out, reserve = PI.check_hosts(head(), fleet(), 8)
    assert reserve == 8.0 and [w["name"] for w in workers_out] == ["w1", "w2", "w3"]
    assert head_out["address"] is None


# --- hosts ------------------------------------------------------------------------------------


def test_worker_without_an_address() -> None:
    ws = fleet()
    del ws[0]["address"]
    refused(r"host w1: a worker needs an address", workers=ws)


def test_worker_with_an_empty_address() -> None:
    ws = fleet()
    ws[0]["address"] = ""
    refused(r"host w1: a worker needs an address", workers=ws)


def test_duplicate_addresses_give_a_duplicate_endpoint() -> None:
    ws = fleet()
    ws[1]["address"] = "10.0.0.3"
    refused(r"hosts w1 and w2: both at the RPC endpoint 10\.0\.0\.3:50052", workers=ws)


def test_duplicate_endpoint_written_differently() -> None:
    ws = fleet()
    ws[0]["address"], ws[1]["address"] = "fd00::1", "[fd00:0::1]"
    refused(r"hosts w1 and w2: both at the RPC endpoint \[fd00::1\]:50052", workers=ws)


def test_port_70000() -> None:
    ws = fleet()
    ws[0]["port"] = 70000
    refused(r"host w1: port must be between 1 and 65535, got 70000", workers=ws)


def test_port_0_is_refused_not_defaulted() -> None:
    ws = fleet()
    ws[0]["port"] = 0
    refused(r"host w1: port must be between 1 and 65535, got 0", workers=ws)


def test_port_not_a_number() -> None:
    ws = fleet()
    ws[0]["port"] = "rpc"
    refused(r"host w1: port must be an integer, got 'rpc'", workers=ws)


@pytest.mark.parametrize(
    ("addr", "hint"),
    [
        ("10.0.0.3,10.0.0.9", r"one address per host"),
        ("10.0.0.3 10.0.0.9", r"one address per host"),
        ("10.0.0.3:50052", r"the port goes in port"),
        ("-bad-.lan", r""),
        ("10.0.0.300", r""),
        ("x" * 64 + ".lan", r""),
    ],
)
def test_address_that_is_not_an_ip_or_host_name(addr: str, hint: str) -> None:
    ws = fleet()
    ws[0]["address"] = addr
    refused(r"host w1: address must be an IP address or an RFC 1123 host name, got '.*" + hint, workers=ws)


def test_address_not_a_string() -> None:
    ws = fleet()
    ws[0]["address"] = 167772163
    refused(r"host w1: address must be an IP address or a host name, got 167772163", workers=ws)


def test_usable_nan() -> None:
    ws = fleet()
    ws[0]["usable_mib"] = math.nan
    refused(r"host w1: usable_mib must be a finite number, got nan", workers=ws)


def test_usable_inf() -> None:
    refused(r"host head: usable_mib must be a finite number, got inf", head_=head(usable_mib=math.inf))


def test_usable_inf_as_a_string() -> None:
    ws = fleet()
    ws[2]["usable_mib"] = "inf"
    refused(r"host w3: usable_mib must be a finite number, got 'inf'", workers=ws)


def test_usable_10_to_the_18() -> None:
    ws = fleet()
    ws[0]["usable_mib"] = 10**18
    refused(r"host w1: usable_mib must be between 0 and 67108864, got 1000000000000000000", workers=ws)


def test_usable_negative() -> None:
    ws = fleet()
    ws[0]["usable_mib"] = -1
    refused(r"host w1: usable_mib must be between 0 and 67108864, got -1", workers=ws)


def test_usable_missing() -> None:
    ws = fleet()
    del ws[1]["usable_mib"]
    refused(r"host w2: usable_mib is missing", workers=ws)


def test_usable_a_bool() -> None:
    ws = fleet()
    ws[1]["usable_mib"] = True
    refused(r"host w2: usable_mib must be a finite number, got True", workers=ws)


def test_reserve_negative() -> None:
    ws = fleet()
    ws[0]["reserve_mib"] = -64
    refused(r"host w1: reserve_mib must be between 0 and 67108864, got -64", workers=ws)


def test_default_reserve_nan() -> None:
    refused(r"options: reserve_mib must be a finite number, got nan", reserve_mib=math.nan)


def test_cpus_0() -> None:
    ws = fleet()
    ws[0]["cpus"] = 0
    refused(r"host w1: cpus must be between 1 and 4096, got 0", workers=ws)


def test_cpus_5000() -> None:
    refused(r"host head: cpus must be between 1 and 4096, got 5000", head_=head(cpus=5000))


def test_cpus_fractional() -> None:
    ws = fleet()
    ws[0]["cpus"] = 2.5
    refused(r"host w1: cpus must be an integer, got 2\.5", workers=ws)


def test_duplicate_names() -> None:
    ws = fleet()
    ws[1]["name"] = "w1"
    refused(r"host names must be unique, repeated: w1", workers=ws)


def test_host_without_a_name() -> None:
    ws = fleet()
    del ws[0]["name"]
    refused(r"a worker entry has no usable name: None", workers=ws)


def test_host_not_a_dict() -> None:
    refused(r"a worker entry must be a dict, got 'w1'", workers=["w1"])


# --- options ----------------------------------------------------------------------------------


def test_parallel_1000000() -> None:
    refused(
        r"options: parallel \(-np\) must be between 1 and 1024, got 1000000",
        options={**OPTS, "parallel": 1_000_000},
    )


def test_parallel_more_than_the_context() -> None:
    refused(r"options: parallel \(-np\) 600 is more than the context 512", options={**OPTS, "parallel": 600})


def test_context_0() -> None:
    refused(r"options: context must be between 1 and 16777216, got 0", options={**OPTS, "context": 0})


def test_context_2_to_the_30() -> None:
    refused(
        r"options: context must be between 1 and 16777216, got 1073741824", options={**OPTS, "context": 2**30}
    )


def test_context_nan() -> None:
    refused(r"options: context must be an integer, got nan", options={**OPTS, "context": math.nan})


def test_ubatch_negative() -> None:
    refused(r"options: ubatch must be between 1 and 65536, got -1", options={**OPTS, "ubatch": -1})


def test_link_mbit_inf() -> None:
    refused(r"options: link_mbit must be a finite number, got inf", options={**OPTS, "link_mbit": math.inf})


def test_head_layers_not_a_bool() -> None:
    refused(r"options: head_layers must be true or false, got 'no'", options={**OPTS, "head_layers": "no"})


def test_vllm_hosts_unknown() -> None:
    refused(
        r"options: vllm_hosts must be one of fewest, all, got 'some'", options={**OPTS, "vllm_hosts": "some"}
    )


def test_options_not_a_dict() -> None:
    with pytest.raises(ValueError, match=r"options must be a dict, got \['context'\]"):
        PI.check_options(["context"])


# --- through the filters ----------------------------------------------------------------------


def _hostvars(**w1) -> dict:
    return {
        "w1": {"llmfleet_host": {"memory": {"usable_mib": 321}, "cpus": 4, "default_ipv4": "10.1.0.5"}, **w1}
    }


def test_plan_hosts_refuses_port_0_not_defaulted() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"plan_hosts: host w1: port must be between 1 and 65535, got 0"
    ):
        plan_hosts(["w1"], _hostvars(llmfleet_rpc_port=0))


def test_plan_hosts_refuses_port_70000() -> None:
    with pytest.raises(AnsibleFilterError, match=r"host w1: port must be between 1 and 65535, got 70000"):
        plan_hosts(["w1"], _hostvars(llmfleet_rpc_port=70000))


def test_plan_hosts_refuses_a_default_port_0() -> None:
    with pytest.raises(AnsibleFilterError, match=r"host w1: port must be between 1 and 65535, got 0"):
        plan_hosts(["w1"], _hostvars(), port=0)


def test_plan_hosts_control() -> None:
    assert plan_hosts(["w1"], _hostvars(llmfleet_rpc_port=50099))[0]["port"] == 50099
    assert plan_hosts(["w1"], _hostvars())[0]["port"] == 50052

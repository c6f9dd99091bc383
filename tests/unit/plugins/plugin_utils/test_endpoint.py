"""The fleet's API entry point as the controller reaches it (plugins/plugin_utils/endpoint.py and
the lookup llmfleet.cluster.api_endpoint): tune.yml measured http://<head>:8080 on a fleet whose
llama-server listens on the head's loopback (llmfleet_tls) and got nothing."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleLookupError
from ansible_collections.llmfleet.cluster.plugins.lookup.api_endpoint import LookupModule
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.endpoint import EndpointError, api_endpoint

PLAN = {
    "head": "head",
    "workers": ["w1"],
    "hosts": [
        {"name": "w1", "role": "worker", "address": "10.0.0.3"},
        {"name": "head", "role": "head", "address": "10.0.0.2"},
    ],
}


def test_a_tls_fleet_is_measured_through_its_tls_front() -> None:
    assert api_endpoint(PLAN, tls=True, api_port=8080, tls_port=8088) == {
        "url": "https://10.0.0.2:8088",
        "tls": True,
    }


def test_a_plain_fleet_is_measured_on_llama_servers_port() -> None:
    assert api_endpoint(PLAN, tls=False, api_port=8080, tls_port=8088) == {
        "url": "http://10.0.0.2:8080",
        "tls": False,
    }


def test_the_inventorys_url_wins_and_says_whether_it_is_tls() -> None:
    got = api_endpoint(PLAN, tls=False, api_port=8080, tls_port=8088, url="HTTPS://api.example/")
    assert got == {"url": "HTTPS://api.example", "tls": True}


def test_an_ipv6_head_is_bracketed() -> None:
    plan = {"head": "h", "hosts": [{"name": "h", "address": "fd00::2"}]}
    assert api_endpoint(plan, tls=True, api_port=1, tls_port=8088)["url"] == "https://[fd00::2]:8088"


def test_a_head_without_an_address_is_named() -> None:
    with pytest.raises(EndpointError, match="'nohead'"):
        api_endpoint({"head": "nohead", "hosts": PLAN["hosts"]}, tls=True, api_port=8080, tls_port=8088)
    no_address = {"head": "head", "hosts": [{"name": "head", "role": "head"}]}
    with pytest.raises(EndpointError, match="the plan's head 'head' has no address"):
        api_endpoint(no_address, tls=True, api_port=8080, tls_port=8088)
    # read through the typed plan: a broken row is named with its value
    broken = {"head": "head", "hosts": [{"name": "head", "role": "head", "layers": [2, 1], "address": "a"}]}
    with pytest.raises(EndpointError, match=r"hosts\[0\]\.layers must be"):
        api_endpoint(broken, tls=True, api_port=8080, tls_port=8088)


def _lookup() -> LookupModule:
    return LookupModule()


def test_the_lookup_takes_the_fleets_switch() -> None:
    assert _lookup().run([PLAN], {}, tls=True, tls_port=9443) == [
        {"url": "https://10.0.0.2:9443", "tls": True}
    ]
    assert _lookup().run([PLAN], {}) == [{"url": "http://10.0.0.2:8080", "tls": False}]
    with pytest.raises(AnsibleLookupError, match=r"llmfleet\.cluster\.api_endpoint: the plan's head"):
        _lookup().run([{"head": "x", "hosts": []}], {}, tls=True)
    with pytest.raises(AnsibleLookupError, match="unknown options"):
        _lookup().run([PLAN], {}, port=1)

"""The thin WireGuard filters: they reach plugin_utils/wireguard.py and turn its errors into filter errors."""

from __future__ import annotations

import base64

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.wireguard import FilterModule as Addresses
from ansible_collections.llmfleet.cluster.plugins.filter.wireguard import FilterModule as Check
from ansible_collections.llmfleet.cluster.plugins.filter.wireguard import FilterModule as Peers

addresses = Addresses().filters()["wireguard_addresses"]
peers = Peers().filters()["wireguard_peers"]
check = Check().filters()["wireguard_check"]
K1, K2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))


def test_addresses_keep_the_current_one() -> None:
    out = addresses(["head", "w1"], "10.213.0.0/24", current={"w1": "10.213.0.77/24", "head": ""})
    assert out["w1"] == "10.213.0.77" and out["head"].startswith("10.213.0.")


def test_addresses_error_is_a_filter_error_naming_the_network() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"wireguard_addresses: .*10\.0\.0\.0/30 has 2 addresses for 3 hosts"
    ):
        addresses(["a", "b", "c"], "10.0.0.0/30")


def test_peers_from_hosts_and_an_address_map() -> None:
    hosts = {
        "head": {"public_key": K1, "endpoint": "10.89.0.2"},
        "w1": {"public_key": K2, "endpoint": "10.89.0.3"},
    }
    (peer,) = peers(
        "w1", head="head", hosts=hosts, port="51871", addresses={"head": "10.213.0.1", "w1": "10.213.0.2"}
    )
    assert peer["endpoint"] == "10.89.0.2:51871" and peer["public_key"] == K1
    with pytest.raises(AnsibleFilterError, match="wireguard_peers: the head h9"):
        peers("w1", head="h9", hosts=hosts, port=1)


def test_check_names_the_unknown_worker() -> None:
    statuses = {
        "head": {"up": True, "public_key": K1, "peers": [{"public_key": K1, "latest_handshake": 5}]},
        "w1": {"up": True, "public_key": K2, "peers": []},
    }
    out = check(statuses, head="head", workers=["w1"])
    assert out["unknown_keys"] == ["w1"] and not out["ok"]
    with pytest.raises(AnsibleFilterError, match="wireguard_check"):
        check(statuses, head="head", workers=["w1"], now="soon")

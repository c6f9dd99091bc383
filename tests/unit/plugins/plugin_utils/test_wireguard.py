"""plugins/plugin_utils/wireguard.py: tunnel addresses, peers and the check of what hosts report."""

from __future__ import annotations

import base64
import ipaddress

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.wireguard import (
    WireguardPlanError,
    check,
    peers,
    tunnel_addresses,
)


def key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


NAMES = ["head", "w1", "w2", "w3"]


def test_every_host_gets_a_distinct_usable_address_in_the_network() -> None:
    out = tunnel_addresses(NAMES, "10.213.0.0/24")
    assert sorted(out) == NAMES
    assert len(set(out.values())) == 4
    net = ipaddress.ip_network("10.213.0.0/24")
    for addr in out.values():
        ip = ipaddress.ip_address(addr)
        assert ip in net and ip not in (net.network_address, net.broadcast_address)


def test_addresses_do_not_move_when_hosts_join_or_leave() -> None:
    before = tunnel_addresses(NAMES, "10.213.0.0/24")
    after = tunnel_addresses(["w3", "head", "w9", "w1"], "10.213.0.0/24")
    for name in ("head", "w1", "w3"):
        assert after[name] == before[name]


def test_a_host_keeps_the_address_it_has_and_a_clash_moves_the_other() -> None:
    first = tunnel_addresses(NAMES, "10.213.0.0/24")
    # w1 already holds w2's computed address on its interface: w1 keeps it, w2 moves elsewhere
    out = tunnel_addresses(NAMES, "10.213.0.0/24", current={"w1": first["w2"] + "/24"})
    assert out["w1"] == first["w2"]
    assert out["w2"] != first["w2"]
    assert len(set(out.values())) == 4


def test_an_address_outside_the_network_is_not_kept() -> None:
    out = tunnel_addresses(NAMES, "10.213.0.0/24", current={"w1": "192.168.1.5", "w2": "10.213.0.255"})
    assert out["w1"].startswith("10.213.0.") and out["w2"] != "10.213.0.255"


def test_a_full_network_fills_every_usable_address() -> None:
    out = tunnel_addresses(["a", "b"], "10.0.0.0/30")
    assert sorted(out.values()) == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize(
    ("network", "words"),
    [
        ("10.213.0.0/30", "2 addresses for 4 hosts"),
        ("10.213.0.1/24", "host bits"),
        ("nonsense", "'nonsense'"),
        ("fd00::/64", "IPv4"),
        ("10.0.0.0/31", "/31"),
    ],
)
def test_bad_networks_are_refused_naming_the_value(network: str, words: str) -> None:
    with pytest.raises(WireguardPlanError, match=words.replace("/", "/").replace("(", r"\(")):
        tunnel_addresses(NAMES, network)


MESH = {
    "head": {"public_key": key(1), "address": "10.213.0.1", "endpoint": "10.89.0.2"},
    "w1": {"public_key": key(2), "address": "10.213.0.2", "endpoint": "10.89.0.3"},
    "w2": {"public_key": key(3), "address": "10.213.0.3", "endpoint": "10.89.0.4"},
}


def test_the_head_has_every_worker_and_a_worker_only_the_head() -> None:
    head = peers("head", "head", MESH, 51871)
    assert [p["name"] for p in head] == ["w1", "w2"]
    assert head[0] == {
        "name": "w1",
        "public_key": key(2),
        "allowed_ips": ["10.213.0.2/32"],
        "endpoint": "10.89.0.3:51871",
    }
    (only,) = peers("w2", "head", MESH, 51871)
    assert only["name"] == "head" and only["allowed_ips"] == ["10.213.0.1/32"]
    assert only["endpoint"] == "10.89.0.2:51871"


def test_addresses_can_come_from_a_separate_map_and_ipv6_endpoints_get_brackets() -> None:
    mesh = {n: {k: v for k, v in h.items() if k != "address"} for n, h in MESH.items()}
    mesh["head"]["endpoint"] = "fd00::2"
    (only,) = peers("w1", "head", mesh, 7, addresses={"head": "10.213.0.1", "w1": "10.213.0.2"})
    assert only["endpoint"] == "[fd00::2]:7" and only["allowed_ips"] == ["10.213.0.1/32"]


def test_a_missing_key_fails_naming_the_host_unless_allowed() -> None:
    mesh = dict(MESH, w2=dict(MESH["w2"], public_key=None))
    with pytest.raises(WireguardPlanError, match="host w2: public key None"):
        peers("head", "head", mesh, 51871)
    assert [p["name"] for p in peers("head", "head", mesh, 51871, allow_missing_keys=True)] == ["w1"]


@pytest.mark.parametrize("port", [0, 70000, "x"])
def test_bad_ports_are_refused(port: object) -> None:
    with pytest.raises(WireguardPlanError, match="port"):
        peers("head", "head", MESH, port)  # type: ignore[arg-type]


def test_a_host_without_endpoint_is_named() -> None:
    mesh = dict(MESH, w1=dict(MESH["w1"], endpoint=""))
    with pytest.raises(WireguardPlanError, match="host w1 has no endpoint"):
        peers("head", "head", mesh, 51871)


def status(pub: str, peer_keys: tuple = (), up: bool = True, handshake: int = 100) -> dict:
    return {
        "up": up,
        "public_key": pub,
        "peers": [{"public_key": k, "latest_handshake": handshake} for k in peer_keys],
    }


def test_check_passes_when_the_head_knows_every_worker() -> None:
    statuses = {"head": status(key(1), (key(2), key(3))), "w1": status(key(2)), "w2": status(key(3))}
    assert check("head", ["w1", "w2"], statuses, now=150)["ok"] is True


def test_check_names_the_worker_whose_key_the_head_does_not_know() -> None:
    statuses = {"head": status(key(1), (key(2), key(3))), "w1": status(key(2)), "w2": status(key(9))}
    out = check("head", ["w1", "w2"], statuses)
    assert out["ok"] is False and out["unknown_keys"] == ["w2"]
    assert out["problems"][0].startswith(f"w2: its public key {key(9)} is not known to the head head")


def test_check_names_hosts_that_are_down_and_stale_handshakes() -> None:
    statuses = {
        "head": status(key(1), (key(2), key(3)), handshake=0),
        "w1": status(key(2)),
        "w2": {"up": False},
    }
    out = check("head", ["w1", "w2"], statuses, now=1000)
    assert out["down"] == ["w2"] and out["stale"] == ["w1"]
    assert "w1: no handshake with the head head for ever" in out["problems"]

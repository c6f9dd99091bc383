# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The WireGuard mesh of a fleet, computed on the controller (docs/wireguard.md).

The head is the hub: it has every host of the fleet as a peer, each worker has only the head
(llama.cpp's RPC traffic runs between the head and each worker, never worker to worker).

- ``tunnel_addresses``: one address per host in the tunnel network (netaddr). A host keeps the
  address it already has when that address is still in the network and no other host holds it;
  the others get the first free address from a start that depends only on the host's name, so
  an address does not move when other hosts join or leave.
- ``peers``: the peers of one host (public key, endpoint, allowed IPs).
- ``check``: what the head and the workers report (wireguard_status) against the fleet: a worker
  whose key the head does not know, a host whose tunnel is down, a peer without a handshake.

No private key ever reaches this code: the hosts report public keys only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.module_utils.wireguard import KEY_RE

try:
    import netaddr

    HAS_NETADDR = True
except ImportError:  # pragma: no cover - netaddr is in requirements.txt
    HAS_NETADDR = False


class WireguardPlanError(ValueError):
    """An input of the mesh that cannot be used; the message names the host and the value."""


def _network(network: Any) -> "netaddr.IPNetwork":
    if not HAS_NETADDR:
        raise WireguardPlanError("the tunnel address math needs the Python package netaddr on the controller")
    try:
        net = netaddr.IPNetwork(str(network))
    except (netaddr.AddrFormatError, ValueError, TypeError):
        raise WireguardPlanError(
            "tunnel network %r is not a network (for example 10.213.0.0/24)" % (network,)
        ) from None
    if net.version != 4:
        raise WireguardPlanError("tunnel network %s: only IPv4 networks are supported" % net)
    if net.prefixlen > 30:
        raise WireguardPlanError(
            "tunnel network %s: a /%d has no room for a fleet (at most /30)" % (net, net.prefixlen)
        )
    if net.ip != net.network:
        raise WireguardPlanError("tunnel network %s has host bits set (the network is %s)" % (net, net.cidr))
    return net


def _start(name: str, size: int) -> int:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % size


def tunnel_addresses(
    names: Sequence[str], network: Any, current: Optional[Mapping[str, Any]] = None
) -> Dict[str, str]:
    """One tunnel address (no prefix) per host name.

    ``current`` maps a host to the address (with or without ``/prefix``) its interface has now;
    a host keeps it when it is a usable address of ``network`` that no other host keeps.
    """
    net = _network(network)
    first, last = net.first + 1, net.last - 1  # no network, no broadcast address
    size = last - first + 1
    hosts = sorted({str(n) for n in names})
    if len(hosts) > size:
        raise WireguardPlanError("tunnel network %s has %d addresses for %d hosts" % (net, size, len(hosts)))
    taken: Dict[int, str] = {}
    out: Dict[str, str] = {}
    for name in hosts:
        value = (current or {}).get(name)
        if not value:
            continue
        try:
            ip = netaddr.IPAddress(str(value).split("/", maxsplit=1)[0])
        except (netaddr.AddrFormatError, ValueError):
            continue
        if ip.version == 4 and first <= int(ip) <= last and int(ip) not in taken:
            taken[int(ip)] = name
            out[name] = str(ip)
    for name in hosts:
        if name in out:
            continue
        offset = _start(name, size)
        for step in range(size):
            candidate = first + (offset + step) % size
            if candidate not in taken:
                taken[candidate] = name
                out[name] = str(netaddr.IPAddress(candidate))
                break
    return out


def _key(value: Any, host: str, allow_missing: bool) -> Optional[str]:
    if value is None and allow_missing:
        return None
    if not isinstance(value, str) or not KEY_RE.match(value):
        raise WireguardPlanError("host %s: public key %r is not a WireGuard key" % (host, value))
    return value


def peers(
    name: str,
    head: str,
    hosts: Mapping[str, Mapping[str, Any]],
    port: int,
    allow_missing_keys: bool = False,
    addresses: Optional[Mapping[str, str]] = None,
) -> List[Dict[str, Any]]:
    """The peers of host ``name``: every other host for the head, the head for a worker.

    ``hosts`` maps each host to {public_key, address (tunnel), endpoint (the address its peers
    reach it by)}; ``addresses`` (host -> tunnel address) fills in the address. A peer without a key is left out when ``allow_missing_keys`` (check mode, the
    key not made yet); otherwise it is an error naming the host.
    """
    if head not in hosts:
        raise WireguardPlanError(
            "the head %s is not among the tunnel's hosts (%s)" % (head, ", ".join(sorted(hosts)))
        )
    if name not in hosts:
        raise WireguardPlanError("host %s is not among the tunnel's hosts" % name)
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise WireguardPlanError("tunnel port %r is not a number" % (port,)) from None
    if not 1 <= port <= 65535:
        raise WireguardPlanError("tunnel port %d is not in 1-65535" % port)
    others = sorted(h for h in hosts if h != name) if name == head else [head]
    out = []
    for other in others:
        info = hosts[other]
        key = _key(info.get("public_key"), other, allow_missing_keys)
        if key is None:
            continue
        address = info.get("address") or (addresses or {}).get(other)
        endpoint = info.get("endpoint")
        if not address:
            raise WireguardPlanError("host %s has no tunnel address" % other)
        if not endpoint:
            raise WireguardPlanError(
                "host %s has no endpoint address (wireguard_endpoint, or a default IPv4 route)" % other
            )
        ep = str(endpoint)
        if ":" in ep and not ep.startswith("["):
            ep = "[%s]" % ep
        out.append(
            {
                "name": other,
                "public_key": key,
                "allowed_ips": ["%s/32" % netaddr.IPAddress(str(address))],
                "endpoint": "%s:%d" % (ep, port),
            }
        )
    return out


def check(
    head: str,
    workers: Sequence[str],
    statuses: Mapping[str, Optional[Mapping[str, Any]]],
    now: Optional[int] = None,
    max_handshake_age: int = 180,
) -> Dict[str, Any]:
    """The tunnel as the hosts report it (wireguard_status) against the fleet.

    Returns {ok, unknown_keys: [worker], down: [host], stale: [worker], problems: [text]}:
    ``unknown_keys`` are workers whose public key the head does not have as a peer,
    ``down`` hosts whose interface is not up, ``stale`` workers the head has not shaken hands
    with within ``max_handshake_age`` seconds (when ``now`` is given).
    """
    problems: List[str] = []
    down = [h for h in [head, *list(workers)] if not (statuses.get(h) or {}).get("up")]
    for host in down:
        problems.append("%s: the WireGuard interface is not up" % host)
    head_status = statuses.get(head) or {}
    head_peers = {p.get("public_key"): p for p in head_status.get("peers") or []}
    unknown: List[str] = []
    stale: List[str] = []
    if head not in down:
        for worker in workers:
            key = (statuses.get(worker) or {}).get("public_key")
            if worker in down or not key:
                continue
            peer = head_peers.get(key)
            if peer is None:
                unknown.append(worker)
                problems.append(
                    "%s: its public key %s is not known to the head %s: it cannot reach the head, "
                    "nor the head it (run site.yml, or wireguard_rotate.yml)" % (worker, key, head)
                )
                continue
            handshake = int(peer.get("latest_handshake") or 0)
            if now is not None and (handshake == 0 or int(now) - handshake > max_handshake_age):
                stale.append(worker)
                problems.append(
                    "%s: no handshake with the head %s for %s"
                    % (worker, head, "ever" if handshake == 0 else "%d s" % (int(now) - handshake))
                )
    return {"ok": not problems, "unknown_keys": unknown, "down": down, "stale": stale, "problems": problems}

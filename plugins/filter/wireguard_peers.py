# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: wireguard_peers
short_description: The WireGuard peers of one host (the head has every host, a worker the head)
version_added: 1.0.0
description:
  - Returns the peers of host O(_input) with their public key, allowed IP (the peer's tunnel
    address as a /32) and endpoint (the address its peers reach it by, and O(port)).
  - The logic lives in C(plugins/plugin_utils/wireguard.py).
options:
  _input:
    description: The host whose peers are wanted.
    type: str
    required: true
  head:
    description: The head's host name.
    type: str
    required: true
  hosts:
    description: Host -> C({public_key, address, endpoint}).
    type: dict
    required: true
  addresses:
    description: Host -> tunnel address (C(llmfleet.cluster.wireguard_addresses)), for hosts without C(address).
    type: dict
    default: {}
  port:
    description: The tunnel's UDP port.
    type: int
    required: true
  allow_missing_keys:
    description: Leave out peers without a public key (check mode, keys not made yet) instead of failing.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Peers of this host
  ansible.builtin.set_fact:
    _peers: "{{ inventory_hostname | llmfleet.cluster.wireguard_peers(head='head', hosts=_mesh, port=51871) }}"
"""

RETURN = r"""
_value:
  description: C({name, public_key, allowed_ips, endpoint}) per peer, sorted by name (the head for a worker).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.wireguard import (
    WireguardPlanError,
    peers,
)


def wireguard_peers(name, head, hosts, port, allow_missing_keys=False, addresses=None):
    try:
        return peers(
            str(name),
            str(head),
            dict(hosts),
            port,
            allow_missing_keys=bool(allow_missing_keys),
            addresses=dict(addresses or {}),
        )
    except WireguardPlanError as exc:
        raise AnsibleFilterError("wireguard_peers: %s" % exc) from exc


class FilterModule(object):
    def filters(self):
        return {"wireguard_peers": wireguard_peers}

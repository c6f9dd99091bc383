# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: wireguard_addresses
short_description: One WireGuard tunnel address per host of the fleet
version_added: 1.0.0
description:
  - Gives each host an address in O(network). A host keeps the address its interface already has
    (O(current)) while it is in the network and no other host keeps it; the others get the first
    free address from a start that depends only on the host's name, so addresses do not move when
    hosts join or leave.
  - The logic lives in C(plugins/plugin_utils/wireguard.py) (netaddr).
options:
  _input:
    description: The host names.
    type: list
    elements: str
    required: true
  network:
    description: The tunnel network (IPv4, at most a /30).
    type: str
    required: true
  current:
    description: Host -> the address (with or without C(/prefix)) its interface has now.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Tunnel addresses
  ansible.builtin.set_fact:
    _addresses: "{{ ['head', 'w1'] | llmfleet.cluster.wireguard_addresses('10.213.0.0/24') }}"
"""

RETURN = r"""
_value:
  description: Host -> address (no prefix).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.wireguard import (
    WireguardPlanError,
    tunnel_addresses,
)


def wireguard_addresses(names, network, current=None):
    try:
        return tunnel_addresses(list(names), network, dict(current or {}))
    except WireguardPlanError as exc:
        raise AnsibleFilterError("wireguard_addresses: %s" % exc) from exc


class FilterModule(object):
    def filters(self):
        return {"wireguard_addresses": wireguard_addresses}

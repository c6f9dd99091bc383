# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the WireGuard stage (roles/wireguard; docs/wireguard.md).

Thin wrappers over plugins/plugin_utils and plugins/module_utils. Each filter's documentation is
its sidecar file beside this one (plugins/filter/<name>.yml: ``ansible-doc -t filter
llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.wireguard import (
    WireguardPlanError,
    check,
    peers,
    tunnel_addresses,
)


def wireguard_addresses(names, network, current=None):
    try:
        return tunnel_addresses(list(names), network, dict(current or {}))
    except WireguardPlanError as exc:
        raise AnsibleFilterError("wireguard_addresses: %s" % exc) from exc


def wireguard_check(statuses, head, workers, now=None, max_handshake_age=180):
    try:
        return check(
            str(head),
            [str(w) for w in workers],
            dict(statuses or {}),
            now=None if now is None else int(now),
            max_handshake_age=int(max_handshake_age),
        )
    except (WireguardPlanError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("wireguard_check: %s" % exc) from exc


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
        return {
            "wireguard_addresses": wireguard_addresses,
            "wireguard_check": wireguard_check,
            "wireguard_peers": wireguard_peers,
        }

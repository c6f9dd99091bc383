# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: wireguard_check
short_description: The fleet's tunnel as its hosts report it, with the workers the head does not know
version_added: 1.0.0
description:
  - Compares what C(llmfleet.cluster.wireguard_status) reports on the head and the workers - a
    worker whose public key is not among the head's peers, a host whose interface is down, a
    worker without a recent handshake.
  - The logic lives in C(plugins/plugin_utils/wireguard.py).
options:
  _input:
    description: Host -> the C(wireguard) result of C(llmfleet.cluster.wireguard_status).
    type: dict
    required: true
  head:
    description: The head's host name.
    type: str
    required: true
  workers:
    description: The workers that must be reachable through the tunnel.
    type: list
    elements: str
    required: true
  now:
    description: Unix time, to judge the handshakes (none - not judged).
    type: int
  max_handshake_age:
    description: Seconds since the last handshake beyond which a worker counts as stale.
    type: int
    default: 180
"""

EXAMPLES = r"""
- name: Check the tunnel
  ansible.builtin.set_fact:
    _tunnel: "{{ _statuses | llmfleet.cluster.wireguard_check(head='head', workers=['w1', 'w2']) }}"
"""

RETURN = r"""
_value:
  description: C({ok, unknown_keys, down, stale, problems}); each problem names the host.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.wireguard import (
    WireguardPlanError,
    check,
)


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


class FilterModule(object):
    def filters(self):
        return {"wireguard_check": wireguard_check}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: plan_hosts
short_description: Placement hosts from the inventory and the probe facts
version_added: 1.0.0
description:
  - For each host name, reads C(llmfleet_host) (the probe fact or the inventory's what-if value),
    C(llmfleet_rpc_address) (default the probe's C(default_ipv4)), C(llmfleet_rpc_port)
    (default O(port)), C(llmfleet_reserve_mib) and C(llmfleet_speed) from O(hostvars) and returns
    the host dicts the M(llmfleet.cluster.gguf_layout) / P(llmfleet.cluster.plan_placement#filter) pair expects.
  - A port outside 1-65535 (C(llmfleet_rpc_port) or O(port), 0 included) is refused naming the host,
    never replaced by the default.
  - With O(speeds), a host named there carries that dict as C(speed) (C(ms_per_layer), C(rtt_ms),
    C(mbit_s), the C(speed) of P(llmfleet.cluster.profile_speed#filter)) in place of the
    C(llmfleet_speed) number.
options:
  _input:
    description: Inventory host names.
    type: list
    elements: str
    required: true
  hostvars:
    description: Ansible's C(hostvars).
    type: raw
    required: true
  port:
    description: RPC port of hosts that set no C(llmfleet_rpc_port).
    type: int
    default: 50052
  speeds:
    description: Host name -> measured speed figures (the C(speed) of P(llmfleet.cluster.profile_speed#filter)).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Workers for the planner
  ansible.builtin.debug:
    msg: "{{ groups['llm_workers'] | llmfleet.cluster.plan_hosts(hostvars=hostvars) }}"
"""

RETURN = r"""
_value:
  description:
    - Dicts with C(name), C(usable_mib), C(cpus), C(address), C(port) and, when set, C(reserve_mib) and
      C(speed) (a number from C(llmfleet_speed), or the dict of O(speeds)).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import host_from_fact
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import PlanInputError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import port as check_port


def _get(hv, key):
    try:
        value = hv[key]
    except (KeyError, TypeError):
        return None
    return value


def plan_hosts(names, hostvars, port=50052, speeds=None):
    out = []
    for name in names or []:
        try:
            hv = hostvars[name]
        except KeyError as err:
            raise AnsibleFilterError("plan_hosts: host %s is not in the inventory" % name) from err
        try:
            rpc_port = _get(hv, "llmfleet_rpc_port")
            # 0 is refused like 70000, not taken for "unset" (only an absent value is)
            rpc_port = check_port(port if rpc_port is None else rpc_port, "host %s" % name)
            out.append(
                host_from_fact(
                    str(name),
                    _get(hv, "llmfleet_host"),
                    address=_get(hv, "llmfleet_rpc_address"),
                    port=rpc_port,
                    reserve_mib=_get(hv, "llmfleet_reserve_mib"),
                    speed=_get(hv, "llmfleet_speed"),
                )
            )
        except (PlanInputError, TypeError, ValueError) as err:
            raise AnsibleFilterError("plan_hosts: %s" % err) from err
        if speeds and isinstance(speeds.get(name), dict):
            out[-1]["speed"] = dict(speeds[name])
    return out


class FilterModule(object):
    def filters(self):
        return {"plan_hosts": plan_hosts}

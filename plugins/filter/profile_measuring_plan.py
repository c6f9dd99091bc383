# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: profile_measuring_plan
short_description: the served plan changed so that one request measures every host's compute
version_added: 1.0.0
description:
  - Gives each worker the served plan leaves out a few repeating layers (from the head's CPU, then
    from the worker with the most layers) at the front of the C(--rpc) list; every other host keeps
    its layers, the output layer stays where it is.
  - Adds C(--poll 0) so that llama-server's CPU threads sleep while they wait for the workers
    (their CPU seconds are then their work, not spinning).
  - No fallbacks (the measuring run needs every host). The logic lives in
    C(plugins/plugin_utils/measuring.py) (the split through C(plan.Plan.with_split)); see docs/profile.md.
options:
  _input:
    description: The served plan (plan.json).
    type: dict
    required: true
  add:
    description: Workers to add (each must be in the plan's C(planned_with.hosts) with an address).
    type: list
    elements: str
    default: []
  layers_each:
    description: Repeating layers each added worker gets.
    type: int
    default: 2
  request:
    description:
      - C(0) the measuring placement as above; C(1) the first measuring request's (the output
        layer on the head, moved there when the head can take it); C(2) the second's (the output
        layer on a worker, one without a CPU quota first); C(3) the third's (on the quota'd
        worker with the most room). An empty dict where the plan's memory figures fit no such
        placement (docs/profile.md).
    type: int
    default: 0
    choices: [0, 1, 2, 3]
  quotas:
    description: Host name -> its CPU quota in CPUs (C(llmfleet_host.cpu_quota)), for O(request) 2 and 3.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Make the measuring placement
  ansible.builtin.set_fact:
    measuring: "{{ llmfleet_plan | llmfleet.cluster.profile_measuring_plan(add=['wifi']) }}"

- name: The second measuring request's placement (empty when the output layer fits on one side only)
  ansible.builtin.set_fact:
    moved: "{{ llmfleet_plan | llmfleet.cluster.profile_measuring_plan(add=['wifi'], request=2) }}"
"""

RETURN = r"""
_value:
  description: A plan the supervisor serves, with C(hosts[].layers) of the measuring split and C(measuring).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.measuring import (
    MEASURE_LAYERS,
    measuring_placements,
    measuring_plan,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import ProfileError


def profile_measuring_plan(plan, add=None, layers_each=MEASURE_LAYERS, request=0, quotas=None):
    try:
        measuring = measuring_plan(plan or {}, [str(a) for a in add or []], int(layers_each))
        if int(request) == 0:
            return measuring
        if int(request) not in (1, 2, 3):
            raise ProfileError("request must be 0, 1, 2 or 3, got %r" % (request,))
        placements = measuring_placements(measuring, quotas or {})
        return placements[int(request) - 1] if int(request) <= len(placements) else {}
    except ProfileError as err:
        raise AnsibleFilterError("profile_measuring_plan: %s" % err) from err
    except (TypeError, ValueError, AttributeError) as err:
        raise AnsibleFilterError("profile_measuring_plan: malformed plan: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"profile_measuring_plan": profile_measuring_plan}

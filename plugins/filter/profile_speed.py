# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: profile_speed
short_description: The planner's per-host speed figures from profile.json and the inventory
version_added: 1.0.0
description:
  - For each host name, the C(speed) dict the planner reads - C(ms_per_layer) (decode ms per
    layer per token of this model on that host) and, for a worker, C(rtt_ms) and C(mbit_s) of its
    link to the head.
  - From the host's inventory variable C(llmfleet_profile) when set (what-if hosts, or figures
    a user knows), else from O(profile) (C(profile.json) written by C(playbooks/profile.yml)).
  - Figures of the profile that are stale (the host's fingerprint, the llama.cpp build or the
    model's sha256 changed), zero, negative, not finite, above sane bounds, or a 0 Mbit link
    are not used - the host is listed in C(remeasure) with the reason. Such figures in
    C(llmfleet_profile) fail the filter naming the host and the value.
  - The logic lives in C(plugins/plugin_utils/profile.py); docs/profile.md describes the profile.
options:
  _input:
    description: Inventory host names (the head and the candidate workers).
    type: list
    elements: str
    required: true
  head:
    description: The head's host name (it has no link figures).
    type: str
    required: true
  hostvars:
    description: Ansible's C(hostvars) (C(llmfleet_host) for fingerprints, C(llmfleet_profile)).
    type: raw
    required: true
  profile:
    description: The parsed C(profile.json); empty when there is none.
    type: dict
    default: {}
  build:
    description: The llama.cpp build being planned for (C(llama_cpp_build)); empty skips the check.
    type: str
    default: ""
  model_sha256:
    description: The model's sha256; empty skips the check.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Speed figures of the fleet
  ansible.builtin.set_fact:
    fleet_speed: >-
      {{ groups['llm_head'] + groups['llm_workers'] | llmfleet.cluster.profile_speed(
           head=groups['llm_head'][0], hostvars=hostvars, profile=profile,
           build=llama_cpp_build, model_sha256=llmfleet_model.sha256) }}
"""

RETURN = r"""
_value:
  description: >-
    C(speed) (host -> C(ms_per_layer), C(rtt_ms), C(mbit_s)), C(source) (host -> C(profile) or
    C(inventory)) and C(remeasure) (one sentence per host whose figures were not used).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import ProfileError, speeds


def _get(hv, key):
    try:
        return hv[key]
    except (KeyError, TypeError):
        return None


def profile_speed(names, head, hostvars, profile=None, build="", model_sha256=""):
    facts, given = {}, {}
    for name in names or []:
        try:
            hv = hostvars[name]
        except KeyError as err:
            raise AnsibleFilterError("profile_speed: host %s is not in the inventory" % name) from err
        facts[name] = _get(hv, "llmfleet_host")
        given[name] = _get(hv, "llmfleet_profile")
    try:
        return speeds(
            list(names or []), head, profile or None, facts, given, build or "", model_sha256 or None
        )
    except ProfileError as err:
        raise AnsibleFilterError("profile_speed: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"profile_speed": profile_speed}

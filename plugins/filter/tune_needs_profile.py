# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: tune_needs_profile
short_description: Whether tune.yml measures the fleet (profile.yml) before it re-plans
version_added: 1.0.0
description:
  - C(auto) measures unless every host of the running plan (the input) has usable figures in
    O(figures) (C(llmfleet.cluster.profile_speed) of C(profile.json)); a second run on a tuned
    fleet then reuses them and restarts nothing. C(always) measures, C(never) reuses
    C(profile.json) as it is.
  - C(reason) names the hosts without usable figures and why.
options:
  figures:
    description: The result of C(llmfleet.cluster.profile_speed) for the plan's hosts (C(speed), C(remeasure)).
    type: dict
    required: true
  mode:
    description: C(auto), C(always) or C(never) (C(tune_profile)).
    type: str
    default: auto
extends_documentation_fragment:
  - llmfleet.cluster.tune
"""

EXAMPLES = r"""
- name: Decide whether to measure
  ansible.builtin.set_fact:
    measure: >-
      {{ running_plan | llmfleet.cluster.tune_needs_profile(figures=figures, mode='auto') }}
"""

RETURN = r"""
_value:
  description: C(measure) (bool) and C(reason) (a sentence).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.tune import TuneError, needs_profile


def tune_needs_profile(plan, figures, mode="auto"):
    try:
        return needs_profile(plan or {}, figures or {}, mode)
    except (TuneError, ValueError) as err:
        raise AnsibleFilterError("tune_needs_profile: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"tune_needs_profile": tune_needs_profile}

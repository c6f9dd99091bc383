# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: tune_report
short_description: tune.json and the before/after table from tune.yml's measured rounds
version_added: 1.0.0
description:
  - Each side (C(before), the plan that ran; C(after), the plan the fleet ends on) gets the median
    measured output tokens/s and time to first token over its rounds, its predicted tokens/s and its
    C(llama_server_args); C(ratio) is after / before, measured. The rounds alternate the two plans
    (before, after, before, after) so that the machine's drift weighs on both.
  - Without a redeploy, C(after) is the running plan and its rounds.
  - A round whose median is missing, zero or not finite fails the filter naming the round.
  - The logic lives in C(plugins/plugin_utils/tune.py); docs/tune.md describes tune.json.
options:
  _input:
    description: The decision of C(llmfleet.cluster.tune_decide).
    type: dict
    required: true
  before:
    description: The plan that was running.
    type: dict
    required: true
  after:
    description: The speed plan.
    type: dict
    required: true
  rounds:
    description: One C({plan, summary}) per measured round, C(summary) from C(llmfleet.cluster.api_bench).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Make tune.json
  ansible.builtin.set_fact:
    tune: "{{ decision | llmfleet.cluster.tune_report(before=running, after=llmfleet_plan, rounds=rounds) }}"
"""

RETURN = r"""
_value:
  description: >-
    C(before) and C(after) (tokens_per_second, ttft_s, predicted_tokens_per_second,
    llama_server_args, rounds), C(predicted_tokens_per_second) (before, after), C(ratio),
    C(redeployed), C(predicted_gain), C(min_gain), C(reason), C(rounds) and C(table) (lines).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.tune import TuneError, report


def tune_report(decision, before, after, rounds):
    try:
        return report(decision or {}, before or {}, after or {}, list(rounds or []))
    except (TuneError, KeyError, ValueError) as err:
        raise AnsibleFilterError("tune_report: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"tune_report": tune_report}

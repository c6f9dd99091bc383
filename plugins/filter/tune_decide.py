# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: tune_decide
short_description: Whether tune.yml redeploys the speed plan (its predicted gain over the running plan)
version_added: 1.0.0
description:
  - Predicts the tokens/s of the running plan (the input) and of the speed plan (O(after)) with
    the same, current speed figures (O(speed)) and the planner's time model
    (C(plugins/plugin_utils/speed.py)); the running plan's own C(speed) may be null (planned by
    memory) or computed with older figures.
  - C(redeploy) is true only when the speed plan has other llama-server arguments and its
    predicted gain is above O(min_gain); C(reason) says which, with both figures.
options:
  after:
    description: The speed plan computed with the current figures (C(llmfleet_plan) of the plan role).
    type: dict
    required: true
  speed:
    description: Host -> speed figures (C(speed) of C(llmfleet.cluster.profile_speed)).
    type: dict
    required: true
  layout:
    description: The model's layout (C(llmfleet.cluster.gguf_layout)).
    type: dict
    required: true
  min_gain:
    description: The predicted gain (a fraction, 0.10 = 10 %) the speed plan must exceed.
    type: float
    default: 0.10
  previous:
    description:
      - The last run's C(tune.json), or null. When it measured this same speed plan against this
        same running plan and did not keep it, the speed plan is not redeployed again.
    type: raw
    default: null
extends_documentation_fragment:
  - llmfleet.cluster.tune
"""

EXAMPLES = r"""
- name: Decide
  ansible.builtin.set_fact:
    decision: >-
      {{ running_plan | llmfleet.cluster.tune_decide(after=llmfleet_plan, speed=__plan_speed.speed,
                                                     layout=__plan_layout.layout, min_gain=0.10) }}
"""

RETURN = r"""
_value:
  description: >-
    C(redeploy) (bool), C(head_only) (the plans start the same workers the same way: serving one is
    the head's plan.json and a restart), C(gain) (predicted after / before - 1), C(min_gain), C(predicted_before)
    and C(predicted_after) (tokens_per_second, ms_per_token, ttft_s, bottleneck, hosts, links),
    C(schedule) (the measured rounds - before, after, before, after - or only before) and C(reason).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.tune import TuneError, decide


def tune_decide(before, after, speed, layout, min_gain=0.10, previous=None):
    try:
        return decide(before or {}, after or {}, speed or {}, layout or {}, min_gain, previous or None)
    except (TuneError, ValueError) as err:
        raise AnsibleFilterError("tune_decide: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"tune_decide": tune_decide}

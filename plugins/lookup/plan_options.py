# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: plan_options
short_description: The planner's options the inventory sets through fleet-wide settings
version_added: 1.1.0
description:
  - Returns one dict, option name -> value, of every planner option whose fleet-wide setting
    (C(llmfleet_context), C(llmfleet_plan_objective), ...) the play defines, read as the option's
    type; an option the play does not set is left out (the planner's default holds).
  - The options, their settings, defaults and bounds are one table, C(Options) in
    C(plugins/plugin_utils/placement_hosts.py); the plan role reads this lookup, so an option added
    to the table reaches the planner with no role variable of its own (C(plan_options) overrides any
    of them for one run).
  - A value that is not of the option's type fails naming the setting.
options: {}
"""

EXAMPLES = r"""
- name: The planner's options as the inventory sets them
  ansible.builtin.debug:
    msg: "{{ lookup('llmfleet.cluster.plan_options') }}"
"""

RETURN = r"""
_raw:
  description: One dict, option name -> value.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import planner_options
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import PlanInputError


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}

        def value(name):
            if name not in variables:
                return None
            return self._templar.template(variables[name])

        try:
            return [planner_options(value)]
        except PlanInputError as e:
            raise AnsibleLookupError("llmfleet.cluster.plan_options: %s" % e) from None

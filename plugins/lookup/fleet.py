# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: fleet
short_description: A fleet-wide setting (llmfleet_*), the inventory's value or its one default
version_added: 1.1.0
description:
  - Returns the value of a fleet-wide setting - the variable's value when the play defines it
    (inventory, extra vars, play or role variables), else its default, written once in
    C(plugins/plugin_utils/fleet_defaults.py) beside the target registry.
  - "The settings and their defaults: C(llmfleet_target) V(systemd), C(llmfleet_backend) V(llama_cpp),
    C(llmfleet_output_dir) V(build), C(llmfleet_render_only) V(false), C(llmfleet_kubeconfig) V(''),
    C(llmfleet_tls) V(true) when C(chat_ui_password) is set else V(false), C(llmfleet_wireguard) V(true), C(llmfleet_site_verify) V(true),
    C(llmfleet_dedicated) V(false), C(llmfleet_node_labels) V({}), C(llmfleet_node_taints) V([]),
    C(llmfleet_llama_cpp_env) V({}),
    C(llmfleet_model) V({}), C(llmfleet_reserve_mib) V(64), C(llmfleet_lock) V({}),
    C(llmfleet_lock_file) (C(<inventory_dir>/group_vars/all/llmfleet_lock.yml)),
    C(llmfleet_lock_max_json_bytes) V(8388608), C(llmfleet_lock_max_download_bytes) V(1073741824),
    C(llmfleet_github_api) V(https://api.github.com), C(llmfleet_hf_endpoint) (C(HF_ENDPOINT) from the
    environment, else V(https://huggingface.co); an empty value counts as unset)."
  - The planner's options (C(llmfleet_context), C(llmfleet_plan_objective), ...) are settings too;
    their defaults are the planner's one options table, C(Options) in
    C(plugins/plugin_utils/placement_hosts.py), listed in docs/planner.md (Inputs).
  - A name that is not a fleet-wide setting fails naming it and the known ones.
options:
  _terms:
    description: The settings' names (C(llmfleet_output_dir), ...).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Where the plan is
  ansible.builtin.debug:
    msg: "{{ lookup('llmfleet.cluster.fleet', 'llmfleet_output_dir') }}/plan.json"
"""

RETURN = r"""
_raw:
  description: The value of each setting.
  type: list
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.fleet_defaults import (
    FleetSettingError,
    setting,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}

        def value(name):
            if name not in variables:
                return None
            return self._templar.template(variables[name])

        try:
            return [setting(term, value) for term in terms]
        except FleetSettingError as e:
            raise AnsibleLookupError("llmfleet.cluster.fleet: %s" % e) from None

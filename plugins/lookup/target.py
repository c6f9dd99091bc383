# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: target
short_description: The registry entry of a deployment target (what it deploys, with which role, under which names)
version_added: 1.1.0
description:
  - Returns, for a value of C(llmfleet_target), the one entry of the collection's target registry
    (C(plugins/plugin_utils/targets.py)) - the role and playbook that deploy it, whether it runs on
    the hosts or in a cluster, which of site.yml's steps run for it, and the names other roles
    reach its API by (namespace, Service, port, API key Secret).
  - A name the deploying role lets the inventory change (for example C(vllm_lws_namespace)) is
    that variable's value when the play defines it, else the role's default.
  - An unknown target fails naming the value and the known targets.
options:
  _terms:
    description: The targets (C(systemd), C(kubernetes), C(lws)); none - every target, in the registry's order.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: The namespace of the server the chat page fronts
  ansible.builtin.debug:
    msg: "{{ lookup('llmfleet.cluster.target', llmfleet_target).namespace }}"

- name: Every known target
  ansible.builtin.debug:
    msg: "{{ query('llmfleet.cluster.target') | map(attribute='name') }}"
"""

RETURN = r"""
_raw:
  description:
    - The entry (C(name), C(backend), C(role), C(playbook), C(kubernetes), C(on_hosts), C(tunnel),
      C(site_chat_ui), C(site_verify), C(plan_hosts), C(targets) - every known target -, C(namespace),
      C(service), C(port), C(api_key_secret), C(api_key_file), C(upstream_url)).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.targets import TargetError, names, resolve


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}

        def value(name):
            if name not in variables:
                return None
            return self._templar.template(variables[name])

        try:
            return [resolve(term, value) for term in (terms or names())]
        except TargetError as e:
            raise AnsibleLookupError("llmfleet.cluster.target: %s" % e) from None

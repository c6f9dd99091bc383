# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: scrape_targets
short_description: Prometheus file_sd target lists (llama-server or vLLM, node-exporter) from the plan
version_added: 1.0.0
description:
  - Returns, per scrape job of C(roles/monitoring/templates/prometheus-scrape.yml.j2), the content of its
    file_sd JSON file - the head's API for C(llama-server) (backend C(llama_cpp)) or C(vllm), and
    node-exporter on every plan host for C(node) - labelled with the fleet, host and role.
  - The logic lives in C(plugins/module_utils/monitoring.py).
options:
  _input:
    description: The plan (C(llmfleet_plan)).
    type: dict
    required: true
  api_port:
    description: Port of the head's API.
    type: int
    default: 8080
  node_port:
    description: Port of node-exporter on every host.
    type: int
    default: 9100
  fleet:
    description: Value of the C(fleet) label.
    type: str
    default: llmfleet
  addresses:
    description:
      - Host -> the address Prometheus reaches it by, in place of its plan address (with WireGuard
        the workers' plan addresses are tunnel addresses).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Write the node-exporter targets
  ansible.builtin.copy:
    content: "{{ (llmfleet_plan | llmfleet.cluster.scrape_targets)['node'] | to_nice_json }}"
    dest: /etc/prometheus/llmfleet/node.json
    mode: "0644"
"""

RETURN = r"""
_value:
  description: Job (C(llama-server), C(vllm), C(node)) -> list of C({targets, labels}).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils.monitoring import (
    MonitoringError,
)
from ansible_collections.llmfleet.cluster.plugins.module_utils.monitoring import (
    scrape_targets as _scrape_targets,
)


def scrape_targets(plan, api_port=8080, node_port=9100, fleet="llmfleet", addresses=None):
    try:
        return _scrape_targets(
            plan,
            api_port=int(api_port),
            node_port=int(node_port),
            fleet=str(fleet),
            addresses=dict(addresses or {}),
        )
    except MonitoringError as exc:
        raise AnsibleFilterError("scrape_targets: {0}".format(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {"scrape_targets": scrape_targets}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_node_labels
short_description: Kubernetes node labels for a host, from the probe fact and the plan
version_added: 1.0.0
description:
  - Computes the labels a fleet host's Kubernetes Node should carry, from the probe fact
    C(llmfleet_host), the plan C(llmfleet_plan) and inventory labels.
  - C(llmfleet.io/arch) (kube_arch), C(llmfleet.io/role) (head or worker), C(llmfleet.io/rpc=true)
    on hosts that hold layers in the plan, C(llmfleet.io/usable-mib), and Node Feature Discovery
    style CPU labels C(feature.node.kubernetes.io/cpu-cpuid.<FLAG>=true) (AVX512F, AVX512VNNI, ASIMD, ...).
  - The logic lives in C(plugins/plugin_utils/k8s_labels.py).
options:
  _input:
    description: The host's C(llmfleet_host) fact (needs C(kube_arch); uses C(isa) and C(memory.usable_mib)).
    type: dict
    required: true
  name:
    description: The host's inventory name, to find it in C(plan.hosts) and to name it in errors.
    type: str
    required: true
  plan:
    description: The plan (C(llmfleet_plan)); without it no C(llmfleet.io/rpc) label is set.
    type: dict
  role:
    description: Inventory role (C(head) or C(worker)) used when the plan does not list the host.
    type: str
  extra:
    description: Labels from the inventory; they may not override the computed C(llmfleet.io/) labels.
    type: dict
"""

EXAMPLES = r"""
- name: Show the labels of this host
  ansible.builtin.debug:
    msg: "{{ llmfleet_host | llmfleet.cluster.k8s_node_labels(name=inventory_hostname, plan=llmfleet_plan) }}"
"""

RETURN = r"""
_value:
  description: Labels, key -> string value, sorted by key.
  type: dict
  sample: {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true", "llmfleet.io/arch": "amd64",
           "llmfleet.io/role": "worker", "llmfleet.io/rpc": "true", "llmfleet.io/usable-mib": "3900"}
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_labels import LabelError, node_labels


def k8s_node_labels(host_fact, name, plan=None, role=None, extra=None):
    try:
        return node_labels(host_fact, name, plan=plan, role=role, extra=extra)
    except LabelError as exc:
        raise AnsibleFilterError("k8s_node_labels: {0}".format(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {"k8s_node_labels": k8s_node_labels}

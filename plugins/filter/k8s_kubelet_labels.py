# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_kubelet_labels
short_description: The node labels a kubelet may set on its own Node at registration
version_added: 1.0.0
description:
  - Drops C(llmfleet.io/rpc) and C(llmfleet.io/usable-mib), which change with the plan and with free
    memory, and a change in k3s' registration config would restart k3s; the API carries them.
  - Keeps the labels a kubelet (k3s C(node-label)) may register itself with. The NodeRestriction
    admission plugin refuses labels in the C(kubernetes.io) and C(k8s.io) namespaces except a fixed
    list, so Node Feature Discovery style labels (C(feature.node.kubernetes.io/...)) are dropped here
    and set through the API by the C(llmfleet.cluster.node_labels) role instead.
options:
  _input:
    description: Labels, key -> value (the output of C(llmfleet.cluster.k8s_node_labels)).
    type: dict
    required: true
  style:
    description: C(dict) for a label dict, C(k3s) for C(key=value) strings (k3s' C(node-label) option).
    type: str
    choices: [dict, k3s]
    default: dict
"""

EXAMPLES = r"""
- name: Labels for k3s' node-label option
  ansible.builtin.debug:
    msg: "{{ labels | llmfleet.cluster.k8s_kubelet_labels }}"
"""

RETURN = r"""
_value:
  description: The labels a kubelet may set, key -> value, or C(key=value) strings with O(style=k3s).
  type: raw
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_labels import kubelet_labels, label_strings


def k8s_kubelet_labels(labels, style="dict"):
    if not isinstance(labels, dict):
        raise AnsibleFilterError("k8s_kubelet_labels: expected a dict of labels, got {0!r}".format(labels))
    if style not in ("dict", "k3s"):
        raise AnsibleFilterError("k8s_kubelet_labels: style {0!r} is not one of dict, k3s".format(style))
    kept = kubelet_labels(labels)
    return label_strings(kept) if style == "k3s" else kept


class FilterModule(object):
    def filters(self):
        return {"k8s_kubelet_labels": k8s_kubelet_labels}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_node_taints
short_description: Kubernetes node taints for a host, validated
version_added: 1.0.0
description:
  - Returns the taints a fleet host's Node should carry, C(llmfleet.io/dedicated=true:NoSchedule)
    when O(dedicated) is true, plus the inventory's own taints, validated and sorted.
  - With O(style=k3s) returns C(key=value:Effect) strings for k3s' C(node-taint) option.
options:
  _input:
    description: The inventory's taints, each a dict with C(key), C(value) and C(effect).
    type: list
    elements: dict
    required: true
  name:
    description: The host's inventory name, for error messages.
    type: str
    default: ""
  dedicated:
    description: Add the C(llmfleet.io/dedicated=true:NoSchedule) taint.
    type: bool
    default: false
  style:
    description: C(dict) for Kubernetes taint objects, C(k3s) for C(key=value:Effect) strings.
    type: str
    choices: [dict, k3s]
    default: dict
"""

EXAMPLES = r"""
- name: Taints for the k3s config
  ansible.builtin.debug:
    msg: "{{ [] | llmfleet.cluster.k8s_node_taints(name=inventory_hostname, dedicated=true, style='k3s') }}"
  # -> ["llmfleet.io/dedicated=true:NoSchedule"]
"""

RETURN = r"""
_value:
  description: Taints as dicts (key, value, effect) or as k3s strings.
  type: list
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_labels import (
    LabelError,
    node_taints,
    taint_strings,
)


def k8s_node_taints(extra, name="", dedicated=False, style="dict"):
    if style not in ("dict", "k3s"):
        raise AnsibleFilterError("k8s_node_taints: style {0!r} is not one of dict, k3s".format(style))
    if extra is not None and not isinstance(extra, list):
        raise AnsibleFilterError(
            "k8s_node_taints: host {0}: taints must be a list, got {1!r}".format(name, extra)
        )
    try:
        taints = node_taints(name=name, dedicated=bool(dedicated), extra=extra)
    except LabelError as exc:
        raise AnsibleFilterError("k8s_node_taints: {0}".format(exc)) from exc
    return taint_strings(taints) if style == "k3s" else taints


class FilterModule(object):
    def filters(self):
        return {"k8s_node_taints": k8s_node_taints}

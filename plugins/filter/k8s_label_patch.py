# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_label_patch
short_description: A JSON merge patch that brings a Node's labels to the desired set
version_added: 1.0.0
description:
  - Compares a Node's current labels with the desired ones and returns a merge patch for its
    metadata, or an empty dict when nothing would change (so applying it is idempotent).
  - Labels set by llmfleet before (recorded in the C(llmfleet.io/managed-labels) annotation) and any
    C(llmfleet.io/) label no longer desired are removed; labels set by others are left alone.
options:
  _input:
    description: The Node object as returned by C(kubernetes.core.k8s_info) (C(metadata.labels),
      C(metadata.annotations) are read), or an empty dict for a node not seen yet.
    type: dict
    required: true
  desired:
    description: The labels the node should carry (C(llmfleet.cluster.k8s_node_labels)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Patch only when needed
  kubernetes.core.k8s:
    state: patched
    kind: Node
    name: "{{ inventory_hostname }}"
    merge_type: merge
    definition: "{{ node | llmfleet.cluster.k8s_label_patch(desired=labels) }}"
"""

RETURN = r"""
_value:
  description: >-
    The patch, C({"metadata": {"labels": {...}, "annotations": {...}}}) with C(null) for removed
    labels, or C({}) when the node already matches.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_labels import label_patch


def k8s_label_patch(node, desired):
    if not isinstance(node, dict) or not isinstance(desired, dict):
        raise AnsibleFilterError(
            "k8s_label_patch: expected a Node dict and a dict of desired labels, got {0!r} and {1!r}".format(
                type(node).__name__, type(desired).__name__
            )
        )
    metadata = node.get("metadata") or {}
    return label_patch(metadata.get("labels"), metadata.get("annotations"), desired)


class FilterModule(object):
    def filters(self):
        return {"k8s_label_patch": k8s_label_patch}

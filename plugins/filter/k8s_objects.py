# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_objects
short_description: Kubernetes objects checked and put in apply order
version_added: 1.0.0
description:
  - The input of the one render-or-apply sequence, the role C(llmfleet.cluster.k8s_objects). Each entry
    is a file name with either C(content) (YAML text, a rendered template) or C(object) (a dict);
    the result gives each its parsed object, kind and name, and orders them Namespaces, Secrets,
    the rest (the given order within each group).
  - A Secret must be flagged C(secret) (default true for kind Secret); it is written 0600 and
    applied with no_log. C(render=false) applies an object without writing a file for it.
  - An entry that is not a file name with exactly one of content/object, or whose object has no
    kind or metadata.name, fails naming the entry and the value.
options:
  _input:
    description: The entries, each a dict with C(file) and C(content) or C(object), and optional
      C(secret) and C(render) (booleans).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Put the objects in apply order
  ansible.builtin.set_fact:
    _objects: "{{ [{'file': 'ns.yaml', 'content': 'kind: Namespace\nmetadata: {name: llmfleet}'}] | llmfleet.cluster.k8s_objects }}"
"""

RETURN = r"""
_value:
  description: >-
    The entries in apply order, each a dict: file, kind, name, label (C(Kind file)), secret, render,
    content (the given text, or null), object (the parsed or given dict).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import ObjectsError, apply_order


def k8s_objects(entries):
    try:
        return apply_order(entries)
    except ObjectsError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {"k8s_objects": k8s_objects}

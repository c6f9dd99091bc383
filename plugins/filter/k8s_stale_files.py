# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_stale_files
short_description: The rendered files a new render no longer writes
version_added: 1.0.0
description:
  - Of the paths found in the manifests directory (an earlier render), those that are not a file
    this render writes (an architecture left the plan, the Ingress was turned off), sorted.
options:
  _input:
    description: The paths found (C(ansible.builtin.find)'s files' paths).
    type: list
    elements: str
    required: true
  entries:
    description: This render's entries (the output of P(llmfleet.cluster.k8s_objects#filter)).
    type: list
    elements: dict
    required: true
  manifest_dir:
    description: The manifests directory the paths are in.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Remove files this render no longer writes
  ansible.builtin.file:
    path: "{{ item }}"
    state: absent
  loop: "{{ found.files | map(attribute='path') | llmfleet.cluster.k8s_stale_files(objects, manifest_dir) }}"
"""

RETURN = r"""
_value:
  description: The paths to remove, sorted.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import stale_files


def k8s_stale_files(found, entries, manifest_dir):
    if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
        raise AnsibleFilterError(
            "k8s_stale_files: the input must be a list of paths, got {0!r}".format(found)[:300]
        )
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e for e in entries):
        raise AnsibleFilterError(
            "k8s_stale_files: entries must be k8s_objects entries, got {0!r}".format(entries)[:300]
        )
    return stale_files(found, entries, str(manifest_dir))


class FilterModule(object):
    def filters(self):
        return {"k8s_stale_files": k8s_stale_files}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: llama_rpc_k8s_teardown
short_description: What removing the llama.cpp RPC Kubernetes target deletes
version_added: 1.0.0
description:
  - The object names come from the same table the manifests are rendered from
    (C(plugins/plugin_utils/llama_rpc_k8s.py) C(NAMES)), so the teardown never spells a name again.
  - Needs no plan. The rpc-server DaemonSets are one per architecture; give the names found in the
    cluster (with the returned C(selector)) as the input.
options:
  _input:
    description: The names of the rpc-server DaemonSets found in the cluster (may be empty).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: The label selector of the rpc-server DaemonSets
  ansible.builtin.debug:
    msg: "{{ ([] | llmfleet.cluster.llama_rpc_k8s_teardown).selector }}"
"""

RETURN = r"""
_value:
  description: >-
    A dict: selector (label selectors of the rpc-server DaemonSets), objects (each api, kind,
    name, in delete order), file_pattern (the rendered files), key_file (the generated API key
    file's name under the output directory).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import teardown


def llama_rpc_k8s_teardown(daemonsets):
    if not isinstance(daemonsets, list) or not all(isinstance(n, str) and n for n in daemonsets):
        raise AnsibleFilterError(
            "llama_rpc_k8s_teardown: the input must be a list of DaemonSet names, got {0!r}".format(
                daemonsets
            )[:300]
        )
    return teardown(daemonsets)


class FilterModule(object):
    def filters(self):
        return {"llama_rpc_k8s_teardown": llama_rpc_k8s_teardown}

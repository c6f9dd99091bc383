# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: llama_rpc_k8s_facts
short_description: What the llama.cpp RPC Kubernetes manifests need from the plan
version_added: 1.0.0
description:
  - Groups the plan's workers by Kubernetes architecture (one rpc-server DaemonSet each) with the
    largest predicted total MiB over the plan and its fallbacks, the largest usable minus reserve MiB
    and the smallest thread count; looks up the llama.cpp pin of every architecture (workers and head)
    in the release table; lists the manifests in apply order.
  - C(problems) names whatever the pods would lack (a pin, the model URL, the model sha256).
options:
  _input:
    description: The plan (C(llmfleet_plan)).
    type: dict
    required: true
  host_facts:
    description: Inventory host name -> C(llmfleet_host) fact (C(kube_arch) or C(arch) is read).
    type: dict
    required: true
  releases:
    description: The llama.cpp release table, build -> flavour -> {url, sha256}.
    type: dict
    default: {}
  build:
    description: The llama.cpp build tag.
    type: str
    default: ""
  model_url:
    description: Where the pods download the model; empty takes the plan's model url.
    type: str
    default: ""
  output_dir:
    description: The controller's output directory (manifests go to its C(manifests) subdirectory).
    type: str
    default: build
  pvc_size:
    description: Size of the llama-server claim; empty is the model's size plus 2 GiB.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Work out the manifests' inputs
  ansible.builtin.set_fact:
    _llama_rpc_k8s: "{{ llmfleet_plan | llmfleet.cluster.llama_rpc_k8s_facts(host_facts, releases=llama_cpp_releases, build=llama_cpp_build) }}"
"""

RETURN = r"""
_value:
  description: >-
    A dict: problems, archs (arch -> workers, request_mib, limit_mib, threads), llama_cpp (arch ->
    flavour, url, sha256), head, model, pvc_size, uid, manifest_dir, key_file, names, manifests.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import k8s_facts


def llama_rpc_k8s_facts(
    plan, host_facts, releases=None, build="", model_url="", output_dir="build", pvc_size=""
):
    if not isinstance(plan, dict) or not isinstance(plan.get("workers"), list):
        raise AnsibleFilterError(
            "llama_rpc_k8s_facts: the input is not an llmfleet plan: {0!r}".format(plan)[:300]
        )
    if not isinstance(host_facts, dict):
        raise AnsibleFilterError(
            "llama_rpc_k8s_facts: host_facts must be a dict, got {0!r}".format(host_facts)
        )
    return k8s_facts(
        plan, host_facts, releases or {}, build or "", model_url or "", output_dir, pvc_size or ""
    )


class FilterModule(object):
    def filters(self):
        return {"llama_rpc_k8s_facts": llama_rpc_k8s_facts}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: vllm_lws_manifests
short_description: The Kubernetes objects that serve a model with vLLM across nodes (LeaderWorkerSet)
version_added: 1.0.0
author: llmfleet developers
description:
  - Runs the same checks as P(llmfleet.cluster.vllm_lws_preflight#filter), then builds, in apply order,
    the Namespace, the Secrets (only when their values are given), the LeaderWorkerSet, the leader-only
    Service, the Ingress and (when asked) the PodMonitor.
  - Every hard-won setting is fixed in code (eager compile backend, never C(--enforce-eager);
    required anti-affinity; node ranks; C(--no-async-scheduling); VLLM_PP_LAYER_PARTITION and
    VLLM_CPU_KVCACHE_SPACE from the plan; VLLM_HOST_IP; /dev/shm in memory; SYS_NICE; requests
    equal to limits; HF token and API key from Secrets). See docs/vllm-lws.md.
options:
  _input:
    description: The plan, C(llmfleet_plan).
    type: dict
    required: true
  options:
    description:
      - The role's variables without the C(vllm_lws_) prefix (name, namespace, model, model_revision,
        max_model_len, port, shm_gib, ingress_*, podmonitor, hf_token_secret, api_key_secret,
        hf_token, api_key, and the pre-flight options).
    type: dict
    default: {}
extends_documentation_fragment:
  - llmfleet.cluster.plan.facts
"""

EXAMPLES = r"""
- name: Build the objects
  ansible.builtin.set_fact:
    _objects: "{{ llmfleet_plan | llmfleet.cluster.vllm_lws_manifests(facts, {'model': 'google/gemma-3-1b-it'}) }}"
  no_log: true  # the Secret objects carry the token and key when they are given
"""

RETURN = r"""
_value:
  description: One entry per object, in apply order.
  type: list
  elements: dict
  contains:
    file: {description: "File name: vllm-NN-kind-name.yaml.", type: str}
    object: {description: The Kubernetes object., type: dict}
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.vllm import VllmLwsError, render


def vllm_lws_manifests(plan, facts, options=None):
    try:
        return render(plan, facts, options)
    except VllmLwsError as exc:
        raise AnsibleFilterError(f"vllm_lws_manifests: {exc}") from exc


class FilterModule(object):
    def filters(self):
        return {"vllm_lws_manifests": vllm_lws_manifests}

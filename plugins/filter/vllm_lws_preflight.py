# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: vllm_lws_preflight
short_description: Check a fleet for vLLM with LeaderWorkerSet and decide image, dtype and resources
version_added: 1.0.0
author: llmfleet developers
description:
  - Reads the vLLM stages of C(llmfleet_plan) and each stage host's C(llmfleet_host) facts.
  - Refuses (an error naming the hosts) when any stage host is C(unsupported) for vLLM's CPU backend,
    when the stage hosts mix architectures (one LeaderWorkerSet group has one worker pod template),
    or when a pod's requests (= limits) do not fit a node's usable memory or CPUs.
  - Returns what was decided; C(warnings) lists hosts whose support is only C(limited).
  - The logic lives in C(plugins/plugin_utils/vllm.py); see docs/vllm-lws.md.
options:
  _input:
    description: The plan, C(llmfleet_plan); its C(vllm) section gives pipeline_size, pp_layer_partition, stages, kvcache_space_gib.
    type: dict
    required: true
  options:
    description:
      - Choices, keys as the role's variables without the C(vllm_lws_) prefix
        (image_repository, image_version, image, dtype, cpu, cpu_reserve, memory_gib, overhead_mib,
        allow_mixed_arch, node_names).
    type: dict
    default: {}
extends_documentation_fragment:
  - llmfleet.cluster.plan.facts
"""

EXAMPLES = r"""
- name: Decide image, dtype and resources
  ansible.builtin.set_fact:
    _choice: "{{ llmfleet_plan | llmfleet.cluster.vllm_lws_preflight(facts, {'image_version': 'v0.31.0'}) }}"
"""

RETURN = r"""
_value:
  description: The decision.
  type: dict
  contains:
    image: {description: The image with its architecture tag., type: str}
    image_arch: {description: arm64 or x86_64., type: str}
    kube_arch: {description: arm64 or amd64., type: str}
    dtype: {description: bfloat16 or float32 (or what was set)., type: str}
    cpu: {description: CPUs per pod (requests = limits)., type: int}
    memory_mib: {description: Memory per pod in MiB (requests = limits)., type: int}
    kvcache_space_gib: {description: VLLM_CPU_KVCACHE_SPACE from the plan., type: int}
    pp_layer_partition: {description: VLLM_PP_LAYER_PARTITION from the plan., type: str}
    rank_mode: {description: worker_index (all worker stages alike) or node_name., type: str}
    warnings: {description: Hosts with limited support., type: list, elements: str}
    stages: {description: 'One entry per stage (rank, host, node_name, layers, need_mib, usable_mib).', type: list, elements: dict}
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.vllm import (
    VllmLwsError,
    choice_summary,
    run_preflight,
)


def vllm_lws_preflight(plan, facts, options=None):
    try:
        return choice_summary(run_preflight(plan, facts, options))
    except VllmLwsError as exc:
        raise AnsibleFilterError(f"vllm_lws_preflight: {exc}") from exc


class FilterModule(object):
    def filters(self):
        return {"vllm_lws_preflight": vllm_lws_preflight}

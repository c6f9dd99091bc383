# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the Kubernetes targets (roles/k8s_*, roles/llama_rpc_k8s, roles/vllm_lws; docs/kubernetes.md).

Thin wrappers over plugins/plugin_utils and plugins/module_utils. Each filter's documentation is
its sidecar file beside this one (plugins/filter/<name>.yml: ``ansible-doc -t filter
llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_labels import (
    LabelError,
    kubelet_labels,
    label_patch,
    label_strings,
    node_labels,
    node_taints,
    taint_strings,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import ObjectsError, apply_order
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import k8s_facts, teardown
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import PlanError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.vllm import (
    VllmLwsError,
    choice_summary,
    render,
    run_preflight,
)


def k8s_kubelet_labels(labels, style="dict"):
    if not isinstance(labels, dict):
        raise AnsibleFilterError("k8s_kubelet_labels: expected a dict of labels, got {0!r}".format(labels))
    if style not in ("dict", "k3s"):
        raise AnsibleFilterError("k8s_kubelet_labels: style {0!r} is not one of dict, k3s".format(style))
    kept = kubelet_labels(labels)
    return label_strings(kept) if style == "k3s" else kept


def k8s_label_patch(node, desired):
    if not isinstance(node, dict) or not isinstance(desired, dict):
        raise AnsibleFilterError(
            "k8s_label_patch: expected a Node dict and a dict of desired labels, got {0!r} and {1!r}".format(
                type(node).__name__, type(desired).__name__
            )
        )
    metadata = node.get("metadata") or {}
    return label_patch(metadata.get("labels"), metadata.get("annotations"), desired)


def k8s_node_labels(host_fact, name, plan=None, role=None, extra=None):
    try:
        return node_labels(host_fact, name, plan=plan, role=role, extra=extra)
    except LabelError as exc:
        raise AnsibleFilterError("k8s_node_labels: {0}".format(exc)) from exc


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


def k8s_objects(entries):
    try:
        return apply_order(entries)
    except ObjectsError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def llama_rpc_k8s_facts(
    plan,
    host_facts,
    releases=None,
    build="",
    model_url="",
    output_dir="build",
    pvc_size="",
    envs=None,
    resources=None,
    images=None,
):
    if not isinstance(plan, dict) or not isinstance(plan.get("workers"), list):
        raise AnsibleFilterError(
            "llama_rpc_k8s_facts: the input is not an llmfleet plan: {0!r}".format(plan)[:300]
        )
    if not isinstance(host_facts, dict):
        raise AnsibleFilterError(
            "llama_rpc_k8s_facts: host_facts must be a dict, got {0!r}".format(host_facts)
        )
    try:
        return k8s_facts(
            plan,
            host_facts,
            releases or {},
            build or "",
            model_url or "",
            output_dir,
            pvc_size or "",
            envs=envs or {},
            resources=resources or {},
            images=images or {},
        )
    except PlanError as exc:
        raise AnsibleFilterError("llama_rpc_k8s_facts: {0}".format(exc)) from exc


def llama_rpc_k8s_teardown(daemonsets):
    if not isinstance(daemonsets, list) or not all(isinstance(n, str) and n for n in daemonsets):
        raise AnsibleFilterError(
            "llama_rpc_k8s_teardown: the input must be a list of DaemonSet names, got {0!r}".format(
                daemonsets
            )[:300]
        )
    return teardown(daemonsets)


def vllm_lws_manifests(plan, facts, options=None):
    try:
        return render(plan, facts, options)
    except VllmLwsError as exc:
        raise AnsibleFilterError(f"vllm_lws_manifests: {exc}") from exc


def vllm_lws_preflight(plan, facts, options=None):
    try:
        return choice_summary(run_preflight(plan, facts, options))
    except VllmLwsError as exc:
        raise AnsibleFilterError(f"vllm_lws_preflight: {exc}") from exc


class FilterModule(object):
    def filters(self):
        return {
            "k8s_kubelet_labels": k8s_kubelet_labels,
            "k8s_label_patch": k8s_label_patch,
            "k8s_node_labels": k8s_node_labels,
            "k8s_node_taints": k8s_node_taints,
            "k8s_objects": k8s_objects,
            "llama_rpc_k8s_facts": llama_rpc_k8s_facts,
            "llama_rpc_k8s_teardown": llama_rpc_k8s_teardown,
            "vllm_lws_manifests": vllm_lws_manifests,
            "vllm_lws_preflight": vllm_lws_preflight,
        }

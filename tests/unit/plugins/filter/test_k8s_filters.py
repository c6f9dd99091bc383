"""The k8s_* filters: thin wrappers that turn LabelError into AnsibleFilterError and pick a style."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.k8s import (
    k8s_kubelet_labels,
    k8s_label_patch,
    k8s_node_labels,
    k8s_node_taints,
)

FACT = {"kube_arch": "arm64", "isa": ["neon"], "memory": {"usable_mib": 900}}


def test_node_labels_error_names_filter_and_host() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"k8s_node_labels: host pi5: llmfleet_host has no kube_arch"
    ):
        k8s_node_labels({"arch": "aarch64"}, "pi5")


def test_kubelet_labels_of_node_labels() -> None:
    labels = k8s_kubelet_labels(k8s_node_labels(FACT, "pi5", role="worker"))
    assert labels == {
        "llmfleet.io/arch": "arm64",
        "llmfleet.io/role": "worker",
    }
    assert k8s_kubelet_labels({"z": "1", "a": "2", "kubernetes.io/x": "y"}, style="k3s") == ["a=2", "z=1"]
    with pytest.raises(AnsibleFilterError):
        k8s_kubelet_labels(["a=b"])
    with pytest.raises(AnsibleFilterError, match="style 'list'"):
        k8s_kubelet_labels({}, style="list")


def test_taint_styles() -> None:
    assert k8s_node_taints([], name="pi5", dedicated=True, style="k3s") == [
        "llmfleet.io/dedicated=true:NoSchedule"
    ]
    assert k8s_node_taints(None, name="pi5") == []
    with pytest.raises(AnsibleFilterError, match="style 'yaml'"):
        k8s_node_taints([], style="yaml")
    with pytest.raises(AnsibleFilterError, match="host pi5: taints must be a list"):
        k8s_node_taints("a=b:NoSchedule", name="pi5")


def test_label_patch_reads_node_metadata() -> None:
    node = {"metadata": {"name": "pi5", "labels": {"llmfleet.io/rpc": "true"}}}
    patch = k8s_label_patch(node, {})
    assert patch["metadata"]["labels"] == {"llmfleet.io/rpc": None}
    with pytest.raises(AnsibleFilterError):
        k8s_label_patch(None, {})

"""Node labels and taints from the probe fact, the plan and the inventory (plugin_utils/k8s_labels.py)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import k8s_labels as kl

SPR = {  # a Sapphire Rapids Xeon as the probe reports it
    "arch": "x86_64",
    "kube_arch": "amd64",
    "isa": ["amx_bf16", "amx_int8", "amx_tile", "avx", "avx2", "avx512_bf16", "avx512_vnni", "avx512f"],
    "memory": {"usable_mib": 61234.7},
}
GRAVITON3 = {
    "arch": "aarch64",
    "kube_arch": "arm64",
    "isa": ["bf16", "dotprod", "i8mm", "neon", "sve"],
    "memory": {"usable_mib": 15000},
}
PLAN = {
    "hosts": [
        {"name": "head1", "role": "head", "layers": [0, 0], "output_layer": False},
        {"name": "w1", "role": "worker", "layers": [0, 9], "output_layer": False},
        {"name": "w2", "role": "worker", "layers": [9, 18], "output_layer": True},
        {"name": "w3", "role": "worker", "layers": [18, 18], "output_layer": True},
        {"name": "w4", "role": "worker", "layers": [18, 18], "output_layer": False},
    ]
}


def test_x86_labels_in_nfd_style() -> None:
    labels = kl.node_labels(SPR, "w1", plan=PLAN)
    assert labels == {
        "feature.node.kubernetes.io/cpu-cpuid.AMXBF16": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AMXINT8": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AMXTILE": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AVX": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512BF16": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI": "true",
        "llmfleet.io/arch": "amd64",
        "llmfleet.io/role": "worker",
        "llmfleet.io/rpc": "true",
        "llmfleet.io/usable-mib": "61234",
    }
    assert list(labels) == sorted(labels)


def test_arm_labels() -> None:
    labels = kl.node_labels(GRAVITON3, "w2", plan=PLAN)
    cpuid = sorted(k.rsplit(".", 1)[1] for k in labels if k.startswith(kl.NFD_CPUID_PREFIX))
    assert cpuid == ["ASIMD", "ASIMDDP", "BF16", "I8MM", "SVE"]
    assert labels["llmfleet.io/arch"] == "arm64"
    assert labels["llmfleet.io/usable-mib"] == "15000"


@pytest.mark.parametrize(
    ("name", "rpc"),
    [("head1", False), ("w1", True), ("w2", True), ("w3", True), ("w4", False), ("elsewhere", False)],
)
def test_rpc_label_only_on_hosts_holding_layers(name: str, rpc: bool) -> None:
    labels = kl.node_labels(GRAVITON3, name, plan=PLAN)
    assert ("llmfleet.io/rpc" in labels) is rpc
    if rpc:
        assert labels["llmfleet.io/rpc"] == "true"


def test_role_from_plan_wins_over_inventory_and_absent_without_either() -> None:
    assert kl.node_labels(GRAVITON3, "head1", plan=PLAN, role="worker")["llmfleet.io/role"] == "head"
    assert kl.node_labels(GRAVITON3, "x", plan=PLAN, role="worker")["llmfleet.io/role"] == "worker"
    assert "llmfleet.io/role" not in kl.node_labels(GRAVITON3, "x")
    assert "llmfleet.io/rpc" not in kl.node_labels(GRAVITON3, "w1")  # no plan, no rpc label


def test_unknown_isa_feature_is_upper_cased_and_sanitised() -> None:
    fact = dict(GRAVITON3, isa=["sve_b16b16", "neon"])
    labels = kl.node_labels(fact, "w1")
    assert labels["feature.node.kubernetes.io/cpu-cpuid.SVEB16B16"] == "true"


def test_extra_labels_are_added_and_stringified() -> None:
    labels = kl.node_labels(GRAVITON3, "w1", extra={"example.com/rack": "r2", "gpu": False, "slots": 3})
    assert labels["example.com/rack"] == "r2"
    assert labels["gpu"] == "false"
    assert labels["slots"] == "3"


def test_extra_label_cannot_override_computed_one() -> None:
    with pytest.raises(kl.LabelError, match=r"host w1: inventory label llmfleet.io/arch would override"):
        kl.node_labels(GRAVITON3, "w1", extra={"llmfleet.io/arch": "amd64"})


@pytest.mark.parametrize(
    ("fact", "message"),
    [
        (None, "host w9: llmfleet_host is missing"),
        ({"arch": "x86_64"}, "host w9: llmfleet_host has no kube_arch"),
        (dict(SPR, memory={"usable_mib": "lots"}), "memory.usable_mib 'lots' is not a number"),
        (dict(SPR, memory={"usable_mib": -5}), "memory.usable_mib -5 is negative"),
    ],
)
def test_bad_probe_fact_is_named(fact: object, message: str) -> None:
    with pytest.raises(kl.LabelError, match=message):
        kl.node_labels(fact, "w9")  # type: ignore[arg-type]


def test_bad_role_is_refused() -> None:
    with pytest.raises(kl.LabelError, match="role 'leader' is not one of head, worker"):
        kl.node_labels(SPR, "w1", role="leader")


def test_a_plan_that_cannot_be_read_is_named_with_the_host() -> None:
    """The plan is read through the typed plan (plan.parse): a bad row is refused, not guessed."""
    bad = {"hosts": [*PLAN["hosts"][:1], {"name": "w1", "role": "worker", "layers": [9, 0]}]}
    with pytest.raises(kl.LabelError, match=r"host w1: plan: hosts\[1\]\.layers .* got \[9, 0\]"):
        kl.node_labels(SPR, "w1", plan=bad)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("bad key", "x"),
        ("-starts-with-dash", "x"),
        ("Example.COM/x", "x"),  # prefix must be lower-case DNS
        ("example.com/" + "n" * 64, "x"),
        ("ok", "v" * 64),
        ("ok", "bad value"),
        ("ok", "-x"),
        ("/noprefix", "x"),
    ],
)
def test_invalid_labels_are_refused(key: str, value: str) -> None:
    with pytest.raises(kl.LabelError, match="host h1"):
        kl.validate_label(key, value, "h1")


@pytest.mark.parametrize(
    ("key", "value"),
    [("a", ""), ("example.com/a-b_c.d", "V1.2-x_y"), ("n" * 63, "v" * 63), ("llmfleet.io/usable-mib", "0")],
)
def test_valid_labels_pass(key: str, value: str) -> None:
    kl.validate_label(key, value)


def test_non_string_value_is_refused() -> None:
    with pytest.raises(kl.LabelError, match="must be a string"):
        kl.validate_label("a", True)  # type: ignore[arg-type]


def test_kubelet_labels_drop_restricted_namespaces() -> None:
    labels = {
        "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true",
        "node-role.kubernetes.io/worker": "true",
        "example.k8s.io/x": "y",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": "attic",
        "node.kubernetes.io/instance-type": "nuc",
        "kubelet.kubernetes.io/foo": "bar",
        "llmfleet.io/arch": "amd64",
        "llmfleet.io/rpc": "true",  # volatile: through the API only
        "llmfleet.io/usable-mib": "100",
        "notkubernetes.io/x": "kept",  # only the kubernetes.io domain and its subdomains are restricted
        "plain": "kept",
    }
    assert kl.kubelet_labels(labels) == {
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": "attic",
        "node.kubernetes.io/instance-type": "nuc",
        "kubelet.kubernetes.io/foo": "bar",
        "llmfleet.io/arch": "amd64",
        "notkubernetes.io/x": "kept",
        "plain": "kept",
    }


def test_taints_dedicated_and_extra_sorted() -> None:
    taints = kl.node_taints(
        "w1", dedicated=True, extra=[{"key": "example.com/slow", "value": None, "effect": "PreferNoSchedule"}]
    )
    assert taints == [
        {"key": "example.com/slow", "value": "", "effect": "PreferNoSchedule"},
        {"key": "llmfleet.io/dedicated", "value": "true", "effect": "NoSchedule"},
    ]
    assert kl.taint_strings(taints) == [
        "example.com/slow:PreferNoSchedule",
        "llmfleet.io/dedicated=true:NoSchedule",
    ]
    assert kl.node_taints("w1") == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([{"key": "a", "effect": "Sometimes"}], "host w1: taint a: effect 'Sometimes' is not one of"),
        (["a=b:NoSchedule"], "host w1: taint 'a=b:NoSchedule' must be a mapping"),
        ([{"key": "bad key"}], "host w1: label key 'bad key'"),
        ([{"key": "llmfleet.io/dedicated", "value": "x"}], "llmfleet.io/dedicated:NoSchedule is given twice"),
    ],
)
def test_bad_taints_are_refused(extra: list, message: str) -> None:
    with pytest.raises(kl.LabelError, match=message):
        kl.node_taints("w1", dedicated=True, extra=extra)


def test_label_patch_for_a_fresh_node_sets_labels_and_records_them() -> None:
    desired = {"llmfleet.io/arch": "amd64", "llmfleet.io/rpc": "true"}
    patch = kl.label_patch({"kubernetes.io/hostname": "w1"}, {}, desired)
    assert patch["metadata"]["labels"] == desired
    assert json.loads(patch["metadata"]["annotations"][kl.MANAGED_ANNOTATION]) == sorted(desired)


def test_label_patch_is_empty_when_the_node_matches() -> None:
    desired = {"llmfleet.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
    first = kl.label_patch({}, {}, desired)
    labels = dict(first["metadata"]["labels"])
    annotations = dict(first["metadata"]["annotations"])
    assert kl.label_patch(labels, annotations, desired) == {}


def test_label_patch_removes_what_we_set_before_but_not_others_labels() -> None:
    current = {
        "llmfleet.io/rpc": "true",  # host left the plan: must go
        "llmfleet.io/arch": "amd64",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",  # set by us before, no longer desired
        "feature.node.kubernetes.io/cpu-cpuid.SSE4": "true",  # set by NFD, not ours
        "example.com/rack": "r1",
    }
    annotations = {
        kl.MANAGED_ANNOTATION: json.dumps(
            ["feature.node.kubernetes.io/cpu-cpuid.AVX512F", "llmfleet.io/arch", "llmfleet.io/rpc"]
        )
    }
    patch = kl.label_patch(current, annotations, {"llmfleet.io/arch": "amd64"})
    assert patch["metadata"]["labels"] == {
        "feature.node.kubernetes.io/cpu-cpuid.AVX512F": None,
        "llmfleet.io/rpc": None,
    }
    assert json.loads(patch["metadata"]["annotations"][kl.MANAGED_ANNOTATION]) == ["llmfleet.io/arch"]


def test_label_patch_changes_a_value_and_survives_a_broken_annotation() -> None:
    patch = kl.label_patch(
        {"llmfleet.io/usable-mib": "100"},
        {kl.MANAGED_ANNOTATION: "not json"},
        {"llmfleet.io/usable-mib": "200"},
    )
    assert patch["metadata"]["labels"] == {"llmfleet.io/usable-mib": "200"}

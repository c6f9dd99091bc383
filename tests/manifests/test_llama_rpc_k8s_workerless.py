"""A plan with no worker on the ``kubernetes`` target: llama-server alone, rendered for real.

The what-if fleet tests/fixtures/llama_rpc_k8s/workerless has a head large enough for the whole
model and one worker the planner does not need (llmfleet_min_workers 0), so the plan is the head
alone. playbooks/render.yml must then write the llama-server Deployment and what it needs, and
nothing that exists only for workers: no rpc-server DaemonSet, no headless workers Service, no
NetworkPolicy, no Role to list pods; the supervisor discovers statically and llama-server gets no
``--rpc``. Every object passes ``kubernetes-validate --strict`` (1.33 and 1.37), and a render of
the fleet with workers into the same directory followed by this one leaves no worker file behind
(that test is in test_llama_rpc_k8s.py: it starts from a copy of that module's render).
"""

from __future__ import annotations

import pytest

from tests.manifests.test_llama_rpc_k8s import (
    K8S_VERSIONS,
    WORKER_ONLY_KINDS,
    WORKERLESS,
    Rendered,
    _config_refs,
    _render,
    selects,
    whatif_vars,
)
from tests.support.k8s_validate import assert_valid


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> Rendered:
    return _render(tmp_path_factory, WORKERLESS, whatif_vars(), "workerless")


def test_the_plan_is_the_head_alone(alone: Rendered) -> None:
    plan = alone.plan
    assert plan["workers"] == []
    assert [h["role"] for h in plan["hosts"]] == ["head"]
    assert "--rpc" not in plan["llama_server_args"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_llama_server_alone_passes_kubernetes_validate_strict(alone: Rendered, version: str) -> None:
    kinds = sorted(o["kind"] for o in alone.objects.values())
    assert kinds == sorted(
        [
            "Namespace",
            "Secret",
            "ConfigMap",
            "ServiceAccount",
            "PersistentVolumeClaim",
            "Deployment",
            "Service",
        ]
    )
    assert_valid(alone.files, version)


def test_no_object_exists_for_workers(alone: Rendered) -> None:
    assert not WORKER_ONLY_KINDS & {o["kind"] for o in alone.objects.values()}
    names = {o["metadata"]["name"] for o in alone.objects.values()}
    assert "llama-rpc-workers" not in names and "llama-rpc-server" not in names
    (service,) = alone.kind("Service")
    assert selects(service["spec"]["selector"], alone.deployment["spec"]["template"]["metadata"]["labels"])


def test_the_supervisor_discovers_statically_without_an_api_token(alone: Rendered) -> None:
    spec = alone.deployment["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    (server,) = spec["containers"]
    args = server["args"]
    opts = dict(a.split("=", 1) for a in args[: args.index("--")])
    assert opts["--discovery"] == "static"
    assert "--rpc" not in args
    env = {e["name"] for e in server["env"]}
    assert "LLMFLEET_K8S_SELECTOR" not in env
    data = alone.configmap["data"]
    for where, name, key in _config_refs(spec):
        assert key in data, f"Deployment: {where} {name} -> missing key {key}"


def test_the_head_requests_what_the_plan_predicts_for_it(alone: Rendered) -> None:
    (head,) = alone.plan["hosts"]
    (server,) = alone.deployment["spec"]["template"]["spec"]["containers"]
    need = -(-head["predicted_mib"]["total"] // 1)
    assert server["resources"]["requests"]["memory"] == f"{max(int(need), 64)}Mi"

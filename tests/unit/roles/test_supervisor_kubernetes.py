"""The supervisor's Kubernetes discovery (``--discovery kubernetes``) against a fake API server.

The API server is a real HTTPS server on loopback with its own self-signed CA
(tests/support/fake_kube_api.py); the supervisor reads the token, CA and namespace from a
service-account directory as in a pod. The last test runs the supervisor as a real process
with real TCP listeners as workers whose pod IPs and ports differ from the plan's endpoints.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.fake_kube_api import FakeKubeApi, pod, self_signed
from tests.support.fake_rpc import FakeRpcServer

ROOT = Path(__file__).resolve().parents[3]
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"

_spec = importlib.util.spec_from_file_location("llmfleet_supervisor_k8s", SUPERVISOR)
assert _spec is not None and _spec.loader is not None
sup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sup)

NS = "llmfleet"
LABELS = {"app.kubernetes.io/name": "llama-rpc-server", "app.kubernetes.io/part-of": "llmfleet"}
SELECTOR = "app.kubernetes.io/name=llama-rpc-server,app.kubernetes.io/part-of=llmfleet"
# The DaemonSet (one per architecture) that controls the rpc-server pods.
OWNER = "llama-rpc-server-amd64"
# Where the plan (computed from the inventory) thinks the workers are: never contacted here.
PLANNED = {"w1": "10.255.0.1:50052", "w2": "10.255.0.2:50052"}


def make_plan() -> dict:
    rpc = f"{PLANNED['w2']},{PLANNED['w1']}"  # the plan's order: w2 first
    return {
        "version": 1,
        "head": "head1",
        "workers": ["w2", "w1"],
        "hosts": [{"name": "head1", "role": "head", "endpoint": None}]
        + [{"name": n, "role": "worker", "endpoint": PLANNED[n]} for n in ("w2", "w1")],
        "llama_server_args": ["--rpc", rpc, "--tensor-split", "4,5", "-ngl", "9"],
        "fallbacks": [
            {
                "workers": ["w1"],
                "ok": True,
                "used_workers": ["w1"],
                "llama_server_args": ["--rpc", PLANNED["w1"], "--tensor-split", "9", "-ngl", "9"],
                "hosts": [{"name": "w1", "role": "worker", "endpoint": PLANNED["w1"]}],
            },
            {"workers": ["w2"], "ok": False, "reason": "w2 alone lacks 12 MiB"},
        ],
    }


# ---------------------------------------------------------------------------------- pod_endpoints


def test_pod_endpoints_keeps_ready_pods_on_planned_nodes_with_their_rpc_port() -> None:
    pods = {
        "items": [
            pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER),
            pod("w2", "10.42.2.9", 6000, namespace=NS, labels=LABELS, owner=OWNER),
            pod("stranger", "10.42.3.3", 50052, namespace=NS, labels=LABELS, owner=OWNER),
        ]
    }
    assert sup.pod_endpoints(pods, PLANNED) == {"w1": "10.42.1.7:50052", "w2": "10.42.2.9:6000"}


def test_pod_endpoints_leaves_out_unready_deleting_and_addressless_pods() -> None:
    addressless = pod("w2", "", 50052, namespace=NS, labels=LABELS, owner=OWNER)
    pods = {
        "items": [
            pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER, ready=False),
            pod(
                "w1", "10.42.1.8", 50052, namespace=NS, labels=LABELS, owner=OWNER, deleting=True, name="old"
            ),
            addressless,
        ]
    }
    assert sup.pod_endpoints(pods, PLANNED) == {}


def test_pod_endpoints_newest_ready_pod_of_a_node_wins_and_ipv6_is_bracketed() -> None:
    pods = {
        "items": [
            pod(
                "w1",
                "10.42.1.9",
                50052,
                namespace=NS,
                labels=LABELS,
                owner=OWNER,
                created="2026-11-30T07:00:00Z",
            ),
            pod(
                "w1",
                "10.42.1.7",
                50052,
                namespace=NS,
                labels=LABELS,
                owner=OWNER,
                created="2026-11-30T06:00:00Z",
            ),
            pod("w2", "fd00::5", 50052, namespace=NS, labels=LABELS, owner=OWNER),
        ]
    }
    assert sup.pod_endpoints(pods, PLANNED) == {"w1": "10.42.1.9:50052", "w2": "[fd00::5]:50052"}


def test_pod_endpoints_falls_back_to_the_planned_port_without_a_named_port() -> None:
    p = pod("w1", "10.42.1.7", 7777, namespace=NS, labels=LABELS, owner=OWNER)
    p["spec"]["containers"][0]["ports"][0]["name"] = "other"
    assert sup.pod_endpoints({"items": [p]}, PLANNED) == {"w1": "10.42.1.7:50052"}


def test_pod_endpoints_keeps_only_pods_the_fleets_daemonsets_control() -> None:
    """Labels are anyone's to set: a Ready pod with the right labels on a planned node counts only
    when its controller is one of the rpc-server DaemonSets (apps/v1)."""
    owners = frozenset({OWNER})
    hand_made = pod("w1", "10.42.1.66", 50052, namespace=NS, labels=LABELS)
    replica = pod(
        "w1", "10.42.1.67", 50052, namespace=NS, labels=LABELS, owner=OWNER, owner_kind="ReplicaSet"
    )
    other_ds = pod("w1", "10.42.1.68", 50052, namespace=NS, labels=LABELS, owner="someone-elses-ds")
    not_controller = pod("w1", "10.42.1.69", 50052, namespace=NS, labels=LABELS, owner=OWNER)
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    old_api = pod("w1", "10.42.1.70", 50052, namespace=NS, labels=LABELS, owner=OWNER)
    old_api["metadata"]["ownerReferences"][0]["apiVersion"] = "extensions/v1beta1"
    strangers = [hand_made, replica, other_ds, not_controller, old_api]
    for stranger in strangers:
        stranger["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"  # newer: would win
    real = pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER)
    assert sup.pod_endpoints({"items": [*strangers, real]}, PLANNED, owners) == {"w1": "10.42.1.7:50052"}
    assert sup.pod_endpoints({"items": strangers}, PLANNED, owners) == {}


def test_discovery_follows_only_the_daemonsets_pods(api, tmp_path) -> None:
    sa = api.service_account(tmp_path / "sa", NS)
    api.pods = [
        pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER),
        pod("w2", "10.42.2.66", 50052, namespace=NS, labels=LABELS),  # made by hand, same labels
    ]
    found = sup.KubernetesDiscovery(make_plan(), discovery_env(api, sa)).endpoints()
    assert found == {"w1": "10.42.1.7:50052"}


# ------------------------------------------------------------------------- KubernetesDiscovery


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi("127.0.0.1", token="sa-token-1", workdir=tmp_path / "pki") as server:
        yield server


def discovery_env(api: FakeKubeApi, sa_dir: Path) -> dict[str, str]:
    return {
        **api.env(),
        "LLMFLEET_K8S_SA_DIR": str(sa_dir),
        "LLMFLEET_K8S_SELECTOR": SELECTOR,
        "LLMFLEET_K8S_OWNERS": f"{OWNER},llama-rpc-server-arm64",
    }


def test_discovery_lists_pods_of_its_namespace_by_selector_with_the_token(api, tmp_path) -> None:
    sa = api.service_account(tmp_path / "sa", NS)
    api.pods = [
        pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER),
        pod("w2", "10.42.2.9", 50052, namespace=NS, labels=LABELS, owner=OWNER),
        pod("w2", "10.42.9.9", 50052, namespace="other", labels=LABELS, owner=OWNER),
        pod("w1", "10.42.8.8", 50052, namespace=NS, labels={"app.kubernetes.io/name": "else"}),
    ]
    found = sup.KubernetesDiscovery(make_plan(), discovery_env(api, sa)).endpoints()
    assert found == {"w1": "10.42.1.7:50052", "w2": "10.42.2.9:50052"}
    (path,) = api.requests
    assert path.startswith(f"/api/v1/namespaces/{NS}/pods?labelSelector=")
    assert "app.kubernetes.io%2Fname%3Dllama-rpc-server" in path


def test_discovery_keeps_the_last_answer_when_the_api_fails(api, tmp_path, capsys) -> None:
    sa = api.service_account(tmp_path / "sa", NS)
    api.pods = [pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER)]
    disc = sup.KubernetesDiscovery(make_plan(), discovery_env(api, sa))
    assert disc.endpoints() == {"w1": "10.42.1.7:50052"}
    api.down = True
    api.pods = []
    assert disc.endpoints() == {"w1": "10.42.1.7:50052"}
    assert "keeping the last answer" in capsys.readouterr().err
    api.down = False
    assert disc.endpoints() == {}


def test_discovery_refuses_a_server_its_ca_does_not_sign(api, tmp_path, capsys) -> None:
    sa = api.service_account(tmp_path / "sa", NS)
    other_cert, _unused = self_signed("127.0.0.1", tmp_path / "other")
    (sa / "ca.crt").write_bytes(other_cert.read_bytes())
    api.pods = [pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER)]
    assert sup.KubernetesDiscovery(make_plan(), discovery_env(api, sa)).endpoints() == {}
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err


def test_discovery_with_a_wrong_token_finds_nothing(api, tmp_path) -> None:
    sa = api.service_account(tmp_path / "sa", NS)
    (sa / "token").write_text("stolen")
    api.pods = [pod("w1", "10.42.1.7", 50052, namespace=NS, labels=LABELS, owner=OWNER)]
    assert sup.KubernetesDiscovery(make_plan(), discovery_env(api, sa)).endpoints() == {}


def test_discovery_needs_the_api_host_and_a_selector(tmp_path) -> None:
    with pytest.raises(sup.SupervisorError, match="KUBERNETES_SERVICE_HOST"):
        sup.KubernetesDiscovery(
            make_plan(), {"LLMFLEET_K8S_SELECTOR": SELECTOR, "LLMFLEET_K8S_OWNERS": OWNER}
        )
    with pytest.raises(sup.SupervisorError, match="LLMFLEET_K8S_OWNERS"):
        sup.KubernetesDiscovery(
            make_plan(), {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "LLMFLEET_K8S_SELECTOR": SELECTOR}
        )
    with pytest.raises(sup.SupervisorError, match="cannot read"):
        sup.KubernetesDiscovery(
            make_plan(),
            {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "LLMFLEET_K8S_SELECTOR": SELECTOR,
                "LLMFLEET_K8S_OWNERS": OWNER,
                "LLMFLEET_K8S_SA_DIR": str(tmp_path / "none"),
            },
        )


def test_kubernetes_is_a_registered_discovery() -> None:
    assert sup.DISCOVERIES["kubernetes"] is sup.KubernetesDiscovery
    assert sup.parse_args(["--plan", "p", "--llama-server", "l", "--discovery", "kubernetes"]).discovery == (
        "kubernetes"
    )


# ------------------------------------------------------------ the supervisor process with pods

FAKE_SERVER = textwrap.dedent(
    """\
    import json, os, sys, time
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
    while True:
        time.sleep(0.05)
    """
)


class _Rpc(FakeRpcServer):
    """A fake rpc-server (it answers the supervisor's HELLO) with the socket API this file uses."""

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        self.down()


def listener() -> _Rpc:
    return _Rpc()


def test_supervisor_runs_llama_server_on_the_discovered_pods_in_plan_order(api, tmp_path) -> None:
    sa = api.service_account(tmp_path / "sa", NS)
    w1, w2 = listener(), listener()
    p1, p2 = w1.getsockname()[1], w2.getsockname()[1]
    api.pods = [
        pod("w1", "127.0.0.1", p1, namespace=NS, labels=LABELS, owner=OWNER),
        pod("w2", "127.0.0.1", p2, namespace=NS, labels=LABELS, owner=OWNER),
    ]
    (tmp_path / "plan.json").write_text(json.dumps(make_plan()))
    (tmp_path / "fake.py").write_text(FAKE_SERVER)
    launcher = tmp_path / "llama-server"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "fake.py"}" "$@"\n')
    launcher.chmod(0o755)
    log = tmp_path / "starts.jsonl"
    env = dict(os.environ, FAKE_LOG=str(log), **discovery_env(api, sa))
    with open(tmp_path / "supervisor.log", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SUPERVISOR), "--plan", str(tmp_path / "plan.json"),
             "--llama-server", str(launcher), "--discovery", "kubernetes", "--interval", "0.2",
             "--stable", "3", "--grace", "0.5", "--stop-timeout", "1", "--", "--port", "8080"],
            env=env, stderr=err,
        )  # fmt: skip

        def starts(count: int) -> list[list[str]]:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                lines = log.read_text().splitlines() if log.exists() else []
                if len(lines) >= count:
                    return [json.loads(line) for line in lines]
                time.sleep(0.05)
            raise AssertionError((tmp_path / "supervisor.log").read_text())

        try:
            first = starts(1)[0]
            # The pods' endpoints replace the plan's, in the plan's order (w2 before w1).
            assert first == ["--rpc", f"127.0.0.1:{p2},127.0.0.1:{p1}", "--tensor-split", "4,5",
                             "-ngl", "9", "--port", "8080"]  # fmt: skip
            # w2's pod stops being Ready: the plan's fallback for {w1} on w1's pod.
            api.pods[1]["status"]["conditions"][0]["status"] = "False"
            second = starts(2)[1]
            assert second == [
                "--rpc",
                f"127.0.0.1:{p1}",
                "--tensor-split",
                "9",
                "-ngl",
                "9",
                "--port",
                "8080",
            ]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            w1.close()
            w2.close()
    text = (tmp_path / "supervisor.log").read_text()
    assert "discovery kubernetes" in text

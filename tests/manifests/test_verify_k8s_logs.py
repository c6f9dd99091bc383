"""playbooks/verify.yml on the Kubernetes target, against a fake API server.

The real playbook runs with ``verify_target: kubernetes`` on a localhost-only inventory; the
role's kubernetes.core modules (k8s_info, k8s_log) talk HTTPS to ``FakeKubeApi``
(tests/support/fake_kube_api.py) through a kubeconfig with its own CA and a bearer token.
When the request fails, every container of every pod of ours (init containers too) must leave a
file with the node in its first line, its current log and its previous container's log (the one
that restarted, with the text the fake holds for it), and a container that never restarted (the
API answers 400) must not stop the collection.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ansible_env import ansible_env
from tests.support.fake_kube_api import FakeKubeApi, pod

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "verify.yml"
NS = "llmfleet"
TOKEN = "kubeconfig-bearer-5e1f0c9a7d3b"
API_KEY = "sk-verify-k8s-77d2c4e1"
LOG_LINES = 7
OURS = "app.kubernetes.io/part-of"
HEAD_LABELS = {"app.kubernetes.io/name": "llama-server", OURS: "llmfleet"}
RPC_LABELS = {"app.kubernetes.io/name": "llama-rpc-server", OURS: "llmfleet", "llmfleet.io/arch": "amd64"}
# What w2's rpc-server printed before it was OOM-killed: only its previous container's log has it.
PREVIOUS_MARKER = (
    "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate 412.00 MiB (w2 before the kill)"
)

HEAD = "llama-server-6d9f7c-x2k4q"
W1 = "llama-rpc-server-amd64-7hd2m"
W2 = "llama-rpc-server-amd64-q9z8t"
# pod -> (node, containers with init containers first)
EXPECTED = {
    HEAD: ("head1", ["llama-cpp", "model", "llama-server"]),
    W1: ("w1", ["cache-owner", "llama-cpp", "rpc-server"]),
    W2: ("w2", ["cache-owner", "llama-cpp", "rpc-server"]),
}


def numbered(prefix: str, count: int = 20) -> str:
    return "".join(f"{prefix} line {i}\n" for i in range(1, count + 1))


def put_fleet(api: FakeKubeApi) -> None:
    api.pods = [
        pod("head1", "10.42.0.5", 8080, namespace=NS, labels=HEAD_LABELS, name=HEAD,
            containers=("llama-server",), init_containers=("llama-cpp", "model")),
        pod("w1", "10.42.1.7", 50052, namespace=NS, labels=RPC_LABELS, name=W1,
            init_containers=("cache-owner", "llama-cpp")),
        pod("w2", "10.42.2.9", 50052, namespace=NS, labels=RPC_LABELS, name=W2,
            init_containers=("cache-owner", "llama-cpp"), restarts={"rpc-server": 3},
            last_terminated={"rpc-server": {"reason": "OOMKilled", "exitCode": 137,
                                            "finishedAt": "2026-11-30T06:41:07Z"}}),
        # Not ours (another namespace, another selector): never read.
        pod("w3", "10.42.3.3", 50052, namespace="elsewhere", labels=RPC_LABELS, name="rpc-elsewhere"),
        pod("w1", "10.42.1.8", 80, namespace=NS, labels={"app": "unrelated"}, name="unrelated-web"),
    ]  # fmt: skip
    for name, (node, containers) in EXPECTED.items():
        for container in containers:
            api.logs[(NS, name, container)] = numbered(f"{node} {container}")
    api.previous_logs[(NS, W2, "rpc-server")] = (
        numbered("w2 rpc-server previous", 12) + PREVIOUS_MARKER + "\n"
    )
    api.secrets = [
        {
            "metadata": {"name": "llama-rpc-api-key", "namespace": NS},
            "type": "Opaque",
            "data": {"api-key": base64.b64encode(API_KEY.encode()).decode()},
        }
    ]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def plan() -> dict[str, Any]:
    return {
        "version": 1,
        "head": "head1",
        "workers": ["w1", "w2"],
        "hosts": [
            {"name": "head1", "role": "head"},
            {"name": "w1", "role": "worker"},
            {"name": "w2", "role": "worker"},
        ],
        "model": {"name": "tiny-llama-8L"},
    }


def run_verify(tmp: Path, api: FakeKubeApi, **extra: Any) -> subprocess.CompletedProcess:
    """The real playbooks/verify.yml on a localhost-only inventory, -v."""
    inventory = tmp / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "llm_head": {"hosts": {"localhost": None}},
                        "llm_workers": {"hosts": {}},
                    },
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                }
            }
        )
    )
    settings = {
        "llmfleet_plan": plan(),
        "verify_target": "kubernetes",
        "verify_kubeconfig": str(api.kubeconfig(tmp / "kubeconfig")),
        "verify_api_url": f"http://127.0.0.1:{closed_port()}",
        "verify_output_dir": str(tmp / "out"),
        "verify_log_lines": LOG_LINES,
        "verify_kubernetes_node_units": [],
        "verify_request_timeout": 10,
        **extra,
    }
    (tmp / "vars.yml").write_text(yaml.safe_dump(settings))
    env = ansible_env()
    env.pop("KUBECONFIG", None)
    env["TMPDIR"] = str(tmp)  # the Kubernetes client's discovery cache
    return subprocess.run(
        ["ansible-playbook", "-v", "-i", str(inventory), "-e", f"@{tmp / 'vars.yml'}", str(PLAYBOOK)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def assert_no_secret(proc: subprocess.CompletedProcess) -> None:
    for secret in (TOKEN, API_KEY, base64.b64encode(API_KEY.encode()).decode()):
        assert secret not in proc.stdout + proc.stderr, f"{secret} in the ansible-playbook output"


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi("127.0.0.1", token=TOKEN, workdir=tmp_path / "pki") as server:
        yield server


def test_a_failed_request_leaves_every_containers_current_and_previous_log(api, tmp_path) -> None:
    put_fleet(api)
    proc = run_verify(tmp_path, api)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-6000:]
    logs = tmp_path / "out" / "logs"
    # The failure names the request's error, what was collected and where.
    assert "verify failed: no chat completion from http://127.0.0.1:" in proc.stdout, output[-6000:]
    assert f"Logs: {logs}/" in proc.stdout
    assert "Logs of 9 containers of 3 pods in namespace llmfleet" in proc.stdout
    assert "on nodes head1, w1, w2" in proc.stdout
    assert f"restarted: {W2}/rpc-server on node w2 (3 restarts, last OOMKilled)" in proc.stdout
    assert_no_secret(proc)

    expected_files = {
        f"{NS}_{name}_{c}.log" for name, (_unused, containers) in EXPECTED.items() for c in containers
    }
    assert {p.name for p in logs.iterdir()} == expected_files | {"pods.txt"}

    for name, (node, containers) in EXPECTED.items():
        for container in containers:
            text = (logs / f"{NS}_{name}_{container}.log").read_text()
            first = text.splitlines()[0]
            assert first.startswith(f"# node {node}: pod {NS}/{name}, "), first
            assert first.endswith(f"container {container}"), first
            # The current log: exactly the last LOG_LINES lines.
            assert f"{node} {container} line 20\n" in text
            assert f"{node} {container} line {20 - LOG_LINES + 1}\n" in text
            assert f"{node} {container} line {20 - LOG_LINES}\n" not in text
            if (name, container) != (W2, "rpc-server"):
                assert "# no previous container" in text, text
                assert (
                    'previous terminated container "' + container + '" in pod "' + name + '" not found'
                    in text
                )

    w2 = (logs / f"{NS}_{W2}_rpc-server.log").read_text()
    assert PREVIOUS_MARKER in w2
    assert "# no previous container" not in w2
    assert (
        "restarts 3" in w2
        and "last state terminated (OOMKilled, exit code 137) at 2026-11-30T06:41:07Z" in w2
    )
    # Previous before current, and the previous one's tail too.
    assert w2.index(PREVIOUS_MARKER) < w2.index("w2 rpc-server line 20")
    assert "w2 rpc-server previous line 12" in w2 and "w2 rpc-server previous line 6\n" not in w2
    head = (logs / f"{NS}_{HEAD}_model.log").read_text()
    assert head.splitlines()[0] == f"# node head1: pod {NS}/{HEAD}, init container model"

    pods = (logs / "pods.txt").read_text()
    assert f"w2 {W2} Running" in pods
    assert (
        "rpc-server: restarts 3, state running since 2026-11-30T06:00:00Z, last state terminated (OOMKilled"
        in pods
    )
    assert "unrelated-web" not in pods and "rpc-elsewhere" not in pods

    # Every container was read twice (current, previous) with tailLines = verify_log_lines, and
    # nothing outside the namespace and selector was read.
    reads = api.log_requests()
    assert reads, api.requests
    assert all(r["tailLines"] == str(LOG_LINES) for r in reads), reads
    assert all(r["namespace"] == NS for r in reads)
    asked = {(r["pod"], r["container"], r.get("previous", "false").lower() == "true") for r in reads}
    assert asked == {
        (name, c, previous)
        for name, (_unused, cs) in EXPECTED.items()
        for c in cs
        for previous in (False, True)
    }
    assert any(p.startswith(f"/api/v1/namespaces/{NS}/pods?labelSelector=") and "part-of%3Dllmfleet" in p
               for p in api.requests)  # fmt: skip


def test_no_pod_of_ours_gives_a_clear_message_and_still_the_node_journals(api, tmp_path) -> None:
    put_fleet(api)
    api.pods = [
        p for p in api.pods if p["metadata"]["namespace"] != NS or OURS not in p["metadata"]["labels"]
    ]
    proc = run_verify(tmp_path, api, verify_kubernetes_node_units=["llmfleet-verify-test.service"])
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-6000:]
    assert (
        "No pod log was collected: no pod in namespace llmfleet matches app.kubernetes.io/part-of=llmfleet"
        in proc.stdout
    ), output[-6000:]
    logs = tmp_path / "out" / "logs"
    assert f"Logs: {logs}/" in proc.stdout
    assert "# no pod matches" in (logs / "pods.txt").read_text()
    # The journal of the play's hosts (the nodes) is still collected, one file per host.
    assert {p.name for p in logs.iterdir()} == {"pods.txt", "localhost.log"}
    assert (
        (logs / "localhost.log")
        .read_text()
        .startswith("# localhost: journalctl -n 7 --unit=llmfleet-verify-test.service")
    )
    assert api.log_requests() == []
    assert_no_secret(proc)


def test_the_node_journals_are_the_k3s_roles_units_by_default(api, tmp_path) -> None:
    """verify_kubernetes_node_units unset: the units the k3s role installs (k3s_names, its
    tasks_from=names), not typed in the verify role (issue #29)."""
    put_fleet(api)
    proc = run_verify(tmp_path, api, verify_kubernetes_node_units=None)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-6000:]
    assert (
        (tmp_path / "out" / "logs" / "localhost.log")
        .read_text()
        .startswith("# localhost: journalctl -n 7 --unit=k3s.service --unit=k3s-agent.service\n")
    ), output[-6000:]
    assert_no_secret(proc)


def test_an_api_server_that_does_not_answer_is_named_in_the_failure(api, tmp_path) -> None:
    put_fleet(api)
    api.down = True
    proc = run_verify(tmp_path, api)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-6000:]
    assert "No pod log was collected: the pods in namespace llmfleet could not be listed" in proc.stdout, (
        output[-6000:]
    )
    assert "# the pods could not be listed" in (tmp_path / "out" / "logs" / "pods.txt").read_text()
    assert_no_secret(proc)


class ChatServer:
    """A stand-in for the API Service: records each request, answers one chat completion."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": "The sea is wide."}}]}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_answer_passes_with_the_key_from_the_secret_and_collects_nothing(api, tmp_path) -> None:
    put_fleet(api)
    chat = ChatServer()
    try:
        proc = run_verify(tmp_path, api, verify_api_url=chat.url + "/")
    finally:
        chat.close()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    (seen,) = chat.seen
    assert seen["path"] == "/v1/chat/completions"
    assert seen["auth"] == f"Bearer {API_KEY}"
    assert seen["body"]["model"] == "tiny-llama-8L" and seen["body"]["max_tokens"] == 32
    assert 'answered "The sea is wide."' in proc.stdout
    assert not (tmp_path / "out" / "logs").exists()
    assert api.log_requests() == []
    assert_no_secret(proc)

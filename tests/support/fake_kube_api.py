"""A fake Kubernetes API server for tests: HTTPS with a self-signed CA, pods, their logs, secrets.

It answers ``GET /api/v1/namespaces/<ns>/pods?labelSelector=k=v,...`` with a PodList of the pods
the test put in ``pods`` (filtered by namespace and equality selectors, as the API server does),
refuses a missing or wrong bearer token with 401 and anything else with 404, and records every
request path. ``service_account(dir)`` writes the files a pod's service account mount holds
(token, ca.crt, namespace).

    with FakeKubeApi("127.0.0.1", token="t") as api:
        api.pods = [pod("w1", "127.0.0.1", 50052, namespace="llmfleet", labels={...})]
        api.service_account(sa_dir, "llmfleet")

For the Kubernetes Python client (kubernetes.core's modules) it also answers discovery
(``/version``, ``/api``, ``/api/v1``, ``/apis``), a single pod, a pod's log and a secret:

- ``GET /api/v1/namespaces/<ns>/pods/<name>/log?container=c&tailLines=n&previous=true`` answers
  the text in ``logs[(ns, name, c)]`` (or ``previous_logs`` with ``previous``), its last ``n``
  lines when ``tailLines`` is given. Like the real API server it answers 400 when a pod of
  several containers is asked without ``container``, when the container is not in the pod, and
  ``previous terminated container "c" in pod "name" not found`` when there is no previous
  container (one that never restarted).
- ``GET /api/v1/namespaces/<ns>/secrets/<name>`` answers the Secret in ``secrets``.

``kubeconfig(path, namespace)`` writes a kubeconfig for it (its CA, the bearer token).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

from tests.support.tls import self_signed

# What the API server's discovery says about the resources this fake serves (core group only).
_CORE_RESOURCES = [
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
     "verbs": ["get", "list", "watch"], "shortNames": ["po"]},
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
     "verbs": ["get", "list", "watch"]},
]  # fmt: skip


def pod(
    node: str,
    ip: str,
    port: int,
    *,
    namespace: str,
    labels: dict[str, str],
    ready: bool = True,
    name: Optional[str] = None,
    created: str = "2026-11-30T06:00:00Z",
    deleting: bool = False,
    containers: Sequence[str] = ("rpc-server",),
    init_containers: Sequence[str] = (),
    restarts: Optional[dict[str, int]] = None,
    last_terminated: Optional[dict[str, dict[str, Any]]] = None,
    owner: Optional[str] = None,
    owner_kind: str = "DaemonSet",
) -> dict[str, Any]:
    """A Pod as the API returns it, with the fields the supervisor and verify read.

    The first of ``containers`` carries the port named ``rpc``. ``restarts`` gives a container's
    restartCount and ``last_terminated`` its ``lastState.terminated`` (e.g. ``{"reason":
    "OOMKilled", "exitCode": 137}``); init containers are reported as completed. ``owner``: the name
    of the controller (``owner_kind``, apps/v1) in the pod's ownerReferences (none when not given).
    """
    restarts = restarts or {}
    last_terminated = last_terminated or {}
    meta: dict[str, Any] = {
        "name": name or f"rpc-{node}",
        "namespace": namespace,
        "labels": dict(labels),
        "creationTimestamp": created,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T06:30:00Z"
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner_kind,
                "name": owner,
                "uid": f"uid-{owner}",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [
            {"name": c, **({"ports": [{"name": "rpc", "containerPort": port}]} if i == 0 else {})}
            for i, c in enumerate(containers)
        ],
    }
    status: dict[str, Any] = {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {
                "name": c,
                "ready": ready,
                "restartCount": restarts.get(c, 0),
                "state": {"running": {"startedAt": created}},
                "lastState": {"terminated": last_terminated[c]} if c in last_terminated else {},
            }
            for c in containers
        ],
    }
    if init_containers:
        spec["initContainers"] = [{"name": c} for c in init_containers]
        status["initContainerStatuses"] = [
            {
                "name": c,
                "ready": True,
                "restartCount": restarts.get(c, 0),
                "state": {"terminated": {"reason": "Completed", "exitCode": 0}},
                "lastState": {"terminated": last_terminated[c]} if c in last_terminated else {},
            }
            for c in init_containers
        ]
    return {"metadata": meta, "spec": spec, "status": status}


def _selects(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _unused, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _status(code: int, message: str, reason: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeApi:
    def __init__(self, address: str, token: str = "fake-token", workdir: Optional[Path] = None) -> None:
        import tempfile

        self.address = address
        self.token = token
        self.pods: list[dict] = []
        # (namespace, pod, container) -> log text of the running / the previous container
        self.logs: dict[tuple[str, str, str], str] = {}
        self.previous_logs: dict[tuple[str, str, str], str] = {}
        self.secrets: list[dict] = []
        self.requests: list[str] = []
        self.down = False
        self._dir = Path(workdir or tempfile.mkdtemp(prefix="fake-kube-api-"))
        self.cert, self.key = self_signed(address, self._dir)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def do_GET(self) -> None:
                api.requests.append(self.path)
                if api.down:
                    self._send(503, {"kind": "Status", "message": "down"})
                    return
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._send(401, {"kind": "Status", "message": "Unauthorized"})
                    return
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                query = urllib.parse.parse_qs(url.query)
                if parts == ["version"]:
                    self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.4-fake",
                                     "platform": "linux/amd64"})  # fmt: skip
                elif parts == ["api"]:
                    self._send(200, {"kind": "APIVersions", "versions": ["v1"],
                                     "serverAddressByClientCIDRs": []})  # fmt: skip
                elif parts == ["api", "v1"]:
                    self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                                     "resources": _CORE_RESOURCES})  # fmt: skip
                elif parts == ["apis"]:
                    self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
                elif len(parts) < 5 or parts[:3] != ["api", "v1", "namespaces"]:
                    self._send(404, _status(404, "not found", "NotFound"))
                elif len(parts) == 5 and parts[4] == "pods":
                    self._pods(parts[3], query.get("labelSelector", [""])[0])
                elif len(parts) == 6 and parts[4] == "pods":
                    found = api._pod(parts[3], parts[5])
                    if found is None:
                        self._send(404, _status(404, f'pods "{parts[5]}" not found', "NotFound"))
                    else:
                        self._send(200, {"kind": "Pod", "apiVersion": "v1", **found})
                elif len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
                    self._log(parts[3], parts[5], query)
                elif len(parts) == 6 and parts[4] == "secrets":
                    secret = next(
                        (
                            s
                            for s in api.secrets
                            if s["metadata"]["namespace"] == parts[3] and s["metadata"]["name"] == parts[5]
                        ),
                        None,
                    )
                    if secret is None:
                        self._send(404, _status(404, f'secrets "{parts[5]}" not found', "NotFound"))
                    else:
                        self._send(200, {"kind": "Secret", "apiVersion": "v1", **secret})
                else:
                    self._send(404, _status(404, "not found", "NotFound"))

            def _pods(self, namespace: str, selector: str) -> None:
                items = [
                    p
                    for p in api.pods
                    if p["metadata"]["namespace"] == namespace and _selects(selector, p["metadata"]["labels"])
                ]
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})

            def _log(self, namespace: str, name: str, query: dict[str, list[str]]) -> None:
                found = api._pod(namespace, name)
                if found is None:
                    self._send(404, _status(404, f'pods "{name}" not found', "NotFound"))
                    return
                names = [
                    c["name"] for c in found["spec"].get("initContainers", []) + found["spec"]["containers"]
                ]
                container = query.get("container", [""])[0]
                if not container:
                    if len(found["spec"]["containers"]) != 1:
                        message = (
                            f"a container name must be specified for pod {name}, "
                            f"choose one of: [{' '.join(c['name'] for c in found['spec']['containers'])}]"
                        )
                        self._send(400, _status(400, message, "BadRequest"))
                        return
                    container = found["spec"]["containers"][0]["name"]
                if container not in names:
                    self._send(
                        400, _status(400, f"container {container} is not valid for pod {name}", "BadRequest")
                    )
                    return
                # The API server reads booleans in queries as true unless "false" or "0".
                previous = query.get("previous", ["false"])[0].lower() not in ("false", "0", "")
                source = api.previous_logs if previous else api.logs
                key = (namespace, name, container)
                if previous and key not in source:
                    message = f'previous terminated container "{container}" in pod "{name}" not found'
                    self._send(400, _status(400, message, "BadRequest"))
                    return
                text = source.get(key, "")
                tail = query.get("tailLines", [""])[0]
                if tail:
                    lines = text.splitlines(keepends=True)
                    text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
                self._send_text(200, text)

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_text(self, code: int, text: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _pod(self, namespace: str, name: str) -> Optional[dict]:
        return next(
            (
                p
                for p in self.pods
                if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == name
            ),
            None,
        )

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"https://{host}:{self.port}"

    def log_requests(self) -> list[dict[str, str]]:
        """The log requests received, in order: pod, namespace and the query's parameters."""
        found = []
        for path in self.requests:
            url = urllib.parse.urlsplit(path)
            parts = url.path.strip("/").split("/")
            if len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                found.append({"namespace": parts[3], "pod": parts[5], **query})
        return found

    def service_account(self, directory: Path, namespace: str) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(self.token)
        (directory / "namespace").write_text(namespace)
        (directory / "ca.crt").write_bytes(self.cert.read_bytes())
        return directory

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for this server: its CA inline and the bearer token (file mode 0600)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fake",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.cert.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": "fake-admin", "user": {"token": self.token}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake-admin", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        path.chmod(0o600)
        return path

    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": self.address, "KUBERNETES_SERVICE_PORT": str(self.port)}

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

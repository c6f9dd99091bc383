"""A fake Kubernetes API server for tests: HTTPS with a self-signed CA, pods only.

It answers ``GET /api/v1/namespaces/<ns>/pods?labelSelector=k=v,...`` with a PodList of the pods
the test put in ``pods`` (filtered by namespace and equality selectors, as the API server does),
refuses a missing or wrong bearer token with 401 and anything else with 404, and records every
request path. ``service_account(dir)`` writes the files a pod's service account mount holds
(token, ca.crt, namespace).

    with FakeKubeApi("127.0.0.1", token="t") as api:
        api.pods = [pod("w1", "127.0.0.1", 50052, namespace="llmfleet", labels={...})]
        api.service_account(sa_dir, "llmfleet")
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

from tests.support.tls import self_signed


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
) -> dict[str, Any]:
    """A Pod as the API returns it, with the fields the supervisor reads."""
    meta: dict[str, Any] = {
        "name": name or f"rpc-{node}",
        "namespace": namespace,
        "labels": dict(labels),
        "creationTimestamp": created,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T06:30:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "rpc-server", "ports": [{"name": "rpc", "containerPort": port}]}],
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _selects(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKubeApi:
    def __init__(self, address: str, token: str = "fake-token", workdir: Optional[Path] = None) -> None:
        import tempfile

        self.address = address
        self.token = token
        self.pods: list[dict] = []
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
                if len(parts) != 5 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
                    self._send(404, {"kind": "Status", "message": "not found"})
                    return
                selector = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
                items = [
                    p
                    for p in api.pods
                    if p["metadata"]["namespace"] == parts[3] and _selects(selector, p["metadata"]["labels"])
                ]
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def service_account(self, directory: Path, namespace: str) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(self.token)
        (directory / "namespace").write_text(namespace)
        (directory / "ca.crt").write_bytes(self.cert.read_bytes())
        return directory

    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": self.address, "KUBERNETES_SERVICE_PORT": str(self.port)}

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

"""release_lock's Http against hostile servers on loopback (issue 31, items 9 and 10).

- A token goes over https to its own host and port only: an https API that redirects to plain
  http of the same host name and port (one port speaking both, told apart by the first byte) must
  not get the token a second time, in clear.
- The per-answer deadline holds against a server that drips its answer a byte at a time, each
  byte well within the per-read timeout: the status line and headers, or the body.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingTCPServer

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import release_lock as rl

from tests.support.hostile_http import Dripping
from tests.support.tls import self_signed

TOKEN = "Bearer ghp_secret-token-31"


class BothOnOnePort:
    """https and plain http on one loopback port (a TLS ClientHello starts with 0x16).

    Over https, ``/start`` redirects to ``http://127.0.0.1:<same port>/next``; every request is
    recorded as (tls, path, Authorization)."""

    def __init__(self, directory: Path) -> None:
        cert, key = self_signed("127.0.0.1", directory, "both-on-one-port")
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
        self.cert = cert
        self.seen: list[tuple[bool, str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"
            tls = False

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                first = self.request.recv(1, socket.MSG_PEEK)
                if first == b"\x16":
                    self.request = server_ctx.wrap_socket(self.request, server_side=True)
                    self.tls = True
                super().setup()

            def do_GET(self) -> None:
                outer.seen.append((self.tls, self.path, self.headers.get("Authorization")))
                if self.tls and self.path == "/start":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{outer.port}/next")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> BothOnOnePort:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("key", ["127.0.0.1:{port}", "https://127.0.0.1:{port}"])
def test_a_token_does_not_follow_a_redirect_to_plain_http_of_the_same_host(
    tmp_path: Path, key: str, monkeypatch
) -> None:
    with BothOnOnePort(tmp_path) as both:
        monkeypatch.setenv("SSL_CERT_FILE", str(both.cert))  # the client trusts the test CA
        http = rl.Http(timeout=5, deadline=10, tokens={key.format(port=both.port): TOKEN})
        answer = http.request(f"https://127.0.0.1:{both.port}/start", "test API", 1 << 16)
    assert answer.status == 200 and answer.url == f"http://127.0.0.1:{both.port}/next"
    assert both.seen == [(True, "/start", TOKEN), (False, "/next", None)]


def test_a_token_for_a_plain_http_api_is_never_sent(tmp_path: Path) -> None:
    with BothOnOnePort(tmp_path) as both:
        for key in (f"http://127.0.0.1:{both.port}", f"127.0.0.1:{both.port}"):
            http = rl.Http(timeout=5, deadline=10, tokens={key: TOKEN})
            http.request(f"http://127.0.0.1:{both.port}/next", "test API", 1 << 16)
    assert both.seen == [(False, "/next", None), (False, "/next", None)]


@pytest.mark.parametrize("headers_first", [True, False], ids=["dripped-body", "dripped-headers"])
def test_the_deadline_holds_against_a_server_that_drips_bytes(headers_first: bool) -> None:
    """200 bytes, one every 50 ms (10 s in all), each read well within the 5 s timeout."""
    body = b'{"assets": [' + b" " * 186 + b"]}"
    with Dripping(body, gap=0.05, headers_first=headers_first) as server:
        http = rl.Http(timeout=5, deadline=1)
        began = time.monotonic()
        with pytest.raises(rl.LockError, match=r"no whole answer within 1 s|took more than 1 s"):
            http.request(server.url, "dripping API", 1 << 16)
        took = time.monotonic() - began
    assert took < 2.5, f"the 1 s deadline took {took:.1f} s to act"


def test_a_slow_but_timely_answer_is_still_read_whole() -> None:
    body = b'{"assets": []}'
    with Dripping(body, gap=0.01) as server:
        answer = rl.Http(timeout=5, deadline=10).request(server.url, "slow API", 1 << 16)
    assert answer.status == 200 and answer.body == body

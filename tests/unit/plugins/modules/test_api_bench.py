"""api_bench against a loopback server that streams slowly (no real model needed).

The server sends its chunks 1 s apart: the time to first token must be the first chunk's, not the
end of the stream, and the key must reach the server. The bounds are relative to the stream's own
length, so a loaded machine (two test workers on two cores) does not fail them.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.llmfleet.cluster.plugins.modules import api_bench

DELAY = 1.0


class SlowStream(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        if self.headers.get("Authorization") != "Bearer k3y":
            self.send_response(401)
            self.end_headers()
            return
        assert body["stream"] is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("one", " two", " three"):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            self.wfile.write(("data: " + json.dumps(chunk) + "\n\n").encode())
            self.wfile.flush()
            time.sleep(DELAY)
        final = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
        self.wfile.write(("data: " + json.dumps(final) + "\n\ndata: [DONE]\n\n").encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SlowStream)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions"
    httpd.shutdown()


def test_first_token_arrives_before_the_stream_ends(server: str) -> None:
    result = api_bench.one_request(server, "k3y", {"stream": True}, timeout=10)
    assert result["ok"] is True, result
    # the first chunk, not the end: at least the two later gaps before the stream ends
    assert result["ttft"] < result["seconds"] - 1.5 * DELAY
    assert result["seconds"] >= 3 * DELAY
    assert result["completion_tokens"] == 3
    # two tokens after the first over two gaps of DELAY
    assert result["output_tps"] == pytest.approx(2 / (2 * DELAY), rel=0.25)


def test_a_wrong_key_is_a_failed_request(server: str) -> None:
    result = api_bench.one_request(server, "nope", {"stream": True}, timeout=10)
    assert (result["ok"], result["status"]) == (False, 401)


def test_an_unreachable_server_is_a_failed_request() -> None:
    result = api_bench.one_request("http://127.0.0.1:9/v1/chat/completions", "", {"stream": True}, timeout=2)
    assert result["ok"] is False
    assert result["status"] == 0


# Over TLS: the chat page's port relays the API (llmfleet_tls), with a self-signed certificate.


@pytest.fixture()
def tls_api(tmp_path):
    """The chat app with TLS and --api-passthrough in front of the fake streaming upstream."""
    from tests.support.chat_app import serve_chat_app
    from tests.support.fake_openai import FakeUpstream
    from tests.support.tls import self_signed

    cert, key = self_signed("127.0.0.1", tmp_path, common_name="head")
    with (
        FakeUpstream(tokens=["one", " two", " three"], delay=0.1, api_key="k3y") as up,
        serve_chat_app(
            upstream=up.url,
            password="page-password-of-24-chars",
            api_key="k3y",  # the page's upstream key: without one its API relay is closed (403)
            tls_cert=str(cert),
            tls_key=str(key),
            api_passthrough=True,
        ) as page,
    ):
        url = f"https://127.0.0.1:{page.server_address[1]}/v1/chat/completions"
        yield url, cert.read_text(), up


def test_https_with_the_pages_certificate(tls_api) -> None:
    url, pem, up = tls_api
    context = api_bench.tls_context(url, pem)
    result = api_bench.one_request(url, "k3y", {"stream": True, "messages": []}, timeout=10, context=context)
    assert result["ok"] is True, result
    assert result["completion_tokens"] == 3
    assert up.requests[-1]["headers"]["Authorization"] == "Bearer k3y"


def test_https_refuses_an_unknown_certificate(tls_api) -> None:
    url, _unused, up = tls_api
    result = api_bench.one_request(
        url, "k3y", {"stream": True}, timeout=10, context=api_bench.tls_context(url)
    )
    assert result["ok"] is False
    assert "CERTIFICATE_VERIFY_FAILED" in result["error"], result
    assert up.requests == []  # the key never left over an unchecked connection
    insecure = api_bench.tls_context(url, validate_certs=False)
    assert api_bench.one_request(url, "k3y", {"stream": True}, timeout=10, context=insecure)["ok"] is True


def test_plain_http_needs_no_tls_context() -> None:
    assert api_bench.tls_context("http://127.0.0.1:8080/v1/chat/completions", "junk") is None

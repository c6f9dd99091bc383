"""The chat page app (roles/chat_ui/files/llmfleet_chat.py) against a fake upstream on loopback.

What must hold: 401 without the password, 200 with it, /healthz open, the password
compared with hmac.compare_digest, server-sent events relayed one by one as the
upstream sends them, the API key added upstream and never sent to the browser.
"""

from __future__ import annotations

import base64
import hmac
import http.client
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.chat_app import APP_PATH, load_chat_app
from tests.support.fake_openai import FakeUpstream
from tests.support.tls import self_signed

API_KEY = "sk-llmfleet-test-0123456789abcdef"
USER = "alice"
PASSWORD = "correct horse battery staple"


chat = load_chat_app()


class App:
    """The app served on a loopback port in a thread."""

    def __init__(self, upstream: str, **overrides: Any):
        settings: dict[str, Any] = {
            "upstream": upstream,
            "password": PASSWORD,
            "username": USER,
            "api_key": API_KEY,
            "port": 0,
            "prefix": "/chat",
            "timeout": 20.0,
        }
        settings.update(overrides)
        self.config = chat.Config(**settings)
        self.server = chat.ChatServer(self.config)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.seen: list[bytes] = []  # every byte any response sent to the "browser"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def connection(self, timeout: float = 20.0) -> http.client.HTTPConnection:
        if self.server.tls_context is not None:
            context = ssl.create_default_context(cafile=self.config.tls_cert)
            context.check_hostname = False
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=context)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        auth: Optional[tuple[str, str]] = (USER, PASSWORD),
        headers: Optional[dict[str, str]] = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = self.connection()
        hdrs = dict(headers or {})
        if auth is not None:
            hdrs["Authorization"] = basic(*auth)
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, data, hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        self.seen.append(_response_bytes(resp, payload))
        return resp.status, dict(resp.getheaders()), payload


def _response_bytes(resp: http.client.HTTPResponse, body: bytes) -> bytes:
    head = "".join("{}: {}\n".format(*kv) for kv in resp.getheaders()).encode()
    return head + b"\n" + body


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode((f"{user}:{password}").encode()).decode()


def chat_body(text: str = "Say something.") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def sse_contents(body: bytes) -> list[str]:
    """The delta contents of every data: event, in order."""
    out = []
    for line in body.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: ") :])
        for choice in event.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                out.append(piece)
    return out


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=API_KEY, tokens=["Hel", "lo ", "fleet", "!"]) as up:
        yield up


@pytest.fixture
def app(upstream: FakeUpstream) -> Iterator[App]:
    server = App(upstream.url)
    yield server
    server.close()


# The password ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/chat/", "/chat/app.js", "/chat/style.css", "/chat/api/config", "/other"])
def test_everything_but_healthz_needs_the_password(app: App, path: str) -> None:
    status, headers, body = app.request("GET", path, auth=None)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic realm=")
    assert b"<html" not in body


def test_chat_api_needs_the_password(app: App, upstream: FakeUpstream) -> None:
    status, _unused, _unused2 = app.request("POST", "/chat/api/chat", chat_body(), auth=None)
    assert status == 401
    assert upstream.requests == [], "an unauthenticated request reached the upstream"


@pytest.mark.parametrize(
    "header",
    [
        basic(USER, "wrong password"),
        basic("mallory", PASSWORD),
        basic(USER, PASSWORD + "x"),
        basic(USER, PASSWORD[:-1]),
        basic(USER, ""),
        "Basic " + base64.b64encode(USER.encode()).decode(),  # no colon
        "Basic not-base64!!",
        "Bearer " + PASSWORD,
        basic(USER, PASSWORD).replace("Basic", "Digest"),
    ],
)
def test_wrong_credentials_get_401(app: App, header: str) -> None:
    status, _unused, _unused2 = app.request("GET", "/chat/", auth=None, headers={"Authorization": header})
    assert status == 401


def test_the_password_gives_the_page(app: App) -> None:
    status, headers, body = app.request("GET", "/chat/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b'<textarea id="prompt"' in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]


def test_the_scheme_name_is_case_insensitive(app: App) -> None:
    status, _unused, _unused2 = app.request(
        "GET", "/chat/", auth=None, headers={"Authorization": "basic " + basic(USER, PASSWORD)[6:]}
    )
    assert status == 200


@pytest.mark.parametrize("path", ["/healthz", "/chat/healthz"])
def test_healthz_is_open(app: App, path: str) -> None:
    status, _unused, body = app.request("GET", path, auth=None)
    assert (status, body) == (200, b"ok\n")


def test_password_is_compared_in_constant_time(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert app.request("GET", "/chat/")[0] == 200
    assert (PASSWORD.encode(), PASSWORD.encode()) in calls
    assert (USER.encode(), USER.encode()) in calls

    # Both parts are compared even when the user name is wrong (no early exit).
    calls.clear()
    assert app.request("GET", "/chat/", auth=("mallory", "guess"))[0] == 401
    assert (b"guess", PASSWORD.encode()) in calls

    # The decision is compare_digest's: if it says no, the right password is refused.
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: False)
    assert app.request("GET", "/chat/")[0] == 401


def test_the_password_is_not_compared_with_eq() -> None:
    source = APP_PATH.read_text()
    auth = source[source.index("def check_basic_auth") : source.index("def validate_chat_request")]
    assert "==" not in auth.split('"""')[2], "check_basic_auth must only compare with hmac.compare_digest"


# The page ----------------------------------------------------------------------


def test_page_uses_only_relative_urls(app: App) -> None:
    _unused, _unused2, html = app.request("GET", "/chat/")
    _unused, _unused2, js = app.request("GET", "/chat/app.js")
    refs = re.findall(rb'(?:src|href)="([^"]*)"', html)
    assert set(refs) == {b"data:,", b"style.css", b"app.js"}
    fetched = re.findall(rb'fetch\("([^"]*)"', js)
    assert set(fetched) == {b"api/config", b"api/chat"}
    assert re.findall(rb"[\"'](/[^\"']*)", html + js) == [], "an absolute path in the page"


def test_prefix_without_slash_redirects(app: App) -> None:
    status, headers, _unused = app.request("GET", "/chat")
    assert status == 308
    assert headers["Location"] == "/chat/"


def test_served_under_any_prefix(upstream: FakeUpstream) -> None:
    server = App(upstream.url, prefix="/team/llm/")
    try:
        assert server.request("GET", "/team/llm/")[0] == 200
        assert server.request("GET", "/team/llm/app.js")[0] == 200
        assert server.request("GET", "/chat/")[0] == 404
        assert server.request("GET", "/team/llm/healthz", auth=None)[0] == 200
    finally:
        server.close()


def test_served_at_the_root(upstream: FakeUpstream) -> None:
    server = App(upstream.url, prefix="/")
    try:
        assert server.request("GET", "/")[0] == 200
        assert server.request("GET", "/style.css")[0] == 200
        assert server.request("GET", "/healthz", auth=None)[0] == 200
    finally:
        server.close()


def test_dark_theme_comes_after_the_base_rules() -> None:
    css = chat.STYLE_CSS
    dark = css.index("@media (prefers-color-scheme: dark)")
    for rule in (":root {", ".msg.user {", ".msg.assistant {", "body {", "button {"):
        assert css.index(rule) < dark, rule
    block = css[dark:]
    for var in ("--bg", "--fg", "--user-bg", "--user-fg", "--bot-bg", "--bot-fg", "--accent", "--muted"):
        assert var + ":" in block, "the dark theme does not set " + var


def test_config_names_the_upstream_model(app: App) -> None:
    status, _unused, body = app.request("GET", "/chat/api/config")
    assert status == 200
    assert json.loads(body) == {"title": "llmfleet chat", "model": "fake-model"}


# The relay ----------------------------------------------------------------------


def test_chat_streams_the_answer_and_adds_the_key_upstream(app: App, upstream: FakeUpstream) -> None:
    status, headers, body = app.request("POST", "/chat/api/chat", chat_body("Hi"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert sse_contents(body) == ["Hel", "lo ", "fleet", "!"]
    assert body.rstrip().endswith(b"data: [DONE]")
    posts = [r for r in upstream.requests if r["method"] == "POST"]
    assert len(posts) == 1
    sent = posts[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["Authorization"] == "Bearer " + API_KEY
    assert sent["body"]["stream"] is True
    assert sent["body"]["messages"] == [{"role": "user", "content": "Hi"}]
    assert sent["body"]["model"] == "fake-model"
    # The browser's own Basic credentials stay with the app.
    for request in upstream.requests:
        assert PASSWORD not in json.dumps(request)
        assert "Basic" not in request["headers"].get("Authorization", "")


def test_without_a_key_no_authorization_goes_upstream() -> None:
    with FakeUpstream(api_key="") as up:
        server = App(up.url, api_key="")
        try:
            status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
        finally:
            server.close()
    assert status == 200
    assert sse_contents(body) == up.tokens
    assert all("Authorization" not in r["headers"] for r in up.requests)


def test_a_wrong_key_is_reported_as_the_upstream_refusing(upstream: FakeUpstream) -> None:
    server = App(upstream.url, api_key="sk-wrong")
    try:
        status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
    finally:
        server.close()
    assert status == 502
    message = json.loads(body)["error"]
    assert "answered 401" in message
    assert upstream.url in message


def _read_event(resp: http.client.HTTPResponse) -> bytes:
    lines = []
    while True:
        line = resp.readline()
        if not line:
            break
        lines.append(line)
        if line in (b"\n", b"\r\n"):
            break
    return b"".join(lines)


def _open_stream(server: App) -> http.client.HTTPResponse:
    conn = server.connection()
    body = json.dumps(chat_body()).encode()
    conn.request(
        "POST",
        "/chat/api/chat",
        body,
        {"Authorization": basic(USER, PASSWORD), "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    return resp


def _open_api_stream(server: App) -> http.client.HTTPResponse:
    """A streamed completion through --api-passthrough, as an API client sends it."""
    conn = server.connection()
    conn.request(
        "POST",
        "/v1/chat/completions?trace=1",
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode(),
        {"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/event-stream"
    return resp


@pytest.mark.parametrize("route", ["page", "api passthrough"])
def test_first_chunk_reaches_the_client_before_the_upstream_finishes(route: str) -> None:
    gate = threading.Event()
    with FakeUpstream(api_key=API_KEY, tokens=["first", " second", " third"], gate=gate) as up:
        server = App(up.url, api_passthrough=route != "page")
        try:
            resp = _open_stream(server) if route == "page" else _open_api_stream(server)
            got = []
            deadline = time.monotonic() + 10
            while "first" not in got and time.monotonic() < deadline:
                got += sse_contents(_read_event(resp))
            # The upstream is held at the gate: it cannot finish until we let it.
            assert got == ["first"]
            assert not up.finished.is_set()
            gate.set()
            rest = resp.read()
        finally:
            server.close()
    assert up.finished.is_set()
    assert sse_contents(rest) == [" second", " third"]
    if route != "page":
        # The API client's call went upstream as it was: its query, its body, no page settings added.
        assert up.requests[-1]["path"] == "/v1/chat/completions?trace=1"
        assert up.requests[-1]["body"] == {"messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_a_client_that_hangs_up_stops_the_upstream() -> None:
    gate = threading.Event()
    tokens = [f"tok{i} " for i in range(500)]
    # Spaced out (500 x 20 ms): without the spacing the whole answer fits in the loopback socket
    # buffers and the upstream could finish before anyone noticed the client had gone.
    with FakeUpstream(api_key=API_KEY, tokens=tokens, gate=gate, delay=0.02) as up:
        server = App(up.url)
        try:
            resp = _open_stream(server)
            while "tok0 " not in sse_contents(_read_event(resp)):
                pass
            resp.close()  # the Stop button, a closed tab
            gate.set()
            assert up.aborted.wait(10), "the upstream kept streaming to nobody"
        finally:
            server.close()
    assert not up.finished.is_set()


def test_events_arrive_as_the_slow_upstream_sends_them() -> None:
    tokens = ["a", "b", "c", "d", "e"]
    delay = 0.25
    with FakeUpstream(api_key=API_KEY, tokens=tokens, delay=delay) as up:
        server = App(up.url)
        try:
            t0 = time.monotonic()
            resp = _open_stream(server)
            arrivals = []
            while True:
                event = _read_event(resp)
                if not event:
                    break
                for piece in sse_contents(event):
                    arrivals.append((piece, time.monotonic() - t0))
        finally:
            server.close()
    assert [p for p, _unused in arrivals] == tokens
    times = [t for _unused, t in arrivals]
    # Each token arrives about one delay after the previous one, not all at the end.
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) > delay * 0.5, gaps
    assert times[0] < times[-1] - delay * 3


def test_vllm_gets_the_model_it_serves_and_usage() -> None:
    with FakeUpstream(api_key=API_KEY, flavour="vllm", model="google/gemma-3-1b-it", tokens=["ok"]) as up:
        server = App(up.url)
        try:
            status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
        finally:
            server.close()
    assert status == 200, body
    assert sse_contents(body) == ["ok"]
    assert b'"completion_tokens": 1' in body
    post = next(r for r in up.requests if r["method"] == "POST")
    assert post["body"]["model"] == "google/gemma-3-1b-it"
    assert post["body"]["stream_options"] == {"include_usage": True}


def test_a_configured_model_is_used_without_asking() -> None:
    with FakeUpstream(api_key=API_KEY, flavour="vllm", model="m1") as up:
        server = App(up.url + "/v1/", model="m1")
        try:
            status, _unused, _unused2 = server.request("POST", "/chat/api/chat", chat_body())
        finally:
            server.close()
    assert status == 200
    assert [r["path"] for r in up.requests] == ["/v1/chat/completions"]


# The key never reaches the browser -----------------------------------------------


def test_the_key_is_never_sent_to_the_browser(app: App) -> None:
    app.request("GET", "/chat/", auth=None)
    for path in (
        "/chat/",
        "/chat/index.html",
        "/chat/app.js",
        "/chat/style.css",
        "/chat/api/config",
        "/nope",
    ):
        app.request("GET", path)
    app.request("GET", "/healthz", auth=None)
    app.request("POST", "/chat/api/chat", chat_body())
    app.request("POST", "/chat/api/chat", b"{not json")
    app.request("GET", "/chat/api/chat")
    assert len(app.seen) == 11
    for response in app.seen:
        assert API_KEY.encode() not in response
        assert base64.b64encode(API_KEY.encode()) not in response


def test_an_upstream_that_echoes_the_key_is_redacted() -> None:
    leaky = f"bad request from Authorization: Bearer {API_KEY}"
    with FakeUpstream(api_key=API_KEY, fail_status=400, fail_body=leaky) as up:
        server = App(up.url)
        try:
            status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
        finally:
            server.close()
    assert status == 502
    assert API_KEY.encode() not in body
    assert b"[redacted]" in body
    assert b"answered 400" in body

    with FakeUpstream(api_key=API_KEY, tokens=["key is ", API_KEY, " ok"]) as up:
        server = App(up.url)
        try:
            status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
        finally:
            server.close()
    assert status == 200
    assert API_KEY.encode() not in body
    assert sse_contents(body) == ["key is ", "[redacted]", " ok"]


# Errors ---------------------------------------------------------------------------


def test_upstream_down_is_a_502_naming_it() -> None:
    with FakeUpstream() as up:
        url = up.url
    server = App(url)
    try:
        status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
    finally:
        server.close()
    assert status == 502
    assert url in json.loads(body)["error"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b"{not json", None, 400, "not JSON"),
        ({"messages": []}, None, 400, "non-empty"),
        ({"messages": [{"role": "tool", "content": "x"}]}, None, 400, "role"),
        ({"messages": [{"role": "user", "content": 3}]}, None, 400, "content"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, None, 400, "max_tokens"),
        (chat_body(), {"Content-Type": "text/plain"}, 415, "application/json"),
    ],
)
def test_bad_requests_are_refused_before_the_upstream(
    app: App, upstream: FakeUpstream, body: Any, headers: Optional[dict[str, str]], status: int, words: str
) -> None:
    got, _unused, payload = app.request("POST", "/chat/api/chat", body, headers=headers)
    assert got == status
    assert words in json.loads(payload)["error"]
    assert not [r for r in upstream.requests if r["method"] == "POST"]


def test_wrong_methods(app: App) -> None:
    assert app.request("GET", "/chat/api/chat")[0] == 405
    assert app.request("POST", "/chat/", chat_body())[0] == 405


# Configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"), [("/chat", "/chat"), ("chat/", "/chat"), ("/", ""), ("", ""), ("/a/b/", "/a/b")]
)
def test_prefix_is_normalised(given: str, expected: str) -> None:
    assert chat.normalise_prefix(given) == expected


@pytest.mark.parametrize(
    ("url", "display", "base"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080", ""),
        ("http://head:8000/v1/", "http://head:8000", ""),
        ("https://llm.example.test/api", "https://llm.example.test:443/api", "/api"),
    ],
)
def test_upstream_url(url: str, display: str, base: str) -> None:
    up = chat.parse_upstream(url)
    assert (up.display, up.base_path) == (display, base)


@pytest.mark.parametrize("url", ["ftp://h/", "127.0.0.1:8080", "http://user:pw@h:1/", "http:///x"])
def test_bad_upstream_urls_are_refused(url: str) -> None:
    with pytest.raises(chat.ConfigError, match="upstream"):
        chat.parse_upstream(url)


def test_command_line_reads_secrets_from_files(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    (tmp_path / "key").write_text(API_KEY + "\n")
    config = chat.parse_args(
        ["--password-file", str(tmp_path / "pw"), "--api-key-file", str(tmp_path / "key"), "--port", "9"],
        environ={"LLMFLEET_CHAT_UPSTREAM": "http://10.0.0.1:8000", "LLMFLEET_CHAT_PREFIX": "/x"},
    )
    assert (config.password, config.api_key) == (PASSWORD, API_KEY)
    assert (config.upstream, config.prefix, config.port) == ("http://10.0.0.1:8000", "/x", 9)
    assert PASSWORD not in repr(config) and API_KEY not in repr(config)


def test_missing_or_empty_password_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(chat.ConfigError, match="password-file is required"):
        chat.parse_args([], environ={})
    (tmp_path / "pw").write_text("\n")
    with pytest.raises(chat.ConfigError, match=r"password file .*pw is empty"):
        chat.parse_args(["--password-file", str(tmp_path / "pw")], environ={})
    with pytest.raises(chat.ConfigError, match="missing"):
        chat.parse_args(["--password-file", str(tmp_path / "missing")], environ={})
    with pytest.raises(chat.ConfigError, match="password"):
        chat.ChatServer(chat.Config(password="", port=0))


# TLS -----------------------------------------------------------------------------


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    cert, key = self_signed("127.0.0.1", tmp_path, common_name="localhost")
    return str(cert), str(key)


def test_tls(upstream: FakeUpstream, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server = App(upstream.url, tls_cert=cert, tls_key=key)
    try:
        assert server.request("GET", "/chat/", auth=None)[0] == 401
        status, headers, _unused = server.request("GET", "/chat/")
        assert status == 200
        assert "max-age" in headers["Strict-Transport-Security"]
        status, _unused, body = server.request("POST", "/chat/api/chat", chat_body())
        assert status == 200
        assert sse_contents(body) == upstream.tokens
        # Plain HTTP gets no page (and no password prompt in clear text).
        plain = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/chat/", headers={"Authorization": basic(USER, PASSWORD)})
            assert plain.getresponse().status != 200
        plain.close()
        # The server still answers after a failed handshake.
        assert server.request("GET", "/healthz", auth=None)[0] == 200
    finally:
        server.close()


def test_tls_needs_both_files(upstream: FakeUpstream, tmp_path: Path) -> None:
    cert, _unused = _self_signed(tmp_path)
    with pytest.raises(chat.ConfigError, match="both"):
        chat.ChatServer(chat.Config(password=PASSWORD, port=0, tls_cert=cert))
    with pytest.raises(chat.ConfigError, match="cannot load certificate"):
        chat.ChatServer(
            chat.Config(password=PASSWORD, port=0, tls_cert=cert, tls_key=str(tmp_path / "none.pem"))
        )


# The API pass-through (--api-passthrough) ------------------------------------------

CLIENT_KEY = API_KEY  # an API client that knows the upstream's key


def test_without_passthrough_the_api_paths_need_the_password(app: App, upstream: FakeUpstream) -> None:
    status, headers, _unused = app.request(
        "GET", "/v1/models", auth=None, headers={"Authorization": "Bearer x"}
    )
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert upstream.requests == []


def test_passthrough_relays_the_api_with_the_clients_own_key(upstream: FakeUpstream) -> None:
    server = App(upstream.url, api_passthrough=True)
    try:
        status, _unused, body = server.request(
            "GET", "/v1/models", auth=None, headers={"Authorization": "Bearer " + CLIENT_KEY}
        )
    finally:
        server.close()
    assert status == 200
    assert json.loads(body)["data"][0]["id"] == upstream.model
    assert upstream.requests[-1]["path"] == "/v1/models"
    assert upstream.requests[-1]["headers"]["Authorization"] == "Bearer " + CLIENT_KEY


@pytest.mark.parametrize("client_auth", [None, "Bearer wrong-key", basic(USER, PASSWORD)])
def test_passthrough_never_lends_the_pages_key(upstream: FakeUpstream, client_auth: Optional[str]) -> None:
    """The page's password or no credentials at all get the upstream's 401 (said by the page, which
    checks the key itself), never the page's key: nothing reaches the upstream."""
    server = App(upstream.url, api_passthrough=True)
    try:
        status, _unused, body = server.request(
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "stream": True},
            auth=None,
            headers={"Authorization": client_auth} if client_auth else {},
        )
    finally:
        server.close()
    assert status == 401, body
    assert b"Invalid API Key" in body
    assert upstream.requests == []


def test_passthrough_keeps_the_page_behind_the_password(upstream: FakeUpstream) -> None:
    server = App(upstream.url, api_passthrough=True)
    try:
        status, _unused, _unused2 = server.request(
            "GET", "/chat/", auth=None, headers={"Authorization": "Bearer " + API_KEY}
        )
        status_api, _unused, _unused2 = server.request("GET", "/chat/api/config", auth=None)
    finally:
        server.close()
    assert (status, status_api) == (401, 401)


def test_passthrough_over_tls(upstream: FakeUpstream, tmp_path: Path) -> None:
    cert, key = self_signed("127.0.0.1", tmp_path)
    server = App(upstream.url, api_passthrough=True, tls_cert=str(cert), tls_key=str(key))
    try:
        status, _unused, body = server.request(
            "GET", "/v1/models", auth=None, headers={"Authorization": "Bearer " + CLIENT_KEY}
        )
        plain = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain.request("GET", "/v1/models", headers={"Authorization": "Bearer " + CLIENT_KEY})
            plain.getresponse().read()
    finally:
        server.close()
    assert status == 200 and upstream.model.encode() in body


def test_passthrough_from_the_command_line(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pw\n")
    assert chat.parse_args(["--password-file", str(password)], environ={}).api_passthrough is False
    assert chat.parse_args(
        ["--password-file", str(password), "--api-passthrough"], environ={}
    ).api_passthrough
    env = {"LLMFLEET_CHAT_API_PASSTHROUGH": "true"}
    assert chat.parse_args(["--password-file", str(password)], environ=env).api_passthrough is True

"""The chat page (roles/chat_ui/files/llmfleet_chat.py) against hostile or careless clients.

Issue #14 items 1 and 2: the API relay fails closed without an upstream key; bounded
connections (a fixed pool of workers, idle and header deadlines); API bodies streamed
upstream, not held whole; every handler error answered; non-ASCII targets and obs-folded
headers refused; the upstream key redacted even when split over two events. Every test
here failed on the code before this change.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.chat_app import RunningChatApp, load_chat_app
from tests.support.fake_openai import FakeUpstream

API_KEY = "sk-llmfleet-hostile-0123456789abcdef"
USER = "alice"
PASSWORD = "correct horse battery staple"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

chat = load_chat_app()


class App(RunningChatApp):
    def __init__(self, upstream: str, **overrides: Any):
        settings = {"upstream": upstream, "password": PASSWORD, "username": USER, "api_key": API_KEY}
        super().__init__(chat, **{**settings, **overrides})

    def raw(self, request: bytes, timeout: float = 10.0) -> bytes:
        """Send these bytes as they are; everything the app answers until it closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(request)
            return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1."), response[:200]
    return int(response.split(b" ", 2)[1])


def chat_request(body: Optional[dict] = None) -> bytes:
    data = json.dumps(body or {"messages": [{"role": "user", "content": "hi"}]}).encode()
    return (
        b"POST /chat/api/chat HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + BASIC.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
        + data
    )


def page_text(response: bytes) -> str:
    """What the page shows: every delta content of the relayed events, joined."""
    text = ""
    for line in response.split(b"\r\n\r\n", 1)[1].decode("utf-8", "replace").splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[len("data: ") :]).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return text


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=API_KEY, tokens=["Hel", "lo"]) as up:
        yield up


# 1. The API relay fails closed ---------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 49\r\n\r\n{"messages":[{"role":"user","content":"hi"}]}    ',
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer anything\r\n\r\n",
    ],
)
def test_the_api_relay_without_an_upstream_key_is_closed(request_bytes: bytes) -> None:
    with (
        FakeUpstream(api_key="") as open_upstream,
        App(open_upstream.url, api_key="", api_passthrough=True) as app,
    ):
        response = app.raw(request_bytes)
    assert status_of(response) == 403, response
    assert b"no upstream API key" in response
    assert open_upstream.requests == []


def test_the_api_relay_with_a_key_still_relays(upstream: FakeUpstream) -> None:
    with App(upstream.url, api_passthrough=True) as app:
        response = app.raw(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\n\r\n"
        )
    assert status_of(response) == 200 and upstream.model.encode() in response


# 2. Every handler error answered; bad request lines and headers refused ------------------


@pytest.mark.parametrize(
    "target",
    [
        b"/chat/\xc3\xa9",
        b"/v1/\xc3\xa9t\xc3\xa9",
        b"/chat\xff",
        b"/healthz\xe9",
        b"/v1/models?q=\xe2\x82\xac",
    ],
)
def test_a_non_ascii_target_is_answered_400(upstream: FakeUpstream, target: bytes) -> None:
    with App(upstream.url, api_passthrough=True) as app:
        response = app.raw(
            b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + BASIC.encode() + b"\r\n\r\n"
        )
    assert status_of(response) == 400, response
    assert upstream.requests == []


def test_an_error_inside_a_handler_is_answered_500(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(chat.ChatServer, "model", broken)
    with App(upstream.url) as app:
        response = app.raw(
            b"GET /chat/api/config HTTP/1.1\r\nHost: x\r\nAuthorization: " + BASIC.encode() + b"\r\n\r\n"
        )
        # The worker that met the error still serves the next request.
        after = [app.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") for _unused in range(3)]
    assert status_of(response) == 500 and b"a bug" not in response
    assert all(status_of(r) == 200 for r in after)


@pytest.mark.parametrize(
    "headers",
    [
        # An obs-folded Authorization: relayed as is, it would be one value with a line break.
        b"Authorization: Bearer " + API_KEY.encode() + b"\r\n extra\r\n",
        b"Authorization: Bearer\r\n\t" + API_KEY.encode() + b"\r\n",
        # A first header line that is a continuation.
        b" X-Folded: y\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\n",
    ],
)
def test_obs_folded_headers_are_refused(upstream: FakeUpstream, headers: bytes) -> None:
    with App(upstream.url, api_passthrough=True) as app:
        response = app.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert status_of(response) == 400, response
    assert b"folded" in response
    assert upstream.requests == []


def test_a_folded_page_password_is_refused(upstream: FakeUpstream) -> None:
    basic = BASIC.encode()
    with App(upstream.url) as app:
        response = app.raw(
            b"GET /chat/ HTTP/1.1\r\nHost: x\r\nAuthorization: "
            + basic[:8]
            + b"\r\n "
            + basic[8:]
            + b"\r\n\r\n"
        )
    assert status_of(response) == 400


# 2. The key redacted across event boundaries ------------------------------------------


@pytest.mark.parametrize("cut", [1, 3, 12, len(API_KEY) - 1])
def test_the_key_split_over_two_events_is_redacted(cut: int) -> None:
    tokens = ["Your key is ", API_KEY[:cut], API_KEY[cut:], " ok."]
    with FakeUpstream(api_key=API_KEY, tokens=tokens) as up, App(up.url) as app:
        response = app.raw(chat_request())
    assert status_of(response) == 200
    shown = page_text(response)
    assert API_KEY not in shown
    assert shown == "Your key is [redacted] ok."


def test_the_key_over_three_events_is_redacted() -> None:
    tokens = ["a", API_KEY[:5], API_KEY[5:20], API_KEY[20:], "b"]
    with FakeUpstream(api_key=API_KEY, tokens=tokens) as up, App(up.url) as app:
        shown = page_text(app.raw(chat_request()))
    assert shown == "a[redacted]b"


@pytest.mark.parametrize(
    "tokens",
    [
        ["sk-", "llm", " is not a key"],  # a beginning of the key that goes elsewhere
        ["ends with ", "sk-llm"],  # a beginning of the key at the very end
        ["plain ", "text"],
    ],
)
def test_text_like_the_start_of_the_key_is_shown_whole(tokens: list[str]) -> None:
    with FakeUpstream(api_key=API_KEY, tokens=tokens) as up, App(up.url) as app:
        shown = page_text(app.raw(chat_request()))
    assert shown == "".join(tokens)


def test_event_redactor_holds_only_a_possible_key_start() -> None:
    redact = chat.EventRedactor("secret-key")

    def event(text: str) -> bytes:
        return (
            b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"
        )

    def content(out: bytes) -> str:
        return json.loads(out.split(b"data: ", 1)[1])["choices"][0]["delta"]["content"]

    assert content(redact(event("hello sec"))) == "hello "
    assert content(redact(event("ret"))) == ""
    assert content(redact(event("-key!"))) == "[redacted]!"
    assert content(redact(event("sec"))) == ""
    assert b"sec" in redact.flush()
    assert redact.flush() == b""


# 2. Bounded connections, deadlines -----------------------------------------------------


def test_idle_sockets_take_no_thread_and_users_are_answered(upstream: FakeUpstream) -> None:
    before = threading.active_count()
    with App(upstream.url, max_connections=4, idle_timeout=30.0, max_per_client=4096) as app:
        idle = [socket.create_connection(("127.0.0.1", app.port), timeout=5) for _unused in range(200)]
        try:
            time.sleep(0.3)
            threads = threading.active_count() - before
            started = time.monotonic()
            answers = [
                app.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5) for _unused in range(3)
            ]
            took = time.monotonic() - started
        finally:
            for sock in idle:
                sock.close()
    # The accept loop, the waiting room and 4 workers (+1 margin), not one thread per socket.
    assert threads <= 4 + 3, threads
    assert [status_of(a) for a in answers] == [200, 200, 200]
    assert took < 5


def test_a_silent_connection_is_closed_after_the_idle_timeout(upstream: FakeUpstream) -> None:
    with (
        App(upstream.url, idle_timeout=0.5) as app,
        socket.create_connection(("127.0.0.1", app.port), timeout=10) as sock,
    ):
        started = time.monotonic()
        assert sock.recv(1) == b""
        waited = time.monotonic() - started
    assert 0.3 < waited < 3, waited


def test_headers_dripped_byte_by_byte_meet_a_deadline(upstream: FakeUpstream) -> None:
    """A per-read timeout is reset by every byte; the header deadline is not."""
    with (
        App(upstream.url, idle_timeout=5.0, header_timeout=1.0) as app,
        socket.create_connection(("127.0.0.1", app.port), timeout=10) as sock,
    ):
        started = time.monotonic()
        closed = False
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            if time.monotonic() - started > 4:
                break
        if not closed:
            sock.settimeout(3)
            try:
                closed = _read_all(sock) is not None
            except OSError:
                closed = True
        waited = time.monotonic() - started
    assert closed and waited < 4, waited


def test_more_silent_sockets_than_the_room_holds_drop_the_oldest(upstream: FakeUpstream) -> None:
    with App(upstream.url, idle_timeout=30.0, max_per_client=4096) as app:
        app.server.max_waiting = 20
        idle = [socket.create_connection(("127.0.0.1", app.port), timeout=5) for _unused in range(40)]
        try:
            time.sleep(0.5)
            answer = app.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
            idle[0].settimeout(2)
            oldest_closed = idle[0].recv(1) == b""
        finally:
            for sock in idle:
                sock.close()
    assert status_of(answer) == 200 and oldest_closed


def test_a_relayed_body_is_streamed_not_held_whole() -> None:
    """The upstream sees the body's first bytes while the client is still sending the rest."""
    seen = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def fake_upstream() -> None:
        conn, _unused = listener.accept()
        data = b""
        conn.settimeout(10)
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        _head, _sep, body = data.partition(b"\r\n\r\n")
        while len(body) < 100_000:
            body += conn.recv(65536)
        seen.set()
        conn.close()

    thread = threading.Thread(target=fake_upstream, daemon=True)
    thread.start()
    total = 8 << 20
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with (
            App(url, api_passthrough=True) as app,
            socket.create_connection(("127.0.0.1", app.port), timeout=10) as sock,
        ):
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + API_KEY.encode()
                + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % total
            )
            sock.sendall(b"x" * 200_000)
            got_it = seen.wait(5)
    finally:
        listener.close()
    assert got_it, "the app did not pass the first 100 kB on before the whole 8 MiB body arrived"


def test_the_unit_raises_the_open_file_limit() -> None:
    unit = (
        Path(__file__).resolve().parents[3] / "roles/chat_ui/templates/systemd/llmfleet-chat.service.j2"
    ).read_text()
    limits = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("LimitNOFILE=")]
    assert limits and int(limits[0]) >= 4096


def test_connection_limits_are_options(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pw\n")
    config = chat.parse_args(
        [
            "--password-file",
            str(password),
            "--max-connections",
            "8",
            "--idle-timeout",
            "3",
            "--header-timeout",
            "4",
        ],
        environ={},
    )
    assert (config.max_connections, config.idle_timeout, config.header_timeout) == (8, 3.0, 4.0)
    with pytest.raises(chat.ConfigError, match="max connections: 0"):
        chat.ChatServer(chat.Config(password=PASSWORD, port=0, max_connections=0))

#!/usr/bin/env python
"""llmfleet chat: a small chat page in front of an OpenAI-compatible server.

One file, Python 3.9+ standard library only. It serves a chat page under its own
path prefix (all URLs in the page are relative, so it works behind an Ingress
path), relays the upstream's server-sent events to the browser as they arrive,
adds the upstream API key on the server side (the browser never sees it), and
protects everything but /healthz with its own password (HTTP Basic, compared in
constant time). It speaks /v1/chat/completions with "stream": true, which both
llama-server and vLLM serve. TLS is optional (a certificate and key file).

With --api-passthrough the same port also relays the upstream's own API
(/v1/..., /health, /metrics) byte for byte, with the CLIENT's Authorization
header and never the page's key: API clients reach the model over the page's
TLS while the upstream listens on loopback only.

Secrets are read from files (never from the command line or the environment,
which other local users can read from /proc):

    llmfleet_chat.py --upstream http://127.0.0.1:8080 --prefix /chat \
        --password-file /etc/llmfleet/chat/password --api-key-file /etc/llmfleet/chat/api-key

Every option also reads an environment variable LLMFLEET_CHAT_<OPTION> (for
example LLMFLEET_CHAT_UPSTREAM), which a Kubernetes Deployment can set.

Bounded by design (the page faces the network without a password on /healthz and the API):
a fixed pool of --max-connections worker threads answers requests; a new connection waits in
one selector thread ("the waiting room", no thread of its own), which runs the TLS handshake
and reads the request line and headers without blocking: it is closed --idle-timeout seconds
after the accept if it sent nothing, --header-timeout seconds after it if its head is not
complete, and reaches a worker only with its whole head, so a slow client never holds a worker
before its credentials are checked; one client (an address, an IPv6 /64) holds at most
--max-per-client connections, more are closed at once; wrong credentials (the page's password
or the API key) are limited per client to a burst of 10, then one per 6 s, past which the
client gets 429 without its guess being checked; the password has at least 16 characters;
the API relay checks the caller's key itself before it reads a body or opens an upstream
socket; one request per connection (Connection: close); API bodies are streamed upstream,
never held whole; every handler error is answered; obs-folded headers and non-ASCII request
targets are refused (400); the API relay is closed (403) when no upstream key is configured.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import contextlib
import hmac
import http.client
import http.server
import io
import ipaddress
import json
import logging
import math
import os
import queue
import selectors
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Optional

VERSION = "1.0.0"
MAX_BODY_BYTES = 1 << 20
MAX_ERROR_BYTES = 16 << 10
MAX_API_BODY_BYTES = 64 << 20
API_BODY_CHUNK = 64 << 10
# Connections: workers answering at once, seconds from accept to the first byte (idle) and to
# the end of the headers, to read a body, and for a client that stops reading our answer.
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 10.0
HEADER_TIMEOUT = 15.0
BODY_TIMEOUT = 60.0
WRITE_TIMEOUT = 60.0
# Accepted connections that have sent nothing yet, at most (fewer when the file limit is low).
MAX_WAITING = 2048
# The open-file limit the app raises its soft limit to (the systemd unit sets LimitNOFILE too).
NOFILE_WANTED = 4096
# The page's password: at least this many characters (the role makes 24 with the password lookup).
MIN_PASSWORD_CHARS = 16
# Wrong credentials per client (an IPv4 address, an IPv6 /64): a burst of AUTH_BURST, then one
# more every AUTH_REFILL_S seconds; past that the client gets 429 and its guesses are not checked.
AUTH_BURST = 10
AUTH_REFILL_S = 6.0
# Clients whose wrong guesses are remembered at once (the one idle longest is forgotten first).
MAX_TRACKED_CLIENTS = 4096
# Connections one client may hold open at once (waiting and answered); more are closed at once.
MAX_PER_CLIENT = 16
# A request's line and headers, read in the waiting room before a worker is spent on them.
MAX_HEAD_BYTES = 64 << 10
# The upstream's own API, relayed by --api-passthrough (outside the page's prefix).
API_PREFIXES = ("/v1/",)
API_PATHS = ("/health", "/metrics")
# Request headers an API client's call keeps on its way upstream (nothing else is forwarded).
API_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept")
ROLES = ("system", "user", "assistant")
REDACTED = b"[redacted]"
LOG = logging.getLogger("llmfleet_chat")


class ConfigError(Exception):
    """A setting that cannot work; the message names the option and the value."""


@dataclass(frozen=True)
class Config:
    upstream: str = "http://127.0.0.1:8080"
    password: str = field(default="", repr=False)
    api_key: str = field(default="", repr=False)
    username: str = "llmfleet"
    listen: str = "127.0.0.1"
    port: int = 8088
    prefix: str = "/chat"
    model: str = ""
    title: str = "llmfleet chat"
    max_tokens: int = 1024
    timeout: float = 600.0
    tls_cert: str = ""
    tls_key: str = ""
    upstream_ca: str = ""
    api_passthrough: bool = False
    max_connections: int = MAX_CONNECTIONS
    idle_timeout: float = IDLE_TIMEOUT
    header_timeout: float = HEADER_TIMEOUT
    max_per_client: int = MAX_PER_CLIENT
    trusted_proxies: str = ""


@dataclass(frozen=True)
class Upstream:
    scheme: str
    host: str
    port: int
    base_path: str

    @property
    def display(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"


def normalise_prefix(prefix: str) -> str:
    """'/chat/' -> '/chat', '' or '/' -> '' (served at the root)."""
    prefix = (prefix or "").strip()
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    prefix = prefix.rstrip("/")
    if any(c in prefix for c in "?#% \t\r\n"):
        raise ConfigError(f"prefix {prefix!r}: only a plain path like /chat is allowed")
    return prefix


def parse_upstream(url: str) -> Upstream:
    """Split the upstream base URL; a trailing /v1 is accepted and dropped."""
    parts = urllib.parse.urlsplit((url or "").strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"upstream {url!r}: expected http://host:port or https://host:port")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(f"upstream {url!r}: no credentials, query or fragment in the URL")
    base = parts.path.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Upstream(parts.scheme, parts.hostname, port, base)


def is_api_path(path: str) -> bool:
    """A path of the upstream's own API (relayed with --api-passthrough)."""
    return path in API_PATHS or path.startswith(API_PREFIXES)


def check_basic_auth(header: Optional[str], username: str, password: str) -> bool:
    """True when an Authorization header carries these Basic credentials.

    Both the user name and the password are compared with hmac.compare_digest,
    and both comparisons always run, so the time taken does not tell which part
    was wrong or how much of it matched.
    """
    if not header:
        return False
    scheme, _unused, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    user, sep, given = decoded.partition(b":")
    if not sep:
        return False
    user_ok = hmac.compare_digest(user, username.encode("utf-8"))
    password_ok = hmac.compare_digest(given, password.encode("utf-8"))
    return user_ok and password_ok


def check_bearer(header: Optional[str], key: str) -> bool:
    """True when an Authorization header carries ``Bearer <key>`` (compared in constant time)."""
    if not header or not key:
        return False
    scheme, _unused, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode("utf-8", "replace"), key.encode("utf-8"))


def parse_networks(text: str) -> tuple:
    """``10.0.0.0/8, fc00::/7`` -> the networks; raises ConfigError naming a bad one."""
    networks = []
    for item in (text or "").split(","):
        if item.strip():
            try:
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError as exc:
                raise ConfigError(
                    f"trusted proxies: {item.strip()!r} is not an address or a network: {exc}"
                ) from None
    return tuple(networks)


def forwarded_client(peer: str, forwarded_for: Optional[str], proxies: tuple) -> str:
    """The address a request counts against: the peer's, or, when the peer is one of the trusted
    ``proxies`` (an Ingress controller), the last X-Forwarded-For entry, the one it appended."""
    if not proxies or not forwarded_for:
        return peer
    try:
        if not any(ipaddress.ip_address(peer.split("%", 1)[0]) in net for net in proxies):
            return peer
        last = forwarded_for.rsplit(",", 1)[-1].strip()
        ipaddress.ip_address(last)
    except ValueError:
        return peer
    return last


def client_key(address: str) -> str:
    """Who a connection counts against: its IPv4 address, or its IPv6 /64 (one host holds a /64)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class GuessLimiter:
    """Wrong credentials per client: a token bucket of ``burst`` guesses, refilled one per ``refill_s``.

    ``take`` spends a guess before the credentials are checked (so parallel guesses are counted
    too) and says how long to wait when none is left; ``refund`` gives it back when they were
    right, so a user who knows the password is never slowed down.
    """

    def __init__(
        self, burst: int = AUTH_BURST, refill_s: float = AUTH_REFILL_S, tracked: int = MAX_TRACKED_CLIENTS
    ):
        self.burst = burst
        self.refill_s = refill_s
        self.tracked = tracked
        self.refused = 0
        self._lock = threading.Lock()
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.refill_s)

    def take(self, key: str) -> float:
        """0 when a guess may be checked (and spends it), else the seconds until the next one."""
        now = time.monotonic()
        with self._lock:
            tokens = self._tokens(key, now)
            if tokens < 1:
                self.refused += 1
                return max(0.001, (1 - tokens) * self.refill_s)
            self._buckets[key] = (tokens - 1, now)
            self._buckets.move_to_end(key)
            while len(self._buckets) > self.tracked:
                self._buckets.popitem(last=False)
            return 0.0

    def refund(self, key: str) -> None:
        now = time.monotonic()
        with self._lock:
            if key in self._buckets:
                tokens = self._tokens(key, now) + 1
                if tokens >= self.burst:
                    del self._buckets[key]
                else:
                    self._buckets[key] = (tokens, now)


def validate_chat_request(body: Any, max_tokens_limit: int) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Check what the page sent; returns (messages, sampling options). Raises ValueError."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    clean = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        clean.append({"role": role, "content": content})
    options: dict[str, Any] = {}
    if "max_tokens" in body:
        value = body["max_tokens"]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= max_tokens_limit:
            raise ValueError(f"'max_tokens' must be an integer from 1 to {max_tokens_limit}")
        options["max_tokens"] = value
    if "temperature" in body:
        value = body["temperature"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 2:
            raise ValueError("'temperature' must be a number from 0 to 2")
        options["temperature"] = float(value)
    return clean, options


def upstream_payload(messages: list[dict[str, str]], options: dict[str, Any], model: str, max_tokens: int):
    """The body sent to /v1/chat/completions (llama-server and vLLM accept the same)."""
    payload: dict[str, Any] = {
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": options.get("max_tokens", max_tokens),
    }
    if model:
        payload["model"] = model
    if "temperature" in options:
        payload["temperature"] = options["temperature"]
    return payload


class Redactor:
    """Removes the API key from anything relayed to the browser, whatever the upstream says."""

    def __init__(self, secret: str):
        self._secret = secret.encode("utf-8") if secret else b""

    def __call__(self, data: bytes) -> bytes:
        if self._secret and self._secret in data:
            return data.replace(self._secret, REDACTED)
        return data


def _held_suffix(text: str, secret: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``secret``."""
    for size in range(min(len(text), len(secret) - 1), 0, -1):
        if text.endswith(secret[:size]):
            return size
    return 0


class EventRedactor:
    """Removes the key from the page's event stream, also when the upstream splits it over events.

    The browser joins ``choices[i].delta.content`` of every event, so a key sent in two
    pieces would be whole on the page although no single event holds it. Each data event is
    parsed and written again (JSON escapes undone, so ``\\u0073k-...`` is seen as ``sk-...``);
    the end of a choice's text that could be the start of the key is held back until the
    next piece shows it is not (or it is replaced), and given out before ``[DONE]``.
    """

    def __init__(self, secret: str):
        self._secret = secret
        self._bytes = Redactor(secret)
        self._held: dict[int, str] = {}

    def _choice(self, position: int, choice: dict) -> None:
        index = choice.get("index", position)
        index = index if isinstance(index, int) else position
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        held = self._held.pop(index, "")
        if not isinstance(content, str):
            if held and isinstance(delta, dict):
                delta["content"] = held
            elif held:
                self._held[index] = held
            return
        text = (held + content).replace(self._secret, REDACTED.decode())
        if choice.get("finish_reason") is None:
            keep = _held_suffix(text, self._secret)
            if keep:
                self._held[index] = text[-keep:]
                text = text[:-keep]
        delta["content"] = text

    def flush(self) -> bytes:
        """An event with the text still held back (it was not the key), or b""."""
        if not self._held:
            return b""
        choices = [{"index": i, "delta": {"content": text}} for i, text in sorted(self._held.items())]
        self._held = {}
        return self._bytes(b"data: " + json.dumps({"choices": choices}).encode("utf-8") + b"\n\n")

    def __call__(self, event: bytes) -> bytes:
        if not self._secret:
            return event
        out = []
        for line in event.splitlines(keepends=True):
            if not line.startswith(b"data:"):
                out.append(line)
                continue
            payload = line[len(b"data:") :].strip()
            if payload == b"[DONE]":
                out.append(self.flush())
                out.append(line)
                continue
            try:
                obj = json.loads(payload.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                out.append(line)
                continue
            if isinstance(obj, dict) and isinstance(obj.get("choices"), list):
                for position, choice in enumerate(obj["choices"]):
                    if isinstance(choice, dict):
                        self._choice(position, choice)
            ending = b"\r\n" if line.endswith(b"\r\n") else b"\n"
            out.append(b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + ending)
        return self._bytes(b"".join(out))


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side that stops at a deadline (``time.monotonic()``), not per read.

    A client dripping one byte a second would reset a socket timeout forever; this one sets
    the socket's timeout to what is left before every read and raises ``socket.timeout``
    once the deadline has passed. ``deadline = None``: the socket's own timeout applies.
    """

    def __init__(self, sock: socket.socket, head: bytes = b""):
        super().__init__()
        self._sock = sock
        self._head = memoryview(head)  # what the waiting room has already read, given out first
        self.deadline: Optional[float] = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head.nbytes:
            size = min(len(buffer), self._head.nbytes)
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _ClientBodyError(Exception):
    """The client did not send the body it announced (closed, or too slow)."""


class _BodyStream:
    """The request body, read in chunks as http.client sends it upstream (never held whole)."""

    def __init__(self, rfile, length: int):
        self._rfile = rfile
        self.left = length

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        size = self.left if size is None or size < 0 else min(size, self.left)
        try:
            data = self._rfile.read(min(size, API_BODY_CHUNK))
        except OSError as exc:
            raise _ClientBodyError(f"reading the request body: {exc or 'timed out'}") from exc
        if not data:
            raise _ClientBodyError(f"the client closed with {self.left} bytes of its body unsent")
        self.left -= len(data)
        return data


def _raise_nofile(wanted: int = NOFILE_WANTED) -> int:
    """Raise the soft open-file limit towards ``wanted`` (within the hard limit); returns it."""
    try:
        import resource
    except ImportError:  # not on Linux: nothing to raise
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else soft


class _Waiting:
    """A connection in the waiting room: its socket (TLS-wrapped at once), what it has sent so far."""

    __slots__ = ("accepted", "address", "events", "handshaking", "head", "key", "sock", "started")

    def __init__(self, sock: socket.socket, address: Any, accepted: float, key: str, handshaking: bool):
        self.sock = sock
        self.address = address
        self.accepted = accepted
        self.key = key
        self.handshaking = handshaking
        self.head = b""
        self.started = False  # some bytes (a TLS hello, a request line) have arrived
        self.events = selectors.EVENT_READ


class ChatServer(http.server.HTTPServer):
    """The page's server: one accept loop, one waiting room, a fixed pool of workers.

    ``serve_forever`` accepts; ``process_request`` closes the connection at once when its client
    already holds ``max_per_client`` of them, else hands it to the waiting room (a selector
    thread, no thread per connection), which runs the TLS handshake and reads the request line
    and headers without blocking, and passes the connection to the workers only once its whole
    head is there. A connection silent past ``idle_timeout``, or whose head is not complete
    ``header_timeout`` after the accept, is closed there: a slow client never holds a worker
    before its credentials have been checked. ``max_connections`` workers answer.
    """

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, config: Config):
        self.config = config
        self.prefix = normalise_prefix(config.prefix)
        self.upstream = parse_upstream(config.upstream)
        self.redact = Redactor(config.api_key)
        self._model = config.model
        self._model_lock = threading.Lock()
        self.tls_context = None
        if not config.password:
            raise ConfigError("password: empty; the chat page needs a password")
        if len(config.password) < MIN_PASSWORD_CHARS:
            raise ConfigError(
                f"password: {len(config.password)} characters; the chat page needs at least {MIN_PASSWORD_CHARS}"
            )
        if bool(config.tls_cert) != bool(config.tls_key):
            raise ConfigError("tls: give both a certificate and a key file, or neither")
        if config.tls_cert:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(config.tls_cert, config.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"tls: cannot load certificate {config.tls_cert} with key {config.tls_key}: {exc}"
                ) from exc
            self.tls_context = context
        if not 1 <= config.max_connections <= 4096:
            raise ConfigError(f"max connections: {config.max_connections} is not from 1 to 4096")
        if not 1 <= config.max_per_client <= 4096:
            raise ConfigError(f"max per client: {config.max_per_client} is not from 1 to 4096")
        for name in ("idle_timeout", "header_timeout"):
            value = getattr(config, name)
            if not 0 < value <= 3600:
                raise ConfigError(f"{name.replace('_', ' ')}: {value} is not from 0 to 3600 seconds")
        family = socket.AF_INET6 if ":" in config.listen else socket.AF_INET
        self.address_family = family
        super().__init__((config.listen, config.port), ChatHandler)
        nofile = _raise_nofile()
        # Keep files for the workers (a client and an upstream socket each) and the process.
        self.max_waiting = max(16, min(MAX_WAITING, nofile - 2 * config.max_connections - 64))
        self.guesses = GuessLimiter()
        self.trusted_proxies = parse_networks(config.trusted_proxies)
        self._local = threading.local()
        self._inbox: list[tuple[socket.socket, Any, float, str]] = []
        self._inbox_lock = threading.Lock()
        self._clients: dict[str, int] = {}
        self._clients_lock = threading.Lock()
        self._ready: queue.Queue = queue.Queue()
        self._closing = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.dropped_idle = 0
        self.refused_per_client = 0
        self._threads = [threading.Thread(target=self._waiting_room, name="chat-waiting", daemon=True)]
        self._threads += [
            threading.Thread(target=self._worker, name=f"chat-worker-{i}", daemon=True)
            for i in range(config.max_connections)
        ]
        for thread in self._threads:
            thread.start()

    # Connections -----------------------------------------------------------

    def process_request(self, request, client_address):
        """Called by the accept loop: over its client's cap the connection is closed at once,
        else it waits for its head in the waiting room, without a thread."""
        key = client_key(client_address[0])
        with self._clients_lock:
            held = self._clients.get(key, 0)
            if held < self.config.max_per_client:
                self._clients[key] = held + 1
        if held >= self.config.max_per_client:
            self.refused_per_client += 1
            self.shutdown_request(request)
            return
        with self._inbox_lock:
            self._inbox.append((request, client_address, time.monotonic(), key))
        self._wake()

    def _release(self, key: str) -> None:
        with self._clients_lock:
            held = self._clients.get(key, 0) - 1
            if held > 0:
                self._clients[key] = held
            else:
                self._clients.pop(key, None)

    def connections_of(self, address: str) -> int:
        """Connections this client holds open now (waiting or answered)."""
        with self._clients_lock:
            return self._clients.get(client_key(address), 0)

    def _wake(self) -> None:
        # A full pipe will be read anyway; a closed one means we are stopping.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def accepted_at(self) -> float:
        """When the connection this worker thread handles was accepted (time.monotonic())."""
        return getattr(self._local, "accepted", time.monotonic())

    def head_read(self) -> bytes:
        """What the waiting room read of this worker thread's connection (its line and headers)."""
        return getattr(self._local, "head", b"")

    def _waiting_room(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        waiting: dict[_Waiting, None] = {}  # in accept order

        def drop(item: _Waiting) -> None:
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(item.sock)
            waiting.pop(item, None)
            self.shutdown_request(item.sock)
            self._release(item.key)

        def want(item: _Waiting, events: int) -> None:
            if item.events != events:
                item.events = events
                selector.modify(item.sock, events, item)

        def hand_over(item: _Waiting) -> None:
            selector.unregister(item.sock)
            del waiting[item]
            item.sock.setblocking(True)
            self._ready.put((item.sock, item.address, item.accepted, item.head, item.key))

        def advance(item: _Waiting) -> None:
            item.started = True
            try:
                if item.handshaking:
                    item.sock.do_handshake()
                    item.handshaking = False
                while True:
                    data = item.sock.recv(MAX_HEAD_BYTES)
                    if not data:
                        drop(item)
                        return
                    item.head += data
                    if b"\r\n\r\n" in item.head or b"\n\n" in item.head or len(item.head) >= MAX_HEAD_BYTES:
                        hand_over(item)
                        return
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                want(item, selectors.EVENT_READ)
            except ssl.SSLWantWriteError:
                want(item, selectors.EVENT_WRITE)
            except (ssl.SSLError, OSError) as exc:
                LOG.info(
                    "%s: %s failed: %s", item.address[0], "TLS handshake" if item.handshaking else "read", exc
                )
                drop(item)

        swept = 0.0
        try:
            while not self._closing.is_set():
                for key, _unused in selector.select(0.05 if waiting else 1.0):
                    if key.data is None:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                        continue
                    if key.data in waiting:
                        advance(key.data)
                with self._inbox_lock:
                    new, self._inbox = self._inbox, []
                for sock, address, accepted, client in new:
                    try:
                        sock.setblocking(False)
                        if self.tls_context is not None:
                            sock = self.tls_context.wrap_socket(
                                sock, server_side=True, do_handshake_on_connect=False
                            )
                    except (OSError, ssl.SSLError) as exc:
                        LOG.info("%s: %s", address[0], exc)
                        self.shutdown_request(sock)
                        self._release(client)
                        continue
                    item = _Waiting(sock, address, accepted, client, self.tls_context is not None)
                    waiting[item] = None
                    selector.register(sock, selectors.EVENT_READ, item)
                    while len(waiting) > self.max_waiting:  # the oldest one makes room
                        self.dropped_idle += 1
                        drop(next(iter(waiting)))
                now = time.monotonic()
                if now - swept >= 0.05:
                    swept = now
                    for item in list(waiting):
                        limit = self.config.header_timeout if item.started else self.config.idle_timeout
                        if item.accepted + limit <= now:
                            self.dropped_idle += 1
                            drop(item)
        finally:
            for item in list(waiting):
                drop(item)
            selector.close()

    def _worker(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:
                return
            sock, address, accepted, head, client = item
            self._local.accepted = accepted
            self._local.head = head
            try:
                self.finish_request(sock, address)
            except Exception:  # one broken connection must not end the worker
                self.handle_error(sock, address)
            finally:
                self.shutdown_request(sock)
                self._release(client)

    def handle_error(self, request, client_address) -> None:
        LOG.exception("%s: the connection failed", client_address[0] if client_address else "?")

    def server_close(self) -> None:
        self._closing.set()
        self._wake()
        for _unused in range(self.config.max_connections):
            self._ready.put(None)
        super().server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._wake_r.close()
        self._wake_w.close()

    # The upstream ---------------------------------------------------------

    def connect_upstream(self, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        up = self.upstream
        timeout = self.config.timeout if timeout is None else timeout
        if up.scheme == "https":
            context = ssl.create_default_context(cafile=self.config.upstream_ca or None)
            return http.client.HTTPSConnection(up.host, up.port, timeout=timeout, context=context)
        return http.client.HTTPConnection(up.host, up.port, timeout=timeout)

    def upstream_headers(self, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": "llmfleet-chat/" + VERSION}
        if self.config.api_key:
            headers["Authorization"] = "Bearer " + self.config.api_key
        return headers

    def model(self) -> str:
        """The configured model name, or the first one the upstream lists (cached once found)."""
        with self._model_lock:
            if self._model:
                return self._model
            conn = self.connect_upstream(timeout=min(self.config.timeout, 15.0))
            try:
                conn.request(
                    "GET", self.upstream.base_path + "/v1/models", headers=self.upstream_headers("*/*")
                )
                resp = conn.getresponse()
                data = resp.read(MAX_BODY_BYTES)
                if resp.status != 200:
                    LOG.warning("upstream %s/v1/models answered %d", self.upstream.display, resp.status)
                    return ""
                models = json.loads(data.decode("utf-8")).get("data") or []
                if models and isinstance(models[0], dict) and isinstance(models[0].get("id"), str):
                    self._model = models[0]["id"]
            except (OSError, ValueError, http.client.HTTPException) as exc:
                LOG.warning("upstream %s/v1/models: %s", self.upstream.display, exc)
            finally:
                conn.close()
            return self._model


class ChatHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmfleet-chat/" + VERSION
    sys_version = ""
    timeout = WRITE_TIMEOUT  # for writes; reads run against the deadlines below
    server: ChatServer

    # Plumbing -------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection, self.server.head_read())
        self.rfile = io.BufferedReader(self._reader)
        # The request line and every header by this time after the accept, however they drip.
        self._reader.deadline = self.server.accepted_at() + self.server.config.header_timeout
        self._headers_sent = False

    def send_response(self, code: int, message: Optional[str] = None) -> None:
        super().send_response(code, message)
        # One request per connection: a worker is never held by an idle keep-alive.
        self.send_header("Connection", "close")

    def _reads_done(self) -> None:
        """The request is read: no more read deadline, and writes get their own timeout."""
        self._reader.deadline = None
        self.connection.settimeout(WRITE_TIMEOUT)

    def end_headers(self) -> None:
        self._headers_sent = True
        super().end_headers()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        self._reader.deadline = time.monotonic() + BODY_TIMEOUT
        self.connection.settimeout(WRITE_TIMEOUT)  # the reader sets its own before every read
        target = self.path
        if not target.isascii() or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target):
            self._error(400, "the request target must be ASCII without spaces or control characters")
            return False
        if self.headers.defects or any("\r" in v or "\n" in v for v in self.headers.values()):
            # A folded line (obs-fold, RFC 9112 5.2) would reach the upstream as one value.
            self._error(400, "folded or malformed header lines are refused")
            return False
        return True

    def log_message(self, format, *args):
        LOG.info("%s %s", self.address_string(), format % args)

    def _security_headers(self) -> None:
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        )
        if self.server.tls_context is not None:
            self.send_header("Strict-Transport-Security", "max-age=31536000")

    def _send(self, status: int, body: bytes, content_type: str, headers: Optional[dict[str, str]] = None):
        body = self.server.redact(body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self._security_headers()
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, obj: Any, headers: Optional[dict[str, str]] = None) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), "application/json", headers)

    def _error(self, status: int, message: str, headers: Optional[dict[str, str]] = None) -> None:
        self._send_json(status, {"error": message}, headers)

    # Routing --------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        """Route the request; whatever goes wrong, the client gets an answer (or a closed socket
        when it went away), never a silently dropped connection."""
        try:
            self._route()
        except _Answered:
            self.close_connection = True
        except (ConnectionError, socket.timeout, ssl.SSLError) as exc:
            LOG.info("%s: the client went away or was too slow: %s", self.address_string(), exc)
            self.close_connection = True
        except _ClientBodyError as exc:
            LOG.info("%s: %s", self.address_string(), exc)
            self.close_connection = True
            if not self._headers_sent:
                self._error(408, str(exc))
        except Exception:  # answered below, logged with its traceback
            LOG.exception("%s: %s %r failed", self.address_string(), self.command, self.path)
            self.close_connection = True
            if not self._headers_sent:
                self._error(500, "internal error")

    def _route(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        prefix = self.server.prefix
        if path in ("/healthz", prefix + "/healthz"):
            if self.command == "POST":
                return self._error(405, "method not allowed", {"Allow": "GET, HEAD"})
            return self._send(200, b"ok\n", "text/plain; charset=utf-8")
        if self.server.config.api_passthrough and is_api_path(path):
            # The upstream's API key is the credential here: checked here first (no body read, no
            # upstream socket for a caller without it), then by the upstream itself.
            return self._passthrough(path)
        config = self.server.config
        if not self._authorised(lambda header: check_basic_auth(header, config.username, config.password)):
            return self._send(
                401,
                b"authentication required\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="llmfleet chat", charset="UTF-8"'},
            )
        if prefix and path == prefix:
            return self._send(308, b"", "text/plain", {"Location": prefix + "/"})
        if not path.startswith(prefix + "/"):
            return self._error(404, "not found")
        route = path[len(prefix) :]
        static = STATIC.get(route)
        if static is not None:
            if self.command == "POST":
                return self._error(405, "method not allowed", {"Allow": "GET, HEAD"})
            return self._send(200, static[1].encode("utf-8"), static[0])
        if route == "/api/config":
            if self.command == "POST":
                return self._error(405, "method not allowed", {"Allow": "GET, HEAD"})
            return self._send_json(200, {"title": self.server.config.title, "model": self.server.model()})
        if route == "/api/chat":
            if self.command != "POST":
                return self._error(405, "method not allowed", {"Allow": "POST"})
            return self._chat()
        return self._error(404, "not found")

    def _authorised(self, check) -> bool:
        """Whether the request's Authorization passes ``check``; a client past its guesses gets
        429 (answered here, its guess not even checked) and False."""
        header = self.headers.get("Authorization")
        if not header:
            return False  # no guess: the browser's first request, before the password prompt
        key = client_key(
            forwarded_client(
                self.client_address[0], self.headers.get("X-Forwarded-For"), self.server.trusted_proxies
            )
        )
        wait = self.server.guesses.take(key)
        if wait:
            LOG.warning("%s: too many wrong credentials; refused for %.0f s", self.address_string(), wait)
            self._error(
                429, "too many wrong credentials; try again later", {"Retry-After": str(math.ceil(wait))}
            )
            raise _Answered()
        if not check(header):
            return False
        self.server.guesses.refund(key)
        return True

    # The chat relay -------------------------------------------------------

    def _read_json_body(self) -> Any:
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            # A cross-site form cannot send application/json without a CORS
            # preflight, which this server never grants.
            raise _HTTPError(415, "the request must be application/json")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise _HTTPError(411, "Content-Length required") from None
        if not 0 < length <= MAX_BODY_BYTES:
            raise _HTTPError(413, f"the request body must be 1 to {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(length)
        if len(raw) != length:
            raise _ClientBodyError(f"the client sent {len(raw)} of the {length} bytes it announced")
        self._reads_done()
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _HTTPError(400, f"the request body is not JSON: {exc}") from None

    def _chat(self) -> None:
        server = self.server
        try:
            messages, options = validate_chat_request(self._read_json_body(), server.config.max_tokens)
        except _HTTPError as exc:
            return self._error(exc.status, exc.message)
        except ValueError as exc:
            return self._error(400, str(exc))
        payload = upstream_payload(messages, options, server.model(), server.config.max_tokens)
        body = json.dumps(payload).encode("utf-8")
        headers = server.upstream_headers("text/event-stream")
        headers["Content-Type"] = "application/json"
        target = server.upstream.display + "/v1/chat/completions"
        conn = server.connect_upstream()
        try:
            try:
                conn.request("POST", server.upstream.base_path + "/v1/chat/completions", body, headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                LOG.warning("upstream %s: %s", target, exc)
                return self._error(502, f"upstream {target} did not answer: {exc}")
            if resp.status != 200:
                detail = resp.read(MAX_ERROR_BYTES).decode("utf-8", "replace").strip()
                LOG.warning("upstream %s answered %d", target, resp.status)
                return self._error(502, f"upstream {target} answered {resp.status}: {detail}")
            self._relay(resp, target)
        finally:
            conn.close()

    def _passthrough(self, path: str) -> None:
        """Relay one call of the upstream's own API, as it is, with the client's credentials."""
        server = self.server
        if not server.config.api_key:
            # No key upstream means an upstream that checks nothing: relaying would open it.
            return self._error(
                403, "the API relay is closed: the chat page has no upstream API key configured"
            )
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._error(411, "Content-Length required")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self._error(400, "bad Content-Length")
        if not 0 <= length <= MAX_API_BODY_BYTES:
            return self._error(413, f"the request body must be at most {MAX_API_BODY_BYTES} bytes")
        open_health = path == "/health" and self.command in ("GET", "HEAD") and not length
        if not open_health and not self._authorised(
            lambda header: check_bearer(header, server.config.api_key)
        ):
            # The upstream's own answer (llama-server and vLLM say the same), before any body is read.
            return self._send_json(
                401,
                {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
                {"WWW-Authenticate": "Bearer"},
            )
        body = _BodyStream(self.rfile, length) if length else None
        headers = {"User-Agent": "llmfleet-chat/" + VERSION}
        for name in API_REQUEST_HEADERS:
            if self.headers.get(name):
                headers[name] = self.headers[name]
        if length:
            headers["Content-Length"] = str(length)
        split = urllib.parse.urlsplit(self.path)
        path = server.upstream.base_path + split.path + ("?" + split.query if split.query else "")
        target = server.upstream.display + split.path
        conn = server.connect_upstream()
        try:
            try:
                conn.request(self.command, path, body, headers)
                self._reads_done()
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                LOG.warning("upstream %s: %s", target, exc)
                return self._error(502, f"upstream {target} did not answer: {exc}")
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/octet-stream"))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Accel-Buffering", "no")
            if resp.getheader("WWW-Authenticate"):
                self.send_header("WWW-Authenticate", resp.getheader("WWW-Authenticate"))
            if self.command == "HEAD":
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                try:
                    while True:
                        data = resp.read1(65536)
                        if not data:
                            break
                        # Whatever the upstream sends goes on at once: streamed events stay streamed.
                        self._write_chunk(server.redact(data))
                except (OSError, http.client.HTTPException) as exc:
                    LOG.warning("upstream %s failed mid-answer: %s", target, exc)
                    self.close_connection = True
                    return None
                self._write_chunk(b"")
            except (ConnectionError, ssl.SSLError, socket.timeout) as exc:
                LOG.info("API client went away: %s", exc)
                self.close_connection = True
        finally:
            conn.close()
        return None

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _relay(self, resp: http.client.HTTPResponse, target: str) -> None:
        """Pass every server-sent event on as soon as its blank line arrives."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Transfer-Encoding", "chunked")
        self._security_headers()
        self.end_headers()
        started = time.monotonic()
        events = 0
        pending: list[bytes] = []
        redact = EventRedactor(self.server.config.api_key)
        try:
            try:
                while True:
                    line = resp.readline(MAX_BODY_BYTES)
                    if not line:
                        break
                    pending.append(line)
                    if line in (b"\n", b"\r\n"):
                        self._write_chunk(redact(b"".join(pending)))
                        pending = []
                        events += 1
            except (OSError, http.client.HTTPException) as exc:
                # The upstream failed mid-answer: tell the page instead of stopping silently.
                LOG.warning("upstream %s failed after %d events: %s", target, events, exc)
                error = json.dumps({"error": {"message": f"upstream {target} failed: {exc}"}})
                pending.append(b"\ndata: " + error.encode("utf-8") + b"\n\n")
            pending.insert(0, redact.flush())
            if any(pending):
                self._write_chunk(redact(b"".join(pending)))
            self._write_chunk(b"")
        except (ConnectionError, ssl.SSLError, socket.timeout) as exc:
            # The browser went away (stop button, closed tab): closing the
            # upstream connection makes the server stop generating.
            LOG.info("client went away after %d events: %s", events, exc)
            self.close_connection = True
            return
        LOG.info("relayed %d events in %.1f s", events, time.monotonic() - started)


class _Answered(Exception):
    """The request has had its answer (a 429); nothing more to do."""


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# The page (relative URLs only: it works under any prefix) -----------------

INDEX_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>llmfleet chat</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="style.css">
<script src="app.js" defer></script>
</head>
<body>
<header>
  <h1 id="title">llmfleet chat</h1>
  <span id="model" class="muted"></span>
  <button id="new" type="button" class="secondary">New chat</button>
</header>
<main id="log" aria-live="polite"></main>
<form id="form">
  <textarea id="prompt" rows="3" placeholder="Ask something. Enter sends, Shift+Enter is a new line."
    aria-label="Prompt" required></textarea>
  <div class="actions">
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" class="secondary" disabled>Stop</button>
  </div>
</form>
<footer id="status" class="muted" role="status"></footer>
</body>
</html>
"""

STYLE_CSS = """:root {
  color-scheme: light;
  --bg: #f6f7f9;
  --fg: #1b1f24;
  --muted: #555e69;
  --border: #c9d1d9;
  --user-bg: #dbe9ff;
  --user-fg: #0b2545;
  --bot-bg: #ffffff;
  --bot-fg: #1b1f24;
  --error-bg: #ffebe9;
  --error-fg: #82071e;
  --accent: #0b5cd5;
  --accent-fg: #ffffff;
  --field-bg: #ffffff;
}
* { box-sizing: border-box; }
html, body { height: 100%; margin: 0; }
body {
  display: flex;
  flex-direction: column;
  background: var(--bg);
  color: var(--fg);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
}
header, form, footer { padding: 0.6rem 1rem; }
header { display: flex; align-items: baseline; gap: 1rem; border-bottom: 1px solid var(--border); }
h1 { font-size: 1.15rem; margin: 0; }
#new { margin-left: auto; }
.muted { color: var(--muted); font-size: 0.9rem; }
main { flex: 1; overflow-y: auto; padding: 1rem; display: flex; flex-direction: column; gap: 0.75rem; }
.msg { max-width: 80ch; padding: 0.6rem 0.9rem; border-radius: 0.8rem; border: 1px solid var(--border); }
.msg .text { white-space: pre-wrap; overflow-wrap: anywhere; }
.msg.user { align-self: flex-end; background: var(--user-bg); color: var(--user-fg); }
.msg.assistant { align-self: flex-start; background: var(--bot-bg); color: var(--bot-fg); }
.msg.error { background: var(--error-bg); color: var(--error-fg); }
.msg.assistant[data-state="streaming"] .text::after { content: "\\258D"; }
form { display: flex; gap: 0.6rem; border-top: 1px solid var(--border); }
textarea {
  flex: 1;
  resize: vertical;
  font: inherit;
  padding: 0.5rem;
  border-radius: 0.5rem;
  border: 1px solid var(--border);
  background: var(--field-bg);
  color: var(--fg);
}
.actions { display: flex; flex-direction: column; gap: 0.4rem; }
button {
  font: inherit;
  padding: 0.4rem 1rem;
  border-radius: 0.5rem;
  border: 1px solid var(--accent);
  background: var(--accent);
  color: var(--accent-fg);
  cursor: pointer;
}
button.secondary { background: transparent; color: var(--fg); border-color: var(--border); }
button:disabled { opacity: 0.6; cursor: default; }
footer { min-height: 2.2rem; }

/* The dark theme comes after the base rules so that it wins. */
@media (prefers-color-scheme: dark) {
  :root {
    color-scheme: dark;
    --bg: #0d1117;
    --fg: #e6edf3;
    --muted: #9ea7b3;
    --border: #3d444d;
    --user-bg: #1c3558;
    --user-fg: #eaf2ff;
    --bot-bg: #161b22;
    --bot-fg: #e6edf3;
    --error-bg: #42151a;
    --error-fg: #ffc1c5;
    --accent: #1f6feb;
    --accent-fg: #ffffff;
    --field-bg: #010409;
  }
}
"""

APP_JS = """"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const log = $("log"), form = $("form"), prompt = $("prompt");
  const send = $("send"), stop = $("stop"), status = $("status");
  let history = [];
  let controller = null;

  fetch("api/config").then((r) => r.json()).then((c) => {
    if (c.title) { document.title = c.title; $("title").textContent = c.title; }
    $("model").textContent = c.model || "";
  }).catch(() => {});

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "msg " + role;
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    div.appendChild(body);
    log.appendChild(div);
    log.scrollTop = log.scrollHeight;
    return div;
  }

  function busy(on) {
    send.disabled = on;
    stop.disabled = !on;
  }

  function figures(t0, tFirst, tEnd, usage, timings) {
    const parts = [];
    if (tFirst !== null) parts.push("first token after " + ((tFirst - t0) / 1000).toFixed(2) + " s");
    let tps = null;
    if (timings && timings.predicted_per_second) tps = timings.predicted_per_second;
    else if (usage && usage.completion_tokens && tFirst !== null && tEnd > tFirst)
      tps = usage.completion_tokens / ((tEnd - tFirst) / 1000);
    if (tps !== null) parts.push(tps.toFixed(1) + " tokens/s");
    if (usage && usage.completion_tokens) parts.push(usage.completion_tokens + " tokens");
    return parts.join(", ");
  }

  async function ask(text) {
    history.push({ role: "user", content: text });
    bubble("user", text);
    const div = bubble("assistant", "");
    const out = div.firstChild;
    div.dataset.state = "streaming";
    controller = new AbortController();
    busy(true);
    status.textContent = "waiting for the first token...";
    const t0 = performance.now();
    let tFirst = null, answer = "", usage = null, timings = null;
    try {
      const resp = await fetch("api/chat", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ messages: history }),
        signal: controller.signal,
      });
      if (!resp.ok) {
        let msg = resp.status + " " + resp.statusText;
        try { const j = await resp.json(); if (j.error) msg = j.error; } catch (e) { /* keep the status */ }
        throw new Error(msg);
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\\r$/, "");
          buf = buf.slice(nl + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          let ev;
          try { ev = JSON.parse(data); } catch (e) { continue; }
          if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
          const choice = ev.choices && ev.choices[0];
          const piece = choice && choice.delta && choice.delta.content;
          if (piece) {
            if (tFirst === null) tFirst = performance.now();
            answer += piece;
            out.textContent = answer;
            log.scrollTop = log.scrollHeight;
          }
          if (ev.usage) usage = ev.usage;
          if (ev.timings) timings = ev.timings;
        }
      }
      history.push({ role: "assistant", content: answer });
      status.textContent = figures(t0, tFirst, performance.now(), usage, timings);
    } catch (err) {
      if (err.name === "AbortError") {
        history.push({ role: "assistant", content: answer });
        status.textContent = "stopped";
      } else {
        history.pop();
        div.classList.add("error");
        out.textContent = (answer ? answer + "\\n\\n" : "") + "Error: " + err.message;
        status.textContent = "the request failed; you can send it again";
      }
    } finally {
      div.dataset.state = "done";
      controller = null;
      busy(false);
      prompt.focus();
    }
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = prompt.value.trim();
    if (!text || controller) return;
    prompt.value = "";
    ask(text);
  });
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  stop.addEventListener("click", () => { if (controller) controller.abort(); });
  $("new").addEventListener("click", () => {
    if (controller) controller.abort();
    history = [];
    log.textContent = "";
    status.textContent = "";
    prompt.focus();
  });
  prompt.focus();
})();
"""

STATIC = {
    "/": ("text/html; charset=utf-8", INDEX_HTML),
    "/index.html": ("text/html; charset=utf-8", INDEX_HTML),
    "/style.css": ("text/css; charset=utf-8", STYLE_CSS),
    "/app.js": ("text/javascript; charset=utf-8", APP_JS),
}


# Command line ---------------------------------------------------------------


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
    except OSError as exc:
        raise ConfigError(f"{what} file {path}: {exc.strerror or exc}") from exc
    if what == "password" and not value:
        raise ConfigError(f"password file {path} is empty")
    return value


def parse_args(argv: Optional[list[str]] = None, environ: Optional[dict[str, str]] = None) -> Config:
    env = os.environ if environ is None else environ

    def default(name: str, fallback: str) -> str:
        return env.get("LLMFLEET_CHAT_" + name.upper().replace("-", "_"), fallback)

    parser = argparse.ArgumentParser(description="llmfleet chat page in front of llama-server or vLLM")
    parser.add_argument(
        "--upstream",
        default=default("upstream", "http://127.0.0.1:8080"),
        help="base URL of the OpenAI-compatible server (default %(default)s)",
    )
    parser.add_argument("--listen", default=default("listen", "127.0.0.1"), help="address to listen on")
    parser.add_argument("--port", type=int, default=int(default("port", "8088")), help="port to listen on")
    parser.add_argument("--prefix", default=default("prefix", "/chat"), help="path prefix of the page")
    parser.add_argument("--username", default=default("username", "llmfleet"), help="HTTP Basic user name")
    parser.add_argument(
        "--password-file",
        default=default("password-file", ""),
        required=False,
        help="file holding the page's password (required)",
    )
    parser.add_argument(
        "--api-key-file",
        default=default("api-key-file", ""),
        help="file holding the upstream API key (optional)",
    )
    parser.add_argument(
        "--model",
        default=default("model", ""),
        help="model name to request (default: the first one the upstream lists)",
    )
    parser.add_argument("--title", default=default("title", "llmfleet chat"), help="page title")
    parser.add_argument(
        "--max-tokens", type=int, default=int(default("max-tokens", "1024")), help="answer length limit"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(default("timeout", "600")),
        help="seconds to wait for the upstream (slow CPU prefill needs minutes)",
    )
    parser.add_argument("--tls-cert", default=default("tls-cert", ""), help="PEM certificate (enables TLS)")
    parser.add_argument("--tls-key", default=default("tls-key", ""), help="PEM private key")
    parser.add_argument(
        "--upstream-ca", default=default("upstream-ca", ""), help="CA bundle to trust for an https upstream"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=int(default("max-connections", str(MAX_CONNECTIONS))),
        help="requests answered at once (worker threads; default %(default)s)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=float(default("idle-timeout", str(IDLE_TIMEOUT))),
        help="seconds a new connection may stay silent (default %(default)s)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=float(default("header-timeout", str(HEADER_TIMEOUT))),
        help="seconds from the accept to the end of the request's headers (default %(default)s)",
    )
    parser.add_argument(
        "--max-per-client",
        type=int,
        default=int(default("max-per-client", str(MAX_PER_CLIENT))),
        help="connections one client (address, IPv6 /64) may hold open at once (default %(default)s)",
    )
    parser.add_argument(
        "--trusted-proxies",
        default=default("trusted-proxies", ""),
        help="comma-separated networks of proxies (an Ingress controller) whose last X-Forwarded-For "
        "entry is the client whose wrong passwords are counted (default: none, the peer counts)",
    )
    parser.add_argument(
        "--api-passthrough",
        action="store_true",
        default=default("api-passthrough", "").lower() in ("1", "true", "yes"),
        help="also relay the upstream's API (/v1/..., /health, /metrics) with the client's own key",
    )
    args = parser.parse_args(argv)
    if not args.password_file:
        raise ConfigError("--password-file is required (LLMFLEET_CHAT_PASSWORD_FILE)")
    return Config(
        upstream=args.upstream,
        password=_read_secret(args.password_file, "password"),
        api_key=_read_secret(args.api_key_file, "api key") if args.api_key_file else "",
        username=args.username,
        listen=args.listen,
        port=args.port,
        prefix=args.prefix,
        model=args.model,
        title=args.title,
        max_tokens=args.max_tokens,
        timeout=args.timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        upstream_ca=args.upstream_ca,
        api_passthrough=args.api_passthrough,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        header_timeout=args.header_timeout,
        max_per_client=args.max_per_client,
        trusted_proxies=args.trusted_proxies,
    )


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = parse_args(argv)
        server = ChatServer(config)
    except ConfigError as exc:
        LOG.error("llmfleet-chat: %s", exc)
        return 2
    except OSError as exc:
        LOG.error("llmfleet-chat: cannot listen on %s:%d: %s", config.listen, config.port, exc)
        return 2

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    scheme = "https" if server.tls_context else "http"
    LOG.info(
        "llmfleet-chat %s on %s://%s:%d%s/ -> %s (user %s, api key %s, api passthrough %s)",
        VERSION,
        scheme,
        config.listen,
        server.server_address[1],
        server.prefix,
        server.upstream.display,
        config.username,
        "set" if config.api_key else "none",
        "on" if config.api_passthrough else "off",
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The link probe: round-trip time and throughput each way between the head and one worker.

Python 3 stdlib only (it runs on the hosts). A worker runs :func:`serve` for a bounded time
(``deadline`` seconds, then it exits whatever happens) and answers only a client that presents
the run token; the head runs :func:`measure` against it. Every read from the network is bounded
in size and in total time (not per byte), and each connection is served in its own thread (at
most ``MAX_CLIENTS``), so a slow client holds one slot for seconds, never the server. The protocol, one TCP connection per operation::

    client: LLMFLEET-PROBE/1 <token> <op> <arg>\\n     (at most 256 bytes)
    server: OK\\n | ERR <reason>\\n
    ping <n>:   n times: client sends 1 byte, server echoes 1 byte
    down <ms>:  server sends zeros for <ms> milliseconds (at most max_bytes), then closes
    up <ms>:    client sends for <ms> milliseconds, shuts its side; server answers GOT <bytes>\\n
    quit 0:     the server exits

``mbit_s`` of a link is the slower direction (a token's activations cross it both ways).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import hmac
import os
import select
import socket
import threading
import time

MAGIC = "LLMFLEET-PROBE/1"
MAX_LINE = 256
CHUNK = 65536
MAX_PINGS = 100
MAX_MS = 10000
DEFAULT_MAX_BYTES = 1 << 30
MAX_CLIENTS = 8  # connections served at once
REQUEST_S = 5.0  # the whole request line, however slowly it is sent
GRACE_S = 10.0  # an operation's time plus this, at most


class ProbeError(Exception):
    """A probe that could not be done (the message says why)."""


def _read_line(conn, limit=MAX_LINE, until=None, clock=time.monotonic):
    """One line of at most ``limit`` bytes; with ``until`` (a ``clock`` time) the whole line must
    arrive by then, however the bytes are spread (else the connection's timeout bounds each wait)."""
    data = b""
    while not data.endswith(b"\n"):
        if until is not None:
            left = until - clock()
            if left <= 0:
                raise ProbeError("no whole line within the time allowed")
            conn.settimeout(left)
        piece = conn.recv(1)
        if not piece:
            raise ProbeError("connection closed after %d bytes of a line" % len(data))
        data += piece
        if len(data) > limit:
            raise ProbeError("line longer than %d bytes" % limit)
    return data[:-1].decode("ascii", "replace")


def _bounded(conn, until, clock):
    """Set the socket's timeout to what is left until ``until``; ProbeError when nothing is."""
    left = until - clock()
    if left <= 0:
        raise ProbeError("the connection's time is up")
    conn.settimeout(left)


def _handle(conn, token, deadline, max_bytes, clock):
    """Serve one connection; True when the client asked the server to quit.

    Every step has a total bound, not a per-byte one: the request line must arrive within
    ``REQUEST_S`` seconds, an operation ends ``GRACE_S`` seconds after its own time at the
    latest, and nothing outlives the server's ``deadline``."""
    if deadline - clock() <= 0:
        return True
    try:
        fields = _read_line(conn, until=min(deadline, clock() + REQUEST_S), clock=clock).split(" ")
    except (ProbeError, OSError):
        return False
    if len(fields) != 4 or fields[0] != MAGIC:
        conn.sendall(b"ERR bad request\n")
        return False
    if not hmac.compare_digest(fields[1].encode("ascii", "replace"), token.encode("ascii", "replace")):
        conn.sendall(b"ERR bad token\n")
        return False
    op, arg = fields[2], fields[3]
    try:
        value = int(arg)
    except ValueError:
        conn.sendall(b"ERR bad argument\n")
        return False
    if op == "quit":
        conn.sendall(b"OK\n")
        return True
    if op in ("ping", "down", "up"):
        span = value / 1000.0 if op != "ping" else 0
        until = min(deadline, clock() + span + GRACE_S)
        _bounded(conn, until, clock)
    if op == "ping" and 1 <= value <= MAX_PINGS:
        conn.sendall(b"OK\n")
        for _unused in range(value):
            _bounded(conn, until, clock)
            byte = conn.recv(1)
            if not byte:
                break
            conn.sendall(byte)
        return False
    if op == "down" and 1 <= value <= MAX_MS:
        conn.sendall(b"OK\n")
        block = b"\0" * CHUNK
        end = min(clock() + value / 1000.0, deadline)
        sent = 0
        while clock() < end and sent < max_bytes:
            _bounded(conn, until, clock)
            conn.sendall(block)
            sent += len(block)
        return False
    if op == "up" and 1 <= value <= MAX_MS:
        conn.sendall(b"OK\n")
        got = 0
        while got <= max_bytes:
            _bounded(conn, until, clock)
            piece = conn.recv(CHUNK)
            if not piece:
                break
            got += len(piece)
        conn.sendall(("GOT %d\n" % got).encode("ascii"))
        return False
    conn.sendall(b"ERR unknown operation\n")
    return False


def _serve_one(conn, token, deadline, max_bytes, clock, done, slots):
    """One connection in its own thread; sets ``done`` when the client asked to quit."""
    try:
        if _handle(conn, token, deadline, max_bytes, clock):
            done.set()
    except (OSError, ProbeError):
        pass
    finally:
        conn.close()
        slots.release()


def serve(sock, token, deadline_s, max_bytes=DEFAULT_MAX_BYTES, clock=time.monotonic):
    """Answer probe clients on the listening ``sock`` until ``deadline_s`` seconds have passed
    or a client sends ``quit``. Each connection is served in its own thread, at most
    ``MAX_CLIENTS`` at once (one more is told ``ERR busy`` and closed), each bounded in total
    time, so a slow client holds one slot for ``REQUEST_S`` seconds, not the server. Closes ``sock``."""
    if not token:
        raise ProbeError("serve needs a run token")
    deadline = clock() + float(deadline_s)
    done = threading.Event()
    slots = threading.BoundedSemaphore(MAX_CLIENTS)
    try:
        while not done.is_set():
            remaining = deadline - clock()
            if remaining <= 0:
                return
            ready, _unused_w, _unused_x = select.select([sock], [], [], min(remaining, 0.2))
            if not ready:
                continue
            conn, _unused = sock.accept()
            if not slots.acquire(blocking=False):
                with contextlib.suppress(OSError):
                    conn.setblocking(False)
                    conn.send(b"ERR busy\n")
                conn.close()
                continue
            worker = threading.Thread(
                target=_serve_one, args=(conn, token, deadline, max_bytes, clock, done, slots)
            )
            worker.daemon = True
            worker.start()
    finally:
        sock.close()


def listen(bind="0.0.0.0", port=0):
    """A listening TCP socket on ``bind``:``port`` (0: any free port)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, int(port)))
    sock.listen(4)
    return sock


def serve_in_background(bind, port, token, deadline_s, max_bytes=DEFAULT_MAX_BYTES):
    """Start :func:`serve` in a detached process (double fork) and return (port, pid).

    The server process exits at its deadline, so nothing is left behind on the host."""
    sock = listen(bind, port)
    bound = sock.getsockname()[1]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # first child
        try:
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(write_end, ("%d\n" % grandchild).encode("ascii"))
                os._exit(0)
            os.close(read_end)
            os.close(write_end)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            serve(sock, token, deadline_s, max_bytes)
        finally:
            os._exit(0)
    sock.close()
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as handle:
        text = handle.read(32).decode("ascii", "replace").strip()
    if not text.isdigit():
        raise ProbeError("the probe server did not start")
    return bound, int(text)


def _request(address, port, token, op, arg, timeout):
    conn = socket.create_connection((address, int(port)), timeout=timeout)
    try:
        conn.settimeout(timeout)
        conn.sendall(("%s %s %s %d\n" % (MAGIC, token, op, int(arg))).encode("ascii"))
        answer = _read_line(conn)
    except Exception:
        conn.close()
        raise
    if answer != "OK":
        conn.close()
        raise ProbeError("the server answered %r" % answer[:80])
    return conn


def _ping(address, port, token, pings, timeout, clock):
    conn = _request(address, port, token, "ping", pings, timeout)
    times = []
    try:
        for _unused in range(pings):
            start = clock()
            conn.sendall(b"p")
            if conn.recv(1) != b"p":
                raise ProbeError("ping answer missing")
            times.append((clock() - start) * 1000.0)
    finally:
        conn.close()
    return times


def _down(address, port, token, seconds, timeout, max_bytes, clock):
    conn = _request(address, port, token, "down", int(seconds * 1000), timeout)
    got = 0
    start = clock()
    try:
        while got <= max_bytes:
            piece = conn.recv(CHUNK)
            if not piece:
                break
            got += len(piece)
            if clock() - start > seconds + timeout:
                raise ProbeError("download did not end within %.1f s" % (seconds + timeout))
    finally:
        conn.close()
    return got, clock() - start


def _up(address, port, token, seconds, timeout, max_bytes, clock):
    conn = _request(address, port, token, "up", int(seconds * 1000), timeout)
    block = b"\0" * CHUNK
    start = clock()
    sent = 0
    try:
        while clock() - start < seconds and sent < max_bytes:
            conn.sendall(block)
            sent += len(block)
        conn.shutdown(socket.SHUT_WR)
        answer = _read_line(conn)
    finally:
        conn.close()
    elapsed = clock() - start
    fields = answer.split(" ")
    if len(fields) != 2 or fields[0] != "GOT" or not fields[1].isdigit():
        raise ProbeError("upload answer %r" % answer[:80])
    return int(fields[1]), elapsed


def _mbit(nbytes, seconds):
    return round(nbytes * 8 / seconds / 1e6, 2) if seconds > 0 else 0.0


def measure(
    name,
    address,
    port,
    token,
    seconds=1.0,
    pings=5,
    timeout=3.0,
    max_bytes=DEFAULT_MAX_BYTES,
    clock=time.monotonic,
):
    """Round-trip time and throughput each way to one probe server.

    Returns ``measured: true`` with ``rtt_ms`` (median of ``pings``), ``rtt_ms_min``,
    ``mbit_s_to_host`` (head -> host), ``mbit_s_from_host`` and ``mbit_s`` (the slower), or
    ``measured: false`` with ``reason`` "not measured: <host> (<address>:<port>): <why>".
    Each step is bounded by ``timeout`` seconds (plus ``seconds`` for the two transfers).
    """
    where = "%s (%s:%s)" % (name, address, port)
    begin = clock()
    if not address:
        return {"host": name, "measured": False, "reason": "not measured: %s: no address" % name}
    pings = max(1, min(int(pings), MAX_PINGS))
    seconds = max(0.05, min(float(seconds), MAX_MS / 1000.0))
    try:
        times = sorted(_ping(address, port, token, pings, timeout, clock))
        up_bytes, up_s = _up(address, port, token, seconds, timeout, max_bytes, clock)
        down_bytes, down_s = _down(address, port, token, seconds, timeout, max_bytes, clock)
    except socket.timeout:
        return _not_measured(name, address, port, "no answer within %.1f s" % timeout, clock() - begin)
    except (OSError, ProbeError) as err:
        return _not_measured(name, address, port, str(err) or type(err).__name__, clock() - begin)
    to_host, from_host = _mbit(up_bytes, up_s), _mbit(down_bytes, down_s)
    result = {
        "host": name,
        "address": address,
        "port": int(port),
        "measured": True,
        "rtt_ms": round(times[len(times) // 2], 3),
        "rtt_ms_min": round(times[0], 3),
        "mbit_s_to_host": to_host,
        "mbit_s_from_host": from_host,
        "mbit_s": min(to_host, from_host),
        "bytes_to_host": up_bytes,
        "bytes_from_host": down_bytes,
        "seconds": round(clock() - begin, 3),
    }
    if result["mbit_s"] <= 0:
        result.update(measured=False, reason="not measured: %s: no bytes crossed the link" % where)
    return result


def _not_measured(name, address, port, why, elapsed):
    return {
        "host": name,
        "address": address,
        "port": int(port),
        "measured": False,
        "reason": "not measured: %s (%s:%s): %s" % (name, address, port, why),
        "seconds": round(elapsed, 3),
    }


def quit_server(address, port, token, timeout=2.0):
    """Ask a probe server to exit before its deadline (best effort)."""
    with contextlib.suppress(OSError, ProbeError):
        _request(address, port, token, "quit", 0, timeout).close()

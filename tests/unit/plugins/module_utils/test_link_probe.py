"""The link probe (plugins/module_utils/link_probe.py) against loopback servers."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import link_probe

TOKEN = "run-token-1234"


def start(token=TOKEN, deadline=10.0, max_bytes=link_probe.DEFAULT_MAX_BYTES):
    sock = link_probe.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    thread = threading.Thread(target=link_probe.serve, args=(sock, token, deadline, max_bytes), daemon=True)
    thread.start()
    return port, thread


def test_rtt_and_throughput_each_way_on_loopback() -> None:
    port, thread = start()
    result = link_probe.measure("w1", "127.0.0.1", port, TOKEN, seconds=0.2, pings=5, timeout=2.0)
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert not thread.is_alive(), "quit must end the server"
    assert result["measured"] is True, result
    # loopback: well under 50 ms a round trip, well over 50 Mbit/s each way
    assert 0 < result["rtt_ms_min"] <= result["rtt_ms"] < 50
    assert result["mbit_s_to_host"] > 50 and result["mbit_s_from_host"] > 50
    assert result["mbit_s"] == min(result["mbit_s_to_host"], result["mbit_s_from_host"])
    # the figure is bytes over time: at least one 64 KiB block crossed each way
    assert result["bytes_to_host"] >= 65536 and result["bytes_from_host"] >= 65536
    assert result["seconds"] < 3.0


def test_throughput_is_the_bytes_over_the_time() -> None:
    # a cap of one block each way: the figure must follow the bytes that really crossed
    port, thread = start(max_bytes=65536)
    result = link_probe.measure("w1", "127.0.0.1", port, TOKEN, seconds=0.3, timeout=2.0, max_bytes=65536)
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert result["measured"] is True, result
    assert result["bytes_from_host"] == 65536
    # 65536 bytes in at most the 0.3 s + slack of the window -> at least 1.5 Mbit/s, and the
    # figure equals bytes * 8 / seconds for some time within the window
    assert result["mbit_s_from_host"] >= 65536 * 8 / 0.5 / 1e6


def test_a_host_that_never_answers_is_named_within_a_bounded_time() -> None:
    # listens (the connect succeeds) but never accepts nor answers
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    port = silent.getsockname()[1]
    try:
        begin = time.monotonic()
        result = link_probe.measure("nas", "127.0.0.1", port, TOKEN, seconds=0.2, timeout=0.5)
        elapsed = time.monotonic() - begin
    finally:
        silent.close()
    assert result["measured"] is False
    assert result["reason"].startswith(f"not measured: nas (127.0.0.1:{port})")
    assert "no answer within 0.5 s" in result["reason"]
    assert elapsed < 2.0


def test_a_refused_port_is_named() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    result = link_probe.measure("wifi", "127.0.0.1", port, TOKEN, timeout=0.5)
    assert result["measured"] is False
    assert result["reason"].startswith(f"not measured: wifi (127.0.0.1:{port}): ")


def test_a_wrong_token_is_refused_by_the_server() -> None:
    port, thread = start()
    result = link_probe.measure("w1", "127.0.0.1", port, "other-token", timeout=1.0)
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert result["measured"] is False
    assert "bad token" in result["reason"]


def test_the_server_exits_at_its_deadline_without_a_client() -> None:
    sock = link_probe.listen("127.0.0.1", 0)
    begin = time.monotonic()
    link_probe.serve(sock, TOKEN, 0.3)
    assert time.monotonic() - begin < 1.5
    assert sock.fileno() == -1


def test_an_oversized_request_line_is_bounded() -> None:
    port, thread = start()
    conn = socket.create_connection(("127.0.0.1", port), timeout=2)
    conn.sendall(b"x" * 10000)
    # the server stops reading after 256 bytes and closes; it does not buffer the rest
    try:
        data = conn.recv(100)
    except ConnectionResetError:
        data = b""
    conn.close()
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert data == b"" or data.startswith(b"ERR")
    assert not thread.is_alive()


def test_serve_in_background_answers_and_exits_at_its_deadline() -> None:
    port, pid = link_probe.serve_in_background("127.0.0.1", 0, TOKEN, 2.0)
    result = link_probe.measure("w1", "127.0.0.1", port, TOKEN, seconds=0.1, timeout=2.0)
    assert result["measured"] is True, result
    for _unused in range(60):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the background server outlived its 2 s deadline")


class Dripper(threading.Thread):
    """A client that sends a request line one byte a second (each within the old 10 s per-byte
    timeout) and records when the server closed on it."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.closed_after: float | None = None

    def run(self) -> None:
        begin = time.monotonic()
        try:
            for byte in f"{link_probe.MAGIC} {TOKEN} ping 1\n".encode():
                self.conn.sendall(bytes([byte]))
                time.sleep(1.0)
        except OSError:
            pass
        finally:
            self.closed_after = time.monotonic() - begin
            self.conn.close()


def test_a_slow_client_does_not_hold_the_server_for_the_others() -> None:
    """Issue 31 item 12: two clients dripping their request lines; the head's measure still runs."""
    port, thread = start(deadline=30.0)
    drippers = [Dripper(port), Dripper(port)]
    for dripper in drippers:
        dripper.start()
    time.sleep(0.3)  # both are connected and being served first
    result = link_probe.measure("w1", "127.0.0.1", port, TOKEN, seconds=0.2, pings=3, timeout=2.0)
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert result["measured"] is True, result
    assert not thread.is_alive()


def test_a_request_line_has_a_total_bound_not_a_per_byte_one() -> None:
    port, thread = start(deadline=30.0)
    dripper = Dripper(port)
    began = time.monotonic()
    dripper.start()
    # The server stops reading after REQUEST_S whatever the pace: the client's next send fails
    # or its line is never answered; it no longer holds anything.
    deadline = began + 9.0  # the line takes ~40 s at this pace; REQUEST_S (5 s) + slack
    conn = dripper.conn
    closed = False
    while time.monotonic() < deadline and not closed:
        try:
            conn.settimeout(0.5)
            closed = conn.recv(64) == b""
        except socket.timeout:
            continue
        except OSError:
            closed = True
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert closed, "the server still held a dripping client after 9 s"
    assert time.monotonic() - began < 9.0 and link_probe.REQUEST_S < 9.0


def test_more_clients_than_slots_are_told_busy_not_queued() -> None:
    port, thread = start(deadline=30.0)
    held = [
        socket.create_connection(("127.0.0.1", port), timeout=5) for _slot in range(link_probe.MAX_CLIENTS)
    ]
    time.sleep(0.3)
    extra = socket.create_connection(("127.0.0.1", port), timeout=5)
    answer = extra.recv(64)
    extra.close()
    for conn in held:
        conn.close()
    time.sleep(0.3)
    link_probe.quit_server("127.0.0.1", port, TOKEN)
    thread.join(5)
    assert answer == b"ERR busy\n"

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

"""The supervisor (roles/llama_rpc/files/llmfleet_supervisor.py) against bad plans and bad workers.

Issue #14 item 7: a malformed plan is refused once, at start, with one line naming the entry
and the value and exit status 78, which the systemd unit does not restart on
(RestartPreventExitStatus); workers count as up only when they answer ggml-rpc HELLO within
the probe deadline (tests/support/fake_rpc.py, written from llama.cpp's protocol), and every
change of a worker's state is logged by its name. These tests failed on the supervisor
before this change (a traceback and exit 1, or a silent worker counted as up).
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_rpc import FakeRpcServer
from tests.unit.roles.test_supervisor import SUPERVISOR, Harness, fallback, make_plan, sup

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def workers() -> Iterator[dict[str, FakeRpcServer]]:
    ws = {"w1": FakeRpcServer(), "w2": FakeRpcServer()}
    yield ws
    for w in ws.values():
        w.down()


def good_plan() -> dict[str, Any]:
    return {
        "version": 1,
        "workers": ["w1", "w2"],
        "hosts": [
            {"name": "head", "role": "head", "endpoint": None},
            {"name": "w1", "role": "worker", "endpoint": "10.0.0.1:50052"},
            {"name": "w2", "role": "worker", "endpoint": "10.0.0.2:50052"},
        ],
        "llama_server_args": ["--rpc", "10.0.0.1:50052,10.0.0.2:50052", "-ngl", "99"],
        "fallbacks": [
            {
                "workers": ["w1"],
                "ok": True,
                "llama_server_args": ["--rpc", "10.0.0.1:50052", "-ngl", "99"],
                "hosts": [{"name": "w1", "role": "worker", "endpoint": "10.0.0.1:50052"}],
            },
            {"workers": ["w2"], "ok": False, "reason": "w2 alone lacks 100 MiB"},
        ],
    }


def mutate(change) -> dict[str, Any]:
    plan = copy.deepcopy(good_plan())
    change(plan)
    return plan


def _set(path: list, value: Any):
    def change(plan: dict) -> None:
        target = plan
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


# (a bad plan, words the one-line refusal must contain)
BAD_PLANS = {
    "fallback-not-an-object": (_set(["fallbacks", 0], "w1"), ["fallback[0]", "str", "'w1'"]),
    "fallback-a-number": (_set(["fallbacks", 1], 42), ["fallback[1]", "int", "42"]),
    "fallbacks-not-a-list": (_set(["fallbacks"], {"w1": 1}), ["fallbacks must be a list", "dict"]),
    "endpoint-an-int": (_set(["hosts", 1, "endpoint"], 50052), ["worker w1", "50052", "int"]),
    "endpoint-notaport": (_set(["hosts", 2, "endpoint"], "w2:notaport"), ["worker w2", "'notaport'"]),
    "endpoint-port-70000": (_set(["hosts", 1, "endpoint"], "10.0.0.1:70000"), ["worker w1", "70000"]),
    "endpoint-port-0": (_set(["hosts", 1, "endpoint"], "10.0.0.1:0"), ["worker w1", "'0'"]),
    "endpoint-no-port": (_set(["hosts", 1, "endpoint"], "10.0.0.1"), ["worker w1", "'10.0.0.1'"]),
    "endpoint-with-comma": (_set(["hosts", 1, "endpoint"], "a,b:50052"), ["worker w1", "'a,b'"]),
    "fallback-endpoint-an-int": (
        _set(["fallbacks", 0, "hosts", 0, "endpoint"], 7),
        ["fallback[0]", "worker w1", "int"],
    ),
    "fallback-workers-a-string": (_set(["fallbacks", 0, "workers"], "w1"), ["fallback[0].workers", "str"]),
    "fallback-unknown-worker": (_set(["fallbacks", 0, "workers"], ["w9"]), ["fallback[0]", "w9"]),
    "fallback-ok-a-string": (_set(["fallbacks", 0, "ok"], "yes"), ["fallback[0].ok", "'yes'"]),
    "fallback-ok-without-args": (
        _set(["fallbacks", 0, "llama_server_args"], []),
        ["fallback[0]", "no llama"],
    ),
    "rpc-arg-notaport": (_set(["llama_server_args", 1], "10.0.0.1:x"), ["--rpc", "'x'"]),
    "fallback-rpc-arg-bad": (
        _set(["fallbacks", 0, "llama_server_args", 1], "h:99999"),
        ["fallback[0]", "99999"],
    ),
    "args-not-strings": (_set(["llama_server_args"], ["-ngl", 99]), ["llama_server_args", "list of strings"]),
    "host-a-string": (_set(["hosts", 0], "head"), ["hosts[0]", "str"]),
    "workers-repeated": (_set(["workers"], ["w1", "w1"]), ["workers", "repeated"]),
    "worker-without-endpoint": (_set(["hosts", 2, "endpoint"], None), ["w2"]),
    "plan-a-list": (lambda plan: None, ["not an llmfleet plan"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_a_malformed_plan_is_one_clear_line_and_exit_78(tmp_path: Path, case: str) -> None:
    change, words = BAD_PLANS[case]
    plan: Any = [good_plan()] if case == "plan-a-list" else mutate(change)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--plan", str(path), "--llama-server", "/bin/false"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_the_good_plan_passes_validation() -> None:
    plan = good_plan()
    assert sup.validate_plan(plan, "plan.json") is plan
    ipv6 = mutate(_set(["hosts", 1, "endpoint"], "[fd00::1]:50052"))
    ipv6["llama_server_args"][1] = "[fd00::1]:50052,10.0.0.2:50052"
    sup.validate_plan(ipv6, "plan.json")
    workerless = {"workers": [], "hosts": [], "llama_server_args": ["-ngl", "0"], "fallbacks": []}
    sup.validate_plan(workerless, "plan.json")


def test_the_unit_does_not_restart_a_refused_plan() -> None:
    unit = (ROOT / "roles/llama_rpc/templates/systemd/llmfleet-llama-server.service.j2").read_text()
    prevent = [
        line.split("=", 1)[1].split()
        for line in unit.splitlines()
        if line.startswith("RestartPreventExitStatus=")
    ]
    assert prevent and "78" in prevent[0]
    assert "Restart=on-failure" in unit


# HELLO at the RPC level ---------------------------------------------------------------


def test_hello_against_a_fake_rpc_server() -> None:
    server = FakeRpcServer("rpc")
    try:
        ok, detail = sup.rpc_hello(server.endpoint, 2.0)
    finally:
        server.down()
    assert ok, detail
    assert "7.0.0" in detail
    assert server.hellos == 1 and server.bad_requests == []


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("silent", "accepts TCP but gave no HELLO answer within 0.5 s"),
        ("close", "closed the connection instead of answering HELLO"),
        ("http", "not a ggml rpc-server"),
    ],
)
def test_a_worker_that_does_not_speak_rpc_is_down(mode: str, words: str) -> None:
    server = FakeRpcServer(mode)
    try:
        started = time.monotonic()
        ok, detail = sup.rpc_hello(server.endpoint, 0.5)
        took = time.monotonic() - started
    finally:
        server.down()
    assert not ok
    assert words in detail
    assert took < 2.0


def test_a_closed_port_is_down() -> None:
    server = FakeRpcServer("rpc")
    endpoint = server.endpoint
    server.down()
    ok, detail = sup.rpc_hello(endpoint, 0.5)
    assert not ok and "no TCP connection" in detail


@pytest.mark.slow
def test_a_worker_that_accepts_tcp_and_never_answers_is_not_up(tmp_path: Path, workers) -> None:
    """The silent w2 is down, logged by name; after the grace the fallback for w1 starts."""
    workers["w2"].down()
    silent = FakeRpcServer("silent", port=workers["w2"].port)
    workers["w2"] = silent
    plan = make_plan(workers, [fallback(workers, ["w1"])])
    h = Harness(tmp_path, plan, grace=0.5)
    try:
        h.wait_log(f"worker w2 ({silent.endpoint}): down: accepts TCP but gave no HELLO answer")
        h.wait_log(f"worker w1 ({workers['w1'].endpoint}): up, rpc-server protocol 7.0.0")
        starts = h.wait_starts(1)
        assert starts[0]["argv"][:2] == ["--rpc", workers["w1"].endpoint]
        assert h.text().count("worker w2") == 1  # logged when it changed, not every probe
    finally:
        h.stop()


@pytest.mark.slow
def test_a_worker_that_comes_back_is_logged_up(tmp_path: Path, workers) -> None:
    port = workers["w2"].port
    workers["w2"].down()
    plan = make_plan(workers, [])
    h = Harness(tmp_path, plan, grace=30)
    try:
        h.wait_log(f"worker w2 (127.0.0.1:{port}): down: no TCP connection")
        assert h.starts() == []
        workers["w2"].up()
        h.wait_log(f"worker w2 (127.0.0.1:{port}): up")
        assert h.wait_starts(1)[0]["argv"][:2] == ["--rpc", plan["rpc"]]
    finally:
        h.stop()


LLAMA_BIN = ROOT / ".cache" / "llama.cpp" / "bin"


@pytest.mark.skipif(
    not (LLAMA_BIN / "ggml-rpc-server").exists(), reason="llama.cpp not built (make test-artifacts)"
)
def test_hello_against_the_real_rpc_server() -> None:
    """The probe speaks the protocol of the pinned build: the real rpc-server answers, three times."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(LLAMA_BIN / "ggml-rpc-server"), "--host", "127.0.0.1", "--port", str(port)],
        env=dict(os.environ, LD_LIBRARY_PATH=str(LLAMA_BIN)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        results: list[tuple[bool, str]] = []
        while time.monotonic() < deadline and len([r for r in results if r[0]]) < 3:
            results.append(sup.rpc_hello(f"127.0.0.1:{port}", 3.0))
            if not results[-1][0]:
                time.sleep(0.2)
        assert server.poll() is None, "rpc-server exited after a HELLO"
    finally:
        server.terminate()
        server.wait(10)
    answered = [detail for ok, detail in results if ok]
    assert len(answered) == 3, results
    assert all(detail.startswith("rpc-server protocol 7.") for detail in answered)

"""The head's supervisor (roles/llama_rpc/files/llmfleet_supervisor.py) against real sockets.

Workers are real TCP listeners on loopback; llama-server is a small Python script that
records its command line and environment, and exits or ignores SIGTERM on request. The
supervisor runs as a real process with short intervals, exactly as systemd starts it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.fake_rpc import FakeRpcServer

ROOT = Path(__file__).resolve().parents[3]
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"

_spec = importlib.util.spec_from_file_location("llmfleet_supervisor", SUPERVISOR)
assert _spec is not None and _spec.loader is not None
sup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sup)

FAKE_SERVER = textwrap.dedent(
    """\
    import json, os, signal, sys, time
    log = os.environ["FAKE_LOG"]
    with open(log, "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(),
                            "backtrace": os.environ.get("GGML_NO_BACKTRACE")}) + "\\n")
    if os.path.exists(os.environ["FAKE_IGNORE_TERM"]):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--port" in sys.argv:
        # /health like llama-server's: 503 while loading (the FAKE_LOADING file exists), then 200.
        import http.server, threading
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                code = 503 if os.path.exists(os.environ["FAKE_LOADING"]) else 200
                if self.path != "/health":
                    code = 404
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
            def log_message(self, *args):
                pass
        port = int(sys.argv[sys.argv.index("--port") + 1])
        httpd = http.server.HTTPServer(("127.0.0.1", port), Health)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    while True:
        if os.path.exists(os.environ["FAKE_CRASH"]):
            os.unlink(os.environ["FAKE_CRASH"])
            sys.exit(134)
        time.sleep(0.05)
    """
)


class Worker(FakeRpcServer):
    """A fake rpc-server on loopback that answers HELLO (tests/support/fake_rpc.py)."""


def make_plan(workers: dict[str, Worker], fallbacks: list[dict]) -> dict:
    hosts = [{"name": "head", "role": "head", "endpoint": None}] + [
        {"name": n, "role": "worker", "endpoint": w.endpoint} for n, w in workers.items()
    ]
    rpc = ",".join(w.endpoint for w in workers.values())
    return {
        "version": 1,
        "workers": list(workers),
        "hosts": hosts,
        "rpc": rpc,
        "llama_server_args": ["--rpc", rpc, "--tensor-split", "1,1,1", "-ngl", "999"],
        "fallbacks": fallbacks,
    }


class Harness:
    def __init__(
        self, tmp: Path, plan: dict, *extra: str, grace: float = 1.0, tcp: Path | None = None
    ) -> None:
        self.tmp = tmp
        self.log = tmp / "fake.jsonl"
        self.crash = tmp / "crash"
        self.ignore_term = tmp / "ignore-term"
        self.state = tmp / "state.json"
        self.loading = tmp / "loading"
        (tmp / "plan.json").write_text(json.dumps(plan))
        (tmp / "llama-server").write_text(FAKE_SERVER)
        launcher = tmp / "llama-server.sh"
        launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp / "llama-server"}" "$@"\n')
        launcher.chmod(0o755)
        tables = ["--proc-net-tcp", str(tcp)] if tcp else []
        env = dict(
            os.environ,
            FAKE_LOG=str(self.log),
            FAKE_CRASH=str(self.crash),
            FAKE_IGNORE_TERM=str(self.ignore_term),
            FAKE_LOADING=str(self.loading),
        )
        env.pop("GGML_NO_BACKTRACE", None)
        self.stderr = open(tmp / "supervisor.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(SUPERVISOR),
                "--plan",
                str(tmp / "plan.json"),
                "--llama-server",
                str(tmp / "llama-server.sh"),
                "--interval",
                "0.2",
                "--stable",
                "2",
                "--grace",
                str(grace),
                "--probe-timeout",
                "0.5",
                "--stop-timeout",
                "1",
                "--state-file",
                str(self.state),
                *tables,
                "--",
                *extra,
            ],
            env=env,
            stderr=self.stderr,
        )

    def starts(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def wait_starts(self, count: int, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            starts = self.starts()
            if len(starts) >= count:
                time.sleep(0.1)
                return starts
            time.sleep(0.05)
        raise AssertionError(f"llama-server started {len(self.starts())} times, not {count}:\n{self.text()}")

    def text(self) -> str:
        return (self.tmp / "supervisor.log").read_text()

    def wait_log(self, needle: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} never logged:\n{self.text()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(15)
        self.stderr.close()
        return rc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def workers():
    ws = {"w1": Worker(), "w2": Worker(), "w3": Worker()}
    yield ws
    for w in ws.values():
        w.down()


def fallback(workers: dict[str, Worker], names: list[str], ok: bool = True, reason: str = "") -> dict:
    if not ok:
        return {"workers": names, "ok": False, "reason": reason}
    rpc = ",".join(workers[n].endpoint for n in names)
    return {
        "workers": names,
        "ok": True,
        "rpc": rpc,
        "llama_server_args": ["--rpc", rpc, "--tensor-split", f"fallback-{'-'.join(names)}"],
        "hosts": [{"name": n, "role": "worker", "endpoint": workers[n].endpoint} for n in names],
    }


# ----------------------------------------------------------------------------- pure parts


def test_proc_net_tcp_decodes_ipv4_and_ipv6_remotes_and_states() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F90 0300590A:C354 01 00000000:00000000 00:00000000 00000000   999 0 1 1\n"
        "   1: 0100007F:1F90 0400590A:C354 08 00000000:00000000 00:00000000 00000000   999 0 2 1\n"
    )
    assert sup.parse_proc_net_tcp(text) == [(("10.89.0.3", 50004), "01"), (("10.89.0.4", 50004), "08")]
    text6 = (
        "  sl  local_address                         remote_address                        st\n"
        "   0: 00000000000000000000000001000000:1F90 0000000000000000FFFF00000300590A:C354 01 0 0 0\n"
        "   1: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:0050 0A 0 0 0\n"
    )
    assert sup.parse_proc_net_tcp(text6) == [(("10.89.0.3", 50004), "01"), (("::1", 80), "0A")]


def test_entries_map_each_worker_set_and_refusals(workers) -> None:
    plan = make_plan(
        workers, [fallback(workers, ["w1", "w2"]), fallback(workers, ["w3"], False, "too small")]
    )
    entries = sup.plan_entries(plan)
    assert entries[frozenset({"w1", "w2", "w3"})].args == plan["llama_server_args"]
    assert entries[frozenset({"w2", "w1"})].args[-1] == "fallback-w1-w2"
    assert entries[frozenset({"w3"})].ok is False
    assert entries[frozenset({"w3"})].reason == "too small"


def test_plan_without_worker_endpoint_is_an_error_naming_the_worker(workers) -> None:
    plan = make_plan(workers, [])
    plan["hosts"] = [h for h in plan["hosts"] if h["name"] != "w2"]
    with pytest.raises(sup.SupervisorError, match="w2"):
        sup.plan_endpoints(plan)


def test_rewrite_rpc_maps_planned_to_discovered_endpoints_in_order() -> None:
    planned = {"a": "10.0.0.1:50052", "b": "10.0.0.2:50052"}
    args = ["--rpc", "10.0.0.2:50052,10.0.0.1:50052", "-ngl", "999"]
    found = {"a": "pod-a:50052", "b": "pod-b:50052"}
    assert sup.rewrite_rpc(args, planned, found) == ["--rpc", "pod-b:50052,pod-a:50052", "-ngl", "999"]
    assert sup.rewrite_rpc(args, planned, planned) == args


def test_unreadable_plan_exits_78_and_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    proc = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--plan", str(bad), "--llama-server", "/bin/false"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == sup.EXIT_BAD_PLAN == 78
    assert str(bad) in proc.stderr


# ----------------------------------------------------------------------------- as a process


@pytest.mark.slow
def test_starts_the_plan_with_extra_args_when_all_workers_answer(tmp_path, workers) -> None:
    plan = make_plan(workers, [fallback(workers, ["w1", "w2"])])
    h = Harness(tmp_path, plan, "-m", "/models/x.gguf", "--metrics")
    try:
        first = h.wait_starts(1)[0]
        assert first["argv"] == [*plan["llama_server_args"], "-m", "/models/x.gguf", "--metrics"]
        assert first["backtrace"] == "1"
        state = json.loads(h.state.read_text())
        assert state["status"] == "running" and state["workers"] == ["w1", "w2", "w3"]
    finally:
        assert h.stop() == 0
    assert not alive(first["pid"]), "llama-server outlived its supervisor"


@pytest.mark.slow
def test_waits_for_a_missing_worker_then_falls_back_after_the_grace(tmp_path, workers) -> None:
    workers["w3"].down()
    plan = make_plan(workers, [fallback(workers, ["w1", "w2"])])
    h = Harness(tmp_path, plan, grace=1.5)
    try:
        h.wait_log("waiting for w3")
        assert h.starts() == [], "started before the grace ran out"
        start = h.wait_starts(1)[0]
        assert start["argv"][-1] == "fallback-w1-w2"
        # The missing worker returns: the answering set changes, the full plan runs.
        workers["w3"].up()
        second = h.wait_starts(2)[1]
        assert second["argv"] == plan["llama_server_args"]
        assert not alive(start["pid"])
        h.wait_log("the answering set changed to w1,w2,w3")
    finally:
        h.stop()


@pytest.mark.slow
def test_logs_the_refusal_and_starts_nothing_when_the_fallback_cannot_serve(tmp_path, workers) -> None:
    workers["w2"].down()
    workers["w3"].down()
    plan = make_plan(workers, [fallback(workers, ["w1"], ok=False, reason="w1 alone lacks 150 MiB")])
    h = Harness(tmp_path, plan, grace=0.5)
    try:
        h.wait_log("refused: the plan's fallback for w1 cannot serve: w1 alone lacks 150 MiB")
        time.sleep(0.5)
        assert h.starts() == []
        assert json.loads(h.state.read_text())["status"] == "waiting"
    finally:
        h.stop()


@pytest.mark.slow
def test_no_entry_for_the_set_is_logged(tmp_path, workers) -> None:
    workers["w1"].down()
    plan = make_plan(workers, [fallback(workers, ["w1", "w2"])])
    h = Harness(tmp_path, plan, grace=0.3)
    try:
        h.wait_log("no placement in the plan for the answering set w2,w3")
        assert h.starts() == []
    finally:
        h.stop()


@pytest.mark.slow
def test_restarts_llama_server_when_it_exits(tmp_path, workers) -> None:
    plan = make_plan(workers, [])
    h = Harness(tmp_path, plan)
    try:
        first = h.wait_starts(1)[0]
        h.crash.write_text("")
        second = h.wait_starts(2)[1]
        assert second["pid"] != first["pid"]
        assert second["argv"] == first["argv"]
        h.wait_log("llama-server exited with 134")
    finally:
        h.stop()


@pytest.mark.slow
def test_sigkill_after_the_stop_timeout_when_sigterm_is_ignored(tmp_path, workers) -> None:
    plan = make_plan(workers, [])
    h = Harness(tmp_path, plan)
    h.ignore_term.write_text("")
    first = h.wait_starts(1)[0]
    started = time.monotonic()
    assert h.stop() == 0
    took = time.monotonic() - started
    assert not alive(first["pid"])
    assert "ignored SIGTERM for 1 s: SIGKILL" in h.text()
    assert 0.9 <= took < 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_table(workers: dict[str, Worker], names: list[str]) -> str:
    """/proc/net/tcp with an established connection from 127.0.0.1:8080 to each named worker."""
    rows = ["  sl  local_address rem_address   st"]
    for i, n in enumerate(names):
        port = workers[n].port
        rows.append(f"   {i}: 0100007F:1F90 0100007F:{port:04X} 01 0 0 0")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize(
    ("extra", "url"),
    [
        ([], "http://127.0.0.1:8080/health"),
        (["-m", "x.gguf", "--host", "0.0.0.0", "--port", "8081"], "http://127.0.0.1:8081/health"),
        (["--host=10.1.2.3", "--port=9000"], "http://10.1.2.3:9000/health"),
        (["--host", "::", "--port", "80"], "http://[::1]:80/health"),
        (["--host", "/run/llama.sock"], ""),
    ],
)
def test_health_url_from_llama_server_arguments(extra: list[str], url: str) -> None:
    assert sup.health_url(extra) == url


@pytest.mark.slow
def test_a_lost_connection_of_a_busy_worker_restarts_on_the_fallback(tmp_path, workers) -> None:
    """The fake llama-server never connects, so fake the kernel's TCP table instead."""
    plan = make_plan(workers, [fallback(workers, ["w1", "w2"])])
    tcp = tmp_path / "tcp"
    table = functools.partial(tcp_table, workers)
    tcp.write_text(table(["w1", "w2", "w3"]))
    h = Harness(tmp_path, plan, "--host", "127.0.0.1", "--port", str(free_port()), grace=0.5, tcp=tcp)
    try:
        first = h.wait_starts(1)[0]
        assert first["argv"][: len(plan["llama_server_args"])] == plan["llama_server_args"]
        h.wait_log("llama-server is healthy")
        time.sleep(0.6)  # seen connected to all three
        workers["w3"].down()
        tcp.write_text(table(["w1", "w2"]))  # the connection to w3 is gone (CLOSE_WAIT or removed)
        h.wait_log("worker w3 (127.0.0.1:")
        second = h.wait_starts(2)[1]
        assert second["argv"][-5] == "fallback-w1-w2"  # then --host 127.0.0.1 --port N
        assert not alive(first["pid"])
    finally:
        h.stop()


@pytest.mark.slow
def test_the_device_query_connection_closing_while_loading_is_not_a_lost_worker(tmp_path, workers) -> None:
    """llama-server connects to each worker for the device query, closes that connection and
    opens the one it keeps later; when loading is slow the gap lasts. Only once /health answers
    200 is a connection that goes away a lost worker."""
    plan = make_plan(workers, [fallback(workers, ["w1", "w2"])])
    tcp = tmp_path / "tcp"
    table = functools.partial(tcp_table, workers)
    (tmp_path / "loading").write_text("")  # Harness.loading: /health answers 503
    tcp.write_text(table(["w1", "w2", "w3"]))  # the device query's connections
    h = Harness(tmp_path, plan, "--host", "127.0.0.1", "--port", str(free_port()), grace=0.5, tcp=tcp)
    try:
        first = h.wait_starts(1)[0]
        time.sleep(0.8)  # four probes with all three connected, still loading (503)
        tcp.write_text(table([]))  # the device query's connections closed; loading goes on
        time.sleep(1.2)  # six probes at 0.2 s: the old watch stopped llama-server after two
        assert len(h.starts()) == 1, h.text()
        assert alive(first["pid"]), h.text()
        assert "connection to it is gone" not in h.text()
        assert "healthy" not in h.text()
        # The loading connections open, the model is loaded: the watch starts and works.
        tcp.write_text(table(["w1", "w2", "w3"]))
        h.loading.unlink()
        h.wait_log("llama-server is healthy (http://127.0.0.1:")
        time.sleep(0.6)
        workers["w3"].down()
        tcp.write_text(table(["w1", "w2"]))
        h.wait_log("worker w3 (127.0.0.1:")
        second = h.wait_starts(2)[1]
        assert second["argv"][-5] == "fallback-w1-w2"  # then --host 127.0.0.1 --port N
    finally:
        h.stop()

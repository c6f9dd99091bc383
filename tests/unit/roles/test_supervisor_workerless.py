"""The systemd target's supervisor serving a plan with no worker, with the real llama-server.

The planner plans the tiny 8-layer model (tests/support/gguf_gen.py, .cache/models) for a head
large enough to hold it alone and one worker it does not need, so the plan has ``workers == []``
and no ``--rpc``. The supervisor (roles/llama_rpc/files/llmfleet_supervisor.py) runs as a real
process, as the unit starts it (static discovery), with the llama-server that make test-artifacts
built; it must start llama-server at once (there is no worker to wait for), /health must answer
200 and a chat completion must come back with text. A second test, which needs only the tiny model,
runs it with a stand-in llama-server that records its arguments: started at once with the plan's
arguments, and started again when it exits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import make_plan

ROOT = Path(__file__).resolve().parents[3]
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"
CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
LLAMA_SERVER = CACHE / "llama.cpp" / "bin" / "llama-server"
MODEL = CACHE / "models" / "tiny-llama-8L.gguf"

needs_model = pytest.mark.skipif(not MODEL.is_file(), reason="needs make test-artifacts (tiny model)")
needs_server = pytest.mark.skipif(
    not LLAMA_SERVER.is_file(), reason="needs make test-artifacts (llama-server)"
)

STAND_IN = """\
import json, os, sys, time
with open(os.environ["STAND_IN_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if len(open(os.environ["STAND_IN_LOG"]).readlines()) == 1:
    sys.exit(3)
time.sleep(60)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def workerless_plan() -> dict:
    layout = read_layout(str(MODEL)).to_dict()
    head = {"name": "head", "usable_mib": 4000, "cpus": 1, "address": "127.0.0.1"}
    idle = {"name": "w1", "usable_mib": 300, "cpus": 1, "address": "127.0.0.2"}
    model = {"name": "tiny-llama-8L", "file": str(MODEL)}
    plan = make_plan(layout, model, head, [idle], {"context": 512}, 32.0, "llama_cpp", "systemd")
    return json.loads(json.dumps(plan))


def get(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read(1 << 20) or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, {}


@needs_model
def test_the_plan_of_a_head_alone_has_no_worker_and_no_rpc() -> None:
    plan = workerless_plan()
    assert plan["workers"] == []
    assert [h["name"] for h in plan["hosts"]] == ["head"]
    assert "--rpc" not in plan["llama_server_args"]


@needs_model
def test_the_supervisor_starts_a_workerless_plan_at_once_and_restarts_it(tmp_path: Path) -> None:
    plan = workerless_plan()
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    (tmp_path / "stand-in.py").write_text(STAND_IN)
    launcher = tmp_path / "llama-server"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "stand-in.py"}" "$@"\n')
    launcher.chmod(0o755)
    log = tmp_path / "argv.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SUPERVISOR),
            "--plan",
            str(plan_path),
            "--llama-server",
            str(launcher),
            "--interval",
            "0.2",
            "--stable",
            "2",
            "--grace",
            "30",
            "--stop-timeout",
            "1",
            "--",
            "--port",
            "1",
        ],
        env=dict(os.environ, STAND_IN_LOG=str(log)),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 2):
            time.sleep(0.1)
        starts = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        # Well inside the 30 s grace: nothing was waited for. Started again after the exit.
        assert len(starts) >= 2, starts
        for argv in starts[:2]:
            assert argv == [*plan["llama_server_args"], "--port", "1"]
            assert "--rpc" not in argv
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_model
@needs_server
def test_the_supervisor_serves_a_workerless_plan_with_the_real_llama_server(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(workerless_plan()))
    port = free_port()
    state = tmp_path / "state.json"
    log = (tmp_path / "supervisor.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SUPERVISOR),
            "--plan",
            str(plan_path),
            "--llama-server",
            str(LLAMA_SERVER),
            "--interval",
            "0.2",
            "--stable",
            "2",
            "--grace",
            "5",
            "--state-file",
            str(state),
            "--",
            "-m",
            str(MODEL),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline and proc.poll() is None:
            status, _body = get(f"http://127.0.0.1:{port}/health")
            if status == 200:
                break
            time.sleep(0.5)
        text = (tmp_path / "supervisor.log").read_text()
        assert status == 200, f"/health {status}; supervisor log:\n{text[-4000:]}"
        assert "start llama-server for - (plan)" in text, text[-4000:]
        assert "--rpc" not in text
        code, answer = get(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0},
        )
        assert code == 200
        assert answer["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] > 0
        running = json.loads(state.read_text())
        assert running["status"] == "running" and running["workers"] == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

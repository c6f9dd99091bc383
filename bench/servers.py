"""Start, stop, wait for and ask llama.cpp's processes on loopback: the helpers every bench shares.

bench/device_split.py, bench/vulkan_buffers.py and bench/planner_accuracy.py run ggml-rpc-server
and llama-server as local processes (no podman) and read their logs, their /proc status and one
completion; this module is the one place that does it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

PROMPT = "The capital of France is"
MAX_BODY = 1 << 20  # a completion's JSON body is read bounded


def env(vulkan: bool) -> dict[str, str]:
    """The environment of a llama.cpp process: no backtrace on a crash, and Mesa's lavapipe (a
    CPU-type Vulkan device llama.cpp skips unless named) visible only where ``vulkan``."""
    out = dict(os.environ, GGML_NO_BACKTRACE="1", GGML_VK_VISIBLE_DEVICES="0")
    if not vulkan:
        out.pop("GGML_VK_VISIBLE_DEVICES")
    return out


def start(
    cmd: list[str], log: str, *, vulkan: bool = False, cgroup: str | None = None, nice: int | None = 19
) -> subprocess.Popen:
    """Start ``cmd`` with stdout and stderr into ``log``, line-buffered (an rpc-server prints its
    devices on stdout and is stopped by a signal), at ``nice`` (None: the caller's), inside the
    cgroup v2 directory ``cgroup`` when given. The process keeps its pid through the wrappers
    (each one execs), so /proc/<pid>/status is the server's own."""
    argv = ["stdbuf", "-oL", *cmd]
    if nice is not None:
        argv = ["nice", "-n", str(nice), *argv]
    if cgroup:
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *argv]
    out = open(log, "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env(vulkan))


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def status_mib(pid: int, key: str) -> float | None:
    """A ``/proc/<pid>/status`` figure (``VmRSS``, ``VmHWM``: kB) in MiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def wait_health(port: int, proc: subprocess.Popen, timeout: float = 120.0, interval: float = 0.5) -> bool:
    """True once llama-server on 127.0.0.1:``port`` answers /health with 200; False when it exits
    or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(interval)
    return False


def complete(port: int, n_predict: int = 6, timeout: float = 300.0) -> str:
    """One greedy completion of :data:`PROMPT` from llama-server on 127.0.0.1:``port``."""
    body = json.dumps({"prompt": PROMPT, "n_predict": n_predict, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read(MAX_BODY)).get("content", "")

#!/usr/bin/env python
"""The chat page's resources under idle sockets and large bodies, before and after #14.

Runs each version of roles/chat_ui/files/llmfleet_chat.py as its own process on loopback in
front of a fake upstream (tests/support/fake_openai.py, with an API key, --api-passthrough on),
with the open-file limit its systemd unit gives it (1024, the default soft limit, before;
LimitNOFILE=4096 after), then:

1. holds ``--idle`` sockets open that never send a byte (a client that connects and waits),
   and sends ``--users`` legitimate requests (GET /chat/ with the password, 10 s each):
   how many are answered, the app's threads and RSS while the sockets are held;
2. closes them and sends ``--bodies`` API requests at once with a ``--body-mib`` MiB body each
   and no credentials: the app's peak RSS (VmHWM).

    python bench/chat_resources.py [--before REF] [--idle 1080] [--users 3] [--bodies 8]

``--before`` is the git revision whose app is "before" (default: the last commit before #14's
chat changes); "after" is the app in the working tree. Prints one table and, with ``--json``,
writes the figures.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fake_openai import FakeUpstream

APP = "roles/chat_ui/files/llmfleet_chat.py"
BEFORE = "c0de2fd"
KEY = "sk-bench-0123456789abcdef"
USER, PASSWORD = "llmfleet", "bench-password-of-24-chars"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _sep, value = line.partition(":")
        if name in ("Threads", "VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def wait_healthy(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        time.sleep(0.1)
    raise SystemExit(f"the app on port {port} never answered /healthz")


def legit_request(port: int, timeout: float) -> bool:
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("GET", "/chat/", headers={"Authorization": auth})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False


def body_request(port: int, mib: int, results: list) -> None:
    size = mib << 20
    chunk = b"x" * (1 << 20)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % size
            )
            for _unused in range(mib):
                sock.sendall(chunk)
            sock.settimeout(60)
            results.append(sock.recv(64).split(b"\r\n", 1)[0].decode(errors="replace"))
    except OSError as exc:
        results.append(f"error: {exc}")


def run(label: str, app: Path, nofile: int, args: argparse.Namespace, upstream: FakeUpstream) -> dict:
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="chat-bench-"))
    (tmp / "password").write_text(PASSWORD + "\n")
    (tmp / "key").write_text(KEY + "\n")

    def limits() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))

    proc = subprocess.Popen(
        [sys.executable, str(app), "--port", str(port), "--upstream", upstream.url, "--api-passthrough",
         "--password-file", str(tmp / "password"), "--api-key-file", str(tmp / "key"), "--username", USER],
        preexec_fn=limits, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    result: dict = {"app": label, "nofile": nofile}
    try:
        wait_healthy(port)
        idle: list[socket.socket] = []
        for _unused in range(args.idle):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                break
            idle.append(sock)
        time.sleep(2.0)  # let the app accept what it can
        held = proc_status(proc.pid)
        started = time.monotonic()
        answered = sum(legit_request(port, 10.0) for _unused in range(args.users))
        result.update(
            idle_connected=len(idle),
            users_answered=f"{answered}/{args.users}",
            users_seconds=round(time.monotonic() - started, 1),
            threads_idle=held["Threads"],
            rss_idle_mib=round(held["VmRSS"] / 1024, 1),
        )
        for sock in idle:
            sock.close()
        time.sleep(1.0)
        before = proc_status(proc.pid)
        results: list[str] = []
        threads = [
            threading.Thread(target=body_request, args=(port, args.body_mib, results))
            for _unused in range(args.bodies)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        after = proc_status(proc.pid)
        result.update(
            rss_before_bodies_mib=round(before["VmRSS"] / 1024, 1),
            peak_rss_bodies_mib=round(after["VmHWM"] / 1024, 1),
            body_answers=sorted(set(results)),
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", default=BEFORE, help="git revision of the 'before' app (default %(default)s)"
    )
    parser.add_argument("--idle", type=int, default=1080, help="idle sockets held (default %(default)s)")
    parser.add_argument("--users", type=int, default=3, help="legitimate requests (default %(default)s)")
    parser.add_argument("--bodies", type=int, default=8, help="concurrent large bodies (default %(default)s)")
    parser.add_argument("--body-mib", type=int, default=64, help="MiB per body (default %(default)s)")
    parser.add_argument("--only", choices=("before", "after"), help="run one version only")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the holder needs > --idle files
    old = Path(tempfile.mkdtemp(prefix="chat-before-")) / "llmfleet_chat.py"
    old.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{args.before}:{APP}"],
                                   check=True, capture_output=True).stdout)  # fmt: skip
    rows = []
    with FakeUpstream(api_key=KEY) as upstream:
        if args.only != "after":
            rows.append(run(f"before ({args.before})", old, 1024, args, upstream))
        if args.only != "before":
            rows.append(run("after (working tree)", ROOT / APP, 4096, args, upstream))
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

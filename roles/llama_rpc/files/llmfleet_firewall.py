#!/usr/bin/env python
"""llmfleet firewall: load the nftables table inet llmfleet and keep it loaded.

The main process of ``llmfleet-firewall.service`` (the llama_rpc role's systemd target). rpc-server
has no authentication; its unit runs only while this one does (``Requires=``, ``BindsTo=``). A
oneshot ``nft -f`` said "active" after anyone's ``nft flush ruleset`` (Debian's nftables.service
flushes on start, reload and stop) while the port stood open; this process instead

1. loads the table (``nft -f FILE``; a failure is exit 1: the unit fails and rpc-server never starts),
2. watches the ruleset (``nft monitor``): after every transaction of another process that
   touches the table (a flush, a delete, an edit) it loads the table again at once (logged);
   when that fails, or the table is put back more than ``--max-reloads`` times a minute, it exits
   1: the unit fails, and systemd stops rpc-server with it,
3. tells systemd it is ready (``READY=1``, ``Type=notify``) only once the watch runs, so rpc-server
   starts after the watch, never before.

It exits 0 on SIGTERM (``systemctl stop``); the unit's ``ExecStopPost=`` deletes the table after
rpc-server has stopped. Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Optional

TABLE = ("inet", "llmfleet")


def log(message: str) -> None:
    sys.stderr.write(f"llmfleet-firewall: {message}\n")
    sys.stderr.flush()


def notify(state: str) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET (nothing when unset)."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(path)
        sock.sendall(state.encode())


GENERATION = re.compile(r"^# new generation \d+ by process (\d+)")


class Firewall:
    def __init__(self, nft: str, ruleset: str, max_reloads: int):
        self.nft = nft
        self.ruleset = ruleset
        self.max_reloads = max_reloads
        self.expected = ""
        self.own: set = set()  # process ids of this watcher's own nft -f runs
        self.reloads: deque = deque()

    def live(self) -> Optional[str]:
        """The table as nft lists it without counters (None when it is not loaded)."""
        proc = subprocess.run(
            [self.nft, "-s", "list", "table", *TABLE], capture_output=True, text=True, check=False, timeout=30
        )
        return proc.stdout if proc.returncode == 0 else None

    def load(self) -> None:
        proc = subprocess.Popen(
            [self.nft, "-f", self.ruleset], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.own.add(proc.pid)
        _out, err = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"nft -f {self.ruleset} failed ({proc.returncode}): {err.strip()}")
        self.expected = self.live() or ""

    def changed(self, pid: Optional[int]) -> None:
        """A transaction touched the table: load it again unless this watcher made it.

        Another process's change is never trusted, whatever the table looks like after it (a
        listing taken right after it could include it); only where nft names no process is the
        table compared with what was loaded."""
        if pid is not None and pid in self.own:
            self.own.discard(pid)
            return
        live = self.live()
        if pid is None and live == self.expected:
            return
        now = time.monotonic()
        self.reloads.append(now)
        while self.reloads and now - self.reloads[0] > 60:
            self.reloads.popleft()
        if len(self.reloads) > self.max_reloads:
            raise RuntimeError(
                f"table {' '.join(TABLE)} was removed or changed {len(self.reloads)} times within "
                f"60 s; giving up (rpc-server stops with this unit)"
            )
        what = "is gone (flushed or deleted)" if live is None else "was changed"
        by = f" by process {pid}" if pid is not None else ""
        log(f"table {' '.join(TABLE)} {what}{by}: loading {self.ruleset} again")
        self.load()


def watch(firewall: Firewall, stopping: list) -> int:
    monitor = subprocess.Popen(
        [firewall.nft, "monitor"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    try:
        # Loaded after the monitor started: whatever happens from now on is seen.
        firewall.load()
        notify("READY=1")
        log(f"table {' '.join(TABLE)} loaded from {firewall.ruleset}; watching the ruleset")
        touched = False
        marker = f" {' '.join(TABLE)}"
        assert monitor.stdout is not None
        for line in monitor.stdout:
            if stopping:
                return 0
            if marker in line or "flush ruleset" in line:
                touched = True
            if line.startswith("# new generation"):
                found = GENERATION.match(line)
                pid = int(found.group(1)) if found else None
                if touched:
                    firewall.changed(pid)
                elif pid is not None:
                    firewall.own.discard(pid)
                touched = False
        if stopping:
            return 0
        log(f"nft monitor ended (exit {monitor.wait()}): cannot watch the table any longer")
        return 1
    finally:
        if monitor.poll() is None:
            monitor.terminate()
            try:
                monitor.wait(5)
            except subprocess.TimeoutExpired:
                monitor.kill()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ruleset", help="the nftables file that defines table inet llmfleet")
    parser.add_argument("--nft", default="/usr/sbin/nft")
    parser.add_argument(
        "--max-reloads", type=int, default=10, help="table put back at most this often a minute"
    )
    opts = parser.parse_args(argv)
    stopping: list = []

    def on_signal(_signum, _frame):
        stopping.append(True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return watch(Firewall(opts.nft, opts.ruleset, opts.max_reloads), stopping)
    except RuntimeError as exc:
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""llmfleet supervisor: run llama-server on the head for the workers that answer.

One stdlib-only file, shipped by the systemd target of ``llmfleet.cluster.llama_rpc`` and
(in a ConfigMap) by its Kubernetes target. It does no split math: the plan written on the
controller (``llmfleet_plan``) carries a complete placement for the planned workers and a
fallback for every subset of them. The supervisor

1. finds the planned workers' endpoints (``--discovery``: ``static`` reads them from the
   plan; ``kubernetes`` lists the Ready rpc-server pods through the API server and keys them
   by node name; another target registers its ``Discovery`` class in ``DISCOVERIES``),
2. TCP-probes them until the answering set is stable (``--stable`` equal probes in a row),
3. picks the entry whose ``workers`` equal that set: the plan itself when every planned
   worker answers, else - once the missing ones have been gone for ``--grace`` seconds - the
   fallback for the set, or it logs why it waits (no entry, or the fallback's refusal),
4. starts llama-server (``GGML_NO_BACKTRACE=1``) with the entry's placement arguments
   followed by the arguments after ``--``,
5. restarts it when it exits or when the answering set changes (SIGTERM, SIGKILL after
   ``--stop-timeout`` seconds), and logs every decision on stderr.

While llama-server runs, the workers it uses are not probed by connecting (rpc-server
serves one client at a time with a listen backlog of 1, so probes would queue and time
out); their health is read from the kernel's TCP table instead (``/proc/net/tcp``): a worker
whose connection from this network namespace was established and no longer is has gone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Optional

VERSION = "1"
TCP_ESTABLISHED = "01"


class SupervisorError(Exception):
    """A plan or an option the supervisor cannot work with."""


# --------------------------------------------------------------------------- plan


class Entry:
    """One placement the supervisor may run: the plan itself or one of its fallbacks."""

    def __init__(self, name: str, workers: Sequence[str], ok: bool, args: Sequence[str], reason: str):
        self.name = name
        self.workers = frozenset(workers)
        self.ok = ok
        self.args = list(args)
        self.reason = reason


def load_plan(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            plan = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SupervisorError(f"cannot read the plan {path}: {exc}") from exc
    if not isinstance(plan, dict) or not isinstance(plan.get("workers"), list):
        raise SupervisorError(f"{path}: not an llmfleet plan (no list 'workers')")
    if not isinstance(plan.get("llama_server_args"), list):
        raise SupervisorError(f"{path}: the plan has no list 'llama_server_args'")
    return plan


def plan_entries(plan: dict) -> dict[frozenset[str], Entry]:
    """Map each worker set to the entry planned for it (the plan wins over a fallback)."""
    entries: dict[frozenset[str], Entry] = {}
    for index, fallback in enumerate(plan.get("fallbacks") or []):
        workers = fallback.get("workers") or []
        entry = Entry(
            name=f"fallback[{index}]",
            workers=workers,
            ok=bool(fallback.get("ok")),
            args=fallback.get("llama_server_args") or [],
            reason=str(fallback.get("reason") or ""),
        )
        if entry.ok and not entry.args:
            raise SupervisorError(f"fallback for {sorted(entry.workers)} is ok but has no llama_server_args")
        entries[entry.workers] = entry
    primary = Entry("plan", plan["workers"], True, plan["llama_server_args"], "")
    entries[primary.workers] = primary
    return entries


def plan_endpoints(plan: dict) -> dict[str, str]:
    """Worker name -> ``host:port`` as the plan gives it (hosts of the plan and its fallbacks)."""
    endpoints: dict[str, str] = {}
    host_lists = [plan.get("hosts") or []] + [f.get("hosts") or [] for f in plan.get("fallbacks") or []]
    for hosts in host_lists:
        for host in hosts:
            if host.get("role") == "worker" and host.get("endpoint"):
                endpoints.setdefault(host["name"], host["endpoint"])
    missing = [name for name in plan["workers"] if name not in endpoints]
    if missing:
        raise SupervisorError(f"the plan gives no endpoint for worker(s) {', '.join(missing)}")
    return endpoints


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SupervisorError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def rewrite_rpc(args: Sequence[str], planned: dict[str, str], found: dict[str, str]) -> list[str]:
    """Replace planned endpoints in ``--rpc`` by the discovered ones, keeping the order.

    Static discovery finds the planned endpoints, so this returns ``args`` unchanged.
    """
    by_endpoint = {endpoint: name for name, endpoint in planned.items()}
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "--rpc":
            names = [by_endpoint.get(ep, "") for ep in out[i + 1].split(",")]
            out[i + 1] = ",".join(found.get(name, ep) for name, ep in zip(names, out[i + 1].split(",")))
    return out


# --------------------------------------------------------------------------- discovery


class Discovery:
    """Where the workers are. Subclass and register in DISCOVERIES for another target."""

    def __init__(self, plan: dict):
        self.plan = plan

    def endpoints(self) -> dict[str, str]:
        """Worker name -> ``host:port`` for every planned worker that has an address now."""
        raise NotImplementedError


class StaticDiscovery(Discovery):
    """Fixed addresses from the plan (bare hosts, the systemd target)."""

    def __init__(self, plan: dict):
        super().__init__(plan)
        self._endpoints = plan_endpoints(plan)

    def endpoints(self) -> dict[str, str]:
        return dict(self._endpoints)


def pod_endpoints(pod_list: dict, planned: dict[str, str]) -> dict[str, str]:
    """Node name -> ``podIP:port`` of the Ready pods of a PodList on the planned workers' nodes.

    The port is the pod's container port named ``rpc`` (else the plan's); a pod being deleted or
    not Ready is left out; of two pods on one node (a rolling update) the newest Ready one wins.
    """
    found: dict[str, tuple[str, str]] = {}
    for pod in pod_list.get("items") or []:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        node, ip = spec.get("nodeName"), status.get("podIP")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if node not in planned or not ip or not ready or meta.get("deletionTimestamp"):
            continue
        ports = [
            p.get("containerPort")
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("name") == "rpc"
        ]
        port = ports[0] if ports else split_endpoint(planned[node])[1]
        created = str(meta.get("creationTimestamp") or "")
        if node not in found or created > found[node][0]:
            found[node] = (created, f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    return {node: endpoint for node, (_, endpoint) in found.items()}


class KubernetesDiscovery(Discovery):
    """Ready rpc-server pods listed through the API server, keyed by node name (= plan host name).

    In a pod: the service account's token, CA and namespace under ``LLMFLEET_K8S_SA_DIR``
    (default the mounted service account), the API at ``KUBERNETES_SERVICE_HOST``/``_PORT``,
    the pods chosen by the label selector ``LLMFLEET_K8S_SELECTOR``. When the API does not answer,
    the last answer stands, so that a hiccup of the API server does not look like lost workers.
    """

    SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

    def __init__(self, plan: dict, environ: Optional[dict] = None):
        import urllib.parse

        super().__init__(plan)
        env = os.environ if environ is None else environ
        self.sa_dir = env.get("LLMFLEET_K8S_SA_DIR") or self.SA_DIR
        host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
        selector = env.get("LLMFLEET_K8S_SELECTOR", "")
        if not host or not selector:
            raise SupervisorError(
                "--discovery kubernetes needs KUBERNETES_SERVICE_HOST and LLMFLEET_K8S_SELECTOR"
            )
        namespace = env.get("LLMFLEET_K8S_NAMESPACE") or self._read("namespace")
        host = f"[{host}]" if ":" in host else host
        query = urllib.parse.urlencode({"labelSelector": selector})
        self.url = f"https://{host}:{port}/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods?{query}"
        self.planned = plan_endpoints(plan)
        self.last: dict[str, str] = {}

    def _read(self, name: str) -> str:
        path = os.path.join(self.sa_dir, name)
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError as exc:
            raise SupervisorError(f"kubernetes discovery: cannot read {path}: {exc}") from exc

    def endpoints(self) -> dict[str, str]:
        import ssl
        import urllib.request

        try:
            context = ssl.create_default_context(cafile=os.path.join(self.sa_dir, "ca.crt"))
            request = urllib.request.Request(
                self.url,
                headers={"Authorization": f"Bearer {self._read('token')}", "Accept": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                self.last = pod_endpoints(json.load(response), self.planned)
        except (OSError, ValueError, SupervisorError) as exc:
            log(f"kubernetes discovery: {self.url}: {exc}; keeping the last answer {self.last}")
        return dict(self.last)


DISCOVERIES = {"static": StaticDiscovery, "kubernetes": KubernetesDiscovery}


# --------------------------------------------------------------------------- probing


def tcp_answers(endpoint: str, timeout: float) -> bool:
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _decode_addr(text: str) -> tuple[str, int]:
    """Decode ``0100007F:C350`` (or the 32-hex-digit IPv6 form) from /proc/net/tcp."""
    addr_hex, port_hex = text.split(":")
    raw = bytes.fromhex(addr_hex)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port_hex, 16)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    address = socket.inet_ntop(socket.AF_INET6, words)
    if address.startswith("::ffff:") and "." in address:
        address = address[len("::ffff:") :]
    return address, int(port_hex, 16)


def parse_proc_net_tcp(text: str) -> list[tuple[tuple[str, int], str]]:
    """Return ((remote address, remote port), state hex) for every line of /proc/net/tcp{,6}."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        rows.append((_decode_addr(fields[2]), fields[3]))
    return rows


def established_remotes(paths: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6")) -> set:
    remotes = set()
    for path in paths:
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read()
        except OSError:
            continue
        remotes.update(remote for remote, state in parse_proc_net_tcp(text) if state == TCP_ESTABLISHED)
    return remotes


def resolve(endpoint: str) -> tuple[str, int]:
    host, port = split_endpoint(endpoint)
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return host, port


# --------------------------------------------------------------------------- supervisor


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    sys.stderr.write(f"{stamp} llmfleet-supervisor: {message}\n")
    sys.stderr.flush()


def names(workers) -> str:
    return ",".join(sorted(workers)) or "-"


class Supervisor:
    def __init__(self, opts: argparse.Namespace, plan: dict):
        self.opts = opts
        self.plan = plan
        self.entries = plan_entries(plan)
        self.planned = frozenset(plan["workers"])
        self.planned_endpoints = plan_endpoints(plan)
        self.discovery = DISCOVERIES[opts.discovery](plan)
        self.child: Optional[subprocess.Popen] = None
        self.active: Optional[Entry] = None
        self.active_endpoints: dict[str, str] = {}
        self.seen_connected: set = set()
        self.history: list[frozenset[str]] = []
        self.missing_since: dict[str, float] = {}
        self.last_wait = ""
        self.last_wait_logged = 0.0
        self.stopping = False
        self.starts = 0

    # -- observation
    def answering(self, endpoints: dict[str, str]) -> frozenset[str]:
        up = set()
        busy = set(self.active.workers) if self.child is not None and self.active else set()
        remotes = (
            established_remotes(self.opts.proc_net_tcp) if busy and self.opts.watch_connections else set()
        )
        for name in sorted(self.planned):
            endpoint = endpoints.get(name)
            if endpoint is None:
                continue
            if name in busy:
                if not self.opts.watch_connections:
                    up.add(name)
                    continue
                connected = resolve(endpoint) in remotes
                if connected:
                    self.seen_connected.add(name)
                    up.add(name)
                elif name not in self.seen_connected:
                    up.add(name)  # llama-server has not connected yet: still loading
                else:
                    log(f"worker {name} ({endpoint}): llama-server's connection to it is gone")
            elif tcp_answers(endpoint, self.opts.probe_timeout):
                up.add(name)
        return frozenset(up)

    def stable(self, current: frozenset[str]) -> bool:
        self.history = ([*self.history, current])[-self.opts.stable :]
        return len(self.history) == self.opts.stable and all(s == current for s in self.history)

    def observe(self, answering: frozenset[str], now: float) -> None:
        """Remember since when each planned worker has been missing."""
        for name in self.planned:
            if name in answering:
                self.missing_since.pop(name, None)
            else:
                self.missing_since.setdefault(name, now)

    def choose(self, answering: frozenset[str], now: float) -> tuple[Optional[Entry], str]:
        """The entry to run for ``answering``, or None and why not."""
        self.observe(answering, now)
        if answering == self.planned:
            return self.entries[answering], ""
        missing = sorted(self.planned - answering)
        waited = min(now - self.missing_since[name] for name in missing)
        if waited < self.opts.grace:
            return None, (
                f"waiting for {', '.join(missing)} ({waited:.0f} s of {self.opts.grace:g} s grace "
                f"before falling back to {names(answering)})"
            )
        entry = self.entries.get(answering)
        if entry is None:
            return None, f"no placement in the plan for the answering set {names(answering)}"
        if not entry.ok:
            return None, f"refused: the plan's fallback for {names(answering)} cannot serve: {entry.reason}"
        return entry, ""

    # -- actions
    def start(self, entry: Entry, endpoints: dict[str, str]) -> None:
        args = rewrite_rpc(entry.args, self.planned_endpoints, endpoints)
        command = [self.opts.llama_server, *args, *self.opts.extra]
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        log(f"start llama-server for {names(entry.workers)} ({entry.name}): {' '.join(command)}")
        self.child = subprocess.Popen(command, env=env)
        self.active = entry
        self.active_endpoints = endpoints
        self.seen_connected = set()
        self.starts += 1
        self.write_state("running")

    def stop(self, why: str) -> None:
        if self.child is None:
            return
        log(f"stop llama-server (pid {self.child.pid}): {why}")
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            try:
                self.child.wait(self.opts.stop_timeout)
            except subprocess.TimeoutExpired:
                log(f"llama-server ignored SIGTERM for {self.opts.stop_timeout:g} s: SIGKILL")
                self.child.kill()
                self.child.wait()
        log(f"llama-server stopped (exit {self.child.returncode})")
        self.child = None
        self.active = None
        self.write_state("stopped")

    def write_state(self, status: str, reason: str = "") -> None:
        if not self.opts.state_file:
            return
        state = {
            "status": status,
            "workers": sorted(self.active.workers) if self.active else [],
            "entry": self.active.name if self.active else None,
            "pid": self.child.pid if self.child else None,
            "starts": self.starts,
            "reason": reason,
            "time": time.time(),
        }
        tmp = f"{self.opts.state_file}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(state, handle)
            os.replace(tmp, self.opts.state_file)
        except OSError as exc:
            log(f"cannot write the state file {self.opts.state_file}: {exc}")

    def step(self, now: float) -> None:
        if self.child is not None and self.child.poll() is not None:
            log(f"llama-server exited with {self.child.returncode} (serving {names(self.active.workers)})")
            self.child = None
            self.active = None
            self.history = []
            self.write_state("exited")
        endpoints = self.discovery.endpoints()
        answering = self.answering(endpoints)
        self.observe(answering, now)
        if not self.stable(answering):
            return
        if self.child is not None and self.active is not None:
            if answering == self.active.workers:
                return
            entry, why = self.choose(answering, now)
            if entry is None or entry.workers == self.active.workers:
                self.wait_log(f"serving {names(self.active.workers)}; answering {names(answering)}: {why}")
                if answering < self.active.workers:
                    self.stop(f"worker(s) {names(self.active.workers - answering)} stopped answering")
                return
            self.stop(f"the answering set changed to {names(answering)}")
            self.history = [answering] * self.opts.stable
        entry, why = self.choose(answering, now)
        if entry is None:
            self.wait_log(why)
            return
        self.last_wait = ""
        self.start(entry, endpoints)

    def wait_log(self, why: str) -> None:
        """Log why nothing starts: when the reason changes, else at most every 10 s."""
        key = re.sub(r"\d+ s of", "", why)
        now = time.monotonic()
        if key != self.last_wait or now - self.last_wait_logged >= 10:
            log(why)
            self.last_wait = key
            self.last_wait_logged = now
            self.write_state("waiting", why)

    def run(self) -> int:
        def on_signal(signum, _frame):
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log(
            f"version {VERSION}; planned workers {names(self.planned)}; "
            f"{len(self.entries)} placements; discovery {self.opts.discovery}"
        )
        while not self.stopping:
            self.step(time.monotonic())
            deadline = time.monotonic() + self.opts.interval
            while not self.stopping and time.monotonic() < deadline:
                if self.child is not None and self.child.poll() is not None:
                    break
                time.sleep(min(0.1, self.opts.interval))
        self.stop("the supervisor was asked to stop")
        return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="the plan JSON (llmfleet_plan)")
    parser.add_argument("--llama-server", required=True, help="path of the llama-server binary")
    parser.add_argument("--discovery", default="static", choices=sorted(DISCOVERIES))
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between probes")
    parser.add_argument("--stable", type=int, default=2, help="equal probes in a row before acting")
    parser.add_argument(
        "--grace", type=float, default=30.0, help="seconds a worker may be gone before a fallback"
    )
    parser.add_argument("--probe-timeout", type=float, default=1.0)
    parser.add_argument("--stop-timeout", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument("--state-file", default="", help="JSON file describing what runs now")
    parser.add_argument(
        "--no-watch-connections",
        dest="watch_connections",
        action="store_false",
        help="do not read /proc/net/tcp to notice a lost worker while llama-server runs",
    )
    parser.add_argument("--proc-net-tcp", nargs="*", default=["/proc/net/tcp", "/proc/net/tcp6"])
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then arguments added for llama-server")
    opts = parser.parse_args(argv)
    if opts.extra and opts.extra[0] == "--":
        opts.extra = opts.extra[1:]
    if opts.stable < 1:
        parser.error("--stable must be at least 1")
    return opts


def main(argv: Optional[Sequence[str]] = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = load_plan(opts.plan)
        supervisor = Supervisor(opts, plan)
    except SupervisorError as exc:
        log(f"error: {exc}")
        return 2
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())

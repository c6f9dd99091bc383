#!/usr/bin/env python
"""llmfleet supervisor: run llama-server on the head for the workers that answer.

One stdlib-only file, shipped by the systemd target of ``llmfleet.cluster.llama_rpc`` and
(in a ConfigMap) by its Kubernetes target. It does no split math: the plan written on the
controller (``llmfleet_plan``) carries a complete placement for the planned workers and a
fallback for every subset of them. The supervisor

1. finds the planned workers' endpoints (``--discovery``: ``static`` reads them from the
   plan; ``kubernetes`` lists the Ready rpc-server pods through the API server and keys them
   by node name; another target registers its ``Discovery`` class in ``DISCOVERIES``),
2. probes them at the RPC level (ggml-rpc ``HELLO``, answered within ``--probe-timeout``
   seconds, a deadline for connect, send and answer together; a worker that accepts TCP and
   says nothing is down, and every change of a worker's state is logged by its name) until
   the answering set is stable (``--stable`` equal probes in a row),
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
whose connection from this network namespace was established and no longer is has gone. That
watch starts only once llama-server answers ``GET /health`` with 200 (``--health-url``, by
default from the ``--host`` and ``--port`` after ``--``): while it loads, llama-server opens a
first connection to each worker (the device query), closes it and opens the one it keeps later,
so a connection seen and gone before the model is loaded says nothing about the worker. A worker
lost silently is seen through TCP keepalive set on llama-server's connections; before it is probed
again, the worker's side of the lost connection is reset from that connection's own local address
(``knock``), since rpc-server would otherwise wait on it for ever.

The plan is validated once, at start: a plan the supervisor cannot use (not JSON, a fallback
that is not an object, an endpoint that is a number or ``host:notaport``, a fallback naming a
worker the plan does not have, ...) is one line on stderr naming the plan, the entry and the
value, and exit status 78 (``EX_CONFIG``), which the systemd unit lists in
``RestartPreventExitStatus`` so that a bad plan is not restarted in a loop.
"""

from __future__ import annotations

import argparse
import errno
import http.client
import ipaddress
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import NamedTuple, Optional

VERSION = "2"
TCP_ESTABLISHED = "01"
# Exit status for a plan or setting that cannot work (sysexits.h EX_CONFIG); the systemd unit
# does not restart on it (RestartPreventExitStatus=78).
EXIT_BAD_PLAN = 78
# ggml-rpc (llama.cpp ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7): a request is
# | command (1 byte) | size (u64 LE) | data |, an answer | size (u64 LE) | data |; the first
# command of a connection is HELLO (14) with the client's 24 bytes of transport capabilities
# (all zero: plain TCP), answered by | major | minor | patch | pad | 24 bytes of capabilities |.
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
HELLO_REQUEST = bytes([RPC_CMD_HELLO]) + struct.pack("<Q", RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE)
HELLO_ANSWER_SIZE = 4 + RPC_CONN_CAPS_SIZE
# The protocol of the pinned llama.cpp build (ggml/include/ggml-rpc.h, RPC_PROTO_*_VERSION; a test
# reads the pinned source). Its llama-server refuses a server whose major differs or whose minor is
# newer (negotiate_hello in ggml-rpc.cpp), so only such a server counts as a live worker.
RPC_PROTO_VERSION = (7, 0, 0)


# A worker that dies silently (power cut, cable) leaves llama-server's idle connection to it
# ESTABLISHED: nothing is sent between requests, so the kernel never learns, and the next request
# hangs until TCP gives up (about 15 minutes). llama.cpp sets no keepalive on these connections; the
# supervisor (llama-server's parent, the same user) takes a copy of each with pidfd_getfd(2)
# (Linux >= 5.6) and sets TCP keepalive and TCP_USER_TIMEOUT on it: the kernel then resets a
# connection whose peer stops answering within about KEEPALIVE_IDLE + KEEPALIVE_INTERVAL *
# KEEPALIVE_COUNT seconds idle, USER_TIMEOUT_MS under a request, and the connection watch sees it
# gone. Where the copy is refused (a seccomp profile without pidfd_getfd), a connection whose data
# has gone unacknowledged for RETRANSMIT_LIMIT retransmissions (about 6 s) counts as gone instead.
KEEPALIVE_IDLE = 5
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3
USER_TIMEOUT_MS = 10000
RETRANSMIT_LIMIT = 5
SYS_PIDFD_GETFD = 438  # the same number on every architecture (a syscall added after 424)
# The other side of such a loss: rpc-server serves one client at a time and sets no keepalive, so
# when the head's side is reset while the worker cannot be reached (its RST lost with the rest),
# the worker's side stays ESTABLISHED and rpc-server waits on it for ever, accepting no one else:
# once the partition heals the worker would never serve again. The supervisor remembers the local
# address of every connection llama-server had to a worker when it lost it (or stopped
# llama-server), and before it next probes that worker it connects from that same address and port
# (RFC 793's half-open recovery: the worker answers the SYN on its stale connection with an ACK, the
# head's kernel answers that ACK with a RST in the stale connection's window, and rpc-server is
# free; the SYN sent again 1 s later reaches its listener). KNOCK_TIMEOUT covers that resend.
KNOCK_TIMEOUT = 2.5
KNOCK_KEEP = 8  # lost local addresses remembered per worker, the newest


class SupervisorError(Exception):
    """A plan or an option the supervisor cannot work with."""


class PlanError(SupervisorError):
    """The plan itself is unusable; the message names the plan, the entry and the value."""


# --------------------------------------------------------------------------- validation


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def check_endpoint(endpoint: object, where: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) with a port from 1 to 65535, else PlanError naming ``where``."""
    if not isinstance(endpoint, str):
        raise PlanError(f"{where}: endpoint {endpoint!r} is a {_kind(endpoint)}, not a 'host:port' string")
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host:
        raise PlanError(f"{where}: endpoint {endpoint!r} is not host:port")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise PlanError(f"{where}: endpoint {endpoint!r}: the port {port!r} is not a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise PlanError(f"{where}: endpoint {endpoint!r}: {host} is not an IPv6 address") from None
        host = host[1:-1]
    elif ":" in host or not host.isascii() or any(c.isspace() or c in ",/[]@" for c in host):
        raise PlanError(f"{where}: endpoint {endpoint!r}: {host!r} is not a host name or address")
    return host, int(port)


def _str_list(value: object, where: str, allow_empty: bool = True) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{where} must be a list of strings, got {_kind(value)} {value!r:.80}")
    if not allow_empty and not value:
        raise PlanError(f"{where} is empty")
    return value


def _check_args(args: list[str], where: str) -> None:
    for i, arg in enumerate(args[:-1]):
        if arg == "--rpc":
            for endpoint in args[i + 1].split(","):
                check_endpoint(endpoint, f"{where} --rpc")


def _check_hosts(hosts: object, where: str) -> None:
    if hosts is None:
        return
    if not isinstance(hosts, list):
        raise PlanError(f"{where}.hosts must be a list, got {_kind(hosts)}")
    for i, host in enumerate(hosts):
        if not isinstance(host, dict):
            raise PlanError(f"{where}.hosts[{i}] is a {_kind(host)}, not an object: {host!r:.80}")
        name = host.get("name")
        if not isinstance(name, str) or not name:
            raise PlanError(f"{where}.hosts[{i}]: the name {name!r} is not a non-empty string")
        if host.get("role") == "worker" and host.get("endpoint") is not None:
            check_endpoint(host["endpoint"], f"{where}: worker {name}")


def validate_plan(plan: object, path: str) -> dict:
    """Check everything the supervisor reads from the plan, once; PlanError on the first problem."""
    where = f"plan {path}"
    if not isinstance(plan, dict):
        raise PlanError(f"{where}: not an llmfleet plan (a {_kind(plan)}, not an object)")
    if not isinstance(plan.get("workers"), list):
        raise PlanError(f"{where}: not an llmfleet plan (no list 'workers')")
    workers = _str_list(plan["workers"], f"{where}: workers")
    if any(not name for name in workers) or len(set(workers)) != len(workers):
        raise PlanError(f"{where}: workers {workers!r} has an empty or a repeated name")
    if not isinstance(plan.get("llama_server_args"), list):
        raise PlanError(f"{where}: the plan has no list 'llama_server_args'")
    _check_args(_str_list(plan["llama_server_args"], f"{where}: llama_server_args"), where)
    _check_hosts(plan.get("hosts"), where)
    fallbacks = plan.get("fallbacks")
    if fallbacks is not None and not isinstance(fallbacks, list):
        raise PlanError(f"{where}: fallbacks must be a list, got {_kind(fallbacks)}")
    for index, fallback in enumerate(fallbacks or []):
        name = f"{where}: fallback[{index}]"
        if not isinstance(fallback, dict):
            raise PlanError(f"{name} is a {_kind(fallback)}, not an object: {fallback!r:.80}")
        used = _str_list(fallback.get("workers") or [], f"{name}.workers")
        unknown = sorted(set(used) - set(workers))
        if unknown:
            raise PlanError(f"{name} names worker(s) {', '.join(unknown)} that the plan does not have")
        if not isinstance(fallback.get("ok", False), bool):
            raise PlanError(f"{name}.ok must be true or false, got {fallback.get('ok')!r}")
        args = _str_list(fallback.get("llama_server_args") or [], f"{name}.llama_server_args")
        if fallback.get("ok") and not args:
            raise PlanError(f"{name} for {sorted(used)} is ok but has no llama_server_args")
        _check_args(args, name)
        if not isinstance(fallback.get("reason") or "", str):
            raise PlanError(f"{name}.reason must be a string, got {_kind(fallback.get('reason'))}")
        _check_hosts(fallback.get("hosts"), name)
    try:
        plan_endpoints(plan)
    except SupervisorError as exc:
        raise PlanError(f"{where}: {exc}") from None
    return plan


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
        raise PlanError(f"cannot read the plan {path}: {exc}") from exc
    return validate_plan(plan, path)


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


def owned_by(meta: dict, owners: frozenset) -> bool:
    """Whether the pod's controller is one of the DaemonSets ``owners`` (apps/v1, by name).

    Labels are anyone's to set (a pod made by hand with the right labels is not an rpc-server of
    the fleet); the controller reference is set by the DaemonSet controller."""
    for ref in meta.get("ownerReferences") or []:
        if (
            isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("kind") == "DaemonSet"
            and ref.get("apiVersion") == "apps/v1"
            and ref.get("name") in owners
        ):
            return True
    return False


def pod_endpoints(
    pod_list: dict, planned: dict[str, str], owners: Optional[frozenset] = None
) -> dict[str, str]:
    """Node name -> ``podIP:port`` of the Ready pods of a PodList on the planned workers' nodes.

    The port is the pod's container port named ``rpc`` (else the plan's); a pod being deleted or
    not Ready is left out, and so is one whose controller is not one of the DaemonSets ``owners``
    (when given); of two pods on one node (a rolling update) the newest Ready one wins.
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
        if owners is not None and not owned_by(meta, owners):
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
    return {node: endpoint for node, (_unused, endpoint) in found.items()}


class KubernetesDiscovery(Discovery):
    """Ready rpc-server pods listed through the API server, keyed by node name (= plan host name).

    In a pod: the service account's token, CA and namespace under ``LLMFLEET_K8S_SA_DIR``
    (default the mounted service account), the API at ``KUBERNETES_SERVICE_HOST``/``_PORT``,
    the pods chosen by the label selector ``LLMFLEET_K8S_SELECTOR`` whose controller is one of the
    DaemonSets named in ``LLMFLEET_K8S_OWNERS`` (comma-separated). When the API does not answer,
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
        # The DaemonSets whose pods are the fleet's rpc-servers (comma-separated names).
        self.owners = frozenset(n.strip() for n in env.get("LLMFLEET_K8S_OWNERS", "").split(",") if n.strip())
        if not host or not selector or not self.owners:
            raise SupervisorError(
                "--discovery kubernetes needs KUBERNETES_SERVICE_HOST, LLMFLEET_K8S_SELECTOR and "
                "LLMFLEET_K8S_OWNERS (the rpc-server DaemonSets)"
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
                self.last = pod_endpoints(json.load(response), self.planned, self.owners)
        except (OSError, ValueError, SupervisorError) as exc:
            log(f"kubernetes discovery: {self.url}: {exc}; keeping the last answer {self.last}")
        return dict(self.last)


DISCOVERIES = {"static": StaticDiscovery, "kubernetes": KubernetesDiscovery}


# --------------------------------------------------------------------------- probing


def _recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline passed")
        sock.settimeout(left)
        piece = sock.recv(size - len(data))
        if not piece:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += piece
    return data


def hello_version_ok(major: int, minor: int, patch: int) -> tuple[bool, str]:
    """Whether llama-server of the pinned build accepts a server of this protocol version."""
    want_major, want_minor, _unused = RPC_PROTO_VERSION
    if major == want_major and minor <= want_minor:
        return True, f"rpc-server protocol {major}.{minor}.{patch}"
    return False, (
        f"rpc-server protocol {major}.{minor}.{patch}: the pinned llama-server speaks "
        f"{want_major}.{want_minor}.x (it refuses another major or a newer minor)"
    )


def rpc_hello(endpoint: str, timeout: float) -> tuple[bool, str]:
    """Ask the worker for its ggml-rpc HELLO within ``timeout`` seconds in all: (up, what happened)."""
    deadline = time.monotonic() + timeout
    host, port = split_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        return False, f"no TCP connection within {timeout:g} s"
    except OSError as exc:
        return False, f"no TCP connection: {exc.strerror or exc}"
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(HELLO_REQUEST)
        size = struct.unpack("<Q", _recv_exact(sock, 8, deadline))[0]
        if size != HELLO_ANSWER_SIZE:
            return False, (
                f"answered HELLO with a {size}-byte message, not the {HELLO_ANSWER_SIZE} bytes of "
                f"ggml-rpc protocol {RPC_PROTO_VERSION[0]}: not a ggml rpc-server of the pinned build"
            )
        answer = _recv_exact(sock, size, deadline)
        return hello_version_ok(answer[0], answer[1], answer[2])
    except socket.timeout:
        return False, (
            f"accepts TCP but gave no HELLO answer within {timeout:g} s "
            "(not an rpc-server, hung, or busy with another client)"
        )
    except (EOFError, ConnectionResetError) as exc:
        return False, f"closed the connection instead of answering HELLO ({exc}; another protocol version?)"
    except OSError as exc:
        return False, f"HELLO failed: {exc.strerror or exc}"
    finally:
        sock.close()


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


class TcpConnection(NamedTuple):
    local: tuple[str, int]
    remote: tuple[str, int]
    inode: int
    retransmits: int  # of the oldest unacknowledged segment


def tcp_connections(paths: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6")) -> list[TcpConnection]:
    """Every ESTABLISHED connection in /proc/net/tcp{,6}."""
    rows = []
    for path in paths:
        try:
            with open(path, encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != TCP_ESTABLISHED:
                continue
            try:
                inode = int(fields[9]) if len(fields) > 9 else 0
                retransmits = int(fields[6], 16) if len(fields) > 6 else 0
                rows.append(
                    TcpConnection(_decode_addr(fields[1]), _decode_addr(fields[2]), inode, retransmits)
                )
            except ValueError:
                continue
    return rows


def socket_fds(pid: int) -> dict[int, int]:
    """Socket inode -> file descriptor number of the sockets process ``pid`` holds."""
    found = {}
    base = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(base)
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            found[int(target[8:-1])] = int(fd)
    return found


def set_keepalive(pid: int, fds: Sequence[int]) -> str:
    """Turn on TCP keepalive and TCP_USER_TIMEOUT on sockets ``fds`` of process ``pid`` (its child):
    "" when done, else why not (the errno of pidfd_open or pidfd_getfd)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError) as exc:
        return f"pidfd_open: {exc}"
    try:
        for fd in fds:
            copy = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
            if copy < 0:
                return f"pidfd_getfd: {os.strerror(ctypes.get_errno())}"
            with socket.socket(fileno=copy) as sock:  # closes the copy only
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    except OSError as exc:
        return f"setsockopt: {exc}"
    finally:
        os.close(pidfd)
    return ""


def knock(local: tuple[str, int], remote: tuple[str, int], timeout: float) -> tuple[str, str]:
    """Connect to ``remote`` from ``local`` (the address and port of a connection that was lost),
    which resets the peer's side of that connection if it still holds it (RFC 793, half-open
    connection discovery): (outcome, what happened). Outcomes: "answered" (the peer answered: its
    side is gone now), "silent" (no answer within ``timeout``: the peer is still out of reach),
    "held" (the port is still held on this host, the old connection closing: try again later),
    "moot" (the address is no longer this host's, or the old connection closed normally and waits
    here in TIME_WAIT: nothing to reset)."""
    family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(local)
        sock.settimeout(timeout)
        sock.connect(remote)
        return "answered", "connected"
    except socket.timeout:
        return "silent", f"no answer within {timeout:g} s"
    except (ConnectionRefusedError, ConnectionResetError) as exc:
        return "answered", exc.strerror or str(exc)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return "held", exc.strerror or str(exc)
        if exc.errno == errno.EADDRNOTAVAIL:
            return "moot", exc.strerror or str(exc)
        return "silent", exc.strerror or str(exc)
    finally:
        sock.close()


def resolve(endpoint: str) -> tuple[str, int]:
    host, port = split_endpoint(endpoint)
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return host, port


# --------------------------------------------------------------------------- supervisor


HEALTH_READ_LIMIT = 4096


def health_url(extra: Sequence[str]) -> str:
    """llama-server's ``/health`` URL from its arguments (``--host``, ``--port``; its defaults)."""
    host, port = "127.0.0.1", "8080"
    for i, arg in enumerate(extra):
        value = extra[i + 1] if i + 1 < len(extra) else None
        if arg.startswith("--host="):
            host = arg.split("=", 1)[1]
        elif arg.startswith("--port="):
            port = arg.split("=", 1)[1]
        elif arg == "--host" and value is not None:
            host = value
        elif arg == "--port" and value is not None:
            port = value
    if host.endswith(".sock"):
        return ""  # a UNIX socket: no TCP health check (the connection watch never arms)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/health"


def server_healthy(url: str, timeout: float) -> tuple[bool, str]:
    """Whether llama-server answers ``url`` with 200 (loaded), and what it answered."""
    if not url:
        return False, "no health URL"
    parsed = urllib.parse.urlsplit(url)
    try:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port or 80, timeout=timeout)
        try:
            conn.request("GET", parsed.path or "/health")
            answer = conn.getresponse()
            answer.read(HEALTH_READ_LIMIT)
            return answer.status == 200, f"HTTP {answer.status}"
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


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
        self.armed: set = set()
        # worker -> local addresses of llama-server's connections to it: now, and lost (to knock from)
        self.locals: dict[str, set] = {}
        self.lost: dict[str, list] = {}
        self.reported_gone: set = set()
        self.healthy = False
        self.health_url = opts.health_url if opts.health_url is not None else health_url(opts.extra)
        self.history: list[frozenset[str]] = []
        self.missing_since: dict[str, float] = {}
        self.last_wait = ""
        self.last_wait_logged = 0.0
        self.stopping = False
        self.starts = 0
        self.worker_state: dict[str, str] = {}

    # -- observation
    def answering(self, endpoints: dict[str, str]) -> frozenset[str]:
        up = set()
        busy = set(self.active.workers) if self.child is not None and self.active else set()
        connections = tcp_connections(self.opts.proc_net_tcp) if busy and self.opts.watch_connections else []
        remotes = {c.remote for c in connections}
        stalled = {c.remote for c in connections if c.retransmits >= RETRANSMIT_LIMIT}
        if remotes and not self.healthy:
            self.healthy, detail = server_healthy(self.health_url, self.opts.probe_timeout)
            if self.healthy:
                log(
                    f"llama-server is healthy ({self.health_url}, {detail}): watching its "
                    f"connections to {names(busy)}"
                )
        for name in sorted(self.planned):
            endpoint = endpoints.get(name)
            if endpoint is None:
                continue
            if name in busy:
                if not self.opts.watch_connections:
                    up.add(name)
                    continue
                remote = resolve(endpoint)
                connected = remote in remotes
                if connected and remote in stalled and name in self.seen_connected:
                    log(
                        f"worker {name} ({endpoint}): llama-server's connection to it stalls "
                        f"({RETRANSMIT_LIMIT} or more retransmissions unanswered)"
                    )
                elif connected:
                    if self.healthy:
                        self.seen_connected.add(name)
                        self.locals[name] = {c.local for c in connections if c.remote == remote}
                        self.keepalive(name, endpoint, remote, connections)
                    up.add(name)
                elif name not in self.seen_connected:
                    # Not loaded yet, or not yet seen connected since: the device query's
                    # connection comes and goes before the one llama-server keeps.
                    up.add(name)
                elif name not in self.reported_gone:
                    self.reported_gone.add(name)
                    self.worker_state[name] = "gone"  # its return is logged
                    self.forget_connections([name])
                    log(f"worker {name} ({endpoint}): llama-server's connection to it is gone")
            else:
                if self.lost.get(name) and not self.knock_lost(name, endpoint):
                    continue
                ok, detail = rpc_hello(endpoint, self.opts.probe_timeout)
                self.note_worker(name, endpoint, ok, detail)
                if ok:
                    self.lost.pop(name, None)  # its rpc-server accepted this probe: nothing holds it
                    up.add(name)
        return frozenset(up)

    def keepalive(self, name: str, endpoint: str, remote: tuple[str, int], connections: list) -> None:
        """Set keepalive on llama-server's connections to ``remote`` not done yet (logged once each)."""
        if not self.opts.keepalive or self.child is None:
            return
        fds = socket_fds(self.child.pid)
        todo = [c.inode for c in connections if c.remote == remote and c.inode in fds]
        todo = [inode for inode in todo if inode not in self.armed]
        if not todo:
            return
        self.armed.update(todo)
        error = set_keepalive(self.child.pid, [fds[inode] for inode in todo])
        if error:
            log(
                f"worker {name} ({endpoint}): cannot set TCP keepalive on llama-server's connection "
                f"({error}); a silent loss is seen only once a request stalls"
            )
        else:
            bound = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT
            log(
                f"worker {name} ({endpoint}): TCP keepalive on llama-server's connection: a silent "
                f"loss resets it within about {bound} s idle, {USER_TIMEOUT_MS // 1000} s under a request"
            )

    def forget_connections(self, workers) -> None:
        """llama-server's connections to ``workers`` are gone (or going): remember their local
        addresses, to reset the workers' sides of them before the workers are probed again."""
        for name in workers:
            gone = self.locals.pop(name, set())
            if gone:
                kept = [local for local in self.lost.get(name, []) if local not in gone]
                self.lost[name] = (kept + sorted(gone))[-KNOCK_KEEP:]

    def knock_lost(self, name: str, endpoint: str) -> bool:
        """Reset the worker's side of llama-server's lost connections to it (``knock``); False when
        the worker does not answer yet (it is down: no HELLO is tried)."""
        remote = resolve(endpoint)
        for local in list(self.lost.get(name, [])):
            outcome, detail = knock(local, remote, KNOCK_TIMEOUT)
            if outcome == "silent":
                self.note_worker(name, endpoint, False, f"no TCP answer ({detail})")
                return False
            if outcome == "held":
                continue
            self.lost[name].remove(local)
            if outcome == "answered" and detail == "connected":
                log(
                    f"worker {name} ({endpoint}): connected from the address of llama-server's lost "
                    f"connection ({local[0]}:{local[1]}), which frees rpc-server if it still held that connection"
                )
        if not self.lost.get(name):
            self.lost.pop(name, None)
        return True

    def note_worker(self, name: str, endpoint: str, ok: bool, detail: str) -> None:
        """Log a worker's probe result by name whenever it changes (up, or why it is down)."""
        state = "up" if ok else detail
        if self.worker_state.get(name) != state:
            self.worker_state[name] = state
            log(f"worker {name} ({endpoint}): {'up, ' + detail if ok else 'down: ' + detail}")

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
        self.armed = set()
        self.locals = {}
        self.reported_gone = set()
        self.healthy = False
        self.starts += 1
        self.write_state("running")

    def stop(self, why: str) -> None:
        if self.child is None:
            return
        log(f"stop llama-server (pid {self.child.pid}): {why}")
        self.forget_connections(list(self.locals))
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
            self.forget_connections(list(self.locals))
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
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=3.0,
        help="seconds for a worker's HELLO: connect, send and answer together",
    )
    parser.add_argument("--stop-timeout", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument("--state-file", default="", help="JSON file describing what runs now")
    parser.add_argument(
        "--no-watch-connections",
        dest="watch_connections",
        action="store_false",
        help="do not read /proc/net/tcp to notice a lost worker while llama-server runs",
    )
    parser.add_argument(
        "--health-url",
        default=None,
        help="llama-server's health URL; the connection watch starts once it answers 200 "
        "(default: from --host and --port after --)",
    )
    parser.add_argument(
        "--no-keepalive",
        dest="keepalive",
        action="store_false",
        help="do not set TCP keepalive on llama-server's connections to the workers (pidfd_getfd)",
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
        log(f"error: {exc}; not starting (exit {EXIT_BAD_PLAN}: fix the plan or the options, then restart)")
        return EXIT_BAD_PLAN
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""llmfleet fetch: the init containers of the Kubernetes target of llmfleet.cluster.llama_rpc.

Stdlib only; shipped in the ConfigMap next to ``llmfleet_artifacts.py``, which is the collection's
``plugins/module_utils/artifacts.py`` itself (the systemd target's download and unpacking code):
one download bound and one archive policy for both targets. Fails closed: nothing is used before
its sha256 matches the pin.

    llmfleet_fetch.py tarball --url URL --sha256 HEX --dest DIR [--reserve-mib N]
        download a llama.cpp release tarball (cut at the free space less the reserve), verify it,
        unpack it (its one top folder stripped; every member checked first by the same
        ``plan_members`` as on systemd hosts) into DIR/<sha256[:16]>/, add the link
        llmfleet-rpc-server to ggml-rpc-server (or the older rpc-server), and switch DIR/current
        to it last. Kept when already there.
    llmfleet_fetch.py file --url URL --sha256 HEX --dest PATH [--size BYTES] [--reserve-mib N]
        download one file (a model) to PATH (resumable, cut at BYTES when known and at the free
        space less the reserve), verify it and record the verified hash, size and modification
        time in PATH.sha256; a file whose record still matches is kept without hashing it again.
    llmfleet_fetch.py own --path DIR --uid N [--gid N]
        create DIR and give it to N (a hostPath cache the unprivileged container writes).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.request
from collections.abc import Sequence
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import llmfleet_artifacts as artifacts  # plugins/module_utils/artifacts.py, beside this file

WORKER_LINK = "llmfleet-rpc-server"
DEFAULT_RESERVE_MIB = 256


class FetchError(Exception):
    """A download or a check that failed; the message names the URL, file and hashes."""


def log(message: str) -> None:
    sys.stderr.write(f"llmfleet-fetch: {message}\n")
    sys.stderr.flush()


def check_pin(sha256: str) -> str:
    try:
        return artifacts.normalize_sha256(sha256, "the pinned sha256")
    except artifacts.ArtifactError as exc:
        raise FetchError(f"{exc} (not 64 hex digits)") from None


def opener(timeout: float) -> artifacts.Opener:
    def open_fn(url: str, headers: dict, timeout: float) -> object:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)

    return artifacts.make_opener(open_fn, timeout=timeout)


def _link_worker(build: str) -> None:
    """``llmfleet-rpc-server`` -> the worker binary of this release (made once, kept after)."""
    link = os.path.join(build, WORKER_LINK)
    if os.path.lexists(link):
        return
    name = artifacts.find_binary(build, artifacts.WORKER_BINARIES)
    if name is None:
        raise FetchError(f"{build}: no {' or '.join(artifacts.WORKER_BINARIES)} in it")
    os.symlink(name, link)


def fetch_tarball(url: str, sha256: str, dest: str, timeout: float, reserve_mib: float) -> str:
    pin = check_pin(sha256)
    build = os.path.join(dest, pin[:16])
    current = os.path.join(dest, "current")
    marker = artifacts.read_marker(build)
    if marker is not None and marker.get("sha256") == pin:
        log(f"{build}: llama.cpp {pin} already unpacked")
    else:
        os.makedirs(dest, exist_ok=True)
        tarball = os.path.join(dest, f".{pin[:16]}.archive")
        try:
            artifacts.fetch(opener(timeout), url, tarball, pin, reserve_mib=reserve_mib)
            log(f"{url}: sha256 {pin} verified")
            artifacts.install(
                build,
                pin,
                archive=tarball,
                info={"url": url},
                require_one_of=list(artifacts.WORKER_BINARIES),
                require=["llama-server"],
            )
        finally:
            for leftover in (tarball, tarball + ".part"):
                if os.path.lexists(leftover):
                    os.unlink(leftover)
        log(f"{build}: unpacked")
    _link_worker(build)
    _switch(current, os.path.basename(build))
    log(f"{current} -> {os.path.basename(build)}")
    return build


def _switch(link: str, target: str) -> None:
    tmp = f"{link}.new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _record(dest: str) -> str:
    """What the marker keeps beside the hash: size and modification time (an overwritten file
    no longer matches them, so it is hashed again)."""
    st = os.stat(dest)
    return f"{st.st_size} {st.st_mtime_ns}"


def fetch_file(
    url: str, sha256: str, dest: str, timeout: float, size: Optional[int], reserve_mib: float
) -> str:
    pin = check_pin(sha256)
    marker = f"{dest}.sha256"
    if os.path.isfile(dest) and os.path.isfile(marker):
        with open(marker, encoding="ascii") as handle:
            fields = handle.read().split()
        if fields[:1] == [pin] and " ".join(fields[2:4]) == _record(dest):
            log(f"{dest}: sha256 {pin} verified before, kept")
            return dest
    existed = os.path.isfile(dest)
    result = artifacts.fetch(opener(timeout), url, dest, pin, reserve_mib=reserve_mib, size=size)
    if existed and result["changed"]:
        log(f"{dest}: not the pinned file: downloaded again")
    with open(marker, "w", encoding="ascii") as handle:
        handle.write(f"{pin}  {os.path.basename(dest)}  {_record(dest)}\n")
    log(f"{url}: sha256 {pin} verified; {dest}")
    return dest


def own(path: str, uid: int, gid: int) -> None:
    os.makedirs(path, mode=0o750, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, 0o750)
    log(f"{path}: owned by {uid}:{gid}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tarball", "file"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--url", required=True)
        cmd.add_argument("--sha256", required=True)
        cmd.add_argument("--dest", required=True)
        cmd.add_argument("--timeout", type=float, default=60.0)
        cmd.add_argument("--reserve-mib", type=float, default=DEFAULT_RESERVE_MIB)
        if name == "file":
            cmd.add_argument("--size", type=int, default=0, help="bytes of the pinned file (0: unknown)")
    cmd = sub.add_parser("own")
    cmd.add_argument("--path", required=True)
    cmd.add_argument("--uid", type=int, required=True)
    cmd.add_argument("--gid", type=int, default=-1)
    opts = parser.parse_args(argv)
    try:
        if opts.command == "tarball":
            fetch_tarball(opts.url, opts.sha256, opts.dest, opts.timeout, opts.reserve_mib)
        elif opts.command == "file":
            size = opts.size if opts.size > 0 else None
            fetch_file(opts.url, opts.sha256, opts.dest, opts.timeout, size, opts.reserve_mib)
        else:
            own(opts.path, opts.uid, opts.gid if opts.gid >= 0 else opts.uid)
    except (FetchError, artifacts.ArtifactError, OSError) as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

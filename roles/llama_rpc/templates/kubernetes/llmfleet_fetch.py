#!/usr/bin/env python
"""llmfleet fetch: the init containers of the Kubernetes target of llmfleet.cluster.llama_rpc.

Stdlib only; shipped in the ConfigMap next to the supervisor. Fails closed: nothing is used
before its sha256 matches the pin.

    llmfleet_fetch.py tarball --url URL --sha256 HEX --dest DIR
        download a llama.cpp release tarball, verify it, unpack it (its one top folder stripped)
        into DIR/<sha256[:16]>/, add the link llmfleet-rpc-server to ggml-rpc-server (or the
        older rpc-server), and switch DIR/current to it last. Kept when already there.
    llmfleet_fetch.py file --url URL --sha256 HEX --dest PATH
        download one file (a model) to PATH, verify it and record the verified hash in
        PATH.sha256; a file whose recorded hash is the pin is kept.
    llmfleet_fetch.py own --path DIR --uid N [--gid N]
        create DIR and give it to N (a hostPath cache the unprivileged container writes).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Sequence
from typing import Optional

CHUNK = 1024 * 1024
WORKER_NAMES = ("ggml-rpc-server", "rpc-server")
WORKER_LINK = "llmfleet-rpc-server"


class FetchError(Exception):
    """A download or a check that failed; the message names the URL, file and hashes."""


def log(message: str) -> None:
    sys.stderr.write(f"llmfleet-fetch: {message}\n")
    sys.stderr.flush()


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def check_pin(sha256: str) -> str:
    pin = sha256.strip().lower()
    if len(pin) != 64 or any(c not in "0123456789abcdef" for c in pin):
        raise FetchError(f"the pinned sha256 {sha256!r} is not 64 hex digits")
    return pin


def download(url: str, dest: str, pin: str, timeout: float) -> None:
    """Download ``url`` to ``dest`` (through a temporary file) and verify it against ``pin``."""
    directory = os.path.dirname(os.path.abspath(dest))
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=".fetch-", dir=directory)
    digest = hashlib.sha256()
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            for block in iter(lambda: response.read(CHUNK), b""):
                digest.update(block)
                out.write(block)
        actual = digest.hexdigest()
        if actual != pin:
            raise FetchError(f"{url}: sha256 {actual} does not match the pinned {pin}; nothing was used")
        os.replace(tmp, dest)
    except OSError as exc:
        raise FetchError(f"{url}: download failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _members(archive: tarfile.TarFile, target: str) -> list:
    """The archive's members with its one top folder stripped; refuses paths leaving ``target``."""
    members = archive.getmembers()
    tops = {m.name.split("/", 1)[0] for m in members if m.name not in ("", ".")}
    strip = len(tops) == 1 and any("/" in m.name for m in members)
    kept = []
    root = os.path.realpath(target)
    for member in members:
        name = member.name.split("/", 1)[1] if strip and "/" in member.name else member.name
        if strip and "/" not in member.name:
            continue
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise FetchError(f"refusing the archive member {member.name!r}")
        if member.issym() or member.islnk():
            link = os.path.normpath(os.path.join(os.path.dirname(name), member.linkname))
            if os.path.isabs(member.linkname) or link.startswith(".."):
                raise FetchError(f"refusing the link {member.name!r} -> {member.linkname!r}")
        elif not (member.isfile() or member.isdir()):
            raise FetchError(f"refusing the special file {member.name!r}")
        if not os.path.realpath(os.path.join(root, name)).startswith(root + os.sep):
            raise FetchError(f"refusing the archive member {member.name!r}")
        member.name = name
        if member.islnk():
            member.linkname = member.linkname.split("/", 1)[1] if strip else member.linkname
        kept.append(member)
    return kept


def fetch_tarball(url: str, sha256: str, dest: str, timeout: float) -> str:
    pin = check_pin(sha256)
    build = os.path.join(dest, pin[:16])
    current = os.path.join(dest, "current")
    if os.path.isfile(os.path.join(build, ".llmfleet-sha256")):
        with open(os.path.join(build, ".llmfleet-sha256"), encoding="ascii") as handle:
            if handle.read().strip() == pin:
                log(f"{build}: llama.cpp {pin} already unpacked")
                _switch(current, os.path.basename(build))
                return build
    os.makedirs(dest, exist_ok=True)
    tarball = os.path.join(dest, f".{pin[:16]}.tar.gz")
    download(url, tarball, pin, timeout)
    log(f"{url}: sha256 {pin} verified")
    staging = tempfile.mkdtemp(prefix=".unpack-", dir=dest)
    try:
        with tarfile.open(tarball, "r:*") as archive:
            members = _members(archive, staging)
            archive.extractall(staging, members=members)
        names = [n for n in WORKER_NAMES if os.path.isfile(os.path.join(staging, n))]
        if not names or not os.path.isfile(os.path.join(staging, "llama-server")):
            raise FetchError(f"{url}: no llama-server and {' or '.join(WORKER_NAMES)} in the tarball")
        os.symlink(names[0], os.path.join(staging, WORKER_LINK))
        with open(os.path.join(staging, ".llmfleet-sha256"), "w", encoding="ascii") as handle:
            handle.write(pin + "\n")
        os.chmod(staging, 0o755)
        if os.path.isdir(build):
            shutil.rmtree(build)
        os.replace(staging, build)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
        os.unlink(tarball)
    _switch(current, os.path.basename(build))
    log(f"{build}: unpacked; {current} -> {os.path.basename(build)}")
    return build


def _switch(link: str, target: str) -> None:
    tmp = f"{link}.new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def fetch_file(url: str, sha256: str, dest: str, timeout: float) -> str:
    pin = check_pin(sha256)
    marker = f"{dest}.sha256"
    if os.path.isfile(dest) and os.path.isfile(marker):
        with open(marker, encoding="ascii") as handle:
            if handle.read().split()[:1] == [pin]:
                log(f"{dest}: sha256 {pin} verified before, kept")
                return dest
    if os.path.isfile(dest):
        actual = sha256_of(dest)
        if actual == pin:
            _write_marker(marker, pin, dest)
            log(f"{dest}: sha256 {pin} verified, kept")
            return dest
        log(f"{dest}: sha256 {actual} is not the pinned {pin}: downloading again")
    download(url, dest, pin, timeout)
    _write_marker(marker, pin, dest)
    log(f"{url}: sha256 {pin} verified; {dest}")
    return dest


def _write_marker(marker: str, pin: str, dest: str) -> None:
    with open(marker, "w", encoding="ascii") as handle:
        handle.write(f"{pin}  {os.path.basename(dest)}\n")


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
    cmd = sub.add_parser("own")
    cmd.add_argument("--path", required=True)
    cmd.add_argument("--uid", type=int, required=True)
    cmd.add_argument("--gid", type=int, default=-1)
    opts = parser.parse_args(argv)
    try:
        if opts.command == "tarball":
            fetch_tarball(opts.url, opts.sha256, opts.dest, opts.timeout)
        elif opts.command == "file":
            fetch_file(opts.url, opts.sha256, opts.dest, opts.timeout)
        else:
            own(opts.path, opts.uid, opts.gid if opts.gid >= 0 else opts.uid)
    except FetchError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

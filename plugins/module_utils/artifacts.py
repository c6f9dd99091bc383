# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pinned artifacts: choose, fetch, verify and install them, failing closed.

Everything here is plain Python (3.8+, stdlib only, no Ansible imports: it runs on the
hosts) so that the modules ``artifact_fetch`` / ``artifact_install`` and the filter
``llama_cpp_release`` stay thin and the behaviour is unit-tested directly:

- :func:`select_release` picks the entry ``releases[build][flavour]`` for a host, with an
  error that names the host, the build and the flavour and lists what the table has;
- :func:`fetch` downloads into ``<dest>.part`` (resuming with an HTTP Range request), checks
  the free disk space before writing, cuts the body at the pinned size and at the free space
  less the reserve (a server that sends no Content-Length, or a false one, cannot fill the
  disk), verifies the sha256 and only then renames the file into place; a wrong file is
  removed and never moved into place;
- :func:`install` verifies an archive's sha256 *before* unpacking it, unpacks it (a tar or a
  zip, told apart by content; every member is checked first by :func:`plan_members`) or copies
  a built tree into a hidden staging directory next to the target, writes a marker and
  renames the staging directory into place; any failure removes the staging directory and
  leaves what was there before untouched; a tree whose binaries are ELF files for another
  architecture than the host's (:func:`elf_machine`, e.g. an ubuntu-arm64 build on an x86_64
  host) is refused before anything is replaced.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import zipfile
import zlib
from typing import IO, Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple
from urllib.error import HTTPError
from urllib.parse import urlsplit

MIB = 1024 * 1024
CHUNK = 1024 * 1024
MARKER = ".llmfleet-artifact.json"
MAX_UNPACKED = 16 * 1024 * MIB  # an archive whose files add up to more is refused (zip bomb guard)
WORKER_BINARIES = ("ggml-rpc-server", "rpc-server")
SOURCE_FLAVOUR = "source"

# ELF e_machine codes of the architectures llama.cpp releases are built for, and the names
# os.uname().machine may give them.
# 32-bit ARM (EM_ARM) is there for source builds on a 32-bit userland (no release is built for it).
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0x28: "arm"}
MACHINE_ALIASES = {
    "amd64": "x86_64",
    "x86_64": "x86_64",
    "arm64": "aarch64",
    "aarch64": "aarch64",
    "armv6l": "arm",
    "armv7l": "arm",
    "armv8l": "arm",
    "armhf": "arm",
    "arm": "arm",
}
# The CPU release flavour built for an architecture; any other builds from source.
RELEASE_FLAVOURS = {"x86_64": "ubuntu-x64", "aarch64": "ubuntu-arm64"}

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_RPC_PROTO_RE = re.compile(r"^(\d{1,4})\.(\d{1,4})\.(\d{1,4})$")
_RPC_DEFINE_RE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+RPC_PROTO_(MAJOR|MINOR|PATCH)_VERSION[ \t]+(\d+)\b", re.M
)
# Where llama.cpp's source tree declares the RPC protocol version (since the versioned HELLO).
RPC_HEADER = "ggml/include/ggml-rpc.h"
RPC_HEADER_MAX = 64 * 1024  # the header is about 2 KiB; a bigger one is not read
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class ArtifactError(Exception):
    """Base class: a pinned artifact could not be chosen, fetched or installed."""


class ArchitectureMismatch(ArtifactError):
    """A release's binaries are built for another architecture than the host's."""


class ReleaseLookupError(ArtifactError):
    """The release table has no usable entry for a host."""


class ChecksumMismatch(ArtifactError):
    """A file's sha256 differs from its pin."""

    def __init__(self, path: str, expected: str, actual: str, what: str = "") -> None:
        self.path = path
        self.expected = expected
        self.actual = actual
        label = what or path
        super().__init__(
            f"sha256 mismatch for {label}: expected {expected}, actual {actual}; "
            f"the file was discarded and nothing was installed"
        )


class DiskSpaceError(ArtifactError):
    """Not enough free space for a download."""


class LayoutError(ArtifactError):
    """An archive or a tree does not have the expected shape (or is unsafe)."""


class DownloadError(ArtifactError):
    """The server did not deliver the file."""


# --------------------------------------------------------------------------- pins


def normalize_sha256(value: Any, what: str = "sha256") -> str:
    """Return a pin as 64 lowercase hex digits; accept an optional ``sha256:`` prefix.

    >>> normalize_sha256("SHA256:" + "A" * 64) == "a" * 64
    True
    """
    if not isinstance(value, str):
        raise ArtifactError(f"{what}: expected 64 hex digits, got {value!r}")
    text = value.strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:") :]
    if not _SHA256_RE.match(text):
        raise ArtifactError(f"{what}: expected 64 hex digits, got {value!r}")
    return text


def parse_rpc_proto(value: Any, what: str = "rpc_proto") -> Tuple[int, int, int]:
    """``"7.0.0"`` -> (7, 0, 0): a llama.cpp RPC protocol version as ggml-rpc.h declares it.

    >>> parse_rpc_proto("7.1.0")
    (7, 1, 0)
    """
    match = _RPC_PROTO_RE.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ArtifactError(
            f"{what}: expected an RPC protocol version MAJOR.MINOR.PATCH such as '7.0.0', got {value!r}"
        )
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def rpc_compatible(head: Any, worker: Any) -> bool:
    """Whether a llama-server speaking ``head`` accepts an rpc-server speaking ``worker``.

    The rule of llama.cpp's client (ggml/src/ggml-rpc/ggml-rpc.cpp, ``negotiate_hello``): it
    refuses a server whose major differs from its own or whose minor is higher than its own
    (``response.major != RPC_PROTO_MAJOR_VERSION || response.minor > RPC_PROTO_MINOR_VERSION``);
    the patch is not compared.
    """
    client = parse_rpc_proto(head, "the head's rpc_proto")
    server = parse_rpc_proto(worker, "the worker's rpc_proto")
    return server[0] == client[0] and server[1] <= client[1]


def rpc_proto_from_header(text: str, what: str = RPC_HEADER) -> Optional[str]:
    """``"7.0.0"`` from the ``#define RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION`` lines of ggml-rpc.h.

    None for a header without them (builds from before the versioned HELLO); a header with some of
    the three but not all is refused.
    """
    found: Dict[str, str] = {}
    for part, number in _RPC_DEFINE_RE.findall(text):
        if found.setdefault(part, number) != number:
            raise ArtifactError(
                f"{what}: RPC_PROTO_{part}_VERSION is defined twice ({found[part]}, {number})"
            )
    if not found:
        return None
    missing = [p for p in ("MAJOR", "MINOR", "PATCH") if p not in found]
    if missing:
        raise ArtifactError(f"{what}: no RPC_PROTO_{missing[0]}_VERSION beside {', '.join(sorted(found))}")
    return f"{int(found['MAJOR'])}.{int(found['MINOR'])}.{int(found['PATCH'])}"


def _read_header(handle: IO[bytes], what: str) -> str:
    data = handle.read(RPC_HEADER_MAX + 1)
    if len(data) > RPC_HEADER_MAX:
        raise ArtifactError(f"{what}: more than {RPC_HEADER_MAX} bytes, not a ggml-rpc.h")
    return data.decode("utf-8", errors="replace")


def rpc_proto_from_source(path: str) -> Optional[str]:
    """The RPC protocol version of a llama.cpp source: a tree or a source tarball (a release's
    tag archive, or the PyPI sdist that vendors the tree), read from its ``ggml/include/ggml-rpc.h``.

    None when the header declares no version; an error when the source has no such header.
    """
    if os.path.isdir(path):
        header = os.path.join(path, *RPC_HEADER.split("/"))
        if not os.path.isfile(header):
            raise ArtifactError(f"{path}: no {RPC_HEADER} in this source tree")
        with open(header, "rb") as handle:
            return rpc_proto_from_header(_read_header(handle, header), header)
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = _norm_member(member.name)
                if member.isfile() and (name == RPC_HEADER or name.endswith("/" + RPC_HEADER)):
                    source = tar.extractfile(member)
                    if source is None:
                        break
                    with source:
                        what = f"{path}:{member.name}"
                        return rpc_proto_from_header(_read_header(source, what), what)
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise ArtifactError(f"{path}: cannot read this source tarball: {exc}") from None
    raise ArtifactError(f"{path}: no {RPC_HEADER} in this source tarball")


def asset_name(url: str) -> str:
    """The file name at the end of a URL or path (without query or fragment)."""
    path = urlsplit(url).path if "://" in url else url.split("?", 1)[0].split("#", 1)[0]
    name = posixpath.basename(path)
    if not name or name in (".", ".."):
        raise ArtifactError(f"cannot take a file name from {url!r}")
    return name


def select_release(
    releases: Mapping[str, Any], build: Any, flavour: Any, host: str = "this host"
) -> Dict[str, Any]:
    """Pick ``releases[build][flavour]`` and return it checked and completed.

    The result is ``{build, flavour, url, sha256, asset, source}`` where ``source`` is true for
    the flavour ``source`` (a source tarball to build on the host).
    """
    if not isinstance(releases, Mapping):
        raise ReleaseLookupError(f"{host}: the llama.cpp release table must be a mapping, got {releases!r}")
    if not isinstance(build, str) or not build:
        raise ReleaseLookupError(f"{host}: no llama.cpp build chosen (set llama_cpp_build)")
    if not isinstance(flavour, str) or not flavour:
        raise ReleaseLookupError(
            f"{host}: no llama.cpp flavour for this host (the probe's backends.llama_cpp is empty; "
            f"set llama_cpp_flavour, e.g. ubuntu-x64, ubuntu-arm64 or source)"
        )
    table = releases.get(build)
    if not isinstance(table, Mapping) or not table:
        known = ", ".join(sorted(str(k) for k in releases)) or "none"
        raise ReleaseLookupError(
            f"{host}: llama.cpp build {build!r} is not in the release table (builds known: {known}); "
            f"add llama_cpp_releases[{build!r}][{flavour!r}] = {{url, sha256}}"
        )
    entry = table.get(flavour)
    if not isinstance(entry, Mapping):
        known = ", ".join(sorted(str(k) for k in table)) or "none"
        raise ReleaseLookupError(
            f"{host}: no llama.cpp {build} asset for flavour {flavour!r} in the release table "
            f"(flavours of {build}: {known}); add llama_cpp_releases[{build!r}][{flavour!r}] = "
            f"{{url, sha256}} or mark the host 'source' to build it there"
        )
    url = entry.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ReleaseLookupError(f"{host}: release table entry {build}/{flavour} has no url")
    try:
        sha256 = normalize_sha256(
            entry.get("sha256"), f"{host}: release table entry {build}/{flavour} sha256"
        )
        rpc_proto = entry.get("rpc_proto")
        if rpc_proto not in (None, ""):
            rpc_proto = "%d.%d.%d" % parse_rpc_proto(
                rpc_proto, f"{host}: release table entry {build}/{flavour} rpc_proto"
            )
    except ArtifactError as exc:
        raise ReleaseLookupError(str(exc)) from None
    return {
        "build": build,
        "flavour": flavour,
        "url": url.strip(),
        "sha256": sha256,
        "asset": asset_name(url.strip()),
        "source": flavour == SOURCE_FLAVOUR,
        "rpc_proto": rpc_proto or None,
    }


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: str, expected: str, what: str = "") -> str:
    """Return the file's sha256; raise :class:`ChecksumMismatch` naming both hashes."""
    pin = normalize_sha256(expected)
    actual = sha256_file(path)
    if actual != pin:
        raise ChecksumMismatch(path, pin, actual, what)
    return actual


# --------------------------------------------------------------------------- disk space


def check_disk_space(
    need_bytes: int,
    free_mib: Optional[float],
    reserve_mib: float = 0,
    where: str = "",
    statvfs_free_bytes: Optional[int] = None,
) -> None:
    """Raise :class:`DiskSpaceError` when ``need_bytes`` + the reserve do not fit.

    ``free_mib`` is what the probe reported (``llmfleet_host.disk_free_mib``);
    ``statvfs_free_bytes`` what the file system says now. Both must allow it.
    """
    if need_bytes <= 0:
        return
    need_mib = need_bytes / MIB
    checks: List[Tuple[str, float]] = []
    if free_mib is not None:
        checks.append(("the probe reported", float(free_mib)))
    if statvfs_free_bytes is not None:
        checks.append(("the file system has", statvfs_free_bytes / MIB))
    for source, free in checks:
        if need_mib + reserve_mib > free:
            raise DiskSpaceError(
                f"not enough disk space for {where or 'the download'}: it needs {need_mib:.1f} MiB "
                f"+ {reserve_mib:g} MiB reserve, {source} {free:.1f} MiB free"
            )


def free_bytes(path: str) -> int:
    """Free bytes for an unprivileged writer on the file system holding ``path``."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe or "/")
    return st.f_bavail * st.f_frsize


# --------------------------------------------------------------------------- HTTP fetch


def parse_content_range(value: Optional[str]) -> Optional[Tuple[int, int, Optional[int]]]:
    """``bytes 10-99/100`` -> (10, 99, 100); ``*`` total -> None; anything else -> None."""
    if not value:
        return None
    match = _CONTENT_RANGE_RE.match(value.strip())
    if not match:
        return None
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


class Response:
    """What :func:`fetch` needs from an HTTP response (adapted by the caller's opener)."""

    def __init__(self, status: int, headers: Mapping[str, str], read: Callable[[int], bytes]) -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.read = read


# An opener takes (url, extra request headers) and returns a Response, or raises
# HttpStatusError for an HTTP error status (so a 416 can be told apart from a failure).
Opener = Callable[[str, Dict[str, str]], Response]


class HttpStatusError(Exception):
    def __init__(self, status: int, reason: str = "") -> None:
        self.status = status
        super().__init__(f"HTTP {status} {reason}".strip())


def make_opener(open_fn: Callable[..., Any], **kwargs: Any) -> Opener:
    """Adapt a urllib-style ``open_fn(url, headers=..., **kwargs)`` into an :data:`Opener`.

    ``open_fn`` is ``ansible.module_utils.urls.open_url`` in the module (proxies, CA bundle,
    validate_certs), and may be ``urllib.request``-based elsewhere: both raise
    ``urllib.error.HTTPError`` for an HTTP error status.
    """

    def opener(url: str, headers: Dict[str, str]) -> Response:
        try:
            handle = open_fn(url, headers=headers, **kwargs)
        except HTTPError as exc:
            raise HttpStatusError(exc.code, str(exc.reason)) from None
        status = handle.getcode() or 200  # file:// answers None
        return Response(int(status), dict(handle.headers.items()), handle.read)

    return opener


def _request(opener: Opener, url: str, offset: int) -> Tuple[Optional[Response], int]:
    """GET from ``offset``; returns (response or None when the range is past the end, start)."""
    headers = {"Range": f"bytes={offset}-"} if offset > 0 else {}
    try:
        response = opener(url, headers)
    except HttpStatusError as exc:
        if exc.status == 416 and offset > 0:
            return None, offset
        raise DownloadError(f"{url}: {exc}") from None
    if offset > 0 and response.status == 206:
        parsed = parse_content_range(response.headers.get("content-range"))
        if parsed is None or parsed[0] != offset:
            raise DownloadError(
                f"{url}: asked for bytes from {offset}, the server answered "
                f"Content-Range {response.headers.get('content-range')!r}"
            )
        return response, offset
    if response.status not in (200, 206):
        raise DownloadError(f"{url}: unexpected HTTP status {response.status}")
    return response, 0


def _expected_total(response: Response, start: int) -> Optional[int]:
    parsed = parse_content_range(response.headers.get("content-range"))
    if parsed is not None and parsed[2] is not None:
        return parsed[2]
    length = response.headers.get("content-length")
    if length is not None and length.isdigit():
        return start + int(length)
    return None


def _space_budget(part: str, free_mib: Optional[float], reserve_mib: float) -> int:
    """Bytes that may still be written next to ``part``: free space (the probe's and the file
    system's, the smaller) less the reserve."""
    free = free_bytes(part)
    if free_mib is not None:
        free = min(free, int(float(free_mib) * MIB))
    return max(0, free - int(reserve_mib * MIB))


def _download(
    opener: Opener,
    url: str,
    part: str,
    resume: bool,
    free_mib: Optional[float],
    reserve_mib: float,
    dest: str,
    size: Optional[int] = None,
) -> Dict[str, int]:
    have = os.path.getsize(part) if (resume and os.path.isfile(part)) else 0
    if size is not None and have > size:
        have = 0  # a leftover longer than the pinned file cannot be its beginning
    response, start = _request(opener, url, have)
    if response is None:  # 416: the .part already holds the whole file (or more)
        return {"resumed_from": have, "downloaded": 0, "size": have}
    total = _expected_total(response, start)
    if total is not None and size is not None and total != size:
        raise DownloadError(
            f"{url}: the server announces {total} bytes, the pin recorded {size}; nothing was kept"
        )
    expected = total if total is not None else size
    if expected is not None:
        check_disk_space(expected - start, free_mib, reserve_mib, dest, free_bytes(part))
    # Whatever the headers say (a server may send none, or lie), the body is cut at the pinned
    # size and at the free space less the reserve: a chunk that would pass either is not written.
    budget = _space_budget(part, free_mib, reserve_mib)
    limit = budget if size is None else min(budget, size - start)
    mode = "ab" if start > 0 else "wb"
    written = 0
    with open(part, mode) as handle:
        if start == 0:
            handle.truncate(0)
        while True:
            chunk = response.read(CHUNK)
            if not chunk:
                break
            if written + len(chunk) > limit:
                handle.close()
                os.unlink(part)
                if size is not None and start + written + len(chunk) > size:
                    raise DownloadError(
                        f"{url}: the server sent more than the {size} bytes the pin recorded; "
                        f"stopped and discarded the partial file"
                    )
                raise DiskSpaceError(
                    f"not enough disk space for {dest}: the server sent more than the "
                    f"{limit / MIB:.1f} MiB that fit (free space less {reserve_mib:g} MiB reserve); "
                    f"stopped and discarded the partial file"
                )
            handle.write(chunk)
            written += len(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    got = start + written
    if expected is not None and got != expected:
        raise DownloadError(
            f"{url}: the connection ended after {got} of {expected} bytes (kept for resuming)"
        )
    return {"resumed_from": start, "downloaded": written, "size": got}


def fetch(
    opener: Opener,
    url: str,
    dest: str,
    sha256: str,
    resume: bool = True,
    free_mib: Optional[float] = None,
    reserve_mib: float = 0,
    mode: int = 0o644,
    check_mode: bool = False,
    size: Optional[int] = None,
) -> Dict[str, Any]:
    """Make ``dest`` a verified copy of ``url``; return what happened.

    The bytes go to ``dest + '.part'``. An interrupted transfer leaves the .part behind and the
    next call continues it with ``Range: bytes=N-``. The file is renamed to ``dest`` only when
    its sha256 equals the pin. A mismatch removes the .part; when the mismatch followed a
    resumed transfer the whole file is fetched once more from scratch (the old part may be
    the damaged bit) before giving up.

    The body is bounded whatever the server's headers say: never more than ``size`` bytes (the
    size the lock recorded, when known) and never more than the free space (the probe's
    ``free_mib`` and the file system's, the smaller) less ``reserve_mib``.
    """
    pin = normalize_sha256(sha256, f"sha256 for {dest}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ArtifactError(f"size for {dest}: expected a number of bytes, got {size!r}")
    result: Dict[str, Any] = {
        "changed": False,
        "path": dest,
        "sha256": pin,
        "resumed_from": 0,
        "downloaded": 0,
    }
    if os.path.isfile(dest) and sha256_file(dest) == pin:
        result["size"] = os.path.getsize(dest)
        return result
    result["changed"] = True
    if check_mode:
        return result
    part = dest + ".part"
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    attempt = _download(opener, url, part, resume, free_mib, reserve_mib, dest, size)
    actual = sha256_file(part)
    if actual != pin and attempt["resumed_from"] > 0:
        os.unlink(part)
        attempt = _download(opener, url, part, False, free_mib, reserve_mib, dest, size)
        attempt["retried"] = 1
        actual = sha256_file(part)
    if actual != pin:
        os.unlink(part)
        raise ChecksumMismatch(part, pin, actual, f"{url} (for {dest})")
    os.chmod(part, mode)
    os.replace(part, dest)
    result.update(attempt)
    return result


def adopt(src: str, dest: str, sha256: str, mode: int = 0o644, check_mode: bool = False) -> Dict[str, Any]:
    """Verify a file already on this machine (e.g. copied from the controller) and move it to ``dest``.

    ``src`` is consumed: moved into place when it matches, removed when it does not.
    """
    pin = normalize_sha256(sha256, f"sha256 for {dest}")
    result: Dict[str, Any] = {"changed": False, "path": dest, "sha256": pin}
    if os.path.isfile(dest) and sha256_file(dest) == pin:
        if os.path.exists(src) and os.path.abspath(src) != os.path.abspath(dest) and not check_mode:
            os.unlink(src)
        return result
    result["changed"] = True
    if check_mode:
        return result
    if not os.path.isfile(src):
        raise ArtifactError(f"{src}: no such file to verify for {dest}")
    actual = sha256_file(src)
    if actual != pin:
        os.unlink(src)
        raise ChecksumMismatch(src, pin, actual, f"{src} (for {dest})")
    os.chmod(src, mode)
    os.replace(src, dest)
    return result


# --------------------------------------------------------------------------- install


def _norm_member(name: str) -> str:
    name = name.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _parts(name: str) -> List[str]:
    """A member's path as a list of parts (empty ones and ``.`` dropped); unsafe paths are refused."""
    norm = _norm_member(name)
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if norm.startswith("/") or ".." in parts:
        raise LayoutError(f"unsafe path in archive: {name!r}")
    return parts


def archive_root(members: Iterable[tarfile.TarInfo]) -> str:
    """The deepest folder that holds every member, or LayoutError when there is no single top folder.

    ``llama-b1234`` for a release tarball, ``build/bin`` for an older release zip (whose parent
    folder ``build/`` may or may not be listed). A flat archive or one with two top folders is refused.
    """
    tops = set()
    root: Optional[List[str]] = None
    folders = []
    for member in members:
        parts = _parts(member.name)
        if not parts:
            continue
        tops.add(parts[0])
        if member.isdir():
            folders.append(parts)
        else:
            root = parts[:-1] if root is None else posixpath.commonprefix([root, parts[:-1]])
    if root is None:  # folders only
        root = sorted(tops)[:1]
    for parts in folders:
        if parts != root[: len(parts)]:  # a folder above the root does not make it shallower
            root = posixpath.commonprefix([root, parts])
    if len(tops) != 1 or not root:
        shown = ", ".join(sorted(tops)[:5]) or "nothing"
        raise LayoutError(f"expected one top folder in the archive, found: {shown}")
    return "/".join(root)


def _link_stays_inside(folder: List[str], link: str, links: Set[str]) -> bool:
    """True when a symlink in ``folder`` pointing to ``link`` ends inside the tree.

    The target must be relative, never climb above the root and pass through no other symlink
    of the archive (only its last part may be one: ``libx.so -> libx.so.1 -> libx.so.1.2``), so
    that every link is judged on its own and no chain of links can leave the tree.
    """
    if not link or "\x00" in link or posixpath.isabs(link):
        return False
    path = list(folder)
    steps = [p for p in link.split("/") if p not in ("", ".")]
    for index, step in enumerate(steps):
        if step == "..":
            if not path:
                return False
            path.pop()
            continue
        path.append(step)
        if index < len(steps) - 1 and "/".join(path) in links:
            return False
    return True


def plan_members(members: Iterable[tarfile.TarInfo]) -> Tuple[str, List[Tuple[tarfile.TarInfo, str]]]:
    """Check every member and map it to its path below the archive's root folder.

    Only regular files, directories, symlinks and hard links are accepted, each path once. A
    symlink must stay inside the tree (see :func:`_link_stays_inside`), a hard link must point
    to a file of the archive, no member may lie below a symlink, and the files may not add up
    to more than ``MAX_UNPACKED`` bytes. Anything else (absolute paths, ``..``, devices, links
    leaving the tree) is a :class:`LayoutError` before a single byte is written.
    """
    members = list(members)
    root = archive_root(members)
    depth = root.count("/") + 1
    by_path: Dict[str, tarfile.TarInfo] = {}
    planned: List[Tuple[tarfile.TarInfo, str]] = []
    total = 0
    for member in members:
        rel = "/".join(_parts(member.name)[depth:])
        if not rel:
            continue  # the root folder or a folder above it
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise LayoutError(f"unsupported member type in archive: {member.name!r}")
        if rel in by_path:
            raise LayoutError(f"duplicate member in archive: {member.name!r}")
        by_path[rel] = member
        total += member.size if member.isfile() else 0
        planned.append((member, rel))
    if total > MAX_UNPACKED:
        raise LayoutError(
            f"the archive would unpack to {total} bytes ({total / MIB:.0f} MiB), more than the "
            f"{MAX_UNPACKED // MIB} MiB allowed"
        )
    links = {rel for rel, member in by_path.items() if member.issym()}
    for member, rel in planned:
        parts = rel.split("/")
        if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
            raise LayoutError(f"member below a symlink in archive: {member.name!r}")
        if member.issym() and not _link_stays_inside(parts[:-1], member.linkname, links):
            raise LayoutError(f"symlink leaves the archive: {member.name!r} -> {member.linkname!r}")
        if member.islnk():
            target = _norm_member(member.linkname).split("/")
            source = by_path.get("/".join(target[depth:])) if "/".join(target[:depth]) == root else None
            if ".." in target or source is None or not source.isfile():
                raise LayoutError(f"hard link leaves the archive: {member.name!r} -> {member.linkname!r}")
    return root, planned


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tarfile.TarInfo:
    """A zip entry described as a TarInfo, so that both formats go through :func:`plan_members`.

    The unix mode is the high 16 bits of ``external_attr`` (zero in zips made on Windows: such
    files count as not executable). A symlink is an entry of type ``S_IFLNK`` whose content is
    the link target; it is read here, before anything is written.
    """
    if info.flag_bits & 0x1:
        raise LayoutError(f"encrypted member in archive: {info.filename!r}")
    mode = info.external_attr >> 16
    member = tarfile.TarInfo(info.filename)
    member.mode = stat.S_IMODE(mode)
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        if info.file_size > 4096:
            raise LayoutError(f"symlink target too long in archive: {info.filename!r}")
        member.type = tarfile.SYMTYPE
        try:
            member.linkname = archive.read(info).decode("utf-8")
        except UnicodeDecodeError:
            raise LayoutError(f"symlink target is not UTF-8 in archive: {info.filename!r}") from None
    elif kind == stat.S_IFDIR or info.is_dir():
        member.type = tarfile.DIRTYPE
    elif kind in (0, stat.S_IFREG):
        member.size = info.file_size
    else:
        raise LayoutError(f"unsupported member type in archive: {info.filename!r}")
    return member


def archive_format(path: str) -> str:
    """``tar`` (plain or compressed) or ``zip``, judged by the content, not by the name."""
    if tarfile.is_tarfile(path):
        return "tar"
    if zipfile.is_zipfile(path):
        return "zip"
    raise LayoutError(
        f"{path}: neither a tar archive (.tar, .tar.gz, .tar.xz, .tar.bz2) nor a zip file; "
        f"nothing was installed"
    )


def _write(
    planned: List[Tuple[tarfile.TarInfo, str]],
    root: str,
    stage: str,
    read: Callable[[tarfile.TarInfo], Optional[IO[bytes]]],
) -> None:
    depth = root.count("/") + 1
    for member, rel in planned:
        target = os.path.join(stage, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if member.isdir():
            os.makedirs(target, exist_ok=True)
            os.chmod(target, 0o755)
        elif member.issym():
            os.symlink(member.linkname, target)
        elif member.islnk():
            os.link(os.path.join(stage, *_norm_member(member.linkname).split("/")[depth:]), target)
        else:
            source = read(member)
            if source is None:
                raise LayoutError(f"cannot read {member.name!r} from the archive")
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)


def _extract(archive: str, stage: str) -> str:
    """Unpack a tar or zip ``archive`` (found out by its content) below its root folder into ``stage``."""
    kind = archive_format(archive)
    try:
        if kind == "tar":
            with tarfile.open(archive, "r:*") as tar:
                root, planned = plan_members(tar.getmembers())
                _write(planned, root, stage, tar.extractfile)
        else:
            with zipfile.ZipFile(archive) as bundle:
                entries = [(_zip_member(bundle, info), info) for info in bundle.infolist()]
                infos = {id(member): info for member, info in entries}
                root, planned = plan_members(member for member, _unused in entries)
                _write(planned, root, stage, lambda member: bundle.open(infos[id(member)]))
    except LayoutError as exc:
        raise LayoutError(f"{archive}: {exc}") from None
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise LayoutError(f"{archive}: cannot read this {kind} archive: {exc}") from None
    return root


def _copy_tree(src_dir: str, stage: str) -> None:
    for root, dirs, files in os.walk(src_dir):
        rel_root = os.path.relpath(root, src_dir)
        for name in dirs + files:
            source = os.path.join(root, name)
            target = os.path.normpath(os.path.join(stage, rel_root, name))
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
                if name in dirs:
                    dirs.remove(name)
            elif os.path.isdir(source):
                os.makedirs(target, exist_ok=True)
            elif os.path.isfile(source):
                shutil.copy2(source, target)
            else:
                raise LayoutError(f"unsupported file type in {src_dir}: {source}")


def find_binary(directory: str, names: Iterable[str]) -> Optional[str]:
    """The first of ``names`` that is an executable file (following symlinks) in ``directory``."""
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return name
    return None


def elf_machine(path: str) -> Optional[str]:
    """The architecture an ELF file is built for (``x86_64``, ``aarch64`` or ``e_machine 0x..``).

    None for a file that is not ELF (a script). Reads the first 20 bytes only.
    """
    with open(path, "rb") as handle:
        head = handle.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return None
    code = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return ELF_MACHINES.get(code, f"e_machine 0x{code:X}")


def userland_machine() -> str:
    """The architecture this host's programs are built for: the running interpreter's own ELF
    header, else ``os.uname().machine``.

    They differ on a 32-bit userland on a 64-bit kernel (Raspberry Pi OS 32-bit on its 64-bit
    kernel: uname says aarch64, every program, this Python included, is 32-bit ARM); under
    qemu-user both say the emulated architecture.
    """
    try:
        built = elf_machine(os.path.realpath(sys.executable)) if sys.executable else None
    except OSError:
        built = None
    return built if built in ELF_MACHINES.values() else os.uname().machine


def check_architecture(directory: str, names: Iterable[str], machine: str, host: str, flavour: Any) -> None:
    """Refuse a tree whose ELF binaries ``names`` are not built for ``machine`` (the host's)."""
    want = MACHINE_ALIASES.get(machine, machine)
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        built = elf_machine(path)
        if built is not None and built != want:
            raise ArchitectureMismatch(
                f"{host}: llama.cpp flavour {flavour!r} has {name} built for {built}, but this host "
                f"is {want}; set llama_cpp_flavour to the build for {want} (e.g. "
                f"{RELEASE_FLAVOURS.get(want, SOURCE_FLAVOUR)}); nothing was installed"
            )


def read_marker(directory: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(directory, MARKER), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _describe(directory: str, require_one_of: List[str], require: List[str]) -> Dict[str, Any]:
    """``binary``: the first of ``require_one_of`` present; ``found``: which of ``require`` are."""
    return {
        "binary": find_binary(directory, require_one_of) if require_one_of else None,
        "found": [name for name in require if find_binary(directory, [name])],
    }


def install(
    dest: str,
    sha256: str,
    archive: Optional[str] = None,
    src_dir: Optional[str] = None,
    info: Optional[Mapping[str, Any]] = None,
    require_one_of: Optional[List[str]] = None,
    require: Optional[List[str]] = None,
    check_mode: bool = False,
    machine: Optional[str] = None,
    host: Optional[str] = None,
) -> Dict[str, Any]:
    """Install ``archive`` (verified before unpacking) or a built ``src_dir`` as ``dest``.

    Idempotent: when ``dest`` carries a marker with the same sha256 nothing happens (the
    archive or tree need not exist any more). Otherwise the content goes into a staging
    directory next to ``dest`` that is renamed into place only when complete and checked
    (``require_one_of``: at least one of these executables, ``require``: all of these).
    A previous ``dest`` with another pin is replaced only after the new tree is ready. The
    required binaries that are ELF files must be built for ``machine`` (default: this host's
    userland, :func:`userland_machine`; ``host`` names it in the error, default its node name).
    """
    pin = normalize_sha256(sha256, f"sha256 for {dest}")
    require_one_of = list(require_one_of or [])
    require = list(require or [])
    dest = os.path.abspath(dest)
    result: Dict[str, Any] = {"changed": False, "path": dest, "sha256": pin}
    marker = read_marker(dest)
    if marker is not None and marker.get("sha256") == pin:
        result.update(_describe(dest, require_one_of, require))
        return result
    if (archive is None) == (src_dir is None):
        raise ArtifactError("install needs exactly one of archive or src_dir")
    result["changed"] = True
    if check_mode:
        return result
    if archive is not None:
        if not os.path.isfile(archive):
            raise ArtifactError(f"{archive}: no such archive to install as {dest}")
        actual = sha256_file(archive)
        if actual != pin:
            os.unlink(archive)
            raise ChecksumMismatch(archive, pin, actual)
    elif not os.path.isdir(src_dir or ""):
        raise ArtifactError(f"{src_dir}: no such directory to install as {dest}")
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(dest)}-", dir=parent)
    old = None
    try:
        os.chmod(stage, 0o755)
        if archive is not None:
            _extract(archive, stage)
        else:
            _copy_tree(src_dir or "", stage)
        missing = [name for name in require if find_binary(stage, [name]) is None]
        if require_one_of and find_binary(stage, require_one_of) is None:
            missing.append(" or ".join(require_one_of))
        if missing:
            what = archive or src_dir
            raise LayoutError(f"{what}: no executable {', '.join(missing)} in it; nothing was installed")
        check_architecture(
            stage,
            require_one_of + require,
            machine or userland_machine(),
            host or os.uname().nodename,
            (info or {}).get("flavour", "?"),
        )
        record = dict(info or {})
        record["sha256"] = pin
        with open(os.path.join(stage, MARKER), "w", encoding="utf-8") as handle:
            json.dump(record, handle, sort_keys=True)
            handle.write("\n")
        if os.path.lexists(dest):
            old = tempfile.mkdtemp(prefix=f".old-{os.path.basename(dest)}-", dir=parent)
            os.rename(dest, os.path.join(old, "tree"))
        os.rename(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None and not os.path.lexists(dest):
            os.rename(os.path.join(old, "tree"), dest)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    result.update(_describe(dest, require_one_of, require))
    return result


def leftovers(parent: str) -> List[str]:
    """Staging or replaced directories that a crashed run left under ``parent``."""
    try:
        names = os.listdir(parent)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
    return sorted(n for n in names if n.startswith((".tmp-", ".old-")))

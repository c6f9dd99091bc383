"""Zip release assets: the same install as a tarball, told apart by content, with the same refusals.

llama.cpp published its Linux/macOS binaries as ``llama-b<N>-bin-ubuntu-x64.zip`` before it moved
to tarballs. Those zips hold ``build/bin/<files>`` (made with ``zip -r ... ./build/bin/*``); a zip
with one top folder like the tarballs is covered too. The zips are built here with ``zipfile``,
with unix modes in ``external_attr`` the way Info-ZIP writes them.
"""

from __future__ import annotations

import os
import re
import stat
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import artifacts as A

from tests.unit.plugins.module_utils.test_artifacts import _sha, _tarball, _tree

KINDS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "sym": stat.S_IFLNK, "fifo": stat.S_IFIFO}


def _zip(path: Path, entries, unix: bool = True) -> str:
    """A zip of (name, kind, data, mode) entries; a symlink's data is its target."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bundle, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # duplicate names, on purpose
        for name, kind, data, mode in entries:
            info = zipfile.ZipInfo(name, date_time=(2025, 6, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3 if unix else 0
            info.external_attr = ((KINDS[kind] | mode) << 16) if unix else 0
            if kind == "dir":
                info.external_attr |= 0x10  # MS-DOS directory flag, as zip(1) sets it
            bundle.writestr(info, data)
    return _sha(path.read_bytes())


def _release(top: str = "llama-b6000", dirs: bool = True, extra=None) -> list:
    """The entries of test_artifacts._tarball (binaries, a library and its symlink) below ``top``."""
    entries = [(f"{part}/", "dir", b"", 0o755) for part in _ancestors(top)] if dirs else []
    return [
        *entries,
        (f"{top}/ggml-rpc-server", "file", b"#!/bin/sh\necho rpc\n", 0o755),
        (f"{top}/llama-server", "file", b"#!/bin/sh\necho server\n", 0o755),
        (f"{top}/libggml-base.so.0.9.0", "file", b"ELF...", 0o644),
        (f"{top}/libggml-base.so", "sym", b"libggml-base.so.0.9.0", 0o777),
        (f"{top}/LICENSE", "file", b"MIT\n", 0o644),
        *(extra or []),
    ]


def _ancestors(top: str) -> list:
    parts = top.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _snapshot(root: Path) -> dict:
    """Every path below ``root`` (the marker aside) with its type, permission bits and content or target."""
    seen = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if rel == A.MARKER:
            continue
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            seen[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(mode):
            seen[rel] = ("dir", oct(stat.S_IMODE(mode)))
        else:
            seen[rel] = ("file", oct(stat.S_IMODE(mode)), path.read_bytes())
    return seen


def _install(archive: Path, pin: str, dest: Path) -> dict:
    return A.install(
        str(dest),
        pin,
        archive=str(archive),
        info={"build": "b6000"},
        require_one_of=list(A.WORKER_BINARIES),
        require=["llama-server"],
    )


EXPECTED = {
    "LICENSE": ("file", "0o644", b"MIT\n"),
    "ggml-rpc-server": ("file", "0o755", b"#!/bin/sh\necho rpc\n"),
    "libggml-base.so": ("link", "libggml-base.so.0.9.0"),
    "libggml-base.so.0.9.0": ("file", "0o644", b"ELF..."),
    "llama-server": ("file", "0o755", b"#!/bin/sh\necho server\n"),
}


@pytest.mark.parametrize(
    ("top", "dirs"),
    [
        ("llama-b6000", True),  # shaped like today's tarballs
        ("build/bin", False),  # older release zips: zip -r x.zip ./build/bin/* lists no folders
        ("build/bin", True),  # the same with folder entries
    ],
)
def test_a_release_zip_installs_like_the_equivalent_tarball(tmp_path: Path, top: str, dirs: bool) -> None:
    tarball = tmp_path / "llama-b6000-bin-ubuntu-x64.tar.gz"
    tar_pin = _tarball(tarball)
    bundle = tmp_path / "llama-b6000-bin-ubuntu-x64.zip"
    zip_pin = _zip(bundle, _release(top, dirs))

    from_tar = _install(tarball, tar_pin, tmp_path / "tar" / "b6000")
    from_zip = _install(bundle, zip_pin, tmp_path / "zip" / "b6000")

    assert from_zip["changed"] is True
    assert from_zip["binary"] == from_tar["binary"] == "ggml-rpc-server"
    assert from_zip["found"] == ["llama-server"]
    assert _snapshot(tmp_path / "zip" / "b6000") == _snapshot(tmp_path / "tar" / "b6000") == EXPECTED
    assert os.access(tmp_path / "zip" / "b6000" / "llama-server", os.X_OK)
    assert (tmp_path / "zip" / "b6000" / "libggml-base.so").read_bytes() == b"ELF..."
    assert A.read_marker(str(tmp_path / "zip" / "b6000")) == {"build": "b6000", "sha256": zip_pin}
    assert A.leftovers(str(tmp_path / "zip")) == []
    again = _install(bundle, zip_pin, tmp_path / "zip" / "b6000")
    assert again["changed"] is False


def test_a_zip_without_unix_modes_has_no_executables(tmp_path: Path) -> None:
    """A zip made on Windows carries no mode: nothing is executable, so the binary check fails."""
    bundle = tmp_path / "a.zip"
    pin = _zip(bundle, [e for e in _release() if e[1] != "sym"], unix=False)
    with pytest.raises(A.LayoutError, match="no executable llama-server"):
        _install(bundle, pin, tmp_path / "opt" / "b6000")
    assert os.listdir(tmp_path / "opt") == []


@pytest.mark.parametrize("lie", ["x.tar.gz", "x.tar", "x.gguf", "noext"])
def test_a_zip_is_recognised_by_its_content_whatever_its_name(tmp_path: Path, lie: str) -> None:
    bundle = tmp_path / lie
    pin = _zip(bundle, _release("build/bin", dirs=False))
    assert A.archive_format(str(bundle)) == "zip"
    _install(bundle, pin, tmp_path / "opt" / "b6000")
    assert _snapshot(tmp_path / "opt" / "b6000") == EXPECTED


@pytest.mark.parametrize("lie", ["x.zip", "x.gguf"])
def test_a_tarball_is_recognised_by_its_content_whatever_its_name(tmp_path: Path, lie: str) -> None:
    tarball = tmp_path / lie
    pin = _tarball(tarball)
    assert A.archive_format(str(tarball)) == "tar"
    _install(tarball, pin, tmp_path / "opt" / "b6000")
    assert _snapshot(tmp_path / "opt" / "b6000") == EXPECTED


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("llama-b6000-bin-ubuntu-x64.zip", b"GGUF\x03\x00\x00\x00" + bytes(600)),
        ("llama-b6000-bin-ubuntu-x64.tar.gz", b"<html>404 Not Found</html>\n"),
        ("empty.zip", b""),
    ],
)
def test_a_file_that_is_neither_tar_nor_zip_is_named_in_a_clear_error(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(A.LayoutError) as err:
        A.install(str(tmp_path / "opt" / "b6000"), _sha(content), archive=str(path))
    assert str(err.value) == (
        f"{path}: neither a tar archive (.tar, .tar.gz, .tar.xz, .tar.bz2) nor a zip file; nothing was installed"
    )
    assert os.listdir(tmp_path / "opt") == []


@pytest.fixture()
def writes(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every file or symlink the installer writes (it must write none for a refused archive)."""
    calls: list = []
    copy, symlink = A.shutil.copyfileobj, A.os.symlink
    monkeypatch.setattr(A.shutil, "copyfileobj", lambda *a, **k: calls.append("file") or copy(*a, **k))
    monkeypatch.setattr(A.os, "symlink", lambda *a, **k: calls.append(a) or symlink(*a, **k))
    return calls


def _refused(tmp_path: Path, archive: Path, pin: str, needle: str, writes: list) -> None:
    opt = tmp_path / "opt"
    with pytest.raises(A.LayoutError, match=needle) as err:
        A.install(str(opt / "b6000"), pin, archive=str(archive))
    assert str(err.value).startswith(f"{archive}: ")  # the message names the file
    assert writes == []  # refused while planning, before the first byte was written
    assert os.listdir(opt) == []  # no build, no staging directory left behind
    assert sorted(os.listdir(tmp_path)) == sorted([archive.name, "opt"])


@pytest.mark.parametrize(
    "evil",
    [
        "../evil",
        "llama-b6000/../../evil",
        "a/../../evil",
        "llama-b6000/a/../../../evil",
        "llama-b6000\\..\\..\\evil",  # a zip made on Windows
        "ABSOLUTE",
    ],
)
def test_zip_slip_names_are_refused_before_anything_is_written(
    tmp_path: Path, evil: str, writes: list
) -> None:
    evil = str(tmp_path / "evil") if evil == "ABSOLUTE" else evil
    bundle = tmp_path / "a.zip"
    pin = _zip(bundle, _release(extra=[(evil, "file", b"pwned", 0o755)]))  # the good members come first
    _refused(tmp_path, bundle, pin, "unsafe path in archive", writes)


ESCAPES = [
    ([("llama-b6000/passwd", "sym", b"/etc/passwd", 0o777)], "symlink leaves"),
    ([("llama-b6000/up", "sym", b"../../x", 0o777)], "symlink leaves"),
    ([("llama-b6000/lib/up", "sym", b"../../x", 0o777)], "symlink leaves"),
    # each link alone stays inside; through the first, the second climbs out of the tree
    (
        [("llama-b6000/sub/s", "sym", b"..", 0o777), ("llama-b6000/u", "sym", b"sub/s/sub/s/..", 0o777)],
        "symlink leaves",
    ),
    (
        [("llama-b6000/here", "sym", b".", 0o777), ("llama-b6000/out", "sym", b"here/..", 0o777)],
        "symlink leaves",
    ),
    # a file written through a symlinked folder would land wherever the link points
    ([("llama-b6000/d", "sym", b"lib", 0o777), ("llama-b6000/d/x", "file", b"x", 0o644)], "below a symlink"),
    ([("llama-b6000/LICENSE", "file", b"again\n", 0o644)], "duplicate member"),
    ([("llama-b6000/p", "fifo", b"", 0o644)], "unsupported member type"),
    ([("second-top/x", "file", b"x", 0o644)], "expected one top folder"),
    ([("flat-file", "file", b"x", 0o644)], "expected one top folder"),
]


@pytest.mark.parametrize(("extra", "needle"), ESCAPES)
def test_escaping_links_and_misshapen_zips_are_refused(
    tmp_path: Path, extra, needle: str, writes: list
) -> None:
    bundle = tmp_path / "a.zip"
    pin = _zip(bundle, _release(extra=extra))
    _refused(tmp_path, bundle, pin, needle, writes)


@pytest.mark.parametrize(("extra", "needle"), ESCAPES)
def test_tarballs_follow_the_same_rules(tmp_path: Path, extra, needle: str, writes: list) -> None:
    tarball = tmp_path / "a.tar.gz"
    pin = _tarball(tarball, extra=extra)
    _refused(tmp_path, tarball, pin, needle, writes)


def test_links_inside_the_tree_and_chains_of_links_are_kept(tmp_path: Path) -> None:
    bundle = tmp_path / "a.zip"
    extra = [
        ("llama-b6000/libggml-base.so.0", "sym", b"libggml-base.so.0.9.0", 0o777),
        ("llama-b6000/libggml.so", "sym", b"libggml-base.so.0", 0o777),  # a chain: the last part is a link
        ("llama-b6000/lib/", "dir", b"", 0o755),
        ("llama-b6000/lib/libx.so", "sym", b"../libggml-base.so.0", 0o777),
        ("llama-b6000/self", "sym", b".", 0o777),
    ]
    pin = _zip(bundle, _release(extra=extra))
    dest = tmp_path / "b6000"
    A.install(str(dest), pin, archive=str(bundle))
    assert (dest / "libggml.so").read_bytes() == b"ELF..."
    assert (dest / "lib" / "libx.so").read_bytes() == b"ELF..."
    assert os.readlink(dest / "lib" / "libx.so") == "../libggml-base.so.0"
    assert "lib" in _tree(dest)


def test_a_zip_that_would_unpack_beyond_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: list
) -> None:
    monkeypatch.setattr(A, "MAX_UNPACKED", 2 * A.MIB)
    bundle = tmp_path / "bomb.zip"
    zeros = bytes(3 * A.MIB)  # deflates to a few KB
    pin = _zip(bundle, _release(extra=[("llama-b6000/model.bin", "file", zeros, 0o644)]))
    assert bundle.stat().st_size < 64 * 1024
    total = len(zeros) + sum(len(e[2]) for e in _release() if e[1] == "file")
    _refused(
        tmp_path,
        bundle,
        pin,
        f"would unpack to {total} bytes \\(3 MiB\\), more than the 2 MiB allowed",
        writes,
    )


def test_the_size_limit_counts_tarballs_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(A, "MAX_UNPACKED", 10)
    tarball = tmp_path / "a.tar.gz"
    pin = _tarball(tarball)
    total = sum(len(e[2]) for e in _release() if e[1] == "file")
    with pytest.raises(A.LayoutError, match=f"would unpack to {total} bytes"):
        A.install(str(tmp_path / "opt" / "b6000"), pin, archive=str(tarball))


def test_an_encrypted_member_is_refused(tmp_path: Path, writes: list) -> None:
    bundle = tmp_path / "a.zip"
    _zip(bundle, _release(extra=[("llama-b6000/secret", "file", b"x", 0o644)]))
    data = bytearray(bundle.read_bytes())
    entry = data.rindex(b"PK\x01\x02")  # the last central directory entry: llama-b6000/secret
    data[entry + 8] |= 0x1  # its "encrypted" flag (the content is not, and it is never read)
    bundle.write_bytes(bytes(data))
    assert zipfile.ZipFile(bundle).getinfo("llama-b6000/secret").flag_bits & 0x1
    _refused(tmp_path, bundle, _sha(bytes(data)), "encrypted member", writes)


def test_a_damaged_zip_fails_with_the_file_named_and_leaves_nothing(tmp_path: Path) -> None:
    bundle = tmp_path / "a.zip"
    _zip(bundle, _release(extra=[("llama-b6000/data", "file", os.urandom(4096), 0o644)]))
    data = bytearray(bundle.read_bytes())
    start = data.index(b"llama-b6000/data") + len("llama-b6000/data")
    data[start + 100 : start + 200] = bytes(100)  # inside the member's compressed bytes
    bundle.write_bytes(bytes(data))
    with pytest.raises(A.LayoutError, match=f"^{re.escape(str(bundle))}: cannot read this zip archive"):
        A.install(str(tmp_path / "opt" / "b6000"), _sha(bytes(data)), archive=str(bundle))
    assert os.listdir(tmp_path / "opt") == []


def test_the_old_release_layout_is_found_below_build_bin(tmp_path: Path) -> None:
    entries = _release("build/bin", dirs=False)
    members = []
    for name, kind, data, _mode in entries:
        member = tarfile.TarInfo(name)
        member.type = tarfile.SYMTYPE if kind == "sym" else tarfile.REGTYPE
        member.linkname = data.decode() if kind == "sym" else ""
        members.append(member)
    root, planned = A.plan_members(members)
    assert root == "build/bin"
    assert sorted(rel for _unused, rel in planned) == sorted(EXPECTED)

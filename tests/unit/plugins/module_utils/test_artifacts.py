"""Pinned artifacts: release lookup, verified resumable fetch, fail-closed install.

The fetch tests go through Ansible's real ``open_url`` (what the module uses) against the
project's Range-capable HTTP mirror on loopback; the install tests use tarballs shaped like
llama.cpp release assets (one top folder ``llama-<tag>/``) built here with ``tarfile``.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from ansible.module_utils.urls import open_url
from ansible_collections.llmfleet.cluster.plugins.module_utils import artifacts as A

from tests.support.http_mirror import HttpMirror

SIZE = 3 * 1024 * 1024 + 12345  # more than one chunk, not a multiple of it


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def payload() -> bytes:
    return bytes((i * 7 + i // 1000) % 256 for i in range(SIZE))


@pytest.fixture()
def mirror(tmp_path: Path, payload: bytes):
    root = tmp_path / "mirror"
    root.mkdir()
    (root / "model.gguf").write_bytes(payload)
    (root / "truncated.gguf").write_bytes(payload[: SIZE // 2])
    altered = bytearray(payload)
    altered[SIZE // 3] ^= 0xFF
    (root / "altered.gguf").write_bytes(bytes(altered))
    with HttpMirror(str(root)) as m:
        yield m


def _opener():
    return A.make_opener(open_url, timeout=10, validate_certs=True)


# --------------------------------------------------------------------------- release table

PIN = "ab" * 32
TABLE = {
    "b6000": {
        "ubuntu-x64": {
            "url": "https://github.com/ggml-org/llama.cpp/releases/download/b6000/llama-b6000-bin-ubuntu-x64.tar.gz",
            "sha256": "SHA256:" + PIN.upper(),
        },
        "source": {"url": "https://mirror.example/llama.cpp-b6000.tar.gz?x=1", "sha256": "cd" * 32},
    }
}


def test_select_release_returns_a_checked_entry() -> None:
    entry = A.select_release(TABLE, "b6000", "ubuntu-x64", "w1")
    assert entry == {
        "build": "b6000",
        "flavour": "ubuntu-x64",
        "url": TABLE["b6000"]["ubuntu-x64"]["url"],
        "sha256": PIN,
        "asset": "llama-b6000-bin-ubuntu-x64.tar.gz",
        "source": False,
        "rpc_proto": None,  # the table records none
    }
    src = A.select_release(TABLE, "b6000", "source", "nas")
    assert src["source"] is True
    assert src["asset"] == "llama.cpp-b6000.tar.gz"


def test_missing_flavour_names_host_build_flavour_and_what_exists() -> None:
    with pytest.raises(A.ReleaseLookupError) as err:
        A.select_release(TABLE, "b6000", "ubuntu-arm64", "pi5")
    msg = str(err.value)
    assert msg.startswith("pi5: ")
    assert "'ubuntu-arm64'" in msg and "b6000" in msg
    assert "source, ubuntu-x64" in msg


def test_missing_build_lists_known_builds() -> None:
    with pytest.raises(A.ReleaseLookupError) as err:
        A.select_release(TABLE, "b7000", "ubuntu-x64", "w2")
    assert "w2: llama.cpp build 'b7000' is not in the release table (builds known: b6000)" in str(err.value)


@pytest.mark.parametrize(
    ("build", "flavour", "needle"),
    [("", "ubuntu-x64", "set llama_cpp_build"), ("b6000", "", "set llama_cpp_flavour")],
)
def test_empty_build_or_flavour_is_explained(build: str, flavour: str, needle: str) -> None:
    with pytest.raises(A.ReleaseLookupError, match=needle):
        A.select_release(TABLE, build, flavour, "h")


@pytest.mark.parametrize("bad", ["", "TODO", "ab" * 31, "zz" * 32, None, 12])
def test_placeholder_or_malformed_pins_are_refused(bad: object) -> None:
    table = {"b1": {"ubuntu-x64": {"url": "http://x/llama-b1.tar.gz", "sha256": bad}}}
    with pytest.raises(A.ReleaseLookupError, match=r"h: release table entry b1/ubuntu-x64 sha256"):
        A.select_release(table, "b1", "ubuntu-x64", "h")


def test_entry_without_url_is_refused() -> None:
    with pytest.raises(A.ReleaseLookupError, match="has no url"):
        A.select_release({"b1": {"source": {"sha256": PIN}}}, "b1", "source", "h")


def test_asset_name() -> None:
    assert A.asset_name("http://h/a/b/file.tar.gz?token=1#f") == "file.tar.gz"
    with pytest.raises(A.ArtifactError):
        A.asset_name("http://h/")


# --------------------------------------------------------------------------- helpers


def test_parse_content_range() -> None:
    assert A.parse_content_range("bytes 10-99/100") == (10, 99, 100)
    assert A.parse_content_range("bytes 0-9/*") == (0, 9, None)
    assert A.parse_content_range("items 0-9/10") is None
    assert A.parse_content_range(None) is None


def test_disk_space_boundaries() -> None:
    A.check_disk_space(100 * A.MIB, free_mib=150, reserve_mib=50)  # exactly fits
    with pytest.raises(A.DiskSpaceError, match=r"the probe reported 150\.0 MiB free"):
        A.check_disk_space(100 * A.MIB + 1, free_mib=150, reserve_mib=50, where="/m")
    with pytest.raises(A.DiskSpaceError, match=r"the file system has 10\.0 MiB free"):
        A.check_disk_space(20 * A.MIB, free_mib=None, statvfs_free_bytes=10 * A.MIB)
    A.check_disk_space(0, free_mib=0, reserve_mib=10)  # nothing to write


# --------------------------------------------------------------------------- fetch


def test_fetch_downloads_verifies_and_is_idempotent(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    dest = tmp_path / "cache" / "model.gguf"
    result = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload))
    assert result["changed"] is True and result["downloaded"] == SIZE and result["resumed_from"] == 0
    assert dest.read_bytes() == payload
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    assert not (tmp_path / "cache" / "model.gguf.part").exists()
    mirror.reset_counters()
    again = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload))
    assert again["changed"] is False
    assert mirror.requests == []


def test_fetch_resumes_a_partial_file_with_a_range_request(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    dest = tmp_path / "model.gguf"
    have = 1_234_567
    (tmp_path / "model.gguf.part").write_bytes(payload[:have])
    result = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload))
    assert result["resumed_from"] == have
    assert result["downloaded"] == SIZE - have
    assert mirror.bytes_sent["/model.gguf"] == SIZE - have
    assert mirror.requests == [("GET", "/model.gguf", f"bytes={have}-")]
    assert dest.read_bytes() == payload


def test_fetch_refuses_an_altered_file_and_moves_nothing(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    dest = tmp_path / "model.gguf"
    with pytest.raises(A.ChecksumMismatch) as err:
        A.fetch(_opener(), mirror.url_for("altered.gguf"), str(dest), _sha(payload))
    altered = (Path(mirror.directory) / "altered.gguf").read_bytes()
    assert err.value.expected == _sha(payload)
    assert err.value.actual == _sha(altered)
    assert _sha(payload) in str(err.value) and _sha(altered) in str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["mirror"]


def test_fetch_refuses_a_truncated_file(tmp_path: Path, mirror: HttpMirror, payload: bytes) -> None:
    dest = tmp_path / "model.gguf"
    with pytest.raises(A.ChecksumMismatch, match="expected " + _sha(payload)):
        A.fetch(_opener(), mirror.url_for("truncated.gguf"), str(dest), _sha(payload))
    assert not dest.exists() and not Path(str(dest) + ".part").exists()


def test_fetch_does_not_replace_a_good_file_with_a_bad_download(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    # dest holds an older, different file; the new pin's download is altered -> old file stays.
    dest = tmp_path / "model.gguf"
    dest.write_bytes(b"previous model")
    with pytest.raises(A.ChecksumMismatch):
        A.fetch(_opener(), mirror.url_for("altered.gguf"), str(dest), _sha(payload))
    assert dest.read_bytes() == b"previous model"


def test_a_damaged_partial_file_is_discarded_and_fetched_again(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    dest = tmp_path / "model.gguf"
    (tmp_path / "model.gguf.part").write_bytes(b"\0" * 1000)  # wrong bytes, right length to resume from
    result = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload))
    assert result["retried"] == 1 and result["resumed_from"] == 0
    assert dest.read_bytes() == payload
    assert [r[2] for r in mirror.requests] == ["bytes=1000-", None]


def test_a_partial_file_longer_than_the_file_gets_416_then_a_fresh_fetch(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    dest = tmp_path / "model.gguf"
    (tmp_path / "model.gguf.part").write_bytes(payload + b"junk")
    result = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload))
    assert result["retried"] == 1
    assert dest.read_bytes() == payload


def test_a_complete_partial_file_is_verified_without_downloading(
    tmp_path: Path, mirror: HttpMirror, payload: bytes
) -> None:
    dest = tmp_path / "model.gguf"
    (tmp_path / "model.gguf.part").write_bytes(payload)
    result = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload))
    assert result["downloaded"] == 0 and "retried" not in result
    assert mirror.total_bytes_sent() == 0
    assert dest.read_bytes() == payload


def test_fetch_checks_disk_space_before_writing(tmp_path: Path, mirror: HttpMirror, payload: bytes) -> None:
    dest = tmp_path / "model.gguf"
    with pytest.raises(
        A.DiskSpaceError, match=r"needs 3\.0 MiB \+ 1 MiB reserve, the probe reported 3\.5 MiB"
    ):
        A.fetch(
            _opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload), free_mib=3.5, reserve_mib=1
        )
    part = Path(str(dest) + ".part")
    assert not dest.exists() and (not part.exists() or part.stat().st_size == 0)


def test_fetch_check_mode_downloads_nothing(tmp_path: Path, mirror: HttpMirror, payload: bytes) -> None:
    dest = tmp_path / "model.gguf"
    result = A.fetch(_opener(), mirror.url_for("model.gguf"), str(dest), _sha(payload), check_mode=True)
    assert result["changed"] is True
    assert not dest.exists() and mirror.requests == []


def test_fetch_reports_a_missing_file(tmp_path: Path, mirror: HttpMirror) -> None:
    with pytest.raises(A.DownloadError, match="HTTP 404"):
        A.fetch(_opener(), mirror.url_for("nope.gguf"), str(tmp_path / "x"), PIN)


def test_fetch_from_a_server_without_ranges_restarts(tmp_path: Path, payload: bytes) -> None:
    # file:// has no Range support: a leftover .part must be rewritten, not appended to.
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    dest = tmp_path / "dest.bin"
    Path(str(dest) + ".part").write_bytes(payload[:1000])
    A.fetch(_opener(), src.as_uri(), str(dest), _sha(payload))
    assert dest.read_bytes() == payload


def test_adopt_moves_a_verified_file_and_removes_a_wrong_one(tmp_path: Path, payload: bytes) -> None:
    dest = tmp_path / "m.gguf"
    incoming = tmp_path / ".incoming"
    incoming.write_bytes(payload[:-1])
    with pytest.raises(A.ChecksumMismatch) as err:
        A.adopt(str(incoming), str(dest), _sha(payload))
    assert err.value.actual == _sha(payload[:-1])
    assert not incoming.exists() and not dest.exists()
    incoming.write_bytes(payload)
    assert A.adopt(str(incoming), str(dest), _sha(payload))["changed"] is True
    assert dest.read_bytes() == payload and not incoming.exists()
    assert A.adopt(str(incoming), str(dest), _sha(payload))["changed"] is False


# --------------------------------------------------------------------------- install


def _tarball(path: Path, top: str = "llama-b6000", worker: str = "ggml-rpc-server", extra=None) -> str:
    """A release-shaped tarball: one top folder with binaries, a library and its symlink."""
    entries = [
        (f"{top}/", "dir", b"", 0o755),
        (f"{top}/{worker}", "file", b"#!/bin/sh\necho rpc\n", 0o755),
        (f"{top}/llama-server", "file", b"#!/bin/sh\necho server\n", 0o755),
        (f"{top}/libggml-base.so.0.9.0", "file", b"ELF...", 0o644),
        (f"{top}/libggml-base.so", "sym", b"libggml-base.so.0.9.0", 0o777),
        (f"{top}/LICENSE", "file", b"MIT\n", 0o644),
        *(extra or []),
    ]
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode()
                tar.addfile(info)
            elif kind == "hard":
                info.type = tarfile.LNKTYPE
                info.linkname = data.decode()
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return _sha(path.read_bytes())


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_install_unpacks_strips_the_top_folder_and_records_a_marker(tmp_path: Path) -> None:
    archive = tmp_path / "llama-b6000-bin-ubuntu-x64.tar.gz"
    pin = _tarball(archive)
    dest = tmp_path / "opt" / "b6000"
    result = A.install(
        str(dest),
        pin,
        archive=str(archive),
        info={"build": "b6000", "flavour": "ubuntu-x64"},
        require_one_of=list(A.WORKER_BINARIES),
        require=["llama-server"],
    )
    assert result["changed"] is True
    assert result["binary"] == "ggml-rpc-server"
    assert result["found"] == ["llama-server"]
    assert _tree(dest) == [
        A.MARKER,
        "LICENSE",
        "ggml-rpc-server",
        "libggml-base.so",
        "libggml-base.so.0.9.0",
        "llama-server",
    ]
    assert os.readlink(dest / "libggml-base.so") == "libggml-base.so.0.9.0"
    assert os.access(dest / "ggml-rpc-server", os.X_OK)
    assert not os.access(dest / "LICENSE", os.X_OK)
    assert A.read_marker(str(dest)) == {"build": "b6000", "flavour": "ubuntu-x64", "sha256": pin}
    assert A.leftovers(str(tmp_path / "opt")) == []


def test_install_finds_the_older_rpc_server_name(tmp_path: Path) -> None:
    archive = tmp_path / "old.tar.gz"
    pin = _tarball(archive, top="llama-b4000", worker="rpc-server")
    result = A.install(
        str(tmp_path / "b4000"), pin, archive=str(archive), require_one_of=list(A.WORKER_BINARIES)
    )
    assert result["binary"] == "rpc-server"


def test_install_is_idempotent_by_marker_even_without_the_archive(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    pin = _tarball(archive)
    dest = tmp_path / "b6000"
    A.install(str(dest), pin, archive=str(archive), require_one_of=list(A.WORKER_BINARIES))
    archive.unlink()
    again = A.install(str(dest), pin, archive=str(archive), require_one_of=list(A.WORKER_BINARIES))
    assert again["changed"] is False and again["binary"] == "ggml-rpc-server"


def test_wrong_checksum_installs_nothing_and_keeps_the_previous_build(tmp_path: Path) -> None:
    opt = tmp_path / "opt"
    good = tmp_path / "good.tar.gz"
    good_pin = _tarball(good)
    A.install(str(opt / "b6000"), good_pin, archive=str(good))
    before = _tree(opt)
    bad = tmp_path / "next.tar.gz"
    actual = _tarball(bad, top="llama-b6001")
    with pytest.raises(A.ChecksumMismatch) as err:
        A.install(str(opt / "b6001"), "ee" * 32, archive=str(bad))
    assert "expected " + "ee" * 32 in str(err.value) and "actual " + actual in str(err.value)
    assert _tree(opt) == before  # no b6001, no staging directory
    assert not bad.exists()  # a file that fails its pin is not kept around


def test_replacing_a_build_with_another_pin_swaps_the_whole_tree(tmp_path: Path) -> None:
    opt = tmp_path / "opt"
    first = tmp_path / "1.tar.gz"
    pin1 = _tarball(first, extra=[("llama-b6000/only-in-first", "file", b"x", 0o644)])
    A.install(str(opt / "b6000"), pin1, archive=str(first))
    second = tmp_path / "2.tar.gz"
    pin2 = _tarball(second, extra=[("llama-b6000/only-in-second", "file", b"y", 0o644)])
    assert A.install(str(opt / "b6000"), pin2, archive=str(second))["changed"] is True
    assert (opt / "b6000" / "only-in-second").exists()
    assert not (opt / "b6000" / "only-in-first").exists()
    assert os.listdir(opt) == ["b6000"]


def test_a_missing_required_binary_installs_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    pin = _tarball(archive)
    with pytest.raises(A.LayoutError, match="no executable llama-cli in it"):
        A.install(
            str(tmp_path / "opt" / "b1"), pin, archive=str(archive), require=["llama-server", "llama-cli"]
        )
    assert os.listdir(tmp_path / "opt") == []


def test_an_archive_without_the_worker_binary_installs_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    pin = _tarball(archive, worker="something-else")
    with pytest.raises(A.LayoutError, match="no executable ggml-rpc-server or rpc-server"):
        A.install(
            str(tmp_path / "opt" / "b1"), pin, archive=str(archive), require_one_of=list(A.WORKER_BINARIES)
        )
    assert os.listdir(tmp_path / "opt") == []


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ([("llama-b6000/../../evil", "file", b"x", 0o644)], "unsafe path"),
        ([("/etc/evil", "file", b"x", 0o644)], "unsafe path"),
        ([("llama-b6000/passwd", "sym", b"/etc/passwd", 0o777)], "symlink leaves"),
        ([("llama-b6000/up", "sym", b"../../x", 0o777)], "symlink leaves"),
        ([("llama-b6000/h", "hard", b"/etc/shadow", 0o644)], "hard link leaves"),
        ([("llama-b6000/p", "fifo", b"", 0o644)], "unsupported member type"),
        ([("second-top/x", "file", b"x", 0o644)], "expected one top folder"),
    ],
)
def test_unsafe_or_misshapen_archives_are_refused_before_writing(tmp_path: Path, extra, needle: str) -> None:
    archive = tmp_path / "a.tar.gz"
    pin = _tarball(archive, extra=extra)
    opt = tmp_path / "opt"
    with pytest.raises(A.LayoutError, match=needle):
        A.install(str(opt / "b6000"), pin, archive=str(archive))
    assert os.listdir(opt) == []
    assert not (tmp_path / "evil").exists()


def test_a_symlink_inside_the_tree_is_allowed(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    pin = _tarball(
        archive,
        extra=[
            ("llama-b6000/lib/", "dir", b"", 0o755),
            ("llama-b6000/lib/libx.so", "sym", b"../libggml-base.so.0.9.0", 0o777),
        ],
    )
    A.install(str(tmp_path / "b6000"), pin, archive=str(archive))
    assert (tmp_path / "b6000" / "lib" / "libx.so").read_bytes() == b"ELF..."


def test_install_copies_a_built_tree_with_its_symlinks(tmp_path: Path) -> None:
    built = tmp_path / "build" / "bin"
    built.mkdir(parents=True)
    (built / "llama-server").write_bytes(b"#!/bin/sh\n")
    (built / "llama-server").chmod(0o755)
    (built / "ggml-rpc-server").write_bytes(b"#!/bin/sh\n")
    (built / "ggml-rpc-server").chmod(0o755)
    (built / "libllama.so.0.0.1").write_bytes(b"ELF")
    (built / "libllama.so").symlink_to("libllama.so.0.0.1")
    src_pin = "12" * 32
    dest = tmp_path / "opt" / "b6000"
    result = A.install(
        str(dest), src_pin, src_dir=str(built), info={"flavour": "source"}, require=["llama-server"]
    )
    assert result["changed"] is True and result["found"] == ["llama-server"]
    assert os.readlink(dest / "libllama.so") == "libllama.so.0.0.1"
    assert A.read_marker(str(dest)) == {"flavour": "source", "sha256": src_pin}
    assert A.install(str(dest), src_pin, src_dir=str(tmp_path / "gone"))["changed"] is False


def test_install_check_mode_writes_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    pin = _tarball(archive)
    result = A.install(str(tmp_path / "opt" / "b6000"), pin, archive=str(archive), check_mode=True)
    assert result["changed"] is True
    assert not (tmp_path / "opt").exists()

"""The init containers' fetch script (roles/llama_rpc/templates/kubernetes/llmfleet_fetch.py).

Run as a real process, from a directory laid out as the pods' ConfigMap volume (the script beside
``llmfleet_artifacts.py``, the collection's plugins/module_utils/artifacts.py), against a real HTTP
server on loopback (tests/support/http_mirror.py): nothing is used before its sha256 matches the
pin, a tarball is unpacked without its top folder into a directory named by its hash and switched
to last, unsafe members are refused by the systemd hosts' own policy, a download is bounded.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.hostile_http import Endless
from tests.support.http_mirror import HttpMirror

ROOT = Path(__file__).resolve().parents[3]
FETCH = ROOT / "roles" / "llama_rpc" / "templates" / "kubernetes" / "llmfleet_fetch.py"
ARTIFACTS = ROOT / "plugins" / "module_utils" / "artifacts.py"


@pytest.fixture(autouse=True)
def pod_config(tmp_path_factory) -> Path:
    """/etc/llmfleet as the ConfigMap volume lays it out (configmap.yaml.j2, the volume items)."""
    config = tmp_path_factory.mktemp("etc-llmfleet")
    shutil.copy(FETCH, config / "llmfleet_fetch.py")
    shutil.copy(ARTIFACTS, config / "llmfleet_artifacts.py")
    global SCRIPT
    SCRIPT = config / "llmfleet_fetch.py"
    return config


SCRIPT = FETCH


def fetch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def make_tarball(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    with HttpMirror(str(served)) as m:
        m.dir = served  # type: ignore[attr-defined]
        yield m


RELEASE = {
    "llama-b1/ggml-rpc-server": b"#!/bin/sh\necho rpc\n",
    "llama-b1/llama-server": b"#!/bin/sh\necho server\n",
    "llama-b1/libggml.so.0.1": b"lib",
}


def test_tarball_is_verified_unpacked_linked_and_kept(mirror, tmp_path) -> None:
    pin = make_tarball(mirror.dir / "llama.tar.gz", RELEASE, {"llama-b1/libggml.so.0": "libggml.so.0.1"})
    dest = tmp_path / "llama.cpp"
    proc = fetch("tarball", "--url", mirror.url_for("llama.tar.gz"), "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 0, proc.stderr
    current = dest / "current"
    assert current.resolve() == (dest / pin[:16]).resolve()
    assert (current / "llama-server").read_bytes() == RELEASE["llama-b1/llama-server"]
    assert (current / "llmfleet-rpc-server").resolve() == (current / "ggml-rpc-server").resolve()
    assert (current / "libggml.so.0").read_bytes() == b"lib"
    assert sorted(p.name for p in dest.iterdir()) == sorted(["current", pin[:16]])
    again = fetch("tarball", "--url", mirror.url_for("gone.tar.gz"), "--sha256", pin, "--dest", str(dest))
    assert again.returncode == 0 and "already unpacked" in again.stderr


def test_an_older_release_with_rpc_server_gets_the_same_link(mirror, tmp_path) -> None:
    pin = make_tarball(
        mirror.dir / "old.tar.gz", {"llama-b0/rpc-server": b"rpc", "llama-b0/llama-server": b"server"}
    )
    dest = tmp_path / "llama.cpp"
    assert (
        fetch(
            "tarball", "--url", mirror.url_for("old.tar.gz"), "--sha256", pin, "--dest", str(dest)
        ).returncode
        == 0
    )
    assert (dest / "current" / "llmfleet-rpc-server").read_bytes() == b"rpc"


def test_a_tarball_that_does_not_match_its_pin_is_never_unpacked(mirror, tmp_path) -> None:
    actual = make_tarball(mirror.dir / "llama.tar.gz", RELEASE)
    pin = "0" * 64
    dest = tmp_path / "llama.cpp"
    proc = fetch("tarball", "--url", mirror.url_for("llama.tar.gz"), "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 1
    assert actual in proc.stderr and pin in proc.stderr
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(
    ("members", "links"),
    [
        ({"llama-b1/../../evil": b"x", "llama-b1/llama-server": b"s"}, None),
        ({"llama-b1/llama-server": b"s", "llama-b1/ggml-rpc-server": b"r"}, {"llama-b1/esc": "/etc/passwd"}),
        ({"llama-b1/llama-server": b"s", "llama-b1/ggml-rpc-server": b"r"}, {"llama-b1/esc": "../../etc"}),
    ],
    ids=["dotdot", "absolute-link", "escaping-link"],
)
def test_unsafe_members_are_refused(mirror, tmp_path, members, links) -> None:
    pin = make_tarball(mirror.dir / "bad.tar.gz", members, links)
    dest = tmp_path / "llama.cpp"
    proc = fetch("tarball", "--url", mirror.url_for("bad.tar.gz"), "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 1 and ("unsafe path" in proc.stderr or "leaves the archive" in proc.stderr)
    assert not (dest / "current").exists()
    assert not (tmp_path / "evil").exists()


def test_a_model_file_is_verified_recorded_and_replaced_when_corrupt(mirror, tmp_path) -> None:
    (mirror.dir / "m.gguf").write_bytes(b"GGUF" + b"\0" * 1000)
    pin = hashlib.sha256((mirror.dir / "m.gguf").read_bytes()).hexdigest()
    dest = tmp_path / "models" / "m.gguf"
    url = mirror.url_for("m.gguf")
    assert fetch("file", "--url", url, "--sha256", pin, "--dest", str(dest)).returncode == 0
    assert dest.read_bytes() == (mirror.dir / "m.gguf").read_bytes()
    assert Path(f"{dest}.sha256").read_text().split()[0] == pin
    sent = mirror.bytes_sent["/m.gguf"]
    assert "verified before" in fetch("file", "--url", url, "--sha256", pin, "--dest", str(dest)).stderr
    assert mirror.bytes_sent["/m.gguf"] == sent, "a verified file is not downloaded again"
    Path(f"{dest}.sha256").unlink()
    dest.write_bytes(b"corrupt")
    proc = fetch("file", "--url", url, "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 0 and "downloaded again" in proc.stderr
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == pin


def test_a_model_that_does_not_match_is_not_left_behind(mirror, tmp_path) -> None:
    (mirror.dir / "m.gguf").write_bytes(b"GGUF-other")
    dest = tmp_path / "models" / "m.gguf"
    proc = fetch("file", "--url", mirror.url_for("m.gguf"), "--sha256", "1" * 64, "--dest", str(dest))
    assert proc.returncode == 1 and "sha256 mismatch" in proc.stderr
    assert list(dest.parent.iterdir()) == []


def test_a_malformed_pin_is_refused_before_any_download(mirror, tmp_path) -> None:
    proc = fetch("file", "--url", mirror.url_for("m.gguf"), "--sha256", "abc", "--dest", str(tmp_path / "m"))
    assert proc.returncode == 1 and "not 64 hex digits" in proc.stderr
    assert mirror.requests == []


def test_the_fetch_script_has_no_archive_or_download_code_of_its_own() -> None:
    """One policy for both targets: the script calls the collection's artifacts module, it does
    not carry a second tar walker, hasher or downloader."""
    text = FETCH.read_text()
    assert "import llmfleet_artifacts as artifacts" in text
    for own_copy in ("import tarfile", "import hashlib", "extractall", "getmembers", ".read(CHUNK"):
        assert own_copy not in text, own_copy


# --------------------------------------------------------------------------------------------------
# Issue 31: one archive policy for both targets (item 11), a bounded download (item 7)
# --------------------------------------------------------------------------------------------------


def _tar_with(path: Path, entries: list[tuple[str, str, bytes | str]]) -> str:
    """A tarball of (name, kind, data-or-linkname) in order: kind is file, dir, sym or hard."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, value in entries:
            info = tarfile.TarInfo(name)
            info.mode = 0o755
            if kind == "file":
                assert isinstance(value, bytes)
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE}[kind]
            if kind != "dir":
                info.linkname = str(value)
            tar.addfile(info)
    return hashlib.sha256(path.read_bytes()).hexdigest()


BINARIES = [
    ("llama-b1/llama-server", "file", b"server"),
    ("llama-b1/ggml-rpc-server", "file", b"rpc"),
]


def test_a_chain_of_symlinks_cannot_carry_a_file_out_of_the_tree(mirror, tmp_path) -> None:
    """Each link on its own stays inside (a/b -> .., a/b/c -> .., a/b/c/d -> ..), but followed in a
    row they climb out; a file written below them would land beside the destination."""
    pin = _tar_with(
        mirror.dir / "chain.tar.gz",
        [
            *BINARIES,
            ("llama-b1/a", "dir", ""),
            ("llama-b1/a/b", "sym", ".."),
            ("llama-b1/a/b/c", "sym", ".."),
            ("llama-b1/a/b/c/d", "sym", ".."),
            ("llama-b1/a/b/c/d/evil", "file", b"outside"),
        ],
    )
    dest = tmp_path / "llama.cpp"
    proc = fetch("tarball", "--url", mirror.url_for("chain.tar.gz"), "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 1, proc.stderr
    assert "below a symlink" in proc.stderr or "leaves the archive" in proc.stderr
    assert not (tmp_path / "evil").exists() and not (dest / "evil").exists()
    assert not (dest / "current").exists()


def test_a_hard_link_cannot_reach_the_model_and_overwrite_it(mirror, tmp_path) -> None:
    """The Deployment's volume holds llama.cpp/ and models/ side by side: a hard link to the model
    followed by a file of the same name would write into the model, which its marker then keeps."""
    model = b"GGUF" + bytes(range(256)) * 4
    (mirror.dir / "m.gguf").write_bytes(model)
    model_pin = hashlib.sha256(model).hexdigest()
    data = tmp_path / "data"
    model_path = data / "models" / "m.gguf"
    assert (
        fetch(
            "file", "--url", mirror.url_for("m.gguf"), "--sha256", model_pin, "--dest", str(model_path)
        ).returncode
        == 0
    )
    pin = _tar_with(
        mirror.dir / "hard.tar.gz",
        [
            *BINARIES,
            ("llama-b1/bin/x/h", "hard", "llama-b1/../../models/m.gguf"),
            ("llama-b1/bin/x/h", "file", b"EVIL" * 10),
        ],
    )
    dest = data / "llama.cpp"
    proc = fetch("tarball", "--url", mirror.url_for("hard.tar.gz"), "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 1, proc.stderr
    assert model_path.read_bytes() == model
    again = fetch("file", "--url", mirror.url_for("m.gguf"), "--sha256", model_pin, "--dest", str(model_path))
    assert again.returncode == 0 and model_path.read_bytes() == model


def test_a_model_changed_in_place_is_hashed_again_not_kept_by_its_marker(mirror, tmp_path) -> None:
    model = b"GGUF" + bytes(range(256)) * 4
    (mirror.dir / "m.gguf").write_bytes(model)
    pin = hashlib.sha256(model).hexdigest()
    dest = tmp_path / "models" / "m.gguf"
    url = mirror.url_for("m.gguf")
    assert fetch("file", "--url", url, "--sha256", pin, "--dest", str(dest)).returncode == 0
    with open(dest, "r+b") as handle:  # same size, same inode, other bytes
        handle.write(b"EVIL")
    proc = fetch("file", "--url", url, "--sha256", pin, "--dest", str(dest))
    assert proc.returncode == 0 and "verified before" not in proc.stderr
    assert dest.read_bytes() == model


def test_a_model_without_content_length_stops_at_its_pinned_size(tmp_path) -> None:
    dest = tmp_path / "models" / "m.gguf"
    with Endless(16 << 20) as server:
        proc = fetch(
            "file", "--url", server.url, "--sha256", "a" * 64, "--dest", str(dest), "--size", str(1 << 20)
        )
    assert proc.returncode == 1 and "more than the 1048576 bytes the pin recorded" in proc.stderr
    assert sorted(p.name for p in dest.parent.iterdir()) == []


def test_a_download_stops_at_the_free_space_less_the_reserve(tmp_path) -> None:
    """No size known: the reserve leaves about 2 MiB of the file system's free space usable."""
    dest = tmp_path / "models" / "m.gguf"
    dest.parent.mkdir()
    st = os.statvfs(dest.parent)
    reserve_mib = st.f_bavail * st.f_frsize / (1 << 20) - 2
    with Endless(64 << 20) as server:
        proc = fetch(
            "file",
            "--url",
            server.url,
            "--sha256",
            "a" * 64,
            "--dest",
            str(dest),
            "--reserve-mib",
            f"{reserve_mib:.3f}",
        )
    assert proc.returncode == 1 and "disk space" in proc.stderr, proc.stderr
    assert list(dest.parent.iterdir()) == []

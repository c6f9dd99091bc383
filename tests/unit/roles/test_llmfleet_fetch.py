"""The init containers' fetch script (roles/llama_rpc/templates/kubernetes/llmfleet_fetch.py).

Run as a real process against a real HTTP server on loopback (tests/support/http_mirror.py):
nothing is used before its sha256 matches the pin, a tarball is unpacked without its top folder
into a directory named by its hash and switched to last, unsafe members are refused.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.http_mirror import HttpMirror

ROOT = Path(__file__).resolve().parents[3]
FETCH = ROOT / "roles" / "llama_rpc" / "templates" / "kubernetes" / "llmfleet_fetch.py"


def fetch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(FETCH), *args], capture_output=True, text=True, timeout=60, check=False
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
    assert proc.returncode == 1 and "refusing" in proc.stderr
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
    assert proc.returncode == 0 and "downloading again" in proc.stderr
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == pin


def test_a_model_that_does_not_match_is_not_left_behind(mirror, tmp_path) -> None:
    (mirror.dir / "m.gguf").write_bytes(b"GGUF-other")
    dest = tmp_path / "models" / "m.gguf"
    proc = fetch("file", "--url", mirror.url_for("m.gguf"), "--sha256", "1" * 64, "--dest", str(dest))
    assert proc.returncode == 1 and "does not match the pinned" in proc.stderr
    assert list(dest.parent.iterdir()) == []


def test_a_malformed_pin_is_refused_before_any_download(mirror, tmp_path) -> None:
    proc = fetch("file", "--url", mirror.url_for("m.gguf"), "--sha256", "abc", "--dest", str(tmp_path / "m"))
    assert proc.returncode == 1 and "not 64 hex digits" in proc.stderr
    assert mirror.requests == []


@pytest.mark.parametrize("size", [0, 1, 1024 * 1024, 1024 * 1024 + 1, 3 * 1024 * 1024 + 17])
def test_the_fetch_script_hashes_as_the_collection_does(tmp_path, size) -> None:
    """Two copies of sha256-of-a-file, kept on purpose (docs/development.md): the pods' script
    cannot import the collection. Both must give hashlib's digest of the whole content."""
    import importlib.util

    from ansible_collections.llmfleet.cluster.plugins.module_utils import artifacts

    spec = importlib.util.spec_from_file_location("llmfleet_fetch_under_test", FETCH)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    path = tmp_path / "blob"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert script.sha256_of(str(path)) == expected
    assert artifacts.sha256_file(str(path)) == expected

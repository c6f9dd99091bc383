"""The RPC protocol version of a llama.cpp source, and llama.cpp's rule for a head and a worker.

The pinned source (llama-cpp-python 0.3.36's vendored tree, commit 0c1e570) declares it in
ggml/include/ggml-rpc.h (``#define RPC_PROTO_MAJOR_VERSION 7``, minor 0, patch 0); its client
checks it in ggml/src/ggml-rpc/ggml-rpc.cpp, ``negotiate_hello``.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import artifacts as A

ROOT = Path(__file__).resolve().parents[4]
CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
SDIST = CACHE / "src" / "llama_cpp_python-0.3.36.tar.gz"
DIST_SOURCE = CACHE / "dist" / "llama.cpp-b0c1e570-src.tar.gz"

HEADER = """#pragma once

#include "ggml-backend.h"

#define RPC_PROTO_MAJOR_VERSION    7
#define RPC_PROTO_MINOR_VERSION    0
#define RPC_PROTO_PATCH_VERSION    0

#define GGML_RPC_MAX_SERVERS       16
"""


def test_the_header_gives_major_minor_patch() -> None:
    assert A.rpc_proto_from_header(HEADER) == "7.0.0"
    assert A.rpc_proto_from_header(HEADER.replace("MINOR_VERSION    0", "MINOR_VERSION 12")) == "7.12.0"
    assert A.rpc_proto_from_header("#pragma once\n// no versioned HELLO yet\n") is None
    with pytest.raises(A.ArtifactError, match=r"no RPC_PROTO_PATCH_VERSION"):
        A.rpc_proto_from_header(HEADER.replace("#define RPC_PROTO_PATCH_VERSION    0\n", ""))
    with pytest.raises(A.ArtifactError, match=r"defined twice"):
        A.rpc_proto_from_header(HEADER + "#define RPC_PROTO_MAJOR_VERSION 8\n")


@pytest.mark.parametrize("bad", ["7", "7.0", "v7.0.0", "7.0.0.1", "", None, 7, "seven"])
def test_a_version_is_major_minor_patch(bad) -> None:
    with pytest.raises(A.ArtifactError, match=r"MAJOR.MINOR.PATCH"):
        A.parse_rpc_proto(bad)


@pytest.mark.parametrize(
    ("head", "worker", "ok"),
    [
        ("7.0.0", "7.0.0", True),
        ("7.0.0", "8.0.0", False),
        ("8.0.0", "7.0.0", False),
        ("7.1.0", "7.0.0", True),
        ("7.0.0", "7.1.0", False),
        ("7.0.0", "7.0.9", True),
    ],
)
def test_rpc_compatible_is_negotiate_hello(head: str, worker: str, ok: bool) -> None:
    assert A.rpc_compatible(head, worker) is ok


def _source_tarball(path: Path, top: str, header: str | None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in [("README.md", "llama.cpp\n"), ("ggml/include/ggml-rpc.h", header)]:
            if text is None:
                continue
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_source_tarball_or_tree_gives_its_version(tmp_path: Path) -> None:
    assert (
        A.rpc_proto_from_source(str(_source_tarball(tmp_path / "a.tar.gz", "llama.cpp-b6000", HEADER)))
        == "7.0.0"
    )
    assert A.rpc_proto_from_source(str(_source_tarball(tmp_path / "b.tar.gz", "", HEADER))) == "7.0.0"
    tree = tmp_path / "tree" / "ggml" / "include"
    tree.mkdir(parents=True)
    (tree / "ggml-rpc.h").write_text(HEADER.replace("MAJOR_VERSION    7", "MAJOR_VERSION 8"))
    assert A.rpc_proto_from_source(str(tmp_path / "tree")) == "8.0.0"
    with pytest.raises(A.ArtifactError, match=r"no ggml/include/ggml-rpc.h in this source tarball"):
        A.rpc_proto_from_source(str(_source_tarball(tmp_path / "c.tar.gz", "x", None)))
    (tmp_path / "d.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(A.ArtifactError, match=r"d.tar.gz: cannot read this source tarball"):
        A.rpc_proto_from_source(str(tmp_path / "d.tar.gz"))
    big = _source_tarball(tmp_path / "e.tar.gz", "x", HEADER + "//" * A.RPC_HEADER_MAX)
    with pytest.raises(A.ArtifactError, match=r"not a ggml-rpc.h"):
        A.rpc_proto_from_source(str(big))


@pytest.mark.parametrize("source", [SDIST, DIST_SOURCE], ids=["sdist", "dist-source"])
def test_the_pinned_source_speaks_7_0_0(source: Path) -> None:
    # The project's own builds (scripts/build-llama-cpp.sh) are made from this tree, every flavour.
    if not source.exists():
        pytest.skip(f"{source} is written by make test-artifacts")
    assert A.rpc_proto_from_source(str(source)) == "7.0.0"


def test_select_release_returns_the_recorded_version() -> None:
    table = {
        "b6000": {
            "ubuntu-arm64": {"url": "https://m/llama-b6000-bin-ubuntu-arm64.tar.gz", "sha256": "ab" * 32}
        }
    }
    assert A.select_release(table, "b6000", "ubuntu-arm64")["rpc_proto"] is None
    table["b6000"]["ubuntu-arm64"]["rpc_proto"] = " 7.0.0 "
    assert A.select_release(table, "b6000", "ubuntu-arm64")["rpc_proto"] == "7.0.0"
    table["b6000"]["ubuntu-arm64"]["rpc_proto"] = "7"
    with pytest.raises(A.ReleaseLookupError, match=r"pi5: release table entry b6000/ubuntu-arm64 rpc_proto"):
        A.select_release(table, "b6000", "ubuntu-arm64", "pi5")


def test_the_lookup_reads_the_source_it_is_given(tmp_path: Path) -> None:
    from ansible.errors import AnsibleLookupError
    from ansible_collections.llmfleet.cluster.plugins.lookup.llama_cpp_rpc_proto import LookupModule

    lookup = LookupModule()
    good = _source_tarball(tmp_path / "a.tar.gz", "llama.cpp-b6000", HEADER)
    old = _source_tarball(tmp_path / "b.tar.gz", "llama.cpp-b3000", "#pragma once\n")
    assert lookup.run([str(good), str(old)]) == ["7.0.0", None]
    with pytest.raises(AnsibleLookupError, match=r"^llmfleet.cluster.llama_cpp_rpc_proto: .*nothing.tar.gz"):
        lookup.run([str(tmp_path / "nothing.tar.gz")])

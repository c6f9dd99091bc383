"""The lock records each llama.cpp pin's RPC protocol version, from the tag's own ggml-rpc.h.

Every asset of a release is built from the tag's commit, so the version read from the tag's
ggml/include/ggml-rpc.h (GitHub's contents API) is every flavour's; the plan compares them
(plugins/plugin_utils/rpc_fleet.py).
"""

from __future__ import annotations

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import release_lock as rl

from tests.support.fake_release_sources import Asset, Fake, FakeReleaseSources

LLAMA = "ggml-org/llama.cpp"
HEADER = b"#pragma once\n#define RPC_PROTO_MAJOR_VERSION    7\n#define RPC_PROTO_MINOR_VERSION    0\n"
HEADER += b"#define RPC_PROTO_PATCH_VERSION    0\n" + b"// padding\n" * 40


@pytest.fixture
def fake():
    state = Fake()
    state.releases[(LLAMA, "b9999")] = [
        Asset("llama-b9999-bin-ubuntu-x64.tar.gz", b"x64"),
        Asset("llama-b9999-bin-ubuntu-arm64.tar.gz", b"arm64"),
    ]
    state.tarballs[(LLAMA, "b9999")] = b"source"
    state.sources[(LLAMA, "b9999")] = {"ggml/include/ggml-rpc.h": HEADER}
    with FakeReleaseSources(state) as served:
        yield served


NEEDS = {"desk": "ubuntu-x64", "pi5": "ubuntu-arm64", "nas": "source"}


def test_every_flavour_of_the_tag_records_the_tags_version(fake: Fake) -> None:
    lock = rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", NEEDS)
    table = lock["releases"]["b9999"]
    assert {f: (e["rpc_proto"], e["rpc_proto_from"]) for f, e in table.items()} == {
        f: ("7.0.0", "ggml/include/ggml-rpc.h at b9999") for f in ("ubuntu-x64", "ubuntu-arm64", "source")
    }
    assert f"GET /api/repos/{LLAMA}/contents/ggml/include/ggml-rpc.h" in fake.requests
    assert any("RPC protocol 7.0.0) for pi5" in line for line in rl.summary({"llama_cpp": lock}))


def test_a_tag_without_the_header_records_no_version(fake: Fake) -> None:
    fake.sources.clear()  # an old tree (ggml-rpc.h elsewhere): 404
    table = rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", NEEDS)["releases"]["b9999"]
    assert not [e for e in table.values() if "rpc_proto" in e]
    fake.sources[(LLAMA, "b9999")] = {"ggml/include/ggml-rpc.h": b"#pragma once\n"}  # before versioning
    table = rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", NEEDS)["releases"]["b9999"]
    assert not [e for e in table.values() if "rpc_proto" in e]


def test_a_header_of_three_partial_versions_is_refused_naming_it(fake: Fake) -> None:
    fake.sources[(LLAMA, "b9999")] = {"ggml/include/ggml-rpc.h": b"#define RPC_PROTO_MAJOR_VERSION 7\n"}
    with pytest.raises(rl.LockError) as err:
        rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", NEEDS)
    assert "ggml/include/ggml-rpc.h of ggml-org/llama.cpp at b9999" in str(err.value)
    assert "no RPC_PROTO_MINOR_VERSION" in str(err.value)


def test_the_contents_answer_is_read_under_the_json_cap(fake: Fake) -> None:
    fake.sources[(LLAMA, "b9999")] = {"ggml/include/ggml-rpc.h": HEADER + b"// x\n" * 4000}
    with pytest.raises(rl.LockError, match=r"more than the 8192"):
        rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", NEEDS, max_json=8192)


def test_no_llama_cpp_host_asks_nothing_of_the_contents_api(fake: Fake) -> None:
    lock = rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", {"k3s-only": ""})
    assert lock["releases"]["b9999"] == {}
    assert not [r for r in fake.requests if "/contents/" in r]

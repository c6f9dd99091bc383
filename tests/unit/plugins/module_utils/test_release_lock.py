"""release_lock against the local stand-in of GitHub's release API, its downloads and Hugging Face.

Expected hashes are computed here from the bytes the fake serves, never taken from the code.
"""

from __future__ import annotations

import hashlib

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import release_lock as rl

from tests.support.fake_release_sources import Asset, Fake, FakeReleaseSources, HfFile

LLAMA = "ggml-org/llama.cpp"
K3S = "k3s-io/k3s"
COMMIT = "9ba40c488bf8e7fbe85f8e7998d3ac2bce6973ae"
X64 = b"x64 build bytes"
ARM = b"arm64 build bytes"
OLD = b"an asset from before digests"
SRC = b"source tarball bytes"
K3S_AMD = b"k3s amd64 binary"
K3S_ARM = b"k3s arm64 binary"
GGUF = b"GGUF" + bytes(range(256)) * 8


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def k3s_assets(version: str, sums_amd=None) -> list:
    amd = sums_amd or sha(K3S_AMD)
    return [
        Asset("k3s", K3S_AMD),
        Asset("k3s-arm64", K3S_ARM),
        Asset("sha256sum-amd64.txt", f"{amd}  k3s\n{sha(b'airgap')}  k3s-airgap-images-amd64.tar\n".encode()),
        Asset("sha256sum-arm64.txt", f"{sha(K3S_ARM)}  k3s-arm64\n".encode()),
    ]


@pytest.fixture
def fake():
    state = Fake()
    state.releases[(LLAMA, "b9999")] = [
        Asset("llama-b9999-bin-ubuntu-x64.tar.gz", X64),
        Asset("llama-b9999-bin-ubuntu-arm64.tar.gz", ARM),
        Asset("llama-b9999-bin-ubuntu-vulkan-x64.zip", OLD, digest=False),
    ]
    state.tarballs[(LLAMA, "b9999")] = SRC
    state.releases[(K3S, "v1.33.4+k3s1")] = k3s_assets("v1.33.4+k3s1")
    state.hf_refs["acme/tiny-GGUF"] = {"main": COMMIT, COMMIT: COMMIT}
    state.hf_files[("acme/tiny-GGUF", COMMIT, "tiny-Q8_0.gguf")] = HfFile(GGUF)
    state.hf_files[("acme/tiny-GGUF", COMMIT, "README.md")] = HfFile(b"# tiny\n", lfs=False)
    with FakeReleaseSources(state) as served:
        yield served


def test_llama_cpp_pins_only_the_needed_flavours_by_digest_and_hashes_the_rest_once(fake):
    http = rl.Http(timeout=5, deadline=10)
    needs = {
        "head": "ubuntu-x64",
        "warm": "ubuntu-arm64",
        "wold": "source",
        "gpu": "ubuntu-vulkan-x64",
        "x": "",
    }
    lock = rl.lock_llama_cpp(http, fake.github_api, LLAMA, "b9999", needs)
    table = lock["releases"]["b9999"]
    assert set(table) == {"ubuntu-x64", "ubuntu-arm64", "source", "ubuntu-vulkan-x64"}
    assert table["ubuntu-x64"]["sha256"] == sha(X64) and table["ubuntu-x64"]["sha256_from"] == "github-digest"
    assert table["ubuntu-arm64"]["hosts"] == ["warm"]
    assert table["source"] == {
        "url": f"{fake.github_api}/repos/{LLAMA}/tarball/b9999",
        "sha256": sha(SRC),
        "size": len(SRC),
        "sha256_from": "downloaded",
        "hosts": ["wold"],
    }
    assert table["ubuntu-vulkan-x64"]["sha256"] == sha(OLD)
    assert table["ubuntu-vulkan-x64"]["sha256_from"] == "downloaded"
    downloads = [r for r in fake.requests if "codeload" in r or "releases/download" in r]
    assert len(downloads) == 2  # the tarball and the digest-less asset; the digested ones are not fetched
    # A second run with the first lock as `previous` downloads nothing again.
    fake.requests.clear()
    again = rl.lock_llama_cpp(http, fake.github_api, LLAMA, "b9999", needs, previous=lock)
    assert again == lock
    assert not [r for r in fake.requests if "codeload" in r or "releases/download" in r]


def test_a_release_without_the_asset_a_host_needs_is_refused_naming_it(fake):
    fake.releases[(LLAMA, "b9998")] = [Asset("llama-b9998-bin-ubuntu-x64.tar.gz", X64)]
    with pytest.raises(rl.LockError) as err:
        rl.lock_llama_cpp(
            rl.Http(), fake.github_api, LLAMA, "b9998", {"head": "ubuntu-x64", "warm": "ubuntu-arm64"}
        )
    text = str(err.value)
    assert "llama-b9998-bin-ubuntu-arm64.tar.gz" in text and "warm (ubuntu-arm64)" in text
    assert f"{fake.github_api}/repos/{LLAMA}/releases/tags/b9998" in text


def test_missing_tag_rate_limit_and_oversized_answers_are_refused(fake):
    with pytest.raises(
        rl.LockError, match=r"release b1 of ggml-org/llama.cpp \(http.*\): not found: Not Found"
    ):
        rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b1", {"head": "ubuntu-x64"})
    fake.padding["b9999"] = 20000
    with pytest.raises(rl.LockError, match=r"bytes \(Content-Length\), more than the 10000 allowed"):
        rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", {"head": "ubuntu-x64"}, max_json=10000)
    fake.padding.clear()
    fake.rate_limited = True
    with pytest.raises(rl.LockError, match=r"rate limited \(HTTP 403, X-RateLimit-Reset 1764612000\)"):
        rl.lock_llama_cpp(rl.Http(), fake.github_api, LLAMA, "b9999", {"head": "ubuntu-x64"})


def test_a_digest_that_is_not_sha256_is_refused():
    with pytest.raises(rl.LockError, match="'md5:abc'"):
        rl.asset_digest({"name": "x", "digest": "md5:abc"}, "GitHub API")
    assert rl.asset_digest({"name": "x", "digest": None}, "GitHub API") is None


def test_k3s_from_its_sums_file_checked_against_github(fake):
    lock = rl.lock_k3s(rl.Http(), fake.github_api, K3S, "v1.33.4+k3s1", {"head": "amd64", "warm": "arm64"})
    table = lock["releases"]["v1.33.4+k3s1"]
    assert table["amd64"]["sha256"] == sha(K3S_AMD) and table["arm64"]["sha256"] == sha(K3S_ARM)
    assert table["amd64"]["url"].endswith("/k3s-io/k3s/releases/download/v1.33.4%2Bk3s1/k3s")
    # The sums file disagrees with GitHub's digest of the binary: both refused.
    fake.releases[(K3S, "v1.33.5+k3s1")] = k3s_assets("v1.33.5+k3s1", sums_amd="66" * 32)
    with pytest.raises(rl.LockError) as err:
        rl.lock_k3s(rl.Http(), fake.github_api, K3S, "v1.33.5+k3s1", {"head": "amd64"})
    assert "says k3s is " + "66" * 32 in str(err.value) and sha(K3S_AMD) in str(err.value)
    # A release without the arm64 sums file refuses the hosts that need it.
    fake.releases[(K3S, "v1.33.6+k3s1")] = [a for a in k3s_assets("v") if "arm64" not in a.name]
    with pytest.raises(rl.LockError, match=r"has no sha256sum-arm64.txt, which warm \(arm64\) need"):
        rl.lock_k3s(rl.Http(), fake.github_api, K3S, "v1.33.6+k3s1", {"head": "amd64", "warm": "arm64"})


def test_hf_revision_resolved_to_its_commit_and_the_url_pinned(fake):
    model = {"hf_repo": "acme/tiny-GGUF", "hf_file": "tiny-Q8_0.gguf", "hf_revision": "main"}
    pin = rl.lock_hf_model(rl.Http(), fake.hf_endpoint, model)
    assert pin["commit"] == COMMIT
    assert pin["url"] == f"{fake.hf_endpoint}/acme/tiny-GGUF/resolve/{COMMIT}/tiny-Q8_0.gguf"
    assert pin["sha256"] == sha(GGUF) and pin["size"] == len(GGUF) and pin["sha256_from"] == "x-linked-etag"
    assert not [r for r in fake.requests if r.startswith("GET")]  # one HEAD, nothing downloaded
    small = rl.lock_hf_model(rl.Http(), fake.hf_endpoint, dict(model, hf_file="README.md"))
    assert small["sha256"] == sha(b"# tiny\n") and small["sha256_from"] == "downloaded"
    with pytest.raises(rl.LockError, match=r"not found \(X-Error-Code RevisionNotFound\)"):
        rl.lock_hf_model(rl.Http(), fake.hf_endpoint, dict(model, hf_revision="nope"))
    with pytest.raises(rl.LockError, match=r"not found \(X-Error-Code EntryNotFound\)"):
        rl.lock_hf_model(rl.Http(), fake.hf_endpoint, dict(model, hf_file="other.gguf"))


def test_the_token_goes_only_to_its_own_host(fake):
    seen = []

    class Opener:
        def __init__(self):
            self.inner = rl.build_opener(rl._NoRedirect).open

        def __call__(self, req, timeout):
            seen.append((req.full_url, req.get_header("Authorization")))
            return self.inner(req, timeout=timeout)

    tokens = {"api.example.invalid": "Bearer secret"}
    http = rl.Http(tokens=tokens, opener=Opener())
    rl.lock_llama_cpp(http, fake.github_api, LLAMA, "b9999", {"head": "ubuntu-x64"})
    assert seen and all(auth is None for _unused, auth in seen)


def test_model_from_lock_fills_only_what_the_inventory_left_empty():
    lock = {
        "model": {
            "hf_repo": "acme/tiny-GGUF",
            "hf_file": "tiny-Q8_0.gguf",
            "hf_revision": "main",
            "url": "http://h/acme/tiny-GGUF/resolve/c/tiny-Q8_0.gguf",
            "sha256": "aa" * 32,
        }
    }
    model = {"name": "tiny", "hf_repo": "acme/tiny-GGUF", "hf_file": "tiny-Q8_0.gguf"}
    merged = rl.model_from_lock(model, lock)
    assert merged["url"] == lock["model"]["url"] and merged["sha256"] == "aa" * 32
    own = dict(model, url="http://mirror/x.gguf", sha256="bb" * 32)
    assert rl.model_from_lock(own, lock) == own
    assert rl.model_from_lock(model, {}) == model
    with pytest.raises(rl.LockError, match=r"run playbooks/lock\.yml again"):
        rl.model_from_lock(dict(model, hf_revision="v2"), lock)


def test_model_from_lock_carries_the_size_of_the_pinned_file_only():
    """The download stops at the lock's size (issue 31 item 7), which is the size of the file the
    lock's sha256 is of: an inventory pinning another sha256 gets no size from the lock."""
    pinned = {
        "hf_repo": "acme/tiny-GGUF",
        "hf_file": "tiny-Q8_0.gguf",
        "hf_revision": "main",
        "url": "http://h/acme/tiny-GGUF/resolve/c/tiny-Q8_0.gguf",
        "sha256": "aa" * 32,
        "size": 12345,
    }
    model = {"name": "tiny", "hf_repo": "acme/tiny-GGUF", "hf_file": "tiny-Q8_0.gguf"}
    assert rl.model_from_lock(model, {"model": pinned})["size"] == 12345
    assert "size" not in rl.model_from_lock(dict(model, sha256="bb" * 32), {"model": pinned})
    assert rl.model_from_lock(dict(model, size=7), {"model": pinned})["size"] == 7

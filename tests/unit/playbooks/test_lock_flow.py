"""playbooks/lock.yml end to end against the local stand-in of GitHub, its downloads and Hugging Face.

The fleet is three what-if hosts on the controller (ansible_connection=local): head (ubuntu-x64,
amd64, k3s server), warm (ubuntu-arm64, arm64, k3s agent) and wold (a source build). The flow:
lock.yml writes the lock; a second run changes nothing; --check --diff shows an upstream change
without writing it; the k3s and model roles then install what the lock pins (no pin in the
inventory); the llama_cpp role refuses a tampered asset naming both hashes. Refusals of lock.yml
itself (a release without the arm64 asset, a k3s sums file GitHub's digest contradicts, an answer
over the size cap) leave the lock file as it was. Expected hashes are computed here from the bytes
the fake serves.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.ansible_env import ansible_env
from tests.support.fake_release_sources import Asset, Fake, FakeReleaseSources, HfFile
from tests.support.gguf_gen import SHAPES, write_tiny_llama

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "tests" / "fixtures" / "k3s" / "k3s-standin"
LLAMA, K3S, REPO = "ggml-org/llama.cpp", "k3s-io/k3s", "acme/tiny-GGUF"
COMMIT = "9ba40c488bf8e7fbe85f8e7998d3ac2bce6973ae"
X64, ARM, SRC = b"llama x64 build", b"llama arm64 build", b"llama source tarball"
K3S_ARM = b"k3s arm64 binary"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook not on PATH"),
]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def k3s_assets(amd_sum: str | None = None, arm: bool = True) -> list[Asset]:
    k3s = STANDIN.read_bytes()
    assets = [
        Asset("k3s", k3s),
        Asset("sha256sum-amd64.txt", f"{amd_sum or sha(k3s)}  k3s\n".encode()),
    ]
    if arm:
        assets += [
            Asset("k3s-arm64", K3S_ARM),
            Asset("sha256sum-arm64.txt", f"{sha(K3S_ARM)}  k3s-arm64\n".encode()),
        ]
    return assets


def host(flavour: str, arch: str, kube_arch: str, address: str) -> dict:
    return {
        "llmfleet_host": {
            "arch": arch,
            "kube_arch": kube_arch,
            "cpus": 2,
            "isa": [],
            "default_ipv4": address,
            "memory": {"usable_mib": 400},
            "backends": {
                "llama_cpp": {"status": "release", "flavour": flavour},
                "vllm_cpu": {"status": "unsupported"},
            },
        }
    }


def write_inventory(tmp: Path, fake: Fake) -> Path:
    inv = tmp / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    fleet = {
        "ansible_connection": "local",
        "ansible_python_interpreter": shutil.which("python3") or "/usr/bin/python3",
        "llmfleet_github_api": fake.github_api,
        "llmfleet_hf_endpoint": fake.hf_endpoint,
        "llama_cpp_build": "b9999",
        "k3s_version": "v1.33.4+k3s1",
        "llmfleet_model": {
            "name": "tiny",
            "hf_repo": REPO,
            "hf_file": "tiny-Q8_0.gguf",
            "hf_revision": "main",
        },
    }
    (inv / "group_vars" / "all" / "fleet.yml").write_text(yaml.safe_dump(fleet))
    hosts = {
        "all": {
            "children": {
                "llm_head": {"hosts": {"head": host("ubuntu-x64", "x86_64", "amd64", "10.89.0.2")}},
                "llm_workers": {
                    "hosts": {
                        "warm": host("ubuntu-arm64", "aarch64", "arm64", "10.89.0.3"),
                        "wold": host("source", "x86_64", "amd64", "10.89.0.4"),
                    }
                },
                "k3s_server": {"hosts": {"head": {}}},
                "k3s_agent": {"hosts": {"warm": {}}},
            }
        }
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def start(inv: Path, playbook: str | Path, *extra: str) -> subprocess.Popen:
    env = ansible_env()
    env.pop("ANSIBLE_LOG_PATH", None)
    env.pop("GITHUB_TOKEN", None)
    cmd = ["ansible-playbook", "-i", str(inv / "hosts.yml"), str(playbook), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def play(inv: Path, playbook: str | Path, *extra: str) -> subprocess.CompletedProcess:
    return finish(start(inv, playbook, *extra))


def recap(result: subprocess.CompletedProcess) -> dict[str, tuple[int, int]]:
    found = re.findall(
        r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", result.stdout, re.M
    )
    return {name: (int(changed), int(failed)) for name, _unused, changed, failed in found}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    shape = SHAPES[0]
    path = write_tiny_llama(str(tmp_path_factory.mktemp("gguf") / shape.filename), shape)
    return Path(path).read_bytes()


@pytest.fixture
def fake(gguf: bytes):
    state = Fake()
    state.releases[(LLAMA, "b9999")] = [
        Asset("llama-b9999-bin-ubuntu-x64.tar.gz", X64),
        Asset("llama-b9999-bin-ubuntu-arm64.tar.gz", ARM),
        Asset("llama-b9999-bin-win-cpu-x64.zip", b"not needed"),
    ]
    state.releases[(LLAMA, "b9998")] = [Asset("llama-b9998-bin-ubuntu-x64.tar.gz", X64)]
    state.tarballs[(LLAMA, "b9999")] = SRC
    state.tarballs[(LLAMA, "b9998")] = SRC
    state.releases[(K3S, "v1.33.4+k3s1")] = k3s_assets()
    state.releases[(K3S, "v1.33.5+k3s1")] = k3s_assets(amd_sum="66" * 32)
    state.releases[(K3S, "v1.33.7+k3s1")] = k3s_assets()
    state.hf_refs[REPO] = {"main": COMMIT, COMMIT: COMMIT}
    state.hf_files[(REPO, COMMIT, "tiny-Q8_0.gguf")] = HfFile(gguf)
    with FakeReleaseSources(state) as served:
        yield served


def test_lock_then_the_roles_use_it_and_every_refusal(tmp_path: Path, fake: Fake, gguf: bytes) -> None:
    inv = write_inventory(tmp_path, fake)
    lock_file = inv / "group_vars" / "all" / "llmfleet_lock.yml"

    first = play(inv, ROOT / "playbooks" / "lock.yml")
    assert first.returncode == 0, first.stdout[-4000:]
    lock = yaml.safe_load(lock_file.read_text())["llmfleet_lock"]
    b9999 = lock["llama_cpp"]["releases"]["b9999"]
    assert set(b9999) == {"ubuntu-x64", "ubuntu-arm64", "source"}  # not the Windows asset nobody needs
    assert (b9999["ubuntu-x64"]["sha256"], b9999["ubuntu-x64"]["sha256_from"]) == (sha(X64), "github-digest")
    assert b9999["ubuntu-arm64"]["hosts"] == ["warm"] and b9999["source"]["hosts"] == ["wold"]
    assert (b9999["source"]["sha256"], b9999["source"]["sha256_from"]) == (sha(SRC), "downloaded")
    k3s = lock["k3s"]["releases"]["v1.33.4+k3s1"]
    assert k3s["amd64"]["sha256"] == sha(STANDIN.read_bytes()) and k3s["amd64"]["hosts"] == ["head"]
    assert k3s["arm64"]["sha256"] == sha(K3S_ARM) and k3s["arm64"]["hosts"] == ["warm"]
    model = lock["model"]
    assert model["commit"] == COMMIT and model["sha256"] == sha(gguf) and model["size"] == len(gguf)
    assert model["url"] == f"{fake.hf_endpoint}/{REPO}/resolve/{COMMIT}/tiny-Q8_0.gguf"
    assert "model acme/tiny-GGUF/tiny-Q8_0.gguf main -> 9ba40c488bf8" in first.stdout
    written = lock_file.read_bytes()
    print(written.decode())

    # A second run with nothing changed: the same file, nothing changed, the tarball not fetched again.
    fake.requests.clear()
    second = play(inv, ROOT / "playbooks" / "lock.yml")
    assert second.returncode == 0, second.stdout[-4000:]
    assert all(changed == 0 for changed, _unused in recap(second).values()), second.stdout[-2000:]
    assert lock_file.read_bytes() == written
    assert not [r for r in fake.requests if "codeload" in r]

    # --check --diff shows an upstream change (a new x64 asset) without writing it.
    fake.releases[(LLAMA, "b9999")][0] = Asset("llama-b9999-bin-ubuntu-x64.tar.gz", b"rebuilt x64")
    check = play(inv, ROOT / "playbooks" / "lock.yml", "--check", "--diff")
    assert check.returncode == 0, check.stdout[-4000:]
    assert re.search(rf"^\+\s+sha256: {sha(b'rebuilt x64')}$", check.stdout, re.M), check.stdout[-3000:]
    assert re.search(rf"^-\s+sha256: {sha(X64)}$", check.stdout, re.M)
    assert lock_file.read_bytes() == written
    fake.releases[(LLAMA, "b9999")][0] = Asset("llama-b9999-bin-ubuntu-x64.tar.gz", X64)

    # The roles take the lock's pins where the inventory has none: k3s and the model install.
    (tmp_path / "bin").mkdir()
    (tmp_path / "use.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Install k3s from the lock",
                    "hosts": "head",
                    "gather_facts": False,
                    "vars": {
                        "k3s_install_dir": str(tmp_path / "opt"),
                        "k3s_bin_path": str(tmp_path / "bin" / "k3s"),
                        "k3s_node_ip": "127.0.0.1",
                    },
                    "tasks": [
                        {
                            "name": "K3s install",
                            "ansible.builtin.include_role": {
                                "name": "llmfleet.cluster.k3s",
                                "tasks_from": "install",
                            },
                        },
                        {
                            "name": "Model from the lock",
                            "ansible.builtin.include_role": {"name": "llmfleet.cluster.model"},
                            "vars": {"model_cache_dir": str(tmp_path / "models")},
                        },
                    ],
                }
            ]
        )
    )
    # A tampered asset (other bytes than GitHub's digest was made of): the install refuses it.
    (tmp_path / "llama.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Install llama.cpp from the lock",
                    "hosts": "head",
                    "gather_facts": False,
                    "vars": {
                        "llama_cpp_install_dir": str(tmp_path / "llama"),
                        "llama_cpp_cache_dir": str(tmp_path / "llama-cache"),
                        "llama_cpp_controller_cache_dir": str(tmp_path / "llama-controller"),
                    },
                    "roles": [{"role": "llmfleet.cluster.llama_cpp"}],
                }
            ]
        )
    )
    fake.tampered.add("llama-b9999-bin-ubuntu-x64.tar.gz")
    fake.padding["v1.33.7+k3s1"] = 9 << 20  # an API answer over the default 8 MiB cap

    # These runs are independent of each other: run them at once to keep the test short.
    lock_yml = ROOT / "playbooks" / "lock.yml"
    runs = {
        "use": start(inv, tmp_path / "use.yml"),
        "plan": start(inv, ROOT / "playbooks" / "plan.yml", "-e", f"llmfleet_output_dir={tmp_path / 'plan'}"),
        "tampered": start(inv, tmp_path / "llama.yml"),
        "no-arm64": start(inv, lock_yml, "-e", "llama_cpp_build=b9998"),
        "k3s-sum": start(inv, lock_yml, "-e", "k3s_version=v1.33.5+k3s1"),
        "oversized": start(inv, lock_yml, "-e", "k3s_version=v1.33.7+k3s1"),
    }
    done = {name: finish(proc) for name, proc in runs.items()}

    # The roles took the lock's pins where the inventory has none: k3s and the model installed.
    use = done["use"]
    assert use.returncode == 0, use.stdout[-4000:]
    installed = tmp_path / "opt" / "v1.33.4+k3s1" / "k3s"
    assert sha(installed.read_bytes()) == sha(STANDIN.read_bytes())
    assert sha((tmp_path / "models" / "tiny-Q8_0.gguf").read_bytes()) == sha(gguf)

    # The planner read the header from the URL pinned to the commit (by Range), not from "main".
    assert done["plan"].returncode == 0, done["plan"].stdout[-4000:]
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["model"]["sha256"] == sha(gguf)
    assert f"GET /hf/{REPO}/resolve/{COMMIT}/tiny-Q8_0.gguf Range: bytes=0-" in "\n".join(fake.requests)
    assert not [r for r in fake.requests if r.startswith("GET /hf/") and "/resolve/main/" in r]

    tampered = done["tampered"]
    assert tampered.returncode != 0
    assert sha(X64) in tampered.stdout and sha(X64 + b"tampered") in tampered.stdout, tampered.stdout[-4000:]
    assert not (tmp_path / "llama" / "current").exists()

    # Refusals of lock.yml itself, each naming the source, the URL and the value; the lock stays.
    refusals = {
        "no-arm64": r"llama-b9998-bin-ubuntu-arm64\.tar\.gz \(or \.zip\), which warm \(ubuntu-arm64\) need",
        "k3s-sum": r"sha256sum-amd64\.txt \(http://127\.0\.0\.1:\d+/k3s-io/k3s/releases/download/v1\.33\.5%2Bk3s1/"
        r"sha256sum-amd64\.txt\) says k3s is (66){32}, GitHub's digest of k3s says "
        + sha(STANDIN.read_bytes())
        + "; refusing both",
        "oversized": r"GitHub API, release v1\.33\.7\+k3s1 of k3s-io/k3s \(http://127\.0\.0\.1:\d+/api/repos/k3s-io/k3s/"
        r"releases/tags/v1\.33\.7%2Bk3s1\): \d+ bytes \(Content-Length\), more than the 8388608 allowed",
    }
    for name, message in refusals.items():
        refused = done[name]
        assert refused.returncode != 0, name
        assert re.search(message, refused.stdout), refused.stdout[-3000:]
    assert lock_file.read_bytes() == written

"""llmfleet.cluster.host_facts: the thin module over module_utils/hostinfo.py, run in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.llmfleet.cluster.plugins.modules import host_facts

from tests.support.host_trees import recorded_hosts

FIXTURES = recorded_hosts()  # tests/fixtures/hosts/ with the machines' names (see its README)


def run(capsys: pytest.CaptureFixture, **args: object) -> tuple[int, dict]:
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        host_facts.main()
    return int(exc.value.code or 0), json.loads(capsys.readouterr().out)


def test_replays_a_recorded_machine_and_sets_the_fact(capsys: pytest.CaptureFixture) -> None:
    code, result = run(capsys, root=str(FIXTURES / "docker-v1"))
    assert code == 0
    assert result["changed"] is False
    fact = result["ansible_facts"]["llmfleet_host"]
    assert fact == result["llmfleet_host"]
    assert fact["memory"]["cgroup_limit_mib"] == 2048
    assert fact["memory"]["usable_mib"] == 2048 - 300
    assert result["summary"].startswith("x86_64  2 cpus  usable 1748 MiB (cgroup 2048)")
    assert result["runnable"] == ["llama_cpp", "vllm_cpu"]


def test_own_processes_option_reaches_the_probe(capsys: pytest.CaptureFixture) -> None:
    # the serving head: llama-server's 48 MiB anonymous memory counts back by default, not when left out
    _unused, result = run(capsys, root=str(FIXTURES / "podman-v1-head"))
    assert result["llmfleet_host"]["memory"]["usable_mib"] == 262 + 48
    _unused, result = run(capsys, root=str(FIXTURES / "podman-v1-head"), own_processes=["ggml-rpc-server"])
    assert result["llmfleet_host"]["memory"]["usable_mib"] == 262


def test_check_mode_probes_the_same_way(capsys: pytest.CaptureFixture) -> None:
    code, result = run(capsys, root=str(FIXTURES / "graviton3"), _ansible_check_mode=True)
    assert code == 0 and result["changed"] is False
    assert result["ansible_facts"]["llmfleet_host"]["backends"]["vllm_cpu"]["status"] == "supported"


def test_min_glibc_option_changes_the_verdict(capsys: pytest.CaptureFixture) -> None:
    _unused, result = run(capsys, root=str(FIXTURES / "graviton2"), min_glibc="2.34")
    assert result["llmfleet_host"]["backends"]["llama_cpp"]["flavour"] == "ubuntu-arm64"


def test_a_malformed_file_fails_naming_it(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    root = tmp_path / "pi"
    shutil.copytree(FIXTURES / "rpi5", root, symlinks=True)
    (root / "proc/meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: lots kB\n")
    code, result = run(capsys, root=str(root))
    assert code == 1 and result["failed"] is True
    assert result["msg"] == f"cannot parse {root}/proc/meminfo: line 2 'MemAvailable: lots kB'"
    assert "ansible_facts" not in result


def test_given_fact_is_checked_not_probed(capsys: pytest.CaptureFixture) -> None:
    given = {
        "arch": "aarch64",
        "cpus": 8,
        "isa": ["bf16", "neon"],
        "memory": {"usable_mib": 30000},
        "backends": {
            "llama_cpp": {"status": "release", "flavour": "ubuntu-arm64"},
            "vllm_cpu": {"status": "supported"},
        },
    }
    code, result = run(capsys, given=given, root="/nonexistent")
    assert code == 0
    assert "ansible_facts" not in result  # the inventory variable is used as it is
    assert result["llmfleet_host"] == given
    assert result["summary"] == (
        "aarch64  8 cpus  usable 30000 MiB (given)  isa bf16,neon  llama_cpp=ubuntu-arm64  vllm_cpu=supported"
    )


def test_a_given_fact_of_the_wrong_shape_fails(capsys: pytest.CaptureFixture) -> None:
    code, result = run(capsys, given={"arch": "x86_64", "cpus": 4})
    assert code == 1
    assert result["msg"].startswith("the inventory's llmfleet_host is not a probe fact: ")
    assert "llmfleet_host.memory.usable_mib is missing" in result["msg"]


def test_documentation_matches_the_argument_spec() -> None:
    import yaml

    doc = yaml.safe_load(host_facts.DOCUMENTATION)
    assert set(doc["options"]) == {
        "root",
        "disk_path",
        "min_glibc",
        "own_processes",
        "llama_cpp_dir",
        "llama_cpp_env",
        "llama_cpp_flavour",
        "given",
        "host",
    }
    yaml.safe_load(host_facts.EXAMPLES)
    assert set(yaml.safe_load(host_facts.RETURN)) == {"ansible_facts", "llmfleet_host", "summary", "runnable"}


# A stand-in for the installed build's llama-server: prints what the pinned source prints for
# lavapipe, and only when GGML_VK_VISIBLE_DEVICES names it (as llama.cpp does for a CPU-type device).
FAKE_LLAMA_SERVER = """#!/bin/sh
[ "$1" = --list-devices ] || exit 2
echo "load_backend: loaded Vulkan backend" >&2
echo "Available devices:"
if [ "$GGML_VK_VISIBLE_DEVICES" = 0 ]; then
  echo "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)"
else
  echo "  (none)"
fi
"""


def fake_build(tmp_path: Path, script: str) -> Path:
    build = tmp_path / "current"
    build.mkdir()
    (build / "llama-server").write_text(script)
    (build / "llama-server").chmod(0o755)
    return build


def test_the_live_probe_runs_the_installed_builds_listing_with_its_environment(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    build = fake_build(tmp_path, FAKE_LLAMA_SERVER)
    _unused, result = run(capsys, llama_cpp_dir=str(build), llama_cpp_env={"GGML_VK_VISIBLE_DEVICES": 0})
    fact = result["llmfleet_host"]
    assert fact["devices_source"] == "llama-server --list-devices"
    lavapipe, host = fact["devices"]
    assert (lavapipe["name"], lavapipe["type"], lavapipe["uma"], lavapipe["memory_total_mib"]) == (
        "Vulkan0",
        "gpu",
        True,
        2048,
    )
    assert lavapipe["memory_free_mib"] == min(2048, fact["memory"]["usable_mib"])
    assert host["name"] == "CPU" and host["memory_free_mib"] == fact["memory"]["usable_mib"]
    assert "devices Vulkan0 llvmpipe (LLVM 15.0.6, 256 bits)" in result["summary"]
    # without the variable llama.cpp lists no device: the CPU alone
    _unused, result = run(capsys, llama_cpp_dir=str(build))
    assert [d["name"] for d in result["llmfleet_host"]["devices"]] == ["CPU"]


def test_a_failing_listing_is_named_and_the_probe_goes_on(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    build = fake_build(tmp_path, "#!/bin/sh\necho 'ggml_vulkan: device lost' >&2\nexit 3\n")
    code, result = run(capsys, llama_cpp_dir=str(build))
    assert code == 0
    assert result["llmfleet_host"]["devices_source"].endswith(
        f"({build}/llama-server --list-devices failed (rc 3): ggml_vulkan: device lost)"
    )


def test_given_devices_of_the_wrong_shape_fail_naming_the_host(capsys: pytest.CaptureFixture) -> None:
    given = {
        "arch": "x86_64",
        "cpus": 16,
        "memory": {"usable_mib": 16384},
        "backends": {"llama_cpp": {"status": "release"}, "vllm_cpu": {"status": "supported"}},
        "devices": [
            {
                "name": "CUDA0",
                "backend": "cuda",
                "description": "NVIDIA GeForce RTX 3060",
                "type": "gpu",
                "memory_total_mib": 12288,
                "memory_free_mib": "12 GiB",
                "uma": False,
            }
        ],
    }
    code, result = run(capsys, given=given, host="desk1")
    assert code == 1
    assert result["msg"].startswith("host desk1: the inventory's llmfleet_host is not a probe fact: ")
    assert (
        "llmfleet_host.devices[0] (CUDA0).memory_free_mib must be an integer >= 0 (MiB), got '12 GiB'"
        in result["msg"]
    )


PINNED_BUILD = Path(__file__).resolve().parents[4] / ".cache" / "llama.cpp" / "bin"


@pytest.mark.skipif(
    not (PINNED_BUILD / "llama-server").exists(), reason="the pinned CPU build is not built here"
)
def test_the_pinned_cpu_builds_own_listing(capsys: pytest.CaptureFixture) -> None:
    """The real pinned build (make test-artifacts): a CPU build lists no device; the CPU is last."""
    _unused, result = run(capsys, llama_cpp_dir=str(PINNED_BUILD))
    fact = result["llmfleet_host"]
    assert fact["devices_source"] == "llama-server --list-devices"
    assert [(d["name"], d["memory_free_mib"]) for d in fact["devices"]] == [
        ("CPU", fact["memory"]["usable_mib"])
    ]

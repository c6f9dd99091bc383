# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""scripts/build-llama-cpp.sh's flavours: the CPU one, the Vulkan one and the arm64 cross build, each its
own cache entry.

The builds themselves are minutes long (make test-artifacts, make vulkan-artifacts, make
arm64-artifacts); these tests
stop the builder at its first step (a ``PY`` that fails) and read which entry it was building.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-llama-cpp.sh"


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ, LLMFLEET_CACHE=str(tmp_path / "cache"), CACHE=str(tmp_path / "checkout-cache"), PY="false"
    )


def building(result: subprocess.CompletedProcess) -> tuple[str, str]:
    match = re.search(r"artifact-cache: (\S+): building \S+/(\S+)/([0-9a-f]{64})", result.stderr)
    assert match, result.stderr
    assert match.group(1) == match.group(2)
    return match.group(1), match.group(3)


def test_an_unknown_backend_is_refused_by_name(env: dict[str, str]) -> None:
    result = run(["metal"], env)
    assert result.returncode == 1
    assert "no release flavour for backend 'metal'" in result.stderr


def test_the_vulkan_build_says_what_is_missing(env: dict[str, str], tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("uname", "dirname"):
        (tools / tool).symlink_to(shutil.which(tool))
    result = run(["vulkan"], dict(env, PATH=str(tools)))
    assert result.returncode == 1
    assert "glslc missing (scripts/host-setup.sh)" in result.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the Vulkan flavour is x86_64's")
@pytest.mark.skipif(not shutil.which("glslc"), reason="glslc (scripts/host-setup.sh)")
def test_the_vulkan_flavour_is_its_own_entry_and_a_failed_build_keeps_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    cpu = run([], env)
    vulkan = run(["vulkan"], env)
    assert cpu.returncode != 0 and vulkan.returncode != 0  # PY=false: pip download fails
    cpu_name, cpu_key = building(cpu)
    vulkan_name, vulkan_key = building(vulkan)
    assert cpu_name == "llama.cpp-ubuntu-x64"
    assert vulkan_name == "llama.cpp-ubuntu-vulkan-x64"
    assert cpu_key != vulkan_key
    assert "the build failed" in vulkan.stderr
    cache = tmp_path / "cache"
    assert [p.name for p in (cache / vulkan_name).iterdir() if not p.name.startswith(".")] == []
    assert not (tmp_path / "checkout-cache" / "llama.cpp-vulkan").exists()


def test_the_arm64_build_says_what_is_missing(env: dict[str, str], tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("dirname",):
        (tools / tool).symlink_to(shutil.which(tool))
    (tools / "uname").write_text("#!/bin/sh\necho x86_64\n")
    (tools / "uname").chmod(0o755)
    result = run(["arm64"], dict(env, PATH=str(tools)))
    assert result.returncode == 1
    assert "aarch64-linux-gnu-gcc missing (scripts/host-setup.sh)" in result.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the arm64 cross build is x86_64's")
@pytest.mark.skipif(
    not shutil.which("aarch64-linux-gnu-g++"), reason="g++-aarch64-linux-gnu (scripts/host-setup.sh)"
)
def test_the_arm64_flavour_is_its_own_entry_and_links_apart(env: dict[str, str], tmp_path: Path) -> None:
    cpu = run([], env)
    arm64 = run(["arm64"], env)
    assert cpu.returncode != 0 and arm64.returncode != 0  # PY=false: pip download fails
    cpu_name, cpu_key = building(cpu)
    arm64_name, arm64_key = building(arm64)
    assert cpu_name == "llama.cpp-ubuntu-x64"
    assert arm64_name == "llama.cpp-ubuntu-arm64"
    assert cpu_key != arm64_key
    assert "the build failed" in arm64.stderr
    assert not (tmp_path / "checkout-cache" / "llama.cpp-arm64").exists()

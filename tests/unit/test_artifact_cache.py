"""scripts/artifact-cache.py: entries keyed by their inputs, built atomically, verified on use.

A stand-in builder (a few lines of bash) takes the place of the real ones (llama.cpp, the host
image, the models, the vLLM venv): it records each build in a log and writes its input's content
and a larger file into the entry.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts" / "artifact-cache.py"

BUILDER = r"""
set -eu
echo "$1" >> "$BUILDS"
[ -n "${FAIL:-}" ] && { echo partial > "$LLMFLEET_ENTRY/half"; exit 3; }
mkdir -p "$LLMFLEET_ENTRY/bin" "$LLMFLEET_ENTRY/lib/__pycache__"
cp "$2" "$LLMFLEET_ENTRY/bin/tool"
head -c 200000 /dev/urandom > "$LLMFLEET_ENTRY/lib/blob"
echo "built for $LLMFLEET_ENTRY_FINAL" > "$LLMFLEET_ENTRY/lib/where"
ln -s blob "$LLMFLEET_ENTRY/lib/blob.link"
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("LLMFLEET_")}
    e["LLMFLEET_CACHE"] = str(tmp_path / "mcache")
    e["BUILDS"] = str(tmp_path / "builds.log")
    (tmp_path / "builder.sh").write_text(BUILDER)
    for name in ("a", "b"):
        (tmp_path / f"{name}.in").write_text(f"input of {name}\n")
    return e


def ensure(tmp_path: Path, env: dict[str, str], name: str, **extra: str) -> subprocess.CompletedProcess:
    src = tmp_path / f"{name}.in"
    return subprocess.run(
        [sys.executable, str(TOOL), "ensure", name, "--file", str(src), "--text", "flags=-O2",
         "--link", f"{tmp_path / 'checkout' / '.cache' / name}=bin",
         "--", "bash", str(tmp_path / "builder.sh"), name, str(src)],
        env={**env, **extra}, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def builds(env: dict[str, str]) -> list[str]:
    path = Path(env["BUILDS"])
    return path.read_text().split() if path.exists() else []


def entry_of(proc: subprocess.CompletedProcess) -> Path:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


def test_built_once_then_reused_from_a_fresh_checkout(tmp_path: Path, env: dict[str, str]) -> None:
    first = entry_of(ensure(tmp_path, env, "a"))
    assert first.parent == Path(env["LLMFLEET_CACHE"]) / "a"
    assert len(first.name) == 64
    link = tmp_path / "checkout" / ".cache" / "a"
    assert link.is_symlink() and link.resolve() == first / "bin"
    assert (link / "tool").read_text() == "input of a\n"
    # The builder wrote into a temporary directory and was told the final path.
    assert (first / "lib" / "where").read_text() == f"built for {first}\n"
    manifest = json.loads((first / ".llmfleet-manifest.json").read_text())
    assert set(manifest["files"]) == {"bin/tool", "lib/blob", "lib/where"}
    assert manifest["links"] == {"lib/blob.link": "blob"}
    # Another checkout (its .cache/a a real directory, as in the old layout) reuses the entry.
    (tmp_path / "checkout").rename(tmp_path / "old")
    (tmp_path / "checkout" / ".cache" / "a").mkdir(parents=True)
    (tmp_path / "checkout" / ".cache" / "a" / "stale").write_text("old layout\n")
    proc = ensure(tmp_path, env, "a")
    assert entry_of(proc) == first
    assert "reused" in proc.stderr
    assert builds(env) == ["a"]
    assert link.resolve() == first / "bin"
    assert not [p for p in first.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_a_changed_input_rebuilds_only_its_entry(tmp_path: Path, env: dict[str, str]) -> None:
    a1 = entry_of(ensure(tmp_path, env, "a"))
    b1 = entry_of(ensure(tmp_path, env, "b"))
    assert builds(env) == ["a", "b"]
    (tmp_path / "a.in").write_text("input of a, changed\n")
    a2 = entry_of(ensure(tmp_path, env, "a"))
    b2 = entry_of(ensure(tmp_path, env, "b"))
    assert builds(env) == ["a", "b", "a"]
    assert a2 != a1 and b2 == b1
    assert (tmp_path / "checkout" / ".cache" / "a" / "tool").read_text() == "input of a, changed\n"
    # The old entry stays for checkouts still at the old input; the same input again reuses it.
    assert a1.is_dir()
    (tmp_path / "a.in").write_text("input of a\n")
    assert entry_of(ensure(tmp_path, env, "a")) == a1
    assert builds(env) == ["a", "b", "a"]


def test_a_text_input_is_part_of_the_key(tmp_path: Path) -> None:
    def key(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, str(TOOL), "key", "x", *args], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0 and len(out.stdout.strip()) == 64, out.stderr
        return out.stdout.strip()

    assert key("--text=-O2") == key("--text=-O2")
    assert key("--text=-O2") != key("--text=-O0")
    assert key("--text", "a b") != key("--text", "a", "--text", "b")
    (tmp_path / "f").write_text("1")
    with_file = key("--file", str(tmp_path / "f"))
    (tmp_path / "f").write_text("2")
    assert key("--file", str(tmp_path / "f")) != with_file


@pytest.mark.parametrize(
    "damage, problem",
    [
        ("flip", "lib/blob has sha256"),
        ("truncate", "lib/blob has 199999 bytes, not 200000"),
        ("delete", "lib/blob is missing"),
        ("add", "bin/extra is not in its manifest"),
        ("relink", "symlink lib/blob.link points to where, not blob"),
        ("manifest", "no readable manifest"),
    ],
)
def test_a_corrupt_entry_is_detected_removed_and_rebuilt(
    tmp_path: Path, env: dict[str, str], damage: str, problem: str
) -> None:
    entry = entry_of(ensure(tmp_path, env, "a"))
    entry_of(ensure(tmp_path, env, "b"))
    blob = entry / "lib" / "blob"
    if damage == "flip":
        # Same size, same mtime: only the content (and the ctime no tool can set back) changed.
        st = blob.stat()
        data = bytearray(blob.read_bytes())
        data[1000] ^= 0xFF
        blob.write_bytes(bytes(data))
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif damage == "truncate":
        blob.write_bytes(blob.read_bytes()[:-1])
    elif damage == "delete":
        blob.unlink()
    elif damage == "add":
        (entry / "bin" / "extra").write_text("x")
    elif damage == "relink":
        (entry / "lib" / "blob.link").unlink()
        (entry / "lib" / "blob.link").symlink_to("where")
    elif damage == "manifest":
        (entry / ".llmfleet-manifest.json").write_text("{")
    verify = subprocess.run(
        [sys.executable, str(TOOL), "verify", str(entry)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 1 and problem in verify.stderr, verify.stderr
    proc = ensure(tmp_path, env, "a")
    assert entry_of(proc) == entry
    assert f"is corrupt ({problem}" in proc.stderr
    assert builds(env) == ["a", "b", "a"]  # rebuilt; b untouched
    assert (
        subprocess.run(
            [sys.executable, str(TOOL), "verify", "--full", str(entry)], env=env, check=False
        ).returncode
        == 0
    )
    assert not (entry / "bin" / "extra").exists()


def test_a_changed_byte_is_found_by_a_full_check_even_with_the_fingerprint_forged(
    tmp_path: Path, env: dict[str, str]
) -> None:
    entry = entry_of(ensure(tmp_path, env, "a"))
    blob = entry / "lib" / "blob"
    data = bytearray(blob.read_bytes())
    data[5] ^= 0x01
    blob.write_bytes(bytes(data))
    # Pretend the damage happened below the filesystem (bit rot): the recorded fingerprint is
    # brought up to date, so only hashing can find it; LLMFLEET_CACHE_VERIFY=full hashes.
    spec = importlib.util.spec_from_file_location("artifact_cache", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    files, links = mod.scan(str(entry))
    (entry / ".llmfleet-verified").write_text(mod.fingerprint(str(entry), files, links) + "\n")
    assert "reused" in ensure(tmp_path, env, "a").stderr
    proc = ensure(tmp_path, env, "a", LLMFLEET_CACHE_VERIFY="full")
    assert "is corrupt (lib/blob has sha256" in proc.stderr
    assert builds(env) == ["a", "a"]


def test_a_failed_build_leaves_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    proc = ensure(tmp_path, env, "a", FAIL="1")
    assert proc.returncode == 3
    assert "nothing was kept" in proc.stderr
    base = Path(env["LLMFLEET_CACHE"]) / "a"
    assert [p.name for p in base.iterdir() if not p.name.endswith(".lock")] == []
    assert not (tmp_path / "checkout" / ".cache" / "a").exists()
    entry_of(ensure(tmp_path, env, "a"))
    assert builds(env) == ["a", "a"]


def test_two_callers_at_once_build_once(tmp_path: Path, env: dict[str, str]) -> None:
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 1\n" + BUILDER)
    src = tmp_path / "a.in"
    cmd = [
        sys.executable,
        str(TOOL),
        "ensure",
        "a",
        "--file",
        str(src),
        "--",
        "bash",
        str(slow),
        "a",
        str(src),
    ]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _caller in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    assert builds(env) == ["a"]


def test_clean_empties_the_cache(tmp_path: Path, env: dict[str, str]) -> None:
    entry_of(ensure(tmp_path, env, "a"))
    proc = subprocess.run(
        [sys.executable, str(TOOL), "clean"], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    assert list(Path(env["LLMFLEET_CACHE"]).iterdir()) == []
    entry_of(ensure(tmp_path, env, "a"))
    assert builds(env) == ["a", "a"]


def test_the_root_follows_llmfleet_cache_then_xdg(tmp_path: Path, env: dict[str, str]) -> None:
    def root(**over: str) -> str:
        e = {k: v for k, v in env.items() if k not in ("LLMFLEET_CACHE", "XDG_CACHE_HOME")}
        e.update(over)
        return subprocess.run(
            [sys.executable, str(TOOL), "root"], env=e, capture_output=True, text=True, check=False
        ).stdout.strip()

    assert root(LLMFLEET_CACHE=str(tmp_path / "x")) == str(tmp_path / "x")
    assert root(XDG_CACHE_HOME=str(tmp_path / "xdg")) == str(tmp_path / "xdg" / "llmfleet")
    assert root(HOME=str(tmp_path / "home")) == str(tmp_path / "home" / ".cache" / "llmfleet")

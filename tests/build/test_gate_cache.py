"""scripts/gate-cache.sh: a gate runs again exactly when a file it reads (or the command) changed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gate-cache.sh", repo / "scripts" / "gate-cache.sh")
    (repo / "plugins").mkdir()
    (repo / "plugins" / "a.py").write_text("a = 1\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "t.py").write_text("t = 1\n")
    (repo / "requirements.txt").write_text("ansible-core==2.19.14\n")
    (repo / ".gitignore").write_text("/.cache/\nignored.txt\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    return repo


def gate(repo: Path, *specs: str, command: str = "echo ran >> ../runs.log", env: dict | None = None):
    """Run the gate; return (exit code, how many times the command has run so far)."""
    proc = subprocess.run(
        ["bash", "scripts/gate-cache.sh", "g", *specs, "--", "sh", "-c", command],
        cwd=repo,
        env={**os.environ, "GATES_FORCE": "0", "LLMFLEET_CACHE": str(repo.parent / "mcache"), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    log = repo.parent / "runs.log"
    return proc.returncode, (len(log.read_text().splitlines()) if log.exists() else 0)


def stamps(repo: Path) -> Path:
    """The machine's artifact cache (here a temporary one) holds the stamps, not the checkout."""
    return repo.parent / "mcache" / "gates"


def test_unchanged_inputs_skip_the_command(repo: Path) -> None:
    assert gate(repo, "plugins") == (0, 1)
    assert gate(repo, "plugins") == (0, 1)
    assert len(list(stamps(repo).glob("g-*"))) == 1


def test_an_edit_an_untracked_file_or_new_pins_run_it_again(repo: Path) -> None:
    assert gate(repo, "plugins") == (0, 1)
    (repo / "plugins" / "a.py").write_text("a = 2\n")  # uncommitted edit
    assert gate(repo, "plugins") == (0, 2)
    (repo / "plugins" / "b.py").write_text("b = 1\n")  # untracked, not ignored
    assert gate(repo, "plugins") == (0, 3)
    (repo / "requirements.txt").write_text("ansible-core==2.20.0\n")
    assert gate(repo, "plugins") == (0, 4)
    assert gate(repo, "plugins") == (0, 4)
    # one stamp per passing input set (another checkout at an older commit keeps its own)
    assert len(list(stamps(repo).glob("g-*"))) == 4
    (repo / "requirements.txt").write_text("ansible-core==2.19.14\n")
    assert gate(repo, "plugins") == (0, 4)


def test_a_fresh_clone_on_the_same_machine_skips_and_old_stamps_are_pruned(
    repo: Path, tmp_path: Path
) -> None:
    assert gate(repo, "plugins") == (0, 1)
    clone = tmp_path / "clone"
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "c", "--no-gpg-sign"], check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})  # fmt: skip
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert gate(clone, "plugins") == (0, 1)  # the clone's command never ran: runs.log is shared by both
    for i in range(25):
        (repo / "plugins" / "a.py").write_text(f"a = {i + 10}\n")
        assert gate(repo, "plugins") == (0, i + 2)
    assert len(list(stamps(repo).glob("g-*"))) == 20


def test_files_outside_its_inputs_and_ignored_files_do_not(repo: Path) -> None:
    assert gate(repo, ".", ":!tests") == (0, 1)
    (repo / "tests" / "t.py").write_text("t = 2\n")
    (repo / "ignored.txt").write_text("x\n")
    assert gate(repo, ".", ":!tests") == (0, 1)
    (repo / "plugins" / "a.py").unlink()
    assert gate(repo, ".", ":!tests") == (0, 2)


def test_a_failing_gate_leaves_no_stamp_and_force_runs_it(repo: Path) -> None:
    assert gate(repo, "plugins", command="echo ran >> ../runs.log; exit 3") == (3, 1)
    assert not list(stamps(repo).glob("g-*"))
    assert gate(repo, "plugins") == (0, 2)
    assert gate(repo, "plugins", env={"GATES_FORCE": "1"}) == (0, 3)

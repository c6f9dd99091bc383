"""scripts/make-test.sh (`make test`): the parts in order, each one's seconds at the end, a stop at the
first failure with the summary still printed. A stand-in `make` records the parts it was asked for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = [
    "setup",
    "lint",
    "unit",
    "docs-check",
    "gates",
    "manifests",
    "build-check",
    "browser",
    "molecule",
    "demo-check",
    "demo-mixed-check",
    "demo-gpu-check",
    "demo-tune-check",
]

FAKE_MAKE = """#!/usr/bin/env bash
echo "$2" >> "$CALLS"
[[ $2 == "${FAIL_PART:-}" ]] && exit 7
[[ $2 == unit ]] && sleep 1.1
exit 0
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts" / "make-test.sh", repo / "scripts" / "make-test.sh")
    fake = tmp_path / "make"
    fake.write_text(FAKE_MAKE)
    fake.chmod(0o755)
    full = {**os.environ, "MAKE": str(fake), "CALLS": str(tmp_path / "calls"), **env}
    if "MAKE_TEST_PARTS" not in env:
        full.pop("MAKE_TEST_PARTS", None)
    return subprocess.run(
        ["bash", str(repo / "scripts" / "make-test.sh")],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def summary(stdout: str) -> list[tuple[str, int, str]]:
    rows = []
    for line in stdout.splitlines():
        m = re.match(r"^make test: (\S+) +(\d+) s(?:  (.*))?$", line)
        if m:
            rows.append((m.group(1), int(m.group(2)), m.group(3) or ""))
    return rows


def test_every_part_in_order_then_each_ones_seconds(tmp_path: Path) -> None:
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "calls").read_text().split() == PARTS
    rows = summary(proc.stdout)
    assert [r[0] for r in rows] == [*PARTS, "total"]
    assert dict((r[0], r[1]) for r in rows)["unit"] >= 1
    assert rows[-1][2] == "all checks passed"
    assert proc.stdout.rstrip().endswith("all checks passed")
    saved = (tmp_path / "repo" / ".cache" / "make-test-times.txt").read_text()
    assert summary(saved) == rows


def test_the_first_failing_part_stops_the_run_with_its_exit_status_and_the_summary(tmp_path: Path) -> None:
    proc = run(tmp_path, FAIL_PART="gates")
    assert proc.returncode == 7
    assert (tmp_path / "calls").read_text().split() == PARTS[: PARTS.index("gates") + 1]
    rows = summary(proc.stdout)
    assert [r[0] for r in rows] == [*PARTS[: PARTS.index("gates") + 1], "total"]
    assert rows[-2][2] == "FAILED (exit 7)"
    assert rows[-1][2] == "FAILED at gates"


def test_make_test_parts_picks_some_in_the_usual_order(tmp_path: Path) -> None:
    proc = run(tmp_path, MAKE_TEST_PARTS="molecule lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "calls").read_text().split() == ["lint", "molecule"]


def test_make_molecule_builds_the_vllm_artifacts_only_when_vllm_lws_runs() -> None:
    def dry(*args: str) -> str:
        proc = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), "molecule", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "scripts/vllm-artifacts.sh" in dry()  # every scenario, vllm_lws among them
    assert "scripts/vllm-artifacts.sh" in dry("SCENARIO=artifacts vllm_lws")
    assert "scripts/vllm-artifacts.sh" not in dry("SCENARIO=artifacts")
    assert "scripts/run-molecule.sh artifacts" in dry("SCENARIO=artifacts")

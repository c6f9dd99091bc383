"""Strict schema validation of rendered manifest files with the kubernetes-validate command line."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path


def run_strict(files: Iterable[Path], version: str) -> subprocess.CompletedProcess:
    """``kubernetes-validate --strict -k VERSION FILE...`` (unknown fields are errors)."""
    return subprocess.run(
        ["kubernetes-validate", "--strict", "-k", version, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def assert_valid(files: Iterable[Path], version: str) -> None:
    """Every file passes, and the tool said so once per file (a file it skipped would not count)."""
    files = list(files)
    assert files, "no manifest files to validate"
    proc = run_strict(files, version)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = [line for line in proc.stdout.splitlines() if " passed " in line]
    assert len(passed) == len(files), proc.stdout + proc.stderr

"""The collection tarball, built once per test session for every test of tests/build that reads it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ansible-galaxy collection build` of the checkout, as a release builds it."""
    out = tmp_path_factory.mktemp("tarball")
    env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH")}
    subprocess.run(
        ["ansible-galaxy", "collection", "build", "--output-path", str(out), str(ROOT)],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("llmfleet-cluster-*.tar.gz")
    return built

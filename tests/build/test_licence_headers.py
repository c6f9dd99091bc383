"""One licence, GPL-3.0-or-later: galaxy.yml, every role's meta/main.yml, every plugin's header."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HEADER = (
    "# Copyright: llmfleet contributors\n"
    "# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)\n"
)
LICENCE = "GPL-3.0-or-later"
ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/main.yml"))
# Roles other branches are editing this round; their meta/main.yml still says Apache-2.0 (a
# one-line fix for the lead after the merge). strict: this fails once fixed, then drop the entry.
PENDING: set = set()
PLUGINS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "plugins").rglob("*.py") if p.stat().st_size > 0)


def test_galaxy_yml_names_the_licence_and_ships_its_text() -> None:
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert galaxy["license"] == [LICENCE]
    assert "GNU GENERAL PUBLIC LICENSE" in (ROOT / "LICENSE").read_text()[:200]


@pytest.mark.parametrize(
    "role",
    [
        pytest.param(r, marks=pytest.mark.xfail(strict=True, reason="PENDING")) if r in PENDING else r
        for r in ROLES
    ],
)
def test_role_meta_names_the_collection_licence(role: str) -> None:
    meta = yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text())
    assert meta["galaxy_info"]["license"] == LICENCE, f"roles/{role}/meta/main.yml"


@pytest.mark.parametrize("path", PLUGINS)
def test_plugin_carries_the_gpl_header(path: str) -> None:
    head = "".join((ROOT / path).read_text().splitlines(keepends=True)[:6])
    assert HEADER in head, f"{path}: the first lines lack\n{HEADER}"


def test_no_other_licence_is_named() -> None:
    found = subprocess.run(
        ["git", "grep", "-l", "-i", "apache license\\|apache-2.0", "--", ".", ":!LICENSE", ":!tests/build"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert set(found) <= {f"roles/{r}/meta/main.yml" for r in PENDING}, found

"""What the release tarball holds: the collection a user installs, one licence, no test tooling."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = (
    "tests/",
    "molecule/",
    "bench/",
    "scripts/",
    "inventories/demo/",
    "changelogs/fragments/",
    "build/",
)
LEFT_OUT_FILES = ("Makefile", "ansible.cfg", "pyproject.toml", "requirements.in", "requirements.txt")


def test_the_tooling_of_the_checkout_stays_out(tarball: Path) -> None:
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    top = {n.split("/")[0] for n in names}
    assert top == {
        "CHANGELOG.rst",
        "FILES.json",
        "MANIFEST.json",
        "LICENSE",
        "README.md",
        "changelogs",
        "docs",
        "inventories",
        "meta",
        "playbooks",
        "plugins",
        "roles",
    }, top
    assert not [n for n in names if n.startswith(LEFT_OUT) or n in LEFT_OUT_FILES or n.startswith(".")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "inventories/homelab-example/hosts.yml" in names
    # the collection's own files are ~520 KiB packed (2026-12-04); a build artifact, model or venv
    # that slipped in would be megabytes
    assert tarball.stat().st_size < 1024 * 1024, tarball.stat().st_size


def test_one_licence(tarball: Path) -> None:
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        licence = tar.extractfile("LICENSE").read().decode()
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert galaxy["license"] == ["GPL-3.0-or-later"]
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]
    assert licence.lstrip().startswith(
        "GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007"
    )
    assert "END OF TERMS AND CONDITIONS" in licence and len(licence) > 30000


def test_release_notes_of_this_version(tarball: Path) -> None:
    """The tarball carries the antsibull-changelog release of galaxy.yml's version, not its fragments."""
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    with tarfile.open(tarball) as tar:
        changes = yaml.safe_load(tar.extractfile("changelogs/changelog.yaml"))
        notes = tar.extractfile("CHANGELOG.rst").read().decode()
    assert version in changes["releases"], sorted(changes["releases"])
    assert changes["releases"][version]["changes"], changes["releases"][version]
    assert f"\nv{version}\n" in notes, notes[:500]

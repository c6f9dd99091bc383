"""Every role's documentation travels in the tarball: ansible-doc of the installed copy shows each
entry point and option of the checkout's meta/argument_specs.yml, and the role's README.md is there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())


def _option_paths(options: dict[str, Any] | None, prefix: str = "") -> set[str]:
    """Every option and suboption of an argument spec, as dotted paths."""
    paths: set[str] = set()
    for name, spec in (options or {}).items():
        path = f"{prefix}{name}"
        paths.add(path)
        paths |= _option_paths((spec or {}).get("options"), f"{path}.")
    return paths


def test_every_role_is_documented_from_the_installed_copy(tarball: Path, tmp_path: Path) -> None:
    assert len(ROLES) == len(list((ROOT / "roles").iterdir())), (
        "a role of roles/ has no meta/argument_specs.yml"
    )
    collections = tmp_path / "collections"
    collections.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    # galaxy.yml's dependencies are not fetched (offline); ansible-doc of the roles does not need them.
    installed = subprocess.run(
        ["ansible-galaxy", "collection", "install", "--no-deps", "-p", str(collections), str(tarball)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    target = collections / "ansible_collections" / "llmfleet" / "cluster"

    shown = subprocess.run(
        ["ansible-doc", "-t", "role", "--json", *(f"llmfleet.cluster.{role}" for role in ROLES)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    docs = json.loads(shown.stdout)

    missing: list[str] = []
    for role in ROLES:
        if not (target / "roles" / role / "README.md").is_file():
            missing.append(f"{role}: README.md not in the installed copy")
        doc = docs.get(f"llmfleet.cluster.{role}")
        if not doc:
            missing.append(f"{role}: ansible-doc shows nothing")
            continue
        if not str(doc.get("path", "")).startswith(str(collections)):
            missing.append(f"{role}: documented from {doc.get('path')}, not from the installed copy")
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())[
            "argument_specs"
        ]
        shown_entry_points = doc.get("entry_points") or {}
        for entry_point, spec in specs.items():
            if entry_point not in shown_entry_points:
                missing.append(f"{role}: entry point {entry_point} not shown")
                continue
            want = _option_paths(spec.get("options"))
            got = _option_paths(shown_entry_points[entry_point].get("options"))
            missing += [f"{role}: {entry_point}: option {path} not shown" for path in sorted(want - got)]
    assert not missing, "\n".join(missing)

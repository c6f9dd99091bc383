"""Every role's meta/argument_specs.yml and defaults/main.yml carry the same keys.

The prometheus-community roles keep the two in step with a CI script; this is
the same check as a test, for every entry point of every role.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()) if (ROOT / "roles").is_dir() else []


def _load(path: Path) -> dict:
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def test_there_are_roles() -> None:
    assert ROLES, "no roles found under roles/"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_has_argument_specs(role: Path) -> None:
    spec = _load(role / "meta" / "argument_specs.yml")
    assert "main" in spec.get("argument_specs", {}), (
        f"{role.name}: meta/argument_specs.yml has no 'main' entry"
    )


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_defaults_and_specs_have_the_same_keys(role: Path) -> None:
    defaults = set(_load(role / "defaults" / "main.yml"))
    specs = _load(role / "meta" / "argument_specs.yml").get("argument_specs", {})
    spec_keys: set[str] = set()
    for entry in specs.values():
        spec_keys |= set((entry or {}).get("options", {}) or {})
    # Required options have no default by nature; every default must be specified
    # and every optional specified key must have a default.
    required = {
        name
        for entry in specs.values()
        for name, opt in ((entry or {}).get("options", {}) or {}).items()
        if (opt or {}).get("required")
    }
    assert defaults - spec_keys == set(), (
        f"{role.name}: defaults not in argument_specs: {defaults - spec_keys}"
    )
    missing = spec_keys - defaults - required
    assert missing == set(), f"{role.name}: optional argument_specs options without a default: {missing}"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_public_variables_carry_the_role_prefix(role: Path) -> None:
    prefix = role.name + "_"
    defaults = _load(role / "defaults" / "main.yml")
    bad = [k for k in defaults if not k.startswith(prefix)]
    assert not bad, f"{role.name}: defaults without the '{prefix}' prefix: {bad}"

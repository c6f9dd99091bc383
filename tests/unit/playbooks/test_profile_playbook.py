"""playbooks/profile.yml waits long enough for the slow fleets it is written for."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[3]


def _verify_play() -> dict:
    plays = yaml.safe_load((ROOT / "playbooks" / "profile.yml").read_text())
    return next(
        role
        for play in plays
        for role in play.get("roles") or []
        if isinstance(role, dict) and role.get("role") == "llmfleet.cluster.verify"
    )


def _render(text: str, variables: dict) -> str:
    # jinja2's own default filter is Ansible's
    return jinja2.Environment(undefined=jinja2.Undefined).from_string(text).render(**variables)


def test_the_measured_request_may_take_minutes() -> None:
    # On inventories/demo-uneven the memory plan (the output layer on the quarter-CPU nas) made a
    # token every 5-10 s on this loaded machine: the verify role's 300 s timed the 64-token request out
    role = _verify_play()
    assert "verify_request_timeout" in role, "profile.yml leaves the verify role's 300 s timeout"
    assert int(_render(role["verify_request_timeout"], {})) >= 1800
    assert int(_render(role["verify_request_timeout"], {"profile_request_timeout": 60})) == 60

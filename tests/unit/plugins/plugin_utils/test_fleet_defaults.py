"""The fleet-wide settings' one home (plugins/plugin_utils/fleet_defaults.py, the lookup
llmfleet.cluster.fleet): there were 136 inline ``llmfleet_* | default(...)`` for 31 variables
(``llmfleet_output_dir`` 34 times, ``llmfleet_target`` 24), some of them free to disagree."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleLookupError
from ansible_collections.llmfleet.cluster.plugins.lookup.fleet import LookupModule
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import fleet_defaults as F

ROOT = Path(__file__).resolve().parents[4]
# Facts the roles set, not settings: an inline default of them stays where it is read.
FACTS = {"llmfleet_host", "llmfleet_plan", "llmfleet_wireguard_address"}


def _files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.yml", "*.yaml", "*.j2"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / f for f in out]


def test_a_setting_is_the_plays_value_else_its_one_default() -> None:
    given = {"llmfleet_output_dir": "/srv/out"}
    assert F.setting("llmfleet_output_dir", given.get) == "/srv/out"
    assert F.setting("llmfleet_target", given.get) == "systemd"
    assert F.setting("llmfleet_tls", given.get) is False
    assert F.setting("llmfleet_node_taints", given.get) == []
    # computed defaults: from another variable, from the environment; an empty endpoint is unset
    assert (
        F.setting("llmfleet_lock_file", {"inventory_dir": "/inv"}.get)
        == "/inv/group_vars/all/llmfleet_lock.yml"
    )
    assert F.setting("llmfleet_hf_endpoint", {"llmfleet_hf_endpoint": ""}.get).startswith("https://")
    with pytest.raises(F.FleetSettingError, match="'llmfleet_nope' is not a fleet-wide setting"):
        F.setting("llmfleet_nope", given.get)


def test_the_lookup_templates_the_plays_value() -> None:
    class Templar:
        def template(self, value):
            return value.replace("{{ x }}", "X") if isinstance(value, str) else value

    lookup = LookupModule()
    lookup._templar = Templar()
    assert lookup.run(["llmfleet_output_dir", "llmfleet_target"], {"llmfleet_output_dir": "/o/{{ x }}"}) == [
        "/o/X",
        "systemd",
    ]
    with pytest.raises(AnsibleLookupError, match=r"llmfleet\.cluster\.fleet: 'llmfleet_typo'"):
        lookup.run(["llmfleet_typo"], {})


def test_no_setting_has_an_inline_default_left() -> None:
    inline = re.compile(r"(?<![\w.\]'\"])(llmfleet_[a-z_]+) *\| *default\(")
    found = [
        f"{p.relative_to(ROOT)}: {m.group(1)}"
        for p in _files()
        for m in inline.finditer(p.read_text())
        if m.group(1) in F.SETTINGS
    ]
    assert found == []


def test_every_setting_asked_for_is_known_and_every_known_one_is_asked_for() -> None:
    asked = {
        m.group(1)
        for p in _files()
        for m in re.finditer(r"lookup\('llmfleet\.cluster\.fleet', '([a-z_]+)'\)", p.read_text())
    }
    assert asked - set(F.SETTINGS) == set(), "a typo or an unknown setting"
    # the planner's options are read through the plan_options lookup (roles/plan/vars/main.yml)
    assert set(F.SETTINGS) - asked - set(F.PLANNER_SETTINGS) == set(), "a default no file reads"
    assert not FACTS & set(F.SETTINGS)


def test_the_lookups_documentation_lists_every_setting() -> None:
    tree = ast.parse((ROOT / "plugins" / "lookup" / "fleet.py").read_text())
    doc = next(
        yaml.safe_load(ast.literal_eval(n.value))
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "DOCUMENTATION"
    )
    listed = set(re.findall(r"C\((llmfleet_[a-z_]+)\)", " ".join(doc["description"])))
    # every setting but the planner's options, which docs/planner.md lists (next test)
    assert set(F.SETTINGS) - set(F.PLANNER_SETTINGS) <= listed <= set(F.SETTINGS)


def test_the_planners_options_are_one_table() -> None:
    """Options (placement_hosts.py) is the planner's options table: fleet_defaults' defaults, the
    plan_options lookup and docs/planner.md's inputs table read it, so an option added there with a
    setting reaches the planner with no other file changed (there were 9 files to touch)."""
    import dataclasses

    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement_hosts as H

    table = {f.metadata["setting"]: f for f in dataclasses.fields(H.Options) if f.metadata.get("setting")}
    assert set(table) == set(F.PLANNER_SETTINGS) and "llmfleet_context" in table
    for name, field in table.items():
        default = field.metadata["unset"] if field.metadata["unset"] is not None else field.default
        assert F.setting(name, {}.get) == default, name
    # the inventory's values, read as each option's type; unset ones (and link_mbit's 0) left out
    given = {"llmfleet_context": "8192", "llmfleet_head_layers": "false", "llmfleet_link_mbit": 0}
    assert H.planner_options(given.get) == {"context": 8192, "head_layers": False}
    assert H.planner_options({"llmfleet_link_mbit": "100"}.get) == {"link_mbit": 100.0}
    with pytest.raises(
        H.PlanInputError,
        match=r"llmfleet_context must be of type int \(the planner's option context\), got 'many'",
    ):
        H.planner_options({"llmfleet_context": "many"}.get)
    # every planner setting is in docs/planner.md's inputs table
    doc = (ROOT / "docs" / "planner.md").read_text()
    rows = set(re.findall(r"^\| `(llmfleet_[a-z_]+)`", doc, re.M))
    rows |= {"llmfleet_cache_type_v"} if "`llmfleet_cache_type_k` / `_v`" in doc else set()
    assert set(table) <= rows


def test_the_options_table_refuses_what_it_does_not_have() -> None:
    import dataclasses

    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement_hosts as H

    with pytest.raises(H.PlanInputError, match=r"options: contxt is not a planner option \(known: .*context"):
        H.Options.from_dict({"contxt": 1})
    assert H.Options.from_dict({"context": 1024}).context == 1024

    # an option added to the table with bounds is checked by them, with no check written for it
    @dataclasses.dataclass(frozen=True)
    class Added(H.Options):
        slots: int = dataclasses.field(default=2, metadata=H.plan_option("llmfleet_slots", lo=1, hi=64))
        mode: str = dataclasses.field(
            default="a", metadata=H.plan_option("llmfleet_mode", choices=("a", "b"))
        )

    assert Added.from_dict({"slots": 64, "mode": "b"}).slots == 64
    with pytest.raises(H.PlanInputError, match=r"options: slots must be a number in \[1, 64\], got 65"):
        Added.from_dict({"slots": 65})
    with pytest.raises(H.PlanInputError, match=r"options: mode must be one of a, b, got 'c'"):
        Added.from_dict({"mode": "c"})


def test_the_plan_role_reads_the_table_through_the_lookup() -> None:
    plan_vars = yaml.safe_load((ROOT / "roles" / "plan" / "vars" / "main.yml").read_text())
    assert plan_vars["_plan_options"].startswith("{{ lookup('llmfleet.cluster.plan_options')")
    assert "plan_options" in yaml.safe_load((ROOT / "roles" / "plan" / "defaults" / "main.yml").read_text())

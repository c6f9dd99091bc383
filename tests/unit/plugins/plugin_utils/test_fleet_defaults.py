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
    assert set(F.SETTINGS) - asked == set(), "a default no file reads"
    assert not FACTS & set(F.SETTINGS)


def test_the_lookups_documentation_lists_every_setting() -> None:
    tree = ast.parse((ROOT / "plugins" / "lookup" / "fleet.py").read_text())
    doc = next(
        yaml.safe_load(ast.literal_eval(n.value))
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "DOCUMENTATION"
    )
    listed = set(re.findall(r"C\((llmfleet_[a-z_]+)\)", " ".join(doc["description"])))
    assert listed == set(F.SETTINGS)

"""The k3s role's units are defined once (roles/k3s/vars/main.yml, ``_k3s_units``) and published
by its ``names`` entry point as ``k3s_names``; the verify role reads the nodes' journal through it
(``verify_kubernetes_node_units`` unset) instead of typing ``k3s.service`` and
``k3s-agent.service`` again (issue #29)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.typed_names import typed_outside

ROOT = Path(__file__).resolve().parents[3]
K3S = ROOT / "roles" / "k3s"
VERIFY = ROOT / "roles" / "verify"
UNITS = {"server": "k3s.service", "agent": "k3s-agent.service"}
FILES = {"server": "/etc/systemd/system/k3s.service", "agent": "/etc/systemd/system/k3s-agent.service"}

PLAY = """
- name: Read the k3s role's names
  hosts: all
  gather_facts: false
  tasks:
    - name: Publish them
      ansible.builtin.include_role:
        name: llmfleet.cluster.k3s
        tasks_from: names
        public: true
    - name: Write what the role renders
      ansible.builtin.copy:
        content: "{{ {'names': k3s_names, 'unit': _k3s_unit, 'unit_file': _k3s_unit_file,
                     'unit_files': _k3s_unit_files} | to_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.json"
        mode: "0644"
"""


def _load(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook not on PATH")
def test_the_names_entry_point_gives_the_units_the_role_installs(tmp_path: Path) -> None:
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "children": {
                "k3s_server": {"hosts": {"server1": host}},
                "k3s_agent": {"hosts": {"agent1": host}},
            }
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_LOG_PATH", None)
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"),
         "-e", f"out={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for name, role in (("server1", "server"), ("agent1", "agent")):
        got = json.loads((tmp_path / f"{name}.json").read_text())
        assert got["names"] == {"units": UNITS, "unit_files": FILES}
        # the role's own unit and the files its reset removes come from the same definition
        assert got["unit"] + ".service" == UNITS[role]
        assert got["unit_file"] == FILES[role]
        assert got["unit_files"] == [FILES["server"], FILES["agent"]]


def test_names_is_an_entry_point_without_options() -> None:
    spec = _load(K3S / "meta" / "argument_specs.yml")["argument_specs"]
    assert spec["names"]["options"] == {}
    (task,) = _load(K3S / "tasks" / "names.yml")
    assert set(task["ansible.builtin.set_fact"]["k3s_names"]) == {"units", "unit_files"}
    assert _load(K3S / "vars" / "main.yml")["_k3s_units"] == {"server": "k3s", "agent": "k3s-agent"}


def test_verify_reads_the_k3s_roles_units_when_left_at_its_default() -> None:
    # verify's defaults and argument spec typed [k3s.service, k3s-agent.service]
    assert _load(VERIFY / "defaults" / "main.yml")["verify_kubernetes_node_units"] is None
    option = _load(VERIFY / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"][
        "verify_kubernetes_node_units"
    ]
    assert "default" not in option and option["type"] == "list"
    preflight = _load(VERIFY / "tasks" / "preflight.yml")
    include = next(
        t
        for t in preflight
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.k3s"
    )
    assert include["ansible.builtin.include_role"]["tasks_from"] == "names"
    assert include["ansible.builtin.include_role"]["apply"]["tags"] == ["verify", "verify_preflight"]
    # only on Kubernetes and only when the setting is left unset ([] is pod logs only)
    assert include["when"] == "_verify_on_kubernetes | bool and verify_kubernetes_node_units is none"
    names = [t["name"] for t in preflight]
    assert names.index(include["name"]) < names.index("Check the Kubernetes inputs")
    node_units = _load(VERIFY / "vars" / "main.yml")["_verify_node_units"]
    assert "k3s_names.units" in node_units and "verify_kubernetes_node_units is not none" in node_units
    # every reader goes through _verify_node_units
    direct = [
        f"{p.relative_to(ROOT).as_posix()}:{n}"
        for p in sorted(VERIFY.glob("tasks/*.yml"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "verify_kubernetes_node_units" in line and "is none" not in line
    ]
    assert direct == []


def test_no_role_but_k3s_types_its_unit_names() -> None:
    """Roles, playbooks and plugins (comments aside) read k3s_names; molecule/ and docs/ may
    name the units."""
    pattern = re.compile(r"\bk3s(-agent)?\.service\b|['\"]k3s-agent['\"]")
    assert typed_outside(pattern, "k3s") == []

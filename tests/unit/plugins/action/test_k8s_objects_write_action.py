"""The action plugin k8s_objects_write: the task's arguments, check and diff mode, and the role's render.

The direct calls check what the plugin takes from the task (check mode, diff mode, unknown and
missing arguments, an error as a failed task); the playbook runs the role llmfleet.cluster.k8s_objects
as the Kubernetes roles do, with --check --diff and then for real, and reads what it printed.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path
from unittest.mock import MagicMock

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible_collections.llmfleet.cluster.plugins.action.k8s_objects_write import ActionModule
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import apply_order

from tests.support.ansible_env import ansible_env

ROOT = Path(__file__).resolve().parents[4]
SECRET_VALUE = "sk-never-printed-4e7b21"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t-config\ndata:\n  a: b\n"
SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "t-key"},
    "stringData": {"k": SECRET_VALUE},
}


def action(args: dict, check_mode: bool = False, diff: bool = False) -> ActionModule:
    task = MagicMock()
    task.args = args
    task.check_mode, task.diff, task.async_val = check_mode, diff, 0
    return ActionModule(task, MagicMock(), MagicMock(), loader=None, templar=None, shared_loader_obj=None)


def test_the_task_check_and_diff_mode_reach_the_writer(tmp_path: Path) -> None:
    objects = apply_order([{"file": "t-01-config.yaml", "content": CM}])
    out = tmp_path / "m"
    result = action({"objects": objects, "dir": str(out)}, check_mode=True, diff=True).run(task_vars={})
    assert result["changed"] is True and result["written"] == ["t-01-config.yaml"]
    assert not out.exists()
    assert [d["after"] for d in result["diff"] if d.get("after_header", "").endswith(".yaml")] == [CM]
    result = action({"objects": objects, "dir": str(out)}).run(task_vars={})
    assert "diff" not in result and (out / "t-01-config.yaml").read_text() == CM
    assert action({"objects": objects, "dir": str(out)}).run(task_vars={})["changed"] is False


def test_bad_arguments_and_write_errors_fail_the_task(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail, match="dest"):
        action({"objects": [], "dir": str(tmp_path), "dest": "x"}).run(task_vars={})
    with pytest.raises(AnsibleActionFail, match="dir"):
        action({"objects": []}).run(task_vars={})
    (tmp_path / "f").write_text("")
    with pytest.raises(AnsibleActionFail, match="is not a directory"):
        action({"objects": [], "dir": str(tmp_path / "f")}).run(task_vars={})


PLAYBOOK = """
- name: Render two objects as the Kubernetes roles do
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Render
      ansible.builtin.import_role:
        name: llmfleet.cluster.k8s_objects
      vars:
        k8s_objects_render_only: true
        k8s_objects_manifest_dir: "{{ out }}"
        k8s_objects_namespace: t
        k8s_objects_stale_pattern: t-*.yaml
        k8s_objects_manifests: "{{ manifests }}"
"""


def test_the_role_renders_with_check_and_diff_and_prints_no_secret(tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    manifests = [{"file": "t-01-config.yaml", "content": CM}, {"file": "t-00-key.yaml", "object": SECRET}]
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({"out": str(out), "manifests": manifests}))

    def play(*args: str) -> str:
        cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")]
        proc = subprocess.run(
            [*cmd, "-e", f"@{tmp_path / 'vars.yml'}", *args],
            cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert SECRET_VALUE not in proc.stdout + proc.stderr
        return proc.stdout

    printed = play("--check", "--diff")
    assert not out.exists()
    assert "+  name: t-config" in printed  # the ConfigMap's diff is shown
    assert "changed=2" in printed

    printed = play("--diff")
    assert "+  name: t-config" in printed
    assert (out / "t-01-config.yaml").read_text() == CM
    assert stat.S_IMODE((out / "t-00-key.yaml").stat().st_mode) == 0o600
    assert SECRET_VALUE in (out / "t-00-key.yaml").read_text()

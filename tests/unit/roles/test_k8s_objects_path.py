"""The Kubernetes targets write and apply their objects through one sequence, under one set of names.

llmfleet.cluster.k8s_objects (roles/k8s_objects/tasks/main.yml) is the only task file that applies
objects server-side or writes manifests; llama_rpc, chat_ui and vllm_lws import it. llama_rpc's
kubernetes_teardown.yml spells no object name: they come from llama_rpc_k8s.NAMES through the
filter llmfleet.cluster.llama_rpc_k8s_teardown. Each test fails when a role grows its own copy of
the sequence again or a name is typed in the teardown.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import NAMES

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT / "roles" / "k8s_objects" / "tasks" / "main.yml"
USERS = {
    "llama_rpc": "roles/llama_rpc/tasks/kubernetes.yml",
    "chat_ui": "roles/chat_ui/tasks/kubernetes.yml",
    "vllm_lws": "roles/vllm_lws/tasks/main.yml",
}


def _tasks(tasks):
    for task in tasks or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def _load(path: Path) -> list[dict]:
    return list(_tasks(yaml.safe_load(path.read_text())))


def _applies(task: dict) -> bool:
    args = task.get("kubernetes.core.k8s") or task.get("k8s")
    return isinstance(args, dict) and args.get("apply") is True


def _writes_manifests(task: dict) -> bool:
    if "llmfleet.cluster.k8s_objects_write" in task or "k8s_objects_write" in task:
        return True
    for module in ("ansible.builtin.template", "ansible.builtin.copy"):
        args = task.get(module)
        if isinstance(args, dict) and "manifest" in str(args.get("dest", "")):
            return True
    return False


def test_only_the_shared_role_applies_or_writes_manifests() -> None:
    found = []
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        if path == SHARED:
            continue
        found += [
            f"{path.relative_to(ROOT)}: {t.get('name')}"
            for t in _load(path)
            if _applies(t) or _writes_manifests(t)
        ]
    assert found == [], (
        "these tasks apply or write Kubernetes objects themselves; hand them to llmfleet.cluster.k8s_objects"
    )
    shared = _load(SHARED)
    assert sum(_applies(t) for t in shared) == 3 and sum(_writes_manifests(t) for t in shared) == 2


@pytest.mark.parametrize("role", sorted(USERS))
def test_each_kubernetes_role_imports_the_shared_sequence(role: str) -> None:
    tasks = _load(ROOT / USERS[role])
    imports = [
        t
        for t in tasks
        if (t.get("ansible.builtin.import_role") or {}).get("name") == "llmfleet.cluster.k8s_objects"
    ]
    assert len(imports) == 1, f"{USERS[role]} must import llmfleet.cluster.k8s_objects once"
    given = set(imports[0].get("vars") or {})
    spec = yaml.safe_load((ROOT / "roles" / "k8s_objects" / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert given <= set(options), (
        f"{USERS[role]} passes variables the role does not take: {given - set(options)}"
    )
    assert {n for n, o in options.items() if o.get("required")} <= given


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_the_teardown_spells_no_object_name() -> None:
    path = ROOT / "roles" / "llama_rpc" / "tasks" / "kubernetes_teardown.yml"
    spelt = []
    for task in _load(path):
        args = {k: v for k, v in task.items() if k not in ("name", "block", "rescue", "always")}
        for text in _strings(args):
            spelt += [f"{task['name']}: {name!r}" for name in set(NAMES.values()) if name in text]
    assert spelt == [], "kubernetes_teardown.yml must take these from llama_rpc_k8s_teardown (NAMES)"

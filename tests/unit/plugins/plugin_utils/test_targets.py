"""The target registry (plugins/plugin_utils/targets.py) and every list that must agree with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleLookupError
from ansible_collections.llmfleet.cluster.plugins.lookup.target import LookupModule
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import targets as T
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import NAMES

ROOT = Path(__file__).resolve().parents[4]


def _yaml(path: str):
    return yaml.safe_load((ROOT / path).read_text())


def _spec_choices(role: str, option: str, entry_point: str = "main") -> list:
    spec = _yaml(f"roles/{role}/meta/argument_specs.yml")["argument_specs"][entry_point]
    return spec["options"][option]["choices"]


def _doc(path: str) -> dict:
    """A filter's DOCUMENTATION, from its sidecar file (plugins/filter/<name>.yml)."""
    return _yaml(path)["DOCUMENTATION"]


def test_the_lists_of_targets_are_the_registry() -> None:
    names = T.names()
    assert names == ["systemd", "kubernetes", "lws"]
    assert json.loads((ROOT / "docs/plan.schema.json").read_text())["properties"]["target"]["enum"] == names
    assert _doc("plugins/filter/plan_placement.yml")["options"]["target"]["choices"] == names
    assert _doc("plugins/filter/plan.yml")["options"]["target"]["choices"] == names
    assert _spec_choices("chat_ui", "chat_ui_target") == names
    assert _spec_choices("verify", "verify_target") == names
    # llama_rpc deploys (and removes) exactly the targets the registry gives it.
    mine = T.roles("llmfleet.cluster.llama_rpc")
    assert mine == ["systemd", "kubernetes"]
    assert _spec_choices("llama_rpc", "llama_rpc_target") == mine
    assert _spec_choices("llama_rpc", "llama_rpc_target", "teardown") == mine


@pytest.mark.parametrize("name", T.names())
def test_each_entry_names_a_role_and_playbook_that_exist(name: str) -> None:
    entry = T.resolve(name)
    role = entry["role"].split(".")[-1]
    assert (ROOT / "roles" / role / "meta" / "argument_specs.yml").is_file()
    playbook = (ROOT / "playbooks" / entry["playbook"]).read_text()
    assert entry["role"] in playbook
    if role == "llama_rpc":  # it includes tasks/<target>.yml
        assert (ROOT / "roles/llama_rpc/tasks" / (name + ".yml")).is_file()
    assert entry["backend"] in ("llama_cpp", "vllm") and entry["plan_hosts"] in ("fewest", "all")


def test_the_registry_defaults_are_the_roles_defaults() -> None:
    rpc, lws = T.SERVERS["llama_rpc"], T.SERVERS["vllm_lws"]
    rpc_defaults = _yaml("roles/llama_rpc/defaults/main.yml")
    lws_defaults = _yaml("roles/vllm_lws/defaults/main.yml")
    for server, defaults in ((rpc, rpc_defaults), (lws, lws_defaults)):
        for var, default in (server.namespace, server.service, server.port, server.api_key_secret):
            if var:
                assert defaults[var] == default, var
    for role in ("chat_ui", "verify", "bench"):
        assert _yaml(f"roles/{role}/defaults/main.yml")[f"{role}_api_key_file"] == rpc.api_key_file
    # the Kubernetes objects of llama_rpc carry the registry's names
    assert NAMES["api"] == rpc.service[1] == "llama-server"
    assert NAMES["secret"] == rpc.api_key_secret[1]["name"] == "llama-rpc-api-key"


def test_resolve_gives_the_names_other_roles_reach_the_api_by() -> None:
    # The values chat_ui's and verify's defaults spelled out before the registry.
    k8s = T.resolve("kubernetes")
    assert k8s["namespace"] == "llmfleet"
    assert k8s["upstream_url"] == "http://llama-server.llmfleet.svc:8080"
    assert k8s["api_key_secret"] == {"name": "llama-rpc-api-key", "key": "api-key"}
    lws = T.resolve("lws")
    assert lws["namespace"] == "vllm" and lws["upstream_url"] == "http://vllm-leader.vllm.svc:8000"
    assert lws["api_key_secret"] == {"name": "vllm-api-key", "key": "key"}
    values = {"vllm_lws_name": "big", "vllm_lws_namespace": "ml", "vllm_lws_port": "9000"}
    lws = T.resolve("lws", values.get)
    assert lws["upstream_url"] == "http://big-leader.ml.svc:9000" and lws["namespace"] == "ml"
    k8s = T.resolve("kubernetes", {"llama_rpc_k8s_namespace": "x", "llama_rpc_api_port": 81}.get)
    assert k8s["upstream_url"] == "http://llama-server.x.svc:81"
    systemd = T.resolve("systemd")
    assert systemd["on_hosts"] and systemd["tunnel"] and not systemd["kubernetes"]
    assert [t for t in T.names() if T.get(t).on_hosts] == ["systemd"]
    with pytest.raises(T.TargetError, match=r"'podman' \(known: systemd, kubernetes, lws\)"):
        T.resolve("podman")


class _Templar:
    def template(self, value):
        return value


def test_the_lookup_reads_the_play_variables() -> None:
    lookup = LookupModule()
    lookup._templar = _Templar()
    got = lookup.run(["lws"], variables={"vllm_lws_namespace": "ml", "llama_rpc_k8s_namespace": "no"})
    assert [g["namespace"] for g in got] == ["ml"]
    assert [g["name"] for g in lookup.run([], variables={})] == T.names()
    with pytest.raises(AnsibleLookupError, match="unknown llmfleet target 'x'"):
        lookup.run(["x"], variables={})

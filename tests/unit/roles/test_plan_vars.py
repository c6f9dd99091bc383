"""The plan role's vars: the candidate workers it hands the planner, rendered with Ansible's templar."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.fleet_lookup import inline_fleet_lookups

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "plan"


def _trusted(value):
    """Mark strings as templates, the way Ansible treats a role's defaults and vars files."""
    try:
        from ansible.template import trust_as_template  # ansible-core >= 2.19
    except ImportError:  # pragma: no cover - older ansible-core trusts every string
        return value
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def render(name: str, groups: dict) -> object:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    variables: dict = {}
    variables.update(
        _trusted(yaml.safe_load(inline_fleet_lookups((ROLE / "defaults" / "main.yml").read_text())))
    )
    variables.update(_trusted(yaml.safe_load(inline_fleet_lookups((ROLE / "vars" / "main.yml").read_text()))))
    variables["groups"] = groups
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(_trusted("{{ " + name + " }}"))


def test_candidate_workers_keep_the_inventory_order() -> None:
    # plan.json records the candidates in this order (planned_with.hosts, unused) and the llama_rpc
    # ConfigMap's checksum hashes plan.json: a set's order (salted string hashes, another order in
    # every process) re-rendered the manifests on every run. Twelve names: a set keeps their
    # inventory order by chance about once in 12! runs.
    workers = [f"w{i:02d}" for i in (7, 3, 11, 0, 9, 1, 5, 10, 2, 8, 4, 6)]
    groups = {"llm_head": ["head1"], "llm_workers": [workers[0], "head1", *workers[1:]]}
    assert render("_plan_worker_hosts", groups) == workers  # the head is left out, the order kept
    assert render("_plan_head_hosts + _plan_worker_hosts", groups) == ["head1", *workers]


def test_no_worker_group_means_no_candidate_workers() -> None:
    assert render("_plan_worker_hosts", {"llm_head": ["head1"]}) == []

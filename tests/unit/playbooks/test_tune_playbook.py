"""playbooks/tune.yml and its round (playbooks/tasks/tune_round.yml): what a run may skip or change."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def _tasks(path: Path) -> list:
    return yaml.safe_load(path.read_text())


def _serves(task: dict) -> bool:
    inc = task.get("ansible.builtin.include_role") or {}
    return inc.get("name") == "llmfleet.cluster.llama_rpc" and inc.get("tasks_from") == "serve_plan"


def test_a_head_only_round_is_served_by_the_llama_rpc_role() -> None:
    # a later site.yml must see no change on a tuned fleet: the round's plan is written by the
    # role's one writer (serve_plan), not by a copy of it here
    tasks = _tasks(ROOT / "playbooks" / "tasks" / "tune_round.yml")
    assert not [t for t in tasks if "ansible.builtin.copy" in t or "ansible.builtin.systemd_service" in t]
    serve = next(t for t in tasks if _serves(t))
    assert serve["vars"]["llama_rpc_plan"] == "{{ llmfleet_plan }}"
    assert "__tune_head_only | bool" in serve["when"] and "llmfleet_plan.head" in serve["when"]
    # the role deploys a round only when it is not head-only
    deploy = next(
        t
        for t in tasks
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.llama_rpc"
        and "tasks_from" not in t["ansible.builtin.include_role"]
    )
    assert deploy["when"] == "not __tune_head_only | bool"


def test_the_rounds_measure_through_the_fleets_entry_point_and_say_why_none_answered() -> None:
    # llmfleet_tls: llama-server listens on the head's loopback; http://<head>:8080 from the
    # controller got nothing, and the no_log task ended in tune_report's "ok requests: 0"
    plays = _tasks(ROOT / "playbooks" / "tune.yml")
    play = next(p for p in plays if str(p.get("name", "")).startswith("Measure the plans alternately"))
    endpoint = play["vars"]["_tune_endpoint"]
    assert "llmfleet.cluster.api_endpoint" in endpoint
    assert "tls=lookup('llmfleet.cluster.fleet', 'llmfleet_tls')" in endpoint
    tasks = _tasks(ROOT / "playbooks" / "tasks" / "tune_round.yml")
    names = [t.get("name", "") for t in tasks]
    measure = next(t for t in tasks if "llmfleet.cluster.api_bench" in t)
    assert measure["no_log"] is True
    args = measure["llmfleet.cluster.api_bench"]
    assert args["url"] == "{{ _tune_endpoint.url }}" and "__tune_ca" in args["ca_data"]
    ca = next(t for t in tasks if t.get("register") == "__tune_ca")
    assert "_tune_endpoint.tls" in ca["when"]
    said = next(t for t in tasks if "ansible.builtin.assert" in t)
    assert "no_log" not in said
    assert names.index(said["name"]) == names.index(measure["name"]) + 1
    assert "__tune_load.summary.failure" in said["ansible.builtin.assert"]["fail_msg"]
    assert "api_key" not in said["ansible.builtin.assert"]["fail_msg"]


def test_a_revert_round_is_served_but_not_measured() -> None:
    tasks = _tasks(ROOT / "playbooks" / "tasks" / "tune_round.yml")
    measure = next(t for t in tasks if "llmfleet.cluster.api_bench" in t)
    keep = next(t for t in tasks if str(t.get("name", "")).startswith("Keep round"))
    for t in (measure, keep):
        assert t["when"] == "__tune_round != 'revert'"
    plays = _tasks(ROOT / "playbooks" / "tune.yml")
    tasks = [t for p in plays for t in p.get("tasks") or []]
    revert = next(t for t in tasks if str(t.get("name", "")).startswith("Serve the running plan again"))
    assert revert["vars"]["__tune_round"] == "revert"
    assert "not __tune.gain_confirmed" in revert["when"]
    keep_plan = next(t for t in tasks if str(t.get("name", "")).startswith("Keep the confirmed speed plan"))
    assert (
        "__tune.gain_confirmed" in keep_plan["when"] and "not __tune.gain_confirmed" not in keep_plan["when"]
    )


def test_profile_yml_runs_only_when_the_decision_says_so() -> None:
    plays = _tasks(ROOT / "playbooks" / "tune.yml")
    imported = next(p for p in plays if p.get("ansible.builtin.import_playbook") == "profile.yml")
    assert "__tune_measure.measure" in imported["when"] and "not ansible_check_mode" in imported["when"]
    probe = next(
        t
        for p in plays
        for t in p.get("pre_tasks") or []
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.probe"
    )
    # without profile.yml's probe the plan role has no facts: probe then
    assert probe["when"] == "ansible_check_mode or not __tune_measure.measure"


def test_profile_yml_puts_the_served_plan_back_through_the_role() -> None:
    # it put it back with mode 0644: the next round (or site.yml) rewrote it 0640 and restarted
    # llama-server for nothing; now the role's one writer serves the kept plan again
    back = next(
        t
        for p in _tasks(ROOT / "playbooks" / "profile.yml")
        for t in p.get("tasks") or []
        if t.get("name") == "Serve the kept plan again"
    )
    assert _serves(back) and back["vars"]["llama_rpc_serve_restore"] is True


def test_check_mode_does_not_write_the_re_plan() -> None:
    # tune.yml --check reported changed=1: the plan role's "Write plan.json" of <out>/tune/plan.json
    # (the re-plan's planned_with probe figures differ run to run)
    plays = _tasks(ROOT / "playbooks" / "tune.yml")
    plan = next(r for p in plays for r in p.get("roles") or [] if r.get("role") == "llmfleet.cluster.plan")
    assert plan["plan_write"] == "{{ not ansible_check_mode }}"
    write = next(
        t
        for t in _tasks(ROOT / "roles" / "plan" / "tasks" / "main.yml")
        if t["name"] == "Write plan.json and plan.md"
    )
    assert write["when"] == "plan_write | bool"
    assert (ROOT / "roles" / "plan" / "defaults" / "main.yml").read_text().count("\nplan_write: true\n") == 1


def test_molecule_tune_converges_without_site_verify() -> None:
    # molecule/tune's test measures the fleet itself: its converge leaves verify.yml out (~70 s)
    site = _tasks(ROOT / "playbooks" / "site.yml")
    verify = next(p for p in site if p.get("ansible.builtin.import_playbook") == "verify.yml")
    assert "lookup('llmfleet.cluster.fleet', 'llmfleet_site_verify') | bool" in verify["when"]
    scenario = yaml.safe_load((ROOT / "molecule" / "tune" / "molecule.yml").read_text())
    group_vars = scenario["provisioner"]["inventory"]["group_vars"]["all"]
    assert group_vars["llmfleet_site_verify"] is False
    # every host with the same high CPU weight (the full-CPU worker gets its CPU, session 7's +7 %)
    for platform in scenario["platforms"]:
        assert "--cpu-shares=8192" in platform["extra_opts"], platform["name"]

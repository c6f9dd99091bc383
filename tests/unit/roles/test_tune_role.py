"""The tune role (playbooks/tune.yml is this role) and its round (tasks/round.yml): what a run may
skip or change, every setting in its argument spec."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "tune"


def _tasks(path: Path) -> list:
    return yaml.safe_load(path.read_text())


def _role(name: str) -> list:
    return _tasks(ROLE / "tasks" / f"{name}.yml")


def _all() -> list:
    return [t for p in sorted((ROLE / "tasks").glob("*.yml")) for t in _tasks(p)]


def _serves(task: dict) -> bool:
    inc = task.get("ansible.builtin.include_role") or {}
    return inc.get("name") == "llmfleet.cluster.llama_rpc" and inc.get("tasks_from") == "serve_plan"


def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def test_the_playbook_is_the_role_on_the_fleets_hosts() -> None:
    (play,) = _tasks(ROOT / "playbooks" / "tune.yml")
    assert play["hosts"] == "llm_head:llm_workers"
    assert play["roles"] == [{"role": "llmfleet.cluster.tune"}]
    assert not (ROOT / "playbooks" / "tasks").exists()


def test_every_setting_has_a_spec_and_one_default() -> None:
    # tune.yml and its round read 14 settings with an inline `| default(...)` each, none in a spec
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    assert set(spec["options"]) == set(_defaults())
    for name, option in spec["options"].items():
        assert option.get("description") and option.get("type"), name
    texts = [p.read_text() for p in [*(ROLE / "tasks").glob("*.yml"), ROLE / "vars" / "main.yml"]]
    for name in _defaults():
        assert not any(f"{name} | default(" in t for t in texts), name
        assert any(name in t for t in texts), f"{name} is not used"
    # the fleet's settings through the fleet lookup, other roles' settings through this role's own
    assert not any(re.search(r"(?<![a-z_])(chat_ui_port|llama_cpp_build)", t) for t in texts)
    assert not any("hostvars[groups" in t for t in texts)


def test_a_head_only_round_is_served_by_the_llama_rpc_role() -> None:
    # a later site.yml must see no change on a tuned fleet: the round's plan is written by the
    # role's one writer (serve_plan), not by a copy of it here
    tasks = _role("round")
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
    endpoint = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_tune_endpoint"]
    assert "llmfleet.cluster.api_endpoint" in endpoint
    assert "tls=lookup('llmfleet.cluster.fleet', 'llmfleet_tls')" in endpoint
    assert "tls_port=tune_tls_port" in endpoint
    assert _defaults()["tune_tls_port"] == "{{ chat_ui_port | default(8088) }}"
    tasks = _role("round")
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
    tasks = _role("round")
    measure = next(t for t in tasks if "llmfleet.cluster.api_bench" in t)
    keep = next(t for t in tasks if str(t.get("name", "")).startswith("Keep round"))
    for t in (measure, keep):
        assert t["when"] == "__tune_round != 'revert'"
    revert = next(
        t for t in _role("rounds") if str(t.get("name", "")).startswith("Serve the running plan again")
    )
    assert revert["vars"]["__tune_round"] == "revert"
    assert revert["ansible.builtin.include_tasks"]["file"] == "round.yml"
    assert "not __tune.gain_confirmed" in revert["when"]
    keep_plan = next(
        t for t in _role("write") if str(t.get("name", "")).startswith("Keep the confirmed speed plan")
    )
    assert (
        "__tune.gain_confirmed" in keep_plan["when"] and "not __tune.gain_confirmed" not in keep_plan["when"]
    )
    assert keep_plan["delegate_to"] == "localhost" and keep_plan["run_once"] is True


def test_the_profile_role_runs_only_when_the_decision_says_so() -> None:
    main = _role("main")
    profile = next(
        t
        for t in main
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.profile"
    )
    assert "__tune_measure.measure" in profile["when"] and "not ansible_check_mode" in profile["when"]
    assert profile["vars"]["profile_output_dir"] == "{{ tune_output_dir }}"
    # it runs after the decision and before the re-plan
    files = [(t.get("ansible.builtin.import_tasks") or {}).get("file") for t in main]
    assert files.index("running.yml") < main.index(profile) < files.index("replan.yml")
    probe = next(
        t
        for t in _role("replan")
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.probe"
    )
    # without the profile role's probe the plan role has no facts: probe then
    assert probe["when"] == "ansible_check_mode or not __tune_measure.measure"


def test_the_profile_role_puts_the_served_plan_back_through_llama_rpc() -> None:
    # profile.yml put it back with mode 0644: the next round (or site.yml) rewrote it 0640 and
    # restarted llama-server for nothing; now the role's one writer serves the kept plan again
    back = next(
        t
        for t in _tasks(ROOT / "roles" / "profile" / "tasks" / "restore.yml")
        if t.get("name") == "Serve the kept plan again"
    )
    assert _serves(back) and back["vars"]["llama_rpc_serve_restore"] is True


def test_check_mode_does_not_write_the_re_plan() -> None:
    # tune.yml --check reported changed=1: the plan role's "Write plan.json" of <out>/tune/plan.json
    # (the re-plan's planned_with probe figures differ run to run)
    plan = next(
        t
        for t in _role("replan")
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.plan"
    )
    assert plan["vars"]["plan_write"] == "{{ not ansible_check_mode }}"
    write = next(
        t
        for t in _tasks(ROOT / "roles" / "plan" / "tasks" / "main.yml")
        if t["name"] == "Write plan.json and plan.md"
    )
    assert write["when"] == "plan_write | bool"
    assert (ROOT / "roles" / "plan" / "defaults" / "main.yml").read_text().count("\nplan_write: true\n") == 1


def test_the_decision_reads_the_plan_roles_published_result() -> None:
    # tune.yml read the plan role's private __plan_speed and __plan_layout
    assert not any("__plan_" in p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    decide = next(
        t for t in _role("replan") if t.get("name") == "Predict both plans with the same figures and decide"
    )
    call = decide["ansible.builtin.set_fact"]["__tune_decision"]
    assert "speed=plan_result.speed" in call and "layout=plan_result.layout" in call
    published = next(
        t
        for t in _tasks(ROOT / "roles" / "plan" / "tasks" / "compute.yml")
        if "plan_result" in (t.get("ansible.builtin.set_fact") or {})
    )
    assert set(published["ansible.builtin.set_fact"]["plan_result"]) == {"speed", "layout"}
    assert published["run_once"] is True
    spec = yaml.safe_load((ROOT / "roles" / "plan" / "meta" / "argument_specs.yml").read_text())
    assert "C(plan_result)" in " ".join(spec["argument_specs"]["main"]["description"])


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

"""One writer of the head's plan.json: llama_rpc's tasks/plan_file.yml, reached by its deploy
(systemd_head.yml) and by its public entry point serve_plan (the profile and tune roles); the unit
names and the plan's path come from llama_rpc's vars only (there were four writers, at two modes,
and the names were typed 21 times in playbooks/)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.typed_names import typed_outside

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "llama_rpc"


def _tasks(path: Path) -> list:
    return yaml.safe_load(path.read_text()) or []


def _walk(tasks: list):
    for t in tasks or []:
        if not isinstance(t, dict):
            continue
        yield t
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from _walk(t.get(key) or [])


def _all_tasks():
    for path in sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/**/*.yml")]):
        for t in _walk(_tasks(path)):
            yield path, t


def test_only_plan_file_yml_writes_the_heads_plan() -> None:
    writers = []
    for path, t in _all_tasks():
        for module in ("ansible.builtin.copy", "ansible.builtin.template"):
            args = t.get(module) or {}
            dest = str(args.get("dest", ""))
            if "_llama_rpc_plan_file" in dest or (
                re.search(r"plan\.json\b", dest) and "localhost" not in str(t.get("delegate_to", ""))
            ):
                writers.append((path.relative_to(ROOT).as_posix(), t.get("name")))
    assert writers == [("roles/llama_rpc/tasks/plan_file.yml", "Write the plan the supervisor follows")]
    write = _tasks(ROLE / "tasks" / "plan_file.yml")[0]["ansible.builtin.copy"]
    assert (write["owner"], write["mode"], write["group"]) == ("root", "0640", "{{ llama_rpc_group }}")


def test_the_deploy_and_serve_plan_reach_the_one_writer() -> None:
    head = list(_tasks(ROLE / "tasks" / "systemd_head.yml"))
    assert any((t.get("ansible.builtin.import_tasks") or {}).get("file") == "plan_file.yml" for t in head)
    serve = _tasks(ROLE / "tasks" / "serve_plan.yml")
    names = [t["name"] for t in serve]
    include = next(t for t in serve if "ansible.builtin.include_tasks" in t)
    assert include["ansible.builtin.include_tasks"]["file"] == "plan_file.yml"
    # restarted by the handler (when the plan changed), then healthy before the caller measures
    flush = next(t for t in serve if t.get("ansible.builtin.meta") == "flush_handlers")
    assert (
        names.index(include["name"])
        < names.index(flush["name"])
        < names.index("Wait until llama-server answers on it")
    )
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert {"serve_plan", "names"} <= set(specs)


def test_every_writer_serves_through_the_entry_point() -> None:
    served = [
        path.relative_to(ROOT).as_posix()
        for path, t in _all_tasks()
        if (t.get("ansible.builtin.include_role") or {}).get("tasks_from") == "serve_plan"
    ]
    # the measuring placements (one include, looped) and the restore; tune's round
    assert served.count("roles/profile/tasks/request.yml") == 1
    assert served.count("roles/profile/tasks/restore.yml") == 1
    assert served.count("roles/tune/tasks/round.yml") == 1
    assert sorted(set(served)) == [
        "roles/profile/tasks/request.yml",
        "roles/profile/tasks/restore.yml",
        "roles/tune/tasks/round.yml",
    ]
    assert not (ROOT / "playbooks" / "tasks" / "profile_serve.yml").exists()


def test_no_unit_name_or_plan_path_is_typed_outside_llama_rpcs_vars() -> None:
    """Neither llama_rpc's unit names nor the head's plan paths appear in the playbooks, the
    other roles or the plugins (code, role specs, module docs; comments aside): they read
    llama_rpc_names (tasks_from=names)."""
    pattern = re.compile(
        r"llmfleet-(llama|rpc)-server\.service|llmfleet-firewall\.service|/etc/llmfleet/plan\.json"
        r"|plan\.json\.served|/etc/systemd/system/llmfleet|/run/systemd/system/llmfleet"
    )
    assert typed_outside(pattern, "llama_rpc") == []
    names = _tasks(ROLE / "tasks" / "names.yml")[0]["ansible.builtin.set_fact"]["llama_rpc_names"]
    assert names["units"] == "{{ _llama_rpc_units }}" and names["plan_file"] == "{{ _llama_rpc_plan_file }}"


def test_the_bench_reads_llama_rpcs_names() -> None:
    """The bench charts the units llama_rpc installs unless told others."""
    bench = ROOT / "roles" / "bench"
    defaults = yaml.safe_load((bench / "defaults" / "main.yml").read_text())
    assert defaults["bench_units"] == {}
    preflight = _tasks(bench / "tasks" / "preflight.yml")
    include = preflight[0]["ansible.builtin.include_role"]
    assert include == {"name": "llmfleet.cluster.llama_rpc", "tasks_from": "names"}
    bench_vars = yaml.safe_load((bench / "vars" / "main.yml").read_text())
    assert "llama_rpc_names.units" in bench_vars["_bench_units"]


def test_verify_reads_llama_rpcs_names() -> None:
    """verify samples the units llama_rpc installs unless told others (its default and argument
    spec typed them)."""
    verify = ROOT / "roles" / "verify"
    defaults = yaml.safe_load((verify / "defaults" / "main.yml").read_text())
    assert defaults["verify_units"] == {}
    spec = yaml.safe_load((verify / "meta" / "argument_specs.yml").read_text())
    assert spec["argument_specs"]["main"]["options"]["verify_units"]["default"] == {}
    preflight = _tasks(verify / "tasks" / "preflight.yml")
    include = next(t for t in preflight if "ansible.builtin.include_role" in t)
    assert include["ansible.builtin.include_role"]["name"] == "llmfleet.cluster.llama_rpc"
    assert include["ansible.builtin.include_role"]["tasks_from"] == "names"
    # tagged like the preflight, so that --tags verify still reads them
    assert include["ansible.builtin.include_role"]["apply"]["tags"] == ["verify", "verify_preflight"]
    names = [t["name"] for t in preflight]
    assert names.index(include["name"]) < names.index("Check the idle window and the thresholds")
    verify_vars = yaml.safe_load((verify / "vars" / "main.yml").read_text())
    assert "llama_rpc_names.units.head" in verify_vars["_verify_units"]
    assert "llama_rpc_names.units.worker" in verify_vars["_verify_units"]
    # every reader goes through _verify_units (the setting or llama_rpc's names)
    direct = [
        f"{p.relative_to(ROOT).as_posix()}:{n}"
        for p in sorted([*verify.glob("tasks/*.yml"), verify / "vars" / "main.yml"])
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"(?<!_)verify_units(\.|\[|\.values|,)", line)
    ]
    assert direct == []


def test_the_kubernetes_templates_take_the_plan_path_and_config_dir_from_the_roles_vars() -> None:
    """The head pod's --plan is the role's one plan path (llama_rpc_config_dir/plan.json), and the
    pods mount their ConfigMap at that directory: nothing under templates/ types them."""
    typed = [
        f"{p.relative_to(ROOT).as_posix()}:{n}"
        for p in sorted((ROLE / "templates").rglob("*.j2"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "/etc/llmfleet" in line
        or re.search(r"llmfleet-(llama|rpc)-server\.service|llmfleet-firewall\.service", line)
    ]
    assert typed == []
    deployment = (ROLE / "templates" / "kubernetes" / "deployment.yaml.j2").read_text()
    assert "- --plan={{ _llama_rpc_plan_file }}" in deployment
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert role_vars["_llama_rpc_plan_file"] == "{{ llama_rpc_config_dir }}/plan.json"


def test_the_gpu_workers_serve_plan_restarts_come_from_python() -> None:
    # a Jinja loop over plan_serving(w).gpu chose them (issue #29): the filter plan_gpu_workers
    # (device_serving.gpu_workers, unit-tested) is the one rule
    serve = _tasks(ROLE / "tasks" / "serve_plan.yml")
    named = next(t for t in serve if "__llama_rpc_serve" in (t.get("ansible.builtin.set_fact") or {}))
    assert named["ansible.builtin.set_fact"]["__llama_rpc_gpu_workers"] == (
        "{{ _plan | llmfleet.cluster.plan_gpu_workers }}"
    )
    assert "{%" not in (ROLE / "tasks" / "serve_plan.yml").read_text()

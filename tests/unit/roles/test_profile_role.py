"""The profile role (playbooks/profile.yml is this role): one play on the fleet's hosts, every
setting in its argument spec, and the steps in the order the slow fleets it is written for need."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "profile"
FILES = ("probe", "links", "placements", "workers", "request", "restore", "write")


def _tasks(name: str) -> list:
    return yaml.safe_load((ROLE / "tasks" / f"{name}.yml").read_text())


def _ordered() -> list:
    """Every task of the role in the order main.yml runs them, as (file, task)."""
    main = _tasks("main")
    out = []
    for step in main:
        include = step.get("ansible.builtin.import_tasks") or step.get("ansible.builtin.include_tasks")
        name = include["file"].removesuffix(".yml")
        out += [(name, t) for t in _tasks(name)]
    return out


def _named(name: str) -> dict:
    return next(t for _f, t in _ordered() if t.get("name") == name)


def _index(name: str) -> int:
    return [t.get("name") for _f, t in _ordered()].index(name)


def _verify() -> dict:
    return next(
        t
        for _f, t in _ordered()
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmfleet.cluster.verify"
    )


def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def test_the_playbook_is_the_role_on_the_fleets_hosts() -> None:
    (play,) = yaml.safe_load((ROOT / "playbooks" / "profile.yml").read_text())
    assert play["hosts"] == "llm_head:llm_workers"
    assert play["roles"] == [{"role": "llmfleet.cluster.profile"}]
    assert set(play) == {"name", "hosts", "gather_facts", "roles"}
    assert [
        (s.get("ansible.builtin.import_tasks") or s.get("ansible.builtin.include_tasks"))["file"]
        for s in _tasks("main")
    ] == [f"{f}.yml" for f in FILES]


def test_every_setting_has_a_spec_and_one_default() -> None:
    # profile.yml read 12 settings with an inline `| default(...)` each, none in a spec
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    assert set(spec["options"]) == set(_defaults())
    for name, option in spec["options"].items():
        assert option.get("description") and option.get("type"), name
    used = set()
    for path in (ROLE / "tasks").glob("*.yml"):
        text = path.read_text()
        used |= {n for n in _defaults() if n in text}
        for name in _defaults():
            assert f"{name} | default(" not in text, f"{path.name}: {name} has an inline default"
    text = (ROLE / "vars" / "main.yml").read_text()
    used |= {n for n in _defaults() if n in text}
    assert used == set(_defaults()), set(_defaults()) - used


def test_no_global_state_in_the_heads_hostvars() -> None:
    # profile.yml kept the measuring placements as facts of the head and read them 12 times
    # through hostvars[groups['llm_head'][0]]: run_once facts reach every host of the play
    for path in [*(ROLE / "tasks").glob("*.yml"), ROLE / "vars" / "main.yml"]:
        assert "hostvars[groups" not in path.read_text(), path.name
    made = _named("Make the measuring placement of each request")
    assert made["run_once"] is True and "__profile_placements" in made["ansible.builtin.set_fact"]


def test_the_measured_request_may_take_minutes() -> None:
    # On inventories/demo-uneven the memory plan (the output layer on the quarter-CPU nas) made a
    # token every 5-10 s on this loaded machine: the verify role's 300 s timed the 64-token request out
    role = _verify()["vars"]
    assert role["verify_request_timeout"] == "{{ profile_request_timeout }}"
    assert _defaults()["profile_request_timeout"] >= 1800


def test_the_request_goes_through_the_measuring_placement() -> None:
    # the served plan measures only the hosts it gives layers: a left-out worker never got a
    # figure (the speed objective refused demo-uneven); the verify role's argument spec refuses
    # llmfleet_plan as a role parameter, so it is the include's variable
    verify = _verify()
    assert verify["vars"]["llmfleet_plan"] == "{{ _profile_placement }}"
    # an entry without hosts ({} or a device that cannot be priced) is not served
    assert verify["when"] == "_profile_placement.hosts is defined"
    made = _named("Make the measuring placements")["ansible.builtin.set_fact"]
    assert "profile_measuring_plan" in made["__profile_measuring"]
    # a run that died after installing the measuring placement must not make it the "served" copy:
    # the role keeps the served plan once (force: false), and serves it back (restore)
    serve = _named("Serve measuring placement {{ _profile_index + 1 }}")
    assert serve["ansible.builtin.include_role"]["tasks_from"] == "serve_plan"
    assert serve["vars"]["llama_rpc_serve_keep"] == "{{ _profile_index == 0 }}"
    role = yaml.safe_load((ROOT / "roles" / "llama_rpc" / "tasks" / "serve_plan.yml").read_text())
    keep = next(t for t in role if t.get("name") == "Keep the plan served now (once)")
    assert keep["ansible.builtin.copy"]["force"] is False
    assert _index(serve["name"]) < _index("Serve the kept plan again")


def test_the_requests_are_one_loop_over_the_placements() -> None:
    # profile.yml wrote the serve / request / keep sequence three times
    step = next(s for s in _tasks("main") if "ansible.builtin.include_tasks" in s)
    assert step["ansible.builtin.include_tasks"]["file"] == "request.yml"
    # the measuring placements, then two per device other than a CPU (docs/profile.md, "Per device")
    assert step["loop"] == "{{ __profile_placements + __profile_device_placements }}"
    assert step["loop_control"] == {"loop_var": "_profile_placement", "index_var": "_profile_index"}
    # one call makes both (the measuring plan and its placements once, issue #29): three requests
    # with the output layer apart, else one (and two {} skipped); the device pairs only when asked
    call = _named("Make the measuring placements")["ansible.builtin.set_fact"]["__profile_measuring"]
    assert call.count("profile_measuring_plan(") == 1 and "request='all'" in call
    assert "output_apart=profile_output_apart | bool" in call
    assert "devices=profile_devices | bool" in call
    made = _named("Make the measuring placement of each request")["ansible.builtin.set_fact"]
    assert made == {
        "__profile_placements": "{{ __profile_measuring.requests }}",
        "__profile_device_placements": "{{ __profile_measuring.devices }}",
    }
    text = (ROLE / "tasks" / "placements.yml").read_text()
    assert text.count("llmfleet.cluster.profile_measuring_plan(") == 1


def test_served_workers_are_measured_at_one_thread_and_put_back_before_llama_server() -> None:
    """A served worker's rpc-server runs one thread while measured (a runtime drop-in made by the
    profile_rpc_dropin filter, restarted on it before the measuring placement is served), and
    runs its own threads again before llama-server restarts on the fleet's plan (llama-server
    connects to the workers when it starts)."""
    made = _named("Make the one-thread drop-in")["ansible.builtin.set_fact"]["__profile_rpc_dropin"]
    assert "llmfleet.cluster.profile_rpc_dropin" in made
    written = _named("Run the served rpc-server at one thread")
    assert written["ansible.builtin.copy"]["dest"] == "{{ _profile_dropin }}"
    restart = _named("Restart the served rpc-server on the drop-in")
    assert restart["ansible.builtin.systemd_service"]["daemon_reload"] is True
    assert _index(restart["name"]) < _index("Serve measuring placement {{ _profile_index + 1 }}")
    back = _index("Restart the rpc-server on its own unit")
    assert _index("Remove the drop-in") < back
    assert (
        _index("Send measured request {{ _profile_index + 1 }}") < back < _index("Serve the kept plan again")
    )
    dropin = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_profile_dropin"]
    assert dropin.startswith("{{ profile_rpc_dropin_file or (llama_rpc_names.runtime_unit_dir")


def test_every_measured_request_is_warmed_up() -> None:
    # the first request after llama-server starts on a placement is slower; each measured request
    # gets an unmeasured one before it
    assert _verify()["vars"]["verify_warmup_tokens"] == "{{ profile_warmup_tokens }}"
    assert _defaults()["profile_warmup_tokens"] > 0
    # the verify role sends the warm-up before its first sample, with the key kept out of the log
    tasks = yaml.safe_load((ROOT / "roles" / "verify" / "tasks" / "measure.yml").read_text())
    names = [t["name"] for t in tasks]
    warm = names.index("Warm the placement up (one request, not measured)")
    assert warm < names.index("Sample before the idle window")
    assert tasks[warm]["no_log"] is True and "verify_warmup_tokens" in tasks[warm]["when"]


def test_the_profile_is_built_with_every_argument_the_filter_needs() -> None:
    # an edit once dropped facts=, units= and links= from the call: the play failed at its end
    import inspect

    from ansible_collections.llmfleet.cluster.plugins.filter.profile import profile_build

    task = _named("Turn the samples and the links into the profile")
    call = task["ansible.builtin.set_fact"]["__profile"]
    params = list(inspect.signature(profile_build).parameters)
    assert params[0] == "samples"  # the filter's input
    for name in params[1:]:
        assert f"{name}=" in call, f"profile_build is called without {name}="
    # each request's samples of each host, the first's and the moved ones'
    assert "'__profile_samples.0'" in call
    assert "'__profile_samples.' ~ i" in task["vars"]["_profile_moved"]


def test_profile_reads_the_verify_roles_published_result_only() -> None:
    # it read the role's private __verify_samples_host, __verify_plan and __verify_answer
    texts = [p.read_text() for p in (ROLE / "tasks").glob("*.yml")]
    assert not any("__verify" in t for t in texts)
    keep = _named("Keep this host's samples and the timings of request {{ _profile_index + 1 }}")
    kept = keep["ansible.builtin.set_fact"]
    assert "verify_result.samples" in kept["__profile_samples"]
    assert "verify_result.timings" in kept["__profile_timings"]
    spec = yaml.safe_load((ROOT / "roles" / "verify" / "meta" / "argument_specs.yml").read_text())
    described = " ".join(spec["argument_specs"]["main"]["description"])
    for field in ("verify_result", "C(plan)", "C(samples)", "C(status)", "C(answer)", "C(timings)"):
        assert field in described, field
    published = yaml.safe_load((ROOT / "roles" / "verify" / "tasks" / "measure.yml").read_text())[-1]
    result = published["ansible.builtin.set_fact"]["verify_result"]
    assert set(result) == {"plan", "samples", "status", "answer", "elapsed", "timings"}
    reset = yaml.safe_load((ROOT / "roles" / "verify" / "tasks" / "preflight.yml").read_text())[0]
    assert reset["ansible.builtin.set_fact"]["verify_result"] == {}


def test_a_left_out_worker_runs_the_planned_workers_unit_not_a_bare_systemd_run() -> None:
    """Issue #31: the measuring rpc-server ran as root through systemd-run, without hardening or
    firewall, for up to 30 minutes. It now runs the llama_rpc role's own unit and firewall unit
    (tasks_from: measure), and the restore step removes them (tasks_from: measure_stop)."""
    assert not any("systemd-run" in p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    tasks = [t for _f, t in _ordered()]
    run = next(
        t for t in tasks if (t.get("ansible.builtin.include_role") or {}).get("tasks_from") == "measure"
    )
    assert run["ansible.builtin.include_role"]["name"] == "llmfleet.cluster.llama_rpc"
    assert run["vars"]["llama_rpc_plan"] == "{{ _profile_measuring }}"
    assert run["vars"]["llama_rpc_measure_seconds"] == "{{ profile_rpc_seconds }}"
    assert run["when"] == "inventory_hostname in _profile_added"
    stop = next(
        t for t in tasks if (t.get("ansible.builtin.include_role") or {}).get("tasks_from") == "measure_stop"
    )
    assert stop["when"] == "inventory_hostname in _profile_added"
    assert _index(run["name"]) < _index(stop["name"])
    added = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_profile_added"]
    assert added == "{{ _profile_measuring.measuring.added }}"


def test_head_only_steps_run_on_the_head() -> None:
    for name in ("Serve measuring placement {{ _profile_index + 1 }}", "Serve the kept plan again"):
        assert "inventory_hostname == _profile_head" in _named(name)["when"], name
    links = _named("Round-trip time and throughput each way, one worker at a time")
    assert links["delegate_to"] == "{{ _profile_head }}" and links["run_once"] is True
    for name in ("Turn the samples and the links into the profile", "Write profile.json"):
        assert _named(name)["delegate_to"] == "localhost" and _named(name)["run_once"] is True


def test_the_measuring_unit_is_the_planned_workers_unit_plus_a_time_limit() -> None:
    from tests.unit.roles.test_llama_rpc_templates import ROLE as LLAMA_RPC
    from tests.unit.roles.test_llama_rpc_templates import _trusted, directive, render

    (block,) = yaml.safe_load((LLAMA_RPC / "tasks" / "measure.yml").read_text())
    measure_vars = _trusted(block["vars"])
    assert measure_vars["_llama_rpc_unit_dir"] == "/run/systemd/system"  # runtime: never enabled
    planned = render("systemd/llmfleet-rpc-server.service.j2", "w1")
    measuring = render(
        "systemd/llmfleet-rpc-server.service.j2", "w1", {**measure_vars, "llama_rpc_measure_seconds": 900}
    )
    assert directive(measuring, "RuntimeMaxSec") == ["900"]

    def lines(unit: str) -> set[str]:
        return {x for x in unit.splitlines() if x and not x.startswith("#")}

    assert lines(measuring) - lines(planned) == {"RuntimeMaxSec=900"}
    assert lines(planned) <= lines(measuring)
    for key in ("NoNewPrivileges", "ProtectSystem", "IPAddressDeny", "IPAddressAllow", "BindsTo", "User"):
        assert directive(measuring, key), key
    assert directive(measuring, "IPAddressAllow") == ["10.9.0.2"]
    # the firewall unit it is bound to loads the table from the runtime directory
    firewall = render("systemd/llmfleet-firewall.service.j2", "w1", measure_vars)
    assert directive(firewall, "ExecStart")[0].endswith(" /run/llmfleet-measure/firewall.nft")

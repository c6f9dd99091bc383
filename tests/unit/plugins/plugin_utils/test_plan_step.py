"""The plan role's computation in one step (plan_step.run, filter llmfleet.cluster.plan)."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.plan import plan as plan_filter
from ansible_collections.llmfleet.cluster.plugins.filter.plan import plan_hosts, plan_keep, plan_placement
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import plan_step

from tests.unit.plugins.plugin_utils.test_placement import layout

MODEL = {"name": "tiny", "url": "http://mirror/models/tiny.gguf", "sha256": "b" * 64}
OPTS = {"head_layers": False, "context": 512}


def _fact(usable, address):
    return {"llmfleet_host": {"memory": {"usable_mib": usable}, "cpus": 2, "default_ipv4": address}}


def hostvars(**extra):
    hv = {"head": _fact(60, "10.0.0.1"), "w1": _fact(100, "10.0.0.2"), "w2": _fact(100, "10.0.0.3")}
    for name, values in extra.items():
        hv[name] = dict(hv[name], **values)
    return hv


def step(hv, **kwargs):
    args = {"options": OPTS, "reserve_mib": 8.0}
    args.update(kwargs)
    return plan_step.run(layout(n_layer=8, layer_mib=10), MODEL, "head", ["w1", "w2"], hv, **args)


def test_one_step_is_the_parts_in_order() -> None:
    hv = hostvars()
    got = step(hv)
    # the same plan as the chain of filters the role called before
    head = plan_hosts(["head"], hv)[0]
    workers = plan_hosts(["w1", "w2"], hv)
    alone = plan_placement(layout(n_layer=8, layer_mib=10), MODEL, head, workers, OPTS, reserve_mib=8.0)
    assert got["plan"] == alone
    assert got["ok"] and got["computed"] and not got["kept"]
    assert got["lines"][: len(alone["table"].split("\n"))] == alone["table"].split("\n")
    assert got["lines"][len(alone["table"].split("\n"))].startswith("re-planned: ")
    assert got["speed"] == {"speed": {}, "source": {}, "remeasure": []}


def test_the_earlier_plan_is_kept_and_said_so() -> None:
    hv = hostvars()
    first = step(hv)["plan"]
    again = step(hv, previous=first, previous_path="/out/plan.json")
    verdict = plan_keep(
        first,
        layout(n_layer=8, layer_mib=10),
        MODEL,
        plan_hosts(["head"], hv)[0],
        plan_hosts(["w1", "w2"], hv),
        OPTS,
        8.0,
    )
    assert again["kept"] and not again["computed"] and again["plan"] == first
    assert again["keep"] == verdict
    assert "kept the previous plan (/out/plan.json): " + "; ".join(verdict["reasons"]) in again["lines"]
    # replan: the earlier plan is not read, and the line says why
    fresh = step(hv, previous=first, replan=True)
    assert fresh["computed"] and "re-planned: plan_replan is set" in fresh["lines"]


def test_a_model_that_does_not_fit_is_data_with_its_table() -> None:
    got = plan_step.run(layout(n_layer=8, layer_mib=50), MODEL, "head", ["w1"], hostvars(), OPTS, 8.0)
    assert got["ok"] is False and got["plan"]["ok"] is False
    assert got["plan"]["missing"]["w1"] > 0
    assert got["lines"][0] == got["plan"]["table_text"].split("\n")[0]


def test_errors_name_the_step_and_the_host() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"^plan_hosts: host w1: port must be between 1 and 65535, got 0"
    ):
        plan_filter(layout(), MODEL, "head", ["w1"], hostvars(w1={"llmfleet_rpc_port": 0}), OPTS)
    with pytest.raises(AnsibleFilterError, match=r"^plan_hosts: host gone is not in the inventory"):
        plan_filter(layout(), MODEL, "head", ["gone"], hostvars(), OPTS)
    with pytest.raises(AnsibleFilterError, match=r"^profile_speed: w1: llmfleet_profile 7 is not a dict"):
        plan_filter(layout(), MODEL, "head", ["w1"], hostvars(w1={"llmfleet_profile": 7}), OPTS, profile={})
    # the earlier plan is weighed first, as the role did before: its check names a bad layout
    with pytest.raises(AnsibleFilterError, match=r"^plan_keep: layout, model and head must be dicts"):
        plan_filter([], MODEL, "head", ["w1"], hostvars(), OPTS)


def test_figures_are_read_only_when_the_profile_stage_ran() -> None:
    figures = {"ms_per_layer": 5.0, "rtt_ms": 1.0, "mbit_s": 1000.0}
    hv = hostvars(w1={"llmfleet_profile": figures})
    assert step(hv)["speed"]["speed"] == {}
    got = step(hv, profile={})
    assert got["speed"]["speed"]["w1"]["ms_per_layer"] == 5.0
    assert got["speed"]["source"] == {"w1": "inventory"}


# ------------------------------------------------------------------ a device the build lacks


def _gpu_hostvars(**desktop):
    """The recorded NAS as the head, the recorded RTX 3060 desktop (Vulkan0 + its CPU, the probe's
    flavour ubuntu-vulkan-x64) as a worker; ``desktop`` adds to the desktop's variables."""
    from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo

    from tests.support.host_trees import recorded_hosts

    root = recorded_hosts()
    nas = {"llmfleet_host": hostinfo.probe(str(root / "celeron-nas"))}
    pc = {"llmfleet_host": hostinfo.probe(str(root / "rtx3060-desktop")), "llmfleet_rpc_address": "10.0.0.2"}
    return {"nas": nas, "desktop": dict(pc, **desktop)}


def _gpu_step(hv, **kwargs):
    lay = layout(n_layer=60, layer_mib=300)
    return plan_step.run(lay, MODEL, "nas", ["desktop"], hv, {"context": 512}, 64.0, **kwargs)


def test_a_device_the_hosts_build_lacks_is_refused_at_plan_time() -> None:
    """Before any host changes: the plan names the host, the device, its backend and the flavour
    (the llama_rpc role refused it only when it wrote the units)."""
    good = _gpu_step(_gpu_hostvars())
    assert good["ok"], good["plan"].get("msg")
    desktop = next(h for h in good["plan"]["hosts"] if h["name"] == "desktop")
    assert next(d["name"] for d in desktop["devices"] if d["layers"][1] > d["layers"][0]) == "Vulkan0"

    cpu = _gpu_step(_gpu_hostvars(llama_cpp_flavour="ubuntu-x64"))
    assert cpu["ok"] is False and cpu["plan"]["ok"] is False
    assert cpu["plan"]["msg"].startswith(
        "desktop: the plan puts layers on Vulkan0 (vulkan) but the host's llama.cpp build ubuntu-x64"
        " is a CPU build"
    )
    # the table of the refused plan is shown, as for a model that does not fit
    assert cpu["lines"][0] == good["lines"][0] and "Vulkan0" in "\n".join(cpu["lines"])

    cuda = _gpu_step(_gpu_hostvars(llama_cpp_flavour="ubuntu-cuda-x64"))
    assert cuda["ok"] is False
    assert (
        "desktop: the plan puts layers on Vulkan0 (vulkan) but the host's llama.cpp build "
        in cuda["plan"]["msg"]
    )
    assert "ubuntu-cuda-x64 carries cuda" in cuda["plan"]["msg"]
    # the filter hands the refusal on as data: the role's "Refuse ... before any host changes" fails
    assert (
        plan_filter(
            layout(n_layer=60, layer_mib=300),
            MODEL,
            "nas",
            ["desktop"],
            _gpu_hostvars(llama_cpp_flavour="ubuntu-x64"),
            {"context": 512},
        )["ok"]
        is False
    )


def test_a_kept_plan_is_refused_too_and_unknown_or_source_builds_are_not_judged() -> None:
    first = _gpu_step(_gpu_hostvars())["plan"]
    again = _gpu_step(_gpu_hostvars(llama_cpp_flavour="ubuntu-x64"), previous=first)
    assert again["kept"] and again["ok"] is False
    assert "Vulkan0 (vulkan)" in again["plan"]["msg"]
    for flavour in ("source", ""):
        hv = _gpu_hostvars(llmfleet_host=dict(_gpu_hostvars()["desktop"]["llmfleet_host"], backends={}))
        if flavour:
            hv["desktop"]["llama_cpp_flavour"] = flavour
        assert _gpu_step(hv)["ok"], flavour
    # the check on its own, as the step calls it for the llama.cpp backend
    assert plan_step.builds_refusal(first, ["nas", "desktop"], _gpu_hostvars()) is None
    assert plan_step.builds_refusal(first, ["nas", "desktop"], _gpu_hostvars(llama_cpp_flavour="ubuntu-x64"))

"""The typed plan (plugins/plugin_utils/plan.py) and the one builder of llama-server's split
arguments (placement_render.split_args)."""

from __future__ import annotations

import copy
import json

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed_search
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import (
    OUTPUT_ON_HEAD_ARGS,
    split_args,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan, PlanError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.split_rule import assign_slots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.plugins.plugin_utils.test_placement import host, layout


def real_plan(**options) -> dict:
    """A plan from the planner itself: a head that holds layers, two workers of three."""
    workers = [host("w1", 120), host("w2", 120), host("w3", 40)]
    return speed_search.make_plan(
        layout(n_layer=12),
        {"name": "m", "file": "/m.gguf", "sha256": "a" * 64},
        host("head", 60),
        workers,
        {"context": 1024, **options},
        reserve_mib=8,
    )


def test_a_real_plan_round_trips_and_gives_its_placement() -> None:
    data = real_plan()
    plan = Plan.from_dict(data)
    assert plan.to_dict() == data and plan.to_dict() is not data
    # the plan as JSON reads the same
    assert Plan.from_dict(json.loads(json.dumps(data))) == plan
    assert plan.head.name == "head" and plan.head.role == "head"
    assert [w.name for w in plan.workers] == data["workers"]
    assert plan.names == [data["head"], *data["workers"]]
    assert plan.worker_layers == data["layer_counts"]
    assert plan.head_layers + sum(plan.worker_layers) == 12
    rows = {h["name"]: h for h in data["hosts"]}
    assert plan.layer_counts() == {n: r["layers"][1] - r["layers"][0] for n, r in rows.items()}
    assert plan.output_on_head == rows["head"]["output_layer"]
    assert plan.llama_server_args == tuple(data["llama_server_args"])
    # a host holds devices: today its CPU, holding its layers
    for h in plan.hosts:
        assert [(d.kind, d.layers, d.output_layer) for d in h.devices] == [
            ("cpu", tuple(rows[h.name]["layers"]), rows[h.name]["output_layer"])
        ]
        assert h.budget_mib == pytest.approx(
            rows[h.name]["headroom_mib"] + rows[h.name]["predicted_mib"]["total"]
        )


def test_the_same_split_again_gives_the_plans_own_arguments() -> None:
    """with_split with the plan's own split rebuilds exactly the arguments the planner wrote:
    one builder for both."""
    for options in ({}, {"output_layer": "head"}, {"output_layer": "worker"}, {"cache_type_k": "q8_0"}):
        data = real_plan(**options)
        plan = Plan.from_dict(data)
        again = plan.with_split(
            [plan.row(w) for w in plan.workers], plan.head_layers, plan.worker_layers, plan.output_on_head
        )
        assert again == data, options
        # and with --poll
        polled = plan.with_split(
            [plan.row(w) for w in plan.workers],
            plan.head_layers,
            plan.worker_layers,
            plan.output_on_head,
            poll=0,
        )
        assert polled["llama_server_args"] == [*data["llama_server_args"], "--poll", "0"]


def test_with_split_moves_layers_and_the_output_layer() -> None:
    data = real_plan(output_layer="worker")
    plan = Plan.from_dict(data)
    rows = [plan.row(w) for w in reversed(plan.workers)]
    total = plan.head_layers + sum(plan.worker_layers)
    moved = plan.with_split(rows, 0, [total - 1, 1], True)
    got = Plan.from_dict(moved)
    assert got.names[1:] == [r["name"] for r in rows]
    assert got.worker_layers == [total - 1, 1] and got.head_layers == 0 and got.output_on_head
    assert [h["layers"] for h in moved["hosts"][1:]] == [[0, total - 1], [total - 1, total]]
    args = moved["llama_server_args"]
    assert args[args.index("--tensor-split") + 1] == f"{total - 1},2"
    assert args[args.index("-ngl") + 1] == str(total + 1)
    assert list(OUTPUT_ON_HEAD_ARGS) == args[args.index("-ot") : args.index("-ot") + 2]
    assert args[-4:] == ["-c", "1024", "-np", "1"]
    # the plan it came from is unchanged
    assert data == real_plan(output_layer="worker")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update(hosts=[]), r"plan: hosts must be a non-empty list of host rows, got \[\]"),
        (
            lambda p: p["hosts"][1].update(layers=[5, 2]),
            r"plan: hosts\[1\]\.layers must be \[first, last\).*got \[5, 2\]",
        ),
        (lambda p: p["hosts"][1].update(layers="0-3"), r"plan: hosts\[1\]\.layers must be .* got '0-3'"),
        (
            lambda p: p["hosts"][2].update(role="boss"),
            r"plan: hosts\[2\]\.role must be head or worker, got 'boss'",
        ),
        (lambda p: p["hosts"][0].pop("name"), r"plan: hosts\[0\]\.name must be a non-empty string, got None"),
        (
            lambda p: p["hosts"][1].update(threads=0),
            r"plan: hosts\[1\]\.threads must be an integer >= 1, got 0",
        ),
        (
            lambda p: p["hosts"][1]["predicted_mib"].update(kv="lots"),
            r"hosts\[1\]\.predicted_mib\.kv must be a finite number, got 'lots'",
        ),
        (
            lambda p: p.update(workers=["w1", "nobody"]),
            r"plan: workers must be names of worker rows of hosts, got \['nobody'\]",
        ),
        (
            lambda p: p.update(head="w1"),
            r"plan: head must be the name of the one head row \(head\), got 'w1'",
        ),
        (lambda p: p["model"].update(n_layer=0), r"plan: model\.n_layer must be an integer >= 1, got 0"),
        (
            lambda p: p.update(llama_server_args="-ngl 0"),
            r"plan: llama_server_args must be a list of strings, got '-ngl 0'",
        ),
        (
            lambda p: p["hosts"].append(dict(p["hosts"][1])),
            r"plan: hosts must be rows with unique names, got \['w\d'\]",
        ),
    ],
)
def test_a_bad_field_is_named_with_its_value(change, message) -> None:
    data = copy.deepcopy(real_plan())
    change(data)
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data)


def test_a_partial_plan_reads_with_the_documented_defaults() -> None:
    """tune's and profile's plans as tests and older runs write them: no roles (the head is the
    row named ``head``), no model, no workers list (every worker row)."""
    plan = Plan.from_dict(
        {
            "head": "h",
            "hosts": [
                {"name": "h", "layers": [0, 2], "output_layer": True},
                {"name": "a", "layers": [2, 5]},
                {"name": "b", "layers": [5, 8]},
            ],
        }
    )
    assert plan.head.role == "head" and [w.role for w in plan.workers] == ["worker", "worker"]
    assert plan.worker_layers == [3, 3] and plan.output_on_head
    assert plan.model.n_layer is None and plan.llama_server_args == ()


@pytest.mark.parametrize(
    ("head_layers", "counts", "on_head"),
    [(0, [5, 7], False), (3, [4, 5], True), (0, [12], False), (2, [9, 0, 1], False), (11, [1], True)],
)
def test_split_args_gives_llama_cpp_exactly_the_layers(head_layers, counts, on_head) -> None:
    endpoints = [f"10.0.0.{i + 2}:50052" for i in range(len(counts))]
    args = split_args(endpoints, head_layers, counts, on_head)
    n_layer = head_layers + sum(counts)
    assert args[:2] == ["--rpc", ",".join(endpoints)]
    ts = [float(x) for x in args[args.index("--tensor-split") + 1].split(",")]
    ngl = int(args[args.index("-ngl") + 1])
    slots = assign_slots(ts, n_layer, ngl)
    # llama.cpp's own rule: the head's CPU holds the first layers, each device its count, the
    # output slot (the last) on the last device (kept on the head by -ot when on_head)
    assert slots[:head_layers] == [-1] * head_layers
    assert [slots[:n_layer].count(i) for i in range(len(counts))] == counts
    assert slots[n_layer] == len(counts) - 1
    assert ("-ot" in args) == on_head
    assert args[args.index("-sm") + 1] == "layer"


def test_split_args_without_workers_and_refusals() -> None:
    assert split_args([], 12, [], True) == ["-ngl", "0"]
    with pytest.raises(ValueError, match="2 endpoints for 1 layer counts"):
        split_args(["a:1", "b:1"], 0, [4], False)
    with pytest.raises(ValueError, match="slot counts must be non-negative"):
        split_args(["a:1"], 0, [-2], False)


# ---- the accessors the Kubernetes renderers read (llama_rpc_k8s, k8s_labels)


def test_fallback_hosts_are_the_ok_fallbacks_rows_parsed() -> None:
    data = real_plan()
    data["fallbacks"] = [
        {"ok": True, "hosts": [{"name": "w1", "role": "worker", "predicted_mib": {"total": 310.5}}]},
        {"ok": False, "hosts": [{"name": "w2", "role": "worker", "predicted_mib": {"total": 9999.0}}]},
    ]
    got = Plan.from_dict(data).fallback_hosts()
    assert [(h.name, h.predicted_mib["total"]) for h in got] == [("w1", 310.5)]
    data["fallbacks"] = [{"ok": True, "hosts": [{"name": "w1", "layers": [3, 1]}]}]
    with pytest.raises(PlanError, match=r"fallbacks\[0\]\.hosts\[0\]\.layers .* got \[3, 1\]"):
        Plan.from_dict(data).fallback_hosts()
    data["fallbacks"] = "none"
    with pytest.raises(PlanError, match="fallbacks must be a list"):
        Plan.from_dict(data).fallback_hosts()


def test_allowed_mib_is_usable_minus_reserve_of_the_row() -> None:
    data = real_plan()
    plan = Plan.from_dict(data)
    for row_host in plan.hosts:
        row = data["hosts"][plan.hosts.index(row_host)]
        assert plan.allowed_mib(row_host) == float(row["usable_mib"]) - float(row["reserve_mib"])
    bare = Plan.from_dict({"hosts": [{"name": "h", "role": "head"}]})
    assert bare.allowed_mib(bare.head) == 0.0


def test_model_file_names_the_download() -> None:
    data = real_plan()
    data["model"].update(url="http://m/m.gguf", bytes=123)
    assert Plan.from_dict(data).model_file == {
        "url": "http://m/m.gguf",
        "sha256": "a" * 64,
        "file": "/m.gguf",
        "bytes": 123,
    }
    bare = Plan.from_dict({"hosts": [{"name": "h", "role": "head"}]})
    assert bare.model_file == {"url": "", "sha256": "", "file": "", "bytes": 0}
    with pytest.raises(PlanError, match=r"model\.bytes must be an integer >= 0, got -1"):
        assert Plan.from_dict({"hosts": [{"name": "h"}], "model": {"bytes": -1}}).model_file is None


def test_the_vllm_section_is_typed_and_checked_against_the_model() -> None:
    """Plan.vllm: the lws target's stages as the planner wrote them (vllm.py reads only this)."""
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P

    lay = layout(n_layer=8, layer_mib=100, embd_mib=400, out_mib=50)
    model = {"name": "tiny", "file": "/models/tiny.gguf", "sha256": "a" * 64}
    data = P.make_plan(
        lay, model, host("a", 2000), [host("b", 2000)], {"vllm_hosts": "all"}, 8, "vllm", "lws"
    )
    stages = Plan.from_dict(data).vllm
    assert stages.stages == ("a", "b") and stages.layer_counts == (4, 4) and stages.partition == "4,4"
    assert stages.pipeline_size == 2 and stages.kvcache_space_gib == data["vllm"]["kvcache_space_gib"]
    assert list(stages.stage_weights_mib) == data["vllm"]["stage_weights_mib"]
    assert stages.weights_dtype_bytes == 2
    broken = copy.deepcopy(data)
    broken["vllm"]["pp_layer_partition"] = "4,3"
    with pytest.raises(PlanError, match=r"sums to 7, the model has 8 layers"):
        assert Plan.from_dict(broken).vllm is None
    del broken["vllm"]
    with pytest.raises(PlanError, match="no 'vllm' section"):
        assert Plan.from_dict(broken).vllm is None
    # a llama.cpp plan reads as before: the section is parsed only when asked for
    assert Plan.from_dict(real_plan()).head.name


# ------------------------------------------------------------------ another split over devices


@pytest.fixture(scope="module")
def gpu_plans() -> dict:
    """Plans of the planner itself over recorded machines (tests/fixtures/hosts) whose hosts hold
    several devices: ``two`` a head with its CPU and Vulkan0 and a worker offering Vulkan0 and
    its CPU (the same RTX 3060 desktop twice); ``worker`` a CPU NAS head and that desktop as a
    worker (Vulkan0, CPU); ``alone`` the desktop alone (CPU, Vulkan0: no --rpc)."""
    from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P

    from tests.support.host_trees import recorded_hosts

    root = recorded_hosts()
    pc = hostinfo.probe(str(root / "rtx3060-desktop"))
    nas = hostinfo.probe(str(root / "celeron-nas"))
    model = {"name": "big", "url": "http://mirror/models/big.gguf", "sha256": "c" * 64}

    def make(n_layer, head, workers):
        return P.make_plan(layout(n_layer=n_layer, layer_mib=300), model, head, workers)

    return {
        "two": make(
            200,
            P.host_from_fact("head", pc),
            [
                P.host_from_fact("pc2", pc, address="10.0.0.2"),
                P.host_from_fact("nas", nas, address="10.0.0.3"),
            ],
        ),
        "worker": make(60, P.host_from_fact("nas", nas), [P.host_from_fact("pc2", pc, address="10.0.0.2")]),
        "alone": make(100, P.host_from_fact("head", pc), [P.host_from_fact("nas", nas, address="10.0.0.3")]),
    }


def _devices(data: dict) -> list:
    return [
        (h["name"], d["name"], tuple(d["layers"]), d["output_layer"])
        for h in data["hosts"]
        for d in h["devices"]
    ]


def test_the_same_split_of_a_device_plan_gives_the_plans_own_arguments(gpu_plans) -> None:
    """One builder: with_split with a device plan's own split rebuilds it exactly (rows, devices,
    report names, --device and the tensor split per device)."""
    shapes = {
        "two": [["CPU", "Vulkan0"], ["Vulkan0", "CPU"]],
        "worker": [["CPU"], ["Vulkan0", "CPU"]],
        "alone": [["CPU", "Vulkan0"]],
    }
    for key, data in gpu_plans.items():
        plan = Plan.from_dict(data)
        assert [h.device_names() for h in plan.hosts] == shapes[key], key
        again = plan.with_split(
            [plan.row(w) for w in plan.workers], plan.head_layers, plan.worker_layers, plan.output_on_head
        )
        assert again == data, key


def test_a_device_plans_other_split_keeps_each_devices_layers_when_its_host_keeps_its_count(
    gpu_plans,
) -> None:
    """The output layer moved to the head (measuring.output_moved's move): every host keeps its
    count, so every device keeps its layers; the arguments say where under llama.cpp's rule."""
    from tests.unit.plugins.plugin_utils.test_device_placement import check_split

    data = gpu_plans["two"]
    plan = Plan.from_dict(data)
    assert not plan.output_on_head
    moved = plan.with_split([plan.row(w) for w in plan.workers], plan.head_layers, plan.worker_layers, True)
    check_split(moved, 200)
    assert [d[:3] for d in _devices(moved)] == [d[:3] for d in _devices(data)]
    assert [d[3] for d in _devices(moved)] == [True, False, False, False]
    assert list(OUTPUT_ON_HEAD_ARGS) == moved["llama_server_args"][-6:-4]
    # a host whose count changes must say how its devices share it, naming the host
    with pytest.raises(PlanError, match=r"host pc2 holds devices \['Vulkan0', 'CPU'\] \(\[37, 42\] layers\)"):
        plan.with_split(
            [plan.row(w) for w in plan.workers],
            plan.head_layers - 1,
            [80],
            False,
            device_layers={"head": [83, 37]},
        )
    with pytest.raises(PlanError, match=r"host pc2: device_layers \[1, 2\] must give each of its devices"):
        plan.with_split(
            [plan.row(w) for w in plan.workers],
            plan.head_layers - 1,
            [80],
            False,
            device_layers={"head": [83, 37], "pc2": [1, 2]},
        )
    with pytest.raises(PlanError, match="device_layers names hosts the split does not use: w9"):
        plan.with_split(
            [plan.row(w) for w in plan.workers],
            plan.head_layers,
            plan.worker_layers,
            False,
            device_layers={"w9": [1]},
        )


NAS_ROW = {
    "name": "nas",
    "role": "worker",
    "endpoint": "10.0.0.3:50052",
    "address": "10.0.0.3",
    "devices": [{"name": "CPU", "backend": "cpu", "type": "cpu", "layers": [0, 0], "output_layer": False}],
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=200), min_size=4, max_size=4),
    output_on_head=st.booleans(),
    nas_first=st.booleans(),
)
def test_another_split_over_devices_gives_each_device_the_layers_asked_for(
    gpu_plans, cuts, output_on_head, nas_first
) -> None:
    """Any per-device split of 200 layers over the head's CPU and Vulkan0, a worker's Vulkan0 and
    CPU and a CPU worker, in either --rpc order: the emitted --device and --tensor-split give each
    device exactly its layers under llama.cpp's rule (the independent emulation,
    tests/support/llama_split.py), the rows read back, the worker's -d list is what --device
    counts, and llama.cpp's device order is kept (the head's CPU first, each host contiguous)."""
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_serving import serving

    from tests.support import llama_split
    from tests.unit.plugins.plugin_utils.test_device_placement import check_split

    plan = Plan.from_dict(gpu_plans["two"])
    edges = [0, *sorted(cuts), 200]
    head_cpu, head_gpu, pc_gpu, pc_cpu, nas = (edges[i + 1] - edges[i] for i in range(5))
    rows = [plan.row(plan.workers[0]), dict(NAS_ROW)]
    counts = [pc_gpu + pc_cpu, nas]
    per_host = {"head": [head_cpu, head_gpu], "pc2": [pc_gpu, pc_cpu], "nas": [nas]}
    if nas_first:
        rows, counts = rows[::-1], counts[::-1]
    got = plan.with_split(
        rows,
        head_cpu + head_gpu,
        counts,
        output_on_head,
        device_layers={"head": [head_cpu, head_gpu], "pc2": [pc_gpu, pc_cpu]},
    )
    again = Plan.from_dict(got)
    order = ["head", *(r["name"] for r in rows)]
    assert again.names == order
    assert {h.name: [d.layer_count for d in h.devices] for h in again.hosts} == per_host
    # each host's layers contiguous in llama.cpp's order: the head's CPU, its GPU, then --rpc order
    spans = [d.layers for h in again.hosts for d in h.devices]
    assert spans[0][0] == 0 and spans[-1][1] == 200
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    args = got["llama_server_args"]
    if head_cpu == 200:
        assert args[args.index("--device") + 1] == "none" and args[args.index("-ngl") + 1] == "0"
    else:
        check_split(got, 200)
        ts = llama_split.parse_tensor_split(args[args.index("--tensor-split") + 1])
        cpu, slots, out = llama_split.layer_counts(ts, 200, int(args[args.index("-ngl") + 1]))
        asked = [*per_host["head"][1:], *(c for name in order[1:] for c in per_host[name])]
        assert cpu == head_cpu
        assert [s - (1 if i == out else 0) for i, s in enumerate(slots)] == asked
    # the worker's rpc-server offers both its devices (-d), each counted by --device's RPC<n>
    assert serving(got, "pc2", "ubuntu-vulkan-x64")["args"] == ["-d", "Vulkan0,CPU"]
    if head_cpu < 200:
        assert args[args.index("--device") + 1] == "Vulkan0,RPC0,RPC1,RPC2"
    assert [d.report_name for d in again.host("pc2").devices] == [
        "RPC0[10.0.0.2:50052]",
        "RPC1[10.0.0.2:50052]",
    ]
    assert again.host("nas").devices[0].report_name == "RPC0[10.0.0.3:50052]"
    # one output layer, on the head's CPU with -ot, else on the last device holding layers
    outs = [(h.name, d.name) for h in again.hosts for d in h.devices if d.output_layer]
    holders = [
        (h.name, d.name)
        for h in again.hosts
        for d in h.devices
        if d.layer_count and (h.name, d.name) != ("head", "CPU")
    ]
    if output_on_head or not holders:
        assert outs == [("head", "CPU")] and again.output_on_head
    else:
        assert outs == [holders[-1]]


def test_the_planners_answer_parsed_a_plan_or_a_refusal() -> None:
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import (
        PlanEmpty,
        Refusal,
        parse,
        parse_answer,
    )

    data = real_plan()
    plan = parse_answer(data)
    assert isinstance(plan, Plan) and plan.table == data["table"] and plan.table
    assert plan.warnings == tuple(data.get("warnings") or [])
    assert parse(dict(data, warnings=["w3 is not used"])).warnings == ("w3 is not used",)
    with pytest.raises(PlanError, match=r"plan: warnings must be a list of strings, got 'x'"):
        assert not parse(dict(data, warnings="x")).warnings
    got = parse_answer({"ok": False, "msg": "w1 misses 5 MiB", "table_text": "t", "missing": {"w1": 5}})
    assert got == Refusal("w1 misses 5 MiB", "t", {"w1": 5})
    # a plan without host rows is its own error (nothing planned yet), still a PlanError
    for hosts in (None, []):
        with pytest.raises(PlanEmpty) as err:
            parse({"hosts": hosts})
        assert err.value.value == hosts and isinstance(err.value, PlanError)
    with pytest.raises(PlanError, match="non-empty list of host rows, got 'x'") as err:
        parse({"hosts": "x"})
    assert not isinstance(err.value, PlanEmpty)

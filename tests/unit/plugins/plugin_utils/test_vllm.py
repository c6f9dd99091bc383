"""plugins/plugin_utils/vllm.py: the decisions the lws target adds to the plan."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import vllm as V

GIB = 1024
MIB = 1024 * 1024
IMAGE_ARCH = {"aarch64": "arm64", "x86_64": "x86_64"}


def host(arch="aarch64", isa=("bf16", "neon"), cpus=8, usable=30000, status="supported", reason="ok"):
    return {
        "arch": arch,
        "isa": list(isa),
        "cpus": cpus,
        "memory": {"usable_mib": usable},
        "backends": {"vllm_cpu": {"status": status, "reason": reason, "image_arch": IMAGE_ARCH.get(arch)}},
    }


def plan(partition="13,13", stages=("a", "b"), kv=4, n_layer=26, model_bytes=2_000_040_448):
    counts = [int(c) for c in partition.split(",")]
    return {
        # the plan's rows (the lws target's: the head's; a stage host need not have one)
        "hosts": [{"name": stages[0], "role": "head", "layers": [0, n_layer], "output_layer": True}],
        "model": {"n_layer": n_layer, "bytes": model_bytes},
        "vllm": {
            "pipeline_size": len(counts),
            "pp_layer_partition": partition,
            "stages": list(stages),
            "kvcache_space_gib": kv,
            # the planner's per-stage weights; here the model's bytes by layer count
            "stage_weights_mib": [model_bytes / MIB * c / max(sum(counts), 1) for c in counts],
        },
    }


PAIR = {"a": host(), "b": host()}
OPTS = {"model": "google/gemma-3-1b-it"}


def lws_of(objs):
    (lws,) = [o["object"] for o in objs if o["object"]["kind"] == "LeaderWorkerSet"]
    return lws


def containers(lws):
    lwt = lws["spec"]["leaderWorkerTemplate"]
    return lwt["leaderTemplate"]["spec"]["containers"][0], lwt["workerTemplate"]["spec"]["containers"][0]


# ---- refusals ---------------------------------------------------------------------------------


def test_unsupported_hosts_are_all_named():
    facts = {
        "a": host(status="unsupported", reason="arm64 without NEON"),
        "b": host(status="unsupported", reason="x"),
    }
    with pytest.raises(V.VllmLwsError, match=r"unsupported on a \(arm64 without NEON\), b \(x\)"):
        V.preflight(plan(), facts)


def test_limited_host_is_a_warning():
    facts = {"a": host(), "b": host(isa=("neon",), status="limited", reason="no bf16")}
    choice = V.preflight(plan(), facts)
    assert choice.warnings == ["b: vLLM CPU support is limited: no bf16"]
    assert choice.dtype == "float32"


def test_missing_verdict_names_the_host():
    facts = copy.deepcopy(PAIR)
    del facts["b"]["backends"]
    with pytest.raises(V.VllmLwsError, match=r"^b: llmfleet_host has no backends\.vllm_cpu"):
        V.preflight(plan(), facts)


def test_mixed_architectures_are_refused():
    facts = {"a": host(), "b": host(arch="x86_64", isa=("avx2", "avx512f"))}
    with pytest.raises(V.VllmLwsError, match="a=arm64, b=x86_64"):
        V.preflight(plan(), facts)
    # ...unless a multi-arch image is given and asked for.
    choice = V.preflight(plan(), facts, image="example/vllm-cpu:multi", allow_mixed_arch=True)
    assert choice.image == "example/vllm-cpu:multi" and choice.kube_arch == ""
    lws = lws_of(
        V.render(plan(), facts, {**OPTS, "image": "example/vllm-cpu:multi", "allow_mixed_arch": True})
    )
    for c in ("leaderTemplate", "workerTemplate"):
        assert "nodeSelector" not in lws["spec"]["leaderWorkerTemplate"][c]["spec"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"pp_layer_partition": "13,12"}, "sums to 25, the model has 26"),
        ({"pp_layer_partition": "13,0,13", "pipeline_size": 3, "stages": ["a", "b", "c"]}, "positive"),
        ({"pipeline_size": 3}, "disagrees"),
        ({"stages": ["a", "a"]}, "names a host twice"),
        ({"kvcache_space_gib": 0}, "at least 1 GiB"),
        ({"pp_layer_partition": "13;13"}, "comma-separated"),
    ],
)
def test_inconsistent_plans_are_refused(bad, message):
    p = plan()
    p["vllm"].update(bad)
    with pytest.raises(V.VllmLwsError, match=message):
        V.preflight(p, {**PAIR, "c": host()})


def test_no_vllm_section():
    p = plan()
    del p["vllm"]
    with pytest.raises(V.VllmLwsError, match="no 'vllm' section"):
        V.preflight(p, PAIR)


def test_a_plan_the_typed_plan_cannot_read_is_refused_naming_the_field():
    """The plan goes through plan.parse first: a broken row is named, not read by hand."""
    p = plan()
    p["hosts"][0]["layers"] = [3, 1]
    with pytest.raises(V.VllmLwsError, match=r"plan: hosts\[0\]\.layers must be \[first, last\)"):
        V.preflight(p, PAIR)
    p = plan()
    p["vllm"]["pipeline_size"] = "two"
    with pytest.raises(V.VllmLwsError, match=r"plan: vllm\.pipeline_size is 'two', expected a number"):
        V.preflight(p, PAIR)


def test_a_stage_host_without_usable_memory_facts_takes_its_plan_rows():
    """usable_mib from the plan's row (Plan.host(...).usable_mib) when the facts have none."""
    p = plan()
    p["hosts"][0]["usable_mib"] = 30000.0
    facts = {"a": host(), "b": host()}
    del facts["a"]["memory"]["usable_mib"]
    choice = V.preflight(p, facts)
    assert choice.stages[0].usable_mib == 30000


def test_pod_that_does_not_fit_a_node_is_refused():
    facts = {"a": host(usable=30000), "b": host(usable=11000)}
    # 2000040448 B / 2 stages = 953.7 MiB, + 4096 KV + 8192 overhead = 13242 MiB -> 13 GiB pods
    with pytest.raises(V.VllmLwsError, match=r"13312 MiB per pod do not fit b \(stage 1, usable 11000 MiB\)"):
        V.preflight(plan(), facts)


def test_memory_override_below_need_is_refused():
    with pytest.raises(V.VllmLwsError, match="vllm_lws_memory_gib 8 is below"):
        V.preflight(plan(), PAIR, memory_gib=8)


def test_cpu_override_above_a_host_is_refused():
    facts = {"a": host(cpus=8), "b": host(cpus=4)}
    with pytest.raises(V.VllmLwsError, match=r"b \(4\)"):
        V.preflight(plan(), facts, cpu=6)


def test_enforce_eager_is_refused_even_when_asked():
    with pytest.raises(V.VllmLwsError, match="--enforce-eager is refused"):
        V.render(plan(), PAIR, {**OPTS, "extra_args": ["--enforce-eager"]})


# ---- decisions ----------------------------------------------------------------------------------


def test_seed_pair_decisions():
    choice = V.preflight(plan(), PAIR, memory_gib=20)
    assert choice.image == "vllm/vllm-openai-cpu:v0.31.0-arm64"
    assert (choice.kube_arch, choice.dtype) == ("arm64", "bfloat16")
    assert (choice.cpu, choice.memory_mib) == (6, 20 * GIB)
    assert choice.rank_mode == "worker_index"
    assert choice.pp_layer_partition == "13,13" and choice.kvcache_space_gib == 4


def test_computed_memory_is_weights_kv_and_overhead_rounded_up():
    choice = V.preflight(plan(), PAIR, overhead_mib=6144)
    # 953.7 + 4096 + 6144 = 11193.7 -> 11194 MiB -> 11 GiB
    assert choice.memory_mib == 11 * GIB
    assert [s.need_mib for s in choice.stages] == [11194, 11194]


def test_float32_doubles_the_weights():
    facts = {"a": host(isa=("neon",), status="limited"), "b": host(isa=("neon",), status="limited")}
    choice = V.preflight(plan(), facts, overhead_mib=0)
    assert choice.dtype == "float32"
    # 2 x 953.7 MiB of bf16-sized weights + 4096 MiB KV = 6003.4 -> 6004
    assert choice.stages[0].need_mib == 6004


def test_plan_per_stage_weights_are_used_when_given():
    p = plan(partition="20,6")
    p["vllm"]["stage_weights_mib"] = [3000.0, 500.0]
    choice = V.preflight(p, PAIR, overhead_mib=0)
    assert [s.need_mib for s in choice.stages] == [3000 + 4096, 500 + 4096]


@pytest.mark.parametrize(
    "broken",
    [None, [3000.0], [3000.0, -1.0], [3000.0, float("nan")], [3000.0, "500"], [3000.0, True]],
    ids=["missing", "one-for-two-stages", "negative", "nan", "string", "bool"],
)
def test_a_plan_without_the_planners_stage_weights_is_refused(broken):
    """vLLM sizing is the planner's: no estimate from the model's bytes when the plan lacks them."""
    p = plan(partition="20,6")
    if broken is None:
        del p["vllm"]["stage_weights_mib"]
    else:
        p["vllm"]["stage_weights_mib"] = broken
    with pytest.raises(V.VllmLwsError, match=r"plan: vllm\.stage_weights_mib"):
        V.preflight(p, PAIR, overhead_mib=0)


def test_the_stage_weights_are_the_planners():
    """A plan from the planner: each rank's need is the planner's weights for that stage (the
    embedding on rank 0, the output layer on the last) plus the KV, not the bytes by layer count."""
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P

    from tests.unit.plugins.plugin_utils.test_placement import host as phost
    from tests.unit.plugins.plugin_utils.test_placement import layout

    lay = layout(n_layer=8, layer_mib=100, embd_mib=400, out_mib=50)
    model = {"name": "tiny", "file": "/models/tiny.gguf", "sha256": "a" * 64}
    # vllm_hosts "all" (the lws target): two equal budgets, four layers a stage
    p = P.make_plan(lay, model, phost("a", 2000), [phost("b", 2000)], {"vllm_hosts": "all"}, 8, "vllm", "lws")
    assert p["vllm"]["pp_layer_partition"] == "4,4"
    # rank 0: 4 layers + the embedding; rank 1: 4 layers + the output layer and its norm
    assert p["vllm"]["stage_weights_mib"] == [800.0, pytest.approx(450.0, abs=0.01)]
    facts = {"a": host(), "b": host()}
    choice = V.preflight(p, facts, overhead_mib=0, dtype="bfloat16")
    kv = p["vllm"]["kvcache_space_gib"] * 1024
    assert [s.need_mib for s in choice.stages] == [800 + kv, 451 + kv]


@pytest.mark.parametrize(
    "arch, isa, status, dtype",
    [
        ("x86_64", ("avx2", "avx512f"), "supported", "bfloat16"),
        ("x86_64", ("avx2",), "limited", "float32"),
        ("aarch64", ("neon", "bf16"), "supported", "bfloat16"),
        ("aarch64", ("neon",), "limited", "float32"),
    ],
)
def test_dtype(arch, isa, status, dtype):
    facts = {h: host(arch=arch, isa=isa, status=status) for h in ("a", "b")}
    assert V.preflight(plan(), facts).dtype == dtype
    assert V.preflight(plan(), facts, dtype="float32").dtype == "float32"


def test_image_arch_from_the_probes_rule_when_the_fact_leaves_it_out():
    facts = {h: host(arch="x86_64", isa=("avx2", "avx512f")) for h in ("a", "b")}
    for f in facts.values():
        del f["backends"]["vllm_cpu"]["image_arch"]
    choice = V.preflight(plan(), facts)
    assert (choice.image, choice.kube_arch) == ("vllm/vllm-openai-cpu:v0.31.0-x86_64", "amd64")


def test_rank_mode_follows_the_worker_stages():
    three = {"a": host(), "b": host(), "c": host()}
    assert V.preflight(plan("10,8,8", ("a", "b", "c")), three).rank_mode == "worker_index"
    assert V.preflight(plan("6,8,12", ("a", "b", "c")), three).rank_mode == "node_name"


# ---- manifests ----------------------------------------------------------------------------------


def test_worker_rank_script_maps_nodes_to_the_plans_ranks(tmp_path: Path):
    three = {"a": host(), "b": host(), "c": host()}
    objs = V.render(plan("6,8,12", ("a", "b", "c")), three, {**OPTS, "node_names": {"c": "ip-10-0-1-9"}})
    _unused, worker = containers(lws_of(objs))
    assert not any(a.startswith("--node-rank") for a in worker["args"])
    fake = tmp_path / "vllm"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    for node, rank in (("b", 2 - 1), ("ip-10-0-1-9", 2)):
        out = subprocess.run(
            worker["command"] + worker["args"],
            env={"PATH": f"{tmp_path}:/usr/bin:/bin", "LLMFLEET_NODE_NAME": node},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.startswith("serve google/gemma-3-1b-it ") and out.rstrip().endswith(f"--node-rank={rank}")
    bad = subprocess.run(
        worker["command"] + worker["args"],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "LLMFLEET_NODE_NAME": "c"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 64 and "'c'" in bad.stderr


def test_secrets_only_when_given_and_only_in_secrets():
    objs = V.render(plan(), PAIR, OPTS)
    assert "Secret" not in {o["object"]["kind"] for o in objs}
    objs = V.render(plan(), PAIR, {**OPTS, "api_key": "k-123", "hf_token": "hf-456"})
    secrets = [o for o in objs if o["object"]["kind"] == "Secret"]
    assert [s["object"]["stringData"] for s in secrets] == [{"token": "hf-456"}, {"key": "k-123"}]
    for o in objs:
        if o["object"]["kind"] != "Secret":
            assert "k-123" not in repr(o) and "hf-456" not in repr(o)


def test_ingress_orders_specific_paths_before_the_api_paths():
    objs = V.render(
        plan(),
        PAIR,
        {
            **OPTS,
            "ingress_paths": [
                {"path": "/chat", "service": "chat", "port": 8080},
                {"path": "/chat/api", "service": "x", "port": 1},
            ],
        },
    )
    (ing,) = [o["object"] for o in objs if o["object"]["kind"] == "Ingress"]
    assert [p["path"] for p in ing["spec"]["rules"][0]["http"]["paths"]] == [
        "/chat/api",
        "/chat",
        "/v1",
        "/health",
    ]
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "300"
    with pytest.raises(V.VllmLwsError, match="specific path"):
        V.render(plan(), PAIR, {**OPTS, "ingress_paths": [{"path": "/", "service": "x", "port": 1}]})


def test_file_names_are_fixed_per_kind():
    names = [o["file"] for o in V.render(plan(), PAIR, {**OPTS, "podmonitor": True, "api_key": "k"})]
    assert names == sorted(names)
    assert names[0].startswith("vllm-00-namespace") and names[-1].startswith("vllm-50-podmonitor")


def test_model_is_required():
    with pytest.raises(V.VllmLwsError, match="vllm_lws_model is empty"):
        V.render(plan(), PAIR, {})


def test_kv_space_can_be_raised_not_lowered():
    p = plan(kv=2)
    assert V.preflight(p, PAIR, kvcache_space_gib=4).kvcache_space_gib == 4
    with pytest.raises(V.VllmLwsError, match="below the plan's 2 GiB"):
        V.preflight(p, PAIR, kvcache_space_gib=1)
    assert V.preflight(p, PAIR).kvcache_space_gib == 2


def test_single_stage_plan_renders_a_group_of_one():
    objs = V.render(plan("26", ("a",)), {"a": host()}, OPTS)
    lws = lws_of(objs)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 1
    worker_spec = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "nodeAffinity" not in worker_spec["affinity"]
    assert (
        V.preflight(plan("26", ("a",)), {"a": host()})
        .warnings[0]
        .startswith("the plan puts every layer on a")
    )


def test_unsupported_host_outside_the_stages_is_refused_too():
    facts = {**PAIR, "c": host(status="unsupported", reason="arm64 without NEON")}
    with pytest.raises(V.VllmLwsError, match=r"unsupported on c \(arm64 without NEON\)"):
        V.preflight(plan(), facts)


def test_a_float32_checkpoint_served_as_bfloat16_takes_half_its_stored_bytes():
    # vllm.weights_dtype_bytes 4 (a float32 Hugging Face checkpoint, hf_layout): bf16 holds each
    # weight in 2 bytes, so a stage stored as 2000 MiB needs 1000 MiB of weights.
    p = plan(partition="3,1", kv=1, n_layer=4)
    p["vllm"]["stage_weights_mib"] = [2000.0, 400.0]
    p["vllm"]["weights_dtype_bytes"] = 4
    choice = V.preflight(p, PAIR, overhead_mib=0, dtype="bfloat16")
    assert [s.need_mib for s in choice.stages] == [1000 + 1024, 200 + 1024]
    choice = V.preflight(p, PAIR, overhead_mib=0, dtype="float32")
    assert [s.need_mib for s in choice.stages] == [2000 + 1024, 400 + 1024]
    # Without the field (a GGUF plan) the weights are taken as 16-bit, as before.
    del p["vllm"]["weights_dtype_bytes"]
    choice = V.preflight(p, PAIR, overhead_mib=0, dtype="bfloat16")
    assert [s.need_mib for s in choice.stages] == [2000 + 1024, 400 + 1024]


# Issue #31 item 2: the lws target publishes the API only, over TLS, behind a NetworkPolicy ----------


def _objects(**options):
    return {o["object"]["kind"]: o["object"] for o in V.render(plan(), PAIR, {**OPTS, **options})}


def _leader_paths(ing):
    return {
        p["path"]: p["pathType"]
        for p in ing["spec"]["rules"][0]["http"]["paths"]
        if p["backend"]["service"]["name"] == "vllm-leader"
    }


def test_the_ingress_routes_only_the_api_to_the_leader():
    """vLLM's key guards /v1 only: /invocations, /tokenize, /pause, /metrics must not be routed."""
    ing = _objects()["Ingress"]
    assert _leader_paths(ing) == {"/v1": "Prefix", "/health": "Exact"}

    def routed(url):  # Prefix matches whole path elements, Exact the whole path (Ingress rules)
        for p in ing["spec"]["rules"][0]["http"]["paths"]:
            if p["pathType"] == "Exact" and url == p["path"]:
                return True
            if p["pathType"] == "Prefix" and (
                p["path"] == "/" or url == p["path"] or url.startswith(p["path"] + "/")
            ):
                return True
        return False

    for url in (
        "/invocations",
        "/tokenize",
        "/detokenize",
        "/pause",
        "/resume",
        "/metrics",
        "/ping",
        "/",
        "/v1x",
    ):
        assert not routed(url), url
    for url in ("/v1/chat/completions", "/v1/models", "/health"):
        assert routed(url), url


def test_the_ingress_is_tls_by_default_plain_http_when_asked():
    nginx = _objects()["Ingress"]
    assert nginx["metadata"]["annotations"]["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"
    assert "tls" not in nginx["spec"]  # the controller's own certificate
    with_secret = _objects(ingress_tls_secret="api-tls", ingress_host="api.example")["Ingress"]
    assert with_secret["spec"]["tls"] == [{"secretName": "api-tls", "hosts": ["api.example"]}]
    alb = _objects(ingress_flavor="alb")["Ingress"]["metadata"]["annotations"]
    assert alb["alb.ingress.kubernetes.io/listen-ports"] == '[{"HTTP":80},{"HTTPS":443}]'
    assert alb["alb.ingress.kubernetes.io/ssl-redirect"] == "443"
    for off in (False, "false", "False"):
        plain = _objects(ingress_tls=off, ingress_tls_secret="api-tls")["Ingress"]
        assert "nginx.ingress.kubernetes.io/force-ssl-redirect" not in plain["metadata"]["annotations"]
        assert "tls" not in plain["spec"]


def test_the_pods_carry_no_token_and_no_capability_but_sys_nice():
    lws = _objects()["LeaderWorkerSet"]
    for role in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = spec["containers"]
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
        }


def test_a_network_policy_opens_only_the_api_port_outside_the_group():
    policy = _objects()["NetworkPolicy"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "vllm"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    group, api = policy["spec"]["ingress"]
    assert group == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vllm"}}}]}
    assert api == {"ports": [{"protocol": "TCP", "port": 8000}]}
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    limited = _objects(networkpolicy_api_from=[peer])["NetworkPolicy"]
    assert limited["spec"]["ingress"][1] == {"ports": [{"protocol": "TCP", "port": 8000}], "from": [peer]}
    assert "NetworkPolicy" not in _objects(networkpolicy=False)

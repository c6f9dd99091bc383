"""The ``lws`` target, rendered for real: ``playbooks/deploy_vllm.yml`` in render-only mode.

Each fleet runs the real playbook (probe skips the what-if hosts, the planner plans, the role
renders) into a temporary output directory; the tests then read what was written:

- the LeaderWorkerSet against the CRD's openAPIV3Schema (../shared/schemas/, made strict: a field
  the schema does not know is an error, as the API server would silently prune it);
- every other object with ``kubernetes-validate --strict`` for Kubernetes 1.33 and 1.37, and the
  LeaderWorkerSet's two pod templates as PodTemplates the same way;
- the seed's manifest (parsed out of ../shared/seeds/vllm-lws-gemma-two-nodes.txt) reproduced;
- every hard-won setting, with a checker that is shown to fail when any one of them is lost;
- the uneven three-node partition following plan.json, and the worker's node-rank script run;
- a fleet with an ``unsupported`` host refused before anything is rendered;
- no secret value in any file other than the Secrets (0600), nor in the playbook's output.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Callable

import gguf
import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import yaml

from tests.support.ansible_env import ansible_env
from tests.support.k8s_validate import assert_valid

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
CRD = SHARED / "schemas" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
SEED = SHARED / "seeds" / "vllm-lws-gemma-two-nodes.txt"
PLAYBOOK = ROOT / "playbooks" / "deploy_vllm.yml"
GRAVITON = ROOT / "inventories" / "graviton-pair"
WHATIF_THREE = ROOT / "tests" / "fixtures" / "vllm_lws" / "whatif-three"
K8S_VERSIONS = ("1.33.0", "1.37.0")

# Values that must only ever appear inside the Secret files.
HF_TOKEN = "hf_TESTtokenNeverInAManifest_7f3a9c"
API_KEY = "sk-llmfleet-test-key-5b2e81d0"

IMAGE_ARCH = {"aarch64": "arm64", "x86_64": "x86_64"}
KUBE_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}


# --------------------------------------------------------------------------------------------------
# The model: Gemma 3 1B planned from a header-only GGUF (nothing downloaded)
# --------------------------------------------------------------------------------------------------

# google/gemma-3-1b-it config.json: hidden 1152, intermediate 6912, 26 layers, 4 heads, 1 KV head,
# head_dim 256, vocab 262144, context 32768, sliding window 512 on 5 of every 6 layers, tied
# embeddings. With matrices in bf16 and norms in f32 (a bf16 GGUF conversion) that is the published
# 999,885,952 parameters.
GEMMA3_1B = {
    "n_embd": 1152,
    "n_ff": 6912,
    "n_layer": 26,
    "n_head": 4,
    "n_head_kv": 1,
    "head_dim": 256,
    "n_vocab": 262144,
}
GEMMA3_1B_PARAMS = 999_885_952


def write_gemma3_1b_header(path: Path) -> int:
    """The GGUF header and tensor table of Gemma 3 1B in bf16, the data region left sparse (the
    file is as long as the real one, 24 KiB on disk). Returns the parameter count."""
    c = GEMMA3_1B
    h, f, hd, nh, nkv = c["n_embd"], c["n_ff"], c["head_dim"], c["n_head"], c["n_head_kv"]
    bf16, f32 = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("Gemma 3 1B It")
    writer.add_block_count(c["n_layer"])
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(f)
    writer.add_head_count(nh)
    writer.add_head_count_kv(nkv)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_context_length(32768)
    writer.add_sliding_window(512)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", 6)
    sizes: list[int] = []
    params = 0

    def tensor(name: str, shape: tuple[int, ...], qtype) -> None:
        nonlocal params
        count = int(np.prod(shape))
        nbytes = count * (2 if qtype == bf16 else 4)
        writer.add_tensor_info(
            name, shape, np.float16 if qtype == bf16 else np.float32, nbytes, raw_dtype=qtype
        )
        sizes.append(nbytes)
        params += count

    tensor("token_embd.weight", (c["n_vocab"], h), bf16)
    per_layer = [
        ("attn_q", (nh * hd, h), bf16),
        ("attn_k", (nkv * hd, h), bf16),
        ("attn_v", (nkv * hd, h), bf16),
        ("attn_output", (h, nh * hd), bf16),
        ("ffn_gate", (f, h), bf16),
        ("ffn_up", (f, h), bf16),
        ("ffn_down", (h, f), bf16),
        ("attn_norm", (h,), f32),
        ("post_attention_norm", (h,), f32),
        ("ffn_norm", (h,), f32),
        ("post_ffw_norm", (h,), f32),
        ("attn_q_norm", (hd,), f32),
        ("attn_k_norm", (hd,), f32),
    ]
    for il in range(c["n_layer"]):
        for name, shape, qtype in per_layer:
            tensor(f"blk.{il}.{name}.weight", shape, qtype)
    tensor("output_norm.weight", (h,), f32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()

    def align(n: int) -> int:
        return (n + 31) // 32 * 32

    os.truncate(path, align(path.stat().st_size) + sum(align(n) for n in sizes))
    return params


@pytest.fixture(scope="session")
def model_vars(tmp_path_factory) -> Path:
    """Extra vars that point llmfleet_model at the header-only GGUF."""
    base = tmp_path_factory.mktemp("model")
    gguf_path = base / "gemma-3-1b-it-BF16.gguf"
    assert write_gemma3_1b_header(gguf_path) == GEMMA3_1B_PARAMS
    out = base / "model.yml"
    model = {"name": "gemma-3-1b-it", "hf_repo": "google/gemma-3-1b-it", "file": str(gguf_path)}
    out.write_text(yaml.safe_dump({"llmfleet_model": model}))
    return out


# --------------------------------------------------------------------------------------------------
# Running the playbook
# --------------------------------------------------------------------------------------------------


_env = ansible_env


def run_playbook(inventory: Path, out: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    secrets = out.parent / f"{out.name}-secrets.yml"
    secrets.write_text(yaml.safe_dump({"vllm_lws_hf_token": HF_TOKEN, "vllm_lws_api_key": API_KEY}))
    cmd = [
        "ansible-playbook",
        str(PLAYBOOK),
        "-i",
        str(inventory),
        "-e",
        f"llmfleet_output_dir={out}",
        "-e",
        "llmfleet_render_only=true",
        "-e",
        f"@{secrets}",
        "-e",
        f"@{model}",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)


class Rendered:
    """What one playbook run wrote: the objects by kind, the files, plan.json, the output."""

    def __init__(self, out: Path, proc: subprocess.CompletedProcess) -> None:
        self.out = out
        self.proc = proc
        self.dir = out / "manifests"
        self.files = sorted(self.dir.glob("vllm-*.yaml"))
        self.objects: dict[Path, dict] = {p: yaml.safe_load(p.read_text()) for p in self.files}
        plan_file = out / "plan.json"
        self.plan = json.loads(plan_file.read_text()) if plan_file.is_file() else None

    def kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects.values() if o["kind"] == kind]

    def one(self, kind: str) -> dict:
        found = self.kind(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)} in {self.dir}"
        return found[0]

    @property
    def lws(self) -> dict:
        return self.one("LeaderWorkerSet")


def _render(tmp_path_factory, model_vars: Path, inventory: Path, name: str) -> Rendered:
    out = tmp_path_factory.mktemp(name) / "out"
    proc = run_playbook(inventory, out, model_vars)
    assert proc.returncode == 0, (
        f"deploy_vllm.yml failed on {inventory}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    return Rendered(out, proc)


@pytest.fixture(scope="module")
def graviton(tmp_path_factory, model_vars) -> Rendered:
    return _render(tmp_path_factory, model_vars, GRAVITON, "graviton")


@pytest.fixture(scope="module")
def three(tmp_path_factory, model_vars) -> Rendered:
    return _render(tmp_path_factory, model_vars, WHATIF_THREE, "three")


@pytest.fixture(params=["graviton", "three"])
def rendered(request) -> Rendered:
    return request.getfixturevalue(request.param)


def inventory_facts(inventory: Path) -> dict[str, dict]:
    """llmfleet_host of every what-if host, read from the inventory's host_vars (not from the output)."""
    return {
        p.stem: yaml.safe_load(p.read_text())["llmfleet_host"]
        for p in (inventory / "host_vars").glob("*.yml")
    }


# --------------------------------------------------------------------------------------------------
# Pod template helpers
# --------------------------------------------------------------------------------------------------


def templates(lws: dict) -> dict[str, dict]:
    lwt = lws["spec"]["leaderWorkerTemplate"]
    return {"leader": lwt["leaderTemplate"], "worker": lwt["workerTemplate"]}


def container(template: dict) -> dict:
    (c,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return c


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def flag_values(args: list[str], flag: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]


# --------------------------------------------------------------------------------------------------
# The independent checker of the hard-won settings (shown below to fail on each loss)
# --------------------------------------------------------------------------------------------------


def hard_won_problems(lws: dict, n_layer: int) -> list[str]:
    """Every setting the seed paid for, checked on a rendered LeaderWorkerSet."""
    problems = []
    lwt = lws["spec"]["leaderWorkerTemplate"]
    size = lwt.get("size")
    if lwt.get("restartPolicy") != "RecreateGroupOnPodRestart":
        problems.append("restartPolicy is not RecreateGroupOnPodRestart")
    partitions = set()
    for role, tpl in templates(lws).items():
        spec = tpl["spec"]
        c = container(tpl)
        args = c.get("args", []) + c.get("command", [])
        env = env_of(c)
        if any(a == "--enforce-eager" or a.startswith("--enforce-eager=") for a in args):
            problems.append(f"{role}: --enforce-eager")
        if "-cc.mode=2" not in args or "-cc.backend=eager" not in args:
            problems.append(f"{role}: eager compile backend missing")
        if "--no-async-scheduling" not in args:
            problems.append(f"{role}: --no-async-scheduling missing")
        if flag_values(args, "--pipeline-parallel-size") != [str(size)]:
            problems.append(f"{role}: --pipeline-parallel-size is not the group size {size}")
        if flag_values(args, "--tensor-parallel-size") != ["1"]:
            problems.append(f"{role}: --tensor-parallel-size is not 1")
        if flag_values(args, "--nnodes") != [str(size)]:
            problems.append(f"{role}: --nnodes is not the group size {size}")
        if flag_values(args, "--master-addr") != ["$(LWS_LEADER_ADDRESS)"]:
            problems.append(f"{role}: --master-addr is not $(LWS_LEADER_ADDRESS)")
        ranks = flag_values(args, "--node-rank")
        script = " ".join(c.get("command", []))
        if role == "leader":
            if ranks != ["0"]:
                problems.append("leader: --node-rank is not 0")
            if "--headless" in args:
                problems.append("leader: --headless")
            if not c.get("ports") or "startupProbe" not in c or "readinessProbe" not in c:
                problems.append("leader: API port or probes missing")
        else:
            by_index = ranks == ["$(LWS_WORKER_INDEX)"]
            by_node = not ranks and '--node-rank="$rank"' in script and "LLMFLEET_NODE_NAME" in env
            if not (by_index or by_node):
                problems.append("worker: node rank neither $(LWS_WORKER_INDEX) nor from the node name")
            if "--headless" not in args:
                problems.append("worker: not --headless")
            if c.get("ports") or "startupProbe" in c or "readinessProbe" in c:
                problems.append("worker: has ports or probes")
        part = env.get("VLLM_PP_LAYER_PARTITION", {}).get("value")
        if not part or sum(int(x) for x in part.split(",")) != n_layer or len(part.split(",")) != size:
            problems.append(
                f"{role}: VLLM_PP_LAYER_PARTITION {part!r} does not cover {n_layer} layers in {size} stages"
            )
        partitions.add(part)
        if not str(env.get("VLLM_CPU_KVCACHE_SPACE", {}).get("value", "")).isdigit():
            problems.append(f"{role}: VLLM_CPU_KVCACHE_SPACE missing")
        if (
            env.get("VLLM_HOST_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            != "status.podIP"
        ):
            problems.append(f"{role}: VLLM_HOST_IP is not the pod IP")
        if "secretKeyRef" not in env.get("HF_TOKEN", {}).get("valueFrom", {}):
            problems.append(f"{role}: HF_TOKEN not from a Secret")
        if role == "leader" and "secretKeyRef" not in env.get("VLLM_API_KEY", {}).get("valueFrom", {}):
            problems.append("leader: VLLM_API_KEY not from a Secret")
        if "SYS_NICE" not in c.get("securityContext", {}).get("capabilities", {}).get("add", []):
            problems.append(f"{role}: SYS_NICE missing")
        res = c.get("resources", {})
        if not res.get("limits") or res.get("requests") != res.get("limits"):
            problems.append(f"{role}: requests != limits")
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        shm = vols.get(mounts.get("/dev/shm", ""), {})
        if shm.get("emptyDir", {}).get("medium") != "Memory":
            problems.append(f"{role}: /dev/shm is not a memory emptyDir")
        anti = (
            spec.get("affinity", {})
            .get("podAntiAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", [])
        )
        labels = tpl["metadata"]["labels"]
        if not any(
            t.get("topologyKey") == "kubernetes.io/hostname"
            and all(labels.get(k) == v for k, v in t.get("labelSelector", {}).get("matchLabels", {}).items())
            and t.get("labelSelector", {}).get("matchLabels")
            for t in anti
        ):
            problems.append(f"{role}: no required pod anti-affinity by hostname selecting the group's pods")
    if len(partitions) != 1:
        problems.append(f"leader and worker disagree on VLLM_PP_LAYER_PARTITION: {partitions}")
    return problems


def _leader(lws: dict) -> dict:
    return container(templates(lws)["leader"])


def _worker(lws: dict) -> dict:
    return container(templates(lws)["worker"])


def _drop_arg(c: dict, prefix: str) -> None:
    c["args"] = [a for a in c["args"] if not a.startswith(prefix)]


def _drop_env(c: dict, name: str) -> None:
    c["env"] = [e for e in c["env"] if e["name"] != name]


MUTATIONS: dict[str, Callable[[dict], None]] = {
    "enforce-eager added": lambda d: _worker(d)["args"].append("--enforce-eager"),
    "eager backend lost": lambda d: _drop_arg(_leader(d), "-cc.backend"),
    "async scheduling back": lambda d: _drop_arg(_worker(d), "--no-async-scheduling"),
    "anti-affinity lost": lambda d: templates(d)["worker"]["spec"]["affinity"].pop("podAntiAffinity"),
    "anti-affinity preferred only": lambda d: templates(d)["leader"]["spec"]["affinity"].update(
        podAntiAffinity={"preferredDuringSchedulingIgnoredDuringExecution": []}
    ),
    "worker rank lost": lambda d: (_drop_arg(_worker(d), "--node-rank"), _worker(d).pop("command", None)),
    "leader rank wrong": lambda d: (
        _drop_arg(_leader(d), "--node-rank"),
        _leader(d)["args"].append("--node-rank=1"),
    ),
    "partition lost": lambda d: _drop_env(_worker(d), "VLLM_PP_LAYER_PARTITION"),
    "partition short": lambda d: next(
        e for e in _leader(d)["env"] if e["name"] == "VLLM_PP_LAYER_PARTITION"
    ).update(value="1," * (d["spec"]["leaderWorkerTemplate"]["size"] - 1) + "1"),
    "kv space lost": lambda d: _drop_env(_leader(d), "VLLM_CPU_KVCACHE_SPACE"),
    "host ip lost": lambda d: _drop_env(_worker(d), "VLLM_HOST_IP"),
    "shm on disk": lambda d: templates(d)["worker"]["spec"]["volumes"][0]["emptyDir"].pop("medium"),
    "sys_nice lost": lambda d: _leader(d)["securityContext"]["capabilities"].update(add=[]),
    "requests below limits": lambda d: _worker(d)["resources"]["requests"].update(memory="1Gi"),
    "api key inline": lambda d: next(e for e in _leader(d)["env"] if e["name"] == "VLLM_API_KEY").update(
        value="x", valueFrom={}
    ),
    "worker serves http": lambda d: _drop_arg(_worker(d), "--headless"),
    "pipeline size wrong": lambda d: (
        _drop_arg(_leader(d), "--pipeline-parallel-size"),
        _leader(d)["args"].append("--pipeline-parallel-size=1"),
    ),
    "restart policy none": lambda d: d["spec"]["leaderWorkerTemplate"].update(restartPolicy="None"),
}


def test_hard_won_settings_all_present(rendered: Rendered) -> None:
    assert hard_won_problems(rendered.lws, rendered.plan["model"]["n_layer"]) == []


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_hard_won_checker_fails_when_a_setting_is_lost(
    graviton: Rendered, three: Rendered, mutation: str
) -> None:
    for r in (graviton, three):
        lws = copy.deepcopy(r.lws)
        MUTATIONS[mutation](lws)
        assert hard_won_problems(lws, r.plan["model"]["n_layer"]), f"{mutation} went unnoticed"


# --------------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD schema with ``additionalProperties: false`` wherever it lists properties and does not
    preserve unknown fields: the API server prunes what the schema does not know, so a misspelt
    field would vanish silently; here it is an error."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def lws_validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # metadata is checked by the API server, not by the CRD schema (it is a bare `type: object`).
    return jsonschema.Draft7Validator(schema)


def test_leaderworkerset_validates_against_the_crd(rendered: Rendered, lws_validator) -> None:
    errors = sorted(lws_validator.iter_errors(rendered.lws), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    assert rendered.lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"


def test_crd_validation_catches_mistakes(graviton: Rendered, lws_validator) -> None:
    misspelt = copy.deepcopy(graviton.lws)
    misspelt["spec"]["leaderWorkerTemplate"]["restartPolicie"] = "RecreateGroupOnPodRestart"
    assert list(lws_validator.iter_errors(misspelt))
    bad_enum = copy.deepcopy(graviton.lws)
    bad_enum["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    assert list(lws_validator.iter_errors(bad_enum))
    bad_type = copy.deepcopy(graviton.lws)
    bad_type["spec"]["leaderWorkerTemplate"]["size"] = "2"
    assert list(lws_validator.iter_errors(bad_type))
    bad_port = copy.deepcopy(graviton.lws)
    _leader(bad_port)["ports"][0]["containerPort"] = "8000"
    assert list(lws_validator.iter_errors(bad_port))
    unknown_in_pod = copy.deepcopy(graviton.lws)
    _worker(unknown_in_pod)["resource"] = {}
    assert list(lws_validator.iter_errors(unknown_in_pod))


CUSTOM_KINDS = {"LeaderWorkerSet", "PodMonitor"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_other_objects_pass_kubernetes_validate_strict(rendered: Rendered, version: str) -> None:
    files = [p for p, o in rendered.objects.items() if o["kind"] not in CUSTOM_KINDS]
    kinds = {rendered.objects[p]["kind"] for p in files}
    assert {"Namespace", "Service", "Ingress", "Secret", "NetworkPolicy"} <= kinds
    assert_valid(files, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_lws_pod_templates_pass_kubernetes_validate_strict(rendered: Rendered, version: str) -> None:
    for role, tpl in templates(rendered.lws).items():
        obj = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"lws-{role}"},
            "template": tpl,
        }
        kubernetes_validate.validate(obj, version, strict=True)
    broken = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "x"},
        "template": copy.deepcopy(tpl),
    }
    container(broken["template"])["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_podmonitor_rendered_on_request_only(graviton: Rendered, three: Rendered) -> None:
    # graviton-pair leaves vllm_lws_render_podmonitor at false, whatif-three sets it.
    assert graviton.kind("PodMonitor") == []
    pm = three.one("PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == three.lws["metadata"]["namespace"]
    leader_labels = templates(three.lws)["leader"]["metadata"]["labels"]
    worker_labels = templates(three.lws)["worker"]["metadata"]["labels"]
    sel = pm["spec"]["selector"]["matchLabels"]
    assert all(leader_labels.get(k) == v for k, v in sel.items())
    assert not all(worker_labels.get(k) == v for k, v in sel.items()), "the worker has no /metrics"
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["path"] == "/metrics" and ep["port"] == "http"
    assert any(p.get("name") == ep["port"] for p in _leader(three.lws)["ports"])


# --------------------------------------------------------------------------------------------------
# The seed reproduced (graviton-pair)
# --------------------------------------------------------------------------------------------------


def _seed_yaml(start: str, end: str) -> dict:
    text = SEED.read_text()
    a = text.index(start)
    return yaml.safe_load(text[a : text.index(end, a)])


def test_graviton_pair_reproduces_the_seed(graviton: Rendered) -> None:
    seed = _seed_yaml("apiVersion: leaderworkerset.x-k8s.io/v1", "\nThe flags")
    seed_lwt = seed["spec"]["leaderWorkerTemplate"]
    ours_lwt = graviton.lws["spec"]["leaderWorkerTemplate"]
    assert ours_lwt["size"] == seed_lwt["size"] == 2
    assert ours_lwt["restartPolicy"] == seed_lwt["restartPolicy"]
    assert graviton.lws["spec"]["replicas"] == seed["spec"]["replicas"]

    seed_c = seed_lwt["leaderTemplate"]["spec"]["containers"][0]
    ours_c = _leader(graviton.lws)
    assert ours_c["image"] == seed_c["image"] == "vllm/vllm-openai-cpu:v0.31.0-arm64"
    assert ours_c["args"][0] == seed_c["args"][0] == "google/gemma-3-1b-it"
    assert set(seed_c["args"]) <= set(ours_c["args"]), set(seed_c["args"]) - set(ours_c["args"])
    assert ours_c["resources"] == seed_c["resources"]
    # The seed's SYS_NICE is kept; every other capability dropped (issue #31 item 2).
    assert (
        seed_c["securityContext"]["capabilities"]["add"] == ours_c["securityContext"]["capabilities"]["add"]
    )
    assert ours_c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert ours_c["volumeMounts"] == seed_c["volumeMounts"]
    assert (
        templates(graviton.lws)["leader"]["spec"]["volumes"] == seed_lwt["leaderTemplate"]["spec"]["volumes"]
    )
    ours_env, seed_env = env_of(ours_c), env_of(seed_c)
    for name, entry in seed_env.items():
        if "value" in entry:
            assert ours_env[name]["value"] == entry["value"], name
        else:
            ref = next(iter(entry["valueFrom"]))
            got = ours_env[name]["valueFrom"][ref]
            assert {k: got[k] for k in entry["valueFrom"][ref]} == entry["valueFrom"][ref], name
    # What the seed left to vLLM's default (an even split) is explicit here, from the plan.
    assert ours_env["VLLM_PP_LAYER_PARTITION"]["value"] == "13,13"
    assert graviton.plan["vllm"]["pp_layer_partition"] == "13,13"
    assert graviton.plan["model"]["n_layer"] == 26
    for probe in ("startupProbe", "readinessProbe"):
        assert ours_c[probe]["httpGet"] == seed_c[probe]["httpGet"]
    assert ours_c["startupProbe"]["failureThreshold"] == seed_c["startupProbe"]["failureThreshold"]

    # The worker: the same, but rank from LWS, --headless, no port, no probes, no API key.
    worker = _worker(graviton.lws)
    assert worker["image"] == ours_c["image"] and worker["resources"] == ours_c["resources"]
    assert flag_values(worker["args"], "--node-rank") == ["$(LWS_WORKER_INDEX)"]
    assert "--headless" in worker["args"] and not flag_values(worker["args"], "--port")
    assert "VLLM_API_KEY" not in env_of(worker)

    # The leader-only Service and the Ingress, specific path before the API's own paths (no catch-all
    # since issue #31: vLLM's key guards /v1 only), 300 s idle timeout.
    svc = graviton.one("Service")
    assert svc["spec"]["selector"] == {
        k: v
        for k, v in templates(graviton.lws)["leader"]["metadata"]["labels"].items()
        if k in svc["spec"]["selector"]
    }
    assert svc["spec"]["selector"].get("llmfleet.io/vllm-role") == "leader"
    seed_ing = _seed_yaml("apiVersion: networking.k8s.io/v1", "\nThe chat Service")
    ing = graviton.one("Ingress")
    assert [p["path"] for p in ing["spec"]["rules"][0]["http"]["paths"]] == ["/chat", "/v1", "/health"]
    assert ing["spec"]["ingressClassName"] == seed_ing["spec"]["ingressClassName"]
    # The seed's ALB annotations, but TLS (issue #31): HTTPS beside HTTP, which is redirected.
    listen = "alb.ingress.kubernetes.io/listen-ports"
    for key, value in seed_ing["metadata"]["annotations"].items():
        if key != listen:
            assert ing["metadata"]["annotations"][key] == value, key
    assert seed_ing["metadata"]["annotations"][listen] == '[{"HTTP":80}]'
    assert ing["metadata"]["annotations"][listen] == '[{"HTTP":80},{"HTTPS":443}]'
    assert ing["metadata"]["annotations"]["alb.ingress.kubernetes.io/ssl-redirect"] == "443"
    api = ing["spec"]["rules"][0]["http"]["paths"][-1]["backend"]["service"]
    assert api["name"] == svc["metadata"]["name"] and api["port"]["number"] == 8000


# --------------------------------------------------------------------------------------------------
# Following the plan
# --------------------------------------------------------------------------------------------------


def _quantity_mib(q: str) -> float:
    units = {"Gi": 1024, "Mi": 1, "Ki": 1 / 1024}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * factor
    return float(q) / (1024 * 1024)


def _inventory_of(rendered: Rendered) -> Path:
    return GRAVITON if rendered.lws["metadata"]["name"] == "vllm-gemma" else WHATIF_THREE


def test_partition_kv_and_resources_follow_the_plan(rendered: Rendered) -> None:
    plan = rendered.plan
    vllm = plan["vllm"]
    counts = [int(x) for x in vllm["pp_layer_partition"].split(",")]
    assert sum(counts) == plan["model"]["n_layer"]
    assert vllm["pipeline_size"] == len(counts) == len(vllm["stages"])
    lwt = rendered.lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == vllm["pipeline_size"]
    inventory = _inventory_of(rendered)
    facts = inventory_facts(inventory)
    role_vars = yaml.safe_load((inventory / "group_vars" / "all" / "vllm_lws.yml").read_text())
    kv = max(vllm["kvcache_space_gib"], role_vars.get("vllm_lws_kvcache_space_gib", 0))
    for c in (_leader(rendered.lws), _worker(rendered.lws)):
        env = env_of(c)
        assert env["VLLM_PP_LAYER_PARTITION"]["value"] == vllm["pp_layer_partition"]
        # The plan's KV space (one full context), or the inventory's larger choice (the seed's 4).
        assert env["VLLM_CPU_KVCACHE_SPACE"]["value"] == str(kv)
        limit = _quantity_mib(c["resources"]["limits"]["memory"])
        assert limit == _quantity_mib(c["resources"]["requests"]["memory"])
        # The pod (KV cache included) fits every node it may land on, as the probe measured them.
        for name in vllm["stages"]:
            assert kv * 1024 < limit <= facts[name]["memory"]["usable_mib"], name
        shm = _quantity_mib(templates(rendered.lws)["leader"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"])
        assert shm <= limit


def _node_affinity_hosts(tpl: dict) -> list[str]:
    terms = tpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    (expr,) = [e for e in term["matchExpressions"] if e["key"] == "kubernetes.io/hostname"]
    assert expr["operator"] == "In"
    return expr["values"]


def test_pods_are_pinned_to_the_planned_nodes(rendered: Rendered) -> None:
    stages = rendered.plan["vllm"]["stages"]
    t = templates(rendered.lws)
    assert _node_affinity_hosts(t["leader"]) == stages[:1]
    assert sorted(_node_affinity_hosts(t["worker"])) == sorted(stages[1:])


def test_image_arch_matches_node_arch(rendered: Rendered) -> None:
    facts = inventory_facts(_inventory_of(rendered))
    stages = rendered.plan["vllm"]["stages"]
    arches = {facts[h]["arch"] for h in stages}
    assert len(arches) == 1
    (arch,) = arches
    for tpl in templates(rendered.lws).values():
        c = container(tpl)
        assert c["image"].endswith(f"-{IMAGE_ARCH[arch]}"), c["image"]
        assert tpl["spec"]["nodeSelector"]["kubernetes.io/arch"] == KUBE_ARCH[arch]


def _run_rank_script(worker: dict, node: str, tmp: Path) -> subprocess.CompletedProcess:
    """The worker's command, run with /bin/sh as the kubelet would start it, `vllm` faked on PATH."""
    fake = tmp / "bin"
    fake.mkdir(exist_ok=True)
    vllm = fake / "vllm"
    vllm.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    vllm.chmod(0o755)
    cmd = worker["command"] + worker["args"]
    env = {"PATH": f"{fake}:/usr/bin:/bin", "LLMFLEET_NODE_NAME": node}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_three_node_fleet_gets_the_plans_uneven_partition(three: Rendered, tmp_path: Path) -> None:
    plan = three.plan
    vllm = plan["vllm"]
    counts = [int(x) for x in vllm["pp_layer_partition"].split(",")]
    assert len(counts) == 3 and len(set(counts)) > 1, f"expected an uneven 3-stage partition, got {counts}"
    assert sum(counts) == plan["model"]["n_layer"]
    # More usable memory, more layers (the fixture's hosts differ in memory, nothing else).
    facts = inventory_facts(WHATIF_THREE)
    usable = [facts[h]["memory"]["usable_mib"] for h in vllm["stages"]]
    by_mem = sorted(range(3), key=lambda i: usable[i])
    assert [counts[i] for i in by_mem] == sorted(counts), (vllm["stages"], usable, counts)

    lws = three.lws
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    worker = _worker(lws)
    if "command" not in worker:
        # Equal worker stages: any worker node may take any worker rank.
        assert len(set(counts[1:])) == 1
        return
    # Unequal worker stages: the rank follows the node the pod landed on, as the plan assigned it.
    for rank, node in enumerate(vllm["stages"]):
        if rank == 0:
            continue
        proc = _run_rank_script(worker, node, tmp_path)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.splitlines()
        assert f"--node-rank={rank}" in out and out[0] == "serve", out
        assert "--headless" in out and "--master-addr=$(LWS_LEADER_ADDRESS)" in out
    proc = _run_rank_script(worker, "some-other-node", tmp_path)
    assert proc.returncode != 0 and "some-other-node" in proc.stderr


def _variant(tmp_path: Path, source: Path, host: str, facts: dict) -> Path:
    """A copy of an inventory with one host's llmfleet_host changed."""
    inventory = tmp_path / "inventory"
    shutil.copytree(source, inventory)
    path = inventory / "host_vars" / f"{host}.yml"
    data = yaml.safe_load(path.read_text())
    data["llmfleet_host"].update(facts)
    path.write_text(yaml.safe_dump(data))
    return inventory


def test_limited_host_is_warned_about_and_rendered(tmp_path: Path, model_vars: Path) -> None:
    # graviton-b as a Graviton2 (Neoverse N1): NEON without bf16.
    inventory = _variant(
        tmp_path,
        GRAVITON,
        "graviton-b",
        {
            "isa": ["dotprod", "neon"],
            "backends": {
                "llama_cpp": {
                    "status": "release",
                    "flavour": "ubuntu-arm64",
                    "flavours": ["ubuntu-arm64"],
                    "reason": "-",
                },
                "vllm_cpu": {"status": "limited", "image_arch": "arm64", "reason": "arm64 NEON without bf16"},
            },
        },
    )
    out = tmp_path / "out"
    proc = run_playbook(inventory, out, model_vars)
    assert proc.returncode == 0, proc.stdout[-4000:]
    warnings = [line for line in proc.stdout.splitlines() if "WARNING" in line and "graviton-b" in line]
    assert warnings and "limited" in warnings[0], proc.stdout[-4000:]
    lws = Rendered(out, proc).lws
    for c in (_leader(lws), _worker(lws)):
        assert flag_values(c["args"], "--dtype") == ["float32"]


# --------------------------------------------------------------------------------------------------
# Refusal and secrets
# --------------------------------------------------------------------------------------------------


def test_unsupported_host_is_refused_before_rendering(tmp_path: Path, model_vars: Path) -> None:
    victim = "ryzen-7950x"
    inventory = _variant(
        tmp_path,
        WHATIF_THREE,
        victim,
        {
            "isa": ["avx", "fma"],
            "backends": {
                "llama_cpp": {
                    "status": "release",
                    "flavour": "ubuntu-x64",
                    "flavours": ["ubuntu-x64"],
                    "reason": "-",
                },
                "vllm_cpu": {"status": "unsupported", "image_arch": None, "reason": "x86_64 without avx2"},
            },
        },
    )
    out = tmp_path / "out"
    proc = run_playbook(inventory, out, model_vars)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "unsupported" in text and victim in text, text[-3000:]
    assert not list(out.glob("manifests/vllm-*")), "something was rendered for a refused fleet"


def test_no_secret_value_outside_the_secrets(rendered: Rendered) -> None:
    secrets = rendered.kind("Secret")
    assert {s["metadata"]["name"] for s in secrets} == {"hf-token", "vllm-api-key"}
    values = {v for s in secrets for v in s["stringData"].values()}
    assert values == {HF_TOKEN, API_KEY}
    for path, obj in rendered.objects.items():
        text = path.read_text()
        if obj["kind"] == "Secret":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            continue
        for value in (HF_TOKEN, API_KEY):
            assert value not in text, f"{value} in {path.name}"
    for stream in (rendered.proc.stdout, rendered.proc.stderr):
        for value in (HF_TOKEN, API_KEY):
            assert value not in stream
    for path in rendered.out.rglob("*"):
        if path.is_file() and path.parent != rendered.dir:
            for value in (HF_TOKEN, API_KEY):
                assert value not in path.read_text(errors="replace"), path


def test_render_is_idempotent(graviton: Rendered, model_vars: Path) -> None:
    before = {p.name: p.read_text() for p in graviton.files}
    proc = run_playbook(GRAVITON, graviton.out, model_vars)
    assert proc.returncode == 0, proc.stdout[-3000:]
    # No task of this role changes anything on a second run (the plan role answers for its own files).
    blocks = proc.stdout.split("TASK [")
    ours = [b for b in blocks if b.startswith("llmfleet.cluster.vllm_lws")]
    assert ours, proc.stdout[-3000:]
    changed = [b.splitlines()[0] for b in ours if "\nchanged: [" in b]
    assert changed == [], changed
    assert {p.name: p.read_text() for p in sorted(graviton.dir.glob("vllm-*.yaml"))} == before


def test_the_chat_page_fronts_the_leader_with_its_own_key_secret(tmp_path: Path, model_vars: Path) -> None:
    """With chat_ui_password, deploy_vllm.yml also renders the page: next to the leader, reading its Secret."""
    password = "lws-chat-password-3"
    out = tmp_path / "out"
    proc = run_playbook(GRAVITON, out, model_vars, "-e", f"chat_ui_password={password}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    rendered = Rendered(out, proc)
    chat = {p: yaml.safe_load(p.read_text()) for p in sorted(rendered.dir.glob("chat-*.yaml"))}
    by_kind = {o["kind"]: o for o in chat.values()}
    assert {"Deployment", "Service", "Ingress", "ConfigMap", "Secret"} <= set(by_kind)
    for obj in chat.values():
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
    (leader,) = rendered.kind("Service")
    namespace = leader["metadata"]["namespace"]
    assert {o["metadata"]["namespace"] for o in chat.values()} == {namespace}
    env = {
        e["name"]: e.get("value")
        for e in by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    port = leader["spec"]["ports"][0]["port"]
    assert env["LLMFLEET_CHAT_UPSTREAM"] == f"http://{leader['metadata']['name']}.{namespace}.svc:{port}"
    # The key is the one the leader reads (VLLM_API_KEY), not a copy in the page's own Secret.
    leader_key = env_of(container(templates(rendered.lws)["leader"]))["VLLM_API_KEY"]["valueFrom"][
        "secretKeyRef"
    ]
    volume = next(
        v for v in by_kind["Deployment"]["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-key"
    )
    assert volume["secret"]["secretName"] == leader_key["name"]
    assert volume["secret"]["items"] == [{"key": leader_key["key"], "path": "api-key"}]
    assert set(by_kind["Secret"]["data"]) == {"password"}
    assert password not in proc.stdout + proc.stderr

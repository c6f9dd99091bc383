# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The LeaderWorkerSet that render.yml wrote, run for real (molecule verify, in file order).

One LWS group on two podman hosts, as the LWS controller and the kubelet would run it:
- each pod is a container on one podman network (DNS on), an overlay of this machine's root
  (``--rootfs /:O``) standing for the vLLM CPU image, with the vLLM venv of
  scripts/build-vllm-cpu.sh first on PATH and the image's entrypoint ``vllm serve``;
- what runs is the template's own command/args/env (tests/support/podman_pods.py: $(VAR)
  expansion, secretKeyRef, the downward API), with the variables LWS injects into every container
  (LWS_LEADER_ADDRESS = the leader pod's DNS name <name>-<group>.<name>.<namespace>, LWS_GROUP_SIZE,
  LWS_WORKER_INDEX), the template's memory limit as the container's, /dev/shm of the emptyDir's
  sizeLimit, SYS_NICE; --runtime runc and lowered ulimits as this machine needs;
- RecreateGroupOnPodRestart: when a pod dies, every pod of the group is deleted and recreated.
One boot serves every check; the restart is measured once. Prints every figure it asserts on.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tests.support.podman_pods import PodmanPod, podman

CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
VENV = CACHE / "vllm-venv"
OUT = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "out"
NETWORK = "vllm-lws"
# vllm/vllm-openai-cpu's ENTRYPOINT: the templates give only args.
IMAGE_ENTRYPOINT = ["vllm", "serve"]
START_DEADLINE = float(os.environ.get("VLLM_LWS_START_DEADLINE", "1500"))


def load_manifests() -> dict[str, dict]:
    objs = {}
    for path in sorted((OUT / "manifests").glob("vllm-*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                objs[f"{obj['kind']}/{obj['metadata']['name']}"] = obj
    return objs


def mib(quantity: str) -> int:
    m = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert m, f"unexpected quantity {quantity}"
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


def pod_cores(cpu: int, index: int, ncpu: int) -> list[int]:
    """The cores of pod ``index``: its CPU limit's worth, its own where the machine has enough.

    Each LWS pod runs on a node of its own; here both share one machine. vLLM binds its OpenMP
    threads to the cores it is allowed (VLLM_CPU_OMP_THREADS_BIND=auto): without a cpuset both
    ranks bind core 0 and take turns on it, which no two real nodes would do.
    """
    return sorted({(index * cpu + i) % ncpu for i in range(min(cpu, ncpu))})


class LwsPod(PodmanPod):
    """One LWS pod on a podman host of its own (an overlay of this machine's root)."""

    def __init__(
        self, *args: Any, lws_env: dict[str, str], aliases: list[str], index: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lws_env = lws_env
        self.aliases = aliases
        self.index = index

    def create(self) -> None:
        c = self.spec["containers"][0]
        limit = mib(c["resources"]["limits"]["memory"])
        shm = next(v for v in self.spec["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"]
        caps = (c.get("securityContext") or {}).get("capabilities", {}).get("add", [])
        extra = [f"--network-alias={a}" for a in self.aliases]
        cores = pod_cores(int(c["resources"]["limits"]["cpu"]), self.index, os.cpu_count() or 1)
        extra.append(f"--cpuset-cpus={','.join(map(str, cores))}")
        podman(
            "run", "-d", "--name", self.name, "--hostname", self.node, "--network", self.network, *extra,
            "--runtime", "runc", "--ulimit", "nofile=16384:16384", "--ulimit", "nproc=32768:32768",
            f"--memory={limit}m", f"--memory-swap={limit}m", f"--shm-size={mib(shm)}m",
            *[f"--cap-add={cap}" for cap in caps],
            "--rootfs", "/:O", "sleep", "infinity",
        )  # fmt: skip
        info = json.loads(podman("inspect", self.name).stdout)[0]
        self.ip = info["NetworkSettings"]["Networks"][self.network]["IPAddress"]
        podman("exec", self.name, "mkdir", "-p", "/var/log/pod")

    def env_of(self, container: dict) -> dict[str, str]:
        # LWS adds its variables to every container, before the template's own (which refer to them).
        items = []
        for item in container.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref and ref.get("optional") and ref["name"] not in self.secrets:
                continue  # an optional Secret that does not exist: the kubelet leaves the variable out
            items.append(item)
        env = dict(self.lws_env)
        env["PATH"] = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env.update(super().env_of({**container, "env": items}))
        return env

    def argv_of(self, container: dict, env: dict[str, str]) -> list[str]:
        if container.get("command"):
            return super().argv_of(container, env)
        return super().argv_of({**container, "command": IMAGE_ENTRYPOINT}, env)

    def running(self) -> bool:
        proc = podman("inspect", "-f", "{{.State.Running}}", self.name, check=False)
        return proc.stdout.strip() == "true"

    def vllm_alive(self) -> bool:
        return podman("exec", self.name, "pgrep", "-f", "vllm serve", check=False).returncode == 0


class Group:
    """One LeaderWorkerSet group (replica 0): the leader <name>-0 and workers <name>-0-<i>."""

    def __init__(self, lws: dict, secrets: dict[str, dict]) -> None:
        self.lws = lws
        self.name = lws["metadata"]["name"]
        self.ns = lws["metadata"]["namespace"]
        tmpl = lws["spec"]["leaderWorkerTemplate"]
        self.size = int(tmpl["size"])
        self.restart_policy = tmpl.get("restartPolicy", "RecreateGroupOnPodRestart")
        self.leader_address = f"{self.name}-0.{self.name}.{self.ns}"
        self.secrets = secrets
        self.tmpl = tmpl
        self.pods: list[LwsPod] = []
        self.boots = 0

    def _pod(self, index: int) -> LwsPod:
        template = self.tmpl["leaderTemplate"] if index == 0 else self.tmpl["workerTemplate"]
        name = f"{self.name}-0" if index == 0 else f"{self.name}-0-{index}"
        lws_env = {
            "LWS_LEADER_ADDRESS": self.leader_address,
            "LWS_GROUP_SIZE": str(self.size),
            "LWS_WORKER_INDEX": str(index),
        }
        workdir = OUT / "pods" / name
        workdir.mkdir(parents=True, exist_ok=True)
        return LwsPod(
            name, name, template, namespace=self.ns, configmaps={}, secrets=self.secrets, network=NETWORK,
            image="", workdir=workdir, lws_env=lws_env,
            aliases=[self.leader_address] if index == 0 else [], index=index,
        )  # fmt: skip

    def start(self) -> float:
        self.pods = [self._pod(i) for i in range(self.size)]
        for pod in self.pods:
            pod.remove()
        started = time.monotonic()
        for pod in self.pods:  # startupPolicy LeaderCreated: the workers start with the leader
            pod.create()
        for pod in self.pods:
            pod.start_containers()
        self.boots += 1
        return started

    def recreate(self) -> float:
        """RecreateGroupOnPodRestart: every pod of the group deleted, then the group created anew."""
        logs = {p.name: p.log("vllm") for p in self.pods}
        (OUT / f"logs-boot{self.boots}.json").write_text(json.dumps(logs))
        for pod in self.pods:
            pod.remove()
        return self.start()

    @property
    def leader(self) -> LwsPod:
        return self.pods[0]

    def remove(self) -> None:
        for pod in self.pods:
            pod.remove()


def http(url: str, body: dict | None = None, key: str | None = None, timeout: float = 120) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read(1 << 16).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as err:
        return 0, str(err)


class Secret(str):
    def __repr__(self) -> str:
        return "'<api key>'"


@pytest.fixture(scope="module")
def objs() -> dict[str, dict]:
    return load_manifests()


@pytest.fixture(scope="module")
def plan() -> dict:
    return json.loads((OUT / "plan.json").read_text())


@pytest.fixture(scope="module")
def lws(objs) -> dict:
    (found,) = [o for k, o in objs.items() if k.startswith("LeaderWorkerSet/")]
    return found


@pytest.fixture(scope="module")
def secrets(objs) -> dict[str, dict]:
    out = {}
    for key, obj in objs.items():
        if key.startswith("Secret/"):
            data = {
                k: base64.b64encode(v.encode()).decode() for k, v in (obj.get("stringData") or {}).items()
            }
            data.update(obj.get("data") or {})
            out[obj["metadata"]["name"]] = {"data": data}
    return out


@pytest.fixture(scope="module")
def api_key(secrets, lws) -> str:
    env = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]
    ref = next(e for e in env if e["name"] == "VLLM_API_KEY")["valueFrom"]["secretKeyRef"]
    return Secret(base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode())


def port_of(lws: dict) -> int:
    c = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    return int(c["ports"][0]["containerPort"])


def served_model(lws: dict) -> str:
    args = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    named = [a.split("=", 1)[1] for a in args if a.startswith("--served-model-name=")]
    return named[0] if named else args[0]


def complete(group: Group, lws: dict, key: str | None, tokens: int = 8) -> tuple[int, str]:
    url = f"http://{group.leader.ip}:{port_of(lws)}/v1/completions"
    body = {
        "model": served_model(lws),
        "prompt": "the fleet serves",
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    return http(url, body, key)


def wait_answer(group: Group, lws: dict, key: str, started: float) -> dict:
    """Poll until the leader answers a completion with the key; fail early when a pod died."""
    last = ""
    while time.monotonic() - started < START_DEADLINE:
        for pod in group.pods:
            if not pod.running() or not pod.vllm_alive():
                tail = "\n".join(p.name + ":\n" + p.log("vllm")[-3000:] for p in group.pods)
                raise AssertionError(f"{pod.name}: vLLM exited before the first answer\n{tail}")
        status, text = complete(group, lws, key)
        if status == 200:
            answer = json.loads(text)
            answer["_seconds"] = round(time.monotonic() - started, 1)
            return answer
        last = f"{status} {text[:200]}"
        time.sleep(5)
    tail = "\n".join(p.name + ":\n" + p.log("vllm")[-3000:] for p in group.pods)
    raise AssertionError(f"no answer within {START_DEADLINE} s (last: {last})\n{tail}")


@pytest.fixture(scope="module")
def group(lws, secrets):
    podman("network", "create", NETWORK, check=False)
    g = Group(lws, secrets)
    yield g
    g.remove()


@pytest.fixture(scope="module")
def first_answer(group, lws, api_key) -> dict:
    started = group.start()
    answer = wait_answer(group, lws, api_key, started)
    print(f"\nvllm_lws: first answer {answer['_seconds']} s after the group was created: {answer['usage']}")
    return answer


# ------------------------------------------------------------------------------------------ checks
def test_the_rendered_group_follows_the_plan(lws, plan):
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    partition = plan["vllm"]["pp_layer_partition"]
    assert partition == "3,1", f"the scenario's fleet should plan an uneven 3,1, got {partition}"
    assert tmpl["size"] == plan["vllm"]["pipeline_size"] == 2
    assert tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role in ("leaderTemplate", "workerTemplate"):
        c = tmpl[role]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["VLLM_PP_LAYER_PARTITION"] == partition
        assert "--enforce-eager" not in c["args"]
    print(f"\nvllm_lws: plan partition {partition}, stage weights {plan['vllm']['stage_weights_mib']} MiB")


def test_a_completion_with_the_key_and_401_without(first_answer, group, lws, api_key):
    assert first_answer["usage"]["completion_tokens"] == 8
    status, text = complete(group, lws, None)
    assert status == 401, f"without the key: {status} {text[:200]}"
    status, _text = complete(group, lws, "not-the-key-" + "x" * 20)
    assert status == 401
    print(f"\nvllm_lws: with the key 200, {first_answer['usage']}; without 401; a wrong key 401")


def weights_loaded(log: str) -> tuple[set[int], set[str]]:
    """(decoder layer indices, other weights) a rank says it loads.

    vLLM logs no layer ranges, but a float32 checkpoint served as bfloat16 makes each rank warn
    "Attempted to load weight <name> with dtype torch.float32 ..." for the weights it converts:
    only those of its own stage.
    """
    layers, others = set(), set()
    for name in re.findall(r"Attempted to load weight (\S+) with dtype", log):
        m = re.match(r"(?:model\.)?layers\.(\d+)\.", name)
        if m:
            layers.add(int(m.group(1)))
        else:
            others.add(name)
    return layers, others


def test_vllms_own_lines_prove_both_ranks_and_their_layers(first_answer, group, plan):
    logs = [pod.log("vllm") for pod in group.pods]
    (OUT / "leader.log").write_text(logs[0])
    (OUT / "worker.log").write_text(logs[1])
    pattern = re.compile(
        r"PP rank|headless|Loading weights took|Warming up done|GiB for KV cache|KV cache size"
    )
    for name, text in zip(("leader", "worker"), logs):
        lines = [ln.strip()[:240] for ln in text.splitlines() if pattern.search(ln)]
        print(f"\nvllm_lws: {name} ({len(lines)} lines):\n  " + "\n  ".join(lines[:20]))
    assert re.search(r"PP rank 0\b", logs[0]), "the leader never logged PP rank 0"
    assert re.search(r"PP rank 1\b", logs[1]), "the worker never logged PP rank 1"
    assert "headless" in logs[1].lower()
    # The plan's partition (3,1) honoured: rank r loads exactly its own layers.
    counts = [int(n) for n in plan["vllm"]["pp_layer_partition"].split(",")]
    first = 0
    for rank, (count, text) in enumerate(zip(counts, logs)):
        layers, others = weights_loaded(text)
        print(f"\nvllm_lws: rank {rank} loaded layers {sorted(layers)} and {sorted(others)}")
        assert layers == set(range(first, first + count)), (
            f"rank {rank}: loaded layers {sorted(layers)}, the plan gives it {first}..{first + count - 1}"
        )
        first += count
    assert any("lm_head" in o for o in weights_loaded(logs[-1])[1]), "the last rank holds lm_head"


def cgroup_peak_mib(pod: LwsPod) -> float | None:
    for path in ("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", "/sys/fs/cgroup/memory.peak"):
        proc = podman("exec", pod.name, "cat", path, check=False)
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            return int(proc.stdout) / 1048576
    return None


def rss_mib(pod: LwsPod) -> float:
    out = podman("exec", pod.name, "ps", "-eo", "rss=,args=", check=False).stdout
    return (
        sum(
            int(line.split()[0]) for line in out.splitlines() if line.strip() and "sleep infinity" not in line
        )
        / 1024
    )


def test_each_ranks_memory_against_the_plan(first_answer, group, lws, plan):
    vllm = plan["vllm"]
    scale = 2.0 / float(vllm.get("weights_dtype_bytes") or 2)  # served as bfloat16
    overhead = float(os.environ.get("VLLM_LWS_OVERHEAD_MIB", "0")) or None
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    rows = []
    for rank, pod in enumerate(group.pods):
        role = "leaderTemplate" if rank == 0 else "workerTemplate"
        limit = mib(tmpl[role]["spec"]["containers"][0]["resources"]["limits"]["memory"])
        weights = vllm["stage_weights_mib"][rank] * scale
        kv = vllm["kvcache_space_gib"] * 1024
        peak, rss = cgroup_peak_mib(pod), rss_mib(pod)
        rows.append((rank, pod.name, weights, kv, limit, rss, peak))
        print(
            f"\nvllm_lws: rank {rank} ({pod.name}): plan weights {weights:.1f} MiB (bf16) + KV {kv} MiB"
            f" -> pod limit {limit} MiB; RSS {rss:.0f} MiB, cgroup peak "
            + (f"{peak:.0f} MiB ({peak / limit:.0%} of the limit)" if peak else "n/a")
            + (f", overhead set {overhead:.0f}" if overhead else "")
        )
    for _rank, name, weights, _kv, limit, rss, _peak in rows:
        assert rss < limit, f"{name}: RSS {rss:.0f} MiB over the rendered limit {limit} MiB"
        assert rss > weights, f"{name}: RSS {rss:.0f} MiB below its own weights {weights:.1f} MiB?"


def test_the_worker_killed_restarts_the_group_which_answers_again(first_answer, group, lws, api_key):
    worker = group.pods[1]
    old_leader_id = podman("inspect", "-f", "{{.Id}}", group.leader.name).stdout.strip()
    killed = time.monotonic()
    podman("kill", worker.name)
    # The controller's view: the worker pod is gone; RecreateGroupOnPodRestart recreates the group.
    assert not worker.running()
    assert group.restart_policy == "RecreateGroupOnPodRestart"
    group.recreate()
    new_leader_id = podman("inspect", "-f", "{{.Id}}", group.leader.name).stdout.strip()
    assert new_leader_id != old_leader_id, "the leader must be recreated with the worker (all-or-nothing)"
    answer = wait_answer(group, lws, api_key, killed)
    assert answer["usage"]["completion_tokens"] == 8
    print(f"\nvllm_lws: worker killed -> group recreated -> answered again after {answer['_seconds']} s")

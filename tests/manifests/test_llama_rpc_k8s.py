"""The ``kubernetes`` target of llmfleet.cluster.llama_rpc, rendered for real by playbooks/render.yml.

Each fleet runs the real playbook (probe skips the what-if hosts, the planner plans the tiny
8-layer model, the role renders) into a temporary output directory; the tests then read what was
written:

- every object passes ``kubernetes-validate --strict`` for Kubernetes 1.33 and 1.37;
- one rpc-server DaemonSet per architecture of the planned workers, on the labelled nodes, no host
  network or port, ``--cache`` on a hostPath, memory from plan.json (computed here independently);
- the pins per architecture, the plan and the supervisor (the systemd target's file) in the ConfigMap,
  and every ConfigMap key a pod refers to present;
- the NetworkPolicy lets only the llama-server pods reach the rpc port of the rpc-server pods;
- the supervisor discovers the workers through a service account allowed to list pods, with a
  selector that selects the DaemonSets' pods;
- no secret value outside the Secret (0600) nor in the playbook's output; a second render changes
  nothing; a missing pin is refused before anything is written;
- (slow) the pods of the rendered DaemonSet and Deployment, their init containers and commands
  read from the YAML, run on podman hosts against a fake API server and answer a chat completion.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import shutil
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.ansible_env import ansible_env
from tests.support.k8s_validate import assert_valid, run_strict

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "render.yml"
FIXTURES = ROOT / "tests" / "fixtures" / "llama_rpc_k8s"
WHATIF = FIXTURES / "whatif"
WORKERLESS = FIXTURES / "workerless"
# What exists only for workers: a render of a workerless plan writes none of these kinds.
WORKER_ONLY_KINDS = {"DaemonSet", "NetworkPolicy", "Role", "RoleBinding"}
PODMAN_FLEET = FIXTURES / "podman"
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"
ARTIFACTS = ROOT / "plugins" / "module_utils" / "artifacts.py"
CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
MODEL = CACHE / "models" / "tiny-llama-8L.gguf"
TARBALL = CACHE / "dist" / "llama-b0c1e570-bin-ubuntu-x64.tar.gz"
HOST_IMAGE = "localhost/llmfleet-host:bookworm"
K8S_VERSIONS = ("1.33.0", "1.37.0")
BUILD = "b0c1e570"
API_KEY = "sk-llmfleet-k8s-test-3c9e7a51"
# Stand-in pins for the what-if render (never downloaded).
FAKE_X64_SHA = "a" * 64
FAKE_ARM_SHA = "b" * 64


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_env = ansible_env


def run_render(inventory: Path, out: Path, extra: dict, *args: str) -> subprocess.CompletedProcess:
    vars_file = out.parent / f"{out.name}-vars.yml"
    vars_file.write_text(yaml.safe_dump(extra))
    cmd = [
        "ansible-playbook", str(PLAYBOOK), "-i", str(inventory),
        "-e", f"llmfleet_output_dir={out}", "-e", f"@{vars_file}", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)


def model_vars(url: str) -> dict:
    return {
        "llmfleet_model": {"name": "tiny-llama-8L", "file": str(MODEL), "sha256": sha256_of(MODEL)},
        "llama_rpc_k8s_model_url": url,
        "llama_rpc_api_key": API_KEY,
    }


def whatif_vars() -> dict:
    return {
        **model_vars("http://models.example.internal/tiny-llama-8L.gguf"),
        "llama_cpp_build": BUILD,
        "llama_cpp_releases": {
            BUILD: {
                "ubuntu-x64": {"url": "http://mirror.example.internal/x64.tar.gz", "sha256": FAKE_X64_SHA},
                "ubuntu-arm64": {
                    "url": "http://mirror.example.internal/arm64.tar.gz",
                    "sha256": FAKE_ARM_SHA,
                },
            }
        },
    }


class Rendered:
    def __init__(self, out: Path, proc: subprocess.CompletedProcess) -> None:
        self.out = out
        self.proc = proc
        self.dir = out / "manifests"
        self.files = sorted(self.dir.glob("llama-rpc-*.yaml"))
        self.objects = {p: yaml.safe_load(p.read_text()) for p in self.files}
        self.plan = json.loads((out / "plan.json").read_text())

    def kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects.values() if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict:
        found = [o for o in self.kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    @property
    def configmap(self) -> dict:
        return self.one("ConfigMap")

    @property
    def deployment(self) -> dict:
        return self.one("Deployment")

    def daemonsets(self) -> dict[str, dict]:
        return {
            d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/arch"]: d
            for d in self.kind("DaemonSet")
        }


def _render(tmp_path_factory, inventory: Path, extra: dict, name: str) -> Rendered:
    out = tmp_path_factory.mktemp(name) / "out"
    proc = run_render(inventory, out, extra)
    assert proc.returncode == 0, (
        f"render.yml failed on {inventory}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    return Rendered(out, proc)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Rendered:
    return _render(tmp_path_factory, WHATIF, whatif_vars(), "whatif")


def inventory_facts(inventory: Path) -> dict[str, dict]:
    data = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts: dict[str, dict] = {}
    for group in data["all"]["children"].values():
        for name, hv in group["hosts"].items():
            hosts[name] = hv["llmfleet_host"]
    return hosts


def containers(pod_spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec.get("initContainers", []) + pod_spec["containers"]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_passes_kubernetes_validate_strict(rendered: Rendered, version: str) -> None:
    kinds = sorted(o["kind"] for o in rendered.objects.values())
    assert kinds == sorted(
        ["Namespace", "Secret", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy",
         "Service", "Service", "DaemonSet", "DaemonSet", "PersistentVolumeClaim", "Deployment"]
    )  # fmt: skip
    assert_valid(rendered.files, version)


def test_a_misspelt_field_would_fail_the_validation(rendered: Rendered, tmp_path: Path) -> None:
    """The strict check is not a formality: one misspelt field in the DaemonSet fails it."""
    ds = json.loads(json.dumps(rendered.daemonsets()["amd64"]))
    ds["spec"]["template"]["spec"]["hostNetwrok"] = False
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(ds))
    assert run_strict([bad], K8S_VERSIONS[0]).returncode != 0


# --------------------------------------------------------------------------------------------------
# rpc-server DaemonSets
# --------------------------------------------------------------------------------------------------


def test_one_daemonset_per_planned_architecture_on_the_labelled_nodes(rendered: Rendered) -> None:
    facts = inventory_facts(WHATIF)
    archs = {facts[w]["kube_arch"] for w in rendered.plan["workers"]}
    assert set(rendered.daemonsets()) == archs == {"amd64", "arm64"}
    for arch, ds in rendered.daemonsets().items():
        spec = ds["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"llmfleet.io/rpc": "true", "kubernetes.io/arch": arch}
        assert {"key": "llmfleet.io/dedicated", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]
        assert not spec.get("hostNetwork") and not spec.get("hostPID")
        assert selects(ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"])
        for c in containers(spec).values():
            assert all("hostPort" not in p for p in c.get("ports", [])), c["name"]
        (server,) = spec["containers"]
        assert server["ports"] == [{"name": "rpc", "containerPort": 50052, "protocol": "TCP"}]
        assert server["args"][-1] == "--cache"
        env = {e["name"]: e.get("value") for e in server["env"]}
        assert env["GGML_NO_BACKTRACE"] == "1"
        mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "hostPath" in volumes[mounts[env["LLAMA_CACHE"]]]
        assert server["securityContext"]["runAsNonRoot"] is True


def test_worker_memory_and_threads_come_from_the_plan(rendered: Rendered) -> None:
    facts = inventory_facts(WHATIF)
    plan = rendered.plan
    entries = plan["hosts"] + [h for f in plan["fallbacks"] if f.get("ok") for h in f.get("hosts", [])]
    for arch, ds in rendered.daemonsets().items():
        mine = [w for w in plan["workers"] if facts[w]["kube_arch"] == arch]
        need = max(h["predicted_mib"]["total"] for h in entries if h["name"] in mine)
        host_entries = [h for h in plan["hosts"] if h["name"] in mine]
        allowed = max(h["usable_mib"] - h["reserve_mib"] for h in host_entries)
        (server,) = ds["spec"]["template"]["spec"]["containers"]
        assert server["resources"]["requests"]["memory"] == f"{math.ceil(need)}Mi"
        assert server["resources"]["limits"]["memory"] == f"{math.floor(allowed)}Mi"
        threads = server["args"][server["args"].index("--threads") + 1]
        assert threads == str(min(h["threads"] for h in host_entries))


# --------------------------------------------------------------------------------------------------
# ConfigMap: plan, pins, scripts; every key a pod reads exists
# --------------------------------------------------------------------------------------------------


def test_configmap_carries_the_plan_the_pins_and_the_systemd_supervisor(rendered: Rendered) -> None:
    data = rendered.configmap["data"]
    assert json.loads(data["plan.json"]) == rendered.plan
    assert data["llmfleet_supervisor.py"] == SUPERVISOR.read_text().rstrip("\n")
    # One archive policy and one download bound for both targets: the fetch script's helper is the
    # collection's own module_utils/artifacts.py, and the model download stops at the plan's size.
    assert data["llmfleet_artifacts.py"] == ARTIFACTS.read_text().rstrip("\n")
    assert data["model-size"] == str(MODEL.stat().st_size)
    assert data["model-sha256"] == sha256_of(MODEL)
    assert data["model-url"] == "http://models.example.internal/tiny-llama-8L.gguf"
    assert data["model-file"] == "tiny-llama-8L.gguf"
    pins = whatif_vars()["llama_cpp_releases"][BUILD]
    assert data["llama-cpp-amd64-url"] == pins["ubuntu-x64"]["url"]
    assert data["llama-cpp-amd64-sha256"] == pins["ubuntu-x64"]["sha256"]
    assert data["llama-cpp-arm64-url"] == pins["ubuntu-arm64"]["url"]
    assert data["llama-cpp-arm64-sha256"] == pins["ubuntu-arm64"]["sha256"]


def _config_refs(pod_spec: dict) -> list[tuple[str, str, str]]:
    refs = []
    for c in containers(pod_spec).values():
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                refs.append((c["name"], e["name"], ref["key"]))
    for v in pod_spec.get("volumes", []):
        for item in v.get("configMap", {}).get("items", []):
            refs.append((v["name"], item["path"], item["key"]))
    return refs


def test_each_pod_reads_existing_keys_and_the_pin_of_its_own_architecture(rendered: Rendered) -> None:
    data = rendered.configmap["data"]
    for arch, ds in rendered.daemonsets().items():
        spec = ds["spec"]["template"]["spec"]
        for where, name, key in _config_refs(spec):
            assert key in data, f"DaemonSet {arch}: {where} {name} -> missing key {key}"
        fetch = containers(spec)["llama-cpp"]
        keys = {e["name"]: e["valueFrom"]["configMapKeyRef"]["key"] for e in fetch["env"]}
        assert keys == {
            "LLAMA_CPP_URL": f"llama-cpp-{arch}-url",
            "LLAMA_CPP_SHA256": f"llama-cpp-{arch}-sha256",
        }
    spec = rendered.deployment["spec"]["template"]["spec"]
    for where, name, key in _config_refs(spec):
        assert key in data, f"Deployment: {where} {name} -> missing key {key}"
    head_arch = inventory_facts(WHATIF)[rendered.plan["head"]]["kube_arch"]
    assert spec["nodeSelector"] == {"llmfleet.io/role": "head", "kubernetes.io/arch": head_arch}


# --------------------------------------------------------------------------------------------------
# NetworkPolicy, discovery rights, the supervisor's command line
# --------------------------------------------------------------------------------------------------


def test_only_llama_server_pods_may_reach_the_rpc_port(rendered: Rendered) -> None:
    (policy,) = rendered.kind("NetworkPolicy")
    spec = policy["spec"]
    head_labels = rendered.deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["policyTypes"] == ["Ingress"]
    for ds in rendered.daemonsets().values():
        assert selects(spec["podSelector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"])
    assert not selects(spec["podSelector"]["matchLabels"], head_labels)
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "no namespaceSelector or ipBlock: only pods of this namespace"
    assert selects(peer["podSelector"]["matchLabels"], head_labels)
    for ds in rendered.daemonsets().values():
        assert not selects(peer["podSelector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"])
    ports = {
        p["containerPort"]
        for ds in rendered.daemonsets().values()
        for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert (
        rule["ports"]
        == [{"protocol": "TCP", "port": p} for p in ports]
        == [{"protocol": "TCP", "port": 50052}]
    )


def test_the_supervisor_may_list_pods_and_selects_the_rpc_server_pods(rendered: Rendered) -> None:
    spec = rendered.deployment["spec"]["template"]["spec"]
    account = spec["serviceAccountName"]
    assert spec["automountServiceAccountToken"] is True
    (binding,) = rendered.kind("RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llmfleet"}]
    role = rendered.one("Role", binding["roleRef"]["name"])
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in role["rules"]
    server = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in server["env"]}
    selector = dict(term.split("=", 1) for term in env["LLMFLEET_K8S_SELECTOR"].split(","))
    for ds in rendered.daemonsets().values():
        assert selects(selector, ds["spec"]["template"]["metadata"]["labels"])
    # labels are anyone's to set: only pods whose controller is one of these DaemonSets count
    owners = sorted(ds["metadata"]["name"] for ds in rendered.daemonsets().values())
    assert env["LLMFLEET_K8S_OWNERS"].split(",") == owners
    assert not selects(selector, rendered.deployment["spec"]["template"]["metadata"]["labels"])
    args = server["args"]
    opts = dict(a.split("=", 1) for a in args[: args.index("--")])
    assert opts["--discovery"] == "kubernetes"
    assert float(opts["--interval"]) * int(opts["--stable"]) >= 5, "the set must be stable for 5 s"
    assert server["command"][-1].startswith("/etc/llmfleet/")
    assert server["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    after = args[args.index("--") + 1 :]
    assert after[after.index("--api-key-file") + 1] == "/var/run/llmfleet/api-key/api-key"


# --------------------------------------------------------------------------------------------------
# Secrets, idempotence, refusal
# --------------------------------------------------------------------------------------------------


def test_the_api_key_is_only_in_the_secret(rendered: Rendered) -> None:
    (secret,) = rendered.kind("Secret")
    assert base64.b64decode(secret["data"]["api-key"]).decode() == API_KEY
    encoded = base64.b64encode(API_KEY.encode()).decode()
    for path, obj in rendered.objects.items():
        if obj["kind"] == "Secret":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            continue
        assert API_KEY not in path.read_text() and encoded not in path.read_text(), path
    for stream in (rendered.proc.stdout, rendered.proc.stderr):
        assert API_KEY not in stream and encoded not in stream
    for path in rendered.out.rglob("*"):
        if path.is_file() and path.parent != rendered.dir:
            assert API_KEY not in path.read_text(errors="replace"), path


def test_the_teardown_deletes_every_object_the_render_makes(rendered: Rendered) -> None:
    """kubernetes_teardown.yml's list (llama_rpc_k8s_teardown) names the rendered objects exactly.

    Every rendered object but the Namespace (it stays) is in the teardown, under the same kind and
    name; the DaemonSets are found by the teardown's selector. Fails when a template's name drifts
    from llama_rpc_k8s.NAMES or an object is added without its teardown entry.
    """
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import teardown

    made = {(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in rendered.objects.values()}
    daemonsets = [o["metadata"] for o in rendered.objects.values() if o["kind"] == "DaemonSet"]
    assert daemonsets, "the what-if fleet renders rpc-server DaemonSets"
    for meta in daemonsets:
        labels = meta["labels"]
        assert all(labels.get(k) == v for k, v in (s.split("=", 1) for s in teardown()["selector"])), meta
    gone = teardown([m["name"] for m in daemonsets])
    deleted = {(o["api"], o["kind"], o["name"]) for o in gone["objects"]}
    assert made - deleted == {("v1", "Namespace", "llmfleet")}
    assert deleted <= made
    assert all(p.match(gone["file_pattern"]) for p in rendered.files)
    assert (rendered.out / gone["key_file"]).name == "llama-rpc-api-key"


def test_a_second_render_changes_nothing(rendered: Rendered) -> None:
    before = {p.name: p.read_text() for p in rendered.files}
    proc = run_render(WHATIF, rendered.out, whatif_vars())
    assert proc.returncode == 0, proc.stdout[-3000:]
    blocks = proc.stdout.split("\nTASK [")
    changed = [
        b.splitlines()[0] for b in blocks if b.startswith("llmfleet.cluster.llama_rpc") and "\nchanged:" in b
    ]
    assert changed == []
    assert {p.name: p.read_text() for p in sorted(rendered.dir.glob("llama-rpc-*.yaml"))} == before


def test_a_fleet_that_loses_its_workers_leaves_no_worker_file_behind(
    rendered: Rendered, tmp_path: Path
) -> None:
    """A render of the fleet with workers, then one of the workerless fleet into the same directory.

    The first render is a copy of this module's render of the what-if fleet (the same playbook,
    inventory and vars; its exit status is checked where it is made): one playbook run less.
    """
    out = tmp_path / "out"
    shutil.copytree(rendered.out, out)
    with_workers = Rendered(out, rendered.proc)
    assert with_workers.kind("DaemonSet") and with_workers.kind("NetworkPolicy")
    second = run_render(WORKERLESS, out, whatif_vars())
    assert second.returncode == 0, second.stdout[-3000:]
    after = Rendered(out, second)
    assert after.plan["workers"] == []
    assert not WORKER_ONLY_KINDS & {o["kind"] for o in after.objects.values()}
    assert_valid(after.files, K8S_VERSIONS[-1])


def test_render_adds_the_chat_page_in_front_of_llama_server(tmp_path: Path) -> None:
    """With chat_ui_password, render.yml also writes the page: valid, reading llama_rpc's key Secret."""
    password = "render-chat-password-7"
    out = tmp_path / "out"
    proc = run_render(WHATIF, out, {**whatif_vars(), "chat_ui_password": password})
    assert proc.returncode == 0, proc.stdout[-3000:]
    chat_files = sorted((out / "manifests").glob("chat-*.yaml"))
    objects = {p.name: yaml.safe_load(p.read_text()) for p in chat_files}
    assert {"Deployment", "Service", "Ingress", "ConfigMap", "Secret"} <= {
        o["kind"] for o in objects.values()
    }
    assert_valid(chat_files, K8S_VERSIONS[-1])
    (deployment,) = [o for o in objects.values() if o["kind"] == "Deployment"]
    (app,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in app.get("env", [])}
    llama_ns = Rendered(out, proc).one("Namespace")["metadata"]["name"]
    assert env["LLMFLEET_CHAT_UPSTREAM"]["value"] == f"http://llama-server.{llama_ns}.svc:8080"
    key_ref = json.dumps(deployment)
    assert '"llama-rpc-api-key"' in key_ref, "the page does not read llama_rpc's key Secret"
    for path in chat_files:
        if objects[path.name]["kind"] != "Secret":
            assert password not in path.read_text() and API_KEY not in path.read_text(), path
    assert password not in proc.stdout + proc.stderr


def test_a_generated_api_key_is_kept_private_and_stable(tmp_path: Path) -> None:
    extra = whatif_vars()
    extra.pop("llama_rpc_api_key")
    out = tmp_path / "out"
    first = run_render(WHATIF, out, extra)
    assert first.returncode == 0, first.stdout[-3000:]
    key_file = out / "llama-rpc-api-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().split()[0]
    assert len(key) == 40
    secret = yaml.safe_load((out / "manifests" / "llama-rpc-01-secret.yaml").read_text())
    assert base64.b64decode(secret["data"]["api-key"]).decode() == key
    assert run_render(WHATIF, out, extra).returncode == 0
    assert key_file.read_text().split()[0] == key


def test_a_missing_pin_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    extra = whatif_vars()
    del extra["llama_cpp_releases"][BUILD]["ubuntu-arm64"]
    out = tmp_path / "out"
    proc = run_render(WHATIF, out, extra)
    assert proc.returncode != 0
    assert "ubuntu-arm64 (arm64)" in proc.stdout
    assert not (out / "manifests").exists()


def test_a_fleet_without_a_model_url_is_refused(tmp_path: Path) -> None:
    extra = whatif_vars()
    extra["llama_rpc_k8s_model_url"] = ""
    out = tmp_path / "out"
    proc = run_render(WHATIF, out, extra)
    assert proc.returncode != 0
    assert "no model url" in proc.stdout
    assert not (out / "manifests").exists()


# --------------------------------------------------------------------------------------------------
# The rendered pods on podman hosts, against real rpc-servers, answering a request
# --------------------------------------------------------------------------------------------------


def established_peers(proc_net_tcp: str) -> set[tuple[str, int]]:
    """(remote IPv4 address, local port) of every ESTABLISHED connection in a /proc/net/tcp table."""
    peers = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "01":
            addr = ".".join(str(b) for b in reversed(bytes.fromhex(remote.split(":")[0])))
            peers.add((addr, int(local.split(":")[1], 16)))
    return peers


def wait_tcp(host: str, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"nothing listens on {host}:{port} after {timeout} s")


def _have_podman_image() -> bool:
    if shutil.which("podman") is None:
        return False
    return (
        subprocess.run(["podman", "image", "exists", HOST_IMAGE], capture_output=True, check=False).returncode
        == 0
    )


@pytest.mark.slow
@pytest.mark.skipif(not (MODEL.is_file() and TARBALL.is_file()), reason="needs make test-artifacts")
@pytest.mark.skipif(not _have_podman_image(), reason=f"needs podman and {HOST_IMAGE} (make images)")
def test_rendered_pods_run_on_podman_hosts_and_answer(tmp_path: Path) -> None:
    from tests.support.fake_kube_api import FakeKubeApi
    from tests.support.http_mirror import HttpMirror
    from tests.support.podman_pods import PodmanPod, pod_manifest, podman

    tag = uuid.uuid4().hex[:6]
    network = f"llmfleet-k8s-{tag}"
    third = 100 + int(tag[:2], 16) % 100
    subnet, gateway = f"10.89.{third}.0/24", f"10.89.{third}.1"
    podman("network", "create", "--subnet", subnet, "--gateway", gateway, network)
    # netavark brings the bridge (and the gateway address the mirror binds to) up with a container.
    podman(
        "run",
        "-d",
        "--name",
        f"{network}-infra",
        "--network",
        network,
        "--entrypoint",
        "sleep",
        HOST_IMAGE,
        "infinity",
    )
    pods: list[PodmanPod] = []
    mirror_dir = tmp_path / "mirror"
    mirror_dir.mkdir()
    shutil.copy(TARBALL, mirror_dir / TARBALL.name)
    shutil.copy(MODEL, mirror_dir / MODEL.name)
    t0 = time.monotonic()
    try:
        with (
            HttpMirror(str(mirror_dir), bind=gateway) as mirror,
            FakeKubeApi(gateway, workdir=tmp_path / "pki") as api,
        ):
            extra = {
                **model_vars(mirror.url_for(MODEL.name)),
                "llama_cpp_build": BUILD,
                "llama_cpp_releases": {
                    BUILD: {"ubuntu-x64": {"url": mirror.url_for(TARBALL.name), "sha256": sha256_of(TARBALL)}}
                },
            }
            out = tmp_path / "out"
            proc = run_render(PODMAN_FLEET, out, extra)
            assert proc.returncode == 0, proc.stdout[-6000:]
            r = Rendered(out, proc)
            namespace = r.configmap["metadata"]["namespace"]
            configmaps = {r.configmap["metadata"]["name"]: r.configmap}
            secrets = {s["metadata"]["name"]: s for s in r.kind("Secret")}
            (ds,) = r.daemonsets().values()
            ds_labels = ds["spec"]["template"]["metadata"]["labels"]

            # The DaemonSet's pod on each planned worker node.
            for node in r.plan["workers"]:
                pod = PodmanPod(
                    f"{network}-{node}", node, ds["spec"]["template"], namespace=namespace,
                    configmaps=configmaps, secrets=secrets, network=network, image=HOST_IMAGE,
                    workdir=tmp_path / node, host_paths={"/var/cache/llmfleet-rpc": tmp_path / node / "hostcache"},
                )  # fmt: skip
                pods.append(pod)
                pod.create()
                pod.run_init_containers()
                started = pod.start_containers()
                assert started["rpc-server"][0] == "/opt/llama.cpp/current/llmfleet-rpc-server"
                wait_tcp(pod.ip, 50052)
            workers = list(pods)
            # The API server lists them (Ready) with the DaemonSet's labels, keyed by node.
            api.pods = [pod_manifest(p, ds_labels, owner=ds["metadata"]["name"]) for p in workers]

            # The Deployment's pod on the head: llama.cpp and the model into the claim, then the supervisor.
            dep = r.deployment["spec"]["template"]
            head = PodmanPod(
                f"{network}-head", r.plan["head"], dep, namespace=namespace, configmaps=configmaps,
                secrets=secrets, network=network, image=HOST_IMAGE, workdir=tmp_path / "head",
                service_account_dir=api.service_account(tmp_path / "sa", namespace), api_env=api.env(),
            )  # fmt: skip
            pods.append(head)
            head.create()
            head.run_init_containers()
            assert "verified" in head.logs["model"] and "verified" in head.logs["llama-cpp"]
            started = head.start_containers()
            assert started["llama-server"][:2] == ["python3", "/etc/llmfleet/llmfleet_supervisor.py"]
            text = head.wait_log("llama-server", "start llama-server", timeout=60)
            rpc = ",".join(
                f"{p.ip}:50052" for p in sorted(workers, key=lambda p: r.plan["workers"].index(p.node))
            )
            assert f"--rpc {rpc}" in text, text[-3000:]
            assert any("labelSelector=app.kubernetes.io%2Fname%3Dllama-rpc-server" in q for q in api.requests)

            # A real chat completion through the API port, with the key from the Secret.
            key = base64.b64decode(secrets["llama-rpc-api-key"]["data"]["api-key"]).decode()
            url = f"http://{head.ip}:8080/v1/chat/completions"
            body = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}).encode()
            answer = None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and answer is None:
                request = urllib.request.Request(
                    url,
                    data=body,
                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        answer = json.load(response)
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    time.sleep(1)
            assert answer is not None, head.log("llama-server")[-4000:]
            assert answer["choices"][0]["message"]["content"], answer
            unauthenticated = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(unauthenticated, timeout=30)
            assert refused.value.code == 401
            # Both workers hold llama-server's connection: established TCP from the head's pod IP to port 50052.
            for worker in workers:
                table = podman("exec", worker.name, "cat", "/proc/net/tcp").stdout
                assert (head.ip, 50052) in established_peers(table), (
                    f"{worker.node}: no connection from the head"
                )
            state = json.loads((tmp_path / "head" / "volumes" / "tmp" / "supervisor.json").read_text())
            assert state["status"] == "running" and state["workers"] == sorted(r.plan["workers"])
            print(f"podman pods answered in {time.monotonic() - t0:.1f} s: {answer['choices'][0]['message']}")
    finally:
        for pod in pods:
            pod.remove()
        podman("rm", "-f", "-t", "0", f"{network}-infra", check=False)
        podman("network", "rm", "-f", network, check=False)


DEMO = ROOT / "inventories" / "demo"
DEMO_MODEL = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"  # inventories/demo's llmfleet_model


@pytest.mark.slow
@pytest.mark.skipif(not DEMO_MODEL.is_file(), reason="needs make test-artifacts")
@pytest.mark.skipif(not _have_podman_image(), reason=f"needs podman and {HOST_IMAGE} (make images)")
def test_site_in_check_mode_for_kubernetes_on_the_demo_fleet_shows_what_it_would_apply(
    tmp_path: Path,
) -> None:
    """site.yml --check with llmfleet_target=kubernetes on inventories/demo: no cluster, no error."""
    from tests.support.http_mirror import HttpMirror
    from tests.support.podman_pods import podman

    inv = yaml.safe_load((DEMO / "group_vars" / "all" / "demo.yml").read_text())
    net = inv["demo_network"]
    if podman("network", "exists", net["name"], check=False).returncode == 0:
        pytest.skip(f"the demo network {net['name']} exists: a demo fleet is running")
    hosts = yaml.safe_load((DEMO / "hosts.yml").read_text())["all"]["children"]
    names = {n: hv["demo_podman"] for g in hosts.values() for n, hv in g["hosts"].items()}
    mirror_dir = tmp_path / "mirror"
    mirror_dir.mkdir()
    try:
        os.link(DEMO_MODEL, mirror_dir / DEMO_MODEL.name)
    except OSError:
        shutil.copy(DEMO_MODEL, mirror_dir)
    podman("network", "create", "--subnet", net["subnet"], "--gateway", net["gateway"], net["name"])
    try:
        for name, hw in names.items():
            podman(
                "run", "-d", "--name", name, "--hostname", name, "--network", net["name"],
                f"--memory={hw['memory']}", f"--cpus={hw['cpus']}", HOST_IMAGE,
            )  # fmt: skip
        with HttpMirror(str(mirror_dir), port=int(inv["demo_mirror_port"]), bind=net["gateway"]):
            out = tmp_path / "out"
            cmd = [
                "ansible-playbook", str(ROOT / "playbooks" / "site.yml"), "-i", str(DEMO), "--check",
                "-e", "llmfleet_target=kubernetes", "-e", f"llmfleet_output_dir={out}",
                "-e", "llmfleet_kubeconfig=" + str(tmp_path / "no-such-kubeconfig"),
            ]  # fmt: skip
            proc = subprocess.run(
                cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900, check=False
            )
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert (
            "would apply Namespace" in proc.stdout
            and "DaemonSet llama-rpc-08-daemonset-amd64.yaml" in proc.stdout
        )
        assert not (out / "manifests").exists()
        for name in names:
            state = podman("exec", name, "test", "-e", "/etc/llmfleet/plan.json", check=False)
            assert state.returncode != 0, f"{name}: check mode changed the host"
    finally:
        for name in names:
            podman("rm", "-f", "-t", "2", name, check=False)
        podman("network", "rm", "-f", net["name"], check=False)

"""playbooks/site.yml for ``llmfleet_target: kubernetes``, run for real in render-only mode.

No host is contacted and no cluster is needed: every host of the inventory defines its
``llmfleet_host`` (what the probe reads from the recorded machine trees under tests/fixtures/hosts/:
an x86_64 head and workers of both architectures), so the probe role only checks the given facts,
and ``llmfleet_render_only`` makes llmfleet.cluster.llama_rpc and llmfleet.cluster.chat_ui write
their manifests into the output directory. The hosts' addresses are TEST-NET ones reached over ssh:
a task that tried to reach a host would fail the run as unreachable. The model is a tiny GGUF written
here, which the planner reads for its layout.

The tests read what site.yml wrote:

- every manifest parses and passes ``kubernetes-validate --strict`` (1.33 and 1.37);
- the kinds: the Namespace, one rpc-server DaemonSet per architecture of the planned workers, the
  llama-server and chat page Deployments, their Services, the NetworkPolicy, the ConfigMaps and the
  Secrets; the chat page talks to the llama-server Service with the key from its Secret;
- the plan the manifests carry is the plan.json site.yml wrote, and the supervisor shipped in the
  ConfigMap would start llama-server with the plan's --tensor-split and the rpc-server pods in
  the plan's --rpc order;
- neither the chat password nor the API key appears in the ``-v`` output or outside the Secrets;
- a second run reports ``changed=0`` for every host and rewrites nothing;
- ``--check`` on the same inventory (render-only, and apply mode with no cluster) ends with
  ``failed=0`` and writes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo

from tests.support.ansible_env import ansible_env
from tests.support.gguf_gen import TinyLlama, write_tiny_llama
from tests.support.host_trees import recorded_hosts
from tests.support.k8s_validate import assert_valid

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "playbooks" / "site.yml"
MACHINES = recorded_hosts()  # tests/fixtures/hosts/ with the machines' names
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"
K8S_VERSIONS = ("1.33.0", "1.37.0")
BUILD = "b0c1e570"
PASSWORD = "site-k8s-chat-password-5e2d91"
# inventory name -> (recorded machine tree, TEST-NET-1 address ansible would have to reach)
FLEET = {
    "llm_head": {"zen3-desktop": ("zen3-desktop", "192.0.2.10")},
    "llm_workers": {
        "n100-minipc": ("n100-minipc", "192.0.2.11"),
        "rpi5": ("rpi5", "192.0.2.12"),
        "graviton3": ("graviton3", "192.0.2.13"),
    },
}
PINS = {
    BUILD: {
        "ubuntu-x64": {"url": "http://mirror.example.internal/x64.tar.gz", "sha256": "a" * 64},
        "ubuntu-arm64": {"url": "http://mirror.example.internal/arm64.tar.gz", "sha256": "b" * 64},
    }
}
MODEL_URL = "http://models.example.internal/tiny-site.gguf"


class Run:
    """One ansible-playbook run and its PLAY RECAP, host -> {ok, changed, failed, ...}."""

    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.proc = proc
        self.recap = {
            m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+: (ok=.*)$", proc.stdout, re.MULTILINE)
        }

    def assert_ok(self) -> None:
        assert self.proc.returncode == 0, self.proc.stdout[-6000:] + self.proc.stderr[-3000:]
        assert set(self.recap) == set(FLEET["llm_head"]) | set(FLEET["llm_workers"]), self.recap
        assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in self.recap.values()), self.recap


class Fleet:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.out = base / "out"
        self.facts = {
            name: hostinfo.probe(str(MACHINES / tree))
            for group in FLEET.values()
            for name, (tree, _unused) in group.items()
        }
        model = write_tiny_llama(
            str(base / "tiny-site.gguf"), TinyLlama("tiny-site", n_layer=8, n_embd=128, n_ff=256)
        )
        self.model = Path(model)
        self.model_sha256 = hashlib.sha256(self.model.read_bytes()).hexdigest()
        inventory = {
            "all": {
                "vars": {
                    "ansible_connection": "ssh",
                    "ansible_ssh_timeout": 5,
                    "llmfleet_target": "kubernetes",
                    "llmfleet_render_only": True,
                    "llmfleet_context": 2048,
                    "llmfleet_head_layers": False,
                    "llmfleet_min_workers": 3,
                    "llmfleet_model": {
                        "name": "tiny-site",
                        "file": str(self.model),
                        "sha256": self.model_sha256,
                    },
                    "llama_rpc_k8s_model_url": MODEL_URL,
                    "llama_cpp_build": BUILD,
                    "llama_cpp_releases": PINS,
                    "chat_ui_password": PASSWORD,
                },
                "children": {
                    group: {
                        "hosts": {
                            name: {"ansible_host": address, "llmfleet_host": self.facts[name]}
                            for name, (_unused, address) in hosts.items()
                        }
                    }
                    for group, hosts in FLEET.items()
                },
            }
        }
        self.inventory = base / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))

    def site(self, *args: str, out: Path | None = None) -> Run:
        cmd = [
            "ansible-playbook", str(SITE), "-i", str(self.inventory), "-v",
            "-e", f"llmfleet_output_dir={out or self.out}", *args,
        ]  # fmt: skip
        return Run(
            subprocess.run(
                cmd, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False
            )
        )


class Rendered:
    def __init__(self, fleet: Fleet, first: Run) -> None:
        self.fleet = fleet
        self.first = first
        self.dir = fleet.out / "manifests"
        self.files = sorted(self.dir.glob("*.yaml"))
        self.texts = {p.name: p.read_text() for p in self.files}
        self.objects = {name: list(yaml.safe_load_all(text)) for name, text in self.texts.items()}
        self.plan = json.loads((fleet.out / "plan.json").read_text())
        self.api_key = (fleet.out / "llama-rpc-api-key").read_text().split()[0]

    def all(self) -> list[dict]:
        return [o for objs in self.objects.values() for o in objs]

    def kind(self, kind: str) -> list[dict]:
        return [o for o in self.all() if o["kind"] == kind]

    def one(self, kind: str, name: str) -> dict:
        found = [o for o in self.kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def daemonsets(self) -> dict[str, dict]:
        return {
            d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/arch"]: d
            for d in self.kind("DaemonSet")
        }

    def secret_values(self) -> list[str]:
        values = [PASSWORD, self.api_key]
        return values + [base64.b64encode(v.encode()).decode() for v in values]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    fleet = Fleet(tmp_path_factory.mktemp("site-k8s"))
    first = fleet.site()
    first.assert_ok()
    return Rendered(fleet, first)


def containers(pod_spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec.get("initContainers", []) + pod_spec["containers"]}


# --------------------------------------------------------------------------------------------------
# What was written
# --------------------------------------------------------------------------------------------------


def test_site_renders_the_target_and_the_chat_page(rendered: Rendered) -> None:
    names = [p.name for p in rendered.files]
    assert all(re.fullmatch(r"(llama-rpc-\d\d-[a-z0-9-]+|chat-[a-z]+)\.yaml", n) for n in names), names
    assert all(len(objs) == 1 and isinstance(objs[0], dict) for objs in rendered.objects.values())
    kinds = sorted(o["kind"] for o in rendered.all())
    assert kinds == sorted(
        ["Namespace", "Secret", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy",
         "Service", "DaemonSet", "DaemonSet", "PersistentVolumeClaim", "Deployment", "Service",
         # the chat page
         "ConfigMap", "Secret", "Deployment", "Service", "Ingress"]
    )  # fmt: skip
    assert {d["metadata"]["name"] for d in rendered.kind("Deployment")} == {"llama-server", "llmfleet-chat"}
    (namespace,) = rendered.kind("Namespace")
    assert {o["metadata"].get("namespace") for o in rendered.all() if o["kind"] != "Namespace"} == {
        namespace["metadata"]["name"]
    }
    # Nothing was installed on a host: only the controller wrote.
    for line in rendered.first.proc.stdout.splitlines():
        if line.startswith("changed: ["):
            assert "-> localhost]" in line, line


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_passes_kubernetes_validate_strict(rendered: Rendered, version: str) -> None:
    assert_valid(rendered.files, version)


def test_one_daemonset_per_architecture_of_the_mixed_fleet(rendered: Rendered) -> None:
    facts = rendered.fleet.facts
    planned = {w: facts[w]["kube_arch"] for w in rendered.plan["workers"]}
    assert set(planned.values()) == {"amd64", "arm64"}, "the plan must use workers of both architectures"
    assert set(rendered.daemonsets()) == set(planned.values())
    for arch, ds in rendered.daemonsets().items():
        assert ds["metadata"]["name"] == f"llama-rpc-server-{arch}"
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
            "llmfleet.io/rpc": "true",
            "kubernetes.io/arch": arch,
        }
        fetch = containers(ds["spec"]["template"]["spec"])["llama-cpp"]
        keys = {e["valueFrom"]["configMapKeyRef"]["key"] for e in fetch["env"]}
        assert keys == {f"llama-cpp-{arch}-url", f"llama-cpp-{arch}-sha256"}
    head = rendered.one("Deployment", "llama-server")["spec"]["template"]["spec"]
    assert head["nodeSelector"]["kubernetes.io/arch"] == facts[rendered.plan["head"]]["kube_arch"]


# --------------------------------------------------------------------------------------------------
# The plan in the manifests is the plan site.yml wrote
# --------------------------------------------------------------------------------------------------


def _load_supervisor(source: str, where: Path):
    """The supervisor as the ConfigMap ships it, imported from a file of that text."""
    path = where / "llmfleet_supervisor_from_configmap.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_manifests_carry_the_plan_site_wrote(rendered: Rendered, tmp_path: Path) -> None:
    configmap = rendered.one("ConfigMap", "llama-rpc")
    data = configmap["data"]
    assert json.loads(data["plan.json"]) == rendered.plan
    assert rendered.plan["target"] == "kubernetes"
    assert rendered.plan["model"]["sha256"] == data["model-sha256"] == rendered.fleet.model_sha256
    assert data["model-url"] == MODEL_URL and data["model-file"] == rendered.fleet.model.name
    assert data["llmfleet_supervisor.py"] == SUPERVISOR.read_text().rstrip("\n")
    for arch, flavour in (("amd64", "ubuntu-x64"), ("arm64", "ubuntu-arm64")):
        assert data[f"llama-cpp-{arch}-url"] == PINS[BUILD][flavour]["url"]
        assert data[f"llama-cpp-{arch}-sha256"] == PINS[BUILD][flavour]["sha256"]

    # The llama-server container reads that plan: --plan names the file the ConfigMap is mounted as.
    pod = rendered.one("Deployment", "llama-server")["spec"]["template"]["spec"]
    server = pod["containers"][0]
    args = server["args"]
    opts = dict(a.split("=", 1) for a in args[: args.index("--")])
    plan_path = Path(opts["--plan"])
    mount = next(m for m in server["volumeMounts"] if m["mountPath"] == str(plan_path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert {"key": "plan.json", "path": plan_path.name} in volume["configMap"]["items"]
    after = args[args.index("--") + 1 :]
    assert after[after.index("-m") + 1] == "/data/models/$(MODEL_FILE)"
    env = {e["name"]: e for e in server["env"]}
    assert env["MODEL_FILE"]["valueFrom"]["configMapKeyRef"] == {"name": "llama-rpc", "key": "model-file"}

    # What the supervisor from the ConfigMap starts once the DaemonSets' pods are Ready on the planned
    # nodes: the plan's arguments, --tensor-split as planned, the pods' IPs in the plan's --rpc order.
    supervisor = _load_supervisor(data["llmfleet_supervisor.py"], tmp_path)
    plan = json.loads(data["plan.json"])
    port = {p["name"]: p["containerPort"] for p in rendered.daemonsets()["amd64"]["spec"]["template"]["spec"]["containers"][0]["ports"]}["rpc"]  # fmt: skip
    pod_ips = {w: f"10.42.{i}.7" for i, w in enumerate(plan["workers"], start=1)}
    pods = {
        "items": [
            {
                "metadata": {"name": f"llama-rpc-server-{node}", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {
                    "nodeName": node,
                    "containers": [{"ports": [{"name": "rpc", "containerPort": port}]}],
                },
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
            }
            for node, ip in pod_ips.items()
        ]
    }
    planned = supervisor.plan_endpoints(plan)
    found = supervisor.pod_endpoints(pods, planned)
    entry = supervisor.plan_entries(plan)[frozenset(plan["workers"])]
    started = supervisor.rewrite_rpc(entry.args, planned, found)
    expected = list(rendered.plan["llama_server_args"])
    assert expected[expected.index("--rpc") + 1] == rendered.plan["rpc"]
    assert expected[expected.index("--tensor-split") + 1] == rendered.plan["tensor_split"]
    expected[expected.index("--rpc") + 1] = ",".join(f"{pod_ips[w]}:{port}" for w in rendered.plan["workers"])
    assert started == expected


# --------------------------------------------------------------------------------------------------
# The chat page in front of llama-server
# --------------------------------------------------------------------------------------------------


def test_the_chat_page_talks_to_the_llama_server_service_with_its_key(rendered: Rendered) -> None:
    chat = rendered.one("Deployment", "llmfleet-chat")
    spec = chat["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    service = rendered.one("Service", "llama-server")
    namespace = service["metadata"]["namespace"]
    (port,) = (p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert env["LLMFLEET_CHAT_UPSTREAM"] == f"http://{service['metadata']['name']}.{namespace}.svc:{port}"
    assert chat["metadata"]["namespace"] == namespace
    head_labels = rendered.one("Deployment", "llama-server")["spec"]["template"]["metadata"]["labels"]
    assert all(head_labels.get(k) == v for k, v in service["spec"]["selector"].items())

    # The key: llama_rpc's Secret, mounted where the app reads it; the page's own Secret holds only the password.
    key_dir = str(Path(env["LLMFLEET_CHAT_API_KEY_FILE"]).parent)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == key_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    api_secret = rendered.one("Secret", volume["secret"]["secretName"])
    assert api_secret["metadata"]["name"] == "llama-rpc-api-key"
    (item,) = volume["secret"]["items"]
    assert base64.b64decode(api_secret["data"][item["key"]]).decode() == rendered.api_key
    assert item["path"] == Path(env["LLMFLEET_CHAT_API_KEY_FILE"]).name
    auth = rendered.one("Secret", "llmfleet-chat-auth")
    assert set(auth["data"]) == {"password"}
    assert base64.b64decode(auth["data"]["password"]).decode() == PASSWORD
    # No NetworkPolicy selects llama-server's pods: the page may reach its API port.
    for policy in rendered.kind("NetworkPolicy"):
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert not all(head_labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------------------------------
# Secrets, idempotence, check mode
# --------------------------------------------------------------------------------------------------


def test_no_secret_outside_the_secrets_or_in_the_output(rendered: Rendered) -> None:
    secrets = rendered.secret_values()
    for path in rendered.files:
        (obj,) = rendered.objects[path.name]
        if obj["kind"] == "Secret":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            continue
        leaked = [s for s in secrets if s in rendered.texts[path.name]]
        assert not leaked, f"{path.name} holds a secret"
    for path in rendered.fleet.out.rglob("*"):
        if path.is_file() and path.parent != rendered.dir and path.name != "llama-rpc-api-key":
            assert not [s for s in secrets if s in path.read_text(errors="replace")], path
    key_file = rendered.fleet.out / "llama-rpc-api-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for stream in (rendered.first.proc.stdout, rendered.first.proc.stderr):
        assert not [s for s in secrets if s in stream], "a secret in the -v output of site.yml"


def test_a_second_run_changes_nothing(rendered: Rendered) -> None:
    second = rendered.fleet.site()
    second.assert_ok()
    assert {host: r["changed"] for host, r in second.recap.items()} == dict.fromkeys(second.recap, 0)
    assert {p.name: p.read_text() for p in sorted(rendered.dir.glob("*.yaml"))} == rendered.texts
    assert json.loads((rendered.fleet.out / "plan.json").read_text()) == rendered.plan
    for stream in (second.proc.stdout, second.proc.stderr):
        assert not [s for s in rendered.secret_values() if s in stream]


def test_check_mode_on_the_same_inventory_fails_nothing(rendered: Rendered, tmp_path: Path) -> None:
    # Render-only, on the rendered output directory: nothing to change, nothing written.
    mtimes = {p: p.stat().st_mtime_ns for p in rendered.fleet.out.rglob("*")}
    check = rendered.fleet.site("--check")
    check.assert_ok()
    assert all(r["changed"] == 0 for r in check.recap.values()), check.recap
    assert {p: p.stat().st_mtime_ns for p in rendered.fleet.out.rglob("*")} == mtimes
    # Apply mode with no cluster (a fleet not joined yet): both roles say what they would apply.
    out = tmp_path / "out"
    apply = rendered.fleet.site(
        "--check", "-e", "llmfleet_render_only=false", "-e", f"llmfleet_kubeconfig={tmp_path / 'no-kubeconfig'}",
        out=out,
    )  # fmt: skip
    apply.assert_ok()
    stdout = apply.proc.stdout
    assert "DaemonSet llama-rpc-08-daemonset-arm64.yaml" in stdout and "would apply" in stdout
    # One message for both (llmfleet.cluster.k8s_objects), the objects in apply order.
    assert (
        "would apply Namespace llmfleet and Secret chat-secret.yaml, ConfigMap chat-configmap.yaml" in stdout
    )
    assert not (out / "manifests").exists() and not (out / "plan.json").exists()
    for stream in (check.proc.stdout, apply.proc.stdout, apply.proc.stderr):
        assert PASSWORD not in stream and base64.b64encode(PASSWORD.encode()).decode() not in stream

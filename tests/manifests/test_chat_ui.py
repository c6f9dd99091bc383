"""The chat page's Kubernetes manifests (roles/chat_ui/templates/kubernetes/), rendered by the role.

The role runs for real (ansible-playbook, render-only) and every object must pass
kubernetes-validate --strict; the ConfigMap must carry the app byte for byte, the secrets
must appear only in the Secret (0600), and the Deployment's settings must mean to the app
what they say (the app's own parser reads them).
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.ansible_env import ansible_env
from tests.support.chat_app import APP_PATH, load_chat_app

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSIONS = ("1.33.0", "1.37.0")
PASSWORD = "manifest-test-password"
API_KEY = "sk-chat-manifest-key-93c1"


_env = ansible_env


def render(tmp: Path, **role_vars: Any) -> dict[str, dict]:
    """Run the role (kubernetes target, render only); returns {file name: object}."""
    out = tmp / "out"
    settings = {
        "chat_ui_target": "lws",
        "chat_ui_k8s_render_only": True,
        "chat_ui_k8s_output_dir": str(out),
        "chat_ui_password": PASSWORD,
        **role_vars,
    }
    (tmp / "vars.yml").write_text(yaml.safe_dump(settings))
    (tmp / "play.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Render the chat page",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [{"ansible.builtin.include_role": {"name": "llmfleet.cluster.chat_ui"}}],
                }
            ]
        )
    )
    proc = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"@{tmp / 'vars.yml'}",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(tmp / "play.yml"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert PASSWORD not in proc.stdout and API_KEY not in proc.stdout, "a secret in the playbook output"
    files = sorted((out / "manifests").glob("chat-*.yaml"))
    return {p.name: yaml.safe_load(p.read_text()) | {"__path__": str(p)} for p in files}


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return render(
        tmp_path_factory.mktemp("chat-full"),
        chat_ui_api_key=API_KEY,
        chat_ui_path_prefix="/chat/",
        chat_ui_k8s_ingress_host="llm.example.test",
        chat_ui_k8s_ingress_class="nginx",
        chat_ui_k8s_ingress_tls_secret="llm-tls",
        chat_ui_k8s_ingress_annotations={"example.test/owner": "llmfleet"},
        chat_ui_title='Team "LLM" chat',
    )


@pytest.fixture(scope="module")
def external_key(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return render(
        tmp_path_factory.mktemp("chat-ext"),
        chat_ui_k8s_api_key_secret={"name": "vllm-api-key", "key": "key"},
        chat_ui_k8s_namespace="vllm",
        chat_ui_k8s_ingress=False,
    )


def _objects(rendered: dict[str, dict]) -> dict[str, dict]:
    return {name: {k: v for k, v in obj.items() if k != "__path__"} for name, obj in rendered.items()}


def _kind(rendered: dict[str, dict], kind: str) -> dict:
    found = [o for o in _objects(rendered).values() if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", ["full", "external_key"])
def test_objects_pass_kubernetes_validate_strict(
    request: pytest.FixtureRequest, variant: str, version: str
) -> None:
    rendered = request.getfixturevalue(variant)
    kinds = sorted(o["kind"] for o in _objects(rendered).values())
    expected = ["ConfigMap", "Deployment", "Secret", "Service"] + (["Ingress"] if variant == "full" else [])
    assert kinds == sorted(expected)
    for name, obj in _objects(rendered).items():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {exc}")


def test_validation_catches_a_misspelt_field(full: dict[str, dict]) -> None:
    broken = _kind(full, "Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.37.0", strict=True)


def test_configmap_carries_the_app_byte_for_byte(full: dict[str, dict]) -> None:
    data = _kind(full, "ConfigMap")["data"]
    assert data["llmfleet_chat.py"].rstrip("\n") == APP_PATH.read_text().rstrip("\n")


def test_secrets_only_in_the_secret_file(full: dict[str, dict]) -> None:
    secret = _kind(full, "Secret")
    assert base64.b64decode(secret["data"]["password"]).decode() == PASSWORD
    assert base64.b64decode(secret["data"]["api-key"]).decode() == API_KEY
    for name, obj in full.items():
        text = Path(obj["__path__"]).read_text()
        mode = stat.S_IMODE(os.stat(obj["__path__"]).st_mode)
        if obj["kind"] == "Secret":
            assert mode == 0o600, f"{name}: mode {mode:o}"
        else:
            assert PASSWORD not in text and API_KEY not in text, name
            for secret_value in (PASSWORD, API_KEY):
                assert base64.b64encode(secret_value.encode()).decode() not in text, name


def test_ingress_routes_the_prefix_to_the_service(full: dict[str, dict]) -> None:
    ingress, service = _kind(full, "Ingress"), _kind(full, "Service")
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "llm.example.test"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.test"]}]
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/chat", "Prefix")
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert annotations["example.test/owner"] == "llmfleet"
    # TLS by default (issue #31 item 8): plain HTTP redirected.
    assert annotations["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"
    assert annotations["nginx.ingress.kubernetes.io/limit-connections"] == "16"
    deployment = _kind(full, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def _container(rendered: dict[str, dict]) -> dict:
    return _kind(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def _app_config(rendered: dict[str, dict], tmp_path: Path) -> Any:
    """What the app makes of the Deployment's environment, with the mounted files in tmp_path."""
    pod = _kind(rendered, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {"password": PASSWORD, "api-key": API_KEY, "key": API_KEY}
    env = {e["name"]: e["value"] for e in container["env"]}
    for volume in pod["volumes"]:
        if "secret" not in volume:
            continue
        for item in volume["secret"]["items"]:
            real = tmp_path / volume["name"] / item["path"]
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_text(secrets[item["key"]] + "\n")
            mounted = mounts[volume["name"]] + "/" + item["path"]
            for name, value in env.items():
                if value == mounted:
                    env[name] = str(real)
    return load_chat_app().parse_args([], environ=env)


def test_the_app_reads_the_deployment_settings(full: dict[str, dict], tmp_path: Path) -> None:
    container = _container(full)
    assert container["command"] == ["python3", "/app/llmfleet_chat.py"]
    assert {"name": "source", "mountPath": "/app", "readOnly": True} in container["volumeMounts"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    config = _app_config(full, tmp_path)
    assert (config.password, config.api_key) == (PASSWORD, API_KEY)
    assert config.prefix == "/chat"
    assert config.upstream == "http://vllm-leader.vllm.svc:8000"
    assert config.port == container["ports"][0]["containerPort"]
    assert config.listen == "0.0.0.0"
    assert config.title == 'Team "LLM" chat'
    # Behind the Ingress controller (issue #31): the controller caps connections per client, the
    # page counts wrong passwords against the client the controller names.
    assert config.max_per_client == 4096
    load_chat_app().parse_networks(config.trusted_proxies)
    assert "10.0.0.0/8" in config.trusted_proxies.split(",")


def test_an_existing_api_key_secret_is_mounted(external_key: dict[str, dict], tmp_path: Path) -> None:
    secret = _kind(external_key, "Secret")
    assert set(secret["data"]) == {"password"}
    pod = _kind(external_key, "Deployment")["spec"]["template"]["spec"]
    key_volume = next(v for v in pod["volumes"] if v["name"] == "api-key")
    assert key_volume["secret"]["secretName"] == "vllm-api-key"
    assert key_volume["secret"]["items"] == [{"key": "key", "path": "api-key"}]
    assert all(o["metadata"]["namespace"] == "vllm" for o in _objects(external_key).values())
    assert _app_config(external_key, tmp_path).api_key == API_KEY


def test_pod_runs_unprivileged(full: dict[str, dict]) -> None:
    pod = _kind(full, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    sc = _container(full)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]

"""Run a rendered Kubernetes pod template on a podman host, as a kubelet would (test-only).

Not Kubernetes: one podman container of the project's host image stands for one pod on one node.
What it does take from the manifest, unchanged, is what the pod runs: every init container's
command, args and env in order (each must exit 0), then every container's, with the volumes at
their mount paths (configMap / secret items written as files, emptyDir, hostPath,
persistentVolumeClaim as directories), ``runAsUser``/``runAsGroup`` (``fsGroup`` as the owner
group of writable volumes and secret files), env from ``value``, ``configMapKeyRef``,
``secretKeyRef`` and the downward API's ``status.podIP`` / ``spec.nodeName`` / ``metadata.*``,
``$(VAR)`` expansion in command and args, and the service account mount and
``KUBERNETES_SERVICE_HOST``/``_PORT`` when the pod automounts its token. Capabilities, seccomp,
probes, resources and the NetworkPolicy are NOT emulated.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known variables are replaced, $$ is a literal $."""

    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(sub, text)


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {shlex.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


class PodmanPod:
    def __init__(
        self,
        name: str,
        node: str,
        pod_template: dict,
        *,
        namespace: str,
        configmaps: dict[str, dict],
        secrets: dict[str, dict],
        network: str,
        image: str,
        workdir: Path,
        host_paths: Optional[dict[str, Path]] = None,
        service_account_dir: Optional[Path] = None,
        api_env: Optional[dict[str, str]] = None,
        memory: str = "512m",
    ) -> None:
        self.name = name
        self.node = node
        self.template = pod_template
        self.spec = pod_template["spec"]
        self.namespace = namespace
        self.configmaps = configmaps
        self.secrets = secrets
        self.network = network
        self.image = image
        self.workdir = workdir
        self.host_paths = host_paths or {}
        self.sa_dir = service_account_dir
        self.api_env = api_env or {}
        self.memory = memory
        self.ip = ""
        self.logs: dict[str, str] = {}

    # ------------------------------------------------------------------------------ volumes
    def _volume_dirs(self) -> dict[str, tuple[Path, bool]]:
        """Volume name -> (host directory, is a read-only projection)."""
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        dirs: dict[str, tuple[Path, bool]] = {}
        for vol in self.spec.get("volumes") or []:
            path = self.workdir / "volumes" / vol["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol or "secret" in vol:
                source = vol.get("configMap") or vol["secret"]
                if "configMap" in vol:
                    data = self.configmaps[source["name"]].get("data") or {}
                else:
                    raw = self.secrets[source["secretName"]].get("data") or {}
                    data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                mode = source.get("defaultMode", 0o644)
                for item in items:
                    target = path / item["path"]
                    target.write_text(data[item["key"]])
                    os.chmod(target, item.get("mode", mode))
                    if fs_group is not None:
                        os.chown(target, 0, fs_group)
                dirs[vol["name"]] = (path, True)
            elif "emptyDir" in vol:
                os.chmod(path, 0o777)
                dirs[vol["name"]] = (path, False)
            elif "hostPath" in vol:
                host = self.host_paths.get(vol["hostPath"]["path"], path)
                host.mkdir(parents=True, exist_ok=True)
                os.chmod(host, 0o755)  # kubelet's DirectoryOrCreate: root 0755
                dirs[vol["name"]] = (host, False)
            elif "persistentVolumeClaim" in vol:
                if fs_group is not None:
                    os.chown(path, 0, fs_group)
                    os.chmod(path, 0o2775)
                dirs[vol["name"]] = (path, False)
            else:
                raise ValueError(f"{self.name}: volume {vol} is not emulated")
        return dirs

    def _mounts(self) -> list[str]:
        dirs = self._volume_dirs()
        seen: dict[str, str] = {}
        args: list[str] = []
        for c in (self.spec.get("initContainers") or []) + self.spec["containers"]:
            for m in c.get("volumeMounts") or []:
                if m["mountPath"] in seen:
                    if seen[m["mountPath"]] != m["name"]:
                        raise ValueError(f"{self.name}: two volumes at {m['mountPath']}")
                    continue
                seen[m["mountPath"]] = m["name"]
                host, projected = dirs[m["name"]]
                ro = ":ro" if m.get("readOnly") or projected else ""
                args += ["-v", f"{host}:{m['mountPath']}{ro}"]
        if self.automount and self.sa_dir is not None:
            args += ["-v", f"{self.sa_dir}:{SA_PATH}:ro"]
        return args

    @property
    def automount(self) -> bool:
        return bool(self.spec.get("automountServiceAccountToken", True))

    # ------------------------------------------------------------------------------ env
    def env_of(self, container: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.automount:
            env.update(self.api_env)
        fields = {
            "status.podIP": self.ip,
            "spec.nodeName": self.node,
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
        }
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
                continue
            ref = item["valueFrom"]
            if "configMapKeyRef" in ref:
                r = ref["configMapKeyRef"]
                env[item["name"]] = self.configmaps[r["name"]]["data"][r["key"]]
            elif "secretKeyRef" in ref:
                r = ref["secretKeyRef"]
                env[item["name"]] = base64.b64decode(self.secrets[r["name"]]["data"][r["key"]]).decode()
            elif "fieldRef" in ref:
                env[item["name"]] = fields[ref["fieldRef"]["fieldPath"]]
            else:
                raise ValueError(f"{self.name}: env {item} is not emulated")
        return env

    def user_of(self, container: dict) -> str:
        pod_ctx = self.spec.get("securityContext") or {}
        ctx = {**pod_ctx, **(container.get("securityContext") or {})}
        uid = ctx.get("runAsUser", 0)
        gid = ctx.get("runAsGroup", pod_ctx.get("fsGroup", uid))
        return f"{uid}:{gid}"

    def argv_of(self, container: dict, env: dict[str, str]) -> list[str]:
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if not container.get("command"):
            raise ValueError(
                f"{self.name}/{container['name']}: no command (the image's entrypoint is not emulated)"
            )
        return [expand(str(a), env) for a in argv]

    # ------------------------------------------------------------------------------ lifecycle
    def create(self) -> None:
        podman(
            "run", "-d", "--name", self.name, "--hostname", self.node, "--network", self.network,
            f"--memory={self.memory}", *self._mounts(), "--entrypoint", "sleep", self.image, "infinity",
        )  # fmt: skip
        info = json.loads(podman("inspect", self.name).stdout)[0]
        self.ip = info["NetworkSettings"]["Networks"][self.network]["IPAddress"]
        podman("exec", self.name, "mkdir", "-p", "/var/log/pod")
        podman("exec", self.name, "chmod", "1777", "/var/log/pod")

    def _exec_args(self, container: dict) -> tuple[list[str], list[str]]:
        env = self.env_of(container)
        opts = ["--user", self.user_of(container)]
        for key, value in env.items():
            opts += ["-e", f"{key}={value}"]
        return opts, self.argv_of(container, env)

    def run_init_containers(self, timeout: float = 300) -> None:
        for c in self.spec.get("initContainers") or []:
            opts, argv = self._exec_args(c)
            proc = podman("exec", *opts, self.name, *argv, check=False, timeout=timeout)
            self.logs[c["name"]] = proc.stdout + proc.stderr
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{self.name}: init container {c['name']} exited {proc.returncode}: {shlex.join(argv)}\n"
                    f"{proc.stdout}{proc.stderr}"
                )

    def start_containers(self) -> dict[str, list[str]]:
        """Start every container (detached, output in /var/log/pod/<name>.log); returns their argv."""
        started = {}
        for c in self.spec["containers"]:
            opts, argv = self._exec_args(c)
            log = f"/var/log/pod/{c['name']}.log"
            wrapped = ["sh", "-c", f'exec "$@" > {log} 2>&1', "sh", *argv]
            podman("exec", "-d", *opts, self.name, *wrapped)
            started[c["name"]] = argv
        return started

    def log(self, container: str) -> str:
        proc = podman("exec", self.name, "cat", f"/var/log/pod/{container}.log", check=False)
        return proc.stdout

    def wait_log(self, container: str, needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log(container)
            if needle in text:
                return text
            time.sleep(0.5)
        raise AssertionError(
            f"{self.name}/{container}: {needle!r} never logged:\n{self.log(container)[-4000:]}"
        )

    def remove(self) -> None:
        podman("rm", "-f", "-t", "2", self.name, check=False)


def pod_manifest(
    pod: PodmanPod, template_labels: dict[str, str], ready: bool = True, owner: Optional[str] = None
) -> dict[str, Any]:
    """The Pod the fake API server lists for ``pod`` (its IP, node, ports and labels; ``owner``: the
    DaemonSet named as its controller, as the DaemonSet controller sets it)."""
    meta: dict[str, Any] = {
        "name": pod.name,
        "namespace": pod.namespace,
        "labels": dict(template_labels),
        "creationTimestamp": "2026-11-30T06:00:00Z",
    }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": owner,
                "uid": f"uid-{owner}",
                "controller": True,
            }
        ]
    return {
        "metadata": meta,
        "spec": {"nodeName": pod.node, "containers": pod.spec["containers"]},
        "status": {
            "podIP": pod.ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM across nodes with LeaderWorkerSet: every decision the ``lws`` target makes, as pure functions.

The stage partition itself (pipeline size, VLLM_PP_LAYER_PARTITION, KV cache space, which host holds
which stage) comes from the plan (``llmfleet_plan.vllm``), read through the typed plan (plan.parse,
``Plan.vllm``); nothing here recomputes it. What this module
decides is what the plan does not say:

- whether every host of the group can run vLLM's CPU backend (the probe's ``backends.vllm_cpu``
  verdict: ``unsupported`` refuses, ``limited`` warns);
- the image tag and the dtype, from the hosts' architecture and ISA (one architecture per group,
  because LeaderWorkerSet has a single pod template for all workers);
- the resources per pod (requests equal to limits) and whether they fit each node;
- how each pod learns its node rank;
- the Kubernetes objects: LeaderWorkerSet, leader-only Service, NetworkPolicy, Ingress (the API's
  paths only, TLS), PodMonitor, Namespace, and the Secrets when their values are given.

Runs on the controller only, but keeps to Python 3.9 syntax like the rest of module_utils.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.llmfleet.cluster.plugins.module_utils.hostinfo import KUBE_ARCH, vllm_cpu_verdict
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan, PlanError, VllmPlan
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import parse as parse_plan

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
PODMONITOR_API_VERSION = "monitoring.coreos.com/v1"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
PODMONITOR_CRD_NAME = "podmonitors.monitoring.coreos.com"

VERDICTS = ("supported", "limited", "unsupported")

# What the Ingress routes to the leader: vLLM's API key guards /v1 only, so nothing else of the
# leader's port (/invocations, /tokenize, /pause, /metrics, ...) is published; /health answers
# a load balancer. (path, pathType).
API_INGRESS_PATHS = (("/v1", "Prefix"), ("/health", "Exact"))
# The containers' securityContext: no capability but SYS_NICE (vLLM's NUMA and thread-affinity
# calls), no privilege escalation. vLLM's image runs as root and writes its caches under $HOME,
# so neither runAsNonRoot nor a read-only root filesystem is set.
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
}
POD_SECURITY_CONTEXT = {"seccompProfile": {"type": "RuntimeDefault"}}

# Flags that must never appear, with the reason (checked on every rendered container).
FORBIDDEN_FLAGS = {
    "--enforce-eager": (
        "on the CPU backend --enforce-eager skips the warm-up pass, the only place pipeline rank 1 "
        "allocates its intermediate tensors; use -cc.mode=2 -cc.backend=eager"
    ),
}

# The worker's node rank comes from the node it was scheduled on (see docs/vllm-lws.md). No `$(`
# in here: the kubelet would treat `$(NAME)` as a variable reference.
_RANK_SCRIPT_HEAD = 'case "$LLMFLEET_NODE_NAME" in\n'
_RANK_SCRIPT_TAIL = (
    "  *) echo \"llmfleet: node '$LLMFLEET_NODE_NAME' holds no planned vLLM stage ({known})\" >&2; exit 64 ;;\n"
    "esac\n"
    'exec vllm serve "$@" --node-rank="$rank"\n'
)


class VllmLwsError(ValueError):
    """The fleet or the plan cannot be deployed as a LeaderWorkerSet; the message names host and value."""


@dataclass
class Stage:
    """One pipeline stage: the host that runs it, its rank and layer count."""

    rank: int
    host: str
    node_name: str
    layers: int
    arch: str
    cpus: int
    usable_mib: int
    weights_mib: float
    need_mib: int = 0


@dataclass
class GroupChoice:
    """What the pre-flight decided for the whole LeaderWorkerSet group."""

    stages: List[Stage]
    image_arch: str
    kube_arch: str
    image: str
    dtype: str
    dtype_reason: str
    cpu: int
    memory_mib: int
    kvcache_space_gib: int
    pp_layer_partition: str
    rank_mode: str
    warnings: List[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------
# Host facts
# ----------------------------------------------------------------------------------------------------


def vllm_verdict(host: str, facts: Dict[str, Any]) -> Tuple[str, str]:
    """The probe's ``backends.vllm_cpu`` verdict of one host, as (verdict, reason)."""
    backend = ((facts or {}).get("backends") or {}).get("vllm_cpu")
    if backend is None:
        raise VllmLwsError(
            f"{host}: llmfleet_host has no backends.vllm_cpu (run the probe, or add it to the what-if facts)"
        )
    if isinstance(backend, str):
        verdict, reason = backend, ""
    else:
        verdict = backend.get("verdict", backend.get("status", backend.get("support")))
        reason = str(backend.get("reason") or "")
    if verdict not in VERDICTS:
        raise VllmLwsError(
            f"{host}: llmfleet_host.backends.vllm_cpu verdict is {verdict!r}, expected one of {list(VERDICTS)}"
        )
    return verdict, reason


def image_arch_of(host: str, facts: Dict[str, Any]) -> str:
    """The image tag suffix (``arm64`` / ``x86_64``): the probe's ``backends.vllm_cpu.image_arch``,
    or the probe's own rule applied to ``arch`` and ``isa`` when a what-if fact leaves it out."""
    backend = ((facts or {}).get("backends") or {}).get("vllm_cpu")
    arch = backend.get("image_arch") if isinstance(backend, dict) else None
    if not arch:
        arch = vllm_cpu_verdict(str(facts.get("arch") or ""), facts.get("isa") or [])["image_arch"]
    if arch not in ("arm64", "x86_64"):
        raise VllmLwsError(
            f"{host}: no vLLM CPU image for llmfleet_host.arch {facts.get('arch')!r} (x86_64 and arm64 only)"
        )
    return str(arch)


def choose_dtype(verdicts: Dict[str, str]) -> Tuple[str, str]:
    """bfloat16 when every host is ``supported`` (the probe's rule: x86_64 with avx512f, arm64 with
    bf16), else float32: never float16, which is unstable in torch on CPU."""
    short = sorted(h for h, v in verdicts.items() if v != "supported")
    if not short:
        return "bfloat16", "every stage host computes bfloat16 natively (probe verdict supported)"
    return "float32", "float32: " + ", ".join(short) + " lack native bfloat16 (float16 is unstable on CPU)"


def _int(host: str, value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise VllmLwsError(f"{host}: {what} is {value!r}, expected a number") from None


# ----------------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------------


def read_plan(plan: Any) -> Tuple[Plan, VllmPlan]:
    """``llmfleet_plan`` through the typed plan (plan.parse) and its ``vllm`` section; a plan
    that cannot be read, has no vLLM stages or disagrees with itself is refused naming the field."""
    try:
        parsed = parse_plan(plan)
        return parsed, parsed.vllm
    except PlanError as exc:
        raise VllmLwsError(str(exc)) from None


# ----------------------------------------------------------------------------------------------------
# Pre-flight: everything decided, or refused, before anything is rendered
# ----------------------------------------------------------------------------------------------------


def preflight(
    plan: Dict[str, Any],
    facts: Dict[str, Dict[str, Any]],
    node_names: Optional[Dict[str, str]] = None,
    image_repository: str = "vllm/vllm-openai-cpu",
    image_version: str = "v0.31.0",
    image: str = "",
    dtype: str = "auto",
    cpu: int = 0,
    cpu_reserve: int = 2,
    memory_gib: int = 0,
    overhead_mib: int = 8192,
    allow_mixed_arch: bool = False,
    kvcache_space_gib: int = 0,
) -> GroupChoice:
    """Check the fleet against the plan and decide image, dtype, resources and rank mode.

    ``facts`` maps host name -> its ``llmfleet_host`` for every host of the fleet (at least the
    stage hosts; all of them are checked for support). Raises :class:`VllmLwsError` (naming the hosts)
    when any stage's host is ``unsupported``, when the architectures differ, or when a pod would not fit.
    """
    parsed, stages_plan = read_plan(plan)
    stage_hosts, counts, kv = (
        list(stages_plan.stages),
        list(stages_plan.layer_counts),
        stages_plan.kvcache_space_gib,
    )
    if kvcache_space_gib:
        if int(kvcache_space_gib) < kv:
            raise VllmLwsError(
                f"vllm_lws_kvcache_space_gib {kvcache_space_gib} is below the plan's {kv} GiB"
                " (the KV cache one full context needs on the largest stage)"
            )
        kv = int(kvcache_space_gib)
    node_names = node_names or {}
    weights = stages_plan.stage_weights_mib

    refused, warnings = [], []
    verdicts: Dict[str, str] = {}
    for host in stage_hosts:
        if host not in facts:
            raise VllmLwsError(f"{host}: the plan puts a vLLM stage here but it has no llmfleet_host facts")
    # Every host of the fleet given (stage or not) is checked: a fleet that names an unsupported
    # host for the lws target is refused, whatever the plan made of it.
    for host in list(stage_hosts) + sorted(h for h in facts if h not in stage_hosts):
        verdict, reason = vllm_verdict(host, facts[host])
        verdicts[host] = verdict
        if verdict == "unsupported":
            refused.append(f"{host} ({reason or 'no reason given'})")
        elif verdict == "limited":
            warnings.append(f"{host}: vLLM CPU support is limited: {reason or 'no reason given'}")
    if refused:
        raise VllmLwsError(
            "vLLM's CPU backend is unsupported on " + ", ".join(refused) + ": nothing was rendered or applied"
        )

    arches = {host: image_arch_of(host, facts[host]) for host in stage_hosts}
    if len(set(arches.values())) > 1 and not (allow_mixed_arch and image):
        raise VllmLwsError(
            "one LeaderWorkerSet group runs one image: the stage hosts mix architectures "
            + ", ".join(f"{h}={a}" for h, a in arches.items())
            + " (keep one architecture per fleet, or give a multi-arch vllm_lws_image and vllm_lws_allow_mixed_arch)"
        )
    image_arch = arches[stage_hosts[0]]
    # A multi-arch image may land on any of the stage architectures: no arch node selector then.
    kube_arch = KUBE_ARCH[image_arch] if len(set(arches.values())) == 1 else ""

    stages: List[Stage] = []
    for rank, (host, layers) in enumerate(zip(stage_hosts, counts)):
        hf = facts[host]
        memory = hf.get("memory") or {}
        usable = memory.get("usable_mib")
        if usable is None:
            row = parsed.host(host)
            usable = row.usable_mib if row is not None else None
        stages.append(
            Stage(
                rank=rank,
                host=host,
                node_name=str(node_names.get(host) or host),
                layers=layers,
                arch=arches[host],
                cpus=_int(host, hf.get("cpus"), "llmfleet_host.cpus"),
                usable_mib=_int(host, usable, "llmfleet_host.memory.usable_mib"),
                weights_mib=weights[rank],
            )
        )

    if dtype in ("", "auto"):
        dtype, dtype_reason = choose_dtype({s.host: verdicts[s.host] for s in stages})
    else:
        dtype_reason = "set by vllm_lws_dtype"
    if dtype == "float16":
        warnings.append("vllm_lws_dtype float16: FP16 is unstable in torch on CPU, bfloat16 is recommended")
    # The plan's weights are as stored: a Hugging Face checkpoint says its element width
    # (vllm.weights_dtype_bytes, 4 for float32), a GGUF plan is taken as 16-bit. vLLM holds them in
    # the served dtype: float32 takes 4 bytes an element, bfloat16 and float16 take 2.
    stored = stages_plan.weights_dtype_bytes
    scale = (4.0 if dtype == "float32" else 2.0) / float(stored)

    for s in stages:
        s.need_mib = math.ceil(s.weights_mib * scale + kv * 1024 + overhead_mib)
    need = max(s.need_mib for s in stages)
    if memory_gib:
        memory_mib = int(memory_gib) * 1024
        if memory_mib < need:
            short = max(stages, key=lambda s: s.need_mib)
            raise VllmLwsError(
                f"{short.host}: vllm_lws_memory_gib {memory_gib} is below what stage {short.rank} needs:"
                f" {short.need_mib} MiB ({short.weights_mib * scale:.0f} weights + {kv * 1024} KV + {overhead_mib} runtime)"
            )
    else:
        memory_mib = math.ceil(need / 1024.0) * 1024
    too_small = [s for s in stages if memory_mib > s.usable_mib]
    if too_small:
        raise VllmLwsError(
            "requests = limits of "
            + f"{memory_mib} MiB per pod do not fit "
            + ", ".join(f"{s.host} (stage {s.rank}, usable {s.usable_mib} MiB)" for s in too_small)
            + f"; KV cache {kv} GiB per rank"
        )

    if cpu:
        cpu_value = int(cpu)
        small = [s for s in stages if s.cpus < cpu_value]
        if small:
            raise VllmLwsError(
                f"vllm_lws_cpu {cpu_value} exceeds the CPUs of "
                + ", ".join(f"{s.host} ({s.cpus})" for s in small)
            )
    else:
        cpu_value = max(1, min(s.cpus for s in stages) - int(cpu_reserve))

    workers = stages[1:]
    if not workers:
        warnings.append(
            f"the plan puts every layer on {stages[0].host}: one pod, no pipeline parallelism"
            " (a LeaderWorkerSet of size 1)"
        )
    rank_mode = "worker_index" if len({s.layers for s in workers}) <= 1 else "node_name"

    if not image:
        image = f"{image_repository}:{image_version}-{image_arch}"
    return GroupChoice(
        stages=stages,
        image_arch=image_arch,
        kube_arch=kube_arch,
        image=image,
        dtype=dtype,
        dtype_reason=dtype_reason,
        cpu=cpu_value,
        memory_mib=memory_mib,
        kvcache_space_gib=kv,
        pp_layer_partition=",".join(str(c) for c in counts),
        rank_mode=rank_mode,
        warnings=warnings,
    )


def choice_summary(choice: GroupChoice) -> Dict[str, Any]:
    """The pre-flight decision as plain data (for Ansible and the docs)."""
    return {
        "image": choice.image,
        "image_arch": choice.image_arch,
        "kube_arch": choice.kube_arch,
        "dtype": choice.dtype,
        "dtype_reason": choice.dtype_reason,
        "cpu": choice.cpu,
        "memory_mib": choice.memory_mib,
        "kvcache_space_gib": choice.kvcache_space_gib,
        "pp_layer_partition": choice.pp_layer_partition,
        "rank_mode": choice.rank_mode,
        "warnings": list(choice.warnings),
        "stages": [
            {
                "rank": s.rank,
                "host": s.host,
                "node_name": s.node_name,
                "layers": s.layers,
                "weights_mib": round(s.weights_mib, 1),
                "need_mib": s.need_mib,
                "usable_mib": s.usable_mib,
            }
            for s in choice.stages
        ],
    }


# ----------------------------------------------------------------------------------------------------
# Manifests
# ----------------------------------------------------------------------------------------------------


def rank_script(stages: List[Stage]) -> str:
    """The worker's shell wrapper: node name -> node rank, then ``exec vllm serve``."""
    lines = [_RANK_SCRIPT_HEAD]
    for s in stages[1:]:
        if "'" in s.node_name:
            raise VllmLwsError(f"{s.host}: node name {s.node_name!r} contains a quote")
        lines.append(f"  '{s.node_name}') rank={s.rank} ;;\n")
    lines.append(_RANK_SCRIPT_TAIL.format(known=" ".join(s.node_name for s in stages[1:])))
    return "".join(lines)


def _labels(name: str, role: str) -> Dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": "llmfleet",
        "llmfleet.io/vllm-role": role,
    }


def _quantity_mib(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _pod_spec(
    choice: GroupChoice, opts: Dict[str, Any], leader: bool, name: str
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(container, pod spec) for the leader or the worker template."""
    size = len(choice.stages)
    args: List[str] = [str(opts["model"])]
    if opts.get("model_revision"):
        args.append(f"--revision={opts['model_revision']}")
    args += [
        f"--dtype={choice.dtype}",
        f"--max-model-len={int(opts['max_model_len'])}",
        f"--pipeline-parallel-size={size}",
        "--tensor-parallel-size=1",
        "-cc.mode=2",
        "-cc.backend=eager",
        "--no-async-scheduling",
        f"--nnodes={size}",
        "--master-addr=$(LWS_LEADER_ADDRESS)",
    ]
    if opts.get("master_port"):
        args.append(f"--master-port={int(opts['master_port'])}")
    args += [str(a) for a in (opts.get("extra_args") or [])]
    command: Optional[List[str]] = None
    if leader:
        args += ["--node-rank=0", f"--port={int(opts['port'])}"]
        if opts.get("served_model_name"):
            args.append(f"--served-model-name={opts['served_model_name']}")
    elif choice.rank_mode == "worker_index":
        args += ["--node-rank=$(LWS_WORKER_INDEX)", "--headless"]
    else:
        args += ["--headless"]
        command = ["/bin/sh", "-c", rank_script(choice.stages), "vllm-worker"]

    for a in args:
        flag = a.split("=", 1)[0]
        if flag in FORBIDDEN_FLAGS:
            raise VllmLwsError(f"vllm_lws_extra_args: {a} is refused: {FORBIDDEN_FLAGS[flag]}")

    hf = opts["hf_token_secret"]
    env: List[Dict[str, Any]] = [
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": hf["name"], "key": hf["key"], "optional": True}},
        }
    ]
    if leader:
        api = opts["api_key_secret"]
        env.append(
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": api["name"], "key": api["key"]}}}
        )
    env += [
        {"name": "VLLM_PP_LAYER_PARTITION", "value": choice.pp_layer_partition},
        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(choice.kvcache_space_gib)},
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if not leader and choice.rank_mode == "node_name":
        env.append({"name": "LLMFLEET_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    for key, value in sorted((opts.get("extra_env") or {}).items()):
        env.append({"name": str(key), "value": str(value)})

    quantities = {"cpu": str(choice.cpu), "memory": _quantity_mib(choice.memory_mib)}
    container: Dict[str, Any] = {
        "name": "vllm",
        "image": choice.image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": env,
        "resources": {"requests": dict(quantities), "limits": dict(quantities)},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    if command:
        container["command"] = command
    if leader:
        port = int(opts["port"])
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        container["startupProbe"] = {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": int(opts["startup_failure_threshold"]),
        }
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}

    if leader:
        node_terms = [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [choice.stages[0].node_name]}
        ]
    else:
        node_terms = [
            {
                "key": "kubernetes.io/hostname",
                "operator": "In",
                "values": [s.node_name for s in choice.stages[1:]],
            }
        ]
    affinity: Dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": name}},
                }
            ]
        }
    }
    if opts.get("pin_nodes", True) and node_terms[0]["values"]:
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": node_terms}]
            }
        }
    spec: Dict[str, Any] = {
        # vLLM never talks to the Kubernetes API: no token in the pods.
        "automountServiceAccountToken": False,
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        "affinity": affinity,
        "containers": [container],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{int(opts['shm_gib'])}Gi"}}
        ],
    }
    if choice.kube_arch:
        spec["nodeSelector"] = {"kubernetes.io/arch": choice.kube_arch}
    if opts.get("tolerations"):
        spec["tolerations"] = list(opts["tolerations"])
    return container, spec


def build_manifests(choice: GroupChoice, opts: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every object of the deployment, in apply order. Secrets are included only when their values
    are given (``opts['hf_token']`` / ``opts['api_key']``); no other object carries a secret value."""
    name = str(opts["name"])
    ns = str(opts["namespace"])
    port = int(opts["port"])
    objects: List[Dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"app.kubernetes.io/part-of": "llmfleet"}},
        }
    ]
    for secret, value in (
        (opts["hf_token_secret"], opts.get("hf_token")),
        (opts["api_key_secret"], opts.get("api_key")),
    ):
        if value:
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": secret["name"],
                        "namespace": ns,
                        "labels": {"app.kubernetes.io/part-of": "llmfleet"},
                    },
                    "type": "Opaque",
                    "stringData": {secret["key"]: str(value)},
                }
            )

    _unused, leader_spec = _pod_spec(choice, opts, True, name)
    _unused, worker_spec = _pod_spec(choice, opts, False, name)
    lws = {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "llmfleet"},
            "annotations": {
                "llmfleet.io/pp-layer-partition": choice.pp_layer_partition,
                "llmfleet.io/stages": ",".join(f"{s.rank}:{s.host}:{s.node_name}" for s in choice.stages),
                "llmfleet.io/rank-mode": choice.rank_mode,
            },
        },
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": len(choice.stages),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": _labels(name, "leader")}, "spec": leader_spec},
                "workerTemplate": {"metadata": {"labels": _labels(name, "worker")}, "spec": worker_spec},
            },
        },
    }
    objects.append(lws)

    leader_selector = {"app.kubernetes.io/name": name, "llmfleet.io/vllm-role": "leader"}
    service_name = f"{name}-leader"
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service_name, "namespace": ns, "labels": {"app.kubernetes.io/name": name}},
            "spec": {
                "type": "ClusterIP",
                "selector": leader_selector,
                "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )

    if _flag(opts.get("networkpolicy", True)):
        objects.append(build_network_policy(name, ns, port, opts))

    if opts.get("ingress_enabled", True):
        objects.append(build_ingress(name, ns, service_name, port, opts))

    if opts.get("podmonitor"):
        objects.append(
            {
                "apiVersion": PODMONITOR_API_VERSION,
                "kind": "PodMonitor",
                "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/name": name}},
                "spec": {
                    "selector": {"matchLabels": leader_selector},
                    "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
                },
            }
        )
    return objects


def _flag(value: Any) -> bool:
    """An on/off option as Ansible may hand it over (a bool, or its text)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def build_network_policy(name: str, ns: str, port: int, opts: Dict[str, Any]) -> Dict[str, Any]:
    """The group's pods take connections from one another (torch.distributed, on any port) and,
    on the leader's API port only, from ``networkpolicy_api_from`` (NetworkPolicyPeers; empty:
    from anywhere, which an Ingress controller, a load balancer's target IPs and the chat page
    need). Nothing else reaches them."""
    group = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": name}}}
    api_rule: Dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    peers = list(opts.get("networkpolicy_api_from") or [])
    if peers:
        api_rule["from"] = peers
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [group]}, api_rule],
        },
    }


def build_ingress(name: str, ns: str, service_name: str, port: int, opts: Dict[str, Any]) -> Dict[str, Any]:
    """The Ingress: the given specific paths (longest first), then only the API's own paths
    (``API_INGRESS_PATHS``) to the leader Service, over TLS (HTTP redirected) unless
    ``ingress_tls`` is false, a raised idle timeout, and the AWS ALB annotations when asked for."""
    timeout = int(opts.get("ingress_idle_timeout_s", 300))
    flavor = str(opts.get("ingress_flavor", "nginx"))
    tls = _flag(opts.get("ingress_tls", True))
    annotations: Dict[str, str] = {}
    if flavor == "nginx":
        annotations.update(
            {
                "nginx.ingress.kubernetes.io/proxy-read-timeout": str(timeout),
                "nginx.ingress.kubernetes.io/proxy-send-timeout": str(timeout),
                "nginx.ingress.kubernetes.io/proxy-buffering": "off",
            }
        )
        if tls:
            # Without a Secret, ingress-nginx serves its own certificate; plain HTTP is redirected.
            annotations["nginx.ingress.kubernetes.io/force-ssl-redirect"] = "true"
    elif flavor == "alb":
        annotations.update(
            {
                "alb.ingress.kubernetes.io/scheme": str(opts.get("alb_scheme", "internal")),
                "alb.ingress.kubernetes.io/target-type": "ip",
                "alb.ingress.kubernetes.io/listen-ports": (
                    '[{"HTTP":80},{"HTTPS":443}]' if tls else '[{"HTTP":80}]'
                ),
                "alb.ingress.kubernetes.io/healthcheck-path": "/health",
                "alb.ingress.kubernetes.io/load-balancer-attributes": f"idle_timeout.timeout_seconds={timeout}",
            }
        )
        if tls:
            # The certificate: ACM's for the Ingress host (discovered), or a certificate-arn annotation.
            annotations["alb.ingress.kubernetes.io/ssl-redirect"] = "443"
    elif flavor != "none":
        raise VllmLwsError(f"vllm_lws_ingress_flavor is {flavor!r}: expected nginx, alb or none")
    annotations.update({str(k): str(v) for k, v in (opts.get("ingress_annotations") or {}).items()})

    paths = []
    extra = list(opts.get("ingress_paths") or [])
    for p in extra:
        if p.get("path") in (None, "", "/"):
            raise VllmLwsError(
                f"vllm_lws_ingress_paths: {p!r} must have a specific path (the leader's port is not published whole)"
            )
    for p in sorted(extra, key=lambda p: (-len(str(p["path"])), str(p["path"]))):
        paths.append(
            {
                "path": str(p["path"]),
                "pathType": "Prefix",
                "backend": {"service": {"name": str(p["service"]), "port": {"number": int(p["port"])}}},
            }
        )
    for path, path_type in API_INGRESS_PATHS:
        paths.append(
            {
                "path": path,
                "pathType": path_type,
                "backend": {"service": {"name": service_name, "port": {"number": port}}},
            }
        )
    rule: Dict[str, Any] = {"http": {"paths": paths}}
    if opts.get("ingress_host"):
        rule["host"] = str(opts["ingress_host"])
    spec: Dict[str, Any] = {"rules": [rule]}
    if tls and opts.get("ingress_tls_secret"):
        entry: Dict[str, Any] = {"secretName": str(opts["ingress_tls_secret"])}
        if opts.get("ingress_host"):
            entry["hosts"] = [str(opts["ingress_host"])]
        spec["tls"] = [entry]
    cls = opts.get("ingress_class") or ("alb" if flavor == "alb" else "")
    if cls:
        spec["ingressClassName"] = str(cls)
    meta: Dict[str, Any] = {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/name": name}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": spec}


KIND_ORDER = {
    "Namespace": 0,
    "Secret": 10,
    "LeaderWorkerSet": 20,
    "Service": 30,
    "NetworkPolicy": 35,
    "Ingress": 40,
    "PodMonitor": 50,
}


def manifest_filename(obj: Dict[str, Any]) -> str:
    """``vllm-<NN>-<kind>-<name>.yaml``: one object per file, NN fixed per kind, in apply order."""
    kind = str(obj.get("kind", "object"))
    name = str((obj.get("metadata") or {}).get("name", ""))
    return f"vllm-{KIND_ORDER.get(kind, 90):02d}-{kind.lower()}-{name}.yaml"


# ----------------------------------------------------------------------------------------------------
# One entry point for the filters
# ----------------------------------------------------------------------------------------------------

PREFLIGHT_OPTIONS = (
    "image_repository",
    "image_version",
    "image",
    "dtype",
    "cpu",
    "cpu_reserve",
    "memory_gib",
    "overhead_mib",
    "allow_mixed_arch",
    "kvcache_space_gib",
)

MANIFEST_DEFAULTS: Dict[str, Any] = {
    "name": "vllm",
    "namespace": "vllm",
    "model": "",
    "model_revision": "",
    "served_model_name": "",
    "max_model_len": 4096,
    "port": 8000,
    "master_port": 0,
    "shm_gib": 4,
    "startup_failure_threshold": 90,
    "extra_args": [],
    "extra_env": {},
    "pin_nodes": True,
    "tolerations": [],
    "hf_token_secret": {"name": "hf-token", "key": "token"},
    "api_key_secret": {"name": "vllm-api-key", "key": "key"},
    "hf_token": "",
    "api_key": "",
    "ingress_enabled": True,
    "ingress_flavor": "nginx",
    "ingress_class": "",
    "ingress_host": "",
    "ingress_idle_timeout_s": 300,
    "ingress_annotations": {},
    "ingress_paths": [],
    "ingress_tls": True,
    "ingress_tls_secret": "",
    "networkpolicy": True,
    "networkpolicy_api_from": [],
    "alb_scheme": "internal",
    "podmonitor": False,
}


def run_preflight(
    plan: Dict[str, Any], facts: Dict[str, Any], options: Optional[Dict[str, Any]] = None
) -> GroupChoice:
    """:func:`preflight` with the options as one dict (unknown keys are ignored here)."""
    options = dict(options or {})
    kwargs = {k: options[k] for k in PREFLIGHT_OPTIONS if k in options and options[k] is not None}
    return preflight(plan, facts or {}, node_names=options.get("node_names") or {}, **kwargs)


def render(
    plan: Dict[str, Any], facts: Dict[str, Any], options: Optional[Dict[str, Any]] = None
) -> List[Dict[str, Any]]:
    """Pre-flight, then every object as ``{"file": ..., "object": ...}`` in apply order."""
    options = dict(options or {})
    choice = run_preflight(plan, facts, options)
    opts = dict(MANIFEST_DEFAULTS)
    opts.update({k: v for k, v in options.items() if k in MANIFEST_DEFAULTS and v is not None})
    if not opts["model"]:
        raise VllmLwsError("vllm_lws_model is empty: give the Hugging Face model id vLLM serves")
    objects = build_manifests(choice, opts)
    return [{"file": manifest_filename(obj), "object": obj} for obj in objects]

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the Kubernetes manifests of llmfleet.cluster.llama_rpc need from the plan (pure).

The plan is never recomputed here: its hosts and fallbacks are grouped by the Kubernetes
architecture of each worker (one rpc-server DaemonSet per architecture), each group gets the
largest predicted total MiB of its workers over the plan and its ok fallbacks (the memory
request), the largest usable minus reserve MiB (the limit, which the plan never exceeds) and the
smallest thread count; the llama.cpp pin of every architecture (workers and head) is looked up in
the release table; whatever the pods would lack is reported in ``problems``.

A host planned on a GPU device is served as the systemd target serves it
(device_serving.k8s_serving, the same decisions): its rpc-server gets the plan's ``-d`` list and
``llmfleet_llama_cpp_env``, its container the device plugin's resource of each GPU, and its pin is
the GPU flavour of its architecture (``ubuntu-vulkan-x64``). GPU workers get their own DaemonSet
per (architecture, ``-d`` list, environment, resources), pinned to their nodes by the
``kubernetes.io/hostname`` label (the node name, the plan's host name, as the supervisor keys the
pods), and the CPU DaemonSet of their architecture keeps off those nodes.

A plan with no worker (the head alone holds the model) is llama-server alone: no rpc-server
DaemonSet, no workers Service or NetworkPolicy, and no Role to list pods with (the supervisor
discovers nothing: ``discovery`` is ``static`` and the plan's arguments carry no ``--rpc``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import re

from ansible_collections.llmfleet.cluster.plugins.module_utils.hostinfo import KUBE_ARCH, release_flavour
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.device_serving import ServingError, k8s_serving
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import Plan, parse
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.targets import SERVERS

_SERVER = SERVERS["llama_rpc"]

SHA256 = re.compile(r"^[0-9a-f]{64}$")
UID = 65534
NAMES = {
    "head": _SERVER.service[1],
    "workers": "llama-rpc-server",
    "config": "llama-rpc",
    "secret": _SERVER.api_key_secret[1]["name"],
    "account": "llama-server",
    "data": "llama-server-data",
    "api": _SERVER.service[1],
    "headless": "llama-rpc-workers",
}
NAMES["role"] = NAMES["account"] + "-pods"  # the Role and its RoleBinding: list the workers' pods
NAMES["policy"] = NAMES["workers"] + "-only-from-" + NAMES["head"]  # the NetworkPolicy
FILE_PREFIX = "llama-rpc-"  # every rendered file: llama-rpc-NN-<object>.yaml
FILE_PATTERN = FILE_PREFIX + "*.yaml"
PART_OF = "llmfleet"  # app.kubernetes.io/part-of of every object


def teardown(daemonsets=()):
    """What removing the target deletes, from NAMES alone (no plan needed).

    ``selector`` finds the rpc-server DaemonSets (one per architecture, so their names come from
    the cluster: ``daemonsets``); ``objects`` is every object in delete order (the workloads
    first), each {api, kind, name}; ``files`` the rendered files' pattern and the generated API key
    file's name.
    """

    def obj(api, kind, name):
        return {"api": api, "kind": kind, "name": name}

    rbac = "rbac.authorization.k8s.io/v1"
    return {
        "selector": ["app.kubernetes.io/name=" + NAMES["workers"], "app.kubernetes.io/part-of=" + PART_OF],
        "objects": [obj("apps/v1", "Deployment", NAMES["head"])]
        + [obj("apps/v1", "DaemonSet", str(name)) for name in daemonsets]
        + [
            obj("v1", "Service", NAMES["api"]),
            obj("v1", "Service", NAMES["headless"]),
            obj("networking.k8s.io/v1", "NetworkPolicy", NAMES["policy"]),
            obj(rbac, "RoleBinding", NAMES["role"]),
            obj(rbac, "Role", NAMES["role"]),
            obj("v1", "ServiceAccount", NAMES["account"]),
            obj("v1", "ConfigMap", NAMES["config"]),
            obj("v1", "Secret", NAMES["secret"]),
            obj("v1", "PersistentVolumeClaim", NAMES["data"]),
        ],
        "file_pattern": FILE_PATTERN,
        "key_file": NAMES["secret"],
    }


def kube_arch(host_fact):
    """The Kubernetes architecture of a host from its llmfleet_host fact (amd64 when unknown)."""
    fact = host_fact or {}
    if fact.get("kube_arch"):
        return str(fact["kube_arch"])
    arch = str(fact.get("arch") or "amd64")
    return KUBE_ARCH.get(arch, arch)


def parse_plan(plan):
    """``plan`` as a :class:`~plan.Plan` (parsed when it is plan.json's dict; PlanError names the field)."""
    return plan if isinstance(plan, Plan) else parse(plan)


def gpu_flavour(arch, backend):
    """The release flavour of ``arch`` carrying ``backend`` (``amd64``, ``vulkan`` -> ``ubuntu-vulkan-x64``)."""
    cpu = release_flavour(arch)
    return cpu.replace("ubuntu-", "ubuntu-{0}-".format(backend), 1) if cpu and backend else cpu


def host_serving(plan, name, host_facts, envs=None, resources=None):
    """``name``'s container needs (device_serving.k8s_serving) and its pin: ``pin`` the ConfigMap key
    (its architecture, ``<backend>-<arch>`` for a GPU build) and ``flavour`` the release flavour."""
    plan = parse_plan(plan)
    arch = kube_arch(host_facts.get(name))
    row = plan.host(name)
    backends = sorted({d.backend for d in row.gpu_devices}) if row else []
    if len(backends) > 1:
        raise ServingError(
            "{0}: the plan puts layers on devices of several backends ({1}); one llama.cpp build "
            "serves one".format(name, ", ".join(backends))
        )
    backend = backends[0] if backends else None
    flavour = gpu_flavour(arch, backend)
    out = k8s_serving(plan, name, flavour, (envs or {}).get(name), resources)
    out.update(
        {"arch": arch, "flavour": flavour, "pin": "{0}-{1}".format(backend, arch) if backend else arch}
    )
    return out


def worker_groups(plan, host_facts, envs=None, resources=None):
    """DaemonSet key -> {workers, request_mib, limit_mib, threads, arch, pin, args, env, limits,
    nodes, avoid} for the plan's workers.

    CPU workers: one group per architecture, keyed by it (as before GPUs). GPU workers: one group
    per (architecture, -d list, environment, resources), keyed ``<arch>-<backend>-<i>``, with
    ``nodes`` their node names; a CPU group's ``avoid`` lists the GPU workers' nodes of its
    architecture. ``plan`` is plan.json as a dict or a parsed :class:`~plan.Plan`."""
    plan = parse_plan(plan)
    entries = plan.hosts + plan.fallback_hosts()
    groups = {}
    gpu_keys = {}
    for host in plan.workers:
        served = host_serving(plan, host.name, host_facts, envs, resources)
        arch = served["arch"]
        if served["gpu"]:
            ident = (arch, tuple(served["args"]), tuple((e["name"], e["value"]) for e in served["env"]),
                     tuple(served["limits"].items()))  # fmt: skip
            if ident not in gpu_keys:
                count = sum(1 for (a, *_rest) in gpu_keys if a == arch)
                gpu_keys[ident] = "{0}-{1}-{2}".format(arch, served["backend"], count)
            key = gpu_keys[ident]
        else:
            key = arch
        need = max([float(e.predicted_mib.get("total", 0)) for e in entries if e.name == host.name] or [0.0])
        threads = host.threads or 1
        group = groups.setdefault(
            key,
            {"workers": [], "request_mib": 0, "limit_mib": 0, "threads": threads, "arch": arch,
             "pin": served["pin"], "flavour": served["flavour"], "args": served["args"], "env": served["env"], "limits": served["limits"],
             "gpu": served["gpu"], "backend": served["backend"], "nodes": [], "avoid": [], "image": ""},
        )  # fmt: skip
        group["workers"].append(host.name)
        if served["gpu"]:
            group["nodes"].append(host.name)
        group["request_mib"] = max(group["request_mib"], math.ceil(need))
        group["limit_mib"] = max(group["limit_mib"], math.floor(plan.allowed_mib(host)))
        group["threads"] = min(group["threads"], threads)
    for key, group in groups.items():
        if not group["gpu"]:
            group["avoid"] = sorted(
                n for g in groups.values() if g["gpu"] and g["arch"] == key for n in g["nodes"]
            )
    return groups


def manifest_list(archs):
    """The files, in apply order: Namespace first, the Secret flagged, one DaemonSet per arch.

    Without any architecture (a plan with no worker) the objects that exist only for the workers
    (Role and RoleBinding to list their pods, NetworkPolicy, headless Service) are left out.
    """

    def item(template, number, kind, secret=False, arch=None, suffix=None):
        entry = {
            "template": "kubernetes/{0}.yaml.j2".format(template),
            "file": "{0}{1:02d}-{2}.yaml".format(FILE_PREFIX, number, suffix or template),
            "kind": kind,
            "secret": secret,
        }
        if arch:
            entry["arch"] = arch
        return entry

    out = [
        item("namespace", 0, "Namespace"),
        item("secret", 1, "Secret", secret=True),
        item("configmap", 2, "ConfigMap"),
        item("serviceaccount", 3, "ServiceAccount"),
    ]
    if archs:
        out += [
            item("role", 4, "Role"),
            item("rolebinding", 5, "RoleBinding"),
            item("networkpolicy", 6, "NetworkPolicy"),
            item("service-workers", 7, "Service"),
        ]
    out += [item("daemonset", 8, "DaemonSet", arch=a, suffix="daemonset-" + a) for a in sorted(archs)]
    out += [item("pvc", 9, "PersistentVolumeClaim"), item("deployment", 10, "Deployment")]
    out.append(item("service-api", 11, "Service"))
    return out


def k8s_facts(
    plan,
    host_facts,
    releases,
    build,
    model_url="",
    output_dir="build",
    pvc_size="",
    envs=None,
    resources=None,
    images=None,
):
    """Everything the templates need, and ``problems`` (empty when the pods can run).

    ``envs`` maps a host to its ``llmfleet_llama_cpp_env``; ``resources`` a GPU backend to the
    Kubernetes resource its device plugin offers (device_serving.K8S_GPU_RESOURCES); ``images`` a
    GPU backend to the image its llama.cpp container runs in (the backend's loader and user-space
    driver; empty: the role's one image)."""
    plan = parse_plan(plan)
    problems = []
    try:
        groups = worker_groups(plan, host_facts, envs, resources)
        head_serving = host_serving(plan, plan.head.name, host_facts, envs, resources)
    except ServingError as err:
        problems.append(str(err))
        groups, head_serving = {}, None
    images = images or {}
    for group in groups.values():
        group["image"] = str(images.get(group["backend"]) or "") if group["gpu"] else ""
    head = plan.head.name
    head_arch = kube_arch(host_facts.get(head))
    table = (releases or {}).get(str(build), {}) if build else {}
    if not build:
        problems.append("llama_rpc_k8s_llama_cpp_build (llama_cpp_build) is empty")
    wanted = {g["pin"]: (g["arch"], g["flavour"]) for g in groups.values()}
    head_pin = head_serving["pin"] if head_serving else head_arch
    wanted[head_pin] = (head_arch, head_serving["flavour"] if head_serving else release_flavour(head_arch))
    pins = {}
    for key in sorted(wanted):
        arch, flavour = wanted[key]
        pin = table.get(flavour) or {} if flavour else {}
        if not flavour:
            problems.append("no llama.cpp release flavour for the architecture {0}".format(arch))
        elif not pin.get("url") or not SHA256.match(str(pin.get("sha256") or "")):
            problems.append(
                "llama.cpp build {0} has no url and 64-hex sha256 for {1} ({2}) in "
                "llama_rpc_k8s_llama_cpp_releases".format(build, flavour, arch)
            )
        else:
            pins[key] = {"flavour": flavour, "url": pin["url"], "sha256": pin["sha256"]}
    model = plan.model_file
    url = model_url or model["url"]
    if not url:
        problems.append(
            "the pods download the model, but the plan has no model url (llmfleet_model.url) "
            "and llama_rpc_k8s_model_url is empty"
        )
    sha = model["sha256"]
    if not SHA256.match(sha):
        problems.append("the plan has no 64-hex model sha256")
    head_need = float(plan.head.predicted_mib.get("total", 0))
    model_gib = math.ceil(model["bytes"] / float(1 << 30))
    out_dir = str(output_dir).rstrip("/") or "."
    return {
        "problems": problems,
        "archs": groups,
        "llama_cpp": pins,
        "head": {
            "name": head,
            "arch": head_arch,
            "request_mib": math.ceil(head_need),
            "pin": head_pin,
            "env": head_serving["env"] if head_serving else [],
            "limits": head_serving["limits"] if head_serving else {},
            "image": str(images.get(head_serving["backend"]) or "")
            if head_serving and head_serving["gpu"]
            else "",
        },
        "model": {
            "url": url,
            "sha256": sha,
            "file": os.path.basename(model["file"] or "model.gguf"),
            "size": model["bytes"],  # the download stops there (0: unknown)
        },
        "pvc_size": pvc_size or "{0}Gi".format(model_gib + 2),
        "uid": UID,
        "manifest_dir": out_dir + "/manifests",
        "key_file": out_dir + "/" + NAMES["secret"],
        "file_pattern": FILE_PATTERN,
        "names": dict(NAMES),
        "workerless": not groups,
        "discovery": "kubernetes" if groups else "static",
        "manifests": manifest_list(groups),
    }

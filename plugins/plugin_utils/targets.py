# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The registry of deployment targets (pure, controller-only): the one place that says, for each
value of ``llmfleet_target``, what it deploys, with which role and playbook, under which names,
and how its entry point and API key are found.

Playbooks and roles read it through the lookup ``llmfleet.cluster.target``; the planner
(placement.py) imports it; the static lists that cannot read it (argument_specs choices,
docs/plan.schema.json, the plan_placement filter's documentation) are checked against it by
tests/unit/plugins/plugin_utils/test_targets.py. A new target is its role plus one entry in
TARGETS (and, when it serves through a role not listed yet, one entry in SERVERS).

A name a role lets the inventory change is given as (variable, default): the variable's value
when the play defines it (the role is in the play or the inventory sets it), else the default,
which is the role's own default.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

# (variable the inventory may set or None, default)
Setting = Tuple[Optional[str], Any]


@dataclasses.dataclass(frozen=True)
class Server:
    """The names of what a deploying role serves the API with, as other roles reach it."""

    role: str
    namespace: Setting  # the Kubernetes namespace of its objects (and of the key's Secret)
    service: Setting  # the Service in front of the API (llama-server / the vLLM leader)
    service_suffix: str
    port: Setting  # the API's port
    api_key_secret: Setting  # {name, key} of the Secret holding the API key
    api_key_file: str  # where the role keeps the key on the head (systemd target), "" for none


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    backend: str  # what serves: llama_cpp or vllm (the plan's backend for this target)
    server: str  # key of SERVERS: the role that deploys it
    playbook: str  # the playbook that runs that role (playbooks/<name>)
    kubernetes: bool  # objects in a cluster (rendered or applied) rather than units on the hosts
    on_hosts: bool  # site.yml installs llama.cpp, the model and journald on the hosts
    tunnel: bool  # the WireGuard tunnel between the head and the workers is this target's
    site_chat_ui: bool  # site.yml serves the chat page for it
    site_verify: bool  # site.yml's per-host verify runs for it
    plan_hosts: str  # the vLLM stages' hosts: "fewest" (the planner chooses) or "all" (the user did)
    description: str


SERVERS: Dict[str, Server] = {
    "llama_rpc": Server(
        role="llmfleet.cluster.llama_rpc",
        namespace=("llama_rpc_k8s_namespace", "llmfleet"),
        service=(None, "llama-server"),
        service_suffix="",
        port=("llama_rpc_api_port", 8080),
        api_key_secret=(None, {"name": "llama-rpc-api-key", "key": "api-key"}),
        api_key_file="/etc/llmfleet/api-key",
    ),
    "vllm_lws": Server(
        role="llmfleet.cluster.vllm_lws",
        namespace=("vllm_lws_namespace", "vllm"),
        service=("vllm_lws_name", "vllm"),
        service_suffix="-leader",
        port=("vllm_lws_port", 8000),
        api_key_secret=("vllm_lws_api_key_secret", {"name": "vllm-api-key", "key": "key"}),
        api_key_file="",
    ),
}

TARGETS: Dict[str, Target] = {
    "systemd": Target(
        name="systemd",
        backend="llama_cpp",
        server="llama_rpc",
        playbook="deploy.yml",
        kubernetes=False,
        on_hosts=True,
        tunnel=True,
        site_chat_ui=True,
        site_verify=True,
        plan_hosts="fewest",
        description="llama.cpp RPC as systemd units on the hosts (the supervisor on the head)",
    ),
    "kubernetes": Target(
        name="kubernetes",
        backend="llama_cpp",
        server="llama_rpc",
        playbook="deploy.yml",
        kubernetes=True,
        on_hosts=False,
        tunnel=False,
        site_chat_ui=True,
        site_verify=False,
        plan_hosts="fewest",
        description="llama.cpp RPC as pods (llama-server Deployment, one rpc-server DaemonSet per architecture)",
    ),
    "lws": Target(
        name="lws",
        backend="vllm",
        server="vllm_lws",
        playbook="deploy_vllm.yml",
        kubernetes=True,
        on_hosts=False,
        tunnel=False,
        site_chat_ui=False,
        site_verify=False,
        plan_hosts="all",
        description="vLLM pipeline stages as a LeaderWorkerSet",
    ),
}


class TargetError(ValueError):
    pass


def names() -> list:
    """The targets, in the order they were added."""
    return list(TARGETS)


def get(name: Any) -> Target:
    """The registry entry of a target; an unknown one is refused naming the value and the known ones."""
    try:
        return TARGETS[str(name)]
    except KeyError:
        raise TargetError("unknown llmfleet target %r (known: %s)" % (name, ", ".join(TARGETS))) from None


def roles(role: str) -> list:
    """The targets a role deploys (e.g. llmfleet.cluster.llama_rpc: systemd and kubernetes)."""
    return [t.name for t in TARGETS.values() if SERVERS[t.server].role == role]


def resolve(name: Any, value: Optional[Callable[[str], Any]] = None) -> Dict[str, Any]:
    """The entry as data, with the server's names resolved: ``value(variable)`` is the play's value of
    a variable or None when the play does not define it (then the role's default holds)."""
    target = get(name)
    server = SERVERS[target.server]

    def setting(item: Setting) -> Any:
        var, default = item
        if var and value is not None:
            got = value(var)
            if got is not None:
                return got
        return default

    namespace = str(setting(server.namespace))
    service = str(setting(server.service)) + server.service_suffix
    port = int(setting(server.port))
    out = dataclasses.asdict(target)
    out.update(
        role=server.role,
        targets=names(),
        namespace=namespace,
        service=service,
        port=port,
        api_key_secret=dict(setting(server.api_key_secret)),
        api_key_file=server.api_key_file,
        upstream_url="http://%s.%s.svc:%d" % (service, namespace, port),
    )
    return out

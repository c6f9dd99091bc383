# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""How one host's llama.cpp process serves the devices the plan gave it (controller-only, pure).

The plan (plan.json version 2) lists each host's devices in llama.cpp's order. A worker's
rpc-server must offer exactly that list, in that order: the head's ``--device RPC<n>`` names
count the devices each endpoint offers (split_rule.rpc_device_names), and an rpc-server of a GPU
build offers its GPUs and not its CPU unless told (tools/rpc/rpc-server.cpp of the pinned build:
without ``-d`` it takes the non-CPU devices first and the CPU only when there is none). So a
worker's rpc-server gets ``-d <its devices>`` whenever the plan gives it a device other than its
CPU, or its build carries a GPU backend (a GPU build's rpc-server planned on its CPU alone must
be told ``-d CPU``). A CPU-only host of a CPU build keeps today's command line.

The environment (``llmfleet_llama_cpp_env``, the probe's listing ran under the same one, so the
plan's device names are the ones these processes see): e.g. ``GGML_VK_VISIBLE_DEVICES: "0"``,
without which llama.cpp skips a CPU-type Vulkan device (lavapipe; ggml-vulkan.cpp,
ggml_vk_instance_init).

Device nodes: the units run with ``PrivateDevices=true`` (no /dev/dri, no /dev/nvidia*). A host
whose plan has a GPU device gets ``PrivateDevices=false`` with ``DevicePolicy=closed`` and the
device classes of its backends only (``DEVICE_CLASSES``), and its service user joins the groups
that own those nodes where the host has them (``DEVICE_GROUPS``).
"""

from __future__ import absolute_import, annotations, division, print_function

import re
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import flavour_backend
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import HostPlan, Plan, parse
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.systemd_unit import (
    UnitValueError,
    quote,
    quote_words,
)

# systemd DeviceAllow= classes (/proc/devices names) each backend's process opens: DRM render
# nodes for Vulkan and ROCm, NVIDIA's nodes for CUDA and for Vulkan on an NVIDIA card, /dev/kfd
# for ROCm. A class the host's kernel does not have admits nothing.
DEVICE_CLASSES = {
    "vulkan": ("char-drm", "char-nvidia-frontend", "char-nvidia-uvm"),
    "cuda": ("char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"),
    "rocm": ("char-drm", "char-kfd"),
}
# The groups that own /dev/dri/renderD* and /dev/kfd on Debian/Ubuntu (udev's rules).
DEVICE_GROUPS = {"vulkan": ("render", "video"), "cuda": (), "rocm": ("render", "video")}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ServingError(ValueError):
    """A host's serving settings that cannot be used (names the host and the value)."""


def check_env(env: Any, host: str) -> Dict[str, str]:
    """``llmfleet_llama_cpp_env`` of ``host`` as {NAME: value}, each a line-free string."""
    if env in (None, ""):
        return {}
    if not isinstance(env, Mapping):
        raise ServingError(
            "%s: llmfleet_llama_cpp_env must be a mapping of NAME: value, got %r" % (host, env)
        )
    out: Dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ServingError(
                "%s: llmfleet_llama_cpp_env: %r is not an environment variable name" % (host, name)
            )
        if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
            raise ServingError(
                "%s: llmfleet_llama_cpp_env.%s must be a string or a number, got %r" % (host, name, value)
            )
        text = str(value)
        if "\n" in text or "\r" in text or "\0" in text:
            raise ServingError("%s: llmfleet_llama_cpp_env.%s holds a line break or NUL" % (host, name))
        out[name] = text
    return out


def build_problem(row: HostPlan, flavour: Optional[str]) -> Optional[str]:
    """Why the llama.cpp build of ``flavour`` cannot serve the GPU devices the plan gives the host
    of ``row`` (None when it can): a device of another backend than the build's
    (``module_utils.devices.flavour_backend``), or any GPU device for a CPU build. An unknown
    flavour ("", what-if planning) and ``source`` (a build whose backends its name does not say)
    are not judged. The message names the host, the device, its backend and the flavour."""
    gpus = row.gpu_devices
    build_backend = flavour_backend(flavour)
    if build_backend is not None:
        bad = [d for d in gpus if d.backend != build_backend]
        if bad:
            return "%s: the plan puts layers on %s but the host's llama.cpp build %s carries %s" % (
                row.name,
                ", ".join("%s (%s)" % (d.name, d.backend) for d in bad),
                flavour,
                build_backend,
            )
    elif gpus and flavour and flavour != "source":
        return (
            "%s: the plan puts layers on %s but the host's llama.cpp build %s is a CPU build: "
            "choose its GPU flavour (llama_cpp_flavour)"
            % (row.name, ", ".join("%s (%s)" % (d.name, d.backend) for d in gpus), flavour)
        )
    return None


def build_problems(plan: Any, flavours: Mapping[str, Optional[str]]) -> List[str]:
    """:func:`build_problem` for every host of ``plan`` (``flavours``: host -> its flavour), one
    line per host whose build lacks a planned device's backend (the plan role's refusal)."""
    parsed: Plan = plan if isinstance(plan, Plan) else parse(plan)
    found = (build_problem(row, flavours.get(row.name)) for row in parsed.hosts)
    return [p for p in found if p]


def gpu_workers(plan: Any) -> List[str]:
    """The plan's workers, in its order, whose row has a device other than the CPU (the rule of
    :func:`serving`'s ``gpu``): the llama_rpc role gives these a fresh rpc-server before
    llama-server starts on the plan (roles/llama_rpc/tasks/serve_plan.yml; filter
    ``llmfleet.cluster.plan_gpu_workers``). [] for a plan without workers."""
    parsed: Plan = plan if isinstance(plan, Plan) else parse(plan)
    return [w.name for w in parsed.workers if w.gpu_devices]


def serving(plan: Any, host: str, flavour: Optional[str] = None, env: Any = None) -> Dict[str, Any]:
    """What ``host``'s llama.cpp process needs for its planned devices.

    Returns ``{devices, args, env, device_allow, groups, gpu}``: ``devices`` its device names in
    the plan's order; ``args`` the rpc-server's extra arguments (``["-d", "Vulkan0,CPU"]``, empty
    for the head, whose ``--device`` is in the plan's llama-server arguments, and for a CPU-only
    worker of a CPU build); ``env`` sorted ``NAME=value`` strings; ``device_allow`` the
    ``DeviceAllow=`` entries (``char-drm rw``), empty for a CPU-only host; ``groups`` the
    supplementary groups its service user joins where they exist; ``gpu`` whether it has a GPU.
    """
    parsed: Plan = plan if isinstance(plan, Plan) else parse(plan)
    row = parsed.host(host)
    if row is None:
        raise ServingError(
            "%s is not in the plan (hosts: %s)" % (host, ", ".join(h.name for h in parsed.hosts))
        )
    names = row.device_names()
    gpus = row.gpu_devices
    build_backend = flavour_backend(flavour)
    problem = build_problem(row, flavour)
    if problem:
        raise ServingError(problem)
    args: List[str] = []
    if row.role == "worker" and (gpus or build_backend is not None):
        args = ["-d", ",".join(names)]
    backends = sorted({d.backend for d in gpus})
    allow: List[str] = []
    groups: List[str] = []
    for backend in backends:
        for cls in DEVICE_CLASSES.get(backend, ()):
            if cls + " rw" not in allow:
                allow.append(cls + " rw")
        for group in DEVICE_GROUPS.get(backend, ()):
            if group not in groups:
                groups.append(group)
    values = check_env(env, host)
    env_lines = ["%s=%s" % (k, values[k]) for k in sorted(values)]
    return {
        "devices": names,
        "args": args,
        "env": env_lines,
        "device_allow": allow,
        "groups": groups,
        "gpu": bool(gpus),
        "unit_lines": _unit_lines(host, names, args, env_lines, allow),
    }


def _unit_lines(
    host: str, names: List[str], args: List[str], env: List[str], allow: List[str]
) -> Dict[str, Any]:
    """The unit's words and lines: ``args`` quoted for ExecStart (with its leading space, empty
    without), ``service`` the [Service] lines (Environment=, the device sandbox)."""
    try:
        words = (" " + quote_words(args, name="the plan devices of " + host)) if args else ""
        lines = ["Environment=" + quote(e, "env", name="llmfleet_llama_cpp_env of " + host) for e in env]
    except UnitValueError as err:
        raise ServingError(str(err)) from err
    if allow:
        lines.append(
            "# The plan puts layers on %s: the device nodes of their backends only." % ", ".join(names)
        )
        lines += ["PrivateDevices=false", "DevicePolicy=closed"] + ["DeviceAllow=" + a for a in allow]
    else:
        lines.append("PrivateDevices=true")
    return {"args": words, "service": "\n".join(lines)}


# The Kubernetes extended resource each backend's device asks for (its vendor's device plugin
# mounts the device nodes and opens the container's device cgroup to them; a hostPath of /dev/dri
# alone gives an unprivileged container nodes it may not open). Vulkan: Intel's device plugin
# (``gpu.intel.com/i915``) by default; a fleet whose Vulkan card is AMD's sets it to
# ``amd.com/gpu`` (llama_rpc_k8s_gpu_resources). A CPU-type device (lavapipe) needs none.
K8S_GPU_RESOURCES = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu", "vulkan": "gpu.intel.com/i915"}


def k8s_serving(
    plan: Any, host: str, flavour: Optional[str] = None, env: Any = None, resources: Any = None
) -> Dict[str, Any]:
    """What ``host``'s container needs on the Kubernetes target for its planned devices.

    The same decisions as :func:`serving` (the rpc-server's ``-d`` list, the environment, the
    build's backend checked against the plan), in a container's terms: ``args`` the rpc-server's
    extra arguments, ``env`` [{name, value}] sorted by name, ``limits`` {resource: count} of the
    device plugins' resources (``resources`` overrides K8S_GPU_RESOURCES per backend; a device of
    type ``cpu``, as lavapipe, asks for none), ``backend`` the GPU backend or None, ``gpu``.
    """
    done = serving(plan, host, flavour, env)
    parsed: Plan = plan if isinstance(plan, Plan) else parse(plan)
    row = parsed.host(host)
    table = dict(K8S_GPU_RESOURCES)
    if resources:
        if not isinstance(resources, Mapping):
            raise ServingError(
                "llama_rpc_k8s_gpu_resources must map a backend to a resource, got %r" % (resources,)
            )
        table.update({str(k): str(v) for k, v in resources.items()})
    limits: Dict[str, int] = {}
    backends = sorted({d.backend for d in row.gpu_devices}) if row else []
    for device in row.gpu_devices if row else ():
        if device.type == "cpu":
            continue
        resource = table.get(device.backend)
        if not resource:
            raise ServingError(
                "%s: the plan puts layers on %s (%s) but no Kubernetes resource is known for %s "
                "(llama_rpc_k8s_gpu_resources)" % (host, device.name, device.backend, device.backend)
            )
        limits[resource] = limits.get(resource, 0) + 1
    values = check_env(env, host)
    return {
        "args": done["args"],
        "env": [{"name": k, "value": values[k]} for k in sorted(values)],
        "limits": dict(sorted(limits.items())),
        "backend": backends[0] if len(backends) == 1 else ("+".join(backends) or None),
        "gpu": done["gpu"],
        "devices": done["devices"],
    }

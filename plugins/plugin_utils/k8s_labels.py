# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes node labels and taints computed from the probe fact, the plan and the inventory.

Pure functions, no Ansible imports: the ``k8s_*`` filters and the ``k3s`` / ``node_labels``
roles call them, and tests/unit/plugins/module_utils/test_k8s_labels.py checks them.

Labels written here:

- ``llmfleet.io/arch``: the host's Kubernetes architecture (``kube_arch`` of ``llmfleet_host``);
- ``llmfleet.io/role``: ``head`` or ``worker`` (the plan's role, else the inventory's);
- ``llmfleet.io/rpc``: ``"true"`` on hosts that hold layers in the plan (the rpc-server
  DaemonSet selects on it); absent elsewhere;
- ``llmfleet.io/usable-mib``: the probe's ``memory.usable_mib`` as a whole number;
- ``feature.node.kubernetes.io/cpu-cpuid.<NAME>: "true"`` for each ISA feature, named the way
  Node Feature Discovery names CPUID flags (``AVX512F``, ``AVX512VNNI``, ``ASIMD``, ...).
"""

from __future__ import absolute_import, division, print_function

import json
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import ROLES, HostPlan, PlanError, parse

__metaclass__ = type

LABEL_PREFIX = "llmfleet.io/"
NFD_CPUID_PREFIX = "feature.node.kubernetes.io/cpu-cpuid."
MANAGED_ANNOTATION = "llmfleet.io/managed-labels"
DEDICATED_TAINT_KEY = "llmfleet.io/dedicated"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# The probe's normalised ISA names -> Node Feature Discovery's cpuid flag names.
ISA_TO_NFD: Dict[str, str] = {
    # x86
    "avx": "AVX",
    "avx2": "AVX2",
    "fma": "FMA3",
    "f16c": "F16C",
    "avx_vnni": "AVXVNNI",
    "avx512f": "AVX512F",
    "avx512bw": "AVX512BW",
    "avx512vl": "AVX512VL",
    "avx512_vnni": "AVX512VNNI",
    "avx512_bf16": "AVX512BF16",
    "amx_tile": "AMXTILE",
    "amx_int8": "AMXINT8",
    "amx_bf16": "AMXBF16",
    # arm
    "neon": "ASIMD",
    "dotprod": "ASIMDDP",
    "i8mm": "I8MM",
    "bf16": "BF16",
    "sve": "SVE",
    "sve2": "SVE2",
    "sme": "SME",
}

# Kubernetes label syntax (apimachinery validation): an optional DNS-subdomain prefix and a
# name of at most 63 characters; values of at most 63 characters, possibly empty.
_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# Labels in the kubernetes.io / k8s.io namespaces a kubelet may set on its own Node
# (NodeRestriction); every other label in those namespaces must be set through the API.
_KUBELET_ALLOWED = (
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
)
_KUBELET_ALLOWED_PREFIXES = ("kubelet.kubernetes.io/", "node.kubernetes.io/")
# Computed labels that change with the plan or with free memory: written through the API by the
# node_labels role, never into a kubelet's registration config (a change there would restart k3s).
VOLATILE_LABELS = (LABEL_PREFIX + "rpc", LABEL_PREFIX + "usable-mib")


class LabelError(ValueError):
    """A label, taint or input that cannot become valid Kubernetes node metadata."""


def _where(host: str) -> str:
    return "host {0}: ".format(host) if host else ""


def validate_label(key: str, value: str, host: str = "") -> None:
    """Raise LabelError when ``key=value`` is not a valid Kubernetes label."""
    if not isinstance(key, str) or not key:
        raise LabelError("{0}label key {1!r} is not a non-empty string".format(_where(host), key))
    if not isinstance(value, str):
        raise LabelError(
            "{0}label {1}: value {2!r} must be a string (quote true/false/numbers)".format(
                _where(host), key, value
            )
        )
    prefix, sep, name = key.rpartition("/")
    if sep and (
        not prefix or len(prefix) > 253 or not all(_DNS_LABEL_RE.match(p) for p in prefix.split("."))
    ):
        raise LabelError(
            "{0}label key {1!r}: prefix {2!r} is not a DNS subdomain".format(_where(host), key, prefix)
        )
    if len(name) > 63 or not _NAME_RE.match(name):
        raise LabelError(
            "{0}label key {1!r}: name {2!r} must be 1-63 characters of [A-Za-z0-9-_.], "
            "starting and ending with an alphanumeric".format(_where(host), key, name)
        )
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise LabelError(
            "{0}label {1}: value {2!r} must be at most 63 characters of [A-Za-z0-9-_.], "
            "starting and ending with an alphanumeric".format(_where(host), key, value)
        )


def _host_entry(plan: Optional[Mapping[str, Any]], name: str) -> Optional[HostPlan]:
    if not plan:
        return None
    try:
        return parse(plan).host(name)
    except PlanError as exc:
        raise LabelError("{0}{1}".format(_where(name), exc)) from exc


def holds_layers(entry: Optional[HostPlan]) -> bool:
    """True when a plan host is a worker that holds repeating layers or the output layer."""
    if entry is None or entry.role != "worker":
        return False
    return entry.layer_count > 0 or entry.output_layer


def node_labels(
    host_fact: Mapping[str, Any],
    name: str,
    plan: Optional[Mapping[str, Any]] = None,
    role: Optional[str] = None,
    extra: Optional[Mapping[str, Any]] = None,
) -> Dict[str, str]:
    """The labels a node should carry.

    ``host_fact`` is the probe's ``llmfleet_host``; ``name`` the inventory name (to find the
    host in ``plan['hosts']``); ``role`` the inventory role (``head`` / ``worker`` / None), used
    when the plan does not list the host; ``extra`` labels from the inventory, which may add
    labels but not override the computed ``llmfleet.io/`` ones.
    """
    if not isinstance(host_fact, Mapping):
        raise LabelError(
            "{0}llmfleet_host is missing or not a mapping: run the probe first".format(_where(name))
        )
    labels: Dict[str, str] = {}
    arch = host_fact.get("kube_arch")
    if not arch:
        raise LabelError("{0}llmfleet_host has no kube_arch".format(_where(name)))
    labels[LABEL_PREFIX + "arch"] = str(arch)

    entry = _host_entry(plan, name)
    plan_role = entry.role if entry else None
    chosen_role = plan_role or role
    if chosen_role is not None:
        if chosen_role not in ROLES:
            raise LabelError(
                "{0}role {1!r} is not one of {2}".format(_where(name), chosen_role, ", ".join(ROLES))
            )
        labels[LABEL_PREFIX + "role"] = chosen_role
    if holds_layers(entry):
        labels[LABEL_PREFIX + "rpc"] = "true"

    usable = (host_fact.get("memory") or {}).get("usable_mib")
    if usable is not None:
        try:
            usable_int = int(usable)
        except (TypeError, ValueError) as exc:
            raise LabelError(
                "{0}memory.usable_mib {1!r} is not a number".format(_where(name), usable)
            ) from exc
        if usable_int < 0:
            raise LabelError("{0}memory.usable_mib {1!r} is negative".format(_where(name), usable))
        labels[LABEL_PREFIX + "usable-mib"] = str(usable_int)

    for feature in host_fact.get("isa") or []:
        flag = ISA_TO_NFD.get(str(feature))
        if flag is None:
            # A feature we have no NFD name for: keep the probe's name, upper-cased.
            flag = re.sub(r"[^A-Za-z0-9]", "", str(feature)).upper()
            if not flag:
                continue
        labels[NFD_CPUID_PREFIX + flag] = "true"

    for key, value in (extra or {}).items():
        if key in labels and key.startswith(LABEL_PREFIX):
            raise LabelError(
                "{0}inventory label {1} would override the computed value {2!r}".format(
                    _where(name), key, labels[key]
                )
            )
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = str(value)
        labels[key] = value

    for key, value in labels.items():
        validate_label(key, value, name)
    return dict(sorted(labels.items()))


def kubelet_labels(labels: Mapping[str, str]) -> Dict[str, str]:
    """The subset of ``labels`` a kubelet may set on its own Node at registration.

    Drops the volatile ``llmfleet.io/rpc`` and ``llmfleet.io/usable-mib`` (they belong to the
    API, see VOLATILE_LABELS). The NodeRestriction admission plugin refuses kubelet-set labels in the ``kubernetes.io``
    and ``k8s.io`` namespaces except a fixed list; the Node Feature Discovery style labels
    (``feature.node.kubernetes.io/...``) must therefore go through the API (node_labels role).
    """
    kept: Dict[str, str] = {}
    for key, value in labels.items():
        prefix = key.rpartition("/")[0]
        restricted = any(prefix == d or prefix.endswith("." + d) for d in ("kubernetes.io", "k8s.io"))
        if restricted and not (key in _KUBELET_ALLOWED or key.startswith(_KUBELET_ALLOWED_PREFIXES)):
            continue
        if key in VOLATILE_LABELS:
            continue
        kept[key] = value
    return kept


def label_strings(labels: Mapping[str, str]) -> List[str]:
    """Labels in the ``key=value`` form of k3s' ``node-label`` option, sorted by key."""
    return ["{0}={1}".format(key, value) for key, value in sorted(labels.items())]


def node_taints(
    name: str = "",
    dedicated: bool = False,
    extra: Optional[Sequence[Mapping[str, Any]]] = None,
) -> List[Dict[str, str]]:
    """Taints for a node: ``llmfleet.io/dedicated=true:NoSchedule`` when ``dedicated``, plus
    the inventory's own (each ``{key, value, effect}``), validated and sorted by key and effect."""
    taints: List[Dict[str, str]] = []
    if dedicated:
        taints.append({"key": DEDICATED_TAINT_KEY, "value": "true", "effect": "NoSchedule"})
    for item in extra or []:
        if not isinstance(item, Mapping) or "key" not in item:
            raise LabelError(
                "{0}taint {1!r} must be a mapping with key, value, effect".format(_where(name), item)
            )
        taint = {
            "key": str(item["key"]),
            "value": "" if item.get("value") is None else str(item.get("value")),
            "effect": str(item.get("effect", "NoSchedule")),
        }
        if taint["effect"] not in TAINT_EFFECTS:
            raise LabelError(
                "{0}taint {1}: effect {2!r} is not one of {3}".format(
                    _where(name), taint["key"], taint["effect"], ", ".join(TAINT_EFFECTS)
                )
            )
        validate_label(taint["key"], taint["value"], name)
        taints.append(taint)
    seen = set()
    unique: List[Dict[str, str]] = []
    for taint in taints:
        ident = (taint["key"], taint["effect"])
        if ident in seen:
            raise LabelError(
                "{0}taint {1}:{2} is given twice".format(_where(name), taint["key"], taint["effect"])
            )
        seen.add(ident)
        unique.append(taint)
    return sorted(unique, key=lambda t: (t["key"], t["effect"]))


def taint_strings(taints: Iterable[Mapping[str, str]]) -> List[str]:
    """Taints in the ``key=value:Effect`` form of k3s' ``node-taint`` option."""
    out = []
    for taint in taints:
        value = taint.get("value") or ""
        out.append("{0}{1}:{2}".format(taint["key"], "=" + value if value else "", taint["effect"]))
    return out


def label_patch(
    current_labels: Optional[Mapping[str, str]],
    current_annotations: Optional[Mapping[str, str]],
    desired: Mapping[str, str],
) -> Dict[str, Any]:
    """A JSON merge patch for a Node's metadata that brings its labels to ``desired``.

    Labels this code set before (listed in the ``llmfleet.io/managed-labels`` annotation) and
    any ``llmfleet.io/`` label that is no longer desired are removed (value None); labels set by
    others are left alone. Returns ``{}`` when nothing would change.
    """
    current = dict(current_labels or {})
    annotations = dict(current_annotations or {})
    previously: List[str] = []
    raw = annotations.get(MANAGED_ANNOTATION)
    if raw:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = []
        if isinstance(loaded, list):
            previously = [str(k) for k in loaded]
    labels: Dict[str, Optional[str]] = {}
    for key, value in desired.items():
        if current.get(key) != value:
            labels[key] = value
    owned = set(previously) | {k for k in current if k.startswith(LABEL_PREFIX)}
    for key in sorted(owned):
        if key in current and key not in desired:
            labels[key] = None
    managed = json.dumps(sorted(desired), separators=(",", ":"))
    metadata: Dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict(sorted(labels.items()))
    if annotations.get(MANAGED_ANNOTATION) != managed:
        metadata["annotations"] = {MANAGED_ANNOTATION: managed}
    return {"metadata": metadata} if metadata else {}

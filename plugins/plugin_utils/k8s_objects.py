# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The objects a role hands to llmfleet.cluster.k8s_objects, checked and put in apply order (pure).

Every Kubernetes target writes its objects through that one role (render into files, or apply
server-side): llama_rpc and chat_ui hand it their rendered templates (``content``, YAML text),
vllm_lws its Python-built objects (``object``, a dict). Here each entry gets its parsed object, its
kind and name, whether it is a Secret (written 0600, applied with no_log) and whether it is
written when rendering (``render``; chat_ui's Namespace is applied only), and the list is ordered
as the cluster needs it: Namespaces, then Secrets, then the rest (each group in the given order).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import yaml


class ObjectsError(ValueError):
    """An entry the role cannot write or apply; the message names the entry and the value."""


def _entry(index, raw):
    where = "k8s_objects: manifest {0}".format(index)
    if not isinstance(raw, dict):
        raise ObjectsError("{0} is not a dict: {1!r}".format(where, raw)[:300])
    name = raw.get("file")
    if not isinstance(name, str) or not name or "/" in name:
        raise ObjectsError("{0}: file must be a plain file name, got {1!r}".format(where, name))
    where = "{0} ({1})".format(where, name)
    has_content, has_object = raw.get("content") is not None, raw.get("object") is not None
    if has_content == has_object:
        raise ObjectsError("{0}: give exactly one of content (YAML text) or object (a dict)".format(where))
    if has_content:
        if not isinstance(raw["content"], str):
            raise ObjectsError(
                "{0}: content must be YAML text, got {1!r}".format(where, raw["content"])[:300]
            )
        try:
            obj = yaml.safe_load(raw["content"])
        except yaml.YAMLError as exc:
            raise ObjectsError("{0}: content is not YAML: {1}".format(where, exc)) from exc
    else:
        obj = raw["object"]
    if not isinstance(obj, dict) or not obj.get("kind") or not (obj.get("metadata") or {}).get("name"):
        raise ObjectsError(
            "{0}: not a Kubernetes object with a kind and a metadata.name: {1!r}".format(where, obj)[:300]
        )
    kind = str(obj["kind"])
    secret = raw.get("secret", kind == "Secret")
    render = raw.get("render", True)
    for key, value in (("secret", secret), ("render", render)):
        if not isinstance(value, bool):
            raise ObjectsError("{0}: {1} must be true or false, got {2!r}".format(where, key, value))
    if kind == "Secret" and not secret:
        raise ObjectsError(
            "{0}: a Secret must be flagged secret (it is written 0600, logged never)".format(where)
        )
    return {
        "file": name,
        "kind": kind,
        "name": str(obj["metadata"]["name"]),
        "label": "{0} {1}".format(kind, name),
        "secret": secret,
        "render": render,
        "content": raw["content"] if has_content else None,
        "object": obj,
    }


def apply_order(entries):
    """The entries checked, each with its object, kind, name and flags, in apply order."""
    if not isinstance(entries, list):
        raise ObjectsError("k8s_objects: the manifests must be a list, got {0!r}".format(entries)[:300])
    out = [_entry(index, raw) for index, raw in enumerate(entries)]
    files = [e["file"] for e in out]
    twice = sorted({f for f in files if files.count(f) > 1})
    if twice:
        raise ObjectsError("k8s_objects: file names given twice: {0}".format(", ".join(twice)))

    def stage(entry):
        return 0 if entry["kind"] == "Namespace" else 1 if entry["secret"] else 2

    return sorted(out, key=stage)  # sorted() is stable: the given order within each group


def stale_files(found, entries, manifest_dir):
    """The paths of earlier renders (``found``) that this render no longer writes."""
    keep = {e["file"] for e in entries if e.get("render", True)}
    prefix = manifest_dir.rstrip("/") + "/"
    return sorted(p for p in found if not (p.startswith(prefix) and p[len(prefix) :] in keep))

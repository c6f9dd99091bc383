# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One RPC protocol for the whole fleet: the llama.cpp builds chosen for the head and the workers.

Each host installs the build of its own flavour (``ubuntu-x64`` on an x86_64 host, ``ubuntu-arm64``
on an arm64 one, ``source`` where no release fits: docs/artifacts.md). Those are different files,
and llama-server on the head talks to every worker's rpc-server: the head refuses a worker whose
protocol it does not speak (``negotiate_hello`` in ggml/src/ggml-rpc/ggml-rpc.cpp: the same major
version, a minor no higher than the head's own; :func:`artifacts.rpc_compatible`), and then aborts
at start. :func:`check_fleet` finds that on the controller, before any host is touched, from the
release table's ``rpc_proto`` of each host's entry:

- a worker whose recorded version the head's does not accept is refused, naming both hosts, their
  flavours, builds and versions;
- one build tag for every host is one source tree, so entries without ``rpc_proto`` are taken to
  agree; a fleet whose hosts use more than one tag must record ``rpc_proto`` for every entry (a
  lock does: docs/lock.md), or it is refused naming the entries that lack it;
- a host with no build or no entry for its flavour is left to the llama_cpp role, which refuses it
  with its own message (what-if planning needs no release table).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from typing import Any, Dict, Mapping, Optional, Sequence

from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    ArtifactError,
    ReleaseLookupError,
    rpc_compatible,
    select_release,
)

RULE = (
    "llama-server accepts an rpc-server of its own major RPC protocol version and a minor no higher "
    "than its own (ggml-rpc.cpp, negotiate_hello)"
)


class RpcProtoMismatch(ValueError):
    """The fleet's builds do not speak one RPC protocol; the message names hosts, flavours, versions."""


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> Dict[str, Any]:
    """``base`` combined recursively with ``over`` (``over`` wins), as Jinja's ``combine(recursive=true)``."""
    merged: Dict[str, Any] = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _get(hostvars: Any, key: str) -> Any:
    try:
        return hostvars[key]
    except (KeyError, TypeError):
        return None


def host_flavour(hostvars: Any) -> str:
    """The llama.cpp flavour the llama_cpp role will install on a host ("" when not known), read
    the way the role reads it: the host's ``llama_cpp_flavour``, else the probe's
    ``llmfleet_host.backends.llama_cpp.flavour``. ``hostvars`` is that host's variables."""
    flavour = _get(hostvars, "llama_cpp_flavour")
    if not flavour:
        fact = _get(hostvars, "llmfleet_host") or {}
        backend = ((fact.get("backends") or {}) if isinstance(fact, Mapping) else {}).get("llama_cpp") or {}
        flavour = backend.get("flavour") if isinstance(backend, Mapping) else None
    return str(flavour) if flavour else ""


def host_build(name: str, hostvars: Any, lock_releases: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The build the llama_cpp role will choose for ``name``: ``{host, build, flavour, rpc_proto,
    entry}`` (``entry`` false when the table has none for it), read the way the role reads it: its
    ``llama_cpp_build``, its flavour (:func:`host_flavour`), and the inventory's
    ``llama_cpp_releases`` over the lock's."""
    build = _get(hostvars, "llama_cpp_build")
    flavour = host_flavour(hostvars)
    table = _merge(lock_releases or {}, _get(hostvars, "llama_cpp_releases") or {})
    got: Dict[str, Any] = {
        "host": name,
        "build": str(build) if build not in (None, "") else "",
        "flavour": flavour,
        "rpc_proto": None,
        "entry": False,
    }
    flavours = table.get(got["build"]) if got["build"] and got["flavour"] else None
    if not isinstance(flavours, Mapping) or not isinstance(flavours.get(got["flavour"]), Mapping):
        return got  # no entry: the llama_cpp role refuses it, naming the host
    try:
        entry = select_release(table, got["build"], got["flavour"], name)
    except ReleaseLookupError as err:  # an entry with a malformed sha256 or rpc_proto
        raise RpcProtoMismatch(str(err)) from None
    got.update(rpc_proto=entry["rpc_proto"], entry=True)
    return got


def _show(build: Mapping[str, Any], role: str) -> str:
    if not build.get("entry"):
        return f"{role} {build.get('host')} (no release table entry)"
    version = build["rpc_proto"] or "not recorded"
    return f"{role} {build['host']} ({build['flavour']}, {build['build']}): {version}"


def check_fleet(head: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Refuse (:class:`RpcProtoMismatch`) a fleet whose builds do not speak one RPC protocol.

    ``head`` and ``workers`` are :func:`host_build` results. Returns ``{checked, builds, rpc_proto}``:
    the hosts compared, the distinct build tags, and each host's version (None: not recorded).
    """
    hosts = [b for b in [head, *workers] if b.get("entry")]
    tags = sorted({b["build"] for b in hosts})
    unknown = [b for b in hosts if not b.get("rpc_proto")]
    if len(tags) > 1 and unknown:
        raise RpcProtoMismatch(
            "the llama.cpp builds of this fleet cannot be shown to speak one RPC protocol: its hosts use "
            f"builds {', '.join(tags)}, and the release table records no rpc_proto for "
            + "; ".join(f"{b['host']} ({b['flavour']}, {b['build']})" for b in unknown)
            + ". Use one llama_cpp_build for every host, or record each entry's rpc_proto "
            "(llama_cpp_releases[build][flavour].rpc_proto, e.g. '7.0.0', from the build's "
            "ggml/include/ggml-rpc.h; playbooks/lock.yml records it)"
        )
    known_workers = [b for b in workers if b.get("entry") and b.get("rpc_proto")]
    fix = (
        f". {RULE}: pin builds of one protocol for every host's flavour (one llama_cpp_build, every "
        "flavour built from the same source)"
    )
    if head.get("entry") and head.get("rpc_proto"):
        try:
            bad = [w for w in known_workers if not rpc_compatible(head["rpc_proto"], w["rpc_proto"])]
        except ArtifactError as err:
            raise RpcProtoMismatch(str(err)) from None
        if bad:
            raise RpcProtoMismatch(
                f"the llama.cpp builds of this fleet do not speak one RPC protocol: {_show(head, 'head')}; "
                "it does not accept " + "; ".join(_show(w, "worker") for w in bad) + fix
            )
    elif len({str(w["rpc_proto"]).split(".", maxsplit=1)[0] for w in known_workers}) > 1:
        # The head's version is not recorded (one build tag, see above): the workers must at least
        # share one major, the head's.
        raise RpcProtoMismatch(
            f"the llama.cpp builds of this fleet do not speak one RPC protocol: {_show(head, 'head')}; "
            "the workers differ in major version: "
            + "; ".join(_show(w, "worker") for w in known_workers)
            + fix
        )
    return {
        "checked": [b["host"] for b in hosts],
        "builds": tags,
        "rpc_proto": {b["host"]: b["rpc_proto"] for b in hosts},
    }


def check_hosts(
    head: str, workers: Sequence[str], hostvars: Any, lock_releases: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
    """:func:`check_fleet` for inventory hosts (the plan role's preflight)."""
    try:
        head_vars = hostvars[head]
    except KeyError:
        raise RpcProtoMismatch(f"host {head} is not in the inventory") from None
    builds = []
    for name in workers:
        try:
            builds.append(host_build(name, hostvars[name], lock_releases))
        except KeyError:
            raise RpcProtoMismatch(f"host {name} is not in the inventory") from None
    return check_fleet(host_build(head, head_vars, lock_releases), builds)

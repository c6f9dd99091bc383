# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus file_sd target lists for one fleet, from the plan."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional


class MonitoringError(Exception):
    """A plan the target lists cannot be built from."""


def scrape_targets(
    plan: Mapping[str, object],
    api_port: int = 8080,
    node_port: int = 9100,
    fleet: str = "llmfleet",
    addresses: Optional[Mapping[str, str]] = None,
) -> Dict[str, List[Dict[str, object]]]:
    """file_sd content per job: ``llama-server`` / ``vllm`` (the head) and ``node`` (every plan host).

    The head's API is scraped as llama-server for the ``llama_cpp`` backend and as vLLM for
    ``vllm``; the other list is empty. Hosts without an ``address`` are named in the error.
    ``addresses`` (host -> address) replaces a host's plan address: with WireGuard the workers'
    plan addresses are tunnel addresses, which a Prometheus outside the tunnel cannot reach.
    """
    hosts = plan.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise MonitoringError("the plan has no list 'hosts'")
    override = {str(k): str(v) for k, v in (addresses or {}).items() if v}
    hosts = [dict(h, address=override.get(str(h.get("name")), h.get("address"))) for h in hosts]
    head = plan.get("head")
    missing = [str(h.get("name")) for h in hosts if not h.get("address")]
    if missing:
        raise MonitoringError("plan hosts without an address: %s" % ", ".join(missing))
    by_name = {str(h["name"]): h for h in hosts}
    if head not in by_name:
        raise MonitoringError("the plan's head %r is not in its hosts" % (head,))
    labels = {"fleet": fleet}
    api = [
        {
            "targets": ["%s:%d" % (by_name[head]["address"], int(api_port))],  # type: ignore[index]
            "labels": dict(labels, host=str(head), role="head"),
        }
    ]
    backend = str(plan.get("backend", "llama_cpp"))
    node = [
        {
            "targets": ["%s:%d" % (h["address"], int(node_port))],
            "labels": dict(labels, host=str(h["name"]), role=str(h.get("role", "worker"))),
        }
        for h in hosts
    ]
    return {
        "llama-server": api if backend != "vllm" else [],
        "vllm": api if backend == "vllm" else [],
        "node": node,
    }

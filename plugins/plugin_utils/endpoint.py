# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a client on the controller reaches a fleet's API: its own entry point.

llama-server listens on the head's ``api_port``; with the fleet-wide ``llmfleet_tls`` it listens
on the head's loopback only and the chat page relays the API on its TLS port (``tls_port``, with
the page's certificate), so a client outside the head must use that front. Controller-only code,
no Ansible import.
"""

from __future__ import annotations

from typing import Dict, Mapping, Union

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import PlanError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import parse as parse_plan


class EndpointError(ValueError):
    """The plan names no address the API can be reached at."""


def api_endpoint(
    plan: Mapping[str, object],
    *,
    tls: bool,
    api_port: int,
    tls_port: int,
    url: str = "",
) -> Dict[str, Union[str, bool]]:
    """``{"url": base URL without /v1, "tls": True when it is https}``.

    ``url`` (the inventory's override) wins as given; else the head's plan address (the typed
    plan's head row, plan.parse) with
    ``https`` and ``tls_port`` when ``tls``, ``http`` and ``api_port`` otherwise.
    """
    if url:
        return {"url": url.rstrip("/"), "tls": url.lower().startswith("https:")}
    try:
        head = parse_plan(plan).head
    except PlanError as exc:
        raise EndpointError("the plan's head cannot be read: %s" % exc) from None
    address = head.address or ""
    if not address:
        raise EndpointError("the plan's head %r has no address in its hosts" % (head.name,))
    if ":" in address and not address.startswith("["):
        address = "[%s]" % address  # IPv6
    scheme, port = ("https", int(tls_port)) if tls else ("http", int(api_port))
    return {"url": "%s://%s:%d" % (scheme, address, port), "tls": bool(tls)}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: api_endpoint
short_description: The URL a client on the controller reaches a fleet's API at (its own entry point)
version_added: 1.1.0
description:
  - Returns, for a plan, the base URL (without C(/v1)) of the fleet's API as a client outside the
    head reaches it - C(http://<head address>:<api_port>), or with O(tls) (the fleet-wide
    C(llmfleet_tls) - llama-server then listens on the head's loopback only and the chat page
    relays the API on its TLS port) C(https://<head address>:<tls_port>); O(url) wins when given.
  - The logic lives in C(plugins/plugin_utils/endpoint.py). A plan whose head has no address
    fails naming it.
options:
  _terms:
    description: The plan (C(llmfleet_plan), docs/plan-format.md).
    type: list
    elements: dict
    required: true
  tls:
    description: The fleet serves its API behind the chat page's TLS front (C(llmfleet_tls)).
    type: bool
    default: false
  api_port:
    description: llama-server's port on the head.
    type: int
    default: 8080
  tls_port:
    description: The chat page's TLS port (C(chat_ui_port)).
    type: int
    default: 8088
  url:
    description: A base URL that wins as given (an inventory's override); empty - computed.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Measure the fleet through its own entry point
  llmfleet.cluster.api_bench:
    url: "{{ lookup('llmfleet.cluster.api_endpoint', llmfleet_plan, tls=llmfleet_tls).url }}"
  delegate_to: localhost
"""

RETURN = r"""
_raw:
  description: One entry per plan - C(url) (the base URL) and C(tls) (true when it is https).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.lookup import LookupBase
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.endpoint import EndpointError, api_endpoint

_OPTIONS = {"tls": False, "api_port": 8080, "tls_port": 8088, "url": ""}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = sorted(set(kwargs) - set(_OPTIONS))
        if unknown:
            raise AnsibleLookupError(
                "llmfleet.cluster.api_endpoint: unknown options %s (known: %s)" % (unknown, sorted(_OPTIONS))
            )
        options = dict(_OPTIONS, **kwargs)
        try:
            return [
                api_endpoint(
                    plan,
                    tls=boolean(options["tls"], strict=False),
                    api_port=int(options["api_port"]),
                    tls_port=int(options["tls_port"]),
                    url=str(options["url"] or ""),
                )
                for plan in terms
            ]
        except (EndpointError, TypeError, ValueError, AttributeError) as e:
            raise AnsibleLookupError("llmfleet.cluster.api_endpoint: %s" % e) from None

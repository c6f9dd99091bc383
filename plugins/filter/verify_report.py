# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: verify_report
short_description: The per-host verify table (CPU, traffic and memory across one request) and its failures
version_added: 1.0.0
description:
  - Turns three C(llmfleet.cluster.host_usage) samples per host (before the idle window, after
    it, after the request) into one row per host - the llama.cpp unit's CPU seconds idle vs
    during the request, the host's CPU seconds, receive / transmit bytes idle vs during the
    request, the unit's memory (current and peak) against the plan's C(predicted_mib.total) -
    and the list of failures.
  - A worker that holds layers in the plan fails when its unit is not running, used less than
    O(min_cpu_seconds) CPU during the request, or moved fewer than O(min_bytes) more bytes during
    the request than during the idle window. The head fails when its unit is not running.
  - The logic lives in C(plugins/module_utils/usage.py).
options:
  _input:
    description: Host name -> list of the three samples (the C(usage) return of C(host_usage)).
    type: dict
    required: true
  plan:
    description: The plan (C(llmfleet_plan)); its C(hosts) give roles, layers and predicted memory.
    type: dict
    required: true
  units:
    description: Plan role (C(head), C(worker)) -> the llama.cpp unit sampled on such hosts.
    type: dict
    required: true
  response:
    description:
      - The JSON body of the chat completion. Tokens/s come from llama-server's own C(timings);
        without them (vLLM) from C(usage.completion_tokens) over O(elapsed).
    type: dict
  elapsed:
    description: Wall time of the request in seconds.
    type: float
  min_cpu_seconds:
    description: Least CPU seconds a worker with layers must use during the request.
    type: float
    default: 0.01
  min_bytes:
    description: Least extra bytes (rx + tx, request window minus idle window) a worker with layers must move.
    type: int
    default: 1024
"""

EXAMPLES = r"""
- name: Build the verify table
  ansible.builtin.set_fact:
    __verify_report: >-
      {{ __verify_samples | llmfleet.cluster.verify_report(plan=llmfleet_plan, units=verify_units,
                                                          response=__verify_response.json) }}
"""

RETURN = r"""
_value:
  description: C(rows) (one dict per host), C(failures) (list of sentences), C(tokens) (server timings) and C(text) (the table).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils.usage import UsageError, report


def verify_report(samples, plan, units, response=None, elapsed=None, min_cpu_seconds=0.01, min_bytes=1024):
    try:
        return report(
            plan,
            samples,
            units,
            response=response,
            elapsed=float(elapsed) if elapsed is not None else None,
            min_cpu_seconds=float(min_cpu_seconds),
            min_bytes=int(min_bytes),
        )
    except UsageError as exc:
        raise AnsibleFilterError("verify_report: {0}".format(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {"verify_report": verify_report}

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: plan_fallback
short_description: The plan entry for the set of workers that still answer
version_added: 1.0.0
description:
  - Looks up, in a plan's C(fallbacks), the entry whose C(workers) equals the given set of
    worker names (in any order). The full set of used workers returns the main placement.
    No split math is done here; the plan computed every entry on the controller.
options:
  _input:
    description: The plan (C(llmfleet_plan)).
    type: dict
    required: true
  workers:
    description: Names of the workers that answer.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Arguments when w2 is down
  ansible.builtin.debug:
    msg: "{{ (llmfleet_plan | llmfleet.cluster.plan_fallback(['w1', 'w3'])).llama_server_args }}"
"""

RETURN = r"""
_value:
  description: The entry (C(ok), C(rpc), C(tensor_split), C(llama_server_args), C(hosts)) or C(ok=false) with a C(reason).
  type: dict
"""

from ansible.errors import AnsibleFilterError


def plan_fallback(plan, workers):
    if not isinstance(plan, dict) or "workers" not in plan:
        raise AnsibleFilterError("plan_fallback: the input is not an llmfleet plan")
    wanted = sorted(str(w) for w in workers)
    if wanted == sorted(plan["workers"]):
        keys = ("hosts", "workers", "rpc", "tensor_split", "llama_server_args")
        entry = {k: plan[k] for k in keys}
        entry["ok"] = True
        return entry
    for entry in plan.get("fallbacks", []):
        if sorted(entry["workers"]) == wanted:
            return entry
    return {
        "workers": wanted,
        "ok": False,
        "reason": "no fallback for workers %s in the plan" % ", ".join(wanted),
    }


class FilterModule(object):
    def filters(self):
        return {"plan_fallback": plan_fallback}

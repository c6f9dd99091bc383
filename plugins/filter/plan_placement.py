# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: plan_placement
short_description: The llmfleet plan for a model layout and a fleet
version_added: 1.0.0
description:
  - Computes the placement of a GGUF model over the head and the candidate RPC workers with
    the collection's placement math (plugins/plugin_utils/placement.py). It picks the fewest hosts that
    fit, the head's RAM first, the output layer where there is room, the exact C(--rpc),
    C(--tensor-split) and C(-ngl) arguments, the predicted MiB per host, a fallback for every
    single lost worker and the vLLM pipeline partition.
  - Under the objective C(speed) (option C(objective); C(auto) picks it when every host carries
    speed figures) it picks, among the placements that fit memory, the one with the least predicted
    time per token (plugins/plugin_utils/speed_search.py) and adds the prediction (C(speed)).
  - When the model does not fit, returns a dict with C(ok=false), the table and the MiB missing per host
    instead of raising, so the calling role can show the table and fail before anything changes.
  - See docs/plan-format.md and docs/planner.md.
options:
  _input:
    description: The model layout, as returned by the M(llmfleet.cluster.gguf_layout) module (C(layout)).
    type: dict
    required: true
  head:
    description: The head, a dict with C(name), C(usable_mib), C(cpus) and optionally C(address), C(reserve_mib).
    type: dict
    required: true
  workers:
    description:
      - Candidate workers, dicts with C(name), C(usable_mib), C(cpus), C(address), C(port), optionally C(reserve_mib), C(speed).
      - C(speed) is a relative speed (a number) or the measured figures
        C({ms_per_layer, rtt_ms, mbit_s}) (the head carries C(ms_per_layer) only).
    type: list
    elements: dict
    default: []
  options:
    description:
      - Placement options, C(context) (default 4096), C(parallel) (1), C(ubatch) (512),
        C(cache_type_k) / C(cache_type_v) (f16), C(output_layer) (auto, worker or head),
        C(link_mbit), C(head_layers) (true), C(min_workers) (0),
        C(objective) (auto, speed or memory; default auto),
        C(llama_cpp_build) (the pinned llama.cpp build; empty - none).
      - C(llama_cpp_build) chooses the memory model's calibration
        (plugins/plugin_utils/calibration.py). A build without one is planned with the nearest
        calibrated build's figures; the plan's C(warnings) say so, naming the build, and the
        filter shows the same text as an Ansible warning.
    type: dict
    default: {}
  reserve_mib:
    description: MiB kept free on every host that sets no C(reserve_mib) of its own.
    type: float
    default: 64
  backend:
    description: The backend recorded in the plan.
    type: str
    choices: [llama_cpp, vllm]
    default: llama_cpp
  target:
    description: The deployment target recorded in the plan.
    type: str
    choices: [systemd, kubernetes, lws]
    default: systemd
extends_documentation_fragment:
  - llmfleet.cluster.plan
"""

EXAMPLES = r"""
- name: Plan
  ansible.builtin.set_fact:
    plan: >-
      {{ layout | llmfleet.cluster.plan_placement(model=llmfleet_model,
         head={'name': 'head1', 'usable_mib': 1500, 'cpus': 2},
         workers=[{'name': 'w1', 'usable_mib': 400, 'cpus': 2, 'address': '10.89.0.3'}],
         options={'context': 4096}) }}
"""

RETURN = r"""
_value:
  description:
    - The plan (docs/plan-format.md), or, when the model does not fit, a dict with C(ok=false),
      C(msg), C(table) (the best attempt's host rows), C(table_text) and C(missing) (MiB per host).
    - The plan's C(llama_cpp) says which build it planned for (C(build)), which calibration it used
      (C(calibration), C(calibrated), C(constants)); C(warnings) lists what the plan doubts.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import PlacementError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_render import render_table
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed_search import make_plan


def plan_placement(
    layout, model, head, workers=None, options=None, reserve_mib=64, backend="llama_cpp", target="systemd"
):
    if not isinstance(layout, dict):
        raise AnsibleFilterError(
            "plan_placement: the input must be a model layout dict, got %r" % type(layout)
        )
    try:
        plan = make_plan(
            layout, model, head, list(workers or []), dict(options or {}), float(reserve_mib), backend, target
        )
    except PlacementError as err:
        return {
            "ok": False,
            "msg": str(err).split("\n", 1)[0],
            "table": err.table,
            "table_text": render_table(err.table) if err.table else "",
            "missing": err.missing,
        }
    except (ValueError, TypeError) as err:
        raise AnsibleFilterError("plan_placement: %s" % err) from err
    for warning in plan.get("warnings") or []:
        Display().warning("plan_placement: %s" % warning)
    return plan


class FilterModule(object):
    def filters(self):
        return {"plan_placement": plan_placement}

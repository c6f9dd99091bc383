# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: plan_keep
short_description: Whether the previous llmfleet plan still stands
version_added: 1.0.0
description:
  - Decides whether the plan of an earlier run (its C(plan.json)) can be kept instead of computing
    a fresh one, so that usable memory moving by a few MiB between runs does not rewrite the plan
    and restart the services.
  - The previous plan stands when it was made from the same inputs (the model by sha256, file and
    size; backend, target, placement options, reserves; the same head and candidate workers with
    the same addresses, ports, cpus and speeds, as recorded in its C(planned_with)) and every host
    it uses still has room for its predicted total (usable now - reserve - predicted total >= 0).
  - The logic is C(keep_previous) in plugins/plugin_utils/placement.py. See docs/planner.md.
options:
  _input:
    description: The previous plan (C(plan.json) parsed), or an empty dict / null when there is none.
    type: raw
    required: true
  layout:
    description: The model layout, as returned by the M(llmfleet.cluster.gguf_layout) module (C(layout)).
    type: dict
    required: true
  head:
    description: The head with its current measurement, as P(llmfleet.cluster.plan_hosts#filter) returns it.
    type: dict
    required: true
  workers:
    description: The candidate workers with their current measurements.
    type: list
    elements: dict
    default: []
  options:
    description: The placement options, as given to P(llmfleet.cluster.plan_placement#filter).
    type: dict
    default: {}
  reserve_mib:
    description: MiB kept free on every host that sets no C(reserve_mib) of its own.
    type: float
    default: 64
  backend:
    description: The backend of this run.
    type: str
    default: llama_cpp
  target:
    description: The deployment target of this run.
    type: str
    default: systemd
extends_documentation_fragment:
  - llmfleet.cluster.plan
"""

EXAMPLES = r"""
- name: Decide whether the previous plan stands
  ansible.builtin.set_fact:
    keep: >-
      {{ previous_plan | llmfleet.cluster.plan_keep(layout=layout, model=llmfleet_model,
         head=head, workers=workers, options={'context': 4096}) }}
"""

RETURN = r"""
_value:
  description:
    - C(keep) (bool), C(reasons) (why it is kept, or why a fresh plan is needed), C(hosts) (the
      previous plan's host rows with the current C(usable_mib) and C(headroom_mib); empty when the
      inputs changed) and C(table) (those rows as a text table).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import keep_previous


def plan_keep(
    previous,
    layout,
    model,
    head,
    workers=None,
    options=None,
    reserve_mib=64,
    backend="llama_cpp",
    target="systemd",
):
    if not isinstance(layout, dict) or not isinstance(model, dict) or not isinstance(head, dict):
        raise AnsibleFilterError("plan_keep: layout, model and head must be dicts")
    try:
        return keep_previous(
            previous,
            layout,
            model,
            head,
            list(workers or []),
            dict(options or {}),
            float(reserve_mib),
            backend,
            target,
        )
    except (KeyError, ValueError, TypeError) as err:
        raise AnsibleFilterError("plan_keep: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"plan_keep": plan_keep}

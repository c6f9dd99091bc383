# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the plan stage (roles/plan; docs/planner.md, docs/plan-format.md).

``plan`` is the role's computation in one step; ``plan_hosts``, ``plan_keep`` and
``plan_placement`` are its parts, for what-if planning and the tests; ``plan_serving`` is what a
host's llama.cpp process needs for the devices the plan gave it (the llama_rpc role's units),
``plan_gpu_workers`` the plan's workers that serve a GPU (the rpc-servers restarted before
llama-server when a plan is served). Thin wrappers over
plugins/plugin_utils/plan_step.py. Each filter's documentation is its sidecar file beside this
one (plugins/filter/<name>.yml: ``ansible-doc -t filter llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import device_serving, plan_step
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.constants import DEFAULT_RPC_PORT
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan import PlanError


def _warn(plan):
    for warning in plan.get("warnings") or []:
        Display().warning("plan_placement: %s" % warning)


def plan(
    layout,
    model,
    head,
    workers,
    hostvars,
    options=None,
    reserve_mib=64,
    backend="llama_cpp",
    target="systemd",
    port=DEFAULT_RPC_PORT,
    profile=None,
    build="",
    previous=None,
    replan=False,
    previous_path="plan.json",
):
    try:
        got = plan_step.run(
            layout,
            model,
            str(head),
            [str(w) for w in workers or []],
            hostvars,
            dict(options or {}),
            float(reserve_mib),
            backend,
            target,
            int(port),
            profile,
            build or "",
            previous or None,
            bool(replan),
            str(previous_path),
        )
    except plan_step.PlanStepError as err:
        raise AnsibleFilterError(str(err)) from err
    if got["computed"] and got["ok"]:
        _warn(got["plan"])
    return got


def plan_hosts(names, hostvars, port=DEFAULT_RPC_PORT, speeds=None):
    try:
        return plan_step.hosts_from_vars(list(names or []), hostvars, port, speeds or None)
    except plan_step.PlanStepError as err:
        raise AnsibleFilterError(str(err)) from err


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
    try:
        return plan_step.keep(previous, layout, model, head, workers, options, reserve_mib, backend, target)
    except plan_step.PlanStepError as err:
        raise AnsibleFilterError(str(err)) from err


def plan_placement(
    layout, model, head, workers=None, options=None, reserve_mib=64, backend="llama_cpp", target="systemd"
):
    try:
        got = plan_step.placement(layout, model, head, workers, options, reserve_mib, backend, target)
    except plan_step.PlanStepError as err:
        raise AnsibleFilterError(str(err)) from err
    _warn(got)
    return got


def plan_gpu_workers(plan):
    try:
        return device_serving.gpu_workers(plan)
    except PlanError as err:
        raise AnsibleFilterError("plan_gpu_workers: %s" % err) from err


def plan_serving(plan, host, flavour=None, env=None):
    try:
        return device_serving.serving(plan, str(host), flavour or None, env)
    except (device_serving.ServingError, PlanError) as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule(object):
    def filters(self):
        return {
            "plan": plan,
            "plan_gpu_workers": plan_gpu_workers,
            "plan_hosts": plan_hosts,
            "plan_keep": plan_keep,
            "plan_placement": plan_placement,
            "plan_serving": plan_serving,
        }

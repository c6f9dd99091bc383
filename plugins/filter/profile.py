# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the measure-and-tune stage (playbooks/profile.yml, playbooks/tune.yml; docs/profile.md, docs/tune.md).

Thin wrappers over plugins/plugin_utils and plugins/module_utils. Each filter's documentation is
its sidecar file beside this one (plugins/filter/<name>.yml: ``ansible-doc -t filter
llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.measuring import (
    MEASURE_LAYERS,
    measuring_request,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.plan_step import PlanStepError, speed_figures
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import (
    ProfileError,
    single_thread_dropin,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile_figures import profile_from_run
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.tune import (
    TuneError,
    decide,
    needs_profile,
    report,
)


def profile_build(
    samples,
    plan,
    timings,
    facts,
    units,
    build,
    model,
    now,
    links=None,
    previous=None,
    moved=None,
    devices=None,
):
    try:
        return profile_from_run(
            samples, plan, timings, facts, units, build, model, now, links, previous, moved, devices
        )
    except ProfileError as err:
        raise AnsibleFilterError("profile_build: %s" % err) from err
    except (TypeError, ValueError, AttributeError) as err:
        raise AnsibleFilterError("profile_build: malformed input: %s" % err) from err


def profile_measuring_plan(
    plan, add=None, layers_each=MEASURE_LAYERS, request=0, quotas=None, output_apart=True, devices=True
):
    try:
        return measuring_request(
            plan, add or [], layers_each, request, quotas, boolean(output_apart), boolean(devices)
        )
    except ProfileError as err:
        raise AnsibleFilterError("profile_measuring_plan: %s" % err) from err
    except (TypeError, ValueError, AttributeError) as err:
        raise AnsibleFilterError("profile_measuring_plan: malformed plan: %s" % err) from err


def profile_rpc_dropin(unit_text, host):
    try:
        return single_thread_dropin(str(unit_text or ""), str(host))
    except ProfileError as err:
        raise AnsibleFilterError("profile_rpc_dropin: %s" % err) from err


def profile_speed(names, head, hostvars, profile=None, build="", model_sha256=""):
    try:
        return speed_figures(
            list(names or []), head, hostvars, profile or None, build or "", model_sha256 or ""
        )
    except PlanStepError as err:
        raise AnsibleFilterError(str(err)) from err


def tune_decide(before, after, speed, layout, min_gain=0.10, previous=None):
    try:
        return decide(before or {}, after or {}, speed or {}, layout or {}, min_gain, previous or None)
    except (TuneError, ValueError) as err:
        raise AnsibleFilterError("tune_decide: %s" % err) from err


def tune_needs_profile(plan, figures, mode="auto", hosts=None):
    try:
        return needs_profile(plan or {}, figures or {}, mode, hosts or ())
    except (TuneError, ValueError) as err:
        raise AnsibleFilterError("tune_needs_profile: %s" % err) from err


def tune_report(decision, before, after, rounds):
    try:
        return report(decision or {}, before or {}, after or {}, list(rounds or []))
    except (TuneError, KeyError, ValueError) as err:
        raise AnsibleFilterError("tune_report: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {
            "profile_build": profile_build,
            "profile_measuring_plan": profile_measuring_plan,
            "profile_rpc_dropin": profile_rpc_dropin,
            "profile_speed": profile_speed,
            "tune_decide": tune_decide,
            "tune_needs_profile": tune_needs_profile,
            "tune_report": tune_report,
        }

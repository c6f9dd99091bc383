# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the verify and bench stages, and the monitoring targets (roles/verify, bench/, roles/monitoring).

Thin wrappers over plugins/plugin_utils and plugins/module_utils. Each filter's documentation is
its sidecar file beside this one (plugins/filter/<name>.yml: ``ansible-doc -t filter
llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils import bench as _bench
from ansible_collections.llmfleet.cluster.plugins.module_utils import usage as _usage
from ansible_collections.llmfleet.cluster.plugins.module_utils.monitoring import MonitoringError
from ansible_collections.llmfleet.cluster.plugins.module_utils.monitoring import (
    scrape_targets as _scrape_targets,
)


def verify_report(
    samples,
    plan,
    units,
    response=None,
    elapsed=None,
    min_cpu_seconds=0.01,
    min_bytes=1024,
    builds=None,
    server_log=None,
):
    try:
        return _usage.report(
            plan,
            samples,
            units,
            response=response,
            elapsed=float(elapsed) if elapsed is not None else None,
            min_cpu_seconds=float(min_cpu_seconds),
            min_bytes=int(min_bytes),
            builds=dict(builds or {}),
            server_log=str(server_log or ""),
        )
    except _usage.UsageError as exc:
        raise AnsibleFilterError("verify_report: {0}".format(exc)) from exc


def bench_report(bench, plan, samples, units):
    try:
        return _bench.report(bench, plan, samples, units)
    except _bench.BenchError as exc:
        raise AnsibleFilterError("bench_report: {0}".format(exc)) from exc


def scrape_targets(plan, api_port=8080, node_port=9100, fleet="llmfleet", addresses=None):
    try:
        return _scrape_targets(
            plan,
            api_port=int(api_port),
            node_port=int(node_port),
            fleet=str(fleet),
            addresses=dict(addresses or {}),
        )
    except MonitoringError as exc:
        raise AnsibleFilterError("scrape_targets: {0}".format(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {
            "verify_report": verify_report,
            "bench_report": bench_report,
            "scrape_targets": scrape_targets,
        }

# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: bench_report
short_description: bench.json content and SVG charts from an api_bench result and per-host memory samples
version_added: 1.0.0
description:
  - Combines the return of C(llmfleet.cluster.api_bench) with one C(llmfleet.cluster.host_usage)
    sample per host into the content of bench.json (summary, settings, per-host memory planned vs
    used vs peak, every request) and small SVG charts - one per host (memory planned vs used)
    and one for tokens/s (median and p95 of output and prompt tokens/s, aggregate throughput).
  - The logic lives in C(plugins/module_utils/bench.py).
options:
  _input:
    description: The registered return of C(llmfleet.cluster.api_bench) (needs C(summary)).
    type: dict
    required: true
  plan:
    description: The plan (C(llmfleet_plan)); its C(hosts) give the predicted memory.
    type: dict
    required: true
  samples:
    description: Host name -> one C(host_usage) sample (its C(usage) return).
    type: dict
    required: true
  units:
    description: Plan role (C(head), C(worker)) -> the llama.cpp unit whose memory is charted.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Build bench.json and the charts
  ansible.builtin.set_fact:
    __bench_report: >-
      {{ __bench_load | llmfleet.cluster.bench_report(plan=llmfleet_plan, samples=__bench_samples,
                                                     units=bench_units) }}
"""

RETURN = r"""
_value:
  description: C(json) (the content of bench.json) and C(charts) (file name -> SVG text).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils.bench import BenchError, report


def bench_report(bench, plan, samples, units):
    try:
        return report(bench, plan, samples, units)
    except BenchError as exc:
        raise AnsibleFilterError("bench_report: {0}".format(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {"bench_report": bench_report}

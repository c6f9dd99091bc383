#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_usage
short_description: Sample a host's CPU seconds, interface bytes and the usage of systemd units
version_added: 1.0.0
description:
  - Reads cgroup and C(/proc) counters under O(root) and returns one sample with the CPU seconds of the
    whole host (the cgroup that holds PID 1, so a container counts only itself), receive and
    transmit bytes of the interfaces whose names match O(interface_pattern), and CPU seconds,
    current and peak memory of each unit in O(units).
  - cgroup v1 (C(cpuacct.usage), C(memory.usage_in_bytes), C(memory.max_usage_in_bytes)) and
    v2 (C(cpu.stat) C(usage_usec), C(memory.current), C(memory.peak)). Where the unit has no
    cgroup of its own in a controller (a container with read-only v1 controllers) the unit's
    processes are summed from C(/proc/PID/stat) and C(/proc/PID/status) and the sample says
    C(source=proc).
  - Two samples make a window; C(llmfleet.cluster.verify_report) turns samples into the verify
    table. The arithmetic lives in C(plugins/module_utils/usage.py).
  - Read-only.
author:
  - llmfleet contributors (@llmfleet)
options:
  root:
    description:
      - Directory under which C(/proc) and C(/sys) are read.
      - Point it at a recorded tree to replay a host (tests, bug reports).
    type: path
    default: /
  units:
    description:
      - systemd system units (with their suffix) to sample. A unit that is not running is
        returned with C(active=false).
    type: list
    elements: str
    default: []
  interface_pattern:
    description:
      - Regular expression (Python C(re.search)) over interface names in C(/proc/net/dev).
        C(lo) never counts.
    type: str
    default: '^(eth|ens|enp|eno|wl|veth).*'
notes:
  - The C(time) of the sample is the host's monotonic clock, so only differences between two
    samples of the same host mean anything.
seealso:
  - name: Verify documentation
    description: docs/verify.md in the collection.
    link: https://example.invalid/llmfleet/cluster/docs/verify.md
extends_documentation_fragment:
  - llmfleet.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the unit names the llama_rpc role installs (llama_rpc_names)
  ansible.builtin.include_role:
    name: llmfleet.cluster.llama_rpc
    tasks_from: names

- name: Sample the worker and its rpc-server
  llmfleet.cluster.host_usage:
    units: ["{{ llama_rpc_names.units.worker }}"]
  register: __usage

- name: Replay a recorded host
  llmfleet.cluster.host_usage:
    root: tests/fixtures/usage/podman-v1-worker
    units: ["{{ llama_rpc_names.units.worker }}"]
  delegate_to: localhost
"""

RETURN = r"""
usage:
  description: One sample.
  returned: success
  type: dict
  contains:
    time:
      description: Monotonic clock of the host, seconds.
      type: float
    cgroup_version:
      description: 1 or 2.
      type: int
    cpu_seconds:
      description: CPU seconds used by the host (its PID 1 cgroup) since it started.
      type: float
    cpu_source:
      description: C(cgroup), or C(proc) when the busy time of C(/proc/stat) was used.
      type: str
    machine:
      description: >-
        The host's architecture as C(uname -m) prints it (C(x86_64), C(aarch64)): the userland's,
        which under qemu-user is the emulated one.
      type: str
    memory_bytes:
      description: Memory charged to the host's cgroup (null on a bare cgroup v2 host, whose root has no counter).
      type: int
    interfaces:
      description: Interface name -> C(rx_bytes), C(tx_bytes).
      type: dict
    units:
      description: >-
        Unit -> C(active), C(cgroup), C(pids), C(cpu_seconds), C(cpu_source), C(memory_bytes),
        C(memory_peak_bytes), C(memory_source).
      type: dict
  sample:
    time: 1234.5
    cgroup_version: 1
    cpu_seconds: 0.853828
    cpu_source: cgroup
    machine: x86_64
    memory_bytes: 71663616
    interfaces: {eth0: {rx_bytes: 2010, tx_bytes: 866}}
    units:
      rpc-server.service:
        active: true
        cpu_seconds: 0.28
        cpu_source: proc
        memory_bytes: 39833600
        memory_peak_bytes: 39833600
        memory_source: proc
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.usage import (
    DEFAULT_INTERFACE_PATTERN,
    UsageError,
    sample,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            units=dict(type="list", elements="str", default=[]),
            interface_pattern=dict(type="str", default=DEFAULT_INTERFACE_PATTERN),
        ),
        supports_check_mode=True,
    )
    try:
        clk_tck = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        clk_tck = 100
    try:
        result = sample(
            root=module.params["root"],
            units=module.params["units"],
            interface_pattern=module.params["interface_pattern"],
            clk_tck=clk_tck,
            now=round(time.monotonic(), 3),
        )
    except UsageError as err:
        module.fail_json(msg="host_usage: %s" % err)
    result["machine"] = os.uname()[4]
    module.exit_json(changed=False, usage=result)


if __name__ == "__main__":
    main()

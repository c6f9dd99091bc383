#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: link_probe
short_description: Round-trip time and throughput each way between the head and its workers
version_added: 1.0.0
description:
  - O(mode=serve) (on a worker) starts a probe server in a detached process that answers only
    clients presenting O(token) and exits after O(deadline) seconds (or when the head is done),
    so nothing stays behind on the host. It returns the port it listens on. Each connection is
    served in its own thread (at most 8 at once, one more is told C(ERR busy)), the request line
    within 5 seconds in all and each operation within its own time plus 10 seconds, so a slow
    client holds one slot for seconds, never the server.
  - O(mode=measure) (on the head) measures each of O(targets) in turn - the median round-trip
    time of O(pings) one-byte exchanges and the throughput each way for O(seconds) - each step
    bounded by O(timeout). A target that does not answer gets C(measured=false) and a
    C(reason) "not measured - <host> (<address>:<port>) - <why>"; the module does not fail.
  - Python 3 standard library only on the hosts; nothing is installed. The logic lives in
    C(plugins/module_utils/link_probe.py). Never run against a what-if host (the playbook leaves
    them out).
author:
  - llmfleet contributors (@llmfleet)
options:
  mode:
    description: C(serve) on a worker, C(measure) on the head.
    type: str
    choices: [serve, measure]
    required: true
  token:
    description: The run token the server accepts and the client presents (the same value for both).
    type: str
    required: true
  bind:
    description: Address the server listens on (O(mode=serve)).
    type: str
    default: 0.0.0.0
  port:
    description: Port the server listens on (O(mode=serve)); 0 takes any free port.
    type: int
    default: 0
  deadline:
    description: Seconds after which the server exits, answered or not (O(mode=serve)).
    type: float
    default: 120
  targets:
    description:
      - The workers to measure (O(mode=measure)), each C(name), C(address), C(port).
      - A target without C(port) (its server did not start) is reported not measured by name.
    type: list
    elements: dict
    default: []
  seconds:
    description: Seconds of transfer in each direction per target.
    type: float
    default: 1.0
  pings:
    description: Round trips timed per target (the median is kept).
    type: int
    default: 5
  timeout:
    description: Seconds each step (connect, answer, transfer end) may take before the target is not measured.
    type: float
    default: 3.0
  max_bytes:
    description: Most bytes one transfer moves (bounds the probe on a very fast link).
    type: int
    default: 1073741824
notes:
  - Check mode - the server is not started and nothing is measured (every target is reported not measured).
"""

EXAMPLES = r"""
- name: Start a probe server on each worker
  llmfleet.cluster.link_probe:
    mode: serve
    token: "{{ probe_token }}"
    deadline: 120
  register: link_server

- name: Measure every worker from the head
  llmfleet.cluster.link_probe:
    mode: measure
    token: "{{ probe_token }}"
    targets:
      - {name: w1, address: 10.0.0.11, port: "{{ hostvars['w1'].link_server.port }}"}
  delegate_to: head
"""

RETURN = r"""
port:
  description: The port the server listens on (O(mode=serve)).
  type: int
  returned: mode is serve and not check mode
pid:
  description: The server's process id (O(mode=serve)).
  type: int
  returned: mode is serve and not check mode
links:
  description: >-
    Host name -> C(measured), C(rtt_ms), C(rtt_ms_min), C(mbit_s_to_host), C(mbit_s_from_host),
    C(mbit_s) (the slower direction), C(seconds), or C(measured=false) and C(reason).
  type: dict
  returned: mode is measure
  sample:
    w1: {measured: true, rtt_ms: 0.21, rtt_ms_min: 0.18, mbit_s_to_host: 941.2, mbit_s_from_host: 933.0, mbit_s: 933.0, seconds: 2.1}
    w2: {measured: false, reason: "not measured: w2 (10.0.0.12:40111): no answer within 3.0 s"}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.link_probe import (
    ProbeError,
    measure,
    quit_server,
    serve_in_background,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["serve", "measure"], required=True),
            token=dict(type="str", required=True, no_log=True),
            bind=dict(type="str", default="0.0.0.0"),
            port=dict(type="int", default=0),
            deadline=dict(type="float", default=120.0),
            targets=dict(type="list", elements="dict", default=[]),
            seconds=dict(type="float", default=1.0),
            pings=dict(type="int", default=5),
            timeout=dict(type="float", default=3.0),
            max_bytes=dict(type="int", default=1 << 30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["mode"] == "serve":
        if module.check_mode:
            module.exit_json(changed=False, msg="check mode: no probe server started")
        if not 0 < p["deadline"] <= 3600:
            module.fail_json(msg="link_probe: deadline %r must be in (0, 3600] seconds" % p["deadline"])
        try:
            port, pid = serve_in_background(p["bind"], p["port"], p["token"], p["deadline"], p["max_bytes"])
        except (OSError, ProbeError) as err:
            module.fail_json(msg="link_probe: cannot listen on %s:%s: %s" % (p["bind"], p["port"], err))
        module.exit_json(changed=False, port=port, pid=pid)
    links = {}
    for target in p["targets"]:
        name = str(target.get("name") or target.get("address"))
        if module.check_mode:
            links[name] = {"host": name, "measured": False, "reason": "not measured: %s: check mode" % name}
            continue
        if not target.get("port"):
            links[name] = {
                "host": name,
                "measured": False,
                "reason": "not measured: %s: no probe server on it (unreachable, or its serve task failed)"
                % name,
            }
            continue
        links[name] = measure(
            name,
            target.get("address"),
            target.get("port"),
            p["token"],
            seconds=p["seconds"],
            pings=p["pings"],
            timeout=p["timeout"],
            max_bytes=p["max_bytes"],
        )
        if target.get("address") and target.get("port"):
            quit_server(target["address"], target["port"], p["token"])
    module.exit_json(changed=False, links=links)


if __name__ == "__main__":
    main()

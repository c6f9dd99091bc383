#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_facts
short_description: Probe what a host can serve an LLM with (ISA, usable memory, accelerators, backends)
version_added: 1.0.0
description:
  - Reads C(/proc), C(/sys) and C(/etc) under O(root) and returns the C(llmfleet_host) fact
    used by the placement planner.
  - Unlike Ansible's own facts it reports the CPU feature flags normalised across x86 and ARM,
    C(MemAvailable) rather than free memory, and the binding cgroup v1 or v2 memory limit, so
    a container or a systemd slice with C(MemoryMax) reports what a model may really take.
  - Decides which llama.cpp build (release asset flavour or C(source)) and which vLLM CPU verdict
    fit the host.
  - Read-only. With O(given) it reads nothing and only checks and summarises an inventory-supplied
    fact (what-if planning for hardware you do not have yet).
author:
  - llmfleet contributors (@llmfleet)
options:
  root:
    description:
      - Directory under which C(/proc), C(/sys), C(/etc) and C(/lib) are read.
      - Point it at a recorded machine tree to replay a machine (tests, bug reports).
    type: path
    default: /
  disk_path:
    description:
      - Path (relative to O(root)) whose filesystem's free space is reported as C(disk_free_mib).
      - When the path does not exist yet its nearest existing parent is used.
    type: str
    default: /
  min_glibc:
    description:
      - The oldest glibc the llama.cpp release binaries run on (they are built on Ubuntu 22.04).
    type: str
    default: "2.35"
  own_processes:
    description:
      - Names (as in C(/proc/<pid>/comm)) of llmfleet's own llama.cpp servers. Their anonymous
        resident memory (C(VmRSS - RssFile) under O(root); their mapped files are page cache,
        available already) is reported as C(memory.reclaimable_mib) and counted as usable, because a
        redeploy replaces these processes; a second run on a serving fleet plans with it.
      - An empty list counts nothing back.
    type: list
    elements: str
    default: [ggml-rpc-server, rpc-server, llama-server]
  llama_cpp_dir:
    description:
      - Directory of the installed pinned llama.cpp build. When it holds an executable
        C(llama-server), the probe runs C(llama-server --list-devices) and its answer is the host's
        device list (C(devices)); otherwise C(vulkaninfo) (a Vulkan flavour), nvidia-smi and sysfs
        predict what the build of the flavour (O(llama_cpp_flavour), else the verdict's) will see. Not run when O(root) is not C(/) (a recorded tree keeps the
        outputs under C(recorded/)).
    type: path
    default: /opt/llmfleet/llama.cpp/current
  llama_cpp_env:
    description:
      - Environment for C(llama-server --list-devices) and C(vulkaninfo), the same the servers run
        with, e.g. C(GGML_VK_VISIBLE_DEVICES=0) for a CPU-type Vulkan device (lavapipe), which
        llama.cpp skips unless told (the prediction from C(vulkaninfo) follows it the same way).
    type: dict
    default: {}
  llama_cpp_flavour:
    description:
      - The llama.cpp flavour this host will install when the inventory chooses it
        (the C(llama_cpp_flavour) of the C(llmfleet.cluster.llama_cpp) role), e.g. C(ubuntu-vulkan-x64)
        on a host whose only Vulkan device is lavapipe, where the verdict keeps the CPU flavour.
      - Until a build is installed the devices are predicted for it; for a Vulkan flavour from
        C(vulkaninfo) (with O(llama_cpp_env)'s C(GGML_VK_VISIBLE_DEVICES), as llama.cpp chooses)
        where it is installed, else from nvidia-smi and sysfs. Empty or unset, the verdict's.
      - The fact's C(backends.llama_cpp) stays the verdict.
    type: str
  given:
    description:
      - An inventory-supplied C(llmfleet_host) to check and summarise instead of probing.
      - It must carry at least C(arch), C(cpus), C(memory.usable_mib), C(backends.llama_cpp.status)
        and C(backends.vllm_cpu.status); C(devices), when present, must have the probe's shape
        (docs/probe.md). No fact is set; the inventory variable is used as it is.
    type: dict
  host:
    description:
      - The inventory name of the host, named in the errors about a O(given) fact.
    type: str
attributes:
  facts:
    support: full
    description: The module returns its result under C(ansible_facts).
notes:
  - Memory values are MiB, rounded down. C(usable_mib) is the least of C(MemAvailable) and the
    cgroup limit minus the cgroup usage without the file page cache (inactive and active file of
    C(memory.stat), which C(MemAvailable) counts as available too), taken at the level of the
    cgroup hierarchy with the least room, plus C(reclaimable_mib) (what O(own_processes) hold), never more than the cgroup
    limit or C(MemTotal).
seealso:
  - name: The probe documentation
    description: docs/probe.md in the collection.
    link: https://example.invalid/llmfleet/cluster/docs/probe.md
extends_documentation_fragment:
  - llmfleet.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Probe the host
  llmfleet.cluster.host_facts:

- name: Replay a recorded machine
  llmfleet.cluster.host_facts:
    root: tests/fixtures/hosts/graviton3
  delegate_to: localhost

- name: Check a what-if host from the inventory
  llmfleet.cluster.host_facts:
    given: "{{ llmfleet_host }}"
  delegate_to: localhost

- name: Show what the probe found
  ansible.builtin.debug:
    msg: "{{ ansible_facts.llmfleet_host.memory.usable_mib }} MiB usable"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts (not set when O(given) is used).
  returned: success and O(given) is not set
  type: dict
  contains:
    llmfleet_host:
      description:
        - The host fact. Keys include C(hostname), C(addresses) (interface -> IPv4 list),
          C(default_ipv4), C(arch) (uname style, of the userland), C(kernel_arch), C(kube_arch),
          C(machine), C(cpu_model), C(cpu_bogomips), C(isa), C(cpus), C(cpus_online), C(cpu_quota),
          C(numa_nodes), C(memory) (C(total_mib), C(available_mib), C(cgroup_version),
          C(cgroup_limit_mib), C(cgroup_usage_mib) (without page cache), C(cgroup_raw_usage_mib),
          C(reclaimable_mib), C(own_processes), C(usable_mib)), C(accelerators), C(libc),
          C(glibc), C(os) (C(id), C(version), C(name)), C(disk_path), C(disk_free_mib) and
          C(backends) (C(llama_cpp) with C(status), C(flavour), C(flavours), C(reason);
          C(vllm_cpu) with C(status), C(image_arch), C(reason)), C(devices) (llama.cpp's devices in
          its order, the CPU last, each with C(name), C(backend), C(description), C(type), C(memory_total_mib),
          C(memory_free_mib), C(uma), C(source), C(pci_address)) and C(devices_source).
        - See docs/probe.md for the full shape and an example.
      type: dict
      returned: always
      sample:
        arch: x86_64
        kube_arch: amd64
        isa: [avx, avx2, f16c, fma]
        cpus: 2
        memory: {total_mib: 24000, available_mib: 20000, cgroup_version: 1,
                 cgroup_limit_mib: 512, cgroup_usage_mib: 31, cgroup_raw_usage_mib: 280,
                 reclaimable_mib: 0, own_processes: [], usable_mib: 481}
        backends:
          llama_cpp: {status: release, flavour: ubuntu-x64}
          vllm_cpu: {status: limited, image_arch: x86_64}
        devices:
          - {name: CPU, backend: cpu, description: AMD EPYC 7B13, type: cpu, memory_total_mib: 512,
             memory_free_mib: 481, uma: false, source: probe}
        devices_source: predicted for the ubuntu-x64 build (no GPU backend) from sysfs
llmfleet_host:
  description: The probed fact, or the given one when O(given) is used.
  returned: success
  type: dict
summary:
  description: One line describing the host (without its inventory name).
  returned: success
  type: str
  sample: "x86_64  2 cpus  usable 481 MiB (cgroup 512)  isa avx,avx2,f16c,fma  llama_cpp=ubuntu-x64  vllm_cpu=limited"
runnable:
  description: The backends whose verdict is not C(unsupported) (C(llama_cpp), C(vllm_cpu)).
  returned: success
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.devices import (
    COMMAND_TIMEOUT_S,
    command_argv,
    output_limit,
)
from ansible_collections.llmfleet.cluster.plugins.module_utils.hostinfo import (
    HostInfoError,
    check_given,
    probe,
    runnable_backends,
    summary,
)


def live_runner(module, llama_cpp_dir, env):
    """Run the device tools (devices.COMMANDS) on this host: (stdout, None), (None, why) or
    (None, None) when the tool is not installed. Each is bounded by coreutils' timeout."""
    timeout = module.get_bin_path("timeout")

    def run(key):
        argv = command_argv(key, llama_cpp_dir)
        if key == "list_devices":
            if not os.access(argv[0], os.X_OK):
                return None, None
        else:
            found = module.get_bin_path(argv[0])
            if not found:
                return None, None
            argv[0] = found
        if timeout:
            argv = [timeout, str(COMMAND_TIMEOUT_S), *argv]
        rc, out, err = module.run_command(argv, environ_update={str(k): str(v) for k, v in env.items()})
        if rc != 0:
            lines = (err or out or "").strip().splitlines()
            return None, "%s failed (rc %d): %s" % (
                " ".join(command_argv(key, llama_cpp_dir)[:2]),
                rc,
                lines[-1][:200] if lines else "no output",
            )
        return out[: output_limit(key)], None

    return run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            disk_path=dict(type="str", default="/"),
            min_glibc=dict(type="str", default="2.35"),
            own_processes=dict(
                type="list", elements="str", default=["ggml-rpc-server", "rpc-server", "llama-server"]
            ),
            llama_cpp_dir=dict(type="path", default="/opt/llmfleet/llama.cpp/current"),
            llama_cpp_env=dict(type="dict", default={}),
            llama_cpp_flavour=dict(type="str"),
            given=dict(type="dict"),
            host=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    given = module.params["given"]
    if given is not None:
        problems = check_given(given)
        if problems:
            where = "host %s: " % module.params["host"] if module.params["host"] else ""
            module.fail_json(
                msg=where + "the inventory's llmfleet_host is not a probe fact: " + "; ".join(problems)
            )
        module.exit_json(
            changed=False, llmfleet_host=given, summary=summary(given), runnable=runnable_backends(given)
        )
    try:
        fact = probe(
            root=module.params["root"],
            disk_path=module.params["disk_path"],
            min_glibc=module.params["min_glibc"],
            own_processes=module.params["own_processes"],
            run=live_runner(module, module.params["llama_cpp_dir"], module.params["llama_cpp_env"])
            if module.params["root"] == "/"
            else None,
            flavour=module.params["llama_cpp_flavour"] or None,
            env=module.params["llama_cpp_env"],
        )
    except HostInfoError as err:
        module.fail_json(msg=str(err))
    module.exit_json(
        changed=False,
        ansible_facts={"llmfleet_host": fact},
        llmfleet_host=fact,
        summary=summary(fact),
        runnable=runnable_backends(fact),
    )


if __name__ == "__main__":
    main()

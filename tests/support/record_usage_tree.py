#!/usr/bin/env python
"""Record the kernel files that ``llmfleet.cluster.host_usage`` reads into a directory.

Run it on (or inside) a real host, then copy the directory under tests/fixtures/usage/:

    python3 record_usage_tree.py OUT UNIT [UNIT ...]

It copies /proc/1/{mountinfo,cgroup}, /proc/stat, /proc/net/dev, the cgroup counter files of
PID 1's cgroups and of each unit's cgroup, and /proc/PID/{stat,status} of the units'
processes. Standard library only, so it runs on a bare test host.
"""

import os
import sys

FILES = (
    "cpuacct.usage",
    "cpu.stat",
    "memory.usage_in_bytes",
    "memory.max_usage_in_bytes",
    "memory.current",
    "memory.peak",
    "cgroup.procs",
)


def copy(out: str, path: str) -> None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return
    target = os.path.join(out, path.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as handle:
        handle.write(data)


def main(out: str, units: list) -> None:
    for path in ("/proc/1/mountinfo", "/proc/1/cgroup", "/proc/stat", "/proc/net/dev"):
        copy(out, path)
    pids = set()
    for top, _dirs, files in os.walk("/sys/fs/cgroup"):
        depth = top[len("/sys/fs/cgroup") :].count("/")
        if depth > 1 and not any(u in top for u in units):
            continue
        for name in FILES:
            if name in files:
                copy(out, os.path.join(top, name))
        if any(u in top for u in units) and "cgroup.procs" in files:
            with open(os.path.join(top, "cgroup.procs")) as handle:
                pids.update(int(p) for p in handle.read().split())
    for pid in sorted(pids):
        for name in ("stat", "status"):
            copy(out, f"/proc/{pid}/{name}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

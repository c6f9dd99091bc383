"""The verify table's arch, build and buffer columns (plugins/module_utils/usage.py).

The log lines are llama-server's buffer report in the format of the pinned build (seen on the mixed
demo fleet, an x86_64 head with an arm64 worker under qemu-user: docs/testing.md): a worker's RPC
buffers carry its --rpc endpoint, the head's are CPU, CPU_Mapped.
"""

from __future__ import annotations

from ansible_collections.llmfleet.cluster.plugins.module_utils import usage

PLAN = {
    "head": "head",
    "hosts": [
        {"name": "head", "role": "head", "layers": [0, 20], "endpoint": None},
        {"name": "a64", "role": "worker", "layers": [20, 24], "endpoint": "10.90.0.3:50052"},
        {
            "name": "x86",
            "role": "worker",
            "layers": [24, 30],
            "output_layer": True,
            "endpoint": "10.90.0.4:50052",
        },
    ],
}
UNITS = {"head": "u.service", "worker": "u.service"}

FIRST_LOAD = """\
load_tensors:   CPU_Mapped model buffer size =    50.00 MiB
load_tensors: RPC0[10.90.0.3:50052] model buffer size =     9.00 MiB
load_tensors: RPC0[10.90.0.4:50052] model buffer size =    30.00 MiB
llama_kv_cache:        CPU KV buffer size =    10.00 MiB
llama_context:        CPU compute buffer size =    5.00 MiB
"""
LAST_LOAD = """\
load_tensors:   CPU_Mapped model buffer size =    47.44 MiB
load_tensors: RPC0[10.90.0.3:50052] model buffer size =    10.26 MiB
load_tensors: RPC0[10.90.0.4:50052] model buffer size =    29.81 MiB
llama_kv_cache:        CPU KV buffer size =    60.00 MiB
llama_kv_cache: RPC0[10.90.0.3:50052] KV buffer size =    12.00 MiB
llama_kv_cache: RPC0[10.90.0.4:50052] KV buffer size =    18.00 MiB
llama_context: RPC0[10.90.0.3:50052] compute buffer size =    12.88 MiB
llama_context: RPC0[10.90.0.4:50052] compute buffer size =    12.88 MiB
llama_context:        CPU compute buffer size =    8.01 MiB
llama_context:  CPU  output buffer size =     0.19 MiB
"""


def _samples(machines: dict) -> dict:
    def one(t: float, cpu: float, moved: int, machine: str) -> dict:
        return {
            "time": t,
            "cpu_seconds": cpu,
            "machine": machine,
            "interfaces": {"eth0": {"rx_bytes": moved, "tx_bytes": moved}},
            "units": {
                "u.service": {"active": True, "cpu_seconds": cpu, "memory_bytes": 1, "memory_peak_bytes": 1}
            },
        }

    return {
        n: [one(0, 1.0, 0, m), one(10, 1.0, 100, m), one(15, 3.0, 90_000, m)] for n, m in machines.items()
    }


def test_the_last_load_is_the_report_and_lines_around_it_are_ignored() -> None:
    log = (
        "srv  load_model: loading\n"
        + FIRST_LOAD
        + "slot update_slots: id  0\n"
        + LAST_LOAD
        + "srv  log_server_r: 200\n"
    )
    buffers = usage.parse_buffer_report(log)
    assert buffers["RPC0[10.90.0.3:50052]"] == {"model": 10.26, "KV": 12.0, "compute": 12.88}
    assert buffers["CPU_Mapped"] == {"model": 47.44}
    assert buffers["CPU"] == {"KV": 60.0, "compute": 8.01, "output": 0.19}
    assert usage.parse_buffer_report("no report here\n") == {}


def test_each_worker_gets_the_buffers_of_its_own_endpoint_and_the_head_the_rest() -> None:
    buffers = usage.parse_buffer_report(LAST_LOAD)
    head, a64, x86 = PLAN["hosts"]
    assert usage.buffers_of_host(buffers, a64) == {"model": 10.26, "KV": 12.0, "compute": 12.88}
    assert usage.buffers_of_host(buffers, x86) == {"model": 29.81, "KV": 18.0, "compute": 12.88}
    assert usage.buffers_of_host(buffers, head) == {
        "model": 47.44,
        "KV": 60.0,
        "compute": 8.01,
        "output": 0.19,
    }
    # a worker the log does not name (a prefix of another endpoint is not its own) shows nothing
    assert usage.buffers_of_host(buffers, {"role": "worker", "endpoint": "10.90.0.3:5005"}) == {}


def test_the_table_shows_each_hosts_arch_build_and_buffers() -> None:
    samples = _samples({"head": "x86_64", "a64": "aarch64", "x86": "x86_64"})
    builds = {"head": "ubuntu-x64", "a64": "ubuntu-arm64", "x86": "ubuntu-x64"}
    result = usage.report(PLAN, samples, UNITS, builds=builds, server_log=LAST_LOAD)
    assert result["failures"] == []
    rows = {r["host"]: r for r in result["rows"]}
    assert (rows["a64"]["machine"], rows["a64"]["build"]) == ("aarch64", "ubuntu-arm64")
    assert rows["a64"]["buffers_mib"] == {"model": 10.26, "KV": 12.0, "compute": 12.88}
    lines = result["text"].splitlines()
    assert lines[0].split()[-6:] == ["peak/plan", "arch", "build", "buffers", "MiB", "model/KV/compute"]
    a64_line = next(line for line in lines if line.startswith("a64 "))
    assert a64_line.split()[-3:] == ["aarch64", "ubuntu-arm64", "10.3/12.0/12.9"]
    head_line = next(line for line in lines if line.startswith("head "))
    assert head_line.split()[-3:] == ["x86_64", "ubuntu-x64", "47.4/60.0/8.0"]


def test_without_a_log_or_builds_the_columns_are_dashes() -> None:
    result = usage.report(PLAN, _samples({"head": "x86_64", "a64": "aarch64", "x86": "x86_64"}), UNITS)
    x86_line = next(line for line in result["text"].splitlines() if line.startswith("x86 "))
    assert x86_line.split()[-3:] == ["x86_64", "-", "-"]

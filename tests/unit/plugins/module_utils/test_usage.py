"""Tests of the usage parsers and the verify table (plugins/module_utils/usage.py).

The trees under tests/fixtures/usage/ are described in that directory's README.md: the
podman one was recorded with tests/support/record_usage_tree.py inside a systemd host
container on this project's machine (cgroup v1 hybrid); the cgroup v2 one is written by hand
in the kernel's file formats. Expected values below are read off the fixture files by hand.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import usage
from hypothesis import given
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "usage"
V1 = str(FIXTURES / "podman-v1-worker")
V2 = str(FIXTURES / "bare-v2-head")
LIBPOD = "/libpod_parent/libpod-a5133cf3495f75f90e2db50d998ab5c45942e7afdcc6e04698d773df8bfda9e0"


# --------------------------------------------------------------------------- parsers


def test_cpu_seconds_v1_is_nanoseconds() -> None:
    assert usage.cpu_seconds_v1("853828243\n") == pytest.approx(0.853828243)


def test_cpu_seconds_v2_reads_usage_usec_not_user_usec() -> None:
    text = "usage_usec 42500000\nuser_usec 40000000\nsystem_usec 2500000\n"
    assert usage.cpu_seconds_v2(text) == pytest.approx(42.5)


@pytest.mark.parametrize("text", ["user_usec 1\n", "usage_usec x\n", "usage_usec 1 2\n"])
def test_cpu_seconds_v2_rejects_bad_files(text: str) -> None:
    with pytest.raises(usage.UsageError):
        usage.cpu_seconds_v2(text)


def test_cpu_seconds_v1_names_the_file_in_the_error() -> None:
    with pytest.raises(usage.UsageError, match=r"cpuacct\.usage"):
        usage.cpu_seconds_v1("max\n")


def test_proc_stat_busy_excludes_idle_and_iowait() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    text = "cpu  1000 20 300 50000 40 0 10 5 7 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n"
    # 1000 + 20 + 300 + 0 + 10 + 5 = 1335 ticks; guest is already counted in user.
    assert usage.proc_stat_busy_seconds(text, 100) == pytest.approx(13.35)


def test_proc_pid_stat_survives_a_command_name_with_spaces_and_parentheses() -> None:
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 30
    text = "4242 (llama (srv) x) " + " ".join(fields)
    assert usage.proc_pid_cpu_seconds(text, 100) == pytest.approx(3.0)


def test_proc_pid_memory_reads_rss_and_hwm_in_kib() -> None:
    text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n"
    assert usage.proc_pid_memory(text) == (1024 * 1024, 2048 * 1024)


def test_proc_pid_memory_of_a_kernel_thread_is_zero() -> None:
    assert usage.proc_pid_memory("Name:\tkthreadd\nState:\tS\n") == (0, 0)


NET_DEV = (FIXTURES / "bare-v2-head" / "proc" / "net" / "dev").read_text()


def test_net_dev_default_pattern_takes_wired_and_wireless_but_not_lo_or_docker() -> None:
    counters = usage.parse_net_dev(NET_DEV)
    assert counters == {
        "enp3s0": {"rx_bytes": 1288102933, "tx_bytes": 98123877},
        "wlp2s0": {"rx_bytes": 120044, "tx_bytes": 40123},
    }


def test_net_dev_pattern_is_a_regex_and_lo_never_counts() -> None:
    assert set(usage.parse_net_dev(NET_DEV, r"^(docker|lo)")) == {"docker0"}
    assert set(usage.parse_net_dev(NET_DEV, r".*")) == {"enp3s0", "wlp2s0", "docker0"}


def test_net_dev_rejects_a_bad_pattern() -> None:
    with pytest.raises(usage.UsageError, match="not a regular expression"):
        usage.parse_net_dev(NET_DEV, "(eth")


def test_mountinfo_later_mount_hides_the_earlier_one() -> None:
    mounts = usage.parse_mountinfo((FIXTURES / "podman-v1-worker" / "proc" / "1" / "mountinfo").read_text())
    systemd = [m for m in mounts if "name=systemd" in m["controllers"]]
    # podman mounts the container's own name=systemd cgroup read-only, then the whole
    # hierarchy read-write over it: only the second is visible.
    assert len(systemd) == 1
    assert systemd[0]["root"] == "/"
    cpuacct = [m for m in mounts if "cpuacct" in m["controllers"]]
    assert [(m["root"], m["mountpoint"]) for m in cpuacct] == [(LIBPOD, "/sys/fs/cgroup/cpuacct")]


def test_resolve_cgroup_dir_maps_a_path_below_the_mount_root() -> None:
    mounts = [
        {"version": 1, "root": "/a/b", "mountpoint": "/sys/fs/cgroup/memory", "controllers": ["memory"]}
    ]
    assert usage.resolve_cgroup_dir(mounts, "memory", "/a/b/system.slice/x.service") == (
        "/sys/fs/cgroup/memory/system.slice/x.service"
    )
    assert usage.resolve_cgroup_dir(mounts, "memory", "/a/b") == "/sys/fs/cgroup/memory"
    assert usage.resolve_cgroup_dir(mounts, "memory", "/a/bc") is None
    assert usage.resolve_cgroup_dir(mounts, "cpuacct", "/a/b") is None


def test_system_base_strips_init_scope() -> None:
    assert usage.system_base("/init.scope") == "/"
    assert usage.system_base(LIBPOD + "/init.scope") == LIBPOD
    assert usage.system_base(LIBPOD) == LIBPOD


# --------------------------------------------------------------------------- recorded trees


def test_sample_podman_v1_worker() -> None:
    result = usage.sample(V1, ["llmfleet-rpc-server.service", "absent.service"], clk_tck=100, now=5.0)
    assert result["cgroup_version"] == 1
    # the container's own cgroup: sys/fs/cgroup/cpuacct/cpuacct.usage = 853828243 ns
    assert result["cpu_seconds"] == pytest.approx(0.853828)
    assert result["cpu_source"] == "cgroup"
    assert result["memory_bytes"] == 71663616
    assert result["interfaces"] == {"eth0": {"rx_bytes": 2010, "tx_bytes": 866}}
    unit = result["units"]["llmfleet-rpc-server.service"]
    assert unit["active"] is True
    assert unit["cgroup"] == LIBPOD + "/system.slice/llmfleet-rpc-server.service"
    assert unit["pids"] == [96]
    # the v1 controllers are read-only in the container: no per-unit cgroup, so /proc/96:
    # utime 26 + stime 2 ticks, VmRSS = VmHWM = 38900 kB
    assert (unit["cpu_source"], unit["memory_source"]) == ("proc", "proc")
    assert unit["cpu_seconds"] == pytest.approx(0.28)
    assert unit["memory_bytes"] == unit["memory_peak_bytes"] == 38900 * 1024
    assert result["units"]["absent.service"]["active"] is False


def test_sample_bare_v2_head_reads_the_units_own_cgroup() -> None:
    result = usage.sample(V2, ["llmfleet-llama-server.service"], clk_tck=100)
    assert result["cgroup_version"] == 2
    assert result["cpu_seconds"] == pytest.approx(9134.56789)
    assert result["memory_bytes"] is None  # the v2 root cgroup has no memory.current
    unit = result["units"]["llmfleet-llama-server.service"]
    assert unit["pids"] == [812, 845]
    assert (unit["cpu_source"], unit["memory_source"]) == ("cgroup", "cgroup")
    assert unit["cpu_seconds"] == pytest.approx(42.5)
    assert unit["memory_bytes"] == 367001600
    assert unit["memory_peak_bytes"] == 524288000


def test_sample_falls_back_to_proc_stat_when_the_root_has_no_cpu_stat(tmp_path: Path) -> None:
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(V2, tree)
    (tree / "sys" / "fs" / "cgroup" / "cpu.stat").unlink()
    result = usage.sample(str(tree), [], clk_tck=100)
    # cpu  1000 20 300 50000 40 0 10 0 -> 1330 busy ticks
    assert result["cpu_source"] == "proc"
    assert result["cpu_seconds"] == pytest.approx(13.3)


def test_sample_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(usage.UsageError, match=r"proc/1/mountinfo"):
        usage.sample(str(tmp_path))


# --------------------------------------------------------------------------- delta


def _sample(
    t: float, cpu: float, rx: int, tx: int, unit_cpu: float | None, mem: int = 50 * 1024 * 1024
) -> dict:
    units = {}
    if unit_cpu is not None:
        units["u.service"] = {
            "active": True,
            "cpu_seconds": unit_cpu,
            "memory_bytes": mem,
            "memory_peak_bytes": mem * 2,
            "memory_source": "cgroup",
        }
    return {
        "time": t,
        "cpu_seconds": cpu,
        "interfaces": {"eth0": {"rx_bytes": rx, "tx_bytes": tx}},
        "units": units,
    }


def test_delta_subtracts_every_counter() -> None:
    result = usage.delta(_sample(10.0, 5.0, 100, 200, 1.0), _sample(20.5, 7.5, 1100, 1200, 3.25))
    assert result["seconds"] == pytest.approx(10.5)
    assert result["cpu_seconds"] == pytest.approx(2.5)
    assert (result["rx_bytes"], result["tx_bytes"]) == (1000, 1000)
    assert result["units"]["u.service"]["cpu_seconds"] == pytest.approx(2.25)


def test_delta_refuses_a_counter_that_went_backwards() -> None:
    with pytest.raises(usage.UsageError, match=r"u\.service"):
        usage.delta(_sample(0, 5.0, 0, 0, 9.0), _sample(1, 6.0, 0, 0, 1.0))


@given(
    st.floats(0, 1e6),
    st.integers(0, 2**48),
    st.integers(0, 2**48),
    st.floats(0, 1e3),
    st.integers(0, 2**40),
)
def test_delta_is_additive(cpu: float, rx: int, tx: int, step: float, grow: int) -> None:
    a = _sample(0.0, cpu, rx, tx, cpu)
    b = _sample(1.0, cpu + step, rx + grow, tx + 2 * grow, cpu + step)
    c = _sample(2.0, cpu + 2 * step, rx + 3 * grow, tx + 3 * grow, cpu + 2 * step)
    ab, bc, ac = usage.delta(a, b), usage.delta(b, c), usage.delta(a, c)
    assert ab["rx_bytes"] + bc["rx_bytes"] == ac["rx_bytes"]
    assert ab["tx_bytes"] + bc["tx_bytes"] == ac["tx_bytes"]
    assert ab["cpu_seconds"] + bc["cpu_seconds"] == pytest.approx(ac["cpu_seconds"], abs=1e-5)


# --------------------------------------------------------------------------- report

PLAN = {
    "head": "head1",
    "hosts": [
        {"name": "head1", "role": "head", "layers": [0, 0], "predicted_mib": {"total": 240.0}},
        {"name": "w1", "role": "worker", "layers": [0, 9], "predicted_mib": {"total": 100.0}},
        {
            "name": "w2",
            "role": "worker",
            "layers": [9, 18],
            "output_layer": True,
            "predicted_mib": {"total": 200.0},
        },
    ],
}
UNITS = {"head": "u.service", "worker": "u.service"}


def _working(worker_cpu: float = 2.0, worker_bytes: int = 500_000) -> dict:
    """Samples of a fleet where every host works during the request."""
    samples = {}
    for name in ("head1", "w1", "w2"):
        samples[name] = [
            _sample(0.0, 10.0, 1000, 1000, 1.0),
            _sample(10.0, 10.05, 1200, 1100, 1.0),
            _sample(13.0, 10.05 + worker_cpu, 1200 + worker_bytes, 1100 + worker_bytes, 1.0 + worker_cpu),
        ]
    return samples


def test_report_of_a_working_fleet_has_no_failures_and_one_row_per_host() -> None:
    response = {"choices": [], "timings": {"predicted_per_second": 61.5, "predicted_n": 24}}
    result = usage.report(PLAN, _working(), UNITS, response=response, elapsed=9.0)
    assert result["failures"] == []
    assert [r["host"] for r in result["rows"]] == ["head1", "w1", "w2"]
    w2 = result["rows"][2]
    assert w2["layers"] == "9-17+out"
    assert w2["unit_cpu_idle"] == pytest.approx(0.0)
    assert w2["unit_cpu_request"] == pytest.approx(2.0)
    assert (w2["rx_idle"], w2["tx_idle"]) == (200, 100)
    assert (w2["rx_request"], w2["tx_request"]) == (500_000, 500_000)
    # memory: 50 MiB used, 100 MiB peak against 200 MiB planned
    assert (w2["used_mib"], w2["peak_mib"], w2["planned_mib"]) == (50.0, 100.0, 200.0)
    assert w2["used_vs_plan"] == pytest.approx(0.5)
    assert result["tokens"] == {"predicted_per_second": 61.5, "predicted_n": 24, "source": "server"}
    lines = result["text"].splitlines()
    assert lines[0].split()[:3] == ["host", "role", "layers"]
    assert lines[3].split()[0] == "w2"
    assert "61.5 tokens/s" in result["text"]


def test_report_fails_a_worker_that_did_no_work() -> None:
    samples = _working()
    samples["w1"][2]["units"]["u.service"]["cpu_seconds"] = samples["w1"][1]["units"]["u.service"][
        "cpu_seconds"
    ]
    result = usage.report(PLAN, samples, UNITS)
    assert len(result["failures"]) == 1
    assert result["failures"][0].startswith("w1: u.service used 0.000 CPU seconds")


def test_report_fails_a_worker_without_traffic_beyond_idle() -> None:
    samples = _working(worker_bytes=100)  # 200 bytes in the request window vs 300 idle
    result = usage.report(PLAN, samples, UNITS)
    assert [f.split(":")[0] for f in result["failures"]] == ["w1", "w2"]
    assert "no traffic crossed" in result["failures"][0]


def test_report_fails_a_stopped_worker_and_an_unsampled_one() -> None:
    samples = _working()
    for s in samples["w2"]:
        s["units"]["u.service"]["active"] = False
    del samples["w1"]
    result = usage.report(PLAN, samples, UNITS)
    assert result["failures"][0] == "w1: no usage samples (unreachable?)"
    assert "w2: u.service is not running" in result["failures"][1]


def test_report_does_not_fail_a_worker_without_layers_or_an_unplanned_host() -> None:
    plan = copy.deepcopy(PLAN)
    plan["hosts"][1]["layers"] = [0, 0]
    samples = _working()
    samples["w1"][2] = copy.deepcopy(samples["w1"][1])
    samples["w1"][2]["time"] = 13.0
    samples["spare"] = copy.deepcopy(samples["w1"])
    result = usage.report(plan, samples, UNITS)
    assert result["failures"] == []
    assert [r["role"] for r in result["rows"]] == ["head", "worker", "worker", "unused"]


def test_report_needs_plan_hosts() -> None:
    with pytest.raises(usage.UsageError, match="hosts"):
        usage.report({"head": "x"}, {}, {})


def test_tokens_without_server_timings_use_the_wall_time() -> None:
    response = {"usage": {"prompt_tokens": 12, "completion_tokens": 30}}
    assert usage.tokens_from_response(response, elapsed=4.0) == {
        "prompt_n": 12,
        "predicted_n": 30,
        "predicted_per_second": 7.5,
        "source": "wall",
    }
    assert usage.tokens_from_response(None) == {}


def test_report_samples_hosts_outside_the_plan_for_the_worker_unit() -> None:
    samples = _working()
    samples["spare"] = copy.deepcopy(samples["w1"])
    rows = usage.report(PLAN, samples, {"head": "h.service", "worker": "u.service"})["rows"]
    assert [(r["host"], r["unit"]) for r in rows][-1] == ("spare", "u.service")
    assert rows[0]["unit"] == "h.service"


def test_report_compares_request_traffic_with_the_idle_baseline() -> None:
    # 50 kB of SSH chatter in each window and only 500 more bytes during the request:
    # more than min_bytes in absolute terms, but not beyond the idle baseline.
    samples = _working()
    for name in ("w1", "w2"):
        _start, idle, end = samples[name]
        idle["interfaces"]["eth0"] = {"rx_bytes": 1000 + 25_000, "tx_bytes": 1000 + 25_000}
        end["interfaces"]["eth0"] = {"rx_bytes": 26_000 + 25_250, "tx_bytes": 26_000 + 25_250}
    result = usage.report(PLAN, samples, UNITS)
    assert [f.split(":")[0] for f in result["failures"]] == ["w1", "w2"]
    assert "50500 bytes moved during the request vs 50000 idle" in result["failures"][0]
    assert usage.report(PLAN, samples, UNITS, min_bytes=400)["failures"] == []

"""verify's per-device check: llama.cpp's own buffer report (recorded on the pinned Vulkan build
with lavapipe, bench/vulkan_buffers-smollm2.json and bench/vulkan_buffers.json) against a plan's
prediction per device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import usage

ROOT = Path(__file__).resolve().parents[4]
CASES = {
    c["case"]: c for c in json.loads((ROOT / "bench" / "vulkan_buffers-smollm2.json").read_text())["cases"]
}
EP = "127.0.0.1:50300"


def _total(predicted: dict) -> float:
    return round(sum(predicted.values()), 2)


def plan_for(case: dict, swap: bool = False) -> dict:
    """A version 2 plan holding the bench's own prediction per device (the memory model's figures
    recorded beside the report), the worker serving Vulkan0 then CPU as in the run."""
    dev = {d["device"]: d for d in case["devices"]}
    names = [f"RPC0[{EP}]", f"RPC1[{EP}]"]
    if swap:
        names.reverse()
    return {
        "version": 2,
        "head": "head",
        "workers": ["w"],
        "hosts": [
            {
                "name": "head",
                "role": "head",
                "layers": [0, 0],
                "devices": [
                    {
                        "name": "CPU",
                        "report_name": "CPU",
                        "backend": "cpu",
                        "layers": [0, 0],
                        "predicted_mib": {"total": _total(dev["CPU"]["predicted"])},
                    },
                ],
            },
            {
                "name": "w",
                "role": "worker",
                "endpoint": EP,
                "layers": [dev["RPC0"]["layers"][0], dev["RPC1"]["layers"][-1] + 1],
                "devices": [
                    {
                        "name": "Vulkan0",
                        "report_name": names[0],
                        "backend": "vulkan",
                        "layers": [dev["RPC0"]["layers"][0], dev["RPC0"]["layers"][-1] + 1],
                        "predicted_mib": {"total": _total(dev["RPC0"]["predicted"])},
                    },
                    {
                        "name": "CPU",
                        "report_name": names[1],
                        "backend": "cpu",
                        "layers": [dev["RPC1"]["layers"][0], dev["RPC1"]["layers"][-1] + 1],
                        "predicted_mib": {"total": _total(dev["RPC1"]["predicted"])},
                    },
                ],
            },
        ],
    }


def buffers(case: dict) -> dict:
    return usage.parse_buffer_report("\n".join(case["report"]))


@pytest.mark.parametrize(
    "name", ["smollm2 rpc Vulkan0,CPU 1,3", "smollm2 rpc Vulkan0,CPU 3,1", "smollm2 rpc Vulkan0,CPU 1,1"]
)
def test_every_device_of_the_recorded_runs_is_within_the_band(name) -> None:
    case = CASES[name]
    rows, failures = usage.device_buffers(plan_for(case), buffers(case))
    assert failures == []
    assert [(r["host"], r["device"], r["ok"]) for r in rows] == [
        ("head", "CPU", True),
        ("w", "Vulkan0", True),
        ("w", "CPU", True),
    ]
    # the head's CPU_Mapped weights and its logits buffer are the head CPU's
    head = rows[0]["reported_mib"]
    assert head["model"] == pytest.approx(28.69) and head["output"] == pytest.approx(0.19)
    worker_vk = case["devices"][1]["reported"]
    assert rows[1]["reported_total_mib"] == pytest.approx(sum(worker_vk.values()), abs=0.02)


def test_a_wrong_attribution_fails_naming_the_device_and_the_figures() -> None:
    case = CASES["smollm2 rpc Vulkan0,CPU 1,3"]
    rows, failures = usage.device_buffers(plan_for(case, swap=True), buffers(case))
    assert [r["ok"] for r in rows] == [True, False, False]
    assert failures[0].startswith(f"w device Vulkan0 (RPC1[{EP}]): llama.cpp reports 102.3 MiB")
    assert "outside the goal [97.2, 133.7]" in failures[0]


@pytest.mark.parametrize(
    ("planned", "ok"), [(100.0, True), (95.0, True), (94.0, False), (131.0, True), (132.0, False)]
)
def test_the_goal_is_on_the_prediction_never_under_by_more_than_5_percent(planned, ok) -> None:
    """report 100 MiB: the prediction must be in [95, 131] (100 x 0.95, 100 x 1.15 + 16)."""
    plan = {
        "head": "head",
        "hosts": [
            {
                "name": "head",
                "role": "head",
                "devices": [
                    {
                        "name": "CPU",
                        "report_name": "CPU",
                        "backend": "cpu",
                        "layers": [0, 4],
                        "predicted_mib": {"total": planned},
                    }
                ],
            }
        ],
    }
    rows, failures = usage.device_buffers(plan, {"CPU": {"model": 80.0, "KV": 12.0, "compute": 8.0}})
    assert rows[0]["ok"] is ok and bool(failures) is not ok


def test_a_buffer_on_an_unplanned_rpc_device_and_a_silent_device_fail() -> None:
    case = CASES["smollm2 rpc Vulkan0,CPU 1,3"]
    plan = plan_for(case)
    plan["hosts"][1]["devices"][1]["report_name"] = "RPC1[10.0.0.9:50052]"
    _rows, failures = usage.device_buffers(plan, buffers(case))
    assert any(f.startswith(f"RPC1[{EP}]: buffers on a device the plan does not have") for f in failures)
    assert any(f.startswith("w device CPU (RPC1[10.0.0.9:50052]): no buffers") for f in failures)


def test_the_heads_vulkan_host_buffer_is_its_cpus() -> None:
    report = "\n".join(
        [
            "load_tensors:   CPU_Mapped model buffer size =    28.69 MiB",
            "load_tensors:      Vulkan0 model buffer size =    92.10 MiB",
            "llama_kv_cache:      Vulkan0 KV buffer size =    11.25 MiB",
            "sched_reserve:      Vulkan0 compute buffer size =    11.76 MiB",
            "sched_reserve:  Vulkan_Host compute buffer size =     2.76 MiB",
        ]
    )
    plan = {
        "head": "head",
        "hosts": [
            {
                "name": "head",
                "role": "head",
                "devices": [
                    {
                        "name": "CPU",
                        "report_name": "CPU",
                        "backend": "cpu",
                        "layers": [0, 0],
                        "predicted_mib": {"total": 31.44},
                    },
                    {
                        "name": "Vulkan0",
                        "report_name": "Vulkan0",
                        "backend": "vulkan",
                        "layers": [0, 30],
                        "predicted_mib": {"total": 116.35},
                    },
                ],
            }
        ],
    }
    rows, failures = usage.device_buffers(plan, usage.parse_buffer_report(report))
    assert failures == []
    assert rows[0]["reported_total_mib"] == pytest.approx(28.69 + 2.76)
    assert rows[1]["reported_total_mib"] == pytest.approx(92.10 + 11.25 + 11.76)


def test_without_a_report_or_devices_nothing_is_checked() -> None:
    case = CASES["smollm2 rpc Vulkan0,CPU 1,3"]
    assert usage.device_buffers(plan_for(case), {}) == ([], [])
    v1 = plan_for(case)
    for h in v1["hosts"]:
        del h["devices"]
    assert usage.device_buffers(v1, buffers(case)) == ([], [])


def test_the_device_table_is_printed() -> None:
    case = CASES["smollm2 rpc Vulkan0,CPU 1,3"]
    rows = usage.device_buffers(plan_for(case), buffers(case))[0]
    text = usage.render_device_table(rows)
    assert text.splitlines()[0].split()[:3] == ["host", "device", "report"]
    assert f"RPC0[{EP}]" in text and "0-7" in text and "8-30" in text


# bench/vulkan_buffers.json: the tiny-8L runs, each log holding --fit's dry run (every buffer 0.00
# MiB) before the real load
TINY = {c["case"]: c for c in json.loads((ROOT / "bench" / "vulkan_buffers.json").read_text())["cases"]}


def tiny_plan(case: dict, worker_devices: list[str], swap: bool = False) -> dict:
    """A version 2 plan of the recorded run: the head's CPU, the worker's devices as RPC<i>."""
    dev = {d["device"]: d for d in case["devices"]}
    rpc = [d for d in ("RPC0", "RPC1") if d in dev]
    names = [f"{r}[{EP}]" for r in rpc]
    if swap:
        names.reverse()

    def span(d: dict) -> list[int]:
        return [d["layers"][0], d["layers"][-1] + 1] if d["layers"] else [0, 0]

    return {
        "version": 2,
        "head": "head",
        "hosts": [
            {
                "name": "head",
                "role": "head",
                "devices": [
                    {
                        "name": "CPU",
                        "report_name": "CPU",
                        "backend": "cpu",
                        "layers": [0, 0],
                        "predicted_mib": {"total": _total(dev["CPU"]["predicted"])},
                    }
                ],
            },
            {
                "name": "w",
                "role": "worker",
                "endpoint": EP,
                "devices": [
                    {
                        "name": worker_devices[i],
                        "report_name": names[i],
                        "backend": "cpu" if worker_devices[i] == "CPU" else "vulkan",
                        "layers": span(dev[r]),
                        "predicted_mib": {"total": _total(dev[r]["predicted"])},
                    }
                    for i, r in enumerate(rpc)
                ],
            },
        ],
    }


@pytest.mark.parametrize(
    ("name", "worker_devices"),
    [
        ("tiny-8L rpc Vulkan0,CPU 1,1", ["Vulkan0", "CPU"]),
        ("tiny-8L rpc Vulkan0 all", ["Vulkan0"]),
        ("tiny-8L rpc CPU all", ["CPU"]),  # a CPU-only fleet: the head's CPU and the worker's RPC0
    ],
)
def test_the_tiny_runs_verify_from_the_real_load_not_the_dry_run(name, worker_devices) -> None:
    case = TINY[name]
    rows, failures = usage.device_buffers(tiny_plan(case, worker_devices), buffers(case))
    assert failures == []
    assert [r["ok"] for r in rows] == [True] * (1 + len(worker_devices))
    for row, recorded in zip(rows, case["devices"]):
        # the real load's figures (the dry run's 0.00 MiB lines are dropped), CPU_Mapped on the head's CPU
        assert row["reported_total_mib"] == pytest.approx(sum(recorded["reported"].values()), abs=0.02)
        assert row["reported_total_mib"] > 0


def test_a_wrong_attribution_of_the_tiny_split_fails() -> None:
    """The worker's Vulkan0 is RPC0 (layers 0-4, 14.9 MiB reported), its CPU RPC1 (5-8, 12.3 MiB):
    named the other way round, the CPU's prediction (12.3) is under RPC0's report by more than 5 %."""
    case = TINY["tiny-8L rpc Vulkan0,CPU 1,1"]
    rows, failures = usage.device_buffers(tiny_plan(case, ["Vulkan0", "CPU"], swap=True), buffers(case))
    assert [r["ok"] for r in rows] == [True, True, False]
    assert len(failures) == 1
    assert failures[0].startswith(f"w device CPU (RPC0[{EP}]): llama.cpp reports 14.9 MiB")
    assert "the plan predicts 12.3 MiB: outside the goal [14.2, 33.2]" in failures[0]


def test_mmapped_weights_are_shown_not_compared_the_rest_is() -> None:
    """The demo's head (SmolLM2 Q4_1, layers 0-20 on the head's CPU, 21-29 on three RPC workers, the
    pinned build): CPU_Mapped reports the 92.10 MiB file range it maps, above the 73.08 MiB of
    weights the head holds; KV + compute + output (80.70) are compared with KV + compute (81.75)."""
    report = "\n".join(
        [
            "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
            "load_tensors: RPC0[127.0.0.1:50611] model buffer size =     4.23 MiB",
            "llama_context:        CPU  output buffer size =     0.19 MiB",
            "llama_kv_cache:        CPU KV buffer size =    63.00 MiB",
            "llama_kv_cache: RPC0[127.0.0.1:50611] KV buffer size =     6.00 MiB",
            "sched_reserve: RPC0[127.0.0.1:50611] compute buffer size =    15.26 MiB",
            "sched_reserve:        CPU compute buffer size =    17.51 MiB",
        ]
    )
    cpu = {"weights": 73.08, "kv": 63.0, "compute": 18.75, "total": 154.83}
    w = {"weights": 4.23, "kv": 6.0, "compute": 16.5, "total": 26.73}
    plan = {
        "head": "head",
        "hosts": [
            {
                "name": "head",
                "role": "head",
                "devices": [
                    {
                        "name": "CPU",
                        "report_name": "CPU",
                        "backend": "cpu",
                        "layers": [0, 21],
                        "predicted_mib": cpu,
                    }
                ],
            },
            {
                "name": "w",
                "role": "worker",
                "devices": [
                    {
                        "name": "CPU",
                        "report_name": "RPC0[127.0.0.1:50611]",
                        "backend": "cpu",
                        "layers": [21, 23],
                        "predicted_mib": w,
                    }
                ],
            },
        ],
    }
    rows, failures = usage.device_buffers(plan, usage.parse_buffer_report(report))
    assert failures == []
    assert rows[0]["mapped_mib"] == pytest.approx(92.10)
    assert rows[0]["reported_total_mib"] == pytest.approx(80.70)
    assert rows[0]["predicted_mib"] == pytest.approx(81.75)
    assert rows[1]["mapped_mib"] is None and rows[1]["reported_total_mib"] == pytest.approx(25.49)
    assert "+92.1 mapped" in usage.render_device_table(rows)

#!/usr/bin/env python
"""Planner accuracy and capacity against llama.cpp itself (real processes on loopback).

For every case it plans a fleet with llmfleet.cluster's placement math, starts one
ggml-rpc-server per worker on 127.0.0.1 (each in its own cgroup v1 memory group capped at the
worker's usable MiB when the machine allows it), starts llama-server with the plan's exact
arguments and ``-lv 4``, sends one completion, and compares per host:

- predicted: the plan's ``predicted_mib.total`` (weights + KV + compute + process + loading peak);
- actual (the worst case the host reaches): the larger of what llama.cpp reports it allocated
  there (model + KV + compute buffers, from the ``-lv 4`` report keyed by host:port) plus the
  process at rest before loading, and the peak memory of the worker's cgroup (or VmHWM) over
  loading and the request.

Goal per worker: prediction >= 95% of actual, and <= actual x 1.15 + 16 MiB.

Then the Vulkan devices (``--vulkan-bin``, the pinned Vulkan build; ``--no-vulkan`` skips them):
the planner's device plan for a worker offering a lavapipe ``Vulkan0`` and its CPU
(``ggml-rpc-server -d Vulkan0,CPU``), behind a CPU-only head and a head with its own Vulkan0;
every device's buffers in llama.cpp's report against the plan's prediction for that device
(verify's own check, usage.device_buffers: the same goal).

Then the capacity demo: Gemma 3 270M on three capped workers, llama.cpp's default split (which
follows each worker's total RAM and puts the output layer on the last one) against the plan's.

    python bench/planner_accuracy.py [--models DIR] [--bin DIR] [--only NAME] [--json OUT]
        [--objective memory|speed] [--no-capacity] [--vulkan-bin DIR] [--no-vulkan]

``--objective speed`` plans every case with the speed objective (uneven what-if figures per worker):
the memory goal must hold for those placements too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("CACHE", os.path.join(ROOT, ".cache")), "collections"))

import contextlib

import servers  # bench/servers.py: the shared process helpers
from ansible_collections.llmfleet.cluster.plugins.module_utils import usage
from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import PlacementError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed_search import make_plan

MIB = 1024 * 1024
BUF_RE = re.compile(r"(RPC\d+)\[([^\]]+)\]\s+(model|KV|compute) buffer size =\s+([\d.]+) MiB")
CPU_RE = re.compile(r"\s(CPU(?:_Mapped)?|CPU_REPACK)\s+(model|KV|compute) buffer size =\s+([\d.]+) MiB")
BASE_PORT = 50400
SERVER_PORT = 18480

CASES = [
    # name, model file, worker usable MiB (in --rpc candidate order), options
    ("tiny-8L x3", "tiny-llama-8L.gguf", [96, 96, 96], {"context": 2048, "min_workers": 3}),
    ("tiny-13L-q8 x2", "tiny-llama-13L.gguf", [96, 96], {"context": 4096, "min_workers": 2}),
    ("tiny-tied-6L x2", "tiny-llama-tied-6L.gguf", [80, 80], {"context": 4096, "min_workers": 2}),
    ("tiny-bigvocab-4L x2", "tiny-llama-bigvocab-4L.gguf", [80, 80], {"context": 2048, "min_workers": 2}),
    ("gemma3-270m x3", "gemma-3-270m-Q4_K_M.gguf", [200, 200, 450], {"context": 4096, "min_workers": 3}),
    (
        "gemma3-270m x2 np2",
        "gemma-3-270m-Q4_K_M.gguf",
        [160, 480],
        {"context": 8192, "parallel": 2, "min_workers": 2},
    ),
    # The output layer kept on the head (-ot ...=CPU): the workers hold repeating layers only.
    (
        "gemma3-270m x2 output on head",
        "gemma-3-270m-Q4_K_M.gguf",
        [200, 200],
        {"context": 4096, "min_workers": 2, "output_layer": "head"},
    ),
    (
        "tiny-bigvocab-4L x2 output on head",
        "tiny-llama-bigvocab-4L.gguf",
        [80, 80],
        {"context": 2048, "min_workers": 2, "output_layer": "head"},
    ),
]


class Cgroups:
    """cgroup v1 memory groups nested under this process's own group (none when unavailable)."""

    def __init__(self) -> None:
        self.base = None
        try:
            with open("/proc/self/cgroup", encoding="utf-8") as handle:
                for line in handle:
                    _unused, ctrl, path = line.strip().split(":", 2)
                    if "memory" in ctrl.split(","):
                        cand = "/sys/fs/cgroup/memory" + path
                        test = os.path.join(cand, f"llmfleet-bench-{os.getpid()}")
                        os.mkdir(test)
                        self.base = test
        except OSError:
            self.base = None

    def make(self, name: str, limit_mib: int) -> str | None:
        if not self.base:
            return None
        path = os.path.join(self.base, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w", encoding="utf-8") as handle:
            handle.write(str(limit_mib * MIB))
        with open(os.path.join(path, "memory.max_usage_in_bytes"), "w", encoding="utf-8") as handle:
            handle.write("0")
        try:
            with open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w", encoding="utf-8") as handle:
                handle.write(str(limit_mib * MIB))
        except OSError:
            pass
        return path

    @staticmethod
    def peak_mib(path: str | None) -> float | None:
        if not path:
            return None
        with open(os.path.join(path, "memory.max_usage_in_bytes"), encoding="utf-8") as handle:
            return int(handle.read()) / MIB

    @staticmethod
    def oom_killed(path: str | None) -> bool:
        if not path:
            return False
        with open(os.path.join(path, "memory.oom_control"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                    return True
        return False

    def cleanup(self) -> None:
        if not self.base:
            return
        for name in os.listdir(self.base):
            sub = os.path.join(self.base, name)
            if os.path.isdir(sub):
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
        with contextlib.suppress(OSError):
            os.rmdir(self.base)


def parse_report(text: str) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    per: dict[str, dict[str, float]] = {}
    for _dev, endpoint, kind, mib in BUF_RE.findall(text):
        slot = per.setdefault(endpoint, {"model": 0.0, "KV": 0.0, "compute": 0.0})
        slot[kind] += float(mib)
    cpu = {"model": 0.0, "KV": 0.0, "compute": 0.0}
    for _name, kind, mib in CPU_RE.findall(text):
        cpu[kind] += float(mib)
    return per, cpu


def run_fleet(
    binary: str, model_path: str, usable: list[int], args: list[str], tag: str, cg: Cgroups, tmp: str
):
    """Start the workers (capped) and llama-server with ``args``; return measurements."""
    workers = []
    for i, cap in enumerate(usable):
        port = BASE_PORT + i
        group = cg.make(f"{tag}-w{i}", cap)
        log = os.path.join(tmp, f"{tag}-w{i}.log")
        proc = servers.start(
            [os.path.join(binary, "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)],
            log,
            cgroup=group,
            nice=None,
        )
        workers.append({"port": port, "proc": proc, "cgroup": group, "cap": cap, "log": log})
    time.sleep(1.0)
    for w in workers:
        pid = w["proc"].pid
        w["idle_mib"] = servers.status_mib(pid, "VmRSS") or 0.0
    slog = os.path.join(tmp, f"{tag}-server.log")
    head_group = cg.make(f"{tag}-head", 8192)
    server = servers.start(
        [
            os.path.join(binary, "llama-server"),
            "-m",
            model_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(SERVER_PORT),
            "-lv",
            "4",
            *args,
        ],
        slog,
        cgroup=head_group,
        nice=None,
    )
    ok = servers.wait_health(SERVER_PORT, server, interval=0.2)
    text = ""
    if ok:
        try:
            text = servers.complete(SERVER_PORT, n_predict=16, timeout=120)
        except OSError as err:
            ok = False
            text = f"request failed: {err}"
    server_hwm = servers.status_mib(server.pid, "VmHWM")
    for w in workers:
        w["hwm_mib"] = servers.status_mib(w["proc"].pid, "VmHWM")
        w["alive"] = w["proc"].poll() is None
    servers.stop(server)
    head_peak = Cgroups.peak_mib(head_group)
    for w in workers:
        w["peak_mib"] = Cgroups.peak_mib(w["cgroup"])
        w["oom"] = Cgroups.oom_killed(w["cgroup"]) or not w["alive"]
        servers.stop(w["proc"], timeout=10)
    with open(slog, encoding="utf-8", errors="replace") as handle:
        report = handle.read()
    per, cpu = parse_report(report)
    return {
        "ok": ok,
        "text": text,
        "workers": workers,
        "per": per,
        "cpu": cpu,
        "server_hwm": server_hwm,
        "head_peak": head_peak,
        "log": report,
    }


# --objective speed: what-if figures, uneven so that the speed search moves layers (loopback links)
OBJECTIVE = "memory"


def _figures(i: int) -> dict:
    return {"ms_per_layer": 1.0 + 0.75 * i, "rtt_ms": 0.1, "mbit_s": 10000.0}


def local_plan(layout: dict, model_file: str, usable: list[int], options: dict) -> dict:
    head = {"name": "head", "usable_mib": 4096, "cpus": 2, "address": "127.0.0.1"}
    if OBJECTIVE == "speed":
        head["speed"] = {"ms_per_layer": 1.0}
    workers = [
        {
            "name": f"w{i}",
            "usable_mib": cap,
            "cpus": 2,
            "address": "127.0.0.1",
            "port": BASE_PORT + i,
            "reserve_mib": 0,
            **({"speed": _figures(i)} if OBJECTIVE == "speed" else {}),
        }
        for i, cap in enumerate(usable)
    ]
    opts = {"head_layers": False, "objective": OBJECTIVE, **options}
    return make_plan(layout, {"name": model_file, "file": model_file}, head, workers, opts, reserve_mib=0)


def accuracy(args: argparse.Namespace, cg: Cgroups, tmp: str, heads: list[dict]) -> list[dict]:
    rows = []
    for name, model_file, usable, options in CASES:
        if args.only and args.only not in name:
            continue
        path = os.path.join(args.models, model_file)
        if not os.path.exists(path):
            print(f"skip {name}: {path} missing (make test-artifacts)")
            continue
        layout = read_layout(path).to_dict()
        try:
            plan = local_plan(layout, model_file, usable, options)
        except PlacementError as err:
            print(f"skip {name}: the plan refuses: {str(err).splitlines()[0]}")
            continue
        # cap each worker at its usable MiB plus a margin so that a prediction error shows as a
        # number rather than as an OOM kill
        caps = [u + 256 for u in usable]
        res = run_fleet(args.bin, path, caps, plan["llama_server_args"], name.replace(" ", "_"), cg, tmp)
        by_endpoint = {w["port"]: w for w in res["workers"]}
        for h in plan["hosts"][1:]:
            w = by_endpoint[h["port"]]
            rep = res["per"].get(h["endpoint"], {"model": 0.0, "KV": 0.0, "compute": 0.0})
            allocated = rep["model"] + rep["KV"] + rep["compute"] + w["idle_mib"]
            peak = w["peak_mib"] if w["peak_mib"] is not None else (w["hwm_mib"] or 0.0)
            actual = max(allocated, peak)
            pred = h["predicted_mib"]["total"]
            rows.append(
                {
                    "case": name,
                    "host": h["name"],
                    "layers": (
                        (
                            f"{h['layers'][0]}-{h['layers'][1] - 1}"
                            if h["layers"][1] > h["layers"][0]
                            else "none"
                        )
                        + (" + output" if h["output_layer"] else "")
                    ),
                    "pred": pred,
                    "pred_weights": h["predicted_mib"]["weights"],
                    "rep_model": rep["model"],
                    "pred_kv": h["predicted_mib"]["kv"],
                    "rep_kv": rep["KV"],
                    "pred_compute": h["predicted_mib"]["compute"],
                    "rep_compute": rep["compute"],
                    "idle": w["idle_mib"],
                    "peak": peak,
                    "actual": actual,
                    "ok": res["ok"],
                    "within": actual * 0.95 <= pred <= actual * 1.15 + 16,
                }
            )
        head = plan["hosts"][0]
        cpu = res["cpu"]
        head_alloc = cpu["model"] + cpu["KV"] + cpu["compute"]
        heads.append(
            {
                "case": name,
                "pred": head["predicted_mib"]["total"],
                "pred_weights": head["predicted_mib"]["weights"],
                "rep_model": cpu["model"],
                "pred_compute": head["predicted_mib"]["compute"],
                "rep_compute": cpu["compute"],
                "allocated": head_alloc,
                "hwm": res["server_hwm"] or 0.0,
                "cgroup_peak": res["head_peak"] or 0.0,
            }
        )
        print("{}: served={} text={!r}".format(name, res["ok"], res["text"][:40]), flush=True)
    return rows


# name, model, the head's Vulkan0 free MiB (None: a CPU-only head), the worker's Vulkan0 free MiB:
# the worker's rpc-server serves ``-d Vulkan0,CPU`` (lavapipe, GGML_VK_VISIBLE_DEVICES=0); the
# Vulkan devices are small enough that the planner splits the layers between them and the CPU
VULKAN_CASES = [
    ("tiny-8L worker Vulkan0,CPU", "tiny-llama-8L.gguf", None, 14),
    ("tiny-8L head Vulkan0 + worker Vulkan0,CPU", "tiny-llama-8L.gguf", 14, 14),
    ("smollm2 worker Vulkan0,CPU", "SmolLM2-135M-Instruct.Q4_1.gguf", None, 60),
    ("smollm2 head Vulkan0 + worker Vulkan0,CPU", "SmolLM2-135M-Instruct.Q4_1.gguf", 45, 45),
]
VULKAN_RPC_PORT = BASE_PORT + 50


def vulkan(args: argparse.Namespace, tmp: str) -> list[dict]:
    """The planner's device plan (plugins/plugin_utils/device_placement.py through placement's
    plan) on the pinned Vulkan build with lavapipe: every device's buffers from llama.cpp's report
    against the plan's prediction for that device, with verify's own check (usage.device_buffers)."""
    from device_split import device  # bench/device_split.py: a what-if device as the probe lists it

    if not os.path.exists(os.path.join(args.vulkan_bin, "llama-server")):
        print(f"skip the Vulkan cases: no Vulkan build at {args.vulkan_bin} (make vulkan-artifacts)")
        return []
    rpc_cmd = [
        os.path.join(args.vulkan_bin, "ggml-rpc-server"),
        "-H",
        "127.0.0.1",
        "-p",
        str(VULKAN_RPC_PORT),
    ]
    server_cmd = [
        os.path.join(args.vulkan_bin, "llama-server"),
        "--host",
        "127.0.0.1",
        "--port",
        str(SERVER_PORT),
    ]
    server_cmd += ["-m"]
    rows: list[dict] = []
    for name, model_file, head_vk, worker_vk in VULKAN_CASES:
        if args.only and args.only not in name:
            continue
        path = os.path.join(args.models, model_file)
        if not os.path.exists(path):
            print(f"skip {name}: {path} missing (make test-artifacts)")
            continue
        cpu = device("CPU", 4000, "cpu")
        head = {"name": "head", "usable_mib": 4000, "cpus": 2, "gpu_reserve_mib": 0}
        if head_vk is not None:
            head["devices"] = [device("Vulkan0", head_vk), cpu]
        worker = {
            "name": "w",
            "usable_mib": 4000,
            "cpus": 2,
            "address": "127.0.0.1",
            "port": VULKAN_RPC_PORT,
            "gpu_reserve_mib": 0,
            "devices": [device("Vulkan0", worker_vk), cpu],
        }
        layout = read_layout(path).to_dict()
        try:
            plan = placement.plan_llama_cpp(
                layout, head, [worker], {"head_layers": False, "context": 512, "min_workers": 1}
            )
        except PlacementError as err:
            print(f"skip {name}: the plan refuses: {str(err).splitlines()[0]}")
            continue
        offered = ",".join(d["name"] for d in plan["hosts"][1]["devices"])
        tag = name.replace(" ", "_").replace(",", "-")
        rpc = servers.start(
            [*rpc_cmd, "-d", offered, "-t", "1"],
            os.path.join(tmp, f"{tag}-rpc.log"),
            vulkan=True,
        )
        time.sleep(3.0)
        slog = os.path.join(tmp, f"{tag}-server.log")
        server = servers.start(
            [*server_cmd, path, "-t", "1", "-v", "--no-webui", *plan["llama_server_args"]],
            slog,
            vulkan=head_vk is not None,
        )
        try:
            served = servers.wait_health(SERVER_PORT, server)
            text = servers.complete(SERVER_PORT) if served else ""
        finally:
            servers.stop(server)
            servers.stop(rpc)
        with open(slog, encoding="utf-8", errors="replace") as handle:
            report = usage.parse_buffer_report(handle.read())
        checked, failures = usage.device_buffers({"head": "head", "hosts": plan["hosts"]}, report)
        planned = {(h["name"], d["name"]): d for h in plan["hosts"] for d in h.get("devices") or []}
        for row in checked:
            d = planned[(row["host"], row["device"])]
            first, last = d["layers"]
            rep = row["reported_mib"]
            rows.append(
                {
                    "case": name,
                    "host": row["host"],
                    "device": row["device"],
                    "report_name": row["report_name"],
                    "layers": (f"{first}-{last - 1}" if last > first else "none")
                    + (" + output" if d.get("output_layer") else ""),
                    "pred": d["predicted_mib"]["total"],
                    "pred_weights": d["predicted_mib"]["weights"],
                    "rep_model": rep.get("model", 0.0),
                    "pred_kv": d["predicted_mib"]["kv"],
                    "rep_kv": rep.get("KV", 0.0),
                    "pred_compute": d["predicted_mib"]["compute"],
                    "rep_compute": rep.get("compute", 0.0) + rep.get("output", 0.0),
                    "actual": row["reported_total_mib"] or 0.0,
                    "served": served,
                    "within": bool(row["ok"]),
                }
            )
        print(f"{name}: {' '.join(plan['llama_server_args'])}")
        print(f"{name}: served={served} text={text[:40]!r} failures={failures}", flush=True)
    return rows


def vulkan_table(rows: list[dict]) -> str:
    lines = [
        "| case | host | device | report name | layers | predicted | llama.cpp | pred/llama | model pred/llama"
        " | KV pred/llama | compute pred/llama | within goal |",
        "|" + "---|" * 12,
    ]
    for r in rows:
        lines.append(
            "| {} | {} | {} | `{}` | {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} / {:.1f} | {:.1f} / {:.1f}"
            " | {:.1f} / {:.1f} | {} |".format(
                r["case"],
                r["host"],
                r["device"],
                r["report_name"],
                r["layers"],
                r["pred"],
                r["actual"],
                r["pred"] / r["actual"] if r["actual"] else 0,
                r["pred_weights"],
                r["rep_model"],
                r["pred_kv"],
                r["rep_kv"],
                r["pred_compute"],
                r["rep_compute"],
                "yes" if r["within"] and r["served"] else "NO",
            )
        )
    return "\n".join(lines)


def capacity(args: argparse.Namespace, cg: Cgroups, tmp: str) -> list[dict]:
    """Gemma on workers capped 400 / 200 / 120 MiB in that --rpc order: default vs plan."""
    path = os.path.join(args.models, "gemma-3-270m-Q4_K_M.gguf")
    if not os.path.exists(path) or not cg.base:
        print("skip capacity demo: needs the Gemma model and cgroup v1 memory groups")
        return []
    caps = [400, 200, 120]
    layout = read_layout(path).to_dict()
    plan = local_plan(layout, "gemma", caps, {"context": 4096, "min_workers": 3})
    rpc_default = ",".join(f"127.0.0.1:{BASE_PORT + i}" for i in range(len(caps)))
    out = []
    for label, llama_args in (
        ("llama.cpp default split", ["--rpc", rpc_default, "-ngl", "999", "-c", "4096", "-np", "1"]),
        ("llmfleet plan", plan["llama_server_args"]),
    ):
        res = run_fleet(args.bin, path, caps, llama_args, label.split()[0], cg, tmp)
        killed = [w["port"] for w in res["workers"] if w["oom"]]
        out.append(
            {
                "run": label,
                "args": " ".join(llama_args),
                "served": res["ok"],
                "text": res["text"][:60],
                "oom_killed_ports": killed,
                "peaks": [round(w["peak_mib"] or 0, 1) for w in res["workers"]],
            }
        )
        print("{}: served={} oom={} peaks={}".format(label, res["ok"], killed, out[-1]["peaks"]), flush=True)
    return out


def table(rows: list[dict]) -> str:
    head = "| case | host | layers | predicted | actual | pred/actual | model pred/llama | KV pred/llama | compute pred/llama | process | peak | within goal |"
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            "| {} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} / {:.1f} | {:.1f} / {:.1f} | {:.1f} / {:.1f} | {:.1f} | {:.1f} | {} |".format(
                r["case"],
                r["host"],
                r["layers"],
                r["pred"],
                r["actual"],
                r["pred"] / r["actual"] if r["actual"] else 0,
                r["pred_weights"],
                r["rep_model"],
                r["pred_kv"],
                r["rep_kv"],
                r["pred_compute"],
                r["rep_compute"],
                r["idle"],
                r["peak"],
                "yes" if r["within"] else "NO",
            )
        )
    return "\n".join(lines)


def main() -> int:
    cache = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=os.path.join(cache, "models"))
    parser.add_argument("--bin", default=os.path.join(cache, "llama.cpp", "bin"))
    parser.add_argument("--only", default="")
    parser.add_argument("--vulkan-bin", default=os.path.join(cache, "llama.cpp-vulkan", "bin"))
    parser.add_argument("--no-vulkan", action="store_true", help="skip the Vulkan (lavapipe) device cases")
    parser.add_argument("--no-capacity", action="store_true")
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--objective", choices=["memory", "speed"], default="memory", help="speed: uneven what-if figures"
    )
    args = parser.parse_args()
    global OBJECTIVE
    OBJECTIVE = args.objective
    print(f"objective {OBJECTIVE}")
    cg = Cgroups()
    print("cgroup v1 memory groups: %s" % (cg.base or "unavailable (peaks from VmHWM)"))
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as tmp:
            heads: list[dict] = []
            rows = accuracy(args, cg, tmp, heads)
            vk = [] if args.no_vulkan else vulkan(args, tmp)
            cap = [] if args.no_capacity or args.only else capacity(args, cg, tmp)
    finally:
        cg.cleanup()
    print()
    print(table(rows))
    if heads:
        print()
        print(
            "| case | head predicted | llama.cpp CPU buffers | head cgroup peak | llama-server VmHWM | model pred/llama | compute pred/llama |"
        )
        print("|---|---|---|---|---|---|---|")
        for h in heads:
            print(
                "| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} / {:.1f} | {:.1f} / {:.1f} |".format(
                    h["case"],
                    h["pred"],
                    h["allocated"],
                    h["cgroup_peak"],
                    h["hwm"],
                    h["pred_weights"],
                    h["rep_model"],
                    h["pred_compute"],
                    h["rep_compute"],
                )
            )
    if vk:
        print()
        print(vulkan_table(vk))
    if cap:
        print()
        for c in cap:
            print(
                "- {}: served={}, OOM-killed workers={}, peak MiB per worker={}, `{}`".format(
                    c["run"], c["served"], c["oom_killed_ports"], c["peaks"], c["args"]
                )
            )
    within = sum(1 for r in rows if r["within"])
    vk_within = sum(1 for r in vk if r["within"] and r["served"])
    print(
        f"\n{within}/{len(rows)} worker predictions within the goal; {vk_within}/{len(vk)} Vulkan-case devices;"
        f" {time.monotonic() - started:.0f} s"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"accuracy": rows, "heads": heads, "vulkan": vk, "capacity": cap}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

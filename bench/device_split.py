#!/usr/bin/env python
"""The planner's device placement against llama.cpp itself (real processes on loopback).

Plans a what-if fleet over devices (plugins/plugin_utils/device_placement.py) and runs it on the
pinned Vulkan build with Mesa's lavapipe as the Vulkan device: one ``ggml-rpc-server -d <the
worker's devices>`` and llama-server with the plan's exact arguments (``--rpc ... --device ...
--tensor-split ... -ngl ...``). It then compares, per device, the layers llama.cpp assigned
(``layer N assigned to device X``) and the names its buffer report prints with the plan's
``layers``, ``output_layer`` and ``report_name``, asks for one completion, and runs verify's own
per-device check (usage.device_buffers: each device's buffers within [-5 %, +15 % + 16 MiB] of
the plan's prediction). Exit 1 on any
mismatch.

    python bench/device_split.py [--bin DIR] [--model FILE]

Cases: a worker offering ``Vulkan0,CPU`` behind a CPU-only head (``--device RPC0,RPC1``), and the
same worker with the head's own Vulkan0 first (``--device Vulkan0,RPC0,RPC1``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".cache", "collections"))

import servers  # bench/servers.py: the shared process helpers
from ansible_collections.llmfleet.cluster.plugins.module_utils import usage
from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement

RPC_PORT, SERVER_PORT = 50391, 50392
LAYER_RE = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")
BUF_RE = re.compile(
    r"(?:load_tensors|llama_kv_cache|sched_reserve):\s+(\S+)\s+(?:model|KV|compute) buffer size"
)


def device(name: str, free: int, backend: str = "vulkan") -> dict:
    kind = "cpu" if backend == "cpu" else "gpu"
    return {
        "name": name,
        "backend": backend,
        "description": "lavapipe" if kind == "gpu" else "cpu",
        "type": kind,
        "memory_total_mib": free,
        "memory_free_mib": free,
        "uma": False,
    }


def fleet(head_gpu: bool) -> tuple[dict, list[dict]]:
    cpu = device("CPU", 4000, "cpu")
    head = {"name": "head", "usable_mib": 4000, "cpus": 2, "gpu_reserve_mib": 0}
    if head_gpu:
        head["devices"] = [device("Vulkan0", 14), cpu]
    worker = {
        "name": "w",
        "usable_mib": 4000,
        "cpus": 2,
        "address": "127.0.0.1",
        "port": RPC_PORT,
        "gpu_reserve_mib": 0,
        "devices": [device("Vulkan0", 14), cpu],
    }
    return head, [worker]


def run_case(bin_dir: str, model: str, head_gpu: bool, tmp: str) -> list[str]:
    layout = read_layout(model).to_dict()
    head, workers = fleet(head_gpu)
    plan = placement.plan_llama_cpp(
        layout, head, workers, {"head_layers": False, "context": 512, "min_workers": 1}
    )
    print(plan["table"])
    print("llama-server", " ".join(plan["llama_server_args"]))
    offered = ",".join(d["name"] for d in plan["hosts"][1]["devices"])
    rpc = servers.start(
        [
            os.path.join(bin_dir, "ggml-rpc-server"),
            "-H",
            "127.0.0.1",
            "-p",
            str(RPC_PORT),
            "-d",
            offered,
            "-t",
            "1",
        ],
        os.path.join(tmp, "rpc.log"),
        vulkan=True,
    )
    time.sleep(3.0)
    log = os.path.join(tmp, "server-%s.log" % ("gpu" if head_gpu else "cpu"))
    cmd = [
        os.path.join(bin_dir, "llama-server"),
        "-m",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(SERVER_PORT),
    ]
    server = servers.start(
        [*cmd, "-t", "1", "-v", "--no-webui", *plan["llama_server_args"]], log, vulkan=head_gpu
    )
    try:
        text = servers.complete(SERVER_PORT) if servers.wait_health(SERVER_PORT, server) else None
    finally:
        servers.stop(server)
        servers.stop(rpc)
    with open(log, encoding="utf-8", errors="replace") as handle:
        report = handle.read()
    fit = max(report.rfind("common_fit_params"), report.rfind("common_params_fit_impl"))
    if fit >= 0:
        report = report[report.find("\n", fit) :]
    where = {int(il): dev for il, dev in LAYER_RE.findall(report)}
    printed = set(BUF_RE.findall(report))
    problems = [] if text is not None else ["no answer"]
    print("answer:", repr(text))
    n_layer = int(layout["n_layer"])
    for row in plan["hosts"]:
        for dev in row["devices"]:
            first, last = dev["layers"]
            want = list(range(first, last)) + ([n_layer] if dev["output_layer"] else [])
            short = dev["report_name"].split("[", 1)[0]
            got = [il for il in sorted(where) if where[il] == short]
            if dev["name"] == "CPU" and row["role"] == "head":
                got = [il for il in sorted(where) if where[il] == "CPU"]
            ok = got == want and (not want or dev["report_name"] in printed)
            verdict = "ok" if ok else "MISMATCH"
            print(
                f"{row['name']:<5} {dev['name']:<8} {dev['report_name']:<24} plan {want!s:<12} llama.cpp {got!s:<12} {verdict}"
            )
            if not ok:
                problems.append(f"{row['name']} {dev['name']}: planned {want}, llama.cpp {got}")
    # verify's own per-device check: llama.cpp's buffers against the plan's prediction
    rows, failures = usage.device_buffers(
        {"head": plan["hosts"][0]["name"], "hosts": plan["hosts"]}, usage.parse_buffer_report(report)
    )
    print(usage.render_device_table(rows))
    return problems + failures


def main() -> int:
    found = sorted(glob.glob(os.path.expanduser("~/.cache/llmfleet/llama.cpp-ubuntu-vulkan-x64/*/bin")))
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bin", default=found[0] if found else "")
    parser.add_argument("--model", default=os.path.join(ROOT, ".cache", "models", "tiny-llama-8L.gguf"))
    args = parser.parse_args()
    if not args.bin or not os.path.exists(os.path.join(args.bin, "llama-server")):
        print("no Vulkan build of llama.cpp (make vulkan-artifacts): --bin DIR", file=sys.stderr)
        return 2
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for head_gpu in (False, True):
            problems += run_case(args.bin, args.model, head_gpu, tmp)
    print("\n".join(problems) if problems else "every device holds exactly the layers the plan gave it")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

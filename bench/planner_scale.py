#!/usr/bin/env python
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan time and plan size for what-if fleets of 8, 16, 32, 64 and 128 hosts (no host contacted).

The model is a synthetic 7B-class layout (80 layers of 60 MiB, a 152k vocabulary: 4.9 GiB); every
worker offers 240 MiB usable (about 3 layers after the reserve), so a fleet needs about a third of
its hosts or more: 8 hosts -> refused (the memory refusal is timed too), 64 hosts -> 27 or more
workers. Workers differ in speed (ms per layer 1-4, rtt 0.5-20 ms, 100-1000 Mbit/s) so that the
speed objective has choices to make. Each fleet is planned under both objectives; the figures are
CPU seconds of this process (time.process_time), so load from other processes counts little.

With ``--gpus`` the workers offer devices (issue #32, docs/planner.md "Speed per device"): every
third a discrete Vulkan GPU (512 MiB free, measured at 0.2x its CPU), every third an iGPU
(256 MiB, sharing its RAM, unmeasured: priced at the assumed default), the rest their CPU only;
the fleet is then planned over devices (device_placement.py, device_speed.py).

    python bench/planner_scale.py [--sizes 8,16,32,64,128] [--objectives memory,speed] [--gpus] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("CACHE", os.path.join(ROOT, ".cache")), "collections"))

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import PlacementError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed_search import make_plan

MIB = 1024 * 1024
MODEL = {"name": "whatif-7b", "file": "whatif-7b.gguf"}


def layout(n_layer: int = 96, layer_mib: float = 40.0, n_vocab: int = 152064, n_embd: int = 3584):
    lb = int(layer_mib * MIB)
    return {
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_ff": 4096,
        "n_vocab": n_vocab,
        "n_head_kv": [4] * n_layer,
        "head_dim_k": 128,
        "head_dim_v": 128,
        "sliding_window": 0,
        "swa_layers": [False] * n_layer,
        "layer_bytes": [lb] * n_layer,
        "layer_largest_tensor": [lb // 3] * n_layer,
        "token_embd_bytes": 300 * MIB,
        "output_bytes": 120 * MIB,
        "output_norm_bytes": 14336,
        "other_bytes": 0,
        "tied_output": False,
    }


def devices(i: int, usable_mib: float) -> list:
    """Worker i's devices with ``--gpus``: a discrete GPU, an iGPU or none (its CPU only)."""
    cpu = {"name": "CPU", "backend": "cpu", "description": "CPU", "type": "cpu", "uma": False}
    cpu.update(memory_total_mib=usable_mib, memory_free_mib=usable_mib)
    kind = i % 3
    if kind == 2:
        return [cpu]
    gpu = {"name": "Vulkan0", "backend": "vulkan", "description": "what-if GPU"}
    gpu.update(type="gpu" if kind == 0 else "igpu", uma=kind == 1)
    gpu.update(memory_total_mib=1024, memory_free_mib=512.0 if kind == 0 else 256.0)
    return [gpu, cpu]


def fleet(n_hosts: int, usable_mib: float = 240.0, gpus: bool = False):
    """A head (1024 MiB: embeddings and a few layers) and n_hosts - 1 uneven workers."""
    head = {"name": "head", "usable_mib": 1024.0, "cpus": 4, "speed": {"ms_per_layer": 1.0}}
    workers = []
    for i in range(n_hosts - 1):
        workers.append(
            {
                "name": f"w{i:03d}",
                "usable_mib": usable_mib + (i % 5) * 8,
                "cpus": 2,
                "address": f"10.1.{i // 200}.{i % 200 + 2}",
                "port": 50052,
                "speed": {
                    "ms_per_layer": 1.0 + (i * 7 % 13) / 4.0,
                    "rtt_ms": 0.5 + (i * 5 % 11) * 2.0,
                    "mbit_s": 100.0 * (1 + i * 3 % 10),
                },
            }
        )
        if gpus:
            w = workers[-1]
            w["devices"] = devices(i, w["usable_mib"])
            w["gpu_reserve_mib"] = 64.0
            if i % 3 == 0:
                w["speed"]["devices"] = {"Vulkan0": {"ms_per_layer": 0.2 * w["speed"]["ms_per_layer"]}}
    return head, workers


def one(n_hosts: int, objective: str, gpus: bool = False):
    head, workers = fleet(n_hosts, gpus=gpus)
    opts = {"context": 2048, "objective": objective, "head_layers": True}
    start = time.process_time()
    try:
        plan = make_plan(layout(), MODEL, head, workers, opts, reserve_mib=32)
    except PlacementError as err:
        return {
            "hosts": n_hosts,
            "objective": objective,
            "cpu_s": round(time.process_time() - start, 3),
            "used_workers": None,
            "fallbacks": 0,
            "plan_bytes": 0,
            "tokens_per_second": None,
            "result": "refused: " + str(err).split("\n", 1)[0][:60],
        }
    cpu = time.process_time() - start
    size = len(json.dumps(plan, allow_nan=False))
    return {
        "hosts": n_hosts,
        "objective": plan["objective"],
        "cpu_s": round(cpu, 3),
        "used_workers": len(plan["workers"]),
        "fallbacks": len(plan["fallbacks"]),
        "plan_bytes": size,
        "tokens_per_second": (plan.get("speed") or {}).get("tokens_per_second"),
        "result": "planned",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="8,16,32,64,128")
    ap.add_argument("--objectives", default="memory,speed")
    ap.add_argument("--gpus", action="store_true", help="workers with a discrete GPU or an iGPU")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    rows = []
    print(
        "| hosts | objective | used workers | fallbacks | plan CPU s | plan.json bytes | predicted tokens/s |"
    )
    print("|--:|---|--:|--:|--:|--:|--:|")
    for n in [int(x) for x in args.sizes.split(",")]:
        for objective in args.objectives.split(","):
            row = one(n, objective, args.gpus)
            rows.append(row)
            used = row["used_workers"] if row["used_workers"] is not None else row["result"]
            tps = row["tokens_per_second"] if row["tokens_per_second"] is not None else "-"
            print(
                f"| {row['hosts']} | {row['objective']} | {used} | {row['fallbacks']} | {row['cpu_s']:.2f} |"
                f" {row['plan_bytes']} | {tps} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

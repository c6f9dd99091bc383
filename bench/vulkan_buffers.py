#!/usr/bin/env python
"""llama.cpp's own per-device buffers on a real Vulkan device (Mesa's lavapipe) against the memory model.

Runs the Vulkan flavour (``make vulkan-artifacts``: ``.cache/llama.cpp-vulkan/bin``) for real on
127.0.0.1 (ports 50300-50399), every process under ``nice -n 19``:

- ``rpc`` cases: one ``ggml-rpc-server -d <devices>`` (``GGML_VK_VISIBLE_DEVICES=0``: llama.cpp
  skips CPU-type Vulkan devices unless told) and a llama-server that sees its devices as RPC0,
  RPC1 ... (``--rpc``, ``-ngl 99``, ``--tensor-split``); the A/B pairs put the same layers on an
  RPC device that is lavapipe (``-d Vulkan0``) and one that is the CPU backend (``-d CPU``);
- ``head`` cases: llama-server with its own Vulkan device (``--device Vulkan0 -ngl N``), no RPC.

For every device it reads llama.cpp's own report (llama-server ``-v``: the model, KV and compute
buffers per device, as ``-lv 4`` prints them, and the debug lines saying which layers went
where) and sets beside it what ``plugins/plugin_utils/memory_model.py`` (the CPU calibration
of the pinned build) predicts for exactly those layers, and it records the rpc-server's
resident memory at rest and at its peak (lavapipe's "VRAM" is that process's memory).

    python bench/vulkan_buffers.py [--bin DIR] [--models DIR] [--only NAME] [--json OUT] [--md OUT]

The recorded run is bench/vulkan_buffers.md (docs/vulkan.md reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
sys.path.insert(0, os.path.join(CACHE, "collections"))

import servers  # bench/servers.py: the shared process helpers
from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import memory_model
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Model, Options

MIB = 1024 * 1024
RPC_PORT = 50300
SERVER_PORT = 50350
CONTEXT = 512
# "<name> model|KV|compute|output buffer size = N MiB"; RPC buffers are named RPC0[host:port]
BUF_RE = re.compile(
    r"(?:load_tensors|llama_kv_cache|sched_reserve|llama_context):\s+(\S+)\s+(model|KV|compute|output) buffer size"
    r" =\s+([\d.]+) MiB"
)
LAYER_RE = re.compile(r"layer\s+(\d+) assigned to device (\S+?),", re.M)
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-Q4_K_M.gguf"
TINY = "tiny-llama-8L.gguf"

# name, model, rpc-server devices (None: no rpc-server, the head's own devices), llama-server args
CASES = [
    ("smollm2 rpc Vulkan0 all", SMOL, "Vulkan0", ["-ngl", "99"]),
    ("smollm2 rpc CPU all", SMOL, "CPU", ["-ngl", "99"]),
    ("smollm2 rpc Vulkan0,CPU 1,1", SMOL, "Vulkan0,CPU", ["-ngl", "99", "--tensor-split", "1,1"]),
    ("smollm2 rpc Vulkan0,CPU 3,1", SMOL, "Vulkan0,CPU", ["-ngl", "99", "--tensor-split", "3,1"]),
    ("smollm2 rpc Vulkan0,CPU 1,3", SMOL, "Vulkan0,CPU", ["-ngl", "99", "--tensor-split", "1,3"]),
    ("smollm2 head Vulkan0 all", SMOL, None, ["--device", "Vulkan0", "-ngl", "99"]),
    ("smollm2 head Vulkan0 -ngl 15", SMOL, None, ["--device", "Vulkan0", "-ngl", "15"]),
    ("gemma3 rpc Vulkan0 all", GEMMA, "Vulkan0", ["-ngl", "99"]),
    ("gemma3 rpc CPU all", GEMMA, "CPU", ["-ngl", "99"]),
    ("gemma3 rpc Vulkan0,CPU 1,1", GEMMA, "Vulkan0,CPU", ["-ngl", "99", "--tensor-split", "1,1"]),
    ("gemma3 head Vulkan0 all", GEMMA, None, ["--device", "Vulkan0", "-ngl", "99"]),
    ("tiny-8L rpc Vulkan0,CPU 1,1", TINY, "Vulkan0,CPU", ["-ngl", "99", "--tensor-split", "1,1"]),
    ("tiny-8L rpc CPU all", TINY, "CPU", ["-ngl", "99"]),
    ("tiny-8L rpc Vulkan0 all", TINY, "Vulkan0", ["-ngl", "99"]),
]


def list_devices(binary: str, tmp: str) -> dict[str, str]:
    """What the two binaries say about the devices (test data for the probe).

    llama-server has ``--list-devices``; the pinned ggml-rpc-server has no such flag: it lists the
    devices when ``-d`` names an unknown one, and prints the ones it serves when it starts.
    """
    out = {}
    for visible in (True, False):
        run_env = servers.env(visible)
        label = "GGML_VK_VISIBLE_DEVICES=0 " if visible else ""
        for key, cmd in (
            ("llama-server --list-devices", [os.path.join(binary, "llama-server"), "--list-devices"]),
            ("ggml-rpc-server -d list", [os.path.join(binary, "ggml-rpc-server"), "-d", "list"]),
        ):
            res = subprocess.run(
                ["nice", "-n", "19", *cmd],
                capture_output=True,
                text=True,
                env=run_env,
                timeout=120,
                check=False,
            )
            out[label + key] = res.stdout + res.stderr
    for devices in ("Vulkan0,CPU", None):
        log = os.path.join(tmp, "banner.log")
        cmd = [os.path.join(binary, "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(RPC_PORT)]
        cmd += ["-d", devices] if devices else []
        proc = servers.start(cmd, log, vulkan=True)
        time.sleep(3.0)
        servers.stop(proc)
        with open(log, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        out[
            "GGML_VK_VISIBLE_DEVICES=0 " + " ".join(["ggml-rpc-server", *cmd[1:]][:1] + cmd[5:]) + " (start)"
        ] = text
    return out


def parse(report: str) -> tuple[dict[str, dict[str, float]], dict[str, list[int]]]:
    """Buffers per device name (RPC0[host:port] -> RPC0; the head's CPU, CPU_Mapped, CPU_REPACK -> CPU)
    and the layers llama.cpp assigned to each, from the real load (after --fit's dry run)."""
    fit = max(report.rfind("common_fit_params"), report.rfind("common_params_fit_impl"))
    if fit >= 0:
        report = report[report.find("\n", fit) :]
    buffers: dict[str, dict[str, float]] = {}
    for name, kind, mib in BUF_RE.findall(report):
        dev = name.split("[", 1)[0]
        dev = "CPU" if dev.startswith("CPU") else dev
        slot = buffers.setdefault(dev, {"model": 0.0, "KV": 0.0, "compute": 0.0, "output": 0.0})
        slot[kind] += float(mib)
    where = {int(il): dev for il, dev in LAYER_RE.findall(report)}
    layers: dict[str, list[int]] = {}
    for il in sorted(where):
        layers.setdefault(where[il], []).append(il)
    return buffers, layers


def predict(model: Model, layers: list[int], n_devices: int, device: str, ngl: int) -> dict[str, float]:
    """The memory model's figures (CPU calibration) for ``layers`` (n_layer there: the output layer)."""
    opts = Options(context=CONTEXT, parallel=1)
    repeating = sorted(il for il in layers if il < model.n_layer)
    output = model.n_layer in layers
    rng = range(repeating[0], repeating[-1] + 1) if repeating else range(0)
    pp = memory_model.pipelined(n_devices, 0, False) and ngl > model.n_layer
    if device == "CPU":  # the head's own CPU: token embeddings and what llama.cpp left on it
        p = memory_model.predict_head(model, rng, output, opts, pp)
    else:
        p = memory_model.predict_worker(model, rng, output, opts, pp)
    return {"model": p.weights / MIB, "KV": p.kv / MIB, "compute": p.compute / MIB}


def run_case(args: argparse.Namespace, case: tuple, tmp: str) -> dict:
    name, model_file, rpc_devices, llama_args = case
    path = os.path.join(args.models, model_file)
    model = Model.from_layout(read_layout(path).to_dict())
    tag = re.sub(r"[^A-Za-z0-9]+", "_", name)
    rpc = None
    idle = None
    if rpc_devices:
        rpc = servers.start(
            [
                os.path.join(args.bin, "ggml-rpc-server"),
                "-H",
                "127.0.0.1",
                "-p",
                str(RPC_PORT),
                "-d",
                rpc_devices,
                "-t",
                "1",
            ],
            os.path.join(tmp, f"{tag}-rpc.log"),
            vulkan=True,
        )
        time.sleep(3.0)
        idle = servers.status_mib(rpc.pid, "VmRSS")
    cmd = [
        os.path.join(args.bin, "llama-server"),
        "-m",
        path,
        "--host",
        "127.0.0.1",
        "--port",
        str(SERVER_PORT),
    ]
    cmd += ["-c", str(CONTEXT), "-np", "1", "-t", "1", "-v", "--no-webui"]
    if rpc_devices:
        cmd += ["--rpc", f"127.0.0.1:{RPC_PORT}"]
    cmd += llama_args
    slog = os.path.join(tmp, f"{tag}-server.log")
    started = time.monotonic()
    # an rpc case's head sees no Vulkan device of its own (it would take layers: llama-server
    # uses every device it sees), a head case's does
    server = servers.start(cmd, slog, vulkan=not rpc_devices)
    ok = servers.wait_health(SERVER_PORT, server, args.timeout)
    text = ""
    if ok:
        try:
            text = servers.complete(SERVER_PORT, timeout=600)
        except OSError as err:
            ok, text = False, f"request failed: {err}"
    seconds = time.monotonic() - started
    rpc_hwm = servers.status_mib(rpc.pid, "VmHWM") if rpc else None
    rpc_rss = servers.status_mib(rpc.pid, "VmRSS") if rpc else None
    head_hwm = servers.status_mib(server.pid, "VmHWM")
    servers.stop(server)
    if rpc:
        servers.stop(rpc)
    with open(slog, encoding="utf-8", errors="replace") as handle:
        report = handle.read()
    buffers, layers = parse(report)
    ngl = int(llama_args[llama_args.index("-ngl") + 1])
    gpu_devices = [d for d in layers if d != "CPU"]
    devices = []
    for dev in sorted(set(buffers) | set(layers)):
        rep = buffers.get(dev, {"model": 0.0, "KV": 0.0, "compute": 0.0, "output": 0.0})
        row = {"device": dev, "layers": layers.get(dev, []), "reported": rep}
        if dev in layers or dev == "CPU":
            row["predicted"] = predict(model, layers.get(dev, []), len(gpu_devices), dev, ngl)
        devices.append(row)
    return {
        "case": name,
        "model": model_file,
        "rpc_devices": rpc_devices,
        "args": llama_args,
        "served": ok,
        "text": text,
        "seconds": round(seconds, 1),
        "n_layer": model.n_layer,
        "rpc_idle_rss_mib": idle,
        "rpc_rss_mib": rpc_rss,
        "rpc_hwm_mib": rpc_hwm,
        "head_hwm_mib": head_hwm,
        "devices": devices,
        "report": [ln for ln in report.splitlines() if "buffer size" in ln or "offload" in ln],
    }


def span(layers: list[int], n_layer: int) -> str:
    rep = [il for il in layers if il < n_layer]
    text = f"{rep[0]}-{rep[-1]}" if rep else "none"
    return text + (" + output" if n_layer in layers else "")


def markdown(listing: dict[str, str], results: list[dict]) -> str:
    lines = ["# llama.cpp's Vulkan buffers on lavapipe (recorded by bench/vulkan_buffers.py)", ""]
    lines += ["## --list-devices", ""]
    for name, text in listing.items():
        lines += [f"`{name}`:", "", "```", text.rstrip(), "```", ""]
    lines += ["## Buffers per device (MiB; predicted: memory_model.py with the CPU calibration)", ""]
    lines += [
        "| case | device | layers | model rep/pred | KV rep/pred | compute rep/pred | rpc-server rest/peak | served |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for d in r["devices"]:
            rep, pred = d["reported"], d.get("predicted")

            def cell(kind: str, rep=rep, pred=pred) -> str:
                return f"{rep[kind]:.2f} / {pred[kind]:.2f}" if pred else f"{rep[kind]:.2f} / -"

            rest = r["rpc_idle_rss_mib"]
            mem = f"{rest:.1f} / {r['rpc_hwm_mib']:.1f}" if rest is not None and r["rpc_hwm_mib"] else "-"
            lines.append(
                f"| {r['case']} | {d['device']} | {span(d['layers'], r['n_layer']) if d['layers'] else '-'} "
                f"| {cell('model')} | {cell('KV')} | {cell('compute')} | {mem} | {r['served']} |"
            )
    lines += ["", "Answers and times:", ""]
    for r in results:
        lines.append(f"- {r['case']}: {r['seconds']} s, {r['text']!r} (head VmHWM {r['head_hwm_mib']} MiB)")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--bin", default=os.path.join(CACHE, "llama.cpp-vulkan", "bin"))
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--only", default="")
    parser.add_argument("--json")
    parser.add_argument("--md")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vulkan-buffers-") as tmp:
        listing = list_devices(args.bin, tmp)
        for name, text in listing.items():
            print(f"== {name}\n{text.rstrip()}", flush=True)
        results = []
        for case in CASES:
            if args.only and args.only not in case[0]:
                continue
            res = run_case(args, case, tmp)
            results.append(res)
            print(f"{res['case']}: served={res['served']} {res['seconds']} s {res['text']!r}", flush=True)
            for d in res["devices"]:
                print(
                    f"  {d['device']:<12} {span(d['layers'], res['n_layer']) if d['layers'] else '-':<16} "
                    f"reported {d['reported']} predicted {d.get('predicted')}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"list_devices": listing, "cases": results}, handle, indent=1)
    text = markdown(listing, results)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as handle:
            handle.write(text)
    print(text)
    return 0 if all(r["served"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

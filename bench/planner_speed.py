#!/usr/bin/env python
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Speed plan vs memory plan vs llama.cpp's default split, measured on a running demo fleet.

On a fleet brought up by ``make demo DEMO_INVENTORY=inventories/demo-uneven`` (issue #15, item 7):

1. ``playbooks/profile.yml`` measures it (profile.json), unless ``--no-profile``;
2. ``playbooks/plan.yml`` plans it twice from that profile, with ``llmfleet_plan_objective=memory``
   and ``=speed`` (the plan role, the filters and plan.json exactly as site.yml makes them);
3. three variants are served in turn by the head's own supervisor (``llmfleet-llama-server``, the
   deploy path: the variant's plan.json is installed as /etc/llmfleet/plan.json and the unit
   restarted): llama.cpp's default split (the memory plan's ``--rpc`` list in inventory order
   with no ``--tensor-split`` and no tensor overrides: llama.cpp splits by itself), the memory
   plan and the speed plan;
4. rounds A, B, C, A, B, C, ... so that machine noise falls on every variant alike: each round
   restarts the variant, sends one warm-up request and then ``--requests`` measured ones (a
   fixed prompt of about 128 tokens, no prompt cache, ``--max-tokens`` tokens generated);
   decode tokens/s and TTFT come from llama-server's own ``timings`` of each request;
5. the table: measured (median over rounds) against the plan's prediction. Exit 1 when a
   must-show fails: speed >= 1.5 x memory, >= 2 x default, every prediction within +-25 %.

    python bench/planner_speed.py [--inventory inventories/demo-uneven] [--rounds 3] [--json OUT]

The default split's prediction is the time model (plugins/plugin_utils/speed.py) applied to the
layers llama.cpp gives each device with no split (equal shares: every CPU RPC device reports the
same machine memory; the output layer on the last device), with the figures the plans carry.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
sys.path.insert(0, os.path.join(CACHE, "collections"))

from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import profile as prof
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Model
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.speed import Figures, estimate, figures_of
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.split_rule import assign_slots

PLAN_FILE = "/etc/llmfleet/plan.json"
UNIT = "llmfleet-llama-server.service"
API = "http://127.0.0.1:8080"
# Split options the planner adds; without them llama.cpp chooses its own split.
SPLIT_FLAGS = {
    "--tensor-split",
    "-ts",
    "--override-tensor",
    "-ot",
    "--main-gpu",
    "-mg",
    "-ngl",
    "--n-gpu-layers",
}
PROMPT = (
    "The history of the small town begins with a river, a mill and a road that crossed the hills "
    "to the market in the valley. Farmers brought grain, the miller ground it, and traders carried "
    "the flour to the coast, where ships waited for the spring winds. Over the years the town grew "
    "a school, a church with a tall tower, a bridge of grey stone and a square where people met on "
    "market days to trade news, cloth, tools and animals. Write the next chapter of this history, "
    "about the year the river flooded and what the people of the town did:"
)
# The request, run inside the head (llama-server listens on its loopback): one non-streamed
# completion; prints llama-server's timings as one JSON line.
REQUEST = rf"""
import json, sys, time, urllib.request
key = open('/etc/llmfleet/api-key').read().strip()
body = json.dumps({{'prompt': sys.argv[1], 'n_predict': int(sys.argv[2]), 'temperature': 0,
                   'cache_prompt': False, 'ignore_eos': True}}).encode()
req = urllib.request.Request('{API}/completion', data=body, headers={{
    'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}})
t0 = time.monotonic()
with urllib.request.urlopen(req, timeout=600) as r:
    out = json.loads(r.read(1 << 22))
t = out.get('timings') or {{}}
t['wall_s'] = time.monotonic() - t0
print(json.dumps(t))
"""
HEALTH = rf"""
import json, sys, time, urllib.request
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        with urllib.request.urlopen('{API}/health', timeout=5) as r:
            if json.loads(r.read(4096)).get('status') == 'ok':
                print('ok'); sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
print('timeout'); sys.exit(1)
"""


def sh(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def playbook(inventory: str, name: str, out_dir: str, log: str, *extra: str) -> None:
    cmd = ["ansible-playbook", "-i", inventory, os.path.join(ROOT, "playbooks", name)]
    cmd += ["-e", "llmfleet_output_dir=" + out_dir, *extra]
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
    print(
        f"  {name} {' '.join(extra)}: rc {rc}, {time.monotonic() - t0:.0f} s (log {log})",
        flush=True,
    )
    if rc != 0:
        sys.exit(f"{name} failed; the log is {log}")


def inventory_hosts(inventory: str) -> tuple[str, list[str]]:
    inv = json.loads(sh(["ansible-inventory", "-i", inventory, "--list"], cwd=ROOT).stdout)
    return inv["llm_head"]["hosts"][0], inv["llm_workers"]["hosts"]


def strip_split(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in SPLIT_FLAGS:
            skip = True
            continue
        if a.split("=", 1)[0] in SPLIT_FLAGS:
            continue
        out.append(a)
    return out


def figures_from_profile(profile: dict, head: str, workers: list[str]) -> dict[str, Figures]:
    """Every host's figures as the plan role gets them from profile.json (profile.speeds: the
    output layer measured or priced by the measured ratio, the head's token_ms), including a
    host neither plan uses."""
    got = prof.speeds(
        [head, *workers],
        head,
        profile,
        {},
        {},
        profile.get("build") or "",
        (profile.get("model") or {}).get("sha256"),
    )
    for line in got["remeasure"]:
        print("  " + line, flush=True)
    return {
        name: figures_of({"name": name, "speed": d}, "head" if name == head else "worker")
        for name, d in got["speed"].items()
    }


def default_split_prediction(layout: dict, plan: dict, head: str, workers: list[str], figs: dict) -> dict:
    """The time model for llama.cpp's own split: equal shares over the --rpc devices in this
    order, the output layer on the last one (assign_slots, as placement.py models llama.cpp;
    -ngl 99: no layer on the head's CPU)."""
    model = Model.from_layout(layout)
    n = model.n_layer
    slots = assign_slots([1.0] * len(workers), n, n + 1)
    counts = [slots[:n].count(i) for i in range(len(workers))]
    missing = [w for w in [head, *workers] if w not in figs]
    if missing:
        return {"tokens_per_second": None, "why": "no figures for {}".format(", ".join(missing))}
    host = types.SimpleNamespace
    est = estimate(model, host(name=head), [host(name=w) for w in workers], 0, counts, slots[n] == -1, figs)
    got = est.to_plan()
    got["layers"] = dict(zip(workers, counts))
    return got


def start_mirror(inventory: str, out_dir: str, tmp: str) -> subprocess.Popen | None:
    inv = json.loads(sh(["ansible-inventory", "-i", inventory, "--list"], cwd=ROOT).stdout)
    any_vars = next(iter(inv["_meta"]["hostvars"].values()))
    net, port = any_vars.get("demo_network") or {}, any_vars.get("demo_mirror_port")
    directory = os.path.join(os.path.dirname(out_dir), "mirror")
    if not (net.get("gateway") and port and os.path.isdir(directory)):
        return None
    try:  # scripts/demo.sh's mirror container stays up with the fleet: use it
        socket.create_connection((net["gateway"], int(port)), timeout=2).close()
        return None
    except OSError:
        pass
    log = open(os.path.join(tmp, "mirror.log"), "w")  # noqa: SIM115 (lives as long as the mirror)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.http_mirror",
            directory,
            "--port",
            str(port),
            "--bind",
            net["gateway"],
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    time.sleep(1.0)
    return proc


RPC_UNIT = "llmfleet-rpc-server.service"
RPC_BINARY = "/opt/llmfleet/llama.cpp/current/ggml-rpc-server"


def ensure_rpc_servers(plan: dict, workers: list[str]) -> list[str]:
    """An rpc-server on every worker of the inventory: site.yml runs one on the planned workers
    only, the default split and the speed plan may use the others (profile.yml installed the
    pinned llama.cpp on them). A transient unit of the same name, bounded; returns the workers
    it was started on (stopped at the end)."""
    started = []
    where = {h["name"]: h for h in (plan.get("planned_with") or {}).get("hosts") or []}
    for w in workers:
        active = subprocess.run(
            ["podman", "exec", w, "systemctl", "is-active", RPC_UNIT],
            text=True,
            capture_output=True,
            check=False,
        )
        if active.stdout.strip() == "active":
            continue
        h = where[w]
        sh(
            [
                "podman",
                "exec",
                w,
                "systemd-run",
                "--unit=" + RPC_UNIT,
                "--collect",
                "--property=RuntimeMaxSec=7200",
                RPC_BINARY,
                "--host",
                h["address"],
                "--port",
                str(h.get("port") or 50052),
                "--threads",
                str(h.get("cpus") or 1),
            ]
        )
        started.append(w)
        print(
            f"  started a transient rpc-server on {w} ({h['address']}:{h.get('port') or 50052})", flush=True
        )
    time.sleep(2.0)
    return started


class Head:
    def __init__(self, name: str):
        self.name = name

    def exec(self, *cmd: str, timeout: float = 900, stdin: str | None = None) -> str:
        return sh(["podman", "exec", "-i", self.name, *cmd], timeout=timeout, input=stdin).stdout

    def serve(self, plan: dict, tmp: str) -> float:
        """Install the plan and restart the supervisor; seconds until llama-server is healthy."""
        path = os.path.join(tmp, "variant-plan.json")
        with open(path, "w") as f:
            json.dump(plan, f, indent=2)
        t0 = time.monotonic()
        self.exec("systemctl", "stop", UNIT)
        sh(["podman", "cp", path, f"{self.name}:{PLAN_FILE}"])
        self.exec("chmod", "0644", PLAN_FILE)
        self.exec("systemctl", "start", UNIT)
        if self.exec("python3", "-c", HEALTH, "600").strip() != "ok":
            raise RuntimeError(f"llama-server on {self.name} not healthy in 600 s")
        return time.monotonic() - t0

    def request(self, max_tokens: int) -> dict:
        return json.loads(
            self.exec("python3", "-c", REQUEST, PROMPT, str(max_tokens)).strip().splitlines()[-1]
        )

    def threads_of_server(self) -> str:
        return self.exec("sh", "-c", "ps -o args= -C llama-server || true").strip()


def within(pred: float | None, meas: float) -> bool:
    return pred is not None and meas > 0 and abs(pred - meas) / meas <= 0.25


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inventory", default="inventories/demo-uneven")
    ap.add_argument("--out-dir", help="the fleet's llmfleet_output_dir (default: scripts/demo.sh's)")
    ap.add_argument("--no-profile", action="store_true", help="use the profile.json already in --out-dir")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1, help="measured requests per variant per round")
    # 64, not 16: a request's decode rate carries about 0.5 s of its own start (16 tokens of the
    # speed plan on demo-uneven: 10 tokens/s, 32 tokens: 16) that the per-token model does not have
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--profile-tokens", type=int, default=64, help="tokens of profile.yml's request")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    started = time.monotonic()
    inventory = os.path.abspath(os.path.join(ROOT, args.inventory))
    out_dir = args.out_dir or os.path.join(CACHE, "demo", os.path.basename(inventory.rstrip("/")), "out")
    head_name, workers = inventory_hosts(inventory)
    head = Head(head_name)
    tmp = tempfile.mkdtemp(prefix="planner-speed-")
    deployed = os.path.join(out_dir, "plan.json")
    with open(deployed) as f:
        original = json.load(f)
    try:
        print("1. profile", flush=True)
        if not args.no_profile:
            playbook(
                inventory,
                "profile.yml",
                out_dir,
                os.path.join(tmp, "profile.log"),
                "-e",
                f"profile_max_tokens={args.profile_tokens}",
            )
        with open(os.path.join(out_dir, "profile.json")) as f:
            profile = json.load(f)
        print("2. plans", flush=True)
        # plan.yml reads the model's header from its URL: the fleet's mirror (scripts/demo.sh's
        # container, up with the fleet; else one from demo.sh's own mirror directory)
        mirror = start_mirror(inventory, out_dir, tmp)
        plans = {}
        for objective in ("memory", "speed"):
            d = os.path.join(tmp, objective)
            os.makedirs(d)
            shutil.copy(os.path.join(out_dir, "profile.json"), d)
            playbook(
                inventory,
                "plan.yml",
                d,
                os.path.join(tmp, f"plan-{objective}.log"),
                "-e",
                "llmfleet_plan_objective=" + objective,
            )
            with open(os.path.join(d, "plan.json")) as f:
                plans[objective] = json.load(f)
            shutil.copy(os.path.join(d, "plan.md"), os.path.join(tmp, f"plan-{objective}.md"))
        if mirror is not None:
            mirror.terminate()
            mirror.wait(timeout=10)
        rpc_started = ensure_rpc_servers(original, workers)
        default = copy.deepcopy(plans["memory"])
        # every worker of the inventory, in inventory order, at the address the plan was made for
        where = {h["name"]: h for h in original["planned_with"]["hosts"]}
        endpoints = {w: "{}:{}".format(where[w]["address"], where[w].get("port") or 50052) for w in workers}
        rpc = ",".join(endpoints[w] for w in workers)
        default["hosts"] = [h for h in default["hosts"] if h.get("role") == "head"] + [
            {"name": w, "role": "worker", "endpoint": endpoints[w], "address": where[w]["address"]}
            for w in workers
        ]
        dargs = strip_split(default["llama_server_args"])
        if "--rpc" in dargs:
            dargs[dargs.index("--rpc") + 1] = rpc
        else:
            dargs = ["--rpc", rpc, *dargs]
        dargs += ["-ngl", "99"]  # every layer to the RPC devices, as a user of --rpc would run it
        default["llama_server_args"] = dargs
        default["workers"] = list(workers)
        default["fallbacks"] = []
        layout = read_layout(
            os.path.join(
                CACHE,
                "models",
                os.path.basename(str(original["model"].get("file") or original["model"].get("url"))),
            )
        )
        layout = layout.to_dict()
        figs = figures_from_profile(profile, head_name, workers)
        predicted = {
            "default": default_split_prediction(layout, default, head_name, workers, figs),
            "memory": plans["memory"].get("speed") or {},
            "speed": plans["speed"].get("speed") or {},
        }
        variants = {"default": default, "memory": plans["memory"], "speed": plans["speed"]}
        for name, plan in variants.items():
            print(f"  {name:<7} args: {' '.join(plan['llama_server_args'])}", flush=True)
            print(
                "          predicted {} tokens/s; bottleneck {}".format(
                    predicted[name].get("tokens_per_second"), predicted[name].get("bottleneck")
                ),
                flush=True,
            )
        print("3. rounds (A, B, C, ...)", flush=True)
        samples: dict[str, list[dict]] = {k: [] for k in variants}
        for r in range(args.rounds):
            for name, plan in variants.items():
                load_s = head.serve(plan, tmp)
                head.request(4)  # warm-up
                for _round in range(args.requests):
                    t = head.request(args.max_tokens)
                    t["load_s"] = load_s
                    samples[name].append(t)
                    print(
                        f"  round {r + 1} {name:<7} {t.get('predicted_per_second', 0):6.2f} tokens/s"
                        f"  prompt {t.get('prompt_n', 0)} tokens {t.get('prompt_ms', 0) / 1000.0:.2f} s"
                        f"  (load {load_s:.0f} s)",
                        flush=True,
                    )
    finally:
        try:
            head.serve(original, tmp)
            print("restored the fleet's own plan", flush=True)
        except Exception as e:
            print(f"could not restore the fleet's plan: {e}", file=sys.stderr)
        for w in locals().get("rpc_started") or []:
            subprocess.run(["podman", "exec", w, "systemctl", "stop", RPC_UNIT], check=False)
    rows = []
    for name in variants:
        tps = statistics.median(s["predicted_per_second"] for s in samples[name])
        ttft = statistics.median(s["prompt_ms"] / 1000.0 for s in samples[name])
        pred = predicted[name].get("tokens_per_second")
        rows.append(
            {
                "variant": name,
                "tokens_per_second": round(tps, 2),
                "ttft_s": round(ttft, 2),
                "prompt_tokens": samples[name][0].get("prompt_n"),
                "predicted_tokens_per_second": pred,
                "predicted_ttft_s": predicted[name].get("ttft_s"),
                "error_pct": round(100.0 * (pred - tps) / tps, 1) if pred else None,
                "all_tokens_per_second": [round(s["predicted_per_second"], 2) for s in samples[name]],
                "llama_server_args": variants[name]["llama_server_args"],
            }
        )
    by = {r["variant"]: r for r in rows}
    print()
    print(
        "| variant | measured tokens/s | predicted tokens/s | error | measured TTFT s ({}-token prompt) | predicted TTFT s | per round |".format(
            rows[0]["prompt_tokens"]
        )
    )
    print("|---|--:|--:|--:|--:|--:|---|")
    for r in rows:
        print(
            "| {} | {:.2f} | {} | {} | {:.2f} | {} | {} |".format(
                r["variant"],
                r["tokens_per_second"],
                r["predicted_tokens_per_second"],
                "{:+.1f} %".format(r["error_pct"]) if r["error_pct"] is not None else "-",
                r["ttft_s"],
                r["predicted_ttft_s"],
                ", ".join(f"{x:.2f}" for x in r["all_tokens_per_second"]),
            )
        )
    speed, memory, dflt = (by[k]["tokens_per_second"] for k in ("speed", "memory", "default"))
    checks = [
        ("speed >= 1.5 x memory (%.2fx)" % (speed / memory), speed >= 1.5 * memory),
        ("speed >= 2 x default (%.2fx)" % (speed / dflt), speed >= 2 * dflt),
    ] + [
        (
            "{} prediction within +-25 %".format(r["variant"]),
            within(r["predicted_tokens_per_second"], r["tokens_per_second"]),
        )
        for r in rows
    ]
    print()
    for what, ok in checks:
        print("{} {}".format("ok  " if ok else "FAIL", what))
    elapsed = time.monotonic() - started
    print(f"benchmark wall time {elapsed:.0f} s; logs and plans in {tmp}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": rows,
                    "checks": dict(checks),
                    "wall_s": elapsed,
                    "profile": profile,
                    "predicted": predicted,
                },
                f,
                indent=2,
            )
    return 0 if all(ok for _name, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

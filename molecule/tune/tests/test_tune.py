"""playbooks/tune.yml on a small uneven fleet (run by molecule's verify step, in file order).

converge deployed the memory plan (no profile yet). The first tune.yml run must measure, re-plan
for speed, redeploy and measure both plans alternately, the speed plan's measured gain above
tune_min_gain (tune.json's verdict "kept"); the second run must reuse that profile, find the
fleet at the speed plan and change nothing; check mode must change nothing. Prints every figure it asserts on.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

HEAD = "tune-head"
WORKERS = ["tune-fast", "tune-nas"]
SCENARIO = Path(__file__).resolve().parents[1]
ROOT = SCENARIO.parents[1]
OUT = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent")) / "out"
HEAD_UNIT = "llmfleet-llama-server.service"
RPC_UNIT = "llmfleet-rpc-server.service"
# Each round the median of 3 requests of 24 tokens (api_bench takes llama-server's own decode
# rate, so a request's start does not weigh on it); the profile's one measuring request 32 tokens.
# Session 8: 3 x 32 (profile 48), load 5-7: rounds 4.83, 6.70, 5.23, 14.50 tokens/s, +111 %;
# 3 x 24 (profile 32), load 2-10: 8.24, 15.62, 8.26, 14.30 tokens/s, +81 %.
EXTRA = ["-e", "tune_requests=3", "-e", "tune_max_tokens=24", "-e", "profile_max_tokens=32"]
# Kept after molecule destroys the fleet (the ephemeral directory goes with it).
KEEP = Path(os.environ.get("TUNE_KEEP_DIR", "/tmp/llmfleet-tune-out"))


def sh(host: str, command: str) -> str:
    proc = subprocess.run(
        ["podman", "exec", host, "sh", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"{host}: {command!r} failed: {proc.stderr.strip()}"
    return proc.stdout


def tune(*args: str) -> tuple[str, float]:
    inventory = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "inventory"
    start = time.monotonic()
    # The output goes to a file as it comes: a run that hangs or is cut short can be read.
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / f"tune-{int(time.time())}.log"
    with path.open("w") as out:
        proc = subprocess.run(
            ["ansible-playbook", "-i", str(inventory), "llmfleet.cluster.tune", *EXTRA, *args],
            env={**os.environ, "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=3600,
            cwd=ROOT,
            check=False,
        )
    took = time.monotonic() - start
    log = path.read_text()
    KEEP.mkdir(parents=True, exist_ok=True)
    (KEEP / path.name).write_text(log)
    for name in ("profile.json", "tune.json", "plan.json", "tune/plan.json"):
        if (OUT / name).exists():
            (KEEP / f"{path.stem}-{name.replace('/', '-')}").write_text((OUT / name).read_text())
    print(f"\ntune.yml {' '.join(args)}: {took:.1f} s, output in {path}")
    assert proc.returncode == 0, log[-4000:]
    return log, took


def pids() -> dict:
    out = {HEAD: sh(HEAD, f"systemctl show -p MainPID --value {HEAD_UNIT}").strip()}
    for w in WORKERS:
        out[w] = sh(w, f"systemctl show -p MainPID --value {RPC_UNIT}").strip()
    return out


def layers(plan: dict) -> dict:
    return {h["name"]: h["layers"][1] - h["layers"][0] for h in plan["hosts"]}


def test_converge_served_the_memory_plan() -> None:
    plan = json.loads((OUT / "plan.json").read_text())
    print(f"\nconverged plan: objective {plan['objective']}, layers {layers(plan)}")
    assert plan["objective"] == "memory"
    assert set(plan["workers"]) == set(WORKERS)
    # the slow worker holds a real share: that is what the speed plan must undo
    assert layers(plan)["tune-nas"] >= 4, layers(plan)


def test_tune_redeploys_the_speed_plan_and_it_measures_faster() -> None:
    before_plan = json.loads((OUT / "plan.json").read_text())
    log, took = tune()
    result = json.loads((OUT / "tune.json").read_text())
    print(f"\ntune.yml first run: {took:.1f} s")
    for line in result["table"]:
        print(line)
    for side in ("before", "after"):
        for key in ("tokens_per_second", "ttft_s", "llama_server_args"):
            assert key in result[side], (side, key)
        assert result[side]["tokens_per_second"] > 0 and result[side]["ttft_s"] > 0
    assert set(result["predicted_tokens_per_second"]) == {"before", "after"}
    assert result["redeployed"] is True, result["reason"]
    assert result["before"]["llama_server_args"] == before_plan["llama_server_args"]
    assert result["after"]["llama_server_args"] != before_plan["llama_server_args"]
    # A, B, A, B in one run
    assert [r["plan"] for r in result["rounds"]] == ["before", "after", "before", "after"]
    # the gain, from the rounds themselves (medians per plan)
    tps = {
        side: statistics.median(r["tokens_per_second"] for r in result["rounds"] if r["plan"] == side)
        for side in ("before", "after")
    }
    ratio = tps["after"] / tps["before"]
    need = 1.0 + result["min_gain"]
    print(f"measured {tps['before']:.2f} -> {tps['after']:.2f} tokens/s: {ratio:.2f}x (need > {need:.2f}x)")
    print(result["verdict"])
    assert ratio > need, result["rounds"]
    assert result["gain_confirmed"] is True and result["verdict"].startswith("kept: "), result["verdict"]
    assert result["verdict"] in log
    # kept: the fleet ends on the speed plan: the plan.json on the controller and the head's own copy
    now = json.loads((OUT / "plan.json").read_text())
    served = json.loads(sh(HEAD, "cat /etc/llmfleet/plan.json"))
    assert now["llama_server_args"] == result["after"]["llama_server_args"]
    assert served["llama_server_args"] == result["after"]["llama_server_args"]
    print(f"speed plan layers {layers(now)} (memory plan {layers(before_plan)})")
    assert layers(now)["tune-fast"] > layers(before_plan)["tune-fast"]
    assert "redeploy: the speed plan is predicted" in log
    assert "measuring the running plan: no usable figures for" in log


def test_a_second_run_changes_nothing() -> None:
    running = pids()
    log, took = tune()
    result = json.loads((OUT / "tune.json").read_text())
    print(f"\ntune.yml second run: {took:.1f} s; {result['reason']}")
    assert result["redeployed"] is False
    assert result["reason"] in log
    # the first run's figures are reused: no measuring placement, no restart
    assert "profile.json has usable figures for every host of the fleet" in log
    assert [r["plan"] for r in result["rounds"]] == ["before"]
    assert result["after"]["llama_server_args"] == result["before"]["llama_server_args"]
    assert pids() == running, "a second run restarted a llama.cpp process"
    recap = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)", log, re.M)
    print(f"recap {recap}")


def test_check_mode_changes_nothing() -> None:
    running = pids()
    stamp = (OUT / "tune.json").stat().st_mtime
    log, took = tune("--check")
    print(f"\ntune.yml --check: {took:.1f} s")
    assert "check mode, nothing changed: would" in log
    recap = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)", log, re.M)
    print(f"recap {recap}")
    assert recap and all(changed == "0" for _h, _ok, changed in recap), recap
    assert (OUT / "tune.json").stat().st_mtime == stamp
    assert pids() == running

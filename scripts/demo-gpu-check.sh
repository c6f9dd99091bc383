#!/usr/bin/env bash
# The GPU fleet as a test (`make demo-gpu-check`, part of `make test`): bring up inventories/demo-gpu
# with scripts/demo.sh (a head and a worker with a real Vulkan device, Mesa's lavapipe, running
# llama.cpp's Vulkan build, beside a CPU worker; site.yml ends with verify.yml, which fails unless
# every worker worked during a real request and every planned device's buffers in llama.cpp's own
# report are within the goal of the plan's prediction), then check in the plan and verify's table
# that the head's own Vulkan0 and the worker's Vulkan0 and CPU (its rpc-server's -d Vulkan0,CPU)
# each held layers, then run the README's tune.yml line on it (scripts/demo-tune-check.sh) and check
# that the profile priced every Vulkan device, and remove the fleet again unless it was already running.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=/dev/null
source scripts/env.sh

# shellcheck source=scripts/demo-fleet.sh
source scripts/demo-fleet.sh
demo_fleet demo-gpu-check "${1:-inventories/demo-gpu}"

start=$(date +%s)
up_log=$state.gpu-up.log
mkdir -p "$(dirname "$state")"
bash scripts/demo.sh up "$inventory" | tee "$up_log"

echo "demo-gpu-check: the devices each rpc-server serves (its unit's -d) and verify's table ($state/out/verify.txt)"
cat "$state/out/verify.txt"

python3 - "$state/inventory.json" "$state/out/plan.json" "$state/out/verify.json" <<'PY'
import json, sys
inv = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
report = json.load(open(sys.argv[3]))["report"]
hostvars = inv["_meta"]["hostvars"]
vulkan = [h for h in inv["llm_head"]["hosts"] + inv["llm_workers"]["hosts"]
          if hostvars[h].get("llama_cpp_flavour") == "ubuntu-vulkan-x64"]
head = inv["llm_head"]["hosts"][0]
assert head in vulkan and len(vulkan) >= 2, f"demo-gpu-check: the inventory needs the head and a worker on the Vulkan build, got {vulkan}"
planned = {(h["name"], d["name"]): d for h in plan["hosts"] for d in h.get("devices") or []}
rows = {(r["host"], r["device"]): r for r in report.get("devices") or []}
def held(key):
    d = planned.get(key)
    return d is not None and d["layers"][1] > d["layers"][0]
# the head's own Vulkan0, and a worker's Vulkan0 and CPU behind one rpc-server, each with layers
must = [(head, "Vulkan0")] + [(w, dev) for w in vulkan if w != head for dev in ("Vulkan0", "CPU")]
for key in must:
    assert held(key), f"demo-gpu-check: {key[0]} device {key[1]} holds no layers in the plan: {planned.get(key)}"
for key, d in planned.items():
    row = rows.get(key)
    assert row is not None, f"demo-gpu-check: verify's device table has no row for {key[0]} {key[1]}"
    assert row["ok"], f"demo-gpu-check: {key[0]} {key[1]}: {row}"
    if held(key):
        assert row["reported_total_mib"], f"demo-gpu-check: llama.cpp reports no buffers for {key[0]} {key[1]}: {row}"
    print(f"demo-gpu-check: {key[0]} {key[1]} ({row['report_name']}): layers {row['layers']}, "
          f"predicted {row['predicted_mib']:.1f} MiB, reported {row['reported_total_mib']} MiB {row['reported_mib']}, "
          f"goal {row['goal_mib']}")
PY
# each worker's rpc-server serves exactly its planned devices, in the plan's order (its unit's -d)
python3 -c 'import json, sys
plan = json.load(open(sys.argv[1]))
for h in plan["hosts"][1:]:
    names = [d["name"] for d in h.get("devices") or [] if d["layers"][1] > d["layers"][0] or d.get("output_layer")]
    print(h["name"], ",".join(names) if any(n != "CPU" for n in names) else "-")' "$state/out/plan.json" |
  while read -r w devices; do
    exec_start=$(podman exec "$w" systemctl show -p ExecStart --value llmfleet-rpc-server.service)
    echo "  $w: $(sed -n 's/.*argv\[\]=\([^;]*\);.*/\1/p' <<<"$exec_start")"
    if [[ $devices != - && $exec_start != *"-d $devices "* ]]; then
      echo "demo-gpu-check: $w's rpc-server does not serve -d $devices (the plan's devices): $exec_start" >&2
      exit 1
    fi
  done
echo "demo-gpu-check: the fleet served its plan per device ($(($(date +%s) - start)) s); now the README's tune.yml line"

# The README's tune.yml line on it (scripts/demo-tune-check.sh: measured, decided, said so, each
# plan's median against its prediction), then: the profile measured every Vulkan device of the
# plan from its own pair of requests (docs/profile.md, "Per device"): priced, or the reason it
# could not be (a pair too noisy), and at least one priced.
# The bounds are demo-tune-check's own, 0.5-2x (the +-25 % goal is printed, met or not): with the
# head's token time from the request without devices, both plans measured 0.83-0.98x of their
# predictions here (docs/vulkan.md, "Speed")
DEMO_TUNE_UP_LOG=$up_log bash scripts/demo-tune-check.sh "$inventory"
python3 - "$state/out/profile.json" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
priced = 0
# every host's devices other than its CPU, as its fingerprint lists them ("Vulkan0 llvmpipe ... 2048"):
# the plan served afterwards may be the speed plan, which need not use them
for name, entry in sorted(profile["hosts"].items()):
    for listed in entry["fingerprint"].get("devices") or []:
        dev = listed.split()[0]
        fig = (entry.get("devices") or {}).get(dev)
        if not fig:
            # measured, but too noisy to price (the reason names the host and the device)
            why = [r for r in entry.get("not_measured") or [] if f" device {dev}:" in r]
            assert why, f"demo-gpu-check: the profile neither priced {name} {dev} nor said why: {entry}"
            print(f"demo-gpu-check: {why[0]}")
            continue
        priced += 1
        cpu = entry["compute"]
        print(f"demo-gpu-check: {name} {dev}: {fig['ms_per_layer']:.3f} ms a layer "
              f"({fig['layers']} layers: {fig['ms_per_token_on_device']:.1f} ms a token on it, "
              f"{fig['ms_per_token_on_cpu']:.1f} on the CPU), the host's CPU {cpu['ms_per_layer']:.3f}"
              + (" (cpu_alone)" if cpu.get("cpu_alone") else ""))
assert priced, "demo-gpu-check: the profile priced no Vulkan device from its requests"
PY
echo "demo-gpu-check: passed in $(($(date +%s) - start)) s"

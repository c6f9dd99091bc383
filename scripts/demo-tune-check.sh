#!/usr/bin/env bash
# The demo fleet as the user's playground, as a test (`make demo-tune-check`, part of `make test`): bring up a demo
# fleet (inventories/demo-uneven by default: llmfleet_tls, the API behind the chat page's TLS port)
# with scripts/demo.sh (or take the one a caller brought up: DEMO_TUNE_UP_LOG, its demo's output), then run the README's tune.yml line on it exactly as printed (no -e: the
# inventory names the demo's output directory, the demo's mirror is still up), and check that it
# measured every round through the fleet's entry point, decided and said so (tune.json, the
# verdict in its log). The fleet is removed afterwards unless it was already running before.
# Boots podman hosts: run it under the machine-wide lock (flock /tmp/llmfleet-heavy.lock).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=/dev/null
source scripts/env.sh

# shellcheck source=scripts/demo-fleet.sh
source scripts/demo-fleet.sh
demo_fleet demo-tune-check "${1:-inventories/demo-uneven}"

start=$(date +%s)
# the demo's and tune.yml's output, beside the demo's directory (demo down removes the directory)
up_log=$(dirname "$state")/$(basename "$state").up.log
tune_log=$(dirname "$state")/$(basename "$state").tune.log
mkdir -p "$(dirname "$state")"
if [[ -n ${DEMO_TUNE_UP_LOG:-} ]]; then
  # the caller brought the fleet up just now (scripts/demo-gpu-check.sh): its demo's output
  up_log=$DEMO_TUNE_UP_LOG
else
  bash scripts/demo.sh up "$inventory" | tee "$up_log"
fi
up_time=$(($(date +%s) - start))
grep -qF "ansible-playbook playbooks/tune.yml -i $inventory" "$up_log" || {
  echo "demo-tune-check: the demo did not print how to tune it" >&2
  exit 1
}
rm -f "$state/out/tune.json"

# The README's line, as printed.
tune_start=$(date +%s)
if ! ansible-playbook playbooks/tune.yml -i "$inventory" >"$tune_log" 2>&1; then
  tail -n 60 "$tune_log" >&2
  echo "demo-tune-check: tune.yml failed; the log is $tune_log" >&2
  exit 1
fi
tune_time=$(($(date +%s) - tune_start))
# the bounds outside which a prediction is wrong, not noisy (DEMO_TUNE_BOUNDS, "LOW HIGH")
read -r low high <<<"${DEMO_TUNE_BOUNDS:-0.5 2.0}"
python3 - "$state/out" "$tune_log" "$low" "$high" <<'PY'
import json, pathlib, sys
out, log = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).read_text()
low, high = float(sys.argv[3]), float(sys.argv[4])
result = json.loads((out / "tune.json").read_text())
rounds = result["rounds"]
assert rounds, "tune.json has no measured round"
for r in rounds:
    assert r["tokens_per_second"] and r["tokens_per_second"] > 0, r
assert result["reason"] and result["reason"][:40] in log, result["reason"]
assert result["verdict"] and result["verdict"][:40] in log, result["verdict"]
print(f"demo-tune-check: decided: {result['reason']}")
print(f"demo-tune-check: measured {len(rounds)} round(s): "
      + ", ".join(f"{r['plan']} {r['tokens_per_second']:.2f} tokens/s" for r in rounds))
print(f"demo-tune-check: verdict: {result['verdict']}")
# each measured plan's median against the prediction tune.yml made for it: the goal is +-25 %
# (docs/tune.md), met when the machine is not shared; beside other work the profile and the rounds
# are measured under different loads (0.62x seen with two other fleets' builds running), so the
# check fails only outside 0.5-2x (a prediction that is wrong, not noisy; DEMO_TUNE_BOUNDS) and
# says which it met.
import statistics
for plan, predicted in sorted(result["predicted_tokens_per_second"].items()):
    got = [r["tokens_per_second"] for r in rounds if r["plan"] == plan]
    if not got:
        continue
    median = statistics.median(got)
    ratio = median / predicted
    goal = "within" if 0.75 <= ratio <= 1.25 else "OUTSIDE"
    print(f"demo-tune-check: {plan}: measured {median:.2f} tokens/s (median of {len(got)}), predicted {predicted:.2f}: "
          f"{ratio:.2f}x, {goal} the +-25 % goal")
    assert low <= ratio <= high, f"demo-tune-check: {plan}: measured {median:.2f} tokens/s against the predicted {predicted:.2f}: {ratio:.2f}x is outside {low:g}-{high:g}x"
PY
echo "demo-tune-check: passed (demo up ${up_time}s, tune.yml ${tune_time}s; the log is $tune_log)"

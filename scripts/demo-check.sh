#!/usr/bin/env bash
# The demo end to end, as a test (`make demo-check`, part of `make test`): bring up the demo
# fleet with scripts/demo.sh (site.yml ends with verify.yml, which fails unless every worker
# worked and carried traffic during a real request), then drive its chat page in a real browser
# (tests/browser against the page on the head, over TLS, with the fleet's own model), and remove
# the fleet again, unless it was already running before (then it is only re-converged and kept).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=/dev/null
source scripts/env.sh

# shellcheck source=scripts/demo-fleet.sh
source scripts/demo-fleet.sh
demo_fleet demo-check "${1:-inventories/demo}"

# The demo's real answer is made while tcpdump captures the bridge (head <-> workers): with
# WireGuard on, nothing of it may cross in clear (scripts/check-capture.py prints the figures).
mkdir -p "$state"
rm -f "$state/capture.pcap" "$state/capture.pcap.json"
DEMO_CAPTURE=$state/capture.pcap bash scripts/demo.sh up "$inventory"
python3 scripts/check-capture.py "$state/capture.pcap"

for f in chat-url chat-password; do
  [[ -s $state/out/$f ]] || {
    echo "demo-check: $state/out/$f is missing: the inventory must deploy the chat page" >&2
    exit 1
  }
done
echo "demo-check: the table verify.yml printed is $state/out/verify.txt"
cat "$state/out/verify.txt"

LLMFLEET_CHAT_URL=$(cat "$state/out/chat-url")
LLMFLEET_CHAT_PASSWORD=$(cat "$state/out/chat-password")
LLMFLEET_CHAT_API_KEY=$(podman exec "$head" cat /etc/llmfleet/api-key)
LLMFLEET_CHAT_USER=$(ansible-inventory -i "$inventory" --host "$head" | python3 -c \
  'import json,sys; print(json.load(sys.stdin).get("chat_ui_username", "llmfleet"))')
LLMFLEET_TEST_OUTPUT=$ROOT/tests/output/demo
export LLMFLEET_CHAT_URL LLMFLEET_CHAT_PASSWORD LLMFLEET_CHAT_API_KEY LLMFLEET_CHAT_USER LLMFLEET_TEST_OUTPUT
# The demo's model is small and the workers have half a CPU each: a short answer is enough.
export LLMFLEET_CHAT_PROMPT=${LLMFLEET_CHAT_PROMPT:-"Name three colours of the sea."}
echo "demo-check: the browser against $LLMFLEET_CHAT_URL"
pytest -q -s tests/browser -p no:cacheprovider

# bench.yml over the same entry point (with llmfleet_tls: https on the page's port, the page's own
# certificate trusted through Ansible), then what it wrote: every request answered, a memory chart
# for every planned host and the tokens/s chart.
echo "demo-check: bench.yml, 4 requests 2 at a time"
ansible-playbook -i "$inventory" playbooks/bench.yml -e "llmfleet_output_dir=$state/out" \
  -e bench_requests=4 -e bench_concurrency=2 -e bench_max_tokens=24 >"$state/bench.log" || {
  tail -n 40 "$state/bench.log" >&2
  echo "demo-check: bench.yml failed; the log is $state/bench.log" >&2
  exit 1
}
python3 - "$state/out" "$LLMFLEET_TEST_OUTPUT" <<'PY'
import json, pathlib, shutil, sys
out, keep = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
bench = json.loads((out / "bench.json").read_text())
plan = json.loads((out / "plan.json").read_text())
summary, url = bench["summary"], bench["settings"]["url"]
tls = (out / "chat-url").read_text().startswith("https:")
assert url.startswith("https:" if tls else "http:"), f"bench went to {url}"
assert summary["ok"] == summary["requests"] == 4, summary
charts = ["tokens.svg"] + [f"memory-{h['name']}.svg" for h in plan["hosts"]]
for name in charts:
    svg = (out / name).read_text()
    assert svg.lstrip().startswith("<svg") or "<svg" in svg[:200], name
    shutil.copy(out / name, keep / name)
shutil.copy(out / "bench.json", keep / "bench.json")
print(f"demo-check: bench {url}: {summary['ok']}/{summary['requests']} answered; TTFT median "
      f"{summary['ttft_seconds']['median']:.2f} s; output {summary['output_tps']['median']:.1f} tokens/s per "
      f"request; {len(charts)} charts")
PY
python3 scripts/check-prometheus.py "$inventory"
echo "demo-check: passed (screenshots, bench.json and charts in $LLMFLEET_TEST_OUTPUT)"

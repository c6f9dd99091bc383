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

inventory=${1:-inventories/demo}
state=$CACHE/demo/$(basename "$(cd "$(dirname "$inventory")" && pwd)/$(basename "$inventory")")
head=$(ansible-inventory -i "$inventory" --list | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["llm_head"]["hosts"][0])')

created=1
if podman container exists "$head"; then
  created=0
  echo "demo-check: $head is already running: re-converging it, and keeping it afterwards"
fi
cleanup() {
  if [[ $created == 1 ]]; then bash scripts/demo.sh down "$inventory" >/dev/null || true; fi
}
trap cleanup EXIT

bash scripts/demo.sh up "$inventory"

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
echo "demo-check: passed (screenshots in $LLMFLEET_TEST_OUTPUT)"

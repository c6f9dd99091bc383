# shellcheck shell=bash
# Sourced by the demo tests (scripts/demo-check.sh, scripts/demo-tune-check.sh), after env.sh:
#   demo_fleet NAME INVENTORY
# sets `inventory`, `state` (the demo's directory under $CACHE/demo) and `head` (its head's
# container), and removes the fleet on exit unless it was already running (then the caller only
# re-converges it and it is kept). NAME prefixes what it prints.
demo_fleet() {
  inventory=$2
  # shellcheck disable=SC2034 # read by the callers
  state=$CACHE/demo/$(basename "$(cd "$(dirname "$inventory")" && pwd)/$(basename "$inventory")")
  head=$(ansible-inventory -i "$inventory" --list | python3 -c \
    'import json,sys; print(json.load(sys.stdin)["llm_head"]["hosts"][0])')
  _demo_fleet_created=1
  if podman container exists "$head"; then
    _demo_fleet_created=0
    echo "$1: $head is already running: re-converging it, and keeping it afterwards"
  fi
  trap _demo_fleet_down EXIT
}

_demo_fleet_down() {
  if [[ $_demo_fleet_created == 1 ]]; then bash scripts/demo.sh down "$inventory" >/dev/null || true; fi
}

#!/usr/bin/env bash
# `make test`: every part in order, stopping at the first that fails, then one line per part with
# its seconds (also written to .cache/make-test-times.txt), so CI's log shows where the time goes.
#   setup       the tools and every artifact (make setup: venv, podman, host image, llama.cpp,
#               models, the vLLM venv and model; each from the artifact cache when built before)
#   lint unit docs-check gates manifests build-check browser molecule demo-check
#   demo-mixed-check  inventories/demo-mixed: an x86_64 head, an x86 and an arm64 worker (qemu-user)
#   demo-gpu-check    inventories/demo-gpu: Vulkan devices (lavapipe) on the head and a worker
#   demo-tune-check   inventories/demo-uneven up, then the README's tune.yml line on it
# MAKE_TEST_PARTS="lint unit" runs only those (in the order above).
set -euo pipefail
cd "$(dirname "$0")/.."
parts=(setup lint unit docs-check gates manifests build-check browser molecule demo-check demo-mixed-check demo-gpu-check demo-tune-check)
if [[ -n ${MAKE_TEST_PARTS:-} ]]; then
  wanted=" $MAKE_TEST_PARTS "
  chosen=()
  for p in "${parts[@]}"; do [[ $wanted == *" $p "* ]] && chosen+=("$p"); done
  parts=("${chosen[@]}")
fi
MAKE=${MAKE:-make}
summary=()
total_start=$SECONDS
result=passed
report() {
  local out=.cache/make-test-times.txt line
  mkdir -p .cache
  {
    for line in "${summary[@]}"; do printf 'make test: %s\n' "$line"; done
    printf 'make test: %-12s %6d s  %s\n' total $((SECONDS - total_start)) "$result"
  } | tee "$out"
}
for part in "${parts[@]}"; do
  echo "make test: ---- $part ----"
  start=$SECONDS
  rc=0
  "$MAKE" --no-print-directory "$part" || rc=$?
  secs=$((SECONDS - start))
  if ((rc != 0)); then
    summary+=("$(printf '%-12s %6d s  FAILED (exit %d)' "$part" "$secs" "$rc")")
    result="FAILED at $part"
    report
    exit "$rc"
  fi
  summary+=("$(printf '%-12s %6d s' "$part" "$secs")")
done
result="all checks passed"
report

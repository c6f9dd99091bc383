#!/usr/bin/env bash
# Run every molecule scenario (or the ones named) with the full test sequence.
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=("$@")
# Scenarios run only when named (or with LLMFLEET_MOLECULE_ALL=1): their time does not fit CI's
# budget yet. vllm_lws: the vLLM venv cold and two vLLM ranks on 2 cores (docs/vllm-lws.md).
only_when_named=" vllm_lws "
if ((${#scenarios[@]} == 0)); then
  for d in molecule/*/molecule.yml; do
    s=$(basename "$(dirname "$d")")
    if [[ $only_when_named == *" $s "* && ${LLMFLEET_MOLECULE_ALL:-0} != 1 ]]; then
      echo "molecule: $s runs only when named (make molecule SCENARIO=$s)"
      continue
    fi
    scenarios+=("$s")
  done
fi
rc=0; summary=()
for s in "${scenarios[@]}"; do
  start=$(date +%s)
  if molecule test -s "$s"; then result=passed; else result=FAILED; rc=1; fi
  summary+=("$(printf '%-20s %-7s %4ss' "$s" "$result" "$(( $(date +%s) - start ))")")
done
printf 'molecule: %s\n' "${summary[@]}"
exit $rc

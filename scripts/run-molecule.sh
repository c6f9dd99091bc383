#!/usr/bin/env bash
# Run every molecule scenario (or the ones named) with the full test sequence, and print the
# seconds each scenario and each of its actions took (create, prepare, converge, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=("$@")
# A scenario whose directory holds a NAMED_ONLY file (it says why) runs only when named, or with
# LLMFLEET_MOLECULE_ALL=1: its time does not fit CI's budget yet.
if ((${#scenarios[@]} == 0)); then
  for d in molecule/*/molecule.yml; do
    s=$(dirname "$d")
    if [[ -e $s/NAMED_ONLY && ${LLMFLEET_MOLECULE_ALL:-0} != 1 ]]; then
      echo "molecule: ${s#molecule/} runs only when named (make molecule SCENARIO=${s#molecule/}; $s/NAMED_ONLY says why)"
      continue
    fi
    scenarios+=("${s#molecule/}")
  done
fi
# Pass molecule's output through, timing its actions: "[scenario > action] Executing" starts one,
# the next such line (or the end) ends it. Prints "action Ns ..." on one line at the end.
time_actions() {
  local line action="" start=0 now parts=()
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [[ $line =~ \[[^]\>]+\>\ ([a-z_]+)\]\ Executing ]]; then
      now=$(date +%s)
      [[ -n $action ]] && parts+=("$action $((now - start))s")
      action=${BASH_REMATCH[1]} start=$now
    fi
  done
  [[ -n $action ]] && parts+=("$action $(($(date +%s) - start))s")
  printf '%s\n' "${parts[*]:-}" > "$1"
}
rc=0; summary=()
for s in "${scenarios[@]}"; do
  start=$(date +%s)
  steps=$(mktemp)
  if molecule test -s "$s" 2>&1 | time_actions "$steps"; then result=passed; else result=FAILED; rc=1; fi
  summary+=("$(printf '%-20s %-7s %4ss  (%s)' "$s" "$result" "$(( $(date +%s) - start ))" "$(cat "$steps")")")
  rm -f "$steps"
done
printf 'molecule: %s\n' "${summary[@]}"
exit $rc

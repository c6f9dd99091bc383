#!/usr/bin/env bash
# Run every molecule scenario (or the ones named) with the full test sequence; a scenario
# directory holding a NAMED_ONLY file runs only when named.
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=("$@")
if ((${#scenarios[@]} == 0)); then
  # A scenario with a NAMED_ONLY file runs only when named (the file says why).
  for d in molecule/*/molecule.yml; do
    [[ -e "$(dirname "$d")/NAMED_ONLY" ]] && continue
    scenarios+=("$(basename "$(dirname "$d")")")
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

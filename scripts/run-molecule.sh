#!/usr/bin/env bash
# Run every molecule scenario (or the ones named) with the full test sequence.
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=("$@")
# Scenarios that run only when named (make molecule SCENARIO=name): CI's 90 minutes have no room
# for them in make test. wireguard: the tunnel's must-shows (docs/wireguard.md).
NAMED_ONLY=(wireguard)
if ((${#scenarios[@]} == 0)); then
  for d in molecule/*/molecule.yml; do
    s=$(basename "$(dirname "$d")")
    [[ " ${NAMED_ONLY[*]} " == *" $s "* ]] && { echo "molecule: $s runs only when named (SCENARIO=$s)"; continue; }
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

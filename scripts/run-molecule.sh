#!/usr/bin/env bash
# Run every molecule scenario (or the ones named) with the full test sequence, and print the
# seconds each scenario and each of its actions took (create, prepare, converge, ...).
#
# LLMFLEET_MOLECULE_LANES=N (default 1) runs up to N scenarios at once, each with its own
# containers, network and mirror: a scenario that mostly waits (sleeps, timeouts, polls) uses
# the CPU another one leaves idle. A scenario whose directory holds a RUN_ALONE file (it says
# why) runs first, by itself, with nothing beside it. With N > 1 each scenario's output goes to
# its log and is printed whole when the scenario ends; with N = 1 it streams as it comes. Either
# way every scenario's output is kept in $LLMFLEET_MOLECULE_LOGS/<scenario>.log (default
# .cache/molecule-logs), the last line has one summary per scenario in the order they were
# named, and the exit status is 1 when any scenario failed.
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
lanes=${LLMFLEET_MOLECULE_LANES:-1}
if [[ ! $lanes =~ ^[1-9][0-9]*$ ]]; then
  echo "run-molecule: LLMFLEET_MOLECULE_LANES must be a whole number of at least 1, not '$lanes'" >&2
  exit 2
fi
logs=${LLMFLEET_MOLECULE_LOGS:-.cache/molecule-logs}
mkdir -p "$logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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

# run_one SCENARIO STREAM: `molecule test` of one scenario, its output kept in its log (and
# streamed when STREAM is 1); writes its summary line to $work/SCENARIO.summary.
run_one() {
  local s=$1 stream=$2 start secs result=passed
  start=$(date +%s)
  if [[ $stream == 1 ]]; then
    molecule test -s "$s" < /dev/null 2>&1 | time_actions "$work/$s.steps" | tee "$logs/$s.log" || result=FAILED
  else
    molecule test -s "$s" < /dev/null 2>&1 | time_actions "$work/$s.steps" > "$logs/$s.log" || result=FAILED
  fi
  secs=$(($(date +%s) - start))
  printf '%-20s %-7s %4ss  (%s)\n' "$s" "$result" "$secs" "$(cat "$work/$s.steps")" > "$work/$s.summary"
  echo "$result in $secs s" > "$work/$s.result"
  [[ $result == passed ]]
}

# lane ID: take the next scenario of the shared queue until it is empty.
lane() {
  local id=$1 i s
  while true; do
    {
      flock 9
      i=$(< "$work/next")
      echo $((i + 1)) > "$work/next"
    } 9> "$work/next.lock"
    ((i < ${#shared[@]})) || return 0
    s=${shared[i]}
    echo "molecule: $s started in lane $id (its output follows when it ends; $logs/$s.log)"
    run_one "$s" 0 || true
    {
      flock 9
      echo "molecule: ---- $s (lane $id) ----"
      cat "$logs/$s.log"
      echo "molecule: ---- end of $s: $(cat "$work/$s.result") ----"
    } 9> "$work/print.lock"
  done
}

alone=() shared=()
for s in "${scenarios[@]}"; do
  if ((lanes > 1)) && [[ -e molecule/$s/RUN_ALONE ]]; then alone+=("$s"); else shared+=("$s"); fi
done
if ((lanes == 1)); then
  for s in "${shared[@]}"; do run_one "$s" 1 || true; done
else
  for s in "${alone[@]}"; do
    echo "molecule: $s runs alone (molecule/$s/RUN_ALONE says why)"
    run_one "$s" 1 || true
  done
  echo 0 > "$work/next"
  pids=()
  for ((l = 1; l <= lanes && l <= ${#shared[@]}; l++)); do
    lane "$l" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
fi
rc=0 summary=()
for s in "${scenarios[@]}"; do
  if [[ -s $work/$s.summary ]]; then line=$(< "$work/$s.summary"); else line="$s FAILED (no result)"; fi
  summary+=("$line")
  read -r _ result _ <<< "$line"
  [[ $result == passed ]] || rc=1
done
printf 'molecule: %s\n' "${summary[@]}"
exit $rc

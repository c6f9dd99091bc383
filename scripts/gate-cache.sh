#!/usr/bin/env bash
# Run a slow gate of `make test` (sanity, docs-lint, galaxy-check) only when what it reads changed.
#
#   scripts/gate-cache.sh NAME [PATHSPEC...] -- COMMAND...
#
# The key is a sha256 over the gate's name, the command line, the tools' pins (requirements.txt,
# always part of it) and every file git knows (tracked, or untracked and not ignored) under the
# pathspecs, by path and content (a symlink by its target), so uncommitted edits count. A stamp
# NAME-<key> is written when COMMAND passes; with it present COMMAND is skipped. The stamps live in
# the machine's artifact cache ($LLMFLEET_CACHE/gates, default ~/.cache/llmfleet/gates; see
# scripts/artifact-cache.py), so a fresh clone of a tree that passed on this machine skips too; the
# newest 20 per gate are kept (checkouts at different commits keep theirs). GATES_FORCE=1 runs
# COMMAND whatever the stamps say; GATE_CACHE=DIR puts the stamps elsewhere.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: $0 NAME [PATHSPEC...] -- COMMAND..." >&2; exit 2; }
(($# >= 3)) || usage
name=$1
shift
specs=()
while (($#)) && [[ $1 != -- ]]; do
  specs+=("$1")
  shift
done
(($# >= 2)) || usage
shift
((${#specs[@]})) || specs=(.)
stamps=${GATE_CACHE:-${LLMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmfleet}/gates}

cd "$ROOT"
files=()
links=()
while IFS= read -r -d '' f; do
  if [[ -L $f ]]; then
    links+=("$f -> $(readlink "$f")")
  elif [[ -f $f ]]; then
    files+=("$f")
  fi # a tracked file deleted in the work tree is left out
done < <(git ls-files -z --cached --others --exclude-standard -- "${specs[@]}" | sort -zu)
key=$(
  {
    printf 'gate %s\ncommand %s\n' "$name" "$*"
    [[ -f requirements.txt ]] && sha256sum requirements.txt
    if ((${#links[@]})); then printf 'link %s\n' "${links[@]}"; fi
    if ((${#files[@]})); then printf '%s\0' "${files[@]}" | xargs -0 sha256sum --; fi
  } | sha256sum | cut -c1-16
)
stamp=$stamps/$name-$key
if [[ ${GATES_FORCE:-0} != 1 && -f $stamp ]]; then
  echo "$name: inputs unchanged since it passed ($(cat "$stamp")), skipped (stamp $stamp)"
  exit 0
fi
start=$SECONDS
"$@"
took=$((SECONDS - start))
mkdir -p "$stamps"
printf '%s, %d s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$took" >"$stamp.tmp.$$" && mv "$stamp.tmp.$$" "$stamp"
# shellcheck disable=SC2012  # the stamps are NAME-<16 hex digits>: nothing ls could mangle
ls -1t "$stamps/$name"-???????????????? 2>/dev/null | tail -n +21 | xargs -r rm -f --
echo "$name: passed in $took s (stamp $stamp)"

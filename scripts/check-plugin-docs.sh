#!/usr/bin/env bash
# Every module and filter of the collection must render with ansible-doc
# (the offline stand-in for `ansible-test sanity --test validate-modules`).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0; n=0
for type in module filter; do
  dir=plugins/${type}s; [[ $type == filter ]] && dir=plugins/filter
  for f in "$dir"/*.py; do
    [[ -e $f ]] || continue
    name=$(basename "$f" .py); [[ $name == __init__ ]] && continue
    n=$((n + 1))
    if ! out=$(ansible-doc -t "$type" "llmfleet.cluster.$name" 2>&1) || [[ $out != *"llmfleet.cluster.$name"* ]]; then
      echo "docs-check: $type llmfleet.cluster.$name does not render:"; echo "$out" | tail -5; fail=1
    fi
  done
done
listed=$(ansible-doc -l llmfleet.cluster 2>/dev/null | wc -l)
echo "docs-check: $n plugins rendered, ansible-doc -l lists $listed modules"
exit $fail

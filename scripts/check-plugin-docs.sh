#!/usr/bin/env bash
# Every module and filter of the collection must render with ansible-doc
# (the offline stand-in for `ansible-test sanity --test validate-modules`).
# Modules: one per file, documented inline. Filters: several per file, grouped by stage
# (plugins/filter/<stage>.py), each documented by its sidecar plugins/filter/<name>.yml
# (ansible-doc finds it beside the file that defines the filter); a filter without its sidecar,
# or a sidecar without its filter, fails.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0; n=0
check() { # type name
  n=$((n + 1))
  if ! out=$(ansible-doc -t "$1" "llmfleet.cluster.$2" 2>&1) || [[ $out != *"llmfleet.cluster.$2"* ]]; then
    echo "docs-check: $1 llmfleet.cluster.$2 does not render:"; echo "$out" | tail -5; fail=1
  fi
}
for f in plugins/modules/*.py; do
  [[ -e $f ]] || continue
  name=$(basename "$f" .py); [[ $name == __init__ ]] && continue
  check module "$name"
done
filters=$(python - <<'PY'
import ast, pathlib
# the names that the FilterModule of each stage file returns (read, not imported)
names = []
for path in sorted(pathlib.Path("plugins/filter").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "filters":
            ret = next(n for n in ast.walk(node) if isinstance(n, ast.Return))
            names += [k.value for k in ret.value.keys]
print(" ".join(sorted(names)))
PY
)
sidecars=$(find plugins/filter -maxdepth 1 -name '*.yml' -printf '%f\n' | sed 's/\.yml$//' | sort | tr '\n' ' ')
if [[ "$filters " != "$sidecars" ]]; then
  echo "docs-check: filters and their sidecar docs differ:"
  echo "  filters:  $filters"; echo "  sidecars: $sidecars"; fail=1
fi
for name in $filters; do check filter "$name"; done
listed=$(ansible-doc -l llmfleet.cluster 2>/dev/null | wc -l)
echo "docs-check: $n plugins rendered, ansible-doc -l lists $listed modules"
exit $fail

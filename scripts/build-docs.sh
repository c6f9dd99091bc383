#!/usr/bin/env bash
# make docs: the role READMEs and the HTML docs site (docs/development.md, "The ecosystem's gates").
#
#   scripts/build-docs.sh readmes   roles/*/README.md from meta/argument_specs.yml + meta/main.yml
#                                   (aar-doc with scripts/role-readme.md.j2)
#   scripts/build-docs.sh site [DIR]  the HTML site in DIR (default build/docs): antsibull-docs
#                                   writes a page per module, filter and role, Sphinx adds the
#                                   Markdown pages of docs/ (myst-parser) and builds DIR/html
#   scripts/build-docs.sh           both
#
# DOCS_STRICT=0 builds the site even when a plugin's or role's documentation does not validate
# (antsibull-docs writes an error page for it) and without Sphinx's warnings-as-errors.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
STRICT=${DOCS_STRICT:-1}
cd "$ROOT"

readmes() {
  local role n=0
  for role in roles/*/; do
    n=$((n + 1))
    role=${role%/}
    "$BIN/aar-doc" --output-mode replace \
      --output-template "$ROOT/scripts/role-readme.md.j2" --output-file "$ROOT/$role/README.md" \
      "$role" markdown >/dev/null
  done
  echo "docs: $n role READMEs written"
}

site() {
  local out=${1:-$ROOT/build/docs} strict=() sphinx_strict=()
  [[ $STRICT == 1 ]] && strict=(--fail-on-error) && sphinx_strict=(-W --keep-going)
  rm -rf "$out"
  # antsibull-docs wants its destination writable by its owner only
  mkdir -p "$out" && chmod 0700 "$out" && mkdir -m 0700 "$out/rst"
  "$BIN/antsibull-docs" --config-file "$ROOT/scripts/docsite/antsibull-docs.cfg" collection \
    --use-current --squash-hierarchy "${strict[@]}" --dest-dir "$out/rst" llmfleet.cluster
  # The docs/ pages, linked from the collection's index page.
  mkdir "$out/rst/guides"
  cp docs/*.md docs/*.json "$out/rst/guides/"
  {
    printf '\n.. _guides_in_llmfleet.cluster:\n\nGuides\n------\n\n'
    printf 'The pages of the collection'"'"'s docs/ folder.\n\n.. toctree::\n    :maxdepth: 1\n\n'
    printf '    guides/index\n'
    for page in docs/*.md; do
      page=$(basename "$page" .md)
      [[ $page == index ]] || printf '    guides/%s\n' "$page"
    done
  } >>"$out/rst/index.rst"
  "$BIN/sphinx-build" -q "${sphinx_strict[@]}" -b html -c "$ROOT/scripts/docsite" -d "$out/doctrees" \
    "$out/rst" "$out/html"
  echo "docs: site in $out/html ($(find "$out/html" -name '*.html' | wc -l) pages)"
}

case ${1:-all} in
  readmes) readmes ;;
  site) site "${2:-}" ;;
  all) readmes && site ;;
  *) echo "usage: $0 [readmes|site [DIR]|all]" >&2; exit 2 ;;
esac

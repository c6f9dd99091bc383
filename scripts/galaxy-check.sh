#!/usr/bin/env bash
# make galaxy-check: build the collection tarball as `ansible-galaxy collection build` does for a
# release and import it with galaxy-importer, offline (scripts/galaxy-importer.cfg). Fails on any
# ERROR or WARNING the importer prints (a missing role README, a plugin ansible-doc cannot
# render, an ansible-lint finding).
#
#   scripts/galaxy-check.sh [DIR]     tarball, importer log and importer_result.json in DIR
#                                     (default build/galaxy)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
out=${1:-$ROOT/build/galaxy}
rm -rf "$out" && mkdir -p "$out/tmp"
# make's ANSIBLE_CONFIG / ANSIBLE_COLLECTIONS_PATH are for runs of the checkout, not the tarball's.
unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH
export PATH=$BIN:$PATH  # the importer runs ansible-doc and ansible-lint from PATH
"$BIN/ansible-galaxy" collection build --force --output-path "$out" "$ROOT" >/dev/null
tarballs=("$out"/llmfleet-cluster-*.tar.gz)
tarball=${tarballs[0]}
files=$(tar -tzf "$tarball" | wc -l)
echo "galaxy-check: $(basename "$tarball"): $(stat -c %s "$tarball") bytes, $files entries"

export GALAXY_IMPORTER_CONFIG=$ROOT/scripts/galaxy-importer.cfg
export GALAXY_IMPORTER_TMP_ROOT_DIR=$out/tmp GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP=$out/tmp/ansible
cd "$out"
rc=0
"$BIN/python" -m galaxy_importer.main "$tarball" >importer.log 2>&1 || rc=$?
findings=$(grep -cE '^(ERROR|WARNING)' importer.log || true)
grep -E '^(ERROR|WARNING)' importer.log || true
if ((rc != 0 || findings != 0)); then
  echo "galaxy-check: galaxy-importer exit $rc, $findings ERROR/WARNING lines (log: $out/importer.log)" >&2
  exit 1
fi
echo "galaxy-check: galaxy-importer imported $(basename "$tarball") cleanly"

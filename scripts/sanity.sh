#!/usr/bin/env bash
# `ansible-test sanity` over the collection, offline (docs/development.md, "The ecosystem's gates").
#
#   scripts/sanity.sh                       every test, on the Python of .venv
#   scripts/sanity.sh --test pep8           one test (any ansible-test sanity option passes through)
#
# ansible-test must run inside ansible_collections/<namespace>/<name>/. The tests run on a copy of
# the files git knows (tracked and untracked-but-not-ignored) in a temporary
# ansible_collections/llmfleet/cluster outside the checkout; copying takes a tenth of a second.
# (Running in .cache/collections/.../cluster, the link to this checkout, needs ansible-test's
# internal ANSIBLE_TEST_CONTENT_ROOT variable, because the working directory resolves to the
# checkout; SANITY_TREE=link does that, for comparison.)
#
# ansible-test installs each test's tools (pylint, pycodestyle, voluptuous, ...) from PyPI at the
# versions it pins into virtualenvs under ~/.ansible/test/, bootstrapping pip in each with a
# get-pip script it would download from a host that is not reachable: HOME points at
# .cache/sanity/home, where this script installs scripts/get-pip-offline.py under the name
# ansible-test looks for. shellcheck comes from Debian (scripts/host-setup.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
PY=${PY:-$ROOT/.venv/bin/python}
ANSIBLE_TEST=$(dirname "$PY")/ansible-test
[[ -x $ANSIBLE_TEST ]] || { echo "sanity: no $ANSIBLE_TEST (make venv)" >&2; exit 1; }
command -v shellcheck >/dev/null || { echo "sanity: shellcheck missing (make host-setup)" >&2; exit 1; }

export HOME=$CACHE/sanity/home
pip_version=$("$PY" -c 'import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="3.11"))["pip"])')
get_pip=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
mkdir -p "$(dirname "$get_pip")"
cmp -s "$ROOT/scripts/get-pip-offline.py" "$get_pip" || cp "$ROOT/scripts/get-pip-offline.py" "$get_pip"

# Each new tool venv gets its pip from .venv's pip (`pip --python`, see get-pip-offline.py).
printf '%s\n' "$PY" > "$(dirname "$get_pip")/llmfleet-bootstrap-python"

# The settings of make / scripts/env.sh are for ansible runs of the checkout, not for ansible-test.
unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH
python_version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
args=(sanity --python "$python_version" --color no "$@")

if [[ ${SANITY_TREE:-copy} == link ]]; then
  tree=$CACHE/collections/ansible_collections/llmfleet/cluster
  [[ $(readlink -f "$tree") == "$(readlink -f "$ROOT")" ]] || { echo "sanity: make link first" >&2; exit 1; }
  cd "$tree"
  ANSIBLE_TEST_CONTENT_ROOT=$tree exec "$ANSIBLE_TEST" "${args[@]}"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llmfleet-sanity.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree=$work/ansible_collections/llmfleet/cluster
mkdir -p "$tree"
# Deleted-but-unstaged files are left out, symlinks stay symlinks.
cd "$ROOT"
while IFS= read -r -d '' f; do
  if [[ -e $f || -L $f ]]; then printf '%s\0' "$f"; fi
done < <(git ls-files -z --cached --others --exclude-standard) | tar -c --null -T - -f - | tar -x -C "$tree"
cd "$tree"
"$ANSIBLE_TEST" "${args[@]}"

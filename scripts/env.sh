# shellcheck shell=bash
# Source this to work by hand the way `make` does:  source scripts/env.sh
_llmfleet_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CACHE=$_llmfleet_root/.cache
# The machine-wide artifact cache (scripts/artifact-cache.py), as the Makefile sets it.
export LLMFLEET_CACHE=${LLMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmfleet}
export PATH=$_llmfleet_root/.venv/bin:$PATH
export CONTAINERS_CONF=$CACHE/podman/containers.conf
export CONTAINERS_STORAGE_CONF=$CACHE/podman/storage.conf
export ANSIBLE_COLLECTIONS_PATH=$CACHE/collections
export ANSIBLE_CONFIG=$_llmfleet_root/ansible.cfg
export GGML_NO_BACKTRACE=1
export NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1
unset _llmfleet_root

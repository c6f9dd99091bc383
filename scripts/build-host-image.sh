#!/usr/bin/env bash
# Build the test/demo host image (Debian bookworm with systemd as PID 1) with
# debootstrap from the machine's own Debian mirror: no container registry is
# needed. Built once per machine as a saved archive in the artifact cache
# (scripts/artifact-cache.py; keyed by this script, which holds the package list, and the
# architecture; $CACHE/images links to the entry), then loaded into this checkout's podman
# storage, where the image carries the key as its label llmfleet.stamp.
#
# `build-host-image.sh arm64` (make arm64-images, not part of `make test`'s setup): the same image
# for arm64, localhost/llmfleet-host:bookworm-arm64, its own entry host-image-arm64 ($CACHE/images-arm64):
# debootstrap --arch=arm64, whose second stage and package installs run through qemu-user
# (qemu-aarch64 registered with binfmt_misc by scripts/host-setup.sh), imported with --arch arm64.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
case ${1:-} in
  "") ARCH="" SUFFIX="" ;;
  arm64) ARCH=arm64 SUFFIX=-arm64 ;;
  *) echo "usage: $0 [arm64]" >&2; exit 2 ;;
esac
IMAGE=${IMAGE:-localhost/llmfleet-host:bookworm$SUFFIX}
ARCHIVE=llmfleet-host-bookworm$SUFFIX.tar
export CONTAINERS_CONF=$CACHE/podman/containers.conf CONTAINERS_STORAGE_CONF=$CACHE/podman/storage.conf
# Extra packages the roles and tests use on the hosts (ccache: molecule/artifacts' source build).
EXTRA=(systemd systemd-sysv python3 python3-apt iproute2 iputils-ping procps sudo dbus ca-certificates
       curl nftables libgomp1 libssl3 libstdc++6 cmake ninja-build g++ make wireguard-tools wireguard-go ccache)
INPUTS=("host-image$SUFFIX" --file "$ROOT/scripts/build-host-image.sh" --text="arch=$(uname -m) image=$IMAGE${ARCH:+ target=$ARCH}")
if [[ $ARCH == arm64 && $(uname -m) != aarch64 && ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  echo "build-host-image: the arm64 image needs qemu-aarch64 registered with binfmt_misc (bash scripts/host-setup.sh, as root)" >&2
  exit 1
fi
if [[ -z ${LLMFLEET_ENTRY:-} ]]; then
  STAMP=$(python3 "$ROOT/scripts/artifact-cache.py" key "${INPUTS[@]}")
  label() { podman image inspect -f '{{index .Labels "llmfleet.stamp"}}' "$IMAGE" 2>/dev/null || true; }
  if podman image exists "$IMAGE" && [[ "$(label)" == "$STAMP" ]]; then
    exit 0
  fi
  python3 "$ROOT/scripts/artifact-cache.py" ensure "${INPUTS[@]}" --link "$CACHE/images$SUFFIX=." \
    -- bash "$ROOT/scripts/build-host-image.sh" ${ARCH:+"$ARCH"} >/dev/null
  if ! podman image exists "$IMAGE" || [[ "$(label)" != "$STAMP" ]]; then
    podman load -q -i "$CACHE/images$SUFFIX/$ARCHIVE" >/dev/null
  fi
  [[ "$(label)" == "$STAMP" ]] || { echo "build-host-image: $IMAGE does not carry llmfleet.stamp=$STAMP" >&2; exit 1; }
  echo "build-host-image: $IMAGE ready"
  exit 0
fi
# The builder: the archive goes into $LLMFLEET_ENTRY (renamed to the entry when this exits 0).
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[[ -n $MIRROR ]] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $MIRROR ]] || MIRROR=http://deb.debian.org/debian
ROOTFS=$LLMFLEET_ENTRY.rootfs
rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"
trap 'umount "$ROOTFS/proc" 2>/dev/null || true; rm -rf "$ROOTFS"' EXIT
echo "build-host-image: debootstrap ${ARCH:+--arch=$ARCH }bookworm from $MIRROR" >&2
debootstrap ${ARCH:+--arch=$ARCH} --variant=minbase bookworm "$ROOTFS" "$MIRROR" >/dev/null
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount --bind /proc "$ROOTFS/proc"
chroot "$ROOTFS" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${EXTRA[*]} >/dev/null && apt-get clean"
umount "$ROOTFS/proc"
: > "$ROOTFS/etc/machine-id"
rm -f "$ROOTFS/etc/resolv.conf"
tar -C "$ROOTFS" -c . | podman import -q ${ARCH:+--arch $ARCH} --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' \
  --change 'STOPSIGNAL SIGRTMIN+3' --change "LABEL llmfleet.stamp=$LLMFLEET_ENTRY_KEY" - "$IMAGE" >/dev/null
podman save -q -o "$LLMFLEET_ENTRY/$ARCHIVE" "$IMAGE"

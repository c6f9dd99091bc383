#!/usr/bin/env bash
# Build the test/demo host image (Debian bookworm with systemd as PID 1) with
# debootstrap from the machine's own Debian mirror: no container registry is
# needed. Cached as a podman image and as a saved archive under .cache/images.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$ROOT/.cache}
IMAGE=${IMAGE:-localhost/llmfleet-host:bookworm}
ARCHIVE=$CACHE/images/llmfleet-host-bookworm.tar
export CONTAINERS_CONF=$CACHE/podman/containers.conf CONTAINERS_STORAGE_CONF=$CACHE/podman/storage.conf
# Extra packages the roles and tests use on the hosts.
EXTRA=(systemd systemd-sysv python3 python3-apt iproute2 iputils-ping procps sudo dbus ca-certificates
       curl nftables libgomp1 libssl3 libstdc++6 cmake ninja-build g++ make wireguard-tools wireguard-go)
STAMP="$(printf '%s\n' "${EXTRA[@]}" | sha256sum | cut -c1-12)"
if podman image exists "$IMAGE" && [[ "$(podman image inspect -f '{{index .Labels "llmfleet.stamp"}}' "$IMAGE" 2>/dev/null)" == "$STAMP" ]]; then
  exit 0
fi
if [[ -f $ARCHIVE && -f $ARCHIVE.stamp && "$(cat "$ARCHIVE.stamp")" == "$STAMP" ]]; then
  podman load -q -i "$ARCHIVE" >/dev/null && exit 0
fi
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[[ -n $MIRROR ]] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $MIRROR ]] || MIRROR=http://deb.debian.org/debian
ROOTFS=$CACHE/images/rootfs
rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"
echo "build-host-image: debootstrap bookworm from $MIRROR"
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >/dev/null
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount --bind /proc "$ROOTFS/proc"
trap 'umount "$ROOTFS/proc" 2>/dev/null || true' EXIT
chroot "$ROOTFS" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${EXTRA[*]} >/dev/null && apt-get clean"
umount "$ROOTFS/proc"; trap - EXIT
: > "$ROOTFS/etc/machine-id"
rm -f "$ROOTFS/etc/resolv.conf"
tar -C "$ROOTFS" -c . | podman import -q --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' \
  --change 'STOPSIGNAL SIGRTMIN+3' --change "LABEL llmfleet.stamp=$STAMP" - "$IMAGE" >/dev/null
rm -rf "$ROOTFS"
podman save -q -o "$ARCHIVE.tmp" "$IMAGE" && mv "$ARCHIVE.tmp" "$ARCHIVE" && echo "$STAMP" > "$ARCHIVE.stamp"
echo "build-host-image: $IMAGE ready"

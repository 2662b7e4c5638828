#!/usr/bin/env bash
# Makes the local manylinux-like builder image for cibuildwheel under podman
# (see Containerfile). Idempotent: each step is skipped when its result is
# there. Needs root and Debian's podman, buildah, runc and debootstrap
# (installed here when missing).
#
#   build/builder/make-image.sh            # -> localhost/txc-manylinux-local:bookworm
#   IMAGE=... BASE=... build/builder/make-image.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
IMAGE="${IMAGE:-localhost/txc-manylinux-local:bookworm}"
BASE="${BASE:-localhost/debian:bookworm}"
SUITE="${SUITE:-bookworm}"
export CONTAINERS_CONF="$HERE/containers.conf" CONTAINERS_STORAGE_CONF="$HERE/storage.conf"

need=()
for t in podman buildah runc debootstrap; do command -v "$t" >/dev/null || need+=("$t"); done
if ((${#need[@]})); then
  echo "make-image: installing ${need[*]} (Debian packages)"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" uidmap >/dev/null
fi

if podman image exists "$IMAGE"; then
  echo "make-image: $IMAGE exists (podman rmi it to rebuild)"; exit 0
fi

if ! podman image exists "$BASE"; then
  root="$(mktemp -d /var/tmp/txc-rootfs.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  echo "make-image: debootstrap $SUITE -> $BASE"
  debootstrap --variant=minbase "$SUITE" "$root" >/dev/null
  tar -C "$root" -c . | podman import - "$BASE" >/dev/null
fi

ctx="$(mktemp -d /var/tmp/txc-ctx.XXXXXX)"
cp "$HERE/Containerfile" "$ctx/"
cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
echo "make-image: buildah bud -> $IMAGE"
buildah --storage-driver vfs bud --isolation chroot -f "$ctx/Containerfile" -t "$IMAGE" "$ctx"
rm -rf "$ctx"
podman image exists "$IMAGE" && echo "make-image: built $IMAGE"

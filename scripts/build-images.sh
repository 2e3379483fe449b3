#!/usr/bin/env bash
# Build the local Debian base images with systemd as PID 1 (no registry is needed).
# Usage: scripts/build-images.sh [release...]   (default: bookworm trixie)
# An image that exists and was built from this package list is kept: podman's own storage is the cache.
# Set INFERHOST_REBUILD_IMAGES=1 to rebuild.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
releases=("$@")
[ ${#releases[@]} -gt 0 ] || releases=(bookworm trixie)

mirror=$("$here/scripts/apt-mirror.sh")
# openssh-server: the lab reaches its machines over SSH, as a real host is reached. libnuma1: the lab's engine,
# vLLM's CPU build, loads it (the GPU build does not; a site's guest image has it or gets it with the driver).
packages=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,iproute2,procps,ca-certificates,gnupg,openssh-server,libnuma1
# What the image was built from, kept as a label: a new list rebuilds it.
recipe="$packages; ssh host keys per machine"

for release in "${releases[@]}"; do
  image="localhost/debian-systemd:$release"
  if [ "${INFERHOST_REBUILD_IMAGES:-0}" != 1 ] && podman image exists "$image" \
     && [ "$(podman image inspect --format '{{ index .Labels "inferhost.recipe" }}' "$image")" = "$recipe" ]; then
    echo "image $image: cached"
    continue
  fi
  root=$(mktemp -d "/var/tmp/inferhost-$release.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  echo "image $image: debootstrap $release from $mirror ..."
  start=$SECONDS
  debootstrap --variant=minbase --include="$packages" "$release" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 30 "$root.log"; echo "debootstrap of $release failed (log: $root.log)" >&2; exit 1; }
  : >"$root/etc/machine-id"
  # Every machine made from the image gets host keys of its own (the lab mounts them); without one, sshd
  # stays off instead of failing the boot.
  rm -f "$root"/etc/ssh/ssh_host_*
  mkdir -p "$root/etc/systemd/system/ssh.service.d"
  printf '[Unit]\nConditionPathExists=/etc/ssh/ssh_host_ed25519_key\n' \
    >"$root/etc/systemd/system/ssh.service.d/host-key.conf"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --change 'CMD ["/sbin/init"]' --change "LABEL inferhost.recipe=\"$recipe\"" \
    - "$image" >/dev/null
  rm -rf "$root" "$root.log"
  trap - EXIT
  echo "image $image: built in $((SECONDS - start)) s"
done

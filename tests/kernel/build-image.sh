#!/usr/bin/env bash
# Build (once, then cached) the real-kernel test machine: a Debian bookworm root filesystem with the
# distribution's kernel, systemd, udev, sshd and Python, as an ext4 image, plus the kernel and initrd
# for QEMU's -kernel/-initrd. The tests boot it under software emulation with an emulated IOMMU.
#
#   tests/kernel/build-image.sh CACHE_DIR
#
# CACHE_DIR ends up with: rootfs.img, vmlinuz, initrd.img, id_ed25519(.pub). Delete it to rebuild.
set -euo pipefail

cache=${1:?usage: $0 CACHE_DIR}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
[ -s "$cache/rootfs.img" ] && [ -s "$cache/vmlinuz" ] && [ -s "$cache/initrd.img" ] && exit 0

mirror=$("$(dirname "$0")/../../scripts/apt-mirror.sh")
root=$(mktemp -d /var/tmp/inferhost-kernel.XXXXXX)
trap 'rm -rf "$root"' EXIT

echo "kernel image: debootstrap bookworm with the Debian kernel ..."
debootstrap --variant=minbase \
  --include=linux-image-amd64,initramfs-tools,systemd,systemd-sysv,udev,kmod,dbus,openssh-server,python3,pciutils,iproute2,procps \
  bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
  || { tail -n 30 "$cache/debootstrap.log"; exit 1; }

[ -f "$cache/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$cache/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$cache/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
echo "kernel-test" >"$root/etc/hostname"
: >"$root/etc/machine-id"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
# The management NIC is recognised by its MAC; the stand-in devices stay unconfigured.
cat >"$root/etc/systemd/network/10-mgmt.network" <<'EOF'
[Match]
MACAddress=52:54:00:00:00:10

[Network]
DHCP=ipv4
EOF
chroot "$root" systemctl enable systemd-networkd ssh >/dev/null 2>&1
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_reap.service >/dev/null 2>&1 || true
chroot "$root" apt-get clean

cp "$(ls "$root"/boot/vmlinuz-* | head -n1)" "$cache/vmlinuz"
cp "$(ls "$root"/boot/initrd.img-* | head -n1)" "$cache/initrd.img"
rm -f "$cache/rootfs.img"
mke2fs -q -t ext4 -d "$root" -L root "$cache/rootfs.img" 3G
echo "kernel image: built ($(du -sh "$cache/rootfs.img" | cut -f1) used)"

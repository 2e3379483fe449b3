#!/usr/bin/env bash
# Build (once, then cached) the real-kernel test machine: a Debian bookworm root filesystem with the
# distribution's kernel, systemd, udev, sshd and Python, as an ext4 image, plus the kernel and initrd
# for QEMU's -kernel/-initrd. The tests boot it under software emulation with an emulated IOMMU.
#
#   tests/kernel/build-image.sh CACHE_DIR
#
# CACHE_DIR ends up with: rootfs.img, vmlinuz, initrd.img, id_ed25519(.pub), and recipe (this script's
# checksum: an image built by another version of it is built again). Delete it to rebuild.
#
# Everything the guest does runs under software emulation, where each process it starts costs many
# times what it costs here, so the image starts and runs only what the tests use: an initramfs with
# the root file system's modules alone (a boot unpacks it, and the tests' update-initramfs builds it), no
# root fsck, no consoles or timers beyond the serial console.
set -euo pipefail

cache=${1:?usage: $0 CACHE_DIR}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
recipe=$(sha256sum "$0" | cut -d' ' -f1)
[ -s "$cache/rootfs.img" ] && [ -s "$cache/vmlinuz" ] && [ -s "$cache/initrd.img" ] \
  && [ "$(cat "$cache/recipe" 2>/dev/null)" = "$recipe" ] && exit 0
rm -f "$cache/rootfs.img" "$cache/vmlinuz" "$cache/initrd.img" "$cache/recipe"

mirror=$("$(dirname "$0")/../../scripts/apt-mirror.sh")
root=$(mktemp -d /var/tmp/inferhost-kernel.XXXXXX)
trap 'rm -rf "$root"' EXIT

echo "kernel image: debootstrap bookworm with the Debian kernel ..."
debootstrap --variant=minbase \
  --include=linux-image-amd64,initramfs-tools,systemd,systemd-sysv,udev,kmod,dbus,openssh-server,python3,pciutils,iproute2,procps,zstd \
  bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
  || { tail -n 30 "$cache/debootstrap.log"; exit 1; }

[ -f "$cache/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$cache/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$cache/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
echo "kernel-test" >"$root/etc/hostname"
: >"$root/etc/machine-id"
# Pass 0: no fsck of the root file system at each boot (a fresh overlay of a clean image each run).
printf '/dev/vda / ext4 rw,errors=remount-ro 0 0\n' >"$root/etc/fstab"
# The management NIC is recognised by its MAC; the stand-in devices stay unconfigured.
cat >"$root/etc/systemd/network/10-mgmt.network" <<'EOF'
[Match]
MACAddress=52:54:00:00:00:10

[Network]
DHCP=ipv4
EOF
chroot "$root" systemctl enable systemd-networkd ssh >/dev/null 2>&1
# Units no test uses: each one started is seconds of a boot under emulation. The serial console stays.
masked=(apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer
  e2scrub_reap.service getty@tty1.service systemd-networkd-wait-online.service systemd-pstore.service
  systemd-binfmt.service modprobe@drm.service modprobe@efi_pstore.service modprobe@fuse.service
  modprobe@loop.service modprobe@dm_mod.service sys-kernel-debug.mount sys-kernel-tracing.mount
  dev-hugepages.mount dev-mqueue.mount)
chroot "$root" systemctl mask "${masked[@]}" >/dev/null 2>&1
# The initramfs holds what mounting /dev/vda takes, nothing else (MODULES=dep cannot work out the root
# device in a chroot); the hooks still add what they add (the kernel tests' hook adds a NIC driver).
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk crc32c_generic ext4 >>"$root/etc/initramfs-tools/modules"
echo RESUME=none >"$root/etc/initramfs-tools/conf.d/resume"
chroot "$root" update-initramfs -u -k all >"$cache/initramfs.log" 2>&1 || { tail -n 30 "$cache/initramfs.log"; exit 1; }
chroot "$root" apt-get clean

cp "$(ls "$root"/boot/vmlinuz-* | head -n1)" "$cache/vmlinuz"
cp "$(ls "$root"/boot/initrd.img-* | head -n1)" "$cache/initrd.img"
rm -f "$cache/rootfs.img"
mke2fs -q -t ext4 -d "$root" -L root "$cache/rootfs.img" 3G
echo "$recipe" >"$cache/recipe"
echo "kernel image: built ($(du -sh "$cache/rootfs.img" | cut -f1) used)"

#!/bin/sh
# Build a signed, flat apt repository of stand-in packages with NVIDIA's names and versions, in the
# layout of NVIDIA's CUDA repository (deb [signed-by=...] URI /). The packages hold small files that
# behave like the real ones where the roles look: versions, nvcc, version.json, the cuda alternative.
# Usage: make-standin-repo.sh DIR
set -eu
repo=${1:?usage: make-standin-repo.sh DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$repo"

# deb NAME VERSION [CONTROL-LINES]; the package tree is $work/NAME_VERSION (made by the caller).
deb() {
  name=$1 version=$2 extra=${3:-}
  root="$work/${name}_$version"
  mkdir -p "$root/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: all"
    echo "Maintainer: inferhost tests <tests@example.org>"
    echo "Description: inferhost stand-in for NVIDIA's $name"
    [ -z "$extra" ] || printf '%s\n' "$extra"
  } > "$root/DEBIAN/control"
  dpkg-deb --root-owner-group -Zgzip --build "$root" "$repo/${name}_${version}_all.deb" >/dev/null
}

# The pinning package of the driver branch: installed first, it holds every driver package at 590.48.01.
# (apt reads only preferences.d files without an extension or ending in .pref.)
mkdir -p "$work/nvidia-driver-pinning-590.48.01_590.48.01-1/etc/apt/preferences.d"
cat > "$work/nvidia-driver-pinning-590.48.01_590.48.01-1/etc/apt/preferences.d/nvidia-driver-pinning-590.48.01.pref" <<'PIN'
Package: libnvidia-compute nvidia-utils nvidia-open nvidia-dkms-open nvidia-kernel-common
Pin: version 590.48.01-*
Pin-Priority: 1000
PIN
deb nvidia-driver-pinning-590.48.01 590.48.01-1

# Two driver versions, so that a role that forgets the pin gets the newer one and the tests see it.
for v in 590.48.01 595.45.04; do
  mkdir -p "$work/libnvidia-compute_$v-1/usr/lib/x86_64-linux-gnu"
  echo "$v" > "$work/libnvidia-compute_$v-1/usr/lib/x86_64-linux-gnu/libnvidia-standin.version"
  deb libnvidia-compute "$v-1"

  mkdir -p "$work/nvidia-utils_$v-1/usr/bin"
  printf '#!/bin/sh\necho "NVIDIA-SMI stand-in  Driver Version: %s"\n' "$v" > "$work/nvidia-utils_$v-1/usr/bin/nvidia-smi"
  chmod 755 "$work/nvidia-utils_$v-1/usr/bin/nvidia-smi"
  # Like the real package, it recommends the kernel module: a container must not get it.
  deb nvidia-utils "$v-1" "Depends: libnvidia-compute (= $v-1)
Recommends: nvidia-dkms-open (= $v-1)"

  mkdir -p "$work/nvidia-dkms-open_$v-1/usr/src/nvidia-$v"
  echo "PACKAGE_VERSION=\"$v\"" > "$work/nvidia-dkms-open_$v-1/usr/src/nvidia-$v/dkms.conf"
  deb nvidia-dkms-open "$v-1"

  mkdir -p "$work/nvidia-open_$v-1"
  deb nvidia-open "$v-1" "Depends: nvidia-dkms-open (= $v-1), nvidia-utils (= $v-1), libnvidia-compute (= $v-1)"
done

# CUDA toolkits side by side under /usr/local/cuda-X.Y, each registering the cuda alternative as the
# real cuda-toolkit-config-common does.
for spec in 12.8:12.8.93:128 13.0:13.0.88:130; do
  short=${spec%%:*} rest=${spec#*:}
  full=${rest%%:*} prio=${rest#*:}
  pkg="cuda-toolkit-$(echo "$short" | tr . -)"
  root="$work/${pkg}_$full-1"
  home="$root/usr/local/cuda-$short"
  mkdir -p "$home/bin" "$home/lib64" "$home/include/cccl/cuda" "$root/DEBIAN"
  printf '#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver (inferhost stand-in)"\necho "Cuda compilation tools, release %s, V%s"\n' \
    "$short" "$full" > "$home/bin/nvcc"
  chmod 755 "$home/bin/nvcc"
  printf '{\n  "cuda": {"name": "CUDA SDK", "version": "%s"}\n}\n' "$full" > "$home/version.json"
  printf '#!/bin/sh\nset -e\nupdate-alternatives --install /usr/local/cuda cuda /usr/local/cuda-%s %s\n' "$short" "$prio" > "$root/DEBIAN/postinst"
  printf '#!/bin/sh\nset -e\n[ "$1" = upgrade ] || update-alternatives --remove cuda /usr/local/cuda-%s\n' "$short" > "$root/DEBIAN/prerm"
  chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
  deb "$pkg" "$full-1"
done

# Index and sign it like a real repository (apt refuses unsigned ones).
export GNUPGHOME="$work/gnupg"
mkdir -m 700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key 'inferhost stand-in repository <tests@example.org>' ed25519 sign never
cd "$repo"
apt-ftparchive packages . > Packages
gzip -9nkf Packages
apt-ftparchive release . > Release
gpg --batch --yes --armor --export > key.asc
gpg --batch --yes --clearsign -o InRelease Release
gpg --batch --yes -abs -o Release.gpg Release
echo "stand-in repository in $repo: $(ls "$repo"/*.deb | wc -l) packages"

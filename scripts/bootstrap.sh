#!/usr/bin/env bash
# Set up everything the stack's commands need on a fresh Debian or Ubuntu machine (run as root):
# system packages (fuse3: the API tests serve their simulated GPUs over FUSE), a pinned uv, the locked
# Python environment (.venv) and the podman base images.
# Each step is skipped when already done, so `make demo` and `make test` stay quick the second time.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
UV_VERSION=0.13.9
PACKAGES=(podman runc debootstrap qemu-system-x86 qemu-utils busybox-static cpio kmod e2fsprogs
          dpkg-dev python3 python3-venv git make ca-certificates openssh-client fuse3 gnupg)

say() { printf '==> %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
  echo "bootstrap: run as root (podman containers with systemd and debootstrap need it)" >&2
  exit 2
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# uv at a pinned version, in a private venv of its own (the system Python may be externally managed).
uv="$here/.cache/tools/bin/uv"
if ! { [ -x "$uv" ] && "$uv" --version | grep -q " $UV_VERSION"; }; then
  say "installing uv $UV_VERSION"
  python3 -m venv "$here/.cache/tools"
  "$here/.cache/tools/bin/pip" install -q "uv==$UV_VERSION"
fi

say "syncing the Python environment from uv.lock"
UV_PYTHON_DOWNLOADS=never "$uv" sync --frozen --quiet

say "building the podman base images (cached)"
export CONTAINERS_CONF="$here/containers.conf"
scripts/build-images.sh

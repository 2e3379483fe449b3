#!/usr/bin/env bash
# The image a scenario's machine starts from (create.yml runs this for each platform): BASE itself when the
# platform names no packages; else BASE with those packages installed, built once and kept in podman's storage
# as NAME. Its label holds the recipe (BASE's image id and the packages): a rebuilt base or another list builds
# it again. The packages are what the scenario's prepare.yml installs for its stand-ins, never what a role
# under test installs: prepare.yml still asks for them and finds them there, instead of unpacking them again
# on every run.
# Usage: image.sh BASE NAME [PACKAGE...]   Prints "kept IMAGE" or "built IMAGE".
set -euo pipefail

base=$1
name=$2
shift 2
if [ $# -eq 0 ]; then
  echo "kept $base"
  exit 0
fi
recipe="$(podman image inspect --format '{{ .Id }}' "$base") $*"
if podman image exists "$name" \
   && [ "$(podman image inspect --format '{{ index .Labels "inferhost.recipe" }}' "$name")" = "$recipe" ]; then
  echo "kept $name"
  exit 0
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# The base images carry no package lists: fetch them for the install, and leave none behind (prepare.yml
# fetches them fresh on every run).
cat >"$context/Containerfile" <<CONTAINERFILE
FROM $base
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $* \\
    && apt-get clean && rm -rf /var/lib/apt/lists/*
CONTAINERFILE
podman build --quiet --tag "$name" --label "inferhost.recipe=$recipe" "$context" >/dev/null
echo "built $name"

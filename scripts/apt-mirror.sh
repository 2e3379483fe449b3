#!/usr/bin/env bash
# Print the Debian mirror that this machine's apt uses, so debootstrap works wherever apt does.
set -uo pipefail
uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -oE '^(URIs:|deb) +https?://[^ ]+' | grep -v -- '-security' | head -n1 | awk '{print $2}')
echo "${uri:-http://deb.debian.org/debian}"

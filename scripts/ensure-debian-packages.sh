#!/usr/bin/env bash
# Install the Debian packages the tests and the demo need, only those that are missing.
# Usage: scripts/ensure-debian-packages.sh PACKAGE...
set -euo pipefail
missing=()
for pkg in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Services must not start by themselves: tests and the demo start their own on free ports.
$SUDO env RUNLEVEL=1 apt-get install -y -q --no-install-recommends "${missing[@]}"

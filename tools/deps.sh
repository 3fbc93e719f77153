#!/usr/bin/env bash
# tools/deps.sh check|install — the Debian packages of tools/debian-packages.txt.
#   check:   exit 0 when all are installed; otherwise install them when apt-get is usable
#            (root, or passwordless sudo), else print the exact command and exit 1.
#   install: install whatever is missing (apt-get update first).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t pkgs < <(grep -v '^[[:space:]]*#' "$here/debian-packages.txt" | grep -v '^[[:space:]]*$')

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "trident: missing packages: ${missing[*]} (no apt-get here: install their equivalents)" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "trident: missing Debian packages. Install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "trident: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

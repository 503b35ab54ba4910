#!/usr/bin/env bash
# Installs the Debian 12 packages gale builds and tests with. Runs apt only when one is missing.
set -euo pipefail
PACKAGES=(cmake ninja-build pkg-config g++ clang lld libclang-rt-14-dev
          libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libfmt-dev libspdlog-dev
          nlohmann-json3-dev libutf8proc-dev libxxhash-dev libboost-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

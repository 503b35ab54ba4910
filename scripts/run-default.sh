#!/usr/bin/env bash
# Set-up command 1: install what is missing, build gale, and generate from the bundled default
# model (stories260K). Extra arguments go to `gale run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target gale -j "$(nproc)"
if [ "$#" -eq 0 ]; then set -- -p "Once upon a time" -n 128; fi
exec build/gale run "$@"

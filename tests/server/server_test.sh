#!/usr/bin/env bash
# End-to-end tests of `gale serve` with a real server process on loopback and the official
# `openai` npm package as the client (installed by scripts/install-deps.sh --test).
# Usage: server_test.sh path/to/gale path/to/build-dir
set -euo pipefail
GALE="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
BUILD="$(cd "$2" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "FAIL: node and npm are needed for the server tests (Debian: apt-get install nodejs npm)"
  exit 1
fi
# The openai package comes from the set-up step (scripts/install-deps.sh --test): a test never
# reaches a network.
nm="$here/../../.deps/node"
if [ ! -d "$nm/node_modules/openai" ]; then
  echo "FAIL: the openai npm package is missing from .deps/node; run scripts/install-deps.sh --test"
  exit 1
fi
ulimit -n 8192 2>/dev/null || true  # the test holds a thousand connections open
exec node "$here/server_test.cjs" "$GALE" "$nm/node_modules" "$here/chat.jinja"

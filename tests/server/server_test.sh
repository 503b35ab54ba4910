#!/usr/bin/env bash
# End-to-end tests of `gale serve` with a real server process on loopback and the official
# `openai` npm package as the client (installed once into the build folder from the npm
# registry). Usage: server_test.sh path/to/gale path/to/build-dir
set -euo pipefail
GALE="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
BUILD="$(cd "$2" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "FAIL: node and npm are needed for the server tests (Debian: apt-get install nodejs npm)"
  exit 1
fi
nm="$BUILD/node_test_deps"
if [ ! -d "$nm/node_modules/openai" ]; then
  mkdir -p "$nm"
  (cd "$nm" && npm install --no-audit --no-fund --silent openai@4.104.0 >/dev/null)
fi
ulimit -n 8192 2>/dev/null || true  # the test holds a thousand connections open
exec node "$here/server_test.cjs" "$GALE" "$nm/node_modules" "$here/chat.jinja"

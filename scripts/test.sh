#!/usr/bin/env bash
# Set-up command 2: install what is missing, then build and run every test:
#   1. release build, whole GoogleTest suite under ctest
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build, same suite
#   3. libFuzzer targets (clang) for the GGUF reader and for chat templates, bounded runs on
#      their seed corpora
# GALE_FUZZ_SECONDS (default 60) bounds each fuzz run; GALE_SKIP_SANITIZE=1 skips step 2 (local use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
jobs="$(nproc)"

echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "${GALE_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== asan+ubsan build + tests"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGALE_SANITIZE=ON >/dev/null
  cmake --build build-asan --target gale_tests gale -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"
fi

echo "== fuzz: GGUF reader, chat templates"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DGALE_FUZZ=ON -DGALE_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz --target gguf_reader_fuzz jinja_fuzz -j "$jobs"
mkdir -p build-fuzz/corpus build-fuzz/corpus-jinja fuzz/artifacts
build-fuzz/gguf_reader_fuzz -max_total_time="${GALE_FUZZ_SECONDS:-60}" -max_len=65536 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix=fuzz/artifacts/ -print_final_stats=1 \
  build-fuzz/corpus fuzz/corpus 2>&1 | tail -n 15
build-fuzz/jinja_fuzz -max_total_time="${GALE_FUZZ_SECONDS:-60}" -max_len=8192 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix=fuzz/artifacts/ -print_final_stats=1 \
  build-fuzz/corpus-jinja fuzz/corpus-jinja 2>&1 | tail -n 15
echo "fuzz: no crash"

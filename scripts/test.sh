#!/usr/bin/env bash
# Set-up command 2: install what is missing, then build and run every test:
#   1. release build, whole GoogleTest suite under ctest
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build (clang), same suite
#   3. libFuzzer targets (built in the sanitized tree) for every untrusted parser: GGUF reader, chat templates, OpenAI
#      request bodies (down to template rendering), safetensors, tokenizer.json import, grammars
#      (GBNF, JSON Schema, regex) and tool-call parsing of model output; bounded
#      runs on their seed corpora, one per core at a time
# GALE_FUZZ_SECONDS (default 45) bounds each fuzz run; GALE_SKIP_SANITIZE=1 skips step 2's suite (local use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
jobs="$(nproc)"
# The kernel tables this CPU must have (kernels_test checks them), from /proc/cpuinfo's flags
# rather than gale's own CPUID code, so that a dispatch bug cannot hide a whole ISA.
if [ -z "${GALE_EXPECT_ISA:-}" ]; then
  flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
  has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
  GALE_EXPECT_ISA=scalar
  if has avx2 fma f16c; then GALE_EXPECT_ISA=avx2; fi
  if has avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16; then
    GALE_EXPECT_ISA=avx2,avx512
  fi
  export GALE_EXPECT_ISA
fi
echo "expecting kernels for: $GALE_EXPECT_ISA"
# The sanitized tree builds only the SIMD tables this machine runs (the others could not execute
# here, and AVX-512 code under ASan alone takes minutes to compile); the release tree builds all.
host_isas="$(tr ',' '\n' <<<"$GALE_EXPECT_ISA" | grep -v '^scalar$' | paste -sd ';' || true)"

echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# One sanitized tree, built with clang: the ASan+UBSan suite, and the libFuzzer targets beside it
# (libFuzzer is clang's). Under ASan, clang compiled 2-2.6x faster than g++, and clang's UBSan also
# checks float-to-int conversions; the release tree stays g++, so both compilers keep the code honest.
targets=(gguf_reader_fuzz:corpus:65536 jinja_fuzz:corpus-jinja:8192 openai_request_fuzz:corpus-openai:65536
         safetensors_fuzz:corpus-safetensors:16384 hf_tokenizer_fuzz:corpus-hf-tokenizer:16384
         grammar_fuzz:corpus-grammar:8192)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DGALE_SANITIZE=ON \
  -DGALE_FUZZ=ON -DGALE_KERNEL_ISAS="$host_isas" >/dev/null
if [ "${GALE_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== asan+ubsan build (clang) + tests"
  cmake --build build-asan --target gale_tests gale_server_tests gale "${targets[@]%%:*}" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"
else
  cmake --build build-asan --target "${targets[@]%%:*}" -j "$jobs"
fi

echo "== fuzz: GGUF reader, chat templates, OpenAI requests, safetensors, tokenizer.json, grammars + tool calls"
mkdir -p fuzz/artifacts
# One fuzzer per core at a time (each is single-threaded); each writes its log and exit status.
for t in "${targets[@]}"; do
  IFS=: read -r name corpus max_len <<<"$t"
  mkdir -p "build-asan/$corpus"
  rm -f "build-asan/$name.rc"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  ( rc=0
    "build-asan/$name" -max_total_time="${GALE_FUZZ_SECONDS:-45}" -max_len="$max_len" -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix=fuzz/artifacts/ -print_final_stats=1 \
      "build-asan/$corpus" "fuzz/$corpus" > "build-asan/$name.log" 2>&1 || rc=$?
    echo "$rc" > "build-asan/$name.rc" ) &
done
wait
failed=0
for t in "${targets[@]}"; do
  name="${t%%:*}"
  echo "-- $name"
  tail -n 12 "build-asan/$name.log"
  rc="$(cat "build-asan/$name.rc" 2>/dev/null || echo missing)"
  if [ "$rc" != 0 ]; then
    echo "FAIL: $name exited $rc (artifacts in fuzz/artifacts/)"
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz: no crash"

#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and its shared libraries (libllama.so, libggml*.so, beside it in
# DIR/build/bin) from source for this CPU (GGML_NATIVE, CPU only) and prints llama-bench's path.
# The source is the llama.cpp release that the npm package node-llama-cpp ships as a git bundle
# (llama/gitRelease.bundle; the same release as the prebuilt libraries of
# scripts/fetch-llamacpp.sh), unpacked with `npm pack`, nothing installed. A DIR that already holds
# the binary is reused. scripts/bench-vs-llamacpp.sh calls it (LLAMA_DIR, default
# build/llamacpp-native).
set -euo pipefail
dir="${1:?usage: build-llamacpp.sh DIR}"
version="${NODE_LLAMA_CPP_VERSION:-3.22.1}"
bench="$dir/build/bin/llama-bench"
if [[ ! -x "$bench" ]]; then
  mkdir -p "$dir"
  if [[ ! -d "$dir/src/.git" ]]; then
    (cd "$dir" && npm pack --silent "node-llama-cpp@$version" > /dev/null &&
      tar xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle &&
      git clone -q package/llama/gitRelease.bundle src 2> /dev/null && rm -rf package "node-llama-cpp-$version.tgz")
  fi
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > /dev/null
  cmake --build "$dir/build" --target llama-bench llama ggml -j"$(nproc)" > /dev/null
fi
realpath "$bench"

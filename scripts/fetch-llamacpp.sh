#!/usr/bin/env bash
# Fetches llama.cpp's prebuilt CPU libraries (the npm package @node-llama-cpp/linux-x64, unpacked
# with `npm pack`; nothing is installed) into DIR and prints the folder holding them, with the
# names tools/ggml_reference.cc opens (libggml.so, libllama.so). Used by make-ggml-reference.sh
# and bench-vs-llamacpp.sh; a folder already holding them is reused.
set -euo pipefail
dir="${1:?usage: fetch-llamacpp.sh DIR}"
version="${NODE_LLAMA_CPP_VERSION:-3.22.1}"
lib="$dir/package/bins/linux-x64"
if [[ ! -e "$lib/libllama.so" || ! -e "$lib/libggml.so" ]]; then
  mkdir -p "$dir"
  (cd "$dir" && npm pack --silent "@node-llama-cpp/linux-x64@$version" > /dev/null && tar xzf ./*.tgz)
  (cd "$lib" && ln -sf libggml.v*.so libggml.so && ln -sf libllama.v*.so libllama.so)
fi
realpath "$lib"

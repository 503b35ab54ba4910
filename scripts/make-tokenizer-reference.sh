#!/usr/bin/env bash
# Regenerates tests/data/llamacpp/tokenize: llama.cpp's tokens (the prebuilt CPU libraries of the npm
# package @node-llama-cpp/linux-x64, through tools/ggml_reference.cc's tokenize mode) for the texts
# in inputs.txt, for every vocab in ../shared/vocab that has a .gguf. First checks the mode against
# llama.cpp's own .inp/.out vectors, so a layout change in the library cannot pass unnoticed. Run by
# hand when the inputs change; the outputs are committed and read by tokenizer_test.cc. For the BERT
# vocab, tools/wordpiece_reference.py writes Hugging Face's BertTokenizer result too (bert-bge.hf).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
shared="${GALE_SHARED_DIR:-../shared}"
out=tests/data/llamacpp/tokenize
cmake --build "$build" -j"$(nproc)" --target ggml_reference
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
lib="$(scripts/fetch-llamacpp.sh "${LLAMACPP_DIR:-$build/llamacpp}")"
for vocab in "$shared"/vocab/ggml-vocab-*.gguf; do
  name="$(basename "$vocab" .gguf)"
  name="${name#ggml-vocab-}"
  if [[ -e "$vocab.inp" ]]; then
    "$build/ggml_reference" tokenize "$lib" "$vocab" "$vocab.inp" "$tmp/$name.chk" 2> /dev/null
    if ! diff -q <(cut -f1 "$tmp/$name.chk" | sed 's/^ *//') <(sed 's/^ *//;s/ *$//' "$vocab.out") > /dev/null; then
      echo "tokenize mode disagrees with llama.cpp's own vectors for $name" >&2
      exit 1
    fi
  fi
  "$build/ggml_reference" tokenize "$lib" "$vocab" "$out/inputs.txt" "$out/$name.out" 2> /dev/null
  echo "$name: $(wc -l < "$out/$name.out") texts"
done
# BERT WordPiece: Hugging Face's rules as well (see tools/wordpiece_reference.py).
python3 tools/wordpiece_reference.py "$shared/vocab/ggml-vocab-bert-bge.gguf" "$out/inputs.txt" "$out/bert-bge.hf"

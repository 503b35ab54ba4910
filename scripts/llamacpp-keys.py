#!/usr/bin/env python3
"""The GGUF hyperparameter keys llama.cpp's model loader reads, per architecture gale runs.

Reads llama.cpp's source (the release scripts/build-llamacpp.sh unpacks): the key names of
src/llama-arch.cpp (LLM_KV_NAMES), the keys every architecture reads in
llama_model_base::load_hparams (src/llama-model.cpp) and the keys each architecture's own
load_arch_hparams reads (src/models/<file>.cpp), following the loader's helpers (load_swa_pattern
reads attention.sliding_window_pattern). Prints JSON: {"generic": [...], "arch": {name: [...]}},
each key with "%s." standing for the architecture's prefix. Tokenizer keys (tokenizer.*) are the
vocabulary loader's, not listed; general.* keys describe the file.

Usage: scripts/llamacpp-keys.py LLAMA_CPP_SOURCE > tests/data/llamacpp/hparam_keys.json
"""
import json
import re
import sys

# gale's architecture -> llama.cpp's model file (src/models/<file>.cpp). deepseek41 is not in
# this release (gale follows a later port's layout): it reads deepseek4's keys and its own.
ARCH_FILES = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3moe", "qwen35": "qwen35", "qwen35moe": "qwen35moe", "phi3": "phi3",
    "gemma2": "gemma2", "gemma3": "gemma3", "deepseek2": "deepseek2", "deepseek4": "deepseek4",
    "glm4moe": "glm4-moe", "gpt-oss": "openai-moe", "bert": "bert",
}
# The loader's helpers and the keys they read.
HELPERS = {"load_swa_pattern": ["LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN"]}
KEY_CALL = re.compile(r"\b(?:get_key|get_arr|get_key_or_arr|get_arr_n)\s*\(\s*(LLM_KV_[A-Z0-9_]+)")


def body(text, signature):
    """The text of the function whose definition starts with `signature`."""
    start = text.index(signature)
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j + 1]
    raise ValueError("unbalanced " + signature)


def keys_of(code, names):
    found = set()
    for kv in KEY_CALL.findall(code):
        found.add(names[kv])
    for helper, kvs in HELPERS.items():
        if re.search(r"\b" + helper + r"\s*\(", code):
            found.update(names[kv] for kv in kvs)
    return sorted(k for k in found if not k.startswith(("tokenizer.", "general.")))


def main():
    src = sys.argv[1]
    arch_text = open(f"{src}/src/llama-arch.cpp").read()
    table = arch_text[arch_text.index("LLM_KV_NAMES"):]
    table = table[:table.index("};")]
    names = dict(re.findall(r"\{\s*(LLM_KV_[A-Z0-9_]+)\s*,\s*\"([^\"]+)\"\s*\}", table))
    model = open(f"{src}/src/llama-model.cpp").read()
    generic = body(model, "void llama_model_base::load_hparams(")
    # Only what every architecture reads: the loader's per-architecture branches (wavtokenizer,
    # hunyuan) are cut before the key calls are collected.
    generic = re.sub(r"if \(arch == LLM_ARCH_WAVTOKENIZER_DEC\) \{.*?\n    \}", "", generic, flags=re.S)
    out = {"generic": keys_of(generic, names), "arch": {}}
    for arch, fname in ARCH_FILES.items():
        text = open(f"{src}/src/models/{fname}.cpp").read()
        code = body(text, "::load_arch_hparams(")
        out["arch"][arch] = keys_of(code, names)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()

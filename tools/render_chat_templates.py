#!/usr/bin/env python3
"""Renders chat templates with the reference Jinja2 engine, the way Hugging Face's
apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks, loop controls, raise_exception,
strftime_now on a fixed clock, tojson without ASCII escaping), for a few conversations: plain
turns, a system prompt, unicode, and a tool definition with a call and its result; one JSON line
per rendering ("template", "case", "context", and "expected", or "error" where the template
raised, or "compile_error" where Jinja2 could not parse it). tests/jinja/template_test.cc checks
gale's renderer against them.

  python3 tools/render_chat_templates.py
      the real Hugging Face tokenizers in .deps/node/hf (their tokenizer_config.json's
      chat_template, with their BOS/EOS): tests/data/hf-chat/expected.jsonl (committed; run by hand)
  python3 tools/render_chat_templates.py --templates DIR --out FILE
      every DIR/*.jinja (BOS "<s>", EOS "</s>"): scripts/derive-test-data.sh renders llama.cpp's
      bundled templates this way at set-up
"""
import datetime
import glob
import json
import os
import sys
import types

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CASES = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    "system_multi_turn": {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3? Answer with \"six\" or 6."}], "add_generation_prompt": True},
    "no_generation_prompt": {"messages": [{"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": "Hello, how can I help?"}],
                             "add_generation_prompt": False},
    "unicode_whitespace": {"messages": [{"role": "user", "content": "  caf\u00e9 \u65e5\u672c \U0001f999\n\ttab  "}],
                           "add_generation_prompt": True},
    "tool_call_and_result": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp_c\": 18}"}],
        "tools": TOOLS, "add_generation_prompt": True},
}


def token_text(v):
    if isinstance(v, dict):
        return v.get("content", "")
    return v or ""


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime(2026, 1, 2, 3, 4, 5).strftime(fmt)
    # As transformers' tojson (json.dumps, no HTML escaping), except that a filter's generator
    # (`tools | map(attribute='function') | tojson`) is written as the list it yields, as
    # llama.cpp's template engine writes it; json.dumps alone raises on it.
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, ensure_ascii=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
        default=lambda o: list(o) if isinstance(o, types.GeneratorType) else json.JSONEncoder().default(o))
    return env


def render_cases(env, name, src, bos, eos):
    """Every case of CASES for one template: the entries to write."""
    out = []
    try:
        template = env.from_string(src)
    except Exception as e:  # Jinja2 cannot parse it: gale must refuse it too
        return [{"template": name, "compile_error": f"{type(e).__name__}: {e}"}]
    for case, ctx in CASES.items():
        context = dict(ctx, bos_token=bos, eos_token=eos)
        entry = {"template": name, "case": case, "context": context}
        try:
            entry["expected"] = template.render(**context)
        except Exception as e:  # the template refused the conversation: gale must refuse it too
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


def write(path, entries):
    with open(path, "w") as f:
        for e in entries:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    print(f"{len(entries)} renderings to {path}")


def main():
    root = os.path.join(os.path.dirname(__file__), "..")
    env = environment()
    if len(sys.argv) == 5 and sys.argv[1] == "--templates" and sys.argv[3] == "--out":
        entries = []
        for path in sorted(glob.glob(os.path.join(sys.argv[2], "*.jinja"))):
            entries += render_cases(env, os.path.basename(path), open(path, encoding="utf-8").read(), "<s>", "</s>")
        write(sys.argv[4], entries)
        return
    out = []
    for cfg_path in sorted(glob.glob(os.path.join(root, ".deps/node/hf/*/models/tokenizer_config.json"))):
        package = cfg_path.split(os.sep)[-3]
        cfg = json.load(open(cfg_path))
        src = cfg.get("chat_template")
        if isinstance(src, list):
            src = next((t["template"] for t in src if t.get("name") == "default"), None)
        if not src:
            continue
        out += render_cases(env, package, src, token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token")))
    write(os.path.join(root, "tests/data/hf-chat/expected.jsonl"), out)


if __name__ == "__main__":
    main()

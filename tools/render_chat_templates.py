#!/usr/bin/env python3
"""Renders the chat templates of the real Hugging Face tokenizers in .deps/node/hf (their
tokenizer_config.json's chat_template) with the reference Jinja2 engine, the way Hugging Face's
apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks, loop controls, raise_exception,
strftime_now on a fixed clock, tojson without ASCII escaping), for a few conversations: plain
turns, a system prompt, unicode, and a tool definition with a call and its result. Writes
tests/data/hf-chat/expected.jsonl in ../shared/chat-templates' format ("template" names the npm
package); tests/jinja/template_test.cc checks gale's renderer against it. Run by hand:

  python3 tools/render_chat_templates.py
"""
import datetime
import glob
import json
import os

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


def main():
    root = os.path.join(os.path.dirname(__file__), "..")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime(2026, 1, 2, 3, 4, 5).strftime(fmt)
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, ensure_ascii=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    out = []
    for cfg_path in sorted(glob.glob(os.path.join(root, ".deps/node/hf/*/models/tokenizer_config.json"))):
        package = cfg_path.split(os.sep)[-3]
        cfg = json.load(open(cfg_path))
        src = cfg.get("chat_template")
        if isinstance(src, list):
            src = next((t["template"] for t in src if t.get("name") == "default"), None)
        if not src:
            continue
        template = env.from_string(src)
        for case, ctx in CASES.items():
            context = dict(ctx, bos_token=token_text(cfg.get("bos_token")), eos_token=token_text(cfg.get("eos_token")))
            entry = {"template": package, "case": case, "context": context}
            try:
                entry["expected"] = template.render(**context)
            except Exception as e:  # the template refused the conversation: gale must refuse it too
                entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
    with open(os.path.join(root, "tests/data/hf-chat/expected.jsonl"), "w") as f:
        for e in out:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    print(f"{len(out)} renderings")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Engram's compressed token map of a byte-level tokenizer.json, written independently of gale's
C++ (src/convert/engram_constants.cc) from the description of DeepSeek's Engram reference
(engram_demo_v1.py, CompressedTokenizer): each token id decoded alone as Hugging Face decodes it
(GPT-2 byte map; a token with a character outside it as its own UTF-8), a decoding that is not
valid UTF-8 keyed on the raw vocab string, else normalized: NFKC, NFD, marks (category M*) dropped,
lower case, runs of space/tab/CR/LF to one space, a lone space kept, Unicode White_Space stripped
at both ends (an empty result keys on the decoded text); ids numbered by first occurrence.
Python's unicodedata and str.lower stand in for the Rust tokenizers crate.

Prints the number of distinct keys and the FNV-1a 64 hash of the map (uint32 little-endian per id):
  tools/engram_token_map.py .deps/node/hf/tokenizer-deepseek_v3/models/tokenizer.json
"""
import json
import re
import sys
import unicodedata

WHITE_SPACE = set([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000] +
                  list(range(0x2000, 0x200B)))


def byte_map():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars = {}
    extra = 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


CHAR_BYTE = byte_map()


def decode(token):
    if all(c in CHAR_BYTE for c in token):
        return bytes(CHAR_BYTE[c] for c in token)
    return token.encode("utf-8")


def normalize(text):
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = s.lower()
    s = re.sub(r"[ \t\r\n]+", " ", s)
    if s == " ":
        return " "
    b, e = 0, len(s)
    while b < e and ord(s[b]) in WHITE_SPACE:
        b += 1
    while e > b and ord(s[e - 1]) in WHITE_SPACE:
        e -= 1
    return s[b:e]


def main():
    tj = json.load(open(sys.argv[1], encoding="utf-8"))
    by_id = {i: p for p, i in tj["model"]["vocab"].items()}
    for a in tj.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
    n = max(by_id) + 1
    keys = {}
    h = 0xCBF29CE484222325
    for i in range(n):
        raw = by_id.get(i, "")
        data = decode(raw)
        try:
            text = data.decode("utf-8")
            clean = "\ufffd" not in text
        except UnicodeDecodeError:
            clean = False
        if not clean:
            key = raw
        else:
            key = normalize(text) or text
        nid = keys.setdefault(key, len(keys))
        for byte in nid.to_bytes(4, "little"):
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    print(len(keys), hex(h))


if __name__ == "__main__":
    main()

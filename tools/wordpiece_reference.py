#!/usr/bin/env python3
"""BERT WordPiece tokenization as Hugging Face's BertTokenizer does it (its BasicTokenizer with
lower-casing, accent stripping and Chinese-character splitting, then WordpieceTokenizer's greedy
longest match, "[UNK]" for a word with an unmatched rest or over 100 characters), over the vocab
of a llama.cpp-converted GGUF (word-initial pieces there carry a leading U+2581 instead of
continuations carrying "##").

Used where llama.cpp's own WordPiece differs from Hugging Face's: llama.cpp's NFD keeps only the
first code point of each decomposition (a Hangul syllable loses its vowel and final consonant) and
it drops spacing marks (category Mc) that BERT keeps. gale follows BertTokenizer.

  wordpiece_reference.py VOCAB.gguf INPUTS OUT
INPUTS: texts separated by "\\n__ggml_vocab_test__\\n"; OUT: one line per text, the ids without
special-token parsing, a tab, the ids with it (control and unknown token texts become tokens).
"""
import struct
import sys
import unicodedata

SEP = "\n__ggml_vocab_test__\n"


def read_vocab(path):
    f = open(path, "rb").read()
    o = 8
    _, nkv = struct.unpack_from("<QQ", f, o)
    o += 16
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def rs(o):
        n = struct.unpack_from("<Q", f, o)[0]
        return f[o + 8:o + 8 + n].decode("utf-8"), o + 8 + n

    kv = {}
    for _ in range(nkv):
        k, o = rs(o)
        t = struct.unpack_from("<I", f, o)[0]
        o += 4
        if t == 8:
            v, o = rs(o)
        elif t == 9:
            et, n = struct.unpack_from("<IQ", f, o)
            o += 12
            v = []
            for _ in range(n):
                if et == 8:
                    x, o = rs(o)
                else:
                    x = int.from_bytes(f[o:o + sizes[et]], "little", signed=et in (1, 3, 5, 11))
                    o += sizes[et]
                v.append(x)
        else:
            v = f[o:o + sizes[t]]
            o += sizes[t]
        kv[k] = v
    return kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"], kv


def is_control(c):
    if c in "\t\n\r":
        return False
    return unicodedata.category(c).startswith("C")


def is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_punctuation(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_chinese(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text):
    text = "".join(" " if is_whitespace(c) else c for c in text if not (ord(c) in (0, 0xFFFD) or is_control(c)))
    text = "".join(f" {c} " if is_chinese(ord(c)) else c for c in text)
    words = []
    for tok in text.split():
        tok = unicodedata.normalize("NFD", tok.lower())
        tok = "".join(c for c in tok if unicodedata.category(c) != "Mn")
        cur = ""
        for c in tok:
            if is_punctuation(c):
                if cur:
                    words.append(cur)
                words.append(c)
                cur = ""
            else:
                cur += c
        if cur:
            words.append(cur)
    return words


def wordpiece(words, ids, unk):
    out = []
    for w in words:
        if len(w) > 100:
            out.append(unk)
            continue
        pieces, start, ok = [], 0, True
        while start < len(w):
            end = len(w)
            found = None
            while start < end:
                sub = w[start:end]
                key = ("\u2581" + sub) if start == 0 else sub
                if key in ids:
                    found = ids[key]
                    break
                end -= 1
            if found is None:
                ok = False
                break
            pieces.append(found)
            start = end
        out.extend(pieces if ok else [unk])
    return out


def main():
    tokens, types, kv = read_vocab(sys.argv[1])
    ids = {}
    for i, t in enumerate(tokens):
        ids.setdefault(t, i)
    unk = kv.get("tokenizer.ggml.unknown_token_id", b"\x64\x00\x00\x00")
    unk = int.from_bytes(unk, "little") if isinstance(unk, bytes) else unk
    special = sorted((i for i, ty in enumerate(types) if ty in (2, 3) and tokens[i]), key=lambda i: -len(tokens[i]))
    texts = open(sys.argv[2], encoding="utf-8", newline="").read().split(SEP)[:-1]
    with open(sys.argv[3], "w") as out:
        for text in texts:
            plain = wordpiece(basic_tokenize(text), ids, unk)
            parsed, i, start = [], 0, 0
            while i < len(text):
                m = next((s for s in special if text.startswith(tokens[s], i)), None)
                if m is None:
                    i += 1
                    continue
                parsed += wordpiece(basic_tokenize(text[start:i]), ids, unk) + [m]
                i += len(tokens[m])
                start = i
            parsed += wordpiece(basic_tokenize(text[start:]), ids, unk)
            out.write(" ".join(map(str, plain)) + "\t" + " ".join(map(str, parsed)) + "\n")


if __name__ == "__main__":
    main()

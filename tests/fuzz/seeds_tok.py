#!/usr/bin/env python3
"""tests/fuzz/seeds_tok.py DIR - seed inputs for tests/fuzz/fuzz_tok.c.

Each seed: two little-endian bytes n, n bytes of text, then a small
tokenizer.json in one of the shapes real models use (byte-level BPE with a
Split regex and ByteLevel, SentencePiece-style BPE with byte fallback and
Metaspace, normalizer sequences, added tokens, TemplateProcessing), so the
fuzzer starts from files that load and mutates their fields."""
import json
import os
import struct
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
BYTE_VOCAB = {B2U[b]: b for b in range(256)}
SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
         "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
ADDED = [{"id": 300, "content": "<s>", "special": True, "lstrip": False, "rstrip": False, "normalized": False,
          "single_word": False},
         {"id": 301, "content": "</s>", "special": True, "lstrip": False, "rstrip": True, "normalized": False,
          "single_word": False},
         {"id": 302, "content": " hello", "special": False, "lstrip": True, "rstrip": False, "normalized": True,
          "single_word": False}]


def byte_level(merges, extra=None):
    v = dict(BYTE_VOCAB)
    for a, b in merges:
        v[a + b] = len(v)
    t = {"version": "1.0", "added_tokens": ADDED, "normalizer": {"type": "NFC"},
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
         "post_processor": {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}},
         "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                   "vocab": v, "merges": [a + " " + b for a, b in merges]}}
    if extra:
        extra(t)
    return t


def sentencepiece():
    v = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        v["<0x%02X>" % b] = 3 + b
    for p in ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "el", "lo", "▁hel", "▁hello", "▁w", "or", "▁wor", "▁world"]:
        v.setdefault(p, len(v))
    merges = [["▁", "h"], ["e", "l"], ["l", "o"], ["▁h", "el"], ["▁hel", "lo"], ["▁", "w"], ["o", "r"], ["▁w", "or"],
              ["▁wor", "d"]]
    return {"version": "1.0", "added_tokens": [
        {"id": 0, "content": "<unk>", "special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False},
        {"id": 1, "content": "<s>", "special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False},
        {"id": 2, "content": "</s>", "special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True, "vocab": v,
                  "merges": merges}}


def metaspace(t):
    t["normalizer"] = None
    t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
    t["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}


def digits(t):
    t["pre_tokenizer"]["pretokenizers"].insert(0, {"type": "Digits", "individual_digits": True})
    t["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


TEXTS = ["hello world", "Héllo, 世界! 🤖 naïve\ttabs\n  spaces", "<s>x</s> hello 12345 don't", "", "\xff?",
         "    \n\n\r\n  a", "▁hello▁world"]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    toks = [byte_level([]), byte_level([["h", "e"], ["l", "l"], ["he", "ll"], ["Ġ", "w"]]),
            byte_level([["h", "e"]], metaspace), byte_level([["1", "2"]], digits), sentencepiece()]
    n = 0
    for ti, t in enumerate(toks):
        j = json.dumps(t, ensure_ascii=False).encode()
        for text in TEXTS:
            b = text.encode("utf-8", "surrogatepass") if text != "\xff?" else b"\xff?"
            with open(os.path.join(out, "seed_%d_%d" % (ti, n)), "wb") as f:
                f.write(struct.pack("<H", len(b)) + b + j)
            n += 1
    print("seeds_tok: %d seeds in %s" % (n, out))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""tests/ref/tok_corpus.py - the lines tests/cli/tokenize.sh compares with
the reference tokenizer: Debian's fortunes (English), fortunes-de (German,
in /usr/share/games/fortunes/de), fortunes-es/it/ru/pl, tandem's own C
source, and hand-written lines for what real text rarely holds (emoji, odd
whitespace, zero-width and bidi characters, digits, CJK and other scripts,
combining marks, the tokenizers' special-token strings inside text).

  tok_corpus.py --out DIR [--budget BYTES] [--full] [--specials A.json ...]

writes DIR/lines.txt (one line each, split on \\n only) and DIR/groups.txt
(the group of each line).  Lines are deduplicated per group.  By default
each file-based group is a deterministic sample: its unique lines ordered by
their MD5, taken until --budget bytes (so the test stays fast; the reference
port encodes ~0.15 MB/s for Qwen3); --full takes every unique line.
--specials: tokenizer.json files whose added-token strings get embedded in
text.
"""
import argparse
import hashlib
import json
import os
import sys

FORTUNES = "/usr/share/games/fortunes"
GROUPS = [
    ("en", [FORTUNES]),
    ("de", [FORTUNES + "/de"]),
    ("es", [FORTUNES + "/es"]),
    ("it", [FORTUNES + "/it"]),
    ("ru", [FORTUNES + "/ru"]),
    ("pl", [FORTUNES + "/pl"]),
]


def fortune_files(d):
    """Regular files of d (not recursive), no strfile indexes or symlinks."""
    if not os.path.isdir(d):
        sys.exit(f"tok_corpus: {d} is missing (install the fortunes packages: ./tandem.sh deps)")
    out = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if name.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p):
            continue
        out.append(p)
    return out


def file_lines(paths):
    seen, lines = set(), []
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("latin-1")   # a few old fortune files; still real text
        for line in text.split("\n"):
            if line not in seen:
                seen.add(line)
                lines.append(line)
    return lines


def sample(lines, budget):
    if budget is None:
        return lines
    keyed = sorted(lines, key=lambda l: hashlib.md5(l.encode("utf-8")).digest())
    out, used = [], 0
    for l in keyed:
        if used >= budget:
            break
        out.append(l)
        used += len(l.encode("utf-8")) + 1
    return out


def source_lines(root):
    paths = []
    for d in ("core", "core/ops", "core/model", "core/tok", "train", "infer"):
        full = os.path.join(root, d)
        if os.path.isdir(full):
            paths += [os.path.join(full, n) for n in sorted(os.listdir(full)) if n.endswith((".c", ".h"))]
    return file_lines(paths)


HANDWRITTEN = [
    # emoji: single, ZWJ sequences, skin tones, flags, keycaps, variation selectors
    "I love 🍕 and 🐈‍⬛ and 👩🏽‍💻 and 🇫🇷🇯🇵 and 1️⃣ and ❤️ and ☺︎",
    "🙂🙂🙂 😀😃😄😁😆😅🤣😂 🏳️‍🌈 👨‍👩‍👧‍👦",
    # whitespace: tabs, runs of spaces, NBSP, thin spaces, ideographic space,
    # NEL, line/paragraph separators, carriage returns
    "\tindented\twith\ttabs\t\t",
    "runs    of     spaces      and trailing   ",
    "   leading spaces",
    "non\u00a0breaking\u00a0space and narrow\u202fnbsp and thin\u2009space and em\u2003space",
    "ideographic\u3000space\u3000here",
    "next\u0085line and line\u2028sep and para\u2029sep",
    "carriage\rreturn inside and at the end\r",
    "windows line\r",
    "\r",
    " ",
    "",
    "\u00a0",
    # zero-width and bidi controls, BOM
    "zero\u200bwidth\u200cnon\u200djoiner\u2060word joiner",
    "\ufeffstarts with a BOM and has one\ufeffinside",
    "bidi \u202eoverride\u202c and \u200fmarks\u200e",
    "soft\u00adhyphen",
    # digits
    "0123456789 12345678901234567890 3.14159 1,000,000 1e-10 0x7fffffff -42",
    "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ０１２３ ½ ² ⅷ Ⅻ",
    "2024-01-15T13:45:00Z, v1.2.3, 192.168.0.1, +33 1 23 45 67 89",
    # CJK and other scripts
    "你好，世界！这是一个测试。我们用中文写一句话。",
    "日本語のテキストです。カタカナとひらがな、漢字が混ざっています。",
    "한국어 문장입니다. 안녕하세요!",
    "Ελληνικά: Καλημέρα κόσμε. עברית: שלום עולם. العربية: مرحبا بالعالم",
    "हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก. ქართული: გამარჯობა",
    "Tiếng Việt: Xin chào thế giới. Türkçe: İstanbul ığdır ĞÜŞÖÇ",
    # combining marks and normalization (NFC / NFD forms of the same text)
    "e\u0301cole, cafe\u0301, n\u0303, A\u030a, \u1e9b\u0323",
    "école, café, ñ, Å, Ωmega Ω K Å",
    "ﬁ ﬂ ﬀ ﬃ ㎏ ① ⓐ Ⅸ ｆｕｌｌｗｉｄｔｈ",
    # punctuation, quotes, contractions, code-like text
    "It's, you're, they've, I'm, he'll, she'd, DON'T, I'M, 'quoted' \"double\" «guillemets» „German“",
    "x = a->b[i] * (c + d) / e; // comment ### ~~~ ``` <<< >>> ... —– ‒",
    "https://example.com/path?q=1&r=2#frag user@example.org $HOME ~/.bashrc",
    "\\n \\t \\\\ \\u0041 %d %s {} [] () <> \x7f",
    "a\x01b\x02c\x1bd control chars",
    "Ⓐ ⓑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 🄰 math: ∑ ∫ √ ∞ ≠ ≤",
    "ſ long s, ẞ capital sharp s, ǅ titlecase, ﬅ",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "                                                                                 x",
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!???????????????????????????????.............................",
]


def special_lines(paths):
    """Text holding each tokenizer's added tokens: alone, inside words, next
    to spaces and newlines-free context, and near-misses."""
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            tj = json.load(f)
        toks = [t["content"] for t in tj.get("added_tokens", [])][:40]
        for t in toks:
            out.append(t)
            out.append(f"before {t} after")
            out.append(f"glued{t}glued")
            out.append(f"  {t}  ")
            out.append(f"{t}{t}")
            out.append(t[:-1] if len(t) > 1 else t + t)   # a near miss
        if len(toks) >= 2:
            out.append(f"<|im_start|>user hello{toks[0]} {toks[1]}<|im_end|>")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=int, default=60000)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--specials", nargs="*", default=[])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    a = ap.parse_args()
    budget = None if a.full else a.budget
    groups = []
    for name, dirs in GROUPS:
        paths = []
        for d in dirs:
            paths += fortune_files(d)
        groups.append((name, sample(file_lines(paths), budget)))
    groups.append(("code", sample(source_lines(a.root), budget)))
    groups.append(("handwritten", HANDWRITTEN))
    groups.append(("specials", list(dict.fromkeys(special_lines(a.specials)))))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "lines.txt"), "w", encoding="utf-8", newline="") as f, \
         open(os.path.join(a.out, "groups.txt"), "w") as g:
        for name, lines in groups:
            for l in lines:
                if "\n" in l:
                    sys.exit("tok_corpus: a line holds \\n")
                f.write(l + "\n")
                g.write(name + "\n")


if __name__ == "__main__":
    main()

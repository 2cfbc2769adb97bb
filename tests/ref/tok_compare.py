#!/usr/bin/python3
"""tests/ref/tok_compare.py - tandem's tokenizer against the reference, line
by line (tests/cli/tokenize.sh drives it).

  tok_compare.py --name NAME --lines lines.txt --groups groups.txt
                 --ref ref.jsonl --special ours_s.jsonl --plain ours_p.jsonl
                 --decode ours_d.jsonl --skip ours_k.jsonl --round ours_r.jsonl
                 [--bos-added ID]

ref.jsonl comes from tests/ref/tok_ref.js ({"s", "p", "d", "k"} per line);
ours_s / ours_p are `tandem tokenize --jsonl` with and without special
tokens; ours_d and ours_k are `tandem tokenize --decode` of the reference's
ids (p, and s with --skip-special); ours_r decodes tandem's own ids p.

Checks, for every line:
  - ids without special tokens equal the reference's;
  - ids with special tokens equal the reference's, except with --bos-added
    ID: transformers' LlamaTokenizerFast rebuilds the post-processor from
    add_bos_token (update_post_processor) so HF prepends ID, which the port
    does not do; the expected ids are then [ID] + the reference's plain ids
    (the port's post-processor adds nothing for that tokenizer);
  - decode of the reference's ids equals the reference's decode, with and
    without skip_special_tokens;
  - where the reference round-trips (decode(encode(x)) == x), so does
    tandem.
Prints one summary line (lines and tokens compared, per group) and the
first mismatches; exits 1 on any mismatch.
"""
import argparse
import collections
import json
import sys


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        v = f.read().split("\n")
    if v and v[-1] == "":
        v.pop()
    return v


def jsonl(path, key):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l)[key] for l in f]


def main():
    ap = argparse.ArgumentParser()
    for k in ("name", "lines", "groups", "ref", "special", "plain", "decode", "skip", "round"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--bos-added", type=int, default=None)
    a = ap.parse_args()
    lines = read_lines(a.lines)
    groups = read_lines(a.groups)
    with open(a.ref, encoding="utf-8") as f:
        ref = [json.loads(l) for l in f]
    ours_s, ours_p = jsonl(a.special, "ids"), jsonl(a.plain, "ids")
    ours_d, ours_k, ours_r = jsonl(a.decode, "text"), jsonl(a.skip, "text"), jsonl(a.round, "text")
    n = len(lines)
    for name, v in (("groups", groups), ("ref", ref), ("special", ours_s), ("plain", ours_p),
                    ("decode", ours_d), ("skip", ours_k), ("round", ours_r)):
        if len(v) != n:
            print(f"{a.name}: {name} has {len(v)} lines, the corpus {n}")
            return 1
    bad = []
    per = collections.OrderedDict()
    tokens = 0
    rt_ref = rt_ours = 0
    for i in range(n):
        r, line = ref[i], lines[i]
        g = per.setdefault(groups[i], [0, 0])
        g[0] += 1
        g[1] += len(r["p"])
        tokens += len(r["p"]) + len(r["s"])
        want_s = r["s"] if a.bos_added is None else [a.bos_added] + r["p"]
        if ours_p[i] != r["p"]:
            bad.append((i, "ids (no special tokens)", r["p"], ours_p[i]))
        if ours_s[i] != want_s:
            bad.append((i, "ids (special tokens)", want_s, ours_s[i]))
        if ours_d[i] != r["d"]:
            bad.append((i, "decode", r["d"], ours_d[i]))
        if ours_k[i] != r["k"]:
            bad.append((i, "decode skip_special", r["k"], ours_k[i]))
        if r["d"] == line:
            rt_ref += 1
            if ours_r[i] == line:
                rt_ours += 1
            else:
                bad.append((i, "round trip", line, ours_r[i]))
    summary = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in per.items())
    print(f"{a.name}: {n} lines, {tokens} ids compared (with and without special tokens); "
          f"round trip on {rt_ours}/{rt_ref} lines where the reference round-trips; "
          f"lines/tokens per group: {summary}")
    for i, what, want, got in bad[:10]:
        print(f"  MISMATCH line {i + 1} [{groups[i]}] {what}: {lines[i]!r:.120}\n    reference: {want!r:.300}\n    tandem:    {got!r:.300}")
    if bad:
        print(f"{a.name}: {len(bad)} mismatches")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

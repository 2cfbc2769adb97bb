#!/usr/bin/python3
"""tests/ref/rollout_check.py - checks of `tandem rollout` output (tests/cli/rollout.sh).

  rollout_check.py shape OUT.jsonl --prompts P.jsonl --n N --ckpt CKPT.h5 --max-tokens M --seed S
                   [--versions 10,20] [--order]
      every prompt x sample exactly once; fields and their shapes (ids,
      logprobs and routes of one length, routes [n][n_moe_layers][k] with
      distinct expert ids below E, text = the bytes of ids decoded with one
      U+FFFD per maximal invalid subpart (from_utf8_lossy), seed = S +
      1000003 * prompt_index + sample, prompt_ids = the prompt's tokens;
      finish_reason "stop" exactly when ids end with a --stop string, which
      appears nowhere before); with --versions, every sample carries one of them and
      each appears; with --order, versions never decrease in output order and
      the samples of each version are a contiguous range of
      (prompt_index, sample) in submission order (a swap waits for the
      in-flight requests, later ones get the new weights).
  rollout_check.py same A.jsonl B.jsonl
      the same samples (sorted by id and sample), field for field.
  rollout_check.py verdict CHECK.json --samples N
      the trainer's check: logprob_diff_max == 0.0 and routing_mismatch == 0.0
      exactly, over N samples.
Exit 0 when everything holds; otherwise one line per failure and exit 1.
"""
import argparse
import json
import math
import sys

import h5py

FIELDS = ["id", "sample", "prompt_ids", "ids", "text", "logprobs", "finish_reason", "policy_version",
          "seed", "routes"]


def fail(msg):
    print("rollout_check: FAIL: " + msg)
    sys.exit(1)


def decode_like_tandem(ids):
    """The byte-level tokenizer's decode: Python's errors="replace" is the
    rule of Rust's from_utf8_lossy that HF tokenizers use (one U+FFFD per
    maximal invalid subpart)."""
    return bytes(ids).decode("utf-8", "replace")


def read_jsonl(path):
    rows = []
    with open(path, "rb") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                fail("%s:%d: not JSON: %s" % (path, ln, e))
    return rows


def model_shape(ckpt):
    with h5py.File(ckpt, "r") as f:
        cfg = json.loads(f.attrs["config"])
    n_moe = sum(1 for l in range(cfg["num_hidden_layers"]) if l >= cfg["first_k_dense_replace"])
    return cfg, n_moe


def cmd_shape(a):
    cfg, n_moe = model_shape(a.ckpt)
    E, k, V = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["vocab_size"]
    prompts = read_jsonl(a.prompts)
    want = {}
    for i, p in enumerate(prompts):
        toks = list(p["prompt"].encode("utf-8")) if "prompt" in p else p["prompt_ids"]
        pid = p.get("id", i)
        for j in range(a.n):
            want[(json.dumps(pid), j)] = (i, toks)
    rows = read_jsonl(a.out)
    seen = set()
    versions = [int(v) for v in a.versions.split(",")] if a.versions else None
    for r in rows:
        where = "sample id=%r sample=%r" % (r.get("id"), r.get("sample"))
        if sorted(r) != sorted(FIELDS):
            fail("%s: fields %s, want %s" % (where, sorted(r), sorted(FIELDS)))
        key = (json.dumps(r["id"]), r["sample"])
        if key not in want:
            fail("%s: no such prompt x sample" % where)
        if key in seen:
            fail("%s: written twice" % where)
        seen.add(key)
        pi, toks = want[key]
        r["_index"] = pi * a.n + r["sample"]
        if r["prompt_ids"] != toks:
            fail("%s: prompt_ids %s, want %s" % (where, r["prompt_ids"][:8], toks[:8]))
        n = len(r["ids"])
        if not (1 <= n <= a.max_tokens) or len(r["logprobs"]) != n or len(r["routes"]) != n:
            fail("%s: %d ids, %d logprobs, %d routes (max_tokens %d)"
                 % (where, n, len(r["logprobs"]), len(r["routes"]), a.max_tokens))
        if r["finish_reason"] not in ("length", "stop"):
            fail("%s: finish_reason %r" % (where, r["finish_reason"]))
        if r["finish_reason"] == "length" and n != min(a.max_tokens, cfg["max_position_embeddings"] - len(toks)):
            fail("%s: finish_reason length after %d tokens" % (where, n))
        stops = [x.encode("utf-8") for x in a.stop]
        ends = [bytes(r["ids"]).endswith(x) for x in stops]
        if (r["finish_reason"] == "stop") != any(ends) or any(x in bytes(r["ids"][:-1]) for x in stops):
            fail("%s: finish_reason %s, ids %s, stop strings %s (kept at the end, nowhere else)"
                 % (where, r["finish_reason"], r["ids"], a.stop))
        if any(not (0 <= t < V) for t in r["ids"]):
            fail("%s: ids outside the vocabulary" % where)
        if any(not (math.isfinite(x) and x <= 0) for x in r["logprobs"]):
            fail("%s: logprobs must be finite and <= 0" % where)
        for j, rt in enumerate(r["routes"]):
            if len(rt) != n_moe or any(len(l) != k or len(set(l)) != k or not all(0 <= e < E for e in l)
                                       for l in rt):
                fail("%s: routes[%d] = %s, want %d layers x %d distinct experts below %d"
                     % (where, j, rt, n_moe, k, E))
        if r["text"] != decode_like_tandem(r["ids"]):
            fail("%s: text %r does not match ids" % (where, r["text"]))
        if r["seed"] != (a.seed + 1000003 * pi + r["sample"]) % 2**64:
            fail("%s: seed %d, want %d" % (where, r["seed"], a.seed + 1000003 * pi + r["sample"]))
        if versions is not None and r["policy_version"] not in versions:
            fail("%s: policy_version %r not in %s" % (where, r["policy_version"], versions))
    if len(seen) != len(want):
        fail("%d samples missing (of %d)" % (len(want) - len(seen), len(want)))
    counts = {}
    for r in rows:
        counts[r["policy_version"]] = counts.get(r["policy_version"], 0) + 1
    if versions is not None and sorted(counts) != sorted(versions):
        fail("versions seen %s, want each of %s" % (counts, versions))
    if a.order:
        vs = [r["policy_version"] for r in rows]
        if vs != sorted(vs):
            fail("policy versions decrease in output order")
        by_index = sorted(rows, key=lambda r: r["_index"])
        vi = [r["policy_version"] for r in by_index]
        if vi != sorted(vi):
            fail("the samples of a version are not a contiguous range in submission order: %s" % vi)
    print("ok   %s: %d samples, %d tokens, versions %s" % (a.out, len(rows), sum(len(r["ids"]) for r in rows),
                                                          dict(sorted(counts.items()))))


def cmd_same(a):
    x = sorted(read_jsonl(a.a), key=lambda r: (json.dumps(r["id"]), r["sample"]))
    y = sorted(read_jsonl(a.b), key=lambda r: (json.dumps(r["id"]), r["sample"]))
    if len(x) != len(y):
        fail("%d vs %d samples" % (len(x), len(y)))
    for r, s in zip(x, y):
        if r != s:
            diff = [f for f in FIELDS if r.get(f) != s.get(f)]
            fail("sample id=%r sample=%r differs in %s" % (r["id"], r["sample"], diff))
    print("ok   %s == %s (%d samples)" % (a.a, a.b, len(x)))


def cmd_verdict(a):
    with open(a.check) as f:
        c = json.load(f)
    if c.get("samples") != a.samples:
        fail("the check covered %r samples, want %d" % (c.get("samples"), a.samples))
    if c["logprob_diff_max"] != 0.0 or c["routing_mismatch"] != 0.0:
        fail("trainer vs rollout: %s" % json.dumps(c))
    if c["tokens"] <= 0 or c["routes"] <= 0:
        fail("nothing compared: %s" % json.dumps(c))
    print("ok   trainer check: %d samples, %d tokens, %d routes, logprob_diff_max %r, routing_mismatch %r, "
          "versions %s" % (c["samples"], c["tokens"], c["routes"], c["logprob_diff_max"], c["routing_mismatch"],
                           c["versions"]))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shape")
    s.add_argument("out")
    s.add_argument("--prompts", required=True)
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--ckpt", required=True)
    s.add_argument("--max-tokens", type=int, required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--versions")
    s.add_argument("--stop", action="append", default=[])
    s.add_argument("--order", action="store_true")
    s = sub.add_parser("same")
    s.add_argument("a")
    s.add_argument("b")
    s = sub.add_parser("verdict")
    s.add_argument("check")
    s.add_argument("--samples", type=int, required=True)
    a = ap.parse_args()
    {"shape": cmd_shape, "same": cmd_same, "verdict": cmd_verdict}[a.cmd](a)


if __name__ == "__main__":
    main()

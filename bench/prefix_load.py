#!/usr/bin/python3
"""bench/prefix_load.py - what the prefix cache saves, measured through an
OpenAI-compatible completions server (bench/prefix.sh runs it against
`tandem serve`, once with the cache and once with --no-prefix-cache).

    prefix_load.py --port P [--host 127.0.0.1] [--vocab 256] [--system 600]
                   [--turns 4] [--user 40] [--answer 32] [--group 8]
                   [--group-prompt 900] [--group-tokens 64] [--label NAME]

Agent trace: an agent conversation of --turns turns; turn 1 sends a system
prompt of --system token ids and a user message of --user ids, every later
turn resends the whole history (all earlier prompts and answers) and a new
user message.  Each answer is --answer tokens, greedy, streamed: TTFT is
the time to the first streamed token, total the time to the last.
RL group: one prompt of --group-prompt ids with "n": --group samples of
--group-tokens tokens each (temperature 1, seeded), streamed: TTFT (first
token of any sample) and total.  The group's prompt shares nothing with the
agent's.  Prints one JSON line {"bench":"prefix", ...}; exit 1 on any error.
"""
import argparse
import http.client
import json
import sys
import time


def ids(n, vocab, salt):
    return [(i * 37 + 11 + 13 * salt) % vocab for i in range(n)]


def stream(host, port, body):
    """(ttft seconds, total seconds, {index: token ids}) of one streamed completion."""
    c = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    ttft, out = None, {}
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            t = ch.get("token_ids") or []
            if t and ttft is None:
                ttft = time.perf_counter() - t0
            out.setdefault(ch["index"], []).extend(t)
    total = time.perf_counter() - t0
    c.close()
    return ttft, total, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--system", type=int, default=600)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user", type=int, default=40)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--group-prompt", type=int, default=900)
    ap.add_argument("--group-tokens", type=int, default=64)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    res = {"bench": "prefix", "label": a.label}
    try:
        # warm-up: one short request (threads, pages), shares nothing below
        stream(a.host, a.port, {"prompt": ids(8, a.vocab, 99), "max_tokens": 2, "temperature": 0})
        hist = ids(a.system, a.vocab, 1)
        turns = []
        for k in range(a.turns):
            prompt = hist + ids(a.user, a.vocab, 10 + k)
            ttft, total, out = stream(a.host, a.port, {"prompt": prompt, "max_tokens": a.answer, "temperature": 0,
                                                       "ignore_eos": True})
            turns.append({"prompt_tokens": len(prompt), "ttft_s": ttft, "total_s": total})
            hist = prompt + out.get(0, [])
        res["agent"] = turns
        res["agent_total_s"] = sum(t["total_s"] for t in turns)
        res["turn2_over_turn1_ttft"] = turns[1]["ttft_s"] / turns[0]["ttft_s"] if a.turns > 1 else None
        ttft, total, out = stream(a.host, a.port, {"prompt": ids(a.group_prompt, a.vocab, 2), "n": a.group,
                                                   "max_tokens": a.group_tokens, "temperature": 1.0, "seed": 5,
                                                   "ignore_eos": True})
        if len(out) != a.group:
            raise RuntimeError(f"the group answered {len(out)} samples, want {a.group}")
        res["group"] = {"n": a.group, "prompt_tokens": a.group_prompt, "ttft_s": ttft, "total_s": total}
    except (OSError, RuntimeError, ValueError) as e:
        print(f"bench/prefix_load.py: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

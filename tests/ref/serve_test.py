#!/usr/bin/python3
"""tests/ref/serve_test.py - `tandem serve` through a real HTTP client.

Run by tests/cli/serve.sh against a running server (started with
--max-running 16 --max-queue 48 --max-body 65536 on a tiny checkpoint):

  serve_test.py --url http://127.0.0.1:PORT --tandem bin/tandem --ckpt RUN --tmp DIR --pid PID

Checks: response shapes (completion, stream, models, health, metrics);
streamed text == whole text for the same seed; n > 1; seeds; greedy
repeatability; stop strings; log-probabilities equal `tandem score` (the
training forward) bit for bit; batch invariance (a request alone vs. beside
15 others, bitwise); 32 concurrent clients; every class of bad request gets
its 4xx with an OpenAI error object; overload gets 429; clients that hang up
free their slots and cache blocks.  Exits 1 on the first failed check.
"""
import argparse
import http.client
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

import h5py
import numpy as np

ARGS = None
HOST = PORT = None
CONTEXT = 256


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


# ----------------------------------------------------------------- client


def request(method, path, body=None, headers=None, timeout=60):
    """One HTTP exchange on a fresh connection: (status, headers, body bytes)."""
    c = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def complete(body, expect=200):
    st, _, data = request("POST", "/v1/completions", body)
    check(st == expect, f"POST /v1/completions {json.dumps(body)[:200]}: status {st}, want {expect}: {data[:300]!r}")
    return json.loads(data)


def stream(body):
    """Streams a completion: (list of chunk objects, raw text)."""
    body = dict(body, stream=True)
    c = http.client.HTTPConnection(HOST, PORT, timeout=60)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        check(r.status == 200, f"stream: status {r.status}")
        check(r.getheader("Content-Type", "").startswith("text/event-stream"), "stream: Content-Type")
        check(r.getheader("Cache-Control", "") == "no-cache", "stream: Cache-Control")
        raw = r.read().decode()
    finally:
        c.close()
    check(raw.endswith("data: [DONE]\n\n"), f"stream does not end with data: [DONE]: ...{raw[-80:]!r}")
    events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]   # ": keep-alive" comments
    check(all(e.startswith("data: ") for e in events), "stream: every event is a data: line")
    check(events.count("data: [DONE]") == 1 and events[-1] == "data: [DONE]", "stream: one [DONE], last")
    return [json.loads(e[6:]) for e in events[:-1]], raw


def metrics():
    st, h, data = request("GET", "/metrics")
    check(st == 200, "GET /metrics")
    check(h.get("Content-Type", "").startswith("text/plain; version=0.0.4"), "metrics Content-Type")
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def join_all(threads, timeout, what):
    """Joins client threads, all within timeout seconds (each request has
    its own socket timeout too)."""
    t_end = time.time() + timeout
    for t in threads:
        t.join(max(0.0, t_end - time.time()))
    alive = sum(t.is_alive() for t in threads)
    check(alive == 0, f"{what}: {alive} clients still waiting after {timeout} s")


def wait_idle(what, timeout=10.0):
    """Polls /metrics until nothing runs, waits or holds cache blocks."""
    t0 = time.time()
    while True:
        m = metrics()
        if m["tandem_requests_running"] == 0 and m["tandem_requests_waiting"] == 0 and m["tandem_kv_blocks_used"] == 0:
            return m, time.time() - t0
        check(time.time() - t0 < timeout, f"{what}: still busy after {timeout} s: running "
              f"{m['tandem_requests_running']} waiting {m['tandem_requests_waiting']} kv {m['tandem_kv_blocks_used']}")
        time.sleep(0.05)


def as_text(ids):
    """Our text rule for ASCII-only ids (the tiny model rarely emits more)."""
    return bytes(ids).decode("ascii")


# ------------------------------------------------------------------ tests


def test_health_models():
    st, _, data = request("GET", "/health")
    check(st == 200 and json.loads(data) == {"status": "ok"}, f"/health: {st} {data!r}")
    st, _, data = request("GET", "/v1/models")
    o = json.loads(data)
    check(st == 200 and o["object"] == "list" and len(o["data"]) == 1, f"/v1/models: {data!r}")
    m = o["data"][0]
    check(m["object"] == "model" and isinstance(m["id"], str) and m["max_model_len"] == CONTEXT, f"model: {m}")
    st, _, data = request("GET", "/v1/models/" + m["id"])
    check(st == 200 and json.loads(data)["id"] == m["id"], "GET /v1/models/<id>")
    return m["id"]


def check_completion(o, n_choices, prompt_tokens, max_tokens, logprobs=None):
    check(o["object"] == "text_completion" and o["id"].startswith("cmpl-"), f"object/id: {o.get('object')}")
    check(isinstance(o["created"], int) and isinstance(o["model"], str), "created/model")
    ch = o["choices"]
    check(len(ch) == n_choices, f"{len(ch)} choices, want {n_choices}")
    total = 0
    for i, c in enumerate(ch):
        check(c["index"] == i, "choice index")
        ids = c["token_ids"]
        check(1 <= len(ids) <= max_tokens, f"{len(ids)} tokens, max_tokens {max_tokens}")
        check(c["finish_reason"] in ("length", "stop"), f"finish_reason {c['finish_reason']}")
        if c["finish_reason"] == "length":
            check(len(ids) == max_tokens, "length finish with fewer tokens than max_tokens")
        if all(t < 128 for t in ids):
            check(c["text"] == as_text(ids), "text == bytes of token_ids")
        total += len(ids)
        if logprobs is None:
            check(c["logprobs"] is None, "logprobs null when not asked")
            continue
        lp = c["logprobs"]
        check(set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, f"logprobs keys {set(lp)}")
        check(all(len(lp[k]) == len(ids) for k in lp), "logprobs arrays as long as token_ids")
        check(all(x <= 0.0 for x in lp["token_logprobs"]), "log-probabilities <= 0")
        check(all(len(t) == logprobs for t in lp["top_logprobs"]), f"top_logprobs of size {logprobs}")
        for t in lp["top_logprobs"]:
            v = list(t.values())
            check(v == sorted(v, reverse=True), "top_logprobs sorted by log-probability")
        check(lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0, "text_offset")
        if all(32 <= t < 127 for t in ids):
            check(lp["tokens"] == [chr(t) for t in ids], "tokens are the characters")
            check(lp["text_offset"] == list(range(len(ids))), "text_offset of single-byte tokens")
    u = o["usage"]
    check(u == {"prompt_tokens": prompt_tokens, "completion_tokens": total, "total_tokens": prompt_tokens + total},
          f"usage {u}")


def test_completion_shape():
    o = complete({"prompt": "The quick brown fox", "max_tokens": 12, "seed": 1})
    check_completion(o, 1, 19, 12)
    o = complete({"prompt": [72, 101, 108, 108, 111], "max_tokens": 7, "logprobs": 3, "seed": 2})
    check_completion(o, 1, 5, 7, logprobs=3)
    # defaults: max_tokens 16, temperature 1
    o = complete({"prompt": "abc"})
    check_completion(o, 1, 3, 16)
    # a batch of prompts: n x prompts choices, prompt tokens counted once per prompt
    o = complete({"prompt": ["ab", [99, 100, 101]], "n": 2, "max_tokens": 3, "seed": 5})
    check_completion(o, 4, 5, 3)
    # harmless extras are accepted
    o = complete({"prompt": "x", "max_tokens": 2, "model": "whatever", "user": "u", "best_of": 1, "echo": False,
                  "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "suffix": None,
                  "stop": None, "stream": False, "top_k": 0, "top_p": 1})
    check_completion(o, 1, 1, 2)


def test_greedy_and_seeds():
    p = {"prompt": "Love is", "max_tokens": 32}
    a = complete(dict(p, temperature=0))
    b = complete(dict(p, temperature=0, seed=99))
    check(a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"], "temperature 0 twice: same tokens")
    s1 = complete(dict(p, temperature=1.0, seed=1234, logprobs=1))
    s2 = complete(dict(p, temperature=1.0, seed=1234, logprobs=1))
    s3 = complete(dict(p, temperature=1.0, seed=4321, logprobs=1))
    t1, t2, t3 = (x["choices"][0]["token_ids"] for x in (s1, s2, s3))
    check(t1 == t2, "same seed: same tokens")
    check(s1["choices"][0]["logprobs"] == s2["choices"][0]["logprobs"], "same seed: same log-probabilities")
    check(t1 != t3, "different seeds: different tokens (32 sampled tokens)")
    check(s1["choices"][0]["seed"] == 1234, "the seed is reported")
    # n = 3 with a seed: choice i is the single request with seed + i
    o = complete(dict(p, n=3, seed=1234))
    check_completion(o, 3, 7, 32)
    check([c["seed"] for c in o["choices"]] == [1234, 1235, 1236], "n=3 seeds")
    check(o["choices"][0]["token_ids"] == t1, "n=3: choice 0 == the request with the same seed")
    one = complete(dict(p, seed=1236))
    check(o["choices"][2]["token_ids"] == one["choices"][0]["token_ids"], "n=3: choice 2 == seed + 2")
    # without a seed every choice gets its own random seed
    o = complete(dict(p, n=3))
    seeds = [c["seed"] for c in o["choices"]]
    check(len(set(seeds)) == 3, f"random seeds per choice: {seeds}")
    check(len({tuple(c["token_ids"]) for c in o["choices"]}) > 1, "n=3 without seed: choices differ")
    again = complete(dict(p, seed=seeds[1]))
    check(again["choices"][0]["token_ids"] == o["choices"][1]["token_ids"], "the reported seed reproduces")


def test_stream():
    for body in ({"prompt": "Stream me", "max_tokens": 40, "seed": 7, "logprobs": 2},
                 {"prompt": "Two at once", "max_tokens": 25, "seed": 11, "n": 2},
                 {"prompt": "Greedy", "max_tokens": 20, "temperature": 0, "stream_options": {"include_usage": True}}):
        whole = complete(body)
        chunks, _ = stream(body)
        n = body.get("n", 1)
        usage = [c for c in chunks if not c["choices"]]
        if body.get("stream_options"):
            check(len(usage) == 1 and usage[0]["usage"] == whole["usage"], "include_usage chunk")
        else:
            check(not usage, "no usage chunk unless asked")
        for i in range(n):
            mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
            check(all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks), "chunk ids")
            check(all(m["finish_reason"] is None for m in mine[:-1]), "finish_reason null until the last chunk")
            w = whole["choices"][i]
            check(mine[-1]["finish_reason"] == w["finish_reason"], "final chunk has the finish_reason")
            text = "".join(m["text"] for m in mine)
            check(text == w["text"], f"stream text {text!r} != whole text {w['text']!r}")
            ids = sum((m["token_ids"] for m in mine), [])
            check(ids == w["token_ids"], "stream token_ids == whole token_ids")
            if body.get("logprobs") is not None:
                lp = {k: sum((m["logprobs"][k] for m in mine), []) for k in w["logprobs"]}
                check(lp == w["logprobs"], "stream logprobs == whole logprobs")


def test_stop():
    # a sampled, seeded completion; a stop string taken from its tokens
    # 10..11 (ASCII, so that it is a JSON string) must cut it before the
    # first occurrence: stopping does not change the tokens before the stop
    for seed in range(50):
        base = {"prompt": "Once upon a time", "max_tokens": 60, "seed": seed}
        ids = complete(base)["choices"][0]["token_ids"]
        if all(0 < t < 128 for t in ids[10:12]):
            break
    else:
        raise Fail("no ASCII tokens 10..11 in 50 samples")
    stop = bytes(ids[10:12])
    first = next(i for i in range(len(ids) - 1) if bytes(ids[i:i + 2]) == stop)
    cut = ids[:first]
    o = complete(dict(base, stop=[stop.decode(), "\x01never"]))
    c = o["choices"][0]
    check(c["finish_reason"] == "stop" and c["token_ids"] == cut, f"stop {stop!r}: {c['token_ids']} != {cut}")
    check(o["usage"]["completion_tokens"] == len(cut), "usage counts without the stop string")
    chunks, _ = stream(dict(base, stop=stop.decode(), logprobs=1))
    got = sum((x["choices"][0]["token_ids"] for x in chunks if x["choices"]), [])
    check(got == cut, f"streamed with stop: {got} != {cut}")
    text = "".join(x["choices"][0]["text"] for x in chunks if x["choices"])
    check(text == c["text"], f"streamed text with stop: {text!r} != {c['text']!r}")
    check(chunks[-1]["choices"][0]["finish_reason"] == "stop", "streamed finish_reason stop")


def test_score_parity():
    """Generated log-probabilities vs `tandem score` (the training forward)."""
    worst = 0.0
    cases = [("The meaning of life is", 0.0, 0), ("A", 1.0, 3), ("Q: Why?\nA:", 0.8, 17)]
    for k, (prompt, temp, seed) in enumerate(cases):
        o = complete({"prompt": prompt, "max_tokens": 48, "temperature": temp, "seed": seed, "logprobs": 1})
        c = o["choices"][0]
        ids = list(prompt.encode()) + c["token_ids"]
        path = os.path.join(ARGS.tmp, f"seq{k}.txt")
        with open(path, "wb") as f:
            f.write(bytes(ids))
        out = os.path.join(ARGS.tmp, f"seq{k}.h5")
        T = len(ids) - 1
        subprocess.run([ARGS.tandem, "score", "--ckpt", ARGS.ckpt, "--text", path, "--seq-len", str(T),
                        "--output", out] + ARGS.score_args.split(), check=True, stdout=subprocess.DEVNULL)
        with h5py.File(out, "r") as f:
            ref = np.asarray(f["logprobs"], dtype=np.float32)[0]
        P = len(prompt.encode())
        got = np.asarray(c["logprobs"]["token_logprobs"], dtype=np.float32)
        want = ref[P - 1:]   # target j is token j + 1
        check(got.shape == want.shape, f"{got.shape} vs {want.shape}")
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        worst = max(worst, diff)
        # JSON round trip: the served number parses back to the same float32
        check(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
              f"case {k}: served log-probabilities differ from tandem score: max abs diff {diff:.3g}")
    print(f"  score parity: {len(cases)} sequences, max abs diff {worst} (bitwise equal)")


def score_ref(ids, name):
    """The training forward's log-probabilities of ids (tandem score): entry
    j is that of token j + 1."""
    path = os.path.join(ARGS.tmp, f"{name}.txt")
    with open(path, "wb") as f:
        f.write(bytes(ids))
    out = os.path.join(ARGS.tmp, f"{name}.h5")
    subprocess.run([ARGS.tandem, "score", "--ckpt", ARGS.ckpt, "--text", path, "--seq-len", str(len(ids) - 1),
                    "--output", out] + ARGS.score_args.split(), check=True, stdout=subprocess.DEVNULL)
    with h5py.File(out, "r") as f:
        return np.asarray(f["logprobs"], dtype=np.float32)[0]


def test_prefix_cache():
    """Prefix caching: a repeated prompt, the n = 4 choices of one prompt and
    a second turn that resends the first (prompt and answer) take their full
    KV blocks (16 positions) from the cache, and what they generate still has
    the log-probabilities of the training forward bit for bit."""
    def hits():
        return metrics()["tandem_prefix_cache_hit_tokens_total"]

    def same_as_score(prompt_ids, choice, what):
        ref = score_ref(prompt_ids + choice["token_ids"], "prefix")
        got = np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32)
        want = ref[len(prompt_ids) - 1:]
        check(got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)),
              f"{what}: log-probabilities with the prefix cache differ from tandem score")

    p1 = list(b"Prefix caching: the keys and values of a shared prefix are computed once, then shared by every "
              b"request that starts with it.")
    P = len(p1)
    h0 = hits()
    a = complete({"prompt": p1, "max_tokens": 40, "temperature": 0.9, "seed": 3, "logprobs": 1})["choices"][0]
    h1 = hits()
    check(h1 == h0, f"a new prompt found {h1 - h0} tokens cached")
    same_as_score(p1, a, "turn 1")
    o = complete({"prompt": p1, "n": 4, "max_tokens": 24, "temperature": 1.0, "seed": 50, "logprobs": 1})
    h2 = hits()
    full = (P - 1) // 16 * 16
    check(h2 - h1 == 4 * full, f"n=4 of a cached prompt of {P} tokens: {h2 - h1} tokens from the cache, want {4 * full}")
    for i, c in enumerate(o["choices"]):
        same_as_score(p1, c, f"n=4, choice {i}")
    # turn 2 resends turn 1's prompt and answer: the blocks its decode filled
    p2 = p1 + a["token_ids"] + list(b"\nAnd then? ")
    c = complete({"prompt": p2, "max_tokens": 32, "temperature": 0, "logprobs": 1})["choices"][0]
    h3 = hits()
    # (an answer ended by length has all but its last token fed, one ended by
    # an end-of-turn id all of them)
    fed = P + len(a["token_ids"]) - (1 if a["finish_reason"] == "length" else 0)
    want = fed // 16 * 16
    check(h3 - h2 == want, f"turn 2: {h3 - h2} tokens from the cache, want {want} (turn 1's full blocks)")
    same_as_score(p2, c, "turn 2")
    m = metrics()
    check(0 < m["tandem_prefix_cache_hit_rate"] <= 1, "tandem_prefix_cache_hit_rate in (0, 1]")
    check(m["tandem_kv_blocks_cached"] <= m["tandem_kv_blocks_free"], "cached blocks are among the free ones")
    print(f"  prefix cache: {int(h3 - h0)} prompt tokens from the cache over 6 generations, outputs bitwise equal "
          f"to tandem score; hit rate so far {m['tandem_prefix_cache_hit_rate']:.3f}")


def test_batch_invariance():
    target = {"prompt": "Batch invariance: the same bits", "max_tokens": 40, "temperature": 0.9, "seed": 77,
              "logprobs": 5}
    alone = complete(target)["choices"][0]
    others = [{"prompt": "x" * (3 + 7 * i), "max_tokens": 5 + 9 * i, "seed": i} for i in range(15)]
    results = [None] * 16
    barrier = threading.Barrier(16)

    def run(i):
        barrier.wait(timeout=60)
        results[i] = complete(target if i == 7 else others[i if i < 7 else i - 1])

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(16)]
    for t in ts:
        t.start()
    join_all(ts, 120, "16 concurrent requests")
    check(all(r is not None for r in results), "all 16 concurrent requests answered")
    busy = results[7]["choices"][0]
    check(busy["token_ids"] == alone["token_ids"], "token_ids alone vs beside 15 others")
    a = np.asarray(alone["logprobs"]["token_logprobs"], dtype=np.float32)
    b = np.asarray(busy["logprobs"]["token_logprobs"], dtype=np.float32)
    check(np.array_equal(a.view(np.uint32), b.view(np.uint32)),
          f"logprobs alone vs batched differ: max abs diff {np.max(np.abs(a - b))}")
    check(alone["logprobs"]["top_logprobs"] == busy["logprobs"]["top_logprobs"], "top_logprobs alone vs batched")
    print(f"  batch invariance: {len(a)} tokens and log-probabilities bitwise identical alone and beside 15 others")


def test_concurrent_clients():
    results = [None] * 32
    barrier = threading.Barrier(32)

    def run(i):
        barrier.wait(timeout=60)
        body = {"prompt": f"client {i}: ", "max_tokens": 8 + i % 5, "seed": i, "logprobs": i % 3}
        if i % 4 == 3:
            chunks, _ = stream(body)
            results[i] = ("stream", body, chunks)
        else:
            results[i] = ("whole", body, complete(body))

    errors = []

    def guarded(i):
        try:
            run(i)
        except Exception as e:   # reported below, with the client number
            errors.append(f"client {i}: {e}")

    ts = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(32)]
    for t in ts:
        t.start()
    join_all(ts, 120, "32 concurrent clients")
    check(not errors, "; ".join(errors[:3]))
    for kind, body, r in results:
        if kind == "whole":
            check_completion(r, 1, len(body["prompt"]), body["max_tokens"], logprobs=body["logprobs"])
        else:
            check(r[-1]["choices"][0]["finish_reason"] == "length", "streamed client finished")
            check(sum(len(c["choices"][0]["token_ids"]) for c in r) == body["max_tokens"], "streamed tokens")


BAD = [
    # (name, body, status, param)
    ("not json", b"{", 400, None),
    ("binary garbage", bytes(range(256)) * 4, 400, None),
    ("json array", b"[1, 2]", 400, None),
    ("json string", b'"prompt"', 400, None),
    ("json null", b"null", 400, None),
    ("empty body", b"", 400, None),
    ("deep nesting", b"[" * 20000 + b"]" * 20000, 400, None),
    ("deep nesting in prompt", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None),
    ("prompt missing", {"max_tokens": 3}, 400, "prompt"),
    ("prompt empty", {"prompt": ""}, 400, "prompt"),
    ("prompt number", {"prompt": 42}, 400, "prompt"),
    ("prompt object", {"prompt": {"a": 1}}, 400, "prompt"),
    ("prompt empty list", {"prompt": []}, 400, "prompt"),
    ("prompt id too big", {"prompt": [1, 256]}, 400, "prompt"),
    ("prompt id negative", {"prompt": [-1]}, 400, "prompt"),
    ("prompt id fraction", {"prompt": [1.5]}, 400, "prompt"),
    ("prompt mixed", {"prompt": [1, "a"]}, 400, "prompt"),
    ("prompt list of empty", {"prompt": ["a", ""]}, 400, "prompt"),
    ("prompt over context", {"prompt": "x" * 300}, 400, "prompt"),
    ("prompt ids over context", {"prompt": [65] * 256}, 400, "prompt"),
    ("prompt + max_tokens over context", {"prompt": "x" * 250, "max_tokens": 10}, 400, "max_tokens"),
    ("max_tokens zero", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", {"prompt": "a", "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens fraction", {"prompt": "a", "max_tokens": 1.5}, 400, "max_tokens"),
    ("max_tokens string", {"prompt": "a", "max_tokens": "10"}, 400, "max_tokens"),
    ("max_tokens huge", {"prompt": "a", "max_tokens": 10 ** 30}, 400, "max_tokens"),
    ("max_tokens inf", b'{"prompt": "a", "max_tokens": 1e999}', 400, "max_tokens"),
    ("max_tokens bool", {"prompt": "a", "max_tokens": True}, 400, "max_tokens"),
    ("temperature negative", {"prompt": "a", "temperature": -0.1}, 400, "temperature"),
    ("temperature huge", {"prompt": "a", "temperature": 1e300}, 400, "temperature"),
    ("temperature string", {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
    ("top_p zero", {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("top_p above one", {"prompt": "a", "top_p": 1.5}, 400, "top_p"),
    ("top_k negative", {"prompt": "a", "top_k": -1}, 400, "top_k"),
    ("top_k fraction", {"prompt": "a", "top_k": 2.5}, 400, "top_k"),
    ("n zero", {"prompt": "a", "n": 0}, 400, "n"),
    ("n too many", {"prompt": "a", "n": 17}, 400, "n"),
    ("n huge", {"prompt": "a", "n": 1e18}, 400, "n"),
    ("n x prompts too many", {"prompt": ["a", "b", "c"], "n": 6}, 400, "n"),
    ("logprobs too many", {"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    ("logprobs negative", {"prompt": "a", "logprobs": -1}, 400, "logprobs"),
    ("logprobs bool", {"prompt": "a", "logprobs": True}, 400, "logprobs"),
    ("stop number", {"prompt": "a", "stop": 5}, 400, "stop"),
    ("stop too many", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("stop too long", {"prompt": "a", "stop": "s" * 64}, 400, "stop"),
    ("stop list of numbers", {"prompt": "a", "stop": [1]}, 400, "stop"),
    ("seed negative", {"prompt": "a", "seed": -1}, 400, "seed"),
    ("seed fraction", {"prompt": "a", "seed": 0.5}, 400, "seed"),
    ("seed string", {"prompt": "a", "seed": "1"}, 400, "seed"),
    ("seed too big", {"prompt": "a", "seed": 2.0 ** 64}, 400, "seed"),
    ("stream string", {"prompt": "a", "stream": "yes"}, 400, "stream"),
    ("stream number", {"prompt": "a", "stream": 1}, 400, "stream"),
    ("stream_options type", {"prompt": "a", "stream_options": 3}, 400, "stream_options"),
    ("best_of > n", {"prompt": "a", "best_of": 3}, 400, "best_of"),
    ("echo", {"prompt": "a", "echo": True}, 400, "echo"),
    ("presence_penalty", {"prompt": "a", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("frequency_penalty", {"prompt": "a", "frequency_penalty": -1}, 400, "frequency_penalty"),
    ("suffix", {"prompt": "a", "suffix": "tail"}, 400, "suffix"),
    ("logit_bias", {"prompt": "a", "logit_bias": {"65": 10}}, 400, "logit_bias"),
    ("model type", {"prompt": "a", "model": 3}, 400, "model"),
    ("body over --max-body", {"prompt": "a", "pad": "p" * 70000}, 400, None),
]


def check_error(st, data, status, param, what):
    check(st == status, f"{what}: status {st}, want {status}: {data[:200]!r}")
    try:
        e = json.loads(data)["error"]
    except Exception:
        raise Fail(f"{what}: not an OpenAI error object: {data[:200]!r}")
    check(isinstance(e.get("message"), str) and e["message"], f"{what}: error message")
    check(e.get("type") == ("invalid_request_error" if status < 429 else e.get("type")), f"{what}: error type")
    check("code" in e and "param" in e, f"{what}: code and param keys")
    if param is not None:
        check(e["param"] == param, f"{what}: param {e['param']!r}, want {param!r}")


def test_bad_requests():
    for name, body, status, param in BAD:
        st, _, data = request("POST", "/v1/completions", body)
        check_error(st, data, status, param, name)
    # wrong paths and methods
    for method, path, status in (("GET", "/v1/completions", 405), ("PUT", "/v1/completions", 405),
                                 ("POST", "/health", 405), ("DELETE", "/v1/models", 405),
                                 ("GET", "/v1/chat/completions", 405), ("GET", "/tokenize", 405), ("GET", "/", 404),
                                 ("GET", "/v1/models/nope", 404), ("POST", "/nothing/here", 404)):
        st, h, data = request(method, path, {"prompt": "a"} if method == "POST" else None)
        check_error(st, data, status, None, f"{method} {path}")
        if status == 405:
            check("Allow" in h, f"{method} {path}: Allow header")
    # a declared body far beyond the limit is refused before it is read
    st, data = raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
    check(st == 400, f"huge Content-Length: status {st}")
    print(f"  bad requests: {len(BAD)} bodies and 9 paths/methods answered 4xx with an error object")


def raw_exchange(data, read=True, timeout=10):
    """Sends raw bytes; returns (status or None, response bytes)."""
    s = socket.create_connection((HOST, PORT), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):   # the server may refuse before reading it all
            pass
        if not read:
            return None, b""
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out and b"Content-Length" in out.split(b"\r\n\r\n")[0]:
                head, body = out.split(b"\r\n\r\n", 1)
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                if len(body) >= n:
                    break
        st = int(out.split(b" ")[1]) if out.startswith(b"HTTP/") else None
        return st, out
    finally:
        s.close()


def test_raw_garbage():
    # garbage instead of HTTP, then hang up
    raw_exchange(os.urandom(4096), read=False)
    # (libmicrohttpd may answer 400 or keep waiting for a request line until --idle-timeout)
    st, _ = raw_exchange(b"\x00\x01\x02 GARBAGE \xff\xfe\r\n\r\n", timeout=0.5)
    check(st in (None, 400), f"garbage request line: {st}")
    st, _ = raw_exchange(b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", timeout=2)
    check(st in (None, 400, 505), f"unknown HTTP version: {st}")
    # a header that never ends, then hang up
    raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100000, read=False)
    # a body shorter than declared, then hang up
    raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"", read=False)
    # a complete request whose client leaves before the answer
    body = json.dumps({"prompt": "bye", "max_tokens": 30}).encode()
    raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
                 read=False)
    # JSON that is not UTF-8: the prompt's bytes are its tokens (byte-level vocabulary)
    body = b'{"prompt": "\xff\xfe\xc3", "max_tokens": 3}'
    st, out = raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
    check(st == 200 and json.loads(out.split(b"\r\n\r\n", 1)[1])["usage"]["prompt_tokens"] == 3,
          f"bytes prompt: {out[:200]!r}")
    # HTTP/1.0, no Host
    st, out = raw_exchange(b"GET /health HTTP/1.0\r\n\r\n")
    check(st == 200, f"HTTP/1.0 /health: {st} {out[:100]!r}")
    # RST instead of FIN
    s = socket.create_connection((HOST, PORT), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n{\"prompt\": \"a\", ")
    s.close()


def read_response(s):
    """One HTTP response with a Content-Length from a raw socket."""
    data = b""
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            m = re.search(rb"content-length: *(\d+)", head, re.I)
            if m and len(rest) >= int(m.group(1)):
                return data
        b = s.recv(65536)
        if not b:
            return data
        data += b


def test_overload():
    """More choices than running + queue slots (16 + 48): 8 requests of 16
    long choices; the ones refused get 429 at once, the accepted ones are then
    abandoned (their clients hang up, which cancels them)."""
    body = json.dumps({"prompt": "load", "max_tokens": 250, "n": 16}).encode()
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    # All 8 requests reach the server together: it is stopped (SIGSTOP)
    # while they are sent (the kernel queues the connections), so it reads
    # them one after the other when it continues.  The 4 it can take hold
    # every slot for 250 steps, so the other 4 find no room, however the
    # test and the server are scheduled.
    os.kill(ARGS.pid, signal.SIGSTOP)
    try:
        socks = [socket.create_connection((HOST, PORT), timeout=10) for _ in range(8)]
        for s in socks:
            s.sendall(req)
    finally:
        os.kill(ARGS.pid, signal.SIGCONT)
    # refusals come at once; stop listening 0.2 s after the last answer
    answers = {}
    t0 = t_last = time.time()
    while time.time() - t0 < 5 and not (answers and time.time() - t_last > 0.2):
        ready, _, _ = select.select([s for s in socks if s not in answers], [], [], 0.05)
        for s in ready:
            answers[s] = read_response(s)
            t_last = time.time()
    for s in socks:
        s.close()
    codes = sorted(int(a.split(b" ")[1]) for a in answers.values())
    check(429 in codes and set(codes) <= {200, 429}, f"overload: answers {codes}, want some 429")
    for a in answers.values():
        if b" 429 " in a.split(b"\r\n", 1)[0]:
            head, rest = a.split(b"\r\n\r\n", 1)
            e = json.loads(rest)["error"]
            check(e["type"] == "rate_limit_error" and e["message"], "429 error object")
            check(re.search(rb"\r\nRetry-After: 1\r\n", head, re.I), f"429 without Retry-After: 1: {head!r}")
    m, dt = wait_idle("after overload")
    print(f"  overload: {codes.count(429)} of 8 requests refused with 429 at once; "
          f"the abandoned rest freed their slots in {dt:.2f} s")


def wait_cancelled(what, before, timeout=10.0):
    """Polls /metrics until more choices were cancelled than `before` and
    nothing runs, waits or holds cache blocks; returns (count, seconds)."""
    key = 'tandem_requests_total{finish_reason="cancelled"}'
    t0 = time.time()
    while True:
        m = metrics()
        idle = m["tandem_requests_running"] == 0 and m["tandem_requests_waiting"] == 0 and m["tandem_kv_blocks_used"] == 0
        if m[key] > before and idle:
            return m[key], time.time() - t0
        check(time.time() - t0 < timeout, f"{what}: after {timeout} s cancelled {m[key]} (before {before}), running "
              f"{m['tandem_requests_running']} waiting {m['tandem_requests_waiting']} kv {m['tandem_kv_blocks_used']}")
        time.sleep(0.02)


class Stopped:
    """The server stopped (SIGSTOP) inside the with-block: nothing it does
    can race the test's steps there."""

    def __enter__(self):
        os.kill(ARGS.pid, signal.SIGSTOP)

    def __exit__(self, *exc):
        os.kill(ARGS.pid, signal.SIGCONT)


def hang_up(s, finished):
    """With the server stopped: reads what it has sent so far, closes the
    socket; True when the response was still unfinished (finished(bytes)
    is False), i.e. the hang-up cancels work in flight."""
    with Stopped():
        got = b""
        s.setblocking(False)
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
        except (BlockingIOError, ConnectionResetError):
            pass
        s.close()
    return not finished(got)


def post_raw(body):
    s = socket.create_connection((HOST, PORT), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def test_disconnects():
    """Clients that hang up while their request is in flight: the choices
    are cancelled and free their slots and KV blocks.  Whether a request
    is still in flight when its client leaves is checked (the server is
    stopped while the client hangs up and the bytes received so far are
    read), not assumed: a stalled test could see a request finish first;
    then the case is tried again, up to 3 times."""
    c0 = metrics()['tandem_requests_total{finish_reason="cancelled"}']
    # a streaming client reads two events and hangs up
    body = json.dumps({"prompt": "A", "max_tokens": 255, "n": 16, "stream": True}).encode()
    for attempt in range(3):
        s = post_raw(body)
        got = b""
        while got.count(b"data: ") < 2:
            b = s.recv(4096)
            check(b, "stream closed before two events")
            got += b
        if hang_up(s, lambda rest: b"data: [DONE]" in got + rest):
            break
        wait_idle("a stream that finished before its client left")
    else:
        raise Fail("3 streams of 16 x 255 tokens finished before their client could hang up")
    c1, dt = wait_cancelled("a streaming client hung up", c0)
    # a client waiting for a whole completion hangs up once its request is
    # in the engine: B, queued behind A (16 choices each, 16 running slots),
    # so that it has all its 255 steps left when its client leaves
    a_body = json.dumps({"prompt": "A", "max_tokens": 255, "n": 16}).encode()
    b_body = json.dumps({"prompt": "B", "max_tokens": 255, "n": 16}).encode()
    for attempt in range(3):
        sa = post_raw(a_body)
        t0 = time.time()
        while metrics()["tandem_requests_running"] < 16:
            check(time.time() - t0 < 10, "request A never ran")
            time.sleep(0.005)
        sb = post_raw(b_body)
        while metrics()["tandem_requests_waiting"] < 16:
            check(time.time() - t0 < 10, "request B never reached the engine's queue")
            time.sleep(0.005)
        if hang_up(sb, lambda got: b"HTTP/1.1 200" in got):
            break
        sa.close()
        wait_idle("a request that finished before its client left")
    else:
        raise Fail("3 requests of 16 x 255 tokens finished before their client could hang up")
    # A's client stays: only B is cancelled, all 16 choices of it
    c2, dt2 = wait_cancelled("a waiting client hung up", c1)
    check(c2 - c1 == 16, f"{c2 - c1} choices cancelled after B's client left, want B's 16")
    sa.close()
    print(f"  disconnects: slots and KV blocks free {dt:.2f} s / {dt2:.2f} s after the hang-ups "
          f"({int(c2 - c0)} choices cancelled)")


def test_metrics():
    m = metrics()
    for k in ("tandem_time_to_first_token_seconds_count", "tandem_inter_token_latency_seconds_count",
              "tandem_generation_tokens_total", "tandem_prompt_tokens_total", "tandem_requests_running",
              "tandem_requests_waiting", "tandem_kv_blocks_used", "tandem_kv_blocks_free",
              "tandem_tokens_per_second", 'tandem_requests_total{finish_reason="length"}',
              "tandem_kv_blocks_cached", "tandem_prefix_cache_query_tokens_total",
              "tandem_prefix_cache_hit_tokens_total", "tandem_prefix_cache_hit_rate",
              'tandem_time_to_first_token_seconds_bucket{le="+Inf"}'):
        check(k in m, f"/metrics lacks {k}")
    check(m["tandem_time_to_first_token_seconds_count"] > 0 and m["tandem_generation_tokens_total"] > 0,
          "metrics count the work done")
    check(m['tandem_time_to_first_token_seconds_bucket{le="+Inf"}'] == m["tandem_time_to_first_token_seconds_count"],
          "+Inf bucket == count")
    check(m["tandem_kv_blocks_used"] + m["tandem_kv_blocks_free"] == m["tandem_kv_blocks_total"], "kv blocks add up")


# ------------------------------------------------------------------ chat
# Run with --chat against a server whose checkpoint holds Qwen3's tokenizer
# and a ChatML template that calls raise_exception for a "tool" message
# (tests/cli/serve_chat.sh makes one).


def chat(body, expect=200):
    st, _, data = request("POST", "/v1/chat/completions", body)
    check(st == expect, f"POST /v1/chat/completions {json.dumps(body)[:200]}: status {st}, want {expect}: {data[:300]!r}")
    return json.loads(data)


def tandem_json(*args):
    out = subprocess.run([ARGS.tandem, *args], check=True, capture_output=True).stdout
    return json.loads(out)


HI = [{"role": "user", "content": "Hello"}]

CHAT_BAD = [
    # (name, body, status, param, words the message must hold)
    ("not json", b"{", 400, None, "JSON object"),
    ("json array", b"[{\"role\": \"user\"}]", 400, None, "JSON object"),
    ("empty body", b"", 400, None, "JSON object"),
    ("deep nesting", b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None, None),
    ("messages missing", {"max_tokens": 3}, 400, "messages", "'messages' is required"),
    ("messages string", {"messages": "hi"}, 400, "messages", "non-empty array"),
    ("messages empty", {"messages": []}, 400, "messages", "non-empty array"),
    ("message a number", {"messages": [3]}, 400, "messages", "messages[0]"),
    ("role missing", {"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}, 400, "messages",
     "messages[1] has no 'role'"),
    ("role a number", {"messages": [{"role": 1, "content": "a"}]}, 400, "messages", "messages[0]"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, 400, "messages",
     "messages[0]: 'content' must be a string, null or a list of parts"),
    ("content an object", {"messages": [{"role": "user", "content": {"a": 1}}]}, 400, "messages", "messages[0]"),
    ("part without type", {"messages": [{"role": "user", "content": [{"text": "a"}]}]}, 400, "messages",
     "messages[0]"),
    ("template raises", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages",
     "chat template: tool messages are not supported by this template"),
    ("rendered over context", {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages",
     "context"),
    ("max_tokens string", {"messages": HI, "max_tokens": "9"}, 400, "max_tokens", None),
    ("max_completion_tokens zero", {"messages": HI, "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    ("temperature string", {"messages": HI, "temperature": "hot"}, 400, "temperature", None),
    ("n huge", {"messages": HI, "n": 10 ** 18}, 400, "n", None),
    ("n too many", {"messages": HI, "n": 17}, 400, "n", None),
    ("logprobs a number", {"messages": HI, "logprobs": 3}, 400, "logprobs", None),
    ("top_logprobs alone", {"messages": HI, "top_logprobs": 2}, 400, "top_logprobs", "'logprobs': true"),
    ("top_logprobs too many", {"messages": HI, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    ("stop a number", {"messages": HI, "stop": 5}, 400, "stop", None),
    ("stream a string", {"messages": HI, "stream": "yes"}, 400, "stream", None),
    ("tools an object", {"messages": HI, "tools": {"a": 1}}, 400, "tools", None),
    ("tool_choice required", {"messages": HI, "tool_choice": "required"}, 400, "tool_choice", None),
    ("response_format json", {"messages": HI, "response_format": {"type": "json_object"}}, 400, "response_format",
     None),
    ("add_generation_prompt a string", {"messages": HI, "add_generation_prompt": "no"}, 400,
     "add_generation_prompt", None),
    ("presence_penalty", {"messages": HI, "presence_penalty": 1}, 400, "presence_penalty", None),
    ("chat_template_kwargs a list", {"messages": HI, "chat_template_kwargs": [1]}, 400, "chat_template_kwargs", None),
]

TOKENIZE_BAD = [
    ("/tokenize", b"{", None, "JSON object"),
    ("/tokenize", {}, None, "one of 'prompt'"),
    ("/tokenize", {"prompt": "a", "messages": HI}, "prompt", "one of 'prompt'"),
    ("/tokenize", {"prompt": 5}, "prompt", "must be a string"),
    ("/tokenize", {"messages": [{"content": "x"}]}, "messages", "messages[0] has no 'role'"),
    ("/tokenize", {"messages": [{"role": "tool", "content": "x"}]}, "messages", "chat template: tool messages"),
    ("/tokenize", {"messages": HI, "add_special_tokens": True}, "add_special_tokens", "chat template places"),
    ("/detokenize", {"tokens": [9707, 151669]}, "tokens", "token id 151669 is out of range"),
    ("/detokenize", {"tokens": [-1]}, "tokens", "token id -1 is out of range"),
    ("/detokenize", {"tokens": [1.5]}, "tokens", "integers"),
    ("/detokenize", {"tokens": "9707"}, "tokens", "array of token ids"),
    ("/detokenize", {"tokens": [2 ** 40]}, "tokens", "integers"),
    ("/detokenize", b"[", None, "JSON object"),
]


def still_serving(what):
    st, _, _ = request("GET", "/health")
    check(st == 200, f"/health after {what}: {st}")
    o = chat({"messages": HI, "max_tokens": 1})
    check(len(o["choices"]) == 1, f"a chat completion after {what}")


def test_chat_bad_requests():
    for name, body, status, param, words in CHAT_BAD:
        st, _, data = request("POST", "/v1/chat/completions", body)
        check_error(st, data, status, param, "chat: " + name)
        if words:
            msg = json.loads(data)["error"]["message"]
            check(words in msg, f"chat: {name}: message {msg!r} lacks {words!r}")
        still_serving("chat: " + name)
    for path, body, param, words in TOKENIZE_BAD:
        st, _, data = request("POST", path, body)
        check_error(st, data, 400, param, f"{path} {str(body)[:60]}")
        msg = json.loads(data)["error"]["message"]
        check(words in msg, f"{path} {str(body)[:60]}: message {msg!r} lacks {words!r}")
        still_serving(path)
    print(f"  chat bad requests: {len(CHAT_BAD)} chat bodies and {len(TOKENIZE_BAD)} tokenize/detokenize bodies "
          f"answered 400 naming the problem; the server served after each")


def test_tokenize_endpoints():
    """/tokenize and /detokenize give `tandem tokenize`'s ids and text."""
    text = "Hello, world! Grüße 世界 🙂 <|im_end|>"
    st, _, data = request("POST", "/tokenize", {"prompt": text})
    got = json.loads(data)
    want = tandem_json("tokenize", "--tokenizer", ARGS.ckpt, "--text", text)["ids"]
    check(st == 200 and got["tokens"] == want and got["count"] == len(want), f"/tokenize prompt: {got} vs {want}")
    check(got["max_model_len"] == CONTEXT, "/tokenize max_model_len")
    st, _, data = request("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
    want_p = tandem_json("tokenize", "--tokenizer", ARGS.ckpt, "--text", text, "--no-special")["ids"]
    check(json.loads(data)["tokens"] == want_p, "/tokenize add_special_tokens false")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    path = os.path.join(ARGS.tmp, "msgs.json")
    with open(path, "w") as f:
        json.dump(msgs, f)
    for agp in (True, False):
        st, _, data = request("POST", "/tokenize", {"messages": msgs, "add_generation_prompt": agp})
        flag = ["--add-generation-prompt"] if agp else []
        want_c = tandem_json("tokenize", "--tokenizer", ARGS.ckpt, "--chat", path, *flag)["ids"]
        check(st == 200 and json.loads(data)["tokens"] == want_c, f"/tokenize messages (generation prompt {agp})")
    st, _, data = request("POST", "/detokenize", {"tokens": want})
    dec = tandem_json("tokenize", "--tokenizer", ARGS.ckpt, "--decode", "--ids", ",".join(map(str, want)))["text"]
    check(st == 200 and json.loads(data)["prompt"] == dec == text, f"/detokenize: {data!r}")
    # a chat's prompt is the rendered messages: usage.prompt_tokens counts them
    o = chat({"messages": msgs, "max_tokens": 2})
    st, _, data = request("POST", "/tokenize", {"messages": msgs})
    n_chat = json.loads(data)["count"]
    check(o["usage"]["prompt_tokens"] == n_chat, f"chat usage.prompt_tokens {o['usage']['prompt_tokens']} != {n_chat}")
    # completions encode a string prompt with the tokenizer (special tokens as HF adds them)
    o = complete({"prompt": text, "max_tokens": 3, "logprobs": 1, "seed": 1})
    c = o["choices"][0]
    check(o["usage"]["prompt_tokens"] == len(want), "completions: prompt tokens of the tokenizer")
    dec = tandem_json("tokenize", "--tokenizer", ARGS.ckpt, "--decode", "--skip-special", "--ids",
                      ",".join(map(str, c["token_ids"])))["text"]
    check(c["text"] == dec, f"completion text {c['text']!r} != decode {dec!r}")
    print(f"  tokenize: {len(want)} ids of the prompt, {len(want_c)} of the chat, equal to tandem tokenize")


def main():
    global ARGS, HOST, PORT
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", default="", help="comma-separated test names to run (default: all)")
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (SIGSTOP/SIGCONT)")
    ap.add_argument("--chat", action="store_true",
                    help="the chat tests: the server's checkpoint holds Qwen3's tokenizer and a raising template")
    ap.add_argument("--score-args", default="", help="extra arguments of tandem score (the server's --dtype ...)")
    ARGS = ap.parse_args()
    u = urllib.parse.urlparse(ARGS.url)
    HOST, PORT = u.hostname, u.port
    tests = [test_health_models, test_completion_shape, test_greedy_and_seeds, test_stream, test_stop,
             test_score_parity, test_prefix_cache, test_batch_invariance, test_concurrent_clients, test_bad_requests,
             test_raw_garbage, test_overload, test_disconnects, test_metrics]
    if ARGS.chat:
        tests = [test_tokenize_endpoints, test_chat_bad_requests, test_metrics]
    if ARGS.only:
        names = ARGS.only.split(",")
        unknown = set(names) - {t.__name__ for t in tests}
        if unknown:
            print(f"FAIL --only: no such test {sorted(unknown)}")
            return 1
        tests = [t for t in tests if t.__name__ in names]
    for t in tests:
        t0 = time.time()
        try:
            t()
            # the server still serves after every test
            st, _, _ = request("GET", "/health")
            check(st == 200, f"/health after {t.__name__}: {st}")
            complete({"prompt": "still there?", "max_tokens": 2})
        except (Fail, OSError, ValueError, KeyError, TypeError, subprocess.CalledProcessError) as e:
            print(f"FAIL {t.__name__}: {type(e).__name__}: {e}")
            return 1
        print(f"ok   {t.__name__} ({time.time() - t0:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""bench/serve_load.py - throughput of an OpenAI-compatible completions server
under concurrent clients (bench/infer.sh runs it against `tandem serve`).

    serve_load.py --port P [--host 127.0.0.1] [--clients 16] [--requests 1]
                  [--prompt 256] [--max-tokens 128] [--vocab 256]

Each client is a thread with its own keep-alive http.client connection
that sends --requests completions one after another: a prompt of --prompt
token ids (client j: id i = (37 i + 11 + 7 j) mod --vocab, as bench/infer.c
and bench/torch_decode.py), "max_tokens": --max-tokens, greedy
("temperature": 0), not streamed.  The clients start together (a barrier)
after a warm-up round (every client once, 8 tokens).  Throughput = all
completion tokens (usage.completion_tokens) / wall time from the start to
the last answer, prefill included; also per-request latency percentiles.
Prints one JSON line {"bench":"serve", ...}; exit 1 if any request failed.
"""
import argparse
import http.client
import json
import sys
import threading
import time


def prompt_ids(n, vocab, j):
    return [(i * 37 + 11 + 7 * j) % vocab for i in range(n)]


def request(conn, body):
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, data[:200]))
    return json.loads(data)


def round_of(a, max_tokens, requests):
    """All clients, requests each; returns (wall, tokens, latencies, errors)."""
    barrier = threading.Barrier(a.clients + 1)
    lock = threading.Lock()
    res = {"tokens": 0, "lat": [], "errors": []}

    def client(j):
        conn = http.client.HTTPConnection(a.host, a.port, timeout=a.timeout)
        body = {"prompt": prompt_ids(a.prompt, a.vocab, j), "max_tokens": max_tokens, "temperature": 0}
        barrier.wait()
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                out = request(conn, body)
                n = int(out["usage"]["completion_tokens"])
            except Exception as e:  # noqa: BLE001 - reported, counted as a failure
                with lock:
                    res["errors"].append(str(e))
                conn.close()
                conn = http.client.HTTPConnection(a.host, a.port, timeout=a.timeout)
                continue
            dt = time.perf_counter() - t0
            with lock:
                res["tokens"] += n
                res["lat"].append(dt)
        conn.close()

    ts = [threading.Thread(target=client, args=(j,), daemon=True) for j in range(a.clients)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, res


def pct(v, q):
    if not v:
        return 0.0
    return v[min(int(q / 100.0 * len(v)), len(v) - 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    _, warm = round_of(a, 8, 1)
    wall, res = round_of(a, a.max_tokens, a.requests)
    lat = sorted(res["lat"])
    out = {"bench": "serve", "clients": a.clients, "requests": a.clients * a.requests, "prompt": a.prompt,
           "max_tokens": a.max_tokens, "completion_tokens": res["tokens"], "wall_s": round(wall, 3),
           "tok_s": round(res["tokens"] / wall, 1) if wall > 0 else 0,
           "latency_s_p50_p90_max": [round(pct(lat, 50), 3), round(pct(lat, 90), 3), round(lat[-1], 3) if lat else 0],
           "errors": len(res["errors"]) + len(warm["errors"])}
    if res["errors"] or warm["errors"]:
        out["first_error"] = (warm["errors"] + res["errors"])[0]
    print(json.dumps(out), flush=True)
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

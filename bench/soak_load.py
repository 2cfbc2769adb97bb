#!/usr/bin/python3
"""bench/soak_load.py - a long-running mixed load against `tandem serve`
(bench/soak.sh runs it for 10 minutes, tests/cli/soak.sh for a short while).

    soak_load.py --port P --pid PID --duration S [--clients 32] [--warmup S]
                 [--window S] [--vocab 256] [--context 1024]
                 [--admin-token T --reload FILE] [--seed 1] [--check [--check-drift]]
                 [--max-rss-growth 0.01] [--scrape-log FILE [--scrape-every 1]]

--clients threads, each with its own seeded random stream, send requests
back to back until --duration seconds have passed.  Each request is one of
(prompt lengths as fractions of --context, C)
  short     a 10 - 0.06 C token prompt, 4-16 greedy tokens, not streamed
  long      a 0.3 C - 0.65 C token prompt, 8-24 greedy tokens, streamed
  group     a 0.1 C - 0.3 C token prompt, n = 4 seeded samples (temperature 1)
  cancel    a 0.2 C - 0.45 C token prompt, streamed, the connection closed
            after the first token arrives (the server must free its blocks)
  agent     the client's conversation: the whole history resent, a new
            0.02 C - 0.06 C token user turn, 8-16 greedy tokens; it starts
            over when the next turn would not fit C
  probe     one of 4 fixed prompts, greedy: every answer for the same prompt
            and the same weights_step must be the same tokens (the bits do
            not depend on the batch around them, whatever the load)
With --reload FILE, POST /v1/admin/reload switches to FILE at half time.
The server's resident memory (VmRSS of --pid) is read every second.
With --scrape-log FILE, GET /metrics is scraped every --scrape-every
seconds into FILE, each scrape after a line "# scrape <unix time>" (what
`tandem plot --serve FILE` draws); the last scrape is taken once the
clients are done and the server has nothing running or waiting (30 s at
most).  The JSON line then also holds "sent": what the clients sent and
saw (choices, prompt tokens, usage, cancellations), for a test to hold the
server's histograms and counters against.

Prints a table per --window seconds (requests, p50 / p99 latency, errors)
and one JSON line {"bench":"soak", ...} with rss_growth (peak RSS of the
last window over the peak until the end of --warmup, minus one), errors,
probe mismatches and the prefix-cache hit rate from /metrics, and the
server's CPU time per request per window (from /proc: apart from how busy
the rest of the machine is).  --check exits 1 unless errors == 0,
mismatches == 0, the reload (if asked) gave 200 and rss_growth <=
--max-rss-growth (0.01); --check-drift (benchmarks only: it is a timing
figure) also wants the last window's p99 within 3x the first's.
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

A = None
LOCK = threading.Lock()
RESULTS = []        # (t_done, kind, latency_s, ok)
ERRORS = []         # first lines of what went wrong
PROBES = {}         # (probe id, weights_step) -> tokens
MISMATCH = []
RSS = []            # (t, bytes)
CPU = []            # (t, server CPU seconds so far)
RELOAD = {}
# per request: kind, choices, prompt tokens per choice, usage.prompt_tokens
# (None when not reported), completion tokens seen per choice, finish
# reasons seen (None for a cancelled one)
SENT = []


def post(path, body, timeout=300, headers=None):
    c = http.client.HTTPConnection(A.host, A.port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=json.dumps(body), headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def L(frac):
    """a prompt length: frac of the context (at least 4 tokens)."""
    return max(4, int(frac * A.context))


def ids(rng, n):
    return [rng.randrange(1, A.vocab) for _ in range(n)]


def complete(body):
    st, data = post("/v1/completions", body)
    if st != 200:
        raise RuntimeError(f"status {st}: {data[:200]!r}")
    return json.loads(data)


def record(kind, n, prompt, usage_prompt, completion, finish):
    with LOCK:
        SENT.append(dict(kind=kind, n=n, prompt=prompt, usage_prompt=usage_prompt, completion=completion,
                         finish=finish))


def record_o(kind, body, o):
    record(kind, len(o["choices"]), len(body["prompt"]), o["usage"]["prompt_tokens"],
           o["usage"]["completion_tokens"], [c["finish_reason"] for c in o["choices"]])


def stream(body, cancel_after_first=False):
    c = http.client.HTTPConnection(A.host, A.port, timeout=300)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        data = r.read()
        c.close()
        raise RuntimeError(f"status {r.status}: {data[:200]!r}")
    got, finish = 0, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            c.close()
            raise RuntimeError(f"stream error: {str(ev['error'])[:200]}")
        for ch in ev.get("choices", []):
            got += len(ch.get("token_ids") or [])
            finish = ch.get("finish_reason") or finish
        if cancel_after_first and got:
            c.close()
            record("cancel", 1, len(body["prompt"]), None, got, None)
            return got
    c.close()
    record("long" if not cancel_after_first else "cancel", 1, len(body["prompt"]), None, got,
           [finish] if finish else None)
    return got


def probe_prompt(k):
    return [(i * (7 + 2 * k) + 3 * k + 1) % (A.vocab - 1) + 1 for i in range(L(0.25) + L(0.1) * k)]


def one(rng, conv):
    kind = rng.choices(["short", "long", "group", "cancel", "agent", "probe"], [4, 2, 1, 1, 3, 1])[0]
    if kind == "short":
        b = {"prompt": ids(rng, rng.randint(10, L(0.06))), "max_tokens": rng.randint(4, 16), "temperature": 0}
        record_o(kind, b, complete(b))
    elif kind == "long":
        stream({"prompt": ids(rng, rng.randint(L(0.3), L(0.65))), "max_tokens": rng.randint(8, 24), "temperature": 0})
    elif kind == "group":
        b = {"prompt": ids(rng, rng.randint(L(0.1), L(0.3))), "max_tokens": 8, "n": 4, "temperature": 1,
             "seed": rng.randrange(1 << 30)}
        o = complete(b)
        record_o(kind, b, o)
        if len(o["choices"]) != 4:
            raise RuntimeError(f"group: {len(o['choices'])} choices, want 4")
    elif kind == "cancel":
        stream({"prompt": ids(rng, rng.randint(L(0.2), L(0.45))), "max_tokens": 64, "temperature": 0},
               cancel_after_first=True)
    elif kind == "agent":
        turn = ids(rng, rng.randint(L(0.02), L(0.06)))
        if len(conv) + len(turn) + 16 > A.context:
            conv.clear()
        conv.extend(turn)
        b = {"prompt": list(conv), "max_tokens": rng.randint(8, 16), "temperature": 0}
        o = complete(b)
        record_o(kind, b, o)
        conv.extend(o["choices"][0]["token_ids"])
    else:
        k = rng.randrange(4)
        b = {"prompt": probe_prompt(k), "max_tokens": 12, "temperature": 0}
        o = complete(b)
        record_o(kind, b, o)
        ch = o["choices"][0]
        key = (k, ch.get("weights_step"))
        with LOCK:
            want = PROBES.setdefault(key, ch["token_ids"])
            if want != ch["token_ids"]:
                MISMATCH.append(f"probe {k} at weights_step {key[1]}: {ch['token_ids']} != {want}")
    return kind


def client(i, t0):
    rng = random.Random(A.seed * 1000 + i)
    conv = []
    while time.monotonic() - t0 < A.duration:
        ts = time.monotonic()
        kind, ok = "?", True
        try:
            kind = one(rng, conv)
        except Exception as e:   # noqa: BLE001 - every failure is counted and named
            ok = False
            with LOCK:
                ERRORS.append(f"client {i}: {type(e).__name__}: {str(e)[:200]}")
        with LOCK:
            RESULTS.append((time.monotonic() - t0, kind, time.monotonic() - ts, ok))


def rss_bytes():
    with open(f"/proc/{A.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds():
    """user + system CPU seconds the server has used."""
    with open(f"/proc/{A.pid}/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")


def sampler(t0, stop):
    while not stop.is_set():
        try:
            RSS.append((time.monotonic() - t0, rss_bytes()))
            CPU.append((time.monotonic() - t0, cpu_seconds()))
        except OSError:
            with LOCK:
                ERRORS.append(f"the server (pid {A.pid}) is gone")
            return
        stop.wait(1.0)


def reloader(t0):
    time.sleep(A.duration / 2)
    t = time.monotonic()
    try:
        st, data = post("/v1/admin/reload", {"checkpoint": A.reload}, timeout=600,
                        headers={"Authorization": f"Bearer {A.admin_token}"})
    except Exception as e:  # noqa: BLE001
        st, data = 0, str(e).encode()
    RELOAD.update(status=st, at_s=round(t - t0, 1), took_s=round(time.monotonic() - t, 3))
    if st != 200:
        with LOCK:
            ERRORS.append(f"reload: status {st}: {data[:200]!r}")


def get_metrics():
    c = http.client.HTTPConnection(A.host, A.port, timeout=30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"/metrics: status {r.status}")
    return text


def scrape(f):
    """one scrape into the log: one write, so that a reader sees whole lines"""
    t = time.time()
    text = get_metrics()
    f.write(f"# scrape {t:.3f}\n{text}" + ("" if text.endswith("\n") else "\n"))
    f.flush()
    return text


def scraper(f, stop):
    while not stop.wait(A.scrape_every):
        try:
            scrape(f)
        except Exception as e:  # noqa: BLE001
            with LOCK:
                ERRORS.append(f"scrape: {type(e).__name__}: {str(e)[:200]}")
            return


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0.0


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--admin-token")
    ap.add_argument("--reload")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-drift", action="store_true")
    ap.add_argument("--max-rss-growth", type=float, default=0.01)
    ap.add_argument("--scrape-log")
    ap.add_argument("--scrape-every", type=float, default=1.0)
    A = ap.parse_args()
    if A.warmup is None:
        A.warmup = A.duration / 5
    t0 = time.monotonic()
    stop = threading.Event()
    th = [threading.Thread(target=client, args=(i, t0)) for i in range(A.clients)]
    sm = threading.Thread(target=sampler, args=(t0, stop))
    sm.start()
    slog, sc_stop, sc = None, threading.Event(), None
    if A.scrape_log:
        slog = open(A.scrape_log, "w")
        scrape(slog)
        sc = threading.Thread(target=scraper, args=(slog, sc_stop))
        sc.start()
    if A.reload:
        th.append(threading.Thread(target=reloader, args=(t0,)))
    for t in th:
        t.start()
    for t in th:
        t.join(A.duration + 900)
        if t.is_alive():
            print(f"soak: a client still waits {A.duration + 900:.0f} s after the start", file=sys.stderr)
            sys.exit(1)
    stop.set()
    sm.join(10)
    if slog:
        sc_stop.set()
        sc.join(60)
        # the last scrape: after the server has ended every choice (a
        # cancelled stream ends at its next engine step)
        t_end = time.monotonic() + 30
        while True:
            mtext = get_metrics()
            idle = metric(mtext, "tandem_requests_running") == 0 and metric(mtext, "tandem_requests_waiting") == 0
            if idle or time.monotonic() > t_end:
                break
            time.sleep(0.1)
        if not idle:
            ERRORS.append("the server still runs or queues choices 30 s after the clients ended")
        scrape(slog)
        slog.close()
    mtext = get_metrics()

    n_win = max(1, int(-(-A.duration // A.window)))
    rows = []
    print(f"{'window':>12s} {'requests':>9s} {'p50 ms':>9s} {'p99 ms':>9s} {'errors':>7s} {'peak RSS MB':>12s} "
          f"{'CPU ms/req':>11s}")
    for w in range(n_win):
        lo, hi = w * A.window, (w + 1) * A.window
        lat = [r[2] for r in RESULTS if lo <= r[0] < hi and r[3]]
        err = sum(1 for r in RESULTS if lo <= r[0] < hi and not r[3])
        rss = max((b for t, b in RSS if lo <= t < hi), default=0)
        # the server's CPU time per request: what the load costs it, apart
        # from how busy the rest of the machine is
        cw = [c for t, c in CPU if lo <= t < hi]
        cpu_req = (cw[-1] - cw[0]) / max(1, len(lat) + err) if len(cw) > 1 else 0.0
        rows.append(dict(window_s=[lo, hi], requests=len(lat) + err, p50_s=pct(lat, 0.5), p99_s=pct(lat, 0.99),
                         errors=err, peak_rss_bytes=rss, cpu_s_per_request=cpu_req))
        print(f"{lo:5.0f}-{hi:5.0f} s {len(lat) + err:9d} {1000 * pct(lat, 0.5):9.1f} {1000 * pct(lat, 0.99):9.1f} "
              f"{err:7d} {rss / 2**20:12.1f} {1000 * cpu_req:11.2f}")
    base = max((b for t, b in RSS if t <= A.warmup), default=0)
    last = max((b for t, b in RSS if t >= A.duration - A.window), default=0)
    growth = last / base - 1 if base else 0.0
    kinds = {}
    for r in RESULTS:
        kinds[r[1]] = kinds.get(r[1], 0) + 1
    out = dict(bench="soak", duration_s=A.duration, clients=A.clients, requests=len(RESULTS), kinds=kinds,
               errors=len(ERRORS), probe_mismatches=len(MISMATCH), windows=rows,
               rss_warmup_peak_bytes=base, rss_last_window_peak_bytes=last, rss_growth=round(growth, 5),
               prefix_cache_hit_rate=metric(mtext, "tandem_prefix_cache_hit_rate"),
               probes_seen=len(PROBES), reload=RELOAD or None)
    if A.scrape_log:
        out["sent"] = SENT
    print(json.dumps(out))
    for e in (ERRORS + MISMATCH)[:10]:
        print("soak:", e, file=sys.stderr)
    if A.check:
        bad = []
        if ERRORS:
            bad.append(f"{len(ERRORS)} errors")
        if MISMATCH:
            bad.append(f"{len(MISMATCH)} probe answers differ under load")
        if A.reload and RELOAD.get("status") != 200:
            bad.append("the reload failed")
        first, last_w = rows[0], rows[-1]
        if A.check_drift and len(rows) > 1 and last_w["requests"] and first["p99_s"] and \
                last_w["p99_s"] > 3 * first["p99_s"]:
            bad.append(f"p99 drifted: the last window's {last_w['p99_s']:.3f} s is over 3x the first's "
                       f"{first['p99_s']:.3f} s")
        if growth > A.max_rss_growth:
            bad.append(f"resident memory grew {100 * growth:.2f}% after warm-up (limit {100 * A.max_rss_growth:g}%)")
        if bad:
            print("soak: FAIL: " + "; ".join(bad), file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()

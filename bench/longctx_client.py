#!/usr/bin/python3
"""bench/longctx_client.py - one long prompt against `tandem serve`, for
bench/longctx.sh: streams a completion of --gen tokens for a prompt of --len
token ids (token i = (37 i + 11) mod 256, c_peer's prompt) and prints one
JSON line: the time to the first token (submission to the first streamed
token), the decode rate after it ((n - 1) / (t_last - t_first)), and the
server's peak RSS (VmHWM of --pid) after the request.  Standard library
only."""
import argparse
import http.client
import json
import sys
import time


def vm_hwm_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--len", type=int, required=True)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=3600)
    a = ap.parse_args()
    prompt = [(37 * i + 11) % a.vocab for i in range(a.len)]
    body = json.dumps({"prompt": prompt, "max_tokens": a.gen, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=a.timeout)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        print(json.dumps({"len": a.len, "status": r.status, "error": r.read().decode(errors="replace")}))
        return 1
    times, ids = [], []
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                for ch in d.get("choices", []):
                    n = len(ch.get("token_ids") or [])
                    if n:
                        now = time.monotonic()
                        times.extend([now] * n)
                        ids.extend(ch["token_ids"])
    if not times:
        print(json.dumps({"len": a.len, "error": "no token streamed"}))
        return 1
    ttft = times[0] - t0
    dec = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
    print(json.dumps({"len": a.len, "ttft_s": ttft, "gen": len(ids), "decode_tok_s": dec,
                      "rss_peak_mib": vm_hwm_kib(a.pid) / 1024.0, "first_ids": ids[:8]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

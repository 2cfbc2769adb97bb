#!/usr/bin/python3
"""tests/ref/serve_reload.py - hot weight reload of `tandem serve`.

Run by tests/cli/serve.sh against a server started with --follow DIR
--admin-token TOKEN, DIR holding step 10 of the tiny model:

  serve_reload.py --url URL --tandem bin/tandem --dir DIR --token TOKEN --train "CMD"

CMD resumes the run to step 20 (DIR/latest moves).  Checks: every choice
names its weights_step and its log-probabilities are those of `tandem score`
on that step's checkpoint, bit for bit (so a request never mixes weights,
and the prefix cache of the old weights is not used after a swap), for a
prompt served before and after each swap and for long requests in flight
while latest moves; --follow switches to step 20 (bounded wait); POST
/v1/admin/reload without or with a wrong token is 401, a bad body 400, a
missing file 400 with the old weights still served, the right token and
step 10's file 200; /metrics counts the reloads and their pause.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import h5py
import numpy as np

A = None
HOST = PORT = None


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def request(method, path, body=None, headers=None, timeout=120):
    c = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def complete(body):
    st, data = request("POST", "/v1/completions", body)
    check(st == 200, f"completion: status {st}: {data[:300]!r}")
    return json.loads(data)


def reload(body, token):
    h = {"Authorization": f"Bearer {token}"} if token is not None else {}
    st, data = request("POST", "/v1/admin/reload", body, h, timeout=700)
    return st, json.loads(data)


def metrics():
    st, data = request("GET", "/metrics")
    check(st == 200, "GET /metrics")
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def ckpt(step):
    return os.path.join(A.dir, f"step_{step:08d}.h5")


N_SCORED = [0]


def same_as_score(prompt_ids, choice, what):
    """choice's log-probabilities == tandem score on the checkpoint of its weights_step."""
    step = choice["weights_step"]
    check(os.path.exists(ckpt(step)), f"{what}: weights_step {step} names no checkpoint in {A.dir}")
    ids = prompt_ids + choice["token_ids"]
    N_SCORED[0] += 1
    txt = os.path.join(A.tmp, f"reload{N_SCORED[0]}.txt")
    out = os.path.join(A.tmp, f"reload{N_SCORED[0]}.h5")
    with open(txt, "wb") as f:
        f.write(bytes(ids))
    subprocess.run([A.tandem, "score", "--ckpt", ckpt(step), "--text", txt, "--seq-len", str(len(ids) - 1),
                    "--output", out], check=True, stdout=subprocess.DEVNULL, timeout=120)
    with h5py.File(out, "r") as f:
        ref = np.asarray(f["logprobs"], dtype=np.float32)[0][len(prompt_ids) - 1:]
    got = np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32)
    check(got.shape == ref.shape and np.array_equal(got.view(np.uint32), ref.view(np.uint32)),
          f"{what}: log-probabilities differ from tandem score on step {step}'s checkpoint")


P = list(b"Hot reload: the same prompt before and after every swap of the weights, long enough for blocks.")


def probe(want_step, what):
    o = complete({"prompt": P, "max_tokens": 16, "temperature": 0, "logprobs": 1})["choices"][0]
    check(o["weights_step"] == want_step, f"{what}: weights_step {o['weights_step']}, want {want_step}")
    same_as_score(P, o, what)
    return o


def main():
    global A, HOST, PORT
    ap = argparse.ArgumentParser()
    for k in ("--url", "--tandem", "--dir", "--token", "--train", "--tmp"):
        ap.add_argument(k, required=True)
    A = ap.parse_args()
    u = urllib.parse.urlparse(A.url)
    HOST, PORT = u.hostname, u.port
    try:
        probe(10, "before any reload")
        probe(10, "again (its blocks now cached)")
        # long requests in flight while latest moves
        results = []
        lp = list(b"In flight: ")

        def long_one(seed):
            results.append(complete({"prompt": lp, "max_tokens": 200, "n": 2, "temperature": 1.0, "seed": seed,
                                     "logprobs": 1}))

        ts = [threading.Thread(target=long_one, args=(s,), daemon=True) for s in (1, 2)]
        ts[0].start()
        subprocess.run(A.train, shell=True, check=True, timeout=300)
        ts[1].start()
        for t in ts:
            t.join(120)
        check(len(results) == 2, "the requests in flight while latest moved did not all answer within 120 s")
        for k, r in enumerate(results):
            for c in r["choices"]:
                same_as_score(lp, c, f"in-flight request {k}, choice {c['index']}")
        steps = sorted({c["weights_step"] for r in results for c in r["choices"]})
        # --follow: step 20 is served within a bounded time
        t0 = time.time()
        while complete({"prompt": [65], "max_tokens": 1})["choices"][0]["weights_step"] != 20:
            check(time.time() - t0 < 60, "--follow: still not serving step 20 60 s after latest moved to it")
            time.sleep(0.1)
        probe(20, "after --follow switched to step 20 (the old weights' cached blocks dropped)")
        # the admin endpoint
        st, e = reload({"checkpoint": ckpt(10)}, None)
        check(st == 401, f"reload without a token: {st}")
        st, e = reload({"checkpoint": ckpt(10)}, A.token + "x")
        check(st == 401, f"reload with a wrong token: {st}")
        st, e = reload(b"{not json", A.token)
        check(st == 400 and "checkpoint" in e["error"]["message"], f"reload with a bad body: {st} {e}")
        st, e = reload({"checkpoint": os.path.join(A.dir, "missing.h5")}, A.token)
        check(st == 400 and "missing.h5" in e["error"]["message"], f"reload of a missing file: {st} {e}")
        probe(20, "after a failed reload (still the old weights)")
        st, e = reload({"checkpoint": ckpt(10)}, A.token)
        check(st == 200 and e["weights_step"] == 10 and e["pause_seconds"] >= 0, f"reload of step 10: {st} {e}")
        probe(10, "after POST /v1/admin/reload to step 10")
        m = metrics()
        check(m['tandem_weight_reloads_total{result="ok"}'] == 2, "reloads ok: want 2 (follow, admin)")
        check(m['tandem_weight_reloads_total{result="failed"}'] == 1, "reloads failed: want 1")
        check(m["tandem_weights_step"] == 10, f"tandem_weights_step {m['tandem_weights_step']}")
        check(m["tandem_weight_reload_pause_seconds_sum"] > 0, "no reload pause measured")
        print(f"ok   reload: --follow 10 -> 20, admin 20 -> 10, a failed reload kept 20; in-flight requests ran on "
              f"steps {steps}; every choice == tandem score of its weights_step; last pause "
              f"{1000 * m['tandem_weight_reload_pause_seconds']:.1f} ms")
    except (Fail, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        print(f"FAIL serve_reload: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

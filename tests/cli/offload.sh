#!/bin/sh
# tests/cli/offload.sh - expert offload (--expert-cache-mb, SPEC 14,
# docs/serving.md "Expert offload"): with the routed experts in a cache of
# two slots per layer (one token's top-2: every step evicts), generate
# (f32, bf16, int8; greedy and sampled), score and serve give the bits of
# the fully resident model, from a tandem checkpoint and from an HF
# safetensors directory; the cache's slots stay within the budget and its
# counters add up (misses * expert bytes = bytes loaded); a budget below
# one token's experts is refused with one line naming both numbers; a
# corrupt expert chunk read while serving ends that request with "error"
# and the server stays up, counting the failure in /metrics.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
need curl || exit 1
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tandem-offload.XXXXXX")
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
    echo "offload: FAIL: $*"
    [ -s "$TMP/serve.log" ] && { echo "--- server log (last 30 lines)"; tail -n 30 "$TMP/serve.log"; }
    exit 1
}
ok() { echo "ok   $*"; }
. tests/serve_lib.sh

test -s "$BUILD/fortunes.bin" ||
    "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$BUILD/fortunes.bin" >/dev/null
# 3 MoE layers of 8 experts, top-2; one expert packed in f32 is 48 KiB, so
# 0.3 MiB is 2 slots per layer (0.28 MiB) and 0.25 MiB is below that
M='model={"vocab_size":256,"hidden_size":64,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"moe_intermediate_size":64,"intermediate_size":100,"num_local_experts":8,"num_experts_per_tok":2,"max_position_embeddings":256}'
bounded 120 "$TANDEM" train configs/tiny.json data="$BUILD/fortunes.bin" steps=10 out_dir="$TMP/run" "$M" \
    >"$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; fail "training the tiny MoE"; }
bounded 60 "$TANDEM" ckpt export "$TMP/run" "$TMP/hf" --format hf >/dev/null 2>"$TMP/err" || { cat "$TMP/err"; fail "export to HF"; }

# same JSON but for timings and the cache's own report
same() {
    $PY - "$1" "$2" <<'PY' || fail "$3: outputs differ"
import json, sys
a, b = (json.loads(open(p).read()) for p in sys.argv[1:3])
for o in (a, b):
    for k in ("ttft_ms", "tokens_per_s", "expert_cache"):
        o.pop(k, None)
assert a == b, (a, b)
assert len(a["ids"]) == 24
PY
}
# the cache's counters: within the budget, evictions every step, bytes = misses * expert
counters() {
    $PY - "$1" "$2" "$3" <<'PY' || fail "$4: cache counters"
import json, sys
o = json.loads(open(sys.argv[1]).read())
c, mb, expert = o["expert_cache"], float(sys.argv[2]), int(sys.argv[3])
assert c["bytes"] <= mb * 2**20 and c["bytes"] == c["slots_per_layer"] * 3 * expert, c
assert c["misses"] - c["slots_per_layer"] * 3 >= len(o["ids"]), c   # evictions, at least one a step
assert c["bytes_loaded"] == c["misses"] * expert, c
assert c["hits"] + c["misses"] >= 3 * 2 * len(o["ids"]), c         # every layer looks up k experts a token
print("   %s: %d slots/layer, %d hits, %d misses, %d bytes loaded" % (sys.argv[1].split("/")[-1], c["slots_per_layer"], c["hits"], c["misses"], c["bytes_loaded"]))
PY
}
P="It was a dark and stormy night; the"
# the HF directory: f32 and int8, sampled (the loader is what differs); bf16 sampled
for ck in run hf; do
    dts="f32 bf16 int8" samps="greedy sampled"
    [ $ck = run ] || dts="f32 int8" samps="sampled"
    for dt in $dts; do
        [ $dt != bf16 ] || samps="sampled"
        case $dt in f32) xb=49152 mb=0.3 ;; bf16) xb=24576 mb=0.15 ;; int8) xb=13056 mb=0.09 ;; esac
        for sm in $samps; do
            samp="--temperature 0"
            [ $sm = greedy ] || samp="--temperature 1 --seed 7"
            # shellcheck disable=SC2086
            bounded 60 "$TANDEM" generate --ckpt "$TMP/$ck" --prompt "$P" --max-tokens 24 --ignore-eos $samp --dtype $dt \
                --json >"$TMP/res.json" 2>"$TMP/err" || { cat "$TMP/err"; fail "generate $ck $dt resident"; }
            # shellcheck disable=SC2086
            bounded 60 "$TANDEM" generate --ckpt "$TMP/$ck" --prompt "$P" --max-tokens 24 --ignore-eos $samp --dtype $dt \
                --json --expert-cache-mb $mb >"$TMP/off.json" 2>"$TMP/err" || { cat "$TMP/err"; fail "generate $ck $dt offloaded"; }
            same "$TMP/res.json" "$TMP/off.json" "generate $ck $dt $samp"
            counters "$TMP/off.json" $mb $xb "generate $ck $dt"
        done
        ok "generate from $ck at $dt: bit-identical with 2 expert slots per layer ($samps)"
    done
done

# an int8 checkpoint (ckpt quantize): its stored int8 experts packed as stored
bounded 60 "$TANDEM" ckpt quantize "$TMP/run" "$TMP/q8.h5" --dtype int8 >/dev/null 2>"$TMP/err" || { cat "$TMP/err"; fail "ckpt quantize"; }
for c in "" "--expert-cache-mb 0.09"; do
    # shellcheck disable=SC2086
    bounded 60 "$TANDEM" generate --ckpt "$TMP/q8.h5" --prompt "$P" --max-tokens 24 --ignore-eos --temperature 1 --seed 3 \
        --json $c >"$TMP/q8${c:+_off}.json" 2>"$TMP/err" || { cat "$TMP/err"; fail "generate q8.h5 $c"; }
done
same "$TMP/q8.json" "$TMP/q8_off.json" "generate q8.h5"
counters "$TMP/q8_off.json" 0.09 13056 "generate q8.h5"
ok "generate from an int8 checkpoint: bit-identical offloaded"

# the planner: weights = the non-expert ones + the cache, the bytes generate holds; its refusal
$PY -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["expert_cache"]["weight_bytes"]))' "$TMP/off.json" >"$TMP/wb"
"$TANDEM" plan "$TMP/hf/config.json" --world 1 --device-mem-gb 1 --mode serve context=256 concurrency=1 dtype=int8 \
    --expert-cache-mb 0.09 --json >"$TMP/plan.json" 2>"$TMP/err" || { cat "$TMP/err"; fail "plan --expert-cache-mb"; }
$PY - "$TMP/plan.json" "$(cat "$TMP/wb")" <<'PY' || fail "plan: weights with the cache"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["feasible"] and r["expert_cache_slots"] == 2, r
assert r["per_rank_bytes"]["weights"] == int(sys.argv[2]), (r["per_rank_bytes"], sys.argv[2])
PY
if "$TANDEM" plan "$TMP/hf/config.json" --world 1 --device-mem-gb 1 --mode serve context=256 dtype=f32 \
    --expert-cache-mb 0.25 >/dev/null 2>"$TMP/err"; then fail "plan accepted 0.25 MiB"; fi
grep -q -- '--expert-cache-mb 0.25 is below.*top-2.*0.28 MB' "$TMP/err" || { cat "$TMP/err"; fail "plan refusal"; }
ok "plan: weights = non-expert + cache = generate's $(cat "$TMP/wb") bytes; below top-k refused"

# score: the training forward over 6 windows of 32, 2 at a time (rows routed to every expert)
head -c 400 /usr/share/games/fortunes/fortunes >"$TMP/text"
for c in "" "--expert-cache-mb 0.3"; do
    # shellcheck disable=SC2086
    bounded 60 "$TANDEM" score --ckpt "$TMP/run" --text "$TMP/text" --seq-len 32 --batch 2 \
        --output "$TMP/score${c:+_off}.h5" $c >/dev/null 2>"$TMP/err" || { cat "$TMP/err"; fail "score $c"; }
done
$PY - "$TMP/score.h5" "$TMP/score_off.h5" <<'PY' || fail "score: logprobs differ"
import sys, h5py, numpy as np
a, b = (h5py.File(p)["logprobs"][()] for p in sys.argv[1:3])
assert a.shape == b.shape and a.size > 0 and np.array_equal(a.view(np.uint32), b.view(np.uint32))
PY
ok "score: every log-probability bit-identical with the experts offloaded"

# rollout: the same samples (ids, logprobs, routes) with the experts offloaded
printf '%s\n' '{"prompt": "Q: what is"}' '{"prompt": "The cat sat on"}' >"$TMP/p.jsonl"
for c in "" "--expert-cache-mb 0.3"; do
    # shellcheck disable=SC2086
    bounded 60 "$TANDEM" rollout --ckpt "$TMP/run" --prompts "$TMP/p.jsonl" --n 2 --max-tokens 16 --temperature 1 --seed 5 \
        $c --output "$TMP/ro${c:+_off}.jsonl" >/dev/null 2>"$TMP/err" || { cat "$TMP/err"; fail "rollout $c"; }
done
$PY - "$TMP/ro.jsonl" "$TMP/ro_off.jsonl" <<'PY' || fail "rollout: samples differ"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
key = lambda o: (str(o["id"]), o["sample"])
a.sort(key=key); b.sort(key=key)
assert len(a) == 4 and a == b
PY
grep -q 'rollout: expert cache 2 slots per layer' "$TMP/err" || { cat "$TMP/err"; fail "rollout: no cache report"; }
ok "rollout: the same samples, logprobs and routes offloaded; the cache reported"

# the budget refused below one token's experts, naming both numbers
if "$TANDEM" generate --ckpt "$TMP/run" --prompt "$P" --expert-cache-mb 0.25 >"$TMP/out" 2>"$TMP/err"; then fail "0.25 MiB accepted"; fi
[ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- '--expert-cache-mb 0.25 is below.*top-2.*0.28 MB' "$TMP/err" ||
    { cat "$TMP/err"; fail "refusal line"; }
ok "refused: $(cat "$TMP/err")"

# serve: the same completions as the resident server, counters in /metrics
body='{"prompt": "It was a dark and stormy night; the", "max_tokens": 16, "temperature": 0, "logprobs": 1}'
start_server "$TMP/run"
curl -sf -m 60 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" >"$TMP/s_res.json" ||
    fail "resident completion"
stop_server
start_server "$TMP/run" --expert-cache-mb 0.3
curl -sf -m 60 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" >"$TMP/s_off.json" ||
    fail "offloaded completion"
curl -sf -m 10 "http://127.0.0.1:$port/metrics" >"$TMP/metrics" || fail "/metrics"
stop_server
$PY - "$TMP/s_res.json" "$TMP/s_off.json" "$TMP/metrics" <<'PY' || fail "serve: completions or metrics"
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:3])
assert a["text"] == b["text"] and a["logprobs"] == b["logprobs"] and a["finish_reason"] == b["finish_reason"] == "length", (a, b)
m = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[3]) if l.startswith("tandem_expert_cache")}
assert m["tandem_expert_cache_slots"] == 2 and m["tandem_expert_cache_misses_total"] > 6, m
assert m["tandem_expert_cache_loaded_bytes_total"] == m["tandem_expert_cache_misses_total"] * 49152, m
assert m["tandem_expert_cache_hits_total"] > 0 and m["tandem_expert_cache_load_errors_total"] == 0, m
PY
ok "serve: completion and logprobs bit-identical; /metrics counts hits, misses, bytes loaded"

# ep=2: each rank caches its own 4 experts (2 slots of them a layer); ep serves the single process's bits
if command -v mpirun >/dev/null 2>&1; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    : >"$TMP/serve.log"
    timeout -k 5 60 mpirun -np 2 "$TANDEM" serve --ckpt "$TMP/run" --port 0 --kv-mb 16 ep=2 --expert-cache-mb 0.3 \
        2>>"$TMP/serve.log" &
    pid=$!
    port="" i=0
    while [ -z "$port" ]; do
        kill -0 "$pid" 2>/dev/null || fail "ep=2: the server exited at start"
        [ $i -lt 300 ] || fail "ep=2: no start-up line after 30 s"
        port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$TMP/serve.log" 2>/dev/null) || port=""
        i=$((i + 1))
        [ -n "$port" ] || sleep 0.1
    done
    curl -sf -m 60 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" >"$TMP/s_ep.json" ||
        fail "ep=2: offloaded completion"
    kill -TERM "$pid"
    wait "$pid" || true
    pid=""
    $PY - "$TMP/s_res.json" "$TMP/s_ep.json" <<'PY' || fail "ep=2 offloaded: completion differs"
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:3])
assert a["text"] == b["text"] and a["logprobs"] == b["logprobs"], (a, b)
PY
    ok "serve ep=2 offloaded (2 slots of each rank's 4 experts): the single process's completion"
fi

# a corrupt expert chunk (layer 1's up_proj: bytes overwritten, its checksum fails)
cp "$(readlink -f "$TMP/run/latest")" "$TMP/bad.h5"
$PY - "$TMP/bad.h5" <<'PY' || fail "corrupting the chunk"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
ci = f["model/layers/1/mlp/experts/up_proj"].id.get_chunk_info(0)
f.close()
with open(sys.argv[1], "r+b") as g:
    g.seek(ci.byte_offset + 64)
    g.write(b"\xff" * 256)
PY
start_server "$TMP/bad.h5" --expert-cache-mb 0.3
curl -sf -m 60 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" >"$TMP/s_bad.json" ||
    fail "completion on the corrupt checkpoint"
$PY -c 'import json,sys; c=json.load(open(sys.argv[1]))["choices"][0]; assert c["finish_reason"] == "error", c' "$TMP/s_bad.json" ||
    fail "the corrupt expert's request did not end with error: $(cat "$TMP/s_bad.json")"
curl -sf -m 10 "http://127.0.0.1:$port/health" >/dev/null || fail "/health after the failed read"
curl -sf -m 10 "http://127.0.0.1:$port/metrics" | grep -q '^tandem_expert_cache_load_errors_total [1-9]' || fail "load errors not counted"
stop_server
ok "corrupt expert chunk: the request ends with finish_reason error, the server stays up"
if "$TANDEM" score --ckpt "$TMP/bad.h5" --text "$TMP/text" --seq-len 32 --batch 2 --output "$TMP/bad_score.h5" \
    --expert-cache-mb 0.3 >/dev/null 2>"$TMP/err"; then fail "score on the corrupt expert chunk: exit 0"; fi
grep -q 'error: expert weights unreadable: .*up_proj' "$TMP/err" && [ ! -e "$TMP/bad_score.h5" ] ||
    { cat "$TMP/err"; fail "score on the corrupt expert chunk: no error line, or an output written"; }
if "$TANDEM" generate --ckpt "$TMP/bad.h5" --prompt "$P" --max-tokens 4 --expert-cache-mb 0.3 >/dev/null 2>"$TMP/err"; then
    fail "generate on the corrupt expert chunk: exit 0"
fi
grep -q 'generate: expert weights unreadable: .*checksum' "$TMP/err" || { cat "$TMP/err"; fail "generate: no error line"; }
if "$TANDEM" rollout --ckpt "$TMP/bad.h5" --prompts "$TMP/p.jsonl" --n 1 --max-tokens 4 --expert-cache-mb 0.3 \
    >"$TMP/bad_ro.jsonl" 2>"$TMP/err"; then fail "rollout on the corrupt expert chunk: exit 0"; fi
grep -q 'rollout: expert weights unreadable' "$TMP/err" && [ ! -s "$TMP/bad_ro.jsonl" ] ||
    { cat "$TMP/err"; fail "rollout: no error line, or a sample written"; }
ok "corrupt expert chunk: score, generate and rollout fail naming it, writing nothing"
echo "offload: all passed"

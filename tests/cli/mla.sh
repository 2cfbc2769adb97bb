#!/bin/sh
# tests/cli/mla.sh - multi-head latent attention (configs/tiny_mla.json,
# docs/mla.md) end to end: train 20 steps (the loss falls); roll out with
# the latent KV cache (f32, bf16, and int8 weights + cache) and check every
# sampled token's log-prob and route against the trainer's forward
# (`tandem score --rollout`: logprob_diff_max == 0, routing_mismatch == 0,
# bit for bit); the same samples with another batch size and thread count
# (batch invariance); `tandem generate` and `tandem serve` run it, and
# /metrics reports a cached token as (kv_lora_rank + qk_rope_head_dim) x
# layers x the KV dtype's bytes: 4 x 40 x 4 = 640 (f32), 320 (bf16).
# Needs bin/tandem (make); TANDEM=path tests another build.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
CHECK="$PY tests/ref/rollout_check.py"
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
need curl
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tandem-mla.XXXXXX")
pid=""
trap '[ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true; rm -rf "$TMP"' EXIT
fail() {
    echo "mla: FAIL: $*"
    [ ! -s "$TMP/serve.log" ] || tail -n 5 "$TMP/serve.log"
    exit 1
}
ok() { echo "ok   $*"; }
. tests/serve_lib.sh
W=$TMP

test -s "$BUILD/fortunes.bin" ||
    "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$BUILD/fortunes.bin" >/dev/null
bounded 300 "$TANDEM" train configs/tiny_mla.json data="$BUILD/fortunes.bin" out_dir="$W/run" steps=20 \
    >"$W/train.log" 2>&1 || { tail -n 20 "$W/train.log"; fail "tandem train"; }
$PY - "$W/run/metrics.jsonl" <<'PYEOF' || fail "training did not learn"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
assert len(l) == 20 and l[-1] < l[0] - 1.0, l
print("ok   train: loss %.3f -> %.3f in 20 steps" % (l[0], l[-1]))
PYEOF
CK="$W/run/step_00000020.h5"
cat >"$W/p.jsonl" <<'PEOF'
{"prompt": "A", "id": "one-byte"}
{"prompt": "The meaning of life is", "id": 42}
{"prompt": "Fortune favours the bold, but it also favours those who read their fortunes carefully: ", "id": "long"}
PEOF
for v in "f32:" "bf16:--kv-dtype bf16" "int8:--dtype int8 --kv-dtype int8"; do
    name=${v%%:*} opts=${v#*:}
    # shellcheck disable=SC2086
    bounded 300 "$TANDEM" rollout --ckpt "$W/run" --prompts "$W/p.jsonl" --n 4 --max-tokens 48 --temperature 1 --seed 11 \
        --kv-mb 16 $opts >"$W/$name.jsonl" 2>"$W/$name.log" || { cat "$W/$name.log"; fail "rollout ($name)"; }
    # shellcheck disable=SC2086
    bounded 300 "$TANDEM" score --rollout "$W/$name.jsonl" --ckpt "$CK" --batch 5 $opts >"$W/$name.check" ||
        fail "score --rollout ($name)"
    $CHECK verdict "$W/$name.check" --samples 12 || fail "decode vs trainer forward ($name)"
done
TANDEM_THREADS=1 bounded 300 "$TANDEM" rollout --ckpt "$CK" --prompts "$W/p.jsonl" --n 4 --max-tokens 48 --temperature 1 \
    --seed 11 --kv-mb 16 --max-running 3 --output "$W/b.jsonl" 2>"$W/b.log" || { cat "$W/b.log"; fail "rollout --max-running 3"; }
$CHECK same "$W/f32.jsonl" "$W/b.jsonl" || fail "another batch size and thread count, other samples"
bounded 120 "$TANDEM" generate --ckpt "$CK" --prompt "The meaning of" --max-tokens 16 --temperature 0 --json \
    >"$W/g.json" 2>"$W/g.log" || { cat "$W/g.log"; fail "generate"; }
$PY -c 'import json,sys; g=json.load(open(sys.argv[1])); assert len(g["ids"]) == 16, g' "$W/g.json" || fail "generate output"
ok "generate: 16 tokens"
for v in "640:f32" "320:bf16"; do
    want=${v%%:*} kvd=${v#*:}
    start_server "$W/run" --kv-dtype "$kvd"
    got=$(curl -sf --max-time 10 "http://127.0.0.1:$port/metrics" | sed -n 's/^tandem_kv_bytes_per_token \([0-9.e+]*\)$/\1/p')
    stop_server
    [ "$got" = "$want" ] || fail "/metrics tandem_kv_bytes_per_token $got with --kv-dtype $kvd, want $want"
    ok "serve --kv-dtype $kvd: $got KV bytes per token (4 layers x (32 + 8) latent + rope values)"
done
ok "mla.sh"

#!/bin/sh
# bench/mla.sh - multi-head latent attention (docs/mla.md) on a
# DeepSeek-V3-shaped model scaled to this machine (d 256, 4 layers, 8 heads,
# q_lora 96, kv_lora 128, nope 32, rope 16 interleaved, v 32; a dense first
# layer, then 8 experts top-2 + 1 shared), next to the same-shape model with
# ordinary attention (8 heads of 48 = nope + rope, full K/V cached):
#   - KV bytes per cached token, as `tandem serve` reports them (/metrics
#     tandem_kv_bytes_per_token), f32 cache;
#   - decode tokens/s (`tandem generate --json`, greedy, 64 new tokens) after
#     a prompt of 256 and of 4032 tokens (contexts ~256 and ~4096);
#   - training tokens/s of `tandem train` against bench/torch_train.py (the
#     same model in PyTorch, HF's naive MLA), 2 threads each, median of the
#     steps after the first 3, runs interleaved A B B A.  Target >= 1.3x.
# Prints a table and one JSON line {"bench":"mla",...}.  Shared machines are
# noisy: the ratios measured side by side are what to read.
set -eu
cd "$(dirname "$0")/.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
[ -x "$T" ] || { echo "bench/mla.sh: $T missing (make)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1
W=$(mktemp -d /tmp/tandem-mla-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || "$T" data prepare --input /usr/share/games/fortunes --output "$DATA" >/dev/null
STEPS=${MLA_BENCH_STEPS:-8}
COMMON='"vocab_size":256,"hidden_size":256,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":8,"first_k_dense_replace":1,"intermediate_size":512,"moe_intermediate_size":128,"num_local_experts":8,"num_experts_per_tok":2,"n_shared_experts":1,"max_position_embeddings":4352'
MLA="{$COMMON,\"q_lora_rank\":96,\"kv_lora_rank\":128,\"qk_nope_head_dim\":32,\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"rope_interleave\":true}"
FULL="{$COMMON,\"head_dim\":48}"
for m in mla full; do
    eval "mc=\$$(echo $m | tr a-z A-Z)"
    printf '{"model": %s, "seq_len": 256, "micro_batch": 8, "lr": 1e-3, "warmup_steps": 2, "save_every": 0, "eval_every": 0, "shuffle": false}\n' \
        "$mc" >"$W/$m.json"
    bounded 600 "$T" train "$W/$m.json" data="$DATA" steps=1 out_dir="$W/$m.ck" >/dev/null 2>&1 || { echo "FAIL train $m"; exit 1; }
done

kv_bytes() {   # kv_bytes CKPT: bytes per cached token from serve's start-up line
    : >"$W/serve.log"
    "$T" serve --ckpt "$1" --port 0 --kv-mb 16 --quiet 2>>"$W/serve.log" >/dev/null &
    sp=$!
    wait_until 30 "serve start-up line" grep -q "bytes per cached token" "$W/serve.log" || { kill -KILL $sp; exit 1; }
    kill -TERM $sp; wait $sp || true
    sed -n 's/.* \([0-9]*\) bytes per cached token.*/\1/p' "$W/serve.log" | head -1
}
kv_mla=$(kv_bytes "$W/mla.ck"); kv_full=$(kv_bytes "$W/full.ck")

decode() {   # decode CKPT PROMPT_LEN: tokens/s of 64 greedy tokens
    ids=$($PY -c "import sys; n=int(sys.argv[1]); print(','.join(str((i * 7 + 3) % 200 + 32) for i in range(n)))" "$2")
    bounded 600 "$T" generate --ckpt "$1" --prompt-ids "$ids" --max-tokens 64 --temperature 0 --ignore-eos --json \
        2>/dev/null | $PY -c 'import json,sys; print(round(json.load(sys.stdin)["tokens_per_s"], 1))'
}
d256_mla=$(decode "$W/mla.ck" 256); d256_full=$(decode "$W/full.ck" 256)
d4k_mla=$(decode "$W/mla.ck" 4032); d4k_full=$(decode "$W/full.ck" 4032)

tandem_tps() {   # median tokens/s of the steps after the first 3
    bounded 900 "$T" train "$W/mla.json" data="$DATA" steps=$((STEPS + 3)) threads=2 out_dir="$W/tt.$1" >/dev/null 2>&1
    $PY -c 'import json,statistics,sys; l=[json.loads(x)["tokens_per_s"] for x in open(sys.argv[1]) if "\"loss\"" in x]; print(round(statistics.median(l[3:]), 1))' \
        "$W/tt.$1/metrics.jsonl"
}
torch_tps() {
    bounded 900 $PY bench/torch_train.py "$W/mla.json" --data "$DATA" --steps "$STEPS" --warmup 3 --threads 2 2>/dev/null |
        $PY -c 'import json,sys; print(json.loads(sys.stdin.read())["tokens_per_s"])'
}
a1=$(tandem_tps 1); b1=$(torch_tps); b2=$(torch_tps); a2=$(tandem_tps 2)
$PY - "$kv_mla" "$kv_full" "$d256_mla" "$d256_full" "$d4k_mla" "$d4k_full" "$a1" "$a2" "$b1" "$b2" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PYEOF'
import json, sys
kv_mla, kv_full = int(sys.argv[1]), int(sys.argv[2])
d = [float(x) for x in sys.argv[3:7]]
a1, a2, b1, b2 = (float(x) for x in sys.argv[7:11])
ta, tb = (a1 + a2) / 2, (b1 + b2) / 2
print("KV bytes per token (4 layers, f32): MLA latent %d, full K/V %d (%.1fx fewer)" % (kv_mla, kv_full, kv_full / kv_mla))
print("decode tok/s, 64 tokens:       context 256   context 4096")
print("  MLA (latent cache)           %8.1f      %8.1f" % (d[0], d[2]))
print("  full K/V, same shape         %8.1f      %8.1f" % (d[1], d[3]))
print("training tok/s (2 threads): tandem %.1f (rounds %.1f %.1f), PyTorch %.1f (%.1f %.1f): %.2fx (target >= 1.3x)"
      % (ta, a1, a2, tb, b1, b2, ta / tb))
print("load average: %s" % sys.argv[11])
print(json.dumps(dict(bench="mla", kv_bytes_per_token=dict(mla=kv_mla, full=kv_full),
                      decode_tok_s=dict(mla_256=d[0], full_256=d[1], mla_4096=d[2], full_4096=d[3]),
                      train_tok_s=dict(tandem=[a1, a2], torch=[b1, b2], ratio=round(ta / tb, 3)),
                      loadavg=sys.argv[11])))
PYEOF

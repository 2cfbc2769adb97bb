#!/bin/sh
# bench/offload.sh - expert offload (--expert-cache-mb, docs/serving.md
# "Expert offload"): decode tokens/s and the cache's hit rate at cache sizes
# of 100%, 50%, 33% (the experts take 3x the cache) and 25% of a layer's
# experts, against the same model fully resident (run by bench/run.sh,
# i.e. `make bench`).
#
# Weights: configs/moe128.json (4 MoE layers of 128 experts, top-8, d =
# 512) trained 30 steps on fortunes, stored one expert per chunk (ckpt
# reshard --dp 128 --ep 128), made once into OFFLOAD_BENCH_DIR (default
# $BUILD/bench_offload).  `tandem generate` decodes 128 tokens
# (sampled, seed 1, --ignore-eos) from one prompt at each size; every run
# must give the resident run's tokens (checked).  The table gives tokens/s
# (the decode rate after the first token), hits / (hits + misses), the
# bytes loaded per generated token and the seconds the forward stalled in
# loads.  Expert "loads" here read the HDF5 checkpoint, which the page
# cache holds after the first run: the figures are of a warm file, not of
# the disk.  One JSON line {"bench":"offload", ...}.  Figures on a shared
# machine are indicative.  TANDEM_THREADS (default 2) threads.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
DIR=${OFFLOAD_BENCH_DIR:-$BUILD/bench_offload}
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TANDEM_THREADS=${TANDEM_THREADS:-2}
mkdir -p "$DIR"
h5=$DIR/moe128.h5
if [ ! -s "$h5" ]; then
    data=$BUILD/fortunes.bin
    [ -s "$data" ] || "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$data" >"$DIR/data.log" 2>&1 ||
        { echo "bench/offload.sh: tandem data prepare failed (log: $DIR/data.log)"; exit 1; }
    rm -rf "$DIR/run"
    "$TANDEM" train configs/moe128.json "data=$data" steps=30 warmup_steps=1 eval_every=0 save_every=30 keep_last=1 \
        seq_len=128 micro_batch=2 "out_dir=$DIR/run" >"$DIR/train.log" 2>&1 ||
        { echo "bench/offload.sh: training failed (log: $DIR/train.log)"; exit 1; }
    "$TANDEM" ckpt export "$DIR/run" "$DIR/moe128.tmp.h5" >>"$DIR/train.log" 2>&1 ||
        { echo "bench/offload.sh: export failed (log: $DIR/train.log)"; exit 1; }
    # one expert per chunk (docs/serving.md "Expert offload"): a load reads its own bytes
    "$TANDEM" ckpt reshard "$DIR/moe128.tmp.h5" "$DIR/moe128.ep.h5" --dp 128 --ep 128 --weights-only >>"$DIR/train.log" 2>&1 ||
        { echo "bench/offload.sh: reshard failed (log: $DIR/train.log)"; exit 1; }
    mv "$DIR/moe128.ep.h5" "$h5"
    rm -rf "$DIR/run" "$DIR/moe128.tmp.h5"
fi
# one expert (gate, up, down of 256 x 512 in f32) is 1.5 MiB; a layer's 128
# are 192 MiB, the 4 layers' 768 MiB
P="The quick brown fox jumps over the lazy dog. Once upon a time"
run() {
    # shellcheck disable=SC2086
    "$TANDEM" generate --ckpt "$h5" --prompt "$P" --max-tokens 128 --ignore-eos --temperature 1 --seed 1 --json $1 \
        >"$DIR/$2.json" 2>"$DIR/$2.err" || { echo "bench/offload.sh: generate $1 failed:"; cat "$DIR/$2.err"; exit 1; }
}
run "" resident
for pct in 100 50 33 25; do
    slots=$((128 * pct / 100))
    run "--expert-cache-mb $((slots * 6))" "c$pct"
done
$PY - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
res = json.load(open(d + "/resident.json"))
rows, out = [], {"bench": "offload", "config": "configs/moe128.json", "tokens": len(res["ids"]),
                 "resident_tokens_per_s": round(res["tokens_per_s"], 2)}
print("bench/offload.sh: configs/moe128.json, 4 MoE layers x 128 experts (top-8), 128 sampled tokens, f32")
print("%-10s %7s %9s %9s %10s %12s %8s" % ("cache", "slots", "tok/s", "vs res.", "hit rate", "MiB/token", "stall s"))
print("%-10s %7s %9.1f %9s %10s %12s %8s" % ("resident", "-", res["tokens_per_s"], "1.00", "-", "-", "-"))
for pct in (100, 50, 33, 25):
    o = json.load(open("%s/c%d.json" % (d, pct)))
    assert o["ids"] == res["ids"], "cache %d%%: tokens differ from the resident model's" % pct
    c = o["expert_cache"]
    hr = c["hits"] / max(1, c["hits"] + c["misses"])
    mpt = c["bytes_loaded"] / len(o["ids"]) / 2**20
    print("%-10s %7d %9.1f %9.2f %10.3f %12.2f %8.2f" % ("%d%%" % pct, c["slots_per_layer"], o["tokens_per_s"],
          o["tokens_per_s"] / res["tokens_per_s"], hr, mpt, c["load_s"]))
    out["c%d" % pct] = {"slots": c["slots_per_layer"], "tokens_per_s": round(o["tokens_per_s"], 2),
                        "hit_rate": round(hr, 4), "mib_per_token": round(mpt, 3), "stall_s": round(c["load_s"], 3)}
print(json.dumps(out))
PY

# LRU against LFU on the model's own routing: a rollout's routes (every
# generated token's top-8 per MoE layer, 8 prompts x 64 tokens, one after
# another as one stream per layer) replayed through per-layer caches of
# each size; LFU evicts the expert used least often so far (ties: least
# recently), counts kept for evicted experts too.
printf '%s\n' '{"prompt": "Once upon a time"}' '{"prompt": "Q: What is the meaning of"}' '{"prompt": "The best way to"}' \
    '{"prompt": "In the beginning"}' '{"prompt": "A man walks into a bar"}' '{"prompt": "Never trust a"}' \
    '{"prompt": "She said that the"}' '{"prompt": "It is a truth universally"}' >"$DIR/prompts.jsonl"
"$TANDEM" rollout --ckpt "$h5" --prompts "$DIR/prompts.jsonl" --n 1 --max-tokens 64 --temperature 1 --seed 3 --ignore-eos \
    --output "$DIR/routes.jsonl" >/dev/null 2>"$DIR/rollout.err" || { echo "bench/offload.sh: rollout failed:"; cat "$DIR/rollout.err"; exit 1; }
$PY - "$DIR/routes.jsonl" <<'PY'
import json, sys
rows = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda o: str(o["id"]))
L = len(rows[0]["routes"][0])
def replay(slots, lfu):
    hits = total = 0
    for l in range(L):
        cache, last, count, t = set(), {}, {}, 0
        for o in rows:
            for tok in o["routes"]:
                t += 1
                for e in tok[l]:
                    total += 1
                    count[e] = count.get(e, 0) + 1
                    if e in cache:
                        hits += 1
                    else:
                        if len(cache) >= slots:
                            pinned = set(tok[l])
                            cand = [x for x in cache if x not in pinned]
                            v = min(cand, key=(lambda x: (count[x], last[x])) if lfu else (lambda x: last[x]))
                            cache.remove(v)
                        cache.add(e)
                    last[e] = t
    return hits / total
print("bench/offload.sh: LRU vs LFU replayed on %d decode tokens' routes (per layer, %d MoE layers)" % (sum(len(o["routes"]) for o in rows), L))
print("%7s %8s %8s" % ("slots", "LRU", "LFU"))
res = {}
for slots in (64, 42, 32, 16, 8):
    a, b = replay(slots, False), replay(slots, True)
    res[slots] = (round(a, 4), round(b, 4))
    print("%7d %8.3f %8.3f" % (slots, a, b))
print(json.dumps({"bench": "offload_policy", "hit_rate_lru_lfu": res}))
PY

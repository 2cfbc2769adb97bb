#!/bin/sh
# bench/longctx.sh - long-context serving (issue 19; docs/long-context.md),
# run by bench/run.sh, i.e. `make bench`.
#
# Model: configs/small_128k.json, the `small` shape (hidden 256, 4 layers,
# 4 heads of 64, 2 kv heads, 8 experts top-2, V = 256) with its context
# stretched to 131072 positions by YaRN RoPE scaling (factor 32 over 4096),
# trained a few steps on fortunes (made once into $DIR, LONGCTX_BENCH_DIR,
# default $BUILD/bench_longctx: m.h5, float32, weights only).
#
# For each length L of LONGCTX_LENGTHS (default 1024 4096 16384 65536
# 131008: "128k" is the context less 64 positions, room for the tokens
# generated) a fresh `tandem serve` (2 threads, --kv-mb just above what L
# needs, --no-prefix-cache, default --prefill-chunk) answers one streamed
# greedy completion of LONGCTX_GEN (16) tokens for a prompt of L token ids
# (token i = (37 i + 11) mod 256, c_peer's prompt) sent by
# bench/longctx_client.py: time to first token, decode tokens/s after it
# ((n - 1) / (t_last - t_first), at context L), and the server's peak RSS
# (VmHWM) after the request.  A fresh process per length, so each peak is
# that length's own.  Then: the log-log slope of TTFT between consecutive
# lengths (1: linear, the GEMMs dominate; 2: quadratic, attention
# dominates), bytes per cached token (the start-up line, and (RSS(L) -
# RSS(1k)) / (L - 1k) measured), decode tokens/s at the longest context.
#
# The llama.cpp peer (../shared/peers/llamacpp, installed into
# LLAMA_PEER_DIR as bench/gguf.sh does) on the GGUF export of the same
# weights (`tandem ckpt export --format gguf`, F32; GGUF gets the
# checkpoint with its config's rope_scaling dropped, as the exporter writes
# no RoPE scaling metadata: the angles differ, the work does not):
# c_peer --kv f32 --ctx L+64 --prompt L --gen 16 --reps 1 (a warm-up run
# and one measured run, prompt in chunks of 512, flash attention off as
# c_peer sets it), at each length up to LONGCTX_PEER_MAX (16384) within
# LONGCTX_PEER_TIMEOUT (1800 s).  TTFT ratio = tandem's TTFT / llama.cpp's
# prompt time (target <= 1.0).
#
# Time: about 1 + 4 + 30 + 400 + 1600 s of prefill for tandem on an idle
# 2-core machine (attention is quadratic), several times that when shared;
# LONGCTX_LENGTHS="1024 4096 16384" for a quick run.  Figures on a shared
# machine are indicative only.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${LONGCTX_BENCH_DIR:-$BUILD/bench_longctx}
LENGTHS=${LONGCTX_LENGTHS:-1024 4096 16384 65536 131008}
GEN=${LONGCTX_GEN:-16}
PEER_MAX=${LONGCTX_PEER_MAX:-16384}
PEER_TIMEOUT=${LONGCTX_PEER_TIMEOUT:-1800}
PEER=${LLAMA_PEER_DIR:-/tmp/llamapeer}
PEERS=${TANDEM_PEERS:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)/../shared/peers}
PY=/usr/bin/python3
CFG=configs/small_128k.json
if [ "$BUILD" = build ]; then TANDEM=bin/tandem; else TANDEM=$BUILD/bin/tandem; fi
[ -x "$TANDEM" ] || { echo "bench/longctx.sh: $TANDEM missing (make builds it)"; exit 1; }
mkdir -p "$DIR"
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS GOTO_NUM_THREADS OMP_WAIT_POLICY
export TANDEM_THREADS=2
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
note() { echo "  $*"; }
echo "== long-context serving: small shape, YaRN to 131072 positions ($(nproc) cores, load average $(loadavg))"

# ---------------------------------------------------------------- weights
if [ ! -s "$DIR/m.h5" ]; then
    note "making the weights (once): $CFG trained 20 steps on fortunes, weights-only float32 export"
    test -s "$BUILD/fortunes.bin" ||
        "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$BUILD/fortunes.bin" >"$DIR/make.log" 2>&1
    "$TANDEM" train "$CFG" "data=$BUILD/fortunes.bin" steps=20 "out_dir=$DIR/run" >>"$DIR/make.log" 2>&1 &&
        "$TANDEM" ckpt export "$DIR/run" "$DIR/m.tmp.h5" >>"$DIR/make.log" 2>&1 ||
        { echo "bench/longctx.sh: making the weights failed (log: $DIR/make.log)"; exit 1; }
    mv "$DIR/m.tmp.h5" "$DIR/m.h5"
    rm -rf "$DIR/run"
fi

# ---------------------------------------------------------------- tandem
rm -f "$DIR"/t_*.json "$DIR"/p_*.json "$DIR"/serve_*.log
pid=""
cleanup() { if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
for L in $LENGTHS; do
    kv_mb=$(( (L + GEN + 64) * 4096 / 1048576 + 8 ))
    log=$DIR/serve_$L.log
    "$TANDEM" serve --ckpt "$DIR/m.h5" --port 0 --kv-mb "$kv_mb" --max-body 16777216 --quiet --no-prefix-cache \
        >"$log" 2>&1 &
    pid=$!
    port=""
    i=0
    while [ -z "$port" ] && [ $i -lt 600 ]; do
        port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$log" | head -n 1)
        kill -0 "$pid" 2>/dev/null || break
        [ -n "$port" ] || sleep 0.1
        i=$((i + 1))
    done
    if [ -z "$port" ]; then
        note "serve did not start for L=$L: $(tail -n 1 "$log")"
        cleanup
        continue
    fi
    [ -s "$DIR/startup.txt" ] || head -n 1 "$log" >"$DIR/startup.txt"
    note "tandem L=$L (--kv-mb $kv_mb, load average $(loadavg))"
    "$PY" bench/longctx_client.py --port "$port" --pid "$pid" --len "$L" --gen "$GEN" --timeout 14400 \
        >"$DIR/t_$L.json" 2>"$DIR/t_$L.err" || note "client failed at L=$L: $(tail -n 1 "$DIR/t_$L.err")"
    note "  $(cat "$DIR/t_$L.json")"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
done

# ---------------------------------------------------------------- llama.cpp
if [ ! -x "$PEER/c_peer" ] && [ -z "${LONGCTX_NO_PEER_SETUP:-}" ] && [ -x "$PEERS/llamacpp/setup.sh" ] &&
    command -v npm >/dev/null 2>&1; then
    note "installing the llama.cpp peer into $PEER ($PEERS/llamacpp/setup.sh, ~1 min)"
    "$PEERS/llamacpp/setup.sh" "$PEER" >"$DIR/peer_setup.log" 2>&1 || note "peer setup failed (log: $DIR/peer_setup.log)"
fi
if [ -x "$PEER/c_peer" ]; then
    g=$DIR/m.f32.gguf
    if [ ! -s "$g" ] || [ -n "$(find "$DIR/m.h5" -newer "$g")" ]; then
        cp "$DIR/m.h5" "$DIR/m.plain.h5"
        "$PY" - "$DIR/m.plain.h5" <<'EOF'
import h5py, json, sys
with h5py.File(sys.argv[1], "r+") as f:
    c = json.loads(f.attrs["config"])
    c.pop("rope_scaling", None)
    f.attrs["config"] = json.dumps(c)
EOF
        "$TANDEM" ckpt export "$DIR/m.plain.h5" "$g" --format gguf --dtype f32 >"$DIR/export.log" 2>&1 ||
            note "GGUF export failed: $(tail -n 1 "$DIR/export.log")"
        rm -f "$DIR/m.plain.h5"
    fi
    for L in $LENGTHS; do
        [ -s "$g" ] || break
        [ "$L" -le "$PEER_MAX" ] || { note "llama.cpp L=$L: skipped (above LONGCTX_PEER_MAX $PEER_MAX)"; continue; }
        note "llama.cpp L=$L (load average $(loadavg))"
        timeout "$PEER_TIMEOUT" "$PEER/c_peer" "$g" --threads 2 --kv f32 --ctx $((L + GEN + 64)) --prompt "$L" \
            --gen "$GEN" --reps 1 >"$DIR/p_$L.json" 2>"$DIR/p_$L.err" ||
            { note "c_peer L=$L failed or timed out: $(tail -n 1 "$DIR/p_$L.err")"; rm -f "$DIR/p_$L.json"; break; }
    done
else
    note "llama.cpp peer not installed ($PEER/c_peer missing): no comparison"
fi

# ---------------------------------------------------------------- report
"$PY" - "$DIR" "$LENGTHS" <<'EOF'
import json, math, os, re, sys

d, lengths = sys.argv[1], [int(x) for x in sys.argv[2].split()]


def load(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


su = open(os.path.join(d, "startup.txt")).read() if os.path.exists(os.path.join(d, "startup.txt")) else ""
m = re.search(r"(\d+) bytes per cached token", su)
bpt = int(m.group(1)) if m else None
rows, pts = [], []
for L in lengths:
    t, p = load("t_%d.json" % L) or {}, load("p_%d.json" % L) or {}
    pb = p.get("bench") or {}
    lt = L / pb["prompt_tok_s_median"] if pb.get("prompt_tok_s_median") else None
    tt = t.get("ttft_s")
    if tt:
        pts.append((L, tt, t.get("rss_peak_mib")))
    rows.append((L, tt, t.get("rss_peak_mib"), t.get("decode_tok_s"), lt, pb.get("decode_tok_s_median")))
print()
print("== long-context serving, small shape + YaRN, 2 threads, f32 weights and KV")
print("  %8s %10s %10s %12s %12s %10s %12s" % ("tokens", "TTFT s", "RSS MiB", "decode t/s", "llama TTFT", "ratio", "llama dec"))
f = lambda v, s="%.2f": s % v if v is not None else "n/a"
for L, tt, rss, dec, lt, ld in rows:
    print("  %8d %10s %10s %12s %12s %10s %12s" % (L, f(tt), f(rss, "%.0f"), f(dec, "%.1f"), f(lt), 
          f(tt / lt if tt and lt else None), f(ld, "%.1f")))
slopes = []
for (a, ta, _), (b, tb, _) in zip(pts, pts[1:]):
    slopes.append((a, b, math.log(tb / ta) / math.log(b / a)))
if slopes:
    print("  log-log slope of TTFT: " + ", ".join("%d->%d %.2f" % s for s in slopes))
meas = None
if len(pts) >= 2 and pts[0][2] and pts[-1][2]:
    meas = (pts[-1][2] - pts[0][2]) * 1048576 / (pts[-1][0] - pts[0][0])
    print("  bytes per cached token: %s (start-up line: 4 layers x 2 x 2 kv heads x 64 x 4 bytes); measured "
          "(RSS(%d) - RSS(%d)) / %d tokens = %.0f" % (bpt, pts[-1][0], pts[0][0], pts[-1][0] - pts[0][0], meas))
last = rows[-1] if rows else None
print(json.dumps({"bench": "longctx", "rows": [dict(zip(("tokens", "ttft_s", "rss_mib", "decode_tok_s", "llama_ttft_s",
                  "llama_decode_tok_s"), r)) for r in rows], "slopes": slopes, "kv_bytes_per_token": bpt,
                  "kv_bytes_per_token_measured": meas}, separators=(",", ":")))
EOF

#!/bin/sh
# bench/prefix.sh - the prefix cache under an agent trace and an RL group
# (run by bench/run.sh, i.e. `make bench`).
#
# Weights: configs/small.json (context 1024) trained 10 steps on fortunes,
# weights-only (bench/infer.sh's $BUILD/bench_infer/small.h5 when it is
# there, else made once into PREFIX_BENCH_DIR, default $BUILD/bench_prefix).
# `tandem serve` runs twice, with the prefix cache (the default) and with
# --no-prefix-cache, and bench/prefix_load.py drives each:
#   agent  4 turns; turn 1 = a 600-token system prompt + a 40-token user
#          message, every later turn resends the history and adds 40; 32
#          greedy tokens an answer, streamed: TTFT and total per turn
#   group  one 900-token prompt, n = 8 samples of 64 tokens (an RL group):
#          TTFT and total
# Prints a table and one JSON line {"bench":"prefix", ...}.  Target: the
# second turn's TTFT at most 0.2 x the first's with the cache.  Figures on
# a shared machine are indicative.  TANDEM_THREADS (default 2) threads.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
DIR=${PREFIX_BENCH_DIR:-$BUILD/bench_prefix}
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TANDEM_THREADS=${TANDEM_THREADS:-2}
mkdir -p "$DIR"
h5=$BUILD/bench_infer/small.h5
if [ ! -s "$h5" ]; then
    h5=$DIR/small.h5
    if [ ! -s "$h5" ]; then
        data=$BUILD/fortunes.bin
        [ -s "$data" ] || "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$data" >"$DIR/data.log" 2>&1 ||
            { echo "bench/prefix.sh: tandem data prepare failed (log: $DIR/data.log)"; exit 1; }
        rm -rf "$DIR/run"
        "$TANDEM" train configs/small.json "data=$data" steps=10 warmup_steps=1 eval_every=0 save_every=10 keep_last=1 \
            "out_dir=$DIR/run" >"$DIR/train.log" 2>&1 || { echo "bench/prefix.sh: training failed (log: $DIR/train.log)"; exit 1; }
        "$TANDEM" ckpt export "$DIR/run" "$DIR/small.tmp.h5" >>"$DIR/train.log" 2>&1 ||
            { echo "bench/prefix.sh: export failed (log: $DIR/train.log)"; exit 1; }
        mv "$DIR/small.tmp.h5" "$h5"
        rm -rf "$DIR/run"
    fi
fi

pid=""
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
run() {   # run LABEL [serve options]: one server, one load; the JSON line in $DIR/LABEL.json
    label=$1
    shift
    : >"$DIR/serve.log"
    "$TANDEM" serve --ckpt "$h5" --port 0 --kv-mb 256 "$@" 2>>"$DIR/serve.log" &
    pid=$!
    port=""
    i=0
    while [ -z "$port" ]; do
        kill -0 "$pid" 2>/dev/null || { cat "$DIR/serve.log"; echo "bench/prefix.sh: the server exited"; exit 1; }
        [ $i -lt 600 ] || { echo "bench/prefix.sh: no start-up line after 60 s"; exit 1; }
        port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$DIR/serve.log" 2>/dev/null) || port=""
        i=$((i + 1))
        [ -n "$port" ] || sleep 0.1
    done
    timeout 900 $PY bench/prefix_load.py --port "$port" --label "$label" >"$DIR/$label.json" ||
        { echo "bench/prefix.sh: the load ($label) failed"; exit 1; }
    kill -TERM "$pid"
    wait "$pid" || true
    pid=""
}
run cache
run nocache --no-prefix-cache
$PY - "$DIR/cache.json" "$DIR/nocache.json" <<'PYEOF'
import json, sys
c, n = (json.load(open(p)) for p in sys.argv[1:3])
ms = lambda s: f"{1000 * s:9.1f}"
print(f"{'':28s}{'cache ms':>10s}{'no cache ms':>12s}{'x':>7s}")
for k, (tc, tn) in enumerate(zip(c["agent"], n["agent"])):
    print(f"agent turn {k + 1} ({tc['prompt_tokens']:4d} tok) TTFT {ms(tc['ttft_s'])} {ms(tn['ttft_s'])}   "
          f"{tn['ttft_s'] / tc['ttft_s']:5.2f}")
print(f"agent, all turns, total     {ms(c['agent_total_s'])} {ms(n['agent_total_s'])}   "
      f"{n['agent_total_s'] / c['agent_total_s']:5.2f}")
g, h = c["group"], n["group"]
print(f"RL group n={g['n']} ({g['prompt_tokens']} tok) TTFT {ms(g['ttft_s'])} {ms(h['ttft_s'])}   {h['ttft_s'] / g['ttft_s']:5.2f}")
print(f"RL group total              {ms(g['total_s'])} {ms(h['total_s'])}   {h['total_s'] / g['total_s']:5.2f}")
r = c["turn2_over_turn1_ttft"]
print(f"turn 2 TTFT / turn 1 TTFT with the cache: {r:.3f} (target <= 0.2: {'met' if r <= 0.2 else 'NOT met'}); "
      f"without: {n['turn2_over_turn1_ttft']:.3f}")
print(json.dumps({"bench": "prefix", "cache": c, "no_cache": n}))
PYEOF

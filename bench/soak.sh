#!/bin/sh
# bench/soak.sh - the serving soak (issue 18): 32 concurrent clients for 10
# minutes against one `tandem serve` (run by bench/run.sh, i.e. `make bench`).
#
# Weights: configs/small.json (context 1024) trained 10 steps on fortunes,
# saved at steps 5 and 10 into SOAK_DIR (default $BUILD/bench_soak), made
# once.  The server serves step 10 with --kv-mb 64 and an admin token;
# bench/soak_load.py mixes short and long prompts, streamed and not, n = 4
# groups, cancellations, prefix-sharing conversations and fixed probes,
# and reloads step 5 at half time.  It prints the p50 / p99 latency and
# peak resident memory per minute and a JSON line {"bench":"soak", ...};
# with --check it fails on any error, a probe answer that changed under
# load, p99 drift over 3x, or resident memory growing more than 1% after
# the warm-up (the first 2 minutes).  /metrics is scraped every second into
# SOAK_DIR/scrape.log, drawn by `tandem plot --serve` into SOAK_DIR/plots.
#   SOAK_S (600) seconds, SOAK_CLIENTS (32), TANDEM_THREADS (2).
# tests/cli/serve.sh runs the same load for 30 s on the tiny model.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
DIR=${SOAK_DIR:-$BUILD/bench_soak}
S=${SOAK_S:-600}
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TANDEM_THREADS=${TANDEM_THREADS:-2}
mkdir -p "$DIR"
if [ ! -s "$DIR/run/step_00000010.h5" ] || [ ! -s "$DIR/run/step_00000005.h5" ]; then
    data=$BUILD/fortunes.bin
    [ -s "$data" ] || "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$data" >"$DIR/data.log" 2>&1 ||
        { echo "bench/soak.sh: tandem data prepare failed (log: $DIR/data.log)"; exit 1; }
    rm -rf "$DIR/run"
    "$TANDEM" train configs/small.json "data=$data" steps=10 warmup_steps=1 eval_every=0 save_every=5 keep_last=2 \
        "out_dir=$DIR/run" >"$DIR/train.log" 2>&1 || { echo "bench/soak.sh: training failed (log: $DIR/train.log)"; exit 1; }
fi

pid=""
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
: >"$DIR/serve.log"
"$TANDEM" serve --ckpt "$DIR/run/step_00000010.h5" --port 0 --kv-mb 64 --max-running 32 --max-queue 128 \
    --admin-token soak-bench 2>>"$DIR/serve.log" &
pid=$!
port=""
i=0
while [ -z "$port" ]; do
    kill -0 "$pid" 2>/dev/null || { tail -5 "$DIR/serve.log"; echo "bench/soak.sh: the server exited"; exit 1; }
    [ $i -lt 600 ] || { echo "bench/soak.sh: no start-up line after 60 s"; exit 1; }
    port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$DIR/serve.log" 2>/dev/null) || port=""
    i=$((i + 1))
    [ -n "$port" ] || sleep 0.1
done
rc=0
timeout $((S + 960)) $PY bench/soak_load.py --port "$port" --pid "$pid" --duration "$S" --window 60 \
    --warmup $((S / 5)) --clients "${SOAK_CLIENTS:-32}" --context 1024 \
    --admin-token soak-bench --reload "$DIR/run/step_00000005.h5" --check --check-drift \
    --scrape-log "$DIR/scrape.log" --scrape-every 1 || rc=$?
kill -TERM "$pid"
wait "$pid" || rc=1
pid=""
[ $rc -eq 0 ] || { echo "bench/soak.sh: FAILED (server log: $DIR/serve.log)"; exit 1; }
"$TANDEM" plot --serve "$DIR/scrape.log" --out "$DIR/plots" >/dev/null ||
    { echo "bench/soak.sh: tandem plot --serve $DIR/scrape.log failed"; exit 1; }
echo "bench/soak.sh: figures in $DIR/plots (tandem plot --serve $DIR/scrape.log)"

#!/bin/sh
# bench/sampler.sh - time per token of the sampler at V = 152064 (Qwen's
# vocabulary) next to the sort-based version it replaced (run by
# bench/run.sh, i.e. `make bench`).  build/bench/sampler (bench/sampler.c)
# prints a table and, last, one JSON line starting with {"bench":"sampler".
# Shared machines are noisy: compare the ratios measured side by side.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/bench/sampler
[ -x "$BIN" ] || { echo "bench/sampler.sh: $BIN missing (make bench builds it)"; exit 1; }
echo "== sampler: selection vs the sort it replaced"
"$BIN" --vocab "${SAMPLER_BENCH_VOCAB:-152064}" --reps "${SAMPLER_BENCH_REPS:-30}"

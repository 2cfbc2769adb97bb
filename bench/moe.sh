#!/bin/sh
# bench/moe.sh - one MoE layer with 60-128 small experts against 8 large ones at
# equal active FLOPs (run by bench/run.sh, i.e. `make bench`).
#
# build/bench/moe (bench/moe.c) measures, on MOE_BENCH_THREADS (default 2)
# threads, best of MOE_BENCH_REPS (default 5): the experts' grouped forward
# and backward GEMMs (model_experts_forward / model_experts_backward) in
# GFLOP/s next to the same FLOPs with every row in one expert, and the
# training step of a one-layer model with that MoE; plus two shapes with
# few rows per expert (a prefill chunk and a decode batch at 128 experts).
# It prints a table and, last, one JSON line starting with {"bench":"moe".
# Shared machines are noisy: compare the ratios measured side by side in
# one run, not numbers across runs.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/bench/moe
[ -x "$BIN" ] || { echo "bench/moe.sh: $BIN missing (make bench builds it)"; exit 1; }
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS GOTO_NUM_THREADS
echo "== MoE layer: many small experts vs few large ($(nproc) cores)"
"$BIN" --threads "${MOE_BENCH_THREADS:-2}" --reps "${MOE_BENCH_REPS:-5}"

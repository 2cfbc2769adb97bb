#!/bin/sh
# bench/ops.sh - operator-core throughput next to OpenBLAS (run by
# bench/run.sh, i.e. `make bench`).
#
# build/bench/ops (bench/ops.c) measures, on OPS_BENCH_THREADS (default 2)
# threads, each number the best of OPS_BENCH_REPS (default 5) runs after a
# warm-up:
#   - the linear layer, forward (tandem's row-invariant gemm_xwt) and
#     backward (linear_backward: dx and dW), in GFLOP/s next to cblas_sgemm
#     on the same shapes, both as core/ops/gemm.c runs it (single-threaded
#     OpenBLAS on the pool's slices) and with OpenBLAS's own threads;
#   - attention forward and backward at T = 256, 1024, 4096 (B=1, H=8,
#     Hkv=4, hd=64; causal FLOPs), and one decode step's attention.
# It prints a table and, last, one JSON line starting with {"bench":"ops".
# OpenBLAS runs the kernels bench/blas_core.sh picks (the fastest correct
# ones here; printed).  Shared machines are noisy: compare the ratios
# measured side by side in one run, not numbers across runs.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/bench/ops
[ -x "$BIN" ] || { echo "bench/ops.sh: $BIN missing (make bench builds it)"; exit 1; }
# The binary sets OpenBLAS's thread count itself (1 inside tandem's pool,
# OPS_BENCH_THREADS for the own-threads reference); no environment caps.
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS GOTO_NUM_THREADS
echo "== operators: linear and attention vs OpenBLAS ($(nproc) cores)"
. bench/blas_core.sh
"$BIN" --threads "${OPS_BENCH_THREADS:-2}" --reps "${OPS_BENCH_REPS:-5}"

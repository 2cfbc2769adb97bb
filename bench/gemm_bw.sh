#!/bin/sh
# bench/gemm_bw.sh - the backward products (dx += dy W, dW += dy^T x) beside
# the forward kernel and OpenBLAS on the training shapes of small/medium
# (bench/gemm_bw.c prints the table), OpenBLAS on the kernels
# bench/blas_core.sh picks.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
echo "== backward GEMM vs OpenBLAS"
. bench/blas_core.sh
"$BUILD/bench/gemm_bw" --reps 5 --shape 2048,512,512 --shape 2048,1024,512 --shape 512,2048,1024 \
    --shape 4096,256,256 --shape 1024,512,256 --shape 4096,8,256

#!/bin/sh
# bench/run.sh - every benchmark, as `make bench` runs it: bench/*.sh in
# order (each prints its own table), all with the OpenBLAS kernels
# bench/blas_core.sh picks.  Needs the binaries `make bench` builds
# in $BUILD (default build).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenBLAS at its best for every peer, picked once for all the benchmarks
# (exported: each bench/*.sh sources bench/blas_core.sh and reuses it)
echo "== OpenBLAS kernels for the peers"
. bench/blas_core.sh
failed=""
for b in bench/*.sh; do
    [ "$b" = bench/run.sh ] && continue
    echo
    echo "== bench: $b"
    sh "$b" || failed="$failed $b"
done
if [ -n "$failed" ]; then
    echo "bench: FAILED:$failed"
    exit 1
fi

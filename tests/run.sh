#!/bin/sh
# tests/run.sh - the whole test suite, as `make test` runs it.
#   tests/run.sh              fixtures + unit + MPI + command-level tests
#   tests/run.sh --unit-only  fixtures + unit tests (what asan-test runs)
# Needs the binaries built by `make unit` in $BUILD (default build).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export TANDEM_FIXTURES="$PWD/$BUILD/fixtures"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# One owner of the cores: BLAS threads are managed by tandem's pool.
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
PY=/usr/bin/python3
failed=""
t_start=$(date +%s)

step() { printf '\n== %s\n' "$*"; }

step "PyTorch fixtures"
if ! $PY -c 'import torch, h5py, numpy' 2>/dev/null; then
    echo "tests: PyTorch reference unavailable: /usr/bin/python3 cannot import torch, h5py and numpy"
    echo "tests: install python3-torch python3-h5py python3-numpy (./tandem.sh deps does)"
    exit 1
fi
mkdir -p "$TANDEM_FIXTURES"
for s in tests/ref/fixtures_*.py; do
    [ -e "$s" ] || continue
    $PY "$s" --out "$TANDEM_FIXTURES" || failed="$failed $s"
done

step "unit tests (Criterion)"
# Criterion runs tests in parallel; each test uses one tandem thread.
if ! TANDEM_THREADS=1 "$BUILD/tests/unit" --jobs 2 --short-filename; then
    failed="$failed unit"
fi

if [ "${1:-}" != "--unit-only" ]; then
    # MPI tests (tests/mpi/*.sh launch the mpi_* binaries with mpirun) and
    # command-level tests (tests/cli/*.sh drive bin/tandem end to end).
    for t in tests/mpi/*.sh tests/cli/*.sh; do
        [ -e "$t" ] || continue
        step "command: $t"
        BUILD=$BUILD sh "$t" || failed="$failed $t"
    done
fi

t_end=$(date +%s)
printf '\n== done in %ss\n' $((t_end - t_start))
if [ -n "$failed" ]; then
    echo "FAILED:$failed"
    exit 1
fi
echo "all tests passed"

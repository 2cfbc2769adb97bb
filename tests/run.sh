#!/bin/sh
# tests/run.sh - the whole test suite, as `make test` runs it.
#   tests/run.sh              fixtures + unit + other kernel paths + MPI +
#                             command-level tests
#   tests/run.sh --unit-only  fixtures + unit tests (what asan-test runs)
# Needs the binaries built by `make unit` in $BUILD (default build) and,
# for the other kernel paths, by `make isa-unit` ($BUILD/avx2, $BUILD/portable).
#
# First it checks that every program a test calls is installed and names
# the missing ones (./tandem.sh deps installs them all).  Every step has a
# bound (TANDEM_TEST_TIMEOUT seconds per script, default 3600; 300 s per
# unit test): a stuck step fails with a line naming it and the suite goes
# on.  Inside the scripts every wait has its own, shorter bound
# (tests/bounds.sh).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export TANDEM_FIXTURES="$PWD/$BUILD/fixtures"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# One owner of the cores: BLAS threads are managed by tandem's pool.
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
PY=/usr/bin/python3
SCRIPT_S=${TANDEM_TEST_TIMEOUT:-3600}
failed=""
times=""
t_start=$(date +%s)
# Wall and CPU seconds of each step.  CPU (user + system of the step's
# processes, from the shell's `times`) does not depend on what else runs
# on the machine, so it ranks the steps even on a busy one.
cpu_f=$(mktemp "${TMPDIR:-/tmp}/tandem-tests-cpu.XXXXXX")
trap 'rm -f "$cpu_f"' EXIT
cpu_s() { awk 'NR == 2 { split($0, f, /[ ms]+/); printf "%d", f[1] * 60 + f[2] + f[3] * 60 + f[4] }' "$cpu_f"; }
mark() { t0=$(date +%s); times >"$cpu_f"; c0=$(cpu_s); }
took() { times >"$cpu_f"; times="$times$(($(date +%s) - t0)) s wall, $(($(cpu_s) - c0)) s CPU: $*
"; }

step() { printf '\n== %s\n' "$*"; }

# ---------------------------------------------------------------- programs
# Every program the test scripts, tests/ref/*.py and their shell snippets
# call (coreutils, grep, sed, mawk and dash are in every Debian; the rest
# are in tandem.sh's TANDEM_PKGS).
PROGRAMS="sh awk sed grep cat cp mv ln rm ls mkdir mktemp readlink dirname tr cut sort wc head tail seq sleep
 date env timeout kill pgrep curl mpirun h5dump objdump $PY"
[ "${1:-}" != "--unit-only" ] || PROGRAMS="sh mkdir date timeout $PY"
missing=""
for p in $PROGRAMS; do
    command -v "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ "${1:-}" = "--unit-only" ] || [ -r /usr/share/games/fortunes/fortunes ] ||
    missing="$missing /usr/share/games/fortunes/fortunes(package fortunes)"
if [ -n "$missing" ]; then
    echo "tests: missing:$missing"
    echo "tests: ./tandem.sh deps installs them (TANDEM_PKGS in tandem.sh)"
    exit 1
fi

step "PyTorch fixtures"
if ! $PY -c 'import torch, h5py, numpy' 2>/dev/null; then
    echo "tests: PyTorch reference unavailable: /usr/bin/python3 cannot import torch, h5py and numpy"
    echo "tests: install python3-torch python3-h5py python3-numpy (./tandem.sh deps does)"
    exit 1
fi
mkdir -p "$TANDEM_FIXTURES"
mark
for s in tests/ref/fixtures_*.py; do
    [ -e "$s" ] || continue
    rc=0
    timeout -k 10 600 $PY "$s" --out "$TANDEM_FIXTURES" || rc=$?
    [ $rc -ne 124 ] || echo "FAIL $s: still running after 600 s (killed)"
    [ $rc -eq 0 ] || failed="$failed $s"
done

took PyTorch fixtures

step "unit tests (Criterion)"
mark
# Criterion runs tests in parallel; each test uses one tandem thread.  Under
# ASan, the runner's own leak (tests/lsan.supp) is suppressed; ours are not.
if ! TANDEM_THREADS=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}" "$BUILD/tests/unit" --jobs 2 --short-filename --timeout 300; then
    failed="$failed unit"
fi
took unit tests

if [ "${1:-}" != "--unit-only" ]; then
    # The kernel suites on the paths -march=native did not compile here
    # (Makefile: isa-unit).  Each compares its path with the same naive FMA
    # chains, bit for bit, so every path agrees with every other.
    for isa in avx2 portable; do
        case $isa in
            avx2) label="AVX2 + FMA"
                  runs=0; grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && runs=1 ;;
            portable) label="portable (x86-64 baseline)"; runs=1 ;;
        esac
        step "kernel suites, $label path ($BUILD/$isa)"
        if [ $runs = 0 ]; then
            echo "tests: $label path skipped: this CPU has no AVX2 or no FMA"
            continue
        fi
        bin=$BUILD/$isa/tests/kernels
        if [ ! -x "$bin" ]; then
            echo "FAIL $bin missing (make isa-unit builds it)"
            failed="$failed $isa-kernels"
            continue
        fi
        # the build holds only its ISA's instructions: no 512-bit registers,
        # masks or VNNI dot products in the AVX2 path, no 256-bit ones either
        # in the portable one
        case $isa in
            avx2) beyond='%zmm|%k[1-7]|vpdpbusd|vpdpwssd|vpdpbssd|vdpbf16ps|vcvtne2ps2bf16' ;;
            portable) beyond='%ymm|%zmm|vfmadd' ;;
        esac
        if ! objdump -d --no-show-raw-insn "$bin" >"$BUILD/$isa/kernels.dis"; then
            echo "FAIL $bin: objdump could not disassemble it"
            failed="$failed $isa-isa"
        else
            n_beyond=$(grep -cE "$beyond" "$BUILD/$isa/kernels.dis" || true)
            if [ "$n_beyond" != 0 ]; then
                echo "FAIL $bin: $n_beyond instructions beyond the $label ISA ($beyond)"
                failed="$failed $isa-isa"
            fi
        fi
        mark
        TANDEM_THREADS=1 "$bin" --jobs 2 --short-filename --timeout 300 || failed="$failed $isa-kernels"
        took "kernel suites, $isa"
    done

    # MPI tests (tests/mpi/*.sh launch the mpi_* binaries with mpirun) and
    # command-level tests (tests/cli/*.sh drive bin/tandem end to end).
    for t in tests/mpi/*.sh tests/cli/*.sh; do
        [ -e "$t" ] || continue
        step "command: $t"
        rc=0
        mark
        BUILD=$BUILD timeout -k 30 "$SCRIPT_S" sh "$t" || rc=$?
        [ $rc -ne 124 ] || echo "FAIL $t: still running after $SCRIPT_S s (killed; TANDEM_TEST_TIMEOUT)"
        [ $rc -eq 0 ] || failed="$failed $t"
        took "$t"
    done
fi

t_end=$(date +%s)
if [ -n "$times" ]; then
    # The budget is 20 minutes on CI's 2 cores: the slowest scripts first.
    step "seconds per step (slowest first)"
    printf '%s' "$times" | sort -rn | head -20
fi
printf '\n== done in %ss\n' $((t_end - t_start))
if [ -n "$failed" ]; then
    echo "FAILED:$failed"
    exit 1
fi
echo "all tests passed"

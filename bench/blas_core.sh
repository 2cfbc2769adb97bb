# bench/blas_core.sh - sourced (after cd to the repository) by every
# benchmark that runs OpenBLAS: PyTorch's matmul (bench/train.sh,
# bench/infer.sh), cblas_sgemm next to tandem's kernels (bench/ops.sh,
# bench/gemm_bw.sh, bench/infer.sh's membw) and tandem's own GEMM rate at
# start-up (every `tandem train`).  It exports OPENBLAS_CORETYPE, the
# fastest OpenBLAS kernel family that computes correctly on this CPU
# (bench/blas_core.py tries several, each in a subprocess with the variable
# set, with a checked sgemm, and prints the table), and prints the one it
# uses.  OpenBLAS's own detection can be far off (Debian's 0.3.21 runs
# Prescott SSE3 kernels on some AVX-512 CPUs): a peer on the wrong kernels
# makes tandem look faster than it is.
#
# BENCH_BLAS (environment): auto (default) picks as above; inherit keeps
# the OPENBLAS_CORETYPE of the environment (or OpenBLAS's detection);
# any other value is exported as OPENBLAS_CORETYPE as it is.  The pick is
# exported as BENCH_BLAS_CORE, so benchmarks run by bench/run.sh (or one
# from another) reuse it instead of probing again.  Sets BLAS_CORE, the name
# OpenBLAS reports for the kernels in use (openblas_get_corename), and
# BLAS_CORE_NOTE, how they were chosen.
_bc_py=${PYTHON:-/usr/bin/python3}
_bc_env=${OPENBLAS_CORETYPE:-}
if [ -n "${BENCH_BLAS_CORE:-}" ]; then
    OPENBLAS_CORETYPE=$BENCH_BLAS_CORE
    export OPENBLAS_CORETYPE
    BLAS_CORE_NOTE="picked earlier in this run (bench/blas_core.sh)"
else
    case ${BENCH_BLAS:-auto} in
        auto)
            if BENCH_BLAS_CORE=$("$_bc_py" bench/blas_core.py); then
                OPENBLAS_CORETYPE=$BENCH_BLAS_CORE
                export OPENBLAS_CORETYPE BENCH_BLAS_CORE
                BLAS_CORE_NOTE="the fastest correct kernel family here (bench/blas_core.py; the environment had ${_bc_env:-none})"
            else
                echo "bench: no OpenBLAS kernel family computes correctly here (bench/blas_core.py)"
                exit 1
            fi ;;
        inherit)
            BLAS_CORE_NOTE="inherited (BENCH_BLAS=inherit): OPENBLAS_CORETYPE ${_bc_env:-unset}" ;;
        *)
            OPENBLAS_CORETYPE=$BENCH_BLAS
            export OPENBLAS_CORETYPE
            BLAS_CORE_NOTE="BENCH_BLAS=$BENCH_BLAS" ;;
    esac
fi
BLAS_CORE=$("$_bc_py" -c '
import ctypes
f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
f.restype = ctypes.c_char_p
print(f().decode())' 2>/dev/null || echo unknown)
echo "   OpenBLAS kernels: $BLAS_CORE (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}: $BLAS_CORE_NOTE)"

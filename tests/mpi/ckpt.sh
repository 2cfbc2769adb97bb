#!/bin/sh
# tests/mpi/ckpt.sh - the resharding matrix of SPEC section 4 under mpirun.
#
# build/tests/mpi_ckpt matrix-write saves three small models (one with a dense
# layer, shared experts and an untied head; one tied, so pipeline stages hold
# a tied copy; one with the HF families' biases, q/k norms and gated shared
# expert) from every (dp, tp, pp, ep) layout of 1, 2 and 4 ranks that
# divides them, in float32 and some in bfloat16 / float16, weights plus
# synthetic AdamW moments plus per-rank RNG rows.  matrix-read then loads
# every file under every layout of 1, 2 and 4 ranks and compares weights,
# moments and trainer state bit for bit with what was saved; finally a
# corrupt copy must be refused by every rank with the same message and no
# weights left behind.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
BIN=$BUILD/tests/mpi_ckpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 TANDEM_THREADS=1
MPI="bounded 600 mpirun --oversubscribe -np"
[ -x "$BIN" ] || { echo "ckpt.sh: $BIN missing (make unit builds it)"; exit 1; }
D=$(mktemp -d /tmp/tandem-ckpt-mpi.XXXXXX)
trap 'rm -rf "$D"' EXIT
fail=0
t0=$(date +%s)
for np in 1 2 4; do
    $MPI $np "$BIN" matrix-write "$D" || { echo "ckpt.sh: FAIL: matrix-write at np=$np"; fail=1; }
done
for np in 4 2 1; do
    $MPI $np "$BIN" matrix-read "$D" || { echo "ckpt.sh: FAIL: matrix-read at np=$np"; fail=1; }
done
# h5dump reads a file written by 4 ranks
f=$(ls "$D"/A_w4_*f32.h5 | head -1)
if ! bounded 60 h5dump -H "$f" >/dev/null; then echo "ckpt.sh: FAIL: h5dump cannot read $f"; fail=1; fi
echo "ckpt.sh: $(ls "$D"/*.h5 | wc -l) checkpoints, $(( $(date +%s) - t0 )) s"
[ $fail = 0 ] && echo "ckpt.sh: ok" || { echo "ckpt.sh: FAILED"; exit 1; }

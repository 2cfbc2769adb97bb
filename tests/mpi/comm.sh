#!/bin/sh
# tests/mpi/comm.sh - comm/ collectives cut into MPI calls of a forced,
# tiny chunk limit give what one call gives (build/tests/mpi_comm,
# tests/mpi_comm.c), on 2 and 3 ranks.  Every run is bounded (timeout) and
# a hang fails with a line naming it.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MPI="mpirun --oversubscribe --allow-run-as-root"
BIN=$BUILD/tests/mpi_comm
[ -x "$BIN" ] || { echo "FAIL $BIN missing (make unit builds it)"; exit 1; }
command -v timeout >/dev/null || { echo "FAIL timeout (coreutils) is not installed"; exit 1; }
fail=0
for np in 2 3; do
    rc=0
    timeout 120 $MPI -np $np "$BIN" || rc=$?
    if [ "$rc" -eq 124 ]; then echo "FAIL mpi_comm np=$np: no exit within 120 s"; fail=1
    elif [ "$rc" -ne 0 ]; then echo "FAIL mpi_comm np=$np (exit $rc)"; fail=1; fi
done
exit $fail

#!/bin/sh
# tests/mpi/vision.sh - the vision tower and projector under tp = 2 equal
# one process (build/tests/mpi_vision, tests/mpi_vision.c): image vectors
# and every vision gradient.  Bounded; ~2 s.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
bounded 120 mpirun --oversubscribe --allow-run-as-root -np 2 "$BUILD/tests/mpi_vision" ||
    { echo "FAIL mpi_vision np=2"; exit 1; }

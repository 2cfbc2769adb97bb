#!/bin/sh
# bench/ckpt.sh - checkpoint save and load bandwidth next to dd on the same
# disk (run by bench/run.sh, i.e. `make bench`).
#
# build/bench/ckpt_bench saves a >= 1 GiB single-process checkpoint with
# ckpt_save (temporary name, Fletcher32 chunks, fsync, rename) and loads it
# back with ckpt_load after dropping it from the page cache; between its
# runs it runs dd on the same directory: a write of as many 8 MiB blocks with
# conv=fsync, and a read after dropping that file from the page cache
# (iflag=nocache count=0).  Interleaving gives both the same disk and the
# same machine load; each side keeps its best of CKPT_BENCH_REPS (5) runs.
# Target: tandem at >= 70% of dd for both.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${CKPT_BENCH_DIR:-$BUILD/bench_ckpt}
REPS=${CKPT_BENCH_REPS:-5}
GIB=${CKPT_BENCH_GIB:-1}
BIN=$BUILD/bench/ckpt_bench
[ -x "$BIN" ] || { echo "bench/ckpt.sh: $BIN missing (make bench builds it)"; exit 1; }
mkdir -p "$DIR"
trap 'rm -f "$DIR/dd.bin" "$DIR/bench.h5" "$DIR/bench.h5.tmp"' EXIT INT TERM

echo "== checkpoint save / load vs dd on $(df -P "$DIR" | awk 'NR == 2 { print $1 " (" $6 ")" }'), $DIR"
out=$("$BIN" "$DIR" --gib "$GIB" --reps "$REPS")
echo "$out" | grep -v '^ckpt_bench ' | sed 's/^/  /'
echo "$out" | grep '^ckpt_bench ' | tr ' ' '\n' | awk -F= -v reps="$REPS" '
    NF == 2 { v[$1] = $2 }
    END {
        s = v["save_gbs"]; w = v["dd_write_gbs"]; l = v["load_gbs"]; r = v["dd_read_gbs"]
        printf "\n  %-34s %9s %9s %7s\n", "GB/s, best of " reps, "tandem", "dd", "ratio"
        printf "  %-34s %9.3f %9.3f %6.0f%%  %s\n", "save (write, fsync, rename)", s, w, 100 * s / w, (s >= 0.7 * w ? "ok" : "below the 70% target")
        printf "  %-34s %9.3f %9.3f %6.0f%%  %s\n", "load (cold page cache, checksums)", l, r, 100 * l / r, (l >= 0.7 * r ? "ok" : "below the 70% target")
    }'

#!/bin/sh
# tests/cli/ckpt_crash.sh - crash safety of checkpoint saves (SPEC section 4).
#
# build/tests/mpi_ckpt loop saves step_N.h5 (weights + AdamW moments, ~30 MB)
# over and over into a run directory, pointing latest at each finished file
# and keeping the newest 2, as the trainer does.  It is killed with SIGKILL
# at random moments, 15 times (each restart continues after latest; every
# third kill as soon as a save has begun).  After
# every kill: latest, if it exists, names a file `tandem ckpt verify`
# accepts (every chunk checksummed) and that loads with its optimizer state;
# every other finished step_*.h5 (the previous checkpoint) verifies too; a
# killed save leaves at most a step_*.h5.tmp behind.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=bin/tandem
TOOL=$BUILD/tests/mpi_ckpt
KILLS=${CKPT_CRASH_KILLS:-15}
for b in "$T" "$TOOL"; do [ -x "$b" ] || { echo "ckpt_crash.sh: $b missing (make unit)"; exit 1; }; done
W=$(mktemp -d /tmp/tandem-ckpt-crash.XXXXXX)
trap 'rm -rf "$W"' EXIT
D=$W/run
CFG='{"vocab_size":1024,"hidden_size":256,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"moe_intermediate_size":256,"num_local_experts":4,"num_experts_per_tok":2,"max_position_embeddings":64}'
fails=0
mid_save=0
for i in $(seq "$KILLS"); do
    rm -f "$D"/*.tmp   # so that a .tmp after the kill is this run's (prune's cleanup: tests/test_ckpt.c)
    $TOOL loop "$D" --config "$CFG" --keep 2 >"$W/loop.log" 2>&1 &
    pid=$!
    # Odd runs die at a random moment from the start (set-up, the first
    # save); even runs once a save has finished, at a random moment of the
    # next ones (a save, its rename, latest, prune).  Every third run dies
    # as soon as a save's .tmp file is there, so that some kills land
    # inside a save however fast saves are on this machine.
    saved_one() { grep -q saved "$W/loop.log"; }
    saving() { ls "$D"/*.tmp >/dev/null 2>&1; }
    if [ $((i % 2)) -eq 0 ] && ! wait_until 120 "kill $i: a finished save of the loop (pid $pid)" saved_one; then
        fails=$((fails + 1))
    fi
    if [ $((i % 3)) -eq 0 ]; then
        wait_until 120 "kill $i: a save under way (a .tmp in $D)" saving || fails=$((fails + 1))
    else
        sleep "$(awk -v s="$i" 'BEGIN { srand(s * 7919); printf "%.2f", 0.1 + 1.4 * rand() }')"
    fi
    kill -9 $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    ls "$D"/*.tmp >/dev/null 2>&1 && mid_save=$((mid_save + 1))
    saved=$(grep -c saved "$W/loop.log" || true)
    if [ -L "$D/latest" ]; then
        if ! bounded 120 $T ckpt verify "$D" >"$W/v" 2>&1; then
            echo "FAIL kill $i: latest -> $(readlink "$D/latest") does not verify:"; cat "$W/v"; fails=$((fails + 1))
        fi
        if ! bounded 120 $TOOL load "$D" --moments >"$W/v" 2>&1; then
            echo "FAIL kill $i: latest does not load:"; cat "$W/v"; fails=$((fails + 1))
        fi
    elif [ $((i % 2)) -eq 0 ]; then
        echo "FAIL kill $i: no latest although a save had finished"; fails=$((fails + 1))
    fi
    for f in "$D"/step_*.h5; do
        [ -e "$f" ] || continue
        bounded 120 $T ckpt verify "$f" >/dev/null 2>&1 || { echo "FAIL kill $i: $f (finished) does not verify"; fails=$((fails + 1)); }
    done
    echo "kill $i: $saved saves this run, latest -> $(readlink "$D/latest" 2>/dev/null || echo none), files: $(cd "$D" 2>/dev/null && ls | tr '\n' ' ')"
done
echo "ckpt_crash.sh: $KILLS kills, $mid_save of them in the middle of a save"
[ $mid_save -ge 1 ] || { echo "FAIL no kill landed inside a save (the test proves nothing)"; fails=$((fails + 1)); }
if [ $fails -ne 0 ]; then echo "ckpt_crash.sh: $fails FAILED"; exit 1; fi
echo "ckpt_crash.sh: all passed"

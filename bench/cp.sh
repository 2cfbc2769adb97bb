#!/bin/sh
# bench/cp.sh - context parallelism in training (run key cp, docs/scaling.md):
# tokens/s and memory per rank at seq_len 16k and 32k, cp = 1, 2, 4.
# A small model (hidden 64, 2 layers, 8 heads of 8, 4 experts top-2) so that
# attention dominates at these lengths; 2 steps, the second timed.
# cp = 1 runs 2 threads, each cp rank 1 (4 ranks oversubscribe the 2
# cores).  On this 2-core machine cp ranks share the cores one process
# would use: the point is memory per rank and that the loss is one
# process's (printed next to cp=1's), not speed.  About 27 minutes on a
# loaded machine (a 32k step of one process takes ~160 s there).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
T=$PWD/bin/tandem
PY=/usr/bin/python3
MPI="mpirun --oversubscribe --allow-run-as-root"
W=$(mktemp -d /tmp/tandem-bench-cp.XXXXXX)
trap 'rm -rf "$W"' EXIT
DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" 2>/dev/null
M='model={"vocab_size":256,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":4,"moe_intermediate_size":64,"num_local_experts":4,"num_experts_per_tok":2,"max_position_embeddings":32768}'
for T_LEN in 16384 32768; do
    for cp in 1 2 4; do
        A="data=$DATA steps=2 micro_batch=1 grad_accum=1 seq_len=$T_LEN eval_every=0 save_every=0 shuffle=false threads=$((cp == 1 ? 2 : 1))"
        if [ $cp = 1 ]; then $T train "$M" $A out_dir="$W/t${T_LEN}_cp$cp" >"$W/log" 2>&1
        else $MPI -np $cp $T train "$M" $A cp=$cp out_dir="$W/t${T_LEN}_cp$cp" >"$W/log" 2>&1; fi ||
            { cat "$W/log"; exit 1; }
    done
done
$PY - "$W" <<'PYEOF'
import json, sys
w = sys.argv[1]
print("training, seq_len x cp: tokens/s (step 2), loss vs cp=1, memory of rank 0 (MiB)")
print("%7s %3s | %9s | %12s %9s | %10s %10s" % ("seq_len", "cp", "tok/s", "loss", "rel", "act arena", "peak alloc"))
for t in (16384, 32768):
    ref = None
    for cp in (1, 2, 4):
        r = [json.loads(l) for l in open("%s/t%d_cp%d/metrics.jsonl" % (w, t, cp))][-1]
        ref = ref if ref is not None else r["loss"]
        print("%7d %3d | %9.0f | %12.9f %9.1e | %10.1f %10.1f" % (t, cp, r["tokens_per_s"], r["loss"],
              abs(r["loss"] - ref) / ref, r["act_mem_mb"], r["peak_mem_mb"]))
print("(2 cores shared by all ranks, and by other jobs: tok/s is indicative only)")
PYEOF

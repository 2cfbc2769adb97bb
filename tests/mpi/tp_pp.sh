#!/bin/sh
# tests/mpi/tp_pp.sh - tensor and pipeline parallelism equal one process.
#
# Tiny config (4 layers), shuffle=false, micro_batch 4 x grad_accum 4 so the
# 1F1B schedule has micro-batches to overlap.  Every layout's 10-step losses
# must equal the single-process run within 1e-5 relative.  Checkpoint
# matrix: saved at (tp=2, pp=2) and at (dp=2, ep=2, tp=2), loaded and
# continued at (1), (tp=4), (pp=4) and (dp=4, ep=4) with the next step's
# loss equal to the uninterrupted run's.  Also tied embeddings, dense and
# shared experts across stages, with recompute and ZeRO.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=bin/tandem
PY=/usr/bin/python3
MPI="bounded 600 mpirun --oversubscribe --allow-run-as-root"
W=$(mktemp -d /tmp/tandem-tppp-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" 2>/dev/null
A="configs/tiny.json data=$DATA shuffle=false steps=10 save_every=0 threads=1 micro_batch=4 grad_accum=4"

compare() {   # compare REF DIR LABEL: per-step losses within 1e-5 relative
    $PY - "$1" "$2" "$3" <<'EOF' || fail=1
import json, sys
ref, run, label = sys.argv[1:4]
f = lambda d: [json.loads(l) for l in open(d + "/metrics.jsonl")]
a, b = f(ref), f(run)
assert len(a) == len(b), (len(a), len(b))
rel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
extra = " bubble %.2f" % b[-1]["pp_bubble"] if "pp_bubble" in b[-1] else ""
print("%s %-34s 10-step losses max rel diff %.2e%s" % ("ok  " if rel <= 1e-5 else "FAIL", label, rel, extra))
sys.exit(0 if rel <= 1e-5 else 1)
EOF
}

run() {   # run NP OUT ARGS...
    np=$1; out=$2; shift 2
    if [ "$np" = 1 ]; then bounded 600 $T train "$@" out_dir="$out" >"$W/log" 2>&1
    else $MPI -np "$np" $T train "$@" out_dir="$out" >"$W/log" 2>&1; fi || { echo "FAIL run $*"; cat "$W/log"; fail=1; }
}

run 1 "$W/ref" $A
for layout in "2 tp=2" "4 tp=4" "2 pp=2" "4 pp=4" "4 tp=2 pp=2" "4 dp=2 tp=2" "4 dp=2 ep=2 tp=2" "4 dp=2 pp=2"; do
    set -- $layout
    np=$1; shift
    d="$W/$(echo "$*" | tr ' =' '__')"
    run "$np" "$d" $A "$@"
    compare "$W/ref" "$d" "$*"
done

# tied embeddings across stages, a dense first layer and shared experts
M='model={"vocab_size":256,"hidden_size":64,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":4,"moe_intermediate_size":64,"num_local_experts":4,"tie_word_embeddings":true,"first_k_dense_replace":1,"intermediate_size":96,"n_shared_experts":1,"max_position_embeddings":256}'
run 1 "$W/tref" $A "$M"
for layout in "2 pp=2" "4 pp=2 tp=2 recompute=full" "3 pp=3 pp_layers=2,1,1 recompute=selective" "4 pp=2 dp=2 zero=1"; do
    set -- $layout
    np=$1; shift
    d="$W/t_$(echo "$*" | tr ' =,' '___')"
    run "$np" "$d" $A "$M" "$@"
    compare "$W/tref" "$d" "tied+dense+shared $*"
done

# checkpoint matrix: save at step 10 of 12, continue elsewhere
R="configs/tiny.json data=$DATA shuffle=false steps=12 threads=1 micro_batch=4 grad_accum=4"
run 4 "$W/s1" $R save_every=10 keep_last=0 tp=2 pp=2
run 4 "$W/s2" $R save_every=10 keep_last=0 dp=2 ep=2 tp=2
for src in s1 s2; do
    for layout in "1" "4 tp=4" "4 pp=4" "4 dp=4 ep=4"; do
        set -- $layout
        np=$1; shift
        d="$W/${src}_$(echo "x $*" | tr ' =' '__')"
        run "$np" "$d" $R resume="$W/$src/step_00000010.h5" "$@"
        $PY - "$W/$src" "$d" "$src -> ${*:-1 process}" <<'EOF' || fail=1
import json, sys
full, run, label = sys.argv[1:4]
f = lambda d: {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")}
a, b = f(full), f(run)
rel = abs(a[11] - b[11]) / a[11]
print("%s resume %-22s step 11 loss %.9g vs uninterrupted %.9g (rel %.1e)"
      % ("ok  " if rel <= 1e-5 else "FAIL", label, b[11], a[11], rel))
sys.exit(0 if rel <= 1e-5 else 1)
EOF
    done
done

[ $fail -eq 0 ] && echo "tp_pp.sh: all passed" || { echo "tp_pp.sh: FAILED"; exit 1; }

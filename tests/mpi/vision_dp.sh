#!/bin/sh
# tests/mpi/vision_dp.sh - training on images (run key images,
# train/image_data.h) under dp = 2 equals one process with the same global
# batch: loss and grad_norm of every step, the AdamW moments of every
# tensor (the vision tower's and projector's included) and the weights
# (tests/ref/run_compare.py).  Each rank takes its own rows of the global
# micro-batch, image rows and text rows alike, and scales its answer
# tokens' gradient by the global count of scored tokens; taking the global
# batch's first examples on both ranks, or the local count, fails it (loss
# rel > 1e-3).  Both data orders: shuffle=false and shuffle=true.  Then
# configs/vision_demo.json itself, run as `make demo-vision` runs it
# (mpirun -np 2 ... dp=2), equals the same config in one process for 3
# steps: the demo's recipe (docs/vision.md) is one process's run.  ~20 s.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
need mpirun timeout || exit 1
BUILD=${BUILD:-build}
T=bin/tandem
PY=/usr/bin/python3
MPI="bounded 300 mpirun --oversubscribe --allow-run-as-root"
W=$(mktemp -d /tmp/tandem-vision-dp-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" 2>/dev/null
bounded 60 $T data images --output "$W/img" --n 40 --seed 5 2>/dev/null
cat >"$W/vlm.json" <<JSON
{
  "model": {
    "vocab_size": 257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "moe_intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "intermediate_size": 64,
    "max_position_embeddings": 128, "image_token_index": 256,
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
  },
  "data": "$DATA", "images": "$W/img", "image_fraction": 0.6,
  "seq_len": 56, "micro_batch": 8, "grad_accum": 2, "steps": 6, "lr": 3e-3, "warmup_steps": 2,
  "seed": 3, "save_every": 0, "eval_every": 0, "threads": 1
}
JSON
# Relative tolerances just above the noise measured here (dp sums float32
# partial gradients in another order): loss 1.6e-8, grad_norm 1.8e-7,
# moments 5.6e-6, weights 1.5e-4; each line prints its noise.  The
# tower's k_proj.bias is left out: its gradient is zero in exact arithmetic
# (a softmax does not see a bias added to every key), so its moments are
# rounding noise (~1e-15) and differ at random.
TOL="--steps 6 --loss-tol 1e-6 --gnorm-tol 1e-6 --moment-tol 3e-5 --weight-tol 1e-3 --skip self_attn/k_proj.bias"
for sh in false true; do
    bounded 120 $T train "$W/vlm.json" shuffle=$sh out_dir="$W/ref_$sh" >"$W/log" 2>&1 ||
        { cat "$W/log"; echo "FAIL one process, shuffle=$sh"; fail=1; continue; }
    if ! $MPI -np 2 $T train "$W/vlm.json" shuffle=$sh dp=2 out_dir="$W/dp_$sh" >"$W/log" 2>&1; then
        cat "$W/log"; echo "FAIL dp=2, shuffle=$sh: the run failed"; fail=1; continue
    fi
    $PY tests/ref/run_compare.py "$W/ref_$sh" "$W/dp_$sh" "images dp=2 shuffle=$sh" $TOL \
        --ckpt "$W/ref_$sh/latest" "$W/dp_$sh/latest" || fail=1
done

# the demo's config as the demo-vision target runs it (Makefile), 3 steps
D="configs/vision_demo.json data=$DATA images=$W/img steps=3 log_every=1 save_every=0"
if ! bounded 120 $T train $D out_dir="$W/demo_ref" >"$W/log" 2>&1; then
    cat "$W/log"; echo "FAIL configs/vision_demo.json in one process"; fail=1
elif ! $MPI -np 2 $T train $D dp=2 out_dir="$W/demo_dp" >"$W/log" 2>&1; then
    cat "$W/log"; echo "FAIL configs/vision_demo.json under dp=2: the run failed"; fail=1
else
    $PY tests/ref/run_compare.py "$W/demo_ref" "$W/demo_dp" "configs/vision_demo.json dp=2" --steps 3 \
        --loss-tol 1e-6 --gnorm-tol 1e-6 --moment-tol 3e-5 --weight-tol 1e-3 --skip self_attn/k_proj.bias \
        --ckpt "$W/demo_ref/latest" "$W/demo_dp/latest" || fail=1
fi
exit $fail

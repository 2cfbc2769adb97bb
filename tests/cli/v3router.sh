#!/bin/sh
# tests/cli/v3router.sh - the DeepSeek-V3 router in training
# (configs/tiny_v3router.json: sigmoid scores, 4 groups of 2 with 2 kept,
# e_score_correction_bias, routed_scaling_factor, a shared expert, a dense
# first layer): the auxiliary-loss-free bias update follows its rule
# exactly (bias = sum over steps of rate * sign(mean load - load), from the
# loads metrics.jsonl reports), the bias is float32 state in the checkpoint
# (replicated, AdamW moments untouched), a run resumed from step 5 matches
# the uninterrupted one bit for bit (loss, grad_norm, every tensor, the bias
# and the moments), dp x ep, dp x ep x tp and pp runs move the bias as one
# process with the same gradients, and misused keys are refused in one line.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=bin/tandem
PY=/usr/bin/python3
MPI="bounded 300 mpirun --oversubscribe --allow-run-as-root"
export TANDEM_THREADS=${TANDEM_THREADS:-2} OPENBLAS_NUM_THREADS=1
W=$(mktemp -d /tmp/tandem-v3router-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }
expect_fail() {   # DESCRIPTION PATTERN CMD...: non-zero exit, one stderr line matching PATTERN
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    if [ "$(wc -l <"$W/err")" -ne 1 ] || ! grep -q -F -- "$pat" "$W/err"; then
        bad "$desc: want one line with '$pat', got:"; cat "$W/err"; return
    fi
    ok "$desc: $(cat "$W/err")"
}

DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" 2>/dev/null
A="configs/tiny_v3router.json data=$DATA steps=10 router_bias_update_rate=0.01"

# ---------------------------------------------------------------- refusals
expect_fail "bias update without a correction bias" 'needs a router with a correction bias' \
    $T train configs/tiny.json data=$DATA router_bias_update_rate=0.01
expect_fail "sequence-wise loss on a softmax router" 'needs a sigmoid router' \
    $T train configs/tiny.json data=$DATA router_seq_aux_loss_coef=0.01
expect_fail "unknown topk_method" '"topk_method" "group_limited_greedy" is not supported' \
    $T train $A 'model={"num_local_experts":8,"scoring_func":"sigmoid","topk_method":"group_limited_greedy"}'
expect_fail "negative rate" 'router_bias_update_rate' $T train $A router_bias_update_rate=-1

# ---------------------------------------------------------------- the rule, the state
bounded 300 $T train $A save_every=5 keep_last=0 out_dir="$W/full" 2>"$W/log" || { bad "train"; cat "$W/log"; }
$PY - "$W/full" 0.01 <<'EOF2' && ok "bias = sum of rate * sign(mean load - load) over the 10 steps, float32, replicated, moments 0; loss falls" || fail=1
import json, sys
import h5py, numpy as np
d, rate = sys.argv[1], np.float32(sys.argv[2])
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, 11))
assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, (rows[0]["loss"], rows[-1]["loss"])
assert all(r["seq_aux"] > 0 for r in rows), "seq_aux missing"
f = h5py.File(d + "/step_00000010.h5", "r")
moved = 0
for l, _ in enumerate(rows[0]["expert_load"]):
    name = "model/layers/%d/mlp/gate.e_score_correction_bias" % l
    if rows[0]["expert_load"][l] is None:
        assert name not in f, name + " on a dense layer"
        continue
    ds = f[name]
    assert ds.dtype == np.float32 and ds.shape == (8,), (ds.dtype, ds.shape)
    assert ds.attrs["partition"] in (b"replicated", "replicated"), ds.attrs["partition"]
    want = np.zeros(8, np.float32)
    for r in rows:
        load = np.array(r["expert_load"][l], np.float64)
        assert load.sum() == 8 * 32 * 2, load.sum()   # every token's k routes, one micro-batch
        want = want + rate * np.sign(load.mean() - load).astype(np.float32)
    got = ds[:]
    assert (got == want).all(), (l, got, want)
    moved += int((got != 0).any())
    for k in ("exp_avg", "exp_avg_sq"):
        assert not f["optimizer/%s/%s" % (k, name)][:].any(), k + " of the bias is not 0"
n_moe = sum(x is not None for x in rows[0]["expert_load"])
assert n_moe == 3 and moved == n_moe, "the bias moved in %d of %d MoE layers" % (moved, n_moe)
EOF2

# ---------------------------------------------------------------- exact resume
bounded 300 $T train $A out_dir="$W/res" resume="$W/full/step_00000005.h5" 2>/dev/null || bad "resume"
$PY - "$W" <<'EOF2' && ok "resume after step 5: steps 6-10 bit-identical (loss, grad_norm, seq_aux, loads)" || fail=1
import json, sys
w = sys.argv[1]
f = lambda p: {json.loads(l)["step"]: json.loads(l) for l in open(p)}
u, r = f(w + "/full/metrics.jsonl"), f(w + "/res/metrics.jsonl")
assert sorted(r) == list(range(6, 11)), sorted(r)
for s in range(6, 11):
    for k in ("loss", "grad_norm", "seq_aux", "expert_load"):
        assert u[s][k] == r[s][k], (s, k, u[s][k], r[s][k])
EOF2
if $T ckpt diff "$W/full/step_00000010.h5" "$W/res/latest" >"$W/diff" &&
    awk 'NR>1 && ($2+0 != 0) {exit 1}' "$W/diff" && grep -q e_score_correction_bias "$W/diff"; then
    ok "resume: final weights, correction biases and moments bit-identical"
else bad "resume: final checkpoints differ"; cat "$W/diff"; fi

# ---------------------------------------------------------------- parallel layouts
# dp, ep and tp change no route in these 3 steps (row-invariant forward;
# the loads are summed over dp; pp stages gather them for metrics), so the
# bias moves bit for bit as in one process; the loss agrees to the float32
# noise of the reductions: measured 7.8e-9 relative (dp=2 ep=2), tolerance
# 5e-8.  Each layout's checkpoint after step 1 (warmup: the same lr as a
# 1-step run's) is held tensor by tensor against one process by
# tests/ref/run_compare.py (exp_avg = (1 - beta1) g: the gradient of every
# tensor, the router's with the sequence-wise loss, here at 0.1 so that its
# part of the router gradient is large), with tests/mpi/tp_pp.sh's
# tolerances.
P="$A threads=1 micro_batch=8 router_seq_aux_loss_coef=0.1 steps=3 save_every=1 keep_last=0"
bounded 300 $T train $P out_dir="$W/p1" 2>/dev/null || bad "1-process run"
for lay in "2 dp=2 ep=2" "4 dp=2 ep=2 tp=2" "2 pp=2"; do
    np=${lay%% *}; args=${lay#* }; o=$W/p_$(echo "$args" | tr ' =' '__')
    if $MPI -np "$np" $T train $P $args out_dir="$o" >"$W/log" 2>&1; then
        $PY - "$W/p1" "$o" <<'EOF2' && ok "$args: bias and loads bit-identical to one process, loss within 5e-8" || fail=1
import json, sys
import h5py
a, b = sys.argv[1], sys.argv[2]
ra = [json.loads(l) for l in open(a + "/metrics.jsonl")]
rb = [json.loads(l) for l in open(b + "/metrics.jsonl")]
assert len(ra) == len(rb) == 3
for x, y in zip(ra, rb):
    assert abs(x["loss"] - y["loss"]) <= 5e-8 * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
    assert x["expert_load"] == y["expert_load"], x["step"]
print("     loss rel diff max %.2g" % max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(ra, rb)))
fa, fb = h5py.File(a + "/latest", "r"), h5py.File(b + "/latest", "r")
for l, load in enumerate(ra[0]["expert_load"]):
    if load is None:
        continue
    n = "model/layers/%d/mlp/gate.e_score_correction_bias" % l
    assert (fa[n][:] == fb[n][:]).all(), (n, fa[n][:], fb[n][:])
EOF2
        $PY tests/ref/run_compare.py "$W/p1" "$o" "$args" --steps 3 --loss-tol 5e-8 --gnorm-tol 2e-5 \
            --ckpt "$W/p1/step_00000001.h5" "$o/step_00000001.h5" --moment-tol 1e-5 --weight-tol 3e-3 || fail=1
    else bad "$args run"; cat "$W/log"; fi
done

exit $fail

#!/bin/sh
# tests/cli/rl.sh - tandem rl: GRPO learns, and rollout and trainer agree
# bit for bit on every step (logprob_diff_max == 0, routing_mismatch == 0),
# colocated and with split rollout ranks; weights reach the rollout side
# bitwise; a reward command that crashes, hangs or prints garbage is
# reported and the run continues (or stops, as configured).
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
T=$PWD/bin/tandem
TB="bounded 600 $T"   # every run bounded (tests/bounds.sh)
PY=/usr/bin/python3
MPI="bounded 600 mpirun --oversubscribe --allow-run-as-root"
W=$(mktemp -d /tmp/tandem-rl-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
C="configs/rl_vowels.json"

check() {   # check DIR LABEL [MIN_STEPS]: exactness on every step, weights_equal
    $PY - "$1" "$2" "${3:-1}" <<'EOF' || fail=1
import json, sys
d, label, min_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
rows = [r for r in rows if "skipped" not in r]
assert len(rows) >= min_steps, (len(rows), min_steps)
need = {"reward_mean", "reward_std", "kl", "clip_frac", "rollout_tokens_per_s", "train_tokens_per_s",
        "sync_s", "policy_version", "logprob_diff_max", "routing_mismatch"}
for r in rows:
    assert need <= set(r), need - set(r)
    assert r["logprob_diff_max"] == 0.0, r
    assert r["routing_mismatch"] == 0.0, r
    assert r["weights_equal"] is True, r
print("ok   %s: %d steps, logprob_diff_max 0 and routing_mismatch 0 on every step" % (label, len(rows)))
EOF
}

# ---------------------------------------------------------------- it learns
$TB rl $C out_dir="$W/v" steps=30 >"$W/log" 2>&1 || { echo "FAIL rl run"; cat "$W/log"; fail=1; }
check "$W/v" "colocated, 1 process" 30
$PY - "$W/v" <<'EOF' || fail=1
import json, sys
r = [json.loads(l)["reward_mean"] for l in open(sys.argv[1] + "/metrics.jsonl")]
a, b = sum(r[:5]) / 5, sum(r[-5:]) / 5
print("%s vowels: reward_mean %.4f over the first 5 steps -> %.4f over the last 5 (x%.1f, want >= 5)"
      % ("ok  " if b >= 5 * a else "FAIL", a, b, b / max(a, 1e-9)))
sys.exit(0 if b >= 5 * a else 1)
EOF
[ -L "$W/v/latest" ] && echo "ok   checkpoint written after the last step" || { echo "FAIL no checkpoint"; fail=1; }

# ---------------------------------------------------------------- MPI placements
$MPI -np 2 $T rl $C out_dir="$W/c2" steps=4 threads=1 >"$W/log" 2>&1 || { echo "FAIL colocated np=2"; cat "$W/log"; fail=1; }
check "$W/c2" "colocated, 2 ranks" 4
$MPI -np 3 $T rl $C out_dir="$W/s3" steps=4 threads=1 rollout_ranks=1 kl_coef=0.05 >"$W/log" 2>&1 \
    || { echo "FAIL split np=3"; cat "$W/log"; fail=1; }
check "$W/s3" "split, 2 trainers + 1 rollout rank, KL on (weights synced bitwise each step)" 4
$PY - "$W/s3" <<'EOF' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert all(r["sync_bytes"] > 0 and r["sync_s"] > 0 for r in rows), rows
assert rows[-1]["kl"] > 0, rows[-1]
assert [r["policy_version"] for r in rows] == [0, 2, 4, 6], [r["policy_version"] for r in rows]
print("ok   split: sync of %d bytes per step, kl %.4f, policy versions %s"
      % (rows[0]["sync_bytes"], rows[-1]["kl"], [r["policy_version"] for r in rows]))
EOF

# ---------------------------------------------------------------- rollouts in low precision
# rollout_dtype=int8 / bf16: the engine runs the quantized model, the
# trainer's behaviour log-probabilities are that model's forward, so the
# check stays exactly 0; the float32 policy differs from it
# (quant_logprob_diff_max > 0); the split placement ships the quantized
# weights (fewer bytes than float32's)
$T rl $C out_dir="$W/q8" steps=4 rollout_dtype=int8 >"$W/log" 2>&1 || { echo "FAIL rl rollout_dtype=int8"; cat "$W/log"; fail=1; }
check "$W/q8" "colocated, rollout_dtype=int8" 4
$T rl $C out_dir="$W/qb" steps=2 rollout_dtype=bf16 >"$W/log" 2>&1 || { echo "FAIL rl rollout_dtype=bf16"; cat "$W/log"; fail=1; }
check "$W/qb" "colocated, rollout_dtype=bf16" 2
$MPI -np 3 $T rl $C out_dir="$W/sq" steps=3 threads=1 rollout_ranks=1 rollout_dtype=int8 >"$W/log" 2>&1 \
    || { echo "FAIL split rollout_dtype=int8"; cat "$W/log"; fail=1; }
check "$W/sq" "split, 2 trainers + 1 rollout rank, rollout_dtype=int8 (quantized weights synced bitwise)" 3
$PY - "$W" <<'EOF' || fail=1
import json, sys
w = sys.argv[1]
rows = lambda d: [json.loads(l) for l in open(w + "/" + d + "/metrics.jsonl")]
q8, sq, s3 = rows("q8"), rows("sq"), rows("s3")
assert all(r["rollout_dtype"] == "int8" and r["quant_logprob_diff_max"] > 0 for r in q8 + sq), q8
assert all(r["rollout_dtype"] == "f32" and r["quant_logprob_diff_max"] == 0 for r in s3), s3
assert sq[0]["sync_bytes"] < 0.4 * s3[0]["sync_bytes"], (sq[0]["sync_bytes"], s3[0]["sync_bytes"])
print("ok   int8: the f32 policy is %.3g from the behaviour (quantized) one at most; split sync %d bytes vs %d in f32"
      % (max(r["quant_logprob_diff_max"] for r in q8), sq[0]["sync_bytes"], s3[0]["sync_bytes"]))
EOF

# ---------------------------------------------------------------- other tasks
$TB rl $C out_dir="$W/t" steps=3 task=target_length >"$W/log" 2>&1 || { echo "FAIL target_length"; cat "$W/log"; fail=1; }
check "$W/t" "target_length" 3
printf '{"prompt":"Hello: ","id":"a"}\n{"prompt_ids":[72,105,58,32],"id":7}\n' >"$W/p.jsonl"
$TB rl $C out_dir="$W/pf" steps=2 prompts_per_step=2 prompts="$W/p.jsonl" \
    reward_cmd="awk '{print length(\$0) % 7 / 7}'" >"$W/log" 2>&1 || { echo "FAIL prompts+reward_cmd"; cat "$W/log"; fail=1; }
check "$W/pf" "prompts file + reward_cmd" 2

# ---------------------------------------------------------------- bad rewards
for case in "exit 3#exited with status 3" "sleep 30#timed out" "echo hello#is not a number" \
            "head -n 3 | sed s/.*/0.1/#answered 3 rewards"; do
    cmd=${case%%#*}; pat=${case#*#}
    if $TB rl $C out_dir="$W/b" steps=2 reward_cmd="$cmd" reward_timeout=1 >"$W/out" 2>"$W/err" \
        && grep -q "reward_cmd: .*$pat" "$W/err" && [ "$(grep -c '"skipped"' "$W/b/metrics.jsonl")" = 2 ]; then
        echo "ok   reward_cmd '$cmd': $(grep -m1 'error' "$W/err" | sed 's/^tandem: error: //'); steps skipped, exit 0"
    else
        echo "FAIL reward_cmd '$cmd'"; cat "$W/err"; fail=1
    fi
done
if $TB rl $C out_dir="$W/bs" steps=3 reward_cmd="exit 3" reward_on_error=stop >"$W/out" 2>"$W/err"; then
    echo "FAIL reward_on_error=stop exited 0"; fail=1
else
    echo "ok   reward_on_error=stop: $(tail -1 "$W/err")"
fi
if $TB rl $C out_dir="$W/bp" prompts="$W/none.jsonl" >"$W/out" 2>"$W/err"; then echo "FAIL missing prompts"; fail=1
else echo "ok   missing prompts file: $(cat "$W/err")"; fi

[ $fail -eq 0 ] && echo "rl.sh: all passed" || { echo "rl.sh: FAILED"; exit 1; }

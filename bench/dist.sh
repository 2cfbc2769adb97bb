#!/bin/sh
# bench/dist.sh - distributed training and RL on `small`, side by side:
#   np=1 vs np=2 (dp=2): tokens/s and the share of the step in communication;
#   tp=2 vs tp=1 step time; pp=2 bubble against (p-1)/(m+p-1);
#   tandem rl: rollout and train tokens/s, weight sync seconds per step at
#   np=1 (colocated) and np=2 (1 trainer + 1 rollout rank), sync time against
#   bytes / measured MPI broadcast bandwidth.
# On this 2-core machine, ranks share the cores one process would use with
# two threads: these runs show costs and exactness, not speed-ups.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
T=$PWD/bin/tandem
PY=/usr/bin/python3
MPI="mpirun --oversubscribe --allow-run-as-root"
W=$(mktemp -d /tmp/tandem-bench-dist.XXXXXX)
trap 'rm -rf "$W"' EXIT
# tandem's GEMM rate at start-up (gemm_eff) and its backward on builds
# without AVX-512 use OpenBLAS: on the kernels bench/blas_core.sh picks
. bench/blas_core.sh
DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" 2>/dev/null
S="configs/small.json data=$DATA steps=8 eval_every=0 save_every=0 shuffle=false"

$MPI -np 2 "$BUILD/bench/mpibw" >"$W/bw.json"
$T train $S out_dir="$W/np1" >/dev/null 2>&1
$MPI -np 2 $T train $S out_dir="$W/dp2" dp=2 >/dev/null 2>&1
$MPI -np 2 $T train $S out_dir="$W/tp2" tp=2 >/dev/null 2>&1
$MPI -np 2 $T train $S out_dir="$W/pp2" pp=2 micro_batch=2 grad_accum=4 >/dev/null 2>&1
$T train $S out_dir="$W/pp1" micro_batch=2 grad_accum=4 >/dev/null 2>&1
R="configs/rl_vowels.json steps=4"
RM='model={"vocab_size":256,"hidden_size":256,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"moe_intermediate_size":512,"num_local_experts":8,"num_experts_per_tok":2,"max_position_embeddings":128}'
$T rl $R "$RM" out_dir="$W/rl1" >/dev/null 2>&1
$MPI -np 2 $T rl $R "$RM" out_dir="$W/rl2" rollout_ranks=1 >/dev/null 2>&1

$PY - "$W" <<'PYEOF'
import json, statistics, sys
w = sys.argv[1]
rows = lambda d: [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (w, d))][2:]  # skip warm-up
med = lambda d, k: statistics.median(r[k] for r in rows(d))
bw = json.load(open(w + "/bw.json"))
out = {}
print("small, 8 steps (median of steps 3-8):")
print("  %-22s %10s %10s %10s" % ("layout", "tokens/s", "step s", "comm share"))
for d, label in (("np1", "1 process, 2 threads"), ("dp2", "dp=2 (np=2)"), ("tp2", "tp=2 (np=2)"),
                 ("pp1", "1 process, 2x4 accum"), ("pp2", "pp=2, 2x4 accum")):
    tok, st = med(d, "tokens_per_s"), med(d, "step_s")
    share = statistics.median(r["comm_s"] / r["step_s"] for r in rows(d))
    out[d] = dict(tokens_per_s=tok, step_s=st, comm_share=share)
    print("  %-22s %10.0f %10.3f %9.0f%%" % (label, tok, st, 100 * share))
b = statistics.median(r["pp_bubble"] for r in rows("pp2"))
theory = (2 - 1) / (4 + 2 - 1)
out["pp2"]["bubble"] = b
print("  pp=2 bubble %.2f vs 1F1B theory (p-1)/(m+p-1) = %.2f (m=4); measured includes waiting for the other rank's compute on shared cores" % (b, theory))
print("  dp=2 / np=1 tokens/s: %.2f;  tp=2 / tp=1 step time: %.2f" % (out["dp2"]["tokens_per_s"] / out["np1"]["tokens_per_s"], out["tp2"]["step_s"] / out["np1"]["step_s"]))
print("MPI between 2 ranks here: broadcast %.2f GB/s, all-reduce %.2f GB/s" % (bw["bcast_gb_s"], bw["allreduce_gb_s"]))
print("tandem rl, small model, 8 prompts x 8 samples x 24 tokens, 2 PPO epochs:")
for d, label in (("rl1", "np=1 colocated"), ("rl2", "np=2 split (1+1)")):
    r = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (w, d))][1:]
    rt = statistics.median(x["rollout_tokens_per_s"] for x in r)
    tt = statistics.median(x["train_tokens_per_s"] for x in r)
    ss = statistics.median(x["sync_s"] for x in r)
    sb = r[0]["sync_bytes"]
    ideal = sb / (bw["bcast_gb_s"] * 1e9) if sb else 0
    out[d] = dict(rollout_tokens_per_s=rt, train_tokens_per_s=tt, sync_s=ss, sync_bytes=sb, sync_ideal_s=ideal,
                  logprob_diff_max=max(x["logprob_diff_max"] for x in r), routing_mismatch=max(x["routing_mismatch"] for x in r))
    print("  %-18s rollout %7.0f tok/s  train %7.0f tok/s  sync %.4f s for %.1f MiB (bytes/bandwidth %.4f s)  logprob diff %.1g"
          % (label, rt, tt, ss, sb / 2**20, ideal, out[d]["logprob_diff_max"]))
out["mpi"] = bw
print(json.dumps({"bench": "dist", **out}))
PYEOF

#!/bin/sh
# tests/cli/plot.sh - tandem plot on real runs of configs/tiny.json: the
# expert_load key of metrics.jsonl (its counts add up to the tokens routed
# and agree with expert_share_max), every figure written as a PNG that an
# independent decoder (Python's zlib + struct, below) reads back at its size
# with real content in the lines' colours, and as well-formed SVG; two runs
# overlaid (one legend entry per run, both colours drawn); communication
# figures from a 2-rank run; bad input refused with one line naming the
# file and line; a cut-short last line skipped with a note.  The 2-rank run
# starts from run a's checkpoint with layer 0's router zeroed (h5py): its
# first step's per-rank memory arrays, comm_<g>_s_max, comm bytes against
# the parameter count, expert_entropy of the forced router (ln 2), and
# act_rms / logit_max against a PyTorch recomputation (tests/ref/tandem_ref.py).
# ~12 s.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=${TANDEM:-bin/tandem}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-plot-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }
need mpirun || exit 1

expect_fail() {
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    n=$(wc -l <"$W/err")
    if [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        bad "$desc: want one line matching '$pat', got:"; cat "$W/err"; return
    fi
    ok "$desc: $(cat "$W/err")"
}

DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" >/dev/null 2>&1

# two short runs: a (grad_accum 1, evaluations every 4 steps), b (another lr, grad_accum 2)
export TANDEM_THREADS=1
bounded 120 $T train configs/tiny.json data="$DATA" out_dir="$W/a" steps=12 eval_every=4 >"$W/a.log" 2>&1 ||
    { tail -3 "$W/a.log"; echo "plot: FAIL: training run a"; exit 1; }
bounded 120 $T train configs/tiny.json data="$DATA" out_dir="$W/b" steps=8 lr=1e-3 grad_accum=2 >"$W/b.log" 2>&1 ||
    { tail -3 "$W/b.log"; echo "plot: FAIL: training run b"; exit 1; }

# ---------------------------------------------------------------- expert_load in metrics.jsonl
$PY - "$W/a/metrics.jsonl" "$W/b/metrics.jsonl" <<'PYEOF' || fail=1
import json, sys
bad = 0
def check(ok, what):
    global bad
    print(("ok   " if ok else "FAIL ") + what)
    bad |= not ok
# tiny: 4 MoE layers of 4 experts, k = 2, 8 x 32 tokens per micro-batch
for path, ga in ((sys.argv[1], 1), (sys.argv[2], 2)):
    rows = [json.loads(l) for l in open(path)]
    want = 8 * 32 * 2 * ga
    shapes = all(len(r["expert_load"]) == 4 and all(len(l) == 4 for l in r["expert_load"]) for r in rows)
    check(shapes, f"{path}: expert_load is 4 layers x 4 experts in every row")
    sums = {sum(l) for r in rows for l in r["expert_load"]}
    check(sums == {want}, f"{path}: every layer's counts add up to tokens x k x grad_accum = {want} (got {sorted(sums)})")
    check(all(c == int(c) and c >= 0 for r in rows for l in r["expert_load"] for c in l), f"{path}: counts are whole numbers")
    if ga == 1:   # one micro-batch: the busiest and idlest expert's share is the trainer's expert_share_max/_min
        err = max(abs(max(l) / want - r["expert_share_max"][i]) + abs(min(l) / want - r["expert_share_min"][i])
                  for r in rows for i, l in enumerate(r["expert_load"]))
        check(err <= 1e-4, f"{path}: max/min count over the total = expert_share_max/_min (printed to 4 digits; worst {err:.2g})")
sys.exit(bad)
PYEOF

# ---------------------------------------------------------------- the PNG/SVG checker
# tests/png_check.py INDEX.json RULES.json (shared with serve.sh's plot
# --serve check): every figure the rules name is in the index and has a PNG
# that decodes (signature, IHDR, CRCs, zlib, the five filters) at the size
# expected, with more than 1% non-white pixels, more than 20 distinct
# colours, and at least 100 pixels of each colour the rules name; its SVG
# parses as XML with an <svg> root of the same size.

# ---------------------------------------------------------------- one run
BLUE='[31,119,180]' ORANGE='[255,127,14]' GREEN='[44,160,44]'
if bounded 60 $T plot "$W/a" >"$W/paths" 2>"$W/notes"; then ok "plot a: exit 0"; else bad "plot a: exit $?"; cat "$W/notes"; fi
# every path printed exists, and they are the figures' files plus index.json
n=0
while read -r p; do [ -s "$p" ] || bad "printed path $p does not exist"; n=$((n + 1)); done <"$W/paths"
[ "$n" -eq 31 ] && ok "plot a: printed 31 paths (15 figures x png/svg + index.json)" || { bad "plot a: printed $n paths"; cat "$W/paths"; }
grep -q "^$W/a/plots/loss_steps.png$" "$W/paths" && ok "plot a: default output RUN_DIR/plots" || bad "plot a: not in $W/a/plots"
grep -q "no comm_time figure" "$W/notes" && ok "plot a: one rank: comm_time skipped with a note" || bad "plot a: no note on comm_time"
cat >"$W/rules.json" <<EOF
{ "figures": ["loss_steps", "loss_tokens", "router_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory", "expert_load",
               "memory_rank", "stage_time", "layer_time", "act_rms", "logit_max", "expert_entropy"],
  "size": { "expert_load": [900, 499] },
  "colours": { "loss_steps": [$BLUE, $ORANGE, $GREEN], "lr": [$BLUE], "router_loss": [$BLUE, $ORANGE],
               "memory_rank": [$BLUE, $ORANGE], "stage_time": [$BLUE, $ORANGE],
               "layer_time": [$BLUE, $ORANGE, $GREEN], "act_rms": [$BLUE, $ORANGE, $GREEN], "logit_max": [$BLUE],
               "expert_entropy": [$BLUE, $ORANGE, $GREEN] } }
EOF
$PY tests/png_check.py "$W/a/plots/index.json" "$W/rules.json" || fail=1
$PY - "$W/a/plots/index.json" <<'PYEOF' || fail=1
import json, sys
ix = json.load(open(sys.argv[1]))
f = {x["name"]: x for x in ix["figures"]}
ok = f["loss_steps"]["legend"] == ["loss", "ce", "val_loss"] and f["loss_steps"]["points"] == [12, 12, 3]
print(("ok   " if ok else "FAIL ") + f"loss_steps: legend {f['loss_steps']['legend']}, points {f['loss_steps']['points']} (12 steps, 3 evaluations)")
# the new figures' lines: one per array element; act_rms at steps 1 and 10 (health_every 10)
want = {"stage_time": (["fwd_s[0]", "bwd_s[0]"], [12, 12]),
        "memory_rank": (["mem_rank_mb.rss[0]", "mem_rank_mb.alloc_peak[0]", "mem_rank_mb.act[0]"], [12, 12, 12]),
        "layer_time": (["time_attn_s", "time_router_s", "time_experts_s", "time_head_s"], [12] * 4),
        "act_rms": ([f"act_rms[{l}]" for l in range(4)], [2] * 4),
        "expert_entropy": ([f"expert_entropy[{l}]" for l in range(4)], [12] * 4)}
for name, (legend, points) in want.items():
    good = f[name]["legend"] == legend and f[name]["points"] == points
    print(("ok   " if good else "FAIL ") + f"{name}: legend {f[name]['legend']}, points {f[name]['points']}")
    ok = ok and good
sys.exit(not ok)
PYEOF

# ---------------------------------------------------------------- two runs overlaid
if bounded 60 $T plot "$W/a" "$W/b" --out "$W/ov/deep" >"$W/paths" 2>"$W/notes"; then ok "plot a b: exit 0"; else bad "plot a b: exit $?"; cat "$W/notes"; fi
cat >"$W/rules.json" <<EOF
{ "figures": ["loss_steps", "lr", "grad_norm", "expert_load-a", "expert_load-b"],
  "size": { "expert_load-a": [900, 499], "expert_load-b": [900, 499] },
  "colours": { "lr": [$BLUE, $ORANGE], "grad_norm": [$BLUE, $ORANGE], "loss_steps": [$BLUE, $ORANGE] } }
EOF
$PY tests/png_check.py "$W/ov/deep/index.json" "$W/rules.json" || fail=1
$PY - "$W/ov/deep/index.json" <<'PYEOF' || fail=1
import json, sys
f = {x["name"]: x for x in json.load(open(sys.argv[1]))["figures"]}
bad = 0
for name, want in (("lr", ["a lr", "b lr"]), ("loss_steps", ["a loss", "a ce", "a val_loss", "b loss", "b ce"])):
    got = f[name]["legend"]
    print(("ok   " if got == want else "FAIL ") + f"overlay {name}: legend {got}")
    bad |= got != want
pts = f["lr"]["points"]
print(("ok   " if pts == [12, 8] else "FAIL ") + f"overlay lr: points per run {pts} (12 and 8 steps)")
sys.exit(bad or pts != [12, 8])
PYEOF

# ---------------------------------------------------------------- communication: two ranks
# from run a's weights, layer 0's router zeroed: every logit ties, so top-2
# takes experts 0 and 1 (ties to the lower index) for every token at step 1
$PY - "$W/a/step_00000012.h5" "$W/r0.h5" <<'PYEOF' || fail=1
import shutil, sys, h5py, numpy as np
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "r+") as f:
    d = f["/model/layers/0/mlp/gate"]
    d[...] = np.zeros(d.shape, d.dtype)
PYEOF
if bounded 120 mpirun --oversubscribe --allow-run-as-root -np 2 $T train configs/tiny.json data="$DATA" out_dir="$W/dp" \
        steps=4 dp=2 init_from="$W/r0.h5" >"$W/dp.log" 2>&1; then
    $PY - "$W/dp/metrics.jsonl" "$W/r0.h5" "$DATA" <<'PYEOF' || fail=1
import json, math, os, sys
import numpy as np, torch
sys.path.insert(0, "tests/ref")
import tandem_ref
from tandem_ref import TandemRef, load_h5
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = 0
def check(ok, what):
    global bad
    print(("ok   " if ok else "FAIL ") + what)
    bad |= not ok
r1 = rows[0]
# per-rank memory: arrays over the 2 world ranks, current <= peak
m = r1["mem_rank_mb"]
check(sorted(m) == ["act", "alloc", "alloc_peak", "rss", "rss_peak"] and all(len(v) == 2 and min(v) > 0 for v in m.values()),
      f"mem_rank_mb: 5 kinds x 2 ranks, all > 0 ({m})")
check(all(m["rss"][i] <= m["rss_peak"][i] and m["alloc"][i] <= m["alloc_peak"][i] for i in range(2)),
      "mem_rank_mb: rss <= rss_peak, alloc <= alloc_peak on each rank")
check(all(r[f"comm_{g}_s_max"] >= r[f"comm_{g}_s"] for r in rows for g in ("dp", "edp")),
      "comm_<g>_s_max >= rank 0's comm_<g>_s in every row")
check(all(len(r["fwd_s"]) == 1 and len(r["bwd_s"]) == 1 and r["fwd_s"][0] > 0 and r["bwd_s"][0] > 0 for r in rows),
      "fwd_s, bwd_s: one stage, > 0")
check(all(r[k] > 0 for r in rows for k in ("time_attn_s", "time_router_s", "time_experts_s", "time_head_s")),
      "time_attn_s, time_router_s, time_experts_s, time_head_s > 0")
# comm bytes: the gradient all-reduce carries every gradient once: the
# experts' over edp, the rest over dp (the tied lm_head, which load_h5
# lists, has its own gradient), plus a few hundred bytes of loss and router
# statistics
cfg, w = load_h5(sys.argv[2])
ne = sum(v.numel() for k, v in w.items() if "/experts/" in k)
no = sum(v.numel() for k, v in w.items() if "/experts/" not in k)
for g, n in (("edp", ne), ("dp", no)):
    want = 4 * n / 2**20
    check(all(abs(r[f"comm_{g}_mb"] - want) < 0.0015 for r in rows), f"comm_{g}_mb = 4 x {n} parameters / 2^20 = {want:.4f} (got {r1[f'comm_{g}_mb']})")
# the forced router: layer 0 sends every token to experts 0 and 1
check(r1["expert_load"][0] == [256, 256, 0, 0], f"forced router: layer 0's load {r1['expert_load'][0]} = [256, 256, 0, 0]")
check(abs(r1["expert_entropy"][0] - math.log(2)) < 1e-6 and r1["expert_share_max"][0] == 0.5 and r1["expert_share_min"][0] == 0,
      f"forced router: entropy {r1['expert_entropy'][0]} = ln 2, shares max 0.5 min 0")
for r in rows:
    for l, ld in enumerate(r["expert_load"]):
        p = np.array(ld) / sum(ld)
        h = -sum(x * math.log(x) for x in p if x > 0)
        if abs(h - r["expert_entropy"][l]) > 1e-5: check(False, f"step {r['step']} layer {l}: entropy {r['expert_entropy'][l]}, from expert_load {h}")
check(all(0 <= e <= math.log(4) + 1e-9 for r in rows for e in r["expert_entropy"]), "expert_entropy in [0, ln 4], equal to expert_load's")
check("act_rms" in r1 and all("act_rms" not in r for r in rows[1:]), "act_rms at step 1 only (health_every 10, 4 steps)")
# act_rms and logit_max of step 1 against PyTorch (float64) on the same batch:
# shuffle false, so row r of the first micro-batch is tokens [32 r, 32 r + 32)
raw = open(sys.argv[3], "rb").read()
width = int.from_bytes(raw[12:16], "little")
tok = np.frombuffer(raw[64:64 + (8 * 32 + 1) * width], dtype={1: "<u1", 2: "<u2", 4: "<u4"}[width]).astype(np.int64)
ids = torch.tensor(tok[:256].reshape(8, 32))
ref = TandemRef(cfg, w)
outs, real = [], tandem_ref.rmsnorm
norms = {id(w[f"model/layers/{l}/input_layernorm"]) for l in range(1, 4)} | {id(w["model/norm"])}
def spy(x, wt, eps):   # the input of layer l's first norm (and of the final norm) is layer l-1's output
    if id(wt) in norms: outs.append(x)
    return real(x, wt, eps)
tandem_ref.rmsnorm = spy
with torch.no_grad():
    logits = ref.forward(ids)[0]
rms = [float(x.pow(2).mean().sqrt()) for x in outs]
err = max(abs(a - b) / b for a, b in zip(r1["act_rms"], rms))
check(len(rms) == 4 and err < 1e-5, f"act_rms step 1 {r1['act_rms']} = PyTorch's {[round(x, 6) for x in rms]} (worst rel. {err:.1e})")
lm = float(logits.abs().max())
check(abs(r1["logit_max"] - lm) / lm < 1e-5, f"logit_max step 1 {r1['logit_max']} = PyTorch's {lm:.6g}")
sys.exit(bad)
PYEOF
    bounded 60 $T plot "$W/dp" >"$W/paths" 2>"$W/notes" || bad "plot dp: exit $?"
    # the first line of comm_time (rank 0's dp seconds) and of memory_rank
    # (rank 0's RSS) is drawn under the second (the group's slowest rank,
    # rank 1's RSS) wherever the two are equal, which depends on timing and
    # on the allocator: only the second line's colour is required there;
    # the legends below name both
    cat >"$W/rules.json" <<EOF
{ "figures": ["comm_time", "comm_bytes", "memory_rank"], "size": { "expert_load": [900, 499] },
  "colours": { "comm_time": [$ORANGE], "comm_bytes": [$BLUE], "memory_rank": [$ORANGE] } }
EOF
    $PY tests/png_check.py "$W/dp/plots/index.json" "$W/rules.json" || fail=1
    $PY - "$W/dp/plots/index.json" <<'PYEOF' || fail=1
import json, sys
f = {x["name"]: x for x in json.load(open(sys.argv[1]))["figures"]}
ct, mr = f["comm_time"]["legend"], f["memory_rank"]["legend"]
ok = ct[:2] == ["comm_dp_s", "comm_dp_s_max"] and "comm_edp_s_max" in ct
print(("ok   " if ok else "FAIL ") + f"plot dp: comm_time draws each group and its slowest rank: {ct}")
ok2 = mr == ["mem_rank_mb.rss[0]", "mem_rank_mb.rss[1]", "mem_rank_mb.alloc_peak[0]", "mem_rank_mb.alloc_peak[1]",
             "mem_rank_mb.act[0]", "mem_rank_mb.act[1]"]
print(("ok   " if ok2 else "FAIL ") + f"plot dp: memory_rank draws both ranks: {mr}")
sys.exit(not (ok and ok2))
PYEOF
else
    tail -3 "$W/dp.log"; bad "training on 2 ranks"
fi

# ---------------------------------------------------------------- a long run: the heatmap bins steps
mkdir "$W/long"
$PY - "$W/long/metrics.jsonl" <<'PYEOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 1501):   # expert 0 takes all of layer 0 for the first 750 steps, then expert 1
        f.write(json.dumps({"step": s, "loss": 3 + 1 / s, "expert_load": [[100, 0] if s <= 750 else [0, 100]]}) + "\n")
PYEOF
if bounded 60 $T plot "$W/long" >"$W/paths" 2>"$W/notes"; then
    $PY - "$W/long/plots/index.json" <<'PYEOF' || fail=1
import json, sys
f = {x["name"]: x for x in json.load(open(sys.argv[1]))["figures"]}
ok = f["expert_load"]["points"] == [600] and f["loss_steps"]["points"] == [1500]
print(("ok   " if ok else "FAIL ") + f"1500 steps: heatmap in {f['expert_load']['points']} columns (600 at most), loss line {f['loss_steps']['points']} points")
sys.exit(not ok)
PYEOF
else
    bad "plot long: exit $?"; cat "$W/notes"
fi

# ---------------------------------------------------------------- bad input
expect_fail "missing directory" "$W/nope: No such file or directory" $T plot "$W/nope"
mkdir "$W/empty"
expect_fail "no metrics.jsonl" "$W/empty/metrics.jsonl: No such file or directory" $T plot "$W/empty"
expect_fail "a good and a missing run" "$W/nope" $T plot "$W/a" "$W/nope"
mkdir "$W/m1" "$W/m2" "$W/m3" "$W/m4" "$W/cut"
head -2 "$W/a/metrics.jsonl" >"$W/m1/metrics.jsonl"; echo '{"step":3,"loss":' >>"$W/m1/metrics.jsonl"; tail -1 "$W/a/metrics.jsonl" >>"$W/m1/metrics.jsonl"
expect_fail "malformed line" "$W/m1/metrics.jsonl:3: not JSON" $T plot "$W/m1"
head -1 "$W/a/metrics.jsonl" >"$W/m2/metrics.jsonl"; echo '{"loss":1.5}' >>"$W/m2/metrics.jsonl"
expect_fail "a row without step" "$W/m2/metrics.jsonl:2: no numeric \"step\"" $T plot "$W/m2"
: >"$W/m3/metrics.jsonl"
expect_fail "empty metrics.jsonl" "$W/m3/metrics.jsonl: no metrics rows" $T plot "$W/m3"
head -1 "$W/a/metrics.jsonl" >"$W/m4/metrics.jsonl"; echo '{"step":2,"expert_load":[[1,2],[3]]}' >>"$W/m4/metrics.jsonl"
expect_fail "ragged expert_load" "$W/m4/metrics.jsonl:2: expert_load" $T plot "$W/m4"
expect_fail "output is a file" "$W/a/metrics.jsonl" $T plot "$W/a" --out "$W/a/metrics.jsonl"
# a run still writing: the last line has no newline yet; skipped with a note, not an error
head -5 "$W/a/metrics.jsonl" >"$W/cut/metrics.jsonl"; sed -n 6p "$W/a/metrics.jsonl" | cut -c1-40 | tr -d '\n' >>"$W/cut/metrics.jsonl"
if $T plot "$W/cut" >"$W/paths" 2>"$W/notes" && grep -q "metrics.jsonl:6: cut short" "$W/notes" &&
   $PY -c 'import json, sys; f = {x["name"]: x for x in json.load(open(sys.argv[1]))["figures"]}; sys.exit(f["lr"]["points"] != [5])' \
       "$W/cut/plots/index.json"; then
    ok "cut-short last line: skipped with a note ($(grep 'cut short' "$W/notes")), 5 rows drawn"
else
    bad "cut-short last line"; cat "$W/notes"
fi

[ $fail -eq 0 ] && echo "plot: all ok" || echo "plot: FAILED"
exit $fail

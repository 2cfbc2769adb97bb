#!/bin/sh
# tests/cli/demo.sh - the demo learns: configs/demo.json, trained exactly as
# `make demo` trains it (400 steps on fortunes), starts at a loss of about
# ln 256 = 5.55 (an untrained byte-level model) and ends with a validation
# loss below 2.0, both in the trainer's metrics and in `tandem eval` of the
# checkpoint it saved; `tandem plot` draws its 15 figures.  ~5 minutes on
# 2 cores: the longest test, and the only one that trains a model to a
# quality bar.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=${TANDEM:-bin/tandem}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-demo-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
t0=$(date +%s)
DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" >/dev/null

# the demo's run config, only the output moved (and no mid-run checkpoints)
if ! bounded 3600 $T train configs/demo.json data="$DATA" out_dir="$W/run" save_every=0 >"$W/train.log" 2>&1; then
    tail -5 "$W/train.log"
    echo "demo: FAIL: training configs/demo.json"
    exit 1
fi
bounded 300 $T eval --ckpt "$W/run" --data "$DATA" --seq-len 256 >"$W/eval.json" 2>"$W/eval.err" ||
    { cat "$W/eval.err"; echo "demo: FAIL: tandem eval"; exit 1; }

$PY - "$W/run/metrics.jsonl" "$W/eval.json" <<'PYEOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ev = json.load(open(sys.argv[2]))
first, vals = rows[0]["loss"], [r["val_loss"] for r in rows if "val_loss" in r]
fail = 0
def check(ok, what):
    global fail
    print(("ok   " if ok else "FAIL ") + what)
    fail |= not ok
# the first step's loss: an untrained model predicts nearly uniform bytes,
# ce = ln 256 = 5.545 (the aux and z terms add ~0.01); +-0.5 allows for the
# initialisation's spread
check(abs(first - math.log(256)) < 0.5, "step 1 loss %.4f (ln 256 = %.4f)" % (first, math.log(256)))
check(len(vals) >= 4 and vals[-1] < 2.0,
      "validation loss by eval_every: %s, last < 2.0" % " ".join("%.3f" % v for v in vals))
check(all(b < a for a, b in zip(vals, vals[1:])), "validation loss falls at every evaluation")
check(ev["loss"] < 2.0, "tandem eval of the saved checkpoint: loss %.4f (perplexity %.2f) over %d windows, < 2.0"
      % (ev["loss"], ev["perplexity"], ev["windows"]))
sys.exit(fail)
PYEOF
# make demo ends with the run's figures: the 15 of a 1-rank MoE run (docs/observability.md)
bounded 120 $T plot "$W/run" >"$W/plots.txt" 2>"$W/plots.err" || { cat "$W/plots.err"; echo "demo: FAIL: tandem plot"; exit 1; }
n=$(grep -c '\.png$' "$W/plots.txt")
[ "$n" -eq 15 ] && grep -q "/expert_load.png$" "$W/plots.txt" && grep -q "/act_rms.png$" "$W/plots.txt" ||
    { cat "$W/plots.txt"; echo "demo: FAIL: tandem plot wrote $n PNGs, want 15 with expert_load and act_rms"; exit 1; }
echo "ok   tandem plot of the demo run: $n figures in $W/run/plots"
echo "demo: all passed in $(($(date +%s) - t0)) s"

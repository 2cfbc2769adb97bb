#!/usr/bin/python3
"""run_compare.py - a training run against the single-process run of the same
global batch and seed, per step and per tensor (h5py alone).

    run_compare.py REF_DIR RUN_DIR LABEL --steps N --loss-tol R --gnorm-tol R
                   [--ckpt REF.h5 RUN.h5 --moment-tol R --weight-tol R]
                   [--skip SUFFIX] [--show KEY]

Compares, all as relative differences:
  - REF_DIR/metrics.jsonl and RUN_DIR/metrics.jsonl: `loss` and `grad_norm`
    of each of the N steps;
  - with --ckpt, the two checkpoints tensor by tensor: every dataset under
    /optimizer/exp_avg, /optimizer/exp_avg_sq (--moment-tol) and /model,
    /lm_head (--weight-tol), as max|run - ref| / max|ref| of that tensor.
    After one step exp_avg = (1 - beta1) g c and exp_avg_sq = (1 - beta2) (g c)^2
    (g the gradient, c the clip factor), so a wrong factor on one tensor's
    gradient shows there even though AdamW's update, and so the loss, is
    nearly blind to it; grad_norm shows c and any error in the norm itself.
Prints one line with the worst difference of each kind (the noise, when the
run is right) and exits 0; or also one line per step and tensor outside its
tolerance, worst first, naming it with both values, and exits 1.
"""
import argparse
import json
import sys

import h5py
import numpy as np

KINDS = (("exp_avg", ("optimizer/exp_avg/",)),   # (kind, dataset name prefixes)
         ("exp_avg_sq", ("optimizer/exp_avg_sq/",)),
         ("weights", ("model/", "lm_head")))


def kind_of(name):
    for k, prefixes in KINDS:
        if any(name.startswith(p) for p in prefixes):
            return k
    return None


def metrics(d):
    rows = {}
    for line in open(d + "/metrics.jsonl"):
        r = json.loads(line)
        rows[r["step"]] = r
    return rows


def compare_metrics(a, bad, worst):
    ma, mb = metrics(a.ref), metrics(a.run)
    want = list(range(1, a.steps + 1))
    if sorted(ma) != want or sorted(mb) != want:
        bad.append((np.inf, "steps logged: reference %s, run %s, want 1..%d" % (sorted(ma), sorted(mb), a.steps)))
    for key, tol in (("loss", a.loss_tol), ("grad_norm", a.gnorm_tol)):
        for s in sorted(set(ma) & set(mb)):
            x, y = ma[s][key], mb[s][key]
            rel = abs(y - x) / abs(x) if x else abs(y - x)
            worst[key] = max(worst[key], rel)
            if not rel <= tol:
                bad.append((rel, "%s at step %d: %.9g vs reference %.9g (rel %.2e > %.2g)" % (key, s, y, x, rel, tol)))
    return mb


def compare_ckpt(a, bad, worst):
    fa, fb = h5py.File(a.ckpt[0], "r"), h5py.File(a.ckpt[1], "r")
    if fa.attrs.get("step") != fb.attrs.get("step"):
        bad.append((np.inf, "checkpoint steps differ: %s vs reference %s" % (fb.attrs.get("step"), fa.attrs.get("step"))))
    seen = set()

    def visit(name, obj):
        k = kind_of(name)
        if k is None or not isinstance(obj, h5py.Dataset) or any(name.endswith(e) for e in a.skip):
            return
        seen.add(k)
        if name not in fb:
            bad.append((np.inf, "%s: missing in %s" % (name, a.ckpt[1])))
            return
        x, y = obj[()].astype(np.float64), fb[name][()].astype(np.float64)
        if x.shape != y.shape:
            bad.append((np.inf, "%s: shape %s vs reference %s" % (name, y.shape, x.shape)))
            return
        diff = np.nan_to_num(np.abs(y - x), nan=np.inf)
        scale = float(np.abs(x).max())
        rel = float(diff.max()) / scale if scale > 0 else float(diff.max())
        if rel >= worst[k][0]:
            worst[k] = (rel, name)
        tol = a.weight_tol if k == "weights" else a.moment_tol
        if not rel <= tol:
            i = np.unravel_index(int(diff.argmax()), diff.shape)
            bad.append((rel, "%s: rel diff %.2e > %.2g; at %s %.9g vs reference %.9g; max|.| %.6g vs %.6g"
                        % (name, rel, tol, list(map(int, i)), y[i], x[i], float(np.abs(y).max()), scale)))

    fa.visititems(visit)
    for k, _ in KINDS:
        if k not in seen:
            bad.append((np.inf, "%s holds no %s datasets" % (a.ckpt[0], k)))
    return int(fa.attrs.get("step", -1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("label")
    ap.add_argument("--steps", type=int, required=True, help="metrics rows 1..N both runs must hold")
    ap.add_argument("--loss-tol", type=float, required=True)
    ap.add_argument("--gnorm-tol", type=float, required=True)
    ap.add_argument("--ckpt", nargs=2, metavar=("REF_H5", "RUN_H5"), help="checkpoints to compare per tensor")
    ap.add_argument("--moment-tol", type=float, help="exp_avg and exp_avg_sq, per tensor")
    ap.add_argument("--weight-tol", type=float, help="the weights, per tensor")
    ap.add_argument("--skip", action="append", default=[],
                    help="leave out the datasets whose name ends so (a gradient that is zero in exact arithmetic)")
    ap.add_argument("--show", action="append", default=[], help="also print this key of the run's last row")
    a = ap.parse_args()
    if a.ckpt and (a.moment_tol is None or a.weight_tol is None):
        ap.error("--ckpt needs --moment-tol and --weight-tol")

    bad = []
    worst = {"loss": 0.0, "grad_norm": 0.0}
    mb = compare_metrics(a, bad, worst)
    line = "max rel diff: loss %.1e, grad_norm %.1e (%d steps)" % (worst["loss"], worst["grad_norm"], a.steps)
    if a.ckpt:
        for k, _ in KINDS:
            worst[k] = (0.0, "")
        step = compare_ckpt(a, bad, worst)
        m = max(worst["exp_avg"], worst["exp_avg_sq"])
        line += "; step %d per tensor: exp_avg %.1e, exp_avg_sq %.1e (%s), weights %.1e" % (
            step, worst["exp_avg"][0], worst["exp_avg_sq"][0],
            m[1].replace("optimizer/", "").replace("model/layers/", "L"), worst["weights"][0])
    last = mb[max(mb)] if mb else {}
    line += "".join(", %s %s" % (k, last[k]) for k in a.show if k in last)
    print("%s %-24s %s" % ("FAIL" if bad else "ok  ", a.label, line))
    bad.sort(key=lambda t: -t[0])   # worst first
    for _, msg in bad[:12]:
        print("FAIL %s: %s" % (a.label, msg))
    if len(bad) > 12:
        print("FAIL %s: ... and %d more" % (a.label, len(bad) - 12))
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, KeyError) as e:   # a run that died leaves no metrics / checkpoint
        print("FAIL %s: cannot compare: %s: %s" % (sys.argv[3] if len(sys.argv) > 3 else "?", type(e).__name__, e))
        sys.exit(1)

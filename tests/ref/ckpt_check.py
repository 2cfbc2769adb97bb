#!/usr/bin/python3
"""ckpt_check.py - check a tandem checkpoint against SPEC section 4 with h5py
alone (names, shapes, dtypes, attributes, partition strings, chunking and the
Fletcher32 filter), independently of the C reader.

    ckpt_check.py CKPT [--topology DP,TP,PP,EP] [--dtype f32|bf16|f16]
                       [--weights-only] [--compare REF.h5]

--topology: the layout the file must record (default: whatever it records;
the partition strings are checked against it either way).  --dtype: storage
of the weight matrices.  --compare: REF.h5 holds the same state in float32;
every weight must equal it exactly, after rounding to nearest even for 16-bit
files (bf16: upper half of the float32 bits; f16: numpy's astype(float16)).
Prints one line and exits 0, or prints every problem and exits 1.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tandem_ref import full_config, param_shapes  # noqa: E402

problems = []


def bad(msg):
    problems.append(msg)


def split_dims(name):
    """(tp_dim, ep_dim) of a weight, -1 when not split (docs/checkpoint.md)."""
    leaf = name.split("/")[-1]
    if "/mlp/experts/" in name:
        return (2 if leaf == "down_proj" else 1), 0
    if leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        return 0, -1
    if leaf in ("o_proj", "down_proj"):
        return 1, -1
    return -1, -1


def partition(name, dp, tp, pp, ep):
    tp_dim, ep_dim = split_dims(name)
    parts = []
    if pp > 1:
        parts.append("pp")
    if ep_dim >= 0 and ep > 1:
        parts.append("ep:%d" % ep_dim)
    if tp_dim >= 0 and tp > 1:
        parts.append("tp:%d" % tp_dim)
    return ",".join(parts) or "replicated"


def as_str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def round_bf16(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--topology")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--weights-only", action="store_true")
    ap.add_argument("--compare")
    a = ap.parse_args()

    f = h5py.File(a.ckpt, "r")
    if as_str(f.attrs.get("format", "")) != "tandem-checkpoint":
        bad("root attribute format is %r" % f.attrs.get("format"))
    if not isinstance(f.attrs.get("format"), str):
        bad("format is not a (variable-length UTF-8) string")
    if f.attrs.get("format_version") != 1 or not np.issubdtype(np.asarray(f.attrs["format_version"]).dtype, np.integer):
        bad("format_version is %r, not the integer 1" % f.attrs.get("format_version"))
    cfg = json.loads(as_str(f.attrs["config"]))
    for k in ("step", "tokens_seen"):
        if k not in f.attrs or not np.issubdtype(np.asarray(f.attrs[k]).dtype, np.integer):
            bad("root attribute %s missing or not an integer" % k)

    topo = f["topology"].attrs
    dp, tp, pp, ep = (int(topo[k]) for k in ("dp", "tp", "pp", "ep"))
    if int(topo["world_size"]) != dp * tp * pp:
        bad("/topology world_size %d != dp*tp*pp" % int(topo["world_size"]))
    if a.topology and [dp, tp, pp, ep] != [int(x) for x in a.topology.split(",")]:
        bad("/topology is dp=%d tp=%d pp=%d ep=%d, expected %s" % (dp, tp, pp, ep, a.topology))
    if len(topo["stage_layers"]) != pp or sum(topo["stage_layers"]) != full_config(cfg)["num_hidden_layers"]:
        bad("/topology stage_layers %r" % list(topo["stage_layers"]))

    shapes = param_shapes(cfg)
    ref = h5py.File(a.compare, "r") if a.compare else None
    found = []
    f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) else None)
    weights = [n for n in found if n.startswith("model/") or n == "lm_head"]
    if sorted(weights) != sorted(shapes):
        bad("weight datasets differ from SPEC: extra %s, missing %s"
            % (sorted(set(weights) - set(shapes)), sorted(set(shapes) - set(weights))))
    for name, shape in shapes.items():
        if name not in f:
            continue
        d = f[name]
        if d.shape != tuple(shape):
            bad("%s: shape %s, SPEC %s" % (name, d.shape, tuple(shape)))
        want = "f32" if len(shape) == 1 else a.dtype
        if want == "f32" and d.dtype != np.float32:
            bad("%s: dtype %s, expected float32" % (name, d.dtype))
        if want == "f16" and d.dtype != np.float16:
            bad("%s: dtype %s, expected float16" % (name, d.dtype))
        if want == "bf16" and (d.dtype != np.uint16 or as_str(d.attrs.get("dtype", "")) != "bfloat16"):
            bad("%s: dtype %s / attribute dtype %r, expected uint16 + bfloat16" % (name, d.dtype, d.attrs.get("dtype")))
        if want != "bf16" and "dtype" in d.attrs:
            bad("%s: unexpected dtype attribute" % name)
        if as_str(d.attrs.get("partition", "")) != partition(name, dp, tp, pp, ep):
            bad("%s: partition %r, expected %r" % (name, d.attrs.get("partition"), partition(name, dp, tp, pp, ep)))
        if not d.chunks or not d.fletcher32:
            bad("%s: not chunked with Fletcher32 (chunks %s, fletcher32 %s)" % (name, d.chunks, d.fletcher32))
        if ref is not None:
            x = ref[name][()]
            y = d[()]
            if want == "bf16":
                ok = np.array_equal(y, round_bf16(x))
            elif want == "f16":
                ok = np.array_equal(y.view(np.uint16), x.astype(np.float16).view(np.uint16))
            else:
                ok = np.array_equal(y.view(np.uint32), x.astype(np.float32).view(np.uint32))
            if not ok:
                bad("%s: values differ from %s (after rounding to %s)" % (name, a.compare, want))

    has_opt, has_tr = "optimizer" in f, "trainer" in f
    if a.weights_only and (has_opt or has_tr):
        bad("weights-only checkpoint holds /optimizer or /trainer")
    if not a.weights_only and not (has_opt and has_tr):
        bad("/optimizer and /trainer missing")
    if has_opt:
        for k in ("beta1", "beta2", "eps", "weight_decay", "step", "lr"):
            if k not in f["optimizer"].attrs:
                bad("/optimizer attribute %s missing" % k)
        for m in ("exp_avg", "exp_avg_sq"):
            for name, shape in shapes.items():
                p = "optimizer/%s/%s" % (m, name)
                if p not in f or f[p].shape != tuple(shape) or f[p].dtype != np.float32:
                    bad("%s missing or not float32 %s" % (p, tuple(shape)))
    if has_tr:
        t = f["trainer"]
        for k in ("step", "tokens_seen", "micro_batches", "lr"):
            if k not in t.attrs:
                bad("/trainer attribute %s missing" % k)
        if t["data_rng"].shape != (4,) or t["data_rng"].dtype != np.uint64:
            bad("/trainer/data_rng is %s %s" % (t["data_rng"].shape, t["data_rng"].dtype))
        if t["rank_rng"].ndim != 2 or t["rank_rng"].shape[1] != 4 or t["rank_rng"].dtype != np.uint64:
            bad("/trainer/rank_rng is %s %s" % (t["rank_rng"].shape, t["rank_rng"].dtype))

    if problems:
        for p in problems:
            print("ckpt_check: %s: %s" % (a.ckpt, p))
        sys.exit(1)
    print("ckpt_check: %s: ok (%d datasets, dp=%d tp=%d pp=%d ep=%d, weights %s%s)"
          % (a.ckpt, len(found), dp, tp, pp, ep, a.dtype, ", equal to " + a.compare if ref else ""))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tests/ref/fixtures_vision.py - PyTorch references for the vision encoder's
ops (core/ops/layernorm.c, core/ops/gelu.c).

    /usr/bin/python3 tests/ref/fixtures_vision.py --out DIR

writes DIR/layernorm.h5 and DIR/gelu.h5 (read by tests/test_layernorm.c,
tests/test_gelu.c), in the layout of tests/ref/fixtures_ops.py: cases c0,
c1, ..., float32 inputs from a fixed seed, references computed by PyTorch
in float64 from those float32 values (autograd for the gradients of
L = sum(out * dy)) and stored rounded to float32.
"""
import argparse
import os

import h5py
import numpy as np
import torch

F64 = torch.float64


def f32(a):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def uni(r, shape, lo=-1.0, hi=1.0):
    return r.uniform(lo, hi, size=shape).astype(np.float32)


def t64(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float32), dtype=F64, requires_grad=grad)


def write(out, name, cases):
    with h5py.File(os.path.join(out, name), "w") as f:
        f.attrs["n_cases"] = len(cases)
        for ci, case in enumerate(cases):
            g = f.create_group("c%d" % ci)
            for k, v in case.items():
                g.create_dataset(k, data=np.asarray(v))


def layernorm_cases():
    cases = []
    for seed, (N, d, eps) in enumerate([(3, 1, 1e-5), (7, 33, 1e-6), (5, 64, 1e-5), (2, 100, 1e-6)]):
        r = np.random.default_rng(2000 + seed)
        x, w, b, dy = uni(r, (N, d), -2, 2), uni(r, (d,), 0.5, 1.5), uni(r, (d,)), uni(r, (N, d))
        x[0] += 3.0                                  # a row with a large mean
        xt, wt, bt = t64(x, True), t64(w, True), t64(b, True)
        eps32 = float(np.float32(eps))
        y = torch.nn.functional.layer_norm(xt, (d,), wt, bt, eps32)
        (y * t64(dy)).sum().backward()
        mean = xt.detach().mean(-1)
        rstd = 1.0 / torch.sqrt(xt.detach().var(-1, unbiased=False) + eps32)
        cases.append(dict(dims=np.int32([N, d]), eps=np.float32([eps]), x=x, w=w, b=b, dy=dy, y=f32(y),
                          mean=f32(mean), rstd=f32(rstd), dx=f32(xt.grad), dw=f32(wt.grad), db=f32(bt.grad)))
    return cases


def gelu_cases():
    cases = []
    for seed, n in enumerate([7, 1000]):
        r = np.random.default_rng(2100 + seed)
        x, dy = uni(r, (n,), -6, 6), uni(r, (n,))
        x[0], x[1] = 12.0, -12.0                     # saturated
        xt = t64(x, True)
        y = torch.nn.functional.gelu(xt)
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=np.int32([n]), x=x, dy=dy, y=f32(y), dx=f32(xt.grad)))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    write(args.out, "layernorm.h5", layernorm_cases())
    write(args.out, "gelu.h5", gelu_cases())


if __name__ == "__main__":
    main()

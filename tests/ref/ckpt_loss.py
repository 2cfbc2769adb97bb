#!/usr/bin/python3
"""ckpt_loss.py - the reference loss (SPEC section 2) of a model built in
PyTorch from a tandem checkpoint read with h5py (tandem_ref.load_h5, which
also upcasts bfloat16 / float16 weights).

    ckpt_loss.py CKPT IDS.bin [--batch B] [--seq T] [--seed S]

Draws a batch of B x T token ids and targets (torch generator, seed S),
writes them to IDS.bin (B*T int32 ids, then B*T int32 targets, little-endian:
what `build/tests/mpi_ckpt loss CKPT IDS.bin B T` reads) and prints the loss
computed in float64 on the checkpoint's weights.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tandem_ref import TandemRef, full_config, load_h5  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("ids")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg, w = load_h5(a.ckpt)
    V = full_config(cfg)["vocab_size"]
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, V, (a.batch, a.seq), generator=g)
    targets = torch.randint(0, V, (a.batch, a.seq), generator=g)
    np.concatenate([ids.numpy().ravel(), targets.numpy().ravel()]).astype("<i4").tofile(a.ids)
    out = TandemRef(cfg, w).loss(ids, targets)
    print("%.12f" % float(out["loss"]))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Fixtures for tests/test_safetensors.c: safetensors files written by the
Python writer (tests/ref/hf/st.py, the reference layout), and what the C
reader must find in them, in st_expect.h5:

  st_dtypes.safetensors   one tensor of every whole-byte dtype the writer
                          knows (F32 F16 BF16 F64 I8 U8 I16 I32 I64 BOOL), F8_E4M3
                          (all 256 bytes), a scalar, an empty tensor, and
                          3-D F32 / BF16 / F16 "experts" tensors to slice
  st_expect.h5            f32/<name>  the float32 value of each float tensor
                          raw/<name>  its raw bytes (uint8)
                          slice/<i>/  which (0 experts.f32, 1 .bf16, 2 .f16), start,
                                      count, want: numpy's x[s0:s0+c0, ...] as float32,
                                      raw: the bytes of that slice
                          attrs n_slices, n_hf_q2, n_hf_mx
                          hf_*/<name> float32 value of every tensor of the HF dirs
  st_hf_q2/               Qwen2-MoE, v5 layout, bf16, 3 shards (hf_ref.py make)
  st_hf_mx/               Mixtral, v4 layout, f32, one file
  st_hf_f8/               Qwen3-MoE, v4, FP8 (F8_E4M3 + *_scale_inv blocks of 32x16), 2 shards
"""
import argparse
import os
import shutil
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_ref  # noqa: E402
from hf import st  # noqa: E402


def e4m3(b):
    """float8 e4m3fn by its definition (exact in float32)."""
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        v = np.nan
    elif e == 0:
        v = m / 8.0 * 2.0 ** -6
    else:
        v = (1 + m / 8.0) * 2.0 ** (e - 7)
    return np.float32(-v if s else v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 6, 7, generator=g) * 3
    t = {
        "experts.f32": x,
        "experts.bf16": x.to(torch.bfloat16),
        "experts.f16": (x * 100).to(torch.float16),     # large enough for f16's range edges to matter
        "vec.f64": torch.randn(9, generator=g, dtype=torch.float64),
        "mat.i8": torch.randint(-128, 128, (3, 5), generator=g, dtype=torch.int8),
        "mat.u8": torch.randint(0, 256, (2, 7), generator=g, dtype=torch.uint8),
        "mat.i16": torch.randint(-30000, 30000, (4, 3), generator=g, dtype=torch.int16),
        "ids.i32": torch.randint(-2 ** 31, 2 ** 31 - 1, (6,), generator=g, dtype=torch.int32),
        "ids.i64": torch.randint(-2 ** 62, 2 ** 62, (2, 2), generator=g, dtype=torch.int64),
        "mask.bool": torch.rand(3, 3, generator=g) > 0.5,
        "scalar.f32": torch.tensor(2.5),
        "empty.f32": torch.zeros(0, 3),
        # subnormals, infinities and a NaN through f16 and bf16
        "edge.f16": torch.tensor([6e-8, -6e-8, 65504, -65504, float("inf"), 1e-5], dtype=torch.float16),
        "edge.bf16": torch.tensor([1e-40, -3e38, float("inf"), -float("inf"), 1.0, 0.0], dtype=torch.bfloat16),
    }
    f8 = bytes(range(256))
    tensors = dict(t)
    tensors["all.f8"] = ("F8_E4M3", [16, 16], f8)
    st.save_file(tensors, os.path.join(a.out, "st_dtypes.safetensors"), metadata={"format": "pt", "note": "fixture"})

    with h5py.File(os.path.join(a.out, "st_expect.h5"), "w") as f:
        for name, v in t.items():
            if v.dtype in (torch.float32, torch.float16, torch.bfloat16):
                f["f32/" + name] = v.to(torch.float32).numpy()
            f["raw/" + name] = np.frombuffer(st.tensor_bytes(v), dtype=np.uint8)
        f["f32/all.f8"] = np.array([e4m3(b) for b in range(256)], dtype=np.float32).reshape(16, 16)
        f["raw/all.f8"] = np.frombuffer(f8, dtype=np.uint8)
        # boxes: one dim, several, whole trailing dims (merged runs), single elements, empty
        boxes = [((0, 0, 0), (5, 6, 7)), ((2, 0, 0), (2, 6, 7)), ((0, 3, 0), (5, 3, 7)), ((0, 0, 4), (5, 6, 3)),
                 ((1, 2, 3), (3, 2, 4)), ((4, 5, 6), (1, 1, 1)), ((0, 0, 0), (1, 6, 7)), ((3, 0, 2), (2, 6, 5)),
                 ((1, 1, 0), (0, 2, 7))]
        i = 0
        for which, name in enumerate(("experts.f32", "experts.bf16", "experts.f16")):
            full = t[name].to(torch.float32).numpy()
            for s, c in boxes:
                grp = f.create_group("slice/%d" % i)
                grp["which"] = np.array([which], dtype=np.int32)
                grp["start"] = np.array(s, dtype=np.int32)
                grp["count"] = np.array(c, dtype=np.int32)
                grp["want"] = full[s[0]:s[0] + c[0], s[1]:s[1] + c[1], s[2]:s[2] + c[2]].reshape(-1)
                grp["raw"] = np.frombuffer(st.tensor_bytes(t[name][s[0]:s[0] + c[0], s[1]:s[1] + c[1],
                                                              s[2]:s[2] + c[2]]), dtype=np.uint8)
                i += 1
        f.attrs["n_slices"] = i

        for tag, fam, kw in (("hf_q2", "qwen2_moe", dict(dtype="bf16", shards=3, layout="v5", seed=2)),
                             ("hf_mx", "mixtral", dict(dtype="f32", shards=1, layout="v4", seed=1))):
            d = os.path.join(a.out, "st_" + tag)
            shutil.rmtree(d, ignore_errors=True)
            _, tens = hf_ref.make(fam, d, **kw)
            for name, v in tens.items():
                f[tag + "/" + name] = v.to(torch.float32).numpy()
            f.attrs["n_" + tag] = len(tens)
        # FP8 (DeepSeek-V3's format) on Qwen3-MoE: F8_E4M3 projections with block scales of 32x16
        # (edge blocks partial); the expected float32 values are hf_ref's dequantization (q * s)
        d = os.path.join(a.out, "st_hf_f8")
        shutil.rmtree(d, ignore_errors=True)
        hf_ref.make("qwen3_moe", d, dtype="fp8", shards=2, seed=3)
        _, deq = hf_ref.load(d)
        for name, v in deq.items():
            f["hf_f8/" + name] = v.to(torch.float32).numpy()
        f.attrs["n_hf_f8"] = len(deq)
    print("fixtures_safetensors: st_dtypes.safetensors, 3 HF dirs, st_expect.h5 in %s" % a.out)


if __name__ == "__main__":
    main()

"""tests/ref/hf/st.py - a small safetensors writer and reader (Debian has no
`safetensors` package), laid out as the reference implementation writes
(huggingface/safetensors, safetensors/src/tensor.rs `prepare`):

    8 bytes   N, little-endian u64
    N bytes   compact JSON: {"__metadata__": {...}, name: {"dtype", "shape",
              "data_offsets"}, ...}, padded with spaces to a multiple of 8
    data      tensors back to back, in header order: sorted by dtype
              (widest alignment first) then by name, as the reference sorts

plus the sharded form transformers writes: model-0000i-of-0000n.safetensors
and model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"},
indent 2, sorted keys).  Tensors are torch tensors; bfloat16 goes through its
int16 bit pattern (numpy has no bfloat16).
"""
import json
import os
import struct

import numpy as np
import torch

# name -> (torch dtype, element size); the order is the reference's Dtype
# enum order, which its writer sorts by (descending).
DTYPES = {
    "BOOL": (torch.bool, 1), "U8": (torch.uint8, 1), "I8": (torch.int8, 1),
    "I16": (torch.int16, 2), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
    "I32": (torch.int32, 4), "F32": (torch.float32, 4), "F64": (torch.float64, 8),
    "I64": (torch.int64, 8),
}
ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
         "I32", "U32", "F32", "F64", "I64", "U64", "C64"]
TORCH_TO_ST = {v[0]: k for k, v in DTYPES.items()}


# ---------------------------------------------------------------- F8_E4M3 (torch 1.13 has no float8)
# e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
# 0x7F / 0xFF are NaN; the largest finite value is 448; e = 0 is subnormal
# (m 2^-9).  Writers pass F8 tensors as ("F8_E4M3", shape, raw bytes).

def f8e4m3_decode_table():
    """float32 value of each of the 256 codes."""
    v = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sgn, e, m = (-1.0 if b & 0x80 else 1.0), (b >> 3) & 0xF, b & 0x7
        if e == 15 and m == 7:
            v[b] = np.nan
        elif e == 0:
            v[b] = sgn * m * 2.0 ** -9
        else:
            v[b] = sgn * (1 + m / 8.0) * 2.0 ** (e - 7)
    return v


F8_TABLE = f8e4m3_decode_table()
_POS = np.arange(0x7F)                    # codes 0 .. 0x7E: the finite non-negative values, increasing
_POS_V = F8_TABLE[_POS].astype(np.float64)


def f8e4m3_encode(x):
    """Nearest e4m3fn code of each float (ties to the even code), saturating
    at +-448 (what torch's float8_e4m3fn cast gives for finite values in
    range).  x: numpy float array -> uint8 array of the same shape."""
    a = np.abs(np.asarray(x, dtype=np.float64)).ravel()
    a = np.minimum(a, 448.0)
    hi = np.clip(np.searchsorted(_POS_V, a, side="left"), 0, len(_POS) - 1)
    lo = np.clip(hi - 1, 0, len(_POS) - 1)
    dlo, dhi = a - _POS_V[lo], _POS_V[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = _POS[pick].astype(np.uint8)
    neg = (np.asarray(x).ravel() < 0) & (code != 0)
    code = np.where(neg, code | 0x80, code).astype(np.uint8)
    return code.reshape(np.shape(x))


def f8e4m3_to_f32(codes):
    """uint8 codes -> float32 torch tensor (exact)."""
    return torch.from_numpy(F8_TABLE[np.asarray(codes, dtype=np.uint8)])


def tensor_bytes(t):
    """Raw little-endian bytes of a torch tensor, row-major."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def build(tensors, metadata=None, order=None):
    """tensors: dict name -> torch tensor (or (dtype name, shape, raw bytes)
    for types torch lacks).  Returns the file's bytes.  order (a list of
    names) overrides the reference's sort, for tests of unusual layouts."""
    items = []
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dt, shape, raw = t
        else:
            dt, shape, raw = TORCH_TO_ST[t.dtype], list(t.shape), tensor_bytes(t)
        items.append((name, dt, [int(s) for s in shape], raw))
    if order is None:
        items.sort(key=lambda it: (-ORDER.index(it[1]), it[0]))
    else:
        pos = {n: i for i, n in enumerate(order)}
        items.sort(key=lambda it: pos[it[0]])
    header = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    off = 0
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(it[3] for it in items)


def save_file(tensors, path, metadata=None):
    with open(path, "wb") as f:
        f.write(build(tensors, metadata))


def shard_names(n):
    return ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]


def save_sharded(tensors, out_dir, n_shards, metadata=None):
    """Splits tensors (in their dict order, the state-dict order) into
    n_shards contiguous groups of about equal bytes and writes them with the
    index.  n_shards == 1 writes model.safetensors alone, as transformers
    does below its shard size."""
    os.makedirs(out_dir, exist_ok=True)
    if n_shards <= 1:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata)
        return
    names = list(tensors)
    if n_shards > len(names):
        raise ValueError("%d shards for %d tensors" % (n_shards, len(names)))
    sizes = [len(tensors[n][2]) if isinstance(tensors[n], tuple) else tensors[n].numel() * tensors[n].element_size()
             for n in names]
    total, target = sum(sizes), sum(sizes) / n_shards
    groups, cur = [[]], 0
    for i, (n, s) in enumerate(zip(names, sizes)):
        left, unopened = len(names) - i, n_shards - len(groups)
        # a new shard when this one is full, or when every tensor left must open one
        if groups[-1] and unopened > 0 and (cur >= target or left <= unopened):
            groups.append([])
            cur = 0
        groups[-1].append(n)
        cur += s
    files = shard_names(n_shards)
    weight_map = {}
    for fname, group in zip(files, groups):
        save_file({n: tensors[n] for n in group}, os.path.join(out_dir, fname), metadata)
        for n in group:
            weight_map[n] = fname
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def load_file(path):
    """name -> torch tensor (a copy), in header order."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode())
    data = buf[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, shape = info["dtype"], info["shape"]
        b, e = info["data_offsets"]
        if dt == "F8_E4M3":                 # decoded to float32, exactly
            count = int(np.prod(shape)) if shape else 1
            assert e - b == count and e <= len(data), "%s: %s: bad data_offsets" % (path, name)
            out[name] = f8e4m3_to_f32(np.frombuffer(data[b:e], dtype=np.uint8)).reshape(shape)
            continue
        tdt, size = DTYPES[dt]
        count = int(np.prod(shape)) if shape else 1
        assert e - b == count * size and e <= len(data), "%s: %s: bad data_offsets" % (path, name)
        raw = data[b:e]
        if tdt == torch.bfloat16:
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(raw, dtype=torch.empty(0, dtype=tdt).numpy().dtype).copy())
        out[name] = t.reshape(shape)
    return out


def load_dir(path):
    """A model directory (model.safetensors or the index and its shards), a
    file, or an index -> name -> tensor.  Checks the index against the files."""
    if os.path.isfile(path) and not path.endswith(".index.json"):
        return load_file(path)
    d = path if os.path.isdir(path) else os.path.dirname(path)
    single = os.path.join(d, "model.safetensors")
    if os.path.isdir(path) and os.path.exists(single):
        return load_file(single)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    out = {}
    for fname in sorted(set(wm.values())):
        part = load_file(os.path.join(d, fname))
        for n, t in part.items():
            assert wm.get(n) == fname, "%s: %s is in %s, the index says %s" % (d, n, fname, wm.get(n))
            assert n not in out, "%s: %s in two shards" % (d, n)
            out[n] = t
    missing = set(wm) - set(out)
    assert not missing, "%s: index names tensors no shard holds: %s" % (d, sorted(missing)[:3])
    return out

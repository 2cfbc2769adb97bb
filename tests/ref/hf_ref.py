#!/usr/bin/python3
"""hf_ref.py - PyTorch reference of the Hugging Face MoE families tandem
imports (MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
OlmoeForCausalLM), for tests: tiny random checkpoints in the exact HF
layout, and float64 log-probabilities, gradients and greedy tokens from them.
The math is tests/ref/hf/model.py, the layouts tests/ref/hf/families.py, the
file format tests/ref/hf/st.py (docs/import.md describes all three).

  hf_ref.py make --family F --out DIR [--dtype f32|bf16|fp8] [--shards N] [--layout v4|v5] [--seed S]
      config.json, generation_config.json and model.safetensors, or N shards
      model-0000i-of-0000N.safetensors + model.safetensors.index.json;
      fp8: DeepSeek-V3's release format (every *_proj.weight F8_E4M3 with a
      float32 *_scale_inv per block, quantization_config in config.json;
      the tiny models use blocks of families.FP8_TINY_BLOCK so that a weight
      has several, edge blocks included), the rest bf16
  hf_ref.py logprobs DIR (--ids FILE | --data DATA.bin --seq-len T | --text FILE --seq-len T)
                     [--max-windows N] [--out OUT.json] [--npz OUT.npz]
      --ids: one sequence per row (JSON list of lists, or whitespace/comma
      separated ids one row per line): logprobs[r][t] = log p(ids[t+1] | ids[..t]).
      --data/--text: the windows `tandem score` takes: window i has inputs
      [iT, (i+1)T) and targets [iT+1, (i+1)T+1) of the stream: logprobs [N][T].
      JSON: logprobs, loss (mean -logprob), router_min_gap (smallest margin
      between the k-th and (k+1)-th router probability seen: routing is
      robust to float32 noise when it is well above 1e-6).
  hf_ref.py grads DIR (--ids FILE | --data ... | --text ...) --seq-len T --out G.safetensors
                  [--aux] [--grad-dtype f32|f64] [--max-windows N]
      one training step's gradient of HF's causal LM loss (mean cross-entropy
      over every position; --aux adds router_aux_loss_coef x the load-balancing
      loss, as output_router_logits=true does) with respect to every HF tensor,
      by its HF name, written as safetensors.  --ids rows must have equal
      length (inputs row[:-1], targets row[1:]).  Prints {loss, ce, aux, tokens}.
  hf_ref.py greedy DIR --prompt-ids 1,2,3 --n N
      prints {prompt_ids, ids, logprobs, min_top2_gap}
  hf_ref.py selfcheck
      the reference's own consistency checks (tests/cli/hf_ref.sh runs it)
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf import families, st  # noqa: E402
from hf.model import HFRef  # noqa: E402


# ---------------------------------------------------------------- checkpoints

def make(family, out, dtype="f32", shards=1, layout="v4", seed=0, over=None):
    """Writes the tiny checkpoint; returns (config, tensors as stored)."""
    cfg = families.config_json(family, dtype, layout, over)
    if dtype == "fp8" and "quantization_config" not in cfg:
        cfg["quantization_config"] = families.fp8_config(families.FP8_TINY_BLOCK)
    t = families.random_tensors(cfg, seed)
    if layout == "v5":
        t = families.to_v5(cfg, t)
    if dtype in ("bf16", "fp8"):
        t = {n: v.to(torch.bfloat16) for n, v in t.items()}
    if dtype == "fp8":
        t = families.quantize_fp8(t, cfg["quantization_config"]["weight_block_size"])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = {"_from_model_config": True, "transformers_version": cfg["transformers_version"]}
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if k in cfg:
            gen[k] = cfg[k]
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        f.write(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    st.save_sharded(t, out, shards, metadata={"format": "pt"})
    return cfg, t


def load(d, requires_grad=False):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    t = families.dequantize_fp8(cfg, st.load_dir(d))
    if requires_grad:
        t = {n: v.to(torch.float64).requires_grad_(True) for n, v in t.items()}
    return cfg, t


# ---------------------------------------------------------------- inputs

def read_ids(path):
    with open(path) as f:
        text = f.read()
    try:
        v = json.loads(text)
        rows = v if v and isinstance(v[0], list) else [v]
    except ValueError:
        rows = [[int(x) for x in line.replace(",", " ").split()] for line in text.splitlines() if line.strip()]
    if not rows or any(len(r) < 2 for r in rows):
        raise SystemExit("hf_ref: %s: every row needs at least 2 ids" % path)
    return rows


def read_stream(data=None, text=None):
    """The token stream `tandem score` reads (docs/data.md)."""
    if text:
        with open(text, "rb") as f:
            return list(f.read())
    with open(data, "rb") as f:
        head = f.read(64)
        if head[:8] != b"TNDMTOK1":
            raise SystemExit("hf_ref: %s: not a tandem token file" % data)
        width, count = struct.unpack("<I", head[12:16])[0], struct.unpack("<Q", head[16:24])[0]
        raw = f.read(count * width)
    dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    return np.frombuffer(raw, dtype=dt).astype(np.int64).tolist()


def windows(stream, T, max_windows=None):
    n = (len(stream) - 1) // T if stream else 0
    if max_windows:
        n = min(n, max_windows)
    if n == 0:
        raise SystemExit("hf_ref: %d tokens hold no whole window of %d (+1 target)" % (len(stream), T))
    s = torch.tensor(stream[: n * T + 1])
    return s[:-1].view(n, T), s[1:].view(n, T)


def batch_of(a):
    """(inputs, targets) (B, T) from --ids (equal rows) or the windows."""
    if a.ids:
        rows = read_ids(a.ids)
        if len({len(r) for r in rows}) != 1:
            raise SystemExit("hf_ref: %s: rows of unequal length" % a.ids)
        t = torch.tensor(rows)
        return t[:, :-1], t[:, 1:]
    if not a.seq_len:
        raise SystemExit("hf_ref: --seq-len is required with --data / --text")
    return windows(read_stream(a.data, a.text), a.seq_len, a.max_windows)


# ---------------------------------------------------------------- commands

def cmd_make(a):
    make(a.family, a.out, a.dtype, a.shards, a.layout, a.seed)
    print(json.dumps({"family": a.family, "out": a.out, "dtype": a.dtype, "shards": a.shards, "layout": a.layout,
                      "seed": a.seed}))


def cmd_logprobs(a):
    cfg, t = load(a.dir)
    ref = HFRef(cfg, t)
    gap = math.inf
    out = []
    with torch.no_grad():
        if a.ids:
            for r in read_ids(a.ids):
                x = torch.tensor([r])
                lp, stats = ref.logprobs(x[:, :-1], x[:, 1:])
                out.append(lp[0].tolist())
                gap = min(gap, stats.get("router_min_gap", math.inf))
        else:
            inp, tgt = batch_of(a)
            lp, stats = ref.logprobs(inp, tgt)
            out = lp.tolist()
            gap = stats.get("router_min_gap", math.inf)
    flat = [v for row in out for v in row]
    res = {"logprobs": out, "loss": -sum(flat) / len(flat), "tokens": len(flat),
           "router_min_gap": gap if gap < math.inf else None}
    if a.npz:
        np.savez(a.npz, logprobs=np.array(out, dtype=object) if len({len(r) for r in out}) > 1 else np.array(out))
    text = json.dumps(res)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def cmd_grads(a):
    cfg, t = load(a.dir, requires_grad=True)
    ref = HFRef(cfg, t)
    inp, tgt = batch_of(a)
    total, ce, aux, stats = ref.loss(inp, tgt, with_aux=a.aux)
    total.backward()
    dt = torch.float64 if a.grad_dtype == "f64" else torch.float32
    # an expert no token chose gets no gradient from autograd: its gradient is 0
    grads = {n: (v.grad if v.grad is not None else torch.zeros_like(v)).to(dt) for n, v in t.items()}
    st.save_file(grads, a.out, metadata={"format": "pt"})
    gap = stats.get("router_min_gap", math.inf)
    print(json.dumps({"loss": float(total), "ce": float(ce), "aux": float(aux), "tokens": int(tgt.numel()),
                      "router_min_gap": gap if gap < math.inf else None, "out": a.out}))


def cmd_greedy(a):
    cfg, t = load(a.dir)
    ref = HFRef(cfg, t)
    prompt = [int(x) for x in a.prompt_ids.replace(",", " ").split()]
    with torch.no_grad():
        ids, lps, gap = ref.greedy(prompt, a.n)
    print(json.dumps({"prompt_ids": prompt, "ids": ids, "logprobs": lps, "min_top2_gap": gap}))


def cmd_selfcheck(a):
    import hf.selfcheck as sc
    return sc.run(a.families or list(families.MAKE_FAMILIES))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--family", required=True, choices=families.MAKE_FAMILIES)
    m.add_argument("--out", required=True)
    m.add_argument("--dtype", default="f32", choices=("f32", "bf16", "fp8"))
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--layout", default="v4", choices=("v4", "v5"))
    m.add_argument("--seed", type=int, default=0)
    for name in ("logprobs", "grads"):
        p = sub.add_parser(name)
        p.add_argument("dir")
        g = p.add_mutually_exclusive_group(required=True)
        g.add_argument("--ids")
        g.add_argument("--data")
        g.add_argument("--text")
        p.add_argument("--seq-len", type=int)
        p.add_argument("--max-windows", type=int)
        if name == "logprobs":
            p.add_argument("--out")
            p.add_argument("--npz")
        else:
            p.add_argument("--out", required=True)
            p.add_argument("--aux", action="store_true")
            p.add_argument("--grad-dtype", default="f32", choices=("f32", "f64"))
    g = sub.add_parser("greedy")
    g.add_argument("dir")
    g.add_argument("--prompt-ids", required=True)
    g.add_argument("--n", type=int, required=True)
    s = sub.add_parser("selfcheck")
    s.add_argument("--families", nargs="*")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        rc = {"make": cmd_make, "logprobs": cmd_logprobs, "grads": cmd_grads, "greedy": cmd_greedy,
              "selfcheck": cmd_selfcheck}[a.cmd](a)
    except (ValueError, OSError, KeyError, AssertionError) as e:
        print("hf_ref: %s: %s" % (a.cmd, e), file=sys.stderr)
        return 1
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())

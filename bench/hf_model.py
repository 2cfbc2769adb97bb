#!/usr/bin/python3
"""bench/hf_model.py - a Qwen3-MoE-shaped Hugging Face checkpoint of a few
hundred MB for bench/import.sh, written with numpy alone (fast): the v4
layout every released checkpoint has (one tensor per expert matrix), bf16,
split into shards and indexed as transformers writes them, each file laid
out as the safetensors reference writer lays it out (tests/ref/hf/st.py).
Values are N(0, 0.02) (norms 1): the bench measures bytes, not quality.

  hf_model.py OUT_DIR [--layers 4] [--experts 32] [--hidden 1024] [--moe 256] [--vocab 8192] [--shards 2]
"""
import argparse
import json
import os
import struct

import numpy as np


def bf16(a):
    """float32 array -> bfloat16 bits (uint16), round to nearest even."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--moe", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--shards", type=int, default=2)
    a = ap.parse_args()
    d, E, F, V, H, Hkv = a.hidden, a.experts, a.moe, a.vocab, a.heads, a.kv_heads
    hd = d // H
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "decoder_sparse_step": 1, "head_dim": hd, "hidden_act": "silu", "hidden_size": d,
           "initializer_range": 0.02, "intermediate_size": 4 * d, "max_position_embeddings": 4096,
           "max_window_layers": a.layers, "mlp_only_layers": [], "model_type": "qwen3_moe",
           "moe_intermediate_size": F, "norm_topk_prob": True, "num_attention_heads": H, "num_experts": E,
           "num_experts_per_tok": 4, "num_hidden_layers": a.layers, "num_key_value_heads": Hkv,
           "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
           "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "transformers_version": "4.51.3", "use_cache": True,
           "use_sliding_window": False, "vocab_size": V}
    shapes = [("model.embed_tokens.weight", (V, d))]
    for l in range(a.layers):
        p = "model.layers.%d." % l
        shapes += [(p + "self_attn.q_proj.weight", (H * hd, d)), (p + "self_attn.k_proj.weight", (Hkv * hd, d)),
                   (p + "self_attn.v_proj.weight", (Hkv * hd, d)), (p + "self_attn.o_proj.weight", (d, H * hd)),
                   (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                   (p + "mlp.gate.weight", (E, d))]
        for e in range(E):
            for n, s in (("gate_proj", (F, d)), ("up_proj", (F, d)), ("down_proj", (d, F))):
                shapes.append((p + "mlp.experts.%d.%s.weight" % (e, n), s))
        shapes += [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]
    shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (V, d))]
    rng = np.random.default_rng(0)
    pool = bf16(rng.standard_normal(1 << 22, dtype=np.float32) * 0.02)   # reused: bytes, not quality
    one = bf16(np.ones(1, np.float32))[0]

    def data(name, shape):
        n = int(np.prod(shape))
        if len(shape) == 1:
            return np.full(n, one, np.uint16)
        reps = -(-n // pool.size)
        return np.tile(pool, reps)[:n] if reps > 1 else pool[:n]

    sizes = [int(np.prod(s)) * 2 for _, s in shapes]
    target = sum(sizes) / a.shards
    groups, cur = [[]], 0
    for (n, s), b in zip(shapes, sizes):
        if groups[-1] and cur >= target and len(groups) < a.shards:
            groups.append([])
            cur = 0
        groups[-1].append((n, s))
        cur += b
    os.makedirs(a.out, exist_ok=True)
    names = ["model-%05d-of-%05d.safetensors" % (i + 1, len(groups)) for i in range(len(groups))]
    wm = {}
    for fname, g in zip(names, groups):
        g = sorted(g, key=lambda x: x[0])   # one dtype: the reference sorts by name
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for n, s in g:
            b = int(np.prod(s)) * 2
            header[n] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + b]}
            off += b
            wm[n] = fname
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for n, s in g:
                f.write(data(n, s).tobytes())
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(sizes)}, "weight_map": wm}, f, indent=2, sort_keys=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    print(json.dumps({"out": a.out, "bytes": sum(sizes), "tensors": len(shapes), "shards": len(groups),
                      "largest": max(sizes)}))


if __name__ == "__main__":
    main()

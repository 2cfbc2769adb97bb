#!/usr/bin/python3
"""Fixtures for tests/test_model.c: whole-model loss and gradients from the
PyTorch reference (tests/ref/tandem_ref.py) on random weights.

The reference runs in float64 on weights first rounded to float32 (what tandem
holds), so the comparison measures tandem's float32 arithmetic only.
Each case file holds: attrs config (JSON), loss, ce, aux, z; datasets ids,
targets (B, T), logp (B, T), w/<name> and g/<name> (gradient of the loss).
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tandem_ref import TandemRef, random_weights  # noqa: E402

BASE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, moe_intermediate_size=24, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=64,
            router_aux_loss_coef=0.02, router_z_loss_coef=0.01)

CASES = {
    # GQA 2:1, top-2 of 4, renormalised
    "model_base": dict(),
    # shared experts, a dense first layer, tied embeddings, k=1, no renormalisation, MHA
    "model_variants": dict(num_hidden_layers=3, n_shared_experts=1, first_k_dense_replace=1,
                           intermediate_size=40, tie_word_embeddings=True, num_experts_per_tok=1,
                           norm_topk_prob=False, num_key_value_heads=4),
    # odd sizes: hidden 24 over 3 heads of 8, 3 experts top-2, one kv head
    "model_odd": dict(hidden_size=24, num_attention_heads=3, num_key_value_heads=1,
                      moe_intermediate_size=20, num_local_experts=3, vocab_size=50),
    # Qwen2-MoE-like: q/k/v biases, a shared expert of its own width (no
    # n_shared_experts) behind a sigmoid gate, and the layer schedule
    # decoder_sparse_step 2 + mlp_only_layers: MoE layers 1 and 5 of 6
    "model_qwen2moe": dict(num_hidden_layers=6, qkv_bias=True, shared_expert_intermediate_size=40,
                           shared_expert_gate=True, decoder_sparse_step=2, mlp_only_layers=[3],
                           intermediate_size=36, norm_topk_prob=False, num_local_experts=8,
                           num_experts_per_tok=4),
    # Qwen3-MoE-like: q/k norm per head, head_dim 12 != 32 / 4, top-4 of 8
    # renormalised
    "model_qwen3moe": dict(qk_norm="head", head_dim=12, num_local_experts=8, num_experts_per_tok=4,
                           norm_topk_prob=True),
    # OLMoE-like: q/k norm over the whole width, clip_qkv (v_proj scaled up so
    # that v is clipped too), biases on q, k, v and o, top-4 of 16
    "model_olmoe": dict(qk_norm="full", clip_qkv=1.0, attention_bias=True, num_local_experts=16,
                        num_experts_per_tok=4, norm_topk_prob=False, moe_intermediate_size=16),
    # DeepSeek-V3-like multi-head latent attention (docs/mla.md): q through
    # q_a_proj / q_a_layernorm / q_b_proj, latent 16 + rope 4 (interleaved
    # pairs), nope 8, v 6 != 12; a dense first layer and a shared expert
    "model_mla": dict(num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8,
                      qk_rope_head_dim=4, v_head_dim=6, rope_interleave=True, first_k_dense_replace=1,
                      intermediate_size=40, n_shared_experts=1),
    # MLA with a plain q_proj (q_lora_rank 0, DeepSeek-V2-Lite), rotate-half RoPE
    "model_mla_q": dict(num_key_value_heads=4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=6,
                        v_head_dim=10),
    # DeepSeek-V3-like: sigmoid router, 4 groups of 2 with 2 kept, the
    # correction bias in the choice, routed_scaling_factor, a shared expert, a
    # dense first layer and moe_layer_freq 2 (MoE layers 2 and 4 of 5), and
    # the sequence-wise balance loss (coefficient SEQ_AUX below)
    "model_v3router": dict(num_hidden_layers=5, scoring_func="sigmoid", topk_method="noaux_tc", n_group=4,
                           topk_group=2, routed_scaling_factor=2.5, num_local_experts=8, num_experts_per_tok=3,
                           n_shared_experts=1, first_k_dense_replace=1, moe_layer_freq=2, intermediate_size=40,
                           router_aux_loss_coef=0.0, router_z_loss_coef=0.0),
}

# sequence-wise balance loss coefficient per case (a run key, not a model key)
SEQ_AUX = {"model_v3router": 0.3}

# per-case weight scales (name suffix -> factor), applied before rounding to float32
SCALE = {"model_olmoe": {"self_attn/v_proj": 4.0}}


def make(name, over, out, B=2, T=19, seed=1):
    cfg = dict(BASE)
    cfg.update(over)
    w = random_weights(cfg, seed)
    for suffix, f in SCALE.get(name, {}).items():
        for k in w:
            if k.endswith(suffix):
                w[k] = w[k] * f
    w = {k: v.float().double().requires_grad_(True) for k, v in w.items()}
    g = torch.Generator().manual_seed(seed + 100)
    V = cfg["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    ref = TandemRef(cfg, w)
    r = ref.loss(ids, targets, SEQ_AUX.get(name, 0.0))
    r["loss"].backward()
    with h5py.File(os.path.join(out, name + ".h5"), "w") as f:
        f.attrs["config"] = json.dumps(cfg)
        for k in ("loss", "ce", "aux", "z", "seq"):
            f.attrs[k] = float(r[k])
        f.attrs["seq_aux_coef"] = SEQ_AUX.get(name, 0.0)
        f["ids"] = ids.numpy().astype(np.int32)
        f["targets"] = targets.numpy().astype(np.int32)
        f["logp"] = r["logp"].detach().numpy().astype(np.float32)
        for k, v in w.items():
            f["w/" + k] = v.detach().numpy().astype(np.float32)
            # state (the router's correction bias) gets no gradient
            f["g/" + k] = (v.grad if v.grad is not None else torch.zeros_like(v)).numpy().astype(np.float32)
        for i, rt in enumerate(r["routes"]):
            f["routes/%d" % i] = rt.numpy().astype(np.int32)
        # two AdamW steps with these gradients (torch's own optimizer, in
        # float32 as tandem holds the state): decay on matrices, not norms
        p32 = {k: v.detach().float().clone().requires_grad_(True) for k, v in w.items()}
        for k, v in p32.items():
            v.grad = w[k].grad.float().clone() if w[k].grad is not None else torch.zeros_like(v)
        groups = [dict(params=[v for v in p32.values() if v.dim() >= 2], weight_decay=0.1),
                  dict(params=[v for v in p32.values() if v.dim() < 2], weight_decay=0.0)]
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
        opt.step()
        for k, v in p32.items():
            f["adam1/" + k] = v.detach().numpy()
        opt.step()   # same gradients again: exercises the bias corrections of step 2
        for k, v in p32.items():
            f["adam2/" + k] = v.detach().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    for name, over in CASES.items():
        make(name, over, a.out)
    print("fixtures_model: %d cases in %s" % (len(CASES), a.out))


if __name__ == "__main__":
    main()

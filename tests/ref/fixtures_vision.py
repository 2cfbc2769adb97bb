#!/usr/bin/env python3
"""tests/ref/fixtures_vision.py - PyTorch references for the vision encoder's
ops (core/ops/layernorm.c, core/ops/gelu.c).

    /usr/bin/python3 tests/ref/fixtures_vision.py --out DIR

writes DIR/layernorm.h5 and DIR/gelu.h5 (read by tests/test_layernorm.c,
tests/test_gelu.c), in the layout of tests/ref/fixtures_ops.py: cases c0,
c1, ..., float32 inputs from a fixed seed, references computed by PyTorch
in float64 from those float32 values (autograd for the gradients of
L = sum(out * dy)) and stored rounded to float32.

DIR/vlm.h5 (tests/test_vision.c): a whole LLaVA-style model, the vision
tower and projector of docs/vision.md written with torch.nn.functional
(conv2d patches, layer_norm, unmasked softmax attention, gelu) feeding
tests/ref/tandem_ref.py's MoE language model at the image placeholders
(masked_scatter, as HF LLaVA): attrs config, loss, ce, aux, z; datasets
ids, targets (B, T), pixels (B, 3, S, S), img (B, P, d) the image vectors,
logp, w/<name>, g/<name> (gradients of the loss, float64 on float32
weights).
"""
import argparse
import math
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
    torch.set_num_threads(1)
    vlm_case(args.out)


# ------------------------------------------------------------------ the whole VLM
VLM = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           moe_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
           router_aux_loss_coef=0.02, router_z_loss_coef=0.01, image_token_index=63,
           vision_config=dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                              image_size=20, patch_size=4, layer_norm_eps=1e-6))
VLM_B, VLM_T, VLM_IMG_AT = 2, 40, (2, 10)   # sequence b holds its image's 25 placeholders from VLM_IMG_AT[b]


def vision_shapes(cfg):
    v, d = cfg["vision_config"], cfg["hidden_size"]
    D, F, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    P = (v["image_size"] // p) ** 2
    e = "vision_tower/vision_model/embeddings/"
    s = {e + "patch_embedding": (D, 3 * p * p), e + "patch_embedding.bias": (D,), e + "position_embedding": (P, D)}
    for l in range(v["num_hidden_layers"]):
        q = "vision_tower/vision_model/encoder/layers/%d/" % l
        for n in ("layer_norm1", "layer_norm2"):
            s[q + n], s[q + n + ".bias"] = (D,), (D,)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[q + "self_attn/" + n], s[q + "self_attn/" + n + ".bias"] = (D, D), (D,)
        s[q + "mlp/fc1"], s[q + "mlp/fc1.bias"] = (F, D), (F,)
        s[q + "mlp/fc2"], s[q + "mlp/fc2.bias"] = (D, F), (D,)
    s["vision_tower/vision_model/post_layernorm"] = (D,)
    s["vision_tower/vision_model/post_layernorm.bias"] = (D,)
    s["multi_modal_projector/linear_1"], s["multi_modal_projector/linear_1.bias"] = (d, D), (d,)
    s["multi_modal_projector/linear_2"], s["multi_modal_projector/linear_2.bias"] = (d, d), (d,)
    return s


def vision_tower(w, cfg, pixels):
    """LLaVA's arrangement with a SigLIP-style tower, written from
    docs/vision.md with torch.nn.functional: (n, 3, S, S) -> (n, P, d)."""
    v = cfg["vision_config"]
    D, H, p, eps = v["hidden_size"], v["num_attention_heads"], v["patch_size"], v["layer_norm_eps"]
    F = torch.nn.functional
    e = "vision_tower/vision_model/embeddings/"
    n = pixels.shape[0]
    conv = w[e + "patch_embedding"].view(D, 3, p, p)
    x = F.conv2d(pixels, conv, w[e + "patch_embedding.bias"], stride=p)   # (n, D, g, g)
    x = x.flatten(2).transpose(1, 2) + w[e + "position_embedding"]        # (n, P, D)
    P, hd = x.shape[1], D // H
    for l in range(v["num_hidden_layers"]):
        q = "vision_tower/vision_model/encoder/layers/%d/" % l
        lin = lambda h, name: F.linear(h, w[q + name], w[q + name + ".bias"])  # noqa: E731
        h = F.layer_norm(x, (D,), w[q + "layer_norm1"], w[q + "layer_norm1.bias"], eps)
        qq, kk, vv = (lin(h, "self_attn/%s_proj" % t).view(n, P, H, hd).transpose(1, 2) for t in "qkv")
        a = torch.softmax(qq @ kk.transpose(-1, -2) / math.sqrt(hd), dim=-1) @ vv   # no mask: bidirectional
        x = x + lin(a.transpose(1, 2).reshape(n, P, D), "self_attn/out_proj")
        h = F.layer_norm(x, (D,), w[q + "layer_norm2"], w[q + "layer_norm2.bias"], eps)
        x = x + lin(F.gelu(lin(h, "mlp/fc1")), "mlp/fc2")
    x = F.layer_norm(x, (D,), w["vision_tower/vision_model/post_layernorm"],
                     w["vision_tower/vision_model/post_layernorm.bias"], eps)
    pj = "multi_modal_projector/"
    return F.linear(F.gelu(F.linear(x, w[pj + "linear_1"], w[pj + "linear_1.bias"])), w[pj + "linear_2"],
                    w[pj + "linear_2.bias"])


def vlm_case(out, seed=7):
    import json
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tandem_ref import TandemRef, random_weights

    cfg = dict(VLM)
    lm = {k: v for k, v in cfg.items() if k not in ("vision_config", "image_token_index")}
    w = random_weights(lm, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for name, shape in vision_shapes(cfg).items():
        if name.endswith(".bias"):
            w[name] = 0.1 * torch.randn(shape, generator=g, dtype=F64)
        elif len(shape) == 1:
            w[name] = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=F64)
        else:
            w[name] = 0.2 * torch.randn(shape, generator=g, dtype=F64)
    w = {k: v.float().double().requires_grad_(True) for k, v in w.items()}
    v = cfg["vision_config"]
    S, P = v["image_size"], (v["image_size"] // v["patch_size"]) ** 2
    B, T, tok = VLM_B, VLM_T, cfg["image_token_index"]
    ids = torch.randint(0, tok, (B, T), generator=g)
    for b in range(B):
        ids[b, VLM_IMG_AT[b]:VLM_IMG_AT[b] + P] = tok
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    pixels = torch.rand((B, 3, S, S), generator=g, dtype=F64).float().double() * 2 - 1

    class Vlm(TandemRef):
        def embed(self, ids_):
            x = self.w["model/embed_tokens"][ids_]
            img = vision_tower(self.w, cfg, pixels).reshape(-1, cfg["hidden_size"])
            return x.masked_scatter((ids_ == tok)[..., None].expand_as(x), img)

    r = Vlm(lm, w).loss(ids, targets)
    r["loss"].backward()
    with h5py.File(os.path.join(out, "vlm.h5"), "w") as f:
        f.attrs["config"] = json.dumps(cfg)
        for k in ("loss", "ce", "aux", "z"):
            f.attrs[k] = float(r[k])
        f["ids"] = ids.numpy().astype(np.int32)
        f["targets"] = targets.numpy().astype(np.int32)
        f["pixels"] = pixels.numpy().astype(np.float32)
        f["logp"] = r["logp"].detach().numpy().astype(np.float32)
        f["img"] = f32(vision_tower(w, cfg, pixels))
        for k, t in w.items():
            f["w/" + k] = t.detach().numpy().astype(np.float32)
            f["g/" + k] = (t.grad if t.grad is not None else torch.zeros_like(t)).numpy().astype(np.float32)


if __name__ == "__main__":
    main()

"""tandem_ref.py - a plain PyTorch implementation of the model of SPEC section 2.

Written from the spec, independently of the C code, so that tests can compare
tandem's loss and gradients with it.  Weights use the checkpoint names of SPEC
section 4 ("model/layers/0/self_attn/q_proj", ...).

    ref = TandemRef(cfg, weights)          # weights: dict name -> tensor
    out = ref.loss(ids, targets)           # dict: loss, ce, aux, z, logp
"""
import json
import math

import torch

DEFAULTS = dict(vocab_size=256, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=0, head_dim=0, intermediate_size=0, moe_intermediate_size=0,
                num_local_experts=8, num_experts_per_tok=2, n_shared_experts=0,
                first_k_dense_replace=0, rope_theta=10000.0, rms_norm_eps=1e-5,
                max_position_embeddings=4096, tie_word_embeddings=False, norm_topk_prob=True,
                router_aux_loss_coef=0.01, router_z_loss_coef=0.001)


def full_config(cfg):
    c = dict(DEFAULTS)
    c.update(cfg)
    if not c["num_key_value_heads"]:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if not c["head_dim"]:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if not c["intermediate_size"]:
        c["intermediate_size"] = 4 * c["hidden_size"]
    if not c["moe_intermediate_size"]:
        c["moe_intermediate_size"] = 2 * c["hidden_size"]
    return c


def param_shapes(cfg):
    """name -> shape, in checkpoint order (SPEC section 4)."""
    c = full_config(cfg)
    d, hd, H, Hkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    V, E, F = c["vocab_size"], c["num_local_experts"], c["moe_intermediate_size"]
    out = {"model/embed_tokens": (V, d)}
    for l in range(c["num_hidden_layers"]):
        p = "model/layers/%d/" % l
        out[p + "input_layernorm"] = (d,)
        out[p + "self_attn/q_proj"] = (H * hd, d)
        out[p + "self_attn/k_proj"] = (Hkv * hd, d)
        out[p + "self_attn/v_proj"] = (Hkv * hd, d)
        out[p + "self_attn/o_proj"] = (d, H * hd)
        out[p + "post_attention_layernorm"] = (d,)
        if l < c["first_k_dense_replace"]:
            Fd = c["intermediate_size"]
            out[p + "mlp/gate_proj"] = (Fd, d)
            out[p + "mlp/up_proj"] = (Fd, d)
            out[p + "mlp/down_proj"] = (d, Fd)
        else:
            out[p + "mlp/gate"] = (E, d)
            out[p + "mlp/experts/gate_proj"] = (E, F, d)
            out[p + "mlp/experts/up_proj"] = (E, F, d)
            out[p + "mlp/experts/down_proj"] = (E, d, F)
            if c["n_shared_experts"] > 0:
                S = F * c["n_shared_experts"]
                out[p + "mlp/shared_experts/gate_proj"] = (S, d)
                out[p + "mlp/shared_experts/up_proj"] = (S, d)
                out[p + "mlp/shared_experts/down_proj"] = (d, S)
    out["model/norm"] = (d,)
    if not c["tie_word_embeddings"]:
        out["lm_head"] = (V, d)
    return out


def random_weights(cfg, seed, dtype=torch.float64, std=0.05):
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            w[name] = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=dtype)
        else:
            w[name] = std * torch.randn(shape, generator=g, dtype=dtype)
    return w


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """x: (B, heads, T, hd); HF rotate-half."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = pos.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


class TandemRef:
    def __init__(self, cfg, weights):
        self.c = full_config(cfg)
        self.w = weights

    def swiglu(self, h, g, u, dn):
        return torch.nn.functional.silu(h @ g.T) * (h @ u.T) @ dn.T

    def forward(self, ids):
        """ids: (B, T) long.  Returns logits (B, T, V), aux list, z list, routes."""
        c, w = self.c, self.w
        B, T = ids.shape
        d, hd = c["hidden_size"], c["head_dim"]
        H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        E, k = c["num_local_experts"], c["num_experts_per_tok"]
        eps = c["rms_norm_eps"]
        x = w["model/embed_tokens"][ids]
        pos = torch.arange(T)
        auxes, zs, routes = [], [], []
        mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        for l in range(c["num_hidden_layers"]):
            p = "model/layers/%d/" % l
            h = rmsnorm(x, w[p + "input_layernorm"], eps)
            q = (h @ w[p + "self_attn/q_proj"].T).view(B, T, H, hd).transpose(1, 2)
            kk = (h @ w[p + "self_attn/k_proj"].T).view(B, T, Hkv, hd).transpose(1, 2)
            v = (h @ w[p + "self_attn/v_proj"].T).view(B, T, Hkv, hd).transpose(1, 2)
            q, kk = rope(q, pos, c["rope_theta"]), rope(kk, pos, c["rope_theta"])
            rep = H // Hkv
            kk = kk.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            s = q @ kk.transpose(-1, -2) / math.sqrt(hd) + mask
            a = torch.softmax(s, dim=-1) @ v
            a = a.transpose(1, 2).reshape(B, T, H * hd)
            x = x + a @ w[p + "self_attn/o_proj"].T
            h = rmsnorm(x, w[p + "post_attention_layernorm"], eps)
            if l < c["first_k_dense_replace"]:
                x = x + self.swiglu(h, w[p + "mlp/gate_proj"], w[p + "mlp/up_proj"], w[p + "mlp/down_proj"])
                continue
            hf = h.reshape(B * T, d)
            logits = (hf @ w[p + "mlp/gate"].T).to(torch.float32 if hf.dtype == torch.float32 else hf.dtype)
            probs = torch.softmax(logits, dim=-1)
            # top-k, ties to the lower index: a stable sort on -p keeps index order among equals
            order = torch.sort(-probs.detach(), dim=-1, stable=True).indices[:, :k]
            wk = probs.gather(1, order)
            if c["norm_topk_prob"]:
                wk = wk / wk.sum(-1, keepdim=True)
            y = torch.zeros_like(hf)
            for e in range(E):
                sel = (order == e)
                tok = sel.any(-1).nonzero().flatten()
                if tok.numel() == 0:
                    continue
                we = (wk * sel).sum(-1)[tok]
                ye = self.swiglu(hf[tok], w[p + "mlp/experts/gate_proj"][e], w[p + "mlp/experts/up_proj"][e],
                                 w[p + "mlp/experts/down_proj"][e])
                y = y.index_add(0, tok, we[:, None] * ye)
            if c["n_shared_experts"] > 0:
                y = y + self.swiglu(hf, w[p + "mlp/shared_experts/gate_proj"], w[p + "mlp/shared_experts/up_proj"],
                                    w[p + "mlp/shared_experts/down_proj"])
            x = x + y.view(B, T, d)
            N = B * T
            count = torch.zeros(E, dtype=probs.dtype).index_add(0, order.flatten(), torch.ones(N * k, dtype=probs.dtype))
            P = probs.mean(0)
            auxes.append(E / (N * k) * (count.detach() * P).sum())
            zs.append(torch.logsumexp(logits, dim=-1).pow(2).mean())
            routes.append(order)
        x = rmsnorm(x, w["model/norm"], eps)
        head = w["model/embed_tokens"] if c["tie_word_embeddings"] else w["lm_head"]
        return x @ head.T, auxes, zs, routes

    def loss(self, ids, targets):
        logits, auxes, zs, routes = self.forward(ids)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets[..., None])[..., 0]
        ce = -logp.mean()
        aux = torch.stack(auxes).mean() if auxes else torch.zeros((), dtype=ce.dtype)
        z = torch.stack(zs).mean() if zs else torch.zeros((), dtype=ce.dtype)
        loss = ce + self.c["router_aux_loss_coef"] * aux + self.c["router_z_loss_coef"] * z
        return dict(loss=loss, ce=ce, aux=aux, z=z, logp=logp, routes=routes)


def load_h5(path):
    """A tandem checkpoint (SPEC section 4) -> (config dict, weights dict of float64 tensors)."""
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        w = {}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and (name.startswith("model/") or name == "lm_head"):
                a = obj[()]
                if obj.attrs.get("dtype", b"") in (b"bfloat16", "bfloat16"):
                    a = (a.astype(np.uint32) << 16).view(np.float32)
                w[name] = torch.from_numpy(np.asarray(a, dtype=np.float64))
        f.visititems(visit)
    return cfg, w

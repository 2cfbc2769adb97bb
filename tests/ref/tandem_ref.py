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
                router_aux_loss_coef=0.01, router_z_loss_coef=0.001,
                # Hugging Face families (docs/config.md)
                attention_bias=False, qkv_bias=False, qk_norm="none", clip_qkv=0.0,
                shared_expert_intermediate_size=0, shared_expert_gate=False,
                decoder_sparse_step=1, mlp_only_layers=[],
                # multi-head latent attention (DeepSeek-V3, docs/mla.md)
                q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0,
                rope_interleave=False,
                # DeepSeek-V3 router
                scoring_func="softmax", topk_method="greedy", n_group=1, topk_group=1,
                routed_scaling_factor=1.0, moe_layer_freq=1)


def full_config(cfg):
    c = dict(DEFAULTS)
    c.update(cfg)
    if not c["num_key_value_heads"]:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if not c["head_dim"] and c["kv_lora_rank"]:
        c["head_dim"] = c["qk_rope_head_dim"]   # as HF DeepseekV3Config
    if not c["head_dim"]:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if not c["intermediate_size"]:
        c["intermediate_size"] = 4 * c["hidden_size"]
    if not c["moe_intermediate_size"]:
        c["moe_intermediate_size"] = 2 * c["hidden_size"]
    return c


def is_moe(c, l):
    """Qwen2-MoE's rule, with first_k_dense_replace and moe_layer_freq (DeepSeek's)."""
    return (l >= c["first_k_dense_replace"] and l not in c["mlp_only_layers"]
            and (l + 1) % c["decoder_sparse_step"] == 0 and l % c["moe_layer_freq"] == 0)


def shared_width(c):
    return c["shared_expert_intermediate_size"] or c["moe_intermediate_size"] * c["n_shared_experts"]


def attn_shapes(c, p):
    """The ordinary attention block's tensors of the layer with prefix p."""
    d, hd, H, Hkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    out = {}
    out[p + "self_attn/q_proj"] = (H * hd, d)
    out[p + "self_attn/k_proj"] = (Hkv * hd, d)
    out[p + "self_attn/v_proj"] = (Hkv * hd, d)
    out[p + "self_attn/o_proj"] = (d, H * hd)
    if c["attention_bias"] or c["qkv_bias"]:
        out[p + "self_attn/q_proj.bias"] = (H * hd,)
        out[p + "self_attn/k_proj.bias"] = (Hkv * hd,)
        out[p + "self_attn/v_proj.bias"] = (Hkv * hd,)
    if c["attention_bias"]:
        out[p + "self_attn/o_proj.bias"] = (d,)
    if c["qk_norm"] == "head":
        out[p + "self_attn/q_norm"] = (hd,)
        out[p + "self_attn/k_norm"] = (hd,)
    elif c["qk_norm"] == "full":
        out[p + "self_attn/q_norm"] = (H * hd,)
        out[p + "self_attn/k_norm"] = (Hkv * hd,)
    return out


def mla_shapes(c, p):
    """Multi-head latent attention's tensors (HF DeepseekV3Attention names)."""
    d, H, qr, r = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    out = {}
    if qr:
        out[p + "self_attn/q_a_proj"] = (qr, d)
        out[p + "self_attn/q_a_layernorm"] = (qr,)
        out[p + "self_attn/q_b_proj"] = (H * (nope + rope), qr)
    else:
        out[p + "self_attn/q_proj"] = (H * (nope + rope), d)
    out[p + "self_attn/kv_a_proj_with_mqa"] = (r + rope, d)
    out[p + "self_attn/kv_a_layernorm"] = (r,)
    out[p + "self_attn/kv_b_proj"] = (H * (nope + v), r)
    out[p + "self_attn/o_proj"] = (d, H * v)
    return out


def param_shapes(cfg):
    """name -> shape, in checkpoint order (SPEC section 4)."""
    c = full_config(cfg)
    d, hd, H, Hkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    V, E, F = c["vocab_size"], c["num_local_experts"], c["moe_intermediate_size"]
    out = {"model/embed_tokens": (V, d)}
    for l in range(c["num_hidden_layers"]):
        p = "model/layers/%d/" % l
        out[p + "input_layernorm"] = (d,)
        if c["kv_lora_rank"]:
            out.update(mla_shapes(c, p))
        else:
            out.update(attn_shapes(c, p))
        out[p + "post_attention_layernorm"] = (d,)
        if not is_moe(c, l):
            Fd = c["intermediate_size"]
            out[p + "mlp/gate_proj"] = (Fd, d)
            out[p + "mlp/up_proj"] = (Fd, d)
            out[p + "mlp/down_proj"] = (d, Fd)
        else:
            out[p + "mlp/gate"] = (E, d)
            if c["topk_method"] == "noaux_tc":
                out[p + "mlp/gate.e_score_correction_bias"] = (E,)
            out[p + "mlp/experts/gate_proj"] = (E, F, d)
            out[p + "mlp/experts/up_proj"] = (E, F, d)
            out[p + "mlp/experts/down_proj"] = (E, d, F)
            S = shared_width(c)
            if S > 0:
                out[p + "mlp/shared_experts/gate_proj"] = (S, d)
                out[p + "mlp/shared_experts/up_proj"] = (S, d)
                out[p + "mlp/shared_experts/down_proj"] = (d, S)
                if c["shared_expert_gate"]:
                    out[p + "mlp/shared_expert_gate"] = (1, d)
    out["model/norm"] = (d,)
    if not c["tie_word_embeddings"]:
        out["lm_head"] = (V, d)
    return out


def random_weights(cfg, seed, dtype=torch.float64, std=0.05):
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".bias"):
            w[name] = 0.1 * torch.randn(shape, generator=g, dtype=dtype)
        elif len(shape) == 1:
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


def rope_interleave(x, pos, theta):
    """HF DeepSeek-V3's apply_rotary_pos_emb_interleave on one tensor: the
    dims de-interleaved (x0, x2, ..., x1, x3, ...), then rotate-half."""
    b, h, s, d = x.shape
    x = x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return rope(x, pos, theta)


class TandemRef:
    def __init__(self, cfg, weights):
        self.c = full_config(cfg)
        self.w = weights

    def embed(self, ids):
        """The input rows (B, T, d); a VLM reference (tests/ref/fixtures_vision.py)
        puts image vectors in the placeholders' rows."""
        return self.w["model/embed_tokens"][ids]

    def swiglu(self, h, g, u, dn):
        return torch.nn.functional.silu(h @ g.T) * (h @ u.T) @ dn.T

    def qkv(self, h, p):
        """q, k, v (B, T, H*hd) (B, T, Hkv*hd) as HF computes them: projection
        (+ bias), then q_norm / k_norm (Qwen3-MoE per head, OLMoE over the whole
        width), then OLMoE's clamp of all three."""
        c, w = self.c, self.w
        B, T, _ = h.shape
        H, Hkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        out = []
        for name in ("q", "k", "v"):
            y = h @ w[p + "self_attn/%s_proj" % name].T
            if c["attention_bias"] or c["qkv_bias"]:
                y = y + w[p + "self_attn/%s_proj.bias" % name]
            if name != "v" and c["qk_norm"] == "head":
                n = H if name == "q" else Hkv
                y = rmsnorm(y.view(B, T, n, hd), w[p + "self_attn/%s_norm" % name], eps).reshape(B, T, n * hd)
            elif name != "v" and c["qk_norm"] == "full":
                y = rmsnorm(y, w[p + "self_attn/%s_norm" % name], eps)
            if c["clip_qkv"]:
                y = y.clamp(min=-c["clip_qkv"], max=c["clip_qkv"])
            out.append(y)
        return out

    def attention(self, h, p, pos, mask):
        """The ordinary attention block: (B, T, d) -> (B, T, d)."""
        c, w = self.c, self.w
        B, T, _ = h.shape
        H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        q, kk, v = self.qkv(h, p)
        q = q.view(B, T, H, hd).transpose(1, 2)
        kk = kk.view(B, T, Hkv, hd).transpose(1, 2)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        q, kk = rope(q, pos, c["rope_theta"]), rope(kk, pos, c["rope_theta"])
        rep = H // Hkv
        kk = kk.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = q @ kk.transpose(-1, -2) / math.sqrt(hd) + mask
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, H * hd)
        o = a @ w[p + "self_attn/o_proj"].T
        if c["attention_bias"]:
            o = o + w[p + "self_attn/o_proj.bias"]
        return o

    def mla(self, h, p, pos, mask):
        """Multi-head latent attention as HF DeepseekV3Attention computes it
        (the naive form: per-head keys and values from kv_b_proj, nothing
        absorbed): (B, T, d) -> (B, T, d)."""
        c, w = self.c, self.w
        B, T, _ = h.shape
        H, r, eps = c["num_attention_heads"], c["kv_lora_rank"], c["rms_norm_eps"]
        nope, rope_d, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        if c["q_lora_rank"]:
            q = rmsnorm(h @ w[p + "self_attn/q_a_proj"].T, w[p + "self_attn/q_a_layernorm"], eps)
            q = q @ w[p + "self_attn/q_b_proj"].T
        else:
            q = h @ w[p + "self_attn/q_proj"].T
        q = q.view(B, T, H, nope + rope_d).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [nope, rope_d], dim=-1)
        ckv = h @ w[p + "self_attn/kv_a_proj_with_mqa"].T
        k_pass, k_rot = torch.split(ckv, [r, rope_d], dim=-1)
        kv = rmsnorm(k_pass, w[p + "self_attn/kv_a_layernorm"], eps) @ w[p + "self_attn/kv_b_proj"].T
        kv = kv.view(B, T, H, nope + vd).transpose(1, 2)
        k_pass, v = torch.split(kv, [nope, vd], dim=-1)
        k_rot = k_rot.view(B, 1, T, rope_d)
        rot = rope_interleave if c["rope_interleave"] else rope
        q_rot, k_rot = rot(q_rot, pos, c["rope_theta"]), rot(k_rot, pos, c["rope_theta"])
        k_rot = k_rot.expand(B, H, T, rope_d)
        qs = torch.cat([q_pass, q_rot], dim=-1)
        ks = torch.cat([k_pass, k_rot], dim=-1)
        s = qs @ ks.transpose(-1, -2) / math.sqrt(nope + rope_d) + mask
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, H * vd)
        return a @ w[p + "self_attn/o_proj"].T

    def forward(self, ids):
        """ids: (B, T) long.  Returns logits (B, T, V), aux list, z list, routes."""
        c, w = self.c, self.w
        B, T = ids.shape
        d, hd = c["hidden_size"], c["head_dim"]
        H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        E, k = c["num_local_experts"], c["num_experts_per_tok"]
        eps = c["rms_norm_eps"]
        x = self.embed(ids)
        pos = torch.arange(T)
        auxes, zs, routes = [], [], []
        mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        for l in range(c["num_hidden_layers"]):
            p = "model/layers/%d/" % l
            h = rmsnorm(x, w[p + "input_layernorm"], eps)
            if c["kv_lora_rank"]:
                x = x + self.mla(h, p, pos, mask)
            else:
                x = x + self.attention(h, p, pos, mask)
            h = rmsnorm(x, w[p + "post_attention_layernorm"], eps)
            if not is_moe(c, l):
                x = x + self.swiglu(h, w[p + "mlp/gate_proj"], w[p + "mlp/up_proj"], w[p + "mlp/down_proj"])
                continue
            hf = h.reshape(B * T, d)
            logits = (hf @ w[p + "mlp/gate"].T).to(torch.float32 if hf.dtype == torch.float32 else hf.dtype)
            if c["scoring_func"] == "sigmoid":
                probs, order, wk = self.sigmoid_router(logits, w.get(p + "mlp/gate.e_score_correction_bias"))
                self.seq_bals.append(self.seq_balance(probs, order, B, T))
            else:
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
            if shared_width(c) > 0:
                ys = self.swiglu(hf, w[p + "mlp/shared_experts/gate_proj"], w[p + "mlp/shared_experts/up_proj"],
                                 w[p + "mlp/shared_experts/down_proj"])
                if c["shared_expert_gate"]:   # Qwen2-MoE: sigmoid(shared_expert_gate(h)) * out
                    ys = torch.sigmoid(hf @ w[p + "mlp/shared_expert_gate"].T) * ys
                y = y + ys
            x = x + y.view(B, T, d)
            N = B * T
            count = torch.zeros(E, dtype=probs.dtype).index_add(0, order.flatten(), torch.ones(N * k, dtype=probs.dtype))
            P = probs.mean(0)
            if c["scoring_func"] == "sigmoid":   # aux and z are the softmax router's
                auxes.append(torch.zeros((), dtype=probs.dtype))
                zs.append(torch.zeros((), dtype=probs.dtype))
            else:
                auxes.append(E / (N * k) * (count.detach() * P).sum())
                zs.append(torch.logsumexp(logits, dim=-1).pow(2).mean())
            routes.append(order)
        x = rmsnorm(x, w["model/norm"], eps)
        head = w["model/embed_tokens"] if c["tie_word_embeddings"] else w["lm_head"]
        return x @ head.T, auxes, zs, routes

    def sigmoid_router(self, logits, bias):
        """DeepSeek-V3 (transformers DeepseekV3TopkRouter, groups masked to
        -inf as DeepSeek's code): choice s + bias, the best topk_group groups
        by the sum of their top 2, top-k (ties to the lower index); weights
        from the unbiased s."""
        c = self.c
        E, k, G, TG = c["num_local_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        s = torch.sigmoid(logits)
        ch = s.detach() + (bias.detach() if bias is not None else 0)
        if G > 1:
            gs = ch.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
            gidx = torch.sort(-gs, dim=-1, stable=True).indices[:, :TG]
            keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gidx, True)
            ch = ch.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
        order = torch.sort(-ch, dim=-1, stable=True).indices[:, :k]
        wk = s.gather(1, order)
        if c["norm_topk_prob"]:
            wk = wk / (wk.sum(-1, keepdim=True) + 1e-20)
        return s, order, wk * c["routed_scaling_factor"]

    def seq_balance(self, s, order, B, T):
        """Mean over the B sequences of sum_e f_e P_e (DeepSeek-V3 eq. 17-20)."""
        E, k = self.c["num_local_experts"], self.c["num_experts_per_tok"]
        out = []
        for b in range(B):
            sb, ob = s[b * T:(b + 1) * T], order[b * T:(b + 1) * T]
            cnt = torch.zeros(E, dtype=s.dtype).index_add(0, ob.flatten(), torch.ones(T * k, dtype=s.dtype))
            P = (sb / sb.sum(-1, keepdim=True)).mean(0)
            out.append((E / (k * T) * cnt * P).sum())
        return torch.stack(out).mean()

    def loss(self, ids, targets, seq_aux_coef=0.0):
        self.seq_bals = []
        logits, auxes, zs, routes = self.forward(ids)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets[..., None])[..., 0]
        ce = -logp.mean()
        aux = torch.stack(auxes).mean() if auxes else torch.zeros((), dtype=ce.dtype)
        z = torch.stack(zs).mean() if zs else torch.zeros((), dtype=ce.dtype)
        loss = ce + self.c["router_aux_loss_coef"] * aux + self.c["router_z_loss_coef"] * z
        seq = torch.stack(self.seq_bals).mean() if self.seq_bals else torch.zeros((), dtype=ce.dtype)
        loss = loss + seq_aux_coef * seq
        return dict(loss=loss, ce=ce, aux=aux, z=z, seq=seq, logp=logp, routes=routes)


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

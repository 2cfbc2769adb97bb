#!/usr/bin/env python3
"""tests/ref/fixtures_ops.py - PyTorch references for the operator core (core/).

    /usr/bin/python3 tests/ref/fixtures_ops.py --out DIR

writes one HDF5 file per module into DIR (read by tests/test_<module>.c):

    linear.h5 rmsnorm.h5 embedding.h5 rope.h5 attention.h5 swiglu.h5
    softmax.h5 moe.h5 moe_sigmoid.h5 bias.h5 clamp.h5 gate.h5 qk_norm.h5
    gptq.h5 (core/dtype.h's GPTQ rounding, train/quant/gptq.h's factor)

Each file holds cases c0, c1, ... as groups: the inputs (float32, from a
fixed seed), an int32 dataset `dims` with the sizes, and the expected outputs
and gradients.  Precision: inputs are drawn in float32; references are
computed by PyTorch in float64 from exactly those float32 values (autograd for
the gradients) and stored rounded to float32.  The one exception is RoPE,
whose cos/sin tables are computed in float32 exactly as HF Llama does (that is
the contract of core/ops/rope.h: the table must match HF's float32 bits); the
rotation itself is then done in float64.

Backward references are the gradients of L = sum(out * dout) with a random
upstream gradient dout stored beside them (dy, dh, dout, ...).
"""
import argparse
import math
import os

import h5py
import numpy as np
import torch

torch.set_grad_enabled(True)
F64 = torch.float64


def rng(seed):
    return np.random.default_rng(seed)


def f32(a):
    """float32 numpy copy (what the C side reads)."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def i32(a):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(a, dtype=np.int32))


def uni(r, shape, lo=-1.0, hi=1.0):
    return r.uniform(lo, hi, size=shape).astype(np.float32)


def t64(a, grad=False):
    """float64 leaf tensor holding the float32 values of a."""
    return torch.tensor(np.asarray(a, dtype=np.float32), dtype=F64, requires_grad=grad)


def write(out, name, cases):
    with h5py.File(os.path.join(out, name), "w") as f:
        f.attrs["n_cases"] = len(cases)
        for ci, case in enumerate(cases):
            g = f.create_group("c%d" % ci)
            for k, v in case.items():
                v = np.asarray(v)
                g.create_dataset(k, data=v)


# ------------------------------------------------------------------ linear
def linear_cases():
    cases = []
    for seed, (M, N, K) in enumerate([(5, 7, 3), (13, 33, 17), (1, 40, 9), (37, 70, 65)]):
        r = rng(100 + seed)
        x, W, dy = uni(r, (M, K)), uni(r, (N, K)), uni(r, (M, N))
        xt, Wt = t64(x, True), t64(W, True)
        y = xt @ Wt.T
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([M, N, K]), x=x, W=W, dy=dy, y=f32(y),
                          dx=f32(xt.grad), dW=f32(Wt.grad)))
    return cases


# ------------------------------------------------------------------ rmsnorm
def rmsnorm_cases():
    cases = []
    for seed, (N, d, eps) in enumerate([(3, 1, 1e-5), (7, 33, 1e-6), (5, 64, 1e-5), (2, 100, 1e-6)]):
        r = rng(200 + seed)
        x, w, dy = uni(r, (N, d), -2, 2), uni(r, (d,), 0.5, 1.5), uni(r, (N, d))
        xt, wt = t64(x, True), t64(w, True)
        eps32 = float(np.float32(eps))
        rstd = 1.0 / torch.sqrt((xt * xt).mean(-1, keepdim=True) + eps32)
        y = xt * rstd * wt
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([N, d]), eps=np.float32([eps]), x=x, w=w, dy=dy,
                          y=f32(y), rstd=f32(rstd.reshape(N)), dx=f32(xt.grad), dw=f32(wt.grad)))
    return cases


# ------------------------------------------------------------------ embedding
def embedding_cases():
    cases = []
    for seed, (V, d, N) in enumerate([(11, 5, 9), (50, 70, 40)]):
        r = rng(300 + seed)
        table, dy = uni(r, (V, d)), uni(r, (N, d))
        ids = r.integers(0, V, size=N).astype(np.int32)
        ids[1] = ids[0]          # repeated ids: gradients must add up
        ids[N - 1] = ids[0]
        tt = t64(table, True)
        y = torch.nn.functional.embedding(torch.tensor(ids, dtype=torch.long), tt)
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([V, d, N]), table=table, ids=ids, dy=dy,
                          y=f32(y), dtable=f32(tt.grad)))
    return cases


# ------------------------------------------------------------------ rope
def hf_rope_cos_sin(pos, hd, theta):
    """HF Llama's LlamaRotaryEmbedding in float32: inv_freq, pos * inv_freq,
    emb = cat(freqs, freqs), cos/sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = pos.float()[:, None] * inv_freq[None, :]          # (N, hd/2), float32
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


# YaRN / linear scaling: transformers' _compute_yarn_parameters in float32
# (tests/ref/hf/model.py rope_inv_freq: one copy, shared with the HF reference)
def rope_scaled_cases():
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf.model import rope_inv_freq, softmax_scale_factor
    specs = [  # hd, theta, rope_scaling, table length
        (64, 10000.0, dict(type="yarn", factor=40, original_max_position_embeddings=4096, beta_fast=32,
                           beta_slow=1, mscale=1.0, mscale_all_dim=1.0), 8192),        # DeepSeek-V3
        (64, 50000.0, dict(type="yarn", factor=32.0, original_max_position_embeddings=4096, beta_fast=1.0,
                           beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0), 8192),      # Kimi-K2
        (128, 1000000.0, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768), 4096),  # Qwen3
        (32, 10000.0, dict(type="yarn", factor=16, original_max_position_embeddings=512, mscale=0.707,
                           mscale_all_dim=1.0), 2048),                                   # mscale ratio
        (16, 10000.0, dict(type="yarn", factor=8.0, original_max_position_embeddings=64, attention_factor=1.3,
                           truncate=False, beta_fast=16, beta_slow=2), 1024),            # given factor, no truncation
        (24, 500000.0, dict(type="yarn", factor=2.0), 600),                               # original = max_pos
        (8, 10000.0, dict(type="linear", factor=2.0), 512),
    ]
    keys = ["factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
            "attention_factor"]
    cases = []
    for seed, (hd, theta, sc, max_pos) in enumerate(specs):
        r = rng(450 + seed)
        pos = r.integers(0, max_pos, size=12)
        pos[0], pos[1] = 0, max_pos - 1
        inv, att = rope_inv_freq(hd, theta, sc, max_pos)
        freqs = torch.tensor(pos, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if att != 1.0:
            cos, sin = cos * att, sin * att
        typ = sc.get("rope_type", sc.get("type"))
        params = [theta, {"linear": 1, "yarn": 2}[typ]] + [float(sc.get(k) or 0) for k in keys] + \
                 [0.0 if sc.get("truncate", True) else 1.0]
        cases.append(dict(dims=i32([hd, max_pos]), params=np.float64(params), pos=pos.astype(np.int32),
                          inv=f32(inv), cos=f32(cos), sin=f32(sin), att=np.float64([att]),
                          smf=np.float64([softmax_scale_factor(sc) if typ == "yarn" else 1.0])))
    return cases


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cases():
    cases = []
    specs = [  # N, n_heads, hd, theta, position kind
        (5, 1, 2, 10000.0, "arange"),
        (9, 3, 8, 10000.0, "offset"),
        (17, 2, 16, 500000.0, "random"),
        (6, 2, 64, 10000.0, "offset"),
    ]
    for seed, (N, nh, hd, theta, kind) in enumerate(specs):
        r = rng(400 + seed)
        if kind == "arange":
            pos = np.arange(N)
        elif kind == "offset":
            pos = 1000 + np.arange(N)
        else:
            pos = r.integers(0, 4096, size=N)
            pos[0] = 0
            pos[1] = 4095
        pos = pos.astype(np.int32)
        x, dy = uni(r, (N, nh * hd)), uni(r, (N, nh * hd))
        cos, sin = hf_rope_cos_sin(torch.tensor(pos, dtype=torch.long), hd, theta)
        c64 = cos.to(F64)[:, None, :]
        s64 = sin.to(F64)[:, None, :]
        xt = t64(x, True)
        xh = xt.reshape(N, nh, hd)
        y = (xh * c64 + rotate_half(xh) * s64).reshape(N, nh * hd)
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([N, nh, hd, 4096]), theta=np.float64([theta]), pos=pos,
                          x=x, dy=dy, y=f32(y), dx=f32(xt.grad),
                          cos=f32(cos[:, :hd // 2]), sin=f32(sin[:, :hd // 2])))
    return cases


# ------------------------------------------------------------------ attention
def attention_ref(q, k, v, lens, H, Hkv, hd, window=0):
    """Causal GQA attention of several sequences (rows concatenated), float64;
    window W > 0: HF's sliding_window mask (query t sees keys s, t - W < s <= t).
    Returns out (rows, H*hd) and lse (rows, H)."""
    outs, lses = [], []
    row = 0
    R = H // Hkv
    for T in lens:
        qs = q[row:row + T].reshape(T, H, hd).transpose(0, 1)              # (H, T, hd)
        ks = k[row:row + T].reshape(T, Hkv, hd).transpose(0, 1).repeat_interleave(R, 0)
        vs = v[row:row + T].reshape(T, Hkv, hd).transpose(0, 1).repeat_interleave(R, 0)
        s = qs @ ks.transpose(1, 2) / math.sqrt(hd)                         # (H, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        if window:
            t_idx = torch.arange(T)
            mask &= t_idx[None, :] > t_idx[:, None] - window
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                    # (H, T)
        a = torch.softmax(s, dim=-1) @ vs                                   # (H, T, hd)
        outs.append(a.transpose(0, 1).reshape(T, H * hd))
        lses.append(lse.transpose(0, 1))
        row += T
    return torch.cat(outs), torch.cat(lses)


def attention_cases():
    cases = []
    specs = [  # H, Hkv, hd, sequence lengths, sliding window (0: none)
        (4, 4, 16, [17, 1, 37], 0),
        (4, 2, 8, [37, 5], 0),
        (6, 1, 64, [20, 33], 0),
        (4, 2, 8, [70, 5], 7),
        (4, 4, 16, [53, 1, 40], 16),
        (2, 1, 32, [90], 33),
    ]
    for seed, (H, Hkv, hd, lens, window) in enumerate(specs):
        r = rng(500 + seed)
        rows = sum(lens)
        q, k, v = uni(r, (rows, H * hd), -2, 2), uni(r, (rows, Hkv * hd), -2, 2), uni(r, (rows, Hkv * hd))
        dout = uni(r, (rows, H * hd))
        qt, kt, vt = t64(q, True), t64(k, True), t64(v, True)
        out, lse = attention_ref(qt, kt, vt, lens, H, Hkv, hd, window)
        (out * t64(dout)).sum().backward()
        cases.append(dict(dims=i32([H, Hkv, hd, len(lens), window]), lens=i32(lens), q=q, k=k, v=v,
                          dout=dout, out=f32(out), lse=f32(lse), dq=f32(qt.grad),
                          dk=f32(kt.grad), dv=f32(vt.grad)))
    return cases


# ------------------------------------------------------------------ swiglu
def swiglu_cases():
    cases = []
    for seed, (N, F) in enumerate([(3, 7), (9, 130)]):
        r = rng(600 + seed)
        g, u, dh = uni(r, (N, F), -6, 6), uni(r, (N, F), -2, 2), uni(r, (N, F))
        g[0, 0], g[0, 1] = 30.0, -30.0          # saturated sigmoid
        x, dy = uni(r, (N, F), -8, 8), uni(r, (N, F))
        gt, ut, xt = t64(g, True), t64(u, True), t64(x, True)
        h = torch.nn.functional.silu(gt) * ut
        y = torch.nn.functional.silu(xt)
        ((h * t64(dh)).sum() + (y * t64(dy)).sum()).backward()
        cases.append(dict(dims=i32([N, F]), g=g, u=u, dh=dh, h=f32(h), dg=f32(gt.grad),
                          du=f32(ut.grad), x=x, dy=dy, y=f32(y), dx=f32(xt.grad)))
    return cases


# ------------------------------------------------------------------ softmax
def softmax_cases():
    cases = []
    for seed, (N, V, shift) in enumerate([(4, 7, 0.0), (6, 50, 100.0), (3, 5000, -30.0)]):
        r = rng(700 + seed)
        x = uni(r, (N, V), -4, 4) + np.float32(shift)
        dy = uni(r, (N, V))
        targets = r.integers(0, V, size=N).astype(np.int32)
        dlogp = uni(r, (N,))
        xt = t64(x, True)
        y = torch.softmax(xt, -1)
        lse = torch.logsumexp(xt, -1)
        (y * t64(dy)).sum().backward()
        dx = xt.grad
        # log-softmax + cross-entropy: logp of the targets, and the gradients
        # of (a) the mean cross-entropy and (b) sum_t dlogp_t logp_t.
        lt = t64(x, True)
        ce = torch.nn.functional.cross_entropy(lt, torch.tensor(targets, dtype=torch.long))
        ce.backward()
        dce = lt.grad
        lt2 = t64(x, True)
        logp = torch.log_softmax(lt2, -1).gather(1, torch.tensor(targets, dtype=torch.long)[:, None])[:, 0]
        (logp * t64(dlogp)).sum().backward()
        cases.append(dict(dims=i32([N, V]), x=x, dy=dy, y=f32(y), lse=f32(lse), dx=f32(dx),
                          targets=targets, logp=f32(logp), dlogits_ce=f32(dce),
                          ce=np.float32([ce.item()]), dlogp=dlogp, dlogits=f32(lt2.grad)))
    return cases


# ------------------------------------------------------------------ moe
def moe_router_cases():
    """Router + top-k weights + aux + z loss chain (SPEC section 2):
         p = softmax(logits); top-k (no near-ties in these logits, torch.topk
         does not promise an order on ties); w = p[idx] (/ sum when norm);
         aux = E/(N k) sum_e count_e P_e   (count_e a constant)
         z   = mean_t logsumexp(logits_t)^2
       L = sum(w * dw) + a_aux * aux + b_z * z, gradient w.r.t. logits."""
    cases = []
    specs = [(13, 8, 2, 1), (13, 8, 1, 0), (7, 5, 5, 1), (10, 6, 3, 0)]  # N, E, k, norm
    for seed, (N, E, k, norm) in enumerate(specs):
        r = rng(800 + seed)
        while True:
            logits = uni(r, (N, E), -3, 3)
            srt = np.sort(logits, axis=1)
            if np.min(np.diff(srt, axis=1)) > 1e-3:
                break
        dw = uni(r, (N, k))
        a_aux, b_z = 0.7, 0.3
        lt = t64(logits, True)
        p = torch.softmax(lt, -1)
        w, idx = torch.topk(p, k, dim=-1)          # sorted, descending
        if norm:
            w = w / w.sum(-1, keepdim=True)
        count = torch.zeros(E, dtype=F64)
        count.index_add_(0, idx.reshape(-1), torch.ones(N * k, dtype=F64))
        P = p.mean(0)
        aux = E / (N * k) * (count.detach() * P).sum()
        lse = torch.logsumexp(lt, -1)
        z = (lse ** 2).mean()
        L = (w * t64(dw)).sum() + a_aux * aux + b_z * z
        L.backward()
        cases.append(dict(dims=i32([N, E, k, norm]), coef=np.float32([a_aux, b_z]), logits=logits,
                          dw=dw, probs=f32(p), lse=f32(lse), topk_idx=i32(idx), topk_w=f32(w),
                          count=f32(count), aux=np.float32([aux.item()]), z=np.float32([z.item()]),
                          dlogits=f32(lt.grad)))
    return cases


def moe_sigmoid_cases():
    """DeepSeek-V3 router (transformers DeepseekV3TopkRouter, with DeepSeek's
    -inf group mask):
         s = sigmoid(logits); c = s + bias (choice only)
         group score = sum of the group's top 2 c; best topk_group groups kept,
         the other groups' c = -inf; idx = top-k of c (sorted, descending)
         w = s[idx] / (sum + 1e-20) when norm, times scale
       the draws are redrawn until no near-ties in c or the group scores.
       Gradients: L = sum(w * dw) w.r.t. logits (the choice fixed), and the
       sequence-wise balance (all N rows one sequence)
         bal = sum_e f_e P_e, f_e = E/(k N) count_e, P_e = mean_t s_te / sum_i s_ti
       w.r.t. logits (f a constant)."""
    cases = []
    # N, E, k, n_group, topk_group, norm, scale, bias scale (0: no bias)
    specs = [(11, 8, 2, 4, 2, 1, 2.5, 0.3), (9, 8, 3, 1, 1, 0, 1.0, 0.3),
             (10, 12, 4, 3, 1, 1, 1.0, 0.0), (8, 16, 4, 4, 2, 0, 1.5, 1.0),
             (12, 16, 6, 8, 3, 1, 2.5, 0.1)]
    for seed, (N, E, k, G, TG, norm, scale, bsc) in enumerate(specs):
        r = rng(900 + seed)
        while True:
            logits = uni(r, (N, E), -3, 3)
            bias = uni(r, (E,), -bsc, bsc) if bsc > 0 else np.zeros(E, np.float32)
            sd = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
            c = sd + bias.astype(np.float64)
            gsc = np.sort(c.reshape(N, G, E // G), -1)[:, :, -2:].sum(-1)
            if (np.min(np.diff(np.sort(c, 1), axis=1)) > 1e-3 and
                    (G == 1 or np.min(np.diff(np.sort(gsc, 1), axis=1)) > 1e-3)):
                break
        dw = uni(r, (N, k))
        lt = t64(logits, True)
        sc = torch.sigmoid(lt)
        ch = sc.detach() + t64(bias)
        gs = ch.view(N, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gidx = gs.topk(TG, dim=-1)[1]
        gmask = torch.zeros(N, G, dtype=torch.bool)
        gmask.scatter_(1, gidx, True)
        emask = gmask.unsqueeze(-1).expand(N, G, E // G).reshape(N, E)
        ch = ch.masked_fill(~emask, float("-inf"))
        idx = ch.topk(k, dim=-1, sorted=True)[1]
        w = sc.gather(1, idx)
        if norm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * scale
        (w * t64(dw)).sum().backward()
        dl = lt.grad.clone()
        lt.grad = None
        sc = torch.sigmoid(lt)
        count = torch.zeros(E, dtype=F64)
        count.index_add_(0, idx.reshape(-1), torch.ones(N * k, dtype=F64))
        P = (sc / sc.sum(-1, keepdim=True)).mean(0)
        bal = (E / (k * N) * count * P).sum()
        bal.backward()
        cases.append(dict(dims=i32([N, E, k, G, TG, norm]), scale=np.float32([scale]), logits=logits,
                          bias=bias, has_bias=i32([bsc > 0]), dw=dw, scores=f32(torch.sigmoid(lt)),
                          topk_idx=i32(idx), topk_w=f32(w), dlogits=f32(dl), bal=np.float32([bal.item()]),
                          dlogits_bal=f32(lt.grad)))
    return cases


def moe_layer_cases():
    """Dispatch -> per-expert linear -> combine, against torch:
         y_t = sum_j w_tj (x_t A_{idx_tj}^T)
       with routing given (expert E-1 receives no token), gradients of
       sum(y * dy) w.r.t. x, every A_e and w."""
    cases = []
    for seed, (N, E, k, d, dout) in enumerate([(9, 4, 2, 6, 5), (20, 6, 3, 16, 33)]):
        r = rng(900 + seed)
        idx = np.stack([r.permutation(E - 1)[:k] for _ in range(N)]).astype(np.int32)
        x, w = uni(r, (N, d)), uni(r, (N, k), 0.1, 1.0)
        A, dy = uni(r, (E, dout, d)), uni(r, (N, dout))
        xt, wt, At = t64(x, True), t64(w, True), t64(A, True)
        it = torch.tensor(idx, dtype=torch.long)
        eo = torch.einsum("td,tjod->tjo", xt, At[it])          # (N, k, dout)
        y = (wt[:, :, None] * eo).sum(1)
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([N, E, k, d, dout]), idx=idx, x=x, w=w, A=A, dy=dy,
                          y=f32(y), dx=f32(xt.grad), dw=f32(wt.grad), dA=f32(At.grad)))
    return cases


# ------------------------------------------------------------------ HF families' ops
def bias_cases():
    """y = x + b (nn.Linear's bias, the product left out)."""
    cases = []
    for seed, (N, n) in enumerate([(1, 5), (7, 33), (19, 130)]):
        r = rng(1000 + seed)
        x, b, dy = uni(r, (N, n)), uni(r, (n,)), uni(r, (N, n))
        xt, bt = t64(x, True), t64(b, True)
        y = xt + bt
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([N, n]), x=x, b=b, dy=dy, y=f32(y), dx=f32(xt.grad), db=f32(bt.grad)))
    return cases


def clamp_cases():
    """torch.clamp(x, -c, c) with values exactly on the boundary (whose
    gradient passes) and just past it (whose gradient is zero)."""
    cases = []
    for seed, (n, c) in enumerate([(64, 1.0), (200, 0.37), (333, 8.0)]):
        r = rng(1100 + seed)
        x, dy = uni(r, (n,), -2 * c, 2 * c), uni(r, (n,))
        c32 = np.float32(c)
        x[0], x[1] = c32, -c32
        x[2], x[3] = np.nextafter(c32, np.float32(np.inf)), np.nextafter(-c32, np.float32(-np.inf))
        x[4], x[5] = np.nextafter(c32, np.float32(0)), np.nextafter(-c32, np.float32(0))
        xt = t64(x, True)
        y = xt.clamp(min=-float(c32), max=float(c32))
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([n]), c=np.float32([c]), x=x, dy=dy, y=f32(y), dx=f32(xt.grad)))
    return cases


def gate_cases():
    """Qwen2-MoE's shared expert gate: y = sigmoid(h @ w_g.T) * s."""
    cases = []
    for seed, (N, d, n) in enumerate([(1, 8, 5), (7, 33, 20), (19, 64, 64)]):
        r = rng(1200 + seed)
        h, w, s, dy = uni(r, (N, d)), uni(r, (1, d), -3, 3), uni(r, (N, n)), uni(r, (N, n))
        ht, wt, st = t64(h, True), t64(w, True), t64(s, True)
        g = torch.sigmoid(ht @ wt.T)
        y = g * st
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([N, d, n]), h=h, w=w, s=s, dy=dy, g=f32(g.reshape(N)), y=f32(y),
                          dh=f32(ht.grad), dw=f32(wt.grad), ds=f32(st.grad)))
    return cases


def qk_norm_cases():
    """q/k norm before RoPE: mode 0 per head (Qwen3-MoE: RMSNorm(head_dim)
    applied to x.view(N, H, hd), weight [hd]), mode 1 over the whole width
    (OLMoE: RMSNorm(H * hd), weight [H * hd])."""
    cases = []
    for seed, (N, H, hd, mode) in enumerate([(5, 4, 8, 0), (9, 3, 12, 0), (5, 4, 8, 1), (9, 6, 16, 1)]):
        r = rng(1300 + seed)
        eps = 1e-6
        x, dy = uni(r, (N, H * hd), -2, 2), uni(r, (N, H * hd))
        w = uni(r, (hd,) if mode == 0 else (H * hd,), 0.5, 1.5)
        xt, wt = t64(x, True), t64(w, True)
        eps32 = float(np.float32(eps))
        xv = xt.view(N, H, hd) if mode == 0 else xt
        y = (xv * torch.rsqrt(xv.pow(2).mean(-1, keepdim=True) + eps32) * wt).reshape(N, H * hd)
        (y * t64(dy)).sum().backward()
        cases.append(dict(dims=i32([N, H, hd, mode]), eps=np.float32([eps]), x=x, w=w, dy=dy, y=f32(y),
                          dx=f32(xt.grad), dw=f32(wt.grad)))
    return cases


# ------------------------------------------------------------------ gptq
def bf16_scale(a):
    """A weight group's int8 scale a (float32) rounded to bfloat16, nearest
    even (core/dtype.h: dtype_q8_weight_scale)."""
    u = int(np.float32(a).view(np.uint32))
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return np.uint32(u).view(np.float32)


def gptq_round_f32(w, U):
    """dtype_q8_quantize_row_gptq, one float32 IEEE operation at a time."""
    K = w.shape[0]
    w = w.astype(np.float32).copy()
    q = np.zeros(K, np.int32)
    s = np.zeros((K + 31) // 32, np.float32)
    sc = np.float32(0)
    for k in range(K):
        if k % 32 == 0:
            sc = bf16_scale(np.max(np.abs(w[k:k + 32])) / np.float32(127))
            if not sc > 0:
                sc = np.float32(0)
            s[k // 32] = sc
        v = np.float32(np.rint(w[k] / sc)) if sc > 0 else np.float32(0)
        v = np.float32(min(max(v, -127), 127))
        q[k] = int(v)
        e = np.float32(np.float32(w[k] - np.float32(v * sc)) / U[k, k])
        w[k + 1:] = w[k + 1:] - np.float32(e) * U[k, k + 1:]
    return q, s


def rtn_f32(w):
    K = w.shape[0]
    q = np.zeros(K, np.int32)
    for g in range(0, K, 32):
        a = bf16_scale(np.max(np.abs(w[g:g + 32])) / np.float32(127))
        q[g:g + 32] = np.clip(np.rint(w[g:g + 32] / a), -127, 127) if a > 0 else 0
    return q


def gptq_cases():
    """Weights W (R, K) and inputs X (n, K) whose channels are mixed and
    unevenly scaled (as a hidden state's are), H = X^T X; U from float64
    (H damped as train/quant/gptq.c does: an always-zero input gets 1, then
    damp times the mean diagonal), the rounding replayed in float32."""
    cases = []
    for seed, (R, K, n, dead) in enumerate([(6, 72, 300, -1), (5, 100, 500, 7), (4, 64, 40, -1)]):
        r = rng(700 + seed)
        A = r.normal(size=(K, K)).astype(np.float32) * 0.3 + np.eye(K, dtype=np.float32)
        X = (r.normal(size=(n, K)).astype(np.float32) @ A) * r.uniform(0.2, 3.0, size=K).astype(np.float32)
        if dead >= 0:
            X[:, dead] = 0
        W = uni(r, (R, K), -0.1, 0.1)
        H = f32(t64(X).T @ t64(X))
        damp = 0.01
        Hd = torch.tensor(H, dtype=F64)
        mean = float(Hd.diagonal().mean())
        for i in range(K):
            if Hd[i, i] == 0:
                Hd[i, i] = 1
        Hd += damp * mean * torch.eye(K, dtype=F64)
        L = torch.linalg.cholesky(torch.linalg.inv(Hd))
        U = f32(L.T)
        qs, ss, qr = [], [], []
        for i in range(R):
            q, s = gptq_round_f32(W[i], U)
            qs.append(q)
            ss.append(s)
            qr.append(rtn_f32(W[i]))
        cases.append(dict(dims=i32([R, K]), W=W, H=H, damp=np.float64(damp), U=U, q=i32(qs), s=f32(ss),
                          q_rtn=i32(qr)))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    write(args.out, "linear.h5", linear_cases())
    write(args.out, "rmsnorm.h5", rmsnorm_cases())
    write(args.out, "embedding.h5", embedding_cases())
    write(args.out, "rope.h5", rope_cases())
    write(args.out, "rope_scaled.h5", rope_scaled_cases())
    write(args.out, "attention.h5", attention_cases())
    write(args.out, "swiglu.h5", swiglu_cases())
    write(args.out, "softmax.h5", softmax_cases())
    write(args.out, "moe_router.h5", moe_router_cases())
    write(args.out, "moe_layer.h5", moe_layer_cases())
    write(args.out, "moe_sigmoid.h5", moe_sigmoid_cases())
    write(args.out, "bias.h5", bias_cases())
    write(args.out, "clamp.h5", clamp_cases())
    write(args.out, "gate.h5", gate_cases())
    write(args.out, "qk_norm.h5", qk_norm_cases())
    write(args.out, "gptq.h5", gptq_cases())


if __name__ == "__main__":
    main()

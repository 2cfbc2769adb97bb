#!/usr/bin/python3
"""bench/torch_decode.py - the PyTorch peer of bench/infer.sh: a KV-cache
decoder for a tandem checkpoint (the model of SPEC section 2, as
tests/ref/tandem_ref.py writes it), written to be fast in eager PyTorch.

    torch_decode.py CKPT.h5 [--threads 2] [--prompt 256] [--gen 128]
                    [--batch 16] [--reps 3] [--batch-reps 1]

float32, torch.no_grad, torch.set_num_threads(--threads) and
OMP_WAIT_POLICY=PASSIVE (set before torch is imported, unless the caller set
it): on 2 cores an OpenMP thread that spins while another works halves the
speed.  What makes it "at its best":
  - q, k and v are one matrix, an expert's gate and up are one matrix;
  - a single row goes through torch.mv (BLAS gemv): OpenBLAS 0.3.21 sends an
    M=1 sgemm (F.linear on one row) through its slow GEMM path, ~3x slower;
  - the KV cache is preallocated [B, Hkv, ctx, hd] per layer and written in
    place; grouped-query attention without repeating K and V;
  - the prefill computes the head on the last row only; a batch prefills all
    its prompts in one forward; experts run on the rows routed to them.
Measured, after one short warm-up run of each kind:
  ttft: prompt forward + argmax (batch 1);  b1: greedy decode of --gen
  tokens (the first comes from the prefill), tokens/s = (gen-1) / decode
  time, per-token latency percentiles;  b16: --batch prompts (token i of
  prompt j = (37 i + 11 + 7 j) mod V, j = 0 is c_peer's prompt) prefilled
  together, then decoded side by side: aggregate tokens/s of the decode
  steps, and end to end (prefill included).
Prints one JSON line {"bench":"torch", ...}.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-reps", type=int, default=1)
    ap.add_argument("--only", default="b1,b16")
    a = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch  # noqa: E402  (after the OpenMP environment)
    torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
    from tandem_ref import full_config

    t0 = time.perf_counter()
    cfg, w = load_f32(a.ckpt, torch)
    dec = Decoder(full_config(cfg), w, torch)
    load_s = time.perf_counter() - t0
    out = {"bench": "torch", "ckpt": a.ckpt, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "prompt": a.prompt, "gen": a.gen,
           "batch": a.batch, "reps": a.reps, "load_s": round(load_s, 2)}
    if "b1" in a.only:
        dec.run(1, a.prompt, min(16, a.gen))  # warm-up
        ttft, tps, lat, first = [], [], [], []
        for _ in range(a.reps):
            r = dec.run(1, a.prompt, a.gen)
            ttft.append(r["prefill_s"] * 1e3)
            tps.append((a.gen - 1) / r["decode_s"])
            lat += r["lat"]
            first = r["first"]
        lat.sort()
        p50 = pct(lat, 50)
        out.update(ttft_ms=round(sorted(ttft)[len(ttft) // 2], 3), ttft_ms_best=round(min(ttft), 3),
                   b1_tok_s=round(sorted(tps)[len(tps) // 2], 1), b1_tok_s_best=round(max(tps), 1),
                   b1_tok_s_from_p50=round(1 / p50, 1) if p50 else 0,
                   b1_lat_ms_p10_p50_p90_p99=[round(1e3 * pct(lat, q), 4) for q in (10, 50, 90, 99)],
                   greedy_first16=first)
    if "b16" in a.only and a.batch > 1:
        dec.run(a.batch, min(64, a.prompt), min(4, a.gen))  # warm-up (shorter: the prefill is long)
        tps, e2e, lat = [], [], []
        for _ in range(a.batch_reps):
            r = dec.run(a.batch, a.prompt, a.gen)
            tps.append(a.batch * (a.gen - 1) / r["decode_s"])
            e2e.append(a.batch * a.gen / (r["prefill_s"] + r["decode_s"]))
            lat += r["lat"]
        lat.sort()
        out.update(bn_tok_s=round(sorted(tps)[len(tps) // 2], 1), bn_e2e_tok_s=round(max(e2e), 1),
                   bn_prefill_s=round(r["prefill_s"], 3),
                   bn_step_ms_p10_p50_p90_p99=[round(1e3 * pct(lat, q), 4) for q in (10, 50, 90, 99)])
    print(json.dumps(out), flush=True)


def pct(v, q):
    if not v:
        return 0.0
    i = int(q / 100.0 * len(v))
    return v[min(i, len(v) - 1)]


def load_f32(path, torch):
    """A tandem checkpoint (SPEC section 4) -> (config, name -> float32 tensor)."""
    import h5py
    import numpy as np
    w = {}
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and (name.startswith("model/") or name == "lm_head"):
                x = obj[()]
                if obj.attrs.get("dtype", b"") in (b"bfloat16", "bfloat16"):
                    x = (x.astype(np.uint32) << 16).view(np.float32)
                w[name] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        f.visititems(visit)
    return cfg, w


class Decoder:
    def __init__(self, c, w, torch):
        self.t = torch
        self.c = c
        d, hd = c["hidden_size"], c["head_dim"]
        self.H, self.Hkv, self.hd, self.d = c["num_attention_heads"], c["num_key_value_heads"], hd, d
        self.E, self.k, self.eps = c["num_local_experts"], c["num_experts_per_tok"], c["rms_norm_eps"]
        self.L, self.V = c["num_hidden_layers"], c["vocab_size"]
        self.ctx = c["max_position_embeddings"]
        self.embed = w["model/embed_tokens"]
        self.norm = w["model/norm"]
        self.head = (w["model/embed_tokens"] if c["tie_word_embeddings"] else w["lm_head"]).contiguous()
        self.layers = []
        for l in range(self.L):
            p = "model/layers/%d/" % l
            ly = dict(ln1=w[p + "input_layernorm"], ln2=w[p + "post_attention_layernorm"],
                      qkv=torch.cat([w[p + "self_attn/q_proj"], w[p + "self_attn/k_proj"],
                                     w[p + "self_attn/v_proj"]], 0).contiguous(),
                      o=w[p + "self_attn/o_proj"].contiguous())
            if l < c["first_k_dense_replace"]:
                ly["dense_gu"] = torch.cat([w[p + "mlp/gate_proj"], w[p + "mlp/up_proj"]], 0).contiguous()
                ly["dense_down"] = w[p + "mlp/down_proj"].contiguous()
            else:
                ly["router"] = w[p + "mlp/gate"].contiguous()
                ly["gu"] = torch.cat([w[p + "mlp/experts/gate_proj"], w[p + "mlp/experts/up_proj"]], 1).contiguous()
                ly["down"] = w[p + "mlp/experts/down_proj"].contiguous()
                if c["n_shared_experts"] > 0:
                    ly["sh_gu"] = torch.cat([w[p + "mlp/shared_experts/gate_proj"],
                                             w[p + "mlp/shared_experts/up_proj"]], 0).contiguous()
                    ly["sh_down"] = w[p + "mlp/shared_experts/down_proj"].contiguous()
            self.layers.append(ly)
        # rotate-half RoPE tables (HF / SPEC), positions 0 .. ctx-1
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        f = torch.arange(self.ctx, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([f, f], -1)
        self.cos, self.sin = emb.cos().float(), emb.sin().float()
        self.cache_b = 0

    # -- pieces
    def lin(self, x, W):
        """x (N, K) @ W (M, K)^T; one row through gemv."""
        if x.shape[0] == 1:
            return self.t.mv(W, x[0]).unsqueeze(0)
        return self.t.nn.functional.linear(x, W)

    def rms(self, x, wt):
        return x * self.t.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * wt

    def rope(self, x, pos0, T):
        cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]
        h = self.hd // 2
        rot = self.t.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def swiglu(self, x, gu, down):
        F = gu.shape[0] // 2
        g = self.lin(x, gu)
        return self.lin(self.t.nn.functional.silu(g[:, :F]) * g[:, F:], down)

    def moe(self, ly, h):
        t = self.t
        N = h.shape[0]
        probs = t.softmax(self.lin(h, ly["router"]), -1)
        topw, topi = t.topk(probs, self.k, -1)
        if self.c["norm_topk_prob"]:
            topw = topw / topw.sum(-1, keepdim=True)
        F = ly["down"].shape[2]
        if N == 1:
            y = None
            for j, e in enumerate(topi[0].tolist()):
                g = t.mv(ly["gu"][e], h[0])
                ye = t.mv(ly["down"][e], t.nn.functional.silu(g[:F]) * g[F:]) * topw[0, j]
                y = ye if y is None else y + ye
            y = y.unsqueeze(0)
        else:
            y = t.zeros_like(h)
            flat = topi.reshape(-1)
            order = t.argsort(flat)
            counts = t.bincount(flat, minlength=self.E).tolist()
            rows, wts = order // self.k, topw.reshape(-1)[order]
            s = 0
            for e, n in enumerate(counts):
                if n == 0:
                    continue
                idx = rows[s:s + n]
                g = self.lin(h[idx], ly["gu"][e])
                ye = self.lin(t.nn.functional.silu(g[:, :F]) * g[:, F:], ly["down"][e])
                y.index_add_(0, idx, ye * wts[s:s + n, None])
                s += n
        if "sh_gu" in ly:
            y = y + self.swiglu(h, ly["sh_gu"], ly["sh_down"])
        return y

    def forward(self, ids, pos0):
        """ids (B, T) long at positions pos0..pos0+T-1; fills the cache;
        returns the logits of each sequence's last position (B, V)."""
        t = self.t
        B, T = ids.shape
        H, Hkv, hd, d = self.H, self.Hkv, self.hd, self.d
        rep, S = H // Hkv, pos0 + T
        x = self.embed[ids.reshape(-1)]
        mask = None
        if T > 1:
            qp = t.arange(pos0, S)[:, None]
            mask = t.zeros(T, S).masked_fill(t.arange(S)[None, :] > qp, float("-inf"))
        scale = 1.0 / (hd ** 0.5)
        for l, ly in enumerate(self.layers):
            h = self.rms(x, ly["ln1"])
            qkv = self.lin(h, ly["qkv"]).view(B, T, H + 2 * Hkv, hd).transpose(1, 2)
            q = self.rope(qkv[:, :H], pos0, T)
            k = self.rope(qkv[:, H:H + Hkv], pos0, T)
            self.kc[l][:B, :, pos0:S] = k
            self.vc[l][:B, :, pos0:S] = qkv[:, H + Hkv:]
            K, Vv = self.kc[l][:B, :, :S], self.vc[l][:B, :, :S]
            # grouped-query attention: the rep query heads of a kv head share it
            s = t.matmul(q.reshape(B, Hkv, rep * T, hd), K.transpose(-1, -2)) * scale
            if mask is not None:
                s = (s.view(B, Hkv, rep, T, S) + mask).view(B, Hkv, rep * T, S)
            att = t.matmul(t.softmax(s, -1), Vv).view(B, H, T, hd).transpose(1, 2).reshape(B * T, H * hd)
            x = x + self.lin(att, ly["o"])
            h = self.rms(x, ly["ln2"])
            if "dense_gu" in ly:
                x = x + self.swiglu(h, ly["dense_gu"], ly["dense_down"])
            else:
                x = x + self.moe(ly, h)
        last = x.view(B, T, d)[:, -1]
        return self.lin(self.rms(last, self.norm), self.head)

    def run(self, B, n_prompt, gen):
        """Prefill B prompts of n_prompt tokens, decode greedily to gen tokens
        each.  Times in seconds; lat: per decode step."""
        t = self.t
        if self.cache_b < B:
            shape = (B, self.Hkv, self.ctx, self.hd)
            self.kc = [t.zeros(shape) for _ in range(self.L)]
            self.vc = [t.zeros(shape) for _ in range(self.L)]
            self.cache_b = B
        ids = t.tensor([[(i * 37 + 11 + 7 * j) % self.V for i in range(n_prompt)] for j in range(B)], dtype=t.long)
        t0 = time.perf_counter()
        tok = t.argmax(self.forward(ids, 0), -1)
        t1 = time.perf_counter()
        first, lat = [int(tok[0])], []
        for i in range(1, gen):
            ta = time.perf_counter()
            tok = t.argmax(self.forward(tok[:, None], n_prompt + i - 1), -1)
            lat.append(time.perf_counter() - ta)
            if len(first) < 16:
                first.append(int(tok[0]))
        t2 = time.perf_counter()
        return dict(prefill_s=t1 - t0, decode_s=t2 - t1, lat=lat, first=first)


if __name__ == "__main__":
    main()

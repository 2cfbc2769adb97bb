"""bench/torch_train.py - the model of SPEC section 2, trained in PyTorch as a
good user would write it, for bench/train.sh to compare tandem against.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_train.py configs/medium.json \
        [--data build/fortunes.bin] [--steps 10] [--warmup 2] [--threads 2] [key=value ...]

The run config is tandem's (configs/*.json): its "model" object (or the path
of a model config) gives the model, and seq_len, micro_batch, lr, min_lr,
warmup_steps, weight_decay, beta1, beta2, adam_eps, grad_clip, seed are used
the way `tandem train` uses them; key=value overrides a run-config key.

Same math as tests/ref/tandem_ref.py (RMSNorm, GQA attention with HF
rotate-half RoPE and a causal softmax, top-k routed SwiGLU experts with
renormalised weights, optional shared experts and dense layers, aux + z router
losses, tied or untied lm_head), written for speed rather than for reference:
  - q/k/v and each expert's gate/up are stored fused ([q;k;v] and [gate;up]):
    one product instead of three or two, identical arithmetic per element;
  - GQA without copying K/V: the rep query heads sharing a kv head are stacked
    along the rows of one batched product (B*Hkv, rep*T, hd) x (hd, T), the
    causal mask added by the same baddbmm (PyTorch 1.13 has no
    scaled_dot_product_attention);
  - MoE dispatch as in HF Mixtral / Megablocks without grouped GEMM: the
    N*k (token, expert) pairs are sorted by expert, the rows gathered once,
    each expert run once on its contiguous slice, the results scaled by the
    routing weights and scattered back with one index_add;
  - AdamW (decoupled weight decay on matrices only, as tandem), the
    multi-tensor (foreach) implementation; gradient clipping as tandem
    (grad_clip, default 1.0); the same warm-up + cosine learning-rate schedule.
Everything float32.  Threads: torch.set_num_threads(--threads); the caller
should export OMP_WAIT_POLICY=PASSIVE (set here too if absent, before torch
is imported): otherwise torch's idle OpenMP workers spin against OpenBLAS's
threads and every product runs 2-3x slower.  Memory: glibc malloc tunables
keep freed blocks for reuse (see MALLOC_TUNE below).

Batches: micro_batch x seq_len windows at random offsets of --data (a
`tandem data prepare` token file, training split), or random bytes without it.
OpenBLAS does every product: its kernels are whatever OPENBLAS_CORETYPE or its
CPU detection picks (bench/train.sh sets the fastest correct ones,
bench/blas_core.sh); the JSON line records them.

--check-ref compares this model with tests/ref/tandem_ref.py in float64 on
small random configs (GQA, dense first layer, shared expert, tied and untied
head, with and without norm_topk_prob): loss and every gradient.

Prints one JSON line: tokens_per_s (median over the timed steps), step_s
(median), flops_per_token (tandem's FLOP formula: 6 x active params per token
+ 6 x L x H x hd x T), gemm_eff (model FLOPs per second against the rate
torch.matmul reaches on 1024^3 float32 at the same thread count, best of 4:
peak_gflops; an efficiency against a GEMM, not MFU, which bench/train.sh
computes against the machine's measured FMA peak), the loss of the first and
last step and every timed step's seconds.  Exits non-zero if the
initial loss is far from ln(V) or the loss did not decrease.
"""
import os
import sys

# glibc's malloc hands blocks above its mmap threshold (at most 32 MiB) back to
# the kernel on free, so every large temporary (medium's expert weights,
# gradients and AdamW temporaries are 33.5 MiB) is fresh pages again, and page
# faults are very slow on this VM: 50x on an AdamW-like loop, 2x on a medium
# step.  A PyTorch user on CPU fixes this with jemalloc/tcmalloc or these
# tunables; re-executed with them unless already set (--malloc-default: don't).
MALLOC_TUNE = "glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=17179869184"
if __name__ == "__main__" and "--malloc-default" not in sys.argv and \
        "glibc.malloc" not in os.environ.get("GLIBC_TUNABLES", ""):
    _env = dict(os.environ)
    _env["GLIBC_TUNABLES"] = ":".join(filter(None, [_env.get("GLIBC_TUNABLES"), MALLOC_TUNE]))
    os.execve(sys.executable, [sys.executable] + sys.argv, _env)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import tandem_ref as R  # noqa: E402

RUN_DEFAULTS = dict(seq_len=256, micro_batch=8, lr=3e-4, min_lr=3e-5, warmup_steps=0, weight_decay=0.1,
                    beta1=0.9, beta2=0.95, adam_eps=1e-8, grad_clip=1.0, seed=1234, steps=1000,
                    lr_schedule="cosine")


def full_config(cfg):
    """The model config with tandem's defaults (tests/ref/tandem_ref.py's, the
    reference's: one table of them); unknown keys are an error."""
    unknown = set(cfg) - set(R.DEFAULTS)
    if unknown:
        raise SystemExit("torch_train.py: unknown model config key(s): %s" % ", ".join(sorted(unknown)))
    return R.full_config(cfg)


def mla_matrices(c):
    """Parameters of an MLA layer's attention matrices (tandem's config.c count)."""
    d, H, qr, r = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    qk, nope, rope, v = c["qk_nope_head_dim"] + c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q = qr * d + H * qk * qr if qr else H * qk * d
    return q + (r + rope) * d + H * (nope + v) * r + d * H * v


def active_params(c):
    """tandem's config_active_param_count: the parameters one token multiplies by."""
    d, V, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    n = V * d
    for layer in range(c["num_hidden_layers"]):
        n += mla_matrices(c) if c["kv_lora_rank"] else d * hd * (2 * H + 2 * Hkv)
        if layer < c["first_k_dense_replace"]:
            n += 3 * c["intermediate_size"] * d
        else:
            F = c["moe_intermediate_size"]
            n += c["num_local_experts"] * d + 3 * F * d * (c["num_experts_per_tok"] + c["n_shared_experts"])
    return n


class MoETransformer(torch.nn.Module):
    def __init__(self, c, T, seed):
        super().__init__()
        self.c = c
        d, hd, H, Hkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        V, E, F, L = c["vocab_size"], c["num_local_experts"], c["moe_intermediate_size"], c["num_hidden_layers"]
        g = torch.Generator().manual_seed(seed)
        std, std_out = 0.02, 0.02 / math.sqrt(2.0 * L)   # as tandem: output projections scaled

        def mat(*shape, s=std):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * s)

        def ones(n):
            return torch.nn.Parameter(torch.ones(n))

        self.embed = mat(V, d)
        self.layers = torch.nn.ModuleList()
        for layer in range(L):
            m = torch.nn.Module()
            m.ln1, m.ln2 = ones(d), ones(d)
            if c["kv_lora_rank"]:   # multi-head latent attention, HF's naive form (docs/mla.md)
                qr, r, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
                qk, nv = c["qk_nope_head_dim"] + rope, c["qk_nope_head_dim"] + c["v_head_dim"]
                if qr:
                    m.q_a, m.q_a_ln, m.q_b = mat(qr, d), ones(qr), mat(H * qk, qr)
                else:
                    m.q = mat(H * qk, d)
                m.kv_a, m.kv_a_ln, m.kv_b = mat(r + rope, d), ones(r), mat(H * nv, r)
                m.o = mat(d, H * c["v_head_dim"], s=std_out)
            else:
                m.qkv = mat((H + 2 * Hkv) * hd, d)
                m.o = mat(d, H * hd, s=std_out)
            m.dense = layer < c["first_k_dense_replace"]
            if m.dense:
                Fd = c["intermediate_size"]
                m.gate_up, m.down = mat(2 * Fd, d), mat(d, Fd, s=std_out)
            else:
                m.router = mat(E, d)
                m.w_gate_up = mat(E, 2 * F, d)     # [gate_e; up_e]
                m.w_down = mat(E, d, F, s=std_out)
                S = F * c["n_shared_experts"]
                if S:
                    m.sh_gate_up, m.sh_down = mat(2 * S, d), mat(d, S, s=std_out)
            self.layers.append(m)
        self.norm = ones(d)
        self.lm_head = None if c["tie_word_embeddings"] else mat(V, d)
        # RoPE tables (HF rotate-half), and the causal mask of the stacked GQA rows
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        f = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([f, f], dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        rep = H // Hkv
        mask = torch.full((T, T), float("-inf")).triu(1)
        self.register_buffer("mask", mask.repeat(rep, 1).contiguous(), persistent=False)   # (rep*T, T)

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * w

    def rope(self, x):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * self.cos + rot * self.sin

    @staticmethod
    def swiglu(x, gate_up, down):
        g, u = Fn.linear(x, gate_up).chunk(2, dim=-1)
        return Fn.linear(Fn.silu(g) * u, down)

    def attention(self, m, h, B, T):
        c = self.c
        hd, H, Hkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        rep = H // Hkv
        qkv = Fn.linear(h, m.qkv)                                       # (B, T, (H+2Hkv) hd)
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = self.rope(q.view(B, T, H, hd).transpose(1, 2))             # (B, H, T, hd)
        k = self.rope(k.view(B, T, Hkv, hd).transpose(1, 2))           # (B, Hkv, T, hd)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        # query heads j*rep .. j*rep+rep-1 share kv head j: stack them as rows
        q = q.reshape(B * Hkv, rep * T, hd)
        k = k.reshape(B * Hkv, T, hd)
        v = v.reshape(B * Hkv, T, hd)
        s = torch.baddbmm(self.mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(hd))
        a = torch.bmm(torch.softmax(s, dim=-1), v)                      # (B*Hkv, rep*T, hd)
        a = a.view(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
        return Fn.linear(a, m.o)

    def mla(self, m, h, B, T):
        """HF DeepseekV3Attention (naive: per-head k_nope and v from kv_b_proj)."""
        c = self.c
        H, r, rope = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
        nope, vd = c["qk_nope_head_dim"], c["v_head_dim"]
        qk = nope + rope
        if c["q_lora_rank"]:
            q = Fn.linear(self.rmsnorm(Fn.linear(h, m.q_a), m.q_a_ln), m.q_b)
        else:
            q = Fn.linear(h, m.q)
        q_pass, q_rot = q.view(B, T, H, qk).transpose(1, 2).split([nope, rope], dim=-1)
        c_kv, k_rot = Fn.linear(h, m.kv_a).split([r, rope], dim=-1)
        kv = Fn.linear(self.rmsnorm(c_kv, m.kv_a_ln), m.kv_b).view(B, T, H, nope + vd).transpose(1, 2)
        k_pass, v = kv.split([nope, vd], dim=-1)
        k_rot = k_rot.view(B, 1, T, rope)
        if c["rope_interleave"]:   # HF's de-interleaving, then rotate-half
            q_rot = q_rot.reshape(B, H, T, rope // 2, 2).transpose(4, 3).reshape(B, H, T, rope)
            k_rot = k_rot.reshape(B, 1, T, rope // 2, 2).transpose(4, 3).reshape(B, 1, T, rope)
        q_rot, k_rot = self.rope(q_rot), self.rope(k_rot)
        q = torch.cat([q_pass, q_rot], dim=-1).reshape(B * H, T, qk)
        k = torch.cat([k_pass, k_rot.expand(B, H, T, rope)], dim=-1).reshape(B * H, T, qk)
        s = torch.baddbmm(self.mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(qk))
        a = torch.bmm(torch.softmax(s, dim=-1), v.reshape(B * H, T, vd))
        a = a.view(B, H, T, vd).transpose(1, 2).reshape(B, T, H * vd)
        return Fn.linear(a, m.o)

    def moe(self, m, h):
        c = self.c
        E, k = c["num_local_experts"], c["num_experts_per_tok"]
        N, d = h.shape
        logits = Fn.linear(h, m.router)                                 # (N, E)
        probs = torch.softmax(logits, dim=-1)
        wk, idx = torch.topk(probs, k, dim=-1)                          # (N, k)
        if c["norm_topk_prob"]:
            wk = wk / wk.sum(-1, keepdim=True)
        flat = idx.reshape(-1)
        order = torch.argsort(flat)                                     # pairs sorted by expert
        tok = order // k                                                # their token rows
        counts = torch.bincount(flat, minlength=E)
        xs = h.index_select(0, tok)                                     # (N k, d), grouped by expert
        # split/unbind, not slicing/indexing: their backward is one cat/stack,
        # where a slice's backward writes a zero-filled full-size gradient per expert
        wgu, wdn = m.w_gate_up.unbind(0), m.w_down.unbind(0)
        outs = [self.swiglu(xe, wgu[e], wdn[e])
                for e, xe in enumerate(xs.split(counts.tolist(), dim=0)) if xe.shape[0]]
        ys = torch.cat(outs, dim=0) * wk.reshape(-1).index_select(0, order)[:, None]
        y = torch.zeros_like(h).index_add_(0, tok, ys)
        if c["n_shared_experts"]:
            y = y + self.swiglu(h, m.sh_gate_up, m.sh_down)
        aux = E / (N * k) * (counts.to(probs.dtype) * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return y, aux, z

    def forward(self, ids, targets):
        c = self.c
        B, T = ids.shape
        d = c["hidden_size"]
        x = Fn.embedding(ids, self.embed)
        auxes, zs = [], []
        for m in self.layers:
            attn = self.mla if c["kv_lora_rank"] else self.attention
            x = x + attn(m, self.rmsnorm(x, m.ln1), B, T)
            h = self.rmsnorm(x, m.ln2)
            if m.dense:
                x = x + self.swiglu(h, m.gate_up, m.down)
            else:
                y, aux, z = self.moe(m, h.view(B * T, d))
                x = x + y.view(B, T, d)
                auxes.append(aux)
                zs.append(z)
        x = self.rmsnorm(x, self.norm)
        logits = Fn.linear(x, self.embed if self.lm_head is None else self.lm_head)
        ce = Fn.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))
        aux = torch.stack(auxes).mean() if auxes else torch.zeros(())
        z = torch.stack(zs).mean() if zs else torch.zeros(())
        loss = ce + c["router_aux_loss_coef"] * aux + c["router_z_loss_coef"] * z
        return loss, ce


def lr_at(rc, step):
    """tandem's lr_schedule: linear warm-up to lr, then cosine to min_lr (or constant)."""
    lr, mn, w, n = rc["lr"], rc["min_lr"], rc["warmup_steps"], rc["steps"]
    if w > 0 and step < w:
        return lr * (step + 1) / w
    if rc["lr_schedule"] != "cosine" or n <= w:
        return lr
    p = min(1.0, (step - w) / max(1, n - w))
    return mn + 0.5 * (lr - mn) * (1 + math.cos(math.pi * p))


def measure_peak(threads):
    n = 1024
    a, b = torch.rand(n, n), torch.rand(n, n)
    c = torch.empty(n, n)
    best = 0.0
    for rep in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b, out=c)
        dt = time.perf_counter() - t0
        if rep:
            best = max(best, 2.0 * n ** 3 / dt * 1e-9)
    return best


def blas_core():
    """OpenBLAS's kernel family in this process (OPENBLAS_CORETYPE or autodetected)."""
    import ctypes
    for lib in ("libblas.so.3", "libopenblas.so.0"):
        try:
            f = ctypes.CDLL(lib).openblas_get_corename
            f.restype = ctypes.c_char_p
            return f().decode()
        except (OSError, AttributeError):
            continue
    return None


def load_tokens(path):
    if not path:
        return None
    with open(path, "rb") as f:
        h = f.read(64)
    if len(h) < 64 or h[:8] != b"TNDMTOK1":
        raise SystemExit("torch_train.py: %s is not a token file (tandem data prepare)" % path)
    width = int.from_bytes(h[12:16], "little")
    count = int.from_bytes(h[16:24], "little")
    n_val = int.from_bytes(h[24:32], "little")
    dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    return np.memmap(path, dtype=dt, mode="r", offset=64, shape=(count,))[: count - n_val]


def check_ref():
    """This model against tests/ref/tandem_ref.py (float64): loss and gradients."""
    cfgs = [dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 moe_intermediate_size=32, num_local_experts=4, first_k_dense_replace=1, intermediate_size=96,
                 n_shared_experts=1, tie_word_embeddings=True),
            dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                 moe_intermediate_size=32, num_local_experts=8, norm_topk_prob=False),
            dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                 rope_interleave=True, moe_intermediate_size=32, num_local_experts=4, first_k_dense_replace=1,
                 intermediate_size=96, n_shared_experts=1),
            dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                 kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
                 moe_intermediate_size=32, num_local_experts=4)]
    worst = 0.0
    for i, cfg in enumerate(cfgs):
        w = {k: v.requires_grad_() for k, v in R.random_weights(cfg, 3 + i).items()}
        c, T = full_config(cfg), 16
        m = MoETransformer(c, T, 0).double()
        names = {}   # our parameter -> the reference tensors it fuses (dim)
        names[m.embed] = (["model/embed_tokens"], 0)
        for layer, L in enumerate(m.layers):
            p = "model/layers/%d/" % layer
            names[L.ln1], names[L.ln2] = ([p + "input_layernorm"], 0), ([p + "post_attention_layernorm"], 0)
            if c["kv_lora_rank"]:
                for attr, key in (("q_a", "q_a_proj"), ("q_a_ln", "q_a_layernorm"), ("q_b", "q_b_proj"), ("q", "q_proj"),
                                  ("kv_a", "kv_a_proj_with_mqa"), ("kv_a_ln", "kv_a_layernorm"), ("kv_b", "kv_b_proj")):
                    if hasattr(L, attr):
                        names[getattr(L, attr)] = ([p + "self_attn/" + key], 0)
            else:
                names[L.qkv] = ([p + "self_attn/%s_proj" % x for x in "qkv"], 0)
            names[L.o] = ([p + "self_attn/o_proj"], 0)
            if L.dense:
                names[L.gate_up], names[L.down] = ([p + "mlp/gate_proj", p + "mlp/up_proj"], 0), ([p + "mlp/down_proj"], 0)
            else:
                names[L.router] = ([p + "mlp/gate"], 0)
                names[L.w_gate_up] = ([p + "mlp/experts/gate_proj", p + "mlp/experts/up_proj"], 1)
                names[L.w_down] = ([p + "mlp/experts/down_proj"], 0)
                if c["n_shared_experts"]:
                    names[L.sh_gate_up] = ([p + "mlp/shared_experts/gate_proj", p + "mlp/shared_experts/up_proj"], 0)
                    names[L.sh_down] = ([p + "mlp/shared_experts/down_proj"], 0)
        names[m.norm] = (["model/norm"], 0)
        if m.lm_head is not None:
            names[m.lm_head] = (["lm_head"], 0)
        with torch.no_grad():
            for prm, (ks, dim) in names.items():
                prm.copy_(torch.cat([w[k] for k in ks], dim=dim))
        g = torch.Generator().manual_seed(i)
        ids, tg = torch.randint(0, 256, (3, T), generator=g), torch.randint(0, 256, (3, T), generator=g)
        ref = R.TandemRef(cfg, w).loss(ids, tg)["loss"]
        ref.backward()
        loss, _ = m(ids, tg)
        loss.backward()
        err = abs(loss.item() - ref.item())
        for prm, (ks, dim) in names.items():
            want = torch.cat([w[k].grad for k in ks], dim=dim)
            err = max(err, (prm.grad - want).abs().max().item() / max(1e-12, want.abs().max().item()))
        print("check-ref: config %d loss %.10f (reference %.10f), worst relative error %.2e" % (i, loss.item(), ref.item(), err))
        worst = max(worst, err)
    return 0 if worst < 1e-6 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="configs/small.json",
                    help="a tandem run config (JSON with a \"model\" object or path)")
    ap.add_argument("overrides", nargs="*", help="key=value run-config overrides")
    ap.add_argument("--data", default=None, help="token file (tandem data prepare); default: random bytes")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-check", action="store_true", help="skip the loss sanity checks")
    ap.add_argument("--malloc-default", action="store_true", help="keep glibc's default malloc thresholds")
    ap.add_argument("--optim-single", action="store_true", help="AdamW's single-tensor loop, not foreach")
    ap.add_argument("--check-ref", action="store_true", help="compare with tests/ref/tandem_ref.py and exit")
    a = ap.parse_args()
    if a.check_ref:
        return check_ref()

    with open(a.config) as f:
        rc = json.load(f)
    for kv in a.overrides:
        key, _, val = kv.partition("=")
        try:
            rc[key] = json.loads(val)
        except ValueError:
            rc[key] = val
    model_cfg = rc.get("model", {})
    if isinstance(model_cfg, str):
        with open(model_cfg) as f:
            model_cfg = json.load(f)
    run = dict(RUN_DEFAULTS)
    run.update({k: rc[k] for k in RUN_DEFAULTS if k in rc})
    c = full_config(model_cfg)
    B, T = int(run["micro_batch"]), int(run["seq_len"])

    torch.set_num_threads(a.threads)
    torch.manual_seed(run["seed"])
    peak = measure_peak(a.threads)

    model = MoETransformer(c, T, run["seed"])
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=run["weight_decay"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=run["lr"], betas=(run["beta1"], run["beta2"]), eps=run["adam_eps"],
                            foreach=not a.optim_single)

    tokens = load_tokens(a.data)
    rng = np.random.default_rng(run["seed"])

    def batch():
        if tokens is None:
            w = torch.from_numpy(rng.integers(0, c["vocab_size"], size=(B, T + 1)))
        else:
            starts = rng.integers(0, len(tokens) - T - 1, size=B)
            w = torch.from_numpy(np.stack([np.asarray(tokens[s:s + T + 1], dtype=np.int64) for s in starts]))
        return w[:, :T].long().contiguous(), w[:, 1:].long().contiguous()

    import resource
    losses, times, faults = [], [], []
    for step in range(a.warmup + a.steps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ids, tg = batch()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(run, step)
        opt.zero_grad(set_to_none=True)
        loss, ce = model(ids, tg)
        loss.backward()
        if run["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, run["grad_clip"])
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(dt)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        print("torch_train: step %d loss %.4f %.3f s" % (step + 1, losses[-1], dt), file=sys.stderr, flush=True)

    flops_tok = 6.0 * active_params(c) + 6.0 * c["num_hidden_layers"] * c["num_attention_heads"] * c["head_dim"] * T
    step_s = statistics.median(times)
    tok_s = B * T / step_s
    out = dict(bench="torch_train", config=a.config, torch=torch.__version__, threads=a.threads,
               omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), glibc_tunables=os.environ.get("GLIBC_TUNABLES"),
               optim="single" if a.optim_single else "foreach", openblas_core=blas_core(), batch=[B, T],
               active_params=active_params(c), flops_per_token=flops_tok,
               tokens_per_s=round(tok_s, 1), step_s=round(step_s, 4),
               gemm_eff=round(flops_tok * tok_s / (peak * 1e9), 4), peak_gflops=round(peak, 1),
               loss_first=round(losses[0], 4), loss_last=round(losses[-1], 4),
               steps_timed=len(times), step_times=[round(t, 4) for t in times],
               minor_faults_per_step=int(statistics.median(faults)))
    print(json.dumps(out), flush=True)
    if not a.no_check:
        ln_v = math.log(c["vocab_size"])
        if abs(losses[0] - ln_v) > 0.5:
            print("torch_train.py: initial loss %.3f is far from ln(V) = %.3f" % (losses[0], ln_v), file=sys.stderr)
            return 1
        if tokens is not None and len(losses) >= 4 and not min(losses[-2:]) < losses[0]:
            print("torch_train.py: loss did not decrease (%.3f -> %.3f)" % (losses[0], losses[-1]), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

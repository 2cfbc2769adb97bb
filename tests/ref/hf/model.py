"""tests/ref/hf/model.py - the forward pass of MixtralForCausalLM,
Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and OlmoeForCausalLM in float64,
written from the transformers modeling files (models/{mixtral,qwen2_moe,
qwen3_moe,olmoe}/modeling_*.py and their modular_*.py), reading the tensors
by their HF names in either layout:

  x = embed_tokens[ids]
  per layer:  h = rmsnorm(x, input_layernorm)              rmsnorm(x, w) = w * x / sqrt(mean(x^2) + eps)
              q, k, v = h Wq^T (+ bq), h Wk^T (+ bk), h Wv^T (+ bv)
                  Qwen2-MoE: q/k/v biases (qkv_bias, default true); Qwen3/OLMoE: attention_bias (all four)
              OLMoE:     q = rmsnorm(q, q_norm), k = rmsnorm(k, k_norm) over the whole projected width,
                         then q, k, v clamped to [-clip_qkv, clip_qkv] (norm first, then clip)
              Qwen3-MoE: q, k viewed as heads of head_dim, rmsnorm per head (one weight [head_dim]
                         shared by the heads), before RoPE
              RoPE rotate-half, inv_freq and angles in float32 as HF computes them, cos/sin
              float32 (HF's Rotary Embedding runs with autocast off in float32); GQA by repeat
              a = softmax(q k^T / sqrt(head_dim) + causal) v;  x = x + a Wo^T (+ bo)
              h = rmsnorm(x, post_attention_layernorm)
              dense layer (Qwen schedule): x += down(silu(gate(h)) * up(h))
              MoE layer:  p = softmax(h Wr^T) (float32 in HF; float64 here); top-k by p;
                          w = p[topk], renormalised when Mixtral (always) or norm_topk_prob;
                          y = sum_j w_j expert_j(h); expert(h) = down(silu(gate(h)) * up(h))
                          (v5: gate, up = (h gate_up_proj[e]^T).chunk(2), gate first)
                          Qwen2-MoE: y += sigmoid(h Wsg^T) * shared_expert(h)   (Wsg [1, d])
              x = x + y
  logits = rmsnorm(x, norm) lm_head^T    (embed_tokens when tie_word_embeddings)

The auxiliary loss is transformers' load_balancing_loss_func (Switch):
router logits of all MoE layers concatenated (M = layers x tokens rows),
E * sum_{j,e} mean_M(onehot(topk_j) == e) * mean_M(softmax)_e.
"""
import math

import torch

from . import families


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def yarn_get_mscale(scale, mscale=1.0):
    """HF yarn_get_mscale / get_mscale (Python floats)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(hd, theta, scaling=None, max_pos=None):
    """(inv_freq float32 (hd/2,), attention_factor) as transformers'
    ROPE_INIT_FUNCTIONS compute them (modeling_rope_utils.py): default,
    linear (inv_freq / factor) and yarn (_compute_yarn_parameters: the
    linear-ramp blend of interpolated and extrapolated frequencies).  The
    factor is rope_scaling["factor"] (transformers 5; 4.5x took
    max_position_embeddings / original_max_position_embeddings when the
    latter is given, the same number for every published config)."""
    typ = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))
    if typ == "default":
        return inv, 1.0
    factor = scaling["factor"]
    if typ == "linear":
        return inv / factor, 1.0
    if typ != "yarn":
        raise ValueError("rope_scaling type %r is not supported" % typ)
    orig = scaling.get("original_max_position_embeddings") or max_pos
    att = scaling.get("attention_factor")
    ms, msa = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if att is None:
        att = float(yarn_get_mscale(factor, ms) / yarn_get_mscale(factor, msa)) if ms and msa else yarn_get_mscale(factor)
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def corr_dim(n_rot):
        return (hd * math.log(orig / (n_rot * 2 * math.pi))) / (2 * math.log(theta))

    lo, hi = corr_dim(fast), corr_dim(slow)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, hd - 1)
    if lo == hi:
        hi += 0.001
    ramp = torch.clamp((torch.arange(hd // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    pos_freqs = theta ** (torch.arange(0, hd, 2).to(torch.float32) / hd)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ef = 1 - ramp
    return inter * (1 - ef) + extra * ef, att


def softmax_scale_factor(scaling):
    """DeepSeek-V3 attention __init__: scaling *= mscale^2 when
    rope_scaling has mscale_all_dim (mscale = yarn_get_mscale(factor, it))."""
    if not scaling or not scaling.get("mscale_all_dim"):
        return 1.0
    m = yarn_get_mscale(scaling["factor"], scaling["mscale_all_dim"])
    return m * m


def rope_tables(T, hd, theta, offset=0, scaling=None, max_pos=None, positions=None):
    """cos, sin (T, hd) float64 holding HF's float32 values: emb.cos() *
    attention_scaling in float32 (HF's RotaryEmbedding runs autocast off)."""
    inv, att = rope_inv_freq(hd, theta, scaling, max_pos)
    pos = torch.arange(offset, offset + T, dtype=torch.float32) if positions is None else positions.to(torch.float32)
    freqs = pos[:, None] * inv[None, :]                       # float32, one rounding as HF's matmul
    emb = torch.cat([freqs, freqs], dim=-1)
    c, s = emb.cos(), emb.sin()
    if att != 1.0:
        c, s = c * att, s * att
    return c.to(torch.float64), s.to(torch.float64)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class HFRef:
    """The model of an HF checkpoint.  tensors: HF name -> tensor of any
    float dtype; they are converted to float64 (exactly) unless already
    float64, in which case they are used as given (so autograd reaches them)."""

    def __init__(self, cfg, tensors):
        self.cfg = cfg
        self.s = families.spec(cfg)
        self.layout = families.detect_layout(cfg, tensors.keys())
        self.w = {}
        for n, t in tensors.items():
            want = dict(families.param_shapes(cfg, self.layout))[n]
            if tuple(t.shape) != tuple(want):
                raise ValueError("%s: shape %s, the config says %s" % (n, tuple(t.shape), tuple(want)))
            self.w[n] = t if t.dtype == torch.float64 else t.to(torch.float64)

    # ------------------------------------------------------------ pieces

    def linear(self, x, name, bias=False):
        y = x @ self.w[name + ".weight"].T
        if bias:
            y = y + self.w[name + ".bias"]
        return y

    def attention(self, l, h, cos, sin):
        s, w, p = self.s, self.w, "model.layers.%d.self_attn." % l
        B, T, _ = h.shape
        H, Hkv, hd = s["H"], s["Hkv"], s["hd"]
        bias = s["qkv_bias"] or s["attn_bias"]
        q, k, v = self.linear(h, p + "q_proj", bias), self.linear(h, p + "k_proj", bias), self.linear(h, p + "v_proj", bias)
        if s["qk_norm"] == "full":                       # OLMoE: over the whole width, before the clip
            q = rmsnorm(q, w[p + "q_norm.weight"], s["eps"])
            k = rmsnorm(k, w[p + "k_norm.weight"], s["eps"])
        if s["clip_qkv"] is not None:
            c = float(s["clip_qkv"])
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q = q.view(B, T, H, hd)
        k = k.view(B, T, Hkv, hd)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        if s["qk_norm"] == "head":                       # Qwen3: per head, weight [head_dim]
            q = rmsnorm(q, w[p + "q_norm.weight"], s["eps"])
            k = rmsnorm(k, w[p + "k_norm.weight"], s["eps"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)      # (B, heads, T, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = H // Hkv
        k = k[:, :, None].expand(B, Hkv, rep, T, hd).reshape(B, H, T, hd)
        v = v[:, :, None].expand(B, Hkv, rep, T, hd).reshape(B, H, T, hd)
        scores = (q @ k.transpose(2, 3)) * hd ** -0.5
        mask = torch.full((T, T), float("-inf"), dtype=scores.dtype).triu(1)
        window = s.get("windows", [None] * s["L"])[l]
        if window is not None:   # HF's sliding_window mask: key j seen from i when i - W < j <= i
            mask = mask + torch.full((T, T), float("-inf"), dtype=scores.dtype).tril(-window)
        a = torch.softmax(scores + mask, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, H * hd)
        return self.linear(a, p + "o_proj", s["attn_bias"])

    def mla_attention(self, l, h, cos, sin):
        """DeepseekV3Attention, the naive (not absorbed) form of the HF code:
        q = q_b(q_a_norm(q_a(h))) or q_proj(h), split per head [nope | rope];
        kv_a(h) = [c_kv (r) | k_rope (rope), one shared by the heads];
        kv_b(kv_a_norm(c_kv)) per head [k_nope | v]; RoPE on the rope parts
        (rope_interleave: HF's apply_rotary_pos_emb_interleave, i.e. the
        pairs (2i, 2i+1) regrouped to (i, i + rope/2) before rotate-half);
        softmax scale (nope + rope)^-0.5 x mscale^2 (YaRN mscale_all_dim)."""
        s, w, p = self.s, self.w, "model.layers.%d.self_attn." % l
        B, T, _ = h.shape
        H, nope, rope, vd, r = s["H"], s["nope"], s["rope"], s["vd"], s["r"]
        if s["qr"]:
            q = self.linear(rmsnorm(self.linear(h, p + "q_a_proj"), w[p + "q_a_layernorm.weight"], s["eps"]), p + "q_b_proj")
        else:
            q = self.linear(h, p + "q_proj")
        q = q.view(B, T, H, nope + rope).transpose(1, 2)
        q_pass, q_rot = q[..., :nope], q[..., nope:]
        ckv = self.linear(h, p + "kv_a_proj_with_mqa")
        c, k_rot = ckv[..., :r], ckv[..., r:]
        kv = self.linear(rmsnorm(c, w[p + "kv_a_layernorm.weight"], s["eps"]), p + "kv_b_proj")
        kv = kv.view(B, T, H, nope + vd).transpose(1, 2)
        k_pass, v = kv[..., :nope], kv[..., nope:]
        k_rot = k_rot.reshape(B, 1, T, rope)
        if s["interleave"]:
            q_rot = q_rot.reshape(B, H, T, rope // 2, 2).transpose(4, 3).reshape(B, H, T, rope)
            k_rot = k_rot.reshape(B, 1, T, rope // 2, 2).transpose(4, 3).reshape(B, 1, T, rope)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = k_rot * cos + rotate_half(k_rot) * sin
        k_rot = k_rot.expand(B, H, T, rope)
        qq = torch.cat([q_pass, q_rot], -1)
        kk = torch.cat([k_pass, k_rot], -1)
        scale = (nope + rope) ** -0.5 * softmax_scale_factor(s["rope_scaling"])
        scores = (qq @ kk.transpose(2, 3)) * scale
        mask = torch.full((T, T), float("-inf"), dtype=scores.dtype).triu(1)
        a = torch.softmax(scores + mask, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, H * vd)
        return self.linear(a, p + "o_proj")

    def v3_route(self, x, m, stats):
        """DeepseekV3TopkRouter + the MoE's weights: s = sigmoid(x Wr^T);
        choice scores s + e_score_correction_bias; a group's score the sum
        of its top 2; the best topk_group groups kept, the others masked to
        -inf; top-k of the kept; weights from the unbiased s, renormalised
        (+1e-20) when norm_topk_prob, times routed_scaling_factor."""
        s, w = self.s, self.w
        E, G, k = s["E"], s["n_group"], s["k"]
        logits = x @ w[m + "gate.weight"].T
        sc = torch.sigmoid(logits)
        choice = sc + w[m + "gate.e_score_correction_bias"][None, :]
        N = x.shape[0]
        if G > 1:
            gs = choice.view(N, G, E // G).topk(2, dim=-1)[0].sum(-1)           # (N, G)
            gidx = gs.topk(s["topk_group"], dim=-1)[1]
            keep = torch.zeros_like(gs, dtype=torch.bool).scatter(1, gidx, True)
            if s["topk_group"] < G:
                srt = torch.sort(gs.detach(), -1, descending=True).values
                stats["router_min_gap"] = min(stats.get("router_min_gap", math.inf),
                                              float((srt[:, s["topk_group"] - 1] - srt[:, s["topk_group"]]).min()))
            choice = choice.masked_fill(~keep[:, :, None].expand(N, G, E // G).reshape(N, E), float("-inf"))
        topi = choice.topk(k, dim=-1)[1]
        if k < E:
            srt = torch.sort(choice.detach(), -1, descending=True).values
            nxt = srt[:, k]
            gap = torch.where(torch.isinf(nxt), torch.full_like(nxt, math.inf), srt[:, k - 1] - nxt)
            stats["router_min_gap"] = min(stats.get("router_min_gap", math.inf), float(gap.min()))
        topv = sc.gather(1, topi)
        if s["norm_topk"]:
            topv = topv / (topv.sum(-1, keepdim=True) + 1e-20)
        return logits, topi, topv * s["rsf"]

    def swiglu(self, x, g, u, dn):
        return (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ dn.T

    def moe(self, l, h, stats):
        s, w = self.s, self.w
        m = "model.layers.%d.%s." % (l, families.moe_prefix(s, self.layout))
        B, T, d = h.shape
        x = h.reshape(B * T, d)
        if s["family"] == "deepseek_v3":
            logits, topi, topv = self.v3_route(x, m, stats)
        else:
            logits = x @ w[m + "gate.weight"].T                          # (N, E)
            probs = torch.softmax(logits, dim=-1)
            topv, topi = torch.topk(probs, s["k"], dim=-1)
        if s["family"] != "deepseek_v3" and s["k"] < s["E"]:
            # margin of the routing decision: how far the k-th choice is from the next
            srt = torch.sort(probs.detach(), dim=-1, descending=True).values
            stats["router_min_gap"] = min(stats.get("router_min_gap", math.inf),
                                          float((srt[:, s["k"] - 1] - srt[:, s["k"]]).min()))
        if s["norm_topk"] and s["family"] != "deepseek_v3":
            topv = topv / topv.sum(-1, keepdim=True)
        y = torch.zeros_like(x)
        g, u, dn = families.expert_names(s)
        for e in range(s["E"]):
            sel = topi == e                                              # (N, k)
            tok = sel.any(-1).nonzero().flatten()
            if tok.numel() == 0:
                continue
            we = (topv * sel).sum(-1)[tok]
            xe = x[tok]
            if self.layout == "v4":
                pe = m + "experts.%d." % e
                ye = self.swiglu(xe, w[pe + g + ".weight"], w[pe + u + ".weight"], w[pe + dn + ".weight"])
            else:
                gate, up = (xe @ w[m + "experts.gate_up_proj"][e].T).chunk(2, dim=-1)
                ye = (torch.nn.functional.silu(gate) * up) @ w[m + "experts.down_proj"][e].T
            y = y.index_add(0, tok, we[:, None] * ye)
        if s["family"] == "qwen2_moe":
            sh = m + "shared_expert."
            shared = self.swiglu(x, w[sh + "gate_proj.weight"], w[sh + "up_proj.weight"], w[sh + "down_proj.weight"])
            y = y + torch.sigmoid(x @ w[m + "shared_expert_gate.weight"].T) * shared
        if s["family"] == "deepseek_v3" and s["shared"]:                   # ungated
            sh = m + "shared_experts."
            y = y + self.swiglu(x, w[sh + "gate_proj.weight"], w[sh + "up_proj.weight"], w[sh + "down_proj.weight"])
        stats.setdefault("router_logits", []).append(logits)
        stats.setdefault("routes", []).append(topi)
        return y.view(B, T, d)

    # ------------------------------------------------------------ model

    def forward(self, ids, stats=None):
        """ids (B, T) long -> logits (B, T, V) float64.  stats (a dict) gets
        router_logits (per MoE layer, (B T, E)), routes and router_min_gap."""
        s, w = self.s, self.w
        if stats is None:
            stats = {}
        if int(ids.max()) >= s["V"] or int(ids.min()) < 0:
            raise ValueError("token id out of [0, %d)" % s["V"])
        B, T = ids.shape
        cos, sin = rope_tables(T, s["hd"], s["theta"], scaling=s["rope_scaling"], max_pos=s["max_pos"])
        x = w["model.embed_tokens.weight"][ids]
        for l in range(s["L"]):
            p = "model.layers.%d." % l
            attn = self.mla_attention if s.get("mla") else self.attention
            x = x + attn(l, rmsnorm(x, w[p + "input_layernorm.weight"], s["eps"]), cos, sin)
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], s["eps"])
            if s["moe_layers"][l]:
                x = x + self.moe(l, h, stats)
            else:
                x = x + self.swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                                    w[p + "mlp.down_proj.weight"])
        x = rmsnorm(x, w["model.norm.weight"], s["eps"])
        head = w["model.embed_tokens.weight"] if s["tie"] else w["lm_head.weight"]
        return x @ head.T

    def aux_loss(self, stats):
        """transformers' load_balancing_loss_func over the MoE layers."""
        if not stats.get("router_logits"):
            return torch.zeros((), dtype=torch.float64)
        E, k = self.s["E"], self.s["k"]
        logits = torch.cat(stats["router_logits"], 0)
        rw = torch.softmax(logits, dim=-1)
        _, sel = torch.topk(rw, k, dim=-1)
        mask = torch.nn.functional.one_hot(sel, E).to(rw.dtype)         # (M, k, E)
        return (mask.mean(0) * rw.mean(0)[None]).sum() * E

    def logprobs(self, inputs, targets):
        """log p(targets[b, t] | inputs[b, :t+1]) (B, T), and stats."""
        stats = {}
        logp = torch.log_softmax(self.forward(inputs, stats), dim=-1)
        return logp.gather(-1, targets[..., None])[..., 0], stats

    def loss(self, inputs, targets, with_aux=False):
        """HF's causal LM loss: mean cross-entropy over every position, plus
        router_aux_loss_coef * aux when with_aux (output_router_logits)."""
        lp, stats = self.logprobs(inputs, targets)
        ce = -lp.mean()
        aux = self.aux_loss(stats)
        total = ce + self.s["aux_coef"] * aux if with_aux else ce
        return total, ce, aux, stats

    def greedy(self, prompt, n):
        """Greedy continuation of prompt (list of ids) by n tokens: full
        recomputation per step.  Returns ids, their logprobs, and the
        smallest gap between the best and second-best logit seen."""
        ids, lps, gap = list(prompt), [], math.inf
        for _ in range(n):
            logits = self.forward(torch.tensor([ids]))[0, -1]
            lp = torch.log_softmax(logits, -1)
            top2 = torch.topk(logits, 2).values
            gap = min(gap, float(top2[0] - top2[1]))
            nxt = int(torch.argmax(logits))
            ids.append(nxt)
            lps.append(float(lp[nxt]))
        return ids[len(prompt):], lps, gap

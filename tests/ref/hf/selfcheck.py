"""tests/ref/hf/selfcheck.py - the reference checks itself (hf_ref.py
selfcheck; run by tests/cli/hf_ref.sh).  For each family:

  layouts    v4 (per-expert) and v5 (fused gate_up_proj, computed the v5 way:
             one product, then chunk) give the same logprobs: a swapped
             gate/up split or a wrong stacking order would not
  disk       make -> st.py -> load: f32 single file equals the in-memory model
             bit for bit; a bf16 sharded v5 checkpoint equals the f32 model
             evaluated on its own bf16-rounded weights, and differs from f32
  features   each family feature changes the output when removed (q/k/v
             bias, shared-expert gate, q/k norm, clip_qkv, the dense layer):
             none is silently ignored
  grads      autograd against central differences of the loss (with the
             auxiliary loss) along random directions, float64
  greedy     greedy tokens' logprobs equal scoring the generated sequence
  strict     a missing or an unexpected tensor is refused
  tandem     Mixtral (the features tandem's model has) against
             tests/ref/tandem_ref.py, an independent implementation of SPEC
             section 2: the same logprobs
"""
import copy
import math
import os
import sys
import tempfile

import torch

from . import families, st
from .model import HFRef

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ids(cfg, B=2, T=16, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=g)


def _lp(cfg, t, ids):
    with torch.no_grad():
        return HFRef(cfg, t).logprobs(ids[:, :-1], ids[:, 1:])[0]


def _maxdiff(a, b):
    return float((a - b).abs().max())


class Checker:
    def __init__(self):
        self.failed = []

    def check(self, fam, what, ok, detail):
        line = "%-10s %-40s %s  %s" % (fam, what, "ok  " if ok else "FAIL", detail)
        print(line)
        if not ok:
            self.failed.append(line)


def check_family(c, fam, tmp):
    cfg4 = families.config_json(fam, "f32", "v4")
    cfg5 = families.config_json(fam, "f32", "v5")
    t4 = families.random_tensors(cfg4, seed=3)
    t5 = families.to_v5(cfg4, t4)
    ids = _ids(cfg4)
    lp4 = _lp(cfg4, t4, ids)
    lp5 = _lp(cfg5, t5, ids)
    d = _maxdiff(lp4, lp5)
    c.check(fam, "v4 == v5 layout", d < 1e-12, "max |dlogp| %.2e" % d)
    c.check(fam, "logprobs are not trivial", float(lp4.std()) > 0.3 and float(lp4.max()) < 0,
            "std %.3f, max %.3f" % (float(lp4.std()), float(lp4.max())))

    # disk round trips through the writer and the reader
    d1 = os.path.join(tmp, fam + "_f32")
    st.save_sharded(t4, d1, 1, metadata={"format": "pt"})
    back = st.load_dir(d1)
    same = set(back) == set(t4) and all(torch.equal(back[n], t4[n]) for n in t4)
    d = _maxdiff(_lp(cfg4, back, ids), lp4)
    c.check(fam, "f32 file == memory", same and d == 0.0, "tensors equal %s, max |dlogp| %.2e" % (same, d))
    d2 = os.path.join(tmp, fam + "_bf16_v5")
    t5b = {n: v.to(torch.bfloat16) for n, v in t5.items()}
    st.save_sharded(t5b, d2, 3, metadata={"format": "pt"})
    shards = sorted(f for f in os.listdir(d2) if f.endswith(".safetensors"))
    back = st.load_dir(d2)
    lpb = _lp(families.config_json(fam, "bf16", "v5"), back, ids)
    t4r = {n: v.to(torch.bfloat16).to(torch.float32) for n, v in t4.items()}
    d = _maxdiff(lpb, _lp(cfg4, t4r, ids))
    dbf = _maxdiff(lpb, lp4)
    c.check(fam, "bf16 v5 3 shards == f32 on bf16 weights", d < 1e-12 and len(shards) == 3,
            "%d shards, max |dlogp| %.2e (%.2e from f32)" % (len(shards), d, dbf))
    c.check(fam, "bf16 differs from f32 by rounding", 1e-5 < dbf < 0.5, "max |dlogp| %.2e" % dbf)

    # every feature matters
    def without(mutate_cfg=None, mutate_t=None):
        cc, tt = copy.deepcopy(cfg4), dict(t4)
        if mutate_cfg:
            mutate_cfg(cc)
        if mutate_t:
            tt = mutate_t(tt)
        return _maxdiff(_lp(cc, tt, ids), lp4)

    def scaled(pattern, f):
        return lambda tt: {n: (v * f if pattern in n else v) for n, v in tt.items()}

    if fam == "qwen2_moe":
        c.check(fam, "q/k/v biases matter", without(mutate_t=scaled("_proj.bias", 0.0)) > 1e-3, "")
        c.check(fam, "shared_expert_gate matters", without(mutate_t=scaled("shared_expert_gate", 0.0)) > 1e-3, "")
        c.check(fam, "shared expert matters", without(mutate_t=scaled("shared_expert.down", 0.0)) > 1e-3, "")
        c.check(fam, "layer 1 is dense (mlp_only_layers)",
                "model.layers.1.mlp.gate_proj.weight" in t4 and "model.layers.1.mlp.gate.weight" not in t4, "")
    if fam == "qwen3_moe":
        c.check(fam, "q/k norm matters", without(mutate_t=scaled("q_norm", 2.0)) > 1e-3, "")
        c.check(fam, "head_dim != hidden/heads", cfg4["head_dim"] != cfg4["hidden_size"] // cfg4["num_attention_heads"],
                "head_dim %d" % cfg4["head_dim"])
        c.check(fam, "layers 0, 2 dense (decoder_sparse_step)",
                families.spec(cfg4)["moe_layers"] == [False, True, False, True], "")
    if fam == "olmoe":
        c.check(fam, "clip_qkv matters", without(mutate_cfg=lambda cc: cc.update(clip_qkv=None)) > 1e-3, "")
        c.check(fam, "q/k norm matters", without(mutate_t=scaled("k_norm", 2.0)) > 1e-3, "")
    if fam == "mixtral":
        c.check(fam, "GQA (kv heads < heads)", cfg4["num_key_value_heads"] < cfg4["num_attention_heads"], "")

    # gradients against central differences, loss with the aux term
    tg = {n: v.to(torch.float64).requires_grad_(True) for n, v in t4.items()}
    ref = HFRef(cfg4, tg)
    loss, _, aux, _ = ref.loss(ids[:, :-1], ids[:, 1:], with_aux=True)
    loss.backward()
    for v in tg.values():          # an expert no token chose has no gradient
        if v.grad is None:
            v.grad = torch.zeros_like(v)
    g = torch.Generator().manual_seed(11)
    worst = 0.0
    for _ in range(2):
        dirs = {n: torch.randn(v.shape, generator=g, dtype=torch.float64) for n, v in tg.items()}
        norm = math.sqrt(sum(float((x * x).sum()) for x in dirs.values()))
        analytic = sum(float((tg[n].grad * dirs[n]).sum()) for n in tg) / norm
        h = 1e-5
        with torch.no_grad():
            lp = HFRef(cfg4, {n: tg[n] + h * dirs[n] / norm for n in tg}).loss(ids[:, :-1], ids[:, 1:], True)[0]
            lm = HFRef(cfg4, {n: tg[n] - h * dirs[n] / norm for n in tg}).loss(ids[:, :-1], ids[:, 1:], True)[0]
        fd = float(lp - lm) / (2 * h)
        worst = max(worst, abs(fd - analytic) / max(abs(analytic), 1e-3))
    c.check(fam, "grads == central differences", worst < 1e-6, "worst rel err %.2e (aux %.3f)" % (worst, float(aux)))
    dead = [n for n in tg if float(tg[n].grad.abs().max()) == 0]
    c.check(fam, "gradients reach all but unchosen experts", all(".experts." in n for n in dead),
            "%d tensors, %d without gradient %s" % (len(tg), len(dead), dead[:1]))

    # greedy against scoring
    with torch.no_grad():
        r = HFRef(cfg4, t4)
        prompt = ids[0, :5].tolist()
        gen, glp, _ = r.greedy(prompt, 6)
        seq = torch.tensor([prompt + gen])
        slp = r.logprobs(seq[:, :-1], seq[:, 1:])[0][0, len(prompt) - 1:]
    d = max(abs(a - b) for a, b in zip(glp, slp.tolist()))
    c.check(fam, "greedy logprobs == scoring", d < 1e-12 and len(gen) == 6, "max diff %.2e" % d)

    # strictness
    bad = dict(t4)
    bad.pop("model.norm.weight")
    try:
        HFRef(cfg4, bad)
        c.check(fam, "refuses a missing tensor", False, "accepted")
    except ValueError as e:
        c.check(fam, "refuses a missing tensor", "model.norm.weight" in str(e), str(e)[:60])
    bad = dict(t4)
    bad["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    try:
        HFRef(cfg4, bad)
        c.check(fam, "refuses an unexpected tensor", False, "accepted")
    except ValueError as e:
        c.check(fam, "refuses an unexpected tensor", "extra" in str(e), str(e)[:60])


def _grads_vs_fd(c, fam, cfg, t, ids):
    tg = {n: v.to(torch.float64).requires_grad_(True) for n, v in t.items()}
    loss = HFRef(cfg, tg).loss(ids[:, :-1], ids[:, 1:])[0]
    loss.backward()
    for v in tg.values():
        if v.grad is None:
            v.grad = torch.zeros_like(v)
    g = torch.Generator().manual_seed(11)
    worst = 0.0
    for _ in range(2):
        dirs = {n: torch.randn(v.shape, generator=g, dtype=torch.float64) for n, v in tg.items()}
        norm = math.sqrt(sum(float((x * x).sum()) for x in dirs.values()))
        analytic = sum(float((tg[n].grad * dirs[n]).sum()) for n in tg) / norm
        h = 1e-5
        with torch.no_grad():
            lp = HFRef(cfg, {n: tg[n] + h * dirs[n] / norm for n in tg}).loss(ids[:, :-1], ids[:, 1:])[0]
            lm = HFRef(cfg, {n: tg[n] - h * dirs[n] / norm for n in tg}).loss(ids[:, :-1], ids[:, 1:])[0]
        worst = max(worst, abs(float(lp - lm) / (2 * h) - analytic) / max(abs(analytic), 1e-3))
    c.check(fam, "grads == central differences", worst < 1e-6, "worst rel err %.2e" % worst)
    dead = [n for n in tg if float(tg[n].grad.abs().max()) == 0]
    # the correction bias moves the choice only: it has no gradient, as in HF (a buffer)
    c.check(fam, "gradients reach all but unchosen experts and the bias",
            all(".experts." in n or n.endswith("e_score_correction_bias") for n in dead),
            "%d tensors, %d without gradient" % (len(tg), len(dead)))


def check_dsv3(c, fam, tmp):
    """DeepseekV3ForCausalLM (fam: deepseek_v3 or the kimi_k2 layout)."""
    from .model import rope_inv_freq, softmax_scale_factor
    cfg = families.config_json(fam)
    s = families.spec(cfg)
    t = families.random_tensors(cfg, seed=3)
    ids = _ids(cfg)
    lp = _lp(cfg, t, ids)
    c.check(fam, "logprobs are not trivial", float(lp.std()) > 0.3 and float(lp.max()) < 0,
            "std %.3f" % float(lp.std()))
    c.check(fam, "q_lora_rank %s" % ("set: q_a/q_b" if s["qr"] else "null: q_proj"),
            ("model.layers.0.self_attn.q_a_proj.weight" in t) == bool(s["qr"]), "")

    # the router, recomputed by loops: groups by the sum of their top 2 biased scores, the best
    # topk_group kept, top-k of the kept, weights from the unbiased scores
    ref = HFRef(cfg, t)
    l = s["moe_layers"].index(True)
    m = "model.layers.%d.mlp." % l
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, s["d"], generator=g, dtype=torch.float64)
    _, topi, topv = ref.v3_route(x, m, {})
    W, b = ref.w[m + "gate.weight"], ref.w[m + "gate.e_score_correction_bias"]
    E, G, k, per = s["E"], s["n_group"], s["k"], s["E"] // s["n_group"]
    bad = 0
    for n in range(x.shape[0]):
        sc = [1 / (1 + math.exp(-float(x[n] @ W[e]))) for e in range(E)]
        ch = [sc[e] + float(b[e]) for e in range(E)]
        gsum = [sum(sorted(ch[j * per:(j + 1) * per], reverse=True)[:2]) if G > 1 else 0.0 for j in range(G)]
        kept = sorted(range(G), key=lambda j: -gsum[j])[:s["topk_group"]]
        cand = [e for e in range(E) if e // per in kept]
        best = sorted(cand, key=lambda e: -ch[e])[:k]
        wsum = sum(sc[e] for e in best)
        want = {e: sc[e] / wsum * s["rsf"] for e in best}
        got = {int(e): float(v) for e, v in zip(topi[n], topv[n])}
        bad += set(got) != set(want) or any(abs(got[e] - want[e]) > 1e-12 for e in want)
    c.check(fam, "router == a loop over groups (%d groups, %d kept)" % (G, s["topk_group"]), bad == 0,
            "%d of %d tokens differ" % (bad, x.shape[0]))
    if G > 1:
        # -inf, not 0: with a negative bias a masked group's 0 would outrank kept experts
        t2 = dict(t)
        t2[m + "gate.e_score_correction_bias"] = t[m + "gate.e_score_correction_bias"] - 5.0
        _, ti2, _ = HFRef(cfg, t2).v3_route(x, m, {})
        _, ti0, _ = ref.v3_route(x, m, {})
        c.check(fam, "masked groups are -inf (a uniform bias shift keeps the choice)", torch.equal(ti2, ti0), "")

    # each feature matters
    def diff(cc=None, tt=None):
        return _maxdiff(_lp(cc or cfg, tt or t, ids), lp)
    c.check(fam, "e_score_correction_bias matters",
            diff(tt={n: (v * 0 if n.endswith("correction_bias") else v) for n, v in t.items()}) > 1e-3, "")
    c.check(fam, "shared experts matter",
            diff(tt={n: (v * 0 if "shared_experts.down" in n else v) for n, v in t.items()}) > 1e-3, "")
    cc = copy.deepcopy(cfg)
    cc["rope_interleave"] = False
    c.check(fam, "rope_interleave matters", diff(cc) > 1e-3, "")
    cc = copy.deepcopy(cfg)
    cc["rope_scaling"].pop("mscale_all_dim")
    c.check(fam, "the mscale softmax factor matters (%.4f)" % softmax_scale_factor(cfg["rope_scaling"]),
            diff(cc) > 1e-3, "")
    cc = copy.deepcopy(cfg)
    cc["rope_scaling"] = None
    c.check(fam, "YaRN matters", diff(cc) > 1e-3, "")
    cc = copy.deepcopy(cfg)
    cc["routed_scaling_factor"] = 1.0
    c.check(fam, "routed_scaling_factor matters", diff(cc) > 1e-3, "")
    c.check(fam, "layer 0 dense (first_k_dense_replace)",
            "model.layers.0.mlp.gate_proj.weight" in t and "model.layers.1.mlp.gate.weight" in t, "")

    # YaRN's inv_freq against the paper's formula in float64 (HF's is float32)
    sc = cfg["rope_scaling"]
    hd, th, fac = s["rope"], s["theta"], float(sc["factor"])
    inv32, att = rope_inv_freq(hd, th, sc, s["max_pos"])
    orig = sc["original_max_position_embeddings"]
    cd = lambda r: hd * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(th))
    lo, hi = max(math.floor(cd(sc["beta_fast"] or 32)), 0), min(math.ceil(cd(sc["beta_slow"] or 1)), hd - 1)
    if lo == hi:
        hi += 0.001
    worst = 0.0
    for i in range(hd // 2):
        base = th ** (-2 * i / hd)
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        want = base / fac * ramp + base * (1 - ramp)
        worst = max(worst, abs(float(inv32[i]) - want) / want)
    c.check(fam, "yarn inv_freq == the formula in float64", worst < 3e-7, "worst rel %.2e, attention factor %.4f"
            % (worst, att))

    if fam == "kimi_k2":   # the same code as deepseek_v3's below: its checks there
        return
    _grads_vs_fd(c, fam, cfg, t, ids)

    # FP8: quantized per block, decoded and rescaled, within e4m3's precision (2^-4 relative to
    # each block's max) and not equal
    tq = families.quantize_fp8({n: v.to(torch.bfloat16) for n, v in t.items()}, families.FP8_TINY_BLOCK)
    d = os.path.join(tmp, fam + "_fp8")
    st.save_sharded(tq, d, 2, metadata={"format": "pt"})
    cq = families.config_json(fam, "fp8")
    cq["quantization_config"] = families.fp8_config(families.FP8_TINY_BLOCK)
    back = families.dequantize_fp8(cq, st.load_dir(d))
    worst, n8 = 0.0, 0
    b0, b1 = families.FP8_TINY_BLOCK
    for n, v in t.items():
        if not families.fp8_quantized(n, v):
            continue
        n8 += 1
        ref_w = v.to(torch.bfloat16).to(torch.float32)
        for i in range(0, v.shape[0], b0):
            for j in range(0, v.shape[1], b1):
                blk, got = ref_w[i:i + b0, j:j + b1], back[n][i:i + b0, j:j + b1]
                worst = max(worst, float((got - blk).abs().max()) / float(blk.abs().max()))
    c.check(fam, "fp8 round trip within e4m3 precision (%d weights)" % n8, 0 < worst <= 2 ** -4, "worst %.3g" % worst)
    lq = _lp(cq, back, ids)
    dq, mq = _maxdiff(lq, lp), float((lq - lp).abs().mean())
    # e4m3 keeps 3 mantissa bits: on a tiny random model that moves logprobs by ~0.1
    c.check(fam, "fp8 logprobs near f32, not equal", 1e-5 < dq and mq < 0.3, "max |dlogp| %.2e, mean %.2e" % (dq, mq))


def check_tandem(c):
    """Mixtral is SPEC section 2's model: compare with tandem_ref.py."""
    from tandem_ref import TandemRef
    cfg = families.config_json("mixtral")
    s = families.spec(cfg)
    t = families.random_tensors(cfg, seed=3)
    w = {"model/embed_tokens": t["model.embed_tokens.weight"], "model/norm": t["model.norm.weight"],
         "lm_head": t["lm_head.weight"]}
    for l in range(s["L"]):
        p, q = "model.layers.%d." % l, "model/layers/%d/" % l
        for a in ("input_layernorm", "post_attention_layernorm"):
            w[q + a] = t[p + a + ".weight"]
        for a in "qkvo":
            w[q + "self_attn/%s_proj" % a] = t[p + "self_attn.%s_proj.weight" % a]
        w[q + "mlp/gate"] = t[p + "block_sparse_moe.gate.weight"]
        for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            w[q + "mlp/experts/" + ours] = torch.stack(
                [t[p + "block_sparse_moe.experts.%d.%s.weight" % (e, theirs)] for e in range(s["E"])])
    w = {n: v.to(torch.float64) for n, v in w.items()}
    tcfg = dict(vocab_size=s["V"], hidden_size=s["d"], num_hidden_layers=s["L"], num_attention_heads=s["H"],
                num_key_value_heads=s["Hkv"], moe_intermediate_size=s["I"], num_local_experts=s["E"],
                num_experts_per_tok=s["k"], rope_theta=s["theta"], rms_norm_eps=s["eps"], norm_topk_prob=True,
                max_position_embeddings=cfg["max_position_embeddings"])
    ids = _ids(cfg)
    with torch.no_grad():
        logits = TandemRef(tcfg, w).forward(ids[:, :-1])[0]
        theirs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    d = _maxdiff(theirs, _lp(cfg, t, ids))
    c.check("mixtral", "== tests/ref/tandem_ref.py (SPEC 2)", d < 1e-12, "max |dlogp| %.2e" % d)


def run(fams):
    torch.set_num_threads(1)
    c = Checker()
    with tempfile.TemporaryDirectory(prefix="hf_selfcheck_") as tmp:
        for fam in fams:
            if fam in ("deepseek_v3", "kimi_k2"):
                check_dsv3(c, fam, tmp)
            else:
                check_family(c, fam, tmp)
    if "mixtral" in fams:
        check_tandem(c)
    if c.failed:
        print("hf_ref selfcheck: %d FAILED" % len(c.failed))
        return 1
    print("hf_ref selfcheck: all passed")
    return 0

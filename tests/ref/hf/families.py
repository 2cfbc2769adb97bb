"""tests/ref/hf/families.py - the four Hugging Face MoE families as transformers
lays them out on disk: tiny config.json files with the keys the published
configs have, the exact tensor names and shapes of each layout, random
weights, and the v4 <-> v5 expert layouts.

Published configs the key lists follow (transformers writes config.json with
sort_keys=True, indent=2):
  MixtralForCausalLM    mistralai/Mixtral-8x7B-v0.1
  Qwen2MoeForCausalLM   Qwen/Qwen1.5-MoE-A2.7B
  Qwen3MoeForCausalLM   Qwen/Qwen3-30B-A3B
  OlmoeForCausalLM      allenai/OLMoE-1B-7B-0924

Layouts (checked against transformers' modeling files and
conversion_mapping.py):
  v4  per-expert tensors, as every released checkpoint stores them:
        Mixtral  model.layers.L.block_sparse_moe.gate.weight            [E, d]
                 model.layers.L.block_sparse_moe.experts.e.w1.weight    [I, d]  gate
                 model.layers.L.block_sparse_moe.experts.e.w3.weight    [I, d]  up
                 model.layers.L.block_sparse_moe.experts.e.w2.weight    [d, I]  down
        others   model.layers.L.mlp.gate.weight                         [E, d]
                 model.layers.L.mlp.experts.e.{gate,up,down}_proj.weight
  v5  transformers 5 model state (save_pretrained(save_original_format=False)):
        model.layers.L.mlp.gate.weight                                   [E, d]
        model.layers.L.mlp.experts.gate_up_proj    [E, 2I, d]  rows [0, I) gate, [I, 2I) up
        model.layers.L.mlp.experts.down_proj       [E, d, I]
      (no ".weight" suffix on the fused expert tensors; Mixtral's
      block_sparse_moe becomes mlp).  The config is written the v5 way too:
      rope_parameters instead of rope_theta, "dtype" instead of "torch_dtype".
"""
import copy
import math

import numpy as np
import torch

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
ARCH = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}
FAMILY_OF_ARCH = {v: k for k, v in ARCH.items()}

# Tiny configs, v4 key sets.  Each exercises its family's features: Mixtral
# GQA; Qwen2-MoE q/k/v bias, the gated shared expert, a dense layer through
# mlp_only_layers; Qwen3-MoE head_dim != hidden/heads, per-head q/k norm and
# a dense/MoE schedule through decoder_sparse_step; OLMoE full-width q/k norm
# and clip_qkv.
TINY = {
    "mixtral": {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 96, "max_position_embeddings": 512, "model_type": "mixtral",
        "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
        "router_jitter_noise": 0.0, "sliding_window": None, "tie_word_embeddings": False,
        "use_cache": True, "vocab_size": 320,
    },
    "qwen2_moe": {
        "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 350,
        "decoder_sparse_step": 1, "eos_token_id": 350, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 80, "max_position_embeddings": 512,
        "max_window_layers": 3, "mlp_only_layers": [1], "model_type": "qwen2_moe",
        "moe_intermediate_size": 32, "norm_topk_prob": False, "num_attention_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3,
        "num_key_value_heads": 2, "output_router_logits": False, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 48, "sliding_window": 512, "tie_word_embeddings": False,
        "use_cache": True, "use_sliding_window": False, "vocab_size": 352,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 285, "decoder_sparse_step": 2, "eos_token_id": 287, "head_dim": 24,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 80, "max_position_embeddings": 512, "max_window_layers": 4,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 32,
        "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": 16,
        "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
        "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
        "vocab_size": 288,
    },
    "olmoe": {
        "architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "clip_qkv": 1.5, "eos_token_id": 279, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 32, "max_position_embeddings": 512,
        "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 3, "num_hidden_layers": 2,
        "num_key_value_heads": 4, "output_router_logits": False, "pad_token_id": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
        "router_aux_loss_coef": 0.01, "tie_word_embeddings": False, "use_cache": True,
        "vocab_size": 304,
    },
}

# DeepseekV3ForCausalLM (transformers models/deepseek_v3; the published
# deepseek-ai/DeepSeek-V3 config.json keys, scaled down): MLA with a q LoRA,
# sigmoid group-limited routing over 4 groups with the correction bias, one
# dense layer first, an ungated shared expert, YaRN with mscale (the softmax
# scale factor), interleaved RoPE.  kimi_k2: the Kimi-K2-Instruct layout
# (model_type kimi_k2, 384 experts top-8 in one group, as released) with q_lora_rank null (a
# plain q_proj; the released Kimi-K2 has a q LoRA: this covers the other
# branch of the same code).
_DSV3_COMMON = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "ep_size": 1, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 80, "kv_lora_rank": 32, "max_position_embeddings": 512,
    "moe_intermediate_size": 24, "moe_layer_freq": 1, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 4, "num_nextn_predict_layers": 1,
    "pretraining_tp": 1, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
    "scoring_func": "sigmoid", "seq_aux": True, "tie_word_embeddings": False, "topk_method": "noaux_tc",
    "use_cache": True, "v_head_dim": 12,
}
TINY["deepseek_v3"] = dict(_DSV3_COMMON, **{
    "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 1, "model_type": "deepseek_v3",
    "n_group": 4, "n_routed_experts": 16, "num_experts_per_tok": 4, "q_lora_rank": 48, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 128, "type": "yarn"},
    "routed_scaling_factor": 2.5, "topk_group": 2, "vocab_size": 300,
})
TINY["kimi_k2"] = dict(_DSV3_COMMON, **{
    "bos_token_id": 2, "eos_token_id": 3, "first_k_dense_replace": 1, "model_type": "kimi_k2",
    "n_group": 1, "n_routed_experts": 384, "num_experts_per_tok": 8, "q_lora_rank": None, "rope_theta": 50000.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 8.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 64, "type": "yarn"},
    "routed_scaling_factor": 2.827, "topk_group": 1, "vocab_size": 296, "num_nextn_predict_layers": 0,
})
MAKE_FAMILIES = FAMILIES + ("deepseek_v3", "kimi_k2")
ARCH_ALL = dict(ARCH, deepseek_v3="DeepseekV3ForCausalLM", kimi_k2="DeepseekV3ForCausalLM")

V4_VERSION, V5_VERSION = "4.51.3", "5.0.0"


def config_json(family, dtype="f32", layout="v4", over=None):
    """The config dict transformers would write for the tiny model."""
    c = copy.deepcopy(TINY[family])
    if over:
        c.update(over)
    torch_dtype = "bfloat16" if dtype in ("bf16", "fp8") else "float32"
    if layout == "v5" and family in ("deepseek_v3", "kimi_k2"):
        raise ValueError("%s: only the v4 layout (per-expert tensors) is written" % family)
    if layout == "v4":
        c["torch_dtype"] = torch_dtype
        c["transformers_version"] = V4_VERSION
        return c
    # transformers 5 writes rope parameters as one dict, "dtype", and the
    # attributes its v5 config classes added
    theta = c.pop("rope_theta")
    sc = c.pop("rope_scaling", None)
    c["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    if sc:
        c["rope_parameters"].update({k: v for k, v in sc.items() if k != "type"})
        c["rope_parameters"]["rope_type"] = sc.get("rope_type", sc.get("type"))
    c["dtype"] = torch_dtype
    c["transformers_version"] = V5_VERSION
    if family == "qwen2_moe":
        c["qkv_bias"] = True
        c["layer_types"] = ["full_attention"] * c["num_hidden_layers"]
    return c


# ---------------------------------------------------------------- config reading

ROPE_TYPES = ("default", "linear", "yarn")


def rope_theta(cfg):
    """(theta, rope_scaling or None) of a v4 or v5 config."""
    if "rope_parameters" in cfg and cfg["rope_parameters"] is not None:
        rp = dict(cfg["rope_parameters"])
        typ = rp.get("rope_type", "default")
        if typ not in ROPE_TYPES:
            raise ValueError("rope_parameters.rope_type %r is not supported" % typ)
        theta = float(rp.pop("rope_theta"))
        return theta, (rp if typ != "default" else None)
    sc = cfg.get("rope_scaling")
    if sc is not None:
        typ = sc.get("rope_type", sc.get("type"))
        if typ not in ROPE_TYPES:
            raise ValueError("rope_scaling %r is not supported" % (sc,))
        if typ == "default":
            sc = None
    default = 1000000.0 if cfg["model_type"] == "mixtral" else 10000.0
    return float(cfg.get("rope_theta", default)), sc


def spec(cfg):
    """What the architecture computes, read from its config as its modeling
    file does.  A key that changes the math and is not implemented raises."""
    fam = FAMILY_OF_ARCH.get((cfg.get("architectures") or [None])[0])
    if (cfg.get("architectures") or [None])[0] == "DeepseekV3ForCausalLM" and \
            cfg.get("model_type") in ("deepseek_v3", "kimi_k2"):
        return spec_dsv3(cfg)
    if fam is None or cfg.get("model_type") != fam:
        raise ValueError("architecture %r / model_type %r is not one of %s" %
                         (cfg.get("architectures"), cfg.get("model_type"), sorted(ARCH.values())))
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError("hidden_act %r is not supported" % cfg["hidden_act"])
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    s = dict(family=fam, d=d, H=H, Hkv=Hkv, V=cfg["vocab_size"], L=cfg["num_hidden_layers"],
             eps=cfg["rms_norm_eps"], theta=rope_theta(cfg)[0], rope_scaling=rope_theta(cfg)[1],
             max_pos=cfg.get("max_position_embeddings"), k=cfg["num_experts_per_tok"],
             tie=bool(cfg.get("tie_word_embeddings", False)),
             aux_coef=float(cfg.get("router_aux_loss_coef", 0.0)))
    s["hd"] = cfg.get("head_dim") or d // H
    s["qkv_bias"] = fam == "qwen2_moe" and cfg.get("qkv_bias", True)
    s["attn_bias"] = fam in ("qwen3_moe", "olmoe") and bool(cfg.get("attention_bias", False))
    s["qk_norm"] = {"qwen3_moe": "head", "olmoe": "full"}.get(fam)
    s["clip_qkv"] = cfg.get("clip_qkv") if fam == "olmoe" else None
    if fam == "mixtral":
        s.update(E=cfg["num_local_experts"], I=cfg["intermediate_size"], norm_topk=True, shared=0)
        # MixtralModel: the sliding-window mask on every layer when set
        s["windows"] = [cfg.get("sliding_window")] * s["L"]
    elif fam == "olmoe":
        s.update(E=cfg["num_experts"], I=cfg["intermediate_size"], norm_topk=bool(cfg["norm_topk_prob"]),
                 shared=0)
        if s["hd"] != d // H:
            raise ValueError("OLMoE with head_dim != hidden_size / num_attention_heads is not supported")
    else:
        s.update(E=cfg["num_experts"], I=cfg["moe_intermediate_size"], norm_topk=bool(cfg["norm_topk_prob"]),
                 Fd=cfg["intermediate_size"],
                 shared=cfg.get("shared_expert_intermediate_size", 0) if fam == "qwen2_moe" else 0)
        if fam == "qwen2_moe":
            # Qwen2MoeConfig: sliding_window only with use_sliding_window; layer_types
            # (absent: sliding from max_window_layers on) says which layers slide
            w = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
            types = cfg.get("layer_types") or ["sliding_attention" if w is not None and l >= cfg.get("max_window_layers", 28)
                                                else "full_attention" for l in range(s["L"])]
            s["windows"] = [w if t == "sliding_attention" else None for t in types]
        elif cfg.get("use_sliding_window"):
            raise ValueError("use_sliding_window is not supported")
    # which layers are MoE: Qwen's decoder layer is sparse unless listed in
    # mlp_only_layers, and then only every decoder_sparse_step-th one
    if fam in ("qwen2_moe", "qwen3_moe"):
        only, step = cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step", 1)
        s["moe_layers"] = [l not in only and s["E"] > 0 and (l + 1) % step == 0 for l in range(s["L"])]
    else:
        s["moe_layers"] = [True] * s["L"]
    if s["k"] > s["E"]:
        raise ValueError("num_experts_per_tok %d > %d experts" % (s["k"], s["E"]))
    return s


def spec_dsv3(cfg):
    """DeepseekV3Config as the modeling file reads it."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError("hidden_act %r is not supported" % cfg["hidden_act"])
    if cfg.get("attention_bias"):
        raise ValueError("attention_bias is not supported")
    theta, sc = rope_theta(cfg)
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    E, L = cfg["n_routed_experts"], cfg["num_hidden_layers"]
    s = dict(family="deepseek_v3", d=d, H=H, Hkv=H, V=cfg["vocab_size"], L=L, eps=cfg["rms_norm_eps"],
             theta=theta, rope_scaling=sc, max_pos=cfg["max_position_embeddings"], k=cfg["num_experts_per_tok"],
             tie=bool(cfg.get("tie_word_embeddings", False)), aux_coef=0.0, mla=True,
             qr=cfg.get("q_lora_rank") or 0, r=cfg["kv_lora_rank"], nope=cfg["qk_nope_head_dim"],
             rope=cfg["qk_rope_head_dim"], vd=cfg["v_head_dim"], interleave=bool(cfg.get("rope_interleave", True)),
             E=E, I=cfg["moe_intermediate_size"], Fd=cfg["intermediate_size"], norm_topk=bool(cfg["norm_topk_prob"]),
             n_group=cfg["n_group"], topk_group=cfg["topk_group"], rsf=float(cfg["routed_scaling_factor"]),
             shared=cfg["moe_intermediate_size"] * (cfg.get("n_shared_experts") or 0), qkv_bias=False,
             attn_bias=False, qk_norm=None, clip_qkv=None)
    s["hd"] = s["rope"]
    if cfg.get("topk_method", "noaux_tc") != "noaux_tc" or cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError("topk_method %r / scoring_func %r: the reference computes noaux_tc / sigmoid" %
                         (cfg.get("topk_method"), cfg.get("scoring_func")))
    if E % s["n_group"] or E // s["n_group"] < 2 and s["n_group"] > 1:
        raise ValueError("n_routed_experts %d in %d groups" % (E, s["n_group"]))
    fk, freq = cfg.get("first_k_dense_replace", 0), cfg.get("moe_layer_freq", 1)
    s["moe_layers"] = [l >= fk and l % freq == 0 for l in range(L)]
    if s["k"] > E:
        raise ValueError("num_experts_per_tok %d > %d experts" % (s["k"], E))
    return s


def param_shapes_dsv3(s):
    d, H, E, I = s["d"], s["H"], s["E"], s["I"]
    qk = s["nope"] + s["rope"]
    out = [("model.embed_tokens.weight", (s["V"], d))]
    for l in range(s["L"]):
        p = "model.layers.%d." % l
        a = p + "self_attn."
        if s["qr"]:
            out += [(a + "q_a_proj.weight", (s["qr"], d)), (a + "q_a_layernorm.weight", (s["qr"],)),
                    (a + "q_b_proj.weight", (H * qk, s["qr"]))]
        else:
            out.append((a + "q_proj.weight", (H * qk, d)))
        out += [(a + "kv_a_proj_with_mqa.weight", (s["r"] + s["rope"], d)), (a + "kv_a_layernorm.weight", (s["r"],)),
                (a + "kv_b_proj.weight", (H * (s["nope"] + s["vd"]), s["r"])), (a + "o_proj.weight", (d, H * s["vd"]))]
        m = p + "mlp."
        if s["moe_layers"][l]:
            out += [(m + "gate.weight", (E, d)), (m + "gate.e_score_correction_bias", (E,))]
            for e in range(E):
                out += [(m + "experts.%d.gate_proj.weight" % e, (I, d)), (m + "experts.%d.up_proj.weight" % e, (I, d)),
                        (m + "experts.%d.down_proj.weight" % e, (d, I))]
            if s["shared"]:
                S = s["shared"]
                out += [(m + "shared_experts.gate_proj.weight", (S, d)), (m + "shared_experts.up_proj.weight", (S, d)),
                        (m + "shared_experts.down_proj.weight", (d, S))]
        else:
            Fd = s["Fd"]
            out += [(m + "gate_proj.weight", (Fd, d)), (m + "up_proj.weight", (Fd, d)), (m + "down_proj.weight", (d, Fd))]
        out += [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]
    out.append(("model.norm.weight", (d,)))
    if not s["tie"]:
        out.append(("lm_head.weight", (s["V"], d)))
    return out


# ---------------------------------------------------------------- tensor names

def moe_prefix(s, layout):
    return "block_sparse_moe" if s["family"] == "mixtral" and layout == "v4" else "mlp"


def expert_names(s):
    """(gate, up, down) names of one v4 expert."""
    return ("w1", "w3", "w2") if s["family"] == "mixtral" else ("gate_proj", "up_proj", "down_proj")


def param_shapes(cfg, layout="v4"):
    """[(HF name, shape)] in state-dict (module registration) order."""
    s = spec(cfg)
    if s["family"] == "deepseek_v3":
        if layout != "v4":
            return []
        return param_shapes_dsv3(s)
    d, hd, H, Hkv, E, I = s["d"], s["hd"], s["H"], s["Hkv"], s["E"], s["I"]
    out = [("model.embed_tokens.weight", (s["V"], d))]
    for l in range(s["L"]):
        p = "model.layers.%d." % l
        for proj, rows in (("q", H * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
            out.append((p + "self_attn.%s_proj.weight" % proj, (rows, d)))
            if s["qkv_bias"] or s["attn_bias"]:
                out.append((p + "self_attn.%s_proj.bias" % proj, (rows,)))
        out.append((p + "self_attn.o_proj.weight", (d, H * hd)))
        if s["attn_bias"]:
            out.append((p + "self_attn.o_proj.bias", (d,)))
        if s["qk_norm"] == "head":
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        elif s["qk_norm"] == "full":
            out += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", ((d // H) * Hkv,))]
        if s["moe_layers"][l]:
            m = p + moe_prefix(s, layout) + "."
            out.append((m + "gate.weight", (E, d)))
            if layout == "v4":
                g, u, dn = expert_names(s)
                for e in range(E):
                    out += [(m + "experts.%d.%s.weight" % (e, g), (I, d)),
                            (m + "experts.%d.%s.weight" % (e, u), (I, d)),
                            (m + "experts.%d.%s.weight" % (e, dn), (d, I))]
            else:
                out += [(m + "experts.gate_up_proj", (E, 2 * I, d)), (m + "experts.down_proj", (E, d, I))]
            if s["family"] == "qwen2_moe":
                S = s["shared"]
                out += [(m + "shared_expert.gate_proj.weight", (S, d)), (m + "shared_expert.up_proj.weight", (S, d)),
                        (m + "shared_expert.down_proj.weight", (d, S)), (m + "shared_expert_gate.weight", (1, d))]
        else:
            Fd = s["Fd"]
            out += [(p + "mlp.gate_proj.weight", (Fd, d)), (p + "mlp.up_proj.weight", (Fd, d)),
                    (p + "mlp.down_proj.weight", (d, Fd))]
        out += [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,))]
    out.append(("model.norm.weight", (d,)))
    if not s["tie"]:
        out.append(("lm_head.weight", (s["V"], d)))
    return out


def detect_layout(cfg, names):
    """'v4' or 'v5', whichever layout's names the set of names is exactly;
    anything else raises naming the first missing and unexpected names."""
    names = set(names)
    for layout in ("v4", "v5"):
        if names == {n for n, _ in param_shapes(cfg, layout)}:
            return layout
    want = {n for n, _ in param_shapes(cfg, "v4")}
    want5 = {n for n, _ in param_shapes(cfg, "v5")}
    close = want5 if len(names & want5) > len(names & want) else want
    raise ValueError("tensors match neither the v4 nor the v5 layout: missing %s, unexpected %s" %
                     (sorted(close - names)[:3], sorted(names - close)[:3]))


# ---------------------------------------------------------------- random weights

def _init_std(name, shape, d):
    """Scales that keep every activation near unit size, routing decisive
    (router logits of std about 2) and biases large enough to matter."""
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return None                                   # 1 + 0.1 N(0, 1)
    if name.endswith(".bias"):
        return 0.5
    if name == "model.embed_tokens.weight":
        return 1.0
    if name.endswith(".gate.weight"):                 # the router
        return 2.0 / math.sqrt(d)
    if name.endswith("e_score_correction_bias"):     # moves the choice: about the scores' spread
        return 0.15
    return 1.0 / math.sqrt(shape[-1])                 # a Linear [out, in]


def random_tensors(cfg, seed):
    """v4 tensors (name -> float32 tensor, state-dict order) from a seed."""
    g = torch.Generator().manual_seed(seed)
    d = spec(cfg)["d"]
    out = {}
    for name, shape in param_shapes(cfg, "v4"):
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        std = _init_std(name, shape, d)
        out[name] = (1.0 + 0.1 * x if std is None else std * x).to(torch.float32)
    return out


# ---------------------------------------------------------------- FP8 (DeepSeek-V3's release format)

FP8_MAX = 448.0
FP8_TINY_BLOCK = (32, 16)   # rows, columns: several blocks per tiny weight, partial ones at the edges


def fp8_config(block):
    """quantization_config of DeepSeek-V3's config.json, with its block."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block)}


def fp8_quantized(name, t):
    """Whether the release quantizes this tensor: every Linear of attention
    and MLPs/experts (names ending _proj.weight); not the embedding, the
    head, norms, the router or its bias."""
    return t.dim() == 2 and name.endswith("_proj.weight")


def quantize_fp8(tensors, block):
    """name -> tensor with each quantized Linear as ("F8_E4M3", shape, raw
    codes) plus <name>_scale_inv float32 [ceil(rows/b0), ceil(cols/b1)]:
    per block s = amax / 448, q = e4m3(w / s) (as DeepSeek's fp8 cast)."""
    from . import st
    out = {}
    b0, b1 = block
    for n, t in tensors.items():
        if not fp8_quantized(n, t):
            out[n] = t
            continue
        w = t.to(torch.float32)
        R, C = w.shape
        nr, nc = -(-R // b0), -(-C // b1)
        s = torch.zeros(nr, nc, dtype=torch.float32)
        codes = np.zeros((R, C), dtype=np.uint8)
        for i in range(nr):
            for j in range(nc):
                blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
                amax = float(blk.abs().max())
                sc = np.float32(max(amax, 1e-12) / FP8_MAX)
                s[i, j] = float(sc)
                codes[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = st.f8e4m3_encode(blk.numpy().astype(np.float64) / float(sc))
        out[n] = ("F8_E4M3", [R, C], codes.tobytes())
        out[n + "_scale_inv"] = s
    return out


def dequantize_fp8(cfg, tensors):
    """The loaded tensors (F8 decoded to float32 by st.load_*) with every
    <name>_scale_inv applied: w = q * s[r // b0, c // b1], one float32
    product (DeepSeek's weight_dequant: x.float() * s), scales dropped."""
    qc = cfg.get("quantization_config")
    scales = [n for n in tensors if n.endswith("_scale_inv")]
    if not scales:
        return tensors
    if not qc or qc.get("quant_method") != "fp8":
        raise ValueError("block scales without an fp8 quantization_config: %s" % scales[0])
    b0, b1 = qc.get("weight_block_size", [128, 128])
    out = {n: t for n, t in tensors.items() if not n.endswith("_scale_inv")}
    for sn in scales:
        n = sn[:-len("_scale_inv")]
        q, s = out[n].to(torch.float32), tensors[sn].to(torch.float32)
        R, C = q.shape
        if tuple(s.shape) != (-(-R // b0), -(-C // b1)):
            raise ValueError("%s: shape %s for %s %s" % (sn, tuple(s.shape), n, (R, C)))
        full = s.repeat_interleave(b0, 0)[:R].repeat_interleave(b1, 1)[:, :C]
        out[n] = q * full
    return out


def to_v5(cfg, t4):
    """v4 tensors -> v5 tensors (the same numbers): experts stacked, gate and
    up concatenated along dim 1 (gate first), Mixtral's block_sparse_moe
    renamed mlp; as transformers' conversion_mapping.py does on load."""
    s = spec(cfg)
    g, u, dn = expert_names(s)
    out = {}
    for name, shape in param_shapes(cfg, "v5"):
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            l = int(name.split(".")[2])
            m = "model.layers.%d.%s.experts." % (l, moe_prefix(s, "v4"))
            if name.endswith("gate_up_proj"):
                out[name] = torch.stack([torch.cat([t4[m + "%d.%s.weight" % (e, g)], t4[m + "%d.%s.weight" % (e, u)]], 0)
                                         for e in range(s["E"])])
            else:
                out[name] = torch.stack([t4[m + "%d.%s.weight" % (e, dn)] for e in range(s["E"])])
        else:
            out[name] = t4[name.replace(".mlp.gate.weight", ".block_sparse_moe.gate.weight")
                           if s["family"] == "mixtral" and ".mlp.gate." in name else name]
        assert tuple(out[name].shape) == tuple(shape), name
    return out

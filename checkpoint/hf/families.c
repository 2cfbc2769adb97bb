/* checkpoint/hf/families.c - the five Hugging Face MoE families as tables
 * (families.h), and the pattern helpers.
 *
 * Key lists and defaults: the transformers config classes
 * (models/{mixtral,qwen2_moe,qwen3_moe,olmoe,deepseek_v3}/configuration_*.py, v4.5x
 * and v5), whose defaults apply when a key is absent; what each key does:
 * the modeling files.  Tensor names: the modeling files' module paths and
 * conversion_mapping.py (v5's fused experts).  The PyTorch reference of
 * the same families is tests/ref/hf/ (docs/import.md).
 */
#include "checkpoint/hf/families.h"

#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- config keys */

#define COPY(k, t, absent, null_is, write, doc) { k, HFK_COPY, t, absent, null_is, HFR_NONE, write, doc }
#define IGN(k, absent, write, doc) { k, HFK_IGNORE, NULL, absent, NULL, HFR_NONE, write, doc }
#define RULE(k, r, absent, write, doc) { k, HFK_RULE, NULL, absent, NULL, r, write, doc }
#define RULE_TO(k, t, r, absent, write, doc) { k, HFK_RULE, t, absent, NULL, r, write, doc }
#define END { NULL, HFK_IGNORE, NULL, NULL, NULL, HFR_NONE, 0, NULL }

/* Keys every family of this file has with the same meaning (their
 * defaults differ, so each table lists them with its own). */
#define DOC_ACT "only silu (SwiGLU experts) is computed"
#define DOC_ROPE_SCALING "null, default, linear or yarn (core/ops/rope.h, the tandem key rope_scaling); any other type is refused by name"
#define DOC_ROPE_PARAMS "v5: rope_theta is the RoPE base; rope_type default, linear or yarn with its keys (as rope_scaling)"
#define DOC_NOISE "training-only noise, off at inference; tandem trains without it (noted when nonzero)"
#define DOC_AUX "HF adds the load-balancing loss only when output_router_logits: tandem's coefficient is this value then, else 0 (tandem's per-layer aux, SPEC section 2)"
#define DOC_ORL "read by router_aux_loss_coef"
#define DOC_QUANT "quant_method fp8 (fmt e4m3, activation_scheme dynamic, weight_block_size): F8_E4M3 weights dequantized with their *_scale_inv blocks on read; any other quantization is refused"
#define DOC_EXPERTS "the expert count (either spelling; both must agree)"

static const HfKey g_mixtral_keys[] = {
    COPY("vocab_size", "vocab_size", "32000", NULL, HF_ANY, "V"),
    COPY("hidden_size", "hidden_size", "4096", NULL, HF_ANY, "d"),
    COPY("intermediate_size", "moe_intermediate_size,intermediate_size", "14336", NULL, HF_ANY,
         "each expert's width F (Mixtral has no dense layers)"),
    COPY("num_hidden_layers", "num_hidden_layers", "32", NULL, HF_ANY, "L"),
    COPY("num_attention_heads", "num_attention_heads", "32", NULL, HF_ANY, "H"),
    COPY("num_key_value_heads", "num_key_value_heads", "8", "0", HF_ANY, "Hkv (null: H)"),
    COPY("head_dim", "head_dim", "null", "0", HF_ANY, "hd (null: d / H)"),
    RULE("hidden_act", HFR_ACT, "\"silu\"", HF_ANY, DOC_ACT),
    COPY("max_position_embeddings", "max_position_embeddings", "131072", NULL, HF_ANY, "the context"),
    IGN("initializer_range", "0.02", HF_ANY, "initialisation only"),
    COPY("rms_norm_eps", "rms_norm_eps", "1e-05", NULL, HF_ANY, "RMSNorm epsilon"),
    IGN("use_cache", "true", HF_ANY, "KV caching (tandem always caches when serving)"),
    COPY("tie_word_embeddings", "tie_word_embeddings", "false", NULL, HF_ANY, "lm_head = embed_tokens"),
    COPY("rope_theta", "rope_theta", "1000000.0", NULL, HF_V4, "RoPE base (v4)"),
    RULE("rope_parameters", HFR_ROPE_PARAMS, "null", HF_V5, DOC_ROPE_PARAMS),
    RULE("rope_scaling", HFR_ROPE_SCALING, "null", 0, DOC_ROPE_SCALING),
    COPY("sliding_window", "sliding_window", "null", "null", HF_ANY,
         "the window W of every layer (null: none): a query at t sees keys t - W < s <= t"),
    RULE("attention_dropout", HFR_TRAIN_NOISE, "0.0", HF_ANY, DOC_NOISE),
    COPY("num_experts_per_tok", "num_experts_per_tok", "2", NULL, HF_ANY, "k"),
    COPY("num_local_experts", "num_local_experts", "8", NULL, HF_ANY, DOC_EXPERTS),
    COPY("num_experts", "num_local_experts", NULL, NULL, 0, DOC_EXPERTS),
    RULE("output_router_logits", HFR_AUX, "false", HF_ANY, DOC_ORL),
    RULE("router_aux_loss_coef", HFR_AUX_COEF, "0.001", HF_ANY, DOC_AUX),
    RULE("router_jitter_noise", HFR_TRAIN_NOISE, "0.0", HF_ANY, DOC_NOISE),
    IGN("norm_topk_prob", NULL, 0, "not read: Mixtral always renormalises its top-k"),
    RULE("quantization_config", HFR_QUANT, NULL, 0, DOC_QUANT),
    END,
};

static const HfKey g_qwen2_keys[] = {
    COPY("vocab_size", "vocab_size", "151936", NULL, HF_ANY, "V"),
    COPY("hidden_size", "hidden_size", "2048", NULL, HF_ANY, "d"),
    COPY("intermediate_size", "intermediate_size", "5632", NULL, HF_ANY, "dense layers' width Fd"),
    COPY("num_hidden_layers", "num_hidden_layers", "24", NULL, HF_ANY, "L"),
    COPY("num_attention_heads", "num_attention_heads", "16", NULL, HF_ANY, "H"),
    COPY("num_key_value_heads", "num_key_value_heads", "16", "0", HF_ANY, "Hkv (null: H)"),
    COPY("head_dim", "head_dim", "null", "0", HF_ANY, "hd (null or absent: d / H; the modeling code reads it when present, so it is written)"),
    RULE("hidden_act", HFR_ACT, "\"silu\"", HF_ANY, DOC_ACT),
    COPY("max_position_embeddings", "max_position_embeddings", "32768", NULL, HF_ANY, "the context"),
    IGN("initializer_range", "0.02", HF_ANY, "initialisation only"),
    COPY("rms_norm_eps", "rms_norm_eps", "1e-06", NULL, HF_ANY, "RMSNorm epsilon"),
    IGN("use_cache", "true", HF_ANY, "KV caching"),
    COPY("tie_word_embeddings", "tie_word_embeddings", "false", NULL, HF_ANY, "lm_head = embed_tokens"),
    COPY("rope_theta", "rope_theta", "10000.0", NULL, HF_V4, "RoPE base (v4)"),
    RULE("rope_scaling", HFR_ROPE_SCALING, "null", HF_V4, DOC_ROPE_SCALING),
    RULE("rope_parameters", HFR_ROPE_PARAMS, "null", HF_V5, DOC_ROPE_PARAMS),
    COPY("use_sliding_window", "use_sliding_window", "false", NULL, HF_ANY,
         "false: no layer slides (HF nulls sliding_window)"),
    COPY("sliding_window", "sliding_window", "4096", "null", HF_ANY, "the window W (null: none)"),
    COPY("max_window_layers", "max_window_layers", "28", NULL, HF_ANY,
         "without layer_types, layers l >= this slide (when use_sliding_window)"),
    RULE("attention_dropout", HFR_TRAIN_NOISE, "0.0", HF_ANY, DOC_NOISE),
    COPY("decoder_sparse_step", "decoder_sparse_step", "1", NULL, HF_ANY, "MoE every step-th layer"),
    COPY("moe_intermediate_size", "moe_intermediate_size", "1408", NULL, HF_ANY, "each expert's width F"),
    COPY("shared_expert_intermediate_size", "shared_expert_intermediate_size", "5632", NULL, HF_ANY,
         "the shared expert's width S"),
    COPY("num_experts_per_tok", "num_experts_per_tok", "4", NULL, HF_ANY, "k"),
    COPY("num_experts", "num_local_experts", "60", NULL, HF_ANY, DOC_EXPERTS),
    COPY("num_local_experts", "num_local_experts", NULL, NULL, 0, DOC_EXPERTS),
    COPY("norm_topk_prob", "norm_topk_prob", "false", NULL, HF_ANY, "renormalise the top-k weights"),
    RULE("output_router_logits", HFR_AUX, "false", HF_ANY, DOC_ORL),
    RULE("router_aux_loss_coef", HFR_AUX_COEF, "0.001", HF_ANY, DOC_AUX),
    COPY("mlp_only_layers", "mlp_only_layers", "null", "[]", HF_ANY, "layers that stay dense (null: none)"),
    COPY("qkv_bias", "qkv_bias", "true", NULL, HF_V5, "biases on q, k, v (v4 configs: always)"),
    COPY("layer_types", "layer_types", "null", "null", HF_V5,
         "v5: full_attention or sliding_attention per layer (sliding only when use_sliding_window)"),
    RULE("quantization_config", HFR_QUANT, NULL, 0, DOC_QUANT),
    END,
};

static const HfKey g_qwen3_keys[] = {
    COPY("vocab_size", "vocab_size", "151936", NULL, HF_ANY, "V"),
    COPY("hidden_size", "hidden_size", "2048", NULL, HF_ANY, "d"),
    COPY("intermediate_size", "intermediate_size", "6144", NULL, HF_ANY, "dense layers' width Fd"),
    COPY("num_hidden_layers", "num_hidden_layers", "24", NULL, HF_ANY, "L"),
    COPY("num_attention_heads", "num_attention_heads", "32", NULL, HF_ANY, "H"),
    COPY("num_key_value_heads", "num_key_value_heads", "4", "0", HF_ANY, "Hkv (null: H)"),
    COPY("head_dim", "head_dim", "null", "0", HF_ANY, "hd (null or absent: d / H)"),
    RULE("hidden_act", HFR_ACT, "\"silu\"", HF_ANY, DOC_ACT),
    COPY("max_position_embeddings", "max_position_embeddings", "32768", NULL, HF_ANY, "the context"),
    IGN("initializer_range", "0.02", HF_ANY, "initialisation only"),
    COPY("rms_norm_eps", "rms_norm_eps", "1e-06", NULL, HF_ANY, "RMSNorm epsilon (the q/k norms' too)"),
    IGN("use_cache", "true", HF_ANY, "KV caching"),
    COPY("tie_word_embeddings", "tie_word_embeddings", "false", NULL, HF_ANY, "lm_head = embed_tokens"),
    COPY("rope_theta", "rope_theta", "10000.0", NULL, HF_V4, "RoPE base (v4)"),
    RULE("rope_scaling", HFR_ROPE_SCALING, "null", HF_V4, DOC_ROPE_SCALING),
    RULE("rope_parameters", HFR_ROPE_PARAMS, "null", HF_V5, DOC_ROPE_PARAMS),
    COPY("attention_bias", "attention_bias", "false", NULL, HF_ANY, "biases on q, k, v and o"),
    RULE("use_sliding_window", HFR_USE_SLIDING, "false", HF_ANY,
         "true only with a sliding_window of at least max_position_embeddings (it never masks then)"),
    RULE("sliding_window", HFR_AUX, "4096", HF_ANY, "read by use_sliding_window"),
    IGN("max_window_layers", "28", HF_V4, "which layers slide: no effect without an active window"),
    RULE("attention_dropout", HFR_TRAIN_NOISE, "0.0", HF_ANY, DOC_NOISE),
    COPY("decoder_sparse_step", "decoder_sparse_step", "1", NULL, HF_ANY, "MoE every step-th layer"),
    COPY("moe_intermediate_size", "moe_intermediate_size", "768", NULL, HF_ANY, "each expert's width F"),
    COPY("num_experts_per_tok", "num_experts_per_tok", "8", NULL, HF_ANY, "k"),
    COPY("num_experts", "num_local_experts", "128", NULL, HF_ANY, DOC_EXPERTS),
    COPY("num_local_experts", "num_local_experts", NULL, NULL, 0, DOC_EXPERTS),
    COPY("norm_topk_prob", "norm_topk_prob", "false", NULL, HF_ANY, "renormalise the top-k weights"),
    RULE("output_router_logits", HFR_AUX, "false", HF_ANY, DOC_ORL),
    RULE("router_aux_loss_coef", HFR_AUX_COEF, "0.001", HF_ANY, DOC_AUX),
    COPY("mlp_only_layers", "mlp_only_layers", "null", "[]", HF_ANY, "layers that stay dense (null: none)"),
    RULE("quantization_config", HFR_QUANT, NULL, 0, DOC_QUANT),
    END,
};

static const HfKey g_olmoe_keys[] = {
    COPY("vocab_size", "vocab_size", "50304", NULL, HF_ANY, "V"),
    COPY("hidden_size", "hidden_size", "2048", NULL, HF_ANY, "d"),
    COPY("intermediate_size", "moe_intermediate_size,intermediate_size", "2048", NULL, HF_ANY,
         "each expert's width F (OLMoE has no dense layers)"),
    COPY("num_hidden_layers", "num_hidden_layers", "16", NULL, HF_ANY, "L"),
    COPY("num_attention_heads", "num_attention_heads", "16", NULL, HF_ANY, "H"),
    COPY("num_key_value_heads", "num_key_value_heads", "null", "0", HF_ANY, "Hkv (null: H)"),
    RULE("head_dim", HFR_HEAD_DIM_FIXED, NULL, 0, "OLMoE's head_dim is d / H; another value is refused"),
    RULE("hidden_act", HFR_ACT, "\"silu\"", HF_ANY, DOC_ACT),
    COPY("max_position_embeddings", "max_position_embeddings", "4096", NULL, HF_ANY, "the context"),
    IGN("initializer_range", "0.02", HF_ANY, "initialisation only"),
    COPY("rms_norm_eps", "rms_norm_eps", "1e-05", NULL, HF_ANY, "RMSNorm epsilon (the q/k norms' too)"),
    IGN("use_cache", "true", HF_ANY, "KV caching"),
    COPY("tie_word_embeddings", "tie_word_embeddings", "false", NULL, HF_ANY, "lm_head = embed_tokens"),
    COPY("rope_theta", "rope_theta", "10000.0", NULL, HF_V4, "RoPE base (v4)"),
    RULE("rope_scaling", HFR_ROPE_SCALING, "null", HF_V4, DOC_ROPE_SCALING),
    RULE("rope_parameters", HFR_ROPE_PARAMS, "null", HF_V5, DOC_ROPE_PARAMS),
    COPY("attention_bias", "attention_bias", "false", NULL, HF_ANY, "biases on q, k, v and o"),
    RULE("attention_dropout", HFR_TRAIN_NOISE, "0.0", HF_ANY, DOC_NOISE),
    COPY("clip_qkv", "clip_qkv", "null", "0", HF_ANY, "q, k, v clamped to [-c, c] after the q/k norm (null: off)"),
    COPY("num_experts_per_tok", "num_experts_per_tok", "8", NULL, HF_ANY, "k"),
    COPY("num_experts", "num_local_experts", "64", NULL, HF_ANY, DOC_EXPERTS),
    COPY("num_local_experts", "num_local_experts", NULL, NULL, 0, DOC_EXPERTS),
    RULE("output_router_logits", HFR_AUX, "false", HF_ANY, DOC_ORL),
    RULE("router_aux_loss_coef", HFR_AUX_COEF, "0.01", HF_ANY, DOC_AUX),
    COPY("norm_topk_prob", "norm_topk_prob", "false", NULL, HF_ANY, "renormalise the top-k weights"),
    RULE("quantization_config", HFR_QUANT, NULL, 0, DOC_QUANT),
    END,
};

/* DeepseekV3ForCausalLM (transformers models/deepseek_v3, DeepseekV3Config
 * defaults; published deepseek-ai/DeepSeek-V3 and moonshotai/Kimi-K2
 * config.json keys).  Kimi-K2 is the same architecture (model_type
 * "kimi_k2"). */
static const HfKey g_dsv3_keys[] = {
    COPY("vocab_size", "vocab_size", "129280", NULL, HF_V4, "V"),
    COPY("hidden_size", "hidden_size", "7168", NULL, HF_V4, "d"),
    COPY("intermediate_size", "intermediate_size", "18432", NULL, HF_V4, "the dense layers' width"),
    COPY("moe_intermediate_size", "moe_intermediate_size", "2048", NULL, HF_V4, "each expert's width F"),
    COPY("num_hidden_layers", "num_hidden_layers", "61", NULL, HF_V4, "L (the MTP layers after them are read past)"),
    COPY("num_attention_heads", "num_attention_heads", "128", NULL, HF_V4, "H"),
    COPY("num_key_value_heads", "num_key_value_heads", "128", "0", HF_V4, "Hkv (MLA: every head has its k, v)"),
    COPY("n_shared_experts", "n_shared_experts", "1", "0", HF_V4, "shared experts, ungated, n x F wide"),
    COPY("n_routed_experts", "num_local_experts", "256", NULL, HF_V4, "E"),
    COPY("routed_scaling_factor", "routed_scaling_factor", "2.5", NULL, HF_V4, "routed weights x this"),
    RULE_TO("kv_lora_rank", "kv_lora_rank", HFR_POSITIVE, "512", HF_V4,
            "MLA latent width r > 0 (the KV cache holds r + rope; the architecture is always MLA)"),
    COPY("q_lora_rank", "q_lora_rank", "1536", "0", HF_V4, "q_a_proj width (null: a plain q_proj)"),
    COPY("qk_rope_head_dim", "qk_rope_head_dim,head_dim", "64", NULL, HF_V4,
         "the RoPE part of q/k per head (also tandem's head_dim, as transformers sets it)"),
    COPY("v_head_dim", "v_head_dim", "128", NULL, HF_V4, "v per head"),
    COPY("qk_nope_head_dim", "qk_nope_head_dim", "128", NULL, HF_V4, "the no-RoPE part of q/k per head"),
    IGN("head_dim", NULL, 0, "transformers sets head_dim = qk_rope_head_dim"),
    COPY("n_group", "n_group", "8", NULL, HF_V4, "expert groups"),
    COPY("topk_group", "topk_group", "4", NULL, HF_V4, "groups kept per token"),
    COPY("num_experts_per_tok", "num_experts_per_tok", "8", NULL, HF_V4, "k"),
    COPY("first_k_dense_replace", "first_k_dense_replace", "3", NULL, HF_V4, "the first layers are dense"),
    COPY("moe_layer_freq", "moe_layer_freq", "1", NULL, HF_V4, "MoE layers: l % freq == 0 (from first_k_dense_replace on)"),
    COPY("norm_topk_prob", "norm_topk_prob", "true", NULL, HF_V4, "renormalise the top-k weights"),
    RULE_TO("topk_method", "topk_method", HFR_FIXED, "\"noaux_tc\"", HF_V4,
            "must be noaux_tc (group-limited choice with e_score_correction_bias: what transformers computes)"),
    RULE_TO("scoring_func", "scoring_func", HFR_FIXED, "\"sigmoid\"", HF_V4, "must be sigmoid (what transformers computes)"),
    RULE("hidden_act", HFR_ACT, "\"silu\"", HF_V4, DOC_ACT),
    COPY("max_position_embeddings", "max_position_embeddings", "4096", NULL, HF_V4, "the context"),
    IGN("initializer_range", "0.02", HF_V4, "initialisation only"),
    COPY("rms_norm_eps", "rms_norm_eps", "1e-06", NULL, HF_V4, "RMSNorm epsilon (the q_a/kv_a norms' too)"),
    IGN("use_cache", "true", HF_V4, "KV caching"),
    IGN("pretraining_tp", "1", HF_V4, "not read by the modeling code"),
    COPY("tie_word_embeddings", "tie_word_embeddings", "false", NULL, HF_V4, "lm_head = embed_tokens"),
    COPY("rope_theta", "rope_theta", "10000.0", NULL, HF_V4, "RoPE base"),
    RULE("rope_scaling", HFR_ROPE_SCALING, "null", HF_V4, DOC_ROPE_SCALING),
    COPY("rope_interleave", "rope_interleave", "true", NULL, HF_V4, "RoPE on pairs (2i, 2i+1) of the rope part"),
    RULE("attention_bias", HFR_FALSE_ONLY, "false", HF_V4, "must be false (MLA projections without biases)"),
    RULE("attention_dropout", HFR_TRAIN_NOISE, "0.0", HF_V4, DOC_NOISE),
    IGN("aux_loss_alpha", NULL, 0, "training only: DeepSeek's sequence-wise balance loss weight (tandem: router_seq_aux_loss_coef)"),
    IGN("seq_aux", NULL, 0, "training only: with aux_loss_alpha"),
    IGN("ep_size", NULL, 0, "parallel layout metadata"),
    IGN("num_nextn_predict_layers", NULL, 0, "MTP layers (model.layers.{num_hidden_layers}...): read past"),
    IGN("auto_map", NULL, 0, "remote-code class names"),
    RULE("quantization_config", HFR_QUANT, NULL, 0, DOC_QUANT),
    END,
};

#undef COPY
#undef IGN
#undef RULE
#undef RULE_TO
#undef END

const char *const hf_generic_keys[] = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder", "finetuning_task",
    "id2label", "label2id", "problem_type", "tokenizer_class", "prefix", "task_specific_params",
    "tf_legacy_loss", "_attn_implementation_autoset", "_commit_hash",
    /* generation defaults some old configs carry (generation_config.json's business) */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
    NULL,
};

/* ---------------------------------------------------------------- constants */

static const HfConst g_mixtral_consts[] = {
    { "norm_topk_prob", "true", false },        { "n_shared_experts", "0", false },
    { "shared_expert_intermediate_size", "0", false }, { "shared_expert_gate", "false", false },
    { "first_k_dense_replace", "0", false },    { "decoder_sparse_step", "1", false },
    { "mlp_only_layers", "[]", false },         { "attention_bias", "false", false },
    { "qkv_bias", "false", false },             { "qk_norm", "\"none\"", false },
    { "clip_qkv", "0", false },                 { "router_z_loss_coef", "0", true },
    { "use_sliding_window", "true", false },    { "max_window_layers", "0", false },
    { "layer_types", "null", false },
    { NULL, NULL, false },
};

static const HfConst g_qwen2_consts[] = {
    { "n_shared_experts", "0", false },   { "shared_expert_gate", "true", false },
    { "first_k_dense_replace", "0", false }, { "attention_bias", "false", false },
    { "qk_norm", "\"none\"", false },     { "clip_qkv", "0", false },
    { "router_z_loss_coef", "0", true },  { NULL, NULL, false },
};

static const HfConst g_qwen3_consts[] = {
    { "n_shared_experts", "0", false },   { "shared_expert_intermediate_size", "0", false },
    { "shared_expert_gate", "false", false }, { "first_k_dense_replace", "0", false },
    { "qkv_bias", "false", false },       { "qk_norm", "\"head\"", false },
    { "clip_qkv", "0", false },           { "router_z_loss_coef", "0", true },
    { "sliding_window", "null", false },
    { NULL, NULL, false },
};

static const HfConst g_olmoe_consts[] = {
    { "n_shared_experts", "0", false },   { "shared_expert_intermediate_size", "0", false },
    { "shared_expert_gate", "false", false }, { "first_k_dense_replace", "0", false },
    { "decoder_sparse_step", "1", false }, { "mlp_only_layers", "[]", false },
    { "qkv_bias", "false", false },       { "qk_norm", "\"full\"", false },
    { "router_z_loss_coef", "0", true },  { "sliding_window", "null", false },
    { NULL, NULL, false },
};

static const HfConst g_dsv3_consts[] = {
    { "shared_expert_intermediate_size", "0", false }, { "shared_expert_gate", "false", false },
    { "decoder_sparse_step", "1", false },  { "mlp_only_layers", "[]", false },
    { "attention_bias", "false", false },   { "qkv_bias", "false", false },
    { "qk_norm", "\"none\"", false },       { "clip_qkv", "0", false },
    { "router_aux_loss_coef", "0", true },  { "router_z_loss_coef", "0", true },
    { "sliding_window", "null", false },
    { NULL, NULL, false },
};

/* ---------------------------------------------------------------- tensors */

#define T(t, h) { t, h, HFT_COPY, 0, 0, 0, HF_ANY }
#define T_IN(t, h, lay) { t, h, HFT_COPY, 0, 0, 0, lay }
#define STACK(t, h) { t, h, HFT_STACK, 0, 0, 0, HF_V4 }
#define PART(t, h, p, n, dim) { t, h, HFT_PART, p, n, dim, HF_V5 }
#define T_END { NULL, NULL, HFT_COPY, 0, 0, 0, 0 }
#define LP "model/layers/{L}/"
#define HP "model.layers.{L}."

/* Llama-style attention, norms, dense SwiGLU, embedding and head: the same
 * names in every family (biases and q/k norms exist when the config says). */
static const HfTensor g_t_common[] = {
    T("model/embed_tokens", "model.embed_tokens.weight"),
    T(LP "input_layernorm", HP "input_layernorm.weight"),
    T(LP "self_attn/q_proj", HP "self_attn.q_proj.weight"),
    T(LP "self_attn/k_proj", HP "self_attn.k_proj.weight"),
    T(LP "self_attn/v_proj", HP "self_attn.v_proj.weight"),
    T(LP "self_attn/o_proj", HP "self_attn.o_proj.weight"),
    T(LP "self_attn/q_proj.bias", HP "self_attn.q_proj.bias"),
    T(LP "self_attn/k_proj.bias", HP "self_attn.k_proj.bias"),
    T(LP "self_attn/v_proj.bias", HP "self_attn.v_proj.bias"),
    T(LP "self_attn/o_proj.bias", HP "self_attn.o_proj.bias"),
    T(LP "self_attn/q_norm", HP "self_attn.q_norm.weight"),
    T(LP "self_attn/k_norm", HP "self_attn.k_norm.weight"),
    T(LP "post_attention_layernorm", HP "post_attention_layernorm.weight"),
    T(LP "mlp/gate_proj", HP "mlp.gate_proj.weight"),
    T(LP "mlp/up_proj", HP "mlp.up_proj.weight"),
    T(LP "mlp/down_proj", HP "mlp.down_proj.weight"),
    T("model/norm", "model.norm.weight"),
    T("lm_head", "lm_head.weight"),
    T_END,
};

/* transformers 5's experts: gate and up fused as [E, 2F, d] (gate rows
 * first, no ".weight"), down stacked as [E, d, F]. */
#define V5_EXPERTS                                                                      \
    PART(LP "mlp/experts/gate_proj", HP "mlp.experts.gate_up_proj", 0, 2, 1),           \
    PART(LP "mlp/experts/up_proj", HP "mlp.experts.gate_up_proj", 1, 2, 1),             \
    T_IN(LP "mlp/experts/down_proj", HP "mlp.experts.down_proj", HF_V5)

/* Mixtral v4: block_sparse_moe, experts' w1 (gate), w3 (up), w2 (down). */
static const HfTensor g_t_mixtral_moe[] = {
    T_IN(LP "mlp/gate", HP "block_sparse_moe.gate.weight", HF_V4),
    STACK(LP "mlp/experts/gate_proj", HP "block_sparse_moe.experts.{E}.w1.weight"),
    STACK(LP "mlp/experts/up_proj", HP "block_sparse_moe.experts.{E}.w3.weight"),
    STACK(LP "mlp/experts/down_proj", HP "block_sparse_moe.experts.{E}.w2.weight"),
    T_IN(LP "mlp/gate", HP "mlp.gate.weight", HF_V5),
    V5_EXPERTS,
    T_END,
};

/* Qwen2-MoE, Qwen3-MoE, OLMoE: mlp.gate, experts' gate/up/down_proj. */
static const HfTensor g_t_mlp_moe[] = {
    T(LP "mlp/gate", HP "mlp.gate.weight"),
    STACK(LP "mlp/experts/gate_proj", HP "mlp.experts.{E}.gate_proj.weight"),
    STACK(LP "mlp/experts/up_proj", HP "mlp.experts.{E}.up_proj.weight"),
    STACK(LP "mlp/experts/down_proj", HP "mlp.experts.{E}.down_proj.weight"),
    V5_EXPERTS,
    T_END,
};

/* Qwen2-MoE's shared expert and its sigmoid gate. */
static const HfTensor g_t_qwen2_shared[] = {
    T(LP "mlp/shared_experts/gate_proj", HP "mlp.shared_expert.gate_proj.weight"),
    T(LP "mlp/shared_experts/up_proj", HP "mlp.shared_expert.up_proj.weight"),
    T(LP "mlp/shared_experts/down_proj", HP "mlp.shared_expert.down_proj.weight"),
    T(LP "mlp/shared_expert_gate", HP "mlp.shared_expert_gate.weight"),
    T_END,
};

/* DeepSeek-V3's multi-head latent attention (DSV3.md; q_proj, o_proj are
 * the common rows). */
static const HfTensor g_t_mla[] = {
    T(LP "self_attn/q_a_proj", HP "self_attn.q_a_proj.weight"),
    T(LP "self_attn/q_a_layernorm", HP "self_attn.q_a_layernorm.weight"),
    T(LP "self_attn/q_b_proj", HP "self_attn.q_b_proj.weight"),
    T(LP "self_attn/kv_a_proj_with_mqa", HP "self_attn.kv_a_proj_with_mqa.weight"),
    T(LP "self_attn/kv_a_layernorm", HP "self_attn.kv_a_layernorm.weight"),
    T(LP "self_attn/kv_b_proj", HP "self_attn.kv_b_proj.weight"),
    T_END,
};

/* Its router's correction bias and the ungated shared experts. */
static const HfTensor g_t_dsv3_moe[] = {
    T(LP "mlp/gate.e_score_correction_bias", HP "mlp.gate.e_score_correction_bias"),
    T(LP "mlp/shared_experts/gate_proj", HP "mlp.shared_experts.gate_proj.weight"),
    T(LP "mlp/shared_experts/up_proj", HP "mlp.shared_experts.up_proj.weight"),
    T(LP "mlp/shared_experts/down_proj", HP "mlp.shared_experts.down_proj.weight"),
    T_END,
};

#undef T
#undef T_IN
#undef STACK
#undef PART
#undef T_END
#undef LP
#undef HP
#undef V5_EXPERTS

static const HfTensor *const g_mixtral_tensors[] = { g_t_common, g_t_mixtral_moe, NULL };
static const HfTensor *const g_qwen2_tensors[] = { g_t_common, g_t_mlp_moe, g_t_qwen2_shared, NULL };
static const HfTensor *const g_plain_tensors[] = { g_t_common, g_t_mlp_moe, NULL };
static const HfTensor *const g_dsv3_tensors[] = { g_t_common, g_t_mla, g_t_mlp_moe, g_t_dsv3_moe, NULL };

static const HfSkip g_skips[] = {
    { "model.layers.{L}.self_attn.rotary_emb.inv_freq", "RoPE frequency buffers (recomputed from rope_theta)" },
    { "lm_head.weight", "tie_word_embeddings: the output layer is the embedding (transformers ties it on load)" },
    { NULL, NULL },
};

static const HfSkip g_dsv3_skips[] = {
    { "model.layers.{L}.self_attn.rotary_emb.inv_freq", "RoPE frequency buffers (recomputed from rope_theta)" },
    { "lm_head.weight", "tie_word_embeddings: the output layer is the embedding (transformers ties it on load)" },
    { "model.layers.{N}.*", "the multi-token-prediction layer: transformers does not load it; tandem does not use it "
                            "(no speculative decoding from it)" },
    { NULL, NULL },
};

/* ---------------------------------------------------------------- families */

static const HfFamily g_mixtral = { "MixtralForCausalLM", "mixtral", g_mixtral_keys, g_mixtral_consts,
                                    g_mixtral_tensors, g_skips, HF_ANY, NULL };
static const HfFamily g_qwen2 = { "Qwen2MoeForCausalLM", "qwen2_moe", g_qwen2_keys, g_qwen2_consts,
                                  g_qwen2_tensors, g_skips, HF_ANY, NULL };
static const HfFamily g_qwen3 = { "Qwen3MoeForCausalLM", "qwen3_moe", g_qwen3_keys, g_qwen3_consts,
                                  g_plain_tensors, g_skips, HF_ANY, NULL };
static const HfFamily g_olmoe = { "OlmoeForCausalLM", "olmoe", g_olmoe_keys, g_olmoe_consts, g_plain_tensors,
                                  g_skips, HF_ANY, NULL };

static const HfFamily g_dsv3 = { "DeepseekV3ForCausalLM", "deepseek_v3", g_dsv3_keys, g_dsv3_consts, g_dsv3_tensors,
                                  g_dsv3_skips, HF_V4, "kimi_k2" };

const HfFamily *const hf_families[] = { &g_mixtral, &g_qwen3, &g_olmoe, &g_qwen2, &g_dsv3, NULL };

const HfFamily *hf_family_find(const char *architecture)
{
    for (int i = 0; architecture && hf_families[i]; i++)
        if (!strcmp(hf_families[i]->architecture, architecture)) return hf_families[i];
    return NULL;
}

const char *hf_family_names(void)
{
    static char buf[512];
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; hf_families[i] && k < sizeof buf; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? ", " : "", hf_families[i]->architecture);
    return buf;
}

/* ---------------------------------------------------------------- patterns */

int hf_pattern_fill(char *out, size_t n, const char *pattern, int layer, int expert)
{
    size_t k = 0;
    for (const char *p = pattern; *p; p++) {
        int w = -1;
        if (!strncmp(p, "{L}", 3)) w = snprintf(out + k, n - k, "%d", layer);
        else if (!strncmp(p, "{E}", 3)) w = snprintf(out + k, n - k, "%d", expert);
        if (w >= 0) {
            k += (size_t)w;
            p += 2;
        } else if (k + 1 < n) {
            out[k++] = *p;
            out[k] = 0;
        } else {
            return -1;
        }
        if (k >= n) return -1;
    }
    out[k] = 0;
    return 0;
}

/* A decimal number without a leading zero (as Python prints ints). */
static const char *number(const char *s, long *v)
{
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return NULL;
    long x = 0;
    while (*s >= '0' && *s <= '9' && x < 100000000) x = 10 * x + (*s++ - '0');
    *v = x;
    return s;
}

bool hf_pattern_match(const char *pattern, const char *name, int n_layers, int *layer, int *expert)
{
    const char *p = pattern, *s = name;
    while (*p) {
        if (p[0] == '*' && p[1] == 0) return true;
        if (p[0] == '{' && p[1] && p[2] == '}' && (p[1] == 'L' || p[1] == 'E' || p[1] == 'N')) {
            long v;
            const char *e = number(s, &v);
            if (!e) return false;
            if (p[1] == 'L' && v >= n_layers) return false;
            if (p[1] == 'N' && v < n_layers) return false;
            if (p[1] == 'L' && layer) *layer = (int)v;
            if (p[1] == 'N' && layer) *layer = (int)v;
            if (p[1] == 'E' && expert) *expert = (int)v;
            s = e;
            p += 3;
            continue;
        }
        if (*p++ != *s++) return false;
    }
    return *s == 0;
}

/* ---------------------------------------------------------------- listing */

static const char *rule_name(HfRule r)
{
    static const char *const names[] = { "", "hidden_act", "rope_scaling", "rope_parameters", "sliding_window",
                                         "use_sliding_window", "layer_types", "aux_coef", "train_noise",
                                         "quantization", "head_dim_fixed", "aux", "false_only", "fixed", "positive" };
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

static const char *layouts_str(uint8_t l)
{
    return l == HF_ANY ? "v4, v5" : l == HF_V4 ? "v4" : l == HF_V5 ? "v5" : "-";
}

void hf_families_print(void)
{
    for (int f = 0; hf_families[f]; f++) {
        const HfFamily *fam = hf_families[f];
        printf("### %s\n\nmodel_type `%s`%s%s%s, layouts %s.\n\n", fam->architecture, fam->model_type,
               fam->model_type_alt ? " (or `" : "", fam->model_type_alt ? fam->model_type_alt : "",
               fam->model_type_alt ? "`)" : "", layouts_str(fam->layouts));
        printf("| config.json key | tandem key | when absent | null | rule | written (export) | meaning |\n");
        printf("|---|---|---|---|---|---|---|\n");
        for (const HfKey *k = fam->keys; k->key; k++) {
            char tk[96] = "";
            for (size_t i = 0, j = 0; k->kind == HFK_COPY && k->tkey[i] && j + 3 < sizeof tk; i++) {
                if (k->tkey[i] == ',') tk[j++] = ',', tk[j++] = ' ';
                else tk[j++] = k->tkey[i];
                tk[j] = 0;
            }
            printf("| `%s` | %s | %s | %s | %s | %s | %s |\n", k->key,
                   k->kind == HFK_COPY ? tk : k->kind == HFK_IGNORE ? "(ignored)" : "(rule)",
                   k->absent ? k->absent : "-", k->null_is ? k->null_is : "-",
                   k->kind == HFK_RULE ? rule_name(k->rule) : "", layouts_str(k->write), k->doc);
        }
        printf("\nFixed by the architecture: ");
        for (const HfConst *c = fam->consts; c->tkey; c++)
            printf("%s`%s: %s`%s", c == fam->consts ? "" : ", ", c->tkey, c->json,
                   c->training_only ? " (training only)" : "");
        printf(".\n\n| tandem parameter | HF tensor | transform | layouts |\n|---|---|---|---|\n");
        for (int t = 0; fam->tensors[t]; t++)
            for (const HfTensor *r = fam->tensors[t]; r->tandem; r++) {
                char how[64];
                if (r->how == HFT_COPY) snprintf(how, sizeof how, "copy");
                else if (r->how == HFT_STACK) snprintf(how, sizeof how, "stack {E} along dim 0");
                else snprintf(how, sizeof how, "part %d of %d along dim %d", r->part, r->parts, r->dim);
                printf("| `%s` | `%s` | %s | %s |\n", r->tandem, r->hf, how, layouts_str(r->layouts));
            }
        printf("\nRead past: ");
        for (const HfSkip *s = fam->skips; s->hf; s++)
            printf("%s`%s` (%s)", s == fam->skips ? "" : "; ", s->hf, s->note);
        printf(".\n\n");
    }
    printf("Generic keys every family ignores: ");
    for (int i = 0; hf_generic_keys[i]; i++) printf("%s`%s`", i ? ", " : "", hf_generic_keys[i]);
    printf(".\n");
}

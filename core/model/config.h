/* core/model/config.h - the model configuration (SPEC section 3), with Hugging Face
 * key names.  Parsed from JSON; unknown keys are an error naming the key;
 * missing keys take the defaults listed in docs/config.md; impossible values
 * are an error naming the key and the constraint.
 */
#ifndef TANDEM_CORE_MODEL_CONFIG_H
#define TANDEM_CORE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ops/rope.h"

/* RMSNorm of q and k before RoPE (qk_norm). */
typedef enum {
    QK_NORM_NONE,   /* "none" */
    QK_NORM_HEAD,   /* "head": per head over hd, one weight [hd] shared by the heads (Qwen3-MoE) */
    QK_NORM_FULL,   /* "full": over the whole projection, weights [H*hd] and [Hkv*hd] (OLMoE) */
} QkNorm;

/* Router scores (scoring_func) and the choice of experts (topk_method). */
typedef enum {
    ROUTER_SOFTMAX,   /* "softmax": p = softmax(logits) */
    ROUTER_SIGMOID,   /* "sigmoid": s = sigmoid(logits) (DeepSeek-V3) */
} RouterScoring;
typedef enum {
    TOPK_GREEDY,      /* "greedy": top-k of the scores */
    TOPK_NOAUX_TC,    /* "noaux_tc": top-k of scores + e_score_correction_bias in
                       * the best topk_group of n_group groups (DeepSeek-V3) */
} TopkMethod;

/* vision_config (docs/vision.md): a ViT encoder (LLaVA's vision tower,
 * SigLIP's layout: no class token) and a two-layer GELU projector into
 * hidden_size.  num_hidden_layers 0 (vision_config null or absent): no
 * vision tower. */
typedef struct {
    int hidden_size;               /* Dv */
    int intermediate_size;         /* Fv */
    int num_hidden_layers;         /* Lv */
    int num_attention_heads;       /* Hv, head dim Dv / Hv */
    int image_size;                /* S: images are S x S after resizing */
    int patch_size;                /* p: (S / p)^2 tokens per image */
    double layer_norm_eps;
    double image_mean[3], image_std[3];   /* normalisation of RGB in [0, 1] */
} VisionConfig;

/* Entries of a list-valued key (mlp_only_layers). */
#define CONFIG_MAX_LIST 512

typedef struct {
    int vocab_size;
    int hidden_size;               /* d */
    int num_hidden_layers;         /* L */
    int num_attention_heads;       /* H */
    int num_key_value_heads;       /* Hkv */
    int head_dim;                  /* hd */
    int intermediate_size;         /* Fd, dense layers */
    int moe_intermediate_size;     /* F, one expert */
    int num_local_experts;         /* E */
    int num_experts_per_tok;       /* k */
    int n_shared_experts;          /* shared SwiGLU of width F * n_shared_experts */
    int first_k_dense_replace;     /* layers < this are dense */
    double rope_theta;
    double rms_norm_eps;
    int max_position_embeddings;
    bool tie_word_embeddings;
    bool norm_topk_prob;
    double router_aux_loss_coef;
    double router_z_loss_coef;
    /* Hugging Face families (SPEC section 9); the defaults leave the model
     * of SPEC section 2 unchanged */
    bool attention_bias;           /* biases on q, k, v and o projections */
    bool qkv_bias;                 /* biases on q, k, v only */
    QkNorm qk_norm;
    double clip_qkv;               /* > 0: q, k, v clamped to [-c, c]; 0 off */
    /* multi-head latent attention (DeepSeek-V3, docs/mla.md): on when
     * kv_lora_rank > 0; head_dim is then qk_rope_head_dim (as HF sets it) */
    int q_lora_rank;               /* 0: q_proj; > 0: q_a_proj, q_a_layernorm, q_b_proj */
    int kv_lora_rank;              /* r: the latent c_kv, what the KV cache holds with k_rope */
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool rope_interleave;          /* RoPE rotates pairs (2i, 2i + 1), not (i, i + hd/2) */
    int shared_expert_intermediate_size;  /* > 0: shared expert width S (else F * n_shared_experts) */
    bool shared_expert_gate;       /* shared output *= sigmoid(h2 . w_g) */
    int decoder_sparse_step;       /* MoE layers are those with (l + 1) % step == 0 ... */
    int n_mlp_only_layers;         /* ... and not listed here */
    int mlp_only_layers[CONFIG_MAX_LIST];
    /* HF rope_scaling (object form; null or type "default": none), any
     * family: linear or yarn (core/ops/rope.h); docs/config.md */
    RopeScaling rope_scaling;
    /* DeepSeek-V3 router (docs/config.md, core/ops/moe.h) */
    RouterScoring scoring_func;
    TopkMethod topk_method;
    int n_group;                   /* expert groups (noaux_tc) */
    int topk_group;                /* groups kept per token */
    double routed_scaling_factor;  /* routed weights *= this (sigmoid only) */
    int moe_layer_freq;            /* MoE layers are those with l % freq == 0 (DeepSeek's rule) */
    /* sliding-window attention (config_layer_window; docs/config.md) */
    int sliding_window;            /* W >= 1; 0 = null: no window */
    bool use_sliding_window;       /* false: no layer slides (Qwen2's switch; default true) */
    int max_window_layers;         /* without layer_types: layers l >= this slide (default 0: all) */
    int n_layer_types;             /* 0 = null; else num_hidden_layers entries: */
    bool layer_sliding[CONFIG_MAX_LIST];   /* layer_types[l] == "sliding_attention" */
    /* images (LLaVA, docs/vision.md) */
    VisionConfig vision_config;
    int image_token_index;         /* placeholder id; each image takes vision_tokens_per_image of them */
    int projector_hidden_act;      /* 0: "gelu" (the only one) */
} ModelConfig;

/* Fill cfg with the defaults. */
void config_defaults(ModelConfig *cfg);

/* Parse a JSON object given as text.  On error writes one line into err
 * (naming the key) and returns -1; on success returns 0.  Missing
 * head_dim / num_key_value_heads are derived after parsing. */
int config_parse(ModelConfig *cfg, const char *json_text, char *err, size_t err_len);
/* Same, reading a file. */
int config_load(ModelConfig *cfg, const char *path, char *err, size_t err_len);
/* Parse from an already-parsed cJSON object (declared as void * so that
 * callers without cJSON can include this header). */
int config_from_cjson(ModelConfig *cfg, const void *cjson_obj, char *err, size_t err_len);
/* Check constraints; returns -1 with the reason in err. */
int config_validate(const ModelConfig *cfg, char *err, size_t err_len);
/* rope_scaling as a cJSON value (null, or the HF object with the fields
 * set), declared void * as above; the caller owns it. */
void *config_rope_scaling_json(const RopeScaling *r);
/* JSON text of every key (owned by the caller, td_free). */
char *config_to_json(const ModelConfig *cfg);

/* Derived sizes. */
/* Layer l is MoE iff l >= first_k_dense_replace, l is not in
 * mlp_only_layers, (l + 1) % decoder_sparse_step == 0 (Qwen2-MoE's rule)
 * and l % moe_layer_freq == 0 (DeepSeek's); with the defaults, every
 * layer from first_k_dense_replace on. */
bool config_layer_is_moe(const ModelConfig *c, int l);
/* The sliding window of layer l (0: full attention): sliding_window when
 * it is set, use_sliding_window, and layer_types names l
 * "sliding_attention" (without layer_types: l >= max_window_layers). */
int config_layer_window(const ModelConfig *c, int l);
/* MoE layers of the model. */
int config_n_moe_layers(const ModelConfig *c);
/* Width S of the shared expert(s) of an MoE layer (global, unsharded): 0
 * when there is none. */
static inline int config_shared_width(const ModelConfig *c)
{
    return c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size
                                                  : c->moe_intermediate_size * c->n_shared_experts;
}
/* A vision tower (vision_config given). */
static inline bool config_vision(const ModelConfig *c) { return c->vision_config.num_hidden_layers > 0; }
/* Multi-head latent attention on. */
static inline bool config_mla(const ModelConfig *c) { return c->kv_lora_rank > 0; }
/* q, k and v biases; o bias. */
static inline bool config_qkv_bias(const ModelConfig *c) { return c->attention_bias || c->qkv_bias; }
static inline bool config_o_bias(const ModelConfig *c) { return c->attention_bias; }
/* The router's choice carries a per-expert correction bias
 * (mlp/gate.e_score_correction_bias, state moved by training's bias update). */
static inline bool config_router_bias(const ModelConfig *c) { return c->topk_method == TOPK_NOAUX_TC; }
/* Parameters of the vision tower and projector (0 without one). */
size_t config_vision_param_count(const ModelConfig *c);
/* Parameter count of the whole model (global, unsharded), the vision tower's included. */
size_t config_param_count(const ModelConfig *c);
/* Parameters touched per token in a forward (k experts, not E): the
 * denominator of model FLOPs (6 * active params per token for training). */
size_t config_active_param_count(const ModelConfig *c);

#endif

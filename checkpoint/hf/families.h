/* checkpoint/hf/families.h - the Hugging Face model families tandem reads
 * and writes, as data (SPEC section 9, STYLE section 11).
 *
 * A family (HfFamily) is three tables and a few constants:
 *
 *   keys     config.json key -> tandem model-config key (HfKey): copied,
 *            ignored (metadata, initialisation, caching), or handled by a
 *            named rule (HfRule: renames, defaults, and the refusals of
 *            keys that change the math in a way tandem does not compute);
 *   consts   tandem config keys the architecture fixes (Mixtral always
 *            renormalises its top-k, Qwen3-MoE normalises q/k per head...);
 *   tensors  tandem parameter name -> HF tensor name + transform (HfTensor):
 *            a copy, a stack of per-expert tensors, or one part of a fused
 *            tensor, each for the layouts (v4, v5) that store it so;
 *   skips    HF tensors that are read past (buffers transformers drops on
 *            load, the tied lm_head), each with its note.
 *
 * Which tensors exist is not in the tables: it is the tandem model's own
 * parameter table for the mapped config (core/model/model.h,
 * model_param_table), so the engine decides from the config what a layer
 * holds, and a family only names things.  Nothing outside these tables
 * asks which family a checkpoint is.
 *
 * Patterns: "{L}" is a layer number below num_hidden_layers, "{E}" an
 * expert number below the expert count, "{N}" (skips only) a layer number
 * at or above num_hidden_layers (DeepSeek-V3's extra MTP layer), and a
 * trailing "*" (skips only) any rest of the name.
 *
 * Adding a family (docs/import.md has the recipe): one HfFamily entry in
 * families.c with its key table, constants and tensor rows; rules it needs
 * that no family has yet join the enums below; new tensors come with their
 * ops in core/.  FP8 block-scaled weights are not a transform: any row's
 * tensor may be F8_E4M3 with its *_scale_inv beside it when config.json
 * has an fp8 quantization_config (hf_map.h).
 */
#ifndef TANDEM_CHECKPOINT_HF_FAMILIES_H
#define TANDEM_CHECKPOINT_HF_FAMILIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Layouts, as bits: v4 (per-expert tensors: every released checkpoint),
 * v5 (transformers 5's stacked, fused experts). */
typedef enum { HF_V4 = 1, HF_V5 = 2 } HfLayout;
#define HF_ANY (HF_V4 | HF_V5)

/* ---------------------------------------------------------------- config keys */

typedef enum {
    HFK_COPY,     /* the value, unchanged, into tkey (null: null_is) */
    HFK_IGNORE,   /* no effect on the math: metadata, initialisation, caching */
    HFK_RULE,     /* read by a named rule (HfRule) */
} HfKeyKind;

/* Rules: what a key needs beyond a copy.  Each refuses with one line
 * naming the key and value when the model computes something tandem does
 * not (docs/import.md lists the messages). */
typedef enum {
    HFR_NONE,
    HFR_ACT,             /* hidden_act: must be silu */
    HFR_ROPE_SCALING,    /* rope_scaling: null or type "default" */
    HFR_ROPE_PARAMS,     /* rope_parameters (v5): rope_type "default"; its rope_theta -> rope_theta */
    HFR_SLIDING,         /* Mixtral sliding_window: null or >= max_position_embeddings */
    HFR_USE_SLIDING,     /* Qwen use_sliding_window: only with a window >= max_position_embeddings */
    HFR_LAYER_TYPES,     /* v5 layer_types: full_attention / sliding_attention entries */
    HFR_AUX_COEF,        /* router_aux_loss_coef: the aux loss only when output_router_logits */
    HFR_TRAIN_NOISE,     /* attention_dropout, router_jitter_noise: training-only noise, noted */
    HFR_QUANT,           /* quantization_config: quantized checkpoints are refused */
    HFR_HEAD_DIM_FIXED,  /* head_dim read as hidden_size / num_attention_heads: must equal it */
    HFR_AUX,             /* read by another key's rule (output_router_logits, sliding_window ...) */
    HFR_FALSE_ONLY,      /* a feature flag tandem does not compute for this family: must be false */
    HFR_FIXED,           /* copied to tkey, and must equal the `absent` value: what the modeling code computes whatever
                          * the key says (DeepSeek-V3's scoring_func, topk_method; kv_lora_rank > 0 via HFR_POSITIVE) */
    HFR_POSITIVE,        /* copied to tkey, and must be > 0 (DeepSeek-V3's kv_lora_rank: it is always MLA) */
} HfRule;

typedef struct {
    const char *key;      /* config.json key */
    HfKeyKind kind;
    const char *tkey;     /* tandem key(s) for COPY ("a,b": both get the value; export reads the first) */
    const char *absent;   /* JSON of the value the config class assumes when the key is absent */
    const char *null_is;  /* COPY: tandem JSON for a null value (NULL: null is refused) */
    HfRule rule;          /* HFK_RULE */
    uint8_t write;        /* layouts whose generated config.json has the key (0: never) */
    const char *doc;      /* one line for docs/import.md */
} HfKey;

/* A tandem config key the architecture fixes. */
typedef struct {
    const char *tkey;
    const char *json;
    bool training_only;   /* a training-loss coefficient: export notes a mismatch instead of refusing */
} HfConst;

/* ---------------------------------------------------------------- tensors */

typedef enum {
    HFT_COPY,    /* one HF tensor of the tandem tensor's shape */
    HFT_STACK,   /* one HF tensor per expert ({E} in hf), stacked along tandem dim 0 */
    HFT_PART,    /* part `part` of `parts` equal parts along HF dim `dim` of a fused tensor */
} HfHow;

typedef struct {
    const char *tandem;   /* tandem parameter name, "{L}" the layer */
    const char *hf;       /* HF tensor name */
    HfHow how;
    uint8_t part, parts, dim;   /* HFT_PART */
    uint8_t layouts;            /* HF_V4, HF_V5 or both */
} HfTensor;

typedef struct {
    const char *hf;       /* pattern of the HF names read past */
    const char *note;     /* why (printed once per import or load) */
} HfSkip;

/* ---------------------------------------------------------------- families */

typedef struct {
    const char *architecture;      /* config.json architectures[0] */
    const char *model_type;        /* config.json model_type */
    const HfKey *keys;             /* terminated by a NULL key */
    const HfConst *consts;         /* terminated by a NULL tkey */
    const HfTensor *const *tensors;   /* NULL-terminated list of row tables, each ended by a NULL tandem */
    const HfSkip *skips;           /* terminated by a NULL hf */
    uint8_t layouts;               /* layouts its checkpoints come in */
    const char *model_type_alt;    /* another model_type of the same architecture (Kimi-K2's "kimi_k2"), or NULL */
} HfFamily;

/* Every family, NULL-terminated, in the order export tries them for a
 * tandem-native config (the first that expresses it exactly wins). */
extern const HfFamily *const hf_families[];

/* Generic config.json keys of every transformers config (PretrainedConfig
 * metadata): ignored by every family, never noted.  NULL-terminated. */
extern const char *const hf_generic_keys[];

/* The family of an architecture name, or NULL. */
const HfFamily *hf_family_find(const char *architecture);
/* "MixtralForCausalLM, Qwen2MoeForCausalLM, ..." (static buffer). */
const char *hf_family_names(void);

/* Placeholders of a pattern: fills out with pattern, {L} -> layer, {E} ->
 * expert.  Returns 0, or -1 when it does not fit n bytes. */
int hf_pattern_fill(char *out, size_t n, const char *pattern, int layer, int expert);
/* Matches name against pattern; {L}/{E}/{N} match decimal numbers (stored
 * in *layer / *expert when not NULL), '*' at the end anything.  {N}
 * requires a value >= n_layers, {L} one below it. */
bool hf_pattern_match(const char *pattern, const char *name, int n_layers, int *layer, int *expert);

/* Prints every family's tables (markdown, for docs/import.md) to stdout:
 * `tandem ckpt import --list-families`. */
void hf_families_print(void);

#endif

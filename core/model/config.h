/* core/model/config.h - the model configuration (SPEC section 3), with Hugging Face
 * key names.  Parsed from JSON; unknown keys are an error naming the key;
 * missing keys take the defaults listed in docs/config.md; impossible values
 * are an error naming the key and the constraint.
 */
#ifndef TANDEM_CORE_MODEL_CONFIG_H
#define TANDEM_CORE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

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
/* JSON text of every key (owned by the caller, td_free). */
char *config_to_json(const ModelConfig *cfg);

/* Derived sizes. */
static inline bool config_layer_is_moe(const ModelConfig *c, int l)
{
    return l >= c->first_k_dense_replace;
}
/* Parameter count of the whole model (global, unsharded). */
size_t config_param_count(const ModelConfig *c);
/* Parameters touched per token in a forward (k experts, not E): the
 * denominator of model FLOPs (6 * active params per token for training). */
size_t config_active_param_count(const ModelConfig *c);

#endif

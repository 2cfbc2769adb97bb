/* core/model/config.c - model configuration parsing and validation (config.h). */
#include "core/model/config.h"
#include "core/common.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void config_defaults(ModelConfig *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 256;
    c->hidden_size = 256;
    c->num_hidden_layers = 4;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 0;       /* 0: = num_attention_heads */
    c->head_dim = 0;                  /* 0: = hidden_size / num_attention_heads */
    c->intermediate_size = 0;         /* 0: = 4 * hidden_size */
    c->moe_intermediate_size = 0;     /* 0: = 2 * hidden_size */
    c->num_local_experts = 8;
    c->num_experts_per_tok = 2;
    c->n_shared_experts = 0;
    c->first_k_dense_replace = 0;
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-5;
    c->max_position_embeddings = 4096;
    c->tie_word_embeddings = false;
    c->norm_topk_prob = true;
    c->router_aux_loss_coef = 0.01;
    c->router_z_loss_coef = 0.001;
    c->attention_bias = false;
    c->qkv_bias = false;
    c->qk_norm = QK_NORM_NONE;
    c->clip_qkv = 0.0;
    c->shared_expert_intermediate_size = 0;
    c->shared_expert_gate = false;
    c->decoder_sparse_step = 1;
    c->n_mlp_only_layers = 0;
    c->scoring_func = ROUTER_SOFTMAX;
    c->topk_method = TOPK_GREEDY;
    c->n_group = 1;
    c->topk_group = 1;
    c->routed_scaling_factor = 1.0;
    c->moe_layer_freq = 1;
    c->sliding_window = 0;
    c->use_sliding_window = true;
    c->max_window_layers = 0;
    c->n_layer_types = 0;
    c->image_token_index = -1;
}

/* vision_config's defaults once the object is given (docs/config.md). */
static void vision_defaults(VisionConfig *v)
{
    memset(v, 0, sizeof *v);
    v->hidden_size = 64;
    v->intermediate_size = 0;        /* 0: = 4 * hidden_size */
    v->num_hidden_layers = 2;
    v->num_attention_heads = 4;
    v->image_size = 64;
    v->patch_size = 8;
    v->layer_norm_eps = 1e-6;
    for (int c = 0; c < 3; c++) v->image_mean[c] = v->image_std[c] = 0.5;   /* SigLIP's */
}

static const char *const g_qk_norm_names[] = { "none", "head", "full" };

static const char *const g_scoring_names[] = { "softmax", "sigmoid", NULL };
static const char *const g_topk_names[] = { "greedy", "noaux_tc", NULL };
static const char *const g_act_names[] = { "gelu", NULL };

/* K_ENUM: a string naming one of names[] (NULL-terminated), stored as an int enum */
enum kind { K_INT, K_NUM, K_BOOL, K_QKNORM, K_LAYERS, K_ENUM, K_ROPESCALING, K_WINDOW, K_LAYER_TYPES, K_VISION };
struct key { const char *name; enum kind kind; size_t off; const char *const *names; };

#define KEY(n, k) { #n, k, offsetof(ModelConfig, n), NULL }
#define ENUM_KEY(n, names) { #n, K_ENUM, offsetof(ModelConfig, n), names }
static const struct key g_keys[] = {
    KEY(vocab_size, K_INT), KEY(hidden_size, K_INT), KEY(num_hidden_layers, K_INT),
    KEY(num_attention_heads, K_INT), KEY(num_key_value_heads, K_INT), KEY(head_dim, K_INT),
    KEY(intermediate_size, K_INT), KEY(moe_intermediate_size, K_INT),
    KEY(num_local_experts, K_INT), KEY(num_experts_per_tok, K_INT),
    KEY(n_shared_experts, K_INT), KEY(first_k_dense_replace, K_INT),
    KEY(rope_theta, K_NUM), KEY(rms_norm_eps, K_NUM), KEY(max_position_embeddings, K_INT),
    KEY(tie_word_embeddings, K_BOOL), KEY(norm_topk_prob, K_BOOL),
    KEY(router_aux_loss_coef, K_NUM), KEY(router_z_loss_coef, K_NUM),
    KEY(attention_bias, K_BOOL), KEY(qkv_bias, K_BOOL), KEY(qk_norm, K_QKNORM), KEY(clip_qkv, K_NUM),
    KEY(q_lora_rank, K_INT), KEY(kv_lora_rank, K_INT), KEY(qk_nope_head_dim, K_INT),
    KEY(qk_rope_head_dim, K_INT), KEY(v_head_dim, K_INT), KEY(rope_interleave, K_BOOL),
    KEY(shared_expert_intermediate_size, K_INT), KEY(shared_expert_gate, K_BOOL),
    KEY(decoder_sparse_step, K_INT), KEY(mlp_only_layers, K_LAYERS),
    KEY(rope_scaling, K_ROPESCALING),
    ENUM_KEY(scoring_func, g_scoring_names), ENUM_KEY(topk_method, g_topk_names),
    KEY(n_group, K_INT), KEY(topk_group, K_INT), KEY(routed_scaling_factor, K_NUM),
    KEY(moe_layer_freq, K_INT),
    KEY(sliding_window, K_WINDOW), KEY(use_sliding_window, K_BOOL), KEY(max_window_layers, K_INT),
    { "layer_types", K_LAYER_TYPES, offsetof(ModelConfig, layer_sliding), NULL },
    KEY(vision_config, K_VISION), KEY(image_token_index, K_INT), ENUM_KEY(projector_hidden_act, g_act_names),
};
#undef ENUM_KEY
#undef KEY
#define N_KEYS (sizeof g_keys / sizeof g_keys[0])

/* A derived size, or -1 when it does not fit an int (config_validate
 * refuses it naming the key). */
static int derived(long long v) { return v > INT_MAX ? -1 : (int)v; }

static void derive(ModelConfig *c, const bool *given)
{
    (void)given;
    if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->head_dim == 0 && config_mla(c)) c->head_dim = c->qk_rope_head_dim;   /* HF DeepseekV3Config */
    if (c->head_dim == 0 && c->num_attention_heads > 0)
        c->head_dim = c->hidden_size / c->num_attention_heads;
    if (c->intermediate_size == 0) c->intermediate_size = derived(4LL * c->hidden_size);
    if (c->moe_intermediate_size == 0) c->moe_intermediate_size = derived(2LL * c->hidden_size);
    /* yarn without original_max_position_embeddings: HF takes the model's */
    if (c->rope_scaling.type == ROPE_SCALING_YARN && c->rope_scaling.original_max_position_embeddings == 0)
        c->rope_scaling.original_max_position_embeddings = c->max_position_embeddings;
}

/* vision_config: null, or an object of the keys below (HF's
 * SiglipVisionConfig names; image_mean / image_std: 3 numbers each);
 * an unknown key is refused by name. */
static int parse_vision(VisionConfig *v, const cJSON *it, char *err, size_t err_len)
{
    memset(v, 0, sizeof *v);
    if (cJSON_IsNull(it)) return 0;
    if (!cJSON_IsObject(it)) {
        snprintf(err, err_len, "model config: \"vision_config\" must be an object or null");
        return -1;
    }
    vision_defaults(v);
    static const char *const ints[] = { "hidden_size", "intermediate_size", "num_hidden_layers",
                                        "num_attention_heads", "image_size", "patch_size", NULL };
    int *const dst[] = { &v->hidden_size, &v->intermediate_size, &v->num_hidden_layers, &v->num_attention_heads,
                         &v->image_size, &v->patch_size };
    for (const cJSON *k = it->child; k; k = k->next) {
        int j = 0;
        while (ints[j] && strcmp(ints[j], k->string)) j++;
        if (ints[j]) {
            if (!cJSON_IsNumber(k) || k->valuedouble != floor(k->valuedouble) || k->valuedouble < 1 ||
                k->valuedouble > 1e6) {
                snprintf(err, err_len, "model config: vision_config.%s must be an integer in [1, 1000000]", k->string);
                return -1;
            }
            *dst[j] = (int)k->valuedouble;
        } else if (!strcmp(k->string, "layer_norm_eps")) {
            if (!cJSON_IsNumber(k) || !(k->valuedouble > 0 && k->valuedouble < 1)) {
                snprintf(err, err_len, "model config: vision_config.layer_norm_eps must be in (0, 1)");
                return -1;
            }
            v->layer_norm_eps = k->valuedouble;
        } else if (!strcmp(k->string, "image_mean") || !strcmp(k->string, "image_std")) {
            double *out = k->string[6] == 'm' ? v->image_mean : v->image_std;
            const bool std = out == v->image_std;
            if (!cJSON_IsArray(k) || cJSON_GetArraySize(k) != 3) {
                snprintf(err, err_len, "model config: vision_config.%s must be a list of 3 numbers", k->string);
                return -1;
            }
            int c = 0;
            for (const cJSON *e = k->child; e; e = e->next, c++) {
                if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || (std && !(e->valuedouble > 0))) {
                    snprintf(err, err_len, "model config: vision_config.%s entries must be numbers%s", k->string,
                             std ? " > 0" : "");
                    return -1;
                }
                out[c] = e->valuedouble;
            }
        } else {
            snprintf(err, err_len, "model config: unknown vision_config key \"%.40s\"", k->string);
            return -1;
        }
    }
    if (v->intermediate_size == 0) v->intermediate_size = 4 * v->hidden_size;
    return 0;
}

static cJSON *vision_json(const VisionConfig *v)
{
    if (v->num_hidden_layers == 0) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "hidden_size", v->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", v->intermediate_size);
    cJSON_AddNumberToObject(o, "num_hidden_layers", v->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", v->num_attention_heads);
    cJSON_AddNumberToObject(o, "image_size", v->image_size);
    cJSON_AddNumberToObject(o, "patch_size", v->patch_size);
    cJSON_AddNumberToObject(o, "layer_norm_eps", v->layer_norm_eps);
    cJSON_AddItemToObject(o, "image_mean", cJSON_CreateDoubleArray(v->image_mean, 3));
    cJSON_AddItemToObject(o, "image_std", cJSON_CreateDoubleArray(v->image_std, 3));
    return o;
}

/* The vision keys: a tower needs its placeholder id, sizes that tile. */
static int vision_validate(const ModelConfig *c, char *err, size_t err_len);

/* rope_scaling: null, or an HF object {"type" | "rope_type": "default" |
 * "linear" | "yarn", ...}; an unknown type or key is refused by name. */
static int parse_rope_scaling(RopeScaling *r, const cJSON *it, char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    if (cJSON_IsNull(it)) return 0;
    if (!cJSON_IsObject(it)) {
        snprintf(err, err_len, "model config: \"rope_scaling\" must be an object or null");
        return -1;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "rope_type");
    const cJSON *ty2 = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (!ty) ty = ty2;
    if (!cJSON_IsString(ty) || (ty2 && (!cJSON_IsString(ty2) || strcmp(ty2->valuestring, ty->valuestring)))) {
        snprintf(err, err_len, "model config: \"rope_scaling\" needs a \"type\" (or \"rope_type\") string, both alike "
                 "when both are given");
        return -1;
    }
    const char *t = ty->valuestring;
    if (!strcmp(t, "default")) r->type = ROPE_SCALING_NONE;
    else if (!strcmp(t, "linear")) r->type = ROPE_SCALING_LINEAR;
    else if (!strcmp(t, "yarn")) r->type = ROPE_SCALING_YARN;
    else {
        snprintf(err, err_len, "model config: rope_scaling type \"%.40s\" is not supported (default, linear, yarn)", t);
        return -1;
    }
    static const char *const yarn_keys[] = { "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                                             "mscale", "mscale_all_dim", "attention_factor", "truncate", NULL };
    for (const cJSON *k = it->child; k; k = k->next) {
        if (!strcmp(k->string, "type") || !strcmp(k->string, "rope_type")) continue;
        int j = 0;
        while (yarn_keys[j] && strcmp(yarn_keys[j], k->string)) j++;
        bool ok = yarn_keys[j] && (r->type == ROPE_SCALING_YARN || (r->type == ROPE_SCALING_LINEAR && j == 0));
        if (!ok) {
            snprintf(err, err_len, "model config: rope_scaling key \"%.40s\" is not supported for type \"%s\"", k->string, t);
            return -1;
        }
        if (j == 7) {
            if (!cJSON_IsBool(k)) {
                snprintf(err, err_len, "model config: rope_scaling.truncate must be true or false");
                return -1;
            }
            r->no_truncate = cJSON_IsFalse(k);
            continue;
        }
        if (cJSON_IsNull(k)) continue;   /* HF: null is absent */
        if (!cJSON_IsNumber(k) || !isfinite(k->valuedouble) || k->valuedouble < 0 ||
            (j == 1 && (k->valuedouble != floor(k->valuedouble) || k->valuedouble > 1e9))) {
            snprintf(err, err_len, "model config: rope_scaling.%s must be a number >= 0%s", k->string,
                     j == 1 ? " (an integer)" : "");
            return -1;
        }
        double v = k->valuedouble;
        switch (j) {
        case 0: r->factor = v; break;
        case 1: r->original_max_position_embeddings = (int)v; break;
        case 2: r->beta_fast = v; break;
        case 3: r->beta_slow = v; break;
        case 4: r->mscale = v; break;
        case 5: r->mscale_all_dim = v; break;
        case 6: r->attention_factor = v; break;
        }
    }
    if (r->type != ROPE_SCALING_NONE && !(r->factor > 0)) {
        snprintf(err, err_len, "model config: rope_scaling type \"%s\" needs a \"factor\" > 0", t);
        return -1;
    }
    return 0;
}

int config_from_cjson(ModelConfig *cfg, const void *obj, char *err, size_t err_len)
{
    const cJSON *root = obj;
    config_defaults(cfg);
    if (!cJSON_IsObject(root)) {
        snprintf(err, err_len, "model config: expected a JSON object");
        return -1;
    }
    bool given[N_KEYS] = { 0 };
    for (const cJSON *it = root->child; it; it = it->next) {
        size_t i = 0;
        while (i < N_KEYS && strcmp(g_keys[i].name, it->string)) i++;
        if (i == N_KEYS) {
            snprintf(err, err_len, "model config: unknown key \"%s\"", it->string);
            return -1;
        }
        given[i] = true;
        void *dst = (char *)cfg + g_keys[i].off;
        switch (g_keys[i].kind) {
        case K_INT:
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
                fabs(it->valuedouble) > 1e9) {
                snprintf(err, err_len, "model config: \"%s\" must be an integer", it->string);
                return -1;
            }
            *(int *)dst = (int)it->valuedouble;
            break;
        case K_NUM:
            if (!cJSON_IsNumber(it)) {
                snprintf(err, err_len, "model config: \"%s\" must be a number", it->string);
                return -1;
            }
            *(double *)dst = it->valuedouble;
            break;
        case K_BOOL:
            if (!cJSON_IsBool(it)) {
                snprintf(err, err_len, "model config: \"%s\" must be true or false", it->string);
                return -1;
            }
            *(bool *)dst = cJSON_IsTrue(it);
            break;
        case K_QKNORM: {
            int v = -1;
            for (int j = 0; j < 3 && cJSON_IsString(it); j++)
                if (!strcmp(it->valuestring, g_qk_norm_names[j])) v = j;
            if (v < 0) {
                snprintf(err, err_len, "model config: \"%s\" must be \"none\", \"head\" or \"full\"", it->string);
                return -1;
            }
            *(QkNorm *)dst = (QkNorm)v;
            break;
        }
        case K_ENUM: {
            int v = -1;
            for (int j = 0; g_keys[i].names[j] && cJSON_IsString(it); j++)
                if (!strcmp(it->valuestring, g_keys[i].names[j])) v = j;
            if (v < 0) {
                char list[128] = "";
                for (int j = 0; g_keys[i].names[j]; j++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", j ? " | " : "",
                             g_keys[i].names[j]);
                if (cJSON_IsString(it))
                    snprintf(err, err_len, "model config: \"%s\" \"%.40s\" is not supported (%s)", it->string,
                             it->valuestring, list);
                else
                    snprintf(err, err_len, "model config: \"%s\" must be a string: %s", it->string, list);
                return -1;
            }
            *(int *)dst = v;
            break;
        }
        case K_LAYERS: {
            int n = 0;
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) > CONFIG_MAX_LIST) {
                snprintf(err, err_len, "model config: \"%s\" must be a list of at most %d layer numbers",
                         it->string, CONFIG_MAX_LIST);
                return -1;
            }
            for (const cJSON *e = it->child; e; e = e->next) {
                if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                    e->valuedouble > 1e9) {
                    snprintf(err, err_len, "model config: \"%s\" entries must be layer numbers >= 0", it->string);
                    return -1;
                }
                cfg->mlp_only_layers[n++] = (int)e->valuedouble;
            }
            cfg->n_mlp_only_layers = n;
            break;
        }
        case K_ROPESCALING:
            if (parse_rope_scaling(&cfg->rope_scaling, it, err, err_len)) return -1;
            break;
        case K_WINDOW:
            if (cJSON_IsNull(it)) {
                cfg->sliding_window = 0;
                break;
            }
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 1 ||
                it->valuedouble > 1e9) {
                snprintf(err, err_len, "model config: \"%s\" must be an integer >= 1 or null", it->string);
                return -1;
            }
            cfg->sliding_window = (int)it->valuedouble;
            break;
        case K_LAYER_TYPES: {
            int n = 0;
            if (cJSON_IsNull(it)) {
                cfg->n_layer_types = 0;
                break;
            }
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) > CONFIG_MAX_LIST) {
                snprintf(err, err_len, "model config: \"%s\" must be null or a list of at most %d layer types",
                         it->string, CONFIG_MAX_LIST);
                return -1;
            }
            for (const cJSON *e = it->child; e; e = e->next, n++) {
                if (!cJSON_IsString(e) ||
                    (strcmp(e->valuestring, "sliding_attention") && strcmp(e->valuestring, "full_attention"))) {
                    snprintf(err, err_len, "model config: \"%s\"[%d] must be \"sliding_attention\" or "
                             "\"full_attention\"", it->string, n);
                    return -1;
                }
                cfg->layer_sliding[n] = !strcmp(e->valuestring, "sliding_attention");
            }
            cfg->n_layer_types = n;
            break;
        }
        case K_VISION:
            if (parse_vision(&cfg->vision_config, it, err, err_len)) return -1;
            break;
        }
    }
    derive(cfg, given);
    return config_validate(cfg, err, err_len);
}

int config_parse(ModelConfig *cfg, const char *text, char *err, size_t err_len)
{
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        snprintf(err, err_len, "model config: invalid JSON near \"%.20s\"",
                 cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "");
        return -1;
    }
    int rc = config_from_cjson(cfg, root, err, err_len);
    cJSON_Delete(root);
    return rc;
}

int config_load(ModelConfig *cfg, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "model config: cannot open %s", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (1 << 24)) {
        fclose(f);
        snprintf(err, err_len, "model config: %s is not a config file", path);
        return -1;
    }
    char *buf = td_malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    int rc = config_parse(cfg, buf, err, err_len);
    td_free(buf);
    return rc;
}

/* The attention block of an MLA layer (model.c's tensors): its matrices,
 * and with vectors its norms too (the two layer norms included). */
static double mla_attn_f64(const ModelConfig *c, bool vectors)
{
    const double d = c->hidden_size, H = c->num_attention_heads, qr = c->q_lora_rank, r = c->kv_lora_rank;
    const double qk = c->qk_nope_head_dim + c->qk_rope_head_dim, rope = c->qk_rope_head_dim;
    const double q = qr > 0 ? qr * d + H * qk * qr : H * qk * d;
    const double mats = q + (r + rope) * d + H * (c->qk_nope_head_dim + c->v_head_dim) * r + d * H * c->v_head_dim;
    return mats + (vectors ? 2 * d + qr + r : 0);
}

/* config_param_count in double: no overflow however large the values
 * (config_validate bounds it before any size_t product is formed). */
static double param_count_f64(const ModelConfig *c)
{
    const double d = c->hidden_size, V = c->vocab_size, hd = c->head_dim;
    const double attn = config_mla(c) ? mla_attn_f64(c, true)
                        : 2 * d + 2 * (double)c->num_attention_heads * hd * d + 2 * (double)c->num_key_value_heads * hd * d;
    const double dense = 3 * (double)c->intermediate_size * d;
    const double E = c->num_local_experts, F = c->moe_intermediate_size;
    const double S = c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size
                                                            : F * (double)c->n_shared_experts;
    const double moe = E * d + E * 3 * F * d + 3 * S * d + d + E;
    const int n_moe = config_n_moe_layers(c), L = c->num_hidden_layers;
    return V * d * (c->tie_word_embeddings ? 1 : 2) + d + L * attn + (L - n_moe) * dense + n_moe * moe +
           (double)config_vision_param_count(c);
}

#define REQUIRE(cond, ...)                                   \
    do {                                                     \
        if (!(cond)) {                                       \
            snprintf(err, err_len, "model config: " __VA_ARGS__); \
            return -1;                                       \
        }                                                    \
    } while (0)

/* The MLA keys (config.h): ranges, and the ordinary-attention options MLA
 * does not have. */
static int mla_validate(const ModelConfig *c, char *err, size_t err_len)
{
    REQUIRE(c->q_lora_rank >= 0 && c->kv_lora_rank >= 0, "\"q_lora_rank\" and \"kv_lora_rank\" must be >= 0");
    if (!config_mla(c)) {
        REQUIRE(c->q_lora_rank == 0, "\"q_lora_rank\" needs \"kv_lora_rank\" > 0 (multi-head latent attention)");
        return 0;
    }
    REQUIRE(c->qk_rope_head_dim >= 2 && c->qk_rope_head_dim % 2 == 0 && c->qk_rope_head_dim <= 256,
            "\"qk_rope_head_dim\" must be even and in [2, 256] (got %d)", c->qk_rope_head_dim);
    REQUIRE(c->qk_nope_head_dim >= 1 && c->v_head_dim >= 1,
            "\"qk_nope_head_dim\" and \"v_head_dim\" must be >= 1 with kv_lora_rank > 0");
    REQUIRE(c->head_dim == c->qk_rope_head_dim, "\"head_dim\" (%d) must equal \"qk_rope_head_dim\" (%d) under MLA",
            c->head_dim, c->qk_rope_head_dim);
    REQUIRE(c->kv_lora_rank + c->qk_rope_head_dim <= 1024,
            "kv_lora_rank + qk_rope_head_dim = %d exceeds 1024 (the attention kernel's key width)",
            c->kv_lora_rank + c->qk_rope_head_dim);
    REQUIRE(c->num_key_value_heads == c->num_attention_heads,
            "\"num_key_value_heads\" (%d) must equal \"num_attention_heads\" (%d) under MLA (one shared latent)",
            c->num_key_value_heads, c->num_attention_heads);
    REQUIRE(!c->attention_bias && !c->qkv_bias && c->qk_norm == QK_NORM_NONE && c->clip_qkv == 0,
            "attention_bias, qkv_bias, qk_norm and clip_qkv are not defined for MLA (kv_lora_rank > 0)");
    return 0;
}

/* The DeepSeek-V3 router keys (an MoE model only). */
static int router_validate(const ModelConfig *c, char *err, size_t err_len)
{
    const int E = c->num_local_experts, k = c->num_experts_per_tok;
    REQUIRE(c->topk_method != TOPK_NOAUX_TC || c->scoring_func == ROUTER_SIGMOID,
            "\"topk_method\" \"noaux_tc\" needs \"scoring_func\" \"sigmoid\"");
    REQUIRE(c->routed_scaling_factor > 0 && isfinite(c->routed_scaling_factor),
            "\"routed_scaling_factor\" must be > 0 (got %g)", c->routed_scaling_factor);
    REQUIRE(c->scoring_func == ROUTER_SIGMOID || c->routed_scaling_factor == 1.0,
            "\"routed_scaling_factor\" %g needs \"scoring_func\" \"sigmoid\" (softmax routers take 1)",
            c->routed_scaling_factor);
    REQUIRE(c->n_group >= 1 && c->n_group <= E, "\"n_group\" must be in [1, num_local_experts = %d] (got %d)", E,
            c->n_group);
    REQUIRE(E % c->n_group == 0, "\"n_group\" (%d) must divide num_local_experts (%d)", c->n_group, E);
    REQUIRE(c->topk_group >= 1 && c->topk_group <= c->n_group, "\"topk_group\" must be in [1, n_group = %d] (got %d)",
            c->n_group, c->topk_group);
    REQUIRE(c->topk_method == TOPK_NOAUX_TC || (c->n_group == 1 && c->topk_group == 1),
            "\"n_group\" %d / \"topk_group\" %d need \"topk_method\" \"noaux_tc\" (greedy has no groups)",
            c->n_group, c->topk_group);
    REQUIRE(c->n_group == 1 || E / c->n_group >= 2,
            "\"n_group\" %d leaves one expert per group: a group's score is the sum of its top 2", c->n_group);
    REQUIRE(k <= c->topk_group * (E / c->n_group),
            "\"num_experts_per_tok\" (%d) exceeds the experts of the topk_group = %d kept groups (%d)", k,
            c->topk_group, c->topk_group * (E / c->n_group));
    REQUIRE(c->n_group <= 1024, "\"n_group\" must be <= 1024 (got %d)", c->n_group);
    return 0;
}

static int vision_validate(const ModelConfig *c, char *err, size_t err_len)
{
    const VisionConfig *v = &c->vision_config;
    if (!config_vision(c)) {
        REQUIRE(c->image_token_index == -1, "\"image_token_index\" needs a \"vision_config\"");
        return 0;
    }
    REQUIRE(c->image_token_index >= 0 && c->image_token_index < c->vocab_size,
            "\"image_token_index\" must be a token id in [0, vocab_size = %d) with a vision_config (got %d)",
            c->vocab_size, c->image_token_index);
    REQUIRE(v->image_size % v->patch_size == 0, "vision_config.patch_size (%d) must divide image_size (%d)",
            v->patch_size, v->image_size);
    REQUIRE(v->hidden_size % v->num_attention_heads == 0 && v->hidden_size / v->num_attention_heads <= 256,
            "vision_config.num_attention_heads (%d) must divide hidden_size (%d) into heads of at most 256",
            v->num_attention_heads, v->hidden_size);
    REQUIRE((long long)v->image_size * v->image_size <= 4096LL * 4096 && 3LL * v->patch_size * v->patch_size <= INT_MAX,
            "vision_config.image_size %d is over 4096", v->image_size);
    REQUIRE((long long)v->hidden_size * v->intermediate_size <= INT_MAX,
            "vision_config hidden_size x intermediate_size exceeds %d", INT_MAX);
    return 0;
}

int config_validate(const ModelConfig *c, char *err, size_t err_len)
{
    REQUIRE(c->vocab_size >= 1, "\"vocab_size\" must be >= 1 (got %d)", c->vocab_size);
    REQUIRE(c->hidden_size >= 1, "\"hidden_size\" must be >= 1 (got %d)", c->hidden_size);
    REQUIRE(c->num_hidden_layers >= 1, "\"num_hidden_layers\" must be >= 1 (got %d)", c->num_hidden_layers);
    REQUIRE(c->num_attention_heads >= 1, "\"num_attention_heads\" must be >= 1 (got %d)", c->num_attention_heads);
    REQUIRE(c->num_key_value_heads >= 1, "\"num_key_value_heads\" must be >= 1 (got %d)", c->num_key_value_heads);
    REQUIRE(c->num_attention_heads % c->num_key_value_heads == 0,
            "\"num_attention_heads\" (%d) must be a multiple of \"num_key_value_heads\" (%d)",
            c->num_attention_heads, c->num_key_value_heads);
    if (mla_validate(c, err, err_len)) return -1;   /* first: head_dim derives from qk_rope_head_dim */
    REQUIRE(c->head_dim >= 2 && c->head_dim % 2 == 0 && c->head_dim <= 256,
            "\"head_dim\" must be even and in [2, 256] (got %d)", c->head_dim);
    REQUIRE(c->first_k_dense_replace >= 0 && c->first_k_dense_replace <= c->num_hidden_layers,
            "\"first_k_dense_replace\" must be in [0, num_hidden_layers] (got %d)", c->first_k_dense_replace);
    REQUIRE(c->intermediate_size >= 0 && c->moe_intermediate_size >= 0,
            "\"intermediate_size\" and \"moe_intermediate_size\" must be in [0, %d] (their defaults, 4 and 2 "
            "times hidden_size, must fit too)", INT_MAX);
    REQUIRE(c->decoder_sparse_step >= 1, "\"decoder_sparse_step\" must be >= 1 (got %d)", c->decoder_sparse_step);
    REQUIRE(c->moe_layer_freq >= 1, "\"moe_layer_freq\" must be >= 1 (got %d)", c->moe_layer_freq);
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        REQUIRE(c->mlp_only_layers[i] < c->num_hidden_layers,
                "\"mlp_only_layers\" names layer %d, the model has %d (0..%d)", c->mlp_only_layers[i],
                c->num_hidden_layers, c->num_hidden_layers - 1);
    REQUIRE(c->sliding_window >= 0, "\"sliding_window\" must be >= 1 or null (got %d)", c->sliding_window);
    REQUIRE(c->max_window_layers >= 0, "\"max_window_layers\" must be >= 0 (got %d)", c->max_window_layers);
    REQUIRE(c->n_layer_types == 0 || c->n_layer_types == c->num_hidden_layers,
            "\"layer_types\" lists %d layers, the model has %d", c->n_layer_types, c->num_hidden_layers);
    const int n_moe = config_n_moe_layers(c);
    REQUIRE(n_moe == c->num_hidden_layers || c->intermediate_size >= 1,
            "\"intermediate_size\" must be >= 1 when there are dense layers (got %d)", c->intermediate_size);
    REQUIRE(c->clip_qkv >= 0 && isfinite(c->clip_qkv), "\"clip_qkv\" must be >= 0 (0: off)");
    bool any_moe = n_moe > 0;
    if (any_moe) {
        REQUIRE(c->num_local_experts >= 1, "\"num_local_experts\" must be >= 1 (got %d)", c->num_local_experts);
        REQUIRE(c->num_experts_per_tok >= 1 && c->num_experts_per_tok <= c->num_local_experts,
                "\"num_experts_per_tok\" (%d) must be in [1, num_local_experts = %d]",
                c->num_experts_per_tok, c->num_local_experts);
        REQUIRE(c->moe_intermediate_size >= 1, "\"moe_intermediate_size\" must be >= 1 (got %d)",
                c->moe_intermediate_size);
        REQUIRE(c->n_shared_experts >= 0, "\"n_shared_experts\" must be >= 0 (got %d)", c->n_shared_experts);
        REQUIRE(c->shared_expert_intermediate_size >= 0,
                "\"shared_expert_intermediate_size\" must be >= 0 (got %d)", c->shared_expert_intermediate_size);
        REQUIRE(!c->shared_expert_gate || config_shared_width(c) > 0,
                "\"shared_expert_gate\" needs a shared expert (n_shared_experts or shared_expert_intermediate_size > 0)");
        if (router_validate(c, err, err_len)) return -1;
    }
    REQUIRE(c->rope_theta > 0, "\"rope_theta\" must be > 0");
    REQUIRE(c->rms_norm_eps > 0 && c->rms_norm_eps < 1, "\"rms_norm_eps\" must be in (0, 1)");
    REQUIRE(c->max_position_embeddings >= 1 && c->max_position_embeddings <= (1 << 20),
            "\"max_position_embeddings\" must be in [1, 1048576] (got %d)", c->max_position_embeddings);
    REQUIRE(c->router_aux_loss_coef >= 0, "\"router_aux_loss_coef\" must be >= 0");
    REQUIRE(c->router_z_loss_coef >= 0, "\"router_z_loss_coef\" must be >= 0");
    /* What the build can address.  A GEMM dimension is an int (cblas):
     * rows and columns of every weight matrix, one expert at a time (the
     * stacked [E, F, d] tensors are never one GEMM operand), so the
     * products of config values that form one (H*hd, Hkv*hd, the shared
     * experts' F*S) must fit.  Every tensor and slab is counted in size_t
     * floats: the whole model, with gradients, moments and packed copies,
     * stays far below 2^64 bytes when it has at most 2^58 parameters. */
    const long long qd = (long long)c->num_attention_heads * c->head_dim;
    const long long kvd = (long long)c->num_key_value_heads * c->head_dim;
    const long long sd = c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size
                         : (long long)c->moe_intermediate_size * c->n_shared_experts;
    REQUIRE(qd <= INT_MAX, "num_attention_heads x head_dim = %lld exceeds %d (a matrix dimension)", qd, INT_MAX);
    REQUIRE(kvd <= INT_MAX, "num_key_value_heads x head_dim = %lld exceeds %d (a matrix dimension)", kvd, INT_MAX);
    REQUIRE(!any_moe || sd <= INT_MAX, "the shared experts' width %lld exceeds %d (a matrix dimension)",
            sd, INT_MAX);
    if (vision_validate(c, err, err_len)) return -1;
    const double n = param_count_f64(c);
    REQUIRE(n <= 0x1p58, "the model has %.4g parameters; this build addresses at most 2^58", n);
    return 0;
}

void *config_rope_scaling_json(const RopeScaling *r)
{
    if (r->type == ROPE_SCALING_NONE) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", r->type == ROPE_SCALING_LINEAR ? "linear" : "yarn");
    cJSON_AddNumberToObject(o, "factor", r->factor);
    if (r->type == ROPE_SCALING_LINEAR) return o;
    if (r->original_max_position_embeddings)
        cJSON_AddNumberToObject(o, "original_max_position_embeddings", r->original_max_position_embeddings);
    if (r->beta_fast != 0) cJSON_AddNumberToObject(o, "beta_fast", r->beta_fast);
    if (r->beta_slow != 0) cJSON_AddNumberToObject(o, "beta_slow", r->beta_slow);
    if (r->mscale != 0) cJSON_AddNumberToObject(o, "mscale", r->mscale);
    if (r->mscale_all_dim != 0) cJSON_AddNumberToObject(o, "mscale_all_dim", r->mscale_all_dim);
    if (r->attention_factor != 0) cJSON_AddNumberToObject(o, "attention_factor", r->attention_factor);
    if (r->no_truncate) cJSON_AddFalseToObject(o, "truncate");
    return o;
}

char *config_to_json(const ModelConfig *c)
{
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; i < N_KEYS; i++) {
        const void *src = (const char *)c + g_keys[i].off;
        switch (g_keys[i].kind) {
        case K_INT: cJSON_AddNumberToObject(o, g_keys[i].name, *(const int *)src); break;
        case K_NUM: cJSON_AddNumberToObject(o, g_keys[i].name, *(const double *)src); break;
        case K_BOOL: cJSON_AddBoolToObject(o, g_keys[i].name, *(const bool *)src); break;
        case K_QKNORM: cJSON_AddStringToObject(o, g_keys[i].name, g_qk_norm_names[*(const QkNorm *)src]); break;
        case K_ENUM: cJSON_AddStringToObject(o, g_keys[i].name, g_keys[i].names[*(const int *)src]); break;
        case K_LAYERS:
            cJSON_AddItemToObject(o, g_keys[i].name, cJSON_CreateIntArray(c->mlp_only_layers, c->n_mlp_only_layers));
            break;
        case K_ROPESCALING:
            cJSON_AddItemToObject(o, g_keys[i].name, config_rope_scaling_json(&c->rope_scaling));
            break;
        case K_WINDOW:
            if (c->sliding_window) cJSON_AddNumberToObject(o, g_keys[i].name, c->sliding_window);
            else cJSON_AddNullToObject(o, g_keys[i].name);
            break;
        case K_LAYER_TYPES:
            if (!c->n_layer_types) {
                cJSON_AddNullToObject(o, g_keys[i].name);
                break;
            }
            cJSON *a = cJSON_AddArrayToObject(o, g_keys[i].name);
            for (int l = 0; l < c->n_layer_types; l++)
                cJSON_AddItemToArray(a, cJSON_CreateString(c->layer_sliding[l] ? "sliding_attention" : "full_attention"));
            break;
        case K_VISION: cJSON_AddItemToObject(o, g_keys[i].name, vision_json(&c->vision_config)); break;
        }
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *out = td_strdup(s);
    cJSON_free(s);
    return out;
}

int config_layer_window(const ModelConfig *c, int l)
{
    if (!c->sliding_window || !c->use_sliding_window) return 0;
    const bool slides = c->n_layer_types ? c->layer_sliding[l] : l >= c->max_window_layers;
    return slides ? c->sliding_window : 0;
}

bool config_layer_is_moe(const ModelConfig *c, int l)
{
    if (l < c->first_k_dense_replace || (l + 1) % c->decoder_sparse_step != 0) return false;
    if (l % c->moe_layer_freq != 0) return false;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == l) return false;
    return true;
}

int config_n_moe_layers(const ModelConfig *c)
{
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += config_layer_is_moe(c, l);
    return n;
}

/* Weights of the attention block's products (q, k, v, o). */
static size_t layer_attn_matrices(const ModelConfig *c)
{
    if (config_mla(c)) return (size_t)mla_attn_f64(c, false);   /* bounded by config_validate */
    size_t d = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    size_t qo = (size_t)c->num_attention_heads * hd, kv = (size_t)c->num_key_value_heads * hd;
    return 2 * qo * d + 2 * kv * d;
}

/* Vectors of the attention block: the two layer norms, biases, q/k norms. */
static size_t layer_attn_vectors(const ModelConfig *c)
{
    size_t d = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    size_t qo = (size_t)c->num_attention_heads * hd, kv = (size_t)c->num_key_value_heads * hd;
    size_t n = 2 * d;
    if (config_mla(c)) return n + (size_t)c->q_lora_rank + (size_t)c->kv_lora_rank;
    if (config_qkv_bias(c)) n += qo + 2 * kv;
    if (config_o_bias(c)) n += d;
    if (c->qk_norm == QK_NORM_HEAD) n += 2 * hd;
    if (c->qk_norm == QK_NORM_FULL) n += qo + kv;
    return n;
}

size_t config_vision_param_count(const ModelConfig *c)
{
    if (!config_vision(c)) return 0;
    const VisionConfig *v = &c->vision_config;
    const size_t D = (size_t)v->hidden_size, F = (size_t)v->intermediate_size, p = (size_t)v->patch_size;
    const size_t P = (size_t)(v->image_size / v->patch_size) * (size_t)(v->image_size / v->patch_size);
    const size_t d = (size_t)c->hidden_size;
    const size_t layer = 4 * D * D + 4 * D + 2 * D * F + F + D + 4 * D;   /* attention, MLP, two norms */
    return 3 * p * p * D + D + P * D + (size_t)v->num_hidden_layers * layer + 2 * D + d * D + d + d * d + d;
}

size_t config_param_count(const ModelConfig *c)
{
    size_t d = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    size_t n = V * d * (c->tie_word_embeddings ? 1 : 2) + d + config_vision_param_count(c);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        n += layer_attn_matrices(c) + layer_attn_vectors(c);
        if (!config_layer_is_moe(c, l)) {
            n += 3 * (size_t)c->intermediate_size * d;
        } else {
            size_t F = (size_t)c->moe_intermediate_size, E = (size_t)c->num_local_experts;
            n += E * d + E * 3 * F * d + 3 * (size_t)config_shared_width(c) * d;
            if (c->shared_expert_gate) n += d;
            if (config_router_bias(c)) n += E;   /* e_score_correction_bias (state, not trained) */
        }
    }
    return n;
}

size_t config_active_param_count(const ModelConfig *c)
{
    size_t d = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    size_t n = V * d;  /* lm_head product; the embedding lookup is not a product */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        n += layer_attn_matrices(c);
        if (!config_layer_is_moe(c, l)) {
            n += 3 * (size_t)c->intermediate_size * d;
        } else {
            size_t F = (size_t)c->moe_intermediate_size;
            n += (size_t)c->num_local_experts * d + 3 * F * d * (size_t)c->num_experts_per_tok +
                 3 * (size_t)config_shared_width(c) * d;
            if (c->shared_expert_gate) n += d;
        }
    }
    return n;
}

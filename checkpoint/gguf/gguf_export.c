/* checkpoint/gguf/gguf_export.c - tandem checkpoint -> GGUF (gguf_export.h).
 *
 * What each llama.cpp architecture computes was read from the llama.cpp
 * release the peer ships (src/models/{llama,qwen2moe,qwen3moe,olmoe}.cpp,
 * llama-graph.cpp build_qkv / build_moe_ffn, llama-model.cpp
 * llama_model_rope_type and load_hparams); the metadata keys from
 * src/llama-arch.cpp; the tensor types from convert_hf_to_gguf.py
 * (conversion/base.py prepare_tensors: 1-D tensors, norms, biases,
 * ffn_gate_inp and ffn_gate_inp_shexp stay F32; Q8_0 falls back to F16 for
 * a row length that is not a multiple of 32).  docs/gguf.md has the tables.
 *
 * Shapes: a tandem tensor of row-major shape [a, b, c] is GGUF ne = {c, b,
 * a} with the same bytes (ne[0] innermost), so the [out, in] matrices and
 * the [E, F, d] expert stacks are written as they are stored.
 */
#include "checkpoint/gguf/gguf_export.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_q8.h"
#include "core/common.h"
#include "core/dtype.h"
#include "core/model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- architectures */

static const GgufArch ARCHS[] = {
    /*  name     adjacent renorm qk_norm        qkv_b  o_b    shared free_hd k_is_d out_opt exp_ff */
    { "llama",    true,  true,  QK_NORM_NONE, true,  true,  false, true,  false, true,  false },
    { "qwen2moe", false, false, QK_NORM_NONE, true,  false, true,  false, false, false, true },
    { "qwen3moe", false, true,  QK_NORM_HEAD, true,  false, false, true,  false, true,  true },
    { "olmoe",    false, false, QK_NORM_FULL, false, false, false, false, true,  false, false },
};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

static const char *qk_name(QkNorm q) { return q == QK_NORM_HEAD ? "head" : q == QK_NORM_FULL ? "full" : "none"; }

int gguf_arch_for(const ModelConfig *c, const char *want, const GgufArch **arch, const char **why, char *err,
                  size_t err_len)
{
    const GgufArch *a = NULL;
    const int S = config_shared_width(c);
    if (want) {
        for (size_t i = 0; i < N_ARCHS && !a; i++)
            if (!strcmp(ARCHS[i].name, want)) a = &ARCHS[i];
        if (!a) {
            snprintf(err, err_len, "--arch %s: not one of llama, qwen2moe, qwen3moe, olmoe", want);
            return -1;
        }
        *why = "--arch";
    } else if (c->qk_norm == QK_NORM_HEAD) {
        a = &ARCHS[2];
        *why = "qk_norm \"head\", as Qwen3-MoE";
    } else if (c->qk_norm == QK_NORM_FULL) {
        a = &ARCHS[3];
        *why = "qk_norm \"full\", as OLMoE";
    } else if (S > 0) {
        a = &ARCHS[1];
        *why = "a shared expert, as Qwen2-MoE";
    } else {
        a = &ARCHS[0];
        *why = "no q/k norm and no shared expert, as Mixtral";
    }
    *arch = a;
    /* every feature the target cannot express, joined into one line */
    char what[1024] = "";
    size_t k = 0;
#define NO(...) (k += (size_t)snprintf(what + k, sizeof what - td_min(k, sizeof what), "%s", k ? "; " : ""), \
                 k += (size_t)snprintf(what + k, sizeof what - td_min(k, sizeof what), __VA_ARGS__))
    const int hd_default = c->hidden_size / c->num_attention_heads;
    if (config_n_moe_layers(c) != c->num_hidden_layers)
        NO("dense layers (first_k_dense_replace %d, decoder_sparse_step %d, %d mlp_only_layers): its graph makes "
           "every layer MoE", c->first_k_dense_replace, c->decoder_sparse_step, c->n_mlp_only_layers);
    if (c->norm_topk_prob != a->renorm_topk)
        NO("norm_topk_prob=%s: its graph %s the top-k routing weights", c->norm_topk_prob ? "true" : "false",
           a->renorm_topk ? "always renormalises" : "never renormalises");
    if (c->qk_norm != a->qk_norm)
        NO("qk_norm \"%s\": its graph applies qk_norm \"%s\"", qk_name(c->qk_norm), qk_name(a->qk_norm));
    if (config_qkv_bias(c) && !a->qkv_bias)
        NO("%s (q, k, v biases): its graph adds none", c->attention_bias ? "attention_bias" : "qkv_bias");
    if (config_o_bias(c) && !a->o_bias) NO("attention_bias (the o_proj bias): its graph adds none after attn_output");
    if (S > 0 && !a->gated_shared)
        NO("a shared expert (width %d: n_shared_experts / shared_expert_intermediate_size): its graph has none", S);
    if (S == 0 && a->gated_shared) NO("no shared expert: its graph requires a gated shared expert");
    if (S > 0 && a->gated_shared && !c->shared_expert_gate)
        NO("shared_expert_gate=false: its graph always gates the shared expert");
    if (c->head_dim != hd_default && !a->free_head_dim)
        NO("head_dim %d != hidden_size / num_attention_heads = %d: its graph fixes head_dim at hidden_size / heads",
           c->head_dim, hd_default);
    if (a->k_norm_is_d && c->num_key_value_heads != c->num_attention_heads)
        NO("num_key_value_heads %d != num_attention_heads %d: its k norm is hidden_size wide",
           c->num_key_value_heads, c->num_attention_heads);
    if (c->clip_qkv > 0) NO("clip_qkv %g: its graph does not clamp q, k, v", c->clip_qkv);
    if (c->rope_scaling.type != ROPE_SCALING_NONE)
        NO("rope_scaling %s (factor %g): this export writes no RoPE scaling metadata",
           c->rope_scaling.type == ROPE_SCALING_YARN ? "yarn" : "linear", c->rope_scaling.factor);
    if (config_vision(c)) NO("a vision tower (vision_config): this export writes the language model's graph only");
    if (c->scoring_func != ROUTER_SOFTMAX || c->topk_method != TOPK_GREEDY)
        NO("the sigmoid / group-limited router (scoring_func, topk_method): its graph routes by softmax top-k");
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (config_layer_window(c, l)) {
            NO("sliding_window %d (layer %d): this export writes no sliding-window metadata", c->sliding_window, l);
            break;
        }
#undef NO
    if (k) {
        snprintf(err, err_len, "llama.cpp's %s architecture (chosen by %s) cannot express: %s", a->name, *why, what);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- tensor map */

typedef enum { K_MATRIX, K_F32 } Kind;            /* matrices take the export type; the rest F32 */
typedef enum { X_NONE, X_PERM_Q, X_PERM_K, X_FLAT } Xform;

typedef struct {
    const char *src;    /* tandem dataset (after model/layers/{i}/ for layer tensors) */
    const char *dst;    /* GGUF tensor (after blk.{i}.) */
    Kind kind;
    Xform x;            /* X_PERM_*: rows permuted under adjacent-pair RoPE; X_FLAT: [1, d] -> [d] */
} TMap;

static const TMap GLOBAL_MAP[] = {
    { "model/embed_tokens", "token_embd.weight", K_MATRIX, X_NONE },
    { "model/norm", "output_norm.weight", K_F32, X_NONE },
    { "lm_head", "output.weight", K_MATRIX, X_NONE },
};

/* Dense FFN tensors are absent on purpose: no architecture here has dense
 * layers among MoE ones (gguf_arch_for refuses them first). */
static const TMap LAYER_MAP[] = {
    { "input_layernorm", "attn_norm.weight", K_F32, X_NONE },
    { "self_attn/q_proj", "attn_q.weight", K_MATRIX, X_PERM_Q },
    { "self_attn/k_proj", "attn_k.weight", K_MATRIX, X_PERM_K },
    { "self_attn/v_proj", "attn_v.weight", K_MATRIX, X_NONE },
    { "self_attn/o_proj", "attn_output.weight", K_MATRIX, X_NONE },
    { "self_attn/q_proj.bias", "attn_q.bias", K_F32, X_PERM_Q },
    { "self_attn/k_proj.bias", "attn_k.bias", K_F32, X_PERM_K },
    { "self_attn/v_proj.bias", "attn_v.bias", K_F32, X_NONE },
    { "self_attn/o_proj.bias", "attn_output.bias", K_F32, X_NONE },
    { "self_attn/q_norm", "attn_q_norm.weight", K_F32, X_NONE },
    { "self_attn/k_norm", "attn_k_norm.weight", K_F32, X_NONE },
    { "post_attention_layernorm", "ffn_norm.weight", K_F32, X_NONE },
    { "mlp/gate", "ffn_gate_inp.weight", K_F32, X_NONE },
    { "mlp/experts/gate_proj", "ffn_gate_exps.weight", K_MATRIX, X_NONE },
    { "mlp/experts/up_proj", "ffn_up_exps.weight", K_MATRIX, X_NONE },
    { "mlp/experts/down_proj", "ffn_down_exps.weight", K_MATRIX, X_NONE },
    { "mlp/shared_experts/gate_proj", "ffn_gate_shexp.weight", K_MATRIX, X_NONE },
    { "mlp/shared_experts/up_proj", "ffn_up_shexp.weight", K_MATRIX, X_NONE },
    { "mlp/shared_experts/down_proj", "ffn_down_shexp.weight", K_MATRIX, X_NONE },
    { "mlp/shared_expert_gate", "ffn_gate_inp_shexp.weight", K_F32, X_FLAT },
};

typedef struct {
    char src[CKPT_NAME_MAX];
    char dst[64];
    int n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    GgmlType type;
    Xform x;            /* resolved: X_NONE unless the architecture permutes */
    size_t heads;       /* X_PERM_*: heads of the rows */
    size_t numel;
    bool q8;            /* the dataset is int8 g32 (an int8 checkpoint) */
} Planned;

static const TMap *find_map(const TMap *m, size_t n, const char *src)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m[i].src, src)) return &m[i];
    return NULL;
}

static const CkptTensor *find_ds(const CkptInfo *in, const char *name)
{
    for (int i = 0; i < in->n_tensors; i++)
        if (!strcmp(in->tensors[i].name, name)) return &in->tensors[i];
    return NULL;
}

static bool is_weight_ds(const char *name) { return !strncmp(name, "model/", 6) || !strcmp(name, "lm_head"); }

/* One tensor of the plan from a dataset of shape (shape, ndim). */
static int plan_one(Planned *p, const char *src, const size_t *shape, int ndim, const char *in, const GgufArch *a,
                    const ModelConfig *c, GgufOutType dt, int *n_fallback, char *err, size_t err_len)
{
    memset(p, 0, sizeof *p);
    const TMap *m;
    int layer = -1, used = 0;
    if (sscanf(src, "model/layers/%d/%n", &layer, &used) == 1 && used > 0) {
        m = find_map(LAYER_MAP, sizeof LAYER_MAP / sizeof LAYER_MAP[0], src + used);
        if (m) snprintf(p->dst, sizeof p->dst, "blk.%d.%s", layer, m->dst);
    } else {
        m = find_map(GLOBAL_MAP, sizeof GLOBAL_MAP / sizeof GLOBAL_MAP[0], src);
        if (m) snprintf(p->dst, sizeof p->dst, "%s", m->dst);
    }
    if (!m) {
        snprintf(err, err_len, "%s: dataset /%s has no tensor in llama.cpp's %s architecture", in, src, a->name);
        return -1;
    }
    snprintf(p->src, sizeof p->src, "%s", src);
    p->numel = 1;
    for (int i = 0; i < ndim; i++) p->numel *= shape[i];
    if (m->x == X_FLAT) {
        p->n_dims = 1;
        p->ne[0] = p->numel;
    } else {
        p->n_dims = ndim;
        for (int i = 0; i < ndim; i++) p->ne[i] = shape[ndim - 1 - i];
    }
    if (m->x == X_PERM_Q || m->x == X_PERM_K) {
        p->heads = (size_t)(m->x == X_PERM_Q ? c->num_attention_heads : c->num_key_value_heads);
        TD_CHECK(shape[0] == p->heads * (size_t)c->head_dim, "gguf: %s has %zu rows", src, shape[0]);
        p->x = a->rope_adjacent ? m->x : X_NONE;
    }
    p->type = GGML_TYPE_F32;
    if (m->kind == K_MATRIX && dt == GGUF_OUT_F16) p->type = GGML_TYPE_F16;
    if (m->kind == K_MATRIX && dt == GGUF_OUT_Q8_0) {
        if (p->ne[0] % DTYPE_Q8_0_BLOCK == 0) {
            p->type = GGML_TYPE_Q8_0;
        } else {
            p->type = GGML_TYPE_F16;
            (*n_fallback)++;
        }
    }
    return 0;
}

/* The tensors of the export, in the model's order: every weight dataset
 * the config defines (model_param_table) must be in the file with its
 * shape, and every weight dataset of the file must be one of them. */
static int plan_all(const char *in, const CkptInfo *info, const ModelConfig *c, const GgufArch *a, GgufOutType dt,
                    Planned **out, int *n_out, int *n_fallback, char *err, size_t err_len)
{
    Topology single;
    topo_single(&single, c);
    Param *params;
    int n = model_param_table(c, &single, &params);
    Planned *pl = td_calloc(((size_t)n + 1) * sizeof *pl);
    int k = 0, rc = -1;
    bool has_head = false;
    for (int i = 0; i < n; i++) {
        const Param *p = &params[i];
        if (p->tied_copy) continue;
        const CkptTensor *t = find_ds(info, p->name);
        if (!t) {
            snprintf(err, err_len, "%s: dataset /%s is missing", in, p->name);
            goto out;
        }
        bool same = t->ndim == p->ndim;
        for (int d = 0; d < p->ndim && same; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            snprintf(err, err_len, "%s: dataset /%s does not have the shape the config gives it", in, p->name);
            goto out;
        }
        if (plan_one(&pl[k], p->name, p->shape, p->ndim, in, a, c, dt, n_fallback, err, err_len)) goto out;
        pl[k].q8 = !strcmp(t->dtype, "int8");
        has_head |= !strcmp(p->name, "lm_head");
        k++;
    }
    for (int i = 0; i < info->n_tensors; i++) {
        const char *name = info->tensors[i].name;
        if (!is_weight_ds(name)) continue;
        bool known = false;
        for (int j = 0; j < n && !known; j++) known = !strcmp(params[j].name, name);
        /* an int8 tensor's scales: read with it */
        const size_t len = strlen(name);
        if (!known && len > 6 && !strcmp(name + len - 6, ".scale")) {
            char base[CKPT_NAME_MAX];
            snprintf(base, sizeof base, "%.*s", (int)(len - 6), name);
            const CkptTensor *b = find_ds(info, base);
            for (int j = 0; j < n && !known; j++) known = b && !strcmp(b->dtype, "int8") && !strcmp(params[j].name, base);
        }
        if (!known) {
            snprintf(err, err_len, "%s: dataset /%s is not a tensor of the model config", in, name);
            goto out;
        }
    }
    if (!has_head && !a->output_optional) {
        /* tied embeddings under an architecture that always reads
         * output.weight: the embedding again, bit for bit */
        const CkptTensor *e = find_ds(info, "model/embed_tokens");
        if (plan_one(&pl[k], "model/embed_tokens", e->shape, e->ndim, in, a, c, dt, n_fallback, err, err_len))
            goto out;
        pl[k].q8 = !strcmp(e->dtype, "int8");
        snprintf(pl[k].dst, sizeof pl[k].dst, "output.weight");
        k++;
    }
    *out = pl;
    *n_out = k;
    pl = NULL;
    rc = 0;
out:
    td_free(pl);
    td_free(params);
    return rc;
}

/* ---------------------------------------------------------------- metadata */

static void put_hparams(GgufWriter *w, const GgufArch *a, const ModelConfig *c, GgufOutType dt, const char *name)
{
    /* llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7 */
    const uint32_t ftype = dt == GGUF_OUT_F32 ? 0 : dt == GGUF_OUT_F16 ? 1 : 7;
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, a->name), key)
    gguf_kv_str(w, "general.architecture", a->name, strlen(a->name));
    gguf_kv_str(w, "general.name", name, strlen(name));
    gguf_kv_u32(w, "general.file_type", ftype);
    gguf_kv_u32(w, "general.quantization_version", 2);   /* GGML_QNT_VERSION */
    gguf_kv_u32(w, KEY("vocab_size"), (uint32_t)c->vocab_size);
    gguf_kv_u32(w, KEY("context_length"), (uint32_t)c->max_position_embeddings);
    gguf_kv_u32(w, KEY("embedding_length"), (uint32_t)c->hidden_size);
    gguf_kv_u32(w, KEY("block_count"), (uint32_t)c->num_hidden_layers);
    gguf_kv_u32(w, KEY("feed_forward_length"),
                (uint32_t)(a->expert_ff_key ? c->intermediate_size : c->moe_intermediate_size));
    if (a->expert_ff_key) gguf_kv_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size);
    if (a->gated_shared) gguf_kv_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)config_shared_width(c));
    gguf_kv_u32(w, KEY("attention.head_count"), (uint32_t)c->num_attention_heads);
    gguf_kv_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->num_key_value_heads);
    gguf_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)c->rms_norm_eps);
    gguf_kv_f32(w, KEY("rope.freq_base"), (float)c->rope_theta);
    gguf_kv_u32(w, KEY("rope.dimension_count"), (uint32_t)c->head_dim);
    if (c->head_dim * c->num_attention_heads != c->hidden_size) {
        gguf_kv_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
        gguf_kv_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    gguf_kv_u32(w, KEY("expert_count"), (uint32_t)c->num_local_experts);
    gguf_kv_u32(w, KEY("expert_used_count"), (uint32_t)c->num_experts_per_tok);
#undef KEY
}

/* ---------------------------------------------------------------- data */

/* Rotate-half -> adjacent pairs, per head (llama.cpp's converter,
 * LlamaModel.permute): row h*hd + 2i + j takes row h*hd + j*hd/2 + i,
 * for i < hd/2, j in {0, 1}.  x: heads * hd rows of row_bytes each
 * (float weights, int8 values or their scales), permuted in place. */
static void permute_rows(void *x, size_t heads, size_t hd, size_t row_bytes)
{
    unsigned char *b = x, *tmp = td_malloc(hd * row_bytes);
    const size_t half = hd / 2;
    for (size_t h = 0; h < heads; h++) {
        unsigned char *blk = b + h * hd * row_bytes;
        for (size_t i = 0; i < half; i++)
            for (size_t j = 0; j < 2; j++) memcpy(tmp + (2 * i + j) * row_bytes, blk + (j * half + i) * row_bytes, row_bytes);
        memcpy(blk, tmp, hd * row_bytes);
    }
    td_free(tmp);
}

#define STAGE 65536   /* elements converted per write (a multiple of 32) */

/* An int8 g32 tensor as Q8_0 (K a multiple of 32): each group's 32 values
 * as they are, its float32 scale rounded to float16 (Q8_0's d). */
static int write_q8_direct(GgufWriter *w, const char *in, const Planned *p, const ModelConfig *c, char *err,
                           size_t err_len)
{
    int8_t *q;
    float *sc;
    size_t rows, K;
    if (ckpt_read_q8_tensor(in, p->src, &q, &sc, &rows, &K, err, err_len)) return -1;
    TD_CHECK(rows * K == p->numel && K % DTYPE_Q8_0_BLOCK == 0, "gguf: %s: %zu x %zu int8, planned %zu", p->src, rows,
             K, p->numel);
    const size_t G = K / DTYPE_Q8_0_BLOCK;
    if (p->x == X_PERM_Q || p->x == X_PERM_K) {
        const size_t hd = (size_t)c->head_dim;
        permute_rows(q, p->heads, hd, K * rows / (p->heads * hd));
        permute_rows(sc, p->heads, hd, G * sizeof(float) * rows / (p->heads * hd));
    }
    uint8_t *buf = td_malloc(G * DTYPE_Q8_0_BYTES);
    int rc = 0;
    for (size_t r = 0; r < rows && !rc; r++) {
        for (size_t g = 0; g < G; g++) {
            uint8_t *blk = buf + g * DTYPE_Q8_0_BYTES;
            const uint16_t h = dtype_f16_from_f32(sc[r * G + g]);
            memcpy(blk, &h, 2);   /* little-endian host */
            memcpy(blk + 2, q + r * K + g * DTYPE_Q8_0_BLOCK, DTYPE_Q8_0_BLOCK);
        }
        rc = gguf_write_tensor(w, buf, G * DTYPE_Q8_0_BYTES, err, err_len);
    }
    td_free(buf);
    td_free(q);
    td_free(sc);
    return rc;
}

static int write_data(GgufWriter *w, const char *in, const Planned *p, const ModelConfig *c, char *err,
                      size_t err_len)
{
    if (p->q8 && p->type == GGML_TYPE_Q8_0) return write_q8_direct(w, in, p, c, err, err_len);
    size_t numel = 0;
    float *x = ckpt_read_tensor(in, p->src, &numel, err, err_len);
    if (!x) return -1;
    TD_CHECK(numel == p->numel, "gguf: %s: %zu elements, planned %zu", p->src, numel, p->numel);
    if (p->x == X_PERM_Q || p->x == X_PERM_K) {
        const size_t hd = (size_t)c->head_dim;
        permute_rows(x, p->heads, hd, numel / (p->heads * hd) * sizeof(float));
    }
    int rc = 0;
    if (p->type == GGML_TYPE_F32) {
        rc = gguf_write_tensor(w, x, numel * sizeof(float), err, err_len);
    } else {
        uint8_t *buf = td_malloc(STAGE / DTYPE_Q8_0_BLOCK * DTYPE_Q8_0_BYTES + STAGE * 2);
        for (size_t at = 0; at < numel && !rc; at += STAGE) {
            size_t n = td_min(STAGE, numel - at), bytes;
            if (p->type == GGML_TYPE_F16) {
                uint16_t *h = (uint16_t *)buf;
                for (size_t i = 0; i < n; i++) h[i] = dtype_f16_from_f32(x[at + i]);
                bytes = n * 2;
            } else {
                dtype_q8_0_from_f32(buf, x + at, n);   /* n is a multiple of 32: the rows are */
                bytes = n / DTYPE_Q8_0_BLOCK * DTYPE_Q8_0_BYTES;
            }
            rc = gguf_write_tensor(w, buf, bytes, err, err_len);
        }
        td_free(buf);
    }
    td_free(x);
    return rc;
}

/* ---------------------------------------------------------------- export */

int gguf_export(const char *in, const char *out, const GgufExportOpts *o, GgufExportReport *rep, char *err,
                size_t err_len)
{
    GgufExportReport dummy;
    if (!rep) rep = &dummy;
    memset(rep, 0, sizeof *rep);
    CkptInfo info;
    if (ckpt_info(in, &info, err, err_len)) return -1;
    const ModelConfig *c = &info.cfg;
    Planned *pl = NULL;
    int n_pl = 0, rc = -1;
    GgufWriter *w = NULL;
    char why[512];
    if (gguf_arch_for(c, o->arch, &rep->arch, &rep->why, why, sizeof why)) {
        snprintf(err, err_len, "%s: %s", in, why);
        goto out;
    }
    if (plan_all(in, &info, c, rep->arch, o->dtype, &pl, &n_pl, &rep->n_f16_fallback, err, err_len)) goto out;
    if (gguf_open(&w, out, err, err_len)) goto out;
    put_hparams(w, rep->arch, c, o->dtype, o->name ? o->name : "tandem");
    if (gguf_vocab_write(w, &o->tok, c->vocab_size, &rep->vocab, why, sizeof why)) {
        snprintf(err, err_len, "%s", why);
        goto out;
    }
    for (int i = 0; i < n_pl; i++) {
        gguf_add_tensor(w, pl[i].dst, pl[i].n_dims, pl[i].ne, pl[i].type);
        rep->data_bytes += gguf_tensor_bytes(pl[i].type, pl[i].n_dims, pl[i].ne);
    }
    if (gguf_begin_data(w, err, err_len)) goto out;
    for (int i = 0; i < n_pl; i++)
        if (write_data(w, in, &pl[i], c, err, err_len)) goto out;
    rc = gguf_close(w, err, err_len);
    w = NULL;
    rep->n_tensors = n_pl;
out:
    gguf_abort(w);
    td_free(pl);
    ckpt_info_free(&info);
    return rc;
}

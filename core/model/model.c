/* core/model/model.c - parameter table, slabs, initialisation and packing
 * (model.h).  The table follows SPEC section 4 path by path. */
#include "core/model/model.h"
#include "core/common.h"
#include "core/model/expert_cache.h"
#include "core/ops/gemm.h"
#include "core/pool.h"
#include "core/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_PARAMS_PER_LAYER 24

/* The role of a matrix (by name). */
static ModelRole name_role(const ModelConfig *cfg, const char *name)
{
    const size_t n = strlen(name);
    if (n >= 8 && !strcmp(name + n - 8, "mlp/gate")) return ROLE_F32;   /* the router */
    if (n >= 22 && !strcmp(name + n - 22, "mlp/shared_expert_gate")) return ROLE_F32;
    if (n >= 19 && !strcmp(name + n - 19, "self_attn/kv_b_proj")) return ROLE_F32;   /* MLA: never packed */
    if (!strcmp(name, "lm_head")) return ROLE_HEAD;
    if (!strcmp(name, "model/embed_tokens")) return cfg->tie_word_embeddings ? ROLE_HEAD : ROLE_EMBED;
    if (strstr(name, "/self_attn/")) return ROLE_ATTN;
    return ROLE_MAT;
}

ModelRole model_param_role(const ModelConfig *cfg, const Param *p)
{
    return p->ndim < 2 ? ROLE_F32 : name_role(cfg, p->name);
}

Dtype *model_role_dtype(ModelDtypes *dt, ModelRole r)
{
    switch (r) {
    case ROLE_MAT:   return &dt->mat;
    case ROLE_EMBED: return &dt->embed;
    case ROLE_HEAD:  return &dt->head;
    case ROLE_ATTN:  return &dt->attn;
    default:         return NULL;
    }
}

static Dtype role_dtype(const ModelConfig *cfg, const ModelDtypes *dt, const char *name)
{
    ModelDtypes c = *dt;
    const Dtype *d = model_role_dtype(&c, name_role(cfg, name));
    return d ? *d : DTYPE_F32;
}

Dtype model_serving_dtype(const ModelConfig *cfg, const ModelDtypes *dt, const Param *p)
{
    return p->ndim < 2 ? DTYPE_F32 : role_dtype(cfg, dt, p->name);
}

/* Appends a Param and computes its local slice.  shape: global.  packed:
 * the forward reads it packed (a serving model then keeps no float32
 * master of it). */
static Param *add(Model *m, const char *name, int ndim, const size_t *shape, int tp_dim,
                  int ep_dim, int layer, bool decay, bool packed)
{
    const Topology *t = &m->topo;
    Param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    TD_CHECK(!td_snprintf(p->name, sizeof p->name, "%s", name), "parameter name %s: over %d bytes", name,
             PARAM_NAME_MAX - 1);
    p->ndim = ndim;
    p->tp_dim = tp_dim;
    p->ep_dim = ep_dim;
    p->layer = layer;
    p->decay = decay;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->lshape[i] = shape[i];
        p->loff[i] = 0;
        if (i == tp_dim) {
            p->lshape[i] = shape[i] / (size_t)t->tp;
            p->loff[i] = p->lshape[i] * (size_t)t->tp_rank;
        }
        if (i == ep_dim) {
            p->lshape[i] = shape[i] / (size_t)t->ep;
            p->loff[i] = p->lshape[i] * (size_t)t->ep_rank;
        }
        p->numel *= p->lshape[i];
    }
    p->n_mats = 1;
    p->dtype = DTYPE_F32;
    p->w = (float *)(uintptr_t)1;   /* has a weight view (fixed up in init) */
    if (packed) {
        /* rows x cols of each packed matrix: the last two dims */
        size_t rows = p->lshape[ndim - 2], cols = p->lshape[ndim - 1];
        p->n_mats = ndim == 3 ? p->lshape[0] : 1;
        p->dtype = m->serving ? role_dtype(&m->cfg, &m->dt, name) : DTYPE_F32;
        p->mat_bytes = gemm_packed_bytes(p->dtype, rows, cols);
        if (m->serving) p->w = NULL;
        if (m->serving && m->experts_offloaded && ndim == 3) {   /* a routed expert stack: in the cache */
            p->offloaded = true;
            p->offset = m->n_w;
            return p;
        }
        p->packed = (unsigned char *)(uintptr_t)(m->n_packed + 1);  /* offset + 1, fixed up later */
        m->n_packed += p->n_mats * p->mat_bytes;
    }
    p->offset = m->n_w;
    if (p->w) m->n_w += td_round_up(p->numel, 16);   /* keep every view 64-byte aligned */
    return p;
}

void param_partition(const Param *p, const Topology *t, char *out, size_t out_len)
{
    char buf[64] = "";
    if (t->pp > 1) strcat(buf, "pp");   /* every tensor lives on one stage */
    if (p->ep_dim >= 0 && t->ep > 1)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%sep:%d", buf[0] ? "," : "", p->ep_dim);
    if (p->tp_dim >= 0 && t->tp > 1)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%stp:%d", buf[0] ? "," : "", p->tp_dim);
    snprintf(out, out_len, "%s", buf[0] ? buf : "replicated");
}

/* "model/layers/<l>/<s>": at most 53 bytes ("mlp/shared_experts/gate_proj"
 * after 10 digits), well within PARAM_NAME_MAX. */
static const char *layer_name(char *n, size_t cap, int l, const char *s)
{
    TD_CHECK(!td_snprintf(n, cap, "model/layers/%d/%s", l, s), "layer %d: name of %s over %zu bytes", l, s, cap - 1);
    return n;
}

/* The attention tensors of an MLA layer (model.h, DSV3.md): heads split
 * over tp (q_b_proj / q_proj and kv_b_proj by rows, o_proj by columns),
 * the low-rank down projections and their norms replicated. */
static void mla_params(Model *m, int l)
{
    const ModelConfig *c = &m->cfg;
    const size_t d = (size_t)c->hidden_size, H = (size_t)c->num_attention_heads, qr = (size_t)c->q_lora_rank;
    const size_t r = (size_t)c->kv_lora_rank, rope = (size_t)c->qk_rope_head_dim;
    const size_t qk = (size_t)c->qk_nope_head_dim + rope, nv = (size_t)c->qk_nope_head_dim + (size_t)c->v_head_dim;
    Layer *L = &m->layers[l];
    char n[PARAM_NAME_MAX];
#define NAME(s) layer_name(n, sizeof n, l, s)
    if (qr > 0) {
        L->qa = add(m, NAME("self_attn/q_a_proj"), 2, (size_t[]){ qr, d }, -1, -1, l, true, true);
        L->qan = add(m, NAME("self_attn/q_a_layernorm"), 1, (size_t[]){ qr }, -1, -1, l, false, false);
        L->q = add(m, NAME("self_attn/q_b_proj"), 2, (size_t[]){ H * qk, qr }, 0, -1, l, true, true);
    } else {
        L->q = add(m, NAME("self_attn/q_proj"), 2, (size_t[]){ H * qk, d }, 0, -1, l, true, true);
    }
    L->kva = add(m, NAME("self_attn/kv_a_proj_with_mqa"), 2, (size_t[]){ r + rope, d }, -1, -1, l, true, true);
    L->kvan = add(m, NAME("self_attn/kv_a_layernorm"), 1, (size_t[]){ r }, -1, -1, l, false, false);
    L->kvb = add(m, NAME("self_attn/kv_b_proj"), 2, (size_t[]){ H * nv, r }, 0, -1, l, true, false);
    L->o = add(m, NAME("self_attn/o_proj"), 2, (size_t[]){ d, H * (size_t)c->v_head_dim }, 1, -1, l, true, true);
#undef NAME
}

static void layer_params(Model *m, int l)
{
    const ModelConfig *c = &m->cfg;
    const size_t d = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    const size_t H = (size_t)c->num_attention_heads, Hkv = (size_t)c->num_key_value_heads;
    Layer *L = &m->layers[l];
    char n[PARAM_NAME_MAX];
#define NAME(s) layer_name(n, sizeof n, l, s)
    L->ln1 = add(m, NAME("input_layernorm"), 1, (size_t[]){ d }, -1, -1, l, false, false);
    if (config_mla(c)) {
        mla_params(m, l);
    } else {
        L->q = add(m, NAME("self_attn/q_proj"), 2, (size_t[]){ H * hd, d }, 0, -1, l, true, true);
        L->k = add(m, NAME("self_attn/k_proj"), 2, (size_t[]){ Hkv * hd, d }, 0, -1, l, true, true);
        L->v = add(m, NAME("self_attn/v_proj"), 2, (size_t[]){ Hkv * hd, d }, 0, -1, l, true, true);
        L->o = add(m, NAME("self_attn/o_proj"), 2, (size_t[]){ d, H * hd }, 1, -1, l, true, true);
        /* biases and norms: vectors, no weight decay; q/k/v ones split with
         * their rows, the o bias added once after the all-reduce (replicated) */
        if (config_qkv_bias(c)) {
            L->qb = add(m, NAME("self_attn/q_proj.bias"), 1, (size_t[]){ H * hd }, 0, -1, l, false, false);
            L->kb = add(m, NAME("self_attn/k_proj.bias"), 1, (size_t[]){ Hkv * hd }, 0, -1, l, false, false);
            L->vb = add(m, NAME("self_attn/v_proj.bias"), 1, (size_t[]){ Hkv * hd }, 0, -1, l, false, false);
        }
        if (config_o_bias(c))
            L->ob = add(m, NAME("self_attn/o_proj.bias"), 1, (size_t[]){ d }, -1, -1, l, false, false);
        if (c->qk_norm == QK_NORM_HEAD) {
            /* one [hd] weight shared by every head: replicated */
            L->qn = add(m, NAME("self_attn/q_norm"), 1, (size_t[]){ hd }, -1, -1, l, false, false);
            L->kn = add(m, NAME("self_attn/k_norm"), 1, (size_t[]){ hd }, -1, -1, l, false, false);
        } else if (c->qk_norm == QK_NORM_FULL) {
            L->qn = add(m, NAME("self_attn/q_norm"), 1, (size_t[]){ H * hd }, 0, -1, l, false, false);
            L->kn = add(m, NAME("self_attn/k_norm"), 1, (size_t[]){ Hkv * hd }, 0, -1, l, false, false);
        }
    }
    L->ln2 = add(m, NAME("post_attention_layernorm"), 1, (size_t[]){ d }, -1, -1, l, false, false);
    L->moe = config_layer_is_moe(c, l);
    L->window = (size_t)config_layer_window(c, l);
    if (!L->moe) {
        const size_t Fd = (size_t)c->intermediate_size;
        L->gate = add(m, NAME("mlp/gate_proj"), 2, (size_t[]){ Fd, d }, 0, -1, l, true, true);
        L->up = add(m, NAME("mlp/up_proj"), 2, (size_t[]){ Fd, d }, 0, -1, l, true, true);
        L->down = add(m, NAME("mlp/down_proj"), 2, (size_t[]){ d, Fd }, 1, -1, l, true, true);
    } else {
        const size_t E = (size_t)c->num_local_experts, F = (size_t)c->moe_intermediate_size;
        L->router = add(m, NAME("mlp/gate"), 2, (size_t[]){ E, d }, -1, -1, l, true, true);
        if (config_router_bias(c)) {   /* replicated like the router; moved by train/'s bias update */
            L->rbias = add(m, NAME("mlp/gate.e_score_correction_bias"), 1, (size_t[]){ E }, -1, -1, l, false, false);
            L->rbias->state = true;
        }
        L->egate = add(m, NAME("mlp/experts/gate_proj"), 3, (size_t[]){ E, F, d }, 1, 0, l, true, true);
        L->eup = add(m, NAME("mlp/experts/up_proj"), 3, (size_t[]){ E, F, d }, 1, 0, l, true, true);
        L->edown = add(m, NAME("mlp/experts/down_proj"), 3, (size_t[]){ E, d, F }, 2, 0, l, true, true);
        const size_t S = (size_t)config_shared_width(c);
        if (S > 0) {
            L->sgate = add(m, NAME("mlp/shared_experts/gate_proj"), 2, (size_t[]){ S, d }, 0, -1, l, true, true);
            L->sup = add(m, NAME("mlp/shared_experts/up_proj"), 2, (size_t[]){ S, d }, 0, -1, l, true, true);
            L->sdown = add(m, NAME("mlp/shared_experts/down_proj"), 2, (size_t[]){ d, S }, 1, -1, l, true, true);
        }
        if (S > 0 && c->shared_expert_gate)
            L->sgw = add(m, NAME("mlp/shared_expert_gate"), 2, (size_t[]){ 1, d }, -1, -1, l, true, false);
    }
#undef NAME
}

/* The vision tower and projector (vision.h, docs/vision.md): on the first
 * stage, layer -1 (with the embedding).  Heads, fc1 rows and the
 * projector's linear_1 rows split over tp (their biases with them); the
 * row-parallel o, fc2 and linear_2 split their columns, their biases are
 * replicated (added after the sum). */
/* n = the formatted name (at most 66 bytes: "vision_tower/vision_model/encoder/layers/<10
 * digits>/self_attn/out_proj.bias"), within PARAM_NAME_MAX. */
static const char *vision_name(char *n, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *vision_name(char *n, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(n, cap, fmt, ap);
    va_end(ap);
    TD_CHECK(k >= 0 && (size_t)k < cap, "vision parameter name %s: over %zu bytes", n, cap - 1);
    return n;
}

static void vision_params(Model *m)
{
    const ModelConfig *c = &m->cfg;
    const VisionConfig *vc = &c->vision_config;
    VisionTower *t = &m->vis;
    const size_t D = (size_t)vc->hidden_size, F = (size_t)vc->intermediate_size, d = (size_t)c->hidden_size;
    const size_t tp = (size_t)m->topo.tp;
    t->n_layers = vc->num_hidden_layers;
    t->D = D;
    t->F = F / tp;
    t->H = (size_t)vc->num_attention_heads / tp;
    t->hd = D / (size_t)vc->num_attention_heads;
    t->S = (size_t)vc->image_size;
    t->p = (size_t)vc->patch_size;
    t->P = (t->S / t->p) * (t->S / t->p);
    t->K = 3 * t->p * t->p;
    t->dp = d / tp;
    t->eps = (float)vc->layer_norm_eps;
    TD_CHECK(vc->num_attention_heads % m->topo.tp == 0 && F % tp == 0 && d % tp == 0,
             "vision tower: heads %d, intermediate_size %zu and the projector's %zu must divide by tp = %d",
             vc->num_attention_heads, F, d, m->topo.tp);
    t->layers = td_calloc((size_t)t->n_layers * sizeof(VisionLayer));
    char n[PARAM_NAME_MAX];
#define VNAME(...) vision_name(n, sizeof n, __VA_ARGS__)
#define VEC(name, len, tpd) add(m, name, 1, (size_t[]){ len }, tpd, -1, -1, false, false)
#define MAT(name, r, cc, tpd) add(m, name, 2, (size_t[]){ r, cc }, tpd, -1, -1, true, true)
    const char *e = "vision_tower/vision_model/embeddings";
    t->patch = MAT(VNAME("%s/patch_embedding", e), D, t->K, -1);
    t->patchb = VEC(VNAME("%s/patch_embedding.bias", e), D, -1);
    t->pos = add(m, VNAME("%s/position_embedding", e), 2, (size_t[]){ t->P, D }, -1, -1, -1, true, false);
    const char *pre = "vision_tower/vision_model/encoder/layers";
    for (int l = 0; l < t->n_layers; l++) {
        VisionLayer *L = &t->layers[l];
        L->ln1 = VEC(VNAME("%s/%d/layer_norm1", pre, l), D, -1);
        L->ln1b = VEC(VNAME("%s/%d/layer_norm1.bias", pre, l), D, -1);
        L->q = MAT(VNAME("%s/%d/self_attn/q_proj", pre, l), D, D, 0);
        L->qb = VEC(VNAME("%s/%d/self_attn/q_proj.bias", pre, l), D, 0);
        L->k = MAT(VNAME("%s/%d/self_attn/k_proj", pre, l), D, D, 0);
        L->kb = VEC(VNAME("%s/%d/self_attn/k_proj.bias", pre, l), D, 0);
        L->v = MAT(VNAME("%s/%d/self_attn/v_proj", pre, l), D, D, 0);
        L->vb = VEC(VNAME("%s/%d/self_attn/v_proj.bias", pre, l), D, 0);
        L->o = MAT(VNAME("%s/%d/self_attn/out_proj", pre, l), D, D, 1);
        L->ob = VEC(VNAME("%s/%d/self_attn/out_proj.bias", pre, l), D, -1);
        L->ln2 = VEC(VNAME("%s/%d/layer_norm2", pre, l), D, -1);
        L->ln2b = VEC(VNAME("%s/%d/layer_norm2.bias", pre, l), D, -1);
        L->fc1 = MAT(VNAME("%s/%d/mlp/fc1", pre, l), F, D, 0);
        L->fc1b = VEC(VNAME("%s/%d/mlp/fc1.bias", pre, l), F, 0);
        L->fc2 = MAT(VNAME("%s/%d/mlp/fc2", pre, l), D, F, 1);
        L->fc2b = VEC(VNAME("%s/%d/mlp/fc2.bias", pre, l), D, -1);
    }
    t->post = VEC("vision_tower/vision_model/post_layernorm", D, -1);
    t->postb = VEC("vision_tower/vision_model/post_layernorm.bias", D, -1);
    t->p1 = MAT("multi_modal_projector/linear_1", d, D, 0);
    t->p1b = VEC("multi_modal_projector/linear_1.bias", d, 0);
    t->p2 = MAT("multi_modal_projector/linear_2", d, d, 1);
    t->p2b = VEC("multi_modal_projector/linear_2.bias", d, -1);
#undef MAT
#undef VEC
#undef VNAME
    t->attn = (AttnShape){ .H = t->H, .Hkv = t->H, .dk = t->hd, .bs = td_round_up(t->P, ATTN_TILE), .kv = DTYPE_F32,
                           .dv = t->hd, .scale = 1.0f / sqrtf((float)t->hd), .bidir = true };
}

/* Params of the vision tower: 9 + 16 per layer. */
static size_t vision_n_params(const ModelConfig *c)
{
    return config_vision(c) ? 9 + 16 * (size_t)c->vision_config.num_hidden_layers : 0;
}

/* Table and local sizes, no slabs: params' w/g/packed hold offsets.
 * dt: NULL for the training layout, else a serving model's dtypes. */
static void build_table(Model *m, const ModelConfig *cfg, const Topology *topo, const ModelDtypes *dt,
                        bool offload)
{
    memset(m, 0, sizeof *m);
    m->experts_offloaded = offload && dt != NULL;
    m->cfg = *cfg;
    m->topo = *topo;
    m->serving = dt != NULL;
    m->dt = dt ? *dt : (ModelDtypes){ DTYPE_F32, DTYPE_F32, DTYPE_F32, DTYPE_F32 };
    const ModelConfig *c = cfg;
    const Topology *t = topo;
    m->d = (size_t)c->hidden_size;
    m->hd = (size_t)c->head_dim;
    m->H = (size_t)(c->num_attention_heads / t->tp);
    m->Hkv = (size_t)(c->num_key_value_heads / t->tp);
    m->V = (size_t)c->vocab_size;
    m->E_global = (size_t)c->num_local_experts;
    m->E = (size_t)(c->num_local_experts / t->ep);
    m->k = (size_t)c->num_experts_per_tok;
    m->F = (size_t)(c->moe_intermediate_size / t->tp);
    m->Fd = (size_t)(c->intermediate_size / t->tp);
    m->S = (size_t)(config_shared_width(c) / t->tp);
    m->qk_pre = c->qk_norm != QK_NORM_NONE || c->clip_qkv > 0;
    m->clip = (float)c->clip_qkv;
    m->mla = config_mla(c);
    m->mla_dims = (MlaDims){ m->H, (size_t)c->qk_nope_head_dim, (size_t)c->qk_rope_head_dim,
                             (size_t)c->v_head_dim, (size_t)c->kv_lora_rank };
    if (m->mla) {   /* one kv head: [c_kv, k_rope], values c_kv */
        const size_t dk = m->mla_dims.r + m->mla_dims.rope;
        m->aq = m->H * dk, m->ak = dk, m->av = m->mla_dims.r, m->ao = m->H * m->mla_dims.r;
    } else {
        m->aq = m->ao = m->H * m->hd;
        m->ak = m->av = m->Hkv * m->hd;
    }

    const int L = c->num_hidden_layers;
    m->params = td_calloc(((size_t)(3 + L * MAX_PARAMS_PER_LAYER) + vision_n_params(c)) * sizeof(Param));
    m->layers = td_calloc((size_t)L * sizeof(Layer));
    const size_t d = m->d, V = m->V;
    bool first = topo_is_first_stage(t), last = topo_is_last_stage(t);
    /* the embedding: packed when it is also the head, and always in a
     * serving model (its rows are looked up from the packed copy) */
    if (first)
        m->embed = add(m, "model/embed_tokens", 2, (size_t[]){ V, d }, -1, -1, -1, true,
                       (c->tie_word_embeddings && last) || m->serving);
    if (first && config_vision(c)) vision_params(m);
    for (int l = t->layer_begin; l < t->layer_end; l++) layer_params(m, l);
    if (last) {
        m->norm = add(m, "model/norm", 1, (size_t[]){ d }, -1, -1, -1, false, false);
        if (!c->tie_word_embeddings) {
            m->lm_head = add(m, "lm_head", 2, (size_t[]){ V, d }, -1, -1, -1, true, true);
        } else if (first) {
            m->lm_head = m->embed;
        } else {
            /* tied, on a later stage than the embedding: a copy kept in sync
             * by the trainer (train/trainer.c, tied_grads / tied_weights) */
            m->lm_head = add(m, "model/embed_tokens", 2, (size_t[]){ V, d }, -1, -1, -1, true, true);
            m->lm_head->tied_copy = true;
        }
    }
}

/* The attention shape of every layout (model_init_shape's too). */
/* The attention shape of the model's layers (MLA: one latent kv head of
 * r + rope key dims whose first r are the values, docs/mla.md). */
static void set_attn(Model *m, size_t kv_block)
{
    m->attn = (AttnShape){ .H = m->H, .Hkv = m->mla ? 1 : m->Hkv, .dk = m->ak / (m->mla ? 1 : m->Hkv),
                           .bs = kv_block ? kv_block : 16, .kv = DTYPE_F32, .dv = m->mla ? m->av : m->hd,
                           .scale = model_attn_scale(&m->cfg), .v_in_k = m->mla };
}

static void init_layout(Model *m, const ModelConfig *cfg, const Topology *topo, bool with_grads, size_t kv_block,
                        const ModelDtypes *dt, bool offload)
{
    build_table(m, cfg, topo, dt, offload);
    m->w = td_calloc(td_max(m->n_w, 1) * sizeof(float));
    if (with_grads) m->g = td_calloc(td_max(m->n_w, 1) * sizeof(float));
    m->packed = td_calloc(td_max(m->n_packed, 1));
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        p->w = p->w ? m->w + p->offset : NULL;
        p->g = m->g ? m->g + p->offset : NULL;
        if (p->packed) p->packed = m->packed + ((size_t)(uintptr_t)p->packed - 1);
    }
    rope_table_init_scaled(&m->rope, (size_t)cfg->max_position_embeddings, m->hd, cfg->rope_theta, &cfg->rope_scaling);
    set_attn(m, kv_block);
}

float model_attn_scale(const ModelConfig *cfg)
{
    const int dk = config_mla(cfg) ? cfg->qk_nope_head_dim + cfg->qk_rope_head_dim : cfg->head_dim;
    /* DeepSeek-V3 (MLA): times YaRN's mscale^2 when rope_scaling has mscale_all_dim
     * (rope_softmax_scale_factor, core/ops/rope.h; HF multiplies the Python float
     * qk_head_dim^-0.5 by it, and the kernel takes the product as float32).  The
     * other families scale only RoPE's cos/sin (rope_attention_factor), as HF. */
    if (config_mla(cfg)) return (float)(rope_softmax_scale_factor(&cfg->rope_scaling) / sqrt((double)dk));
    return 1.0f / sqrtf((float)dk);
}

void model_init(Model *m, const ModelConfig *cfg, const Topology *topo, bool with_grads,
                size_t kv_block)
{
    init_layout(m, cfg, topo, with_grads, kv_block, NULL, false);
}

void model_init_serving(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                        const ModelDtypes *dt)
{
    init_layout(m, cfg, topo, false, kv_block, dt, false);
}

void model_init_serving_offload(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                                const ModelDtypes *dt)
{
    init_layout(m, cfg, topo, false, kv_block, dt, true);
}

static void init_shape(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                       const ModelDtypes *dt, bool offload)
{
    build_table(m, cfg, topo, dt, offload);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        p->w = p->g = NULL;
        p->packed = NULL;
    }
    set_attn(m, kv_block);
}

void model_init_shape(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                      const ModelDtypes *dt)
{
    init_shape(m, cfg, topo, kv_block, dt, false);
}

void model_init_shape_offload(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                              const ModelDtypes *dt)
{
    init_shape(m, cfg, topo, kv_block, dt, true);
}

size_t model_table_bytes(const Model *m)
{
    const size_t L = (size_t)m->cfg.num_hidden_layers;
    return (3 + L * MAX_PARAMS_PER_LAYER + vision_n_params(&m->cfg)) * sizeof(Param) + L * sizeof(Layer) +
           (size_t)m->vis.n_layers * sizeof(VisionLayer) + rope_table_bytes((size_t)m->cfg.max_position_embeddings, m->hd);
}

ModelDtypes model_dtypes_default(Dtype d)
{
    /* every matrix in d, the embedding and lm_head included (measured in
     * docs/serving.md: at int8 the change of perplexity and routing they
     * add is within the budget, and on a 150k vocabulary they are a large
     * part of the weights) */
    return (ModelDtypes){ d, d, d, d };
}

int model_param_table(const ModelConfig *cfg, const Topology *topo, Param **out)
{
    Model m;
    build_table(&m, cfg, topo, NULL, false);
    for (int i = 0; i < m.n_params; i++) {
        m.params[i].w = m.params[i].g = NULL;
        m.params[i].packed = NULL;
    }
    td_free(m.layers);
    *out = m.params;
    return m.n_params;
}

void model_free(Model *m)
{
    expert_cache_free(m->ecache);
    td_free(m->params);
    td_free(m->layers);
    td_free(m->vis.layers);
    td_free(m->w);
    td_free(m->g);
    td_free(m->packed);
    rope_table_free(&m->rope);
    memset(m, 0, sizeof *m);
}

Param *model_param(Model *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name) && !m->params[i].tied_copy) return &m->params[i];
    return NULL;
}

static bool is_output_proj(const char *name)
{
    size_t n = strlen(name);
    return (n >= 6 && !strcmp(name + n - 6, "o_proj")) || (n >= 9 && !strcmp(name + n - 9, "down_proj"));
}

struct init_ctx { const Param *p; uint64_t key; double std; };

static void init_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct init_ctx *c = vc;
    const Param *p = c->p;
    size_t ls1 = p->ndim > 1 ? p->lshape[1] : 1, ls2 = p->ndim > 2 ? p->lshape[2] : 1;
    size_t gs1 = p->ndim > 1 ? p->shape[1] : 1, gs2 = p->ndim > 2 ? p->shape[2] : 1;
    size_t o1 = p->ndim > 1 ? p->loff[1] : 0, o2 = p->ndim > 2 ? p->loff[2] : 0;
    for (size_t i = i0; i < i1; i++) {
        /* local (a, b, c) -> global flat index */
        size_t a = i / (ls1 * ls2), b = (i / ls2) % ls1, cc = i % ls2;
        size_t g = ((a + p->loff[0]) * gs1 + (b + o1)) * gs2 + (cc + o2);
        p->w[i] = (float)(c->std * rng_normal_at(c->key, g));
    }
}

void model_init_weights(Model *m, uint64_t seed)
{
    TD_CHECK(!m->serving, "model_init_weights: a serving model has no float32 weights to draw");
    const double L = (double)m->cfg.num_hidden_layers;
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        if (p->ndim == 1) {   /* norms 1, biases 0 */
            const size_t n = strlen(p->name);
            const float v = p->state || (n >= 5 && !strcmp(p->name + n - 5, ".bias")) ? 0.0f : 1.0f;
            for (size_t j = 0; j < p->numel; j++) p->w[j] = v;
            continue;
        }
        struct init_ctx c = { p, rng_mix64(seed) ^ rng_hash_str(p->name),
                              0.02 / (is_output_proj(p->name) ? sqrt(2.0 * L) : 1.0) };
        pool_for(p->numel, 4096, init_range, &c);
    }
    model_pack(m);
}

void model_pack(Model *m)
{
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        if (!p->packed || !p->w) continue;
        size_t rows = p->lshape[p->ndim - 2], cols = p->lshape[p->ndim - 1];
        for (size_t e = 0; e < p->n_mats; e++)
            gemm_pack(p->packed + e * p->mat_bytes, p->dtype, p->w + e * rows * cols, rows, cols);
    }
}

void model_set_weights(Model *m, Param *p, size_t e0, size_t ne, const float *src)
{
    (void)m;
    TD_CHECK(!p->offloaded, "model_set_weights: %s is offloaded to the expert cache", p->name);
    if (!p->packed) {
        TD_CHECK(e0 == 0 && p->w, "model_set_weights: %s is a vector, set whole", p->name);
        memcpy(p->w, src, p->numel * sizeof(float));
        return;
    }
    const size_t rows = p->lshape[p->ndim - 2], cols = p->lshape[p->ndim - 1];
    TD_CHECK(e0 + ne <= p->n_mats, "model_set_weights: %s has %zu matrices, not %zu", p->name, p->n_mats, e0 + ne);
    if (p->w) memcpy(p->w + e0 * rows * cols, src, ne * rows * cols * sizeof(float));
    for (size_t e = 0; e < ne; e++)
        gemm_pack(p->packed + (e0 + e) * p->mat_bytes, p->dtype, src + e * rows * cols, rows, cols);
}

void model_set_q8(Model *m, Param *p, size_t e0, size_t ne, const int8_t *q, const float *s)
{
    (void)m;
    const size_t rows = p->lshape[p->ndim - 2], cols = p->lshape[p->ndim - 1], G = dtype_q8_groups(cols);
    TD_CHECK(p->packed && p->dtype == DTYPE_INT8 && !p->w, "model_set_q8: %s is not an int8 serving matrix", p->name);
    TD_CHECK(e0 + ne <= p->n_mats, "model_set_q8: %s has %zu matrices, not %zu", p->name, p->n_mats, e0 + ne);
    for (size_t e = 0; e < ne; e++)
        gemm_pack_q8(p->packed + (e0 + e) * p->mat_bytes, q + e * rows * cols, s + e * rows * G, rows, cols);
}

void model_quantize_from(Model *dst, const Model *src)
{
    for (int i = 0; i < dst->n_params; i++) {
        Param *p = &dst->params[i];
        const Param *f = NULL;
        for (int j = 0; j < src->n_params && !f; j++)
            if (!strcmp(src->params[j].name, p->name) && src->params[j].tied_copy == p->tied_copy) f = &src->params[j];
        TD_CHECK(f && f->w && f->numel == p->numel, "model_quantize_from: no float32 weights for %s", p->name);
        if (p->offloaded) continue;   /* the cache's loader packs them */
        model_set_weights(dst, p, 0, p->packed ? p->n_mats : 1, f->w);
    }
}

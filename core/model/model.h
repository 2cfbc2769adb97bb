/* core/model/model.h - the MoE transformer of SPEC section 2, built from the core
 * ops only, shared by the trainer, the scorer and the inference engine.
 *
 * Parameters.  Every tensor of the checkpoint schema (SPEC section 4) is a
 * Param: its HDF5 path, its global shape, and the slice [loff, loff+lshape)
 * this rank owns under the topology (tensor parallelism splits one dim,
 * expert parallelism splits the expert dim, pipeline stages own whole
 * layers).  Weights, gradients and the packed copies used by the forward
 * GEMM live in three slabs owned by the Model; Params are views.
 *
 * Two layouts.  A training model (model_init) holds every tensor in
 * float32 in the weight slab, its gradients, and a float32 packed copy of
 * every matrix for the forward.  A serving model (model_init_serving)
 * holds only what the forward reads: every matrix once, packed, in the
 * dtype of its Param (ModelDtypes: float32, bf16 or int8 g32 -- the router
 * mlp/gate always float32), and in the weight slab only the vectors (norms,
 * biases, q/k norms) and shared_expert_gate, float32.  The embedding of a
 * serving model is looked up from its packed copy.  Both layouts run the
 * same forward (layer.c); a Param's GEMMs dispatch on its dtype
 * (param_mat).
 *
 * Forward.  A batch is N token rows from one or more sequences; sequence i
 * has rows [row, row + n) at positions [pos, pos + n) and its keys/values in
 * blocks of a per-layer pool (core/ops/attention.h).  Training passes B
 * sequences of T rows starting at position 0 with blocks in the activation
 * arena; the inference engine passes prefill chunks and decode rows with
 * blocks in its paged cache.  Both run model_layer_forward and model_head:
 * one copy of the math.  Every op is row-invariant (core/ops/gemm.h,
 * core/ops/attention.h), so a token's logits do not depend on the batch.
 *
 * Parallel hooks.  core/ does not call MPI: the trainer installs ModelComm
 * callbacks (comm/) for the tensor-parallel all-reduces and data-parallel
 * statistics; NULL callbacks mean a single process.
 */
#ifndef TANDEM_CORE_MODEL_MODEL_H
#define TANDEM_CORE_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ops/attention.h"
#include "core/ops/gemm.h"
#include "core/model/config.h"
#include "core/ops/mla.h"
#include "core/ops/moe.h"
#include "core/ops/rope.h"
#include "core/arena.h"
#include "core/model/topology.h"

#define PARAM_NAME_MAX 96
#define PARAM_MAX_DIMS 3

typedef struct {
    char name[PARAM_NAME_MAX];     /* HDF5 path without the leading '/' */
    int ndim;
    size_t shape[PARAM_MAX_DIMS];  /* global (logical) shape */
    size_t lshape[PARAM_MAX_DIMS]; /* this rank's slice ... */
    size_t loff[PARAM_MAX_DIMS];   /* ... and where it starts in the global tensor */
    int tp_dim, ep_dim;            /* dim split over tp / ep, -1 when not split */
    int layer;                     /* -1 for embeddings, final norm, lm_head */
    bool decay;                    /* AdamW weight decay applies (not norms) */
    bool tied_copy;                /* lm_head copy of a tied embedding on a later stage */
    bool state;                    /* state, not a trained weight (the router's correction
                                    * bias): float32, no gradient step, no moments update */
    size_t numel;                  /* local elements */
    size_t offset;                 /* into the weight / gradient slabs, floats */
    float *w, *g;                  /* views; w NULL for a packed matrix of a serving
                                    * model, g NULL without gradients */
    Dtype dtype;                   /* of the packed copy */
    unsigned char *packed;         /* packed for gemm_xwt (param_mat), NULL for vectors */
    size_t n_mats;                 /* matrices packed (experts: E local), 1 otherwise */
    size_t mat_bytes;              /* bytes of one packed matrix */
    bool offloaded;                /* a routed-expert matrix of an offloading serving model:
                                    * packed NULL, its matrices in m->ecache
                                    * (core/model/expert_cache.h) */
} Param;

/* Matrix e of a packed Param (expert e, or 0) as the GEMM reads it. */
static inline GemmW param_mat(const Param *p, size_t e)
{
    return gemm_w(p->dtype, p->packed + e * p->mat_bytes, p->lshape[p->ndim - 2], p->lshape[p->ndim - 1]);
}

/* Dtypes of a serving model's matrices by role (SPEC section 11): every
 * matrix but the router (always float32) and those below, the embedding,
 * lm_head (a tied embedding takes head's: it is the head's weight too),
 * and the attention projections (self_attn/..._proj but MLA's kv_b_proj,
 * float32 always: `ckpt quantize --attn-dtype`). */
typedef struct {
    Dtype mat, embed, head, attn;
} ModelDtypes;

/* A parameter's role: which field of ModelDtypes sets its dtype (ROLE_F32:
 * none, float32 at every dtype: vectors, the router, shared_expert_gate,
 * MLA's kv_b_proj). */
typedef enum { ROLE_F32, ROLE_MAT, ROLE_EMBED, ROLE_HEAD, ROLE_ATTN, ROLE_COUNT } ModelRole;

ModelRole model_param_role(const ModelConfig *cfg, const Param *p);

/* The field of dt that role r reads; NULL for ROLE_F32. */
Dtype *model_role_dtype(ModelDtypes *dt, ModelRole r);

/* The dtype a serving model with dtypes dt holds p in (float32 for
 * vectors, the router and shared_expert_gate); what `ckpt quantize`
 * writes p as. */
Dtype model_serving_dtype(const ModelConfig *cfg, const ModelDtypes *dt, const Param *p);

/* The plan `--dtype d` means (docs/serving.md says why embeddings and
 * lm_head get what they get). */
ModelDtypes model_dtypes_default(Dtype d);

/* The partition attribute of SPEC section 4 for a Param under topology t:
 * "replicated", or components joined by ',' ("pp", "tp:0", "ep:0,tp:1"). */
void param_partition(const Param *p, const Topology *t, char *out, size_t out_len);

typedef struct {
    bool moe;
    size_t window;                        /* sliding window (config_layer_window), 0: full attention */
    Param *ln1, *ln2;
    Param *q, *k, *v, *o;
    Param *qb, *kb, *vb, *ob;             /* projection biases, NULL when off */
    Param *qn, *kn;                       /* q/k norm weights ([hd] or [H*hd], [Hkv*hd]), NULL when off */
    /* MLA (docs/mla.md; q is q_b_proj, or q_proj when q_lora_rank = 0; k, v NULL):
     * q_a_proj [qr, d], q_a_layernorm [qr] (NULL when qr = 0), kv_a_proj_with_mqa
     * [r + rope, d], kv_a_layernorm [r], kv_b_proj [H (nope + v), r] (float32,
     * read by core/ops/mla.h, never packed) */
    Param *qa, *qan, *kva, *kvan, *kvb;
    Param *gate, *up, *down;              /* dense FFN */
    Param *router;                        /* [E, d] */
    Param *rbias;                         /* [E] e_score_correction_bias (noaux_tc), NULL when off */
    Param *egate, *eup, *edown;           /* [E, F, d] [E, F, d] [E, d, F] */
    Param *sgate, *sup, *sdown;           /* shared experts [S, d] [S, d] [d, S], NULL when none */
    Param *sgw;                           /* shared_expert_gate [1, d], NULL when off */
} Layer;

/* The vision tower's Params (core/model/vision.h, docs/vision.md); biases
 * end in .bias, layer norms have a weight and a .bias. */
typedef struct {
    Param *ln1, *ln1b, *q, *qb, *k, *kb, *v, *vb, *o, *ob, *ln2, *ln2b, *fc1, *fc1b, *fc2, *fc2b;
} VisionLayer;

typedef struct {
    int n_layers;               /* 0: no vision tower */
    size_t D, F, H, hd;         /* width, MLP width, heads (F, H local under tp), head dim */
    size_t S, p, P, K;          /* image size, patch size, tokens per image, 3 p p */
    size_t dp;                  /* projector hidden (the LM's d; local under tp) */
    float eps;
    Param *patch, *patchb, *pos, *post, *postb, *p1, *p1b, *p2, *p2b;
    VisionLayer *layers;        /* owned, n_layers */
    AttnShape attn;             /* bidirectional, local heads, bs = P rounded up to 16 */
} VisionTower;

/* Collective callbacks into comm/ (all NULL in a single process). */
typedef struct {
    void *ctx;
    /* in-place sum over the tensor-parallel group (activations, and small
     * per-row buffers: OLMoE's q/k norm sums, the shared gate's dot) */
    void (*tp_allreduce)(void *ctx, float *buf, size_t n);
    /* in-place sum over the data-parallel group (router statistics, token counts) */
    void (*dp_allreduce_f64)(void *ctx, double *buf, size_t n);
    /* all-to-all(v) of bytes over the expert-parallel group: counts and
     * displacements in bytes, one per ep rank */
    void (*ep_alltoallv)(void *ctx, const void *send, const size_t *sc, const size_t *sd,
                         void *recv, const size_t *rc, const size_t *rd);
    /* backward has finished the gradients of layer l (-1: the embedding,
     * L: the final norm and lm_head); the trainer may start reducing them */
    void (*grad_ready)(void *ctx, int layer);
    /* sequence parallelism (Topology.sp): over the tensor-parallel group,
     * in (n floats, tp equal blocks of rows) summed and block tp_rank into
     * out (n / tp); all-gather in place of buf (n floats), each rank's own
     * block tp_rank already in place */
    void (*tp_reduce_scatter)(void *ctx, float *out, const float *in, size_t n);
    void (*tp_allgather)(void *ctx, float *buf, size_t n);
    /* context parallelism (core/model/layer.h, CpView), over the cp group:
     * all-gather of n floats per rank in place (rank r's block at r n,
     * its own block already there), and the sum of in (cp n) whose block r
     * goes to rank r's out (n) */
    void (*cp_allgather)(void *ctx, float *buf, size_t n);
    void (*cp_reduce_scatter)(void *ctx, float *out, const float *in, size_t n);
} ModelComm;

typedef struct {
    ModelConfig cfg;
    Topology topo;
    ModelComm comm;
    /* local sizes under the topology */
    size_t d, hd, H, Hkv, V, E, k, F, Fd, S;  /* H, Hkv, F, Fd, S, E are local (per tp / ep) */
    bool qk_pre;            /* q/k/v pass a q/k norm or a clamp between projection and RoPE */
    float clip;             /* clip_qkv, 0 off */
    size_t E_global;
    Param *params;          /* owned, n_params entries */
    int n_params;
    Layer *layers;          /* owned, indexed by global layer id; only this stage's are set */
    Param *embed, *norm, *lm_head;  /* lm_head == embed when tied on a single stage */
    float *w, *g;           /* owned slabs */
    unsigned char *packed;  /* owned slab of the packed matrices */
    size_t n_w;             /* floats */
    size_t n_packed;        /* bytes */
    bool serving;           /* the serving layout (see the file comment) */
    ModelDtypes dt;         /* serving: the dtypes by role; training: all f32 */
    RopeTable rope;
    AttnShape attn;         /* local heads, block size */
    /* widths per row of what attention reads and writes: q (H dk), k (Hkv
     * dk), v (Hkv dv) and its output (H dv); MLA: dk = r + rope, dv = r,
     * one kv head */
    size_t aq, ak, av, ao;
    bool mla;               /* multi-head latent attention (config_mla) */
    MlaDims mla_dims;       /* its sizes, local heads */
    bool experts_offloaded; /* serving: the routed experts are not in the packed slab */
    struct ExpertCache *ecache;   /* their cache (owned; NULL when resident) */
    VisionTower vis;        /* the vision tower (first stage only), n_layers 0 without one */
} Model;

/* The attention shape of layer L: the model's, with the layer's sliding
 * window (every caller of the attention ops goes through this). */
static inline AttnShape model_layer_attn(const Model *m, const Layer *L)
{
    AttnShape s = m->attn;
    s.window = L->window;
    return s;
}

/* The softmax scale of attention: 1/sqrt(head_dim), or under MLA
 * 1/sqrt(qk_nope_head_dim + qk_rope_head_dim). */
float model_attn_scale(const ModelConfig *cfg);

/* Builds the parameter table and slabs for this rank.  with_grads: also a
 * zeroed gradient slab (training).  kv_block: positions per KV block (a
 * multiple of 16) used by the attention of this model.  Weights are zero:
 * call model_init_weights or load a checkpoint, then model_pack. */
void model_init(Model *m, const ModelConfig *cfg, const Topology *topo, bool with_grads,
                size_t kv_block);
/* A serving model (see the file comment): no gradients, no float32
 * master of the matrices; weights zero until loaded (model_set_weights,
 * checkpoint/ckpt_serve.h). */
void model_init_serving(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                        const ModelDtypes *dt);
/* The same with the routed experts' matrices offloaded: their Params keep
 * dtype, n_mats and mat_bytes but no storage (offloaded, packed NULL);
 * until a cache is attached (expert_cache_attach) the model cannot run. */
void model_init_serving_offload(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                                const ModelDtypes *dt);
/* The tables and local sizes of the model model_init (dt NULL) or
 * model_init_serving (dt given) would build, without its slabs or RoPE
 * table: n_w, n_packed, the Params (w, g, packed NULL), the Layers and
 * attn are set, so sizing functions (layer_acts_carve with a dry arena,
 * kvcache and engine sizes, plan/) read the same numbers the allocators
 * use.  Free with model_free. */
void model_init_shape(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                      const ModelDtypes *dt);
/* The same for model_init_serving_offload's layout (n_packed without the
 * routed experts). */
void model_init_shape_offload(Model *m, const ModelConfig *cfg, const Topology *topo, size_t kv_block,
                              const ModelDtypes *dt);
/* Bytes of m's parameter and layer tables and RoPE table (what every
 * init but model_init_shape allocates besides the slabs). */
size_t model_table_bytes(const Model *m);
/* Frees everything; safe on a zeroed struct and twice. */
void model_free(Model *m);
/* The parameter table alone (names, global shapes, slices) of the rank
 * described by topo, without allocating weights: *out (owned by the caller,
 * td_free) gets the entries, their w/g/packed NULL.  Returns the count.
 * Used to enumerate the tensors held by other pipeline stages. */
int model_param_table(const ModelConfig *cfg, const Topology *topo, Param **out);

/* Documented initialisation (docs/config.md): N(0, 0.02) for matrices and
 * embeddings, output projections (o_proj and every down_proj) scaled by
 * 1/sqrt(2L), norms 1, biases 0.  Element i of a global tensor is drawn from
 * (seed, tensor name, i), so every topology gets the same model.  Also
 * packs. */
void model_init_weights(Model *m, uint64_t seed);
/* Refreshes the packed copies from the weights (after load or update).
 * A serving model has no weights to pack from: no-op for its matrices. */
void model_pack(Model *m);
/* Sets matrices [e0, e0 + ne) of p (all of a vector: e0 = 0, ne = 1) from
 * float32 values src (row-major, [ne][rows][cols] of the local slice):
 * into p->w when p has one, and into its packed copy in p's dtype (bf16
 * rounded, int8 quantized by rows in groups of 32, core/dtype.h).  Uses the
 * pool. */
void model_set_weights(Model *m, Param *p, size_t e0, size_t ne, const float *src);
/* The same for an int8 Param from quantized values: q [ne][rows][cols] and
 * scales s [ne][rows][ceil(cols / 32)] (a quantized checkpoint's). */
void model_set_q8(Model *m, Param *p, size_t e0, size_t ne, const int8_t *q, const float *s);
/* Every weight of serving model dst from the float32 weights of src (same
 * config and topology; src a training model): quantized as dst's dtypes
 * say, with the bits `tandem ckpt quantize` writes.  Used after each RL
 * update (rollout_dtype) and to convert a loaded float32 model. */
void model_quantize_from(Model *dst, const Model *src);
/* Looks a parameter up by HDF5 path; NULL when absent on this rank. */
Param *model_param(Model *m, const char *name);
/* Bytes of the expert cache's slab (0 without one): expert_cache.c. */
size_t model_expert_cache_bytes(const Model *m);
/* Bytes of weights held by this rank (the weight slab; a serving model's
 * matrices live in its packed slab, counted too, and an offloading
 * model's expert cache). */
static inline size_t model_weight_bytes(const Model *m)
{
    return m->n_w * sizeof(float) + (m->serving ? m->n_packed + model_expert_cache_bytes(m) : 0);
}

#endif

/* core/model/layer.h - the forward of one transformer layer and of the model's
 * embedding and head, shared by training, scoring and serving (one copy of
 * the math, see core/model/model.h).
 *
 *   h1 = rmsnorm(x, ln1)
 *   q, k, v = h1 Wq^T (+ bq), h1 Wk^T (+ bk), h1 Wv^T (+ bv)     (qr, kr, vr)
 *   q, k = qk_norm(q), qk_norm(k)              per head or over the whole width
 *   q, k, v = clamp(q, k, v, +-clip_qkv)      after the norm, as HF OLMoE
 *   rope(q, k);  store k, v into the sequence's KV blocks;  att = attention(q, blocks)
 *   x_mid = x + att Wo^T (+ bo)
 *   (MLA, kv_lora_rank > 0: the attention block of docs/mla.md instead)
 *   h2 = rmsnorm(x_mid, ln2)
 *   y = dense SwiGLU(h2)  or  MoE(h2) (+ shared expert(s), gated by
 *       sigmoid(h2 . w_g) when shared_expert_gate); the router is softmax
 *       top-k, or sigmoid with group-limited choice (scoring_func sigmoid:
 *       core/ops/moe.h, moe_router_sigmoid_forward)
 *   x_out = x_mid + y
 * Every step is optional by the config (model->qk_pre, Layer's NULL
 * params); with none on, qr/kr/vr alias q/k/v.
 *
 * Sequence parallelism (Megatron, Korthikanti et al. 2022; Topology.sp,
 * training with tp > 1): the residual stream and the two norms hold only
 * this rank's Nl = N / tp rows, rows [tp_rank Nl, (tp_rank + 1) Nl) of the
 * batch (x_in, x_out, x_mid, h1, h2, rstd1, rstd2).  Before the
 * column-parallel projections the normed rows are all-gathered into h1g /
 * h2g (N rows); the row-parallel outputs (o_proj, the FFN's down
 * projections) are reduce-scattered instead of all-reduced.  The router,
 * the experts and the shared experts read the gathered h2g: every rank
 * routes all N rows, as without sp.  Without sp, h1g / h2g alias h1 / h2.
 */
#ifndef TANDEM_CORE_MODEL_LAYER_H
#define TANDEM_CORE_MODEL_LAYER_H

#include "core/model/model.h"
#include "core/ops/gemm.h"

/* Context parallelism (SPEC section 12, docs/scaling.md), training: each
 * sequence of T positions is cut into 2 cp chunks of C = T / (2 cp)
 * positions, and cp rank r holds chunks r and 2cp-1-r (load-balanced under
 * the causal mask): its rows of sequence b are [2bC, 2bC + C) at positions
 * [rC, (r+1)C) and [2bC + C, 2bC + 2C) at positions [(2cp-1-r)C, (2cp-r)C);
 * the batch's seqs are these 2B chunks.  Every op but attention is per
 * row.  Attention gathers the keys and values of every cp rank into gk, gv
 * (rank q's N rows at q N), stores them all into the sequence's blocks
 * (kv_seqs: the gathered rows' chunks and positions) and runs each local
 * query chunk against them: the forward bits of one process.  Backward
 * (core/model/backprop.c) gives each rank's queries' dK/dV for the whole
 * sequence (gk, gv reused) and reduce-scatters them back to the keys'
 * owners.  C must be a multiple of ATTN_TILE (attention_backward_chunks). */
typedef struct {
    int cp, rank;
    size_t B, T, C;
    const AttnSeq *kv_seqs;    /* (cp 2B) the gathered rows as chunks, rank-major */
    size_t n_kv_seq;
    float *gk, *gv;            /* (cp N, Hkv dk) (cp N, Hkv dv) gather scratch */
} CpView;

typedef struct {
    size_t n;                  /* token rows N */
    const int32_t *ids;        /* (N) */
    const int32_t *pos;        /* (N) */
    const AttnSeq *seqs;       /* attention view of the rows */
    size_t n_seq;
    size_t n_tot;              /* tokens of the micro-batch over all dp ranks (loss means) */
    const CpView *cp;          /* context parallelism, NULL without */
} ModelBatch;

/* Buffers of one layer's forward; which are kept for backward and which are
 * shared scratch depends on the recompute mode (model_acts_*). */
typedef struct {
    float *h1, *rstd1, *q, *k, *v, *att, *lse, *x_mid, *h2, *rstd2;
    float *h1g, *h2g;                          /* (N, d) h1, h2 gathered over tp (sequence
                                                * parallelism, layer.h), else aliases */
    /* projections before q/k norm and clamp (N, H*hd) (N, Hkv*hd) (N,
     * Hkv*hd); alias q, k, v when neither is on (vr: when no clamp) */
    float *qr, *kr, *vr;
    float *rstdq, *rstdk;                      /* q/k norm: (N*H) (N*Hkv) per head, (N) (N) full */
    float *qkss;                               /* (2N) full q/k norm: sums of squares (scratch) */
    /* MLA (docs/mla.md): q is the absorbed query (N, H (r + rope)), k the
     * stored key [c_kv normed, k_rope] (N, r + rope), att the latent output
     * (N, H r), v unused.  mq (N, H (nope + rope)): q_b_proj's (or
     * q_proj's) output, its rope part rotated; cq, cqn (N, qr): q_a_proj's
     * output and its norm, rstdcq (N); kva (N, r + rope): kv_a_proj's
     * output; ckv (N, r) its latent part, rstdkv (N); ckvn (N, r) the
     * normed latent and matt (N, H v) att through W_uv (scratch) */
    float *mq, *cq, *cqn, *rstdcq, *kva, *ckv, *rstdkv, *ckvn, *matt;
    float *fg, *fu, *fh;                       /* dense FFN (N, Fd) */
    float *rlogits, *probs, *rlse, *topk_w;    /* router (N,E) (N,E) (N) (N,k); probs: the
                                                * sigmoid scores s for a sigmoid router */
    int32_t *topk_idx;                         /* (N, k) */
    MoePlan plan;
    float *xd, *eo;                            /* dispatched rows (N*k, d), in plan order */
    /* expert side: the rows this rank's experts compute, grouped by local
     * expert; with ep == 1 xe/eoe alias xd/eo and e_off the plan's offsets
     * (serving under ep, Topology.ep_shared_rows: xe is taken from h2g
     * directly and eoe all-gathered into eo; xd, ep_send, ep_recv unused) */
    float *xe, *eoe;                           /* (R, d), R <= ep*N*k */
    float *eg, *eu, *eh;                       /* (R, F) */
    int32_t *e_off;                            /* (E_local + 1) */
    int32_t *ep_send, *ep_recv;                /* rows per (ep rank, local expert), ep*E_local each */
    size_t n_recv;                             /* R */
    float *ep_stage;                           /* (ep*N*k, d) exchange staging, ep > 1 */
    float *sg, *su, *sh;                       /* shared experts (N, S) */
    float *sgv;                                /* (N) shared gate sigmoid(h2 . w_g) */
    float *shg;                                /* (N, S) sh scaled by the gate (scratch) */
    float *y;                                  /* FFN output (N, d) */
    double *count, *psum;                      /* router statistics (E), global after the hook; the
                                                * z sum follows psum (count, psum, z: 2E+1 doubles) */
    GemmProblem *eprob;                        /* (2 E_local) the experts' grouped GEMMs (scratch) */
    GemmBwProblem *bprob;                      /* (3 E_local) and their backward products (scratch) */
    float aux, z;                              /* this layer's router losses */
    void *kv;                                  /* this layer's KV block pool (m->attn.kv dtype) */
    /* wall seconds model_layer_forward spent in the attention block, the
     * router (with its statistics' dp sum) and the whole FFN block (router
     * included): added to, never reset here (training's metrics read and
     * zero them, docs/observability.md) */
    double t_attn, t_router, t_ffn;
} LayerActs;

/* Rows of the batch of N rows this rank holds in the residual stream:
 * N / tp from row tp_rank N / tp under sequence parallelism, else all N
 * from 0. */
static inline size_t model_sp_rows(const Model *m, size_t N) { return m->topo.sp ? N / (size_t)m->topo.tp : N; }
static inline size_t model_sp_row0(const Model *m, size_t N)
{
    return m->topo.sp ? (size_t)m->topo.tp_rank * (N / (size_t)m->topo.tp) : 0;
}
/* Sequence parallelism: xg (N, d) = this rank's rows x (Nl, d) all-gathered
 * over tp (all tp ranks call).  Without sp a copy when xg != x. */
void model_sp_gather(const Model *m, float *xg, const float *x, size_t N);
/* The sum over tp of the partial rows part (N, d) (a row-parallel
 * output, or a column-parallel input gradient): without sp all N rows in
 * place (out == part); with sp this rank's Nl rows into out (a
 * reduce-scatter; out != part).  All tp ranks call. */
void model_tp_reduce_rows(const Model *m, float *out, float *part, size_t N);

/* x_out = layer l applied to x_in (N, d) for batch b (Nl rows of each
 * under sequence parallelism); a holds every buffer
 * (a->kv the KV pool of this layer).  x_out may alias x_in. */
void model_layer_forward(const Model *m, int l, const ModelBatch *b, const float *x_in,
                         float *x_out, LayerActs *a);
/* Whether model_layer_forward runs b's attention block fused, one pool
 * region for q/k/v, RoPE, the KV store and attention (a few rows, two
 * threads or more; layer.c says when): the same bits either way. */
bool model_attn_fused(const Model *m, const ModelBatch *b);
/* The second half of model_layer_forward: from a->x_mid (the residual
 * after the attention block) the norm, the FFN or MoE block and the
 * residual, into x_out.  model_layer_forward ends with it; called alone
 * it runs the block again on a kept x_mid (after a router changed). */
void model_layer_forward_ffn(const Model *m, int l, const ModelBatch *b, float *x_out, LayerActs *a);
/* Embedding rows for the batch: x (N, d). */
void model_embed(const Model *m, float *x, const int32_t *ids, size_t n);
/* logits (n, V) = rmsnorm(x, norm) lm_head^T for n rows of x; hn (n, d)
 * and rstd (n) receive the normed rows (saved for backward). */
void model_head(const Model *m, float *logits, float *hn, float *rstd, const float *x, size_t n);

/* Carves every buffer of a LayerActs for up to N rows from ar (a->kv is
 * left NULL: the caller points it at a layer's KV pool).  With a dry arena
 * it only measures. */
void layer_acts_carve(LayerActs *a, Arena *ar, const Model *m, size_t N);
/* The part of it for MLA's buffers (mq .. matt). */
void layer_acts_carve_mla(LayerActs *a, Arena *ar, const Model *m, size_t N);
/* The part of it for qr, kr, vr, rstdq, rstdk (a->q, k, v already set:
 * qr/kr/vr alias them when the config has no q/k norm or clamp). */
void layer_acts_carve_qkv(LayerActs *a, Arena *ar, const Model *m, size_t N);

/* Expert-parallel exchange (identity when ep == 1).
 * to_experts: a->xd (dispatch order) -> a->xe grouped by local expert,
 * filling e_off, ep_send, ep_recv, n_recv.  from_experts: src (expert side,
 * R rows) -> dst (dispatch order, N*k rows), reversing the routes.
 * back_to_experts: src (dispatch order) -> dst (expert side), the routes
 * of the last to_experts (backward). */
void model_ep_to_experts(const Model *m, LayerActs *a, size_t n_rows);
void model_ep_from_experts(const Model *m, LayerActs *a, const float *src, float *dst, size_t n_rows);
void model_ep_back_to_experts(const Model *m, LayerActs *a, const float *src, float *dst, size_t n_rows);

/* The local experts' SwiGLUs over the expert-side rows (a->xe, grouped by
 * a->e_off, a->n_recv rows): eg, eu = xe Wg^T, xe Wu^T; eh = swiglu(eg,
 * eu); eoe = eh Wd^T.  Each expert is one GEMM over its contiguous rows;
 * the gate and up products of all experts run as one grouped GEMM, then
 * the down products (core/ops/gemm.h: same bits as separate calls). */
void model_experts_forward(const Model *m, const Layer *L, LayerActs *a);

/* Recomputes, from the saved h2 and routing of a forward, the FFN
 * intermediates (dense fg/fu/fh, or xd/eg/eu/eh/eo and shared sg/su/sh) into
 * the buffers of a.  Bit-identical to the forward's values. */
void model_ffn_recompute(const Model *m, int l, const ModelBatch *b, LayerActs *a);

/* The sigmoid router's choice parameters from the model config. */
static inline MoeSigmoidRouter model_sigmoid_router(const ModelConfig *c)
{
    return (MoeSigmoidRouter){ (size_t)c->n_group, (size_t)c->topk_group, c->norm_topk_prob,
                               (float)c->routed_scaling_factor };
}

#endif

/* core/model/layer.c - forward of a layer, the embedding and the head (layer.h). */
#include "core/model/layer.h"
#include "core/common.h"
#include "core/model/expert_cache.h"
#include "core/ops/bias.h"
#include "core/ops/clamp.h"
#include "core/ops/embedding.h"
#include "core/ops/gate.h"
#include "core/ops/linear.h"
#include "core/ops/gemm.h"
#include "core/pool.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"
#include "core/ops/swiglu.h"

#include <string.h>

struct add_ctx { float *out; const float *a, *b; };

static void add_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct add_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) c->out[i] = c->a[i] + c->b[i];
}

/* out = a + b, elementwise (the residual add); out may alias a or b. */
static void residual_add(float *out, const float *a, const float *b, size_t n)
{
    struct add_ctx c = { out, a, b };
    pool_for(n, 4096, add_range, &c);
}

static void tp_sum(const Model *m, float *buf, size_t n)
{
    if (m->comm.tp_allreduce && m->topo.tp > 1) m->comm.tp_allreduce(m->comm.ctx, buf, n);
}

void model_sp_gather(const Model *m, float *xg, const float *x, size_t N)
{
    const size_t d = m->d;
    if (!m->topo.sp) {
        if (xg != x) memcpy(xg, x, N * d * sizeof(float));
        return;
    }
    TD_CHECK(m->comm.tp_allgather && N % (size_t)m->topo.tp == 0, "sequence parallelism: %zu rows over tp=%d",
             N, m->topo.tp);
    memcpy(xg + model_sp_row0(m, N) * d, x, model_sp_rows(m, N) * d * sizeof(float));
    m->comm.tp_allgather(m->comm.ctx, xg, N * d);
}

void model_tp_reduce_rows(const Model *m, float *out, float *part, size_t N)
{
    if (!m->topo.sp) {
        TD_CHECK(out == part, "tp reduce without sequence parallelism is in place");
        tp_sum(m, part, N * m->d);
        return;
    }
    TD_CHECK(m->comm.tp_reduce_scatter && out != part && N % (size_t)m->topo.tp == 0,
             "sequence parallelism: reduce-scatter of %zu rows over tp=%d", N, m->topo.tp);
    m->comm.tp_reduce_scatter(m->comm.ctx, out, part, N * m->d);
}

void model_embed(const Model *m, float *x, const int32_t *ids, size_t n)
{
    if (m->embed->w) {
        embedding_forward(x, ids, m->embed->w, n, m->d);
    } else {   /* a serving model: rows of the packed table, as the head reads them */
        const GemmW W = param_mat(m->embed, 0);
        embedding_forward_packed(x, ids, &W, n);
    }
}

void model_head(const Model *m, float *logits, float *hn, float *rstd, const float *x, size_t n)
{
    rmsnorm_forward(hn, rstd, x, m->norm->w, n, m->d, (float)m->cfg.rms_norm_eps);
    const GemmW W = param_mat(m->lm_head, 0);
    linear_forward(logits, hn, &W, n);
}

/* y = x W^T for a matrix Param (its dtype). */
static void param_linear(float *y, const float *x, const Param *p, size_t N)
{
    const GemmW W = param_mat(p, 0);
    linear_forward(y, x, &W, N);
}

/* model_experts_forward with the experts in m->ecache: the experts with
 * rows, in index order, in chunks of at most c->slots (pinned while the
 * chunk computes).  Each expert runs the GEMMs the resident path runs, on
 * the same packed bytes; a chunk's rows are contiguous, and SwiGLU is
 * elementwise, so the result is the resident one bit for bit. */
static void experts_forward_cached(const Model *m, const Layer *L, LayerActs *a)
{
    ExpertCache *c = m->ecache;
    const int l = (int)(L - m->layers);
    const size_t d = m->d, F = m->F, E = m->E;
    const Param *pg = L->egate, *pu = L->eup, *pd = L->edown;
    GemmProblem *g = a->eprob;
    const unsigned char *wdown[c->slots];
    size_t ex[c->slots];
    size_t e = 0;
    while (e < E) {
        const uint64_t tick = ++c->tick;
        size_t n = 0, e0 = e;
        for (; e < E && n < c->slots; e++) {
            const size_t r0 = (size_t)a->e_off[e], M = (size_t)a->e_off[e + 1] - r0;
            if (M == 0) continue;
            const unsigned char *wg, *wu;
            expert_cache_get(c, L, l, e, tick, &wg, &wu, &wdown[n]);
            g[2 * n] = (GemmProblem){ a->eg + r0 * F, F, a->xe + r0 * d, d,
                                      gemm_w(pg->dtype, wg, pg->lshape[1], pg->lshape[2]), M };
            g[2 * n + 1] = (GemmProblem){ a->eu + r0 * F, F, a->xe + r0 * d, d,
                                          gemm_w(pu->dtype, wu, pu->lshape[1], pu->lshape[2]), M };
            ex[n++] = e;
        }
        if (n == 0) break;
        gemm_xwt_group(g, 2 * (int)n);
        const size_t r0 = (size_t)a->e_off[e0], r1 = (size_t)a->e_off[e];
        swiglu_forward(a->eh + r0 * F, a->eg + r0 * F, a->eu + r0 * F, r1 - r0, F);
        for (size_t i = 0; i < n; i++) {
            const size_t q0 = (size_t)a->e_off[ex[i]], M = (size_t)a->e_off[ex[i] + 1] - q0;
            g[i] = (GemmProblem){ a->eoe + q0 * d, d, a->eh + q0 * F, F,
                                  gemm_w(pd->dtype, wdown[i], pd->lshape[1], pd->lshape[2]), M };
        }
        gemm_xwt_group(g, (int)n);
    }
}

/* Decoding's expert block: each expert's gate, up, SwiGLU and down on one
 * thread, the experts with rows claimed one at a time in one pool region
 * (instead of a region for every gate/up, a serial SwiGLU and a region
 * for every down).  Each product is gemm_xwt's on the same rows, and
 * SwiGLU is elementwise: the bits are the grouped path's. */
#define EXPERT_FUSED_ROWS 4   /* rows per expert at most (a few decoding sequences) */

struct fused_ctx { const Model *m; const Layer *L; LayerActs *a; const int32_t *act; };

static void experts_fused_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct fused_ctx *c = vc;
    const size_t d = c->m->d, F = c->m->F;
    LayerActs *a = c->a;
    for (size_t i = i0; i < i1; i++) {
        const size_t e = (size_t)c->act[i], r0 = (size_t)a->e_off[e], M = (size_t)a->e_off[e + 1] - r0;
        const GemmProblem gu[2] = { { a->eg + r0 * F, F, a->xe + r0 * d, d, param_mat(c->L->egate, e), M },
                                    { a->eu + r0 * F, F, a->xe + r0 * d, d, param_mat(c->L->eup, e), M } };
        const GemmW wd = param_mat(c->L->edown, e);
        gemm_xwt_group_serial(gu, 2);   /* x quantized once for both */
        swiglu_forward(a->eh + r0 * F, a->eg + r0 * F, a->eu + r0 * F, M, F);
        gemm_xwt_serial(a->eoe + r0 * d, d, a->eh + r0 * F, F, &wd, M);
    }
}

/* The fused block when every expert with rows has at most
 * EXPERT_FUSED_ROWS and they share out evenly: four or more a thread
 * (GROUP_SPLIT-like), or a whole number a thread with the same rows each
 * (one sequence decoding: k experts of one row); false otherwise. */
static bool experts_forward_fused(const Model *m, const Layer *L, LayerActs *a)
{
    const size_t E = m->E, nt = (size_t)pool_threads();
    if (nt < 2) return false;   /* one thread: the grouped path, without the scan */
    int32_t act[E];
    size_t n = 0, m_lo = SIZE_MAX, m_hi = 0;
    for (size_t e = 0; e < E; e++) {
        const size_t M = (size_t)(a->e_off[e + 1] - a->e_off[e]);
        if (M > EXPERT_FUSED_ROWS) return false;
        if (M == 0) continue;
        act[n++] = (int32_t)e;
        m_lo = td_min(m_lo, M);
        m_hi = td_max(m_hi, M);
    }
    const bool even = n > 0 && n % nt == 0 && m_lo == m_hi;
    if (n < 4 * nt && !even) return false;
    struct fused_ctx c = { m, L, a, act };
    pool_for(n, 1, experts_fused_range, &c);
    return true;
}

void model_experts_forward(const Model *m, const Layer *L, LayerActs *a)
{
    if (m->ecache) {
        experts_forward_cached(m, L, a);
        return;
    }
    if (experts_forward_fused(m, L, a)) return;
    const size_t d = m->d, F = m->F, E = m->E;
    /* gate and up of every expert in one region, then every down: the
     * grouped GEMM computes each element as its own GEMM would */
    GemmProblem *g = a->eprob;
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)a->e_off[e], M = (size_t)a->e_off[e + 1] - r0;
        g[2 * e] = (GemmProblem){ a->eg + r0 * F, F, a->xe + r0 * d, d, param_mat(L->egate, e), M };
        g[2 * e + 1] = (GemmProblem){ a->eu + r0 * F, F, a->xe + r0 * d, d, param_mat(L->eup, e), M };
    }
    gemm_xwt_group(g, 2 * (int)E);
    swiglu_forward(a->eh, a->eg, a->eu, a->n_recv, F);
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)a->e_off[e], M = (size_t)a->e_off[e + 1] - r0;
        g[e] = (GemmProblem){ a->eoe + r0 * d, d, a->eh + r0 * F, F, param_mat(L->edown, e), M };
    }
    gemm_xwt_group(g, (int)E);
}

/* y1 = x W1^T and y2 = x W2^T in one region (gate and up of a SwiGLU). */
static void pair_forward(float *y1, float *y2, const float *x, const Param *w1, const Param *w2,
                         size_t N, size_t F, size_t d)
{
    (void)d;
    GemmProblem g[2] = { { y1, F, x, d, param_mat(w1, 0), N }, { y2, F, x, d, param_mat(w2, 0), N } };
    gemm_xwt_group(g, 2);
}

/* ---------------------------------------------------------------- expert parallelism
 * Dispatch order groups rows by global expert e = r * El + e', so the rows
 * for ep rank r are contiguous.  Received rows arrive source-major (for
 * each source rank, its rows for local expert 0, 1, ...); experts want them
 * expert-major.  cnt[src * El + e'] counts rows. */

static bool ep_on(const Model *m) { return m->topo.ep > 1 && m->comm.ep_alltoallv; }

static void ep_permute(float *out, const float *in, const int32_t *cnt, size_t ep, size_t El,
                       size_t d, bool to_expert_major)
{
    size_t src_off[ep * El], exp_off[ep * El], o = 0;
    for (size_t i = 0; i < ep * El; i++) {
        src_off[i] = o;
        o += (size_t)cnt[i];
    }
    o = 0;
    for (size_t e = 0; e < El; e++)
        for (size_t r = 0; r < ep; r++) {
            exp_off[r * El + e] = o;
            o += (size_t)cnt[r * El + e];
        }
    for (size_t i = 0; i < ep * El; i++) {
        size_t n = (size_t)cnt[i] * d * sizeof(float);
        if (to_expert_major) memcpy(out + exp_off[i] * d, in + src_off[i] * d, n);
        else memcpy(out + src_off[i] * d, in + exp_off[i] * d, n);
    }
}

/* Byte counts and displacements of the payload: dispatch side (this rank's
 * rows by destination) and expert side (rows by source). */
static void ep_counts(const Model *m, const LayerActs *a, size_t *disp_c, size_t *disp_d,
                      size_t *exp_c, size_t *exp_d)
{
    const size_t ep = (size_t)m->topo.ep, El = m->E, row = m->d * sizeof(float);
    size_t o = 0;
    for (size_t r = 0; r < ep; r++) {
        size_t ns = 0, nr = 0;
        for (size_t e = 0; e < El; e++) {
            ns += (size_t)a->ep_send[r * El + e];
            nr += (size_t)a->ep_recv[r * El + e];
        }
        disp_c[r] = ns * row;
        disp_d[r] = (size_t)a->plan.offsets[r * El] * row;
        exp_c[r] = nr * row;
        exp_d[r] = o * row;
        o += nr;
    }
}

void model_ep_to_experts(const Model *m, LayerActs *a, size_t n_rows)
{
    const size_t El = m->E;
    if (!ep_on(m)) {
        memcpy(a->e_off, a->plan.offsets, (El + 1) * sizeof(int32_t));
        a->n_recv = n_rows;
        if (a->xe != a->xd) memcpy(a->xe, a->xd, n_rows * m->d * sizeof(float));
        return;
    }
    const size_t ep = (size_t)m->topo.ep;
    for (size_t i = 0; i < ep * El; i++) a->ep_send[i] = a->plan.offsets[i + 1] - a->plan.offsets[i];
    size_t sc[ep], sd[ep], rc[ep], rd[ep];
    for (size_t r = 0; r < ep; r++) {
        sc[r] = rc[r] = El * sizeof(int32_t);
        sd[r] = rd[r] = r * El * sizeof(int32_t);
    }
    m->comm.ep_alltoallv(m->comm.ctx, a->ep_send, sc, sd, a->ep_recv, rc, rd);
    ep_counts(m, a, sc, sd, rc, rd);
    m->comm.ep_alltoallv(m->comm.ctx, a->xd, sc, sd, a->ep_stage, rc, rd);
    ep_permute(a->xe, a->ep_stage, a->ep_recv, ep, El, m->d, true);
    a->e_off[0] = 0;
    for (size_t e = 0; e < El; e++) {
        int32_t n = 0;
        for (size_t r = 0; r < ep; r++) n += a->ep_recv[r * El + e];
        a->e_off[e + 1] = a->e_off[e] + n;
    }
    a->n_recv = (size_t)a->e_off[El];
}

void model_ep_from_experts(const Model *m, LayerActs *a, const float *src, float *dst, size_t n_rows)
{
    if (!ep_on(m)) {
        if (src != dst) memcpy(dst, src, n_rows * m->d * sizeof(float));
        return;
    }
    const size_t ep = (size_t)m->topo.ep;
    size_t dc[ep], dd[ep], ec[ep], ed[ep];
    ep_counts(m, a, dc, dd, ec, ed);
    ep_permute(a->ep_stage, src, a->ep_recv, ep, m->E, m->d, false);
    m->comm.ep_alltoallv(m->comm.ctx, a->ep_stage, ec, ed, dst, dc, dd);
}

void model_ep_back_to_experts(const Model *m, LayerActs *a, const float *src, float *dst, size_t n_rows)
{
    if (!ep_on(m)) {
        if (src != dst) memcpy(dst, src, n_rows * m->d * sizeof(float));
        return;
    }
    const size_t ep = (size_t)m->topo.ep;
    size_t dc[ep], dd[ep], ec[ep], ed[ep];
    ep_counts(m, a, dc, dd, ec, ed);
    m->comm.ep_alltoallv(m->comm.ctx, src, dc, dd, a->ep_stage, ec, ed);
    ep_permute(dst, a->ep_stage, a->ep_recv, ep, m->E, m->d, true);
}

/* Serving under ep (Topology.ep_shared_rows): every ep rank holds the
 * same N rows (h2g) and routing (plan), so no rows need sending: this
 * rank gathers the rows of its own experts from its h2g (rows
 * [offsets[r El], offsets[(r+1) El]) of the dispatch order, each (token,
 * choice) once over the ranks), computes them, and the expert outputs are
 * all-gathered into a->eo (N k, d) in dispatch order: one collective a
 * layer, and every rank combines the whole batch.  The rows' bits are the
 * single process's (the kernels are row-invariant). */
static void ep_shared_experts(const Model *m, const Layer *L, LayerActs *a)
{
    const size_t ep = (size_t)m->topo.ep, El = m->E, row = m->d * sizeof(float);
    const size_t r = (size_t)m->topo.ep_rank, lo = (size_t)a->plan.offsets[r * El];
    MoePlan mine = a->plan;
    mine.src += lo;
    for (size_t e = 0; e <= El; e++) a->e_off[e] = a->plan.offsets[r * El + e] - (int32_t)lo;
    a->n_recv = (size_t)a->e_off[El];
    moe_dispatch_forward(a->xe, a->h2g, &mine, a->n_recv, 1, m->d);
    model_experts_forward(m, L, a);
    size_t sc[ep], sd[ep], rc[ep], rd[ep];
    for (size_t s = 0; s < ep; s++) {
        sc[s] = a->n_recv * row;
        sd[s] = 0;
        rc[s] = (size_t)(a->plan.offsets[(s + 1) * El] - a->plan.offsets[s * El]) * row;
        rd[s] = (size_t)a->plan.offsets[s * El] * row;
    }
    m->comm.ep_alltoallv(m->comm.ctx, a->eoe, sc, sd, a->eo, rc, rd);
}

/* ys (N, d) = shared SwiGLU of h2; with the gate, its hidden rows are
 * scaled by g_t = sigmoid(h2_t . w_g) before the down projection (the same
 * as scaling its output: the projection is linear). */
static void shared_forward(const Model *m, const Layer *L, LayerActs *a, size_t N, float *ys)
{
    pair_forward(a->sg, a->su, a->h2g, L->sgate, L->sup, N, m->S, m->d);
    swiglu_forward(a->sh, a->sg, a->su, N, m->S);
    const float *hs = a->sh;
    if (L->sgw) {
        sigmoid_gate_forward(a->sgv, a->h2g, L->sgw->w, N, m->d);
        row_scale_forward(a->shg, a->sgv, a->sh, N, m->S);
        hs = a->shg;
    }
    param_linear(ys, hs, L->sdown, N);
}

static void dense_forward(const Model *m, const Layer *L, LayerActs *a, size_t N)
{
    pair_forward(a->fg, a->fu, a->h2g, L->gate, L->up, N, m->Fd, m->d);
    swiglu_forward(a->fh, a->fg, a->fu, N, m->Fd);
    param_linear(a->y, a->fh, L->down, N);
}

/* Router, statistics and losses, dispatch, experts, combine: a->y.  tmp
 * (N, d) is free scratch for the shared experts' output. */
static void moe_forward(const Model *m, const Layer *L, const ModelBatch *b, LayerActs *a, float *tmp)
{
    const size_t N = b->n, d = m->d, E = m->E_global, k = m->k;
    const double t0 = td_now();
    param_linear(a->rlogits, a->h2g, L->router, N);
    const bool sig = m->cfg.scoring_func == ROUTER_SIGMOID;
    if (sig) {
        const MoeSigmoidRouter r = model_sigmoid_router(&m->cfg);
        moe_router_sigmoid_forward(a->probs, a->topk_idx, a->topk_w, a->rlogits, L->rbias ? L->rbias->w : NULL,
                                   N, E, k, &r);
    } else {
        moe_router_forward(a->probs, a->rlse, a->topk_idx, a->topk_w, a->rlogits, N, E, k,
                           m->cfg.norm_topk_prob);
    }
    /* statistics over the whole micro-batch: count (E), psum (E), z sum (1),
     * contiguous in a->count (count also feeds training's bias update) */
    double *st = a->count;
    moe_aux_stats(st, st + E, a->probs, a->topk_idx, N, E, k);
    st[2 * E] = sig ? 0.0 : (double)moe_z_sum(a->rlse, N);
    if (m->comm.dp_allreduce_f64 && m->topo.dp * m->topo.cp > 1) m->comm.dp_allreduce_f64(m->comm.ctx, st, 2 * E + 1);
    /* the aux and z losses are the softmax router's; a sigmoid router is
     * balanced by its bias update and the sequence-wise loss (train/) */
    a->aux = sig ? 0.0f : moe_aux_loss(a->count, a->psum, b->n_tot, E, k);
    a->z = (float)(st[2 * E] / (double)b->n_tot);
    a->t_router += td_now() - t0;

    moe_plan_build(&a->plan, a->topk_idx, N, E, k);
    if (ep_on(m) && m->topo.ep_shared_rows) {
        ep_shared_experts(m, L, a);   /* serving: every ep rank holds the batch */
    } else {
        moe_dispatch_forward(a->xd, a->h2g, &a->plan, N, k, d);
        model_ep_to_experts(m, a, N * k);
        model_experts_forward(m, L, a);
        model_ep_from_experts(m, a, a->eoe, a->eo, N * k);
    }
    moe_combine_forward(a->y, a->eo, a->topk_w, &a->plan, N, k, d);
    if (L->sgate) {
        shared_forward(m, L, a, N, tmp);
        residual_add(a->y, a->y, tmp, N * d);
    }
}

/* q, k (N, H*hd) (N, Hkv*hd) = q/k norm of qr, kr: per head (one weight
 * [hd] for every head) or over the whole projection, whose sums of squares
 * are summed over the tensor-parallel ranks holding its heads. */
static void qk_norm_forward(const Model *m, const Layer *L, LayerActs *a, size_t N)
{
    const size_t hd = m->hd, Hq = m->H * hd, Hk = m->Hkv * hd;
    const float eps = (float)m->cfg.rms_norm_eps;
    if (m->cfg.qk_norm == QK_NORM_HEAD) {
        rmsnorm_forward(a->q, a->rstdq, a->qr, L->qn->w, N * m->H, hd, eps);
        rmsnorm_forward(a->k, a->rstdk, a->kr, L->kn->w, N * m->Hkv, hd, eps);
    } else {
        rmsnorm_sumsq(a->qkss, a->qr, N, Hq);
        rmsnorm_sumsq(a->qkss + N, a->kr, N, Hk);
        tp_sum(m, a->qkss, 2 * N);
        rmsnorm_scale_forward(a->q, a->rstdq, a->qr, a->qkss, L->qn->w, N, Hq, L->qn->shape[0], eps);
        rmsnorm_scale_forward(a->k, a->rstdk, a->kr, a->qkss + N, L->kn->w, N, Hk, L->kn->shape[0], eps);
    }
}

/* q, k, v before RoPE: projections of h1 (+ biases) into qr, kr, vr, then
 * the q/k norm and the clamp (see layer.h), into q, k, v. */
static void qkv_forward(const Model *m, const Layer *L, LayerActs *a, size_t N)
{
    const size_t d = m->d, Hq = m->H * m->hd, Hk = m->Hkv * m->hd;
    GemmProblem qkv[3] = { { a->qr, Hq, a->h1g, d, param_mat(L->q, 0), N },
                           { a->kr, Hk, a->h1g, d, param_mat(L->k, 0), N },
                           { a->vr, Hk, a->h1g, d, param_mat(L->v, 0), N } };
    gemm_xwt_group(qkv, 3);   /* one region for the three projections */
    if (L->qb) {
        bias_forward(a->qr, L->qb->w, N, Hq);
        bias_forward(a->kr, L->kb->w, N, Hk);
        bias_forward(a->vr, L->vb->w, N, Hk);
    }
    if (L->qn) qk_norm_forward(m, L, a, N);
    if (m->clip > 0) {
        clamp_forward(a->q, L->qn ? a->q : a->qr, N * Hq, m->clip);
        clamp_forward(a->k, L->kn ? a->k : a->kr, N * Hk, m->clip);
        clamp_forward(a->v, a->vr, N * Hk, m->clip);
    }
}

/* Stores the batch's keys k and values v (NULL: values in the keys) into
 * a->kv and attends a->q to them: the attention call of both attention
 * blocks.  Under context parallelism (CpView) every cp rank's keys and
 * values are gathered and stored first. */
static void attend(const Model *m, const Layer *L, const ModelBatch *b, LayerActs *a, const float *k,
                   const float *v)
{
    const CpView *cp = b->cp;
    const AttnShape sh = model_layer_attn(m, L);
    if (!cp) {
        attention_kv_store(a->kv, b->seqs, b->n_seq, k, v, &sh);
    } else {
        const size_t N = b->n, wk = sh.Hkv * sh.dk, wv = sh.Hkv * sh.dv;
        memcpy(cp->gk + (size_t)cp->rank * N * wk, k, N * wk * sizeof(float));
        m->comm.cp_allgather(m->comm.ctx, cp->gk, N * wk);
        if (v) {
            memcpy(cp->gv + (size_t)cp->rank * N * wv, v, N * wv * sizeof(float));
            m->comm.cp_allgather(m->comm.ctx, cp->gv, N * wv);
        }
        attention_kv_store(a->kv, cp->kv_seqs, cp->n_kv_seq, cp->gk, v ? cp->gv : NULL, &sh);
    }
    attention_forward(a->att, a->lse, a->q, a->kv, b->seqs, b->n_seq, &sh);
}

/* ---------------------------------------------------------------- decoding's fused attention block
 * For a few rows (decoding, short chunks) without context parallelism:
 * the q/k/v products, their biases, per-head norm and clamp, RoPE, the KV
 * store and attention in one pool region, a unit of u kv heads with their
 * query heads at a time, instead of a region for the products, RoPE and
 * the store on the calling thread, and a region for attention.  Each
 * piece computes its elements as the unfused path does (a product's column
 * slice is its columns, gemm.h; the rest is per head or per element, and
 * attention_forward_heads is attention_forward's arithmetic), so the bits
 * are the same.  Not with a norm over the whole projection (its sums span
 * every head).  Measured (docs/serving.md), decoding's attention block per
 * token on a Zen 5, 2 threads: int8 weights 17-25% less time, float32 4-6%,
 * bf16 0-5%; prefetching the KV store's lines before the products took
 * another 11% (int8) and 3.5% (float32) off it. */
#define ATTN_FUSED_ROWS 16

/* u, or 0: the unfused path.  u is the fewest kv heads whose columns fill
 * whole GEMM panels, doubled while every thread still has a unit and the
 * k and v slices are narrower than gemm's wide kernel (NP_WIDE panels):
 * on medium and moe128 (hd 64, 4 kv heads) two heads a unit, one unit a
 * thread, beat one head a unit with the region's stealing. */
static size_t attn_fused_heads(const Model *m, const ModelBatch *b)
{
    const size_t nt = (size_t)pool_threads();
    if (m->mla || b->cp || b->n > ATTN_FUSED_ROWS || nt < 2 || m->cfg.qk_norm == QK_NORM_FULL) return 0;
    size_t u = 1;
    while ((u * m->hd) % GEMM_NR) u++;
    if (m->Hkv % u || m->Hkv / u < 2) return 0;
    while (u * m->hd < 4 * GEMM_NR && m->Hkv % (2 * u) == 0 && m->Hkv / (2 * u) >= nt) u *= 2;
    return u;
}

struct attn_fused_ctx { const Model *m; const Layer *L; const ModelBatch *b; LayerActs *a; AttnShape sh; size_t u; };

static void attn_fused_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct attn_fused_ctx *c = vc;
    const Model *m = c->m;
    const Layer *L = c->L;
    const ModelBatch *b = c->b;
    LayerActs *a = c->a;
    const size_t N = b->n, d = m->d, hd = m->hd, u = c->u, R = m->H / m->Hkv;
    const size_t Hq = m->H * hd, Hk = m->Hkv * hd, nk = u * hd, nq = R * nk;
    const float eps = (float)m->cfg.rms_norm_eps;
    const GemmW wq = param_mat(L->q, 0), wk = param_mat(L->k, 0), wv = param_mat(L->v, 0);
    for (size_t i = i0; i < i1; i++) {
        const size_t g0 = i * u, k0 = g0 * hd, q0 = R * k0;
        const GemmProblem qkv[3] = { { a->qr + q0, Hq, a->h1g, d, gemm_w_cols(&wq, q0, nq), N },
                                     { a->kr + k0, Hk, a->h1g, d, gemm_w_cols(&wk, k0, nk), N },
                                     { a->vr + k0, Hk, a->h1g, d, gemm_w_cols(&wv, k0, nk), N } };
        attention_kv_store_prefetch(a->kv, b->seqs, b->n_seq, &c->sh, g0, g0 + u);   /* in flight during the products */
        gemm_xwt_group_serial(qkv, 3);
        for (size_t t = 0; t < N; t++) {
            float *qr = a->qr + t * Hq + q0, *kr = a->kr + t * Hk + k0, *vr = a->vr + t * Hk + k0;
            float *q = a->q + t * Hq + q0, *k = a->k + t * Hk + k0, *v = a->v + t * Hk + k0;
            if (L->qb) {
                bias_forward(qr, L->qb->w + q0, 1, nq);
                bias_forward(kr, L->kb->w + k0, 1, nk);
                bias_forward(vr, L->vb->w + k0, 1, nk);
            }
            if (L->qn) {   /* per head (attn_fused_heads) */
                rmsnorm_forward(q, a->rstdq + t * m->H + R * g0, qr, L->qn->w, R * u, hd, eps);
                rmsnorm_forward(k, a->rstdk + t * m->Hkv + g0, kr, L->kn->w, u, hd, eps);
            }
            if (m->clip > 0) {
                clamp_forward(q, L->qn ? q : qr, nq, m->clip);
                clamp_forward(k, L->kn ? k : kr, nk, m->clip);
                clamp_forward(v, vr, nk, m->clip);
            }
            rope_forward_at(q, b->pos + t, &m->rope, 1, R * u, hd, 0, hd, false);
            rope_forward_at(k, b->pos + t, &m->rope, 1, u, hd, 0, hd, false);
        }
        attention_kv_store_heads(a->kv, b->seqs, b->n_seq, a->k, a->v, &c->sh, g0, g0 + u);
        attention_forward_heads(a->att, a->lse, a->q, a->kv, b->seqs, b->n_seq, &c->sh, g0, g0 + u);
    }
}

bool model_attn_fused(const Model *m, const ModelBatch *b) { return attn_fused_heads(m, b) > 0; }

/* MLA's attention block (docs/mla.md), absorbed: from a->h1 to the
 * output projection's input a->matt, through the KV blocks. */
static void mla_forward(const Model *m, const Layer *L, const ModelBatch *b, LayerActs *a)
{
    const MlaDims *md = &m->mla_dims;
    const size_t N = b->n, r = md->r, rope = md->rope, qk = md->nope + rope;
    const size_t qr = (size_t)m->cfg.q_lora_rank, kw = r + rope;
    const float eps = (float)m->cfg.rms_norm_eps;
    const bool inter = m->cfg.rope_interleave;
    if (L->qa) {
        param_linear(a->cq, a->h1g, L->qa, N);
        rmsnorm_forward(a->cqn, a->rstdcq, a->cq, L->qan->w, N, qr, eps);
        param_linear(a->mq, a->cqn, L->q, N);
    } else {
        param_linear(a->mq, a->h1g, L->q, N);
    }
    param_linear(a->kva, a->h1g, L->kva, N);
    for (size_t t = 0; t < N; t++) memcpy(a->ckv + t * r, a->kva + t * kw, r * sizeof(float));
    rmsnorm_forward(a->ckvn, a->rstdkv, a->ckv, L->kvan->w, N, r, eps);
    for (size_t t = 0; t < N; t++) {   /* key = [c_kv normed, k_rope] */
        memcpy(a->k + t * kw, a->ckvn + t * r, r * sizeof(float));
        memcpy(a->k + t * kw + r, a->kva + t * kw + r, rope * sizeof(float));
    }
    rope_forward_at(a->k, b->pos, &m->rope, N, 1, kw, r, rope, inter);
    rope_forward_at(a->mq, b->pos, &m->rope, N, md->H, qk, md->nope, rope, inter);
    mla_absorb_q_forward(a->q, a->mq, L->kvb->w, N, md);
    attend(m, L, b, a, a->k, NULL);
    mla_absorb_o_forward(a->matt, a->att, L->kvb->w, N, md);
}

void model_layer_forward(const Model *m, int l, const ModelBatch *b, const float *x_in,
                         float *x_out, LayerActs *a)
{
    const Layer *L = &m->layers[l];
    const size_t N = b->n, d = m->d, hd = m->hd, H = m->H, Hkv = m->Hkv;
    const size_t Nl = model_sp_rows(m, N);   /* residual rows held here (layer.h) */
    const bool sp = m->topo.sp;
    const float eps = (float)m->cfg.rms_norm_eps;
    const double t0 = td_now();
    size_t u;

    rmsnorm_forward(a->h1, a->rstd1, x_in, L->ln1->w, Nl, d, eps);
    model_sp_gather(m, a->h1g, a->h1, N);
    /* o_proj's partial rows: in place without sp; with sp into y (free
     * until the FFN), then reduce-scattered into this rank's x_mid rows */
    float *part = sp ? a->y : a->x_mid;
    if (m->mla) {
        mla_forward(m, L, b, a);
        param_linear(part, a->matt, L->o, N);
    } else if ((u = attn_fused_heads(m, b)) > 0) {
        struct attn_fused_ctx c = { m, L, b, a, model_layer_attn(m, L), u };
        pool_for(Hkv / u, 1, attn_fused_range, &c);
        param_linear(part, a->att, L->o, N);
    } else {
        qkv_forward(m, L, a, N);
        rope_forward(a->q, b->pos, &m->rope, N, H, hd);
        rope_forward(a->k, b->pos, &m->rope, N, Hkv, hd);
        attend(m, L, b, a, a->k, a->v);
        param_linear(part, a->att, L->o, N);
    }
    model_tp_reduce_rows(m, a->x_mid, part, N);
    if (L->ob) bias_forward(a->x_mid, L->ob->w, Nl, d);   /* once, after the sum */
    residual_add(a->x_mid, x_in, a->x_mid, Nl * d);
    a->t_attn += td_now() - t0;
    model_layer_forward_ffn(m, l, b, x_out, a);
}

void model_layer_forward_ffn(const Model *m, int l, const ModelBatch *b, float *x_out, LayerActs *a)
{
    const Layer *L = &m->layers[l];
    const size_t N = b->n, d = m->d, Nl = model_sp_rows(m, N);
    const bool sp = m->topo.sp;
    const double t1 = td_now();
    rmsnorm_forward(a->h2, a->rstd2, a->x_mid, L->ln2->w, Nl, d, (float)m->cfg.rms_norm_eps);
    model_sp_gather(m, a->h2g, a->h2, N);
    /* x_in is not read again: x_out (which may alias it) is scratch here;
     * with sp it holds Nl rows only, and h1g (read by nothing after the
     * attention block) is the (N, d) scratch instead */
    if (L->moe) moe_forward(m, L, b, a, sp ? a->h1g : x_out);
    else dense_forward(m, L, a, N);
    /* x_out = x_mid + y (with sp, y's rows reduce-scattered into x_out
     * first: the same sum, a + b = b + a) */
    float *y = sp ? x_out : a->y;
    model_tp_reduce_rows(m, y, a->y, N);
    residual_add(x_out, a->x_mid, y, Nl * d);
    a->t_ffn += td_now() - t1;
}

void model_ffn_recompute(const Model *m, int l, const ModelBatch *b, LayerActs *a)
{
    const Layer *L = &m->layers[l];
    const size_t N = b->n;
    if (!L->moe) {
        pair_forward(a->fg, a->fu, a->h2g, L->gate, L->up, N, m->Fd, m->d);
        swiglu_forward(a->fh, a->fg, a->fu, N, m->Fd);
        return;
    }
    moe_dispatch_forward(a->xd, a->h2g, &a->plan, N, m->k, m->d);
    model_ep_to_experts(m, a, N * m->k);
    model_experts_forward(m, L, a);
    model_ep_from_experts(m, a, a->eoe, a->eo, N * m->k);
    if (L->sgate) {   /* sgv, the gate, is kept: backward rescales from it */
        pair_forward(a->sg, a->su, a->h2g, L->sgate, L->sup, N, m->S, m->d);
        swiglu_forward(a->sh, a->sg, a->su, N, m->S);
    }
}

/* The q/k/v buffers before norm and clamp: aliases of q, k, v when off. */
void layer_acts_carve_qkv(LayerActs *a, Arena *ar, const Model *m, size_t N)
{
    const size_t Hq = m->H * m->hd, Hk = m->Hkv * m->hd;
    const QkNorm qn = m->cfg.qk_norm;
    a->qr = m->qk_pre ? arena_floats(ar, N * Hq) : a->q;
    a->kr = m->qk_pre ? arena_floats(ar, N * Hk) : a->k;
    a->vr = m->clip > 0 ? arena_floats(ar, N * Hk) : a->v;
    a->rstdq = qn == QK_NORM_NONE ? NULL : arena_floats(ar, qn == QK_NORM_HEAD ? N * m->H : N);
    a->rstdk = qn == QK_NORM_NONE ? NULL : arena_floats(ar, qn == QK_NORM_HEAD ? N * m->Hkv : N);
}

void layer_acts_carve_mla(LayerActs *a, Arena *ar, const Model *m, size_t N)
{
    const MlaDims *md = &m->mla_dims;
    const size_t qr = (size_t)m->cfg.q_lora_rank;
    a->mq = arena_floats(ar, N * md->H * (md->nope + md->rope));
    a->cq = qr ? arena_floats(ar, N * qr) : NULL;
    a->cqn = qr ? arena_floats(ar, N * qr) : NULL;
    a->rstdcq = qr ? arena_floats(ar, N) : NULL;
    a->kva = arena_floats(ar, N * (md->r + md->rope));
    a->ckv = arena_floats(ar, N * md->r); a->rstdkv = arena_floats(ar, N);
    a->ckvn = arena_floats(ar, N * md->r); a->matt = arena_floats(ar, N * md->H * md->v);
}

void layer_acts_carve(LayerActs *a, Arena *ar, const Model *m, size_t N)
{
    a->t_attn = a->t_router = a->t_ffn = 0;
    bool any_dense = false, any_moe = false;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        any_dense |= !m->layers[l].moe;
        any_moe |= m->layers[l].moe;
    }
    const size_t d = m->d;
    const size_t E = any_moe ? m->E_global : 0, Nk = N * m->k;
    const size_t Nl = model_sp_rows(m, N);
    memset(a, 0, sizeof *a);
    a->h1 = arena_floats(ar, Nl * d); a->rstd1 = arena_floats(ar, Nl);
    a->h1g = m->topo.sp ? arena_floats(ar, N * d) : a->h1;
    a->q = arena_floats(ar, N * m->aq); a->k = arena_floats(ar, N * m->ak); a->v = arena_floats(ar, N * m->av);
    a->att = arena_floats(ar, N * m->ao); a->lse = arena_floats(ar, N * m->H);
    if (m->mla) layer_acts_carve_mla(a, ar, m, N);
    a->x_mid = arena_floats(ar, Nl * d); a->h2 = arena_floats(ar, Nl * d); a->rstd2 = arena_floats(ar, Nl);
    a->h2g = m->topo.sp ? arena_floats(ar, N * d) : a->h2;
    a->y = arena_floats(ar, N * d);
    layer_acts_carve_qkv(a, ar, m, N);
    a->qkss = m->cfg.qk_norm == QK_NORM_FULL ? arena_floats(ar, 2 * N) : NULL;
    if (any_dense) {
        a->fg = arena_floats(ar, N * m->Fd); a->fu = arena_floats(ar, N * m->Fd); a->fh = arena_floats(ar, N * m->Fd);
    }
    if (E) {
        a->rlogits = arena_floats(ar, N * E); a->probs = arena_floats(ar, N * E);
        a->rlse = arena_floats(ar, N); a->topk_w = arena_floats(ar, Nk);
        a->topk_idx = (int32_t *)arena_floats(ar, Nk);
        a->plan.offsets = (int32_t *)arena_floats(ar, E + 1);
        a->plan.src = (int32_t *)arena_floats(ar, Nk);
        a->plan.slot_row = (int32_t *)arena_floats(ar, Nk);
        const size_t ep = (size_t)m->topo.ep, R = ep * Nk;
        a->xd = arena_floats(ar, Nk * d); a->eo = arena_floats(ar, Nk * d);
        a->xe = ep > 1 ? arena_floats(ar, R * d) : a->xd;
        a->eoe = ep > 1 ? arena_floats(ar, R * d) : a->eo;
        a->ep_stage = ep > 1 ? arena_floats(ar, R * d) : NULL;
        a->eg = arena_floats(ar, R * m->F); a->eu = arena_floats(ar, R * m->F); a->eh = arena_floats(ar, R * m->F);
        a->e_off = (int32_t *)arena_floats(ar, m->E + 1);
        a->ep_send = (int32_t *)arena_floats(ar, ep * m->E);
        a->ep_recv = (int32_t *)arena_floats(ar, ep * m->E);
        if (m->S) {
            a->sg = arena_floats(ar, N * m->S); a->su = arena_floats(ar, N * m->S); a->sh = arena_floats(ar, N * m->S);
        }
        if (m->S && m->cfg.shared_expert_gate) {
            a->sgv = arena_floats(ar, N); a->shg = arena_floats(ar, N * m->S);
        }
        double *st = (double *)arena_bytes(ar, (2 * E + 1) * sizeof(double));
        a->count = st;
        a->psum = st ? st + E : NULL;
        a->eprob = (GemmProblem *)arena_bytes(ar, 2 * m->E * sizeof(GemmProblem));
        a->bprob = (GemmBwProblem *)arena_bytes(ar, 3 * m->E * sizeof(GemmBwProblem));
    }
}

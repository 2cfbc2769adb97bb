/* core/model/vision.c - the vision tower and projector, forward and
 * backward (vision.h). */
#include "core/model/vision.h"
#include "core/common.h"
#include "core/ops/bias.h"
#include "core/ops/gemm.h"
#include "core/ops/gelu.h"
#include "core/ops/layernorm.h"
#include "core/ops/linear.h"
#include "core/pool.h"

#include <string.h>

size_t vision_tokens_per_image(const ModelConfig *cfg)
{
    if (!config_vision(cfg)) return 0;
    const size_t g = (size_t)(cfg->vision_config.image_size / cfg->vision_config.patch_size);
    return g * g;
}

static void tp_sum(const Model *m, float *buf, size_t n)
{
    if (m->comm.tp_allreduce && m->topo.tp > 1) m->comm.tp_allreduce(m->comm.ctx, buf, n);
}

static float *fbuf(size_t n) { return td_calloc(td_max(n, 1) * sizeof(float)); }

/* L buffers of n floats; with share, one buffer that every l points at (a
 * forward-only encode reuses one layer's activations for the next). */
static float **fbufs(size_t L, size_t n, bool share)
{
    float **b = td_calloc(td_max(L, 1) * sizeof(float *));
    for (size_t l = 0; l < L; l++) b[l] = share && l > 0 ? b[0] : fbuf(n);
    return b;
}

static void fbufs_free(float **b, size_t L, bool share)
{
    for (size_t l = 0; b && l < L; l++)
        if (!share || l == 0) td_free(b[l]);
    td_free(b);
}

/* train: every layer's activations and the backward scratch; otherwise one
 * layer's, shared by all (x[l + 1] may overwrite x[l]: vision_forward reads
 * x[l] for the last time in x_mid's residual add, before fc2 writes
 * x[l + 1]), and no backward buffers. */
static void acts_init(VisionActs *a, const Model *m, size_t max_img, bool train)
{
    memset(a, 0, sizeof *a);
    const VisionTower *t = &m->vis;
    if (t->n_layers == 0 || max_img == 0) return;
    const size_t L = (size_t)t->n_layers, R = max_img * t->P, D = t->D, Dl = t->H * t->hd, F = t->F;
    const bool sh = !train;
    a->max_img = max_img;
    a->shared = sh;
    a->patches = fbuf(R * t->K);
    a->x = fbufs(L + 1, R * D, sh);
    a->h1 = fbufs(L, R * D, sh);
    a->mu1 = fbufs(L, R, sh);
    a->rs1 = fbufs(L, R, sh);
    a->q = fbufs(L, R * Dl, sh);
    a->k = fbufs(L, R * Dl, sh);
    a->v = fbufs(L, R * Dl, sh);
    a->att = fbufs(L, R * Dl, sh);
    a->lse = fbufs(L, R * t->H, sh);
    a->x_mid = fbufs(L, R * D, sh);
    a->h2 = fbufs(L, R * D, sh);
    a->mu2 = fbufs(L, R, sh);
    a->rs2 = fbufs(L, R, sh);
    a->f1 = fbufs(L, R * F, sh);
    a->g1 = fbufs(L, R * F, sh);
    a->kv = td_calloc(L * sizeof(void *));
    for (size_t l = 0; l < L; l++) a->kv[l] = sh && l > 0 ? a->kv[0] : td_calloc(max_img * attn_block_bytes(&t->attn));
    a->blocks = td_calloc(max_img * sizeof(int32_t));
    a->seqs = td_calloc(max_img * sizeof(AttnSeq));
    for (size_t i = 0; i < max_img; i++) {
        a->blocks[i] = (int32_t)i;
        a->seqs[i] = (AttnSeq){ .row = i * t->P, .n = t->P, .pos = 0, .blocks = &a->blocks[i] };
    }
    a->hp = fbuf(R * D);
    a->mup = fbuf(R);
    a->rsp = fbuf(R);
    a->a1 = fbuf(R * t->dp);
    a->ga1 = fbuf(R * t->dp);
    a->out = fbuf(R * m->d);
    a->n_layers = L;
    if (!train) return;
    a->dout = fbuf(R * m->d);
    a->dx = fbuf(R * D);
    a->dxm = fbuf(R * D);
    a->dh = fbuf(R * D);
    a->dq = fbuf(R * Dl);
    a->dk = fbuf(R * Dl);
    a->dv = fbuf(R * Dl);
    a->datt = fbuf(R * Dl);
    a->df = fbuf(R * F);
    a->dg = fbuf(R * F);
    a->dhp = fbuf(R * D);
    a->da1 = fbuf(R * t->dp);
    a->dga1 = fbuf(R * t->dp);
}

void vision_acts_init(VisionActs *a, const Model *m, size_t max_img) { acts_init(a, m, max_img, true); }

void vision_acts_free(VisionActs *a)
{
    const size_t L = a->n_layers;
    const bool sh = a->shared;
    float ***lists[] = { &a->x, &a->h1, &a->mu1, &a->rs1, &a->q, &a->k, &a->v, &a->att, &a->lse, &a->x_mid,
                         &a->h2, &a->mu2, &a->rs2, &a->f1, &a->g1 };
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) fbufs_free(*lists[i], i == 0 ? L + 1 : L, sh);
    for (size_t l = 0; a->kv && l < L; l++)
        if (!sh || l == 0) td_free(a->kv[l]);
    td_free(a->kv);
    float *bufs[] = { a->patches, a->hp, a->mup, a->rsp, a->a1, a->ga1, a->out, a->dout, a->dx, a->dxm, a->dh, a->dq,
                      a->dk, a->dv, a->datt, a->df, a->dg, a->dhp, a->da1, a->dga1 };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) td_free(bufs[i]);
    td_free(a->blocks);
    td_free(a->seqs);
    memset(a, 0, sizeof *a);
}

/* patches (n_img P, 3 p p) from pixels (n_img, 3, S, S). */
static void patchify(float *patches, const float *pixels, const VisionTower *t, size_t n_img)
{
    const size_t S = t->S, p = t->p, g = S / p;
    for (size_t i = 0; i < n_img; i++)
        for (size_t py = 0; py < g; py++)
            for (size_t px = 0; px < g; px++) {
                float *row = patches + ((i * g + py) * g + px) * t->K;
                for (size_t c = 0; c < 3; c++)
                    for (size_t ky = 0; ky < p; ky++)
                        memcpy(row + (c * p + ky) * p, pixels + ((i * 3 + c) * S + py * p + ky) * S + px * p,
                               p * sizeof(float));
            }
}

/* y (R, n) = x W^T (+ b), or for a row-parallel W: summed over tp, then + b. */
static void proj(const Model *m, float *y, const float *x, const Param *W, const Param *b, size_t R, bool row_par)
{
    const GemmW w = param_mat(W, 0);
    const size_t n = W->lshape[0];
    linear_forward(y, x, &w, R);
    if (row_par) tp_sum(m, y, R * n);
    bias_forward(y, b->w, R, n);
}

struct ew { float *y; const float *a, *b; };

static void add_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct ew *c = vc;
    for (size_t i = i0; i < i1; i++) c->y[i] = c->a[i] + c->b[i];
}

/* y = a + b elementwise, over the pool (y may alias a or b). */
static void add_rows(float *y, const float *a, const float *b, size_t n)
{
    struct ew c = { y, a, b };
    pool_for(n, 4096, add_range, &c);
}

static void zero_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct ew *c = vc;
    memset(c->y + i0, 0, (i1 - i0) * sizeof(float));
}

/* p = 0, n floats, over the pool (the backward's accumulators: a serial
 * memset leaves the helpers idle) */
static void zero(float *p, size_t n)
{
    struct ew c = { p, NULL, NULL };
    pool_for(n, 16384, zero_range, &c);
}

void vision_forward(const Model *m, VisionActs *a, const float *pixels, size_t n_img)
{
    const VisionTower *t = &m->vis;
    TD_CHECK(t->n_layers > 0, "vision_forward: the model has no vision tower");
    TD_CHECK(n_img <= a->max_img, "vision_forward: %zu images, buffers for %zu", n_img, a->max_img);
    const size_t R = n_img * t->P, D = t->D, P = t->P;
    a->n_img = n_img;
    a->R = R;
    if (n_img == 0) return;
    patchify(a->patches, pixels, t, n_img);
    proj(m, a->x[0], a->patches, t->patch, t->patchb, R, false);
    for (size_t r = 0; r < R; r++) {
        float *x = a->x[0] + r * D;
        const float *pe = t->pos->w + (r % P) * D;
        for (size_t i = 0; i < D; i++) x[i] += pe[i];
    }
    for (int l = 0; l < t->n_layers; l++) {
        const VisionLayer *L = &t->layers[l];
        layernorm_forward(a->h1[l], a->mu1[l], a->rs1[l], a->x[l], L->ln1->w, L->ln1b->w, R, D, t->eps);
        /* q, k and v in one pool region (the same bits as three gemm_xwt) */
        const size_t Dl = L->q->lshape[0];
        const GemmProblem g[3] = { { a->q[l], Dl, a->h1[l], D, param_mat(L->q, 0), R },
                                   { a->k[l], Dl, a->h1[l], D, param_mat(L->k, 0), R },
                                   { a->v[l], Dl, a->h1[l], D, param_mat(L->v, 0), R } };
        gemm_xwt_group(g, 3);
        bias_forward(a->q[l], L->qb->w, R, Dl);
        bias_forward(a->k[l], L->kb->w, R, Dl);
        bias_forward(a->v[l], L->vb->w, R, Dl);
        attention_kv_store(a->kv[l], a->seqs, n_img, a->k[l], a->v[l], &t->attn);
        attention_forward(a->att[l], a->lse[l], a->q[l], a->kv[l], a->seqs, n_img, &t->attn);
        proj(m, a->x_mid[l], a->att[l], L->o, L->ob, R, true);
        add_rows(a->x_mid[l], a->x_mid[l], a->x[l], R * D);
        layernorm_forward(a->h2[l], a->mu2[l], a->rs2[l], a->x_mid[l], L->ln2->w, L->ln2b->w, R, D, t->eps);
        proj(m, a->f1[l], a->h2[l], L->fc1, L->fc1b, R, false);
        gelu_forward(a->g1[l], a->f1[l], R * t->F);
        proj(m, a->x[l + 1], a->g1[l], L->fc2, L->fc2b, R, true);
        add_rows(a->x[l + 1], a->x[l + 1], a->x_mid[l], R * D);
    }
    layernorm_forward(a->hp, a->mup, a->rsp, a->x[t->n_layers], t->post->w, t->postb->w, R, D, t->eps);
    proj(m, a->a1, a->hp, t->p1, t->p1b, R, false);
    gelu_forward(a->ga1, a->a1, R * t->dp);
    proj(m, a->out, a->ga1, t->p2, t->p2b, R, true);
}

/* The products of proj's backward: dW += dy^T x and (dx != NULL) dx += dy W,
 * appended to g (the same bits as linear_backward's two calls). */
static int proj_bw_problems(GemmBwProblem *g, float *dx, const Param *W, const float *dy, const float *x, size_t R)
{
    const size_t n = W->lshape[0], k = W->lshape[1];
    int c = 0;
    if (dx) g[c++] = (GemmBwProblem){ 0, dx, k, dy, n, W->w, k, R, n, k };
    g[c++] = (GemmBwProblem){ 1, W->g, k, dy, n, x, k, R, n, k };
    return c;
}

/* Backward of proj: adds into dW, db and (dx != NULL) into dx (R, in);
 * dy (R, out); dW and dx in one pool region.  For a column-parallel W the
 * caller sums dx over tp. */
static void proj_backward(float *dx, const Param *W, const Param *b, const float *dy, const float *x, size_t R)
{
    bias_backward(b->g, dy, R, W->lshape[0]);
    GemmBwProblem g[2];
    gemm_bw_group(g, proj_bw_problems(g, dx, W, dy, x, R));
}

void vision_backward(Model *m, VisionActs *a, const float *dout)
{
    const VisionTower *t = &m->vis;
    const size_t R = a->R, D = t->D, P = t->P, Dl = t->H * t->hd, F = t->F, dp = t->dp;
    if (R == 0) return;
    /* projector */
    zero(a->dga1, R * dp);
    proj_backward(a->dga1, t->p2, t->p2b, dout, a->ga1, R);
    zero(a->da1, R * dp);
    gelu_backward(a->da1, a->dga1, a->a1, R * dp);
    zero(a->dhp, R * D);
    proj_backward(a->dhp, t->p1, t->p1b, a->da1, a->hp, R);
    tp_sum(m, a->dhp, R * D);
    zero(a->dx, R * D);
    layernorm_backward(a->dx, t->post->g, t->postb->g, a->dhp, a->x[t->n_layers], t->post->w, a->mup, a->rsp, R, D);
    for (int l = t->n_layers - 1; l >= 0; l--) {
        const VisionLayer *L = &t->layers[l];
        /* x_out = x_mid + fc2(gelu(fc1(ln2(x_mid)))): dx is d x_out */
        memcpy(a->dxm, a->dx, R * D * sizeof(float));
        zero(a->dg, R * F);
        proj_backward(a->dg, L->fc2, L->fc2b, a->dx, a->g1[l], R);
        zero(a->df, R * F);
        gelu_backward(a->df, a->dg, a->f1[l], R * F);
        zero(a->dh, R * D);
        proj_backward(a->dh, L->fc1, L->fc1b, a->df, a->h2[l], R);
        tp_sum(m, a->dh, R * D);
        layernorm_backward(a->dxm, L->ln2->g, L->ln2b->g, a->dh, a->x_mid[l], L->ln2->w, a->mu2[l], a->rs2[l], R, D);
        /* x_mid = x + o(attention(q, k, v)) */
        memcpy(a->dx, a->dxm, R * D * sizeof(float));
        zero(a->datt, R * Dl);
        proj_backward(a->datt, L->o, L->ob, a->dxm, a->att[l], R);
        zero(a->dq, R * Dl);
        zero(a->dk, R * Dl);
        zero(a->dv, R * Dl);
        attention_backward(a->dq, a->dk, a->dv, a->datt, a->q[l], a->att[l], a->lse[l], a->kv[l], a->seqs,
                           a->n_img, &t->attn);
        zero(a->dh, R * D);
        /* dh += dq Wq, then dk Wk, then dv Wv (in that order: they add into
         * one buffer), the three dW beside the first */
        bias_backward(L->qb->g, a->dq, R, L->q->lshape[0]);
        bias_backward(L->kb->g, a->dk, R, L->k->lshape[0]);
        bias_backward(L->vb->g, a->dv, R, L->v->lshape[0]);
        GemmBwProblem g[4];
        int n = proj_bw_problems(g, a->dh, L->q, a->dq, a->h1[l], R);
        n += proj_bw_problems(g + n, NULL, L->k, a->dk, a->h1[l], R);
        n += proj_bw_problems(g + n, NULL, L->v, a->dv, a->h1[l], R);
        gemm_bw_group(g, n);
        gemm_bw_group(g, proj_bw_problems(g, a->dh, L->k, a->dk, a->h1[l], R) - 1);
        gemm_bw_group(g, proj_bw_problems(g, a->dh, L->v, a->dv, a->h1[l], R) - 1);
        tp_sum(m, a->dh, R * D);
        layernorm_backward(a->dx, L->ln1->g, L->ln1b->g, a->dh, a->x[l], L->ln1->w, a->mu1[l], a->rs1[l], R, D);
    }
    /* x0 = patches Wpe^T + bpe + pos */
    for (size_t r = 0; r < R; r++) {
        float *g = t->pos->g + (r % P) * D;
        const float *dx = a->dx + r * D;
        for (size_t i = 0; i < D; i++) g[i] += dx[i];
    }
    proj_backward(NULL, t->patch, t->patchb, a->dx, a->patches, R);
}

void model_vision_encode(const Model *m, const float *pixels, size_t n_img, float *out)
{
    VisionActs a;
    acts_init(&a, m, n_img, false);
    vision_forward(m, &a, pixels, n_img);
    memcpy(out, a.out, n_img * m->vis.P * m->d * sizeof(float));
    vision_acts_free(&a);
}

void model_vision_scatter(const Model *m, float *x, const int32_t *ids, size_t n, const float *img,
                          size_t n_img_rows)
{
    const int32_t tok = m->cfg.image_token_index;
    const size_t d = m->d;
    size_t j = 0;
    for (size_t t = 0; t < n; t++) {
        if (ids[t] != tok) continue;
        TD_CHECK(j < n_img_rows, "model_vision_scatter: more image placeholders than the %zu image rows", n_img_rows);
        memcpy(x + t * d, img + j++ * d, d * sizeof(float));
    }
    TD_CHECK(j == n_img_rows, "model_vision_scatter: %zu image placeholders for %zu image rows", j, n_img_rows);
}

void model_vision_gather(const Model *m, float *dimg, float *dx, const int32_t *ids, size_t n,
                         size_t n_img_rows)
{
    const int32_t tok = m->cfg.image_token_index;
    const size_t d = m->d;
    size_t j = 0;
    for (size_t t = 0; t < n; t++) {
        if (ids[t] != tok) continue;
        TD_CHECK(j < n_img_rows, "model_vision_gather: more image placeholders than the %zu image rows", n_img_rows);
        memcpy(dimg + j++ * d, dx + t * d, d * sizeof(float));
        memset(dx + t * d, 0, d * sizeof(float));
    }
    TD_CHECK(j == n_img_rows, "model_vision_gather: %zu image placeholders for %zu image rows", j, n_img_rows);
}

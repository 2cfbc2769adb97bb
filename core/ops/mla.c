/* core/ops/mla.c - the absorbed products of MLA (mla.h). */
#include "core/ops/mla.h"
#include "core/common.h"
#include "core/ops/vec.h"
#include "core/pool.h"

#include <math.h>
#include <string.h>

struct mla_ctx {
    float *y, *dw;
    const float *x, *dy, *w;
    const MlaDims *d;
    size_t N;
};

/* Row (nope + v) h + i of kv_b_proj: W_uk_h row i (i < nope) or W_uv_h row i - nope. */
static inline const float *wrow(const float *w, const MlaDims *d, size_t h, size_t i)
{
    return w + (h * (d->nope + d->v) + i) * d->r;
}

/* y[j] = fma chain over n of x[n] w_n[j] (j < r) from 0, or added to y when acc. */
static inline void axpy_rows(float *y, const float *x, const float *w, size_t n_rows, size_t r, int acc)
{
    if (!acc) memset(y, 0, r * sizeof(float));
    for (size_t n = 0; n < n_rows; n++) {
        const float a = x[n], *wn = w + n * r;
        for (size_t j = 0; j < r; j++) y[j] = fmaf(a, wn[j], y[j]);
    }
}

/* dw[n][j] = fma(x[n], y[j], dw[n][j]), n < n_rows, j < r: one row's
 * term of a weight gradient. */
static inline void axpy_rows_t(float *dw, const float *x, const float *y, size_t n_rows, size_t r)
{
    for (size_t n = 0; n < n_rows; n++) {
        const float a = x[n];
        float *dn = dw + n * r;
        for (size_t j = 0; j < r; j++) dn[j] = fmaf(a, y[j], dn[j]);
    }
}

/* The row loops below take tokens in blocks of MLA_TB so that a weight
 * row, once read, serves every token of the block: the weights stream
 * once per block instead of once per token.  A token's own chain of FMAs
 * (or vec_dot) is the same as one token at a time, so are its bits. */
#define MLA_TB 8

static void q_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct mla_ctx *c = vc;
    const MlaDims *d = c->d;
    const size_t qk = d->nope + d->rope, lk = d->r + d->rope;
    for (size_t tb = t0; tb < t1; tb += MLA_TB) {
        const size_t te = td_min(tb + MLA_TB, t1);
        for (size_t h = 0; h < d->H; h++) {
            for (size_t t = tb; t < te; t++) {
                float *ql = c->y + (t * d->H + h) * lk;
                memset(ql, 0, d->r * sizeof(float));
                memcpy(ql + d->r, c->x + (t * d->H + h) * qk + d->nope, d->rope * sizeof(float));
            }
            for (size_t n = 0; n < d->nope; n++) {
                const float *wn = wrow(c->w, d, h, n);
                for (size_t t = tb; t < te; t++)
                    axpy_rows(c->y + (t * d->H + h) * lk, c->x + (t * d->H + h) * qk + n, wn, 1, d->r, 1);
            }
        }
    }
}

void mla_absorb_q_forward(float *ql, const float *restrict q, const float *restrict w, size_t N,
                          const MlaDims *d)
{
    struct mla_ctx c = { ql, NULL, q, NULL, w, d, N };
    pool_for(N, 4, q_fw_rows, &c);
}

static void q_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct mla_ctx *c = vc;
    const MlaDims *d = c->d;
    const size_t qk = d->nope + d->rope, lk = d->r + d->rope;
    for (size_t tb = t0; tb < t1; tb += MLA_TB) {
        const size_t te = td_min(tb + MLA_TB, t1);
        for (size_t h = 0; h < d->H; h++) {
            for (size_t n = 0; n < d->nope; n++) {
                const float *wn = wrow(c->w, d, h, n);
                for (size_t t = tb; t < te; t++)
                    c->y[(t * d->H + h) * qk + n] += vec_dot(wn, c->dy + (t * d->H + h) * lk, d->r);
            }
            for (size_t t = tb; t < te; t++) {
                float *dq = c->y + (t * d->H + h) * qk;
                const float *dql = c->dy + (t * d->H + h) * lk;
                for (size_t i = 0; i < d->rope; i++) dq[d->nope + i] += dql[d->r + i];
            }
        }
    }
}

/* dW_uk_h[n][j] += sum over rows t in order of q_nope[t][n] dql[t][j]. */
static void q_bw_heads(void *vc, size_t h0, size_t h1, int tid)
{
    (void)tid;
    const struct mla_ctx *c = vc;
    const MlaDims *d = c->d;
    const size_t qk = d->nope + d->rope, lk = d->r + d->rope;
    for (size_t h = h0; h < h1; h++)
        for (size_t t = 0; t < c->N; t++)
            axpy_rows_t(c->dw + (h * (d->nope + d->v)) * d->r, c->x + (t * d->H + h) * qk,
                        c->dy + (t * d->H + h) * lk, d->nope, d->r);
}

void mla_absorb_q_backward(float *dq, float *dw, const float *restrict dql, const float *restrict q,
                           const float *restrict w, size_t N, const MlaDims *d)
{
    struct mla_ctx c = { dq, dw, q, dql, w, d, N };
    pool_for(N, 4, q_bw_rows, &c);
    pool_for(d->H, 1, q_bw_heads, &c);
}

static void o_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct mla_ctx *c = vc;
    const MlaDims *d = c->d;
    for (size_t tb = t0; tb < t1; tb += MLA_TB) {
        const size_t te = td_min(tb + MLA_TB, t1);
        for (size_t h = 0; h < d->H; h++)
            for (size_t i = 0; i < d->v; i++) {
                const float *wi = wrow(c->w, d, h, d->nope + i);
                for (size_t t = tb; t < te; t++)
                    c->y[(t * d->H + h) * d->v + i] = vec_dot(wi, c->x + (t * d->H + h) * d->r, d->r);
            }
    }
}

void mla_absorb_o_forward(float *a, const float *restrict ol, const float *restrict w, size_t N,
                          const MlaDims *d)
{
    struct mla_ctx c = { a, NULL, ol, NULL, w, d, N };
    pool_for(N, 4, o_fw_rows, &c);
}

static void o_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct mla_ctx *c = vc;
    const MlaDims *d = c->d;
    for (size_t tb = t0; tb < t1; tb += MLA_TB) {
        const size_t te = td_min(tb + MLA_TB, t1);
        for (size_t h = 0; h < d->H; h++)
            for (size_t n = 0; n < d->v; n++) {
                const float *wn = wrow(c->w, d, h, d->nope + n);
                for (size_t t = tb; t < te; t++)
                    axpy_rows(c->y + (t * d->H + h) * d->r, c->dy + (t * d->H + h) * d->v + n, wn, 1, d->r, 1);
            }
    }
}

/* dW_uv_h[i][j] += sum over rows t in order of da[t][i] ol[t][j]. */
static void o_bw_heads(void *vc, size_t h0, size_t h1, int tid)
{
    (void)tid;
    const struct mla_ctx *c = vc;
    const MlaDims *d = c->d;
    for (size_t h = h0; h < h1; h++)
        for (size_t t = 0; t < c->N; t++)
            axpy_rows_t(c->dw + (h * (d->nope + d->v) + d->nope) * d->r, c->dy + (t * d->H + h) * d->v,
                        c->x + (t * d->H + h) * d->r, d->v, d->r);
}

void mla_absorb_o_backward(float *dol, float *dw, const float *restrict da, const float *restrict ol,
                           const float *restrict w, size_t N, const MlaDims *d)
{
    struct mla_ctx c = { dol, dw, ol, da, w, d, N };
    pool_for(N, 4, o_bw_rows, &c);
    pool_for(d->H, 1, o_bw_heads, &c);
}

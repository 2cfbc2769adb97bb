/* core/ops/softmax.c - softmax and fused log-softmax + cross-entropy (softmax.h). */
#include "core/ops/softmax.h"
#include "core/pool.h"
#include "core/ops/vec.h"
#include "core/ops/vexp.h"

#include <math.h>

/* Row log-sum-exp with a fixed order: max, then sum of exp(x - max) through
 * vec_sum's lanes.  tmp receives exp(x - max) (n floats). */
static float row_lse(float *tmp, const float *x, size_t n)
{
    float m = vec_max(x, n);
    for (size_t j = 0; j < n; j++) tmp[j] = x[j] - m;
    vexp_array(tmp, tmp, n);
    return m + logf(vec_sum(tmp, n));
}

struct sm_ctx {
    float *y, *lse; const float *x, *dy; const int32_t *tg; size_t n;
};

static void sm_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct sm_ctx *c = vc;
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * c->n;
        float *y = c->y + t * c->n;
        float m = vec_max(x, c->n);
        for (size_t j = 0; j < c->n; j++) y[j] = x[j] - m;
        vexp_array(y, y, c->n);
        float s = vec_sum(y, c->n);
        if (c->lse) c->lse[t] = m + logf(s);
        float inv = 1.0f / s;
        for (size_t j = 0; j < c->n; j++) y[j] *= inv;
    }
}

void softmax_forward(float *y, float *lse, const float *x, size_t N, size_t n)
{
    struct sm_ctx c = { y, lse, x, NULL, NULL, n };
    pool_for(N, 16, sm_fw_rows, &c);
}

static void sm_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct sm_ctx *c = vc;  /* y = dx, x = y */
    for (size_t t = t0; t < t1; t++) {
        const float *y = c->x + t * c->n, *dy = c->dy + t * c->n;
        float *dx = c->y + t * c->n;
        float s = vec_dot(dy, y, c->n);
        for (size_t j = 0; j < c->n; j++) dx[j] += y[j] * (dy[j] - s);
    }
}

void softmax_backward(float *dx, const float *restrict dy, const float *restrict y, size_t N, size_t n)
{
    struct sm_ctx c = { dx, NULL, y, dy, NULL, n };
    pool_for(N, 16, sm_bw_rows, &c);
}

static void xent_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct sm_ctx *c = vc;  /* y = logp, lse = lse, x = logits, tg */
    float tmp[4096];
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * c->n;
        float l;
        if (c->n <= 4096) {
            l = row_lse(tmp, x, c->n);
        } else {  /* large vocabularies: same order, chunked exp */
            float m = vec_max(x, c->n), s = 0.0f;
            for (size_t j0 = 0; j0 < c->n; j0 += 4096) {
                size_t nb = c->n - j0 < 4096 ? c->n - j0 : 4096;
                for (size_t j = 0; j < nb; j++) tmp[j] = x[j0 + j] - m;
                vexp_array(tmp, tmp, nb);
                s += vec_sum(tmp, nb);
            }
            l = m + logf(s);
        }
        c->lse[t] = l;
        c->y[t] = x[c->tg[t]] - l;
    }
}

void logsoftmax_xent_forward(float *logp, float *lse, const float *restrict logits,
                             const int32_t *restrict targets, size_t N, size_t V)
{
    struct sm_ctx c = { logp, lse, logits, NULL, targets, V };
    pool_for(N, 8, xent_fw_rows, &c);
}

static void xent_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct sm_ctx *c = vc;  /* y = dlogits, lse = lse, x = logits, dy = dlogp */
    float tmp[4096];
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * c->n;
        float *dx = c->y + t * c->n;
        const float g = c->dy[t], l = c->lse[t];
        if (g == 0.0f) continue;
        for (size_t j0 = 0; j0 < c->n; j0 += 4096) {   /* dx -= g softmax(x), in pieces */
            const size_t nb = c->n - j0 < 4096 ? c->n - j0 : 4096;
            for (size_t j = 0; j < nb; j++) tmp[j] = x[j0 + j] - l;
            vexp_array(tmp, tmp, nb);
            for (size_t j = 0; j < nb; j++) dx[j0 + j] -= g * tmp[j];
        }
        dx[c->tg[t]] += g;
    }
}

void logsoftmax_xent_backward(float *dlogits, const float *restrict dlogp,
                              const float *restrict logits, const float *restrict lse,
                              const int32_t *restrict targets, size_t N, size_t V)
{
    struct sm_ctx c = { dlogits, (float *)lse, logits, dlogp, targets, V };
    pool_for(N, 8, xent_bw_rows, &c);
}

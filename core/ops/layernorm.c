/* core/ops/layernorm.c - LayerNorm forward and backward (layernorm.h).
 *
 * Backward of y = xh w + b, xh = (x - mu) r, r = (var + eps)^(-1/2):
 *   g = dy w;  dx = r (g - mean(g) - xh mean(g xh))
 *   dw += sum_t dy xh;  db += sum_t dy
 */
#include "core/ops/layernorm.h"
#include "core/pool.h"
#include "core/ops/vec.h"

#include <math.h>

/* sum_i f_i in lanes, f_i = a_i (b == NULL), a_i b_i, or (a_i - c)^2 (sq). */
static inline float row_sum(const float *restrict a, const float *restrict b, float c, int sq, size_t d)
{
    float acc[VEC_LANES] = { 0 };
    size_t i = 0;
    for (; i + VEC_LANES <= d; i += VEC_LANES)
        for (int j = 0; j < VEC_LANES; j++) {
            const float u = sq ? a[i + j] - c : a[i + j];
            acc[j] = sq ? fmaf(u, u, acc[j]) : b ? fmaf(u, b[i + j], acc[j]) : acc[j] + u;
        }
    float s = vec_lanes_combine(acc);
    for (; i < d; i++) {
        const float u = sq ? a[i] - c : a[i];
        s = sq ? fmaf(u, u, s) : b ? fmaf(u, b[i], s) : s + u;
    }
    return s;
}

struct ln { float *y, *mean, *rstd, *dx, *dw, *db; const float *x, *w, *b, *dy, *mu, *rs; size_t N, d; float eps; };

static void ln_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct ln *c = vc;
    const size_t d = c->d;
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * d;
        float *y = c->y + t * d;
        const float mu = row_sum(x, NULL, 0.0f, 0, d) / (float)d;
        const float r = 1.0f / sqrtf(row_sum(x, NULL, mu, 1, d) / (float)d + c->eps);
        if (c->mean) c->mean[t] = mu;
        if (c->rstd) c->rstd[t] = r;
        for (size_t i = 0; i < d; i++) y[i] = fmaf((x[i] - mu) * r, c->w[i], c->b[i]);
    }
}

void layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *restrict w,
                       const float *restrict b, size_t N, size_t d, float eps)
{
    struct ln c = { .y = y, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = b, .N = N, .d = d, .eps = eps };
    pool_for(N, 8, ln_fw_rows, &c);
}

static void ln_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct ln *c = vc;
    const size_t d = c->d;
    const float *w = c->w;
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * d, *dy = c->dy + t * d;
        const float mu = c->mu[t], r = c->rs[t];
        /* sum_i g_i and sum_i g_i xh_i in lanes, then the tail */
        float sg[VEC_LANES] = { 0 }, sgx[VEC_LANES] = { 0 };
        size_t i = 0;
        for (; i + VEC_LANES <= d; i += VEC_LANES)
            for (int j = 0; j < VEC_LANES; j++) {
                const float g = dy[i + j] * w[i + j];
                sg[j] += g;
                sgx[j] = fmaf(g, (x[i + j] - mu) * r, sgx[j]);
            }
        float tg = vec_lanes_combine(sg), tgx = vec_lanes_combine(sgx);
        for (; i < d; i++) {
            const float g = dy[i] * w[i];
            tg += g;
            tgx = fmaf(g, (x[i] - mu) * r, tgx);
        }
        const float mg = tg / (float)d, mgx = tgx / (float)d;
        float *dx = c->dx + t * d;
        for (i = 0; i < d; i++) dx[i] += r * (dy[i] * w[i] - mg - (x[i] - mu) * r * mgx);
    }
}

static void ln_bw_cols(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct ln *c = vc;
    for (size_t t = 0; t < c->N; t++) {
        const float *dy = c->dy + t * c->d, *x = c->x + t * c->d;
        const float mu = c->mu[t], r = c->rs[t];
        for (size_t i = i0; i < i1; i++) {
            if (c->dw) c->dw[i] = fmaf(dy[i], (x[i] - mu) * r, c->dw[i]);
            if (c->db) c->db[i] += dy[i];
        }
    }
}

void layernorm_backward(float *dx, float *dw, float *db, const float *restrict dy, const float *restrict x,
                        const float *restrict w, const float *restrict mean, const float *restrict rstd,
                        size_t N, size_t d)
{
    struct ln c = { .dx = dx, .dw = dw, .db = db, .x = x, .w = w, .dy = dy, .mu = mean, .rs = rstd, .N = N, .d = d };
    if (dx) pool_for(N, 8, ln_bw_rows, &c);
    if (dw || db) pool_for(d, 16, ln_bw_cols, &c);
}

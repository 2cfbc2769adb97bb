/* core/ops/rmsnorm.c - RMSNorm forward and backward (rmsnorm.h).
 *
 * Backward of y = x * r * w with r = (mean(x^2) + eps)^(-1/2):
 *   dw_i += sum_t dy_ti x_ti r_t
 *   dx_ti += r_t (dy_ti w_i) - r_t^3 x_ti / D * sum_j dy_tj w_j x_tj
 * The whole-row and the split forms share the row kernels below, so they
 * give the same bits for the same columns.
 */
#include "core/ops/rmsnorm.h"
#include "core/pool.h"
#include "core/ops/vec.h"

#include <math.h>

/* ---------------------------------------------------------------- row kernels */

static inline float row_rstd(float ss, size_t D, float eps) { return 1.0f / sqrtf(ss / (float)D + eps); }

static inline void row_apply(float *y, const float *x, float r, const float *restrict w, size_t d)
{
    for (size_t i = 0; i < d; i++) y[i] = (x[i] * r) * w[i];
}

/* sum_i dy_i w_i x_i, in lanes as vec_dot */
static inline float row_dot(const float *restrict dy, const float *restrict x, const float *restrict w, size_t d)
{
    float acc[VEC_LANES] = { 0 };
    size_t i = 0;
    for (; i + VEC_LANES <= d; i += VEC_LANES)
        for (int j = 0; j < VEC_LANES; j++) acc[j] = fmaf(dy[i + j] * w[i + j], x[i + j], acc[j]);
    float s = vec_lanes_combine(acc);
    for (; i < d; i++) s = fmaf(dy[i] * w[i], x[i], s);
    return s;
}

static inline void row_dx(float *dx, const float *restrict dy, const float *restrict x, const float *restrict w,
                          float r, float s, size_t d, size_t D)
{
    const float k = r * r * r * s / (float)D;
    for (size_t i = 0; i < d; i++) dx[i] += r * (dy[i] * w[i]) - k * x[i];
}

/* ---------------------------------------------------------------- forward */

struct rms_fw { float *y, *rstd; const float *x, *w, *ss; size_t d, D; float eps; };

static void rms_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_fw *c = vc;
    const size_t d = c->d;
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * d;
        float r = row_rstd(c->ss ? c->ss[t] : vec_dot(x, x, d), c->D, c->eps);
        if (c->rstd) c->rstd[t] = r;
        row_apply(c->y + t * d, x, r, c->w, d);
    }
}

void rmsnorm_forward(float *y, float *rstd, const float *x, const float *restrict w,
                     size_t N, size_t d, float eps)
{
    struct rms_fw c = { y, rstd, x, w, NULL, d, d, eps };
    pool_for(N, 8, rms_fw_rows, &c);
}

void rmsnorm_scale_forward(float *y, float *rstd, const float *x, const float *restrict ss,
                           const float *restrict w, size_t N, size_t d, size_t D, float eps)
{
    struct rms_fw c = { y, rstd, x, w, ss, d, D, eps };
    pool_for(N, 8, rms_fw_rows, &c);
}

static void rms_ss_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_fw *c = vc;   /* rstd = ss */
    for (size_t t = t0; t < t1; t++) c->rstd[t] = vec_dot(c->x + t * c->d, c->x + t * c->d, c->d);
}

void rmsnorm_sumsq(float *ss, const float *restrict x, size_t N, size_t d)
{
    struct rms_fw c = { NULL, ss, x, NULL, NULL, d, d, 0 };
    pool_for(N, 8, rms_ss_rows, &c);
}

static void rms_apply_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_fw *c = vc;   /* ss = rstd (read) */
    for (size_t t = t0; t < t1; t++) row_apply(c->y + t * c->d, c->x + t * c->d, c->ss[t], c->w, c->d);
}

void rmsnorm_apply(float *y, const float *x, const float *restrict rstd, const float *restrict w,
                   size_t N, size_t d)
{
    struct rms_fw c = { y, NULL, x, w, rstd, d, d, 0 };
    pool_for(N, 8, rms_apply_rows, &c);
}

/* ---------------------------------------------------------------- backward */

struct rms_bw {
    float *dx, *dw, *s_out; const float *dy, *x, *w, *rstd, *s; size_t N, d, D;
};

static void rms_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_bw *c = vc;
    const size_t d = c->d;
    for (size_t t = t0; t < t1; t++) {
        const float *dy = c->dy + t * d, *x = c->x + t * d;
        const float s = c->s ? c->s[t] : row_dot(dy, x, c->w, d);
        row_dx(c->dx + t * d, dy, x, c->w, c->rstd[t], s, d, c->D);
    }
}

static void rms_bw_cols(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct rms_bw *c = vc;
    for (size_t t = 0; t < c->N; t++) {
        const float *dy = c->dy + t * c->d, *x = c->x + t * c->d;
        const float r = c->rstd[t];
        for (size_t i = i0; i < i1; i++) c->dw[i] += dy[i] * (x[i] * r);
    }
}

void rmsnorm_backward(float *dx, float *dw, const float *restrict dy, const float *restrict x,
                      const float *restrict w, const float *restrict rstd, size_t N, size_t d)
{
    struct rms_bw c = { dx, dw, NULL, dy, x, w, rstd, NULL, N, d, d };
    if (dx) pool_for(N, 8, rms_bw_rows, &c);
    if (dw) pool_for(d, 16, rms_bw_cols, &c);
}

static void rms_dot_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_bw *c = vc;
    for (size_t t = t0; t < t1; t++) c->s_out[t] = row_dot(c->dy + t * c->d, c->x + t * c->d, c->w, c->d);
}

void rmsnorm_dot(float *s, const float *restrict dy, const float *restrict x, const float *restrict w,
                 size_t N, size_t d)
{
    struct rms_bw c = { NULL, NULL, s, dy, x, w, NULL, NULL, N, d, d };
    pool_for(N, 8, rms_dot_rows, &c);
}

void rmsnorm_scale_backward(float *dx, float *dw, const float *restrict dy, const float *restrict x,
                            const float *restrict w, const float *restrict rstd, const float *restrict s,
                            size_t N, size_t d, size_t D)
{
    struct rms_bw c = { dx, dw, NULL, dy, x, w, rstd, s, N, d, D };
    if (dx) pool_for(N, 8, rms_bw_rows, &c);
    if (dw) pool_for(d, 16, rms_bw_cols, &c);
}

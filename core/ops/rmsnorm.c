/* core/ops/rmsnorm.c - RMSNorm forward and backward (rmsnorm.h).
 *
 * Backward of y = x * r * w with r = (mean(x^2) + eps)^(-1/2):
 *   dw_i += sum_t dy_ti x_ti r_t
 *   dx_ti += r_t (dy_ti w_i) - r_t^3 x_ti / d * sum_j dy_tj w_j x_tj
 */
#include "core/ops/rmsnorm.h"
#include "core/pool.h"
#include "core/ops/vec.h"

#include <math.h>

struct rms_fw { float *y, *rstd; const float *x, *w; size_t d; float eps; };

static void rms_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_fw *c = vc;
    const size_t d = c->d;
    for (size_t t = t0; t < t1; t++) {
        const float *x = c->x + t * d;
        float *y = c->y + t * d;
        float ss = vec_dot(x, x, d);
        float r = 1.0f / sqrtf(ss / (float)d + c->eps);
        if (c->rstd) c->rstd[t] = r;
        for (size_t i = 0; i < d; i++) y[i] = (x[i] * r) * c->w[i];
    }
}

void rmsnorm_forward(float *y, float *rstd, const float *x, const float *restrict w,
                     size_t N, size_t d, float eps)
{
    struct rms_fw c = { y, rstd, x, w, d, eps };
    pool_for(N, 8, rms_fw_rows, &c);
}

struct rms_bw {
    float *dx, *dw; const float *dy, *x, *w, *rstd; size_t N, d;
};

static void rms_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct rms_bw *c = vc;
    const size_t d = c->d;
    for (size_t t = t0; t < t1; t++) {
        const float *dy = c->dy + t * d, *x = c->x + t * d;
        float *dx = c->dx + t * d;
        const float r = c->rstd[t];
        float acc[VEC_LANES] = { 0 };
        size_t i = 0;
        for (; i + VEC_LANES <= d; i += VEC_LANES)
            for (int j = 0; j < VEC_LANES; j++)
                acc[j] = fmaf(dy[i + j] * c->w[i + j], x[i + j], acc[j]);
        float s = vec_lanes_combine(acc);
        for (; i < d; i++) s = fmaf(dy[i] * c->w[i], x[i], s);
        const float k = r * r * r * s / (float)d;
        for (i = 0; i < d; i++) dx[i] += r * (dy[i] * c->w[i]) - k * x[i];
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
    struct rms_bw c = { dx, dw, dy, x, w, rstd, N, d };
    if (dx) pool_for(N, 8, rms_bw_rows, &c);
    if (dw) pool_for(d, 16, rms_bw_cols, &c);
}

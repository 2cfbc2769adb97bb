/* core/ops/gelu.c - GELU forward and backward (gelu.h). */
#include "core/ops/gelu.h"
#include "core/pool.h"

#include <math.h>

#define GELU_RSQRT2 0.70710678118654752440f
#define GELU_RSQRT2PI 0.39894228040143267794f

struct gelu { float *y, *dx; const float *x, *dy; };

static void gelu_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct gelu *c = vc;
    for (size_t i = i0; i < i1; i++) {
        const float x = c->x[i];
        c->y[i] = x * (0.5f * (1.0f + erff(x * GELU_RSQRT2)));
    }
}

void gelu_forward(float *y, const float *x, size_t n)
{
    struct gelu c = { .y = y, .x = x };
    pool_for(n, 1024, gelu_fw_range, &c);
}

static void gelu_bw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct gelu *c = vc;
    for (size_t i = i0; i < i1; i++) {
        const float x = c->x[i];
        const float cdf = 0.5f * (1.0f + erff(x * GELU_RSQRT2)), pdf = GELU_RSQRT2PI * expf(-0.5f * x * x);
        c->dx[i] = fmaf(c->dy[i], fmaf(x, pdf, cdf), c->dx[i]);
    }
}

void gelu_backward(float *restrict dx, const float *restrict dy, const float *restrict x, size_t n)
{
    struct gelu c = { .dx = dx, .x = x, .dy = dy };
    pool_for(n, 1024, gelu_bw_range, &c);
}

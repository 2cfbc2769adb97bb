/* core/swiglu.c - SiLU / SwiGLU forward and backward (swiglu.h). */
#include "core/swiglu.h"
#include "core/pool.h"

#include <math.h>

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

struct sw_ctx { float *out, *out2; const float *a, *b, *c; };

static void swiglu_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct sw_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) {
        float g = c->a[i];
        c->out[i] = (g * sigmoidf(g)) * c->b[i];
    }
}

void swiglu_forward(float *h, const float *restrict g, const float *restrict u, size_t N, size_t F)
{
    struct sw_ctx c = { h, NULL, g, u, NULL };
    pool_for(N * F, 1024, swiglu_fw_range, &c);
}

static void swiglu_bw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct sw_ctx *c = vc;  /* out = dg, out2 = du, a = dh, b = g, c = u */
    for (size_t i = i0; i < i1; i++) {
        float g = c->b[i], s = sigmoidf(g), dh = c->a[i];
        c->out2[i] += dh * (g * s);
        c->out[i] += dh * c->c[i] * (s * (1.0f + g * (1.0f - s)));
    }
}

void swiglu_backward(float *dg, float *du, const float *restrict dh, const float *restrict g,
                     const float *restrict u, size_t N, size_t F)
{
    struct sw_ctx c = { dg, du, dh, g, u };
    pool_for(N * F, 1024, swiglu_bw_range, &c);
}

static void silu_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct sw_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) c->out[i] = c->a[i] * sigmoidf(c->a[i]);
}

void silu_forward(float *y, const float *restrict x, size_t n)
{
    struct sw_ctx c = { y, NULL, x, NULL, NULL };
    pool_for(n, 1024, silu_fw_range, &c);
}

static void silu_bw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct sw_ctx *c = vc;  /* out = dx, a = dy, b = x */
    for (size_t i = i0; i < i1; i++) {
        float x = c->b[i], s = sigmoidf(x);
        c->out[i] += c->a[i] * (s * (1.0f + x * (1.0f - s)));
    }
}

void silu_backward(float *dx, const float *restrict dy, const float *restrict x, size_t n)
{
    struct sw_ctx c = { dx, NULL, dy, x, NULL };
    pool_for(n, 1024, silu_bw_range, &c);
}

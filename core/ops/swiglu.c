/* core/ops/swiglu.c - SiLU / SwiGLU forward and backward (swiglu.h). */
#include "core/ops/swiglu.h"
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/vexp.h"

#include <math.h>

/* Elementwise in blocks of SW_BLK: e = exp(-g) through vexp_array (the
 * model's one exp), then s = 1 / (1 + e) and the products; the plain loops
 * are vectorised by the compiler, with the same bits as scalar code. */
#define SW_BLK 512

struct sw_ctx { float *out, *out2; const float *a, *b, *c; };

/* e[0..n) = sigmoid(x[0..n)) */
static void sigmoid_block(float *restrict e, const float *restrict x, size_t n)
{
    for (size_t j = 0; j < n; j++) e[j] = -x[j];
    vexp_array(e, e, n);
    for (size_t j = 0; j < n; j++) e[j] = 1.0f / (1.0f + e[j]);
}

static void swiglu_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct sw_ctx *c = vc;   /* out = h, a = g, b = u */
    float s[SW_BLK];
    for (size_t b0 = i0; b0 < i1; b0 += SW_BLK) {
        const size_t n = td_min(SW_BLK, i1 - b0);
        const float *restrict g = c->a + b0, *restrict u = c->b + b0;
        float *restrict h = c->out + b0;
        sigmoid_block(s, g, n);
        for (size_t j = 0; j < n; j++) h[j] = (g[j] * s[j]) * u[j];
    }
}

void swiglu_forward(float *restrict h, const float *restrict g, const float *restrict u, size_t N, size_t F)
{
    struct sw_ctx c = { h, NULL, g, u, NULL };
    /* A grain of 32 blocks: a decode step's few rows (top-k x F) run on
     * the calling thread instead of paying a pool hand-off for a few
     * microseconds of work.  Chunk boundaries stay multiples of SW_BLK, so
     * the blocks, and the bits, are those of any other split. */
    pool_for(N * F, 32 * SW_BLK, swiglu_fw_range, &c);
}

static void swiglu_bw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct sw_ctx *c = vc;  /* out = dg, out2 = du, a = dh, b = g, c = u */
    float s[SW_BLK];
    for (size_t b0 = i0; b0 < i1; b0 += SW_BLK) {
        const size_t n = td_min(SW_BLK, i1 - b0);
        const float *restrict dh = c->a + b0, *restrict g = c->b + b0, *restrict u = c->c + b0;
        float *restrict dg = c->out + b0, *restrict du = c->out2 + b0;
        sigmoid_block(s, g, n);
        for (size_t j = 0; j < n; j++) {
            du[j] += dh[j] * (g[j] * s[j]);
            dg[j] += dh[j] * u[j] * (s[j] * (1.0f + g[j] * (1.0f - s[j])));
        }
    }
}

void swiglu_backward(float *restrict dg, float *restrict du, const float *restrict dh, const float *restrict g,
                     const float *restrict u, size_t N, size_t F)
{
    struct sw_ctx c = { dg, du, dh, g, u };
    pool_for(N * F, 1024, swiglu_bw_range, &c);
}

static void silu_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct sw_ctx *c = vc;   /* out = y, a = x */
    float s[SW_BLK];
    for (size_t b0 = i0; b0 < i1; b0 += SW_BLK) {
        const size_t n = td_min(SW_BLK, i1 - b0);
        const float *restrict x = c->a + b0;
        float *restrict y = c->out + b0;
        sigmoid_block(s, x, n);
        for (size_t j = 0; j < n; j++) y[j] = x[j] * s[j];
    }
}

void silu_forward(float *restrict y, const float *restrict x, size_t n)
{
    struct sw_ctx c = { y, NULL, x, NULL, NULL };
    pool_for(n, 1024, silu_fw_range, &c);
}

static void silu_bw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct sw_ctx *c = vc;  /* out = dx, a = dy, b = x */
    float s[SW_BLK];
    for (size_t b0 = i0; b0 < i1; b0 += SW_BLK) {
        const size_t n = td_min(SW_BLK, i1 - b0);
        const float *restrict dy = c->a + b0, *restrict x = c->b + b0;
        float *restrict dx = c->out + b0;
        sigmoid_block(s, x, n);
        for (size_t j = 0; j < n; j++) dx[j] += dy[j] * (s[j] * (1.0f + x[j] * (1.0f - s[j])));
    }
}

void silu_backward(float *restrict dx, const float *restrict dy, const float *restrict x, size_t n)
{
    struct sw_ctx c = { dx, NULL, dy, x, NULL };
    pool_for(n, 1024, silu_bw_range, &c);
}

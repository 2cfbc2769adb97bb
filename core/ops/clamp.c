/* core/ops/clamp.c - clamp forward and backward (clamp.h). */
#include "core/ops/clamp.h"
#include "core/pool.h"

struct clamp_ctx { float *y; const float *x; float c; };

static void clamp_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct clamp_ctx *k = vc;
    const float c = k->c;
    for (size_t i = i0; i < i1; i++) {
        const float x = k->x[i];
        /* comparisons are false for NaN: it passes through unchanged */
        k->y[i] = x < -c ? -c : x > c ? c : x;
    }
}

void clamp_forward(float *y, const float *x, size_t n, float c)
{
    struct clamp_ctx k = { y, x, c };
    pool_for(n, 4096, clamp_fw_range, &k);
}

static void clamp_bw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct clamp_ctx *k = vc;   /* y = dy */
    const float c = k->c;
    for (size_t i = i0; i < i1; i++) {
        const float x = k->x[i];
        if (!(x >= -c && x <= c)) k->y[i] = 0.0f;
    }
}

void clamp_backward(float *dy, const float *restrict x, size_t n, float c)
{
    struct clamp_ctx k = { dy, x, c };
    pool_for(n, 4096, clamp_bw_range, &k);
}

/* core/ops/bias.c - bias add forward and backward (bias.h). */
#include "core/ops/bias.h"
#include "core/pool.h"

struct bias_ctx { float *y; const float *b; size_t N, n; };

static void bias_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct bias_ctx *c = vc;
    for (size_t t = t0; t < t1; t++) {
        float *restrict y = c->y + t * c->n;
        for (size_t i = 0; i < c->n; i++) y[i] += c->b[i];
    }
}

void bias_forward(float *y, const float *restrict b, size_t N, size_t n)
{
    struct bias_ctx c = { y, b, N, n };
    pool_for(N, 16, bias_fw_rows, &c);
}

/* columns [i0, i1) of db: y is db, b is dy */
static void bias_bw_cols(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct bias_ctx *c = vc;
    for (size_t t = 0; t < c->N; t++) {
        const float *restrict dy = c->b + t * c->n;
        for (size_t i = i0; i < i1; i++) c->y[i] += dy[i];
    }
}

void bias_backward(float *db, const float *restrict dy, size_t N, size_t n)
{
    struct bias_ctx c = { db, dy, N, n };
    pool_for(n, 64, bias_bw_cols, &c);
}

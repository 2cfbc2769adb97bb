/* core/ops/gate.c - sigmoid gate and row scaling, forward and backward (gate.h). */
#include "core/ops/gate.h"
#include "core/pool.h"
#include "core/ops/vec.h"
#include "core/ops/vexp.h"

struct gate_ctx {
    float *out, *out2; const float *a, *b, *c, *e; size_t N, n;
};

static void gate_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct gate_ctx *c = vc;   /* out = g, a = h, b = w */
    for (size_t t = t0; t < t1; t++)
        c->out[t] = 1.0f / (1.0f + vexp1(-vec_dot(c->a + t * c->n, c->b, c->n)));
}

void sigmoid_gate_forward(float *g, const float *restrict h, const float *restrict w, size_t N, size_t d)
{
    struct gate_ctx c = { g, NULL, h, w, NULL, NULL, N, d };
    pool_for(N, 16, gate_fw_rows, &c);
}

/* dl_t = dg_t g_t (1 - g_t): the gradient of the gate's logit */
static inline float gate_dlogit(float dg, float g) { return dg * (g * (1.0f - g)); }

static void gate_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct gate_ctx *c = vc;   /* out = dh, a = dg, b = h, c = w, e = g */
    for (size_t t = t0; t < t1; t++) {
        const float dl = gate_dlogit(c->a[t], c->e[t]);
        float *restrict dh = c->out + t * c->n;
        for (size_t i = 0; i < c->n; i++) dh[i] += dl * c->c[i];
    }
}

static void gate_bw_cols(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct gate_ctx *c = vc;   /* out2 = dw */
    for (size_t t = 0; t < c->N; t++) {
        const float dl = gate_dlogit(c->a[t], c->e[t]);
        const float *restrict h = c->b + t * c->n;
        for (size_t i = i0; i < i1; i++) c->out2[i] += dl * h[i];
    }
}

void sigmoid_gate_backward(float *dh, float *dw, const float *restrict dg, const float *restrict h,
                           const float *restrict w, const float *restrict g, size_t N, size_t d)
{
    struct gate_ctx c = { dh, dw, dg, h, w, g, N, d };
    if (dh) pool_for(N, 16, gate_bw_rows, &c);
    if (dw) pool_for(d, 64, gate_bw_cols, &c);
}

static void scale_fw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct gate_ctx *c = vc;   /* out = y, a = g, b = s */
    for (size_t t = t0; t < t1; t++) {
        const float g = c->a[t];
        const float *s = c->b + t * c->n;
        float *y = c->out + t * c->n;
        for (size_t i = 0; i < c->n; i++) y[i] = g * s[i];
    }
}

void row_scale_forward(float *y, const float *restrict g, const float *s, size_t N, size_t n)
{
    struct gate_ctx c = { y, NULL, g, s, NULL, NULL, N, n };
    pool_for(N, 16, scale_fw_rows, &c);
}

static void scale_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct gate_ctx *c = vc;   /* out = ds, out2 = dg, a = dy, b = s, c = g */
    for (size_t t = t0; t < t1; t++) {
        const float *restrict dy = c->a + t * c->n;
        if (c->out2) c->out2[t] += vec_dot(dy, c->b + t * c->n, c->n);
        if (c->out) {
            const float g = c->c[t];
            float *restrict ds = c->out + t * c->n;
            for (size_t i = 0; i < c->n; i++) ds[i] += g * dy[i];
        }
    }
}

void row_scale_backward(float *ds, float *dg, const float *restrict dy, const float *restrict s,
                        const float *restrict g, size_t N, size_t n)
{
    struct gate_ctx c = { ds, dg, dy, s, g, NULL, N, n };
    pool_for(N, 16, scale_bw_rows, &c);
}

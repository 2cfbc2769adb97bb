/* core/ops/rope.c - rotary embedding forward and backward (rope.h). */
#include "core/ops/rope.h"
#include "core/common.h"
#include "core/pool.h"

#include <math.h>

void rope_table_init(RopeTable *t, size_t max_pos, size_t hd, double theta)
{
    TD_CHECK(hd % 2 == 0, "rope: head_dim %zu is odd", hd);
    t->max_pos = max_pos;
    t->half = hd / 2;
    t->cos = td_malloc(max_pos * t->half * sizeof(float));
    t->sin = td_malloc(max_pos * t->half * sizeof(float));
    for (size_t i = 0; i < t->half; i++) {
        /* HF: inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim), float32 */
        float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)hd);
        for (size_t p = 0; p < max_pos; p++) {
            float f = (float)p * inv;
            t->cos[p * t->half + i] = cosf(f);
            t->sin[p * t->half + i] = sinf(f);
        }
    }
}

void rope_table_free(RopeTable *t)
{
    td_free(t->cos);
    td_free(t->sin);
    t->cos = t->sin = NULL;
}

struct rope_ctx {
    float *x; const int32_t *pos; const RopeTable *t; size_t nh, hd; float sgn;
    size_t stride, off; bool inter;
};

static void rope_rows(void *vc, size_t r0, size_t r1, int tid)
{
    (void)tid;
    struct rope_ctx *c = vc;
    const size_t half = c->hd / 2;
    for (size_t r = r0; r < r1; r++) {
        const float *cs = c->t->cos + (size_t)c->pos[r] * c->t->half;
        const float *sn = c->t->sin + (size_t)c->pos[r] * c->t->half;
        for (size_t h = 0; h < c->nh; h++) {
            float *x = c->x + (r * c->nh + h) * c->stride + c->off;
            if (c->inter) {   /* pairs (2i, 2i + 1) */
                for (size_t i = 0; i < half; i++) {
                    float s = c->sgn * sn[i];
                    float a = x[2 * i], b = x[2 * i + 1];
                    x[2 * i] = a * cs[i] - b * s;
                    x[2 * i + 1] = b * cs[i] + a * s;
                }
                continue;
            }
            for (size_t i = 0; i < half; i++) {
                /* backward rotates by -angle: sgn = -1 flips sin */
                float s = c->sgn * sn[i];
                float a = x[i], b = x[i + half];
                x[i] = a * cs[i] - b * s;
                x[i + half] = b * cs[i] + a * s;
            }
        }
    }
}

void rope_forward(float *x, const int32_t *restrict pos, const RopeTable *t,
                  size_t N, size_t n_heads, size_t hd)
{
    rope_forward_at(x, pos, t, N, n_heads, hd, 0, hd, false);
}

void rope_backward(float *dx, const int32_t *restrict pos, const RopeTable *t,
                   size_t N, size_t n_heads, size_t hd)
{
    rope_backward_at(dx, pos, t, N, n_heads, hd, 0, hd, false);
}

void rope_forward_at(float *x, const int32_t *restrict pos, const RopeTable *t, size_t N, size_t n_heads,
                     size_t stride, size_t off, size_t hd, bool interleave)
{
    TD_CHECK(hd == 2 * t->half, "rope: %zu dims, the table has %zu pairs", hd, t->half);
    struct rope_ctx c = { x, pos, t, n_heads, hd, 1.0f, stride, off, interleave };
    pool_for(N, 16, rope_rows, &c);
}

void rope_backward_at(float *dx, const int32_t *restrict pos, const RopeTable *t, size_t N, size_t n_heads,
                      size_t stride, size_t off, size_t hd, bool interleave)
{
    TD_CHECK(hd == 2 * t->half, "rope: %zu dims, the table has %zu pairs", hd, t->half);
    struct rope_ctx c = { dx, pos, t, n_heads, hd, -1.0f, stride, off, interleave };
    pool_for(N, 16, rope_rows, &c);
}

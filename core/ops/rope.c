/* core/ops/rope.c - rotary embedding forward and backward (rope.h). */
#include "core/ops/rope.h"
#include "core/common.h"
#include "core/pool.h"

#include <math.h>

double rope_yarn_mscale(double scale, double m)
{
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

double rope_attention_factor(const RopeScaling *s)
{
    if (!s || s->type != ROPE_SCALING_YARN) return 1.0;
    if (s->attention_factor > 0) return s->attention_factor;
    if (s->mscale != 0 && s->mscale_all_dim != 0)
        return rope_yarn_mscale(s->factor, s->mscale) / rope_yarn_mscale(s->factor, s->mscale_all_dim);
    return rope_yarn_mscale(s->factor, 1.0);
}

double rope_softmax_scale_factor(const RopeScaling *s)
{
    if (!s || s->type != ROPE_SCALING_YARN || s->mscale_all_dim == 0) return 1.0;
    double m = rope_yarn_mscale(s->factor, s->mscale_all_dim);
    return m * m;
}

/* HF find_correction_dim: the dimension whose wavelength makes n_rot
 * rotations over ctx positions (Python floats). */
static double correction_dim(double n_rot, double dim, double base, double ctx)
{
    return dim * log(ctx / (n_rot * 2 * M_PI)) / (2 * log(base));
}

void rope_inv_freq(float *inv, size_t hd, double theta, const RopeScaling *s, size_t max_pos)
{
    const size_t half = hd / 2;
    for (size_t i = 0; i < half; i++)
        /* HF: base ** (arange(0, dim, 2).float() / dim), float32; inv = 1 / that */
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)hd);
    if (!s || s->type == ROPE_SCALING_NONE) return;
    if (s->type == ROPE_SCALING_LINEAR) {
        for (size_t i = 0; i < half; i++) inv[i] /= (float)s->factor;   /* inv_freq /= factor */
        return;
    }
    /* yarn */
    const double fast = s->beta_fast != 0 ? s->beta_fast : 32, slow = s->beta_slow != 0 ? s->beta_slow : 1;
    const double ctx = s->original_max_position_embeddings > 0 ? s->original_max_position_embeddings : (double)max_pos;
    double lo = correction_dim(fast, (double)hd, theta, ctx), hi = correction_dim(slow, (double)hd, theta, ctx);
    if (!s->no_truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < (double)hd - 1 ? hi : (double)hd - 1;
    if (lo == hi) hi += 0.001;   /* HF: prevent singularity */
    const float flo = (float)lo, fspan = (float)(hi - lo), ffac = (float)s->factor;
    for (size_t i = 0; i < half; i++) {
        float pf = powf((float)theta, (float)(2 * i) / (float)hd);
        float extra = 1.0f / pf, inter = 1.0f / (ffac * pf);
        float ramp = ((float)i - flo) / fspan;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp;   /* inv_freq_extrapolation_factor */
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
}

void rope_table_init_scaled(RopeTable *t, size_t max_pos, size_t hd, double theta, const RopeScaling *s)
{
    TD_CHECK(hd % 2 == 0, "rope: head_dim %zu is odd", hd);
    t->max_pos = max_pos;
    t->half = hd / 2;
    t->cos = td_malloc(max_pos * t->half * sizeof(float));
    t->sin = td_malloc(max_pos * t->half * sizeof(float));
    float *inv = td_malloc(td_max(t->half, 1) * sizeof(float));
    rope_inv_freq(inv, hd, theta, s, max_pos);
    const bool scaled = s && s->type == ROPE_SCALING_YARN;
    const float att = (float)rope_attention_factor(s);   /* cos() * attention_scaling, float32 */
    for (size_t i = 0; i < t->half; i++) {
        for (size_t p = 0; p < max_pos; p++) {
            float f = (float)p * inv[i];
            float c = cosf(f), sn = sinf(f);
            t->cos[p * t->half + i] = scaled ? c * att : c;
            t->sin[p * t->half + i] = scaled ? sn * att : sn;
        }
    }
    td_free(inv);
}

void rope_table_init(RopeTable *t, size_t max_pos, size_t hd, double theta)
{
    rope_table_init_scaled(t, max_pos, hd, theta, NULL);
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

/* core/ops/gelu.c - GELU forward and backward (gelu.h).  erf and exp are
 * core/ops/verf.h's: 16 lanes at a time with AVX-512, the portable form
 * elsewhere and for the tail, the same bits. */
#include "core/ops/gelu.h"
#include "core/ops/verf.h"
#include "core/pool.h"

#define GELU_RSQRT2 0.70710678118654752440f
#define GELU_RSQRT2PI 0.39894228040143267794f

struct gelu { float *y, *dx; const float *x, *dy; };

static inline float gelu1(float x) { return x * (0.5f * (1.0f + verf1(x * GELU_RSQRT2))); }

static inline float gelu_grad1(float x, float dy, float dx)
{
    const float cdf = 0.5f * (1.0f + verf1(x * GELU_RSQRT2)), pdf = GELU_RSQRT2PI * vexpf1(-0.5f * x * x);
    return fmaf(dy, fmaf(x, pdf, cdf), dx);
}

static void gelu_fw_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct gelu *c = vc;
    size_t i = i0;
#if defined(__AVX512F__)
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), k = _mm512_set1_ps(GELU_RSQRT2);
    for (; i + 16 <= i1; i += 16) {
        const __m512 x = _mm512_loadu_ps(c->x + i);
        const __m512 e = verf16(_mm512_mul_ps(x, k));
        _mm512_storeu_ps(c->y + i, _mm512_mul_ps(x, _mm512_mul_ps(half, _mm512_add_ps(one, e))));
    }
#endif
    for (; i < i1; i++) c->y[i] = gelu1(c->x[i]);
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
    size_t i = i0;
#if defined(__AVX512F__)
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), k = _mm512_set1_ps(GELU_RSQRT2);
    const __m512 mh = _mm512_set1_ps(-0.5f), kp = _mm512_set1_ps(GELU_RSQRT2PI);
    for (; i + 16 <= i1; i += 16) {
        const __m512 x = _mm512_loadu_ps(c->x + i);
        const __m512 cdf = _mm512_mul_ps(half, _mm512_add_ps(one, verf16(_mm512_mul_ps(x, k))));
        const __m512 pdf = _mm512_mul_ps(kp, vexpf16(_mm512_mul_ps(_mm512_mul_ps(mh, x), x)));
        const __m512 g = _mm512_fmadd_ps(x, pdf, cdf);
        _mm512_storeu_ps(c->dx + i, _mm512_fmadd_ps(_mm512_loadu_ps(c->dy + i), g, _mm512_loadu_ps(c->dx + i)));
    }
#endif
    for (; i < i1; i++) c->dx[i] = gelu_grad1(c->x[i], c->dy[i], c->dx[i]);
}

void gelu_backward(float *restrict dx, const float *restrict dy, const float *restrict x, size_t n)
{
    struct gelu c = { .dx = dx, .x = x, .dy = dy };
    pool_for(n, 1024, gelu_bw_range, &c);
}

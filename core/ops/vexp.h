/* core/ops/vexp.h - exp(x) for float, 16 lanes at a time with AVX-512, 8 with
 * AVX2 + FMA, or one at a time in portable C, with the same bits.
 *
 * Cody-Waite reduction and a degree-6 polynomial (the coefficients of
 * SLEEF's xexpf, Shibata & Sharma 2020), every step an explicit float
 * operation so both paths round identically:
 *
 *     x  <- clamp(x, -104, 89)                 (exp(-104) rounds to 0, exp(89) = inf)
 *     q  =  round-to-nearest-even(x * log2 e)  (by adding and subtracting 1.5 * 2^23)
 *     r  =  fma(q, -L2U, x);  r = fma(q, -L2L, r)          |r| <= ~0.35
 *     u  =  c6;  u = fma(u, r, c_i) for c5 .. c1 = 1/2
 *     u  =  1 + fma(r * r, u, r)
 *     y  =  u 2^q rounded once: (u 2^(q>>1)) 2^(q - (q>>1)) in portable C and
 *           AVX2 (the first product is exact), vscalefps with AVX-512
 *
 * Error < 1 ulp: 0.99 ulp at worst against double exp over every float in
 * [-104, 89] (checked exhaustively when this was written, vector and
 * portable bit for bit, vexp8 too; tests/test_attention.c samples them).
 * exp(0) = 1 exactly, exp(-inf) = +0, exp(+inf) = +inf, NaN stays NaN.
 * Used by core/ops/attention.c, and through vexp_array by swiglu.c and
 * softmax.c.
 */
#ifndef TANDEM_CORE_OPS_VEXP_H
#define TANDEM_CORE_OPS_VEXP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define VEXP_LO   (-104.0f)
#define VEXP_HI   89.0f
#define VEXP_LOG2E 1.44269502162933349609375f
#define VEXP_L2U  0.693145751953125f
#define VEXP_L2L  1.428606765330187045e-06f
#define VEXP_RND  12582912.0f   /* 1.5 * 2^23: x + RND - RND rounds x to an integer */
#define VEXP_C6   0.000198527617612853646278381f
#define VEXP_C5   0.00139304355252534151077271f
#define VEXP_C4   0.00833336077630519866943359f
#define VEXP_C3   0.0416664853692054748535156f
#define VEXP_C2   0.166666671633720397949219f
#define VEXP_C1   0.5f

static inline float vexp_bits_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* exp(x), portable.  The comparisons mirror _mm512_max_ps(lo, x) and
 * _mm512_min_ps(hi, x) (a NaN x passes through both). */
static inline float vexp1(float x)
{
    x = VEXP_LO > x ? VEXP_LO : x;
    x = VEXP_HI < x ? VEXP_HI : x;
    const float t = x * VEXP_LOG2E;
    const float j = t + VEXP_RND;
    const float k = j - VEXP_RND;
    uint32_t jb;
    memcpy(&jb, &j, sizeof jb);
    const int32_t q = (int32_t)(jb - 0x4B400000u);   /* k as an integer */
    float r = fmaf(k, -VEXP_L2U, x);
    r = fmaf(k, -VEXP_L2L, r);
    float u = VEXP_C6;
    u = fmaf(u, r, VEXP_C5);
    u = fmaf(u, r, VEXP_C4);
    u = fmaf(u, r, VEXP_C3);
    u = fmaf(u, r, VEXP_C2);
    u = fmaf(u, r, VEXP_C1);
    u = 1.0f + fmaf(r * r, u, r);
    const int32_t n1 = (q - (q & 1)) / 2, n2 = q - n1;   /* n1 = floor(q / 2) */
    u = u * vexp_bits_f((uint32_t)(n1 + 127) << 23);
    return u * vexp_bits_f((uint32_t)(n2 + 127) << 23);
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* exp of 16 lanes; the same operations as vexp1, the same bits. */
static inline __attribute__((always_inline)) __m512 vexp16(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(VEXP_LO), x);
    x = _mm512_min_ps(_mm512_set1_ps(VEXP_HI), x);
    const __m512 rnd = _mm512_set1_ps(VEXP_RND);
    const __m512 j = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(VEXP_LOG2E)), rnd);
    const __m512 k = _mm512_sub_ps(j, rnd);
    __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-VEXP_L2U), x);
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(-VEXP_L2L), r);
    __m512 u = _mm512_set1_ps(VEXP_C6);
    u = _mm512_fmadd_ps(u, r, _mm512_set1_ps(VEXP_C5));
    u = _mm512_fmadd_ps(u, r, _mm512_set1_ps(VEXP_C4));
    u = _mm512_fmadd_ps(u, r, _mm512_set1_ps(VEXP_C3));
    u = _mm512_fmadd_ps(u, r, _mm512_set1_ps(VEXP_C2));
    u = _mm512_fmadd_ps(u, r, _mm512_set1_ps(VEXP_C1));
    u = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(r, r), u, r));
    /* u 2^k rounded once, as the two exact-then-rounding products of vexp1 */
    return _mm512_scalef_ps(u, k);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* exp of 8 lanes; the same operations as vexp1, the same bits (AVX2 has no
 * vscalefps: the two products of vexp1, exponents built from q). */
static inline __attribute__((always_inline)) __m256 vexp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(VEXP_LO), x);
    x = _mm256_min_ps(_mm256_set1_ps(VEXP_HI), x);
    const __m256 rnd = _mm256_set1_ps(VEXP_RND);
    const __m256 j = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(VEXP_LOG2E)), rnd);
    const __m256 k = _mm256_sub_ps(j, rnd);
    __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-VEXP_L2U), x);
    r = _mm256_fmadd_ps(k, _mm256_set1_ps(-VEXP_L2L), r);
    __m256 u = _mm256_set1_ps(VEXP_C6);
    u = _mm256_fmadd_ps(u, r, _mm256_set1_ps(VEXP_C5));
    u = _mm256_fmadd_ps(u, r, _mm256_set1_ps(VEXP_C4));
    u = _mm256_fmadd_ps(u, r, _mm256_set1_ps(VEXP_C3));
    u = _mm256_fmadd_ps(u, r, _mm256_set1_ps(VEXP_C2));
    u = _mm256_fmadd_ps(u, r, _mm256_set1_ps(VEXP_C1));
    u = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(r, r), u, r));
    /* q = k as an integer; n1 = q >> 1 (arithmetic: floor(q / 2), vexp1's
     * (q - (q & 1)) / 2), n2 = q - n1; u 2^n1 is exact, u 2^n1 2^n2 rounds once */
    const __m256i q = _mm256_sub_epi32(_mm256_castps_si256(j), _mm256_set1_epi32(0x4B400000));
    const __m256i n1 = _mm256_srai_epi32(q, 1), n2 = _mm256_sub_epi32(q, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    u = _mm256_mul_ps(u, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    return _mm256_mul_ps(u, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
}
#endif

/* y[i] = exp(x[i]) for i < n (y may be x): vexp16 or vexp8 over whole
 * vectors, vexp1 for the rest: the same bits for every element whichever
 * path is compiled.  The exp of every op of the model (attention, SiLU,
 * softmax, log-softmax), so that no result depends on libm's expf. */
static inline void vexp_array(float *y, const float *x, size_t n)
{
    size_t i = 0;
#if defined(__AVX512F__) && !defined(TANDEM_PORTABLE)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, vexp16(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__) && defined(__FMA__) && !defined(TANDEM_PORTABLE)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, vexp8(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = vexp1(x[i]);
}

#endif

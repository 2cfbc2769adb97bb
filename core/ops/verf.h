/* core/ops/verf.h - erff(x) and expf(x) for GELU (core/ops/gelu.c), 16
 * lanes at a time with AVX-512 or one at a time in portable C, with the
 * same bits, and the same bits as the libm GELU used before it was
 * vectorised: glibc 2.36's erff (fdlibm's float erf: rational
 * approximations on |x| < 0.84375, < 1.25, < 1/0.35, < 6, in float, no
 * fused operations) and its expf on FMA machines (__expf_fma: x N / ln 2
 * = k + r, 2^(k/N) from a 32-entry table, a cubic in r, in double with
 * fused multiply-adds).  Every step below is that code's, in the order
 * its compiled form performs them; the coefficients are its bit patterns.
 *
 *   erff:  |x| < 2^-28             x + efx x  (|x| < 2^-124: (16 x + 2 efx8 x) / 16)
 *          |x| < 0.84375           x + x R(x^2) / S(x^2)
 *          |x| < 1.25              sign (erx + P(s) / Q(s)),  s = |x| - 1
 *          |x| < 6                 sign (1 - exp(-z^2 - 0.5625) exp((z - |x|)(z + |x|) + R/S) / |x|),
 *                                  z = |x| with its 12 low mantissa bits cleared,
 *                                  R/S in 1 / x^2, two sets of coefficients split at 1/0.35
 *          |x| >= 6                sign (1 - 1e-30);  NaN -> NaN, +-inf -> +-1
 *   expf:  x > 88.72283 -> inf, x < -103.97208 -> 0, x < -103.27892 -> 2^-149 (glibc's
 *          may-underflow value), NaN -> NaN, -inf -> 0; else the table formula.
 *
 * The vector forms compute every branch for every lane (skipping a branch
 * no lane takes) and select per lane, so a lane's result is the scalar
 * one.  Checked against libm over every float when written (glibc
 * 2.36-9, Debian 12, on AVX-512), vector and portable bit for bit;
 * tests/test_gelu.c samples both (and compares with libm where it is that
 * glibc).  The AVX2 build uses the portable form.
 *
 * Origins and their notices: the erff algorithm and coefficients are
 * fdlibm's s_erff.c, "Copyright (C) 1993 by Sun Microsystems, Inc. All
 * rights reserved. Developed at SunPro, a Sun Microsystems, Inc. business.
 * Permission to use, copy, modify, and distribute this software is freely
 * granted, provided that this notice is preserved."  The expf method and
 * table are those of Arm's optimized-routines (math/expf.c, Copyright (c)
 * 2017-2018 Arm Limited, MIT licence), which glibc ships.
 */
#ifndef TANDEM_CORE_OPS_VERF_H
#define TANDEM_CORE_OPS_VERF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float verf_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static inline uint32_t verf_u(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static inline double verf_d(uint64_t b)
{
    double f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* glibc's __exp2f_data: T[i] = bits(2^(i/32)) - (i << 47), then the
 * constants. */
static const uint64_t VERF_T[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define VERF_INVLN2N 0x40471547652b82feull   /* 32 / ln 2 */
#define VERF_EC0     0x3ebc6af84b912394ull
#define VERF_EC1     0x3f2ebfce50fac4f3ull
#define VERF_EC2     0x3f962e42ff0c52d6ull
#define VERF_SHIFT   0x4338000000000000ull   /* 1.5 * 2^52 */
#define VERF_OFLOW   0x42b17217u             /* x above: inf */
#define VERF_UFLOW   0xc2cff1b4u             /* x below: 0 */
#define VERF_MUFLOW  0xc2ce8ecfu             /* x below: 2^-149 */

/* erff's coefficients, as its compiled code holds them: "-" marks one
 * subtracted (the constant is the coefficient's magnitude). */
static const uint32_t VERF_A[10] = {             /* |x| < 0.84375 */
    0xb7c756b1, 0x3bbd1489 /* - */, 0x3ce9528f /* - */, 0x3ea66beb /* - */, 0x3e0375d4, /* R: pp4 .. pp0 */
    0xb684e21a, 0x390aee49, 0x3ba68116, 0x3d852a63, 0x3ecbbbce,                           /* S: qq5 .. qq1 */
};
static const uint32_t VERF_B[13] = {             /* |x| < 1.25 */
    0xbb0df9c0, 0x3d1151b3, 0x3de31cc2 /* - */, 0x3ea2fe54, 0x3ebe9208 /* - */, 0x3ed46805,
    0x3b1acdc6 /* - */,                                                                  /* P: pa6 .. pa0 */
    0x3c445aa3, 0x3c5f6e13, 0x3e013307, 0x3d931ae7, 0x3f0a5785, 0x3dd9f331,              /* Q: qa6 .. qa1 */
};
static const uint32_t VERF_C[16] = {             /* |x| < 1/0.35 */
    0xc11d077e, 0x42a2932b /* - */, 0x43389ae7 /* - */, 0x4322658c /* - */, 0x42798057 /* - */,
    0x4128f022 /* - */, 0x3f31a0b7 /* - */, 0x3c21a093 /* - */,                           /* R: ra7 .. ra0 */
    0xbd777f97, 0x40d23f7c, 0x42d9451f, 0x43d6810b, 0x442158c9, 0x43d9486f, 0x4309a863, 0x419d35ce, /* S */
};
static const uint32_t VERF_D[14] = {             /* |x| < 6 */
    0xc3f1c275, 0x4480230b /* - */, 0x441f6441 /* - */, 0x4320a2ea /* - */, 0x418e104b /* - */,
    0x3f4c9dd4 /* - */, 0x3c21a092 /* - */,                                                /* R: rb6 .. rb0 */
    0xc1b38712, 0x43ed43a7, 0x451f90ce, 0x4547fdbb, 0x44c01759, 0x43a2e571, 0x41f2b459,     /* S: sb7 .. sb1 */
};
#define VERF_EFX    0x3e0375d4u
#define VERF_EFX16  0x400375d4u
#define VERF_ERX    0x3f58560bu
#define VERF_TINY   0x0da24260u
#define VERF_Q      0x3f100000u   /* 0.5625 */

/* expf, portable: the general formula (x not special). */
static inline float vexpf_main1(float x)
{
    const double xd = (double)x, inv = verf_d(VERF_INVLN2N), sh = verf_d(VERF_SHIFT);
    double kd = fma(inv, xd, sh);
    uint64_t ki;
    memcpy(&ki, &kd, sizeof ki);
    kd = kd - sh;
    const double r = fma(inv, xd, -kd);
    const double s = verf_d(VERF_T[ki & 31] + (ki << 47));
    const double z = fma(r, verf_d(VERF_EC0), verf_d(VERF_EC1));
    const double r2 = r * r;
    double y = fma(r, verf_d(VERF_EC2), 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

/* expf, portable, every input. */
static inline float vexpf1(float x)
{
    const uint32_t b = verf_u(x), top = (b >> 20) & 0x7ff;
    if (top > 0x42a) {
        if (b == 0xff800000u) return 0.0f;
        if (top > 0x7f7) return x + x;
        if (x > verf_f(VERF_OFLOW)) return INFINITY;
        if (x < verf_f(VERF_UFLOW)) return 0.0f;
        if (x < verf_f(VERF_MUFLOW)) return verf_f(1);
    }
    return vexpf_main1(x);
}

/* erff, portable. */
static inline float verf1(float x)
{
    const uint32_t hx = verf_u(x), ix = hx & 0x7fffffffu;
    const float one = 1.0f;
    if (ix > 0x7f7fffffu) return (float)(1 - (int)((hx >> 31) << 1)) + one / x;
    if (ix < 0x3f580000u) {
        if (ix < 0x31800000u) {
            if ((hx & 0x7c000000u) == 0) return (x * 16.0f + x * verf_f(VERF_EFX16)) * 0.0625f;
            return x * verf_f(VERF_EFX) + x;
        }
        const float z = x * x;
        float r = z * verf_f(VERF_A[0]);
        r = r - verf_f(VERF_A[1]);
        r = r * z - verf_f(VERF_A[2]);
        r = r * z - verf_f(VERF_A[3]);
        r = r * z + verf_f(VERF_A[4]);
        float s = z * verf_f(VERF_A[5]) + verf_f(VERF_A[6]);
        for (int i = 7; i < 10; i++) s = s * z + verf_f(VERF_A[i]);
        s = s * z + one;
        return (r / s) * x + x;
    }
    if (ix < 0x3fa00000u) {
        const float s = fabsf(x) - one;
        float P = s * verf_f(VERF_B[0]) + verf_f(VERF_B[1]);
        P = P * s - verf_f(VERF_B[2]);
        P = P * s + verf_f(VERF_B[3]);
        P = P * s - verf_f(VERF_B[4]);
        P = P * s + verf_f(VERF_B[5]);
        P = P * s - verf_f(VERF_B[6]);
        float Q = s * verf_f(VERF_B[7]) + verf_f(VERF_B[8]);
        for (int i = 9; i < 13; i++) Q = Q * s + verf_f(VERF_B[i]);
        Q = Q * s + one;
        const float q = P / Q;
        return (int32_t)hx >= 0 ? q + verf_f(VERF_ERX) : verf_f(VERF_ERX | 0x80000000u) - q;
    }
    if (ix > 0x40bfffffu) return (int32_t)hx >= 0 ? one - verf_f(VERF_TINY) : verf_f(VERF_TINY) - one;
    const float ax = fabsf(x), s = one / (x * x);
    float R, S;
    if (ix <= 0x4036db6du) {
        R = s * verf_f(VERF_C[0]) - verf_f(VERF_C[1]);
        for (int i = 2; i < 8; i++) R = R * s - verf_f(VERF_C[i]);
        S = s * verf_f(VERF_C[8]) + verf_f(VERF_C[9]);
        for (int i = 10; i < 16; i++) S = S * s + verf_f(VERF_C[i]);
        S = S * s + one;
    } else {
        R = s * verf_f(VERF_D[0]) - verf_f(VERF_D[1]);
        for (int i = 2; i < 7; i++) R = R * s - verf_f(VERF_D[i]);
        S = s * verf_f(VERF_D[7]) + verf_f(VERF_D[8]);
        for (int i = 9; i < 14; i++) S = S * s + verf_f(VERF_D[i]);
        S = S * s + one;
    }
    const float z = verf_f(verf_u(ax) & 0xfffff000u);
    const float e1 = vexpf_main1((-z) * z - verf_f(VERF_Q));
    const float q = R / S;
    const float e2 = vexpf_main1((z - ax) * (z + ax) + q);
    const float r = e2 * e1;
    return (int32_t)hx >= 0 ? one - r / ax : r / ax - one;
}

#if defined(__AVX512F__)
#include <immintrin.h>

#define VERF_S1(c) _mm512_set1_ps(verf_f(c))

/* the general expf formula on 8 doubles (converted floats) -> 8 floats */
static inline __attribute__((always_inline)) __m256 vexpf_main8d(__m512d xd)
{
    const __m512d inv = _mm512_set1_pd(verf_d(VERF_INVLN2N)), sh = _mm512_set1_pd(verf_d(VERF_SHIFT));
    __m512d kd = _mm512_fmadd_pd(inv, xd, sh);
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, sh);
    const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    const __m512i t = _mm512_add_epi64(_mm512_i64gather_epi64(idx, (const void *)VERF_T, 8), _mm512_slli_epi64(ki, 47));
    const __m512d s = _mm512_castsi512_pd(t);
    const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(verf_d(VERF_EC0)), _mm512_set1_pd(verf_d(VERF_EC1)));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(verf_d(VERF_EC2)), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

static inline __attribute__((always_inline)) __m512 vexpf_main16(__m512 x)
{
    const __m256 lo = vexpf_main8d(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    const __m256 hi = vexpf_main8d(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

/* expf of 16 lanes, vexpf1's bits. */
static inline __attribute__((always_inline)) __m512 vexpf16(__m512 x)
{
    __m512 y = vexpf_main16(x);
    const __m512i b = _mm512_castps_si512(x);
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(b, 20), _mm512_set1_epi32(0x7ff));
    const __mmask16 sp = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a));
    if (sp) {
        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, VERF_S1(VERF_MUFLOW), _CMP_LT_OQ) & sp, y, VERF_S1(1));
        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, VERF_S1(VERF_UFLOW), _CMP_LT_OQ) & sp, y, _mm512_setzero_ps());
        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, VERF_S1(VERF_OFLOW), _CMP_GT_OQ) & sp, y,
                                 _mm512_set1_ps(INFINITY));
        const __mmask16 nf = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x7f7)) & sp;
        y = _mm512_mask_blend_ps(nf, y, _mm512_add_ps(x, x));
        const __mmask16 ninf = _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32((int)0xff800000u));
        y = _mm512_mask_blend_ps(ninf, y, _mm512_setzero_ps());
    }
    return y;
}

/* erff of 16 lanes, verf1's bits. */
static inline __attribute__((always_inline)) __m512 verf16(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i hx = _mm512_castps_si512(x);
    const __m512i ix = _mm512_and_si512(hx, _mm512_set1_epi32(0x7fffffff));
    const __m512 ax = _mm512_castsi512_ps(ix);
    const __mmask16 neg = _mm512_cmplt_epi32_mask(hx, _mm512_setzero_si512());
#define VERF_LT(c) _mm512_cmplt_epu32_mask(ix, _mm512_set1_epi32((int)(c)))
    const __mmask16 mA = VERF_LT(0x3f580000u), mB = VERF_LT(0x3fa00000u) & ~mA;
    const __mmask16 mC = _mm512_cmpgt_epu32_mask(ix, _mm512_set1_epi32(0x40bfffff));
    const __mmask16 mX = _mm512_cmpgt_epu32_mask(ix, _mm512_set1_epi32(0x7f7fffff));
    const __mmask16 mD = (__mmask16)~(mA | mB | mC);
    __m512 y = _mm512_setzero_ps();
    if (mA) {
        const __m512 z = _mm512_mul_ps(x, x);
        __m512 r = _mm512_sub_ps(_mm512_mul_ps(z, VERF_S1(VERF_A[0])), VERF_S1(VERF_A[1]));
        r = _mm512_sub_ps(_mm512_mul_ps(r, z), VERF_S1(VERF_A[2]));
        r = _mm512_sub_ps(_mm512_mul_ps(r, z), VERF_S1(VERF_A[3]));
        r = _mm512_add_ps(_mm512_mul_ps(r, z), VERF_S1(VERF_A[4]));
        __m512 s = _mm512_add_ps(_mm512_mul_ps(z, VERF_S1(VERF_A[5])), VERF_S1(VERF_A[6]));
        for (int i = 7; i < 10; i++) s = _mm512_add_ps(_mm512_mul_ps(s, z), VERF_S1(VERF_A[i]));
        s = _mm512_add_ps(_mm512_mul_ps(s, z), one);
        __m512 yA = _mm512_add_ps(_mm512_mul_ps(_mm512_div_ps(r, s), x), x);
        const __mmask16 t1 = VERF_LT(0x31800000u);
        if (t1 & mA) {
            const __m512 ta = _mm512_add_ps(_mm512_mul_ps(x, VERF_S1(VERF_EFX)), x);
            const __m512 tb = _mm512_mul_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(16.0f)),
                                                          _mm512_mul_ps(x, VERF_S1(VERF_EFX16))), _mm512_set1_ps(0.0625f));
            yA = _mm512_mask_blend_ps(t1, yA, _mm512_mask_blend_ps(VERF_LT(0x04000000u), ta, tb));
        }
        y = _mm512_mask_blend_ps(mA, y, yA);
    }
    if (mB) {
        const __m512 s = _mm512_sub_ps(ax, one);
        __m512 P = _mm512_add_ps(_mm512_mul_ps(s, VERF_S1(VERF_B[0])), VERF_S1(VERF_B[1]));
        P = _mm512_sub_ps(_mm512_mul_ps(P, s), VERF_S1(VERF_B[2]));
        P = _mm512_add_ps(_mm512_mul_ps(P, s), VERF_S1(VERF_B[3]));
        P = _mm512_sub_ps(_mm512_mul_ps(P, s), VERF_S1(VERF_B[4]));
        P = _mm512_add_ps(_mm512_mul_ps(P, s), VERF_S1(VERF_B[5]));
        P = _mm512_sub_ps(_mm512_mul_ps(P, s), VERF_S1(VERF_B[6]));
        __m512 Q = _mm512_add_ps(_mm512_mul_ps(s, VERF_S1(VERF_B[7])), VERF_S1(VERF_B[8]));
        for (int i = 9; i < 13; i++) Q = _mm512_add_ps(_mm512_mul_ps(Q, s), VERF_S1(VERF_B[i]));
        Q = _mm512_add_ps(_mm512_mul_ps(Q, s), one);
        const __m512 q = _mm512_div_ps(P, Q);
        const __m512 yp = _mm512_add_ps(q, VERF_S1(VERF_ERX)), yn = _mm512_sub_ps(VERF_S1(VERF_ERX | 0x80000000u), q);
        y = _mm512_mask_blend_ps(mB, y, _mm512_mask_blend_ps(neg, yp, yn));
    }
    if (mC) {
        const __m512 yp = _mm512_sub_ps(one, VERF_S1(VERF_TINY)), yn = _mm512_sub_ps(VERF_S1(VERF_TINY), one);
        y = _mm512_mask_blend_ps(mC, y, _mm512_mask_blend_ps(neg, yp, yn));
    }
    if (mD) {
        const __m512 s = _mm512_div_ps(one, _mm512_mul_ps(x, x));
        const __mmask16 m1 = _mm512_cmple_epu32_mask(ix, _mm512_set1_epi32(0x4036db6d)) & mD, m2 = mD & ~m1;
        __m512 R = _mm512_setzero_ps(), S = one;
        if (m1) {
            __m512 r = _mm512_sub_ps(_mm512_mul_ps(s, VERF_S1(VERF_C[0])), VERF_S1(VERF_C[1]));
            for (int i = 2; i < 8; i++) r = _mm512_sub_ps(_mm512_mul_ps(r, s), VERF_S1(VERF_C[i]));
            __m512 t = _mm512_add_ps(_mm512_mul_ps(s, VERF_S1(VERF_C[8])), VERF_S1(VERF_C[9]));
            for (int i = 10; i < 16; i++) t = _mm512_add_ps(_mm512_mul_ps(t, s), VERF_S1(VERF_C[i]));
            t = _mm512_add_ps(_mm512_mul_ps(t, s), one);
            R = _mm512_mask_blend_ps(m1, R, r);
            S = _mm512_mask_blend_ps(m1, S, t);
        }
        if (m2) {
            __m512 r = _mm512_sub_ps(_mm512_mul_ps(s, VERF_S1(VERF_D[0])), VERF_S1(VERF_D[1]));
            for (int i = 2; i < 7; i++) r = _mm512_sub_ps(_mm512_mul_ps(r, s), VERF_S1(VERF_D[i]));
            __m512 t = _mm512_add_ps(_mm512_mul_ps(s, VERF_S1(VERF_D[7])), VERF_S1(VERF_D[8]));
            for (int i = 9; i < 14; i++) t = _mm512_add_ps(_mm512_mul_ps(t, s), VERF_S1(VERF_D[i]));
            t = _mm512_add_ps(_mm512_mul_ps(t, s), one);
            R = _mm512_mask_blend_ps(m2, R, r);
            S = _mm512_mask_blend_ps(m2, S, t);
        }
        const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(ix, _mm512_set1_epi32((int)0xfffff000u)));
        const __m512 nz = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(z), _mm512_set1_epi32((int)0x80000000u)));
        const __m512 e1 = vexpf_main16(_mm512_sub_ps(_mm512_mul_ps(nz, z), VERF_S1(VERF_Q)));
        const __m512 q = _mm512_div_ps(R, S);
        const __m512 e2 = vexpf_main16(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(z, ax), _mm512_add_ps(z, ax)), q));
        const __m512 r = _mm512_div_ps(_mm512_mul_ps(e2, e1), ax);
        const __m512 yp = _mm512_sub_ps(one, r), yn = _mm512_sub_ps(r, one);
        y = _mm512_mask_blend_ps(mD, y, _mm512_mask_blend_ps(neg, yp, yn));
    }
    if (mX) {
        const __m512 sg = _mm512_mask_blend_ps(neg, one, _mm512_set1_ps(-1.0f));
        y = _mm512_mask_blend_ps(mX, y, _mm512_add_ps(sg, _mm512_div_ps(one, x)));
    }
#undef VERF_LT
    return y;
}
#undef VERF_S1
#endif

#endif

/* core/ops/gemm_q8.c - the int8 forward product: int8 weights x 14-bit
 * activations with exact integer group sums (the definition and the packed
 * layout are in gemm_q8.h).
 *
 * x's integers are held in the one form the build's kernel reads: two
 * signed bytes, qx = 129 hi + lo (VNNI), or 16-bit values (AVX2,
 * portable).  Kernels: with AVX-512 VNNI, vpdpbusd takes 16 columns
 * x 4 k of weights (unsigned, q + 128) against 4 broadcast bytes of hi,
 * and again of lo, into two sums; at the group's end isum = 129 sum_hi +
 * sum_lo - 128 sum(qx).  The AVX2 kernel (also used by
 * AVX-512 machines without VNNI) multiplies the 16-bit values with
 * vpmaddwd against the weight bytes widened to 16-bit words (cols8_avx2);
 * the portable one is plain C on the 16-bit values.  The integer sums are
 * the same on every path; the float steps at each group's end are the
 * same operations in the same order.
 */
#include "core/ops/gemm_q8.h"
#include "core/common.h"
#include "core/dtype.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define Q8_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define Q8_AVX2 1
#endif
#if defined(__AVX512F__) && !defined(TANDEM_PORTABLE)
#define Q8_X512 1   /* the activation rounding's vector path */
#elif defined(__AVX2__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define Q8_X256 1   /* ... its AVX2 path */
#endif

#ifdef Q8_X256
/* The sum of a vector's 8 int32 lanes */
static inline int32_t hsum8(__m256i a)
{
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define Q8_MB 96   /* rows per block of the many-rows driver */
#define QX_F ((float)Q8_QX)

static size_t groups_of(size_t K) { return dtype_q8_groups(K); }

/* ---------------------------------------------------------------- layout */

void gemm_q8_pack_panel(void *pan, const float *W, const int8_t *Q, const float *S, size_t n0, size_t N, size_t K)
{
    const size_t G = groups_of(K);
    uint8_t *b = pan;
    memset(b, 128, G * Q8_BLOCK);   /* q = 0 everywhere, scales overwritten below */
    for (size_t j = 0; j < GEMM_NR; j++) {
        const size_t n = n0 + j;
        for (size_t g = 0; g < G; g++) {
            const size_t k0 = g * Q8_G, ng = td_min(Q8_G, K - k0);
            int8_t q[Q8_G] = { 0 };
            float s = 0.0f;
            if (n < N && W) s = dtype_q8_quantize_weights(q, W + n * K + k0, ng);
            else if (n < N) {   /* pre-quantized */
                memcpy(q, Q + n * K + k0, ng);
                s = S[n * G + g];
            }
            uint8_t *blk = b + g * Q8_BLOCK;
            for (size_t i = 0; i < ng; i++) blk[((i / 4) * GEMM_NR + j) * 4 + i % 4] = (uint8_t)(q[i] + 128);
            const uint16_t h = dtype_bf16_from_f32(s);   /* exact: a weight scale is a bf16 value */
            memcpy(blk + Q8_WBYTES + j * 2, &h, 2);
        }
    }
}

void gemm_q8_unpack_row(float *dst, const GemmW *W, size_t n)
{
    const size_t G = groups_of(W->K), j = n % GEMM_NR;
    const uint8_t *pan = (const uint8_t *)W->p + n / GEMM_NR * G * Q8_BLOCK;
    for (size_t k = 0; k < W->K; k++) {
        const uint8_t *blk = pan + k / Q8_G * Q8_BLOCK;
        const size_t i = k % Q8_G;
        uint16_t h;
        memcpy(&h, blk + Q8_WBYTES + j * 2, 2);
        dst[k] = (float)((int)blk[((i / 4) * GEMM_NR + j) * 4 + i % 4] - 128) * dtype_f32_from_bf16(h);
    }
}

/* ---------------------------------------------------------------- activations */

#ifdef Q8_VNNI
#define Q8_DIGITS 1   /* the kernel multiplies qx's digits */
#else
#define Q8_DIGITS 0   /* ... qx itself, as 16-bit words */
#endif

size_t gemm_q8_qx_bytes(size_t M, size_t K)
{
    const size_t G = groups_of(K);   /* 64 bytes a group either way: 2 x 32 digits or 32 int16 */
    return td_round_up(M * G * 2 * Q8_G, 64) + 2 * td_round_up(M * G * 4, 64);
}

/* qx's high digit: hi = floor((qx + 64) / 129), as floor(n / 129) - 64
 * with n = qx + 64 + 129 * 64 in [0, 16640]: n * 16257 / 2^21 exceeds
 * n / 129 by at most 16640 * 0.0078 / 2^21 < 1e-4, less than the distance
 * 1/129 from a non-integer quotient to the next integer, so the shift
 * floors exactly (and n * 16257 < 2^31). */
#define DIGIT_M 16257
#define DIGIT_SH 21
static inline int digit_hi(int v) { return ((v + Q8_QX) * DIGIT_M >> DIGIT_SH) - 64; }

/* One group of n <= 32 values of x into this build's form (dg: 32 hi then
 * 32 lo digits; q16: the values; zero past n), its sum of qx in *sum;
 * returns sx. */
static float round_group(int8_t *dg, int16_t *q16, int32_t *sum, const float *x, size_t n)
{
    float amax = 0.0f;
    int nan = 0;
    size_t i = 0;
#ifdef Q8_X512
    if (n == Q8_G) {
        const __m512 sign = _mm512_set1_ps(-0.0f);
        const __m512 a0 = _mm512_loadu_ps(x), a1 = _mm512_loadu_ps(x + 16);
        nan = (_mm512_cmp_ps_mask(a0, a0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(a1, a1, _CMP_UNORD_Q)) != 0;
        amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, a0), _mm512_andnot_ps(sign, a1)));
        i = n;
    }
#elif defined(Q8_X256)
    if (n == Q8_G) {   /* a NaN sets nan (the max is then not used) */
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 mx = _mm256_setzero_ps();
        int un = 0;
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const __m256 v = _mm256_loadu_ps(x + 8 * h);
            un |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        amax = _mm_cvtss_f32(m4);
        nan = un != 0;
        i = n;
    }
#endif
    for (; i < n; i++) {
        const float a = fabsf(x[i]);
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    const float s = nan ? NAN : amax / QX_F;
    *sum = 0;
    if (n < Q8_G || !(s > 0.0f && s < INFINITY)) {   /* else every value below is written */
        if (Q8_DIGITS) memset(dg, 0, 2 * Q8_G);
        else memset(q16, 0, Q8_G * sizeof(int16_t));
        if (!(s > 0.0f && s < INFINITY)) return s;
    }
    int32_t t = 0;
    i = 0;
#ifdef Q8_X512
    if (n == Q8_G) {
        const __m512 vs = _mm512_set1_ps(s), top = _mm512_set1_ps(QX_F), bot = _mm512_set1_ps(-QX_F);
        __m512i vt = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + 16 * h), vs),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i vq = _mm512_cvttps_epi32(_mm512_max_ps(_mm512_min_ps(v, top), bot));
            vt = _mm512_add_epi32(vt, vq);
            if (Q8_DIGITS) {   /* digit_hi, 16 at a time; lo = qx - 129 hi */
                const __m512i vh = _mm512_sub_epi32(
                    _mm512_srai_epi32(_mm512_mullo_epi32(_mm512_add_epi32(vq, _mm512_set1_epi32(Q8_QX)),
                                                         _mm512_set1_epi32(DIGIT_M)), DIGIT_SH),
                    _mm512_set1_epi32(64));
                const __m512i vl = _mm512_sub_epi32(vq, _mm512_add_epi32(_mm512_slli_epi32(vh, 7), vh));
                _mm_storeu_si128((__m128i *)(void *)(dg + 16 * h), _mm512_cvtepi32_epi8(vh));
                _mm_storeu_si128((__m128i *)(void *)(dg + Q8_G + 16 * h), _mm512_cvtepi32_epi8(vl));
            } else {
                _mm256_storeu_si256((__m256i *)(void *)(q16 + 16 * h), _mm512_cvtepi32_epi16(vq));
            }
        }
        t = _mm512_reduce_add_epi32(vt);
        i = n;
    }
#elif defined(Q8_X256)
    if (n == Q8_G) {   /* the scalar steps below, 8 at a time (no AVX2 build reads digits) */
        const __m256 vs = _mm256_set1_ps(s), top = _mm256_set1_ps(QX_F), bot = _mm256_set1_ps(-QX_F);
        __m256i vq[4], vt = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + 8 * h), vs),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            vq[h] = _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(v, top), bot));
            vt = _mm256_add_epi32(vt, vq[h]);
        }
        /* packs_epi32 interleaves 4-value pieces per 128-bit lane: 64-bit blocks 0 2 1 3 restore the order */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            _mm256_storeu_si256((__m256i *)(void *)(q16 + 16 * h),
                                _mm256_permute4x64_epi64(_mm256_packs_epi32(vq[2 * h], vq[2 * h + 1]), 0xd8));
        t = hsum8(vt);
        i = n;
    }
#endif
    for (; i < n; i++) {
        float v = rintf(x[i] / s);   /* to nearest, ties to even (the default mode) */
        v = v > QX_F ? QX_F : v;
        v = v < -QX_F ? -QX_F : v;
        const int q = (int)v;
        if (Q8_DIGITS) {
            const int h = digit_hi(q);
            dg[i] = (int8_t)h;
            dg[Q8_G + i] = (int8_t)(q - 129 * h);
        } else {
            q16[i] = (int16_t)q;
        }
        t += q;
    }
    *sum = t;
    return s;
}

void gemm_q8_quantize_x(GemmQX *qx, void *buf, const float *x, size_t ldx, size_t M, size_t K)
{
    const size_t G = groups_of(K);
    const size_t nq = td_round_up(M * G * 2 * Q8_G, 64);
    int8_t *q = Q8_DIGITS ? buf : NULL;
    int16_t *q16 = Q8_DIGITS ? NULL : buf;
    float *s = (float *)(void *)((char *)buf + nq);
    int32_t *sum = (int32_t *)(void *)((char *)s + td_round_up(M * G * 4, 64));
    for (size_t m = 0; m < M; m++)
        for (size_t g = 0; g < G; g++) {
            const size_t mg = m * G + g;
            s[mg] = round_group(q ? q + mg * 2 * Q8_G : NULL, q16 ? q16 + mg * Q8_G : NULL, &sum[mg],
                                x + m * ldx + g * Q8_G, td_min(Q8_G, K - g * Q8_G));
        }
    *qx = (GemmQX){ q, q16, s, sum, 2 * G * Q8_G, G };
}

/* ---------------------------------------------------------------- scratch */

typedef struct Q8Scratch {
    void *buf;
    size_t cap;
    int in_use;
    struct Q8Scratch *next;
} Q8Scratch;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static Q8Scratch *g_head;   /* every slot ever made */
static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void scratch_release(void *v)
{
    Q8Scratch *s = v;
    pthread_mutex_lock(&g_mu);
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
    s->in_use = 0;
    pthread_mutex_unlock(&g_mu);
}

static void key_init(void)
{
    int rc = pthread_key_create(&g_key, scratch_release);
    TD_CHECK(rc == 0, "pthread_key_create failed (%d)", rc);
}

void *gemm_q8_scratch(size_t n)
{
    pthread_once(&g_once, key_init);
    Q8Scratch *s = pthread_getspecific(g_key);
    if (!s) {
        pthread_mutex_lock(&g_mu);
        for (s = g_head; s && s->in_use; s = s->next) {}
        if (!s) {
            s = calloc(1, sizeof *s);
            TD_CHECK(s != NULL, "out of memory allocating %zu bytes", sizeof *s);
            s->next = g_head;
            g_head = s;
        }
        s->in_use = 1;
        pthread_mutex_unlock(&g_mu);
        pthread_setspecific(g_key, s);
    }
    if (s->cap < n) {
        void *p = NULL;
        const size_t want = td_max(n, 2 * s->cap);
        pthread_mutex_lock(&g_mu);
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
        int rc = posix_memalign(&p, TD_ALIGN, want);
        TD_CHECK(rc == 0 && p, "out of memory allocating %zu bytes of int8 GEMM scratch", want);
        s->buf = p;
        s->cap = want;
        pthread_mutex_unlock(&g_mu);
    }
    return s->buf;
}

size_t gemm_q8_scratch_bytes(void)
{
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (Q8Scratch *s = g_head; s; s = s->next) n += s->cap;
    pthread_mutex_unlock(&g_mu);
    return n;
}

void gemm_q8_scratch_free(void)
{
    pthread_mutex_lock(&g_mu);
    for (Q8Scratch *s = g_head; s; s = s->next) {
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------- kernels */

/* The panel of W at p and its group g's block. */
ALWAYS_INLINE const uint8_t *block_at(const GemmW *W, size_t p, size_t g)
{
    return (const uint8_t *)W->p + (p * groups_of(W->K) + g) * Q8_BLOCK;
}

/* -128 sum(qx) = -128 (129 sum(hi) + sum(lo)) of row r, group g: what the
 * weights' + 128 adds to a group's sum (both SIMD kernels multiply the
 * unsigned weight bytes) */
ALWAYS_INLINE int32_t minus_bias(const GemmQX *qx, int r, size_t g)
{
    return -128 * qx->sum[(size_t)r * qx->G + g];
}

#ifdef Q8_VNNI
/* 4 bytes of a digit row as one 32-bit value */
ALWAYS_INLINE int32_t d4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return v;
}

/* Group g of row r of qx: its hi digits (lo follow 32 bytes on) */
ALWAYS_INLINE const int8_t *digits(const GemmQX *qx, int r, size_t g)
{
    return qx->q + r * qx->ldq + g * 2 * Q8_G;
}

/* c = fma(sx * sw, (float)isum, c) for one vector of 16 columns, isum =
 * 129 sh + sl, sl having started from minus_bias; sw: 16 bf16 scales,
 * widened exactly */
ALWAYS_INLINE __m512 fold(__m512 c, __m512i sh, __m512i sl, __m512 sx, const uint8_t *sw)
{
    const __m512i isum = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(sh, 7), sh), sl);
    const __m512 w = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)sw)), 16));
    return _mm512_fmadd_ps(_mm512_mul_ps(sx, w), _mm512_cvtepi32_ps(isum), c);
}

/* MR <= 2 rows x NP <= 4 full panels from panel p (MR NP <= 4: two sums
 * a vector, 32 registers). */
ALWAYS_INLINE void wide_vnni(const int MR, const int NP, float *y, size_t ldy, const GemmQX *qx, const GemmW *W,
                             size_t p)
{
    const size_t G = qx->G, ps = G * Q8_BLOCK;
    const uint8_t *pan = block_at(W, p, 0);
    __m512 c[2][8];
#pragma GCC unroll 2
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * NP; v++) c[r][v] = _mm512_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        __m512i sh[2][8], sl[2][8];
#pragma GCC unroll 2
        for (int r = 0; r < MR; r++) {
            const __m512i mb = _mm512_set1_epi32(minus_bias(qx, r, g));
#pragma GCC unroll 8
            for (int v = 0; v < 2 * NP; v++) {
                sh[r][v] = _mm512_setzero_si512();
                sl[r][v] = mb;
            }
        }
        const uint8_t *blk = pan + g * Q8_BLOCK;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            __m512i xh[2], xl[2];
#pragma GCC unroll 2
            for (int r = 0; r < MR; r++) {
                xh[r] = _mm512_set1_epi32(d4(digits(qx, r, g) + 4 * k4));
                xl[r] = _mm512_set1_epi32(d4(digits(qx, r, g) + Q8_G + 4 * k4));
            }
#pragma GCC unroll 8
            for (int v = 0; v < 2 * NP; v++) {
                const __m512i w = _mm512_loadu_si512((const void *)(blk + (v / 2) * ps + k4 * 128 + (v % 2) * 64));
#pragma GCC unroll 2
                for (int r = 0; r < MR; r++) {
                    sh[r][v] = _mm512_dpbusd_epi32(sh[r][v], w, xh[r]);
                    sl[r][v] = _mm512_dpbusd_epi32(sl[r][v], w, xl[r]);
                }
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < MR; r++) {
            const __m512 sx = _mm512_set1_ps(qx->s[r * G + g]);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * NP; v++)
                c[r][v] = fold(c[r][v], sh[r][v], sl[r][v], sx, blk + (v / 2) * ps + Q8_WBYTES + (v % 2) * 32);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * NP; v++) _mm512_storeu_ps(y + (size_t)r * ldy + v * 16, c[r][v]);
}

/* MR <= 4 rows x one panel, ncols <= 32 of it stored. */
ALWAYS_INLINE void tile_vnni(const int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p,
                             size_t ncols)
{
    const size_t G = qx->G;
    __m512 c[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        const uint8_t *blk = block_at(W, p, g);
        __m512i sh[4][2], sl[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            sh[r][0] = sh[r][1] = _mm512_setzero_si512();
            sl[r][0] = sl[r][1] = _mm512_set1_epi32(minus_bias(qx, r, g));
        }
#pragma GCC unroll 8
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            const __m512i w0 = _mm512_loadu_si512((const void *)(blk + k4 * 128));
            const __m512i w1 = _mm512_loadu_si512((const void *)(blk + k4 * 128 + 64));
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const __m512i xh = _mm512_set1_epi32(d4(digits(qx, r, g) + 4 * k4));
                const __m512i xl = _mm512_set1_epi32(d4(digits(qx, r, g) + Q8_G + 4 * k4));
                sh[r][0] = _mm512_dpbusd_epi32(sh[r][0], w0, xh);
                sh[r][1] = _mm512_dpbusd_epi32(sh[r][1], w1, xh);
                sl[r][0] = _mm512_dpbusd_epi32(sl[r][0], w0, xl);
                sl[r][1] = _mm512_dpbusd_epi32(sl[r][1], w1, xl);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m512 sx = _mm512_set1_ps(qx->s[r * G + g]);
            c[r][0] = fold(c[r][0], sh[r][0], sl[r][0], sx, blk + Q8_WBYTES);
            c[r][1] = fold(c[r][1], sh[r][1], sl[r][1], sx, blk + Q8_WBYTES + 32);
        }
    }
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);
    const __mmask16 m1 = ncols <= 16 ? 0 : ncols >= 32 ? 0xffff : (__mmask16)((1u << (ncols - 16)) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) {
        _mm512_mask_storeu_ps(y + (size_t)r * ldy, m0, c[r][0]);
        _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16, m1, c[r][1]);
    }
}

static void rows_tile(int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p, size_t ncols)
{
    switch (MR) {
    case 1:  tile_vnni(1, y, ldy, qx, W, p, ncols); return;
    case 2:  tile_vnni(2, y, ldy, qx, W, p, ncols); return;
    case 3:  tile_vnni(3, y, ldy, qx, W, p, ncols); return;
    default: tile_vnni(4, y, ldy, qx, W, p, ncols); return;
    }
}

/* MR <= 3 rows x 4 full panels from p. */
static void rows_wide(int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p)
{
    switch (MR) {
    case 1: wide_vnni(1, 4, y, ldy, qx, W, p); return;
    case 2:
        wide_vnni(2, 2, y, ldy, qx, W, p);
        wide_vnni(2, 2, y + 2 * GEMM_NR, ldy, qx, W, p + 2);
        return;
    default: {
        const GemmQX q2 = gemm_q8_qx_rows(qx, 2);
        wide_vnni(2, 2, y, ldy, qx, W, p);
        wide_vnni(2, 2, y + 2 * GEMM_NR, ldy, qx, W, p + 2);
        wide_vnni(1, 4, y + 2 * ldy, ldy, &q2, W, p);
        return;
    }
    }
}
#define ROWS_TILE_MAX 4
#define HAVE_WIDE 1

#elif defined(Q8_AVX2)
/* a + the products of the 16 weight bytes at w (4 columns x 4 k, q + 128)
 * widened to 16-bit words with xb (x's 4 values as pairs x0 x1, x2 x3),
 * a lane's two added (vpmaddwd: exact, each below 2^22): lane 2 j holds
 * column j's k0 k1 part, lane 2 j + 1 its k2 k3 part */
ALWAYS_INLINE __m256i step4(__m256i a, const uint8_t *w, __m256i xb)
{
    const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)w));
    return _mm256_add_epi32(a, _mm256_madd_epi16(q, xb));
}

/* Column sums of 8 columns from step4's two vectors (columns 0-3, 4-7):
 * vphaddd adds each column's two lanes (columns 0 1 4 5 | 2 3 6 7 in the
 * 128-bit halves; 64-bit blocks 0 2 1 3 put them in order), and mb (the
 * + 128's share, minus_bias) */
ALWAYS_INLINE __m256i cols_of(__m256i a0, __m256i a1, __m256i mb)
{
    return _mm256_add_epi32(_mm256_permute4x64_epi64(_mm256_hadd_epi32(a0, a1), 0xd8), mb);
}

/* x's 4 values of step k4 in group g of row r, as pairs */
ALWAYS_INLINE __m256i x4_pairs(const GemmQX *qx, int r, size_t g, int k4)
{
    int64_t v;
    memcpy(&v, qx->q16 + r * qx->ldq / 2 + g * Q8_G + 4 * k4, 8);
    return _mm256_set1_epi64x(v);
}

/* c = fma(sx * sw, (float)isum, c) for 8 columns; sw: 8 bf16 scales,
 * widened exactly */
ALWAYS_INLINE __m256 fold8(__m256 c, __m256i isum, float sx, const uint8_t *sw)
{
    const __m256 w = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)sw)), 16));
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(sx), w), _mm256_cvtepi32_ps(isum), c);
}

ALWAYS_INLINE void store_cols(float *y, __m256 v, size_t nc)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(y, t, nc * sizeof(float));
}

/* MR <= 4 rows x 8 columns (c0 .. c0 + 7 of panel p), nc <= 8 stored,
 * from qx's 16-bit form: each step4 of a block row's 32 bytes (two of 4
 * columns) is shared by the rows' broadcasts. */
ALWAYS_INLINE void cols8_avx2(const int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p,
                              size_t c0, size_t nc)
{
    const size_t G = qx->G;
    __m256 c[4];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) c[r] = _mm256_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        const uint8_t *blk = block_at(W, p, g);
        __m256i a0[4], a1[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) a0[r] = a1[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            const uint8_t *w = blk + (k4 * GEMM_NR + c0) * 4;
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const __m256i xb = x4_pairs(qx, r, g, k4);
                a0[r] = step4(a0[r], w, xb);
                a1[r] = step4(a1[r], w + 16, xb);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++)
            c[r] = fold8(c[r], cols_of(a0[r], a1[r], _mm256_set1_epi32(minus_bias(qx, r, g))), qx->s[r * G + g],
                         blk + Q8_WBYTES + c0 * 2);
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) store_cols(y + (size_t)r * ldy, c[r], nc);
}

/* One row x the whole panel (ncols <= 32 stored): decoding's shape.  The
 * steps of cols8_avx2 for the four 8-column vectors at once, so each
 * 128-byte row of a block is read once, front to back. */
static void row_panel_avx2(float *y, const GemmQX *qx, const GemmW *W, size_t p, size_t ncols)
{
    const size_t G = qx->G;
    __m256 c[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) c[v] = _mm256_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        const uint8_t *blk = block_at(W, p, g);
        __m256i a[8];
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) a[v] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            const __m256i xb = x4_pairs(qx, 0, g, k4);
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) a[v] = step4(a[v], blk + k4 * GEMM_NR * 4 + v * 16, xb);
        }
        const __m256i mb = _mm256_set1_epi32(minus_bias(qx, 0, g));
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            c[v] = fold8(c[v], cols_of(a[2 * v], a[2 * v + 1], mb), qx->s[g], blk + Q8_WBYTES + v * 16);
    }
    for (size_t v = 0; v < 4 && 8 * v < ncols; v++) store_cols(y + 8 * v, c[v], td_min(8, ncols - 8 * v));
}

static void rows_tile(int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p, size_t ncols)
{
    if (MR == 1) {
        row_panel_avx2(y, qx, W, p, ncols);
        return;
    }
    for (size_t c0 = 0; c0 < ncols; c0 += 8) {
        const size_t nc = td_min(8, ncols - c0);
        switch (MR) {
        case 2:  cols8_avx2(2, y + c0, ldy, qx, W, p, c0, nc); break;
        case 3:  cols8_avx2(3, y + c0, ldy, qx, W, p, c0, nc); break;
        default: cols8_avx2(4, y + c0, ldy, qx, W, p, c0, nc); break;
        }
    }
}
#define ROWS_TILE_MAX 4

#else
/* Portable: the definition, element by element. */
static void rows_tile(int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p, size_t ncols)
{
    const size_t G = qx->G;
    for (int r = 0; r < MR; r++)
        for (size_t j = 0; j < ncols; j++) {
            float c = 0.0f;
            for (size_t g = 0; g < G; g++) {
                const uint8_t *blk = block_at(W, p, g);
                const int16_t *xq = qx->q16 + r * qx->ldq / 2 + g * Q8_G;
                int32_t s = 0;
                for (size_t i = 0; i < Q8_G; i++) s += ((int32_t)blk[((i / 4) * GEMM_NR + j) * 4 + i % 4] - 128) * xq[i];
                uint16_t sw;
                memcpy(&sw, blk + Q8_WBYTES + j * 2, 2);
                c = fmaf(qx->s[r * G + g] * dtype_f32_from_bf16(sw), (float)s, c);
            }
            y[(size_t)r * ldy + j] = c;
        }
}
#define ROWS_TILE_MAX 4
#endif

void gemm_q8_drive(float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t M, size_t p0, size_t p1)
{
    const size_t N = W->N;
    if (M <= 3) {   /* decode: every panel meets all rows at once */
        size_t p = p0;
#ifdef HAVE_WIDE
        for (; p + 4 <= p1 && (p + 4) * GEMM_NR <= N; p += 4) rows_wide((int)M, y + p * GEMM_NR, ldy, qx, W, p);
#endif
        for (; p < p1; p++) rows_tile((int)M, y + p * GEMM_NR, ldy, qx, W, p, td_min(GEMM_NR, N - p * GEMM_NR));
        return;
    }
    /* blocks of Q8_MB rows (their qx stays in L2), each panel in turn meeting all of them */
    for (size_t mb = 0; mb < M; mb += Q8_MB) {
        const size_t me = td_min(M, mb + Q8_MB);
        for (size_t p = p0; p < p1; p++)
            for (size_t m = mb; m < me; m += ROWS_TILE_MAX) {
                const GemmQX q = gemm_q8_qx_rows(qx, m);
                rows_tile((int)td_min(ROWS_TILE_MAX, me - m), y + m * ldy + p * GEMM_NR, ldy, &q, W, p,
                          td_min(GEMM_NR, N - p * GEMM_NR));
            }
    }
}

/* core/ops/gemm_q8.c - the int8 forward product: W8A8 with exact integer
 * group sums (the definition and the packed layout are in gemm_q8.h).
 *
 * Kernels: with AVX-512 VNNI, vpdpbusd takes 16 columns x 4 k of weights
 * (unsigned, q + 128) against 4 broadcast bytes of x (signed) a step, and
 * the group's bias, 128 sum(qx), is subtracted at the group's end.  The
 * AVX2 kernel (also used by AVX-512 machines without VNNI) multiplies
 * bytes with vpmaddubsw by the sign trick (|q| against x with q's sign,
 * exact: cols8_avx2) and adds pairs with vpmaddwd; the portable one is
 * plain C.
 * The integer sums are the same on every path; the float steps at each
 * group's end are the same operations in the same order.
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
#define Q8_X512 1   /* the activation quantizer's vector path */
#elif defined(__AVX2__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define Q8_X256 1   /* ... its AVX2 path */
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define Q8_MB 96   /* rows per block of the many-rows driver */

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
            if (n < N && W) s = dtype_q8_quantize(q, W + n * K + k0, ng);
            else if (n < N) {   /* pre-quantized */
                memcpy(q, Q + n * K + k0, ng);
                s = S[n * G + g];
            }
            uint8_t *blk = b + g * Q8_BLOCK;
            for (size_t i = 0; i < ng; i++) blk[((i / 4) * GEMM_NR + j) * 4 + i % 4] = (uint8_t)(q[i] + 128);
            memcpy(blk + Q8_WBYTES + j * 4, &s, 4);
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
        float s;
        memcpy(&s, blk + Q8_WBYTES + j * 4, 4);
        dst[k] = (float)((int)blk[((i / 4) * GEMM_NR + j) * 4 + i % 4] - 128) * s;
    }
}

/* ---------------------------------------------------------------- activations */

size_t gemm_q8_qx_bytes(size_t M, size_t K)
{
    const size_t G = groups_of(K);
    return td_round_up(M * G * Q8_G, 64) + td_round_up(M * G * 4, 64) * 2;
}

/* One group of n <= 32 values: q (32, zero past n), returns sx, *sum. */
static float quantize_group(int8_t *q, int32_t *sum, const float *x, size_t n)
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
    const float s = nan ? NAN : amax / 127.0f;
    memset(q, 0, Q8_G);
    *sum = 0;
    if (!(s > 0.0f && s < INFINITY)) return s;
    int32_t t = 0;
    i = 0;
#ifdef Q8_X512
    if (n == Q8_G) {
        const __m512 vs = _mm512_set1_ps(s), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
        for (int h = 0; h < 2; h++) {
            __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + 16 * h), vs),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
            const __m512i vi = _mm512_cvttps_epi32(v);
            _mm_storeu_si128((__m128i *)(void *)(q + 16 * h), _mm512_cvtepi32_epi8(vi));
            t += _mm512_reduce_add_epi32(vi);
        }
        i = n;
    }
#elif defined(Q8_X256)
    if (n == Q8_G) {   /* the scalar steps below, 8 at a time; the packs do not saturate (|v| <= 127) */
        const __m256 vs = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
        __m256i vi[4], acc = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + 8 * h), vs),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm256_max_ps(_mm256_min_ps(v, hi), lo);
            vi[h] = _mm256_cvttps_epi32(v);
            acc = _mm256_add_epi32(acc, vi[h]);
        }
        /* per 128-bit lane the packs give 4-value pieces v0 v1 v2 v3 (lane 0: values 0-3 of each, lane 1: 4-7) */
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(vi[0], vi[1]), _mm256_packs_epi32(vi[2], vi[3]));
        _mm256_storeu_si256((__m256i *)(void *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        t = _mm_cvtsi128_si32(s4);
        i = n;
    }
#endif
    for (; i < n; i++) {
        float v = rintf(x[i] / s);   /* to nearest, ties to even (the default mode) */
        v = v > 127.0f ? 127.0f : v;
        v = v < -127.0f ? -127.0f : v;
        q[i] = (int8_t)v;
        t += q[i];
    }
    *sum = t;
    return s;
}

void gemm_q8_quantize_x(GemmQX *qx, void *buf, const float *x, size_t ldx, size_t M, size_t K)
{
    const size_t G = groups_of(K);
    int8_t *q = buf;
    float *s = (float *)(void *)((char *)buf + td_round_up(M * G * Q8_G, 64));
    int32_t *sum = (int32_t *)(void *)((char *)s + td_round_up(M * G * 4, 64));
    for (size_t m = 0; m < M; m++)
        for (size_t g = 0; g < G; g++)
            s[m * G + g] = quantize_group(q + (m * G + g) * Q8_G, &sum[m * G + g], x + m * ldx + g * Q8_G,
                                          td_min(Q8_G, K - g * Q8_G));
    *qx = (GemmQX){ q, s, sum, G * Q8_G, G };
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

#ifdef Q8_VNNI
/* 4 bytes of qx as one broadcast 32-bit lane */
ALWAYS_INLINE __m512i x4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
}

/* c = fma(sx * sw, (float)(acc - 128 sum), c) for one vector of 16 columns */
ALWAYS_INLINE __m512 fold(__m512 c, __m512i acc, __m512i bias, __m512 sx, const uint8_t *sw)
{
    const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, bias));
    return _mm512_fmadd_ps(_mm512_mul_ps(sx, _mm512_loadu_ps((const float *)(const void *)sw)), f, c);
}

/* MR <= 3 rows x NP <= 4 full panels from panel p. */
ALWAYS_INLINE void wide_vnni(const int MR, const int NP, float *y, size_t ldy, const GemmQX *qx, const GemmW *W,
                             size_t p)
{
    const size_t G = qx->G, ps = G * Q8_BLOCK;
    const uint8_t *pan = block_at(W, p, 0);
    __m512 c[3][8];
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * NP; v++) c[r][v] = _mm512_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        __m512i acc[3][8];
#pragma GCC unroll 3
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
            for (int v = 0; v < 2 * NP; v++) acc[r][v] = _mm512_setzero_si512();
        const uint8_t *blk = pan + g * Q8_BLOCK;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            __m512i xb[3];
#pragma GCC unroll 3
            for (int r = 0; r < MR; r++) xb[r] = x4(qx->q + r * qx->ldq + g * Q8_G + 4 * k4);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * NP; v++) {
                const __m512i w = _mm512_loadu_si512((const void *)(blk + (v / 2) * ps + k4 * 128 + (v % 2) * 64));
#pragma GCC unroll 3
                for (int r = 0; r < MR; r++) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], w, xb[r]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < MR; r++) {
            const __m512i bias = _mm512_set1_epi32(128 * qx->sum[r * G + g]);
            const __m512 sx = _mm512_set1_ps(qx->s[r * G + g]);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * NP; v++)
                c[r][v] = fold(c[r][v], acc[r][v], bias, sx, blk + (v / 2) * ps + Q8_WBYTES + (v % 2) * 64);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * NP; v++) _mm512_storeu_ps(y + (size_t)r * ldy + v * 16, c[r][v]);
}

/* MR <= 6 rows x one panel, ncols <= 32 of it stored. */
ALWAYS_INLINE void tile_vnni(const int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p,
                             size_t ncols)
{
    const size_t G = qx->G;
    __m512 c[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        const uint8_t *blk = block_at(W, p, g);
        __m512i acc[6][2];
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            const __m512i w0 = _mm512_loadu_si512((const void *)(blk + k4 * 128));
            const __m512i w1 = _mm512_loadu_si512((const void *)(blk + k4 * 128 + 64));
#pragma GCC unroll 6
            for (int r = 0; r < MR; r++) {
                const __m512i xb = x4(qx->q + r * qx->ldq + g * Q8_G + 4 * k4);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, xb);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, xb);
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m512i bias = _mm512_set1_epi32(128 * qx->sum[r * G + g]);
            const __m512 sx = _mm512_set1_ps(qx->s[r * G + g]);
            c[r][0] = fold(c[r][0], acc[r][0], bias, sx, blk + Q8_WBYTES);
            c[r][1] = fold(c[r][1], acc[r][1], bias, sx, blk + Q8_WBYTES + 64);
        }
    }
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);
    const __mmask16 m1 = ncols <= 16 ? 0 : ncols >= 32 ? 0xffff : (__mmask16)((1u << (ncols - 16)) - 1);
#pragma GCC unroll 6
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
    case 4:  tile_vnni(4, y, ldy, qx, W, p, ncols); return;
    case 5:  tile_vnni(5, y, ldy, qx, W, p, ncols); return;
    default: tile_vnni(6, y, ldy, qx, W, p, ncols); return;
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
    default:
        wide_vnni(3, 2, y, ldy, qx, W, p);
        wide_vnni(3, 2, y + 2 * GEMM_NR, ldy, qx, W, p + 2);
        return;
    }
}
#define ROWS_TILE_MAX 6
#define HAVE_WIDE 1

#elif defined(Q8_AVX2)
/* 4 bytes of qx as one broadcast 32-bit lane */
ALWAYS_INLINE __m256i x4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* MR <= 4 rows x 8 columns (c0 .. c0 + 7 of panel p), nc <= 8 stored.
 * Per 4 k: 32 bytes = 8 columns x 4 k, a column's 4 k in one 32-bit lane.
 * The weights made signed (q = byte - 128) meet x by the sign trick:
 * vpmaddubsw(|q|, sign(x, q)) gives the pair sums of q x exactly (|q|,
 * |x| <= 127, so a pair is at most 2 127^2 < 2^15), and vpmaddwd with
 * ones adds a lane's two pairs: each lane is its column's sum over 4 k. */
ALWAYS_INLINE void cols8_avx2(const int MR, float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t p,
                              size_t c0, size_t nc)
{
    const size_t G = qx->G;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 c[4];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) c[r] = _mm256_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        const uint8_t *blk = block_at(W, p, g);
        __m256i a[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            const __m256i q = _mm256_xor_si256(
                _mm256_loadu_si256((const __m256i *)(const void *)(blk + (k4 * GEMM_NR + c0) * 4)), flip);
            const __m256i aq = _mm256_abs_epi8(q);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const __m256i sx = _mm256_sign_epi8(x4(qx->q + r * qx->ldq + g * Q8_G + 4 * k4), q);
                a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sx), ones));
            }
        }
        const __m256 sw = _mm256_loadu_ps((const float *)(const void *)(blk + Q8_WBYTES + c0 * 4));
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(qx->s[r * G + g]), sw);
            c[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(a[r]), c[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) {
        float t[8];
        _mm256_storeu_ps(t, c[r]);
        memcpy(y + (size_t)r * ldy, t, nc * sizeof(float));
    }
}

/* One row x the whole panel (ncols <= 32 stored): decoding's shape.  The
 * sums of cols8_avx2, four 8-column vectors at once, so each 128-byte row
 * of a block is read once, front to back, and the four chains overlap. */
static void row_panel_avx2(float *y, const GemmQX *qx, const GemmW *W, size_t p, size_t ncols)
{
    const size_t G = qx->G;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 c[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) c[v] = _mm256_setzero_ps();
    for (size_t g = 0; g < G; g++) {
        const uint8_t *blk = block_at(W, p, g);
        __m256i a[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) a[v] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k4 = 0; k4 < Q8_G / 4; k4++) {
            const __m256i xb = x4(qx->q + g * Q8_G + 4 * k4);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                const __m256i q = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + k4 * GEMM_NR * 4 + v * 32)), flip);
                const __m256i pr = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(xb, q));
                a[v] = _mm256_add_epi32(a[v], _mm256_madd_epi16(pr, ones));
            }
        }
        const __m256 sx = _mm256_set1_ps(qx->s[g]);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m256 sw = _mm256_loadu_ps((const float *)(const void *)(blk + Q8_WBYTES + v * 32));
            c[v] = _mm256_fmadd_ps(_mm256_mul_ps(sx, sw), _mm256_cvtepi32_ps(a[v]), c[v]);
        }
    }
    for (size_t v = 0; v < 4 && 8 * v < ncols; v++) {
        float t[8];
        _mm256_storeu_ps(t, c[v]);
        memcpy(y + 8 * v, t, td_min(8, ncols - 8 * v) * sizeof(float));
    }
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
        case 1:  cols8_avx2(1, y + c0, ldy, qx, W, p, c0, nc); break;
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
                const int8_t *xq = qx->q + r * qx->ldq + g * Q8_G;
                int32_t s = 0;
                for (size_t i = 0; i < Q8_G; i++) s += ((int32_t)blk[((i / 4) * GEMM_NR + j) * 4 + i % 4] - 128) * xq[i];
                float sw;
                memcpy(&sw, blk + Q8_WBYTES + j * 4, 4);
                c = fmaf(qx->s[r * G + g] * sw, (float)s, c);
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

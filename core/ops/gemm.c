/* core/ops/gemm.c - packed, row-invariant forward GEMM and the backward products.
 *
 * The forward kernel is the classic outer-product micro-kernel: a tile of MR
 * rows x 32 columns lives in registers while k runs from 0 to K-1, each step
 * broadcasting x[m][k] and multiplying it into one 32-wide row of the packed
 * panel.  Each accumulator sees exactly the chain of gemm.h, so every tiling
 * below (MR = 1..12 rows, one panel or four side by side) gives the same bits.
 * With AVX2 (16 ymm registers) the register tile is 6 rows x half a panel,
 * or 1-3 rows x whole panels; the chains, and so the bits, are the same.
 *
 * Every kernel is written once for the two float weight dtypes (a constant
 * DT argument of always-inline functions, so each dtype gets its own
 * specialisation): wrow16 / wrow8 / wval load a panel row's weights and
 * widen them to float32 (f32: a load; bf16: zero-extend and shift left 16),
 * and the FMA chain after it is the f32 kernel's.  int8 weights have their
 * own kernels (core/ops/gemm_q8.c: exact integer group sums with x
 * rounded to 14 bits); drive() dispatches to them.
 *
 * The backward products (dx = dy W, dW = dy^T x) run the same micro-kernel
 * in a blocked, accumulating driver (section "backward") with AVX-512; the
 * AVX2 and portable builds send them to BLAS instead (on AVX2 OpenBLAS's
 * kernels reach the FMA peak: 84-88 GFLOP/s a core here, bench/gemm_bw.sh).
 * The backward is float32 only: training keeps float32 weights.
 */
#include "core/ops/gemm.h"
#include "core/ops/gemm_q8.h"
#include "core/common.h"
#include "core/pool.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* TANDEM_PORTABLE forces the portable path (tests compare the two). */
#if defined(__AVX512F__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define GEMM_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define GEMM_AVX2 1
#endif

#define MR_MAX 12   /* rows per register tile: 12 x 2 zmm = 24 accumulators */
#define MB     96   /* rows per cache block: MB * K floats of x stay in L2 */
#define NP_WIDE 4   /* panels side by side in the few-rows kernel */
#define GROUP_SPLIT 4   /* cost shares per thread of a grouped product */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- layout */

static size_t panels_of(size_t N) { return td_round_up(N, GEMM_NR) / GEMM_NR; }

/* Bytes of one panel (GEMM_NR columns of K) packed as t; int8: whole group
 * blocks (gemm_q8.h), a multiple of 64. */
static inline size_t panel_bytes(Dtype t, size_t K)
{
    return t == DTYPE_INT8 ? dtype_q8_groups(K) * Q8_BLOCK : K * GEMM_NR * dtype_size(t);
}

size_t gemm_packed_bytes(Dtype t, size_t N, size_t K)
{
    return td_round_up(panels_of(N) * panel_bytes(t, K), 64);
}

GemmW gemm_w(Dtype t, const void *base, size_t N, size_t K)
{
    GemmW w = { t, base, N, K };
    return w;
}

GemmW gemm_w_cols(const GemmW *W, size_t n0, size_t n)
{
    TD_CHECK(n0 % GEMM_NR == 0 && n0 + n <= W->N && (n % GEMM_NR == 0 || n0 + n == W->N),
             "gemm: columns [%zu, %zu) of %zu do not start and end on panels of %d", n0, n0 + n, W->N, GEMM_NR);
    GemmW w = { W->dtype, (const char *)W->p + n0 / GEMM_NR * panel_bytes(W->dtype, W->K), n, W->K };
    return w;
}

/* Panel p of W (f32, bf16; int8: gemm_q8.c). */
ALWAYS_INLINE const void *panel_at(const int DT, const GemmW *W, size_t p)
{
    return (const char *)W->p + p * panel_bytes((Dtype)DT, W->K);
}

/* bf16: where column j (0..31) of a panel row is stored -- interleaved so
 * that unpacking the row's 16-bit words with zeros (vpunpck{l,h}wd, per
 * 128-bit lane) gives columns 0-15 and 16-31 in order, already widened:
 * word 8L + i holds column 4L + i, word 8L + 4 + i column 16 + 4L + i
 * (L = 0..3, i = 0..3). */
static inline size_t bf16_slot(size_t j)
{
    return j < 16 ? (j / 4) * 8 + j % 4 : ((j - 16) / 4) * 8 + 4 + (j - 16) % 4;
}

struct pack_ctx { void *P; Dtype t; const float *W; const int8_t *Q; const float *S; size_t N, K; };

static void pack_range(void *vctx, size_t p0, size_t p1, int tid)
{
    (void)tid;
    const struct pack_ctx *c = vctx;
    const size_t K = c->K;
    for (size_t p = p0; p < p1; p++) {
        char *pan = (char *)c->P + p * panel_bytes(c->t, K);
        if (c->t == DTYPE_INT8) {
            gemm_q8_pack_panel(pan, c->W, c->Q, c->S, p * GEMM_NR, c->N, K);
            continue;
        }
        for (size_t j = 0; j < GEMM_NR; j++) {
            const size_t n = p * GEMM_NR + j;
            const float *src = n < c->N && c->W ? c->W + n * K : NULL;
            if (c->t == DTYPE_F32) {
                float *d = (float *)(void *)pan;
                for (size_t k = 0; k < K; k++) d[k * GEMM_NR + j] = src ? src[k] : 0.0f;
            } else {
                uint16_t *d = (uint16_t *)(void *)pan;
                for (size_t k = 0; k < K; k++) d[k * GEMM_NR + bf16_slot(j)] = src ? dtype_bf16_from_f32(src[k]) : 0;
            }
        }
    }
}

/* Zeroes the bytes of a packed matrix that hold no value (the alignment
 * padding), so that a packed matrix is a function of its weights alone. */
static void zero_padding(void *P, Dtype t, size_t N, size_t K)
{
    if (t == DTYPE_INT8) return;   /* no padding: whole 1088-byte group blocks */
    unsigned char *b = P;
    const size_t np = panels_of(N), total = gemm_packed_bytes(t, N, K);
    const size_t used = np * panel_bytes(t, K);
    memset(b + used, 0, total - used);
}

void gemm_pack(void *P, Dtype t, const float *W, size_t N, size_t K)
{
    struct pack_ctx c = { P, t, W, NULL, NULL, N, K };
    pool_for(panels_of(N), 1, pack_range, &c);
    zero_padding(P, t, N, K);
}

void gemm_pack_q8(void *P, const int8_t *Q, const float *S, size_t N, size_t K)
{
    struct pack_ctx c = { P, DTYPE_INT8, NULL, Q, S, N, K };
    pool_for(panels_of(N), 1, pack_range, &c);
    zero_padding(P, DTYPE_INT8, N, K);
}

/* Weight j of panel row k as float32. */
ALWAYS_INLINE float wval(const int DT, const void *pan, size_t k, size_t j)
{
    if (DT == DTYPE_F32) return ((const float *)pan)[k * GEMM_NR + j];
    return dtype_f32_from_bf16(((const uint16_t *)pan)[k * GEMM_NR + bf16_slot(j)]);
}

void gemm_unpack_row(float *dst, const GemmW *W, size_t n)
{
    const size_t p = n / GEMM_NR, j = n % GEMM_NR;
    switch (W->dtype) {
    case DTYPE_F32:
        for (size_t k = 0; k < W->K; k++) dst[k] = wval(DTYPE_F32, panel_at(DTYPE_F32, W, p), k, j);
        break;
    case DTYPE_BF16:
        for (size_t k = 0; k < W->K; k++) dst[k] = wval(DTYPE_BF16, panel_at(DTYPE_BF16, W, p), k, j);
        break;
    default:
        gemm_q8_unpack_row(dst, W, n);
        break;
    }
}


/* ---------------------------------------------------------------- kernels */

#ifdef GEMM_AVX512
/* The 16 float32 weights of panel row k, columns j0 .. j0 + 15. */
ALWAYS_INLINE __m512 wrow16(const int DT, const void *pan, size_t k, int j0)
{
    if (DT == DTYPE_F32) return _mm512_loadu_ps((const float *)pan + k * GEMM_NR + j0);
    /* bf16: the row's 32 words, unpacked with zeros: columns j0 .. j0 + 15 (bf16_slot) */
    const __m512i h = _mm512_loadu_si512((const void *)((const uint16_t *)pan + k * GEMM_NR));
    const __m512i z = _mm512_setzero_si512();
    return _mm512_castsi512_ps(j0 == 0 ? _mm512_unpacklo_epi16(z, h) : _mm512_unpackhi_epi16(z, h));
}

/* y[0..MR)[0..ncols) = x[0..MR) . panel, ncols <= 32. */
ALWAYS_INLINE void tile_avx512(const int DT, const int MR, float *y, size_t ldy, const float *x, size_t ldx,
                               const void *panel, size_t K, size_t ncols)
{
    __m512 acc[MR_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k++) {
        const __m512 b0 = wrow16(DT, panel, k, 0);
        const __m512 b1 = wrow16(DT, panel, k, 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    if (ncols == GEMM_NR) {
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            _mm512_storeu_ps(y + (size_t)r * ldy, acc[r][0]);
            _mm512_storeu_ps(y + (size_t)r * ldy + 16, acc[r][1]);
        }
    } else {
        __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);
        __mmask16 m1 = ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1);
        for (int r = 0; r < MR; r++) {
            _mm512_mask_storeu_ps(y + (size_t)r * ldy, m0, acc[r][0]);
            _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16, m1, acc[r][1]);
        }
    }
}

/* How far ahead (bytes) the bf16 few-rows kernel prefetches its panels:
 * TANDEM_BF16_PREFETCH when set (0: no look-ahead), else by the CPU's
 * vendor, as measured (below): 3 KiB on AMD, 1 KiB elsewhere.  A value
 * that is not a byte count in [0, 65536] is ignored with one line (it only
 * tunes speed: a server keeps serving).  Decided once per process. */
static pthread_once_t g_pf_once = PTHREAD_ONCE_INIT;
static size_t g_pf;

static void bf16_prefetch_decide(void)
{
    g_pf = __builtin_cpu_is("amd") ? 3072 : 1024;
    const char *e = getenv("TANDEM_BF16_PREFETCH");
    if (!e || !*e) return;
    char *end;
    errno = 0;
    const long v = strtol(e, &end, 10);
    if (errno || *end || v < 0 || v > 65536)
        td_error("TANDEM_BF16_PREFETCH=%s is not a byte count in [0, 65536]; ignored (using %zu)", e, g_pf);
    else
        g_pf = (size_t)v;
}

static size_t bf16_prefetch(void)
{
    pthread_once(&g_pf_once, bf16_prefetch_decide);
    return g_pf;
}

/* Few rows (MR <= 3), NPW <= 4 full panels (32 NPW columns) at once:
 * enough independent chains to hide FMA latency when streaming weights for
 * decode.  (bf16 at MR = 3 goes two panels at a time: 24 accumulators and
 * 8 widened rows would not fit the 32 registers.)
 *
 * bf16 prefetches each panel bf16_prefetch() bytes ahead.  Widening a
 * row takes more instructions than float32's load, so fewer of the rows
 * waiting on memory fit the core's window, and two threads streamed bf16
 * at 0.85x float32's bytes a second; the prefetch puts the lines in flight
 * early.  In a panel's last bf16_prefetch() bytes it reaches into the
 * same panel of the next NPW panels (those the thread reads next, when its
 * range goes on), whose streams would otherwise start cold: +4.2% on
 * medium and +2.3% on moe128 on a Zen 5 (docs/serving.md); past the
 * range's end it falls on another thread's panels or past the matrix (a
 * prefetch never faults).  Measured in docs/serving.md: 1 KiB
 * ahead gained bf16 decoding 5% to 14% on medium and -4% to +4% on
 * moe128 on an Intel Xeon (interleaved A/B sessions of 4-6 rounds); 512
 * bytes lost 16%, 2 KiB lost 4%.  On an AMD EPYC (Zen 5) 2 KiB gained
 * 4-8% over 1 KiB, 3 and 4 KiB no more, no prefetch lost 5-6%; once the
 * prefetch reached into the next group, 3 KiB gained 0.5% to 5.3% over
 * 2 KiB (both models, two runs each, paired in one process) and 1.5,
 * 2.5, 4 and 6 KiB did worse than 3 (the Intel Xeon's 1 KiB is from
 * before the reach into the next group and was not measured again).  float32
 * and int8 gained nothing, and neither did the AVX2 kernel (-6%), so they
 * do not prefetch.  Where a line is fetched early never changes a bit. */
ALWAYS_INLINE void wide_avx512(const int DT, const int MR, const int NPW, float *y, size_t ldy, const float *x,
                               size_t ldx, const void *panel, size_t K)
{
    const size_t ps = panel_bytes((Dtype)DT, K);  /* panel stride */
    const size_t pf = DT == DTYPE_BF16 ? bf16_prefetch() : 0;
    __m512 acc[3][2 * NP_WIDE];
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int q = 0; q < 2 * NPW; q++) acc[r][q] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k++) {
        __m512 b[2 * NP_WIDE];
        size_t ahead = k * GEMM_NR * sizeof(uint16_t) + pf;   /* bf16: from the panel's start */
        if (ahead >= ps) ahead += (size_t)(NPW - 1) * ps;      /* the same panel of the next NPW panels */
#pragma GCC unroll 4
        for (int q = 0; q < NPW; q++) {
            const void *pq = (const char *)panel + q * ps;
            if (DT == DTYPE_BF16)   /* an address, not an object's pointer: it may lie past the matrix */
                _mm_prefetch((const char *)((uintptr_t)pq + ahead), _MM_HINT_T0);
            b[2 * q] = wrow16(DT, pq, k, 0);
            b[2 * q + 1] = wrow16(DT, pq, k, 16);
        }
#pragma GCC unroll 3
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
#pragma GCC unroll 8
            for (int q = 0; q < 2 * NPW; q++) acc[r][q] = _mm512_fmadd_ps(a, b[q], acc[r][q]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int q = 0; q < 2 * NPW; q++)
            _mm512_storeu_ps(y + (size_t)r * ldy + q * 16, acc[r][q]);
}
#endif

#ifdef GEMM_AVX2
/* AVX2 + FMA: 16 ymm registers, so a register tile is 6 rows x 16 columns
 * (half a panel: 12 accumulators, 2 vectors of B, 1 broadcast), or 1..3
 * rows x 32 columns for few rows.  The chains are those of gemm.h. */
#define A2_MR 6

/* The 8 float32 weights of panel row k, columns j0 .. j0 + 7 (see wrow16). */
ALWAYS_INLINE __m256 wrow8(const int DT, const void *pan, size_t k, size_t j0)
{
    if (DT == DTYPE_F32) return _mm256_loadu_ps((const float *)pan + k * GEMM_NR + j0);
    /* bf16: half the row's words, unpacked with zeros (bf16_slot): columns 0-7 and
     * 16-23 from words 0-15, 8-15 and 24-31 from words 16-31 */
    const size_t base = j0 == 8 || j0 == 24 ? 16 : 0;
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)pan + k * GEMM_NR + base));
    const __m256i z = _mm256_setzero_si256();
    return _mm256_castsi256_ps(j0 < 16 ? _mm256_unpacklo_epi16(z, h) : _mm256_unpackhi_epi16(z, h));
}

/* p[0..n) = the first n <= 8 lanes of v */
ALWAYS_INLINE void store8(float *p, __m256 v, size_t n)
{
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
    } else if (n > 0) {
        float t[8];
        _mm256_storeu_ps(t, v);
        memcpy(p, t, n * sizeof(float));
    }
}

/* y[0..MR)[0..ncols) = x[0..MR) . columns h .. h + 15 of a panel, MR <= 6,
 * ncols <= 16. */
ALWAYS_INLINE void half_avx2(const int DT, const int MR, float *y, size_t ldy, const float *x, size_t ldx,
                             const void *panel, size_t h, size_t K, size_t ncols)
{
    __m256 acc[A2_MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (size_t k = 0; k < K; k++) {
        const __m256 b0 = wrow8(DT, panel, k, h);
        const __m256 b1 = wrow8(DT, panel, k, h + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m256 a = _mm256_broadcast_ss(x + (size_t)r * ldx + k);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        store8(y + (size_t)r * ldy, acc[r][0], ncols);
        store8(y + (size_t)r * ldy + 8, acc[r][1], ncols > 8 ? ncols - 8 : 0);
    }
}

/* y[0..MR)[0..ncols) = x[0..MR) . NP panels (panel stride ps bytes), MR <= 3, NP * MR <= 3: up to 12 chains of 8 columns; ncols <=
 * 32 NP.  Each 8 weights are widened once and meet the MR broadcasts
 * (registers: 12 + 3 + 1). */
ALWAYS_INLINE void few_avx2(const int DT, const int MR, const int NP, float *y, size_t ldy, const float *x,
                            size_t ldx, const void *panel, size_t ps, size_t K, size_t ncols)
{
    __m256 acc[3][12];
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 12
        for (int c = 0; c < 4 * NP; c++) acc[r][c] = _mm256_setzero_ps();
    for (size_t k = 0; k < K; k++) {
        __m256 a[3];
#pragma GCC unroll 3
        for (int r = 0; r < MR; r++) a[r] = _mm256_broadcast_ss(x + (size_t)r * ldx + k);
#pragma GCC unroll 12
        for (int c = 0; c < 4 * NP; c++) {
            const __m256 b = wrow8(DT, (const char *)panel + (size_t)(c / 4) * ps, k, (size_t)(c % 4) * 8);
#pragma GCC unroll 3
            for (int r = 0; r < MR; r++) acc[r][c] = _mm256_fmadd_ps(a[r], b, acc[r][c]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 12
        for (int c = 0; c < 4 * NP; c++)
            store8(y + (size_t)r * ldy + (c / 4) * GEMM_NR + (c % 4) * 8, acc[r][c],
                   ncols > (size_t)c * 8 ? ncols - (size_t)c * 8 : 0);
}

ALWAYS_INLINE void half_tile(const int DT, int MR, float *y, size_t ldy, const float *x, size_t ldx,
                             const void *panel, size_t h, size_t K, size_t ncols)
{
    switch (MR) {
    case 1:  half_avx2(DT, 1, y, ldy, x, ldx, panel, h, K, ncols); return;
    case 2:  half_avx2(DT, 2, y, ldy, x, ldx, panel, h, K, ncols); return;
    case 3:  half_avx2(DT, 3, y, ldy, x, ldx, panel, h, K, ncols); return;
    case 4:  half_avx2(DT, 4, y, ldy, x, ldx, panel, h, K, ncols); return;
    case 5:  half_avx2(DT, 5, y, ldy, x, ldx, panel, h, K, ncols); return;
    default: half_avx2(DT, 6, y, ldy, x, ldx, panel, h, K, ncols); return;
    }
}
#endif

#if !defined(GEMM_AVX512) && !defined(GEMM_AVX2)
/* Portable path: the same chain per element with fmaf. */
ALWAYS_INLINE void tile_generic(const int DT, int MR, float *y, size_t ldy, const float *x, size_t ldx,
                                const void *panel, size_t K, size_t ncols)
{
    float acc[MR_MAX][GEMM_NR], b[GEMM_NR];
    memset(acc, 0, sizeof acc);
    for (size_t k = 0; k < K; k++) {
        for (size_t j = 0; j < GEMM_NR; j++) b[j] = wval(DT, panel, k, j);
        for (int r = 0; r < MR; r++) {
            const float a = x[(size_t)r * ldx + k];
            for (int j = 0; j < GEMM_NR; j++) acc[r][j] = fmaf(a, b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < MR; r++) memcpy(y + (size_t)r * ldy, acc[r], ncols * sizeof(float));
}
#endif

ALWAYS_INLINE void tile(const int DT, int MR, float *y, size_t ldy, const float *x, size_t ldx,
                        const void *panel, size_t K, size_t ncols)
{
#ifdef GEMM_AVX512
    /* One specialisation per MR, so the accumulators stay in registers. */
    switch (MR) {
    case 1:  tile_avx512(DT, 1, y, ldy, x, ldx, panel, K, ncols); return;
    case 2:  tile_avx512(DT, 2, y, ldy, x, ldx, panel, K, ncols); return;
    case 3:  tile_avx512(DT, 3, y, ldy, x, ldx, panel, K, ncols); return;
    case 4:  tile_avx512(DT, 4, y, ldy, x, ldx, panel, K, ncols); return;
    case 5:  tile_avx512(DT, 5, y, ldy, x, ldx, panel, K, ncols); return;
    case 6:  tile_avx512(DT, 6, y, ldy, x, ldx, panel, K, ncols); return;
    case 7:  tile_avx512(DT, 7, y, ldy, x, ldx, panel, K, ncols); return;
    case 8:  tile_avx512(DT, 8, y, ldy, x, ldx, panel, K, ncols); return;
    case 9:  tile_avx512(DT, 9, y, ldy, x, ldx, panel, K, ncols); return;
    case 10: tile_avx512(DT, 10, y, ldy, x, ldx, panel, K, ncols); return;
    case 11: tile_avx512(DT, 11, y, ldy, x, ldx, panel, K, ncols); return;
    default: tile_avx512(DT, 12, y, ldy, x, ldx, panel, K, ncols); return;
    }
#elif defined(GEMM_AVX2)
    /* few rows: whole panel rows (12 chains); else 6-row half-panel tiles */
    switch (MR) {
    case 1:  few_avx2(DT, 1, 1, y, ldy, x, ldx, panel, 0, K, ncols); return;
    case 2:  few_avx2(DT, 2, 1, y, ldy, x, ldx, panel, 0, K, ncols); return;
    case 3:  few_avx2(DT, 3, 1, y, ldy, x, ldx, panel, 0, K, ncols); return;
    default: break;
    }
    for (int r = 0; r < MR; r += A2_MR)
        for (size_t h = 0; h < ncols; h += 16)
            half_tile(DT, MR - r < A2_MR ? MR - r : A2_MR, y + (size_t)r * ldy + h, ldy, x + (size_t)r * ldx, ldx,
                      panel, h, K, td_min(16, ncols - h));
#else
    tile_generic(DT, MR, y, ldy, x, ldx, panel, K, ncols);
#endif
}

/* Four full panels for MR <= 3 rows. */
ALWAYS_INLINE void wide(const int DT, int MR, float *y, size_t ldy, const float *x, size_t ldx,
                        const void *panel, size_t K)
{
#ifdef GEMM_AVX512
    switch (MR) {
    case 1:  wide_avx512(DT, 1, NP_WIDE, y, ldy, x, ldx, panel, K); return;
    case 2:  wide_avx512(DT, 2, NP_WIDE, y, ldy, x, ldx, panel, K); return;
    default:
        if (DT == DTYPE_F32) {
            wide_avx512(DT, 3, NP_WIDE, y, ldy, x, ldx, panel, K);
        } else {
            const size_t ps = panel_bytes((Dtype)DT, K);
            wide_avx512(DT, 3, 2, y, ldy, x, ldx, panel, K);
            wide_avx512(DT, 3, 2, y + 2 * GEMM_NR, ldy, x, ldx, (const char *)panel + 2 * ps, K);
        }
        return;
    }
#elif defined(GEMM_AVX2)
    const size_t ps = panel_bytes((Dtype)DT, K);
    for (int q = 0; q < NP_WIDE; q += MR == 1 ? 2 : 1) {
        float *yq = y + q * GEMM_NR;
        const void *pq = (const char *)panel + (size_t)q * ps;
        switch (MR) {
        case 1:  few_avx2(DT, 1, 2, yq, ldy, x, ldx, pq, ps, K, 2 * GEMM_NR); break;
        case 2:  few_avx2(DT, 2, 1, yq, ldy, x, ldx, pq, ps, K, GEMM_NR); break;
        default: few_avx2(DT, 3, 1, yq, ldy, x, ldx, pq, ps, K, GEMM_NR); break;
        }
    }
#else
    const size_t ps = panel_bytes((Dtype)DT, K);
    for (int q = 0; q < NP_WIDE; q++)
        tile_generic(DT, MR, y + q * GEMM_NR, ldy, x, ldx, (const char *)panel + (size_t)q * ps, K, GEMM_NR);
#endif
}

/* Rows [0, M) x panels [p0, p1) of W, dtype DT (f32 or bf16). */
ALWAYS_INLINE void drive_dt(const int DT, float *y, size_t ldy, const float *x, size_t ldx, const GemmW *W,
                            size_t M, size_t p0, size_t p1)
{
    const size_t N = W->N, K = W->K;
    if (M <= 3) {
        size_t p = p0;
        for (; p + NP_WIDE <= p1 && (p + NP_WIDE) * GEMM_NR <= N; p += NP_WIDE)
            wide(DT, (int)M, y + p * GEMM_NR, ldy, x, ldx, panel_at(DT, W, p), K);
        for (; p < p1; p++)
            tile(DT, (int)M, y + p * GEMM_NR, ldy, x, ldx, panel_at(DT, W, p), K,
                 td_min(GEMM_NR, N - p * GEMM_NR));
        return;
    }
    for (size_t mb = 0; mb < M; mb += MB) {
        size_t me = td_min(M, mb + MB);
        for (size_t p = p0; p < p1; p++) {
            size_t nc = td_min(GEMM_NR, N - p * GEMM_NR);
            for (size_t m = mb; m < me; m += MR_MAX)
                tile(DT, (int)td_min(MR_MAX, me - m), y + m * ldy + p * GEMM_NR, ldy, x + m * ldx, ldx,
                     panel_at(DT, W, p), K, nc);
        }
    }
}

/* The one dispatch on the dtype of a call (or of a unit of a group); int8
 * takes x quantized (qx, its row 0 at x's row 0). */
static void drive(float *y, size_t ldy, const float *x, size_t ldx, const GemmQX *qx, const GemmW *W, size_t M,
                  size_t p0, size_t p1)
{
    switch (W->dtype) {
    case DTYPE_F32:  drive_dt(DTYPE_F32, y, ldy, x, ldx, W, M, p0, p1); return;
    case DTYPE_BF16: drive_dt(DTYPE_BF16, y, ldy, x, ldx, W, M, p0, p1); return;
    default:         gemm_q8_drive(y, ldy, qx, W, M, p0, p1); return;
    }
}

/* qx from its row m0 on */
static GemmQX qx_from(const GemmQX *qx, size_t m0)
{
    return qx ? gemm_q8_qx_rows(qx, m0) : (GemmQX){ 0 };
}

/* int8 W: x quantized into this thread's scratch (gemm_q8.h); else NULL */
static const GemmQX *quantized(GemmQX *qx, const float *x, size_t ldx, const GemmW *W, size_t M)
{
    if (W->dtype != DTYPE_INT8) return NULL;
    gemm_q8_quantize_x(qx, gemm_q8_scratch(gemm_q8_qx_bytes(M, W->K)), x, ldx, M, W->K);
    return qx;
}

void gemm_xwt_serial(float *y, size_t ldy, const float *x, size_t ldx, const GemmW *W, size_t M)
{
    if (M == 0 || W->N == 0) return;
    GemmQX qb;
    drive(y, ldy, x, ldx, quantized(&qb, x, ldx, W, M), W, M, 0, panels_of(W->N));
}

struct xwt_ctx {
    float *y; size_t ldy; const float *x; size_t ldx; const GemmQX *qx; const GemmW *W; size_t M;
};

static void xwt_rows(void *vc, size_t m0, size_t m1, int tid)
{
    (void)tid;
    struct xwt_ctx *c = vc;
    const GemmQX q = qx_from(c->qx, m0);
    drive(c->y + m0 * c->ldy, c->ldy, c->x + m0 * c->ldx, c->ldx, &q, c->W, m1 - m0, 0, panels_of(c->W->N));
}

static void xwt_panels(void *vc, size_t p0, size_t p1, int tid)
{
    (void)tid;
    struct xwt_ctx *c = vc;
    drive(c->y, c->ldy, c->x, c->ldx, c->qx, c->W, c->M, p0, p1);
}

void gemm_xwt(float *y, size_t ldy, const float *x, size_t ldx, const GemmW *W, size_t M)
{
    if (M == 0 || W->N == 0) return;
    GemmQX qb;
    struct xwt_ctx c = { y, ldy, x, ldx, quantized(&qb, x, ldx, W, M), W, M };
    size_t n_panels = panels_of(W->N);
    size_t nt = (size_t)pool_threads();
    /* Split rows when there are enough for every thread to get whole cache
     * blocks, otherwise split panels (decode, small batches).  Either split
     * gives the same bits. */
    if (M >= 2 * MB * nt || n_panels < nt)
        pool_for(M, MR_MAX, xwt_rows, &c);
    else
        pool_for(n_panels, M <= 3 ? NP_WIDE : 1, xwt_panels, &c);
}

/* Several forward products in one pool region: units of work are row
 * blocks (many rows) or panel groups (few rows) of every problem, cut by
 * their cost into GROUP_SPLIT contiguous shares per thread, which the
 * threads claim as they get to them.  Each unit is computed by drive()
 * exactly as gemm_xwt would, so the bits are those of separate calls;
 * only the barriers are fewer.  The units are never stored: the thread
 * of a share walks the enumeration (problem, row block, panel group, in
 * order) and runs the units whose cost midpoint falls in that share, so
 * any number of problems (hundreds of experts, each with a few rows) costs
 * one region and no memory. */

/* Unit shape of problem q: rows per unit and panels per unit. */
static void unit_shape(const GemmProblem *q, size_t np, size_t *rb, size_t *pg)
{
    *rb = q->M > 48 ? MB : q->M;
    *pg = q->M > 48 ? np : q->M <= 3 ? NP_WIDE : 1;
}

/* weights are read once per unit, rows cost FMAs */
static double unit_cost(const GemmProblem *q, size_t m0, size_t m1, size_t p0, size_t p1)
{
    return (double)(p1 - p0) * (double)q->W.K * (double)((m1 - m0) + 4);
}

struct group_ctx { const GemmProblem *pr; const GemmQX *qx; int n; double total; int nt; };

/* Runs (when run) the units of the group whose cost midpoint is in
 * [lo, hi); returns the total cost, and counts the units into *nu when
 * not NULL. */
static double group_walk(const GemmProblem *pr, const GemmQX *qx, int n, double lo, double hi, bool run,
                         size_t *nu)
{
    double at = 0;
    for (int i = 0; i < n; i++) {
        const GemmProblem *q = &pr[i];
        if (q->M == 0 || q->W.N == 0) continue;
        const size_t np = panels_of(q->W.N);
        size_t rb, pg;
        unit_shape(q, np, &rb, &pg);
        for (size_t m0 = 0; m0 < q->M; m0 += rb)
            for (size_t p0 = 0; p0 < np; p0 += pg) {
                const size_t m1 = td_min(q->M, m0 + rb), p1 = td_min(np, p0 + pg);
                const double cost = unit_cost(q, m0, m1, p0, p1), mid = at + cost / 2;
                at += cost;
                if (nu) ++*nu;
                if (run && mid >= lo && mid < hi) {
                    const GemmQX qm = qx_from(q->W.dtype == DTYPE_INT8 ? &qx[i] : NULL, m0);
                    drive(q->y + m0 * q->ldy, q->ldy, q->x + m0 * q->ldx, q->ldx, &qm, &q->W, m1 - m0, p0, p1);
                }
            }
    }
    return at;
}

static void group_share(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct group_ctx *c = vc;
    for (size_t t = t0; t < t1; t++)
        group_walk(c->pr, c->qx, c->n, c->total * (double)t / c->nt, c->total * (double)(t + 1) / c->nt, true,
                   NULL);
}

/* The int8 problems' x quantized, in this thread's scratch: qx[i] for
 * problem i (a problem with the x of the one before it shares its copy:
 * q, k and v of one input). */
static const GemmQX *group_quantized(const GemmProblem *pr, int n)
{
    size_t bytes = td_round_up((size_t)n * sizeof(GemmQX), 64), any = 0;
    for (int i = 0; i < n; i++)
        if (pr[i].W.dtype == DTYPE_INT8) {
            bytes += gemm_q8_qx_bytes(pr[i].M, pr[i].W.K);
            any = 1;
        }
    if (!any) return NULL;
    char *buf = gemm_q8_scratch(bytes), *at = buf + td_round_up((size_t)n * sizeof(GemmQX), 64);
    GemmQX *qx = (GemmQX *)(void *)buf;
    for (int i = 0; i < n; i++) {
        const GemmProblem *q = &pr[i];
        if (q->W.dtype != DTYPE_INT8) continue;
        const GemmProblem *b = i > 0 ? &pr[i - 1] : NULL;
        if (b && b->W.dtype == DTYPE_INT8 && b->x == q->x && b->ldx == q->ldx && b->M == q->M && b->W.K == q->W.K) {
            qx[i] = qx[i - 1];
            continue;
        }
        gemm_q8_quantize_x(&qx[i], at, q->x, q->ldx, q->M, q->W.K);
        at += gemm_q8_qx_bytes(q->M, q->W.K);
    }
    return qx;
}

/* Every unit of the group on the calling thread (total: the group's cost). */
static void group_all(const GemmProblem *pr, const GemmQX *qx, int n, double total)
{
    group_walk(pr, qx, n, -1, 2 * total + 1, true, NULL);
}

void gemm_xwt_group_serial(const GemmProblem *pr, int n)
{
    size_t nu = 0;
    const double total = group_walk(pr, NULL, n, 0, 0, false, &nu);
    if (nu > 0) group_all(pr, group_quantized(pr, n), n, total);
}

void gemm_xwt_group(const GemmProblem *pr, int n)
{
    size_t nu = 0;
    struct group_ctx c = { pr, NULL, n, group_walk(pr, NULL, n, 0, 0, false, &nu), pool_threads() };
    if (nu == 0) return;
    c.qx = group_quantized(pr, n);
    if (c.nt <= 1 || nu == 1) {
        group_all(pr, c.qx, n, c.total);
        return;
    }
    /* GROUP_SPLIT cost shares per thread, claimed as the threads get to
     * them: a thread that is late (a busy host, a slower share) leaves its
     * later shares to the others instead of holding the region up */
    c.nt *= GROUP_SPLIT;
    pool_for((size_t)c.nt, 1, group_share, &c);
}

/* ---------------------------------------------------------------- backward
 *
 * Both backward products are one accumulating product
 *
 *     C[I, J] += A[I, R] B[R, J],   A(i, r) = a[i * a_rs + r * a_ks],  B(r, j) = b[r * ldb + j]
 *
 *   dx += dy W:    C = dx [M, K] (lddx),  A = dy   (a_rs = lddy, a_ks = 1),  B = W [N, K], R = N
 *   dW += dy^T x:  C = dW [N, K] (K),     A = dy^T (a_rs = 1, a_ks = lddy),  B = x [M, K] (ldx), R = M
 *
 * computed in reduction blocks of BW_KC rows with fixed boundaries
 * r = 0, KC, 2 KC, ...: for each block (in order) and each element,
 *
 *     s = 0;  for r in the block:  s = fma(A(i, r), B(r, j), s);   C[i][j] = C[i][j] + s
 *
 * so an element's arithmetic does not depend on the tiling, on how the
 * work is split over threads (1 and 2 threads give the same bits) or, for
 * dx, on which other rows are in the call.  The micro-kernel is the
 * forward's: 12 rows x 32 columns of C in 24 registers, one broadcast of A
 * and two vectors of B per step.  The loops, per reduction block:
 *
 *   for each B block (up to BW_B_FLOATS floats of 32-column panels)
 *     for each block of BW_MC rows of A
 *       for each 12-row tile:  for each panel of the B block:  kernel
 *
 * The A tile stays in L1 while it meets every panel (streamed from L2), and
 * C is walked along its rows, which the hardware prefetchers follow; each
 * kernel prefetches its C tile, read only at its end.  B is packed into
 * panels [r][32] when more than one tile uses it (by the first tile, as it
 * reads B in place: its reads from memory overlap its FMAs), and dy^T into
 * tiles [r][16] (broadcasts from contiguous floats) when more than one
 * panel uses it -- unless their row stride is at most BW_LD_INPLACE floats:
 * then they are read in place, which is cheaper than packing and has no
 * cache-set conflicts (those of power-of-two strides are what packing
 * avoids).  dy itself (dx) is read in place, rows as x in the forward.
 *
 * Scratch: each thread keeps one buffer for its packed blocks, grown on
 * demand to what any range of the call could need (so the size depends on
 * the shape, not on which ranges a thread claimed) and kept for the next
 * call: at most BW_B_FLOATS + 8 * 16 * (KC + 1)
 * floats (~4.3 MiB), kc x J floats for J <= 2048.  See gemm_scratch_free.
 */

#ifdef GEMM_AVX512
#define BW_KC         512           /* reduction block (rows of B per panel) */
#define BW_MC         96            /* rows of A per block: 8 tiles */
#define BW_B_FLOATS   (1024 * 1024) /* a packed B block: 4 MiB, kc x J for J <= 2048 */
#define BW_B_SMALL    (64 * 1024)   /* the same when I is a single A block (see bw_run) */
#define BW_LD_INPLACE 200           /* operands with shorter rows are not packed */
#define BW_PF_B       32            /* rows ahead, B read in place */
#define BW_PF_AT      8             /* rows ahead, packing dy^T */
#define AP_LD         16            /* floats per row of a packed dy^T tile */

/* ------------------------------------------------ per-thread scratch */

typedef struct GemmScratch {
    float *buf;
    size_t cap;                  /* floats */
    int in_use;                  /* owned by a live thread */
    struct GemmScratch *next;
} GemmScratch;

static pthread_mutex_t g_scr_mu = PTHREAD_MUTEX_INITIALIZER;
static GemmScratch *g_scr_head;  /* every slot ever made; freed buffers stay listed */
static pthread_key_t g_scr_key;
static pthread_once_t g_scr_once = PTHREAD_ONCE_INIT;

/* Thread exit: give the slot and its memory back. */
static void scratch_release(void *v)
{
    GemmScratch *s = v;
    pthread_mutex_lock(&g_scr_mu);
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
    s->in_use = 0;
    pthread_mutex_unlock(&g_scr_mu);
}

static void scratch_key_init(void)
{
    int rc = pthread_key_create(&g_scr_key, scratch_release);
    TD_CHECK(rc == 0, "pthread_key_create failed (%d)", rc);
}

/* This thread's buffer of at least n floats, 64-byte aligned.  The memory
 * is the GEMM's own cache, like OpenBLAS's internal buffers: plain
 * posix_memalign, not counted by td_malloc (gemm_scratch_bytes reports it). */
static float *scratch_get(size_t n)
{
    pthread_once(&g_scr_once, scratch_key_init);
    GemmScratch *s = pthread_getspecific(g_scr_key);
    if (!s) {
        pthread_mutex_lock(&g_scr_mu);
        for (s = g_scr_head; s && s->in_use; s = s->next) {}
        if (!s) {
            s = calloc(1, sizeof *s);
            TD_CHECK(s != NULL, "out of memory allocating %zu bytes", sizeof *s);
            s->next = g_scr_head;
            g_scr_head = s;
        }
        s->in_use = 1;
        pthread_mutex_unlock(&g_scr_mu);
        pthread_setspecific(g_scr_key, s);
    }
    if (s->cap < n) {
        void *p = NULL;
        pthread_mutex_lock(&g_scr_mu);
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
        int rc = posix_memalign(&p, TD_ALIGN, n * sizeof(float));
        TD_CHECK(rc == 0 && p, "out of memory allocating %zu bytes of GEMM scratch", n * sizeof(float));
        s->buf = p;
        s->cap = n;
        pthread_mutex_unlock(&g_scr_mu);
    }
    return s->buf;
}

void gemm_scratch_free(void)
{
    gemm_q8_scratch_free();
    pthread_mutex_lock(&g_scr_mu);
    for (GemmScratch *s = g_scr_head; s; s = s->next) {
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
    }
    pthread_mutex_unlock(&g_scr_mu);
}

size_t gemm_scratch_bytes(void)
{
    size_t n = gemm_q8_scratch_bytes();
    pthread_mutex_lock(&g_scr_mu);
    for (GemmScratch *s = g_scr_head; s; s = s->next) n += s->cap * sizeof(float);
    pthread_mutex_unlock(&g_scr_mu);
    return n;
}

/* ------------------------------------------------ kernel */

/* C[0..MR)[0..ncols) += the block's sums over kc steps, ncols <= 32.
 * COLA: A(i, r) = a[r * as + i] (dy^T in place, or a packed [r][16] tile),
 * else  A(i, r) = a[i * as + r] (dy rows).  B(r, j) = b[r * bs + j]; MASKB:
 * B read in place, only the ncols real columns loaded; else a packed,
 * zero-padded panel.  bpack != NULL (MASKB): also write the panel packed
 * (kc x 32, zero-padded) for the tiles after this one -- packing fused with
 * the arithmetic, so that B's reads from memory overlap the FMAs. */
static inline __attribute__((always_inline)) void
acc_tile_avx512(const int MR, const int COLA, const int MASKB, float *c, size_t ldc,
                const float *a, size_t as, const float *b, size_t bs, size_t kc, size_t ncols,
                float *bpack)
{
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);
    const __mmask16 m1 = ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1);
    __m512 acc[MR_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        /* C is read at the end: start fetching it now (it is often out of
         * cache since the last reduction block passed over all of C) */
        _mm_prefetch((const char *)(c + (size_t)r * ldc), _MM_HINT_T1);
        _mm_prefetch((const char *)(c + (size_t)r * ldc + ncols - 1), _MM_HINT_T1);
    }
    for (size_t k = 0; k < kc; k++) {
        const float *bk = b + k * bs;
        if (MASKB) {
            /* B read in place, one short piece per row: fetch ahead */
            _mm_prefetch((const char *)(bk + BW_PF_B * bs), _MM_HINT_T0);
            _mm_prefetch((const char *)(bk + BW_PF_B * bs + ncols - 1), _MM_HINT_T0);
        }
        const __m512 b0 = MASKB ? _mm512_maskz_loadu_ps(m0, bk) : _mm512_loadu_ps(bk);
        const __m512 b1 = MASKB ? _mm512_maskz_loadu_ps(m1, bk + 16) : _mm512_loadu_ps(bk + 16);
        if (bpack) {
            _mm512_storeu_ps(bpack + k * GEMM_NR, b0);
            _mm512_storeu_ps(bpack + k * GEMM_NR + 16, b1);
        }
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            const __m512 av = _mm512_set1_ps(COLA ? a[k * as + (size_t)r] : a[(size_t)r * as + k]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    /* C += s (the block's partial sums, added once) */
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        float *cr = c + (size_t)r * ldc;
        if (ncols == GEMM_NR) {
            _mm512_storeu_ps(cr, _mm512_add_ps(_mm512_loadu_ps(cr), acc[r][0]));
            _mm512_storeu_ps(cr + 16, _mm512_add_ps(_mm512_loadu_ps(cr + 16), acc[r][1]));
        } else {
            _mm512_mask_storeu_ps(cr, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), acc[r][0]));
            _mm512_mask_storeu_ps(cr + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), acc[r][1]));
        }
    }
}

#define ACC_TILE_CASES(COLA, MASKB)                                                           \
    switch (MR) {                                                                             \
    case 1:  acc_tile_avx512(1, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 2:  acc_tile_avx512(2, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 3:  acc_tile_avx512(3, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 4:  acc_tile_avx512(4, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 5:  acc_tile_avx512(5, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 6:  acc_tile_avx512(6, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 7:  acc_tile_avx512(7, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 8:  acc_tile_avx512(8, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 9:  acc_tile_avx512(9, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;        \
    case 10: acc_tile_avx512(10, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;       \
    case 11: acc_tile_avx512(11, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;       \
    default: acc_tile_avx512(12, COLA, MASKB, c, ldc, a, as, b, bs, kc, ncols, NULL); return;       \
    }

/* One specialisation per (MR, A layout, B packed or in place): the
 * accumulators stay in registers. */
static void acc_tile(int MR, int cola, int maskb, float *c, size_t ldc, const float *a, size_t as,
                     const float *b, size_t bs, size_t kc, size_t ncols)
{
    if (cola) {
        if (maskb) ACC_TILE_CASES(1, 1) else ACC_TILE_CASES(1, 0)
    } else {
        if (maskb) ACC_TILE_CASES(0, 1) else ACC_TILE_CASES(0, 0)
    }
}
#undef ACC_TILE_CASES

/* A full 12-row tile with B read in place that also writes the packed
 * panel bpack (kc x 32) for the tiles after it. */
static void acc_tile_packb(int cola, float *c, size_t ldc, const float *a, size_t as, const float *b,
                           size_t bs, size_t kc, size_t ncols, float *bpack)
{
    if (cola) acc_tile_avx512(MR_MAX, 1, 1, c, ldc, a, as, b, bs, kc, ncols, bpack);
    else acc_tile_avx512(MR_MAX, 0, 1, c, ldc, a, as, b, bs, kc, ncols, bpack);
}

/* ------------------------------------------------ packing */

/* Transposed A (dy^T): Ap[t][r][i] = dy[r][i0 + 12 t + i] for the tiles of
 * rows [i0, i1), i < 12, tile stride ld rows (kc + 1: the spare row keeps
 * successive tiles off one cache set), rows of AP_LD = 16 floats so that
 * every store is one whole, unmasked vector; lanes past 12 or past i1 are
 * zero and never used. */
static void pack_at(float *Ap, const float *a, size_t ks, size_t i0, size_t i1, size_t kc, size_t ld)
{
    for (size_t r = 0; r < kc; r++) {
        const float *ar = a + r * ks;
        /* dy is read in short pieces of rows far apart: fetch a few rows
         * ahead, the hardware prefetchers do not follow this pattern */
        if (r + BW_PF_AT < kc)
            for (size_t i = i0; i < i1 + 16; i += 16) _mm_prefetch((const char *)(ar + BW_PF_AT * ks + i), _MM_HINT_T0);
        for (size_t i = i0, t = 0; i < i1; i += MR_MAX, t++) {
            size_t n = td_min(MR_MAX, i1 - i);
            __mmask16 m = (__mmask16)((1u << n) - 1);
            _mm512_storeu_ps(Ap + (t * ld + r) * AP_LD, _mm512_maskz_loadu_ps(m, ar + i));
        }
    }
}

/* ------------------------------------------------ driver */

typedef struct {
    float *c; size_t ldc;
    const float *a; size_t a_rs, a_ks;
    const float *b; size_t ldb;
    size_t ni, nj, nr;   /* I, J, R */
    int cola;          /* A is dy^T (a_rs == 1) */
    int split_j;       /* the pool splits panels of J, else rows of I */
    size_t scratch;    /* floats: the most any range of this job needs */
} BwJob;

/* Floats of packed B (*nb) and of packed dy^T (*na) that bw_run needs for
 * a range of ni rows and n_pan panels of C. */
static void bw_scratch(const BwJob *jb, size_t ni, size_t n_pan, size_t *nb, size_t *na)
{
    const size_t kc_max = td_min(BW_KC, jb->nr), ap_ld = kc_max + 1;
    const int pack_b_ = ni > MR_MAX && jb->ldb > BW_LD_INPLACE;                /* panels reused by tiles */
    const int pack_a_ = jb->cola && n_pan > 1 && jb->a_ks > BW_LD_INPLACE;    /* tiles reused by panels */
    /* Panels per B block: all of J <= 2048, so that A is read (and dy^T
     * packed) once per reduction block; 256 KiB when I is one A block, as
     * A is then cheap to re-read and a B block that stays in L2 is worth
     * more (dW with N = 64, K = 1024: ~10% faster). */
    const size_t ncp = td_max(1, (ni <= BW_MC ? BW_B_SMALL : BW_B_FLOATS) / (kc_max * GEMM_NR));
    *nb = pack_b_ ? kc_max * GEMM_NR * td_min(ncp, n_pan) : 0;
    *na = pack_a_ ? ap_ld * AP_LD * ((td_min(BW_MC, ni) + MR_MAX - 1) / MR_MAX) : 0;
}

/* C[i0..i1, panels p0..p1) += A B over all of R, block by block (see the
 * section comment).  The scratch asked for is jb->scratch, what the whole
 * job needs, not this range: whichever ranges a thread claims, a later call
 * of the same shape finds its buffer big enough (gemm.h). */
static void bw_run(const BwJob *jb, size_t i0, size_t i1, size_t p0, size_t p1)
{
    const size_t ni = i1 - i0, kc_max = td_min(BW_KC, jb->nr), ap_ld = kc_max + 1;
    size_t nb, na;
    bw_scratch(jb, ni, p1 - p0, &nb, &na);
    const int pack_b_ = nb > 0, pack_a_ = na > 0;
    const size_t ncp = td_max(1, (ni <= BW_MC ? BW_B_SMALL : BW_B_FLOATS) / (kc_max * GEMM_NR));
    float *Bp = nb + na ? scratch_get(td_max(jb->scratch, nb + na)) : NULL, *Ap = pack_a_ ? Bp + nb : NULL;
    for (size_t pc = 0; pc < jb->nr; pc += BW_KC) {
        const size_t kc = td_min(BW_KC, jb->nr - pc);
        const float *b = jb->b + pc * jb->ldb;   /* rows pc.. of B and of dy^T */
        const float *a = jb->a + pc * jb->a_ks;
        for (size_t jc = p0; jc < p1; jc += ncp) {
            const size_t je = td_min(p1, jc + ncp);
            for (size_t ic = i0; ic < i1; ic += BW_MC) {
                const size_t ie = td_min(i1, ic + BW_MC);
                if (pack_a_) pack_at(Ap, a, jb->a_ks, ic, ie, kc, ap_ld);
                for (size_t i = ic; i < ie; i += MR_MAX)
                    for (size_t p = jc; p < je; p++) {
                        const int mr = (int)td_min(MR_MAX, ie - i);
                        const size_t nc = td_min(GEMM_NR, jb->nj - p * GEMM_NR);
                        float *c = jb->c + i * jb->ldc + p * GEMM_NR;
                        float *bp = pack_b_ ? Bp + (p - jc) * kc * GEMM_NR : NULL;
                        const float *at = pack_a_ ? Ap + (i - ic) / MR_MAX * ap_ld * AP_LD
                                        : jb->cola ? a + i : a + i * jb->a_rs;
                        const size_t as = pack_a_ ? AP_LD : jb->cola ? jb->a_ks : jb->a_rs;
                        if (pack_b_ && i == i0)   /* the first tile packs the panels as it goes */
                            acc_tile_packb(jb->cola, c, jb->ldc, at, as, b + p * GEMM_NR, jb->ldb, kc, nc, bp);
                        else if (pack_b_)
                            acc_tile(mr, jb->cola, 0, c, jb->ldc, at, as, bp, GEMM_NR, kc, nc);
                        else
                            acc_tile(mr, jb->cola, 1, c, jb->ldc, at, as, b + p * GEMM_NR, jb->ldb, kc, nc);
                    }
            }
        }
    }
}

static void bw_range(void *vc, size_t u0, size_t u1, int tid)
{
    (void)tid;
    const BwJob *jb = vc;
    const size_t n_panels = td_round_up(jb->nj, GEMM_NR) / GEMM_NR;
    if (jb->split_j) bw_run(jb, 0, jb->ni, u0, u1);
    else bw_run(jb, u0, u1, 0, n_panels);
}

/* max share / mean share of n units over nt threads (1 = balanced) */
static double imbalance(size_t n, size_t nt)
{
    return (double)((n + nt - 1) / nt * nt) / (double)n;
}

/* The most any range of jb can need, whatever the split: the need grows
 * with the panels and, up to one A block, with the rows; past BW_MC rows
 * the B block is the big one. */
static size_t bw_job_scratch(const BwJob *jb)
{
    const size_t n_panels = td_round_up(jb->nj, GEMM_NR) / GEMM_NR;
    size_t nb, na, nb1, na1;
    bw_scratch(jb, jb->ni, n_panels, &nb, &na);
    bw_scratch(jb, td_min(jb->ni, BW_MC), n_panels, &nb1, &na1);
    return td_max(nb + na, nb1 + na1);
}

/* Threads own disjoint blocks of C (whole 12-row tiles or whole panels),
 * so there is nothing to reduce between them and no write is shared. */
static void bw_product(BwJob *jb)
{
    if (jb->ni == 0 || jb->nj == 0 || jb->nr == 0) return;
    const size_t n_tiles = (jb->ni + MR_MAX - 1) / MR_MAX, n_panels = td_round_up(jb->nj, GEMM_NR) / GEMM_NR;
    const size_t nt = (size_t)pool_threads();
    /* Split whichever of rows and panels divides more evenly over the
     * threads; on a tie the more numerous (each thread then reads all of
     * the other operand: the smaller one).  Below ~1 MFLOP (a few us) the
     * pool's start-up is not worth it.  Results do not depend on either. */
    double ii = imbalance(n_tiles, nt), ij = imbalance(n_panels, nt);
    jb->split_j = ij < ii || (ij == ii && n_panels > n_tiles);
    jb->scratch = bw_job_scratch(jb);
    if (nt == 1 || gemm_flops(jb->ni, jb->nj, jb->nr) < 1e6)
        bw_run(jb, 0, jb->ni, 0, n_panels);
    else if (jb->split_j)
        pool_for(n_panels, 1, bw_range, jb);
    else
        pool_for(jb->ni, MR_MAX, bw_range, jb);
}

void gemm_dx_acc(float *dx, size_t lddx, const float *dy, size_t lddy,
                 const float *W, size_t M, size_t N, size_t K)
{
    BwJob jb = { dx, lddx, dy, lddy, 1, W, K, M, K, N, 0, 0, 0 };
    bw_product(&jb);
}

void gemm_dw_acc(float *dW, const float *dy, size_t lddy, const float *x, size_t ldx,
                 size_t M, size_t N, size_t K)
{
    BwJob jb = { dW, K, dy, 1, lddy, x, ldx, N, K, M, 1, 0, 0 };
    bw_product(&jb);
}

/* ------------------------------------------------ groups
 * Each product is cut into pieces of whole 12-row tiles or whole panels of
 * its C (along whichever it has more of), about a quarter of a thread's
 * share each, and the pieces of every product are dealt to the threads by
 * cost like the forward's units (every thread walks the same enumeration).
 * bw_run gives an element the same bits whatever piece computes it. */

static BwJob bw_job_of(const GemmBwProblem *p)
{
    BwJob jb = p->dw ? (BwJob){ p->out, p->ldout, p->dy, 1, p->lddy, p->in, p->ldin, p->N, p->K, p->M, 1, 0, 0 }
                     : (BwJob){ p->out, p->ldout, p->dy, p->lddy, 1, p->in, p->ldin, p->M, p->K, p->N, 0, 0, 0 };
    /* a group's pieces, like bw_product's ranges, ask for the whole job's */
    if (jb.ni && jb.nj && jb.nr) jb.scratch = bw_job_scratch(&jb);
    return jb;
}

struct bw_group { const GemmBwProblem *pr; int n; double total, target; int nt; };

static double bw_group_walk(const struct bw_group *g, double lo, double hi, bool run)
{
    double at = 0;
    for (int i = 0; i < g->n; i++) {
        BwJob jb = bw_job_of(&g->pr[i]);
        if (jb.ni == 0 || jb.nj == 0 || jb.nr == 0) continue;
        const size_t n_tiles = (jb.ni + MR_MAX - 1) / MR_MAX, n_panels = td_round_up(jb.nj, GEMM_NR) / GEMM_NR;
        const bool by_panels = n_panels > n_tiles;
        const size_t units = by_panels ? n_panels : n_tiles;
        const double cost = (double)jb.ni * (double)jb.nj * (double)jb.nr;
        size_t pieces = g->target > 0 ? (size_t)(cost / g->target) + 1 : 1;
        pieces = td_min(pieces, units);
        for (size_t q = 0; q < pieces; q++) {
            const size_t u0 = q * units / pieces, u1 = (q + 1) * units / pieces;
            const double c = cost * (double)(u1 - u0) / (double)units, mid = at + c / 2;
            at += c;
            if (!run || mid < lo || mid >= hi) continue;
            if (by_panels) bw_run(&jb, 0, jb.ni, u0, u1);
            else bw_run(&jb, u0 * MR_MAX, td_min(jb.ni, u1 * MR_MAX), 0, n_panels);
        }
    }
    return at;
}

static void bw_group_share(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct bw_group *g = vc;
    for (size_t t = t0; t < t1; t++)
        bw_group_walk(g, g->total * (double)t / g->nt, g->total * (double)(t + 1) / g->nt, true);
}

void gemm_bw_group(const GemmBwProblem *pr, int n)
{
    struct bw_group g = { pr, n, 0, 0, pool_threads() };
    g.total = bw_group_walk(&g, 0, 0, false);
    if (g.total <= 0) return;
    /* below ~1 MFLOP in all, one thread (see bw_product) */
    if (g.nt <= 1 || 2 * g.total < 1e6) {
        bw_group_walk(&g, -1, 2 * g.total + 1, true);
        return;
    }
    g.target = g.total / (4.0 * g.nt);
    g.total = bw_group_walk(&g, 0, 0, false);   /* the same sum, cut in pieces */
    pool_for((size_t)g.nt, 1, bw_group_share, &g);
}

#else  /* portable: single-threaded BLAS on disjoint slices from the pool */

void gemm_scratch_free(void) { gemm_q8_scratch_free(); }
size_t gemm_scratch_bytes(void) { return gemm_q8_scratch_bytes(); }

struct bw_ctx {
    float *out; size_t ldo; const float *a; size_t lda; const float *b; size_t ldb;
    size_t M, N, K;
};

/* OpenBLAS's bits for an output element can depend on the shape of the
 * call that holds it (its kernels pick by size and CPU: on Zen 4 a row of dx
 * changed with the rows beside it in the call), so the calls never follow
 * the thread count: each covers one fixed block of BW_BLOCK rows (dx) or
 * columns (dW) from a multiple of BW_BLOCK, and the pool's ranges are whole
 * blocks.  Any thread count then makes the same calls, and the same bits. */
enum { BW_BLOCK = 64 };

static void dx_rows(void *vc, size_t m0, size_t m1, int tid)
{
    (void)tid;
    struct bw_ctx *c = vc;
    /* dx[b:e, :] += dy[b:e, :] W, block by block */
    for (size_t b = m0; b < m1; b += BW_BLOCK) {
        const size_t e = td_min(b + BW_BLOCK, m1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(e - b), (int)c->K, (int)c->N,
                    1.0f, c->a + b * c->lda, (int)c->lda, c->b, (int)c->ldb,
                    1.0f, c->out + b * c->ldo, (int)c->ldo);
    }
}

void gemm_dx_acc(float *dx, size_t lddx, const float *dy, size_t lddy,
                 const float *W, size_t M, size_t N, size_t K)
{
    if (M == 0 || N == 0 || K == 0) return;
    struct bw_ctx c = { dx, lddx, dy, lddy, W, K, M, N, K };
    pool_for_split(M, BW_BLOCK, 1, dx_rows, &c);   /* one range per thread, whole blocks */
}

static void dw_rows(void *vc, size_t n0, size_t n1, int tid)
{
    (void)tid;
    struct bw_ctx *c = vc;
    /* dW[b:e, :] += dy[:, b:e]^T x, block by block */
    for (size_t b = n0; b < n1; b += BW_BLOCK) {
        const size_t e = td_min(b + BW_BLOCK, n1);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(e - b), (int)c->K, (int)c->M,
                    1.0f, c->a + b, (int)c->lda, c->b, (int)c->ldb,
                    1.0f, c->out + b * c->ldo, (int)c->ldo);
    }
}

void gemm_dw_acc(float *dW, const float *dy, size_t lddy, const float *x, size_t ldx,
                 size_t M, size_t N, size_t K)
{
    if (M == 0 || N == 0 || K == 0) return;
    struct bw_ctx c = { dW, K, dy, lddy, x, ldx, M, N, K };
    pool_for_split(N, BW_BLOCK, 1, dw_rows, &c);   /* one range per thread, whole blocks */
}

void gemm_bw_group(const GemmBwProblem *pr, int n)
{
    for (int i = 0; i < n; i++) {
        const GemmBwProblem *p = &pr[i];
        if (p->dw) {
            TD_CHECK(p->ldout == p->K, "gemm_bw_group: dW row stride %zu != K %zu on this build", p->ldout, p->K);
            gemm_dw_acc(p->out, p->dy, p->lddy, p->in, p->ldin, p->M, p->N, p->K);
        } else {
            TD_CHECK(p->ldin == p->K, "gemm_bw_group: W row stride %zu != K %zu on this build", p->ldin, p->K);
            gemm_dx_acc(p->out, p->ldout, p->dy, p->lddy, p->in, p->M, p->N, p->K);
        }
    }
}
#endif

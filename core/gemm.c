/* core/gemm.c - packed, row-invariant forward GEMM and BLAS backward products.
 *
 * The forward kernel is the classic outer-product micro-kernel: a tile of MR
 * rows x 32 columns lives in registers while k runs from 0 to K-1, each step
 * broadcasting x[m][k] and multiplying it into one 32-wide row of the packed
 * panel.  Each accumulator sees exactly the chain of gemm.h, so every tiling
 * below (MR = 1..12 rows, one panel or four side by side) gives the same bits.
 */
#include "core/gemm.h"
#include "core/common.h"
#include "core/pool.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* TANDEM_PORTABLE forces the portable path (tests compare the two). */
#if defined(__AVX512F__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define GEMM_AVX512 1
#endif

#define MR_MAX 12   /* rows per register tile: 12 x 2 zmm = 24 accumulators */
#define MB     96   /* rows per cache block: MB * K floats of x stay in L2 */
#define NP_WIDE 4   /* panels side by side in the few-rows kernel */

size_t gemm_packed_floats(size_t N, size_t K)
{
    return td_round_up(N, GEMM_NR) * K;
}

struct pack_ctx { float *P; const float *W; size_t N, K; };

static void pack_range(void *vctx, size_t p0, size_t p1, int tid)
{
    (void)tid;
    struct pack_ctx *c = vctx;
    for (size_t p = p0; p < p1; p++) {
        float *dst = c->P + p * c->K * GEMM_NR;
        for (size_t j = 0; j < GEMM_NR; j++) {
            size_t n = p * GEMM_NR + j;
            if (n < c->N) {
                const float *src = c->W + n * c->K;
                for (size_t k = 0; k < c->K; k++) dst[k * GEMM_NR + j] = src[k];
            } else {
                for (size_t k = 0; k < c->K; k++) dst[k * GEMM_NR + j] = 0.0f;
            }
        }
    }
}

void gemm_pack(float *P, const float *W, size_t N, size_t K)
{
    struct pack_ctx c = { P, W, N, K };
    pool_for(td_round_up(N, GEMM_NR) / GEMM_NR, 1, pack_range, &c);
}

/* ---------------------------------------------------------------- kernels */

#ifdef GEMM_AVX512
/* y[0..MR)[0..ncols) = x[0..MR) . panel, ncols <= 32. */
static inline __attribute__((always_inline)) void
tile_avx512(const int MR, float *y, size_t ldy, const float *x, size_t ldx,
            const float *panel, size_t K, size_t ncols)
{
    __m512 acc[MR_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(panel + k * GEMM_NR);
        const __m512 b1 = _mm512_loadu_ps(panel + k * GEMM_NR + 16);
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

/* Few rows (MR <= 3), four full panels (128 columns) at once: enough
 * independent chains to hide FMA latency when streaming weights for decode. */
static inline __attribute__((always_inline)) void
wide_avx512(const int MR, float *y, size_t ldy, const float *x, size_t ldx,
            const float *panel, size_t K)
{
    const size_t ps = K * GEMM_NR;  /* panel stride */
    __m512 acc[3][2 * NP_WIDE];
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int q = 0; q < 2 * NP_WIDE; q++) acc[r][q] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k++) {
        __m512 b[2 * NP_WIDE];
#pragma GCC unroll 4
        for (int q = 0; q < NP_WIDE; q++) {
            b[2 * q] = _mm512_loadu_ps(panel + q * ps + k * GEMM_NR);
            b[2 * q + 1] = _mm512_loadu_ps(panel + q * ps + k * GEMM_NR + 16);
        }
#pragma GCC unroll 3
        for (int r = 0; r < MR; r++) {
            const __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
#pragma GCC unroll 8
            for (int q = 0; q < 2 * NP_WIDE; q++) acc[r][q] = _mm512_fmadd_ps(a, b[q], acc[r][q]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int q = 0; q < 2 * NP_WIDE; q++)
            _mm512_storeu_ps(y + (size_t)r * ldy + q * 16, acc[r][q]);
}
#endif

#ifndef GEMM_AVX512
/* Portable path: the same chain per element with fmaf. */
static void tile_generic(int MR, float *y, size_t ldy, const float *x, size_t ldx,
                         const float *panel, size_t K, size_t ncols)
{
    float acc[MR_MAX][GEMM_NR];
    memset(acc, 0, sizeof acc);
    for (size_t k = 0; k < K; k++) {
        const float *b = panel + k * GEMM_NR;
        for (int r = 0; r < MR; r++) {
            const float a = x[(size_t)r * ldx + k];
            for (int j = 0; j < GEMM_NR; j++) acc[r][j] = fmaf(a, b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < MR; r++) memcpy(y + (size_t)r * ldy, acc[r], ncols * sizeof(float));
}
#endif

static void tile(int MR, float *y, size_t ldy, const float *x, size_t ldx,
                 const float *panel, size_t K, size_t ncols)
{
#ifdef GEMM_AVX512
    /* One specialisation per MR, so the accumulators stay in registers. */
    switch (MR) {
    case 1:  tile_avx512(1, y, ldy, x, ldx, panel, K, ncols); return;
    case 2:  tile_avx512(2, y, ldy, x, ldx, panel, K, ncols); return;
    case 3:  tile_avx512(3, y, ldy, x, ldx, panel, K, ncols); return;
    case 4:  tile_avx512(4, y, ldy, x, ldx, panel, K, ncols); return;
    case 5:  tile_avx512(5, y, ldy, x, ldx, panel, K, ncols); return;
    case 6:  tile_avx512(6, y, ldy, x, ldx, panel, K, ncols); return;
    case 7:  tile_avx512(7, y, ldy, x, ldx, panel, K, ncols); return;
    case 8:  tile_avx512(8, y, ldy, x, ldx, panel, K, ncols); return;
    case 9:  tile_avx512(9, y, ldy, x, ldx, panel, K, ncols); return;
    case 10: tile_avx512(10, y, ldy, x, ldx, panel, K, ncols); return;
    case 11: tile_avx512(11, y, ldy, x, ldx, panel, K, ncols); return;
    default: tile_avx512(12, y, ldy, x, ldx, panel, K, ncols); return;
    }
#else
    tile_generic(MR, y, ldy, x, ldx, panel, K, ncols);
#endif
}

/* Four full panels for MR <= 3 rows. */
static void wide(int MR, float *y, size_t ldy, const float *x, size_t ldx,
                 const float *panel, size_t K)
{
#ifdef GEMM_AVX512
    switch (MR) {
    case 1:  wide_avx512(1, y, ldy, x, ldx, panel, K); return;
    case 2:  wide_avx512(2, y, ldy, x, ldx, panel, K); return;
    default: wide_avx512(3, y, ldy, x, ldx, panel, K); return;
    }
#else
    for (int q = 0; q < NP_WIDE; q++)
        tile_generic(MR, y + q * GEMM_NR, ldy, x, ldx, panel + q * K * GEMM_NR, K, GEMM_NR);
#endif
}

/* Rows [0, M) x panels [p0, p1). */
static void drive(float *y, size_t ldy, const float *x, size_t ldx, const float *P,
                  size_t M, size_t N, size_t K, size_t p0, size_t p1)
{
    const size_t ps = K * GEMM_NR;
    if (M <= 3) {
        size_t p = p0;
        for (; p + NP_WIDE <= p1 && (p + NP_WIDE) * GEMM_NR <= N; p += NP_WIDE)
            wide((int)M, y + p * GEMM_NR, ldy, x, ldx, P + p * ps, K);
        for (; p < p1; p++)
            tile((int)M, y + p * GEMM_NR, ldy, x, ldx, P + p * ps, K,
                 td_min(GEMM_NR, N - p * GEMM_NR));
        return;
    }
    for (size_t mb = 0; mb < M; mb += MB) {
        size_t me = td_min(M, mb + MB);
        for (size_t p = p0; p < p1; p++) {
            size_t nc = td_min(GEMM_NR, N - p * GEMM_NR);
            for (size_t m = mb; m < me; m += MR_MAX)
                tile((int)td_min(MR_MAX, me - m), y + m * ldy + p * GEMM_NR, ldy,
                     x + m * ldx, ldx, P + p * ps, K, nc);
        }
    }
}

void gemm_xwt_serial(float *y, size_t ldy, const float *x, size_t ldx,
                     const float *P, size_t M, size_t N, size_t K)
{
    if (M == 0 || N == 0) return;
    drive(y, ldy, x, ldx, P, M, N, K, 0, td_round_up(N, GEMM_NR) / GEMM_NR);
}

struct xwt_ctx {
    float *y; size_t ldy; const float *x; size_t ldx; const float *P;
    size_t M, N, K;
};

static void xwt_rows(void *vc, size_t m0, size_t m1, int tid)
{
    (void)tid;
    struct xwt_ctx *c = vc;
    drive(c->y + m0 * c->ldy, c->ldy, c->x + m0 * c->ldx, c->ldx, c->P, m1 - m0, c->N, c->K,
          0, td_round_up(c->N, GEMM_NR) / GEMM_NR);
}

static void xwt_panels(void *vc, size_t p0, size_t p1, int tid)
{
    (void)tid;
    struct xwt_ctx *c = vc;
    drive(c->y, c->ldy, c->x, c->ldx, c->P, c->M, c->N, c->K, p0, p1);
}

void gemm_xwt(float *y, size_t ldy, const float *x, size_t ldx,
              const float *P, size_t M, size_t N, size_t K)
{
    if (M == 0 || N == 0) return;
    struct xwt_ctx c = { y, ldy, x, ldx, P, M, N, K };
    size_t n_panels = td_round_up(N, GEMM_NR) / GEMM_NR;
    size_t nt = (size_t)pool_threads();
    /* Split rows when there are enough for every thread to get whole cache
     * blocks, otherwise split panels (decode, small batches).  Either split
     * gives the same bits. */
    if (M >= 2 * MB * nt || n_panels < nt)
        pool_for(M, MR_MAX, xwt_rows, &c);
    else
        pool_for(n_panels, M <= 3 ? NP_WIDE : 1, xwt_panels, &c);
}

/* ---------------------------------------------------------------- backward */

struct bw_ctx {
    float *out; size_t ldo; const float *a; size_t lda; const float *b; size_t ldb;
    size_t M, N, K;
};

static void dx_rows(void *vc, size_t m0, size_t m1, int tid)
{
    (void)tid;
    struct bw_ctx *c = vc;
    /* dx[m0:m1, :] += dy[m0:m1, :] W */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(m1 - m0), (int)c->K, (int)c->N,
                1.0f, c->a + m0 * c->lda, (int)c->lda, c->b, (int)c->ldb,
                1.0f, c->out + m0 * c->ldo, (int)c->ldo);
}

void gemm_dx_acc(float *dx, size_t lddx, const float *dy, size_t lddy,
                 const float *W, size_t M, size_t N, size_t K)
{
    if (M == 0 || N == 0 || K == 0) return;
    struct bw_ctx c = { dx, lddx, dy, lddy, W, K, M, N, K };
    pool_for(M, 16, dx_rows, &c);
}

static void dw_rows(void *vc, size_t n0, size_t n1, int tid)
{
    (void)tid;
    struct bw_ctx *c = vc;
    /* dW[n0:n1, :] += dy[:, n0:n1]^T x */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(n1 - n0), (int)c->K, (int)c->M,
                1.0f, c->a + n0, (int)c->lda, c->b, (int)c->ldb,
                1.0f, c->out + n0 * c->ldo, (int)c->ldo);
}

void gemm_dw_acc(float *dW, const float *dy, size_t lddy, const float *x, size_t ldx,
                 size_t M, size_t N, size_t K)
{
    if (M == 0 || N == 0 || K == 0) return;
    struct bw_ctx c = { dW, K, dy, lddy, x, ldx, M, N, K };
    pool_for(N, 16, dw_rows, &c);
}

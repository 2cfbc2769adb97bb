/* tests/test_gemm.c - the forward GEMM (core/ops/gemm.h) and the linear layer
 * built on it (core/ops/linear.h).
 *
 * gemm_xwt promises more than closeness: every output element is the chain
 *     c = 0;  for k: c = fmaf(x[m][k], W[n][k], c)
 * so it is compared BIT FOR BIT with a naive kernel computing exactly that
 * chain, over many shapes (odd M, N not a multiple of 32, odd K), with row
 * strides, with M = 1 against the same row inside a big batch, with 1 and 2
 * pool threads, and against the portable (scalar fmaf) path of gemm.c.
 * The backward products (tandem's blocked kernels, BLAS on the portable
 * path) are checked with tolerances against a naive double product over
 * many shapes, strides and thread splits, against PyTorch
 * (tests/ref/fixtures_ops.py, linear.h5) and central finite differences of
 * a double forward; on the AVX-512 path also for bitwise determinism and
 * bitwise independence of the thread count, which gemm.h promises there.
 */

/* The portable path of core/ops/gemm.c, compiled into this file under other
 * names so that the library's kernels (AVX-512 or AVX2, whichever the build
 * machine has) can be compared with it bit for bit in one binary.  core/ops/gemm.h comes
 * first, so its declarations keep the real names; gemm.c's own include of it
 * is then skipped by the guard. */
#include "core/ops/gemm.h"
#define TANDEM_PORTABLE 1
#define gemm_packed_bytes portable_gemm_packed_bytes
#define gemm_w portable_gemm_w
#define gemm_w_cols portable_gemm_w_cols
#define gemm_pack_q8 portable_gemm_pack_q8
#define gemm_unpack_row portable_gemm_unpack_row
#define gemm_pack portable_gemm_pack
#define gemm_xwt portable_gemm_xwt
#define gemm_xwt_serial portable_gemm_xwt_serial
#define gemm_xwt_group portable_gemm_xwt_group
#define gemm_xwt_group_serial portable_gemm_xwt_group_serial
#define gemm_dx_acc portable_gemm_dx_acc
#define gemm_dw_acc portable_gemm_dw_acc
#define gemm_bw_group portable_gemm_bw_group
#define gemm_scratch_free portable_gemm_scratch_free
#define gemm_scratch_bytes portable_gemm_scratch_bytes
#include "core/ops/gemm.c"
#undef gemm_packed_bytes
#undef gemm_w
#undef gemm_w_cols
#undef gemm_pack_q8
#undef gemm_unpack_row
#undef gemm_pack
#undef gemm_xwt
#undef gemm_xwt_serial
#undef gemm_xwt_group
#undef gemm_xwt_group_serial
#undef gemm_dx_acc
#undef gemm_dw_acc
#undef gemm_bw_group
#undef gemm_scratch_free
#undef gemm_scratch_bytes
#undef TANDEM_PORTABLE

#include "core/common.h"
#include "core/ops/linear.h"
#include "core/pool.h"
#include "core/rng.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void)
{
    pool_free();
    gemm_scratch_free();
}

TestSuite(gemm, .init = setup, .fini = teardown);
TestSuite(linear, .init = setup, .fini = teardown);

/* ------------------------------------------------------------ references */

/* The contract of gemm.h, literally: one fmaf chain per element from 0. */
static void naive_xwt(float *y, size_t ldy, const float *x, size_t ldx, const float *W,
                      size_t M, size_t N, size_t K)
{
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            float c = 0.0f;
            for (size_t k = 0; k < K; k++) c = fmaf(x[m * ldx + k], W[n * K + k], c);
            y[m * ldy + n] = c;
        }
}

/* Same order without fusing (-ffp-contract=off keeps it unfused): used only
 * to show that the inputs are hard enough for the bitwise test to notice a
 * kernel that rounds differently. */
static void naive_xwt_unfused(float *y, const float *x, const float *W, size_t M, size_t N, size_t K)
{
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            float c = 0.0f;
            for (size_t k = 0; k < K; k++) c = c + x[m * K + k] * W[n * K + k];
            y[m * N + n] = c;
        }
}

/* W packed as t (owned by the result: wfree). */
static GemmW packed_as(Dtype t, const float *W, size_t N, size_t K)
{
    void *P = td_malloc(gemm_packed_bytes(t, N, K));
    gemm_pack(P, t, W, N, K);
    return gemm_w(t, P, N, K);
}

static GemmW packed(const float *W, size_t N, size_t K) { return packed_as(DTYPE_F32, W, N, K); }
static void wfree(GemmW W) { td_free((void *)(uintptr_t)W.p); }

/* ------------------------------------------------------------ packing */

Test(gemm, pack_layout_is_panels_of_32_zero_padded)
{
    /* two panels, the second 13 real columns + 19 padding; K = 37: two
     * int8 groups, the second of 5 */
    const size_t N = 45, K = 37, G = 2;
    cr_expect_eq(gemm_packed_bytes(DTYPE_F32, N, K), td_round_up(64 * K * 4, 64), "f32 size of [45, 37]");
    cr_expect_eq(gemm_packed_bytes(DTYPE_BF16, N, K), td_round_up(64 * K * 2, 64), "bf16 size of [45, 37]");
    cr_expect_eq(gemm_packed_bytes(DTYPE_INT8, N, K), 2 * G * 1088, "int8 size of [45, 37]: 1088 bytes a group of a panel");
    cr_expect_eq(gemm_packed_bytes(DTYPE_F32, 32, 3), 32 * 3 * 4, "f32 size of [32, 3]");
    cr_expect_eq(gemm_packed_bytes(DTYPE_F32, 1, 5), 32 * 5 * 4, "f32 size of [1, 5]");
    float *W = fixture_rand(N * K, 1, -1, 1);
    for (int t = 0; t < 3; t++)
        for (int threads = 1; threads <= 2; threads++) {
            const Dtype dt = (Dtype)t;
            pool_init(threads);
            size_t nb = gemm_packed_bytes(dt, N, K);
            unsigned char *P = td_malloc(nb);
            memset(P, 0xA5, nb);   /* padding must be written */
            gemm_pack(P, dt, W, N, K);
            size_t bad = 0, first = SIZE_MAX;
            for (size_t p = 0; p < 2; p++)
                for (size_t j = 0; j < GEMM_NR; j++) {
                    const size_t n = p * GEMM_NR + j;
                    int8_t q[64];
                    float sc[2] = { 0, 0 };
                    /* the documented rule, written out here: s = bf16(amax / 127) (the
                     * upper half of the float, rounded to nearest even), q = rne(x / s) */
                    for (size_t g = 0; n < N && g < G; g++) {
                        float amax = 0;
                        for (size_t k = g * 32; k < K && k < g * 32 + 32; k++) amax = fmaxf(amax, fabsf(W[n * K + k]));
                        sc[g] = fixture_bf16(amax / 127.0f);
                        for (size_t k = g * 32; k < K && k < g * 32 + 32; k++)
                            q[k] = (int8_t)fmaxf(-127, fminf(127, rintf(W[n * K + k] / sc[g])));
                    }
                    for (size_t k = 0; k < (dt == DTYPE_INT8 ? G * 32 : K); k++) {
                        size_t i = (p * K + k) * GEMM_NR + j;
                        int ok;
                        if (dt == DTYPE_F32) {
                            const float want = n < N ? W[n * K + k] : 0.0f;
                            ok = !memcmp((const float *)(const void *)P + i, &want, 4);
                        } else if (dt == DTYPE_BF16) {
                            /* interleaved for the unpacking widen: column j at word s(j) of the row */
                            const size_t sj = j < 16 ? j / 4 * 8 + j % 4 : (j - 16) / 4 * 8 + 4 + j % 4;
                            ok = ((const uint16_t *)(const void *)P)[(p * K + k) * GEMM_NR + sj] ==
                                 (n < N ? dtype_bf16_from_f32(W[n * K + k]) : 0);
                        } else {
                            /* group blocks of 1088 bytes: byte (k4 32 + j) 4 + i holds q + 128 of
                             * k = 32 g + 4 k4 + i (q = 0 past K and past N), then 32 scales, each
                             * the upper 16 bits of the float */
                            const size_t g = k / 32, kk = k % 32, blk = (p * G + g) * 1088;
                            i = blk + ((kk / 4) * 32 + j) * 4 + kk % 4;
                            ok = P[i] == (uint8_t)((n < N && k < K ? q[k] : 0) + 128);
                            if (kk == 0) ok &= !memcmp(P + blk + 1024 + 2 * j, (const char *)&sc[g] + 2, 2);
                        }
                        if (!ok) {
                            bad++;
                            if (first == SIZE_MAX) first = i;
                        }
                    }
                }
            cr_expect_eq(bad, 0, "%s, %d thread(s): %zu packed values wrong, first at %zu", dtype_name(dt), threads,
                         bad, first);
            td_free(P);
        }
    pool_init(1);
    td_free(W);
    EXPECT_NO_LEAKS();
}
/* ------------------------------------------------------------ forward, bitwise */

Test(gemm, xwt_bit_identical_to_fma_chain_over_many_shapes)
{
    static const size_t Ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 40, 97, 200 };
    /* 192 and 416: 4 + 2 and 3 x 4 + 1 full panels (the few-rows kernel's
     * 2- and 3-panel tails, e.g. an expert of width 192) */
    static const size_t Ns[] = { 1, 5, 31, 32, 33, 96, 100, 128, 130, 192, 257, 416 };
    static const size_t Ks[] = { 1, 7, 64, 333 };
    const size_t Mmax = 200, Nmax = 416, Kmax = 333, pad_x = 3, pad_y = 5;
    float *x = fixture_rand(Mmax * (Kmax + pad_x), 2, -1, 1);
    float *W = fixture_rand(Nmax * Kmax, 3, -1, 1);
    float *y = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float));
    float *ref = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float));
    const float sentinel = -12345.0f;
    size_t n_cases = 0, n_fail = 0;
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
        for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++) {
            const size_t N = Ns[a], K = Ks[b];
            GemmW P = packed(W, N, K);
            for (size_t c = 0; c < sizeof Ms / sizeof *Ms; c++) {
                const size_t M = Ms[c];
                /* row strides wider than the rows: ldx = K + 3, ldy = N + 5 */
                const size_t ldx = K + pad_x, ldy = N + pad_y;
                for (size_t i = 0; i < M * ldy; i++) y[i] = ref[i] = sentinel;
                gemm_xwt(y, ldy, x, ldx, &P, M);
                naive_xwt(ref, ldy, x, ldx, W, M, N, K);
                /* the whole strided buffer, so the padding columns must be untouched */
                size_t i = fixture_first_diff(y, ref, M * ldy);
                n_cases++;
                if (i != M * ldy) {
                    n_fail++;
                    cr_expect(0, "M=%zu N=%zu K=%zu: element (%zu, %zu) is %a, fma chain gives %a",
                              M, N, K, i / ldy, i % ldy, (double)y[i], (double)ref[i]);
                }
            }
            wfree(P);
        }
    cr_expect_eq(n_fail, 0, "%zu of %zu shapes not bit-identical", n_fail, n_cases);
    td_free(x);
    td_free(W);
    td_free(y);
    td_free(ref);
    EXPECT_NO_LEAKS();
}

Test(gemm, bitwise_test_would_notice_unfused_rounding)
{
    /* Guard against a test that cannot fail: with these inputs a kernel that
     * multiplies and adds separately gives other bits. */
    const size_t M = 13, N = 33, K = 333;
    float *x = fixture_rand(M * K, 4, -1, 1), *W = fixture_rand(N * K, 5, -1, 1);
    float *a = td_malloc(M * N * sizeof(float)), *b = td_malloc(M * N * sizeof(float));
    naive_xwt(a, N, x, K, W, M, N, K);
    naive_xwt_unfused(b, x, W, M, N, K);
    size_t same = 0;
    for (size_t i = 0; i < M * N; i++) same += memcmp(&a[i], &b[i], sizeof(float)) == 0;
    cr_expect_lt(same, M * N / 2, "%zu of %zu elements agree between fused and unfused chains",
                 same, M * N);
    td_free(x);
    td_free(W);
    td_free(a);
    td_free(b);
    EXPECT_NO_LEAKS();
}

Test(gemm, xwt_row_is_independent_of_batch_and_threads)
{
    /* M = 500 >= 2 * 96 rows per thread, so with 2 threads the rows are split;
     * smaller M splits the panels.  Every row must keep its bits. */
    const size_t M = 500, N = 70, K = 333;
    float *x = fixture_rand(M * K, 6, -1, 1), *W = fixture_rand(N * K, 7, -1, 1);
    GemmW P = packed(W, N, K);
    float *full = td_malloc(M * N * sizeof(float)), *part = td_malloc(M * N * sizeof(float));
    gemm_xwt(full, N, x, K, &P, M);

    /* one row at a time (the M = 1 decode path) */
    size_t bad = 0, first = M;
    for (size_t m = 0; m < M; m++) {
        gemm_xwt(part, N, x + m * K, K, &P, 1);
        if (fixture_first_diff(part, full + m * N, N) != N) {
            bad++;
            if (first == M) first = m;
        }
    }
    cr_expect_eq(bad, 0, "%zu rows differ computed alone (M=1), first row %zu", bad, first);

    /* sub-batches of 2, 3, 5, 13 and 97 rows at odd offsets */
    static const size_t sub[] = { 2, 3, 5, 13, 97 };
    for (size_t s = 0; s < sizeof sub / sizeof *sub; s++) {
        size_t m0 = 11 + 37 * s;
        gemm_xwt(part, N, x + m0 * K, K, &P, sub[s]);
        char what[64];
        snprintf(what, sizeof what, "rows %zu..%zu as a batch of %zu", m0, m0 + sub[s], sub[s]);
        EXPECT_BITWISE(part, full + m0 * N, sub[s] * N, what);
    }

    /* serial variant */
    gemm_xwt_serial(part, N, x, K, &P, M);
    EXPECT_BITWISE(part, full, M * N, "gemm_xwt_serial vs gemm_xwt");

    /* two threads: rows split (M = 500), panels split (M = 7, and M = 2 with
     * the four-panel kernel over N = 300) */
    pool_init(2);
    gemm_xwt(part, N, x, K, &P, M);
    EXPECT_BITWISE(part, full, M * N, "2 threads, M=500 (row split)");
    gemm_xwt(part, N, x + 100 * K, K, &P, 7);
    EXPECT_BITWISE(part, full + 100 * N, 7 * N, "2 threads, M=7 (panel split)");
    pool_init(1);

    const size_t N2 = 300;
    float *W2 = fixture_rand(N2 * K, 8, -1, 1);
    GemmW P2 = packed(W2, N2, K);
    float *y1 = td_malloc(2 * N2 * sizeof(float)), *y2 = td_malloc(2 * N2 * sizeof(float));
    float *ref = td_malloc(2 * N2 * sizeof(float));
    naive_xwt(ref, N2, x, K, W2, 2, N2, K);
    gemm_xwt(y1, N2, x, K, &P2, 2);
    pool_init(2);
    gemm_xwt(y2, N2, x, K, &P2, 2);
    pool_init(1);
    EXPECT_BITWISE(y1, ref, 2 * N2, "M=2 N=300 (wide kernel), 1 thread vs fma chain");
    EXPECT_BITWISE(y2, ref, 2 * N2, "M=2 N=300 (wide kernel), 2 threads vs fma chain");

    td_free(x);
    td_free(W);
    wfree(P);
    td_free(full);
    td_free(part);
    td_free(W2);
    wfree(P2);
    td_free(y1);
    td_free(y2);
    td_free(ref);
    EXPECT_NO_LEAKS();
}

Test(gemm, portable_path_bit_identical_to_compiled_path)
{
    /* With AVX-512 or AVX2 this compares that path with the portable one;
     * on a machine with neither both sides are the portable kernel.  Every
     * dtype; K not a multiple of 32 gives int8 a partial last group. */
    static const size_t shapes[][3] = {
        { 1, 1, 1 }, { 1, 130, 333 }, { 2, 300, 64 }, { 3, 257, 7 }, { 5, 33, 333 },
        { 12, 64, 17 }, { 13, 100, 65 }, { 200, 45, 100 }, { 1, 512, 96 }, { 3, 129, 31 },
    };
    for (int t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const Dtype dt = (Dtype)t;
            const size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *x = fixture_rand(M * K, 10 + s, -1, 1), *W = fixture_rand(N * K, 20 + s, -1, 1);
            GemmW P = packed_as(dt, W, N, K);
            const size_t nb = portable_gemm_packed_bytes(dt, N, K);
            unsigned char *Pp = td_malloc(nb);
            portable_gemm_pack(Pp, dt, W, N, K);
            const GemmW Wp = portable_gemm_w(dt, Pp, N, K);
            cr_expect_eq(nb, gemm_packed_bytes(dt, N, K), "packed sizes");
            cr_expect(!memcmp(Pp, P.p, nb), "%s [%zu, %zu]: packed bytes differ", dtype_name(dt), N, K);
            float *y = td_malloc(M * N * sizeof(float)), *yp = td_malloc(M * N * sizeof(float));
            gemm_xwt(y, N, x, K, &P, M);
            portable_gemm_xwt(yp, N, x, K, &Wp, M);
            char what[64];
            snprintf(what, sizeof what, "%s portable vs compiled, M=%zu N=%zu K=%zu", dtype_name(dt), M, N, K);
            EXPECT_BITWISE(y, yp, M * N, what);
            td_free(x);
            td_free(W);
            wfree(P);
            td_free(Pp);
            td_free(y);
            td_free(yp);
        }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ bf16 and int8 weights */

/* The float32 values a bf16 / int8 weight stands for, computed here from
 * the definitions (SPEC section 11, core/dtype.h) without the library's
 * quantizer: bf16 = upper 16 bits rounded to nearest even; int8 = per row,
 * groups of 32 along K (the last one K mod 32 long), s = amax / 127,
 * q = rne(x / s) clamped to 127, value = (float)q * s. */
static void dequantized(float *Wd, Dtype t, const float *W, size_t N, size_t K)
{
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g * 32 < K; g++) {
            const size_t k0 = g * 32, k1 = k0 + 32 < K ? k0 + 32 : K;
            float amax = 0;
            for (size_t k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(W[n * K + k]));
            const float s = fixture_bf16(amax / 127.0f);
            for (size_t k = k0; k < k1; k++) {
                const float w = W[n * K + k];
                if (t == DTYPE_F32) Wd[n * K + k] = w;
                else if (t == DTYPE_BF16) Wd[n * K + k] = fixture_bf16(w);   /* finite inputs */
                else {
                    const int q = s > 0 ? (int)fmaxf(-127, fminf(127, rintf(w / s))) : 0;
                    Wd[n * K + k] = (float)q * s;   /* an int: q = 0 is +0, never -0 */
                }
            }
        }
}

Test(gemm, narrow_weights_bit_identical_to_fma_chain_on_dequantized_weights)
{
    /* The contract of gemm.h for bf16: exactly the f32 chain on the rounded
     * weights (int8: the next test).  Odd M, N and K; row strides wider
     * than the rows; 1 and 2 threads.  gemm_unpack_row gives the
     * dequantized weights at both dtypes. */
    static const size_t Ms[] = { 1, 2, 3, 4, 7, 12, 13, 50, 200 };
    static const size_t Ns[] = { 1, 31, 33, 130, 257 };
    static const size_t Ks[] = { 1, 31, 32, 33, 100, 333 };
    const size_t Mmax = 200, Nmax = 257, Kmax = 333, pad_x = 3, pad_y = 5;
    /* weights spread over several binades, so int8 groups have different scales */
    float *x = fixture_rand(Mmax * (Kmax + pad_x), 2, -1, 1), *W = fixture_rand(Nmax * Kmax, 3, -1, 1);
    for (size_t i = 0; i < Nmax * Kmax; i++) W[i] *= (float)(1 << (i * 7919 % 9)) * 0.01f;
    float *Wd = td_malloc(Nmax * Kmax * sizeof(float));
    float *y = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float)), *ref = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float));
    size_t n_cases = 0, n_fail = 0;
    for (int t = 1; t < 3; t++)
        for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++) {
                const Dtype dt = (Dtype)t;
                const size_t N = Ns[a], K = Ks[b];
                GemmW P = packed_as(dt, W, N, K);
                dequantized(Wd, dt, W, N, K);
                for (size_t c = 0; c < sizeof Ms / sizeof *Ms && dt == DTYPE_BF16; c++)
                    for (int th = 1; th <= 2; th++) {
                        const size_t M = Ms[c], ldx = K + pad_x, ldy = N + pad_y;
                        pool_init(th);
                        for (size_t i = 0; i < M * ldy; i++) y[i] = ref[i] = -12345.0f;
                        gemm_xwt(y, ldy, x, ldx, &P, M);
                        naive_xwt(ref, ldy, x, ldx, Wd, M, N, K);
                        size_t i = fixture_first_diff(y, ref, M * ldy);
                        n_cases++;
                        if (i != M * ldy) {
                            n_fail++;
                            cr_expect(0, "%s M=%zu N=%zu K=%zu, %d threads: element (%zu, %zu) is %a, chain gives %a",
                                      dtype_name(dt), M, N, K, th, i / ldy, i % ldy, (double)y[i], (double)ref[i]);
                        }
                    }
                pool_init(1);
                /* the rows the embedding lookup reads are the same values */
                float row[333];
                size_t bad = 0;
                for (size_t n = 0; n < N; n++) {
                    gemm_unpack_row(row, &P, n);
                    bad += memcmp(row, Wd + n * K, K * sizeof(float)) != 0;
                }
                cr_expect_eq(bad, 0, "%s [%zu, %zu]: %zu rows of gemm_unpack_row differ from the dequantized weights",
                             dtype_name(dt), N, K, bad);
                wfree(P);
            }
    cr_expect_eq(n_fail, 0, "%zu of %zu cases not bit-identical", n_fail, n_cases);
    td_free(x);
    td_free(W);
    td_free(Wd);
    td_free(y);
    td_free(ref);
    EXPECT_NO_LEAKS();
}

/* y = x W^T at int8 from the definition of core/ops/gemm_q8.h, written out
 * here: W quantized per group of 32 (s = amax / 127 rounded to bfloat16,
 * nearest even; q = rne(v / s) clamped) and each row of x rounded per group to integers of at most
 * 8320 (s = amax / 8320), 0 when s is not finite and > 0; an exact
 * integer sum per group, c = fma(sx * sw, (float)isum, c) over the groups
 * in order.  variant 1: unfused c + d * isum; 2: the scales multiplied the
 * other way round in a chain, fma(sx, sw * isum, c); 4: x rounded to 8
 * bits (W8A8); 5: x to 16 bits (32767). */
static void quant_group(int *q, const float *v, size_t n, float *s_out, float levels, bool bf16_scale)
{
    float amax = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        nan |= v[i] != v[i];
        amax = fmaxf(amax, fabsf(v[i]));
    }
    float s = nan ? NAN : amax / levels;
    if (bf16_scale && !nan) s = fixture_bf16(s);
    *s_out = s;
    for (size_t i = 0; i < n; i++)
        q[i] = s > 0 && s < INFINITY ? (int)fmaxf(-levels, fminf(levels, rintf(v[i] / s))) : 0;
}

static void int8_xwt(float *y, size_t ldy, const float *x, size_t ldx, const float *W, size_t M, size_t N, size_t K,
                     int variant)
{
    int qx[32], qw[32];
    const float xl = variant == 4 ? 127.0f : variant == 5 ? 32767.0f : 8320.0f;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            float c = 0;
            for (size_t k0 = 0; k0 < K; k0 += 32) {
                const size_t ng = K - k0 < 32 ? K - k0 : 32;
                float sx, sw;
                quant_group(qx, x + m * ldx + k0, ng, &sx, xl, false);
                quant_group(qw, W + n * K + k0, ng, &sw, 127.0f, true);
                if (!(sw > 0)) sw = 0;   /* the weights' quantizer stores s = 0 for an all-zero group */
                int32_t isum = 0;
                for (size_t i = 0; i < ng; i++) isum += qx[i] * qw[i];
                if (variant == 1) c = c + (sx * sw) * (float)isum;
                else if (variant == 2) c = fmaf(sx, sw * (float)isum, c);
                else c = fmaf(sx * sw, (float)isum, c);
            }
            y[m * ldy + n] = c;
        }
}

Test(gemm, int8_weights_bit_identical_to_the_definition)
{
    /* Odd M, N and K (K = 1, 31, 33, 100, 333: a partial last group), row
     * strides wider than the rows, weights over several binades (groups of
     * different scales), an all-zero group of x; 1 and 2 threads.  The
     * kernel suites run this on every path (AVX-512 VNNI, AVX2, portable). */
    static const size_t Ms[] = { 1, 2, 3, 4, 5, 6, 7, 12, 13, 50, 200 };
    static const size_t Ns[] = { 1, 31, 33, 130, 257 };
    static const size_t Ks[] = { 1, 31, 32, 33, 100, 333 };
    const size_t Mmax = 200, Nmax = 257, Kmax = 333, pad_x = 3, pad_y = 5;
    float *x = fixture_rand(Mmax * (Kmax + pad_x), 2, -1, 1), *W = fixture_rand(Nmax * Kmax, 3, -1, 1);
    for (size_t i = 0; i < Nmax * Kmax; i++) W[i] *= (float)(1 << (i * 7919 % 9)) * 0.01f;
    for (size_t i = 0; i < Mmax * (Kmax + pad_x); i++) x[i] *= (float)(1 << (i * 104729 % 7)) * 0.1f;
    memset(x + 3 * (Kmax + pad_x), 0, 40 * sizeof(float));   /* row 3: its first group all zero */
    float *y = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float)), *ref = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float));
    float *y2 = td_malloc(Mmax * (Nmax + pad_y) * sizeof(float));
    size_t n_cases = 0, n_fail = 0;
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
        for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++) {
            const size_t N = Ns[a], K = Ks[b];
            GemmW P = packed_as(DTYPE_INT8, W, N, K);
            for (size_t c = 0; c < sizeof Ms / sizeof *Ms; c++) {
                const size_t M = Ms[c], ldx = K + pad_x, ldy = N + pad_y;
                for (size_t i = 0; i < M * ldy; i++) ref[i] = -12345.0f;
                int8_xwt(ref, ldy, x, ldx, W, M, N, K, 0);
                for (int th = 1; th <= 2; th++) {
                    pool_init(th);
                    for (size_t i = 0; i < M * ldy; i++) y[i] = -12345.0f;
                    gemm_xwt(y, ldy, x, ldx, &P, M);
                    size_t i = fixture_first_diff(y, ref, M * ldy);
                    n_cases++;
                    if (i != M * ldy) {
                        n_fail++;
                        cr_expect(0, "int8 M=%zu N=%zu K=%zu, %d threads: element (%zu, %zu) is %a, the definition gives %a",
                                  M, N, K, th, i / ldy, i % ldy, (double)y[i], (double)ref[i]);
                    }
                }
                /* the group product (one region; the second problem, of the same x, shares its
                 * quantized copy) and the serial call give the same bits */
                GemmProblem pr[2] = { { y, ldy, x, ldx, P, M }, { y2, ldy, x, ldx, P, M } };
                {
                    for (size_t i = 0; i < M * ldy; i++) y2[i] = -12345.0f;
                    gemm_xwt_group(pr, 2);
                    n_cases++;
                    if (fixture_first_diff(y, ref, M * ldy) != M * ldy || fixture_first_diff(y2, ref, M * ldy) != M * ldy) {
                        n_fail++;
                        cr_expect(0, "int8 M=%zu N=%zu K=%zu: gemm_xwt_group differs", M, N, K);
                    }
                }
                gemm_xwt_serial(y, ldy, x, ldx, &P, M);
                n_cases++;
                if (fixture_first_diff(y, ref, M * ldy) != M * ldy) {
                    n_fail++;
                    cr_expect(0, "int8 M=%zu N=%zu K=%zu: gemm_xwt_serial differs", M, N, K);
                }
            }
            pool_init(1);
            wfree(P);
        }
    cr_expect_eq(n_fail, 0, "%zu of %zu cases not bit-identical", n_fail, n_cases);
    td_free(x);
    td_free(W);
    td_free(y);
    td_free(y2);
    td_free(ref);
    EXPECT_NO_LEAKS();
}

/* Mismatches of qx (M rows of K, from x with row stride K) against the
 * definition above, value for value with its scales and sums, in the one
 * form this build holds: 16-bit, or two digits (qx = 129 hi + lo, both in
 * [-64, 64]); zero past K. */
static size_t qx_mismatches(const GemmQX *qx, const float *x, size_t M, size_t K)
{
    const size_t G = (K + 31) / 32;
    size_t bad = 0;
    cr_assert((qx->q != NULL) != (qx->q16 != NULL), "qx holds %s", qx->q ? "both forms" : "neither form");
    for (size_t m = 0; m < M; m++)
        for (size_t g = 0; g < G; g++) {
            const size_t ng = K - 32 * g < 32 ? K - 32 * g : 32;
            int ref[32];
            float s;
            quant_group(ref, x + m * K + 32 * g, ng, &s, 8320.0f, false);
            int32_t sum = 0;
            for (size_t i = 0; i < 32; i++) {
                const int want = i < ng ? ref[i] : 0;
                sum += want;
                if (qx->q16) {
                    const int got = qx->q16[m * qx->ldq / 2 + g * 32 + i];
                    if (got != want && bad++ < 5)
                        cr_expect(0, "row %zu group %zu: q16[%zu] = %d, the definition gives %d", m, g, i, got, want);
                } else {
                    const int8_t *hi = qx->q + m * qx->ldq + g * 64, *lo = hi + 32;
                    if ((129 * hi[i] + lo[i] != want || hi[i] < -64 || hi[i] > 64 || lo[i] < -64 || lo[i] > 64) &&
                        bad++ < 5)
                        cr_expect(0, "row %zu group %zu: q[%zu] = 129 * %d + %d, the definition gives %d", m, g, i,
                                  hi[i], lo[i], want);
                }
            }
            const float got = qx->s[m * G + g];
            if (memcmp(&got, &s, sizeof s) != 0 && !(isnan(got) && isnan(s)) && bad++ < 5)
                cr_expect(0, "row %zu group %zu: scale %a, the definition gives %a", m, g, (double)got, (double)s);
            if (!isnan(s) && s > 0 && qx->sum[m * G + g] != sum && bad++ < 5)
                cr_expect(0, "row %zu group %zu: sum %d, the values give %d", m, g, qx->sum[m * G + g], sum);
        }
    return bad;
}

/* The activation rounding (core/ops/gemm_q8.c: its vector path on this
 * build) against the definition above: rows of K = 100 (three whole
 * groups and a partial one) over several binades, an all-zero group, a
 * group with a NaN, one with an infinity, one of exact ties (scale 1:
 * k + 0.5 rounds to even) and one whose values sit on and beside the digit
 * boundaries (multiples of 129 plus or minus 64 and 65); then every value
 * qx can take, -8320 .. 8320, at scale 1 (each group holds 8320 to pin
 * it), so the digit split is checked for all of them. */
Test(gemm, int8_activation_rounding_matches_the_definition)
{
    const size_t M = 8, K = 100;
    float *x = fixture_rand(M * K, 11, -1, 1);
    for (size_t i = 0; i < M * K; i++) x[i] *= (float)(1 << (i * 7919 % 11)) * 0.01f;
    for (size_t i = 0; i < 32; i++) x[1 * K + i] = 0.0f;
    x[2 * K + 40] = NAN;
    x[3 * K + 70] = INFINITY;
    for (size_t i = 0; i < 32; i++) x[4 * K + i] = (float)((int)i - 16) * 250.0f + 0.5f;
    x[4 * K + 5] = -8320.0f;   /* amax 8320: scale exactly 1 */
    for (size_t i = 0; i < 32; i++) {   /* scale 1 again: 129 j + {-65, -64, 64, 65} */
        static const int off[4] = { -65, -64, 64, 65 };
        x[5 * K + i] = (float)(129 * ((int)i / 4 - 4) + off[i % 4]);
    }
    x[5 * K + 31] = 8320.0f;
    GemmQX qx;
    void *buf = td_malloc(gemm_q8_qx_bytes(M, K));
    gemm_q8_quantize_x(&qx, buf, x, K, M, K);
    size_t bad = qx_mismatches(&qx, x, M, K);
    td_free(buf);
    td_free(x);

    const size_t KA = 32 * 537;   /* 537 groups of 8320 and 31 values: all 16641 */
    float *all = td_malloc(KA * sizeof(float));
    for (size_t g = 0; g < KA / 32; g++) {
        all[32 * g] = g % 2 ? -8320.0f : 8320.0f;
        for (size_t i = 1; i < 32; i++) {
            const long v = -8320 + (long)(31 * g + i - 1);
            all[32 * g + i] = (float)(v < 8320 ? v : 8320);
        }
    }
    buf = td_malloc(gemm_q8_qx_bytes(1, KA));
    gemm_q8_quantize_x(&qx, buf, all, KA, 1, KA);
    bad += qx_mismatches(&qx, all, 1, KA);
    cr_expect(bad == 0, "%zu mismatches", bad);
    td_free(buf);
    td_free(all);
}

Test(gemm, int8_test_would_notice_another_rounding_and_non_finite_x_gives_nan)
{
    /* Guard: the comparison above fails for a kernel that rounds otherwise
     * (unfused, the scales applied in another order), that skips x's
     * rounding (the f32 chain on the dequantized weights) or that rounds x
     * to 8 bits (W8A8) or to 16 bits at another scale (32767). */
    const size_t M = 5, N = 40, K = 100;
    float *x = fixture_rand(M * K, 4, -1, 1), *W = fixture_rand(N * K, 5, -1, 1);
    float *Wd = td_malloc(N * K * sizeof(float)), *a = td_malloc(M * N * sizeof(float)), *b = td_malloc(M * N * sizeof(float));
    int8_xwt(a, N, x, K, W, M, N, K, 0);
    dequantized(Wd, DTYPE_INT8, W, N, K);
    for (int v = 1; v <= 5; v++) {
        if (v != 3) int8_xwt(b, N, x, K, W, M, N, K, v);
        else naive_xwt(b, N, x, K, Wd, M, N, K);
        size_t same = 0;
        for (size_t i = 0; i < M * N; i++) same += memcmp(&a[i], &b[i], 4) == 0;
        cr_expect_lt(same, M * N * 9 / 10, "variant %d: %zu of %zu elements agree with the definition", v, same, M * N);
    }
    float *Wt = td_malloc(N * K * sizeof(float));
    for (size_t i = 0; i < N * K; i++) {
        uint32_t u;
        memcpy(&u, &W[i], 4);
        u &= 0xffff0000u;
        memcpy(&Wt[i], &u, 4);
    }
    dequantized(Wd, DTYPE_BF16, W, N, K);
    naive_xwt(a, N, x, K, Wd, M, N, K);
    naive_xwt(b, N, x, K, Wt, M, N, K);
    size_t same = 0;
    for (size_t i = 0; i < M * N; i++) same += memcmp(&a[i], &b[i], 4) == 0;
    cr_expect_lt(same, M * N / 2, "%zu of %zu elements agree with truncated bf16", same, M * N);
    /* a NaN or an infinity in a row of x: every output of that row NaN, the other rows as before */
    GemmW P = packed_as(DTYPE_INT8, W, N, K);
    gemm_xwt(a, N, x, K, &P, M);
    x[1 * K + 70] = NAN;
    x[3 * K + 5] = INFINITY;
    gemm_xwt(b, N, x, K, &P, M);
    size_t nan_rows = 0, kept = 0;
    for (size_t n = 0; n < N; n++) {
        nan_rows += isnan(b[1 * N + n]) && isnan(b[3 * N + n]);
        kept += !memcmp(&a[n], &b[n], 4) && !memcmp(&a[2 * N + n], &b[2 * N + n], 4) && !memcmp(&a[4 * N + n], &b[4 * N + n], 4);
    }
    cr_expect(nan_rows == N && kept == N, "non-finite x: %zu of %zu columns NaN in rows 1 and 3, %zu kept elsewhere",
              nan_rows, N, kept);
    wfree(P);
    td_free(x);
    td_free(W);
    td_free(Wd);
    td_free(Wt);
    td_free(a);
    td_free(b);
    EXPECT_NO_LEAKS();
}

Test(gemm, narrow_rows_independent_of_batch_and_pre_quantized_packing_is_the_same)
{
    /* A row's bits do not depend on M (decode M = 1 inside a batch of 300)
     * at any dtype; and packing the checkpoint's int8 values (gemm_pack_q8)
     * gives the bytes of quantizing at load (gemm_pack). */
    const size_t M = 300, N = 200, K = 77, G = 3;
    float *x = fixture_rand(M * K, 6, -1, 1), *W = fixture_rand(N * K, 7, -1, 1);
    float *full = td_malloc(M * N * sizeof(float)), *part = td_malloc(M * N * sizeof(float));
    for (int t = 0; t < 3; t++) {
        GemmW P = packed_as((Dtype)t, W, N, K);
        gemm_xwt(full, N, x, K, &P, M);
        size_t bad = 0;
        for (size_t m = 0; m < M; m += 7) {
            gemm_xwt(part, N, x + m * K, K, &P, 1);
            bad += fixture_first_diff(part, full + m * N, N) != N;
        }
        cr_expect_eq(bad, 0, "%s: %zu rows differ computed alone", dtype_name((Dtype)t), bad);
        gemm_xwt(part, N, x + 5 * K, K, &P, 3);
        EXPECT_BITWISE(part, full + 5 * N, 3 * N, "rows 5..8 as a batch of 3");
        wfree(P);
    }
    int8_t *Q = td_malloc(N * K);
    float *S = td_malloc(N * G * sizeof(float));
    for (size_t n = 0; n < N; n++) dtype_q8_quantize_row(Q + n * K, S + n * G, W + n * K, K);
    GemmW P = packed_as(DTYPE_INT8, W, N, K);
    const size_t nb = gemm_packed_bytes(DTYPE_INT8, N, K);
    unsigned char *P2 = td_malloc(nb);
    memset(P2, 0x5A, nb);
    gemm_pack_q8(P2, Q, S, N, K);
    cr_expect(!memcmp(P2, P.p, nb), "gemm_pack_q8 and gemm_pack give other bytes");
    wfree(P);
    td_free(P2);
    td_free(Q);
    td_free(S);
    td_free(x);
    td_free(W);
    td_free(full);
    td_free(part);
    EXPECT_NO_LEAKS();
}
/* ------------------------------------------------------------ backward products */

Test(gemm, dx_dw_accumulate_against_double_product)
{
    static const size_t shapes[][3] = { { 1, 1, 1 }, { 5, 7, 3 }, { 37, 70, 65 }, { 20, 33, 1 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const size_t lddx = K + 2, lddy = N + 3, ldx = K + 1;   /* strided rows */
        float *dy = fixture_rand(M * lddy, 30 + s, -1, 1), *x = fixture_rand(M * ldx, 40 + s, -1, 1);
        float *W = fixture_rand(N * K, 50 + s, -1, 1);
        float *dx = fixture_rand(M * lddx, 60 + s, -1, 1), *dW = fixture_rand(N * K, 70 + s, -1, 1);
        float *dx_want = fixture_copy(dx, M * lddx), *dW_want = fixture_copy(dW, N * K);
        for (size_t m = 0; m < M; m++)
            for (size_t k = 0; k < K; k++) {
                double acc = dx[m * lddx + k];   /* dx starts non-zero: += */
                for (size_t n = 0; n < N; n++) acc += (double)dy[m * lddy + n] * W[n * K + k];
                dx_want[m * lddx + k] = (float)acc;
            }
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < K; k++) {
                double acc = dW[n * K + k];
                for (size_t m = 0; m < M; m++) acc += (double)dy[m * lddy + n] * x[m * ldx + k];
                dW_want[n * K + k] = (float)acc;
            }
        gemm_dx_acc(dx, lddx, dy, lddy, W, M, N, K);
        gemm_dw_acc(dW, dy, lddy, x, ldx, M, N, K);
        /* float sums of at most 70 products of terms in [-1, 1] plus an O(1)
         * start value: rounding error of order sqrt(70) * 6e-8 * 10 ~ 5e-6;
         * 2e-5 absolute still catches any missing or extra term (>= 1e-3
         * with these inputs).  The padding of dx (columns K, K+1) is
         * compared too and must be untouched. */
        char what[64];
        snprintf(what, sizeof what, "dx += dy W, M=%zu N=%zu K=%zu", M, N, K);
        EXPECT_CLOSE(dx, dx_want, M * lddx, 2e-5, 1e-5, what);
        snprintf(what, sizeof what, "dW += dy^T x, M=%zu N=%zu K=%zu", M, N, K);
        EXPECT_CLOSE(dW, dW_want, N * K, 2e-5, 1e-5, what);
        td_free(dy);
        td_free(x);
        td_free(W);
        td_free(dx);
        td_free(dW);
        td_free(dx_want);
        td_free(dW_want);
    }
    EXPECT_NO_LEAKS();
}

/* dx (M, lddx) += dy (M, lddy) W (N, K) and dW (N, K) += dy^T x (M, ldx) in
 * double, with the scale of each result: |start value| + sum |terms|.  The
 * float kernels sum in blocks of up to a few hundred terms; their rounding
 * error stays far below 1e-5 of that scale, while a missing or doubled term
 * (about 1 / R of it with these inputs, R <= 1300) is far above. */
static void ref_dx_dw(double *dx, double *sx, double *dW, double *sw, const float *dx0, const float *dW0,
                      const float *dy, size_t lddy, const float *x, size_t ldx, const float *W,
                      size_t M, size_t N, size_t K, size_t lddx)
{
    for (size_t m = 0; m < M; m++)
        for (size_t k = 0; k < K; k++) {
            double acc = dx0[m * lddx + k], mag = fabs(acc);
            for (size_t n = 0; n < N; n++) {
                double t = (double)dy[m * lddy + n] * W[n * K + k];
                acc += t;
                mag += fabs(t);
            }
            dx[m * lddx + k] = acc;
            sx[m * lddx + k] = mag;
        }
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++) {
            double acc = dW0[n * K + k], mag = fabs(acc);
            for (size_t m = 0; m < M; m++) {
                double t = (double)dy[m * lddy + n] * x[m * ldx + k];
                acc += t;
                mag += fabs(t);
            }
            dW[n * K + k] = acc;
            sw[n * K + k] = mag;
        }
}

/* Worst |got - want| / (tol * scale) over n (scale 0 where the reference
 * leaves the start value alone: padding must be bit-identical); NaN or Inf
 * gives +inf.  Writes the worst index. */
static double scaled_err(const float *got, const double *want, const double *scale, size_t n,
                         double tol, size_t *worst)
{
    double e = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double r;
        if (!isfinite(got[i])) r = INFINITY;
        else if (scale[i] < 0) r = (double)got[i] == want[i] ? 0 : INFINITY;
        else r = fabs((double)got[i] - want[i]) / (tol * scale[i] + 1e-30);
        if (r > e) {
            e = r;
            *worst = i;
        }
    }
    return e;
}

typedef struct {
    size_t M, N, K, lddx, lddy, ldx;
    float *dy, *x, *W, *dx0, *dW0;
} BwCase;

/* Inputs in [-1, 1), start values in [-1, 1) (the products must add). */
static BwCase bw_case(size_t M, size_t N, size_t K, size_t pad, uint64_t seed)
{
    BwCase c = { M, N, K, K + pad, N + 2 * pad, K + pad + 1, NULL, NULL, NULL, NULL, NULL };
    c.dy = fixture_rand(M * c.lddy, seed, -1, 1);
    c.x = fixture_rand(M * c.ldx, seed + 1, -1, 1);
    c.W = fixture_rand(N * K, seed + 2, -1, 1);
    c.dx0 = fixture_rand(M * c.lddx, seed + 3, -1, 1);
    c.dW0 = fixture_rand(N * K, seed + 4, -1, 1);
    return c;
}

static void bw_case_free(BwCase *c)
{
    td_free(c->dy);
    td_free(c->x);
    td_free(c->W);
    td_free(c->dx0);
    td_free(c->dW0);
}

/* Runs both products on copies of the start values. */
static void bw_run_case(const BwCase *c, float **dx, float **dW)
{
    *dx = fixture_copy(c->dx0, c->M * c->lddx);
    *dW = fixture_copy(c->dW0, c->N * c->K);
    gemm_dx_acc(*dx, c->lddx, c->dy, c->lddy, c->W, c->M, c->N, c->K);
    gemm_dw_acc(*dW, c->dy, c->lddy, c->x, c->ldx, c->M, c->N, c->K);
}

Test(gemm, dx_dw_against_double_reference_over_many_shapes)
{
    /* Chosen to reach every path of gemm.c's blocked kernels: M, N, K of 0
     * and 1; partial 12-row tiles and 32-column panels; several reduction
     * blocks (N or M > 512, with a short last block); several B blocks
     * (few rows of C, more than 4 panels); B and dy^T read in place
     * (row stride <= 200, one tile of C) or packed; the router (N = 8).
     * Row strides are wider than the rows (pad 0 and 3): the padding
     * must come back untouched. */
    static const size_t shapes[][3] = {
        { 0, 5, 7 }, { 4, 0, 6 }, { 3, 5, 0 }, { 1, 1, 1 }, { 1, 300, 333 }, { 2, 1000, 40 },
        { 3, 7, 600 }, { 5, 33, 257 }, { 12, 64, 17 }, { 13, 8, 192 }, { 13, 257, 300 },
        { 37, 70, 65 }, { 100, 1, 300 }, { 100, 300, 1 }, { 257, 130, 333 }, { 600, 8, 192 },
        { 700, 96, 333 }, { 1300, 40, 300 }, { 1300, 257, 66 }, { 97, 1100, 45 }, { 50, 1100, 333 },
        { 1200, 64, 64 }, { 40, 600, 1030 },
    };
    size_t n_fail = 0, n_cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t pad = 0; pad <= 3; pad += 3) {
            const size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            BwCase c = bw_case(M, N, K, pad, 1000 + 10 * s + pad);
            const size_t nx = M * c.lddx, nw = N * K;
            double *wx = td_malloc((nx + 1) * sizeof(double)), *sx = td_malloc((nx + 1) * sizeof(double));
            double *ww = td_malloc((nw + 1) * sizeof(double)), *sw = td_malloc((nw + 1) * sizeof(double));
            for (size_t i = 0; i < nx; i++) sx[i] = -1;   /* padding: untouched */
            ref_dx_dw(wx, sx, ww, sw, c.dx0, c.dW0, c.dy, c.lddy, c.x, c.ldx, c.W, M, N, K, c.lddx);
            for (size_t i = 0; i < nx; i++)
                if (sx[i] < 0) wx[i] = c.dx0[i];
            float *dx, *dW;
            bw_run_case(&c, &dx, &dW);
            size_t wi, wj;
            double ex = scaled_err(dx, wx, sx, nx, 1e-5, &wi), ew = scaled_err(dW, ww, sw, nw, 1e-5, &wj);
            n_cases++;
            if (!(ex <= 1 && ew <= 1)) {
                n_fail++;
                cr_expect(ex <= 1, "dx += dy W, M=%zu N=%zu K=%zu pad %zu: element (%zu, %zu) is %.9g, "
                          "double gives %.9g (%.3g of the tolerance)", M, N, K, pad, wi / td_max(c.lddx, 1),
                          wi % td_max(c.lddx, 1), nx ? (double)dx[wi] : 0.0, nx ? wx[wi] : 0.0, ex);
                cr_expect(ew <= 1, "dW += dy^T x, M=%zu N=%zu K=%zu pad %zu: element (%zu, %zu) is %.9g, "
                          "double gives %.9g (%.3g of the tolerance)", M, N, K, pad, wj / td_max(K, 1),
                          wj % td_max(K, 1), nw ? (double)dW[wj] : 0.0, nw ? ww[wj] : 0.0, ew);
            }
            td_free(dx);
            td_free(dW);
            td_free(wx);
            td_free(sx);
            td_free(ww);
            td_free(sw);
            bw_case_free(&c);
        }
    cr_expect_eq(n_fail, 0, "%zu of %zu cases outside 1e-5 of the double reference", n_fail, n_cases);
    EXPECT_NO_LEAKS();
}

Test(gemm, dx_dw_deterministic_and_independent_of_threads)
{
    /* Both splits over 2 threads for both products: with 3 row tiles of C
     * and 4 panels the pool splits panels, with 22 tiles and 11 panels it
     * splits rows (core/ops/gemm.c, bw_product).  On the AVX-512 path every
     * element is computed the same way whatever the split, so the results
     * are bit-identical to 1 thread; the portable path (BLAS on slices)
     * only promises closeness. */
    static const size_t shapes[][3] = {
        { 30, 300, 100 },    /* dx: 3 tiles x 4 panels; dW: 25 tiles x 4 panels */
        { 257, 30, 333 },    /* dx: 22 tiles x 11 panels; dW: 3 tiles x 11 panels */
        { 1300, 257, 66 },   /* several reduction blocks for dW */
        { 40, 600, 1030 },   /* several reduction blocks for dx */
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        BwCase c = bw_case(M, N, K, 3, 2000 + 10 * s);
        float *dx1, *dW1, *dx1b, *dW1b, *dx2, *dW2;
        pool_init(1);
        bw_run_case(&c, &dx1, &dW1);
        bw_run_case(&c, &dx1b, &dW1b);
        pool_init(2);
        bw_run_case(&c, &dx2, &dW2);
        pool_init(1);
        char what[96];
        snprintf(what, sizeof what, "dx, M=%zu N=%zu K=%zu, two runs on 1 thread", M, N, K);
        EXPECT_BITWISE(dx1b, dx1, M * c.lddx, what);
        snprintf(what, sizeof what, "dW, M=%zu N=%zu K=%zu, two runs on 1 thread", M, N, K);
        EXPECT_BITWISE(dW1b, dW1, N * K, what);
#ifdef __AVX512F__
        snprintf(what, sizeof what, "dx, M=%zu N=%zu K=%zu, 2 threads vs 1", M, N, K);
        EXPECT_BITWISE(dx2, dx1, M * c.lddx, what);
        snprintf(what, sizeof what, "dW, M=%zu N=%zu K=%zu, 2 threads vs 1", M, N, K);
        EXPECT_BITWISE(dW2, dW1, N * K, what);
#else
        /* BLAS slices may use other edge kernels: a few ulps of O(10) sums */
        snprintf(what, sizeof what, "dx, M=%zu N=%zu K=%zu, 2 threads vs 1", M, N, K);
        EXPECT_CLOSE(dx2, dx1, M * c.lddx, 1e-4, 1e-5, what);
        snprintf(what, sizeof what, "dW, M=%zu N=%zu K=%zu, 2 threads vs 1", M, N, K);
        EXPECT_CLOSE(dW2, dW1, N * K, 1e-4, 1e-5, what);
#endif
        td_free(dx1);
        td_free(dW1);
        td_free(dx1b);
        td_free(dW1b);
        td_free(dx2);
        td_free(dW2);
        bw_case_free(&c);
    }
    EXPECT_NO_LEAKS();
}

Test(gemm, dx_row_is_independent_of_batch)
{
    /* Not promised by gemm.h for the backward, but a consequence of fixed
     * block boundaries on the AVX-512 path: a row of dx computed alone or
     * in a sub-batch keeps its bits.  Checked so that a change which breaks
     * it is noticed (and the header updated). */
#ifdef __AVX512F__
    const size_t M = 200, N = 600, K = 70;
    BwCase c = bw_case(M, N, K, 0, 3000);
    float *full = fixture_copy(c.dx0, M * K), *part = fixture_copy(c.dx0, M * K);
    gemm_dx_acc(full, K, c.dy, N, c.W, M, N, K);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows = td_min(1 + m0 % 17, M - m0);   /* batches of 1 .. 17 rows */
        gemm_dx_acc(part + m0 * K, K, c.dy + m0 * N, N, c.W, rows, N, K);
        m0 += rows;
    }
    EXPECT_BITWISE(part, full, M * K, "dx rows in sub-batches of 1..17 vs one batch of 200");
    td_free(full);
    td_free(part);
    bw_case_free(&c);
#endif
    EXPECT_NO_LEAKS();
}

Test(gemm, dx_dw_portable_path_close_to_compiled_path)
{
    /* The portable path (BLAS on pool slices) and the compiled one sum in
     * other orders: close, not bitwise. */
    static const size_t shapes[][3] = { { 1, 130, 333 }, { 13, 8, 192 }, { 257, 130, 333 }, { 600, 40, 1030 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        BwCase c = bw_case(M, N, K, 3, 4000 + 10 * s);
        float *dx, *dW;
        bw_run_case(&c, &dx, &dW);
        float *px = fixture_copy(c.dx0, M * c.lddx), *pw = fixture_copy(c.dW0, N * K);
        portable_gemm_dx_acc(px, c.lddx, c.dy, c.lddy, c.W, M, N, K);
        portable_gemm_dw_acc(pw, c.dy, c.lddy, c.x, c.ldx, M, N, K);
        /* sums of up to 1030 products in [-1, 1]: O(10) results, a few
         * ulps of difference; 1e-4 absolute is far below a wrong term */
        char what[80];
        snprintf(what, sizeof what, "dx portable vs compiled, M=%zu N=%zu K=%zu", M, N, K);
        EXPECT_CLOSE(dx, px, M * c.lddx, 1e-4, 1e-5, what);
        snprintf(what, sizeof what, "dW portable vs compiled, M=%zu N=%zu K=%zu", M, N, K);
        EXPECT_CLOSE(dW, pw, N * K, 1e-4, 1e-5, what);
        td_free(dx);
        td_free(dW);
        td_free(px);
        td_free(pw);
        bw_case_free(&c);
    }
    EXPECT_NO_LEAKS();
}

/* pool_test_hook for a region in which both threads must take a share:
 * a helper calls the hook once on seeing the region and once after each
 * claim; the caller, after its first claim, waits (at most 30 s) until
 * the helper has claimed a range too. */
static pthread_t g_main;
static _Atomic int g_helper_hooks, g_helper_timed_out;
static void both_threads_claim(void)
{
    if (!pthread_equal(pthread_self(), g_main)) {
        atomic_fetch_add(&g_helper_hooks, 1);
        return;
    }
    const double t0 = td_now();
    while (atomic_load(&g_helper_hooks) < 2)
        if (td_now() - t0 > 30) {
            atomic_store(&g_helper_timed_out, 1);
            return;
        }
}

Test(gemm, scratch_is_sized_by_the_shape_kept_released_by_exiting_threads_and_freed)
{
    /* The per-thread packing scratch of the backward products (gemm.h): a
     * thread grows it to what the shape needs, whichever rows of it the
     * pool gave that thread, keeps it for the next call, gives it back
     * when it exits; gemm_scratch_free frees it and the next call grows it
     * again.  Which thread claims which range is the pool's affair, so
     * nothing here depends on it: one thread first, then a region where
     * both threads are made to take a share. */
    const size_t M = 600, N = 600, K = 600;
    BwCase c = bw_case(M, N, K, 0, 5000);
    float *dx = fixture_copy(c.dx0, M * K), *dW = fixture_copy(c.dW0, N * K);
    pool_init(1);
    gemm_scratch_free();
    gemm_dw_acc(dW, c.dy, N, c.x, K, M, N, K);
    const size_t S = gemm_scratch_bytes();   /* what dW of 600^3 needs, all 600 rows on one thread */
    gemm_dw_acc(dW, c.dy, N, c.x, K, M, N, K);
    cr_expect_eq(gemm_scratch_bytes(), S, "a second call of the same shape keeps the scratch (%zu -> %zu bytes)",
                 S, gemm_scratch_bytes());
    pool_init(2);
    g_main = pthread_self();
    atomic_store(&g_helper_hooks, 0);
    pool_test_hook = both_threads_claim;
    gemm_dw_acc(dW, c.dy, N, c.x, K, M, N, K);   /* 8 ranges of 72 or 84 rows; both threads take some */
    pool_test_hook = NULL;
    cr_expect(!atomic_load(&g_helper_timed_out), "the helper claimed no range of dW within 30 s");
    cr_expect_eq(gemm_scratch_bytes(), 2 * S,
                 "each thread that ran a share of dW holds what the shape needs: %zu bytes, want 2 x %zu",
                 gemm_scratch_bytes(), S);
    for (int i = 0; i < 3; i++) {   /* whoever claims what: nothing grows */
        gemm_dw_acc(dW, c.dy, N, c.x, K, M, N, K);
        cr_expect_eq(gemm_scratch_bytes(), 2 * S, "call %d on 2 threads: %zu bytes, want 2 x %zu (kept)", i,
                     gemm_scratch_bytes(), S);
    }
    pool_init(1);   /* joins the helper thread */
    const size_t one = gemm_scratch_bytes();
    cr_expect_eq(one, S, "the helper's scratch is released when it exits: %zu bytes left, want %zu", one, S);
#ifdef __AVX512F__
    cr_expect_gt(S, 0, "dW of 600^3 packs its operands");
#else
    cr_expect_eq(S, 0, "the portable backward is BLAS: no scratch of ours");
#endif
    gemm_scratch_free();
    cr_expect_eq(gemm_scratch_bytes(), 0, "gemm_scratch_free releases everything");
    float *ref = fixture_copy(dx, M * K);
    gemm_dx_acc(dx, K, c.dy, N, c.W, M, N, K);   /* grows it again */
    gemm_scratch_free();
    gemm_dx_acc(ref, K, c.dy, N, c.W, M, N, K);
    EXPECT_BITWISE(ref, dx, M * K, "dx after gemm_scratch_free vs before");
    gemm_scratch_free();
    td_free(dx);
    td_free(dW);
    td_free(ref);
    bw_case_free(&c);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ linear vs PyTorch */

static const char *const LIN = "linear.h5";

typedef struct {
    size_t M, N, K;
    float *x, *W, *dy, *y, *dx, *dW;
} LinCase;

static LinCase lin_load(int c)
{
    LinCase L;
    char name[32];
    size_t n;
#define LOAD(field) (snprintf(name, sizeof name, "c%d/" #field, c), fixture_f32(LIN, name, &n))
    snprintf(name, sizeof name, "c%d/dims", c);
    int32_t *dims = fixture_i32(LIN, name, &n);
    L.M = (size_t)dims[0];
    L.N = (size_t)dims[1];
    L.K = (size_t)dims[2];
    td_free(dims);
    L.x = LOAD(x);
    L.W = LOAD(W);
    L.dy = LOAD(dy);
    L.y = LOAD(y);
    L.dx = LOAD(dx);
    L.dW = LOAD(dW);
#undef LOAD
    return L;
}

static void lin_free(LinCase *L)
{
    td_free(L->x);
    td_free(L->W);
    td_free(L->dy);
    td_free(L->y);
    td_free(L->dx);
    td_free(L->dW);
}

Test(linear, forward_matches_torch)
{
    int n_cases = (int)fixture_attr(LIN, "n_cases");
    cr_expect_geq(n_cases, 4, "linear.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        LinCase L = lin_load(c);
        GemmW P = packed(L.W, L.N, L.K);
        float *y = td_malloc(L.M * L.N * sizeof(float));
        linear_forward(y, L.x, &P, L.M);
        /* float fma chain over K <= 65 products of terms in [-1, 1] against a
         * float64 reference: error ~ sqrt(K) * 6e-8 * |partial sums| < 1e-6;
         * 1e-5 leaves margin and is far below any indexing mistake. */
        char what[48];
        snprintf(what, sizeof what, "linear y, case %d", c);
        EXPECT_CLOSE(y, L.y, L.M * L.N, 1e-5, 1e-5, what);
        wfree(P);
        td_free(y);
        lin_free(&L);
    }
    EXPECT_NO_LEAKS();
}

Test(linear, backward_accumulates_torch_gradients)
{
    int n_cases = (int)fixture_attr(LIN, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        LinCase L = lin_load(c);
        const size_t M = L.M, N = L.N, K = L.K;
        /* gradients start non-zero: the op must add, not overwrite */
        float *dx = fixture_rand(M * K, 80 + (uint64_t)c, -1, 1), *dW = fixture_rand(N * K, 90 + (uint64_t)c, -1, 1);
        float *dx_want = td_malloc(M * K * sizeof(float)), *dW_want = td_malloc(N * K * sizeof(float));
        for (size_t i = 0; i < M * K; i++) dx_want[i] = (float)((double)dx[i] + L.dx[i]);
        for (size_t i = 0; i < N * K; i++) dW_want[i] = (float)((double)dW[i] + L.dW[i]);
        linear_backward(dx, dW, L.dy, L.x, L.W, M, N, K);
        /* float sums of <= 70 (dx) / 37 (dW) products in [-1, 1] plus the
         * O(1) start value: ~1e-6 expected, 1e-5 allowed. */
        char what[48];
        snprintf(what, sizeof what, "linear dx, case %d", c);
        EXPECT_CLOSE(dx, dx_want, M * K, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "linear dW, case %d", c);
        EXPECT_CLOSE(dW, dW_want, N * K, 1e-5, 1e-5, what);
        td_free(dx);
        td_free(dW);
        td_free(dx_want);
        td_free(dW_want);
        lin_free(&L);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ linear vs finite differences */

typedef struct { const double *dy; size_t M, N, K; } LinFd;

/* L(x, W) = sum_mn dy[m,n] (x W^T)[m,n] in double; p = [x (M*K), W (N*K)] */
static double lin_loss(const double *p, void *vctx)
{
    const LinFd *c = vctx;
    const double *x = p, *W = p + c->M * c->K;
    double L = 0;
    for (size_t m = 0; m < c->M; m++)
        for (size_t n = 0; n < c->N; n++) {
            double y = 0;
            for (size_t k = 0; k < c->K; k++) y += x[m * c->K + k] * W[n * c->K + k];
            L += c->dy[m * c->N + n] * y;
        }
    return L;
}

Test(linear, backward_matches_finite_differences)
{
    static const size_t shapes[][3] = { { 5, 7, 3 }, { 13, 33, 17 }, { 1, 40, 9 }, { 4, 1, 6 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], np = (M + N) * K;
        float *x = fixture_rand(M * K, 100 + s, -1, 1), *W = fixture_rand(N * K, 110 + s, -1, 1);
        float *dy = fixture_rand(M * N, 120 + s, -1, 1);
        float *dx = fixture_rand(M * K, 130 + s, -1, 1), *dW = fixture_rand(N * K, 140 + s, -1, 1);
        double *p = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        double *dyd = td_malloc(M * N * sizeof(double));
        for (size_t i = 0; i < M * K; i++) p[i] = x[i];
        for (size_t i = 0; i < N * K; i++) p[M * K + i] = W[i];
        for (size_t i = 0; i < M * N; i++) dyd[i] = dy[i];
        LinFd ctx = { dyd, M, N, K };
        fixture_fd(g, lin_loss, &ctx, p, np, 1e-5);
        float *want = td_malloc(np * sizeof(float));
        for (size_t i = 0; i < M * K; i++) want[i] = (float)(dx[i] + g[i]);
        for (size_t i = 0; i < N * K; i++) want[M * K + i] = (float)(dW[i] + g[M * K + i]);
        linear_backward(dx, dW, dy, x, W, M, N, K);
        /* L is bilinear, so central differences are exact up to double
         * rounding (~1e-10); the float backward is good to ~1e-6 here. */
        char what[64];
        snprintf(what, sizeof what, "dx vs FD, M=%zu N=%zu K=%zu", M, N, K);
        EXPECT_CLOSE(dx, want, M * K, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "dW vs FD, M=%zu N=%zu K=%zu", M, N, K);
        EXPECT_CLOSE(dW, want + M * K, N * K, 1e-5, 1e-5, what);
        td_free(x);
        td_free(W);
        td_free(dy);
        td_free(dx);
        td_free(dW);
        td_free(p);
        td_free(g);
        td_free(dyd);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

Test(linear, backward_null_gradient_is_skipped)
{
    LinCase L = lin_load(1);
    const size_t M = L.M, N = L.N, K = L.K;
    float *dx = td_calloc(M * K * sizeof(float)), *dW = td_calloc(N * K * sizeof(float));
    float *dx2 = td_calloc(M * K * sizeof(float)), *dW2 = td_calloc(N * K * sizeof(float));
    linear_backward(dx, dW, L.dy, L.x, L.W, M, N, K);
    linear_backward(dx2, NULL, L.dy, L.x, L.W, M, N, K);
    linear_backward(NULL, dW2, L.dy, L.x, L.W, M, N, K);
    EXPECT_BITWISE(dx2, dx, M * K, "dx computed alone (dW = NULL)");
    EXPECT_BITWISE(dW2, dW, N * K, "dW computed alone (dx = NULL)");
    td_free(dx);
    td_free(dW);
    td_free(dx2);
    td_free(dW2);
    lin_free(&L);
    EXPECT_NO_LEAKS();
}

Test(linear, two_threads_forward_bitwise_backward_close)
{
    LinCase L = lin_load(3);   /* M=37, N=70, K=65: both products split over 2 threads */
    const size_t M = L.M, N = L.N, K = L.K;
    GemmW P = packed(L.W, N, K);
    float *y1 = td_malloc(M * N * sizeof(float)), *y2 = td_malloc(M * N * sizeof(float));
    float *dx1 = fixture_rand(M * K, 150, -1, 1), *dW1 = fixture_rand(N * K, 151, -1, 1);
    float *dx2 = fixture_copy(dx1, M * K), *dW2 = fixture_copy(dW1, N * K);
    linear_forward(y1, L.x, &P, L.M);
    linear_backward(dx1, dW1, L.dy, L.x, L.W, M, N, K);
    pool_init(2);
    linear_forward(y2, L.x, &P, L.M);
    linear_backward(dx2, dW2, L.dy, L.x, L.W, M, N, K);
    pool_init(1);
    EXPECT_BITWISE(y2, y1, M * N, "forward, 2 threads vs 1");
    /* Bitwise on the AVX-512 path (dx_dw_deterministic_and_independent_of_threads); BLAS on thread
     * slices (portable path) may pick other edge kernels: a few ulps of the
     * O(10) results, nowhere near a missing slice (O(1)). */
    EXPECT_CLOSE(dx2, dx1, M * K, 1e-5, 1e-6, "dx, 2 threads vs 1");
    EXPECT_CLOSE(dW2, dW1, N * K, 1e-5, 1e-6, "dW, 2 threads vs 1");
    wfree(P);
    td_free(y1);
    td_free(y2);
    td_free(dx1);
    td_free(dW1);
    td_free(dx2);
    td_free(dW2);
    lin_free(&L);
    EXPECT_NO_LEAKS();
}

/* The grouped GEMM (q/k/v together, gate and up of every expert together)
 * gives the bits of separate gemm_xwt calls: decode-sized, prefill-sized
 * and training-sized problems, empty ones, 1 and 2 threads. */
Test(gemm, group_equals_separate_calls)
{
    /* every dtype in one group too (problem i in dtype i mod 3) */
    static const size_t shapes[][3] = { { 1, 256, 128 }, { 3, 100, 64 }, { 0, 64, 64 }, { 7, 33, 70 },
                                        { 50, 130, 96 }, { 300, 64, 128 }, { 2, 512, 256 }, { 1, 96, 45 },
                                        { 5, 40, 33 } };
    enum { NS = sizeof shapes / sizeof *shapes };
    for (int th = 1; th <= 2; th++) {
        pool_init(th);
        GemmProblem g[NS];
        float *want[NS], *W[NS], *x[NS];
        for (int i = 0; i < NS; i++) {
            const size_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
            x[i] = fixture_rand(M * K + 1, 100 + i, -1, 1);
            W[i] = fixture_rand(N * K, 200 + i, -1, 1);
            GemmW P = packed_as((Dtype)(i % 3), W[i], N, K);
            want[i] = td_calloc((M * N + 1) * sizeof(float));
            gemm_xwt(want[i], N, x[i], K, &P, M);
            g[i] = (GemmProblem){ td_calloc((M * N + 1) * sizeof(float)), N, x[i], K, P, M };
        }
        gemm_xwt_group(g, NS);
        for (int i = 0; i < NS; i++) {
            const size_t n = shapes[i][0] * shapes[i][1];
            cr_expect(n == 0 || memcmp(g[i].y, want[i], n * sizeof(float)) == 0,
                      "threads %d, problem %d (%zu x %zu x %zu, %s): grouped result differs", th, i,
                      shapes[i][0], shapes[i][1], shapes[i][2], dtype_name((Dtype)(i % 3)));
            td_free(g[i].y);
            wfree(g[i].W);
            td_free(want[i]);
            td_free(W[i]);
            td_free(x[i]);
        }
        pool_free();
    }
    EXPECT_NO_LEAKS();
}
/* Hundreds of experts with a few rows each (Qwen3-MoE's 128 experts x gate
 * and up, 512 experts): far more work units than problems ever had, one
 * region, still the bits of separate calls, 1 and 2 threads. */
Test(gemm, group_of_many_small_problems_equals_separate_calls)
{
    enum { NP = 1024 };
    const size_t N = 384, K = 64;
    float *W = fixture_rand(N * K, 300, -1, 1);
    size_t off[NP + 1];
    off[0] = 0;
    for (int i = 0; i < NP; i++) off[i + 1] = off[i] + (size_t)(rng_uniform_at(301, (uint64_t)i) * 20);  /* 0..19 rows */
    const size_t R = off[NP];
    float *x = fixture_rand(R * K + 1, 302, -1, 1), *want = td_calloc((R * N + 1) * sizeof(float));
    GemmProblem *g = td_malloc(NP * sizeof(GemmProblem));
    for (int t = 0; t < 3; t += 2) {   /* f32 and int8 experts */
        GemmW P = packed_as((Dtype)t, W, N, K);
        for (int i = 0; i < NP; i++) gemm_xwt(want + off[i] * N, N, x + off[i] * K, K, &P, off[i + 1] - off[i]);
        for (int th = 1; th <= 2; th++) {
            pool_init(th);
            float *y = td_calloc((R * N + 1) * sizeof(float));
            for (int i = 0; i < NP; i++) g[i] = (GemmProblem){ y + off[i] * N, N, x + off[i] * K, K, P, off[i + 1] - off[i] };
            gemm_xwt_group(g, NP);
            char what[64];
            snprintf(what, sizeof what, "1024 %s problems, %d thread(s)", dtype_name((Dtype)t), th);
            EXPECT_BITWISE(y, want, R * N, what);
            td_free(y);
        }
        pool_init(1);
        wfree(P);
    }
    td_free(g);
    td_free(W);
    td_free(x);
    td_free(want);
    EXPECT_NO_LEAKS();
}
/* The grouped backward (every expert's dx and dW in one region) gives the
 * bits of separate gemm_dx_acc / gemm_dw_acc calls, accumulating into
 * non-zero gradients: 300 problems of 0..40 rows, with row strides wider
 * than the products, 1 and 2 threads. */
Test(gemm, bw_group_equals_separate_calls)
{
    enum { NP = 300 };
    const size_t N = 48, K = 40, ld = 52;   /* dy, x and dx rows padded to ld */
    size_t off[NP + 1];
    off[0] = 0;
    for (int i = 0; i < NP; i++) off[i + 1] = off[i] + (size_t)(rng_uniform_at(401, (uint64_t)i) * 41);
    const size_t R = off[NP];
    float *dy = fixture_rand(R * ld + 1, 402, -1, 1), *x = fixture_rand(R * ld + 1, 403, -1, 1);
    float *W = fixture_rand(N * K, 404, -1, 1);
    float *dx0 = fixture_rand(R * ld + 1, 405, -1, 1), *dW0 = fixture_rand(NP * N * K, 406, -1, 1);
    float *dx_want = fixture_copy(dx0, R * ld + 1), *dW_want = fixture_copy(dW0, NP * N * K);
    for (int i = 0; i < NP; i++) {
        const size_t M = off[i + 1] - off[i];
        gemm_dx_acc(dx_want + off[i] * ld, ld, dy + off[i] * ld, ld, W, M, N, K);
        gemm_dw_acc(dW_want + (size_t)i * N * K, dy + off[i] * ld, ld, x + off[i] * ld, ld, M, N, K);
    }
    GemmBwProblem *g = td_malloc(2 * NP * sizeof(GemmBwProblem));
    for (int th = 1; th <= 2; th++) {
        pool_init(th);
        float *dx = fixture_copy(dx0, R * ld + 1), *dW = fixture_copy(dW0, NP * N * K);
        for (int i = 0; i < NP; i++) {
            const size_t M = off[i + 1] - off[i];
            g[2 * i] = (GemmBwProblem){ 0, dx + off[i] * ld, ld, dy + off[i] * ld, ld, W, K, M, N, K };
            g[2 * i + 1] = (GemmBwProblem){ 1, dW + (size_t)i * N * K, K, dy + off[i] * ld, ld, x + off[i] * ld, ld,
                                            M, N, K };
        }
        gemm_bw_group(g, 2 * NP);
        EXPECT_BITWISE(dx, dx_want, R * ld + 1, th == 1 ? "dx, 1 thread" : "dx, 2 threads");
        EXPECT_BITWISE(dW, dW_want, NP * N * K, th == 1 ? "dW, 1 thread" : "dW, 2 threads");
        td_free(dx);
        td_free(dW);
    }
    pool_init(1);
    td_free(g);
    td_free(dy);
    td_free(x);
    td_free(W);
    td_free(dx0);
    td_free(dW0);
    td_free(dx_want);
    td_free(dW_want);
    EXPECT_NO_LEAKS();
}

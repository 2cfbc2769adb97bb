/* core/ops/gemm_q8.h - the int8 forward product (internal to core/ops/gemm.c).
 *
 * y = x W^T with W int8 (one scale per group of 32 weights along K, a
 * bfloat16 value: core/dtype.h)
 * and x rounded per row, on the fly, to integers of 14 bits in the same
 * groups (int8 weights x 14-bit activations): every group's dot product is
 * an exact integer sum, and only the combination of the groups is floating
 * point.  For row m, column n and the G = ceil(K / 32) groups g of K (the
 * last one K mod 32 long when K is not a multiple of 32):
 *
 *   x rounded:    a = max |x[m][k]| over g (NaN if any is NaN);  sx = a / QX;
 *                 qx[k] = rne(x[m][k] / sx) clamped to [-QX, QX] when sx is
 *                 finite and > 0, else 0 (zeros, an underflow, inf, NaN: sx
 *                 itself is kept, so a non-finite x gives a NaN y)
 *   group sum:    isum = sum over k in g of qx[k] * qw[n][k]      (int32, exact)
 *   output:       c = +0;  for g = 0 .. G-1:  c = fma(sx[m][g] * sw[n][g], (float)isum, c);  y[m][n] = c
 *
 * QX = 8320 = 129 * 64 + 64: qx = 129 hi + lo with hi = floor((qx + 64) /
 * 129) and lo = qx - 129 hi, both in [-64, 64], so that with AVX-512 VNNI
 * isum = 129 sum(hi qw) + sum(lo qw) is two vpdpbusd chains (64
 * multiply-adds an instruction) of the weights held unsigned (qw + 128, at
 * most 255) against the signed digits; AVX2 multiplies qx itself, as
 * 16-bit words, with the weight bytes widened (vpmaddwd).  Either way the
 * weights' + 128 comes off as 128 sum(qx) = 128 (129 sum(hi) + sum(lo)).
 * sx * sw is one rounded float32 product; |isum| <= 32 * 8320 * 127 <
 * 2^26, so no sum overflows, and (float)isum is the one
 * round-to-nearest-even conversion of that integer.  An integer sum has one value whatever the order of its terms,
 * so every path -- VNNI, AVX2 and portable C -- gives the same bits, and
 * row m of y depends on row m of x and on W only (row-invariant, as
 * gemm.h's float chains).  x's rounding is relative 2^-14 of its group's
 * largest value, 65 times finer than the weights' 2^-8: the product
 * is, to that error, the float32 product with the dequantized weights
 * (weight-only int8, what GPTQ's rounding assumes), not W8A8 as llama.cpp's
 * Q8_0 computes, whose 8-bit x costs as much accuracy as the weights'
 * rounding (docs/serving.md).
 *
 * Packed layout, per panel of 32 columns, per group g: 1024 bytes of
 * weights, byte (k4 * 32 + j) * 4 + i = qw[p*32 + j][g*32 + 4*k4 + i] + 128
 * (k4 = 0..7, i = 0..3: four consecutive k of a column in one 32-bit lane,
 * vpdpbusd's unsigned operand; k past K and columns past N hold q = 0),
 * then 32 scales sw[p*32 + j][g] as bfloat16 (widened exactly to float32
 * where the group's sum is folded; float32 scales took 12.5% on top of the
 * weights' bytes, these 6.25%): Q8_BLOCK = 1088 bytes a group (17 cache
 * lines), so a panel's weights and scales are one sequential stream.
 */
#ifndef TANDEM_CORE_OPS_GEMM_Q8_H
#define TANDEM_CORE_OPS_GEMM_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops/gemm.h"

#define Q8_G       DTYPE_Q8_GROUP                 /* k per group (32) */
#define Q8_WBYTES  (Q8_G * GEMM_NR)               /* weight bytes of a group of a panel */
#define Q8_BLOCK   (Q8_WBYTES + GEMM_NR * 2)      /* ... and its 32 bf16 scales */

#define Q8_QX      8320                           /* x's integer range, QX above */

/* x rounded for the int8 product, per row, in the one form this build's
 * kernel multiplies (the other pointer is NULL): the digits q (VNNI: ldq
 * bytes a row, for each group 32 bytes of hi, then 32 of lo) or qx itself
 * as q16 (AVX2, portable: ldq / 2 int16 values a row), zero past K; the
 * scales sx[m * G + g] and the sums sum[m * G + g] = sum of the group's qx
 * (= 129 sum(hi) + sum(lo)). */
typedef struct {
    const int8_t *q;
    const int16_t *q16;
    const float *s;
    const int32_t *sum;
    size_t ldq, G;
} GemmQX;

/* qx from its row m0 on. */
static inline GemmQX gemm_q8_qx_rows(const GemmQX *qx, size_t m0)
{
    return (GemmQX){ qx->q ? qx->q + m0 * qx->ldq : NULL, qx->q16 ? qx->q16 + m0 * qx->ldq / 2 : NULL,
                     qx->s + m0 * qx->G, qx->sum + m0 * qx->G, qx->ldq, qx->G };
}

/* Bytes of the rounded x of M rows of K (a multiple of 64). */
size_t gemm_q8_qx_bytes(size_t M, size_t K);
/* Rounds x [M, K] (row stride ldx) into buf (gemm_q8_qx_bytes) as *qx. */
void gemm_q8_quantize_x(GemmQX *qx, void *buf, const float *x, size_t ldx, size_t M, size_t K);
/* This thread's scratch of at least n bytes for rounded x (grown on
 * demand, kept for the next call, freed at thread exit). */
void *gemm_q8_scratch(size_t n);
size_t gemm_q8_scratch_bytes(void);
void gemm_q8_scratch_free(void);

/* Rows [0, M) x panels [p0, p1) of the int8 W: y = qx W^T as above. */
void gemm_q8_drive(float *y, size_t ldy, const GemmQX *qx, const GemmW *W, size_t M, size_t p0, size_t p1);

/* Packs one panel (32 columns from row n0 of W) : from float32 rows (W,
 * quantized here) or from pre-quantized Q [N, K] and S [N, G]. */
void gemm_q8_pack_panel(void *pan, const float *W, const int8_t *Q, const float *S, size_t n0, size_t N, size_t K);
/* dst (K) = row n of the int8 W dequantized, (float)q * s. */
void gemm_q8_unpack_row(float *dst, const GemmW *W, size_t n);

#endif

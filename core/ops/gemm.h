/* core/ops/gemm.h - matrix products for the linear layers.
 *
 * Forward: tandem's own kernel, y = x W^T with W in nn.Linear layout [N, K],
 * computed from a packed copy of W.  Every output element is one fixed chain
 * of fused multiply-adds,
 *
 *     c = 0;  for k = 0 .. K-1:  c = fma(x[m][k], W[n][k], c);  y[m][n] = c
 *
 * so row m of y depends on row m of x and on W only: it is bit-identical
 * whatever M is, however the rows are tiled or split over threads, and
 * whichever of the AVX-512, AVX2 or portable paths was compiled.  That is what makes
 * a token's logits the same in a training batch of 2048 rows, a prefill
 * chunk and a single-row decode step (SPEC section 8).  OpenBLAS does not
 * promise this (its M=1 and edge-tile paths round differently).
 *
 * Weights in 16 and 8 bits (SPEC section 11).  W may be held as float32,
 * bfloat16 or int8 with one scale (a bfloat16 value) per group of 32
 * weights along K (core/dtype.h).  bf16: the kernel widens each weight to the float32 it
 * stands for in registers (the 16 bits shifted up, exact) and runs the
 * chain above unchanged, so a bf16 product is bit for bit the float32
 * product with the rounded weights, on every path.  int8 (core/ops/gemm_q8.h):
 * x is rounded per row in groups of 32 to integers of 14 bits (amax /
 * 8320 the step), each group's dot product is an exact integer sum and
 * the groups are combined by c = fma(sx * sw, (float)isum, c) in order:
 * row invariance, determinism and the same bits on every path hold; the
 * result is the float32 product with the dequantized weights to within
 * x's rounding (2^-14 of a group's largest value), not its bits.  No
 * native bf16 dot products are used (they would reassociate the sum and
 * round x).
 *
 * Packed layouts (GEMM_NR = 32 columns per panel, np = ceil(N / 32) panels,
 * G = ceil(K / 32) groups, rows past N zero):
 *     f32   P[p][k][j] = W[p*32 + j][k]                  float
 *     bf16  P[p][k][s(j)] = bf16(W[p*32 + j][k])          uint16, s(j) = 8 (j/4) + j%4 for j < 16,
 *           8 ((j-16)/4) + 4 + j%4 above: unpacking a row's words with zeros (per 128-bit lane)
 *           is then the widening, columns 0-15 and 16-31 in order
 *     int8  per panel, per group g: 1024 bytes of q + 128, four consecutive k of
 *           a column in 32 bits, then the group's 32 bf16 scales (gemm_q8.h)
 * A panel row (one k) is the 32 weights one broadcast of x[m][k] meets.  Every packed matrix takes
 * gemm_packed_bytes, a multiple of 64, so that matrices packed one after
 * the other (experts) stay aligned.
 *
 * Backward (gemm_dx_acc, gemm_dw_acc): with AVX-512, the same micro-kernel
 * in a blocked driver that packs slices of its operands itself (no
 * pre-packed input).  The reduction runs in blocks of 512 terms with fixed
 * boundaries; each block's sum is one FMA chain from 0, added to the
 * output, blocks in order:
 *
 *     for each block b:  s = 0;  for r in b:  s = fma(a_r, b_r, s);  out = out + s
 *
 * so the results are deterministic and identical for any thread count (and
 * a row of dx does not depend on the other rows of the call), though not
 * equal to one chain over the whole reduction.  Other builds (AVX2, where
 * OpenBLAS's own kernels already run at the FMA units' peak, and portable)
 * call cblas_sgemm, single-threaded, on disjoint slices from the pool:
 * deterministic for a given thread count only.
 */
#ifndef TANDEM_CORE_OPS_GEMM_H
#define TANDEM_CORE_OPS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define GEMM_NR 32

/* A packed weight matrix W [N, K]: a borrowed view of its panels (int8:
 * with their group scales inside).  Made by gemm_w from the start of a
 * packed matrix; a GEMM dispatches on dtype once per call. */
typedef struct {
    Dtype dtype;
    const void *p;        /* panels: float, uint16_t (bf16) or int8 group blocks */
    size_t N, K;
} GemmW;

/* Bytes of an [N, K] matrix packed as t (a multiple of 64). */
size_t gemm_packed_bytes(Dtype t, size_t N, size_t K);
/* The views of the matrix packed as t at base. */
GemmW gemm_w(Dtype t, const void *base, size_t N, size_t K);
/* The view of columns [n0, n0 + n) of W (rows n0 .. of the nn.Linear
 * weight): n0 a multiple of GEMM_NR, and n too unless the view ends at N.
 * Its products are the columns of W's, bit for bit. */
GemmW gemm_w_cols(const GemmW *W, size_t n0, size_t n);

/* Packs W [N, K] (row stride K, float32) into P (gemm_packed_bytes(t, N, K)
 * bytes, overwritten) as t: bf16 rounds to nearest even, int8 quantizes
 * each row in groups of 32 (core/dtype.h: dtype_q8_quantize_row), so the
 * packed values are those of `tandem ckpt quantize`.  Threaded over panels. */
void gemm_pack(void *P, Dtype t, const float *W, size_t N, size_t K);
/* Packs pre-quantized int8 weights: Q [N, K] and their scales S [N, G]
 * (row-major, as a quantized checkpoint stores them; each a bfloat16
 * value, as ckpt_q8_check_values makes sure, else rounded to one) into P
 * as int8.  Threaded over panels. */
void gemm_pack_q8(void *P, const int8_t *Q, const float *S, size_t N, size_t K);
/* dst (K) = row n of W as the kernel sees it (dequantized).  Serial. */
void gemm_unpack_row(float *dst, const GemmW *W, size_t n);

/* y[M, N] (row stride ldy, overwritten) = x[M, K] (row stride ldx) W^T.
 * Threaded over the pool (serial inside a pool region).  Row-invariant,
 * see the file comment. */
void gemm_xwt(float *y, size_t ldy, const float *x, size_t ldx, const GemmW *W, size_t M);

/* One forward product of a group. */
typedef struct {
    float *y;          /* (M, N), row stride ldy, overwritten */
    size_t ldy;
    const float *x;    /* (M, K), row stride ldx */
    size_t ldx;
    GemmW W;           /* N, K from here */
    size_t M;
} GemmProblem;

/* Runs n products (e.g. q, k and v of one input; or gate and up of every
 * expert) in one pool region instead of n, threads sharing the union of
 * their work by cost.  Every element is computed exactly as by gemm_xwt
 * (same bits); problems with M = 0 are skipped. */
void gemm_xwt_group(const GemmProblem *p, int n);
/* The same products on the calling thread alone (a caller that shares
 * work out itself): the same bits, x quantized once for problems that
 * share it. */
void gemm_xwt_group_serial(const GemmProblem *p, int n);

/* Unthreaded variant of gemm_xwt, for callers that split work themselves.
 * Same arithmetic. */
void gemm_xwt_serial(float *y, size_t ldy, const float *x, size_t ldx, const GemmW *W, size_t M);

/* dx[M, K] += dy[M, N] W[N, K]   (input gradient of y = x W^T).
 * Row strides lddx, lddy; W [N, K] unpacked, row stride K.  Accumulates;
 * any of M, N, K may be 0 (no-op).  Threaded over the pool, rows or column
 * panels of dx (serial inside a pool region, where helpers may call it
 * concurrently on disjoint outputs: scratch is per thread, see
 * gemm_scratch_free). */
void gemm_dx_acc(float *dx, size_t lddx, const float *dy, size_t lddy,
                 const float *W, size_t M, size_t N, size_t K);

/* dW[N, K] += dy[M, N]^T x[M, K]   (weight gradient of y = x W^T).
 * Row strides lddy, ldx; dW row stride K.  Accumulates; any of M, N, K may
 * be 0.  Threaded like gemm_dx_acc, over rows or column panels of dW. */
void gemm_dw_acc(float *dW, const float *dy, size_t lddy, const float *x, size_t ldx,
                 size_t M, size_t N, size_t K);

/* One backward product of a group, of y = x W^T with x (M, K), W (N, K):
 *   dw = 0:  out = dx (M, K), row stride ldout;  in = W, row stride ldin;  dx += dy W
 *   dw = 1:  out = dW (N, K), row stride ldout;  in = x, row stride ldin;  dW += dy^T x
 * dy (M, N), row stride lddy.  (Builds without AVX-512 need ldout = K for
 * dW and ldin = K for dx, as gemm_dw_acc / gemm_dx_acc have.) */
typedef struct {
    int dw;
    float *out;
    size_t ldout;
    const float *dy;
    size_t lddy;
    const float *in;
    size_t ldin;
    size_t M, N, K;
} GemmBwProblem;

/* Runs n backward products (every expert's dW, say) in one pool region,
 * threads sharing their pieces by cost; each element gets exactly the bits
 * gemm_dx_acc / gemm_dw_acc give it (cblas builds: those calls, one after
 * the other).  Accumulates; no two problems may write the same output
 * (put them in separate groups, in the order their sums must follow). */
void gemm_bw_group(const GemmBwProblem *p, int n);

/* Scratch of the backward products: each thread that runs them keeps one
 * buffer for packed slices of the operands (64-byte aligned, a few MiB at
 * most), grown on demand and reused by later calls.  A thread grows it to
 * what the call's shape needs (M, N, K, strides), not to the share of the
 * work it happened to claim, so a thread that has taken part in a product
 * of a shape allocates nothing in later products of that shape, and a
 * training step allocates nothing once every thread has run its shapes.
 * Which threads take part in a call is up to the pool (pool.h); a thread
 * that had no share of an earlier call may grow its buffer in a later one.
 * A thread's buffer is freed when the thread exits; gemm_scratch_free
 * frees all of them (call it with no GEMM running, e.g. at shutdown; later
 * calls grow them again).
 * The buffers are the GEMM's own, like OpenBLAS's: not counted by
 * td_malloc; gemm_scratch_bytes reports their total. */
void gemm_scratch_free(void);
size_t gemm_scratch_bytes(void);

/* Floating-point operations of the three products, for MFU accounting. */
static inline double gemm_flops(size_t M, size_t N, size_t K)
{
    return 2.0 * (double)M * (double)N * (double)K;
}

#endif

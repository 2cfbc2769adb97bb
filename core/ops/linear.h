/* core/ops/linear.h - the linear layer y = x W^T (nn.Linear without bias).
 *   x: (M, K)  W: (N, K) = [out, in]  y: (M, N)
 *
 * Forward runs tandem's row-invariant kernel on the packed copy of W, in
 * its dtype (core/ops/gemm.h: float32, bf16 or int8); backward (float32)
 * runs the same micro-kernel in a blocked driver
 * (cblas_sgemm on builds without AVX-512) on the unpacked W:
 *   dx += dy W        dW += dy^T x
 */
#ifndef TANDEM_CORE_OPS_LINEAR_H
#define TANDEM_CORE_OPS_LINEAR_H

#include <stddef.h>

#include "core/ops/gemm.h"

/* Overwrites y (M, W->N).  x: (M, W->K).  W: packed (gemm_pack). */
void linear_forward(float *y, const float *restrict x, const GemmW *W, size_t M);
/* Adds into dx (M, K) and dW (N, K); either may be NULL to skip it. */
void linear_backward(float *dx, float *dW, const float *restrict dy, const float *restrict x,
                     const float *restrict W, size_t M, size_t N, size_t K);

#endif

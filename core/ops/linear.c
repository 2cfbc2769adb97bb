/* core/ops/linear.c - linear layer forward and backward (linear.h). */
#include "core/ops/linear.h"
#include "core/ops/gemm.h"

void linear_forward(float *y, const float *restrict x, const GemmW *W, size_t M)
{
    gemm_xwt(y, W->N, x, W->K, W, M);
}

void linear_backward(float *dx, float *dW, const float *restrict dy, const float *restrict x,
                     const float *restrict W, size_t M, size_t N, size_t K)
{
    if (dx) gemm_dx_acc(dx, K, dy, N, W, M, N, K);
    if (dW) gemm_dw_acc(dW, dy, N, x, K, M, N, K);
}

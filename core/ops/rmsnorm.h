/* core/ops/rmsnorm.h - root-mean-square layer norm (Zhang & Sennrich 2019), as in
 * HF Llama/Mixtral:
 *   rstd[t] = 1 / sqrt(mean_i x[t,i]^2 + eps)
 *   y[t,i]  = x[t,i] * rstd[t] * w[i]
 */
#ifndef TANDEM_CORE_OPS_RMSNORM_H
#define TANDEM_CORE_OPS_RMSNORM_H

#include <stddef.h>

/* x, y: (N, d)  w: (d)  rstd: (N), saved for backward (may be NULL).
 * Overwrites y and rstd.  y may alias x. */
void rmsnorm_forward(float *y, float *rstd, const float *x, const float *restrict w,
                     size_t N, size_t d, float eps);
/* Adds into dx (N, d) and dw (d).  dw is reduced over tokens in order
 * t = 0..N-1 (threads split columns), so it is deterministic. */
void rmsnorm_backward(float *dx, float *dw, const float *restrict dy, const float *restrict x,
                      const float *restrict w, const float *restrict rstd, size_t N, size_t d);

#endif

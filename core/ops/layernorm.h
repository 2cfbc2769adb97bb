/* core/ops/layernorm.h - layer norm (Ba et al. 2016), as torch.nn.LayerNorm
 * (the vision encoder, docs/vision.md):
 *   mean[t] = sum_i x[t,i] / d
 *   rstd[t] = 1 / sqrt(sum_i (x[t,i] - mean[t])^2 / d + eps)
 *   y[t,i]  = (x[t,i] - mean[t]) * rstd[t] * w[i] + b[i]
 * Sums run in VEC_LANES lanes combined by core/ops/vec.h's fixed tree, so a
 * row's result is a fixed function of the row (row-invariant).
 */
#ifndef TANDEM_CORE_OPS_LAYERNORM_H
#define TANDEM_CORE_OPS_LAYERNORM_H

#include <stddef.h>

/* x, y: (N, d)  w, b: (d)  mean, rstd: (N), saved for backward (either
 * may be NULL).  Overwrites y, mean, rstd.  y may alias x. */
void layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *restrict w,
                       const float *restrict b, size_t N, size_t d, float eps);
/* With xh = (x - mean) rstd and g = dy w, adds into
 *   dx (N, d) += rstd (g - sum_i g_i / d - xh sum_i g_i xh_i / d)
 *   dw (d) += sum_t dy xh,  db (d) += sum_t dy   (tokens in order t = 0..N-1;
 * threads split columns, so deterministic).  Any of dx, dw, db may be NULL. */
void layernorm_backward(float *dx, float *dw, float *db, const float *restrict dy, const float *restrict x,
                        const float *restrict w, const float *restrict mean, const float *restrict rstd,
                        size_t N, size_t d);

#endif

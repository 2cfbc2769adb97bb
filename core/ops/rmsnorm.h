/* core/ops/rmsnorm.h - root-mean-square layer norm (Zhang & Sennrich 2019), as in
 * HF Llama/Mixtral:
 *   rstd[t] = 1 / sqrt(mean_i x[t,i]^2 + eps)
 *   y[t,i]  = x[t,i] * rstd[t] * w[i]
 *
 * The split form normalises a row whose D columns are spread over several
 * calls (OLMoE's q/k norm over the whole projection, its heads split over
 * tensor-parallel ranks): each part computes its sum of squares, the caller
 * sums the parts (an all-reduce), then each part scales its own columns
 * with the mean over all D.  Backward likewise: a per-row dot summed over
 * the parts, then the local update.  With one part (d = D) the split form
 * gives the bits of rmsnorm_forward / rmsnorm_backward.
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

/* Split form.  x (N, d) holds d of a row's D columns, w (d) their weights.
 * ss (N) overwritten: ss[t] = sum_i x[t,i]^2 over these d columns. */
void rmsnorm_sumsq(float *ss, const float *restrict x, size_t N, size_t d);
/* rstd (N) overwritten with 1 / sqrt(ss[t] / D + eps), ss summed over all
 * parts; y (N, d) = x * rstd * w.  y may alias x. */
void rmsnorm_scale_forward(float *y, float *rstd, const float *x, const float *restrict ss,
                           const float *restrict w, size_t N, size_t d, size_t D, float eps);
/* y (N, d) = x * rstd * w from a saved rstd: the forward's product, bit for
 * bit (recomputes a norm's output in backward).  y may alias x. */
void rmsnorm_apply(float *y, const float *x, const float *restrict rstd, const float *restrict w,
                   size_t N, size_t d);
/* s (N) overwritten: s[t] = sum_i dy[t,i] w[i] x[t,i] over these columns. */
void rmsnorm_dot(float *s, const float *restrict dy, const float *restrict x, const float *restrict w,
                 size_t N, size_t d);
/* With s summed over all parts: adds into dx (N, d)
 *   dx += rstd (dy w) - rstd^3 x s / D
 * and into dw (d) sum_t dy x rstd (tokens in order).  Either may be NULL. */
void rmsnorm_scale_backward(float *dx, float *dw, const float *restrict dy, const float *restrict x,
                            const float *restrict w, const float *restrict rstd, const float *restrict s,
                            size_t N, size_t d, size_t D);

#endif

/* core/ops/softmax.h - row softmax and log-softmax + cross-entropy.
 *
 * softmax:  y[t,j] = exp(x[t,j] - m_t) / sum_i exp(x[t,i] - m_t),  m_t = max_i x[t,i]
 * log-softmax + cross-entropy (fused, per token):
 *   lse_t   = m_t + log(sum_i exp(x[t,i] - m_t))
 *   logp_t  = x[t, target_t] - lse_t          (the log-probability of the target)
 * The loss of a batch is -sum_t logp_t / N; the backward takes the gradient
 * with respect to each logp_t, so the same op serves cross-entropy
 * (dlogp_t = -1/N), masked losses and RL policy gradients.
 * exp is core/ops/vexp.h's (the same bits on every kernel path), log libm's logf;
 * sums run in core/ops/vec.h's fixed order.
 */
#ifndef TANDEM_CORE_OPS_SOFTMAX_H
#define TANDEM_CORE_OPS_SOFTMAX_H

#include <stddef.h>
#include <stdint.h>

/* x, y: (N, n); overwrites y (may alias x).  lse (N) may be NULL; when
 * given it receives log(sum exp x) per row. */
void softmax_forward(float *y, float *lse, const float *x, size_t N, size_t n);
/* dx += y * (dy - sum_j dy_j y_j), row-wise. */
void softmax_backward(float *dx, const float *restrict dy, const float *restrict y, size_t N, size_t n);

/* logits: (N, V), targets: (N).  Writes logp (N) and lse (N, saved for
 * backward). */
void logsoftmax_xent_forward(float *logp, float *lse, const float *restrict logits,
                             const int32_t *restrict targets, size_t N, size_t V);
/* dlogits[t,j] += dlogp_t * (onehot(target_t)_j - softmax(logits_t)_j) */
void logsoftmax_xent_backward(float *dlogits, const float *restrict dlogp,
                              const float *restrict logits, const float *restrict lse,
                              const int32_t *restrict targets, size_t N, size_t V);

#endif

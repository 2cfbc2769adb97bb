/* core/ops/gate.h - a scalar sigmoid gate per row, and scaling rows by it
 * (Qwen2-MoE's shared_expert_gate: shared_out *= sigmoid(h . w_g)).
 *   gate:       g_t = sigmoid(h_t . w)         h (N, d), w (d) (= w_g [1, d]), g (N)
 *   row scale:  y_t = g_t s_t                  s, y (N, n)
 * h_t . w is core/ops/vec.h's fixed-order dot and sigmoid(x) = 1 / (1 +
 * exp(-x)) with core/ops/vexp.h's exp, so g_t depends on row t alone.
 * Backward:
 *   dh_t += (dg_t g_t (1 - g_t)) w,   dw += sum_t (dg_t g_t (1 - g_t)) h_t
 *   ds_t += g_t dy_t,                 dg_t += dy_t . s_t
 */
#ifndef TANDEM_CORE_OPS_GATE_H
#define TANDEM_CORE_OPS_GATE_H

#include <stddef.h>

/* g (N) overwritten. */
void sigmoid_gate_forward(float *g, const float *restrict h, const float *restrict w, size_t N, size_t d);
/* Adds into dh (N, d) and dw (d) (either may be NULL); g: the forward's.
 * dw sums tokens in order (threads split columns): deterministic. */
void sigmoid_gate_backward(float *dh, float *dw, const float *restrict dg, const float *restrict h,
                           const float *restrict w, const float *restrict g, size_t N, size_t d);

/* y (N, n) overwritten; y may alias s (in place). */
void row_scale_forward(float *y, const float *restrict g, const float *s, size_t N, size_t n);
/* Adds into ds (N, n) and dg (N) (either may be NULL).  dg_t is this
 * call's dot over its n columns: when s is split over ranks (tensor
 * parallelism), the caller sums dg over them. */
void row_scale_backward(float *ds, float *dg, const float *restrict dy, const float *restrict s,
                        const float *restrict g, size_t N, size_t n);

#endif

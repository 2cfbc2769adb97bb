/* core/ops/clamp.h - clamping to [-c, c], OLMoE's clip_qkv:
 *   y = min(max(x, -c), c)                          (torch.clamp(x, -c, c))
 *   dx = dy where -c <= x <= c, else 0              (torch.clamp's gradient:
 *                                                    the boundary passes)
 * NaN stays NaN forward and gets a zero gradient, as in torch.
 */
#ifndef TANDEM_CORE_OPS_CLAMP_H
#define TANDEM_CORE_OPS_CLAMP_H

#include <stddef.h>

/* y (n) overwritten; y may alias x (in place). */
void clamp_forward(float *y, const float *x, size_t n, float c);
/* In place on the gradient: dy (n), the gradient of the clamp's output on
 * entry, becomes that of its input x (the values before clamping): zero
 * where x < -c or x > c (or NaN). */
void clamp_backward(float *dy, const float *restrict x, size_t n, float c);

#endif

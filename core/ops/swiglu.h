/* core/ops/swiglu.h - SiLU and the SwiGLU product of the feed-forward blocks.
 *   silu(g) = g * sigmoid(g),  sigmoid(g) = 1 / (1 + exp(-g))
 *   h = silu(g) * u                g, u, h: (N, F)
 * exp is core/ops/vexp.h's (the same bits on every kernel path).
 */
#ifndef TANDEM_CORE_OPS_SWIGLU_H
#define TANDEM_CORE_OPS_SWIGLU_H

#include <stddef.h>

/* Overwrites h.  No output overlaps an input or another output (not in
 * place). */
void swiglu_forward(float *restrict h, const float *restrict g, const float *restrict u, size_t N, size_t F);
/* Adds into dg and du (N, F):
 *   du += dh * silu(g)
 *   dg += dh * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))) */
void swiglu_backward(float *restrict dg, float *restrict du, const float *restrict dh, const float *restrict g,
                     const float *restrict u, size_t N, size_t F);

/* Elementwise SiLU alone, y = silu(x) (n elements), and its backward
 * dx += dy * silu'(x). */
void silu_forward(float *restrict y, const float *restrict x, size_t n);
void silu_backward(float *restrict dx, const float *restrict dy, const float *restrict x, size_t n);

#endif

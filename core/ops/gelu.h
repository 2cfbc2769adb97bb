/* core/ops/gelu.h - GELU (Hendrycks & Gimpel 2016), the exact (erf) form of
 * torch.nn.functional.gelu and HF's "gelu" (the vision encoder's MLP and
 * the projector, docs/vision.md):
 *   gelu(x)  = x Phi(x),  Phi(x) = (1 + erf(x / sqrt 2)) / 2
 *   gelu'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 * Elementwise, with core/ops/verf.h's erff and expf (glibc 2.36's, bit for
 * bit, vectorised with AVX-512): the same bits on every kernel path, and
 * the same as when this called libm.
 */
#ifndef TANDEM_CORE_OPS_GELU_H
#define TANDEM_CORE_OPS_GELU_H

#include <stddef.h>

/* y = gelu(x), n elements.  Overwrites y; y may alias x. */
void gelu_forward(float *y, const float *x, size_t n);
/* dx += dy * gelu'(x), n elements. */
void gelu_backward(float *restrict dx, const float *restrict dy, const float *restrict x, size_t n);

#endif

/* core/ops/bias.h - the bias of a linear layer, y = x W^T + b (nn.Linear with
 * bias=True; the product itself is core/ops/linear.h).
 *   forward:   y[t, i] += b[i]              y (N, n), b (n)
 *   backward:  db[i] += sum_t dy[t, i]
 */
#ifndef TANDEM_CORE_OPS_BIAS_H
#define TANDEM_CORE_OPS_BIAS_H

#include <stddef.h>

/* Adds b to every row of y (N, n), in place.  Row-invariant (one add per
 * element). */
void bias_forward(float *y, const float *restrict b, size_t N, size_t n);
/* Adds into db (n) the column sums of dy (N, n): tokens in order
 * t = 0..N-1 for every column (threads split columns), so deterministic. */
void bias_backward(float *db, const float *restrict dy, size_t N, size_t n);

#endif

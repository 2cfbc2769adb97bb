/* core/ops/embedding.h - token embedding lookup.
 *   y[t, :] = table[ids[t], :]          y: (N, d)  table: (V, d)  ids: (N)
 */
#ifndef TANDEM_CORE_OPS_EMBEDDING_H
#define TANDEM_CORE_OPS_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops/gemm.h"

/* Overwrites y.  ids must be in [0, V); the caller validates them. */
void embedding_forward(float *y, const int32_t *restrict ids, const float *restrict table,
                       size_t N, size_t d);
/* The same lookup from a table held packed for the GEMM, in any dtype (a
 * serving model's embedding, core/ops/gemm.h): y[t, :] = row ids[t] of W
 * as the kernel sees it (dequantized), y: (N, W->K).  Overwrites y. */
void embedding_forward_packed(float *y, const int32_t *restrict ids, const GemmW *W, size_t N);
/* dtable[ids[t], :] += dy[t, :], tokens added in order t = 0..N-1 for every
 * column, so the result is deterministic; threads split the columns. */
void embedding_backward(float *dtable, const float *restrict dy, const int32_t *restrict ids,
                        size_t N, size_t d);

#endif

/* train/quant/gptq.h - GPTQ factors for `tandem ckpt quantize --gptq`
 * (docs/serving.md "GPTQ rounding").
 *
 * The float32 model runs the training forward on calibration windows; for
 * every matrix that int8 serving multiplies, the input rows it saw are
 * summed into their second moment H = sum x x^T (K x K): one per input,
 * shared by the matrices that read it (q/k/v_proj read the normed hidden
 * state, gate/up_proj the same rows), one per expert for expert tensors
 * (the rows routed to that expert).  Each H is then damped (damp times
 * the mean of its diagonal added to the diagonal; an input that was always
 * zero gets 1) and turned into the factor U of dtype_q8_quantize_row_gptq
 * (U^T U = H^-1, LAPACK's dpotrf / dpotri in double).  The factors then
 * serve ckpt_quantize as a CkptQuantRound.
 *
 * Covered: the attention projections of standard (non-MLA) attention, the
 * dense MLP, routed and shared experts, and an untied lm_head.  The rest
 * (MLA projections, the vision tower, the embedding: a lookup, no input)
 * is rounded to nearest.  H is taken from the float32 model's activations
 * (not from the already-quantized layers before it).
 *
 * The factors are made one layer at a time, when ckpt_quantize (which
 * walks the parameter table in layer order) first asks for a matrix of
 * that layer: the calibration batches' residual stream is kept (windows x
 * T x hidden floats) and pushed through one layer per step, so only one
 * layer's H and U are held at once (for a many-expert model, E of them
 * per input: the bulk of the memory).  The H summed this way are those of
 * one full forward per batch, bit for bit: the same calls on the same
 * rows in the same order.
 */
#ifndef TANDEM_TRAIN_QUANT_GPTQ_H
#define TANDEM_TRAIN_QUANT_GPTQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/ckpt_serve.h"
#include "core/model/model.h"

typedef struct GptqSet GptqSet;

/* The factors of float32 model m (one process) from the n_win windows of T
 * + 1 tokens at tok (window w: tok[w T .. w T + T]), damp > 0.  The set
 * takes the model over (*m is left empty; gptq_free frees it) and makes
 * each layer's factors when they are first asked for.  Progress lines on
 * stderr.  Returns the set (never NULL). */
GptqSet *gptq_collect(Model *m, const int32_t *tok, size_t n_win, size_t T, double damp);

/* The set as ckpt_quantize's rounding. */
CkptQuantRound gptq_round(GptqSet *g);

/* Matrices that got a factor (the others: no rows seen, or H not positive
 * definite even damped), those without, and the most bytes of H / U held
 * at once (one layer's). */
size_t gptq_factored(const GptqSet *g, size_t *n_nearest, size_t *peak_bytes);

void gptq_free(GptqSet *g);

/* h (K K row-major; its upper triangle read: H) -> U in place, row-major
 * upper triangular with U^T U = H'^-1, where H' is H with a zero diagonal
 * entry set to 1 and damp times H's mean diagonal added to the diagonal;
 * false when H' is not positive definite (h then undefined).  work: K K
 * doubles. */
bool gptq_factor(float *h, size_t K, double damp, double *work);

#endif

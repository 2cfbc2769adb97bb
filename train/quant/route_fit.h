/* train/quant/route_fit.h - routers fitted to a quantized model, for
 * `tandem ckpt quantize --fit-routers` (docs/serving.md "Router fitting").
 *
 * A quantized model's router sees a slightly different hidden state than
 * the float32 model's, and where the k-th and (k+1)-th experts' logits are
 * close (many-expert models, 8 of 128) that difference flips the choice.
 * The router is float32 at every dtype, so it can absorb the part of the
 * difference that is linear in its input: for each MoE layer in order, on
 * calibration windows, with h_q the quantized model's router inputs (the
 * routers of the layers before already fitted) and z_f = W h_f the float32
 * model's router logits on its own inputs,
 *
 *     W' = argmin  sum_t || W' h_q(t) - z_f(t) ||^2  +  lambda || W' - W ||_F^2,
 *     lambda = ridge * mean(diag(sum_t h_q h_q^T)),
 *
 * one ridge least-squares solve per layer (E right-hand sides of the d x d
 * normal equations, LAPACK dposv in double).  The layer's MoE half then
 * runs again with W' (on the attention block's output of the first pass,
 * which the router does not change) to carry the quantized stream to the
 * next layer.  Only the
 * routers change: the format, the matrices and every guarantee stay.  The
 * fit belongs to the weights and the KV dtype it was made with.
 */
#ifndef TANDEM_TRAIN_QUANT_ROUTE_FIT_H
#define TANDEM_TRAIN_QUANT_ROUTE_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "core/model/model.h"

/* One fitted router: the parameter it replaces and its values (E d). */
typedef struct {
    char name[PARAM_NAME_MAX];
    float *w;          /* owned (td_malloc'd), [E, d] row-major */
    size_t E, d;
    double logit_rmse_before, logit_rmse_after;   /* on the calibration rows */
} RouteFit;

/* Fits every local MoE layer's router of q (a serving model, one process,
 * the quantized one) against f (the float32 model of the same config) on
 * the n_win windows of T + 1 tokens at tok, ridge > 0.  q's routers are
 * replaced by the fitted ones as it goes (repacked).  *out gets one entry
 * per MoE layer (td_malloc'd, *n_out entries; route_fit_free).  Progress
 * lines on stderr.  Returns 0, or -1 with one line in err (a solve that
 * fails: the layer named). */
int route_fit(const Model *f, Model *q, const int32_t *tok, size_t n_win, size_t T, double ridge, RouteFit **out,
              int *n_out, char *err, size_t err_len);

void route_fit_free(RouteFit *r, int n);

#endif

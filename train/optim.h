/* train/optim.h - AdamW (Loshchilov & Hutter 2019) as torch.optim.AdamW
 * computes it, global-norm gradient clipping and the learning-rate schedule.
 *
 * Per element, step t (from 1), decay = weight_decay on matrices and
 * embeddings, 0 on norm weights:
 *   w *= 1 - lr * decay
 *   m  = beta1 m + (1 - beta1) g
 *   v  = beta2 v + (1 - beta2) g^2
 *   w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * Schedule: linear warmup from lr/warmup to lr over warmup_steps, then
 * cosine from lr down to min_lr at the last step (or constant lr).
 */
#ifndef TANDEM_TRAIN_OPTIM_H
#define TANDEM_TRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/model/model.h"

typedef struct {
    double beta1, beta2, eps, weight_decay;
} AdamHyper;

/* One AdamW step over every parameter slab (m->w, m->g and the moments
 * share the layout of m->w), with the gradient g * gscale (the clipping
 * factor; 1 = unclipped, and the bits of g itself).  m->g is only read.
 * t: step number from 1.  Threaded; elementwise, so the split does not
 * change results. */
void adamw_step(Model *m, float *exp_avg, float *exp_avg_sq, const AdamHyper *h, int64_t t, double lr,
                float gscale);

/* This rank's share of the squared global gradient norm: each parameter's
 * sum of squares divided by the number of ranks holding the same slice, so
 * that the sum over all ranks of the world is the squared norm of the whole
 * model's gradient (gradients already reduced over dp).  Threaded; the
 * summation order is fixed (optim.c), independent of the thread count. */
double grad_sq_norm(const Model *m);
/* The same over slab elements [lo, hi) only, each multiplied by
 * holders_div (ZeRO: the slice is split over holders_div ranks, each
 * holding a disjoint part). */
double grad_sq_range(const Model *m, size_t lo, size_t hi, double holders_div);
/* AdamW on slab elements [lo, hi), which may cross parameters; m1 and m2
 * hold the moments of exactly those elements (m1[0] is element lo);
 * gscale as for adamw_step. */
void adamw_range(Model *m, size_t lo, size_t hi, float *m1, float *m2, const AdamHyper *h,
                 int64_t t, double lr, float gscale);

/* Learning rate at step (0-based). */
double lr_schedule(double lr, double min_lr, int warmup, int total, int cosine, int64_t step);

#endif

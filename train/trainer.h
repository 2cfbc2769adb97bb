/* train/trainer.h - `tandem train`: the training loop.
 *
 * Per step: grad_accum micro-batches (forward, backward adding into the
 * gradients), gradients summed over data-parallel ranks (each rank's
 * gradient is already scaled by the global token count, so the sum is the
 * global mean), global-norm clipping, AdamW, weights re-packed for the
 * forward kernel.  Reports per step the figures of SPEC section 7 to
 * out_dir/metrics.jsonl and to the terminal; evaluates, checkpoints and
 * resumes as the run config says (SPEC sections 3 and 8).
 */
#ifndef TANDEM_TRAIN_TRAINER_H
#define TANDEM_TRAIN_TRAINER_H

#include "train/runcfg.h"

/* Runs the whole job described by rc; every rank calls.  Returns 0, or
 * non-zero after one error line. */
int train_run(const RunConfig *rc);

/* Measured GFLOP/s of this process's cores for cblas_sgemm (the rate the
 * backward runs at) and for tandem's forward kernel, on 1024^3 products;
 * each takes ~0.2 s. */
void train_measure_peak(double *sgemm_gflops, double *kernel_gflops);

#endif

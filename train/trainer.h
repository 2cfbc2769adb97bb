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

#include "core/model/backprop.h"
#include "train/runcfg.h"

/* Runs the whole job described by rc; every rank calls.  Returns 0, or
 * non-zero after one error line. */
int train_run(const RunConfig *rc);

/* Measured GFLOP/s of this process's cores for cblas_sgemm (the rate the
 * backward runs at) and for tandem's forward kernel, on 1024^3 products;
 * each takes ~0.2 s. */
void train_measure_peak(double *sgemm_gflops, double *kernel_gflops);
/* The side of its square products. */
#define TRAIN_PEAK_N 1024

/* Bytes one rank of a training run allocates through td_malloc, by what
 * they hold (docs/planning.md): weights (the float32 slab and the packed
 * copy the forward reads), gradients, optimizer (AdamW moments, ZeRO-1
 * shards), activations (model_train_acts_bytes times the micro-batches a
 * 1F1B stage holds), comm (ZeRO reduce-scatter buffer, gradient buckets),
 * workspace (tables, RoPE, token buffers, and the transient peaks on top
 * of what is held), total (the predicted td_mem_peak after a step). */
typedef struct {
    size_t weights, gradients, optimizer, activations, comm, workspace, total;
} TrainMem;

/* Micro-batches in flight on the stage of t (1F1B). */
int train_n_slots(const Topology *t, int grad_accum);
/* What rank m->topo.rank of a run with micro-batches of B x T (per dp
 * rank), grad_accum, recompute mode and zero allocates: m is its model
 * (model_init or model_init_shape), sized by the functions the trainer
 * allocates with (bucket layout, model_train_acts_bytes, slots). */
void train_mem(const Model *m, size_t B, size_t T, int grad_accum, Recompute mode, bool zero, TrainMem *out);

#endif

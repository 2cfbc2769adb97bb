/* train/runcfg.h - run configurations (SPEC section 3): flat JSON objects in
 * configs/, every key overridable on the command line as key=value.
 * Unknown keys and values of the wrong type or range are an error naming the
 * key.  The key table (name, type, default, bounds) is the one place that
 * defines them; docs/config.md lists the same table.
 */
#ifndef TANDEM_TRAIN_RUNCFG_H
#define TANDEM_TRAIN_RUNCFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model/config.h"

typedef struct {
    ModelConfig model;
    char model_src[1024];     /* path the model config came from, or "inline" */
    char data[512];
    char images[512];        /* image questions and answers (`tandem data images` DIR or a JSONL file); "" = none */
    double image_fraction;   /* share of each micro-batch's rows that are image rows (train/image_data.h) */
    int seq_len, micro_batch, grad_accum, steps;
    double lr, min_lr;
    char lr_schedule[16];    /* cosine | constant */
    int warmup_steps;
    double weight_decay, beta1, beta2, adam_eps, grad_clip;
    double router_bias_update_rate;   /* aux-loss-free balance of a noaux_tc router (0: off) */
    double router_seq_aux_loss_coef;  /* sequence-wise balance loss of a sigmoid router (0: off) */
    char recompute[16];      /* none | full | selective */
    int64_t seed;
    bool shuffle;
    char out_dir[512];
    int save_every, keep_last, eval_every, eval_batches, log_every;
    char save_at[256];       /* steps also saved, "1,50"; empty = none (runcfg_load checked it) */
    int dp, tp, pp, ep, cp, zero;   /* cp: context parallel size (SPEC section 12) */
    bool sp;                 /* sequence parallelism over the tp group (Topology.sp) */
    char pp_layers[128];     /* layers per pipeline stage, "2,2"; empty = even */
    char init_from[512], resume[512];
    char tokenizer[512];     /* HF directory or checkpoint whose tokenizer the run uses; "" = default */
    int threads;             /* 0 = automatic */
    char on_nonfinite[8];    /* stop | skip: a step whose loss or gradient is not finite */
    char debug_nan_grad[160];/* tests: "STEP:TENSOR" sets one gradient element of TENSOR to NaN at STEP */
    char debug_lr_spike[64]; /* tests: "STEP:FACTOR" multiplies the learning rate of STEP by FACTOR */
    int health_every;        /* act_rms in metrics.jsonl at step 1 and every health_every steps (0: never) */
    /* RL (tandem rl); ignored by tandem train */
    char task[32], prompts[512], reward_cmd[512], loss_agg[16], reward_on_error[8], rollout_dtype[8];
    int prompts_per_step, group_size, max_new_tokens, ppo_epochs, rollout_ranks;
    double temperature, clip_eps, kl_coef, reward_timeout;
    bool model_given;
    char *json;              /* owned: the resolved run config as JSON (for checkpoints) */
} RunConfig;

/* Loads path (may be NULL: defaults only) and applies the key=value
 * overrides.  On error writes one line to err and returns -1.  The model
 * key may be a path (resolved against the run config's directory, then the
 * working directory) or an inline object. */
int runcfg_load(RunConfig *rc, const char *path, int n_over, char *const *over, char *err, size_t err_len);
void runcfg_free(RunConfig *rc);

#endif

/* plan/plan.h - `tandem plan`: memory and communication of a model under
 * every parallel layout of a cluster, before any weights exist (SPEC
 * section 14, docs/planning.md).
 *
 * One source of truth.  Per-rank bytes come from the functions the
 * allocators size themselves with, run on a model shape
 * (model_init_shape: the parameter table, no slabs):
 *   training  train_mem (train/trainer.h): the weight, gradient and
 *             packed slabs (model.c's table), AdamW moments and ZeRO-1
 *             shards (the trainer's bucket layout), the activation arena
 *             (model_train_acts_bytes: the trainer's carve on a dry arena)
 *             times the micro-batches a 1F1B stage holds (train_n_slots);
 *   serving   engine_mem (infer/engine.h): the paged KV cache
 *             (kvcache_bytes), the engine's arena (layer_acts_carve on a
 *             dry arena), its tables; weights from the serving table
 *             (with --expert-cache-mb: the table without the routed
 *             experts plus the cache's whole slots, expert_cache.h).
 * A layout is checked by topo_init (core/model/topology.c), the check the
 * trainer and the server run: a layout it refuses is infeasible with its
 * reason.  Communication volumes follow docs/scaling.md; step times are
 * an estimate from the given FLOP/s and link bandwidths.
 */
#ifndef TANDEM_PLAN_PLAN_H
#define TANDEM_PLAN_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "core/dtype.h"
#include "core/model/backprop.h"
#include "core/model/config.h"
#include "core/model/topology.h"

typedef enum { PLAN_TRAIN, PLAN_SERVE } PlanMode;

/* Communication groups, in the order of the JSON output. */
typedef enum { PLAN_TP, PLAN_EP, PLAN_PP, PLAN_DP, PLAN_CP, PLAN_N_GROUPS } PlanGroup;
extern const char *const plan_group_names[PLAN_N_GROUPS];

/* Per-rank byte categories, in the order of the JSON output. */
typedef enum {
    PLAN_WEIGHTS, PLAN_GRADIENTS, PLAN_OPTIMIZER, PLAN_ACTIVATIONS, PLAN_KV_CACHE, PLAN_COMM,
    PLAN_WORKSPACE, PLAN_TOTAL, PLAN_N_CATS
} PlanCat;
extern const char *const plan_cat_names[PLAN_N_CATS];

typedef struct {
    PlanMode mode;
    int world;
    double device_bytes;          /* memory of one device */
    /* training: the run keys (micro_batch is global: B = micro_batch / dp per rank) */
    int seq_len, micro_batch, grad_accum;
    int global_batch;             /* > 0: sequences per step; each layout then runs micro_batch = dp
                                   * (one sequence per rank) and grad_accum = global_batch / dp */
    Recompute recompute;
    bool zero;
    bool sp;                      /* run key sp: sequence parallelism in layouts with tp > 1 */
    int cp;                       /* run key cp: plan_all plans layouts of this cp (1: none) */
    /* serving: per serving instance (tp x ep ranks; dp / ep instances) */
    int context, concurrency, max_batch_tokens, prefill_chunk;
    Dtype dtype, kv_dtype;
    double expert_cache_bytes;    /* serving: --expert-cache-mb per rank (0: experts resident) */
    /* hardware (docs/planning.md gives the defaults) */
    double flops;                 /* sustained FLOP/s of one device */
    double hbm_bps;               /* device memory bandwidth, bytes/s (serving decode) */
    double intra_bps, inter_bps;  /* link bandwidth per rank inside a node / between nodes, bytes/s */
    int node_size;                /* devices per node */
} PlanOpts;

/* Defaults of every option but mode, world and device_bytes. */
void plan_opts_default(PlanOpts *o);

typedef struct {
    int dp, tp, pp, ep, cp;
} PlanLayout;

typedef struct {
    PlanLayout l;
    bool feasible;
    char reason[256];             /* why not, "" when feasible */
    int stage;                    /* the pipeline stage whose ranks need the most (bytes[] are its) */
    double bytes[PLAN_N_CATS];    /* per rank */
    double stage_total[TOPO_MAX_PP];  /* training: total of each stage's ranks */
    double comm[PLAN_N_GROUPS];   /* bytes per rank per step (serving: per decode step) */
    double compute_s, comm_s, est_step_s;
    int micro_batch, grad_accum;  /* training: the run keys this layout runs with */
    size_t kv_mb;                 /* serving: the KV budget counted (serve --kv-mb) */
    size_t expert_slots;          /* serving with an expert cache: its slots per MoE layer */
    double tokens_per_s;          /* training: global tokens per second; serving: per instance */
} PlanResult;

/* Plans one layout: r->feasible false with r->reason when the topology
 * check refuses it, a run key does not divide, or the bytes exceed the
 * device.  cfg must have passed config_validate. */
void plan_layout(const ModelConfig *cfg, const PlanOpts *o, PlanLayout l, PlanResult *r);

/* Every layout dp * tp * pp * cp = world with ep dividing dp (cp =
 * o->cp; serving: pp = 1, cp = 1) planned and ranked: feasible first by est_step_s, then the rest
 * by total bytes.  *out owned by the caller (td_free); returns the count. */
int plan_all(const ModelConfig *cfg, const PlanOpts *o, PlanResult **out);

#endif

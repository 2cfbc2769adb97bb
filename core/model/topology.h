/* core/model/topology.h - the parallel layout of a job (SPEC section 5), as plain
 * numbers: core/ computes which slice of every tensor a rank owns from it,
 * comm/ builds the MPI groups from it.
 *
 *   world = dp * pp * cp * tp;
 *   rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
 *   (SPEC sections 5 and 12; cp = 1 gives section 5's order)
 *   context-parallel ranks (same pp, dp, tp rank) hold the same weights and
 *   each a part of every sequence (train/trainer.c, docs/scaling.md);
 *   expert-parallel groups of size ep are carved from the dp group:
 *   ranks with the same dp_rank / ep form one, ep_rank = dp_rank % ep, and
 *   ep rank r owns experts [r E/ep, (r+1) E/ep).
 *   pipeline stage s owns layers [layer_begin, layer_end), an even split by
 *   default (the first L % pp stages get one more).
 */
#ifndef TANDEM_CORE_MODEL_TOPOLOGY_H
#define TANDEM_CORE_MODEL_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>

#include "core/model/config.h"

#define TOPO_MAX_PP 64

typedef struct {
    int world, rank;
    int dp, tp, pp, ep;
    int dp_rank, tp_rank, pp_rank, ep_rank;
    int cp, cp_rank;                   /* context parallelism (SPEC section 12) */
    int stage_begin[TOPO_MAX_PP + 1];  /* stage s owns layers [stage_begin[s], stage_begin[s+1]) */
    int layer_begin, layer_end;        /* this rank's stage */
    /* sequence parallelism over the tp group (run key sp, training only):
     * the residual stream and the norms hold rows [tp_rank N/tp, (tp_rank
     * + 1) N/tp) of each micro-batch (core/model/layer.h).  topo_init
     * leaves it false; the trainer sets it after. */
    bool sp;
    /* serving under ep (infer/): every rank of an ep group holds the same
     * batch, so each computes its own experts' rows from its copy and the
     * expert outputs are all-gathered (core/model/layer.c,
     * ep_shared_experts): each expert computes each token once.  topo_init
     * leaves it false; the server sets it after. */
    bool ep_shared_rows;
} Topology;

/* Single process. */
void topo_single(Topology *t, const ModelConfig *cfg);

/* Layout for `rank` of dp*tp*pp*cp ranks.  stages (may be NULL: even split)
 * gives the number of layers of each stage.  Checks that the topology
 * divides the model (heads, kv heads, expert and dense widths by tp,
 * experts by ep, ep divides dp, at least one layer per stage); on failure
 * writes one line naming the constraint into err and returns -1. */
int topo_init(Topology *t, const ModelConfig *cfg, int dp, int tp, int pp, int ep, int cp, int rank,
              const int *stages, char *err, size_t err_len);

static inline int topo_is_first_stage(const Topology *t) { return t->pp_rank == 0; }
static inline int topo_is_last_stage(const Topology *t) { return t->pp_rank == t->pp - 1; }

#endif

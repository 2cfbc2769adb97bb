/* core/model/expert_cache.h - routed-expert weights held in a bounded cache
 * instead of resident (serving with --expert-cache-mb, SPEC section 14).
 *
 * A serving model built with offloaded experts (model_init_serving_offload)
 * keeps every weight resident except the routed experts' gate/up/down
 * matrices.  Those live in a fixed slab of slots, `slots` per MoE layer of
 * this stage; a slot holds one local expert's three packed matrices, in the
 * Params' dtypes and in the bytes model_set_weights / model_set_q8 would
 * have packed into the resident slab.  The forward (model_experts_forward)
 * asks for the experts a layer's rows are routed to; a miss calls the
 * loader callback, which fills the slot from the checkpoint (core/ does not
 * know the formats: checkpoint/ckpt_experts.h installs the callback).
 *
 * Eviction: least recently used within the layer (each layer has its own
 * slots, so a decode step's walk over the layers does not flush one layer's
 * hot experts with the next layer's).  The experts of the chunk being
 * computed are pinned; a batch routed to more experts than a layer has
 * slots is computed in chunks of at most `slots` experts (each expert's
 * GEMMs are independent, so chunking does not change a bit).
 *
 * Failure: a load that fails leaves the slot zeroed and unowned, records
 * the first error (expert_cache_error) and the forward goes on with zeros;
 * the caller checks after the step and fails the requests of that step.
 *
 * Not thread-safe: one thread runs the forward (the engine's).
 */
#ifndef TANDEM_CORE_MODEL_EXPERT_CACHE_H
#define TANDEM_CORE_MODEL_EXPERT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model/model.h"

/* Fills dst (p->mat_bytes) with local matrix e of p packed in p->dtype.
 * 0, or -1 with one line in err. */
typedef int (*ExpertLoadFn)(void *ctx, const Param *p, size_t e, unsigned char *dst, char *err, size_t err_len);

typedef struct {
    uint64_t hits, misses;   /* expert lookups of the forward (one per expert per layer call) */
    uint64_t bytes_loaded;   /* packed bytes the loader wrote */
    uint64_t load_errors;
    double load_s;           /* seconds in the loader (the forward's stall) */
} ExpertCacheStats;

struct ExpertCache {
    size_t slots;            /* per MoE layer */
    size_t slot_bytes;       /* gate + up + down of one expert, each part 64-byte aligned */
    size_t part[3];          /* byte offsets of gate, up, down in a slot */
    size_t n_moe, E;         /* MoE layers of this stage; local experts */
    int *moe_of;             /* global layer -> MoE index, -1 (num_hidden_layers entries) */
    unsigned char *slab;     /* n_moe * slots * slot_bytes */
    int32_t *where;          /* [n_moe][E] slot of an expert, -1 */
    int32_t *owner;          /* [n_moe][slots] expert in a slot, -1 */
    uint64_t *used;          /* [n_moe][slots] tick of last use */
    uint64_t tick;
    ExpertLoadFn load;
    void *ctx;
    void (*ctx_free)(void *ctx);
    ExpertCacheStats st;
    char err[512];           /* first load error since expert_cache_clear_error, "" */
};
typedef struct ExpertCache ExpertCache;

/* Packed bytes of one local expert (gate + up + down, as a slot holds them). */
size_t expert_cache_expert_bytes(const Model *m);
/* MoE layers of m's stage. */
size_t expert_cache_moe_layers(const Model *m);
/* The fewest slots per layer a cache may have: one token's top-k experts
 * (min(k, E local)). */
size_t expert_cache_min_slots(const Model *m);
/* Slots per layer a budget of `bytes` gives (capped at E local: more is
 * the resident model), and the bytes those slots take. */
size_t expert_cache_slots_for(const Model *m, size_t bytes);
size_t expert_cache_slab_bytes(const Model *m, size_t slots);

/* 0 when a cache of `bytes` fits m (at least expert_cache_min_slots per
 * MoE layer), else -1 with one line naming both numbers (in MB = MiB).
 * m may be a model_init_shape_offload'ed shape (plan/). */
int expert_cache_check(const Model *m, size_t bytes, char *err, size_t err_len);
/* Gives m (model_init_serving_offload'ed) a cache of `bytes` (at most:
 * the slab is whole slots) with loader load(ctx); ctx_free (may be NULL)
 * is called on ctx by expert_cache_free.  Refuses, with one line naming
 * both numbers, a budget below expert_cache_min_slots per layer.  0 or -1. */
int expert_cache_attach(Model *m, size_t bytes, ExpertLoadFn load, void *ctx, void (*ctx_free)(void *),
                        char *err, size_t err_len);
/* Frees the cache (model_free calls it). */
void expert_cache_free(ExpertCache *c);
/* Drops every cached expert (after the checkpoint changed); counters kept. */
void expert_cache_invalidate(ExpertCache *c);

/* Slot of local expert e of layer l (L = &m->layers[l]), loaded on a miss
 * (the forward's lookup): *gate, *up, *down get its packed matrices.
 * pin_tick: the current chunk's tick (c->tick after ++), whose slots are
 * not evicted. */
void expert_cache_get(ExpertCache *c, const Layer *L, int l, size_t e, uint64_t pin_tick, const unsigned char **gate,
                      const unsigned char **up, const unsigned char **down);

/* The first load error since the last clear ("" when none), and its clear. */
const char *expert_cache_error(const ExpertCache *c);
void expert_cache_clear_error(ExpertCache *c);

#endif

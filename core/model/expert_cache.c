/* core/model/expert_cache.c - the routed-expert cache (expert_cache.h). */
#include "core/model/expert_cache.h"
#include "core/common.h"

#include <stdio.h>
#include <string.h>

size_t expert_cache_expert_bytes(const Model *m)
{
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        const Layer *L = &m->layers[l];
        if (L->moe) return td_round_up(L->egate->mat_bytes, 64) + td_round_up(L->eup->mat_bytes, 64) +
                           td_round_up(L->edown->mat_bytes, 64);
    }
    return 0;
}

size_t expert_cache_moe_layers(const Model *m)
{
    size_t n = 0;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) n += m->layers[l].moe;
    return n;
}

size_t expert_cache_min_slots(const Model *m) { return td_min(m->k, m->E); }

size_t expert_cache_slots_for(const Model *m, size_t bytes)
{
    const size_t per = expert_cache_expert_bytes(m) * expert_cache_moe_layers(m);
    return per ? td_min(bytes / per, m->E) : 0;
}

size_t expert_cache_slab_bytes(const Model *m, size_t slots)
{
    return slots * expert_cache_expert_bytes(m) * expert_cache_moe_layers(m);
}

size_t model_expert_cache_bytes(const Model *m)
{
    return m->ecache ? m->ecache->n_moe * m->ecache->slots * m->ecache->slot_bytes : 0;
}

int expert_cache_check(const Model *m, size_t bytes, char *err, size_t err_len)
{
    const size_t n_moe = expert_cache_moe_layers(m), slots = expert_cache_slots_for(m, bytes);
    const size_t min = expert_cache_min_slots(m);
    if (n_moe == 0) {
        (void)td_snprintf(err, err_len, "--expert-cache-mb: the model has no MoE layer (nothing to offload)");
        return -1;
    }
    if (slots < min) {
        const double need = (double)expert_cache_slab_bytes(m, min) / 1048576.0;
        (void)td_snprintf(err, err_len,
                          "--expert-cache-mb %.2f is below one token's top-%zu experts in each of %zu MoE layers: "
                          "%.2f MB (%zu bytes per expert)",
                          (double)bytes / 1048576.0, min, n_moe, need, expert_cache_expert_bytes(m));
        return -1;
    }
    return 0;
}

int expert_cache_attach(Model *m, size_t bytes, ExpertLoadFn load, void *ctx, void (*ctx_free)(void *),
                        char *err, size_t err_len)
{
    TD_CHECK(m->experts_offloaded && !m->ecache, "expert_cache_attach: the model does not offload its experts");
    if (expert_cache_check(m, bytes, err, err_len)) return -1;
    const size_t n_moe = expert_cache_moe_layers(m), slots = expert_cache_slots_for(m, bytes);
    ExpertCache *c = td_calloc(sizeof *c);
    const Layer *L = NULL;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end && !L; l++)
        if (m->layers[l].moe) L = &m->layers[l];
    c->slots = slots;
    c->part[0] = 0;
    c->part[1] = td_round_up(L->egate->mat_bytes, 64);
    c->part[2] = c->part[1] + td_round_up(L->eup->mat_bytes, 64);
    c->slot_bytes = expert_cache_expert_bytes(m);
    c->n_moe = n_moe;
    c->E = m->E;
    c->moe_of = td_malloc((size_t)m->cfg.num_hidden_layers * sizeof(int));
    for (int l = 0, i = 0; l < m->cfg.num_hidden_layers; l++)
        c->moe_of[l] = l >= m->topo.layer_begin && l < m->topo.layer_end && m->layers[l].moe ? i++ : -1;
    c->slab = td_calloc(n_moe * slots * c->slot_bytes);
    c->where = td_malloc(n_moe * c->E * sizeof(int32_t));
    c->owner = td_malloc(n_moe * slots * sizeof(int32_t));
    c->used = td_calloc(n_moe * slots * sizeof(uint64_t));
    c->load = load;
    c->ctx = ctx;
    c->ctx_free = ctx_free;
    expert_cache_invalidate(c);
    m->ecache = c;
    return 0;
}

void expert_cache_free(ExpertCache *c)
{
    if (!c) return;
    if (c->ctx_free) c->ctx_free(c->ctx);
    td_free(c->moe_of);
    td_free(c->slab);
    td_free(c->where);
    td_free(c->owner);
    td_free(c->used);
    td_free(c);
}

void expert_cache_invalidate(ExpertCache *c)
{
    for (size_t i = 0; i < c->n_moe * c->E; i++) c->where[i] = -1;
    for (size_t i = 0; i < c->n_moe * c->slots; i++) {
        c->owner[i] = -1;
        c->used[i] = 0;
    }
}

/* The slot to load into: a free one, else the least recently used one not
 * pinned by the current chunk (the caller never pins more than `slots`). */
static size_t victim(const ExpertCache *c, size_t li, uint64_t pin_tick)
{
    const int32_t *own = c->owner + li * c->slots;
    const uint64_t *used = c->used + li * c->slots;
    size_t best = c->slots;
    for (size_t s = 0; s < c->slots; s++) {
        if (own[s] < 0) return s;
        if (used[s] != pin_tick && (best == c->slots || used[s] < used[best])) best = s;
    }
    TD_CHECK(best < c->slots, "expert cache: every slot of the layer is pinned");
    return best;
}

/* Loads local expert e of layer l into slot s of MoE layer li. */
static void fill(ExpertCache *c, const Layer *L, size_t li, size_t s, size_t e)
{
    unsigned char *dst = c->slab + (li * c->slots + s) * c->slot_bytes;
    const Param *ps[3] = { L->egate, L->eup, L->edown };
    const double t0 = td_now();
    char why[sizeof c->err];
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        rc = c->load(c->ctx, ps[i], e, dst + c->part[i], why, sizeof why);
        if (!rc) c->st.bytes_loaded += ps[i]->mat_bytes;
    }
    c->st.load_s += td_now() - t0;
    c->st.misses++;
    int32_t *own = c->owner + li * c->slots;
    if (own[s] >= 0) c->where[li * c->E + (size_t)own[s]] = -1;
    if (rc) {   /* zeros, owned by nobody: the next lookup tries again */
        memset(dst, 0, c->slot_bytes);
        own[s] = -1;
        c->st.load_errors++;
        if (!c->err[0]) (void)td_snprintf(c->err, sizeof c->err, "%s", why);
        return;
    }
    own[s] = (int32_t)e;
    c->where[li * c->E + e] = (int32_t)s;
}

void expert_cache_get(ExpertCache *c, const Layer *L, int l, size_t e, uint64_t pin_tick, const unsigned char **gate,
                      const unsigned char **up, const unsigned char **down)
{
    TD_CHECK(l >= 0 && c->moe_of[l] >= 0 && e < c->E, "expert cache: layer %d expert %zu not cached here", l, e);
    const size_t li = (size_t)c->moe_of[l];
    int32_t s = c->where[li * c->E + e];
    if (s >= 0) {
        c->st.hits++;
    } else {
        s = (int32_t)victim(c, li, pin_tick);
        fill(c, L, li, (size_t)s, e);
    }
    c->used[li * c->slots + (size_t)s] = pin_tick;
    const unsigned char *b = c->slab + (li * c->slots + (size_t)s) * c->slot_bytes;
    *gate = b + c->part[0];
    *up = b + c->part[1];
    *down = b + c->part[2];
}

const char *expert_cache_error(const ExpertCache *c) { return c->err; }

void expert_cache_clear_error(ExpertCache *c) { c->err[0] = 0; }

/* infer/kvcache.c - paged KV cache (kvcache.h). */
#include "infer/kvcache.h"
#include "core/common.h"

#include <string.h>

/* Blocks a budget buys: every local layer's block counts. */
static size_t n_blocks_of(const Model *m, size_t budget_bytes)
{
    size_t per_block = (size_t)(m->topo.layer_end - m->topo.layer_begin) * attn_block_bytes(&m->attn);
    size_t n = budget_bytes / (per_block ? per_block : 1);
    if (n < 1) n = 1;
    if (n > INT32_MAX / 2) n = INT32_MAX / 2;
    return n;
}

size_t kvcache_bytes(const Model *m, size_t budget_bytes, size_t *n_blocks)
{
    size_t n = n_blocks_of(m, budget_bytes);
    if (n_blocks) *n_blocks = n;
    return (size_t)(m->topo.layer_end - m->topo.layer_begin) * n * attn_block_bytes(&m->attn) + 64 +
           n * sizeof(int32_t);
}

void kvcache_init(KvCache *c, const Model *m, size_t budget_bytes)
{
    memset(c, 0, sizeof *c);
    c->n_layers = m->topo.layer_end - m->topo.layer_begin;
    c->bs = m->attn.bs;
    c->block_bytes = attn_block_bytes(&m->attn);
    size_t n = n_blocks_of(m, budget_bytes);
    c->n_blocks = (int32_t)n;
    /* zeroed once: a stale or never-written slot is only ever read for a
     * masked key, whose score is replaced, never used */
    c->pool = td_calloc((size_t)c->n_layers * n * c->block_bytes + 64);
    c->free_list = td_malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) c->free_list[i] = (int32_t)(n - 1 - i);  /* pop gives 0, 1, ... */
    c->n_free = (int32_t)n;
}

void kvcache_free(KvCache *c)
{
    td_free(c->pool);
    td_free(c->free_list);
    memset(c, 0, sizeof *c);
}

size_t kvcache_block_bytes(const KvCache *c)
{
    return (size_t)c->n_layers * c->block_bytes;
}

bool kvcache_reserve(KvCache *c, KvSeq *s, size_t len)
{
    int32_t need = kvcache_blocks_for(c, len) - s->n_blocks;
    if (need <= 0) return true;
    if (need > c->n_free) return false;
    if (s->n_blocks + need > s->cap) {
        int32_t cap = s->cap ? s->cap : 8;
        while (cap < s->n_blocks + need) cap *= 2;
        int32_t *nb = td_malloc((size_t)cap * sizeof(int32_t));
        if (s->n_blocks) memcpy(nb, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
        td_free(s->blocks);
        s->blocks = nb;
        s->cap = cap;
    }
    while (need-- > 0) s->blocks[s->n_blocks++] = c->free_list[--c->n_free];
    return true;
}

void kvcache_release(KvCache *c, KvSeq *s)
{
    for (int32_t i = s->n_blocks - 1; i >= 0; i--) c->free_list[c->n_free++] = s->blocks[i];
    td_free(s->blocks);
    memset(s, 0, sizeof *s);
}

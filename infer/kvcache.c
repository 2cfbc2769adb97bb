/* infer/kvcache.c - paged KV cache with prefix caching (kvcache.h). */
#include "infer/kvcache.h"
#include "core/common.h"

#include <string.h>

/* Blocks a budget buys: every local layer's block counts. */
static size_t n_blocks_of(const Model *m, size_t budget_bytes)
{
    size_t per_block = (size_t)(m->topo.layer_end - m->topo.layer_begin) * attn_block_bytes(&m->attn);
    size_t n = budget_bytes / (per_block ? per_block : 1);
    if (n < 1) n = 1;
    if (n > INT32_MAX / 4) n = INT32_MAX / 4;   /* the prefix table's buckets (2n, a power of 2) fit an int32 */
    return n;
}

/* Hash buckets of the prefix table for n blocks: the power of 2 >= 2n. */
static size_t n_buckets_of(size_t n)
{
    size_t b = 1;
    while (b < 2 * n) b *= 2;
    return b;
}

size_t kvcache_bytes(const Model *m, size_t budget_bytes, size_t *n_blocks)
{
    size_t n = n_blocks_of(m, budget_bytes);
    if (n_blocks) *n_blocks = n;
    /* the pool, the free list, and the prefix cache's tables of kvcache_init:
     * ref, reg, hash, parent, tokens, chain, lru_prev/next, buckets */
    const size_t per_block_meta = sizeof(int32_t) + sizeof(int32_t) + sizeof(bool) + 2 * sizeof(uint64_t) +
                                  (size_t)m->attn.bs * sizeof(int32_t) + 3 * sizeof(int32_t);
    return (size_t)(m->topo.layer_end - m->topo.layer_begin) * n * attn_block_bytes(&m->attn) + 64 +
           n * per_block_meta + n_buckets_of(n) * sizeof(int32_t);
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
    c->ref = td_calloc(n * sizeof(int32_t));
    c->reg = td_calloc(n * sizeof(bool));
    c->hash = td_calloc(n * sizeof(uint64_t));
    c->parent = td_calloc(n * sizeof(uint64_t));
    c->tokens = td_calloc(n * c->bs * sizeof(int32_t));
    c->chain = td_malloc(n * sizeof(int32_t));
    c->lru_prev = td_malloc(n * sizeof(int32_t));
    c->lru_next = td_malloc(n * sizeof(int32_t));
    c->n_buckets = n_buckets_of(n);
    c->bucket = td_malloc(c->n_buckets * sizeof(int32_t));
    for (size_t i = 0; i < c->n_buckets; i++) c->bucket[i] = -1;
    c->lru_head = c->lru_tail = -1;
}

void kvcache_free(KvCache *c)
{
    td_free(c->pool);
    td_free(c->free_list);
    td_free(c->ref);
    td_free(c->reg);
    td_free(c->hash);
    td_free(c->parent);
    td_free(c->tokens);
    td_free(c->chain);
    td_free(c->lru_prev);
    td_free(c->lru_next);
    td_free(c->bucket);
    memset(c, 0, sizeof *c);
}

size_t kvcache_block_bytes(const KvCache *c)
{
    return (size_t)c->n_layers * c->block_bytes;
}

/* ---------------------------------------------------------------- the LRU list and the table */

static void lru_remove(KvCache *c, int32_t b)
{
    int32_t p = c->lru_prev[b], n = c->lru_next[b];
    if (p >= 0) c->lru_next[p] = n;
    else c->lru_head = n;
    if (n >= 0) c->lru_prev[n] = p;
    else c->lru_tail = p;
    c->n_cached--;
}

static void lru_push_tail(KvCache *c, int32_t b)
{
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_cached++;
}

static void unregister(KvCache *c, int32_t b)
{
    int32_t *at = &c->bucket[c->hash[b] & (c->n_buckets - 1)];
    while (*at != b) at = &c->chain[*at];
    *at = c->chain[b];
    c->reg[b] = false;
    c->n_reg--;
}

uint64_t kvcache_block_hash(uint64_t parent, const int32_t *tokens, size_t bs)
{
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < bs; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        h *= 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
    }
    return h;
}

int32_t kvcache_lookup(const KvCache *c, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    for (int32_t b = c->bucket[hash & (c->n_buckets - 1)]; b >= 0; b = c->chain[b])
        if (c->hash[b] == hash && c->parent[b] == parent &&
            !memcmp(c->tokens + (size_t)b * c->bs, tokens, c->bs * sizeof(int32_t)))
            return b;
    return -1;
}

void kvcache_register(KvCache *c, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    if (c->reg[b] || kvcache_lookup(c, hash, parent, tokens) >= 0) return;
    c->hash[b] = hash;
    c->parent[b] = parent;
    memcpy(c->tokens + (size_t)b * c->bs, tokens, c->bs * sizeof(int32_t));
    size_t k = hash & (c->n_buckets - 1);
    c->chain[b] = c->bucket[k];
    c->bucket[k] = b;
    c->reg[b] = true;
    c->n_reg++;
}

void kvcache_drop_cached(KvCache *c)
{
    while (c->lru_head >= 0) {
        int32_t b = c->lru_head;
        lru_remove(c, b);
        unregister(c, b);
        c->free_list[c->n_free++] = b;
    }
    for (int32_t b = 0; b < c->n_blocks; b++)
        if (c->reg[b]) unregister(c, b);
}

/* ---------------------------------------------------------------- sequences */

static void table_room(KvSeq *s, int32_t n)
{
    if (n <= s->cap) return;
    int32_t cap = s->cap ? s->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *nb = td_malloc((size_t)cap * sizeof(int32_t));
    if (s->n_blocks) memcpy(nb, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
    td_free(s->blocks);
    s->blocks = nb;
    s->cap = cap;
}

bool kvcache_reserve(KvCache *c, KvSeq *s, size_t len)
{
    int32_t need = kvcache_blocks_for(c, len) - s->n_blocks;
    if (need <= 0) return true;
    if (need > kvcache_available(c)) return false;
    table_room(s, s->n_blocks + need);
    while (need-- > 0) {
        int32_t b;
        if (c->n_free > 0) b = c->free_list[--c->n_free];
        else {   /* evict the least recently used cached block */
            b = c->lru_head;
            lru_remove(c, b);
            unregister(c, b);
        }
        c->ref[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return true;
}

void kvcache_attach(KvCache *c, KvSeq *s, int32_t b)
{
    table_room(s, s->n_blocks + 1);
    if (c->ref[b]++ == 0) lru_remove(c, b);
    s->blocks[s->n_blocks++] = b;
}

/* Drops one reference to b: unreferenced, a registered block is cached,
 * another freed. */
static void unref(KvCache *c, int32_t b)
{
    if (--c->ref[b] > 0) return;
    if (c->reg[b]) lru_push_tail(c, b);
    else c->free_list[c->n_free++] = b;
}

void kvcache_release(KvCache *c, KvSeq *s)
{
    /* the last block first: it goes to the LRU list before its parents, so
     * it is evicted before them (a prefix outlives its continuations) */
    for (int32_t i = s->n_blocks - 1; i >= 0; i--)
        if (s->blocks[i] >= 0) unref(c, s->blocks[i]);
    td_free(s->blocks);
    memset(s, 0, sizeof *s);
}

int32_t kvcache_trim(KvCache *c, KvSeq *s, size_t keep_from)
{
    const int32_t gone = (int32_t)(keep_from / c->bs) < s->n_blocks ? (int32_t)(keep_from / c->bs) : s->n_blocks;
    int32_t n = 0;
    /* the earliest first, so in the LRU list the window's oldest cached
     * block is evicted before the later ones (a prefix hit needs the chain
     * from block 0: once it breaks, the later blocks age out in turn) */
    for (int32_t i = 0; i < gone; i++)
        if (s->blocks[i] >= 0) {
            unref(c, s->blocks[i]);
            s->blocks[i] = -1;
            n++;
        }
    return n;
}

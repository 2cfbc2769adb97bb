/* infer/kvcache.h - the paged KV cache (vLLM-style PagedAttention layout,
 * Kwon et al. 2023), with automatic prefix caching.
 *
 * Every layer has a pool of n_blocks blocks of bs positions in the layout of
 * core/ops/attention.h (K^T then V, all local kv heads).  A sequence owns a block
 * table: block j of the table holds its positions [j bs, (j+1) bs) in every
 * layer (the same id indexes each layer's pool).  Memory is bounded by the
 * budget and not by the longest possible context of every request.  The
 * blocks hold keys and values in the model's KV dtype (m->attn.kv:
 * float32, bf16 or int8 with a scale per position and head,
 * core/ops/attention.h); nothing here depends on how many bytes a block
 * takes beyond attn_block_bytes.
 *
 * Prefix caching.  A FULL block can be registered under the hash of its
 * tokens chained to the hash of the block before it (the first block's
 * parent is a seed the engine derives from the weights' version, so new
 * weights never meet old keys and values).  Every block has a reference
 * count: a sequence that finds a registered block for its next bs tokens
 * takes a reference to it instead of computing it.  Only full blocks are
 * ever shared, and a shared block is never written again (its positions
 * are all cached), so the last, partial block of a sequence is always its
 * own: there is no copy-on-write.  A registered block whose last reference
 * goes stays cached (a least-recently-used list) until the pool needs a
 * block and no free one is left; then the least recently released is
 * evicted.  A lookup compares the parent's hash and the block's tokens as
 * well as the hash, so only a 64-bit collision of the parent chain could
 * ever give a wrong block.  (Images: their hash will be mixed into the
 * block holding their placeholder tokens; kvcache_block_hash takes the
 * parent, so a caller can fold anything into it.)
 *
 * Sliding windows (a ring).  When every layer attends over a window of W
 * keys (core/ops/attention.h), a sequence's blocks that lie wholly below
 * the first key its next query sees are never read again: kvcache_trim
 * drops them (the table keeps its entry as -1, 4 bytes per block), so a
 * sequence holds at most ceil((W - 1 + n) / bs) + 1 blocks while it feeds n
 * positions a step (decode: n = 1), however long it grows.  A dropped
 * block was full and is registered like any other (the engine registers
 * before it trims), so it stays in the prefix cache as an unreferenced,
 * evictable block: a later request with the same prefix attaches the chain
 * from block 0 as before and trims it in turn; keys and values of a
 * position depend only on the tokens up to it, so sharing stays exact.
 */
#ifndef TANDEM_INFER_KVCACHE_H
#define TANDEM_INFER_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model/model.h"

typedef struct {
    int n_layers;              /* local layers */
    size_t block_bytes;        /* per layer per block */
    size_t bs;                 /* positions per block */
    int32_t n_blocks;
    unsigned char *pool;       /* owned: [n_layers][n_blocks][block_bytes] */
    int32_t *free_list;        /* owned, stack of free ids (unregistered, unreferenced) */
    int32_t n_free;
    /* per block (owned, n_blocks each) */
    int32_t *ref;              /* sequences holding the block */
    bool *reg;                 /* registered in the hash table */
    uint64_t *hash, *parent;   /* its chain hash and its parent's */
    int32_t *tokens;           /* (n_blocks, bs): the tokens of a registered block */
    int32_t *chain;            /* next block in its hash bucket, -1 ends */
    int32_t *lru_prev, *lru_next;
    /* the hash table: n_buckets (a power of two) heads of chains */
    int32_t *bucket;
    size_t n_buckets;
    /* registered, unreferenced blocks: least recently released first */
    int32_t lru_head, lru_tail, n_cached;
    int32_t n_reg;             /* registered blocks, held by sequences or not */
} KvCache;

typedef struct {
    int32_t *blocks;           /* owned block table; -1: dropped by kvcache_trim */
    int32_t n_blocks, cap;
    size_t len;                /* positions stored */
    int32_t n_chained;         /* leading blocks whose chain hash is known (full) */
    uint64_t h_last;           /* the chain hash of block n_chained - 1 */
} KvSeq;

/* Sizes the pool from a byte budget (at least one block). */
void kvcache_init(KvCache *c, const Model *m, size_t budget_bytes);
void kvcache_free(KvCache *c);
/* Bytes kvcache_init(c, m, budget_bytes) allocates (pool and free list)
 * and the blocks it makes (n_blocks may be NULL); m may be a shape. */
size_t kvcache_bytes(const Model *m, size_t budget_bytes, size_t *n_blocks);
/* Bytes one block of all layers takes. */
size_t kvcache_block_bytes(const KvCache *c);
/* Bytes one cached position takes, all local layers (keys, values and
 * their scales). */
static inline size_t kvcache_token_bytes(const KvCache *c) { return kvcache_block_bytes(c) / c->bs; }
/* The pool of local layer i (0-based within the stage). */
static inline void *kvcache_layer(const KvCache *c, int i)
{
    return c->pool + (size_t)i * (size_t)c->n_blocks * c->block_bytes;
}
/* Blocks needed for a sequence to hold `len` positions. */
static inline int32_t kvcache_blocks_for(const KvCache *c, size_t len)
{
    return (int32_t)((len + c->bs - 1) / c->bs);
}
/* Blocks a sequence can get: free ones and cached ones (evicted on use). */
static inline int32_t kvcache_available(const KvCache *c) { return c->n_free + c->n_cached; }
/* Blocks held by sequences. */
static inline int32_t kvcache_used(const KvCache *c) { return c->n_blocks - c->n_free - c->n_cached; }
/* Grows s so that it can hold `len` positions, evicting cached blocks
 * (least recently used first) when no free one is left; false (nothing
 * changed) if there are not enough of both. */
bool kvcache_reserve(KvCache *c, KvSeq *s, size_t len);
/* Drops s's references (a registered block nobody holds any more stays
 * cached; others return to the free list) and frees its table. */
void kvcache_release(KvCache *c, KvSeq *s);
/* The ring of a sliding window: drops s's references to the blocks that
 * hold only positions below keep_from (they become -1 in its table; a
 * registered one stays cached, others are freed).  Returns the blocks
 * dropped. */
int32_t kvcache_trim(KvCache *c, KvSeq *s, size_t keep_from);
/* Blocks a sequence of a ring of window W (0: none) holds at most while
 * it feeds n positions a step with len positions in all. */
static inline int32_t kvcache_ring_blocks(const KvCache *c, size_t window, size_t n, size_t len)
{
    const int32_t all = kvcache_blocks_for(c, len);
    if (!window) return all;
    const int32_t ring = kvcache_blocks_for(c, window - 1 + n) + 1;
    return ring < all ? ring : all;
}

/* The chain hash of a block of c->bs tokens after a block of hash parent. */
uint64_t kvcache_block_hash(uint64_t parent, const int32_t *tokens, size_t bs);
/* The registered block with this hash, parent hash and tokens, or -1. */
int32_t kvcache_lookup(const KvCache *c, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Appends block b (from kvcache_lookup) to s's table with a reference;
 * s must have no partial block (its positions all in full blocks). */
void kvcache_attach(KvCache *c, KvSeq *s, int32_t b);
/* Registers block b (full, written) under hash: a later kvcache_lookup
 * finds it.  Does nothing when a block is already registered under it. */
void kvcache_register(KvCache *c, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Unregisters every block: the cached ones return to the free list, held
 * ones to it when released (new weights: old keys and values are stale). */
void kvcache_drop_cached(KvCache *c);

#endif

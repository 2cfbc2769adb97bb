/* infer/kvcache.h - the paged KV cache (vLLM-style PagedAttention layout,
 * Kwon et al. 2023).
 *
 * Every layer has a pool of n_blocks blocks of bs positions in the layout of
 * core/ops/attention.h (K^T then V, all local kv heads).  A sequence owns a block
 * table: block j of the table holds its positions [j bs, (j+1) bs) in every
 * layer (the same id indexes each layer's pool).  Blocks come from one free
 * list and return to it when the sequence ends, so memory is bounded by the
 * budget and not by the longest possible context of every request.  The
 * blocks hold keys and values in the model's KV dtype (m->attn.kv:
 * float32, bf16 or int8 with a scale per position and head,
 * core/ops/attention.h).
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
    int32_t *free_list;        /* owned, stack of free ids */
    int32_t n_free;
} KvCache;

typedef struct {
    int32_t *blocks;           /* owned block table */
    int32_t n_blocks, cap;
    size_t len;                /* positions stored */
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
/* Grows s so that it can hold `len` positions; false (nothing changed) if
 * the free list is too short. */
bool kvcache_reserve(KvCache *c, KvSeq *s, size_t len);
/* Returns all blocks of s to the free list and frees its table. */
void kvcache_release(KvCache *c, KvSeq *s);

#endif

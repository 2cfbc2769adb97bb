/* core/ops/attention.h - causal grouped-query attention over blocked key/value
 * storage, with an online softmax (FlashAttention-style, Dao et al. 2022).
 *
 *   a_t = softmax_{s <= pos_t}(q_t . k_s * scale) v      scale = 1/sqrt(hd)
 *   head h reads kv head h / (H / Hkv)
 *
 * Keys and values live in blocks of bs positions (bs a multiple of
 * ATTN_TILE): the paged KV cache of the inference engine, or the trainer's
 * per-sequence blocks, which use the same layout.  One block of one layer:
 *
 *     K^T [Hkv][hd][bs]   then   V [Hkv][bs][hd]
 *
 * The kernel walks keys in tiles of ATTN_TILE positions aligned to absolute
 * positions (tile j = positions [16j, 16j+16)), and for each query keeps a
 * running max m, 16 lane sums l_0..l_15 and an output o:
 *
 *     s_j = (q . k_j) * scale       (q . k_j: FMA chain over d = 0..hd-1)
 *     m' = max(m, max_j s_j);  c = exp(m - m');  p_j = exp(s_j - m')
 *     l_j = l_j c + p_j  (lane j: keys at positions = j mod 16)
 *     o = o c + sum_j p_j v_j    (j in order, FMA)
 *
 * with exp the vectorised core/ops/vexp.h (the same bits on every path); at the
 * end l is the lanes summed by core/ops/vec.h's fixed tree,
 * a = o / l and lse = m + log l.  Memory is O(T), never T x T.  A
 * query's result depends only on its position, its q and the keys/values at
 * positions <= its own: a decode step at position p gives the bits of row p
 * of a full forward, whatever the batch around it.
 *
 * KV dtypes (AttnShape.kv, `--kv-dtype`).  The blocks may hold keys and
 * values in bfloat16 or int8 instead (SPEC section 11):
 *
 *     f32   K^T float [Hkv][hd][bs]      V float [Hkv][bs][hd]
 *     bf16  K^T uint16 [Hkv][hd][bs]     V uint16 [Hkv][bs][hd]
 *     int8  K^T int8 [Hkv][hd][bs]       V int8 [Hkv][bs][hd]
 *           then sK float [Hkv][bs]      sV float [Hkv][bs]
 *
 * int8: one scale per (position, kv head) for its key and one for its
 * value, the rule of core/dtype.h (s = amax / 127 over the head's hd
 * values, q = rne(x / s)).  They are rounded once, when stored
 * (attention_kv_store, in every path that stores: the engine's cache, the
 * trainer's or scorer's blocks), and read back as the float32 values they
 * stand for: each key tile (16 positions) is widened into a float32 tile
 * on the stack right before the kernels above run on it, unchanged.  So
 * attention over a narrow cache is bit for bit the float32 attention over
 * the rounded keys and values, and keeps every guarantee above; memory
 * traffic is the narrow bytes.  The backward (training) needs f32 blocks.
 */
#ifndef TANDEM_CORE_OPS_ATTENTION_H
#define TANDEM_CORE_OPS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define ATTN_TILE 16

typedef struct {
    size_t H, Hkv, hd;  /* query heads, key/value heads (H % Hkv == 0), head dim */
    size_t bs;          /* positions per KV block, a multiple of ATTN_TILE */
    Dtype kv;           /* storage of the cached keys and values */
} AttnShape;

/* Bytes of one KV block of one layer. */
static inline size_t attn_block_bytes(const AttnShape *s)
{
    const size_t n = 2 * s->Hkv * s->hd * s->bs;
    return s->kv == DTYPE_INT8 ? n + 2 * s->Hkv * s->bs * sizeof(float) : n * dtype_size(s->kv);
}

/* One sequence of a batch.  Its KV blocks are addressed through a block
 * table of ids into a layer's pool: block id b of layer storage kv starts at
 * kv + b * attn_block_bytes(sh) bytes.  The same table serves every layer. */
typedef struct {
    size_t row;              /* first row of the sequence in q / out / lse / k / v */
    size_t n;                /* rows: positions pos .. pos + n - 1 */
    size_t pos;              /* position of the first row */
    const int32_t *blocks;   /* borrowed: blocks[j] holds positions [j*bs, (j+1)*bs) */
} AttnSeq;

/* Stores k, v rows (n, Hkv*hd) of each sequence (positions pos .. pos+n-1)
 * into its blocks, rounded to sh->kv. */
void attention_kv_store(void *kv, const AttnSeq *seqs, size_t n_seq, const float *restrict k,
                        const float *restrict v, const AttnShape *sh);

/* out (rows, H*hd) overwritten; lse (rows, H), saved for backward, may be
 * NULL; q (rows, H*hd) already rotated.  Keys 0 .. pos+n-1 of every
 * sequence must be stored. */
void attention_forward(float *out, float *lse, const float *restrict q, const void *kv,
                       const AttnSeq *seqs, size_t n_seq, const AttnShape *sh);

/* Backward for sequences that start at position 0 (training), so key s of
 * a sequence is its row s.  Adds into dq (rows, H*hd), dk and dv (rows,
 * Hkv*hd).  Needs q, out, lse of the forward and the stored blocks.
 * Threads split (sequence, kv head) pairs, so it is deterministic.  f32
 * blocks only. */
void attention_backward(float *dq, float *dk, float *dv, const float *restrict dout,
                        const float *restrict q, const float *restrict out,
                        const float *restrict lse, const void *kv, const AttnSeq *seqs,
                        size_t n_seq, const AttnShape *sh);

#endif

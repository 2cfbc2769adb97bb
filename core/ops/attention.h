/* core/ops/attention.h - causal grouped-query attention over blocked key/value
 * storage, with an online softmax (FlashAttention-style, Dao et al. 2022).
 *
 *   a_t = softmax_{s <= pos_t}(q_t . k_s * scale) v
 *   head h reads kv head h / (H / Hkv)
 *
 * q and k have dk dims, v and a have dv (AttnShape; ordinary attention has
 * dk = dv = hd).  scale is the model's (core/model/model.h,
 * model_attn_scale: 1/sqrt(hd) ordinarily).  Below, "hd" is dk for keys
 * and queries and dv for values and outputs.
 *
 * Bidirectional (AttnShape.bidir, the vision encoder, docs/vision.md): a
 * query sees every key of its sequence, s < n, whatever its own position;
 * the sequence starts at position 0 and its keys are its rows.  Key tiles
 * are walked in the same order (0, 1, ..), the last one partial, so the
 * guarantees below hold unchanged (a query's result is a fixed function of
 * its q and its sequence's keys and values).
 *
 * Shared values (AttnShape.v_in_k, multi-head latent attention, docs/mla.md):
 * the value of a key is its first dv dims (dv <= dk) and is not stored
 * apart, so a block holds K^T only and a position costs Hkv dk values.
 * MLA's absorbed form has Hkv = 1, keys [c_kv (dv = kv_lora_rank), k_rope]
 * and values c_kv.  The kernels read a value tile as the transpose of the
 * first dv rows of the key tile; nothing else changes.
 *
 * Keys and values live in blocks of bs positions (bs a multiple of
 * ATTN_TILE): the paged KV cache of the inference engine, or the trainer's
 * per-sequence blocks, which use the same layout.  One block of one layer:
 *
 *     K^T [Hkv][dk][bs]   then   V [Hkv][bs][dv]     (v_in_k: K^T only)
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
 * Sliding window (AttnShape.window = W > 0; HF's sliding_window): a query
 * at position t sees keys lo_t = max(0, t - W + 1) .. t.  A query group
 * walks key tiles from the first tile any of its queries sees; in tiles
 * below a query's lo_t its lanes are masked (p = 0, out of its max), and a
 * tile it sees none of leaves it unchanged (m stays -inf, the correction
 * is 1, o and l stay 0).  So a query's arithmetic is again a fixed
 * function of its position, q and the keys it sees: decode, chunks and the
 * full forward give the same bits, and W >= t + 1 gives the bits of no
 * window.  Tiles wholly outside every window are skipped (forward and
 * backward): cost O(T W), and blocks wholly below a call's first query's
 * lo are never read (the serving cache frees them: infer/kvcache.h).
 *
 * KV dtypes (AttnShape.kv, `--kv-dtype`).  The blocks may hold keys and
 * values in bfloat16 or int8 instead (SPEC section 11):
 *
 *     f32   K^T float [Hkv][dk][bs]      V float [Hkv][bs][dv]
 *     bf16  K^T uint16 [Hkv][dk][bs]     V uint16 [Hkv][bs][dv]
 *     int8  K^T int8 [Hkv][dk][bs]       V int8 [Hkv][bs][dv]
 *           then sK float [Hkv][bs]      sV float [Hkv][bs]
 *     (v_in_k: no V and no sV; a value is read from its key, scale sK)
 *
 * int8: one scale per (position, kv head) for its key and one for its
 * value, the rule of core/dtype.h (s = amax / 127 over the head's dk (dv)
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define ATTN_TILE 16

#define ATTN_HD_MAX 1024   /* largest dk (and dv) */

typedef struct {
    size_t H, Hkv, dk;  /* query heads, key/value heads (H % Hkv == 0), query/key dims per head */
    size_t bs;          /* positions per KV block, a multiple of ATTN_TILE */
    Dtype kv;           /* storage of the cached keys and values */
    size_t dv;          /* value (and output) dims per head */
    float scale;        /* softmax scale, > 0 */
    bool v_in_k;        /* a value is the first dv dims of its key (dv <= dk), not stored */
    size_t window;      /* 0: none; W: a query at t sees keys s with t - W < s <= t */
    bool bidir;         /* every key of the sequence visible, not only s <= t (an encoder); pos must be 0 */
} AttnShape;

/* The first key position a query at position t sees (0 without a window). */
static inline size_t attn_first_key(const AttnShape *s, size_t t)
{
    return s->window && t + 1 > s->window ? t + 1 - s->window : 0;
}

/* Stored values per position and kv head: the key's dk, plus dv unless
 * the value is read from the key. */
static inline size_t attn_pos_values(const AttnShape *s) { return s->dk + (s->v_in_k ? 0 : s->dv); }

/* Bytes of one KV block of one layer. */
static inline size_t attn_block_bytes(const AttnShape *s)
{
    const size_t n = s->Hkv * attn_pos_values(s) * s->bs, n_scales = s->v_in_k ? 1 : 2;
    return s->kv == DTYPE_INT8 ? n + n_scales * s->Hkv * s->bs * sizeof(float) : n * dtype_size(s->kv);
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

/* Stores k rows (n, Hkv*dk) and v rows (n, Hkv*dv) of each sequence
 * (positions pos .. pos+n-1) into its blocks, rounded to sh->kv.  v is not
 * read (may be NULL) when sh->v_in_k. */
void attention_kv_store(void *kv, const AttnSeq *seqs, size_t n_seq, const float *restrict k,
                        const float *restrict v, const AttnShape *sh);

/* attention_kv_store for kv heads [g0, g1) only; the other heads' values
 * in the blocks are not touched. */
void attention_kv_store_heads(void *kv, const AttnSeq *seqs, size_t n_seq, const float *restrict k,
                              const float *restrict v, const AttnShape *sh, size_t g0, size_t g1);

/* Prefetches, for writing, the lines attention_kv_store_heads(.., g0, g1)
 * will store into: a K^T column touches dk lines (one value in each), so
 * a caller with other work to do first (decoding's fused attention block,
 * core/model/layer.c) has them arrive meanwhile.  Changes nothing. */
void attention_kv_store_prefetch(void *kv, const AttnSeq *seqs, size_t n_seq, const AttnShape *sh, size_t g0,
                                 size_t g1);

/* out (rows, H*dv) overwritten; lse (rows, H), saved for backward, may be
 * NULL; q (rows, H*dk) already rotated.  Keys 0 .. pos+n-1 of every
 * sequence must be stored; with a window W only keys from
 * attn_first_key(sh, pos) rounded down to a tile are read, so blocks wholly
 * below that may be gone (their table entries are never read). */
void attention_forward(float *out, float *lse, const float *restrict q, const void *kv,
                       const AttnSeq *seqs, size_t n_seq, const AttnShape *sh);

/* attention_forward for the query heads of kv heads [g0, g1) only (heads
 * g0 H/Hkv .. g1 H/Hkv - 1 of out and lse; the others are not touched),
 * serially on the calling thread: a piece of a caller's own pool region
 * (core/model/layer.c, decoding's fused attention block).  Each query's
 * arithmetic is attention_forward's, so the bits are its bits. */
void attention_forward_heads(float *out, float *lse, const float *restrict q, const void *kv,
                             const AttnSeq *seqs, size_t n_seq, const AttnShape *sh, size_t g0, size_t g1);

/* Backward for sequences that start at position 0 (training), so key s of
 * a sequence is its row s.  Adds into dq (rows, H*dk), dk (rows, Hkv*dk)
 * and dv (rows, Hkv*dv); with v_in_k the gradient of a stored key is dk
 * plus dv on its first dv dims (the caller adds them).  Needs q, out, lse of the forward and the stored blocks.
 * Threads split (sequence, kv head) pairs, so it is deterministic.  f32
 * blocks only. */
void attention_backward(float *dq, float *dk, float *dv, const float *restrict dout,
                        const float *restrict q, const float *restrict out,
                        const float *restrict lse, const void *kv, const AttnSeq *seqs,
                        size_t n_seq, const AttnShape *sh);

/* The same backward for chunks of queries (context parallelism,
 * core/model/layer.h CpView): sequence i is rows row .. row+n-1 of q,
 * out, lse, dout, dq at positions pos .. pos+n-1 (pos a multiple of
 * ATTN_TILE) against the keys 0 .. pos+n-1 in its blocks, whose gradients
 * go to rows krow[i] + s of dk and dv. */
void attention_backward_chunks(float *dq, float *dk, float *dv, const float *restrict dout,
                               const float *restrict q, const float *restrict out,
                               const float *restrict lse, const void *kv, const AttnSeq *seqs,
                               size_t n_seq, const size_t *krow, const AttnShape *sh);

#endif

/* core/ops/attention.c - blocked causal GQA attention, forward and backward
 * (attention.h).
 *
 * Forward.  A query's arithmetic is the contract of attention.h, with the
 * exp of core/ops/vexp.h and one reading of "sum_j p_j" that is again a fixed
 * function of the query: l is kept as 16 lane sums, lane j holding the keys
 * at positions = j (mod 16),
 *
 *     lv_j = lv_j c + p_j     (p_j = 0 for keys the query does not see)
 *     l    = lanes combined by the tree of core/ops/vec.h, once, at the end
 *
 * Per tile: s_j (FMA chain over d from 0, then * scale), m' = max(m, max_j
 * s_j), c = exp(m - m'), p_j = exp(s_j - m'), o = o c, then o = fma(p_j, v_j,
 * o) for j in order.  Only the keys a query sees enter its max, its p and
 * its o; c = exp(0) = 1 when the max did not move, so multiplying by it
 * changes nothing.  A sliding window (attention.h) masks the lanes below
 * a query's first key the same way (tile_lo), starts a group at the first
 * tile any of its queries sees, and a query that has seen no key yet keeps
 * m = -inf with the correction 1 (no_keys_yet).  The backward skips the
 * (query tile, key tile) blocks outside every window (bw_first_kt,
 * bw_end_qt): they would add exact zeros.
 *
 * Work item: (sequence, kv head g, query tile qt), kv head outer so that
 * consecutive items reuse the same keys: the rows of the tile, for the
 * R = H/Hkv heads of g, in groups of up to GQ_MAX queries that walk the key
 * tiles 0..qt together.  Scores are computed for 8 queries x 2 tiles side by
 * side (16 independent FMA chains with AVX-512; AVX2 splits them into
 * smaller blocks), or, when a group has fewer than 5 queries (decode: one
 * row, R heads), for up to 8 tiles of each query; the
 * softmax updates of those tiles then run with only the max as a chain
 * (all their exps are independent), and o is updated tile after tile.  None
 * of this changes a query's own arithmetic, so a decode step gives the bits
 * of the full forward row.  Causal items cost in proportion to qt + 1; they
 * are dealt to threads in a snake order (0 1 1 0 0 1 ...), which balances a
 * run of similar costs.  Which thread computes an item never matters.
 *
 * Backward (a sequence from position 0, or a chunk of queries at a tile-
 * aligned pos > 0 against keys from 0), per (query tile, key tile) block,
 * p_ij = exp(s_ij - lse_i), D_i = dout_i . out_i:
 *
 *     dp_ij = dout_i . v_j       ds_ij = p_ij (dp_ij - D_i) scale
 *     dv_j += p_ij dout_i        dk_j += ds_ij q_i        dq_i += ds_ij k_j
 *
 * Every gradient element is one FMA chain starting from its incoming value:
 * dq_i over keys j in order, dk_j and dv_j over queries i in order (query
 * tiles in order; in a tile, rows then heads).  Work is either one item per
 * (sequence, kv head), key tiles outer, or, when those items are too few to
 * keep the threads busy, two passes (dk, dv per key tile; dq per query
 * tile) that recompute the blocks; both visit every chain in the same order,
 * so the gradients are the same bits for any thread count.  Key tiles go in
 * spans of up to 16 (bw_span_tiles): one pass over the later query rows
 * serves the whole span, each query group meeting the tiles it sees in
 * increasing order, which keeps every chain's order and divides the query
 * traffic (beyond L2 at long T) by the span.  The two-pass schedule's dq
 * items are spans of query tiles the same way, each key tile gathered once
 * for the span.
 *
 * Key and value widths.  Scores run over dk dims, p v and the outputs over
 * dv (ordinarily both hd).  With v_in_k (MLA's latent cache) a value tile is
 * the transpose of the first dv rows of the (widened) key tile, built once
 * per tile and group (values_of_keys); the backward's V^T copy is those
 * K^T rows themselves.  No arithmetic changes: a query's chains are the
 * same whichever storage the values come from.
 *
 * Narrow caches (bf16, int8: attention.h).  Keys and values stand for the
 * float32 values they widen to (bf16: the bits shifted up 16; int8:
 * (float)q * its position's scale), so a narrow cache's attention is the
 * float32 attention over those values.  The AVX-512 and AVX2 kernels read
 * a narrow block in place and widen each row in registers (NarrowTile);
 * portable C widens a tile into a float32 copy on the stack first
 * (keys_f32, values_f32), and so do MLA's caches (v_in_k) on every path.
 * Both give the same values, so the same bits.
 *
 * Three kernel paths compute the same operations: AVX-512, AVX2 + FMA (a
 * tile's 16 keys as two 8-lane halves, register blocks of at most 12
 * chains: 16 ymm registers) and portable C; tests/test_attention.c
 * compares the compiled vector path with the portable one bit for bit.
 */
#include "core/ops/attention.h"
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/vec.h"
#include "core/ops/vexp.h"

#include <math.h>
#include <string.h>

/* TANDEM_PORTABLE forces the portable kernels (tests compare them with the
 * vector ones). */
#if defined(__AVX512F__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define ATTN_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#define ATTN_AVX2 1
#endif

#define HD_MAX ATTN_HD_MAX
#define GQ_MAX 64          /* queries of one forward group / backward block */
#define GQ_FLOATS 4096     /* o of a forward group: queries * dv <= this */
#define SC_PAIRS 8         /* (query, tile) score chains computed together */
#define D_CACHE 8192       /* backward: D of up to this many queries kept per item */
#define BW_SPAN_MAX 16     /* backward: most key tiles served by one pass over the queries */
#define BW_KEY_FLOATS 65536 /* backward: their copies (K, V^T: 16 (dk + dv) floats a tile), 256 KB */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Start of the block holding position p of sequence s. */
static inline const unsigned char *block_at(const void *kv, const AttnSeq *s, const AttnShape *sh, size_t p)
{
    return (const unsigned char *)kv + (size_t)s->blocks[p / sh->bs] * attn_block_bytes(sh);
}

/* Element offsets of the K^T and V arrays of (kv head g, position offset
 * off) inside a block (V: not with v_in_k), and its int8 scales. */
static inline size_t kt_at(const AttnShape *sh, size_t g, size_t off) { return g * sh->dk * sh->bs + off; }
static inline size_t v_at(const AttnShape *sh, size_t g, size_t off)
{
    return sh->Hkv * sh->dk * sh->bs + (g * sh->bs + off) * sh->dv;
}
static inline const float *scales_of(const unsigned char *blk, const AttnShape *sh)
{
    /* sK [Hkv][bs], then sV [Hkv][bs] unless v_in_k */
    return (const float *)(const void *)(blk + sh->Hkv * attn_pos_values(sh) * sh->bs);
}

/* f32 blocks: K^T of tile kt of kv head g, [d * bs + j]. */
static inline const float *tile_kt(const void *kv, const AttnSeq *s, const AttnShape *sh,
                                   size_t g, size_t kt)
{
    size_t p = kt * ATTN_TILE;
    const float *blk = (const float *)(const void *)block_at(kv, s, sh, p);
    return blk + kt_at(sh, g, p % sh->bs);
}

/* f32 blocks (not v_in_k): V of tile kt of kv head g, [j * dv + d]. */
static inline const float *tile_v(const void *kv, const AttnSeq *s, const AttnShape *sh,
                                  size_t g, size_t kt)
{
    size_t p = kt * ATTN_TILE;
    const float *blk = (const float *)(const void *)block_at(kv, s, sh, p);
    return blk + v_at(sh, g, p % sh->bs);
}

/* A key or value tile of a narrow (bf16, int8) block: its first element
 * and, for int8, its 16 positions' scales. */
typedef struct { const void *p; const float *sc; } NarrowTile;

/* Narrow blocks: K^T of tile kt of kv head g [d * bs + j] and (not v_in_k)
 * its V [j * dv + d], with their int8 scales. */
static inline NarrowTile narrow_kt(const void *kv, const AttnSeq *s, const AttnShape *sh, size_t g, size_t kt)
{
    const size_t p = kt * ATTN_TILE, off = p % sh->bs;
    const unsigned char *blk = block_at(kv, s, sh, p);
    return (NarrowTile){ blk + kt_at(sh, g, off) * dtype_size(sh->kv),
                         sh->kv == DTYPE_INT8 ? scales_of(blk, sh) + g * sh->bs + off : NULL };
}

static inline NarrowTile narrow_v(const void *kv, const AttnSeq *s, const AttnShape *sh, size_t g, size_t kt)
{
    const size_t p = kt * ATTN_TILE, off = p % sh->bs;
    const unsigned char *blk = block_at(kv, s, sh, p);
    return (NarrowTile){ blk + v_at(sh, g, off) * dtype_size(sh->kv),
                         sh->kv == DTYPE_INT8 ? scales_of(blk, sh) + sh->Hkv * sh->bs + g * sh->bs + off : NULL };
}

/* v_in_k: the value tile [j][dv] of a float32 key tile K^T (row stride
 * ld) into buf (ATTN_TILE * dv floats): its first dv rows, transposed. */
static const float *values_of_keys(float *buf, const float *kt, size_t ld, size_t dv)
{
    for (size_t d = 0; d < dv; d++)
        for (size_t j = 0; j < ATTN_TILE; j++) buf[j * dv + d] = kt[d * ld + j];
    return buf;
}

/* Key tile kt of kv head g as float32 K^T: the block itself (f32, row
 * stride bs) or widened into buf (ATTN_TILE * hd floats, row stride
 * ATTN_TILE).  *ld: the row stride. */
static const float *keys_f32(float *buf, const void *kv, const AttnSeq *s, const AttnShape *sh, size_t g,
                             size_t kt, size_t *ld)
{
    if (sh->kv == DTYPE_F32) {
        *ld = sh->bs;
        return tile_kt(kv, s, sh, g, kt);
    }
    const size_t bs = sh->bs, hd = sh->dk;
    const NarrowTile t = narrow_kt(kv, s, sh, g, kt);
    *ld = ATTN_TILE;
    if (sh->kv == DTYPE_BF16) {
        const uint16_t *k = t.p;
        if (bs == ATTN_TILE)   /* the tile's rows lie end to end (the default block): one call */
            dtype_bf16_to_f32(buf, k, hd * ATTN_TILE);
        else
            for (size_t d = 0; d < hd; d++) dtype_bf16_to_f32(buf + d * ATTN_TILE, k + d * bs, ATTN_TILE);
    } else {
        const int8_t *k = t.p;
        for (size_t d = 0; d < hd; d++)
            for (size_t j = 0; j < ATTN_TILE; j++) buf[d * ATTN_TILE + j] = (float)k[d * bs + j] * t.sc[j];
    }
    return buf;
}

/* Value tile kt of kv head g as float32 V [j][dv]: the block itself or
 * widened into buf (ATTN_TILE * dv floats).  Not with v_in_k. */
static const float *values_f32(float *buf, const void *kv, const AttnSeq *s, const AttnShape *sh, size_t g,
                               size_t kt)
{
    if (sh->kv == DTYPE_F32) return tile_v(kv, s, sh, g, kt);
    const size_t hd = sh->dv;
    const NarrowTile t = narrow_v(kv, s, sh, g, kt);
    if (sh->kv == DTYPE_BF16) {
        dtype_bf16_to_f32(buf, t.p, ATTN_TILE * hd);
    } else {
        const int8_t *v = t.p;
        for (size_t j = 0; j < ATTN_TILE; j++) dtype_q8_dequantize(buf + j * hd, v + j * hd, t.sc[j], hd);
    }
    return buf;
}

void attention_kv_store_heads(void *kv, const AttnSeq *seqs, size_t n_seq, const float *restrict k,
                              const float *restrict v, const AttnShape *sh, size_t g0, size_t g1)
{
    const size_t hd = sh->dk, dv = sh->dv, bs = sh->bs, kvw = sh->Hkv * hd, vw = sh->Hkv * dv;
    const bool sep = !sh->v_in_k;   /* values stored apart */
    for (size_t si = 0; si < n_seq; si++) {
        const AttnSeq *s = &seqs[si];
        for (size_t r = 0; r < s->n; r++) {
            size_t p = s->pos + r;
            unsigned char *blk = (unsigned char *)kv + (size_t)s->blocks[p / bs] * attn_block_bytes(sh);
            size_t off = p % bs;
            const float *kr = k + (s->row + r) * kvw, *vr = sep ? v + (s->row + r) * vw : NULL;
            for (size_t g = g0; g < g1; g++) {
                const float *kg = kr + g * hd, *vg = sep ? vr + g * dv : NULL;
                if (sh->kv == DTYPE_F32) {
                    float *kt = (float *)(void *)blk + kt_at(sh, g, off);
                    for (size_t d = 0; d < hd; d++) kt[d * bs] = kg[d];
                    if (sep) memcpy((float *)(void *)blk + v_at(sh, g, off), vg, dv * sizeof(float));
                } else if (sh->kv == DTYPE_BF16) {
                    uint16_t *kt = (uint16_t *)(void *)blk + kt_at(sh, g, off);
                    for (size_t d = 0; d < hd; d++) kt[d * bs] = dtype_bf16_from_f32(kg[d]);
                    if (sep) {
                        uint16_t *vt = (uint16_t *)(void *)blk + v_at(sh, g, off);
                        for (size_t d = 0; d < dv; d++) vt[d] = dtype_bf16_from_f32(vg[d]);
                    }
                } else {
                    int8_t q[HD_MAX];
                    float *sc = (float *)(uintptr_t)scales_of(blk, sh);
                    int8_t *kt = (int8_t *)blk + kt_at(sh, g, off);
                    sc[g * bs + off] = dtype_q8_quantize(q, kg, hd);
                    for (size_t d = 0; d < hd; d++) kt[d * bs] = q[d];
                    if (sep) sc[sh->Hkv * bs + g * bs + off] = dtype_q8_quantize((int8_t *)blk + v_at(sh, g, off), vg, dv);
                }
            }
        }
    }
}

void attention_kv_store(void *kv, const AttnSeq *seqs, size_t n_seq, const float *restrict k,
                        const float *restrict v, const AttnShape *sh)
{
    attention_kv_store_heads(kv, seqs, n_seq, k, v, sh, 0, sh->Hkv);
}

void attention_kv_store_prefetch(void *kv, const AttnSeq *seqs, size_t n_seq, const AttnShape *sh, size_t g0,
                                 size_t g1)
{
    const size_t es = dtype_size(sh->kv), bs = sh->bs, step = td_max(64 / (bs * es), 1);   /* K^T rows a line */
    for (size_t si = 0; si < n_seq; si++) {
        const AttnSeq *s = &seqs[si];
        for (size_t r = 0; r < s->n; r++) {
            const size_t p = s->pos + r, off = p % bs;
            const unsigned char *blk = block_at(kv, s, sh, p);
            for (size_t g = g0; g < g1; g++) {
                const unsigned char *kt = blk + kt_at(sh, g, off) * es;
                for (size_t d = 0; d < sh->dk; d += step) __builtin_prefetch(kt + d * bs * es, 1, 3);
                if (!sh->v_in_k) {
                    const unsigned char *v = blk + v_at(sh, g, off) * es;
                    for (size_t b = 0; b < sh->dv * es; b += 64) __builtin_prefetch(v + b, 1, 3);
                }
                if (sh->kv == DTYPE_INT8) {
                    const float *sc = scales_of(blk, sh);
                    __builtin_prefetch(sc + g * bs + off, 1, 3);
                    if (!sh->v_in_k) __builtin_prefetch(sc + (sh->Hkv + g) * bs + off, 1, 3);
                }
            }
        }
    }
}

/* Number of keys of tile kt visible from position p (p >= 16 kt). */
static inline size_t tile_valid(size_t kt, size_t p)
{
    size_t last = p - kt * ATTN_TILE;
    return last >= ATTN_TILE ? ATTN_TILE : last + 1;
}

/* Tiles scored together: 8 or more score chains in flight. */
static inline size_t tiles_per_block(size_t nq)
{
    return nq >= 5 ? 2 : (SC_PAIRS + nq - 1) / nq;
}

/* ================================================================ kernels
 *
 * scores       s[t ts + 16 v + j] = (q_v . k_j of tile t) * scale, nq <= 8
 *              queries x nt <= tiles_per_block(nq) tiles
 * softmax_step the online-softmax updates of nq queries over nt tiles
 * pv           o_v = o_v cf_v, then o_v = fma(p_vj, x_j, o_v), j < nj
 * acc_keys     out_j += sum_i C_ij x_i (i in order), j < nk
 * div_row      dst = o / l
 * row_dot      vec_dot (backward's D)
 * bw_ds        p = exp(s - lse) on visible keys, ds = p (dp - D) scale
 */

/* The running max of nq queries over nt tiles in order: mo[u] = m before
 * tile t, mx[u] = max(m, mx[u]) after it (u = t nq + v). */
static inline void running_max(float *mo, float *mx, float *m, size_t nq, size_t nt)
{
    for (size_t v = 0; v < nq; v++)
        for (size_t t = 0; t < nt; t++) {
            const size_t u = t * nq + v;
            mo[u] = m[v];
            m[v] = m[v] > mx[u] ? m[v] : mx[u];   /* _mm512_max_ps(m, mx) */
            mx[u] = m[v];
        }
}

/* A query that has seen no key yet (a window's leading tiles in a group
 * whose other queries see them): m stays -inf, and its step must change
 * nothing.  exp(-inf - -inf) would be NaN; with both 0 the correction is 1,
 * its o and l (still 0) stay 0 and its masked p are 0. */
static inline void no_keys_yet(float *mo, float *mx, size_t n)
{
    for (size_t u = 0; u < n; u++)
        if (mx[u] == -INFINITY) mo[u] = mx[u] = 0.0f;
}

#ifdef ATTN_AVX512

/* A vector loaded once and used by several FMAs: without this GCC folds the
 * load into each FMA's memory operand, and the load ports become the limit. */
#define KEEP_IN_REG(x) __asm__("" : "+v"(x))

/* The 16 values of narrow tile row at e (bf16, int8 with the 16 scales sc),
 * masked to the lanes of m, as float32: exactly the values keys_f32 and
 * values_f32 write (bf16: the bits shifted up 16; int8: (float)q * scale). */
ALWAYS_INLINE __m512 widen16(const int DT, const void *e, __mmask16 m, __m512 sc)
{
    if (DT == DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, e)), 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, e))), sc);
}

/* The kernels below read key and value tiles as float32 (kt, x) or, with
 * DT = DTYPE_BF16 or DTYPE_INT8, straight from a narrow cache block (kn,
 * xn), widened in registers: the same float32 values as a widened copy, so
 * the same bits, without writing and reading back a float32 tile. */
ALWAYS_INLINE void scores_blk_dt(const int DT, const int NQ, const int NT, float *s, size_t ts, const float *const *q,
                                 const float *const *kt, const NarrowTile *kn, size_t ld, size_t hd, float scale)
{
    const size_t es = dtype_size((Dtype)DT);
    __m512 ksc[8];   /* int8: each tile's key scales (lane j: position j) */
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) ksc[t] = DT == DTYPE_INT8 ? _mm512_loadu_ps(kn[t].sc) : _mm512_setzero_ps();
    __m512 acc[8][8];   /* fixed sizes: a VLA would live in memory */
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int v = 0; v < NQ; v++) acc[t][v] = _mm512_setzero_ps();
    for (size_t d = 0; d < hd; d++) {
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m512 k = DT == DTYPE_F32 ? _mm512_loadu_ps(kt[t] + d * ld)
                                       : widen16(DT, (const char *)kn[t].p + d * ld * es, 0xFFFF, ksc[t]);
            KEEP_IN_REG(k);
#pragma GCC unroll 8
            for (int v = 0; v < NQ; v++) acc[t][v] = _mm512_fmadd_ps(_mm512_set1_ps(q[v][d]), k, acc[t][v]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int v = 0; v < NQ; v++) _mm512_storeu_ps(s + t * ts + 16 * v, _mm512_mul_ps(acc[t][v], sc));
}

/* nt <= NT tiles: tiles past nt repeat the last one (their chains run in
 * the shadow of the others' latency) and are not stored. */
ALWAYS_INLINE void scores_multi_dt(const int DT, const int NQ, const int NT, float *s, size_t ts, const float *const *q,
                                   const float *const *kt, const NarrowTile *kn, size_t nt, size_t ld, size_t hd,
                                   float scale)
{
    if ((size_t)NT == nt) {
        scores_blk_dt(DT, NQ, NT, s, ts, q, kt, kn, ld, hd, scale);
        return;
    }
    const float *tiles[8];
    NarrowTile ntiles[8];
    float buf[8 * 8 * 16] __attribute__((aligned(64)));
    nt = nt < (size_t)NT ? nt : (size_t)NT;
    for (int t = 0; t < NT; t++) {
        const size_t u = (size_t)t < nt ? (size_t)t : nt - 1;
        tiles[t] = DT == DTYPE_F32 ? kt[u] : NULL;
        ntiles[t] = DT == DTYPE_F32 ? (NarrowTile){ NULL, NULL } : kn[u];
    }
    scores_blk_dt(DT, NQ, NT, buf, NQ * 16, q, tiles, ntiles, ld, hd, scale);
    for (size_t t = 0; t < nt; t++) memcpy(s + t * ts, buf + t * NQ * 16, NQ * 16 * sizeof(float));
}

/* s[t ts + 16 v + j], nq <= 8 queries, nt <= tiles_per_block(nq) tiles:
 * float32 key tiles kt, or narrow ones kn (DT = DTYPE_BF16, DTYPE_INT8),
 * row stride ld elements. */
ALWAYS_INLINE void scores_dt(const int DT, float *s, size_t ts, const float *const *q, size_t nq,
                             const float *const *kt, const NarrowTile *kn, size_t nt, size_t ld, size_t hd, float scale)
{
    if (nt == 1) {
        switch (nq) {
        case 1:  scores_blk_dt(DT, 1, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        case 2:  scores_blk_dt(DT, 2, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        case 3:  scores_blk_dt(DT, 3, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        case 4:  scores_blk_dt(DT, 4, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        case 5:  scores_blk_dt(DT, 5, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        case 6:  scores_blk_dt(DT, 6, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        case 7:  scores_blk_dt(DT, 7, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        default: scores_blk_dt(DT, 8, 1, s, ts, q, kt, kn, ld, hd, scale); return;
        }
    }
    switch (nq) {
    case 1:  scores_multi_dt(DT, 1, 8, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 2:  scores_multi_dt(DT, 2, 4, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 3:  scores_multi_dt(DT, 3, 3, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 4:  scores_multi_dt(DT, 4, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 5:  scores_multi_dt(DT, 5, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 6:  scores_multi_dt(DT, 6, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 7:  scores_multi_dt(DT, 7, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    default: scores_multi_dt(DT, 8, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    }
}

/* max over the 16 lanes, lanes paired j ^ 8, j ^ 4, j ^ 2, j ^ 1 */
ALWAYS_INLINE float hmax16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
    x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));
    x = _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));
    return _mm512_cvtss_f32(x);
}

static inline __mmask16 lanes_below(size_t n) { return n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1); }

/* Lanes lo .. hi - 1. */
static inline __mmask16 lanes_in(size_t lo, size_t hi) { return (__mmask16)(lanes_below(hi) & ~lanes_below(lo)); }

/* Online-softmax steps of nq queries over nt consecutive tiles (u = t nq + v):
 * s, p (nt nq, 16) scaled scores and probabilities, cf (nt nq) corrections,
 * m (nq), lv (nq, 16).  nlo, nval (nt nq): the keys lanes nlo[u] ..
 * nval[u] - 1 are the ones query u sees, NULL = all 16.
 * The exps of all tiles are independent: only the max is a chain. */
static void softmax_step(float *p, float *cf, float *m, float *lv, const float *s,
                         const size_t *nlo, const size_t *nval, size_t nq, size_t nt)
{
    float mx[2 * GQ_MAX], mo[2 * GQ_MAX];
    const size_t n = nt * nq;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (size_t u = 0; u < n; u++) {
        __m512 x = _mm512_loadu_ps(s + 16 * u);
        if (nval) x = _mm512_mask_mov_ps(ninf, lanes_in(nlo[u], nval[u]), x);
        mx[u] = hmax16(x);
    }
    running_max(mo, mx, m, nq, nt);
    if (nval) no_keys_yet(mo, mx, n);
    for (size_t u0 = 0; u0 < n; u0 += 16) {   /* c = exp(m - m'), 16 at once */
        const __mmask16 k = lanes_below(n - u0);
        const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, mo + u0), _mm512_maskz_loadu_ps(k, mx + u0));
        _mm512_mask_storeu_ps(cf + u0, k, vexp16(d));
    }
    for (size_t t = 0; t < nt; t++)
        for (size_t v = 0; v < nq; v++) {
            const size_t u = t * nq + v;
            __m512 e = vexp16(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * u), _mm512_set1_ps(mx[u])));
            if (nval) e = _mm512_maskz_mov_ps(lanes_in(nlo[u], nval[u]), e);
            const __m512 l = _mm512_mul_ps(_mm512_loadu_ps(lv + 16 * v), _mm512_set1_ps(cf[u]));
            _mm512_storeu_ps(lv + 16 * v, _mm512_add_ps(l, e));
            _mm512_storeu_ps(p + 16 * u, e);
        }
}

/* NQ queries x NC chunks of 16 (the last one masked by ml) at offset off;
 * the values x (f32) or xn (DT = DTYPE_BF16, DTYPE_INT8). */
ALWAYS_INLINE void pv_blk_dt(const int DT, const int NQ, const int NC, float *const *o, const float *p, const float *cf,
                             const float *x, const NarrowTile *xn, size_t ldx, size_t nj, size_t off, __mmask16 ml)
{
    const size_t es = dtype_size((Dtype)DT);
    __m512 acc[8][4];
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) mk[c] = c == NC - 1 ? ml : 0xFFFF;
#pragma GCC unroll 8
    for (int v = 0; v < NQ; v++) {
        const __m512 cv = _mm512_set1_ps(cf[v]);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            acc[v][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[c], o[v] + off + 16 * c), cv);
    }
    for (size_t j = 0; j < nj; j++) {
        __m512 xj[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            if (DT != DTYPE_F32)
                xj[c] = widen16(DT, (const char *)xn->p + (j * ldx + off + 16 * c) * es, mk[c],
                                DT == DTYPE_INT8 ? _mm512_set1_ps(xn->sc[j]) : _mm512_setzero_ps());
            else
                xj[c] = _mm512_maskz_loadu_ps(mk[c], x + j * ldx + off + 16 * c);
            KEEP_IN_REG(xj[c]);
        }
#pragma GCC unroll 8
        for (int v = 0; v < NQ; v++) {
            const __m512 pj = _mm512_set1_ps(p[16 * v + j]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) acc[v][c] = _mm512_fmadd_ps(pj, xj[c], acc[v][c]);
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < NQ; v++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) _mm512_mask_storeu_ps(o[v] + off + 16 * c, mk[c], acc[v][c]);
}

#define PV_CASE(NQ, NC) case (NC) * 16 + (NQ): pv_blk_dt(DT, NQ, NC, o + v0, p + 16 * v0, cf + v0, x, xn, ldx, nj, off, ml); break
/* o[v] (hd) = o[v] cf[v] + sum_{j < nj} p[16 v + j] x[j ldx + .], v < nq.
 * Chunk groups of up to 64 floats; up to 8 queries (4 for wide groups). */
ALWAYS_INLINE void pv_dt(const int DT, float *const *o, const float *p, const float *cf, const float *x,
                         const NarrowTile *xn, size_t ldx, size_t nq, size_t hd, size_t nj)
{
    for (size_t off = 0; off < hd; off += 64) {
        const size_t w = td_min(64, hd - off), nc = (w + 15) / 16, qmax = nc <= 2 ? 8 : 4;
        const __mmask16 ml = lanes_below(w - 16 * (nc - 1));
        for (size_t v0 = 0; v0 < nq; v0 += qmax) {
            switch (nc * 16 + td_min(qmax, nq - v0)) {
            PV_CASE(1, 1); PV_CASE(2, 1); PV_CASE(3, 1); PV_CASE(4, 1);
            PV_CASE(5, 1); PV_CASE(6, 1); PV_CASE(7, 1); PV_CASE(8, 1);
            PV_CASE(1, 2); PV_CASE(2, 2); PV_CASE(3, 2); PV_CASE(4, 2);
            PV_CASE(5, 2); PV_CASE(6, 2); PV_CASE(7, 2); PV_CASE(8, 2);
            PV_CASE(1, 3); PV_CASE(2, 3); PV_CASE(3, 3); PV_CASE(4, 3);
            PV_CASE(1, 4); PV_CASE(2, 4); PV_CASE(3, 4); PV_CASE(4, 4);
            }
        }
    }
}
#undef PV_CASE

/* JK keys x NC chunks: out[j] += sum_i C[16 i + j] x_i, i < nq. */
ALWAYS_INLINE void acc_blk(const int JK, const int NC, float *const *out, const float *C,
                           const float *const *x, size_t nq, size_t off, __mmask16 ml)
{
    __m512 acc[4][4];
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) mk[c] = c == NC - 1 ? ml : 0xFFFF;
#pragma GCC unroll 4
    for (int j = 0; j < JK; j++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) acc[j][c] = _mm512_maskz_loadu_ps(mk[c], out[j] + off + 16 * c);
    for (size_t i = 0; i < nq; i++) {
        __m512 xi[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            xi[c] = _mm512_maskz_loadu_ps(mk[c], x[i] + off + 16 * c);
            KEEP_IN_REG(xi[c]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < JK; j++) {
            const __m512 cij = _mm512_set1_ps(C[16 * i + j]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) acc[j][c] = _mm512_fmadd_ps(cij, xi[c], acc[j][c]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < JK; j++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) _mm512_mask_storeu_ps(out[j] + off + 16 * c, mk[c], acc[j][c]);
}

#define ACC_CASE(JK, NC) case (NC) * 16 + (JK): acc_blk(JK, NC, out + j0, C + j0, x, nq, off, ml); break
/* out[j] (hd) += sum_{i < nq} C[16 i + j] x[i], j < nk. */
static void acc_keys(float *const *out, size_t nk, const float *C, const float *const *x, size_t nq, size_t hd)
{
    for (size_t off = 0; off < hd; off += 64) {
        const size_t w = td_min(64, hd - off), nc = (w + 15) / 16;
        const __mmask16 ml = lanes_below(w - 16 * (nc - 1));
        for (size_t j0 = 0; j0 < nk; j0 += 4) {
            switch (nc * 16 + td_min(4, nk - j0)) {
            ACC_CASE(1, 1); ACC_CASE(2, 1); ACC_CASE(3, 1); ACC_CASE(4, 1);
            ACC_CASE(1, 2); ACC_CASE(2, 2); ACC_CASE(3, 2); ACC_CASE(4, 2);
            ACC_CASE(1, 3); ACC_CASE(2, 3); ACC_CASE(3, 3); ACC_CASE(4, 3);
            ACC_CASE(1, 4); ACC_CASE(2, 4); ACC_CASE(3, 4); ACC_CASE(4, 4);
            }
        }
    }
}
#undef ACC_CASE

/* dst[d] = o[d] / l, d < hd. */
static inline void div_row(float *dst, const float *o, float l, size_t hd)
{
    const __m512 lv = _mm512_set1_ps(l);
    for (size_t d = 0; d < hd; d += 16) {
        const __mmask16 k = lanes_below(hd - d);
        _mm512_mask_storeu_ps(dst + d, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, o + d), lv));
    }
}

/* vec_dot(x, y, hd) of core/ops/vec.h, its 16 lane chains in one vector. */
static inline float row_dot(const float *x, const float *y, size_t hd)
{
    __m512 acc = _mm512_setzero_ps();
    size_t d = 0;
    for (; d + 16 <= hd; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + d), _mm512_loadu_ps(y + d), acc);
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    float s = vec_lanes_combine(lanes);
    for (; d < hd; d++) s = fmaf(x[d], y[d], s);
    return s;
}

/* One query of a backward block: p and ds (16 lanes) from s and dp. */
static inline void bw_ds(float *p, float *ds, const float *s, const float *dp, float lse, float D,
                         size_t nlo, size_t nval, float scale)
{
    __m512 e = vexp16(_mm512_sub_ps(_mm512_loadu_ps(s), _mm512_set1_ps(lse)));
    e = _mm512_maskz_mov_ps(lanes_in(nlo, nval), e);
    const __m512 t = _mm512_sub_ps(_mm512_loadu_ps(dp), _mm512_set1_ps(D));
    _mm512_storeu_ps(p, e);
    _mm512_storeu_ps(ds, _mm512_mul_ps(_mm512_mul_ps(e, t), _mm512_set1_ps(scale)));
}

#elif defined(ATTN_AVX2)

/* AVX2 + FMA: the operations of the AVX-512 kernels, a 16-key tile in two
 * 8-lane halves (keys 0-7, 8-15) and rows in chunks of 8 floats.  16 ymm
 * registers: blocks keep at most 12 accumulators. */

/* A vector loaded once and used by several FMAs (see the AVX-512 path). */
#define KEEP_IN_REG(x) __asm__("" : "+x"(x))

/* All-ones in the lanes of half h (keys 8 h ..) below n. */
static inline __m256 lanes_below(size_t n, int h)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n - 8 * h), idx));
}

/* All-ones in the lanes lo .. hi - 1 of half h. */
static inline __m256 lanes_in(size_t lo, size_t hi, int h) { return _mm256_andnot_ps(lanes_below(lo, h), lanes_below(hi, h)); }

/* Rows of 8 keys or values, float32 at x or, with DT = DTYPE_BF16 or
 * DTYPE_INT8, straight from a narrow cache block (NarrowTile) widened in
 * registers: the values keys_f32 and values_f32 write (bf16: the bits
 * shifted up 16; int8: (float)q * scale), so the chains below give the
 * same bits on either, without a float32 copy written and read back. */
ALWAYS_INLINE __m256 widen8(const int DT, const void *e, __m256 sc)
{
    if (DT == DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)e)), 16));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)e))), sc);
}

/* 8 elements from element i of base (float32, or DT's elements), int8
 * scaled by sc. */
ALWAYS_INLINE __m256 load8(const int DT, const void *base, size_t i, __m256 sc)
{
    if (DT == DTYPE_F32) return _mm256_loadu_ps((const float *)base + i);
    return widen8(DT, (const unsigned char *)base + i * dtype_size((Dtype)DT), sc);
}

/* One element, as load8. */
ALWAYS_INLINE float load1(const int DT, const void *base, size_t i, float sc)
{
    if (DT == DTYPE_F32) return ((const float *)base)[i];
    if (DT == DTYPE_BF16) return dtype_f32_from_bf16(((const uint16_t *)base)[i]);
    return (float)((const int8_t *)base)[i] * sc;
}

/* Key tile t of a block: float32 kt[t] or narrow kn[t]; int8's scales of
 * its keys 8 h .. 8 h + 7. */
#define TILE_AT(DT, kt, kn, t) ((DT) == DTYPE_F32 ? (const void *)(kt)[t] : (kn)[t].p)
#define TILE_SC(DT, kn, t, h) ((DT) == DTYPE_INT8 ? _mm256_loadu_ps((kn)[t].sc + 8 * (h)) : _mm256_setzero_ps())

/* NQ queries x NT tiles, 2 NQ NT <= 12 chains.  Per d: one tile, its two
 * halves kept and q[v][d] broadcast in turn; several tiles, the NQ
 * broadcasts kept and the halves loaded in turn (registers: 12 + 3 + 1). */
ALWAYS_INLINE void scores_blk(const int DT, const int NQ, const int NT, float *s, size_t ts, const float *const *q,
                              const float *const *kt, const NarrowTile *kn, size_t ld, size_t hd, float scale)
{
    __m256 acc[4][6][2];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 6
        for (int v = 0; v < NQ; v++) acc[t][v][0] = acc[t][v][1] = _mm256_setzero_ps();
    if (NT == 1) {
        const void *k = TILE_AT(DT, kt, kn, 0);
        const __m256 s0 = TILE_SC(DT, kn, 0, 0), s1 = TILE_SC(DT, kn, 0, 1);
        for (size_t d = 0; d < hd; d++) {
            __m256 k0 = load8(DT, k, d * ld, s0), k1 = load8(DT, k, d * ld + 8, s1);
            KEEP_IN_REG(k0);
            KEEP_IN_REG(k1);
#pragma GCC unroll 6
            for (int v = 0; v < NQ; v++) {
                const __m256 b = _mm256_set1_ps(q[v][d]);
                acc[0][v][0] = _mm256_fmadd_ps(b, k0, acc[0][v][0]);
                acc[0][v][1] = _mm256_fmadd_ps(b, k1, acc[0][v][1]);
            }
        }
    } else {
        for (size_t d = 0; d < hd; d++) {
            __m256 b[6];
#pragma GCC unroll 6
            for (int v = 0; v < NQ; v++) b[v] = _mm256_set1_ps(q[v][d]);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256 k = load8(DT, TILE_AT(DT, kt, kn, t), d * ld + 8 * h, TILE_SC(DT, kn, t, h));
                    if (NQ > 1) KEEP_IN_REG(k);
#pragma GCC unroll 6
                    for (int v = 0; v < NQ; v++) acc[t][v][h] = _mm256_fmadd_ps(b[v], k, acc[t][v][h]);
                }
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 6
        for (int v = 0; v < NQ; v++) {
            _mm256_storeu_ps(s + t * ts + 16 * v, _mm256_mul_ps(acc[t][v][0], sc));
            _mm256_storeu_ps(s + t * ts + 16 * v + 8, _mm256_mul_ps(acc[t][v][1], sc));
        }
}

/* NQ queries over nt tiles, NT <= 4 at a time, the rest in one smaller block. */
ALWAYS_INLINE void scores_q(const int DT, const int NQ, const int NT, float *s, size_t ts, const float *const *q,
                            const float *const *kt, const NarrowTile *kn, size_t nt, size_t ld, size_t hd,
                            float scale)
{
    size_t t = 0;
#define SCORES_AT(NT_) scores_blk(DT, NQ, NT_, s + t * ts, ts, q, DT == DTYPE_F32 ? kt + t : NULL, \
                                  DT == DTYPE_F32 ? NULL : kn + t, ld, hd, scale)
    for (; t + NT <= nt; t += NT) SCORES_AT(NT);
    switch (nt - t) {
    case 1: SCORES_AT(1); break;
    case 2: if (NT > 2) SCORES_AT(2); break;
    case 3: if (NT > 3) SCORES_AT(3); break;
    }
#undef SCORES_AT
}

/* s[t ts + 16 v + j], nq <= 8 queries, nt <= tiles_per_block(nq) tiles of
 * float32 keys kt or (DT narrow) kn, row stride ld elements: 1 query x 4
 * tiles, 2 or 3 x 2, 4 to 6 x 1 (8 to 12 chains); 7 and 8 queries as 4 +
 * the rest. */
ALWAYS_INLINE void scores_dt(const int DT, float *s, size_t ts, const float *const *q, size_t nq,
                             const float *const *kt, const NarrowTile *kn, size_t nt, size_t ld, size_t hd,
                             float scale)
{
    if (nq > 6) {
        scores_dt(DT, s, ts, q, 4, kt, kn, nt, ld, hd, scale);
        scores_dt(DT, s + 64, ts, q + 4, nq - 4, kt, kn, nt, ld, hd, scale);
        return;
    }
    switch (nq) {
    case 1:  scores_q(DT, 1, 4, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 2:  scores_q(DT, 2, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 3:  scores_q(DT, 3, 2, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 4:  scores_q(DT, 4, 1, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    case 5:  scores_q(DT, 5, 1, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    default: scores_q(DT, 6, 1, s, ts, q, kt, kn, nt, ld, hd, scale); return;
    }
}

/* hmax16 of the AVX-512 path on lo = lanes 0-7, hi = 8-15: lane 0 of its
 * result only depends on max(lo, hi) (j ^ 8), then j ^ 4, j ^ 2, j ^ 1. */
ALWAYS_INLINE float hmax16(__m256 lo, __m256 hi)
{
    const __m256 x = _mm256_max_ps(lo, hi);
    __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_max_ps(y, _mm_permute_ps(y, 0x4E));
    y = _mm_max_ps(y, _mm_permute_ps(y, 0xB1));
    return _mm_cvtss_f32(y);
}

/* Online-softmax steps of nq queries over nt tiles, as the AVX-512 path. */
static void softmax_step(float *p, float *cf, float *m, float *lv, const float *s,
                         const size_t *nlo, const size_t *nval, size_t nq, size_t nt)
{
    float mx[2 * GQ_MAX + 8], mo[2 * GQ_MAX + 8];
    const size_t n = nt * nq;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (size_t u = 0; u < n; u++) {
        __m256 lo = _mm256_loadu_ps(s + 16 * u), hi = _mm256_loadu_ps(s + 16 * u + 8);
        if (nval) {
            lo = _mm256_blendv_ps(ninf, lo, lanes_in(nlo[u], nval[u], 0));
            hi = _mm256_blendv_ps(ninf, hi, lanes_in(nlo[u], nval[u], 1));
        }
        mx[u] = hmax16(lo, hi);
    }
    running_max(mo, mx, m, nq, nt);
    if (nval) no_keys_yet(mo, mx, n);
    for (size_t u = n; u < n + 8; u++) mo[u] = mx[u] = 0.0f;
    for (size_t u0 = 0; u0 < n; u0 += 8) {   /* c = exp(m - m'), 8 at once */
        const __m256 c = vexp8(_mm256_sub_ps(_mm256_loadu_ps(mo + u0), _mm256_loadu_ps(mx + u0)));
        if (n - u0 >= 8) {
            _mm256_storeu_ps(cf + u0, c);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, c);
            memcpy(cf + u0, tmp, (n - u0) * sizeof(float));
        }
    }
    for (size_t t = 0; t < nt; t++)
        for (size_t v = 0; v < nq; v++) {
            const size_t u = t * nq + v;
            const __m256 mu = _mm256_set1_ps(mx[u]), cu = _mm256_set1_ps(cf[u]);
            for (int h = 0; h < 2; h++) {
                __m256 e = vexp8(_mm256_sub_ps(_mm256_loadu_ps(s + 16 * u + 8 * h), mu));
                if (nval) e = _mm256_and_ps(e, lanes_in(nlo[u], nval[u], h));
                const __m256 l = _mm256_mul_ps(_mm256_loadu_ps(lv + 16 * v + 8 * h), cu);
                _mm256_storeu_ps(lv + 16 * v + 8 * h, _mm256_add_ps(l, e));
                _mm256_storeu_ps(p + 16 * u + 8 * h, e);
            }
        }
}

/* The rows x_i of rows_blk: float32 x[i], or (DT narrow) row i of xn,
 * row stride ldx elements; int8's scale of row i. */
#define ROW_AT(DT, x, xn, ldx, i) \
    ((DT) == DTYPE_F32 ? (const void *)(x)[i] \
                       : (const void *)((const unsigned char *)(xn)->p + (i) * (ldx) * dtype_size((Dtype)(DT))))
#define ROW_SC(DT, xn, i) ((DT) == DTYPE_INT8 ? (xn)->sc[i] : 0.0f)

/* One step of rows_blk: acc[r][k] = fma(c[r rs], x chunk k, acc[r][k]).  The
 * NC chunks of x are kept and c broadcast row by row, or, with fewer rows
 * than chunks, the NR broadcasts kept and the chunks loaded in turn (3 x 4:
 * 12 + 3 + 1 registers). */
ALWAYS_INLINE void rows_step(const int DT, const int NR, const int NC, __m256 (*acc)[8], const float *c, size_t rs,
                             const void *x, size_t off, float xsc)
{
    const __m256 sc = _mm256_set1_ps(xsc);
    if (NR < NC) {
        __m256 cr[6];
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) cr[r] = _mm256_set1_ps(c[r * rs]);
#pragma GCC unroll 8
        for (int k = 0; k < NC; k++) {
            __m256 xk = load8(DT, x, off + 8 * k, sc);
            if (NR > 1) KEEP_IN_REG(xk);
#pragma GCC unroll 6
            for (int r = 0; r < NR; r++) acc[r][k] = _mm256_fmadd_ps(cr[r], xk, acc[r][k]);
        }
        return;
    }
    __m256 xk[8];
#pragma GCC unroll 8
    for (int k = 0; k < NC; k++) {
        xk[k] = load8(DT, x, off + 8 * k, sc);
        if (NR > 1) KEEP_IN_REG(xk[k]);
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
        const __m256 cr = _mm256_set1_ps(c[r * rs]);
#pragma GCC unroll 8
        for (int k = 0; k < NC; k++) acc[r][k] = _mm256_fmadd_ps(cr, xk[k], acc[r][k]);
    }
}

/* The FMA rows of pv and acc_keys: NR rows r x NC chunks of 8 at offset off,
 *     y_r = y_r cf_r (SC) or y_r,  then  y_r = fma(c[r rs + i is], x_i, y_r), i < n,
 * the steps unrolled when n is the constant N (> 0); x_i as ROW_AT. */
ALWAYS_INLINE void rows_blk(const int DT, const int NR, const int NC, const int SC, const int N, float *const *y,
                            const float *cf, const float *c, size_t rs, size_t is, const float *const *x,
                            const NarrowTile *xn, size_t ldx, size_t n, size_t off)
{
    __m256 acc[6][8];
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
        const __m256 cv = _mm256_set1_ps(SC ? cf[r] : 1.0f);
#pragma GCC unroll 8
        for (int k = 0; k < NC; k++) {
            acc[r][k] = _mm256_loadu_ps(y[r] + off + 8 * k);
            if (SC) acc[r][k] = _mm256_mul_ps(acc[r][k], cv);
        }
    }
    if (N > 0) {
#pragma GCC unroll 16
        for (int i = 0; i < N; i++)
            rows_step(DT, NR, NC, acc, c + i * is, rs, ROW_AT(DT, x, xn, ldx, i), off, ROW_SC(DT, xn, i));
    } else {
        for (size_t i = 0; i < n; i++)
            rows_step(DT, NR, NC, acc, c + i * is, rs, ROW_AT(DT, x, xn, ldx, i), off, ROW_SC(DT, xn, i));
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int k = 0; k < NC; k++) _mm256_storeu_ps(y[r] + off + 8 * k, acc[r][k]);
}

/* NR rows over all of hd: blocks of NC chunks, the remaining chunks as 4 +
 * 2 + 1, the last hd mod 8 floats one at a time (the same chains). */
ALWAYS_INLINE void rows_all(const int DT, const int NR, const int NC, const int SC, float *const *y, const float *cf,
                            const float *c, size_t rs, size_t is, const float *const *x, const NarrowTile *xn,
                            size_t ldx, size_t n, size_t hd)
{
    size_t off = 0;
    for (; off + 8 * NC <= hd; off += 8 * NC)
        if (n == ATTN_TILE) rows_blk(DT, NR, NC, SC, ATTN_TILE, y, cf, c, rs, is, x, xn, ldx, n, off);   /* a tile of pv */
        else rows_blk(DT, NR, NC, SC, 0, y, cf, c, rs, is, x, xn, ldx, n, off);
    if (NC > 4 && off + 32 <= hd) {
        rows_blk(DT, NR, 4, SC, 0, y, cf, c, rs, is, x, xn, ldx, n, off);
        off += 32;
    }
    if (NC > 2 && off + 16 <= hd) {
        rows_blk(DT, NR, 2, SC, 0, y, cf, c, rs, is, x, xn, ldx, n, off);
        off += 16;
    }
    if (NC > 1 && off + 8 <= hd) {
        rows_blk(DT, NR, 1, SC, 0, y, cf, c, rs, is, x, xn, ldx, n, off);
        off += 8;
    }
    for (; off < hd; off++)
        for (int r = 0; r < NR; r++) {
            float a = SC ? y[r][off] * cf[r] : y[r][off];
            for (size_t i = 0; i < n; i++)
                a = fmaf(c[r * rs + i * is], load1(DT, ROW_AT(DT, x, xn, ldx, i), off, ROW_SC(DT, xn, i)), a);
            y[r][off] = a;
        }
}

/* Rows of one group: 1 row x 8 chunks, 2 or 3 x 4, 4 to 6 x 2. */
ALWAYS_INLINE void rows_group(const int DT, const int SC, size_t nr, float *const *y, const float *cf,
                              const float *c, size_t rs, size_t is, const float *const *x, const NarrowTile *xn,
                              size_t ldx, size_t n, size_t hd)
{
    switch (nr) {
    case 1:  rows_all(DT, 1, 8, SC, y, cf, c, rs, is, x, xn, ldx, n, hd); return;
    case 2:  rows_all(DT, 2, 4, SC, y, cf, c, rs, is, x, xn, ldx, n, hd); return;
    case 3:  rows_all(DT, 3, 4, SC, y, cf, c, rs, is, x, xn, ldx, n, hd); return;
    case 4:  rows_all(DT, 4, 2, SC, y, cf, c, rs, is, x, xn, ldx, n, hd); return;
    case 5:  rows_all(DT, 5, 2, SC, y, cf, c, rs, is, x, xn, ldx, n, hd); return;
    default: rows_all(DT, 6, 2, SC, y, cf, c, rs, is, x, xn, ldx, n, hd); return;
    }
}

/* nr rows in groups of at most 6, of balanced sizes. */
ALWAYS_INLINE void rows_fma(const int DT, const int SC, size_t nr, float *const *y, const float *cf, const float *c,
                            size_t rs, size_t is, const float *const *x, const NarrowTile *xn, size_t ldx, size_t n,
                            size_t hd)
{
    if (nr <= 6) {   /* decode's R rows, a tile's keys: no division */
        if (nr) rows_group(DT, SC, nr, y, cf, c, rs, is, x, xn, ldx, n, hd);
        return;
    }
    const size_t ng = (nr + 5) / 6;
    for (size_t g = 0, r0 = 0; g < ng; g++) {
        const size_t k = (nr - r0) / (ng - g);
        rows_group(DT, SC, k, y + r0, SC ? cf + r0 : NULL, c + r0 * rs, rs, is, x, xn, ldx, n, hd);
        r0 += k;
    }
}

/* o[v] (hd) = o[v] cf[v] + sum_{j < nj} p[16 v + j] x_j, v < nq: x_j at
 * x + j ldx (f32) or row j of xn (DT = DTYPE_BF16, DTYPE_INT8), so a kv
 * head's queries share each widened value row. */
ALWAYS_INLINE void pv_dt(const int DT, float *const *o, const float *p, const float *cf, const float *x,
                         const NarrowTile *xn, size_t ldx, size_t nq, size_t hd, size_t nj)
{
    const float *xj[ATTN_TILE];
    if (DT == DTYPE_F32)
        for (size_t j = 0; j < nj; j++) xj[j] = x + j * ldx;
    rows_fma(DT, 1, nq, o, cf, p, 16, 1, DT == DTYPE_F32 ? xj : NULL, xn, ldx, nj, hd);
}

/* out[j] (hd) += sum_{i < nq} C[16 i + j] x[i], j < nk. */
static void acc_keys(float *const *out, size_t nk, const float *C, const float *const *x, size_t nq, size_t hd)
{
    rows_fma(DTYPE_F32, 0, nk, out, NULL, C, 1, 16, x, NULL, 0, nq, hd);
}

/* dst[d] = o[d] / l, d < hd. */
static inline void div_row(float *dst, const float *o, float l, size_t hd)
{
    const __m256 lv = _mm256_set1_ps(l);
    size_t d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(dst + d, _mm256_div_ps(_mm256_loadu_ps(o + d), lv));
    for (; d < hd; d++) dst[d] = o[d] / l;
}

/* vec_dot(x, y, hd) of core/ops/vec.h, its 16 lane chains in two vectors. */
static inline float row_dot(const float *x, const float *y, size_t hd)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + d + 8), _mm256_loadu_ps(y + d + 8), a1);
    }
    float lanes[16];
    _mm256_storeu_ps(lanes, a0);
    _mm256_storeu_ps(lanes + 8, a1);
    float s = vec_lanes_combine(lanes);
    for (; d < hd; d++) s = fmaf(x[d], y[d], s);
    return s;
}

/* One query of a backward block: p and ds (16 lanes) from s and dp. */
static inline void bw_ds(float *p, float *ds, const float *s, const float *dp, float lse, float D,
                         size_t nlo, size_t nval, float scale)
{
    for (int h = 0; h < 2; h++) {
        __m256 e = vexp8(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * h), _mm256_set1_ps(lse)));
        e = _mm256_and_ps(e, lanes_in(nlo, nval, h));
        const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(dp + 8 * h), _mm256_set1_ps(D));
        _mm256_storeu_ps(p + 8 * h, e);
        _mm256_storeu_ps(ds + 8 * h, _mm256_mul_ps(_mm256_mul_ps(e, t), _mm256_set1_ps(scale)));
    }
}

#else /* portable kernels: the same operations, one lane at a time */

static void scores(float *s, size_t ts, const float *const *q, size_t nq, const float *const *kt, size_t nt,
                   size_t ld, size_t hd, float scale)
{
    for (size_t t = 0; t < nt; t++)
        for (size_t v = 0; v < nq; v++) {
            float acc[ATTN_TILE] = { 0 };
            for (size_t d = 0; d < hd; d++)
                for (int j = 0; j < ATTN_TILE; j++) acc[j] = fmaf(q[v][d], kt[t][d * ld + j], acc[j]);
            for (int j = 0; j < ATTN_TILE; j++) s[t * ts + 16 * v + j] = acc[j] * scale;
        }
}

/* The lane pairing of the AVX-512 hmax16, with _mm512_max_ps(a, b) = a > b ? a : b. */
static float hmax16(const float *x)
{
    float a[16], b[16];
    memcpy(a, x, sizeof a);
    for (int w = 8; w >= 1; w /= 2) {
        for (int j = 0; j < 16; j++) b[j] = a[j] > a[j ^ w] ? a[j] : a[j ^ w];
        memcpy(a, b, sizeof a);
    }
    return a[0];
}

static void softmax_step(float *p, float *cf, float *m, float *lv, const float *s,
                         const size_t *nlo, const size_t *nval, size_t nq, size_t nt)
{
    float mx[2 * GQ_MAX], mo[2 * GQ_MAX];
    const size_t n = nt * nq;
    for (size_t u = 0; u < n; u++) {
        const size_t n0 = nval ? nlo[u] : 0, nv = nval ? nval[u] : ATTN_TILE;
        float x[16];
        for (size_t j = 0; j < 16; j++) x[j] = j >= n0 && j < nv ? s[16 * u + j] : -INFINITY;
        mx[u] = hmax16(x);
    }
    running_max(mo, mx, m, nq, nt);
    if (nval) no_keys_yet(mo, mx, n);
    for (size_t u = 0; u < n; u++) cf[u] = vexp1(mo[u] - mx[u]);
    for (size_t t = 0; t < nt; t++)
        for (size_t v = 0; v < nq; v++) {
            const size_t u = t * nq + v, n0 = nval ? nlo[u] : 0, nv = nval ? nval[u] : ATTN_TILE;
            for (size_t j = 0; j < 16; j++) {
                const float e = j >= n0 && j < nv ? vexp1(s[16 * u + j] - mx[u]) : 0.0f;
                lv[16 * v + j] = lv[16 * v + j] * cf[u] + e;
                p[16 * u + j] = e;
            }
        }
}

static void pv(float *const *o, const float *p, const float *cf, const float *x, size_t ldx,
               size_t nq, size_t hd, size_t nj)
{
    for (size_t v = 0; v < nq; v++)
        for (size_t d = 0; d < hd; d++) {
            float a = o[v][d] * cf[v];
            for (size_t j = 0; j < nj; j++) a = fmaf(p[16 * v + j], x[j * ldx + d], a);
            o[v][d] = a;
        }
}

static void acc_keys(float *const *out, size_t nk, const float *C, const float *const *x, size_t nq, size_t hd)
{
    for (size_t j = 0; j < nk; j++)
        for (size_t d = 0; d < hd; d++) {
            float a = out[j][d];
            for (size_t i = 0; i < nq; i++) a = fmaf(C[16 * i + j], x[i][d], a);
            out[j][d] = a;
        }
}

static inline void div_row(float *dst, const float *o, float l, size_t hd)
{
    for (size_t d = 0; d < hd; d++) dst[d] = o[d] / l;
}

static inline float row_dot(const float *x, const float *y, size_t hd) { return vec_dot(x, y, hd); }

static inline void bw_ds(float *p, float *ds, const float *s, const float *dp, float lse, float D,
                         size_t nlo, size_t nval, float scale)
{
    for (size_t j = 0; j < 16; j++) {
        const float e = j >= nlo && j < nval ? vexp1(s[j] - lse) : 0.0f;
        p[j] = e;
        ds[j] = e * (dp[j] - D) * scale;
    }
}

#endif

#if defined(ATTN_AVX512) || defined(ATTN_AVX2)
/* The vector paths' scores() and pv() (float32 tiles) and, through the same
 * scores_dt and pv_dt, their narrow ones read in place (the forward
 * section's scores_narrow, pv_narrow). */
static void scores(float *s, size_t ts, const float *const *q, size_t nq, const float *const *kt, size_t nt,
                   size_t ld, size_t hd, float scale)
{
    scores_dt(DTYPE_F32, s, ts, q, nq, kt, NULL, nt, ld, hd, scale);
}

static void pv(float *const *o, const float *p, const float *cf, const float *x, size_t ldx,
               size_t nq, size_t hd, size_t nj)
{
    pv_dt(DTYPE_F32, o, p, cf, x, NULL, ldx, nq, hd, nj);
}

#define ATTN_NARROW_IN_REGISTERS 1
#endif

/* Scores of nq queries against nt <= tiles_per_block(nq) tiles, in blocks of
 * up to 8 queries: s[(t nq + v) 16 + j]. */
static void scores_all(float *s, const float *const *q, size_t nq, const float *const *kt, size_t nt,
                       size_t ld, size_t hd, float scale)
{
    for (size_t v0 = 0; v0 < nq; v0 += 8)
        scores(s + 16 * v0, nq * 16, q + v0, td_min(8, nq - v0), kt, nt, ld, hd, scale);
}

/* ================================================================ forward */

#ifdef ATTN_NARROW_IN_REGISTERS
/* scores() and pv() over narrow tiles (bf16 or int8, the cache's dtype kv),
 * widened in registers by the vector path's kernels. */
static void scores_narrow(Dtype kv, float *s, size_t ts, const float *const *q, size_t nq, const NarrowTile *kn,
                          size_t nt, size_t ld, size_t hd, float scale)
{
    if (kv == DTYPE_BF16) scores_dt(DTYPE_BF16, s, ts, q, nq, NULL, kn, nt, ld, hd, scale);
    else scores_dt(DTYPE_INT8, s, ts, q, nq, NULL, kn, nt, ld, hd, scale);
}

static void pv_narrow(Dtype kv, float *const *o, const float *p, const float *cf, const NarrowTile *xn, size_t ldx,
                      size_t nq, size_t hd, size_t nj)
{
    if (kv == DTYPE_BF16) pv_dt(DTYPE_BF16, o, p, cf, NULL, xn, ldx, nq, hd, nj);
    else pv_dt(DTYPE_INT8, o, p, cf, NULL, xn, ldx, nq, hd, nj);
}

static void scores_all_narrow(Dtype kv, float *s, const float *const *q, size_t nq, const NarrowTile *kn, size_t nt,
                              size_t ld, size_t hd, float scale)
{
    for (size_t v0 = 0; v0 < nq; v0 += 8)
        scores_narrow(kv, s + 16 * v0, nq * 16, q + v0, td_min(8, nq - v0), kn, nt, ld, hd, scale);
}
#endif

struct attn_fw {
    float *out, *lse; const float *q; const void *kv; const AttnSeq *seqs; size_t n_seq;
    const AttnShape *sh; const size_t *item_start; size_t n_items; float scale;
};

/* Key lanes of tile kt below the first key a query at p sees: its lower
 * mask (0: none, 16: it sees no key of the tile). */
static inline size_t tile_lo(const AttnShape *sh, size_t kt, size_t p)
{
    const size_t lo = attn_first_key(sh, p), k0 = kt * ATTN_TILE;
    return lo <= k0 ? 0 : td_min(ATTN_TILE, lo - k0);
}

/* The last key tile a query of tile qt sees: qt itself, or (bidir) the
 * sequence's last tile. */
static inline size_t last_key_tile(const AttnShape *sh, const AttnSeq *s, size_t qt)
{
    return sh->bidir ? (s->pos + s->n - 1) / ATTN_TILE : qt;
}

/* The last key position a query at position p sees: p itself, or (bidir)
 * the sequence's last position. */
static inline size_t last_key_pos(const AttnShape *sh, size_t n, size_t pos, size_t p)
{
    return sh->bidir ? pos + n - 1 : p;
}

/* nq <= GQ_MAX query vectors (rows r_v of s, heads h_v) of tile qt over key
 * tiles 0..last_key_tile (qt when causal; with a window: from the first
 * tile any of them sees; a query's lanes below its first key are masked,
 * and the tiles before its own first one leave it unchanged, so its bits
 * do not depend on the group).  A window and bidir never meet (an encoder
 * has no window: attn_check). */
static void fw_group(const struct attn_fw *c, const AttnSeq *s, size_t g, size_t qt,
                     const size_t *rows, const size_t *heads, size_t nq)
{
    const AttnShape *sh = c->sh;
    const size_t hd = sh->dk, dv = sh->dv, qw = sh->H * hd, ow = sh->H * dv;
    const float *q[GQ_MAX];
    float *op[GQ_MAX];
    size_t nval[GQ_MAX], nlo[2 * GQ_MAX], nhi[2 * GQ_MAX];
    float m[GQ_MAX], cf[2 * GQ_MAX];   /* 2 GQ_MAX >= nq tiles_per_block(nq) */
    float o[GQ_FLOATS] __attribute__((aligned(64)));
    float lv[GQ_MAX * 16] __attribute__((aligned(64))), p[2 * GQ_MAX * 16] __attribute__((aligned(64)));
    float sc[2 * GQ_MAX * 16] __attribute__((aligned(64)));
    /* narrow caches: the tiles of a block widened to float32 (f32 reads
     * the blocks in place) */
    const bool vk = sh->v_in_k;
#ifdef ATTN_NARROW_IN_REGISTERS
    /* bf16, int8 (not v_in_k): the kernels read the blocks in place */
    const bool inreg = sh->kv != DTYPE_F32 && !vk;
#else
    const bool inreg = false;
#endif
    const bool wid = sh->kv != DTYPE_F32 && !inreg;
    float kbuf[wid ? SC_PAIRS * ATTN_TILE * hd : 1], vbuf[wid || vk ? ATTN_TILE * dv : 1];
    size_t ld = sh->bs, lo_min = SIZE_MAX, lo_max = 0;
    const size_t lt = last_key_tile(sh, s, qt);
    for (size_t v = 0; v < nq; v++) {
        q[v] = c->q + (s->row + rows[v]) * qw + heads[v] * hd;
        op[v] = o + v * dv;
        nval[v] = tile_valid(lt, last_key_pos(sh, s->n, s->pos, s->pos + rows[v]));
        m[v] = -INFINITY;
        const size_t lo = attn_first_key(sh, s->pos + rows[v]);
        lo_min = td_min(lo_min, lo);
        lo_max = td_max(lo_max, lo);
    }
    memset(o, 0, nq * dv * sizeof(float));
    memset(lv, 0, nq * 16 * sizeof(float));
    /* full tiles kt_lo..lt-1 (kt_lo = 0 without a window), several at a
     * time when the group is small; tiles starting below lo_max need the
     * lower masks */
    const size_t tpb = tiles_per_block(nq), kt_lo = lo_min / ATTN_TILE;
    for (size_t kt0 = kt_lo; kt0 < lt; kt0 += tpb) {
        const size_t nt = td_min(tpb, lt - kt0);
        const float *kts[SC_PAIRS];
#ifdef ATTN_NARROW_IN_REGISTERS
        if (inreg) {
            NarrowTile kns[SC_PAIRS];
            for (size_t t = 0; t < nt; t++) kns[t] = narrow_kt(c->kv, s, sh, g, kt0 + t);
            scores_all_narrow(sh->kv, sc, q, nq, kns, nt, sh->bs, hd, c->scale);
        } else
#endif
        {
            for (size_t t = 0; t < nt; t++) kts[t] = keys_f32(kbuf + t * ATTN_TILE * hd, c->kv, s, sh, g, kt0 + t, &ld);
            scores_all(sc, q, nq, kts, nt, ld, hd, c->scale);
        }
        const bool masked = kt0 * ATTN_TILE < lo_max;
        if (masked)
            for (size_t t = 0; t < nt; t++)
                for (size_t v = 0; v < nq; v++) {
                    nlo[t * nq + v] = tile_lo(sh, kt0 + t, s->pos + rows[v]);
                    nhi[t * nq + v] = ATTN_TILE;
                }
        softmax_step(p, cf, m, lv, sc, masked ? nlo : NULL, masked ? nhi : NULL, nq, nt);
        for (size_t t = 0; t < nt; t++) {
#ifdef ATTN_NARROW_IN_REGISTERS
            if (inreg) {
                const NarrowTile vn = narrow_v(c->kv, s, sh, g, kt0 + t);
                pv_narrow(sh->kv, op, p + t * nq * 16, cf + t * nq, &vn, dv, nq, dv, ATTN_TILE);
                continue;
            }
#endif
            const float *vt = vk ? values_of_keys(vbuf, kts[t], ld, dv) : values_f32(vbuf, c->kv, s, sh, g, kt0 + t);
            pv(op, p + t * nq * 16, cf + t * nq, vt, dv, nq, dv, ATTN_TILE);
        }
    }
    /* the diagonal (bidir: last) tile: each query sees its own number of keys */
    for (size_t v = 0; v < nq; v++) nlo[v] = tile_lo(sh, lt, s->pos + rows[v]);
#ifdef ATTN_NARROW_IN_REGISTERS
    if (inreg) {
        const NarrowTile knd = narrow_kt(c->kv, s, sh, g, lt), vnd = narrow_v(c->kv, s, sh, g, lt);
        scores_all_narrow(sh->kv, sc, q, nq, &knd, 1, sh->bs, hd, c->scale);
        softmax_step(p, cf, m, lv, sc, nlo, nval, nq, 1);
        for (size_t v = 0; v < nq; v++) pv_narrow(sh->kv, op + v, p + 16 * v, cf + v, &vnd, dv, 1, dv, nval[v]);
    } else
#endif
    {
        const float *ktd = keys_f32(kbuf, c->kv, s, sh, g, lt, &ld);
        const float *vtd = vk ? values_of_keys(vbuf, ktd, ld, dv) : values_f32(vbuf, c->kv, s, sh, g, lt);
        scores_all(sc, q, nq, &ktd, 1, ld, hd, c->scale);
        softmax_step(p, cf, m, lv, sc, nlo, nval, nq, 1);
        for (size_t v = 0; v < nq; v++) pv(op + v, p + 16 * v, cf + v, vtd, dv, 1, dv, nval[v]);
    }
    for (size_t v = 0; v < nq; v++) {
        const float l = vec_lanes_combine(lv + 16 * v);
        float *dst = c->out + (s->row + rows[v]) * ow + heads[v] * dv;
        div_row(dst, o + v * dv, l, dv);
        if (c->lse) c->lse[(s->row + rows[v]) * sh->H + heads[v]] = m[v] + logf(l);
    }
}

/* Item `local` of sequence si = (kv head g, query tile qt): its rows x heads
 * in groups of at most gq queries. */
static void fw_item(const struct attn_fw *c, size_t si, size_t local)
{
    const AttnShape *sh = c->sh;
    const AttnSeq *s = &c->seqs[si];
    const size_t R = sh->H / sh->Hkv, gq = td_min(GQ_MAX, GQ_FLOATS / sh->dv);
    const size_t n_qt = (s->pos + s->n - 1) / ATTN_TILE - s->pos / ATTN_TILE + 1;
    const size_t qt = s->pos / ATTN_TILE + local % n_qt, g = local / n_qt;   /* kv head outer: its keys stay in cache */
    const size_t p0 = td_max(qt * ATTN_TILE, s->pos), p1 = td_min((qt + 1) * ATTN_TILE, s->pos + s->n);
    size_t rows[GQ_MAX], heads[GQ_MAX], nq = 0;
    for (size_t p = p0; p < p1; p++)
        for (size_t h = g * R; h < (g + 1) * R; h++) {
            rows[nq] = p - s->pos;
            heads[nq] = h;
            if (++nq == gq) {
                fw_group(c, s, g, qt, rows, heads, nq);
                nq = 0;
            }
        }
    if (nq) fw_group(c, s, g, qt, rows, heads, nq);
}

/* Thread of item it in the snake order 0 1 .. n-1 n-1 .. 1 0 0 1 ... */
static inline size_t snake_owner(size_t it, size_t nt)
{
    size_t round = it / nt, k = it % nt;
    return round % 2 ? nt - 1 - k : k;
}

static void fw_threads(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct attn_fw *c = vc;
    const size_t nt = (size_t)pool_threads();
    size_t si = 0;
    for (size_t it = 0; it < c->n_items; it++) {
        while (c->item_start[si + 1] <= it) si++;
        const size_t owner = snake_owner(it, nt);
        if (owner >= t0 && owner < t1) fw_item(c, si, it - c->item_start[si]);
    }
}

/* The shape's contract (attention.h), checked once per call. */
static void attn_check(const AttnShape *sh)
{
    TD_CHECK(sh->dk >= 1 && sh->dk <= HD_MAX && sh->dv >= 1 && sh->dv <= HD_MAX,
             "attention: head dims dk %zu, dv %zu outside [1, %d]", sh->dk, sh->dv, HD_MAX);
    TD_CHECK(!sh->v_in_k || sh->dv <= sh->dk, "attention: values in keys need dv %zu <= dk %zu", sh->dv, sh->dk);
    TD_CHECK(sh->scale > 0.0f && isfinite(sh->scale), "attention: scale %g", (double)sh->scale);
    TD_CHECK(sh->bs % ATTN_TILE == 0, "attention: block size %zu", sh->bs);
    TD_CHECK(!sh->bidir || !sh->window, "attention: a bidirectional shape with a window (%zu)", sh->window);
}

/* bidir sees the sequence's own keys only: they are rows 0..n-1 at
 * positions 0..n-1 (an encoder's sequence starts at 0). */
static void attn_check_seqs(const AttnSeq *seqs, size_t n_seq, const AttnShape *sh)
{
    for (size_t i = 0; i < n_seq && sh->bidir; i++)
        TD_CHECK(seqs[i].pos == 0, "attention: bidirectional sequence %zu starts at %zu, not 0", i, seqs[i].pos);
}

/* Items of a sequence: (query tiles touched) x Hkv. */
static size_t seq_items(const AttnSeq *s, const AttnShape *sh)
{
    if (s->n == 0) return 0;
    size_t t0 = s->pos / ATTN_TILE, t1 = (s->pos + s->n - 1) / ATTN_TILE;
    return (t1 - t0 + 1) * sh->Hkv;
}

void attention_forward(float *out, float *lse, const float *restrict q, const void *kv,
                       const AttnSeq *seqs, size_t n_seq, const AttnShape *sh)
{
    attn_check(sh);
    attn_check_seqs(seqs, n_seq, sh);
    size_t start[n_seq + 1];   /* item prefix sums; n_seq is a batch size, small */
    start[0] = 0;
    for (size_t i = 0; i < n_seq; i++) start[i + 1] = start[i] + seq_items(&seqs[i], sh);
    struct attn_fw c = { out, lse, q, kv, seqs, n_seq, sh, start, start[n_seq], sh->scale };
    if (c.n_items == 0) return;
    const size_t nt = td_min((size_t)pool_threads(), c.n_items);
    if (nt <= 1) fw_threads(&c, 0, 1, 0);
    else pool_for((size_t)pool_threads(), 1, fw_threads, &c);
}

void attention_forward_heads(float *out, float *lse, const float *restrict q, const void *kv,
                             const AttnSeq *seqs, size_t n_seq, const AttnShape *sh, size_t g0, size_t g1)
{
    attn_check(sh);
    attn_check_seqs(seqs, n_seq, sh);
    TD_CHECK(g0 <= g1 && g1 <= sh->Hkv, "attention: kv heads [%zu, %zu) of %zu", g0, g1, sh->Hkv);
    const struct attn_fw c = { out, lse, q, kv, seqs, n_seq, sh, NULL, 0, sh->scale };
    for (size_t si = 0; si < n_seq; si++) {
        const size_t n_qt = seq_items(&seqs[si], sh) / sh->Hkv;   /* fw_item: local = g n_qt + query tile */
        for (size_t g = g0; g < g1; g++)
            for (size_t t = 0; t < n_qt; t++) fw_item(&c, si, g * n_qt + t);
    }
}

/* ================================================================ backward */

struct attn_bw {
    float *dq, *dk, *dv; const float *dout, *q, *out, *lse; const void *kv; const AttnSeq *seqs;
    size_t n_seq; const AttnShape *sh; float scale;
    size_t span;   /* tiles per span of the schedule (bw_span_tiles) */
    const size_t *krow;   /* chunks (attention_backward_chunks): key s of sequence i at row krow[i] + s; NULL */
};

/* One key tile of a (sequence, kv head): K^T in the blocks, K and V^T copied
 * out into 2 ATTN_TILE hd floats of the caller's (zero past the sequence's
 * last key), gradient rows of its keys. */
typedef struct {
    const float *kt;
    float *krow;   /* [j][d] */
    float *vt;     /* [d][j] */
    float *dk[ATTN_TILE], *dv[ATTN_TILE];
    size_t nk;     /* keys of the tile in the sequence */
} BwKeys;

/* Up to GQ_MAX queries of one query tile. */
typedef struct {
    size_t nq, qt;
    const float *q[GQ_MAX], *dout[GQ_MAX];
    float *dq[GQ_MAX];
    float lse[GQ_MAX], D[GQ_MAX];
    size_t pos[GQ_MAX];   /* the last key position each sees (its own; bidir: the sequence's last) */
} BwQueries;

/* Key tile kt of (s, g), its copies in buf (ATTN_TILE (dk + dv) floats). */
static void bw_keys(BwKeys *K, float *buf, const struct attn_bw *c, const AttnSeq *s, size_t g, size_t kt)
{
    const AttnShape *sh = c->sh;
    const size_t hd = sh->dk, dv = sh->dv, bs = sh->bs;
    K->kt = tile_kt(c->kv, s, sh, g, kt);
    /* V [j][dv] in the block, or (v_in_k) the first dv rows of K^T */
    const float *vtile = sh->v_in_k ? K->kt : tile_v(c->kv, s, sh, g, kt);
    const size_t vj = sh->v_in_k ? 1 : dv, vd = sh->v_in_k ? bs : 1;   /* element (j, d) at j vj + d vd */
    K->krow = buf;
    K->vt = buf + ATTN_TILE * hd;
    K->nk = td_min(ATTN_TILE, s->pos + s->n - kt * ATTN_TILE);   /* keys 0 .. pos+n-1 */
    const size_t row0 = c->krow ? c->krow[s - c->seqs] : s->row;  /* key 0's gradient row */
    for (size_t j = 0; j < ATTN_TILE; j++) {
        const int in = j < K->nk;
        for (size_t d = 0; d < hd; d++) K->krow[j * hd + d] = in ? K->kt[d * bs + j] : 0.0f;
        for (size_t d = 0; d < dv; d++) K->vt[d * ATTN_TILE + j] = in ? vtile[j * vj + d * vd] : 0.0f;
        const size_t r = row0 + kt * ATTN_TILE + (in ? j : 0);
        K->dk[j] = c->dk + (r * sh->Hkv + g) * hd;
        K->dv[j] = c->dv + (r * sh->Hkv + g) * dv;
    }
}

/* D_i = dout_i . out_i of query v (rows then heads of group g). */
static inline float bw_D(const struct attn_bw *c, const AttnSeq *s, size_t g, size_t v)
{
    const AttnShape *sh = c->sh;
    const size_t R = sh->H / sh->Hkv, off = ((s->row + v / R) * sh->H + g * R + v % R) * sh->dv;
    return row_dot(c->dout + off, c->out + off, sh->dv);
}

/* Queries [v0, v0 + GQ_MAX) of tile qt (rows then heads of group g).  Dc:
 * D of the queries d0, d0 + 1, .. of (s, g) when the caller cached them
 * (those of the tile included), or NULL. */
static void bw_queries(BwQueries *Q, const struct attn_bw *c, const AttnSeq *s, size_t g, size_t qt,
                       size_t v0, const float *Dc, size_t d0)
{
    const AttnShape *sh = c->sh;
    const size_t hd = sh->dk, H = sh->H, R = H / sh->Hkv;
    const size_t r0 = qt * ATTN_TILE, nr = td_min(ATTN_TILE, s->n - r0);
    Q->qt = qt;
    Q->nq = td_min(GQ_MAX, nr * R - v0);
    for (size_t v = 0; v < Q->nq; v++) {
        const size_t r = r0 + (v0 + v) / R, h = g * R + (v0 + v) % R, qh = (s->row + r) * H + h;
        Q->q[v] = c->q + qh * hd;
        Q->dout[v] = c->dout + qh * sh->dv;
        Q->dq[v] = c->dq + qh * hd;
        Q->lse[v] = c->lse[(s->row + r) * H + h];
        Q->D[v] = Dc ? Dc[r0 * R + v0 + v - d0] : bw_D(c, s, g, r0 * R + v0 + v);
        Q->pos[v] = last_key_pos(sh, s->n, s->pos, s->pos + r);
    }
}

static size_t bw_query_groups(const AttnSeq *s, const AttnShape *sh, size_t qt)
{
    const size_t nr = td_min(ATTN_TILE, s->n - qt * ATTN_TILE);
    return (nr * (sh->H / sh->Hkv) + GQ_MAX - 1) / GQ_MAX;
}

/* Block (queries Q, keys K at tile kt): dv, dk of the keys when do_kv, dq
 * of the queries when do_q. */
static void bw_block(const struct attn_bw *c, const BwQueries *Q, const BwKeys *K, size_t kt,
                     int do_kv, int do_q)
{
    const size_t hd = c->sh->dk, dv = c->sh->dv, nq = Q->nq;
    if (nq == 0) return;
    float s[GQ_MAX * 16] __attribute__((aligned(64))), dp[GQ_MAX * 16] __attribute__((aligned(64)));
    float p[GQ_MAX * 16] __attribute__((aligned(64))), ds[GQ_MAX * 16] __attribute__((aligned(64)));
    const float *vt = K->vt;
    scores_all(s, Q->q, nq, &K->kt, 1, c->sh->bs, hd, c->scale);    /* s = q k^T scale */
    scores_all(dp, Q->dout, nq, &vt, 1, ATTN_TILE, dv, 1.0f);       /* dp = dout v^T */
    for (size_t v = 0; v < nq; v++)
        bw_ds(p + 16 * v, ds + 16 * v, s + 16 * v, dp + 16 * v, Q->lse[v], Q->D[v],
              tile_lo(c->sh, kt, Q->pos[v]), tile_valid(kt, Q->pos[v]), c->scale);
    if (do_kv) {
        acc_keys(K->dv, K->nk, p, Q->dout, nq, dv);    /* dv_j += p_ij dout_i */
        acc_keys(K->dk, K->nk, ds, Q->q, nq, hd);      /* dk_j += ds_ij q_i */
    }
    if (do_q) {
        static const float ones[GQ_MAX] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
        pv(Q->dq, ds, ones, K->krow, hd, nq, hd, ATTN_TILE);   /* dq_i += ds_ij k_j */
    }
}

static size_t seq_tiles(const AttnSeq *s) { return (s->n + ATTN_TILE - 1) / ATTN_TILE; }

/* Window: the first key tile the queries of position tile qt see, and one
 * past the last position tile whose queries see key tile kt (tiles of
 * positions: a cp chunk's queries start at a tile-aligned pos > 0).  The
 * blocks outside are skipped: they would add exact zeros (p = ds = 0) to
 * every chain. */
static size_t bw_first_kt(const AttnShape *sh, size_t qt) { return attn_first_key(sh, qt * ATTN_TILE) / ATTN_TILE; }
static size_t bw_end_qt(const AttnShape *sh, const AttnSeq *s, size_t kt)
{
    const size_t n = (s->pos + s->n + ATTN_TILE - 1) / ATTN_TILE;   /* position tiles (cp chunks: pos > 0) */
    return sh->window ? td_min(n, (kt * ATTN_TILE + ATTN_TILE - 1 + sh->window - 1) / ATTN_TILE + 1) : n;
}

/* Key tiles kt0 .. kt0 + nkt - 1 of (s, g), nkt <= BW_SPAN_MAX and nkt
 * ATTN_TILE (dk + dv) <= BW_KEY_FLOATS: dk, dv over query tiles kt0.. in order,
 * and dq of those queries too when do_q (the one-pass schedule; Dc: D of all
 * the queries of (s, g), or NULL).  Each query group is gathered once and
 * meets the key tiles it sees (kt0 .. qt: causal) in increasing order, so a
 * dk_j still gets the query tiles in order and a dq_i still gets key tile
 * kt before kt + 1 (the tiles before kt0 came in earlier calls).  The later
 * query rows (q, dout, dq: 6 MB per kv head at T = 4096, hd = 64, R = 2)
 * stream through the caches once per nkt key tiles, not once per tile. */
static void bw_key_tiles(const struct attn_bw *c, const AttnSeq *s, size_t g, size_t kt0, size_t nkt,
                         int do_q, const float *Dc)
{
    float buf[BW_KEY_FLOATS] __attribute__((aligned(64)));
    BwKeys K[BW_SPAN_MAX];
    BwQueries Q;
    for (size_t t = 0; t < nkt; t++) bw_keys(&K[t], buf + t * ATTN_TILE * (c->sh->dk + c->sh->dv), c, s, g, kt0 + t);
    const size_t q0 = s->pos / ATTN_TILE;   /* query tile qt is position tile q0 + qt (cp chunks; else 0) */
    for (size_t qa = c->sh->bidir ? q0 : td_max(kt0, q0); qa < bw_end_qt(c->sh, s, kt0 + nkt - 1); qa++) {
        const size_t qt = qa - q0;
        const size_t nvis = c->sh->bidir ? nkt : td_min(nkt, qa - kt0 + 1);   /* causal: tiles kt0 .. qa */
        const size_t t0 = td_min(nvis, td_max(kt0, bw_first_kt(c->sh, qa)) - kt0);   /* window: from its first */
        for (size_t u = 0; u < bw_query_groups(s, c->sh, qt); u++) {
            bw_queries(&Q, c, s, g, qt, u * GQ_MAX, Dc, 0);
            for (size_t t = t0; t < nvis; t++) bw_block(c, &Q, &K[t], kt0 + t, 1, do_q);
        }
    }
}

/* Query tiles qt0 .. qt0 + nqt - 1 of (s, g): dq over key tiles 0.. in
 * order.  Key tiles outer: each is gathered once for all the query tiles
 * that see it, and a dq_i still gets key tile kt before kt + 1. */
static void bw_query_tiles(const struct attn_bw *c, const AttnSeq *s, size_t g, size_t qt0, size_t nqt)
{
    float buf[2 * ATTN_TILE * HD_MAX] __attribute__((aligned(64)));
    float Dc[D_CACHE];
    BwKeys K;
    BwQueries Q;
    const size_t R = c->sh->H / c->sh->Hkv, qt1 = qt0 + nqt, d0 = qt0 * ATTN_TILE * R;
    const size_t nq = td_min(qt1 * ATTN_TILE, s->n) * R - d0;   /* queries of the tiles */
    if (nq <= D_CACHE)
        for (size_t v = 0; v < nq; v++) Dc[v] = bw_D(c, s, g, d0 + v);
    const size_t nkt = c->sh->bidir ? seq_tiles(s) : qt1;   /* bidir: every key tile */
    for (size_t kt = bw_first_kt(c->sh, qt0); kt < nkt; kt++) {
        bw_keys(&K, buf, c, s, g, kt);
        for (size_t qt = c->sh->bidir ? qt0 : td_max(kt, qt0); qt < td_min(qt1, bw_end_qt(c->sh, s, kt)); qt++)
            for (size_t u = 0; u < bw_query_groups(s, c->sh, qt); u++) {
                bw_queries(&Q, c, s, g, qt, u * GQ_MAX, nq <= D_CACHE ? Dc : NULL, d0);
                bw_block(c, &Q, &K, kt, 0, 1);
            }
    }
}

/* Item (s, g) of the one-pass schedule: key tiles in order, a span at a
 * time, D computed once when it fits the cache (it is the same value either
 * way). */
static void bw_item(const struct attn_bw *c, const AttnSeq *s, size_t g)
{
    float Dc[D_CACHE];
    const size_t nq = s->n * (c->sh->H / c->sh->Hkv), n = (s->pos + s->n + ATTN_TILE - 1) / ATTN_TILE;   /* key tiles */
    if (nq <= D_CACHE)
        for (size_t v = 0; v < nq; v++) Dc[v] = bw_D(c, s, g, v);
    for (size_t kt = 0; kt < n; kt += c->span)
        bw_key_tiles(c, s, g, kt, td_min(c->span, n - kt), 1, nq <= D_CACHE ? Dc : NULL);
}

/* Schedules: items (sequence, kv head) with key tiles outer; or pass 1 =
 * (sequence, kv head, span of key tiles) for dk, dv and pass 2 = (sequence,
 * kv head, span of query tiles) for dq, spans of c->span tiles. */
enum { BW_ITEMS, BW_KEYS, BW_QUERIES };

struct bw_run { const struct attn_bw *c; int pass; size_t n_items; };

static size_t seq_spans(const AttnSeq *s, size_t span) { return (seq_tiles(s) + span - 1) / span; }

/* Decodes item it of a pass into (sequence, kv head, first tile); returns
 * its cost in blocks. */
static size_t bw_item_at(const struct attn_bw *c, int pass, size_t it, size_t *si, size_t *g, size_t *t)
{
    const size_t Hkv = c->sh->Hkv, span = c->span;
    if (pass == BW_ITEMS) {
        *si = it / Hkv;
        *g = it % Hkv;
        *t = 0;
        const size_t n = seq_tiles(&c->seqs[*si]);
        return c->sh->bidir ? n * n : n * (n + 1) / 2;
    }
    for (*si = 0;; (*si)++) {   /* spans of sequence si x Hkv items */
        const size_t n = seq_spans(&c->seqs[*si], span) * Hkv;
        if (it < n) break;
        it -= n;
    }
    const size_t n = seq_tiles(&c->seqs[*si]);
    *g = it % Hkv;
    *t = it / Hkv * span;
    /* tiles t .. t + m - 1: key tile k sees query tiles k..n-1, query tile k key tiles 0..k */
    const size_t m = td_min(span, n - *t);
    if (c->sh->bidir) return m * n;
    return pass == BW_KEYS ? m * (n - *t) - m * (m - 1) / 2 : m * (*t + 1) + m * (m - 1) / 2;
}

static void bw_threads(void *vr, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct bw_run *r = vr;
    const size_t nt = (size_t)pool_threads();
    for (size_t it = 0; it < r->n_items; it++) {
        const size_t owner = snake_owner(it, nt);
        if (owner < t0 || owner >= t1) continue;
        size_t si, g, t;
        bw_item_at(r->c, r->pass, it, &si, &g, &t);
        const AttnSeq *s = &r->c->seqs[si];
        if (r->pass == BW_ITEMS)
            bw_item(r->c, s, g);
        else if (r->pass == BW_KEYS)
            bw_key_tiles(r->c, s, g, t, td_min(r->c->span, seq_tiles(s) - t), 0, NULL);
        else
            bw_query_tiles(r->c, s, g, t, td_min(r->c->span, seq_tiles(s) - t));
    }
}

static void bw_run(const struct attn_bw *c, int pass, size_t n_items)
{
    struct bw_run r = { c, pass, n_items };
    if (n_items == 0) return;
    if (pool_threads() <= 1 || n_items == 1) bw_threads(&r, 0, (size_t)pool_threads(), 0);
    else pool_for((size_t)pool_threads(), 1, bw_threads, &r);
}

/* Key tiles per pass over the queries: as many as BW_KEY_FLOATS of copies
 * hold, at most BW_SPAN_MAX (16 up to hd = 128, 8 at hd = 256).  Measured on
 * Zen 3 (512 KB L2) at T = 4096, hd = 64: spans of 1, 4, 16 tiles run at
 * ~19, ~38, ~50 GFLOP/s on one thread (40, 80, 90 on two), longer spans
 * gain little; at hd = 256, 16 tiles would still gain ~10% over 8 but take
 * 512 KB of stack.  At T = 256 an item's queries fit in L2 and the span
 * changes little (10% faster than single tiles). */
static size_t bw_span_tiles(const AttnShape *sh)
{
    return td_min(BW_SPAN_MAX, BW_KEY_FLOATS / (ATTN_TILE * (sh->dk + sh->dv)));
}

static void backward(float *dq, float *dk, float *dv, const float *restrict dout, const float *restrict q,
                     const float *restrict out, const float *restrict lse, const void *kv, const AttnSeq *seqs,
                     size_t n_seq, const size_t *krow, const AttnShape *sh)
{
    attn_check(sh);
    TD_CHECK(sh->kv == DTYPE_F32, "attention_backward: the KV blocks are %s, training needs f32", dtype_name(sh->kv));
    size_t n_tiles = 0;
    bool chunks = false;   /* chunks: the one-pass schedule (its items walk their keys from 0) */
    for (size_t i = 0; i < n_seq; i++) {
        TD_CHECK(krow ? seqs[i].pos % ATTN_TILE == 0 : seqs[i].pos == 0,
                 "attention_backward: sequence %zu starts at %zu, not %s", i, seqs[i].pos,
                 krow ? "a multiple of ATTN_TILE" : "0");
        chunks |= krow != NULL;
        n_tiles += seq_tiles(&seqs[i]);
    }
    struct attn_bw c = { dq, dk, dv, dout, q, out, lse, kv, seqs, n_seq, sh, sh->scale, bw_span_tiles(sh), krow };
    /* One pass over (sequence, kv head) items unless its busiest thread
     * would carry more than 1.3x an even share; the two-pass schedule costs
     * ~1.4x the work (s, p, dp are computed twice) but splits finely. */
    const size_t nt = (size_t)pool_threads(), n_items = n_seq * sh->Hkv;
    double load[64] = { 0 }, total = 0, worst = 0;
    for (size_t it = 0; it < n_items && nt > 1 && nt <= 64; it++) {
        size_t si, g, t;
        const double w = (double)bw_item_at(&c, BW_ITEMS, it, &si, &g, &t);
        load[snake_owner(it, nt)] += w;
        total += w;
    }
    for (size_t t = 0; t < nt && t < 64; t++) worst = load[t] > worst ? load[t] : worst;
    if (chunks || nt <= 1 || nt > 64 || worst <= 1.3 * total / (double)nt) {
        bw_run(&c, BW_ITEMS, n_items);
        return;
    }
    /* spans short enough to leave each thread ~8 items of each pass */
    c.span = td_max(1, td_min(c.span, n_tiles * sh->Hkv / (8 * nt)));
    size_t n_spans = 0;
    for (size_t i = 0; i < n_seq; i++) n_spans += seq_spans(&seqs[i], c.span);
    bw_run(&c, BW_KEYS, n_spans * sh->Hkv);
    bw_run(&c, BW_QUERIES, n_spans * sh->Hkv);
}

void attention_backward(float *dq, float *dk, float *dv, const float *restrict dout,
                        const float *restrict q, const float *restrict out,
                        const float *restrict lse, const void *kv, const AttnSeq *seqs,
                        size_t n_seq, const AttnShape *sh)
{
    backward(dq, dk, dv, dout, q, out, lse, kv, seqs, n_seq, NULL, sh);
}

void attention_backward_chunks(float *dq, float *dk, float *dv, const float *restrict dout,
                               const float *restrict q, const float *restrict out,
                               const float *restrict lse, const void *kv, const AttnSeq *seqs,
                               size_t n_seq, const size_t *krow, const AttnShape *sh)
{
    backward(dq, dk, dv, dout, q, out, lse, kv, seqs, n_seq, krow, sh);
}

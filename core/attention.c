/* core/attention.c - blocked causal GQA attention, forward and backward
 * (attention.h).
 *
 * Forward work item: (sequence, kv head g, query tile qt).  The queries of
 * the item are the rows whose positions fall in [16 qt, 16 qt + 16), for the
 * R = H/Hkv heads of group g; they share the key tiles 0..qt, and are
 * processed QV at a time so that their independent FMA chains hide latency.
 * Grouping never changes a query's own arithmetic.
 *
 * Backward (per sequence and kv head), for p_j = exp(s_j - lse):
 *   D   = dout . out
 *   dp_j = dout . v_j,   ds_j = p_j (dp_j - D)
 *   dv_j += p_j dout,    dk_j += scale ds_j q,    dq += scale ds_j k_j
 */
#include "core/attention.h"
#include "core/common.h"
#include "core/pool.h"
#include "core/vec.h"

#include <math.h>
#include <string.h>

#define QV 8          /* query vectors processed together */
#define HD_MAX 256

static inline const float *block_at(const float *kv, const AttnSeq *s, const AttnShape *sh, size_t p)
{
    return kv + (size_t)s->blocks[p / sh->bs] * attn_block_floats(sh);
}

static inline const float *tile_kt(const float *kv, const AttnSeq *s, const AttnShape *sh,
                                   size_t g, size_t kt)
{
    size_t p = kt * ATTN_TILE;
    const float *blk = block_at(kv, s, sh, p);
    return blk + g * sh->hd * sh->bs + p % sh->bs;          /* [d * bs + j] */
}

static inline const float *tile_v(const float *kv, const AttnSeq *s, const AttnShape *sh,
                                  size_t g, size_t kt)
{
    size_t p = kt * ATTN_TILE;
    const float *blk = block_at(kv, s, sh, p);
    return blk + sh->Hkv * sh->hd * sh->bs + (g * sh->bs + p % sh->bs) * sh->hd;  /* [j * hd + d] */
}

void attention_kv_store(float *kv, const AttnSeq *seqs, size_t n_seq, const float *restrict k,
                        const float *restrict v, const AttnShape *sh)
{
    const size_t hd = sh->hd, bs = sh->bs, kvw = sh->Hkv * hd;
    for (size_t si = 0; si < n_seq; si++) {
        const AttnSeq *s = &seqs[si];
        for (size_t r = 0; r < s->n; r++) {
            size_t p = s->pos + r;
            float *blk = kv + (size_t)s->blocks[p / bs] * attn_block_floats(sh);
            size_t off = p % bs;
            const float *kr = k + (s->row + r) * kvw, *vr = v + (s->row + r) * kvw;
            for (size_t g = 0; g < sh->Hkv; g++) {
                float *kt = blk + g * hd * bs + off;
                for (size_t d = 0; d < hd; d++) kt[d * bs] = kr[g * hd + d];
                memcpy(blk + sh->Hkv * hd * bs + (g * bs + off) * hd, vr + g * hd, hd * sizeof(float));
            }
        }
    }
}

/* Scores of nv query vectors against one key tile: s[v][j] = (q_v . k_j) * scale. */
static inline void tile_scores(float s[][ATTN_TILE], const float *const *qv, size_t nv,
                               const float *kt, size_t bs, size_t hd, float scale)
{
    for (size_t v = 0; v < nv; v++)
        for (int j = 0; j < ATTN_TILE; j++) s[v][j] = 0.0f;
    for (size_t d = 0; d < hd; d++) {
        const float *kd = kt + d * bs;
        for (size_t v = 0; v < nv; v++) {
            const float a = qv[v][d];
            for (int j = 0; j < ATTN_TILE; j++) s[v][j] = fmaf(a, kd[j], s[v][j]);
        }
    }
    for (size_t v = 0; v < nv; v++)
        for (int j = 0; j < ATTN_TILE; j++) s[v][j] *= scale;
}

/* Number of keys of tile kt visible from position p (p >= 16 kt). */
static inline size_t tile_valid(size_t kt, size_t p)
{
    size_t last = p - kt * ATTN_TILE;
    return last >= ATTN_TILE ? ATTN_TILE : last + 1;
}

struct attn_fw {
    float *out, *lse; const float *q, *kv; const AttnSeq *seqs; size_t n_seq;
    const AttnShape *sh; const size_t *item_start; float scale;
};

/* nv query vectors (rows r_v, heads h_v) of one item over key tiles 0..qt. */
static void fw_vectors(const struct attn_fw *c, const AttnSeq *s, size_t g, size_t qt,
                       const size_t *rows, const size_t *heads, size_t nv)
{
    const AttnShape *sh = c->sh;
    const size_t hd = sh->hd, qw = sh->H * hd;
    const float *qv[QV];
    float sc[QV][ATTN_TILE], m[QV], l[QV], o[QV][HD_MAX];
    size_t pos[QV];
    for (size_t v = 0; v < nv; v++) {
        qv[v] = c->q + (s->row + rows[v]) * qw + heads[v] * hd;
        pos[v] = s->pos + rows[v];
        m[v] = -INFINITY;
        l[v] = 0.0f;
        memset(o[v], 0, hd * sizeof(float));
    }
    for (size_t kt = 0; kt <= qt; kt++) {
        const float *ktp = tile_kt(c->kv, s, sh, g, kt), *vt = tile_v(c->kv, s, sh, g, kt);
        tile_scores(sc, qv, nv, ktp, sh->bs, hd, c->scale);
        for (size_t v = 0; v < nv; v++) {
            size_t nvalid = tile_valid(kt, pos[v]);
            float mx = sc[v][0];
            for (size_t j = 1; j < nvalid; j++) mx = sc[v][j] > mx ? sc[v][j] : mx;
            float mn = mx > m[v] ? mx : m[v];
            float corr = expf(m[v] - mn);
            float p[ATTN_TILE], ps = 0.0f;
            for (size_t j = 0; j < nvalid; j++) {
                p[j] = expf(sc[v][j] - mn);
                ps += p[j];
            }
            l[v] = l[v] * corr + ps;
            m[v] = mn;
            float *ov = o[v];
            for (size_t d = 0; d < hd; d++) ov[d] *= corr;
            for (size_t j = 0; j < nvalid; j++) {
                const float pj = p[j], *vj = vt + j * hd;
                for (size_t d = 0; d < hd; d++) ov[d] = fmaf(pj, vj[d], ov[d]);
            }
        }
    }
    for (size_t v = 0; v < nv; v++) {
        float *dst = c->out + (s->row + rows[v]) * qw + heads[v] * hd;
        for (size_t d = 0; d < hd; d++) dst[d] = o[v][d] / l[v];
        if (c->lse) c->lse[(s->row + rows[v]) * sh->H + heads[v]] = m[v] + logf(l[v]);
    }
}

static void fw_items(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct attn_fw *c = vc;
    const AttnShape *sh = c->sh;
    const size_t R = sh->H / sh->Hkv;
    size_t si = 0;
    for (size_t it = i0; it < i1; it++) {
        while (c->item_start[si + 1] <= it) si++;
        const AttnSeq *s = &c->seqs[si];
        size_t local = it - c->item_start[si];
        size_t qt = s->pos / ATTN_TILE + local / sh->Hkv, g = local % sh->Hkv;
        /* rows of this tile */
        size_t p0 = qt * ATTN_TILE > s->pos ? qt * ATTN_TILE : s->pos;
        size_t p1 = (qt + 1) * ATTN_TILE < s->pos + s->n ? (qt + 1) * ATTN_TILE : s->pos + s->n;
        size_t rows[QV], heads[QV], nv = 0;
        for (size_t p = p0; p < p1; p++)
            for (size_t h = g * R; h < (g + 1) * R; h++) {
                rows[nv] = p - s->pos;
                heads[nv] = h;
                if (++nv == QV) {
                    fw_vectors(c, s, g, qt, rows, heads, nv);
                    nv = 0;
                }
            }
        if (nv) fw_vectors(c, s, g, qt, rows, heads, nv);
    }
}

/* Items of a sequence: (query tiles touched) x Hkv. */
static size_t seq_items(const AttnSeq *s, const AttnShape *sh)
{
    if (s->n == 0) return 0;
    size_t t0 = s->pos / ATTN_TILE, t1 = (s->pos + s->n - 1) / ATTN_TILE;
    return (t1 - t0 + 1) * sh->Hkv;
}

void attention_forward(float *out, float *lse, const float *restrict q, const float *kv,
                       const AttnSeq *seqs, size_t n_seq, const AttnShape *sh)
{
    TD_CHECK(sh->hd <= HD_MAX, "attention: head_dim %zu > %d", sh->hd, HD_MAX);
    TD_CHECK(sh->bs % ATTN_TILE == 0, "attention: block size %zu", sh->bs);
    size_t start[n_seq + 1];   /* item prefix sums; n_seq is a batch size, small */
    start[0] = 0;
    for (size_t i = 0; i < n_seq; i++) start[i + 1] = start[i] + seq_items(&seqs[i], sh);
    struct attn_fw c = { out, lse, q, kv, seqs, n_seq, sh, start, 1.0f / sqrtf((float)sh->hd) };
    pool_for(start[n_seq], 1, fw_items, &c);
}

/* ---------------------------------------------------------------- backward */

struct attn_bw {
    float *dq, *dk, *dv; const float *dout, *q, *out, *lse, *kv; const AttnSeq *seqs;
    const AttnShape *sh; float scale;
};

static void bw_item(const struct attn_bw *c, const AttnSeq *s, size_t g)
{
    const AttnShape *sh = c->sh;
    const size_t hd = sh->hd, H = sh->H, R = H / sh->Hkv, qw = H * hd, kvw = sh->Hkv * hd;
    const float scale = c->scale;
    for (size_t r = 0; r < s->n; r++) {
        const size_t p = s->pos + r, qt = p / ATTN_TILE;
        for (size_t h = g * R; h < (g + 1) * R; h++) {
            const float *q = c->q + (s->row + r) * qw + h * hd;
            const float *dout = c->dout + (s->row + r) * qw + h * hd;
            const float *o = c->out + (s->row + r) * qw + h * hd;
            float *dq = c->dq + (s->row + r) * qw + h * hd;
            const float lse = c->lse[(s->row + r) * H + h];
            const float D = vec_dot(dout, o, hd);
            for (size_t kt = 0; kt <= qt; kt++) {
                const float *ktp = tile_kt(c->kv, s, sh, g, kt), *vt = tile_v(c->kv, s, sh, g, kt);
                const float *qv[1] = { q };
                float sc[1][ATTN_TILE];
                tile_scores(sc, qv, 1, ktp, sh->bs, hd, scale);
                size_t nvalid = tile_valid(kt, p);
                for (size_t j = 0; j < nvalid; j++) {
                    const size_t key = kt * ATTN_TILE + j;   /* row of the key: pos 0 based */
                    const float pj = expf(sc[0][j] - lse);
                    const float *vj = vt + j * hd;
                    const float ds = pj * (vec_dot(dout, vj, hd) - D);
                    float *dvj = c->dv + (s->row + key) * kvw + g * hd;
                    float *dkj = c->dk + (s->row + key) * kvw + g * hd;
                    const float a = scale * ds;
                    for (size_t d = 0; d < hd; d++) {
                        dvj[d] += pj * dout[d];
                        dkj[d] += a * q[d];
                        dq[d] += a * ktp[d * sh->bs + j];
                    }
                }
            }
        }
    }
}

static void bw_items(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct attn_bw *c = vc;
    for (size_t it = i0; it < i1; it++)
        bw_item(c, &c->seqs[it / c->sh->Hkv], it % c->sh->Hkv);
}

void attention_backward(float *dq, float *dk, float *dv, const float *restrict dout,
                        const float *restrict q, const float *restrict out,
                        const float *restrict lse, const float *kv, const AttnSeq *seqs,
                        size_t n_seq, const AttnShape *sh)
{
    for (size_t i = 0; i < n_seq; i++)
        TD_CHECK(seqs[i].pos == 0, "attention_backward: sequence %zu starts at %zu, not 0",
                 i, seqs[i].pos);
    struct attn_bw c = { dq, dk, dv, dout, q, out, lse, kv, seqs, sh, 1.0f / sqrtf((float)sh->hd) };
    pool_for(n_seq * sh->Hkv, 1, bw_items, &c);
}

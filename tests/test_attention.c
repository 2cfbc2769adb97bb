/* tests/test_attention.c - blocked causal GQA attention (core/ops/attention.h).
 *
 * Keys and values go through the paged layout of the header: a pool of
 * blocks, per-sequence block tables with shuffled (non-identity) ids and a
 * few spare blocks, bs = 16 and 32.  Unwritten pool memory is NaN, so any
 * read of a key that is not visible (or not stored) poisons the result.
 * Checked against a naive double-precision T x T causal softmax attention
 * written here, PyTorch (attention.h5 from tests/ref/fixtures_ops.py, float64
 * softmax attention and autograd) and central finite differences of the
 * naive forward; decode steps and chunked prefill bit for bit against the
 * full forward (also at long contexts, where decode scores several tiles at
 * once); 1 vs 2 threads bit for bit (both backward schedules); the vector
 * kernels (AVX-512 or AVX2, whichever the build has) against the portable
 * ones bit for bit, and the exp of core/ops/vexp.h against double exp (and its
 * vector forms against the portable one, bit for bit). */

/* The portable path of core/ops/attention.c, compiled into this file under
 * other names (as tests/test_gemm.c does for the GEMM), so that the
 * library's kernels (AVX-512 or AVX2 when the build machine has them) can be
 * compared with it bit for bit in one binary. */
#include "core/ops/attention.h"
#define TANDEM_PORTABLE 1
#define attention_kv_store portable_attention_kv_store
#define attention_forward portable_attention_forward
#define attention_kv_store_heads portable_attention_kv_store_heads
#define attention_forward_heads portable_attention_forward_heads
#define attention_kv_store_prefetch portable_attention_kv_store_prefetch
#define attention_backward portable_attention_backward
#define attention_backward_chunks portable_attention_backward_chunks
#include "core/ops/attention.c"
#undef attention_kv_store
#undef attention_forward
#undef attention_kv_store_heads
#undef attention_forward_heads
#undef attention_kv_store_prefetch
#undef attention_backward
#undef attention_backward_chunks
#undef TANDEM_PORTABLE

#include "core/common.h"
#include "core/pool.h"
#include "core/ops/vexp.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(attention, .init = setup, .fini = teardown);

static const char *const FX = "attention.h5";

/* ------------------------------------------------------------ paged layout */

#define MAX_SEQ 8

typedef struct {
    AttnShape sh;
    size_t n_seq, rows;
    size_t len[MAX_SEQ];        /* positions of each sequence */
    int32_t *table[MAX_SEQ];    /* owned block tables */
    AttnSeq seq[MAX_SEQ];       /* the whole sequences: row, n = len, pos = 0 */
    float *kv;                  /* owned pool of n_blocks blocks, NaN where unwritten */
    size_t n_blocks;
} Layout;

/* A pool whose blocks hold keys and values as kv: unwritten bytes are
 * 0xFF (a NaN in f32 and bf16, a NaN scale in int8). */
static void layout_init_kv(Layout *L, size_t H, size_t Hkv, size_t hd, size_t bs, const size_t *lens, size_t n_seq,
                           uint64_t seed, Dtype kv)
{
    cr_assert(n_seq <= MAX_SEQ);
    memset(L, 0, sizeof *L);
    L->sh = (AttnShape){ .H = H, .Hkv = Hkv, .dk = hd, .bs = bs, .kv = kv, .dv = hd, .scale = 1.0f / sqrtf((float)hd) };
    L->n_seq = n_seq;
    size_t nb = 3;   /* spare blocks nobody uses */
    for (size_t i = 0; i < n_seq; i++) nb += (lens[i] + bs - 1) / bs;
    L->n_blocks = nb;
    /* a deterministic shuffle of the block ids (Fisher-Yates) */
    int32_t *perm = td_malloc(nb * sizeof(int32_t));
    float *u = fixture_rand(nb, seed, 0, 1);
    for (size_t i = 0; i < nb; i++) perm[i] = (int32_t)i;
    for (size_t i = nb - 1; i > 0; i--) {
        size_t j = (size_t)(u[i] * (float)(i + 1)) % (i + 1);
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    size_t next = 0, row = 0;
    for (size_t i = 0; i < n_seq; i++) {
        size_t nbi = (lens[i] + bs - 1) / bs;
        L->len[i] = lens[i];
        L->table[i] = td_malloc((nbi ? nbi : 1) * sizeof(int32_t));
        for (size_t j = 0; j < nbi; j++) L->table[i][j] = perm[next++];
        L->seq[i] = (AttnSeq){ row, lens[i], 0, L->table[i] };
        row += lens[i];
    }
    L->rows = row;
    const size_t nbytes = nb * attn_block_bytes(&L->sh);
    L->kv = td_malloc(nbytes + sizeof(float));
    memset(L->kv, 0xFF, nbytes);
    td_free(perm);
    td_free(u);
}

static void layout_init(Layout *L, size_t H, size_t Hkv, size_t hd, size_t bs,
                        const size_t *lens, size_t n_seq, uint64_t seed)
{
    layout_init_kv(L, H, Hkv, hd, bs, lens, n_seq, seed, DTYPE_F32);
}

static void layout_clear(Layout *L)
{
    memset(L->kv, 0xFF, L->n_blocks * attn_block_bytes(&L->sh));
}

static void layout_free(Layout *L)
{
    for (size_t i = 0; i < L->n_seq; i++) td_free(L->table[i]);
    td_free(L->kv);
}

static int is_identity(const Layout *L)
{
    int32_t b = 0;
    for (size_t i = 0; i < L->n_seq; i++)
        for (size_t j = 0; j < (L->len[i] + L->sh.bs - 1) / L->sh.bs; j++)
            if (L->table[i][j] != b++) return 0;
    return 1;
}

/* ------------------------------------------------------------ naive reference */

/* The sliding window of the naive references (0: none): keys j with
 * t - W < j <= t, p[j] = 0 for the others.  Set around a call only. */
static size_t g_naive_window;

/* The attention probabilities of one query qv (head offset goff in the
 * kv rows) of position t over the keys at rows row .. row + t, in double:
 * p[j] = softmax_j(q . k_j scale) (0 outside g_naive_window).  Returns the
 * log-sum-exp of the scores. */
static double naive_probs(double *p, const double *qv, const double *k, size_t row, size_t t, size_t kw,
                          size_t goff, size_t hd, double scale)
{
    const size_t lo = g_naive_window && t + 1 > g_naive_window ? t + 1 - g_naive_window : 0;
    double m = -INFINITY, l = 0;
    for (size_t j = lo; j <= t; j++) {
        double dot = 0;
        for (size_t d = 0; d < hd; d++) dot += qv[d] * k[(row + j) * kw + goff + d];
        p[j] = dot * scale;
        m = p[j] > m ? p[j] : m;
    }
    for (size_t j = lo; j <= t; j++) l += exp(p[j] - m);
    for (size_t j = lo; j <= t; j++) p[j] = exp(p[j] - m) / l;
    for (size_t j = 0; j < lo; j++) p[j] = 0;
    return m + log(l);
}

/* Set by the bidirectional tests: the naive reference lets every query see
 * all the keys of its sequence (AttnShape.bidir), not only those up to its
 * own position. */
static bool naive_bidir;

/* The last key row (within its sequence) a query at t of a sequence of len sees. */
static size_t naive_last(size_t t, size_t len) { return naive_bidir ? len - 1 : t; }

/* Causal (naive_bidir: bidirectional) GQA softmax attention of sequences
 * starting at position 0 (rows concatenated), full T x T scores in double.  out (rows, H*hd), lse (rows, H)
 * (may be NULL). */
static void naive_attention(double *out, double *lse, const double *q, const double *k,
                            const double *v, const size_t *lens, size_t n_seq,
                            size_t H, size_t Hkv, size_t hd)
{
    const size_t R = H / Hkv, qw = H * hd, kw = Hkv * hd;
    const double scale = 1.0 / sqrt((double)hd);
    size_t T_max = 1;
    for (size_t i = 0; i < n_seq; i++) T_max = lens[i] > T_max ? lens[i] : T_max;
    double *p = td_malloc(T_max * sizeof(double));
    size_t row = 0;
    for (size_t i = 0; i < n_seq; i++) {
        for (size_t t = 0; t < lens[i]; t++)
            for (size_t h = 0; h < H; h++) {
                const size_t goff = h / R * hd, last = naive_last(t, lens[i]);
                const double l = naive_probs(p, q + (row + t) * qw + h * hd, k, row, last, kw, goff, hd, scale);
                if (lse) lse[(row + t) * H + h] = l;
                double *o = out + (row + t) * qw + h * hd;
                for (size_t d = 0; d < hd; d++) {
                    double a = 0;
                    for (size_t j = 0; j <= last; j++) a += p[j] * v[(row + j) * kw + goff + d];
                    o[d] = a;
                }
            }
        row += lens[i];
    }
    td_free(p);
}

/* Gradients of sum(dout * attention) in double, for naive_attention's
 * sequences and shapes, added into dq (rows, H*hd), dk and dv (rows,
 * Hkv*hd):  p = softmax(s), dp_j = dout . v_j, D = sum_j p_j dp_j,
 * ds_j = p_j (dp_j - D) scale; dq += ds_j k_j, dk_j += ds_j q, dv_j += p_j dout. */
static void naive_attention_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                     const double *k, const double *v, const size_t *lens, size_t n_seq,
                                     size_t H, size_t Hkv, size_t hd)
{
    const size_t R = H / Hkv, qw = H * hd, kw = Hkv * hd;
    const double scale = 1.0 / sqrt((double)hd);
    size_t T_max = 1;
    for (size_t i = 0; i < n_seq; i++) T_max = lens[i] > T_max ? lens[i] : T_max;
    double *p = td_malloc(T_max * sizeof(double)), *dp = td_malloc(T_max * sizeof(double));
    size_t row = 0;
    for (size_t i = 0; i < n_seq; i++) {
        for (size_t t = 0; t < lens[i]; t++)
            for (size_t h = 0; h < H; h++) {
                const size_t goff = h / R * hd, qo = (row + t) * qw + h * hd, last = naive_last(t, lens[i]);
                naive_probs(p, q + qo, k, row, last, kw, goff, hd, scale);
                double D = 0;
                for (size_t j = 0; j <= last; j++) {
                    const double *vj = v + (row + j) * kw + goff;
                    dp[j] = 0;
                    for (size_t d = 0; d < hd; d++) dp[j] += dout[qo + d] * vj[d];
                    D += p[j] * dp[j];
                }
                for (size_t j = 0; j <= last; j++) {
                    const double ds = p[j] * (dp[j] - D) * scale;
                    const size_t ko = (row + j) * kw + goff;
                    for (size_t d = 0; d < hd; d++) {
                        dq[qo + d] += ds * k[ko + d];
                        dk[ko + d] += ds * q[qo + d];
                        dv[ko + d] += p[j] * dout[qo + d];
                    }
                }
            }
        row += lens[i];
    }
    td_free(p);
    td_free(dp);
}

static double *to_f64(const float *x, size_t n)
{
    double *y = td_malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static float *to_f32(const double *x, size_t n)
{
    float *y = td_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

/* Random q (rows, H*hd), k, v (rows, Hkv*hd) for a layout. */
typedef struct { float *q, *k, *v; } Qkv;

static Qkv qkv_rand(const Layout *L, uint64_t seed)
{
    const size_t rows = L->rows, qw = L->sh.H * L->sh.dk, kw = L->sh.Hkv * L->sh.dk;
    Qkv x = { fixture_rand(rows * qw, seed, -2, 2), fixture_rand(rows * kw, seed + 1, -2, 2),
              fixture_rand(rows * kw, seed + 2, -1, 1) };
    return x;
}

static void qkv_free(Qkv *x)
{
    td_free(x->q);
    td_free(x->k);
    td_free(x->v);
}

/* Configurations: H, Hkv, hd (GQA ratio 1, 2, 6). */
static const size_t CONFIGS[][3] = { { 4, 4, 16 }, { 4, 2, 8 }, { 6, 1, 64 } };
#define N_CONFIGS (sizeof CONFIGS / sizeof *CONFIGS)

/* ------------------------------------------------------------ layout */

Test(attention, kv_store_writes_the_documented_block_layout)
{
    const size_t lens[] = { 5, 40, 16 };
    Layout L;
    layout_init(&L, 4, 2, 8, 32, lens, 3, 1);
    cr_expect(!is_identity(&L), "the block table should be shuffled");
    cr_expect_eq((attn_block_bytes(&L.sh) / sizeof(float)), 2 * 2 * 8 * 32, "block floats");
    Qkv x = qkv_rand(&L, 2);
    attention_kv_store(L.kv, L.seq, L.n_seq, x.k, x.v, &L.sh);
    const size_t hd = 8, bs = 32, Hkv = 2, kw = Hkv * hd;
    size_t bad = 0, written = 0;
    for (size_t i = 0; i < L.n_seq; i++)
        for (size_t p = 0; p < L.len[i]; p++) {
            const float *blk = L.kv + (size_t)L.table[i][p / bs] * (attn_block_bytes(&L.sh) / sizeof(float));
            const size_t off = p % bs, r = L.seq[i].row + p;
            for (size_t g = 0; g < Hkv; g++)
                for (size_t d = 0; d < hd; d++) {
                    /* K^T [Hkv][hd][bs] then V [Hkv][bs][hd] */
                    bad += blk[(g * hd + d) * bs + off] != x.k[r * kw + g * hd + d];
                    bad += blk[Hkv * hd * bs + (g * bs + off) * hd + d] != x.v[r * kw + g * hd + d];
                    written += 2;
                }
        }
    cr_expect_eq(bad, 0, "%zu stored floats are not where the header says", bad);
    size_t finite = 0, nf = L.n_blocks * (attn_block_bytes(&L.sh) / sizeof(float));
    for (size_t i = 0; i < nf; i++) finite += !isnan(L.kv[i]);
    cr_expect_eq(finite, written, "%zu floats written, %zu expected (nothing else touched)", finite, written);
    qkv_free(&x);
    layout_free(&L);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ forward */

Test(attention, forward_matches_naive_double_softmax_attention)
{
    const size_t lens[] = { 1, 17, 37, 32 };   /* odd lengths and a full block */
    for (size_t c = 0; c < N_CONFIGS; c++)
        for (size_t bs = 16; bs <= 32; bs += 16) {
            const size_t H = CONFIGS[c][0], Hkv = CONFIGS[c][1], hd = CONFIGS[c][2];
            Layout L;
            layout_init(&L, H, Hkv, hd, bs, lens, 4, 10 + c + bs);
            Qkv x = qkv_rand(&L, 20 + c);
            const size_t rows = L.rows, qw = H * hd, kw = Hkv * hd;
            attention_kv_store(L.kv, L.seq, L.n_seq, x.k, x.v, &L.sh);
            float *out = td_malloc(rows * qw * sizeof(float)), *lse = td_malloc(rows * H * sizeof(float));
            attention_forward(out, lse, x.q, L.kv, L.seq, L.n_seq, &L.sh);
            double *qd = to_f64(x.q, rows * qw), *kd = to_f64(x.k, rows * kw), *vd = to_f64(x.v, rows * kw);
            double *od = td_malloc(rows * qw * sizeof(double)), *ld = td_malloc(rows * H * sizeof(double));
            naive_attention(od, ld, qd, kd, vd, lens, 4, H, Hkv, hd);
            float *o_want = to_f32(od, rows * qw), *l_want = to_f32(ld, rows * H);
            /* Scores are float FMA chains over hd <= 64 products of values in
             * [-2, 2] (error ~1e-6 of scores of size ~1), exps and the online
             * rescaling add a few ulp; outputs are averages of v in [-1, 1].
             * Observed < 5e-7; 4e-6 absolute allowed. lse (<= ~10): 4e-6
             * absolute + 1e-6 relative. */
            char what[80];
            snprintf(what, sizeof what, "out, H=%zu Hkv=%zu hd=%zu bs=%zu", H, Hkv, hd, bs);
            EXPECT_CLOSE(out, o_want, rows * qw, 4e-6, 0, what);
            snprintf(what, sizeof what, "lse, H=%zu Hkv=%zu hd=%zu bs=%zu", H, Hkv, hd, bs);
            EXPECT_CLOSE(lse, l_want, rows * H, 4e-6, 1e-6, what);
            td_free(out);
            td_free(lse);
            td_free(qd);
            td_free(kd);
            td_free(vd);
            td_free(od);
            td_free(ld);
            td_free(o_want);
            td_free(l_want);
            qkv_free(&x);
            layout_free(&L);
        }
    EXPECT_NO_LEAKS();
}

Test(attention, forward_matches_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 3, "attention.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t H = (size_t)dims[0], Hkv = (size_t)dims[1], hd = (size_t)dims[2], n_seq = (size_t)dims[3];
        int32_t *lens32 = fixture_case_i32(FX, c, "lens", NULL);
        size_t lens[MAX_SEQ];
        for (size_t i = 0; i < n_seq; i++) lens[i] = (size_t)lens32[i];
        const size_t bs = c % 2 ? 32 : 16;
        Layout L;
        layout_init(&L, H, Hkv, hd, bs, lens, n_seq, 30 + (uint64_t)c);
        L.sh.window = (size_t)dims[4];   /* torch's mask: HF's sliding_window */
        float *q = fixture_case_f32(FX, c, "q", NULL), *k = fixture_case_f32(FX, c, "k", NULL);
        float *v = fixture_case_f32(FX, c, "v", NULL);
        float *o_ref = fixture_case_f32(FX, c, "out", NULL), *l_ref = fixture_case_f32(FX, c, "lse", NULL);
        const size_t rows = L.rows, qw = H * hd;
        attention_kv_store(L.kv, L.seq, n_seq, k, v, &L.sh);
        float *out = td_malloc(rows * qw * sizeof(float)), *lse = td_malloc(rows * H * sizeof(float));
        attention_forward(out, lse, q, L.kv, L.seq, n_seq, &L.sh);
        /* see forward_matches_naive_double_softmax_attention */
        char what[80];
        snprintf(what, sizeof what, "out, case %d (H=%zu Hkv=%zu hd=%zu bs=%zu window=%zu)", c, H, Hkv, hd, bs,
                 L.sh.window);
        EXPECT_CLOSE(out, o_ref, rows * qw, 4e-6, 0, what);
        snprintf(what, sizeof what, "lse, case %d", c);
        EXPECT_CLOSE(lse, l_ref, rows * H, 4e-6, 1e-6, what);
        td_free(dims);
        td_free(lens32);
        td_free(q);
        td_free(k);
        td_free(v);
        td_free(o_ref);
        td_free(l_ref);
        td_free(out);
        td_free(lse);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

/* Full forward of a layout with all of its keys stored. */
static void full_forward(float **out, float **lse, const Layout *L, const Qkv *x)
{
    *out = td_malloc(L->rows * L->sh.H * L->sh.dk * sizeof(float));
    *lse = td_malloc(L->rows * L->sh.H * sizeof(float));
    attention_kv_store(L->kv, L->seq, L->n_seq, x->k, x->v, &L->sh);
    attention_forward(*out, *lse, x->q, L->kv, L->seq, L->n_seq, &L->sh);
}

Test(attention, decode_step_gives_the_bits_of_the_full_forward_row)
{
    const size_t lens[] = { 37, 20, 5 };
    for (size_t c = 0; c < N_CONFIGS; c++)
        for (size_t bs = 16; bs <= 32; bs += 16) {
            const size_t H = CONFIGS[c][0], Hkv = CONFIGS[c][1], hd = CONFIGS[c][2], qw = H * hd;
            Layout L;
            layout_init(&L, H, Hkv, hd, bs, lens, 3, 40 + c + bs);
            Qkv x = qkv_rand(&L, 50 + c);
            float *out, *lse;
            full_forward(&out, &lse, &L, &x);
            /* every position of sequence 0 as a one-row decode call (keys
             * 0..p stored; later keys are stored too, and must be ignored) */
            float *o1 = td_malloc(qw * sizeof(float)), *l1 = td_malloc(H * sizeof(float));
            size_t bad = 0, first = lens[0];
            for (size_t p = 0; p < lens[0]; p++) {
                AttnSeq s = { 0, 1, p, L.table[0] };
                attention_forward(o1, l1, x.q + p * qw, L.kv, &s, 1, &L.sh);
                if (fixture_first_diff(o1, out + p * qw, qw) != qw || fixture_first_diff(l1, lse + p * H, H) != H) {
                    bad++;
                    if (first == lens[0]) first = p;
                }
            }
            cr_expect_eq(bad, 0, "H=%zu Hkv=%zu hd=%zu bs=%zu: %zu decode positions differ from the "
                         "full forward, first %zu", H, Hkv, hd, bs, bad, first);
            /* a decode batch: one row of each sequence at its own position */
            const size_t at[3] = { 33, 16, 4 };
            float *qb = td_malloc(3 * qw * sizeof(float)), *ob = td_malloc(3 * qw * sizeof(float));
            float *lb = td_malloc(3 * H * sizeof(float));
            AttnSeq sb[3];
            for (size_t i = 0; i < 3; i++) {
                memcpy(qb + i * qw, x.q + (L.seq[i].row + at[i]) * qw, qw * sizeof(float));
                sb[i] = (AttnSeq){ i, 1, at[i], L.table[i] };
            }
            attention_forward(ob, lb, qb, L.kv, sb, 3, &L.sh);
            for (size_t i = 0; i < 3; i++) {
                char what[96];
                snprintf(what, sizeof what, "decode batch, seq %zu pos %zu, H=%zu Hkv=%zu hd=%zu bs=%zu",
                         i, at[i], H, Hkv, hd, bs);
                EXPECT_BITWISE(ob + i * qw, out + (L.seq[i].row + at[i]) * qw, qw, what);
                EXPECT_BITWISE(lb + i * H, lse + (L.seq[i].row + at[i]) * H, H, what);
            }
            td_free(out);
            td_free(lse);
            td_free(o1);
            td_free(l1);
            td_free(qb);
            td_free(ob);
            td_free(lb);
            qkv_free(&x);
            layout_free(&L);
        }
    EXPECT_NO_LEAKS();
}

Test(attention, chunked_prefill_gives_the_bits_of_the_full_forward)
{
    const size_t lens[] = { 37 };
    /* chunk boundaries: mid-tile, tile-aligned, three chunks with a 1-row one */
    static const size_t cuts[][3] = { { 13, 37, 37 }, { 16, 37, 37 }, { 1, 20, 37 }, { 32, 33, 37 } };
    for (size_t c = 0; c < N_CONFIGS; c++)
        for (size_t bs = 16; bs <= 32; bs += 16) {
            const size_t H = CONFIGS[c][0], Hkv = CONFIGS[c][1], hd = CONFIGS[c][2], qw = H * hd;
            Layout L;
            layout_init(&L, H, Hkv, hd, bs, lens, 1, 60 + c + bs);
            Qkv x = qkv_rand(&L, 70 + c);
            float *out, *lse;
            full_forward(&out, &lse, &L, &x);
            float *oc = td_malloc(37 * qw * sizeof(float)), *lc = td_malloc(37 * H * sizeof(float));
            for (size_t u = 0; u < sizeof cuts / sizeof *cuts; u++) {
                layout_clear(&L);   /* fresh NaN pool: keys arrive chunk by chunk */
                size_t p0 = 0;
                for (size_t j = 0; j < 3; j++) {
                    size_t p1 = cuts[u][j];
                    if (p1 == p0) continue;
                    /* rows of the chunk are rows 0.. of its own buffers */
                    AttnSeq s = { 0, p1 - p0, p0, L.table[0] };
                    attention_kv_store(L.kv, &s, 1, x.k + p0 * Hkv * hd, x.v + p0 * Hkv * hd, &L.sh);
                    attention_forward(oc + p0 * qw, lc + p0 * H, x.q + p0 * qw, L.kv, &s, 1, &L.sh);
                    p0 = p1;
                }
                char what[96];
                snprintf(what, sizeof what, "chunks ..%zu ..%zu ..%zu, H=%zu Hkv=%zu hd=%zu bs=%zu",
                         cuts[u][0], cuts[u][1], cuts[u][2], H, Hkv, hd, bs);
                EXPECT_BITWISE(oc, out, 37 * qw, what);
                EXPECT_BITWISE(lc, lse, 37 * H, what);
            }
            td_free(out);
            td_free(lse);
            td_free(oc);
            td_free(lc);
            qkv_free(&x);
            layout_free(&L);
        }
    EXPECT_NO_LEAKS();
}

Test(attention, rows_do_not_depend_on_the_other_sequences_of_the_batch)
{
    const size_t lens3[] = { 20, 37, 5 }, lens1[] = { 37 };
    const size_t H = 4, Hkv = 2, hd = 16, qw = H * hd, kw = Hkv * hd;
    Layout L3, L1;
    layout_init(&L3, H, Hkv, hd, 16, lens3, 3, 80);
    layout_init(&L1, H, Hkv, hd, 16, lens1, 1, 81);
    Qkv x3 = qkv_rand(&L3, 82);
    Qkv x1 = { fixture_copy(x3.q + 20 * qw, 37 * qw), fixture_copy(x3.k + 20 * kw, 37 * kw),
               fixture_copy(x3.v + 20 * kw, 37 * kw) };
    float *o3, *l3, *o1, *l1;
    full_forward(&o3, &l3, &L3, &x3);
    full_forward(&o1, &l1, &L1, &x1);
    EXPECT_BITWISE(o1, o3 + 20 * qw, 37 * qw, "sequence alone vs second of three: out");
    EXPECT_BITWISE(l1, l3 + 20 * H, 37 * H, "sequence alone vs second of three: lse");
    td_free(o3);
    td_free(l3);
    td_free(o1);
    td_free(l1);
    qkv_free(&x3);
    qkv_free(&x1);
    layout_free(&L3);
    layout_free(&L1);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ backward */

Test(attention, backward_accumulates_torch_gradients)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t H = (size_t)dims[0], Hkv = (size_t)dims[1], hd = (size_t)dims[2], n_seq = (size_t)dims[3];
        int32_t *lens32 = fixture_case_i32(FX, c, "lens", NULL);
        size_t lens[MAX_SEQ];
        for (size_t i = 0; i < n_seq; i++) lens[i] = (size_t)lens32[i];
        const size_t bs = c % 2 ? 16 : 32;
        Layout L;
        layout_init(&L, H, Hkv, hd, bs, lens, n_seq, 90 + (uint64_t)c);
        L.sh.window = (size_t)dims[4];
        Qkv x = { fixture_case_f32(FX, c, "q", NULL), fixture_case_f32(FX, c, "k", NULL),
                  fixture_case_f32(FX, c, "v", NULL) };
        float *dout = fixture_case_f32(FX, c, "dout", NULL);
        float *dq_ref = fixture_case_f32(FX, c, "dq", NULL), *dk_ref = fixture_case_f32(FX, c, "dk", NULL);
        float *dv_ref = fixture_case_f32(FX, c, "dv", NULL);
        const size_t rows = L.rows, qw = H * hd, kw = Hkv * hd;
        float *out, *lse;
        full_forward(&out, &lse, &L, &x);
        /* gradients start non-zero: the op must add */
        float *dq = fixture_rand(rows * qw, 100 + (uint64_t)c, -1, 1), *dk = fixture_rand(rows * kw, 101 + (uint64_t)c, -1, 1);
        float *dv = fixture_rand(rows * kw, 102 + (uint64_t)c, -1, 1);
        float *dq_want = td_malloc(rows * qw * sizeof(float)), *dk_want = td_malloc(rows * kw * sizeof(float));
        float *dv_want = td_malloc(rows * kw * sizeof(float));
        for (size_t i = 0; i < rows * qw; i++) dq_want[i] = (float)((double)dq[i] + dq_ref[i]);
        for (size_t i = 0; i < rows * kw; i++) {
            dk_want[i] = (float)((double)dk[i] + dk_ref[i]);
            dv_want[i] = (float)((double)dv[i] + dv_ref[i]);
        }
        attention_backward(dq, dk, dv, dout, x.q, out, lse, L.kv, L.seq, n_seq, &L.sh);
        /* Gradients are sums over up to 37 keys (dq) or 37 queries x 6 heads
         * (dk, dv) of float terms of size <= ~2, each carrying the ~1e-6
         * relative error of p_j = exp(s_j - lse): observed < 3e-6, 1e-5
         * absolute allowed (on top of the O(1) start value). */
        char what[80];
        snprintf(what, sizeof what, "dq, case %d (H=%zu Hkv=%zu hd=%zu bs=%zu window=%zu)", c, H, Hkv, hd, bs,
                 L.sh.window);
        EXPECT_CLOSE(dq, dq_want, rows * qw, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "dk, case %d", c);
        EXPECT_CLOSE(dk, dk_want, rows * kw, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "dv, case %d", c);
        EXPECT_CLOSE(dv, dv_want, rows * kw, 1e-5, 1e-6, what);
        td_free(dims);
        td_free(lens32);
        qkv_free(&x);
        td_free(dout);
        td_free(dq_ref);
        td_free(dk_ref);
        td_free(dv_ref);
        td_free(out);
        td_free(lse);
        td_free(dq);
        td_free(dk);
        td_free(dv);
        td_free(dq_want);
        td_free(dk_want);
        td_free(dv_want);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

typedef struct {
    const double *dout;
    const size_t *lens;
    size_t n_seq, rows, H, Hkv, hd;
    double *out;   /* scratch */
} AttnFd;

/* L = sum dout * attention(q, k, v); p = [q, k, v] */
static double attn_loss(const double *p, void *vctx)
{
    const AttnFd *c = vctx;
    const size_t qn = c->rows * c->H * c->hd, kn = c->rows * c->Hkv * c->hd;
    naive_attention(c->out, NULL, p, p + qn, p + qn + kn, c->lens, c->n_seq, c->H, c->Hkv, c->hd);
    double L = 0;
    for (size_t i = 0; i < qn; i++) L += c->dout[i] * c->out[i];
    return L;
}

Test(attention, backward_matches_finite_differences)
{
    static const struct { size_t H, Hkv, hd, bs, n_seq, lens[3]; } cases[] = {
        { 4, 2, 8, 16, 2, { 5, 17 } },
        { 3, 1, 8, 32, 1, { 37 } },
        { 4, 4, 16, 32, 3, { 1, 20, 3 } },
        { 2, 1, 64, 16, 1, { 9 } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t H = cases[c].H, Hkv = cases[c].Hkv, hd = cases[c].hd, n_seq = cases[c].n_seq;
        Layout L;
        layout_init(&L, H, Hkv, hd, cases[c].bs, cases[c].lens, n_seq, 110 + c);
        Qkv x = qkv_rand(&L, 120 + c);
        const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd, np = qn + 2 * kn;
        float *dout = fixture_rand(qn, 130 + c, -1, 1);
        float *out, *lse;
        full_forward(&out, &lse, &L, &x);
        float *dq = fixture_rand(qn, 140 + c, -1, 1), *dk = fixture_rand(kn, 141 + c, -1, 1);
        float *dv = fixture_rand(kn, 142 + c, -1, 1);
        double *p = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        for (size_t i = 0; i < qn; i++) p[i] = x.q[i];
        for (size_t i = 0; i < kn; i++) {
            p[qn + i] = x.k[i];
            p[qn + kn + i] = x.v[i];
        }
        double *doutd = to_f64(dout, qn);
        AttnFd ctx = { doutd, cases[c].lens, n_seq, rows, H, Hkv, hd, td_malloc(qn * sizeof(double)) };
        fixture_fd(g, attn_loss, &ctx, p, np, 1e-5);
        float *want = td_malloc(np * sizeof(float));
        for (size_t i = 0; i < qn; i++) want[i] = (float)(dq[i] + g[i]);
        for (size_t i = 0; i < kn; i++) {
            want[qn + i] = (float)(dk[i] + g[qn + i]);
            want[qn + kn + i] = (float)(dv[i] + g[qn + kn + i]);
        }
        attention_backward(dq, dk, dv, dout, x.q, out, lse, L.kv, L.seq, n_seq, &L.sh);
        /* FD: h = 1e-5 on a smooth function with O(1) derivatives of all
         * orders: truncation ~1e-10, rounding ~1e-11.  The float backward:
         * see backward_accumulates_torch_gradients (1e-5 absolute). */
        char what[80];
        snprintf(what, sizeof what, "dq vs FD, H=%zu Hkv=%zu hd=%zu", H, Hkv, hd);
        EXPECT_CLOSE(dq, want, qn, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "dk vs FD, H=%zu Hkv=%zu hd=%zu", H, Hkv, hd);
        EXPECT_CLOSE(dk, want + qn, kn, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "dv vs FD, H=%zu Hkv=%zu hd=%zu", H, Hkv, hd);
        EXPECT_CLOSE(dv, want + qn + kn, kn, 1e-5, 1e-6, what);
        td_free(ctx.out);
        td_free(doutd);
        td_free(p);
        td_free(g);
        td_free(want);
        td_free(dout);
        td_free(out);
        td_free(lse);
        td_free(dq);
        td_free(dk);
        td_free(dv);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

Test(attention, backward_of_long_sequences_matches_naive_double)
{
    /* Sequences of 38, 3 and 19 tiles: the backward serves key tiles in
     * spans of 16 (two full spans and a partial one, one short span, a full
     * and a partial one), each query group meeting every tile of a span it
     * sees; bs = 32 puts two tiles in a block. */
    const size_t lens[] = { 600, 37, 290 }, H = 4, Hkv = 2, hd = 24;
    Layout L;
    layout_init(&L, H, Hkv, hd, 32, lens, 3, 300);
    Qkv x = qkv_rand(&L, 310);
    const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd;
    float *dout = fixture_rand(qn, 320, -1, 1);
    float *out, *lse;
    full_forward(&out, &lse, &L, &x);
    float *dq = fixture_rand(qn, 321, -1, 1), *dk = fixture_rand(kn, 322, -1, 1);
    float *dv = fixture_rand(kn, 323, -1, 1);
    double *g = td_malloc((qn + 2 * kn) * sizeof(double));
    for (size_t i = 0; i < qn; i++) g[i] = dq[i];
    for (size_t i = 0; i < kn; i++) {
        g[qn + i] = dk[i];
        g[qn + kn + i] = dv[i];
    }
    double *qd = to_f64(x.q, qn), *kd = to_f64(x.k, kn), *vd = to_f64(x.v, kn), *dd = to_f64(dout, qn);
    naive_attention_backward(g, g + qn, g + qn + kn, dd, qd, kd, vd, lens, 3, H, Hkv, hd);
    float *want = to_f32(g, qn + 2 * kn);
    attention_backward(dq, dk, dv, dout, x.q, out, lse, L.kv, L.seq, 3, &L.sh);
    /* As backward_accumulates_torch_gradients, with up to 600 keys per dq
     * and 600 queries x 2 heads per dk, dv: observed < 4e-6 (dk, dv),
     * 2e-6 (dq); the same 1e-5 absolute allowed. */
    EXPECT_CLOSE(dq, want, qn, 1e-5, 1e-6, "long sequences: dq vs naive");
    EXPECT_CLOSE(dk, want + qn, kn, 1e-5, 1e-6, "long sequences: dk vs naive");
    EXPECT_CLOSE(dv, want + qn + kn, kn, 1e-5, 1e-6, "long sequences: dv vs naive");
    td_free(g);
    td_free(qd);
    td_free(kd);
    td_free(vd);
    td_free(dd);
    td_free(want);
    td_free(dout);
    td_free(out);
    td_free(lse);
    td_free(dq);
    td_free(dk);
    td_free(dv);
    qkv_free(&x);
    layout_free(&L);
    EXPECT_NO_LEAKS();
}

Test(attention, two_threads_bit_identical)
{
    const size_t lens[] = { 37, 17, 1 };
    for (size_t c = 0; c < N_CONFIGS; c++) {
        const size_t H = CONFIGS[c][0], Hkv = CONFIGS[c][1], hd = CONFIGS[c][2];
        Layout L;
        layout_init(&L, H, Hkv, hd, 16, lens, 3, 150 + c);
        Qkv x = qkv_rand(&L, 160 + c);
        const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd;
        float *dout = fixture_rand(qn, 170 + c, -1, 1);
        float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
        for (int t = 0; t < 2; t++) {
            pool_init(t + 1);
            layout_clear(&L);
            full_forward(&out[t], &lse[t], &L, &x);
            dq[t] = fixture_rand(qn, 180, -1, 1);
            dk[t] = fixture_rand(kn, 181, -1, 1);
            dv[t] = fixture_rand(kn, 182, -1, 1);
            attention_backward(dq[t], dk[t], dv[t], dout, x.q, out[t], lse[t], L.kv, L.seq, 3, &L.sh);
        }
        pool_init(1);
        char what[64];
        snprintf(what, sizeof what, "H=%zu Hkv=%zu hd=%zu: out", H, Hkv, hd);
        EXPECT_BITWISE(out[1], out[0], qn, what);
        snprintf(what, sizeof what, "H=%zu Hkv=%zu hd=%zu: lse", H, Hkv, hd);
        EXPECT_BITWISE(lse[1], lse[0], rows * H, what);
        snprintf(what, sizeof what, "H=%zu Hkv=%zu hd=%zu: dq", H, Hkv, hd);
        EXPECT_BITWISE(dq[1], dq[0], qn, what);
        snprintf(what, sizeof what, "H=%zu Hkv=%zu hd=%zu: dk", H, Hkv, hd);
        EXPECT_BITWISE(dk[1], dk[0], kn, what);
        snprintf(what, sizeof what, "H=%zu Hkv=%zu hd=%zu: dv", H, Hkv, hd);
        EXPECT_BITWISE(dv[1], dv[0], kn, what);
        for (int t = 0; t < 2; t++) {
            td_free(out[t]);
            td_free(lse[t]);
            td_free(dq[t]);
            td_free(dk[t]);
            td_free(dv[t]);
        }
        td_free(dout);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ exp */

/* |y - e^x| in units of the last place of e^x (as a float; subnormals have
 * the ulp of the smallest normal binade's neighbours, 2^-149). */
static double exp_ulp_err(float y, float x)
{
    const double ref = exp((double)x);
    if (ref > 0x1.fffffep127) return isinf(y) ? 0 : INFINITY;
    int e;
    frexp(ref, &e);
    const double ulp = fmax(ldexp(1.0, e - 24), ldexp(1.0, -149));
    return fabs((double)y - ref) / ulp;
}

Test(attention, exp_is_within_one_ulp_and_the_same_bits_on_both_paths)
{
    /* Every float in [-104, 89] was checked when core/ops/vexp.h was written:
     * 0.99 ulp at worst, vector = portable everywhere.  Here: 2^20 uniform
     * points, 2^16 around 0 and near the ends, and the special values. */
    enum { N = (1 << 20) + 3 * (1 << 16) };
    float *x = td_malloc(N * sizeof(float));
    fixture_fill(x, 1 << 20, 200, -104.0f, 89.0f);
    fixture_fill(x + (1 << 20), 1 << 16, 201, -1e-3f, 1e-3f);
    fixture_fill(x + (1 << 20) + (1 << 16), 1 << 16, 202, -104.0f, -86.0f);
    fixture_fill(x + (1 << 20) + 2 * (1 << 16), 1 << 16, 203, 86.0f, 89.0f);
    double worst = 0;
    size_t wi = 0, bad_bits = 0;
    for (size_t i = 0; i < N; i++) {
        const double e = exp_ulp_err(vexp1(x[i]), x[i]);
        if (e > worst) {
            worst = e;
            wi = i;
        }
    }
    cr_expect(worst <= 1.0, "vexp1: %.3f ulp at x = %a: got %a, want %a", worst, (double)x[wi],
              (double)vexp1(x[wi]), exp((double)x[wi]));
#ifdef __AVX512F__
    for (size_t i = 0; i + 16 <= N; i += 16) {
        float y[16];
        _mm512_storeu_ps(y, vexp16(_mm512_loadu_ps(x + i)));
        for (int j = 0; j < 16; j++) {
            const float z = vexp1(x[i + j]);
            bad_bits += memcmp(&y[j], &z, sizeof z) != 0;
        }
    }
#endif
    cr_expect_eq(bad_bits, 0, "vexp16 and vexp1 differ on %zu inputs", bad_bits);
#if defined(__AVX2__) && defined(__FMA__)
    bad_bits = 0;
    for (size_t i = 0; i + 8 <= N; i += 8) {
        float y[8];
        _mm256_storeu_ps(y, vexp8(_mm256_loadu_ps(x + i)));
        for (int j = 0; j < 8; j++) {
            const float z = vexp1(x[i + j]);
            bad_bits += memcmp(&y[j], &z, sizeof z) != 0;
        }
    }
    cr_expect_eq(bad_bits, 0, "vexp8 and vexp1 differ on %zu inputs", bad_bits);
#endif
    static const float sp[] = { 0.0f, -0.0f, -INFINITY, INFINITY, -104.0f, -200.0f, 88.8f, 1000.0f };
    static const float want[] = { 1.0f, 1.0f, 0.0f, INFINITY, 0.0f, 0.0f, INFINITY, INFINITY };
    for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) {
        const float y = vexp1(sp[i]);
        cr_expect(memcmp(&y, &want[i], sizeof y) == 0, "exp(%g) = %a, want %a", (double)sp[i], (double)y,
                  (double)want[i]);
#ifdef __AVX512F__
        const float v = _mm512_cvtss_f32(vexp16(_mm512_set1_ps(sp[i])));
        cr_expect(memcmp(&v, &y, sizeof y) == 0, "vexp16(%g) = %a, vexp1 %a", (double)sp[i], (double)v, (double)y);
#endif
    }
    cr_expect(isnan(vexp1(NAN)), "exp(NaN) should be NaN");
#if defined(__AVX2__) && defined(__FMA__)
    /* vexp8 = vexp1 bit for bit at the edges: infinities, NaNs (their
     * payloads too), the clamps and just inside them, subnormal results
     * (x < -87.34), overflow, signed zeros and tiny or subnormal x. */
    static const float edge[] = { 0.0f, -0.0f, -INFINITY, INFINITY, NAN, -NAN, -104.0f, 89.0f,
                                  -103.99999f, 88.99999f, -104.00001f, 89.00001f, -103.97f, -103.28f,
                                  -100.0f, -95.5f, -90.0f, -88.0f, -87.5f, -87.33655f, -87.3365f,
                                  88.72283f, 88.72284f, 88.7f, 1e-30f, -1e-30f, 1e-40f, -1e-40f,
                                  0x1p-149f, -0x1p-149f, 0x1p-126f, 1.0f, -1.0f, 0.5f, -0.5f,
                                  0x1.fffffep127f, -0x1.fffffep127f, 1e6f, -1e6f, -150.0f };
    enum { NE = sizeof edge / sizeof *edge };
    float ex[NE + 8] = { 0 }, ey[NE + 8];
    memcpy(ex, edge, sizeof edge);
    for (size_t i = 0; i < NE; i += 8) _mm256_storeu_ps(ey + i, vexp8(_mm256_loadu_ps(ex + i)));
    for (size_t i = 0; i < NE; i++) {
        const float z = vexp1(ex[i]);
        cr_expect(memcmp(&ey[i], &z, sizeof z) == 0, "vexp8(%a) = %a, vexp1 %a", (double)ex[i], (double)ey[i],
                  (double)z);
    }
#endif
    td_free(x);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ long contexts, kernel paths */

/* Shapes that reach every kernel variant: one query per item (R = 1: decode
 * scores 8 tiles at once), 3 (3 tiles), 8 (R = 8: a prefill tile has 128
 * queries, two groups), hd not a multiple of 16, nor of 8 (20: the AVX2
 * path's one-float tails), and hd with two chunk groups (80) or four (256). */
static const size_t LONG_CONFIGS[][3] = { { 2, 2, 16 }, { 6, 2, 24 }, { 8, 1, 8 }, { 2, 1, 80 }, { 1, 1, 256 },
                                          { 3, 1, 20 } };
#define N_LONG (sizeof LONG_CONFIGS / sizeof *LONG_CONFIGS)

Test(attention, long_context_decode_and_chunks_give_the_bits_of_the_full_forward)
{
    const size_t lens[] = { 203 };
    static const size_t cuts[][3] = { { 77, 150, 203 }, { 128, 129, 203 }, { 5, 200, 203 } };
    for (size_t c = 0; c < N_LONG; c++) {
        const size_t H = LONG_CONFIGS[c][0], Hkv = LONG_CONFIGS[c][1], hd = LONG_CONFIGS[c][2], qw = H * hd;
        const size_t bs = c % 2 ? 32 : 16, T = lens[0];
        Layout L;
        layout_init(&L, H, Hkv, hd, bs, lens, 1, 210 + c);
        Qkv x = qkv_rand(&L, 220 + c);
        float *out, *lse;
        full_forward(&out, &lse, &L, &x);
        char what[112];
        /* against the naive double attention, as forward_matches_naive_... */
        double *qd = to_f64(x.q, T * qw), *kd = to_f64(x.k, T * Hkv * hd), *vd = to_f64(x.v, T * Hkv * hd);
        double *od = td_malloc(T * qw * sizeof(double)), *ld = td_malloc(T * H * sizeof(double));
        naive_attention(od, ld, qd, kd, vd, lens, 1, H, Hkv, hd);
        float *o_want = to_f32(od, T * qw), *l_want = to_f32(ld, T * H);
        /* up to 256 products per score (hd) and 203 keys: a few ulp more
         * than the short cases; observed < 1e-6 */
        snprintf(what, sizeof what, "long out vs naive, H=%zu Hkv=%zu hd=%zu", H, Hkv, hd);
        EXPECT_CLOSE(out, o_want, T * qw, 4e-6, 0, what);
        snprintf(what, sizeof what, "long lse vs naive, H=%zu Hkv=%zu hd=%zu", H, Hkv, hd);
        EXPECT_CLOSE(lse, l_want, T * H, 4e-6, 1e-6, what);
        /* decode at every position */
        float *o1 = td_malloc(qw * sizeof(float)), *l1 = td_malloc(H * sizeof(float));
        size_t bad = 0, first = T;
        for (size_t p = 0; p < T; p++) {
            AttnSeq s1 = { 0, 1, p, L.table[0] };
            attention_forward(o1, l1, x.q + p * qw, L.kv, &s1, 1, &L.sh);
            if (fixture_first_diff(o1, out + p * qw, qw) != qw || fixture_first_diff(l1, lse + p * H, H) != H) {
                bad++;
                first = first < p ? first : p;
            }
        }
        cr_expect_eq(bad, 0, "H=%zu Hkv=%zu hd=%zu bs=%zu: %zu decode positions differ from the full "
                     "forward, first %zu", H, Hkv, hd, bs, bad, first);
        /* chunked prefill */
        float *oc = td_malloc(T * qw * sizeof(float)), *lc = td_malloc(T * H * sizeof(float));
        for (size_t u = 0; u < sizeof cuts / sizeof *cuts; u++) {
            layout_clear(&L);
            for (size_t j = 0, p0 = 0; j < 3; p0 = cuts[u][j++]) {
                AttnSeq sc = { 0, cuts[u][j] - p0, p0, L.table[0] };
                attention_kv_store(L.kv, &sc, 1, x.k + p0 * Hkv * hd, x.v + p0 * Hkv * hd, &L.sh);
                attention_forward(oc + p0 * qw, lc + p0 * H, x.q + p0 * qw, L.kv, &sc, 1, &L.sh);
            }
            snprintf(what, sizeof what, "chunks ..%zu ..%zu ..%zu, H=%zu Hkv=%zu hd=%zu bs=%zu", cuts[u][0],
                     cuts[u][1], cuts[u][2], H, Hkv, hd, bs);
            EXPECT_BITWISE(oc, out, T * qw, what);
            EXPECT_BITWISE(lc, lse, T * H, what);
        }
        td_free(qd);
        td_free(kd);
        td_free(vd);
        td_free(od);
        td_free(ld);
        td_free(o_want);
        td_free(l_want);
        td_free(o1);
        td_free(l1);
        td_free(oc);
        td_free(lc);
        td_free(out);
        td_free(lse);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

Test(attention, vector_and_portable_kernels_give_the_same_bits)
{
    /* The library's kernels (AVX-512 or AVX2 on this machine when it has
     * them) against the portable ones compiled into this file: forward
     * (full, decode batch) and backward, bit for bit. */
    const size_t lens[] = { 150, 37, 1 };
    for (size_t c = 0; c < N_LONG; c++) {
        const size_t H = LONG_CONFIGS[c][0], Hkv = LONG_CONFIGS[c][1], hd = LONG_CONFIGS[c][2];
        Layout L;
        layout_init(&L, H, Hkv, hd, 16, lens, 3, 230 + c);
        Qkv x = qkv_rand(&L, 240 + c);
        const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd;
        float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
        float *dout = fixture_rand(qn, 250 + c, -1, 1);
        for (int t = 0; t < 2; t++) {
            out[t] = td_malloc(qn * sizeof(float));
            lse[t] = td_malloc(rows * H * sizeof(float));
            dq[t] = fixture_rand(qn, 251, -1, 1);
            dk[t] = fixture_rand(kn, 252, -1, 1);
            dv[t] = fixture_rand(kn, 253, -1, 1);
        }
        attention_kv_store(L.kv, L.seq, 3, x.k, x.v, &L.sh);
        attention_forward(out[0], lse[0], x.q, L.kv, L.seq, 3, &L.sh);
        portable_attention_forward(out[1], lse[1], x.q, L.kv, L.seq, 3, &L.sh);
        attention_backward(dq[0], dk[0], dv[0], dout, x.q, out[0], lse[0], L.kv, L.seq, 3, &L.sh);
        portable_attention_backward(dq[1], dk[1], dv[1], dout, x.q, out[0], lse[0], L.kv, L.seq, 3, &L.sh);
        char what[80];
        snprintf(what, sizeof what, "portable vs library, H=%zu Hkv=%zu hd=%zu: out", H, Hkv, hd);
        EXPECT_BITWISE(out[1], out[0], qn, what);
        snprintf(what, sizeof what, "portable vs library, H=%zu Hkv=%zu hd=%zu: lse", H, Hkv, hd);
        EXPECT_BITWISE(lse[1], lse[0], rows * H, what);
        snprintf(what, sizeof what, "portable vs library, H=%zu Hkv=%zu hd=%zu: dq", H, Hkv, hd);
        EXPECT_BITWISE(dq[1], dq[0], qn, what);
        snprintf(what, sizeof what, "portable vs library, H=%zu Hkv=%zu hd=%zu: dk", H, Hkv, hd);
        EXPECT_BITWISE(dk[1], dk[0], kn, what);
        snprintf(what, sizeof what, "portable vs library, H=%zu Hkv=%zu hd=%zu: dv", H, Hkv, hd);
        EXPECT_BITWISE(dv[1], dv[0], kn, what);
        /* a decode batch: one row of each sequence at its last position */
        const size_t qw = H * hd;
        float *qb = td_malloc(3 * qw * sizeof(float)), *ob[2], *lb[2];
        AttnSeq sb[3];
        for (size_t i = 0; i < 3; i++) {
            memcpy(qb + i * qw, x.q + (L.seq[i].row + lens[i] - 1) * qw, qw * sizeof(float));
            sb[i] = (AttnSeq){ i, 1, lens[i] - 1, L.table[i] };
        }
        for (int t = 0; t < 2; t++) {
            ob[t] = td_malloc(3 * qw * sizeof(float));
            lb[t] = td_malloc(3 * H * sizeof(float));
        }
        attention_forward(ob[0], lb[0], qb, L.kv, sb, 3, &L.sh);
        portable_attention_forward(ob[1], lb[1], qb, L.kv, sb, 3, &L.sh);
        snprintf(what, sizeof what, "portable vs library decode, H=%zu Hkv=%zu hd=%zu", H, Hkv, hd);
        EXPECT_BITWISE(ob[1], ob[0], 3 * qw, what);
        EXPECT_BITWISE(lb[1], lb[0], 3 * H, what);
        for (int t = 0; t < 2; t++) {
            td_free(out[t]);
            td_free(lse[t]);
            td_free(dq[t]);
            td_free(dk[t]);
            td_free(dv[t]);
            td_free(ob[t]);
            td_free(lb[t]);
        }
        td_free(qb);
        td_free(dout);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

Test(attention, backward_schedules_give_the_same_bits)
{
    /* One sequence and one kv head is a single (sequence, kv head) item: on
     * 2 threads the backward switches to its two-pass schedule (dk, dv per
     * key tile, dq per query tile), which must give the bits of the one-pass
     * schedule used on 1 thread.  A second case, two sequences of very
     * different lengths, balances badly too.  The third has 38, 3 and 19
     * tiles: the one-pass schedule serves key tiles in spans of 16, the
     * two-pass one in spans of 3, each with partial spans at the ends. */
    static const struct { size_t H, Hkv, hd, n_seq, lens[3]; } cases[] = {
        { 4, 1, 32, 1, { 150 } },
        { 2, 1, 80, 2, { 100, 7 } },
        { 4, 1, 24, 3, { 600, 37, 290 } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t H = cases[c].H, Hkv = cases[c].Hkv, hd = cases[c].hd, n_seq = cases[c].n_seq;
        Layout L;
        layout_init(&L, H, Hkv, hd, 16, cases[c].lens, n_seq, 260 + c);
        Qkv x = qkv_rand(&L, 270 + c);
        const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd;
        float *dout = fixture_rand(qn, 280 + c, -1, 1);
        float *out, *lse;
        full_forward(&out, &lse, &L, &x);
        float *dq[2], *dk[2], *dv[2];
        for (int t = 0; t < 2; t++) {
            pool_init(t + 1);
            dq[t] = fixture_rand(qn, 281, -1, 1);
            dk[t] = fixture_rand(kn, 282, -1, 1);
            dv[t] = fixture_rand(kn, 283, -1, 1);
            attention_backward(dq[t], dk[t], dv[t], dout, x.q, out, lse, L.kv, L.seq, n_seq, &L.sh);
        }
        pool_init(1);
        char what[80];
        snprintf(what, sizeof what, "two-pass vs one-pass, case %zu: dq", c);
        EXPECT_BITWISE(dq[1], dq[0], qn, what);
        snprintf(what, sizeof what, "two-pass vs one-pass, case %zu: dk", c);
        EXPECT_BITWISE(dk[1], dk[0], kn, what);
        snprintf(what, sizeof what, "two-pass vs one-pass, case %zu: dv", c);
        EXPECT_BITWISE(dv[1], dv[0], kn, what);
        for (int t = 0; t < 2; t++) {
            td_free(dq[t]);
            td_free(dk[t]);
            td_free(dv[t]);
        }
        td_free(dout);
        td_free(out);
        td_free(lse);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ bf16 and int8 KV caches */

/* The values a bf16 / int8 cache stands for, from the definitions (SPEC
 * section 11, core/dtype.h), written here: bf16 rounds to nearest even;
 * int8 takes one scale per (row, kv head) over its hd values, s = amax /
 * 127, q = rne(x / s), value (float)q * s. */
static float *rounded(const float *x, size_t rows, size_t Hkv, size_t hd, Dtype kv)
{
    float *y = td_malloc(rows * Hkv * hd * sizeof(float));
    for (size_t r = 0; r < rows * Hkv; r++) {
        const float *a = x + r * hd;
        float *b = y + r * hd, amax = 0;
        for (size_t d = 0; d < hd; d++) amax = fmaxf(amax, fabsf(a[d]));
        const float s = amax / 127.0f;
        for (size_t d = 0; d < hd; d++) {
            if (kv == DTYPE_BF16) {
                b[d] = fixture_bf16(a[d]);
            } else {
                const int q = s > 0 ? (int)fmaxf(-127, fminf(127, rintf(a[d] / s))) : 0;
                b[d] = (float)q * s;
            }
        }
    }
    return y;
}

Test(attention, narrow_kv_cache_is_f32_attention_on_the_rounded_keys_and_values)
{
    /* Keys and values stored as bf16 / int8 give, bit for bit, the f32
     * attention over the rounded values (a pool poisoned with NaN bytes
     * where nothing is stored); and decode steps and a chunked prefill
     * over the narrow cache give the bits of its full forward. */
    const size_t lens[] = { 37, 20, 5 };
    for (int t = 1; t < 3; t++)
        for (size_t c = 0; c < N_LONG; c++)
            for (size_t bs = 16; bs <= 32; bs += 16) {
                const Dtype kv = (Dtype)t;
                const size_t H = LONG_CONFIGS[c][0], Hkv = LONG_CONFIGS[c][1], hd = LONG_CONFIGS[c][2], qw = H * hd;
                Layout Ln, Lf;
                layout_init_kv(&Ln, H, Hkv, hd, bs, lens, 3, 300 + c + bs, kv);
                layout_init(&Lf, H, Hkv, hd, bs, lens, 3, 300 + c + bs);
                Qkv x = qkv_rand(&Ln, 310 + c);
                Qkv xr = { x.q, rounded(x.k, Ln.rows, Hkv, hd, kv), rounded(x.v, Ln.rows, Hkv, hd, kv) };
                float *on, *ln_, *of, *lf;
                full_forward(&on, &ln_, &Ln, &x);
                full_forward(&of, &lf, &Lf, &xr);
                char what[96];
                snprintf(what, sizeof what, "%s cache vs f32 on rounded K/V, H=%zu Hkv=%zu hd=%zu bs=%zu", dtype_name(kv),
                         H, Hkv, hd, bs);
                EXPECT_BITWISE(on, of, Ln.rows * qw, what);
                EXPECT_BITWISE(ln_, lf, Ln.rows * H, what);
                /* decode: every position of sequence 0 alone */
                float *o1 = td_malloc(qw * sizeof(float)), *l1 = td_malloc(H * sizeof(float));
                size_t bad = 0;
                for (size_t p = 0; p < lens[0]; p++) {
                    AttnSeq sq = { 0, 1, p, Ln.table[0] };
                    attention_forward(o1, l1, x.q + p * qw, Ln.kv, &sq, 1, &Ln.sh);
                    bad += fixture_first_diff(o1, on + p * qw, qw) != qw || fixture_first_diff(l1, ln_ + p * H, H) != H;
                }
                cr_expect_eq(bad, 0, "%s: %zu decode positions differ from the full forward", what, bad);
                /* chunked prefill into a fresh pool */
                layout_clear(&Ln);
                float *oc = td_malloc(lens[0] * qw * sizeof(float)), *lc = td_malloc(lens[0] * H * sizeof(float));
                const size_t cuts[3] = { 13, 16, 37 };
                for (size_t j = 0, p0 = 0; j < 3; p0 = cuts[j++]) {
                    AttnSeq sq = { 0, cuts[j] - p0, p0, Ln.table[0] };
                    attention_kv_store(Ln.kv, &sq, 1, x.k + p0 * Hkv * hd, x.v + p0 * Hkv * hd, &Ln.sh);
                    attention_forward(oc + p0 * qw, lc + p0 * H, x.q + p0 * qw, Ln.kv, &sq, 1, &Ln.sh);
                }
                EXPECT_BITWISE(oc, on, lens[0] * qw, "chunked prefill over the narrow cache");
                /* the portable kernels over the same narrow cache */
                portable_attention_forward(oc, lc, x.q, Ln.kv, Ln.seq, 1, &Ln.sh);
                EXPECT_BITWISE(oc, on, lens[0] * qw, "portable kernels over the narrow cache");
                td_free(on);
                td_free(ln_);
                td_free(of);
                td_free(lf);
                td_free(o1);
                td_free(l1);
                td_free(oc);
                td_free(lc);
                td_free(xr.k);
                td_free(xr.v);
                qkv_free(&x);
                layout_free(&Ln);
                layout_free(&Lf);
            }
    EXPECT_NO_LEAKS();
}

Test(attention, narrow_kv_blocks_hold_the_documented_bytes)
{
    /* int8 blocks: K^T int8 [Hkv][hd][bs], V int8 [Hkv][bs][hd], then sK and
     * sV float [Hkv][bs]; bf16: K^T and V as uint16.  Sizes per block and
     * the bytes of one stored position. */
    const size_t lens[] = { 20 }, H = 4, Hkv = 2, hd = 8, bs = 16;
    for (int t = 1; t < 3; t++) {
        const Dtype kv = (Dtype)t;
        Layout L;
        layout_init_kv(&L, H, Hkv, hd, bs, lens, 1, 400, kv);
        const size_t n = 2 * Hkv * hd * bs;
        cr_expect_eq(attn_block_bytes(&L.sh), kv == DTYPE_BF16 ? 2 * n : n + 2 * Hkv * bs * 4, "%s block bytes",
                     dtype_name(kv));
        Qkv x = qkv_rand(&L, 401);
        attention_kv_store(L.kv, L.seq, 1, x.k, x.v, &L.sh);
        const size_t p = 17, g = 1, d = 5;   /* position 17: block 1, offset 1 */
        const unsigned char *blk = (const unsigned char *)L.kv + (size_t)L.table[0][p / bs] * attn_block_bytes(&L.sh);
        float *kr = rounded(x.k, L.rows, Hkv, hd, kv), *vr = rounded(x.v, L.rows, Hkv, hd, kv);
        const float kw = kr[(p * Hkv + g) * hd + d], vw = vr[(p * Hkv + g) * hd + d];
        float kg, vg;
        if (kv == DTYPE_BF16) {
            kg = dtype_f32_from_bf16(((const uint16_t *)(const void *)blk)[(g * hd + d) * bs + p % bs]);
            vg = dtype_f32_from_bf16(((const uint16_t *)(const void *)blk)[Hkv * hd * bs + (g * bs + p % bs) * hd + d]);
        } else {
            const float *sc = (const float *)(const void *)(blk + n);
            kg = (float)((const int8_t *)blk)[(g * hd + d) * bs + p % bs] * sc[g * bs + p % bs];
            vg = (float)((const int8_t *)blk)[Hkv * hd * bs + (g * bs + p % bs) * hd + d] * sc[Hkv * bs + g * bs + p % bs];
        }
        cr_expect(!memcmp(&kg, &kw, 4) && !memcmp(&vg, &vw, 4), "%s: key %a value %a stored, want %a %a",
                  dtype_name(kv), (double)kg, (double)vg, (double)kw, (double)vw);
        td_free(kr);
        td_free(vr);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ dk != dv, explicit scale, values in keys (MLA) */

/* A layout with key dims dk, value dims dv, a scale, and optionally the
 * values read from the keys (v_in_k: MLA's latent cache). */
static void layout_init_g(Layout *L, size_t H, size_t Hkv, size_t dk, size_t dv, bool vk, float scale, size_t bs,
                          const size_t *lens, size_t n_seq, uint64_t seed, Dtype kv)
{
    layout_init_kv(L, H, Hkv, dk, bs, lens, n_seq, seed, kv);
    td_free(L->kv);
    L->sh = (AttnShape){ .H = H, .Hkv = Hkv, .dk = dk, .bs = bs, .kv = kv, .dv = dv, .scale = scale, .v_in_k = vk };
    const size_t nbytes = L->n_blocks * attn_block_bytes(&L->sh);
    L->kv = td_malloc(nbytes + sizeof(float));
    memset(L->kv, 0xFF, nbytes);
}

/* Causal softmax attention in double, keys (rows, Hkv dk), values (rows,
 * Hkv dv), out (rows, H dv), lse (rows, H); with dout, the gradients of
 * sum(dout * out) added into dq, dk, dv instead (out, lse unused). */
static void naive_g(double *out, double *lse, double *gq, double *gk, double *gv, const double *dout,
                    const double *q, const double *k, const double *v, const size_t *lens, size_t n_seq,
                    const AttnShape *sh)
{
    const size_t H = sh->H, Hkv = sh->Hkv, dk = sh->dk, dv = sh->dv, R = H / Hkv;
    size_t T_max = 1, row = 0;
    for (size_t i = 0; i < n_seq; i++) T_max = lens[i] > T_max ? lens[i] : T_max;
    double *p = td_malloc(T_max * sizeof(double)), *dp = td_malloc(T_max * sizeof(double));
    for (size_t i = 0; i < n_seq; row += lens[i++])
        for (size_t t = 0; t < lens[i]; t++)
            for (size_t h = 0; h < H; h++) {
                const size_t g = h / R, qo = ((row + t) * H + h) * dk, oo = ((row + t) * H + h) * dv;
                const double l = naive_probs(p, q + qo, k, row, t, Hkv * dk, g * dk, dk, (double)sh->scale);
                if (!dout) {
                    lse[(row + t) * H + h] = l;
                    for (size_t d = 0; d < dv; d++) {
                        double a = 0;
                        for (size_t j = 0; j <= t; j++) a += p[j] * v[((row + j) * Hkv + g) * dv + d];
                        out[oo + d] = a;
                    }
                    continue;
                }
                double D = 0;
                for (size_t j = 0; j <= t; j++) {
                    dp[j] = 0;
                    for (size_t d = 0; d < dv; d++) dp[j] += dout[oo + d] * v[((row + j) * Hkv + g) * dv + d];
                    D += p[j] * dp[j];
                }
                for (size_t j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - D) * sh->scale;
                    const size_t ko = ((row + j) * Hkv + g) * dk, vo = ((row + j) * Hkv + g) * dv;
                    for (size_t d = 0; d < dk; d++) {
                        gq[qo + d] += ds * k[ko + d];
                        gk[ko + d] += ds * q[qo + d];
                    }
                    for (size_t d = 0; d < dv; d++) gv[vo + d] += p[j] * dout[oo + d];
                }
            }
    td_free(p);
    td_free(dp);
}

/* v (rows, Hkv dv): the first dv dims of each key (values in keys), or random. */
static float *values_g(const float *k, const Layout *L, uint64_t seed)
{
    const size_t n = L->rows * L->sh.Hkv, dk = L->sh.dk, dv = L->sh.dv;
    if (!L->sh.v_in_k) return fixture_rand(n * dv, seed, -1, 1);
    float *v = td_malloc(n * dv * sizeof(float));
    for (size_t i = 0; i < n; i++) memcpy(v + i * dv, k + i * dk, dv * sizeof(float));
    return v;
}

/* H, Hkv, dk, dv, values in keys: ordinary dk != dv; MLA-shaped (one kv
 * head, r + rope keys, r values), as DeepSeek-V3 scaled down and at its
 * real width 576 / 512 (one sequence). */
static const struct { size_t H, Hkv, dk, dv; bool vk; float scale; } G_CASES[] = {
    { 4, 2, 24, 16, false, 0.3f }, { 4, 1, 40, 32, true, 0.3f }, { 3, 1, 72, 64, true, 0.3f },
    { 2, 1, 20, 12, true, 0.3f }, { 2, 1, 576, 512, true, 0.04f },
};
#define N_G (sizeof G_CASES / sizeof *G_CASES)

Test(attention, key_and_value_dims_differ_and_values_in_keys_match_naive_double)
{
    /* forward and backward against naive_g (double): the kernels with dk
     * != dv, an explicit scale (0.3, not 1/sqrt(dk)) and values read from
     * the keys (their gradients returned apart: dk and dv); scales 0.3,
     * and 0.04 at dk = 576 (~1/sqrt(dk): scores of size ~1 as in a model) */
    const size_t lens[] = { 1, 37, 18 };
    for (size_t c = 0; c < N_G; c++)
        for (size_t bs = 16; bs <= 32; bs += 16) {
            Layout L;
            const size_t H = G_CASES[c].H, Hkv = G_CASES[c].Hkv, dk = G_CASES[c].dk, dv = G_CASES[c].dv;
            layout_init_g(&L, H, Hkv, dk, dv, G_CASES[c].vk, G_CASES[c].scale, bs, lens, 3, 500 + c, DTYPE_F32);
            const size_t rows = L.rows, nq = rows * H * dk, nk = rows * Hkv * dk, nv = rows * Hkv * dv;
            const size_t no = rows * H * dv;
            float *q = fixture_rand(nq, 510 + c, -2, 2), *k = fixture_rand(nk, 511 + c, -2, 2);
            float *v = values_g(k, &L, 512 + c), *dout = fixture_rand(no, 513 + c, -1, 1);
            float *out = td_malloc(no * sizeof(float)), *lse = td_malloc(rows * H * sizeof(float));
            attention_kv_store(L.kv, L.seq, L.n_seq, k, L.sh.v_in_k ? NULL : v, &L.sh);
            attention_forward(out, lse, q, L.kv, L.seq, L.n_seq, &L.sh);
            double *qd = to_f64(q, nq), *kd = to_f64(k, nk), *vd = to_f64(v, nv), *dod = to_f64(dout, no);
            double *od = td_malloc(no * sizeof(double)), *ld = td_malloc(rows * H * sizeof(double));
            double *gq = td_calloc(nq * sizeof(double)), *gk = td_calloc(nk * sizeof(double));
            double *gv = td_calloc(nv * sizeof(double));
            naive_g(od, ld, NULL, NULL, NULL, NULL, qd, kd, vd, lens, 3, &L.sh);
            naive_g(NULL, NULL, gq, gk, gv, dod, qd, kd, vd, lens, 3, &L.sh);
            float *ow = to_f32(od, no), *lw = to_f32(ld, rows * H);
            float *gqw = to_f32(gq, nq), *gkw = to_f32(gk, nk), *gvw = to_f32(gv, nv);
            float *dq = td_calloc(nq * sizeof(float)), *dkk = td_calloc(nk * sizeof(float));
            float *dvv = td_calloc(nv * sizeof(float));
            attention_backward(dq, dkk, dvv, dout, q, out, lse, L.kv, L.seq, L.n_seq, &L.sh);
            /* tolerances of forward_matches_naive_double_softmax_attention
             * and backward_accumulates_torch_gradients; dk up to 72 */
            char what[96];
            snprintf(what, sizeof what, "H=%zu Hkv=%zu dk=%zu dv=%zu vk=%d bs=%zu", H, Hkv, dk, dv,
                     (int)G_CASES[c].vk, bs);
            EXPECT_CLOSE(out, ow, no, 4e-6, 0, what);
            EXPECT_CLOSE(lse, lw, rows * H, 4e-6, 1e-6, what);
            EXPECT_CLOSE(dq, gqw, nq, 1e-5, 1e-6, what);
            EXPECT_CLOSE(dkk, gkw, nk, 1e-5, 1e-6, what);
            EXPECT_CLOSE(dvv, gvw, nv, 1e-5, 1e-6, what);
            /* the portable kernels: the same bits */
            float *po = td_malloc(no * sizeof(float)), *pl = td_malloc(rows * H * sizeof(float));
            portable_attention_forward(po, pl, q, L.kv, L.seq, L.n_seq, &L.sh);
            EXPECT_BITWISE(po, out, no, what);
            EXPECT_BITWISE(pl, lse, rows * H, what);
            float *pq = td_calloc(nq * sizeof(float)), *pk = td_calloc(nk * sizeof(float));
            float *pvv = td_calloc(nv * sizeof(float));
            portable_attention_backward(pq, pk, pvv, dout, q, out, lse, L.kv, L.seq, L.n_seq, &L.sh);
            EXPECT_BITWISE(pq, dq, nq, what);
            EXPECT_BITWISE(pk, dkk, nk, what);
            EXPECT_BITWISE(pvv, dvv, nv, what);
            float *bufs[] = { q, k, v, dout, out, lse, ow, lw, gqw, gkw, gvw, dq, dkk, dvv, po, pl, pq, pk, pvv };
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) td_free(bufs[i]);
            double *dbufs[] = { qd, kd, vd, dod, od, ld, gq, gk, gv };
            for (size_t i = 0; i < sizeof dbufs / sizeof *dbufs; i++) td_free(dbufs[i]);
            layout_free(&L);
        }
    EXPECT_NO_LEAKS();
}

Test(attention, values_in_keys_decode_and_narrow_caches_give_the_bits_of_the_full_forward)
{
    /* MLA's latent cache: decode steps, a decode batch and a chunked
     * prefill give the bits of the full forward, in f32, bf16 and int8
     * (there: f32 attention over the rounded keys, one int8 scale per key,
     * its values the rounded keys' first dv dims); and the block holds K^T
     * only: dk values per position (plus one int8 scale), nothing else
     * written */
    const size_t lens[] = { 70, 20, 5 }, H = 4, dk = 40, dv = 32, bs = 32;
    for (int t = 0; t < 3; t++) {
        const Dtype kvt = (Dtype)t;
        Layout L, Lf;
        layout_init_g(&L, H, 1, dk, dv, true, 0.125f, bs, lens, 3, 600, kvt);
        layout_init_g(&Lf, H, 1, dk, dv, true, 0.125f, bs, lens, 3, 600, DTYPE_F32);
        const size_t want = kvt == DTYPE_INT8 ? dk * bs + bs * 4 : dk * bs * dtype_size(kvt);
        cr_expect_eq(attn_block_bytes(&L.sh), want, "%s: block bytes %zu, want %zu", dtype_name(kvt),
                     attn_block_bytes(&L.sh), want);
        const size_t rows = L.rows, qw = H * dk, ow = H * dv;
        float *q = fixture_rand(rows * qw, 601, -2, 2), *k = fixture_rand(rows * dk, 602, -2, 2);
        float *kr = kvt == DTYPE_F32 ? NULL : rounded(k, rows, 1, dk, kvt);
        float *out = td_malloc(rows * ow * sizeof(float)), *lse = td_malloc(rows * H * sizeof(float));
        float *of = td_malloc(rows * ow * sizeof(float)), *lf = td_malloc(rows * H * sizeof(float));
        attention_kv_store(L.kv, L.seq, L.n_seq, k, NULL, &L.sh);
        attention_forward(out, lse, q, L.kv, L.seq, L.n_seq, &L.sh);
        if (kr) {
            attention_kv_store(Lf.kv, Lf.seq, Lf.n_seq, kr, NULL, &Lf.sh);
            attention_forward(of, lf, q, Lf.kv, Lf.seq, Lf.n_seq, &Lf.sh);
            EXPECT_BITWISE(out, of, rows * ow, "narrow latent cache vs f32 on the rounded keys");
            EXPECT_BITWISE(lse, lf, rows * H, "narrow latent cache vs f32 on the rounded keys: lse");
        } else {   /* f32: only K^T written (Hkv dk floats per position) */
            size_t touched = 0, nf = L.n_blocks * attn_block_bytes(&L.sh) / sizeof(float);
            for (size_t i = 0; i < nf; i++) touched += !isnan(L.kv[i]);
            cr_expect_eq(touched, rows * dk, "%zu floats written, want %zu (keys only)", touched, rows * dk);
        }
        size_t bad = 0;
        for (size_t p = 0; p < lens[0]; p++) {
            AttnSeq s = { 0, 1, p, L.table[0] };
            attention_forward(of, lf, q + p * qw, L.kv, &s, 1, &L.sh);
            bad += fixture_first_diff(of, out + p * ow, ow) != ow || fixture_first_diff(lf, lse + p * H, H) != H;
        }
        cr_expect_eq(bad, 0, "%s: %zu decode positions differ from the full forward", dtype_name(kvt), bad);
        const size_t at[3] = { 66, 16, 4 };
        float *qb = td_malloc(3 * qw * sizeof(float));
        AttnSeq sb[3];
        for (size_t i = 0; i < 3; i++) {
            memcpy(qb + i * qw, q + (L.seq[i].row + at[i]) * qw, qw * sizeof(float));
            sb[i] = (AttnSeq){ i, 1, at[i], L.table[i] };
        }
        attention_forward(of, lf, qb, L.kv, sb, 3, &L.sh);
        for (size_t i = 0; i < 3; i++)
            EXPECT_BITWISE(of + i * ow, out + (L.seq[i].row + at[i]) * ow, ow, "latent decode batch");
        layout_clear(&L);
        const size_t cuts[3] = { 13, 48, 70 };
        for (size_t j = 0, p0 = 0; j < 3; p0 = cuts[j++]) {
            AttnSeq s = { 0, cuts[j] - p0, p0, L.table[0] };
            attention_kv_store(L.kv, &s, 1, k + p0 * dk, NULL, &L.sh);
            attention_forward(of + p0 * ow, lf + p0 * H, q + p0 * qw, L.kv, &s, 1, &L.sh);
        }
        EXPECT_BITWISE(of, out, lens[0] * ow, "latent chunked prefill");
        td_free(q);
        td_free(k);
        td_free(kr);
        td_free(out);
        td_free(lse);
        td_free(of);
        td_free(lf);
        td_free(qb);
        layout_free(&L);
        layout_free(&Lf);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ sliding window */

Test(attention, window_matches_naive_double_and_the_kernels_agree_bit_for_bit)
{
    /* A sliding window W (HF's sliding_window: query t sees keys t - W < s
     * <= t): forward and backward against the naive double attention with
     * that mask, windows narrower than a tile, one tile, across tiles and
     * blocks, and wider than every sequence (then the bits of no window);
     * the portable kernels give the same bits, and so do 2 threads (the
     * backward's two-pass schedule skips tiles the same way). */
    static const size_t windows[] = { 1, 5, 16, 17, 40, 200 };
    const size_t lens[] = { 1, 37, 70, 150 };
    for (size_t c = 0; c < N_CONFIGS; c++)
        for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
            const size_t H = CONFIGS[c][0], Hkv = CONFIGS[c][1], hd = CONFIGS[c][2], bs = wi % 2 ? 32 : 16;
            Layout L;
            layout_init(&L, H, Hkv, hd, bs, lens, 4, 600 + c + wi);
            L.sh.window = windows[wi];
            Qkv x = qkv_rand(&L, 610 + c + wi);
            const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd;
            float *dout = fixture_rand(qn, 620 + c, -1, 1);
            float *out, *lse;
            full_forward(&out, &lse, &L, &x);
            double *qd = to_f64(x.q, qn), *kd = to_f64(x.k, kn), *vd = to_f64(x.v, kn), *dod = to_f64(dout, qn);
            double *od = td_malloc(qn * sizeof(double)), *ld = td_malloc(rows * H * sizeof(double));
            double *gq = td_calloc(qn * sizeof(double)), *gk = td_calloc(kn * sizeof(double));
            double *gv = td_calloc(kn * sizeof(double));
            g_naive_window = windows[wi];
            naive_g(od, ld, NULL, NULL, NULL, NULL, qd, kd, vd, lens, 4, &L.sh);
            naive_g(NULL, NULL, gq, gk, gv, dod, qd, kd, vd, lens, 4, &L.sh);
            g_naive_window = 0;
            float *ow = to_f32(od, qn), *lw = to_f32(ld, rows * H);
            float *gqw = to_f32(gq, qn), *gkw = to_f32(gk, kn), *gvw = to_f32(gv, kn);
            float *dq[3], *dk[3], *dv[3];
            for (int t = 0; t < 3; t++) {
                dq[t] = td_calloc(qn * sizeof(float));
                dk[t] = td_calloc(kn * sizeof(float));
                dv[t] = td_calloc(kn * sizeof(float));
            }
            attention_backward(dq[0], dk[0], dv[0], dout, x.q, out, lse, L.kv, L.seq, 4, &L.sh);
            char what[96];
            snprintf(what, sizeof what, "window %zu, H=%zu Hkv=%zu hd=%zu bs=%zu", windows[wi], H, Hkv, hd, bs);
            /* tolerances of forward_matches_naive_double_softmax_attention
             * and backward_accumulates_torch_gradients */
            EXPECT_CLOSE(out, ow, qn, 4e-6, 0, what);
            EXPECT_CLOSE(lse, lw, rows * H, 4e-6, 1e-6, what);
            EXPECT_CLOSE(dq[0], gqw, qn, 1e-5, 1e-6, what);
            EXPECT_CLOSE(dk[0], gkw, kn, 1e-5, 1e-6, what);
            EXPECT_CLOSE(dv[0], gvw, kn, 1e-5, 1e-6, what);
            float *po = td_malloc(qn * sizeof(float)), *pl = td_malloc(rows * H * sizeof(float));
            portable_attention_forward(po, pl, x.q, L.kv, L.seq, 4, &L.sh);
            EXPECT_BITWISE(po, out, qn, what);
            EXPECT_BITWISE(pl, lse, rows * H, what);
            portable_attention_backward(dq[1], dk[1], dv[1], dout, x.q, out, lse, L.kv, L.seq, 4, &L.sh);
            pool_init(2);
            attention_forward(po, pl, x.q, L.kv, L.seq, 4, &L.sh);
            attention_backward(dq[2], dk[2], dv[2], dout, x.q, out, lse, L.kv, L.seq, 4, &L.sh);
            pool_init(1);
            EXPECT_BITWISE(po, out, qn, what);
            for (int t = 1; t < 3; t++) {
                EXPECT_BITWISE(dq[t], dq[0], qn, what);
                EXPECT_BITWISE(dk[t], dk[0], kn, what);
                EXPECT_BITWISE(dv[t], dv[0], kn, what);
            }
            if (windows[wi] >= 150) {   /* wider than every sequence: no window, the same bits */
                L.sh.window = 0;
                attention_forward(po, pl, x.q, L.kv, L.seq, 4, &L.sh);
                EXPECT_BITWISE(po, out, qn, what);
                EXPECT_BITWISE(pl, lse, rows * H, what);
                memset(dq[1], 0, qn * sizeof(float));
                memset(dk[1], 0, kn * sizeof(float));
                memset(dv[1], 0, kn * sizeof(float));
                attention_backward(dq[1], dk[1], dv[1], dout, x.q, out, lse, L.kv, L.seq, 4, &L.sh);
                EXPECT_BITWISE(dq[1], dq[0], qn, what);
                EXPECT_BITWISE(dk[1], dk[0], kn, what);
                EXPECT_BITWISE(dv[1], dv[0], kn, what);
            }
            float *bufs[] = { dout, out, lse, ow, lw, gqw, gkw, gvw, po, pl };
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) td_free(bufs[i]);
            for (int t = 0; t < 3; t++) {
                td_free(dq[t]);
                td_free(dk[t]);
                td_free(dv[t]);
            }
            double *dbufs[] = { qd, kd, vd, dod, od, ld, gq, gk, gv };
            for (size_t i = 0; i < sizeof dbufs / sizeof *dbufs; i++) td_free(dbufs[i]);
            qkv_free(&x);
            layout_free(&L);
        }
    EXPECT_NO_LEAKS();
}

Test(attention, window_backward_matches_finite_differences)
{
    static const struct { size_t H, Hkv, hd, bs, window, n_seq, lens[2]; } cases[] = {
        { 4, 2, 8, 16, 5, 2, { 3, 24 } },
        { 2, 1, 8, 32, 17, 1, { 40 } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t H = cases[c].H, Hkv = cases[c].Hkv, hd = cases[c].hd, n_seq = cases[c].n_seq;
        Layout L;
        layout_init(&L, H, Hkv, hd, cases[c].bs, cases[c].lens, n_seq, 630 + c);
        L.sh.window = cases[c].window;
        Qkv x = qkv_rand(&L, 640 + c);
        const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd, np = qn + 2 * kn;
        float *dout = fixture_rand(qn, 650 + c, -1, 1);
        float *out, *lse;
        full_forward(&out, &lse, &L, &x);
        float *dq = fixture_rand(qn, 660 + c, -1, 1), *dk = fixture_rand(kn, 661 + c, -1, 1);
        float *dv = fixture_rand(kn, 662 + c, -1, 1);
        double *p = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        for (size_t i = 0; i < qn; i++) p[i] = x.q[i];
        for (size_t i = 0; i < kn; i++) {
            p[qn + i] = x.k[i];
            p[qn + kn + i] = x.v[i];
        }
        double *doutd = to_f64(dout, qn);
        AttnFd ctx = { doutd, cases[c].lens, n_seq, rows, H, Hkv, hd, td_malloc(qn * sizeof(double)) };
        g_naive_window = cases[c].window;
        fixture_fd(g, attn_loss, &ctx, p, np, 1e-5);
        g_naive_window = 0;
        float *want = td_malloc(np * sizeof(float));
        for (size_t i = 0; i < qn; i++) want[i] = (float)(dq[i] + g[i]);
        for (size_t i = 0; i < kn; i++) {
            want[qn + i] = (float)(dk[i] + g[qn + i]);
            want[qn + kn + i] = (float)(dv[i] + g[qn + kn + i]);
        }
        attention_backward(dq, dk, dv, dout, x.q, out, lse, L.kv, L.seq, n_seq, &L.sh);
        /* see backward_matches_finite_differences */
        char what[80];
        snprintf(what, sizeof what, "window %zu vs FD, H=%zu Hkv=%zu hd=%zu", cases[c].window, H, Hkv, hd);
        EXPECT_CLOSE(dq, want, qn, 1e-5, 1e-6, what);
        EXPECT_CLOSE(dk, want + qn, kn, 1e-5, 1e-6, what);
        EXPECT_CLOSE(dv, want + qn + kn, kn, 1e-5, 1e-6, what);
        td_free(ctx.out);
        td_free(doutd);
        td_free(p);
        td_free(g);
        td_free(want);
        td_free(dout);
        td_free(out);
        td_free(lse);
        td_free(dq);
        td_free(dk);
        td_free(dv);
        qkv_free(&x);
        layout_free(&L);
    }
    EXPECT_NO_LEAKS();
}

Test(attention, window_decode_and_chunks_never_read_blocks_below_the_window)
{
    /* Decode steps and chunked prefill of a windowed sequence give the bits
     * of its full forward, with every block wholly below the first key of
     * the call's first query pointed at a block of NaN (a ring cache frees
     * them): a read of one would put NaN in the output. */
    static const size_t windows[] = { 3, 16, 21, 40 };
    const size_t lens[] = { 150 };
    for (size_t c = 0; c < N_CONFIGS; c++)
        for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
            const size_t H = CONFIGS[c][0], Hkv = CONFIGS[c][1], hd = CONFIGS[c][2], qw = H * hd;
            const size_t bs = wi % 2 ? 32 : 16;
            Layout L;
            layout_init(&L, H, Hkv, hd, bs, lens, 1, 670 + c + wi);   /* 3 spare blocks: never written, NaN */
            L.sh.window = windows[wi];
            Qkv x = qkv_rand(&L, 680 + c + wi);
            float *out, *lse;
            full_forward(&out, &lse, &L, &x);
            const size_t nb = (lens[0] + bs - 1) / bs;
            int32_t *ring = td_malloc(nb * sizeof(int32_t));
            int32_t spare = -1;   /* a block no sequence uses */
            for (int32_t b = 0; b < (int32_t)L.n_blocks && spare < 0; b++) {
                bool used = false;
                for (size_t j = 0; j < nb; j++) used |= L.table[0][j] == b;
                if (!used) spare = b;
            }
            float *o = td_malloc(16 * qw * sizeof(float)), *l = td_malloc(16 * H * sizeof(float));
            size_t bad = 0, first = SIZE_MAX;
            static const size_t chunks[] = { 1, 7, 16 };
            for (size_t ci = 0; ci < 3; ci++)
                for (size_t p = 0; p < lens[0]; p += chunks[ci]) {
                    const size_t n = td_min(chunks[ci], lens[0] - p), gone = attn_first_key(&L.sh, p) / bs;
                    for (size_t j = 0; j < nb; j++) ring[j] = j < gone ? spare : L.table[0][j];
                    AttnSeq s = { 0, n, p, ring };
                    attention_forward(o, l, x.q + p * qw, L.kv, &s, 1, &L.sh);
                    if (fixture_first_diff(o, out + p * qw, n * qw) != n * qw ||
                        fixture_first_diff(l, lse + p * H, n * H) != n * H) {
                        bad++;
                        first = td_min(first, p);
                    }
                }
            cr_expect_eq(bad, 0, "window %zu, H=%zu Hkv=%zu hd=%zu bs=%zu: %zu calls differ from the full "
                         "forward, first at %zu", windows[wi], H, Hkv, hd, bs, bad, first);
            td_free(ring);
            td_free(o);
            td_free(l);
            td_free(out);
            td_free(lse);
            qkv_free(&x);
            layout_free(&L);
        }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ bidirectional (encoder) */

/* Bidirectional forward and backward of one layout against the naive double
 * reference; returns the float results for the path comparisons. */
typedef struct { float *out, *lse, *dq, *dk, *dv; } BidirRun;

static BidirRun bidir_run(const Layout *L, const Qkv *x, const float *dout, int portable)
{
    const size_t rows = L->rows, qn = rows * L->sh.H * L->sh.dk, kn = rows * L->sh.Hkv * L->sh.dk;
    BidirRun r = { td_malloc(qn * sizeof(float)), td_malloc(rows * L->sh.H * sizeof(float)),
                   fixture_rand(qn, 401, -1, 1), fixture_rand(kn, 402, -1, 1), fixture_rand(kn, 403, -1, 1) };
    if (portable) {
        portable_attention_kv_store(L->kv, L->seq, L->n_seq, x->k, x->v, &L->sh);
        portable_attention_forward(r.out, r.lse, x->q, L->kv, L->seq, L->n_seq, &L->sh);
        portable_attention_backward(r.dq, r.dk, r.dv, dout, x->q, r.out, r.lse, L->kv, L->seq, L->n_seq, &L->sh);
    } else {
        attention_kv_store(L->kv, L->seq, L->n_seq, x->k, x->v, &L->sh);
        attention_forward(r.out, r.lse, x->q, L->kv, L->seq, L->n_seq, &L->sh);
        attention_backward(r.dq, r.dk, r.dv, dout, x->q, r.out, r.lse, L->kv, L->seq, L->n_seq, &L->sh);
    }
    return r;
}

static void bidir_free(BidirRun *r)
{
    td_free(r->out);
    td_free(r->lse);
    td_free(r->dq);
    td_free(r->dk);
    td_free(r->dv);
}

Test(attention, bidirectional_matches_naive_double_on_every_path_and_thread_count)
{
    /* Every query sees all keys of its sequence: a partial last tile (37, 5),
     * an exact tile (16), many tiles (150: spans of key tiles, and one
     * sequence, one kv head, so 2 threads take the two-pass backward).
     * Against the naive double reference (whose formulas the FD test below
     * checks): the forward and backward, then the portable kernels and 2
     * threads give the same bits. */
    static const struct { size_t H, Hkv, hd, n_seq, lens[3]; } cases[] = {
        { 4, 2, 16, 3, { 37, 5, 16 } },
        { 4, 1, 32, 1, { 150 } },
        { 6, 1, 64, 2, { 64, 20 } },
    };
    naive_bidir = true;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t H = cases[c].H, Hkv = cases[c].Hkv, hd = cases[c].hd, n_seq = cases[c].n_seq;
        Layout L;
        layout_init(&L, H, Hkv, hd, 16 + 16 * (c % 2), cases[c].lens, n_seq, 410 + c);
        L.sh.bidir = true;
        Qkv x = qkv_rand(&L, 420 + c);
        const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd;
        float *dout = fixture_rand(qn, 430 + c, -1, 1);
        BidirRun r[3];
        r[0] = bidir_run(&L, &x, dout, 0);
        layout_clear(&L);
        r[1] = bidir_run(&L, &x, dout, 1);
        pool_init(2);
        r[2] = bidir_run(&L, &x, dout, 0);
        pool_init(1);
        double *qd = to_f64(x.q, qn), *kd = to_f64(x.k, kn), *vd = to_f64(x.v, kn), *dd = to_f64(dout, qn);
        double *od = td_malloc(qn * sizeof(double)), *ld = td_malloc(rows * H * sizeof(double));
        double *g = td_malloc((qn + 2 * kn) * sizeof(double));
        naive_attention(od, ld, qd, kd, vd, cases[c].lens, n_seq, H, Hkv, hd);
        float *dq0 = fixture_rand(qn, 401, -1, 1), *dk0 = fixture_rand(kn, 402, -1, 1), *dv0 = fixture_rand(kn, 403, -1, 1);
        for (size_t i = 0; i < qn; i++) g[i] = dq0[i];
        for (size_t i = 0; i < kn; i++) {
            g[qn + i] = dk0[i];
            g[qn + kn + i] = dv0[i];
        }
        naive_attention_backward(g, g + qn, g + qn + kn, dd, qd, kd, vd, cases[c].lens, n_seq, H, Hkv, hd);
        float *wo = to_f32(od, qn), *wl = to_f32(ld, rows * H), *wg = to_f32(g, qn + 2 * kn);
        char what[96];
        /* tolerances as the causal tests (forward 1e-5, backward 1e-5 absolute) */
        snprintf(what, sizeof what, "bidir case %zu: out vs naive", c);
        EXPECT_CLOSE(r[0].out, wo, qn, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "bidir case %zu: lse vs naive", c);
        EXPECT_CLOSE(r[0].lse, wl, rows * H, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "bidir case %zu: dq vs naive", c);
        EXPECT_CLOSE(r[0].dq, wg, qn, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "bidir case %zu: dk vs naive", c);
        EXPECT_CLOSE(r[0].dk, wg + qn, kn, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "bidir case %zu: dv vs naive", c);
        EXPECT_CLOSE(r[0].dv, wg + qn + kn, kn, 1e-5, 1e-6, what);
        for (int t = 1; t < 3; t++) {
            const char *who = t == 1 ? "portable" : "2 threads";
            snprintf(what, sizeof what, "bidir case %zu: %s out", c, who);
            EXPECT_BITWISE(r[t].out, r[0].out, qn, what);
            snprintf(what, sizeof what, "bidir case %zu: %s lse", c, who);
            EXPECT_BITWISE(r[t].lse, r[0].lse, rows * H, what);
            snprintf(what, sizeof what, "bidir case %zu: %s dq", c, who);
            EXPECT_BITWISE(r[t].dq, r[0].dq, qn, what);
            snprintf(what, sizeof what, "bidir case %zu: %s dk", c, who);
            EXPECT_BITWISE(r[t].dk, r[0].dk, kn, what);
            snprintf(what, sizeof what, "bidir case %zu: %s dv", c, who);
            EXPECT_BITWISE(r[t].dv, r[0].dv, kn, what);
        }
        /* a sequence's first row sees its last key: not causal */
        snprintf(what, sizeof what, "bidir case %zu: differs from causal", c);
        L.sh.bidir = false;
        float *oc = td_malloc(qn * sizeof(float));
        attention_forward(oc, NULL, x.q, L.kv, L.seq, n_seq, &L.sh);
        cr_expect(memcmp(oc, r[0].out, H * hd * sizeof(float)) != 0, "%s", what);
        td_free(oc);
        for (int t = 0; t < 3; t++) bidir_free(&r[t]);
        td_free(qd);
        td_free(kd);
        td_free(vd);
        td_free(dd);
        td_free(od);
        td_free(ld);
        td_free(g);
        td_free(wo);
        td_free(wl);
        td_free(wg);
        td_free(dq0);
        td_free(dk0);
        td_free(dv0);
        td_free(dout);
        qkv_free(&x);
        layout_free(&L);
    }
    naive_bidir = false;
    EXPECT_NO_LEAKS();
}

Test(attention, bidirectional_naive_reference_matches_finite_differences)
{
    /* The naive bidirectional backward (the reference above) against central
     * differences of the naive bidirectional forward. */
    const size_t lens[] = { 5, 3 }, H = 2, Hkv = 1, hd = 4, n_seq = 2;
    naive_bidir = true;
    Layout L;
    layout_init(&L, H, Hkv, hd, 16, lens, n_seq, 440);
    Qkv x = qkv_rand(&L, 441);
    const size_t rows = L.rows, qn = rows * H * hd, kn = rows * Hkv * hd, np = qn + 2 * kn;
    float *dout = fixture_rand(qn, 442, -1, 1);
    double *p = td_malloc(np * sizeof(double)), *fd = td_malloc(np * sizeof(double));
    double *g = td_calloc(np * sizeof(double));
    for (size_t i = 0; i < qn; i++) p[i] = x.q[i];
    for (size_t i = 0; i < kn; i++) {
        p[qn + i] = x.k[i];
        p[qn + kn + i] = x.v[i];
    }
    double *doutd = to_f64(dout, qn);
    AttnFd ctx = { doutd, lens, n_seq, rows, H, Hkv, hd, td_malloc(qn * sizeof(double)) };
    fixture_fd(fd, attn_loss, &ctx, p, np, 1e-5);
    naive_attention_backward(g, g + qn, g + qn + kn, doutd, p, p + qn, p + qn + kn, lens, n_seq, H, Hkv, hd);
    size_t bad = 0;
    for (size_t i = 0; i < np; i++) bad += fabs(g[i] - fd[i]) > 1e-7;
    cr_expect(bad == 0, "bidir naive backward vs FD: %zu of %zu differ by > 1e-7", bad, np);
    naive_bidir = false;
    td_free(ctx.out);
    td_free(doutd);
    td_free(p);
    td_free(fd);
    td_free(g);
    td_free(dout);
    qkv_free(&x);
    layout_free(&L);
    EXPECT_NO_LEAKS();
}

/* Context parallelism's backward (attention_backward_chunks): the query
 * chunks of two sequences, at tile-aligned positions, each against its
 * keys from 0, called chunk by chunk in position order into the same dK /
 * dV rows, give the bits of the whole sequences' attention_backward: every
 * gradient chain meets the same terms in the same order (dq over keys in
 * order; dk, dv over query tiles in order). */
Test(attention, backward_chunks_equal_whole_sequences)
{
    const size_t H = 4, Hkv = 2, hd = 16, bs = 32, lens[2] = { 64, 96 };
    Layout L;
    layout_init(&L, H, Hkv, hd, bs, lens, 2, 321);
    Qkv x = qkv_rand(&L, 322);
    float *out, *lse;
    full_forward(&out, &lse, &L, &x);
    const size_t rows = L.rows, qw = H * hd, kw = Hkv * hd;
    float *dout = fixture_rand(rows * qw, 323, -1, 1);
    float *dq = td_calloc(rows * qw * sizeof(float)), *dk = td_calloc(rows * kw * sizeof(float));
    float *dv = td_calloc(rows * kw * sizeof(float));
    attention_backward(dq, dk, dv, dout, x.q, out, lse, L.kv, L.seq, 2, &L.sh);
    float *cq = td_calloc(rows * qw * sizeof(float)), *ck = td_calloc(rows * kw * sizeof(float));
    float *cv = td_calloc(rows * kw * sizeof(float));
    /* chunks of 16, 32 and 48 positions; one call per chunk, in order */
    const size_t cuts[2][4] = { { 0, 16, 64, 64 }, { 0, 48, 64, 96 } };
    for (size_t i = 0; i < 2; i++)
        for (size_t j = 0; j + 1 < 4; j++) {
            const size_t p0 = cuts[i][j], p1 = cuts[i][j + 1];
            if (p1 == p0) continue;
            const AttnSeq s = { L.seq[i].row + p0, p1 - p0, p0, L.table[i] };
            const size_t krow = L.seq[i].row;
            attention_backward_chunks(cq, ck, cv, dout, x.q, out, lse, L.kv, &s, 1, &krow, &L.sh);
        }
    cr_expect(memcmp(dq, cq, rows * qw * sizeof(float)) == 0, "dq of the chunks differs from the whole sequences'");
    cr_expect(memcmp(dk, ck, rows * kw * sizeof(float)) == 0, "dk of the chunks differs from the whole sequences'");
    cr_expect(memcmp(dv, cv, rows * kw * sizeof(float)) == 0, "dv of the chunks differs from the whole sequences'");
    qkv_free(&x);
    td_free(out); td_free(lse); td_free(dout);
    td_free(dq); td_free(dk); td_free(dv); td_free(cq); td_free(ck); td_free(cv);
    layout_free(&L);
}

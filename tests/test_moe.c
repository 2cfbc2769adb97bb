/* tests/test_moe.c - MoE routing, dispatch/combine and router losses
 * (core/ops/moe.h).
 *
 * Router: softmax then top-k with exact ties (equal logits) going to the
 * lower index, k = 1, 2, E, norm_topk_prob on and off.  Plan/dispatch/
 * combine: exact grouping (experts with no token), bitwise copies and FMA
 * chains, and a whole layer (dispatch -> per-expert linear -> combine)
 * against PyTorch.  Losses: aux = E/(N k) sum_e count_e P_e (count_e a
 * constant) and z = mean_t lse_t^2, against naive double code, central
 * finite differences, and PyTorch autograd of the SPEC formulas for the
 * router + top-k + aux + z chain (moe_router.h5 and moe_layer.h5 from
 * tests/ref/fixtures_ops.py). */
#include "core/common.h"
#include "core/ops/gemm.h"
#include "core/ops/linear.h"
#include "core/ops/moe.h"
#include "core/pool.h"
#include "core/ops/softmax.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(moe_router, .init = setup, .fini = teardown);
TestSuite(moe_dispatch, .init = setup, .fini = teardown);
TestSuite(moe_aux, .init = setup, .fini = teardown);

static const char *const FX_ROUTER = "moe_router.h5";
static const char *const FX_LAYER = "moe_layer.h5";

/* ------------------------------------------------------------ naive double references */

/* p = softmax(x) over E, lse = logsumexp(x) */
static void naive_softmax(double *p, double *lse, const double *x, size_t N, size_t E)
{
    for (size_t t = 0; t < N; t++) {
        const double *xr = x + t * E;
        double m = xr[0], s = 0;
        for (size_t e = 1; e < E; e++) m = xr[e] > m ? xr[e] : m;
        for (size_t e = 0; e < E; e++) s += exp(xr[e] - m);
        if (lse) lse[t] = m + log(s);
        if (p)
            for (size_t e = 0; e < E; e++) p[t * E + e] = exp(xr[e] - m) / s;
    }
}

/* w[t, j] = p[t, idx[t, j]] (/ sum_j when norm), with the selection fixed */
static void naive_topk_w(double *w, const double *p, const int32_t *idx, size_t N, size_t E,
                         size_t k, bool norm)
{
    for (size_t t = 0; t < N; t++) {
        double s = 0;
        for (size_t j = 0; j < k; j++) s += p[t * E + (size_t)idx[t * k + j]];
        for (size_t j = 0; j < k; j++)
            w[t * k + j] = p[t * E + (size_t)idx[t * k + j]] / (norm ? s : 1.0);
    }
}

/* aux = E/(N k) sum_e count_e P_e,  P_e = mean_t p_te */
static double naive_aux(const double *p, const double *count, size_t N, size_t E, size_t k)
{
    double s = 0;
    for (size_t e = 0; e < E; e++) {
        double P = 0;
        for (size_t t = 0; t < N; t++) P += p[t * E + e];
        s += count[e] * P / (double)N;
    }
    return (double)E / ((double)N * (double)k) * s;
}

static double *to_f64(const float *x, size_t n)
{
    double *y = td_malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* ------------------------------------------------------------ router */

Test(moe_router, probs_and_lse_are_the_row_softmax)
{
    const size_t N = 9, E = 7, k = 2;
    float *logits = fixture_rand(N * E, 1, -4, 4);
    float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float));
    float *w = td_malloc(N * k * sizeof(float));
    int32_t *idx = td_malloc(N * k * sizeof(int32_t));
    moe_router_forward(probs, lse, idx, w, logits, N, E, k, false);
    double *ld = to_f64(logits, N * E), *pd = td_malloc(N * E * sizeof(double)), *sd = td_malloc(N * sizeof(double));
    naive_softmax(pd, sd, ld, N, E);
    float *p_want = td_malloc(N * E * sizeof(float)), *l_want = td_malloc(N * sizeof(float));
    for (size_t i = 0; i < N * E; i++) p_want[i] = (float)pd[i];
    for (size_t i = 0; i < N; i++) l_want[i] = (float)sd[i];
    /* float softmax: a few ulp relative; lse of size ~5: 1e-6 */
    EXPECT_CLOSE(probs, p_want, N * E, 0, 2e-6, "router probs");
    EXPECT_CLOSE(lse, l_want, N, 1e-6, 1e-6, "router lse");
    td_free(logits);
    td_free(probs);
    td_free(lse);
    td_free(w);
    td_free(idx);
    td_free(ld);
    td_free(pd);
    td_free(sd);
    td_free(p_want);
    td_free(l_want);
    EXPECT_NO_LEAKS();
}

Test(moe_router, topk_ties_go_to_lower_index)
{
    /* Equal logits give bit-equal probabilities: exact ties. */
    const size_t E = 5, N = 4;
    const float logits[4 * 5] = {
        1, 3, 3, 0, 3,          /* three-way tie at the top: 1, 2, 4 */
        0.5f, 0.5f, 0.5f, 0.5f, 0.5f,   /* all equal: 0, 1, 2, 3, 4 */
        5, 1, 1, 2, 1,          /* tie below the top: 0, 3, 1, 2, 4 */
        -1, 2, -1, 2, 7,        /* 4, then the tie 1, 3, then 0, 2 */
    };
    const int32_t order[4][5] = { { 1, 2, 4, 0, 3 }, { 0, 1, 2, 3, 4 }, { 0, 3, 1, 2, 4 }, { 4, 1, 3, 0, 2 } };
    float probs[4 * 5], lse[4], w[4 * 5];
    int32_t idx[4 * 5];
    static const size_t ks[] = { 1, 2, 3, 5 };
    for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
        for (int norm = 0; norm <= 1; norm++) {
            const size_t k = ks[a];
            moe_router_forward(probs, lse, idx, w, logits, N, E, k, norm);
            for (size_t t = 0; t < N; t++) {
                double s = 0;
                for (size_t j = 0; j < k; j++) s += probs[t * E + (size_t)order[t][j]];
                for (size_t j = 0; j < k; j++) {
                    cr_expect_eq(idx[t * k + j], order[t][j], "k=%zu norm=%d token %zu slot %zu: expert %d, want %d",
                                 k, norm, t, j, idx[t * k + j], order[t][j]);
                    const float p = probs[t * E + (size_t)order[t][j]];
                    /* the weight is the probability (bit for bit) or its share
                     * of the selected sum (a float sum of <= 5 terms and one
                     * division: 1e-6 relative) */
                    if (!norm)
                        cr_expect(memcmp(&w[t * k + j], &p, sizeof p) == 0, "k=%zu token %zu slot %zu: w %.9g != p %.9g",
                                  k, t, j, (double)w[t * k + j], (double)p);
                    else
                        cr_expect(fabs(w[t * k + j] - p / s) <= 1e-6 * (p / s),
                                  "k=%zu token %zu slot %zu: normalised w %.9g, want %.9g", k, t, j,
                                  (double)w[t * k + j], p / s);
                }
            }
        }
    EXPECT_NO_LEAKS();
}

Test(moe_router, topk_is_descending_on_random_logits)
{
    const size_t N = 30, E = 8;
    float *logits = fixture_rand(N * E, 2, -3, 3);
    float probs[30 * 8], lse[30], w[30 * 8];
    int32_t idx[30 * 8];
    for (size_t k = 1; k <= E; k++) {
        moe_router_forward(probs, lse, idx, w, logits, N, E, k, false);
        size_t bad = 0;
        for (size_t t = 0; t < N; t++) {
            const float *p = probs + t * E;
            /* the k chosen are distinct, in descending order, and no
             * unchosen expert has a larger probability than the last chosen */
            unsigned used = 0;
            for (size_t j = 0; j < k; j++) {
                int32_t e = idx[t * k + j];
                bad += e < 0 || e >= (int32_t)E || (used >> e & 1u);
                if (e >= 0 && e < (int32_t)E) used |= 1u << e;
                if (j > 0) bad += p[idx[t * k + j]] > p[idx[t * k + j - 1]];
            }
            float last = p[idx[t * k + k - 1]];
            for (size_t e = 0; e < E; e++) bad += !(used >> e & 1u) && p[e] > last;
        }
        cr_expect_eq(bad, 0, "k=%zu: %zu violations of the top-k order", k, bad);
    }
    td_free(logits);
    EXPECT_NO_LEAKS();
}

/* Many experts (Qwen3-MoE's 128, top-8; 60 top-4; 512 top-8) with
 * coarsely quantised logits, so that rows hold many exact ties: the
 * one-pass selection equals k successive arg-max selections (the lowest
 * index among equals), on 1 and 2 threads. */
Test(moe_router, many_experts_topk_equals_successive_argmax)
{
    static const size_t shapes[][2] = { { 128, 8 }, { 60, 4 }, { 512, 8 }, { 64, 64 } };
    const size_t N = 70;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t E = shapes[s][0], k = shapes[s][1];
        float *logits = fixture_rand(N * E, 200 + s, -2, 2);
        for (size_t i = 0; i < N * E; i++) logits[i] = roundf(logits[i] * 2) / 2;   /* 9 levels */
        float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float));
        float *w = td_malloc(N * k * sizeof(float));
        int32_t *idx = td_malloc(N * k * sizeof(int32_t)), *want = td_malloc(N * k * sizeof(int32_t));
        char *taken = td_malloc(E);
        size_t bad = 0;
        for (int th = 1; th <= 2; th++) {
            pool_init(th);
            moe_router_forward(probs, lse, idx, w, logits, N, E, k, false);
            for (size_t t = 0; t < N; t++) {
                const float *p = probs + t * E;
                memset(taken, 0, E);
                for (size_t j = 0; j < k; j++) {
                    size_t best = E;
                    for (size_t e = 0; e < E; e++)
                        if (!taken[e] && (best == E || p[e] > p[best])) best = e;
                    taken[best] = 1;
                    want[t * k + j] = (int32_t)best;
                    bad += idx[t * k + j] != (int32_t)best || w[t * k + j] != p[best];
                }
            }
        }
        pool_init(1);
        cr_expect_eq(bad, 0, "E=%zu k=%zu: %zu of %zu selections differ from successive arg-max", E, k, bad,
                     2 * N * k);
        td_free(logits);
        td_free(probs);
        td_free(lse);
        td_free(w);
        td_free(idx);
        td_free(want);
        td_free(taken);
    }
    EXPECT_NO_LEAKS();
}

Test(moe_router, chain_matches_torch)
{
    /* router -> top-k weights (upstream dw) + aux (coefficient a) + z
     * (coefficient b), backward through moe_topk_backward,
     * moe_aux_backward, softmax_backward and moe_z_backward, against torch
     * autograd of the SPEC formulas. */
    int n_cases = (int)fixture_attr(FX_ROUTER, "n_cases");
    cr_expect_geq(n_cases, 4, "moe_router.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX_ROUTER, c, "dims", NULL);
        const size_t N = (size_t)dims[0], E = (size_t)dims[1], k = (size_t)dims[2];
        const bool norm = dims[3] != 0;
        float *coef = fixture_case_f32(FX_ROUTER, c, "coef", NULL);
        float *logits = fixture_case_f32(FX_ROUTER, c, "logits", NULL), *dw = fixture_case_f32(FX_ROUTER, c, "dw", NULL);
        float *p_ref = fixture_case_f32(FX_ROUTER, c, "probs", NULL), *l_ref = fixture_case_f32(FX_ROUTER, c, "lse", NULL);
        int32_t *idx_ref = fixture_case_i32(FX_ROUTER, c, "topk_idx", NULL);
        float *w_ref = fixture_case_f32(FX_ROUTER, c, "topk_w", NULL), *cnt_ref = fixture_case_f32(FX_ROUTER, c, "count", NULL);
        float *aux_ref = fixture_case_f32(FX_ROUTER, c, "aux", NULL), *z_ref = fixture_case_f32(FX_ROUTER, c, "z", NULL);
        float *dl_ref = fixture_case_f32(FX_ROUTER, c, "dlogits", NULL);

        float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float));
        float *w = td_malloc(N * k * sizeof(float));
        int32_t *idx = td_malloc(N * k * sizeof(int32_t));
        moe_router_forward(probs, lse, idx, w, logits, N, E, k, norm);
        double *count = td_malloc(E * sizeof(double)), *psum = td_malloc(E * sizeof(double));
        moe_aux_stats(count, psum, probs, idx, N, E, k);
        float aux = moe_aux_loss(count, psum, N, E, k);
        float z = moe_z_sum(lse, N) / (float)N;

        float *dprobs = td_calloc(N * E * sizeof(float));
        moe_topk_backward(dprobs, dw, probs, idx, N, E, k, norm);
        moe_aux_backward(dprobs, coef[0], count, N, N, E, k);
        float *dl = fixture_rand(N * E, 10 + (uint64_t)c, -1, 1);   /* non-zero: += */
        float *dl_want = td_malloc(N * E * sizeof(float));
        for (size_t i = 0; i < N * E; i++) dl_want[i] = (float)((double)dl[i] + dl_ref[i]);
        softmax_backward(dl, dprobs, probs, N, E);
        moe_z_backward(dl, coef[1], lse, probs, N, N, E);

        char what[64];
        size_t bad = 0;
        for (size_t i = 0; i < N * k; i++) bad += idx[i] != idx_ref[i];
        cr_expect_eq(bad, 0, "case %d: %zu top-k indices differ from torch.topk", c, bad);
        float cnt[16];
        for (size_t e = 0; e < E; e++) cnt[e] = (float)count[e];
        snprintf(what, sizeof what, "count, case %d", c);
        EXPECT_BITWISE(cnt, cnt_ref, E, what);
        /* forward: float softmax, a few ulp (2e-6 relative); aux and z are
         * O(1) sums in double of float inputs: 1e-6 relative */
        snprintf(what, sizeof what, "probs, case %d", c);
        EXPECT_CLOSE(probs, p_ref, N * E, 0, 2e-6, what);
        snprintf(what, sizeof what, "lse, case %d", c);
        EXPECT_CLOSE(lse, l_ref, N, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "topk_w, case %d (k=%zu norm=%d)", c, k, norm);
        EXPECT_CLOSE(w, w_ref, N * k, 0, 2e-6, what);
        snprintf(what, sizeof what, "aux, case %d", c);
        EXPECT_CLOSE(&aux, aux_ref, 1, 0, 1e-6, what);
        snprintf(what, sizeof what, "z, case %d", c);
        EXPECT_CLOSE(&z, z_ref, 1, 0, 1e-6, what);
        /* backward: O(1) terms through four float ops: 1e-6 absolute on top
         * of the O(1) start value */
        snprintf(what, sizeof what, "dlogits, case %d (N=%zu E=%zu k=%zu norm=%d)", c, N, E, k, norm);
        EXPECT_CLOSE(dl, dl_want, N * E, 1e-6, 1e-6, what);

        td_free(dims);
        td_free(coef);
        td_free(logits);
        td_free(dw);
        td_free(p_ref);
        td_free(l_ref);
        td_free(idx_ref);
        td_free(w_ref);
        td_free(cnt_ref);
        td_free(aux_ref);
        td_free(z_ref);
        td_free(dl_ref);
        td_free(probs);
        td_free(lse);
        td_free(w);
        td_free(idx);
        td_free(count);
        td_free(psum);
        td_free(dprobs);
        td_free(dl);
        td_free(dl_want);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dw; const int32_t *idx; size_t N, E, k; bool norm; } TopkFd;

/* L(p) = sum dw * w(p), selection fixed */
static double topk_loss(const double *p, void *vctx)
{
    const TopkFd *c = vctx;
    double *w = td_malloc(c->N * c->k * sizeof(double)), L = 0;
    naive_topk_w(w, p, c->idx, c->N, c->E, c->k, c->norm);
    for (size_t i = 0; i < c->N * c->k; i++) L += c->dw[i] * w[i];
    td_free(w);
    return L;
}

Test(moe_router, topk_backward_matches_finite_differences)
{
    const size_t N = 7, E = 6;
    static const size_t ks[] = { 1, 2, 6 };
    for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
        for (int norm = 0; norm <= 1; norm++) {
            const size_t k = ks[a];
            float *logits = fixture_rand(N * E, 20 + a, -3, 3), *dw = fixture_rand(N * k, 21 + a, -1, 1);
            float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float));
            float *w = td_malloc(N * k * sizeof(float));
            int32_t *idx = td_malloc(N * k * sizeof(int32_t));
            moe_router_forward(probs, lse, idx, w, logits, N, E, k, norm);
            double *pd = to_f64(probs, N * E), *dwd = to_f64(dw, N * k), *g = td_malloc(N * E * sizeof(double));
            TopkFd ctx = { dwd, idx, N, E, k, norm };
            fixture_fd(g, topk_loss, &ctx, pd, N * E, 1e-7);   /* p ~ 0.1: h small against p */
            float *dp = fixture_rand(N * E, 22 + a, -1, 1), *want = td_malloc(N * E * sizeof(float));
            for (size_t i = 0; i < N * E; i++) want[i] = (float)(dp[i] + g[i]);
            moe_topk_backward(dp, dw, probs, idx, N, E, k, norm);
            /* unnormalised: dw itself (exact); normalised: (dw - dw.w)/S with
             * S >= 1/E: O(1..6) values good to a few ulp; FD with h = 1e-7 on
             * a rational function of p >= 1e-3: ~1e-7 relative.  2e-6
             * absolute + 1e-6 relative. */
            char what[64];
            snprintf(what, sizeof what, "dprobs vs FD, k=%zu norm=%d", k, norm);
            EXPECT_CLOSE(dp, want, N * E, 2e-6, 1e-6, what);
            td_free(logits);
            td_free(dw);
            td_free(probs);
            td_free(lse);
            td_free(w);
            td_free(idx);
            td_free(pd);
            td_free(dwd);
            td_free(g);
            td_free(dp);
            td_free(want);
        }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dw; const int32_t *idx; const double *count; size_t N, E, k; bool norm; double a, b; } ChainFd;

/* L(logits) = sum dw * w(softmax(logits)) + a aux + b z, selection and
 * counts fixed (the SPEC: no gradient through count_e) */
static double chain_loss(const double *x, void *vctx)
{
    const ChainFd *c = vctx;
    double *p = td_malloc(c->N * c->E * sizeof(double)), *lse = td_malloc(c->N * sizeof(double));
    double *w = td_malloc(c->N * c->k * sizeof(double));
    naive_softmax(p, lse, x, c->N, c->E);
    naive_topk_w(w, p, c->idx, c->N, c->E, c->k, c->norm);
    double L = 0, z = 0;
    for (size_t i = 0; i < c->N * c->k; i++) L += c->dw[i] * w[i];
    for (size_t t = 0; t < c->N; t++) z += lse[t] * lse[t];
    L += c->a * naive_aux(p, c->count, c->N, c->E, c->k) + c->b * z / (double)c->N;
    td_free(p);
    td_free(lse);
    td_free(w);
    return L;
}

Test(moe_router, chain_backward_matches_finite_differences)
{
    static const size_t shapes[][3] = { { 5, 4, 1 }, { 11, 8, 2 }, { 3, 3, 3 } };   /* N, E, k */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int norm = 0; norm <= 1; norm++) {
            const size_t N = shapes[s][0], E = shapes[s][1], k = shapes[s][2];
            const float a = 0.7f, b = 0.3f;
            float *logits = fixture_rand(N * E, 30 + s, -3, 3), *dw = fixture_rand(N * k, 31 + s, -1, 1);
            float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float));
            float *w = td_malloc(N * k * sizeof(float));
            int32_t *idx = td_malloc(N * k * sizeof(int32_t));
            moe_router_forward(probs, lse, idx, w, logits, N, E, k, norm);
            double *count = td_malloc(E * sizeof(double)), *psum = td_malloc(E * sizeof(double));
            moe_aux_stats(count, psum, probs, idx, N, E, k);
            double *ld = to_f64(logits, N * E), *dwd = to_f64(dw, N * k), *g = td_malloc(N * E * sizeof(double));
            ChainFd ctx = { dwd, idx, count, N, E, k, norm, a, b };
            fixture_fd(g, chain_loss, &ctx, ld, N * E, 1e-6);
            float *dl = fixture_rand(N * E, 32 + s, -1, 1), *want = td_malloc(N * E * sizeof(float));
            for (size_t i = 0; i < N * E; i++) want[i] = (float)(dl[i] + g[i]);
            float *dprobs = td_calloc(N * E * sizeof(float));
            moe_topk_backward(dprobs, dw, probs, idx, N, E, k, norm);
            moe_aux_backward(dprobs, a, count, N, N, E, k);
            softmax_backward(dl, dprobs, probs, N, E);
            moe_z_backward(dl, b, lse, probs, N, N, E);
            /* FD good to ~1e-9 (h = 1e-6, smooth); float chain: 1e-6 */
            char what[64];
            snprintf(what, sizeof what, "dlogits vs FD, N=%zu E=%zu k=%zu norm=%d", N, E, k, norm);
            EXPECT_CLOSE(dl, want, N * E, 1e-6, 1e-6, what);
            td_free(logits);
            td_free(dw);
            td_free(probs);
            td_free(lse);
            td_free(w);
            td_free(idx);
            td_free(count);
            td_free(psum);
            td_free(ld);
            td_free(dwd);
            td_free(g);
            td_free(want);
            td_free(dl);
            td_free(dprobs);
        }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ plan, dispatch, combine */

static MoePlan plan_new(size_t N, size_t E, size_t k)
{
    const size_t rows = N * k > 0 ? N * k : 1;
    MoePlan p = { td_malloc((E + 1) * sizeof(int32_t)), td_malloc(rows * sizeof(int32_t)),
                  td_malloc(rows * sizeof(int32_t)) };
    return p;
}

static void plan_free(MoePlan *p)
{
    td_free(p->offsets);
    td_free(p->src);
    td_free(p->slot_row);
}

Test(moe_dispatch, plan_groups_pairs_by_expert_in_token_order)
{
    /* N = 6 tokens, k = 2, E = 5; expert 0 and expert 3 get no token */
    const size_t N = 6, E = 5, k = 2;
    const int32_t idx[12] = { 4, 1, 2, 4, 1, 2, 4, 2, 1, 4, 2, 1 };
    /* tokens (t: j0, j1): 0: (4, 1)  1: (2, 4)  2: (1, 2)  3: (4, 2)  4: (1, 4)
     * 5: (2, 1), so expert 1 takes tokens 0 2 4 5, expert 2 tokens 1 2 3 5
     * and expert 4 tokens 0 1 3 4, each group in token order */
    const int32_t offsets[6] = { 0, 0, 4, 8, 8, 12 };
    const int32_t src[12] = { 0, 2, 4, 5, 1, 2, 3, 5, 0, 1, 3, 4 };
    MoePlan p = plan_new(N, E, k);
    moe_plan_build(&p, idx, N, E, k);
    int bad = 0;
    for (size_t e = 0; e <= E; e++) bad += p.offsets[e] != offsets[e];
    cr_expect_eq(bad, 0, "offsets: %d %d %d %d %d %d", p.offsets[0], p.offsets[1], p.offsets[2],
                 p.offsets[3], p.offsets[4], p.offsets[5]);
    bad = 0;
    for (size_t i = 0; i < N * k; i++) bad += p.src[i] != src[i];
    cr_expect_eq(bad, 0, "src (token of each dispatched row) differs in %d rows", bad);
    /* slot_row: row of (t, j) is in expert idx[t, j]'s range and has src t,
     * and every row is used exactly once */
    int used[12] = { 0 };
    bad = 0;
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < k; j++) {
            int32_t r = p.slot_row[t * k + j], e = idx[t * k + j];
            bad += r < offsets[e] || r >= offsets[e + 1] || p.src[r] != (int32_t)t;
            if (r >= 0 && r < 12) used[r]++;
        }
    for (size_t i = 0; i < 12; i++) bad += used[i] != 1;
    cr_expect_eq(bad, 0, "slot_row inconsistent (%d problems)", bad);
    plan_free(&p);
    EXPECT_NO_LEAKS();
}

/* Random routing of N tokens over E experts, distinct within a token, never
 * expert E-1 (so one expert receives nothing). */
static int32_t *random_routing(size_t N, size_t E, size_t k, uint64_t seed)
{
    int32_t *idx = td_malloc(N * k * sizeof(int32_t));
    float *u = fixture_rand(N * k, seed, 0, 1);
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < k; j++) {
            int32_t e;
            size_t tries = 0;
            do {
                e = (int32_t)((size_t)(u[t * k + j] * (float)(E - 1) + (float)tries) % (E - 1));
                tries++;
                bool dup = false;
                for (size_t i = 0; i < j; i++) dup |= idx[t * k + i] == e;
                if (!dup) break;
            } while (1);
            idx[t * k + j] = e;
        }
    td_free(u);
    return idx;
}

Test(moe_dispatch, dispatch_copies_rows_and_backward_sums_slots_in_order)
{
    const size_t N = 13, E = 5, k = 3, d = 17;
    int32_t *idx = random_routing(N, E, k, 40);
    MoePlan p = plan_new(N, E, k);
    moe_plan_build(&p, idx, N, E, k);
    cr_expect_eq(p.offsets[E - 1], p.offsets[E], "expert E-1 receives no token");
    float *x = fixture_rand(N * d, 41, -1, 1), *xd = td_malloc(N * k * d * sizeof(float));
    moe_dispatch_forward(xd, x, &p, N, k, d);
    for (size_t i = 0; i < N * k; i++) {
        char what[48];
        snprintf(what, sizeof what, "dispatched row %zu", i);
        EXPECT_BITWISE(xd + i * d, x + (size_t)p.src[i] * d, d, what);
    }
    /* backward: dx[t] += sum_j dxd[slot_row[t, j]] in slot order, in float */
    float *dxd = fixture_rand(N * k * d, 42, -1, 1), *dx = fixture_rand(N * d, 43, -100, 100);
    float *want = fixture_copy(dx, N * d);
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < k; j++)
            for (size_t i = 0; i < d; i++) want[t * d + i] += dxd[(size_t)p.slot_row[t * k + j] * d + i];
    moe_dispatch_backward(dx, dxd, &p, N, k, d);
    EXPECT_BITWISE(dx, want, N * d, "dx += dispatched gradients, slots in order");
    td_free(idx);
    plan_free(&p);
    td_free(x);
    td_free(xd);
    td_free(dxd);
    td_free(dx);
    td_free(want);
    EXPECT_NO_LEAKS();
}

Test(moe_dispatch, combine_forward_is_an_fma_chain_over_slots)
{
    const size_t N = 13, E = 6, k = 3, d = 33;
    int32_t *idx = random_routing(N, E, k, 50);
    MoePlan p = plan_new(N, E, k);
    moe_plan_build(&p, idx, N, E, k);
    float *eo = fixture_rand(N * k * d, 51, -1, 1), *w = fixture_rand(N * k, 52, 0, 1);
    float *y = td_malloc(N * d * sizeof(float)), *want = td_malloc(N * d * sizeof(float));
    for (size_t t = 0; t < N; t++)
        for (size_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (size_t j = 0; j < k; j++)
                acc = fmaf(w[t * k + j], eo[(size_t)p.slot_row[t * k + j] * d + i], acc);
            want[t * d + i] = acc;
        }
    moe_combine_forward(y, eo, w, &p, N, k, d);
    EXPECT_BITWISE(y, want, N * d, "y = sum_j w_tj eo[row(t, j)] as an fma chain");
    td_free(idx);
    plan_free(&p);
    td_free(eo);
    td_free(w);
    td_free(y);
    td_free(want);
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; const MoePlan *p; size_t N, k, d; } CombFd;

/* L(eo, w) = sum dy * combine(eo, w); pr = [eo (N*k*d), w (N*k)] */
static double comb_loss(const double *pr, void *vctx)
{
    const CombFd *c = vctx;
    const double *eo = pr, *w = pr + c->N * c->k * c->d;
    double L = 0;
    for (size_t t = 0; t < c->N; t++)
        for (size_t j = 0; j < c->k; j++)
            for (size_t i = 0; i < c->d; i++)
                L += c->dy[t * c->d + i] * w[t * c->k + j] * eo[(size_t)c->p->slot_row[t * c->k + j] * c->d + i];
    return L;
}

Test(moe_dispatch, combine_backward_matches_finite_differences)
{
    static const size_t shapes[][4] = { { 1, 2, 1, 1 }, { 7, 4, 2, 5 }, { 13, 6, 3, 33 } };   /* N, E, k, d */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], E = shapes[s][1], k = shapes[s][2], d = shapes[s][3];
        const size_t ne = N * k * d, np = ne + N * k;
        int32_t *idx = random_routing(N, E, k, 60 + s);
        MoePlan p = plan_new(N, E, k);
        moe_plan_build(&p, idx, N, E, k);
        float *eo = fixture_rand(ne, 61 + s, -1, 1), *w = fixture_rand(N * k, 62 + s, 0, 1);
        float *dy = fixture_rand(N * d, 63 + s, -1, 1);
        float *deo = fixture_rand(ne, 64 + s, -1, 1), *dw = fixture_rand(N * k, 65 + s, -1, 1);
        double *pr = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        for (size_t i = 0; i < ne; i++) pr[i] = eo[i];
        for (size_t i = 0; i < N * k; i++) pr[ne + i] = w[i];
        double *dyd = to_f64(dy, N * d);
        CombFd ctx = { dyd, &p, N, k, d };
        fixture_fd(g, comb_loss, &ctx, pr, np, 1e-3);   /* bilinear: any h is exact */
        float *want = td_malloc(np * sizeof(float));
        for (size_t i = 0; i < ne; i++) want[i] = (float)(deo[i] + g[i]);
        for (size_t i = 0; i < N * k; i++) want[ne + i] = (float)(dw[i] + g[ne + i]);
        moe_combine_backward(deo, dw, dy, eo, w, &p, N, k, d);
        /* deo: one float product per element (1 ulp) plus the start value;
         * dw: a float dot of d <= 33 terms in [-1, 1]: ~1e-6.  2e-6 absolute. */
        char what[64];
        snprintf(what, sizeof what, "deo vs FD, N=%zu k=%zu d=%zu", N, k, d);
        EXPECT_CLOSE(deo, want, ne, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "dw vs FD, N=%zu k=%zu d=%zu", N, k, d);
        EXPECT_CLOSE(dw, want + ne, N * k, 2e-6, 1e-6, what);
        td_free(idx);
        plan_free(&p);
        td_free(eo);
        td_free(w);
        td_free(dy);
        td_free(deo);
        td_free(dw);
        td_free(pr);
        td_free(g);
        td_free(dyd);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

Test(moe_dispatch, layer_matches_torch)
{
    /* dispatch -> expert e: linear x A_e^T on rows [offsets[e], offsets[e+1])
     * -> combine, forward and backward, against torch autograd.  Expert E-1
     * receives no token: its rows are empty and its gradient stays as it was. */
    int n_cases = (int)fixture_attr(FX_LAYER, "n_cases");
    cr_expect_geq(n_cases, 2, "moe_layer.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX_LAYER, c, "dims", NULL);
        const size_t N = (size_t)dims[0], E = (size_t)dims[1], k = (size_t)dims[2];
        const size_t d = (size_t)dims[3], dout = (size_t)dims[4];
        int32_t *idx = fixture_case_i32(FX_LAYER, c, "idx", NULL);
        float *x = fixture_case_f32(FX_LAYER, c, "x", NULL), *w = fixture_case_f32(FX_LAYER, c, "w", NULL);
        float *A = fixture_case_f32(FX_LAYER, c, "A", NULL), *dy = fixture_case_f32(FX_LAYER, c, "dy", NULL);
        float *y_ref = fixture_case_f32(FX_LAYER, c, "y", NULL), *dx_ref = fixture_case_f32(FX_LAYER, c, "dx", NULL);
        float *dw_ref = fixture_case_f32(FX_LAYER, c, "dw", NULL), *dA_ref = fixture_case_f32(FX_LAYER, c, "dA", NULL);

        MoePlan p = plan_new(N, E, k);
        moe_plan_build(&p, idx, N, E, k);
        cr_expect_eq(p.offsets[E - 1], p.offsets[E], "case %d: expert E-1 should receive no token", c);
        float *xd = td_malloc(N * k * d * sizeof(float)), *eo = td_malloc(N * k * dout * sizeof(float));
        float *y = td_malloc(N * dout * sizeof(float));
        float *P = td_malloc(gemm_packed_bytes(DTYPE_F32, dout, d));
        moe_dispatch_forward(xd, x, &p, N, k, d);
        for (size_t e = 0; e < E; e++) {
            size_t r0 = (size_t)p.offsets[e], r1 = (size_t)p.offsets[e + 1];
            gemm_pack(P, DTYPE_F32, A + e * dout * d, dout, d);
            const GemmW W = gemm_w(DTYPE_F32, P, dout, d);
            linear_forward(eo + r0 * dout, xd + r0 * d, &W, r1 - r0);
        }
        moe_combine_forward(y, eo, w, &p, N, k, dout);

        /* backward; gradients start non-zero */
        float *deo = td_calloc(N * k * dout * sizeof(float)), *dxd = td_calloc(N * k * d * sizeof(float));
        float *dw = fixture_rand(N * k, 70 + (uint64_t)c, -1, 1), *dx = fixture_rand(N * d, 71 + (uint64_t)c, -1, 1);
        float *dA = fixture_rand(E * dout * d, 72 + (uint64_t)c, -1, 1);
        float *dw_want = td_malloc(N * k * sizeof(float)), *dx_want = td_malloc(N * d * sizeof(float));
        float *dA_want = td_malloc(E * dout * d * sizeof(float));
        for (size_t i = 0; i < N * k; i++) dw_want[i] = (float)((double)dw[i] + dw_ref[i]);
        for (size_t i = 0; i < N * d; i++) dx_want[i] = (float)((double)dx[i] + dx_ref[i]);
        for (size_t i = 0; i < E * dout * d; i++) dA_want[i] = (float)((double)dA[i] + dA_ref[i]);
        moe_combine_backward(deo, dw, dy, eo, w, &p, N, k, dout);
        for (size_t e = 0; e < E; e++) {
            size_t r0 = (size_t)p.offsets[e], r1 = (size_t)p.offsets[e + 1];
            linear_backward(dxd + r0 * d, dA + e * dout * d, deo + r0 * dout, xd + r0 * d,
                            A + e * dout * d, r1 - r0, dout, d);
        }
        moe_dispatch_backward(dx, dxd, &p, N, k, d);

        /* float products over d <= 16 inputs and k <= 3 slots of O(1)
         * values, and BLAS sums over <= 20 rows: ~1e-6; 1e-5 absolute */
        char what[64];
        snprintf(what, sizeof what, "y, case %d (N=%zu E=%zu k=%zu)", c, N, E, k);
        EXPECT_CLOSE(y, y_ref, N * dout, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "dx, case %d", c);
        EXPECT_CLOSE(dx, dx_want, N * d, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "dw (top-k weights), case %d", c);
        EXPECT_CLOSE(dw, dw_want, N * k, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "dA (expert weights), case %d", c);
        EXPECT_CLOSE(dA, dA_want, E * dout * d, 1e-5, 1e-5, what);

        td_free(dims);
        td_free(idx);
        td_free(x);
        td_free(w);
        td_free(A);
        td_free(dy);
        td_free(y_ref);
        td_free(dx_ref);
        td_free(dw_ref);
        td_free(dA_ref);
        plan_free(&p);
        td_free(xd);
        td_free(eo);
        td_free(y);
        td_free(P);
        td_free(deo);
        td_free(dxd);
        td_free(dw);
        td_free(dx);
        td_free(dA);
        td_free(dw_want);
        td_free(dx_want);
        td_free(dA_want);
    }
    EXPECT_NO_LEAKS();
}

Test(moe_dispatch, two_threads_bit_identical)
{
    const size_t N = 40, E = 6, k = 2, d = 33;   /* N * k = 80 rows (grain 16), N = 40 (grain 8) */
    int32_t *idx = random_routing(N, E, k, 80);
    MoePlan p = plan_new(N, E, k);
    moe_plan_build(&p, idx, N, E, k);
    float *x = fixture_rand(N * d, 81, -1, 1), *w = fixture_rand(N * k, 82, 0, 1);
    float *dy = fixture_rand(N * d, 83, -1, 1), *dxd = fixture_rand(N * k * d, 84, -1, 1);
    float *xd[2], *y[2], *dx[2], *deo[2], *dw[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        xd[t] = td_malloc(N * k * d * sizeof(float));
        y[t] = td_malloc(N * d * sizeof(float));
        dx[t] = fixture_rand(N * d, 85, -1, 1);
        deo[t] = fixture_rand(N * k * d, 86, -1, 1);
        dw[t] = fixture_rand(N * k, 87, -1, 1);
        moe_dispatch_forward(xd[t], x, &p, N, k, d);
        moe_combine_forward(y[t], xd[t], w, &p, N, k, d);   /* experts = identity */
        moe_dispatch_backward(dx[t], dxd, &p, N, k, d);
        moe_combine_backward(deo[t], dw[t], dy, xd[t], w, &p, N, k, d);
    }
    pool_init(1);
    EXPECT_BITWISE(xd[1], xd[0], N * k * d, "dispatch, 2 threads vs 1");
    EXPECT_BITWISE(y[1], y[0], N * d, "combine, 2 threads vs 1");
    EXPECT_BITWISE(dx[1], dx[0], N * d, "dispatch backward, 2 threads vs 1");
    EXPECT_BITWISE(deo[1], deo[0], N * k * d, "combine backward deo, 2 threads vs 1");
    EXPECT_BITWISE(dw[1], dw[0], N * k, "combine backward dw, 2 threads vs 1");
    for (int t = 0; t < 2; t++) {
        td_free(xd[t]);
        td_free(y[t]);
        td_free(dx[t]);
        td_free(deo[t]);
        td_free(dw[t]);
    }
    td_free(idx);
    plan_free(&p);
    td_free(x);
    td_free(w);
    td_free(dy);
    td_free(dxd);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ aux and z losses */

Test(moe_aux, stats_and_loss_match_naive_double)
{
    const size_t N = 19, E = 7, k = 2;
    float *logits = fixture_rand(N * E, 90, -3, 3);
    float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
    int32_t *idx = td_malloc(N * k * sizeof(int32_t));
    moe_router_forward(probs, lse, idx, w, logits, N, E, k, true);
    double count[7], psum[7], cnt_want[7] = { 0 }, ps_want[7] = { 0 };
    moe_aux_stats(count, psum, probs, idx, N, E, k);
    for (size_t i = 0; i < N * k; i++) cnt_want[idx[i]] += 1;
    for (size_t t = 0; t < N; t++)
        for (size_t e = 0; e < E; e++) ps_want[e] += probs[t * E + e];
    int bad = 0;
    for (size_t e = 0; e < E; e++) bad += count[e] != cnt_want[e] || fabs(psum[e] - ps_want[e]) > 1e-12;
    cr_expect_eq(bad, 0, "aux statistics differ for %d experts", bad);
    double *pd = to_f64(probs, N * E);
    float aux = moe_aux_loss(count, psum, N, E, k), aux_want = (float)naive_aux(pd, cnt_want, N, E, k);
    /* double sums, rounded once to float */
    EXPECT_CLOSE(&aux, &aux_want, 1, 0, 1e-7, "aux loss");
    float z = moe_z_sum(lse, N), z_want = 0;
    double zs = 0;
    for (size_t t = 0; t < N; t++) zs += (double)lse[t] * lse[t];
    z_want = (float)zs;
    EXPECT_CLOSE(&z, &z_want, 1, 0, 1e-7, "z sum");
    td_free(logits);
    td_free(probs);
    td_free(lse);
    td_free(w);
    td_free(idx);
    td_free(pd);
    EXPECT_NO_LEAKS();
}

Test(moe_aux, loss_is_one_at_perfect_balance_and_E_when_collapsed)
{
    /* balanced: p uniform (1/4 exactly), each expert chosen N k / E times */
    const size_t N = 8, E = 4, k = 2;
    float probs[8 * 4];
    int32_t idx[8 * 2];
    for (size_t i = 0; i < N * E; i++) probs[i] = 0.25f;
    for (size_t t = 0; t < N; t++) {
        idx[t * k] = (int32_t)(t % E);
        idx[t * k + 1] = (int32_t)((t + 1) % E);
    }
    double count[4], psum[4];
    moe_aux_stats(count, psum, probs, idx, N, E, k);
    float aux = moe_aux_loss(count, psum, N, E, k);
    cr_expect(aux == 1.0f, "balanced routing: aux = %.9g, want 1", (double)aux);
    /* collapsed: k = 1, every token to expert 0 with p_0 = 1 */
    for (size_t t = 0; t < N; t++) {
        for (size_t e = 0; e < E; e++) probs[t * E + e] = e == 0 ? 1.0f : 0.0f;
        idx[t] = 0;
    }
    moe_aux_stats(count, psum, probs, idx, N, E, 1);
    aux = moe_aux_loss(count, psum, N, E, 1);
    cr_expect(aux == (float)E, "collapsed routing: aux = %.9g, want E = %zu", (double)aux, E);
    EXPECT_NO_LEAKS();
}

typedef struct { const double *count; size_t N, E, k; } AuxFd;

static double aux_loss_fd(const double *p, void *vctx)
{
    const AuxFd *c = vctx;
    return naive_aux(p, c->count, c->N, c->E, c->k);
}

Test(moe_aux, backward_matches_finite_differences)
{
    static const size_t shapes[][3] = { { 5, 4, 1 }, { 13, 8, 2 }, { 3, 3, 3 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], E = shapes[s][1], k = shapes[s][2];
        float *logits = fixture_rand(N * E, 100 + s, -3, 3);
        float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
        int32_t *idx = td_malloc(N * k * sizeof(int32_t));
        moe_router_forward(probs, lse, idx, w, logits, N, E, k, false);
        double count[8], psum[8];
        moe_aux_stats(count, psum, probs, idx, N, E, k);
        double *pd = to_f64(probs, N * E), *g = td_malloc(N * E * sizeof(double));
        AuxFd ctx = { count, N, E, k };
        fixture_fd(g, aux_loss_fd, &ctx, pd, N * E, 1e-4);   /* linear in p: exact */
        const float daux = 1.7f;
        float *dp = fixture_rand(N * E, 101 + s, -1, 1), *want = td_malloc(N * E * sizeof(float));
        for (size_t i = 0; i < N * E; i++) want[i] = (float)(dp[i] + daux * g[i]);
        moe_aux_backward(dp, daux, count, N, N, E, k);
        /* one float per expert added to an O(1) start value: 1 ulp */
        char what[48];
        snprintf(what, sizeof what, "dprobs vs FD, N=%zu E=%zu k=%zu", N, E, k);
        EXPECT_CLOSE(dp, want, N * E, 1e-6, 1e-6, what);
        td_free(logits);
        td_free(probs);
        td_free(lse);
        td_free(w);
        td_free(idx);
        td_free(pd);
        td_free(g);
        td_free(dp);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { size_t N, N_tot, E; } ZFd;

/* z(logits) = sum_t lse_t^2 / N_tot over the local rows */
static double z_loss_fd(const double *x, void *vctx)
{
    const ZFd *c = vctx;
    double *lse = td_malloc(c->N * sizeof(double)), z = 0;
    naive_softmax(NULL, lse, x, c->N, c->E);
    for (size_t t = 0; t < c->N; t++) z += lse[t] * lse[t];
    td_free(lse);
    return z / (double)c->N_tot;
}

Test(moe_aux, z_backward_matches_finite_differences)
{
    static const size_t shapes[][3] = { { 1, 2, 1 }, { 7, 4, 7 }, { 5, 8, 12 } };   /* N, E, N_tot */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], E = shapes[s][1], N_tot = shapes[s][2];
        float *logits = fixture_rand(N * E, 110 + s, -3, 3);
        float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float)), *w = td_malloc(N * sizeof(float));
        int32_t *idx = td_malloc(N * sizeof(int32_t));
        moe_router_forward(probs, lse, idx, w, logits, N, E, 1, false);
        double *ld = to_f64(logits, N * E), *g = td_malloc(N * E * sizeof(double));
        ZFd ctx = { N, N_tot, E };
        fixture_fd(g, z_loss_fd, &ctx, ld, N * E, 1e-6);
        const float dz = 0.9f;
        float *dl = fixture_rand(N * E, 111 + s, -1, 1), *want = td_malloc(N * E * sizeof(float));
        for (size_t i = 0; i < N * E; i++) want[i] = (float)(dl[i] + dz * g[i]);
        moe_z_backward(dl, dz, lse, probs, N, N_tot, E);
        /* 2 lse p / N_tot: O(1) in float, FD good to 1e-9: 1e-6 */
        char what[64];
        snprintf(what, sizeof what, "dlogits vs FD, N=%zu E=%zu N_tot=%zu", N, E, N_tot);
        EXPECT_CLOSE(dl, want, N * E, 1e-6, 1e-6, what);
        td_free(logits);
        td_free(probs);
        td_free(lse);
        td_free(w);
        td_free(idx);
        td_free(ld);
        td_free(g);
        td_free(dl);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

Test(moe_aux, ranks_summing_statistics_match_one_process)
{
    /* Two data-parallel "ranks" with 5 and 8 rows: summed statistics give
     * the single-process loss, and each rank's backward (N local, N_tot =
     * 13) gives the bits of the single-process backward for its rows. */
    const size_t N = 13, N0 = 5, E = 6, k = 2;
    float *logits = fixture_rand(N * E, 120, -3, 3);
    float *probs = td_malloc(N * E * sizeof(float)), *lse = td_malloc(N * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
    int32_t *idx = td_malloc(N * k * sizeof(int32_t));
    moe_router_forward(probs, lse, idx, w, logits, N, E, k, true);
    double count[6], psum[6], c0[6], p0[6], c1[6], p1[6];
    moe_aux_stats(count, psum, probs, idx, N, E, k);
    moe_aux_stats(c0, p0, probs, idx, N0, E, k);
    moe_aux_stats(c1, p1, probs + N0 * E, idx + N0 * k, N - N0, E, k);
    for (size_t e = 0; e < E; e++) {
        c0[e] += c1[e];
        p0[e] += p1[e];
        cr_expect(c0[e] == count[e], "expert %zu: count %g over ranks, %g in one process", e, c0[e], count[e]);
    }
    float aux = moe_aux_loss(count, psum, N, E, k), aux_r = moe_aux_loss(c0, p0, N, E, k);
    /* psum summed in another order (double): differs by ~1e-16 */
    EXPECT_CLOSE(&aux_r, &aux, 1, 0, 1e-7, "aux over ranks vs one process");
    float z = moe_z_sum(lse, N), z_r = moe_z_sum(lse, N0) + moe_z_sum(lse + N0, N - N0);
    EXPECT_CLOSE(&z_r, &z, 1, 0, 1e-6, "z sum over ranks vs one process");

    float *d_all = fixture_rand(N * E, 121, -1, 1), *d_rank = fixture_copy(d_all, N * E);
    moe_aux_backward(d_all, 0.5f, count, N, N, E, k);
    moe_z_backward(d_all, 0.25f, lse, probs, N, N, E);
    moe_aux_backward(d_rank, 0.5f, c0, N0, N, E, k);
    moe_aux_backward(d_rank + N0 * E, 0.5f, c0, N - N0, N, E, k);
    moe_z_backward(d_rank, 0.25f, lse, probs, N0, N, E);
    moe_z_backward(d_rank + N0 * E, 0.25f, lse + N0, probs + N0 * E, N - N0, N, E);
    EXPECT_BITWISE(d_rank, d_all, N * E, "aux + z backward per rank vs one process");
    td_free(logits);
    td_free(probs);
    td_free(lse);
    td_free(w);
    td_free(idx);
    td_free(d_all);
    td_free(d_rank);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ sigmoid router (DeepSeek-V3) */

TestSuite(moe_sigmoid, .init = setup, .fini = teardown);

static const char *const FX_SIGMOID = "moe_sigmoid.h5";

Test(moe_sigmoid, forward_and_backward_match_torch)
{
    /* DeepseekV3TopkRouter in float64 (tests/ref/fixtures_ops.py
     * moe_sigmoid_cases): groups masked, bias on and off, norm on and off,
     * routed_scaling_factor 1, 1.5, 2.5; the backward of sum(w * dw) and of
     * the sequence-wise balance loss through the sigmoid */
    int n_cases = (int)fixture_attr(FX_SIGMOID, "n_cases");
    cr_expect_geq(n_cases, 5, "moe_sigmoid.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX_SIGMOID, c, "dims", NULL), *hb = fixture_case_i32(FX_SIGMOID, c, "has_bias", NULL);
        const size_t N = (size_t)dims[0], E = (size_t)dims[1], k = (size_t)dims[2];
        float *scale = fixture_case_f32(FX_SIGMOID, c, "scale", NULL);
        const MoeSigmoidRouter r = { (size_t)dims[3], (size_t)dims[4], dims[5] != 0, scale[0] };
        float *logits = fixture_case_f32(FX_SIGMOID, c, "logits", NULL), *bias = fixture_case_f32(FX_SIGMOID, c, "bias", NULL);
        float *dw = fixture_case_f32(FX_SIGMOID, c, "dw", NULL), *s_ref = fixture_case_f32(FX_SIGMOID, c, "scores", NULL);
        int32_t *idx_ref = fixture_case_i32(FX_SIGMOID, c, "topk_idx", NULL);
        float *w_ref = fixture_case_f32(FX_SIGMOID, c, "topk_w", NULL), *dl_ref = fixture_case_f32(FX_SIGMOID, c, "dlogits", NULL);
        float *bal_ref = fixture_case_f32(FX_SIGMOID, c, "bal", NULL), *dlb_ref = fixture_case_f32(FX_SIGMOID, c, "dlogits_bal", NULL);

        float *s = td_malloc(N * E * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
        int32_t *idx = td_malloc(N * k * sizeof(int32_t));
        moe_router_sigmoid_forward(s, idx, w, logits, hb[0] ? bias : NULL, N, E, k, &r);
        char what[96];
        size_t bad = 0;
        for (size_t i = 0; i < N * k; i++) bad += idx[i] != idx_ref[i];
        cr_expect_eq(bad, 0, "case %d: %zu chosen experts differ from torch (G=%zu TG=%zu)", c, bad, r.n_group,
                     r.topk_group);
        /* float sigmoid and a k-term sum: a few ulp */
        snprintf(what, sizeof what, "scores, case %d", c);
        EXPECT_CLOSE(s, s_ref, N * E, 0, 1e-6, what);
        snprintf(what, sizeof what, "topk_w, case %d (norm=%d scale=%g)", c, r.norm_topk, r.scale);
        EXPECT_CLOSE(w, w_ref, N * k, 0, 2e-6, what);

        float *ds = td_calloc(N * E * sizeof(float));
        float *dl = fixture_rand(N * E, 70 + (uint64_t)c, -1, 1), *want = td_malloc(N * E * sizeof(float));
        for (size_t i = 0; i < N * E; i++) want[i] = (float)((double)dl[i] + dl_ref[i]);   /* += */
        moe_sigmoid_topk_backward(ds, dw, s, idx, N, E, k, &r);
        moe_sigmoid_backward(dl, ds, s, N, E);
        snprintf(what, sizeof what, "dlogits, case %d", c);
        EXPECT_CLOSE(dl, want, N * E, 1e-6, 1e-6, what);

        double bal = moe_seq_balance(s, idx, N, E, k);
        float balf = (float)bal;
        snprintf(what, sizeof what, "sequence balance, case %d", c);
        EXPECT_CLOSE(&balf, bal_ref, 1, 0, 1e-6, what);
        memset(ds, 0, N * E * sizeof(float));
        memset(dl, 0, N * E * sizeof(float));
        moe_seq_balance_backward(ds, 1.0f, s, idx, N, E, k);
        moe_sigmoid_backward(dl, ds, s, N, E);
        snprintf(what, sizeof what, "dlogits of the balance loss, case %d", c);
        EXPECT_CLOSE(dl, dlb_ref, N * E, 1e-7, 1e-5, what);

        td_free(dims); td_free(hb); td_free(scale); td_free(logits); td_free(bias); td_free(dw);
        td_free(s_ref); td_free(idx_ref); td_free(w_ref); td_free(dl_ref); td_free(bal_ref); td_free(dlb_ref);
        td_free(s); td_free(w); td_free(idx); td_free(ds); td_free(dl); td_free(want);
    }
    EXPECT_NO_LEAKS();
}

static float logit_of(double p) { return (float)log(p / (1.0 - p)); }

Test(moe_sigmoid, masked_groups_are_minus_infinity_not_zero)
{
    /* 4 groups of 2, one kept, k = 2.  Group 0 holds the best single score
     * (0.9 + 0.1 = 1.0), group 1 the best pair (0.6 + 0.6): group 1 wins.
     * With a bias of -2 every kept choice is negative: a mask to 0 (as
     * transformers writes it) would pick masked experts instead. */
    const size_t E = 8, k = 2;
    const double p[8] = { 0.9, 0.1, 0.6, 0.6 + 1e-3, 0.3, 0.2, 0.4, 0.05 };
    float logits[8], bias[8], s[8], w[2];
    int32_t idx[2];
    for (size_t e = 0; e < E; e++) logits[e] = logit_of(p[e]), bias[e] = -2.0f;
    const MoeSigmoidRouter r = { 4, 1, true, 1.0f };
    moe_router_sigmoid_forward(s, idx, w, logits, bias, 1, E, k, &r);
    cr_expect(idx[0] == 3 && idx[1] == 2, "chose %d, %d; want 3, 2 (group 1)", idx[0], idx[1]);
    moe_router_sigmoid_forward(s, idx, w, logits, NULL, 1, E, k, &r);
    cr_expect(idx[0] == 3 && idx[1] == 2, "no bias: chose %d, %d; want 3, 2", idx[0], idx[1]);
    /* two groups kept: group 0 (1.0) joins; top-2 of the kept are 0.9, 0.601 */
    const MoeSigmoidRouter r2 = { 4, 2, true, 1.0f };
    moe_router_sigmoid_forward(s, idx, w, logits, bias, 1, E, k, &r2);
    cr_expect(idx[0] == 0 && idx[1] == 3, "two groups: chose %d, %d; want 0, 3", idx[0], idx[1]);
}

Test(moe_sigmoid, bias_moves_the_choice_not_the_weights)
{
    /* a bias of +10 on expert 5 puts it in every row's choice; its weight
     * is still its unbiased score's share (norm) times the scale, bit for
     * bit what the same arithmetic on the scores gives */
    const size_t N = 16, E = 8, k = 2;
    float *logits = fixture_rand(N * E, 80, -3, 3), bias[8] = { 0 };
    bias[5] = 10.0f;
    float *s = td_malloc(N * E * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
    float *s0 = td_malloc(N * E * sizeof(float)), *w0 = td_malloc(N * k * sizeof(float));
    int32_t *idx = td_malloc(N * k * sizeof(int32_t)), *idx0 = td_malloc(N * k * sizeof(int32_t));
    for (int norm = 0; norm <= 1; norm++) {
        const MoeSigmoidRouter r = { 1, 1, norm != 0, 2.5f };
        moe_router_sigmoid_forward(s, idx, w, logits, bias, N, E, k, &r);
        moe_router_sigmoid_forward(s0, idx0, w0, logits, NULL, N, E, k, &r);
        EXPECT_BITWISE(s, s0, N * E, "scores do not depend on the bias");
        size_t moved = 0;
        for (size_t t = 0; t < N; t++) {
            cr_expect_eq(idx[t * k], 5, "row %zu: first choice %d, want the biased expert 5", t, idx[t * k]);
            moved += idx[t * k] != idx0[t * k] || idx[t * k + 1] != idx0[t * k + 1];
            const float a = s[t * E + (size_t)idx[t * k]], b = s[t * E + (size_t)idx[t * k + 1]];
            const float den = a + b + 1e-20f;
            const float wa = norm ? a / den * 2.5f : a * 2.5f, wb = norm ? b / den * 2.5f : b * 2.5f;
            cr_expect(w[t * k] == wa && w[t * k + 1] == wb, "row %zu norm=%d: weights %.9g %.9g, want %.9g %.9g", t,
                      norm, w[t * k], w[t * k + 1], wa, wb);
        }
        cr_expect_gt(moved, N / 2, "the bias changed the choice of only %zu of %zu rows", moved, N);
    }
    td_free(logits); td_free(s); td_free(w); td_free(s0); td_free(w0); td_free(idx); td_free(idx0);
    EXPECT_NO_LEAKS();
}

Test(moe_sigmoid, ties_go_to_the_lower_index)
{
    /* equal logits: experts 0..k-1 and groups 0..topk_group-1 */
    const size_t E = 8, k = 3;
    float logits[8] = { 0 }, s[8], w[3];
    int32_t idx[3];
    const MoeSigmoidRouter r = { 4, 2, true, 1.0f };
    moe_router_sigmoid_forward(s, idx, w, logits, NULL, 1, E, k, &r);
    cr_expect(idx[0] == 0 && idx[1] == 1 && idx[2] == 2, "chose %d %d %d, want 0 1 2", idx[0], idx[1], idx[2]);
    logits[6] = logits[7] = 1.0f;   /* group 3 best, then group 0 by index */
    moe_router_sigmoid_forward(s, idx, w, logits, NULL, 1, E, k, &r);
    cr_expect(idx[0] == 6 && idx[1] == 7 && idx[2] == 0, "chose %d %d %d, want 6 7 0", idx[0], idx[1], idx[2]);
}

typedef struct { const double *dw; const int32_t *idx; size_t N, E, k; bool norm; double scale, alpha; } SigFd;

/* L(logits) = sum dw * w + alpha * bal, the choice fixed (float64) */
static double sigmoid_chain_loss(const double *x, void *vctx)
{
    const SigFd *c = vctx;
    double L = 0, cnt[64] = { 0 }, P[64] = { 0 };
    for (size_t i = 0; i < c->N * c->k; i++) cnt[c->idx[i]] += 1;
    for (size_t t = 0; t < c->N; t++) {
        double s[64], S = 0, Sk = 0;
        for (size_t e = 0; e < c->E; e++) s[e] = 1 / (1 + exp(-x[t * c->E + e])), S += s[e];
        for (size_t e = 0; e < c->E; e++) P[e] += s[e] / S / (double)c->N;
        for (size_t j = 0; j < c->k; j++) Sk += s[c->idx[t * c->k + j]];
        for (size_t j = 0; j < c->k; j++)
            L += c->dw[t * c->k + j] * c->scale * s[c->idx[t * c->k + j]] / (c->norm ? Sk + 1e-20 : 1.0);
    }
    double bal = 0;
    for (size_t e = 0; e < c->E; e++) bal += (double)c->E / ((double)c->k * (double)c->N) * cnt[e] * P[e];
    return L + c->alpha * bal;
}

Test(moe_sigmoid, backward_matches_finite_differences)
{
    static const size_t shapes[][5] = { { 5, 8, 2, 4, 2 }, { 7, 6, 3, 1, 1 }, { 4, 12, 4, 3, 2 } };  /* N E k G TG */
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
        for (int norm = 0; norm <= 1; norm++) {
            const size_t N = shapes[sh][0], E = shapes[sh][1], k = shapes[sh][2];
            const MoeSigmoidRouter r = { shapes[sh][3], shapes[sh][4], norm != 0, 2.5f };
            const float alpha = 0.3f;
            float *logits = fixture_rand(N * E, 90 + sh, -3, 3), *dw = fixture_rand(N * k, 91 + sh, -1, 1);
            float *bias = fixture_rand(E, 92 + sh, -0.2f, 0.2f);
            float *s = td_malloc(N * E * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
            int32_t *idx = td_malloc(N * k * sizeof(int32_t));
            moe_router_sigmoid_forward(s, idx, w, logits, bias, N, E, k, &r);
            double *xd = to_f64(logits, N * E), *dwd = to_f64(dw, N * k), *g = td_malloc(N * E * sizeof(double));
            SigFd ctx = { dwd, idx, N, E, k, norm != 0, 2.5, alpha };
            fixture_fd(g, sigmoid_chain_loss, &ctx, xd, N * E, 1e-6);
            float *ds = td_calloc(N * E * sizeof(float)), *dl = td_calloc(N * E * sizeof(float));
            float *want = td_malloc(N * E * sizeof(float));
            for (size_t i = 0; i < N * E; i++) want[i] = (float)g[i];
            moe_sigmoid_topk_backward(ds, dw, s, idx, N, E, k, &r);
            moe_seq_balance_backward(ds, alpha, s, idx, N, E, k);
            moe_sigmoid_backward(dl, ds, s, N, E);
            /* FD good to ~1e-9 (h = 1e-6, smooth); the float chain to 1e-6 */
            char what[80];
            snprintf(what, sizeof what, "dlogits vs FD, N=%zu E=%zu k=%zu G=%zu norm=%d", N, E, k, r.n_group, norm);
            EXPECT_CLOSE(dl, want, N * E, 1e-6, 1e-5, what);
            td_free(logits); td_free(dw); td_free(bias); td_free(s); td_free(w); td_free(idx);
            td_free(xd); td_free(dwd); td_free(g); td_free(ds); td_free(dl); td_free(want);
        }
    EXPECT_NO_LEAKS();
}

Test(moe_sigmoid, a_row_does_not_depend_on_the_batch_or_threads)
{
    /* each row routed alone, single-threaded, against the batch on 3
     * threads: the same bits (the serving and training guarantee) */
    const size_t N = 97, E = 16, k = 4;
    const MoeSigmoidRouter r = { 4, 2, true, 2.5f };
    float *logits = fixture_rand(N * E, 95, -3, 3), *bias = fixture_rand(E, 96, -0.1f, 0.1f);
    float *s = td_malloc(N * E * sizeof(float)), *w = td_malloc(N * k * sizeof(float));
    float *s1 = td_malloc(N * E * sizeof(float)), *w1 = td_malloc(N * k * sizeof(float));
    int32_t *idx = td_malloc(N * k * sizeof(int32_t)), *idx1 = td_malloc(N * k * sizeof(int32_t));
    for (size_t t = 0; t < N; t++)
        moe_router_sigmoid_forward(s1 + t * E, idx1 + t * k, w1 + t * k, logits + t * E, bias, 1, E, k, &r);
    pool_free();
    pool_init(3);
    moe_router_sigmoid_forward(s, idx, w, logits, bias, N, E, k, &r);
    EXPECT_BITWISE(s, s1, N * E, "scores");
    EXPECT_BITWISE(w, w1, N * k, "weights");
    cr_expect_eq(memcmp(idx, idx1, N * k * sizeof(int32_t)), 0, "choices differ");
    td_free(logits); td_free(bias); td_free(s); td_free(w); td_free(s1); td_free(w1); td_free(idx); td_free(idx1);
    EXPECT_NO_LEAKS();
}

/* tests/test_softmax.c - row softmax and the fused log-softmax +
 * cross-entropy (core/ops/softmax.h) against a naive double forward, PyTorch
 * (softmax.h5 from tests/ref/fixtures_ops.py: softmax, logsumexp,
 * cross_entropy and their autograd gradients) and central finite
 * differences; large shifts, V > 4096 (the chunked path), in-place use, and
 * 1 vs 2 threads bit for bit; and their exp, vexp_array, against vexp1 bit
 * for bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/softmax.h"
#include "core/ops/vexp.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(softmax, .init = setup, .fini = teardown);
TestSuite(xent, .init = setup, .fini = teardown);

static const char *const FX = "softmax.h5";

/* y = softmax(x) row-wise, lse = logsumexp, in double */
static void naive_softmax(double *y, double *lse, const double *x, size_t N, size_t n)
{
    for (size_t t = 0; t < N; t++) {
        const double *xr = x + t * n;
        double m = xr[0], s = 0;
        for (size_t j = 1; j < n; j++) m = xr[j] > m ? xr[j] : m;
        for (size_t j = 0; j < n; j++) s += exp(xr[j] - m);
        if (lse) lse[t] = m + log(s);
        if (y)
            for (size_t j = 0; j < n; j++) y[t * n + j] = exp(xr[j] - m) / s;
    }
}

static double *to_f64(const float *x, size_t n)
{
    double *y = td_malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

typedef struct {
    size_t N, n;
    float *x, *dy, *y, *lse, *dx, *dlogp, *logp, *dlogits_ce, *dlogits;
    int32_t *targets;
} SmCase;

static SmCase sm_load(int c)
{
    SmCase s;
    int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
    s.N = (size_t)dims[0];
    s.n = (size_t)dims[1];
    td_free(dims);
    s.x = fixture_case_f32(FX, c, "x", NULL);
    s.dy = fixture_case_f32(FX, c, "dy", NULL);
    s.y = fixture_case_f32(FX, c, "y", NULL);
    s.lse = fixture_case_f32(FX, c, "lse", NULL);
    s.dx = fixture_case_f32(FX, c, "dx", NULL);
    s.dlogp = fixture_case_f32(FX, c, "dlogp", NULL);
    s.logp = fixture_case_f32(FX, c, "logp", NULL);
    s.dlogits_ce = fixture_case_f32(FX, c, "dlogits_ce", NULL);
    s.dlogits = fixture_case_f32(FX, c, "dlogits", NULL);
    s.targets = fixture_case_i32(FX, c, "targets", NULL);
    return s;
}

static void sm_free(SmCase *s)
{
    td_free(s->x);
    td_free(s->dy);
    td_free(s->y);
    td_free(s->lse);
    td_free(s->dx);
    td_free(s->dlogp);
    td_free(s->logp);
    td_free(s->dlogits_ce);
    td_free(s->dlogits);
    td_free(s->targets);
}

/* ------------------------------------------------------------ softmax */

Test(softmax, forward_matches_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 3, "softmax.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        SmCase s = sm_load(c);
        float *y = td_malloc(s.N * s.n * sizeof(float)), *lse = td_malloc(s.N * sizeof(float));
        softmax_forward(y, lse, s.x, s.N, s.n);
        /* exp of O(1) arguments and one division: relative error of a few
         * ulp (2e-6 allowed); lse up to ~100 (case 1 adds 100 to every logit)
         * is good to a few ulp of its size: 1e-6 relative + 1e-6 absolute. */
        char what[48];
        snprintf(what, sizeof what, "y, case %d (N=%zu n=%zu)", c, s.N, s.n);
        EXPECT_CLOSE(y, s.y, s.N * s.n, 0, 2e-6, what);
        snprintf(what, sizeof what, "lse, case %d", c);
        EXPECT_CLOSE(lse, s.lse, s.N, 1e-6, 1e-6, what);
        td_free(y);
        td_free(lse);
        sm_free(&s);
    }
    EXPECT_NO_LEAKS();
}

Test(softmax, backward_accumulates_torch_gradients)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        SmCase s = sm_load(c);
        const size_t n = s.N * s.n;
        float *y = td_malloc(n * sizeof(float));
        softmax_forward(y, NULL, s.x, s.N, s.n);
        float *dx = fixture_rand(n, 10 + (uint64_t)c, -1, 1);   /* non-zero: += */
        float *want = td_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) want[i] = (float)((double)dx[i] + s.dx[i]);
        softmax_backward(dx, s.dy, y, s.N, s.n);
        /* y (dy - dy.y): O(1) terms, float dot of n <= 5000 terms: 1e-6
         * absolute on top of the O(1) start value. */
        char what[48];
        snprintf(what, sizeof what, "dx, case %d (N=%zu n=%zu)", c, s.N, s.n);
        EXPECT_CLOSE(dx, want, n, 1e-6, 1e-6, what);
        td_free(y);
        td_free(dx);
        td_free(want);
        sm_free(&s);
    }
    EXPECT_NO_LEAKS();
}

Test(softmax, forward_matches_naive_double_and_is_shift_stable)
{
    static const size_t shapes[][2] = { { 1, 1 }, { 3, 7 }, { 5, 33 }, { 2, 4099 } };
    static const float shifts[] = { 0.0f, 80.0f, -200.0f };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t k = 0; k < sizeof shifts / sizeof *shifts; k++) {
            const size_t N = shapes[s][0], n = shapes[s][1];
            float *x = fixture_rand(N * n, 20 + s, -5, 5);
            for (size_t i = 0; i < N * n; i++) x[i] += shifts[k];   /* exp(x) alone would overflow at +80 */
            double *xd = to_f64(x, N * n), *yd = td_malloc(N * n * sizeof(double)), *ld = td_malloc(N * sizeof(double));
            naive_softmax(yd, ld, xd, N, n);
            float *y_want = td_malloc(N * n * sizeof(float)), *l_want = td_malloc(N * sizeof(float));
            for (size_t i = 0; i < N * n; i++) y_want[i] = (float)yd[i];
            for (size_t i = 0; i < N; i++) l_want[i] = (float)ld[i];
            float *y = td_malloc(N * n * sizeof(float)), *lse = td_malloc(N * sizeof(float));
            softmax_forward(y, lse, x, N, n);
            /* a few ulp relative (see forward_matches_torch); lse: 1e-6 of
             * |lse| <= ~210 plus 1e-6 (log of a sum of up to 4099 terms). */
            char what[64];
            snprintf(what, sizeof what, "y, N=%zu n=%zu shift=%g", N, n, (double)shifts[k]);
            EXPECT_CLOSE(y, y_want, N * n, 0, 2e-6, what);
            snprintf(what, sizeof what, "lse, N=%zu n=%zu shift=%g", N, n, (double)shifts[k]);
            EXPECT_CLOSE(lse, l_want, N, 1e-6, 1e-6, what);
            /* in place: y aliases x, same bits */
            softmax_forward(x, NULL, x, N, n);
            EXPECT_BITWISE(x, y, N * n, "in place (y = x)");
            td_free(x);
            td_free(xd);
            td_free(yd);
            td_free(ld);
            td_free(y_want);
            td_free(l_want);
            td_free(y);
            td_free(lse);
        }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; size_t N, n; } SmFd;

static double sm_loss(const double *x, void *vctx)
{
    const SmFd *c = vctx;
    double *y = td_malloc(c->N * c->n * sizeof(double));
    naive_softmax(y, NULL, x, c->N, c->n);
    double L = 0;
    for (size_t i = 0; i < c->N * c->n; i++) L += c->dy[i] * y[i];
    td_free(y);
    return L;
}

Test(softmax, backward_matches_finite_differences)
{
    static const size_t shapes[][2] = { { 1, 1 }, { 1, 2 }, { 3, 7 }, { 4, 33 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], n = shapes[s][1], m = N * n;
        float *x = fixture_rand(m, 30 + s, -4, 4), *dy = fixture_rand(m, 31 + s, -1, 1);
        float *dx = fixture_rand(m, 32 + s, -1, 1), *y = td_malloc(m * sizeof(float));
        double *p = to_f64(x, m), *g = td_malloc(m * sizeof(double)), *dyd = to_f64(dy, m);
        SmFd ctx = { dyd, N, n };
        fixture_fd(g, sm_loss, &ctx, p, m, 1e-6);
        float *want = td_malloc(m * sizeof(float));
        for (size_t i = 0; i < m; i++) want[i] = (float)(dx[i] + g[i]);
        softmax_forward(y, NULL, x, N, n);
        softmax_backward(dx, dy, y, N, n);
        /* FD (h = 1e-6, smooth, O(1) derivatives) is good to 1e-8; float
         * backward a few ulp of O(1). */
        char what[48];
        snprintf(what, sizeof what, "dx vs FD, N=%zu n=%zu", N, n);
        EXPECT_CLOSE(dx, want, m, 1e-6, 1e-6, what);
        td_free(x);
        td_free(dy);
        td_free(dx);
        td_free(y);
        td_free(p);
        td_free(g);
        td_free(dyd);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ log-softmax + cross-entropy */

Test(xent, forward_matches_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        SmCase s = sm_load(c);
        float *logp = td_malloc(s.N * sizeof(float)), *lse = td_malloc(s.N * sizeof(float));
        float *ce = fixture_case_f32(FX, c, "ce", NULL);
        logsoftmax_xent_forward(logp, lse, s.x, s.targets, s.N, s.n);
        /* logp = x_target - lse: the difference of two values up to ~100
         * (case 1) or ~35 (case 2), each good to ~1 ulp: 2e-5 absolute for
         * the shifted cases is ~2 ulp of 100; relative 1e-6. */
        char what[48];
        snprintf(what, sizeof what, "logp, case %d (N=%zu V=%zu)", c, s.N, s.n);
        EXPECT_CLOSE(logp, s.logp, s.N, 2e-5, 1e-6, what);
        snprintf(what, sizeof what, "lse, case %d", c);
        EXPECT_CLOSE(lse, s.lse, s.N, 1e-6, 1e-6, what);
        double loss = 0;
        for (size_t t = 0; t < s.N; t++) loss -= logp[t];
        float lossf = (float)(loss / (double)s.N);
        snprintf(what, sizeof what, "mean cross-entropy, case %d", c);
        EXPECT_CLOSE(&lossf, ce, 1, 2e-5, 1e-6, what);
        td_free(logp);
        td_free(lse);
        td_free(ce);
        sm_free(&s);
    }
    EXPECT_NO_LEAKS();
}

Test(xent, backward_with_minus_one_over_n_is_torch_cross_entropy_gradient)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        SmCase s = sm_load(c);
        const size_t m = s.N * s.n;
        float *logp = td_malloc(s.N * sizeof(float)), *lse = td_malloc(s.N * sizeof(float));
        logsoftmax_xent_forward(logp, lse, s.x, s.targets, s.N, s.n);
        float *dlogp = td_malloc(s.N * sizeof(float));
        for (size_t t = 0; t < s.N; t++) dlogp[t] = -1.0f / (float)s.N;
        float *dl = fixture_rand(m, 40 + (uint64_t)c, -1, 1);   /* non-zero: += */
        float *want = td_malloc(m * sizeof(float));
        for (size_t i = 0; i < m; i++) want[i] = (float)((double)dl[i] + s.dlogits_ce[i]);
        logsoftmax_xent_backward(dl, dlogp, s.x, lse, s.targets, s.N, s.n);
        /* (softmax - onehot) / N: exp(x - lse) good to ~|x - lse| ulp (up to
         * ~40 ulp of the probability for the wide rows), scaled by 1/N, on
         * top of the O(1) start value: 1e-6 absolute. */
        char what[64];
        snprintf(what, sizeof what, "dlogits (mean CE), case %d", c);
        EXPECT_CLOSE(dl, want, m, 1e-6, 1e-6, what);
        /* and against the per-token gradient for an arbitrary dlogp */
        float *dl2 = fixture_rand(m, 50 + (uint64_t)c, -1, 1);
        for (size_t i = 0; i < m; i++) want[i] = (float)((double)dl2[i] + s.dlogits[i]);
        logsoftmax_xent_backward(dl2, s.dlogp, s.x, lse, s.targets, s.N, s.n);
        snprintf(what, sizeof what, "dlogits (random dlogp), case %d", c);
        EXPECT_CLOSE(dl2, want, m, 1e-6, 1e-6, what);
        td_free(logp);
        td_free(lse);
        td_free(dlogp);
        td_free(dl);
        td_free(dl2);
        td_free(want);
        sm_free(&s);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dlogp; const int32_t *tg; size_t N, V; } XeFd;

/* L = sum_t dlogp_t (x[t, target_t] - logsumexp(x_t)) */
static double xent_loss(const double *x, void *vctx)
{
    const XeFd *c = vctx;
    double *lse = td_malloc(c->N * sizeof(double));
    naive_softmax(NULL, lse, x, c->N, c->V);
    double L = 0;
    for (size_t t = 0; t < c->N; t++) L += c->dlogp[t] * (x[t * c->V + (size_t)c->tg[t]] - lse[t]);
    td_free(lse);
    return L;
}

Test(xent, forward_and_backward_match_double_and_finite_differences)
{
    /* V = 4099 and 5000 exercise the chunked path (V > 4096) */
    static const size_t shapes[][2] = { { 1, 1 }, { 3, 7 }, { 5, 33 }, { 2, 4099 }, { 1, 5000 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], V = shapes[s][1], m = N * V;
        float *x = fixture_rand(m, 60 + s, -6, 6), *dlogp = fixture_rand(N, 61 + s, -1, 1);
        if (N > 1) dlogp[0] = 0.0f;   /* a masked token: adds nothing */
        int32_t *tg = td_malloc(N * sizeof(int32_t));
        for (size_t t = 0; t < N; t++) tg[t] = (int32_t)((t * 31 + 5) % V);
        double *xd = to_f64(x, m), *lsed = td_malloc(N * sizeof(double));
        naive_softmax(NULL, lsed, xd, N, V);
        float *lp_want = td_malloc(N * sizeof(float)), *lse_want = td_malloc(N * sizeof(float));
        for (size_t t = 0; t < N; t++) {
            lp_want[t] = (float)(xd[t * V + (size_t)tg[t]] - lsed[t]);
            lse_want[t] = (float)lsed[t];
        }
        float *logp = td_malloc(N * sizeof(float)), *lse = td_malloc(N * sizeof(float));
        logsoftmax_xent_forward(logp, lse, x, tg, N, V);
        /* logp, lse of size <= ~15: 1e-6 relative + 2e-6 absolute (a few
         * ulp after summing up to 5000 exponentials) */
        char what[64];
        snprintf(what, sizeof what, "logp, N=%zu V=%zu", N, V);
        EXPECT_CLOSE(logp, lp_want, N, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "lse, N=%zu V=%zu", N, V);
        EXPECT_CLOSE(lse, lse_want, N, 2e-6, 1e-6, what);

        float *dl = fixture_rand(m, 62 + s, -1, 1), *want = td_malloc(m * sizeof(float));
        double *g = td_malloc(m * sizeof(double)), *dlp = to_f64(dlogp, N);
        XeFd ctx = { dlp, tg, N, V };
        if (m <= 200) {
            fixture_fd(g, xent_loss, &ctx, xd, m, 1e-6);
        } else {
            /* too many logits for FD over all of them: the analytic
             * gradient in double, dlogp (onehot - softmax) */
            for (size_t t = 0; t < N; t++)
                for (size_t j = 0; j < V; j++)
                    g[t * V + j] = dlp[t] * (((size_t)tg[t] == j) - exp(xd[t * V + j] - lsed[t]));
        }
        for (size_t i = 0; i < m; i++) want[i] = (float)(dl[i] + g[i]);
        logsoftmax_xent_backward(dl, dlogp, x, lse, tg, N, V);
        /* FD good to 1e-8; float: exp(x - lse) a few ulp of a probability,
         * on top of the O(1) start value. */
        snprintf(what, sizeof what, "dlogits vs FD/double, N=%zu V=%zu", N, V);
        EXPECT_CLOSE(dl, want, m, 1e-6, 1e-6, what);
        td_free(x);
        td_free(dlogp);
        td_free(tg);
        td_free(xd);
        td_free(lsed);
        td_free(lp_want);
        td_free(lse_want);
        td_free(logp);
        td_free(lse);
        td_free(dl);
        td_free(want);
        td_free(g);
        td_free(dlp);
    }
    EXPECT_NO_LEAKS();
}

Test(softmax, two_threads_bit_identical)
{
    const size_t N = 40, n = 37, V = 5000, Nx = 20;   /* rows split (grain 16 / 8) */
    float *x = fixture_rand(N * n, 70, -5, 5), *dy = fixture_rand(N * n, 71, -1, 1);
    float *lg = fixture_rand(Nx * V, 72, -6, 6), *dlogp = fixture_rand(Nx, 73, -1, 1);
    int32_t tg[20];
    for (size_t t = 0; t < Nx; t++) tg[t] = (int32_t)(t * 241 % V);
    float *y[2], *lse[2], *dx[2], *lp[2], *lse2[2], *dl[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        y[t] = td_malloc(N * n * sizeof(float));
        lse[t] = td_malloc(N * sizeof(float));
        dx[t] = fixture_rand(N * n, 74, -1, 1);
        lp[t] = td_malloc(Nx * sizeof(float));
        lse2[t] = td_malloc(Nx * sizeof(float));
        dl[t] = fixture_rand(Nx * V, 75, -1, 1);
        softmax_forward(y[t], lse[t], x, N, n);
        softmax_backward(dx[t], dy, y[t], N, n);
        logsoftmax_xent_forward(lp[t], lse2[t], lg, tg, Nx, V);
        logsoftmax_xent_backward(dl[t], dlogp, lg, lse2[t], tg, Nx, V);
    }
    pool_init(1);
    EXPECT_BITWISE(y[1], y[0], N * n, "softmax y, 2 threads vs 1");
    EXPECT_BITWISE(lse[1], lse[0], N, "softmax lse, 2 threads vs 1");
    EXPECT_BITWISE(dx[1], dx[0], N * n, "softmax dx, 2 threads vs 1");
    EXPECT_BITWISE(lp[1], lp[0], Nx, "logp, 2 threads vs 1");
    EXPECT_BITWISE(lse2[1], lse2[0], Nx, "xent lse, 2 threads vs 1");
    EXPECT_BITWISE(dl[1], dl[0], Nx * V, "dlogits, 2 threads vs 1");
    for (int t = 0; t < 2; t++) {
        td_free(y[t]);
        td_free(lse[t]);
        td_free(dx[t]);
        td_free(lp[t]);
        td_free(lse2[t]);
        td_free(dl[t]);
    }
    td_free(x);
    td_free(dy);
    td_free(lg);
    td_free(dlogp);
    EXPECT_NO_LEAKS();
}

/* vexp_array (core/ops/vexp.h), the exp of softmax, log-softmax and SiLU: the
 * vector path over whole vectors and vexp1 over the tail give every element
 * the bits of vexp1, for every length (tails of 0..15 past 8- and 16-lane
 * vectors), in place too; edge inputs included. */
Test(softmax, vexp_array_gives_vexp1_bits_for_every_length)
{
    static const float edge[] = { 0.0f, -0.0f, 1.0f, -1.0f, -104.0f, 89.0f, -104.5f, 89.5f, 88.7f, -87.3f,
                                  -100.0f, 1e-30f, -1e-30f, INFINITY, -INFINITY, NAN };
    const size_t nmax = 300;
    float *x = fixture_rand(nmax, 77, -110, 95), *y = td_malloc(nmax * sizeof(float));
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) x[3 + 7 * i] = edge[i];
    size_t bad = 0;
    for (size_t n = 0; n <= nmax; n += n < 40 ? 1 : 37) {
        for (size_t i = 0; i < nmax; i++) y[i] = -7.0f;
        vexp_array(y, x, n);
        for (size_t i = 0; i < n; i++) {
            const float want = vexp1(x[i]);
            if (memcmp(&want, &y[i], sizeof want)) {
                if (!bad) cr_expect(0, "n=%zu: exp(%a) = %a, vexp1 gives %a", n, (double)x[i], (double)y[i], (double)want);
                bad++;
            }
        }
        cr_expect(n == nmax || y[n] == -7.0f, "n=%zu: wrote past the end", n);
    }
    cr_expect_eq(bad, 0, "%zu elements differ from vexp1", bad);
    float *z = fixture_copy(x, nmax);
    vexp_array(z, z, nmax);   /* in place */
    for (size_t i = 0; i < nmax; i++) {
        const float want = vexp1(x[i]);
        cr_expect(memcmp(&want, &z[i], sizeof want) == 0, "in place, element %zu", i);
    }
    td_free(x);
    td_free(y);
    td_free(z);
    EXPECT_NO_LEAKS();
}

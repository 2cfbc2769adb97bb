/* tests/test_rmsnorm.c - RMSNorm (core/ops/rmsnorm.h) against a naive double
 * forward, PyTorch (rmsnorm.h5 from tests/ref/fixtures_ops.py) and central
 * finite differences of the double forward; in-place use and 1 vs 2 threads
 * bit for bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/rmsnorm.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(rmsnorm, .init = setup, .fini = teardown);

static const char *const FX = "rmsnorm.h5";

/* y = x / sqrt(mean(x^2) + eps) * w in double; rstd may be NULL. */
static void naive_rmsnorm(double *y, double *rstd, const double *x, const double *w,
                          size_t N, size_t d, double eps)
{
    for (size_t t = 0; t < N; t++) {
        double ss = 0;
        for (size_t i = 0; i < d; i++) ss += x[t * d + i] * x[t * d + i];
        double r = 1.0 / sqrt(ss / (double)d + eps);
        if (rstd) rstd[t] = r;
        for (size_t i = 0; i < d; i++) y[t * d + i] = x[t * d + i] * r * w[i];
    }
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

Test(rmsnorm, forward_matches_naive_double)
{
    static const size_t shapes[][2] = { { 1, 1 }, { 3, 17 }, { 13, 333 }, { 2, 16 }, { 5, 64 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], d = shapes[s][1];
        const float eps = 1e-5f;
        float *x = fixture_rand(N * d, 10 + s, -3, 3), *w = fixture_rand(d, 20 + s, -2, 2);
        float *y = td_malloc(N * d * sizeof(float)), *rstd = td_malloc(N * sizeof(float));
        double *xd = to_f64(x, N * d), *wd = to_f64(w, d);
        double *yd = td_malloc(N * d * sizeof(double)), *rd = td_malloc(N * sizeof(double));
        naive_rmsnorm(yd, rd, xd, wd, N, d, eps);
        float *y_want = to_f32(yd, N * d), *r_want = to_f32(rd, N);
        rmsnorm_forward(y, rstd, x, w, N, d, eps);
        /* float: the sum of squares (d <= 333 terms) and the rsqrt are good to
         * a few ulp, each y a product of three floats: relative error below
         * 1e-6; 4e-6 relative (+1e-7 absolute for y near 0). */
        char what[64];
        snprintf(what, sizeof what, "y, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(y, y_want, N * d, 1e-7, 4e-6, what);
        snprintf(what, sizeof what, "rstd, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(rstd, r_want, N, 0, 4e-6, what);
        td_free(x);
        td_free(w);
        td_free(y);
        td_free(rstd);
        td_free(xd);
        td_free(wd);
        td_free(yd);
        td_free(rd);
        td_free(y_want);
        td_free(r_want);
    }
    EXPECT_NO_LEAKS();
}

Test(rmsnorm, forward_matches_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 4, "rmsnorm.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], d = (size_t)dims[1];
        float *eps = fixture_case_f32(FX, c, "eps", NULL);
        float *x = fixture_case_f32(FX, c, "x", NULL), *w = fixture_case_f32(FX, c, "w", NULL);
        float *y_ref = fixture_case_f32(FX, c, "y", NULL), *r_ref = fixture_case_f32(FX, c, "rstd", NULL);
        float *y = td_malloc(N * d * sizeof(float)), *rstd = td_malloc(N * sizeof(float));
        rmsnorm_forward(y, rstd, x, w, N, d, eps[0]);
        /* float vs float64 reference: a few ulp, see forward_matches_naive_double */
        char what[48];
        snprintf(what, sizeof what, "y, case %d (N=%zu d=%zu)", c, N, d);
        EXPECT_CLOSE(y, y_ref, N * d, 1e-7, 4e-6, what);
        snprintf(what, sizeof what, "rstd, case %d", c);
        EXPECT_CLOSE(rstd, r_ref, N, 0, 4e-6, what);
        td_free(dims);
        td_free(eps);
        td_free(x);
        td_free(w);
        td_free(y_ref);
        td_free(r_ref);
        td_free(y);
        td_free(rstd);
    }
    EXPECT_NO_LEAKS();
}

Test(rmsnorm, backward_accumulates_torch_gradients)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], d = (size_t)dims[1];
        float *eps = fixture_case_f32(FX, c, "eps", NULL);
        float *x = fixture_case_f32(FX, c, "x", NULL), *w = fixture_case_f32(FX, c, "w", NULL);
        float *dy = fixture_case_f32(FX, c, "dy", NULL);
        float *dx_ref = fixture_case_f32(FX, c, "dx", NULL), *dw_ref = fixture_case_f32(FX, c, "dw", NULL);
        float *y = td_malloc(N * d * sizeof(float)), *rstd = td_malloc(N * sizeof(float));
        rmsnorm_forward(y, rstd, x, w, N, d, eps[0]);
        /* gradients start non-zero: the op must add */
        float *dx = fixture_rand(N * d, 30 + (uint64_t)c, -1, 1), *dw = fixture_rand(d, 40 + (uint64_t)c, -1, 1);
        float *dx_want = td_malloc(N * d * sizeof(float)), *dw_want = td_malloc(d * sizeof(float));
        for (size_t i = 0; i < N * d; i++) dx_want[i] = (float)((double)dx[i] + dx_ref[i]);
        for (size_t i = 0; i < d; i++) dw_want[i] = (float)((double)dw[i] + dw_ref[i]);
        rmsnorm_backward(dx, dw, dy, x, w, rstd, N, d);
        /* dx = r dy w - r^3 x (dy w . x) / d: two O(1) terms that partly
         * cancel, each good to a few ulp, plus the O(1) start value: 1e-6
         * absolute; dw sums N <= 7 float products. */
        char what[48];
        snprintf(what, sizeof what, "dx, case %d (N=%zu d=%zu)", c, N, d);
        EXPECT_CLOSE(dx, dx_want, N * d, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "dw, case %d", c);
        EXPECT_CLOSE(dw, dw_want, d, 1e-6, 1e-6, what);
        td_free(dims);
        td_free(eps);
        td_free(x);
        td_free(w);
        td_free(dy);
        td_free(dx_ref);
        td_free(dw_ref);
        td_free(y);
        td_free(rstd);
        td_free(dx);
        td_free(dw);
        td_free(dx_want);
        td_free(dw_want);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; size_t N, d; double eps; } RmsFd;

/* L(x, w) = sum dy * rmsnorm(x, w); p = [x (N*d), w (d)] */
static double rms_loss(const double *p, void *vctx)
{
    const RmsFd *c = vctx;
    double *y = td_malloc(c->N * c->d * sizeof(double));
    naive_rmsnorm(y, NULL, p, p + c->N * c->d, c->N, c->d, c->eps);
    double L = 0;
    for (size_t i = 0; i < c->N * c->d; i++) L += c->dy[i] * y[i];
    td_free(y);
    return L;
}

Test(rmsnorm, backward_matches_finite_differences)
{
    static const size_t shapes[][2] = { { 3, 1 }, { 7, 33 }, { 5, 64 }, { 2, 100 }, { 1, 17 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], d = shapes[s][1], np = N * d + d;
        const float eps = 1e-6f;
        float *x = fixture_rand(N * d, 50 + s, -2, 2), *w = fixture_rand(d, 60 + s, 0.5f, 1.5f);
        float *dy = fixture_rand(N * d, 70 + s, -1, 1);
        float *dx = fixture_rand(N * d, 80 + s, -1, 1), *dw = fixture_rand(d, 90 + s, -1, 1);
        double *p = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        for (size_t i = 0; i < N * d; i++) p[i] = x[i];
        for (size_t i = 0; i < d; i++) p[N * d + i] = w[i];
        double *dyd = to_f64(dy, N * d);
        RmsFd ctx = { dyd, N, d, eps };
        fixture_fd(g, rms_loss, &ctx, p, np, 1e-6);
        float *want = td_malloc(np * sizeof(float));
        for (size_t i = 0; i < N * d; i++) want[i] = (float)(dx[i] + g[i]);
        for (size_t i = 0; i < d; i++) want[N * d + i] = (float)(dw[i] + g[N * d + i]);
        float *y = td_malloc(N * d * sizeof(float)), *rstd = td_malloc(N * sizeof(float));
        rmsnorm_forward(y, rstd, x, w, N, d, eps);
        rmsnorm_backward(dx, dw, dy, x, w, rstd, N, d);
        /* Central differences with h = 1e-6 on a smooth O(1) function:
         * truncation ~h^2 and rounding ~1e-16/h, both < 1e-9.  The float
         * backward is good to ~1e-7 (see backward_accumulates_torch_gradients);
         * d = 1 is the degenerate case where dx is ~0 (x/|x| is constant). */
        char what[48];
        snprintf(what, sizeof what, "dx vs FD, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(dx, want, N * d, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "dw vs FD, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(dw, want + N * d, d, 2e-6, 1e-6, what);
        td_free(x);
        td_free(w);
        td_free(dy);
        td_free(dx);
        td_free(dw);
        td_free(p);
        td_free(g);
        td_free(dyd);
        td_free(want);
        td_free(y);
        td_free(rstd);
    }
    EXPECT_NO_LEAKS();
}

Test(rmsnorm, in_place_and_null_rstd_give_the_same_bits)
{
    const size_t N = 9, d = 70;
    float *x = fixture_rand(N * d, 100, -2, 2), *w = fixture_rand(d, 101, -1, 1);
    float *y = td_malloc(N * d * sizeof(float)), *rstd = td_malloc(N * sizeof(float));
    float *xin = fixture_copy(x, N * d), *y2 = td_malloc(N * d * sizeof(float));
    rmsnorm_forward(y, rstd, x, w, N, d, 1e-5f);
    rmsnorm_forward(xin, NULL, xin, w, N, d, 1e-5f);   /* y aliases x, no rstd */
    rmsnorm_forward(y2, NULL, x, w, N, d, 1e-5f);
    EXPECT_BITWISE(xin, y, N * d, "in place (y = x)");
    EXPECT_BITWISE(y2, y, N * d, "rstd = NULL");
    td_free(x);
    td_free(w);
    td_free(y);
    td_free(rstd);
    td_free(xin);
    td_free(y2);
    EXPECT_NO_LEAKS();
}

Test(rmsnorm, two_threads_bit_identical)
{
    /* N = 37 rows (grain 8) and d = 70 columns (grain 16) both split */
    const size_t N = 37, d = 70;
    float *x = fixture_rand(N * d, 110, -2, 2), *w = fixture_rand(d, 111, -1, 1);
    float *dy = fixture_rand(N * d, 112, -1, 1);
    float *y[2], *rstd[2], *dx[2], *dw[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        y[t] = td_malloc(N * d * sizeof(float));
        rstd[t] = td_malloc(N * sizeof(float));
        dx[t] = fixture_rand(N * d, 113, -1, 1);
        dw[t] = fixture_rand(d, 114, -1, 1);
        rmsnorm_forward(y[t], rstd[t], x, w, N, d, 1e-5f);
        rmsnorm_backward(dx[t], dw[t], dy, x, w, rstd[t], N, d);
    }
    pool_init(1);
    EXPECT_BITWISE(y[1], y[0], N * d, "y, 2 threads vs 1");
    EXPECT_BITWISE(rstd[1], rstd[0], N, "rstd, 2 threads vs 1");
    EXPECT_BITWISE(dx[1], dx[0], N * d, "dx, 2 threads vs 1");
    EXPECT_BITWISE(dw[1], dw[0], d, "dw, 2 threads vs 1");
    for (int t = 0; t < 2; t++) {
        td_free(y[t]);
        td_free(rstd[t]);
        td_free(dx[t]);
        td_free(dw[t]);
    }
    td_free(x);
    td_free(w);
    td_free(dy);
    EXPECT_NO_LEAKS();
}

/* ---------------------------------------------------------------- q/k norm
 * Per head (Qwen3-MoE): rmsnorm over (N*H, hd) rows of x (N, H*hd) with one
 * weight [hd].  Over the whole width (OLMoE): the split form, with the
 * columns in P contiguous parts (one per tensor-parallel rank: H % P == 0)
 * whose sums of squares and backward dots are added, as the model's
 * all-reduce does. */

/* Column block p of P of x (N, W) into a contiguous (N, W/P) copy. */
static float *cols(const float *x, size_t N, size_t W, size_t p, size_t P)
{
    const size_t w = W / P;
    float *o = td_malloc(N * w * sizeof(float));
    for (size_t t = 0; t < N; t++) memcpy(o + t * w, x + t * W + p * w, w * sizeof(float));
    return o;
}

static void put_cols(float *x, const float *part, size_t N, size_t W, size_t p, size_t P)
{
    const size_t w = W / P;
    for (size_t t = 0; t < N; t++) memcpy(x + t * W + p * w, part + t * w, w * sizeof(float));
}

/* Full-width q/k norm of x (N, W) over P parts: y (N, W), then adds into dx,
 * dw (W) the backward of dy. */
static void full_norm_parts(float *y, float *dx, float *dw, const float *x, const float *w, const float *dy,
                            size_t N, size_t W, size_t P, float eps)
{
    const size_t wp = W / P;
    float *ss = td_calloc(N * sizeof(float)), *s = td_calloc(N * sizeof(float)), *tmp = td_malloc(N * sizeof(float));
    float *xp[8], *dyp[8], *rstd = td_malloc(N * sizeof(float));
    for (size_t p = 0; p < P; p++) {   /* each part's sums, then the "all-reduce" */
        xp[p] = cols(x, N, W, p, P);
        dyp[p] = cols(dy, N, W, p, P);
        rmsnorm_sumsq(tmp, xp[p], N, wp);
        for (size_t t = 0; t < N; t++) ss[t] += tmp[t];
    }
    for (size_t p = 0; p < P; p++) {
        float *yp = td_malloc(N * wp * sizeof(float));
        rmsnorm_scale_forward(yp, rstd, xp[p], ss, w + p * wp, N, wp, W, eps);
        put_cols(y, yp, N, W, p, P);
        rmsnorm_dot(tmp, dyp[p], xp[p], w + p * wp, N, wp);
        for (size_t t = 0; t < N; t++) s[t] += tmp[t];
        td_free(yp);
    }
    for (size_t p = 0; p < P; p++) {
        float *dxp = cols(dx, N, W, p, P);
        rmsnorm_scale_backward(dxp, dw + p * wp, dyp[p], xp[p], w + p * wp, rstd, s, N, wp, W);
        put_cols(dx, dxp, N, W, p, P);
        td_free(dxp);
        td_free(xp[p]);
        td_free(dyp[p]);
    }
    td_free(ss);
    td_free(s);
    td_free(tmp);
    td_free(rstd);
}

Test(rmsnorm, qk_norm_matches_torch_per_head_and_full_width_over_1_and_2_parts)
{
    const char *fx = "qk_norm.h5";
    int n_cases = (int)fixture_attr(fx, "n_cases");
    cr_expect_geq(n_cases, 4, "qk_norm.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(fx, c, "dims", NULL);
        const size_t N = (size_t)dims[0], H = (size_t)dims[1], hd = (size_t)dims[2], W = H * hd;
        const int full = dims[3];
        const size_t nw = full ? W : hd;
        float *eps = fixture_case_f32(fx, c, "eps", NULL), *x = fixture_case_f32(fx, c, "x", NULL);
        float *w = fixture_case_f32(fx, c, "w", NULL), *dy = fixture_case_f32(fx, c, "dy", NULL);
        float *y_ref = fixture_case_f32(fx, c, "y", NULL), *dx_ref = fixture_case_f32(fx, c, "dx", NULL);
        float *dw_ref = fixture_case_f32(fx, c, "dw", NULL);
        for (size_t P = 1; P <= (full ? 2 : 1); P++) {
            float *y = td_malloc(N * W * sizeof(float)), *dx = td_calloc(N * W * sizeof(float));
            float *dw = td_calloc(nw * sizeof(float));
            if (full) {
                full_norm_parts(y, dx, dw, x, w, dy, N, W, P, eps[0]);
            } else {
                float *rstd = td_malloc(N * H * sizeof(float));
                rmsnorm_forward(y, rstd, x, w, N * H, hd, eps[0]);
                rmsnorm_backward(dx, dw, dy, x, w, rstd, N * H, hd);
                td_free(rstd);
            }
            /* as the whole-row tests: a few ulp forward; dx two partly
             * cancelling O(1) terms; dw sums N*H (<= 27) products of |.| < 3 */
            char what[64];
            snprintf(what, sizeof what, "y, case %d (%s, %zu parts)", c, full ? "full" : "head", P);
            EXPECT_CLOSE(y, y_ref, N * W, 1e-7, 4e-6, what);
            snprintf(what, sizeof what, "dx, case %d (%zu parts)", c, P);
            EXPECT_CLOSE(dx, dx_ref, N * W, 1e-6, 1e-6, what);
            snprintf(what, sizeof what, "dw, case %d (%zu parts)", c, P);
            EXPECT_CLOSE(dw, dw_ref, nw, 4e-6, 1e-6, what);
            td_free(y);
            td_free(dx);
            td_free(dw);
        }
        td_free(dims);
        td_free(eps);
        td_free(x);
        td_free(w);
        td_free(dy);
        td_free(y_ref);
        td_free(dx_ref);
        td_free(dw_ref);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; size_t N, H, hd; int full; double eps; } QkFd;

/* p = [x (N, H*hd), w];  L = sum dy * qk_norm(x, w) */
static double qk_loss(const double *p, void *vc)
{
    const QkFd *c = vc;
    const size_t W = c->H * c->hd, rows = c->full ? c->N : c->N * c->H, wd = c->full ? W : c->hd;
    double *y = td_malloc(c->N * W * sizeof(double));
    naive_rmsnorm(y, NULL, p, p + c->N * W, rows, wd, c->eps);
    double L = 0;
    for (size_t i = 0; i < c->N * W; i++) L += c->dy[i] * y[i];
    td_free(y);
    return L;
}

Test(rmsnorm, qk_norm_backward_matches_finite_differences)
{
    const size_t N = 4, H = 4, hd = 6, W = H * hd;
    for (int full = 0; full <= 1; full++) {
        const size_t nw = full ? W : hd, np = N * W + nw;
        const float eps = 1e-6f;
        float *x = fixture_rand(N * W, 120 + (uint64_t)full, -2, 2), *w = fixture_rand(nw, 122, 0.5f, 1.5f);
        float *dy = fixture_rand(N * W, 124, -1, 1);
        double *p = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        for (size_t i = 0; i < N * W; i++) p[i] = x[i];
        for (size_t i = 0; i < nw; i++) p[N * W + i] = w[i];
        double *dyd = to_f64(dy, N * W);
        QkFd ctx = { dyd, N, H, hd, full, eps };
        fixture_fd(g, qk_loss, &ctx, p, np, 1e-6);
        float *want = to_f32(g, np);
        float *y = td_malloc(N * W * sizeof(float)), *dx = td_calloc(N * W * sizeof(float));
        float *dw = td_calloc(nw * sizeof(float));
        if (full) {
            full_norm_parts(y, dx, dw, x, w, dy, N, W, 2, eps);   /* two "ranks" */
        } else {
            float *rstd = td_malloc(N * H * sizeof(float));
            rmsnorm_forward(y, rstd, x, w, N * H, hd, eps);
            rmsnorm_backward(dx, dw, dy, x, w, rstd, N * H, hd);
            td_free(rstd);
        }
        /* see backward_matches_finite_differences */
        char what[48];
        snprintf(what, sizeof what, "dx vs FD (%s)", full ? "full, 2 parts" : "per head");
        EXPECT_CLOSE(dx, want, N * W, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "dw vs FD (%s)", full ? "full, 2 parts" : "per head");
        EXPECT_CLOSE(dw, want + N * W, nw, 2e-6, 1e-6, what);
        td_free(x);
        td_free(w);
        td_free(dy);
        td_free(p);
        td_free(g);
        td_free(dyd);
        td_free(want);
        td_free(y);
        td_free(dx);
        td_free(dw);
    }
    EXPECT_NO_LEAKS();
}

/* One part (d = D): the split form is the whole-row op, bit for bit, and
 * rmsnorm_apply from the saved rstd rebuilds the forward's y exactly (the
 * clamp's backward relies on it). */
Test(rmsnorm, split_form_of_one_part_and_apply_give_the_whole_row_bits)
{
    const size_t N = 13, d = 70;
    float *x = fixture_rand(N * d, 130, -2, 2), *w = fixture_rand(d, 131, -1, 1), *dy = fixture_rand(N * d, 132, -1, 1);
    float *y = td_malloc(N * d * sizeof(float)), *rstd = td_malloc(N * sizeof(float));
    float *y2 = td_malloc(N * d * sizeof(float)), *rstd2 = td_malloc(N * sizeof(float)), *y3 = td_malloc(N * d * sizeof(float));
    float *ss = td_malloc(N * sizeof(float)), *s = td_malloc(N * sizeof(float));
    float *dx = fixture_rand(N * d, 133, -1, 1), *dw = fixture_rand(d, 134, -1, 1);
    float *dx2 = fixture_copy(dx, N * d), *dw2 = fixture_copy(dw, d);
    rmsnorm_forward(y, rstd, x, w, N, d, 1e-5f);
    rmsnorm_sumsq(ss, x, N, d);
    rmsnorm_scale_forward(y2, rstd2, x, ss, w, N, d, d, 1e-5f);
    rmsnorm_apply(y3, x, rstd, w, N, d);
    rmsnorm_backward(dx, dw, dy, x, w, rstd, N, d);
    rmsnorm_dot(s, dy, x, w, N, d);
    rmsnorm_scale_backward(dx2, dw2, dy, x, w, rstd2, s, N, d, d);
    EXPECT_BITWISE(y2, y, N * d, "y, split form");
    EXPECT_BITWISE(rstd2, rstd, N, "rstd, split form");
    EXPECT_BITWISE(y3, y, N * d, "y, rmsnorm_apply");
    EXPECT_BITWISE(dx2, dx, N * d, "dx, split form");
    EXPECT_BITWISE(dw2, dw, d, "dw, split form");
    td_free(x);
    td_free(w);
    td_free(dy);
    td_free(y);
    td_free(rstd);
    td_free(y2);
    td_free(rstd2);
    td_free(y3);
    td_free(ss);
    td_free(s);
    td_free(dx);
    td_free(dw);
    td_free(dx2);
    td_free(dw2);
    EXPECT_NO_LEAKS();
}

/* tests/test_layernorm.c - LayerNorm (core/ops/layernorm.h) against PyTorch
 * (layernorm.h5 from tests/ref/fixtures_vision.py) and central finite
 * differences of a naive double forward; in place and 1 vs 2 threads bit for
 * bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/layernorm.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(layernorm, .init = setup, .fini = teardown);

static const char *const FX = "layernorm.h5";

Test(layernorm, forward_and_backward_match_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 4, "layernorm.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], d = (size_t)dims[1];
        float *eps = fixture_case_f32(FX, c, "eps", NULL), *x = fixture_case_f32(FX, c, "x", NULL);
        float *w = fixture_case_f32(FX, c, "w", NULL), *b = fixture_case_f32(FX, c, "b", NULL);
        float *dy = fixture_case_f32(FX, c, "dy", NULL), *y_ref = fixture_case_f32(FX, c, "y", NULL);
        float *mu_ref = fixture_case_f32(FX, c, "mean", NULL), *r_ref = fixture_case_f32(FX, c, "rstd", NULL);
        float *dx_ref = fixture_case_f32(FX, c, "dx", NULL), *dw_ref = fixture_case_f32(FX, c, "dw", NULL);
        float *db_ref = fixture_case_f32(FX, c, "db", NULL);
        float *y = td_malloc(N * d * sizeof(float)), *mu = td_malloc(N * sizeof(float));
        float *rs = td_malloc(N * sizeof(float));
        layernorm_forward(y, mu, rs, x, w, b, N, d, eps[0]);
        /* gradients start non-zero: the op must add */
        float *dx = fixture_rand(N * d, 30 + (uint64_t)c, -1, 1), *dw = fixture_rand(d, 40 + (uint64_t)c, -1, 1);
        float *db = fixture_rand(d, 50 + (uint64_t)c, -1, 1);
        float *dx_w = td_malloc(N * d * sizeof(float)), *dw_w = td_malloc(d * sizeof(float));
        float *db_w = td_malloc(d * sizeof(float));
        for (size_t i = 0; i < N * d; i++) dx_w[i] = (float)((double)dx[i] + dx_ref[i]);
        for (size_t i = 0; i < d; i++) {
            dw_w[i] = (float)((double)dw[i] + dw_ref[i]);
            db_w[i] = (float)((double)db[i] + db_ref[i]);
        }
        layernorm_backward(dx, dw, db, dy, x, w, mu, rs, N, d);
        /* float vs float64: the row sums lose a few ulp of the row's scale
         * (x up to 5 in magnitude: mean and deviations ~1e-6 absolute),
         * then rstd up to ~2 multiplies them (d = 1: rstd = 1/sqrt(eps) but
         * x - mean is exactly 0). */
        char what[64];
        snprintf(what, sizeof what, "y, case %d (N=%zu d=%zu)", c, N, d);
        EXPECT_CLOSE(y, y_ref, N * d, 2e-6, 2e-6, what);
        snprintf(what, sizeof what, "mean, case %d", c);
        EXPECT_CLOSE(mu, mu_ref, N, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "rstd, case %d", c);
        EXPECT_CLOSE(rs, r_ref, N, 0, 4e-6, what);
        snprintf(what, sizeof what, "dx, case %d", c);
        EXPECT_CLOSE(dx, dx_w, N * d, 4e-6, 2e-6, what);
        snprintf(what, sizeof what, "dw, case %d", c);
        EXPECT_CLOSE(dw, dw_w, d, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "db, case %d", c);
        EXPECT_CLOSE(db, db_w, d, 1e-6, 1e-6, what);
        td_free(dims);
        float *arrs[] = { eps, x, w, b, dy, y_ref, mu_ref, r_ref,
                          dx_ref, dw_ref, db_ref, y, mu, rs, dx, dw, db, dx_w, dw_w, db_w };
        for (size_t i = 0; i < sizeof arrs / sizeof *arrs; i++) td_free(arrs[i]);
    }
    EXPECT_NO_LEAKS();
}

/* y = layernorm(x) w + b in double. */
static void naive_layernorm(double *y, const double *x, const double *w, const double *b, size_t N, size_t d,
                            double eps)
{
    for (size_t t = 0; t < N; t++) {
        double mu = 0, var = 0;
        for (size_t i = 0; i < d; i++) mu += x[t * d + i];
        mu /= (double)d;
        for (size_t i = 0; i < d; i++) var += (x[t * d + i] - mu) * (x[t * d + i] - mu);
        const double r = 1.0 / sqrt(var / (double)d + eps);
        for (size_t i = 0; i < d; i++) y[t * d + i] = (x[t * d + i] - mu) * r * w[i] + b[i];
    }
}

typedef struct { const double *dy; size_t N, d; double eps; } LnFd;

/* L = sum dy * layernorm(x, w, b); p = [x (N d), w (d), b (d)] */
static double ln_loss(const double *p, void *vctx)
{
    const LnFd *c = vctx;
    const size_t nx = c->N * c->d;
    double *y = td_malloc(nx * sizeof(double)), L = 0;
    naive_layernorm(y, p, p + nx, p + nx + c->d, c->N, c->d, c->eps);
    for (size_t i = 0; i < nx; i++) L += c->dy[i] * y[i];
    td_free(y);
    return L;
}

Test(layernorm, backward_matches_finite_differences)
{
    static const size_t shapes[][2] = { { 3, 2 }, { 7, 33 }, { 2, 100 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], d = shapes[s][1], nx = N * d, np = nx + 2 * d;
        const float eps = 1e-5f;
        float *x = fixture_rand(nx, 150 + s, -2, 2), *w = fixture_rand(d, 160 + s, 0.5f, 1.5f);
        float *b = fixture_rand(d, 165 + s, -1, 1), *dy = fixture_rand(nx, 170 + s, -1, 1);
        float *dx = td_calloc(nx * sizeof(float)), *dw = td_calloc(d * sizeof(float));
        float *db = td_calloc(d * sizeof(float));
        double *p = td_malloc(np * sizeof(double)), *g = td_malloc(np * sizeof(double));
        double *dyd = td_malloc(nx * sizeof(double));
        for (size_t i = 0; i < nx; i++) {
            p[i] = x[i];
            dyd[i] = dy[i];
        }
        for (size_t i = 0; i < d; i++) {
            p[nx + i] = w[i];
            p[nx + d + i] = b[i];
        }
        LnFd ctx = { dyd, N, d, eps };
        fixture_fd(g, ln_loss, &ctx, p, np, 1e-6);
        float *y = td_malloc(nx * sizeof(float)), *mu = td_malloc(N * sizeof(float));
        float *rs = td_malloc(N * sizeof(float));
        layernorm_forward(y, mu, rs, x, w, b, N, d, eps);
        layernorm_backward(dx, dw, db, dy, x, w, mu, rs, N, d);
        float *want = td_malloc(np * sizeof(float));
        for (size_t i = 0; i < np; i++) want[i] = (float)g[i];
        /* FD with h = 1e-6: truncation and rounding < 1e-9; the float
         * backward as in the PyTorch test above */
        char what[48];
        snprintf(what, sizeof what, "dx vs FD, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(dx, want, nx, 4e-6, 2e-6, what);
        snprintf(what, sizeof what, "dw vs FD, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(dw, want + nx, d, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "db vs FD, N=%zu d=%zu", N, d);
        EXPECT_CLOSE(db, want + nx + d, d, 2e-6, 1e-6, what);
        float *arrs[] = { x, w, b, dy, dx, dw, db, y, mu, rs, want };
        for (size_t i = 0; i < sizeof arrs / sizeof *arrs; i++) td_free(arrs[i]);
        td_free(p);
        td_free(g);
        td_free(dyd);
    }
    EXPECT_NO_LEAKS();
}

Test(layernorm, in_place_and_two_threads_give_the_same_bits)
{
    /* N = 37 rows (grain 8) and d = 70 columns (grain 16) both split */
    const size_t N = 37, d = 70;
    float *x = fixture_rand(N * d, 180, -2, 2), *w = fixture_rand(d, 181, -1, 1), *b = fixture_rand(d, 182, -1, 1);
    float *dy = fixture_rand(N * d, 183, -1, 1);
    float *y[2], *mu[2], *rs[2], *dx[2], *dw[2], *db[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        y[t] = td_malloc(N * d * sizeof(float));
        mu[t] = td_malloc(N * sizeof(float));
        rs[t] = td_malloc(N * sizeof(float));
        dx[t] = td_calloc(N * d * sizeof(float));
        dw[t] = td_calloc(d * sizeof(float));
        db[t] = td_calloc(d * sizeof(float));
        layernorm_forward(y[t], mu[t], rs[t], x, w, b, N, d, 1e-5f);
        layernorm_backward(dx[t], dw[t], db[t], dy, x, w, mu[t], rs[t], N, d);
    }
    pool_init(1);
    float *xin = fixture_copy(x, N * d);
    layernorm_forward(xin, NULL, NULL, xin, w, b, N, d, 1e-5f);
    EXPECT_BITWISE(xin, y[0], N * d, "in place, no mean / rstd");
    EXPECT_BITWISE(y[1], y[0], N * d, "2 threads: y");
    EXPECT_BITWISE(dx[1], dx[0], N * d, "2 threads: dx");
    EXPECT_BITWISE(dw[1], dw[0], d, "2 threads: dw");
    EXPECT_BITWISE(db[1], db[0], d, "2 threads: db");
    for (int t = 0; t < 2; t++) {
        float *arrs[] = { y[t], mu[t], rs[t], dx[t], dw[t], db[t] };
        for (size_t i = 0; i < 6; i++) td_free(arrs[i]);
    }
    float *arrs[] = { x, w, b, dy, xin };
    for (size_t i = 0; i < 5; i++) td_free(arrs[i]);
    EXPECT_NO_LEAKS();
}

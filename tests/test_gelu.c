/* tests/test_gelu.c - GELU (core/ops/gelu.h) against PyTorch (gelu.h5 from
 * tests/ref/fixtures_vision.py) and central finite differences in double
 * of the erf form; in place and 1 vs 2 threads bit for bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/gelu.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(gelu, .init = setup, .fini = teardown);

static const char *const FX = "gelu.h5";

Test(gelu, forward_and_backward_match_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 2, "gelu.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        size_t n;
        float *x = fixture_case_f32(FX, c, "x", &n), *dy = fixture_case_f32(FX, c, "dy", NULL);
        float *y_ref = fixture_case_f32(FX, c, "y", NULL), *dx_ref = fixture_case_f32(FX, c, "dx", NULL);
        float *y = td_malloc(n * sizeof(float)), *dx = fixture_rand(n, 10 + (uint64_t)c, -1, 1);
        float *want = td_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) want[i] = (float)((double)dx[i] + dx_ref[i]);
        gelu_forward(y, x, n);
        gelu_backward(dx, dy, x, n);
        /* erff and expf are within ~1 ulp; |x| <= 12 */
        char what[48];
        snprintf(what, sizeof what, "y, case %d (n=%zu)", c, n);
        EXPECT_CLOSE(y, y_ref, n, 1e-6, 2e-6, what);
        snprintf(what, sizeof what, "dx, case %d", c);
        EXPECT_CLOSE(dx, want, n, 1e-6, 2e-6, what);
        float *arrs[] = { x, dy, y_ref, dx_ref, y, dx, want };
        for (size_t i = 0; i < 7; i++) td_free(arrs[i]);
    }
    EXPECT_NO_LEAKS();
}

static double gelu_d(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

static double gelu_loss(const double *p, void *vctx)
{
    const double *dy = vctx;
    double L = 0;
    for (size_t i = 0; i < 50; i++) L += dy[i] * gelu_d(p[i]);
    return L;
}

Test(gelu, backward_matches_finite_differences)
{
    const size_t n = 50;
    float *x = fixture_rand(n, 20, -5, 5), *dy = fixture_rand(n, 21, -1, 1);
    float *dx = td_calloc(n * sizeof(float)), *want = td_malloc(n * sizeof(float));
    double *p = td_malloc(n * sizeof(double)), *g = td_malloc(n * sizeof(double));
    double *dyd = td_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        p[i] = x[i];
        dyd[i] = dy[i];
    }
    fixture_fd(g, gelu_loss, dyd, p, n, 1e-6);
    for (size_t i = 0; i < n; i++) want[i] = (float)g[i];
    gelu_backward(dx, dy, x, n);
    EXPECT_CLOSE(dx, want, n, 1e-6, 2e-6, "dx vs FD");
    td_free(x);
    td_free(dy);
    td_free(dx);
    td_free(want);
    td_free(p);
    td_free(g);
    td_free(dyd);
    EXPECT_NO_LEAKS();
}

Test(gelu, in_place_and_two_threads_give_the_same_bits)
{
    const size_t n = 5000;   /* grain 1024: split over 2 threads */
    float *x = fixture_rand(n, 30, -6, 6), *dy = fixture_rand(n, 31, -1, 1);
    float *y[2], *dx[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        y[t] = td_malloc(n * sizeof(float));
        dx[t] = td_calloc(n * sizeof(float));
        gelu_forward(y[t], x, n);
        gelu_backward(dx[t], dy, x, n);
    }
    pool_init(1);
    float *xin = fixture_copy(x, n);
    gelu_forward(xin, xin, n);
    EXPECT_BITWISE(xin, y[0], n, "in place");
    EXPECT_BITWISE(y[1], y[0], n, "2 threads: y");
    EXPECT_BITWISE(dx[1], dx[0], n, "2 threads: dx");
    for (int t = 0; t < 2; t++) {
        td_free(y[t]);
        td_free(dx[t]);
    }
    td_free(x);
    td_free(dy);
    td_free(xin);
    EXPECT_NO_LEAKS();
}

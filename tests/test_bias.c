/* tests/test_bias.c - the bias of a linear layer (core/ops/bias.h) against
 * PyTorch (bias.h5 from tests/ref/fixtures_ops.py) and central finite
 * differences; 1 vs 2 threads bit for bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/bias.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(bias, .init = setup, .fini = teardown);

static const char *const FX = "bias.h5";

Test(bias, forward_and_backward_match_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 3, "bias.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], n = (size_t)dims[1];
        float *x = fixture_case_f32(FX, c, "x", NULL), *b = fixture_case_f32(FX, c, "b", NULL);
        float *dy = fixture_case_f32(FX, c, "dy", NULL), *y_ref = fixture_case_f32(FX, c, "y", NULL);
        float *db_ref = fixture_case_f32(FX, c, "db", NULL);
        bias_forward(x, b, N, n);   /* in place: x becomes y */
        /* one float add of float32 inputs vs float64 rounded: exact up to
         * the final rounding, i.e. equal */
        char what[48];
        snprintf(what, sizeof what, "y, case %d", c);
        EXPECT_CLOSE(x, y_ref, N * n, 0, 0, what);
        /* db starts non-zero: the op must add */
        float *db = fixture_rand(n, 10 + (uint64_t)c, -1, 1), *want = td_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) want[i] = (float)((double)db[i] + db_ref[i]);
        bias_backward(db, dy, N, n);
        /* a float sum of N <= 19 terms of |.| < 1 plus the start value:
         * ~N ulp of ~N, 1e-5 absolute */
        snprintf(what, sizeof what, "db, case %d", c);
        EXPECT_CLOSE(db, want, n, 1e-5, 1e-6, what);
        td_free(dims);
        td_free(x);
        td_free(b);
        td_free(dy);
        td_free(y_ref);
        td_free(db_ref);
        td_free(db);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *x, *dy; size_t N, n; } BiasFd;

/* L(b) = sum dy * (x + b) */
static double bias_loss(const double *b, void *vc)
{
    const BiasFd *c = vc;
    double L = 0;
    for (size_t t = 0; t < c->N; t++)
        for (size_t i = 0; i < c->n; i++) L += c->dy[t * c->n + i] * (c->x[t * c->n + i] + b[i]);
    return L;
}

Test(bias, backward_matches_finite_differences)
{
    const size_t N = 11, n = 37;
    float *x = fixture_rand(N * n, 20, -2, 2), *b = fixture_rand(n, 21, -1, 1), *dy = fixture_rand(N * n, 22, -1, 1);
    double *xd = td_malloc(N * n * sizeof(double)), *dyd = td_malloc(N * n * sizeof(double));
    double *bd = td_malloc(n * sizeof(double)), *g = td_malloc(n * sizeof(double));
    for (size_t i = 0; i < N * n; i++) xd[i] = x[i], dyd[i] = dy[i];
    for (size_t i = 0; i < n; i++) bd[i] = b[i];
    BiasFd ctx = { xd, dyd, N, n };
    fixture_fd(g, bias_loss, &ctx, bd, n, 1e-6);
    float *db = td_calloc(n * sizeof(float)), *want = td_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = (float)g[i];
    bias_backward(db, dy, N, n);
    /* linear in b: the differences are exact up to rounding (~1e-10); the
     * float column sums of 11 terms: 1e-6 */
    EXPECT_CLOSE(db, want, n, 1e-6, 1e-6, "db vs FD");
    td_free(x);
    td_free(b);
    td_free(dy);
    td_free(xd);
    td_free(dyd);
    td_free(bd);
    td_free(g);
    td_free(db);
    td_free(want);
    EXPECT_NO_LEAKS();
}

Test(bias, two_threads_bit_identical)
{
    /* 37 rows (grain 16) and 200 columns (grain 64) both split */
    const size_t N = 37, n = 200;
    float *b = fixture_rand(n, 30, -1, 1), *dy = fixture_rand(N * n, 31, -1, 1);
    float *y[2], *db[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        y[t] = fixture_rand(N * n, 32, -1, 1);
        db[t] = fixture_rand(n, 33, -1, 1);
        bias_forward(y[t], b, N, n);
        bias_backward(db[t], dy, N, n);
    }
    pool_init(1);
    EXPECT_BITWISE(y[1], y[0], N * n, "y, 2 threads vs 1");
    EXPECT_BITWISE(db[1], db[0], n, "db, 2 threads vs 1");
    for (int t = 0; t < 2; t++) {
        td_free(y[t]);
        td_free(db[t]);
    }
    td_free(b);
    td_free(dy);
    EXPECT_NO_LEAKS();
}

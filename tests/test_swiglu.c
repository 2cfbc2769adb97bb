/* tests/test_swiglu.c - SiLU and SwiGLU (core/ops/swiglu.h) against a naive
 * double forward, PyTorch (swiglu.h5 from tests/ref/fixtures_ops.py) and
 * central finite differences, saturated sigmoids included; 1 vs 2 threads
 * bit for bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/swiglu.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(swiglu, .init = setup, .fini = teardown);

static const char *const FX = "swiglu.h5";

static double silu_d(double g) { return g / (1.0 + exp(-g)); }

/* ------------------------------------------------------------ forward */

Test(swiglu, forward_matches_naive_double)
{
    const size_t N = 7, F = 33, n = N * F;
    float *g = fixture_rand(n, 1, -12, 12), *u = fixture_rand(n, 2, -3, 3);
    g[0] = 40.0f;     /* sigmoid = 1 in float */
    g[1] = -40.0f;    /* sigmoid ~ 4e-18, silu ~ -1.7e-16 */
    g[2] = 0.0f;
    float *h = td_malloc(n * sizeof(float)), *y = td_malloc(n * sizeof(float));
    float *h_want = td_malloc(n * sizeof(float)), *y_want = td_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        h_want[i] = (float)(silu_d(g[i]) * u[i]);
        y_want[i] = (float)silu_d(g[i]);
    }
    swiglu_forward(h, g, u, N, F);
    silu_forward(y, g, n);
    /* expf, one division, two products: a few ulp, relative (values down to
     * 1e-16 at g = -40 must keep their relative accuracy too). */
    EXPECT_CLOSE(h, h_want, n, 0, 2e-6, "swiglu h");
    EXPECT_CLOSE(y, y_want, n, 0, 2e-6, "silu y");
    td_free(g);
    td_free(u);
    td_free(h);
    td_free(y);
    td_free(h_want);
    td_free(y_want);
    EXPECT_NO_LEAKS();
}

Test(swiglu, forward_and_backward_match_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 2, "swiglu.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], F = (size_t)dims[1], n = N * F;
        float *g = fixture_case_f32(FX, c, "g", NULL), *u = fixture_case_f32(FX, c, "u", NULL);
        float *dh = fixture_case_f32(FX, c, "dh", NULL), *h_ref = fixture_case_f32(FX, c, "h", NULL);
        float *dg_ref = fixture_case_f32(FX, c, "dg", NULL), *du_ref = fixture_case_f32(FX, c, "du", NULL);
        float *x = fixture_case_f32(FX, c, "x", NULL), *dy = fixture_case_f32(FX, c, "dy", NULL);
        float *y_ref = fixture_case_f32(FX, c, "y", NULL), *dx_ref = fixture_case_f32(FX, c, "dx", NULL);
        float *h = td_malloc(n * sizeof(float)), *y = td_malloc(n * sizeof(float));
        swiglu_forward(h, g, u, N, F);
        silu_forward(y, x, n);
        /* gradients start non-zero: the ops must add */
        float *dg = fixture_rand(n, 10 + (uint64_t)c, -1, 1), *du = fixture_rand(n, 11 + (uint64_t)c, -1, 1);
        float *dx = fixture_rand(n, 12 + (uint64_t)c, -1, 1);
        float *dg_want = td_malloc(n * sizeof(float)), *du_want = td_malloc(n * sizeof(float));
        float *dx_want = td_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            dg_want[i] = (float)((double)dg[i] + dg_ref[i]);
            du_want[i] = (float)((double)du[i] + du_ref[i]);
            dx_want[i] = (float)((double)dx[i] + dx_ref[i]);
        }
        swiglu_backward(dg, du, dh, g, u, N, F);
        silu_backward(dx, dy, x, n);
        /* elementwise float formulas: a few ulp relative for the forward; the
         * gradients add an O(1) start value, so 1e-6 absolute. */
        char what[48];
        snprintf(what, sizeof what, "h, case %d", c);
        EXPECT_CLOSE(h, h_ref, n, 1e-7, 2e-6, what);
        snprintf(what, sizeof what, "silu y, case %d", c);
        EXPECT_CLOSE(y, y_ref, n, 1e-7, 2e-6, what);
        snprintf(what, sizeof what, "dg, case %d", c);
        EXPECT_CLOSE(dg, dg_want, n, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "du, case %d", c);
        EXPECT_CLOSE(du, du_want, n, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "silu dx, case %d", c);
        EXPECT_CLOSE(dx, dx_want, n, 1e-6, 1e-6, what);
        td_free(dims);
        td_free(g);
        td_free(u);
        td_free(dh);
        td_free(h_ref);
        td_free(dg_ref);
        td_free(du_ref);
        td_free(x);
        td_free(dy);
        td_free(y_ref);
        td_free(dx_ref);
        td_free(h);
        td_free(y);
        td_free(dg);
        td_free(du);
        td_free(dx);
        td_free(dg_want);
        td_free(du_want);
        td_free(dx_want);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ finite differences */

typedef struct { const double *dh; size_t n; int silu_only; } SwFd;

/* swiglu: p = [g (n), u (n)], L = sum dh * silu(g) * u;  silu: p = x, L = sum dh * silu(x) */
static double sw_loss(const double *p, void *vctx)
{
    const SwFd *c = vctx;
    double L = 0;
    for (size_t i = 0; i < c->n; i++)
        L += c->dh[i] * silu_d(p[i]) * (c->silu_only ? 1.0 : p[c->n + i]);
    return L;
}

Test(swiglu, backward_matches_finite_differences)
{
    static const size_t shapes[][2] = { { 1, 1 }, { 3, 7 }, { 5, 33 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], F = shapes[s][1], n = N * F;
        float *g = fixture_rand(n, 20 + s, -8, 8), *u = fixture_rand(n, 21 + s, -2, 2);
        float *dh = fixture_rand(n, 22 + s, -1, 1);
        if (n > 2) {
            g[1] = 25.0f;    /* saturated: silu' -> 1 */
            g[2] = -25.0f;   /* saturated: silu' -> 0 */
        }
        float *dg = fixture_rand(n, 23 + s, -1, 1), *du = fixture_rand(n, 24 + s, -1, 1);
        float *dx = fixture_rand(n, 25 + s, -1, 1);
        double *p = td_malloc(2 * n * sizeof(double)), *gr = td_malloc(2 * n * sizeof(double));
        double *dhd = td_malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            p[i] = g[i];
            p[n + i] = u[i];
            dhd[i] = dh[i];
        }
        SwFd ctx = { dhd, n, 0 };
        fixture_fd(gr, sw_loss, &ctx, p, 2 * n, 1e-6);
        float *want = td_malloc(3 * n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            want[i] = (float)(dg[i] + gr[i]);
            want[n + i] = (float)(du[i] + gr[n + i]);
        }
        ctx.silu_only = 1;
        fixture_fd(gr, sw_loss, &ctx, p, n, 1e-6);
        for (size_t i = 0; i < n; i++) want[2 * n + i] = (float)(dx[i] + gr[i]);
        swiglu_backward(dg, du, dh, g, u, N, F);
        silu_backward(dx, dh, g, n);
        /* FD error (h = 1e-6, smooth, O(1) derivatives) < 1e-8; the float
         * backward is a few ulp of O(1) plus the O(1) start value. */
        char what[48];
        snprintf(what, sizeof what, "dg vs FD, N=%zu F=%zu", N, F);
        EXPECT_CLOSE(dg, want, n, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "du vs FD, N=%zu F=%zu", N, F);
        EXPECT_CLOSE(du, want + n, n, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "silu dx vs FD, n=%zu", n);
        EXPECT_CLOSE(dx, want + 2 * n, n, 1e-6, 1e-6, what);
        td_free(g);
        td_free(u);
        td_free(dh);
        td_free(dg);
        td_free(du);
        td_free(dx);
        td_free(p);
        td_free(gr);
        td_free(dhd);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

Test(swiglu, two_threads_bit_identical)
{
    const size_t N = 9, F = 300, n = N * F;   /* 2700 elements, grain 1024: split */
    float *g = fixture_rand(n, 30, -8, 8), *u = fixture_rand(n, 31, -2, 2), *dh = fixture_rand(n, 32, -1, 1);
    float *h[2], *y[2], *dg[2], *du[2], *dx[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        h[t] = td_malloc(n * sizeof(float));
        y[t] = td_malloc(n * sizeof(float));
        dg[t] = fixture_rand(n, 33, -1, 1);
        du[t] = fixture_rand(n, 34, -1, 1);
        dx[t] = fixture_rand(n, 35, -1, 1);
        swiglu_forward(h[t], g, u, N, F);
        silu_forward(y[t], g, n);
        swiglu_backward(dg[t], du[t], dh, g, u, N, F);
        silu_backward(dx[t], dh, g, n);
    }
    pool_init(1);
    EXPECT_BITWISE(h[1], h[0], n, "h, 2 threads vs 1");
    EXPECT_BITWISE(y[1], y[0], n, "silu y, 2 threads vs 1");
    EXPECT_BITWISE(dg[1], dg[0], n, "dg, 2 threads vs 1");
    EXPECT_BITWISE(du[1], du[0], n, "du, 2 threads vs 1");
    EXPECT_BITWISE(dx[1], dx[0], n, "silu dx, 2 threads vs 1");
    for (int t = 0; t < 2; t++) {
        td_free(h[t]);
        td_free(y[t]);
        td_free(dg[t]);
        td_free(du[t]);
        td_free(dx[t]);
    }
    td_free(g);
    td_free(u);
    td_free(dh);
    EXPECT_NO_LEAKS();
}

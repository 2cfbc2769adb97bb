/* tests/test_gate.c - Qwen2-MoE's shared expert gate, sigmoid gate and row
 * scaling (core/ops/gate.h), against PyTorch (gate.h5 from
 * tests/ref/fixtures_ops.py) and central finite differences of the
 * composition in double; the row dot split in column halves (tensor
 * parallelism) and summed; row invariance and 1 vs 2 threads bit for bit. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/gate.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(gate, .init = setup, .fini = teardown);

static const char *const FX = "gate.h5";

/* The two ops' backward, as the model chains them: dg from the row scale,
 * then the gate's logit gradient into dh and dw. */
static void gate_chain_backward(float *dh, float *dw, float *ds, const float *dy, const float *s,
                                const float *h, const float *w, const float *g, size_t N, size_t d, size_t n)
{
    float *dg = td_calloc(N * sizeof(float));
    row_scale_backward(ds, dg, dy, s, g, N, n);
    sigmoid_gate_backward(dh, dw, dg, h, w, g, N, d);
    td_free(dg);
}

Test(gate, forward_and_backward_match_torch)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 3, "gate.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], d = (size_t)dims[1], n = (size_t)dims[2];
        float *h = fixture_case_f32(FX, c, "h", NULL), *w = fixture_case_f32(FX, c, "w", NULL);
        float *s = fixture_case_f32(FX, c, "s", NULL), *dy = fixture_case_f32(FX, c, "dy", NULL);
        float *g_ref = fixture_case_f32(FX, c, "g", NULL), *y_ref = fixture_case_f32(FX, c, "y", NULL);
        float *dh_ref = fixture_case_f32(FX, c, "dh", NULL), *dw_ref = fixture_case_f32(FX, c, "dw", NULL);
        float *ds_ref = fixture_case_f32(FX, c, "ds", NULL);
        float *g = td_malloc(N * sizeof(float)), *y = td_malloc(N * n * sizeof(float));
        sigmoid_gate_forward(g, h, w, N, d);
        row_scale_forward(y, g, s, N, n);
        /* a float dot of d <= 64 terms (|h w| < 3) and expf: the logit to
         * ~1e-6 absolute, sigmoid's slope <= 1/4; y one more product */
        char what[48];
        snprintf(what, sizeof what, "g, case %d", c);
        EXPECT_CLOSE(g, g_ref, N, 1e-6, 1e-6, what);
        snprintf(what, sizeof what, "y, case %d", c);
        EXPECT_CLOSE(y, y_ref, N * n, 1e-6, 1e-6, what);
        /* gradients start non-zero: the ops must add */
        float *dh = fixture_rand(N * d, 50 + (uint64_t)c, -1, 1), *dw = fixture_rand(d, 51 + (uint64_t)c, -1, 1);
        float *ds = fixture_rand(N * n, 52 + (uint64_t)c, -1, 1);
        float *dh_w = td_malloc(N * d * sizeof(float)), *dw_w = td_malloc(d * sizeof(float)),
              *ds_w = td_malloc(N * n * sizeof(float));
        for (size_t i = 0; i < N * d; i++) dh_w[i] = (float)((double)dh[i] + dh_ref[i]);
        for (size_t i = 0; i < d; i++) dw_w[i] = (float)((double)dw[i] + dw_ref[i]);
        for (size_t i = 0; i < N * n; i++) ds_w[i] = (float)((double)ds[i] + ds_ref[i]);
        gate_chain_backward(dh, dw, ds, dy, s, h, w, g, N, d, n);
        /* dg a float dot of n <= 64 terms of |.| < 1 (~1e-6), times
         * g(1-g) <= 1/4 and |w| < 3; dw sums N <= 19 such terms; plus the
         * O(1) start values */
        snprintf(what, sizeof what, "dh, case %d", c);
        EXPECT_CLOSE(dh, dh_w, N * d, 2e-6, 1e-6, what);
        snprintf(what, sizeof what, "dw, case %d", c);
        EXPECT_CLOSE(dw, dw_w, d, 4e-6, 1e-6, what);
        snprintf(what, sizeof what, "ds, case %d", c);
        EXPECT_CLOSE(ds, ds_w, N * n, 1e-6, 1e-6, what);
        td_free(dims);
        td_free(h);
        td_free(w);
        td_free(s);
        td_free(dy);
        td_free(g_ref);
        td_free(y_ref);
        td_free(dh_ref);
        td_free(dw_ref);
        td_free(ds_ref);
        td_free(g);
        td_free(y);
        td_free(dh);
        td_free(dw);
        td_free(ds);
        td_free(dh_w);
        td_free(dw_w);
        td_free(ds_w);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; size_t N, d, n; } GateFd;

/* p = [h (N d), w (d), s (N n)];  L = sum dy * sigmoid(h w) s */
static double gate_loss(const double *p, void *vc)
{
    const GateFd *c = vc;
    const double *h = p, *w = p + c->N * c->d, *s = w + c->d;
    double L = 0;
    for (size_t t = 0; t < c->N; t++) {
        double z = 0;
        for (size_t i = 0; i < c->d; i++) z += h[t * c->d + i] * w[i];
        const double g = 1.0 / (1.0 + exp(-z));
        for (size_t i = 0; i < c->n; i++) L += c->dy[t * c->n + i] * g * s[t * c->n + i];
    }
    return L;
}

Test(gate, backward_matches_finite_differences)
{
    const size_t N = 6, d = 19, n = 23, np = N * d + d + N * n;
    float *h = fixture_rand(N * d, 60, -1, 1), *w = fixture_rand(d, 61, -1, 1), *s = fixture_rand(N * n, 62, -2, 2);
    float *dy = fixture_rand(N * n, 63, -1, 1);
    double *p = td_malloc(np * sizeof(double)), *gfd = td_malloc(np * sizeof(double)), *dyd = td_malloc(N * n * sizeof(double));
    for (size_t i = 0; i < N * d; i++) p[i] = h[i];
    for (size_t i = 0; i < d; i++) p[N * d + i] = w[i];
    for (size_t i = 0; i < N * n; i++) p[N * d + d + i] = s[i], dyd[i] = dy[i];
    GateFd ctx = { dyd, N, d, n };
    fixture_fd(gfd, gate_loss, &ctx, p, np, 1e-6);
    float *want = td_malloc(np * sizeof(float));
    for (size_t i = 0; i < np; i++) want[i] = (float)gfd[i];
    float *g = td_malloc(N * sizeof(float));
    float *dh = td_calloc(N * d * sizeof(float)), *dw = td_calloc(d * sizeof(float)), *ds = td_calloc(N * n * sizeof(float));
    sigmoid_gate_forward(g, h, w, N, d);
    gate_chain_backward(dh, dw, ds, dy, s, h, w, g, N, d, n);
    /* central differences, h = 1e-6, of a smooth O(1) function: ~1e-9;
     * the float backward: ~1e-7 */
    EXPECT_CLOSE(dh, want, N * d, 1e-6, 1e-5, "dh vs FD");
    EXPECT_CLOSE(dw, want + N * d, d, 1e-6, 1e-5, "dw vs FD");
    EXPECT_CLOSE(ds, want + N * d + d, N * n, 1e-6, 1e-5, "ds vs FD");
    td_free(h);
    td_free(w);
    td_free(s);
    td_free(dy);
    td_free(p);
    td_free(gfd);
    td_free(dyd);
    td_free(want);
    td_free(g);
    td_free(dh);
    td_free(dw);
    td_free(ds);
    EXPECT_NO_LEAKS();
}

/* Under tensor parallelism each rank holds a slice of s's columns: its
 * row_scale_backward gives a partial dg, summed over the ranks. */
Test(gate, dot_split_over_column_halves_sums_to_the_whole)
{
    const size_t N = 9, n = 40, h2 = n / 2;
    float *s = fixture_rand(N * n, 70, -1, 1), *dy = fixture_rand(N * n, 71, -1, 1), *g = fixture_rand(N, 72, 0, 1);
    float *dg = td_calloc(N * sizeof(float)), *part = td_calloc(2 * N * sizeof(float));
    float *sp = td_malloc(N * h2 * sizeof(float)), *dyp = td_malloc(N * h2 * sizeof(float));
    row_scale_backward(NULL, dg, dy, s, g, N, n);
    for (size_t r = 0; r < 2; r++) {
        for (size_t t = 0; t < N; t++) {
            memcpy(sp + t * h2, s + t * n + r * h2, h2 * sizeof(float));
            memcpy(dyp + t * h2, dy + t * n + r * h2, h2 * sizeof(float));
        }
        row_scale_backward(NULL, part + r * N, dyp, sp, g, N, h2);
    }
    for (size_t t = 0; t < N; t++) part[t] += part[N + t];
    /* two float dots of 20 terms summed vs one of 40: a few ulp of ~5 */
    EXPECT_CLOSE(part, dg, N, 2e-6, 1e-6, "dg of two halves summed");
    td_free(s);
    td_free(dy);
    td_free(g);
    td_free(dg);
    td_free(part);
    td_free(sp);
    td_free(dyp);
    EXPECT_NO_LEAKS();
}

Test(gate, row_invariant_and_two_threads_bit_identical)
{
    const size_t N = 37, d = 70, n = 50;
    float *h = fixture_rand(N * d, 80, -1, 1), *w = fixture_rand(d, 81, -1, 1), *s = fixture_rand(N * n, 82, -1, 1);
    float *dy = fixture_rand(N * n, 83, -1, 1);
    float *g[2], *y[2], *dh[2], *dw[2], *ds[2];
    for (int t = 0; t < 2; t++) {
        pool_init(t + 1);
        g[t] = td_malloc(N * sizeof(float));
        y[t] = td_malloc(N * n * sizeof(float));
        dh[t] = td_calloc(N * d * sizeof(float));
        dw[t] = td_calloc(d * sizeof(float));
        ds[t] = td_calloc(N * n * sizeof(float));
        sigmoid_gate_forward(g[t], h, w, N, d);
        row_scale_forward(y[t], g[t], s, N, n);
        gate_chain_backward(dh[t], dw[t], ds[t], dy, s, h, w, g[t], N, d, n);
    }
    pool_init(1);
    EXPECT_BITWISE(g[1], g[0], N, "g, 2 threads vs 1");
    EXPECT_BITWISE(y[1], y[0], N * n, "y, 2 threads vs 1");
    EXPECT_BITWISE(dh[1], dh[0], N * d, "dh, 2 threads vs 1");
    EXPECT_BITWISE(dw[1], dw[0], d, "dw, 2 threads vs 1");
    EXPECT_BITWISE(ds[1], ds[0], N * n, "ds, 2 threads vs 1");
    /* row 13 alone gives the bits it has in the batch */
    float g1, *y1 = td_malloc(n * sizeof(float));
    sigmoid_gate_forward(&g1, h + 13 * d, w, 1, d);
    row_scale_forward(y1, &g1, s + 13 * n, 1, n);
    EXPECT_BITWISE(&g1, g[0] + 13, 1, "g of row 13 alone");
    EXPECT_BITWISE(y1, y[0] + 13 * n, n, "y of row 13 alone");
    td_free(y1);
    for (int t = 0; t < 2; t++) {
        td_free(g[t]);
        td_free(y[t]);
        td_free(dh[t]);
        td_free(dw[t]);
        td_free(ds[t]);
    }
    td_free(h);
    td_free(w);
    td_free(s);
    td_free(dy);
    EXPECT_NO_LEAKS();
}

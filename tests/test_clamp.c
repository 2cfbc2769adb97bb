/* tests/test_clamp.c - clip_qkv's clamp (core/ops/clamp.h) against PyTorch's
 * torch.clamp, values on and just past the boundary included (clamp.h5 from
 * tests/ref/fixtures_ops.py), central finite differences away from it, NaN,
 * in-place use. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/clamp.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(clamp, .init = setup, .fini = teardown);

static const char *const FX = "clamp.h5";

Test(clamp, matches_torch_on_and_past_the_boundary)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 3, "clamp.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t n = (size_t)dims[0];
        float *cc = fixture_case_f32(FX, c, "c", NULL), *x = fixture_case_f32(FX, c, "x", NULL);
        float *dy = fixture_case_f32(FX, c, "dy", NULL), *y_ref = fixture_case_f32(FX, c, "y", NULL);
        float *dx_ref = fixture_case_f32(FX, c, "dx", NULL);
        float *y = td_malloc(n * sizeof(float));
        clamp_forward(y, x, n, cc[0]);
        /* a selection, no arithmetic: bit for bit */
        char what[64];
        snprintf(what, sizeof what, "y, case %d", c);
        EXPECT_BITWISE(y, y_ref, n, what);
        /* elements 0, 1 sit exactly on +-c (gradient passes), 2, 3 one ulp
         * past (zero), 4, 5 one ulp inside (passes): torch's mask, exactly */
        clamp_backward(dy, x, n, cc[0]);
        snprintf(what, sizeof what, "dx, case %d", c);
        EXPECT_BITWISE(dy, dx_ref, n, what);
        cr_expect(dx_ref[0] != 0 && dx_ref[1] != 0 && dx_ref[2] == 0 && dx_ref[3] == 0 && dx_ref[4] != 0,
                  "case %d: the fixture lost its boundary values", c);
        td_free(dims);
        td_free(cc);
        td_free(x);
        td_free(dy);
        td_free(y_ref);
        td_free(dx_ref);
        td_free(y);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; size_t n; double c; } ClampFd;

static double clamp_loss(const double *x, void *vc)
{
    const ClampFd *k = vc;
    double L = 0;
    for (size_t i = 0; i < k->n; i++) L += k->dy[i] * fmin(fmax(x[i], -k->c), k->c);
    return L;
}

Test(clamp, backward_matches_finite_differences)
{
    const size_t n = 300;
    const float c = 0.75f;
    float *x = fixture_rand(n, 40, -2, 2), *dy = fixture_rand(n, 41, -1, 1);
    /* keep every point 1e-3 away from the kinks at +-c (the step h is 1e-6) */
    for (size_t i = 0; i < n; i++)
        if (fabsf(fabsf(x[i]) - c) < 1e-3f) x[i] = x[i] > 0 ? c + 0.01f : -c - 0.01f;
    double *xd = td_malloc(n * sizeof(double)), *dyd = td_malloc(n * sizeof(double)), *g = td_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) xd[i] = x[i], dyd[i] = dy[i];
    ClampFd ctx = { dyd, n, c };
    fixture_fd(g, clamp_loss, &ctx, xd, n, 1e-6);
    float *want = td_malloc(n * sizeof(float));
    size_t n_clipped = 0;
    for (size_t i = 0; i < n; i++) {
        want[i] = (float)g[i];
        n_clipped += fabsf(x[i]) > c;
    }
    cr_expect(n_clipped > n / 4 && n_clipped < 3 * n / 4, "%zu of %zu clipped", n_clipped, n);
    clamp_backward(dy, x, n, c);
    /* piecewise linear: the differences are exact up to ~1e-10 */
    EXPECT_CLOSE(dy, want, n, 1e-8, 1e-6, "dx vs FD");
    td_free(x);
    td_free(dy);
    td_free(xd);
    td_free(dyd);
    td_free(g);
    td_free(want);
    EXPECT_NO_LEAKS();
}

Test(clamp, nan_passes_forward_and_gets_no_gradient)
{
    float x[3] = { NAN, 3.0f, -0.5f }, y[3], dy[3] = { 1, 1, 1 };
    clamp_forward(y, x, 3, 1.0f);
    cr_expect(isnan(y[0]) && y[1] == 1.0f && y[2] == -0.5f, "clamp(NaN, 3, -0.5) = %g %g %g", y[0], y[1], y[2]);
    clamp_backward(dy, x, 3, 1.0f);
    cr_expect(dy[0] == 0 && dy[1] == 0 && dy[2] == 1, "gradient %g %g %g, want 0 0 1", dy[0], dy[1], dy[2]);
    memcpy(y, x, sizeof y);
    clamp_forward(y, y, 3, 1.0f);   /* in place */
    cr_expect(isnan(y[0]) && y[1] == 1.0f && y[2] == -0.5f, "in place: %g %g %g", y[0], y[1], y[2]);
}

/* tests/test_gelu.c - GELU (core/ops/gelu.h) against PyTorch (gelu.h5 from
 * tests/ref/fixtures_vision.py) and central finite differences in double
 * of the erf form; in place and 1 vs 2 threads bit for bit; core/ops/verf.h's
 * vector erf and exp against its portable ones, and both against libm where
 * libm is the glibc they copy. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/gelu.h"
#include "core/ops/verf.h"
#include "tests/fixture.h"

#include <gnu/libc-version.h>
#include <string.h>

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

/* about a million floats spread over every bit pattern (NaNs, infinities,
 * subnormals and every branch of erff and expf included) */
static float *strided_floats(size_t *n)
{
    const uint64_t stride = 4099;
    *n = (size_t)(((UINT64_C(1) << 32) + stride - 1) / stride) + 4;
    float *x = td_malloc(*n * sizeof(float));
    size_t i = 0;
    for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += stride) x[i++] = verf_f((uint32_t)u);
    const float ends[] = { 0.0f, -0.0f, INFINITY, -INFINITY };
    for (size_t j = 0; j < 4; j++) x[i++] = ends[j];
    *n = i;
    return x;
}

Test(gelu, vector_erf_and_exp_equal_the_portable_ones)
{
    size_t n;
    float *x = strided_floats(&n), *dy = fixture_rand(n, 40, -1, 1), *dx = fixture_rand(n, 41, -1, 1);
    float *y = td_malloc(n * sizeof(float)), *want_y = td_malloc(n * sizeof(float));
    float *want_dx = td_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        /* gelu.c's formulas on the portable erf and exp */
        const float xi = x[i], cdf = 0.5f * (1.0f + verf1(xi * 0.70710678118654752440f));
        want_y[i] = xi * cdf;
        want_dx[i] = fmaf(dy[i], fmaf(xi, 0.39894228040143267794f * vexpf1(-0.5f * xi * xi), cdf), dx[i]);
    }
    gelu_forward(y, x, n);
    gelu_backward(dx, dy, x, n);
    /* a NaN x gives a NaN either way, whose payload is whichever NaN operand
     * the compiler put first */
    size_t bad_y = 0, bad_dx = 0;
    for (size_t i = 0; i < n; i++) {
        bad_y += !(isnan(y[i]) && isnan(want_y[i])) && verf_u(y[i]) != verf_u(want_y[i]);
        bad_dx += !(isnan(dx[i]) && isnan(want_dx[i])) && verf_u(dx[i]) != verf_u(want_dx[i]);
    }
    cr_expect_eq(bad_y, 0, "gelu_forward differs from the portable formula on %zu of %zu inputs", bad_y, n);
    cr_expect_eq(bad_dx, 0, "gelu_backward differs from the portable formula on %zu of %zu inputs", bad_dx, n);
#if defined(__AVX512F__)
    size_t bad_erf = 0, bad_exp = 0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        float e[16], p[16];
        _mm512_storeu_ps(e, verf16(_mm512_loadu_ps(x + i)));
        _mm512_storeu_ps(p, vexpf16(_mm512_loadu_ps(x + i)));
        for (size_t j = 0; j < 16; j++) {
            bad_erf += verf_u(e[j]) != verf_u(verf1(x[i + j]));
            bad_exp += verf_u(p[j]) != verf_u(vexpf1(x[i + j]));
        }
    }
    cr_expect_eq(bad_erf, 0, "verf16 and verf1 differ on %zu of %zu inputs", bad_erf, n);
    cr_expect_eq(bad_exp, 0, "vexpf16 and vexpf1 differ on %zu of %zu inputs", bad_exp, n);
#endif
    float *arrs[] = { x, dy, dx, y, want_y, want_dx };
    for (size_t i = 0; i < 6; i++) td_free(arrs[i]);
    EXPECT_NO_LEAKS();
}

/* verf.h copies glibc 2.36's erff and its FMA expf: where that is the libm
 * (and the CPU has FMA, so libm picks __expf_fma), every bit must agree.
 * GELU's results are then those of the libm GELU it replaced. */
Test(gelu, erf_and_exp_equal_glibc_2_36)
{
    if (strcmp(gnu_get_libc_version(), "2.36") != 0 || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("avx2"))
        cr_skip_test("libm is glibc %s (verf.h copies 2.36 on FMA CPUs)", gnu_get_libc_version());
    size_t n;
    float *x = strided_floats(&n);
    size_t bad_erf = 0, bad_exp = 0, first_erf = n, first_exp = n;
    for (size_t i = 0; i < n; i++) {
        if (verf_u(verf1(x[i])) != verf_u(erff(x[i])) && bad_erf++ == 0) first_erf = i;
        if (verf_u(vexpf1(x[i])) != verf_u(expf(x[i])) && bad_exp++ == 0) first_exp = i;
    }
    cr_expect_eq(bad_erf, 0, "verf1 differs from libm erff on %zu of %zu inputs, first %a", bad_erf, n,
                 first_erf < n ? (double)x[first_erf] : 0.0);
    cr_expect_eq(bad_exp, 0, "vexpf1 differs from libm expf on %zu of %zu inputs, first %a", bad_exp, n,
                 first_exp < n ? (double)x[first_exp] : 0.0);
    td_free(x);
    EXPECT_NO_LEAKS();
}

/* tests/test_rope.c - rotary position embedding (core/ops/rope.h) against
 * PyTorch running HF Llama's rotate-half formula (rope.h5 from
 * tests/ref/fixtures_ops.py, cos/sin tables computed in float32 as HF does),
 * a naive double rotation and central finite differences; arbitrary and
 * offset positions, several heads, 1 vs 2 threads bit for bit.
 *
 * The reference of a double rotation uses the op's own float32 cos/sin table
 * (checked against HF's separately): the table is the float32 contract, and
 * a double-precision angle would differ by pos * ulp(inv_freq), ~1e-4 at
 * position 4000, which is what HF itself computes too. */
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/rope.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(rope, .init = setup, .fini = teardown);

static const char *const FX = "rope.h5";

/* y = R(pos) x in double with the op's table: pairs (i, i + hd/2).
 * sgn = -1 rotates back (the transpose). */
static void naive_rope(double *y, const double *x, const int32_t *pos, const RopeTable *t,
                       size_t N, size_t nh, size_t hd, double sgn)
{
    const size_t half = hd / 2;
    for (size_t r = 0; r < N; r++)
        for (size_t h = 0; h < nh; h++) {
            const double *xv = x + (r * nh + h) * hd;
            double *yv = y + (r * nh + h) * hd;
            for (size_t i = 0; i < half; i++) {
                double c = t->cos[(size_t)pos[r] * half + i], s = sgn * t->sin[(size_t)pos[r] * half + i];
                yv[i] = xv[i] * c - xv[i + half] * s;
                yv[i + half] = xv[i + half] * c + xv[i] * s;
            }
        }
}

Test(rope, table_matches_hf_float32)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 4, "rope.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], hd = (size_t)dims[2], max_pos = (size_t)dims[3], half = hd / 2;
        float *theta = fixture_case_f32(FX, c, "theta", NULL);
        int32_t *pos = fixture_case_i32(FX, c, "pos", NULL);
        float *cos_ref = fixture_case_f32(FX, c, "cos", NULL), *sin_ref = fixture_case_f32(FX, c, "sin", NULL);
        RopeTable t;
        rope_table_init(&t, max_pos, hd, theta[0]);
        cr_expect_eq(t.half, half, "table half = %zu", t.half);
        float *cs = td_malloc(N * half * sizeof(float)), *sn = td_malloc(N * half * sizeof(float));
        for (size_t r = 0; r < N; r++)
            for (size_t i = 0; i < half; i++) {
                cs[r * half + i] = t.cos[(size_t)pos[r] * half + i];
                sn[r * half + i] = t.sin[(size_t)pos[r] * half + i];
            }
        /* Same float32 angle (inv_freq from powf and torch's pow agree here,
         * pos * inv_freq is one rounding in both); cosf/sinf and torch's
         * cos/sin may differ by 1 ulp: 2e-7 absolute on values in [-1, 1]. */
        char what[48];
        snprintf(what, sizeof what, "cos table, case %d (hd=%zu)", c, hd);
        EXPECT_CLOSE(cs, cos_ref, N * half, 2e-7, 0, what);
        snprintf(what, sizeof what, "sin table, case %d (hd=%zu)", c, hd);
        EXPECT_CLOSE(sn, sin_ref, N * half, 2e-7, 0, what);
        rope_table_free(&t);
        rope_table_free(&t);   /* safe twice */
        td_free(dims);
        td_free(theta);
        td_free(pos);
        td_free(cos_ref);
        td_free(sin_ref);
        td_free(cs);
        td_free(sn);
    }
    EXPECT_NO_LEAKS();
}

Test(rope, forward_and_backward_match_torch_rotate_half)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t N = (size_t)dims[0], nh = (size_t)dims[1], hd = (size_t)dims[2];
        const size_t max_pos = (size_t)dims[3], n = N * nh * hd;
        float *theta = fixture_case_f32(FX, c, "theta", NULL);
        int32_t *pos = fixture_case_i32(FX, c, "pos", NULL);
        float *x = fixture_case_f32(FX, c, "x", NULL), *dy = fixture_case_f32(FX, c, "dy", NULL);
        float *y_ref = fixture_case_f32(FX, c, "y", NULL), *dx_ref = fixture_case_f32(FX, c, "dx", NULL);
        RopeTable t;
        rope_table_init(&t, max_pos, hd, theta[0]);
        rope_forward(x, pos, &t, N, nh, hd);     /* in place */
        rope_backward(dy, pos, &t, N, nh, hd);   /* in place: dy becomes dx */
        /* x c -/+ x' s with |x| <= 1: two products and a sum in float (~1
         * ulp each) plus a possible 1-ulp difference of cos/sin against
         * torch: 1e-6 absolute. */
        char what[64];
        snprintf(what, sizeof what, "y, case %d (N=%zu heads=%zu hd=%zu)", c, N, nh, hd);
        EXPECT_CLOSE(x, y_ref, n, 1e-6, 0, what);
        snprintf(what, sizeof what, "dx, case %d", c);
        EXPECT_CLOSE(dy, dx_ref, n, 1e-6, 0, what);
        rope_table_free(&t);
        td_free(dims);
        td_free(theta);
        td_free(pos);
        td_free(x);
        td_free(dy);
        td_free(y_ref);
        td_free(dx_ref);
    }
    EXPECT_NO_LEAKS();
}

Test(rope, forward_matches_naive_double_at_any_position)
{
    static const size_t shapes[][3] = { { 1, 1, 2 }, { 7, 3, 8 }, { 40, 2, 64 }, { 5, 4, 128 } };   /* N, heads, hd */
    const size_t max_pos = 4096;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], nh = shapes[s][1], hd = shapes[s][2], n = N * nh * hd;
        RopeTable t;
        rope_table_init(&t, max_pos, hd, s % 2 ? 10000.0 : 500000.0);
        int32_t *pos = td_malloc(N * sizeof(int32_t));
        for (size_t r = 0; r < N; r++) pos[r] = (int32_t)((r * 2654435761u + 17 * s) % max_pos);
        pos[0] = (int32_t)max_pos - 1;   /* the last position of the table */
        float *x = fixture_rand(n, 10 + s, -2, 2);
        double *xd = td_malloc(n * sizeof(double)), *yd = td_malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) xd[i] = x[i];
        naive_rope(yd, xd, pos, &t, N, nh, hd, 1.0);
        float *want = td_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) want[i] = (float)yd[i];
        rope_forward(x, pos, &t, N, nh, hd);
        /* float: a c - b s, two roundings of products <= 2 and one of the
         * sum: <= 2 ulp of 4, 1e-6 absolute */
        char what[64];
        snprintf(what, sizeof what, "y, N=%zu heads=%zu hd=%zu", N, nh, hd);
        EXPECT_CLOSE(x, want, n, 1e-6, 0, what);
        rope_table_free(&t);
        td_free(pos);
        td_free(x);
        td_free(xd);
        td_free(yd);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; const int32_t *pos; const RopeTable *t; size_t N, nh, hd; } RopeFd;

static double rope_loss(const double *x, void *vctx)
{
    const RopeFd *c = vctx;
    size_t n = c->N * c->nh * c->hd;
    double *y = td_malloc(n * sizeof(double)), L = 0;
    naive_rope(y, x, c->pos, c->t, c->N, c->nh, c->hd, 1.0);
    for (size_t i = 0; i < n; i++) L += c->dy[i] * y[i];
    td_free(y);
    return L;
}

Test(rope, backward_matches_finite_differences)
{
    static const size_t shapes[][3] = { { 1, 1, 2 }, { 5, 3, 8 }, { 9, 2, 16 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t N = shapes[s][0], nh = shapes[s][1], hd = shapes[s][2], n = N * nh * hd;
        RopeTable t;
        rope_table_init(&t, 2048, hd, 10000.0);
        int32_t *pos = td_malloc(N * sizeof(int32_t));
        for (size_t r = 0; r < N; r++) pos[r] = (int32_t)(1000 + 37 * r);   /* offset positions */
        float *x = fixture_rand(n, 20 + s, -1, 1), *dy = fixture_rand(n, 21 + s, -1, 1);
        double *xd = td_malloc(n * sizeof(double)), *dyd = td_malloc(n * sizeof(double));
        double *g = td_malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            xd[i] = x[i];
            dyd[i] = dy[i];
        }
        RopeFd ctx = { dyd, pos, &t, N, nh, hd };
        fixture_fd(g, rope_loss, &ctx, xd, n, 1e-3);   /* linear in x: any h is exact */
        float *want = td_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) want[i] = (float)g[i];
        /* rope_backward transforms dy in place into dx = R^T dy (it does not
         * accumulate: the gradient buffer is the input) */
        rope_backward(dy, pos, &t, N, nh, hd);
        /* float rotation of O(1) values: 1 ulp-ish, 1e-6 absolute */
        char what[64];
        snprintf(what, sizeof what, "dx vs FD, N=%zu heads=%zu hd=%zu", N, nh, hd);
        EXPECT_CLOSE(dy, want, n, 1e-6, 0, what);
        rope_table_free(&t);
        td_free(pos);
        td_free(x);
        td_free(dy);
        td_free(xd);
        td_free(dyd);
        td_free(g);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

Test(rope, rows_follow_their_own_positions)
{
    /* each row is rotated by its own position only: rotating rows one by one
     * with their positions gives the bits of rotating the batch, and the
     * rotation at position 0 is the identity */
    const size_t N = 6, nh = 2, hd = 16, w = nh * hd;
    RopeTable t;
    rope_table_init(&t, 512, hd, 10000.0);
    int32_t pos[6] = { 0, 511, 3, 3, 100, 1 };
    float *x = fixture_rand(N * w, 30, -1, 1), *batch = fixture_copy(x, N * w), *row = td_malloc(w * sizeof(float));
    rope_forward(batch, pos, &t, N, nh, hd);
    for (size_t r = 0; r < N; r++) {
        for (size_t i = 0; i < w; i++) row[i] = x[r * w + i];
        rope_forward(row, &pos[r], &t, 1, nh, hd);
        char what[48];
        snprintf(what, sizeof what, "row %zu (pos %d) alone vs in the batch", r, pos[r]);
        EXPECT_BITWISE(row, batch + r * w, w, what);
    }
    EXPECT_BITWISE(batch, x, w, "position 0 is the identity");
    /* rows 2 and 3 share a position but not values: they must differ from x */
    cr_expect(fixture_first_diff(batch + 2 * w, x + 2 * w, w) < w, "position 3 rotates");
    rope_table_free(&t);
    td_free(x);
    td_free(batch);
    td_free(row);
    EXPECT_NO_LEAKS();
}

Test(rope, backward_inverts_forward)
{
    const size_t N = 11, nh = 3, hd = 64, n = N * nh * hd;
    RopeTable t;
    rope_table_init(&t, 4096, hd, 500000.0);
    int32_t pos[11];
    for (size_t r = 0; r < N; r++) pos[r] = (int32_t)(r * 397 % 4096);
    float *x = fixture_rand(n, 40, -1, 1), *y = fixture_copy(x, n);
    rope_forward(y, pos, &t, N, nh, hd);
    rope_backward(y, pos, &t, N, nh, hd);
    /* R^T R = I up to float rounding of the two rotations and of cos^2 +
     * sin^2 in the table (~1e-7): 1e-6 absolute on values in [-1, 1] */
    EXPECT_CLOSE(y, x, n, 1e-6, 0, "R(pos)^T R(pos) x");
    rope_table_free(&t);
    td_free(x);
    td_free(y);
    EXPECT_NO_LEAKS();
}

Test(rope, two_threads_bit_identical)
{
    const size_t N = 40, nh = 2, hd = 16, n = N * nh * hd;   /* 40 rows, grain 16: split */
    RopeTable t;
    rope_table_init(&t, 1024, hd, 10000.0);
    int32_t pos[40];
    for (size_t r = 0; r < N; r++) pos[r] = (int32_t)(500 + r);
    float *x = fixture_rand(n, 50, -1, 1);
    float *y1 = fixture_copy(x, n), *y2 = fixture_copy(x, n);
    float *d1 = fixture_copy(x, n), *d2 = fixture_copy(x, n);
    rope_forward(y1, pos, &t, N, nh, hd);
    rope_backward(d1, pos, &t, N, nh, hd);
    pool_init(2);
    rope_forward(y2, pos, &t, N, nh, hd);
    rope_backward(d2, pos, &t, N, nh, hd);
    pool_init(1);
    EXPECT_BITWISE(y2, y1, n, "forward, 2 threads vs 1");
    EXPECT_BITWISE(d2, d1, n, "backward, 2 threads vs 1");
    rope_table_free(&t);
    td_free(x);
    td_free(y1);
    td_free(y2);
    td_free(d1);
    td_free(d2);
    EXPECT_NO_LEAKS();
}

/* YaRN and linear scaling (rope.h): inv_freq, the cos/sin table with the
 * attention factor, and DeepSeek's softmax-scale factor against
 * transformers' _compute_yarn_parameters run in float32 by PyTorch
 * (rope_scaled.h5 from tests/ref/fixtures_ops.py; the formula is
 * tests/ref/hf/model.py rope_inv_freq). */
static double td_max_d(double a, double b) { return a > b ? a : b; }

Test(rope, scaled_tables_match_hf_yarn)
{
    const char *fx = "rope_scaled.h5";
    int n_cases = (int)fixture_attr(fx, "n_cases");
    cr_expect_geq(n_cases, 7, "rope_scaled.h5 has %d cases", n_cases);
    size_t inv_exact = 0, inv_total = 0;
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(fx, c, "dims", NULL);
        const size_t hd = (size_t)dims[0], max_pos = (size_t)dims[1], half = hd / 2;
        size_t np_;
        int32_t *pos = fixture_case_i32(fx, c, "pos", &np_);
        /* params: theta, type (1 linear, 2 yarn), factor, original, beta_fast, beta_slow, mscale,
         * mscale_all_dim, attention_factor, no_truncate; read in double (h5 float64) */
        float *pf = fixture_case_f32(fx, c, "params", NULL);
        float *inv_ref = fixture_case_f32(fx, c, "inv", NULL);
        float *cos_ref = fixture_case_f32(fx, c, "cos", NULL), *sin_ref = fixture_case_f32(fx, c, "sin", NULL);
        float *att = fixture_case_f32(fx, c, "att", NULL), *smf = fixture_case_f32(fx, c, "smf", NULL);
        RopeScaling s = { pf[1] == 1 ? ROPE_SCALING_LINEAR : ROPE_SCALING_YARN, pf[2], (int)pf[3], pf[4], pf[5],
                          pf[6], pf[7], pf[8], pf[9] != 0 };
        /* the float32 copies of the parameters are exact: each is a short decimal of a
         * float-representable value, except mscale 0.707 and attention_factor 1.3, which
         * the fixture's float64 carries; restore those exactly */
        if (s.mscale != 0) s.mscale = (double)(float)0.707 == s.mscale ? 0.707 : s.mscale;
        if (s.attention_factor != 0) s.attention_factor = (double)(float)1.3 == s.attention_factor ? 1.3 : s.attention_factor;
        double theta = pf[0];
        float *inv = td_malloc(half * sizeof(float));
        rope_inv_freq(inv, hd, theta, &s, max_pos);
        char what[64];
        snprintf(what, sizeof what, "inv_freq, case %d (hd=%zu)", c, hd);
        EXPECT_CLOSE(inv, inv_ref, half, 0, 1.2e-7, what);
        for (size_t i = 0; i < half; i++) inv_exact += inv[i] == inv_ref[i];
        inv_total += half;
        cr_expect(fabs(rope_attention_factor(&s) - att[0]) <= 1e-7 * att[0], "case %d: attention factor %.9g, HF %.9g",
                  c, rope_attention_factor(&s), (double)att[0]);
        cr_expect(fabs(rope_softmax_scale_factor(&s) - smf[0]) <= 1e-7 * smf[0],
                  "case %d: softmax scale factor %.9g, HF %.9g", c, rope_softmax_scale_factor(&s), (double)smf[0]);
        RopeTable t;
        rope_table_init_scaled(&t, max_pos, hd, theta, &s);
        float *cs = td_malloc(np_ * half * sizeof(float)), *sn = td_malloc(np_ * half * sizeof(float));
        for (size_t r = 0; r < np_; r++)
            for (size_t i = 0; i < half; i++) {
                cs[r * half + i] = t.cos[(size_t)pos[r] * half + i];
                sn[r * half + i] = t.sin[(size_t)pos[r] * half + i];
            }
        /* Same float32 angle where inv_freq is the same float: cosf/sinf vs torch differ by at most
         * 1 ulp of values in [-att, att].  Where glibc's powf and torch's vectorised pow differ by
         * an ulp (a few of the 168 frequencies, at theta 50000), the angles pos * inv differ by
         * pos * |d inv| plus one rounding of the product: that much more. */
        double worst = 0;
        size_t wi = 0;
        for (size_t r = 0; r < np_; r++)
            for (size_t i = 0; i < half; i++) {
                double tol = 2.5e-7 * att[0];
                if (inv[i] != inv_ref[i]) {
                    float f = (float)pos[r] * inv_ref[i];
                    tol += att[0] * (fabs((double)pos[r] * ((double)inv[i] - inv_ref[i])) +
                                     2 * (nextafterf(fabsf(f), INFINITY) - fabsf(f)));
                }
                double e = td_max_d(fabs(cs[r * half + i] - cos_ref[r * half + i]),
                                    fabs(sn[r * half + i] - sin_ref[r * half + i])) / tol;
                if (!(e <= worst)) {
                    worst = e;
                    wi = r * half + i;
                }
            }
        cr_expect(worst <= 1.0, "scaled cos/sin table, case %d (hd=%zu): worst index %zu: cos %.9g want %.9g, sin %.9g "
                  "want %.9g (%.3g of tol)", c, hd, wi, cs[wi], cos_ref[wi], sn[wi], sin_ref[wi], worst);
        rope_table_free(&t);
        td_free(cs);
        td_free(sn);
        td_free(inv);
        td_free(dims);
        td_free(pos);
        td_free(pf);
        td_free(inv_ref);
        td_free(cos_ref);
        td_free(sin_ref);
        td_free(att);
        td_free(smf);
    }
    cr_log_info("rope yarn: %zu of %zu inv_freq values bit-equal to PyTorch's", inv_exact, inv_total);
    /* unscaled is the plain table, and NULL too */
    RopeTable a, b;
    RopeScaling none = { 0 };
    rope_table_init(&a, 64, 16, 10000.0);
    rope_table_init_scaled(&b, 64, 16, 10000.0, &none);
    cr_expect(!memcmp(a.cos, b.cos, 64 * 8 * sizeof(float)) && !memcmp(a.sin, b.sin, 64 * 8 * sizeof(float)),
              "type none gives the plain table");
    cr_expect_eq(rope_softmax_scale_factor(&none), 1.0);
    cr_expect_eq(rope_attention_factor(NULL), 1.0);
    rope_table_free(&a);
    rope_table_free(&b);
    EXPECT_NO_LEAKS();
}

/* tests/test_embedding.c - token embedding lookup (core/ops/embedding.h) against
 * PyTorch (embedding.h5 from tests/ref/fixtures_ops.py), a naive in-order
 * float accumulation, and central finite differences; repeated ids. */
#include "core/common.h"
#include "core/ops/embedding.h"
#include "core/pool.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(embedding, .init = setup, .fini = teardown);

static const char *const FX = "embedding.h5";

Test(embedding, forward_matches_torch_exactly)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    cr_expect_geq(n_cases, 2, "embedding.h5 has %d cases", n_cases);
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t d = (size_t)dims[1], N = (size_t)dims[2];
        float *table = fixture_case_f32(FX, c, "table", NULL), *y_ref = fixture_case_f32(FX, c, "y", NULL);
        int32_t *ids = fixture_case_i32(FX, c, "ids", NULL);
        float *y = td_malloc(N * d * sizeof(float));
        embedding_forward(y, ids, table, N, d);
        /* a lookup copies: exact */
        char what[48];
        snprintf(what, sizeof what, "y, case %d", c);
        EXPECT_BITWISE(y, y_ref, N * d, what);
        td_free(dims);
        td_free(table);
        td_free(y_ref);
        td_free(ids);
        td_free(y);
    }
    EXPECT_NO_LEAKS();
}

Test(embedding, backward_accumulates_torch_gradients_with_repeated_ids)
{
    int n_cases = (int)fixture_attr(FX, "n_cases");
    for (int c = 0; c < n_cases; c++) {
        int32_t *dims = fixture_case_i32(FX, c, "dims", NULL);
        const size_t V = (size_t)dims[0], d = (size_t)dims[1], N = (size_t)dims[2];
        float *dy = fixture_case_f32(FX, c, "dy", NULL), *dt_ref = fixture_case_f32(FX, c, "dtable", NULL);
        int32_t *ids = fixture_case_i32(FX, c, "ids", NULL);
        cr_expect_eq(ids[0], ids[1], "fixture: ids 0 and 1 should repeat");
        float *dtable = fixture_rand(V * d, 10 + (uint64_t)c, -1, 1);   /* non-zero: += */
        float *want = td_malloc(V * d * sizeof(float));
        for (size_t i = 0; i < V * d; i++) want[i] = (float)((double)dtable[i] + dt_ref[i]);
        embedding_backward(dtable, dy, ids, N, d);
        /* each element is the start value plus <= 3 float additions of O(1)
         * terms (the repeated ids): a few ulp of O(1), 1e-6 absolute. */
        char what[48];
        snprintf(what, sizeof what, "dtable, case %d", c);
        EXPECT_CLOSE(dtable, want, V * d, 1e-6, 0, what);
        td_free(dims);
        td_free(dy);
        td_free(dt_ref);
        td_free(ids);
        td_free(dtable);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

/* The contract: tokens added in order t = 0..N-1 for every column, in float. */
static void naive_backward(float *dtable, const float *dy, const int32_t *ids, size_t N, size_t d)
{
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < d; j++) dtable[(size_t)ids[t] * d + j] += dy[t * d + j];
}

Test(embedding, backward_is_in_token_order_and_thread_count_independent)
{
    const size_t V = 13, d = 70, N = 50;   /* d = 70 columns: split over 2 threads */
    int32_t ids[50];
    for (size_t t = 0; t < N; t++) ids[t] = (int32_t)((t * 7) % 5);   /* 5 rows, each ~10 times */
    ids[N - 1] = 12;                                                  /* the last row once */
    float *dy = fixture_rand(N * d, 20, -1, 1);
    /* start values of very different magnitude, so the order of additions shows */
    float *start = fixture_rand(V * d, 21, -1000, 1000);
    float *want = fixture_copy(start, V * d);
    naive_backward(want, dy, ids, N, d);
    for (int threads = 1; threads <= 2; threads++) {
        pool_init(threads);
        float *dtable = fixture_copy(start, V * d);
        embedding_backward(dtable, dy, ids, N, d);
        char what[64];
        snprintf(what, sizeof what, "%d thread(s) vs in-order float sum", threads);
        EXPECT_BITWISE(dtable, want, V * d, what);
        /* rows 5..11 are never looked up: untouched */
        EXPECT_BITWISE(dtable + 5 * d, start + 5 * d, 7 * d, "rows without tokens");
        td_free(dtable);
    }
    pool_init(1);
    td_free(dy);
    td_free(start);
    td_free(want);
    EXPECT_NO_LEAKS();
}

typedef struct { const double *dy; const int32_t *ids; size_t N, d; } EmbFd;

static double emb_loss(const double *table, void *vctx)
{
    const EmbFd *c = vctx;
    double L = 0;
    for (size_t t = 0; t < c->N; t++)
        for (size_t j = 0; j < c->d; j++) L += c->dy[t * c->d + j] * table[(size_t)c->ids[t] * c->d + j];
    return L;
}

Test(embedding, backward_matches_finite_differences)
{
    static const size_t shapes[][3] = { { 11, 5, 9 }, { 3, 1, 7 }, { 40, 33, 20 } };   /* V, d, N */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const size_t V = shapes[s][0], d = shapes[s][1], N = shapes[s][2];
        int32_t *ids = td_malloc(N * sizeof(int32_t));
        for (size_t t = 0; t < N; t++) ids[t] = (int32_t)((t * t + 3 * t) % V);   /* repeats */
        ids[N - 1] = ids[0];
        float *dy = fixture_rand(N * d, 30 + s, -1, 1), *dtable = fixture_rand(V * d, 40 + s, -1, 1);
        double *p = td_malloc(V * d * sizeof(double)), *g = td_malloc(V * d * sizeof(double));
        double *dyd = td_malloc(N * d * sizeof(double));
        float *table = fixture_rand(V * d, 50 + s, -1, 1);
        for (size_t i = 0; i < V * d; i++) p[i] = table[i];
        for (size_t i = 0; i < N * d; i++) dyd[i] = dy[i];
        EmbFd ctx = { dyd, ids, N, d };
        fixture_fd(g, emb_loss, &ctx, p, V * d, 1e-3);   /* linear in table: any h is exact */
        float *want = td_malloc(V * d * sizeof(float));
        for (size_t i = 0; i < V * d; i++) want[i] = (float)(dtable[i] + g[i]);
        embedding_backward(dtable, dy, ids, N, d);
        /* sums of a few O(1) floats: 1e-6 absolute */
        char what[48];
        snprintf(what, sizeof what, "dtable vs FD, V=%zu d=%zu N=%zu", V, d, N);
        EXPECT_CLOSE(dtable, want, V * d, 1e-6, 1e-6, what);
        td_free(ids);
        td_free(dy);
        td_free(dtable);
        td_free(p);
        td_free(g);
        td_free(dyd);
        td_free(table);
        td_free(want);
    }
    EXPECT_NO_LEAKS();
}

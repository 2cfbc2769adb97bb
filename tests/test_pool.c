/* tests/test_pool.c - the thread pool (core/pool.h): static contiguous
 * ranges on multiples of the grain, every item exactly once, and a region
 * started right after pool_init (regression: a helper that had not started
 * running yet missed that region and pool_for waited for it forever). */
#include "core/common.h"
#include "core/pool.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>

static void teardown(void) { pool_free(); }

TestSuite(pool, .fini = teardown, .timeout = 30);

struct rec { _Atomic int hits[1000]; size_t begin[8], end[8]; _Atomic int calls; };

static void record(void *vc, size_t b, size_t e, int tid)
{
    struct rec *r = vc;
    for (size_t i = b; i < e; i++) atomic_fetch_add(&r->hits[i], 1);
    r->begin[tid] = b;
    r->end[tid] = e;
    atomic_fetch_add(&r->calls, 1);
}

Test(pool, region_right_after_init_runs_every_item_once)
{
    static struct rec r;
    for (int it = 0; it < 100; it++) {
        pool_init(2);   /* no pause: the helper may not be running yet */
        memset(&r, 0, sizeof r);
        pool_for(1000, 1, record, &r);
        int bad = 0;
        for (size_t i = 0; i < 1000; i++) bad += atomic_load(&r.hits[i]) != 1;
        cr_assert_eq(bad, 0, "iteration %d: %d items not run exactly once", it, bad);
        cr_assert_eq(atomic_load(&r.calls), 2, "iteration %d: %d ranges", it, atomic_load(&r.calls));
        pool_free();
    }
}

Test(pool, ranges_are_contiguous_on_grain_multiples)
{
    static struct rec r;
    pool_init(2);
    cr_expect_eq(pool_threads(), 2);
    memset(&r, 0, sizeof r);
    pool_for(100, 16, record, &r);   /* 7 units of 16: thread 0 takes 3, thread 1 takes 4 */
    cr_expect_eq(r.begin[0], 0);
    cr_expect_eq(r.end[0], 48);
    cr_expect_eq(r.begin[1], 48);
    cr_expect_eq(r.end[1], 100);
    memset(&r, 0, sizeof r);
    pool_for(10, 16, record, &r);    /* fewer items than the grain: one call, serial */
    cr_expect_eq(atomic_load(&r.calls), 1);
    cr_expect_eq(r.end[0], 10);
    pool_init(1);
    cr_expect_eq(pool_threads(), 1);
    memset(&r, 0, sizeof r);
    pool_for(100, 16, record, &r);
    cr_expect_eq(atomic_load(&r.calls), 1);
    cr_expect_eq(r.end[0], 100);
}

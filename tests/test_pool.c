/* tests/test_pool.c - the thread pool (core/pool.h): static contiguous
 * ranges on multiples of the grain, every item exactly once, and a region
 * started right after pool_init (regression: a helper that had not started
 * running yet missed that region and pool_for waited for it forever). */
#include "core/common.h"
#include "core/pool.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

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

/* Regression: a helper preempted between seeing region g and claiming its
 * chunk, while the caller runs g, g+1, ... itself, must not claim a chunk
 * of an older region afterwards (it ran the chunk twice, with the wrong
 * region's parameters, and ended the current region early).  The hook
 * sleeps a random few microseconds right there in the helper. */
static _Atomic unsigned g_seed = 1;
static void preempt(void)
{
    unsigned s = atomic_fetch_add(&g_seed, 2654435761u);
    if ((s >> 7) % 3 == 0) usleep((s >> 11) % 60);
}

struct tagged { _Atomic int hits[64]; int region; _Atomic int bad; };

static void count_region(void *vc, size_t b, size_t e, int tid)
{
    (void)tid;
    struct tagged *c = vc;
    for (size_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

Test(pool, preempted_helper_never_runs_a_chunk_twice)
{
    pool_init(2);
    pool_test_hook = preempt;
    int bad = 0;
    for (int region = 0; region < 20000 && !bad; region++) {
        struct tagged c;   /* on the stack: a late helper would write a dead frame */
        memset(&c, 0, sizeof c);
        pool_for(64, 1, count_region, &c);
        for (int i = 0; i < 64; i++) bad += atomic_load(&c.hits[i]) != 1;
        cr_expect_eq(bad, 0, "region %d: %d items not run exactly once", region, bad);
    }
    pool_test_hook = NULL;
}

/* tests/test_pool.c - the thread pool (core/pool.h): fixed contiguous
 * ranges on multiples of the grain, every item exactly once, a region
 * started right after pool_init (regression: a helper that had not started
 * running yet missed that region and pool_for waited for it forever), a
 * slow helper leaving its share to the caller and a slow caller its share
 * to the helper, and a preempted helper that
 * never claims a range of a region that is over. */
#include "core/common.h"
#include "core/pool.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static void teardown(void) { pool_free(); }

/* A bound for a hung region, not a speed limit: 20000 regions with random
 * sleeps take ~10 s on a quiet 2-core machine and several times that on a
 * loaded one (the suite ran past 30 s at load average 20). */
TestSuite(pool, .fini = teardown, .timeout = 300);

#define MAX_RANGES 64

struct rec {
    _Atomic int hits[1000];
    _Atomic int calls;
    size_t begin[MAX_RANGES], end[MAX_RANGES];
    int tid[MAX_RANGES];
};

static void record(void *vc, size_t b, size_t e, int tid)
{
    struct rec *r = vc;
    for (size_t i = b; i < e; i++) atomic_fetch_add(&r->hits[i], 1);
    int k = atomic_fetch_add(&r->calls, 1);
    if (k < MAX_RANGES) {
        r->begin[k] = b;
        r->end[k] = e;
        r->tid[k] = tid;
    }
}

/* The recorded ranges, sorted by begin, tile [0, n) exactly as expected[]. */
static void expect_ranges(struct rec *r, size_t n, const size_t *bounds, int n_ranges)
{
    int calls = atomic_load(&r->calls);
    cr_assert_eq(calls, n_ranges, "%d ranges, expected %d", calls, n_ranges);
    for (int i = 0; i < calls; i++)   /* insertion sort by begin */
        for (int j = i; j > 0 && r->begin[j] < r->begin[j - 1]; j--) {
            size_t b = r->begin[j], e = r->end[j];
            r->begin[j] = r->begin[j - 1];
            r->end[j] = r->end[j - 1];
            r->begin[j - 1] = b;
            r->end[j - 1] = e;
        }
    for (int i = 0; i < calls; i++) {
        cr_expect_eq(r->begin[i], bounds[i], "range %d begins at %zu, expected %zu", i, r->begin[i], bounds[i]);
        cr_expect_eq(r->end[i], bounds[i + 1], "range %d ends at %zu, expected %zu", i, r->end[i], bounds[i + 1]);
    }
    cr_expect_eq(r->end[calls - 1], n);
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
        cr_assert_eq(atomic_load(&r.calls), 8, "iteration %d: %d ranges (4 per thread)", it,
                     atomic_load(&r.calls));
        pool_free();
    }
}

Test(pool, ranges_are_contiguous_on_grain_multiples)
{
    static struct rec r;
    pool_init(2);
    cr_expect_eq(pool_threads(), 2);
    memset(&r, 0, sizeof r);
    /* 7 units of 16 < 8 ranges: one unit each, the last one short */
    pool_for(100, 16, record, &r);
    static const size_t b7[] = { 0, 16, 32, 48, 64, 80, 96, 100 };
    expect_ranges(&r, 100, b7, 7);
    memset(&r, 0, sizeof r);
    /* 25 units of 4 over 8 ranges: 3 or 4 units each, at units 25 c / 8 */
    pool_for(100, 4, record, &r);
    static const size_t b8[] = { 0, 12, 24, 36, 48, 60, 72, 84, 100 };
    expect_ranges(&r, 100, b8, 8);
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

/* A helper that stalls (a vCPU taken by the host) while the caller works:
 * the caller runs every range itself, not just its own static share.  The
 * stall is not a fixed time, which a loaded machine could outlast on the
 * caller's side too: the helper, in the hook it calls on seeing the region
 * (before it claims anything), waits until all 8 ranges have run.  A pool
 * that left the helper a share would never get there: the helper gives up
 * after 10 s and runs its share, and the counts below fail. */
static pthread_t g_main;
static struct rec *g_stall_rec;
static _Atomic int g_stall_timed_out, g_caller_stalled;

/* The stall: until n ranges have run, or 10 s (then g_stall_timed_out). */
static void stall_until(int n)
{
    const double t0 = td_now();
    while (atomic_load(&g_stall_rec->calls) < n) {
        if (td_now() - t0 > 10) {
            atomic_store(&g_stall_timed_out, 1);
            return;
        }
        usleep(100);
    }
}

static void stall_helpers(void)
{
    if (!pthread_equal(pthread_self(), g_main)) stall_until(8);
}

/* The other way round: the caller stalls on its first range (the hook
 * runs right after a claim) and the helper, done with its own share,
 * takes the rest of the caller's: 7 of the 8 ranges, or all 8 when it got
 * to the caller's share before the caller's first claim (a busy host).
 * Without stealing it runs its own 4 and the caller's stall times out. */
static void stall_caller(void)
{
    if (pthread_equal(pthread_self(), g_main) && !atomic_exchange(&g_caller_stalled, 1)) stall_until(7);
}

/* 1000 items on two threads with hook set; every item must run once, in 8
 * ranges, with no stall timed out; returns how many ranges thread tid ran. */
static int ranges_by(void (*hook)(void), int tid)
{
    static struct rec r;
    pool_init(2);
    g_main = pthread_self();
    memset(&r, 0, sizeof r);
    g_stall_rec = &r;
    atomic_store(&g_caller_stalled, 0);
    atomic_store(&g_stall_timed_out, 0);
    pool_test_hook = hook;
    pool_for(1000, 1, record, &r);
    pool_test_hook = NULL;
    int bad = 0, by = 0, calls = atomic_load(&r.calls);
    for (size_t i = 0; i < 1000; i++) bad += atomic_load(&r.hits[i]) != 1;
    for (int i = 0; i < calls; i++) by += r.tid[i] == tid;
    cr_expect_eq(bad, 0, "%d items not run exactly once", bad);
    cr_expect_eq(calls, 8);
    cr_expect(!atomic_load(&g_stall_timed_out), "the other thread did not run its ranges within 10 s of the stall");
    return by;
}

Test(pool, a_stalled_helper_leaves_its_share_to_the_caller)
{
    const int n = ranges_by(stall_helpers, 0);
    cr_expect_eq(n, 8, "the caller ran %d of 8 ranges while the helper stalled", n);
}

Test(pool, a_stalled_caller_leaves_its_share_to_the_helper)
{
    const int n = ranges_by(stall_caller, 1);
    cr_expect(n >= 7, "the helper ran %d of 8 ranges while the caller stalled", n);
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

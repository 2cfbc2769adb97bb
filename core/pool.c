/* core/pool.c - thread pool: fixed chunks claimed dynamically,
 * spin-then-futex waiting.
 *
 * A region's work [0, n) is cut into n_chunks chunks with fixed boundaries
 * (range_of: a function of n, the grain and the thread count only), about
 * POOL_SPLIT per thread.  Every thread of the region, the caller included,
 * claims the next unclaimed chunk until none is left.  So a thread that is
 * slow (descheduled by a busy host, its vCPU stolen, asleep in futex_wait)
 * never holds the others up by more than one chunk, and since the
 * boundaries do not move, results are the same whoever runs a chunk.
 *
 * The claim word packs (region, next chunk, chunk count) into 64 bits, so a
 * claim is one compare-and-swap that can only succeed for the current
 * region while chunks of it are left. */
#include "core/pool.h"
#include "core/common.h"

#include <cblas.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_MAX 64
#define POOL_SPLIT 4        /* chunks per thread of pool_for, at most */
#define POOL_CHUNKS_MAX 0xFFFF

static struct {
    int n;                          /* threads including the caller */
    pthread_t tid[POOL_MAX];
    _Atomic unsigned gen;           /* bumped to start a region (the futex word) */
    unsigned gen0;                  /* gen when the helpers were created */
    _Atomic uint64_t work;          /* region << 32 | next chunk << 16 | chunk count */
    _Atomic int done;               /* chunks of the current region finished */
    _Atomic int stop;
    _Atomic int sleepers;           /* helpers inside futex_wait */
    PoolFn fn;
    void *ctx;
    size_t n_items, grain, n_chunks;
    long spin_ns;                   /* how long a helper spins before sleeping */
} g_pool = { .n = 1 };

static _Thread_local int t_in_region;

void (*pool_test_hook)(void) = NULL;

static void futex_wait(_Atomic unsigned *addr, unsigned val)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic unsigned *addr)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Range of chunk c of nc: boundaries on multiples of grain, deterministic. */
static void range_of(size_t c, size_t nc, size_t n, size_t grain, size_t *b, size_t *e)
{
    size_t units = (n + grain - 1) / grain;
    size_t ub = units * c / nc, ue = units * (c + 1) / nc;
    *b = td_min(ub * grain, n);
    *e = td_min(ue * grain, n);
}

/* Claims the next chunk of region g; false when region g is over or has no
 * chunk left.  Only the current region's word can match: a helper that read
 * g and was then preempted while the caller ran regions g, g+1, ... claims
 * nothing afterwards.  A claimed chunk is not done, so region g cannot
 * finish and its parameters, read after the claim, are g's. */
static bool claim(unsigned g, size_t *c)
{
    uint64_t w = atomic_load(&g_pool.work);
    for (;;) {
        const unsigned next = (unsigned)(w >> 16) & 0xFFFF, count = (unsigned)w & 0xFFFF;
        if ((unsigned)(w >> 32) != g || next >= count) return false;
        if (atomic_compare_exchange_weak(&g_pool.work, &w, w + (1u << 16))) {
            *c = next;
            return true;
        }
    }
}

/* Thread t runs chunks of region g until none is left. */
static void run_chunks(unsigned g, int t)
{
    size_t c;
    while (claim(g, &c)) {
        if (pool_test_hook) pool_test_hook();   /* tests: a preemption inside a region */
        size_t b, e;
        range_of(c, g_pool.n_chunks, g_pool.n_items, g_pool.grain, &b, &e);
        if (b < e) g_pool.fn(g_pool.ctx, b, e, t);
        atomic_fetch_add_explicit(&g_pool.done, 1, memory_order_release);
    }
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    /* Not a fresh load of gen: a region may already have been started
     * (and be waiting for this helper) before the thread got to run. */
    unsigned seen = g_pool.gen0;
    t_in_region = 1;
    for (;;) {
        unsigned g;
        double t0 = td_now();
        long spins = 0;
        while ((g = atomic_load_explicit(&g_pool.gen, memory_order_acquire)) == seen) {
            if (atomic_load(&g_pool.stop)) return NULL;
            cpu_relax();
            if ((++spins & 255) == 0 && (td_now() - t0) * 1e9 > (double)g_pool.spin_ns) {
                atomic_fetch_add(&g_pool.sleepers, 1);
                futex_wait(&g_pool.gen, seen);
                atomic_fetch_sub(&g_pool.sleepers, 1);
            }
        }
        seen = g;
        if (atomic_load(&g_pool.stop)) return NULL;
        if (pool_test_hook) pool_test_hook();   /* tests: a preemption right here */
        run_chunks(g, t);
    }
}

int pool_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void pool_free(void)
{
    if (g_pool.n <= 1) { g_pool.n = 1; return; }
    atomic_store(&g_pool.stop, 1);
    atomic_fetch_add(&g_pool.gen, 1);
    futex_wake_all(&g_pool.gen);
    for (int t = 1; t < g_pool.n; t++) pthread_join(g_pool.tid[t], NULL);
    atomic_store(&g_pool.stop, 0);
    g_pool.n = 1;
}

void pool_init(int n_threads)
{
    pool_free();
    if (n_threads < 1) n_threads = 1;
    if (n_threads > POOL_MAX) n_threads = POOL_MAX;
    /* One owner of the cores: BLAS runs single-threaded inside our regions. */
    openblas_set_num_threads(1);
    const char *s = getenv("TANDEM_SPIN_US");
    g_pool.spin_ns = (s ? atol(s) : 200) * 1000L;
    g_pool.n = n_threads;
    g_pool.gen0 = atomic_load(&g_pool.gen);   /* read by the helpers at start */
    for (int t = 1; t < n_threads; t++) {
        int rc = pthread_create(&g_pool.tid[t], NULL, worker, (void *)(intptr_t)t);
        TD_CHECK(rc == 0, "pthread_create failed (%d)", rc);
    }
}

int pool_threads(void) { return g_pool.n; }

void pool_for(size_t n, size_t grain, PoolFn fn, void *ctx)
{
    pool_for_split(n, grain, POOL_SPLIT, fn, ctx);
}

void pool_for_split(size_t n, size_t grain, size_t split, PoolFn fn, void *ctx)
{
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (g_pool.n <= 1 || t_in_region || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    const size_t units = (n + grain - 1) / grain;
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    g_pool.n_items = n;
    g_pool.grain = grain;
    g_pool.n_chunks = td_min(td_min(units, (size_t)g_pool.n * td_max(split, 1)), POOL_CHUNKS_MAX);
    atomic_store(&g_pool.done, 0);
    const unsigned g = atomic_load(&g_pool.gen) + 1;
    atomic_store(&g_pool.work, (uint64_t)g << 32 | g_pool.n_chunks);
    atomic_store(&g_pool.gen, g);
    /* A helper that bumped sleepers after this load sees the new gen inside
     * futex_wait and does not sleep (both atomics are sequentially
     * consistent), so the wake-up syscall is only paid when one sleeps. */
    if (atomic_load(&g_pool.sleepers) > 0) futex_wake_all(&g_pool.gen);
    t_in_region = 1;
    run_chunks(g, 0);
    t_in_region = 0;
    while (atomic_load_explicit(&g_pool.done, memory_order_acquire) < (int)g_pool.n_chunks) cpu_relax();
}

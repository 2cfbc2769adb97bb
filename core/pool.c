/* core/pool.c - static-partition thread pool with spin-then-futex waiting.
 *
 * A region's work is cut into one chunk per thread (range_of: fixed
 * boundaries).  Chunk t belongs to helper t, but whoever claims it first
 * runs it: the caller, once its own chunk is done, claims every chunk not
 * yet taken.  So a helper that is slow to wake (descheduled on a busy
 * machine, or asleep in futex_wait) never stalls the caller; and since the
 * boundaries do not move, results are the same whoever runs a chunk.
 * claim[t] holds the last region (generation) chunk t was claimed for. */
#include "core/pool.h"
#include "core/common.h"

#include <cblas.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_MAX 64

static struct {
    int n;                          /* threads including the caller */
    pthread_t tid[POOL_MAX];
    _Atomic unsigned gen;           /* bumped to start a region */
    unsigned gen0;                  /* gen when the helpers were created */
    _Atomic unsigned claim[POOL_MAX];  /* region each chunk was last claimed for */
    _Atomic int done;               /* chunks of the current region finished */
    _Atomic int stop;
    _Atomic int sleepers;           /* helpers inside futex_wait */
    PoolFn fn;
    void *ctx;
    size_t n_items, grain;
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

/* Range of thread t: boundaries on multiples of grain, deterministic. */
static void range_of(int t, int nt, size_t n, size_t grain, size_t *b, size_t *e)
{
    size_t units = (n + grain - 1) / grain;
    size_t ub = units * (size_t)t / (size_t)nt, ue = units * (size_t)(t + 1) / (size_t)nt;
    *b = td_min(ub * grain, n);
    *e = td_min(ue * grain, n);
}

static void run_share(int t)
{
    size_t b, e;
    range_of(t, g_pool.n, g_pool.n_items, g_pool.grain, &b, &e);
    if (b < e) g_pool.fn(g_pool.ctx, b, e, t);
    atomic_fetch_add_explicit(&g_pool.done, 1, memory_order_release);
}

/* Claims chunk t for region g; true when this thread should run it.  Only
 * a claim older than g can be replaced: a helper that read g and was then
 * preempted while the caller ran regions g, g+1, ... must not roll chunk
 * t's claim back (it would run the chunk twice, with another region's
 * parameters).  So a claim succeeds only while region g is the current one
 * and chunk t is not done, and the region's parameters, read after it, are
 * g's: region g cannot finish before a claimed chunk of g is done. */
static bool claim(int t, unsigned g)
{
    unsigned c = atomic_load(&g_pool.claim[t]);
    return (int)(g - c) > 0 && atomic_compare_exchange_strong(&g_pool.claim[t], &c, g);
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
        if (claim(t, g)) run_share(t);
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
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (g_pool.n <= 1 || t_in_region || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    g_pool.n_items = n;
    g_pool.grain = grain;
    atomic_store(&g_pool.done, 0);
    unsigned g = atomic_fetch_add(&g_pool.gen, 1) + 1;
    /* A helper that bumped sleepers after this load sees the new gen inside
     * futex_wait and does not sleep (both atomics are sequentially
     * consistent), so the wake-up syscall is only paid when one sleeps. */
    if (atomic_load(&g_pool.sleepers) > 0) futex_wake_all(&g_pool.gen);
    t_in_region = 1;
    run_share(0);
    for (int t = 1; t < g_pool.n; t++)   /* chunks no helper has taken yet */
        if (claim(t, g)) run_share(t);
    t_in_region = 0;
    while (atomic_load_explicit(&g_pool.done, memory_order_acquire) < g_pool.n) cpu_relax();
}

/* core/pool.c - thread pool: fixed chunks, each thread's share claimed
 * locally and the rest stolen, spin-then-futex waiting.
 *
 * A region's work [0, n) is cut into n_chunks chunks with fixed boundaries
 * (range_of: a function of n, the grain and the thread count only), about
 * POOL_SPLIT per thread.  Thread t's share is the contiguous chunks
 * [n_chunks t / nt, n_chunks (t + 1) / nt); it claims them front to back
 * from its own claim word, a cache line no other thread writes unless it
 * steals, then steals the others' unclaimed chunks from the back.  So a
 * thread that is slow (descheduled by a busy host, its vCPU stolen, asleep
 * in futex_wait) never holds the others up by more than one chunk, and
 * since the boundaries do not move, results are the same whoever runs a
 * chunk.  Claims and completions stay in the claiming thread's own cache
 * lines: a claim word shared by all threads cost a cache-line transfer per
 * claim (~0.2 us here), which decoding, at ~40 regions a token, paid on
 * every chunk.
 *
 * A claim word packs (region, next chunk, end chunk) into 64 bits, so a
 * claim is one compare-and-swap that can only succeed for the current
 * region while chunks of it are left; a done word packs (region, chunks
 * this thread finished in it), written only by its thread. */
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
    _Atomic int stop;
    _Atomic int sleepers;           /* helpers inside futex_wait */
    PoolFn fn;
    void *ctx;
    size_t n_items, grain, n_chunks;
    long spin_ns;                   /* how long a helper spins before sleeping */
} g_pool = { .n = 1 };

/* Per thread, each on its own lines (the adjacent-line prefetcher pairs
 * lines): its share's claim word, region << 32 | next << 16 | end, and its
 * done word, region << 32 | chunks it finished in that region. */
#define POOL_LINE 128
static struct {
    _Alignas(POOL_LINE) _Atomic uint64_t work;
    _Alignas(POOL_LINE) _Atomic uint64_t done;
} g_slot[POOL_MAX];

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

/* Claims a chunk of region g from thread v's share: the front one when v
 * is the caller's own share, else (stealing) the back one; false when
 * region g is over or the share has no chunk left.  Only the current
 * region's word can match: a helper that read g and was then preempted
 * while the caller ran regions g, g+1, ... claims nothing afterwards.  A
 * claimed chunk is not done, so region g cannot finish and its parameters,
 * read after the claim, are g's. */
static bool claim(unsigned g, int v, bool own, size_t *c)
{
    _Atomic uint64_t *word = &g_slot[v].work;
    uint64_t w = atomic_load_explicit(word, memory_order_relaxed);
    for (;;) {
        const unsigned next = (unsigned)(w >> 16) & 0xFFFF, end = (unsigned)w & 0xFFFF;
        if ((unsigned)(w >> 32) != g || next >= end) return false;
        if (atomic_compare_exchange_weak(word, &w, own ? w + (1u << 16) : w - 1)) {
            *c = own ? next : end - 1;
            return true;
        }
    }
}

/* Thread t runs chunks of region g, its own share first, until none is
 * left anywhere. */
static void run_chunks(unsigned g, int t)
{
    const int nt = g_pool.n;
    unsigned mine = 0;
    size_t c;
    for (;;) {
        bool got = claim(g, t, true, &c);
        for (int k = 1; k < nt && !got; k++) got = claim(g, (t + k) % nt, false, &c);
        if (!got) return;
        if (pool_test_hook) pool_test_hook();   /* tests: a preemption inside a region */
        size_t b, e;
        range_of(c, g_pool.n_chunks, g_pool.n_items, g_pool.grain, &b, &e);
        if (b < e) g_pool.fn(g_pool.ctx, b, e, t);
        atomic_store_explicit(&g_slot[t].done, (uint64_t)g << 32 | ++mine, memory_order_release);
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
    const size_t nc = td_min(td_min(units, (size_t)g_pool.n * td_max(split, 1)), POOL_CHUNKS_MAX);
    const int nt = g_pool.n;
    g_pool.n_chunks = nc;
    const unsigned g = atomic_load(&g_pool.gen) + 1;
    for (int t = 0; t < nt; t++)
        atomic_store_explicit(&g_slot[t].work,
                              (uint64_t)g << 32 | (nc * (size_t)t / (size_t)nt) << 16 | nc * (size_t)(t + 1) / (size_t)nt,
                              memory_order_relaxed);
    atomic_store(&g_pool.gen, g);   /* publishes the parameters and the claim words */
    /* A helper that bumped sleepers after this load sees the new gen inside
     * futex_wait and does not sleep (both atomics are sequentially
     * consistent), so the wake-up syscall is only paid when one sleeps. */
    if (atomic_load(&g_pool.sleepers) > 0) futex_wake_all(&g_pool.gen);
    t_in_region = 1;
    run_chunks(g, 0);
    t_in_region = 0;
    /* every chunk is claimed: wait for the ones still running elsewhere */
    for (;;) {
        size_t done = 0;
        for (int t = 0; t < nt; t++) {
            const uint64_t w = atomic_load_explicit(&g_slot[t].done, memory_order_acquire);
            if ((unsigned)(w >> 32) == g) done += (unsigned)w;
        }
        if (done == nc) return;
        cpu_relax();
    }
}

/* core/pool.h - the project's thread pool: every multi-threaded region of
 * tandem (GEMMs included) runs on it.
 *
 * One pool per process, owning the cores it is given: the calling thread is
 * worker 0 and n-1 helper threads join it.  pool_for cuts [0, n) into
 * contiguous chunks, a few per thread, whose boundaries depend only on n,
 * the grain and the thread count; each thread runs its own contiguous
 * share of them, then takes what is left of the others' (from the back),
 * so a thread slowed by the host does not hold the region up.  Every
 * kernel in tandem computes each output element in a fixed order whatever
 * the split, so results depend neither on who ran a chunk nor (except for
 * the BLAS backward of non-AVX-512 builds, core/ops/gemm.h) on the thread count.
 *
 * Helpers spin for a short, bounded time after a region (so back-to-back
 * regions, as in decoding, do not pay a wake-up each) and then sleep on a
 * futex; no other threading runtime runs beside them: OpenBLAS (the
 * backward of builds without AVX-512, and benchmarks) is set to one thread
 * and called from inside pool regions on disjoint slices.
 *
 * Not reentrant: a pool_for issued from inside a region runs serially on the
 * calling thread.  Call from one thread (the main thread) only.
 */
#ifndef TANDEM_CORE_POOL_H
#define TANDEM_CORE_POOL_H

#include <stddef.h>

typedef void (*PoolFn)(void *ctx, size_t begin, size_t end, int tid);

/* Start the pool with n_threads >= 1 (1: no helper threads).  Also pins
 * OpenBLAS to one thread.  Safe to call again to resize. */
void pool_init(int n_threads);
/* Join the helper threads; safe twice and without pool_init. */
void pool_free(void);
/* Threads in the pool (1 before pool_init). */
int pool_threads(void);
/* Cores this process may use (sched_getaffinity), at least 1. */
int pool_cores(void);

/* Run fn(ctx, begin, end, tid) over [0, n) cut into
 * min(units, 4 pool_threads()) contiguous ranges of whole units of grain
 * items (units = ceil(n / grain); the last range ends at n), each called
 * once, by whichever thread claims it (tid: 0 the caller, 1.. a helper;
 * a thread runs one range at a time).  Returns when every range is done.
 * Serial (one call over [0, n)) with one thread, inside a region, or when
 * n <= grain. */
void pool_for(size_t n, size_t grain, PoolFn fn, void *ctx);

/* pool_for with at most split ranges per thread (split >= 1): for work
 * whose every call has a fixed cost, such as a BLAS call that packs its
 * operands, where fewer, larger ranges are cheaper. */
void pool_for_split(size_t n, size_t grain, size_t split, PoolFn fn, void *ctx);

/* Tests only: when set, helpers call it between seeing a region and
 * claiming their chunk (to simulate preemption there). */
extern void (*pool_test_hook)(void);

#endif

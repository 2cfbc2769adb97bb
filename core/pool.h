/* core/pool.h - the project's thread pool: every multi-threaded region of
 * tandem (GEMMs included) runs on it.
 *
 * One pool per process, owning the cores it is given: the calling thread is
 * worker 0 and n-1 helper threads join it.  pool_for splits [0, n) into one
 * contiguous range per thread (static, so which thread computes what depends
 * only on n and the thread count).  Every kernel in tandem computes each
 * output element in a fixed order whatever the split, so results do not
 * depend on the thread count either.
 *
 * Helpers spin for a short, bounded time after a region (so back-to-back
 * regions, as in decoding, do not pay a wake-up each) and then sleep on a
 * futex; no other threading runtime runs beside them: OpenBLAS (used only by
 * builds without AVX-512, and by benchmarks) is set to one
 * thread and called from inside pool regions on disjoint slices.
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

/* Run fn(ctx, begin, end, tid) over [0, n) split into pool_threads()
 * contiguous ranges whose boundaries are multiples of grain (the last range
 * takes the rest).  Returns when every range is done.  Ranges that would be
 * empty are not called. */
void pool_for(size_t n, size_t grain, PoolFn fn, void *ctx);

/* Tests only: when set, helpers call it between seeing a region and
 * claiming their chunk (to simulate preemption there). */
extern void (*pool_test_hook)(void);

#endif

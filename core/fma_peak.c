/* core/fma_peak.c - the measured FMA peak (core/fma_peak.h).
 *
 * Each work unit runs FMA_ITERS iterations of FMA_CHAINS independent chains
 *     acc_c = fma(acc_c, m, a)        (m = 1 - 2^-20, a = 2^-20)
 * whose fixed point is 1, so the values stay normal (no denormal or
 * overflow slow paths) whatever the iteration count; each unit starts from
 * its own values (the compiler may not fold identical calls of a pure
 * function into one).  Twelve chains hide
 * the FMA latency (4 cycles) on two FMA ports; the result is summed into
 * a sink so the loop is not dead code.  Units are spread over the pool;
 * the rate is all units' FLOPs over the region's wall time. */
#include "core/fma_peak.h"
#include "core/common.h"
#include "core/pool.h"

#include <math.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define FMA_CHAINS 12
#define FMA_ITERS  (1 << 20)

#if defined(__AVX512F__)
#define FMA_LANES 16
static float unit(float seed)
{
    const __m512 m = _mm512_set1_ps(1.0f - 0x1p-20f), a = _mm512_set1_ps(0x1p-20f);
    __m512 acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    for (int i = 0; i < FMA_ITERS; i++)
#pragma GCC unroll 16   /* every chain in its own register */
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    __m512 s = acc[0];
    for (int c = 1; c < FMA_CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define FMA_LANES 8
static float unit(float seed)
{
    const __m256 m = _mm256_set1_ps(1.0f - 0x1p-20f), a = _mm256_set1_ps(0x1p-20f);
    __m256 acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
    for (int i = 0; i < FMA_ITERS; i++)
#pragma GCC unroll 16   /* every chain in its own register */
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    __m256 s = acc[0];
    for (int c = 1; c < FMA_CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}
#else
#define FMA_LANES 1
static float unit(float seed)
{
    const float m = 1.0f - 0x1p-20f, a = 0x1p-20f;
    float acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = seed + (float)c;
    for (int i = 0; i < FMA_ITERS; i++)
#pragma GCC unroll 16   /* every chain in its own register */
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = fmaf(acc[c], m, a);
    float s = 0;
    for (int c = 0; c < FMA_CHAINS; c++) s += acc[c];
    return s;
}
#endif

static volatile float g_sink;

static void run_units(void *ctx, size_t b, size_t e, int tid)
{
    (void)ctx;
    (void)tid;
    float s = 0;
    for (size_t u = b; u < e; u++) s += unit((float)u);   /* a new start each: no call is folded */
    g_sink = s;
}

int fma_peak_lanes(void) { return FMA_LANES; }

double fma_peak_gflops(void)
{
    /* 4 units per thread: a thread the host slows leaves its units to the
     * others (pool.h), so a run measures the cores this process gets */
    const size_t units = 4 * (size_t)pool_threads();
    const double flops = 2.0 * FMA_LANES * FMA_CHAINS * (double)FMA_ITERS * (double)units;
    double best = 0, start = td_now();
    for (int rep = 0; rep < 6 || (rep < 200 && td_now() - start < 0.3); rep++) {
        double t0 = td_now();
        pool_for(units, 1, run_units, NULL);
        double dt = td_now() - t0;
        if (rep && dt > 0) best = fmax(best, flops / dt * 1e-9);   /* rep 0 warms up (clocks, pages) */
    }
    return best;
}

/* bench/gemm_bw.c - GFLOP/s of the backward GEMM products (core/ops/gemm.h)
 * beside the forward kernel and OpenBLAS.
 *
 *   gemm_bw [--full] [--single] [--reps R] [--sample-ms T] [--shape M,N,K]...
 *
 * For each shape (x: [M, K], W: [N, K], dy: [M, N]) it times
 *   fwd    gemm_xwt          y = x W^T        (the reference speed)
 *   dx     gemm_dx_acc       dx += dy W
 *   dW     gemm_dw_acc       dW += dy^T x
 *   bdx    cblas_sgemm on pool row slices, one BLAS thread per slice
 *   bdW    (the backward of tandem before its own kernels, reproduced here)
 * with 1 pool thread and with all cores (pool_cores()), and, with all
 * cores, one cblas_sgemm call with OpenBLAS itself threaded (odx, odW;
 * pool set to 1 thread meanwhile so that nothing else spins); --single
 * times the single-threaded columns only.
 * Each number is the best of R samples (default 7) after a warm-up call; a
 * sample times enough back-to-back calls to last about T ms (default 10).
 * The variants take turns sample by sample, so that load from other
 * processes on a shared machine hits them alike; single-threaded variants
 * are timed by the thread's CPU time (immune to preemption), threaded ones
 * by the wall clock.  GFLOP/s = 2 M N K / s / 1e9.
 * Default shapes: a representative subset of the training shapes plus small
 * and odd ones; --full runs M in {1024, 2048, 4096} x N x K in
 * {64, 128, 192, 256, 384, 512, 1024, 2048}.
 */
#include "core/common.h"
#include "core/ops/gemm.h"
#include "core/pool.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    size_t M, N, K;
    float *x, *W, *P, *dy, *y, *dx, *dW;
} Bench;

typedef void (*BenchFn)(Bench *b);

static void run_fwd(Bench *b)
{
    const GemmW W = gemm_w(DTYPE_F32, b->P, b->N, b->K);
    gemm_xwt(b->y, b->N, b->x, b->K, &W, b->M);
}
static void run_dx(Bench *b) { gemm_dx_acc(b->dx, b->K, b->dy, b->N, b->W, b->M, b->N, b->K); }
static void run_dw(Bench *b) { gemm_dw_acc(b->dW, b->dy, b->N, b->x, b->K, b->M, b->N, b->K); }

/* The former backward: BLAS on disjoint pool slices. */
static void blas_dx_rows(void *vb, size_t m0, size_t m1, int tid)
{
    (void)tid;
    Bench *b = vb;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(m1 - m0), (int)b->K, (int)b->N,
                1.0f, b->dy + m0 * b->N, (int)b->N, b->W, (int)b->K, 1.0f, b->dx + m0 * b->K, (int)b->K);
}

static void blas_dw_rows(void *vb, size_t n0, size_t n1, int tid)
{
    (void)tid;
    Bench *b = vb;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(n1 - n0), (int)b->K, (int)b->M,
                1.0f, b->dy + n0, (int)b->N, b->x, (int)b->K, 1.0f, b->dW + n0 * b->K, (int)b->K);
}

static void run_bdx(Bench *b) { pool_for(b->M, 16, blas_dx_rows, b); }
static void run_bdw(Bench *b) { pool_for(b->N, 16, blas_dw_rows, b); }
static void run_odx(Bench *b) { blas_dx_rows(b, 0, b->M, 0); }
static void run_odw(Bench *b) { blas_dw_rows(b, 0, b->N, 0); }

static int g_reps = 7;
static int g_single;   /* --single: the single-threaded columns only */
static double g_sample_s = 0.01;

typedef struct { BenchFn fn; int pool_threads, blas_threads; } Variant;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of one sample: n calls timed together.  A
 * single-threaded variant runs entirely on this thread and is timed by its
 * CPU time, so that it does not count time the scheduler gave to other
 * processes; threaded variants are timed by the wall clock. */
static double sample(const Variant *v, Bench *b, int n)
{
    const int cpu = v->pool_threads == 1 && v->blas_threads == 1;
    double t0 = cpu ? thread_cpu_s() : td_now();
    for (int i = 0; i < n; i++) v->fn(b);
    return ((cpu ? thread_cpu_s() : td_now()) - t0) / n;
}

static void set_threads(const Variant *v, int *cur_pool)
{
    if (*cur_pool != v->pool_threads) pool_init(v->pool_threads);
    *cur_pool = v->pool_threads;
    openblas_set_num_threads(v->blas_threads);
}

/* Best GFLOP/s of each variant.  The variants are interleaved round by
 * round (g_reps rounds), so that load from other processes on a shared
 * machine hits all of them alike; each sample repeats the call until it
 * lasts about g_sample_s. */
static void best_gflops(const Variant *v, int n_var, Bench *b, double *gflops)
{
    double flops = gemm_flops(b->M, b->N, b->K), best[16];
    int inner[16], cur_pool = -1;
    for (int i = 0; i < n_var; i++) {
        set_threads(&v[i], &cur_pool);
        double t = sample(&v[i], b, 1);   /* warm-up: page faults, scratch growth, caches */
        t = sample(&v[i], b, 1);
        inner[i] = t >= g_sample_s ? 1 : (int)td_min((size_t)(g_sample_s / (t + 1e-9)) + 1, 100000);
        best[i] = 1e30;
    }
    for (int r = 0; r < g_reps; r++)
        for (int i = 0; i < n_var; i++) {
            set_threads(&v[i], &cur_pool);
            double t = sample(&v[i], b, inner[i]);
            if (t < best[i]) best[i] = t;
        }
    openblas_set_num_threads(1);
    for (int i = 0; i < n_var; i++) gflops[i] = flops > 0 ? flops / best[i] * 1e-9 : 0;
}

static void bench_shape(size_t M, size_t N, size_t K, int nt)
{
    Bench b = { M, N, K, NULL, NULL, NULL, NULL, NULL, NULL, NULL };
    size_t mk = td_max(M * K, 1), nk = td_max(N * K, 1), mn = td_max(M * N, 1);
    b.x = td_malloc(mk * sizeof(float));
    b.W = td_malloc(nk * sizeof(float));
    b.P = td_malloc(td_max(gemm_packed_bytes(DTYPE_F32, N, K), 64));
    b.dy = td_malloc(mn * sizeof(float));
    b.y = td_malloc(mn * sizeof(float));
    b.dx = td_calloc(mk * sizeof(float));
    b.dW = td_calloc(nk * sizeof(float));
    uint32_t s = 12345;
    for (size_t i = 0; i < mk; i++) b.x[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    for (size_t i = 0; i < nk; i++) b.W[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    for (size_t i = 0; i < mn; i++) b.dy[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    gemm_pack(b.P, DTYPE_F32, b.W, N, K);

    const Variant v[12] = {
        { run_fwd, 1, 1 }, { run_dx, 1, 1 }, { run_dw, 1, 1 }, { run_bdx, 1, 1 }, { run_bdw, 1, 1 },
        { run_fwd, nt, 1 }, { run_dx, nt, 1 }, { run_dw, nt, 1 }, { run_bdx, nt, 1 }, { run_bdw, nt, 1 },
        { run_odx, 1, nt }, { run_odw, 1, nt },
    };
    double r[12] = { 0 };
    best_gflops(v, g_single ? 5 : 12, &b, r);
    printf("%5zu %5zu %5zu |%6.0f %5.0f %5.0f %5.0f %5.0f |%6.0f %5.0f %5.0f %5.0f %5.0f %5.0f %5.0f |"
           " %4.0f%% %4.0f%%\n",
           M, N, K, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
           r[0] > 0 ? 100 * r[1] / r[0] : 0, r[0] > 0 ? 100 * r[2] / r[0] : 0);
    fflush(stdout);
    td_free(b.x); td_free(b.W); td_free(b.P); td_free(b.dy); td_free(b.y); td_free(b.dx); td_free(b.dW);
}

int main(int argc, char **argv)
{
    static const size_t dims[] = { 64, 128, 192, 256, 384, 512, 1024, 2048 };
    static const size_t subset[][3] = {
        /* square N = K at M = 4096 and 1024 */
        { 4096, 64, 64 }, { 4096, 128, 128 }, { 4096, 192, 192 }, { 4096, 256, 256 },
        { 4096, 384, 384 }, { 4096, 512, 512 }, { 4096, 1024, 1024 }, { 4096, 2048, 2048 },
        { 1024, 64, 64 }, { 1024, 192, 192 }, { 1024, 512, 512 }, { 1024, 2048, 2048 },
        /* rectangular: FFN / experts (d x F), attention, lm_head */
        { 4096, 384, 192 }, { 4096, 192, 384 }, { 4096, 2048, 512 }, { 4096, 512, 2048 },
        { 2048, 1024, 64 }, { 2048, 64, 1024 }, { 4096, 256, 192 },
        /* router, expert batches, decode-sized and odd */
        { 4096, 8, 192 }, { 4096, 8, 1024 }, { 700, 384, 192 }, { 300, 192, 384 },
        { 13, 384, 192 }, { 5, 1024, 1024 }, { 1, 2048, 512 }, { 1000, 200, 333 },
    };
    int full = 0;
    size_t user[64][3], n_user = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--full")) full = 1;
        else if (!strcmp(argv[i], "--single")) g_single = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sample-ms") && i + 1 < argc) g_sample_s = atof(argv[++i]) * 1e-3;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_user < 64) {
            if (sscanf(argv[++i], "%zu,%zu,%zu", &user[n_user][0], &user[n_user][1], &user[n_user][2]) == 3)
                n_user++;
        } else {
            fprintf(stderr, "usage: gemm_bw [--full] [--single] [--reps R] [--sample-ms T] [--shape M,N,K]...\n");
            return 2;
        }
    }
    int nt = getenv("TANDEM_THREADS") ? atoi(getenv("TANDEM_THREADS")) : pool_cores();
    if (nt < 1) nt = 1;
    printf("gemm_bw: GFLOP/s, best of %d interleaved rounds; 1 thread | %d threads (pool), odx/odW = OpenBLAS "
           "with %d threads in one call\n", g_reps, nt, nt);
    printf("    M     N     K |  fwd1   dx1   dW1  bdx1  bdW1 |  fwdT   dxT   dWT  bdxT  bdWT   odx   odW |"
           "  dx/fwd dW/fwd (1 thread)\n");
    if (n_user)
        for (size_t s = 0; s < n_user; s++) bench_shape(user[s][0], user[s][1], user[s][2], nt);
    else if (full)
        for (size_t m = 1024; m <= 4096; m *= 2)
            for (size_t a = 0; a < 8; a++)
                for (size_t c = 0; c < 8; c++) bench_shape(m, dims[a], dims[c], nt);
    else
        for (size_t s = 0; s < sizeof subset / sizeof *subset; s++)
            bench_shape(subset[s][0], subset[s][1], subset[s][2], nt);
    gemm_scratch_free();
    pool_free();
    return 0;
}

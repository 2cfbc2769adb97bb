/* bench/membw.c - the machine's two roofs for bench/infer.sh, measured in
 * the same run as the engines they bound.
 *
 *   membw [--threads 2] [--mb 1024] [--seg-mb 64] [--reps 5] [--shape M,N,K]...
 *
 * Memory bandwidth: a streaming read (vector loads summed into registers)
 * of a --mb MiB buffer, far larger than any L3, on --threads threads of
 * tandem's pool (each thread a contiguous half of a segment).  The buffer
 * is written first so that every page is mapped, then read segment by
 * segment (--seg-mb each, timed separately: on a shared machine a preempted
 * thread spoils one short sample, not a whole pass), --reps passes, with 1,
 * 2, 4 and 8 sequential streams per thread read side by side (one stream
 * leaves the memory system idle: the decode GEMM, which reads four weight
 * panels at once, streams about twice as fast as a one-stream loop here).
 * Reported: the best sample per stream count, the best of those
 * (read_GBps), in GB/s (1e9 bytes).
 *
 * Decode read rate: y = W x over a --gemv-mb MiB matrix (K = 4096), the
 * access pattern of a batch-1 decode step, with tandem's gemm_xwt (M = 1,
 * the pool at --threads threads) and with cblas_sgemv (OpenBLAS at
 * --threads); best of 4 x --reps calls, GB/s of the matrix.  The same
 * matrix packed in bf16 and int8 (gemv_bf16_GBps, gemv_int8_GBps: GB/s of
 * the packed bytes, scales included) shows whether the narrow kernels
 * reach the rate the float32 one streams at.  roof_GBps is
 * the largest of read_GBps and these two: what this machine has been seen
 * to stream in this run, the bandwidth the decode bounds of bench/infer.sh
 * divide by.
 *
 * Compute: cblas_sgemm (row-major, C = A B^T as a linear layer computes it)
 * with OpenBLAS running --threads threads of its own (tandem's pool at one
 * thread meanwhile, so nothing else spins), for each --shape (default the
 * shapes below); each number is the best of 2 x --reps samples of about
 * 10 ms after a warm-up.  Beside it, tandem's forward kernel gemm_xwt on the
 * same shapes with the pool at --threads threads (OpenBLAS at one).
 * GFLOP/s = 2 M N K / s / 1e9.
 *
 * Prints one JSON line starting with {"bench":"membw".
 */
#include "core/common.h"
#include "core/ops/gemm.h"
#include "core/pool.h"

#include <cblas.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHAPES 16

volatile float g_sink;   /* keeps the reads observable */

typedef struct {
    const float *buf;
    size_t n;          /* floats of the segment being read */
    int streams;       /* concurrent sequential streams per thread */
    float sink[64];    /* one partial per thread (keeps the loads alive) */
} ReadCtx;

/* Sums [b, e) of c->buf, walked as c->streams contiguous sub-ranges read
 * side by side (one 64-byte line of each per iteration): several streams
 * keep more misses in flight than one, as the decode GEMM's four panels do. */
static void read_range(void *vc, size_t b, size_t e, int tid)
{
    ReadCtx *c = vc;
    const int S = c->streams;
    const size_t per = (e - b) / (size_t)S / 16 * 16;   /* floats per stream, whole lines */
    float s = 0;
#if defined(__AVX512F__)
    __m512 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_ps();
    for (size_t i = 0; i < per; i += 16)
        for (int j = 0; j < S; j++) acc[j & 7] = _mm512_add_ps(acc[j & 7], _mm512_load_ps(c->buf + b + (size_t)j * per + i));
    for (int j = 1; j < 8; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    s = _mm512_reduce_add_ps(acc[0]);
#else
    float acc[8][16] = { { 0 } };
    for (size_t i = 0; i < per; i += 16)
        for (int j = 0; j < S; j++)
            for (int l = 0; l < 16; l++) acc[j & 7][l] += c->buf[b + (size_t)j * per + i + l];
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 16; l++) s += acc[j][l];
#endif
    for (size_t i = b + per * (size_t)S; i < e; i++) s += c->buf[i];
    c->sink[tid & 63] += s;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    size_t M, N, K;
    float *A, *B, *C, *P;
} Gemm;

static void run_sgemm(Gemm *g)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->M, (int)g->N, (int)g->K, 1.0f, g->A, (int)g->K,
                g->B, (int)g->K, 0.0f, g->C, (int)g->N);
}

static void run_xwt(Gemm *g)
{
    const GemmW W = gemm_w(DTYPE_F32, g->P, g->N, g->K);
    gemm_xwt(g->C, g->N, g->A, g->K, &W, g->M);
}

/* Best GFLOP/s of 2 x reps samples of ~10 ms each, after a warm-up call. */
static double gflops_best(void (*fn)(Gemm *), Gemm *g, int reps)
{
    fn(g);
    double t0 = td_now();
    fn(g);
    double one = td_now() - t0;
    int calls = one > 0.01 ? 1 : (int)(0.01 / (one > 1e-7 ? one : 1e-7)) + 1;
    double best = 0;
    for (int r = 0; r < 2 * reps; r++) {
        t0 = td_now();
        for (int c = 0; c < calls; c++) fn(g);
        double s = td_now() - t0;
        double gf = gemm_flops(g->M, g->N, g->K) * calls / s / 1e9;
        if (gf > best) best = gf;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 5;
    size_t mb = 1024, seg_mb = 64, gemv_mb = 256;
    size_t shapes[MAX_SHAPES][3];
    int n_shapes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--seg-mb") && i + 1 < argc) seg_mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--gemv-mb") && i + 1 < argc) gemv_mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_shapes < MAX_SHAPES) {
            unsigned long M, N, K;
            if (sscanf(argv[++i], "%lu,%lu,%lu", &M, &N, &K) != 3 || !M || !N || !K) {
                fprintf(stderr, "membw: --shape M,N,K\n");
                return 2;
            }
            shapes[n_shapes][0] = M;
            shapes[n_shapes][1] = N;
            shapes[n_shapes][2] = K;
            n_shapes++;
        } else {
            fprintf(stderr, "usage: membw [--threads 2] [--mb 1024] [--seg-mb 64] [--gemv-mb 256] [--reps 5]\n"
                            "             [--shape M,N,K]...\n");
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (reps < 1) reps = 1;
    if (mb < 1) mb = 1;
    if (seg_mb < 1) seg_mb = 1;
    if (gemv_mb < 16) gemv_mb = 16;
    if (!n_shapes) {
        static const size_t dflt[][3] = { { 256, 1024, 512 }, { 512, 512, 512 } };
        for (int s = 0; s < 2; s++) memcpy(shapes[n_shapes++], dflt[s], sizeof dflt[s]);
    }

    /* ---- bandwidth: the buffer is read segment by segment (seg_mb each,
     * timed separately, so that a preempted thread spoils one short sample
     * and not a whole pass); a segment was last touched a whole buffer ago,
     * so it comes from DRAM.  Best sample per stream count; the roof is the
     * best over stream counts. */
    pool_init(threads);
    const int stream_counts[] = { 1, 2, 4, 8 };
    const int n_sc = (int)(sizeof stream_counts / sizeof stream_counts[0]);
    size_t total = mb << 18, seg = (seg_mb << 18) < total ? seg_mb << 18 : total;   /* floats */
    size_t n_seg = total / seg;
    float *buf = td_malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) buf[i] = (float)(i & 7) * 0.125f;
    ReadCtx rc = { 0 };
    double bw_sc[8], bw_med_sc[8], bw_best = 0, bw_med = 0;
    double *samp = td_malloc(((size_t)reps * n_seg + 1) * sizeof(double));
    for (int si = 0; si < n_sc; si++) {
        rc.streams = stream_counts[si];
        rc.n = seg;
        size_t ns = 0;
        for (int r = -1; r < reps; r++)   /* r = -1: warm-up pass */
            for (size_t g = 0; g < n_seg; g++) {
                rc.buf = buf + g * seg;
                double t0 = td_now();
                pool_for(seg, 4096, read_range, &rc);
                double dt = td_now() - t0;
                if (r >= 0) samp[ns++] = (double)seg * sizeof(float) / dt / 1e9;
            }
        qsort(samp, ns, sizeof(double), cmp_d);
        bw_sc[si] = samp[ns - 1];
        bw_med_sc[si] = samp[ns / 2];
        if (bw_sc[si] > bw_best) {
            bw_best = bw_sc[si];
            bw_med = bw_med_sc[si];
        }
    }
    td_free(samp);
    td_free(buf);

    /* ---- matrix-vector products over a matrix far larger than L3: what a
     * batch-1 decode step streams.  tandem's gemm_xwt with M = 1 (pool at
     * --threads) and cblas_sgemv (OpenBLAS at --threads); best of 4 --reps
     * calls, GB/s of the matrix. */
    double gv_xwt = 0, gv_blas = 0, gv_dt[3] = { 0, 0, 0 };
    static const Dtype gv_types[3] = { DTYPE_F32, DTYPE_BF16, DTYPE_INT8 };
    {
        const size_t K = 4096, N = (gemv_mb << 20) / sizeof(float) / K;
        float *W = td_malloc(N * K * sizeof(float));
        float *x = td_malloc(K * sizeof(float)), *y = td_malloc(N * sizeof(float));
        for (size_t i = 0; i < N * K; i++) W[i] = (float)(i % 7) * 0.01f;
        for (size_t i = 0; i < K; i++) x[i] = 1.0f;
        /* the same matrix packed as f32, bf16 and int8: GB/s of the packed
         * bytes each kernel streams (int8: with its scales) */
        for (int t = 0; t < 3; t++) {
            const size_t pb = gemm_packed_bytes(gv_types[t], N, K);
            void *P = td_malloc(pb);
            gemm_pack(P, gv_types[t], W, N, K);
            const GemmW PW = gemm_w(gv_types[t], P, N, K);
            for (int r = -1; r < 4 * reps; r++) {
                double t0 = td_now();
                gemm_xwt(y, N, x, K, &PW, 1);
                double dt = td_now() - t0;
                if (r >= 0 && (double)pb / dt / 1e9 > gv_dt[t]) gv_dt[t] = (double)pb / dt / 1e9;
            }
            td_free(P);
        }
        gv_xwt = gv_dt[0];
        const double bytes = (double)N * (double)K * sizeof(float);
        pool_init(1);
        openblas_set_num_threads(threads);
        for (int r = -1; r < 4 * reps; r++) {
            double t0 = td_now();
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)N, (int)K, 1.0f, W, (int)K, x, 1, 0.0f, y, 1);
            double dt = td_now() - t0;
            if (r >= 0 && bytes / dt / 1e9 > gv_blas) gv_blas = bytes / dt / 1e9;
        }
        openblas_set_num_threads(1);
        pool_init(threads);
        g_sink += y[0];
        td_free(W);
        td_free(x);
        td_free(y);
    }

    /* ---- compute */
    double gf_sgemm[MAX_SHAPES], gf_xwt[MAX_SHAPES], best_sgemm = 0, best_xwt = 0;
    for (int s = 0; s < n_shapes; s++) {
        Gemm g = { shapes[s][0], shapes[s][1], shapes[s][2], NULL, NULL, NULL, NULL };
        g.A = td_malloc(g.M * g.K * sizeof(float));
        g.B = td_malloc(g.N * g.K * sizeof(float));
        g.C = td_malloc(g.M * g.N * sizeof(float));
        g.P = td_malloc(gemm_packed_bytes(DTYPE_F32, g.N, g.K));
        for (size_t i = 0; i < g.M * g.K; i++) g.A[i] = (float)((i * 7) % 13) * 0.01f - 0.06f;
        for (size_t i = 0; i < g.N * g.K; i++) g.B[i] = (float)((i * 5) % 11) * 0.01f - 0.05f;
        gemm_pack(g.P, DTYPE_F32, g.B, g.N, g.K);
        pool_init(1);                     /* OpenBLAS owns the cores ... */
        openblas_set_num_threads(threads);
        gf_sgemm[s] = gflops_best(run_sgemm, &g, reps);
        openblas_set_num_threads(1);
        pool_init(threads);               /* ... then tandem's pool does */
        gf_xwt[s] = gflops_best(run_xwt, &g, reps);
        if (gf_sgemm[s] > best_sgemm) best_sgemm = gf_sgemm[s];
        if (gf_xwt[s] > best_xwt) best_xwt = gf_xwt[s];
        td_free(g.A);
        td_free(g.B);
        td_free(g.C);
        td_free(g.P);
    }

    printf("{\"bench\":\"membw\",\"threads\":%d,\"mb\":%zu,\"seg_mb\":%zu,\"reps\":%d,\"read_GBps\":%.2f,"
           "\"read_GBps_median\":%.2f,\"streams\":[",
           threads, mb, seg_mb, reps, bw_best, bw_med);
    for (int si = 0; si < n_sc; si++)
        printf("%s{\"streams\":%d,\"best\":%.2f,\"median\":%.2f}", si ? "," : "", stream_counts[si], bw_sc[si],
               bw_med_sc[si]);
    printf("],\"gemv_mb\":%zu,\"gemv_xwt_GBps\":%.2f,\"sgemv_GBps\":%.2f,\"roof_GBps\":%.2f,", gemv_mb, gv_xwt, gv_blas,
           bw_best > gv_xwt ? (bw_best > gv_blas ? bw_best : gv_blas) : (gv_xwt > gv_blas ? gv_xwt : gv_blas));
    printf("\"gemv_bf16_GBps\":%.2f,\"gemv_int8_GBps\":%.2f,", gv_dt[1], gv_dt[2]);
    printf("\"sgemm_gflops\":%.2f,\"xwt_gflops\":%.2f,\"shapes\":[", best_sgemm, best_xwt);
    for (int s = 0; s < n_shapes; s++)
        printf("%s{\"M\":%zu,\"N\":%zu,\"K\":%zu,\"sgemm_gflops\":%.2f,\"xwt_gflops\":%.2f}", s ? "," : "",
               shapes[s][0], shapes[s][1], shapes[s][2], gf_sgemm[s], gf_xwt[s]);
    printf("]}\n");
    g_sink = rc.sink[0] + rc.sink[1];
    pool_free();
    return 0;
}

/* bench/ops.c - throughput of the operator core next to OpenBLAS (bench/ops.sh
 * runs it; `make bench`).
 *
 *   ops [--threads N] [--reps R] [--quick] [--no-linear] [--no-attention]
 *
 * Linear layer y = x W^T (core/ops/linear.h), M x N x K =
 * 2048x512x512, 2048x1024x512, 512x2048x1024:
 *   fw   tandem's row-invariant gemm_xwt (linear_forward) against
 *        cblas_sgemm on the same product, split over the pool's threads with
 *        single-threaded OpenBLAS (as core/ops/gemm.c runs the backward), and
 *        against OpenBLAS running its own threads (openblas_set_num_threads);
 *   bw   linear_backward (dx += dy W and dW += dy^T x) against the same two
 *        references.
 *   FLOPs 2 M N K per product.
 *
 * Attention (core/ops/attention.h), B = 1, H = 8, Hkv = 4, hd = 64, bs = 16,
 * T = 256, 1024, 4096: forward and backward time, GFLOP/s with the causal
 * count 4 * T*T/2 * hd * H (forward) and 2.5x that (backward).  Decode: one
 * query row at position T-1 (keys 0..T-1 stored), time per call on one
 * thread (the kernel; with several threads a call this short mostly measures
 * waking the pool's helpers), for the bench shape and for configs/demo.json's
 * (H = 6, Hkv = 2, hd = 32).
 *
 * Every measurement is warmed up first (first-touch page faults are slow) and
 * is the best of R repetitions (shared machines are noisy: compare the ratios
 * measured side by side in one run).  Prints a table and, last, one JSON line
 * starting with {"bench":"ops".
 */
#include "core/ops/attention.h"
#include "core/common.h"
#include "core/ops/gemm.h"
#include "core/ops/linear.h"
#include "core/pool.h"
#include "core/rng.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_reps = 5;
static double g_budget = 2.0;   /* seconds per measurement after the warm-up */

static float *rand_floats(size_t n, uint64_t seed, float lo, float hi)
{
    float *x = td_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)rng_uniform_at(seed, i);
    return x;
}

typedef void (*BenchFn)(void *ctx);

/* Best wall time of fn over up to g_reps runs (at least 2) after a warm-up
 * run, stopping early once g_budget seconds have been spent. */
static double best_time(BenchFn fn, void *ctx)
{
    fn(ctx);
    double best = 1e30, spent = 0;
    for (int r = 0; r < g_reps; r++) {
        double t0 = td_now();
        fn(ctx);
        double t = td_now() - t0;
        best = t < best ? t : best;
        spent += t;
        if (r >= 1 && spent > g_budget) break;
    }
    return best;
}

/* ---------------------------------------------------------------- linear */

typedef struct {
    size_t M, N, K;
    float *x, *W, *P, *y, *dy, *dx, *dW;
} LinCase;

static void lin_fw(void *v)
{
    LinCase *c = v;
    const GemmW W = gemm_w(DTYPE_F32, c->P, c->N, c->K);
    linear_forward(c->y, c->x, &W, c->M);
}

static void lin_bw(void *v)
{
    LinCase *c = v;
    linear_backward(c->dx, c->dW, c->dy, c->x, c->W, c->M, c->N, c->K);
}

/* References: y = x W^T, dx += dy W, dW += dy^T x with cblas_sgemm.  Pool
 * split: rows of the output over the pool's threads, BLAS single-threaded. */
static void ref_fw_rows(void *v, size_t m0, size_t m1, int tid)
{
    (void)tid;
    LinCase *c = v;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(m1 - m0), (int)c->N, (int)c->K, 1.0f,
                c->x + m0 * c->K, (int)c->K, c->W, (int)c->K, 0.0f, c->y + m0 * c->N, (int)c->N);
}

static void ref_dx_rows(void *v, size_t m0, size_t m1, int tid)
{
    (void)tid;
    LinCase *c = v;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(m1 - m0), (int)c->K, (int)c->N, 1.0f,
                c->dy + m0 * c->N, (int)c->N, c->W, (int)c->K, 1.0f, c->dx + m0 * c->K, (int)c->K);
}

static void ref_dw_rows(void *v, size_t n0, size_t n1, int tid)
{
    (void)tid;
    LinCase *c = v;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(n1 - n0), (int)c->K, (int)c->M, 1.0f,
                c->dy + n0, (int)c->N, c->x, (int)c->K, 1.0f, c->dW + n0 * c->K, (int)c->K);
}

static void ref_fw_pool(void *v) { pool_for(((LinCase *)v)->M, 16, ref_fw_rows, v); }

static void ref_bw_pool(void *v)
{
    LinCase *c = v;
    pool_for(c->M, 16, ref_dx_rows, v);
    pool_for(c->N, 16, ref_dw_rows, v);
}

/* OpenBLAS's own threads: one call from this thread. */
static void ref_fw_blas(void *v) { ref_fw_rows(v, 0, ((LinCase *)v)->M, 0); }

static void ref_bw_blas(void *v)
{
    LinCase *c = v;
    ref_dx_rows(v, 0, c->M, 0);
    ref_dw_rows(v, 0, c->N, 0);
}

typedef struct { double fw[3], bw[3]; } LinResult;   /* GFLOP/s: tandem, blas pool, blas threads */

static LinResult bench_linear(size_t M, size_t N, size_t K, int threads)
{
    LinCase c = { M, N, K, rand_floats(M * K, 1, -1, 1), rand_floats(N * K, 2, -0.1f, 0.1f), NULL,
                  td_malloc(M * N * sizeof(float)), rand_floats(M * N, 3, -1, 1),
                  td_calloc(M * K * sizeof(float)), td_calloc(N * K * sizeof(float)) };
    c.P = td_malloc(gemm_packed_bytes(DTYPE_F32, N, K));
    gemm_pack(c.P, DTYPE_F32, c.W, N, K);
    const double f = gemm_flops(M, N, K) / 1e9;
    LinResult r;
    r.fw[0] = f / best_time(lin_fw, &c);
    r.fw[1] = f / best_time(ref_fw_pool, &c);
    r.bw[0] = 2 * f / best_time(lin_bw, &c);
    r.bw[1] = 2 * f / best_time(ref_bw_pool, &c);
    /* pool_init pinned OpenBLAS to one thread: give it the cores for the
     * second reference only, while the pool's helpers sleep. */
    openblas_set_num_threads(threads);
    r.fw[2] = f / best_time(ref_fw_blas, &c);
    r.bw[2] = 2 * f / best_time(ref_bw_blas, &c);
    openblas_set_num_threads(1);
    td_free(c.x);
    td_free(c.W);
    td_free(c.P);
    td_free(c.y);
    td_free(c.dy);
    td_free(c.dx);
    td_free(c.dW);
    return r;
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    AttnShape sh;
    size_t T;
    int32_t *table;
    AttnSeq seq;
    float *kv, *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
} AttnCase;

static void attn_case_init(AttnCase *c, size_t H, size_t Hkv, size_t hd, size_t T)
{
    memset(c, 0, sizeof *c);
    c->sh = (AttnShape){ .H = H, .Hkv = Hkv, .dk = hd, .bs = 16, .kv = DTYPE_F32, .dv = hd, .scale = 1.0f / sqrtf((float)hd) };
    c->T = T;
    const size_t nb = (T + 15) / 16, qn = T * H * hd, kn = T * Hkv * hd;
    c->table = td_malloc(nb * sizeof(int32_t));
    for (size_t i = 0; i < nb; i++) c->table[i] = (int32_t)i;
    c->seq = (AttnSeq){ 0, T, 0, c->table };
    c->kv = td_calloc(nb * attn_block_bytes(&c->sh));
    c->q = rand_floats(qn, 11, -1, 1);
    c->k = rand_floats(kn, 12, -1, 1);
    c->v = rand_floats(kn, 13, -1, 1);
    c->dout = rand_floats(qn, 14, -1, 1);
    c->out = td_calloc(qn * sizeof(float));
    c->lse = td_calloc(T * H * sizeof(float));
    c->dq = td_calloc(qn * sizeof(float));
    c->dk = td_calloc(kn * sizeof(float));
    c->dv = td_calloc(kn * sizeof(float));
    attention_kv_store(c->kv, &c->seq, 1, c->k, c->v, &c->sh);
}

static void attn_case_free(AttnCase *c)
{
    float *f[] = { c->kv, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq, c->dk, c->dv };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) td_free(f[i]);
    td_free(c->table);
}

static void attn_fw(void *v)
{
    AttnCase *c = v;
    attention_forward(c->out, c->lse, c->q, c->kv, &c->seq, 1, &c->sh);
}

static void attn_bw(void *v)
{
    AttnCase *c = v;
    attention_backward(c->dq, c->dk, c->dv, c->dout, c->q, c->out, c->lse, c->kv, &c->seq, 1, &c->sh);
}

/* One decode row at position T-1 of the same sequence. */
static void attn_decode(void *v)
{
    AttnCase *c = v;
    const size_t qw = c->sh.H * c->sh.dk;
    AttnSeq s = { 0, 1, c->T - 1, c->table };
    for (int i = 0; i < 16; i++)   /* 16 calls per sample: microseconds each */
        attention_forward(c->out, c->lse, c->q + (c->T - 1) * qw, c->kv, &s, 1, &c->sh);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    int threads = 2, quick = 0, do_lin = 1, do_attn = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--no-linear")) do_lin = 0;
        else if (!strcmp(argv[i], "--no-attention")) do_attn = 0;
        else {
            fprintf(stderr, "usage: ops [--threads N] [--reps R] [--quick] [--no-linear] [--no-attention]\n");
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (g_reps < 2) g_reps = 2;
    if (quick) g_budget = 0.5;
    pool_init(threads);

    static const size_t lin[][3] = { { 2048, 512, 512 }, { 2048, 1024, 512 }, { 512, 2048, 1024 } };
    const size_t n_lin = do_lin ? sizeof lin / sizeof *lin : 0;
    LinResult lr[3];
    openblas_set_num_threads(threads);
    const int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    if (n_lin)
        printf("linear y = x W^T: GFLOP/s, %d threads, best of %d (blas(pool): single-threaded OpenBLAS on\n"
               "the pool's row slices, as core/ops/gemm.c; blas(own): OpenBLAS's own %d threads)\n",
               threads, g_reps, blas_threads);
    if (n_lin) printf("  %-16s %-3s %9s %11s %6s %11s %6s\n", "M x N x K", "", "tandem", "blas(pool)", "ratio",
           "blas(own)", "ratio");
    for (size_t i = 0; i < n_lin; i++) {
        lr[i] = bench_linear(lin[i][0], lin[i][1], lin[i][2], threads);
        char shape[48];
        snprintf(shape, sizeof shape, "%zux%zux%zu", lin[i][0], lin[i][1], lin[i][2]);
        for (int b = 0; b < 2; b++) {
            const double *g = b ? lr[i].bw : lr[i].fw;
            printf("  %-16s %-3s %9.1f %11.1f %6.2f %11.1f %6.2f\n", b ? "" : shape, b ? "bw" : "fw", g[0], g[1],
                   g[0] / g[1], g[2], g[0] / g[2]);
        }
        fflush(stdout);
    }

    static const size_t Ts[] = { 256, 1024, 4096 };
    const size_t n_T = !do_attn ? 0 : quick ? 2 : 3;
    double fw_ms[3], bw_ms[3], fw_gf[3], bw_gf[3], dec_us[3], dec_demo_us[3];
    if (n_T) printf("\nattention B=1 H=8 Hkv=4 hd=64: causal GFLOP/s and ms, %d threads, best of %d;\n"
           "decode: one row at position T-1, us per call on 1 thread (bench shape | demo H=6 Hkv=2 hd=32)\n",
           threads, g_reps);
    if (n_T) printf("  %-6s %9s %9s %9s %9s %9s %9s %9s\n", "T", "fw GF/s", "fw ms", "bw GF/s", "bw ms", "fw+bw",
           "dec us", "demo us");
    for (size_t i = 0; i < n_T; i++) {
        const size_t T = Ts[i];
        AttnCase c;
        attn_case_init(&c, 8, 4, 64, T);
        const double f = 4.0 * (double)T * (double)T / 2 * 64 * 8 / 1e9;
        double tf = best_time(attn_fw, &c), tb = best_time(attn_bw, &c);
        pool_init(1);
        dec_us[i] = best_time(attn_decode, &c) / 16 * 1e6;
        attn_case_free(&c);
        attn_case_init(&c, 6, 2, 32, T);
        dec_demo_us[i] = best_time(attn_decode, &c) / 16 * 1e6;
        attn_case_free(&c);
        pool_init(threads);
        fw_ms[i] = tf * 1e3;
        bw_ms[i] = tb * 1e3;
        fw_gf[i] = f / tf;
        bw_gf[i] = 2.5 * f / tb;
        printf("  %-6zu %9.1f %9.2f %9.1f %9.2f %9.1f %9.2f %9.2f\n", T, fw_gf[i], fw_ms[i], bw_gf[i], bw_ms[i],
               3.5 * f / (tf + tb), dec_us[i], dec_demo_us[i]);
        fflush(stdout);
    }

    printf("{\"bench\":\"ops\",\"threads\":%d,\"blas_threads\":%d,\"reps\":%d,\"linear\":[", threads, blas_threads,
           g_reps);
    for (size_t i = 0; i < n_lin; i++)
        printf("%s{\"M\":%zu,\"N\":%zu,\"K\":%zu,\"fw_gflops\":%.2f,\"fw_blas_pool\":%.2f,\"fw_blas_threads\":%.2f,"
               "\"bw_gflops\":%.2f,\"bw_blas_pool\":%.2f,\"bw_blas_threads\":%.2f}",
               i ? "," : "", lin[i][0], lin[i][1], lin[i][2], lr[i].fw[0], lr[i].fw[1], lr[i].fw[2], lr[i].bw[0],
               lr[i].bw[1], lr[i].bw[2]);
    printf("],\"attention\":[");
    for (size_t i = 0; i < n_T; i++) {
        const double f = 4.0 * (double)Ts[i] * (double)Ts[i] / 2 * 64 * 8 / 1e9;
        printf("%s{\"T\":%zu,\"fw_gflops\":%.2f,\"fw_ms\":%.3f,\"bw_gflops\":%.2f,\"bw_ms\":%.3f,"
               "\"fwbw_gflops\":%.2f,\"decode_us\":%.3f,\"decode_demo_us\":%.3f}",
               i ? "," : "", Ts[i], fw_gf[i], fw_ms[i], bw_gf[i], bw_ms[i], 3.5 * f / ((fw_ms[i] + bw_ms[i]) / 1e3),
               dec_us[i], dec_demo_us[i]);
    }
    printf("]}\n");
    pool_free();
    return 0;
}

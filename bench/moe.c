/* bench/moe.c - one MoE layer with many small experts against few large ones
 * at equal active FLOPs (bench/moe.sh runs it; `make bench`).
 *
 *   moe [--threads N] [--reps R] [--tokens N] [--quick]
 *
 * Shapes, d = 256 and k F = 1024 everywhere (so every config does the same
 * expert FLOPs per token, 2 * 3 k F d forward):
 *   E=8   k=2 F=512   Mixtral-shaped
 *   E=60  k=4 F=256   Qwen2-MoE-shaped (60 routed experts, top-4)
 *   E=64  k=8 F=128   OLMoE-shaped
 *   E=128 k=8 F=128   Qwen3-MoE-30B-A3B shrunk (d 2048 -> 256, F 768 -> 128)
 * N tokens (default 2048) routed to k distinct experts uniformly at random,
 * so an expert gets ~N k / E rows (128 at E=128).  Two more rows have few
 * rows per expert, where grouping matters most: E=128 k=8 F=384 over 256
 * tokens (~16 rows an expert: a prefill chunk) and E=128 k=8 F=128 over 16
 * tokens (~1 row: a decode batch; no layer step).
 *
 * Measured, each the best of R runs after a warm-up, on the pool's threads:
 *   experts fw   model_experts_forward (core/model/layer.h): the grouped
 *                gate/up GEMMs, SwiGLU, the grouped down GEMMs;
 *   experts bw   model_experts_backward (core/model/backprop.h);
 *   1-expert     the same two calls with every row routed to one expert:
 *                the same FLOPs and shapes in one GEMM per weight, the roof
 *                the grouped path is held to ("eff" = grouped / 1-expert);
 *   layer step   model_train_forward + model_train_backward of a one-layer
 *                model with this MoE (attention H=4 hd=64, T=256, V=16),
 *                router, dispatch and combine included.
 * GFLOP/s: 2 N k 3 F d per expert forward, twice that backward; wGB/s: the
 * forward's weight traffic, 3 F d floats of every expert that got a row
 * (with ~1 row an expert the forward streams weights: memory-bound); the layer
 * step counts 6 x active parameters x N plus causal attention
 * (12 T/2 hd H per token).  Prints a table and, last, one JSON line starting
 * with {"bench":"moe".  Shared machines are noisy: compare the ratios
 * measured side by side in one run.
 */
#include "core/common.h"
#include "core/model/backprop.h"
#include "core/pool.h"
#include "core/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_reps = 5;
static double g_budget = 2.0;   /* seconds per measurement after the warm-up */

typedef void (*BenchFn)(void *ctx);

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

typedef struct {
    Model m;
    Arena ar;
    LayerActs a;
    float *dxe, *deoe, *deh, *deg, *deu;
    int32_t *route_off;     /* the random routing's offsets (E + 1) */
    int32_t *one_off;       /* every row to expert 0 */
    TrainActs ta;
    int32_t *ids, *targets;
    float *dlogp;
} MoeCase;

static void case_init(MoeCase *c, size_t E, size_t k, size_t F, size_t N, size_t T)
{
    memset(c, 0, sizeof *c);
    char js[512], err[256];
    snprintf(js, sizeof js,
             "{\"vocab_size\":16,\"hidden_size\":256,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
             "\"num_local_experts\":%zu,\"num_experts_per_tok\":%zu,\"moe_intermediate_size\":%zu,"
             "\"max_position_embeddings\":%zu}", E, k, F, T);
    ModelConfig cfg;
    TD_CHECK(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    Topology t;
    topo_single(&t, &cfg);
    model_init(&c->m, &cfg, &t, true, 16);
    model_init_weights(&c->m, 7);
    Arena dry;
    arena_init_dry(&dry);
    layer_acts_carve(&c->a, &dry, &c->m, N);
    arena_init(&c->ar, dry.used);
    layer_acts_carve(&c->a, &c->ar, &c->m, N);
    const size_t Nk = N * k, d = c->m.d;
    /* k distinct experts per token, uniformly at random */
    int32_t *idx = td_malloc(Nk * sizeof(int32_t));
    Rng r;
    rng_seed(&r, 11);
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)rng_below(&r, E);
                dup = false;
                for (size_t q = 0; q < j; q++) dup |= idx[i * k + q] == e;
            } while (dup);
            idx[i * k + j] = e;
        }
    moe_plan_build(&c->a.plan, idx, N, E, k);
    td_free(idx);
    c->route_off = td_malloc((E + 1) * sizeof(int32_t));
    c->one_off = td_malloc((E + 1) * sizeof(int32_t));
    memcpy(c->route_off, c->a.plan.offsets, (E + 1) * sizeof(int32_t));
    c->one_off[0] = 0;
    for (size_t e = 1; e <= E; e++) c->one_off[e] = (int32_t)Nk;
    for (size_t i = 0; i < Nk * d; i++) c->a.xe[i] = (float)(rng_uniform_at(21, i) * 2 - 1);
    c->a.n_recv = Nk;
    c->dxe = td_calloc(Nk * d * sizeof(float));
    c->deoe = td_malloc(Nk * d * sizeof(float));
    for (size_t i = 0; i < Nk * d; i++) c->deoe[i] = (float)(rng_uniform_at(22, i) * 2 - 1);
    c->deh = td_malloc(Nk * F * sizeof(float));
    c->deg = td_malloc(Nk * F * sizeof(float));
    c->deu = td_malloc(Nk * F * sizeof(float));
    /* the training step of the one-layer model */
    model_train_acts_init(&c->ta, &c->m, td_max(N / T, 1), T, RECOMPUTE_NONE);
    const size_t Nt = c->ta.N;
    c->ids = td_malloc(Nt * sizeof(int32_t));
    c->targets = td_malloc(Nt * sizeof(int32_t));
    c->dlogp = td_malloc(Nt * sizeof(float));
    for (size_t i = 0; i < Nt; i++) {
        c->ids[i] = (int32_t)rng_below(&r, 16);
        c->targets[i] = (int32_t)rng_below(&r, 16);
        c->dlogp[i] = -1.0f / (float)Nt;
    }
}

static void case_free(MoeCase *c)
{
    model_train_acts_free(&c->ta);
    arena_free(&c->ar);
    model_free(&c->m);
    float *f[] = { c->dxe, c->deoe, c->deh, c->deg, c->deu, c->dlogp };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) td_free(f[i]);
    td_free(c->route_off);
    td_free(c->one_off);
    td_free(c->ids);
    td_free(c->targets);
}

static void run_fw(void *v)
{
    MoeCase *c = v;
    model_experts_forward(&c->m, &c->m.layers[0], &c->a);
}

static void run_bw(void *v)
{
    MoeCase *c = v;
    model_experts_backward(&c->m, &c->m.layers[0], &c->a, c->dxe, c->deoe, c->deh, c->deg, c->deu);
}

static void run_step(void *v)
{
    MoeCase *c = v;
    LossParts lp;
    memset(&lp, 0, sizeof lp);
    model_train_forward(&c->m, &c->ta, c->ids, c->targets, c->ta.N, &lp);
    model_train_backward(&c->m, &c->ta, c->targets, c->dlogp, 0.01f, 0.001f);
}

typedef struct { size_t E, k, F, N; const char *name; double fw, bw, fw1, bw1, step_ms, step_gf, wgbs; } Row;

int main(int argc, char **argv)
{
    int threads = 2;
    size_t N = 2048;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) N = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else {
            fprintf(stderr, "usage: moe [--threads N] [--reps R] [--tokens N (a multiple of 256)] [--quick]\n");
            return 2;
        }
    }
    const size_t T = 256;
    if (N < T || N % T) {
        fprintf(stderr, "moe: --tokens %zu is not a positive multiple of %zu\n", N, T);
        return 2;
    }
    if (threads < 1) threads = 1;
    if (g_reps < 2) g_reps = 2;
    if (quick) g_budget = 0.5;
    pool_init(threads);

    Row rows[] = { { 8, 2, 512, N, "Mixtral-shaped", 0, 0, 0, 0, 0, 0, 0 },
                   { 60, 4, 256, N, "Qwen2-MoE-shaped", 0, 0, 0, 0, 0, 0, 0 },
                   { 64, 8, 128, N, "OLMoE-shaped", 0, 0, 0, 0, 0, 0, 0 },
                   { 128, 8, 128, N, "Qwen3-MoE-30B shrunk", 0, 0, 0, 0, 0, 0, 0 },
                   { 128, 8, 384, 256, "  few rows (prefill)", 0, 0, 0, 0, 0, 0, 0 },
                   { 128, 8, 128, 16, "  ~1 row (decode)", 0, 0, 0, 0, 0, 0, 0 } };
    const size_t n_rows = sizeof rows / sizeof *rows, d = 256;
    printf("MoE layer, d=%zu, k F=1024 (equal active FLOPs), N=%zu tokens routed uniformly at random;\n"
           "GFLOP/s, %d threads, best of %d (eff: grouped experts / all rows in one expert)\n",
           d, N, threads, g_reps);
    printf("  %-22s %5s %3s %4s %5s %6s | %7s %7s %5s %6s | %7s %7s %5s | %8s %7s\n", "shape", "E", "k", "F", "N",
           "rows/e", "fw", "1-exp", "eff", "wGB/s", "bw", "1-exp", "eff", "step ms", "step GF");
    for (size_t i = 0; i < n_rows; i++) {
        Row *w = &rows[i];
        const size_t Nr = w->N;
        MoeCase c;
        case_init(&c, w->E, w->k, w->F, Nr, T);
        const double f = 2.0 * (double)Nr * (double)w->k * 3.0 * (double)w->F * (double)d / 1e9;
        memcpy(c.a.e_off, c.route_off, (w->E + 1) * sizeof(int32_t));
        const double tf = best_time(run_fw, &c);
        size_t used = 0;
        for (size_t e = 0; e < w->E; e++) used += c.route_off[e + 1] > c.route_off[e];
        w->fw = f / tf;
        w->wgbs = (double)used * 3.0 * (double)w->F * (double)d * sizeof(float) / tf / 1e9;
        w->bw = 2 * f / best_time(run_bw, &c);
        memcpy(c.a.e_off, c.one_off, (w->E + 1) * sizeof(int32_t));
        w->fw1 = f / best_time(run_fw, &c);
        w->bw1 = 2 * f / best_time(run_bw, &c);
        const ModelConfig *cfg = &c.m.cfg;
        /* active parameters of the layer (the head's 16 x 256 included) and attention */
        const double fl = 6.0 * (double)config_active_param_count(cfg) * (double)Nr +
                          12.0 * (double)T / 2 * 64 * 4 * (double)Nr;
        const double ts = Nr % T == 0 ? best_time(run_step, &c) : 0;
        w->step_ms = ts * 1e3;
        w->step_gf = ts > 0 ? fl / ts / 1e9 : 0;
        printf("  %-22s %5zu %3zu %4zu %5zu %6zu | %7.1f %7.1f %5.2f %6.1f | %7.1f %7.1f %5.2f | %8.2f %7.1f\n",
               w->name, w->E, w->k, w->F, Nr, Nr * w->k / w->E, w->fw, w->fw1, w->fw / w->fw1, w->wgbs, w->bw, w->bw1,
               w->bw / w->bw1, w->step_ms, w->step_gf);
        fflush(stdout);
        case_free(&c);
    }
    printf("{\"bench\":\"moe\",\"threads\":%d,\"reps\":%d,\"d\":%zu,\"shapes\":[", threads, g_reps, d);
    for (size_t i = 0; i < n_rows; i++) {
        const Row *w = &rows[i];
        printf("%s{\"E\":%zu,\"k\":%zu,\"F\":%zu,\"N\":%zu,\"experts_fw_gflops\":%.2f,\"one_expert_fw_gflops\":%.2f,"
               "\"fw_weight_gbs\":%.2f,\"experts_bw_gflops\":%.2f,\"one_expert_bw_gflops\":%.2f,\"layer_step_ms\":%.3f,"
               "\"layer_step_gflops\":%.2f}",
               i ? "," : "", w->E, w->k, w->F, w->N, w->fw, w->fw1, w->wgbs, w->bw, w->bw1, w->step_ms, w->step_gf);
    }
    printf("]}\n");
    pool_free();
    return 0;
}

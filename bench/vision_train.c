/* bench/vision_train.c - VLM training tokens/s of tandem's training step
 * (bench/vision.sh runs it next to bench/torch_vlm.py; `make bench`):
 *
 *   vision_train MODEL.json B T STEPS WARMUP THREADS
 *
 * MODEL.json: a model config with a vision_config.  Each step is what
 * `tandem train` does for one micro-batch of B sequences of T tokens, each
 * starting with one image's P placeholders (random pixels in [-1, 1],
 * random text ids, random targets): the training forward (tower, projector,
 * language model), cross-entropy over every position plus the router's aux
 * and z losses (the run defaults' coefficients), the backward, the gradient
 * norm, clipping at 1.0, AdamW (lr 1e-3, betas 0.9 / 0.95, weight decay
 * 0.1 on matrices, trainer.c's hyper-parameters) and the packing of the
 * new weights.  STEPS timed after WARMUP untimed; prints one line
 *   vision_train tokens_per_s=X step_s=Y loss_first=A loss_last=B
 * (tokens: B T per step, the image placeholders included, as bench/torch_vlm.py
 * counts them). */
#include "core/common.h"
#include "core/model/backprop.h"
#include "core/model/config.h"
#include "core/model/model.h"
#include "core/model/topology.h"
#include "core/model/vision.h"
#include "core/pool.h"
#include "core/rng.h"
#include "train/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: vision_train MODEL.json B T STEPS WARMUP THREADS\n");
        return 2;
    }
    const size_t B = (size_t)atoi(argv[2]), T = (size_t)atoi(argv[3]);
    const int steps = atoi(argv[4]), warm = atoi(argv[5]);
    pool_init(atoi(argv[6]));
    FILE *f = fopen(argv[1], "rb");
    TD_CHECK(f, "cannot open %s", argv[1]);
    char js[8192];
    size_t jn = fread(js, 1, sizeof js - 1, f);
    fclose(f);
    js[jn] = 0;
    ModelConfig cfg;
    char err[512];
    TD_CHECK(config_parse(&cfg, js, err, sizeof err) == 0, "%s: %s", argv[1], err);
    TD_CHECK(config_vision(&cfg), "%s has no vision_config", argv[1]);
    Topology topo;
    topo_single(&topo, &cfg);
    Model m;
    model_init(&m, &cfg, &topo, true, 16);
    model_init_weights(&m, 7);
    const size_t P = vision_tokens_per_image(&cfg), N = B * T, S = m.vis.S;
    TD_CHECK(T > P, "T %zu must exceed the image's %zu tokens", T, P);
    TrainActs a;
    VisionActs va;
    model_train_acts_init(&a, &m, B, T, RECOMPUTE_NONE);
    vision_acts_init(&va, &m, B);
    float *pixels = td_malloc(B * 3 * S * S * sizeof(float)), *dlogp = td_malloc(N * sizeof(float));
    float *m1 = td_calloc(m.n_w * sizeof(float)), *m2 = td_calloc(m.n_w * sizeof(float));
    int32_t *ids = td_malloc(N * sizeof(int32_t)), *targets = td_malloc(N * sizeof(int32_t));
    a.vis = &va;
    a.pixels = pixels;
    a.n_img = B;
    int n_moe = 0;
    for (int l = 0; l < cfg.num_hidden_layers; l++) n_moe += m.layers[l].moe ? 1 : 0;
    const float daux = n_moe ? (float)(cfg.router_aux_loss_coef / n_moe) : 0.0f;
    const float dz = n_moe ? (float)(cfg.router_z_loss_coef / n_moe) : 0.0f;
    const AdamHyper h = { 0.9, 0.95, 1e-8, 0.1 };
    Rng r;
    rng_seed(&r, 1);
    double *dt = td_malloc((size_t)(steps + warm) * sizeof(double)), loss_first = 0, loss_last = 0;
    for (int step = 1; step <= steps + warm; step++) {
        for (size_t i = 0; i < B * 3 * S * S; i++) pixels[i] = (float)(2.0 * rng_double(&r) - 1.0);
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < T; t++) {
                ids[b * T + t] = t < P ? cfg.image_token_index : (int32_t)rng_below(&r, (uint64_t)cfg.image_token_index);
                targets[b * T + t] = (int32_t)rng_below(&r, (uint64_t)cfg.image_token_index);
            }
        double t0 = td_now();
        memset(m.g, 0, m.n_w * sizeof(float));
        LossParts lp = { 0 };
        model_train_forward(&m, &a, ids, targets, N, &lp);
        for (size_t i = 0; i < N; i++) dlogp[i] = -1.0f / (float)N;
        model_train_backward(&m, &a, targets, dlogp, daux, dz);
        double gn = sqrt(grad_sq_norm(&m));
        adamw_step(&m, m1, m2, &h, step, 1e-3, gn > 1.0 ? (float)(1.0 / gn) : 1.0f);
        model_pack(&m);
        dt[step - 1] = td_now() - t0;
        loss_last = lp.ce_sum / (double)N;
        if (step == 1) loss_first = loss_last;
    }
    qsort(dt + warm, (size_t)steps, sizeof(double), cmp_d);
    double med = dt[warm + steps / 2];
    printf("vision_train tokens_per_s=%.1f step_s=%.4f loss_first=%.4f loss_last=%.4f\n", (double)N / med, med,
           loss_first, loss_last);
    model_train_acts_free(&a);
    vision_acts_free(&va);
    model_free(&m);
    td_free(pixels);
    td_free(dlogp);
    td_free(m1);
    td_free(m2);
    td_free(ids);
    td_free(targets);
    td_free(dt);
    pool_free();
    return 0;
}

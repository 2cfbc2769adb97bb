/* tests/test_route_fit.c - routers fitted to a perturbed ("quantized")
 * model (train/quant/route_fit.h): each fitted router is the minimiser of
 * its ridge objective, checked by the objective's gradient computed here in
 * double from whole forwards, not by the solver the fit used. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/model/backprop.h"
#include "core/model/config.h"
#include "core/model/model.h"
#include "core/ops/gemm.h"
#include "tests/fixture.h"
#include "train/quant/route_fit.h"

#define V 64
#define T 16
#define N_WIN 16
#define B 8
#define RIDGE 0.01

/* A dense first layer, then two MoE layers of 8 experts, top 3. */
static const char *const CFG =
    "{\"vocab_size\": 64, \"hidden_size\": 40, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"moe_intermediate_size\": 24, \"intermediate_size\": 48,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 3, \"first_k_dense_replace\": 1,"
    " \"norm_topk_prob\": true, \"max_position_embeddings\": 64}";

/* The model; noise > 0: every matrix but the routers perturbed by that
 * relative amount (what quantization does to a model). */
static void open_model(Model *m, float noise)
{
    fixture_model(m, CFG, 77);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        float *r = fixture_rand(p->numel, 900 + (uint64_t)i, -0.3f, 0.3f);
        float *z = fixture_rand(p->numel, 5000 + (uint64_t)i, -1.0f, 1.0f);
        const bool router = strstr(p->name, "mlp/gate") && !strstr(p->name, "gate_proj");
        for (size_t j = 0; j < p->numel; j++) {
            p->w[j] = p->ndim == 1 ? 1.0f + r[j] : 4.0f * p->w[j];
            if (p->ndim > 1 && !router) p->w[j] *= 1.0f + noise * z[j];
        }
        td_free(r);
        td_free(z);
    }
    model_pack(m);
}

Test(route_fit, each_fitted_router_minimises_its_ridge_objective)
{
    /* For MoE layer l, with h_q the perturbed model's router inputs (its
     * routers before l fitted: a whole forward with every fitted router
     * gives them, as later routers do not reach layer l's input) and z_f
     * the float model's logits, the objective sum ||W h_q - z_f||^2 +
     * lambda ||W - W0||^2 has gradient zero at the fitted W: checked in
     * double, relative to lambda ||W0||.  A planted mistake fails it: the
     * float model's inputs in place of h_q (1.8), lambda 10% off (1.7e-3),
     * or the quantized stream carried on through the unfitted router (the
     * second layer: 0.26). */
    Model f, q;
    open_model(&f, 0.0f);
    open_model(&q, 0.02f);
    int32_t tok[N_WIN * T + 1];
    for (size_t i = 0; i < N_WIN * T + 1; i++) tok[i] = (int32_t)((i * 37 + (i * i) % 11) % V);
    const size_t d = f.d, E = f.E, N = B * T;
    float *W0[3] = { 0 };
    for (int l = 1; l < 3; l++) {
        W0[l] = td_malloc(E * d * sizeof(float));
        const GemmW w = param_mat(q.layers[l].router, 0);
        for (size_t e = 0; e < E; e++) gemm_unpack_row(W0[l] + e * d, &w, e);
    }
    RouteFit *r;
    int n;
    char err[256];
    cr_assert(route_fit(&f, &q, tok, N_WIN, T, RIDGE, &r, &n, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(n, 2, "%d routers fitted, want the 2 MoE layers'", n);
    /* whole forwards of both models, the fitted routers in q */
    double *A[3], *G[3];
    for (int l = 1; l < 3; l++) {
        A[l] = td_calloc(d * d * sizeof(double));
        G[l] = td_calloc(E * d * sizeof(double));   /* sum (W h_q - z_f) h_q^T */
    }
    TrainActs af, aq;
    model_train_acts_init(&af, &f, B, T, RECOMPUTE_NONE);
    model_train_acts_init(&aq, &q, B, T, RECOMPUTE_NONE);
    int32_t ids[B * T], tg[B * T];
    for (size_t b = 0; b < N_WIN / B; b++) {
        for (size_t i = 0; i < B * T; i++) {
            ids[i] = tok[b * B * T + i];
            tg[i] = tok[b * B * T + i + 1];
        }
        model_train_forward(&f, &af, ids, tg, N, NULL);
        model_train_forward(&q, &aq, ids, tg, N, NULL);
        /* the logits in double from each layer's router inputs (the
         * activations keep h2 per layer; the router's logits are scratch) */
        for (int l = 1; l < 3; l++) {
            const float *h = aq.la[l].h2g, *hf = af.la[l].h2g, *Wf = r[l - 1].w;
            for (size_t t = 0; t < N; t++) {
                for (size_t i = 0; i < d; i++)
                    for (size_t j = 0; j < d; j++) A[l][i * d + j] += (double)h[t * d + i] * h[t * d + j];
                for (size_t e = 0; e < E; e++) {
                    double zq = 0, zf = 0;
                    for (size_t i = 0; i < d; i++) {
                        zq += (double)Wf[e * d + i] * h[t * d + i];
                        zf += (double)W0[l][e * d + i] * hf[t * d + i];
                    }
                    for (size_t i = 0; i < d; i++) G[l][e * d + i] += (zq - zf) * h[t * d + i];
                }
            }
        }
    }
    for (int l = 1; l < 3; l++) {
        const RouteFit *fr = &r[l - 1];
        char want[PARAM_NAME_MAX];
        (void)td_snprintf(want, sizeof want, "model/layers/%d/mlp/gate", l);
        cr_expect_str_eq(fr->name, want);
        double mean = 0;
        for (size_t i = 0; i < d; i++) mean += A[l][i * d + i];
        const double lam = RIDGE * mean / (double)d;
        double gn = 0, wn = 0, moved = 0;
        const GemmW w = param_mat(q.layers[l].router, 0);
        float row[64];
        for (size_t e = 0; e < E; e++) {
            gemm_unpack_row(row, &w, e);
            for (size_t i = 0; i < d; i++) {
                cr_assert(row[i] == fr->w[e * d + i], "layer %d: the model's router is not the fitted one", l);
                const double g = G[l][e * d + i] + lam * ((double)fr->w[e * d + i] - W0[l][e * d + i]);
                gn += g * g;
                wn += lam * lam * (double)W0[l][e * d + i] * W0[l][e * d + i];
                moved += fabs((double)fr->w[e * d + i] - W0[l][e * d + i]);
            }
        }
        /* the fit sums its normal equations in float32 and W' is float32:
         * the gradient is zero to 2.9e-5 .. 3.5e-5 of lambda ||W0|| here */
        cr_expect(sqrt(gn) < 1e-4 * sqrt(wn), "layer %d: |gradient| %.3g, lambda |W0| %.3g", l, sqrt(gn), sqrt(wn));
        cr_expect(moved > 0, "layer %d: the router did not move", l);
        cr_expect(fr->logit_rmse_after < fr->logit_rmse_before, "layer %d: logit rmse %.4g -> %.4g", l,
                  fr->logit_rmse_before, fr->logit_rmse_after);
        fprintf(stderr, "route_fit test: layer %d: |gradient| / lambda |W0| = %.3g, rmse %.4g -> %.4g\n", l,
                sqrt(gn) / sqrt(wn), fr->logit_rmse_before, fr->logit_rmse_after);
        td_free(A[l]);
        td_free(G[l]);
        td_free(W0[l]);
    }
    route_fit_free(r, n);
    model_train_acts_free(&af);
    model_train_acts_free(&aq);
    model_free(&f);
    model_free(&q);
}

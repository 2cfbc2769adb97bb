/* tests/test_gptq.c - GPTQ's factors (train/quant/gptq.h), made one layer
 * at a time, against the second moments of whole forwards. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/model/backprop.h"
#include "core/model/config.h"
#include "core/model/model.h"
#include "tests/fixture.h"
#include "train/quant/gptq.h"

#define V 64
#define T 16
#define N_WIN 16
#define B 8

/* A dense first layer, then MoE layers with a shared expert; untied head.
 * d 40 (K of one whole group and one of 8), F 24, Fd 48, S 24. */
static const char *const CFG =
    "{\"vocab_size\": 64, \"hidden_size\": 40, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"moe_intermediate_size\": 24, \"intermediate_size\": 48,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"n_shared_experts\": 1,"
    " \"first_k_dense_replace\": 1, \"max_position_embeddings\": 64}";

static void open_model(Model *m)
{
    fixture_model(m, CFG, 77);
    for (int i = 0; i < m->n_params; i++) {   /* away from the start: routers that pick unevenly */
        Param *p = &m->params[i];
        float *r = fixture_rand(p->numel, 900 + (uint64_t)i, -0.3f, 0.3f);
        for (size_t j = 0; j < p->numel; j++) p->w[j] = p->ndim == 1 ? 1.0f + r[j] : 4.0f * p->w[j];
        td_free(r);
    }
    model_pack(m);
}

/* One reference input: H in double over the rows of every batch. */
typedef struct {
    const char *names[3];
    size_t K, n_mat;
    double *h;
} Ref;

static void add_rows(Ref *r, size_t mat, const float *X, size_t n, size_t ld)
{
    double *h = r->h + mat * r->K * r->K;
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < r->K; i++)
            for (size_t j = 0; j < r->K; j++) h[i * r->K + j] += (double)X[t * ld + i] * (double)X[t * ld + j];
}

Test(gptq, factors_made_layer_by_layer_are_those_of_whole_forwards)
{
    /* The reference sums H = sum x x^T in double over whole forwards (every
     * layer's inputs from one model_train_forward per batch): q/k/v read
     * h1, o_proj the attention output, gate/up the normed rows (each
     * expert its routed rows), down the SwiGLU hidden rows, lm_head the
     * final norm.  Its factors (gptq_factor of H rounded to float) are the
     * ones the set hands out, made one layer at a time; a later ask for an
     * earlier layer (the stream rewound) gives the same bits again; the
     * router and the embedding get none; and only one layer's H is held. */
    Model m, mg;
    open_model(&m);
    open_model(&mg);
    int32_t tok[N_WIN * T + 1];
    for (size_t i = 0; i < N_WIN * T + 1; i++) tok[i] = (int32_t)((i * 37 + (i * i) % 11) % V);
    const size_t d = m.d, N = B * T, E = m.E;
    Ref refs[3 * 6 + 1];
    int nr = 0;
    for (int l = 0; l < 3; l++) {
        const Layer *L = &m.layers[l];
        refs[nr++] = (Ref){ { L->q->name, L->k->name, L->v->name }, d, 1, NULL };
        refs[nr++] = (Ref){ { L->o->name }, m.H * m.hd, 1, NULL };
        if (L->moe) {
            refs[nr++] = (Ref){ { L->egate->name, L->eup->name }, d, E, NULL };
            refs[nr++] = (Ref){ { L->edown->name }, m.F, E, NULL };
            refs[nr++] = (Ref){ { L->sgate->name, L->sup->name }, d, 1, NULL };
            refs[nr++] = (Ref){ { L->sdown->name }, m.S, 1, NULL };
        } else {
            refs[nr++] = (Ref){ { L->gate->name, L->up->name }, d, 1, NULL };
            refs[nr++] = (Ref){ { L->down->name }, m.Fd, 1, NULL };
        }
    }
    refs[nr++] = (Ref){ { m.lm_head->name }, d, 1, NULL };
    size_t layer_bytes[4] = { 0 }, peak = 0;   /* layers 0-2, the head */
    for (int i = 0; i < nr; i++) {
        refs[i].h = td_calloc(refs[i].n_mat * refs[i].K * refs[i].K * sizeof(double));
        int l = 3;
        for (int k = 0; k < 3; k++) {
            char pre[32];
            snprintf(pre, sizeof pre, "model/layers/%d/", k);
            if (!strncmp(refs[i].names[0], pre, strlen(pre))) l = k;
        }
        layer_bytes[l] += refs[i].n_mat * refs[i].K * refs[i].K * sizeof(float);
    }
    for (int l = 0; l < 4; l++) peak = td_max(peak, layer_bytes[l]);

    TrainActs a;
    model_train_acts_init(&a, &m, B, T, RECOMPUTE_NONE);
    int32_t ids[B * T], tg[B * T];
    for (size_t b = 0; b < N_WIN / B; b++) {
        for (size_t r = 0; r < B; r++) {
            memcpy(ids + r * T, tok + (b * B + r) * T, T * sizeof(int32_t));
            memcpy(tg + r * T, tok + (b * B + r) * T + 1, T * sizeof(int32_t));
        }
        model_train_forward(&m, &a, ids, tg, N, NULL);
        int i = 0;
        for (int l = 0; l < 3; l++) {
            const LayerActs *la = &a.la[l];
            add_rows(&refs[i++], 0, la->h1, N, d);
            add_rows(&refs[i++], 0, la->att, N, m.H * m.hd);
            if (m.layers[l].moe) {
                for (size_t e = 0; e < E; e++) {
                    const size_t r0 = (size_t)la->e_off[e], n = (size_t)la->e_off[e + 1] - r0;
                    add_rows(&refs[i], e, la->xe + r0 * d, n, d);
                    add_rows(&refs[i + 1], e, la->eh + r0 * m.F, n, m.F);
                }
                i += 2;
                add_rows(&refs[i++], 0, la->h2, N, d);
                add_rows(&refs[i++], 0, la->sh, N, m.S);
            } else {
                add_rows(&refs[i++], 0, la->h2, N, d);
                add_rows(&refs[i++], 0, la->fh, N, m.Fd);
            }
        }
        add_rows(&refs[i++], 0, a.hn, N, d);
    }
    model_train_acts_free(&a);

    GptqSet *g = gptq_collect(&mg, tok, N_WIN, T, 0.01);
    CkptQuantRound round = gptq_round(g);
    double *work = td_malloc(64 * 64 * sizeof(double));
    float *uref = td_malloc(64 * 64 * sizeof(float)), *first = td_malloc(40 * 40 * sizeof(float));
    size_t checked = 0, worst_at = 0;
    double worst = 0;
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < 3 && refs[i].names[j]; j++)
            for (size_t e = 0; e < refs[i].n_mat; e++) {
                const size_t K = refs[i].K;
                const double *h = refs[i].h + e * K * K;
                for (size_t k = 0; k < K * K; k++) uref[k] = (float)h[k];
                cr_assert(gptq_factor(uref, K, 0.01, work), "%s [%zu]: reference H not positive definite",
                          refs[i].names[j], e);
                const float *U = round.factor(round.ctx, refs[i].names[j], e, K);
                cr_assert(U, "%s [%zu]: no factor", refs[i].names[j], e);
                double umax = 0, dmax = 0;
                for (size_t k = 0; k < K * K; k++) {
                    umax = fmax(umax, fabs((double)uref[k]));
                    dmax = fmax(dmax, fabs((double)U[k] - (double)uref[k]));
                }
                if (dmax / umax > worst) {
                    worst = dmax / umax;
                    worst_at = checked;
                }
                if (i == 0 && j == 0) memcpy(first, U, K * K * sizeof(float));
                checked++;
            }
    /* float sums against double ones, through H^-1 with damping 0.01:
     * measured up to ~1e-5 of the factor's largest entry */
    cr_expect(worst < 1e-3, "factor %zu of %zu differs from the reference by %.3g of its largest entry", worst_at,
              checked, worst);
    /* layer 0: q k v o gate up down; 1, 2: q k v o, 4 experts x (gate up
     * down), shared gate up down; lm_head */
    cr_expect_eq(checked, 7 + 2 * (4 + 4 * 3 + 3) + 1, "%zu factors checked", checked);
    /* back to layer 0 (the stream rewound): the same bits */
    const float *U0 = round.factor(round.ctx, refs[0].names[0], 0, d);
    cr_assert(U0, "layer 0 q_proj asked again: no factor");
    EXPECT_BITWISE(U0, first, d * d, "layer 0 q_proj's factor asked again after the head's");
    /* not GPTQ's: the router, the embedding */
    cr_expect(!round.factor(round.ctx, m.layers[1].router->name, 0, d), "the router got a factor");
    cr_expect(!round.factor(round.ctx, m.embed->name, 0, d), "the embedding got a factor");
    size_t near = 0, held = 0;
    const size_t fact = gptq_factored(g, &near, &held);
    cr_expect(fact > 0 && near == 0, "%zu factored, %zu rounded to nearest", fact, near);
    cr_expect_eq(held, peak, "%zu bytes of H held at most, one layer's is %zu", held, peak);
    gptq_free(g);
    for (int i = 0; i < nr; i++) td_free(refs[i].h);
    td_free(work);
    td_free(uref);
    td_free(first);
    model_free(&m);
    model_free(&mg);
    EXPECT_NO_LEAKS();
}

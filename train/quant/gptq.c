/* train/quant/gptq.c - GPTQ factors from calibration activations (gptq.h). */
#include "train/quant/gptq.h"
#include "core/common.h"
#include "core/model/backprop.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* LAPACK (OpenBLAS ships it): Cholesky factor and inverse from it. */
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info);
extern void dpotri_(const char *uplo, const int *n, double *a, const int *lda, int *info);

#define GPTQ_NAMES 3   /* matrices reading one input at most (q, k, v) */

/* One input: its second moments (then factors), one per matrix index. */
typedef struct {
    char names[GPTQ_NAMES][PARAM_NAME_MAX];   /* the parameters that read it ("": none) */
    size_t K, n_mat;
    float *h;                        /* n_mat K K: H (upper triangle), then U */
    size_t *rows;                    /* n_mat: rows summed */
    bool *ok;                        /* n_mat: U valid */
} GptqInput;

struct GptqSet {
    GptqInput *in;
    int n, cap;
    size_t factored, nearest;
};

static GptqInput *add_input(GptqSet *g, size_t K, size_t n_mat, const Param *a, const Param *b, const Param *c)
{
    TD_CHECK(g->n < g->cap, "gptq: more inputs than %d", g->cap);
    GptqInput *in = &g->in[g->n++];
    memset(in, 0, sizeof *in);
    const Param *ps[GPTQ_NAMES] = { a, b, c };
    for (int i = 0; i < GPTQ_NAMES; i++)
        if (ps[i]) memcpy(in->names[i], ps[i]->name, sizeof in->names[i]);
    in->K = K;
    in->n_mat = n_mat;
    in->h = td_calloc(n_mat * K * K * sizeof(float));
    in->rows = td_calloc(n_mat * sizeof(size_t));
    in->ok = td_calloc(n_mat * sizeof(bool));
    return in;
}

/* H of matrix mat += X^T X for the n rows of X (ld floats apart). */
static void accumulate(GptqInput *in, size_t mat, const float *X, size_t n, size_t ld)
{
    if (n == 0) return;
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)in->K, (int)n, 1.0f, X, (int)ld, 1.0f,
                in->h + mat * in->K * in->K, (int)in->K);
    in->rows[mat] += n;
}

/* The inputs of model m, in the order accumulate_batch visits them. */
static void plan_inputs(GptqSet *g, const Model *m)
{
    g->cap = 6 * (m->topo.layer_end - m->topo.layer_begin) + 1;   /* a layer reads at most 6, + lm_head */
    g->in = td_calloc((size_t)g->cap * sizeof(GptqInput));
    const bool mla = config_mla(&m->cfg);
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        const Layer *L = &m->layers[l];
        if (!mla) {
            add_input(g, m->d, 1, L->q, L->k, L->v);
            add_input(g, m->H * m->hd, 1, L->o, NULL, NULL);
        }
        if (L->moe) {
            add_input(g, m->d, m->E, L->egate, L->eup, NULL);
            add_input(g, m->F, m->E, L->edown, NULL, NULL);
            if (m->S > 0) {
                add_input(g, m->d, 1, L->sgate, L->sup, NULL);
                add_input(g, m->S, 1, L->sdown, NULL, NULL);
            }
        } else {
            add_input(g, m->d, 1, L->gate, L->up, NULL);
            add_input(g, m->Fd, 1, L->down, NULL, NULL);
        }
    }
    if (!m->cfg.tie_word_embeddings && topo_is_last_stage(&m->topo)) add_input(g, m->d, 1, m->lm_head, NULL, NULL);
}

/* Adds the rows of one forward (N rows, acts a) to every input. */
static void accumulate_batch(GptqSet *g, const Model *m, const TrainActs *a, size_t N)
{
    const bool mla = config_mla(&m->cfg);
    int i = 0;
    for (int li = 0; li < m->topo.layer_end - m->topo.layer_begin; li++) {
        const Layer *L = &m->layers[m->topo.layer_begin + li];
        const LayerActs *la = &a->la[li];
        if (!mla) {
            accumulate(&g->in[i++], 0, la->h1, N, m->d);
            accumulate(&g->in[i++], 0, la->att, N, m->H * m->hd);
        }
        if (L->moe) {
            GptqInput *up = &g->in[i++], *down = &g->in[i++];
            for (size_t e = 0; e < m->E; e++) {
                const size_t r0 = (size_t)la->e_off[e], n = (size_t)la->e_off[e + 1] - r0;
                accumulate(up, e, la->xe + r0 * m->d, n, m->d);
                accumulate(down, e, la->eh + r0 * m->F, n, m->F);
            }
            if (m->S > 0) {
                accumulate(&g->in[i++], 0, la->h2, N, m->d);
                accumulate(&g->in[i++], 0, L->sgw ? la->shg : la->sh, N, m->S);
            }
        } else {
            accumulate(&g->in[i++], 0, la->h2, N, m->d);
            accumulate(&g->in[i++], 0, la->fh, N, m->Fd);
        }
    }
    if (i < g->n) accumulate(&g->in[i++], 0, a->hn, N, m->d);
}

bool gptq_factor(float *h, size_t K, double damp, double *w)
{
    const int n = (int)K;
    double mean = 0;
    for (size_t i = 0; i < K; i++) mean += h[i * K + i];
    mean /= (double)K;
    if (!(mean > 0)) mean = 1;
    for (size_t i = 0; i < K; i++)
        for (size_t j = i; j < K; j++) w[i * K + j] = w[j * K + i] = h[i * K + j];   /* symmetric: either order */
    for (size_t i = 0; i < K; i++) {
        if (w[i * K + i] == 0) w[i * K + i] = 1;   /* an input always zero: decoupled */
        w[i * K + i] += damp * mean;
    }
    int info = 0;
    dpotrf_("L", &n, w, &n, &info);   /* H = L L^T */
    if (info == 0) dpotri_("L", &n, w, &n, &info);   /* lower triangle of H^-1 (column-major) */
    if (info != 0) return false;
    /* the lower triangle, column-major ((i, j) at i + j K, i >= j), mirrored */
    for (size_t j = 0; j < K; j++)
        for (size_t i = j + 1; i < K; i++) w[j + i * K] = w[i + j * K];
    dpotrf_("U", &n, w, &n, &info);   /* H^-1 = U^T U, U upper (column-major: U(i, j) at i + j K) */
    if (info != 0) return false;
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < K; j++) h[i * K + j] = j >= i ? (float)w[i + j * K] : 0.0f;
    return true;
}

GptqSet *gptq_collect(const Model *m, const int32_t *tok, size_t n_win, size_t T, double damp)
{
    GptqSet *g = td_calloc(sizeof *g);
    plan_inputs(g, m);
    const size_t B = td_min(8, n_win), N = B * T;
    TrainActs a;
    model_train_acts_init(&a, m, B, T, RECOMPUTE_NONE);
    int32_t *ids = td_malloc(N * sizeof(int32_t)), *tg = td_malloc(N * sizeof(int32_t));
    const size_t n_batch = n_win / B;   /* whole batches: no padding rows counted */
    for (size_t b = 0; b < n_batch; b++) {
        for (size_t r = 0; r < B; r++) {
            memcpy(ids + r * T, tok + (b * B + r) * T, T * sizeof(int32_t));
            memcpy(tg + r * T, tok + (b * B + r) * T + 1, T * sizeof(int32_t));
        }
        model_train_forward(m, &a, ids, tg, N, NULL);
        accumulate_batch(g, m, &a, N);
        fprintf(stderr, "gptq: second moments, batch %zu/%zu (%zu tokens)\n", b + 1, n_batch, (b + 1) * N);
    }
    td_free(ids);
    td_free(tg);
    model_train_acts_free(&a);
    size_t total = 0, done = 0, Kmax = 0;
    for (int i = 0; i < g->n; i++) {
        total += g->in[i].n_mat;
        Kmax = td_max(Kmax, g->in[i].K);
    }
    double *w = td_malloc(Kmax * Kmax * sizeof(double));
    for (int i = 0; i < g->n; i++) {
        GptqInput *in = &g->in[i];
        for (size_t e = 0; e < in->n_mat; e++) {
            float *h = in->h + e * in->K * in->K;
            in->ok[e] = in->rows[e] > 0 && gptq_factor(h, in->K, damp, w);
            if (!in->ok[e] && in->rows[e] > 0) in->ok[e] = gptq_factor(h, in->K, 10 * damp, w);
            *(in->ok[e] ? &g->factored : &g->nearest) += 1;
            if (++done % 256 == 0 || done == total)
                fprintf(stderr, "gptq: factors %zu/%zu (%zu rounded to nearest)\n", done, total, g->nearest);
        }
    }
    td_free(w);
    return g;
}

static const float *round_factor(void *ctx, const char *name, size_t mat, size_t K)
{
    const GptqSet *g = ctx;
    for (int i = 0; i < g->n; i++) {
        const GptqInput *in = &g->in[i];
        for (int j = 0; j < GPTQ_NAMES; j++)
            if (in->names[j][0] && !strcmp(in->names[j], name))
                return in->K == K && mat < in->n_mat && in->ok[mat] ? in->h + mat * K * K : NULL;
    }
    return NULL;
}

CkptQuantRound gptq_round(GptqSet *g)
{
    return (CkptQuantRound){ round_factor, g };
}

size_t gptq_factored(const GptqSet *g, size_t *n_nearest)
{
    if (n_nearest) *n_nearest = g->nearest;
    return g->factored;
}

void gptq_free(GptqSet *g)
{
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        td_free(g->in[i].h);
        td_free(g->in[i].rows);
        td_free(g->in[i].ok);
    }
    td_free(g->in);
    td_free(g);
}

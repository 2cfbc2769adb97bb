/* train/quant/gptq.c - GPTQ factors from calibration activations (gptq.h). */
#include "train/quant/gptq.h"
#include "core/common.h"
#include "core/model/backprop.h"
#include "core/pool.h"
#include "core/ops/gemm.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* LAPACK (OpenBLAS ships it): Cholesky factor and inverse from it. */
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info);
extern void dpotri_(const char *uplo, const int *n, double *a, const int *lda, int *info);

#define GPTQ_NAMES 3   /* matrices reading one input at most (q, k, v) */
#define GPTQ_INPUTS 6  /* inputs of one layer at most (q/k/v, o, experts x 2, shared x 2) */

/* One input: its second moments (then factors), one per matrix index. */
typedef struct {
    char names[GPTQ_NAMES][PARAM_NAME_MAX];   /* the parameters that read it ("": none) */
    size_t K, n_mat;
    float *h;                        /* n_mat K K: H (upper triangle), then U */
    size_t *rows;                    /* n_mat: rows summed */
    bool *ok;                        /* n_mat: U valid */
} GptqInput;

/* The factors are made one layer at a time, when the quantizer first asks
 * for a matrix of that layer: X holds every calibration batch's residual
 * stream at the input of local layer `at` (nl: the head's input), and each
 * step runs one layer over every batch.  Only the current layer's inputs
 * are held. */
struct GptqSet {
    Model m;                         /* owned: the float32 model */
    TrainActs a;
    int32_t *ids;                    /* n_batch N */
    float *X;                        /* n_batch N d */
    size_t B, T, N, n_batch;
    int nl, at;                      /* local layers; X is the input of local layer at */
    int layer;                       /* local layer whose inputs are held: -1 none, nl the head */
    GptqInput in[GPTQ_INPUTS];
    int n;
    double damp;
    size_t factored, nearest, bytes, peak_bytes;
    char last_name[PARAM_NAME_MAX];  /* the last name looked up, and its layer */
    int last_layer;
};

/* One input of a layer: its width K, its matrices (one per expert, or
 * one), the parameters that read it, and where a's forward left its rows
 * (N rows of K; an expert input's rows grouped by expert, la->e_off). */
typedef struct { size_t K, n_mat; const Param *p[GPTQ_NAMES]; const float *x; } InputPlan;

/* The inputs of local layer li (nl: the head); the rows from a (NULL: x
 * NULL, the plan alone).  Returns their count. */
static int layer_inputs(const Model *m, const TrainActs *a, int li, InputPlan *ip)
{
    static const LayerActs none;
    int n = 0;
    if (li == m->topo.layer_end - m->topo.layer_begin) {   /* the head: an untied lm_head */
        if (!m->cfg.tie_word_embeddings && topo_is_last_stage(&m->topo))
            ip[n++] = (InputPlan){ m->d, 1, { m->lm_head }, a ? a->hn : NULL };
        return n;
    }
    const Layer *L = &m->layers[m->topo.layer_begin + li];
    const LayerActs *la = a ? &a->la[li] : &none;
    if (!config_mla(&m->cfg)) {
        ip[n++] = (InputPlan){ m->d, 1, { L->q, L->k, L->v }, la->h1 };
        ip[n++] = (InputPlan){ m->H * m->hd, 1, { L->o }, la->att };
    }
    if (L->moe) {
        ip[n++] = (InputPlan){ m->d, m->E, { L->egate, L->eup }, la->xe };
        ip[n++] = (InputPlan){ m->F, m->E, { L->edown }, la->eh };
        if (m->S > 0) {
            ip[n++] = (InputPlan){ m->d, 1, { L->sgate, L->sup }, la->h2 };
            ip[n++] = (InputPlan){ m->S, 1, { L->sdown }, L->sgw ? la->shg : la->sh };
        }
    } else {
        ip[n++] = (InputPlan){ m->d, 1, { L->gate, L->up }, la->h2 };
        ip[n++] = (InputPlan){ m->Fd, 1, { L->down }, la->fh };
    }
    return n;
}

static void inputs_free(GptqSet *g)
{
    for (int i = 0; i < g->n; i++) {
        td_free(g->in[i].h);
        td_free(g->in[i].rows);
        td_free(g->in[i].ok);
    }
    memset(g->in, 0, sizeof g->in);
    g->n = 0;
    g->bytes = 0;
}

static void inputs_plan(GptqSet *g, int li)
{
    InputPlan ip[GPTQ_INPUTS];
    g->n = layer_inputs(&g->m, NULL, li, ip);
    for (int i = 0; i < g->n; i++) {
        GptqInput *in = &g->in[i];
        for (int j = 0; j < GPTQ_NAMES; j++)
            if (ip[i].p[j]) memcpy(in->names[j], ip[i].p[j]->name, sizeof in->names[j]);
        in->K = ip[i].K;
        in->n_mat = ip[i].n_mat;
        in->h = td_calloc(in->n_mat * in->K * in->K * sizeof(float));
        in->rows = td_calloc(in->n_mat * sizeof(size_t));
        in->ok = td_calloc(in->n_mat * sizeof(bool));
        g->bytes += in->n_mat * in->K * in->K * sizeof(float);
    }
}

/* H of matrix mat += X^T X for the n rows of X (ld floats apart): the
 * weight-gradient product (core/ops/gemm.h), threaded and the same bits
 * for any thread count; the whole of H, of which the factor reads the
 * upper triangle. */
static void accumulate(GptqInput *in, size_t mat, const float *X, size_t n, size_t ld)
{
    if (n == 0) return;
    gemm_dw_acc(in->h + mat * in->K * in->K, X, ld, X, ld, n, in->K, in->K);
    in->rows[mat] += n;
}

/* Adds the rows of local layer li's forward (g->N rows, in g->a) to its
 * inputs: a whole-batch input at once, every expert's of every expert
 * input in one pool region (expert e's rows are [e_off[e], e_off[e + 1])). */
static void accumulate_layer(GptqSet *g, int li)
{
    InputPlan ip[GPTQ_INPUTS];
    const int n = layer_inputs(&g->m, &g->a, li, ip);
    TD_CHECK(n == g->n, "gptq: layer %d: %d inputs planned, %d held", li, n, g->n);
    size_t n_pr = 0;
    for (int i = 0; i < n; i++) n_pr += ip[i].n_mat > 1 ? ip[i].n_mat : 0;
    GemmBwProblem *pr = td_malloc(td_max(n_pr, 1) * sizeof(GemmBwProblem));
    int np = 0;
    for (int i = 0; i < n; i++) {
        GptqInput *in = &g->in[i];
        const size_t K = in->K;
        if (in->n_mat == 1) {
            accumulate(in, 0, ip[i].x, g->N, K);
            continue;
        }
        const int32_t *off = g->a.la[li].e_off;
        for (size_t e = 0; e < in->n_mat; e++) {
            const size_t r0 = (size_t)off[e], rows = (size_t)off[e + 1] - r0;
            if (rows == 0) continue;
            const float *x = ip[i].x + r0 * K;
            pr[np++] = (GemmBwProblem){ 1, in->h + e * K * K, K, x, K, x, K, rows, K, K };
            in->rows[e] += rows;
        }
    }
    gemm_bw_group(pr, np);
    td_free(pr);
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

/* Matrices [e0, e1) of one input factored, each with its thread's work. */
struct factor_ctx { GptqInput *in; double *w; size_t wsz; double damp; };

static void factor_range(void *vc, size_t e0, size_t e1, int tid)
{
    const struct factor_ctx *c = vc;
    GptqInput *in = c->in;
    double *w = c->w + (size_t)tid * c->wsz;
    for (size_t e = e0; e < e1; e++) {
        float *h = in->h + e * in->K * in->K;
        in->ok[e] = in->rows[e] > 0 && gptq_factor(h, in->K, c->damp, w);
        if (!in->ok[e] && in->rows[e] > 0) in->ok[e] = gptq_factor(h, in->K, 10 * c->damp, w);
    }
}

/* Factors every held input, its matrices in parallel (each one's U is
 * the same whichever thread makes it); a matrix that saw no row, or whose
 * H is not positive definite even at 10x the damping, is rounded to
 * nearest. */
static void factor_inputs(GptqSet *g, int li)
{
    size_t total = 0, done = 0, Kmax = 0;
    for (int i = 0; i < g->n; i++) {
        total += g->in[i].n_mat;
        Kmax = td_max(Kmax, g->in[i].K);
    }
    const size_t nt = (size_t)pool_threads();
    struct factor_ctx c = { NULL, td_malloc(nt * Kmax * Kmax * sizeof(double) + 8), Kmax * Kmax, g->damp };
    for (int i = 0; i < g->n; i++) {
        GptqInput *in = &g->in[i];
        c.in = in;
        pool_for(in->n_mat, 1, factor_range, &c);
        for (size_t e = 0; e < in->n_mat; e++) *(in->ok[e] ? &g->factored : &g->nearest) += 1;
        done += in->n_mat;
        fprintf(stderr, "gptq: %s %d/%d: factors %zu/%zu (%zu rounded to nearest so far)\n",
                li < g->nl ? "layer" : "head", li < g->nl ? li + 1 : g->nl, g->nl, done, total, g->nearest);
    }
    td_free(c.w);
}

/* X back to the embedded windows (the input of local layer 0). */
static void rewind_stream(GptqSet *g)
{
    for (size_t b = 0; b < g->n_batch; b++) model_embed(&g->m, g->X + b * g->N * g->m.d, g->ids + b * g->N, g->N);
    g->at = 0;
}

/* Makes local layer li's factors (li = nl: the head's) the held ones. */
static void advance_to(GptqSet *g, int li)
{
    if (g->layer == li) return;
    inputs_free(g);
    if (li < g->at) rewind_stream(g);   /* asked out of order: start over */
    const size_t d = g->m.d, N = g->N;
    TrainActs *a = &g->a;
    inputs_plan(g, li);
    g->peak_bytes = td_max(g->peak_bytes, g->bytes);
    for (; g->at <= li && g->at <= g->nl; g->at++) {
        const int at = g->at;
        for (size_t b = 0; b < g->n_batch; b++) {
            float *x = g->X + b * N * d;
            if (at == g->nl) {
                model_head(&g->m, a->logits, a->hn, a->rstdf, x, N);
            } else {
                memcpy(a->x[at], x, N * d * sizeof(float));
                model_train_forward_layer(&g->m, a, g->ids + b * N, N, at);
                memcpy(x, a->x[at + 1], N * d * sizeof(float));
            }
            if (at == li) accumulate_layer(g, li);
        }
        if (at < li) fprintf(stderr, "gptq: layer %d/%d: forward (%zu tokens)\n", at + 1, g->nl, g->n_batch * N);
        else fprintf(stderr, "gptq: %s %d/%d: second moments (%zu tokens)\n", li < g->nl ? "layer" : "head",
                     li < g->nl ? li + 1 : g->nl, g->nl, g->n_batch * N);
    }
    if (g->at > g->nl) g->at = g->nl;   /* the head does not move the stream */
    factor_inputs(g, li);
    g->layer = li;
}

GptqSet *gptq_collect(Model *m, const int32_t *tok, size_t n_win, size_t T, double damp)
{
    GptqSet *g = td_calloc(sizeof *g);
    g->m = *m;
    memset(m, 0, sizeof *m);
    g->nl = g->m.topo.layer_end - g->m.topo.layer_begin;
    g->B = td_min(8, n_win);
    g->T = T;
    g->N = g->B * T;
    g->n_batch = n_win / g->B;   /* whole batches: no padding rows counted */
    g->damp = damp;
    g->layer = -1;
    g->last_layer = -1;
    /* full recomputation's layout: every layer's activations in the one
     * scratch set, read by accumulate_layer before the next layer runs */
    model_train_acts_init(&g->a, &g->m, g->B, T, RECOMPUTE_FULL);
    g->ids = td_malloc(td_max(g->n_batch * g->N, 1) * sizeof(int32_t));
    g->X = td_malloc(td_max(g->n_batch * g->N * g->m.d, 1) * sizeof(float));
    for (size_t w = 0; w < g->n_batch * g->B; w++) memcpy(g->ids + w * T, tok + w * T, T * sizeof(int32_t));
    rewind_stream(g);
    return g;
}

/* Local layer (nl: the head) of the matrix named name; -1: not one GPTQ
 * rounds. */
static int layer_of(GptqSet *g, const char *name)
{
    if (!strcmp(g->last_name, name)) return g->last_layer;
    int found = -1;
    for (int li = 0; li <= g->nl && found < 0; li++) {
        InputPlan ip[GPTQ_INPUTS];
        const int n = layer_inputs(&g->m, NULL, li, ip);
        for (int i = 0; i < n && found < 0; i++)
            for (int j = 0; j < GPTQ_NAMES; j++)
                if (ip[i].p[j] && !strcmp(ip[i].p[j]->name, name)) found = li;
    }
    (void)td_snprintf(g->last_name, sizeof g->last_name, "%s", name);
    g->last_layer = found;
    return found;
}

static const float *round_factor(void *ctx, const char *name, size_t mat, size_t K)
{
    GptqSet *g = ctx;
    const int li = layer_of(g, name);
    if (li < 0) return NULL;
    advance_to(g, li);
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

size_t gptq_factored(const GptqSet *g, size_t *n_nearest, size_t *peak_bytes)
{
    if (n_nearest) *n_nearest = g->nearest;
    if (peak_bytes) *peak_bytes = g->peak_bytes;
    return g->factored;
}

void gptq_free(GptqSet *g)
{
    if (!g) return;
    inputs_free(g);
    model_train_acts_free(&g->a);
    model_free(&g->m);
    td_free(g->ids);
    td_free(g->X);
    td_free(g);
}

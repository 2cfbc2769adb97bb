/* train/quant/route_fit.c - routers fitted to a quantized model (route_fit.h). */
#include "train/quant/route_fit.h"
#include "core/common.h"
#include "core/model/backprop.h"
#include "core/model/layer.h"
#include "core/ops/gemm.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* LAPACK (OpenBLAS ships it): symmetric positive definite solve. */
extern void dposv_(const char *uplo, const int *n, const int *nrhs, double *a, const int *lda, double *b,
                   const int *ldb, int *info);

/* One model's side of the fit: its activations and its residual stream at
 * the input of the current layer, for every calibration batch. */
typedef struct {
    const Model *m;
    TrainActs a;
    float *X;          /* n_batch N d */
    float *Xmid;       /* n_batch N d: the current layer's x_mid of each batch (the quantized side) */
} Stream;

static void stream_init(Stream *s, const Model *m, size_t B, size_t T, size_t n_batch, const int32_t *ids)
{
    s->m = m;
    model_train_acts_init(&s->a, m, B, T, RECOMPUTE_FULL);
    const size_t N = B * T;
    s->X = td_malloc(td_max(n_batch * N * m->d, 1) * sizeof(float));
    s->Xmid = NULL;
    for (size_t b = 0; b < n_batch; b++) model_embed(m, s->X + b * N * m->d, ids + b * N, N);
}

static void stream_free(Stream *s)
{
    model_train_acts_free(&s->a);
    td_free(s->X);
    td_free(s->Xmid);
}

/* Local layer li of batch b: its forward from the stream (s->a.la[li]
 * filled); advance: the stream moves to the layer's output; else its
 * x_mid is kept for stream_layer_ffn. */
static void stream_layer(Stream *s, const int32_t *ids, size_t N, size_t b, int li, bool advance)
{
    const size_t d = s->m->d;
    float *x = s->X + b * N * d;
    memcpy(s->a.x[li], x, N * d * sizeof(float));
    model_train_forward_layer(s->m, &s->a, ids + b * N, N, li);
    if (advance) memcpy(x, s->a.x[li + 1], N * d * sizeof(float));
    else memcpy(s->Xmid + b * N * d, s->a.la[li].x_mid, N * d * sizeof(float));
}

/* The second half of local layer li of batch b again, from the x_mid
 * stream_layer kept (the attention block does not change with the
 * router); the stream moves to the layer's output. */
static void stream_layer_ffn(Stream *s, const int32_t *ids, size_t N, size_t b, int li)
{
    const size_t d = s->m->d;
    memcpy(s->a.la[li].x_mid, s->Xmid + b * N * d, N * d * sizeof(float));
    model_train_forward_layer_ffn(s->m, &s->a, ids + b * N, N, li);
    memcpy(s->X + b * N * d, s->a.x[li + 1], N * d * sizeof(float));
}

static double sq_diff(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s;
}

/* W' of one layer from A = sum h_q h_q^T (d d) and Bt = sum z_f h_q^T
 * (E d), regularised towards W (E d): (A + lambda I) W'^T = (Bt + lambda
 * W)^T, in double.  0, or -1 when A + lambda I is not positive definite. */
static int solve(float *w_out, const float *A, const float *Bt, const float *W, size_t d, size_t E, double ridge)
{
    double mean = 0;
    for (size_t i = 0; i < d; i++) mean += A[i * d + i];
    mean /= (double)d;
    const double lam = ridge * (mean > 0 ? mean : 1.0);
    double *M = td_malloc(d * d * sizeof(double)), *R = td_malloc(E * d * sizeof(double));
    for (size_t i = 0; i < d * d; i++) M[i] = A[i];
    for (size_t i = 0; i < d; i++) M[i * d + i] += lam;
    /* column-major d x E: column e is row e of Bt + lambda W */
    for (size_t i = 0; i < E * d; i++) R[i] = (double)Bt[i] + lam * W[i];
    const int n = (int)d, nrhs = (int)E;
    int info = 0;
    dposv_("L", &n, &nrhs, M, &n, R, &n, &info);
    if (info == 0)
        for (size_t i = 0; i < E * d; i++) w_out[i] = (float)R[i];
    td_free(M);
    td_free(R);
    return info == 0 ? 0 : -1;
}

int route_fit(const Model *f, Model *q, const int32_t *tok, size_t n_win, size_t T, double ridge, RouteFit **out,
              int *n_out, char *err, size_t err_len)
{
    *out = NULL;
    *n_out = 0;
    const size_t B = td_min(8, n_win), N = B * T, n_batch = n_win / B, d = q->d, E = q->E_global;
    const int nl = q->topo.layer_end - q->topo.layer_begin;
    int n_moe = 0;
    for (int li = 0; li < nl; li++) n_moe += q->layers[q->topo.layer_begin + li].moe;
    int32_t *ids = td_malloc(td_max(n_batch * N, 1) * sizeof(int32_t));
    for (size_t w = 0; w < n_batch * B; w++) memcpy(ids + w * T, tok + w * T, T * sizeof(int32_t));
    Stream sf, sq;
    stream_init(&sf, f, B, T, n_batch, ids);
    stream_init(&sq, q, B, T, n_batch, ids);
    sq.Xmid = td_malloc(td_max(n_batch * N * d, 1) * sizeof(float));
    RouteFit *r = td_calloc((size_t)td_max(n_moe, 1) * sizeof(RouteFit));
    float *A = td_malloc(d * d * sizeof(float)), *Bt = td_malloc(E * d * sizeof(float));
    float *Zf = td_malloc(td_max(n_batch * N * E, 1) * sizeof(float)), *W = td_malloc(E * d * sizeof(float));
    int rc = 0, nr = 0;
    for (int li = 0; li < nl && !rc; li++) {
        const Layer *L = &q->layers[q->topo.layer_begin + li];
        if (!L->moe) {
            for (size_t b = 0; b < n_batch; b++) {
                stream_layer(&sf, ids, N, b, li, true);
                stream_layer(&sq, ids, N, b, li, true);
            }
            continue;
        }
        /* the normal equations: the quantized model's router inputs (its
         * routers before this layer already fitted) against the float32
         * model's logits; the float32 stream moves on */
        memset(A, 0, d * d * sizeof(float));
        memset(Bt, 0, E * d * sizeof(float));
        RouteFit *fr = &r[nr];
        for (size_t b = 0; b < n_batch; b++) {
            stream_layer(&sf, ids, N, b, li, true);
            memcpy(Zf + b * N * E, sf.a.la[li].rlogits, N * E * sizeof(float));
            stream_layer(&sq, ids, N, b, li, false);
            const float *h = sq.a.la[li].h2g;
            gemm_dw_acc(A, h, d, h, d, N, d, d);
            gemm_dw_acc(Bt, Zf + b * N * E, E, h, d, N, E, d);
            fr->logit_rmse_before += sq_diff(sq.a.la[li].rlogits, Zf + b * N * E, N * E);
        }
        const GemmW Wr = param_mat(L->router, 0);
        for (size_t e = 0; e < E; e++) gemm_unpack_row(W + e * d, &Wr, e);
        (void)td_snprintf(fr->name, sizeof fr->name, "%s", L->router->name);
        fr->E = E;
        fr->d = d;
        fr->w = td_malloc(E * d * sizeof(float));
        nr++;
        if (solve(fr->w, A, Bt, W, d, E, ridge)) {
            (void)td_snprintf(err, err_len, "fitting %s: its router inputs' second moments are not positive definite",
                              fr->name);
            rc = -1;
            break;
        }
        gemm_pack(L->router->packed, DTYPE_F32, fr->w, E, d);
        /* the quantized stream moves on through the fitted router (the
         * layer's MoE half again, on the x_mid of the first pass) */
        for (size_t b = 0; b < n_batch; b++) {
            stream_layer_ffn(&sq, ids, N, b, li);
            fr->logit_rmse_after += sq_diff(sq.a.la[li].rlogits, Zf + b * N * E, N * E);
        }
        const double cnt = (double)(n_batch * N * E);
        fr->logit_rmse_before = sqrt(fr->logit_rmse_before / cnt);
        fr->logit_rmse_after = sqrt(fr->logit_rmse_after / cnt);
        fprintf(stderr, "fit-routers: layer %d/%d: %s, logit rmse %.4g -> %.4g (%zu tokens)\n", li + 1, nl, fr->name,
                fr->logit_rmse_before, fr->logit_rmse_after, n_batch * N);
    }
    td_free(A);
    td_free(Bt);
    td_free(Zf);
    td_free(W);
    td_free(ids);
    stream_free(&sf);
    stream_free(&sq);
    if (rc) {
        route_fit_free(r, nr);
        return -1;
    }
    *out = r;
    *n_out = nr;
    return 0;
}

void route_fit_free(RouteFit *r, int n)
{
    if (!r) return;
    for (int i = 0; i < n; i++) td_free(r[i].w);
    td_free(r);
}

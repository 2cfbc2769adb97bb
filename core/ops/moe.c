/* core/ops/moe.c - MoE routing, dispatch/combine and router losses (moe.h). */
#include "core/ops/moe.h"
#include "core/common.h"
#include "core/pool.h"
#include "core/ops/softmax.h"
#include "core/ops/vec.h"

#include <math.h>
#include <string.h>

/* Top-k of p (E) by value, ties to the lower index, into idx and w (k):
 * one pass keeping the k best sorted (value descending, index ascending).
 * An element enters only when strictly greater than the k-th kept one (an
 * equal, later one stays out) and goes after every kept value >= it: the
 * order of k successive arg-max selections, in O(E) for most rows. */
static void topk_row(int32_t *restrict idx, float *restrict w, const float *restrict p, size_t E, size_t k)
{
    size_t n = 0;
    for (size_t e = 0; e < E; e++) {
        const float v = p[e];
        if (n == k && !(v > w[k - 1])) continue;
        size_t j = n < k ? n++ : k - 1;
        for (; j > 0 && v > w[j - 1]; j--) {
            w[j] = w[j - 1];
            idx[j] = idx[j - 1];
        }
        w[j] = v;
        idx[j] = (int32_t)e;
    }
}

struct router_ctx { int32_t *idx; float *w; const float *probs; size_t E, k; bool norm; };

static void router_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct router_ctx *c = vc;
    for (size_t t = t0; t < t1; t++) {
        float *w = c->w + t * c->k;
        topk_row(c->idx + t * c->k, w, c->probs + t * c->E, c->E, c->k);
        if (c->norm) {
            float s = 0.0f;
            for (size_t j = 0; j < c->k; j++) s += w[j];
            for (size_t j = 0; j < c->k; j++) w[j] /= s;
        }
    }
}

void moe_router_forward(float *probs, float *lse, int32_t *topk_idx, float *topk_w,
                        const float *restrict logits, size_t N, size_t E, size_t k,
                        bool norm_topk)
{
    softmax_forward(probs, lse, logits, N, E);
    struct router_ctx c = { topk_idx, topk_w, probs, E, k, norm_topk };
    pool_for(N, 32, router_rows, &c);
}

void moe_topk_backward(float *dprobs, const float *restrict dtopk_w, const float *restrict probs,
                       const int32_t *restrict topk_idx, size_t N, size_t E, size_t k,
                       bool norm_topk)
{
    for (size_t t = 0; t < N; t++) {
        const float *dw = dtopk_w + t * k, *p = probs + t * E;
        const int32_t *idx = topk_idx + t * k;
        float *dp = dprobs + t * E;
        if (!norm_topk) {
            for (size_t j = 0; j < k; j++) dp[idx[j]] += dw[j];
            continue;
        }
        /* w_j = p_j / S, S = sum_i p_i:  dp_j += (dw_j - sum_i dw_i w_i) / S */
        float S = 0.0f, dot = 0.0f;
        for (size_t j = 0; j < k; j++) S += p[idx[j]];
        for (size_t j = 0; j < k; j++) dot += dw[j] * (p[idx[j]] / S);
        for (size_t j = 0; j < k; j++) dp[idx[j]] += (dw[j] - dot) / S;
    }
}

/* ---------------------------------------------------------------- sigmoid router */

struct sig_ctx {
    float *scores, *w; int32_t *idx; const float *logits, *bias; size_t E, k; const MoeSigmoidRouter *r;
};

/* The choice of one row: c = s + bias, groups outside the best topk_group
 * set to -inf, then top-k of c into idx (w: scratch, the chosen c). */
static void sigmoid_choice(int32_t *restrict idx, float *restrict w, const float *restrict s,
                           const float *restrict bias, size_t E, size_t k, const MoeSigmoidRouter *r)
{
    float c[E];
    for (size_t e = 0; e < E; e++) c[e] = bias ? s[e] + bias[e] : s[e];
    const size_t G = r->n_group, gs = E / G;
    if (G > 1 && r->topk_group < G) {
        float gscore[G], gw[G];
        int32_t gidx[G];
        for (size_t g = 0; g < G; g++) {
            /* the two best of the group, the sum as torch's topk(2).sum() */
            float a = -INFINITY, b = -INFINITY;
            for (size_t e = g * gs; e < (g + 1) * gs; e++) {
                if (c[e] > a) b = a, a = c[e];
                else if (c[e] > b) b = c[e];
            }
            gscore[g] = a + b;
        }
        topk_row(gidx, gw, gscore, G, r->topk_group);
        bool keep[G];
        memset(keep, 0, sizeof keep);
        for (size_t j = 0; j < r->topk_group; j++) keep[gidx[j]] = true;
        for (size_t g = 0; g < G; g++)
            if (!keep[g])
                for (size_t e = g * gs; e < (g + 1) * gs; e++) c[e] = -INFINITY;
    }
    topk_row(idx, w, c, E, k);
}

static void sigmoid_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    const struct sig_ctx *c = vc;
    const size_t E = c->E, k = c->k;
    for (size_t t = t0; t < t1; t++) {
        float *s = c->scores + t * E, *w = c->w + t * k;
        int32_t *idx = c->idx + t * k;
        const float *x = c->logits + t * E;
        for (size_t e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-x[e]));
        sigmoid_choice(idx, w, s, c->bias, E, k, c->r);
        float sum = 0.0f;
        for (size_t j = 0; j < k; j++) {
            w[j] = s[idx[j]];
            sum += w[j];
        }
        const float den = sum + 1e-20f;
        for (size_t j = 0; j < k; j++) w[j] = c->r->norm_topk ? w[j] / den * c->r->scale : w[j] * c->r->scale;
    }
}

void moe_router_sigmoid_forward(float *scores, int32_t *topk_idx, float *topk_w, const float *restrict logits,
                                const float *restrict bias, size_t N, size_t E, size_t k, const MoeSigmoidRouter *r)
{
    struct sig_ctx c = { scores, topk_w, topk_idx, logits, bias, E, k, r };
    pool_for(N, 32, sigmoid_rows, &c);
}

void moe_sigmoid_topk_backward(float *dscores, const float *restrict dtopk_w, const float *restrict scores,
                               const int32_t *restrict topk_idx, size_t N, size_t E, size_t k,
                               const MoeSigmoidRouter *r)
{
    for (size_t t = 0; t < N; t++) {
        const float *dw = dtopk_w + t * k, *s = scores + t * E;
        const int32_t *idx = topk_idx + t * k;
        float *ds = dscores + t * E;
        if (!r->norm_topk) {   /* w_j = scale s_j */
            for (size_t j = 0; j < k; j++) ds[idx[j]] += r->scale * dw[j];
            continue;
        }
        /* w_j = scale s_j / D, D = S + 1e-20:  ds_i += scale (dw_i - sum_j dw_j s_j / D) / D */
        float S = 0.0f, dot = 0.0f;
        for (size_t j = 0; j < k; j++) S += s[idx[j]];
        const float D = S + 1e-20f;
        for (size_t j = 0; j < k; j++) dot += dw[j] * (s[idx[j]] / D);
        for (size_t j = 0; j < k; j++) ds[idx[j]] += r->scale * ((dw[j] - dot) / D);
    }
}

void moe_sigmoid_backward(float *dlogits, const float *restrict dscores, const float *restrict scores,
                          size_t N, size_t E)
{
    for (size_t i = 0; i < N * E; i++) dlogits[i] += dscores[i] * (scores[i] * (1.0f - scores[i]));
}

double moe_seq_balance(const float *restrict scores, const int32_t *restrict topk_idx, size_t T, size_t E,
                       size_t k)
{
    double f[E > 0 ? E : 1], P[E > 0 ? E : 1];
    memset(f, 0, sizeof f);
    memset(P, 0, sizeof P);
    for (size_t i = 0; i < T * k; i++) f[topk_idx[i]] += 1.0;
    for (size_t t = 0; t < T; t++) {
        const float *s = scores + t * E;
        double S = 0.0;
        for (size_t e = 0; e < E; e++) S += (double)s[e];
        for (size_t e = 0; e < E; e++) P[e] += (double)s[e] / S;
    }
    double bal = 0.0;
    for (size_t e = 0; e < E; e++) bal += f[e] * P[e];
    return bal * (double)E / ((double)k * (double)T) / (double)T;
}

void moe_seq_balance_backward(float *dscores, float dbal, const float *restrict scores,
                              const int32_t *restrict topk_idx, size_t T, size_t E, size_t k)
{
    /* bal = sum_e g_e sum_t s_te / S_t, g_e = f_e / T:
     *   d bal / d s_te = (g_e - sum_i g_i s_ti / S_t) / S_t */
    double g[E > 0 ? E : 1];
    memset(g, 0, sizeof g);
    for (size_t i = 0; i < T * k; i++) g[topk_idx[i]] += 1.0;
    for (size_t e = 0; e < E; e++) g[e] *= (double)E / ((double)k * (double)T) / (double)T;
    for (size_t t = 0; t < T; t++) {
        const float *s = scores + t * E;
        float *ds = dscores + t * E;
        double S = 0.0, dot = 0.0;
        for (size_t e = 0; e < E; e++) S += (double)s[e];
        for (size_t e = 0; e < E; e++) dot += g[e] * (double)s[e];
        dot /= S;
        for (size_t e = 0; e < E; e++) ds[e] += (float)((double)dbal * (g[e] - dot) / S);
    }
}

void moe_plan_build(MoePlan *p, const int32_t *restrict topk_idx, size_t N, size_t E, size_t k)
{
    memset(p->offsets, 0, (E + 1) * sizeof(int32_t));
    for (size_t i = 0; i < N * k; i++) p->offsets[topk_idx[i] + 1]++;
    for (size_t e = 0; e < E; e++) p->offsets[e + 1] += p->offsets[e];
    /* fill in token order: stable within each expert */
    int32_t fill[E > 0 ? E : 1];
    for (size_t e = 0; e < E; e++) fill[e] = p->offsets[e];
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < k; j++) {
            int32_t row = fill[topk_idx[t * k + j]]++;
            p->src[row] = (int32_t)t;
            p->slot_row[t * k + j] = row;
        }
}

struct moe_ctx {
    float *out, *out2; const float *a, *b, *w; const MoePlan *p; size_t k, d;
};

static void dispatch_rows(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    struct moe_ctx *c = vc;
    for (size_t i = i0; i < i1; i++)
        memcpy(c->out + i * c->d, c->a + (size_t)c->p->src[i] * c->d, c->d * sizeof(float));
}

void moe_dispatch_forward(float *xd, const float *restrict x, const MoePlan *p,
                          size_t N, size_t k, size_t d)
{
    struct moe_ctx c = { xd, NULL, x, NULL, NULL, p, k, d };
    pool_for(N * k, 16, dispatch_rows, &c);
}

static void dispatch_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct moe_ctx *c = vc;
    for (size_t t = t0; t < t1; t++) {
        float *dx = c->out + t * c->d;
        for (size_t j = 0; j < c->k; j++) {
            const float *src = c->a + (size_t)c->p->slot_row[t * c->k + j] * c->d;
            for (size_t i = 0; i < c->d; i++) dx[i] += src[i];
        }
    }
}

void moe_dispatch_backward(float *dx, const float *restrict dxd, const MoePlan *p,
                           size_t N, size_t k, size_t d)
{
    struct moe_ctx c = { dx, NULL, dxd, NULL, NULL, p, k, d };
    pool_for(N, 8, dispatch_bw_rows, &c);
}

static void combine_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct moe_ctx *c = vc;
    for (size_t t = t0; t < t1; t++) {
        float *y = c->out + t * c->d;
        memset(y, 0, c->d * sizeof(float));
        for (size_t j = 0; j < c->k; j++) {
            const float w = c->w[t * c->k + j];
            const float *e = c->a + (size_t)c->p->slot_row[t * c->k + j] * c->d;
            for (size_t i = 0; i < c->d; i++) y[i] = fmaf(w, e[i], y[i]);
        }
    }
}

void moe_combine_forward(float *y, const float *restrict eo, const float *restrict topk_w,
                         const MoePlan *p, size_t N, size_t k, size_t d)
{
    struct moe_ctx c = { y, NULL, eo, NULL, topk_w, p, k, d };
    pool_for(N, 8, combine_rows, &c);
}

static void combine_bw_rows(void *vc, size_t t0, size_t t1, int tid)
{
    (void)tid;
    struct moe_ctx *c = vc;  /* out = deo, out2 = dw, a = dy, b = eo */
    for (size_t t = t0; t < t1; t++) {
        const float *dy = c->a + t * c->d;
        for (size_t j = 0; j < c->k; j++) {
            size_t row = (size_t)c->p->slot_row[t * c->k + j];
            const float w = c->w[t * c->k + j];
            float *deo = c->out + row * c->d;
            for (size_t i = 0; i < c->d; i++) deo[i] += w * dy[i];
            c->out2[t * c->k + j] += vec_dot(dy, c->b + row * c->d, c->d);
        }
    }
}

void moe_combine_backward(float *deo, float *dtopk_w, const float *restrict dy,
                          const float *restrict eo, const float *restrict topk_w,
                          const MoePlan *p, size_t N, size_t k, size_t d)
{
    struct moe_ctx c = { deo, dtopk_w, dy, eo, topk_w, p, k, d };
    pool_for(N, 8, combine_bw_rows, &c);
}

void moe_aux_stats(double *count, double *psum, const float *restrict probs,
                   const int32_t *restrict topk_idx, size_t N, size_t E, size_t k)
{
    memset(count, 0, E * sizeof(double));
    memset(psum, 0, E * sizeof(double));
    for (size_t i = 0; i < N * k; i++) count[topk_idx[i]] += 1.0;
    for (size_t t = 0; t < N; t++)
        for (size_t e = 0; e < E; e++) psum[e] += (double)probs[t * E + e];
}

float moe_aux_loss(const double *count, const double *psum, size_t N_tot, size_t E, size_t k)
{
    double s = 0.0;
    for (size_t e = 0; e < E; e++) s += count[e] * (psum[e] / (double)N_tot);
    return (float)((double)E / ((double)N_tot * (double)k) * s);
}

void moe_aux_backward(float *dprobs, float daux, const double *restrict count,
                      size_t N, size_t N_tot, size_t E, size_t k)
{
    float g[E > 0 ? E : 1];
    for (size_t e = 0; e < E; e++)
        g[e] = (float)((double)daux * (double)E / ((double)N_tot * (double)k) *
                       count[e] / (double)N_tot);
    for (size_t t = 0; t < N; t++)
        for (size_t e = 0; e < E; e++) dprobs[t * E + e] += g[e];
}

float moe_z_sum(const float *restrict lse, size_t N)
{
    double s = 0.0;
    for (size_t t = 0; t < N; t++) s += (double)lse[t] * (double)lse[t];
    return (float)s;
}

void moe_z_backward(float *dlogits, float dz, const float *restrict lse,
                    const float *restrict probs, size_t N, size_t N_tot, size_t E)
{
    for (size_t t = 0; t < N; t++) {
        float g = dz * 2.0f * lse[t] / (float)N_tot;
        for (size_t e = 0; e < E; e++) dlogits[t * E + e] += g * probs[t * E + e];
    }
}

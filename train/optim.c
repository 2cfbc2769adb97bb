/* train/optim.c - AdamW, clipping, schedule (optim.h). */
#include "train/optim.h"
#include "core/common.h"
#include "core/pool.h"

#include <math.h>

struct adam_ctx {
    float *w; const float *g; float *m, *v;
    float gscale, decay_mul, b1, b2, omb1, omb2, step_size, bc2_sqrt, eps;
};

static void adam_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct adam_ctx *c = vc;
    /* restrict locals: the four slabs never overlap, and without saying so
     * GCC does not vectorise the loop */
    float *restrict w = c->w, *restrict m1 = c->m, *restrict m2 = c->v;
    const float *restrict g = c->g;
    const float gs = c->gscale, decay_mul = c->decay_mul, b1 = c->b1, b2 = c->b2, omb1 = c->omb1,
                omb2 = c->omb2, step_size = c->step_size, bc2_sqrt = c->bc2_sqrt, eps = c->eps;
    for (size_t i = i0; i < i1; i++) {
        const float gi = g[i] * gs;   /* clipped gradient (gs = 1: g itself) */
        const float wi = w[i] * decay_mul;
        const float m = m1[i] * b1 + omb1 * gi;
        const float v = m2[i] * b2 + omb2 * (gi * gi);
        const float denom = sqrtf(v) / bc2_sqrt + eps;
        w[i] = wi - step_size * (m / denom);
        m1[i] = m;
        m2[i] = v;
    }
}

void adamw_range(Model *m, size_t lo, size_t hi, float *m1, float *m2, const AdamHyper *h,
                 int64_t t, double lr, float gscale)
{
    const double bc1 = 1.0 - pow(h->beta1, (double)t), bc2 = 1.0 - pow(h->beta2, (double)t);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        size_t a = td_max(lo, p->offset), b = td_min(hi, p->offset + p->numel);
        /* a tied copy takes its owner's weights; state (the router's
         * correction bias) is moved by its own rule, not by AdamW */
        if (a >= b || p->tied_copy || p->state) continue;
        struct adam_ctx c = {
            m->w + a, m->g + a, m1 + (a - lo), m2 + (a - lo), gscale,
            (float)(1.0 - lr * (p->decay ? h->weight_decay : 0.0)),
            (float)h->beta1, (float)h->beta2, (float)(1.0 - h->beta1), (float)(1.0 - h->beta2),
            (float)(lr / bc1), (float)sqrt(bc2), (float)h->eps,
        };
        pool_for(b - a, 4096, adam_range, &c);
    }
}

void adamw_step(Model *m, float *exp_avg, float *exp_avg_sq, const AdamHyper *h, int64_t t, double lr,
                float gscale)
{
    adamw_range(m, 0, m->n_w, exp_avg, exp_avg_sq, h, t, lr, gscale);
}

/* Sums of squares in a fixed order: a parameter's range is cut into
 * SQ_CHUNKS_MAX chunks at most (at least SQ_CHUNK_MIN elements each: the
 * cut depends on the range only), each chunk summed in double by 8 lanes
 * (element i into lane i mod 8, in order) combined pairwise, then its tail;
 * the chunk sums are added in order.  So the norm is the same for any
 * number of threads. */
#define SQ_CHUNK_MIN 16384
#define SQ_CHUNKS_MAX 1024

struct sq_ctx { const float *g; size_t n, chunk; double *part; };

static double sum_sq(const float *restrict x, size_t n)
{
    double l[8] = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] += (double)x[i + j] * (double)x[i + j];
    double s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static void sq_chunks(void *vc, size_t c0, size_t c1, int tid)
{
    (void)tid;
    const struct sq_ctx *c = vc;
    for (size_t k = c0; k < c1; k++) {
        const size_t a = k * c->chunk, b = td_min(c->n, a + c->chunk);
        c->part[k] = sum_sq(c->g + a, b - a);
    }
}

static double param_sq(const float *g, size_t n)
{
    double part[SQ_CHUNKS_MAX];
    const size_t chunk = td_max(SQ_CHUNK_MIN, (n + SQ_CHUNKS_MAX - 1) / SQ_CHUNKS_MAX);
    const size_t nc = (n + chunk - 1) / chunk;
    struct sq_ctx c = { g, n, chunk, part };
    if (nc > 1) pool_for(nc, 1, sq_chunks, &c);
    else sq_chunks(&c, 0, nc, 0);
    double s = 0.0;
    for (size_t k = 0; k < nc; k++) s += part[k];
    return s;
}

double grad_sq_range(const Model *m, size_t lo, size_t hi, double holders_div)
{
    const Topology *t = &m->topo;
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        size_t a = td_max(lo, p->offset), b = td_min(hi, p->offset + p->numel);
        if (p->tied_copy || p->state || a >= b) continue;
        const double ps = param_sq(m->g + a, b - a);
        /* the dp*cp*tp ranks of this stage hold the slice; count each
         * distinct slice once when the caller sums over the world */
        double distinct = (p->tp_dim >= 0 ? t->tp : 1) * (p->ep_dim >= 0 ? t->ep : 1);
        s += ps * distinct * holders_div / ((double)t->dp * t->cp * t->tp);
    }
    return s;
}

double grad_sq_norm(const Model *m) { return grad_sq_range(m, 0, m->n_w, 1.0); }

double lr_schedule(double lr, double min_lr, int warmup, int total, int cosine, int64_t step)
{
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (!cosine || total <= warmup) return lr;
    double p = (double)(step - warmup) / (double)(total - warmup > 1 ? total - warmup - 1 : 1);
    if (p > 1.0) p = 1.0;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * p));
}

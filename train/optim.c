/* train/optim.c - AdamW, clipping, schedule (optim.h). */
#include "train/optim.h"
#include "core/common.h"
#include "core/pool.h"

#include <math.h>

struct adam_ctx {
    float *w, *g, *m, *v;
    float decay_mul, b1, b2, omb1, omb2, step_size, bc2_sqrt, eps;
};

static void adam_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct adam_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) {
        float g = c->g[i];
        float w = c->w[i] * c->decay_mul;
        float m = c->m[i] * c->b1 + c->omb1 * g;
        float v = c->v[i] * c->b2 + c->omb2 * (g * g);
        float denom = sqrtf(v) / c->bc2_sqrt + c->eps;
        c->w[i] = w - c->step_size * (m / denom);
        c->m[i] = m;
        c->v[i] = v;
    }
}

void adamw_range(Model *m, size_t lo, size_t hi, float *m1, float *m2, const AdamHyper *h,
                 int64_t t, double lr)
{
    const double bc1 = 1.0 - pow(h->beta1, (double)t), bc2 = 1.0 - pow(h->beta2, (double)t);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        size_t a = td_max(lo, p->offset), b = td_min(hi, p->offset + p->numel);
        if (a >= b || p->tied_copy) continue;   /* a tied copy takes its owner's weights */
        struct adam_ctx c = {
            m->w + a, m->g + a, m1 + (a - lo), m2 + (a - lo),
            (float)(1.0 - lr * (p->decay ? h->weight_decay : 0.0)),
            (float)h->beta1, (float)h->beta2, (float)(1.0 - h->beta1), (float)(1.0 - h->beta2),
            (float)(lr / bc1), (float)sqrt(bc2), (float)h->eps,
        };
        pool_for(b - a, 4096, adam_range, &c);
    }
}

void adamw_step(Model *m, float *exp_avg, float *exp_avg_sq, const AdamHyper *h, int64_t t, double lr)
{
    adamw_range(m, 0, m->n_w, exp_avg, exp_avg_sq, h, t, lr);
}

double grad_sq_range(const Model *m, size_t lo, size_t hi, double holders_div)
{
    const Topology *t = &m->topo;
    double s = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        size_t a = td_max(lo, p->offset), b = td_min(hi, p->offset + p->numel);
        if (p->tied_copy || a >= b) continue;
        double ps = 0.0;
        for (size_t j = a; j < b; j++) ps += (double)m->g[j] * (double)m->g[j];
        /* the dp*tp ranks of this stage hold the slice; count each distinct
         * slice once when the caller sums over the world */
        double distinct = (p->tp_dim >= 0 ? t->tp : 1) * (p->ep_dim >= 0 ? t->ep : 1);
        s += ps * distinct * holders_div / ((double)t->dp * t->tp);
    }
    return s;
}

double grad_sq_norm(const Model *m) { return grad_sq_range(m, 0, m->n_w, 1.0); }

struct scale_ctx { float *g; float s; };

static void scale_range(void *vc, size_t i0, size_t i1, int tid)
{
    (void)tid;
    const struct scale_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) c->g[i] *= c->s;
}

void grad_scale(Model *m, float s)
{
    struct scale_ctx c = { m->g, s };
    pool_for(m->n_w, 4096, scale_range, &c);
}

double lr_schedule(double lr, double min_lr, int warmup, int total, int cosine, int64_t step)
{
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (!cosine || total <= warmup) return lr;
    double p = (double)(step - warmup) / (double)(total - warmup > 1 ? total - warmup - 1 : 1);
    if (p > 1.0) p = 1.0;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * p));
}

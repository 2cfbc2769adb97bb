/* core/model/backprop.c - training forward/backward of a micro-batch (backprop.h).
 *
 * Backward of one layer, in reverse order of layer.c (dx is the gradient of
 * the layer output on entry and of its input on exit):
 *   FFN:   y = ffn(h2), h2 = rmsnorm(x_mid):   dh2 = ffn^T dx;  dx += rmsnorm^T dh2
 *   attn:  x_mid = x_in + att Wo^T + bo:       datt = dx Wo;   dbo += sum_t dx;  dq, dk, dv = attn^T datt
 *          q, k = rope(c(n(qr)), c(n(kr))):    dqr = n^T c^T rope^T dq (c: clamp, n: q/k norm), likewise dkr;
 *          v = c(vr)                           dvr = c^T dv
 *          qr = h1 Wq^T + bq (k, v alike):     dbq += sum_t dqr;  dh1 = dqr Wq + dkr Wk + dvr Wv
 *          h1 = rmsnorm(x_in):                 dx += rmsnorm^T dh1
 *   MLA (docs/mla.md): x_mid = x_in + matt Wo^T, matt = absorb_o(att), att = attn(absorb_q(mq), key):
 *          datt = absorb_o^T (dx Wo);  dq, dk, dv = attn^T datt;  dmq = absorb_q^T dq (dkv_b both ways);
 *          rope^T on the rope parts;  dc_kv_normed = dk[:r] + dv, summed over tp (the latent is
 *          replicated, the heads are not), likewise dk_rope and dcqn;  then the norms and the
 *          replicated down projections, whose input gradient is added after the tp sum
 *   shared expert with gate g = sigmoid(h2 . w_g):  ys = (g sh) Ws^T:  d(g sh) = dy Ws;  dsh = g d(g sh);
 *          dg = d(g sh) . sh (summed over tp);  dh2 += gate^T dg (after the tp sum: w_g is replicated)
 * Sequence parallelism (core/model/layer.h): dx, x_mid and the norms are
 * this rank's N/tp rows; each block starts from dx all-gathered (the
 * backward of the forward's reduce-scatter) and ends with the
 * column-parallel input gradient reduce-scattered (was: all-reduced), the
 * replicated parts (router, shared gate, MLA's down projections) adding
 * their dx for this rank's rows only; the norm weights' and o_proj bias's
 * gradients, from N/tp rows, are summed over tp (vec_grad).
 */
#include "core/model/backprop.h"
#include "core/model/vision.h"
#include "core/common.h"
#include "core/ops/bias.h"
#include "core/ops/clamp.h"
#include "core/ops/embedding.h"
#include "core/ops/gate.h"
#include "core/ops/gemm.h"
#include "core/ops/linear.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/softmax.h"
#include "core/ops/swiglu.h"

#include <math.h>
#include <string.h>

enum { KEEP_NONE = 1, KEEP_SEL = 2, KEEP_FULL = 4 };

static unsigned mode_bit(Recompute m)
{
    return m == RECOMPUTE_NONE ? KEEP_NONE : m == RECOMPUTE_SELECTIVE ? KEEP_SEL : KEEP_FULL;
}

/* A buffer of the layer: its own when the mode keeps it, else the scratch one. */
#define SLOT(field, n, keep)                                                   \
    do {                                                                       \
        if ((keep) & mb) la->field = arena_floats(ar, (n));                    \
        else la->field = a->scratch.field;                                     \
    } while (0)

static void carve(TrainActs *a, const Model *m, Arena *ar)
{
    const size_t N = a->N, d = m->d, Hq = m->aq, Hk = m->ak, Hv = m->av, Ho = m->ao;
    const size_t E = m->E_global, k = m->k, Nk = N * k, V = m->V;
    const size_t Nl = model_sp_rows(m, N);   /* residual-stream rows (sequence parallelism) */
    const bool sp = m->topo.sp;
    const size_t nb = (a->T + m->attn.bs - 1) / m->attn.bs;
    /* KV blocks, in floats (f32 for training; a scorer may ask for a narrow
     * KV dtype: fewer bytes, still a whole number of floats) */
    const size_t kvf = (a->B * nb * attn_block_bytes(&m->attn) + sizeof(float) - 1) / sizeof(float);
    const int nl = m->topo.layer_end - m->topo.layer_begin;
    bool any_moe = false, any_dense = false, any_shared = false;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        any_moe |= m->layers[l].moe;
        any_dense |= !m->layers[l].moe;
        any_shared |= m->layers[l].sgate != NULL;
    }
    const size_t ep = (size_t)m->topo.ep, R = ep * Nk;   /* expert-side rows, worst case */
    const size_t fmax = td_max(td_max(any_moe ? R * m->F : 0, any_dense ? N * m->Fd : 0),
                               any_shared ? N * m->S : 0);

    /* shared scratch: one of everything */
    LayerActs *s = &a->scratch;
    memset(s, 0, sizeof *s);
    s->h1 = arena_floats(ar, Nl * d); s->rstd1 = arena_floats(ar, Nl);
    /* sp: the gathered norms are scratch, gathered again in backward */
    s->h1g = sp ? arena_floats(ar, N * d) : s->h1;
    s->q = arena_floats(ar, N * Hq); s->k = arena_floats(ar, N * Hk); s->v = arena_floats(ar, N * Hv);
    s->att = arena_floats(ar, N * Ho); s->lse = arena_floats(ar, N * m->H);
    if (m->mla) layer_acts_carve_mla(s, ar, m, N);
    s->x_mid = arena_floats(ar, Nl * d); s->h2 = arena_floats(ar, Nl * d); s->rstd2 = arena_floats(ar, Nl);
    s->h2g = sp ? arena_floats(ar, N * d) : s->h2;
    s->y = arena_floats(ar, N * d);
    s->kv = arena_floats(ar, kvf);
    layer_acts_carve_qkv(s, ar, m, N);
    s->qkss = m->cfg.qk_norm == QK_NORM_FULL ? arena_floats(ar, 2 * N) : NULL;
    if (any_dense) {
        s->fg = arena_floats(ar, N * m->Fd); s->fu = arena_floats(ar, N * m->Fd); s->fh = arena_floats(ar, N * m->Fd);
    }
    if (any_moe) {
        s->rlogits = arena_floats(ar, N * E); s->probs = arena_floats(ar, N * E);
        s->rlse = arena_floats(ar, N); s->topk_w = arena_floats(ar, Nk);
        s->topk_idx = (int32_t *)arena_floats(ar, Nk);
        s->plan.offsets = (int32_t *)arena_floats(ar, E + 1);
        s->plan.src = (int32_t *)arena_floats(ar, Nk);
        s->plan.slot_row = (int32_t *)arena_floats(ar, Nk);
        s->xd = arena_floats(ar, Nk * d); s->eo = arena_floats(ar, Nk * d);
        s->xe = ep > 1 ? arena_floats(ar, R * d) : s->xd;
        s->eoe = ep > 1 ? arena_floats(ar, R * d) : s->eo;
        s->ep_stage = ep > 1 ? arena_floats(ar, R * d) : NULL;
        s->eg = arena_floats(ar, R * m->F); s->eu = arena_floats(ar, R * m->F); s->eh = arena_floats(ar, R * m->F);
        s->eprob = (GemmProblem *)arena_bytes(ar, 2 * m->E * sizeof(GemmProblem));
        s->bprob = (GemmBwProblem *)arena_bytes(ar, 3 * m->E * sizeof(GemmBwProblem));
        if (any_shared) {
            s->sg = arena_floats(ar, N * m->S); s->su = arena_floats(ar, N * m->S); s->sh = arena_floats(ar, N * m->S);
        }
        if (any_shared && m->cfg.shared_expert_gate) {
            s->sgv = arena_floats(ar, N); s->shg = arena_floats(ar, N * m->S);
        }
    }

    a->x = ar->base ? td_malloc((size_t)(nl + 1) * sizeof(float *)) : NULL;
    for (int i = 0; i <= nl; i++) {
        float *x = arena_floats(ar, Nl * d);
        if (a->x) a->x[i] = x;
    }
    const unsigned mb = mode_bit(a->mode);
    for (int i = 0; i < nl; i++) {
        LayerActs tmp, *la = a->la ? &a->la[i] : &tmp;
        const Layer *L = &m->layers[m->topo.layer_begin + i];
        *la = *s;  /* start from scratch pointers; kept buffers replace them */
        SLOT(h1, Nl * d, KEEP_NONE | KEEP_SEL);
        SLOT(rstd1, Nl, KEEP_NONE | KEEP_SEL);
        SLOT(q, N * Hq, KEEP_NONE | KEEP_SEL);
        SLOT(att, N * Ho, KEEP_NONE);
        SLOT(lse, N * m->H, KEEP_NONE);
        SLOT(x_mid, Nl * d, KEEP_NONE | KEEP_SEL);
        SLOT(h2, Nl * d, KEEP_NONE | KEEP_SEL);
        SLOT(rstd2, Nl, KEEP_NONE | KEEP_SEL);
        if (!sp) la->h1g = la->h1, la->h2g = la->h2;   /* else the scratch's */
        SLOT(kv, kvf, KEEP_NONE | KEEP_SEL);
        if (m->mla) {   /* what MLA's backward reads besides q, att, lse, kv */
            const MlaDims *md = &m->mla_dims;
            const size_t qr = (size_t)m->cfg.q_lora_rank;
            SLOT(mq, N * md->H * (md->nope + md->rope), KEEP_NONE | KEEP_SEL);
            if (qr) {
                SLOT(cq, N * qr, KEEP_NONE | KEEP_SEL);
                SLOT(cqn, N * qr, KEEP_NONE | KEEP_SEL);
                SLOT(rstdcq, N, KEEP_NONE | KEEP_SEL);
            }
            SLOT(ckv, N * md->r, KEEP_NONE | KEEP_SEL);
            SLOT(rstdkv, N, KEEP_NONE | KEEP_SEL);
            SLOT(matt, N * md->H * md->v, KEEP_NONE);   /* o_proj's input: recomputed with att otherwise */
        }
        /* before q/k norm and clamp: what their backward reads */
        if (m->qk_pre) {
            SLOT(qr, N * Hq, KEEP_NONE | KEEP_SEL);
            SLOT(kr, N * Hk, KEEP_NONE | KEEP_SEL);
        } else {
            la->qr = la->q, la->kr = la->k;
        }
        if (m->clip > 0) SLOT(vr, N * Hk, KEEP_NONE | KEEP_SEL);
        else la->vr = la->v;
        if (L->qn) {
            SLOT(rstdq, m->cfg.qk_norm == QK_NORM_HEAD ? N * m->H : N, KEEP_NONE | KEEP_SEL);
            SLOT(rstdk, m->cfg.qk_norm == QK_NORM_HEAD ? N * m->Hkv : N, KEEP_NONE | KEEP_SEL);
        }
        if (!L->moe) {
            SLOT(fg, N * m->Fd, KEEP_NONE);
            SLOT(fu, N * m->Fd, KEEP_NONE);
            SLOT(fh, N * m->Fd, KEEP_NONE);
        } else {
            SLOT(probs, N * E, KEEP_NONE | KEEP_SEL);
            SLOT(rlse, N, KEEP_NONE | KEEP_SEL);
            SLOT(topk_w, Nk, KEEP_NONE | KEEP_SEL);
            if (mb & (KEEP_NONE | KEEP_SEL)) {
                la->topk_idx = (int32_t *)arena_floats(ar, Nk);
                la->plan.offsets = (int32_t *)arena_floats(ar, E + 1);
                la->plan.src = (int32_t *)arena_floats(ar, Nk);
                la->plan.slot_row = (int32_t *)arena_floats(ar, Nk);
            }
            SLOT(xd, Nk * d, KEEP_NONE);
            SLOT(eo, Nk * d, KEEP_NONE);
            if (ep > 1) SLOT(xe, R * d, KEEP_NONE);
            else la->xe = la->xd, la->eoe = la->eo;
            SLOT(eg, R * m->F, KEEP_NONE);
            SLOT(eu, R * m->F, KEEP_NONE);
            SLOT(eh, R * m->F, KEEP_NONE);
            /* routes of the exchange, needed by backward: small, always kept */
            la->e_off = (int32_t *)arena_floats(ar, m->E + 1);
            la->ep_send = (int32_t *)arena_floats(ar, ep * m->E);
            la->ep_recv = (int32_t *)arena_floats(ar, ep * m->E);
            if (L->sgate) {
                SLOT(sg, N * m->S, KEEP_NONE);
                SLOT(su, N * m->S, KEEP_NONE);
                SLOT(sh, N * m->S, KEEP_NONE);
            }
            if (L->sgw) SLOT(sgv, N, KEEP_NONE | KEEP_SEL);   /* shg: recomputed by backward */
        }
        /* router statistics: 2E + 1 doubles (count, psum, z), always kept */
        double *st = (double *)arena_bytes(ar, (2 * E + 1) * sizeof(double));
        la->count = st;
        la->psum = st ? st + E : NULL;
    }

    a->hn = arena_floats(ar, N * d); a->rstdf = arena_floats(ar, N);
    a->logits = arena_floats(ar, N * V); a->logp = arena_floats(ar, N); a->lse_v = arena_floats(ar, N);
    a->dx = arena_floats(ar, N * d); a->dtmp = arena_floats(ar, N * d); a->dh = arena_floats(ar, N * d);
    a->dxg = sp ? arena_floats(ar, N * d) : a->dx;
    a->dvec = sp ? arena_floats(ar, d) : NULL;
    a->dq = arena_floats(ar, N * Hq); a->dk = arena_floats(ar, N * Hk); a->dv = arena_floats(ar, N * Hv);
    a->datt = arena_floats(ar, N * Ho);
    if (m->mla) {
        const MlaDims *md = &m->mla_dims;
        const size_t qr = (size_t)m->cfg.q_lora_rank;
        a->dmq = arena_floats(ar, N * md->H * (md->nope + md->rope));
        a->dmatt = arena_floats(ar, N * md->H * md->v);
        a->dcq = qr ? arena_floats(ar, N * qr) : NULL;
        a->dcqn = qr ? arena_floats(ar, N * qr) : NULL;
        a->dkva = arena_floats(ar, N * (md->r + md->rope));
        a->dckv = arena_floats(ar, N * md->r); a->dckvn = arena_floats(ar, N * md->r);
    }
    a->dfa = arena_floats(ar, fmax); a->dfb = arena_floats(ar, fmax); a->dfc = arena_floats(ar, fmax);
    if (m->qk_pre) {
        a->dqr = arena_floats(ar, N * Hq); a->dkr = arena_floats(ar, N * Hk);
    }
    if (m->cfg.qk_norm == QK_NORM_FULL) a->qkdot = arena_floats(ar, 2 * N);
    if (m->cfg.qk_norm == QK_NORM_HEAD) a->dqkw = arena_floats(ar, 2 * m->hd);
    if (any_shared && m->cfg.shared_expert_gate) a->dsgv = arena_floats(ar, N);
    if (any_moe) {
        a->dxd = arena_floats(ar, Nk * d); a->deo = arena_floats(ar, Nk * d);
        a->dxe = ep > 1 ? arena_floats(ar, R * d) : a->dxd;
        a->deoe = ep > 1 ? arena_floats(ar, R * d) : a->deo;
        a->dprobs = arena_floats(ar, N * E); a->dlogits_r = arena_floats(ar, N * E);
        a->dtopk_w = arena_floats(ar, Nk);
    }
    a->dlogits = arena_floats(ar, N * V);
    a->dlogp = arena_floats(ar, N);
    if (m->topo.cp > 1) {   /* whole sequences: B T rows (layer.h, CpView) */
        const size_t BT = a->B * a->T, Hkv = m->attn.Hkv;
        a->cpv.gk = arena_floats(ar, BT * Hkv * m->attn.dk);
        a->cpv.gv = arena_floats(ar, BT * Hkv * m->attn.dv);
        a->cdk = arena_floats(ar, BT * Hkv * m->attn.dk);
        a->cdv = arena_floats(ar, BT * Hkv * m->attn.dv);
    }
}
#undef SLOT

/* The arena a's carve needs (a->B, T, N, mode set, la NULL). */
static size_t acts_arena_need(TrainActs *a, const Model *m)
{
    Arena dry;
    arena_init_dry(&dry);
    carve(a, m, &dry);
    return dry.used;
}

size_t model_train_acts_bytes(const Model *m, size_t B, size_t T, Recompute mode)
{
    TrainActs a;
    memset(&a, 0, sizeof a);
    const size_t cp = (size_t)m->topo.cp;
    a.B = B, a.T = T, a.N = B * T / cp, a.mode = mode;
    const size_t nl = (size_t)(m->topo.layer_end - m->topo.layer_begin);
    const size_t nb = (T + m->attn.bs - 1) / m->attn.bs;
    const size_t n_seq = cp > 1 ? 2 * B : B, n_cp_seqs = cp > 1 ? 2 * cp * B : 0;
    /* what model_train_acts_init allocates: the arena, then its tables */
    return td_round_up(acts_arena_need(&a, m), 64) + (nl + 1) * sizeof(float *) + nl * sizeof(LayerActs) +
           B * nb * sizeof(int32_t) + (n_seq + n_cp_seqs) * sizeof(AttnSeq) + a.N * sizeof(int32_t) +
           (cp > 1 ? 2 * B * sizeof(size_t) : 0);
}

/* Context parallelism: chunk j (0, 1) of cp rank q is chunk q or 2cp-1-q
 * of the sequence (layer.h, CpView). */
static size_t cp_chunk(size_t cp, size_t q, size_t j) { return j ? 2 * cp - 1 - q : q; }

void model_train_acts_init(TrainActs *a, const Model *m, size_t B, size_t T, Recompute mode)
{
    memset(a, 0, sizeof *a);
    const size_t cp = (size_t)m->topo.cp, r = (size_t)m->topo.cp_rank;
    TD_CHECK(cp == 1 || T % (2 * cp * ATTN_TILE) == 0,
             "training: seq_len %zu does not divide into 2 cp = %zu chunks of a multiple of %d positions", T, 2 * cp,
             ATTN_TILE);
    a->B = B;
    a->T = T;
    a->N = B * T / cp;
    a->n_seq = cp > 1 ? 2 * B : B;
    a->mode = mode;
    const int nl = m->topo.layer_end - m->topo.layer_begin;
    arena_init(&a->arena, acts_arena_need(a, m));
    a->la = td_calloc((size_t)nl * sizeof(LayerActs));
    carve(a, m, &a->arena);   /* every activation is carved here: arena.size is the peak */

    const size_t nb = (T + m->attn.bs - 1) / m->attn.bs;
    a->seq_blocks = td_malloc(B * nb * sizeof(int32_t));
    a->seqs = td_malloc(a->n_seq * sizeof(AttnSeq));
    a->pos = td_malloc(a->N * sizeof(int32_t));
    for (size_t b = 0; b < B; b++)
        for (size_t j = 0; j < nb; j++) a->seq_blocks[b * nb + j] = (int32_t)(b * nb + j);
    if (cp == 1) {
        for (size_t b = 0; b < B; b++) {
            a->seqs[b] = (AttnSeq){ b * T, T, 0, a->seq_blocks + b * nb };
            for (size_t t = 0; t < T; t++) a->pos[b * T + t] = (int32_t)t;
        }
        return;
    }
    /* this rank's two chunks of each sequence, the gathered rows of every
     * rank (rank-major, the same layout) */
    const size_t C = T / (2 * cp), N = a->N;
    a->cp_seqs = td_malloc(2 * cp * B * sizeof(AttnSeq));
    a->cp_krow = td_malloc(2 * B * sizeof(size_t));
    for (size_t q = 0; q < cp; q++)
        for (size_t b = 0; b < B; b++)
            for (size_t j = 0; j < 2; j++) {
                const AttnSeq s = { q * N + (2 * b + j) * C, C, cp_chunk(cp, q, j) * C, a->seq_blocks + b * nb };
                a->cp_seqs[(q * B + b) * 2 + j] = s;
                if (q != r) continue;
                /* backward: its keys' gradients in whole-sequence rows (attn_backward) */
                a->seqs[2 * b + j] = (AttnSeq){ s.row - q * N, C, s.pos, s.blocks };
                a->cp_krow[2 * b + j] = b * T;
                for (size_t t = 0; t < C; t++) a->pos[s.row - q * N + t] = (int32_t)(s.pos + t);
            }
    a->cpv = (CpView){ (int)cp, (int)r, B, T, C, a->cp_seqs, 2 * cp * B, a->cpv.gk, a->cpv.gv };
}

void model_train_acts_free(TrainActs *a)
{
    arena_free(&a->arena);
    td_free(a->x);
    td_free(a->la);
    td_free(a->seq_blocks);
    td_free(a->seqs);
    td_free(a->pos);
    td_free(a->cp_seqs);
    td_free(a->cp_krow);
    memset(a, 0, sizeof *a);
}

static ModelBatch batch_of(const TrainActs *a, const int32_t *ids, size_t n_tot)
{
    return (ModelBatch){ a->N, ids, a->pos, a->seqs, a->n_seq, n_tot, a->cpv.cp > 1 ? &a->cpv : NULL };
}

void model_train_forward_layer(const Model *m, TrainActs *a, const int32_t *ids, size_t n_tot, int i)
{
    ModelBatch b = batch_of(a, ids, n_tot);
    model_layer_forward(m, m->topo.layer_begin + i, &b, a->x[i], a->x[i + 1], &a->la[i]);
}

void model_train_forward_layer_ffn(const Model *m, TrainActs *a, const int32_t *ids, size_t n_tot, int i)
{
    ModelBatch b = batch_of(a, ids, n_tot);
    model_layer_forward_ffn(m, m->topo.layer_begin + i, &b, a->x[i + 1], &a->la[i]);
}

void model_train_forward(const Model *m, TrainActs *a, const int32_t *ids, const int32_t *targets,
                         size_t n_tot, LossParts *lp)
{
    const int nl = m->topo.layer_end - m->topo.layer_begin;
    ModelBatch b = batch_of(a, ids, n_tot);
    a->ids = ids;
    a->n_tot_last = n_tot;
    /* pipeline: later stages get x[0] from the previous stage (the caller) */
    const size_t Nl = model_sp_rows(m, a->N);
    if (topo_is_first_stage(&m->topo)) {
        model_embed(m, a->x[0], ids + model_sp_row0(m, a->N), Nl);
        if (a->n_img) {   /* the image vectors take the placeholders' rows */
            TD_CHECK(!m->topo.sp, "images under sequence parallelism (sp=true) are not supported");
            vision_forward(m, a->vis, a->pixels, a->n_img);
            model_vision_scatter(m, a->x[0], ids, a->N, a->vis->out, a->vis->R);
        }
    }
    double aux = 0, z = 0, seq_bal = 0;
    int n_moe = 0;
    for (int i = 0; i < nl; i++) {
        int l = m->topo.layer_begin + i;
        model_layer_forward(m, l, &b, a->x[i], a->x[i + 1], &a->la[i]);
        if (m->layers[l].moe) {
            aux += a->la[i].aux;
            z += a->la[i].z;
            n_moe++;
            if (a->seq_bal && m->cfg.scoring_func == ROUTER_SIGMOID)   /* local sequences */
                for (size_t s = 0; s < a->B; s++)
                    seq_bal += moe_seq_balance(a->la[i].probs + s * a->T * m->E_global,
                                               a->la[i].topk_idx + s * a->T * m->k, a->T, m->E_global, m->k);
            if (lp && lp->expert_share_min) {
                double mn = INFINITY, mx = 0, tot = (double)n_tot * (double)m->k;
                for (size_t e = 0; e < m->E_global; e++) {
                    double s = a->la[i].count[e] / tot;
                    mn = s < mn ? s : mn;
                    mx = s > mx ? s : mx;
                }
                lp->expert_share_min[i] = mn;
                lp->expert_share_max[i] = mx;
            }
        } else if (lp && lp->expert_share_min) {
            lp->expert_share_min[i] = lp->expert_share_max[i] = NAN;
        }
    }
    double ce = 0;
    if (topo_is_last_stage(&m->topo)) {
        /* the head runs on every row (replicated over tp, as without sp):
         * with sp the stage's output rows are gathered first */
        const double t0 = td_now();
        const float *xh = a->x[nl];
        if (m->topo.sp) {
            model_sp_gather(m, a->scratch.h1g, a->x[nl], a->N);
            xh = a->scratch.h1g;
        }
        model_head(m, a->logits, a->hn, a->rstdf, xh, a->N);
        logsoftmax_xent_forward(a->logp, a->lse_v, a->logits, targets, a->N, m->V);
        for (size_t t = 0; t < a->N; t++) ce -= (double)a->logp[t];
        a->t_head += td_now() - t0;
    }
    if (!lp) return;
    lp->ce_sum = ce;
    lp->n_moe = n_moe;
    lp->aux = n_moe ? aux / n_moe : 0.0;
    lp->z = n_moe ? z / n_moe : 0.0;
    lp->seq_bal_sum = seq_bal;
}

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

/* Sum over the tensor-parallel group (column-parallel input gradients are
 * partial sums over the shards). */
static void tp_sum(const Model *m, float *buf, size_t n)
{
    if (m->comm.tp_allreduce && m->topo.tp > 1) m->comm.tp_allreduce(m->comm.ctx, buf, n);
}

/* Sequence parallelism: the gradient of a replicated vector (a norm
 * weight, o_proj's bias; d floats) from this rank's rows is a part of the
 * whole: vec_grad gives where backward adds it (p->g without sp; a->dvec,
 * zeroed, with sp) and vec_grad_done sums that over tp into p->g.  The
 * only gradients sp leaves partial (the head runs on every row). */
static float *vec_grad(const Model *m, TrainActs *a, const Param *p)
{
    if (!m->topo.sp) return p->g;
    TD_CHECK(p->numel <= m->d, "%s: %zu floats, dvec holds %zu", p->name, p->numel, m->d);
    memset(a->dvec, 0, p->numel * sizeof(float));
    return a->dvec;
}

static void vec_grad_done(const Model *m, TrainActs *a, Param *p)
{
    if (!m->topo.sp) return;
    tp_sum(m, a->dvec, p->numel);
    for (size_t i = 0; i < p->numel; i++) p->g[i] += a->dvec[i];
}

/* Backward of a replicated projection y = x W^T inside the tp region (its
 * input x the gathered rows, N of them; the router, MLA's down
 * projections): dW from all N rows, as every rank computes it without sp;
 * dx (Nl rows) only for this rank's rows under sp, else all.  The GEMMs
 * are row-invariant: a row's dx has the bits of the N-row call's. */
static void rep_linear_backward(const Model *m, float *dxl, float *dW, const float *dy, const float *xg,
                                const float *W, size_t N, size_t n_out, size_t K)
{
    if (!m->topo.sp) {
        linear_backward(dxl, dW, dy, xg, W, N, n_out, K);
        return;
    }
    const size_t r0 = model_sp_row0(m, N);
    linear_backward(NULL, dW, dy, xg, W, N, n_out, K);
    linear_backward(dxl, NULL, dy + r0 * n_out, xg + r0 * K, W, model_sp_rows(m, N), n_out, K);
}

static const float *expert_w(const Param *p, size_t e) { return p->w + e * p->lshape[1] * p->lshape[2]; }
static float *expert_g(const Param *p, size_t e) { return p->g + e * p->lshape[1] * p->lshape[2]; }

void model_experts_backward(Model *m, const Layer *L, const LayerActs *la, float *dxe, const float *deoe,
                            float *deh, float *deg, float *deu)
{
    /* experts: eoe = eh Wd^T, eh = swiglu(eg, eu), eg/eu = xe Wg^T / xe Wu^T.
     * Every expert's products in three regions (gemm_bw_group): down's dx
     * and dW; then gate's dx and the dW of gate and up; then up's dx, which
     * adds into the same dxe rows as gate's, after it. */
    const size_t R = la->n_recv, d = m->d, F = m->F, E = m->E;
    GemmBwProblem *g = la->bprob;
    int n = 0;
    zero(deh, R * F); zero(deg, R * F); zero(deu, R * F);
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)la->e_off[e], M = (size_t)la->e_off[e + 1] - r0;
        g[n++] = (GemmBwProblem){ 0, deh + r0 * F, F, deoe + r0 * d, d, expert_w(L->edown, e), F, M, d, F };
        g[n++] = (GemmBwProblem){ 1, expert_g(L->edown, e), F, deoe + r0 * d, d, la->eh + r0 * F, F, M, d, F };
    }
    gemm_bw_group(g, n);
    swiglu_backward(deg, deu, deh, la->eg, la->eu, R, F);
    n = 0;
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)la->e_off[e], M = (size_t)la->e_off[e + 1] - r0;
        g[n++] = (GemmBwProblem){ 0, dxe + r0 * d, d, deg + r0 * F, F, expert_w(L->egate, e), d, M, F, d };
        g[n++] = (GemmBwProblem){ 1, expert_g(L->egate, e), d, deg + r0 * F, F, la->xe + r0 * d, d, M, F, d };
        g[n++] = (GemmBwProblem){ 1, expert_g(L->eup, e), d, deu + r0 * F, F, la->xe + r0 * d, d, M, F, d };
    }
    gemm_bw_group(g, n);
    n = 0;
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)la->e_off[e], M = (size_t)la->e_off[e + 1] - r0;
        g[n++] = (GemmBwProblem){ 0, dxe + r0 * d, d, deu + r0 * F, F, expert_w(L->eup, e), d, M, F, d };
    }
    gemm_bw_group(g, n);
}

/* FFN backward: the parameter gradients, and the gradient of h2 summed
 * over tp, returned: a->dh (zeroed by the caller) with all N rows, or
 * under sequence parallelism a->dtmp with this rank's Nl rows.  dy =
 * gradient of the FFN output (N, d, every row). */
static float *ffn_backward(Model *m, const Layer *L, TrainActs *a, LayerActs *la, const float *dy,
                           float daux, float dz)
{
    const size_t N = a->N, d = m->d;
    float *dh2 = a->dh, *dhl = m->topo.sp ? a->dtmp : a->dh;
    if (!L->moe) {
        const size_t Fd = m->Fd;
        float *dfh = a->dfa, *dfg = a->dfb, *dfu = a->dfc;
        zero(dfh, N * Fd); zero(dfg, N * Fd); zero(dfu, N * Fd);
        linear_backward(dfh, L->down->g, dy, la->fh, L->down->w, N, d, Fd);
        swiglu_backward(dfg, dfu, dfh, la->fg, la->fu, N, Fd);
        linear_backward(dh2, L->gate->g, dfg, la->h2g, L->gate->w, N, Fd, d);
        linear_backward(dh2, L->up->g, dfu, la->h2g, L->up->w, N, Fd, d);
        model_tp_reduce_rows(m, dhl, dh2, N);
        return dhl;
    }
    const size_t E = m->E_global, k = m->k, Nk = N * k;
    if (L->sgate) {
        const size_t S = m->S;
        float *dsh = a->dfa, *dsg = a->dfb, *dsu = a->dfc;
        zero(dsh, N * S);
        if (L->sgw) {
            /* ys = shg Ws^T, shg = g sh: recompute shg (the forward's bits) */
            float *shg = dsg, *dshg = dsu;
            row_scale_forward(shg, la->sgv, la->sh, N, S);
            zero(dshg, N * S);
            linear_backward(dshg, L->sdown->g, dy, shg, L->sdown->w, N, d, S);
            zero(a->dsgv, N);
            row_scale_backward(dsh, a->dsgv, dshg, la->sh, la->sgv, N, S);
            tp_sum(m, a->dsgv, N);   /* sh is this shard's slice of S */
        } else {
            linear_backward(dsh, L->sdown->g, dy, la->sh, L->sdown->w, N, d, S);
        }
        zero(dsg, N * S); zero(dsu, N * S);
        swiglu_backward(dsg, dsu, dsh, la->sg, la->su, N, S);
        linear_backward(dh2, L->sgate->g, dsg, la->h2g, L->sgate->w, N, S, d);
        linear_backward(dh2, L->sup->g, dsu, la->h2g, L->sup->w, N, S, d);
    }
    /* combine: y_t = sum_j w_tj eo_row(t,j) */
    zero(a->deo, Nk * d);
    zero(a->dtopk_w, Nk);
    moe_combine_backward(a->deo, a->dtopk_w, dy, la->eo, la->topk_w, &la->plan, N, k, d);
    tp_sum(m, a->dtopk_w, Nk);   /* eo is this shard's partial expert output */
    /* to the ranks owning the experts (identity without ep) */
    model_ep_back_to_experts(m, la, a->deo, a->deoe, Nk);
    const size_t R = la->n_recv;
    zero(a->dxe, R * d);
    model_experts_backward(m, L, la, a->dxe, a->deoe, a->dfa, a->dfb, a->dfc);
    /* back to the ranks owning the tokens */
    model_ep_from_experts(m, la, a->dxe, a->dxd, Nk);
    moe_dispatch_backward(dh2, a->dxd, &la->plan, N, k, d);
    /* experts and shared experts are column-parallel: sum their input
     * gradients; the router is replicated, its part is added once, below
     * (under sp, for this rank's rows) */
    model_tp_reduce_rows(m, dhl, dh2, N);
    const double t_r = td_now();
    zero(a->dprobs, N * E);
    zero(a->dlogits_r, N * E);
    if (m->cfg.scoring_func == ROUTER_SIGMOID) {
        /* w = scale * s[topk] (/ sum), s = sigmoid(logits), the choice fixed;
         * plus the sequence-wise balance loss (through P_e) */
        const MoeSigmoidRouter r = model_sigmoid_router(&m->cfg);
        moe_sigmoid_topk_backward(a->dprobs, a->dtopk_w, la->probs, la->topk_idx, N, E, k, &r);
        if (a->dseq_bal != 0.0f)
            for (size_t b = 0; b < a->B; b++)
                moe_seq_balance_backward(a->dprobs + b * a->T * E, a->dseq_bal, la->probs + b * a->T * E,
                                         la->topk_idx + b * a->T * k, a->T, E, k);
        moe_sigmoid_backward(a->dlogits_r, a->dprobs, la->probs, N, E);
    } else {
        /* router: w = topk(softmax(logits)), plus aux (through P_e) and z */
        moe_topk_backward(a->dprobs, a->dtopk_w, la->probs, la->topk_idx, N, E, k, m->cfg.norm_topk_prob);
        if (daux != 0.0f) moe_aux_backward(a->dprobs, daux, la->count, N, a->n_tot_last, E, k);
        softmax_backward(a->dlogits_r, a->dprobs, la->probs, N, E);
        if (dz != 0.0f) moe_z_backward(a->dlogits_r, dz, la->rlse, la->probs, N, a->n_tot_last, E);
    }
    rep_linear_backward(m, dhl, L->router->g, a->dlogits_r, la->h2g, L->router->w, N, E, d);
    a->bt_router += td_now() - t_r;
    if (L->sgw) {
        const size_t r0 = model_sp_row0(m, N);
        sigmoid_gate_backward(NULL, L->sgw->g, a->dsgv, la->h2g, L->sgw->w, la->sgv, N, d);
        sigmoid_gate_backward(dhl, NULL, a->dsgv + r0, la->h2g + r0 * d, L->sgw->w, la->sgv + r0,
                              model_sp_rows(m, N), d);
    }
    return dhl;
}

/* Gradients of the q/k/v projections (qr, kr, vr) from those of the q, k,
 * v fed to RoPE and attention (a->dq, a->dk after rope backward, a->dv):
 * through the clamp (its mask from the clamp's input: the norm's output,
 * recomputed bit for bit from the saved rstd, or qr/kr themselves) and the
 * q/k norm.  Returns the buffers now holding dqr, dkr; dvr is left in
 * a->dv. */
static void qk_pre_backward(Model *m, const Layer *L, TrainActs *a, const LayerActs *la, float **dqr, float **dkr)
{
    const size_t N = a->N, hd = m->hd, Hq = m->H * hd, Hk = m->Hkv * hd;
    const bool head = m->cfg.qk_norm == QK_NORM_HEAD;
    const size_t nq = head ? N * m->H : N, nk = head ? N * m->Hkv : N;   /* norm rows */
    const size_t wq = head ? hd : Hq, wk = head ? hd : Hk;                /* and width */
    *dqr = a->dq;
    *dkr = a->dk;
    if (!m->qk_pre) return;
    if (m->clip > 0) {
        const float *qin = la->qr, *kin = la->kr;
        if (L->qn) {
            rmsnorm_apply(a->dqr, la->qr, la->rstdq, L->qn->w, nq, wq);
            rmsnorm_apply(a->dkr, la->kr, la->rstdk, L->kn->w, nk, wk);
            qin = a->dqr;
            kin = a->dkr;
        }
        clamp_backward(a->dq, qin, N * Hq, m->clip);
        clamp_backward(a->dk, kin, N * Hk, m->clip);
        clamp_backward(a->dv, la->vr, N * Hk, m->clip);
    }
    if (!L->qn) return;
    zero(a->dqr, N * Hq);
    zero(a->dkr, N * Hk);
    if (head) {
        /* one weight for every head, replicated over tp: this rank's heads
         * give part of its gradient, summed over the group before adding */
        zero(a->dqkw, 2 * hd);
        rmsnorm_backward(a->dqr, a->dqkw, a->dq, la->qr, L->qn->w, la->rstdq, nq, hd);
        rmsnorm_backward(a->dkr, a->dqkw + hd, a->dk, la->kr, L->kn->w, la->rstdk, nk, hd);
        tp_sum(m, a->dqkw, 2 * hd);
        for (size_t i = 0; i < hd; i++) {
            L->qn->g[i] += a->dqkw[i];
            L->kn->g[i] += a->dqkw[hd + i];
        }
    } else {
        /* the row's dot spans every rank's heads */
        rmsnorm_dot(a->qkdot, a->dq, la->qr, L->qn->w, N, Hq);
        rmsnorm_dot(a->qkdot + N, a->dk, la->kr, L->kn->w, N, Hk);
        tp_sum(m, a->qkdot, 2 * N);
        rmsnorm_scale_backward(a->dqr, L->qn->g, a->dq, la->qr, L->qn->w, la->rstdq, a->qkdot, N, Hq,
                               L->qn->shape[0]);
        rmsnorm_scale_backward(a->dkr, L->kn->g, a->dk, la->kr, L->kn->w, la->rstdk, a->qkdot + N, N, Hk,
                               L->kn->shape[0]);
    }
    *dqr = a->dqr;
    *dkr = a->dkr;
}

/* Context parallelism: copies the rows of chunk j of each of rank q's B
 * sequences (rows of width w; rank-major, N rows a rank, chunk j of
 * sequence b at row q N + (2b + j) C) from the whole sequences (row bT +
 * position). */
static void cp_rank_rows(const CpView *cp, float *out, const float *whole, size_t q, size_t w)
{
    const size_t C = cp->C, N = 2 * cp->B * C;
    for (size_t b = 0; b < cp->B; b++)
        for (size_t j = 0; j < 2; j++)
            memcpy(out + (q * N + (2 * b + j) * C) * w, whole + (b * cp->T + cp_chunk((size_t)cp->cp, q, j) * C) * w,
                   C * w * sizeof(float));
}

/* attention_backward for the batch: adds into a->dq, a->dk, a->dv (zeroed
 * by the caller) from dout = a->datt.  Under context parallelism this
 * rank's query chunks run against the whole sequences' keys (in la->kv
 * since the forward's gather); their dK, dV land in whole-sequence rows
 * (gk, gv: sequence b's key s at row bT + s), are laid out rank-major
 * (cdk, cdv) and summed onto the keys' owners (reduce-scatter). */
static void attn_backward(Model *m, const Layer *L, TrainActs *a, const LayerActs *la, const ModelBatch *b)
{
    const CpView *cp = b->cp;
    const AttnShape shape = model_layer_attn(m, L), *sh = &shape;
    if (!cp) {
        attention_backward(a->dq, a->dk, a->dv, a->datt, la->q, la->att, la->lse, la->kv, b->seqs, b->n_seq, sh);
        return;
    }
    const size_t BT = cp->B * cp->T, N = a->N, wk = sh->Hkv * sh->dk, wv = sh->Hkv * sh->dv;
    zero(cp->gk, BT * wk);
    zero(cp->gv, BT * wv);
    attention_backward_chunks(a->dq, cp->gk, cp->gv, a->datt, la->q, la->att, la->lse, la->kv, b->seqs, b->n_seq,
                              a->cp_krow, sh);
    for (size_t q = 0; q < (size_t)cp->cp; q++) {
        cp_rank_rows(cp, a->cdk, cp->gk, q, wk);
        cp_rank_rows(cp, a->cdv, cp->gv, q, wv);
    }
    m->comm.cp_reduce_scatter(m->comm.ctx, a->dk, a->cdk, N * wk);
    m->comm.cp_reduce_scatter(m->comm.ctx, a->dv, a->cdv, N * wv);
}

/* MLA's attention block backward (file comment): dxo (N, d) holds the
 * gradient of x_mid; returns the attention block's part of the gradient of
 * h1 (a->dh with N rows, or under sp a->dtmp with this rank's Nl) and adds
 * every attention tensor's gradient. */
static float *mla_backward(Model *m, const Layer *L, TrainActs *a, LayerActs *la, const ModelBatch *b,
                           const float *dxo)
{
    const MlaDims *md = &m->mla_dims;
    const size_t N = a->N, d = m->d, r = md->r, rope = md->rope, qk = md->nope + rope, kw = r + rope;
    const size_t qr = (size_t)m->cfg.q_lora_rank, Hqk = md->H * qk, Hv = md->H * md->v;
    const bool inter = m->cfg.rope_interleave;
    /* o_proj's input: kept (none), just recomputed by the layer (full), or
     * recomputed here from the recomputed att (selective): the forward's bits */
    if (a->mode == RECOMPUTE_SELECTIVE) mla_absorb_o_forward(la->matt, la->att, L->kvb->w, N, md);
    zero(a->dmatt, N * Hv);
    linear_backward(a->dmatt, L->o->g, dxo, la->matt, L->o->w, N, d, Hv);
    zero(a->datt, N * m->ao);
    mla_absorb_o_backward(a->datt, L->kvb->g, a->dmatt, la->att, L->kvb->w, N, md);
    zero(a->dq, N * m->aq); zero(a->dk, N * kw); zero(a->dv, N * r);
    attn_backward(m, L, a, la, b);
    zero(a->dmq, N * Hqk);
    mla_absorb_q_backward(a->dmq, L->kvb->g, a->dq, la->mq, L->kvb->w, N, md);
    rope_backward_at(a->dmq, b->pos, &m->rope, N, md->H, qk, md->nope, rope, inter);
    /* the key [c_kv normed, k_rope] and the value c_kv normed: this rank's heads' part */
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < r; j++) a->dk[t * kw + j] += a->dv[t * r + j];
    tp_sum(m, a->dk, N * kw);
    rope_backward_at(a->dk, b->pos, &m->rope, N, 1, kw, r, rope, inter);
    for (size_t t = 0; t < N; t++) memcpy(a->dckvn + t * r, a->dk + t * kw, r * sizeof(float));
    zero(a->dckv, N * r);
    rmsnorm_backward(a->dckv, L->kvan->g, a->dckvn, la->ckv, L->kvan->w, la->rstdkv, N, r);
    for (size_t t = 0; t < N; t++) {
        memcpy(a->dkva + t * kw, a->dckv + t * r, r * sizeof(float));
        memcpy(a->dkva + t * kw + r, a->dk + t * kw + r, rope * sizeof(float));
    }
    float *dhl = m->topo.sp ? a->dtmp : a->dh;
    if (L->qa) {
        zero(a->dcqn, N * qr);
        linear_backward(a->dcqn, L->q->g, a->dmq, la->cqn, L->q->w, N, Hqk, qr);
        tp_sum(m, a->dcqn, N * qr);
        zero(a->dcq, N * qr);
        rmsnorm_backward(a->dcq, L->qan->g, a->dcqn, la->cq, L->qan->w, la->rstdcq, N, qr);
        zero(dhl, model_sp_rows(m, N) * d);
    } else {
        zero(a->dh, N * d);
        linear_backward(a->dh, L->q->g, a->dmq, la->h1g, L->q->w, N, Hqk, d);
        model_tp_reduce_rows(m, dhl, a->dh, N);   /* q_proj is column-parallel; what follows is replicated */
    }
    rep_linear_backward(m, dhl, L->kva->g, a->dkva, la->h1g, L->kva->w, N, kw, d);
    if (L->qa) rep_linear_backward(m, dhl, L->qa->g, a->dcq, la->h1g, L->qa->w, N, qr, d);
    return dhl;
}

/* Backward of local layer i; a->dx holds the gradient of its output and
 * receives the gradient of its input. */
static void layer_backward(Model *m, TrainActs *a, int i, float daux, float dz)
{
    const int l = m->topo.layer_begin + i;
    const Layer *L = &m->layers[l];
    LayerActs *la = &a->la[i];
    const size_t N = a->N, d = m->d, hd = m->hd, Hq = m->H * hd, Hk = m->Hkv * hd;
    const size_t Nl = model_sp_rows(m, N);   /* dx, x_mid, the norms: this rank's rows under sp */
    ModelBatch b = batch_of(a, a->ids, a->n_tot_last);

    if (a->mode == RECOMPUTE_FULL) {
        model_layer_forward(m, l, &b, a->x[i], a->dtmp, la);
        /* sp: the MoE block used h1g as its scratch (layer.c) */
        if (m->topo.sp) model_sp_gather(m, la->h1g, la->h1, N);
    } else {
        /* sp: the gathered norms are scratch that later layers overwrote */
        if (m->topo.sp) {
            model_sp_gather(m, la->h1g, la->h1, N);
            model_sp_gather(m, la->h2g, la->h2, N);
        }
        if (a->mode == RECOMPUTE_SELECTIVE) {
            const AttnShape sh = model_layer_attn(m, L);
            attention_forward(la->att, la->lse, la->q, la->kv, b.seqs, b.n_seq, &sh);
            model_ffn_recompute(m, l, &b, la);
        }
    }

    /* FFN block (sp: x_out = x_mid + reduce-scatter(y), so dy = all-gather(dx)) */
    const double t0 = td_now();
    zero(a->dh, N * d);
    model_sp_gather(m, a->dxg, a->dx, N);
    float *dhl = ffn_backward(m, L, a, la, a->dxg, daux, dz);
    rmsnorm_backward(a->dx, vec_grad(m, a, L->ln2), dhl, la->x_mid, L->ln2->w, la->rstd2, Nl, d);
    vec_grad_done(m, a, L->ln2);
    const double t1 = td_now();
    a->bt_ffn += t1 - t0;

    /* attention block (sp: again dx gathered for o_proj's backward) */
    model_sp_gather(m, a->dxg, a->dx, N);
    if (m->mla) {
        dhl = mla_backward(m, L, a, la, &b, a->dxg);
        rmsnorm_backward(a->dx, vec_grad(m, a, L->ln1), dhl, a->x[i], L->ln1->w, la->rstd1, Nl, d);
        vec_grad_done(m, a, L->ln1);
        a->bt_attn += td_now() - t1;
        return;
    }
    if (L->ob) {   /* replicated: dx is the summed gradient (sp: of this rank's rows) */
        bias_backward(vec_grad(m, a, L->ob), a->dx, Nl, d);
        vec_grad_done(m, a, L->ob);
    }
    zero(a->datt, N * Hq);
    linear_backward(a->datt, L->o->g, a->dxg, la->att, L->o->w, N, d, Hq);
    zero(a->dq, N * Hq); zero(a->dk, N * Hk); zero(a->dv, N * Hk);
    attn_backward(m, L, a, la, &b);
    rope_backward(a->dq, b.pos, &m->rope, N, m->H, hd);
    rope_backward(a->dk, b.pos, &m->rope, N, m->Hkv, hd);
    float *dqr, *dkr;
    qk_pre_backward(m, L, a, la, &dqr, &dkr);
    if (L->qb) {
        bias_backward(L->qb->g, dqr, N, Hq);
        bias_backward(L->kb->g, dkr, N, Hk);
        bias_backward(L->vb->g, a->dv, N, Hk);
    }
    zero(a->dh, N * d);
    linear_backward(a->dh, L->q->g, dqr, la->h1g, L->q->w, N, Hq, d);
    linear_backward(a->dh, L->k->g, dkr, la->h1g, L->k->w, N, Hk, d);
    linear_backward(a->dh, L->v->g, a->dv, la->h1g, L->v->w, N, Hk, d);
    dhl = m->topo.sp ? a->dtmp : a->dh;
    model_tp_reduce_rows(m, dhl, a->dh, N);   /* q/k/v are column-parallel */
    rmsnorm_backward(a->dx, vec_grad(m, a, L->ln1), dhl, a->x[i], L->ln1->w, la->rstd1, Nl, d);
    vec_grad_done(m, a, L->ln1);
    a->bt_attn += td_now() - t1;
}

void model_train_backward(Model *m, TrainActs *a, const int32_t *targets, const float *dlogp,
                          float daux, float dz)
{
    const size_t N = a->N, d = m->d, V = m->V;
    const int nl = m->topo.layer_end - m->topo.layer_begin;
    if (topo_is_last_stage(&m->topo)) {
        /* head: logp = logsoftmax(hn lm_head^T)[target], hn = rmsnorm(x_L) */
        const double t0 = td_now();
        zero(a->dlogits, N * V);
        logsoftmax_xent_backward(a->dlogits, dlogp, a->logits, a->lse_v, targets, N, V);
        zero(a->dh, N * d);
        linear_backward(a->dh, m->lm_head->g, a->dlogits, a->hn, m->lm_head->w, N, V, d);
        /* sp: the head ran on the gathered rows (replicated); its input
         * gradient is every row's, of which this rank keeps its own */
        const float *xh = a->x[nl];
        if (m->topo.sp) {
            model_sp_gather(m, a->scratch.h1g, a->x[nl], N);
            xh = a->scratch.h1g;
        }
        zero(a->dxg, N * d);
        rmsnorm_backward(a->dxg, m->norm->g, a->dh, xh, m->norm->w, a->rstdf, N, d);
        if (m->topo.sp)
            memcpy(a->dx, a->dxg + model_sp_row0(m, N) * d, model_sp_rows(m, N) * d * sizeof(float));
        a->t_head += td_now() - t0;
        if (m->comm.grad_ready) m->comm.grad_ready(m->comm.ctx, m->cfg.num_hidden_layers);
    }   /* else the caller put the next stage's gradient of x[nl] into a->dx */
    for (int i = nl - 1; i >= 0; i--) {
        layer_backward(m, a, i, daux, dz);
        if (m->comm.grad_ready) m->comm.grad_ready(m->comm.ctx, m->topo.layer_begin + i);
    }
    if (topo_is_first_stage(&m->topo)) {
        model_sp_gather(m, a->dxg, a->dx, N);   /* sp: every row's, as without sp */
        if (a->n_img) {
            model_vision_gather(m, a->vis->dout, a->dxg, a->ids, N, a->vis->R);
            vision_backward(m, a->vis, a->vis->dout);
        }
        embedding_backward(m->embed->g, a->dxg, a->ids, N, d);
        if (m->comm.grad_ready) m->comm.grad_ready(m->comm.ctx, -1);
    }   /* else a->dx is the gradient of x[0], for the previous stage */
}

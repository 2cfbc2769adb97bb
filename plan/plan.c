/* plan/plan.c - per-rank memory, communication and step time of a layout
 * (plan.h).  Memory: the allocators' own size functions on a model shape;
 * communication: the volumes of docs/scaling.md. */
#include "plan/plan.h"
#include "core/common.h"
#include "core/model/expert_cache.h"
#include "core/model/model.h"
#include "core/model/topology.h"
#include "infer/engine.h"
#include "train/trainer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const plan_group_names[PLAN_N_GROUPS] = { "tp", "ep", "pp", "dp", "cp" };
const char *const plan_cat_names[PLAN_N_CATS] = { "weights", "gradients", "optimizer", "activations",
                                                  "kv_cache", "comm", "workspace", "total" };

void plan_opts_default(PlanOpts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = PLAN_TRAIN;
    o->seq_len = 4096;
    o->micro_batch = 0;        /* 0: one sequence per dp rank */
    o->grad_accum = 8;
    o->recompute = RECOMPUTE_FULL;
    o->zero = true;
    o->cp = 1;
    o->context = 8192;
    o->concurrency = 64;
    o->max_batch_tokens = 512;
    o->prefill_chunk = 256;
    o->dtype = DTYPE_BF16;
    o->kv_dtype = DTYPE_BF16;
    o->flops = 400e12;         /* sustained, per device */
    o->hbm_bps = 3.0e12;
    o->intra_bps = 400e9;      /* NVLink-class, per rank */
    o->inter_bps = 50e9;       /* 400 Gb/s per rank */
    o->node_size = 8;
}

/* Ring all-reduce: 2 (P - 1) / P of the buffer per rank. */
static double ring(double bytes, int P) { return P > 1 ? 2.0 * (P - 1) / P * bytes : 0; }
/* All-to-all: the (P - 1) / P of the buffer that leaves the rank. */
static double a2a(double bytes, int P) { return P > 1 ? (double)(P - 1) / P * bytes : 0; }

/* Bandwidth of a group whose ranks span `span` consecutive ranks. */
static double group_bps(const PlanOpts *o, int span)
{
    return span <= o->node_size ? o->intra_bps : o->inter_bps;
}

/* Non-expert and expert floats a rank of model shape m holds. */
static void held_floats(const Model *m, double *w_ne, double *w_e)
{
    *w_ne = *w_e = 0;
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        if (p->tied_copy) continue;
        if (p->ep_dim >= 0) *w_e += (double)p->numel;
        else *w_ne += (double)p->numel;
    }
}

static int n_moe_local(const Model *m)
{
    int n = 0;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) n += m->layers[l].moe;
    return n;
}

static void fail(PlanResult *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(PlanResult *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
    r->feasible = false;
}

/* Training: the bytes of stage s's ranks (tp rank 0, dp rank 0; every rank
 * of a stage holds the same: topo_init requires even splits). */
static int train_stage(const ModelConfig *cfg, const PlanOpts *o, PlanLayout l, int s, TrainMem *tm,
                       Model *m, char *err, size_t err_len)
{
    Topology t;
    if (topo_init(&t, cfg, l.dp, l.tp, l.pp, l.ep, l.cp, s * l.dp * l.cp * l.tp, NULL, err, err_len)) return -1;
    t.sp = o->sp && l.tp > 1;   /* as the trainer sets it: the activation carve follows */
    model_init_shape(m, cfg, &t, 16, NULL);
    train_mem(m, (size_t)(o->micro_batch / l.dp), (size_t)o->seq_len, o->grad_accum, o->recompute, o->zero, tm);
    return 0;
}

static void plan_train(const ModelConfig *cfg, const PlanOpts *o, PlanLayout l, PlanResult *r)
{
    char err[256];
    const int mb = o->global_batch > 0 || !o->micro_batch ? l.dp : o->micro_batch;
    PlanOpts oo = *o;
    oo.micro_batch = mb;
    if (o->global_batch > 0) {
        if (o->global_batch % l.dp) return fail(r, "dp=%d does not divide global_batch=%d", l.dp, o->global_batch);
        oo.grad_accum = o->global_batch / l.dp;
    }
    r->micro_batch = mb;
    r->grad_accum = oo.grad_accum;
    if (mb % l.dp) return fail(r, "dp=%d does not divide micro_batch=%d", l.dp, mb);
    const bool sp = o->sp && l.tp > 1;
    if (sp && (long long)(mb / l.dp) * o->seq_len % l.tp)
        return fail(r, "sp: tp=%d does not divide the %lld rows of a micro-batch per dp rank", l.tp,
                    (long long)(mb / l.dp) * o->seq_len);
    if (o->seq_len > cfg->max_position_embeddings)
        return fail(r, "seq_len=%d exceeds max_position_embeddings=%d", o->seq_len, cfg->max_position_embeddings);
    if (l.cp > 1 && o->seq_len % (2 * l.cp * ATTN_TILE))
        return fail(r, "cp=%d needs seq_len divisible into 2*cp = %d chunks of a multiple of %d positions, "
                    "seq_len=%d is not", l.cp, 2 * l.cp, ATTN_TILE, o->seq_len);
    double best = -1;
    Model keep;
    memset(&keep, 0, sizeof keep);
    for (int s = 0; s < l.pp; s++) {
        TrainMem tm;
        Model m;
        if (train_stage(cfg, &oo, l, s, &tm, &m, err, sizeof err)) {
            model_free(&keep);
            return fail(r, "%s", err);
        }
        r->stage_total[s] = (double)tm.total;
        if ((double)tm.total > best) {
            best = (double)tm.total;
            r->stage = s;
            r->bytes[PLAN_WEIGHTS] = (double)tm.weights;
            r->bytes[PLAN_GRADIENTS] = (double)tm.gradients;
            r->bytes[PLAN_OPTIMIZER] = (double)tm.optimizer;
            r->bytes[PLAN_ACTIVATIONS] = (double)tm.activations;
            r->bytes[PLAN_KV_CACHE] = 0;
            r->bytes[PLAN_COMM] = (double)tm.comm;
            r->bytes[PLAN_WORKSPACE] = (double)tm.workspace;
            r->bytes[PLAN_TOTAL] = (double)tm.total;
        }
        /* stage 0 stands for the communication (it holds the embedding;
         * tp, ep and dp volumes of the layers are alike on every stage) */
        if (s == 0) keep = m;
        else model_free(&m);
    }
    /* communication per rank per step (docs/scaling.md, wire volumes) */
    const Model *m = &keep;
    /* N: this rank's rows of a micro-batch (its 2 chunks of each sequence under cp) */
    const double N = (double)(mb / l.dp) * o->seq_len / l.cp, ga = oo.grad_accum, d = (double)m->d;
    const double k = (double)m->k;
    const int nl = m->topo.layer_end - m->topo.layer_begin, nm = n_moe_local(m);
    /* forward passes of a layer per micro-batch: 1, plus the re-run of
     * recompute (full: the whole layer; selective: the FFN / experts) */
    const double fw_tp = o->recompute == RECOMPUTE_FULL ? 2 : 1;
    const double fw_ep = o->recompute == RECOMPUTE_NONE ? 1 : 2;
    double w_ne, w_e;
    held_floats(m, &w_ne, &w_e);
    /* tp: o_proj and FFN output all-reduce per forward, two input-gradient all-reduces in backward */
    r->comm[PLAN_TP] = ga * nl * (2 * fw_tp + 2) * ring(N * d * 4, l.tp);
    if (sp) {
        /* sequence parallelism (docs/scaling.md): an all-gather and a
         * reduce-scatter, half a ring each, for every all-reduce; backward
         * gathers the two norms' rows again (only h1 after recompute=full's
         * re-run), and the head (last stage: forward and backward) and the
         * embedding's gradient (first stage) gather the stage's rows */
        const double again = o->recompute == RECOMPUTE_FULL ? 0.5 : 1;
        const double ends = (topo_is_first_stage(&m->topo) ? 0.5 : 0) + (topo_is_last_stage(&m->topo) ? 1 : 0);
        r->comm[PLAN_TP] = ga * (nl * (2 * fw_tp + 2 + again) + ends) * ring(N * d * 4, l.tp);
    }
    /* ep: dispatch and return per forward, and both again in backward */
    r->comm[PLAN_EP] = ga * nm * (2 * fw_ep + 2) * a2a(N * k * d * 4, l.ep);
    /* pp: activations forward, gradients backward, each micro-batch; tied embeddings once */
    r->comm[PLAN_PP] = l.pp > 1 ? ga * 2 * (sp ? N / l.tp : N) * d * 4 + (cfg->tie_word_embeddings ? 2.0 * m->V * d * 4 : 0)
                                : 0;   /* sp: a stage sends its rows */
    /* dp: gradient sums once per step (ZeRO: reduce-scatter + all-gather, the same volume),
     * expert gradients over the dp / ep ranks holding the same experts; router statistics */
    r->comm[PLAN_DP] = ring(4 * w_ne, l.dp * l.cp) + ring(4 * w_e, l.dp / l.ep * l.cp) +
                       ga * nm * ring(8.0 * (2 * (double)m->E_global + 1), l.dp * l.cp);
    /* (dp: the cp ranks hold the same weights and sum their gradients with dp's, comm/comm.h) */
    /* cp: every layer's keys and values all-gathered per forward (recompute
     * full: twice), their gradients reduce-scattered in backward, each over
     * the whole sequences of the rank's micro-batch (core/model/layer.h CpView) */
    const double kv_fw = (double)m->attn.Hkv * attn_pos_values(&m->attn) * 4;   /* K (and V unless v_in_k) */
    const double kv_bw = (double)m->attn.Hkv * (m->attn.dk + m->attn.dv) * 4;  /* dK and dV */
    r->comm[PLAN_CP] = ga * nl * (fw_tp * kv_fw + kv_bw) * a2a(N * l.cp, l.cp);
    /* compute: the trainer's model FLOPs per token (6 active params + attention),
     * recompute's extra forward, over the world; 1F1B bubble */
    const double T = o->seq_len;
    double fpt = 6.0 * (double)config_active_param_count(cfg) +
                 6.0 * cfg->num_hidden_layers * (double)cfg->num_attention_heads * cfg->head_dim * T;
    fpt *= o->recompute == RECOMPUTE_FULL ? 8.0 / 6 : o->recompute == RECOMPUTE_SELECTIVE ? 7.0 / 6 : 1;
    const double tokens = (double)mb * T * ga;
    const double bubble = (ga + l.pp - 1) / ga;
    r->compute_s = tokens * fpt / ((double)o->world * o->flops) * bubble;
    r->comm_s = r->comm[PLAN_TP] / group_bps(o, l.tp) + r->comm[PLAN_EP] / group_bps(o, l.tp * l.ep) +
                r->comm[PLAN_PP] / group_bps(o, o->world) + r->comm[PLAN_DP] / group_bps(o, l.tp * l.cp * l.dp) +
                r->comm[PLAN_CP] / group_bps(o, l.tp * l.cp);
    r->est_step_s = r->compute_s + r->comm_s;
    r->tokens_per_s = tokens / r->est_step_s;
    model_free(&keep);
    r->feasible = true;
}

static void plan_serve(const ModelConfig *cfg, const PlanOpts *o, PlanLayout l, PlanResult *r)
{
    char err[256];
    if (l.pp != 1) return fail(r, "pp=%d: tandem serve has no pipeline parallelism (pp must be 1)", l.pp);
    if (o->context > cfg->max_position_embeddings)
        return fail(r, "context=%d exceeds max_position_embeddings=%d", o->context, cfg->max_position_embeddings);
    /* one serving instance: tp x ep ranks, dp = ep (serve_cmd.c); dp / ep instances */
    Topology t;
    if (l.dp % l.ep) return fail(r, "topology: ep=%d does not divide dp=%d (expert groups are carved from dp)", l.ep, l.dp);
    if (topo_init(&t, cfg, l.ep, l.tp, 1, l.ep, 1, 0, NULL, err, sizeof err)) return fail(r, "%s", err);
    ModelDtypes dt = model_dtypes_default(o->dtype);
    Model m;
    if (o->expert_cache_bytes > 0) model_init_shape_offload(&m, cfg, &t, 16, &dt);
    else model_init_shape(&m, cfg, &t, 16, &dt);
    m.attn.kv = o->kv_dtype;
    size_t cache = 0;
    if (o->expert_cache_bytes > 0) {
        if (expert_cache_check(&m, (size_t)o->expert_cache_bytes, err, sizeof err)) {
            model_free(&m);
            return fail(r, "%s", err);
        }
        r->expert_slots = expert_cache_slots_for(&m, (size_t)o->expert_cache_bytes);
        cache = expert_cache_slab_bytes(&m, r->expert_slots);
    }
    /* the KV budget that holds `concurrency` sequences of `context`
     * positions, in whole MiB (serve --kv-mb) */
    const size_t per_block = (size_t)(t.layer_end - t.layer_begin) * attn_block_bytes(&m.attn);
    const size_t blocks = (size_t)o->concurrency * (((size_t)o->context + m.attn.bs - 1) / m.attn.bs);
    EngineOpts eo;
    engine_opts_default(&eo);
    eo.kv_budget_bytes = td_round_up(blocks * per_block, (size_t)1 << 20);
    r->kv_mb = eo.kv_budget_bytes >> 20;
    eo.max_running = (size_t)o->concurrency;
    eo.max_batch_tokens = (size_t)o->max_batch_tokens;
    eo.prefill_chunk = (size_t)o->prefill_chunk;
    eo.n_stop_ids = 1;
    EngineMem em;
    engine_mem(&m, &eo, &em);
    r->bytes[PLAN_WEIGHTS] = (double)(model_weight_bytes(&m) + cache);
    r->bytes[PLAN_KV_CACHE] = (double)em.kv_cache;
    r->bytes[PLAN_ACTIVATIONS] = (double)em.activations;
    r->bytes[PLAN_WORKSPACE] = (double)(em.workspace + model_table_bytes(&m));
    double tot = 0;
    for (int c = 0; c < PLAN_TOTAL; c++) tot += r->bytes[c];
    r->bytes[PLAN_TOTAL] = tot;
    /* a decode step: one row per running sequence */
    const double rows = o->concurrency, d = (double)m.d, k = (double)m.k;
    const int nl = t.layer_end - t.layer_begin, nm = n_moe_local(&m);
    r->comm[PLAN_TP] = nl * 2 * ring(rows * d * 4, l.tp);
    r->comm[PLAN_EP] = nm * 2 * a2a(rows * k * d * 4, l.ep);
    /* compute: 2 active params per token over the instance's ranks; memory:
     * every weight and the average half-full context of KV read once */
    const double kv_read = rows * (o->context / 2.0) * ((double)per_block / m.attn.bs);
    const double fl = 2.0 * (double)config_active_param_count(cfg) * rows / ((double)l.tp * l.ep) / o->flops;
    const double mem = (r->bytes[PLAN_WEIGHTS] + kv_read) / o->hbm_bps;
    r->compute_s = fmax(fl, mem);
    r->comm_s = r->comm[PLAN_TP] / group_bps(o, l.tp) + r->comm[PLAN_EP] / group_bps(o, l.tp * l.ep);
    r->est_step_s = r->compute_s + r->comm_s;
    r->tokens_per_s = rows / r->est_step_s;
    model_free(&m);
    r->feasible = true;
}

void plan_layout(const ModelConfig *cfg, const PlanOpts *o, PlanLayout l, PlanResult *r)
{
    memset(r, 0, sizeof *r);
    r->l = l;
    if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1 || l.cp < 1)
        return fail(r, "dp, tp, pp, ep and cp must be >= 1");
    if ((long long)l.dp * l.tp * l.pp * l.cp != o->world)
        return fail(r, "dp*tp*pp*cp = %lld, not the world %d (ep ranks are carved from dp)",
                    (long long)l.dp * l.tp * l.pp * l.cp, o->world);
    if (l.cp != 1 && o->mode == PLAN_SERVE)
        return fail(r, "cp=%d: tandem serve has no context parallelism (cp must be 1)", l.cp);
    if (o->mode == PLAN_TRAIN) plan_train(cfg, o, l, r);
    else plan_serve(cfg, o, l, r);
    if (r->feasible && r->bytes[PLAN_TOTAL] > o->device_bytes)
        fail(r, "needs %.2f GiB per rank (stage %d), the device has %.2f GiB", r->bytes[PLAN_TOTAL] / 1073741824.0,
             r->stage, o->device_bytes / 1073741824.0);
}

static int cmp_result(const void *va, const void *vb)
{
    const PlanResult *a = va, *b = vb;
    if (a->feasible != b->feasible) return a->feasible ? -1 : 1;
    /* infeasible: the ones sized (too large) before the ones refused */
    bool ra = a->bytes[PLAN_TOTAL] == 0, rb = b->bytes[PLAN_TOTAL] == 0;
    if (ra != rb) return ra ? 1 : -1;
    double x = a->feasible ? a->est_step_s : a->bytes[PLAN_TOTAL];
    double y = b->feasible ? b->est_step_s : b->bytes[PLAN_TOTAL];
    if (x != y) return x < y ? -1 : 1;
    if (a->bytes[PLAN_TOTAL] != b->bytes[PLAN_TOTAL]) return a->bytes[PLAN_TOTAL] < b->bytes[PLAN_TOTAL] ? -1 : 1;
    /* a total order for equal plans: fewer pipeline stages, then less tp */
    if (a->l.pp != b->l.pp) return a->l.pp - b->l.pp;
    if (a->l.tp != b->l.tp) return a->l.tp - b->l.tp;
    return a->l.ep - b->l.ep;
}

int plan_all(const ModelConfig *cfg, const PlanOpts *o, PlanResult **out)
{
    size_t cap = 64, n = 0;
    PlanResult *v = td_malloc(cap * sizeof *v);
    const int cp = o->mode == PLAN_TRAIN && o->cp > 1 ? o->cp : 1;
    const int W = o->world % cp ? 0 : o->world / cp;   /* dp * tp * pp */
    for (int tp = 1; tp <= W; tp++) {
        if (W % tp) continue;
        for (int pp = 1; pp <= W / tp; pp++) {
            if ((W / tp) % pp || (o->mode == PLAN_SERVE && pp > 1)) continue;
            const int dp = W / tp / pp;
            for (int ep = 1; ep <= dp; ep++) {
                if (dp % ep) continue;
                if (n == cap) {
                    cap *= 2;
                    PlanResult *nv = td_malloc(cap * sizeof *nv);
                    memcpy(nv, v, n * sizeof *v);
                    td_free(v);
                    v = nv;
                }
                plan_layout(cfg, o, (PlanLayout){ dp, tp, pp, ep, cp }, &v[n++]);
            }
        }
    }
    qsort(v, n, sizeof *v, cmp_result);
    *out = v;
    return (int)n;
}

/* train/trainer.c - the training loop (trainer.h). */
#include "train/trainer.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_model.h"
#include "comm/comm.h"
#include "core/model/backprop.h"
#include "core/common.h"
#include "core/fma_peak.h"
#include "core/ops/gemm.h"
#include "core/pool.h"
#include "core/model/vision.h"
#include "train/data.h"
#include "train/image_data.h"
#include "train/optim.h"

#include <cJSON.h>
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

typedef struct Bucket Bucket_t;

/* Loss spikes (docs/observability.md): a step's loss is a spike when it
 * exceeds the mean of the last SPIKE_WINDOW losses by more than SPIKE_SD
 * of their standard deviations and by more than SPIKE_REL of the mean,
 * once SPIKE_MIN_HIST of them are known. */
#define SPIKE_WINDOW 50
#define SPIKE_MIN_HIST 10
#define SPIKE_SD 4.0
#define SPIKE_REL 0.1
/* mem_rank_mb: the kinds per rank, in write_metrics' order */
enum { MEM_RSS, MEM_RSS_PEAK, MEM_ALLOC, MEM_ALLOC_PEAK, MEM_ACT, MEM_KINDS };
static const char *const g_mem_kind[MEM_KINDS] = { "rss", "rss_peak", "alloc", "alloc_peak", "act" };

/* One micro-batch in flight: its activations and its batch (this rank's
 * rows: under cp two chunks of each sequence, core/model/layer.h CpView). */
typedef struct {
    TrainActs acts;
    int32_t *ids, *targets;
    float *dlogp;
    float *w;              /* images: 1 for a scored target, 0 otherwise (rows x T) */
    double n_scored;       /* images: scored targets of the micro-batch over all dp ranks */
} Slot;

/* What a step's micro-batches add up (this rank's part). */
typedef struct {
    double ce;             /* -sum logp over local rows (last stage) */
    double aux_sum, z_sum; /* sums over local MoE layers, already / grad_accum */
    double seq_sum;        /* sequence-wise balance: sum over local sequences and MoE layers / grad_accum */
} StepAcc;

typedef struct {
    const RunConfig *rc;
    Topology topo;
    Model m;
    Slot *slots;           /* activations of in-flight micro-batches (1, or up to pp for 1F1B) */
    int n_slots;
    float *exp_avg, *exp_avg_sq;
    AdamHyper adam;
    TokenFile tf;
    Loader loader;
    bool img;              /* run key images: image rows in the batches */
    ImageLoader il;
    VisionActs va;
    float *pixels;         /* this rank's images of the micro-batch (rows, 3, S, S) */
    int64_t step, tokens_seen;
    int n_moe_global;      /* MoE layers of the whole model (aux/z means) */
    double peak_sgemm, peak_kernel, peak_fma, flops_per_token;   /* GFLOP/s per rank, measured at start-up */
    FILE *metrics;
    bool tty, rank0;
    int n_local;
    double *share_min, *share_max;
    double *load;          /* (L, E) tokens routed to each expert this step, over dp and micro-batches */
    Bucket_t *buckets;
    int n_buckets;
    bool zero;             /* ZeRO-1: moments and the update sharded over dp */
    size_t n_mom;          /* moment floats held (the shards) */
    float *zbuf;           /* ZeRO reduce-scatter output, max shard */
    bool reduce_now;       /* last micro-batch of the step: reduce as layers finish */
    double ep_rows;        /* expert rows this rank computed this step */
    double ep_min, ep_max; /* ... its min and max over the ep group */
    double bubble;         /* pipeline: mean fraction of the step stages spend waiting */
    double seq_bal;        /* this step's sequence-wise balance loss (mean over sequences, layers, micro-batches) */
    int64_t nan_step;      /* debug_nan_grad: the step whose gradient gets a NaN (0: none) */
    Param *nan_param;      /* ... in this tensor, when this rank holds it */
    int64_t n_skipped;     /* steps skipped for a non-finite loss or gradient (on_nonfinite=skip) */
    int64_t lr_spike_step; /* debug_lr_spike: the step whose lr is multiplied (0: none) */
    double lr_spike_mul;   /* ... by this */
    /* observability (docs/observability.md): this step's figures */
    double t_fwd, t_bwd;   /* this rank's seconds in forward and backward compute */
    bool health;           /* act_rms this step (health_every) */
    double *act_ss;        /* (2L) per layer: sum of squares of its output rows, then their count */
    double logit_max;      /* largest |logit| this rank's head computed */
    double *obs_max;       /* (COMM_N_GROUPS + 2 pp + 4 + 1) maxima over the world, write_metrics' layout */
    double *mem_rank;      /* (MEM_KINDS world) per-rank memory, MiB */
    CommStat cs[COMM_N_GROUPS];   /* this step's communication, before the metrics' own reductions */
    double loss_hist[SPIKE_WINDOW];   /* the last finite losses (ring) */
    int n_hist;
    bool spike;
    /* summary */
    double t_start, last_loss, last_val, tok_s_sum, mfu_sum;
    double gemm_eff, sgemm_eff, gemm_eff_sum, sgemm_eff_sum;   /* this step's, and the sums for the summary */
    int n_timed;
    char last_ckpt[1200];
    char from_src[1024];   /* the checkpoint resumed or started from, "" for none */
    CkptText tx;           /* the run's tokenizer; its files go into every checkpoint */
    int32_t *cp_ids, *cp_targets;   /* cp > 1: the loader's whole sequences, before this rank's chunks */
} Trainer;

/* ---------------------------------------------------------------- peak */

struct peak_ctx { const float *a, *b; float *c; size_t n; };

static void sgemm_rows(void *vc, size_t r0, size_t r1, int tid)
{
    (void)tid;
    const struct peak_ctx *c = vc;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)c->n, (int)c->n, 1.0f,
                c->a + r0 * c->n, (int)c->n, c->b, (int)c->n, 0.0f, c->c + r0 * c->n, (int)c->n);
}

void train_measure_peak(double *sgemm_gflops, double *kernel_gflops)
{
    const size_t n = TRAIN_PEAK_N;
    float *a = td_malloc(n * n * sizeof(float)), *b = td_malloc(n * n * sizeof(float));
    float *c = td_malloc(n * n * sizeof(float)), *p = td_malloc(gemm_packed_bytes(DTYPE_F32, n, n));
    for (size_t i = 0; i < n * n; i++) {
        a[i] = (float)((i * 7919) % 1000) * 1e-3f;
        b[i] = (float)((i * 104729) % 1000) * 1e-3f;
    }
    struct peak_ctx pc = { a, b, c, n };
    gemm_pack(p, DTYPE_F32, b, n, n);
    const GemmW W = gemm_w(DTYPE_F32, p, n, n);
    double best_s = 0, best_k = 0, start = td_now();
    /* the first rep warms up; then the best of at least 4 reps or 0.3 s: on
     * a shared host a few reps can all land in a slow moment, and an MFU
     * against a low peak flatters */
    for (int rep = 0; rep < 5 || (rep < 40 && td_now() - start < 0.3); rep++) {
        double t0 = td_now();
        pool_for(n, 64, sgemm_rows, &pc);
        double t1 = td_now();
        gemm_xwt(c, n, a, n, &W, n);
        double t2 = td_now();
        if (rep) {
            best_s = fmax(best_s, gemm_flops(n, n, n) / (t1 - t0) * 1e-9);
            best_k = fmax(best_k, gemm_flops(n, n, n) / (t2 - t1) * 1e-9);
        }
    }
    td_free(a); td_free(b); td_free(c); td_free(p);
    *sgemm_gflops = best_s;
    *kernel_gflops = best_k;
}

/* ---------------------------------------------------------------- set-up */

static void dp_stats_hook(void *ctx, double *buf, size_t n) { (void)ctx; comm_allreduce_f64(COMM_DP, buf, n); }
static void tp_sum_hook(void *ctx, float *buf, size_t n) { (void)ctx; comm_allreduce_f32(COMM_TP, buf, n); }

/* Sequence parallelism: tp equal blocks (core/model/model.h). */
static void tp_blocks(size_t n, size_t *counts)
{
    const int P = comm_group_size(COMM_TP);
    for (int r = 0; r < P; r++) counts[r] = n / (size_t)P;
}

static void tp_rs_hook(void *ctx, float *out, const float *in, size_t n)
{
    (void)ctx;
    size_t counts[comm_group_size(COMM_TP)];
    tp_blocks(n, counts);
    comm_reduce_scatter_v_f32(COMM_TP, out, in, counts);
}

static void tp_ag_hook(void *ctx, float *buf, size_t n)
{
    (void)ctx;
    size_t counts[comm_group_size(COMM_TP)];
    tp_blocks(n, counts);
    comm_allgather_v_f32(COMM_TP, buf, counts);
}

static void cp_allgather_hook(void *ctx, float *buf, size_t n)
{
    (void)ctx;
    size_t counts[comm_group_size(COMM_CP)];
    for (int r = 0; r < comm_group_size(COMM_CP); r++) counts[r] = n;
    comm_allgather_v_f32(COMM_CP, buf, counts);
}
static void cp_reduce_scatter_hook(void *ctx, float *out, const float *in, size_t n)
{
    (void)ctx;
    size_t counts[comm_group_size(COMM_CP)];
    for (int r = 0; r < comm_group_size(COMM_CP); r++) counts[r] = n;
    comm_reduce_scatter_v_f32(COMM_CP, out, in, counts);
}
static void ep_a2a_hook(void *ctx, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd)
{
    (void)ctx;
    comm_alltoallv(COMM_EP, send, sc, sd, recv, rc, rd);
}

/* Gradient buckets: runs of the slab with one reduction group, per layer
 * (-1 embedding, L final norm / lm_head).  Non-expert gradients are summed
 * over dp, expert gradients over the ranks holding the same experts (edp). */
struct Bucket {
    size_t off, len; CommGroup g; int layer;
    size_t lo, hi, mom;   /* ZeRO: this rank's shard [lo, hi) of the bucket, its moments at mom */
};
typedef struct Bucket Bucket;

/* The buckets of model m and this rank's ZeRO shards of them, for groups
 * of p_dp ranks (this one q_dp) and p_edp (q_edp): one layout for the
 * trainer (comm/'s group sizes) and for train_mem (the topology's). */
static Bucket *bucket_layout(const Model *m, int p_dp, int q_dp, int p_edp, int q_edp, int *n_out,
                             size_t *n_mom)
{
    Bucket *bk = td_malloc((size_t)(m->n_params + 1) * sizeof(Bucket));
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        if (p->tied_copy) continue;   /* reduced and sent to its owner by tied_grads */
        CommGroup g = p->ep_dim >= 0 ? COMM_EDP : COMM_DP;
        int layer = p->layer >= 0 ? p->layer : (p == m->norm || (p == m->lm_head && p != m->embed))
                                                   ? m->cfg.num_hidden_layers : -1;
        size_t end = i + 1 < m->n_params ? m->params[i + 1].offset : m->n_w;
        Bucket *last = n ? &bk[n - 1] : NULL;
        if (last && last->g == g && last->layer == layer && last->off + last->len == p->offset) {
            last->len = end - last->off;
        } else {
            bk[n++] = (Bucket){ p->offset, end - p->offset, g, layer, 0, 0, 0 };
        }
    }
    /* ZeRO-1 shards: rank q of the bucket's group owns [len q/P, len (q+1)/P) */
    size_t mom = 0;
    for (int i = 0; i < n; i++) {
        Bucket *b = &bk[i];
        size_t P = (size_t)(b->g == COMM_EDP ? p_edp : p_dp), q = (size_t)(b->g == COMM_EDP ? q_edp : q_dp);
        b->lo = b->off + b->len * q / P;
        b->hi = b->off + b->len * (q + 1) / P;
        b->mom = mom;
        mom += b->hi - b->lo;
    }
    *n_out = n;
    *n_mom = mom;
    return bk;
}

static void build_buckets(Trainer *tr)
{
    tr->buckets = bucket_layout(&tr->m, comm_group_size(COMM_DP), comm_group_rank(COMM_DP),
                                comm_group_size(COMM_EDP), comm_group_rank(COMM_EDP), &tr->n_buckets, &tr->n_mom);
}

static void bucket_counts(const Bucket *b, size_t *counts)
{
    size_t P = (size_t)comm_group_size(b->g);
    for (size_t r = 0; r < P; r++) counts[r] = b->len * (r + 1) / P - b->len * r / P;
}

/* ZeRO: full moment slabs (laid out like the weights) <-> this rank's shards. */
static void zero_gather_moments(Trainer *tr, float *full1, float *full2)
{
    memset(full1, 0, tr->m.n_w * sizeof(float));
    memset(full2, 0, tr->m.n_w * sizeof(float));
    for (int i = 0; i < tr->n_buckets; i++) {
        const Bucket *b = &tr->buckets[i];
        size_t counts[comm_group_size(b->g)];
        bucket_counts(b, counts);
        memcpy(full1 + b->lo, tr->exp_avg + b->mom, (b->hi - b->lo) * sizeof(float));
        memcpy(full2 + b->lo, tr->exp_avg_sq + b->mom, (b->hi - b->lo) * sizeof(float));
        comm_allgather_v_f32(b->g, full1 + b->off, counts);
        comm_allgather_v_f32(b->g, full2 + b->off, counts);
    }
}

static void zero_keep_shards(Trainer *tr)
{
    float *s1 = td_calloc(td_max(tr->n_mom, 1) * sizeof(float));
    float *s2 = td_calloc(td_max(tr->n_mom, 1) * sizeof(float));
    for (int i = 0; i < tr->n_buckets; i++) {
        const Bucket *b = &tr->buckets[i];
        memcpy(s1 + b->mom, tr->exp_avg + b->lo, (b->hi - b->lo) * sizeof(float));
        memcpy(s2 + b->mom, tr->exp_avg_sq + b->lo, (b->hi - b->lo) * sizeof(float));
    }
    td_free(tr->exp_avg);
    td_free(tr->exp_avg_sq);
    tr->exp_avg = s1;
    tr->exp_avg_sq = s2;
}

/* Called by backward as each layer's gradients are final: on the last
 * micro-batch of a step, start reducing them while backward goes on. */
static void grad_ready_hook(void *ctx, int layer)
{
    Trainer *tr = ctx;
    if (!tr->reduce_now || tr->zero) return;   /* ZeRO reduce-scatters after backward */
    for (int i = 0; i < tr->n_buckets; i++) {
        const Bucket *b = &tr->buckets[i];
        if (b->layer == layer) comm_iallreduce_f32(b->g, tr->m.g + b->off, b->len);
    }
    comm_poll();
}

/* Model config and weights: resume > init_from > fresh (SPEC section 8). */
static int setup_model(Trainer *tr, CkptState *st, bool *resumed)
{
    const RunConfig *rc = tr->rc;
    char err[512], src[1024] = "";
    ModelConfig cfg = rc->model;
    *resumed = false;
    /* resume wins over init_from; resume=DIR without a checkpoint yet is a
     * first launch, so one run config serves the first launch and restarts */
    const char *from = NULL;
    if (rc->resume[0]) {
        struct stat sb;
        char latest[1100];
        snprintf(latest, sizeof latest, "%s/latest", rc->resume);
        bool is_dir = stat(rc->resume, &sb) == 0 && S_ISDIR(sb.st_mode);
        bool first_launch = (is_dir && lstat(latest, &sb) != 0 && !ckpt_is_hf_dir(rc->resume)) ||
                            (!is_dir && access(rc->resume, F_OK) != 0 && !strstr(rc->resume, ".h5"));
        if (!first_launch) {
            if (ckpt_resolve(rc->resume, src, sizeof src)) return -1;
            from = rc->resume;
            *resumed = true;
        }
    }
    if (!from && rc->init_from[0]) {
        if (ckpt_resolve(rc->init_from, src, sizeof src)) return -1;
        from = rc->init_from;
    }
    if (from && ckpt_read_config(src, &cfg, NULL, err, sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    if (from) snprintf(tr->from_src, sizeof tr->from_src, "%s", src);
    int stages[TOPO_MAX_PP], n_st = 0;
    if (rc->pp_layers[0]) {
        /* every entry is counted, also past TOPO_MAX_PP, so that a longer
         * list is refused rather than cut to pp */
        for (const char *s = rc->pp_layers;;) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s || v < 0 || v > INT_MAX || (*end && *end != ',')) {
                td_error("run config: pp_layers \"%s\" must be comma-separated layer counts", rc->pp_layers);
                return -1;
            }
            if (n_st < TOPO_MAX_PP) stages[n_st] = (int)v;
            n_st++;
            if (!*end) break;
            s = end + 1;
        }
        if (n_st != rc->pp) {
            td_error("run config: pp_layers \"%s\" names %d stages, pp=%d", rc->pp_layers, n_st, rc->pp);
            return -1;
        }
    }
    if (topo_init(&tr->topo, &cfg, rc->dp, rc->tp, rc->pp, rc->ep, rc->cp, comm_rank(), n_st ? stages : NULL,
                  err, sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    tr->topo.sp = rc->sp;   /* runcfg_load checked tp > 1 and the rows */
    if (comm_setup(&tr->topo)) return -1;
    model_init(&tr->m, &cfg, &tr->topo, true, 16);
    tr->m.comm = (ModelComm){ tr, tp_sum_hook, dp_stats_hook, ep_a2a_hook, grad_ready_hook, tp_rs_hook, tp_ag_hook,
                              cp_allgather_hook, cp_reduce_scatter_hook };
    build_buckets(tr);
    size_t zmax = 1;
    for (int i = 0; i < tr->n_buckets; i++) zmax = td_max(zmax, tr->buckets[i].hi - tr->buckets[i].lo);
    tr->zbuf = td_malloc(zmax * sizeof(float));
    tr->exp_avg = td_calloc(tr->m.n_w * sizeof(float));
    tr->exp_avg_sq = td_calloc(tr->m.n_w * sizeof(float));
    memset(st, 0, sizeof *st);
    tr->zero = rc->zero && comm_size() > 1;
    if (!from) {
        model_init_weights(&tr->m, (uint64_t)rc->seed);
        if (tr->zero) zero_keep_shards(tr);
        return 0;
    }
    if (ckpt_load(src, &tr->m, *resumed ? tr->exp_avg : NULL, *resumed ? tr->exp_avg_sq : NULL,
                  *resumed ? st : NULL, err, sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    model_pack(&tr->m);
    if (tr->zero) zero_keep_shards(tr);
    if (tr->rank0)
        td_info("%s %s (step %lld)", *resumed ? "resuming from" : "initialised from", src,
                *resumed ? (long long)st->step : 0LL);
    return 0;
}

int train_n_slots(const Topology *t, int grad_accum)
{
    /* 1F1B keeps up to pp - stage micro-batches in flight on a stage */
    return t->pp == 1 ? 1 : (int)td_min((size_t)(t->pp - t->pp_rank), (size_t)grad_accum);
}

void train_mem(const Model *m, size_t B, size_t T, int grad_accum, Recompute mode, bool zero, TrainMem *o)
{
    memset(o, 0, sizeof *o);
    const Topology *t = &m->topo;
    const size_t nw = m->n_w * sizeof(float);
    int n_b;
    size_t n_mom;
    zero = zero && t->world > 1;
    /* comm/'s dp and edp groups span the cp ranks (comm.h) */
    Bucket *bk = bucket_layout(m, t->dp * t->cp, t->dp_rank * t->cp + t->cp_rank, t->dp / t->ep * t->cp,
                               t->dp_rank / t->ep * t->cp + t->cp_rank, &n_b, &n_mom);
    size_t zmax = 1;
    for (int i = 0; i < n_b; i++) zmax = td_max(zmax, bk[i].hi - bk[i].lo);
    td_free(bk);
    o->weights = nw + m->n_packed;
    o->gradients = nw;
    o->optimizer = 2 * (zero ? td_max(n_mom, 1) * sizeof(float) : nw);
    o->comm = zmax * sizeof(float) + (size_t)(m->n_params + 1) * sizeof(Bucket);
    const int slots = train_n_slots(t, grad_accum);
    o->activations = (size_t)slots * model_train_acts_bytes(m, B, T, mode);
    /* tables and per-micro-batch token buffers, always held */
    const size_t L = (size_t)m->cfg.num_hidden_layers;
    const size_t Nr = B * T / (size_t)t->cp;   /* this rank's rows */
    const size_t tables = model_table_bytes(m) +
                          (size_t)slots * (sizeof(Slot) + Nr * (2 * sizeof(int32_t) + sizeof(float))) +
                          (t->cp > 1 ? 2 * B * T * sizeof(int32_t) : 0) + 2 * (L + 1) * sizeof(double);
    const size_t held = o->weights + o->gradients + o->optimizer + o->comm + o->activations + tables;
    /* the peaks on top: the start-up GEMM measurement (train_measure_peak),
     * the tied embedding's gradient received by the first stage, and with
     * ZeRO the set-up moment where the full moments and the shards coexist */
    const size_t n = TRAIN_PEAK_N;
    size_t extra = td_max(3 * n * n * sizeof(float) + gemm_packed_bytes(DTYPE_F32, n, n),
                          t->pp > 1 && m->cfg.tie_word_embeddings && topo_is_first_stage(t) ? m->V * m->d * sizeof(float) : 0);
    size_t total = held + extra;
    if (zero) {
        size_t setup = o->weights + o->gradients + 2 * nw + 2 * td_max(n_mom, 1) * sizeof(float) + o->comm +
                       model_table_bytes(m);
        total = td_max(total, setup);
    }
    o->workspace = total - (held - tables);
    o->total = total;
}

/* ---------------------------------------------------------------- reporting */

static void fmt_count(char *out, size_t n, double x)
{
    if (x >= 1e9) snprintf(out, n, "%.2fG", x / 1e9);
    else if (x >= 1e6) snprintf(out, n, "%.2fM", x / 1e6);
    else if (x >= 1e3) snprintf(out, n, "%.1fk", x / 1e3);
    else snprintf(out, n, "%.0f", x);
}

static void progress(Trainer *tr, double loss, double lr, double tok_s, double mfu, double eta_s,
                     double comm_s, double step_s)
{
    if (!tr->rank0) return;
    const RunConfig *rc = tr->rc;
    int64_t s = tr->step;
    if (!tr->tty && s % rc->log_every && s != rc->steps) return;
    char tk[16];
    fmt_count(tk, sizeof tk, tok_s);
    int width = 20, fill = rc->steps ? (int)(width * s / rc->steps) : width;
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    char ep[48] = "";
    if (tr->topo.ep > 1) snprintf(ep, sizeof ep, " | ep rows %.0f-%.0f", tr->ep_min, tr->ep_max);
    fprintf(stderr, "%sstep %lld/%d [%s] loss %.4f lr %.2e | %s tok/s | mfu %.0f%% | comm %.0f%%%s | eta %dm%02ds%s",
            tr->tty ? "\r" : "", (long long)s, rc->steps, bar, loss, lr, tk, 100 * mfu,
            step_s > 0 ? 100 * comm_s / step_s : 0.0, ep, (int)(eta_s / 60), (int)fmod(eta_s, 60),
            tr->tty ? "\033[K" : "\n");
    fflush(stderr);
}

/* ---------------------------------------------------------------- eval */

/* The next micro-batch of loader l into the slot: the loader's B whole
 * sequences, or under cp this rank's two chunks of each (layer.h, CpView). */
static void next_batch(Trainer *tr, Loader *l, Slot *sl)
{
    const int cp = tr->topo.cp;
    if (cp == 1) {
        loader_next(l, sl->ids, sl->targets);
        return;
    }
    loader_next(l, tr->cp_ids, tr->cp_targets);
    const size_t T = (size_t)tr->rc->seq_len, C = T / (2 * (size_t)cp), B = sl->acts.B;
    for (size_t b = 0; b < B; b++)
        for (size_t j = 0; j < 2; j++) {
            const size_t chunk = j ? 2 * (size_t)cp - 1 - (size_t)tr->topo.cp_rank : (size_t)tr->topo.cp_rank;
            const size_t src = b * T + chunk * C, dst = (2 * b + j) * C;
            memcpy(sl->ids + dst, tr->cp_ids + src, C * sizeof(int32_t));
            memcpy(sl->targets + dst, tr->cp_targets + src, C * sizeof(int32_t));
        }
}

/* Pipeline neighbours in the pp group (-1: none). */
static int pp_prev(const Trainer *tr) { return tr->topo.pp_rank > 0 ? tr->topo.pp_rank - 1 : -1; }
static int pp_next(const Trainer *tr) { return tr->topo.pp_rank < tr->topo.pp - 1 ? tr->topo.pp_rank + 1 : -1; }
/* Bytes of a stage's input or output (sequence parallelism: this rank's rows). */
static size_t act_bytes(const Trainer *tr)
{
    return model_sp_rows(&tr->m, tr->slots[0].acts.N) * tr->m.d * sizeof(float);
}

static double evaluate(Trainer *tr)
{
    const RunConfig *rc = tr->rc;
    TokenStream vs = tokfile_val(&tr->tf);
    if (vs.len < 2) return NAN;
    Loader vl;
    loader_init(&vl, vs, (size_t)rc->micro_batch, (size_t)rc->seq_len, (size_t)tr->topo.dp,
                (size_t)tr->topo.dp_rank, false, 0);
    Slot *sl = &tr->slots[0];
    const int nl = tr->n_local;
    double ce = 0;
    for (int i = 0; i < rc->eval_batches; i++) {
        next_batch(tr, &vl, sl);
        sl->acts.n_img = 0;   /* validation is the text's */
        comm_sendrecv(COMM_PP, NULL, 0, -1, sl->acts.x[0], act_bytes(tr), pp_prev(tr), 1);
        LossParts lp = { 0 };
        model_train_forward(&tr->m, &sl->acts, sl->ids, sl->targets,
                            (size_t)rc->micro_batch * (size_t)rc->seq_len, &lp);
        comm_sendrecv(COMM_PP, sl->acts.x[nl], act_bytes(tr), pp_next(tr), NULL, 0, -1, 1);
        ce += lp.ce_sum;
    }
    comm_allreduce_f64(COMM_DP, &ce, 1);
    comm_allreduce_f64(COMM_PP, &ce, 1);
    return ce / ((double)rc->eval_batches * rc->micro_batch * rc->seq_len);
}

/* ---------------------------------------------------------------- checkpoints */

static int save(Trainer *tr)
{
    const RunConfig *rc = tr->rc;
    char name[64], path[1200];
    snprintf(name, sizeof name, "step_%08lld.h5", (long long)tr->step);
    snprintf(path, sizeof path, "%s/%s", rc->out_dir, name);
    CkptState st;
    memset(&st, 0, sizeof st);
    st.step = tr->step;
    st.tokens_seen = tr->tokens_seen;
    st.micro_batches = tr->loader.cursor;
    memcpy(st.data_rng, tr->loader.rng.s, sizeof st.data_rng);
    st.lr = lr_schedule(rc->lr, rc->min_lr, rc->warmup_steps, rc->steps,
                        !strcmp(rc->lr_schedule, "cosine"), tr->step > 0 ? tr->step - 1 : 0);
    st.beta1 = tr->adam.beta1;
    st.beta2 = tr->adam.beta2;
    st.adam_eps = tr->adam.eps;
    st.weight_decay = tr->adam.weight_decay;
    st.adam_step = tr->step;
    st.run_config = rc->json;
    st.tok = tr->tx.files;   /* borrowed: the run's tokenizer goes with every checkpoint */
    double t0 = td_now();
    float *m1 = tr->exp_avg, *m2 = tr->exp_avg_sq;
    if (tr->zero) {   /* the checkpoint stores the global moments */
        m1 = td_malloc(tr->m.n_w * sizeof(float));
        m2 = td_malloc(tr->m.n_w * sizeof(float));
        zero_gather_moments(tr, m1, m2);
    }
    int sr = ckpt_save(path, &tr->m, m1, m2, &st, CKPT_F32);
    if (tr->zero) {
        td_free(m1);
        td_free(m2);
    }
    if (sr) return -1;
    int rc2 = 0;
    if (tr->rank0) {
        rc2 = ckpt_set_latest(rc->out_dir, name);
        if (rc2 == 0 && rc->keep_last > 0) ckpt_prune(rc->out_dir, rc->keep_last);
    }
    comm_barrier(COMM_WORLD);
    snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s", path);
    if (tr->rank0 && !tr->tty)
        td_info("saved %s (%.2f s)", path, td_now() - t0);
    return rc2;
}

/* ---------------------------------------------------------------- numeric health */

/* The first non-finite value among the weights (grads: the gradients) this
 * rank holds, as "NAME[i] = v" (i: the element of the local slice) in out.
 * Returns 1 when one was found. */
static int first_nonfinite(const Model *m, bool grads, char *out, size_t n)
{
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        const float *v = grads ? p->g : p->w;
        if (!v) continue;
        for (size_t j = 0; j < p->numel; j++)
            if (!isfinite(v[j])) {
                snprintf(out, n, "%s%s[%zu] = %g", grads ? "the gradient of " : "weight ", p->name, j, (double)v[j]);
                return 1;
            }
    }
    return 0;
}

/* A step whose loss or gradient norm is not finite (every rank gets here
 * together: both are global).  Names the first non-finite weight, else
 * gradient, else the loss, from the lowest rank that holds one.  With
 * on_nonfinite=skip and every weight finite, the step is skipped: no update
 * (weights and AdamW moments stay as they were), the step and its tokens
 * counted, a "skipped" row in metrics.jsonl; returns 1.  Otherwise -1: the
 * run stops before any update or save, so the last checkpoint stays the
 * last good one. */
static int nonfinite_step(Trainer *tr, double loss, double gnorm)
{
    char what[PARAM_NAME_MAX + 96];
    int bad_w = first_nonfinite(&tr->m, false, what, sizeof what);
    int found = bad_w || first_nonfinite(&tr->m, true, what, sizeof what);
    if (!found) snprintf(what, sizeof what, "the loss (%g; gradient norm %g)", loss, gnorm);
    double any_w = bad_w;
    comm_allreduce_max_f64(COMM_WORLD, &any_w, 1);
    int32_t who[2] = { bad_w ? 0 : found ? 1 : 2, 0 };   /* the best kind found, then the lowest rank with it */
    comm_allreduce_min_i32(COMM_WORLD, who, 1);
    who[1] = (bad_w ? 0 : found ? 1 : 2) == who[0] ? comm_rank() : INT32_MAX;
    comm_allreduce_min_i32(COMM_WORLD, who + 1, 1);
    const bool speak = comm_rank() == who[1];
    const long long step = (long long)tr->step + 1;
    if (!strcmp(tr->rc->on_nonfinite, "skip") && any_w == 0) {
        if (speak) td_info("step %lld: skipped (on_nonfinite=skip): %s is not finite", step, what);
        if (tr->rank0 && tr->metrics) {
            fprintf(tr->metrics, "{\"step\":%lld,\"skipped\":\"non-finite %s\",\"tokens_seen\":%lld}\n", step,
                    found ? "gradient" : "loss",
                    (long long)(tr->tokens_seen + (int64_t)((size_t)tr->rc->micro_batch * (size_t)tr->rc->seq_len *
                                                            (size_t)tr->rc->grad_accum)));
            fflush(tr->metrics);
        }
        tr->step++;
        tr->tokens_seen += (int64_t)((size_t)tr->rc->micro_batch * (size_t)tr->rc->seq_len * (size_t)tr->rc->grad_accum);
        tr->n_skipped++;
        return 1;
    }
    if (speak)
        td_error("step %lld: %s is not finite (loss %g, gradient norm %g); stopped before the update, nothing "
                 "saved: %s/latest is as it was%s%s%s%s", step, what, loss, gnorm, tr->rc->out_dir,
                 tr->last_ckpt[0] ? " (" : "", tr->last_ckpt, tr->last_ckpt[0] ? ")" : "",
                 any_w == 0 ? "; on_nonfinite=skip would skip such steps"
                 : !strcmp(tr->rc->on_nonfinite, "skip") ? "; on_nonfinite=skip does not skip a non-finite weight" : "");
    return -1;
}

/* debug_nan_grad=STEP:TENSOR (tests): the step and tensor, or -1 with err. */
static int debug_nan_init(Trainer *tr, char *err, size_t n)
{
    const char *s = tr->rc->debug_nan_grad, *colon = strchr(s, ':');
    if (!*s) return 0;
    char *end;
    long long st = strtoll(s, &end, 10);
    if (!colon || end != colon || st < 1) return snprintf(err, n, "debug_nan_grad: want STEP:TENSOR, got \"%s\"", s), -1;
    tr->nan_step = st;
    for (int i = 0; i < tr->m.n_params; i++)
        if (!strcmp(tr->m.params[i].name, colon + 1)) tr->nan_param = &tr->m.params[i];
    double held = tr->nan_param != NULL;
    comm_allreduce_max_f64(COMM_WORLD, &held, 1);
    if (!held) return snprintf(err, n, "debug_nan_grad: the model has no tensor \"%s\"", colon + 1), -1;
    return 0;
}

/* ---------------------------------------------------------------- the loop */

/* Whether STEP is one of save_at's comma-separated steps. */
static bool save_at_step(const char *list, int64_t step)
{
    for (const char *a = list; *a;) {
        char *end;
        if (strtoll(a, &end, 10) == step) return true;
        a = *end ? end + 1 : end;
    }
    return false;
}

static void write_metrics(Trainer *tr, const LossParts *lp_sum, double ce, double loss, double lr,
                          double gnorm, double tok_s, double mfu, double step_s, double comm_s,
                          double val)
{
    if (!tr->rank0 || !tr->metrics) return;
    FILE *f = tr->metrics;
    fprintf(f, "{\"step\":%lld,\"loss\":%.9g,\"ce\":%.9g,\"aux\":%.6f,\"z\":%.6f,\"lr\":%.6e,"
               "\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"gemm_eff\":%.4f,\"sgemm_eff\":%.4f,"
               "\"step_s\":%.4f,\"comm_s\":%.4f,"
               "\"tokens_seen\":%lld,\"peak_mem_mb\":%.1f,\"act_mem_mb\":%.4f",
            (long long)tr->step, loss, ce, lp_sum->aux, lp_sum->z, lr, gnorm, tok_s, mfu, tr->gemm_eff, tr->sgemm_eff,
            step_s, comm_s,
            (long long)tr->tokens_seen, td_mem_peak() / 1048576.0, tr->slots[0].acts.arena.size / 1048576.0);
    for (int g = COMM_DP; g < COMM_N_GROUPS; g++) {
        if (comm_group_size((CommGroup)g) <= 1) continue;
        const CommStat *cs = &tr->cs[g];
        const char *gn = comm_group_name((CommGroup)g);
        fprintf(f, ",\"comm_%s_s\":%.4f,\"comm_%s_s_max\":%.4f,\"comm_%s_mb\":%.3f", gn, cs->seconds, gn,
                tr->obs_max[g], gn, cs->bytes / 1048576.0);
    }
    /* per world rank (mem_rank_mb), per pipeline stage (fwd_s, bwd_s),
     * per layer kind: the slowest rank's */
    const int W = comm_size(), P = tr->topo.pp;
    fprintf(f, ",\"mem_rank_mb\":{");
    for (int k = 0; k < MEM_KINDS; k++) {
        fprintf(f, "%s\"%s\":[", k ? "," : "", g_mem_kind[k]);
        for (int r = 0; r < W; r++) fprintf(f, "%s%.3f", r ? "," : "", tr->mem_rank[(size_t)r * MEM_KINDS + k]);
        fprintf(f, "]");
    }
    const double *st = tr->obs_max + COMM_N_GROUPS;
    for (int which = 0; which < 2; which++) {
        fprintf(f, which ? "],\"bwd_s\":[" : "},\"fwd_s\":[");
        for (int p = 0; p < P; p++) fprintf(f, "%s%.5f", p ? "," : "", st[which * P + p]);
    }
    const double *kind = st + 2 * P;
    fprintf(f, "],\"time_attn_s\":%.5f,\"time_router_s\":%.5f,\"time_experts_s\":%.5f,\"time_head_s\":%.5f,"
               "\"logit_max\":%.6g,\"loss_spike\":%s", kind[0], kind[1], kind[2], kind[3], kind[4],
            tr->spike ? "true" : "false");
    if (tr->topo.ep > 1) fprintf(f, ",\"ep_rows_min\":%.0f,\"ep_rows_max\":%.0f", tr->ep_min, tr->ep_max);
    if (tr->rc->router_seq_aux_loss_coef > 0) fprintf(f, ",\"seq_aux\":%.6f", tr->seq_bal);
    if (tr->topo.pp > 1) fprintf(f, ",\"pp_bubble\":%.4f", tr->bubble);
    /* per layer of the whole model; dense layers have no experts: null */
    const int L = tr->m.cfg.num_hidden_layers;
    for (int which = 0; which < 2; which++) {
        const double *v = which ? tr->share_max : tr->share_min;
        fprintf(f, which ? "],\"expert_share_max\":[" : ",\"expert_share_min\":[");
        for (int l = 0; l < L; l++)
            fprintf(f, config_layer_is_moe(&tr->m.cfg, l) ? "%s%.4f" : "%snull", l ? "," : "", v[l]);
    }
    fprintf(f, "],\"expert_load\":[");
    for (int l = 0; l < L; l++) {
        if (!config_layer_is_moe(&tr->m.cfg, l)) {
            fprintf(f, "%snull", l ? "," : "");
            continue;
        }
        for (size_t e = 0; e < tr->m.E_global; e++)
            fprintf(f, "%s%.0f", e ? "," : l ? ",[" : "[", tr->load[(size_t)l * tr->m.E_global + e]);
        fprintf(f, "]");
    }
    fprintf(f, "],\"expert_entropy\":[");
    for (int l = 0; l < L; l++) {
        if (!config_layer_is_moe(&tr->m.cfg, l)) {
            fprintf(f, "%snull", l ? "," : "");
            continue;
        }
        /* of the layer's load distribution p_e = load_e / sum: ln E when balanced */
        const double *ld = tr->load + (size_t)l * tr->m.E_global;
        double tot = 0, h = 0;
        for (size_t e = 0; e < tr->m.E_global; e++) tot += ld[e];
        for (size_t e = 0; e < tr->m.E_global; e++)
            if (ld[e] > 0) h -= ld[e] / tot * log(ld[e] / tot);
        fprintf(f, "%s%.6f", l ? "," : "", h);
    }
    fprintf(f, "]");
    if (tr->health) {
        fprintf(f, ",\"act_rms\":[");
        for (int l = 0; l < L; l++)
            fprintf(f, "%s%.6g", l ? "," : "", sqrt(tr->act_ss[l] / fmax(tr->act_ss[L + l], 1)));
        fprintf(f, "]");
    }
    if (!isnan(val)) fprintf(f, ",\"val_loss\":%.6f", val);
    fprintf(f, "}\n");
    fflush(f);
}

/* The step of a metrics row, or -1 when the line is not one (a line cut
 * short by a crash). */
static int64_t metrics_row_step(const char *line)
{
    cJSON *o = cJSON_Parse(line);
    const cJSON *s = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
    int64_t step = cJSON_IsNumber(s) && s->valuedouble >= 0 ? (int64_t)s->valuedouble : -1;
    cJSON_Delete(o);
    return step;
}

/* On resume from `step`: path keeps the history up to that step, each
 * step once.  Rows after it belong to the abandoned continuation; where an
 * earlier restart left a step twice, the later row (the continuation that
 * went on) wins.  Written to path.tmp, fsync'ed and renamed, so the rows
 * kept survive a crash here.  0, or -1 (printed). */
static int metrics_rewind(const char *path, int64_t step)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;   /* resuming into a new out_dir */
        td_error("cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char **rows = NULL, *line = NULL;
    int64_t *steps = NULL;
    size_t nr = 0, cap = 0, lcap = 0, dropped = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        int64_t s = metrics_row_step(line);
        if (s < 0) {
            dropped++;
            continue;
        }
        while (nr > 0 && steps[nr - 1] >= s) {   /* a restart: what followed step s - 1 before is superseded */
            td_free(rows[--nr]);
            dropped++;
        }
        if (nr == cap) {
            cap = cap ? 2 * cap : 256;
            char **nrw = td_malloc(cap * sizeof *nrw);
            int64_t *nst = td_malloc(cap * sizeof *nst);
            if (nr) {
                memcpy(nrw, rows, nr * sizeof *rows);
                memcpy(nst, steps, nr * sizeof *steps);
            }
            td_free(rows);
            td_free(steps);
            rows = nrw;
            steps = nst;
        }
        rows[nr] = td_strdup(line);
        steps[nr++] = s;
    }
    bool bad = ferror(f);
    fclose(f);
    free(line);
    size_t keep = nr;
    while (keep > 0 && steps[keep - 1] > step) keep--;
    dropped += nr - keep;
    int rc = 0;
    if (bad) {
        td_error("cannot read %s", path);
        rc = -1;
    } else if (dropped) {
        char tmp[PATH_MAX];
        if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
            td_error("%s: path too long", path);
            rc = -1;
        }
        FILE *o = rc ? NULL : fopen(tmp, "w");
        if (!rc && !o) {
            td_error("cannot write %s: %s", tmp, strerror(errno));
            rc = -1;
        }
        for (size_t i = 0; o && i < keep; i++) {
            size_t l = strlen(rows[i]);
            bool nl = l && rows[i][l - 1] == '\n';
            if (fwrite(rows[i], 1, l, o) != l || (!nl && fputc('\n', o) == EOF)) rc = -1;
        }
        if (o && (fflush(o) || fsync(fileno(o)))) rc = -1;
        if (o && fclose(o)) rc = -1;
        if (o && !rc && rename(tmp, path)) rc = -1;
        if (o && rc) {
            td_error("cannot rewrite %s: %s", path, strerror(errno));
            unlink(tmp);
        }
        if (!rc) td_info("metrics: %s keeps %zu rows up to step %lld (dropped %zu after it or repeated)", path, keep,
                         (long long)step, dropped);
    }
    for (size_t i = 0; i < nr; i++) td_free(rows[i]);
    td_free(rows);
    td_free(steps);
    return rc;
}

/* ---------------------------------------------------------------- observability */

struct absmax_ctx { const float *v; size_t cols; double *out; };

/* Rows [r0, r1) of a (rows, cols) matrix: their largest |value| into the
 * thread's slot (a maximum: the same whatever the split). */
static void absmax_rows(void *vc, size_t r0, size_t r1, int tid)
{
    const struct absmax_ctx *c = vc;
    float mx = 0;
    for (size_t i = r0 * c->cols; i < r1 * c->cols; i++) mx = fmaxf(mx, fabsf(c->v[i]));
    c->out[tid] = fmax(c->out[tid], (double)mx);
}

/* After a micro-batch's forward: the largest |logit| (last stage) and, on
 * a health step, each local layer's sum of squares of its output rows
 * (this rank's: under sp its rows; replicated rows count on each rank
 * holding them, in the sum and the count alike). */
static void health_forward(Trainer *tr, const TrainActs *a)
{
    const Model *m = &tr->m;
    if (topo_is_last_stage(&tr->topo)) {   /* (N, V): on the pool, a large vocabulary makes it a real pass */
        const int nt = pool_threads();
        double mx[nt];
        for (int t = 0; t < nt; t++) mx[t] = 0;
        struct absmax_ctx c = { a->logits, m->V, mx };
        pool_for(a->N, 16, absmax_rows, &c);
        for (int t = 0; t < nt; t++) tr->logit_max = fmax(tr->logit_max, mx[t]);
    }
    if (!tr->health) return;
    const int L = m->cfg.num_hidden_layers;
    const size_t rows = model_sp_rows(m, a->N), n = rows * m->d;
    for (int i = 0; i < tr->n_local; i++) {
        const float *x = a->x[i + 1];
        double ss = 0;
        for (size_t j = 0; j < n; j++) ss += (double)x[j] * x[j];
        tr->act_ss[tr->topo.layer_begin + i] += ss;
        tr->act_ss[L + tr->topo.layer_begin + i] += (double)n;
    }
}

static void obs_step_begin(Trainer *tr)
{
    const int L = tr->m.cfg.num_hidden_layers, he = tr->rc->health_every;
    tr->t_fwd = tr->t_bwd = tr->logit_max = 0;
    tr->health = he > 0 && (tr->step == 0 || (tr->step + 1) % he == 0);
    memset(tr->act_ss, 0, 2 * (size_t)L * sizeof(double));
    for (int s = 0; s < tr->n_slots; s++) {
        TrainActs *a = &tr->slots[s].acts;
        a->bt_attn = a->bt_router = a->bt_ffn = a->t_head = 0;
        for (int i = 0; i < tr->n_local; i++) a->la[i].t_attn = a->la[i].t_router = a->la[i].t_ffn = 0;
    }
}

/* The step's figures over the world (every rank calls it, after the
 * step's own communication, whose statistics it keeps first): maxima
 * (comm seconds per group, forward and backward per stage, time per layer
 * kind, |logit|), per-rank memory, and on a health step the activation
 * sums.  Two or three small all-reduces on the world group, whose own
 * statistics are not reported. */
static void obs_step_end(Trainer *tr)
{
    const int L = tr->m.cfg.num_hidden_layers, P = tr->topo.pp, W = comm_size();
    for (int g = 0; g < COMM_N_GROUPS; g++) comm_stats((CommGroup)g, &tr->cs[g]);
    double *mx = tr->obs_max;
    const size_t n_max = COMM_N_GROUPS + 2 * (size_t)P + 5;
    for (size_t i = 0; i < n_max; i++) mx[i] = 0;
    for (int g = 0; g < COMM_N_GROUPS; g++) mx[g] = tr->cs[g].seconds;
    double *st = mx + COMM_N_GROUPS;
    st[tr->topo.pp_rank] = tr->t_fwd;
    st[P + tr->topo.pp_rank] = tr->t_bwd;
    double attn = 0, router = 0, ffn = 0, head = 0;
    for (int s = 0; s < tr->n_slots; s++) {
        const TrainActs *a = &tr->slots[s].acts;
        attn += a->bt_attn;
        router += a->bt_router;
        ffn += a->bt_ffn;
        head += a->t_head;
        for (int i = 0; i < tr->n_local; i++) {
            attn += a->la[i].t_attn;
            router += a->la[i].t_router;
            ffn += a->la[i].t_ffn;
        }
    }
    double *kind = st + 2 * P;
    kind[0] = attn;
    kind[1] = router;
    kind[2] = ffn - router;
    kind[3] = head;
    kind[4] = tr->logit_max;
    comm_allreduce_max_f64(COMM_WORLD, mx, n_max);
    double *mem = tr->mem_rank;
    for (size_t i = 0; i < (size_t)W * MEM_KINDS; i++) mem[i] = 0;
    size_t rss, rss_peak;
    td_rss(&rss, &rss_peak);
    double *me = mem + (size_t)comm_rank() * MEM_KINDS, act = 0;
    for (int s = 0; s < tr->n_slots; s++) act += (double)tr->slots[s].acts.arena.size;
    me[MEM_RSS] = (double)rss / 1048576.0;
    me[MEM_RSS_PEAK] = (double)rss_peak / 1048576.0;
    me[MEM_ALLOC] = (double)td_mem_current() / 1048576.0;
    me[MEM_ALLOC_PEAK] = (double)td_mem_peak() / 1048576.0;
    me[MEM_ACT] = act / 1048576.0;
    comm_allreduce_f64(COMM_WORLD, mem, (size_t)W * MEM_KINDS);
    if (tr->health) comm_allreduce_f64(COMM_WORLD, tr->act_ss, 2 * (size_t)L);
}

/* The loss-spike rule (SPIKE_* above) against the losses before this
 * step; then this loss joins them.  A one-line warning on rank 0. */
static void spike_check(Trainer *tr, double loss)
{
    const int n = tr->n_hist < SPIKE_WINDOW ? tr->n_hist : SPIKE_WINDOW;
    tr->spike = false;
    if (n >= SPIKE_MIN_HIST) {
        double mean = 0, var = 0;
        for (int i = 0; i < n; i++) mean += tr->loss_hist[i];
        mean /= n;
        for (int i = 0; i < n; i++) var += (tr->loss_hist[i] - mean) * (tr->loss_hist[i] - mean);
        const double sd = sqrt(var / (n - 1));
        tr->spike = loss > mean + SPIKE_SD * sd && loss > mean * (1 + SPIKE_REL);
        if (tr->spike && tr->rank0)
            td_info("warning: step %lld: loss spike: %.4f against a mean of %.4f (sd %.4f) over the last %d steps",
                    (long long)tr->step, loss, mean, sd, n);
    }
    tr->loss_hist[tr->n_hist % SPIKE_WINDOW] = loss;
    tr->n_hist++;
}

/* Forward of the next micro-batch into slot sl. */
static void mb_forward(Trainer *tr, Slot *sl, StepAcc *acc)
{
    const RunConfig *rc = tr->rc;
    const double ga = rc->grad_accum;
    const int64_t cursor = tr->loader.cursor;
    next_batch(tr, &tr->loader, sl);
    if (tr->img) {
        sl->acts.n_img = image_loader_fill(&tr->il, cursor, sl->ids, sl->targets, sl->w, tr->pixels, &sl->n_scored);
        sl->acts.vis = &tr->va;
        sl->acts.pixels = tr->pixels;
    }
    LossParts lp = { 0 };
    double mn[tr->n_local + 1], mx[tr->n_local + 1];
    lp.expert_share_min = mn;
    lp.expert_share_max = mx;
    const size_t n_tot = (size_t)rc->micro_batch * (size_t)rc->seq_len;
    const double t0 = td_now();
    model_train_forward(&tr->m, &sl->acts, sl->ids, sl->targets, n_tot, &lp);
    tr->t_fwd += td_now() - t0;
    health_forward(tr, &sl->acts);
    if (tr->img) {   /* the scored targets only, as a share of the micro-batch's mean */
        double ce = 0;
        for (size_t t = 0; t < sl->acts.N; t++) ce -= (double)sl->w[t] * sl->acts.logp[t];
        lp.ce_sum = ce * (double)n_tot / sl->n_scored;
    }
    acc->ce += lp.ce_sum;
    acc->aux_sum += lp.aux * lp.n_moe / ga;
    acc->z_sum += lp.z * lp.n_moe / ga;
    acc->seq_sum += lp.seq_bal_sum / ga;
    const size_t E = tr->m.E_global;
    for (int i = 0; i < tr->n_local; i++) {
        int l = tr->topo.layer_begin + i;
        if (!tr->m.layers[l].moe) continue;
        for (size_t e = 0; e < E; e++) tr->load[(size_t)l * E + e] += sl->acts.la[i].count[e];   /* global over dp */
        tr->share_min[l] += mn[i] / ga;
        tr->share_max[l] += mx[i] / ga;
        tr->ep_rows += (double)sl->acts.la[i].n_recv;
    }
}

/* Backward of the micro-batch in slot sl; the last one of the step starts
 * the gradient reduction as layers finish. */
static void mb_backward(Trainer *tr, Slot *sl, bool last_of_step)
{
    const RunConfig *rc = tr->rc;
    const Model *m = &tr->m;
    const double ga = rc->grad_accum, n_tot = (double)rc->micro_batch * rc->seq_len;
    if (tr->img)   /* the mean over the micro-batch's scored targets */
        for (size_t t = 0; t < sl->acts.N; t++) sl->dlogp[t] = (float)(-sl->w[t] / (sl->n_scored * ga));
    else
        for (size_t t = 0; t < sl->acts.N; t++) sl->dlogp[t] = (float)(-1.0 / (n_tot * ga));
    float daux = tr->n_moe_global ? (float)(m->cfg.router_aux_loss_coef / (tr->n_moe_global * ga)) : 0.0f;
    float dz = tr->n_moe_global ? (float)(m->cfg.router_z_loss_coef / (tr->n_moe_global * ga)) : 0.0f;
    /* sequence-wise balance: mean over the micro-batch's sequences (all dp
     * ranks) and the MoE layers, as the aux loss */
    sl->acts.dseq_bal = tr->n_moe_global ? (float)(rc->router_seq_aux_loss_coef /
                                                   ((double)tr->n_moe_global * rc->micro_batch * ga)) : 0.0f;
    tr->reduce_now = comm_size() > 1 && last_of_step;
    const double t0 = td_now();
    model_train_backward(&tr->m, &sl->acts, sl->targets, sl->dlogp, daux, dz);
    tr->t_bwd += td_now() - t0;
}

/* 1F1B (PipeDream-flush / Megatron): stage s runs min(p-s-1, m) warm-up
 * forwards, then alternates one forward and one backward, then drains the
 * backwards.  Activations go forward and gradients backward through the
 * pp group; pairs that cross in opposite directions use one Sendrecv so
 * neighbours never wait on each other.  Each direction between two stages
 * carries one kind of message (activations forward, gradients backward) in
 * schedule order, so one tag suffices: MPI does not reorder messages. */
static void run_1f1b(Trainer *tr, StepAcc *acc)
{
    const int p = tr->topo.pp, s = tr->topo.pp_rank, mcount = tr->rc->grad_accum, K = tr->n_slots;
    const int prev = pp_prev(tr), next = pp_next(tr), nl = tr->n_local;
    const size_t nb = act_bytes(tr);
    const int warm = p - s - 1 < mcount ? p - s - 1 : mcount, rem = mcount - warm;
#define SLOT(i) (&tr->slots[(i) % K])
    for (int i = 0; i < warm; i++) {
        comm_sendrecv(COMM_PP, NULL, 0, -1, SLOT(i)->acts.x[0], nb, prev, 0);
        mb_forward(tr, SLOT(i), acc);
        comm_sendrecv(COMM_PP, SLOT(i)->acts.x[nl], nb, next, NULL, 0, -1, 0);
    }
    if (rem > 0) comm_sendrecv(COMM_PP, NULL, 0, -1, SLOT(warm)->acts.x[0], nb, prev, 0);
    for (int j = 0; j < rem; j++) {
        int f = warm + j, b = j;
        mb_forward(tr, SLOT(f), acc);
        /* send this forward's output, receive the gradient for backward b */
        comm_sendrecv(COMM_PP, SLOT(f)->acts.x[nl], nb, next, SLOT(b)->acts.dx, nb, next, 0);
        mb_backward(tr, SLOT(b), b == mcount - 1);
        if (j == rem - 1)
            comm_sendrecv(COMM_PP, SLOT(b)->acts.dx, nb, prev, NULL, 0, -1, 0);
        else   /* send the input gradient back, receive the next forward's input */
            comm_sendrecv(COMM_PP, SLOT(b)->acts.dx, nb, prev, SLOT(f + 1)->acts.x[0], nb, prev, 0);
    }
    for (int b = rem; b < mcount; b++) {
        comm_sendrecv(COMM_PP, NULL, 0, -1, SLOT(b)->acts.dx, nb, next, 0);
        mb_backward(tr, SLOT(b), b == mcount - 1);
        comm_sendrecv(COMM_PP, SLOT(b)->acts.dx, nb, prev, NULL, 0, -1, 0);
    }
#undef SLOT
}

/* Tied embeddings across stages: the last stage's lm_head copy sends its
 * (dp-reduced) gradient to the first stage, which owns the weight and its
 * optimizer state; after the update the first stage sends the weights. */
static void tied_grads(Trainer *tr)
{
    Model *m = &tr->m;
    if (tr->topo.pp == 1 || !m->cfg.tie_word_embeddings) return;
    const size_t n = m->V * m->d;
    if (topo_is_last_stage(&tr->topo)) {
        /* the owner's gradient is dp-summed already, unless ZeRO sums it
         * after this (reduce-scatter): then each rank sends its own part */
        if (!tr->zero) comm_allreduce_f32(COMM_DP, m->lm_head->g, n);
        comm_sendrecv(COMM_PP, m->lm_head->g, n * sizeof(float), 0, NULL, 0, -1, 4);
    } else if (topo_is_first_stage(&tr->topo)) {
        float *tmp = td_malloc(n * sizeof(float));
        comm_sendrecv(COMM_PP, NULL, 0, -1, tmp, n * sizeof(float), tr->topo.pp - 1, 4);
        for (size_t i = 0; i < n; i++) m->embed->g[i] += tmp[i];
        td_free(tmp);
    }
}

static void tied_weights(Trainer *tr)
{
    Model *m = &tr->m;
    if (tr->topo.pp == 1 || !m->cfg.tie_word_embeddings) return;
    const size_t bytes = m->V * m->d * sizeof(float);
    if (topo_is_first_stage(&tr->topo))
        comm_sendrecv(COMM_PP, m->embed->w, bytes, tr->topo.pp - 1, NULL, 0, -1, 5);
    else if (topo_is_last_stage(&tr->topo))
        comm_sendrecv(COMM_PP, NULL, 0, -1, m->lm_head->w, bytes, 0, 5);
}

/* Auxiliary-loss-free balance (DeepSeek-V3, section 2.1.2): after the
 * step, each MoE layer's correction bias moves by the rate against each
 * expert's load error, bias_e += rate * sign(mean_e' load_e' - load_e),
 * load_e the tokens routed to e over the step's micro-batches and every dp
 * rank.  The loads are global, so every replica of the bias (dp, tp, ep)
 * makes the same move. */
static void router_bias_update(Trainer *tr)
{
    const double rate = tr->rc->router_bias_update_rate;
    const size_t E = tr->m.E_global;
    for (int l = tr->topo.layer_begin; l < tr->topo.layer_end; l++) {
        const Layer *L = &tr->m.layers[l];
        if (!L->rbias || rate <= 0) continue;
        const double *load = tr->load + (size_t)l * E;
        double mean = 0;
        for (size_t e = 0; e < E; e++) mean += load[e];
        mean /= (double)E;
        for (size_t e = 0; e < E; e++) {
            const float sgn = mean > load[e] ? 1.0f : mean < load[e] ? -1.0f : 0.0f;
            L->rbias->w[e] += (float)rate * sgn;
        }
    }
}

static int train_step(Trainer *tr)
{
    const RunConfig *rc = tr->rc;
    const Model *m = &tr->m;
    const size_t n_tot = (size_t)rc->micro_batch * (size_t)rc->seq_len;
    const double ga = rc->grad_accum;
    const int L = m->cfg.num_hidden_layers;
    double t0 = td_now();
    comm_stats_reset();
    obs_step_begin(tr);
    tr->ep_rows = 0;
    memset(tr->m.g, 0, tr->m.n_w * sizeof(float));
    StepAcc acc = { 0 };
    for (int l = 0; l < L; l++) tr->share_min[l] = tr->share_max[l] = 0;
    memset(tr->load, 0, (size_t)L * m->E_global * sizeof(double));
    if (tr->topo.pp > 1) {
        run_1f1b(tr, &acc);
    } else {
        for (int mb = 0; mb < rc->grad_accum; mb++) {
            mb_forward(tr, &tr->slots[0], &acc);
            mb_backward(tr, &tr->slots[0], mb == rc->grad_accum - 1);
        }
    }
    double ce = acc.ce;
    LossParts sum = { 0 };
    /* every rank's gradient is its share of the global mean: the sums
     * started during the last backward (grad_ready_hook) complete here */
    tr->reduce_now = false;
    comm_wait_all();
    tied_grads(tr);
    if (tr->nan_param && tr->step + 1 == tr->nan_step) tr->nan_param->g[0] = NAN;   /* debug_nan_grad */
    double gsq = 0;
    if (tr->zero) {
        /* ZeRO-1: each rank receives the summed gradient of its shard only */
        for (int i = 0; i < tr->n_buckets; i++) {
            const Bucket *b = &tr->buckets[i];
            size_t counts[comm_group_size(b->g)];
            bucket_counts(b, counts);
            comm_reduce_scatter_v_f32(b->g, tr->zbuf, tr->m.g + b->off, counts);
            memcpy(tr->m.g + b->lo, tr->zbuf, (b->hi - b->lo) * sizeof(float));
            gsq += grad_sq_range(m, b->lo, b->hi, (double)comm_group_size(b->g));
        }
    } else {
        gsq = grad_sq_norm(m);
    }
    /* loss: ce lives on the last stage, aux/z on the stages of their layers */
    /* the sequence-wise sums are over this rank's sequences: summed over dp */
    double red[4] = { ce, acc.seq_sum, acc.aux_sum, acc.z_sum };
    comm_allreduce_f64(COMM_DP, red, 2);
    comm_allreduce_f64(COMM_PP, red, 4);
    ce = red[0] / ((double)n_tot * ga);
    sum.aux = tr->n_moe_global ? red[2] / tr->n_moe_global : 0;
    sum.z = tr->n_moe_global ? red[3] / tr->n_moe_global : 0;
    tr->seq_bal = tr->n_moe_global ? red[1] / ((double)tr->n_moe_global * rc->micro_batch) : 0;
    double loss = ce + m->cfg.router_aux_loss_coef * sum.aux + m->cfg.router_z_loss_coef * sum.z +
                  rc->router_seq_aux_loss_coef * tr->seq_bal;
    if (tr->topo.pp > 1) {   /* per-layer expert shares: each stage knows its own layers */
        double enc[2 * L];
        for (int l = 0; l < L; l++) {
            bool mine = l >= tr->topo.layer_begin && l < tr->topo.layer_end && m->layers[l].moe;
            enc[l] = mine ? tr->share_max[l] : -1;
            enc[L + l] = mine ? -tr->share_min[l] : -2;
        }
        comm_allreduce_max_f64(COMM_PP, enc, 2 * (size_t)L);
        for (int l = 0; l < L; l++) {
            tr->share_max[l] = enc[l];
            tr->share_min[l] = -enc[L + l];
        }
    }
    comm_allreduce_f64(COMM_WORLD, &gsq, 1);
    double gnorm = sqrt(gsq);
    if (!isfinite(gnorm) || !isfinite(loss)) return nonfinite_step(tr, loss, gnorm) > 0 ? 0 : -1;
    /* clipping: AdamW takes g * gscale (no separate pass over the gradients) */
    const float gscale = rc->grad_clip > 0 && gnorm > rc->grad_clip ? (float)(rc->grad_clip / gnorm) : 1.0f;
    double lr = lr_schedule(rc->lr, rc->min_lr, rc->warmup_steps, rc->steps,
                            !strcmp(rc->lr_schedule, "cosine"), tr->step);
    if (tr->step + 1 == tr->lr_spike_step) lr *= tr->lr_spike_mul;   /* debug_lr_spike */
    tr->step++;
    if (tr->zero) {
        for (int i = 0; i < tr->n_buckets; i++) {
            const Bucket *b = &tr->buckets[i];
            adamw_range(&tr->m, b->lo, b->hi, tr->exp_avg + b->mom, tr->exp_avg_sq + b->mom, &tr->adam,
                        tr->step, lr, gscale);
            size_t counts[comm_group_size(b->g)];
            bucket_counts(b, counts);
            comm_allgather_v_f32(b->g, tr->m.w + b->off, counts);
        }
    } else {
        adamw_step(&tr->m, tr->exp_avg, tr->exp_avg_sq, &tr->adam, tr->step, lr, gscale);
    }
    router_bias_update(tr);
    /* the loads for metrics (expert_load): each stage holds its own layers'
     * (zeros elsewhere) */
    if (tr->topo.pp > 1)
        comm_allreduce_f64(COMM_PP, tr->load, (size_t)L * m->E_global);
    tied_weights(tr);
    model_pack(&tr->m);
    tr->tokens_seen += (int64_t)(n_tot * (size_t)rc->grad_accum);

    if (tr->topo.ep > 1) {   /* rows each ep rank received (tokens x routes) */
        double mx[2] = { tr->ep_rows, -tr->ep_rows };
        comm_allreduce_max_f64(COMM_EP, mx, 2);
        tr->ep_max = mx[0];
        tr->ep_min = -mx[1];
    }
    double step_s = td_now() - t0, comm_s = 0;
    for (int g = COMM_DP; g < COMM_N_GROUPS; g++) {
        CommStat cs;
        comm_stats((CommGroup)g, &cs);
        comm_s += cs.seconds;
    }
    double tok_s = (double)n_tot * ga / step_s;
    if (tr->topo.pp > 1) {   /* bubble: time a stage spends waiting on its neighbours */
        CommStat ps;
        comm_stats(COMM_PP, &ps);
        double b = ps.seconds / step_s;
        comm_allreduce_f64(COMM_PP, &b, 1);
        tr->bubble = b / tr->topo.pp;
    }
    /* MFU: model FLOPs per second over the FMA peak measured on these
     * cores at start-up (core/fma_peak.h); gemm_eff over the best GEMM rate
     * measured at start-up (tandem's kernel or cblas_sgemm), sgemm_eff over
     * cblas_sgemm's: efficiencies against what a GEMM reaches here */
    const double model_flops = tr->flops_per_token * tok_s / (1e9 * comm_size());
    double mfu = model_flops / tr->peak_fma;
    tr->gemm_eff = model_flops / fmax(tr->peak_kernel, tr->peak_sgemm);
    tr->sgemm_eff = model_flops / tr->peak_sgemm;
    obs_step_end(tr);
    spike_check(tr, loss);
    double val = NAN;
    if (rc->eval_every > 0 && (tr->step % rc->eval_every == 0 || tr->step == rc->steps)) {
        val = evaluate(tr);
        tr->last_val = val;
    }
    write_metrics(tr, &sum, ce, loss, lr, gnorm, tok_s, mfu, step_s, comm_s, val);
    tr->last_loss = loss;
    if (tr->step > 1) {   /* the first step pays for first-touch memory */
        tr->tok_s_sum += tok_s;
        tr->mfu_sum += mfu;
        tr->gemm_eff_sum += tr->gemm_eff;
        tr->sgemm_eff_sum += tr->sgemm_eff;
        tr->n_timed++;
    }
    double avg = tr->n_timed ? (td_now() - tr->t_start) / (double)tr->step : step_s;
    progress(tr, loss, lr, tok_s, mfu, avg * (double)(rc->steps - tr->step), comm_s, step_s);
    if (tr->rank0 && !isnan(val) && !tr->tty) td_info("step %lld: validation loss %.4f", (long long)tr->step, val);
    return 0;
}

static void summary(Trainer *tr)
{
    if (!tr->rank0) return;
    const RunConfig *rc = tr->rc;
    double el = td_now() - tr->t_start;
    char tk[16];
    fmt_count(tk, sizeof tk, (double)tr->tokens_seen);
    if (tr->tty) fprintf(stderr, "\n");
    fprintf(stderr,
            "---------------------------------------------------------------- tandem train\n"
            "  model        %s, %.2fM params (%.2fM active per token)\n"
            "  topology     world %d = dp %d x tp %d x pp %d x cp %d, ep %d, %d thread(s) per rank\n"
            "  steps        %lld of %d, %s tokens, %.1f s\n"
            "  loss         %.4f (last step)%s",
            rc->model_src, config_param_count(&tr->m.cfg) / 1e6, config_active_param_count(&tr->m.cfg) / 1e6,
            tr->topo.world, tr->topo.dp, tr->topo.tp, tr->topo.pp, tr->topo.cp, tr->topo.ep, pool_threads(),
            (long long)tr->step, rc->steps, tk, el, tr->last_loss, isnan(tr->last_val) ? "\n" : "");
    if (!isnan(tr->last_val))
        fprintf(stderr, ", validation %.4f (perplexity %.2f)\n", tr->last_val, exp(tr->last_val));
    fprintf(stderr,
            "  throughput   %.0f tokens/s, MFU %.1f%% of the FMA peak measured here (%.0f GFLOP/s per rank)\n"
            "  GEMM eff.    %.1f%% of the best GEMM rate measured at start-up (%.0f GFLOP/s per rank),\n"
            "               %.1f%% of cblas_sgemm's (%.0f GFLOP/s per rank)\n"
            "  memory       peak %.1f MiB allocated (activations %.1f MiB), RSS %.1f MiB\n"
            "  checkpoint   %s\n"
            "  metrics      %s/metrics.jsonl\n",
            tr->n_timed ? tr->tok_s_sum / tr->n_timed : 0.0, tr->n_timed ? 100 * tr->mfu_sum / tr->n_timed : 0.0,
            tr->peak_fma, tr->n_timed ? 100 * tr->gemm_eff_sum / tr->n_timed : 0.0, fmax(tr->peak_kernel, tr->peak_sgemm),
            tr->n_timed ? 100 * tr->sgemm_eff_sum / tr->n_timed : 0.0, tr->peak_sgemm, td_mem_peak() / 1048576.0, tr->slots[0].acts.arena.size / 1048576.0,
            td_rss_peak() / 1048576.0, tr->last_ckpt[0] ? tr->last_ckpt : "(none)", rc->out_dir);
    if (tr->n_skipped)
        fprintf(stderr, "  skipped      %lld step(s) with a non-finite loss or gradient (on_nonfinite=skip)\n",
                (long long)tr->n_skipped);
}

static void trainer_free(Trainer *tr)
{
    if (tr->metrics) fclose(tr->metrics);
    for (int i = 0; i < tr->n_slots; i++) {
        model_train_acts_free(&tr->slots[i].acts);
        td_free(tr->slots[i].ids);
        td_free(tr->slots[i].targets);
        td_free(tr->slots[i].dlogp);
    }
    for (int i = 0; i < tr->n_slots; i++) td_free(tr->slots[i].w);
    td_free(tr->slots);
    if (tr->img) {
        image_loader_free(&tr->il);
        vision_acts_free(&tr->va);
        td_free(tr->pixels);
    }
    model_free(&tr->m);
    td_free(tr->exp_avg);
    td_free(tr->exp_avg_sq);
    td_free(tr->share_min);
    td_free(tr->share_max);
    td_free(tr->load);
    td_free(tr->act_ss);
    td_free(tr->obs_max);
    td_free(tr->mem_rank);
    td_free(tr->buckets);
    td_free(tr->zbuf);
    td_free(tr->cp_ids);
    td_free(tr->cp_targets);
    tokfile_close(&tr->tf);
    ckpt_text_free(&tr->tx);
}

/* A copy of n bytes, NUL-terminated (CkptTokFiles' texts are). */
static char *copy_text(const char *s, size_t n)
{
    char *o = td_malloc(n + 1);
    memcpy(o, s, n);
    o[n] = 0;
    return o;
}

/* The run's tokenizer (docs/config.md, key tokenizer): tokenizer=, else
 * that of the checkpoint resumed or started from, else the data file's,
 * else none (byte-level).  The model's vocabulary must
 * cover it, and a data file that records a tokenizer must have been made
 * with this one.  0, or -1 after one error line. */
static int setup_tokenizer(Trainer *tr)
{
    const RunConfig *rc = tr->rc;
    const TokenFile *tf = &tr->tf;
    char err[1024];
    const char *from = rc->tokenizer[0] ? rc->tokenizer : tr->from_src[0] ? tr->from_src : NULL;
    if (from && ckpt_open_text(from, rc->tokenizer[0] != 0, &tr->tx, err, sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    if (!tr->tx.files.tokenizer_json) {
        ckpt_text_free(&tr->tx);
        if (tf->tok_json) {   /* the data's */
            CkptTokFiles *f = &tr->tx.files;
            f->tokenizer_json = copy_text(tf->tok_json, tf->tok_json_len);
            f->tokenizer_json_len = tf->tok_json_len;
            if (tf->tok_config) {
                f->tokenizer_config = copy_text(tf->tok_config, tf->tok_config_len);
                f->tokenizer_config_len = tf->tok_config_len;
            }
            if (tok_load_mem(&tr->tx.tok, f->tokenizer_json, f->tokenizer_json_len, f->tokenizer_config,
                             f->tokenizer_config_len, err, sizeof err)) {
                td_error("data %s: its tokenizer: %s", rc->data, err);
                return -1;
            }
            from = rc->data;
        } else {
            tr->tx.tok = tok_byte_level();
            return 0;
        }
    }
    const CkptTokFiles *f = &tr->tx.files;
    int32_t V = tok_vocab_size(tr->tx.tok);
    if (V > tr->m.cfg.vocab_size) {
        td_error("the tokenizer of %s has %d ids, more than the model's vocab_size %d", from, (int)V,
                 tr->m.cfg.vocab_size);
        return -1;
    }
    if (tf->tok_json && (tf->tok_json_len != f->tokenizer_json_len || memcmp(tf->tok_json, f->tokenizer_json, tf->tok_json_len))) {
        td_error("data %s was prepared with another tokenizer than %s's (their tokenizer.json differ)", rc->data, from);
        return -1;
    }
    if (!tf->tok_json && tf->vocab <= 256) {
        td_error("data %s holds byte-level tokens, but the run's tokenizer is %s's (V = %d): prepare the data with "
                 "`tandem data prepare --tokenizer %s`", rc->data, from, (int)V, from);
        return -1;
    }
    if (tr->rank0) td_info("train: tokenizer of %s (V = %d), stored in every checkpoint", from, (int)V);
    return 0;
}

/* Run key images (train/image_data.h): the examples, the tower's
 * activations and the pixel buffer of slot 0.  0, or -1 after one line. */
static int setup_images(Trainer *tr, size_t B, size_t T)
{
    const RunConfig *rc = tr->rc;
    char err[1024];
    if (tr->topo.pp > 1) {
        td_error("images %s: pipeline parallelism (pp = %d) does not take images yet", rc->images, tr->topo.pp);
        return -1;
    }
    if (tr->topo.cp > 1 || tr->topo.sp) {
        td_error("images %s: %s does not take images yet", rc->images,
                 tr->topo.cp > 1 ? "context parallelism (cp > 1)" : "sequence parallelism (sp=true)");
        return -1;
    }
    if (image_loader_init(&tr->il, rc->images, &tr->m.cfg, tr->tx.tok, rc->image_fraction, (size_t)rc->micro_batch,
                          T, (size_t)tr->topo.dp, (size_t)tr->topo.dp_rank, rc->shuffle, (uint64_t)rc->seed, err,
                          sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    if (tr->il.K == 0) {
        td_error("images %s: image_fraction %g of micro_batch %d gives no image rows", rc->images, rc->image_fraction,
                 rc->micro_batch);
        image_loader_free(&tr->il);
        return -1;
    }
    const TokenStream ts = tokfile_train(&tr->tf);
    for (uint64_t i = 0; i < ts.len; i++)   /* text rows must not hold placeholders */
        if (tokfile_get(&tr->tf, ts.begin + i) == tr->m.cfg.image_token_index) {
            td_error("data %s holds the image placeholder id %d (token %llu): its text rows would take images",
                     rc->data, tr->m.cfg.image_token_index, (unsigned long long)i);
            image_loader_free(&tr->il);
            return -1;
        }
    tr->img = true;
    const size_t S = (size_t)tr->m.cfg.vision_config.image_size;
    vision_acts_init(&tr->va, &tr->m, B);
    tr->pixels = td_malloc(B * 3 * S * S * sizeof(float));
    tr->slots[0].w = td_malloc(B * T * sizeof(float));
    if (tr->rank0)
        td_info("train: %zu image examples (%zu images) from %s, %zu of %d rows per micro-batch", tr->il.set.n,
                tr->il.set.n_img, rc->images, tr->il.K, rc->micro_batch);
    return 0;
}

int train_run(const RunConfig *rc)
{
    Trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.rc = rc;
    tr.rank0 = comm_rank() == 0;
    tr.tty = isatty(2) && tr.rank0;
    tr.last_val = NAN;
    if (rc->threads > 0) pool_init(rc->threads);
    char err[512];
    if (!rc->data[0]) {
        td_error("run config: no \"data\" (a token file from `tandem data prepare`)");
        return 1;
    }
    if (tokfile_open(&tr.tf, rc->data, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    CkptState st;
    memset(&st, 0, sizeof st);   /* ckpt_load may allocate into it: freed at out */
    bool resumed;
    int ret = 1;
    if (setup_model(&tr, &st, &resumed)) goto out;
    if (setup_tokenizer(&tr)) goto out;
    if ((int)tr.tf.vocab > tr.m.cfg.vocab_size) {
        td_error("data %s was made for vocab %u, the model has vocab_size %d", rc->data, tr.tf.vocab,
                 tr.m.cfg.vocab_size);
        goto out;
    }
    if (rc->router_bias_update_rate > 0 && !config_router_bias(&tr.m.cfg)) {
        td_error("router_bias_update_rate %g needs a router with a correction bias (topk_method \"noaux_tc\")",
                 rc->router_bias_update_rate);
        goto out;
    }
    if (rc->router_seq_aux_loss_coef > 0 && tr.m.cfg.scoring_func != ROUTER_SIGMOID) {
        td_error("router_seq_aux_loss_coef %g needs a sigmoid router (scoring_func \"sigmoid\"); softmax routers "
                 "use router_aux_loss_coef", rc->router_seq_aux_loss_coef);
        goto out;
    }
    if (rc->cp > 1 && rc->router_seq_aux_loss_coef > 0) {
        td_error("router_seq_aux_loss_coef %g with cp=%d: the sequence-wise balance loss needs whole sequences on "
                 "a rank (not implemented under context parallelism)", rc->router_seq_aux_loss_coef, rc->cp);
        goto out;
    }
    if (rc->seq_len > tr.m.cfg.max_position_embeddings) {
        td_error("seq_len %d exceeds the model's max_position_embeddings %d", rc->seq_len,
                 tr.m.cfg.max_position_embeddings);
        goto out;
    }
    tr.adam = (AdamHyper){ rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay };
    const size_t B = (size_t)(rc->micro_batch / tr.topo.dp), T = (size_t)rc->seq_len;
    Recompute mode = !strcmp(rc->recompute, "full") ? RECOMPUTE_FULL
                   : !strcmp(rc->recompute, "selective") ? RECOMPUTE_SELECTIVE : RECOMPUTE_NONE;
    tr.n_slots = train_n_slots(&tr.topo, rc->grad_accum);
    tr.slots = td_calloc((size_t)tr.n_slots * sizeof(Slot));
    for (int i = 0; i < tr.n_slots; i++) {
        model_train_acts_init(&tr.slots[i].acts, &tr.m, B, T, mode);
        const size_t Nr = tr.slots[i].acts.N;   /* this rank's rows */
        tr.slots[i].ids = td_malloc(Nr * sizeof(int32_t));
        tr.slots[i].targets = td_malloc(Nr * sizeof(int32_t));
        tr.slots[i].dlogp = td_malloc(Nr * sizeof(float));
    }
    if (tr.topo.cp > 1) {
        tr.cp_ids = td_malloc(B * T * sizeof(int32_t));
        tr.cp_targets = td_malloc(B * T * sizeof(int32_t));
    }
    tr.n_local = tr.topo.layer_end - tr.topo.layer_begin;
    tr.n_moe_global = config_n_moe_layers(&tr.m.cfg);
    tr.share_min = td_calloc((size_t)(tr.m.cfg.num_hidden_layers + 1) * sizeof(double));
    tr.share_max = td_calloc((size_t)(tr.m.cfg.num_hidden_layers + 1) * sizeof(double));
    tr.load = td_calloc(((size_t)tr.m.cfg.num_hidden_layers * tr.m.E_global + 1) * sizeof(double));
    tr.act_ss = td_calloc(2 * (size_t)tr.m.cfg.num_hidden_layers * sizeof(double));
    tr.obs_max = td_calloc((COMM_N_GROUPS + 2 * (size_t)tr.topo.pp + 5) * sizeof(double));
    tr.mem_rank = td_calloc((size_t)comm_size() * MEM_KINDS * sizeof(double));
    for (int i = 0; i < tr.n_slots; i++) tr.slots[i].acts.seq_bal = rc->router_seq_aux_loss_coef > 0;
    loader_init(&tr.loader, tokfile_train(&tr.tf), (size_t)rc->micro_batch, T, (size_t)tr.topo.dp,
                (size_t)tr.topo.dp_rank, rc->shuffle, (uint64_t)rc->seed);
    if (rc->images[0] && setup_images(&tr, B, T)) goto out;
    if (resumed) {
        tr.step = st.step;
        tr.tokens_seen = st.tokens_seen;
        tr.loader.cursor = st.micro_batches;
        memcpy(tr.loader.rng.s, st.data_rng, sizeof st.data_rng);
    }

    if (rc->debug_lr_spike[0]) {   /* STEP:FACTOR */
        char *end;
        long long stp = strtoll(rc->debug_lr_spike, &end, 10);
        double mul = *end == ':' ? strtod(end + 1, &end) : 0;
        if (stp < 1 || *end || !(mul > 0)) {
            td_error("debug_lr_spike: want STEP:FACTOR (a step >= 1, a factor > 0), got \"%s\"", rc->debug_lr_spike);
            goto out;
        }
        tr.lr_spike_step = stp;
        tr.lr_spike_mul = mul;
    }
    {
        char e[300];
        if (debug_nan_init(&tr, e, sizeof e)) {
            td_error("%s", e);
            goto out;
        }
    }
    if (tr.rank0 && td_mkdir_p(rc->out_dir)) {
        td_error("cannot create out_dir %s: %s", rc->out_dir, strerror(errno));
        goto out;
    }
    if (tr.rank0) {
        char p[1100];
        snprintf(p, sizeof p, "%s/metrics.jsonl", rc->out_dir);
        if (resumed && metrics_rewind(p, tr.step)) goto out;
        tr.metrics = fopen(p, resumed ? "a" : "w");
        if (!tr.metrics) {
            td_error("cannot write %s: %s", p, strerror(errno));
            goto out;
        }
    }
    train_measure_peak(&tr.peak_sgemm, &tr.peak_kernel);
    /* no GEMM outruns the FMA units: a lower FMA figure was a disturbed
     * measurement (core/fma_peak.h), and the MFU never exceeds gemm_eff */
    tr.peak_fma = fmax(fma_peak_gflops(), fmax(tr.peak_kernel, tr.peak_sgemm));
    const ModelConfig *c = &tr.m.cfg;
    tr.flops_per_token = 6.0 * (double)config_active_param_count(c) +
                         6.0 * c->num_hidden_layers * (double)c->num_attention_heads * c->head_dim * (double)T;
    if (tr.rank0) {
        char pc[16];
        fmt_count(pc, sizeof pc, (double)config_param_count(c));
        td_info("train: %s params, %d layers, %d experts top-%d | world %d (dp %d tp %d%s pp %d cp %d ep %d) | "
                "batch %d x %d x %d accum | %d steps | weights %.1f MiB, activations %.1f MiB | "
                "FMA peak %.0f, best GEMM %.0f GFLOP/s",
                pc, c->num_hidden_layers, c->num_local_experts, c->num_experts_per_tok, tr.topo.world,
                tr.topo.dp, tr.topo.tp, tr.topo.sp ? " sp" : "", tr.topo.pp, tr.topo.cp, tr.topo.ep, rc->micro_batch, rc->seq_len, rc->grad_accum,
                rc->steps, model_weight_bytes(&tr.m) / 1048576.0, tr.n_slots * tr.slots[0].acts.arena.size / 1048576.0, tr.peak_fma,
                fmax(tr.peak_kernel, tr.peak_sgemm));
    }
    td_errors_rank0_only = 0;   /* from here on, failures can be one rank's own */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    tr.t_start = td_now();
    int64_t start = tr.step;
    ret = 0;
    while (tr.step < rc->steps) {
        int stop = g_stop;
        if (comm_size() > 1) {   /* every rank stops at the same step */
            double s = stop;
            comm_allreduce_max_f64(COMM_WORLD, &s, 1);
            stop = s > 0;
        }
        if (stop) {
            if (tr.rank0) td_info("interrupted at step %lld: saving a checkpoint", (long long)tr.step);
            ret = 130;
            break;
        }
        if (train_step(&tr)) {
            ret = 1;
            goto out;
        }
        bool due = (rc->save_every > 0 && tr.step % rc->save_every == 0) || save_at_step(rc->save_at, tr.step);
        if (due && tr.step < rc->steps && save(&tr)) {
            ret = 1;
            goto out;
        }
    }
    /* a checkpoint is always written after the last step */
    if ((tr.step > start || !resumed || ret == 130) && save(&tr)) ret = 1;
    summary(&tr);
out:
    ckpt_state_free(&st);
    trainer_free(&tr);
    return ret;
}

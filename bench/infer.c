/* bench/infer.c - tandem's inference engine timed through its own API
 * (infer/engine.h), for bench/infer.sh.
 *
 *   infer --ckpt CKPT [--threads 2,1] [--prompt 256] [--gen 128] [--batch 16]
 *         [--reps 3] [--batch-reps 1] [--only ttft,b1,b16]
 *         [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8]
 *         [--loop-b1 | --loop-bn SECONDS [--perf-ctl CTL_FIFO[,ACK_FIFO]]]
 *         [--compare W[:KV],W[:KV],... [--rounds 15]]
 *
 * (--compare: dtypes decoded in turn in one process, section "compare".)
 * The checkpoint is loaded once, as `tandem serve` would (--dtype,
 * --kv-dtype: the weights and KV cache held in that dtype); for each thread count of --threads the
 * pool is resized (pool_init) and, after a short warm-up run of each kind
 * (same prompts, 16 tokens):
 *   ttft  time to first token of one request with a --prompt token prompt
 *         (submission to the first sampled token: the prefill step, the
 *         head and the sampler), from every batch-1 run;
 *   b1    one request decoding --gen tokens greedily: tokens/s after the
 *         first token ((n-1) / (t_last - t_first)) and the percentiles of
 *         the gap between consecutive tokens (per-token latency); and how
 *         often the experts of a MoE layer change from one decode step to
 *         the next (a repetitive greedy output keeps the same experts, which
 *         then stay in cache);
 *   b1s   the same sampled at temperature 1 (seeded): varied tokens, varied
 *         experts, the weights come from memory (run with b1);
 *   b16   --batch requests with different prompts submitted together (the
 *         engine prefills them in chunks, then decodes them side by side):
 *         the aggregate tokens/s over the steps in which every request
 *         decodes (no prompt rows, --batch new tokens) and the percentiles
 *         of those steps' durations; also end to end (all tokens generated /
 *         first submission to last token, prefill included).
 * The batch-1 prompt is c_peer's (token i = (37 i + 11) mod V, the
 * llama.cpp peer's), so the first greedy tokens can be compared across
 * engines; batch request j uses (37 i + 11 + 7 j) mod V.
 * --loop-b1 S (--loop-bn S): only run batch-1 requests (batches of --batch
 * requests) back to back for S seconds, then exit (for profiling).  With
 * --perf-ctl, the fifos of `perf record -D -1 --control fifo:CTL,ACK` get
 * "enable" when every request of the batch is decoding and "disable"
 * otherwise, so that the profile holds decode steps only:
 *   mkfifo /tmp/ctl /tmp/ack
 *   perf record -D -1 --control fifo:/tmp/ctl,/tmp/ack -g -- \
 *       build/bench/infer --ckpt CKPT --threads 1 --loop-b1 10 --perf-ctl /tmp/ctl,/tmp/ack
 *
 * Also prints the model's accounting for the bounds of bench/infer.sh:
 * weight bytes read per decoded token (attention, norms, router, k experts
 * of E per MoE layer, shared or dense FFN, the final norm, lm_head and one
 * embedding row), all weight bytes of the layers (what a batch that touches
 * every expert reads), KV-cache bytes per cached position, and the prefill
 * FLOPs of a --prompt token prompt (2 x active matrix params x T, causal
 * attention 4 x hd x H x T(T+1)/2 per layer, the head on the last row).
 *
 * Output: progress on stderr, one JSON line {"bench":"infer", ...} on stdout.
 */
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "core/common.h"
#include "core/pool.h"
#include "infer/engine.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_THREADS_LIST 8

typedef struct {
    double *t;   /* time of each token */
    size_t n, cap;
} Stamps;

static void stamp_cb(Request *r, bool done, void *user)
{
    (void)r;
    Stamps *s = user;
    if (done || s->n == s->cap) return;
    s->t[s->n++] = td_now();
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q-th percentile (0..100) of sorted v[n], nearest rank. */
static double pct(const double *v, size_t n, double q)
{
    if (!n) return 0;
    size_t i = (size_t)(q / 100.0 * (double)n);
    return v[i < n ? i : n - 1];
}

static double median_of(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

static void make_prompt(int32_t *ids, size_t n, size_t V, size_t j)
{
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11 + 7 * j) % V);
}

static GenParams greedy(int max_tokens)
{
    GenParams gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = max_tokens;
    gp.sp.temperature = 0;
    gp.sp.top_p = 1.0;
    return gp;
}

typedef struct {
    double ttft_ms, tok_s;
    int32_t first[16];
    size_t n_first;
    double route_change;    /* decode steps whose experts differ from the step before, per MoE layer */
    double route_distinct;  /* experts a MoE layer used over the decode */
} B1Run;

/* Route statistics over tokens 1..n_out-1 (the decode steps' rows). */
static void route_stats(const Request *r, int n_moe, int k, B1Run *out)
{
    if (!r->routes || n_moe <= 0 || r->n_out < 3) return;
    const size_t per = (size_t)n_moe * (size_t)k;
    double change = 0, distinct = 0;
    for (int l = 0; l < n_moe; l++) {
        uint64_t seen = 0, prev = 0;
        size_t changes = 0;
        for (size_t i = 1; i < r->n_out; i++) {
            uint64_t set = 0;
            for (int j = 0; j < k; j++) set |= 1ull << (r->routes[i * per + (size_t)l * k + (size_t)j] & 63);
            if (i > 1 && set != prev) changes++;
            seen |= set;
            prev = set;
        }
        change += (double)changes / (double)(r->n_out - 2);
        distinct += (double)__builtin_popcountll(seen);
    }
    out->route_change = change / n_moe;
    out->route_distinct = distinct / n_moe;
}

/* One batch-1 request: prompt n_prompt, gen tokens, greedy (temperature 0)
 * or sampled.  Gaps between tokens (seconds) are appended to lat (if not
 * NULL). */
static B1Run run_b1(Engine *e, size_t n_prompt, int gen, double temperature, uint64_t seed, double *lat,
                    size_t *n_lat)
{
    size_t V = e->m->V;
    int32_t *ids = td_malloc(n_prompt * sizeof(int32_t));
    make_prompt(ids, n_prompt, V, 0);
    GenParams gp = greedy(gen);
    gp.sp.temperature = temperature;
    gp.seed = seed;
    gp.want_routes = true;
    Request *r = request_new(ids, n_prompt, &gp);
    Stamps st = { td_malloc(((size_t)gen + 1) * sizeof(double)), 0, (size_t)gen + 1 };
    r->cb = stamp_cb;
    r->user = &st;
    TD_CHECK(engine_submit(e, r) == 0, "engine_submit refused the batch-1 request");
    while (engine_step(e) > 0) {}
    B1Run out = { (r->t_first - r->t_submit) * 1e3,
                  r->n_out > 1 ? (double)(r->n_out - 1) / (r->t_last - r->t_first) : 0, { 0 }, 0, 0, 0 };
    for (size_t i = 0; i < r->n_out && i < 16; i++) out.first[out.n_first++] = r->out[i];
    route_stats(r, e->n_moe, (int)e->m->k, &out);
    if (lat)
        for (size_t i = 1; i < st.n; i++) lat[(*n_lat)++] = st.t[i] - st.t[i - 1];
    td_free(st.t);
    request_free(r);
    td_free(ids);
    return out;
}

/* perf record --control fifo:CTL[,ACK]: "enable" / "disable" around the
 * decode of each request, so that the profile holds decode steps only. */
static int g_ctl = -1, g_ack = -1;

static void perf_ctl(const char *cmd)
{
    if (g_ctl < 0) return;
    if (write(g_ctl, cmd, strlen(cmd)) < 0) return;
    char buf[16];
    if (g_ack >= 0 && read(g_ack, buf, sizeof buf) < 0) return;
}

/* Batch-1 requests back to back until t_end; only their decode steps are
 * profiled.  Returns the best decode tokens/s. */
static double loop_b1(Engine *e, size_t n_prompt, int gen, double t_end, size_t *runs)
{
    size_t V = e->m->V;
    int32_t *ids = td_malloc(n_prompt * sizeof(int32_t));
    make_prompt(ids, n_prompt, V, 0);
    GenParams gp = greedy(gen);
    double best = 0;
    while (td_now() < t_end) {
        Request *r = request_new(ids, n_prompt, &gp);
        TD_CHECK(engine_submit(e, r) == 0, "engine_submit refused the batch-1 request");
        bool on = false;
        while (engine_step(e) > 0)
            if (!on && r->n_out >= 1) {
                perf_ctl("enable\n");
                on = true;
            }
        if (on) perf_ctl("disable\n");
        double tps = r->n_out > 1 ? (double)(r->n_out - 1) / (r->t_last - r->t_first) : 0;
        if (tps > best) best = tps;
        request_free(r);
        (*runs)++;
    }
    td_free(ids);
    return best;
}

typedef struct {
    double tok_s;       /* full decode steps */
    double e2e_tok_s;   /* everything generated / wall */
    size_t full_steps;
    double wall_s;
} BnRun;

static BnRun run_bn(Engine *e, size_t n_prompt, int gen, size_t batch, double *lat, size_t *n_lat)
{
    size_t V = e->m->V;
    int32_t *ids = td_malloc(n_prompt * sizeof(int32_t));
    Request **rs = td_malloc(batch * sizeof(Request *));
    GenParams gp = greedy(gen);
    double t0 = td_now();
    for (size_t j = 0; j < batch; j++) {
        make_prompt(ids, n_prompt, V, j);
        rs[j] = request_new(ids, n_prompt, &gp);
        TD_CHECK(engine_submit(e, rs[j]) == 0, "engine_submit refused batch request %zu", j);
    }
    EngineStats a, b;
    engine_stats(e, &a);
    double full_s = 0;
    size_t full = 0;
    bool on = false;
    for (;;) {
        if (g_ctl >= 0) {   /* profile the steps in which every request decodes */
            bool all = true;
            for (size_t j = 0; j < batch && all; j++)
                all = rs[j]->n_out >= 1 && atomic_load(&rs[j]->state) != REQ_DONE;
            if (all != on) perf_ctl(all ? "enable\n" : "disable\n");
            on = all;
        }
        double s0 = td_now();
        size_t left = engine_step(e);
        double dt = td_now() - s0;
        engine_stats(e, &b);
        if (b.prompt_tokens == a.prompt_tokens && (size_t)(b.tokens_generated - a.tokens_generated) == batch) {
            full_s += dt;
            full++;
            if (lat) lat[(*n_lat)++] = dt;
        }
        a = b;
        if (!left) break;
    }
    if (on) perf_ctl("disable\n");
    double t1 = td_now();
    size_t gen_total = 0;
    for (size_t j = 0; j < batch; j++) {
        gen_total += rs[j]->n_out;
        request_free(rs[j]);
    }
    BnRun out = { full ? (double)(full * batch) / full_s : 0, (double)gen_total / (t1 - t0), full, t1 - t0 };
    td_free(rs);
    td_free(ids);
    return out;
}

/* ---------------------------------------------------------------- accounting */

typedef struct {
    double w_active;       /* weight bytes read per decoded token (batch 1) */
    double w_shared;       /* bytes every token reads whatever its route (all but the experts) */
    double w_expert;       /* bytes of one expert of one MoE layer */
    double w_all;          /* all weight bytes read by a step touching every expert */
    double kv_per_pos;     /* KV bytes per cached position, all layers */
    double prefill_flops;  /* for n_prompt tokens */
    int n_moe, E, k;
} Acct;

static double numel(const Param *p) { return p ? (double)p->numel : 0; }

/* Bytes of p as held: its dtype's element size (int8: + a bf16 scale per
 * 32) for the packed matrices, float32 otherwise. */
static double wb(const Param *p)
{
    if (!p) return 0;
    if (!p->packed) return 4.0 * (double)p->numel;
    return (double)p->numel * ((double)dtype_size(p->dtype) + (p->dtype == DTYPE_INT8 ? 2.0 / DTYPE_Q8_GROUP : 0));
}

static Acct account(const Model *m, size_t T)
{
    Acct a;
    memset(&a, 0, sizeof a);
    double mats_active = 0;   /* matrix params a token multiplies by */
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        const Layer *L = &m->layers[l];
        double attn = numel(L->q) + numel(L->k) + numel(L->v) + numel(L->o);
        double attn_b = wb(L->q) + wb(L->k) + wb(L->v) + wb(L->o), norms_b = wb(L->ln1) + wb(L->ln2);
        double ffn_b = 0;
        mats_active += attn;
        if (L->moe) {
            double ex = (numel(L->egate) + numel(L->eup) + numel(L->edown)) / (double)m->E;
            double ex_b = (wb(L->egate) + wb(L->eup) + wb(L->edown)) / (double)m->E;
            double sh = numel(L->sgate) + numel(L->sup) + numel(L->sdown);
            ffn_b = wb(L->router) + wb(L->sgate) + wb(L->sup) + wb(L->sdown);
            a.w_expert = ex_b;
            mats_active += numel(L->router) + sh + (double)m->k * ex;
            a.w_active += (double)m->k * ex_b;
            a.w_all += (double)m->E * ex_b;
            a.n_moe++;
        } else {
            mats_active += numel(L->gate) + numel(L->up) + numel(L->down);
            ffn_b = wb(L->gate) + wb(L->up) + wb(L->down);
        }
        a.w_shared += attn_b + norms_b + ffn_b;
        /* causal attention of a T-token prompt: QK^T and PV, 2 flops a MAC */
        a.prefill_flops += 4.0 * (double)m->hd * (double)m->H * (double)T * (double)(T + 1) / 2;
    }
    a.w_shared += wb(m->lm_head) + wb(m->norm) + wb(m->embed) / (double)m->V;
    a.w_active += a.w_shared;
    a.w_all += a.w_shared;
    a.kv_per_pos = (double)attn_block_bytes(&m->attn) / (double)m->attn.bs *
                   (double)(m->topo.layer_end - m->topo.layer_begin);
    a.prefill_flops += 2.0 * mats_active * (double)T + 2.0 * numel(m->lm_head);
    a.E = (int)m->E;
    a.k = (int)m->k;
    return a;
}

/* ---------------------------------------------------------------- opening
 *
 * ckpt opened as `tandem serve` would (dtype, kv_dtype: the weights and KV
 * cache held in that dtype; NULL: the defaults) into m, and an engine e
 * over it for batch requests of n_prompt + gen tokens.  0, or the exit
 * code after one line on stderr; *load_s: the seconds the open took. */
static int open_engine(const char *ckpt, const char *dtype, const char *kv_dtype, size_t n_prompt, int gen,
                       size_t batch, Model *m, Engine *e, double *load_s)
{
    char err[512];
    ServeDtypes sd;
    double t0 = td_now();
    if (ckpt_serve_dtypes(&sd, dtype, kv_dtype, err, sizeof err)) {
        fprintf(stderr, "infer: %s\n", err);
        return 2;
    }
    if (ckpt_open_serving(ckpt, m, NULL, &sd, err, sizeof err)) {
        fprintf(stderr, "infer: %s\n", err[0] ? err : "cannot open the checkpoint");
        return 1;
    }
    *load_s = td_now() - t0;
    if (n_prompt + (size_t)gen > (size_t)m->cfg.max_position_embeddings) {
        fprintf(stderr, "infer: prompt + gen exceeds the context (%d)\n", m->cfg.max_position_embeddings);
        return 2;
    }
    EngineOpts eo;
    engine_opts_default(&eo);   /* as tandem serve: 256 MiB of cache, 512 rows a step */
    if (eo.max_running < batch) eo.max_running = batch;
    /* every rep sends the same prompt: without this its second TTFT would
     * time the prefix cache, not the prefill the peers are measured on
     * (bench/prefix.sh measures the cache) */
    eo.prefix_cache = false;
    size_t need = batch * (n_prompt + (size_t)gen + 16) * (attn_block_bytes(&m->attn) / m->attn.bs) *
                  (size_t)(m->topo.layer_end - m->topo.layer_begin);
    if (eo.kv_budget_bytes < need) eo.kv_budget_bytes = need;
    engine_init(e, m, &eo);
    return 0;
}

/* ---------------------------------------------------------------- compare
 *
 * --compare W[:KV],W[:KV],...: the checkpoint loaded once per entry (weights
 * dtype W, KV cache dtype KV, default f32), each in its own engine, then
 * --rounds rounds of one greedy batch-1 request per entry (--prompt,
 * --gen), the entries in a rotating order.  A round's entries run within
 * a second of each other, so a slow spell of a shared host (another
 * tenant, a vCPU stolen) falls on all of them; the ratio of each entry's
 * decode speed (1 / p50 token gap) to the first entry's is taken within
 * each round, and the median over the rounds is what to read. */

#define COMPARE_MAX 8
#define COMPARE_ROUNDS_MAX 256

static int compare_main(const char *ckpt, const char *list, int threads, size_t n_prompt, int gen, int rounds)
{
    char spec[COMPARE_MAX][32];
    int n = 0;
    for (const char *s = list; *s && n < COMPARE_MAX;) {
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof spec[0]) {
            fprintf(stderr, "infer: --compare: bad entry in '%s' (W[:KV],...)\n", list);
            return 2;
        }
        memcpy(spec[n], s, len);
        spec[n++][len] = 0;
        s += len + (s[len] == ',');
    }
    if (n < 2 || rounds < 1 || rounds > COMPARE_ROUNDS_MAX) {
        fprintf(stderr, "infer: --compare needs 2 to %d entries and 1 to %d --rounds\n", COMPARE_MAX,
                COMPARE_ROUNDS_MAX);
        return 2;
    }
    pool_init(threads);
    static Model m[COMPARE_MAX];
    static Engine e[COMPARE_MAX];
    double load_s[COMPARE_MAX];
    Acct ac[COMPARE_MAX];
    for (int i = 0; i < n; i++) {
        char w[32];
        snprintf(w, sizeof w, "%s", spec[i]);
        char *kv = strchr(w, ':');
        if (kv) *kv++ = 0;
        const int rc = open_engine(ckpt, w, kv, n_prompt, gen, 1, &m[i], &e[i], &load_s[i]);
        if (rc) return rc;
        ac[i] = account(&m[i], n_prompt);
        run_b1(&e[i], n_prompt, gen < 16 ? gen : 16, 0, 0, NULL, NULL);   /* warm-up */
        fprintf(stderr, "infer: %s as %s (KV %s) loaded in %.1f s, %.1f MB read per token\n", ckpt,
                dtype_name(m[i].dt.mat), dtype_name(m[i].attn.kv), load_s[i], ac[i].w_active / 1e6);
    }
    static double tok[COMPARE_MAX][COMPARE_ROUNDS_MAX], x[COMPARE_MAX][COMPARE_ROUNDS_MAX];
    double *lat = td_malloc((size_t)gen * sizeof(double));
    for (int r = 0; r < rounds; r++) {
        for (int j = 0; j < n; j++) {
            const int i = (r + j) % n;
            size_t n_lat = 0;
            run_b1(&e[i], n_prompt, gen, 0, 0, lat, &n_lat);
            qsort(lat, n_lat, sizeof(double), cmp_d);
            const double p50 = pct(lat, n_lat, 50);
            tok[i][r] = p50 > 0 ? 1.0 / p50 : 0;
        }
        for (int i = 0; i < n; i++) x[i][r] = tok[0][r] > 0 ? tok[i][r] / tok[0][r] : 0;
        fprintf(stderr, "infer: round %d/%d:", r + 1, rounds);
        for (int i = 0; i < n; i++) fprintf(stderr, " %s %.0f (%.2fx)", spec[i], tok[i][r], x[i][r]);
        fprintf(stderr, "\n");
    }
    printf("{\"bench\":\"infer_compare\",\"ckpt\":\"%s\",\"threads\":%d,\"prompt\":%zu,\"gen\":%d,\"rounds\":%d,"
           "\"entries\":[",
           ckpt, threads, n_prompt, gen, rounds);
    for (int i = 0; i < n; i++) {
        double a[COMPARE_ROUNDS_MAX], b[COMPARE_ROUNDS_MAX];
        memcpy(a, tok[i], (size_t)rounds * sizeof(double));
        memcpy(b, x[i], (size_t)rounds * sizeof(double));
        const double tm = median_of(a, (size_t)rounds), xm = median_of(b, (size_t)rounds);
        printf("%s{\"entry\":\"%s\",\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"weight_bytes\":%zu,\"load_s\":%.2f,"
               "\"w_active_bytes\":%.0f,\"kv_bytes_per_pos\":%.0f,\"b1_tok_s_median\":%.1f,\"x_first_median\":%.3f,"
               "\"x_first_min_max\":[%.3f,%.3f],\"b1_tok_s\":[",
               i ? "," : "", spec[i], dtype_name(m[i].dt.mat), dtype_name(m[i].attn.kv), model_weight_bytes(&m[i]),
               load_s[i], ac[i].w_active, ac[i].kv_per_pos, tm, xm, b[0],
               b[rounds - 1]);
        for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? "," : "", tok[i][r]);
        printf("],\"x_first\":[");
        for (int r = 0; r < rounds; r++) printf("%s%.3f", r ? "," : "", x[i][r]);
        printf("]}");
        fprintf(stderr, "infer: %-10s median %.1f tokens/s, %.3fx %s (rounds %.2f-%.2fx)\n", spec[i], tm, xm, spec[0],
                b[0], b[rounds - 1]);
    }
    printf("]}\n");
    td_free(lat);
    for (int i = 0; i < n; i++) {
        engine_free(&e[i]);
        model_free(&m[i]);
    }
    pool_free();
    return 0;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    const char *ckpt = NULL, *only = "ttft,b1,b16";
    int threads[MAX_THREADS_LIST] = { 2, 1 }, n_threads = 2;
    size_t n_prompt = 256, batch = 16;
    int gen = 128, reps = 3, breps = 1;
    double loop_s = 0;
    bool loop_bn = false;
    const char *perf_fifos = NULL, *dtype = NULL, *kv_dtype = NULL, *compare = NULL;
    int rounds = 15;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ckpt") && v) ckpt = argv[++i];
        else if (!strcmp(a, "--threads") && v) {
            n_threads = 0;
            for (char *s = argv[++i]; *s && n_threads < MAX_THREADS_LIST;) {
                threads[n_threads++] = (int)strtol(s, &s, 10);
                if (*s == ',') s++;
                else if (*s) break;
            }
        } else if (!strcmp(a, "--prompt") && v) n_prompt = (size_t)atol(argv[++i]);
        else if (!strcmp(a, "--gen") && v) gen = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && v) batch = (size_t)atol(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--batch-reps") && v) breps = atoi(argv[++i]);
        else if (!strcmp(a, "--only") && v) only = argv[++i];
        else if (!strcmp(a, "--loop-b1") && v) loop_s = atof(argv[++i]);
        else if (!strcmp(a, "--loop-bn") && v) {
            loop_s = atof(argv[++i]);
            loop_bn = true;
        }
        else if (!strcmp(a, "--perf-ctl") && v) perf_fifos = argv[++i];
        else if (!strcmp(a, "--dtype") && v) dtype = argv[++i];
        else if (!strcmp(a, "--kv-dtype") && v) kv_dtype = argv[++i];
        else if (!strcmp(a, "--compare") && v) compare = argv[++i];
        else if (!strcmp(a, "--rounds") && v) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: infer --ckpt CKPT [--threads 2,1] [--prompt 256] [--gen 128] [--batch 16]\n"
                            "             [--reps 3] [--batch-reps 1] [--only ttft,b1,b16]\n"
                            "             [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8]\n"
                            "             [--loop-b1 | --loop-bn SECONDS [--perf-ctl CTL_FIFO[,ACK_FIFO]]]\n"
                            "             [--compare W[:KV],W[:KV],... [--rounds 15]]\n");
            return 2;
        }
    }
    if (!ckpt || n_prompt < 1 || gen < 2 || batch < 1 || reps < 1 || breps < 1 || n_threads < 1) {
        fprintf(stderr, "infer: --ckpt is required; --prompt >= 1, --gen >= 2, --batch, --reps >= 1\n");
        return 2;
    }
    if (compare) return compare_main(ckpt, compare, threads[0] > 0 ? threads[0] : 1, n_prompt, gen, rounds);
    bool do_b1 = strstr(only, "b1") || strstr(only, "ttft"), do_bn = strstr(only, "b16") != NULL;

    pool_init(threads[0] > 0 ? threads[0] : 1);
    Model m;
    Engine e;
    double tl;
    const int rc = open_engine(ckpt, dtype, kv_dtype, n_prompt, gen, batch, &m, &e, &tl);
    if (rc) return rc;
    Acct ac = account(&m, n_prompt);
    fprintf(stderr, "infer: %s loaded in %.1f s: d %zu, %d layers, E %zu top-%zu, %.1f MB read per token, "
                    "%.1f MB of layer weights\n",
            ckpt, tl, m.d, m.cfg.num_hidden_layers, m.E, m.k, ac.w_active / 1e6, ac.w_all / 1e6);

    if (loop_s > 0) {   /* for perf record: batch-1 decode only */
        if (perf_fifos) {
            char ctl[512], *ack;
            snprintf(ctl, sizeof ctl, "%s", perf_fifos);
            if ((ack = strchr(ctl, ','))) *ack++ = 0;
            g_ctl = open(ctl, O_WRONLY);
            g_ack = ack ? open(ack, O_RDONLY) : -1;
            if (g_ctl < 0 || (ack && g_ack < 0)) {
                fprintf(stderr, "infer: cannot open the perf control fifos %s\n", perf_fifos);
                return 1;
            }
        }
        size_t runs = 0;
        double best = 0, t_end = td_now() + loop_s;
        if (loop_bn) {
            while (td_now() < t_end) {
                BnRun r = run_bn(&e, n_prompt, gen, batch, NULL, NULL);
                if (r.tok_s > best) best = r.tok_s;
                runs++;
            }
        } else {
            best = loop_b1(&e, n_prompt, gen, t_end, &runs);
        }
        fprintf(stderr, "infer: loop-%s %zu runs, best %.1f tokens/s (%d threads)\n", loop_bn ? "bn" : "b1", runs,
                best, pool_threads());
        engine_free(&e);
        model_free(&m);
        pool_free();
        return 0;
    }

    size_t cap_lat = (size_t)reps * (size_t)gen + (size_t)breps * ((size_t)gen + batch) + 16;
    double *lat = td_malloc(cap_lat * sizeof(double));
    double *vals = td_malloc(((size_t)reps + (size_t)breps + 1) * sizeof(double));
    char *json = td_malloc(1 << 16);
    size_t jn = 0, jcap = 1 << 16;
#define J(...) (jn += (size_t)snprintf(json + jn, jn < jcap ? jcap - jn : 0, __VA_ARGS__))
    J("{\"bench\":\"infer\",\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"weight_bytes\":%zu,\"ckpt\":\"%s\",\"d\":%zu,\"layers\":%d,\"E\":%zu,\"k\":%zu,\"V\":%zu,"
      "\"prompt\":%zu,\"gen\":%d,\"batch\":%zu,\"reps\":%d,\"batch_reps\":%d,\"load_s\":%.2f,"
      "\"acct\":{\"w_active_bytes\":%.0f,\"w_shared_bytes\":%.0f,\"w_expert_bytes\":%.0f,\"w_all_bytes\":%.0f,"
      "\"kv_bytes_per_pos\":%.0f,\"n_moe\":%d,\"prefill_flops\":%.0f},\"runs\":[",
      dtype_name(m.dt.mat), dtype_name(m.attn.kv), model_weight_bytes(&m), ckpt, m.d, m.cfg.num_hidden_layers, m.E, m.k, m.V, n_prompt, gen, batch, reps, breps, tl, ac.w_active,
      ac.w_shared, ac.w_expert, ac.w_all, ac.kv_per_pos, ac.n_moe, ac.prefill_flops);
    for (int ti = 0; ti < n_threads; ti++) {
        int nt = threads[ti] > 0 ? threads[ti] : 1;
        pool_init(nt);
        J("%s{\"threads\":%d", ti ? "," : "", nt);
        if (do_b1) {
            run_b1(&e, n_prompt, gen < 16 ? gen : 16, 0, 0, NULL, NULL);   /* warm-up (the cache's pages, the code) */
            /* greedy (as the peers), then sampled at temperature 1: a greedy
             * decode of a barely trained model repeats one token, so its
             * experts hardly change from step to step and stay in cache */
            for (int mode = 0; mode < 2; mode++) {
                const char *key = mode ? "b1s" : "b1";
                size_t n_lat = 0;
                double ttft[64], tps[64], chg = 0, dist = 0;
                B1Run r = { 0 };
                int nr = reps < 64 ? reps : 64;
                for (int k = 0; k < nr; k++) {
                    r = run_b1(&e, n_prompt, gen, mode ? 1.0 : 0.0, 1000 + (uint64_t)k, lat, &n_lat);
                    ttft[k] = r.ttft_ms;
                    tps[k] = r.tok_s;
                    chg += r.route_change / nr;
                    dist += r.route_distinct / nr;
                }
                qsort(ttft, (size_t)nr, sizeof(double), cmp_d);
                qsort(tps, (size_t)nr, sizeof(double), cmp_d);
                qsort(lat, n_lat, sizeof(double), cmp_d);
                double p50 = pct(lat, n_lat, 50);
                fprintf(stderr, "infer: %d threads: %s%.2f ms (best %.2f), batch 1%s %.1f tokens/s (best %.1f, "
                                "from p50 latency %.1f), experts change at %.0f%% of steps, %.1f of %zu used\n",
                        nt, mode ? "" : "ttft ", ttft[nr / 2], ttft[0], mode ? " sampled" : "", tps[nr / 2],
                        tps[nr - 1], p50 > 0 ? 1.0 / p50 : 0, 100 * chg, dist, m.E);
                if (!mode) J(",\"ttft_ms\":%.3f,\"ttft_ms_best\":%.3f", ttft[nr / 2], ttft[0]);
                J(",\"%s_tok_s\":%.1f,\"%s_tok_s_best\":%.1f,\"%s_tok_s_from_p50\":%.1f,"
                  "\"%s_lat_ms_p10_p50_p90_p99\":[%.4f,%.4f,%.4f,%.4f],\"%s_route_change\":%.3f,"
                  "\"%s_route_distinct\":%.2f",
                  key, tps[nr / 2], key, tps[nr - 1], key, p50 > 0 ? 1.0 / p50 : 0, key, 1e3 * pct(lat, n_lat, 10),
                  1e3 * p50, 1e3 * pct(lat, n_lat, 90), 1e3 * pct(lat, n_lat, 99), key, chg, key, dist);
                if (!mode) {
                    J(",\"greedy_first16\":[");
                    for (size_t i = 0; i < r.n_first; i++) J("%s%d", i ? "," : "", r.first[i]);
                    J("]");
                }
            }
        }
        if (do_bn) {
            run_bn(&e, n_prompt, gen < 16 ? gen : 16, batch, NULL, NULL);   /* warm-up */
            size_t n_lat = 0;
            double e2e = 0, wall = 0;
            int nb = breps < 64 ? breps : 64;
            for (int k = 0; k < nb; k++) {
                BnRun r = run_bn(&e, n_prompt, gen, batch, lat, &n_lat);
                vals[k] = r.tok_s;
                if (r.e2e_tok_s > e2e) e2e = r.e2e_tok_s;
                wall = r.wall_s;
            }
            double tps = median_of(vals, (size_t)nb);
            qsort(lat, n_lat, sizeof(double), cmp_d);
            fprintf(stderr, "infer: %d threads: batch %zu %.1f tokens/s aggregate (%zu full steps, step p50 %.2f ms), "
                            "end to end %.1f tokens/s\n",
                    nt, batch, tps, n_lat, 1e3 * pct(lat, n_lat, 50), e2e);
            J(",\"bn_tok_s\":%.1f,\"bn_e2e_tok_s\":%.1f,\"bn_wall_s\":%.3f,\"bn_full_steps\":%zu,"
              "\"bn_step_ms_p10_p50_p90_p99\":[%.4f,%.4f,%.4f,%.4f]",
              tps, e2e, wall, n_lat, 1e3 * pct(lat, n_lat, 10), 1e3 * pct(lat, n_lat, 50),
              1e3 * pct(lat, n_lat, 90), 1e3 * pct(lat, n_lat, 99));
        }
        J("}");
    }
    J("]}");
    printf("%s\n", json);
    td_free(json);
    td_free(vals);
    td_free(lat);
    engine_free(&e);
    model_free(&m);
    pool_free();
    return 0;
}

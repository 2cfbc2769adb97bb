/* infer/server/server_metrics.c - counters and histograms of `tandem serve` in the
 * Prometheus text format (server_metrics.h). */
#include "infer/server/server_metrics.h"
#include "core/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Upper bounds of the buckets (the last is +Inf): latencies in seconds,
 * and token counts (powers of 4 up to 65536, then +Inf; the slots past
 * them stay empty and are not rendered). */
static const double g_bounds[METRICS_N_BUCKETS - 1] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                        0.25,  0.5,    1.0,   2.5,  5.0,   10.0 };
static const double g_tok_bounds[] = { 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536 };
#define N_TOK_BOUNDS ((int)(sizeof g_tok_bounds / sizeof g_tok_bounds[0]))

void metrics_init(Metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->d.start = td_now();
}

void metrics_free(Metrics *m)
{
    if (!m->d.start) return;
    td_free(m->d.expert_tok);
    td_free(m->d.expert_layer);
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof *m);
}

static void observe_in(Histogram *h, double x, const double *bounds, int n_bounds)
{
    int b = 0;
    while (b < n_bounds && x > bounds[b]) b++;
    h->count[b]++;
    h->sum += x;
    h->n++;
}

static void observe(Histogram *h, double x) { observe_in(h, x, g_bounds, METRICS_N_BUCKETS - 1); }

void metrics_queue_wait(Metrics *m, double seconds)
{
    pthread_mutex_lock(&m->mu);
    observe(&m->d.qwait, seconds);
    pthread_mutex_unlock(&m->mu);
}

void metrics_lengths(Metrics *m, size_t prompt_tokens, size_t generation_tokens)
{
    pthread_mutex_lock(&m->mu);
    observe_in(&m->d.prompt_tok, (double)prompt_tokens, g_tok_bounds, N_TOK_BOUNDS);
    observe_in(&m->d.gen_tok, (double)generation_tokens, g_tok_bounds, N_TOK_BOUNDS);
    pthread_mutex_unlock(&m->mu);
}

void metrics_experts(Metrics *m, const int64_t *counts, const int *layers, int n_moe, size_t n_experts)
{
    if (!counts || n_moe <= 0 || !n_experts) return;
    size_t n = (size_t)n_moe * n_experts;
    pthread_mutex_lock(&m->mu);
    MetricsData *d = &m->d;
    if (!d->expert_tok) {   /* the shape is the engine's, fixed for its life */
        d->expert_tok = td_malloc(n * sizeof(int64_t));
        d->expert_layer = td_malloc((size_t)n_moe * sizeof(int));
        memcpy(d->expert_layer, layers, (size_t)n_moe * sizeof(int));
        d->n_moe = n_moe;
        d->n_experts = n_experts;
    }
    memcpy(d->expert_tok, counts, n * sizeof(int64_t));
    pthread_mutex_unlock(&m->mu);
}

void metrics_ttft(Metrics *m, double seconds)
{
    pthread_mutex_lock(&m->mu);
    observe(&m->d.ttft, seconds);
    pthread_mutex_unlock(&m->mu);
}

void metrics_itl(Metrics *m, double seconds)
{
    pthread_mutex_lock(&m->mu);
    observe(&m->d.itl, seconds);
    pthread_mutex_unlock(&m->mu);
}

static const char *const g_reasons[4] = { "length", "stop", "cancelled", "error" };

void metrics_finished(Metrics *m, const char *finish_reason)
{
    int i = 0;
    while (i < 3 && strcmp(g_reasons[i], finish_reason)) i++;
    pthread_mutex_lock(&m->mu);
    m->d.finished[i]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_http(Metrics *m, int status)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    MetricsData *d = &m->d;
    while (i < METRICS_N_CODES && d->codes[i] && d->codes[i] != status) i++;
    if (i == METRICS_N_CODES) i--;   /* table full: the last slot takes the latest new code */
    d->codes[i] = status;
    d->code_count[i]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_reload(Metrics *m, bool ok, double pause, int64_t weights_step)
{
    pthread_mutex_lock(&m->mu);
    m->d.reloads[ok ? 0 : 1]++;
    m->d.reload_pause_last = pause;
    m->d.reload_pause_sum += pause;
    m->d.weights_step = weights_step;
    pthread_mutex_unlock(&m->mu);
}

void metrics_engine(Metrics *m, const EngineStats *st)
{
    double now = td_now();
    pthread_mutex_lock(&m->mu);
    MetricsData *d = &m->d;
    d->st = *st;
    int last = (d->rate_head + METRICS_RATE_WINDOW - 1) % METRICS_RATE_WINDOW;
    if (!d->rate_n || now - d->rate_t[last] >= 1.0) {
        d->rate_t[d->rate_head] = now;
        d->rate_tok[d->rate_head] = st->tokens_generated;
        d->rate_head = (d->rate_head + 1) % METRICS_RATE_WINDOW;
        if (d->rate_n < METRICS_RATE_WINDOW) d->rate_n++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* Rate from the oldest sample in the window to the
 * latest snapshot. */
static double rate_of(const MetricsData *d)
{
    if (!d->rate_n) return 0.0;
    int oldest = (d->rate_head + METRICS_RATE_WINDOW - d->rate_n) % METRICS_RATE_WINDOW;
    double dt = td_now() - d->rate_t[oldest];
    return dt > 0.5 ? (double)(d->st.tokens_generated - d->rate_tok[oldest]) / dt : 0.0;
}

void metrics_prepare(Metrics *m, bool chat, double seconds)
{
    pthread_mutex_lock(&m->mu);
    m->d.prep_sum[chat] += seconds;
    m->d.prep_n[chat]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_request(Metrics *m, bool chat, double seconds)
{
    pthread_mutex_lock(&m->mu);
    m->d.req_sum[chat] += seconds;
    m->d.req_n[chat]++;
    pthread_mutex_unlock(&m->mu);
}

/* ------------------------------------------------------------------ render */

typedef struct {
    char *s;
    size_t len, cap;
} Buf;

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = 2 * b->cap + (n > 0 ? (size_t)n : 0);
        char *s = td_malloc(cap);
        memcpy(s, b->s, b->len);
        td_free(b->s);
        b->s = s;
        b->cap = cap;
    }
}

static void header(Buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histogram_in(Buf *b, const char *name, const char *help, const Histogram *h, const double *bounds,
                         int n_bounds)
{
    header(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= n_bounds; i++) {
        cum += h->count[i];
        if (i < n_bounds) put(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
        else put(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    put(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

static void histogram(Buf *b, const char *name, const char *help, const Histogram *h)
{
    histogram_in(b, name, help, h, g_bounds, METRICS_N_BUCKETS - 1);
}

static void gauge(Buf *b, const char *name, const char *type, const char *help, double v)
{
    header(b, name, type, help);
    put(b, "%s %.17g\n", name, v);
}

char *metrics_render(Metrics *m, size_t *len)
{
    pthread_mutex_lock(&m->mu);
    MetricsData c = m->d;   /* a consistent copy; format without the lock */
    size_t n_ex = (size_t)c.n_moe * c.n_experts;
    int64_t *ex = NULL;
    if (n_ex) {
        ex = td_malloc(n_ex * sizeof(int64_t));
        memcpy(ex, m->d.expert_tok, n_ex * sizeof(int64_t));
    }
    pthread_mutex_unlock(&m->mu);
    Buf b = { td_malloc(8192), 0, 8192 };
    histogram(&b, "tandem_time_to_first_token_seconds", "Time from submission to the first generated token.",
              &c.ttft);
    histogram(&b, "tandem_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.",
              &c.itl);
    histogram(&b, "tandem_queue_wait_seconds",
              "Time from submission to the first scheduling of a choice (admission into the running batch).",
              &c.qwait);
    histogram_in(&b, "tandem_request_prompt_tokens", "Prompt tokens of each finished choice.", &c.prompt_tok,
                 g_tok_bounds, N_TOK_BOUNDS);
    histogram_in(&b, "tandem_request_generation_tokens",
                 "Tokens generated for each finished choice (its completion_tokens).", &c.gen_tok, g_tok_bounds,
                 N_TOK_BOUNDS);
    gauge(&b, "tandem_generation_tokens_total", "counter", "Tokens generated.", (double)c.st.tokens_generated);
    gauge(&b, "tandem_prompt_tokens_total", "counter", "Prompt tokens prefilled (recomputation included).",
          (double)c.st.prompt_tokens);
    header(&b, "tandem_requests_total", "counter", "Finished generations (one per choice) by finish reason.");
    for (int i = 0; i < 4; i++)
        put(&b, "tandem_requests_total{finish_reason=\"%s\"} %llu\n", g_reasons[i],
            (unsigned long long)c.finished[i]);
    header(&b, "tandem_http_responses_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i < METRICS_N_CODES && c.codes[i]; i++)
        put(&b, "tandem_http_responses_total{code=\"%d\"} %llu\n", c.codes[i], (unsigned long long)c.code_count[i]);
    gauge(&b, "tandem_requests_running", "gauge", "Generations in the running batch.", (double)c.st.running);
    gauge(&b, "tandem_requests_waiting", "gauge", "Generations queued for admission.", (double)c.st.waiting);
    gauge(&b, "tandem_kv_blocks_used", "gauge", "KV-cache blocks in use.", (double)c.st.kv_used);
    gauge(&b, "tandem_kv_blocks_free", "gauge", "KV-cache blocks free (tandem_kv_blocks_cached of them hold a cached prefix).", (double)(c.st.kv_total - c.st.kv_used));
    gauge(&b, "tandem_kv_blocks_total", "gauge", "KV-cache blocks in the pool.", (double)c.st.kv_total);
    gauge(&b, "tandem_kv_occupancy_ratio", "gauge",
          "tandem_kv_blocks_used / tandem_kv_blocks_total: the share of the pool held by requests (cached-only "
          "blocks are free to them and not counted).",
          c.st.kv_total ? (double)c.st.kv_used / (double)c.st.kv_total : 0.0);
    gauge(&b, "tandem_prefix_cache_blocks", "gauge",
          "KV-cache blocks registered in the prefix cache, held by requests or only cached.",
          (double)c.st.prefix_blocks);
    gauge(&b, "tandem_kv_blocks_cached", "gauge",
          "Free KV-cache blocks that still hold a cached prefix (evicted least recently used first).",
          (double)c.st.kv_cached);
    gauge(&b, "tandem_prefix_cache_query_tokens_total", "counter",
          "Tokens looked up in the prefix cache (each admitted prompt; a resumed request's prompt and output).",
          (double)c.st.prefix_query_tokens);
    gauge(&b, "tandem_prefix_cache_hit_tokens_total", "counter",
          "Of those, tokens whose keys and values were found cached instead of computed.",
          (double)c.st.prefix_hit_tokens);
    gauge(&b, "tandem_prefix_cache_hit_rate", "gauge", "hit_tokens_total / query_tokens_total (0 before any query).",
          c.st.prefix_query_tokens ? (double)c.st.prefix_hit_tokens / (double)c.st.prefix_query_tokens : 0.0);
    gauge(&b, "tandem_kv_bytes_per_token", "gauge", "Bytes one cached token takes (all layers, the KV dtype's).",
          (double)c.st.kv_token_bytes);
    gauge(&b, "tandem_weight_bytes", "gauge", "Bytes of the weights as held (their serving dtype).",
          (double)c.st.weight_bytes);
    if (c.st.expert_slots) {
        const ExpertCacheStats *x = &c.st.experts;
        gauge(&b, "tandem_expert_cache_slots", "gauge", "Routed-expert cache slots per MoE layer (--expert-cache-mb).",
              (double)c.st.expert_slots);
        gauge(&b, "tandem_expert_cache_bytes", "gauge", "Bytes of the routed-expert cache's slots.",
              (double)c.st.expert_cache_bytes);
        gauge(&b, "tandem_expert_cache_hits_total", "counter", "Expert lookups of the forward found cached.",
              (double)x->hits);
        gauge(&b, "tandem_expert_cache_misses_total", "counter", "Expert lookups that loaded the expert.",
              (double)x->misses);
        gauge(&b, "tandem_expert_cache_loaded_bytes_total", "counter", "Packed expert bytes loaded into the cache.",
              (double)x->bytes_loaded);
        gauge(&b, "tandem_expert_cache_load_errors_total", "counter", "Expert loads that failed (their requests ended).",
              (double)x->load_errors);
        gauge(&b, "tandem_expert_cache_stall_seconds_total", "counter",
              "Seconds the forward waited for expert loads.", x->load_s);
    }
    gauge(&b, "tandem_mem_peak_bytes", "gauge",
          "Peak bytes this process (rank 0) allocated through tandem's allocator (td_mem_peak).",
          (double)td_mem_peak());
    gauge(&b, "tandem_tokens_per_second", "gauge", "Generated tokens per second over the last 10 seconds.",
          rate_of(&c));
    gauge(&b, "tandem_preemptions_total", "counter", "Requests preempted for cache space (and recomputed).",
          (double)c.st.preemptions);
    gauge(&b, "tandem_engine_steps_total", "counter", "Engine steps (batched forwards).", (double)c.st.steps);
    gauge(&b, "tandem_recomputed_tokens_total", "counter",
          "Generated tokens computed again after a preemption (the prompt's part is in tandem_prompt_tokens_total).",
          (double)c.st.recomputed_tokens);
    if (n_ex) {
        header(&b, "tandem_expert_tokens_total", "counter",
               "Tokens the router sent to each expert of each MoE layer (top_k per computed token per layer).");
        for (int l = 0; l < c.n_moe; l++)
            for (size_t x = 0; x < c.n_experts; x++)
                put(&b, "tandem_expert_tokens_total{layer=\"%d\",expert=\"%zu\"} %lld\n", c.expert_layer[l], x,
                    (long long)ex[(size_t)l * c.n_experts + x]);
    }
    td_free(ex);
    gauge(&b, "tandem_weights_step", "gauge", "Training step of the weights being served.", (double)c.weights_step);
    header(&b, "tandem_weight_reloads_total", "counter", "Weight reloads by result.");
    put(&b, "tandem_weight_reloads_total{result=\"ok\"} %llu\ntandem_weight_reloads_total{result=\"failed\"} %llu\n",
        (unsigned long long)c.reloads[0], (unsigned long long)c.reloads[1]);
    gauge(&b, "tandem_weight_reload_pause_seconds", "gauge",
          "Seconds the last reload held admission (running requests finishing, then the load).", c.reload_pause_last);
    gauge(&b, "tandem_weight_reload_pause_seconds_sum", "counter", "Seconds all reloads held admission.",
          c.reload_pause_sum);
    gauge(&b, "tandem_uptime_seconds", "gauge", "Seconds since the server started.", td_now() - c.start);
    static const char *const ep[2] = { "completions", "chat" };
    header(&b, "tandem_request_prepare_seconds", "summary",
           "Parsing, chat template and tokenization of a request before the engine.");
    for (int i = 0; i < 2; i++)
        put(&b, "tandem_request_prepare_seconds_sum{endpoint=\"%s\"} %.9g\n"
                "tandem_request_prepare_seconds_count{endpoint=\"%s\"} %llu\n",
            ep[i], c.prep_sum[i], ep[i], (unsigned long long)c.prep_n[i]);
    header(&b, "tandem_request_seconds", "summary", "Completed requests, from the body to the last byte sent.");
    for (int i = 0; i < 2; i++)
        put(&b, "tandem_request_seconds_sum{endpoint=\"%s\"} %.9g\ntandem_request_seconds_count{endpoint=\"%s\"} %llu\n",
            ep[i], c.req_sum[i], ep[i], (unsigned long long)c.req_n[i]);
    *len = b.len;
    return b.s;
}

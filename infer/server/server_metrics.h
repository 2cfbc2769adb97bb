/* infer/server/server_metrics.h - the counters and latency histograms of
 * `tandem serve`, rendered in the Prometheus text format 0.0.4
 * (prometheus.io/docs/instrumenting/exposition_formats).
 *
 * Writers: the engine thread (token timings, engine snapshots, finished
 * requests) and the HTTP threads (responses by status).  Readers: GET
 * /metrics.  Every access takes the one mutex; each is a few adds.
 */
#ifndef TANDEM_INFER_SERVER_SERVER_METRICS_H
#define TANDEM_INFER_SERVER_SERVER_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer/engine.h"

#define METRICS_N_BUCKETS 14   /* seconds: 1 ms .. 10 s, then +Inf; tokens: 1, 4, .. 65536, then +Inf */
#define METRICS_N_CODES 10
#define METRICS_RATE_WINDOW 11 /* one-second samples: the rate spans up to 10 s */

typedef struct {
    uint64_t count[METRICS_N_BUCKETS];   /* per bucket (not cumulative); the last is +Inf */
    double sum;
    uint64_t n;
} Histogram;

typedef struct {
    Histogram ttft, itl, qwait;           /* seconds */
    Histogram prompt_tok, gen_tok;        /* tokens per finished choice */
    /* tokens routed to each expert, (n_moe, n_experts), and the model
     * layer of each row: the engine's counters as of its last step */
    int64_t *expert_tok;
    int *expert_layer;
    int n_moe;
    size_t n_experts;
    uint64_t finished[4];                 /* length, stop, cancelled, error (anything else) */
    int codes[METRICS_N_CODES];           /* HTTP status codes seen ... */
    uint64_t code_count[METRICS_N_CODES]; /* ... and how often */
    EngineStats st;                       /* last snapshot from the engine thread */
    double rate_t[METRICS_RATE_WINDOW];   /* (time, tokens generated) ring for tokens/s */
    long rate_tok[METRICS_RATE_WINDOW];
    int rate_n, rate_head;
    double start;                         /* td_now() at init */
    /* [0] completions, [1] chat: parsing + chat template + tokenization
     * before the engine, and the whole request (body to last byte) */
    double prep_sum[2], req_sum[2];
    uint64_t prep_n[2], req_n[2];
    /* weight reloads: done and failed, the last one's admission pause */
    int64_t weights_step;
    uint64_t reloads[2];
    double reload_pause_last, reload_pause_sum;
} MetricsData;

typedef struct {
    pthread_mutex_t mu;
    MetricsData d;                        /* guarded by mu */
} Metrics;

void metrics_init(Metrics *m);
void metrics_free(Metrics *m);
/* One request's first token (seconds after submission) / one inter-token gap. */
void metrics_ttft(Metrics *m, double seconds);
void metrics_itl(Metrics *m, double seconds);
/* One choice was first scheduled seconds after its submission. */
void metrics_queue_wait(Metrics *m, double seconds);
/* A choice finished with prompt_tokens in its prompt and generation_tokens
 * generated (the completion_tokens it reports). */
void metrics_lengths(Metrics *m, size_t prompt_tokens, size_t generation_tokens);
/* Engine thread, after each step: the tokens routed to each expert,
 * counts (n_moe, n_experts) with layers (n_moe) their model layers
 * (engine_expert_tokens); copied. */
void metrics_experts(Metrics *m, const int64_t *counts, const int *layers, int n_moe, size_t n_experts);
/* A choice finished with the engine's finish_reason. */
void metrics_finished(Metrics *m, const char *finish_reason);
/* A request's preparation (parse, chat template, tokenize) took seconds;
 * a request that completed took seconds from its body to its last byte. */
void metrics_prepare(Metrics *m, bool chat, double seconds);
void metrics_request(Metrics *m, bool chat, double seconds);
/* An HTTP response was queued with this status. */
void metrics_http(Metrics *m, int status);
/* Engine thread, after each step: the engine's counters and gauges. */
void metrics_engine(Metrics *m, const EngineStats *st);
/* A weight reload ended (ok or not) after holding admission for pause seconds. */
void metrics_reload(Metrics *m, bool ok, double pause, int64_t weights_step);
/* The exposition text (td_malloc'd, NUL-terminated; *len its length). */
char *metrics_render(Metrics *m, size_t *len);

#endif

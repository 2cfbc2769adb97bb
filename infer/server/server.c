/* infer/server/server.c - `tandem serve` over libmicrohttpd (server.h): routing,
 * request bodies, completions and chat completions (whole or streamed as
 * server-sent events), /tokenize and /detokenize, the engine loop and
 * draining.  The only file that includes <microhttpd.h>.
 */
#include "infer/server/server.h"
#include "core/common.h"
#include "core/model/vision.h"
#include "infer/server/server_api.h"
#include "infer/server/server_metrics.h"

#include <microhttpd.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Bodies declared (Content-Length) above this many times --max-body are
 * refused before they are read; smaller excess is read and dropped, so the
 * client sees the 400 instead of a reset connection. */
#define SERVER_BODY_DISCARD_FACTOR 16
/* seconds POST /v1/admin/reload waits for the swap (running requests finish first) */
#define SERVER_RELOAD_WAIT 600.0
#define SERVER_POLL_MS 25    /* how often a waiting handler checks for a hang-up */

typedef struct Completion Completion;

/* One choice: one engine request and what the engine callback copied out
 * of it (under c->mu; entries [0, n) never change once written). */
typedef struct {
    Completion *c;
    Request *r;              /* owned; NULL if never submitted */
    uint64_t seed;
    _Atomic int64_t weights_step; /* of the weights it was admitted under (-1: not yet) */
    int32_t *ids;            /* (cap) owned */
    float *logp;             /* (cap) owned */
    Sampled *top;            /* (cap) owned, only when logprobs were asked */
    size_t *off;             /* (cap) owned: where each token's text begins */
    size_t n, cap;
    char *text;              /* (text_cap) owned: the engine's text of the tokens */
    size_t text_len, text_cap;
    size_t n_safe, text_safe;/* what no stop string can take back (Request.n_safe, .text_safe) */
    bool done;
    char finish[16];
    double t_submit, t_first, t_last;
    bool queue_seen;                   /* its queue wait observed (engine thread) */
    /* stream progress and the copy of what a chunk sends: the HTTP thread
     * only (the copy is taken under c->mu: the engine may reallocate text) */
    size_t sent, sent_bytes;
    bool role_sent, final_sent;
    int32_t *s_ids;          /* (cap) */
    float *s_logp;           /* (cap) */
    Sampled *s_top;          /* (cap) when logprobs were asked */
    size_t *s_off;           /* (cap) */
    char *s_text;
    size_t s_text_cap;
} Choice;

struct Completion {
    Server *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* signalled by the engine callback */
    int refs;                /* HTTP side + choices still in the engine (mu) */
    int n_choices, n_submitted, n_done;
    uint64_t version;        /* bumped on every callback (mu) */
    Choice *ch;              /* (n_choices) owned */
    ApiCompletion q;
    char id[48];
    long created;
    double t_body;           /* the body was complete (td_now) */
    int fd;                  /* the client's socket, polled for hang-ups */
    /* stream output: bytes of SSE events not yet handed to MHD */
    char *out;
    size_t out_len, out_off, out_cap;
    bool done_queued;        /* "data: [DONE]" is in out */
    double last_out;         /* when the stream last handed MHD bytes */
    Completion *prev, *next; /* the server's live list (s->mu) */
    Completion *grave_next;  /* the server's graveyard (s->mu) */
};

struct Server {
    Engine *e;               /* borrowed */
    ServerOpts o;
    ApiLimits lim;
    ChatTemplate *chat;      /* owned: the tokenizer's chat template, NULL when unusable ... */
    char chat_error[600];    /* ... and why (lim.chat_error) */
    char *model;              /* owned copy of the model name */
    long started;
    struct MHD_Daemon *d;
    int port;
    Metrics m;
    pthread_mutex_t mu;      /* live list, graveyard */
    Completion *live, *grave;
    int n_live;
    atomic_bool draining, stopping;
    atomic_bool log_on;      /* libmicrohttpd's messages are printed */
    atomic_uint_fast64_t counter;
    double keepalive;        /* seconds of stream silence before a comment line */
    uint32_t salt;           /* random part of completion ids */
    /* weight reload: rl_* guarded by rl_mu; the engine thread runs it */
    _Atomic int64_t weights_step;
    pthread_mutex_t rl_mu;
    pthread_cond_t rl_cv;
    int rl_state;            /* RL_IDLE, RL_ASKED, RL_HELD, RL_DONE (an admin request's answer is ready) */
    bool rl_admin;           /* asked by POST /v1/admin/reload (else by --follow) */
    char rl_file[2 * PATH_MAX + 2];
    int rl_rc;               /* the reload's result */
    char rl_msg[600];
    double rl_t0, rl_pause;  /* hold start; seconds admission was held */
    uint64_t rl_version;     /* the engine's weights version (prefix cache) */
    char follow_seen[PATH_MAX];
    double follow_next;      /* td_now() of the next look at latest */
};

enum { RL_IDLE, RL_ASKED, RL_HELD, RL_DONE };

static bool follow_target(const char *dir, char *out, size_t n);

/* Upload state of one HTTP request (MHD's con_cls). */
typedef struct {
    char *body;
    size_t len, cap;
    bool too_big;
} Upload;

void server_opts_default(ServerOpts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->max_body = (size_t)1 << 20;
    o->max_n = 16;
    o->max_connections = 512;
    o->idle_timeout = 60;
    o->drain_timeout = 30.0;
    o->model_name = "tandem";
}

int server_port(const Server *s) { return s->port; }
const char *server_chat_error(const Server *s) { return s->chat ? NULL : s->chat_error; }

static uint64_t random_u64(void)
{
    uint64_t x;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
        /* splitmix64 of the clock: not secret, only distinct */
        x = (uint64_t)(td_now() * 1e9) + 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
    }
    return x;
}

/* Deadline SERVER_POLL_MS from now on the condition variables' clock. */
static struct timespec poll_deadline(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += SERVER_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Has the client closed its end?  (A half-closed client counts as gone.) */
static bool client_gone(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ------------------------------------------------------------- completions */

static Completion *completion_new(Server *s, ApiCompletion *q, int fd, double t_body)
{
    Completion *c = td_calloc(sizeof *c);
    c->s = s;
    c->q = *q;   /* takes ownership of the prompts */
    memset(q, 0, sizeof *q);
    c->refs = 1;
    c->fd = fd;
    c->t_body = t_body;
    c->created = (long)time(NULL);
    snprintf(c->id, sizeof c->id, "%s-%08x%016llx", c->q.kind == API_CHAT ? "chatcmpl" : "cmpl", s->salt,
             (unsigned long long)atomic_fetch_add(&s->counter, 1));
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->n_choices = c->q.n * c->q.n_prompts;
    c->ch = td_calloc((size_t)c->n_choices * sizeof(Choice));
    for (int k = 0; k < c->n_choices; k++) {
        Choice *ch = &c->ch[k];
        ch->c = c;
        ch->cap = (size_t)c->q.gp.max_tokens;   /* the engine never returns more */
        ch->ids = td_malloc(ch->cap * sizeof(int32_t));
        ch->logp = td_malloc(ch->cap * sizeof(float));
        ch->off = td_malloc(ch->cap * sizeof(size_t));
        if (c->q.gp.n_top > 0) ch->top = td_malloc(ch->cap * sizeof(Sampled));
        if (c->q.stream) {
            ch->s_ids = td_malloc(ch->cap * sizeof(int32_t));
            ch->s_logp = td_malloc(ch->cap * sizeof(float));
            ch->s_off = td_malloc(ch->cap * sizeof(size_t));
            if (c->q.gp.n_top > 0) ch->s_top = td_malloc(ch->cap * sizeof(Sampled));
        }
    }
    pthread_mutex_lock(&s->mu);
    c->next = s->live;
    if (s->live) s->live->prev = c;
    s->live = c;
    s->n_live++;
    pthread_mutex_unlock(&s->mu);
    return c;
}

static void completion_free(Completion *c)
{
    Server *s = c->s;
    pthread_mutex_lock(&s->mu);
    if (c->prev) c->prev->next = c->next;
    else s->live = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_live--;
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < c->n_choices; k++) {
        request_free(c->ch[k].r);
        td_free(c->ch[k].ids);
        td_free(c->ch[k].logp);
        td_free(c->ch[k].top);
        td_free(c->ch[k].off);
        td_free(c->ch[k].text);
        td_free(c->ch[k].s_ids);
        td_free(c->ch[k].s_logp);
        td_free(c->ch[k].s_top);
        td_free(c->ch[k].s_off);
        td_free(c->ch[k].s_text);
    }
    td_free(c->ch);
    td_free(c->out);
    api_completion_free(&c->q);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    td_free(c);
}

/* Drops one reference.  The engine thread never frees inside its callback
 * (the engine is still in engine_step): the last engine reference moves the
 * completion to the graveyard, which server_run empties after the step. */
static void completion_release(Completion *c, bool engine_side)
{
    pthread_mutex_lock(&c->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (!last) return;
    if (!engine_side) {
        completion_free(c);
        return;
    }
    Server *s = c->s;
    pthread_mutex_lock(&s->mu);
    c->grave_next = s->grave;
    s->grave = c;
    pthread_mutex_unlock(&s->mu);
}

/* Engine thread. */
static void free_graveyard(Server *s)
{
    pthread_mutex_lock(&s->mu);
    Completion *g = s->grave;
    s->grave = NULL;
    pthread_mutex_unlock(&s->mu);
    while (g) {
        Completion *next = g->grave_next;
        completion_free(g);
        g = next;
    }
}

/* Cancels every choice still in the engine.  Caller holds a reference. */
static void completion_cancel(Completion *c)
{
    pthread_mutex_lock(&c->mu);
    for (int k = 0; k < c->n_choices; k++)
        if (c->ch[k].r && !c->ch[k].done) engine_cancel(c->ch[k].r);
    pthread_mutex_unlock(&c->mu);
}

/* The engine callback (engine thread): copy the new tokens, record
 * latencies, wake the HTTP thread.  Never blocks beyond c->mu, which the
 * HTTP side only holds for a few loads. */
static void on_token(Request *r, bool done, void *user)
{
    Choice *ch = user;
    Completion *c = ch->c;
    Server *s = c->s;
    double ttft = -1, gap = -1, qwait = -1;
    if (r->t_admit > 0 && !ch->queue_seen) {   /* the first callback after its admission */
        ch->queue_seen = true;
        qwait = r->t_admit - r->t_submit;
    }
    /* the weights it runs under: fixed from admission to its end (a reload
     * waits for every admitted request) */
    if (atomic_load(&ch->weights_step) < 0) atomic_store(&ch->weights_step, atomic_load(&s->weights_step));
    pthread_mutex_lock(&c->mu);
    size_t n = td_min(r->n_out, ch->cap);
    for (size_t i = done ? 0 : ch->n; i < n; i++) {   /* done: the tail may have been cut at a stop string */
        ch->ids[i] = r->out[i];
        ch->logp[i] = r->out_logp[i];
        ch->off[i] = r->out_off[i];
        if (ch->top) ch->top[i] = r->out_top[i];
    }
    ch->n = n;   /* shrinks when a stop string is dropped at the end */
    /* the text grows while the request runs; when it is done it is final
     * (and may be shorter: a stop string is cut off) */
    size_t from = done ? 0 : ch->text_len;
    if (r->text.len + 1 > ch->text_cap) {
        size_t cap = td_max(r->text.len + 1, 2 * ch->text_cap + 256);
        char *t = td_malloc(cap);
        if (ch->text_len) memcpy(t, ch->text, ch->text_len);
        td_free(ch->text);
        ch->text = t;
        ch->text_cap = cap;
    }
    if (r->text.len > from) memcpy(ch->text + from, r->text.s + from, r->text.len - from);
    ch->text_len = r->text.len;
    ch->text[ch->text_len] = 0;
    ch->n_safe = td_min(r->n_safe, n);
    ch->text_safe = r->text_safe;
    if (r->t_first > 0 && ch->t_first == 0) {
        ch->t_first = ch->t_last = r->t_first;
        ttft = r->t_first - r->t_submit;
    }
    if (r->t_last > ch->t_last && ch->t_first > 0) {
        gap = r->t_last - ch->t_last;
        ch->t_last = r->t_last;
    }
    if (done) {
        ch->done = true;
        snprintf(ch->finish, sizeof ch->finish, "%s", r->finish_reason);
        c->n_done++;
    }
    c->version++;
    if (done || c->q.stream) pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (qwait >= 0) metrics_queue_wait(&s->m, qwait);
    if (ttft >= 0) metrics_ttft(&s->m, ttft);
    if (gap >= 0) metrics_itl(&s->m, gap);
    if (done) {
        metrics_finished(&s->m, r->finish_reason);
        metrics_lengths(&s->m, r->n_prompt, n);
        completion_release(c, true);
    }
}

/* Submits every choice.  Returns 0, or the HTTP status of the refusal
 * (429: queue full) with what was submitted cancelled. */
static int completion_submit(Completion *c, ApiError *err)
{
    Server *s = c->s;
    const ApiCompletion *q = &c->q;
    for (int p = 0, k = 0; p < q->n_prompts; p++) {
        for (int i = 0; i < q->n; i++, k++) {
            Choice *ch = &c->ch[k];
            GenParams gp = q->gp;
            /* a random seed is kept below 2^53 so that JSON reports it exactly */
            gp.seed = q->has_seed ? q->seed + (uint64_t)i : random_u64() >> 11;
            ch->seed = gp.seed;
            atomic_store(&ch->weights_step, -1);
            Request *r = request_new(q->tokens + q->offs[p], q->offs[p + 1] - q->offs[p], &gp);
            if (q->n_img) request_set_images(r, q->pixels, q->n_img);   /* chat: one prompt holds them all */
            r->cb = on_token;
            r->user = ch;
            r->id = atomic_fetch_add(&s->counter, 1);
            pthread_mutex_lock(&c->mu);
            ch->r = r;
            c->refs++;
            pthread_mutex_unlock(&c->mu);
            int rc = engine_submit(s->e, r);
            if (rc == 0) {
                ch->t_submit = r->t_submit;
                c->n_submitted++;
                continue;
            }
            pthread_mutex_lock(&c->mu);
            ch->r = NULL;
            c->refs--;
            pthread_mutex_unlock(&c->mu);
            if (rc == -1)
                api_error(err, 429, NULL, "the server is overloaded (its queue of %zu is full); retry later",
                          s->e->o.max_queue);
            else if (r->refusal == ENGINE_NO_ROOM)   /* the engine's check: ids, lengths, the cache */
                api_error(err, 400, "max_tokens", "%s (the server's --kv-mb)", r->error);
            else if (r->refusal == ENGINE_PROMPT_NO_ROOM)
                api_error(err, 400, q->kind == API_CHAT ? "messages" : "prompt", "%s (the server's --kv-mb)", r->error);
            else
                api_error(err, 400, q->kind == API_CHAT ? "messages" : "prompt", "%s", r->error);
            request_free(r);
            completion_cancel(c);
            return err->status;
        }
    }
    return 0;
}

static size_t prompt_tokens(const Completion *c) { return c->q.offs[c->q.n_prompts]; }

static ApiChoice api_choice(const Choice *ch)
{
    int64_t ws = atomic_load(&ch->weights_step);
    return (ApiChoice){ ch->ids,      ch->logp, ch->top,  ch->n, ch->text, ch->text_len,
                        ch->off,      ch->seed, ws >= 0 ? ws : atomic_load(&ch->c->s->weights_step) };
}

static void log_completion(Completion *c, int status, const char *how)
{
    if (c->s->o.quiet) return;
    size_t gen = 0;
    double ttft = 0, tps = 0;
    char reasons[64] = "";
    pthread_mutex_lock(&c->mu);   /* choices may still be finishing (cancelled) */
    for (int k = 0; k < c->n_choices; k++) {
        const Choice *ch = &c->ch[k];
        gen += ch->n;
        if (k == 0 && ch->t_first > 0) {
            ttft = (ch->t_first - ch->t_submit) * 1e3;
            if (ch->n > 1 && ch->t_last > ch->t_first) tps = (double)(ch->n - 1) / (ch->t_last - ch->t_first);
        }
        if (k < 4) {
            size_t l = strlen(reasons);
            snprintf(reasons + l, sizeof reasons - l, "%s%s", k ? "," : "", ch->finish[0] ? ch->finish : "-");
        }
    }
    pthread_mutex_unlock(&c->mu);
    fprintf(stderr,
            "tandem: serve: %s %d%s%s prompt %zu completion %zu choices %d ttft %.1f ms %.0f tokens/s finish %s\n",
            c->id, status, how ? " " : "", how ? how : "", prompt_tokens(c), gen, c->n_choices, ttft, tps, reasons);
}

/* ------------------------------------------------------------------ replies */

static enum MHD_Result reply(Server *s, struct MHD_Connection *con, int status, const char *type, const char *body,
                             size_t len, const char *allow)
{
    struct MHD_Response *rsp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!rsp) return MHD_NO;
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow) MHD_add_response_header(rsp, MHD_HTTP_HEADER_ALLOW, allow);
    /* 429 is only ever a full queue (a full KV cache preempts instead):
     * worth retrying soon */
    if (status == 429) MHD_add_response_header(rsp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result rc = MHD_queue_response(con, (unsigned)status, rsp);
    MHD_destroy_response(rsp);
    metrics_http(&s->m, status);
    return rc;
}

static enum MHD_Result reply_json(Server *s, struct MHD_Connection *con, int status, cJSON *o)
{
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) return MHD_NO;
    enum MHD_Result rc = reply(s, con, status, "application/json", body, strlen(body), NULL);
    cJSON_free(body);
    return rc;
}

static enum MHD_Result reply_api_error(Server *s, struct MHD_Connection *con, const ApiError *err,
                                       const char *allow)
{
    char *body = api_error_body(err);
    if (!body) return MHD_NO;
    enum MHD_Result rc = reply(s, con, err->status, "application/json", body, strlen(body), allow);
    cJSON_free(body);
    return rc;
}

static enum MHD_Result reply_error(Server *s, struct MHD_Connection *con, int status, const char *param,
                                   const char *allow, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result reply_error(Server *s, struct MHD_Connection *con, int status, const char *param,
                                   const char *allow, const char *fmt, ...)
{
    ApiError err = { .status = status };
    snprintf(err.param, sizeof err.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof err.message, fmt, ap);
    va_end(ap);
    return reply_api_error(s, con, &err, allow);
}

/* --------------------------------------------------------- whole responses */

/* Waits (on the handler's thread) until every choice is done.  -1 when the
 * client hung up, -2 when the server is stopping: the choices are cancelled. */
static int wait_done(Completion *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->n_done < c->n_submitted) {
        struct timespec ts = poll_deadline();
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (c->n_done == c->n_submitted) break;
        pthread_mutex_unlock(&c->mu);
        int gone = client_gone(c->fd) ? -1 : atomic_load(&c->s->stopping) ? -2 : 0;
        if (gone) {
            completion_cancel(c);
            return gone;
        }
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static enum MHD_Result reply_completion(Server *s, struct MHD_Connection *con, Completion *c)
{
    /* every choice is done: the engine no longer writes to them */
    bool chat = c->q.kind == API_CHAT;
    cJSON *o = api_response_new(c->id, chat ? "chat.completion" : "text_completion", c->created, s->model);
    size_t gen = 0;
    for (int k = 0; k < c->n_choices; k++) {
        const Choice *ch = &c->ch[k];
        ApiChoice ac = api_choice(ch);
        if (chat) api_add_chat_choice(o, &c->q, &ac, k, false, true, 0, ch->n, 0, ch->text_len, ch->finish, s->lim.tok);
        else api_add_choice(o, &c->q, &ac, k, 0, ch->n, 0, ch->text_len, ch->finish, s->lim.tok);
        gen += ch->n;
    }
    api_add_usage(o, prompt_tokens(c), gen);
    return reply_json(s, con, 200, o);
}

/* ---------------------------------------------------------------- streaming */

static void out_append(Completion *c, const char *a, size_t na, const char *b, size_t nb, const char *z, size_t nz)
{
    size_t need = c->out_len + na + nb + nz;
    if (need > c->out_cap) {
        size_t cap = td_max(need, 2 * c->out_cap + 4096);
        char *o = td_malloc(cap);
        if (c->out_len) memcpy(o, c->out, c->out_len);
        td_free(c->out);
        c->out = o;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, a, na);
    memcpy(c->out + c->out_len + na, b, nb);
    memcpy(c->out + c->out_len + na + nb, z, nz);
    c->out_len = need;
}

static void out_event(Completion *c, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return;
    out_append(c, "data: ", 6, s, strlen(s), "\n\n", 2);
    cJSON_free(s);
}

/* Queues the events that the choices' progress allows: a chunk per choice
 * with its new final tokens and text (whole characters, never what a stop
 * string may still take back), its last chunk (with finish_reason) once
 * it is done, then the usage chunk if asked and "data: [DONE]".  A chat
 * choice starts with a chunk whose delta has the role.  Returns whether
 * anything was queued; *seen gets the version it looked at. */
static bool stream_fill(Completion *c, uint64_t *seen)
{
    Server *s = c->s;
    int nc = c->n_choices;
    size_t n[nc], text[nc];
    bool done[nc];
    bool chat = c->q.kind == API_CHAT;
    const char *object = chat ? "chat.completion.chunk" : "text_completion";
    /* what each choice can send, copied under the lock (the engine thread
     * may reallocate the text or, once done, rewrite the tail) */
    pthread_mutex_lock(&c->mu);
    *seen = c->version;
    for (int k = 0; k < nc; k++) {
        Choice *ch = &c->ch[k];
        done[k] = ch->done || !ch->r;
        n[k] = done[k] ? ch->n : ch->n_safe;
        text[k] = done[k] ? ch->text_len : ch->text_safe;
        if (ch->final_sent) continue;
        size_t nt = n[k] > ch->sent ? n[k] - ch->sent : 0, nb = text[k] > ch->sent_bytes ? text[k] - ch->sent_bytes : 0;
        if (nt) {
            memcpy(ch->s_ids, ch->ids + ch->sent, nt * sizeof(int32_t));
            memcpy(ch->s_logp, ch->logp + ch->sent, nt * sizeof(float));
            memcpy(ch->s_off, ch->off + ch->sent, nt * sizeof(size_t));
            if (ch->s_top) memcpy(ch->s_top, ch->top + ch->sent, nt * sizeof(Sampled));
        }
        if (nb + 1 > ch->s_text_cap) {
            td_free(ch->s_text);
            ch->s_text_cap = td_max(nb + 1, 2 * ch->s_text_cap + 256);
            ch->s_text = td_malloc(ch->s_text_cap);
        }
        if (nb) memcpy(ch->s_text, ch->text + ch->sent_bytes, nb);
        ch->s_text[nb] = 0;
    }
    pthread_mutex_unlock(&c->mu);
    bool any = false, all = true;
    for (int k = 0; k < nc; k++) {
        Choice *ch = &c->ch[k];
        if (ch->final_sent) continue;
        if (n[k] > ch->sent || text[k] > ch->sent_bytes || done[k] || (chat && !ch->role_sent)) {
            cJSON *o = api_response_new(c->id, object, c->created, s->model);
            if (chat && c->q.include_usage) cJSON_AddNullToObject(o, "usage");
            size_t nt = n[k] > ch->sent ? n[k] - ch->sent : 0, nb = text[k] > ch->sent_bytes ? text[k] - ch->sent_bytes : 0;
            int64_t ws = atomic_load(&ch->weights_step);
            ApiChoice ac = { ch->s_ids, ch->s_logp, ch->s_top, nt, ch->s_text, nb, ch->s_off, ch->seed,
                             ws >= 0 ? ws : atomic_load(&s->weights_step) };
            const char *fin = done[k] ? (ch->finish[0] ? ch->finish : "cancelled") : NULL;
            if (chat) {
                api_add_chat_choice(o, &c->q, &ac, k, true, !ch->role_sent, 0, nt, 0, nb, fin, s->lim.tok);
                ch->role_sent = true;
            } else
                api_add_choice(o, &c->q, &ac, k, 0, nt, 0, nb, fin, s->lim.tok);
            out_event(c, o);
            ch->sent = n[k];
            ch->sent_bytes = text[k];
            ch->final_sent = done[k];
            any = true;
        }
        all = all && ch->final_sent;
    }
    if (all && !c->done_queued) {
        if (c->q.include_usage) {
            cJSON *o = api_response_new(c->id, object, c->created, s->model);
            size_t gen = 0;
            for (int k = 0; k < nc; k++) gen += c->ch[k].sent;
            api_add_usage(o, prompt_tokens(c), gen);
            out_event(c, o);
        }
        out_append(c, "data: [DONE]\n\n", 14, "", 0, "", 0);
        c->done_queued = true;
        any = true;
    }
    return any;
}

/* MHD's content reader (the connection's thread): hands out queued events,
 * waiting for the engine when there are none. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    Completion *c = cls;
    (void)pos;
    for (;;) {
        if (c->out_off < c->out_len) {
            size_t k = td_min(max, c->out_len - c->out_off);
            memcpy(buf, c->out + c->out_off, k);
            c->out_off += k;
            c->last_out = td_now();
            return (ssize_t)k;
        }
        if (c->done_queued) return MHD_CONTENT_READER_END_OF_STREAM;
        c->out_len = c->out_off = 0;
        uint64_t seen;
        if (stream_fill(c, &seen)) continue;
        /* a comment line while the request waits (queued behind others):
         * libmicrohttpd closes a connection that sends nothing for
         * idle_timeout seconds, and proxies do the same */
        if (td_now() - c->last_out > c->s->keepalive) {
            out_append(c, ": keep-alive\n\n", 14, "", 0, "", 0);
            continue;
        }
        pthread_mutex_lock(&c->mu);
        if (c->version == seen) {
            struct timespec ts = poll_deadline();
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        pthread_mutex_unlock(&c->mu);
        if (client_gone(c->fd) || atomic_load(&c->s->stopping)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* MHD is done with the stream (finished, or the client went away). */
static void stream_free(void *cls)
{
    Completion *c = cls;
    bool complete = c->done_queued && c->out_off == c->out_len;
    if (!complete) completion_cancel(c);
    else metrics_request(&c->s->m, c->q.kind == API_CHAT, td_now() - c->t_body);
    log_completion(c, 200, complete ? "stream" : "stream disconnected");
    completion_release(c, false);
}

/* ----------------------------------------------------------------- handlers */

static enum MHD_Result handle_completion(Server *s, struct MHD_Connection *con, Upload *u, ApiKind kind)
{
    if (u->too_big)
        return reply_error(s, con, 400, NULL, NULL, "the request body exceeds the server's limit of %zu bytes",
                           s->o.max_body);
    if (atomic_load(&s->draining))
        return reply_error(s, con, 503, NULL, NULL, "the server is shutting down");
    ApiCompletion q;
    ApiError err;
    /* parsing, the chat template and tokenization: the request's overhead
     * before the engine (tandem_request_prepare_seconds) */
    double t0 = td_now();
    int prc = kind == API_CHAT ? api_parse_chat(&q, u->body ? u->body : "", u->len, &s->lim, &err)
                               : api_parse_completion(&q, u->body ? u->body : "", u->len, &s->lim, &err);
    if (prc) return reply_api_error(s, con, &err, NULL);
    metrics_prepare(&s->m, kind == API_CHAT, td_now() - t0);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
    Completion *c = completion_new(s, &q, ci ? (int)ci->connect_fd : -1, t0);
    int status = completion_submit(c, &err);
    if (status) {
        enum MHD_Result rc = reply_api_error(s, con, &err, NULL);
        log_completion(c, status, "refused");
        completion_release(c, false);
        return rc;
    }
    if (!c->q.stream) {
        int w = wait_done(c);
        if (w) {
            log_completion(c, 499, w == -1 ? "client disconnected" : "server stopped");
            completion_release(c, false);
            return MHD_NO;   /* closes the connection */
        }
        enum MHD_Result rc = reply_completion(s, con, c);
        metrics_request(&s->m, c->q.kind == API_CHAT, td_now() - c->t_body);
        log_completion(c, 200, NULL);
        completion_release(c, false);
        return rc;
    }
    /* the stream owns the HTTP reference from here; stream_free drops it */
    c->last_out = td_now();
    struct MHD_Response *rsp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, c, stream_free);
    if (!rsp) {
        completion_cancel(c);
        completion_release(c, false);
        return MHD_NO;
    }
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(rsp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(con, MHD_HTTP_OK, rsp);
    MHD_destroy_response(rsp);   /* stream_free runs when MHD lets go of it */
    metrics_http(&s->m, 200);
    return rc;
}

/* POST /tokenize and /detokenize (vLLM's). */
static enum MHD_Result handle_tokenize(Server *s, struct MHD_Connection *con, Upload *u, bool encode)
{
    if (u->too_big)
        return reply_error(s, con, 400, NULL, NULL, "the request body exceeds the server's limit of %zu bytes",
                           s->o.max_body);
    ApiError err;
    cJSON *o = encode ? api_tokenize(u->body ? u->body : "", u->len, &s->lim, &err)
                      : api_detokenize(u->body ? u->body : "", u->len, &s->lim, &err);
    if (!o) return reply_api_error(s, con, &err, NULL);
    return reply_json(s, con, 200, o);
}

static cJSON *model_json(const Server *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "tandem");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->lim.context);
    return m;
}

/* The path for messages: printable ASCII only, cut to 80 bytes. */
static void safe_path(char *out, size_t n, const char *url)
{
    size_t o = 0;
    for (size_t i = 0; url[i] && o + 1 < n && i < 80; i++)
        out[o++] = (url[i] >= 0x20 && url[i] < 0x7f) ? url[i] : '?';
    out[o] = 0;
}

/* a == b in time that depends on their lengths only, not on where they
 * differ (a key is not guessed byte by byte from response times). */
static bool same_secret(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned char d = na != nb;
    for (size_t i = 0; i < na && i < nb; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* Whether the request may use url: without --api-key always; with it,
 * /health and /metrics are open and everything else needs
 * "Authorization: Bearer KEY" with one of the keys (every key compared). */
static bool authorized(const Server *s, struct MHD_Connection *con, const char *url)
{
    if (!s->o.n_api_keys || !strcmp(url, "/health") || !strcmp(url, "/metrics")) return true;
    const char *h = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    const size_t n = strlen(h);
    bool ok = false;
    for (size_t i = 0; i < s->o.n_api_keys; i++) ok |= same_secret(h, n, s->o.api_keys[i], strlen(s->o.api_keys[i]));
    return ok;
}

/* POST /v1/admin/reload {"checkpoint": FILE}: asks the engine thread to
 * swap the weights and waits for the answer (bounded). */
static enum MHD_Result handle_reload(Server *s, struct MHD_Connection *con, Upload *u)
{
    if (!s->o.admin_token)
        return reply_error(s, con, 403, NULL, NULL,
                           "weight reload is off: start tandem serve with --admin-token to enable it");
    const char *h = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    bool ok = h && !strncasecmp(h, "Bearer ", 7);
    if (ok) {
        h += 7;
        while (*h == ' ') h++;
        ok = same_secret(h, strlen(h), s->o.admin_token, strlen(s->o.admin_token));
    }
    if (!ok) return reply_error(s, con, 401, NULL, NULL, "incorrect or missing admin token (tandem serve --admin-token)");
    if (u->too_big) return reply_error(s, con, 400, NULL, NULL, "the request body is too large");
    cJSON *o = cJSON_ParseWithLength(u->body ? u->body : "", u->len);
    const cJSON *f = o ? cJSON_GetObjectItemCaseSensitive(o, "checkpoint") : NULL;
    if (!cJSON_IsString(f) || !f->valuestring[0] || strlen(f->valuestring) >= sizeof s->rl_file) {
        cJSON_Delete(o);
        return reply_error(s, con, 400, "checkpoint", NULL,
                           "the body must be a JSON object with \"checkpoint\": the path of a checkpoint file");
    }
    pthread_mutex_lock(&s->rl_mu);
    if (s->rl_state != RL_IDLE) {
        pthread_mutex_unlock(&s->rl_mu);
        cJSON_Delete(o);
        return reply_error(s, con, 409, NULL, NULL, "a weight reload is already in progress; retry when it is done");
    }
    snprintf(s->rl_file, sizeof s->rl_file, "%s", f->valuestring);
    cJSON_Delete(o);
    s->rl_state = RL_ASKED;
    s->rl_admin = true;
    pthread_cond_broadcast(&s->e->cv);   /* wakes an idle engine thread */
    double t_end = td_now() + SERVER_RELOAD_WAIT;
    while (s->rl_state != RL_DONE && !atomic_load(&s->stopping) && td_now() < t_end) {
        struct timespec ts = poll_deadline();
        pthread_cond_timedwait(&s->rl_cv, &s->rl_mu, &ts);
    }
    if (s->rl_state != RL_DONE) {
        /* the engine thread still owns the request; it answers nobody */
        s->rl_admin = false;
        pthread_mutex_unlock(&s->rl_mu);
        return reply_error(s, con, 503, NULL, NULL,
                           "the reload did not finish within %d s (requests still running, or the server stops)",
                           (int)SERVER_RELOAD_WAIT);
    }
    int rc = s->rl_rc;
    char msg[sizeof s->rl_msg];
    snprintf(msg, sizeof msg, "%s", s->rl_msg);
    double pause = s->rl_pause;
    s->rl_state = RL_IDLE;
    pthread_mutex_unlock(&s->rl_mu);
    if (rc) return reply_error(s, con, 400, "checkpoint", NULL, "%s", msg);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "status", "ok");
    char step[24];
    snprintf(step, sizeof step, "%lld", (long long)atomic_load(&s->weights_step));
    cJSON_AddRawToObject(r, "weights_step", step);
    cJSON_AddNumberToObject(r, "pause_seconds", pause);
    return reply_json(s, con, 200, r);
}

static enum MHD_Result route(Server *s, struct MHD_Connection *con, const char *url, const char *method, Upload *u)
{
    if (!strcmp(url, "/v1/admin/reload")) {   /* its own token, not the API keys */
        if (strcmp(method, MHD_HTTP_METHOD_POST))
            return reply_error(s, con, 405, NULL, "POST", "%s is not allowed on /v1/admin/reload; use POST", method);
        return handle_reload(s, con, u);
    }
    if (!authorized(s, con, url)) {
        ApiError err = { .status = 401 };
        snprintf(err.message, sizeof err.message,
                 "Incorrect or missing API key: this server needs \"Authorization: Bearer KEY\" (tandem serve --api-key)");
        char *body = api_error_body(&err);
        if (!body) return MHD_NO;
        struct MHD_Response *rsp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
        cJSON_free(body);
        if (!rsp) return MHD_NO;
        MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(rsp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
        enum MHD_Result rc = MHD_queue_response(con, 401, rsp);
        MHD_destroy_response(rsp);
        metrics_http(&s->m, 401);
        return rc;
    }
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    char path[96];
    safe_path(path, sizeof path, url);
    bool chat = !strcmp(url, "/v1/chat/completions"), tokz = !strcmp(url, "/tokenize"),
         detok = !strcmp(url, "/detokenize");
    if (!strcmp(url, "/v1/completions") || chat || tokz || detok) {
        if (!post) return reply_error(s, con, 405, NULL, "POST", "%s is not allowed on %s; use POST", method, path);
        if (tokz || detok) return handle_tokenize(s, con, u, tokz);
        return handle_completion(s, con, u, chat ? API_CHAT : API_COMPLETION);
    }
    bool known = !strcmp(url, "/health") || !strcmp(url, "/metrics") || !strcmp(url, "/v1/models") ||
                 !strncmp(url, "/v1/models/", 11);
    if (!known) return reply_error(s, con, 404, NULL, NULL, "unknown path %s", path);
    if (!get) return reply_error(s, con, 405, NULL, "GET, HEAD", "%s is not allowed on %s; use GET", method, path);
    if (!strcmp(url, "/health")) {
        bool draining = atomic_load(&s->draining);
        const char *b = draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}";
        return reply(s, con, draining ? 503 : 200, "application/json", b, strlen(b), NULL);
    }
    if (!strcmp(url, "/metrics")) {
        size_t len;
        char *text = metrics_render(&s->m, &len);
        enum MHD_Result rc = reply(s, con, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
        td_free(text);
        return rc;
    }
    if (!strcmp(url, "/v1/models")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_json(s));
        return reply_json(s, con, 200, o);
    }
    if (strcmp(url + 11, s->model)) return reply_error(s, con, 404, "model", NULL, "unknown model %s", path + 11);
    return reply_json(s, con, 200, model_json(s));
}

/* MHD's access handler: called once with the headers, then with each piece
 * of the body, then once more with nothing left (where we answer). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls)
{
    Server *s = cls;
    Upload *u = *con_cls;
    (void)version;
    if (!u) {
        u = td_calloc(sizeof *u);
        *con_cls = u;
        const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtod(cl, NULL) > (double)s->o.max_body * SERVER_BODY_DISCARD_FACTOR) {
            u->too_big = true;
            return reply_error(s, con, 400, NULL, NULL, "the request body exceeds the server's limit of %zu bytes",
                               s->o.max_body);
        }
        return MHD_YES;
    }
    if (*data_size) {
        if (!u->too_big && u->len + *data_size > s->o.max_body) {
            u->too_big = true;   /* keep reading, drop the rest */
            td_free(u->body);
            u->body = NULL;
            u->len = u->cap = 0;
        }
        if (!u->too_big) {
            if (u->len + *data_size > u->cap) {
                size_t cap = td_min(s->o.max_body, td_max(u->len + *data_size, 2 * u->cap + 4096));
                char *b = td_malloc(cap);
                if (u->len) memcpy(b, u->body, u->len);
                td_free(u->body);
                u->body = b;
                u->cap = cap;
            }
            memcpy(u->body + u->len, data, *data_size);
            u->len += *data_size;
        }
        *data_size = 0;
        return MHD_YES;
    }
    return route(s, con, url, method, u);
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    Upload *u = *con_cls;
    (void)cls;
    (void)con;
    (void)toe;
    if (!u) return;
    td_free(u->body);
    td_free(u);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    Server *s = cls;
    /* before the daemon runs, server_start reports failures in one line */
    if (s->o.quiet || !atomic_load(&s->log_on)) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t l = strlen(msg);
    while (l && (msg[l - 1] == '\n' || msg[l - 1] == '\r')) msg[--l] = 0;
    fprintf(stderr, "tandem: serve: http: %s\n", msg);
}

/* ---------------------------------------------------------------- lifecycle */

int server_start(Server **out, Engine *e, const ServerOpts *o, char *err, size_t n)
{
    *out = NULL;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int g = getaddrinfo(o->host, port, &hints, &ai);
    if (g || !ai) {
        snprintf(err, n, "cannot resolve --host %s: %s", o->host, gai_strerror(g));
        return -1;
    }
    Server *s = td_calloc(sizeof *s);
    s->e = e;
    s->o = *o;
    s->model = td_strdup(o->model_name);
    s->lim.context = engine_context(e);
    s->lim.context_name = s->lim.context < (size_t)e->m->cfg.max_position_embeddings ? "the server's --max-context"
                                                                                     : "the model's context";
    s->lim.kv_positions = (size_t)e->kv.n_blocks * e->kv.bs;
    s->lim.max_n = o->max_n;
    s->lim.tok = e->tok;
    /* images in chat content parts: what the model's vision tower takes */
    const ModelConfig *mc = &e->m->cfg;
    s->lim.vision.tokens = vision_tokens_per_image(mc);
    s->lim.vision.token_id = mc->image_token_index;
    s->lim.vision.size = (size_t)mc->vision_config.image_size;
    for (int c = 0; c < 3; c++) {
        s->lim.vision.mean[c] = (float)mc->vision_config.image_mean[c];
        s->lim.vision.std[c] = (float)mc->vision_config.image_std[c];
    }
    s->lim.vision.limits = o->image_limits;
    s->lim.vision.max_images = o->max_images;
    /* the chat template: chat requests get a 400 with chat_error when there
     * is none or it cannot be compiled; everything else still serves */
    size_t cl;
    const char *cfg = tok_config_text(e->tok, &cl);
    char why[512];
    if (tok_is_byte_level(e->tok))
        snprintf(s->chat_error, sizeof s->chat_error,
                 "the model has no chat template (its tokenizer is tandem's byte-level one)");
    else if (!cfg)
        snprintf(s->chat_error, sizeof s->chat_error,
                 "the model has no chat template (its tokenizer has no tokenizer_config.json)");
    else if (chat_template_load(&s->chat, cfg, cl, why, sizeof why))
        snprintf(s->chat_error, sizeof s->chat_error, "the model's chat template cannot be used: %s", why);
    s->lim.chat = s->chat;
    s->lim.chat_error = s->chat_error;
    s->started = (long)time(NULL);
    s->keepalive = o->idle_timeout ? fmin(15.0, o->idle_timeout / 3.0) : 15.0;
    s->salt = (uint32_t)random_u64();
    metrics_init(&s->m);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->rl_mu, NULL);
    pthread_cond_init(&s->rl_cv, NULL);
    atomic_store(&s->weights_step, o->weights_step);
    s->m.d.weights_step = o->weights_step;
    if (o->follow_dir) follow_target(o->follow_dir, s->follow_seen, sizeof s->follow_seen);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,   /* first, or MHD warns */
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        snprintf(err, n, "cannot listen on %s:%d (%s)", o->host, o->port,
                 errno ? strerror(errno) : "libmicrohttpd refused the options");
        server_free(s);
        return -1;
    }
    atomic_store(&s->log_on, true);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return 0;
}

static int live_count(Server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_live;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Cancels the choices of every live completion (engine thread). */
static void cancel_all(Server *s)
{
    pthread_mutex_lock(&s->mu);
    for (Completion *c = s->live; c; c = c->next) completion_cancel(c);
    pthread_mutex_unlock(&s->mu);
}

static size_t step(Server *s)
{
    size_t left = engine_step(s->e);
    EngineStats st;
    engine_stats(s->e, &st);
    metrics_engine(&s->m, &st);
    const int *layers = NULL;
    const int64_t *ex = engine_expert_tokens(s->e, &layers);
    metrics_experts(&s->m, ex, layers, s->e->n_moe, s->e->m->E_global);
    free_graveyard(s);
    return left;
}

/* follow_dir/latest's target into out; false when there is none. */
static bool follow_target(const char *dir, char *out, size_t n)
{
    char link[PATH_MAX + 8];
    if (snprintf(link, sizeof link, "%s/latest", dir) >= (int)sizeof link) return false;
    ssize_t k = readlink(link, out, n - 1);
    if (k < 0) return false;
    out[k] = 0;
    return true;
}

/* Engine thread, between steps: a reload asked for (or a new latest under
 * --follow) holds admission; once no admitted request is left the weights
 * are swapped, the prefix cache dropped and admission resumes.  Returns
 * -2 when the server has no usable weights any more (it stops). */
static int reload_tick(Server *s)
{
    pthread_mutex_lock(&s->rl_mu);
    double now = td_now();
    if (s->rl_state == RL_IDLE && s->o.follow_dir && now >= s->follow_next) {
        s->follow_next = now + 0.2;
        char t[PATH_MAX];
        if (follow_target(s->o.follow_dir, t, sizeof t) && strcmp(t, s->follow_seen)) {
            snprintf(s->follow_seen, sizeof s->follow_seen, "%s", t);
            if (t[0] == '/') snprintf(s->rl_file, sizeof s->rl_file, "%s", t);
            else snprintf(s->rl_file, sizeof s->rl_file, "%s/%s", s->o.follow_dir, t);
            s->rl_state = RL_ASKED;
            s->rl_admin = false;
        }
    }
    if (s->rl_state == RL_ASKED) {
        s->rl_state = RL_HELD;
        s->rl_t0 = now;
        engine_hold(s->e, true);
    }
    bool held = s->rl_state == RL_HELD;
    char file[sizeof s->rl_file];
    snprintf(file, sizeof file, "%s", s->rl_file);
    pthread_mutex_unlock(&s->rl_mu);
    if (!held || engine_admitted_live(s->e) > 0) return 0;

    int64_t step = atomic_load(&s->weights_step), old = step;
    char err[512] = "";
    double t_load = td_now();
    int rc = s->o.reload ? s->o.reload(s->o.reload_user, file, &step, err, sizeof err) : -1;
    if (!s->o.reload) snprintf(err, sizeof err, "this server cannot reload weights");
    t_load = td_now() - t_load;
    if (rc == 0) {
        engine_set_weights_version(s->e, ++s->rl_version);   /* the old weights' cached blocks go */
        atomic_store(&s->weights_step, step);
    }
    engine_hold(s->e, false);
    double pause = td_now() - s->rl_t0;
    metrics_reload(&s->m, rc == 0, pause, atomic_load(&s->weights_step));
    if (rc == 0)
        fprintf(stderr, "tandem: serve: weights %s: step %lld -> %lld (loaded in %.0f ms, admission held %.0f ms)\n",
                file, (long long)old, (long long)step, 1000 * t_load, 1000 * pause);
    else
        fprintf(stderr, "tandem: serve: reload of %s failed: %s%s\n", file, err,
                rc == -2 ? "; no usable weights left: stopping" : "; still serving the old weights");
    pthread_mutex_lock(&s->rl_mu);
    s->rl_rc = rc;
    snprintf(s->rl_msg, sizeof s->rl_msg, "%s", err);
    s->rl_pause = pause;
    s->rl_state = s->rl_admin ? RL_DONE : RL_IDLE;
    pthread_cond_broadcast(&s->rl_cv);
    pthread_mutex_unlock(&s->rl_mu);
    return rc == -2 ? -2 : 0;
}

void server_run(Server *s, volatile sig_atomic_t *stop)
{
    double drain_start = 0, cancel_at = 0;
    for (;;) {
        if (*stop && !atomic_load(&s->draining)) {
            atomic_store(&s->draining, true);
            drain_start = td_now();
            fprintf(stderr, "tandem: serve: draining (%d requests in flight, up to %.0f s)\n", live_count(s),
                    s->o.drain_timeout);
        }
        size_t left = step(s);
        if (!atomic_load(&s->draining) && reload_tick(s) == -2) *stop = 1;
        if (atomic_load(&s->draining)) {
            double now = td_now();
            if (left == 0 && live_count(s) == 0) break;
            if (!cancel_at && now - drain_start > s->o.drain_timeout) {
                fprintf(stderr, "tandem: serve: drain timeout: cancelling %d requests\n", live_count(s));
                cancel_all(s);
                cancel_at = now;
            }
            /* the clients of cancelled requests get a few seconds to read
             * their answers; then the listener stops regardless */
            if (cancel_at && now - cancel_at > 5.0) break;
        }
        if (left == 0) engine_wait(s->e, atomic_load(&s->draining) ? 10 : 50);
    }
    /* handlers still waiting see `stopping`, cancel and return; stopping
     * the daemon joins their threads */
    atomic_store(&s->stopping, true);
    MHD_stop_daemon(s->d);
    s->d = NULL;
    cancel_all(s);
    for (int i = 0; i < 1000 && (step(s) > 0 || live_count(s) > 0); i++) {}
    free_graveyard(s);
}

void server_free(Server *s)
{
    if (!s) return;
    if (s->d) {
        atomic_store(&s->stopping, true);
        MHD_stop_daemon(s->d);
    }
    free_graveyard(s);
    if (s->n_live)
        td_error("serve: %d requests were still alive at exit", s->n_live);
    metrics_free(&s->m);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->rl_mu);
    pthread_cond_destroy(&s->rl_cv);
    chat_template_free(s->chat);
    td_free(s->model);
    td_free(s);
}

/* rl/rl.c - GRPO with exact rollout/trainer log-probabilities (rl.h).
 *
 * Objective per generated token t of sample i (advantage A_i, old logprob
 * from the rollout, new from the trainer's forward, ratio r = exp(new-old)):
 *   L_t = -min(r A, clip(r, 1-eps, 1+eps) A) + kl_coef * k3_t
 *   k3_t = exp(ref - new) - (ref - new) - 1           (Schulman's k3)
 * aggregated as a mean over all generated tokens (token_mean) or a mean
 * over samples of each sample's token mean (seq_mean).  Its gradient with
 * respect to each token's log-probability is what model_train_backward
 * takes (dlogp), so no second copy of the model math exists here:
 *   dL/dnew = -r A  (when the unclipped term is the minimum, else 0)
 *           + kl_coef * (1 - exp(ref - new))
 * The first update of a batch runs at the rollout's weights, so r == 1
 * exactly: the trainer's forward reproduces the rollout's arithmetic.
 *
 * rollout_dtype=bf16|int8: the engine generates from a serving model q
 * holding the weights in that dtype (re-quantized from the float32 weights
 * after every step's updates, model_quantize_from; the split placement
 * broadcasts q itself, 2 or ~3.6 times fewer bytes) and its KV cache in
 * bf16, as `tandem rollout --dtype` holds it by default (--kv-dtype auto).  The behaviour
 * log-probabilities -- old, the ones the ratio divides by, and the ones
 * logprob_diff_max compares with the rollout's -- are the trainer's
 * forward on q: the same kernels on the same rounded weights, so they equal
 * the rollout's bit for bit.  The update's new log-probabilities and
 * gradient are the float32 model's, so the first ratio is exp(new_f32 -
 * old_q), the exact importance weight of the rounding (quant_logprob_diff_max
 * reports its size), not an estimate of it.
 */
#include "rl/rl.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "comm/comm.h"
#include "core/model/backprop.h"
#include "core/common.h"
#include "core/pool.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "train/optim.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- rewards */

double rl_reward_vowels(const char *bytes, size_t n)
{
    if (!n) return 0.0;
    size_t v = 0;
    for (size_t i = 0; i < n; i++) v += bytes[i] == 'a' || bytes[i] == 'e' || bytes[i] == 'i' || bytes[i] == 'o' || bytes[i] == 'u';
    return (double)v / (double)n;
}

double rl_reward_target_length(size_t n, int target)
{
    if (target <= 0) return 0.0;
    double r = 1.0 - fabs((double)n - target) / target;
    return r > 0 ? r : 0.0;
}

/* ---------------------------------------------------------------- prompts and samples */

typedef struct {
    int32_t *ids;
    size_t n;
    char id[64];
    int target;      /* target_length: the number the prompt asks for */
} Prompt;

typedef struct {
    int prompt;      /* index in the step's prompt list (global) */
    int32_t *seq;    /* prompt + completion (owned) */
    int n_prompt, n_out;
    float *logp;     /* rollout logprobs (n_out) */
    float *ref;      /* reference logprobs (n_out), when kl_coef > 0 */
    int32_t *routes; /* (n_out, n_moe, k) */
    double reward, adv;
} Sample;

/* The first number written in s[0..n) (target_length's target), or 0. */
static int first_int(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] >= '0' && s[i] <= '9') {
            int v = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9' && v < 100000) v = v * 10 + (s[i++] - '0');
            return v;
        }
    return 0;
}

/* The bytes that ids[0..n) stand for (tok_token_bytes joined: for the
 * byte-level tokenizer the ids themselves), what the built-in rewards and
 * targets read. */
static void ids_bytes(const Tokenizer *tok, const int32_t *ids, size_t n, TokText *out)
{
    char err[64];
    out->len = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < tok_vocab_size(tok) && !tok_is_special(tok, ids[i])) tok_token_bytes(tok, ids[i], out, err, sizeof err);
}

/* A text prompt: its ids as HF's tokenizer(text) gives them.  0, or -1
 * with err. */
static int prompt_from_text(Prompt *p, const Tokenizer *tok, const char *text, const char *id, char *err, size_t n)
{
    TokIds v = { 0 };
    if (tok_encode(tok, text, strlen(text), true, &v, err, n)) return -1;
    p->ids = v.ids;
    p->n = v.n;
    snprintf(p->id, sizeof p->id, "%s", id);
    p->target = first_int(text, strlen(text));
    return 0;
}

static const char *const g_words[] = { "Hello", "Write", "Say", "Tell", "Sing", "Now", "Then", "Why",
                                       "What", "Look", "Here", "Yes", "Well", "So", "Oh", "Go" };

/* The text of a built-in prompt: "Length N:" (N in [2, 24]) or "<word>: ". */
static void builtin_text(char *text, size_t n, const char *task, uint64_t key, int max_new)
{
    if (!strcmp(task, "target_length")) {
        int hi = max_new - 2 < 24 ? max_new - 2 : 24;
        int k = 2 + (int)(key % (uint64_t)(hi > 2 ? hi - 1 : 1));
        snprintf(text, n, "Length %d:", k);
    } else {
        snprintf(text, n, "%s: ", g_words[key % (sizeof g_words / sizeof *g_words)]);
    }
}

/* The largest id and the most ids any built-in prompt of the task encodes
 * to (every text it can draw, encoded), to check them against the
 * vocabulary and the context once, before the run.  0, or -1 with err. */
static int builtin_extent(const char *task, const Tokenizer *tok, int max_new, int *max_id, int *max_len,
                          char *err, size_t n)
{
    *max_id = 0;
    *max_len = 1;
    size_t kinds = !strcmp(task, "target_length") ? 23 : sizeof g_words / sizeof *g_words;
    for (uint64_t k = 0; k < kinds; k++) {
        char text[64];
        builtin_text(text, sizeof text, task, k, max_new);
        TokIds v = { 0 };
        if (tok_encode(tok, text, strlen(text), true, &v, err, n)) return -1;
        for (size_t i = 0; i < v.n; i++) *max_id = v.ids[i] > *max_id ? v.ids[i] : *max_id;
        *max_len = (int)v.n > *max_len ? (int)v.n : *max_len;
        tok_ids_free(&v);
    }
    return 0;
}

/* Built-in prompts, a function of (seed, step, index) only. */
static void builtin_prompt(Prompt *p, const Tokenizer *tok, const char *task, uint64_t seed, int64_t step, int i,
                           int max_new)
{
    uint64_t key = rng_mix64(seed ^ rng_mix64((uint64_t)step * 7919u + (uint64_t)i));
    char text[64], id[64], err[160];
    snprintf(id, sizeof id, "s%lld-p%d", (long long)step, i);
    builtin_text(text, sizeof text, task, key, max_new);
    /* every built-in text was encoded once by builtin_extent */
    TD_CHECK(prompt_from_text(p, tok, text, id, err, sizeof err) == 0, "rl: built-in prompt: %s", err);
}

/* prompts=FILE: JSONL lines with "prompt" (text, encoded by tok) or
 * "prompt_ids", optional "id". */
static int load_prompts(const char *path, const Tokenizer *tok, int V, int max_len, Prompt **out, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        td_error("prompts: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    Prompt *v = NULL;
    int n = 0, cap = 0, line_no = 0, rc = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        cJSON *o = cJSON_Parse(line);
        const cJSON *pt = o ? cJSON_GetObjectItemCaseSensitive(o, "prompt") : NULL;
        const cJSON *pi = o ? cJSON_GetObjectItemCaseSensitive(o, "prompt_ids") : NULL;
        const cJSON *id = o ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            Prompt *nv = td_calloc((size_t)cap * sizeof(Prompt));
            if (n) memcpy(nv, v, (size_t)n * sizeof(Prompt));
            td_free(v);
            v = nv;
        }
        Prompt *p = &v[n];
        char idbuf[sizeof p->id];
        bool id_long = cJSON_IsString(id)   ? td_snprintf(idbuf, sizeof idbuf, "%s", id->valuestring)
                       : cJSON_IsNumber(id) ? td_snprintf(idbuf, sizeof idbuf, "%.0f", id->valuedouble)
                                            : td_snprintf(idbuf, sizeof idbuf, "%d", n);
        const char *why = NULL;
        char enc_why[160];
        if (!cJSON_IsObject(o)) why = "not a JSON object";
        else if (id_long) why = "\"id\" is longer than 63 bytes";
        else if (cJSON_IsString(pt) && pt->valuestring[0]) {
            if (prompt_from_text(p, tok, pt->valuestring, idbuf, enc_why, sizeof enc_why)) why = enc_why;
        } else if (cJSON_IsArray(pi) && cJSON_GetArraySize(pi) > 0) {
            p->n = (size_t)cJSON_GetArraySize(pi);
            p->ids = td_malloc(p->n * sizeof(int32_t));
            size_t k = 0;
            for (const cJSON *x = pi->child; x; x = x->next) {
                bool ok = cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= INT32_MAX &&
                          x->valuedouble == floor(x->valuedouble);
                if (!ok) why = "prompt_ids must be non-negative integers";
                p->ids[k++] = ok ? (int32_t)x->valuedouble : 0;
            }
            snprintf(p->id, sizeof p->id, "%s", idbuf);
            TokText b = { 0 };
            ids_bytes(tok, p->ids, p->n, &b);
            p->target = first_int(b.s, b.len);
            tok_text_free(&b);
        } else why = "needs a non-empty \"prompt\" string or \"prompt_ids\" list";
        /* the trainer's forward embeds the prompts too: text bytes and ids
         * alike must be inside the vocabulary */
        char vocab_why[160];
        for (size_t t = 0; !why && t < p->n; t++)
            if (p->ids[t] >= V) {
                snprintf(vocab_why, sizeof vocab_why,
                         "prompt token id %d at position %zu is outside the vocabulary (vocab_size %d)",
                         (int)p->ids[t], t, V);
                why = vocab_why;
            }
        if (!why && (int)p->n > max_len) why = "prompt too long for the context";
        cJSON_Delete(o);
        if (why) {
            td_error("prompts: %s line %d: %s", path, line_no, why);
            td_free(p->ids);
            rc = -1;
            break;
        }
        n++;
    }
    free(line);
    fclose(f);
    if (rc == 0 && n == 0) {
        td_error("prompts: %s holds no prompts", path);
        rc = -1;
    }
    if (rc) {
        for (int i = 0; i < n; i++) td_free(v[i].ids);
        td_free(v);
        return -1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* ---------------------------------------------------------------- reward_cmd */

/* The text of ids (decode; ids beyond the tokenizer's vocabulary, which a
 * model with a padded embedding can sample, have none). */
static void text_of(const Tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, TokText *out)
{
    char err[64];
    TokStream *ts = tok_stream_new(tok, skip_special);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < tok_vocab_size(tok)) tok_stream_push(ts, ids[i], out, err, sizeof err);
    tok_stream_finish(ts, out);
    tok_stream_free(ts);
}

/* Runs `sh -c cmd` with the samples as JSONL on stdin and reads one reward
 * per line from its stdout within timeout_s.  0, or -1 with the reason. */
static int reward_cmd_run(const char *cmd, double timeout_s, const Tokenizer *tok, const Sample *s, int n,
                          const Prompt *prompts, const char *tmp_path, double *rewards, char *why, size_t why_len)
{
    FILE *f = fopen(tmp_path, "w");
    if (!f) {
        snprintf(why, why_len, "cannot write %.120s: %s", tmp_path, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        const Prompt *p = &prompts[s[i].prompt];
        /* the prompt as it was given (special tokens included), the
         * completion as generate and serve print it (without them) */
        TokText pt = { 0 }, ct = { 0 };
        text_of(tok, s[i].seq, (size_t)s[i].n_prompt, false, &pt);
        text_of(tok, s[i].seq + s[i].n_prompt, (size_t)s[i].n_out, true, &ct);
        cJSON_AddStringToObject(o, "id", p->id);
        cJSON_AddNumberToObject(o, "index", i);
        char *q = td_json_string(pt.s, pt.len);
        cJSON_AddRawToObject(o, "prompt", q);
        td_free(q);
        q = td_json_string(ct.s, ct.len);
        cJSON_AddRawToObject(o, "completion", q);
        td_free(q);
        cJSON *ids = cJSON_AddArrayToObject(o, "ids");
        for (int j = 0; j < s[i].n_out; j++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(s[i].seq[s[i].n_prompt + j]));
        char *js = cJSON_PrintUnformatted(o);
        fprintf(f, "%s\n", js);
        cJSON_free(js);
        cJSON_Delete(o);
        tok_text_free(&pt);
        tok_text_free(&ct);
    }
    fclose(f);
    int out[2];
    if (pipe(out)) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(out[0]);
        close(out[1]);
        snprintf(why, why_len, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        int in = open(tmp_path, O_RDONLY);
        if (in < 0) _exit(126);
        dup2(in, 0);
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    size_t cap = 4096, len = 0;
    char *buf = td_malloc(cap);
    double deadline = td_now() + timeout_s;
    int rc = 0;
    for (;;) {
        double left = deadline - td_now();
        if (left <= 0) {
            snprintf(why, why_len, "timed out after %.1f s", timeout_s);
            rc = -1;
            break;
        }
        struct pollfd pf = { out[0], POLLIN, 0 };
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        if (len + 1024 > cap) {
            char *nb = td_malloc(cap * 2);
            memcpy(nb, buf, len);
            td_free(buf);
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(out[0], buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len > ((size_t)64 << 20)) {
            snprintf(why, why_len, "printed more than 64 MiB");
            rc = -1;
            break;
        }
    }
    close(out[0]);
    if (rc) kill(-pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    buf[len] = 0;
    if (rc == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
        if (WIFSIGNALED(status)) snprintf(why, why_len, "killed by signal %d", WTERMSIG(status));
        else snprintf(why, why_len, "exited with status %d", WEXITSTATUS(status));
        rc = -1;
    }
    if (rc == 0) {   /* one number per line, exactly n lines */
        char *p = buf;
        int got = 0;
        while (*p && rc == 0) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = 0;
            if (strspn(p, " \t\r") != strlen(p)) {
                char *end;
                double v = strtod(p, &end);
                while (*end == ' ' || *end == '\t' || *end == '\r') end++;
                if (end == p || *end || !isfinite(v)) {
                    snprintf(why, why_len, "line %d is not a number: \"%.40s\"", got + 1, p);
                    rc = -1;
                } else if (got < n) {
                    rewards[got++] = v;
                } else {
                    got++;
                }
            }
            if (!nl) break;
            p = nl + 1;
        }
        if (rc == 0 && got != n) {
            snprintf(why, why_len, "answered %d rewards for %d samples", got, n);
            rc = -1;
        }
    }
    td_free(buf);
    unlink(tmp_path);
    return rc;
}

/* ---------------------------------------------------------------- the run */

typedef struct {
    const RunConfig *rc;
    bool train_rank, rollout_rank, split;
    int n_train, n_rollout;      /* ranks of each kind in COMM_ALL */
    int all_rank;
    Topology topo;
    Model m, ref;                /* ref: frozen initial model when kl_coef > 0 */
    bool have_ref;
    Model q;                     /* rollout_dtype != f32: the serving model the engine runs */
    bool have_q;
    Model *gen;                  /* the model the engine runs: &m or &q */
    size_t k;                    /* experts per token */
    float *m1, *m2;
    AdamHyper adam;
    TrainActs acts;
    size_t B, T;                 /* trainer micro-batch rows, positions */
    int32_t *ids, *tg;
    float *dlogp;
    Engine eng;
    bool have_eng;
    CkptText tx;                 /* the run's tokenizer (tokenizer=, else init_from's, else byte-level) */
    Prompt *file_prompts;
    int n_file_prompts;
    int n_moe;
    int max_prompt;
    FILE *metrics;
    int64_t version;             /* updates applied to the rollout weights */
} Rl;

/* FNV-1a over nb bytes, 8 at a time (a serial multiply chain: per byte it
 * cost ~70 ms for small's 54 MB, per word ~9). */
static uint64_t hash_bytes(uint64_t h, const void *buf, size_t nb)
{
    const size_t nw = nb / 8;
    const unsigned char *p = buf;
    for (size_t i = 0; i < nw; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h = (h ^ w) * 1099511628211ULL;
    }
    for (size_t i = 8 * nw; i < nb; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* The weights the rollout side runs: the float32 slab, or q's slabs. */
static uint64_t hash_weights(const Model *m)
{
    uint64_t h = hash_bytes(1469598103934665603ULL, m->w, m->n_w * sizeof(float));
    return m->serving ? hash_bytes(h, m->packed, m->n_packed) : h;
}

/* This rank's prompts of the step: rollout rank r of G takes [r P/G, (r+1) P/G). */
static void step_prompts(Rl *r, int64_t step, int g_rank, int G, Prompt **out, int *first, int *count)
{
    const RunConfig *rc = r->rc;
    int P = rc->prompts_per_step;
    int a = (int)((int64_t)P * g_rank / G), b = (int)((int64_t)P * (g_rank + 1) / G);
    Prompt *v = td_calloc((size_t)(P > 0 ? P : 1) * sizeof(Prompt));
    for (int i = a; i < b; i++) {
        if (r->file_prompts) {
            const Prompt *src = &r->file_prompts[(size_t)((step - 1) * P + i) % (size_t)r->n_file_prompts];
            v[i] = *src;
            v[i].ids = td_malloc(src->n * sizeof(int32_t));
            memcpy(v[i].ids, src->ids, src->n * sizeof(int32_t));
        } else {
            builtin_prompt(&v[i], r->tx.tok, rc->task, (uint64_t)rc->seed, step, i, rc->max_new_tokens);
        }
    }
    *out = v;
    *first = a;
    *count = b - a;
}

static void free_prompts(Prompt *v, int n)
{
    for (int i = 0; i < n; i++) td_free(v[i].ids);
    td_free(v);
}

static void free_samples(Sample *s, int n)
{
    for (int i = 0; i < n; i++) {
        td_free(s[i].seq);
        td_free(s[i].logp);
        td_free(s[i].ref);
        td_free(s[i].routes);
    }
    td_free(s);
}

/* Generates group_size samples for prompts [first, first+count). */
static Sample *rollout(Rl *r, const Prompt *prompts, int first, int count, int64_t step, int *n_out,
                       double *tokens)
{
    const RunConfig *rc = r->rc;
    const int G = rc->group_size, n = count * G;
    Request **req = td_calloc((size_t)(n > 0 ? n : 1) * sizeof(Request *));
    GenParams gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = rc->max_new_tokens;
    gp.sp.temperature = rc->temperature;
    gp.sp.top_p = 1.0;
    gp.want_routes = true;
    if (!strcmp(rc->task, "target_length") && !rc->reward_cmd[0]) {
        gp.n_stop = 1;
        snprintf(gp.stop[0], sizeof gp.stop[0], "\n");
    }
    for (int i = 0; i < n; i++) {
        const Prompt *p = &prompts[first + i / G];
        /* per-sample seed: a function of the run seed, the step and the sample */
        gp.seed = rng_mix64((uint64_t)rc->seed ^ rng_mix64((uint64_t)step * 1000003u + (uint64_t)((first + i / G) * G + i % G)));
        req[i] = request_new(p->ids, p->n, &gp);
        int s = engine_submit(&r->eng, req[i]);
        TD_CHECK(s == 0, "rl: the engine refused a checked prompt: %s", req[i]->error);
    }
    while (engine_step(&r->eng) > 0) {}
    Sample *out = td_calloc((size_t)(n > 0 ? n : 1) * sizeof(Sample));
    const size_t per = (size_t)r->n_moe * r->k;
    for (int i = 0; i < n; i++) {
        Request *q = req[i];
        Sample *s = &out[i];
        s->prompt = first + i / G;
        s->n_prompt = (int)q->n_prompt;
        s->n_out = (int)q->n_out;
        s->seq = td_malloc((q->n_prompt + q->n_out + 1) * sizeof(int32_t));
        memcpy(s->seq, q->prompt, q->n_prompt * sizeof(int32_t));
        memcpy(s->seq + q->n_prompt, q->out, q->n_out * sizeof(int32_t));
        s->logp = td_malloc((q->n_out + 1) * sizeof(float));
        memcpy(s->logp, q->out_logp, q->n_out * sizeof(float));
        s->routes = td_malloc((q->n_out * per + 1) * sizeof(int32_t));
        if (per) memcpy(s->routes, q->routes, q->n_out * per * sizeof(int32_t));
        *tokens += (double)q->n_out;
        request_free(q);
    }
    td_free(req);
    *n_out = n;
    return out;
}

/* Rewards and group-normalised advantages.  0, or -1 when reward_cmd failed
 * (reason in why). */
static int score_samples(Rl *r, Sample *s, int n, const Prompt *prompts, char *why, size_t why_len)
{
    const RunConfig *rc = r->rc;
    double *rew = td_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int ret = 0;
    if (rc->reward_cmd[0]) {
        char tmp[1200];
        snprintf(tmp, sizeof tmp, "%s/.rewards.%d.jsonl", rc->out_dir, r->all_rank);
        ret = reward_cmd_run(rc->reward_cmd, rc->reward_timeout, r->tx.tok, s, n, prompts, tmp, rew, why, why_len);
    } else {
        TokText b = { 0 };
        for (int i = 0; i < n; i++) {
            if (!strcmp(rc->task, "target_length")) {
                rew[i] = rl_reward_target_length((size_t)s[i].n_out, prompts[s[i].prompt].target);
                continue;
            }
            ids_bytes(r->tx.tok, s[i].seq + s[i].n_prompt, (size_t)s[i].n_out, &b);
            rew[i] = rl_reward_vowels(b.s, b.len);
        }
        tok_text_free(&b);
    }
    if (ret == 0) {
        const int G = rc->group_size;
        for (int g = 0; g < n; g += G) {
            double mean = 0, var = 0;
            for (int i = g; i < g + G; i++) mean += rew[i] / G;
            for (int i = g; i < g + G; i++) var += (rew[i] - mean) * (rew[i] - mean) / G;
            double sd = sqrt(var);
            for (int i = g; i < g + G; i++) {
                s[i].reward = rew[i];
                s[i].adv = sd > 1e-8 ? (rew[i] - mean) / (sd + 1e-6) : 0.0;
            }
        }
    }
    td_free(rew);
    return ret;
}

/* Split placement: samples travel from rollout rank q to trainer rank
 * q % n_train through COMM_ALL as one int64/float stream. */
static void send_samples(Rl *r, const Sample *s, int n)
{
    const size_t per = (size_t)r->n_moe * r->k;
    size_t words = 1;
    for (int i = 0; i < n; i++) words += 6 + (size_t)(s[i].n_prompt + s[i].n_out) + 2 * (size_t)s[i].n_out + (size_t)s[i].n_out * per;
    int64_t *buf = td_malloc(words * sizeof(int64_t));
    size_t o = 0;
    buf[o++] = n;
    for (int i = 0; i < n; i++) {
        buf[o++] = s[i].prompt;
        buf[o++] = s[i].n_prompt;
        buf[o++] = s[i].n_out;
        double rw[2] = { s[i].reward, s[i].adv };
        memcpy(&buf[o], rw, 2 * sizeof(double));
        o += 2;
        buf[o++] = 0;
        for (int j = 0; j < s[i].n_prompt + s[i].n_out; j++) buf[o++] = s[i].seq[j];
        for (int j = 0; j < s[i].n_out; j++) {
            float f2[2] = { s[i].logp[j], 0 };
            memcpy(&buf[o++], f2, sizeof(int64_t));
        }
        o += (size_t)s[i].n_out;   /* room kept for the reference logprobs */
        for (size_t j = 0; j < (size_t)s[i].n_out * per; j++) buf[o++] = s[i].routes[j];
    }
    int64_t len = (int64_t)o;
    int dst = (r->all_rank - r->n_train) % r->n_train;
    comm_sendrecv(COMM_ALL, &len, sizeof len, dst, NULL, 0, -1, 7);
    comm_sendrecv(COMM_ALL, buf, (size_t)len * sizeof(int64_t), dst, NULL, 0, -1, 8);
    td_free(buf);
}

static Sample *recv_samples(Rl *r, int *n_out)
{
    const size_t per = (size_t)r->n_moe * r->k;
    Sample *all = NULL;
    int n_all = 0;
    for (int q = r->n_train; q < r->n_train + r->n_rollout; q++) {
        if ((q - r->n_train) % r->n_train != r->all_rank) continue;
        int64_t len;
        comm_sendrecv(COMM_ALL, NULL, 0, -1, &len, sizeof len, q, 7);
        int64_t *buf = td_malloc((size_t)len * sizeof(int64_t));
        comm_sendrecv(COMM_ALL, NULL, 0, -1, buf, (size_t)len * sizeof(int64_t), q, 8);
        size_t o = 0;
        int n = (int)buf[o++];
        Sample *v = td_calloc((size_t)(n_all + n + 1) * sizeof(Sample));
        if (n_all) memcpy(v, all, (size_t)n_all * sizeof(Sample));
        td_free(all);
        all = v;
        for (int i = 0; i < n; i++) {
            Sample *s = &all[n_all + i];
            s->prompt = (int)buf[o++];
            s->n_prompt = (int)buf[o++];
            s->n_out = (int)buf[o++];
            double rw[2];
            memcpy(rw, &buf[o], 2 * sizeof(double));
            o += 2;
            s->reward = rw[0];
            s->adv = rw[1];
            o++;
            s->seq = td_malloc((size_t)(s->n_prompt + s->n_out + 1) * sizeof(int32_t));
            for (int j = 0; j < s->n_prompt + s->n_out; j++) s->seq[j] = (int32_t)buf[o++];
            s->logp = td_malloc((size_t)(s->n_out + 1) * sizeof(float));
            for (int j = 0; j < s->n_out; j++) {
                float f2[2];
                memcpy(f2, &buf[o++], sizeof(int64_t));
                s->logp[j] = f2[0];
            }
            o += (size_t)s->n_out;
            s->routes = td_malloc(((size_t)s->n_out * per + 1) * sizeof(int32_t));
            for (size_t j = 0; j < (size_t)s->n_out * per; j++) s->routes[j] = (int32_t)buf[o++];
        }
        n_all += n;
        td_free(buf);
    }
    *n_out = n_all;
    return all;
}

/* Rows [b0, b0+B) of the samples into the trainer's micro-batch (padding
 * after each sequence, and empty rows past the last sample, never reach
 * the gradient: their dlogp is 0). */
static size_t fill_batch(Rl *r, const Sample *s, int n, int b0)
{
    const size_t B = r->B, T = r->T;
    size_t rows = 0;
    for (size_t row = 0; row < B; row++) {
        int i = b0 + (int)row;
        int32_t *x = r->ids + row * T, *y = r->tg + row * T;
        for (size_t t = 0; t < T; t++) x[t] = y[t] = 0;
        if (i >= n) continue;
        size_t len = (size_t)(s[i].n_prompt + s[i].n_out);
        for (size_t t = 0; t + 1 < len && t < T; t++) {
            x[t] = s[i].seq[t];
            y[t] = s[i].seq[t + 1];
        }
        rows++;
    }
    return rows;
}

typedef struct {
    double diff_max, route_bad, route_all, clip, tok, kl, loss;
    double quant_diff_max;   /* rollout_dtype != f32: max |f32 policy - behaviour (q)| logprob */
} EpochStats;

/* Exactness: the log-probabilities and routes of micro-batch mb that the
 * last forward (on the rollout's model) left in r->acts, against the
 * rollout's. */
static void check_rollout(Rl *r, const Sample *s, int n, int mb, const Model *m, EpochStats *es)
{
    const size_t B = r->B, T = r->T, k = r->k, per = (size_t)r->n_moe * k;
    for (size_t row = 0; row < B; row++) {
        const int i = mb * (int)B + (int)row;
        if (i >= n) continue;
        const Sample *q = &s[i];
        for (int j = 0; j < q->n_out; j++) {
            const size_t t = (size_t)(q->n_prompt - 1 + j);
            es->diff_max = fmax(es->diff_max, fabs((double)r->acts.logp[row * T + t] - (double)q->logp[j]));
            int mi = 0;
            for (int li = 0; li < r->topo.layer_end - r->topo.layer_begin; li++) {
                if (!m->layers[r->topo.layer_begin + li].moe) continue;
                const int32_t *tr = r->acts.la[li].topk_idx + (row * T + t) * k;
                const int32_t *ro = q->routes + (size_t)j * per + (size_t)mi * k;
                es->route_bad += memcmp(tr, ro, k * sizeof(int32_t)) != 0;
                es->route_all += 1;
                mi++;
            }
        }
    }
}

/* One PPO epoch over this rank's samples: forward, objective, backward,
 * then the dp-summed gradient, clipping and one AdamW update. */
static double ppo_epoch(Rl *r, Sample *s, int n, double total_tokens, double n_seq_total, EpochStats *es,
                        bool first_epoch, int64_t update, double lr)
{
    const RunConfig *rc = r->rc;
    Model *m = &r->m;
    const size_t B = r->B, T = r->T;
    const bool seq_mean = !strcmp(rc->loss_agg, "seq_mean");
    memset(m->g, 0, m->n_w * sizeof(float));
    int n_mb = (n + (int)B - 1) / (int)B;
    /* every dp rank runs the same number of micro-batches */
    double nm = n_mb;
    comm_allreduce_max_f64(COMM_DP, &nm, 1);
    for (int mb = 0; mb < (int)nm; mb++) {
        fill_batch(r, s, n, mb * (int)B);
        LossParts lp = { 0 };
        /* the behaviour policy first: the forward of the model the rollout
         * ran (q in low precision: the same kernels on the same weights) */
        if (first_epoch && r->have_q) {
            model_train_forward(&r->q, &r->acts, r->ids, r->tg, B * T, NULL);
            check_rollout(r, s, n, mb, &r->q, es);
        }
        model_train_forward(m, &r->acts, r->ids, r->tg, B * T, &lp);
        if (first_epoch && !r->have_q) check_rollout(r, s, n, mb, m, es);
        memset(r->dlogp, 0, B * T * sizeof(float));
        for (size_t row = 0; row < B; row++) {
            int i = mb * (int)B + (int)row;
            if (i >= n) continue;
            Sample *q = &s[i];
            const double w = seq_mean ? 1.0 / (n_seq_total * (q->n_out > 0 ? q->n_out : 1)) : 1.0 / total_tokens;
            for (int j = 0; j < q->n_out; j++) {
                size_t t = (size_t)(q->n_prompt - 1 + j);
                const float lnew = r->acts.logp[row * T + t];
                if (first_epoch && r->have_q)
                    es->quant_diff_max = fmax(es->quant_diff_max, fabs((double)lnew - (double)q->logp[j]));
                const double ratio = exp((double)lnew - (double)q->logp[j]), A = q->adv;
                const double lo = 1.0 - rc->clip_eps, hi = 1.0 + rc->clip_eps;
                const double clipped = (ratio < lo ? lo : ratio > hi ? hi : ratio) * A;
                const bool unclipped_active = ratio * A <= clipped;
                double g = unclipped_active ? -A * ratio : 0.0;
                double obj = unclipped_active ? ratio * A : clipped;
                if (!unclipped_active) es->clip += 1;
                double klt = 0;
                if (r->have_ref && rc->kl_coef > 0) {
                    const double dref = (double)q->ref[j] - (double)lnew;
                    klt = exp(dref) - dref - 1.0;
                    g += rc->kl_coef * (1.0 - exp(dref));
                }
                es->kl += klt;
                es->tok += 1;
                es->loss += w * (-obj + rc->kl_coef * klt);
                r->dlogp[row * T + t] = (float)(w * g);
            }
        }
        model_train_backward(m, &r->acts, r->tg, r->dlogp, 0.0f, 0.0f);
    }
    comm_allreduce_f32(COMM_DP, m->g, m->n_w);
    double gsq = grad_sq_norm(m);
    comm_allreduce_f64(COMM_DP, &gsq, 1);
    double gnorm = sqrt(gsq);
    const float gscale = rc->grad_clip > 0 && gnorm > rc->grad_clip ? (float)(rc->grad_clip / gnorm) : 1.0f;
    adamw_step(m, r->m1, r->m2, &r->adam, update, lr, gscale);
    model_pack(m);
    return gnorm;
}

/* Reference logprobs of every generated token (frozen initial model). */
static void ref_logprobs(Rl *r, Sample *s, int n)
{
    const size_t B = r->B, T = r->T;
    double nm = (n + (int)B - 1) / (int)B;
    comm_allreduce_max_f64(COMM_DP, &nm, 1);
    for (int i = 0; i < n; i++) s[i].ref = td_malloc((size_t)(s[i].n_out + 1) * sizeof(float));
    for (int mb = 0; mb < (int)nm; mb++) {
        fill_batch(r, s, n, mb * (int)B);
        model_train_forward(&r->ref, &r->acts, r->ids, r->tg, B * T, NULL);
        for (size_t row = 0; row < B; row++) {
            int i = mb * (int)B + (int)row;
            if (i >= n) continue;
            for (int j = 0; j < s[i].n_out; j++) s[i].ref[j] = r->acts.logp[row * T + (size_t)(s[i].n_prompt - 1 + j)];
        }
    }
}

static int rl_setup(Rl *r)
{
    const RunConfig *rc = r->rc;
    char err[512];
    int all = comm_group_size(COMM_ALL);
    r->all_rank = comm_group_rank(COMM_ALL);
    r->n_rollout = rc->rollout_ranks;
    r->split = r->n_rollout > 0;
    r->n_train = all - r->n_rollout;
    if (r->split && r->n_train < 1) {
        td_error("rl: rollout_ranks=%d leaves no trainer among %d ranks", r->n_rollout, all);
        return -1;
    }
    if (rc->tp != 1 || rc->pp != 1 || rc->ep != 1 || rc->zero) {
        td_error("rl: tandem rl trains data-parallel only (tp = pp = ep = 1, zero = 0)");
        return -1;
    }
    r->train_rank = !r->split || r->all_rank < r->n_train;
    r->rollout_rank = !r->split || !r->train_rank;
    if (r->split) comm_split_world(r->train_rank ? 0 : 1);
    int G = r->split ? r->n_rollout : r->n_train;
    if (rc->prompts_per_step % G) {
        td_error("rl: prompts_per_step=%d is not a multiple of the %d generating ranks", rc->prompts_per_step, G);
        return -1;
    }
    /* model: init_from or fresh */
    ModelConfig cfg = rc->model;
    char src[1024] = "";
    if (rc->init_from[0]) {
        if (ckpt_resolve(rc->init_from, src, sizeof src) || ckpt_read_config(src, &cfg, NULL, err, sizeof err)) {
            if (src[0]) td_error("%s", err);
            return -1;
        }
    }
    int dp = r->train_rank ? comm_size() : 1;
    if (topo_init(&r->topo, &cfg, dp, 1, 1, 1, 1, r->train_rank ? comm_rank() : 0, NULL, err, sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    if (r->train_rank && comm_setup(&r->topo)) return -1;
    comm_sync_group(r->split && (r->rollout_rank || r->all_rank == 0));
    Dtype rd = DTYPE_F32;
    dtype_parse(rc->rollout_dtype, &rd);   /* checked by the run config */
    r->k = (size_t)cfg.num_experts_per_tok;
    /* the float32 model: the trainer's, and the rollout's at rollout_dtype
     * f32; a rollout-only rank in low precision holds only q (it receives
     * q's weights at every sync) */
    if (r->train_rank || rd == DTYPE_F32) {
        model_init(&r->m, &cfg, &r->topo, r->train_rank, 16);
        if (src[0]) {
            if (ckpt_load(src, &r->m, NULL, NULL, NULL, err, sizeof err)) {
                td_error("%s", err);
                return -1;
            }
            model_pack(&r->m);
        } else {
            model_init_weights(&r->m, (uint64_t)rc->seed);
        }
    }
    r->gen = &r->m;
    if (rd != DTYPE_F32) {
        const ModelDtypes dt = model_dtypes_default(rd);
        model_init_serving(&r->q, &cfg, &r->topo, 16, &dt);
        const ServeDtypes sd = { .dtype_set = true, .dtype = rd };
        r->q.attn.kv = ckpt_serve_kv_auto(&sd);   /* as `tandem rollout --dtype` holds it by default */
        if (r->train_rank) model_quantize_from(&r->q, &r->m);
        r->have_q = true;
        r->gen = &r->q;
    }
    for (int l = 0; l < cfg.num_hidden_layers; l++) r->n_moe += config_layer_is_moe(&cfg, l);

    /* the tokenizer: tokenizer=, else init_from's, else byte-level */
    const char *tsrc = rc->tokenizer[0] ? rc->tokenizer : src[0] ? src : NULL;
    if (tsrc ? ckpt_open_text(tsrc, rc->tokenizer[0] != 0, &r->tx, err, sizeof err) : 0) {
        td_error("rl: %s", err);
        return -1;
    }
    if (!tsrc) r->tx.tok = tok_byte_level();
    if (r->tx.files.tokenizer_json && tok_vocab_size(r->tx.tok) > cfg.vocab_size) {
        td_error("rl: the tokenizer has %d ids, more than the model's vocab_size %d", tok_vocab_size(r->tx.tok),
                 cfg.vocab_size);
        return -1;
    }

    /* prompts and the longest sequence */
    int bmax = 0, blen = 0;
    if (!rc->prompts[0]) {
        if (builtin_extent(rc->task, r->tx.tok, rc->max_new_tokens, &bmax, &blen, err, sizeof err)) {
            td_error("rl: built-in prompts: %s", err);
            return -1;
        }
        if (bmax >= cfg.vocab_size) {
            td_error("rl: the built-in %s prompts are text, %s up to %d, outside the model's vocabulary "
                     "(vocab_size %d); give prompts=FILE with prompt_ids",
                     rc->task, tok_is_byte_level(r->tx.tok) ? "byte tokens" : "token ids", bmax, cfg.vocab_size);
            return -1;
        }
    }
    r->max_prompt = td_max(24, (size_t)blen);   /* built-in prompts are short */
    if (rc->prompts[0]) {
        if (load_prompts(rc->prompts, r->tx.tok, cfg.vocab_size, cfg.max_position_embeddings - 1, &r->file_prompts,
                         &r->n_file_prompts))
            return -1;
        r->max_prompt = 1;
        for (int i = 0; i < r->n_file_prompts; i++)
            if ((int)r->file_prompts[i].n > r->max_prompt) r->max_prompt = (int)r->file_prompts[i].n;
    }
    if (r->max_prompt + rc->max_new_tokens > cfg.max_position_embeddings) {
        td_error("rl: prompts of up to %d tokens + max_new_tokens %d exceed max_position_embeddings %d",
                 r->max_prompt, rc->max_new_tokens, cfg.max_position_embeddings);
        return -1;
    }
    r->T = (size_t)(r->max_prompt + rc->max_new_tokens);
    r->B = (size_t)rc->micro_batch;
    r->adam = (AdamHyper){ rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay };
    if (r->train_rank) {
        r->m1 = td_calloc(r->m.n_w * sizeof(float));
        r->m2 = td_calloc(r->m.n_w * sizeof(float));
        Recompute mode = !strcmp(rc->recompute, "selective") ? RECOMPUTE_SELECTIVE : RECOMPUTE_NONE;
        model_train_acts_init(&r->acts, &r->m, r->B, r->T, mode);
        r->ids = td_malloc(r->B * r->T * sizeof(int32_t));
        r->tg = td_malloc(r->B * r->T * sizeof(int32_t));
        r->dlogp = td_malloc(r->B * r->T * sizeof(float));
        if (rc->kl_coef > 0) {   /* the frozen reference: the initial policy */
            model_init(&r->ref, &cfg, &r->topo, false, 16);
            memcpy(r->ref.w, r->m.w, r->m.n_w * sizeof(float));
            model_pack(&r->ref);
            r->have_ref = true;
        }
    }
    if (r->rollout_rank) {
        int gen = r->split ? r->n_rollout : r->n_train;
        size_t n_req = (size_t)(rc->prompts_per_step / gen) * (size_t)rc->group_size;
        EngineOpts eo;
        engine_opts_default(&eo);
        eo.max_running = n_req > 0 ? n_req : 1;
        eo.max_queue = eo.max_running + 1;
        eo.max_batch_tokens = td_max(512, eo.max_running);
        size_t per_seq = (size_t)kvcache_blocks_for(&(KvCache){ .bs = r->gen->attn.bs }, r->T + 1) + 1;
        eo.kv_budget_bytes = td_max((size_t)8 << 20, eo.max_running * per_seq * attn_block_bytes(&r->gen->attn) *
                                                          (size_t)cfg.num_hidden_layers);
        eo.tok = r->tx.tok;
        eo.stop_ids = r->tx.stop_ids;
        eo.n_stop_ids = r->tx.n_stop_ids;
        engine_init(&r->eng, r->gen, &eo);
        r->have_eng = true;
    }
    if (r->all_rank == 0) {
        struct stat st;
        if (stat(rc->out_dir, &st) != 0 && mkdir(rc->out_dir, 0755) != 0) {
            td_error("rl: cannot create out_dir %s: %s", rc->out_dir, strerror(errno));
            return -1;
        }
        char path[1100];
        snprintf(path, sizeof path, "%.1000s/metrics.jsonl", rc->out_dir);
        r->metrics = fopen(path, "w");
        if (!r->metrics) {
            td_error("rl: cannot write %s", path);
            return -1;
        }
    }
    return 0;
}

static void rl_free(Rl *r)
{
    if (r->metrics) fclose(r->metrics);
    if (r->have_eng) engine_free(&r->eng);
    if (r->train_rank) {
        model_train_acts_free(&r->acts);
        td_free(r->ids);
        td_free(r->tg);
        td_free(r->dlogp);
        td_free(r->m1);
        td_free(r->m2);
    }
    if (r->have_ref) model_free(&r->ref);
    if (r->have_q) model_free(&r->q);
    model_free(&r->m);
    if (r->file_prompts) free_prompts(r->file_prompts, r->n_file_prompts);
    ckpt_text_free(&r->tx);
}

/* Weights to the rollout side.  updated: after a step's updates, when a
 * low-precision q is re-quantized from the float32 weights first (every
 * trainer rank: they all check the rollout with q).  Split placement: one
 * broadcast over COMM_SYNC from trainer rank 0, whose dp-replicated weights
 * are the whole model -- q's slabs in low precision, else the float32
 * weights, repacked on arrival.  Returns the seconds of the re-quantizing,
 * the broadcast and the repacking; *equal: every rollout rank's weights
 * hash like the trainer's. */
static double sync_weights(Rl *r, bool updated, bool *equal)
{
    *equal = true;
    double tq = td_now();
    if (updated && r->have_q && r->train_rank) model_quantize_from(&r->q, &r->m);
    tq = td_now() - tq;
    if (!r->split) {
        double v = tq;
        comm_allreduce_max_f64(COMM_ALL, &v, 1);
        return v;
    }
    bool member = r->rollout_rank || r->all_rank == 0;
    double t0 = 0, dt = 0;
    if (member) {
        comm_barrier(COMM_SYNC);   /* time the transfer, not the wait for the trainers */
        t0 = td_now();
        Model *g = r->gen;
        comm_bcast(COMM_SYNC, g->w, g->n_w * sizeof(float), 0);
        if (r->have_q) comm_bcast(COMM_SYNC, g->packed, g->n_packed, 0);
        else if (r->rollout_rank) model_pack(g);   /* the engine's forward reads packed weights */
        dt = td_now() - t0;
        /* the check that both sides hold the same bits, not timed */
        uint64_t h = hash_weights(g);
        double hv[4] = { (double)(h >> 32), (double)(h & 0xffffffffu), -(double)(h >> 32), -(double)(h & 0xffffffffu) };
        comm_allreduce_max_f64(COMM_SYNC, hv, 4);
        *equal = hv[0] == -hv[2] && hv[1] == -hv[3];
    }
    double v[2] = { dt + tq, *equal ? 0.0 : 1.0 };
    comm_allreduce_max_f64(COMM_ALL, v, 2);
    *equal = v[1] == 0.0;
    return v[0];
}

/* Bytes one split-placement sync broadcasts. */
static size_t sync_bytes(const Rl *r)
{
    if (!r->split) return 0;
    return r->gen->n_w * sizeof(float) + (r->have_q ? r->gen->n_packed : 0);
}

static int rl_save(Rl *r, int64_t step)
{
    if (!r->train_rank) return 0;
    const RunConfig *rc = r->rc;
    char name[64], path[1200];
    snprintf(name, sizeof name, "step_%08lld.h5", (long long)step);
    snprintf(path, sizeof path, "%s/%s", rc->out_dir, name);
    CkptState st;
    memset(&st, 0, sizeof st);
    st.step = step;
    st.beta1 = rc->beta1;
    st.beta2 = rc->beta2;
    st.adam_eps = rc->adam_eps;
    st.weight_decay = rc->weight_decay;
    st.adam_step = step * rc->ppo_epochs;
    st.run_config = rc->json;
    st.tok = r->tx.files;   /* the run's tokenizer goes with every checkpoint (borrowed) */
    if (ckpt_save(path, &r->m, r->m1, r->m2, &st, CKPT_F32)) return -1;
    if (comm_rank() == 0 && ckpt_set_latest(rc->out_dir, name)) return -1;
    return 0;
}

static int rl_run(const RunConfig *rc)
{
    Rl r;
    memset(&r, 0, sizeof r);
    r.rc = rc;
    int ret = 1;
    if (rl_setup(&r)) goto out;
    bool eq;
    double sync0 = sync_weights(&r, false, &eq);   /* same start on both sides */
    if (r.all_rank == 0)
        td_info("rl: task %s, %d prompts x %d samples per step, %d steps, %s (%d trainer, %d rollout ranks), "
                "initial weight sync %.3f s",
                rc->reward_cmd[0] ? "reward_cmd" : rc->task, rc->prompts_per_step, rc->group_size, rc->steps,
                r.split ? "split" : "colocated", r.n_train, r.split ? r.n_rollout : r.n_train, sync0);
    const int gen = r.split ? r.n_rollout : r.n_train;
    const int g_rank = r.split ? r.all_rank - r.n_train : r.all_rank;
    int64_t updates = 0;
    bool tty = isatty(2) && r.all_rank == 0;
    for (int64_t step = 1; step <= rc->steps; step++) {
        double t0 = td_now();
        Sample *s = NULL;
        int n = 0;
        double gen_tok = 0, t_roll = 0;
        int failed = 0;
        char why[256] = "";
        Prompt *prompts = NULL;
        int first = 0, count = 0;
        if (r.rollout_rank) {
            step_prompts(&r, step, g_rank, gen, &prompts, &first, &count);
            s = rollout(&r, prompts, first, count, step, &n, &gen_tok);
            t_roll = td_now() - t0;
            if (score_samples(&r, s, n, prompts, why, sizeof why)) {
                td_error("rl: step %lld: reward_cmd: %s", (long long)step, why);
                failed = 1;
            }
        }
        /* every rank learns whether some reward failed, and the rewards */
        double red[6] = { failed, 0, 0, 0, gen_tok, 0 };
        for (int i = 0; i < n && r.rollout_rank; i++) {
            red[1] += s[i].reward;
            red[2] += s[i].reward * s[i].reward;
            red[3] += 1;
        }
        comm_allreduce_f64(COMM_ALL, red, 5);
        double tmax = t_roll;
        comm_allreduce_max_f64(COMM_ALL, &tmax, 1);
        double rmean = red[3] ? red[1] / red[3] : 0, rstd = red[3] ? sqrt(fmax(0, red[2] / red[3] - rmean * rmean)) : 0;
        if (red[0] > 0) {
            if (prompts) free_prompts(prompts, rc->prompts_per_step);
            free_samples(s, n);
            if (!strcmp(rc->reward_on_error, "stop")) {
                if (r.all_rank == 0) td_error("rl: stopping at step %lld (reward_on_error=stop)", (long long)step);
                ret = 1;
                goto out;
            }
            if (r.metrics) {
                fprintf(r.metrics, "{\"step\":%lld,\"skipped\":\"reward_cmd failed\",\"policy_version\":%lld}\n",
                        (long long)step, (long long)updates);
                fflush(r.metrics);
            }
            continue;
        }
        if (r.split) {
            if (r.rollout_rank) {
                send_samples(&r, s, n);
                free_samples(s, n);
                s = NULL;
                n = 0;
            } else {
                s = recv_samples(&r, &n);
            }
        }
        double t1 = td_now();
        EpochStats es = { 0 };
        double gnorm = 0, lr = 0, train_tok = 0;
        if (r.train_rank) {
            double tot[2] = { 0, (double)n };
            for (int i = 0; i < n; i++) tot[0] += s[i].n_out;
            comm_allreduce_f64(COMM_DP, tot, 2);
            if (r.have_ref) ref_logprobs(&r, s, n);
            for (int e = 0; e < rc->ppo_epochs; e++) {
                lr = lr_schedule(rc->lr, rc->min_lr, rc->warmup_steps, rc->steps * rc->ppo_epochs,
                                 !strcmp(rc->lr_schedule, "cosine"), updates);
                EpochStats ee = { 0 };
                gnorm = ppo_epoch(&r, s, n, tot[0] > 0 ? tot[0] : 1, tot[1] > 0 ? tot[1] : 1, &ee, e == 0, ++updates, lr);
                /* exactness from the first epoch (ratio 1 by construction),
                 * clipping and KL from the last */
                if (e == 0) es = ee;
                es.clip = ee.clip;
                es.kl = ee.kl;
            }
            double sums[5] = { es.route_bad, es.route_all, es.clip, es.tok, es.kl };
            comm_allreduce_f64(COMM_DP, sums, 5);
            comm_allreduce_max_f64(COMM_DP, &es.diff_max, 1);
            comm_allreduce_max_f64(COMM_DP, &es.quant_diff_max, 1);
            double l = es.loss;
            comm_allreduce_f64(COMM_DP, &l, 1);
            es.loss = l;
            es.route_bad = sums[0];
            es.route_all = sums[1];
            es.clip = sums[2];
            es.tok = sums[3];
            es.kl = sums[4];
            train_tok = es.tok;
        } else {
            updates += rc->ppo_epochs;
        }
        double t_train = td_now() - t1;
        double sync_s = sync_weights(&r, true, &eq);
        /* new weights: the prefix cache holds the old ones' keys and values */
        if (r.have_eng) engine_set_weights_version(&r.eng, r.eng.o.weights_version + 1);
        if (r.metrics) {
            double rt = tmax > 0 ? red[4] / tmax : 0;
            EngineStats est = { 0 };   /* this rank's engine (none: a trainer-only rank 0 under split) */
            if (r.have_eng) engine_stats(&r.eng, &est);
            fprintf(r.metrics,
                    "{\"step\":%lld,\"loss\":%.9g,\"reward_mean\":%.6f,\"reward_std\":%.6f,\"kl\":%.6g,"
                    "\"clip_frac\":%.6f,\"logprob_diff_max\":%.9g,\"routing_mismatch\":%.9g,\"lr\":%.6e,"
                    "\"grad_norm\":%.6f,\"samples\":%.0f,\"rollout_tokens\":%.0f,\"rollout_tokens_per_s\":%.1f,"
                    "\"train_tokens_per_s\":%.1f,\"sync_s\":%.6f,\"sync_bytes\":%zu,\"weights_equal\":%s,"
                    "\"policy_version\":%lld,\"rollout_dtype\":\"%s\",\"quant_logprob_diff_max\":%.9g,\"step_s\":%.3f,"
                    "\"prefix_hit_tokens\":%ld,\"prefix_query_tokens\":%ld}\n",
                    (long long)step, es.loss, rmean, rstd, es.tok ? es.kl / es.tok : 0.0,
                    es.tok ? es.clip / es.tok : 0.0, es.diff_max, es.route_all ? es.route_bad / es.route_all : 0.0,
                    lr, gnorm, red[3], red[4], rt, t_train > 0 ? train_tok * rc->ppo_epochs / t_train : 0.0,
                    sync_s, sync_bytes(&r), eq ? "true" : "false",
                    (long long)(updates - rc->ppo_epochs), rc->rollout_dtype, es.quant_diff_max, td_now() - t0,
                    est.prefix_hit_tokens, est.prefix_query_tokens);
            fflush(r.metrics);
        }
        if (r.all_rank == 0 && (tty || step % rc->log_every == 0 || step == rc->steps))
            fprintf(stderr, "%srl step %lld/%d reward %.4f (sd %.3f) | logprob diff %.1e routing mismatch %.1e | "
                            "kl %.4f clip %.3f | rollout %.0f tok/s%s",
                    tty ? "\r" : "", (long long)step, rc->steps, rmean, rstd, es.diff_max,
                    es.route_all ? es.route_bad / es.route_all : 0.0, es.tok ? es.kl / es.tok : 0.0,
                    es.tok ? es.clip / es.tok : 0.0, tmax > 0 ? red[4] / tmax : 0.0, tty ? "\033[K" : "\n");
        if (prompts) free_prompts(prompts, rc->prompts_per_step);
        free_samples(s, n);
        if (rc->save_every > 0 && step % rc->save_every == 0 && step < rc->steps && rl_save(&r, step)) goto out;
    }
    if (tty) fprintf(stderr, "\n");
    if (rl_save(&r, rc->steps)) goto out;
    ret = 0;
out:
    rl_free(&r);
    return ret;
}

int cmd_rl(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: tandem rl RUN.json [key=value ...]\n"
               "       mpirun -np N tandem rl RUN.json [rollout_ranks=R]\n"
               "GRPO: rollouts with the inference engine, rewards (task=vowels|target_length,\n"
               "prompts=FILE, reward_cmd=CMD), clipped-ratio updates; reports per step\n"
               "reward_mean, logprob_diff_max and routing_mismatch (0 when rollout and trainer\n"
               "agree bit for bit) and more in OUT_DIR/metrics.jsonl.  docs/rl.md\n");
        return argc < 2 ? 2 : 0;
    }
    const char *path = strchr(argv[1], '=') ? NULL : argv[1];
    int first = path ? 2 : 1;
    RunConfig rc;
    char err[512];
    td_errors_rank0_only = 1;
    if (runcfg_load(&rc, path, argc - first, argv + first, err, sizeof err)) {
        td_error("%s", err);
        runcfg_free(&rc);
        return 2;
    }
    if (rc.threads > 0) pool_init(rc.threads);
    signal(SIGPIPE, SIG_IGN);
    int ret = rl_run(&rc);
    runcfg_free(&rc);
    return ret;
}

/* infer/rollout_cmd.c - `tandem rollout`: the RL rollout worker.
 *
 * Reads prompts (JSONL), samples n completions of each through the
 * continuous-batching engine (infer/engine.h) on this thread, and writes one
 * JSON line per sample as it finishes, with everything a trainer needs to
 * score it again: the token ids, the model's log-probability of each
 * generated token, the policy version (checkpoint step) and the experts
 * each token was routed to.  `tandem score --rollout` (rl/rlcheck.h)
 * recomputes both with the training forward; they agree bit for bit.
 *
 * Unlike generate and serve, a stop string that ends a sample stays in its
 * ids (GenParams.keep_stop): every sampled token is there with its
 * log-probability and routes, so the trainer also sees the decision to stop.
 *
 * Seeds.  Sample j of prompt i (both counted from 0) draws with the seed
 *     seed + 1000003 * i + j        (uint64, wrapping)
 * recorded in the sample, so one sample can be regenerated alone
 * (`tandem generate --seed`), and the output does not depend on the batch.
 *
 * --follow DIR.  DIR/latest is read (readlink, a syscall) after every
 * engine step.  When it names a new checkpoint, admission is held
 * (engine_hold): requests already admitted run to their end under the
 * weights they started with, new ones wait; once none is left the new
 * weights are loaded into the same Model, the version is updated and
 * admission resumes.  So every sample is generated under one version, the
 * one it carries, and none is dropped or repeated.  A failed load (a file
 * pruned under us, a read error) is retried at the next poll with a
 * warning while admission stays held; a checkpoint of another model
 * config is an error.
 */
#include "infer/infer_cmd.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "core/args.h"
#include "core/common.h"
#include "core/model/config.h"
#include "core/pool.h"
#include "infer/engine.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const g_rollout_help =
    "usage: tandem rollout (--ckpt CKPT | --follow DIR) --prompts P.jsonl [--n 1]\n"
    "                      [--output OUT.jsonl] [--max-tokens 64] [--temperature 1]\n"
    "                      [--top-k 0] [--top-p 1] [--seed 0] [--stop STR ...] [--ignore-eos]\n"
    "                      [--kv-mb 256] [--max-running 64] [--max-batch-tokens 512]\n"
    "                      [--prefill-chunk 256] [--wait-timeout 60] [--no-prefix-cache]\n"
    "                      [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8] [--expert-cache-mb N]\n"
    "RL rollout worker.  Each line of P.jsonl is an object with \"prompt\" (text,\n"
    "encoded by the checkpoint's tokenizer as HF's tokenizer(text) does; byte-level\n"
    "when the checkpoint holds none) or \"prompt_ids\" (token ids), and optionally\n"
    "\"id\" (string or number; default: the prompt's index from 0).  The whole\n"
    "file is checked before anything is generated.  Every prompt gets --n\n"
    "samples; sample j of prompt i uses the seed  seed + 1000003 * i + j.\n"
    "Output (stdout or --output), one JSON object per line per sample, in order\n"
    "of completion (sort by id and sample):\n"
    "  id, sample, prompt_ids, ids (generated), text, logprobs (one per id, the\n"
    "  model's log_softmax at temperature 1, printed with 9 significant digits so\n"
    "  it reads back as the same float32), finish_reason (\"length\" | \"stop\";\n"
    "  unlike generate/serve, ids and text keep the stop string, and ids the\n"
    "  model's end-of-turn id: every sampled token is there with its\n"
    "  log-probability),\n"
    "  policy_version (step of the checkpoint that generated it), seed,\n"
    "  routes: [n_ids][n_moe_layers][k] expert ids; routes[j] are the experts\n"
    "  chosen (in top-k order) in each MoE layer, in layer order, at the\n"
    "  position whose logits sampled ids[j] (position len(prompt_ids) - 1 + j).\n"
    "--follow DIR serves the checkpoint DIR/latest names (waiting up to\n"
    "--wait-timeout seconds for one) and reloads when latest changes: running\n"
    "samples finish under the old weights, later ones use the new, each tagged\n"
    "with its policy_version.  --dtype / --kv-dtype hold the weights (each reload\n"
    "quantized the same way) and the KV cache in that dtype (docs/serving.md);\n"
    "--expert-cache-mb N the routed experts in a cache of N MiB (the same samples).\n"
    "The --n samples of a prompt share its cached KV blocks (computed once; the\n"
    "same bits as without); --no-prefix-cache computes each anew.\n"
    "Check a rollout with the trainer's forward (the same dtypes):\n"
    "  tandem score --rollout OUT.jsonl --ckpt CKPT|RUN_DIR [--dtype D --kv-dtype D]\n";

#define ROLLOUT_SEED_STRIDE 1000003ULL

/* ---------------------------------------------------------------- prompts */

typedef struct {
    int32_t *ids;     /* owned */
    size_t n;
    char *text;       /* owned: a "prompt" text until prompts_encode, else NULL */
    char *id_json;    /* owned: JSON text of the id */
    long line;        /* in the prompts file, from 1 */
} Prompt;

static void prompts_free(Prompt *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        td_free(p[i].ids);
        td_free(p[i].text);
        td_free(p[i].id_json);
    }
    td_free(p);
}

/* One line of the prompts file -> p.  Returns 0, or -1 with the reason in err. */
static int prompt_parse(Prompt *p, const char *line, size_t len, size_t index, char *err, size_t n)
{
    cJSON *o = cJSON_ParseWithLength(line, len);
    int rc = -1;
    if (!o || !cJSON_IsObject(o)) {
        snprintf(err, n, "not a JSON object");
        goto out;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *pi = cJSON_GetObjectItemCaseSensitive(o, "prompt_ids");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (!!pt == !!pi) {
        snprintf(err, n, "needs exactly one of \"prompt\" (text) and \"prompt_ids\" (array of token ids)");
        goto out;
    }
    if (pt) {
        if (!cJSON_IsString(pt)) {
            snprintf(err, n, "\"prompt\" must be a string");
            goto out;
        }
        if (!pt->valuestring[0]) {
            snprintf(err, n, "the prompt is empty");
            goto out;
        }
        p->text = td_strdup(pt->valuestring);   /* encoded once the tokenizer is known */
    } else {
        if (!cJSON_IsArray(pi)) {
            snprintf(err, n, "\"prompt_ids\" must be an array of token ids");
            goto out;
        }
        size_t l = (size_t)cJSON_GetArraySize(pi), k = 0;
        p->ids = td_malloc((l ? l : 1) * sizeof(int32_t));
        const cJSON *e;
        cJSON_ArrayForEach(e, pi)
        {
            double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
            if (!(v >= 0 && v <= INT32_MAX && v == (double)(int32_t)v)) {
                snprintf(err, n, "\"prompt_ids\" must hold non-negative integers (element %zu)", k);
                goto out;
            }
            p->ids[k++] = (int32_t)v;
        }
        p->n = k;
    }
    if (!p->text && p->n == 0) {
        snprintf(err, n, "the prompt is empty");
        goto out;
    }
    if (id && !cJSON_IsString(id) && !cJSON_IsNumber(id)) {
        snprintf(err, n, "\"id\" must be a string or a number");
        goto out;
    }
    if (id) {
        char *s = cJSON_PrintUnformatted(id);
        p->id_json = td_strdup(s);
        cJSON_free(s);
    } else {
        char s[32];
        snprintf(s, sizeof s, "%zu", index);
        p->id_json = td_strdup(s);
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* Parses the whole file (syntax only; the model's limits are checked by
 * prompts_check).  Blank lines are skipped.  Returns 0, or -1 with one
 * line in err naming the line. */
static int prompts_read(const char *path, Prompt **out, size_t *n_out, char *err, size_t n)
{
    size_t len;
    char *buf = NULL;
    int got = td_read_file(path, 0, &buf, &len, err, n);
    if (got) {
        if (got > 0) snprintf(err, n, "cannot open %s: %s", path, strerror(ENOENT));
        return -1;
    }
    size_t cap = 64, np = 0;
    Prompt *p = td_calloc(cap * sizeof(Prompt));
    long line = 0;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t j = i;
        while (j < len && buf[j] != '\n') j++;
        line++;
        size_t k = i;
        while (k < j && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r')) k++;
        if (k < j) {
            if (np == cap) {
                Prompt *q = td_calloc(2 * cap * sizeof(Prompt));
                memcpy(q, p, np * sizeof(Prompt));
                td_free(p);
                p = q;
                cap *= 2;
            }
            char why[256];
            p[np].line = line;
            if (prompt_parse(&p[np], buf + i, j - i, np, why, sizeof why)) {
                snprintf(err, n, "%s:%ld: %s", path, line, why);
                rc = -1;
            }
            np++;
        }
        i = j + 1;
    }
    td_free(buf);
    if (rc == 0 && np == 0) {
        snprintf(err, n, "%s: no prompts", path);
        rc = -1;
    }
    if (rc) {
        prompts_free(p, np);
        return -1;
    }
    *out = p;
    *n_out = np;
    return 0;
}

/* The "prompt" texts to ids with the checkpoint's tokenizer (HF's
 * tokenizer(text): special tokens as HF adds them).  0, or -1 with err. */
static int prompts_encode(Prompt *p, size_t np, const Tokenizer *tok, const char *path, char *err, size_t n)
{
    for (size_t i = 0; i < np; i++) {
        if (!p[i].text) continue;
        TokIds v = { 0 };
        char why[256];
        if (tok_encode(tok, p[i].text, strlen(p[i].text), true, &v, why, sizeof why)) {
            snprintf(err, n, "%s:%ld: %s", path, p[i].line, why);
            return -1;
        }
        p[i].ids = v.ids;
        p[i].n = v.n;
        td_free(p[i].text);
        p[i].text = NULL;
    }
    return 0;
}

/* The prompts against the model and the cache, all before anything is
 * generated: what the engine would refuse at submit (engine_check: ids in
 * the vocabulary, the prompt shorter than the context, prompt plus
 * generation within the whole KV cache). */
static int prompts_check(const Prompt *p, size_t np, const Engine *e, int max_tokens, const char *path,
                         char *err, size_t n)
{
    for (size_t i = 0; i < np; i++) {
        char why[256];
        EngineRefusal r = engine_check(e, p[i].ids, p[i].n, max_tokens, why, sizeof why);
        if (r != ENGINE_OK) {
            snprintf(err, n, "%s:%ld: %s%s", path, p[i].line, why, r == ENGINE_NO_ROOM ? " (raise --kv-mb)" : "");
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- output */

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void buf_reserve(Buf *b, size_t more)
{
    if (b->n + more + 1 <= b->cap) return;
    size_t cap = td_max(2 * b->cap, b->n + more + 1);
    char *s = td_malloc(cap);
    if (b->n) memcpy(s, b->s, b->n);
    td_free(b->s);
    b->s = s;
    b->cap = cap;
}

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    buf_reserve(b, (size_t)k);
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static void buf_ids(Buf *b, const int32_t *ids, size_t n)
{
    buf_printf(b, "[");
    for (size_t i = 0; i < n; i++) buf_printf(b, i ? ",%d" : "%d", ids[i]);
    buf_printf(b, "]");
}

/* ---------------------------------------------------------------- the worker */

typedef struct Rollout Rollout;

typedef struct {
    Rollout *ro;
    size_t prompt, sample;
    uint64_t seed;
    int64_t version;          /* -1 until its first token */
    Request *r;               /* owned while in flight */
} Job;

struct Rollout {
    Model m;
    ServeDtypes sd;            /* --dtype, --kv-dtype */
    Engine e;
    CkptText tx;              /* the tokenizer and stop ids of the first checkpoint */
    bool have_model, have_engine;
    int64_t version;          /* of the weights in m */
    /* --follow */
    const char *dir;
    char loaded[PATH_MAX];    /* latest's target when the weights were loaded */
    char wanted[PATH_MAX];    /* latest's target now */
    double fail_since;        /* first failed load of `wanted`, 0 if none */
    bool held;                /* admission held for a swap */
    double wait_timeout;
    /* output */
    const Prompt *prompts;
    Job *jobs;
    size_t n_jobs, n_done, tokens;
    Job **finished;           /* done in the current step, freed after it */
    size_t n_finished;
    FILE *out;
    bool out_failed;
    Buf line;
    char failed[600];          /* the first sample the engine ended with an error (an unreadable expert) */
    int64_t *versions;        /* distinct versions written (owned) ... */
    long *version_count;      /* ... and samples of each */
    int n_versions, cap_versions;
    bool progress;
    double t0, t_progress;
};

static void note_version(Rollout *ro, int64_t v)
{
    for (int i = 0; i < ro->n_versions; i++)
        if (ro->versions[i] == v) {
            ro->version_count[i]++;
            return;
        }
    if (ro->n_versions == ro->cap_versions) {
        int cap = ro->cap_versions ? 2 * ro->cap_versions : 16;
        int64_t *nv = td_malloc((size_t)cap * sizeof *nv);
        long *nc = td_malloc((size_t)cap * sizeof *nc);
        if (ro->n_versions) {
            memcpy(nv, ro->versions, (size_t)ro->n_versions * sizeof *nv);
            memcpy(nc, ro->version_count, (size_t)ro->n_versions * sizeof *nc);
        }
        td_free(ro->versions);
        td_free(ro->version_count);
        ro->versions = nv;
        ro->version_count = nc;
        ro->cap_versions = cap;
    }
    ro->versions[ro->n_versions] = v;
    ro->version_count[ro->n_versions++] = 1;
}

static void write_sample(Rollout *ro, const Job *j)
{
    const Request *r = j->r;
    const Prompt *p = &ro->prompts[j->prompt];
    Buf *b = &ro->line;
    b->n = 0;
    buf_printf(b, "{\"id\":%s,\"sample\":%zu,\"prompt_ids\":", p->id_json, j->sample);
    buf_ids(b, p->ids, p->n);
    buf_printf(b, ",\"ids\":");
    buf_ids(b, r->out, r->n_out);
    buf_printf(b, ",\"text\":");
    char *text = td_json_string(r->text.s, r->text.len);
    buf_printf(b, "%s", text);
    td_free(text);
    buf_printf(b, ",\"logprobs\":[");
    for (size_t i = 0; i < r->n_out; i++) buf_printf(b, i ? ",%.9g" : "%.9g", (double)r->out_logp[i]);
    buf_printf(b, "],\"finish_reason\":\"%s\",\"policy_version\":%lld,\"seed\":%llu,\"routes\":[",
               r->finish_reason, (long long)j->version, (unsigned long long)j->seed);
    const size_t nm = (size_t)ro->e.n_moe, k = ro->m.k;
    for (size_t i = 0; i < r->n_out; i++) {
        buf_printf(b, i ? ",[" : "[");
        for (size_t l = 0; l < nm; l++) {
            buf_printf(b, l ? "," : "");
            buf_ids(b, r->routes + (i * nm + l) * k, k);
        }
        buf_printf(b, "]");
    }
    buf_printf(b, "]}\n");
    if (!ro->out_failed && (fwrite(b->s, 1, b->n, ro->out) != b->n || fflush(ro->out) != 0))
        ro->out_failed = true;
}

/* Engine callback, on this thread, inside engine_step.  Weights are only
 * swapped when no admitted request is left, so the version seen at a
 * request's first callback is the one of all its tokens; the request is
 * written when done and freed after the step (the engine still holds it
 * during the callback). */
static void job_cb(Request *r, bool done, void *user)
{
    Job *j = user;
    Rollout *ro = j->ro;
    if (j->version < 0) j->version = ro->version;
    TD_CHECK(j->version == ro->version, "rollout: request %zu/%zu saw versions %lld and %lld", j->prompt,
             j->sample, (long long)j->version, (long long)ro->version);
    if (!done) return;
    if (!strcmp(r->finish_reason, "error")) {   /* not the model's sample: never written */
        if (!ro->failed[0]) snprintf(ro->failed, sizeof ro->failed, "%s", r->error);
        ro->finished[ro->n_finished++] = j;
        return;
    }
    ro->tokens += r->n_out;
    ro->n_done++;
    note_version(ro, j->version);
    write_sample(ro, j);
    ro->finished[ro->n_finished++] = j;
}

/* ---------------------------------------------------------------- loading */

/* DIR/latest's target into out (a name inside DIR, or an absolute path);
 * false when there is none (yet). */
static bool latest_target(const char *dir, char *out, size_t n)
{
    char link[PATH_MAX];
    if (td_snprintf(link, sizeof link, "%s/latest", dir)) return false;   /* refused at start-up */
    ssize_t k = readlink(link, out, n - 1);
    if (k < 0) return false;
    out[k] = 0;
    return true;
}

/* The file latest's target names, into out (TARGET_PATH_MAX: the
 * directory, checked at start-up, and a readlink result always fit). */
#define TARGET_PATH_MAX (2 * PATH_MAX)
static void target_path(const Rollout *ro, const char *target, char *out, size_t n)
{
    int cut = target[0] == '/' ? td_snprintf(out, n, "%s", target) : td_snprintf(out, n, "%s/%s", ro->dir, target);
    TD_CHECK(!cut, "rollout: %s/%s does not fit %zu bytes", ro->dir, target, n);
}

/* First load: config, model, packed weights.  Returns 0 or -1 with err. */
static int load_first(Rollout *ro, const char *file, char *err, size_t n)
{
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(file, &cfg, &meta, err, n)) return -1;
    if (ckpt_open_serving(file, &ro->m, NULL, &ro->sd, err, n)) return -1;
    ro->have_model = true;
    ro->version = meta.step;
    return 0;
}

/* New weights into the model the engine runs (no request admitted).
 * Returns 0, -1 to retry later (the reason in err), -2 on a config
 * mismatch (error printed). */
static int reload(Rollout *ro, const char *file, char *err, size_t n)
{
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(file, &cfg, &meta, err, n)) return -1;
    char *a = config_to_json(&cfg), *b = config_to_json(&ro->m.cfg);
    bool same = !strcmp(a, b);
    td_free(a);
    td_free(b);
    if (!same) {
        td_error("rollout: %s has another model config than the one being served; restart the worker", file);
        return -2;
    }
    if (ckpt_load_serving(file, &ro->m, err, n)) {
        /* the weights may be zeroed now: forget what is loaded, so that
         * admission stays held until a load succeeds, even if latest moves
         * back to the previous checkpoint */
        ro->loaded[0] = 0;
        return -1;
    }
    ro->version = meta.step;
    return 0;
}

/* --follow start-up: waits for DIR/latest and loads it.  0 or -1 (printed). */
static int follow_first(Rollout *ro)
{
    double t0 = td_now();
    char err[512] = "";
    bool warned = false;
    for (;;) {
        if (latest_target(ro->dir, ro->wanted, sizeof ro->wanted)) {
            char file[TARGET_PATH_MAX];
            target_path(ro, ro->wanted, file, sizeof file);
            if (load_first(ro, file, err, sizeof err) == 0) {
                snprintf(ro->loaded, sizeof ro->loaded, "%s", ro->wanted);
                return 0;
            }
            if (!warned) td_info("rollout: warning: %s (will retry)", err);
            warned = true;
        } else if (!warned) {
            td_info("rollout: waiting for a checkpoint in %s (up to %g s)", ro->dir, ro->wait_timeout);
            warned = true;
        }
        if (td_now() - t0 > ro->wait_timeout) {
            if (err[0]) td_error("rollout: %s", err);
            else td_error("rollout: no checkpoint appeared in %s within %g s (--wait-timeout)", ro->dir, ro->wait_timeout);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, 100000000L }, NULL);
    }
}

/* After each step under --follow: hold admission when latest moved, swap
 * once nothing admitted depends on the old weights.  Returns 0, or -1 on a
 * fatal error (printed). */
static int follow_poll(Rollout *ro)
{
    char t[PATH_MAX];
    if (latest_target(ro->dir, t, sizeof t) && strcmp(t, ro->wanted)) {
        snprintf(ro->wanted, sizeof ro->wanted, "%s", t);
        ro->fail_since = 0;
    }
    if (!strcmp(ro->wanted, ro->loaded)) {   /* latest may also move back */
        if (ro->held) engine_hold(&ro->e, false);
        ro->held = false;
        return 0;
    }
    if (!ro->held) engine_hold(&ro->e, true);
    ro->held = true;
    if (engine_admitted_live(&ro->e) > 0) return 0;
    char file[TARGET_PATH_MAX];
    target_path(ro, ro->wanted, file, sizeof file);
    int64_t old = ro->version;
    double t0 = td_now();
    char err[512];
    int rc = reload(ro, file, err, sizeof err);
    if (rc == -2) return -1;
    if (rc == -1) {
        if (ro->fail_since == 0) {   /* once per checkpoint named by latest */
            ro->fail_since = t0;
            if (ro->progress) fprintf(stderr, "\r\033[K");
            td_info("rollout: warning: %s (admission held; will retry until latest names a loadable checkpoint, "
                    "up to %g s)", err, ro->wait_timeout);
        } else if (t0 - ro->fail_since > ro->wait_timeout) {
            td_error("rollout: could not load %s for %g s (--wait-timeout): %s", file, ro->wait_timeout, err);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, 50000000L }, NULL);
        return 0;
    }
    snprintf(ro->loaded, sizeof ro->loaded, "%s", ro->wanted);
    ro->fail_since = 0;
    engine_set_weights_version(&ro->e, ro->e.o.weights_version + 1);   /* the cached KV is of the old weights */
    engine_hold(&ro->e, false);
    ro->held = false;
    if (ro->progress) fprintf(stderr, "\r\033[K");
    td_info("rollout: policy version %lld -> %lld (%s, loaded in %.0f ms)", (long long)old,
            (long long)ro->version, file, (td_now() - t0) * 1e3);
    return 0;
}

/* ---------------------------------------------------------------- the command */

static void progress_line(Rollout *ro, bool force)
{
    double now = td_now();
    if (!ro->progress || (!force && now - ro->t_progress < 0.2)) return;
    ro->t_progress = now;
    EngineStats st;
    engine_stats(&ro->e, &st);
    double dt = now - ro->t0;
    fprintf(stderr, "\rrollout: %zu/%zu samples, %zu tokens, %.0f tokens/s, running %zu, waiting %zu, policy %lld%s\033[K",
            ro->n_done, ro->n_jobs, ro->tokens, dt > 0 ? (double)ro->tokens / dt : 0.0, st.running, st.waiting,
            (long long)ro->version, ro->held ? " (swap pending)" : "");
}

static void rollout_free(Rollout *ro)
{
    for (size_t i = 0; i < ro->n_jobs; i++) request_free(ro->jobs[i].r);
    td_free(ro->jobs);
    td_free(ro->finished);
    td_free(ro->line.s);
    td_free(ro->versions);
    td_free(ro->version_count);
    if (ro->have_engine) engine_free(&ro->e);
    ckpt_text_free(&ro->tx);
    if (ro->have_model) model_free(&ro->m);
    if (ro->out && ro->out != stdout) fclose(ro->out);
}

typedef struct {
    const char *name;
    double dflt, lo, hi;
    double v;
} NumOpt;

static int rollout_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "ckpt=", "follow=", "prompts=", "n=", "output=", "max-tokens=",
                                        "temperature=", "top-k=", "top-p=", "seed=", "stop+", "kv-mb=",
                                        "max-running=", "max-batch-tokens=", "prefill-chunk=", "wait-timeout=",
                                        "ignore-eos", "dtype=", "kv-dtype=", "expert-cache-mb=", "no-prefix-cache", NULL };
    char err[1024];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("rollout: %s", err);
        return 2;
    }
    if (ap->help) {
        fputs(g_rollout_help, stdout);
        return 0;
    }
    const char *ckpt = args_get(ap, "ckpt"), *follow = args_get(ap, "follow");
    const char *prompts_path = args_get(ap, "prompts"), *out_path = args_get(ap, "output");
    if (!!ckpt == !!follow || !prompts_path || ap->n_pos) {
        td_error("rollout: one of --ckpt / --follow and --prompts are required (tandem rollout --help)");
        return 2;
    }
    if (follow && strlen(follow) + sizeof "/latest" > PATH_MAX) {
        td_error("rollout: --follow %s: the path is longer than %zu bytes", follow, PATH_MAX - sizeof "/latest");
        return 2;
    }
    GenParams gp;
    if (infer_gen_params(&gp, ap, err, sizeof err)) {
        td_error("rollout: %s", err);
        return 2;
    }
    if (!args_get(ap, "max-tokens")) gp.max_tokens = 64;
    gp.want_routes = true;
    gp.keep_stop = true;   /* ids are every sampled token, the stop string included */
    enum { NS, KV, RUN, BATCH, CHUNK, WAIT, N_NUM };
    NumOpt num[N_NUM] = {
        [NS] = { "n", 1, 1, 1 << 20, 0 },
        [KV] = { "kv-mb", 256, 1, 1 << 20, 0 },
        [RUN] = { "max-running", 64, 1, 4096, 0 },
        [BATCH] = { "max-batch-tokens", 512, 1, 1 << 20, 0 },
        [CHUNK] = { "prefill-chunk", 256, 1, 1 << 20, 0 },
        [WAIT] = { "wait-timeout", 60, 0, 1e7, 0 },
    };
    for (int i = 0; i < N_NUM; i++)
        if (args_num(ap, num[i].name, num[i].dflt, num[i].lo, num[i].hi, &num[i].v, err, sizeof err) < 0) {
            td_error("rollout: %s", err);
            return 2;
        }
    if (num[NS].v != (double)(size_t)num[NS].v) {
        td_error("rollout: --n must be a whole number");
        return 2;
    }
    ServeDtypes sd;
    if (ckpt_serve_dtypes(&sd, args_get(ap, "dtype"), args_get(ap, "kv-dtype"), err, sizeof err) ||
        ckpt_serve_expert_cache(&sd, args_get(ap, "expert-cache-mb"), err, sizeof err)) {
        td_error("rollout: %s", err);
        return 2;
    }
    /* 1. the prompts (syntax), before waiting for or loading anything */
    Prompt *prompts;
    size_t np;
    if (prompts_read(prompts_path, &prompts, &np, err, sizeof err)) {
        td_error("rollout: %s", err);
        return 2;
    }
    Rollout ro;
    memset(&ro, 0, sizeof ro);
    ro.sd = sd;
    ro.prompts = prompts;
    ro.wait_timeout = num[WAIT].v;
    int rc = 1;
    /* 2. the model */
    if (ckpt) {
        char file[PATH_MAX];
        if (access(ckpt, R_OK)) {
            td_error("rollout: %s: %s", ckpt, strerror(errno));
            goto out;
        }
        if (ckpt_resolve(ckpt, file, sizeof file)) goto out;   /* printed */
        if (load_first(&ro, file, err, sizeof err)) {
            td_error("rollout: %s", err);
            goto out;
        }
    } else {
        ro.dir = follow;
        if (follow_first(&ro)) goto out;
    }
    /* the tokenizer of the checkpoint first loaded (--follow: later ones
     * must have the same model config, and a run keeps its tokenizer) */
    if (ckpt_open_text(ckpt ? ckpt : follow, false, &ro.tx, err, sizeof err)) {
        td_error("rollout: %s", err);
        goto out;
    }
    if (prompts_encode(prompts, np, ro.tx.tok, prompts_path, err, sizeof err)) {
        td_error("rollout: %s", err);
        rc = 2;
        goto out;
    }
    EngineOpts eo;
    engine_opts_default(&eo);
    eo.kv_budget_bytes = (size_t)num[KV].v << 20;
    eo.max_running = (size_t)num[RUN].v;
    eo.max_batch_tokens = (size_t)num[BATCH].v;
    eo.prefill_chunk = (size_t)num[CHUNK].v;
    eo.tok = ro.tx.tok;
    eo.stop_ids = ro.tx.stop_ids;
    eo.n_stop_ids = ro.tx.n_stop_ids;
    eo.prefix_cache = !args_flag(ap, "no-prefix-cache");
    engine_init(&ro.e, &ro.m, &eo);
    ro.have_engine = true;
    /* 3. the prompts against the model, still before generating anything */
    if (prompts_check(prompts, np, &ro.e, gp.max_tokens, prompts_path, err, sizeof err)) {
        td_error("rollout: %s", err);
        rc = 2;
        goto out;
    }
    ro.out = out_path ? fopen(out_path, "w") : stdout;
    if (!ro.out) {
        td_error("rollout: cannot create %s: %s", out_path, strerror(errno));
        goto out;
    }
    const size_t n = (size_t)num[NS].v;
    ro.n_jobs = np * n;
    ro.jobs = td_calloc(ro.n_jobs * sizeof(Job));
    ro.finished = td_malloc(ro.n_jobs * sizeof(Job *));
    for (size_t i = 0; i < np; i++)
        for (size_t j = 0; j < n; j++) {
            Job *jb = &ro.jobs[i * n + j];
            *jb = (Job){ &ro, i, j, gp.seed + ROLLOUT_SEED_STRIDE * (uint64_t)i + (uint64_t)j, -1, NULL };
        }
    ro.progress = isatty(2);
    ro.t0 = td_now();
    td_info("rollout: %zu prompts x %zu samples, policy version %lld, %d MoE layers x top-%zu routes, KV cache %d "
            "blocks, max running %zu, %d threads",
            np, n, (long long)ro.version, ro.e.n_moe, ro.m.k, ro.e.kv.n_blocks, ro.e.o.max_running, pool_threads());

    /* 4. the loop: feed the queue, step, write and free what finished,
     *    follow the run directory */
    size_t next = 0;
    while (ro.n_done < ro.n_jobs) {
        while (next < ro.n_jobs) {
            Job *j = &ro.jobs[next];
            const Prompt *p = &prompts[j->prompt];
            if (!j->r) {
                GenParams g = gp;
                g.seed = j->seed;
                j->r = request_new(p->ids, p->n, &g);
                j->r->cb = job_cb;
                j->r->user = j;
            }
            int s = engine_submit(&ro.e, j->r);
            if (s == -1) break;   /* queue full: the request waits for the next step */
            TD_CHECK(s == 0, "rollout: prompt %zu was checked but refused: %s", j->prompt, j->r->error);
            next++;
        }
        engine_step(&ro.e);
        for (size_t i = 0; i < ro.n_finished; i++) {
            request_free(ro.finished[i]->r);
            ro.finished[i]->r = NULL;
        }
        ro.n_finished = 0;
        if (ro.out_failed) {
            td_error("rollout: writing %s failed: %s", out_path ? out_path : "stdout", strerror(errno));
            goto out;
        }
        if (ro.failed[0]) {
            td_error("rollout: %s", ro.failed);
            goto out;
        }
        if (ro.dir && follow_poll(&ro)) goto out;
        progress_line(&ro, false);
    }
    if (ro.progress) {
        progress_line(&ro, true);
        fprintf(stderr, "\n");
    }
    double dt = td_now() - ro.t0;
    Buf vs = { NULL, 0, 0 };
    buf_printf(&vs, "%s", "");
    for (int i = 0; i < ro.n_versions; i++)
        buf_printf(&vs, "%s%lld (%ld samples)", i ? ", " : "", (long long)ro.versions[i], ro.version_count[i]);
    EngineStats est;
    engine_stats(&ro.e, &est);
    td_info("rollout: %zu samples, %zu tokens in %.2f s (%.0f tokens/s), policy versions %s; prefix cache: %ld of "
            "%ld prompt tokens found cached",
            ro.n_done, ro.tokens, dt, dt > 0 ? (double)ro.tokens / dt : 0.0, vs.s, est.prefix_hit_tokens,
            est.prefix_query_tokens);
    if (est.expert_slots)
        td_info("rollout: expert cache %zu slots per layer (%.1f MiB): %llu hits, %llu misses, %.1f MiB loaded in %.3f s",
                est.expert_slots, (double)est.expert_cache_bytes / 1048576.0, (unsigned long long)est.experts.hits,
                (unsigned long long)est.experts.misses, (double)est.experts.bytes_loaded / 1048576.0, est.experts.load_s);
    td_free(vs.s);
    rc = 0;
out:
    rollout_free(&ro);
    prompts_free(prompts, np);
    return rc;
}

int cmd_rollout(int argc, char **argv)
{
    Args a = { 0 };
    int rc = rollout_run(&a, argc, argv);
    args_free(&a);
    return rc;
}

/* rl/rlcheck.c - the trainer's check of a rollout (rlcheck.h).
 *
 * Samples of one policy version are scored with that version's checkpoint,
 * B sequences per training forward.  A batch is sorted by length so that
 * padding is small; each sequence is padded after its real tokens (causal
 * attention: padding cannot reach earlier positions) and a partial batch
 * with rows of zeros (rows are independent).  For generated token j of a
 * sample with P prompt tokens the trainer's numbers are those of position
 * P - 1 + j: logp[P - 1 + j] (target = token j) and la[l].topk_idx at that
 * row for every MoE layer l.
 */
#include "rl/rlcheck.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "core/args.h"
#include "core/model/backprop.h"
#include "core/common.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int32_t *seq;        /* owned: prompt_ids then ids */
    size_t n_prompt, n_out;
    float *logp;         /* owned (n_out) */
    int32_t *routes;     /* owned (n_out, n_layers, k) */
    int64_t version;
    long line;
} RSample;

typedef struct {
    RSample *s;
    size_t n, cap;
    long n_layers, k;    /* route shape seen in the file, -1 until known */
} RFile;

static void rfile_free(RFile *f)
{
    for (size_t i = 0; i < f->n; i++) {
        td_free(f->s[i].seq);
        td_free(f->s[i].logp);
        td_free(f->s[i].routes);
    }
    td_free(f->s);
    memset(f, 0, sizeof *f);
}

static bool as_int(const cJSON *e, double lo, double hi, double *v)
{
    if (!cJSON_IsNumber(e)) return false;
    *v = e->valuedouble;
    return *v >= lo && *v <= hi && *v == floor(*v);
}

/* Integer array item `name` of o appended to out[*n..]; false when absent
 * or not an array of non-negative int32. */
static bool get_ids(const cJSON *o, const char *name, int32_t *out, size_t *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, name), *e;
    if (!cJSON_IsArray(a)) return false;
    cJSON_ArrayForEach(e, a)
    {
        double v;
        if (!as_int(e, 0, INT32_MAX, &v)) return false;
        out[(*n)++] = (int32_t)v;
    }
    return true;
}

/* One line of a rollout file into s.  0, or -1 with the reason in err. */
static int parse_sample(RFile *f, RSample *s, const char *text, size_t len, char *err, size_t n)
{
    cJSON *o = cJSON_ParseWithLength(text, len);
    int rc = -1;
    if (!cJSON_IsObject(o)) {
        snprintf(err, n, "not a JSON object");
        goto out;
    }
    const cJSON *pi = cJSON_GetObjectItemCaseSensitive(o, "prompt_ids");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "ids");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(o, "routes");
    const cJSON *pv = cJSON_GetObjectItemCaseSensitive(o, "policy_version");
    if (!cJSON_IsArray(pi) || !cJSON_IsArray(ids) || !cJSON_IsArray(lp) || !cJSON_IsArray(rt)) {
        snprintf(err, n, "needs the arrays prompt_ids, ids, logprobs and routes (a `tandem rollout` line)");
        goto out;
    }
    double v;
    if (!as_int(pv, -9e15, 9e15, &v)) {
        snprintf(err, n, "needs an integer policy_version");
        goto out;
    }
    s->version = (int64_t)v;
    size_t np = (size_t)cJSON_GetArraySize(pi), no = (size_t)cJSON_GetArraySize(ids), k = 0;
    if ((size_t)cJSON_GetArraySize(lp) != no || (size_t)cJSON_GetArraySize(rt) != no) {
        snprintf(err, n, "ids, logprobs and routes must have the same length");
        goto out;
    }
    if (np == 0) {
        snprintf(err, n, "prompt_ids is empty");
        goto out;
    }
    s->seq = td_malloc((np + no) * sizeof(int32_t));
    s->logp = td_malloc((no ? no : 1) * sizeof(float));
    if (!get_ids(o, "prompt_ids", s->seq, &k) || !get_ids(o, "ids", s->seq, &k)) {
        snprintf(err, n, "prompt_ids and ids must hold non-negative integers");
        goto out;
    }
    s->n_prompt = np;
    s->n_out = no;
    const cJSON *e;
    k = 0;
    cJSON_ArrayForEach(e, lp)
    {
        if (!cJSON_IsNumber(e)) {
            snprintf(err, n, "logprobs must hold numbers");
            goto out;
        }
        s->logp[k++] = (float)e->valuedouble;
    }
    /* routes: [n_out][n_layers][k], one shape for the whole file */
    size_t ti = 0;
    cJSON_ArrayForEach(e, rt)
    {
        long nl = cJSON_IsArray(e) ? cJSON_GetArraySize(e) : -1;
        long kk = nl > 0 && cJSON_IsArray(e->child) ? cJSON_GetArraySize(e->child) : 0;
        if (nl < 0 || (f->n_layers >= 0 && (nl != f->n_layers || kk != f->k))) {
            snprintf(err, n, "routes[%zu] must be [n_moe_layers][k] like every other token's", ti);
            goto out;
        }
        if (f->n_layers < 0) {
            f->n_layers = nl;
            f->k = kk;
        }
        if (!s->routes) s->routes = td_malloc((no * (size_t)(nl * kk) + 1) * sizeof(int32_t));
        size_t base = ti * (size_t)(nl * kk), r = 0;
        const cJSON *layer;
        cJSON_ArrayForEach(layer, e)
        {
            const cJSON *x;
            if (!cJSON_IsArray(layer) || cJSON_GetArraySize(layer) != kk) {
                snprintf(err, n, "routes[%zu] must be [n_moe_layers][k] like every other token's", ti);
                goto out;
            }
            cJSON_ArrayForEach(x, layer)
            {
                if (!as_int(x, 0, INT32_MAX, &v)) {
                    snprintf(err, n, "routes[%zu] must hold expert ids", ti);
                    goto out;
                }
                s->routes[base + r++] = (int32_t)v;
            }
        }
        ti++;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* Next line of f into *buf (grown with td_malloc, NUL-terminated, the
 * newline kept); returns its length, or -1 at the end of the file. */
static long read_line(FILE *f, char **buf, size_t *cap)
{
    size_t n = 0;
    for (;;) {
        if (*cap - n < 2) {
            size_t c = *cap ? 2 * *cap : 4096;
            char *b = td_malloc(c);
            if (n) memcpy(b, *buf, n);
            td_free(*buf);
            *buf = b;
            *cap = c;
        }
        if (!fgets(*buf + n, (int)td_min(*cap - n, INT_MAX), f)) return n ? (long)n : -1;
        n += strlen(*buf + n);
        if ((*buf)[n - 1] == '\n') return (long)n;
    }
}

static int read_rollout(RFile *f, const char *path, char *err, size_t n)
{
    memset(f, 0, sizeof *f);
    f->n_layers = f->k = -1;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, n, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t lcap = 0;
    long len, ln = 0;
    int rc = 0;
    while (rc == 0 && (len = read_line(fp, &line, &lcap)) >= 0) {
        ln++;
        long i = 0;
        while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) i++;
        if (i == len) continue;
        if (f->n == f->cap) {
            f->cap = f->cap ? 2 * f->cap : 64;
            RSample *s = td_calloc(f->cap * sizeof(RSample));
            if (f->n) memcpy(s, f->s, f->n * sizeof(RSample));
            td_free(f->s);
            f->s = s;
        }
        RSample *s = &f->s[f->n++];
        s->line = ln;
        char why[256];
        if (parse_sample(f, s, line, (size_t)len, why, sizeof why)) {
            snprintf(err, n, "%s:%ld: %s", path, ln, why);
            rc = -1;
        }
    }
    if (rc == 0 && ferror(fp)) {
        snprintf(err, n, "%s: read error", path);
        rc = -1;
    }
    td_free(line);
    fclose(fp);
    if (rc == 0 && f->n == 0) {
        snprintf(err, n, "%s: no samples", path);
        rc = -1;
    }
    return rc;
}

/* ---------------------------------------------------------------- scoring */

typedef struct {
    size_t samples, tokens, routes, route_diff;
    double diff_max;
} Tally;

/* qsort_r order of sample indices: longest first, then file order. */
static int by_length_desc(const void *a, const void *b, void *base)
{
    const RSample *s = base, *x = &s[*(const size_t *)a], *y = &s[*(const size_t *)b];
    size_t lx = x->n_prompt + x->n_out, ly = y->n_prompt + y->n_out;
    if (lx != ly) return lx < ly ? 1 : -1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* Scores the samples idx[0..n) (all of one version) with model m.  Returns
 * 0, or -1 with one line in err (a token outside the model). */
static int score_group(const Model *m, const RFile *f, size_t *idx, size_t n, size_t B, Tally *t,
                       const char *path, char *err, size_t en)
{
    const size_t V = (size_t)m->cfg.vocab_size, max_pos = (size_t)m->cfg.max_position_embeddings, k = m->k;
    const int nl = m->topo.layer_end - m->topo.layer_begin;
    for (size_t i = 0; i < n; i++) {
        const RSample *s = &f->s[idx[i]];
        for (size_t j = 0; j < s->n_prompt + s->n_out; j++)
            if ((size_t)s->seq[j] >= V) {
                snprintf(err, en, "%s:%ld: token %d is outside the vocabulary (%zu)", path, s->line,
                         s->seq[j], V);
                return -1;
            }
        if (s->n_prompt + s->n_out > max_pos) {
            snprintf(err, en, "%s:%ld: %zu tokens exceed the context of %zu positions", path, s->line,
                     s->n_prompt + s->n_out, max_pos);
            return -1;
        }
    }
    qsort_r(idx, n, sizeof *idx, by_length_desc, f->s);
    TrainActs acts;
    memset(&acts, 0, sizeof acts);
    int32_t *ids = NULL, *tg = NULL;
    for (size_t b0 = 0; b0 < n; b0 += B) {
        size_t nb = td_min(B, n - b0), T = 1;
        for (size_t r = 0; r < nb; r++) T = td_max(T, f->s[idx[b0 + r]].n_prompt + f->s[idx[b0 + r]].n_out - 1);
        if (acts.T != T) {   /* lengths only fall: a few sizes per group */
            model_train_acts_free(&acts);
            td_free(ids);
            td_free(tg);
            model_train_acts_init(&acts, m, B, T, RECOMPUTE_NONE);
            ids = td_malloc(B * T * sizeof(int32_t));
            tg = td_malloc(B * T * sizeof(int32_t));
        }
        memset(ids, 0, B * T * sizeof(int32_t));
        memset(tg, 0, B * T * sizeof(int32_t));
        for (size_t r = 0; r < nb; r++) {
            const RSample *s = &f->s[idx[b0 + r]];
            size_t L = s->n_prompt + s->n_out;
            memcpy(ids + r * T, s->seq, (L - 1) * sizeof(int32_t));
            memcpy(tg + r * T, s->seq + 1, (L - 1) * sizeof(int32_t));
        }
        model_train_forward(m, &acts, ids, tg, B * T, NULL);
        for (size_t r = 0; r < nb; r++) {
            const RSample *s = &f->s[idx[b0 + r]];
            for (size_t j = 0; j < s->n_out; j++) {
                size_t row = r * T + s->n_prompt - 1 + j;
                double d = fabs((double)s->logp[j] - (double)acts.logp[row]);
                if (isnan(d)) d = INFINITY;
                if (d > t->diff_max) t->diff_max = d;
                size_t mi = 0;
                for (int i = 0; i < nl; i++) {
                    if (!m->layers[m->topo.layer_begin + i].moe) continue;
                    const int32_t *want = s->routes + (j * (size_t)f->n_layers + mi) * k;
                    t->route_diff += memcmp(want, acts.la[i].topk_idx + row * k, k * sizeof(int32_t)) != 0;
                    t->routes++;
                    mi++;
                }
            }
            t->tokens += s->n_out;
        }
    }
    model_train_acts_free(&acts);
    td_free(ids);
    td_free(tg);
    return 0;
}

/* The checkpoint of policy version v: RUN_DIR/step_<v>.h5, or the file
 * given when its step is v.  0, or -1 with one line in err. */
static int ckpt_for_version(const char *ckpt, bool is_dir, int64_t v, char *out, size_t n, char *err, size_t en)
{
    if (is_dir) {
        if (td_snprintf(out, n, "%s/step_%08lld.h5", ckpt, (long long)v)) {
            snprintf(err, en, "--ckpt %.700s: the path is too long", ckpt);
            return -1;
        }
        if (access(out, R_OK)) {
            snprintf(err, en, "no checkpoint for policy_version %lld: %.700s: %s", (long long)v, out, strerror(errno));
            return -1;
        }
        return 0;
    }
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(ckpt, &cfg, &meta, err, en)) return -1;
    if (meta.step != v) {
        snprintf(err, en, "samples of policy_version %lld, but %s is step %lld (pass the run directory to check "
                 "several versions)", (long long)v, ckpt, (long long)meta.step);
        return -1;
    }
    if (td_snprintf(out, n, "%s", ckpt)) {
        snprintf(err, en, "--ckpt %.700s: the path is too long", ckpt);
        return -1;
    }
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int rlcheck_cmd_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "rollout=", "ckpt=", "batch=", "dtype=", "kv-dtype=", NULL };
    char err[1024];
    bool help = false;   /* "--rollout --help": --help is not the file name */
    for (int i = 1; i < argc; i++) help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    if (!help && args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("score: %s", err);
        return 2;
    }
    if (help) {
        printf("usage: tandem score --rollout OUT.jsonl --ckpt CKPT|RUN_DIR [--batch 8]\n"
               "                    [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8]\n"
               "Recomputes, with the training forward, the log-probability of every generated\n"
               "token of a `tandem rollout` output and the experts it was routed to, and\n"
               "prints {\"samples\", \"tokens\", \"routes\", \"logprob_diff_max\", \"routing_mismatch\",\n"
               "\"versions\"}: the largest |rollout - trainer| log-probability and the share\n"
               "of (token, MoE layer) whose top-k experts differ; both 0 when the engine and\n"
               "the trainer agree bit for bit.  Each sample is scored with the checkpoint of\n"
               "its policy_version: RUN_DIR/step_<version>.h5, or CKPT when its step matches.\n"
               "--dtype / --kv-dtype: the dtypes the rollout ran with (tandem rollout's), so that\n"
               "the trainer computes from the same rounded weights and keys and values.\n"
               "Exit 0 whatever the measurement; 2 for a malformed file.\n");
        return 0;
    }
    const char *path = args_get(ap, "rollout"), *ckpt = args_get(ap, "ckpt");
    double B;
    if (!path || !ckpt || ap->n_pos) {
        td_error("score: --rollout and --ckpt are required (tandem score --rollout --help)");
        return 2;
    }
    if (args_num(ap, "batch", 8, 1, 4096, &B, err, sizeof err) < 0) {
        td_error("score: %s", err);
        return 2;
    }
    ServeDtypes sd;
    if (ckpt_serve_dtypes(&sd, args_get(ap, "dtype"), args_get(ap, "kv-dtype"), err, sizeof err)) {
        td_error("score: %s", err);
        return 2;
    }
    struct stat st;
    if (stat(ckpt, &st)) {
        td_error("score: %s: %s", ckpt, strerror(errno));
        return 1;
    }
    const bool is_dir = S_ISDIR(st.st_mode) && !ckpt_is_hf_dir(ckpt);   /* a run directory: one checkpoint per version */
    RFile f;
    if (read_rollout(&f, path, err, sizeof err)) {
        td_error("score: %s", err);
        rfile_free(&f);
        return 2;
    }
    /* the versions, ascending */
    int64_t *vers = td_malloc(f.n * sizeof(int64_t));
    size_t nv = 0;
    for (size_t i = 0; i < f.n; i++) vers[i] = f.s[i].version;
    qsort(vers, f.n, sizeof *vers, cmp_i64);
    for (size_t i = 0; i < f.n; i++)
        if (!nv || vers[nv - 1] != vers[i]) vers[nv++] = vers[i];
    size_t *idx = td_malloc(f.n * sizeof(size_t));
    Tally t = { 0 };
    int rc = 0;
    for (size_t vi = 0; vi < nv && rc == 0; vi++) {
        char file[PATH_MAX + 32];
        if (ckpt_for_version(ckpt, is_dir, vers[vi], file, sizeof file, err, sizeof err)) {
            td_error("score: %s", err);
            rc = 1;
            break;
        }
        Model m;
        if (ckpt_open_serving(file, &m, NULL, &sd, err, sizeof err)) {
            if (err[0]) td_error("score: %s", err);
            rc = 1;
            break;
        }
        int n_moe = 0;
        for (int l = 0; l < m.cfg.num_hidden_layers; l++) n_moe += m.layers[l].moe;
        size_t n = 0;
        for (size_t i = 0; i < f.n; i++)
            if (f.s[i].version == vers[vi]) {
                t.samples++;
                if (f.s[i].n_out) idx[n++] = i;
            }
        if (f.n_layers >= 0 && (f.n_layers != n_moe || (n_moe && f.k != (long)m.k))) {
            td_error("score: %s: routes are [%ld][%ld] per token, the model has %d MoE layers x top-%zu", path,
                     f.n_layers, f.k, n_moe, m.k);
            rc = 2;
        } else if (score_group(&m, &f, idx, n, (size_t)B, &t, path, err, sizeof err)) {
            td_error("score: %s", err);
            rc = 2;
        }
        model_free(&m);
    }
    if (rc == 0) {
        double mis = t.routes ? (double)t.route_diff / (double)t.routes : 0.0;
        printf("{\"samples\":%zu,\"tokens\":%zu,\"routes\":%zu,\"logprob_diff_max\":", t.samples, t.tokens, t.routes);
        if (isinf(t.diff_max)) printf("Infinity");
        else printf("%.9g", t.diff_max);
        printf(",\"routing_mismatch\":%.9g,\"versions\":[", mis);
        for (size_t i = 0; i < nv; i++) printf(i ? ",%lld" : "%lld", (long long)vers[i]);
        printf("]}\n");
    }
    td_free(idx);
    td_free(vers);
    rfile_free(&f);
    return rc;
}

int rlcheck_cmd(int argc, char **argv)
{
    Args a = { 0 };
    int rc = rlcheck_cmd_run(&a, argc, argv);
    args_free(&a);
    return rc;
}

/* train/runcfg.c - run configuration parsing (runcfg.h). */
#include "train/runcfg.h"
#include "core/common.h"
#include "core/ops/attention.h"

#include <cJSON.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum kind { K_INT, K_I64, K_NUM, K_BOOL, K_STR, K_MODEL };
struct key {
    const char *name;
    enum kind kind;
    size_t off, size;
    double lo, hi;          /* numeric bounds, inclusive */
    const char *def;        /* default as JSON text */
    const char *choices;    /* for strings: "a|b|c" or NULL */
};

#define F(field) offsetof(RunConfig, field), sizeof(((RunConfig *)0)->field)
static const struct key g_keys[] = {
    { "model", K_MODEL, 0, 0, 0, 0, NULL, NULL },
    { "data", K_STR, F(data), 0, 0, "\"\"", NULL },
    { "images", K_STR, F(images), 0, 0, "\"\"", NULL },
    { "image_fraction", K_NUM, F(image_fraction), 0, 1, "0.5", NULL },
    { "seq_len", K_INT, F(seq_len), 1, 1 << 20, "256", NULL },
    { "micro_batch", K_INT, F(micro_batch), 1, 1 << 20, "8", NULL },
    { "grad_accum", K_INT, F(grad_accum), 1, 1 << 20, "1", NULL },
    { "steps", K_INT, F(steps), 0, 1e9, "100", NULL },
    { "lr", K_NUM, F(lr), 0, 10, "3e-4", NULL },
    { "min_lr", K_NUM, F(min_lr), 0, 10, "3e-5", NULL },
    { "lr_schedule", K_STR, F(lr_schedule), 0, 0, "\"cosine\"", "cosine|constant" },
    { "warmup_steps", K_INT, F(warmup_steps), 0, 1e9, "0", NULL },
    { "weight_decay", K_NUM, F(weight_decay), 0, 10, "0.1", NULL },
    { "beta1", K_NUM, F(beta1), 0, 0.999999, "0.9", NULL },
    { "beta2", K_NUM, F(beta2), 0, 0.9999999, "0.95", NULL },
    { "adam_eps", K_NUM, F(adam_eps), 0, 1, "1e-8", NULL },
    { "grad_clip", K_NUM, F(grad_clip), 0, 1e9, "1.0", NULL },
    { "router_bias_update_rate", K_NUM, F(router_bias_update_rate), 0, 1, "0", NULL },
    { "router_seq_aux_loss_coef", K_NUM, F(router_seq_aux_loss_coef), 0, 1e3, "0", NULL },
    { "recompute", K_STR, F(recompute), 0, 0, "\"none\"", "none|full|selective" },
    { "seed", K_I64, F(seed), 0, 9.2e18, "1234", NULL },
    { "shuffle", K_BOOL, F(shuffle), 0, 0, "true", NULL },
    { "out_dir", K_STR, F(out_dir), 0, 0, "\"runs/default\"", NULL },
    { "save_every", K_INT, F(save_every), 0, 1e9, "0", NULL },
    { "keep_last", K_INT, F(keep_last), 0, 1e6, "3", NULL },
    { "save_at", K_STR, F(save_at), 0, 0, "\"\"", NULL },
    { "eval_every", K_INT, F(eval_every), 0, 1e9, "0", NULL },
    { "eval_batches", K_INT, F(eval_batches), 1, 1e6, "8", NULL },
    { "log_every", K_INT, F(log_every), 1, 1e9, "10", NULL },
    { "dp", K_INT, F(dp), 1, 65536, "1", NULL },
    { "tp", K_INT, F(tp), 1, 65536, "1", NULL },
    { "pp", K_INT, F(pp), 1, 64, "1", NULL },
    { "ep", K_INT, F(ep), 1, 65536, "1", NULL },
    { "cp", K_INT, F(cp), 1, 4096, "1", NULL },
    { "zero", K_INT, F(zero), 0, 1, "0", NULL },
    { "sp", K_BOOL, F(sp), 0, 0, "false", NULL },
    { "pp_layers", K_STR, F(pp_layers), 0, 0, "\"\"", NULL },
    { "init_from", K_STR, F(init_from), 0, 0, "\"\"", NULL },
    { "resume", K_STR, F(resume), 0, 0, "\"\"", NULL },
    { "tokenizer", K_STR, F(tokenizer), 0, 0, "\"\"", NULL },
    { "threads", K_INT, F(threads), 0, 1024, "0", NULL },
    { "on_nonfinite", K_STR, F(on_nonfinite), 0, 0, "\"stop\"", "stop|skip" },
    { "debug_nan_grad", K_STR, F(debug_nan_grad), 0, 0, "\"\"", NULL },
    { "debug_lr_spike", K_STR, F(debug_lr_spike), 0, 0, "\"\"", NULL },
    { "health_every", K_INT, F(health_every), 0, 1e9, "10", NULL },
    { "task", K_STR, F(task), 0, 0, "\"vowels\"", "vowels|target_length|prompts" },
    { "prompts", K_STR, F(prompts), 0, 0, "\"\"", NULL },
    { "prompts_per_step", K_INT, F(prompts_per_step), 1, 1e6, "8", NULL },
    { "group_size", K_INT, F(group_size), 1, 1e6, "8", NULL },
    { "max_new_tokens", K_INT, F(max_new_tokens), 1, 1e6, "32", NULL },
    { "temperature", K_NUM, F(temperature), 0, 100, "1.0", NULL },
    { "clip_eps", K_NUM, F(clip_eps), 0, 10, "0.2", NULL },
    { "kl_coef", K_NUM, F(kl_coef), 0, 100, "0", NULL },
    { "loss_agg", K_STR, F(loss_agg), 0, 0, "\"token_mean\"", "token_mean|seq_mean" },
    { "ppo_epochs", K_INT, F(ppo_epochs), 1, 1000, "1", NULL },
    { "rollout_ranks", K_INT, F(rollout_ranks), 0, 65536, "0", NULL },
    { "reward_cmd", K_STR, F(reward_cmd), 0, 0, "\"\"", NULL },
    { "reward_timeout", K_NUM, F(reward_timeout), 0.001, 1e6, "30", NULL },
    { "reward_on_error", K_STR, F(reward_on_error), 0, 0, "\"skip\"", "skip|stop" },
    { "rollout_dtype", K_STR, F(rollout_dtype), 0, 0, "\"f32\"", "f32|bf16|int8" },
};
#undef F
#define N_KEYS (sizeof g_keys / sizeof g_keys[0])

static const struct key *find(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(g_keys[i].name, name)) return &g_keys[i];
    return NULL;
}

static int set_model(RunConfig *rc, const cJSON *v, const char *base_dir, char *err, size_t n)
{
    if (cJSON_IsObject(v)) {
        snprintf(rc->model_src, sizeof rc->model_src, "inline");
        rc->model_given = true;
        return config_from_cjson(&rc->model, v, err, n);
    }
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        snprintf(err, n, "run config: \"model\" must be a path to a model config or an object");
        return -1;
    }
    char path[sizeof rc->model_src];
    if (td_snprintf(path, sizeof path, "%s", v->valuestring)) {
        snprintf(err, n, "run config: the \"model\" path is longer than %zu bytes", sizeof path - 1);
        return -1;
    }
    if (v->valuestring[0] != '/' && base_dir && access(path, R_OK) != 0) {
        /* beside the run config, when it is there */
        if (td_snprintf(path, sizeof path, "%s/%s", base_dir, v->valuestring) || access(path, R_OK) != 0)
            snprintf(path, sizeof path, "%s", v->valuestring);
    }
    snprintf(rc->model_src, sizeof rc->model_src, "%s", path);
    rc->model_given = true;
    return config_load(&rc->model, path, err, n);
}

static int set_key(RunConfig *rc, const struct key *k, const cJSON *v, const char *base_dir,
                   char *err, size_t n)
{
    void *dst = (char *)rc + k->off;
    switch (k->kind) {
    case K_MODEL:
        return set_model(rc, v, base_dir, err, n);
    case K_INT:
    case K_I64:
    case K_NUM: {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
            snprintf(err, n, "run config: \"%s\" must be a number", k->name);
            return -1;
        }
        double x = v->valuedouble;
        if (k->kind != K_NUM && x != floor(x)) {
            snprintf(err, n, "run config: \"%s\" must be an integer (got %g)", k->name, x);
            return -1;
        }
        if (x < k->lo || x > k->hi) {
            snprintf(err, n, "run config: \"%s\" = %g is outside [%g, %g]", k->name, x, k->lo, k->hi);
            return -1;
        }
        if (k->kind == K_INT) *(int *)dst = (int)x;
        else if (k->kind == K_I64) *(int64_t *)dst = (int64_t)x;
        else *(double *)dst = x;
        return 0;
    }
    case K_BOOL:
        if (!cJSON_IsBool(v)) {
            snprintf(err, n, "run config: \"%s\" must be true or false", k->name);
            return -1;
        }
        *(bool *)dst = cJSON_IsTrue(v);
        return 0;
    case K_STR:
        if (!cJSON_IsString(v)) {
            snprintf(err, n, "run config: \"%s\" must be a string", k->name);
            return -1;
        }
        if (strlen(v->valuestring) >= k->size) {
            snprintf(err, n, "run config: \"%s\" is too long", k->name);
            return -1;
        }
        if (k->choices) {
            bool ok = false;
            const char *c = k->choices;
            size_t len = strlen(v->valuestring);
            while (*c) {
                const char *bar = strchr(c, '|');
                size_t cl = bar ? (size_t)(bar - c) : strlen(c);
                if (cl == len && !strncmp(c, v->valuestring, cl)) ok = true;
                c += cl + (bar ? 1 : 0);
            }
            if (!ok) {
                snprintf(err, n, "run config: \"%s\" must be one of %s (got \"%s\")", k->name, k->choices,
                         v->valuestring);
                return -1;
            }
        }
        snprintf((char *)dst, k->size, "%s", v->valuestring);
        return 0;
    }
    return -1;
}

static int apply_object(RunConfig *rc, const cJSON *root, const char *base_dir, char *err, size_t n)
{
    for (const cJSON *it = root->child; it; it = it->next) {
        const struct key *k = find(it->string);
        if (!k) {
            snprintf(err, n, "run config: unknown key \"%s\"", it->string);
            return -1;
        }
        if (set_key(rc, k, it, base_dir, err, n)) return -1;
    }
    return 0;
}

/* key=value: the value is JSON when it parses as such, else a string. */
static int apply_override(RunConfig *rc, const char *kv, char *err, size_t n)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        snprintf(err, n, "override \"%s\" is not key=value", kv);
        return -1;
    }
    char name[64];
    const struct key *k = td_snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv) ? NULL : find(name);
    if (!k) {   /* a name too long for the buffer is no key either */
        snprintf(err, n, "override: unknown key \"%.*s\"", (int)(eq - kv), kv);
        return -1;
    }
    cJSON *v = cJSON_Parse(eq + 1);
    if (!v || (k->kind == K_STR && !cJSON_IsString(v)) || (k->kind == K_MODEL && !cJSON_IsObject(v))) {
        cJSON_Delete(v);
        v = cJSON_CreateString(eq + 1);
    }
    int r = set_key(rc, k, v, NULL, err, n);
    cJSON_Delete(v);
    return r;
}

static cJSON *to_json(const RunConfig *rc)
{
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; i < N_KEYS; i++) {
        const struct key *k = &g_keys[i];
        const void *src = (const char *)rc + k->off;
        switch (k->kind) {
        case K_MODEL: {
            char *mj = config_to_json(&rc->model);
            cJSON_AddItemToObject(o, "model", cJSON_Parse(mj));
            td_free(mj);
            break;
        }
        case K_INT: cJSON_AddNumberToObject(o, k->name, *(const int *)src); break;
        case K_I64: cJSON_AddNumberToObject(o, k->name, (double)*(const int64_t *)src); break;
        case K_NUM: cJSON_AddNumberToObject(o, k->name, *(const double *)src); break;
        case K_BOOL: cJSON_AddBoolToObject(o, k->name, *(const bool *)src); break;
        case K_STR: cJSON_AddStringToObject(o, k->name, (const char *)src); break;
        }
    }
    return o;
}

int runcfg_load(RunConfig *rc, const char *path, int n_over, char *const *over, char *err, size_t n)
{
    memset(rc, 0, sizeof *rc);
    char e2[256];
    for (size_t i = 0; i < N_KEYS; i++) {
        if (g_keys[i].kind == K_MODEL) continue;
        cJSON *v = cJSON_Parse(g_keys[i].def);
        int r = set_key(rc, &g_keys[i], v, NULL, e2, sizeof e2);
        cJSON_Delete(v);
        TD_CHECK(r == 0, "bad default for %s", g_keys[i].name);
    }
    /* the default model: every model key at its default, derived sizes filled */
    TD_CHECK(config_parse(&rc->model, "{}", e2, sizeof e2) == 0, "default model: %s", e2);
    snprintf(rc->model_src, sizeof rc->model_src, "defaults");
    if (path) {
        char *text = NULL, why[1200];
        int got = td_read_file(path, 1 << 24, &text, NULL, why, sizeof why);
        if (got) {
            if (got > 0)
                snprintf(err, n, "run config: cannot open %s", path);
            else
                snprintf(err, n, "run config: %s", why);
            return -1;
        }
        cJSON *root = cJSON_Parse(text);
        td_free(text);
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            snprintf(err, n, "run config: %s is not a JSON object", path);
            return -1;
        }
        char *dir = td_strdup(path);   /* dirname writes into it */
        int r = apply_object(rc, root, dirname(dir), err, n);
        td_free(dir);
        cJSON_Delete(root);
        if (r) return -1;
    }
    for (int i = 0; i < n_over; i++)
        if (apply_override(rc, over[i], err, n)) return -1;
    if (rc->min_lr > rc->lr) rc->min_lr = rc->lr;
    if (rc->seq_len > rc->model.max_position_embeddings) {
        snprintf(err, n, "run config: seq_len %d exceeds the model's max_position_embeddings %d",
                 rc->seq_len, rc->model.max_position_embeddings);
        return -1;
    }
    if (rc->cp > 1 && rc->seq_len % (2 * rc->cp * ATTN_TILE)) {
        snprintf(err, n, "run config: cp=%d needs seq_len divisible into 2*cp = %d chunks of a multiple of %d "
                 "positions, seq_len=%d is not", rc->cp, 2 * rc->cp, ATTN_TILE, rc->seq_len);
        return -1;
    }
    for (const char *a = rc->save_at; *a;) {   /* "1,50,200": positive step numbers */
        char *end;
        long long v = strtoll(a, &end, 10);
        if (end == a || v < 1 || (*end && *end != ',')) {
            snprintf(err, n, "run config: save_at \"%s\" must be comma-separated step numbers >= 1", rc->save_at);
            return -1;
        }
        a = *end ? end + 1 : end;
    }
    if (rc->micro_batch % rc->dp) {
        snprintf(err, n, "run config: dp=%d does not divide micro_batch=%d", rc->dp, rc->micro_batch);
        return -1;
    }
    if (rc->sp && rc->cp > 1) {
        snprintf(err, n, "run config: sp=true with cp=%d is not supported yet (sequence parallelism splits one "
                 "rank's rows; under cp those are two chunks of each sequence)", rc->cp);
        return -1;
    }
    if (rc->sp && rc->tp == 1) {
        snprintf(err, n, "run config: sp=true splits rows over the tp group and needs tp > 1 (tp=1)");
        return -1;
    }
    if (rc->sp && (long long)(rc->micro_batch / rc->dp) * rc->seq_len % rc->tp) {
        snprintf(err, n, "run config: sp=true: tp=%d does not divide the %lld rows of a micro-batch per dp rank "
                 "(micro_batch/dp x seq_len = %d x %d)", rc->tp, (long long)(rc->micro_batch / rc->dp) * rc->seq_len,
                 rc->micro_batch / rc->dp, rc->seq_len);
        return -1;
    }
    cJSON *j = to_json(rc);
    char *s = cJSON_PrintUnformatted(j);
    rc->json = td_strdup(s);
    cJSON_free(s);
    cJSON_Delete(j);
    return 0;
}

void runcfg_free(RunConfig *rc)
{
    td_free(rc->json);
    rc->json = NULL;
}

/* infer/server/server_api.c - OpenAI completions and chat JSON, /tokenize
 * and /detokenize for `tandem serve` (server_api.h): request validation,
 * responses, stream chunks, errors. */
#include "infer/server/server_api.h"
#include "core/common.h"

#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ errors */

int api_error(ApiError *err, int status, const char *param, const char *fmt, ...)
{
    err->status = status;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *api_error_body(const ApiError *err)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", error_type(err->status));
    if (err->param[0]) cJSON_AddStringToObject(e, "param", err->param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ------------------------------------------------------- field validation */

/* A field, or NULL when absent or JSON null (OpenAI: null means default). */
static const cJSON *field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A JSON number that is an integer in [lo, hi] ("1e999" parses as inf). */
static bool as_int(const cJSON *v, double lo, double hi, double *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x) || x < lo || x > hi) return false;
    *out = x;
    return true;
}

/* Optional integer field in [lo, hi]; 1 when absent (out = dflt). */
static int get_int(const cJSON *o, const char *key, double lo, double hi, double dflt, double *out, ApiError *err)
{
    const cJSON *v = field(o, key);
    *out = dflt;
    if (!v) return 1;
    if (!as_int(v, lo, hi, out))
        return api_error(err, 400, key, "'%s' must be an integer in [%.0f, %.0f]", key, lo, hi);
    return 0;
}

/* Optional finite number in [lo, hi] (lo excluded when lo_open). */
static int get_num(const cJSON *o, const char *key, double lo, bool lo_open, double hi, double dflt, double *out,
                   ApiError *err)
{
    const cJSON *v = field(o, key);
    *out = dflt;
    if (!v) return 1;
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return api_error(err, 400, key, "'%s' must be a number in %c%g, %g]", key, lo_open ? '(' : '[', lo, hi);
    *out = x;
    return 0;
}

static int get_bool(const cJSON *o, const char *key, bool dflt, bool *out, ApiError *err)
{
    const cJSON *v = field(o, key);
    *out = dflt;
    if (!v) return 1;
    if (!cJSON_IsBool(v)) return api_error(err, 400, key, "'%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Fields we accept only at their neutral value. */
static int check_unsupported(const cJSON *o, int n, ApiError *err)
{
    static const struct {
        const char *key;
        double neutral;
    } nums[] = { { "presence_penalty", 0 }, { "frequency_penalty", 0 }, { "repetition_penalty", 1 }, { "min_tokens", 0 } };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const cJSON *v = field(o, nums[i].key);
        if (v && (!cJSON_IsNumber(v) || v->valuedouble != nums[i].neutral))
            return api_error(err, 400, nums[i].key, "'%s' is not supported (only %g)", nums[i].key, nums[i].neutral);
    }
    const cJSON *v = field(o, "best_of");
    double x;
    if (v && (!as_int(v, 1, 1e9, &x) || (int)x != n))
        return api_error(err, 400, "best_of", "'best_of' must equal n: ranking several samples is not supported");
    bool b;
    if (get_bool(o, "echo", false, &b, err) < 0) return -1;
    if (b) return api_error(err, 400, "echo", "'echo' is not supported");
    v = field(o, "suffix");
    if (v && !(cJSON_IsString(v) && !v->valuestring[0]))
        return api_error(err, 400, "suffix", "'suffix' is not supported");
    v = field(o, "logit_bias");
    if (v && !(cJSON_IsObject(v) && !v->child))
        return api_error(err, 400, "logit_bias", "'logit_bias' is not supported");
    v = field(o, "model");
    if (v && !cJSON_IsString(v)) return api_error(err, 400, "model", "'model' must be a string");
    return 0;
}

/* ------------------------------------------------------------------ prompt */

static const char *api_context_name(const ApiLimits *lim)
{
    return lim->context_name ? lim->context_name : "the model's context";
}

/* Tokens of one prompt (a string, encoded as HF's tokenizer(text) with its
 * special tokens, or an array of ids), validated and appended to out. */
static int prompt_one(const cJSON *p, const ApiLimits *lim, TokIds *out, ApiError *err)
{
    size_t n0 = out->n;
    if (cJSON_IsString(p)) {
        char why[256];
        if (tok_encode(lim->tok, p->valuestring, strlen(p->valuestring), true, out, why, sizeof why))
            return api_error(err, 400, "prompt", "'prompt': %s", why);
    } else if (cJSON_IsArray(p)) {
        for (const cJSON *x = p->child; x; x = x->next) {
            double id;
            /* a token id (the vocabulary is the engine's check) */
            if (!as_int(x, 0, INT32_MAX, &id))
                return api_error(err, 400, "prompt", "token ids in 'prompt' must be non-negative integers");
            tok_ids_push(out, (int32_t)id);
        }
    } else {
        return api_error(err, 400, "prompt",
                         "'prompt' must be a string, an array of token ids, or an array of those");
    }
    size_t k = out->n - n0;
    if (k == 0) return api_error(err, 400, "prompt", "'prompt' must not be empty");
    for (size_t i = n0; lim->vision.tokens && i < out->n; i++)
        if (out->ids[i] == lim->vision.token_id)
            return api_error(err, 400, "prompt",
                             "'prompt' holds token %d, the image placeholder (image_token_index): images go in "
                             "image_url parts of /v1/chat/completions messages", lim->vision.token_id);
    if (k >= lim->context)
        return api_error(err, 400, "prompt",
                         "the prompt has %zu tokens; %s of %zu positions leaves room for at most %zu prompt tokens",
                         k, api_context_name(lim), lim->context, lim->context - 1);
    return 0;
}

/* One prompt (string, or array of ids) or a batch (array of those). */
static int parse_prompts(ApiCompletion *q, const cJSON *o, const ApiLimits *lim, ApiError *err)
{
    const cJSON *p = field(o, "prompt");
    if (!p) return api_error(err, 400, "prompt", "'prompt' is required");
    bool batch = cJSON_IsArray(p) && p->child && (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
    int np = batch ? cJSON_GetArraySize(p) : 1;
    if (np > lim->max_n)
        return api_error(err, 400, "prompt", "at most %d prompts per request", lim->max_n);
    TokIds all = { 0 };
    q->offs = td_malloc((size_t)(np + 1) * sizeof(size_t));
    q->offs[0] = 0;
    const cJSON *x = batch ? p->child : p;
    for (int i = 0; i < np; i++, x = batch ? x->next : NULL) {
        if (prompt_one(x, lim, &all, err)) {
            tok_ids_free(&all);
            return -1;
        }
        q->offs[i + 1] = all.n;
    }
    q->n_prompts = np;
    q->tokens = all.ids;
    return 0;
}

/* ------------------------------------------------------------------- parse */

static int parse_stop(GenParams *gp, const cJSON *o, ApiError *err)
{
    const cJSON *v = field(o, "stop");
    if (!v) return 0;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v))
        return api_error(err, 400, "stop", "'stop' must be a string or an array of strings");
    if (!one && cJSON_GetArraySize(v) > ENGINE_MAX_STOP)
        return api_error(err, 400, "stop", "at most %d stop strings", ENGINE_MAX_STOP);
    for (const cJSON *s = one ? one : v->child; s; s = one ? NULL : s->next) {
        if (!cJSON_IsString(s)) return api_error(err, 400, "stop", "'stop' must be a string or an array of strings");
        if (strlen(s->valuestring) >= ENGINE_STOP_LEN)
            return api_error(err, 400, "stop", "stop strings are limited to %d bytes", ENGINE_STOP_LEN - 1);
        snprintf(gp->stop[gp->n_stop++], ENGINE_STOP_LEN, "%s", s->valuestring);
    }
    return 0;
}

/* max_tokens (chat: max_completion_tokens wins over max_tokens, as in
 * vLLM): the prompt plus the completion must fit the context (a request
 * that cannot is refused, as vLLM does); absent: completions 16, chat all
 * the context and the cache leave, either cut to what the context leaves. */
static int parse_max_tokens(ApiCompletion *q, const cJSON *o, const ApiLimits *lim, ApiError *err)
{
    size_t longest = 0;
    for (int i = 0; i < q->n_prompts; i++) longest = td_max(longest, q->offs[i + 1] - q->offs[i]);
    const char *key = "max_tokens";
    double v;
    int rc = 1;
    if (q->kind == API_CHAT && field(o, "max_completion_tokens")) key = "max_completion_tokens";
    rc = get_int(o, key, 1, (double)lim->context, 0, &v, err);
    if (rc < 0) return -1;
    if (rc == 1) {
        size_t room = lim->context - longest;
        /* the cache holds prompt + max_tokens - 1 positions */
        if (q->kind == API_CHAT) room = td_min(room, lim->kv_positions + 1 > longest ? lim->kv_positions + 1 - longest : 1);
        v = (double)(q->kind == API_CHAT ? room : td_min(API_DEFAULT_MAX_TOKENS, room));
    }
    q->gp.max_tokens = (int)v;
    if (longest + (size_t)q->gp.max_tokens > lim->context)
        return api_error(err, 400, key,
                         "the prompt (%zu tokens) plus %s (%d) exceeds %s of %zu positions", longest, key,
                         q->gp.max_tokens, api_context_name(lim), lim->context);
    return 0;
}

/* The fields completions and chat share. */
static int parse_sampling(ApiCompletion *q, const cJSON *o, const ApiLimits *lim, ApiError *err)
{
    GenParams *gp = &q->gp;
    double v;
    int rc;
    if (parse_max_tokens(q, o, lim, err)) return -1;
    if (get_num(o, "temperature", 0, false, 100, 1.0, &gp->sp.temperature, err) < 0) return -1;
    if (get_num(o, "top_p", 0, true, 1, 1.0, &gp->sp.top_p, err) < 0) return -1;
    if (get_int(o, "top_k", 0, 2147483647.0, 0, &v, err) < 0) return -1;
    gp->sp.top_k = (int)v;
    if (get_int(o, "n", 1, lim->max_n, 1, &v, err) < 0) return -1;
    q->n = (int)v;
    if (q->n * q->n_prompts > lim->max_n)
        return api_error(err, 400, "n", "n (%d) times the number of prompts (%d) exceeds the server's limit of %d",
                         q->n, q->n_prompts, lim->max_n);
    /* seeds are 64-bit; JSON numbers above 2^53 arrive rounded */
    if ((rc = get_int(o, "seed", 0, 18446744073709549568.0, 0, &v, err)) < 0) return -1;
    q->has_seed = rc == 0;
    q->seed = (uint64_t)v;
    if (parse_stop(gp, o, err)) return -1;
    if (get_bool(o, "stream", false, &q->stream, err) < 0) return -1;
    const cJSON *so = field(o, "stream_options");
    if (so && !cJSON_IsObject(so))
        return api_error(err, 400, "stream_options", "'stream_options' must be an object");
    if (so && get_bool(so, "include_usage", false, &q->include_usage, err) < 0) return -1;
    if (get_bool(o, "ignore_eos", false, &gp->ignore_eos, err) < 0) return -1;   /* vLLM's extension */
    return 0;
}

static int parse_fields(ApiCompletion *q, const cJSON *o, const ApiLimits *lim, ApiError *err)
{
    double v;
    int rc;
    if (parse_prompts(q, o, lim, err) || parse_sampling(q, o, lim, err)) return -1;
    if ((rc = get_int(o, "logprobs", 0, API_MAX_LOGPROBS, 0, &v, err)) < 0) return -1;
    q->logprobs = rc == 0;
    q->gp.n_top = (int)v;
    return check_unsupported(o, q->n, err);
}

static cJSON *parse_body(const char *body, size_t len, ApiError *err)
{
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        api_error(err, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

int api_parse_completion(ApiCompletion *q, const char *body, size_t len, const ApiLimits *lim, ApiError *err)
{
    memset(q, 0, sizeof *q);
    q->kind = API_COMPLETION;
    q->gp.sp.temperature = 1.0;
    q->gp.sp.top_p = 1.0;
    cJSON *o = parse_body(body, len, err);
    if (!o) return -1;
    int rc = parse_fields(q, o, lim, err);
    cJSON_Delete(o);
    if (rc) api_completion_free(q);
    return rc;
}

/* ------------------------------------------------------------------- chat */

/* The chat prompt: the messages rendered by the model's template, encoded
 * (special tokens come from the template: add_special_tokens=False, as
 * vLLM and apply_chat_template(tokenize=True) do), appended to out.
 * agp: add_generation_prompt when the body does not set it. */
static int render_messages(cJSON *o, const ApiLimits *lim, bool agp, TokIds *out, bool want_pixels, float **pixels,
                           size_t *n_img, ApiError *err)
{
    *pixels = NULL;
    *n_img = 0;
    cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!m) return api_error(err, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(m) || !m->child)
        return api_error(err, 400, "messages", "'messages' must be a non-empty array of messages");
    if (!lim->chat) return api_error(err, 400, "messages", "%s", lim->chat_error);
    const cJSON *g = field(o, "add_generation_prompt");
    if (g && !cJSON_IsBool(g))
        return api_error(err, 400, "add_generation_prompt", "'add_generation_prompt' must be true or false");
    if (g) agp = cJSON_IsTrue(g);
    const cJSON *tools = field(o, "tools"), *kw = field(o, "chat_template_kwargs");
    if (tools && !cJSON_IsArray(tools)) return api_error(err, 400, "tools", "'tools' must be an array");
    if (kw && !cJSON_IsObject(kw))
        return api_error(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    char *text, why[480];
    size_t tl;
    /* image parts: decoded, and their messages flattened for the template */
    if (api_images_collect(m, &lim->vision, lim->context, want_pixels, pixels, n_img, why, sizeof why))
        return api_error(err, 400, "messages", "%s", why);
    if (chat_template_render_cjson(lim->chat, m, tools, kw, agp, NULL, &text, &tl, why, sizeof why))
        return api_error(err, 400, strncmp(why, "tools", 5) ? "messages" : "tools", "%s", why);
    int rc = tok_encode(lim->tok, text, tl, false, out, why, sizeof why);
    td_free(text);
    if (rc) return api_error(err, 400, "messages", "the rendered chat: %s", why);
    if (api_images_expand(out, &lim->vision, *n_img, why, sizeof why))
        return api_error(err, 400, "messages", "%s", why);
    return 0;
}

static int parse_chat_fields(ApiCompletion *q, cJSON *o, const ApiLimits *lim, ApiError *err)
{
    TokIds ids = { 0 };
    if (render_messages(o, lim, true, &ids, true, &q->pixels, &q->n_img, err)) {
        tok_ids_free(&ids);
        return -1;
    }
    q->n_prompts = 1;
    q->tokens = ids.ids;
    q->offs = td_malloc(2 * sizeof(size_t));
    q->offs[0] = 0;
    q->offs[1] = ids.n;
    if (ids.n == 0) return api_error(err, 400, "messages", "the chat template rendered an empty prompt");
    if (ids.n >= lim->context)
        return api_error(err, 400, "messages",
                         "the rendered chat has %zu tokens; %s of %zu positions leaves room for at most %zu "
                         "prompt tokens",
                         ids.n, api_context_name(lim), lim->context, lim->context - 1);
    if (parse_sampling(q, o, lim, err)) return -1;
    double v;
    if (get_bool(o, "logprobs", false, &q->logprobs, err) < 0) return -1;
    int rc = get_int(o, "top_logprobs", 0, API_MAX_LOGPROBS, 0, &v, err);
    if (rc < 0) return -1;
    if (rc == 0 && !q->logprobs)
        return api_error(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    q->gp.n_top = (int)v;
    static const struct {
        const char *key;
        double neutral;
    } nums[] = { { "presence_penalty", 0 }, { "frequency_penalty", 0 }, { "repetition_penalty", 1 }, { "min_tokens", 0 } };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const cJSON *x = field(o, nums[i].key);
        if (x && (!cJSON_IsNumber(x) || x->valuedouble != nums[i].neutral))
            return api_error(err, 400, nums[i].key, "'%s' is not supported (only %g)", nums[i].key, nums[i].neutral);
    }
    const cJSON *x = field(o, "logit_bias");
    if (x && !(cJSON_IsObject(x) && !x->child))
        return api_error(err, 400, "logit_bias", "'logit_bias' is not supported");
    x = field(o, "response_format");
    const cJSON *t = x ? cJSON_GetObjectItemCaseSensitive(x, "type") : NULL;
    if (x && !(cJSON_IsObject(x) && cJSON_IsString(t) && !strcmp(t->valuestring, "text")))
        return api_error(err, 400, "response_format", "'response_format' other than {\"type\": \"text\"} is not supported");
    x = field(o, "tool_choice");
    if (x && !(cJSON_IsString(x) && (!strcmp(x->valuestring, "none") || !strcmp(x->valuestring, "auto"))))
        return api_error(err, 400, "tool_choice",
                         "'tool_choice' other than \"none\" or \"auto\" is not supported (tools are shown to the "
                         "template; calls are not parsed out of the answer)");
    x = field(o, "model");
    if (x && !cJSON_IsString(x)) return api_error(err, 400, "model", "'model' must be a string");
    return 0;
}

int api_parse_chat(ApiCompletion *q, const char *body, size_t len, const ApiLimits *lim, ApiError *err)
{
    memset(q, 0, sizeof *q);
    q->kind = API_CHAT;
    q->gp.sp.temperature = 1.0;
    q->gp.sp.top_p = 1.0;
    cJSON *o = parse_body(body, len, err);
    if (!o) return -1;
    int rc = parse_chat_fields(q, o, lim, err);
    cJSON_Delete(o);
    if (rc) api_completion_free(q);
    return rc;
}

/* -------------------------------------------------------- tokenize, detokenize */

cJSON *api_tokenize(const char *body, size_t len, const ApiLimits *lim, ApiError *err)
{
    cJSON *o = parse_body(body, len, err);
    if (!o) return NULL;
    const cJSON *p = field(o, "prompt"), *m = field(o, "messages");
    TokIds ids = { 0 };
    bool special;
    int rc = 0;
    if (!!p == !!m) rc = api_error(err, 400, p ? "prompt" : NULL, "give one of 'prompt' (a string) and 'messages'");
    else if (p && !cJSON_IsString(p)) rc = api_error(err, 400, "prompt", "'prompt' must be a string");
    else if (get_bool(o, "add_special_tokens", p != NULL, &special, err) < 0) rc = -1;
    else if (p) {
        char why[256];
        if (tok_encode(lim->tok, p->valuestring, strlen(p->valuestring), special, &ids, why, sizeof why))
            rc = api_error(err, 400, "prompt", "'prompt': %s", why);
    } else if (special) {
        rc = api_error(err, 400, "add_special_tokens",
                       "'add_special_tokens' with 'messages' is not supported (the chat template places them)");
    } else {
        float *px;
        size_t n_img;
        rc = render_messages(o, lim, true, &ids, false, &px, &n_img, err);
    }
    cJSON_Delete(o);
    if (rc) {
        tok_ids_free(&ids);
        return NULL;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "count", (double)ids.n);
    cJSON_AddNumberToObject(r, "max_model_len", (double)lim->context);
    cJSON *t = cJSON_AddArrayToObject(r, "tokens");
    for (size_t i = 0; i < ids.n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids.ids[i]));
    tok_ids_free(&ids);
    return r;
}

cJSON *api_detokenize(const char *body, size_t len, const ApiLimits *lim, ApiError *err)
{
    cJSON *o = parse_body(body, len, err);
    if (!o) return NULL;
    const cJSON *t = field(o, "tokens");
    TokIds ids = { 0 };
    int rc = 0;
    if (!cJSON_IsArray(t)) rc = api_error(err, 400, "tokens", "'tokens' must be an array of token ids");
    for (const cJSON *x = rc ? NULL : t->child; x && !rc; x = x->next) {
        double id;
        if (!as_int(x, -2147483648.0, 2147483647.0, &id))
            rc = api_error(err, 400, "tokens", "'tokens' must be an array of token ids (integers)");
        else {
            tok_ids_push(&ids, (int32_t)id);
        }
    }
    cJSON_Delete(o);
    TokText text = { 0 };
    char why[256];
    if (!rc && tok_decode(lim->tok, ids.ids, ids.n, false, &text, why, sizeof why))
        rc = api_error(err, 400, "tokens", "%s", why);
    tok_ids_free(&ids);
    if (rc) {
        tok_text_free(&text);
        return NULL;
    }
    cJSON *r = cJSON_CreateObject();
    char *js = td_json_string(text.s ? text.s : "", text.len);
    cJSON_AddRawToObject(r, "prompt", js);
    td_free(js);
    tok_text_free(&text);
    return r;
}

void api_completion_free(ApiCompletion *q)
{
    td_free(q->tokens);
    td_free(q->offs);
    td_free(q->pixels);
    memset(q, 0, sizeof *q);
}

/* --------------------------------------------------------------- responses */

cJSON *api_response_new(const char *id, const char *object, long created, const char *model)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddArrayToObject(o, "choices");
    return o;
}

void api_token_str(const Tokenizer *tok, int32_t id, TokText *out)
{
    char err[64], num[24];
    if (id < 0 || id >= tok_vocab_size(tok)) {
        snprintf(num, sizeof num, "token:%d", (int)id);
        tok_text_put(out, num, strlen(num));
        return;
    }
    TokText b = { 0 };
    tok_token_bytes(tok, id, &b, err, sizeof err);
    bool plain = tok_utf8_valid(b.s ? b.s : "", b.len);
    for (size_t i = 0; i < b.len && plain; i++) {
        unsigned char c = (unsigned char)b.s[i];
        plain = !((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f);
    }
    if (plain) tok_text_put(out, b.s ? b.s : "", b.len);
    else {
        tok_text_put(out, "bytes:", 6);
        for (size_t i = 0; i < b.len; i++) {
            snprintf(num, sizeof num, "\\x%02x", (unsigned char)b.s[i]);
            tok_text_put(out, num, 4);
        }
    }
    tok_text_free(&b);
}

/* A string item (may hold a NUL) as raw JSON. */
static void add_raw_string(cJSON *o, const char *key, const char *s, size_t n)
{
    char *js = td_json_string(s ? s : "", n);
    if (key) cJSON_AddRawToObject(o, key, js);
    else cJSON_AddItemToArray(o, cJSON_CreateRaw(js));
    td_free(js);
}

static void add_logprobs(cJSON *ch, const ApiCompletion *q, const ApiChoice *c, size_t from, size_t to,
                         const Tokenizer *tok)
{
    cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
    TokText s = { 0 };
    for (size_t i = from; i < to; i++) {
        s.len = 0;
        api_token_str(tok, c->ids[i], &s);
        add_raw_string(toks, NULL, s.s, s.len);
        /* float -> double is exact, and cJSON prints up to 17 digits, so
         * the value parses back to the same float */
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(c->logp[i]));
        cJSON *alt = cJSON_CreateObject();
        for (int j = 0; c->top && j < c->top[i].n_top && j < q->gp.n_top; j++) {
            s.len = 0;
            api_token_str(tok, c->top[i].top_id[j], &s);
            /* a key with a NUL would be cut: such a token is spelled by its bytes */
            cJSON_AddNumberToObject(alt, memchr(s.s, 0, s.len) ? "bytes:\\x00" : s.s, c->top[i].top_logp[j]);
        }
        cJSON_AddItemToArray(top, alt);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)c->off[i]));
    }
    tok_text_free(&s);
}

static void add_ids_seed(cJSON *ch, const ApiChoice *c, size_t from, size_t to)
{
    cJSON *ids = cJSON_AddArrayToObject(ch, "token_ids");
    for (size_t i = from; i < to; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(c->ids[i]));
    /* printed as an integer: cJSON would print a double above 2^31 as 4.1e+15 */
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddRawToObject(ch, "seed", seed);
    snprintf(seed, sizeof seed, "%lld", (long long)c->weights_step);
    cJSON_AddRawToObject(ch, "weights_step", seed);
}

void api_add_choice(cJSON *o, const ApiCompletion *q, const ApiChoice *c, int index, size_t from, size_t to,
                    size_t text_from, size_t text_to, const char *finish_reason, const Tokenizer *tok)
{
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    add_raw_string(ch, "text", c->text + text_from, text_to - text_from);
    if (q->logprobs) add_logprobs(ch, q, c, from, to, tok);
    else cJSON_AddNullToObject(ch, "logprobs");
    add_ids_seed(ch, c, from, to);
    if (finish_reason) cJSON_AddStringToObject(ch, "finish_reason", finish_reason);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
}

/* {token, logprob, bytes} of one id, the chat logprobs' entry. */
static cJSON *chat_token(const Tokenizer *tok, int32_t id, float logp, TokText *s)
{
    cJSON *e = cJSON_CreateObject();
    char err[64];
    s->len = 0;
    api_token_str(tok, id, s);
    add_raw_string(e, "token", s->s, s->len);
    cJSON_AddNumberToObject(e, "logprob", logp);
    cJSON *b = cJSON_AddArrayToObject(e, "bytes");
    s->len = 0;
    if (id >= 0 && id < tok_vocab_size(tok)) tok_token_bytes(tok, id, s, err, sizeof err);
    for (size_t i = 0; i < s->len; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)s->s[i]));
    return e;
}

void api_add_chat_choice(cJSON *o, const ApiCompletion *q, const ApiChoice *c, int index, bool chunk, bool role,
                         size_t from, size_t to, size_t text_from, size_t text_to, const char *finish_reason,
                         const Tokenizer *tok)
{
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    cJSON *msg = cJSON_AddObjectToObject(ch, chunk ? "delta" : "message");
    if (!chunk || role) cJSON_AddStringToObject(msg, "role", "assistant");
    if (!chunk || role || text_to > text_from) add_raw_string(msg, "content", c->text + text_from, text_to - text_from);
    if (q->logprobs && (!chunk || to > from)) {
        cJSON *content = cJSON_AddArrayToObject(cJSON_AddObjectToObject(ch, "logprobs"), "content");
        TokText s = { 0 };
        for (size_t i = from; i < to; i++) {
            cJSON *e = chat_token(tok, c->ids[i], c->logp[i], &s);
            cJSON *alts = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int j = 0; c->top && j < c->top[i].n_top && j < q->gp.n_top; j++)
                cJSON_AddItemToArray(alts, chat_token(tok, c->top[i].top_id[j], c->top[i].top_logp[j], &s));
            cJSON_AddItemToArray(content, e);
        }
        tok_text_free(&s);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    add_ids_seed(ch, c, from, to);
    if (finish_reason) cJSON_AddStringToObject(ch, "finish_reason", finish_reason);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
}

void api_add_usage(cJSON *o, size_t prompt_tokens, size_t completion_tokens)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
}

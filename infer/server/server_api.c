/* infer/server/server_api.c - OpenAI completions JSON for `tandem serve`
 * (server_api.h): request validation, responses, stream chunks, errors. */
#include "infer/server/server_api.h"
#include "core/common.h"
#include "infer/text.h"

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

/* Tokens of one prompt (a string or an array of ids), validated; writes
 * them to dst when not NULL. */
static int prompt_one(const cJSON *p, const ApiLimits *lim, int32_t *dst, size_t *len, ApiError *err)
{
    size_t k = 0;
    if (cJSON_IsString(p)) {
        k = strlen(p->valuestring);
        if (dst && k < lim->context) text_to_tokens(dst, p->valuestring, k);
    } else if (cJSON_IsArray(p)) {
        for (const cJSON *x = p->child; x; x = x->next) {
            double id;
            /* a token id (the vocabulary is the engine's check) */
            if (!as_int(x, 0, INT32_MAX, &id))
                return api_error(err, 400, "prompt", "token ids in 'prompt' must be non-negative integers");
            if (dst && k < lim->context) dst[k] = (int32_t)id;
            k++;
        }
    } else {
        return api_error(err, 400, "prompt",
                         "'prompt' must be a string, an array of token ids, or an array of those");
    }
    if (k == 0) return api_error(err, 400, "prompt", "'prompt' must not be empty");
    if (k >= lim->context)
        return api_error(err, 400, "prompt",
                         "the prompt has %zu tokens; the model's context of %zu positions leaves room for at "
                         "most %zu prompt tokens",
                         k, lim->context, lim->context - 1);
    *len = k;
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
    /* pass 1: validate and count; pass 2: copy */
    size_t total = 0, len;
    const cJSON *x = batch ? p->child : p;
    for (int i = 0; i < np; i++, x = batch ? x->next : NULL) {
        if (prompt_one(x, lim, NULL, &len, err)) return -1;
        total += len;
    }
    q->n_prompts = np;
    q->tokens = td_malloc(total * sizeof(int32_t));
    q->offs = td_malloc((size_t)(np + 1) * sizeof(size_t));
    q->offs[0] = 0;
    x = batch ? p->child : p;
    for (int i = 0; i < np; i++, x = batch ? x->next : NULL) {
        prompt_one(x, lim, q->tokens + q->offs[i], &len, err);
        q->offs[i + 1] = q->offs[i] + len;
    }
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

static int parse_fields(ApiCompletion *q, const cJSON *o, const ApiLimits *lim, ApiError *err)
{
    GenParams *gp = &q->gp;
    double v;
    if (parse_prompts(q, o, lim, err)) return -1;
    size_t longest = 0;
    for (int i = 0; i < q->n_prompts; i++) longest = td_max(longest, q->offs[i + 1] - q->offs[i]);

    /* max_tokens: the prompt plus the completion must fit the context (a
     * request that cannot is refused, as vLLM does); absent: 16, cut to
     * what the context leaves. */
    int rc = get_int(o, "max_tokens", 1, (double)lim->context, 0, &v, err);
    if (rc < 0) return -1;
    if (rc == 1) v = (double)td_min(API_DEFAULT_MAX_TOKENS, lim->context - longest);
    gp->max_tokens = (int)v;
    if (longest + (size_t)gp->max_tokens > lim->context)
        return api_error(err, 400, "max_tokens",
                         "the prompt (%zu tokens) plus max_tokens (%d) exceeds the model's context of %zu positions",
                         longest, gp->max_tokens, lim->context);

    if (get_num(o, "temperature", 0, false, 100, 1.0, &gp->sp.temperature, err) < 0) return -1;
    if (get_num(o, "top_p", 0, true, 1, 1.0, &gp->sp.top_p, err) < 0) return -1;
    if (get_int(o, "top_k", 0, 2147483647.0, 0, &v, err) < 0) return -1;
    gp->sp.top_k = (int)v;
    if (get_int(o, "n", 1, lim->max_n, 1, &v, err) < 0) return -1;
    q->n = (int)v;
    if (q->n * q->n_prompts > lim->max_n)
        return api_error(err, 400, "n", "n (%d) times the number of prompts (%d) exceeds the server's limit of %d",
                         q->n, q->n_prompts, lim->max_n);
    if ((rc = get_int(o, "logprobs", 0, API_MAX_LOGPROBS, 0, &v, err)) < 0) return -1;
    q->logprobs = rc == 0;
    gp->n_top = (int)v;
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
    return check_unsupported(o, q->n, err);
}

int api_parse_completion(ApiCompletion *q, const char *body, size_t len, const ApiLimits *lim, ApiError *err)
{
    memset(q, 0, sizeof *q);
    q->gp.sp.temperature = 1.0;
    q->gp.sp.top_p = 1.0;
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return api_error(err, 400, NULL, "the request body must be a JSON object");
    }
    int rc = parse_fields(q, o, lim, err);
    cJSON_Delete(o);
    if (rc) api_completion_free(q);
    return rc;
}

void api_completion_free(ApiCompletion *q)
{
    td_free(q->tokens);
    td_free(q->offs);
    memset(q, 0, sizeof *q);
}

/* -------------------------------------------------------------------- text */

size_t api_text(char *out, size_t *offs, const int32_t *ids, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int l = text_utf8_len(ids + i, n - i);
        size_t g = l > 0 ? (size_t)l : 1;
        /* the bytes come from text_from_tokens, the grouping from text_utf8_len,
         * so text and offsets always agree */
        size_t w = text_from_tokens(out + o, ids + i, g);
        if (offs)
            for (size_t j = 0; j < g; j++) offs[i + j] = o;
        o += w;
        i += g;
    }
    out[o] = 0;
    return o;
}

size_t api_stream_ready(const GenParams *gp, const int32_t *ids, size_t from, size_t n)
{
    /* hold back the longest tail that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int s = 0; s < gp->n_stop; s++) {
        size_t L = strlen(gp->stop[s]);
        for (size_t k = td_min(L ? L - 1 : 0, n - from); k > hold; k--) {
            size_t j = 0;
            while (j < k && ids[n - k + j] == (int32_t)(unsigned char)gp->stop[s][j]) j++;
            if (j == k) {
                hold = k;
                break;
            }
        }
    }
    size_t end = n - hold, pos = from;
    while (pos < end) {
        uint8_t buf[256];
        size_t k = td_min(sizeof buf, end - pos);
        for (size_t i = 0; i < k; i++) buf[i] = (uint8_t)ids[pos + i];
        size_t ok = text_complete_prefix(buf, k);
        pos += ok;
        if (ok < k && pos + (k - ok) == end) break;   /* an incomplete character ends the tokens */
        if (ok == 0) break;                            /* cannot happen with a 256-byte window */
    }
    return pos;
}

/* --------------------------------------------------------------- responses */

cJSON *api_response_new(const char *id, long created, const char *model)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddArrayToObject(o, "choices");
    return o;
}

/* OpenAI's token strings: the character for printable ASCII (and tab and
 * newlines), "bytes:\xNN" for every other byte. */
static void token_str(char out[24], int32_t id)
{
    if ((id >= 0x20 && id < 0x7f) || id == '\n' || id == '\t' || id == '\r') {
        out[0] = (char)id;
        out[1] = 0;
    } else if (id >= 0 && id < 256) {
        snprintf(out, 24, "bytes:\\x%02x", (unsigned)id);
    } else {
        snprintf(out, 24, "token:%d", (int)id);
    }
}

static void add_logprobs(cJSON *ch, const ApiCompletion *q, const ApiChoice *c, size_t from, size_t to,
                         const size_t *offs, size_t text_base)
{
    cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
    char s[24];
    for (size_t i = from; i < to; i++) {
        token_str(s, c->ids[i]);
        cJSON_AddItemToArray(toks, cJSON_CreateString(s));
        /* float -> double is exact, and cJSON prints up to 17 digits, so
         * the value parses back to the same float */
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(c->logp[i]));
        cJSON *alt = cJSON_CreateObject();
        for (int j = 0; c->top && j < c->top[i].n_top && j < q->gp.n_top; j++) {
            token_str(s, c->top[i].top_id[j]);
            cJSON_AddNumberToObject(alt, s, c->top[i].top_logp[j]);
        }
        cJSON_AddItemToArray(top, alt);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(text_base + offs[i - from])));
    }
}

/* The JSON string literal of s[0..len) (valid UTF-8).  cJSON strings end
 * at a NUL byte, and a NUL is a token like any other, so the text fields are
 * written as raw JSON. */
static char *json_string(const char *s, size_t len)
{
    char *o = td_malloc(6 * len + 3);
    size_t k = 0;
    o[k++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            o[k++] = '\\';
            o[k++] = (char)ch;
        } else if (ch == '\n') {
            o[k++] = '\\';
            o[k++] = 'n';
        } else if (ch < 0x20 || ch == 0x7f) {
            k += (size_t)snprintf(o + k, 7, "\\u%04x", ch);
        } else {
            o[k++] = (char)ch;
        }
    }
    o[k++] = '"';
    o[k] = 0;
    return o;
}

size_t api_add_choice(cJSON *o, const ApiCompletion *q, const ApiChoice *c, int index, size_t from, size_t to,
                      size_t text_base, const char *finish_reason)
{
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    size_t n = to - from;
    char *text = td_malloc(3 * n + 1);
    size_t *offs = td_malloc((n ? n : 1) * sizeof(size_t));
    size_t len = api_text(text, offs, c->ids + from, n);
    cJSON_AddNumberToObject(ch, "index", index);
    char *js = json_string(text, len);
    cJSON_AddRawToObject(ch, "text", js);
    td_free(js);
    if (q->logprobs) add_logprobs(ch, q, c, from, to, offs, text_base);
    else cJSON_AddNullToObject(ch, "logprobs");
    cJSON *ids = cJSON_AddArrayToObject(ch, "token_ids");
    for (size_t i = from; i < to; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(c->ids[i]));
    /* printed as an integer: cJSON would print a double above 2^31 as 4.1e+15 */
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddRawToObject(ch, "seed", seed);
    if (finish_reason) cJSON_AddStringToObject(ch, "finish_reason", finish_reason);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    td_free(text);
    td_free(offs);
    return len;
}

void api_add_usage(cJSON *o, size_t prompt_tokens, size_t completion_tokens)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
}

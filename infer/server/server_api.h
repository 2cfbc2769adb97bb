/* infer/server/server_api.h - the OpenAI completions API of `tandem serve` as JSON:
 * parsing and validating a POST /v1/completions body, and building
 * responses, stream chunks and error objects.  No HTTP here (server.c owns
 * libmicrohttpd); every function is pure and thread-safe.
 *
 * Reference: the OpenAI legacy completions API (platform.openai.com/docs/
 * api-reference/completions) as vLLM serves it.  Differences and limits are
 * documented in docs/serving.md.
 */
#ifndef TANDEM_INFER_SERVER_SERVER_API_H
#define TANDEM_INFER_SERVER_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "infer/engine.h"

#define API_DEFAULT_MAX_TOKENS 16   /* OpenAI's default for completions */
#define API_MAX_LOGPROBS SAMPLER_TOP_MAX

/* What the server can honour; set once at start.  Token ids against the
 * vocabulary and prompt + max_tokens against the KV cache are checked by
 * the engine when the request is submitted (engine_check), for every
 * caller alike. */
typedef struct {
    size_t context;        /* max_position_embeddings: prompt + max_tokens <= context */
    int max_n;             /* choices per request (n x number of prompts) */
} ApiLimits;

/* A 4xx answer: HTTP status, the offending field ("" for none), a message. */
typedef struct {
    int status;
    char param[32];
    char message[512];
} ApiError;

/* A validated completions request.  Owns tokens and offs (api_completion_free). */
typedef struct {
    int n_prompts;
    int32_t *tokens;     /* all prompts back to back */
    size_t *offs;        /* prompt p is tokens[offs[p], offs[p+1]) */
    int n;               /* choices per prompt */
    GenParams gp;        /* max_tokens, sampling, n_top (= logprobs), stop strings */
    bool has_seed;       /* choice i of a prompt uses seed + i */
    uint64_t seed;
    bool logprobs;       /* "logprobs" was an integer (gp.n_top alternatives) */
    bool stream, include_usage;
} ApiCompletion;

/* Parses and validates body[0..len).  Returns 0 with q filled, or -1 with
 * err (status 400) and q empty.  Unknown fields are ignored; fields whose
 * value cannot be honoured (best_of != n, echo, penalties, suffix,
 * logit_bias) are refused naming the field. */
int api_parse_completion(ApiCompletion *q, const char *body, size_t len, const ApiLimits *lim, ApiError *err);
void api_completion_free(ApiCompletion *q);

/* {"error": {"message", "type", "param", "code": null}} as a malloc'd
 * string (free with cJSON_free); type is derived from err->status. */
char *api_error_body(const ApiError *err);
/* Sets err and returns -1 (for one-line error paths). */
int api_error(ApiError *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The generated tokens of one choice, as copied from the engine. */
typedef struct {
    const int32_t *ids;
    const float *logp;
    const Sampled *top;  /* NULL unless logprobs were requested */
    size_t n;
    uint64_t seed;       /* the seed the choice was sampled with */
} ApiChoice;

/* {"id", "object", "created", "model", "choices": []}; object is
 * "text_completion" (the stream chunks use the same object name, like the
 * OpenAI API). */
cJSON *api_response_new(const char *id, long created, const char *model);
/* Appends to o's "choices" the choice `index` made of tokens [from, to) of
 * c: text, logprobs (when q->logprobs; text_offset counts text_base bytes
 * before `from`), token_ids, seed and finish_reason (JSON null when NULL).
 * `from` must be a UTF-8 group boundary (0, or what api_stream_ready
 * returned).  Returns the byte length of the piece's text. */
size_t api_add_choice(cJSON *o, const ApiCompletion *q, const ApiChoice *c, int index, size_t from, size_t to,
                      size_t text_base, const char *finish_reason);
/* Adds "usage": {prompt_tokens, completion_tokens, total_tokens}. */
void api_add_usage(cJSON *o, size_t prompt_tokens, size_t completion_tokens);

/* How many of a streaming choice's n generated tokens can have been sent
 * once those before `from` (a UTF-8 group boundary) are: whole UTF-8
 * characters only, holding back a tail that could still become one of the
 * stop strings (the engine drops a matched stop string from the output, so
 * it must never have been sent).  Returns a group boundary in [from, n]. */
size_t api_stream_ready(const GenParams *gp, const int32_t *ids, size_t from, size_t n);

/* Text of byte tokens ids[0..n) (invalid or incomplete UTF-8 becomes
 * U+FFFD, as text_from_tokens) into out (at least 3 n + 1 bytes); offs (n,
 * may be NULL) gets each token's byte offset in out (a byte inside a
 * character gets the character's offset).  Returns the length. */
size_t api_text(char *out, size_t *offs, const int32_t *ids, size_t n);

#endif

/* infer/server/server_api.h - the OpenAI API of `tandem serve` as JSON:
 * parsing and validating the bodies of POST /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize, and building responses,
 * stream chunks and error objects.  No HTTP here (server.c owns
 * libmicrohttpd); every function is pure and thread-safe.
 *
 * Text goes through the model's tokenizer (ApiLimits.tok): string prompts
 * are encoded as vLLM encodes them (completions: HF's tokenizer(text),
 * special tokens added; chat: the chat template's rendering without
 * them), generated text is the engine's decode (Request.text).
 *
 * Reference: the OpenAI completions and chat completions APIs
 * (platform.openai.com/docs/api-reference) as vLLM serves them, and vLLM's
 * /tokenize and /detokenize.  Differences and limits: docs/serving.md.
 */
#ifndef TANDEM_INFER_SERVER_SERVER_API_H
#define TANDEM_INFER_SERVER_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "core/chat/chat.h"
#include "core/tok/tokenizer.h"
#include "infer/engine.h"
#include "infer/server/server_image.h"

#define API_DEFAULT_MAX_TOKENS 16   /* OpenAI's default for completions */
#define API_MAX_LOGPROBS SAMPLER_TOP_MAX

/* What the server can honour and what it parses with; set once at start.
 * Token ids against the vocabulary and prompt + max_tokens against the KV
 * cache are checked by the engine when the request is submitted
 * (engine_check), for every caller alike. */
typedef struct {
    size_t context;          /* engine_context: prompt + max_tokens <= context */
    size_t kv_positions;     /* the whole KV cache, in positions (chat's default max_tokens fits it) */
    int max_n;               /* choices per request (n x number of prompts) */
    const Tokenizer *tok;    /* the model's tokenizer (borrowed) */
    const ChatTemplate *chat;/* its chat template, NULL when it has none ... */
    const char *chat_error;  /* ... and then why (one line) */
    ApiVision vision;        /* images in chat content parts (vision.tokens 0: none) */
    const char *context_name;/* what sets context: "the model's context" (NULL too) or "the server's --max-context" */
} ApiLimits;

/* A 4xx answer: HTTP status, the offending field ("" for none), a message. */
typedef struct {
    int status;
    char param[32];
    char message[512];
} ApiError;

typedef enum { API_COMPLETION, API_CHAT } ApiKind;

/* A validated completions or chat request.  Owns tokens and offs
 * (api_completion_free). */
typedef struct {
    ApiKind kind;
    int n_prompts;       /* chat: 1 */
    int32_t *tokens;     /* all prompts back to back */
    size_t *offs;        /* prompt p is tokens[offs[p], offs[p+1]) */
    int n;               /* choices per prompt */
    GenParams gp;        /* max_tokens, sampling, n_top (alternatives), stop strings, ignore_eos */
    bool has_seed;       /* choice i of a prompt uses seed + i */
    uint64_t seed;
    bool logprobs;       /* completions: "logprobs" was an integer; chat: "logprobs": true */
    bool stream, include_usage;
    float *pixels;       /* chat: (n_img, 3, S, S) of the images in the order of their placeholders, or NULL */
    size_t n_img;
} ApiCompletion;

/* Parses and validates a POST /v1/completions body[0..len).  Returns 0
 * with q filled, or -1 with err (status 400) and q empty.  Unknown fields
 * are ignored; fields whose value cannot be honoured (best_of != n, echo,
 * penalties, suffix, logit_bias) are refused naming the field. */
int api_parse_completion(ApiCompletion *q, const char *body, size_t len, const ApiLimits *lim, ApiError *err);
/* The same for POST /v1/chat/completions: messages (checked, each error
 * naming the message; image_url parts decoded into q->pixels and their
 * placeholders expanded in the prompt, server_image.h), rendered with the
 * model's chat template
 * (add_generation_prompt true unless the body says otherwise; tools and
 * chat_template_kwargs passed to it) and encoded without special tokens;
 * max_completion_tokens or max_tokens (default: what the context and the
 * cache leave); logprobs (bool) with top_logprobs. */
int api_parse_chat(ApiCompletion *q, const char *body, size_t len, const ApiLimits *lim, ApiError *err);
void api_completion_free(ApiCompletion *q);

/* POST /tokenize: {"prompt": str} (add_special_tokens default true) or
 * {"messages": [...], "add_generation_prompt": bool (default true),
 * "add_special_tokens" (default false), "tools", "chat_template_kwargs"}.
 * Returns the response object {"count", "max_model_len", "tokens"}, or
 * NULL with err. */
cJSON *api_tokenize(const char *body, size_t len, const ApiLimits *lim, ApiError *err);
/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text}; an id outside
 * the tokenizer's vocabulary is a 400 naming it.  NULL with err. */
cJSON *api_detokenize(const char *body, size_t len, const ApiLimits *lim, ApiError *err);

/* {"error": {"message", "type", "param", "code": null}} as a malloc'd
 * string (free with cJSON_free); type is derived from err->status. */
char *api_error_body(const ApiError *err);
/* Sets err and returns -1 (for one-line error paths). */
int api_error(ApiError *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The generated tokens and text of one choice, as copied from the engine
 * (Request.out, .text, .out_off). */
typedef struct {
    const int32_t *ids;
    const float *logp;
    const Sampled *top;  /* NULL unless logprobs were requested */
    size_t n;
    const char *text;    /* text[0..text_len) */
    size_t text_len;
    const size_t *off;   /* (n) where each token's text begins */
    uint64_t seed;       /* the seed the choice was sampled with */
    int64_t weights_step;/* the training step of the weights that generated it */
} ApiChoice;

/* {"id", "object", "created", "model", "choices": []}; object is
 * "text_completion" for completions (its stream chunks too, like the
 * OpenAI API), "chat.completion" for a whole chat answer and
 * "chat.completion.chunk" for a chat stream chunk. */
cJSON *api_response_new(const char *id, const char *object, long created, const char *model);
/* Appends to o's "choices" the completion choice `index` made of tokens
 * [from, to) and text [text_from, text_to) of c: text, logprobs (when
 * q->logprobs; text_offset counts from the start of the choice's text),
 * token_ids, seed, weights_step and finish_reason (JSON null when NULL). */
void api_add_choice(cJSON *o, const ApiCompletion *q, const ApiChoice *c, int index, size_t from, size_t to,
                    size_t text_from, size_t text_to, const char *finish_reason, const Tokenizer *tok);
/* The chat form: a whole answer (chunk false: "message": {"role":
 * "assistant", "content"}) or a stream chunk ("delta": with "role" when
 * role is set, "content" when text_to > text_from or role), logprobs in
 * the chat shape ({"content": [{token, logprob, bytes, top_logprobs}]})
 * for tokens [from, to) when asked, token_ids, seed, finish_reason. */
void api_add_chat_choice(cJSON *o, const ApiCompletion *q, const ApiChoice *c, int index, bool chunk, bool role,
                         size_t from, size_t to, size_t text_from, size_t text_to, const char *finish_reason,
                         const Tokenizer *tok);
/* Adds "usage": {prompt_tokens, completion_tokens, total_tokens}. */
void api_add_usage(cJSON *o, size_t prompt_tokens, size_t completion_tokens);

/* OpenAI's string for a token: its bytes (tok_token_bytes) when they are
 * valid UTF-8 without control characters other than tab, CR and LF, else
 * "bytes:\xNN..." of each byte (the convention for partial characters);
 * "token:ID" for an id the tokenizer does not have.  Appends to out. */
void api_token_str(const Tokenizer *tok, int32_t id, TokText *out);

#endif

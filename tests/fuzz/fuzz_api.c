/* tests/fuzz/fuzz_api.c - libFuzzer harness for the request bodies `tandem
 * serve` parses (infer/server/server_api.h): POST /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize, whatever a client sends.
 *
 * Input: one byte choosing the endpoint (its value mod 4), then the body.
 * The limits are a server's: a 512-token context, the byte-level tokenizer
 * and a ChatML-style chat template with a system prompt, tools and
 * raise_exception; images of 4 placeholder tokens (id 1) in 8 x 8 pixels.  Any outcome is fine except a crash, a sanitizer report,
 * a leak, a refusal that is not a 4xx with a message, or an accepted
 * request that breaks its own limits (ids outside the vocabulary, a prompt
 * plus max_tokens past the context, n outside [1, max_n], placeholders
 * that do not number 4 per image).
 *   make fuzz-api FUZZ_TIME=60
 * A crash it finds becomes a case in tests/ref/serve_test.py once fixed. */
#include "core/chat/chat.h"
#include "core/tok/tokenizer.h"
#include "infer/server/server_api.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char CONFIG[] =
    "{\"bos_token\": \"\", \"eos_token\": \"\", \"chat_template\": \""
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\\n{% endif %}"
    "{% if tools %}tools: {{ tools | tojson }}\\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' and not tools %}{{ raise_exception('no tools given') }}{% endif %}"
    "<|{{ m.role }}|>{% if m.content is string %}{{ m.content }}{% elif m.content %}"
    "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}\\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}\"}";

static Tokenizer *g_tok;
static ChatTemplate *g_chat;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (!g_tok) {
        char err[512];
        g_tok = tok_byte_level();
        if (chat_template_load(&g_chat, CONFIG, sizeof CONFIG - 1, err, sizeof err)) abort();
    }
    /* images on: 4 tokens of id 1 (a control byte: the fuzzer's text may
     * spell it, so the count check and the expansion both run) */
    const ApiLimits lim = { .context = 512, .kv_positions = 4096, .max_n = 8, .tok = g_tok, .chat = g_chat,
                            .vision = { .tokens = 4, .token_id = 1, .size = 8, .mean = { 0.5f, 0.5f, 0.5f },
                                        .std = { 0.5f, 0.5f, 0.5f }, .max_images = 4 } };
    const char *body = (const char *)data + 1;
    const size_t n = size - 1;
    ApiError e;
    memset(&e, 0, sizeof e);
    const int which = data[0] % 4;
    if (which < 2) {
        ApiCompletion q;
        memset(&q, 0, sizeof q);
        int rc = which == 0 ? api_parse_completion(&q, body, n, &lim, &e) : api_parse_chat(&q, body, n, &lim, &e);
        if (rc) {
            if (e.status < 400 || e.status > 499 || !e.message[0]) abort();
            char *b = api_error_body(&e);
            if (!b) abort();
            cJSON_free(b);
            return 0;
        }
        if (q.n < 1 || q.n > lim.max_n || q.n_prompts < 1) abort();
        size_t placeholders = 0;
        for (size_t i = 0; i < q.offs[q.n_prompts]; i++) placeholders += q.tokens[i] == lim.vision.token_id;
        if (placeholders != q.n_img * lim.vision.tokens || (q.n_img && (!q.pixels || which != 1))) abort();
        for (int p = 0; p < q.n_prompts; p++) {
            const size_t len = q.offs[p + 1] - q.offs[p];
            if (len + (size_t)q.gp.max_tokens > lim.context) abort();
        }
        api_completion_free(&q);
        return 0;
    }
    cJSON *r = which == 2 ? api_tokenize(body, n, &lim, &e) : api_detokenize(body, n, &lim, &e);
    if (!r) {
        if (e.status < 400 || e.status > 499 || !e.message[0]) abort();
        return 0;
    }
    char *s = cJSON_PrintUnformatted(r);
    if (!s) abort();
    cJSON_free(s);
    cJSON_Delete(r);
    return 0;
}

/* tests/fuzz/fuzz_chat.c - libFuzzer harness for the Jinja compiler and
 * renderer (core/chat/jinja/jinja.h).
 *
 * Input: a template, optionally followed by a NUL byte and a JSON object of
 * variables (default: a small chat with messages, tools and special
 * tokens).  Compiles it; when it compiles, renders it under tight limits.
 * Any outcome is fine except a crash, a sanitizer report, a leak, or a
 * render that returns neither output nor an error message.
 *   make fuzz-chat FUZZ_TIME=60
 * A crash it finds (build/fuzz/crash-*) becomes a case in
 * tests/ref/fixtures_chat.py or tests/test_chat.c once fixed. */
#include "core/chat/jinja/jinja.h"
#include "core/common.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char DEFAULT_VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi <think>x</think>\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    " \"arguments\": {\"a\": 1.5, \"b\": [1, \"x\"]}}}]}, {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"n\": 3, \"f\": 0.5}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    const char *nul = memchr(src, 0, size);
    size_t tn = nul ? (size_t)(nul - src) : size;
    char err[600];
    JinjaTemplate *t = NULL;
    if (jinja_compile(&t, src, tn, err, sizeof err)) {
        if (!err[0]) abort(); /* a refusal always says why */
        return 0;
    }
    JinjaLimits lim;
    jinja_limits_default(&lim);
    lim.max_output = 1 << 16;
    lim.max_memory = 16 << 20;
    lim.max_steps = 200000;
    lim.now = 0;
    char *out = NULL;
    size_t on = 0;
    err[0] = 0;
    int rc = nul ? jinja_render_json(t, nul + 1, size - tn - 1, &lim, &out, &on, err, sizeof err)
                 : jinja_render_json(t, DEFAULT_VARS, sizeof DEFAULT_VARS - 1, &lim, &out, &on, err, sizeof err);
    if (rc == 0 && !out) abort();
    if (rc != 0 && (out || !err[0])) abort();
    td_free(out);
    jinja_free(t);
    return 0;
}

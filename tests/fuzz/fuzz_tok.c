/* tests/fuzz/fuzz_tok.c - libFuzzer harness for the tokenizer loader,
 * encoder and decoders (core/tok/tokenizer.h): what a checkpoint or an HF
 * directory hands tandem as tokenizer.json is untrusted input.
 *
 * Input: two little-endian bytes n, then n bytes of text, then a
 * tokenizer.json (tokenizer_config.json: a fixed small one naming special
 * tokens that may or may not exist).  Loads it; when it loads, encodes the
 * text with and without special tokens, decodes the ids (skipping special
 * tokens and not), streams them, asks for each id's bytes, and decodes a
 * few ids outside the vocabulary.  Any outcome is fine except a crash, a
 * sanitizer report, a leak, a refusal without a message, or a decode that
 * returns neither text nor an error.
 *   make fuzz-tok FUZZ_TIME=60
 * A crash it finds (build/fuzz/tok-crash-*) becomes a case in
 * tests/test_tok.c once fixed. */
#include "core/tok/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char CONFIG[] = "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\", \"special\": true}, "
                             "\"model_max_length\": 512, \"add_bos_token\": true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t tn = (size_t)data[0] | (size_t)data[1] << 8;
    if (tn > size - 2) tn = size - 2;
    const char *text = (const char *)data + 2, *json = text + tn;
    const size_t jn = size - 2 - tn;
    char err[600];
    err[0] = 0;
    Tokenizer *t = NULL;
    if (tok_load_mem(&t, json, jn, CONFIG, sizeof CONFIG - 1, err, sizeof err)) {
        if (!err[0]) abort();   /* a refusal always says why */
        return 0;
    }
    const int32_t V = tok_vocab_size(t);
    for (int special = 0; special < 2; special++) {
        TokIds ids = { 0 };
        err[0] = 0;
        if (tok_encode(t, text, tn, special, &ids, err, sizeof err)) {
            if (!err[0]) abort();
        } else {
            for (size_t i = 0; i < ids.n; i++)
                if (ids.ids[i] < 0 || ids.ids[i] >= V) abort();   /* an id the model cannot embed */
            for (int skip = 0; skip < 2; skip++) {
                TokText out = { 0 };
                err[0] = 0;
                if (tok_decode(t, ids.ids, ids.n, skip, &out, err, sizeof err) && !err[0]) abort();
                tok_text_free(&out);
            }
            /* the stream's pieces join to tok_decode's text */
            TokStream *s = tok_stream_new(t, special);
            TokText st = { 0 }, whole = { 0 };
            int bad_push = 0;
            for (size_t i = 0; i < ids.n && !bad_push; i++) bad_push = tok_stream_push(s, ids.ids[i], &st, err, sizeof err);
            tok_stream_finish(s, &st);
            tok_stream_free(s);
            if (bad_push) abort();   /* ids from tok_encode are all in range */
            if (tok_decode(t, ids.ids, ids.n, special, &whole, err, sizeof err) == 0 &&
                (st.len != whole.len || (st.len && memcmp(st.s, whole.s, st.len))))
                abort();
            tok_text_free(&st);
            tok_text_free(&whole);
            TokText b = { 0 };
            for (size_t i = 0; i < ids.n && i < 64; i++) (void)tok_token_bytes(t, ids.ids[i], &b, err, sizeof err);
            tok_text_free(&b);
        }
        tok_ids_free(&ids);
    }
    const int32_t bad[4] = { -1, V, V + 1, INT32_MAX };
    TokText out = { 0 };
    err[0] = 0;
    if (tok_decode(t, bad, 4, false, &out, err, sizeof err) == 0) abort();   /* out of range is refused */
    if (!err[0]) abort();
    tok_text_free(&out);
    tok_free(t);
    return 0;
}

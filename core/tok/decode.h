/* core/tok/decode.h - tokenizer.json `decoder` (HF
 * tokenizers/src/decoders): ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
 * Replace and Sequence; no decoder means HF's tokens.join(" ").  Then
 * transformers' clean_up_tokenization when tokenizer_config.json asks.
 *
 * The chain runs as a stream: each step takes the token strings (or,
 * after Fuse / ByteLevel, which join them, a growing single string) and
 * passes on what can no longer change: ByteLevel holds an incomplete UTF-8
 * sequence, ByteFallback a run of <0xNN> tokens (HF decodes a run as a
 * whole), Strip the trailing characters it may strip, a Replace on joined
 * text a possible partial match.  The whole decode is the stream fed every
 * token, then finished, so the two agree by construction.  Steps that
 * cannot stream exactly (ByteFallback or ByteLevel after a join) are
 * refused at load. */
#ifndef TANDEM_CORE_TOK_DECODE_H
#define TANDEM_CORE_TOK_DECODE_H

#include "core/tok/tok_util.h"

typedef struct Decoder Decoder;
typedef struct DecState DecState;

/* Reads j at `path` (NULL or JSON null: join with spaces).  bytes: the
 * built-in byte-level tokenizer (tokens are raw bytes).  cleanup: append
 * transformers' clean_up_tokenization.  0, or -1 with err. */
int dec_load(Decoder **out, const cJSON *j, const char *path, bool bytes, bool cleanup, char *err, size_t n);
void dec_free(Decoder *d);

DecState *dec_state_new(const Decoder *d);
void dec_state_free(DecState *st);
/* Feeds one token string; appends what is final to out. */
void dec_push(const Decoder *d, DecState *st, const char *tok, size_t n, TokText *out);
/* Appends everything held back and resets the state. */
void dec_finish(const Decoder *d, DecState *st, TokText *out);
/* The bytes one token string stands for in the middle of a text: each
 * per-token step applied to it alone (Replace, Strip and Metaspace of a
 * token that is not the first, ByteLevel's chars to their bytes,
 * ByteFallback's <0xNN> to its byte) with no UTF-8 repair, so a token
 * holding part of a character gives its raw bytes; steps on joined text
 * (a Strip of the whole text's ends, a Replace after a join, cleanup) do
 * not apply to one token.  Appends to out (raw bytes, not NUL-terminated
 * unless out already was). */
void dec_token_bytes(const Decoder *d, const char *tok, size_t n, TokBuf *out);

#endif

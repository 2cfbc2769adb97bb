/* core/tok/tokenizer.h - Hugging Face tokenizers for tandem: load an HF
 * `tokenizer.json` (+ `tokenizer_config.json`) and encode / decode exactly as
 * transformers' fast tokenizers do (the Rust `tokenizers` library plus the
 * few things transformers changes on top of it); or the built-in byte-level
 * tokenizer (V = 256, each byte its own id, no special tokens).
 *
 * Encoding (HF's TokenizerImpl::encode, single sequence):
 *   1. added tokens with normalized=false are split off the raw text
 *      (leftmost-longest, with their single_word / lstrip / rstrip rules);
 *   2. every other piece is normalized, then added tokens with
 *      normalized=true are split off the normalized pieces;
 *   3. the pre-tokenizer splits (and may rewrite) the remaining pieces;
 *   4. the BPE model turns each pre-token into ids (merges by rank);
 *   5. with add_special, the post-processor's tokens go around them.
 * Decoding maps ids to token strings (skipping special added tokens when
 * asked) and runs the decoder chain; a stream (TokStream) does the same one
 * id at a time and emits only whole UTF-8 characters.  Supported components,
 * what is refused and how each rule was matched: docs/tokenizer.md.
 *
 * Thread safety: a loaded Tokenizer is read-only; every function below may
 * be called from several threads at once on the same Tokenizer (encode
 * takes one of a few internal scratch slots).  A TokStream belongs to one
 * thread at a time.
 */
#ifndef TANDEM_CORE_TOK_TOKENIZER_H
#define TANDEM_CORE_TOK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* The most ids a tokenizer may have: every id of tokenizer.json (its
 * vocabulary and added tokens) must be below it, as tables are sized by
 * the largest id.  The largest released vocabularies have 262,144 ids. */
#define TOK_MAX_IDS (1 << 24)

/* Growable id list, owned by the caller (zero-initialise; tok_ids_free). */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} TokIds;
/* Growable UTF-8 text, NUL-terminated after s[len] once anything was
 * written; owned by the caller (zero-initialise; tok_text_free). */
typedef struct {
    char *s;
    size_t len, cap;
} TokText;

void tok_ids_free(TokIds *v);
/* Appends id (amortised doubling). */
void tok_ids_push(TokIds *v, int32_t id);
void tok_text_free(TokText *t);
/* Appends s[0..n) to t (NUL-terminated after). */
void tok_text_put(TokText *t, const char *s, size_t n);
/* True when s[0..n) is valid UTF-8 (what tok_encode takes). */
bool tok_utf8_valid(const char *s, size_t n);

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
 * Returns 0 and *out (free with tok_free), or -1 with one line in err
 * naming the file and the field or component at fault. */
int tok_load_dir(Tokenizer **out, const char *dir, char *err, size_t err_len);
/* Same from the two files' texts (config may be NULL: no
 * tokenizer_config.json).  The texts are copied; tok_json_text and
 * tok_config_text give them back (a checkpoint stores them). */
int tok_load_mem(Tokenizer **out, const char *json, size_t json_len, const char *config,
                 size_t config_len, char *err, size_t err_len);
/* The built-in byte-level tokenizer: V = 256, id = byte value, no special
 * tokens; decode replaces invalid UTF-8 by U+FFFD (Rust's from_utf8_lossy). */
Tokenizer *tok_byte_level(void);
/* NULL is fine. */
void tok_free(Tokenizer *t);

/* True for the built-in byte-level tokenizer. */
bool tok_is_byte_level(const Tokenizer *t);
/* Number of ids: 1 + the largest id of the vocabulary or added tokens
 * (Qwen3: 151669).  Every id in [0, V) may be decoded. */
int32_t tok_vocab_size(const Tokenizer *t);

/* Appends the ids of text[0..len) to out, as HF's
 * tokenizer(text, add_special_tokens=add_special)["input_ids"].  The text
 * must be valid UTF-8 (HF takes str): -1 with err naming the byte offset
 * otherwise (the byte-level tokenizer takes any bytes); nothing is
 * appended on failure. */
int tok_encode(const Tokenizer *t, const char *text, size_t len, bool add_special, TokIds *out,
               char *err, size_t err_len);
/* Appends the text of ids[0..n) to out, as HF's
 * tokenizer.decode(ids, skip_special_tokens=skip_special) (with the
 * config's clean_up_tokenization_spaces).  -1 with err when an id is
 * outside [0, V). */
int tok_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip_special, TokText *out,
               char *err, size_t err_len);

/* Incremental decoding: fed ids one at a time, appends text to `out` only
 * in whole UTF-8 characters, and the concatenation of everything appended
 * (after tok_stream_finish) equals tok_decode of all the ids.  Text is
 * held back only while later ids may still change it (an incomplete UTF-8
 * sequence, a run of <0xNN> byte tokens, a possible strip or cleanup). */
typedef struct TokStream TokStream;
TokStream *tok_stream_new(const Tokenizer *t, bool skip_special);
/* -1 with err when id is outside [0, V). */
int tok_stream_push(TokStream *s, int32_t id, TokText *out, char *err, size_t err_len);
/* Appends whatever is held back; the stream may then be reused from
 * scratch (as if new). */
void tok_stream_finish(TokStream *s, TokText *out);
void tok_stream_free(TokStream *s);

/* The token string of an id as the vocabulary spells it (e.g. "Ġthe",
 * "▁the", "<|im_end|>"; for the byte-level tokenizer the byte itself).
 * Borrowed, valid while t lives; *len its length; NULL for an id outside
 * [0, V) or one no token has. */
const char *tok_id_to_str(const Tokenizer *t, int32_t id, size_t *len);
/* Appends to out the bytes id stands for inside a text: the decoder
 * applied to its token string alone, as a token that is not the first
 * (Metaspace's leading space kept), without the UTF-8 repair of decode, so
 * a token holding part of a character gives its raw bytes ("\xe4\xbd"
 * for a ByteLevel or <0xNN> piece of a CJK character); what the decoder
 * does to the joined text (Strip of its ends, cleanup) is left out.
 * Added tokens go through the decoder as decode takes them (their content,
 * as a rule); the byte-level tokenizer gives the byte.  -1 with err for an
 * id outside [0, V); an id no token has gives nothing.  Any thread. */
int tok_token_bytes(const Tokenizer *t, int32_t id, TokText *out, char *err, size_t err_len);
/* The id of a token string (added tokens first, then the vocabulary), or
 * -1. */
int32_t tok_str_to_id(const Tokenizer *t, const char *s, size_t len);
/* True when id is a special added token (skipped by skip_special). */
bool tok_is_special(const Tokenizer *t, int32_t id);

/* bos_token / eos_token / pad_token of tokenizer_config.json (a string or
 * an AddedToken object) as ids; -1 when absent or not in the vocabulary. */
int32_t tok_bos_id(const Tokenizer *t);
int32_t tok_eos_id(const Tokenizer *t);
int32_t tok_pad_id(const Tokenizer *t);
/* Ids that end a generation: eos_token plus every special added token
 * named in the table of end-of-turn tokens (<|im_end|>, <|endoftext|>,
 * </s>, <｜end▁of▁sentence｜>, <|eot_id|>, ...: docs/tokenizer.md), no
 * duplicates, ascending.  Borrowed array; *n its length. */
const int32_t *tok_stop_ids(const Tokenizer *t, size_t *n);

/* The raw texts the tokenizer was loaded from (NUL-terminated, borrowed);
 * NULL for the byte-level tokenizer, and config NULL when there was none.
 * The chat engine reads chat_template, bos_token and eos_token from the
 * config. */
const char *tok_json_text(const Tokenizer *t, size_t *len);
const char *tok_config_text(const Tokenizer *t, size_t *len);

#endif

/* core/tok/pretok.h - tokenizer.json `pre_tokenizer` (HF
 * tokenizers/src/pre_tokenizers): Split (String or Regex pattern; behavior
 * Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous;
 * invert), ByteLevel (add_prefix_space, use_regex with GPT-2's regex),
 * Metaspace (replacement, prepend_scheme always/first/never, split),
 * Digits (individual_digits), Punctuation, Whitespace, WhitespaceSplit,
 * CharDelimiterSplit and Sequence.  Anything else is refused at load.
 *
 * Each step splits every piece that is not an added token into smaller
 * pieces (empty ones are dropped, as HF's PreTokenizedString::split does);
 * ByteLevel and Metaspace also rewrite the text, into the arena. */
#ifndef TANDEM_CORE_TOK_PRETOK_H
#define TANDEM_CORE_TOK_PRETOK_H

#include "core/tok/regex.h"
#include "core/tok/tok_util.h"

typedef struct PreTok PreTok;

/* Builds the pre-tokenizer of JSON j at `path` (NULL or JSON null: none,
 * *out = NULL).  prefix_space: add_prefix_space of tokenizer_config.json
 * (false when absent), which transformers' PreTrainedTokenizerFast writes
 * over a top-level pre-tokenizer's own add_prefix_space (ByteLevel).
 * 0, or -1 with err. */
int pretok_load(PreTok **out, const cJSON *j, const char *path, bool prefix_space, char *err, size_t n);
void pretok_free(PreTok *p);
/* True when the last step applied is ByteLevel: the model may then take
 * raw bytes (bpe.h, byte mode). */
bool pretok_ends_bytelevel(const PreTok *p);
/* Lets that last ByteLevel leave pieces as raw bytes (PIECE_BYTES). */
void pretok_set_bytes_out(PreTok *p, bool on);

/* Pre-tokenizes the pieces of *io in place (p may be NULL: nothing to do).
 * tmp and sp are scratch.  0, or -1 with err. */
int pretok_apply(const PreTok *p, TokBuf *arena, Pieces *io, Pieces *tmp, TokSpans *sp, TokRegexScratch *rx,
                 char *err, size_t en);

#endif

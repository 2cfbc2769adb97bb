/* core/tok/normalize.h - tokenizer.json `normalizer` (HF
 * tokenizers/src/normalizers): NFC, NFD, NFKC, NFKD, Lowercase, Strip,
 * StripAccents, Prepend, Append, Replace (String or Regex), ByteLevel and
 * Sequence.  Anything else (BertNormalizer, Precompiled, ...) is refused at
 * load, naming the component. */
#ifndef TANDEM_CORE_TOK_NORMALIZE_H
#define TANDEM_CORE_TOK_NORMALIZE_H

#include "core/tok/regex.h"
#include "core/tok/tok_util.h"

typedef struct Normalizer Normalizer;

/* Builds the normalizer of JSON j (NULL or JSON null: none, *out = NULL)
 * at `path`.  0, or -1 with err naming the field. */
int norm_load(Normalizer **out, const cJSON *j, const char *path, char *err, size_t n);
void norm_free(Normalizer *nz);

/* Per-thread scratch of norm_apply: the regex match state (borrowed) and
 * what norm_apply grows and keeps (the buffers a Sequence passes between
 * its members, two per nesting level; regex match ranges).  Zero it, set
 * rx, free with norm_scratch_free. */
typedef struct {
    TokRegexScratch *rx;
    TokBuf *buf;
    size_t n_buf;
    TokSpans sp;
} NormScratch;
void norm_scratch_free(NormScratch *ns);   /* not ns->rx */

/* Appends normalize(s[0..n)) to out (s valid UTF-8, not inside out or the
 * scratch).  nz may be NULL (identity).  0, or -1 with err (a regex
 * failure). */
int norm_apply(const Normalizer *nz, NormScratch *ns, TokBuf *out, const char *s, size_t n, char *err,
               size_t en);

/* True when norm_apply(nz, s) surely gives s back (nz NULL; Unicode
 * forms, or Sequences of them, on ASCII text), so the caller may skip it. */
bool norm_keeps(const Normalizer *nz, const char *s, size_t n);

#endif

/* core/tok/regex.h - the Unicode regexes of tokenizer.json (Split
 * pre-tokenizers, Replace normalizers) on PCRE2 (UTF + UCP, JIT).  The only
 * file that includes <pcre2.h>.
 *
 * HF compiles these patterns with Oniguruma; PCRE2 reads the same syntax
 * except where the two disagree on a class: Oniguruma's \s is Unicode
 * White_Space (it includes U+0085, PCRE2's does not), its \w is L|M|N|Pc
 * (PCRE2's is L|N|_) and its \h is a hex digit (PCRE2's: horizontal
 * space).  tokregex_compile rewrites \s \S \w \W \h \H to Oniguruma's
 * sets and refuses what it cannot rewrite (\S \W \H inside a bracket
 * class, nested classes, &&).  A literal pattern (Split {"String": ...}) is
 * matched as is.  Known pre-tokenizer patterns are matched by a
 * scanner over ASCII, PCRE2 deciding wherever a non-ASCII char matters
 * (regex.c). */
#ifndef TANDEM_CORE_TOK_REGEX_H
#define TANDEM_CORE_TOK_REGEX_H

#include <stdbool.h>
#include <stddef.h>

#include "core/tok/tok_util.h"

typedef struct TokRegex TokRegex;
/* Per-thread match state (PCRE2 match data and JIT stack). */
typedef struct TokRegexScratch TokRegexScratch;

/* Compiles pattern (literal when !is_regex).  0 and *out, or -1 with err
 * naming `path` and PCRE2's message. */
int tokregex_compile(TokRegex **out, const char *pattern, bool is_regex, const char *path, char *err,
                     size_t n);
void tokregex_free(TokRegex *re);
/* The patterns of GPT-2, Qwen2/3, Llama 3 and DeepSeek-V3 have a
 * hand-written scanner that answers for ASCII and leaves the rest to PCRE2
 * (same matches, faster); on by default.  Turns it on or off (tests
 * compare the two); returns whether re has one. */
bool tokregex_set_scanner(TokRegex *re, bool on);

TokRegexScratch *tokregex_scratch_new(void);
void tokregex_scratch_free(TokRegexScratch *sc);

/* Next match in s[0..n) at or after `from` (a character boundary):
 * 1 with [*ms, *me), 0 when none, -1 with err on a matching failure (JIT
 * stack exhausted, ...).  An empty match is reported like any other; the
 * caller steps past it.  s must be valid UTF-8 (not re-checked). */
int tokregex_find(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, size_t from,
                  size_t *ms, size_t *me, char *err, size_t en);

/* Every match of re in s[0..n), as Oniguruma's find_iter yields them (an
 * empty match right where the previous match ended is skipped), appended
 * to out as (start, end) pairs.  0, or -1 with err. */
int tokregex_find_all(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, TokSpans *out,
                      char *err, size_t en);

#endif

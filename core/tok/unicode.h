/* core/tok/unicode.h - the Unicode the tokenizer needs, on utf8proc (the
 * only file that includes <utf8proc.h>): normalization forms, Rust's
 * char predicates as HF's components use them, lowercase. */
#ifndef TANDEM_CORE_TOK_UNICODE_H
#define TANDEM_CORE_TOK_UNICODE_H

#include "core/tok/tok_util.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum { UNI_NFC, UNI_NFD, UNI_NFKC, UNI_NFKD } UniForm;

/* Appends the normalization form of valid UTF-8 s[0..n) to out. */
void uni_normalize(TokBuf *out, const char *s, size_t n, UniForm form);
/* Appends the lowercase of s[0..n) to out, char by char as Rust's
 * char::to_lowercase (full mapping: U+0130 becomes "i\u0307"). */
void uni_lowercase(TokBuf *out, const char *s, size_t n);
/* Appends s[0..n) without its nonspacing marks (Mn): HF's StripAccents. */
void uni_strip_marks(TokBuf *out, const char *s, size_t n);

/* Rust char::is_whitespace (White_Space). */
bool uni_is_whitespace(uint32_t cp);
/* Rust char::is_numeric (Nd, Nl, No). */
bool uni_is_numeric(uint32_t cp);
/* HF's is_punc: ASCII punctuation or a P* category. */
bool uni_is_punct(uint32_t cp);
/* Rust regex \w: alphabetic, M, Nd, Pc, join controls. */
bool uni_is_word(uint32_t cp);

#endif

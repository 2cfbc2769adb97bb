/* infer/text.h - byte-level token text: tokens are bytes, and the bytes of
 * a generation need not be valid UTF-8 (a sequence can be cut mid-character).
 * JSON needs valid UTF-8, so text fields are the bytes with each invalid or
 * incomplete sequence replaced by U+FFFD; the token ids stay exact. */
#ifndef TANDEM_INFER_TEXT_H
#define TANDEM_INFER_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* UTF-8 text of byte tokens ids[0..n): writes at most 3n+1 bytes to out
 * (NUL-terminated); returns the length. */
size_t text_from_tokens(char *out, const int32_t *ids, size_t n);
/* Length of the longest prefix of bytes[0..n) that does not end inside an
 * incomplete UTF-8 sequence (what a stream can emit now). */
size_t text_complete_prefix(const uint8_t *bytes, size_t n);
/* Length of the valid UTF-8 sequence starting at byte tokens ids[0..n):
 * 1..4, 0 when ids[0] starts no valid sequence, -1 when the tokens are a
 * valid but incomplete prefix.  The one definition of the rule that
 * text_from_tokens and text_complete_prefix follow. */
int text_utf8_len(const int32_t *ids, size_t n);
/* Tokens of a text (its bytes); returns n written (<= strlen). */
size_t text_to_tokens(int32_t *ids, const char *s, size_t len);

#endif

/* core/tok/unicode.c - utf8proc behind unicode.h. */
#include "core/tok/unicode.h"
#include "core/common.h"

#include <stdlib.h>
#include <utf8proc.h>

void uni_normalize(TokBuf *out, const char *s, size_t n, UniForm form)
{
    /* ASCII is invariant under every form (the common case, and utf8proc
     * is the slow part of a Qwen encode otherwise). */
    if (tok_ascii(s, n)) {
        tokbuf_put(out, s, n);
        return;
    }
    int opt = UTF8PROC_STABLE;
    if (form == UNI_NFC) opt |= UTF8PROC_COMPOSE;
    else if (form == UNI_NFD) opt |= UTF8PROC_DECOMPOSE;
    else if (form == UNI_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res, opt);
    TD_CHECK(m >= 0, "utf8proc_map failed on valid UTF-8: %s", utf8proc_errmsg(m));
    tokbuf_put(out, res, (size_t)m);
    free(res);   /* utf8proc allocates with malloc */
}

void uni_lowercase(TokBuf *out, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_next(s + i, n - i, &cp);
        TD_CHECK(l > 0, "uni_lowercase: invalid UTF-8");
        char buf[8];
        if (cp == 0x130) tokbuf_put(out, "i\xcc\x87", 3);   /* the one multi-char lowercase */
        else tokbuf_put(out, buf, (size_t)utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), buf));
        i += (size_t)l;
    }
}

void uni_strip_marks(TokBuf *out, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_next(s + i, n - i, &cp);
        TD_CHECK(l > 0, "uni_strip_marks: invalid UTF-8");
        if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN) tokbuf_put(out, s + i, (size_t)l);
        i += (size_t)l;
    }
}

bool uni_is_whitespace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

bool uni_is_numeric(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool uni_is_punct(uint32_t c)
{
    if (c < 0x80) return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
                         (c >= 0x7b && c <= 0x7e);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool uni_is_word(uint32_t c)
{
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200c || c == 0x200d) return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

/* core/tok/regex.c - PCRE2 behind the tokenizer's regex interface
 * (regex.h). */
#include "core/tok/regex.h"
#include "core/common.h"
#include "core/tok/tok_util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

struct TokRegex {
    pcre2_code *code;
    bool jit;
};

struct TokRegexScratch {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *stack;
};

/* Oniguruma's classes as PCRE2 sets (inside a bracket class, without the
 * brackets). */
#define ONIG_SPACE "\\s\\x{85}"
#define ONIG_WORD "\\p{L}\\p{M}\\p{N}\\p{Pc}"

/* Rewrites an Oniguruma pattern for PCRE2 (regex.h); -1 with err for a
 * construct without a PCRE2 equivalent. */
static int translate(TokBuf *out, const char *p, const char *path, char *err, size_t n)
{
    bool in_class = false;
    size_t len = strlen(p);
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < len) {
            char d = p[++i];
            const char *rep = NULL;
            if (in_class) {
                if (d == 's') rep = ONIG_SPACE;
                else if (d == 'w') rep = ONIG_WORD;
                else if (d == 'h') rep = "0-9a-fA-F";
                else if (d == 'S' || d == 'W' || d == 'H') {
                    tok_errf(err, n, "tokenizer.json: %s: \\%c inside a character class is not supported", path, d);
                    return -1;
                }
            } else {
                if (d == 's') rep = "[" ONIG_SPACE "]";
                else if (d == 'S') rep = "[^" ONIG_SPACE "]";
                else if (d == 'w') rep = "[" ONIG_WORD "]";
                else if (d == 'W') rep = "[^" ONIG_WORD "]";
                else if (d == 'h') rep = "[0-9a-fA-F]";   /* Oniguruma: hex digit */
                else if (d == 'H') rep = "[^0-9a-fA-F]";
            }
            if (rep) tokbuf_put(out, rep, strlen(rep));
            else {
                tokbuf_putc(out, '\\');
                tokbuf_putc(out, d);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tokbuf_putc(out, c);
            if (i + 1 < len && p[i + 1] == '^') tokbuf_putc(out, p[++i]);
            if (i + 1 < len && p[i + 1] == ']') tokbuf_putc(out, p[++i]);   /* a literal ] first */
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && p[i + 1] == ':') {   /* [:alpha:] */
            const char *end = strstr(p + i, ":]");
            size_t m = end ? (size_t)(end - (p + i)) + 2 : len - i;
            tokbuf_put(out, p + i, m);
            i += m - 1;
            continue;
        }
        if (in_class && c == '[') {
            tok_errf(err, n, "tokenizer.json: %s: nested character classes are not supported", path);
            return -1;
        }
        if (in_class && c == '&' && i + 1 < len && p[i + 1] == '&') {
            tok_errf(err, n, "tokenizer.json: %s: class intersection (&&) is not supported", path);
            return -1;
        }
        if (in_class && c == ']') in_class = false;
        tokbuf_putc(out, c);
    }
    tokbuf_putc(out, 0);
    return 0;
}

int tokregex_compile(TokRegex **out, const char *pattern, bool is_regex, const char *path, char *err,
                     size_t n)
{
    *out = NULL;
    TokBuf pat = { 0 };
    if (is_regex) {
        if (translate(&pat, pattern, path, err, n)) {
            tokbuf_free(&pat);
            return -1;
        }
    } else tokbuf_put(&pat, pattern, strlen(pattern) + 1);
    int code;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | (is_regex ? PCRE2_UCP : PCRE2_LITERAL);   /* LITERAL refuses UCP */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat.p, PCRE2_ZERO_TERMINATED, opts, &code, &at, NULL);
    tokbuf_free(&pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        tok_errf(err, n, "tokenizer.json: %s: regex does not compile: %s (at offset %zu)", path, (char *)msg,
                 (size_t)at);
        return -1;
    }
    TokRegex *r = td_calloc(sizeof *r);
    r->code = re;
    r->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    *out = r;
    return 0;
}

void tokregex_free(TokRegex *re)
{
    if (!re) return;
    pcre2_code_free(re->code);
    td_free(re);
}

TokRegexScratch *tokregex_scratch_new(void)
{
    TokRegexScratch *sc = td_calloc(sizeof *sc);
    sc->md = pcre2_match_data_create(4, NULL);
    sc->mc = pcre2_match_context_create(NULL);
    /* Long runs (a page of spaces, a word of 100k letters) need more than
     * PCRE2's default 32 KiB of JIT stack. */
    sc->stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
    TD_CHECK(sc->md && sc->mc && sc->stack, "PCRE2 could not allocate its match state");
    pcre2_jit_stack_assign(sc->mc, NULL, sc->stack);
    return sc;
}

void tokregex_scratch_free(TokRegexScratch *sc)
{
    if (!sc) return;
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mc);
    pcre2_jit_stack_free(sc->stack);
    td_free(sc);
}

int tokregex_find(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, size_t from,
                  size_t *ms, size_t *me, char *err, size_t en)
{
    if (from > n) return 0;
    int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, from, 0, sc->md, sc->mc)
                     : pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, sc->md, sc->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        tok_errf(err, en, "tokenizer regex failed on a %zu-byte piece: %s", n, (char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

int tokregex_find_all(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, TokSpans *out,
                      char *err, size_t en)
{
    size_t last_end = 0, last_match_end = (size_t)-1;
    while (last_end <= n) {
        size_t ms, me;
        int r = tokregex_find(re, sc, s, n, last_end, &ms, &me, err, en);
        if (r < 0) return -1;
        if (r == 0) break;
        if (ms == me && me == last_match_end) {   /* no empty match right after a match */
            uint32_t cp;
            int l = last_end < n ? utf8_next(s + last_end, n - last_end, &cp) : 1;
            last_end += l > 0 ? (size_t)l : 1;
            continue;
        }
        last_end = last_match_end = me;
        spans_push(out, ms, me);
    }
    return 0;
}

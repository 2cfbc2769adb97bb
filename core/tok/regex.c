/* core/tok/regex.c - PCRE2 behind the tokenizer's regex interface
 * (regex.h). */
#include "core/tok/regex.h"
#include "core/common.h"
#include "core/tok/tok_util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* A hand-written matcher for a known pattern (below): 1 and the match,
 * 0 when there is none, SCAN_PCRE2 when it cannot tell without Unicode
 * tables (it met a non-ASCII char where one matters). */
#define SCAN_PCRE2 (-1)
typedef int (*ScanFn)(const unsigned char *s, size_t n, size_t from, size_t *ms, size_t *me);

struct TokRegex {
    pcre2_code *code;
    bool jit;
    ScanFn scan;               /* NULL: PCRE2 only */
    bool use_scan;
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

/* ---------------------------------------------------------------- scanners
 *
 * The pre-tokenizer regexes of GPT-2, Qwen2/Qwen3, Llama 3 and DeepSeek-V3
 * as direct scanners over ASCII.  Each follows its pattern's alternatives
 * in order, with PCRE2's greedy backtracking worked out by hand (noted per
 * alternative), and gives up (SCAN_PCRE2) the moment the answer depends on
 * a non-ASCII char's Unicode class, so PCRE2 alone ever classifies those:
 * the scanner is exact where it answers.  tests/test_tok.c runs both on
 * fortunes in six languages and on random strings. */

/* Class of each byte: as PCRE2 (UTF, UCP) classes ASCII for these
 * patterns.  \p{L}: A-Z a-z; \p{N}: 0-9; \s: \t \n \v \f \r and space;
 * \p{P} | \p{S}: the 32 other printable chars; the rest (controls, DEL)
 * none of these.  Bytes >= 0x80 are SC_HI. */
enum { SC_L = 1, SC_N = 2, SC_S = 4, SC_Q = 8, SC_NL = 16, SC_HI = 32, SC_CTL = 64 };
static const uint8_t SC[256] = {
    64, 64, 64, 64, 64, 64, 64, 64, 64,  4, 20,  4,  4, 20, 64, 64,
    64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64,
     4,  8,  8,  8,  8,  8,  8,  8,  8,  8,  8,  8,  8,  8,  8,  8,
     2,  2,  2,  2,  2,  2,  2,  2,  2,  2,  8,  8,  8,  8,  8,  8,
     8,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,
     1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  8,  8,  8,  8,  8,
     8,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,
     1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  8,  8,  8,  8, 64,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
    32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32,
};
#define SC_P (SC_Q | SC_CTL)   /* [^\s\p{L}\p{N}] in ASCII */
#define SC_AT(s, n, i) ((i) < (n) ? SC[(s)[i]] : 0)   /* 0: past the end */
#define SC_FAIL ((size_t)-1)

/* End of the run of bytes of class `cls` from i; SC_FAIL when a non-ASCII
 * char ends it (it may belong to the class). */
static inline size_t sc_run(const unsigned char *s, size_t n, size_t i, int cls)
{
    while (i < n && (SC[s[i]] & cls)) i++;
    return i < n && (SC[s[i]] & SC_HI) ? SC_FAIL : i;
}

static inline int sc_match(size_t a, size_t b, size_t *ms, size_t *me)
{
    if (b == SC_FAIL) return SCAN_PCRE2;
    *ms = a;
    *me = b;
    return 1;
}

/* `\s*[\r\n]+|\s+(?!\S)|\s+` at i (s[i] is ASCII whitespace).  With W the
 * whitespace run [i, j): \s* takes W and backs off to the last \r or \n
 * of W (it then ends the match: the next char is not one); else
 * \s+(?!\S) takes W at the end of the text, else W less its last char
 * when that leaves one; else \s+ takes the one char. */
static int sc_space(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    size_t j = i, nl = SC_FAIL;
    while (j < n && (SC[s[j]] & SC_S)) {
        if (SC[s[j]] & SC_NL) nl = j;
        j++;
    }
    if (j < n && (SC[s[j]] & SC_HI)) return SCAN_PCRE2;   /* NBSP, U+0085, U+2028 ... are \s */
    if (nl != SC_FAIL) return sc_match(i, nl + 1, ms, me);
    if (j == n || j - i == 1) return sc_match(i, j, ms, me);
    return sc_match(i, j - 1, ms, me);
}

/* Qwen2 (num3 false) and Llama 3 (num3 true):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}(or {1,3})|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Every ASCII char starts a match, so the match starts at `from`. */
static int scan_qwen(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me, bool num3)
{
    if (i >= n) return 0;
    int c = SC[s[i]], c1 = SC_AT(s, n, i + 1);
    if (c & SC_HI) return SCAN_PCRE2;
    if (s[i] == '\'' && i + 1 < n) {   /* caseless: 's' also matches U+017F */
        if (c1 & SC_HI) return SCAN_PCRE2;
        int d = s[i + 1] | 0x20, c2 = SC_AT(s, n, i + 2);
        if (c1 & SC_L) {
            if (d == 's' || d == 't' || d == 'm' || d == 'd') return sc_match(i, i + 2, ms, me);
            if (d == 'r' || d == 'v' || d == 'l') {
                if (c2 & SC_HI) return SCAN_PCRE2;
                if ((c2 & SC_L) && (s[i + 2] | 0x20) == (d == 'l' ? 'l' : 'e')) return sc_match(i, i + 3, ms, me);
            }
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+: the optional char is taken when a letter
     * follows it; a letter itself is not in that class */
    if (c & SC_L) return sc_match(i, sc_run(s, n, i, SC_L), ms, me);
    if (!(c & (SC_NL | SC_N))) {
        if (c1 & SC_HI) return SCAN_PCRE2;
        if (c1 & SC_L) return sc_match(i, sc_run(s, n, i + 1, SC_L), ms, me);
    }
    if (c & SC_N) {
        if (!num3) return sc_match(i, i + 1, ms, me);
        size_t j = i + 1;
        while (j < n && j < i + 3 && (SC[s[j]] & SC_N)) j++;
        return sc_match(i, j < n && j < i + 3 && (SC[s[j]] & SC_HI) ? SC_FAIL : j, ms, me);
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]*: the space is taken when such a char follows */
    size_t p = i;
    if (s[i] == ' ') {
        if (c1 & SC_HI) return SCAN_PCRE2;
        if (c1 & SC_P) p = i + 1;
    }
    if (SC[s[p]] & SC_P) {
        size_t j = sc_run(s, n, p, SC_P);
        if (j != SC_FAIL)
            while (j < n && (SC[s[j]] & SC_NL)) j++;
        return sc_match(i, j, ms, me);
    }
    return sc_space(s, n, i, ms, me);
}

static int scan_qwen2(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    return scan_qwen(s, n, i, ms, me, false);
}

static int scan_llama3(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    return scan_qwen(s, n, i, ms, me, true);
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (case-sensitive).  Every ASCII char starts a match. */
static int scan_gpt2(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    if (i >= n) return 0;
    int c = SC[s[i]], c1 = SC_AT(s, n, i + 1);
    if (c & SC_HI) return SCAN_PCRE2;
    if (s[i] == '\'' && i + 1 < n) {
        int d = s[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return sc_match(i, i + 2, ms, me);
        if (i + 2 < n && (((d == 'r' || d == 'v') && s[i + 2] == 'e') || (d == 'l' && s[i + 2] == 'l')))
            return sc_match(i, i + 3, ms, me);
    }
    /* " ?X+" for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: the space is taken
     * when a char of X follows */
    size_t p = i;
    if (s[i] == ' ') {
        if (c1 & SC_HI) return SCAN_PCRE2;
        if (c1 && !(c1 & SC_S)) p = i + 1;
    }
    int cp = SC[s[p]];
    if (cp & SC_L) return sc_match(i, sc_run(s, n, p, SC_L), ms, me);
    if (cp & SC_N) return sc_match(i, sc_run(s, n, p, SC_N), ms, me);
    if (cp & SC_P) return sc_match(i, sc_run(s, n, p, SC_P), ms, me);
    /* \s+(?!\S)|\s+ (no \s*[\r\n]+ here) */
    size_t j = sc_run(s, n, i, SC_S);
    if (j == SC_FAIL) return SCAN_PCRE2;
    return sc_match(i, j == n || j - i == 1 ? j : j - 1, ms, me);
}

/* DeepSeek-V3: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|
 * [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|
 * \s+(?!\S)|\s+
 * A digit or a control char not followed by a letter starts no match. */
static int scan_dsv3(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    for (; i < n; i++) {
        int c = SC[s[i]], c1 = SC_AT(s, n, i + 1);
        if (c & SC_HI) return SCAN_PCRE2;
        if ((c & SC_Q) && (c1 & SC_L)) {   /* an explicit ASCII set and [A-Za-z]: no Unicode */
            size_t j = i + 1;
            while (j < n && (SC[s[j]] & SC_L)) j++;
            return sc_match(i, j, ms, me);
        }
        /* X?[\p{L}\p{M}]+, X = [^\r\n\p{L}\p{P}\p{S}]: no ASCII char is \p{M} */
        if (c & SC_L) return sc_match(i, sc_run(s, n, i, SC_L), ms, me);
        if ((c & (SC_S | SC_N | SC_CTL)) && !(c & SC_NL)) {
            if (c1 & SC_HI) return SCAN_PCRE2;
            if (c1 & SC_L) return sc_match(i, sc_run(s, n, i + 1, SC_L), ms, me);
        }
        size_t p = i;
        if (s[i] == ' ') {
            if (c1 & SC_HI) return SCAN_PCRE2;
            if (c1 & SC_Q) p = i + 1;
        }
        if (SC[s[p]] & SC_Q) {
            size_t j = sc_run(s, n, p, SC_Q);
            if (j != SC_FAIL)
                while (j < n && (SC[s[j]] & SC_NL)) j++;
            return sc_match(i, j, ms, me);
        }
        if (c & SC_S) return sc_space(s, n, i, ms, me);
    }
    return 0;
}

/* \p{N}{1,3} */
static int scan_num3(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    for (; i < n; i++) {
        int c = SC[s[i]];
        if (c & SC_HI) return SCAN_PCRE2;
        if (c & SC_N) {
            size_t j = i + 1;
            while (j < n && j < i + 3 && (SC[s[j]] & SC_N)) j++;
            return sc_match(i, j < n && j < i + 3 && (SC[s[j]] & SC_HI) ? SC_FAIL : j, ms, me);
        }
    }
    return 0;
}

/* DeepSeek-V3's [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+: explicit code
 * point ranges, exact without Unicode tables. */
static bool sc_cjk(const unsigned char *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    int l = utf8_next((const char *)s + i, n - i, &cp);
    *len = l > 0 ? (size_t)l : 1;
    return (cp >= 0x4e00 && cp <= 0x9fa5) || (cp >= 0x3040 && cp <= 0x309f) || (cp >= 0x30a0 && cp <= 0x30ff);
}

static int scan_cjk(const unsigned char *s, size_t n, size_t i, size_t *ms, size_t *me)
{
    size_t l;
    while (i < n) {
        if (s[i] < 0xe3) {   /* lead bytes of those ranges are E3..E9 */
            i++;
            continue;
        }
        if (sc_cjk(s, n, i, &l)) {
            size_t j = i + l;
            while (j < n && s[j] >= 0xe3 && sc_cjk(s, n, j, &l)) j += l;
            return sc_match(i, j, ms, me);
        }
        i += l;
    }
    return 0;
}

/* The patterns with a scanner, as tokenizer.json spells them (a raw CR or
 * LF char reads as \r or \n: scan_for canonicalizes). */
static const struct {
    const char *pattern;
    ScanFn fn;
} SCANNERS[] = {
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+", scan_qwen2 },
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+", scan_llama3 },
    { "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", scan_gpt2 },
    { "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
      " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", scan_dsv3 },
    { "\\p{N}{1,3}", scan_num3 },
    { "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+", scan_cjk },
};

static ScanFn scan_for(const char *pattern)
{
    TokBuf c = { 0 };
    for (const char *p = pattern; *p; p++) {
        if (*p == '\r') tokbuf_put(&c, "\\r", 2);
        else if (*p == '\n') tokbuf_put(&c, "\\n", 2);
        else tokbuf_putc(&c, *p);
    }
    tokbuf_putc(&c, 0);
    ScanFn fn = NULL;
    for (size_t i = 0; i < sizeof SCANNERS / sizeof SCANNERS[0] && !fn; i++)
        if (!strcmp(c.p, SCANNERS[i].pattern)) fn = SCANNERS[i].fn;
    tokbuf_free(&c);
    return fn;
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
    r->scan = is_regex ? scan_for(pattern) : NULL;
    r->use_scan = r->scan != NULL;
    *out = r;
    return 0;
}

bool tokregex_set_scanner(TokRegex *re, bool on)
{
    re->use_scan = on && re->scan;
    return re->scan != NULL;
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

/* One PCRE2 match from `from` (tokregex_find). */
__attribute__((noinline)) static int find_pcre2(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n,
                                                size_t from, size_t *ms, size_t *me, char *err, size_t en)
{
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

/* tokregex_find for from <= n: the scanner when it answers, else PCRE2. */
static inline int find_one(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, size_t from,
                           size_t *ms, size_t *me, char *err, size_t en)
{
    if (re->use_scan) {
        int k = re->scan((const unsigned char *)s, n, from, ms, me);
        if (k != SCAN_PCRE2) return k;
    }
    return find_pcre2(re, sc, s, n, from, ms, me, err, en);
}

int tokregex_find(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, size_t from,
                  size_t *ms, size_t *me, char *err, size_t en)
{
    if (from > n) return 0;
    return find_one(re, sc, s, n, from, ms, me, err, en);
}

int tokregex_find_all(const TokRegex *re, TokRegexScratch *sc, const char *s, size_t n, TokSpans *out,
                      char *err, size_t en)
{
    size_t last_end = 0, last_match_end = (size_t)-1;
    while (last_end <= n) {
        size_t ms, me;
        int r = find_one(re, sc, s, n, last_end, &ms, &me, err, en);
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

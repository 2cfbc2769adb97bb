/* core/chat/jinja/jinja_lex.c - the Jinja lexer (see jinja_lex.h).
 *
 * Mirrors jinja2's Lexer.tokeniter: in the root state, find the next "{%",
 * "{{" or "{#"; the text before it is data, trimmed by the tag's "-" sign or
 * by lstrip_blocks; inside a tag, tokens until the matching end delimiter,
 * which only counts while (), [] and {} balance. */
#include "core/chat/jinja/jinja_lex.h"
#include "core/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Lex {
    JArena *a;
    const char *s;   /* normalised source */
    size_t n, pos;
    size_t line_pos; /* line counting is incremental: line is the line of line_pos */
    int line;
    JTok *t;
    size_t nt, cap;
    char *err;
    size_t errlen;
} Lex;

static int line_at(Lex *L, size_t p)
{
    while (L->line_pos < p && L->line_pos < L->n) {
        if (L->s[L->line_pos] == '\n') L->line++;
        L->line_pos++;
    }
    return L->line;
}

static int lex_fail(Lex *L, size_t p, const char *what)
{
    snprintf(L->err, L->errlen, "line %d: %s", line_at(L, p), what);
    return -1;
}

static JTok *emit(Lex *L, int type, size_t at)
{
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        JTok *nt = jarena_alloc(L->a, cap * sizeof *nt);
        if (L->nt) memcpy(nt, L->t, L->nt * sizeof *nt);
        L->t = nt;
        L->cap = cap;
    }
    JTok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line_at(L, at);
    return t;
}

/* Python whitespace (str.isspace) of the code point at p; its byte length
 * in *k, 0 when not whitespace. */
static size_t ws_len(const Lex *L, size_t p)
{
    if (p >= L->n) return 0;
    uint32_t cp;
    size_t k = jutf8_decode(L->s + p, L->n - p, &cp);
    return jpy_isspace(cp) ? k : 0;
}

static size_t skip_ws(const Lex *L, size_t p)
{
    size_t k;
    while ((k = ws_len(L, p)) > 0) p += k;
    return p;
}

/* Length of text[0..n) after Python's rstrip(). */
static size_t rstrip_len(const char *text, size_t n)
{
    while (n > 0) {
        size_t st = n - 1;
        while (st > 0 && ((unsigned char)text[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        jutf8_decode(text + st, n - st, &cp);
        if (!jpy_isspace(cp)) break;
        n = st;
    }
    return n;
}

/* lstrip_blocks: the text before a {% or {# tag loses the whitespace
 * between its last newline (or the start of a line) and the tag. */
static size_t lstrip_len(const char *text, size_t n, bool line_starting)
{
    size_t l_pos = n;
    while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
    if (l_pos == 0 && !line_starting) return n;
    if (l_pos == n) return n; /* \s+ needs at least one character */
    for (size_t p = l_pos; p < n;) {
        uint32_t cp;
        size_t k = jutf8_decode(text + p, n - p, &cp);
        if (!jpy_isspace(cp)) return n;
        p += k;
    }
    return l_pos;
}

static void emit_data(Lex *L, size_t at, const char *s, size_t n)
{
    if (!n) return;
    JTok *t = emit(L, JT_DATA, at);
    t->s = s;
    t->n = n;
}

static bool starts(const Lex *L, size_t p, const char *w)
{
    size_t k = strlen(w);
    return p + k <= L->n && memcmp(L->s + p, w, k) == 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(unsigned char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80; }
static bool is_name_char(unsigned char c) { return is_name_start(c) || is_digit((char)c); }

/* (\d+_)*\d+ at p: end position, or p when there is none. */
static size_t scan_digits(const Lex *L, size_t p, int base)
{
    size_t q = p;
    for (;;) {
        size_t st = q;
        while (q < L->n) {
            char c = L->s[q];
            int d = is_digit(c) ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : 99;
            if (d >= base) break;
            q++;
        }
        if (q == st) return st == p ? p : st - 1; /* drop a trailing '_' */
        if (q < L->n && L->s[q] == '_' && q + 1 < L->n) {
            q++;
            continue;
        }
        return q;
    }
}

/* float_re of jinja2: digits, then a fraction and/or an exponent. */
static size_t scan_float(const Lex *L, size_t p)
{
    if (p > 0 && L->s[p - 1] == '.') return p;
    size_t q = scan_digits(L, p, 10);
    if (q == p) return p;
    size_t frac = q;
    if (q < L->n && L->s[q] == '.') {
        size_t r = scan_digits(L, q + 1, 10);
        if (r > q + 1) frac = r;
    }
    size_t e = frac;
    if (e < L->n && (L->s[e] | 32) == 'e') {
        size_t r = e + 1;
        if (r < L->n && (L->s[r] == '+' || L->s[r] == '-')) r++;
        size_t r2 = scan_digits(L, r, 10);
        if (r2 > r) return r2;
    }
    return frac > q ? frac : p;
}

static int lex_number(Lex *L, size_t p, size_t *end)
{
    size_t fe = scan_float(L, p);
    char buf[128];
    if (fe > p) {
        size_t k = 0;
        for (size_t i = p; i < fe && k + 1 < sizeof buf; i++)
            if (L->s[i] != '_') buf[k++] = L->s[i];
        buf[k] = 0;
        JTok *t = emit(L, JT_FLOAT, p);
        t->f = strtod(buf, NULL);
        *end = fe;
        return 0;
    }
    int base = 10;
    size_t q = p, ds = p;
    if (L->s[p] == '0' && p + 1 < L->n && strchr("bBoOxX", L->s[p + 1]) && L->s[p + 1]) {
        char c = (char)(L->s[p + 1] | 32);
        base = c == 'b' ? 2 : c == 'o' ? 8 : 16;
        ds = p + 2;
        if (ds < L->n && L->s[ds] == '_') ds++;
        q = scan_digits(L, ds, base);
        if (q == ds) { base = 10; q = p; }
    }
    if (base == 10) {
        ds = p;
        if (L->s[p] == '0') { /* 0(_?0)* */
            q = p + 1;
            while (q < L->n && (L->s[q] == '0' || (L->s[q] == '_' && q + 1 < L->n && L->s[q + 1] == '0')))
                q += L->s[q] == '_' ? 2 : 1;
        } else {
            q = scan_digits(L, p, 10);
        }
    }
    uint64_t v = 0;
    for (size_t i = ds; i < q; i++) {
        char c = L->s[i];
        if (c == '_') continue;
        uint64_t d = (uint64_t)(is_digit(c) ? c - '0' : (c | 32) - 'a' + 10);
        if (v > (UINT64_MAX - d) / (uint64_t)base) return lex_fail(L, p, "integer literal too large");
        v = v * (uint64_t)base + d;
    }
    if (v > (uint64_t)INT64_MAX) return lex_fail(L, p, "integer literal too large");
    JTok *t = emit(L, JT_INT, p);
    t->i = (int64_t)v;
    *end = q;
    return 0;
}

static int hexval(char c)
{
    return is_digit(c) ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

/* A string literal body decoded as Python's s.encode("ascii",
 * "backslashreplace").decode("unicode-escape"). */
static int lex_string(Lex *L, size_t p, size_t *end)
{
    char q = L->s[p];
    size_t i = p + 1;
    while (i < L->n && L->s[i] != q) i += L->s[i] == '\\' ? 2 : 1;
    if (i >= L->n) return lex_fail(L, p, "unterminated string literal");
    *end = i + 1;
    const char *s = L->s + p + 1;
    size_t n = i - p - 1;
    JBuf b;
    jbuf_init(&b, L->a, 0);
    for (size_t k = 0; k < n;) {
        if (s[k] != '\\') {
            size_t st = k;
            while (k < n && s[k] != '\\') k++;
            jbuf_put(&b, s + st, k - st);
            continue;
        }
        char c = k + 1 < n ? s[k + 1] : 0;
        k += 2;
        uint32_t cp = 0;
        int digits = 0;
        switch (c) {
        case '\n': break; /* line continuation */
        case '\\': jbuf_putc(&b, '\\'); break;
        case '\'': jbuf_putc(&b, '\''); break;
        case '"': jbuf_putc(&b, '"'); break;
        case 'a': jbuf_putc(&b, '\a'); break;
        case 'b': jbuf_putc(&b, '\b'); break;
        case 'f': jbuf_putc(&b, '\f'); break;
        case 'n': jbuf_putc(&b, '\n'); break;
        case 'r': jbuf_putc(&b, '\r'); break;
        case 't': jbuf_putc(&b, '\t'); break;
        case 'v': jbuf_putc(&b, '\v'); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': return lex_fail(L, p, "unsupported \\N{...} escape in a string literal");
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int d = 0; d < 2 && k < n && s[k] >= '0' && s[k] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[k++] - '0');
                jbuf_put_cp(&b, cp);
            } else if ((unsigned char)c >= 0x80) {
                /* backslashreplace turned the character into \xNN / \uNNNN
                 * first, and the escaped backslash ate its backslash */
                uint32_t u;
                size_t kk = jutf8_decode(s + k - 1, n - (k - 1), &u);
                k = k - 1 + kk;
                jbuf_putc(&b, '\\');
                if (u < 0x100) jbuf_printf(&b, "x%02x", u);
                else if (u < 0x10000) jbuf_printf(&b, "u%04x", u);
                else jbuf_printf(&b, "U%08x", u);
            } else {
                jbuf_putc(&b, '\\');
                if (c) jbuf_putc(&b, c);
                else k--;
            }
            break;
        }
        if (digits) {
            for (int d = 0; d < digits; d++) {
                int h = k < n ? hexval(s[k]) : -1;
                if (h < 0) return lex_fail(L, p, "truncated \\x, \\u or \\U escape in a string literal");
                cp = cp * 16 + (uint32_t)h;
                k++;
            }
            if (cp > 0x10FFFF) return lex_fail(L, p, "\\U escape out of range in a string literal");
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return lex_fail(L, p, "surrogate escape in a string literal (not representable in UTF-8)");
            jbuf_put_cp(&b, cp);
        }
    }
    JTok *t = emit(L, JT_STRING, p);
    t->s = b.p ? b.p : "";
    t->n = b.n;
    return 0;
}

static int lex_op(Lex *L, size_t p, size_t *end)
{
    static const struct { const char *s; JOp op; } ops[] = {
        { "//", JOP_FLOORDIV }, { "**", JOP_POW }, { "==", JOP_EQ }, { "!=", JOP_NE },
        { ">=", JOP_GTEQ }, { "<=", JOP_LTEQ }, { "+", JOP_ADD }, { "-", JOP_SUB },
        { "/", JOP_DIV }, { "*", JOP_MUL }, { "%", JOP_MOD }, { "~", JOP_TILDE },
        { "[", JOP_LBRACKET }, { "]", JOP_RBRACKET }, { "(", JOP_LPAREN }, { ")", JOP_RPAREN },
        { "{", JOP_LBRACE }, { "}", JOP_RBRACE }, { ">", JOP_GT }, { "<", JOP_LT },
        { "=", JOP_ASSIGN }, { ".", JOP_DOT }, { ":", JOP_COLON }, { "|", JOP_PIPE },
        { ",", JOP_COMMA }, { ";", JOP_SEMICOLON },
    };
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        if (starts(L, p, ops[k].s)) {
            JTok *t = emit(L, JT_OP, p);
            t->op = (uint8_t)ops[k].op;
            *end = p + strlen(ops[k].s);
            return 0;
        }
    }
    char msg[64];
    unsigned char c = (unsigned char)L->s[p];
    if (c >= 0x20 && c < 0x7F) snprintf(msg, sizeof msg, "unexpected char '%c'", c);
    else snprintf(msg, sizeof msg, "unexpected byte 0x%02x", c);
    return lex_fail(L, p, msg);
}

/* Tokens of one {% %} or {{ }} tag from L->pos to its end; sets
 * *line_starting for lstrip_blocks. */
static int lex_tag(Lex *L, bool block, bool *line_starting)
{
    char stack[256];
    int depth = 0;
    for (;;) {
        size_t p = L->pos;
        if (p >= L->n) return lex_fail(L, p, block ? "missing '%}' at the end of the template"
                                                   : "missing '}}' at the end of the template");
        if (depth == 0) {
            size_t e = 0;
            if (block) {
                if (starts(L, p, "+%}")) e = p + 3;
                else if (starts(L, p, "-%}")) e = skip_ws(L, p + 3);
                else if (starts(L, p, "%}")) { e = p + 2; if (e < L->n && L->s[e] == '\n') e++; }
            } else {
                if (starts(L, p, "-}}")) e = skip_ws(L, p + 3);
                else if (starts(L, p, "}}")) e = p + 2;
            }
            if (e) {
                emit(L, block ? JT_BLOCK_END : JT_VAR_END, p);
                *line_starting = L->s[e - 1] == '\n';
                L->pos = e;
                return 0;
            }
        }
        size_t k = ws_len(L, p);
        if (k) {
            L->pos = skip_ws(L, p);
            continue;
        }
        unsigned char c = (unsigned char)L->s[p];
        size_t end = p;
        if (is_digit((char)c)) {
            if (lex_number(L, p, &end)) return -1;
        } else if (is_name_start(c)) {
            end = p + 1;
            while (end < L->n && is_name_char((unsigned char)L->s[end])) end++;
            JTok *t = emit(L, JT_NAME, p);
            t->s = L->s + p;
            t->n = end - p;
        } else if (c == '\'' || c == '"') {
            if (lex_string(L, p, &end)) return -1;
        } else {
            if (lex_op(L, p, &end)) return -1;
            const JTok *t = &L->t[L->nt - 1];
            if (t->op == JOP_LPAREN || t->op == JOP_LBRACKET || t->op == JOP_LBRACE) {
                if (depth == (int)sizeof stack) return lex_fail(L, p, "brackets nested too deeply");
                stack[depth++] = t->op == JOP_LPAREN ? ')' : t->op == JOP_LBRACKET ? ']' : '}';
            } else if (t->op == JOP_RPAREN || t->op == JOP_RBRACKET || t->op == JOP_RBRACE) {
                char want = (char)c;
                if (depth == 0) {
                    char msg[32];
                    snprintf(msg, sizeof msg, "unexpected '%c'", want);
                    return lex_fail(L, p, msg);
                }
                if (stack[depth - 1] != want) {
                    char msg[48];
                    snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", want, stack[depth - 1]);
                    return lex_fail(L, p, msg);
                }
                depth--;
            }
        }
        L->pos = end;
    }
}

/* {% [-+] raw [-]%} at q (the '{'): end of the opening tag, or 0. */
static size_t raw_open(const Lex *L, size_t q)
{
    size_t p = q + 2;
    if (p < L->n && (L->s[p] == '-' || L->s[p] == '+')) p++;
    p = skip_ws(L, p);
    if (!starts(L, p, "raw")) return 0;
    p = skip_ws(L, p + 3);
    if (starts(L, p, "-%}")) return skip_ws(L, p + 3);
    if (starts(L, p, "%}")) return p + 2;
    return 0;
}

/* The {% endraw %} after p: sets *st (its '{'), *sign and *end. */
static bool raw_close(const Lex *L, size_t p, size_t *st, char *sign, size_t *end)
{
    for (size_t q = p; q + 1 < L->n; q++) {
        if (L->s[q] != '{' || L->s[q + 1] != '%') continue;
        size_t r = q + 2;
        char sg = 0;
        if (r < L->n && (L->s[r] == '-' || L->s[r] == '+')) sg = L->s[r++];
        r = skip_ws(L, r);
        if (!starts(L, r, "endraw")) continue;
        r = skip_ws(L, r + 6);
        size_t e = 0;
        if (starts(L, r, "+%}")) e = r + 3;
        else if (starts(L, r, "-%}")) e = skip_ws(L, r + 3);
        else if (starts(L, r, "%}")) { e = r + 2; if (e < L->n && L->s[e] == '\n') e++; }
        if (!e) continue;
        *st = q;
        *sign = sg;
        *end = e;
        return true;
    }
    return false;
}

int jlex(JArena *a, const char *src, size_t n, JTok **toks, size_t *ntoks, char *err, size_t errlen)
{
    /* the template is a Python str: valid UTF-8 only */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = jutf8_decode(src + i, n - i, &cp);
        bool bad = (k == 1 && (unsigned char)src[i] >= 0x80) || (k == 2 && cp < 0x80) ||
                   (k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
                   (k == 4 && (cp < 0x10000 || cp > 0x10FFFF));
        if (bad) {
            size_t line = 1;
            for (size_t j = 0; j < i; j++) line += src[j] == '\n';
            snprintf(err, errlen, "line %zu: the template is not valid UTF-8", line);
            return -1;
        }
        i += k;
    }
    /* newlines -> "\n"; keep_trailing_newline=False drops one final "\n" */
    char *s = jarena_alloc(a, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            s[m++] = src[i];
        }
    }
    if (m > 0 && s[m - 1] == '\n') m--;
    s[m] = 0;

    Lex L = { .a = a, .s = s, .n = m, .line = 1, .err = err, .errlen = errlen };
    bool line_starting = true;
    while (L.pos < L.n) {
        size_t q = L.pos;
        while (q + 1 < L.n && !(L.s[q] == '{' && (L.s[q + 1] == '%' || L.s[q + 1] == '{' || L.s[q + 1] == '#')))
            q++;
        if (q + 1 >= L.n) {
            emit_data(&L, L.pos, L.s + L.pos, L.n - L.pos);
            break;
        }
        char kind = L.s[q + 1];
        char sign = q + 2 < L.n && (L.s[q + 2] == '-' || L.s[q + 2] == '+') ? L.s[q + 2] : 0;
        size_t raw_end = kind == '%' ? raw_open(&L, q) : 0;
        const char *text = L.s + L.pos;
        size_t tn = q - L.pos;
        if (sign == '-') tn = rstrip_len(text, tn);
        else if (sign != '+' && kind != '{') tn = lstrip_len(text, tn, line_starting);
        emit_data(&L, L.pos, text, tn);

        if (raw_end) {
            size_t st, end;
            char rsign;
            if (!raw_close(&L, raw_end, &st, &rsign, &end)) return lex_fail(&L, q, "missing end of raw directive");
            bool ls = L.s[raw_end - 1] == '\n';
            size_t cn = st - raw_end;
            if (rsign == '-') cn = rstrip_len(L.s + raw_end, cn);
            else if (rsign != '+') cn = lstrip_len(L.s + raw_end, cn, ls);
            emit_data(&L, raw_end, L.s + raw_end, cn);
            line_starting = L.s[end - 1] == '\n';
            L.pos = end;
            continue;
        }
        if (kind == '#') {
            size_t p = q + 2 + (sign ? 1 : 0), e = 0;
            if (p >= L.n) break; /* jinja2 accepts a "{#" that ends the template */
            for (; p + 1 < L.n; p++) {
                if (starts(&L, p, "+#}")) { e = p + 3; break; }
                if (starts(&L, p, "-#}")) { e = skip_ws(&L, p + 3); break; }
                if (starts(&L, p, "#}")) { e = p + 2; if (e < L.n && L.s[e] == '\n') e++; break; }
            }
            if (!e) return lex_fail(&L, q, "missing end of comment tag");
            line_starting = L.s[e - 1] == '\n';
            L.pos = e;
            continue;
        }
        emit(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, q);
        L.pos = q + 2 + (sign ? 1 : 0);
        if (lex_tag(&L, kind == '%', &line_starting)) return -1;
    }
    emit(&L, JT_EOF, L.n);
    *toks = L.t;
    *ntoks = L.nt;
    return 0;
}

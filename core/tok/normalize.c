/* core/tok/normalize.c - the normalizers of normalize.h, each as HF's
 * tokenizers/src/normalizers/<name>.rs applies it to a NormalizedString (we only
 * need the normalized text, not the alignments). */
#include "core/tok/normalize.h"
#include "core/common.h"
#include "core/tok/unicode.h"

#include <stdio.h>

typedef enum {
    NZ_NFC, NZ_NFD, NZ_NFKC, NZ_NFKD, NZ_LOWER, NZ_STRIP, NZ_STRIP_ACCENTS, NZ_PREPEND, NZ_APPEND,
    NZ_REPLACE, NZ_BYTELEVEL, NZ_SEQUENCE,
} NzKind;

struct Normalizer {
    NzKind kind;
    bool left, right;          /* Strip */
    char *str;                 /* Prepend / Append text, Replace content */
    size_t str_len;
    TokRegex *re;              /* Replace pattern (a Regex) */
    char *lit;                 /* Replace pattern (a String: matched as bytes) */
    size_t lit_len;
    Normalizer **sub;          /* Sequence */
    int n_sub;
    int depth;                 /* Sequences nested in this one, itself included */
};

void norm_free(Normalizer *nz)
{
    if (!nz) return;
    for (int i = 0; i < nz->n_sub; i++) norm_free(nz->sub[i]);
    td_free(nz->sub);
    td_free(nz->str);
    td_free(nz->lit);
    tokregex_free(nz->re);
    td_free(nz);
}

int norm_load(Normalizer **out, const cJSON *j, const char *path, char *err, size_t n)
{
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return 0;
    const char *type;
    if (tj_type(j, path, &type, err, n)) return -1;
    Normalizer *nz = td_calloc(sizeof *nz);
    static const char *const k_type[] = { "type", NULL };
    int rc = 0;
    if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD") ||
        !strcmp(type, "Lowercase") || !strcmp(type, "ByteLevel")) {
        nz->kind = !strcmp(type, "NFC") ? NZ_NFC : !strcmp(type, "NFD") ? NZ_NFD : !strcmp(type, "NFKC") ? NZ_NFKC
                 : !strcmp(type, "NFKD") ? NZ_NFKD : !strcmp(type, "Lowercase") ? NZ_LOWER : NZ_BYTELEVEL;
        rc = tj_known(j, path, k_type, err, n);
    } else if (!strcmp(type, "StripAccents")) {
        nz->kind = NZ_STRIP_ACCENTS;
        rc = tj_known(j, path, k_type, err, n);
    } else if (!strcmp(type, "Strip")) {
        static const char *const k[] = { "type", "strip_left", "strip_right", NULL };
        nz->kind = NZ_STRIP;
        rc = tj_known(j, path, k, err, n) || tj_bool(j, "strip_left", path, true, &nz->left, err, n) ||
             tj_bool(j, "strip_right", path, true, &nz->right, err, n);
    } else if (!strcmp(type, "Prepend") || !strcmp(type, "Append")) {
        bool pre = !strcmp(type, "Prepend");
        static const char *const kp[] = { "type", "prepend", NULL }, *const ka[] = { "type", "append", NULL };
        const char *s;
        nz->kind = pre ? NZ_PREPEND : NZ_APPEND;
        rc = tj_known(j, path, pre ? kp : ka, err, n) || tj_str(j, pre ? "prepend" : "append", path, true, &s, err, n);
        if (!rc) nz->str = td_strdup(s);
    } else if (!strcmp(type, "Replace")) {
        static const char *const k[] = { "type", "pattern", "content", NULL };
        const char *pat, *content;
        bool is_re;
        nz->kind = NZ_REPLACE;
        rc = tj_known(j, path, k, err, n) || tj_pattern(j, path, &is_re, &pat, err, n) ||
             tj_str(j, "content", path, true, &content, err, n);
        if (!rc && !*pat) {
            tok_errf(err, n, "tokenizer.json: %s.pattern is empty", path);
            rc = -1;
        }
        if (!rc) {
            /* a String pattern is a plain byte search (what PCRE2_LITERAL
             * would do), without the regex machinery */
            char p2[256];
            snprintf(p2, sizeof p2, "%s.pattern", path);
            if (is_re) rc = tokregex_compile(&nz->re, pat, is_re, p2, err, n);
            else {
                nz->lit = td_strdup(pat);
                nz->lit_len = strlen(pat);
            }
            nz->str = td_strdup(content);
        }
    } else if (!strcmp(type, "Sequence")) {
        static const char *const k[] = { "type", "normalizers", NULL };
        nz->kind = NZ_SEQUENCE;
        const cJSON *arr = tj_get(j, "normalizers");
        rc = tj_known(j, path, k, err, n);
        if (!rc && !cJSON_IsArray(arr)) {
            tok_errf(err, n, "tokenizer.json: %s.normalizers must be an array", path);
            rc = -1;
        }
        if (!rc) {
            int m = cJSON_GetArraySize(arr), i = 0;
            nz->sub = td_calloc((size_t)(m ? m : 1) * sizeof(Normalizer *));
            for (const cJSON *c = arr->child; c && !rc; c = c->next, i++) {
                char p2[256];
                snprintf(p2, sizeof p2, "%s.normalizers[%d]", path, i);
                rc = norm_load(&nz->sub[nz->n_sub], c, p2, err, n);
                if (!rc && nz->sub[nz->n_sub]) nz->n_sub++;
            }
            for (int q = 0; q < nz->n_sub; q++)
                if (nz->sub[q]->depth > nz->depth) nz->depth = nz->sub[q]->depth;
            nz->depth++;
        }
    } else {
        tok_errf(err, n, "tokenizer.json: %s.type \"%s\" is not supported", path, type);
        rc = -1;
    }
    if (rc) {
        norm_free(nz);
        return -1;
    }
    if (nz->str) nz->str_len = strlen(nz->str);
    *out = nz;
    return 0;
}

void norm_scratch_free(NormScratch *ns)
{
    for (size_t i = 0; i < ns->n_buf; i++) tokbuf_free(&ns->buf[i]);
    td_free(ns->buf);
    spans_free(&ns->sp);
    ns->buf = NULL;
    ns->n_buf = 0;
}

/* Length of the run of whitespace chars at the start (left) or end of s. */
static size_t ws_run(const char *s, size_t n, bool left)
{
    if (left) {
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            int l = utf8_next(s + i, n - i, &cp);
            if (l <= 0 || !uni_is_whitespace(cp)) break;
            i += (size_t)l;
        }
        return i;
    }
    size_t e = n;
    while (e > 0) {
        size_t b = e - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80) b--;
        uint32_t cp;
        if (utf8_next(s + b, e - b, &cp) <= 0 || !uni_is_whitespace(cp)) break;
        e = b;
    }
    return n - e;
}

/* Appends normalize(s[0..n)) to out; depth: the Sequence nesting level
 * (its buffers are ns->buf[2 * depth ..]). */
static int apply_one(const Normalizer *nz, NormScratch *ns, int depth, TokBuf *out, const char *s, size_t n,
                     char *err, size_t en)
{
    switch (nz->kind) {
    case NZ_NFC: uni_normalize(out, s, n, UNI_NFC); return 0;
    case NZ_NFD: uni_normalize(out, s, n, UNI_NFD); return 0;
    case NZ_NFKC: uni_normalize(out, s, n, UNI_NFKC); return 0;
    case NZ_NFKD: uni_normalize(out, s, n, UNI_NFKD); return 0;
    case NZ_LOWER: uni_lowercase(out, s, n); return 0;
    case NZ_STRIP_ACCENTS: uni_strip_marks(out, s, n); return 0;
    case NZ_STRIP: {
        size_t a = nz->left ? ws_run(s, n, true) : 0;
        size_t b = nz->right && a < n ? ws_run(s + a, n - a, false) : 0;
        tokbuf_put(out, s + a, n - a - b);
        return 0;
    }
    case NZ_PREPEND:   /* only a non-empty string gets it */
        if (n) tokbuf_put(out, nz->str, nz->str_len);
        tokbuf_put(out, s, n);
        return 0;
    case NZ_APPEND:
        tokbuf_put(out, s, n);
        if (n) tokbuf_put(out, nz->str, nz->str_len);
        return 0;
    case NZ_BYTELEVEL:
        for (size_t i = 0; i < n; i++) {
            char buf[4];
            tokbuf_put(out, buf, (size_t)utf8_put(bytelevel_char((uint8_t)s[i]), buf));
        }
        return 0;
    case NZ_REPLACE: {
        size_t at = 0;
        if (nz->lit) {   /* leftmost non-overlapping matches, as find_iter gives them */
            tokbuf_reserve(out, n);
            for (;;) {
                const char *m = at < n ? memmem(s + at, n - at, nz->lit, nz->lit_len) : NULL;
                if (!m) break;
                tokbuf_put(out, s + at, (size_t)(m - (s + at)));
                tokbuf_put(out, nz->str, nz->str_len);
                at = (size_t)(m - s) + nz->lit_len;
            }
        } else {
            ns->sp.n = 0;
            if (tokregex_find_all(nz->re, ns->rx, s, n, &ns->sp, err, en)) return -1;
            for (size_t i = 0; i < ns->sp.n; i++) {
                tokbuf_put(out, s + at, ns->sp.v[2 * i] - at);
                tokbuf_put(out, nz->str, nz->str_len);
                at = ns->sp.v[2 * i + 1];
            }
        }
        tokbuf_put(out, s + at, n - at);
        return 0;
    }
    case NZ_SEQUENCE: {
        /* each member reads the previous one's output; the last writes out */
        const char *in = s;
        size_t in_n = n;
        for (int i = 0; i < nz->n_sub; i++) {
            TokBuf *to = i == nz->n_sub - 1 ? out : &ns->buf[2 * depth + (i & 1)];
            if (to != out) to->n = 0;
            if (apply_one(nz->sub[i], ns, depth + 1, to, in, in_n, err, en)) return -1;
            in = to->p;
            in_n = to->n;
        }
        if (!nz->n_sub) tokbuf_put(out, s, n);
        return 0;
    }
    }
    return 0;
}

int norm_apply(const Normalizer *nz, NormScratch *ns, TokBuf *out, const char *s, size_t n, char *err,
               size_t en)
{
    if (!nz) {
        tokbuf_put(out, s, n);
        return 0;
    }
    /* every buffer the nesting needs, before any is in use */
    size_t need = 2 * (size_t)nz->depth;
    if (ns->n_buf < need) {
        TokBuf *v = td_calloc(need * sizeof(TokBuf));
        if (ns->n_buf) memcpy(v, ns->buf, ns->n_buf * sizeof(TokBuf));
        td_free(ns->buf);
        ns->buf = v;
        ns->n_buf = need;
    }
    return apply_one(nz, ns, 0, out, s, n, err, en);
}

bool norm_keeps(const Normalizer *nz, const char *s, size_t n)
{
    if (!nz) return true;
    switch (nz->kind) {
    case NZ_NFC:
    case NZ_NFD:
    case NZ_NFKC:
    case NZ_NFKD: return tok_ascii(s, n);   /* ASCII is invariant under every form */
    case NZ_SEQUENCE:   /* each member sees s again */
        for (int i = 0; i < nz->n_sub; i++)
            if (!norm_keeps(nz->sub[i], s, n)) return false;
        return true;
    default: return false;
    }
}

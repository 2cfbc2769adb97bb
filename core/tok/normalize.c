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
    TokRegex *re;              /* Replace pattern */
    Normalizer **sub;          /* Sequence */
    int n_sub;
};

void norm_free(Normalizer *nz)
{
    if (!nz) return;
    for (int i = 0; i < nz->n_sub; i++) norm_free(nz->sub[i]);
    td_free(nz->sub);
    td_free(nz->str);
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
            char p2[256];
            snprintf(p2, sizeof p2, "%s.pattern", path);
            rc = tokregex_compile(&nz->re, pat, is_re, p2, err, n);
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
        }
    } else {
        tok_errf(err, n, "tokenizer.json: %s.type \"%s\" is not supported", path, type);
        rc = -1;
    }
    if (rc) {
        norm_free(nz);
        return -1;
    }
    *out = nz;
    return 0;
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

static int apply_one(const Normalizer *nz, TokRegexScratch *rx, TokBuf *out, const char *s, size_t n, char *err,
                     size_t en)
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
        if (n) tokbuf_put(out, nz->str, strlen(nz->str));
        tokbuf_put(out, s, n);
        return 0;
    case NZ_APPEND:
        tokbuf_put(out, s, n);
        if (n) tokbuf_put(out, nz->str, strlen(nz->str));
        return 0;
    case NZ_BYTELEVEL:
        for (size_t i = 0; i < n; i++) {
            char buf[4];
            tokbuf_put(out, buf, (size_t)utf8_put(bytelevel_char((uint8_t)s[i]), buf));
        }
        return 0;
    case NZ_REPLACE: {
        TokSpans sp = { 0 };
        if (tokregex_find_all(nz->re, rx, s, n, &sp, err, en)) {
            spans_free(&sp);
            return -1;
        }
        size_t at = 0, cl = strlen(nz->str);
        for (size_t i = 0; i < sp.n; i++) {
            tokbuf_put(out, s + at, sp.v[2 * i] - at);
            tokbuf_put(out, nz->str, cl);
            at = sp.v[2 * i + 1];
        }
        tokbuf_put(out, s + at, n - at);
        spans_free(&sp);
        return 0;
    }
    case NZ_SEQUENCE: {
        /* each member reads the previous one's output */
        TokBuf a = { 0 }, b = { 0 };
        tokbuf_put(&a, s, n);
        for (int i = 0; i < nz->n_sub; i++) {
            b.n = 0;
            if (apply_one(nz->sub[i], rx, &b, a.p, a.n, err, en)) {
                tokbuf_free(&a);
                tokbuf_free(&b);
                return -1;
            }
            TokBuf t = a;
            a = b;
            b = t;
        }
        tokbuf_put(out, a.p, a.n);
        tokbuf_free(&a);
        tokbuf_free(&b);
        return 0;
    }
    }
    return 0;
}

int norm_apply(const Normalizer *nz, TokRegexScratch *rx, TokBuf *out, const char *s, size_t n, char *err,
               size_t en)
{
    if (!nz) {
        tokbuf_put(out, s, n);
        return 0;
    }
    return apply_one(nz, rx, out, s, n, err, en);
}

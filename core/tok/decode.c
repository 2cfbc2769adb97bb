/* core/tok/decode.c - the decoder chain as a stream of steps (decode.h).
 * Each step is HF's decode_chain for that decoder (decoders/<name>.rs),
 * rewritten to take its input a token (or, once joined, a chunk) at a
 * time. */
#include "core/tok/decode.h"
#include "core/common.h"
#include "core/tok/regex.h"

#include <stdio.h>

typedef enum { D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_BYTELEVEL, D_METASPACE, D_JOINSPACE, D_BYTES } DKind;

typedef struct {
    DKind kind;
    bool joined_in;            /* the input is one growing token */
    char *pat, *content;       /* Replace */
    size_t pat_len, content_len;
    TokRegex *re;              /* Replace with a Regex pattern (whole tokens only) */
    uint32_t ch;               /* Strip content, Metaspace replacement */
    long start, stop;          /* Strip */
    bool never;                /* Metaspace: prepend_scheme never */
} DStage;

struct Decoder {
    DStage *st;
    int n, cap;
};

typedef struct {
    TokBuf buf, out;
    long count, lead_left;
    bool flag, started;
} DSState;

struct DecState {
    DSState *s;
    int n;
    TokRegexScratch *rx;
    TokSpans sp;
};

/* ---------------------------------------------------------------- load */

static DStage *add_stage(Decoder *d, DKind k)
{
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 8;
        DStage *v = td_calloc((size_t)cap * sizeof(DStage));
        if (d->n) memcpy(v, d->st, (size_t)d->n * sizeof(DStage));
        td_free(d->st);
        d->st = v;
        d->cap = cap;
    }
    DStage *g = &d->st[d->n++];
    memset(g, 0, sizeof *g);
    g->kind = k;
    for (int i = 0; i < d->n - 1; i++) {
        DKind p = d->st[i].kind;
        if (p == D_FUSE || p == D_BYTELEVEL || p == D_JOINSPACE || p == D_BYTES) g->joined_in = true;
    }
    return g;
}

void dec_free(Decoder *d)
{
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        td_free(d->st[i].pat);
        td_free(d->st[i].content);
        tokregex_free(d->st[i].re);
    }
    td_free(d->st);
    td_free(d);
}

static int get_char(const cJSON *j, const char *key, const char *path, const char *dflt, uint32_t *cp, char *err,
                    size_t n)
{
    const char *s;
    if (tj_str(j, key, path, false, &s, err, n)) return -1;
    if (!s) s = dflt;
    int l = s ? utf8_next(s, strlen(s), cp) : 0;
    if (l <= 0 || s[l]) {
        tok_errf(err, n, "tokenizer.json: %s.%s must be a single character", path, key);
        return -1;
    }
    return 0;
}

static int refuse_joined(const DStage *g, const char *path, const char *type, char *err, size_t n)
{
    if (!g->joined_in) return 0;
    tok_errf(err, n, "tokenizer.json: %s: %s after a joining decoder (Fuse, ByteLevel) is not supported", path, type);
    return -1;
}

static int load_node(Decoder *d, const cJSON *j, const char *path, char *err, size_t n)
{
    const char *type;
    if (tj_type(j, path, &type, err, n)) return -1;
    if (!strcmp(type, "Sequence")) {
        static const char *const k[] = { "type", "decoders", NULL };
        const cJSON *arr = tj_get(j, "decoders");
        if (tj_known(j, path, k, err, n)) return -1;
        if (!cJSON_IsArray(arr)) {
            tok_errf(err, n, "tokenizer.json: %s.decoders must be an array", path);
            return -1;
        }
        int i = 0;
        for (const cJSON *c = arr->child; c; c = c->next, i++) {
            char p2[256];
            snprintf(p2, sizeof p2, "%s.decoders[%d]", path, i);
            if (load_node(d, c, p2, err, n)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        static const char *const k[] = { "type", "add_prefix_space", "trim_offsets", "use_regex", NULL };
        DStage *g = add_stage(d, D_BYTELEVEL);
        return tj_known(j, path, k, err, n) || refuse_joined(g, path, "ByteLevel", err, n) ? -1 : 0;
    }
    if (!strcmp(type, "ByteFallback")) {
        static const char *const k[] = { "type", NULL };
        DStage *g = add_stage(d, D_BYTEFALLBACK);
        return tj_known(j, path, k, err, n) || refuse_joined(g, path, "ByteFallback", err, n) ? -1 : 0;
    }
    if (!strcmp(type, "Fuse")) {
        static const char *const k[] = { "type", NULL };
        add_stage(d, D_FUSE);
        return tj_known(j, path, k, err, n);
    }
    if (!strcmp(type, "Strip")) {
        static const char *const k[] = { "type", "content", "start", "stop", NULL };
        DStage *g = add_stage(d, D_STRIP);
        return tj_known(j, path, k, err, n) || get_char(j, "content", path, " ", &g->ch, err, n) ||
                       tj_int(j, "start", path, 0, 0, 1L << 30, &g->start, err, n) ||
                       tj_int(j, "stop", path, 0, 0, 1L << 30, &g->stop, err, n)
                   ? -1 : 0;
    }
    if (!strcmp(type, "Metaspace")) {
        static const char *const k[] = { "type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                         "str_rep", NULL };
        DStage *g = add_stage(d, D_METASPACE);
        const char *scheme;
        const cJSON *aps = tj_get(j, "add_prefix_space");
        if (tj_known(j, path, k, err, n) || get_char(j, "replacement", path, "\xe2\x96\x81", &g->ch, err, n) ||
            tj_str(j, "prepend_scheme", path, false, &scheme, err, n))
            return -1;
        if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never")) {
            tok_errf(err, n, "tokenizer.json: %s.prepend_scheme \"%s\" is not supported", path, scheme);
            return -1;
        }
        g->never = (scheme && !strcmp(scheme, "never")) || (aps && cJSON_IsFalse(aps));
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        static const char *const k[] = { "type", "pattern", "content", NULL };
        DStage *g = add_stage(d, D_REPLACE);
        bool is_re;
        const char *pat, *content;
        if (tj_known(j, path, k, err, n) || tj_pattern(j, path, &is_re, &pat, err, n) ||
            tj_str(j, "content", path, true, &content, err, n))
            return -1;
        if (!*pat) {
            tok_errf(err, n, "tokenizer.json: %s.pattern is empty", path);
            return -1;
        }
        g->pat = td_strdup(pat);
        g->pat_len = strlen(pat);
        g->content = td_strdup(content);
        g->content_len = strlen(content);
        if (is_re) {
            if (g->joined_in) {
                tok_errf(err, n, "tokenizer.json: %s: a Regex Replace after a joining decoder is not supported", path);
                return -1;
            }
            char p2[256];
            snprintf(p2, sizeof p2, "%s.pattern", path);
            return tokregex_compile(&g->re, pat, true, p2, err, n);
        }
        return 0;
    }
    tok_errf(err, n, "tokenizer.json: %s.type \"%s\" is not supported", path, type);
    return -1;
}

/* transformers' clean_up_tokenization, in its order. */
static const char *const CLEANUP[][2] = {
    { " .", "." }, { " ?", "?" }, { " !", "!" }, { " ,", "," }, { " ' ", "'" },
    { " n't", "n't" }, { " 'm", "'m" }, { " 's", "'s" }, { " 've", "'ve" }, { " 're", "'re" },
};

int dec_load(Decoder **out, const cJSON *j, const char *path, bool bytes, bool cleanup, char *err, size_t n)
{
    Decoder *d = td_calloc(sizeof *d);
    *out = NULL;
    int rc = 0;
    if (bytes) add_stage(d, D_BYTES);
    else if (!j || cJSON_IsNull(j)) add_stage(d, D_JOINSPACE);
    else rc = load_node(d, j, path, err, n);
    if (!rc && cleanup) {
        add_stage(d, D_FUSE);
        for (size_t i = 0; i < sizeof CLEANUP / sizeof CLEANUP[0]; i++) {
            DStage *g = add_stage(d, D_REPLACE);
            g->pat = td_strdup(CLEANUP[i][0]);
            g->pat_len = strlen(g->pat);
            g->content = td_strdup(CLEANUP[i][1]);
            g->content_len = strlen(g->content);
        }
    }
    if (rc) {
        dec_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

/* ---------------------------------------------------------------- state */

DecState *dec_state_new(const Decoder *d)
{
    DecState *st = td_calloc(sizeof *st);
    st->n = d->n;
    st->s = td_calloc((size_t)(d->n ? d->n : 1) * sizeof(DSState));
    for (int i = 0; i < d->n; i++) {
        st->s[i].count = d->st[i].kind == D_METASPACE ? -1 : 0;   /* Metaspace: token index */
        st->s[i].lead_left = d->st[i].start;
    }
    return st;
}

void dec_state_free(DecState *st)
{
    if (!st) return;
    for (int i = 0; i < st->n; i++) {
        tokbuf_free(&st->s[i].buf);
        tokbuf_free(&st->s[i].out);
    }
    td_free(st->s);
    tokregex_scratch_free(st->rx);
    spans_free(&st->sp);
    td_free(st);
}

/* ---------------------------------------------------------------- steps */

static void emit(const Decoder *d, DecState *st, int i, const char *t, size_t n, bool new_token, TokText *out);

/* Passes a chunk of a joined output on (the first chunk starts the one
 * token). */
static void emit_joined(const Decoder *d, DecState *st, int i, const char *t, size_t n, TokText *out)
{
    DSState *s = &st->s[i];
    bool first = !s->started;
    if (!n && !first) return;
    s->started = true;
    emit(d, st, i + 1, t, n, first, out);
}

static bool is_byte_token(const char *t, size_t n, uint8_t *b)
{
    if (n != 6 || memcmp(t, "<0x", 3) || t[5] != '>') return false;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = t[k];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return false;
        v = v * 16 + h;
    }
    *b = (uint8_t)v;
    return true;
}

/* ByteFallback: the held run of byte tokens, as one token when it is
 * valid UTF-8, else one U+FFFD token per byte (HF). */
static void flush_run(const Decoder *d, DecState *st, int i, TokText *out)
{
    DSState *s = &st->s[i];
    if (s->buf.n) {
        if (utf8_check(s->buf.p, s->buf.n) < 0) emit(d, st, i + 1, s->buf.p, s->buf.n, true, out);
        else
            for (size_t k = 0; k < s->buf.n; k++) emit(d, st, i + 1, "\xef\xbf\xbd", 3, true, out);
    }
    s->buf.n = 0;
    s->flag = false;
}

/* Does the run hold an invalid sequence (not merely an incomplete end)? */
static bool run_broken(const TokBuf *b)
{
    TokBuf tmp = { 0 };
    size_t used = utf8_lossy(&tmp, b->p, b->n, false);
    bool broken = tmp.n != used;   /* a U+FFFD was written */
    tokbuf_free(&tmp);
    return broken;
}

/* Replace on one whole token. */
static void replace_token(const DStage *g, DecState *st, DSState *s, const char *t, size_t n)
{
    s->out.n = 0;
    size_t at = 0;
    if (g->re) {
        if (!st->rx) st->rx = tokregex_scratch_new();
        st->sp.n = 0;
        char err[8];
        if (tokregex_find_all(g->re, st->rx, t, n, &st->sp, err, sizeof err) == 0)
            for (size_t k = 0; k < st->sp.n; k++) {
                tokbuf_put(&s->out, t + at, st->sp.v[2 * k] - at);
                tokbuf_put(&s->out, g->content, g->content_len);
                at = st->sp.v[2 * k + 1];
            }
    } else
        for (;;) {
            const char *m = at < n ? memmem(t + at, n - at, g->pat, g->pat_len) : NULL;
            if (!m) break;
            tokbuf_put(&s->out, t + at, (size_t)(m - (t + at)));
            tokbuf_put(&s->out, g->content, g->content_len);
            at = (size_t)(m - t) + g->pat_len;
        }
    tokbuf_put(&s->out, t + at, n - at);
}

/* Replace on a joined stream: complete matches are replaced, a tail that
 * may begin a match is held. */
static void replace_joined(const Decoder *d, DecState *st, int i, const char *t, size_t n, TokText *out)
{
    const DStage *g = &d->st[i];
    DSState *s = &st->s[i];
    tokbuf_put(&s->buf, t, n);
    s->out.n = 0;
    size_t at = 0, len = s->buf.n;
    for (;;) {
        const char *m = at < len ? memmem(s->buf.p + at, len - at, g->pat, g->pat_len) : NULL;
        if (!m) break;
        tokbuf_put(&s->out, s->buf.p + at, (size_t)(m - (s->buf.p + at)));
        tokbuf_put(&s->out, g->content, g->content_len);
        at = (size_t)(m - s->buf.p) + g->pat_len;
    }
    size_t hold = 0;
    for (size_t k = g->pat_len - 1; k > 0 && !hold; k--)
        if (len - at >= k && !memcmp(s->buf.p + len - k, g->pat, k)) hold = k;
    tokbuf_put(&s->out, s->buf.p + at, len - at - hold);
    memmove(s->buf.p, s->buf.p + len - hold, hold);
    s->buf.n = hold;
    emit_joined(d, st, i, s->out.p, s->out.n, out);
}

/* Strip on one whole token: up to start leading and stop trailing
 * content chars. */
static void strip_token(const DStage *g, DSState *s, const char *t, size_t n)
{
    size_t a = 0, e = n;
    for (long k = 0; k < g->start && a < n; k++) {
        uint32_t cp;
        int l = utf8_next(t + a, n - a, &cp);
        if (l <= 0 || cp != g->ch) break;
        a += (size_t)l;
    }
    for (long k = 0; k < g->stop && e > a; k++) {
        size_t b = e - 1;
        while (b > a && ((unsigned char)t[b] & 0xc0) == 0x80) b--;
        uint32_t cp;
        if (utf8_next(t + b, e - b, &cp) <= 0 || cp != g->ch) break;
        e = b;
    }
    s->out.n = 0;
    tokbuf_put(&s->out, t + a, e - a);
}

static void strip_joined(const Decoder *d, DecState *st, int i, const char *t, size_t n, TokText *out)
{
    const DStage *g = &d->st[i];
    DSState *s = &st->s[i];
    s->out.n = 0;
    size_t k = 0;
    while (k < n) {
        uint32_t cp;
        int l = utf8_next(t + k, n - k, &cp);
        if (l <= 0) l = 1;
        bool content = cp == g->ch;
        if (!s->flag) {   /* still at the start */
            if (content && s->lead_left > 0) {
                s->lead_left--;
                k += (size_t)l;
                continue;
            }
            s->flag = true;
        }
        if (content && g->stop > 0) {
            tokbuf_put(&s->buf, t + k, (size_t)l);
            if (++s->count > g->stop) {   /* the oldest held char can no longer be stripped */
                uint32_t c0;
                int l0 = utf8_next(s->buf.p, s->buf.n, &c0);
                tokbuf_put(&s->out, s->buf.p, (size_t)l0);
                memmove(s->buf.p, s->buf.p + l0, s->buf.n - (size_t)l0);
                s->buf.n -= (size_t)l0;
                s->count--;
            }
        } else {
            tokbuf_put(&s->out, s->buf.p, s->buf.n);
            s->buf.n = 0;
            s->count = 0;
            tokbuf_put(&s->out, t + k, (size_t)l);
        }
        k += (size_t)l;
    }
    emit_joined(d, st, i, s->out.p, s->out.n, out);
}

static void emit(const Decoder *d, DecState *st, int i, const char *t, size_t n, bool new_token, TokText *out)
{
    if (i == d->n) {
        toktext_put(out, t, n);
        return;
    }
    const DStage *g = &d->st[i];
    DSState *s = &st->s[i];
    switch (g->kind) {
    case D_REPLACE:
        if (g->joined_in) replace_joined(d, st, i, t, n, out);
        else {
            replace_token(g, st, s, t, n);
            emit(d, st, i + 1, s->out.p, s->out.n, new_token, out);
        }
        return;
    case D_STRIP:
        if (g->joined_in) strip_joined(d, st, i, t, n, out);
        else {
            strip_token(g, s, t, n);
            emit(d, st, i + 1, s->out.p, s->out.n, new_token, out);
        }
        return;
    case D_METASPACE: {
        if (new_token) s->count++;
        s->out.n = 0;
        char rep[4];
        int rl = utf8_put(g->ch, rep);
        for (size_t k = 0; k < n;) {
            if (n - k >= (size_t)rl && !memcmp(t + k, rep, (size_t)rl)) {
                if (s->count != 0 || g->never) tokbuf_putc(&s->out, ' ');
                k += (size_t)rl;
            } else tokbuf_putc(&s->out, t[k++]);
        }
        emit(d, st, i + 1, s->out.p, s->out.n, new_token, out);
        return;
    }
    case D_BYTEFALLBACK: {
        uint8_t b;
        if (is_byte_token(t, n, &b)) {
            if (s->flag) {   /* the run is already broken: all of it is U+FFFD */
                emit(d, st, i + 1, "\xef\xbf\xbd", 3, true, out);
                return;
            }
            tokbuf_putc(&s->buf, (char)b);
            if (run_broken(&s->buf)) {
                for (size_t k = 0; k < s->buf.n; k++) emit(d, st, i + 1, "\xef\xbf\xbd", 3, true, out);
                s->buf.n = 0;
                s->flag = true;
            }
            return;
        }
        flush_run(d, st, i, out);
        emit(d, st, i + 1, t, n, true, out);
        return;
    }
    case D_FUSE:
        emit_joined(d, st, i, t, n, out);
        return;
    case D_JOINSPACE:
        if (s->flag) emit_joined(d, st, i, " ", 1, out);
        s->flag = true;
        emit_joined(d, st, i, t, n, out);
        return;
    case D_BYTELEVEL:
    case D_BYTES: {
        /* a token whose chars are all ByteLevel chars gives their bytes,
         * any other its own UTF-8 (HF) */
        size_t mark = s->buf.n;
        bool all = g->kind == D_BYTELEVEL;
        for (size_t k = 0; k < n && all;) {
            uint32_t cp;
            int l = utf8_next(t + k, n - k, &cp);
            int b = l > 0 ? bytelevel_byte(cp) : -1;
            if (b < 0) all = false;
            else {
                tokbuf_putc(&s->buf, (char)b);
                k += (size_t)l;
            }
        }
        if (!all) {
            s->buf.n = mark;
            tokbuf_put(&s->buf, t, n);
        }
        s->out.n = 0;
        size_t used = utf8_lossy(&s->out, s->buf.p, s->buf.n, false);
        memmove(s->buf.p, s->buf.p + used, s->buf.n - used);
        s->buf.n -= used;
        emit_joined(d, st, i, s->out.p, s->out.n, out);
        return;
    }
    }
}

void dec_push(const Decoder *d, DecState *st, const char *tok, size_t n, TokText *out)
{
    emit(d, st, 0, tok, n, true, out);
}

void dec_finish(const Decoder *d, DecState *st, TokText *out)
{
    for (int i = 0; i < d->n; i++) {
        const DStage *g = &d->st[i];
        DSState *s = &st->s[i];
        switch (g->kind) {
        case D_REPLACE:
            if (g->joined_in && s->buf.n) {
                s->out.n = 0;
                tokbuf_put(&s->out, s->buf.p, s->buf.n);
                s->buf.n = 0;
                emit_joined(d, st, i, s->out.p, s->out.n, out);
            }
            break;
        case D_BYTEFALLBACK: flush_run(d, st, i, out); break;
        case D_BYTELEVEL:
        case D_BYTES:
            if (s->buf.n) {
                s->out.n = 0;
                utf8_lossy(&s->out, s->buf.p, s->buf.n, true);
                s->buf.n = 0;
                emit_joined(d, st, i, s->out.p, s->out.n, out);
            }
            break;
        default: break;   /* Strip's held chars are the stripped ones */
        }
    }
    for (int i = 0; i < d->n; i++) {
        DSState *s = &st->s[i];
        s->buf.n = s->out.n = 0;
        s->count = d->st[i].kind == D_METASPACE ? -1 : 0;
        s->lead_left = d->st[i].start;
        s->flag = s->started = false;
    }
}

void dec_token_bytes(const Decoder *d, const char *tok, size_t n, TokBuf *out)
{
    TokBuf a = { 0 }, b = { 0 };
    tokbuf_put(&a, tok, n);
    DecState *st = dec_state_new(d);   /* scratch of the Replace and Strip steps */
    for (int i = 0; i < d->n; i++) {
        DSState *s = &st->s[i];
        const DStage *g = &d->st[i];
        b.n = 0;
        switch (g->kind) {
        case D_REPLACE:
            if (g->joined_in) continue;   /* a replace across tokens: not one token's */
            replace_token(g, st, s, a.p, a.n);
            tokbuf_put(&b, s->out.p, s->out.n);
            break;
        case D_STRIP:
            if (g->joined_in) continue;   /* the whole text's ends */
            strip_token(g, s, a.p, a.n);
            tokbuf_put(&b, s->out.p, s->out.n);
            break;
        case D_METASPACE: {   /* a token after the first: each replacement char is a space */
            char rep[4];
            int rl = utf8_put(g->ch, rep);
            for (size_t k = 0; k < a.n;) {
                if (a.n - k >= (size_t)rl && !memcmp(a.p + k, rep, (size_t)rl)) {
                    tokbuf_putc(&b, ' ');
                    k += (size_t)rl;
                } else tokbuf_putc(&b, a.p[k++]);
            }
            break;
        }
        case D_BYTEFALLBACK: {
            uint8_t byte;
            if (is_byte_token(a.p, a.n, &byte)) tokbuf_putc(&b, (char)byte);
            else tokbuf_put(&b, a.p, a.n);
            break;
        }
        case D_BYTELEVEL: {
            bool all = true;
            for (size_t k = 0; k < a.n && all;) {
                uint32_t cp;
                int l = utf8_next(a.p + k, a.n - k, &cp);
                int byte = l > 0 ? bytelevel_byte(cp) : -1;
                if (byte < 0) all = false;
                else {
                    tokbuf_putc(&b, (char)byte);
                    k += (size_t)l;
                }
            }
            if (!all) {
                b.n = 0;
                tokbuf_put(&b, a.p, a.n);
            }
            break;
        }
        case D_FUSE:
        case D_JOINSPACE:
        case D_BYTES: continue;
        }
        TokBuf t = a;
        a = b;
        b = t;
    }
    tokbuf_put(out, a.p, a.n);
    tokbuf_free(&a);
    tokbuf_free(&b);
    dec_state_free(st);
}

/* core/tok/pretok.c - the pre-tokenizers of pretok.h.  Splitting follows
 * HF's Pattern::find_matches (a regex, a char or a char class gives
 * match / non-match ranges covering the piece) and
 * NormalizedString::split (the behavior decides what becomes a piece). */
#include "core/tok/pretok.h"
#include "core/common.h"
#include "core/tok/unicode.h"

#include <stdio.h>

typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } Behavior;
typedef enum {
    PT_SPLIT, PT_BYTELEVEL, PT_METASPACE, PT_DIGITS, PT_PUNCT, PT_WHITESPACE, PT_WSSPLIT, PT_CHARDELIM,
    PT_SEQUENCE,
} PtKind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } Prepend;

struct PreTok {
    PtKind kind;
    Behavior behavior;
    bool invert;
    TokRegex *re;              /* Split, ByteLevel (use_regex), Whitespace */
    bool prefix_space;         /* ByteLevel */
    bool bytes_out;            /* ByteLevel: leave raw bytes (PIECE_BYTES) */
    uint32_t rep;              /* Metaspace replacement, CharDelimiterSplit delimiter */
    Prepend prepend;
    bool split;                /* Metaspace */
    bool individual;           /* Digits */
    PreTok **sub;
    int n_sub;
};

/* GPT-2's pre-tokenizer regex (HF pre_tokenizers/byte_level.rs). */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void pretok_free(PreTok *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_sub; i++) pretok_free(p->sub[i]);
    td_free(p->sub);
    tokregex_free(p->re);
    td_free(p);
}

static int parse_behavior(const cJSON *j, const char *path, Behavior dflt, Behavior *out, char *err, size_t n)
{
    const char *s;
    *out = dflt;
    if (tj_str(j, "behavior", path, false, &s, err, n)) return -1;
    if (!s) return 0;
    static const char *const names[] = { "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous" };
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = (Behavior)i;
            return 0;
        }
    tok_errf(err, n, "tokenizer.json: %s.behavior \"%s\" is not supported", path, s);
    return -1;
}

/* A one-char string member as a code point. */
static int one_char(const cJSON *j, const char *key, const char *path, const char *dflt, uint32_t *cp, char *err,
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

static int load_node(PreTok **out, const cJSON *j, const char *path, bool top, bool prefix_space, char *err,
                     size_t n)
{
    *out = NULL;
    const char *type;
    if (tj_type(j, path, &type, err, n)) return -1;
    PreTok *p = td_calloc(sizeof *p);
    int rc = 0;
    if (!strcmp(type, "Split")) {
        static const char *const k[] = { "type", "pattern", "behavior", "invert", NULL };
        const char *pat;
        bool is_re;
        p->kind = PT_SPLIT;
        rc = tj_known(j, path, k, err, n) || tj_pattern(j, path, &is_re, &pat, err, n) ||
             parse_behavior(j, path, B_ISOLATED, &p->behavior, err, n) ||
             tj_bool(j, "invert", path, false, &p->invert, err, n);
        if (!rc && !*pat) {
            tok_errf(err, n, "tokenizer.json: %s.pattern is empty", path);
            rc = -1;
        }
        if (!rc) {
            char p2[256];
            snprintf(p2, sizeof p2, "%s.pattern", path);
            rc = tokregex_compile(&p->re, pat, is_re, p2, err, n);
        }
    } else if (!strcmp(type, "ByteLevel")) {
        static const char *const k[] = { "type", "add_prefix_space", "trim_offsets", "use_regex", NULL };
        bool use_regex;
        p->kind = PT_BYTELEVEL;
        rc = tj_known(j, path, k, err, n) || tj_bool(j, "add_prefix_space", path, true, &p->prefix_space, err, n) ||
             tj_bool(j, "use_regex", path, true, &use_regex, err, n);
        if (top) p->prefix_space = prefix_space;   /* transformers' override (pretok.h) */
        if (!rc && use_regex) rc = tokregex_compile(&p->re, GPT2_RE, true, path, err, n);
    } else if (!strcmp(type, "Metaspace")) {
        static const char *const k[] = { "type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                         "str_rep", NULL };
        const char *scheme;
        const cJSON *aps = tj_get(j, "add_prefix_space");
        p->kind = PT_METASPACE;
        rc = tj_known(j, path, k, err, n) || one_char(j, "replacement", path, "\xe2\x96\x81", &p->rep, err, n) ||
             tj_str(j, "prepend_scheme", path, false, &scheme, err, n) ||
             tj_bool(j, "split", path, true, &p->split, err, n);
        if (!rc && aps && !cJSON_IsBool(aps)) {
            tok_errf(err, n, "tokenizer.json: %s.add_prefix_space must be true or false", path);
            rc = -1;
        }
        if (!rc) {
            p->prepend = PREPEND_ALWAYS;
            if (scheme && !strcmp(scheme, "first")) p->prepend = PREPEND_FIRST;
            else if (scheme && !strcmp(scheme, "never")) p->prepend = PREPEND_NEVER;
            else if (scheme && strcmp(scheme, "always")) {
                tok_errf(err, n, "tokenizer.json: %s.prepend_scheme \"%s\" is not supported", path, scheme);
                rc = -1;
            }
            /* legacy files: add_prefix_space=false means never (HF 0.19+) */
            if (!rc && aps && cJSON_IsFalse(aps)) {
                if (scheme && p->prepend != PREPEND_NEVER) {
                    tok_errf(err, n, "tokenizer.json: %s: add_prefix_space does not match prepend_scheme", path);
                    rc = -1;
                }
                p->prepend = PREPEND_NEVER;
            }
        }
    } else if (!strcmp(type, "Digits")) {
        static const char *const k[] = { "type", "individual_digits", NULL };
        p->kind = PT_DIGITS;
        rc = tj_known(j, path, k, err, n) || tj_bool(j, "individual_digits", path, false, &p->individual, err, n);
    } else if (!strcmp(type, "Punctuation")) {
        static const char *const k[] = { "type", "behavior", NULL };
        p->kind = PT_PUNCT;
        rc = tj_known(j, path, k, err, n) || parse_behavior(j, path, B_ISOLATED, &p->behavior, err, n);
    } else if (!strcmp(type, "Whitespace")) {
        static const char *const k[] = { "type", NULL };
        p->kind = PT_WHITESPACE;
        rc = tj_known(j, path, k, err, n) || tokregex_compile(&p->re, "\\w+|[^\\w\\s]+", true, path, err, n);
    } else if (!strcmp(type, "WhitespaceSplit")) {
        static const char *const k[] = { "type", NULL };
        p->kind = PT_WSSPLIT;
        rc = tj_known(j, path, k, err, n);
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        static const char *const k[] = { "type", "delimiter", NULL };
        p->kind = PT_CHARDELIM;
        rc = tj_known(j, path, k, err, n) || one_char(j, "delimiter", path, NULL, &p->rep, err, n);
    } else if (!strcmp(type, "Sequence")) {
        static const char *const k[] = { "type", "pretokenizers", NULL };
        const cJSON *arr = tj_get(j, "pretokenizers");
        p->kind = PT_SEQUENCE;
        rc = tj_known(j, path, k, err, n);
        if (!rc && !cJSON_IsArray(arr)) {
            tok_errf(err, n, "tokenizer.json: %s.pretokenizers must be an array", path);
            rc = -1;
        }
        if (!rc) {
            int m = cJSON_GetArraySize(arr), i = 0;
            p->sub = td_calloc((size_t)(m ? m : 1) * sizeof(PreTok *));
            for (const cJSON *c = arr->child; c && !rc; c = c->next, i++) {
                char p2[256];
                snprintf(p2, sizeof p2, "%s.pretokenizers[%d]", path, i);
                rc = load_node(&p->sub[p->n_sub], c, p2, false, prefix_space, err, n);
                if (!rc) p->n_sub++;
            }
        }
    } else {
        tok_errf(err, n, "tokenizer.json: %s.type \"%s\" is not supported", path, type);
        rc = -1;
    }
    if (rc) {
        pretok_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

int pretok_load(PreTok **out, const cJSON *j, const char *path, bool prefix_space, char *err, size_t n)
{
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return 0;
    return load_node(out, j, path, true, prefix_space, err, n);
}

/* The step applied last (descending into Sequences). */
static PreTok *last_leaf(PreTok *p)
{
    while (p && p->kind == PT_SEQUENCE) p = p->n_sub ? p->sub[p->n_sub - 1] : NULL;
    return p;
}

bool pretok_ends_bytelevel(const PreTok *p)
{
    const PreTok *l = last_leaf((PreTok *)p);
    return l && l->kind == PT_BYTELEVEL;
}

void pretok_set_bytes_out(PreTok *p, bool on)
{
    PreTok *l = last_leaf(p);
    if (l && l->kind == PT_BYTELEVEL) l->bytes_out = on;
}

/* ---------------------------------------------------------------- splitting */

/* Match ranges of a char predicate: each matching char is one match
 * (HF's Pattern for Fn(char) -> bool). */
typedef bool (*CharPred)(uint32_t cp, uint32_t arg);

static bool pred_eq(uint32_t cp, uint32_t arg) { return cp == arg; }
static bool pred_numeric(uint32_t cp, uint32_t arg) { (void)arg; return uni_is_numeric(cp); }
static bool pred_punct(uint32_t cp, uint32_t arg) { (void)arg; return uni_is_punct(cp); }
static bool pred_space(uint32_t cp, uint32_t arg) { (void)arg; return uni_is_whitespace(cp); }

static void char_matches(const char *s, size_t n, CharPred pred, uint32_t arg, TokSpans *out)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_next(s + i, n - i, &cp);
        if (l <= 0) l = 1;
        if (pred(cp, arg)) spans_push(out, i, i + (size_t)l);
        i += (size_t)l;
    }
}

/* The behavior fold of HF's NormalizedString::split, fed the ranges of
 * find_matches in order. */
typedef struct {
    const Piece *pc;
    Pieces *out;
    Behavior b;
    bool have, prev_match;
    size_t s, e;
} Fold;

static void fold_emit(Fold *f, size_t a, size_t b)
{
    if (b > a)
        pieces_push(f->out, f->pc->off + (uint32_t)a, (uint32_t)(b - a), -1,
                    a == 0 ? (f->pc->flags & PIECE_FIRST) : 0);
}

static void fold_feed(Fold *f, size_t rs, size_t re, bool is_match)
{
    bool extend = false;
    switch (f->b) {
    case B_ISOLATED: fold_emit(f, rs, re); break;
    case B_REMOVED:
        if (!is_match) fold_emit(f, rs, re);
        break;
    case B_CONTIGUOUS: extend = is_match == f->prev_match; break;
    case B_MERGED_PREV: extend = is_match && !f->prev_match; break;
    /* HF folds from the end: a match absorbs the non-match after it.
     * Forwards: a non-match joins the match just before it. */
    case B_MERGED_NEXT: extend = !is_match && f->prev_match; break;
    }
    if (f->b != B_ISOLATED && f->b != B_REMOVED) {
        if (f->have && extend) f->e = re;
        else {
            if (f->have) fold_emit(f, f->s, f->e);
            f->s = rs;
            f->e = re;
            f->have = true;
        }
    }
    f->prev_match = is_match;
}

/* Splits piece pc (n bytes) at the sorted match ranges m as `behavior`
 * (invert: matches and gaps swap roles), appending to out. */
static void split_by(const Piece *pc, size_t n, const TokSpans *m, Behavior behavior, bool invert, Pieces *out)
{
    if (!n) return;
    if (behavior == B_ISOLATED || behavior == B_REMOVED) {   /* what the fold does, without it */
        bool gaps = behavior == B_ISOLATED || !invert, hits = behavior == B_ISOLATED || invert;
        uint32_t first = pc->flags & PIECE_FIRST;
        size_t prev = 0;
        for (size_t k = 0; k < m->n; k++) {
            size_t ms = m->v[2 * k], me = m->v[2 * k + 1];
            if (gaps && prev != ms) pieces_push(out, pc->off + (uint32_t)prev, (uint32_t)(ms - prev), -1, prev ? 0 : first);
            if (hits && me != ms) pieces_push(out, pc->off + (uint32_t)ms, (uint32_t)(me - ms), -1, ms ? 0 : first);
            prev = me;
        }
        if (gaps && prev != n) pieces_push(out, pc->off + (uint32_t)prev, (uint32_t)(n - prev), -1, prev ? 0 : first);
        return;
    }
    Fold f = { pc, out, behavior, false, false, 0, 0 };
    size_t prev = 0;
    for (size_t k = 0; k < m->n; k++) {
        size_t ms = m->v[2 * k], me = m->v[2 * k + 1];
        if (prev != ms) fold_feed(&f, prev, ms, invert);
        fold_feed(&f, ms, me, !invert);
        prev = me;
    }
    if (prev != n) fold_feed(&f, prev, n, invert);
    if (f.have) fold_emit(&f, f.s, f.e);
}

/* ---------------------------------------------------------------- steps */

static int apply_node(const PreTok *p, TokBuf *arena, Pieces *io, Pieces *tmp, TokRegexScratch *rx, TokSpans *sp,
                      char *err, size_t en);

/* Runs fn over every non-added piece of io (into tmp), then swaps. */
typedef int (*PieceFn)(const PreTok *p, TokBuf *arena, const Piece *pc, Pieces *out, TokRegexScratch *rx,
                       TokSpans *sp, char *err, size_t en);

static int each_piece(const PreTok *p, TokBuf *arena, Pieces *io, Pieces *tmp, TokRegexScratch *rx, TokSpans *sp,
                      PieceFn fn, char *err, size_t en)
{
    tmp->n = 0;
    int rc = 0;
    for (size_t i = 0; i < io->n && !rc; i++) {
        const Piece pc = io->v[i];
        if (pc.id >= 0) {
            pieces_push(tmp, pc.off, pc.len, pc.id, pc.flags);
            continue;
        }
        sp->n = 0;
        rc = fn(p, arena, &pc, tmp, rx, sp, err, en);
    }
    Pieces t = *io;
    *io = *tmp;
    *tmp = t;
    return rc;
}

static int step_split(const PreTok *p, TokBuf *arena, const Piece *pc, Pieces *out, TokRegexScratch *rx,
                      TokSpans *sp, char *err, size_t en)
{
    const char *s = arena->p + pc->off;
    switch (p->kind) {
    case PT_SPLIT:
    case PT_WHITESPACE:
        if (tokregex_find_all(p->re, rx, s, pc->len, sp, err, en)) return -1;
        break;
    case PT_DIGITS: char_matches(s, pc->len, pred_numeric, 0, sp); break;
    case PT_PUNCT: char_matches(s, pc->len, pred_punct, 0, sp); break;
    case PT_WSSPLIT: char_matches(s, pc->len, pred_space, 0, sp); break;
    case PT_CHARDELIM: char_matches(s, pc->len, pred_eq, p->rep, sp); break;
    default: TD_CHECK(0, "step_split: not a splitting step");
    }
    Behavior b = p->behavior;
    bool inv = p->invert;
    if (p->kind == PT_DIGITS) b = p->individual ? B_ISOLATED : B_CONTIGUOUS;
    else if (p->kind == PT_WHITESPACE) {   /* keep the matches only */
        b = B_REMOVED;
        inv = true;
    } else if (p->kind == PT_WSSPLIT || p->kind == PT_CHARDELIM) b = B_REMOVED;
    split_by(pc, pc->len, sp, b, inv, out);
    return 0;
}

/* ByteLevel: a space before a piece that lacks one, GPT-2's split, then
 * every byte as its char. */
static int step_bytelevel(const PreTok *p, TokBuf *arena, const Piece *pc, Pieces *out, TokRegexScratch *rx,
                          TokSpans *sp, char *err, size_t en)
{
    Piece cur = *pc;
    if (p->prefix_space && (cur.len == 0 || arena->p[cur.off] != ' ')) {
        tokbuf_reserve(arena, cur.len + 1);
        uint32_t off = (uint32_t)arena->n;
        tokbuf_putc(arena, ' ');
        tokbuf_put(arena, arena->p + pc->off, pc->len);
        cur.off = off;
        cur.len = pc->len + 1;
    }
    size_t first = out->n;
    if (p->re) {
        if (tokregex_find_all(p->re, rx, arena->p + cur.off, cur.len, sp, err, en)) return -1;
        split_by(&cur, cur.len, sp, B_ISOLATED, false, out);
    } else if (cur.len) pieces_push(out, cur.off, cur.len, -1, cur.flags);
    for (size_t i = first; i < out->n; i++) {   /* the pieces just made */
        Piece *q = &out->v[i];
        if (p->bytes_out) {
            q->flags |= PIECE_BYTES;
            continue;
        }
        tokbuf_reserve(arena, 2 * (size_t)q->len);
        uint32_t off = (uint32_t)arena->n;
        for (uint32_t b = 0; b < q->len; b++) {
            char c[4];
            int l = utf8_put(bytelevel_char((uint8_t)arena->p[q->off + b]), c);
            tokbuf_put(arena, c, (size_t)l);
        }
        q->off = off;
        q->len = (uint32_t)(arena->n - off);
    }
    return 0;
}

/* Metaspace: spaces become the replacement, which may be prepended, then
 * each replacement starts a piece (MergedWithNext). */
static int step_metaspace(const PreTok *p, TokBuf *arena, const Piece *pc, Pieces *out, TokRegexScratch *rx,
                          TokSpans *sp, char *err, size_t en)
{
    (void)rx;
    (void)err;
    (void)en;
    char rep[4];
    int rl = utf8_put(p->rep, rep);
    tokbuf_reserve(arena, (size_t)pc->len * (size_t)rl + (size_t)rl);
    const char *s = arena->p + pc->off;
    uint32_t off = (uint32_t)arena->n;
    /* HF replaces the spaces first, then prepends unless the piece now
     * starts with the replacement (a leading space counts). */
    bool need = !(pc->len && s[0] == ' ') && !(pc->len >= (uint32_t)rl && !memcmp(s, rep, (size_t)rl));
    if (need && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && (pc->flags & PIECE_FIRST))))
        tokbuf_put(arena, rep, (size_t)rl);
    for (uint32_t i = 0; i < pc->len; i++) {
        if (s[i] == ' ') tokbuf_put(arena, rep, (size_t)rl);
        else tokbuf_putc(arena, s[i]);
    }
    Piece np = { off, (uint32_t)(arena->n - off), -1, pc->flags };
    if (!p->split) {
        if (np.len) pieces_push(out, np.off, np.len, -1, np.flags);
        return 0;
    }
    char_matches(arena->p + np.off, np.len, pred_eq, p->rep, sp);
    split_by(&np, np.len, sp, B_MERGED_NEXT, false, out);
    return 0;
}

static int apply_node(const PreTok *p, TokBuf *arena, Pieces *io, Pieces *tmp, TokRegexScratch *rx, TokSpans *sp,
                      char *err, size_t en)
{
    switch (p->kind) {
    case PT_SEQUENCE:
        for (int i = 0; i < p->n_sub; i++)
            if (apply_node(p->sub[i], arena, io, tmp, rx, sp, err, en)) return -1;
        return 0;
    case PT_BYTELEVEL:
        if (p->bytes_out && !p->prefix_space && !p->re) {   /* only marks the pieces: in place */
            size_t k = 0;
            for (size_t i = 0; i < io->n; i++) {
                Piece q = io->v[i];
                if (q.id < 0 && !q.len) continue;   /* as each_piece drops it */
                if (q.id < 0) q.flags |= PIECE_BYTES;
                io->v[k++] = q;
            }
            io->n = k;
            return 0;
        }
        return each_piece(p, arena, io, tmp, rx, sp, step_bytelevel, err, en);
    case PT_METASPACE: return each_piece(p, arena, io, tmp, rx, sp, step_metaspace, err, en);
    default: return each_piece(p, arena, io, tmp, rx, sp, step_split, err, en);
    }
}

int pretok_apply(const PreTok *p, TokBuf *arena, Pieces *io, Pieces *tmp, TokSpans *sp, TokRegexScratch *rx,
                 char *err, size_t en)
{
    if (!p) return 0;
    return apply_node(p, arena, io, tmp, rx, sp, err, en);
}

/* core/chat/jinja/jinja_builtins.c - filters, tests, methods and globals (see
 * jinja_builtins.h).  Each follows the jinja2 3.1 filter (filters.py),
 * test (tests.py) or Python method it is named after, including their
 * defaults and their TypeErrors. */
#include "core/chat/jinja/jinja_builtins.h"
#include "core/chat/jinja/jinja_casing.h"
#include "core/common.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

/* ---------------------------------------------------------------- arguments */

/* Binds args to the parameter names (positional first, then by keyword)
 * as Python binds a call to fname(names...).  have[i] says whether
 * parameter i was given. */
static void bind(JRender *r, const JArgs *a, const char *fname, const char *const *names, size_t n, Jv *out,
                 bool *have)
{
    for (size_t i = 0; i < n; i++) have[i] = false;
    if (a->npos > n) jr_fail(r, "%s() takes at most %zu argument(s) (%zu given)", fname, n, a->npos);
    for (size_t i = 0; i < a->npos; i++) {
        out[i] = a->pos[i];
        have[i] = true;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        const char *kn = jr_kwname(r, a, k);
        size_t i = 0;
        while (i < n && strcmp(names[i], kn) != 0) i++;
        if (i == n) jr_fail(r, "%s() got an unexpected keyword argument '%s'", fname, kn);
        if (have[i]) jr_fail(r, "%s() got multiple values for argument '%s'", fname, kn);
        out[i] = a->kw[k];
        have[i] = true;
    }
}

#define BIND(fname, ...)                                                                     \
    static const char *const names_[] = { __VA_ARGS__ };                                     \
    enum { NP_ = sizeof names_ / sizeof *names_ };                                           \
    Jv av[NP_];                                                                              \
    bool hv[NP_];                                                                            \
    bind(r, args, fname, names_, NP_, av, hv)

static void no_args(JRender *r, const JArgs *args, const char *fname)
{
    if (args->npos || args->nkw) jr_fail(r, "%s() takes no arguments", fname);
}



static int64_t want_int(JRender *r, Jv v, const char *what)
{
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (!jv_is_intlike(v)) jr_fail(r, "%s: '%s' object cannot be interpreted as an integer", what, jv_pytype(v));
    return jv_as_int(v);
}

static const JStr *want_str(JRender *r, Jv v, const char *what)
{
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (v.t != JV_STR) jr_fail(r, "%s: must be str, not %s", what, jv_pytype(v));
    return v.u.s;
}

/* soft_str: str(v). */
static const JStr *sstr(JRender *r, Jv v) { return jv_to_jstr(r->a, v); }

static Jv gen(Jv list)
{
    list.flags = JV_F_GEN;
    return list;
}

static Jv tuple2(JRender *r, Jv a, Jv b)
{
    Jv t = jv_list(r->a, 2);
    t.flags = JV_F_TUPLE;
    t.u.l->v[0] = a;
    t.u.l->v[1] = b;
    return t;
}

/* ---------------------------------------------------------------- code points */

typedef struct Cps {
    uint32_t *cp;
    size_t *off;         /* byte offset of each code point, n + 1 entries */
    size_t n;
} Cps;

static Cps decode(JRender *r, const JStr *s)
{
    Cps c;
    c.cp = jarena_alloc(r->a, (s->n + 1) * sizeof *c.cp);
    c.off = jarena_alloc(r->a, (s->n + 1) * sizeof *c.off);
    c.n = 0;
    jr_work(r, s->n / 64 + 1);
    for (size_t i = 0; i < s->n;) {
        c.off[c.n] = i;
        i += jutf8_decode(s->s + i, s->n - i, &c.cp[c.n]);
        c.n++;
    }
    c.off[c.n] = s->n;
    return c;
}

static bool cp_in(uint32_t cp, const Cps *set)
{
    for (size_t k = 0; k < set->n; k++)
        if (set->cp[k] == cp) return true;
    return false;
}

static bool cp_upper(uint32_t c) { return jcase_is_upper(c); }
static bool cp_lower(uint32_t c) { return jcase_is_lower(c); }
static bool cp_title(uint32_t c) { return jcase_is_title(c); }
static bool cp_cased(uint32_t c) { return jcase_is_cased(c); }
static bool cp_alpha(uint32_t c) { return jpy_isalpha(c); }
static bool cp_digit(uint32_t c) { return jpy_isdigit(c); }
static bool cp_numeric(uint32_t c) { return jpy_isnumeric(c); }

static void put_mapped(JBuf *b, uint32_t cp, int which)
{
    uint32_t m[3];
    size_t n = jcase_map(cp, which, m);
    for (size_t k = 0; k < n; k++) jbuf_put_cp(b, m[k]);
}

/* Python's lower_ucs4 for c[i] of c[lo..hi): capital sigma becomes final
 * sigma after a cased letter and not before one (case-ignorables skipped). */
static void put_lower(JBuf *b, const uint32_t *c, size_t lo, size_t hi, size_t i)
{
    if (c[i] != 0x3A3) {
        put_mapped(b, c[i], JCASE_LOWER);
        return;
    }
    size_t j = i;
    while (j > lo && jcase_is_ignorable(c[j - 1])) j--;
    bool final = j > lo && jcase_is_cased(c[j - 1]);
    if (final) {
        j = i + 1;
        while (j < hi && jcase_is_ignorable(c[j])) j++;
        final = j == hi || !jcase_is_cased(c[j]);
    }
    jbuf_put_cp(b, final ? 0x3C2 : 0x3C3);
}

enum { CASE_UPPER, CASE_LOWER, CASE_SWAP, CASE_TITLE, CASE_CAPITALIZE, CASE_JTITLE };

static bool jtitle_sep(uint32_t x) { return x == '-' || x == '(' || x == '{' || x == '[' || x == '<' || jpy_isspace(x); }

static Jv change_case(JRender *r, const JStr *s, int mode)
{
    Cps c = decode(r, s);
    JBuf b;
    jbuf_init(&b, r->a, 0);
    bool prev_cased = false;
    for (size_t k = 0; k < c.n; k++) {
        uint32_t x = c.cp[k];
        switch (mode) {
        case CASE_UPPER: put_mapped(&b, x, JCASE_UPPER); break;
        case CASE_LOWER: put_lower(&b, c.cp, 0, c.n, k); break;
        case CASE_SWAP:
            if (cp_upper(x)) put_lower(&b, c.cp, 0, c.n, k);
            else if (cp_lower(x)) put_mapped(&b, x, JCASE_UPPER);
            else jbuf_put_cp(&b, x);
            break;
        case CASE_TITLE: /* str.title: words are runs of cased characters */
            if (prev_cased) put_lower(&b, c.cp, 0, c.n, k);
            else put_mapped(&b, x, JCASE_TITLE);
            prev_cased = cp_cased(x);
            break;
        case CASE_CAPITALIZE:
            if (k == 0) put_mapped(&b, x, JCASE_TITLE);
            else put_lower(&b, c.cp, 0, c.n, k);
            break;
        default: { /* jinja2's title filter: item[0].upper() + item[1:].lower() for
                    * each piece of re.split(r"([-\s({\[<]+)") */
            size_t st = k;
            bool sep = jtitle_sep(x);
            while (k + 1 < c.n && jtitle_sep(c.cp[k + 1]) == sep) k++;
            put_mapped(&b, c.cp[st], JCASE_UPPER);
            for (size_t j = st + 1; j <= k; j++) put_lower(&b, c.cp, st + 1, k + 1, j);
            break;
        }
        }
    }
    return jbuf_value(&b);
}

/* str.strip / lstrip / rstrip with Python's chars argument. */
static Jv py_strip(JRender *r, const JStr *s, Jv chars, bool left, bool right)
{
    Cps c = decode(r, s);
    Cps set = { 0 };
    bool ws = chars.t == JV_NONE || chars.t == JV_UNDEF;
    if (!ws) set = decode(r, want_str(r, chars, "strip arg"));
    size_t i = 0, j = c.n;
    if (left)
        while (i < j && (ws ? jpy_isspace(c.cp[i]) : cp_in(c.cp[i], &set))) i++;
    if (right)
        while (j > i && (ws ? jpy_isspace(c.cp[j - 1]) : cp_in(c.cp[j - 1], &set))) j--;
    if (i == 0 && j == c.n) return jv_strv(s);
    return jv_str(r->a, s->s + c.off[i], c.off[j] - c.off[i]);
}

/* str.split / rsplit.  sep None: runs of whitespace, stripped. */
static Jv py_split(JRender *r, const JStr *s, Jv sepv, int64_t maxsplit, bool from_right)
{
    Jv *items = jarena_alloc(r->a, (s->n + 2) * sizeof *items);
    size_t n = 0;
    jr_work(r, s->n / 64 + 1);
    if (sepv.t == JV_NONE || sepv.t == JV_UNDEF) {
        Cps c = decode(r, s);
        if (!from_right) {
            size_t i = 0;
            while (i < c.n) {
                while (i < c.n && jpy_isspace(c.cp[i])) i++;
                if (i == c.n) break;
                if (maxsplit >= 0 && (int64_t)n == maxsplit) { /* the rest keeps its trailing space */
                    items[n++] = jv_str(r->a, s->s + c.off[i], s->n - c.off[i]);
                    break;
                }
                size_t j = i;
                while (j < c.n && !jpy_isspace(c.cp[j])) j++;
                items[n++] = jv_str(r->a, s->s + c.off[i], c.off[j] - c.off[i]);
                i = j;
            }
        } else {
            size_t j = c.n;
            while (j > 0) {
                while (j > 0 && jpy_isspace(c.cp[j - 1])) j--;
                if (j == 0) break;
                if (maxsplit >= 0 && (int64_t)n == maxsplit) { /* the rest keeps its leading space */
                    items[n++] = jv_str(r->a, s->s, c.off[j]);
                    break;
                }
                size_t i = j;
                while (i > 0 && !jpy_isspace(c.cp[i - 1])) i--;
                items[n++] = jv_str(r->a, s->s + c.off[i], c.off[j] - c.off[i]);
                j = i;
            }
        }
    } else {
        const JStr *sep = want_str(r, sepv, "split separator");
        if (sep->n == 0) jr_fail(r, "empty separator");
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *hit = (maxsplit >= 0 && (int64_t)n == maxsplit) ? NULL
                                  : memmem(s->s + i, s->n - i, sep->s, sep->n);
                if (!hit) {
                    items[n++] = jv_str(r->a, s->s + i, s->n - i);
                    break;
                }
                size_t at = (size_t)(hit - s->s);
                items[n++] = jv_str(r->a, s->s + i, at - i);
                i = at + sep->n;
            }
        } else {
            size_t j = s->n;
            for (;;) {
                size_t at = SIZE_MAX;
                if (!(maxsplit >= 0 && (int64_t)n == maxsplit) && j >= sep->n) {
                    for (size_t p = j - sep->n + 1; p-- > 0;) {
                        if (memcmp(s->s + p, sep->s, sep->n) == 0) {
                            at = p;
                            break;
                        }
                    }
                }
                if (at == SIZE_MAX) {
                    items[n++] = jv_str(r->a, s->s, j);
                    break;
                }
                items[n++] = jv_str(r->a, s->s + at + sep->n, j - at - sep->n);
                j = at;
            }
        }
    }
    Jv out = jv_list(r->a, n);
    for (size_t k = 0; k < n; k++) out.u.l->v[k] = from_right ? items[n - 1 - k] : items[k];
    return out;
}

static Jv py_replace(JRender *r, const JStr *s, const JStr *old, const JStr *nw, int64_t count)
{
    JBuf b;
    jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
    jr_work(r, s->n / 64 + 1);
    if (old->n == 0) {
        /* inserts nw before every character and at the end */
        Cps c = decode(r, s);
        int64_t done = 0;
        for (size_t k = 0; k <= c.n; k++) {
            if (count < 0 || done < count) {
                jbuf_put(&b, nw->s, nw->n);
                done++;
                jr_work(r, nw->n / 64);
            }
            if (k < c.n) jbuf_put(&b, s->s + c.off[k], c.off[k + 1] - c.off[k]);
        }
        return jbuf_value(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        const char *hit = memmem(s->s + i, s->n - i, old->s, old->n);
        if (!hit) break;
        size_t at = (size_t)(hit - s->s);
        jbuf_put(&b, s->s + i, at - i);
        jbuf_put(&b, nw->s, nw->n);
        jr_work(r, nw->n / 64);
        i = at + old->n;
        done++;
    }
    jbuf_put(&b, s->s + i, s->n - i);
    return jbuf_value(&b);
}

/* Byte range of the code point slice [start:end] (Python slice rules). */
static void cp_range(JRender *r, const JStr *s, Jv startv, Jv endv, bool hs, bool he, size_t *b0, size_t *b1, size_t *cp0)
{
    size_t len = jutf8_len(s->s, s->n);
    int64_t st = 0, en = (int64_t)len;
    if (hs && startv.t != JV_NONE) {
        st = want_int(r, startv, "slice index");
        if (st < 0) st += (int64_t)len;
        if (st < 0) st = 0;
    }
    if (he && endv.t != JV_NONE) {
        en = want_int(r, endv, "slice index");
        if (en < 0) en += (int64_t)len;
        if (en < 0) en = 0;
    }
    if (en > (int64_t)len) en = (int64_t)len;
    if (st > (int64_t)len) st = (int64_t)len + 1; /* beyond the end: nothing matches, not even '' */
    *cp0 = (size_t)st;
    if (st > en) {
        *b0 = 1;
        *b1 = 0;
        return;
    }
    *b0 = jutf8_offset(s->s, s->n, (size_t)st);
    *b1 = jutf8_offset(s->s, s->n, (size_t)en);
}

/* str.find / rfind / index / rindex / count. */
static Jv py_find(JRender *r, const JStr *s, const JArgs *args, const char *fname, bool rev, bool raise, bool count)
{
    BIND(fname, "sub", "start", "end");
    if (!hv[0]) jr_fail(r, "%s() takes at least 1 argument (0 given)", fname);
    const JStr *sub = want_str(r, av[0], fname);
    size_t b0, b1, cp0;
    cp_range(r, s, av[1], av[2], hv[1], hv[2], &b0, &b1, &cp0);
    jr_work(r, s->n / 64 + 1);
    if (b0 > b1) {
        if (count) return jv_int(0);
        if (raise) jr_fail(r, "substring not found");
        return jv_int(-1);
    }
    if (count) {
        if (sub->n == 0) return jv_int((int64_t)jutf8_len(s->s + b0, b1 - b0) + 1);
        int64_t k = 0;
        for (size_t i = b0; i + sub->n <= b1;) {
            const char *hit = memmem(s->s + i, b1 - i, sub->s, sub->n);
            if (!hit) break;
            k++;
            i = (size_t)(hit - s->s) + sub->n;
        }
        return jv_int(k);
    }
    size_t at = SIZE_MAX;
    if (sub->n <= b1 - b0) {
        if (!rev) {
            const char *hit = memmem(s->s + b0, b1 - b0, sub->s, sub->n);
            if (hit) at = (size_t)(hit - s->s);
        } else {
            for (size_t p = b1 - sub->n + 1; p-- > b0;) {
                if (memcmp(s->s + p, sub->s, sub->n) == 0) {
                    at = p;
                    break;
                }
            }
        }
    }
    if (at == SIZE_MAX) {
        if (raise) jr_fail(r, "substring not found");
        return jv_int(-1);
    }
    return jv_int((int64_t)jutf8_len(s->s, at));
}

static bool affix(JRender *r, const JStr *s, Jv what, const JArgs *args, bool end, const char *fname)
{
    size_t b0, b1, cp0;
    Jv st = args->npos > 1 ? args->pos[1] : jv_none(), en = args->npos > 2 ? args->pos[2] : jv_none();
    cp_range(r, s, st, en, args->npos > 1, args->npos > 2, &b0, &b1, &cp0);
    if (what.t == JV_LIST && (what.flags & JV_F_TUPLE)) {
        for (size_t k = 0; k < what.u.l->n; k++) {
            JArgs one = *args;
            if (affix(r, s, what.u.l->v[k], &one, end, fname)) return true;
        }
        return false;
    }
    if (what.t != JV_STR)
        jr_fail(r, "%s first arg must be str or a tuple of str, not %s", fname, jv_pytype(what));
    if (b0 > b1) return false;
    const JStr *p = what.u.s;
    if (p->n > b1 - b0) return false;
    return memcmp(s->s + (end ? b1 - p->n : b0), p->s, p->n) == 0;
}

static Jv pad(JRender *r, const JStr *s, int64_t width, Jv fillv, int align /* -1 left, 0 center, 1 right */)
{
    uint32_t fill = ' ';
    if (fillv.t != JV_UNDEF) {
        const JStr *f = want_str(r, fillv, "fill character");
        if (jutf8_len(f->s, f->n) != 1) jr_fail(r, "The fill character must be exactly one character long");
        jutf8_decode(f->s, f->n, &fill);
    }
    int64_t len = (int64_t)jutf8_len(s->s, s->n);
    if (width <= len) return jv_strv(s);
    if (width - len > 10 * 1000 * 1000) jr_fail(r, "padding too large");
    int64_t marg = width - len, left;
    if (align < 0) left = 0;
    else if (align > 0) left = marg;
    else left = marg / 2 + (marg & width & 1);
    JBuf b;
    jbuf_init(&b, r->a, 0);
    for (int64_t k = 0; k < left; k++) jbuf_put_cp(&b, fill);
    jbuf_put(&b, s->s, s->n);
    for (int64_t k = left; k < marg; k++) jbuf_put_cp(&b, fill);
    jr_work(r, (uint64_t)width / 64);
    return jbuf_value(&b);
}

static bool is_line_break(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
}

/* str.splitlines(keepends). */
static Jv py_splitlines(JRender *r, const JStr *s, bool keepends)
{
    Cps c = decode(r, s);
    Jv *items = jarena_alloc(r->a, (c.n + 1) * sizeof *items);
    size_t n = 0, i = 0;
    while (i < c.n) {
        size_t j = i;
        while (j < c.n && !is_line_break(c.cp[j])) j++;
        size_t eol = j;
        if (j < c.n) {
            j++;
            if (c.cp[j - 1] == '\r' && j < c.n && c.cp[j] == '\n') j++;
        }
        size_t end = keepends ? j : eol;
        items[n++] = jv_str(r->a, s->s + c.off[i], c.off[end] - c.off[i]);
        i = j;
    }
    Jv out = jv_list(r->a, n);
    memcpy(out.u.l->v, items, n * sizeof *items);
    return out;
}

/* ---------------------------------------------------------------- attribute getters */

/* jinja2's make_attrgetter: "a.b.0" looked up part by part with getitem
 * (digit parts as ints). */
static Jv attr_path(JRender *r, Jv item, Jv attribute, Jv dflt)
{
    if (attribute.t == JV_NONE || attribute.t == JV_UNDEF) return item;
    if (jv_is_intlike(attribute)) {
        item = jr_getitem(r, item, attribute);
    } else {
        const JStr *a = want_str(r, attribute, "attribute");
        size_t i = 0;
        for (;;) {
            const char *dot = memchr(a->s + i, '.', a->n - i);
            size_t end = dot ? (size_t)(dot - a->s) : a->n;
            bool digits = end > i;
            for (size_t k = i; k < end; k++) digits = digits && a->s[k] >= '0' && a->s[k] <= '9';
            Jv key = digits ? jv_int(strtoll(a->s + i, NULL, 10)) : jv_str(r->a, a->s + i, end - i);
            item = jr_getitem(r, item, key);
            if (dflt.t != JV_UNDEF && dflt.t != JV_NONE && item.t == JV_UNDEF) item = dflt;
            if (!dot) break;
            i = end + 1;
        }
    }
    return item;
}

static Jv lower_if_str(JRender *r, Jv v, bool case_sensitive)
{
    if (!case_sensitive && v.t == JV_STR) return change_case(r, v.u.s, CASE_LOWER);
    return v;
}

/* Stable merge sort of items by keys (ties keep their order, also when
 * reversed, as Python's sorted does). */
static void sort_by(JRender *r, Jv *items, Jv *keys, size_t n, bool reverse)
{
    if (n < 2) return;
    Jv *ti = jarena_alloc(r->a, n * sizeof *ti), *tk = jarena_alloc(r->a, n * sizeof *tk);
    char err[160];
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                bool lt;
                /* take the right one only when it sorts strictly first */
                Jv a = keys[j], b = keys[i];
                if (reverse) {
                    Jv t = a;
                    a = b;
                    b = t;
                }
                if (a.t == JV_UNDEF) jr_fail_undef(r, a);
                if (b.t == JV_UNDEF) jr_fail_undef(r, b);
                if (jv_lt(a, b, &lt, err, sizeof err)) jr_fail(r, "%s", err);
                if (lt) { ti[o] = items[j]; tk[o++] = keys[j++]; }
                else { ti[o] = items[i]; tk[o++] = keys[i++]; }
            }
            while (i < mid) { ti[o] = items[i]; tk[o++] = keys[i++]; }
            while (j < hi) { ti[o] = items[j]; tk[o++] = keys[j++]; }
        }
        memcpy(items, ti, n * sizeof *items);
        memcpy(keys, tk, n * sizeof *keys);
        jr_work(r, n / 8 + 1);
    }
}

/* ---------------------------------------------------------------- filters */

typedef Jv (*FilterFn)(JRender *r, Jv v, const JArgs *args);

static size_t py_len(JRender *r, Jv v)
{
    switch (v.t) {
    case JV_UNDEF: return 0;
    case JV_STR: return jutf8_len(v.u.s->s, v.u.s->n);
    case JV_LIST:
        if (!(v.flags & JV_F_GEN)) return v.u.l->n;
        break;
    case JV_DICT: return v.u.d->n;
    default: break;
    }
    jr_fail(r, "object of type '%s' has no len()", jv_pytype(v));
}

static Jv f_length(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "length");
    return jv_int((int64_t)py_len(r, v));
}

static Jv f_abs(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "abs");
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
    if (jv_is_intlike(v)) {
        int64_t x = jv_as_int(v);
        if (x == INT64_MIN) jr_fail(r, "integer overflow");
        return jv_int(x < 0 ? -x : x);
    }
    jr_fail(r, "bad operand type for abs(): '%s'", jv_pytype(v));
}

static Jv f_capitalize(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "capitalize");
    return change_case(r, sstr(r, v), CASE_CAPITALIZE);
}

static Jv f_center(JRender *r, Jv v, const JArgs *args)
{
    BIND("center", "width");
    return pad(r, sstr(r, v), hv[0] ? want_int(r, av[0], "center") : 80, jv_undef0(), 0);
}

static Jv f_default(JRender *r, Jv v, const JArgs *args)
{
    BIND("default", "default_value", "boolean");
    if (v.t == JV_UNDEF || (hv[1] && jv_truthy(av[1]) && !jv_truthy(v))) return hv[0] ? av[0] : jv_cstr(r->a, "");
    return v;
}

static Jv f_dictsort(JRender *r, Jv v, const JArgs *args)
{
    BIND("dictsort", "case_sensitive", "by", "reverse");
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (v.t != JV_DICT) jr_fail(r, "'%s' object has no attribute 'items'", jv_pytype(v));
    int pos = 0;
    if (hv[1]) {
        const JStr *by = want_str(r, av[1], "dictsort by");
        if (!strcmp(by->s, "value")) pos = 1;
        else if (strcmp(by->s, "key")) jr_fail(r, "You can only sort by either \"key\" or \"value\"");
    }
    size_t n = v.u.d->n;
    Jv *items = jarena_alloc(r->a, (n + 1) * sizeof *items), *keys = jarena_alloc(r->a, (n + 1) * sizeof *keys);
    for (size_t k = 0; k < n; k++) {
        items[k] = tuple2(r, v.u.d->e[k].k, v.u.d->e[k].v);
        keys[k] = lower_if_str(r, pos ? v.u.d->e[k].v : v.u.d->e[k].k, hv[0] && jv_truthy(av[0]));
    }
    sort_by(r, items, keys, n, hv[2] && jv_truthy(av[2]));
    Jv out = jv_list(r->a, n);
    memcpy(out.u.l->v, items, n * sizeof *items);
    return out;
}

static Jv f_escape(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "escape");
    const JStr *s = sstr(r, v);
    JBuf b;
    jbuf_init(&b, r->a, 0);
    for (size_t k = 0; k < s->n; k++) {
        switch (s->s[k]) {
        case '&': jbuf_puts(&b, "&amp;"); break;
        case '<': jbuf_puts(&b, "&lt;"); break;
        case '>': jbuf_puts(&b, "&gt;"); break;
        case '"': jbuf_puts(&b, "&#34;"); break;
        case '\'': jbuf_puts(&b, "&#39;"); break;
        default: jbuf_putc(&b, s->s[k]);
        }
    }
    return jbuf_value(&b);
}

static Jv f_first(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "first");
    const JList *l = jr_iter(r, v);
    if (!l->n) return jv_undef(r->a, NULL, NULL, NULL, "No first item, sequence was empty.");
    return l->v[0];
}

static Jv f_last(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "last");
    if (v.t == JV_LIST && (v.flags & JV_F_GEN)) jr_fail(r, "'generator' object is not reversible");
    const JList *l = jr_iter(r, v);
    if (!l->n) return jv_undef(r->a, NULL, NULL, NULL, "No last item, sequence was empty.");
    return l->v[l->n - 1];
}

/* Python float(str): strips whitespace, accepts underscores between
 * digits, inf/nan.  Returns false when Python raises ValueError. */
static bool parse_py_float(const JStr *s, double *out)
{
    size_t i = 0, j = s->n;
    while (i < j && (unsigned char)s->s[i] < 0x80 && jpy_isspace((unsigned char)s->s[i])) i++;
    while (j > i && (unsigned char)s->s[j - 1] < 0x80 && jpy_isspace((unsigned char)s->s[j - 1])) j--;
    if (i == j || j - i > 300) return false;
    char buf[320];
    size_t k = 0;
    for (size_t p = i; p < j; p++) {
        char c = s->s[p];
        if (c == '_') {
            if (p == i || p + 1 == j || !(s->s[p - 1] >= '0' && s->s[p - 1] <= '9') ||
                !(s->s[p + 1] >= '0' && s->s[p + 1] <= '9'))
                return false;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", c)) return false;
        buf[k++] = c;
    }
    buf[k] = 0;
    const char *b = buf + (buf[0] == '+' || buf[0] == '-');
    if (!strcasecmp(b, "inf") || !strcasecmp(b, "infinity") || !strcasecmp(b, "nan")) {
        double x = strcasecmp(b, "nan") ? INFINITY : NAN;
        *out = buf[0] == '-' ? -x : x;
        return true;
    }
    if (strchr(buf, 'x') || strchr(buf, 'X')) return false;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && (isdigit((unsigned char)b[0]) || (b[0] == '.' && isdigit((unsigned char)b[1])));
}

static Jv f_float(JRender *r, Jv v, const JArgs *args)
{
    BIND("float", "default");
    Jv dflt = hv[0] ? av[0] : jv_float(0.0);
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (v.t == JV_FLOAT) return v;
    if (jv_is_intlike(v)) return jv_float((double)jv_as_int(v));
    if (v.t == JV_STR) {
        double x;
        if (parse_py_float(v.u.s, &x)) return jv_float(x);
    }
    return dflt;
}

/* Python int(str, base). */
static bool parse_py_int(const JStr *s, int base, int64_t *out)
{
    size_t i = 0, j = s->n;
    while (i < j && (unsigned char)s->s[i] < 0x80 && jpy_isspace((unsigned char)s->s[i])) i++;
    while (j > i && (unsigned char)s->s[j - 1] < 0x80 && jpy_isspace((unsigned char)s->s[j - 1])) j--;
    bool neg = false;
    if (i < j && (s->s[i] == '+' || s->s[i] == '-')) neg = s->s[i++] == '-';
    if (i + 1 < j && s->s[i] == '0') {
        char c = (char)(s->s[i + 1] | 32);
        int pb = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) {
            base = pb;
            i += 2;
            if (i < j && s->s[i] == '_') i++;
        }
    }
    if (base == 0) base = 10;
    if (i == j) return false;
    uint64_t v = 0;
    bool prev_us = true;
    for (size_t p = i; p < j; p++) {
        char c = s->s[p];
        if (c == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'z' ? (c | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_us = false;
    }
    if (prev_us) return false;
    if (v > (uint64_t)INT64_MAX + (neg ? 1 : 0)) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static Jv f_int(JRender *r, Jv v, const JArgs *args)
{
    BIND("int", "default", "base");
    Jv dflt = hv[0] ? av[0] : jv_int(0);
    int base = hv[1] ? (int)want_int(r, av[1], "int base") : 10;
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (jv_is_intlike(v)) return jv_int(jv_as_int(v));
    if (v.t == JV_FLOAT) {
        if (isnan(v.u.f) || isinf(v.u.f)) return dflt;
        if (fabs(v.u.f) >= 9.2e18) jr_fail(r, "integer overflow");
        return jv_int((int64_t)v.u.f);
    }
    if (v.t == JV_STR) {
        int64_t x;
        if (parse_py_int(v.u.s, base, &x)) return jv_int(x);
        double f;
        if (parse_py_float(v.u.s, &f) && !isnan(f) && !isinf(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);
    }
    return dflt;
}

static Jv f_indent(JRender *r, Jv v, const JArgs *args)
{
    BIND("indent", "width", "first", "blank");
    const JStr *ind;
    if (hv[0] && av[0].t == JV_STR) {
        ind = av[0].u.s;
    } else {
        int64_t w = hv[0] ? want_int(r, av[0], "indent width") : 4;
        if (w < 0) w = 0;
        if (w > 1000000) jr_fail(r, "indent width too large");
        JStr *sp = jarena_alloc(r->a, sizeof *sp + (size_t)w + 1);
        memset(sp->s, ' ', (size_t)w);
        sp->s[w] = 0;
        sp->n = (size_t)w;
        ind = sp;
    }
    /* jinja2 does s += "\n" first: only a string survives that */
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (v.t == JV_LIST && !(v.flags & JV_F_NOSEQ) && !(v.flags & JV_F_TUPLE))
        jr_fail(r, "'list' object has no attribute 'splitlines'");
    if (v.t != JV_STR) jr_fail(r, "unsupported operand type(s) for +=: '%s' and 'str'", jv_pytype(v));
    const JStr *s = v.u.s;
    JStr *s2 = jarena_alloc(r->a, sizeof *s2 + s->n + 2);
    memcpy(s2->s, s->s, s->n);
    s2->s[s->n] = '\n';
    s2->s[s->n + 1] = 0;
    s2->n = s->n + 1;
    Jv lines = py_splitlines(r, s2, false);
    const JList *l = lines.u.l;
    bool first = hv[1] && jv_truthy(av[1]), blank = hv[2] && jv_truthy(av[2]);
    JBuf b;
    jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
    if (first) jbuf_put(&b, ind->s, ind->n);
    for (size_t k = 0; k < l->n; k++) {
        const JStr *line = l->v[k].u.s;
        if (k > 0) {
            jbuf_putc(&b, '\n');
            if (blank || line->n) jbuf_put(&b, ind->s, ind->n);
        }
        jbuf_put(&b, line->s, line->n);
    }
    jr_work(r, b.n / 64);
    return jbuf_value(&b);
}

/* jinja2's map, select, reject, selectattr, rejectattr, unique and items
 * are generators: an error inside them surfaces only when the result is
 * iterated.  fn runs eagerly; its error (not a limit) is kept in the
 * result. */
static Jv lazily(JRender *r, Jv (*fn)(JRender *, Jv, const JArgs *), Jv v, const JArgs *args)
{
    jmp_buf saved;
    memcpy(saved, r->jb, sizeof saved);
    int depth = r->depth, calls = r->calls, line = r->line;
    Jv out;
    if (setjmp(r->jb) == 0) {
        out = fn(r, v, args);
    } else {
        memcpy(r->jb, saved, sizeof saved);
        if (r->hard) longjmp(r->jb, 1);
        r->depth = depth;
        r->calls = calls;
        r->line = line;
        out = gen(jv_list(r->a, 0));
        out.u.l->err = jstr_new(r->a, r->err, strlen(r->err))->s;
    }
    memcpy(r->jb, saved, sizeof saved);
    return out;
}

static Jv items_eager(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "items");
    if (v.t == JV_UNDEF) return gen(jv_list(r->a, 0));
    if (v.t != JV_DICT) jr_fail(r, "Can only get item pairs from a mapping.");
    Jv out = jv_list(r->a, v.u.d->n);
    for (size_t k = 0; k < v.u.d->n; k++) out.u.l->v[k] = tuple2(r, v.u.d->e[k].k, v.u.d->e[k].v);
    return gen(out);
}

static Jv f_items(JRender *r, Jv v, const JArgs *args) { return lazily(r, items_eager, v, args); }

static Jv f_join(JRender *r, Jv v, const JArgs *args)
{
    BIND("join", "d", "attribute");
    const JStr *d = hv[0] ? sstr(r, av[0]) : jstr_new(r->a, "", 0);
    const JList *l = jr_iter(r, v);
    JBuf b;
    jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
    for (size_t k = 0; k < l->n; k++) {
        if (k) jbuf_put(&b, d->s, d->n);
        Jv item = hv[1] ? attr_path(r, l->v[k], av[1], jv_undef0()) : l->v[k];
        jv_write_str(&b, item);
    }
    jr_work(r, b.n / 64 + l->n / 8);
    return jbuf_value(&b);
}

static Jv f_list(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "list");
    const JList *l = jr_iter(r, v);
    Jv out = jv_list(r->a, l->n);
    memcpy(out.u.l->v, l->v, l->n * sizeof(Jv));
    return out;
}

static Jv f_lower(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "lower");
    return change_case(r, sstr(r, v), CASE_LOWER);
}

static Jv f_upper(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "upper");
    return change_case(r, sstr(r, v), CASE_UPPER);
}

static Jv f_title(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "title");
    return change_case(r, sstr(r, v), CASE_JTITLE);
}

/* The rest of the arguments (from index off), for map / select. */
static JArgs args_from(const JArgs *a, size_t off)
{
    JArgs o = *a;
    o.pos = a->pos + (off < a->npos ? off : a->npos);
    o.npos = off < a->npos ? a->npos - off : 0;
    return o;
}

static Jv map_eager(JRender *r, Jv v, const JArgs *args)
{
    if (!jv_truthy(v)) return gen(jv_list(r->a, 0)); /* jinja2: "if value:" */
    const JList *l = jr_iter(r, v);
    Jv out = jv_list(r->a, l->n);
    if (args->npos == 0) {
        Jv attribute = jv_undef0(), dflt = jv_undef0();
        for (size_t k = 0; k < args->nkw; k++) {
            const char *kn = jr_kwname(r, args, k);
            if (!strcmp(kn, "attribute")) attribute = args->kw[k];
            else if (!strcmp(kn, "default")) dflt = args->kw[k];
            else jr_fail(r, "map(): unexpected keyword argument '%s'", kn);
        }
        if (attribute.t == JV_UNDEF) jr_fail(r, "map requires a filter argument");
        for (size_t k = 0; k < l->n; k++) out.u.l->v[k] = attr_path(r, l->v[k], attribute, dflt);
    } else {
        const JStr *name = want_str(r, args->pos[0], "map filter name");
        int id = jbi_filter_id(name->s, name->n);
        if (id < 0) jr_fail(r, "No filter named '%s'.", name->s);
        JArgs rest = args_from(args, 1);
        for (size_t k = 0; k < l->n; k++) out.u.l->v[k] = jbi_filter(r, id, l->v[k], &rest);
    }
    jr_work(r, l->n);
    return gen(out);
}

static Jv f_map(JRender *r, Jv v, const JArgs *args) { return lazily(r, map_eager, v, args); }

static Jv min_max(JRender *r, Jv v, const JArgs *args, bool want_max, const char *fname)
{
    BIND(fname, "case_sensitive", "attribute");
    const JList *l = jr_iter(r, v);
    if (!l->n) return jv_undef(r->a, NULL, NULL, NULL, "No aggregated item, sequence was empty.");
    bool cs = hv[0] && jv_truthy(av[0]);
    Jv best = l->v[0], bkey = lower_if_str(r, attr_path(r, best, hv[1] ? av[1] : jv_undef0(), jv_undef0()), cs);
    char err[160];
    for (size_t k = 1; k < l->n; k++) {
        Jv key = lower_if_str(r, attr_path(r, l->v[k], hv[1] ? av[1] : jv_undef0(), jv_undef0()), cs);
        bool lt;
        if (key.t == JV_UNDEF) jr_fail_undef(r, key);
        if (bkey.t == JV_UNDEF) jr_fail_undef(r, bkey);
        if (want_max ? jv_lt(bkey, key, &lt, err, sizeof err) : jv_lt(key, bkey, &lt, err, sizeof err))
            jr_fail(r, "%s", err);
        if (lt) {
            best = l->v[k];
            bkey = key;
        }
    }
    return best;
}

static Jv f_max(JRender *r, Jv v, const JArgs *args) { return min_max(r, v, args, true, "max"); }
static Jv f_min(JRender *r, Jv v, const JArgs *args) { return min_max(r, v, args, false, "min"); }

static Jv select_reject(JRender *r, Jv v, const JArgs *args, bool select, bool by_attr)
{
    if (!jv_truthy(v)) return gen(jv_list(r->a, 0)); /* jinja2: "if value:" */
    const JList *l = jr_iter(r, v);
    size_t off = 0;
    Jv attr = jv_undef0();
    if (by_attr) {
        if (args->npos < 1) jr_fail(r, "Missing parameter for attribute name");
        attr = args->pos[0];
        off = 1;
    }
    int test = -1;
    JArgs rest = args_from(args, off + 1);
    if (args->npos > off) {
        const JStr *name = want_str(r, args->pos[off], "test name");
        test = jbi_test_id(name->s, name->n);
        if (test < 0) jr_fail(r, "No test named '%s'.", name->s);
    }
    Jv out = jv_list(r->a, l->n);
    size_t m = 0;
    for (size_t k = 0; k < l->n; k++) {
        Jv x = by_attr ? attr_path(r, l->v[k], attr, jv_undef0()) : l->v[k];
        bool t = test >= 0 ? jbi_test(r, test, x, &rest) : jv_truthy(x);
        if (t == select) out.u.l->v[m++] = l->v[k];
    }
    out.u.l->n = m;
    jr_work(r, l->n);
    return gen(out);
}

static Jv sel(JRender *r, Jv v, const JArgs *a) { return select_reject(r, v, a, true, false); }
static Jv rej(JRender *r, Jv v, const JArgs *a) { return select_reject(r, v, a, false, false); }
static Jv selattr(JRender *r, Jv v, const JArgs *a) { return select_reject(r, v, a, true, true); }
static Jv rejattr(JRender *r, Jv v, const JArgs *a) { return select_reject(r, v, a, false, true); }
static Jv f_select(JRender *r, Jv v, const JArgs *a) { return lazily(r, sel, v, a); }
static Jv f_reject(JRender *r, Jv v, const JArgs *a) { return lazily(r, rej, v, a); }
static Jv f_selectattr(JRender *r, Jv v, const JArgs *a) { return lazily(r, selattr, v, a); }
static Jv f_rejectattr(JRender *r, Jv v, const JArgs *a) { return lazily(r, rejattr, v, a); }

static Jv f_replace(JRender *r, Jv v, const JArgs *args)
{
    BIND("replace", "old", "new", "count");
    if (!hv[0] || !hv[1]) jr_fail(r, "replace() missing required arguments 'old' and 'new'");
    int64_t count = hv[2] && av[2].t != JV_NONE ? want_int(r, av[2], "replace count") : -1;
    return py_replace(r, sstr(r, v), sstr(r, av[0]), sstr(r, av[1]), count);
}

static Jv f_reverse(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "reverse");
    if (v.t == JV_STR) {
        Cps c = decode(r, v.u.s);
        JBuf b;
        jbuf_init(&b, r->a, 0);
        for (size_t k = c.n; k-- > 0;) jbuf_put(&b, v.u.s->s + c.off[k], c.off[k + 1] - c.off[k]);
        return jbuf_value(&b);
    }
    if (!(v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF)) jr_fail(r, "argument must be iterable");
    const JList *l = jr_iter(r, v);
    Jv out = jv_list(r->a, l->n);
    for (size_t k = 0; k < l->n; k++) out.u.l->v[k] = l->v[l->n - 1 - k];
    /* reversed() of a sequence is an iterator; a generator becomes a list */
    if (!(v.t == JV_LIST && (v.flags & JV_F_GEN))) out.flags = JV_F_GEN;
    return out;
}

static Jv f_round(JRender *r, Jv v, const JArgs *args)
{
    BIND("round", "precision", "method");
    int64_t prec = hv[0] ? want_int(r, av[0], "round precision") : 0;
    const char *method = hv[1] ? want_str(r, av[1], "round method")->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        jr_fail(r, "method must be common, ceil or floor");
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (!jv_is_num(v)) jr_fail(r, "type %s doesn't define __round__ method", jv_pytype(v));
    if (!strcmp(method, "common")) {
        if (jv_is_intlike(v)) {
            if (prec >= 0) return jv_int(jv_as_int(v));
            jr_fail(r, "round() of an int to negative precision is not supported here");
        }
        double x = v.u.f;
        if (isnan(x) || isinf(x) || prec > 300) return v;
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            return jv_float(strtod(buf, NULL));
        }
        double p = pow(10.0, (double)-prec);
        return jv_float(nearbyint(x / p) * p);
    }
    double x = v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v);
    if (prec < -300 || prec > 300) jr_fail(r, "round precision out of range");
    double p = pow(10.0, (double)prec);
    double y = !strcmp(method, "ceil") ? ceil(x * p) : floor(x * p);
    return jv_float(y / p);
}

static Jv f_safe(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "safe");
    return jv_strv(sstr(r, v));
}

static Jv f_sort(JRender *r, Jv v, const JArgs *args)
{
    BIND("sort", "reverse", "case_sensitive", "attribute");
    const JList *l = jr_iter(r, v);
    size_t n = l->n;
    bool cs = hv[1] && jv_truthy(av[1]);
    Jv *items = jarena_alloc(r->a, (n + 1) * sizeof *items), *keys = jarena_alloc(r->a, (n + 1) * sizeof *keys);
    /* attribute "a,b" sorts by a list of keys */
    size_t nattr = 0;
    Jv attrs[16];
    if (hv[2] && av[2].t == JV_STR) {
        const JStr *a = av[2].u.s;
        size_t i = 0;
        for (;;) {
            const char *c = memchr(a->s + i, ',', a->n - i);
            size_t end = c ? (size_t)(c - a->s) : a->n;
            if (nattr == 16) jr_fail(r, "sort: too many attributes");
            attrs[nattr++] = jv_str(r->a, a->s + i, end - i);
            if (!c) break;
            i = end + 1;
        }
    } else if (hv[2] && av[2].t != JV_NONE) {
        attrs[nattr++] = av[2];
    }
    for (size_t k = 0; k < n; k++) {
        items[k] = l->v[k];
        Jv key = jv_list(r->a, nattr ? nattr : 1);
        for (size_t j = 0; j < (nattr ? nattr : 1); j++)
            key.u.l->v[j] = lower_if_str(r, nattr ? attr_path(r, l->v[k], attrs[j], jv_undef0()) : l->v[k], cs);
        keys[k] = key;
    }
    sort_by(r, items, keys, n, hv[0] && jv_truthy(av[0]));
    Jv out = jv_list(r->a, n);
    memcpy(out.u.l->v, items, n * sizeof *items);
    return out;
}

static Jv f_string(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "string");
    return jv_strv(sstr(r, v));
}

static Jv f_sum(JRender *r, Jv v, const JArgs *args)
{
    BIND("sum", "attribute", "start");
    const JList *l = jr_iter(r, v);
    Jv acc = hv[1] ? av[1] : jv_int(0);
    for (size_t k = 0; k < l->n; k++) {
        Jv x = hv[0] ? attr_path(r, l->v[k], av[0], jv_undef0()) : l->v[k];
        if (x.t == JV_UNDEF) jr_fail_undef(r, x);
        if (jv_is_num(acc) && jv_is_num(x)) {
            if (acc.t == JV_FLOAT || x.t == JV_FLOAT) {
                acc = jv_float((acc.t == JV_FLOAT ? acc.u.f : (double)jv_as_int(acc)) + (x.t == JV_FLOAT ? x.u.f : (double)jv_as_int(x)));
            } else {
                int64_t z;
                if (__builtin_add_overflow(jv_as_int(acc), jv_as_int(x), &z)) jr_fail(r, "integer overflow");
                acc = jv_int(z);
            }
        } else if (acc.t == JV_LIST && x.t == JV_LIST && !((acc.flags | x.flags) & JV_F_NOSEQ)) {
            Jv o = jv_list(r->a, acc.u.l->n + x.u.l->n);
            o.flags = acc.flags;
            memcpy(o.u.l->v, acc.u.l->v, acc.u.l->n * sizeof(Jv));
            memcpy(o.u.l->v + acc.u.l->n, x.u.l->v, x.u.l->n * sizeof(Jv));
            acc = o;
        } else {
            jr_fail(r, "unsupported operand type(s) for +: '%s' and '%s'", jv_pytype(acc), jv_pytype(x));
        }
    }
    jr_work(r, l->n);
    return acc;
}

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False). */
static Jv f_tojson(JRender *r, Jv v, const JArgs *args)
{
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    bool ensure_ascii = hv[0] && jv_truthy(av[0]);
    const char *indent = NULL;
    if (hv[1] && av[1].t != JV_NONE) {
        if (av[1].t == JV_STR) {
            indent = av[1].u.s->s;
        } else {
            int64_t w = want_int(r, av[1], "tojson indent");
            if (w > 10000) jr_fail(r, "tojson indent too large");
            char *sp = jarena_alloc(r->a, (size_t)(w > 0 ? w : 0) + 1);
            memset(sp, ' ', (size_t)(w > 0 ? w : 0));
            sp[w > 0 ? w : 0] = 0;
            indent = sp;
        }
    }
    const char *item_sep = NULL, *key_sep = NULL;
    if (hv[2] && av[2].t != JV_NONE) {
        if (av[2].t != JV_LIST || av[2].u.l->n != 2 || av[2].u.l->v[0].t != JV_STR || av[2].u.l->v[1].t != JV_STR)
            jr_fail(r, "tojson separators must be a pair of strings");
        item_sep = av[2].u.l->v[0].u.s->s;
        key_sep = av[2].u.l->v[1].u.s->s;
    }
    JBuf b;
    jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
    char err[200];
    if (v.t == JV_UNDEF) jr_fail(r, "Object of type Undefined is not JSON serializable");
    if (jv_write_json(&b, v, ensure_ascii, indent, item_sep, key_sep, hv[3] && jv_truthy(av[3]), err, sizeof err))
        jr_fail(r, "%s", err);
    jr_work(r, b.n / 64);
    return jbuf_value(&b);
}

static Jv f_trim(JRender *r, Jv v, const JArgs *args)
{
    BIND("trim", "chars");
    return py_strip(r, sstr(r, v), hv[0] ? av[0] : jv_none(), true, true);
}

static Jv unique_eager(JRender *r, Jv v, const JArgs *args)
{
    BIND("unique", "case_sensitive", "attribute");
    const JList *l = jr_iter(r, v);
    bool cs = hv[0] && jv_truthy(av[0]);
    Jv out = jv_list(r->a, l->n), *seen = jarena_alloc(r->a, (l->n + 1) * sizeof(Jv));
    size_t m = 0;
    for (size_t k = 0; k < l->n; k++) {
        Jv key = lower_if_str(r, hv[1] ? attr_path(r, l->v[k], av[1], jv_undef0()) : l->v[k], cs);
        if (!jv_hashable(key)) jr_fail(r, "unhashable type: '%s'", jv_pytype(key));
        bool dup = false;
        for (size_t j = 0; j < m && !dup; j++) dup = jv_eq(seen[j], key);
        jr_work(r, m / 8 + 1);
        if (dup) continue;
        seen[m] = key;
        out.u.l->v[m++] = l->v[k];
    }
    out.u.l->n = m;
    return gen(out);
}

static Jv f_unique(JRender *r, Jv v, const JArgs *args) { return lazily(r, unique_eager, v, args); }

static Jv f_wordcount(JRender *r, Jv v, const JArgs *args)
{
    no_args(r, args, "wordcount");
    Cps c = decode(r, sstr(r, v));
    int64_t words = 0;
    bool in = false;
    for (size_t k = 0; k < c.n; k++) {
        bool w = c.cp[k] == '_' || cp_alpha(c.cp[k]) || cp_numeric(c.cp[k]);
        if (w && !in) words++;
        in = w;
    }
    return jv_int(words);
}

static Jv f_format(JRender *r, Jv v, const JArgs *args)
{
    if (args->npos && args->nkw) jr_fail(r, "can't handle positional and keyword arguments at the same time");
    Jv a;
    if (args->nkw) {
        a = jv_dict(r->a);
        for (size_t k = 0; k < args->nkw; k++) jdict_set(r->a, a.u.d, jv_cstr(r->a, jr_kwname(r, args, k)), args->kw[k]);
    } else {
        a = jv_list(r->a, args->npos);
        a.flags = JV_F_TUPLE;
        memcpy(a.u.l->v, args->pos, args->npos * sizeof(Jv));
    }
    return jbi_str_percent(r, sstr(r, v), a);
}

static Jv f_attr(JRender *r, Jv v, const JArgs *args)
{
    BIND("attr", "name");
    if (!hv[0]) jr_fail(r, "attr() missing required argument 'name'");
    const JStr *name = sstr(r, av[0]);
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (jbi_method_of(v, name->s, name->n) >= 0 || v.t == JV_NS || v.t == JV_LOOP) return jr_getattr(r, v, name->s, name->n);
    return jv_undef(r->a, NULL, jv_type_name(v), name->s, NULL);
}

static const struct { const char *name; FilterFn fn; } FILTERS[] = {
    { "abs", f_abs }, { "attr", f_attr }, { "capitalize", f_capitalize }, { "center", f_center },
    { "count", f_length }, { "d", f_default }, { "default", f_default }, { "dictsort", f_dictsort },
    { "e", f_escape }, { "escape", f_escape }, { "first", f_first }, { "float", f_float },
    { "format", f_format }, { "indent", f_indent }, { "int", f_int }, { "items", f_items },
    { "join", f_join }, { "last", f_last }, { "length", f_length }, { "list", f_list },
    { "lower", f_lower }, { "map", f_map }, { "max", f_max }, { "min", f_min }, { "reject", f_reject },
    { "rejectattr", f_rejectattr }, { "replace", f_replace }, { "reverse", f_reverse },
    { "round", f_round }, { "safe", f_safe }, { "select", f_select }, { "selectattr", f_selectattr },
    { "sort", f_sort }, { "string", f_string }, { "sum", f_sum }, { "title", f_title },
    { "tojson", f_tojson }, { "trim", f_trim }, { "unique", f_unique }, { "upper", f_upper },
    { "wordcount", f_wordcount },
};
#define N_FILTERS (sizeof FILTERS / sizeof *FILTERS)

int jbi_filter_id(const char *s, size_t n)
{
    for (size_t k = 0; k < N_FILTERS; k++)
        if (strlen(FILTERS[k].name) == n && memcmp(FILTERS[k].name, s, n) == 0) return (int)k;
    return -1;
}

const char *jbi_filter_name(int id) { return FILTERS[id].name; }

Jv jbi_filter(JRender *r, int id, Jv v, const JArgs *args)
{
    jr_work(r, 1);
    return FILTERS[id].fn(r, v, args);
}

/* ---------------------------------------------------------------- tests */

typedef bool (*TestFn)(JRender *r, Jv v, const JArgs *args);

static Jv arg1(JRender *r, const JArgs *args, const char *tname)
{
    if (args->npos + args->nkw != 1) jr_fail(r, "test '%s' takes exactly one argument", tname);
    return args->npos ? args->pos[0] : args->kw[0];
}

static bool modulo_is(JRender *r, Jv v, int64_t m, int64_t want)
{
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (v.t == JV_FLOAT) {
        if (m == 0) jr_fail(r, "float modulo");
        double x = fmod(v.u.f, (double)m);
        if (x != 0 && ((x < 0) != (m < 0))) x += (double)m;
        return x == (double)want;
    }
    if (!jv_is_intlike(v)) jr_fail(r, "unsupported operand type(s) for %%: '%s' and 'int'", jv_pytype(v));
    if (m == 0) jr_fail(r, "integer division or modulo by zero");
    int64_t x = jv_as_int(v) % m;
    if (x != 0 && ((x < 0) != (m < 0))) x += m;
    return x == want;
}

static bool t_odd(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "odd"); return modulo_is(r, v, 2, 1); }
static bool t_even(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "even"); return modulo_is(r, v, 2, 0); }
static bool t_divisibleby(JRender *r, Jv v, const JArgs *a)
{
    Jv m = arg1(r, a, "divisibleby");
    if (m.t == JV_FLOAT) {
        if (v.t == JV_UNDEF) jr_fail_undef(r, v);
        double x = fmod(v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v), m.u.f);
        return x == 0;
    }
    return modulo_is(r, v, want_int(r, m, "divisibleby"), 0);
}
static bool t_defined(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "defined"); return v.t != JV_UNDEF; }
static bool t_undefined(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "undefined"); return v.t == JV_UNDEF; }
static bool t_none(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "none"); return v.t == JV_NONE; }
static bool t_boolean(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "boolean"); return v.t == JV_BOOL; }
static bool t_false(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "false"); return v.t == JV_BOOL && !v.u.b; }
static bool t_true(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "true"); return v.t == JV_BOOL && v.u.b; }
static bool t_integer(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "integer"); return v.t == JV_INT; }
static bool t_float(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "float"); return v.t == JV_FLOAT; }
static bool t_number(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "number"); return jv_is_num(v); }
static bool t_string(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "string"); return v.t == JV_STR; }
static bool t_mapping(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "mapping"); return v.t == JV_DICT; }
static bool t_sequence(JRender *r, Jv v, const JArgs *a)
{
    no_args(r, a, "sequence");
    return v.t == JV_STR || v.t == JV_DICT || v.t == JV_UNDEF || (v.t == JV_LIST && !(v.flags & JV_F_NOSEQ));
}
static bool t_iterable(JRender *r, Jv v, const JArgs *a)
{
    no_args(r, a, "iterable");
    return v.t == JV_STR || v.t == JV_DICT || v.t == JV_UNDEF || v.t == JV_LIST;
}
static bool t_callable(JRender *r, Jv v, const JArgs *a)
{
    no_args(r, a, "callable");
    return v.t == JV_MACRO || v.t == JV_METHOD || v.t == JV_FUNC;
}
static bool t_escaped(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "escaped"); (void)v; return false; }
/* str.islower / isupper: no character of the other case (or titlecase),
 * and at least one of this one. */
static bool all_cased(JRender *r, Jv v, bool upper)
{
    Cps c = decode(r, sstr(r, v));
    bool any = false;
    for (size_t k = 0; k < c.n; k++) {
        if (upper ? cp_lower(c.cp[k]) || cp_title(c.cp[k]) : cp_upper(c.cp[k]) || cp_title(c.cp[k])) return false;
        any = any || (upper ? cp_upper(c.cp[k]) : cp_lower(c.cp[k]));
    }
    return any;
}
static bool t_lower(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "lower"); return all_cased(r, v, false); }
static bool t_upper(JRender *r, Jv v, const JArgs *a) { no_args(r, a, "upper"); return all_cased(r, v, true); }

static bool cmp_test(JRender *r, Jv v, const JArgs *a, const char *name, int op)
{
    Jv o = arg1(r, a, name);
    if (op == 0) return jv_eq(v, o);
    if (op == 1) return !jv_eq(v, o);
    if (v.t == JV_UNDEF) jr_fail_undef(r, v);
    if (o.t == JV_UNDEF) jr_fail_undef(r, o);
    bool lt;
    char err[160];
    Jv x = op == 2 || op == 3 ? v : o, y = op == 2 || op == 3 ? o : v;
    if (jv_lt(x, y, &lt, err, sizeof err)) jr_fail(r, "%s", err);
    if (op == 3 || op == 5) return lt || jv_eq(v, o);
    return lt;
}
static bool t_eq(JRender *r, Jv v, const JArgs *a) { return cmp_test(r, v, a, "eq", 0); }
static bool t_ne(JRender *r, Jv v, const JArgs *a) { return cmp_test(r, v, a, "ne", 1); }
static bool t_lt(JRender *r, Jv v, const JArgs *a) { return cmp_test(r, v, a, "lt", 2); }
static bool t_le(JRender *r, Jv v, const JArgs *a) { return cmp_test(r, v, a, "le", 3); }
static bool t_gt(JRender *r, Jv v, const JArgs *a) { return cmp_test(r, v, a, "gt", 4); }
static bool t_ge(JRender *r, Jv v, const JArgs *a) { return cmp_test(r, v, a, "ge", 5); }

static bool t_in(JRender *r, Jv v, const JArgs *a)
{
    Jv seq = arg1(r, a, "in");
    if (seq.t == JV_UNDEF) return false;
    if (seq.t == JV_STR) {
        if (v.t != JV_STR) jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_pytype(v));
        return v.u.s->n == 0 || memmem(seq.u.s->s, seq.u.s->n, v.u.s->s, v.u.s->n) != NULL;
    }
    if (seq.t == JV_LIST) {
        for (size_t k = 0; k < seq.u.l->n; k++)
            if (jv_eq(seq.u.l->v[k], v)) return true;
        return false;
    }
    if (seq.t == JV_DICT) return jv_hashable(v) && jdict_get(seq.u.d, v) != NULL;
    jr_fail(r, "argument of type '%s' is not iterable", jv_pytype(seq));
}

static bool t_sameas(JRender *r, Jv v, const JArgs *a)
{
    Jv o = arg1(r, a, "sameas");
    if (v.t != o.t) return false;
    switch (v.t) {
    case JV_NONE: return true;
    case JV_BOOL: return v.u.b == o.u.b;
    case JV_INT: return v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256; /* CPython's small ints */
    case JV_STR: return v.u.s == o.u.s;
    case JV_FLOAT: return false;
    default: return v.u.p == o.u.p;
    }
}

static bool t_filter(JRender *r, Jv v, const JArgs *a)
{
    no_args(r, a, "filter");
    return v.t == JV_STR && jbi_filter_id(v.u.s->s, v.u.s->n) >= 0;
}

static bool t_test(JRender *r, Jv v, const JArgs *a)
{
    no_args(r, a, "test");
    return v.t == JV_STR && jbi_test_id(v.u.s->s, v.u.s->n) >= 0;
}

static const struct { const char *name; TestFn fn; } TESTS[] = {
    { "boolean", t_boolean }, { "callable", t_callable }, { "defined", t_defined },
    { "divisibleby", t_divisibleby }, { "eq", t_eq }, { "equalto", t_eq }, { "==", t_eq },
    { "escaped", t_escaped }, { "even", t_even }, { "false", t_false }, { "filter", t_filter },
    { "float", t_float }, { "ge", t_ge }, { ">=", t_ge }, { "gt", t_gt }, { ">", t_gt },
    { "greaterthan", t_gt }, { "in", t_in }, { "integer", t_integer }, { "iterable", t_iterable },
    { "le", t_le }, { "<=", t_le }, { "lower", t_lower }, { "lessthan", t_lt }, { "lt", t_lt },
    { "<", t_lt }, { "mapping", t_mapping }, { "ne", t_ne }, { "!=", t_ne }, { "none", t_none },
    { "number", t_number }, { "odd", t_odd }, { "sameas", t_sameas }, { "sequence", t_sequence },
    { "string", t_string }, { "test", t_test }, { "true", t_true }, { "undefined", t_undefined },
    { "upper", t_upper },
};
#define N_TESTS (sizeof TESTS / sizeof *TESTS)

int jbi_test_id(const char *s, size_t n)
{
    for (size_t k = 0; k < N_TESTS; k++)
        if (strlen(TESTS[k].name) == n && memcmp(TESTS[k].name, s, n) == 0) return (int)k;
    return -1;
}

bool jbi_test(JRender *r, int id, Jv v, const JArgs *args)
{
    jr_work(r, 1);
    return TESTS[id].fn(r, v, args);
}

/* ---------------------------------------------------------------- %-formatting */

/* One conversion of fmt % args: flags, width, precision, type. */
static void percent_one(JRender *r, JBuf *b, const char *flags, int64_t width, int64_t prec, char type, Jv v)
{
    bool left = strchr(flags, '-') != NULL, zero = strchr(flags, '0') != NULL && !left;
    bool plus = strchr(flags, '+') != NULL, space = strchr(flags, ' ') != NULL, alt = strchr(flags, '#') != NULL;
    JBuf t;
    jbuf_init(&t, r->a, 0);
    bool numeric = false;
    if (type == 's' || type == 'r' || type == 'a') {
        if (type == 's') jv_write_str(&t, v);
        else jv_write_repr(&t, v);
        if (prec >= 0) {
            size_t cut = jutf8_offset(t.p ? t.p : "", t.n, (size_t)prec);
            t.n = cut;
        }
    } else if (type == 'c') {
        if (v.t == JV_STR && jutf8_len(v.u.s->s, v.u.s->n) == 1) jbuf_put(&t, v.u.s->s, v.u.s->n);
        else if (jv_is_intlike(v)) jbuf_put_cp(&t, (uint32_t)jv_as_int(v));
        else jr_fail(r, "%%c requires int or char");
    } else {
        if (v.t == JV_UNDEF) jr_fail_undef(r, v);
        if (!jv_is_num(v)) jr_fail(r, "%%%c format: a real number is required, not %s", type, jv_pytype(v));
        numeric = true;
        char spec[32], out[512];
        if (strchr("diu", type)) {
            int64_t x = v.t == JV_FLOAT ? (int64_t)v.u.f : jv_as_int(v);
            snprintf(spec, sizeof spec, "%%%s%s%slld", plus ? "+" : "", space ? " " : "", "");
            snprintf(out, sizeof out, spec, (long long)x);
        } else if (strchr("xXo", type)) {
            if (!jv_is_intlike(v)) jr_fail(r, "%%%c format: an integer is required, not float", type);
            int64_t x = jv_as_int(v);
            unsigned long long ux = (unsigned long long)(x < 0 ? -x : x);
            char digits[80];
            snprintf(digits, sizeof digits, type == 'o' ? "%llo" : type == 'x' ? "%llx" : "%llX", ux);
            snprintf(out, sizeof out, "%s%s%s", x < 0 ? "-" : plus ? "+" : space ? " " : "",
                     alt ? (type == 'o' ? "0o" : type == 'x' ? "0x" : "0X") : "", digits);
        } else if (strchr("eEfFgG", type)) {
            double x = v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v);
            snprintf(spec, sizeof spec, "%%%s%s%s.%d%c", plus ? "+" : "", space ? " " : "", alt ? "#" : "",
                     (int)(prec >= 0 ? (prec > 100 ? 100 : prec) : 6), type);
            snprintf(out, sizeof out, spec, x);
        } else {
            jr_fail(r, "unsupported format character '%c'", type);
        }
        jbuf_puts(&t, out);
    }
    size_t len = jutf8_len(t.p ? t.p : "", t.n);
    if (width > 100000) jr_fail(r, "format width too large");
    size_t padn = width > (int64_t)len ? (size_t)width - len : 0;
    if (!left && !(zero && numeric))
        for (size_t k = 0; k < padn; k++) jbuf_putc(b, ' ');
    if (zero && numeric && !left) {
        size_t sign = t.n && (t.p[0] == '-' || t.p[0] == '+' || t.p[0] == ' ') ? 1 : 0;
        jbuf_put(b, t.p, sign);
        for (size_t k = 0; k < padn; k++) jbuf_putc(b, '0');
        jbuf_put(b, t.p + sign, t.n - sign);
    } else {
        jbuf_put(b, t.p ? t.p : "", t.n);
    }
    if (left)
        for (size_t k = 0; k < padn; k++) jbuf_putc(b, ' ');
}

Jv jbi_str_percent(JRender *r, const JStr *fmt, Jv args)
{
    bool is_tuple = args.t == JV_LIST && (args.flags & JV_F_TUPLE);
    bool is_map = args.t == JV_DICT;
    /* CPython treats any non-tuple, non-str object with __getitem__ (a list)
     * as a mapping: unused, it is no "not all arguments converted" error */
    bool mapping_like = is_map || args.t == JV_UNDEF || (args.t == JV_LIST && !(args.flags & (JV_F_TUPLE | JV_F_GEN)));
    size_t argi = 0, nargs = is_tuple ? args.u.l->n : 1;
    JBuf b;
    jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
    const char *s = fmt->s;
    size_t n = fmt->n;
    jr_work(r, n / 64 + 1);
    for (size_t i = 0; i < n;) {
        if (s[i] != '%') {
            size_t st = i;
            while (i < n && s[i] != '%') i++;
            jbuf_put(&b, s + st, i - st);
            continue;
        }
        i++;
        if (i >= n) jr_fail(r, "incomplete format");
        Jv v;
        bool have = false;
        if (s[i] == '(') {
            size_t st = ++i;
            int depth = 1;
            while (i < n && depth) {
                if (s[i] == '(') depth++;
                else if (s[i] == ')') depth--;
                i++;
            }
            if (depth) jr_fail(r, "incomplete format key");
            if (args.t == JV_UNDEF) jr_fail_undef(r, args);
            if (!is_map) jr_fail(r, "format requires a mapping");
            JEntry *e = jdict_get_str(args.u.d, s + st, i - 1 - st);
            if (!e) jr_fail(r, "KeyError: '%.*s'", (int)(i - 1 - st), s + st);
            v = e->v;
            have = true;
        }
        char flags[8] = { 0 };
        int nf = 0;
        while (i < n && strchr("-+ #0", s[i]) && nf < 7) flags[nf++] = s[i++];
        int64_t width = 0, prec = -1;
        if (i < n && s[i] == '*') jr_fail(r, "'*' width in a format is not supported");
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            width = width * 10 + (s[i++] - '0');
            if (width > (int64_t)1 << 40) jr_fail(r, "a %%-format width with too many digits");
        }
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9') {
                prec = prec * 10 + (s[i++] - '0');
                if (prec > (int64_t)1 << 40) jr_fail(r, "a %%-format precision with too many digits");
            }
        }
        while (i < n && strchr("hlL", s[i])) i++;
        if (i >= n) jr_fail(r, "incomplete format");
        char type = s[i++];
        if (type == '%') {
            jbuf_putc(&b, '%');
            continue;
        }
        if (!have) {
            if (is_map && !is_tuple) {
                v = args;
            } else {
                if (argi >= nargs) jr_fail(r, "not enough arguments for format string");
                v = is_tuple ? args.u.l->v[argi] : args;
                argi++;
            }
        }
        percent_one(r, &b, flags, width, prec, type, v);
    }
    if (!mapping_like && argi < nargs) jr_fail(r, "not all arguments converted during string formatting");
    return jbuf_value(&b);
}

/* ---------------------------------------------------------------- str.format */

/* format(v, spec) for the mini-language's common cases. */
static void format_spec(JRender *r, JBuf *b, Jv v, const char *spec, size_t n)
{
    if (n == 0) {
        jv_write_str(b, v);
        return;
    }
    uint32_t fill = ' ';
    char align = 0;
    size_t i = 0;
    uint32_t cp;
    size_t k = jutf8_decode(spec, n, &cp);
    if (k < n && strchr("<>^=", spec[k])) {
        fill = cp;
        align = spec[k];
        i = k + 1;
    } else if (strchr("<>^=", spec[0])) {
        align = spec[0];
        i = 1;
    }
    char sign = 0;
    if (i < n && strchr("+- ", spec[i])) sign = spec[i++];
    bool alt = false;
    if (i < n && spec[i] == '#') { alt = true; i++; }
    if (i < n && spec[i] == '0') {
        if (!align) { fill = '0'; align = '='; }
        i++;
    }
    int64_t width = 0, prec = -1;
    /* (Python refuses widths past sys.maxsize: "Too many decimal digits in
     * format string"; the render's output limit stops far smaller ones) */
    while (i < n && spec[i] >= '0' && spec[i] <= '9') {
        width = width * 10 + (spec[i++] - '0');
        if (width > (int64_t)1 << 40) jr_fail(r, "format spec '%.*s': too many decimal digits", (int)n, spec);
    }
    char group = 0;
    if (i < n && (spec[i] == ',' || spec[i] == '_')) group = spec[i++];
    if (i < n && spec[i] == '.') {
        i++;
        prec = 0;
        while (i < n && spec[i] >= '0' && spec[i] <= '9') {
            prec = prec * 10 + (spec[i++] - '0');
            if (prec > (int64_t)1 << 40) jr_fail(r, "format spec '%.*s': too many decimal digits", (int)n, spec);
        }
    }
    char type = i < n ? spec[i++] : 0;
    if (i != n || group || alt) jr_fail(r, "unsupported format spec '%.*s'", (int)n, spec);
    JBuf t;
    jbuf_init(&t, r->a, 0);
    bool numeric = false;
    if (v.t == JV_STR && (type == 0 || type == 's')) {
        size_t cut = prec >= 0 ? jutf8_offset(v.u.s->s, v.u.s->n, (size_t)prec) : v.u.s->n;
        jbuf_put(&t, v.u.s->s, cut);
        if (!align) align = '<';
    } else if (jv_is_num(v) && v.t != JV_STR) {
        numeric = true;
        char out[512];
        const char *sg = sign == '+' ? "+" : sign == ' ' ? " " : "";
        if (v.t != JV_FLOAT && (type == 0 || type == 'd')) {
            snprintf(out, sizeof out, sign == '+' ? "%+lld" : sign == ' ' ? "% lld" : "%lld", (long long)jv_as_int(v));
        } else if (type && strchr("eEfFgG%", type)) {
            double x = v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v);
            char spec2[32];
            int p = (int)(prec >= 0 ? (prec > 100 ? 100 : prec) : 6);
            if (type == '%') {
                snprintf(spec2, sizeof spec2, "%%%s.%df%%%%", sg, p);
                snprintf(out, sizeof out, spec2, x * 100);
            } else {
                snprintf(spec2, sizeof spec2, "%%%s.%d%c", sg, p, type);
                snprintf(out, sizeof out, spec2, x);
            }
        } else if (v.t == JV_FLOAT && type == 0 && prec < 0) {
            JBuf f;
            jbuf_init(&f, r->a, 0);
            jv_write_float(&f, v.u.f);
            snprintf(out, sizeof out, "%s%s", (sign == '+' && v.u.f >= 0) ? "+" : (sign == ' ' && v.u.f >= 0) ? " " : "", f.p);
        } else {
            jr_fail(r, "unsupported format spec '%.*s' for %s", (int)n, spec, jv_pytype(v));
        }
        jbuf_puts(&t, out);
        if (!align) align = '>';
    } else {
        jr_fail(r, "unsupported format spec '%.*s' for %s", (int)n, spec, jv_pytype(v));
    }
    size_t len = jutf8_len(t.p ? t.p : "", t.n);
    size_t padn = width > (int64_t)len ? (size_t)width - len : 0;
    if (width > 100000) jr_fail(r, "format width too large");
    size_t left = align == '<' ? 0 : align == '^' ? padn / 2 : padn;
    size_t signlen = (align == '=' && numeric && t.n && strchr("+- ", t.p[0])) ? 1 : 0;
    jbuf_put(b, t.p, signlen);
    for (size_t q = 0; q < left; q++) jbuf_put_cp(b, fill);
    jbuf_put(b, (t.p ? t.p : "") + signlen, t.n - signlen);
    for (size_t q = left; q < padn; q++) jbuf_put_cp(b, fill);
}

static Jv py_format(JRender *r, const JStr *fmt, const JArgs *args)
{
    JBuf b;
    jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
    const char *s = fmt->s;
    size_t n = fmt->n, auto_idx = 0;
    jr_work(r, n / 64 + 1);
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '}') {
            if (i + 1 < n && s[i + 1] == '}') { jbuf_putc(&b, '}'); i += 2; continue; }
            jr_fail(r, "Single '}' encountered in format string");
        }
        if (c != '{') { jbuf_putc(&b, c); i++; continue; }
        if (i + 1 < n && s[i + 1] == '{') { jbuf_putc(&b, '{'); i += 2; continue; }
        size_t st = ++i;
        int depth = 1;
        while (i < n && depth) {
            if (s[i] == '{') depth++;
            else if (s[i] == '}') depth--;
            if (depth) i++;
        }
        if (i >= n) jr_fail(r, "Single '{' encountered in format string");
        const char *field = s + st;
        size_t fn = i - st;
        i++;
        /* field_name[!conv][:spec] */
        size_t name_end = 0;
        while (name_end < fn && field[name_end] != '!' && field[name_end] != ':') name_end++;
        char conv = 0;
        size_t spec_at = name_end;
        if (name_end < fn && field[name_end] == '!') {
            if (name_end + 1 >= fn) jr_fail(r, "end of string while looking for conversion specifier");
            conv = field[name_end + 1];
            spec_at = name_end + 2;
        }
        const char *spec = "";
        size_t sn = 0;
        if (spec_at < fn) {
            if (field[spec_at] != ':') jr_fail(r, "expected ':' after conversion specifier");
            spec = field + spec_at + 1;
            sn = fn - spec_at - 1;
        }
        /* the argument: index or name, then .attr / [key] */
        size_t p = 0;
        while (p < name_end && field[p] != '.' && field[p] != '[') p++;
        Jv v;
        if (p == 0) {
            if (auto_idx >= args->npos) jr_fail(r, "Replacement index %zu out of range for positional args tuple", auto_idx);
            v = args->pos[auto_idx++];
        } else {
            bool digits = true;
            for (size_t q = 0; q < p; q++) digits = digits && field[q] >= '0' && field[q] <= '9';
            if (digits) {
                size_t idx = (size_t)strtoull(field, NULL, 10);
                if (idx >= args->npos) jr_fail(r, "Replacement index %zu out of range for positional args tuple", idx);
                v = args->pos[idx];
            } else {
                size_t k = 0;
                while (k < args->nkw && !(strlen(jr_kwname(r, args, k)) == p && !memcmp(jr_kwname(r, args, k), field, p))) k++;
                if (k == args->nkw) jr_fail(r, "KeyError: '%.*s'", (int)p, field);
                v = args->kw[k];
            }
        }
        while (p < name_end) {
            if (field[p] == '.') {
                size_t q = ++p;
                while (p < name_end && field[p] != '.' && field[p] != '[') p++;
                v = jr_getattr(r, v, field + q, p - q);
            } else {
                size_t q = ++p;
                while (p < name_end && field[p] != ']') p++;
                if (p >= name_end) jr_fail(r, "Missing ']' in format string");
                bool digits = p > q;
                for (size_t z = q; z < p; z++) digits = digits && field[z] >= '0' && field[z] <= '9';
                Jv key = digits ? jv_int(strtoll(field + q, NULL, 10)) : jv_str(r->a, field + q, p - q);
                v = jr_getitem(r, v, key);
                p++;
            }
        }
        if (conv == 'r' || conv == 'a') {
            JBuf t;
            jbuf_init(&t, r->a, 0);
            jv_write_repr(&t, v);
            v = jbuf_value(&t);
        } else if (conv == 's') {
            v = jv_strv(sstr(r, v));
        } else if (conv) {
            jr_fail(r, "Unknown conversion specifier %c", conv);
        }
        format_spec(r, &b, v, spec, sn);
    }
    return jbuf_value(&b);
}

/* ---------------------------------------------------------------- methods */

enum { T_STR = 1, T_DICT = 2, T_LIST = 4, T_TUPLE = 8, T_LOOP = 16 };

enum {
    M_CAPITALIZE, M_CENTER, M_COUNT, M_ENDSWITH, M_FIND, M_FORMAT, M_INDEX, M_ISALNUM, M_ISALPHA,
    M_ISDIGIT, M_ISLOWER, M_ISSPACE, M_ISUPPER, M_JOIN, M_LJUST, M_LOWER, M_LSTRIP, M_PARTITION,
    M_REMOVEPREFIX, M_REMOVESUFFIX, M_REPLACE, M_RFIND, M_RINDEX, M_RJUST, M_RPARTITION, M_RSPLIT,
    M_RSTRIP, M_SPLIT, M_SPLITLINES, M_STARTSWITH, M_STRIP, M_SWAPCASE, M_TITLE, M_UPPER, M_ZFILL,
    M_COPY, M_GET, M_ITEMS, M_KEYS, M_VALUES, M_LCOUNT, M_LINDEX, M_CYCLE, M_CHANGED,
    M_UNIMPLEMENTED,
};

static const struct { const char *name; int types; int id; } METHODS[] = {
    { "capitalize", T_STR, M_CAPITALIZE }, { "center", T_STR, M_CENTER }, { "count", T_STR, M_COUNT },
    { "endswith", T_STR, M_ENDSWITH }, { "find", T_STR, M_FIND }, { "format", T_STR, M_FORMAT },
    { "index", T_STR, M_INDEX }, { "isalnum", T_STR, M_ISALNUM }, { "isalpha", T_STR, M_ISALPHA },
    { "isdigit", T_STR, M_ISDIGIT }, { "islower", T_STR, M_ISLOWER }, { "isspace", T_STR, M_ISSPACE },
    { "isupper", T_STR, M_ISUPPER }, { "join", T_STR, M_JOIN }, { "ljust", T_STR, M_LJUST },
    { "lower", T_STR, M_LOWER }, { "lstrip", T_STR, M_LSTRIP }, { "partition", T_STR, M_PARTITION },
    { "removeprefix", T_STR, M_REMOVEPREFIX }, { "removesuffix", T_STR, M_REMOVESUFFIX },
    { "replace", T_STR, M_REPLACE }, { "rfind", T_STR, M_RFIND }, { "rindex", T_STR, M_RINDEX },
    { "rjust", T_STR, M_RJUST }, { "rpartition", T_STR, M_RPARTITION }, { "rsplit", T_STR, M_RSPLIT },
    { "rstrip", T_STR, M_RSTRIP }, { "split", T_STR, M_SPLIT }, { "splitlines", T_STR, M_SPLITLINES },
    { "startswith", T_STR, M_STARTSWITH }, { "strip", T_STR, M_STRIP }, { "swapcase", T_STR, M_SWAPCASE },
    { "title", T_STR, M_TITLE }, { "upper", T_STR, M_UPPER }, { "zfill", T_STR, M_ZFILL },
    { "copy", T_DICT | T_LIST, M_COPY }, { "get", T_DICT, M_GET }, { "items", T_DICT, M_ITEMS },
    { "keys", T_DICT, M_KEYS }, { "values", T_DICT, M_VALUES },
    { "count", T_LIST | T_TUPLE, M_LCOUNT }, { "index", T_LIST | T_TUPLE, M_LINDEX },
    { "cycle", T_LOOP, M_CYCLE }, { "changed", T_LOOP, M_CHANGED },
    /* Python attributes that exist but are not implemented here (mutating
     * ones are blocked by the sandbox anyway): x.name is a bound method,
     * calling it is refused */
    { "casefold", T_STR, M_UNIMPLEMENTED }, { "encode", T_STR, M_UNIMPLEMENTED },
    { "expandtabs", T_STR, M_UNIMPLEMENTED }, { "format_map", T_STR, M_UNIMPLEMENTED },
    { "isascii", T_STR, M_UNIMPLEMENTED }, { "isdecimal", T_STR, M_UNIMPLEMENTED },
    { "isidentifier", T_STR, M_UNIMPLEMENTED }, { "isnumeric", T_STR, M_UNIMPLEMENTED },
    { "isprintable", T_STR, M_UNIMPLEMENTED }, { "istitle", T_STR, M_UNIMPLEMENTED },
    { "maketrans", T_STR, M_UNIMPLEMENTED }, { "translate", T_STR, M_UNIMPLEMENTED },
    { "clear", T_DICT | T_LIST, M_UNIMPLEMENTED }, { "fromkeys", T_DICT, M_UNIMPLEMENTED },
    { "pop", T_DICT | T_LIST, M_UNIMPLEMENTED }, { "popitem", T_DICT, M_UNIMPLEMENTED },
    { "setdefault", T_DICT, M_UNIMPLEMENTED }, { "update", T_DICT, M_UNIMPLEMENTED },
    { "append", T_LIST, M_UNIMPLEMENTED }, { "extend", T_LIST, M_UNIMPLEMENTED },
    { "insert", T_LIST, M_UNIMPLEMENTED }, { "remove", T_LIST, M_UNIMPLEMENTED },
    { "reverse", T_LIST, M_UNIMPLEMENTED }, { "sort", T_LIST, M_UNIMPLEMENTED },
};
#define N_METHODS (sizeof METHODS / sizeof *METHODS)

bool jbi_method_known(const char *s, size_t n)
{
    for (size_t k = 0; k < N_METHODS; k++)
        if (METHODS[k].id != M_UNIMPLEMENTED && strlen(METHODS[k].name) == n && !memcmp(METHODS[k].name, s, n))
            return true;
    return false;
}

int jbi_method_of(Jv obj, const char *s, size_t n)
{
    int t = obj.t == JV_STR ? T_STR : obj.t == JV_DICT ? T_DICT : obj.t == JV_LOOP ? T_LOOP
          : obj.t == JV_LIST && !(obj.flags & JV_F_NOSEQ) ? ((obj.flags & JV_F_TUPLE) ? T_TUPLE : T_LIST) : 0;
    if (!t) return -1;
    for (size_t k = 0; k < N_METHODS; k++)
        if ((METHODS[k].types & t) && strlen(METHODS[k].name) == n && !memcmp(METHODS[k].name, s, n)) return (int)k;
    return -1;
}

static bool str_all(JRender *r, const JStr *s, bool (*pred)(uint32_t))
{
    Cps c = decode(r, s);
    if (!c.n) return false;
    for (size_t k = 0; k < c.n; k++)
        if (!pred(c.cp[k])) return false;
    return true;
}
static bool cp_alnum(uint32_t c) { return cp_alpha(c) || cp_numeric(c); }

static Jv partition(JRender *r, const JStr *s, Jv sepv, bool rev)
{
    const JStr *sep = want_str(r, sepv, "partition separator");
    if (!sep->n) jr_fail(r, "empty separator");
    size_t at = SIZE_MAX;
    if (!rev) {
        const char *hit = memmem(s->s, s->n, sep->s, sep->n);
        if (hit) at = (size_t)(hit - s->s);
    } else if (sep->n <= s->n) {
        for (size_t p = s->n - sep->n + 1; p-- > 0;)
            if (!memcmp(s->s + p, sep->s, sep->n)) { at = p; break; }
    }
    Jv t = jv_list(r->a, 3);
    t.flags = JV_F_TUPLE;
    Jv empty = jv_str(r->a, "", 0);
    if (at == SIZE_MAX) {
        t.u.l->v[0] = rev ? empty : jv_strv(s);
        t.u.l->v[1] = empty;
        t.u.l->v[2] = rev ? jv_strv(s) : empty;
    } else {
        t.u.l->v[0] = jv_str(r->a, s->s, at);
        t.u.l->v[1] = jv_strv(sep);
        t.u.l->v[2] = jv_str(r->a, s->s + at + sep->n, s->n - at - sep->n);
    }
    return t;
}

static Jv str_method(JRender *r, const JStr *s, int id, const char *mname, const JArgs *args)
{
    switch (id) {
    case M_CAPITALIZE: no_args(r, args, mname); return change_case(r, s, CASE_CAPITALIZE);
    case M_LOWER: no_args(r, args, mname); return change_case(r, s, CASE_LOWER);
    case M_UPPER: no_args(r, args, mname); return change_case(r, s, CASE_UPPER);
    case M_SWAPCASE: no_args(r, args, mname); return change_case(r, s, CASE_SWAP);
    case M_TITLE: no_args(r, args, mname); return change_case(r, s, CASE_TITLE);
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        BIND(mname, "chars");
        return py_strip(r, s, hv[0] ? av[0] : jv_none(), id != M_RSTRIP, id != M_LSTRIP);
    }
    case M_SPLIT: case M_RSPLIT: {
        BIND(mname, "sep", "maxsplit");
        return py_split(r, s, hv[0] ? av[0] : jv_none(), hv[1] ? want_int(r, av[1], "maxsplit") : -1, id == M_RSPLIT);
    }
    case M_SPLITLINES: {
        BIND(mname, "keepends");
        return py_splitlines(r, s, hv[0] && jv_truthy(av[0]));
    }
    case M_REPLACE: {
        BIND(mname, "old", "new", "count");
        if (!hv[0] || !hv[1]) jr_fail(r, "replace expected at least 2 arguments");
        int64_t count = hv[2] ? want_int(r, av[2], "replace count") : -1;
        return py_replace(r, s, want_str(r, av[0], "replace"), want_str(r, av[1], "replace"), count);
    }
    case M_FIND: return py_find(r, s, args, mname, false, false, false);
    case M_RFIND: return py_find(r, s, args, mname, true, false, false);
    case M_INDEX: return py_find(r, s, args, mname, false, true, false);
    case M_RINDEX: return py_find(r, s, args, mname, true, true, false);
    case M_COUNT: return py_find(r, s, args, mname, false, false, true);
    case M_STARTSWITH: case M_ENDSWITH:
        if (args->nkw || args->npos < 1 || args->npos > 3) jr_fail(r, "%s() takes 1 to 3 positional arguments", mname);
        return jv_bool(affix(r, s, args->pos[0], args, id == M_ENDSWITH, mname));
    case M_FORMAT: return py_format(r, s, args);
    case M_JOIN: {
        BIND(mname, "iterable");
        if (!hv[0]) jr_fail(r, "join() takes exactly one argument");
        const JList *l = jr_iter(r, av[0]);
        JBuf b;
        jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
        for (size_t k = 0; k < l->n; k++) {
            if (l->v[k].t != JV_STR) jr_fail(r, "sequence item %zu: expected str instance, %s found", k, jv_pytype(l->v[k]));
            if (k) jbuf_put(&b, s->s, s->n);
            jbuf_put(&b, l->v[k].u.s->s, l->v[k].u.s->n);
        }
        jr_work(r, b.n / 64 + l->n / 8);
        return jbuf_value(&b);
    }
    case M_ISALNUM: no_args(r, args, mname); return jv_bool(str_all(r, s, cp_alnum));
    case M_ISALPHA: no_args(r, args, mname); return jv_bool(str_all(r, s, cp_alpha));
    case M_ISDIGIT: no_args(r, args, mname); return jv_bool(str_all(r, s, cp_digit));
    case M_ISSPACE: no_args(r, args, mname); return jv_bool(str_all(r, s, jpy_isspace));
    case M_ISLOWER: no_args(r, args, mname); return jv_bool(all_cased(r, jv_strv(s), false));
    case M_ISUPPER: no_args(r, args, mname); return jv_bool(all_cased(r, jv_strv(s), true));
    case M_CENTER: case M_LJUST: case M_RJUST: {
        BIND(mname, "width", "fillchar");
        if (!hv[0]) jr_fail(r, "%s() takes at least 1 argument", mname);
        return pad(r, s, want_int(r, av[0], mname), hv[1] ? av[1] : jv_undef0(), id == M_CENTER ? 0 : id == M_LJUST ? -1 : 1);
    }
    case M_ZFILL: {
        BIND(mname, "width");
        if (!hv[0]) jr_fail(r, "zfill() takes exactly one argument");
        int64_t w = want_int(r, av[0], mname), len = (int64_t)jutf8_len(s->s, s->n);
        if (w <= len) return jv_strv(s);
        if (w > 10000000) jr_fail(r, "zfill width too large");
        JBuf b;
        jbuf_init(&b, r->a, 0);
        size_t sign = s->n && (s->s[0] == '+' || s->s[0] == '-') ? 1 : 0;
        jbuf_put(&b, s->s, sign);
        for (int64_t k = 0; k < w - len; k++) jbuf_putc(&b, '0');
        jbuf_put(&b, s->s + sign, s->n - sign);
        return jbuf_value(&b);
    }
    case M_PARTITION: case M_RPARTITION: {
        BIND(mname, "sep");
        if (!hv[0]) jr_fail(r, "%s() takes exactly one argument", mname);
        return partition(r, s, av[0], id == M_RPARTITION);
    }
    case M_REMOVEPREFIX: case M_REMOVESUFFIX: {
        BIND(mname, "affix");
        if (!hv[0]) jr_fail(r, "%s() takes exactly one argument", mname);
        const JStr *p = want_str(r, av[0], mname);
        if (p->n > s->n) return jv_strv(s);
        if (id == M_REMOVEPREFIX && !memcmp(s->s, p->s, p->n)) return jv_str(r->a, s->s + p->n, s->n - p->n);
        if (id == M_REMOVESUFFIX && p->n && !memcmp(s->s + s->n - p->n, p->s, p->n)) return jv_str(r->a, s->s, s->n - p->n);
        return jv_strv(s);
    }
    default:
        jr_fail(r, "unsupported method str.%s()", mname);
    }
}

Jv jbi_call_method(JRender *r, Jv self, int id, const JArgs *args)
{
    jr_work(r, 1);
    const char *mname = METHODS[id].name;
    int m = METHODS[id].id;
    if (m == M_UNIMPLEMENTED) jr_fail(r, "unsupported method .%s() of a %s", mname, jv_pytype(self));
    if (self.t == JV_STR) return str_method(r, self.u.s, m, mname, args);
    if (self.t == JV_DICT) {
        switch (m) {
        case M_GET: {
            BIND("get", "key", "default");
            if (!hv[0] || args->nkw) jr_fail(r, "get() takes 1 or 2 positional arguments");
            if (!jv_hashable(av[0])) jr_fail(r, "unhashable type: '%s'", jv_pytype(av[0]));
            JEntry *e = jdict_get(self.u.d, av[0]);
            return e ? e->v : hv[1] ? av[1] : jv_none();
        }
        case M_KEYS: case M_VALUES: case M_ITEMS: {
            no_args(r, args, mname);
            Jv out = jv_list(r->a, self.u.d->n);
            for (size_t k = 0; k < self.u.d->n; k++) {
                const JEntry *e = &self.u.d->e[k];
                out.u.l->v[k] = m == M_KEYS ? e->k : m == M_VALUES ? e->v : tuple2(r, e->k, e->v);
            }
            out.flags = m == M_KEYS ? JV_F_KEYS : m == M_VALUES ? JV_F_VALUES : JV_F_ITEMS;
            return out;
        }
        case M_COPY: {
            no_args(r, args, mname);
            Jv out = jv_dict(r->a);
            for (size_t k = 0; k < self.u.d->n; k++) jdict_set(r->a, out.u.d, self.u.d->e[k].k, self.u.d->e[k].v);
            return out;
        }
        default: break;
        }
    }
    if (self.t == JV_LIST) {
        const JList *l = self.u.l;
        if (m == M_COPY) {
            no_args(r, args, mname);
            Jv out = jv_list(r->a, l->n);
            memcpy(out.u.l->v, l->v, l->n * sizeof(Jv));
            return out;
        }
        if (m == M_LCOUNT || m == M_LINDEX) {
            if (args->nkw || args->npos < 1) jr_fail(r, "%s() takes at least 1 argument", mname);
            int64_t k = 0;
            for (size_t i = 0; i < l->n; i++) {
                if (!jv_eq(l->v[i], args->pos[0])) continue;
                if (m == M_LINDEX) return jv_int((int64_t)i);
                k++;
            }
            if (m == M_LINDEX) jr_fail(r, "%s.index(x): x not in %s", jv_pytype(self), jv_pytype(self));
            return jv_int(k);
        }
    }
    if (self.t == JV_LOOP) {
        JLoop *L = (JLoop *)self.u.p;
        if (m == M_CYCLE) {
            if (args->nkw) jr_fail(r, "cycle() takes no keyword arguments");
            if (!args->npos) jr_fail(r, "no items for cycling given");
            return args->pos[L->index0 % (int64_t)args->npos];
        }
        if (m == M_CHANGED) {
            Jv t = jv_list(r->a, args->npos);
            t.flags = JV_F_TUPLE;
            memcpy(t.u.l->v, args->pos, args->npos * sizeof(Jv));
            if (L->changed_last[1].t == JV_BOOL && jv_eq(L->changed_last[0], t)) return jv_bool(false);
            L->changed_last[0] = t;
            L->changed_last[1] = jv_bool(true);
            return jv_bool(true);
        }
    }
    jr_fail(r, "unsupported method .%s() of a %s", mname, jv_pytype(self));
}

/* ---------------------------------------------------------------- globals */

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };
static const char *const FUNCS[] = { "range", "namespace", "dict", "raise_exception", "strftime_now" };

int jbi_func_id(const char *s, size_t n)
{
    for (size_t k = 0; k < sizeof FUNCS / sizeof *FUNCS; k++)
        if (strlen(FUNCS[k]) == n && !memcmp(FUNCS[k], s, n)) return (int)k;
    return -1;
}

/* The sandbox's MAX_RANGE. */
#define JRANGE_MAX 100000

static Jv g_range(JRender *r, const JArgs *args)
{
    if (args->nkw) jr_fail(r, "range() takes no keyword arguments");
    if (args->npos < 1 || args->npos > 3) jr_fail(r, "range expected 1 to 3 arguments, got %zu", args->npos);
    int64_t start = 0, stop, step = 1;
    if (args->npos == 1) {
        stop = want_int(r, args->pos[0], "range");
    } else {
        start = want_int(r, args->pos[0], "range");
        stop = want_int(r, args->pos[1], "range");
        if (args->npos == 3) step = want_int(r, args->pos[2], "range");
    }
    if (step == 0) jr_fail(r, "range() arg 3 must not be zero");
    int64_t n = 0;
    if (step > 0 && start < stop) n = (int64_t)(((__int128)stop - start - 1) / step + 1);
    if (step < 0 && start > stop) n = (int64_t)(((__int128)start - stop - 1) / (-(__int128)step) + 1);
    if (n > JRANGE_MAX) jr_fail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JRANGE_MAX);
    jr_work(r, (uint64_t)n / 8);
    Jv out = jv_list(r->a, (size_t)n);
    for (int64_t k = 0; k < n; k++) out.u.l->v[k] = jv_int(start + k * step);
    return out;
}

static void dict_update(JRender *r, JDict *d, const JArgs *args, const char *fname)
{
    if (args->npos > 1) jr_fail(r, "%s expected at most 1 argument, got %zu", fname, args->npos);
    if (args->npos == 1) {
        Jv src = args->pos[0];
        if (src.t == JV_DICT || src.t == JV_NS) {
            for (size_t k = 0; k < src.u.d->n; k++) jdict_set(r->a, d, src.u.d->e[k].k, src.u.d->e[k].v);
        } else {
            const JList *l = jr_iter(r, src);
            for (size_t k = 0; k < l->n; k++) {
                const JList *pair = jr_iter(r, l->v[k]);
                if (pair->n != 2) jr_fail(r, "dictionary update sequence element #%zu has length %zu; 2 is required", k, pair->n);
                if (!jv_hashable(pair->v[0])) jr_fail(r, "unhashable type: '%s'", jv_pytype(pair->v[0]));
                jdict_set(r->a, d, pair->v[0], pair->v[1]);
            }
        }
    }
    for (size_t k = 0; k < args->nkw; k++) jdict_set(r->a, d, jv_cstr(r->a, jr_kwname(r, args, k)), args->kw[k]);
}

static Jv g_strftime(JRender *r, const JArgs *args)
{
    BIND("strftime_now", "format");
    if (!hv[0]) jr_fail(r, "strftime_now() missing 1 required positional argument: 'format'");
    const JStr *fmt = want_str(r, av[0], "strftime_now format");
    time_t t;
    long usec = 0;
    if (r->now >= 0) {
        t = (time_t)r->now;
    } else {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        t = tv.tv_sec;
        usec = (long)tv.tv_usec;
    }
    struct tm tm;
    localtime_r(&t, &tm);
    /* datetime.strftime handles %f, %z and %Z itself (naive: empty) */
    JBuf f;
    jbuf_init(&f, r->a, 0);
    for (size_t i = 0; i < fmt->n; i++) {
        if (fmt->s[i] == '%' && i + 1 < fmt->n) {
            char c = fmt->s[i + 1];
            if (c == 'f') { jbuf_printf(&f, "%06ld", usec); i++; continue; }
            if (c == 'z' || c == 'Z') { i++; continue; }
            jbuf_putc(&f, '%');
            jbuf_putc(&f, c);
            i++;
            continue;
        }
        jbuf_putc(&f, fmt->s[i]);
    }
    if (f.n > 4096) jr_fail(r, "strftime_now format too long");
    char out[16384];
    size_t n = f.n ? strftime(out, sizeof out, f.p, &tm) : 0;
    return jv_str(r->a, out, n);
}

Jv jbi_call_func(JRender *r, int id, const JArgs *args)
{
    jr_work(r, 1);
    switch (id) {
    case G_RANGE: return g_range(r, args);
    case G_NAMESPACE: {
        Jv ns = jv_ns(r->a);
        dict_update(r, ns.u.d, args, "namespace");
        return ns;
    }
    case G_DICT: {
        Jv d = jv_dict(r->a);
        dict_update(r, d.u.d, args, "dict");
        return d;
    }
    case G_RAISE: {
        BIND("raise_exception", "message");
        if (!hv[0]) jr_fail(r, "raise_exception() missing 1 required positional argument: 'message'");
        /* transformers raises TemplateError(message): the message alone */
        snprintf(r->err, sizeof r->err, "%s", sstr(r, av[0])->s);
        longjmp(r->jb, 1);
    }
    case G_STRFTIME: return g_strftime(r, args);
    default: jr_fail(r, "internal: unknown global %d", id);
    }
}

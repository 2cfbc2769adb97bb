/* core/chat/jinja/jinja_value.c - arena, values, Python printing, JSON in and out
 * (see jinja_value.h). */
#include "core/chat/jinja/jinja_value.h"
#include "core/common.h"

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Values nest at most this deep when printed or compared; Python raises
 * RecursionError near 1000 frames, which no chat template comes close to. */
#define JV_MAX_NEST 400

/* ---------------------------------------------------------------- arena */

typedef struct JChunk {
    struct JChunk *next;
    size_t cap, used;
    /* data follows, 16-byte aligned (td_malloc is 64-byte aligned and this
     * header is 24 bytes, padded to 32) */
} JChunk;

#define JCHUNK_HDR 32
#define JCHUNK_MIN (64 * 1024)

struct JArena {
    JChunk *head;
    size_t used, budget;
    JArenaFail fail;
    void *fail_ctx;
};

JArena *jarena_new(size_t budget)
{
    JArena *a = td_calloc(sizeof *a);
    a->budget = budget;
    return a;
}

void jarena_free(JArena *a)
{
    if (!a) return;
    for (JChunk *c = a->head, *next; c; c = next) {
        next = c->next;
        td_free(c);
    }
    td_free(a);
}

void jarena_set_fail(JArena *a, JArenaFail fn, void *ctx)
{
    a->fail = fn;
    a->fail_ctx = ctx;
}

void jarena_fail(JArena *a, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    TD_CHECK(a->fail, "jinja arena: %s (no fail hook installed)", msg);
    a->fail(a->fail_ctx, msg);
    abort(); /* the hook does not return */
}

void *jarena_alloc(JArena *a, size_t n)
{
    n = td_round_up(n ? n : 1, 16);
    if (a->budget && (n > a->budget || a->used > a->budget - n))
        jarena_fail(a, "template used more than %zu bytes of memory", a->budget);
    a->used += n;
    JChunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JCHUNK_MIN / 2 ? n : JCHUNK_MIN;
        JChunk *nc = td_malloc(JCHUNK_HDR + cap);
        nc->cap = cap;
        nc->used = 0;
        if (c && cap == n && c->cap - c->used > JCHUNK_MIN / 8) {
            /* a big block: keep filling the current chunk afterwards */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = (char *)c + JCHUNK_HDR + c->used;
    c->used += n;
    return p;
}

void *jarena_zalloc(JArena *a, size_t n)
{
    void *p = jarena_alloc(a, n);
    memset(p, 0, n ? n : 1);
    return p;
}

size_t jarena_used(const JArena *a) { return a->used; }

/* ---------------------------------------------------------------- values */

Jv jv_undef(JArena *a, const char *name, const char *obj_type, const char *attr, const char *msg)
{
    JUndef *u = jarena_alloc(a, sizeof *u);
    u->name = name;
    u->obj_type = obj_type;
    u->attr = attr;
    u->msg = msg;
    Jv v = { .t = JV_UNDEF, .u.u = u };
    return v;
}

const char *jv_undef_message(JArena *a, Jv v)
{
    const JUndef *u = v.u.u;
    if (!u) return "value is undefined";
    if (u->msg) return u->msg;
    JBuf b;
    jbuf_init(&b, a, 0);
    if (u->name) {
        jbuf_printf(&b, "'%s' is undefined", u->name);
    } else {
        jbuf_printf(&b, "'%s' has no attribute ", u->obj_type ? u->obj_type : "object");
        jv_write_str_repr(&b, u->attr ? u->attr : "", u->attr ? strlen(u->attr) : 0);
    }
    jbuf_putc(&b, 0);
    return b.p;
}

JStr *jstr_new(JArena *a, const char *s, size_t n)
{
    JStr *js = jarena_alloc(a, sizeof *js + n + 1);
    js->n = n;
    if (n) memcpy(js->s, s, n);
    js->s[n] = 0;
    return js;
}

Jv jv_str(JArena *a, const char *s, size_t n)
{
    Jv v = { .t = JV_STR, .u.s = jstr_new(a, s, n) };
    return v;
}

Jv jv_cstr(JArena *a, const char *s) { return jv_str(a, s, strlen(s)); }

Jv jv_strv(const JStr *s)
{
    Jv v = { .t = JV_STR, .u.s = s };
    return v;
}

Jv jv_list(JArena *a, size_t n)
{
    JList *l = jarena_alloc(a, sizeof *l);
    l->n = n;
    l->err = NULL;
    l->v = jarena_zalloc(a, (n ? n : 1) * sizeof(Jv)); /* zero = JV_UNDEF */
    Jv v = { .t = JV_LIST, .u.l = l };
    return v;
}

Jv jv_dict(JArena *a)
{
    JDict *d = jarena_zalloc(a, sizeof *d);
    Jv v = { .t = JV_DICT, .u.d = d };
    return v;
}

Jv jv_ns(JArena *a)
{
    Jv v = jv_dict(a);
    v.t = JV_NS;
    return v;
}

JEntry *jdict_get_str(const JDict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++) {
        const Jv *key = &d->e[i].k;
        if (key->t == JV_STR && key->u.s->n == n && memcmp(key->u.s->s, k, n) == 0)
            return &d->e[i];
    }
    return NULL;
}

JEntry *jdict_get(const JDict *d, Jv k)
{
    if (k.t == JV_STR) return jdict_get_str(d, k.u.s->s, k.u.s->n);
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->e[i].k, k)) return &d->e[i];
    return NULL;
}

void jdict_set(JArena *a, JDict *d, Jv k, Jv v)
{
    JEntry *e = jdict_get(d, k);
    if (e) {
        e->v = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        JEntry *ne = jarena_alloc(a, cap * sizeof *ne);
        if (d->n) memcpy(ne, d->e, d->n * sizeof *ne);
        d->e = ne;
        d->cap = cap;
    }
    d->e[d->n].k = k;
    d->e[d->n].v = v;
    d->n++;
}

bool jv_truthy(Jv v)
{
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->n > 0;
    case JV_LIST: return (v.flags & JV_F_GEN) || v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

/* Exact comparison of an int with a double, as Python compares them:
 * returns -1, 0, 1, or 2 when f is NaN. */
static int cmp_int_float(int64_t i, double f)
{
    if (isnan(f)) return 2;
    if (f >= 9223372036854775808.0) return -1;
    if (f < -9223372036854775808.0) return 1;
    double fl = floor(f);
    int64_t fi = (int64_t)fl;
    if (i < fi) return -1;
    if (i > fi) return 1;
    return fl == f ? 0 : -1; /* i == floor(f) < f when f has a fraction */
}


static bool eq_depth(Jv a, Jv b, int depth)
{
    if (depth > JV_MAX_NEST) return false;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_FLOAT && b.t == JV_FLOAT) return a.u.f == b.u.f;
        if (a.t == JV_FLOAT) return cmp_int_float(jv_as_int(b), a.u.f) == 0;
        if (b.t == JV_FLOAT) return cmp_int_float(jv_as_int(a), b.u.f) == 0;
        return jv_as_int(a) == jv_as_int(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR:
        return a.u.s->n == b.u.s->n && memcmp(a.u.s->s, b.u.s->s, a.u.s->n) == 0;
    case JV_LIST:
        if ((a.flags | b.flags) & JV_F_NOSEQ) return a.u.l == b.u.l;
        if ((a.flags & JV_F_TUPLE) != (b.flags & JV_F_TUPLE)) return false;
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_depth(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            JEntry *e = jdict_get(b.u.d, a.u.d->e[i].k);
            if (!e || !eq_depth(a.u.d->e[i].v, e->v, depth + 1)) return false;
        }
        return true;
    case JV_METHOD: case JV_FUNC:
        return a.id == b.id && a.u.p == b.u.p;
    default:
        return a.u.p == b.u.p;
    }
}

bool jv_eq(Jv a, Jv b) { return eq_depth(a, b, 0); }

const char *jv_pytype(Jv v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        return (v.flags & JV_F_GEN) ? "generator" : (v.flags & JV_F_KEYS) ? "dict_keys"
               : (v.flags & JV_F_VALUES) ? "dict_values" : (v.flags & JV_F_ITEMS) ? "dict_items"
               : (v.flags & JV_F_TUPLE) ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    default: return "builtin_function_or_method";
    }
}

const char *jv_type_name(Jv v)
{
    switch (v.t) {
    case JV_NONE: return "None";
    case JV_BOOL: return "bool object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_STR: return "str object";
    case JV_LIST:
        return (v.flags & JV_F_GEN) ? "generator object"
               : (v.flags & JV_F_TUPLE) ? "tuple object" : "list object";
    case JV_DICT: return "dict object";
    case JV_NS: return "jinja2.utils.Namespace object";
    case JV_MACRO: return "jinja2.runtime.Macro object";
    case JV_LOOP: return "jinja2.runtime.LoopContext object";
    case JV_UNDEF: return "jinja2.runtime.Undefined object";
    default: return "builtin_function_or_method object";
    }
}

static int lt_depth(Jv a, Jv b, bool *lt, char *err, size_t errlen, int depth)
{
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_FLOAT && b.t == JV_FLOAT) *lt = a.u.f < b.u.f;
        else if (a.t == JV_FLOAT) *lt = cmp_int_float(jv_as_int(b), a.u.f) == 1;
        else if (b.t == JV_FLOAT) *lt = cmp_int_float(jv_as_int(a), b.u.f) == -1;
        else *lt = jv_as_int(a) < jv_as_int(b);
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->s, b.u.s->s, n); /* UTF-8 byte order = code point order */
        *lt = c < 0 || (c == 0 && a.u.s->n < b.u.s->n);
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && !((a.flags | b.flags) & JV_F_NOSEQ) &&
        (a.flags & JV_F_TUPLE) == (b.flags & JV_F_TUPLE) && depth < JV_MAX_NEST) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (eq_depth(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return lt_depth(a.u.l->v[i], b.u.l->v[i], lt, err, errlen, depth + 1);
        }
        *lt = a.u.l->n < b.u.l->n;
        return 0;
    }
    snprintf(err, errlen, "'<' not supported between instances of '%s' and '%s'", jv_pytype(a), jv_pytype(b));
    return -1;
}

int jv_lt(Jv a, Jv b, bool *lt, char *err, size_t errlen) { return lt_depth(a, b, lt, err, errlen, 0); }

bool jv_hashable(Jv v)
{
    if (v.t == JV_DICT) return false;
    if (v.t == JV_LIST) {
        if (v.flags & JV_F_GEN) return true;
        if (!(v.flags & JV_F_TUPLE)) return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!jv_hashable(v.u.l->v[i])) return false;
    }
    return true;
}

/* ---------------------------------------------------------------- buffers */

void jbuf_init(JBuf *b, JArena *a, size_t limit)
{
    b->a = a;
    b->p = NULL;
    b->n = b->cap = 0;
    b->limit = limit;
}

static void jbuf_grow(JBuf *b, size_t extra)
{
    if (b->limit && (extra > b->limit || b->n > b->limit - extra))
        jarena_fail(b->a, "template output exceeds %zu bytes", b->limit);
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < need) cap *= 2;
    char *p = jarena_alloc(b->a, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

void jbuf_put(JBuf *b, const char *s, size_t n)
{
    if (!n) return;
    jbuf_grow(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_puts(JBuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }

void jbuf_putc(JBuf *b, char c)
{
    jbuf_grow(b, 1);
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

void jbuf_printf(JBuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        jbuf_put(b, tmp, (size_t)k);
        return;
    }
    jbuf_grow(b, (size_t)k);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

Jv jbuf_value(const JBuf *b) { return jv_str(b->a, b->p ? b->p : "", b->n); }

/* ---------------------------------------------------------------- UTF-8 */

size_t jutf8_decode(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if ((u[0] & 0xE0) == 0xC0 && (u[1] & 0xC0) == 0x80) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if ((u[0] & 0xF0) == 0xE0 && n >= 3 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    if ((u[0] & 0xF8) == 0xF0 && n >= 4 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80 &&
        (u[3] & 0xC0) == 0x80) {
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
              ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
        return 4;
    }
    *cp = u[0];
    return 1;
}

void jbuf_put_cp(JBuf *b, uint32_t cp)
{
    char t[4];
    size_t k;
    if (cp < 0x80) { t[0] = (char)cp; k = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); k = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F)); k = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F)); k = 4;
    }
    jbuf_put(b, t, k);
}

size_t jutf8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t jutf8_offset(const char *s, size_t n, size_t i)
{
    size_t off = 0;
    while (i > 0 && off < n) {
        off++;
        while (off < n && ((unsigned char)s[off] & 0xC0) == 0x80) off++;
        i--;
    }
    return off;
}

bool jpy_isspace(uint32_t cp)
{
    /* Python's str.isspace: bidirectional class WS, B or S, or category Zs */
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
    case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool jpy_isalpha(uint32_t cp)
{
    int k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

bool jpy_isdigit(uint32_t cp) { return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND; }

bool jpy_isnumeric(uint32_t cp)
{
    int k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

/* ---------------------------------------------------------------- printing */

void jv_write_float(JBuf *b, double f)
{
    if (isnan(f)) { jbuf_puts(b, "nan"); return; }
    if (isinf(f)) { jbuf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    /* shortest %e that reads back as f: Python's repr digits */
    char t[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*e", prec - 1, f);
        if (strtod(t, NULL) == f) break;
    }
    const char *p = t;
    bool neg = *p == '-';
    if (neg) p++;
    char dig[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') dig[nd++] = *p;
    int decpt = atoi(p + 1) + 1; /* value = 0.DIGITS x 10^decpt */
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) jbuf_putc(b, '-');
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            jbuf_puts(b, "0.");
            for (int i = 0; i < -decpt; i++) jbuf_putc(b, '0');
            jbuf_put(b, dig, (size_t)nd);
        } else if (decpt >= nd) {
            jbuf_put(b, dig, (size_t)nd);
            for (int i = nd; i < decpt; i++) jbuf_putc(b, '0');
            jbuf_puts(b, ".0");
        } else {
            jbuf_put(b, dig, (size_t)decpt);
            jbuf_putc(b, '.');
            jbuf_put(b, dig + decpt, (size_t)(nd - decpt));
        }
    } else {
        jbuf_putc(b, dig[0]);
        if (nd > 1) {
            jbuf_putc(b, '.');
            jbuf_put(b, dig + 1, (size_t)(nd - 1));
        }
        int e = decpt - 1;
        jbuf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* Python's str.isprintable for one code point. */
static bool py_printable(uint32_t cp)
{
    if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

void jv_write_str_repr(JBuf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    jbuf_putc(b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = jutf8_decode(s + i, n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)cp);
        } else if (cp == '\t') jbuf_puts(b, "\\t");
        else if (cp == '\n') jbuf_puts(b, "\\n");
        else if (cp == '\r') jbuf_puts(b, "\\r");
        else if (!py_printable(cp)) {
            if (cp < 0x100) jbuf_printf(b, "\\x%02x", cp);
            else if (cp < 0x10000) jbuf_printf(b, "\\u%04x", cp);
            else jbuf_printf(b, "\\U%08x", cp);
        } else jbuf_put(b, s + i, k);
        i += k;
    }
    jbuf_putc(b, q);
}

static void write_repr_depth(JBuf *b, Jv v, int depth);

static void write_items(JBuf *b, const JList *l, int depth)
{
    for (size_t i = 0; i < l->n; i++) {
        if (i) jbuf_puts(b, ", ");
        write_repr_depth(b, l->v[i], depth + 1);
    }
}

static void write_dict(JBuf *b, const JDict *d, int depth)
{
    jbuf_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jbuf_puts(b, ", ");
        write_repr_depth(b, d->e[i].k, depth + 1);
        jbuf_puts(b, ": ");
        write_repr_depth(b, d->e[i].v, depth + 1);
    }
    jbuf_putc(b, '}');
}

static void write_repr_depth(JBuf *b, Jv v, int depth)
{
    if (depth > JV_MAX_NEST) jarena_fail(b->a, "value nested too deeply to print");
    switch (v.t) {
    case JV_UNDEF: jbuf_puts(b, "Undefined"); break;
    case JV_NONE: jbuf_puts(b, "None"); break;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "True" : "False"); break;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v.u.i); break;
    case JV_FLOAT: jv_write_float(b, v.u.f); break;
    case JV_STR: jv_write_str_repr(b, v.u.s->s, v.u.s->n); break;
    case JV_LIST:
        if (v.flags & JV_F_GEN) {
            jbuf_puts(b, "<generator object>");
        } else if (v.flags & JV_F_VIEW) {
            jbuf_puts(b, (v.flags & JV_F_KEYS) ? "dict_keys([" : (v.flags & JV_F_VALUES) ? "dict_values([" : "dict_items([");
            write_items(b, v.u.l, depth);
            jbuf_puts(b, "])");
        } else if (v.flags & JV_F_TUPLE) {
            jbuf_putc(b, '(');
            write_items(b, v.u.l, depth);
            if (v.u.l->n == 1) jbuf_putc(b, ',');
            jbuf_putc(b, ')');
        } else {
            jbuf_putc(b, '[');
            write_items(b, v.u.l, depth);
            jbuf_putc(b, ']');
        }
        break;
    case JV_DICT: write_dict(b, v.u.d, depth); break;
    case JV_NS:
        jbuf_puts(b, "<Namespace ");
        write_dict(b, v.u.d, depth);
        jbuf_putc(b, '>');
        break;
    case JV_MACRO: {
        const JMacroHead *m = v.u.p;
        jbuf_puts(b, "<Macro ");
        jv_write_str_repr(b, m->name, strlen(m->name));
        jbuf_putc(b, '>');
        break;
    }
    case JV_LOOP: {
        const JLoopHead *l = v.u.p;
        jbuf_printf(b, "<LoopContext %lld/%lld>", (long long)l->index0 + 1, (long long)l->length);
        break;
    }
    case JV_METHOD: jbuf_puts(b, "<built-in method>"); break;
    default: jbuf_puts(b, "<built-in function>"); break;
    }
}

void jv_write_repr(JBuf *b, Jv v) { write_repr_depth(b, v, 0); }

void jv_write_str(JBuf *b, Jv v)
{
    if (v.t == JV_STR) jbuf_put(b, v.u.s->s, v.u.s->n);
    else if (v.t == JV_UNDEF) return;
    else jv_write_repr(b, v);
}

const JStr *jv_to_jstr(JArena *a, Jv v)
{
    if (v.t == JV_STR) return v.u.s;
    JBuf b;
    jbuf_init(&b, a, 0);
    jv_write_str(&b, v);
    return jstr_new(a, b.p ? b.p : "", b.n);
}

/* ---------------------------------------------------------------- JSON out */

static void json_str(JBuf *b, const char *s, size_t n, bool ensure_ascii)
{
    jbuf_putc(b, '"');
    size_t run = 0; /* start of the pending run of bytes copied verbatim */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        size_t k = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
        else if (c >= 0x80 && ensure_ascii) {
            uint32_t cp;
            k = jutf8_decode(s + i, n - i, &cp);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            esc = tmp;
        }
        if (esc) {
            jbuf_put(b, s + run, i - run);
            jbuf_puts(b, esc);
            run = i + k;
        }
        i += k;
    }
    jbuf_put(b, s + run, n - run);
    jbuf_putc(b, '"');
}

typedef struct JsonOut {
    JBuf *b;
    bool ensure_ascii, sort_keys;
    const char *indent, *item_sep, *key_sep;
    char *err;
    size_t errlen;
} JsonOut;

static void json_newline(JsonOut *o, int level)
{
    jbuf_putc(o->b, '\n');
    for (int i = 0; i < level; i++) jbuf_puts(o->b, o->indent);
}

static int json_key(JsonOut *o, Jv k)
{
    JBuf *b = o->b;
    switch (k.t) {
    case JV_STR: json_str(b, k.u.s->s, k.u.s->n, o->ensure_ascii); return 0;
    case JV_BOOL: jbuf_puts(b, k.u.b ? "\"true\"" : "\"false\""); return 0;
    case JV_NONE: jbuf_puts(b, "\"null\""); return 0;
    case JV_INT: jbuf_printf(b, "\"%lld\"", (long long)k.u.i); return 0;
    case JV_FLOAT:
        jbuf_putc(b, '"');
        if (isnan(k.u.f)) jbuf_puts(b, "NaN");
        else if (isinf(k.u.f)) jbuf_puts(b, k.u.f < 0 ? "-Infinity" : "Infinity");
        else jv_write_float(b, k.u.f);
        jbuf_putc(b, '"');
        return 0;
    default:
        snprintf(o->err, o->errlen, "keys must be str, int, float, bool or None, not %s", jv_pytype(k));
        return -1;
    }
}

static int cmp_entry_key(const void *pa, const void *pb)
{
    const JEntry *a = *(const JEntry *const *)pa, *b = *(const JEntry *const *)pb;
    size_t n = a->k.u.s->n < b->k.u.s->n ? a->k.u.s->n : b->k.u.s->n;
    int c = memcmp(a->k.u.s->s, b->k.u.s->s, n);
    if (c) return c;
    return a->k.u.s->n < b->k.u.s->n ? -1 : a->k.u.s->n > b->k.u.s->n;
}

static int json_val(JsonOut *o, Jv v, int level)
{
    JBuf *b = o->b;
    if (level > JV_MAX_NEST) {
        snprintf(o->err, o->errlen, "value nested too deeply for tojson");
        return -1;
    }
    switch (v.t) {
    case JV_NONE: jbuf_puts(b, "null"); return 0;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "true" : "false"); return 0;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v.u.i); return 0;
    case JV_FLOAT:
        if (isnan(v.u.f)) jbuf_puts(b, "NaN");
        else if (isinf(v.u.f)) jbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else jv_write_float(b, v.u.f);
        return 0;
    case JV_STR: json_str(b, v.u.s->s, v.u.s->n, o->ensure_ascii); return 0;
    case JV_LIST: {
        if (v.flags & JV_F_NOSEQ) break;
        const JList *l = v.u.l;
        if (!l->n) { jbuf_puts(b, "[]"); return 0; }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(b, o->item_sep);
            if (o->indent) json_newline(o, level + 1);
            if (json_val(o, l->v[i], level + 1)) return -1;
        }
        if (o->indent) json_newline(o, level);
        jbuf_putc(b, ']');
        return 0;
    }
    case JV_DICT: {
        const JDict *d = v.u.d;
        if (!d->n) { jbuf_puts(b, "{}"); return 0; }
        const JEntry **order = jarena_alloc(b->a, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = &d->e[i];
        if (o->sort_keys) {
            for (size_t i = 0; i < d->n; i++) {
                if (d->e[i].k.t != JV_STR) {
                    snprintf(o->err, o->errlen, "'<' not supported between instances of '%s' and 'str'",
                             jv_pytype(d->e[i].k));
                    return -1;
                }
            }
            qsort(order, d->n, sizeof *order, cmp_entry_key);
        }
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jbuf_puts(b, o->item_sep);
            if (o->indent) json_newline(o, level + 1);
            if (json_key(o, order[i]->k)) return -1;
            jbuf_puts(b, o->key_sep);
            if (json_val(o, order[i]->v, level + 1)) return -1;
        }
        if (o->indent) json_newline(o, level);
        jbuf_putc(b, '}');
        return 0;
    }
    default:
        break;
    }
    snprintf(o->err, o->errlen, "Object of type %s is not JSON serializable", jv_pytype(v));
    return -1;
}

int jv_write_json(JBuf *b, Jv v, bool ensure_ascii, const char *indent, const char *item_sep,
                  const char *key_sep, bool sort_keys, char *err, size_t errlen)
{
    JsonOut o = { b, ensure_ascii, sort_keys, indent, item_sep, key_sep, err, errlen };
    if (!o.item_sep) o.item_sep = indent ? "," : ", ";
    if (!o.key_sep) o.key_sep = ": ";
    return json_val(&o, v, 0);
}

/* ---------------------------------------------------------------- JSON in */

typedef struct JsonIn {
    JArena *a;
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
} JsonIn;

#define JSON_MAX_DEPTH 512

static int jin_fail(JsonIn *p, const char *what)
{
    size_t line = 1, col = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) {
        if (p->s[k] == '\n') { line++; col = 1; }
        else col++;
    }
    snprintf(p->err, p->errlen, "JSON line %zu column %zu: %s", line, col, what);
    return -1;
}

static void jin_ws(JsonIn *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int hex4(const char *s, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Valid UTF-8 sequence length at s (strict: no overlongs, no surrogates),
 * or 0. */
static size_t utf8_valid(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) return 1;
    uint32_t cp;
    size_t k = jutf8_decode((const char *)s, n, &cp);
    if (k == 1) return 0;
    if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return k;
}

static int jin_string(JsonIn *p, Jv *out)
{
    JBuf b;
    jbuf_init(&b, p->a, 0);
    p->i++; /* opening quote */
    for (;;) {
        if (p->i >= p->n) return jin_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') { p->i++; break; }
        if (c < 0x20) return jin_fail(p, "invalid control character in string");
        if (c == '\\') {
            if (p->i + 1 >= p->n) return jin_fail(p, "unterminated string");
            char e = p->s[p->i + 1];
            p->i += 2;
            switch (e) {
            case '"': jbuf_putc(&b, '"'); break;
            case '\\': jbuf_putc(&b, '\\'); break;
            case '/': jbuf_putc(&b, '/'); break;
            case 'b': jbuf_putc(&b, '\b'); break;
            case 'f': jbuf_putc(&b, '\f'); break;
            case 'n': jbuf_putc(&b, '\n'); break;
            case 'r': jbuf_putc(&b, '\r'); break;
            case 't': jbuf_putc(&b, '\t'); break;
            case 'u': {
                uint32_t cp;
                if (p->i + 4 > p->n || hex4(p->s + p->i, &cp)) return jin_fail(p, "invalid \\u escape");
                p->i += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
                        hex4(p->s + p->i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return jin_fail(p, "lone surrogate in \\u escape (not representable in UTF-8)");
                    p->i += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return jin_fail(p, "lone surrogate in \\u escape (not representable in UTF-8)");
                }
                jbuf_put_cp(&b, cp);
                break;
            }
            default:
                p->i--;
                return jin_fail(p, "invalid escape in string");
            }
            continue;
        }
        size_t k = utf8_valid((const unsigned char *)p->s + p->i, p->n - p->i);
        if (!k) return jin_fail(p, "invalid UTF-8 in string");
        jbuf_put(&b, p->s + p->i, k);
        p->i += k;
    }
    *out = jbuf_value(&b);
    return 0;
}

static int jin_number(JsonIn *p, Jv *out)
{
    size_t st = p->i;
    bool is_float = false;
    if (p->s[p->i] == '-') p->i++;
    if (p->i + 8 <= p->n && memcmp(p->s + p->i, "Infinity", 8) == 0) {
        p->i += 8;
        *out = jv_float(p->s[st] == '-' ? -INFINITY : INFINITY);
        return 0;
    }
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jin_fail(p, "invalid number");
    if (p->s[p->i] == '0') p->i++;
    else while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jin_fail(p, "invalid number");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
        is_float = true;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jin_fail(p, "invalid number");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
        is_float = true;
    }
    char tmp[64];
    size_t len = p->i - st;
    char *num = len < sizeof tmp ? tmp : jarena_alloc(p->a, len + 1);
    memcpy(num, p->s + st, len);
    num[len] = 0;
    if (!is_float) {
        char *end;
        errno = 0;
        long long v = strtoll(num, &end, 10);
        if (errno) {
            p->i = st;
            return jin_fail(p, "integer beyond 64 bits (not supported)");
        }
        *out = jv_int(v);
        return 0;
    }
    *out = jv_float(strtod(num, NULL));
    return 0;
}

static int jin_value(JsonIn *p, Jv *out, int depth)
{
    if (depth > JSON_MAX_DEPTH) return jin_fail(p, "nested too deeply");
    jin_ws(p);
    if (p->i >= p->n) return jin_fail(p, "expected a value");
    char c = p->s[p->i];
    if (c == '"') return jin_string(p, out);
    if (c == '-' || (c >= '0' && c <= '9')) return jin_number(p, out);
    static const struct { const char *w; int t; } words[] = {
        { "null", 0 }, { "true", 1 }, { "false", 2 }, { "NaN", 3 }, { "Infinity", 4 },
    };
    for (size_t k = 0; k < sizeof words / sizeof *words; k++) {
        size_t wl = strlen(words[k].w);
        if (p->n - p->i >= wl && memcmp(p->s + p->i, words[k].w, wl) == 0) {
            p->i += wl;
            switch (words[k].t) {
            case 0: *out = jv_none(); break;
            case 1: *out = jv_bool(true); break;
            case 2: *out = jv_bool(false); break;
            case 3: *out = jv_float(NAN); break;
            default: *out = jv_float(INFINITY); break;
            }
            return 0;
        }
    }
    if (c == '[') {
        p->i++;
        Jv items[16];
        size_t n = 0, cap = 16;
        Jv *v = items;
        jin_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
        } else {
            for (;;) {
                if (n == cap) {
                    Jv *nv = jarena_alloc(p->a, cap * 2 * sizeof *nv);
                    memcpy(nv, v, n * sizeof *nv);
                    v = nv;
                    cap *= 2;
                }
                if (jin_value(p, &v[n], depth + 1)) return -1;
                n++;
                jin_ws(p);
                if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
                if (p->i < p->n && p->s[p->i] == ']') { p->i++; break; }
                return jin_fail(p, "expected ',' or ']'");
            }
        }
        *out = jv_list(p->a, n);
        if (n) memcpy(out->u.l->v, v, n * sizeof *v);
        return 0;
    }
    if (c == '{') {
        p->i++;
        *out = jv_dict(p->a);
        jin_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return 0;
        }
        for (;;) {
            jin_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') return jin_fail(p, "expected a string key");
            Jv k, val;
            if (jin_string(p, &k)) return -1;
            jin_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return jin_fail(p, "expected ':'");
            p->i++;
            if (jin_value(p, &val, depth + 1)) return -1;
            jdict_set(p->a, out->u.d, k, val);
            jin_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == '}') { p->i++; break; }
            return jin_fail(p, "expected ',' or '}'");
        }
        return 0;
    }
    return jin_fail(p, "expected a value");
}

int jv_parse_json(JArena *a, const char *text, size_t n, Jv *out, char *err, size_t errlen)
{
    JsonIn p = { a, text, n, 0, err, errlen };
    if (jin_value(&p, out, 0)) return -1;
    jin_ws(&p);
    if (p.i != n) return jin_fail(&p, "extra data after the value");
    return 0;
}

Jv jv_from_cjson(JArena *a, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) return jv_cstr(a, j->valuestring ? j->valuestring : "");
    if (cJSON_IsRaw(j)) {
        Jv v;
        char err[8];
        const char *s = j->valuestring ? j->valuestring : "null";
        if (jv_parse_json(a, s, strlen(s), &v, err, sizeof err)) return jv_none();
        return v;
    }
    if (cJSON_IsArray(j)) {
        Jv v = jv_list(a, (size_t)cJSON_GetArraySize(j));
        size_t i = 0;
        for (const cJSON *c = j->child; c; c = c->next) v.u.l->v[i++] = jv_from_cjson(a, c);
        return v;
    }
    Jv v = jv_dict(a);
    for (const cJSON *c = j->child; c; c = c->next)
        jdict_set(a, v.u.d, jv_cstr(a, c->string ? c->string : ""), jv_from_cjson(a, c));
    return v;
}

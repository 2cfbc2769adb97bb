/* core/chat/jinja/jinja_eval.c - executes a parsed template (see jinja_eval.h).
 *
 * Statements write into r->out; expressions return values.  Python's
 * operator semantics are followed where a template can see them: int/float
 * promotion, bool as int, floor division and modulo with the sign of the
 * divisor, str * int, list + list, chained comparisons, and/or returning an
 * operand. */
#include "core/chat/jinja/jinja_eval.h"
#include "core/chat/jinja/jinja_builtins.h"
#include "core/chat/jinja/jinja_lex.h"
#include "core/common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct JScope {
    JScope *parent;
    bool captured;       /* a macro or caller holds it: never reused */
    size_t n, cap;
    int *syms;
    Jv *vals;
};

static Jv jr_eval_expr(JRender *r, JScope *s, const JExpr *e);

/* ---------------------------------------------------------------- errors */

void jr_fail(JRender *r, const char *fmt, ...)
{
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->line > 0) snprintf(r->err, sizeof r->err, "line %d: %s", r->line, msg);
    else snprintf(r->err, sizeof r->err, "%s", msg);
    longjmp(r->jb, 1);
}

void jr_raise(JRender *r, const char *msg)
{
    if (msg != r->err) snprintf(r->err, sizeof r->err, "%s", msg);
    longjmp(r->jb, 1);
}

void jr_fail_undef(JRender *r, Jv v) { jr_fail(r, "%s", jv_undef_message(r->a, v)); }

void jr_work(JRender *r, uint64_t units)
{
    r->steps += units;
    if (r->max_steps && r->steps > r->max_steps) {
        r->hard = true;
        jr_fail(r, "template exceeded its work limit (%llu steps: loop iterations, calls, bytes scanned)",
                (unsigned long long)r->max_steps);
    }
}

static void enter(JRender *r)
{
    if (++r->depth > r->max_depth) r->hard = true;
    if (r->depth > r->max_depth) jr_fail(r, "template evaluation nested too deeply (more than %d levels)", r->max_depth);
}

/* ---------------------------------------------------------------- scopes */

JScope *jscope_new(JRender *r, JScope *parent)
{
    JScope *s = jarena_zalloc(r->a, sizeof *s);
    s->parent = parent;
    return s;
}

void jscope_set(JRender *r, JScope *s, int sym, Jv v)
{
    for (size_t k = 0; k < s->n; k++) {
        if (s->syms[k] == sym) {
            s->vals[k] = v;
            return;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        int *ns = jarena_alloc(r->a, cap * sizeof *ns);
        Jv *nv = jarena_alloc(r->a, cap * sizeof *nv);
        if (s->n) {
            memcpy(ns, s->syms, s->n * sizeof *ns);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->syms = ns;
        s->vals = nv;
        s->cap = cap;
    }
    s->syms[s->n] = sym;
    s->vals[s->n] = v;
    s->n++;
}

/* A closure keeps s and its parents alive past their loop iteration. */
static void capture_scope(JScope *s)
{
    for (; s && !s->captured; s = s->parent) s->captured = true;
}

/* A loop iteration's scope: the previous one emptied, unless something
 * captured it (per-iteration allocation would make memory grow with the
 * iteration count). */
static JScope *iteration_scope(JRender *r, JScope *prev, JScope *parent)
{
    if (prev && !prev->captured) {
        prev->n = 0;
        return prev;
    }
    return jscope_new(r, parent);
}

static bool scope_get(const JScope *s, int sym, Jv *out)
{
    for (; s; s = s->parent) {
        for (size_t k = s->n; k-- > 0;) {
            if (s->syms[k] == sym) {
                *out = s->vals[k];
                return true;
            }
        }
    }
    return false;
}

const char *jr_kwname(const JRender *r, const JArgs *args, size_t k) { return r->prog->syms[args->kwsym[k]]; }

/* ---------------------------------------------------------------- lookups */

static Jv bound(JRender *r, Jv self, int id)
{
    JBound *b = jarena_alloc(r->a, sizeof *b);
    b->self = self;
    Jv v = { .t = JV_METHOD, .id = (uint16_t)id, .u.p = b };
    return v;
}

static Jv loop_attr(JRender *r, const JLoop *l, const char *name, bool *found)
{
    *found = true;
    if (!strcmp(name, "index")) return jv_int(l->index0 + 1);
    if (!strcmp(name, "index0")) return jv_int(l->index0);
    if (!strcmp(name, "revindex")) return jv_int(l->length - l->index0);
    if (!strcmp(name, "revindex0")) return jv_int(l->length - l->index0 - 1);
    if (!strcmp(name, "first")) return jv_bool(l->index0 == 0);
    if (!strcmp(name, "last")) return jv_bool(l->index0 == l->length - 1);
    if (!strcmp(name, "length")) return jv_int(l->length);
    if (!strcmp(name, "depth")) return jv_int(l->depth0 + 1);
    if (!strcmp(name, "depth0")) return jv_int(l->depth0);
    if (!strcmp(name, "previtem")) {
        if (l->index0 > 0) return l->items[l->index0 - 1];
        return jv_undef(r->a, NULL, NULL, NULL, "there is no previous item");
    }
    if (!strcmp(name, "nextitem")) {
        if (l->index0 + 1 < l->length) return l->items[l->index0 + 1];
        return jv_undef(r->a, NULL, NULL, NULL, "there is no next item");
    }
    *found = false;
    return jv_undef0();
}

Jv jr_getattr(JRender *r, Jv obj, const char *name, size_t n)
{
    if (obj.t == JV_UNDEF) jr_fail_undef(r, obj);
    int mid = jbi_method_of(obj, name, n);
    if (mid >= 0) return bound(r, obj, mid);
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        JEntry *e = jdict_get_str(obj.u.d, name, n);
        if (e) return e->v;
    } else if (obj.t == JV_LOOP) {
        bool found;
        Jv v = loop_attr(r, obj.u.p, name, &found);
        if (found) return v;
    }
    return jv_undef(r->a, NULL, jv_type_name(obj), jstr_new(r->a, name, n)->s, NULL);
}

/* Python index of an int-like key into a sequence of n, or -1. */
static int64_t seq_index(Jv key, size_t n)
{
    if (key.t != JV_INT && key.t != JV_BOOL) return -1;
    int64_t i = key.t == JV_BOOL ? key.u.b : key.u.i;
    if (i < 0) i += (int64_t)n;
    return i >= 0 && i < (int64_t)n ? i : -1;
}

Jv jr_getitem(JRender *r, Jv obj, Jv key)
{
    if (obj.t == JV_UNDEF) jr_fail_undef(r, obj);
    switch (obj.t) {
    case JV_LIST:
        if (!(obj.flags & JV_F_NOSEQ)) {
            int64_t i = seq_index(key, obj.u.l->n);
            if (i >= 0) return obj.u.l->v[i];
        }
        break;
    case JV_STR: {
        const JStr *s = obj.u.s;
        size_t len = jutf8_len(s->s, s->n);
        int64_t i = seq_index(key, len);
        if (i >= 0) {
            size_t off = len == s->n ? (size_t)i : jutf8_offset(s->s, s->n, (size_t)i);
            uint32_t cp;
            size_t k = jutf8_decode(s->s + off, s->n - off, &cp);
            return jv_str(r->a, s->s + off, k);
        }
        break;
    }
    case JV_DICT:
        if (jv_hashable(key)) {
            JEntry *e = jdict_get(obj.u.d, key);
            if (e) return e->v;
        }
        break;
    default:
        break;
    }
    if (key.t == JV_STR) {
        /* the sandbox falls back to getattr for string keys */
        int mid = jbi_method_of(obj, key.u.s->s, key.u.s->n);
        if (mid >= 0) return bound(r, obj, mid);
        if (obj.t == JV_NS || obj.t == JV_LOOP) return jr_getattr(r, obj, key.u.s->s, key.u.s->n);
        return jv_undef(r->a, NULL, jv_type_name(obj), key.u.s->s, NULL);
    }
    JBuf b;
    jbuf_init(&b, r->a, 0);
    jbuf_printf(&b, "%s has no element ", jv_type_name(obj));
    jv_write_repr(&b, key);
    jbuf_putc(&b, 0);
    return jv_undef(r->a, NULL, NULL, NULL, b.p);
}

const JList *jr_iter(JRender *r, Jv v)
{
    switch (v.t) {
    case JV_LIST:
        if (v.u.l->err) jr_raise(r, v.u.l->err);
        return v.u.l;
    case JV_UNDEF: return jv_list(r->a, 0).u.l;
    case JV_DICT: {
        Jv l = jv_list(r->a, v.u.d->n);
        for (size_t k = 0; k < v.u.d->n; k++) l.u.l->v[k] = v.u.d->e[k].k;
        return l.u.l;
    }
    case JV_STR: {
        const JStr *s = v.u.s;
        jr_work(r, s->n / 64 + 1);
        Jv l = jv_list(r->a, jutf8_len(s->s, s->n));
        size_t k = 0;
        for (size_t i = 0; i < s->n;) {
            uint32_t cp;
            size_t len = jutf8_decode(s->s + i, s->n - i, &cp);
            l.u.l->v[k++] = jv_str(r->a, s->s + i, len);
            i += len;
        }
        return l.u.l;
    }
    default: {
        const char *t = v.t == JV_NONE ? "NoneType" : v.t == JV_BOOL ? "bool" : v.t == JV_INT ? "int"
                      : v.t == JV_FLOAT ? "float" : v.t == JV_NS ? "Namespace" : v.t == JV_MACRO ? "Macro"
                      : v.t == JV_LOOP ? "LoopContext" : "builtin_function_or_method";
        jr_fail(r, "'%s' object is not iterable", t);
    }
    }
}

/* ---------------------------------------------------------------- calls */

static int exec_body(JRender *r, JScope *s, const JBody *b);

static Jv capture(JRender *r, JScope *s, const JBody *body)
{
    JBuf buf, *saved = r->out;
    jbuf_init(&buf, r->a, saved->limit);
    r->out = &buf;
    exec_body(r, s, body);
    r->out = saved;
    return jbuf_value(&buf);
}

static Jv call_macro(JRender *r, const JMacro *m, const JArgs *args, const JMacro *caller)
{
    const JSig *sig = m->sig;
    if (++r->calls > r->max_calls) jr_fail(r, "macro calls nested too deeply (more than %d)", r->max_calls);
    jr_work(r, 1);
    JScope *s = jscope_new(r, m->closure);
    if (args->npos > sig->nparams && !sig->catch_varargs)
        jr_fail(r, "macro '%s' takes not more than %zu argument(s)", m->name, sig->nparams);
    bool *used = jarena_zalloc(r->a, args->nkw + 1);
    for (size_t i = 0; i < sig->nparams; i++) {
        int sym = sig->params[i];
        Jv v;
        bool have = false;
        if (i < args->npos) {
            v = args->pos[i];
            have = true;
        }
        for (size_t k = 0; k < args->nkw; k++) {
            if (args->kwsym[k] != sym) continue;
            if (have) jr_fail(r, "macro '%s' got multiple values for argument '%s'", m->name, r->prog->syms[sym]);
            v = args->kw[k];
            used[k] = have = true;
        }
        if (!have) {
            if (sig->defaults[i]) {
                /* defaults see the parameters bound before them */
                int saved = r->line;
                v = jr_eval_expr(r, s, sig->defaults[i]);
                r->line = saved;
            } else {
                JBuf b;
                jbuf_init(&b, r->a, 0);
                jbuf_printf(&b, "parameter '%s' was not provided", r->prog->syms[sym]);
                jbuf_putc(&b, 0);
                v = jv_undef(r->a, NULL, NULL, NULL, b.p);
            }
        }
        jscope_set(r, s, sym, v);
    }
    if (sig->catch_varargs) {
        size_t extra = args->npos > sig->nparams ? args->npos - sig->nparams : 0;
        Jv t = jv_list(r->a, extra);
        t.flags = JV_F_TUPLE;
        for (size_t k = 0; k < extra; k++) t.u.l->v[k] = args->pos[sig->nparams + k];
        jscope_set(r, s, r->prog->sym_varargs, t);
    }
    Jv kw = jv_dict(r->a);
    for (size_t k = 0; k < args->nkw; k++) {
        if (used[k]) continue;
        if (!sig->catch_kwargs)
            jr_fail(r, "macro '%s' takes no keyword argument '%s'", m->name, jr_kwname(r, args, k));
        jdict_set(r->a, kw.u.d, jv_cstr(r->a, jr_kwname(r, args, k)), args->kw[k]);
    }
    if (sig->catch_kwargs) jscope_set(r, s, r->prog->sym_kwargs, kw);
    if (caller) {
        if (!sig->catch_caller) jr_fail(r, "macro '%s' takes no keyword argument 'caller'", m->name);
        Jv c = { .t = JV_MACRO, .u.p = caller };
        jscope_set(r, s, r->prog->sym_caller, c);
    }
    Jv out = capture(r, s, m->body);
    r->calls--;
    return out;
}

Jv jr_call(JRender *r, Jv fn, const JArgs *args)
{
    switch (fn.t) {
    case JV_UNDEF: jr_fail_undef(r, fn);
    case JV_MACRO: return call_macro(r, fn.u.p, args, NULL);
    case JV_METHOD: return jbi_call_method(r, ((const JBound *)fn.u.p)->self, fn.id, args);
    case JV_FUNC: return jbi_call_func(r, fn.id, args);
    default: {
        JBuf b;
        jbuf_init(&b, r->a, 0);
        jbuf_puts(&b, jv_type_name(fn));
        jbuf_putc(&b, 0);
        char *sp = strchr(b.p, ' ');
        if (sp) *sp = 0;
        jr_fail(r, "'%s' object is not callable", b.p);
    }
    }
}

/* ---------------------------------------------------------------- arithmetic */

static double as_float(Jv v) { return v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v); }


static void overflow(JRender *r) { jr_fail(r, "integer overflow (tandem's template integers are 64-bit)"); }

static Jv repeat(JRender *r, Jv seq, int64_t times)
{
    if (times < 0) times = 0;
    if (seq.t == JV_STR) {
        const JStr *s = seq.u.s;
        if (s->n && (uint64_t)times > (SIZE_MAX / 2) / s->n) jr_fail(r, "string repetition too large");
        size_t n = s->n * (size_t)times;
        JStr *o = jarena_alloc(r->a, sizeof *o + n + 1); /* over the memory limit fails here */
        jr_work(r, n / 64);
        for (int64_t k = 0; k < times; k++) memcpy(o->s + (size_t)k * s->n, s->s, s->n);
        o->n = n;
        o->s[n] = 0;
        return jv_strv(o);
    }
    const JList *l = seq.u.l;
    if (l->n && (uint64_t)times > (SIZE_MAX / 64) / l->n) jr_fail(r, "list repetition too large");
    size_t n = l->n * (size_t)times;
    jr_work(r, n / 8);
    Jv out = jv_list(r->a, n);
    out.flags = seq.flags;
    for (int64_t k = 0; k < times; k++) memcpy(out.u.l->v + (size_t)k * l->n, l->v, l->n * sizeof(Jv));
    return out;
}

/* Python's float // and %. */
static void float_divmod(double vx, double wx, double *floordiv, double *mod)
{
    double m = fmod(vx, wx);
    double div = (vx - m) / wx;
    if (m != 0.0) {
        if ((wx < 0) != (m < 0)) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div != 0.0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static Jv binop(JRender *r, int op, Jv a, Jv b)
{
    /* str % x is str.__mod__ whatever x is (an Undefined is a mapping to it) */
    if (op == JOP_MOD && a.t == JV_STR) return jbi_str_percent(r, a.u.s, b);
    if (a.t == JV_UNDEF) jr_fail_undef(r, a);
    if (b.t == JV_UNDEF) jr_fail_undef(r, b);
    static const char *sym[] = { [JOP_ADD] = "+", [JOP_SUB] = "-", [JOP_MUL] = "*", [JOP_DIV] = "/",
                                 [JOP_FLOORDIV] = "//", [JOP_MOD] = "%", [JOP_POW] = "** or pow()" };
    if (jv_is_num(a) && jv_is_num(b)) {
        bool ints = jv_is_intlike(a) && jv_is_intlike(b);
        int64_t x = ints ? jv_as_int(a) : 0, y = ints ? jv_as_int(b) : 0, z;
        double fx = as_float(a), fy = as_float(b);
        switch (op) {
        case JOP_ADD:
            if (!ints) return jv_float(fx + fy);
            if (__builtin_add_overflow(x, y, &z)) overflow(r);
            return jv_int(z);
        case JOP_SUB:
            if (!ints) return jv_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &z)) overflow(r);
            return jv_int(z);
        case JOP_MUL:
            if (!ints) return jv_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &z)) overflow(r);
            return jv_int(z);
        case JOP_DIV:
            if (fy == 0.0) jr_fail(r, ints ? "division by zero" : "float division by zero");
            if (ints) {
                /* Python divides ints exactly then rounds once */
                return jv_float((double)x / (double)y);
            }
            return jv_float(fx / fy);
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints) {
                if (y == 0) jr_fail(r, op == JOP_MOD ? "integer division or modulo by zero" : "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    if (op == JOP_MOD) return jv_int(0);
                    overflow(r);
                }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    m += y;
                    q -= 1;
                }
                return jv_int(op == JOP_MOD ? m : q);
            } else {
                if (fy == 0.0) jr_fail(r, op == JOP_MOD ? "float modulo" : "float floor division by zero");
                double fd, m;
                float_divmod(fx, fy, &fd, &m);
                return jv_float(op == JOP_MOD ? m : fd);
            }
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if (e & 1 && __builtin_mul_overflow(acc, base, &acc)) overflow(r);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
                        /* base overflowing only matters when a later bit uses it */
                        if (e >> 1) overflow(r);
                    }
                }
                return jv_int(acc);
            }
            if (fx == 0.0 && fy < 0) jr_fail(r, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy)) jr_fail(r, "negative number cannot be raised to a fractional power (complex result)");
            return jv_float(pow(fx, fy));
        default:
            break;
        }
    }
    if (op == JOP_ADD) {
        if (a.t == JV_STR && b.t == JV_STR) {
            size_t n = a.u.s->n + b.u.s->n;
            JStr *o = jarena_alloc(r->a, sizeof *o + n + 1);
            memcpy(o->s, a.u.s->s, a.u.s->n);
            memcpy(o->s + a.u.s->n, b.u.s->s, b.u.s->n);
            o->n = n;
            o->s[n] = 0;
            jr_work(r, n / 64);
            return jv_strv(o);
        }
        if (a.t == JV_LIST && b.t == JV_LIST && !((a.flags | b.flags) & JV_F_NOSEQ) &&
            (a.flags & JV_F_TUPLE) == (b.flags & JV_F_TUPLE)) {
            Jv o = jv_list(r->a, a.u.l->n + b.u.l->n);
            o.flags = a.flags;
            memcpy(o.u.l->v, a.u.l->v, a.u.l->n * sizeof(Jv));
            memcpy(o.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(Jv));
            jr_work(r, o.u.l->n / 8);
            return o;
        }
        if (a.t == JV_STR) jr_fail(r, "can only concatenate str (not \"%s\") to str", jv_pytype(b));
        if (a.t == JV_LIST && !(a.flags & JV_F_NOSEQ))
            jr_fail(r, "can only concatenate %s (not \"%s\") to %s", jv_pytype(a), jv_pytype(b), jv_pytype(a));
    }
    if (op == JOP_MUL) {
        bool aseq = a.t == JV_STR || (a.t == JV_LIST && !(a.flags & JV_F_NOSEQ));
        bool bseq = b.t == JV_STR || (b.t == JV_LIST && !(b.flags & JV_F_NOSEQ));
        if (aseq && jv_is_intlike(b)) return repeat(r, a, jv_as_int(b));
        if (bseq && jv_is_intlike(a)) return repeat(r, b, jv_as_int(a));
        if (aseq && !jv_is_intlike(b)) jr_fail(r, "can't multiply sequence by non-int of type '%s'", jv_pytype(b));
        if (bseq && !jv_is_intlike(a)) jr_fail(r, "can't multiply sequence by non-int of type '%s'", jv_pytype(a));
    }
    if (op == JOP_MOD && a.t == JV_STR) return jbi_str_percent(r, a.u.s, b);
    jr_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], jv_pytype(a), jv_pytype(b));
}

/* ---------------------------------------------------------------- comparisons */

static bool contains(JRender *r, Jv item, Jv container)
{
    switch (container.t) {
    case JV_UNDEF: return false;
    case JV_STR: {
        if (item.t == JV_UNDEF) jr_fail_undef(r, item);
        if (item.t != JV_STR) jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_pytype(item));
        const JStr *h = container.u.s, *nd = item.u.s;
        jr_work(r, h->n / 64 + 1);
        if (nd->n == 0) return true;
        return nd->n <= h->n && memmem(h->s, h->n, nd->s, nd->n) != NULL;
    }
    case JV_LIST:
        if (container.u.l->err) jr_raise(r, container.u.l->err);
        jr_work(r, container.u.l->n / 8 + 1);
        for (size_t k = 0; k < container.u.l->n; k++)
            if (jv_eq(container.u.l->v[k], item)) return true;
        return false;
    case JV_DICT:
        if (!jv_hashable(item)) jr_fail(r, "unhashable type: '%s'", jv_pytype(item));
        jr_work(r, container.u.d->n / 8 + 1);
        return jdict_get(container.u.d, item) != NULL;
    default:
        jr_fail(r, "argument of type '%s' is not iterable", jv_pytype(container));
    }
}

static bool less(JRender *r, Jv a, Jv b)
{
    if (a.t == JV_UNDEF) jr_fail_undef(r, a);
    if (b.t == JV_UNDEF) jr_fail_undef(r, b);
    bool lt;
    char err[160];
    if (jv_lt(a, b, &lt, err, sizeof err)) jr_fail(r, "%s", err);
    return lt;
}

static bool compare(JRender *r, int op, Jv a, Jv b)
{
    switch (op) {
    case JCMP_EQ: return jv_eq(a, b);
    case JCMP_NE: return !jv_eq(a, b);
    case JCMP_LT: return less(r, a, b);
    case JCMP_LE: return less(r, a, b) || jv_eq(a, b);
    case JCMP_GT: return less(r, b, a);
    case JCMP_GE: return less(r, b, a) || jv_eq(a, b);
    case JCMP_IN: return contains(r, a, b);
    default: return !contains(r, a, b);
    }
}

/* ---------------------------------------------------------------- slices */

static int64_t slice_bound(JRender *r, Jv v, int64_t dflt, bool *bad)
{
    if (v.t == JV_NONE || v.t == JV_UNDEF) {
        if (v.t == JV_UNDEF) jr_fail_undef(r, v);
        return dflt;
    }
    if (!jv_is_intlike(v)) {
        *bad = true;
        return 0;
    }
    return jv_as_int(v);
}

/* Python's PySlice_AdjustIndices: the items start, start+step, ... of a
 * sequence of len. */
static size_t slice_indices(int64_t len, int64_t *start, int64_t *stop, int64_t step, bool has_start, bool has_stop)
{
    int64_t st = *start, sp = *stop;
    if (!has_start) st = step < 0 ? len - 1 : 0;
    else if (st < 0) {
        st += len;
        if (st < 0) st = step < 0 ? -1 : 0;
    } else if (st >= len) st = step < 0 ? len - 1 : len;
    if (!has_stop) sp = step < 0 ? -1 : len;
    else if (sp < 0) {
        sp += len;
        if (sp < 0) sp = step < 0 ? -1 : 0;
    } else if (sp >= len) sp = step < 0 ? len - 1 : len;
    *start = st;
    *stop = sp;
    if (step < 0) return sp < st ? (size_t)((st - sp - 1) / (-step) + 1) : 0;
    return st < sp ? (size_t)((sp - st - 1) / step + 1) : 0;
}

static Jv do_slice(JRender *r, Jv obj, Jv a, Jv b, Jv c, bool ha, bool hb, bool hc)
{
    if (obj.t == JV_UNDEF) jr_fail_undef(r, obj);
    bool bad = false;
    int64_t step = hc ? slice_bound(r, c, 1, &bad) : 1;
    int64_t start = ha ? slice_bound(r, a, 0, &bad) : 0;
    int64_t stop = hb ? slice_bound(r, b, 0, &bad) : 0;
    ha = ha && a.t != JV_NONE;
    hb = hb && b.t != JV_NONE;
    bool seq = obj.t == JV_STR || (obj.t == JV_LIST && !(obj.flags & JV_F_NOSEQ));
    if (!seq || bad) return jv_undef(r->a, NULL, NULL, NULL, "slice of an object that has none");
    if (step == 0) jr_fail(r, "slice step cannot be zero");
    if (obj.t == JV_LIST) {
        const JList *l = obj.u.l;
        size_t n = slice_indices((int64_t)l->n, &start, &stop, step, ha, hb);
        Jv out = jv_list(r->a, n);
        out.flags = obj.flags;
        for (size_t k = 0; k < n; k++) out.u.l->v[k] = l->v[start + (int64_t)k * step];
        return out;
    }
    const JStr *s = obj.u.s;
    size_t len = jutf8_len(s->s, s->n);
    jr_work(r, s->n / 64 + 1);
    size_t n = slice_indices((int64_t)len, &start, &stop, step, ha, hb);
    if (len == s->n) { /* ASCII */
        JStr *o = jarena_alloc(r->a, sizeof *o + n + 1);
        for (size_t k = 0; k < n; k++) o->s[k] = s->s[start + (int64_t)k * step];
        o->n = n;
        o->s[n] = 0;
        return jv_strv(o);
    }
    size_t *off = jarena_alloc(r->a, (len + 1) * sizeof *off);
    for (size_t i = 0, k = 0; i <= s->n && k <= len; k++) {
        off[k] = i;
        if (i == s->n) break;
        uint32_t cp;
        i += jutf8_decode(s->s + i, s->n - i, &cp);
    }
    off[len] = s->n;
    JBuf buf;
    jbuf_init(&buf, r->a, 0);
    for (size_t k = 0; k < n; k++) {
        int64_t i = start + (int64_t)k * step;
        jbuf_put(&buf, s->s + off[i], off[i + 1] - off[i]);
    }
    return jbuf_value(&buf);
}

/* ---------------------------------------------------------------- expressions */

static void eval_args(JRender *r, JScope *s, const JExpr *e, JArgs *args)
{
    Jv *pos = jarena_alloc(r->a, (e->nargs + 1) * sizeof *pos);
    for (size_t k = 0; k < e->nargs; k++) pos[k] = jr_eval_expr(r, s, e->args[k]);
    Jv *kw = jarena_alloc(r->a, (e->nkw + 1) * sizeof *kw);
    for (size_t k = 0; k < e->nkw; k++) kw[k] = jr_eval_expr(r, s, e->kwargs[k]);
    args->pos = pos;
    args->npos = e->nargs;
    args->kwsym = e->kwsym;
    args->kw = kw;
    args->nkw = e->nkw;
}

static Jv jr_eval_expr(JRender *r, JScope *s, const JExpr *e)
{
    enter(r);
    r->line = e->line;
    Jv v;
    switch (e->kind) {
    case JE_CONST:
        v = e->cval;
        break;
    case JE_NAME:
        if (!scope_get(s, e->sym, &v)) v = jv_undef(r->a, r->prog->syms[e->sym], NULL, NULL, NULL);
        break;
    case JE_ATTR: {
        Jv obj = jr_eval_expr(r, s, e->a);
        r->line = e->line;
        v = jr_getattr(r, obj, e->name->s, e->name->n);
        break;
    }
    case JE_ITEM: {
        Jv obj = jr_eval_expr(r, s, e->a);
        Jv key = jr_eval_expr(r, s, e->b);
        r->line = e->line;
        v = jr_getitem(r, obj, key);
        break;
    }
    case JE_SLICE: {
        Jv obj = jr_eval_expr(r, s, e->a);
        Jv a = e->b ? jr_eval_expr(r, s, e->b) : jv_none();
        Jv b = e->c ? jr_eval_expr(r, s, e->c) : jv_none();
        Jv c = e->d ? jr_eval_expr(r, s, e->d) : jv_none();
        r->line = e->line;
        v = do_slice(r, obj, a, b, c, e->b != NULL, e->c != NULL, e->d != NULL);
        break;
    }
    case JE_CALL: {
        Jv fn = jr_eval_expr(r, s, e->a);
        JArgs args;
        eval_args(r, s, e, &args);
        r->line = e->line;
        v = jr_call(r, fn, &args);
        break;
    }
    case JE_FILTER: {
        Jv in = e->a ? jr_eval_expr(r, s, e->a) : r->blockval;
        JArgs args;
        eval_args(r, s, e, &args);
        r->line = e->line;
        v = jbi_filter(r, e->id, in, &args);
        break;
    }
    case JE_TEST: {
        Jv in = jr_eval_expr(r, s, e->a);
        JArgs args;
        eval_args(r, s, e, &args);
        r->line = e->line;
        v = jv_bool(jbi_test(r, e->id, in, &args));
        break;
    }
    case JE_BIN: {
        Jv a = jr_eval_expr(r, s, e->a);
        Jv b = jr_eval_expr(r, s, e->b);
        r->line = e->line;
        v = binop(r, e->op, a, b);
        break;
    }
    case JE_CONCAT: {
        JBuf b;
        jbuf_init(&b, r->a, r->out ? r->out->limit : 0);
        for (size_t k = 0; k < e->nargs; k++) jv_write_str(&b, jr_eval_expr(r, s, e->args[k]));
        jr_work(r, b.n / 64);
        v = jbuf_value(&b);
        break;
    }
    case JE_CMP: {
        Jv left = jr_eval_expr(r, s, e->a);
        v = jv_bool(true);
        for (size_t k = 0; k < e->nargs; k++) {
            Jv right = jr_eval_expr(r, s, e->args[k]);
            r->line = e->line;
            if (!compare(r, e->ops[k], left, right)) {
                v = jv_bool(false);
                break;
            }
            left = right;
        }
        break;
    }
    case JE_AND:
        v = jr_eval_expr(r, s, e->a);
        if (jv_truthy(v)) v = jr_eval_expr(r, s, e->b);
        break;
    case JE_OR:
        v = jr_eval_expr(r, s, e->a);
        if (!jv_truthy(v)) v = jr_eval_expr(r, s, e->b);
        break;
    case JE_NOT:
        v = jv_bool(!jv_truthy(jr_eval_expr(r, s, e->a)));
        break;
    case JE_NEG:
    case JE_POS: {
        Jv a = jr_eval_expr(r, s, e->a);
        r->line = e->line;
        if (a.t == JV_UNDEF) jr_fail_undef(r, a);
        if (!jv_is_num(a)) jr_fail(r, "bad operand type for unary %c: '%s'", e->kind == JE_NEG ? '-' : '+', jv_pytype(a));
        if (e->kind == JE_POS) v = a.t == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.t == JV_FLOAT) v = jv_float(-a.u.f);
        else {
            int64_t x = jv_as_int(a);
            if (x == INT64_MIN) overflow(r);
            v = jv_int(-x);
        }
        break;
    }
    case JE_COND:
        if (jv_truthy(jr_eval_expr(r, s, e->a))) v = jr_eval_expr(r, s, e->b);
        else if (e->c) v = jr_eval_expr(r, s, e->c);
        else v = jv_undef(r->a, NULL, NULL, NULL, "the inline if-expression evaluated to false and no else section was defined");
        break;
    case JE_LIST:
    case JE_TUPLE:
        v = jv_list(r->a, e->nargs);
        if (e->kind == JE_TUPLE) v.flags = JV_F_TUPLE;
        for (size_t k = 0; k < e->nargs; k++) v.u.l->v[k] = jr_eval_expr(r, s, e->args[k]);
        break;
    case JE_DICT:
        v = jv_dict(r->a);
        for (size_t k = 0; k + 1 < e->nargs; k += 2) {
            Jv key = jr_eval_expr(r, s, e->args[k]);
            Jv val = jr_eval_expr(r, s, e->args[k + 1]);
            r->line = e->line;
            if (!jv_hashable(key)) jr_fail(r, "unhashable type: '%s'", jv_pytype(key));
            jdict_set(r->a, v.u.d, key, val);
        }
        break;
    default:
        jr_fail(r, "internal: cannot evaluate expression kind %d", e->kind);
    }
    r->depth--;
    return v;
}

/* ---------------------------------------------------------------- statements */

static void assign(JRender *r, JScope *s, const JExpr *target, Jv v)
{
    if (target->kind == JE_NAME) {
        jscope_set(r, s, target->sym, v);
        return;
    }
    if (target->kind == JE_NSREF) {
        Jv ns;
        if (!scope_get(s, target->sym, &ns) || ns.t != JV_NS)
            jr_fail(r, "cannot assign attribute on non-namespace object");
        jdict_set(r->a, ns.u.d, jv_strv(target->name), v);
        return;
    }
    /* tuple unpacking */
    const JList *items = jr_iter(r, v);
    if (items->n < target->nargs)
        jr_fail(r, "not enough values to unpack (expected %zu, got %zu)", target->nargs, items->n);
    if (items->n > target->nargs) jr_fail(r, "too many values to unpack (expected %zu)", target->nargs);
    for (size_t k = 0; k < target->nargs; k++) assign(r, s, target->args[k], items->v[k]);
}

static void exec_for(JRender *r, JScope *s, const JNode *n)
{
    Jv seq = jr_eval_expr(r, s, n->expr);
    r->line = n->line;
    const JList *items = jr_iter(r, seq);
    if (n->cond) {
        Jv kept = jv_list(r->a, items->n);
        size_t m = 0;
        JScope *t = NULL;
        for (size_t k = 0; k < items->n; k++) {
            jr_work(r, 1);
            t = iteration_scope(r, t, s);
            assign(r, t, n->target, items->v[k]);
            if (jv_truthy(jr_eval_expr(r, t, n->cond))) kept.u.l->v[m++] = items->v[k];
        }
        kept.u.l->n = m;
        items = kept.u.l;
    }
    if (items->n == 0) {
        exec_body(r, jscope_new(r, s), &n->else_body);
        return;
    }
    JLoop *L = jarena_zalloc(r->a, sizeof *L);
    L->length = (int64_t)items->n;
    L->items = items->v;
    L->changed_last = jarena_zalloc(r->a, sizeof(Jv) * 2); /* [0]: last value, [1].t: set */
    Jv lv = { .t = JV_LOOP, .u.p = L };
    JScope *it = NULL;
    for (size_t k = 0; k < items->n; k++) {
        jr_work(r, 1);
        L->index0 = (int64_t)k;
        it = iteration_scope(r, it, s);
        jscope_set(r, it, r->prog->sym_loop, lv);
        assign(r, it, n->target, items->v[k]);
        int rc = exec_body(r, it, &n->body);
        if (rc == 1) break;
    }
}

static int exec_body(JRender *r, JScope *s, const JBody *b)
{
    enter(r);
    for (size_t k = 0; k < b->n; k++) {
        const JNode *n = b->v[k];
        r->line = n->line;
        int rc = 0;
        switch (n->kind) {
        case JN_TEXT:
            jbuf_put(r->out, n->text->s, n->text->n);
            break;
        case JN_OUTPUT:
            jv_write_str(r->out, jr_eval_expr(r, s, n->expr));
            break;
        case JN_IF:
            if (jv_truthy(jr_eval_expr(r, s, n->expr))) rc = exec_body(r, s, &n->body);
            else rc = exec_body(r, s, &n->else_body);
            break;
        case JN_FOR:
            exec_for(r, s, n);
            break;
        case JN_SET:
            assign(r, s, n->target, jr_eval_expr(r, s, n->expr));
            break;
        case JN_SET_BLOCK:
        case JN_FILTER: {
            Jv body = capture(r, jscope_new(r, s), &n->body);
            Jv v = body;
            if (n->filter) {
                Jv saved = r->blockval;
                r->blockval = body;
                v = jr_eval_expr(r, s, n->filter);
                r->blockval = saved;
            }
            if (n->kind == JN_SET_BLOCK) assign(r, s, n->target, v);
            else jv_write_str(r->out, v);
            break;
        }
        case JN_MACRO: {
            JMacro *m = jarena_alloc(r->a, sizeof *m);
            m->name = n->sig.name;
            m->sig = &n->sig;
            m->body = &n->body;
            m->closure = s;
            capture_scope(s);
            Jv mv = { .t = JV_MACRO, .u.p = m };
            jscope_set(r, s, n->sym, mv);
            break;
        }
        case JN_CALL_BLOCK: {
            JMacro *caller = jarena_alloc(r->a, sizeof *caller);
            caller->name = "caller";
            caller->sig = &n->sig;
            caller->body = &n->body;
            caller->closure = s;
            capture_scope(s);
            Jv fn = jr_eval_expr(r, s, n->expr->a);
            JArgs args;
            eval_args(r, s, n->expr, &args);
            r->line = n->line;
            if (fn.t == JV_UNDEF) jr_fail_undef(r, fn);
            if (fn.t != JV_MACRO) jr_fail(r, "{%% call %%} needs a macro, got a %s", jv_pytype(fn));
            jv_write_str(r->out, call_macro(r, fn.u.p, &args, caller));
            break;
        }
        case JN_WITH: {
            JScope *w = jscope_new(r, s);
            for (size_t j = 0; j < n->nwith; j++) assign(r, w, n->targets[j], jr_eval_expr(r, s, n->values[j]));
            rc = exec_body(r, w, &n->body);
            break;
        }
        case JN_BREAK:
            rc = 1;
            break;
        case JN_CONTINUE:
            rc = 2;
            break;
        case JN_SCOPE:
            rc = exec_body(r, jscope_new(r, s), &n->body);
            break;
        default:
            jr_fail(r, "internal: cannot execute node kind %d", n->kind);
        }
        if (rc) {
            r->depth--;
            return rc;
        }
    }
    r->depth--;
    return 0;
}

static void arena_fail(void *ctx, const char *msg)
{
    JRender *r = ctx;
    r->hard = true;
    jr_fail(r, "%s", msg);
}

int jr_render(JRender *r, JBuf *out)
{
    if (setjmp(r->jb)) return -1;
    jarena_set_fail(r->a, arena_fail, r);
    r->out = out;
    JScope *root = jscope_new(r, r->ctx);
    exec_body(r, root, &r->prog->body);
    return 0;
}

/* core/chat/jinja/jinja_parse.c - recursive-descent parser over jinja_lex tokens
 * (see jinja_parse.h).  Function names follow jinja2's parser.py so the two
 * can be read side by side. */
#include "core/chat/jinja/jinja_parse.h"
#include "core/chat/jinja/jinja_builtins.h"
#include "core/chat/jinja/jinja_lex.h"
#include "core/common.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Nesting of expressions and blocks; deeper templates are refused rather
 * than risk the C stack (jinja2 itself stops near Python's recursion
 * limit). */
#define JPARSE_MAX_DEPTH 120
/* Depth of one expression tree (a.b.c..., a + b + c ... grow it without
 * recursing in the parser, so it is counted separately). */
#define JPARSE_MAX_EXPR_DEPTH 200

typedef struct CallSite {
    int sym;             /* callee name, or -1 for a method */
    const JStr *method;
    int line;
} CallSite;

typedef struct P {
    JProgram *prog;
    JArena *a;
    JTok *t;
    size_t nt, i;
    jmp_buf jb;
    char *err;
    size_t errlen;
    int depth, loops;
    JSig *macro;         /* innermost macro being parsed */
    size_t cap_syms;
    bool *assigned;      /* per symbol: bound somewhere in the template */
    size_t cap_assigned;
    CallSite *calls;
    size_t ncalls, cap_calls;
} P;

static void pfail(P *p, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
static void pfail(P *p, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errlen, "line %d: %s", line, msg);
    longjmp(p->jb, 1);
}

static JTok *cur(P *p) { return &p->t[p->i]; }
static JTok *look(P *p) { return &p->t[p->i + 1 < p->nt ? p->i + 1 : p->i]; }
static JTok *next_tok(P *p)
{
    JTok *t = &p->t[p->i];
    if (p->i + 1 < p->nt) p->i++;
    return t;
}

static bool is_op(const JTok *t, int op) { return t->type == JT_OP && t->op == op; }
static bool is_name(const JTok *t, const char *w)
{
    return t->type == JT_NAME && t->n == strlen(w) && memcmp(t->s, w, t->n) == 0;
}

static const char *describe(const JTok *t, char *buf, size_t n)
{
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_NAME: snprintf(buf, n, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->s); return buf;
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default: {
        static const char *ops[] = { "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{",
                                     "}", "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";" };
        snprintf(buf, n, "'%s'", ops[t->op]);
        return buf;
    }
    }
}

static void expect_op(P *p, int op, const char *what)
{
    if (!is_op(cur(p), op)) {
        char b[64];
        pfail(p, cur(p)->line, "expected '%s', got %s", what, describe(cur(p), b, sizeof b));
    }
    next_tok(p);
}

static JTok *expect_type(P *p, int type, const char *what)
{
    if (cur(p)->type != type) {
        char b[64];
        pfail(p, cur(p)->line, "expected %s, got %s", what, describe(cur(p), b, sizeof b));
    }
    return next_tok(p);
}

static void expect_name(P *p, const char *w)
{
    if (!is_name(cur(p), w)) {
        char b[64];
        pfail(p, cur(p)->line, "expected '%s', got %s", w, describe(cur(p), b, sizeof b));
    }
    next_tok(p);
}

/* ---------------------------------------------------------------- symbols */

static int intern(P *p, const char *s, size_t n)
{
    JProgram *g = p->prog;
    for (size_t k = 0; k < g->nsyms; k++)
        if (strlen(g->syms[k]) == n && memcmp(g->syms[k], s, n) == 0) return (int)k;
    if (g->nsyms == p->cap_syms) {
        size_t cap = p->cap_syms ? p->cap_syms * 2 : 64;
        const char **ns = jarena_alloc(p->a, cap * sizeof *ns);
        if (g->nsyms) memcpy(ns, g->syms, g->nsyms * sizeof *ns);
        g->syms = ns;
        p->cap_syms = cap;
        bool *na = jarena_zalloc(p->a, cap * sizeof *na);
        if (p->assigned) memcpy(na, p->assigned, p->cap_assigned * sizeof *na);
        p->assigned = na;
        p->cap_assigned = cap;
    }
    g->syms[g->nsyms] = jstr_new(p->a, s, n)->s;
    return (int)g->nsyms++;
}

static void mark_assigned(P *p, const JExpr *target)
{
    if (target->kind == JE_NAME) p->assigned[target->sym] = true;
    else if (target->kind == JE_TUPLE)
        for (size_t k = 0; k < target->nargs; k++) mark_assigned(p, target->args[k]);
}

static void add_call(P *p, int sym, const JStr *method, int line)
{
    if (p->ncalls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 32;
        CallSite *nc = jarena_alloc(p->a, cap * sizeof *nc);
        if (p->ncalls) memcpy(nc, p->calls, p->ncalls * sizeof *nc);
        p->calls = nc;
        p->cap_calls = cap;
    }
    p->calls[p->ncalls++] = (CallSite){ sym, method, line };
}

/* ---------------------------------------------------------------- nodes */

static JExpr *mk(P *p, int kind, int line)
{
    JExpr *e = jarena_zalloc(p->a, sizeof *e);
    e->kind = (uint8_t)kind;
    e->line = line;
    e->sym = -1;
    e->depth = 1;
    return e;
}

static int depth_of(const JExpr *e) { return e ? e->depth : 0; }

/* Finishes e: its depth from its operands, refused past the limit. */
static JExpr *done(P *p, JExpr *e)
{
    int d = depth_of(e->a);
    if (depth_of(e->b) > d) d = depth_of(e->b);
    if (depth_of(e->c) > d) d = depth_of(e->c);
    if (depth_of(e->d) > d) d = depth_of(e->d);
    for (size_t k = 0; k < e->nargs; k++) if (depth_of(e->args[k]) > d) d = depth_of(e->args[k]);
    for (size_t k = 0; k < e->nkw; k++) if (depth_of(e->kwargs[k]) > d) d = depth_of(e->kwargs[k]);
    if (d + 1 > JPARSE_MAX_EXPR_DEPTH)
        pfail(p, e->line, "expression nested too deeply (more than %d levels)", JPARSE_MAX_EXPR_DEPTH);
    e->depth = (uint16_t)(d + 1);
    return e;
}

typedef struct Vec {
    void **v;
    size_t n, cap;
} Vec;

static void vpush(P *p, Vec *v, void *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        void **nv = jarena_alloc(p->a, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static void enter(P *p)
{
    if (++p->depth > JPARSE_MAX_DEPTH) pfail(p, cur(p)->line, "template nested too deeply (more than %d levels)", JPARSE_MAX_DEPTH);
}

/* ---------------------------------------------------------------- expressions */

static JExpr *parse_expression(P *p, bool with_condexpr);
static JExpr *parse_tuple(P *p, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens);
static JExpr *parse_unary(P *p, bool with_filter);
static JExpr *parse_postfix(P *p, JExpr *node);
static JExpr *parse_filter(P *p, JExpr *node, bool start_inline);

/* (args, kw=value): jinja2's parse_call_args; *args and **kwargs are
 * refused. */
static void parse_call_args(P *p, JExpr *e)
{
    int line = cur(p)->line;
    expect_op(p, JOP_LPAREN, "(");
    Vec args = { 0 }, kwn = { 0 }, kwv = { 0 };
    bool require_comma = false;
    while (!is_op(cur(p), JOP_RPAREN)) {
        if (require_comma) {
            expect_op(p, JOP_COMMA, ",");
            if (is_op(cur(p), JOP_RPAREN)) break;
        }
        if (is_op(cur(p), JOP_MUL) || is_op(cur(p), JOP_POW))
            pfail(p, cur(p)->line, "unsupported *args / **kwargs in a call");
        if (cur(p)->type == JT_NAME && is_op(look(p), JOP_ASSIGN)) {
            JTok *k = next_tok(p);
            next_tok(p);
            int *sym = jarena_alloc(p->a, sizeof *sym);
            *sym = intern(p, k->s, k->n);
            vpush(p, &kwn, sym);
            vpush(p, &kwv, parse_expression(p, true));
        } else {
            if (kwn.n) pfail(p, line, "invalid syntax for function call expression (positional argument after keyword)");
            vpush(p, &args, parse_expression(p, true));
        }
        require_comma = true;
    }
    expect_op(p, JOP_RPAREN, ")");
    e->args = (JExpr **)args.v;
    e->nargs = args.n;
    e->nkw = kwn.n;
    e->kwargs = (JExpr **)kwv.v;
    e->kwsym = jarena_alloc(p->a, (kwn.n ? kwn.n : 1) * sizeof(int));
    for (size_t k = 0; k < kwn.n; k++) e->kwsym[k] = *(int *)kwn.v[k];
}

/* A literal string argument (filter or test name for map/select/...). */
static void check_named_callable(P *p, const JExpr *e)
{
    if (e->kind != JE_FILTER || e->nargs == 0 || e->args[0]->kind != JE_CONST || e->args[0]->cval.t != JV_STR)
        return;
    const char *fname = jbi_filter_name(e->id);
    const JStr *s = e->args[0]->cval.u.s;
    if (strcmp(fname, "map") == 0) {
        if (jbi_filter_id(s->s, s->n) < 0) pfail(p, e->line, "unsupported filter '%s' (in map)", s->s);
    } else if (strcmp(fname, "select") == 0 || strcmp(fname, "reject") == 0) {
        if (jbi_test_id(s->s, s->n) < 0) pfail(p, e->line, "unsupported test '%s' (in %s)", s->s, fname);
    } else if (strcmp(fname, "selectattr") == 0 || strcmp(fname, "rejectattr") == 0) {
        if (e->nargs >= 2 && e->args[1]->kind == JE_CONST && e->args[1]->cval.t == JV_STR) {
            const JStr *t = e->args[1]->cval.u.s;
            if (jbi_test_id(t->s, t->n) < 0) pfail(p, e->line, "unsupported test '%s' (in %s)", t->s, fname);
        }
    }
}

static JExpr *parse_filter(P *p, JExpr *node, bool start_inline)
{
    while (is_op(cur(p), JOP_PIPE) || start_inline) {
        if (!start_inline) next_tok(p);
        JTok *t = expect_type(p, JT_NAME, "a filter name");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(t->n < 60 ? t->n : 60), t->s);
        if (is_op(cur(p), JOP_DOT)) pfail(p, t->line, "unsupported filter '%s.' (dotted filter names)", name);
        int id = jbi_filter_id(t->s, t->n);
        if (id < 0) pfail(p, t->line, "unsupported filter '%s'", name);
        JExpr *e = mk(p, JE_FILTER, t->line);
        e->a = node;
        e->id = (uint16_t)id;
        if (is_op(cur(p), JOP_LPAREN)) parse_call_args(p, e);
        else e->kwsym = NULL;
        check_named_callable(p, e);
        node = done(p, e);
        start_inline = false;
    }
    return node;
}

static JExpr *parse_test(P *p, JExpr *node)
{
    JTok *is = next_tok(p); /* 'is' */
    bool negated = false;
    if (is_name(cur(p), "not")) {
        next_tok(p);
        negated = true;
    }
    JTok *t = expect_type(p, JT_NAME, "a test name");
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(t->n < 60 ? t->n : 60), t->s);
    if (is_op(cur(p), JOP_DOT)) pfail(p, t->line, "unsupported test '%s.' (dotted test names)", name);
    int id = jbi_test_id(t->s, t->n);
    if (id < 0) pfail(p, t->line, "unsupported test '%s'", name);
    JExpr *e = mk(p, JE_TEST, is->line);
    e->a = node;
    e->id = (uint16_t)id;
    JTok *c = cur(p);
    if (is_op(c, JOP_LPAREN)) {
        parse_call_args(p, e);
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT || c->type == JT_FLOAT ||
                is_op(c, JOP_LBRACKET) || is_op(c, JOP_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, c->line, "you cannot chain multiple tests with is");
        /* a single argument without parentheses: parse_primary + postfix */
        JExpr *arg = parse_unary(p, false);
        e->args = jarena_alloc(p->a, sizeof *e->args);
        e->args[0] = arg;
        e->nargs = 1;
    }
    done(p, e);
    if (negated) {
        JExpr *n = mk(p, JE_NOT, is->line);
        n->a = e;
        return done(p, n);
    }
    return e;
}

static JExpr *parse_filter_expr(P *p, JExpr *node)
{
    for (;;) {
        if (is_op(cur(p), JOP_PIPE)) node = parse_filter(p, node, false);
        else if (is_name(cur(p), "is")) node = parse_test(p, node);
        else if (is_op(cur(p), JOP_LPAREN)) {
            JExpr *e = mk(p, JE_CALL, cur(p)->line);
            e->a = node;
            parse_call_args(p, e);
            node = done(p, e);
        } else break;
    }
    return node;
}

static JExpr *parse_list_lit(P *p)
{
    int line = next_tok(p)->line;
    Vec items = { 0 };
    while (!is_op(cur(p), JOP_RBRACKET)) {
        if (items.n) expect_op(p, JOP_COMMA, ",");
        if (is_op(cur(p), JOP_RBRACKET)) break;
        vpush(p, &items, parse_expression(p, true));
    }
    expect_op(p, JOP_RBRACKET, "]");
    JExpr *e = mk(p, JE_LIST, line);
    e->args = (JExpr **)items.v;
    e->nargs = items.n;
    return done(p, e);
}

static JExpr *parse_dict_lit(P *p)
{
    int line = next_tok(p)->line;
    Vec items = { 0 };
    while (!is_op(cur(p), JOP_RBRACE)) {
        if (items.n) expect_op(p, JOP_COMMA, ",");
        if (is_op(cur(p), JOP_RBRACE)) break;
        vpush(p, &items, parse_expression(p, true));
        expect_op(p, JOP_COLON, ":");
        vpush(p, &items, parse_expression(p, true));
    }
    expect_op(p, JOP_RBRACE, "}");
    JExpr *e = mk(p, JE_DICT, line);
    e->args = (JExpr **)items.v;
    e->nargs = items.n;
    return done(p, e);
}

static JExpr *parse_primary(P *p)
{
    JTok *t = cur(p);
    JExpr *e;
    if (t->type == JT_NAME) {
        next_tok(p);
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            e = mk(p, JE_CONST, t->line);
            e->cval = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            e = mk(p, JE_CONST, t->line);
            e->cval = jv_none();
        } else {
            e = mk(p, JE_NAME, t->line);
            e->sym = intern(p, t->s, t->n);
            if (p->macro) {
                if (e->sym == p->prog->sym_varargs) p->macro->catch_varargs = true;
                if (e->sym == p->prog->sym_kwargs) p->macro->catch_kwargs = true;
                if (e->sym == p->prog->sym_caller) p->macro->catch_caller = true;
            }
        }
        return e;
    }
    if (t->type == JT_STRING) {
        JBuf b;
        jbuf_init(&b, p->a, 0);
        while (cur(p)->type == JT_STRING) { /* adjacent literals concatenate */
            JTok *s = next_tok(p);
            jbuf_put(&b, s->s, s->n);
        }
        e = mk(p, JE_CONST, t->line);
        e->cval = jbuf_value(&b);
        return e;
    }
    if (t->type == JT_INT || t->type == JT_FLOAT) {
        next_tok(p);
        e = mk(p, JE_CONST, t->line);
        e->cval = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        return e;
    }
    if (is_op(t, JOP_LPAREN)) {
        next_tok(p);
        e = parse_tuple(p, false, true, NULL, true);
        expect_op(p, JOP_RPAREN, ")");
        return e;
    }
    if (is_op(t, JOP_LBRACKET)) return parse_list_lit(p);
    if (is_op(t, JOP_LBRACE)) return parse_dict_lit(p);
    char b[64];
    pfail(p, t->line, "unexpected %s", describe(t, b, sizeof b));
}

/* One subscript: an expression or a slice a:b:c. */
static JExpr *parse_subscribed(P *p)
{
    int line = cur(p)->line;
    JExpr *parts[3] = { NULL, NULL, NULL };
    if (is_op(cur(p), JOP_COLON)) {
        next_tok(p);
    } else {
        JExpr *node = parse_expression(p, true);
        if (!is_op(cur(p), JOP_COLON)) return node;
        next_tok(p);
        parts[0] = node;
    }
    if (!is_op(cur(p), JOP_COLON) && !is_op(cur(p), JOP_RBRACKET) && !is_op(cur(p), JOP_COMMA))
        parts[1] = parse_expression(p, true);
    if (is_op(cur(p), JOP_COLON)) {
        next_tok(p);
        if (!is_op(cur(p), JOP_RBRACKET) && !is_op(cur(p), JOP_COMMA)) parts[2] = parse_expression(p, true);
    }
    JExpr *e = mk(p, JE_SLICE, line);
    e->b = parts[0];
    e->c = parts[1];
    e->d = parts[2];
    return e; /* finished by parse_postfix once its object is known */
}

static JExpr *parse_postfix(P *p, JExpr *node)
{
    for (;;) {
        JTok *t = cur(p);
        if (is_op(t, JOP_DOT)) {
            next_tok(p);
            JTok *at = next_tok(p);
            if (at->type == JT_NAME) {
                JExpr *e = mk(p, JE_ATTR, t->line);
                e->a = node;
                e->name = jstr_new(p->a, at->s, at->n);
                node = done(p, e);
            } else if (at->type == JT_INT) {
                JExpr *e = mk(p, JE_ITEM, t->line);
                e->a = node;
                e->b = mk(p, JE_CONST, at->line);
                e->b->cval = jv_int(at->i);
                node = done(p, e);
            } else {
                pfail(p, at->line, "expected name or number after '.'");
            }
        } else if (is_op(t, JOP_LBRACKET)) {
            next_tok(p);
            Vec args = { 0 };
            while (!is_op(cur(p), JOP_RBRACKET)) {
                if (args.n) expect_op(p, JOP_COMMA, ",");
                vpush(p, &args, parse_subscribed(p));
            }
            expect_op(p, JOP_RBRACKET, "]");
            if (args.n == 0) pfail(p, t->line, "expected a subscript");
            JExpr *key;
            if (args.n == 1) {
                key = args.v[0];
            } else {
                /* x[a:b, c]: a slice inside a tuple key (Python's slice
                 * objects; no list or dict takes them, so jinja2 fails
                 * at render) */
                for (size_t k = 0; k < args.n; k++)
                    if (((JExpr *)args.v[k])->kind == JE_SLICE)
                        pfail(p, t->line, "a slice inside a subscript of several parts ('[a:b, c]') is not supported");
                key = mk(p, JE_TUPLE, t->line);
                key->args = (JExpr **)args.v;
                key->nargs = args.n;
                done(p, key);
            }
            if (key->kind == JE_SLICE) {
                key->a = node;
                node = done(p, key);
            } else {
                JExpr *e = mk(p, JE_ITEM, t->line);
                e->a = node;
                e->b = key;
                node = done(p, e);
            }
        } else if (is_op(t, JOP_LPAREN)) {
            JExpr *e = mk(p, JE_CALL, t->line);
            e->a = node;
            parse_call_args(p, e);
            node = done(p, e);
        } else {
            return node;
        }
    }
}

static JExpr *parse_unary(P *p, bool with_filter)
{
    enter(p);
    JTok *t = cur(p);
    JExpr *node;
    if (is_op(t, JOP_SUB) || is_op(t, JOP_ADD)) {
        next_tok(p);
        node = mk(p, is_op(t, JOP_SUB) ? JE_NEG : JE_POS, t->line);
        node->a = parse_unary(p, false);
        done(p, node);
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->depth--;
    return node;
}

static JExpr *bin(P *p, int op, JExpr *a, JExpr *b, int line)
{
    JExpr *e = mk(p, JE_BIN, line);
    e->op = (uint8_t)op;
    e->a = a;
    e->b = b;
    return done(p, e);
}

static JExpr *parse_pow(P *p)
{
    JExpr *left = parse_unary(p, true);
    while (is_op(cur(p), JOP_POW)) {
        int line = next_tok(p)->line;
        left = bin(p, JOP_POW, left, parse_unary(p, true), line);
    }
    return left;
}

static JExpr *parse_math2(P *p)
{
    JExpr *left = parse_pow(p);
    for (;;) {
        JTok *t = cur(p);
        if (!(is_op(t, JOP_MUL) || is_op(t, JOP_DIV) || is_op(t, JOP_FLOORDIV) || is_op(t, JOP_MOD))) return left;
        next_tok(p);
        left = bin(p, t->op, left, parse_pow(p), t->line);
    }
}

static JExpr *parse_concat(P *p)
{
    JExpr *first = parse_math2(p);
    if (!is_op(cur(p), JOP_TILDE)) return first;
    Vec args = { 0 };
    vpush(p, &args, first);
    int line = cur(p)->line;
    while (is_op(cur(p), JOP_TILDE)) {
        next_tok(p);
        vpush(p, &args, parse_math2(p));
    }
    JExpr *e = mk(p, JE_CONCAT, line);
    e->args = (JExpr **)args.v;
    e->nargs = args.n;
    return done(p, e);
}

static JExpr *parse_math1(P *p)
{
    JExpr *left = parse_concat(p);
    for (;;) {
        JTok *t = cur(p);
        if (!(is_op(t, JOP_ADD) || is_op(t, JOP_SUB))) return left;
        next_tok(p);
        left = bin(p, t->op, left, parse_concat(p), t->line);
    }
}

static JExpr *parse_compare(P *p)
{
    int line = cur(p)->line;
    JExpr *first = parse_math1(p);
    Vec ops = { 0 }, args = { 0 };
    for (;;) {
        JTok *t = cur(p);
        int op = -1;
        if (t->type == JT_OP) {
            switch (t->op) {
            case JOP_EQ: op = JCMP_EQ; break;
            case JOP_NE: op = JCMP_NE; break;
            case JOP_LT: op = JCMP_LT; break;
            case JOP_LTEQ: op = JCMP_LE; break;
            case JOP_GT: op = JCMP_GT; break;
            case JOP_GTEQ: op = JCMP_GE; break;
            default: break;
            }
            if (op >= 0) next_tok(p);
        } else if (is_name(t, "in")) {
            next_tok(p);
            op = JCMP_IN;
        } else if (is_name(t, "not") && is_name(look(p), "in")) {
            next_tok(p);
            next_tok(p);
            op = JCMP_NOTIN;
        }
        if (op < 0) break;
        vpush(p, &ops, (void *)(intptr_t)op);
        vpush(p, &args, parse_math1(p));
    }
    if (!ops.n) return first;
    JExpr *e = mk(p, JE_CMP, line);
    e->a = first;
    e->args = (JExpr **)args.v;
    e->nargs = args.n;
    e->ops = jarena_alloc(p->a, ops.n);
    for (size_t k = 0; k < ops.n; k++) e->ops[k] = (uint8_t)(intptr_t)ops.v[k];
    return done(p, e);
}

static JExpr *parse_not(P *p)
{
    if (is_name(cur(p), "not")) {
        enter(p);
        JExpr *e = mk(p, JE_NOT, next_tok(p)->line);
        e->a = parse_not(p);
        p->depth--;
        return done(p, e);
    }
    return parse_compare(p);
}

static JExpr *parse_and(P *p)
{
    JExpr *left = parse_not(p);
    while (is_name(cur(p), "and")) {
        JExpr *e = mk(p, JE_AND, next_tok(p)->line);
        e->a = left;
        e->b = parse_not(p);
        left = done(p, e);
    }
    return left;
}

static JExpr *parse_or(P *p)
{
    JExpr *left = parse_and(p);
    while (is_name(cur(p), "or")) {
        JExpr *e = mk(p, JE_OR, next_tok(p)->line);
        e->a = left;
        e->b = parse_and(p);
        left = done(p, e);
    }
    return left;
}

static JExpr *parse_condexpr(P *p)
{
    enter(p);
    JExpr *expr1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        JExpr *e = mk(p, JE_COND, next_tok(p)->line);
        e->a = parse_or(p);
        e->b = expr1;
        if (is_name(cur(p), "else")) {
            next_tok(p);
            e->c = parse_condexpr(p);
        }
        expr1 = done(p, e);
    }
    p->depth--;
    return expr1;
}

static JExpr *parse_expression(P *p, bool with_condexpr)
{
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static bool is_tuple_end(P *p, const char *extra_end)
{
    JTok *t = cur(p);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, JOP_RPAREN) || t->type == JT_EOF) return true;
    return extra_end && is_name(t, extra_end);
}

static JExpr *parse_tuple(P *p, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens)
{
    int line = cur(p)->line;
    Vec args = { 0 };
    bool is_tuple = false;
    for (;;) {
        if (args.n) expect_op(p, JOP_COMMA, ",");
        if (is_tuple_end(p, extra_end)) break;
        JExpr *e;
        if (simplified) {
            e = parse_primary(p);
        } else {
            e = parse_expression(p, with_condexpr);
        }
        vpush(p, &args, e);
        if (is_op(cur(p), JOP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char b[64];
            pfail(p, cur(p)->line, "expected an expression, got %s", describe(cur(p), b, sizeof b));
        }
    }
    JExpr *e = mk(p, JE_TUPLE, line);
    e->args = (JExpr **)args.v;
    e->nargs = args.n;
    return done(p, e);
}

/* ---------------------------------------------------------------- statements */

static JBody subparse(P *p, const char *const *end_tokens);

/* The target of for / set / with: a name, a tuple of names, or (set only)
 * ns.attr. */
static JExpr *parse_assign_target(P *p, bool with_namespace, const char *extra_end)
{
    JTok *t = cur(p);
    if (with_namespace && t->type == JT_NAME && is_op(look(p), JOP_DOT)) {
        next_tok(p);
        next_tok(p);
        JTok *attr = expect_type(p, JT_NAME, "an attribute name");
        JExpr *e = mk(p, JE_NSREF, t->line);
        e->sym = intern(p, t->s, t->n);
        e->name = jstr_new(p->a, attr->s, attr->n);
        p->assigned[intern(p, attr->s, attr->n)] = true; /* ns.attr() may call what it holds */
        return e;
    }
    JExpr *target = parse_tuple(p, true, true, extra_end, false);
    bool ok = target->kind == JE_NAME;
    if (target->kind == JE_TUPLE) {
        ok = target->nargs > 0;
        for (size_t k = 0; k < target->nargs; k++) ok = ok && target->args[k]->kind == JE_NAME;
    }
    if (!ok) pfail(p, t->line, "can't assign to this expression");
    mark_assigned(p, target);
    return target;
}

/* Header end, then the body until one of end_tokens (left as current). */
static JBody parse_statements(P *p, const char *const *end_tokens, bool drop_needle)
{
    if (is_op(cur(p), JOP_COLON)) next_tok(p);
    expect_type(p, JT_BLOCK_END, "'%}'");
    JBody b = subparse(p, end_tokens);
    if (cur(p)->type == JT_EOF) {
        pfail(p, cur(p)->line, "unexpected end of template, expected '%s'", end_tokens[0]);
    }
    if (drop_needle) next_tok(p);
    return b;
}

static JNode *mknode(P *p, int kind, int line)
{
    JNode *n = jarena_zalloc(p->a, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

static JNode *parse_for(P *p, int line)
{
    JNode *n = mknode(p, JN_FOR, line);
    n->target = parse_assign_target(p, false, "in");
    expect_name(p, "in");
    n->expr = parse_tuple(p, false, false, "recursive", false);
    if (is_name(cur(p), "if")) {
        next_tok(p);
        n->cond = parse_expression(p, true);
    }
    if (is_name(cur(p), "recursive")) pfail(p, cur(p)->line, "unsupported recursive for loop");
    static const char *const ends[] = { "endfor", "else", NULL };
    static const char *const ends2[] = { "endfor", NULL };
    p->loops++;
    n->body = parse_statements(p, ends, false);
    p->loops--;
    if (is_name(next_tok(p), "else")) n->else_body = parse_statements(p, ends2, true);
    return n;
}

static JNode *parse_if(P *p, int line)
{
    static const char *const ends[] = { "elif", "else", "endif", NULL };
    static const char *const ends2[] = { "endif", NULL };
    JNode *result = mknode(p, JN_IF, line), *node = result;
    for (;;) {
        node->expr = parse_tuple(p, false, false, NULL, false);
        node->body = parse_statements(p, ends, false);
        JTok *t = next_tok(p);
        if (is_name(t, "elif")) {
            JNode *e = mknode(p, JN_IF, t->line);
            node->else_body.v = jarena_alloc(p->a, sizeof(JNode *));
            node->else_body.v[0] = e;
            node->else_body.n = 1;
            node = e;
            continue;
        }
        if (is_name(t, "else")) node->else_body = parse_statements(p, ends2, true);
        return result;
    }
}

static JNode *parse_set(P *p, int line)
{
    JExpr *target = parse_assign_target(p, true, NULL);
    if (is_op(cur(p), JOP_ASSIGN)) {
        next_tok(p);
        JNode *n = mknode(p, JN_SET, line);
        n->target = target;
        n->expr = parse_tuple(p, false, true, NULL, false);
        return n;
    }
    if (target->kind == JE_NSREF) pfail(p, line, "a block set cannot assign to a namespace attribute");
    JNode *n = mknode(p, JN_SET_BLOCK, line);
    n->target = target;
    n->filter = is_op(cur(p), JOP_PIPE) ? parse_filter(p, NULL, false) : NULL;
    static const char *const ends[] = { "endset", NULL };
    n->body = parse_statements(p, ends, true);
    return n;
}

/* (a, b=default, ...) of a macro or call block. */
static void parse_signature(P *p, JSig *sig)
{
    expect_op(p, JOP_LPAREN, "(");
    Vec params = { 0 }, defs = { 0 };
    while (!is_op(cur(p), JOP_RPAREN)) {
        if (params.n) expect_op(p, JOP_COMMA, ",");
        if (is_op(cur(p), JOP_RPAREN)) break;
        JTok *t = expect_type(p, JT_NAME, "a parameter name");
        int *sym = jarena_alloc(p->a, sizeof *sym);
        *sym = intern(p, t->s, t->n);
        p->assigned[*sym] = true;
        vpush(p, &params, sym);
        if (is_op(cur(p), JOP_ASSIGN)) {
            next_tok(p);
            vpush(p, &defs, parse_expression(p, true));
        } else {
            if (defs.n && defs.v[defs.n - 1]) pfail(p, t->line, "non-default argument follows default argument");
            vpush(p, &defs, NULL);
        }
    }
    expect_op(p, JOP_RPAREN, ")");
    sig->nparams = params.n;
    sig->params = jarena_alloc(p->a, (params.n ? params.n : 1) * sizeof(int));
    for (size_t k = 0; k < params.n; k++) sig->params[k] = *(int *)params.v[k];
    sig->defaults = (JExpr **)defs.v;
}

static JNode *parse_macro(P *p, int line)
{
    JNode *n = mknode(p, JN_MACRO, line);
    JTok *t = expect_type(p, JT_NAME, "a macro name");
    n->sym = intern(p, t->s, t->n);
    p->assigned[n->sym] = true;
    n->sig.name = p->prog->syms[n->sym];
    parse_signature(p, &n->sig);
    JSig *outer = p->macro;
    int loops = p->loops;
    p->macro = &n->sig;
    p->loops = 0;
    static const char *const ends[] = { "endmacro", NULL };
    n->body = parse_statements(p, ends, true);
    p->macro = outer;
    p->loops = loops;
    return n;
}

static JNode *parse_call_block(P *p, int line)
{
    JNode *n = mknode(p, JN_CALL_BLOCK, line);
    n->sig.name = "caller";
    if (is_op(cur(p), JOP_LPAREN)) parse_signature(p, &n->sig);
    n->expr = parse_expression(p, true);
    if (n->expr->kind != JE_CALL) pfail(p, line, "expected a call after {%% call %%}");
    JSig *outer = p->macro;
    int loops = p->loops;
    p->macro = &n->sig;
    p->loops = 0;
    static const char *const ends[] = { "endcall", NULL };
    n->body = parse_statements(p, ends, true);
    p->macro = outer;
    p->loops = loops;
    return n;
}

static JNode *parse_with(P *p, int line)
{
    JNode *n = mknode(p, JN_WITH, line);
    Vec targets = { 0 }, values = { 0 };
    while (cur(p)->type != JT_BLOCK_END) {
        if (targets.n) expect_op(p, JOP_COMMA, ",");
        JExpr *target = parse_assign_target(p, false, NULL);
        expect_op(p, JOP_ASSIGN, "=");
        vpush(p, &targets, target);
        vpush(p, &values, parse_expression(p, true));
    }
    n->targets = (JExpr **)targets.v;
    n->values = (JExpr **)values.v;
    n->nwith = targets.n;
    static const char *const ends[] = { "endwith", NULL };
    n->body = parse_statements(p, ends, true);
    return n;
}

static JNode *parse_statement(P *p)
{
    JTok *t = cur(p);
    if (t->type != JT_NAME) pfail(p, t->line, "tag name expected");
    int line = t->line;
    next_tok(p);
    JNode *n;
    if (is_name(t, "for")) return parse_for(p, line);
    if (is_name(t, "if")) return parse_if(p, line);
    if (is_name(t, "set")) return parse_set(p, line);
    if (is_name(t, "macro")) return parse_macro(p, line);
    if (is_name(t, "call")) return parse_call_block(p, line);
    if (is_name(t, "with")) return parse_with(p, line);
    if (is_name(t, "print")) {
        n = mknode(p, JN_OUTPUT, line);
        n->expr = parse_tuple(p, false, true, NULL, false);
        return n;
    }
    if (is_name(t, "filter")) {
        n = mknode(p, JN_FILTER, line);
        n->filter = parse_filter(p, NULL, true);
        static const char *const ends[] = { "endfilter", NULL };
        n->body = parse_statements(p, ends, true);
        return n;
    }
    if (is_name(t, "generation")) {
        n = mknode(p, JN_SCOPE, line);
        static const char *const ends[] = { "endgeneration", NULL };
        n->body = parse_statements(p, ends, true);
        return n;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops) pfail(p, line, "'%.*s' outside a for loop", (int)t->n, t->s);
        return mknode(p, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, line);
    }
    static const char *const known_end[] = { "endfor", "endif", "elif", "else", "endset", "endmacro",
                                             "endcall", "endfilter", "endwith", "endgeneration", "endraw" };
    for (size_t k = 0; k < sizeof known_end / sizeof *known_end; k++)
        if (is_name(t, known_end[k])) pfail(p, line, "unexpected '%s' (no block is open that it closes)", known_end[k]);
    pfail(p, line, "unsupported tag '%.*s'", (int)(t->n < 40 ? t->n : 40), t->s);
}

static JBody subparse(P *p, const char *const *end_tokens)
{
    enter(p);
    Vec body = { 0 };
    for (;;) {
        JTok *t = cur(p);
        if (t->type == JT_EOF) break;
        if (t->type == JT_DATA) {
            JNode *n = mknode(p, JN_TEXT, t->line);
            n->text = jstr_new(p->a, t->s, t->n);
            vpush(p, &body, n);
            next_tok(p);
        } else if (t->type == JT_VAR_BEGIN) {
            next_tok(p);
            JNode *n = mknode(p, JN_OUTPUT, t->line);
            n->expr = parse_tuple(p, false, true, NULL, false);
            expect_type(p, JT_VAR_END, "'}}'");
            vpush(p, &body, n);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next_tok(p);
            if (end_tokens) {
                bool end = false;
                for (const char *const *e = end_tokens; *e; e++) end = end || is_name(cur(p), *e);
                if (end) break;
            }
            vpush(p, &body, parse_statement(p));
            expect_type(p, JT_BLOCK_END, "'%}'");
        } else {
            char b[64];
            pfail(p, t->line, "unexpected %s", describe(t, b, sizeof b));
        }
    }
    p->depth--;
    JBody b = { (JNode **)body.v, body.n };
    return b;
}

/* After parsing: every call names something that exists. */
static void check_calls(P *p)
{
    for (size_t k = 0; k < p->ncalls; k++) {
        const CallSite *c = &p->calls[k];
        if (c->sym >= 0) {
            const char *name = p->prog->syms[c->sym];
            if (jbi_func_id(name, strlen(name)) >= 0 || p->assigned[c->sym] || c->sym == p->prog->sym_caller)
                continue;
            pfail(p, c->line, "unsupported function '%s'", name);
        } else {
            if (jbi_method_known(c->method->s, c->method->n)) continue;
            int sym = jprogram_sym(p->prog, c->method->s, c->method->n);
            if (sym >= 0 && p->assigned[sym]) continue;
            pfail(p, c->line, "unsupported method '.%s()'", c->method->s);
        }
    }
}

/* Records every call's callee for check_calls. */
static void collect_calls_expr(P *p, const JExpr *e);
static void collect_calls_body(P *p, const JBody *b);

static void collect_calls_expr(P *p, const JExpr *e)
{
    if (!e) return;
    if (e->kind == JE_CALL) {
        if (e->a->kind == JE_NAME) {
            add_call(p, e->a->sym, NULL, e->line);
            /* namespace(f=...) / dict(f=...): x.f() may call what they hold */
            const char *callee = p->prog->syms[e->a->sym];
            if (!strcmp(callee, "namespace") || !strcmp(callee, "dict"))
                for (size_t k = 0; k < e->nkw; k++) p->assigned[e->kwsym[k]] = true;
        }
        else if (e->a->kind == JE_ATTR) add_call(p, -1, e->a->name, e->line);
    }
    collect_calls_expr(p, e->a);
    collect_calls_expr(p, e->b);
    collect_calls_expr(p, e->c);
    collect_calls_expr(p, e->d);
    for (size_t k = 0; k < e->nargs; k++) collect_calls_expr(p, e->args[k]);
    for (size_t k = 0; k < e->nkw; k++) collect_calls_expr(p, e->kwargs[k]);
}

static void collect_calls_body(P *p, const JBody *b)
{
    for (size_t k = 0; k < b->n; k++) {
        const JNode *n = b->v[k];
        collect_calls_expr(p, n->expr);
        collect_calls_expr(p, n->cond);
        collect_calls_expr(p, n->filter);
        for (size_t j = 0; j < n->sig.nparams; j++) collect_calls_expr(p, n->sig.defaults[j]);
        for (size_t j = 0; j < n->nwith; j++) collect_calls_expr(p, n->values[j]);
        collect_calls_body(p, &n->body);
        collect_calls_body(p, &n->else_body);
    }
}

int jparse(JProgram *prog, const char *src, size_t n, char *err, size_t errlen)
{
    memset(prog, 0, sizeof *prog);
    prog->arena = jarena_new(0);
    P *p = jarena_zalloc(prog->arena, sizeof *p);
    p->prog = prog;
    p->a = prog->arena;
    p->err = err;
    p->errlen = errlen;
    if (jlex(p->a, src, n, &p->t, &p->nt, err, errlen)) {
        jprogram_free(prog);
        return -1;
    }
    if (setjmp(p->jb)) {
        jprogram_free(prog);
        return -1;
    }
    prog->sym_loop = intern(p, "loop", 4);
    prog->sym_caller = intern(p, "caller", 6);
    prog->sym_varargs = intern(p, "varargs", 7);
    prog->sym_kwargs = intern(p, "kwargs", 6);
    prog->body = subparse(p, NULL);
    if (cur(p)->type != JT_EOF) pfail(p, cur(p)->line, "unexpected tokens after the template");
    collect_calls_body(p, &prog->body);
    check_calls(p);
    return 0;
}

void jprogram_free(JProgram *prog)
{
    if (!prog) return;
    jarena_free(prog->arena);
    memset(prog, 0, sizeof *prog);
}

int jprogram_sym(const JProgram *prog, const char *name, size_t n)
{
    for (size_t k = 0; k < prog->nsyms; k++)
        if (strlen(prog->syms[k]) == n && memcmp(prog->syms[k], name, n) == 0) return (int)k;
    return -1;
}

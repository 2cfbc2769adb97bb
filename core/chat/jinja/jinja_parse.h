/* core/chat/jinja/jinja_parse.h - the Jinja parser and the syntax tree it builds.
 *
 * The grammar is jinja2's (parser.py, 3.1), operator precedence from low to
 * high: "a if c else b", or, and, not, comparisons (== != < <= > >= in, not
 * in; chained as in Python), + -, ~, * / // %, **, unary - +, then postfix
 * .attr [key] [a:b:c] (call) and the filter / test chain (| f(args),
 * is [not] t args).
 *
 * Statements: for (targets, "if" filter, else, loop.*), if/elif/else, set
 * (name, tuple, ns.attr, block form), macro, call, filter, with, raw,
 * break/continue (jinja2.ext.loopcontrols, which transformers enables),
 * generation (transformers' AssistantTracker extension: its body renders in
 * place), print.
 *
 * Everything else is refused while parsing, with the line: unknown tags
 * (include, extends, block, import, do, autoescape ...), filters, tests,
 * methods and functions that the evaluator does not implement.  A call is
 * accepted when its callee is a supported global (range, namespace, dict,
 * raise_exception, strftime_now), a macro of the template, caller, or a name
 * the template assigns (whose value is then checked when it runs).
 */
#ifndef TANDEM_CORE_CHAT_JINJA_JINJA_PARSE_H
#define TANDEM_CORE_CHAT_JINJA_JINJA_PARSE_H

#include "core/chat/jinja/jinja_value.h"

typedef enum {
    JE_CONST,    /* cval */
    JE_NAME,     /* sym */
    JE_ATTR,     /* a.name */
    JE_ITEM,     /* a[b] */
    JE_SLICE,    /* a[b:c:d], absent parts NULL */
    JE_CALL,     /* a(args, kw=...) */
    JE_FILTER,   /* a | id(args); a NULL for the body of a filter/set block */
    JE_TEST,     /* a is id(args) */
    JE_BIN,      /* a op b: JOP_ADD, SUB, MUL, DIV, FLOORDIV, MOD, POW */
    JE_CONCAT,   /* args[0] ~ args[1] ~ ... */
    JE_CMP,      /* a (ops[i] args[i])...: chained comparison */
    JE_AND,
    JE_OR,
    JE_NOT,
    JE_NEG,
    JE_POS,
    JE_COND,     /* b if a else c (c may be NULL) */
    JE_LIST,     /* args */
    JE_TUPLE,    /* args */
    JE_DICT,     /* args: key, value, key, value ... */
    JE_NSREF,    /* sym.name: only as a set target */
} JExprKind;

/* Comparison operators of JE_CMP. */
enum { JCMP_EQ, JCMP_NE, JCMP_LT, JCMP_LE, JCMP_GT, JCMP_GE, JCMP_IN, JCMP_NOTIN };

typedef struct JExpr JExpr;
struct JExpr {
    uint8_t kind;        /* JExprKind */
    uint8_t op;          /* JE_BIN: JOp */
    uint16_t id;         /* JE_FILTER / JE_TEST: builtin id */
    uint16_t depth;      /* 1 + the deepest operand (bounded while parsing) */
    int line;
    int sym;             /* JE_NAME, JE_NSREF */
    const JStr *name;    /* JE_ATTR, JE_NSREF: attribute */
    Jv cval;             /* JE_CONST */
    JExpr *a, *b, *c, *d;
    JExpr **args;        /* positional arguments / items / operands */
    size_t nargs;
    uint8_t *ops;        /* JE_CMP: one per operand */
    int *kwsym;          /* keyword argument names (symbols) */
    JExpr **kwargs;
    size_t nkw;
};

typedef enum {
    JN_TEXT,       /* text */
    JN_OUTPUT,     /* {{ expr }} */
    JN_IF,         /* expr, body, else_body (elif: a JN_IF alone in else_body) */
    JN_FOR,        /* target in expr [if cond], body, else_body */
    JN_SET,        /* target = expr */
    JN_SET_BLOCK,  /* target (| filter) = rendered body */
    JN_MACRO,      /* name, params, body */
    JN_CALL_BLOCK, /* call(params) expr, body is the caller */
    JN_FILTER,     /* filter chain (expr, innermost a NULL) over the body */
    JN_WITH,       /* targets = values, body */
    JN_BREAK,
    JN_CONTINUE,
    JN_SCOPE,      /* body in its own scope: {% generation %} */
} JNodeKind;

typedef struct JNode JNode;
typedef struct JBody {
    JNode **v;
    size_t n;
} JBody;

/* A macro's (or a call block's caller's) signature. */
typedef struct JSig {
    const char *name;    /* "caller" for a call block */
    int *params;         /* symbols */
    JExpr **defaults;    /* NULL where none */
    size_t nparams;
    bool catch_varargs, catch_kwargs, catch_caller;
} JSig;

struct JNode {
    uint8_t kind;        /* JNodeKind */
    int line;
    const JStr *text;    /* JN_TEXT */
    JExpr *expr;
    JExpr *target;       /* JN_FOR, JN_SET, JN_SET_BLOCK */
    JExpr *cond;         /* JN_FOR: "if" filter */
    JExpr *filter;       /* JN_SET_BLOCK (may be NULL), JN_FILTER */
    JBody body, else_body;
    JSig sig;            /* JN_MACRO, JN_CALL_BLOCK */
    int sym;             /* JN_MACRO: its name */
    JExpr **targets, **values; /* JN_WITH */
    size_t nwith;
};

/* A parsed template: the root body, its symbol table and the arena that
 * holds all of it. */
typedef struct JProgram {
    JArena *arena;
    JBody body;
    const char **syms;   /* symbol i's name */
    size_t nsyms;
    /* symbols the evaluator needs: loop, caller, varargs, kwargs */
    int sym_loop, sym_caller, sym_varargs, sym_kwargs;
} JProgram;

/* Parses a template.  Returns 0 and fills *prog (its arena owns everything;
 * jprogram_free releases it), or -1 with "line L: what" in err. */
int jparse(JProgram *prog, const char *src, size_t n, char *err, size_t errlen);
void jprogram_free(JProgram *prog);
/* Symbol of name in prog, or -1 when the template never mentions it. */
int jprogram_sym(const JProgram *prog, const char *name, size_t n);

#endif

/* core/chat/jinja/jinja_eval.h - the evaluator of a parsed template (internal to
 * core/chat/; the public API is jinja.h).
 *
 * Semantics are jinja2 3.1's in an ImmutableSandboxedEnvironment with the
 * default Undefined:
 *   - scopes: the context (variables passed in) < the template's top level
 *     < each for-loop iteration, macro call, call/filter/set block, with
 *     and generation block.  {% set %} binds in the innermost scope, so a set
 *     inside a loop is gone at the next iteration and after the loop
 *     (namespace() is how templates carry state out); if/elif/else open no
 *     scope;
 *   - Undefined prints as '', is false, iterates as empty, has length 0,
 *     and ~ treats it as ''; arithmetic on it, comparing it with <, taking an
 *     attribute or item of it, or calling it raises "'x' is undefined" (or
 *     "'dict object' has no attribute 'x'");
 *   - x.name looks up a method of x's Python type first, then x['name'];
 *     x['name'] the other way round; a missing one is Undefined;
 *   - the sandbox's limits: range() of more than 100000 items is refused,
 *     and nothing mutates a list or dict.
 * Runtime errors (raise_exception, a type error, a limit) unwind with
 * longjmp to jinja_render, which returns the message; all memory is in the
 * render's arena.
 */
#ifndef TANDEM_CORE_CHAT_JINJA_JINJA_EVAL_H
#define TANDEM_CORE_CHAT_JINJA_JINJA_EVAL_H

#include "core/chat/jinja/jinja_parse.h"
#include "core/chat/jinja/jinja_value.h"

#include <setjmp.h>

typedef struct JScope JScope;

/* A macro value (also a call block's caller).  Starts with its name, as
 * JMacroHead. */
typedef struct JMacro {
    const char *name;
    const JSig *sig;
    const JBody *body;
    JScope *closure;     /* the scope it was defined in */
} JMacro;

/* The loop object of one for-loop iteration.  Starts as JLoopHead. */
typedef struct JLoop {
    int64_t index0, length;
    const Jv *items;     /* the (filtered) items, for previtem / nextitem */
    int64_t depth0;
    Jv *changed_last;    /* loop.changed() state, shared by the iterations */
} JLoop;

/* A bound method: self and the method id in the Jv's id. */
typedef struct JBound {
    Jv self;
} JBound;

/* Evaluated call arguments; keyword names are program symbols. */
typedef struct JArgs {
    const Jv *pos;
    size_t npos;
    const int *kwsym;
    const Jv *kw;
    size_t nkw;
} JArgs;

typedef struct JRender {
    const JProgram *prog;
    JArena *a;
    jmp_buf jb;
    char err[512];
    JScope *ctx;         /* variables passed in and the globals */
    JBuf *out;           /* where output goes now */
    uint64_t steps, max_steps;
    int depth, max_depth;          /* evaluator frames */
    int calls, max_calls;          /* nested macro calls */
    int line;                      /* line being executed, for messages */
    bool hard;                     /* the error being raised is a limit: never deferred */
    int64_t now;                   /* strftime_now's clock (seconds since the epoch), < 0: real time */
    Jv blockval;                   /* a filter block's rendered body */
} JRender;

/* Aborts the render with a message (prefixed with the line). */
void jr_fail(JRender *r, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* Aborts with msg as it is (no line prefix). */
void jr_raise(JRender *r, const char *msg) __attribute__((noreturn));
/* Raises the error jinja2 raises when the undefined v is used. */
void jr_fail_undef(JRender *r, Jv v) __attribute__((noreturn));
/* Charges units of work (a loop iteration, a call, 64 bytes scanned)
 * against the step limit. */
void jr_work(JRender *r, uint64_t units);

/* obj.name and obj[key] with jinja2's sandbox rules. */
Jv jr_getattr(JRender *r, Jv obj, const char *name, size_t n);
Jv jr_getitem(JRender *r, Jv obj, Jv key);
/* The items Python's iter(v) yields (a string's characters, a dict's
 * keys, nothing for Undefined); TypeError for what is not iterable. */
const JList *jr_iter(JRender *r, Jv v);
/* Calls a macro, bound method or global function. */
Jv jr_call(JRender *r, Jv fn, const JArgs *args);
/* Name of keyword argument k. */
const char *jr_kwname(const JRender *r, const JArgs *args, size_t k);

/* Renders prog's body with ctx's variables into out.  Returns 0, or -1 with
 * the message in r->err.  The caller sets up r (prog, a, ctx, limits). */
int jr_render(JRender *r, JBuf *out);

/* The context scope: variables the template reads by name. */
JScope *jscope_new(JRender *r, JScope *parent);
void jscope_set(JRender *r, JScope *s, int sym, Jv v);

#endif

/* core/chat/jinja/jinja.c - compile and render (see jinja.h): the parser, the
 * variables and the globals handed to the evaluator. */
#include "core/chat/jinja/jinja.h"
#include "core/chat/jinja/jinja_builtins.h"
#include "core/chat/jinja/jinja_eval.h"
#include "core/chat/jinja/jinja_parse.h"
#include "core/common.h"

#include <stdio.h>
#include <string.h>

struct JinjaTemplate {
    JProgram prog;
};

void jinja_limits_default(JinjaLimits *lim)
{
    lim->max_output = 32u << 20;
    lim->max_memory = 256u << 20;
    lim->max_steps = 50u * 1000 * 1000;
    lim->max_depth = 2000;
    lim->max_calls = 40;
    lim->now = -1;
}

int jinja_compile(JinjaTemplate **out, const char *src, size_t n, char *err, size_t errlen)
{
    *out = NULL;
    JinjaTemplate *t = td_calloc(sizeof *t);
    if (jparse(&t->prog, src, n, err, errlen)) {
        td_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void jinja_free(JinjaTemplate *t)
{
    if (!t) return;
    jprogram_free(&t->prog);
    td_free(t);
}

int jinja_render_values(const JinjaTemplate *t, Jv vars, const JinjaLimits *lim, char **out, size_t *out_len,
                        char *err, size_t errlen)
{
    JinjaLimits dl;
    if (!lim) {
        jinja_limits_default(&dl);
        lim = &dl;
    }
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars.t != JV_DICT) {
        snprintf(err, errlen, "template variables must be an object");
        return -1;
    }
    JRender *r = td_calloc(sizeof *r);
    r->prog = &t->prog;
    r->a = jarena_new(lim->max_memory);
    r->max_steps = lim->max_steps;
    r->max_depth = lim->max_depth;
    r->max_calls = lim->max_calls;
    r->now = lim->now;
    /* the globals, then the variables (which shadow them, as jinja2's
     * context does) */
    JScope *globals = jscope_new(r, NULL);
    static const char *const funcs[] = { "range", "namespace", "dict", "raise_exception", "strftime_now" };
    for (size_t k = 0; k < sizeof funcs / sizeof *funcs; k++) {
        int sym = jprogram_sym(&t->prog, funcs[k], strlen(funcs[k]));
        if (sym < 0) continue;
        Jv f = { .t = JV_FUNC, .id = (uint16_t)jbi_func_id(funcs[k], strlen(funcs[k])) };
        jscope_set(r, globals, sym, f);
    }
    r->ctx = jscope_new(r, globals);
    for (size_t k = 0; k < vars.u.d->n; k++) {
        const JEntry *e = &vars.u.d->e[k];
        if (e->k.t != JV_STR) continue;
        int sym = jprogram_sym(&t->prog, e->k.u.s->s, e->k.u.s->n);
        if (sym >= 0) jscope_set(r, r->ctx, sym, e->v);
    }
    JBuf buf;
    jbuf_init(&buf, r->a, lim->max_output);
    int rc = jr_render(r, &buf);
    if (rc == 0) {
        char *s = td_malloc(buf.n + 1);
        if (buf.n) memcpy(s, buf.p, buf.n);
        s[buf.n] = 0;
        *out = s;
        if (out_len) *out_len = buf.n;
    } else {
        snprintf(err, errlen, "%s", r->err);
    }
    jarena_free(r->a);
    td_free(r);
    return rc;
}

int jinja_render(const JinjaTemplate *t, const struct cJSON *vars, const JinjaLimits *lim, char **out,
                 size_t *out_len, char *err, size_t errlen)
{
    JArena *in = jarena_new(0);
    Jv v = vars ? jv_from_cjson(in, vars) : jv_dict(in);
    int rc = jinja_render_values(t, v, lim, out, out_len, err, errlen);
    jarena_free(in);
    return rc;
}

int jinja_render_json(const JinjaTemplate *t, const char *vars_json, size_t n, const JinjaLimits *lim, char **out,
                      size_t *out_len, char *err, size_t errlen)
{
    JArena *in = jarena_new(0);
    Jv v;
    int rc = -1;
    *out = NULL;
    if (jv_parse_json(in, vars_json, n, &v, err, errlen) == 0)
        rc = jinja_render_values(t, v, lim, out, out_len, err, errlen);
    jarena_free(in);
    return rc;
}

/* core/chat/chat.c - tokenizer_config.json's chat template, validated
 * messages, and the variables transformers passes (see chat.h). */
#include "core/chat/chat.h"
#include "core/common.h"

#include <stdio.h>
#include <string.h>

#define CHAT_MAX_TEMPLATES 16

static const char *const SPECIAL[] = { "bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token" };
#define N_SPECIAL (sizeof SPECIAL / sizeof *SPECIAL)

struct ChatTemplate {
    JArena *a;                               /* the special tokens' values */
    size_t n;
    char *names[CHAT_MAX_TEMPLATES];         /* NULL for a single template */
    JinjaTemplate *tpl[CHAT_MAX_TEMPLATES];
    Jv special[N_SPECIAL];                   /* JV_UNDEF when not set */
    Jv additional;                           /* list of strings or JV_UNDEF */
};

static const char *jstr_or_null(Jv v) { return v.t == JV_STR ? v.u.s->s : NULL; }

const char *chat_template_bos(const ChatTemplate *ct) { return jstr_or_null(ct->special[0]); }
const char *chat_template_eos(const ChatTemplate *ct) { return jstr_or_null(ct->special[1]); }

void chat_template_free(ChatTemplate *ct)
{
    if (!ct) return;
    for (size_t k = 0; k < ct->n; k++) {
        jinja_free(ct->tpl[k]);
        td_free(ct->names[k]);
    }
    jarena_free(ct->a);
    td_free(ct);
}

/* A token field: a string, an AddedToken {"content": ...}, or null. */
static int token_text(Jv v, const char *field, Jv *out, char *err, size_t errlen)
{
    *out = jv_undef0();
    if (v.t == JV_UNDEF || v.t == JV_NONE) return 0;
    if (v.t == JV_DICT) {
        JEntry *c = jdict_get_str(v.u.d, "content", 7);
        if (!c || c->v.t != JV_STR) {
            snprintf(err, errlen, "tokenizer_config.json: %s is an object without a string 'content'", field);
            return -1;
        }
        v = c->v;
    }
    if (v.t != JV_STR) {
        snprintf(err, errlen, "tokenizer_config.json: %s must be a string or an AddedToken object", field);
        return -1;
    }
    if (v.u.s->n) *out = v; /* transformers keeps only truthy ones */
    return 0;
}

static int add_template(ChatTemplate *ct, const char *name, Jv src, char *err, size_t errlen)
{
    if (ct->n == CHAT_MAX_TEMPLATES) {
        snprintf(err, errlen, "tokenizer_config.json: more than %d chat templates", CHAT_MAX_TEMPLATES);
        return -1;
    }
    if (src.t != JV_STR) {
        snprintf(err, errlen, "tokenizer_config.json: chat_template%s%s%s must be a string", name ? " '" : "",
                 name ? name : "", name ? "'" : "");
        return -1;
    }
    char cerr[400];
    if (jinja_compile(&ct->tpl[ct->n], src.u.s->s, src.u.s->n, cerr, sizeof cerr)) {
        snprintf(err, errlen, "chat template%s%s%s: %s", name ? " '" : "", name ? name : "", name ? "'" : "", cerr);
        return -1;
    }
    ct->names[ct->n] = name ? td_strdup(name) : NULL;
    ct->n++;
    return 0;
}

int chat_template_load(ChatTemplate **out, const char *config_json, size_t n, char *err, size_t errlen)
{
    *out = NULL;
    ChatTemplate *ct = td_calloc(sizeof *ct);
    ct->a = jarena_new(0);
    Jv cfg;
    char jerr[200];
    if (jv_parse_json(ct->a, config_json, n, &cfg, jerr, sizeof jerr)) {
        snprintf(err, errlen, "tokenizer_config.json: %s", jerr);
        goto fail;
    }
    if (cfg.t != JV_DICT) {
        snprintf(err, errlen, "tokenizer_config.json: not a JSON object");
        goto fail;
    }
    JEntry *e = jdict_get_str(cfg.u.d, "chat_template", 13);
    if (!e || e->v.t == JV_NONE) {
        snprintf(err, errlen, "tokenizer_config.json has no chat_template");
        goto fail;
    }
    if (e->v.t == JV_LIST) {
        for (size_t k = 0; k < e->v.u.l->n; k++) {
            Jv item = e->v.u.l->v[k];
            JEntry *nm = item.t == JV_DICT ? jdict_get_str(item.u.d, "name", 4) : NULL;
            JEntry *tp = item.t == JV_DICT ? jdict_get_str(item.u.d, "template", 8) : NULL;
            if (!nm || nm->v.t != JV_STR || !tp) {
                snprintf(err, errlen, "tokenizer_config.json: chat_template[%zu] must be {\"name\": str, \"template\": str}", k);
                goto fail;
            }
            if (add_template(ct, nm->v.u.s->s, tp->v, err, errlen)) goto fail;
        }
        if (ct->n == 0) {
            snprintf(err, errlen, "tokenizer_config.json: chat_template is an empty list");
            goto fail;
        }
    } else if (add_template(ct, NULL, e->v, err, errlen)) {
        goto fail;
    }
    for (size_t k = 0; k < N_SPECIAL; k++) {
        JEntry *t = jdict_get_str(cfg.u.d, SPECIAL[k], strlen(SPECIAL[k]));
        if (token_text(t ? t->v : jv_undef0(), SPECIAL[k], &ct->special[k], err, errlen)) goto fail;
    }
    ct->additional = jv_undef0();
    JEntry *add = jdict_get_str(cfg.u.d, "additional_special_tokens", 25);
    if (add && add->v.t == JV_LIST && add->v.u.l->n) {
        Jv l = jv_list(ct->a, add->v.u.l->n);
        for (size_t k = 0; k < l.u.l->n; k++) {
            Jv tok;
            if (token_text(add->v.u.l->v[k], "additional_special_tokens", &tok, err, errlen)) goto fail;
            l.u.l->v[k] = tok.t == JV_STR ? tok : jv_str(ct->a, "", 0);
        }
        ct->additional = l;
    } else if (add && add->v.t != JV_LIST && add->v.t != JV_NONE) {
        snprintf(err, errlen, "tokenizer_config.json: additional_special_tokens must be a list");
        goto fail;
    }
    *out = ct;
    return 0;
fail:
    chat_template_free(ct);
    return -1;
}

/* ---------------------------------------------------------------- validation */

static int check_messages(Jv messages, char *err, size_t errlen)
{
    if (messages.t != JV_LIST) {
        snprintf(err, errlen, "messages must be a list of message objects");
        return -1;
    }
    for (size_t i = 0; i < messages.u.l->n; i++) {
        Jv m = messages.u.l->v[i];
        if (m.t != JV_DICT) {
            snprintf(err, errlen, "messages[%zu] must be an object", i);
            return -1;
        }
        JEntry *role = jdict_get_str(m.u.d, "role", 4);
        if (!role) {
            snprintf(err, errlen, "messages[%zu] has no 'role'", i);
            return -1;
        }
        if (role->v.t != JV_STR) {
            snprintf(err, errlen, "messages[%zu]: 'role' must be a string", i);
            return -1;
        }
        JEntry *c = jdict_get_str(m.u.d, "content", 7);
        if (c && c->v.t != JV_STR && c->v.t != JV_NONE) {
            if (c->v.t != JV_LIST) {
                snprintf(err, errlen, "messages[%zu]: 'content' must be a string, null or a list of parts", i);
                return -1;
            }
            for (size_t k = 0; k < c->v.u.l->n; k++) {
                Jv part = c->v.u.l->v[k];
                JEntry *type = part.t == JV_DICT ? jdict_get_str(part.u.d, "type", 4) : NULL;
                if (!type || type->v.t != JV_STR) {
                    snprintf(err, errlen, "messages[%zu].content[%zu] must be an object with a string 'type'", i, k);
                    return -1;
                }
                if (type->v.u.s->n == 4 && !memcmp(type->v.u.s->s, "text", 4)) {
                    JEntry *text = jdict_get_str(part.u.d, "text", 4);
                    if (!text || text->v.t != JV_STR) {
                        snprintf(err, errlen, "messages[%zu].content[%zu] is a text part without a string 'text'", i, k);
                        return -1;
                    }
                }
            }
        }
        JEntry *tc = jdict_get_str(m.u.d, "tool_calls", 10);
        if (tc && tc->v.t != JV_LIST && tc->v.t != JV_NONE) {
            snprintf(err, errlen, "messages[%zu]: 'tool_calls' must be a list", i);
            return -1;
        }
    }
    return 0;
}

static int check_tools(Jv tools, char *err, size_t errlen)
{
    if (tools.t == JV_UNDEF || tools.t == JV_NONE) return 0;
    if (tools.t != JV_LIST) {
        snprintf(err, errlen, "tools must be a list of objects");
        return -1;
    }
    for (size_t k = 0; k < tools.u.l->n; k++) {
        if (tools.u.l->v[k].t != JV_DICT) {
            snprintf(err, errlen, "tools[%zu] must be an object", k);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- rendering */

static int render(const ChatTemplate *ct, JArena *a, Jv messages, Jv tools, Jv kwargs, bool agp,
                  const JinjaLimits *lim, char **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (check_messages(messages, err, errlen) || check_tools(tools, err, errlen)) return -1;
    if (kwargs.t != JV_UNDEF && kwargs.t != JV_NONE && kwargs.t != JV_DICT) {
        snprintf(err, errlen, "chat_template_kwargs must be an object");
        return -1;
    }
    bool has_tools = tools.t != JV_UNDEF && tools.t != JV_NONE;
    const JinjaTemplate *tpl = NULL;
    if (ct->n == 1 && !ct->names[0]) {
        tpl = ct->tpl[0];
    } else {
        const JinjaTemplate *dflt = NULL, *tool_use = NULL;
        for (size_t k = 0; k < ct->n; k++) {
            if (!strcmp(ct->names[k], "default")) dflt = ct->tpl[k];
            if (!strcmp(ct->names[k], "tool_use")) tool_use = ct->tpl[k];
        }
        tpl = has_tools && tool_use ? tool_use : dflt;
        if (!tpl) {
            snprintf(err, errlen, "tokenizer_config.json has several chat templates and none is named 'default'");
            return -1;
        }
    }
    Jv vars = jv_dict(a);
    for (size_t k = 0; k < N_SPECIAL; k++)
        if (ct->special[k].t == JV_STR) jdict_set(a, vars.u.d, jv_cstr(a, SPECIAL[k]), ct->special[k]);
    if (ct->additional.t == JV_LIST) jdict_set(a, vars.u.d, jv_cstr(a, "additional_special_tokens"), ct->additional);
    if (kwargs.t == JV_DICT) {
        static const char *const fixed[] = { "messages", "tools", "documents", "add_generation_prompt" };
        for (size_t k = 0; k < kwargs.u.d->n; k++) {
            Jv key = kwargs.u.d->e[k].k;
            for (size_t f = 0; f < sizeof fixed / sizeof *fixed; f++) {
                if (key.t == JV_STR && !strcmp(key.u.s->s, fixed[f])) {
                    snprintf(err, errlen, "chat_template_kwargs may not set '%s'", fixed[f]);
                    return -1;
                }
            }
            jdict_set(a, vars.u.d, key, kwargs.u.d->e[k].v);
        }
    }
    jdict_set(a, vars.u.d, jv_cstr(a, "messages"), messages);
    jdict_set(a, vars.u.d, jv_cstr(a, "tools"), has_tools ? tools : jv_none());
    jdict_set(a, vars.u.d, jv_cstr(a, "documents"), jv_none());
    jdict_set(a, vars.u.d, jv_cstr(a, "add_generation_prompt"), jv_bool(agp));
    char rerr[512];
    if (jinja_render_values(tpl, vars, lim, out, out_len, rerr, sizeof rerr)) {
        snprintf(err, errlen, "chat template: %s", rerr);
        return -1;
    }
    return 0;
}

int chat_template_render_json(const ChatTemplate *ct, const char *json, size_t n, bool add_generation_prompt,
                              const JinjaLimits *lim, char **out, size_t *out_len, char *err, size_t errlen)
{
    JArena *a = jarena_new(0);
    Jv doc, messages, tools = jv_undef0(), kwargs = jv_undef0();
    int rc = -1;
    *out = NULL;
    char jerr[200];
    if (jv_parse_json(a, json, n, &doc, jerr, sizeof jerr)) {
        snprintf(err, errlen, "messages: %s", jerr);
        goto done;
    }
    if (doc.t == JV_DICT) {
        JEntry *m = jdict_get_str(doc.u.d, "messages", 8);
        if (!m) {
            snprintf(err, errlen, "the request has no 'messages'");
            goto done;
        }
        messages = m->v;
        JEntry *t = jdict_get_str(doc.u.d, "tools", 5);
        if (t) tools = t->v;
        JEntry *k = jdict_get_str(doc.u.d, "chat_template_kwargs", 20);
        if (k) kwargs = k->v;
        JEntry *g = jdict_get_str(doc.u.d, "add_generation_prompt", 21);
        if (g) {
            if (g->v.t != JV_BOOL) {
                snprintf(err, errlen, "add_generation_prompt must be true or false");
                goto done;
            }
            add_generation_prompt = g->v.u.b;
        }
    } else {
        messages = doc;
    }
    rc = render(ct, a, messages, tools, kwargs, add_generation_prompt, lim, out, out_len, err, errlen);
done:
    jarena_free(a);
    return rc;
}

int chat_template_render_cjson(const ChatTemplate *ct, const struct cJSON *messages, const struct cJSON *tools,
                               const struct cJSON *kwargs, bool add_generation_prompt, const JinjaLimits *lim,
                               char **out, size_t *out_len, char *err, size_t errlen)
{
    JArena *a = jarena_new(0);
    Jv m = jv_from_cjson(a, messages);
    Jv t = tools ? jv_from_cjson(a, tools) : jv_undef0();
    Jv k = kwargs ? jv_from_cjson(a, kwargs) : jv_undef0();
    int rc = render(ct, a, m, t, k, add_generation_prompt, lim, out, out_len, err, errlen);
    jarena_free(a);
    return rc;
}

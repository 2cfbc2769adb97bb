/* tests/test_chat.c - the Jinja interpreter and the chat-template layer
 * (core/chat/).
 *
 * Language features, one suite test per group, each case compared byte for
 * byte with Python's jinja2 in transformers' configuration: the cases and
 * jinja2's outputs come from chat_cases.json, written by
 * tests/ref/fixtures_chat.py.  Then what jinja2 cannot tell us: what is
 * refused at load (naming the construct and its line), the hard limits, and
 * the chat layer's template selection, special tokens and message checks. */
#include "core/chat/chat.h"
#include "core/chat/jinja/jinja.h"
#include "core/common.h"
#include "tests/fixture.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The clock fixtures_chat.py pins strftime_now to. */
#define FIXTURE_NOW 1700000000

static char *slurp(const char *path, size_t *n)
{
    char *buf = NULL, err[1200];
    return td_read_file(path, 0, &buf, n, err, sizeof err) ? NULL : buf;
}

static cJSON *load_cases(void)
{
    const char *path = fixture_path("chat_cases.json");
    char *text = slurp(path, NULL);
    cr_assert(text, "fixture %s missing: run /usr/bin/python3 tests/ref/fixtures_chat.py --out %s", path,
              fixture_dir());
    cJSON *j = cJSON_Parse(text);
    td_free(text);
    cr_assert(j, "fixture %s is not JSON", path);
    return j;
}

/* Prints a string with escapes, for failure messages. */
static const char *show(const char *s, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') o += (size_t)snprintf(buf + o, cap - o, "\\n");
        else if (c == '\t') o += (size_t)snprintf(buf + o, cap - o, "\\t");
        else if (c < 0x20) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

/* Renders every case of a group and compares with jinja2; returns the
 * number of cases compared. */
static int run_group(const char *group)
{
    cJSON *all = load_cases();
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(all, group);
    cr_assert(cJSON_IsArray(cases), "chat_cases.json has no group %s", group);
    int n = 0;
    JinjaLimits lim;
    jinja_limits_default(&lim);
    lim.now = FIXTURE_NOW;
    for (const cJSON *c = cases->child; c; c = c->next, n++) {
        const char *tpl = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        const char *vars = cJSON_GetObjectItemCaseSensitive(c, "vars")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "out");
        const cJSON *cerr = cJSON_GetObjectItemCaseSensitive(c, "compile_error");
        const cJSON *rerr = cJSON_GetObjectItemCaseSensitive(c, "render_error");
        bool raised = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "raised"));
        char err[600], b1[2048], b2[2048], b3[2048];
        JinjaTemplate *t = NULL;
        int rc = jinja_compile(&t, tpl, strlen(tpl), err, sizeof err);
        if (cerr) {
            cr_expect(rc != 0, "[%s %d] jinja2 refuses %s (%s) but tandem compiled it", group, n,
                      show(tpl, strlen(tpl), b1, sizeof b1), cerr->valuestring);
            jinja_free(t);
            continue;
        }
        if (rc) {
            /* refusing at load what jinja2 refuses when it runs is by design
             * (unknown functions, filter and test names) */
            cr_expect(rerr != NULL, "[%s %d] tandem refuses %s: %s", group, n, show(tpl, strlen(tpl), b1, sizeof b1), err);
            continue;
        }
        char *out = NULL;
        size_t on = 0;
        rc = jinja_render_json(t, vars, strlen(vars), &lim, &out, &on, err, sizeof err);
        if (rerr) {
            cr_expect(rc != 0, "[%s %d] jinja2 raises for %s (%s) but tandem gave '%s'", group, n,
                      show(tpl, strlen(tpl), b1, sizeof b1), rerr->valuestring,
                      rc ? "" : show(out, on, b2, sizeof b2));
            if (rc && raised)
                cr_expect_str_eq(err, rerr->valuestring, "[%s %d] raise_exception's message", group, n);
        } else {
            const char *w = want->valuestring;
            if (rc) {
                cr_expect(false, "[%s %d] %s: tandem fails (%s), jinja2 gives '%s'", group, n,
                          show(tpl, strlen(tpl), b1, sizeof b1), err, show(w, strlen(w), b2, sizeof b2));
            } else {
                bool same = on == strlen(w) && memcmp(out, w, on) == 0;
                cr_expect(same, "[%s %d] %s\n  tandem: '%s'\n  jinja2: '%s'", group, n,
                          show(tpl, strlen(tpl), b1, sizeof b1), show(out, on, b2, sizeof b2),
                          show(w, strlen(w), b3, sizeof b3));
            }
        }
        td_free(out);
        jinja_free(t);
    }
    cJSON_Delete(all);
    return n;
}

TestSuite(chat);

#define GROUP_TEST(g)                                                               \
    Test(chat, g)                                                                   \
    {                                                                               \
        int n = run_group(#g);                                                      \
        cr_expect(n >= 5, "group " #g " has only %d cases", n);                     \
        EXPECT_NO_LEAKS();                                                          \
    }

GROUP_TEST(whitespace)
GROUP_TEST(literals)
GROUP_TEST(operators)
GROUP_TEST(access)
GROUP_TEST(loops)
GROUP_TEST(scoping)
GROUP_TEST(macros)
GROUP_TEST(filters)
GROUP_TEST(tests)
GROUP_TEST(strings)
GROUP_TEST(tojson)
GROUP_TEST(undefined)
GROUP_TEST(globals)

/* ---------------------------------------------------------------- refusals */

static void expect_compile_error(const char *tpl, const char *want)
{
    JinjaTemplate *t = NULL;
    char err[600];
    int rc = jinja_compile(&t, tpl, strlen(tpl), err, sizeof err);
    cr_expect(rc != 0, "compiled %s, wanted the error '%s'", tpl, want);
    if (rc) cr_expect(strstr(err, want) != NULL, "%s: error '%s' does not say '%s'", tpl, err, want);
    cr_expect(t == NULL);
    jinja_free(t);
}

Test(chat, unsupported_constructs_are_refused_at_load_with_their_line)
{
    expect_compile_error("a\n{% include 'x.j2' %}", "line 2: unsupported tag 'include'");
    expect_compile_error("{% extends 'base' %}", "line 1: unsupported tag 'extends'");
    expect_compile_error("{% do x %}", "unsupported tag 'do'");
    expect_compile_error("{% block b %}{% endblock %}", "unsupported tag 'block'");
    expect_compile_error("\n\n{{ x|wordwrap(5) }}", "line 3: unsupported filter 'wordwrap'");
    expect_compile_error("{% if x is prime %}{% endif %}", "line 1: unsupported test 'prime'");
    expect_compile_error("{{ x.encode() }}", "unsupported method '.encode()'");
    expect_compile_error("{{ x.frobnicate(1) }}", "unsupported method '.frobnicate()'");
    expect_compile_error("{% if false %}{{ lipsum(2) }}{% endif %}", "unsupported function 'lipsum'");
    expect_compile_error("{{ len(messages) }}", "unsupported function 'len'");
    expect_compile_error("{% for x in xs recursive %}{% endfor %}", "unsupported recursive for loop");
    expect_compile_error("{{ xs|map('nosuch')|list }}", "unsupported filter 'nosuch'");
    expect_compile_error("{{ xs|selectattr('a', 'nosuch') }}", "unsupported test 'nosuch'");
    expect_compile_error("{{ f(*args) }}", "unsupported *args");
    /* found by fuzz_chat: the slice's object was left unset (a NULL deref at render) */
    expect_compile_error("{{ xs[::b, 1] }}", "a slice inside a subscript of several parts");
    expect_compile_error("{{ xs[0, 1:2] }}", "a slice inside a subscript of several parts");
    /* syntax errors */
    expect_compile_error("{% if x %}", "unexpected end of template");
    expect_compile_error("{% endif %}", "unexpected 'endif'");
    expect_compile_error("{{ 'unterminated }}", "unterminated string");
    expect_compile_error("{{ x ) }}", "unexpected ')'");
    expect_compile_error("{{ x", "missing '}}'");
    expect_compile_error("{# no end", "missing end of comment");
    expect_compile_error("{% break %}", "'break' outside a for loop");
    expect_compile_error("{{ 99999999999999999999 }}", "integer literal too large");
    expect_compile_error("\xff\xfe", "not valid UTF-8");
    EXPECT_NO_LEAKS();
}

/* Compiles and renders tpl with lim; expects a render error containing want. */
static void expect_render_error(const char *tpl, const char *vars, const JinjaLimits *lim, const char *want)
{
    JinjaTemplate *t = NULL;
    char err[600];
    cr_assert(jinja_compile(&t, tpl, strlen(tpl), err, sizeof err) == 0, "%s: %s", tpl, err);
    char *out = NULL;
    int rc = jinja_render_json(t, vars, strlen(vars), lim, &out, NULL, err, sizeof err);
    cr_expect(rc != 0, "%s rendered, wanted the error '%s'", tpl, want);
    if (rc) cr_expect(strstr(err, want) != NULL, "%s: error '%s' does not say '%s'", tpl, err, want);
    cr_expect(out == NULL);
    td_free(out);
    jinja_free(t);
}

Test(chat, hostile_templates_hit_a_limit_and_fail_cleanly)
{
    JinjaLimits lim;
    jinja_limits_default(&lim);
    /* 10^10 iterations: the work limit */
    expect_render_error("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", "{}",
                        &lim, "work limit");
    /* a string doubling 100 times: the memory (or output) limit */
    expect_render_error("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                        "{}", &lim, "bytes");
    expect_render_error("{{ 'x' * 100000000000 }}", "{}", &lim, "memory");
    /* found by fuzz_chat: widths past int64 overflowed (UB) */
    expect_render_error("{{ '{:>99999999999999999999}'.format('x') }}", "{}", &lim, "too many decimal digits");
    expect_render_error("{{ '%99999999999999999999d' % 5 }}", "{}", &lim, "width with too many digits");
    /* 64-bit integers: overflow is an error, never a wrong number */
    expect_render_error("{{ 9223372036854775807 + 1 }}", "{}", &lim, "integer overflow");
    /* unbounded recursion: the call depth */
    expect_render_error("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", "{}", &lim, "nested too deeply");
    /* output */
    JinjaLimits small = lim;
    small.max_output = 1000;
    expect_render_error("{% for i in range(100) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}", "{}", &small,
                        "output exceeds 1000 bytes");
    small = lim;
    small.max_memory = 1 << 20;
    expect_render_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}",
                        "{}", &small, "memory");
    /* raise_exception: its message verbatim */
    expect_render_error("{{ raise_exception('No ' ~ 'system message!') }}", "{}", &lim, "No system message!");
    EXPECT_NO_LEAKS();
}

Test(chat, deeply_nested_templates_are_refused_at_load)
{
    /* 5000 nested parentheses / ifs / attribute chains must not exhaust the
     * C stack */
    size_t n = 5000;
    char *s = td_malloc(4 * n + 64);
    size_t o = 0;
    o += (size_t)sprintf(s + o, "{{ ");
    for (size_t k = 0; k < n; k++) s[o++] = '(';
    s[o++] = '1';
    for (size_t k = 0; k < n; k++) s[o++] = ')';
    o += (size_t)sprintf(s + o, " }}");
    s[o] = 0;
    expect_compile_error(s, "nested too deeply");
    o = (size_t)sprintf(s, "{{ x");
    for (size_t k = 0; k < n; k++) o += (size_t)sprintf(s + o, ".a");
    sprintf(s + o, " }}");
    expect_compile_error(s, "nested too deeply");
    o = 0;
    for (size_t k = 0; k < 600; k++) o += (size_t)sprintf(s + o, "{%% if 1 %%}");
    s[o] = 0;
    expect_compile_error(s, "nested too deeply");
    td_free(s);
    EXPECT_NO_LEAKS();
}

Test(chat, json_variables_keep_ints_and_floats_and_refuse_big_ints)
{
    JinjaTemplate *t;
    char err[600], *out;
    const char *tpl = "{{ x }} {{ x|tojson }} {{ y }}";
    cr_assert(jinja_compile(&t, tpl, strlen(tpl), err, sizeof err) == 0);
    const char *vars = "{\"x\": [2.0, 2, 1e-05, -0.0], \"y\": 3}";
    cr_assert(jinja_render_json(t, vars, strlen(vars), NULL, &out, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_str_eq(out, "[2.0, 2, 1e-05, -0.0] [2.0, 2, 1e-05, -0.0] 3");
    td_free(out);
    /* cJSON cannot tell 2.0 from 2: its integral values become ints */
    cJSON *cj = cJSON_Parse(vars);
    cr_assert(jinja_render(t, cj, NULL, &out, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_str_eq(out, "[2, 2, 1e-05, 0] [2, 2, 1e-05, 0] 3");
    td_free(out);
    cJSON_Delete(cj);
    const char *big = "{\"x\": 123456789012345678901}";
    cr_expect(jinja_render_json(t, big, strlen(big), NULL, &out, NULL, err, sizeof err) != 0);
    cr_expect(strstr(err, "integer beyond 64 bits") != NULL, "%s", err);
    jinja_free(t);
    EXPECT_NO_LEAKS();
}

/* ---------------------------------------------------------------- chat layer */

static ChatTemplate *load_config(const char *json)
{
    ChatTemplate *ct = NULL;
    char err[600];
    cr_assert(chat_template_load(&ct, json, strlen(json), err, sizeof err) == 0, "%s", err);
    return ct;
}

static char *render_doc(const ChatTemplate *ct, const char *doc, bool agp, char *err, size_t errlen)
{
    char *out = NULL;
    if (chat_template_render_json(ct, doc, strlen(doc), agp, NULL, &out, NULL, err, errlen)) return NULL;
    return out;
}

Test(chat, template_list_picks_default_or_tool_use_as_transformers_does)
{
    ChatTemplate *ct = load_config(
        "{\"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ tools }}\"},"
        " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}],"
        " \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, \"eos_token\": \"</s>\"}");
    char err[600];
    char *out = render_doc(ct, "[{\"role\": \"user\", \"content\": \"x\"}]", false, err, sizeof err);
    cr_assert(out, "%s", err);
    cr_expect_str_eq(out, "DNone");
    td_free(out);
    /* tools given, even empty: tool_use */
    out = render_doc(ct, "{\"messages\": [], \"tools\": []}", false, err, sizeof err);
    cr_assert(out, "%s", err);
    cr_expect_str_eq(out, "T0");
    td_free(out);
    cr_expect_str_eq(chat_template_bos(ct), "<s>");
    cr_expect_str_eq(chat_template_eos(ct), "</s>");
    chat_template_free(ct);
    EXPECT_NO_LEAKS();
}

Test(chat, variables_are_those_transformers_passes)
{
    ChatTemplate *ct = load_config(
        "{\"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token }}|"
        "{{ additional_special_tokens }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ x }}|{{ messages|length }}\","
        " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"unk_token\": null, \"pad_token\": \"\","
        " \"additional_special_tokens\": [\"<a>\", {\"content\": \"<b>\"}]}");
    char err[600];
    char *out = render_doc(ct, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"x\": 1.5, \"eos_token\": \"E\"}}",
                           true, err, sizeof err);
    cr_assert(out, "%s", err);
    /* kwargs override special tokens; empty / null tokens are not passed */
    cr_expect_str_eq(out, "<s>|E|False||['<a>', '<b>']|None|None|True|1.5|1");
    td_free(out);
    /* the document's add_generation_prompt wins over the argument */
    out = render_doc(ct, "{\"messages\": [], \"add_generation_prompt\": false}", true, err, sizeof err);
    cr_assert(out, "%s", err);
    cr_expect(strstr(out, "|False|") != NULL, "%s", out);
    td_free(out);
    chat_template_free(ct);
    EXPECT_NO_LEAKS();
}

static void expect_chat_error(const ChatTemplate *ct, const char *doc, const char *want)
{
    char err[600];
    char *out = render_doc(ct, doc, true, err, sizeof err);
    cr_expect(out == NULL, "%s rendered as '%s', wanted the error '%s'", doc, out ? out : "", want);
    if (!out) cr_expect(strstr(err, want) != NULL, "%s: error '%s' does not say '%s'", doc, err, want);
    td_free(out);
}

Test(chat, cjson_requests_render_as_json_text_does)
{
    ChatTemplate *ct = load_config(
        "{\"chat_template\": \"{% for m in messages %}<{{ m.role }}:{{ m.content }}>{% endfor %}"
        "{{ tools|tojson }}{{ add_generation_prompt }}{{ k }}\"}");
    const char *msgs = "[{\"role\": \"user\", \"content\": \"h\u00e9\"}, {\"role\": \"assistant\", \"content\": null}]";
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"n\": 3, \"x\": 0.5}}]";
    char doc[512], err[600];
    snprintf(doc, sizeof doc, "{\"messages\": %s, \"tools\": %s, \"chat_template_kwargs\": {\"k\": [1, true]}}", msgs, tools);
    char *want = render_doc(ct, doc, true, err, sizeof err);
    cr_assert(want, "%s", err);
    cr_expect_str_eq(want, "<user:h\u00e9><assistant:None>[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"n\": 3, \"x\": 0.5}}]True[1, True]");
    cJSON *m = cJSON_Parse(msgs), *t = cJSON_Parse(tools), *k = cJSON_Parse("{\"k\": [1, true]}");
    char *got = NULL;
    cr_assert(chat_template_render_cjson(ct, m, t, k, true, NULL, &got, NULL, err, sizeof err) == 0, "%s", err);
    cr_expect_str_eq(got, want);
    td_free(got);
    td_free(want);
    cJSON_Delete(m);
    cJSON_Delete(t);
    cJSON_Delete(k);
    chat_template_free(ct);
    EXPECT_NO_LEAKS();
}

Test(chat, bad_messages_are_refused_naming_the_message)
{
    ChatTemplate *ct = load_config("{\"chat_template\": \"{% for m in messages %}{{ m.role }}{% endfor %}\"}");
    expect_chat_error(ct, "[{\"role\": \"user\", \"content\": \"a\"}, {\"content\": \"b\"}]", "messages[1] has no 'role'");
    expect_chat_error(ct, "[{\"role\": 3, \"content\": \"a\"}]", "messages[0]: 'role' must be a string");
    expect_chat_error(ct, "[{\"role\": \"user\", \"content\": 5}]",
                      "messages[0]: 'content' must be a string, null or a list of parts");
    expect_chat_error(ct, "[{\"role\": \"user\", \"content\": {\"text\": \"x\"}}]", "messages[0]: 'content' must be");
    expect_chat_error(ct, "[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]",
                      "messages[0].content[0] is a text part without a string 'text'");
    expect_chat_error(ct, "[{\"role\": \"user\", \"content\": [\"x\"]}]", "messages[0].content[0] must be an object");
    expect_chat_error(ct, "[\"hello\"]", "messages[0] must be an object");
    expect_chat_error(ct, "{\"role\": \"user\"}", "has no 'messages'");
    expect_chat_error(ct, "{\"messages\": {}}", "messages must be a list");
    expect_chat_error(ct, "{\"messages\": [], \"tools\": {}}", "tools must be a list");
    expect_chat_error(ct, "{\"messages\": [], \"tools\": [1]}", "tools[0] must be an object");
    expect_chat_error(ct, "{\"messages\": [], \"chat_template_kwargs\": {\"messages\": 1}}", "may not set 'messages'");
    expect_chat_error(ct, "[{\"role\": \"user\"", "messages: JSON line 1");
    /* content parts pass through as given */
    char err[600];
    char *out = render_doc(ct, "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}, {\"type\": \"image_url\"}]}]",
                           true, err, sizeof err);
    cr_expect(out != NULL, "%s", err);
    td_free(out);
    chat_template_free(ct);
    EXPECT_NO_LEAKS();
}

Test(chat, bad_configs_are_refused_with_one_line)
{
    struct { const char *json, *want; } cases[] = {
        { "{\"bos_token\": \"<s>\"}", "has no chat_template" },
        { "{\"chat_template\": 5}", "chat_template must be a string" },
        { "{\"chat_template\": [{\"name\": \"x\"}]}", "chat_template[0] must be" },
        { "{\"chat_template\": \"{{ x|nofilter }}\"}", "chat template: line 1: unsupported filter 'nofilter'" },
        { "{\"chat_template\": \"x\", \"bos_token\": 5}", "bos_token must be a string or an AddedToken" },
        { "{\"chat_template\": \"x\", \"eos_token\": {\"lstrip\": true}}", "eos_token is an object without a string 'content'" },
        { "[1]", "not a JSON object" },
        { "{", "tokenizer_config.json: JSON line 1" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        ChatTemplate *ct = NULL;
        char err[600];
        int rc = chat_template_load(&ct, cases[k].json, strlen(cases[k].json), err, sizeof err);
        cr_expect(rc != 0, "%s loaded", cases[k].json);
        if (rc) cr_expect(strstr(err, cases[k].want) != NULL, "%s: '%s' does not say '%s'", cases[k].json, err, cases[k].want);
        chat_template_free(ct);
    }
    /* several templates and none named default, without tools */
    ChatTemplate *ct = load_config("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"t\"}]}");
    expect_chat_error(ct, "[]", "none is named 'default'");
    chat_template_free(ct);
    EXPECT_NO_LEAKS();
}

Test(chat, a_raising_template_gives_its_message)
{
    size_t n;
    char *cfg = slurp("tests/ref/mixtral_tokenizer_config.json", &n);
    cr_assert(cfg, "tests/ref/mixtral_tokenizer_config.json missing (run from the repository root)");
    ChatTemplate *ct = NULL;
    char err[600];
    cr_assert(chat_template_load(&ct, cfg, n, err, sizeof err) == 0, "%s", err);
    td_free(cfg);
    expect_chat_error(ct, "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]",
                      "chat template: After the optional system message, conversation roles must alternate "
                      "user/assistant/user/assistant/...");
    char *out = render_doc(ct, "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}]",
                           true, err, sizeof err);
    cr_assert(out, "%s", err);
    cr_expect_str_eq(out, "<s> [INST] S\n\nHi [/INST]");
    td_free(out);
    chat_template_free(ct);
    EXPECT_NO_LEAKS();
}

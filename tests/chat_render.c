/* tests/chat_render.c - renders chat templates with core/chat for the
 * command-level test (tests/cli/chat.sh): whole conversation files, bare
 * templates with variables and random batches, which `tandem tokenize
 * --chat` (one conversation, checked in tests/cli/tokenize.sh) does not do.
 *
 *   chat_render --config tokenizer_config.json --conversations CONVS.jsonl --out DIR --prefix NAME [--now SECONDS]
 *       for each line {"name", "messages", "tools"?, "add_generation_prompt"?,
 *       "chat_template_kwargs"?} of CONVS.jsonl writes DIR/NAME.<name>.txt (the
 *       rendering, bytes as they are) or DIR/NAME.<name>.err (the error line);
 *   chat_render --template FILE --vars JSON_FILE [--now SECONDS]
 *       prints the template rendered with the variables (exit 1 and the error
 *       on stderr when it fails);
 *   chat_render --batch CASES.json [--now SECONDS]
 *       CASES.json is a list of [template, variables as JSON text]; prints a
 *       JSON list of {"out": ...} / {"compile_error": ...} / {"render_error": ...}.
 * tests/ref/hf_chat.py writes the same files from Python's jinja2. */
#include "core/chat/chat.h"
#include "core/chat/jinja/jinja.h"
#include "core/common.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *n)
{
    char *buf = NULL, err[1200];
    int r = td_read_file(path, 0, &buf, n, err, sizeof err);
    if (r) {
        if (r > 0)
            td_error("cannot open %s: no such file", path);
        else
            td_error("%s", err);
        exit(2);
    }
    return buf;
}

static void write_file(const char *path, const char *s, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s, 1, n, f) != n || fclose(f)) {
        td_error("cannot write %s", path);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    const char *config = NULL, *convs = NULL, *outdir = NULL, *prefix = "t", *tfile = NULL, *vfile = NULL,
               *batch = NULL;
    JinjaLimits lim;
    jinja_limits_default(&lim);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { td_error("%s needs a value", a); return 2; }
        if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--conversations")) convs = v;
        else if (!strcmp(a, "--out")) outdir = v;
        else if (!strcmp(a, "--prefix")) prefix = v;
        else if (!strcmp(a, "--template")) tfile = v;
        else if (!strcmp(a, "--vars")) vfile = v;
        else if (!strcmp(a, "--batch")) batch = v;
        else if (!strcmp(a, "--now")) lim.now = strtoll(v, NULL, 10);
        else { td_error("unknown option %s", a); return 2; }
        i++;
    }
    char err[600];
    if (batch) {
        size_t bn;
        char *text = slurp(batch, &bn);
        cJSON *list = cJSON_Parse(text), *res = cJSON_CreateArray();
        if (!cJSON_IsArray(list)) {
            td_error("%s: not a JSON list of [template, variables]", batch);
            return 2;
        }
        for (cJSON *c = list->child; c; c = c->next) {
            const cJSON *tj = cJSON_GetArrayItem(c, 0), *vj = cJSON_GetArrayItem(c, 1);
            if (!cJSON_IsString(tj) || !cJSON_IsString(vj)) {
                td_error("%s: an item that is not [template, variables]", batch);
                return 2;
            }
            cJSON *o = cJSON_CreateObject();
            JinjaTemplate *t;
            if (jinja_compile(&t, tj->valuestring, strlen(tj->valuestring), err, sizeof err)) {
                cJSON_AddStringToObject(o, "compile_error", err);
            } else {
                char *out;
                if (jinja_render_json(t, vj->valuestring, strlen(vj->valuestring), &lim, &out, NULL, err, sizeof err))
                    cJSON_AddStringToObject(o, "render_error", err);
                else
                    cJSON_AddStringToObject(o, "out", out);
                td_free(out);
                jinja_free(t);
            }
            cJSON_AddItemToArray(res, o);
        }
        char *s = cJSON_PrintUnformatted(res);
        puts(s);
        free(s);
        cJSON_Delete(res);
        cJSON_Delete(list);
        td_free(text);
        return 0;
    }
    if (tfile) {
        size_t tn, vn;
        char *src = slurp(tfile, &tn), *vars = vfile ? slurp(vfile, &vn) : NULL;
        JinjaTemplate *t;
        if (jinja_compile(&t, src, tn, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        char *out;
        size_t on;
        int rc = jinja_render_json(t, vars ? vars : "{}", vars ? vn : 2, &lim, &out, &on, err, sizeof err);
        if (rc) fprintf(stderr, "%s\n", err);
        else fwrite(out, 1, on, stdout);
        td_free(out);
        jinja_free(t);
        td_free(src);
        td_free(vars);
        return rc ? 1 : 0;
    }
    if (!config || !convs || !outdir) {
        td_error("usage: chat_render --config FILE --conversations FILE --out DIR [--prefix NAME] [--now S]");
        return 2;
    }
    size_t cn, vn;
    char *cfg = slurp(config, &cn), *cv = slurp(convs, &vn);
    ChatTemplate *ct;
    if (chat_template_load(&ct, cfg, cn, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    int count = 0;
    /* one conversation per line: each line's own text goes to the renderer,
     * so numbers keep their int/float spelling (cJSON is only used for the
     * name) */
    for (char *line = cv, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line) continue;
        cJSON *c = cJSON_Parse(line);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (!cJSON_IsString(name)) {
            td_error("%s: a line that is not a conversation object with a name", convs);
            return 2;
        }
        char path[4096];
        char *out = NULL;
        size_t on = 0;
        int rc = chat_template_render_json(ct, line, strlen(line), false, &lim, &out, &on, err, sizeof err);
        snprintf(path, sizeof path, "%s/%s.%s.%s", outdir, prefix, name->valuestring, rc ? "err" : "txt");
        if (rc) {
            size_t n = strlen(err);
            err[n] = '\n';
            write_file(path, err, n + 1);
        } else {
            write_file(path, out, on);
        }
        td_free(out);
        cJSON_Delete(c);
        count++;
    }
    printf("chat_render: %s: %d conversations\n", prefix, count);
    chat_template_free(ct);
    td_free(cfg);
    td_free(cv);
    return 0;
}

/* core/tok/tok_cmd.c - `tandem tokenize` (tok_cmd.h). */
#include "core/tok/tok_cmd.h"
#include "core/args.h"
#include "core/chat/chat.h"
#include "core/common.h"
#include "core/tok/tok_util.h"
#include "core/tok/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static const char USAGE[] =
    "usage: tandem tokenize --tokenizer T (--text STR | --input FILE [--jsonl]) [--no-special]\n"
    "       tandem tokenize --tokenizer T --chat MESSAGES.json [--add-generation-prompt]\n"
    "       tandem tokenize --tokenizer T --decode (--ids 1,2,3 | --input IDS.jsonl) [--skip-special]\n";

/* Reads a whole file (NUL-terminated) into b; -1 after one error line. */
static int slurp(const char *path, TokBuf *b)
{
    char *buf = NULL, err[1200];
    size_t n = 0;
    int r = td_read_file(path, 0, &buf, &n, err, sizeof err);
    if (r) {
        if (r > 0)
            td_error("tokenize: cannot open %s: %s", path, strerror(ENOENT));
        else
            td_error("tokenize: %s", err);
        return -1;
    }
    tokbuf_put(b, buf, n);
    td_free(buf);
    tokbuf_putc(b, 0);
    b->n--;
    return 0;
}

/* Appends s[0..n) (valid UTF-8, NULs allowed) as a JSON string. */
static void json_string(TokBuf *o, const char *s, size_t n)
{
    tokbuf_putc(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            tokbuf_putc(o, '\\');
            tokbuf_putc(o, (char)c);
        } else if (c == '\n') tokbuf_put(o, "\\n", 2);
        else if (c == '\t') tokbuf_put(o, "\\t", 2);
        else if (c == '\r') tokbuf_put(o, "\\r", 2);
        else if (c < 0x20) {
            char u[8];
            snprintf(u, sizeof u, "\\u%04x", c);
            tokbuf_put(o, u, 6);
        } else tokbuf_putc(o, (char)c);
    }
    tokbuf_putc(o, '"');
}

/* One line: {"text": TEXT, "ids": [...]} (text NULL: ids only). */
static void print_result(const char *text, size_t tn, const int32_t *ids, size_t n, bool with_ids)
{
    TokBuf o = { 0 };
    tokbuf_putc(&o, '{');
    if (text) {
        tokbuf_put(&o, "\"text\": ", 8);
        json_string(&o, text, tn);
    }
    if (with_ids) {
        if (text) tokbuf_put(&o, ", ", 2);
        tokbuf_put(&o, "\"ids\": [", 8);
        for (size_t i = 0; i < n; i++) {
            char num[16];
            int k = snprintf(num, sizeof num, i ? ", %d" : "%d", ids[i]);
            tokbuf_put(&o, num, (size_t)k);
        }
        tokbuf_putc(&o, ']');
    }
    tokbuf_put(&o, "}\n", 2);
    fwrite(o.p, 1, o.n, stdout);
    tokbuf_free(&o);
}

/* Renders MESSAGES.json (an OpenAI messages array, or {"messages": [...],
 * "tools": [...], ...}) with the chat_template of the tokenizer's
 * tokenizer_config.json, as transformers' apply_chat_template does
 * (core/chat), appending the text to *text.  0, or -1 with one line in
 * err (no template, a bad message, the template's own error). */
static int render_chat(const Tokenizer *t, const char *messages, size_t len, bool add_generation_prompt,
                       TokText *text, char *err, size_t n)
{
    size_t cl;
    const char *cfg = tok_config_text(t, &cl);
    if (!cfg) {
        tok_errf(err, n, "%s", tok_is_byte_level(t) ? "the byte-level tokenizer has no chat template"
                                                    : "the tokenizer has no tokenizer_config.json, so no chat template");
        return -1;
    }
    ChatTemplate *ct;
    if (chat_template_load(&ct, cfg, cl, err, n)) return -1;
    char *out;
    size_t out_len;
    int rc = chat_template_render_json(ct, messages, len, add_generation_prompt, NULL, &out, &out_len, err, n);
    if (rc == 0) {
        toktext_put(text, out, out_len);
        td_free(out);
    }
    chat_template_free(ct);
    return rc;
}

/* "1,2,3" (commas and/or spaces) -> ids; -1 after one error line. */
static int parse_ids(const char *s, TokIds *out)
{
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            td_error("tokenize: --ids: \"%.*s\" is not a token id", (int)strcspn(p, ", \t\n"), p);
            return -1;
        }
        tokids_push(out, (int32_t)v);
        p = end;
    }
    return 0;
}

/* --decode --input: each line {"ids": [...]} (or a bare array) ->
 * {"text": ...}.  -1 after one error line naming the line. */
static int decode_lines(const Tokenizer *t, const char *path, const TokBuf *file, bool skip)
{
    size_t at = 0, line = 1;
    TokIds ids = { 0 };
    TokText out = { 0 };
    int rc = 0;
    char err[256];
    while (at < file->n && !rc) {
        const char *nl = memchr(file->p + at, '\n', file->n - at);
        size_t e = nl ? (size_t)(nl - file->p) : file->n;
        cJSON *j = cJSON_ParseWithLength(file->p + at, e - at);
        const cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "ids");
        ids.n = 0;
        for (const cJSON *c = cJSON_IsArray(arr) ? arr->child : NULL; c; c = c->next) {
            if (!cJSON_IsNumber(c) || c->valuedouble != (double)(int32_t)c->valuedouble) {
                arr = NULL;
                break;
            }
            tokids_push(&ids, (int32_t)c->valuedouble);
        }
        out.len = 0;
        if (!cJSON_IsArray(arr)) {
            td_error("tokenize: %s line %zu: want {\"ids\": [integers]}", path, line);
            rc = -1;
        } else if (tok_decode(t, ids.ids, ids.n, skip, &out, err, sizeof err)) {
            td_error("tokenize: %s line %zu: %s", path, line, err);
            rc = -1;
        } else print_result(out.s ? out.s : "", out.len, NULL, 0, false);
        cJSON_Delete(j);
        at = e + 1;
        line++;
    }
    tok_ids_free(&ids);
    tok_text_free(&out);
    return rc;
}

static int do_encode(const Tokenizer *t, const char *text, size_t len, bool special, TokIds *ids)
{
    char err[512];
    ids->n = 0;
    if (tok_encode(t, text, len, special, ids, err, sizeof err)) {
        td_error("tokenize: %s", err);
        return -1;
    }
    return 0;
}

static int tokenize_run(Args *ap, int argc, char **argv, TokOpenFn open_tokenizer)
{
    static const char *const spec[] = { "tokenizer=", "text=", "input=", "jsonl", "no-special", "chat=",
                                        "add-generation-prompt", "decode", "ids=", "skip-special", NULL };
    char err[1024];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("tokenize: %s", err);
        return 2;
    }
    if (ap->help) {
        printf("%s"
               "Token ids of a text as Hugging Face's tokenizer(text) gives them (special\n"
               "tokens added as HF adds them; --no-special: add_special_tokens=False).\n"
               "--jsonl: one {\"ids\": [...]} per line of FILE (without its \\n).  --chat:\n"
               "the chat template applied to MESSAGES.json, {\"text\", \"ids\"}.  --decode:\n"
               "{\"text\"} of the ids.  T is a directory holding tokenizer.json (+\n"
               "tokenizer_config.json) or a tandem checkpoint (file or run directory) that\n"
               "holds them (byte-level when it holds none).  Supported tokenizers:\n"
               "docs/tokenizer.md\n",
               USAGE);
        return 0;
    }
    const char *dir = args_get(ap, "tokenizer"), *text = args_get(ap, "text"), *input = args_get(ap, "input"),
               *chat = args_get(ap, "chat"), *ids_s = args_get(ap, "ids");
    bool decode = args_flag(ap, "decode");
    int modes = (text != NULL) + (input != NULL && !decode) + (chat != NULL) + decode;
    if (!dir || modes != 1 || ap->n_pos) {
        td_error("tokenize: give --tokenizer and one of --text, --input, --chat, --decode (tandem tokenize --help)");
        return 2;
    }
    if (decode ? (ids_s != NULL) == (input != NULL) : ids_s != NULL) {
        td_error("tokenize: --decode takes --ids 1,2,3 or --input IDS.jsonl (and --ids needs --decode)");
        return 2;
    }
    if (args_flag(ap, "jsonl") && (!input || decode)) {
        td_error("tokenize: --jsonl needs --input FILE");
        return 2;
    }
    Tokenizer *t;
    if (open_tokenizer(dir, &t, err, sizeof err)) {
        td_error("tokenize: %s", err);
        return 1;
    }
    bool special = !args_flag(ap, "no-special");
    TokIds ids = { 0 };
    TokBuf file = { 0 };
    TokText out = { 0 };
    int rc = 0;
    if (text) {
        rc = do_encode(t, text, strlen(text), special, &ids);
        if (!rc) print_result(NULL, 0, ids.ids, ids.n, true);
    } else if (decode && input) {
        rc = slurp(input, &file) || decode_lines(t, input, &file, args_flag(ap, "skip-special"));
    } else if (input) {
        rc = slurp(input, &file);
        if (!rc && !args_flag(ap, "jsonl")) {
            rc = do_encode(t, file.p, file.n, special, &ids);
            if (!rc) print_result(NULL, 0, ids.ids, ids.n, true);
        } else if (!rc) {
            size_t at = 0, line = 1;
            while (at < file.n && !rc) {
                const char *nl = memchr(file.p + at, '\n', file.n - at);
                size_t e = nl ? (size_t)(nl - file.p) : file.n;
                ids.n = 0;
                if (tok_encode(t, file.p + at, e - at, special, &ids, err, sizeof err)) {
                    td_error("tokenize: %s line %zu: %s", input, line, err);
                    rc = -1;
                } else print_result(NULL, 0, ids.ids, ids.n, true);
                at = e + 1;
                line++;
            }
        }
    } else if (chat) {
        rc = slurp(chat, &file);
        if (!rc && render_chat(t, file.p, file.n, args_flag(ap, "add-generation-prompt"), &out, err, sizeof err)) {
            td_error("tokenize: --chat %s: %s", chat, err);
            rc = -1;
        }
        if (!rc) rc = do_encode(t, out.s, out.len, false, &ids);
        if (!rc) print_result(out.s ? out.s : "", out.len, ids.ids, ids.n, true);
    } else {
        rc = parse_ids(ids_s, &ids);
        if (!rc && tok_decode(t, ids.ids, ids.n, args_flag(ap, "skip-special"), &out, err, sizeof err)) {
            td_error("tokenize: --ids: %s", err);
            rc = -1;
        }
        if (!rc) print_result(out.s ? out.s : "", out.len, NULL, 0, false);
    }
    tok_ids_free(&ids);
    tokbuf_free(&file);
    tok_text_free(&out);
    tok_free(t);
    if (fflush(stdout) != 0) {
        td_error("tokenize: writing the output failed: %s", strerror(errno));
        return 1;
    }
    return rc ? 1 : 0;
}

int cmd_tokenize(int argc, char **argv, TokOpenFn open_tokenizer)
{
    Args a = { 0 };
    int rc = tokenize_run(&a, argc, argv, open_tokenizer);
    args_free(&a);
    return rc;
}

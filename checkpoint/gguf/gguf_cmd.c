/* checkpoint/gguf/gguf_cmd.c - `tandem ckpt export IN OUT.gguf --format gguf`
 * (gguf_export.h, docs/gguf.md).
 *
 *   --dtype f32|f16|q8_0    weight matrices (default f32)
 *   --tokenizer DIR         tokenizer.json (+ tokenizer_config.json,
 *                           generation_config.json) of the model; without
 *                           it only a byte-level model (V = 256) exports
 *   --arch NAME             llama | qwen2moe | qwen3moe | olmoe (default:
 *                           chosen from the config)
 *   --name S                general.name (default "tandem")
 */
#include "checkpoint/ckpt.h"
#include "checkpoint/gguf/gguf_export.h"
#include "core/args.h"
#include "core/common.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *g_usage =
    "usage: tandem ckpt export IN OUT.gguf --format gguf [--dtype f32|f16|q8_0] [--tokenizer DIR]\n"
    "                          [--arch llama|qwen2moe|qwen3moe|olmoe] [--name NAME]\n"
    "A GGUF v3 file llama.cpp loads (docs/gguf.md).  IN: a checkpoint or a run directory (its latest).\n"
    "  --dtype      weight matrices F32 (default), F16 or Q8_0; norms, biases and routers stay F32\n"
    "  --tokenizer  a directory with tokenizer.json (+ tokenizer_config.json, generation_config.json);\n"
    "               without it the model must be byte-level (vocab_size 256)\n"
    "  --arch       the llama.cpp architecture (default: chosen from the config; a feature it cannot\n"
    "               express is refused by name)\n"
    "  --name       general.name (default \"tandem\")\n";

/* Reads DIR/name into *out (NUL-terminated).  1 when the file does not
 * exist, 0 when read, -1 with err. */
static int read_opt(const char *dir, const char *name, char **out, size_t *len, char *err, size_t err_len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return 1;
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = td_malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *b = td_malloc(cap * 2);
            memcpy(b, buf, n);
            td_free(buf);
            buf = b;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, err_len, "%s: read failed", path);
        td_free(buf);
        return -1;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int gguf_export_cmd(int argc, char **argv)
{
    static const char *const spec[] = { "format=", "dtype=", "tokenizer=", "arch=", "name=", NULL };
    Args a;
    char err[PATH_MAX + 1024];
    if (args_parse(&a, argc, argv, 2, spec, err, sizeof err)) {
        td_error("ckpt export: %s (tandem ckpt export --format gguf --help)", err);
        return 2;
    }
    if (a.help) {
        fputs(g_usage, stdout);
        return 0;
    }
    if (a.n_pos != 2) {
        td_error("ckpt export --format gguf: expected IN and OUT.gguf, got %d arguments", a.n_pos);
        return 2;
    }
    GgufExportOpts o;
    memset(&o, 0, sizeof o);
    const char *ds = args_str(&a, "dtype", "f32");
    if (!strcmp(ds, "f32") || !strcmp(ds, "float32")) o.dtype = GGUF_OUT_F32;
    else if (!strcmp(ds, "f16") || !strcmp(ds, "float16")) o.dtype = GGUF_OUT_F16;
    else if (!strcmp(ds, "q8_0")) o.dtype = GGUF_OUT_Q8_0;
    else {
        td_error("ckpt export --format gguf: --dtype must be f32, f16 or q8_0 (got \"%s\")", ds);
        return 2;
    }
    o.arch = args_get(&a, "arch");
    o.name = args_get(&a, "name");
    char in[PATH_MAX];
    if (ckpt_resolve(a.pos[0], in, sizeof in)) return 1;
    const char *out = a.pos[1];
    if (!strcmp(in, out)) {
        td_error("ckpt export: IN and OUT are the same file");
        return 2;
    }
    char *json = NULL, *cfg = NULL, *gen = NULL;
    int rc = 1;
    const char *dir = args_get(&a, "tokenizer");
    if (dir) {
        int r = read_opt(dir, "tokenizer.json", &json, &o.tok.json_len, err, sizeof err);
        if (r > 0) snprintf(err, sizeof err, "--tokenizer %s: no tokenizer.json there", dir);
        if (r) goto fail;
        o.tok.json = json;
        if ((r = read_opt(dir, "tokenizer_config.json", &cfg, &o.tok.config_len, err, sizeof err)) < 0) goto fail;
        o.tok.config = r == 0 ? cfg : NULL;
        if ((r = read_opt(dir, "generation_config.json", &gen, &o.tok.gen_len, err, sizeof err)) < 0) goto fail;
        o.tok.gen = r == 0 ? gen : NULL;
    }
    double t0 = td_now();
    GgufExportReport rep;
    if (gguf_export(in, out, &o, &rep, err, sizeof err)) goto fail;
    const GgufVocabInfo *v = &rep.vocab;
    printf("wrote %s: GGUF v3, llama.cpp architecture %s (%s), %d tensors, %.1f MiB of %s weights", out,
           rep.arch->name, rep.why, rep.n_tensors, (double)rep.data_bytes / 1048576.0,
           o.dtype == GGUF_OUT_F32 ? "F32" : o.dtype == GGUF_OUT_F16 ? "F16" : "Q8_0");
    if (rep.n_f16_fallback) printf(" (%d matrices F16: rows not a multiple of 32)", rep.n_f16_fallback);
    printf("; tokenizer %s%s%s, %d tokens (%d defined), %d merges (%.2f s)\n", v->model, v->pre[0] ? " pre " : "",
           v->pre, v->n_tokens, v->n_defined, v->n_merges, td_now() - t0);
    rc = 0;
    goto done;
fail:
    td_error("%s", err);
done:
    td_free(json);
    td_free(cfg);
    td_free(gen);
    return rc;
}

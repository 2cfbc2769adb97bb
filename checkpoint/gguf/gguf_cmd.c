/* checkpoint/gguf/gguf_cmd.c - `tandem ckpt export IN OUT.gguf --format gguf`
 * (gguf_export.h, docs/gguf.md).
 *
 *   --dtype f32|f16|q8_0    weight matrices (default f32)
 *   --tokenizer DIR         tokenizer.json (+ tokenizer_config.json,
 *                           generation_config.json) of the model; default:
 *                           the checkpoint's /tokenizer files; with neither
 *                           only a byte-level model (V = 256) exports
 *   --arch NAME             llama | qwen2moe | qwen3moe | olmoe (default:
 *                           chosen from the config)
 *   --name S                general.name (default "tandem")
 */
#include "checkpoint/ckpt.h"
#include "checkpoint/gguf/gguf_export.h"
#include "core/args.h"
#include "core/common.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *g_usage =
    "usage: tandem ckpt export IN OUT.gguf --format gguf [--dtype f32|f16|q8_0] [--tokenizer DIR]\n"
    "                          [--arch llama|qwen2moe|qwen3moe|olmoe] [--name NAME]\n"
    "A GGUF v3 file llama.cpp loads (docs/gguf.md).  IN: a checkpoint or a run directory (its latest).\n"
    "  --dtype      weight matrices F32 (default), F16 or Q8_0; norms, biases and routers stay F32\n"
    "  --tokenizer  a directory with tokenizer.json (+ tokenizer_config.json, generation_config.json);\n"
    "               default: the tokenizer files stored in IN; with neither the model must be\n"
    "               byte-level (vocab_size 256)\n"
    "  --arch       the llama.cpp architecture (default: chosen from the config; a feature it cannot\n"
    "               express is refused by name)\n"
    "  --name       general.name (default \"tandem\")\n";

int gguf_export_cmd(int argc, char **argv)
{
    static const char *const spec[] = { "format=", "dtype=", "tokenizer=", "arch=", "name=", NULL };
    Args a = { 0 };
    CkptTokFiles tf = { 0 };
    char err[PATH_MAX + 1024];
    int rc = 2;
    if (args_parse(&a, argc, argv, 2, spec, err, sizeof err)) {
        td_error("ckpt export: %s (tandem ckpt export --format gguf --help)", err);
        goto done;
    }
    if (a.help) {
        fputs(g_usage, stdout);
        rc = 0;
        goto done;
    }
    if (a.n_pos != 2) {
        td_error("ckpt export --format gguf: expected IN and OUT.gguf, got %d arguments", a.n_pos);
        goto done;
    }
    GgufExportOpts o;
    memset(&o, 0, sizeof o);
    const char *ds = args_str(&a, "dtype", "f32");
    if (!strcmp(ds, "f32") || !strcmp(ds, "float32")) o.dtype = GGUF_OUT_F32;
    else if (!strcmp(ds, "f16") || !strcmp(ds, "float16")) o.dtype = GGUF_OUT_F16;
    else if (!strcmp(ds, "q8_0")) o.dtype = GGUF_OUT_Q8_0;
    else {
        td_error("ckpt export --format gguf: --dtype must be f32, f16 or q8_0 (got \"%s\")", ds);
        goto done;
    }
    o.arch = args_get(&a, "arch");
    o.name = args_get(&a, "name");
    rc = 1;
    char in[PATH_MAX];
    if (ckpt_resolve(a.pos[0], in, sizeof in)) goto done;
    const char *out = a.pos[1];
    if (!strcmp(in, out)) {
        td_error("ckpt export: IN and OUT are the same file");
        rc = 2;
        goto done;
    }
    /* the tokenizer: --tokenizer DIR, else the checkpoint's /tokenizer */
    const char *dir = args_get(&a, "tokenizer");
    if (dir ? ckpt_tok_files_from_dir(dir, &tf, err, sizeof err) : ckpt_read_tok_files(in, &tf, err, sizeof err))
        goto fail;
    if (dir && !tf.tokenizer_json) {
        snprintf(err, sizeof err, "--tokenizer %s: no tokenizer.json there", dir);
        goto fail;
    }
    o.tok = (GgufTokFiles){ tf.tokenizer_json, tf.tokenizer_json_len, tf.tokenizer_config, tf.tokenizer_config_len,
                            tf.generation_config, tf.generation_config_len };
    double t0 = td_now();
    GgufExportReport rep;
    if (gguf_export(in, out, &o, &rep, err, sizeof err)) goto fail;
    const GgufVocabInfo *v = &rep.vocab;
    printf("wrote %s: GGUF v3, llama.cpp architecture %s (%s), %d tensors, %.1f MiB of %s weights", out,
           rep.arch->name, rep.why, rep.n_tensors, (double)rep.data_bytes / 1048576.0,
           o.dtype == GGUF_OUT_F32 ? "F32" : o.dtype == GGUF_OUT_F16 ? "F16" : "Q8_0");
    if (rep.n_f16_fallback) printf(" (%d matrices F16: rows not a multiple of 32)", rep.n_f16_fallback);
    printf("; tokenizer %s%s%s%s, %d tokens (%d defined), %d merges (%.2f s)\n", v->model, v->pre[0] ? " pre " : "",
           v->pre, dir ? "" : tf.tokenizer_json ? " from the checkpoint" : "", v->n_tokens, v->n_defined,
           v->n_merges, td_now() - t0);
    rc = 0;
    goto done;
fail:
    td_error("%s", err);
done:
    ckpt_tok_files_free(&tf);
    args_free(&a);
    return rc;
}

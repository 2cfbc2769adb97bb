/* checkpoint/ckpt_cmd.c - `tandem ckpt info|verify|reshard|export|diff`
 * (ckpt_cmd.h).  Every subcommand runs in one process; CKPT may be a
 * checkpoint file or a run directory (its latest).
 *
 *   info CKPT [--json]      config, step, topology, every tensor, totals
 *   verify CKPT             read everything: checksums, shapes; exit 0/1
 *   reshard IN OUT [--dp N --tp N --pp N --ep N] [--weights-only] [--dtype f32|bf16|f16]
 *                           the same state recorded under another topology
 *   export IN OUT [--dtype ...] [--dp ...]
 *                           a serving checkpoint: reshard --weights-only
 *   export IN OUT.gguf --format gguf ...
 *                           a GGUF file for llama.cpp (checkpoint/gguf/)
 *   diff A B                max abs / rel difference per tensor
 *   import HF_DIR OUT [--dtype f32|bf16|f16]
 *                           a Hugging Face model directory as a tandem checkpoint
 *                           (checkpoint/hf/hf_load.h); --list-families prints the
 *                           mapping tables
 */
#include "checkpoint/ckpt_cmd.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/hf/families.h"
#include "checkpoint/hf/hf_export.h"
#include "checkpoint/hf/hf_load.h"
#include "checkpoint/gguf/gguf_export.h"
#include "comm/comm.h"
#include "core/args.h"
#include "core/common.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: tandem ckpt <subcommand> ...   (CKPT: a .h5 file or a run directory, meaning its latest)\n"
    "\n"
    "  info CKPT [--json]           config, step, topology, every tensor (shape, dtype, partition,\n"
    "                               size) and totals; --json prints one JSON object\n"
    "  verify CKPT                  read every tensor (Fletcher32 checksums) and check the structure\n"
    "                               against the config; exit 0 when sound, 1 otherwise\n"
    "  reshard IN OUT [--dp N] [--tp N] [--pp N] [--ep N] [--weights-only] [--dtype f32|bf16|f16]\n"
    "                               rewrite IN as saved by that topology (omitted sizes are 1);\n"
    "                               --weights-only drops /optimizer and /trainer; --dtype stores\n"
    "                               the weight matrices in that type (default: IN's)\n"
    "  export IN OUT [--dtype ...] [--dp ...] [--format tandem]\n"
    "                               serving checkpoint: reshard --weights-only\n"
    "  export IN OUT_DIR --format hf [--dtype f32|bf16|f16] [--shard-mb 2048] [--layout v4|v5]\n"
    "                               a Hugging Face model directory: config.json, safetensors shards\n"
    "                               of at most --shard-mb MiB with their index, tokenizer files; an\n"
    "                               imported model goes back bit for bit (dtypes, layout, config)\n"
    "  export IN OUT.gguf --format gguf [--dtype f32|f16|q8_0] [--tokenizer DIR] [--arch NAME]\n"
    "                               a GGUF file for llama.cpp (docs/gguf.md)\n"
    "  diff A B                     max abs and max rel difference of every tensor\n"
    "  import HF_DIR OUT [--dtype f32|bf16|f16]\n"
    "                               a Hugging Face model directory (config.json + safetensors) as a\n"
    "                               tandem checkpoint: weights, config, tokenizer files, and what\n"
    "                               export --format hf needs to write it back bit for bit; --dtype\n"
    "                               stores the matrices in that type (default: the HF files' own)\n"
    "  import --list-families       every family's config-key and tensor tables (markdown)\n"
    "  quantize IN OUT --dtype bf16|int8 [--calib DATA.bin]\n"
    "                               serving checkpoint in 16 / 8 bits (int8: a scale per 32\n"
    "                               weights), per-tensor error, calibration perplexity and routing\n"
    "                               (tandem ckpt quantize --help)\n";


static double mib(size_t b) { return (double)b / 1048576.0; }

static void fmt_shape(char *out, size_t n, const CkptTensor *t)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++) k += (size_t)snprintf(out + k, n - k, "%s%zu", i ? "," : "", t->shape[i]);
    if (k < n) snprintf(out + k, n - k, "]");
}

static bool is_moment(const char *name) { return !strncmp(name, "optimizer/", 10); }
static bool is_weight(const char *name) { return !strncmp(name, "model/", 6) || !strcmp(name, "lm_head"); }
static bool is_tok(const char *name) { return !strncmp(name, "tokenizer/", 10); }

static int parse(Args *a, int argc, char **argv, const char *const *spec, int n_pos, const char *what)
{
    char err[256];
    if (args_parse(a, argc, argv, 2, spec, err, sizeof err)) {
        td_error("ckpt %s: %s (tandem ckpt --help)", what, err);
        return 2;
    }
    if (a->help) {
        fputs(g_usage, stdout);
        return 0;
    }
    if (a->n_pos != n_pos) {
        td_error("ckpt %s: expected %d argument%s, got %d (tandem ckpt --help)", what, n_pos, n_pos > 1 ? "s" : "",
                 a->n_pos);
        return 2;
    }
    return -1;
}

/* ---------------------------------------------------------------- info */

static void add_state_json(cJSON *o, const CkptInfo *in)
{
    if (!in->meta.has_optimizer || !in->st.has_trainer) {
        cJSON_AddNullToObject(o, "optimizer");
        cJSON_AddNullToObject(o, "trainer");
        return;
    }
    const CkptState *s = &in->st;
    cJSON *opt = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddNumberToObject(opt, "beta1", s->beta1);
    cJSON_AddNumberToObject(opt, "beta2", s->beta2);
    cJSON_AddNumberToObject(opt, "eps", s->adam_eps);
    cJSON_AddNumberToObject(opt, "weight_decay", s->weight_decay);
    cJSON_AddNumberToObject(opt, "step", (double)s->adam_step);
    cJSON_AddNumberToObject(opt, "lr", s->lr);
    cJSON *tr = cJSON_AddObjectToObject(o, "trainer");
    cJSON_AddNumberToObject(tr, "step", (double)s->step);
    cJSON_AddNumberToObject(tr, "tokens_seen", (double)s->tokens_seen);
    cJSON_AddNumberToObject(tr, "micro_batches", (double)s->micro_batches);
    cJSON_AddNumberToObject(tr, "lr", s->lr);
    if (s->run_config) {
        cJSON *rc = cJSON_Parse(s->run_config);
        if (rc) cJSON_AddItemToObject(tr, "run_config", rc);
        else cJSON_AddStringToObject(tr, "run_config", s->run_config);
    }
}

typedef struct {
    size_t w_params, w_bytes, o_values, o_bytes, bytes, stored;
} Totals;

static Totals totals_of(const CkptInfo *in)
{
    Totals t = { 0 };
    for (int i = 0; i < in->n_tensors; i++) {
        const CkptTensor *x = &in->tensors[i];
        if (is_weight(x->name)) {
            t.w_params += x->numel;
            t.w_bytes += x->bytes;
        } else if (is_moment(x->name)) {
            t.o_values += x->numel;
            t.o_bytes += x->bytes;
        }
        t.bytes += x->bytes;
        t.stored += x->stored_bytes;
    }
    return t;
}

static void print_info_json(const char *path, const CkptInfo *in)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", path);
    cJSON_AddStringToObject(o, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(o, "format_version", in->meta.format_version);
    cJSON_AddNumberToObject(o, "step", (double)in->meta.step);
    cJSON_AddNumberToObject(o, "tokens_seen", (double)in->meta.tokens_seen);
    cJSON_AddStringToObject(o, "dtype", ckpt_dtype_name(in->meta.dtype));
    cJSON *cfg = cJSON_Parse(in->config_json);
    if (cfg) cJSON_AddItemToObject(o, "config", cfg);
    cJSON *topo = cJSON_AddObjectToObject(o, "topology");
    cJSON_AddNumberToObject(topo, "world_size", in->meta.world);
    cJSON_AddNumberToObject(topo, "dp", in->meta.dp);
    cJSON_AddNumberToObject(topo, "tp", in->meta.tp);
    cJSON_AddNumberToObject(topo, "pp", in->meta.pp);
    cJSON_AddNumberToObject(topo, "ep", in->meta.ep);
    cJSON_AddNumberToObject(topo, "cp", in->meta.cp);
    add_state_json(o, in);
    cJSON *tok = cJSON_CreateObject();
    for (int i = 0; i < in->n_tensors; i++)
        if (is_tok(in->tensors[i].name)) cJSON_AddNumberToObject(tok, in->tensors[i].name + 10, (double)in->tensors[i].numel);
    if (tok->child) cJSON_AddItemToObject(o, "tokenizer", tok);
    else {
        cJSON_Delete(tok);
        cJSON_AddNullToObject(o, "tokenizer");
    }
    cJSON *arr = cJSON_AddArrayToObject(o, "tensors");
    for (int i = 0; i < in->n_tensors; i++) {
        const CkptTensor *t = &in->tensors[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", t->name);
        cJSON *sh = cJSON_AddArrayToObject(x, "shape");
        cJSON *ch = cJSON_AddArrayToObject(x, "chunk");
        for (int k = 0; k < t->ndim; k++) {
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[k]));
            cJSON_AddItemToArray(ch, cJSON_CreateNumber((double)t->chunk[k]));
        }
        cJSON_AddStringToObject(x, "dtype", t->dtype);
        if (t->partition[0]) cJSON_AddStringToObject(x, "partition", t->partition);
        else cJSON_AddNullToObject(x, "partition");
        cJSON_AddNumberToObject(x, "numel", (double)t->numel);
        cJSON_AddNumberToObject(x, "bytes", (double)t->bytes);
        cJSON_AddNumberToObject(x, "stored_bytes", (double)t->stored_bytes);
        cJSON_AddItemToArray(arr, x);
    }
    Totals tt = totals_of(in);
    cJSON *tot = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddNumberToObject(tot, "tensors", in->n_tensors);
    cJSON_AddNumberToObject(tot, "weight_params", (double)tt.w_params);
    cJSON_AddNumberToObject(tot, "weight_bytes", (double)tt.w_bytes);
    cJSON_AddNumberToObject(tot, "optimizer_values", (double)tt.o_values);
    cJSON_AddNumberToObject(tot, "optimizer_bytes", (double)tt.o_bytes);
    cJSON_AddNumberToObject(tot, "bytes", (double)tt.bytes);
    cJSON_AddNumberToObject(tot, "stored_bytes", (double)tt.stored);
    cJSON_AddNumberToObject(tot, "file_bytes", (double)in->file_bytes);
    char *s = cJSON_Print(o);
    puts(s);
    cJSON_free(s);
    cJSON_Delete(o);
}

static void print_info_text(const char *path, const CkptInfo *in)
{
    const CkptMeta *m = &in->meta;
    printf("checkpoint  %s (%.1f MiB on disk)\n", path, mib(in->file_bytes));
    printf("format      %s, version %d\n", CKPT_FORMAT, m->format_version);
    printf("step        %lld (tokens seen %lld)\n", (long long)m->step, (long long)m->tokens_seen);
    printf("topology    world %d = dp %d x tp %d x pp %d x cp %d, ep %d\n", m->world, m->dp, m->tp, m->pp, m->cp,
           m->ep);
    bool q8 = false;
    for (int i = 0; i < in->n_tensors; i++) q8 |= !strcmp(in->tensors[i].dtype, "int8");
    printf("weights     %s\n", q8 ? "int8 g32 (quantized: a float32 scale per 32 weights; routers, norms float32)"
                                   : ckpt_dtype_name(m->dtype));
    if (m->has_optimizer && in->st.has_trainer) {
        const CkptState *s = &in->st;
        printf("optimizer   AdamW beta1 %g beta2 %g eps %g weight_decay %g step %lld lr %g\n", s->beta1, s->beta2,
               s->adam_eps, s->weight_decay, (long long)s->adam_step, s->lr);
        printf("trainer     step %lld, micro-batches %lld, tokens %lld%s\n", (long long)s->step,
               (long long)s->micro_batches, (long long)s->tokens_seen, s->run_config ? ", run config stored" : "");
    } else {
        printf("optimizer   none (weights only)\n");
    }
    printf("tokenizer   ");
    int n_tok = 0;
    for (int i = 0; i < in->n_tensors; i++)
        if (is_tok(in->tensors[i].name))
            printf("%s%s (%zu bytes)", n_tok++ ? ", " : "", in->tensors[i].name + 10, in->tensors[i].numel);
    printf("%s\n", n_tok ? "" : "none (byte-level)");
    printf("config      %s\n\n", in->config_json);
    printf("%-52s %-14s %-9s %-12s %10s\n", "tensor", "shape", "dtype", "partition", "MiB");
    for (int i = 0; i < in->n_tensors; i++) {
        const CkptTensor *t = &in->tensors[i];
        char sh[64];
        fmt_shape(sh, sizeof sh, t);
        printf("%-52s %-14s %-9s %-12s %10.3f\n", t->name, sh, t->dtype, t->partition[0] ? t->partition : "-",
               mib(t->bytes));
    }
    Totals tt = totals_of(in);
    printf("\ntotals      %d tensors; weights %zu params (%.1f MiB); optimizer %zu values (%.1f MiB); "
           "data %.1f MiB, stored %.1f MiB\n",
           in->n_tensors, tt.w_params, mib(tt.w_bytes), tt.o_values, mib(tt.o_bytes), mib(tt.bytes), mib(tt.stored));
}

static int cmd_info(Args *a, int argc, char **argv)
{
    static const char *const spec[] = { "json", NULL };
    int r = parse(a, argc, argv, spec, 1, "info");
    if (r >= 0) return r;
    char path[PATH_MAX], err[512];
    if (ckpt_resolve(a->pos[0], path, sizeof path)) return 1;
    CkptInfo in;
    if (ckpt_info(path, &in, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    if (args_flag(a, "json")) print_info_json(path, &in);
    else print_info_text(path, &in);
    ckpt_info_free(&in);
    return 0;
}

/* ---------------------------------------------------------------- verify */

static int cmd_verify(Args *a, int argc, char **argv)
{
    static const char *const spec[] = { NULL };
    int r = parse(a, argc, argv, spec, 1, "verify");
    if (r >= 0) return r;
    char path[PATH_MAX], err[512];
    if (ckpt_resolve(a->pos[0], path, sizeof path)) return 1;
    double t0 = td_now();
    if (ckpt_verify(path, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    CkptInfo in;
    if (ckpt_info(path, &in, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    printf("ok: %s: %d tensors, %.1f MiB read, checksums and shapes verified (%.2f s)\n", path, in.n_tensors,
           mib(totals_of(&in).bytes), td_now() - t0);
    ckpt_info_free(&in);
    return 0;
}

/* ---------------------------------------------------------------- reshard / export */

static int get_size(const Args *a, const char *name, int *out)
{
    char err[160];
    double v;
    if (args_num(a, name, 1, 1, 4096, &v, err, sizeof err) < 0 || v != floor(v)) {
        td_error("ckpt reshard: --%s must be a whole number in [1, 4096]", name);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int reshard(Args *a, int argc, char **argv, bool export_mode)
{
    static const char *const spec[] = { "dp=", "tp=", "pp=", "ep=", "weights-only", "dtype=", "format=", NULL };
    const char *what = export_mode ? "export" : "reshard";
    int r = parse(a, argc, argv, spec, 2, what);
    if (r >= 0) return r;
    const char *fmt = args_get(a, "format");
    if (fmt && (!export_mode || strcmp(fmt, "tandem"))) {
        td_error("ckpt %s: --format must be tandem or hf (got \"%s\")", what, fmt);
        return 2;
    }
    char in[PATH_MAX], err[512];
    const char *out = a->pos[1];
    if (ckpt_resolve(a->pos[0], in, sizeof in)) return 1;
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(in, &cfg, &meta, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    int dp, tp, pp, ep;
    if (get_size(a, "dp", &dp) || get_size(a, "tp", &tp) || get_size(a, "pp", &pp) || get_size(a, "ep", &ep))
        return 2;
    CkptDtype dtype = meta.dtype;
    const char *ds = args_get(a, "dtype");
    if (ds && ckpt_dtype_parse(ds, &dtype)) {
        td_error("ckpt %s: --dtype must be f32, bf16 or f16 (got \"%s\")", what, ds);
        return 2;
    }
    bool weights_only = export_mode || args_flag(a, "weights-only") || !meta.has_optimizer || !meta.has_trainer;
    Topology as;
    if (topo_init(&as, &cfg, dp, tp, pp, ep, 1, 0, NULL, err, sizeof err)) {
        td_error("%s: %s", out, err);
        return 1;
    }
    if (!strcmp(in, out)) {
        td_error("ckpt %s: IN and OUT are the same file", what);
        return 2;
    }

    double t0 = td_now();
    Topology single;
    topo_single(&single, &cfg);
    Model m;
    model_init(&m, &cfg, &single, false, 16);
    float *ea = NULL, *eas = NULL;
    if (!weights_only) {
        ea = td_malloc(td_max(m.n_w, 1) * sizeof(float));
        eas = td_malloc(td_max(m.n_w, 1) * sizeof(float));
    }
    CkptState st;
    memset(&st, 0, sizeof st);
    int rc = 1;
    if (ckpt_load(in, &m, ea, eas, &st, err, sizeof err)) {
        td_error("%s", err);
        goto out;
    }
    if (ckpt_export(out, &m, ea, eas, &st, dtype, &as)) goto out;
    printf("wrote %s: step %lld, topology dp %d tp %d pp %d ep %d, weights %s%s (%.2f s)\n", out,
           (long long)st.step, dp, tp, pp, ep, ckpt_dtype_name(dtype),
           weights_only ? ", weights only" : ", with optimizer and trainer state", td_now() - t0);
    rc = 0;
out:
    ckpt_state_free(&st);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    return rc;
}

/* ---------------------------------------------------------------- export --format hf */

static int export_hf(Args *a, int argc, char **argv)
{
    static const char *const spec[] = { "format=", "dtype=", "shard-mb=", "layout=", NULL };
    int r = parse(a, argc, argv, spec, 2, "export");
    if (r >= 0) return r;
    char in[PATH_MAX], err[1024];
    if (ckpt_resolve(a->pos[0], in, sizeof in)) return 1;
    HfExportOpts o = { NULL, 0, 0 };
    CkptDtype dt;
    const char *ds = args_get(a, "dtype"), *ls = args_get(a, "layout");
    if (ds && ckpt_dtype_parse(ds, &dt)) {
        td_error("ckpt export: --dtype must be f32, bf16 or f16 (got \"%s\")", ds);
        return 2;
    }
    if (ds) o.dtype = &dt;
    if (ls && strcmp(ls, "v4") && strcmp(ls, "v5")) {
        td_error("ckpt export: --layout must be v4 or v5 (got \"%s\")", ls);
        return 2;
    }
    if (ls) o.layout = !strcmp(ls, "v4") ? HF_V4 : HF_V5;
    double mb;
    if (args_num(a, "shard-mb", 2048, 1.0 / 1024, 1 << 24, &mb, err, sizeof err) < 0) {
        td_error("ckpt export: %s", err);
        return 2;
    }
    o.shard_bytes = (size_t)(mb * 1048576.0);
    double t0 = td_now();
    HfExportReport rep;
    if (hf_export(in, a->pos[1], &o, &rep, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    if (rep.note[0]) td_info("note: %s", rep.note);
    printf("wrote %s: %s (%s layout), %d tensors in %d safetensors file%s (%.1f MiB), config.json %s%s (%.2f s)\n",
           a->pos[1], rep.architecture, rep.layout, rep.n_tensors, rep.n_files, rep.n_files > 1 ? "s" : "",
           mib(rep.bytes), rep.original_config ? "as imported" : "written for the family",
           rep.tokenizer ? ", tokenizer" : "", td_now() - t0);
    return 0;
}

static int cmd_export(Args *a, int argc, char **argv)
{
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--format") && !strcmp(argv[i + 1], "hf")) return export_hf(a, argc, argv);
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--format=hf")) return export_hf(a, argc, argv);
    return reshard(a, argc, argv, true);
}

/* ---------------------------------------------------------------- diff */

static int cmd_diff(Args *a, int argc, char **argv)
{
    static const char *const spec[] = { NULL };
    int r = parse(a, argc, argv, spec, 2, "diff");
    if (r >= 0) return r;
    char pa[PATH_MAX], pb[PATH_MAX], err[512];
    if (ckpt_resolve(a->pos[0], pa, sizeof pa) || ckpt_resolve(a->pos[1], pb, sizeof pb)) return 1;
    CkptInfo ia, ib;
    if (ckpt_info(pa, &ia, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    if (ckpt_info(pb, &ib, err, sizeof err)) {
        td_error("%s", err);
        ckpt_info_free(&ia);
        return 1;
    }
    int rc = 0, n_same = 0, n_cmp = 0, n_other = 0;
    double worst_abs = 0, worst_rel = 0;
    if (strcmp(ia.config_json, ib.config_json)) printf("note: the configs differ\n");
    printf("%-52s %14s %14s\n", "tensor", "max_abs", "max_rel");
    for (int i = 0; i < ia.n_tensors && !rc; i++) {
        const CkptTensor *ta = &ia.tensors[i], *tb = NULL;
        for (int j = 0; j < ib.n_tensors && !tb; j++)
            if (!strcmp(ib.tensors[j].name, ta->name)) tb = &ib.tensors[j];
        bool fa = !strcmp(ta->dtype, "float32") || !strcmp(ta->dtype, "float16") || !strcmp(ta->dtype, "bfloat16");
        if (!tb) {
            printf("%-52s %s\n", ta->name, "only in A");
            n_other++;
            continue;
        }
        bool same_shape = ta->ndim == tb->ndim && !memcmp(ta->shape, tb->shape, sizeof ta->shape);
        if (!same_shape) {
            printf("%-52s %s\n", ta->name, "shapes differ");
            n_other++;
            continue;
        }
        if (!fa) {
            printf("%-52s %14s\n", ta->name, ta->dtype);   /* trainer integers: not compared */
            continue;
        }
        size_t na, nb;
        float *xa = ckpt_read_tensor(pa, ta->name, &na, err, sizeof err);
        float *xb = xa ? ckpt_read_tensor(pb, ta->name, &nb, err, sizeof err) : NULL;
        if (!xa || !xb) {
            td_error("%s", err);
            td_free(xa);
            rc = 1;
            break;
        }
        double mabs = 0, mrel = 0;
        for (size_t k = 0; k < na; k++) {
            double x = xa[k], y = xb[k], d = fabs(x - y);
            if (isnan(x) != isnan(y)) d = INFINITY;
            else if (isnan(x) || x == y) d = 0;
            double s = fmax(fabs(x), fabs(y));
            mabs = fmax(mabs, d);
            if (d > 0) mrel = fmax(mrel, s > 0 ? d / s : INFINITY);
        }
        printf("%-52s %14.6g %14.6g\n", ta->name, mabs, mrel);
        n_cmp++;
        n_same += mabs == 0;
        worst_abs = fmax(worst_abs, mabs);
        worst_rel = fmax(worst_rel, mrel);
        td_free(xa);
        td_free(xb);
    }
    for (int j = 0; j < ib.n_tensors && !rc; j++) {
        bool found = false;
        for (int i = 0; i < ia.n_tensors && !found; i++) found = !strcmp(ia.tensors[i].name, ib.tensors[j].name);
        if (!found) {
            printf("%-52s %s\n", ib.tensors[j].name, "only in B");
            n_other++;
        }
    }
    if (!rc)
        printf("\n%d tensors compared, %d identical; max abs %.6g, max rel %.6g; %d not comparable\n", n_cmp, n_same,
               worst_abs, worst_rel, n_other);
    ckpt_info_free(&ia);
    ckpt_info_free(&ib);
    return rc;
}

/* ---------------------------------------------------------------- import */

static int cmd_import(Args *a, int argc, char **argv)
{
    static const char *const spec[] = { "dtype=", "list-families", NULL };
    char err[1024];
    if (args_parse(a, argc, argv, 2, spec, err, sizeof err)) {
        td_error("ckpt import: %s (tandem ckpt --help)", err);
        return 2;
    }
    if (a->help) {
        fputs(g_usage, stdout);
        return 0;
    }
    if (args_flag(a, "list-families")) {
        hf_families_print();
        return 0;
    }
    if (a->n_pos != 2) {
        td_error("ckpt import: expected HF_DIR and OUT, got %d argument%s (tandem ckpt --help)", a->n_pos,
                 a->n_pos == 1 ? "" : "s");
        return 2;
    }
    CkptDtype dt;
    const char *ds = args_get(a, "dtype");
    if (ds && ckpt_dtype_parse(ds, &dt)) {
        td_error("ckpt import: --dtype must be f32, bf16 or f16 (got \"%s\")", ds);
        return 2;
    }
    if (!ckpt_is_hf_dir(a->pos[0])) {
        td_error("ckpt import: %s is not a Hugging Face model directory (config.json and model.safetensors or "
                 "model.safetensors.index.json)", a->pos[0]);
        return 1;
    }
    HfImportReport rep;
    if (hf_import(a->pos[0], a->pos[1], ds ? &dt : NULL, &rep, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    printf("wrote %s: %s (%s layout), %d tensors, weights %s%s; read %.1f MiB in %.2f s (%.2f GB/s), "
           "peak RSS %.1f MiB (largest tensor %.1f MiB)\n",
           a->pos[1], rep.architecture, rep.layout, rep.n_tensors, ckpt_dtype_name(rep.dtype),
           rep.tokenizer ? ", tokenizer" : "", mib(rep.bytes_read), rep.seconds,
           rep.seconds > 0 ? (double)rep.bytes_read / rep.seconds / 1e9 : 0.0, mib(td_rss_peak()), mib(rep.largest));
    return 0;
}

/* ---------------------------------------------------------------- dispatch */

/* `export ... --format F` (or --format=F) */
static bool export_format_is(int argc, char **argv, const char *f)
{
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--format") && i + 1 < argc && !strcmp(argv[i + 1], f)) return true;
        if (!strncmp(argv[i], "--format=", 9) && !strcmp(argv[i] + 9, f)) return true;
    }
    return false;
}

int cmd_ckpt(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(g_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (comm_size() > 1) {
        td_error("tandem ckpt runs in one process (not under mpirun -np > 1)");
        return 2;
    }
    const char *sub = argv[1];
    Args a = { 0 };   /* parsed by the subcommand, released here */
    int rc = 2;
    if (!strcmp(sub, "info")) rc = cmd_info(&a, argc, argv);
    else if (!strcmp(sub, "verify")) rc = cmd_verify(&a, argc, argv);
    else if (!strcmp(sub, "reshard")) rc = reshard(&a, argc, argv, false);
    else if (!strcmp(sub, "export") && export_format_is(argc, argv, "gguf")) rc = gguf_export_cmd(argc, argv);
    else if (!strcmp(sub, "export")) rc = cmd_export(&a, argc, argv);
    else if (!strcmp(sub, "diff")) rc = cmd_diff(&a, argc, argv);
    else if (!strcmp(sub, "import")) rc = cmd_import(&a, argc, argv);
    else td_error("ckpt: unknown subcommand '%s' (tandem ckpt --help)", sub);
    args_free(&a);
    return rc;
}

/* checkpoint/hf/hf_export.c - tandem checkpoint -> Hugging Face directory
 * (hf_export.h).
 *
 * The HF tensors are the family rows expanded for every tandem parameter
 * (hf_map.h: hf_rule_for, hf_expand), in model order; a fused v5 tensor
 * collects the parts its rows name.  Shards take them in that order up to
 * the shard size, as transformers shards a state dict; inside a file they
 * are laid out as the reference writer lays them out (widest dtype first,
 * then by name) after a compact JSON header padded with spaces to a
 * multiple of 8.  Values go float32 -> the tensor's dtype with core/dtype.c
 * (round to nearest even), which gives a bf16 or f16 value back exactly.
 */
#include "checkpoint/hf/hf_export.h"
#include "checkpoint/ckpt_h5.h"
#include "checkpoint/ckpt_q8.h"
#include "checkpoint/hf/families.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/hf_map.h"
#include "checkpoint/hf/safetensors.h"
#include "core/common.h"
#include "core/dtype.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_NAME_MAX 256
#define DEFAULT_SHARD (2ull << 30)

typedef struct {
    int param;          /* index into the parameter table */
    const HfTensor *rule;
    int expert;         /* HFT_STACK: which expert */
} Contrib;

typedef struct {
    char name[HF_NAME_MAX];
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    StDtype dtype;
    Contrib c[4];       /* the tandem tensors it is made of (parts of a fused one) */
    int n_c;
    size_t numel, bytes;
    int shard;
    uint64_t begin;     /* in its file's data section */
} OutT;

typedef struct {
    OutT *t;
    int n, cap;
    int param;
    const HfTensor *rule;
} Plan;

static int add_out(void *vctx, const char *name, int ndim, const uint64_t *shape, int expert)
{
    Plan *p = vctx;
    OutT *o = NULL;
    /* the parts of a fused tensor come from consecutive parameters */
    for (int i = p->n - 1; i >= 0 && i >= p->n - 8 && !o; i--)
        if (!strcmp(p->t[i].name, name)) o = &p->t[i];
    if (!o) {
        if (p->n == p->cap) {
            p->cap = p->cap ? 2 * p->cap : 256;
            OutT *nt = td_malloc((size_t)p->cap * sizeof *nt);
            if (p->n) memcpy(nt, p->t, (size_t)p->n * sizeof *nt);
            td_free(p->t);
            p->t = nt;
        }
        o = &p->t[p->n++];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", name);
        o->ndim = ndim;
        memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
        o->numel = 1;
        for (int i = 0; i < ndim; i++) o->numel *= (size_t)shape[i];
    }
    if (o->n_c == 4) return -1;
    o->c[o->n_c++] = (Contrib){ p->param, p->rule, expert };
    return 0;
}

static StDtype st_of(CkptDtype t) { return t == CKPT_BF16 ? ST_BF16 : t == CKPT_F16 ? ST_F16 : ST_F32; }
static const char *torch_name(StDtype t) { return t == ST_BF16 ? "bfloat16" : t == ST_F16 ? "float16" : "float32"; }

/* The reference writer's order: dtype (its enum order, widest first), then name. */
static int cmp_layout(const void *a, const void *b)
{
    const OutT *x = *(const OutT *const *)a, *y = *(const OutT *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* src (whole, shape ss) into dst (shape ds) at offset doff; float32. */
static void place(float *dst, const uint64_t *ds, const size_t *doff, const float *src, const size_t *ss, int nd)
{
    size_t rows = 1, row = ss[nd - 1], idx[ST_MAX_DIMS] = { 0 };
    for (int i = 0; i < nd - 1; i++) rows *= ss[i];
    for (size_t r = 0; r < rows; r++) {
        size_t at = 0;
        for (int i = 0; i < nd; i++) at = at * (size_t)ds[i] + doff[i] + (i < nd - 1 ? idx[i] : 0);
        memcpy(dst + at, src + r * row, row * sizeof(float));
        for (int i = nd - 2; i >= 0; i--) {
            if (++idx[i] < ss[i]) break;
            idx[i] = 0;
        }
    }
}

typedef struct {
    hid_t f;
    const char *path;
    const Param *ps;
    CkptH5Desc *desc;   /* per parameter */
} Src;

/* The float32 values of HF tensor t into buf (t->numel floats); tmp holds
 * a whole tandem tensor (for the parts of a fused one). */
static int build(const Src *s, const OutT *t, float *buf, float *tmp, char *err, size_t err_len)
{
    for (int k = 0; k < t->n_c; k++) {
        const Contrib *c = &t->c[k];
        const Param *p = &s->ps[c->param];
        const CkptH5Desc *d = &s->desc[c->param];
        hsize_t off[CKPT_H5_MAX_DIMS] = { 0 }, cnt[CKPT_H5_MAX_DIMS];
        for (int i = 0; i < p->ndim; i++) cnt[i] = p->shape[i];
        int rc;
        /* float types upcast, int8 g32 dequantized (q * s): ckpt_q8.h */
        if (c->rule->how == HFT_STACK) {
            off[0] = (hsize_t)c->expert;
            cnt[0] = 1;
            rc = ckpt_read_box_f32(s->f, s->path, p->name, d, off, cnt, buf, err, err_len);
        } else if (c->rule->how == HFT_COPY) {
            rc = ckpt_read_box_f32(s->f, s->path, p->name, d, off, cnt, buf, err, err_len);
        } else {
            rc = ckpt_read_box_f32(s->f, s->path, p->name, d, off, cnt, tmp, err, err_len);
            size_t doff[ST_MAX_DIMS] = { 0 };
            doff[c->rule->dim] = (size_t)c->rule->part * p->shape[c->rule->dim];
            if (!rc) place(buf, t->shape, doff, tmp, p->shape, p->ndim);
        }
        if (rc) return -1;
    }
    return 0;
}

static int write_all(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n ? 0 : -1; }

static void shard_name(char *out, size_t n, int i, int n_files)
{
    if (n_files == 1) snprintf(out, n, "%s", ST_SINGLE_NAME);
    else snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, n_files);
}

/* Writes path via path.tmp + rename. */
static int write_text(const char *dir, const char *name, const char *text, size_t len, char *err, size_t err_len)
{
    char *path = td_sprintf("%s/%s", dir, name), *tmp = td_sprintf("%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    int rc = !fp || write_all(fp, text, len) || fflush(fp) || fsync(fileno(fp));
    if (fp && fclose(fp)) rc = 1;
    if (!rc && rename(tmp, path)) rc = 1;
    if (rc) {
        snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
    }
    td_free(path);
    td_free(tmp);
    return rc ? -1 : 0;
}

/* One safetensors file: the tensors of shard `shard`. */
static int write_shard(const Src *s, OutT *ts, int n, int shard, int n_files, const char *dir, float *buf, float *tmp,
                       uint16_t *half, char *err, size_t err_len)
{
    OutT **in = td_malloc((size_t)td_max((size_t)n, 1) * sizeof *in);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ts[i].shard == shard) in[m++] = &ts[i];
    qsort(in, (size_t)m, sizeof *in, cmp_layout);
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t at = 0;
    for (int i = 0; i < m; i++) {
        OutT *t = in[i];
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int k = 0; k < t->ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[k]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(at + t->bytes)));
        t->begin = at;
        at += t->bytes;
    }
    char *hj = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(hj), padded = (hl + 7) / 8 * 8;
    char name[64];
    shard_name(name, sizeof name, shard, n_files);
    char *path = td_sprintf("%s/%s", dir, name), *tmpf = td_sprintf("%s.tmp", path);
    FILE *fp = fopen(tmpf, "wb");
    int rc = -1;
    if (!fp) {
        snprintf(err, err_len, "%s: cannot create: %s", tmpf, strerror(errno));
        goto out;
    }
    setvbuf(fp, NULL, _IOFBF, 1u << 20);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool bad = write_all(fp, len8, 8) || write_all(fp, hj, hl);
    for (size_t i = hl; i < padded && !bad; i++) bad = fputc(' ', fp) == EOF;
    for (int i = 0; i < m && !bad; i++) {
        const OutT *t = in[i];
        if (build(s, t, buf, tmp, err, err_len)) goto out;
        if (t->dtype == ST_F32) {
            bad = write_all(fp, buf, t->numel * 4);
        } else {
            for (size_t k = 0; k < t->numel; k++)
                half[k] = t->dtype == ST_BF16 ? dtype_bf16_from_f32(buf[k]) : dtype_f16_from_f32(buf[k]);
            bad = write_all(fp, half, t->numel * 2);
        }
    }
    if (bad || fflush(fp) || fsync(fileno(fp))) {
        snprintf(err, err_len, "%s: write error: %s", tmpf, strerror(errno));
        goto out;
    }
    int c = fclose(fp);
    fp = NULL;
    if (c || rename(tmpf, path)) {
        snprintf(err, err_len, "%s: cannot publish: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (fp) fclose(fp);
    if (rc) unlink(tmpf);
    td_free(path);
    td_free(tmpf);
    cJSON_free(hj);
    td_free(in);
    return rc;
}

/* out_dir exists (made when missing) and holds no model yet. */
static int prepare_dir(const char *dir, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(dir, &sb)) {
        if (mkdir(dir, 0755)) {
            snprintf(err, err_len, "%s: cannot create the directory: %s", dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "%s: exists and is not a directory", dir);
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, err_len, "%s: cannot list: %s", dir, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (struct dirent *de; (de = readdir(d)) && !rc;) {
        size_t l = strlen(de->d_name);
        if (!strcmp(de->d_name, HF_CONFIG_NAME) || (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors"))) {
            snprintf(err, err_len, "%s: already holds a model (%s): refusing to mix files", dir, de->d_name);
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

int hf_export(const char *ckpt, const char *out_dir, const HfExportOpts *o, HfExportReport *rep, char *err,
              size_t err_len)
{
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(ckpt, &cfg, &meta, err, err_len)) return -1;
    if (ckpt_is_hf_dir(ckpt)) {
        snprintf(err, err_len, "%s: already a Hugging Face directory (import it first to change it)", ckpt);
        return -1;
    }
    if (config_vision(&cfg)) {   /* the families are text models: the tower would be dropped */
        snprintf(err, err_len, "%s: a vision-language model (vision_config): Hugging Face export of its vision tower "
                 "is not supported yet", ckpt);
        return -1;
    }
    HfExportReport r;
    memset(&r, 0, sizeof r);
    hid_t f = ckpt_h5_open(ckpt);
    if (f < 0) {
        snprintf(err, err_len, "%s: cannot open", ckpt);
        return -1;
    }
    char *arch = NULL, *layout_s = NULL, *orig = NULL;
    ckpt_h5_get_str(f, "hf_architecture", &arch);
    ckpt_h5_get_str(f, "hf_layout", &layout_s);
    ckpt_h5_get_str(f, "hf_config", &orig);
    Param *ps = NULL;
    int np = 0;
    CkptH5Desc *desc = NULL;
    StDtype *pdt = NULL;
    Plan pl = { NULL, 0, 0, 0, NULL };
    char *config_text = NULL;
    float *buf = NULL, *tmp = NULL;
    uint16_t *half = NULL;
    CkptTokFiles tok;
    memset(&tok, 0, sizeof tok);
    int rc = -1;

    /* family: as imported, else the first that expresses the config */
    const HfFamily *fam = arch ? hf_family_find(arch) : NULL;
    bool original = false;
    if (arch && !fam) {
        snprintf(err, err_len, "%s: attribute hf_architecture \"%s\" is not a family this tandem writes", ckpt, arch);
        goto out;
    }
    if (fam && orig) {   /* the imported config.json, when it is still this model's */
        HfConfig hc;
        char why[512];
        if (hf_config_parse(&hc, orig, "hf_config", why, sizeof why) == 0) {
            char *a = config_to_json(&hc.cfg), *b = config_to_json(&cfg);
            original = !strcmp(a, b);
            td_free(a);
            td_free(b);
            hf_config_free(&hc);
        }
    }
    if (fam && !original) {   /* still expressible by the family it came from? */
        char why[512] = "", e2[512];
        char *text = hf_config_write(fam, &cfg, HF_V4, "float32", NULL, e2, sizeof e2);
        HfConfig back;
        bool ok = text && hf_config_parse(&back, text, "config.json", e2, sizeof e2) == 0;
        if (ok) {
            ok = hf_config_same_math(&cfg, &back.cfg, why, sizeof why);
            hf_config_free(&back);
        } else {
            snprintf(why, sizeof why, "%s", e2);
        }
        td_free(text);
        if (!ok) {
            snprintf(err, err_len, "%s: the model no longer fits %s: %s", ckpt, fam->architecture, why);
            goto out;
        }
    }
    if (!fam) {
        char e2[1024];
        fam = hf_config_family_of(&cfg, r.note, sizeof r.note, e2, sizeof e2);
        if (!fam) {
            snprintf(err, err_len, "%s: %s", ckpt, e2);
            goto out;
        }
    }
    HfLayout layout = o->layout ? (HfLayout)o->layout
                      : layout_s && !strcmp(layout_s, "v5") ? HF_V5 : HF_V4;
    if (!(fam->layouts & layout)) {
        snprintf(err, err_len, "%s: %s has no %s layout", ckpt, fam->architecture, layout == HF_V4 ? "v4" : "v5");
        goto out;
    }
    if (layout_s && strcmp(layout_s, layout == HF_V5 ? "v5" : "v4")) original = false;   /* another layout: its own config */

    /* the tandem tensors, their storage and the HF dtype each goes to */
    Topology t1;
    topo_single(&t1, &cfg);
    np = model_param_table(&cfg, &t1, &ps);
    desc = td_calloc((size_t)td_max((size_t)np, 1) * sizeof *desc);
    pdt = td_calloc((size_t)td_max((size_t)np, 1) * sizeof *pdt);
    size_t max_param = 1;
    for (int i = 0; i < np; i++) {
        if (ckpt_h5_describe(f, ps[i].name, &desc[i])) {
            snprintf(err, err_len, "%s: dataset /%s is missing", ckpt, ps[i].name);
            goto out;
        }
        size_t numel = 1;
        for (int k = 0; k < ps[i].ndim; k++) numel *= ps[i].shape[k];
        max_param = td_max(max_param, numel);
        pdt[i] = st_of(meta.dtype);
        hid_t ds = H5Dopen2(f, ps[i].name, H5P_DEFAULT);
        char *hd = NULL;
        StDtype t;
        if (ds >= 0 && ckpt_h5_get_str(ds, "hf_dtype", &hd) == 0 && st_dtype_parse(hd, &t) == 0 &&
            (t == ST_F32 || t == ST_BF16 || t == ST_F16))
            pdt[i] = t;
        td_free(hd);
        if (ds >= 0) H5Dclose(ds);
        if (o->dtype) pdt[i] = st_of(*o->dtype);
    }
    /* the HF tensors */
    for (int i = 0; i < np; i++) {
        int layer;
        pl.param = i;
        pl.rule = hf_rule_for(fam, layout, ps[i].name, &layer);
        if (!pl.rule || hf_expand(pl.rule, layer, ps[i].ndim, ps[i].shape, add_out, &pl) < 0) {
            snprintf(err, err_len, "%s: %s cannot write tandem parameter %s", ckpt, fam->architecture, ps[i].name);
            goto out;
        }
    }
    size_t shard = o->shard_bytes ? o->shard_bytes : DEFAULT_SHARD, acc = 0, max_out = 1;
    int n_files = 0;
    for (int i = 0; i < pl.n; i++) {
        OutT *t = &pl.t[i];
        t->dtype = pdt[t->c[0].param];
        t->bytes = t->numel * st_dtype_size(t->dtype);
        if (!n_files || (acc > 0 && acc + t->bytes > shard)) {
            n_files++;
            acc = 0;
        }
        t->shard = n_files - 1;
        acc += t->bytes;
        r.bytes += t->bytes;
        max_out = td_max(max_out, t->numel);
    }
    /* config.json: the imported text, or the family's */
    StDtype cfg_dt = pdt[0];
    if (ckpt_read_tok_files(ckpt, &tok, err, err_len)) goto out;
    if (original) {
        HfConfig hc;
        char why[256];
        hf_config_parse(&hc, orig, "hf_config", why, sizeof why);
        bool same_dtype = !strcmp(hc.dtype, torch_name(cfg_dt));
        /* an FP8 import is written in bf16/f32: its quantization_config goes (hf_config_set_dtype) */
        bool quant = hc.fp8_block[0] > 0;
        config_text = same_dtype && !quant ? td_strdup(orig) : hf_config_set_dtype(orig, layout, torch_name(cfg_dt));
        hf_config_free(&hc);
    } else {
        config_text = hf_config_write(fam, &cfg, layout, torch_name(cfg_dt), tok.generation_config, err, err_len);
    }
    if (!config_text) {
        if (!err[0]) snprintf(err, err_len, "%s: cannot write config.json", ckpt);
        goto out;
    }
    if (prepare_dir(out_dir, err, err_len)) goto out;

    buf = td_malloc(max_out * sizeof(float));
    tmp = td_malloc(max_param * sizeof(float));
    half = td_malloc(max_out * sizeof(uint16_t));
    Src s = { f, ckpt, ps, desc };
    for (int k = 0; k < n_files; k++)
        if (write_shard(&s, pl.t, pl.n, k, n_files, out_dir, buf, tmp, half, err, err_len)) goto out;
    if (n_files > 1) {
        cJSON *idx = cJSON_CreateObject();
        cJSON *m = cJSON_AddObjectToObject(idx, "metadata");
        cJSON_AddNumberToObject(m, "total_size", (double)r.bytes);
        cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
        for (int i = 0; i < pl.n; i++) {
            char name[64];
            shard_name(name, sizeof name, pl.t[i].shard, n_files);
            cJSON_AddStringToObject(wm, pl.t[i].name, name);
        }
        char *text = hf_json_dump(idx);
        cJSON_Delete(idx);
        int w = write_text(out_dir, ST_INDEX_NAME, text, strlen(text), err, err_len);
        td_free(text);
        if (w) goto out;
    }
    if (write_text(out_dir, HF_CONFIG_NAME, config_text, strlen(config_text), err, err_len)) goto out;
    const struct { const char *name; const char *text; size_t len; } files[3] = {
        { "tokenizer.json", tok.tokenizer_json, tok.tokenizer_json_len },
        { "tokenizer_config.json", tok.tokenizer_config, tok.tokenizer_config_len },
        { "generation_config.json", tok.generation_config, tok.generation_config_len },
    };
    for (int i = 0; i < 3; i++)
        if (files[i].text && write_text(out_dir, files[i].name, files[i].text, files[i].len, err, err_len)) goto out;

    snprintf(r.architecture, sizeof r.architecture, "%s", fam->architecture);
    r.layout = layout == HF_V4 ? "v4" : "v5";
    r.n_files = n_files;
    r.n_tensors = pl.n;
    r.original_config = original;
    r.tokenizer = tok.tokenizer_json != NULL;
    if (rep) *rep = r;
    rc = 0;
out:
    H5Fclose(f);
    td_free(arch);
    td_free(layout_s);
    td_free(orig);
    td_free(ps);
    td_free(desc);
    td_free(pdt);
    td_free(pl.t);
    td_free(config_text);
    td_free(buf);
    td_free(tmp);
    td_free(half);
    ckpt_tok_files_free(&tok);
    return rc;
}

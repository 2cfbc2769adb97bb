/* checkpoint/hf/hf_config.c - config.json <-> tandem model config
 * (hf_config.h).
 *
 * Reading runs the family's key table in two passes: the keys present
 * (copies, rules), then the absent ones with the config class's default,
 * which never overrides a value a present key set (so "num_experts" given
 * beats "num_local_experts" absent).  Two present keys that set one tandem
 * key to different values are refused.  Rules that depend on other keys
 * (a sliding window against max_position_embeddings) read those keys'
 * values as given, or their defaults.
 */
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/safetensors.h"
#include "core/common.h"
#include "core/model/model.h"
#include "core/model/topology.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool hf_is_dir(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode)) return false;
    static const char *const need[3] = { HF_CONFIG_NAME, ST_SINGLE_NAME, ST_INDEX_NAME };
    bool have[3];
    for (int i = 0; i < 3; i++) {
        char *p = td_sprintf("%s/%s", path, need[i]);
        have[i] = access(p, F_OK) == 0;
        td_free(p);
    }
    return have[0] && (have[1] || have[2]);
}

void hf_config_free(HfConfig *c)
{
    if (!c) return;
    td_free(c->text);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    const HfFamily *fam;
    const cJSON *hf;       /* config.json */
    cJSON *out;            /* tandem keys */
    cJSON *src;            /* tandem key -> the config.json key that set it */
    cJSON *defaults;       /* parsed absent values, by key */
    const char *label;
    char *err;
    size_t err_len;
    char *notes;
    size_t notes_len;
    int *fp8_block;        /* quantization_config fp8: its weight_block_size (HfConfig) */
} Ctx;

static int refuse(Ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(Ctx *x, const char *fmt, ...)
{
    int k = snprintf(x->err, x->err_len, "%s: ", x->label);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < x->err_len) vsnprintf(x->err + k, x->err_len - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static void note(Ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(Ctx *x, const char *fmt, ...)
{
    size_t k = strlen(x->notes);
    if (k && k + 2 < x->notes_len) {
        snprintf(x->notes + k, x->notes_len - k, "; ");
        k += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    if (k < x->notes_len) vsnprintf(x->notes + k, x->notes_len - k, fmt, ap);
    va_end(ap);
}

/* A value as a short string for messages. */
static const char *show(const cJSON *v, char *buf, size_t n)
{
    if (!v) return "(absent)";
    char *s = cJSON_PrintUnformatted(v);
    snprintf(buf, n, "%.80s", s ? s : "?");
    cJSON_free(s);
    return buf;
}

static const HfKey *row_of(const HfFamily *fam, const char *key)
{
    for (const HfKey *k = fam->keys; k->key; k++)
        if (!strcmp(k->key, key)) return k;
    return NULL;
}

/* The value of config.json key `key`: as given (null included), else the
 * family's default (NULL when it has none). */
static const cJSON *value_of(Ctx *x, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(x->hf, key);
    if (v) return v;
    return cJSON_GetObjectItemCaseSensitive(x->defaults, key);
}

static double num_of(Ctx *x, const char *key, double dflt)
{
    const cJSON *v = value_of(x, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* out[tkey] = val, set by config.json key `from`; given: the key was in
 * the file (an absent default never overrides, and never conflicts). */
static int put(Ctx *x, const char *tkey, const cJSON *val, const char *from, bool given)
{
    cJSON *prev = cJSON_GetObjectItemCaseSensitive(x->out, tkey);
    if (prev) {
        if (!given || cJSON_Compare(prev, val, true)) return 0;
        const cJSON *who = cJSON_GetObjectItemCaseSensitive(x->src, tkey);
        char a[96], b[96];
        return refuse(x, "%s %s and %s %s disagree", cJSON_IsString(who) ? who->valuestring : "?", show(prev, a, sizeof a),
                      from, show(val, b, sizeof b));
    }
    cJSON_AddItemToObject(x->out, tkey, cJSON_Duplicate(val, true));
    cJSON_AddItemToObject(x->src, tkey, cJSON_CreateString(from));
    return 0;
}

static int put_num(Ctx *x, const char *tkey, double v, const char *from, bool given)
{
    cJSON *n = cJSON_CreateNumber(v);
    int rc = put(x, tkey, n, from, given);
    cJSON_Delete(n);
    return rc;
}

static int do_copy(Ctx *x, const HfKey *k, const cJSON *v, bool given)
{
    cJSON *nv = NULL;
    if (cJSON_IsNull(v)) {
        if (!k->null_is) return refuse(x, "%s must not be null", k->key);
        v = nv = cJSON_Parse(k->null_is);
    }
    char keys[128];
    snprintf(keys, sizeof keys, "%s", k->tkey);
    int rc = 0;
    for (char *save = NULL, *t = strtok_r(keys, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save))
        rc = put(x, t, v, k->key, given);
    cJSON_Delete(nv);
    return rc;
}

static const char *rope_type(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : t ? "?" : "default";
}

static int do_rule(Ctx *x, const HfKey *k, const cJSON *v, bool given)
{
    char b[96], c[96];
    const double max_pos = num_of(x, "max_position_embeddings", 0);
    switch (k->rule) {
    case HFR_NONE:
    case HFR_AUX:
        return 0;
    case HFR_ACT:
        if (cJSON_IsString(v) && (!strcmp(v->valuestring, "silu") || !strcmp(v->valuestring, "swish"))) return 0;
        return refuse(x, "hidden_act %s is not supported (tandem's MLPs are SwiGLU: silu)", show(v, b, sizeof b));
    case HFR_ROPE_SCALING:
        if (!v || cJSON_IsNull(v)) return 0;
        if (!cJSON_IsObject(v)) return refuse(x, "rope_scaling %s is not an object or null", show(v, b, sizeof b));
        if (!strcmp(rope_type(v), "default") && cJSON_GetArraySize(v) <= 2) return 0;
        /* linear, yarn: the tandem key takes the object (config.c checks it, refusing other types by name) */
        return put(x, "rope_scaling", v, "rope_scaling", given);
    case HFR_ROPE_PARAMS: {
        if (!v || cJSON_IsNull(v)) return 0;
        if (!cJSON_IsObject(v)) return refuse(x, "rope_parameters %s is not an object or null", show(v, b, sizeof b));
        cJSON *sc = cJSON_CreateObject();
        for (const cJSON *it = v->child; it; it = it->next) {
            if (!strcmp(it->string, "rope_theta")) continue;
            if (!strcmp(it->string, "partial_rotary_factor")) {
                if (cJSON_IsNumber(it) && it->valuedouble == 1.0) continue;
                cJSON_Delete(sc);
                return refuse(x, "rope_parameters key \"%s\" (%s) is not supported", it->string, show(it, b, sizeof b));
            }
            cJSON_AddItemToObject(sc, it->string, cJSON_Duplicate(it, true));
        }
        int rc = 0;
        if (strcmp(rope_type(v), "default") || cJSON_GetArraySize(sc) > 1)
            rc = put(x, "rope_scaling", sc, "rope_parameters", given);
        cJSON_Delete(sc);
        if (rc) return -1;
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(v, "rope_theta");
        if (!th) return 0;
        if (!cJSON_IsNumber(th)) return refuse(x, "rope_parameters.rope_theta %s is not a number", show(th, b, sizeof b));
        return put(x, "rope_theta", th, "rope_parameters.rope_theta", given);
    }
    case HFR_SLIDING:
        if (!v || cJSON_IsNull(v)) return 0;
        if (!cJSON_IsNumber(v)) return refuse(x, "sliding_window %s is not a number or null", show(v, b, sizeof b));
        if (v->valuedouble >= max_pos) return 0;   /* tandem never exceeds max_position_embeddings */
        return refuse(x, "sliding_window %s is below the context (max_position_embeddings %.0f): sliding-window "
                      "attention is not supported", show(v, b, sizeof b), max_pos);
    case HFR_USE_SLIDING: {
        if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
        if (!cJSON_IsTrue(v)) return refuse(x, "use_sliding_window %s is not true or false", show(v, b, sizeof b));
        const cJSON *w = value_of(x, "sliding_window");
        if (!w || cJSON_IsNull(w) || (cJSON_IsNumber(w) && w->valuedouble >= max_pos)) return 0;
        return refuse(x, "use_sliding_window with sliding_window %s below the context (max_position_embeddings %.0f): "
                      "sliding-window attention is not supported", show(w, c, sizeof c), max_pos);
    }
    case HFR_LAYER_TYPES: {
        if (!v || cJSON_IsNull(v)) return 0;
        int L = (int)num_of(x, "num_hidden_layers", 0), i = 0;
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != L)
            return refuse(x, "layer_types must list one type per layer (%d), got %s", L, show(v, b, sizeof b));
        for (const cJSON *e = v->child; e; e = e->next, i++)
            if (!cJSON_IsString(e) || (strcmp(e->valuestring, "full_attention") && strcmp(e->valuestring, "sliding_attention")))
                return refuse(x, "layer_types[%d] %s is not supported (full_attention, or sliding_attention without "
                              "an active window)", i, show(e, b, sizeof b));
        return 0;
    }
    case HFR_AUX_COEF: {
        if (!cJSON_IsNumber(v)) return refuse(x, "router_aux_loss_coef %s is not a number", show(v, b, sizeof b));
        const cJSON *orl = value_of(x, "output_router_logits");
        if (orl && !cJSON_IsBool(orl) && !cJSON_IsNull(orl))
            return refuse(x, "output_router_logits %s is not true or false", show(orl, b, sizeof b));
        return put_num(x, "router_aux_loss_coef", cJSON_IsTrue(orl) ? v->valuedouble : 0.0, k->key, given);
    }
    case HFR_TRAIN_NOISE:
        if (!v || cJSON_IsNull(v)) return 0;
        if (!cJSON_IsNumber(v)) return refuse(x, "%s %s is not a number", k->key, show(v, b, sizeof b));
        if (v->valuedouble != 0) note(x, "%s %g (training-time noise) is not applied", k->key, v->valuedouble);
        return 0;
    case HFR_QUANT: {
        if (!v || cJSON_IsNull(v)) return 0;
        if (!cJSON_IsObject(v)) return refuse(x, "quantization_config %s is not an object", show(v, b, sizeof b));
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(v, "quant_method");
        if (!cJSON_IsString(m) || strcmp(m->valuestring, "fp8"))
            return refuse(x, "quantization_config (quant_method %s): quantized checkpoints are not supported (tandem "
                          "reads fp8: block-scaled F8_E4M3 weights)", show(m, b, sizeof b));
        int blk[2] = { 128, 128 };
        for (const cJSON *it = v->child; it; it = it->next) {
            const char *key = it->string;
            if (!strcmp(key, "quant_method")) continue;
            if (!strcmp(key, "fmt")) {
                if (cJSON_IsString(it) && !strcmp(it->valuestring, "e4m3")) continue;
                return refuse(x, "quantization_config fmt %s is not supported (e4m3)", show(it, b, sizeof b));
            }
            if (!strcmp(key, "activation_scheme")) {
                if (cJSON_IsString(it) && !strcmp(it->valuestring, "dynamic")) continue;
                return refuse(x, "quantization_config activation_scheme %s is not supported (dynamic)", show(it, b, sizeof b));
            }
            if (!strcmp(key, "weight_block_size")) {
                bool ok = cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2;
                for (int i = 0; ok && i < 2; i++) {
                    const cJSON *e = cJSON_GetArrayItem(it, i);
                    ok = cJSON_IsNumber(e) && e->valuedouble >= 1 && e->valuedouble <= 65536 &&
                         e->valuedouble == floor(e->valuedouble);
                    if (ok) blk[i] = (int)e->valuedouble;
                }
                if (ok) continue;
                return refuse(x, "quantization_config weight_block_size %s is not two block sizes (rows, columns)",
                              show(it, b, sizeof b));
            }
            if (!strcmp(key, "modules_to_not_convert") && (cJSON_IsNull(it) || cJSON_IsArray(it))) continue;   /* those stay BF16 */
            return refuse(x, "quantization_config key \"%s\" (%s) is not supported", key, show(it, b, sizeof b));
        }
        if (x->fp8_block) {
            x->fp8_block[0] = blk[0];
            x->fp8_block[1] = blk[1];
        }
        return 0;
    }
    case HFR_FIXED: {
        if (!v) return 0;
        cJSON *want = cJSON_Parse(k->absent);
        bool same = cJSON_Compare(v, want, true);
        cJSON_Delete(want);
        if (!same)
            return refuse(x, "%s %s is not supported for %s (it computes %s)", k->key, show(v, b, sizeof b),
                          x->fam->architecture, k->absent);
        return put(x, k->tkey, v, k->key, given);
    }
    case HFR_POSITIVE:
        if (!v) return 0;
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
            return refuse(x, "%s %s must be > 0 for %s", k->key, show(v, b, sizeof b), x->fam->architecture);
        return put(x, k->tkey, v, k->key, given);
    case HFR_FALSE_ONLY:
        if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
        return refuse(x, "%s %s is not supported for %s", k->key, show(v, b, sizeof b), x->fam->architecture);
    case HFR_HEAD_DIM_FIXED: {
        if (!v || cJSON_IsNull(v)) return 0;
        double d = num_of(x, "hidden_size", 0), H = num_of(x, "num_attention_heads", 1);
        if (cJSON_IsNumber(v) && H > 0 && v->valuedouble == floor(d / H)) return 0;
        return refuse(x, "head_dim %s is not hidden_size / num_attention_heads = %.0f, which %s uses",
                      show(v, b, sizeof b), H > 0 ? floor(d / H) : 0, x->fam->architecture);
    }
    }
    return 0;
}

static bool is_generic(const char *key)
{
    for (int i = 0; hf_generic_keys[i]; i++)
        if (!strcmp(hf_generic_keys[i], key)) return true;
    return false;
}

static int map_config(Ctx *x, ModelConfig *cfg)
{
    const HfFamily *fam = x->fam;
    for (const HfKey *k = fam->keys; k->key; k++)
        if (k->absent) cJSON_AddItemToObject(x->defaults, k->key, cJSON_Parse(k->absent));
    /* pass 1: the keys present; pass 2: the absent ones, as their defaults */
    for (int pass = 0; pass < 2; pass++)
        for (const HfKey *k = fam->keys; k->key; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(x->hf, k->key);
            bool given = v != NULL;
            if (pass != (given ? 0 : 1)) continue;
            if (!v) v = cJSON_GetObjectItemCaseSensitive(x->defaults, k->key);
            if (k->kind == HFK_COPY && !v) continue;   /* another spelling carries it */
            int rc = k->kind == HFK_COPY ? do_copy(x, k, v, given) : k->kind == HFK_RULE ? do_rule(x, k, v, given) : 0;
            if (rc) return -1;
        }
    for (const HfConst *c = fam->consts; c->tkey; c++) {
        cJSON *v = cJSON_Parse(c->json);
        int rc = put(x, c->tkey, v, fam->architecture, false);
        cJSON_Delete(v);
        if (rc) return -1;
    }
    /* keys the family's modeling code never reads */
    char list[512] = "";
    size_t k = 0;
    int n = 0;
    for (const cJSON *it = x->hf->child; it; it = it->next)
        if (!row_of(fam, it->string) && !is_generic(it->string) && k < sizeof list) {
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", n ? ", " : "", it->string);
            n++;
        }
    if (n) note(x, "ignored key%s %s (not read by %s)", n > 1 ? "s" : "", list, fam->architecture);
    char why[512];
    if (config_from_cjson(cfg, x->out, why, sizeof why)) return refuse(x, "%s", why);
    return 0;
}

int hf_config_parse(HfConfig *c, const char *text, const char *label, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    cJSON *hf = cJSON_Parse(text);
    Ctx x = { NULL, hf, cJSON_CreateObject(), cJSON_CreateObject(), cJSON_CreateObject(), label, err, err_len,
              c->notes, sizeof c->notes, c->fp8_block };
    int rc = -1;
    char b[96];
    if (!hf) {
        refuse(&x, "not JSON (error near byte %ld)", (long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0));
        goto out;
    }
    if (!cJSON_IsObject(hf)) {
        refuse(&x, "not a JSON object");
        goto out;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(hf, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (!cJSON_IsString(a0)) {
        refuse(&x, "architectures %s does not name an architecture (supported: %s)", show(arch, b, sizeof b),
               hf_family_names());
        goto out;
    }
    x.fam = hf_family_find(a0->valuestring);
    if (!x.fam) {
        refuse(&x, "architecture %s is not supported (supported: %s)", show(a0, b, sizeof b), hf_family_names());
        goto out;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(hf, "model_type");
    if (mt && (!cJSON_IsString(mt) || (strcmp(mt->valuestring, x.fam->model_type) &&
                                       (!x.fam->model_type_alt || strcmp(mt->valuestring, x.fam->model_type_alt))))) {
        refuse(&x, "model_type %s does not match %s (model_type \"%s\")", show(mt, b, sizeof b), x.fam->architecture,
               x.fam->model_type);
        goto out;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(hf, "torch_dtype");
    if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(hf, "dtype");
    if (cJSON_IsString(dt)) snprintf(c->dtype, sizeof c->dtype, "%s", dt->valuestring);
    if (map_config(&x, &c->cfg)) goto out;
    c->fam = x.fam;
    c->text = td_strdup(text);
    rc = 0;
out:
    cJSON_Delete(hf);
    cJSON_Delete(x.out);
    cJSON_Delete(x.src);
    cJSON_Delete(x.defaults);
    if (rc) {
        memset(c, 0, sizeof *c);
    }
    return rc;
}

int hf_config_read(HfConfig *c, const char *dir, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    char *path = td_sprintf("%s/%s", dir, HF_CONFIG_NAME);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        td_free(path);
        return -1;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) || sb.st_size > (16 << 20)) {
        fclose(f);
        snprintf(err, err_len, "%s: not a config file (over 16 MiB)", path);
        td_free(path);
        return -1;
    }
    char *text = td_malloc((size_t)sb.st_size + 1);
    size_t got = fread(text, 1, (size_t)sb.st_size, f);
    fclose(f);
    text[got] = 0;
    int rc = got == (size_t)sb.st_size ? hf_config_parse(c, text, path, err, err_len) : -1;
    if (got != (size_t)sb.st_size) snprintf(err, err_len, "%s: read error", path);
    td_free(text);
    td_free(path);
    return rc;
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void bput(Buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = td_max(2 * b->cap, b->n + n + 256);
        char *ns = td_malloc(cap);
        if (b->n) memcpy(ns, b->s, b->n);
        td_free(b->s);
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void bputs(Buf *b, const char *s) { bput(b, s, strlen(s)); }

/* Keys whose values Python holds as floats (printed with a ".0"). */
static bool float_key(const char *key)
{
    static const char *const k[] = { "rope_theta", "rms_norm_eps", "router_aux_loss_coef", "router_jitter_noise",
                                     "attention_dropout", "initializer_range", "clip_qkv", NULL };
    for (int i = 0; key && k[i]; i++)
        if (!strcmp(k[i], key)) return true;
    return false;
}

/* A number as Python's json.dumps prints it: ints as ints, floats as the
 * shortest repr that reads back. */
static void put_number(Buf *b, double v, bool flt)
{
    char s[64];
    if (!flt && v == floor(v) && fabs(v) < 9e15) {
        snprintf(s, sizeof s, "%lld", (long long)v);
    } else {
        for (int p = 15; p <= 17; p++) {
            snprintf(s, sizeof s, "%.*g", p, v);
            if (strtod(s, NULL) == v) break;
        }
        if (!strpbrk(s, ".eEn")) strcat(s, ".0");   /* 1000000 -> 1000000.0 (not inf/nan) */
    }
    bputs(b, s);
}

static int cmp_items(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* json.dumps(v, indent=2, sort_keys=True), as transformers writes configs. */
static void put_json(Buf *b, const cJSON *v, int depth, const char *key)
{
    char pad[128];
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        bool obj = cJSON_IsObject(v);
        int n = cJSON_GetArraySize(v);
        if (n == 0) {
            bputs(b, obj ? "{}" : "[]");
            return;
        }
        const cJSON **items = td_malloc((size_t)n * sizeof *items);
        int i = 0;
        for (const cJSON *it = v->child; it; it = it->next) items[i++] = it;
        if (obj) qsort(items, (size_t)n, sizeof *items, cmp_items);
        bputs(b, obj ? "{\n" : "[\n");
        snprintf(pad, sizeof pad, "%*s", 2 * (depth + 1), "");
        for (i = 0; i < n; i++) {
            bputs(b, pad);
            if (obj) {
                cJSON *k = cJSON_CreateString(items[i]->string);
                char *ks = cJSON_PrintUnformatted(k);
                bputs(b, ks);
                bputs(b, ": ");
                cJSON_free(ks);
                cJSON_Delete(k);
            }
            put_json(b, items[i], depth + 1, obj ? items[i]->string : key);
            bputs(b, i + 1 < n ? ",\n" : "\n");
        }
        snprintf(pad, sizeof pad, "%*s", 2 * depth, "");
        bputs(b, pad);
        bputs(b, obj ? "}" : "]");
        td_free(items);
    } else if (cJSON_IsNumber(v)) {
        put_number(b, v->valuedouble, float_key(key));
    } else {
        char *s = cJSON_PrintUnformatted(v);
        bputs(b, s);
        cJSON_free(s);
    }
}

static void set_item(cJSON *o, const char *key, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else cJSON_AddItemToObject(o, key, v);
}

char *hf_config_write(const HfFamily *fam, const ModelConfig *cfg, HfLayout layout, const char *dtype_name,
                      const char *gen_json, char *err, size_t err_len)
{
    if (!(fam->layouts & layout)) {
        snprintf(err, err_len, "%s has no %s layout", fam->architecture, layout == HF_V5 ? "v5" : "v4");
        return NULL;
    }
    char *tj = config_to_json(cfg);
    cJSON *t = cJSON_Parse(tj);
    td_free(tj);
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(fam->architecture));
    cJSON_AddStringToObject(o, "model_type", fam->model_type);
    for (const HfKey *k = fam->keys; k->key; k++) {
        bool scaled_v4 = k->kind == HFK_RULE && k->rule == HFR_ROPE_SCALING && layout == HF_V4 &&
                         cfg->rope_scaling.type != ROPE_SCALING_NONE;
        if (!(k->write & layout) && !scaled_v4) continue;
        cJSON *v = NULL;
        if (k->kind == HFK_COPY) {
            char first[64];
            snprintf(first, sizeof first, "%s", k->tkey);
            char *comma = strchr(first, ',');
            if (comma) *comma = 0;
            const cJSON *tv = cJSON_GetObjectItemCaseSensitive(t, first);
            cJSON *nullv = k->null_is ? cJSON_Parse(k->null_is) : NULL;
            bool as_null = nullv && tv && !cJSON_IsArray(tv) && k->absent && !strcmp(k->absent, "null") &&
                           cJSON_Compare(tv, nullv, true);
            cJSON_Delete(nullv);
            v = as_null || !tv ? cJSON_CreateNull() : cJSON_Duplicate(tv, true);
        } else if (k->kind == HFK_RULE && k->rule == HFR_ROPE_PARAMS) {
            v = cfg->rope_scaling.type != ROPE_SCALING_NONE ? config_rope_scaling_json(&cfg->rope_scaling)
                                                            : cJSON_CreateObject();
            cJSON_DeleteItemFromObjectCaseSensitive(v, "type");
            cJSON_AddNumberToObject(v, "rope_theta", cfg->rope_theta);
            cJSON_AddStringToObject(v, "rope_type", cfg->rope_scaling.type == ROPE_SCALING_YARN     ? "yarn"
                                                    : cfg->rope_scaling.type == ROPE_SCALING_LINEAR ? "linear"
                                                                                                     : "default");
        } else if (k->kind == HFK_RULE && (k->rule == HFR_FIXED || k->rule == HFR_POSITIVE) && k->tkey) {
            const cJSON *tv = cJSON_GetObjectItemCaseSensitive(t, k->tkey);
            v = tv ? cJSON_Duplicate(tv, true) : cJSON_CreateNull();
        } else if (k->kind == HFK_RULE && k->rule == HFR_ROPE_SCALING) {
            if (layout == HF_V4 && (k->write & layout || cfg->rope_scaling.type != ROPE_SCALING_NONE))
                v = config_rope_scaling_json(&cfg->rope_scaling);
        } else if (k->kind == HFK_RULE && k->rule == HFR_LAYER_TYPES) {
            v = cJSON_CreateArray();
            for (int l = 0; l < cfg->num_hidden_layers; l++) cJSON_AddItemToArray(v, cJSON_CreateString("full_attention"));
        } else if (k->kind == HFK_RULE && k->rule == HFR_AUX_COEF) {
            bool on = cfg->router_aux_loss_coef > 0;
            set_item(o, "output_router_logits", cJSON_CreateBool(on));
            v = on ? cJSON_CreateNumber(cfg->router_aux_loss_coef) : cJSON_Parse(k->absent);
        } else if (k->absent) {
            v = cJSON_Parse(k->absent);
        }
        if (v) set_item(o, k->key, v);
    }
    cJSON_AddStringToObject(o, layout == HF_V5 ? "dtype" : "torch_dtype", dtype_name);
    cJSON_AddStringToObject(o, "transformers_version", layout == HF_V5 ? "5.0.0" : "4.51.3");
    cJSON *gen = gen_json ? cJSON_Parse(gen_json) : NULL;
    static const char *const ids[] = { "bos_token_id", "eos_token_id", "pad_token_id" };
    for (int i = 0; i < 3; i++) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(gen, ids[i]);
        if (g && !cJSON_IsNull(g)) set_item(o, ids[i], cJSON_Duplicate(g, true));
    }
    cJSON_Delete(gen);
    Buf b = { NULL, 0, 0 };
    put_json(&b, o, 0, NULL);
    bputs(&b, "\n");
    cJSON_Delete(o);
    cJSON_Delete(t);
    return b.s;
}

char *hf_json_dump(const void *cjson)
{
    Buf b = { NULL, 0, 0 };
    put_json(&b, cjson, 0, NULL);
    bputs(&b, "\n");
    return b.s;
}

char *hf_config_set_dtype(const char *text, HfLayout layout, const char *dtype_name)
{
    cJSON *o = cJSON_Parse(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return NULL;
    }
    bool v4 = cJSON_GetObjectItemCaseSensitive(o, "torch_dtype") != NULL,
         v5 = cJSON_GetObjectItemCaseSensitive(o, "dtype") != NULL;
    if (v4 || (!v5 && layout == HF_V4)) set_item(o, "torch_dtype", cJSON_CreateString(dtype_name));
    if (v5 || (!v4 && layout == HF_V5)) set_item(o, "dtype", cJSON_CreateString(dtype_name));
    cJSON_DeleteItemFromObjectCaseSensitive(o, "quantization_config");   /* the tensors written are not quantized */
    char *s = hf_json_dump(o);
    cJSON_Delete(o);
    return s;
}

/* ---------------------------------------------------------------- expressing a tandem config */

bool hf_config_same_math(const ModelConfig *a, const ModelConfig *b, char *why, size_t why_len)
{
    Topology ta, tb;
    topo_single(&ta, a);
    topo_single(&tb, b);
    Param *pa, *pb;
    int na = model_param_table(a, &ta, &pa), nb = model_param_table(b, &tb, &pb);
    bool same = true;
    for (int i = 0; i < na && same; i++) {
        const Param *q = NULL;
        for (int j = 0; j < nb && !q; j++)
            if (!strcmp(pb[j].name, pa[i].name)) q = &pb[j];
        if (!q) {
            snprintf(why, why_len, "it has no %s", pa[i].name);
            same = false;
        } else if (q->ndim != pa[i].ndim || memcmp(q->shape, pa[i].shape, sizeof q->shape)) {
            snprintf(why, why_len, "%s would change shape", pa[i].name);
            same = false;
        }
    }
    for (int j = 0; j < nb && same; j++) {
        bool found = false;
        for (int i = 0; i < na && !found; i++) found = !strcmp(pb[j].name, pa[i].name);
        if (!found) {
            snprintf(why, why_len, "it would add %s", pb[j].name);
            same = false;
        }
    }
    td_free(pa);
    td_free(pb);
    if (!same) return false;
#define SAME_NUM(f)                                                                                \
    if (a->f != b->f) {                                                                           \
        snprintf(why, why_len, #f " %g would become %g", (double)a->f, (double)b->f);             \
        return false;                                                                             \
    }
    SAME_NUM(rope_theta)
    SAME_NUM(rms_norm_eps)
    SAME_NUM(clip_qkv)
    SAME_NUM(max_position_embeddings)
    SAME_NUM(num_experts_per_tok)
    SAME_NUM(head_dim)
#undef SAME_NUM
    if (a->norm_topk_prob != b->norm_topk_prob && config_n_moe_layers(a) > 0) {
        snprintf(why, why_len, "norm_topk_prob %s would become %s", a->norm_topk_prob ? "true" : "false",
                 b->norm_topk_prob ? "true" : "false");
        return false;
    }
    if (a->qk_norm != b->qk_norm) {
        snprintf(why, why_len, "qk_norm would change");
        return false;
    }
    if (memcmp(&a->rope_scaling, &b->rope_scaling, sizeof a->rope_scaling)) {
        snprintf(why, why_len, "rope_scaling would change");
        return false;
    }
    return true;
}

const HfFamily *hf_config_family_of(const ModelConfig *cfg, char *note_out, size_t note_len, char *err,
                                    size_t err_len)
{
    if (note_out && note_len) note_out[0] = 0;
    char reasons[1024] = "";
    size_t k = 0;
    for (int f = 0; hf_families[f]; f++) {
        const HfFamily *fam = hf_families[f];
        char why[400] = "", e[400];
        char *text = hf_config_write(fam, cfg, HF_V4, "float32", NULL, e, sizeof e);
        HfConfig back;
        bool ok = false;
        if (!text) snprintf(why, sizeof why, "%s", e);
        else if (hf_config_parse(&back, text, "config.json", e, sizeof e)) snprintf(why, sizeof why, "%s", e);
        else ok = hf_config_same_math(cfg, &back.cfg, why, sizeof why);
        td_free(text);
        if (ok) {
            if (note_out && back.cfg.router_z_loss_coef != cfg->router_z_loss_coef)
                snprintf(note_out, note_len, "router_z_loss_coef %g is not carried (%s has no z-loss)",
                         cfg->router_z_loss_coef, fam->architecture);
            hf_config_free(&back);
            return fam;
        }
        hf_config_free(&back);
        if (k < sizeof reasons)
            k += (size_t)snprintf(reasons + k, sizeof reasons - k, "%s%s: %s", k ? "; " : "", fam->architecture, why);
    }
    snprintf(err, err_len, "no Hugging Face family expresses this model (%s)", reasons);
    return NULL;
}

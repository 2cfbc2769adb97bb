/* checkpoint/ckpt_serve.c - serving loads and quantized checkpoints
 * (ckpt_serve.h, ckpt_q8.h). */
#include "checkpoint/ckpt_serve.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_h5.h"
#include "checkpoint/ckpt_io.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_q8.h"
#include "checkpoint/hf/hf_map.h"
#include "comm/comm.h"
#include "core/common.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "core/model/expert_cache.h"
#include "core/ops/gemm.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLAB_BYTES ((size_t)128 << 20)   /* float32 bytes read at a time (a few experts) */
#define CHUNK_BYTES ((size_t)8 << 20)    /* chunks of the datasets ckpt_quantize writes */
#define GQ DTYPE_Q8_GROUP
#define ERRN 512

int ckpt_serve_expert_cache(ServeDtypes *sd, const char *mb, char *err, size_t err_len)
{
    if (!mb) return 0;
    char *end;
    errno = 0;
    const double v = strtod(mb, &end);
    if (end == mb || *end || errno || !(v > 0) || v > 1e9) {
        (void)td_snprintf(err, err_len, "--expert-cache-mb must be a positive number of MiB, not \"%s\"", mb);
        return -1;
    }
    sd->expert_cache = true;
    sd->expert_cache_bytes = (size_t)(v * 1048576.0);
    return 0;
}

int ckpt_serve_dtypes(ServeDtypes *sd, const char *dtype, const char *kv_dtype, char *err, size_t err_len)
{
    memset(sd, 0, sizeof *sd);
    if (dtype) {
        if (dtype_parse(dtype, &sd->dtype)) {
            (void)td_snprintf(err, err_len, "--dtype must be f32, bf16 or int8, not \"%s\"", dtype);
            return -1;
        }
        sd->dtype_set = true;
    }
    if (kv_dtype && strcmp(kv_dtype, "auto") != 0) {
        if (dtype_parse(kv_dtype, &sd->kv)) {
            (void)td_snprintf(err, err_len, "--kv-dtype must be auto, f32, bf16 or int8, not \"%s\"", kv_dtype);
            return -1;
        }
        sd->kv_set = true;
    }
    return 0;
}

/* The KV dtype f's routers were fitted to (root attribute router_fit),
 * if it says one. */
static bool router_fit_kv_of(hid_t f, Dtype *kv)
{
    char *a = NULL;
    bool found = false;
    if (ckpt_h5_get_str(f, "router_fit", &a) == 0) {
        cJSON *o = cJSON_Parse(a);
        const cJSON *k = o ? cJSON_GetObjectItemCaseSensitive(o, "kv_dtype") : NULL;
        found = cJSON_IsString(k) && dtype_parse(k->valuestring, kv) == 0;
        cJSON_Delete(o);
    }
    td_free(a);
    H5Eclear2(H5E_DEFAULT);
    return found;
}

/* --kv-dtype auto (ckpt_serve_kv_auto) for the open tandem file f (< 0:
 * none): its fit's KV dtype, else bf16 for weights low by choice (--dtype
 * bf16|int8, or without --dtype a file ckpt quantize wrote in bf16 or int8). */
static Dtype kv_auto(const ServeDtypes *sd, hid_t f)
{
    Dtype fit;
    if (f >= 0 && router_fit_kv_of(f, &fit)) return fit;
    bool low = sd->dtype_set && sd->dtype != DTYPE_F32;
    if (!sd->dtype_set && f >= 0) {
        char *q = NULL;
        low = ckpt_h5_get_str(f, "quantized", &q) == 0 && (!strcmp(q, "bf16") || !strcmp(q, "int8"));
        td_free(q);
        H5Eclear2(H5E_DEFAULT);
    }
    return low ? DTYPE_BF16 : DTYPE_F32;
}

Dtype ckpt_serve_kv_auto(const ServeDtypes *sd) { return kv_auto(sd, -1); }

/* The KV dtype sd asks for, served from the open tandem file f (< 0: none). */
static Dtype serve_kv(const ServeDtypes *sd, hid_t f)
{
    return sd->kv_set ? sd->kv : kv_auto(sd, f);
}

/* ---------------------------------------------------------------- checks */

static Dtype stored_dtype(const CkptH5Desc *d)
{
    return d->type == CKPT_H5_BF16 ? DTYPE_BF16 : d->type == CKPT_H5_I8 ? DTYPE_INT8 : DTYPE_F32;
}

static void fmt_dims(char *out, size_t n, int ndim, const hsize_t *s)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%llu", i ? "," : "", (unsigned long long)s[i]);
    if (k < n) snprintf(out + k, n - k, "]");
}

int ckpt_q8_check(hid_t f, const char *path, const char *name, int ndim, const size_t *shape, CkptH5Desc *scale,
                  char *err, size_t err_len)
{
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    char *dt = NULL;
    int64_t gs = GQ;
    int ra = ds >= 0 ? ckpt_h5_get_str(ds, "dtype", &dt) : -1;
    int rg = ds >= 0 ? ckpt_h5_get_i64(ds, "group_size", &gs) : -1;
    if (ds >= 0) H5Dclose(ds);
    H5Eclear2(H5E_DEFAULT);
    int rc = -1;
    long g = 0;
    if (ra) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s: int8 without the attribute dtype=\"int8_g32\" (how to read it?)", path,
                 name);
    } else if (sscanf(dt, "int8_g%ld", &g) != 1 || g < 1) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s: int8 with dtype=\"%.40s\"; tandem reads \"int8_g32\"", path, name, dt);
    } else if (g != GQ) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s: int8 in groups of %ld (dtype=\"%.40s\"); tandem reads groups of %d",
                 path, name, g, dt, GQ);
    } else if (rg == -2 || (rg == 0 && gs != GQ)) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s: group size %lld (attribute group_size); tandem reads groups of %d", path,
                 name, (long long)gs, GQ);
    } else if (ndim < 2) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s: a vector must be float32, not int8", path, name);
    } else {
        char sname[CKPT_NAME_MAX + 8];
        (void)td_snprintf(sname, sizeof sname, "%s.scale", name);
        hsize_t want[CKPT_H5_MAX_DIMS];
        for (int i = 0; i < ndim; i++) want[i] = shape[i];
        want[ndim - 1] = dtype_q8_groups(shape[ndim - 1]);
        bool same = ckpt_h5_describe(f, sname, scale) == 0 && scale->ndim == ndim;
        for (int i = 0; same && i < ndim; i++) same = scale->shape[i] == want[i];
        char got[96], exp[96];
        fmt_dims(exp, sizeof exp, ndim, want);
        if (ckpt_h5_describe(f, sname, scale)) {
            (void)td_snprintf(err, err_len, "%s: dataset /%s is missing (the scales of int8 /%s)", path, sname, name);
        } else if (!same) {
            fmt_dims(got, sizeof got, scale->ndim < 0 ? 0 : scale->ndim, scale->shape);
            (void)td_snprintf(err, err_len, "%s: dataset /%s: shape %s, expected %s (one scale per %d weights along the last dim)",
                     path, sname, got, exp, GQ);
        } else if (scale->type != CKPT_H5_F32) {
            (void)td_snprintf(err, err_len, "%s: dataset /%s: dtype %s, expected float32", path, sname, scale->type_name);
        } else {
            rc = 0;
        }
    }
    td_free(dt);
    return rc;
}

/* What the serving load knows of one tensor. */
typedef struct {
    CkptH5Desc w, s;   /* the tensor; its scales when int8 */
} TDesc;

static int check_tensor(hid_t f, const char *path, const Param *p, TDesc *td, char *err, size_t err_len)
{
    if (ckpt_h5_describe(f, p->name, &td->w)) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s is missing", path, p->name);
        return -1;
    }
    hsize_t want[CKPT_H5_MAX_DIMS];
    bool same = td->w.ndim == p->ndim;
    for (int i = 0; i < p->ndim; i++) {
        want[i] = p->shape[i];
        same = same && td->w.shape[i] == want[i];
    }
    if (!same) {
        char got[96], exp[96];
        fmt_dims(got, sizeof got, td->w.ndim < 0 ? 0 : td->w.ndim, td->w.shape);
        fmt_dims(exp, sizeof exp, p->ndim, want);
        (void)td_snprintf(err, err_len, "%s: dataset /%s: shape %s does not match the config %s", path, p->name, got, exp);
        return -1;
    }
    const CkptH5Type t = td->w.type;
    if (t == CKPT_H5_I8) return ckpt_q8_check(f, path, p->name, p->ndim, p->shape, &td->s, err, err_len);
    if (t != CKPT_H5_F32 && t != CKPT_H5_BF16 && t != CKPT_H5_F16) {
        (void)td_snprintf(err, err_len, "%s: dataset /%s: dtype %s is not float32, float16, bfloat16 or int8", path, p->name,
                 td->w.type_name);
        return -1;
    }
    return 0;
}

/* Under tensor parallelism over the input dim, int8 groups must not
 * straddle ranks: each rank's part is whole groups of 32. */
static int check_split(const char *path, const Param *p, const TDesc *td, char *err, size_t err_len)
{
    const int last = p->ndim - 1;
    if (!p->packed || (p->dtype != DTYPE_INT8 && td->w.type != CKPT_H5_I8)) return 0;
    if (p->loff[last] % GQ == 0 && (p->lshape[last] % GQ == 0 || p->loff[last] + p->lshape[last] == p->shape[last]))
        return 0;
    (void)td_snprintf(err, err_len,
             "%s: dataset /%s: int8 needs whole groups of %d per rank along its input dim, but this rank holds "
             "%zu columns from %zu (use a tp that divides it into multiples of %d)",
             path, p->name, GQ, p->lshape[last], p->loff[last], GQ);
    return -1;
}

/* ---------------------------------------------------------------- reading */

static int read_box(const char *path, hid_t f, const char *name, const CkptH5Desc *d, const hsize_t *off,
                    const hsize_t *cnt, void *out, char *err, size_t err_len)
{
    char why[ERRN];
    CkptIoRead *rd = ckpt_io_read_new(path, f, why, sizeof why);
    int rc = !rd || ckpt_io_read_add(rd, name, d, off, cnt, out, why, sizeof why) ||
                     ckpt_io_read_run(rd, why, sizeof why)
                 ? -1
                 : 0;
    ckpt_io_read_free(rd);
    if (rc) (void)td_snprintf(err, err_len, "%s: %s", path, why);
    return rc;
}

static int check_finite(const char *path, const char *name, const float *x, size_t n, size_t base, char *err,
                        size_t err_len)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            (void)td_snprintf(err, err_len, "%s: dataset /%s holds %s at element %zu of this rank's slice: refusing to serve it",
                     path, name, isnan(x[i]) ? "NaN" : "infinity", base + i);
            return -1;
        }
    return 0;
}

/* Where flat row r of a tensor's slice is: "[e, r]" for a stack of
 * matrices of `rows` rows (experts), "[r]" otherwise. */
static void fmt_row(char *out, size_t n, size_t r, size_t rows, bool stacked)
{
    if (stacked) snprintf(out, n, "[%zu, %zu]", r / rows, r % rows);
    else snprintf(out, n, "[%zu]", r);
}

/* n_rows x K int8 weights q with their scales s (n_rows x G) -- flat rows
 * row0.. of the slice, matrices of `rows` rows when stacked: every scale a
 * finite number >= 0 that bfloat16 holds exactly, zero only for a group
 * of zeros; no -128. */
int ckpt_q8_check_values(const char *path, const char *name, const int8_t *q, const float *s, size_t n_rows, size_t K,
                         size_t row0, size_t rows, bool stacked, char *err, size_t err_len)
{
    const size_t G = dtype_q8_groups(K);
    char at[64];
    for (size_t r = 0; r < n_rows; r++)
        for (size_t g = 0; g < G; g++) {
            const float sc = s[r * G + g];
            const int8_t *qg = q + r * K + g * GQ;
            const size_t n = td_min(GQ, K - g * GQ);
            bool any = false;
            for (size_t i = 0; i < n; i++) {
                any |= qg[i] != 0;
                if (qg[i] == -128) {
                    fmt_row(at, sizeof at, row0 + r, rows, stacked);
                    (void)td_snprintf(err, err_len, "%s: dataset /%s: value -128 in row %s (int8 g32 weights lie in [-127, 127])",
                                      path, name, at);
                    return -1;
                }
            }
            if (!isfinite(sc) || sc < 0 || (sc == 0 && any)) {
                fmt_row(at, sizeof at, row0 + r, rows, stacked);
                (void)td_snprintf(err, err_len, "%s: dataset /%s.scale: scale %g of row %s, group %zu is %s", path, name,
                                  (double)sc, at, g,
                                  !isfinite(sc) ? "not finite" : sc < 0 ? "negative" : "zero for non-zero weights");
                return -1;
            }
            if (dtype_f32_from_bf16(dtype_bf16_from_f32(sc)) != sc) {   /* the GEMM holds it in 16 bits */
                fmt_row(at, sizeof at, row0 + r, rows, stacked);
                (void)td_snprintf(err, err_len,
                                  "%s: dataset /%s.scale: scale %.9g of row %s, group %zu is not a bfloat16 value "
                                  "(int8 scales are bf16(max|w| / 127) since 2026-12-07: quantize the file again)",
                                  path, name, (double)sc, at, g);
                return -1;
            }
        }
    return 0;
}

/* Matrices [e0, e0 + ne) of this rank's slice of packed p (described by
 * td) read and packed into dst (ne * p->mat_bytes) in p's dtype: as
 * model_set_weights / model_set_q8 pack them (the bits a resident load
 * gives).  buf, qb, sb: scratch for ne matrices (qb, sb when int8). */
static int pack_mats(const char *path, hid_t f, const Param *p, const TDesc *td, size_t e0, size_t ne,
                     unsigned char *dst, float *buf, int8_t *qb, float *sb, char *err, size_t err_len)
{
    hsize_t off[CKPT_H5_MAX_DIMS], cnt[CKPT_H5_MAX_DIMS];
    for (int i = 0; i < p->ndim; i++) {
        off[i] = p->loff[i];
        cnt[i] = p->lshape[i];
    }
    const int last = p->ndim - 1;
    const size_t rows = p->lshape[p->ndim - 2], cols = p->lshape[last], per = rows * cols, G = dtype_q8_groups(cols);
    if (p->ndim == 3) {
        off[0] = p->loff[0] + e0;
        cnt[0] = ne;
    }
    if (td->w.type == CKPT_H5_I8) {
        hsize_t soff[CKPT_H5_MAX_DIMS], scnt[CKPT_H5_MAX_DIMS];
        char sname[CKPT_NAME_MAX + 8];
        (void)td_snprintf(sname, sizeof sname, "%s.scale", p->name);
        for (int i = 0; i < p->ndim; i++) {
            soff[i] = off[i];
            scnt[i] = cnt[i];
        }
        soff[last] = off[last] / GQ;
        scnt[last] = G;
        if (read_box(path, f, p->name, &td->w, off, cnt, qb, err, err_len) ||
            read_box(path, f, sname, &td->s, soff, scnt, sb, err, err_len) ||
            ckpt_q8_check_values(path, p->name, qb, sb, ne * rows, cols, e0 * rows, rows, p->ndim == 3, err, err_len))
            return -1;
        if (p->dtype == DTYPE_INT8) {   /* as stored: no re-quantizing */
            for (size_t e = 0; e < ne; e++)
                gemm_pack_q8(dst + e * p->mat_bytes, qb + e * per, sb + e * rows * G, rows, cols);
            return 0;
        }
        for (size_t r = 0; r < ne * rows; r++) dtype_q8_dequantize_row(buf + r * cols, qb + r * cols, sb + r * G, cols);
    } else if (read_box(path, f, p->name, &td->w, off, cnt, buf, err, err_len) ||
               check_finite(path, p->name, buf, ne * per, e0 * per, err, err_len)) {
        return -1;
    }
    for (size_t e = 0; e < ne; e++) gemm_pack(dst + e * p->mat_bytes, p->dtype, buf + e * per, rows, cols);
    return 0;
}

/* Loads this rank's slice of p (described by td) into m (an offloaded
 * expert stack: nothing, the cache loads it). */
static int load_param(const char *path, hid_t f, Model *m, Param *p, const TDesc *td, char *err, size_t err_len)
{
    (void)m;
    if (p->offloaded) return 0;
    if (!p->packed) {   /* a vector, or shared_expert_gate: float32 in p->w */
        hsize_t off[CKPT_H5_MAX_DIMS], cnt[CKPT_H5_MAX_DIMS];
        for (int i = 0; i < p->ndim; i++) {
            off[i] = p->loff[i];
            cnt[i] = p->lshape[i];
        }
        if (td->w.type == CKPT_H5_I8) {
            (void)td_snprintf(err, err_len, "%s: dataset /%s must be float32 (it is read as a vector), not int8", path, p->name);
            return -1;
        }
        if (read_box(path, f, p->name, &td->w, off, cnt, p->w, err, err_len)) return -1;
        return check_finite(path, p->name, p->w, p->numel, 0, err, err_len);
    }
    const size_t rows = p->lshape[p->ndim - 2], cols = p->lshape[p->ndim - 1], per = rows * cols;
    const size_t G = dtype_q8_groups(cols);
    const bool q8 = td->w.type == CKPT_H5_I8;
    const size_t step = p->ndim == 3 ? td_max(1, SLAB_BYTES / (per * sizeof(float))) : 1;
    float *buf = td_malloc(td_min(step, p->n_mats) * per * sizeof(float) + 64);
    int8_t *qb = q8 ? td_malloc(td_min(step, p->n_mats) * per + 64) : NULL;
    float *sb = q8 ? td_malloc(td_min(step, p->n_mats) * rows * G * sizeof(float) + 64) : NULL;
    int rc = 0;
    for (size_t e0 = 0; e0 < p->n_mats && !rc; e0 += step) {
        const size_t ne = td_min(step, p->n_mats - e0);
        rc = pack_mats(path, f, p, td, e0, ne, p->packed + e0 * p->mat_bytes, buf, qb, sb, err, err_len);
    }
    td_free(buf);
    td_free(qb);
    td_free(sb);
    return rc;
}

/* ---------------------------------------------------------------- expert cache loaders */

/* A tandem checkpoint's experts: the file kept open, each expert's slice
 * read from its datasets.  Their chunks are the writer's shards (up to
 * CKPT_CHUNK_BYTES): every chunk the expert touches is read, so a file
 * stored one expert per chunk (ckpt reshard --dp E --ep E) reads exactly
 * the expert's bytes, and a chunk of several experts is read whole. */
typedef struct {
    char file[PATH_MAX];
    hid_t f;
    float *buf;
    int8_t *qb;
    float *sb;
} H5Experts;

static int h5_expert_load(void *ctx, const Param *p, size_t e, unsigned char *dst, char *err, size_t err_len)
{
    H5Experts *x = ctx;
    TDesc td;
    if (check_tensor(x->f, x->file, p, &td, err, err_len)) return -1;
    return pack_mats(x->file, x->f, p, &td, e, 1, dst, x->buf, x->qb, x->sb, err, err_len);
}

static void h5_experts_free(void *ctx)
{
    H5Experts *x = ctx;
    if (x->f >= 0) H5Fclose(x->f);
    td_free(x->buf);
    td_free(x->qb);
    td_free(x->sb);
    td_free(x);
}

/* Scratch for one expert matrix of m (the largest of gate, up, down). */
static size_t expert_floats(const Model *m)
{
    size_t n = 0;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        const Layer *L = &m->layers[l];
        if (!L->moe) continue;
        n = td_max(n, td_max(L->egate->lshape[1] * L->egate->lshape[2], L->edown->lshape[1] * L->edown->lshape[2]));
    }
    return n;
}

static int attach_h5(Model *m, const char *file, size_t bytes, char *err, size_t err_len)
{
    H5Experts *x = td_calloc(sizeof *x);
    (void)td_snprintf(x->file, sizeof x->file, "%s", file);
    x->f = ckpt_h5_open(file);
    const size_t n = expert_floats(m);
    x->buf = td_malloc(n * sizeof(float) + 64);
    x->qb = td_malloc(n + 64);
    x->sb = td_malloc((n / 32 + 64) * sizeof(float));
    if (x->f < 0) {
        (void)td_snprintf(err, err_len, "%s: cannot open", file);
        h5_experts_free(x);
        return -1;
    }
    if (expert_cache_attach(m, bytes, h5_expert_load, x, h5_experts_free, err, err_len)) {
        h5_experts_free(x);
        return -1;
    }
    /* a chunk of several experts is read whole for each of them */
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        CkptH5Desc d;
        if (!m->layers[l].moe || ckpt_h5_describe(x->f, m->layers[l].eup->name, &d)) continue;
        if (d.chunk[0] > 1 && (m->topo.world <= 1 || comm_rank() == 0))
            td_info("note: %s: expert chunks of %llu experts: each expert load reads %llu (tandem ckpt reshard "
                    "--dp %zu --ep %zu --weights-only stores one expert per chunk)",
                    file, (unsigned long long)d.chunk[0], (unsigned long long)d.chunk[0], m->E_global, m->E_global);
        break;
    }
    return 0;
}

/* After ckpt_load_serving put file's weights in m: its cache reads file's
 * experts from now on, none of the old ones kept. */
static int repoint_h5(Model *m, const char *file, char *err, size_t err_len)
{
    ExpertCache *c = m->ecache;
    TD_CHECK(c->load == h5_expert_load, "ckpt_load_serving: the expert cache does not read a tandem checkpoint");
    H5Experts *x = c->ctx;
    hid_t f = ckpt_h5_open(file);
    if (f < 0) {
        (void)td_snprintf(err, err_len, "%s: cannot open", file);
        return -1;
    }
    H5Fclose(x->f);
    x->f = f;
    (void)td_snprintf(x->file, sizeof x->file, "%s", file);
    expert_cache_invalidate(c);
    return 0;
}

/* A Hugging Face directory's experts: the map kept open, each expert's
 * box read (pread, converted to float32) and packed as model_set_weights
 * packs the resident model's. */
typedef struct {
    HfModel h;
    float *buf;
} HfExperts;

static int hf_expert_load(void *ctx, const Param *p, size_t e, unsigned char *dst, char *err, size_t err_len)
{
    HfExperts *x = ctx;
    const HfBinding *b = hf_model_find(&x->h, p->name);
    if (!b) {
        (void)td_snprintf(err, err_len, "no HF tensor maps %s", p->name);
        return -1;
    }
    size_t off[PARAM_MAX_DIMS], cnt[PARAM_MAX_DIMS];
    for (int i = 0; i < p->ndim; i++) {
        off[i] = p->loff[i];
        cnt[i] = p->lshape[i];
    }
    off[0] += e;
    cnt[0] = 1;
    if (hf_read_box_serial(&x->h, b, off, cnt, x->buf, false, err, err_len)) return -1;
    gemm_pack(dst, p->dtype, x->buf, p->lshape[1], p->lshape[2]);
    return 0;
}

static void hf_experts_free(void *ctx)
{
    HfExperts *x = ctx;
    hf_model_close(&x->h);
    td_free(x->buf);
    td_free(x);
}

/* ckpt_open_serving of an HF directory with offloaded experts: the map
 * opened once; every tensor but the experts read into the serving model
 * (as the float32 load and model_quantize_from would: the same floats,
 * the same packing), the experts left to the cache. */
static int open_hf_offload(const char *path, Model *m, const Topology *topo, const ServeDtypes *sd, char *err,
                           size_t err_len)
{
    HfExperts *x = td_calloc(sizeof *x);
    if (hf_model_open(&x->h, path, err, err_len)) {
        td_free(x);
        return -1;
    }
    Topology single;
    if (!topo) {
        topo_single(&single, &x->h.hc.cfg);
        topo = &single;
    }
    ModelDtypes dt = model_dtypes_default(sd->dtype_set ? sd->dtype : DTYPE_F32);
    model_init_serving_offload(m, &x->h.hc.cfg, topo, 16, &dt);
    x->buf = td_malloc(expert_floats(m) * sizeof(float) + 64);
    float *buf = NULL;
    int rc = 0;
    for (int i = 0; i < m->n_params && !rc; i++) {
        Param *p = &m->params[i];
        if (p->offloaded) continue;
        const HfBinding *b = hf_model_find(&x->h, p->name);
        if (!b) {
            (void)td_snprintf(err, err_len, "%s: no HF tensor maps %s", path, p->name);
            rc = -1;
            break;
        }
        td_free(buf);
        buf = td_malloc(p->numel * sizeof(float) + 64);
        rc = hf_read_box(&x->h, b, p->loff, p->lshape, buf, false, err, err_len);
        if (!rc) model_set_weights(m, p, 0, p->packed ? p->n_mats : 1, buf);
    }
    td_free(buf);
    if (!rc && expert_cache_attach(m, sd->expert_cache_bytes, hf_expert_load, x, hf_experts_free, err, err_len))
        rc = -1;
    if (rc) {
        if (!m->ecache) hf_experts_free(x);
        model_free(m);
    }
    return rc;
}

/* Every rank's status agreed (the world when the model spans ranks). */
static int agree(const Model *m, int rc)
{
    if (m->topo.world <= 1 || !comm_active()) return rc ? -1 : 0;
    int32_t v = rc ? -1 : 0;
    comm_allreduce_min_i32(COMM_WORLD, &v, 1);
    return v;
}

static void zero_model(Model *m)
{
    if (m->w) memset(m->w, 0, m->n_w * sizeof(float));
    if (m->packed) memset(m->packed, 0, m->n_packed);
}

int ckpt_load_serving(const char *file, Model *m, char *err, size_t err_len)
{
    ModelConfig cfg;
    int rc = ckpt_read_config(file, &cfg, NULL, err, err_len);
    if (!rc) {
        char *a = config_to_json(&cfg), *b = config_to_json(&m->cfg);
        if (strcmp(a, b)) {
            (void)td_snprintf(err, err_len, "%s: attribute config differs from the model being loaded", file);
            rc = -1;
        }
        td_free(a);
        td_free(b);
    }
    hid_t f = rc ? -1 : ckpt_h5_open(file);
    if (!rc && f < 0) {
        char why[300];
        ckpt_h5_why(why, sizeof why);
        (void)td_snprintf(err, err_len, "%s: cannot open: %s", file, why);
        rc = -1;
    }
    TDesc *td = td_calloc((size_t)td_max((size_t)m->n_params, 1) * sizeof(TDesc));
    for (int i = 0; i < m->n_params && !rc; i++) {
        const Param *p = &m->params[i];
        rc = check_tensor(f, file, p, &td[i], err, err_len) || check_split(file, p, &td[i], err, err_len) ? -1 : 0;
    }
    bool failed_here = rc != 0;
    rc = agree(m, rc);
    if (!rc) {
        for (int i = 0; i < m->n_params && !rc; i++) rc = load_param(file, f, m, &m->params[i], &td[i], err, err_len);
        if (!rc && m->ecache) rc = repoint_h5(m, file, err, err_len);
        failed_here = rc != 0;
        rc = agree(m, rc);
        if (rc) zero_model(m);   /* never a partial model */
    }
    if (rc && !failed_here) (void)td_snprintf(err, err_len, "%s: another rank failed to load its part (see its message)", file);
    if (f >= 0) H5Fclose(f);
    td_free(td);
    return rc;
}

/* ---------------------------------------------------------------- opening */

/* The dtypes to serve in: as stored, or as --dtype asks (a checkpoint
 * quantized to that dtype keeps the choices made at quantize time). */
static void resolve_dtypes(hid_t f, const ModelConfig *cfg, const ServeDtypes *sd, ModelDtypes *dt)
{
    /* each role's dtype as stored: its first matrix's in the parameter
     * table (the loader then checks every dataset against its role's) */
    ModelDtypes st = { DTYPE_F32, DTYPE_F32, DTYPE_F32, DTYPE_F32 };
    bool seen[ROLE_COUNT] = { false };
    Topology single;
    topo_single(&single, cfg);
    Param *ps;
    const int np = model_param_table(cfg, &single, &ps);
    for (int i = 0; i < np; i++) {
        const ModelRole r = model_param_role(cfg, &ps[i]);
        CkptH5Desc d;
        if (r == ROLE_F32 || seen[r] || ps[i].tied_copy || ckpt_h5_describe(f, ps[i].name, &d)) continue;
        *model_role_dtype(&st, r) = stored_dtype(&d);
        seen[r] = true;
    }
    td_free(ps);
    H5Eclear2(H5E_DEFAULT);
    /* a role with no matrix in the file takes its neighbour's (as a tied
     * embedding is the head) */
    if (!seen[ROLE_MAT] && seen[ROLE_ATTN]) st.mat = st.attn;
    if (!seen[ROLE_ATTN]) st.attn = st.mat;
    if (!seen[ROLE_EMBED]) st.embed = st.head;
    if (!seen[ROLE_HEAD]) st.head = st.embed;
    char *q = NULL;
    bool quantized_as_asked = sd->dtype_set && ckpt_h5_get_str(f, "quantized", &q) == 0 &&
                              !strcmp(q, dtype_name(sd->dtype));
    td_free(q);
    H5Eclear2(H5E_DEFAULT);
    *dt = !sd->dtype_set || quantized_as_asked ? st : model_dtypes_default(sd->dtype);
}

/* Is path a tandem checkpoint (a file, or a run directory with latest)? */
static bool is_tandem(const char *path)
{
    struct stat st;
    char latest[PATH_MAX];
    if (stat(path, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) return true;
    return !td_snprintf(latest, sizeof latest, "%s/latest", path) && lstat(latest, &st) == 0;
}

int ckpt_open_serving(const char *path, Model *m, const Topology *topo, const ServeDtypes *sd, char *err,
                      size_t err_len)
{
    memset(m, 0, sizeof *m);
    if (!is_tandem(path) && sd->expert_cache) {
        if (open_hf_offload(path, m, topo, sd, err, err_len)) return -1;
        m->attn.kv = serve_kv(sd, -1);
        return 0;
    }
    if (!is_tandem(path)) {
        /* not a tandem checkpoint (an HF directory): the float32 loader,
         * then quantized into the serving layout */
        Model f32;
        Topology t;
        if (topo) t = *topo;
        if (ckpt_model_open(path, &f32, topo ? &t : NULL, false, 16, err, err_len)) return -1;
        ModelDtypes dt = model_dtypes_default(sd->dtype_set ? sd->dtype : DTYPE_F32);
        model_init_serving(m, &f32.cfg, &f32.topo, f32.attn.bs, &dt);
        model_quantize_from(m, &f32);
        model_free(&f32);
        m->attn.kv = serve_kv(sd, -1);
        return 0;
    }
    char file[PATH_MAX];
    if (ckpt_resolve(path, file, sizeof file)) {   /* prints its own line */
        err[0] = 0;
        return -1;
    }
    ModelConfig cfg;
    if (ckpt_read_config(file, &cfg, NULL, err, err_len)) return -1;
    hid_t f = ckpt_h5_open(file);
    if (f < 0) {
        (void)td_snprintf(err, err_len, "%s: cannot open", file);
        return -1;
    }
    ModelDtypes dt;
    resolve_dtypes(f, &cfg, sd, &dt);
    const Dtype kv = serve_kv(sd, f);
    H5Fclose(f);
    Topology single;
    if (!topo) {
        topo_single(&single, &cfg);
        topo = &single;
    }
    if (sd->expert_cache) model_init_serving_offload(m, &cfg, topo, 16, &dt);
    else model_init_serving(m, &cfg, topo, 16, &dt);
    if ((sd->expert_cache && attach_h5(m, file, sd->expert_cache_bytes, err, err_len)) ||
        ckpt_load_serving(file, m, err, err_len)) {
        model_free(m);
        return -1;
    }
    m->attn.kv = kv;
    return 0;
}

/* ---------------------------------------------------------------- writing */

/* Chunks of at most CHUNK_BYTES, cut along the first dims. */
static void chunk_of(hsize_t *chunk, const hsize_t *shape, int ndim, size_t esize)
{
    for (int i = 0; i < ndim; i++) chunk[i] = shape[i] ? shape[i] : 1;
    for (int d = 0; d < ndim; d++) {
        size_t rest = esize;
        for (int i = d + 1; i < ndim; i++) rest *= (size_t)chunk[i];
        if ((size_t)chunk[d] * rest <= CHUNK_BYTES) break;
        if (rest > CHUNK_BYTES) {
            chunk[d] = 1;
            continue;
        }
        chunk[d] = td_max(1, CHUNK_BYTES / rest);
        break;
    }
}

typedef struct {
    hid_t f;
    const char *path;
    char err[ERRN];
} QWriter;

/* Creates dataset name (shape, type; attributes partition, dtype and,
 * for int8, group_size).  Returns the id or -1 (w->err). */
static hid_t create_ds(QWriter *w, const char *name, int ndim, const hsize_t *shape, CkptH5Type type, const char *dattr)
{
    CkptPiece pc;
    memset(&pc, 0, sizeof pc);
    pc.name = name;
    pc.ndim = ndim;
    for (int i = 0; i < ndim; i++) pc.shape[i] = shape[i];
    chunk_of(pc.chunk, pc.shape, ndim, ckpt_h5_disk_size(type));
    pc.type = type;
    pc.partition = "replicated";
    pc.dtype_attr = dattr;
    hid_t ds = ckpt_h5_create_dataset(w->f, &pc, w->err, sizeof w->err);
    if (ds >= 0 && type == CKPT_H5_I8 && ckpt_h5_put_i64(ds, "group_size", GQ)) {
        (void)td_snprintf(w->err, sizeof w->err, "cannot write the attributes of /%s", name);
        H5Dclose(ds);
        ds = -1;
    }
    return ds;
}

static int write_slab(QWriter *w, hid_t ds, const char *name, int ndim, const hsize_t *shape, const hsize_t *off,
                      const hsize_t *cnt, const void *data, CkptH5Type type)
{
    CkptPiece pc;
    memset(&pc, 0, sizeof pc);
    pc.name = name;
    pc.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        pc.shape[i] = shape[i];
        pc.off[i] = off[i];
        pc.cnt[i] = cnt[i];
    }
    pc.data = data;
    pc.type = type;
    pc.raw = type == CKPT_H5_BF16;
    return ckpt_h5_write_box(ds, &pc, false, w->err, sizeof w->err);
}

static int write_root(QWriter *w, const ModelConfig *cfg, const CkptMeta *meta, const ModelDtypes *dt)
{
    char *js = config_to_json(cfg);
    int rc = ckpt_h5_put_str(w->f, "format", CKPT_FORMAT) || ckpt_h5_put_i64(w->f, "format_version", CKPT_FORMAT_VERSION) ||
             ckpt_h5_put_str(w->f, "config", js) || ckpt_h5_put_i64(w->f, "step", meta->step) ||
             ckpt_h5_put_i64(w->f, "tokens_seen", meta->tokens_seen) ||
             ckpt_h5_put_str(w->f, "quantized", dtype_name(dt->mat));
    td_free(js);
    hid_t g = rc ? -1 : ckpt_h5_group(w->f, "topology");
    int64_t L = cfg->num_hidden_layers;
    rc = rc || g < 0 || ckpt_h5_put_i64(g, "world_size", 1) || ckpt_h5_put_i64(g, "dp", 1) ||
         ckpt_h5_put_i64(g, "tp", 1) || ckpt_h5_put_i64(g, "pp", 1) || ckpt_h5_put_i64(g, "ep", 1) ||
         ckpt_h5_put_i64(g, "cp", 1) || ckpt_h5_put_i64s(g, "stage_layers", &L, 1);
    if (g >= 0) H5Gclose(g);
    if (rc) (void)td_snprintf(w->err, sizeof w->err, "cannot write the root attributes or /topology");
    return rc ? -1 : 0;
}

static int write_tokenizer(QWriter *w, const char *in)
{
    CkptTokFiles tf;
    if (ckpt_read_tok_files(in, &tf, w->err, sizeof w->err)) return -1;
    static const char *const names[3] = { "tokenizer.json", "tokenizer_config.json", "generation_config.json" };
    const char *txt[3] = { tf.tokenizer_json, tf.tokenizer_config, tf.generation_config };
    const size_t len[3] = { tf.tokenizer_json_len, tf.tokenizer_config_len, tf.generation_config_len };
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        if (!txt[i] || !len[i]) continue;
        char name[64];
        (void)td_snprintf(name, sizeof name, "tokenizer/%s", names[i]);
        hsize_t shape[1] = { len[i] }, off[1] = { 0 };
        CkptPiece pc;
        memset(&pc, 0, sizeof pc);
        pc.name = name;
        pc.ndim = 1;
        pc.shape[0] = shape[0];
        pc.chunk[0] = td_min(len[i], (size_t)1 << 20);
        pc.type = CKPT_H5_U8;
        hid_t ds = ckpt_h5_create_dataset(w->f, &pc, w->err, sizeof w->err);
        rc = ds < 0 || write_slab(w, ds, name, 1, shape, off, shape, txt[i], CKPT_H5_U8) ? -1 : 0;
        if (ds >= 0) H5Dclose(ds);
    }
    ckpt_tok_files_free(&tf);
    return rc;
}


/* Rows [r0, r1) of a slab of x (K each) rounded to dtype t into o (and s:
 * G scales a row), by GPTQ where U[r] is a factor; err[3 r ..] the row's
 * sum of squared errors, of squared weights, and largest error. */
struct round_rows {
    const float *x; void *o; float *s; double *err; const float *const *U; float *work;
    size_t K, G; Dtype t;
};

static void round_rows(void *vc, size_t r0, size_t r1, int tid)
{
    const struct round_rows *c = vc;
    const size_t K = c->K, G = c->G;
    for (size_t r = r0; r < r1; r++) {
        const float *xr = c->x + r * K;
        const float *U = c->U ? c->U[r] : NULL;
        float dq[GQ];
        double se = 0, sw = 0, mx = 0;
        if (U) dtype_q8_quantize_row_gptq((int8_t *)c->o + r * K, c->s + r * G, xr, U, K, c->work + (size_t)tid * K);
        for (size_t k0 = 0; k0 < K; k0 += GQ) {
            const size_t ng = td_min(GQ, K - k0);
            if (c->t == DTYPE_INT8) {
                int8_t *q = (int8_t *)c->o + r * K + k0;
                if (!U) c->s[r * G + k0 / GQ] = dtype_q8_quantize_weights(q, xr + k0, ng);
                dtype_q8_dequantize(dq, q, c->s[r * G + k0 / GQ], ng);
            } else if (c->t == DTYPE_BF16) {
                uint16_t *h = (uint16_t *)c->o + r * K + k0;
                for (size_t i = 0; i < ng; i++) dq[i] = dtype_f32_from_bf16(h[i] = dtype_bf16_from_f32(xr[k0 + i]));
            } else {
                memcpy((float *)c->o + r * K + k0, xr + k0, ng * sizeof(float));
                memcpy(dq, xr + k0, ng * sizeof(float));
            }
            for (size_t i = 0; i < ng; i++) {
                const double e = (double)xr[k0 + i] - (double)dq[i];
                se += e * e;
                sw += (double)xr[k0 + i] * (double)xr[k0 + i];
                mx = fmax(mx, fabs(e));
            }
        }
        c->err[3 * r] = se;
        c->err[3 * r + 1] = sw;
        c->err[3 * r + 2] = mx;
    }
}

/* Converts and writes one tensor, a slab at a time; fills *rep. */
static int quantize_tensor(QWriter *w, const char *in, hid_t fin, const Param *p, Dtype t, const CkptQuantRound *round,
                           CkptQuantTensor *rep)
{
    CkptH5Desc d;
    memset(rep, 0, sizeof *rep);
    (void)td_snprintf(rep->name, sizeof rep->name, "%s", p->name);
    rep->dtype = t;
    rep->numel = p->numel;
    if (ckpt_h5_describe(fin, p->name, &d)) {
        (void)td_snprintf(w->err, sizeof w->err, "%s: dataset /%s is missing", in, p->name);
        return -1;
    }
    if (d.type == CKPT_H5_I8) {
        (void)td_snprintf(w->err, sizeof w->err, "%s: dataset /%s is already int8: quantize the float checkpoint it came from", in,
                 p->name);
        return -1;
    }
    hsize_t shape[CKPT_H5_MAX_DIMS], sshape[CKPT_H5_MAX_DIMS], off[CKPT_H5_MAX_DIMS], cnt[CKPT_H5_MAX_DIMS];
    bool same = d.ndim == p->ndim;
    for (int i = 0; i < p->ndim; i++) {
        shape[i] = sshape[i] = cnt[i] = p->shape[i];
        off[i] = 0;
        same = same && d.shape[i] == shape[i];
    }
    if (!same || (d.type != CKPT_H5_F32 && d.type != CKPT_H5_BF16 && d.type != CKPT_H5_F16)) {
        (void)td_snprintf(w->err, sizeof w->err, "%s: dataset /%s: not a float tensor of the config's shape", in, p->name);
        return -1;
    }
    const int nd = p->ndim, last = nd - 1;
    const size_t K = p->shape[last], G = dtype_q8_groups(K), rows_all = p->numel / K;
    sshape[last] = G;
    const CkptH5Type ty = t == DTYPE_INT8 ? CKPT_H5_I8 : t == DTYPE_BF16 ? CKPT_H5_BF16 : CKPT_H5_F32;
    char sname[CKPT_NAME_MAX + 8];
    (void)td_snprintf(sname, sizeof sname, "%s.scale", p->name);
    hid_t ds = create_ds(w, p->name, nd, shape, ty, t == DTYPE_INT8 ? "int8_g32" : NULL);
    hid_t dss = ds >= 0 && t == DTYPE_INT8 ? create_ds(w, sname, nd, sshape, CKPT_H5_F32, NULL) : -1;
    if (ds < 0 || (t == DTYPE_INT8 && dss < 0)) {
        if (ds >= 0) H5Dclose(ds);
        return -1;
    }
    /* slabs of whole rows of dim 0 */
    const size_t row0 = p->numel / (size_t)shape[0];   /* elements per index of dim 0 */
    const size_t step = td_max(1, SLAB_BYTES / (row0 * sizeof(float)));
    float *x = td_malloc(td_min(step, (size_t)shape[0]) * row0 * sizeof(float) + 64);
    void *o = td_malloc(td_min(step, (size_t)shape[0]) * row0 * sizeof(float) + 64);
    float *s = td_malloc(td_min(step, (size_t)shape[0]) * (row0 / K) * G * sizeof(float) + 64);
    const size_t max_rows = td_max(1, td_min(step, (size_t)shape[0]) * row0 / K);   /* a vector: one row */
    const bool gptq = round && t == DTYPE_INT8;
    const int nt = pool_threads();
    float *work = gptq ? td_malloc((size_t)nt * K * sizeof(float)) : NULL;   /* one row's per thread */
    const float **U = gptq ? td_malloc(max_rows * sizeof(*U)) : NULL;
    double *err = td_malloc(max_rows * 3 * sizeof(double));                  /* per row: se, sw, max */
    const size_t mat_rows = nd >= 2 ? (size_t)p->shape[nd - 2] : 1;   /* rows of one matrix */
    double se = 0, sw = 0, mx = 0;
    int rc = 0;
    for (size_t i0 = 0; i0 < shape[0] && !rc; i0 += step) {
        const size_t n0 = td_min(step, (size_t)shape[0] - i0), n = n0 * row0, rows = n / K;
        off[0] = i0;
        cnt[0] = n0;
        rc = read_box(in, fin, p->name, &d, off, cnt, x, w->err, sizeof w->err) ||
                     check_finite(in, p->name, x, n, i0 * row0, w->err, sizeof w->err)
                 ? -1
                 : 0;
        if (rc) break;
        /* the factors first, on this thread (making one may run the
         * model: pool regions of its own), then the rows in parallel */
        for (size_t r = 0; gptq && r < rows; r++)
            U[r] = round->factor(round->ctx, p->name, (i0 * (row0 / K) + r) / mat_rows, K);
        struct round_rows c = { x, o, s, err, U, work, K, G, t };
        pool_for(rows, 8, round_rows, &c);
        for (size_t r = 0; r < rows; r++) {   /* in row order: the same sums for any thread count */
            se += err[3 * r];
            sw += err[3 * r + 1];
            mx = fmax(mx, err[3 * r + 2]);
        }
        rc = write_slab(w, ds, p->name, nd, shape, off, cnt, o, ty);
        if (!rc && t == DTYPE_INT8) {
            hsize_t scnt[CKPT_H5_MAX_DIMS];
            memcpy(scnt, cnt, sizeof scnt);
            scnt[last] = G;
            rc = write_slab(w, dss, sname, nd, sshape, off, scnt, s, CKPT_H5_F32);
        }
    }
    (void)rows_all;
    rep->rel_err = sw > 0 ? sqrt(se / sw) : 0.0;
    rep->max_abs_err = mx;
    td_free(x);
    td_free(o);
    td_free(s);
    td_free(work);
    td_free(U);
    td_free(err);
    if (H5Dclose(ds) < 0 && !rc) rc = -1;
    if (dss >= 0 && H5Dclose(dss) < 0 && !rc) rc = -1;
    return rc;
}

int ckpt_quantize(const char *in, const char *out, const ModelDtypes *dt, const CkptQuantRound *round,
                  CkptQuantTensor **rep, int *n_rep, char *err, size_t err_len)
{
    if (rep) *rep = NULL;
    if (n_rep) *n_rep = 0;
    char file[PATH_MAX];
    if (ckpt_resolve(in, file, sizeof file)) {
        err[0] = 0;
        return -1;
    }
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(file, &cfg, &meta, err, err_len)) return -1;
    hid_t fin = ckpt_h5_open(file);
    if (fin < 0) {
        (void)td_snprintf(err, err_len, "%s: cannot open", file);
        return -1;
    }
    char *q = NULL;
    if (ckpt_h5_get_str(fin, "quantized", &q) == 0) {
        (void)td_snprintf(err, err_len, "%s: is already quantized (%.16s): quantize the float checkpoint it came from", file, q);
        td_free(q);
        H5Fclose(fin);
        return -1;
    }
    H5Eclear2(H5E_DEFAULT);
    Topology single;
    topo_single(&single, &cfg);
    Param *ps;
    const int np = model_param_table(&cfg, &single, &ps);
    CkptQuantTensor *r = td_calloc((size_t)td_max((size_t)np, 1) * sizeof(CkptQuantTensor));
    char tmp[PATH_MAX + 8];
    (void)td_snprintf(tmp, sizeof tmp, "%s.tmp", out);
    QWriter w = { ckpt_h5_create(tmp, NULL), out, "" };
    int rc = 0, nr = 0;
    if (w.f < 0) {
        (void)td_snprintf(w.err, sizeof w.err, "cannot create %s: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (!rc) rc = write_root(&w, &cfg, &meta, dt);
    if (!rc) rc = write_tokenizer(&w, file);
    for (int i = 0; i < np && !rc; i++) {
        if (ps[i].tied_copy) continue;
        rc = quantize_tensor(&w, file, fin, &ps[i], model_serving_dtype(&cfg, dt, &ps[i]), round, &r[nr]);
        nr++;
    }
    if (w.f >= 0 && H5Fclose(w.f) < 0 && !rc) {
        (void)td_snprintf(w.err, sizeof w.err, "cannot close %s", tmp);
        rc = -1;
    }
    if (!rc) {
        int fd = open(tmp, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) || rename(tmp, out)) {
            (void)td_snprintf(w.err, sizeof w.err, "cannot publish %s: %s", tmp, strerror(errno));
            rc = -1;
        }
        if (fd >= 0) close(fd);
    }
    if (rc) {
        unlink(tmp);
        (void)td_snprintf(err, err_len, "%s: %s", out, w.err);
        td_free(r);
        r = NULL;
        nr = 0;
    }
    H5Fclose(fin);
    td_free(ps);
    if (rep) *rep = r;
    else td_free(r);
    if (n_rep) *n_rep = nr;
    return rc;
}

/* One tensor of ckpt_overwrite_f32 into the open file f: 0 or -1 with err. */
static int overwrite_one(hid_t f, const char *path, const CkptF32 *t, char *err, size_t err_len)
{
    int rc = -1;
    hid_t ds = H5Dopen2(f, t->name, H5P_DEFAULT), ty = -1, sp = -1;
    if (ds < 0) (void)td_snprintf(err, err_len, "%s: no dataset %s", path, t->name);
    else if ((ty = H5Dget_type(ds)) < 0 || H5Tequal(ty, H5T_IEEE_F32LE) <= 0)
        (void)td_snprintf(err, err_len, "%s: dataset %s is not float32", path, t->name);
    else if ((sp = H5Dget_space(ds)) < 0 || H5Sget_simple_extent_npoints(sp) != (hssize_t)t->numel)
        (void)td_snprintf(err, err_len, "%s: dataset %s does not hold %zu values", path, t->name, t->numel);
    else if (H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->w) < 0)
        (void)td_snprintf(err, err_len, "%s: cannot write dataset %s", path, t->name);
    else rc = 0;
    if (sp >= 0) H5Sclose(sp);
    if (ty >= 0) H5Tclose(ty);
    if (ds >= 0) H5Dclose(ds);
    return rc;
}

int ckpt_overwrite_f32(const char *path, const CkptF32 *t, int n, const char *key, const char *value, char *err,
                       size_t err_len)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) {
        (void)td_snprintf(err, err_len, "%s: cannot open for writing", path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = overwrite_one(f, path, &t[i], err, err_len);
    if (!rc && key && ckpt_h5_put_str(f, key, value)) {
        (void)td_snprintf(err, err_len, "%s: cannot set attribute %s", path, key);
        rc = -1;
    }
    if (H5Fclose(f) < 0 && !rc) {
        (void)td_snprintf(err, err_len, "%s: cannot close", path);
        rc = -1;
    }
    H5Eclear2(H5E_DEFAULT);
    return rc;
}

bool ckpt_router_fit_kv(const char *path, Dtype *kv)
{
    char file[PATH_MAX];
    if (!is_tandem(path) || ckpt_resolve(path, file, sizeof file)) return false;
    hid_t f = ckpt_h5_open(file);
    if (f < 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
    }
    const bool found = router_fit_kv_of(f, kv);
    H5Fclose(f);
    H5Eclear2(H5E_DEFAULT);
    return found;
}

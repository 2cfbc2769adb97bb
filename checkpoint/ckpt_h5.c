/* checkpoint/ckpt_h5.c - HDF5 files, attributes, datasets, pieces and boxes
 * for the checkpoint module (ckpt_h5.h). */
#include "checkpoint/ckpt_h5.h"
#include "checkpoint/ckpt.h"
#include "core/common.h"
#include "core/dtype.h"

#include <stdio.h>
#include <string.h>

/* Objects of at least this many bytes start on a multiple of CKPT_ALIGN in
 * the file: big chunks then map to whole pages / file-system blocks. */
#define CKPT_ALIGN_THRESHOLD (64u << 10)
#define CKPT_ALIGN (4u << 10)

void ckpt_h5_init(void)
{
    static bool done = false;
    if (done) return;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    done = true;
}

/* IEEE binary16, little-endian: HDF5 1.10 has no predefined half type, so
 * it is derived from float32 exactly as h5py does (h5py reads it as
 * numpy float16). */
static hid_t half_type(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

/* ---------------------------------------------------------------- errors of set-up calls */

/* The property-list call that failed last, for ckpt_h5_why (HDF5 is used
 * by one thread at a time: see ckpt.h). */
static char g_failed_call[48];

/* rc of an HDF5 call: true when it succeeded; otherwise remembers its name. */
static bool h5ok(long long rc, const char *call)
{
    if (rc >= 0) return true;
    if (!g_failed_call[0]) snprintf(g_failed_call, sizeof g_failed_call, "%s", call);
    return false;
}

/* ---------------------------------------------------------------- files */

/* Closes a property list without losing the error stack of the call
 * before it (every successful API call clears the stack). */
static void close_plist_keep_errors(hid_t plist)
{
    hid_t errs = H5Eget_current_stack();
    H5Pclose(plist);
    if (errs >= 0) H5Eset_current_stack(errs);
}

/* The file access list, or -1 (the failed call remembered). */
static hid_t file_access(void *comm)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (!h5ok(fapl, "H5Pcreate(H5P_FILE_ACCESS)")) return -1;
    /* v2 object headers and superblock: metadata carries checksums too,
     * and every HDF5 >= 1.8 reads the file (h5py, h5dump, other languages). */
    bool ok = h5ok(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18), "H5Pset_libver_bounds") &&
              h5ok(H5Pset_alignment(fapl, CKPT_ALIGN_THRESHOLD, CKPT_ALIGN), "H5Pset_alignment") &&
              h5ok(H5Pset_meta_block_size(fapl, 128u << 10), "H5Pset_meta_block_size");
    if (ok && comm)
        ok = h5ok(H5Pset_fapl_mpio(fapl, *(MPI_Comm *)comm, MPI_INFO_NULL), "H5Pset_fapl_mpio") &&
             h5ok(H5Pset_all_coll_metadata_ops(fapl, 1), "H5Pset_all_coll_metadata_ops") &&
             h5ok(H5Pset_coll_metadata_write(fapl, 1), "H5Pset_coll_metadata_write");
    if (!ok) {
        close_plist_keep_errors(fapl);
        return -1;
    }
    return fapl;
}

hid_t ckpt_h5_create(const char *path, void *comm)
{
    ckpt_h5_init();
    hid_t fapl = file_access(comm);
    if (fapl < 0) return -1;
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    close_plist_keep_errors(fapl);
    return f;
}

hid_t ckpt_h5_open(const char *path)
{
    ckpt_h5_init();
    return H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
}

/* ---------------------------------------------------------------- errors */

struct why { bool checksum, truncated; char inner[256]; };

static herr_t why_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    struct why *w = data;
    const char *d = e->desc ? e->desc : "";
    if (strstr(d, "Fletcher32") || strstr(d, "checksum")) w->checksum = true;
    if (strstr(d, "truncated") || strstr(d, "addr overflow") || strstr(d, "address overflow"))
        w->truncated = true;
    if (n == 0) snprintf(w->inner, sizeof w->inner, "%s", d);
    return 0;
}

void ckpt_h5_why(char *out, size_t n)
{
    struct why w = { false, false, "" };
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, why_cb, &w);
    H5Eclear2(H5E_DEFAULT);
    if (w.checksum)
        snprintf(out, n, "checksum mismatch (Fletcher32): the data is corrupt");
    else if (w.truncated)
        snprintf(out, n, "file is truncated");
    else if (g_failed_call[0])
        snprintf(out, n, "%s failed: %s", g_failed_call, w.inner[0] ? w.inner : "no reason given");
    else
        snprintf(out, n, "%s", w.inner[0] ? w.inner : "HDF5 call failed");
    g_failed_call[0] = 0;
}

/* ---------------------------------------------------------------- attributes */

static int put_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hid_t space, const void *buf)
{
    if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
    hid_t a = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, mtype, buf) >= 0 ? 0 : -1;
    if (a >= 0) H5Aclose(a);
    return rc;
}

int ckpt_h5_put_str(hid_t obj, const char *name, const char *s)
{
    /* variable-length UTF-8, what h5py writes: Python reads it as str */
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    hid_t sp = H5Screate(H5S_SCALAR);
    int rc = put_attr(obj, name, t, t, sp, &s);
    H5Sclose(sp);
    H5Tclose(t);
    return rc;
}

int ckpt_h5_put_i64(hid_t obj, const char *name, int64_t v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    int rc = put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, sp, &v);
    H5Sclose(sp);
    return rc;
}

int ckpt_h5_put_i64s(hid_t obj, const char *name, const int64_t *v, size_t n)
{
    hsize_t dim = n;
    hid_t sp = H5Screate_simple(1, &dim, NULL);
    int rc = put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, sp, v);
    H5Sclose(sp);
    return rc;
}

int ckpt_h5_put_f64(hid_t obj, const char *name, double v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    int rc = put_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sp, &v);
    H5Sclose(sp);
    return rc;
}

/* Opens attribute name of obj with its type class checked; -1 missing, -2 wrong class. */
static hid_t open_attr(hid_t obj, const char *name, H5T_class_t want, hid_t *type, hssize_t *npoints)
{
    if (H5Aexists(obj, name) <= 0) return -1;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return -1;
    *type = H5Aget_type(a);
    hid_t sp = H5Aget_space(a);
    *npoints = H5Sget_simple_extent_npoints(sp);
    H5Sclose(sp);
    if (H5Tget_class(*type) != want) {
        H5Tclose(*type);
        H5Aclose(a);
        return -2;
    }
    return a;
}

int ckpt_h5_get_str(hid_t obj, const char *name, char **out)
{
    hid_t t;
    hssize_t np;
    hid_t a = open_attr(obj, name, H5T_STRING, &t, &np);
    if (a < 0) return (int)a;
    int rc = -2;
    if (np == 1 && H5Tis_variable_str(t) > 0) {
        char *v = NULL;
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        if (H5Aread(a, mt, &v) >= 0 && v) {
            *out = td_strdup(v);
            H5free_memory(v);
            rc = 0;
        }
        H5Tclose(mt);
    } else if (np == 1) {
        size_t n = H5Tget_size(t);
        char *s = td_calloc(n + 1);
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, n + 1);
        H5Tset_cset(mt, H5Tget_cset(t));
        H5Tset_strpad(mt, H5T_STR_NULLTERM);
        if (H5Aread(a, mt, s) >= 0) {
            *out = s;
            rc = 0;
        } else {
            td_free(s);
        }
        H5Tclose(mt);
    }
    H5Tclose(t);
    H5Aclose(a);
    return rc;
}

int ckpt_h5_get_i64s(hid_t obj, const char *name, int64_t *v, size_t cap, size_t *n)
{
    hid_t t;
    hssize_t np;
    hid_t a = open_attr(obj, name, H5T_INTEGER, &t, &np);
    if (a < 0) return (int)a;
    int rc = -2;
    if (np >= 1 && (size_t)np <= cap && H5Aread(a, H5T_NATIVE_INT64, v) >= 0) {
        *n = (size_t)np;
        rc = 0;
    }
    H5Tclose(t);
    H5Aclose(a);
    return rc;
}

int ckpt_h5_get_i64(hid_t obj, const char *name, int64_t *v)
{
    size_t n;
    return ckpt_h5_get_i64s(obj, name, v, 1, &n);
}

int ckpt_h5_get_f64(hid_t obj, const char *name, double *v)
{
    hid_t t;
    hssize_t np;
    hid_t a = open_attr(obj, name, H5T_FLOAT, &t, &np);
    if (a == -2) {
        /* an integer-valued hyper-parameter written by another tool */
        int64_t i;
        if (ckpt_h5_get_i64(obj, name, &i) == 0) {
            *v = (double)i;
            return 0;
        }
        return -2;
    }
    if (a < 0) return (int)a;
    int rc = np == 1 && H5Aread(a, H5T_NATIVE_DOUBLE, v) >= 0 ? 0 : -2;
    H5Tclose(t);
    H5Aclose(a);
    return rc;
}

bool ckpt_h5_exists(hid_t loc, const char *path)
{
    char *buf = td_strdup(path);   /* any length */
    bool found = true;
    for (char *p = buf; found; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (buf[0] && H5Lexists(loc, buf, H5P_DEFAULT) <= 0) found = false;
            if (!c) break;
            *p = c;
        }
    }
    td_free(buf);
    return found;
}

/* Link creation: intermediate groups, UTF-8 names; -1 when a call fails
 * (remembered for ckpt_h5_why). */
static hid_t link_create_plist(void)
{
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (!h5ok(lcpl, "H5Pcreate(H5P_LINK_CREATE)")) return -1;
    if (h5ok(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group") &&
        h5ok(H5Pset_char_encoding(lcpl, H5T_CSET_UTF8), "H5Pset_char_encoding"))
        return lcpl;
    close_plist_keep_errors(lcpl);
    return -1;
}

hid_t ckpt_h5_group(hid_t file, const char *path)
{
    if (ckpt_h5_exists(file, path)) return H5Gopen2(file, path, H5P_DEFAULT);
    hid_t lcpl = link_create_plist();
    if (lcpl < 0) return -1;
    hid_t g = H5Gcreate2(file, path, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    close_plist_keep_errors(lcpl);
    return g;
}

/* ---------------------------------------------------------------- writing */

static size_t box_count(int ndim, const hsize_t *cnt)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)cnt[i];
    return n;
}

/* File and memory types of a storage type (the caller closes the half type). */
static void types_of(CkptH5Type t, hid_t *ftype, hid_t *mtype, bool *owned)
{
    *owned = false;
    switch (t) {
    case CKPT_H5_F32: *ftype = H5T_IEEE_F32LE; *mtype = H5T_NATIVE_FLOAT; break;
    case CKPT_H5_BF16: *ftype = H5T_STD_U16LE; *mtype = H5T_NATIVE_UINT16; break;
    case CKPT_H5_F16: *ftype = *mtype = half_type(); *owned = true; break;
    case CKPT_H5_U8: *ftype = H5T_STD_U8LE; *mtype = H5T_NATIVE_UINT8; break;
    case CKPT_H5_I8: *ftype = H5T_STD_I8LE; *mtype = H5T_NATIVE_INT8; break;
    default: *ftype = H5T_STD_U64LE; *mtype = H5T_NATIVE_UINT64; break;
    }
}

hid_t ckpt_h5_create_dataset(hid_t file, const CkptPiece *pc, char *err, size_t err_len)
{
    hid_t ftype, mtype;
    bool owned;
    types_of(pc->type, &ftype, &mtype, &owned);
    hid_t space = H5Screate_simple(pc->ndim, pc->shape, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), lcpl = -1, ds = -1;
    /* chunked along the shards, Fletcher32; every element is written: no fill pass */
    bool ok = h5ok(space, "H5Screate_simple") && h5ok(dcpl, "H5Pcreate(H5P_DATASET_CREATE)") &&
              h5ok(H5Pset_chunk(dcpl, pc->ndim, pc->chunk), "H5Pset_chunk") &&
              h5ok(H5Pset_fletcher32(dcpl), "H5Pset_fletcher32") &&
              h5ok(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    if (ok) lcpl = link_create_plist();
    if (lcpl >= 0) ds = H5Dcreate2(file, pc->name, ftype, space, lcpl, dcpl, H5P_DEFAULT);
    const char *stage = "create";
    if (ds >= 0) {
        stage = "write the attributes of";
        if ((pc->partition && ckpt_h5_put_str(ds, "partition", pc->partition)) ||
            (pc->dtype_attr && ckpt_h5_put_str(ds, "dtype", pc->dtype_attr)) ||
            (!pc->dtype_attr && pc->type == CKPT_H5_BF16 && ckpt_h5_put_str(ds, "dtype", "bfloat16"))) {
            H5Dclose(ds);
            ds = -1;
        }
    }
    if (ds < 0) {
        char why[300];
        ckpt_h5_why(why, sizeof why);
        snprintf(err, err_len, "cannot %s dataset /%s: %s", stage, pc->name, why);
    }
    if (lcpl >= 0) H5Pclose(lcpl);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    if (owned) H5Tclose(ftype);
    return ds;
}

int ckpt_h5_write_box(hid_t ds, const CkptPiece *pc, bool collective, char *err, size_t err_len)
{
    hid_t ftype, mtype;
    bool owned;
    types_of(pc->type, &ftype, &mtype, &owned);
    hid_t space = H5Dget_space(ds), mspace;
    size_t n = box_count(pc->ndim, pc->cnt);
    const void *buf = pc->data;
    void *tmp = NULL;
    static const uint64_t dummy = 0;   /* HDF5 wants a buffer even for an empty selection */
    if (n > 0) {
        H5Sselect_hyperslab(space, H5S_SELECT_SET, pc->off, NULL, pc->cnt, NULL);
        mspace = H5Screate_simple(pc->ndim, pc->cnt, NULL);
        if ((pc->type == CKPT_H5_BF16 || pc->type == CKPT_H5_F16) && !pc->raw) {
            const float *x = pc->data;
            uint16_t *h = tmp = td_malloc(n * sizeof(uint16_t));
            if (pc->type == CKPT_H5_BF16)
                for (size_t i = 0; i < n; i++) h[i] = dtype_bf16_from_f32(x[i]);
            else
                for (size_t i = 0; i < n; i++) h[i] = dtype_f16_from_f32(x[i]);
            buf = tmp;
        }
    } else {
        H5Sselect_none(space);
        hsize_t one = 1;
        mspace = H5Screate_simple(1, &one, NULL);
        H5Sselect_none(mspace);
        buf = &dummy;
    }
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    bool ok = h5ok(dxpl, "H5Pcreate(H5P_DATASET_XFER)") &&
              (!collective || h5ok(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio"));
    if (!ok && collective) {
        /* the other ranks are entering the collective write: returning
         * would leave them waiting for this one forever */
        char why[300];
        ckpt_h5_why(why, sizeof why);
        TD_CHECK(false, "cannot write dataset /%s collectively: %s", pc->name, why);
    }
    int rc = !ok || H5Dwrite(ds, mtype, mspace, space, dxpl, buf) < 0 ? -1 : 0;
    if (rc) {
        char why[300];
        ckpt_h5_why(why, sizeof why);
        snprintf(err, err_len, "cannot write dataset /%s: %s", pc->name, why);
    }
    td_free(tmp);
    if (dxpl >= 0) H5Pclose(dxpl);
    H5Sclose(mspace);
    H5Sclose(space);
    if (owned) H5Tclose(ftype);
    return rc;
}

/* ---------------------------------------------------------------- reading */

static bool is_half(hid_t t)
{
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
    return H5Tget_size(t) == 2 && spos == 15 && epos == 10 && esize == 5 && mpos == 0 &&
           msize == 10 && H5Tget_ebias(t) == 15;
}

static void classify(hid_t ds, hid_t t, CkptH5Desc *d)
{
    H5T_class_t c = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    d->elem = size;
    d->type = CKPT_H5_OTHER;
    if (c == H5T_FLOAT) {
        snprintf(d->type_name, sizeof d->type_name, "float%zu", 8 * size);
        if (size == 4) d->type = CKPT_H5_F32;
        if (size == 2 && is_half(t)) d->type = CKPT_H5_F16;
    } else if (c == H5T_INTEGER) {
        bool is_signed = H5Tget_sign(t) == H5T_SGN_2;
        snprintf(d->type_name, sizeof d->type_name, "%sint%zu", is_signed ? "" : "u", 8 * size);
        if (!is_signed && size == 8) d->type = CKPT_H5_U64;
        if (!is_signed && size == 1) d->type = CKPT_H5_U8;
        if (is_signed && size == 1) d->type = CKPT_H5_I8;
        if (!is_signed && size == 2) {
            char *s = NULL;
            if (ckpt_h5_get_str(ds, "dtype", &s) == 0 && !strcmp(s, "bfloat16")) {
                d->type = CKPT_H5_BF16;
                snprintf(d->type_name, sizeof d->type_name, "bfloat16");
            }
            td_free(s);
        }
    } else {
        snprintf(d->type_name, sizeof d->type_name, "%s", c == H5T_STRING ? "string" : "other");
    }
}

int ckpt_h5_describe(hid_t file, const char *name, CkptH5Desc *d)
{
    memset(d, 0, sizeof *d);
    hid_t ds = H5Oopen(file, name, H5P_DEFAULT);
    if (ds < 0) {
        H5Eclear2(H5E_DEFAULT);
        return -1;
    }
    if (H5Iget_type(ds) != H5I_DATASET) {
        H5Oclose(ds);
        return -1;
    }
    hid_t sp = H5Dget_space(ds);
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd > CKPT_H5_MAX_DIMS) nd = -1;
    d->ndim = nd;
    if (nd > 0) H5Sget_simple_extent_dims(sp, d->shape, NULL);
    H5Sclose(sp);
    hid_t t = H5Dget_type(ds);
    classify(ds, t, d);
    H5Tclose(t);
    /* Layout and filters decide whether the chunk path (ckpt_io.h) may read
     * it.  When they cannot be queried, chunk stays 0 and n_filters -1: the
     * dataset is read through HDF5's own pipeline, which does its checks. */
    d->n_filters = -1;
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl >= 0) {
        H5D_layout_t lay = H5Pget_layout(dcpl);
        if (lay == H5D_CHUNKED && H5Pget_chunk(dcpl, CKPT_H5_MAX_DIMS, d->chunk) != nd)
            memset(d->chunk, 0, sizeof d->chunk);
        int nf = lay < 0 ? -1 : H5Pget_nfilters(dcpl);
        d->n_filters = nf;
        for (int i = 0; i < nf; i++) {
            unsigned flags, cd[8];
            size_t ncd = 8;
            char fname[64];
            unsigned cfg;
            H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof fname, fname, &cfg);
            if (id < 0) d->n_filters = -1;
            if (id == H5Z_FILTER_FLETCHER32) d->fletcher32 = true;
        }
        H5Pclose(dcpl);
    }
    H5Eclear2(H5E_DEFAULT);
    d->stored_bytes = (size_t)H5Dget_storage_size(ds);
    H5Dclose(ds);
    return 0;
}

int ckpt_h5_read_box(hid_t file, const char *name, const CkptH5Desc *d, const hsize_t *off,
                     const hsize_t *cnt, void *out, char *err, size_t err_len)
{
    size_t n = box_count(d->ndim, cnt);
    if (n == 0) return 0;
    hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    if (ds < 0) {
        char why[300];
        ckpt_h5_why(why, sizeof why);
        snprintf(err, err_len, "cannot open dataset /%s: %s", name, why);
        return -1;
    }
    hid_t fspace = H5Dget_space(ds);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, off, NULL, cnt, NULL);
    hid_t mspace = H5Screate_simple(d->ndim, cnt, NULL);
    herr_t st;
    uint16_t *tmp = NULL;
    hid_t half = -1;
    switch (d->type) {
    case CKPT_H5_F32:
        st = H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out);
        break;
    case CKPT_H5_BF16:
    case CKPT_H5_F16:
        tmp = td_malloc(n * sizeof(uint16_t));
        if (d->type == CKPT_H5_F16) half = half_type();
        st = H5Dread(ds, d->type == CKPT_H5_F16 ? half : H5T_NATIVE_UINT16, mspace, fspace,
                     H5P_DEFAULT, tmp);
        if (st >= 0) {
            float *y = out;
            if (d->type == CKPT_H5_BF16)
                for (size_t i = 0; i < n; i++) y[i] = dtype_f32_from_bf16(tmp[i]);
            else
                for (size_t i = 0; i < n; i++) y[i] = dtype_f32_from_f16(tmp[i]);
        }
        break;
    case CKPT_H5_U64:
        st = H5Dread(ds, H5T_NATIVE_UINT64, mspace, fspace, H5P_DEFAULT, out);
        break;
    case CKPT_H5_U8:
        st = H5Dread(ds, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, out);
        break;
    case CKPT_H5_I8:
        st = H5Dread(ds, H5T_NATIVE_INT8, mspace, fspace, H5P_DEFAULT, out);
        break;
    default:
        st = -1;
        break;
    }
    int rc = 0;
    if (st < 0) {
        char why[300];
        ckpt_h5_why(why, sizeof why);
        if (strstr(why, "checksum"))
            snprintf(err, err_len, "checksum mismatch in dataset /%s (Fletcher32): the data is corrupt", name);
        else
            snprintf(err, err_len, "cannot read dataset /%s: %s", name, why);
        rc = -1;
    }
    td_free(tmp);
    if (half >= 0) H5Tclose(half);
    H5Sclose(mspace);
    H5Sclose(fspace);
    H5Dclose(ds);
    return rc;
}

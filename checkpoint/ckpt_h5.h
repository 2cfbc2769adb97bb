/* checkpoint/ckpt_h5.h - the HDF5 layer under checkpoint/ckpt.c (internal to
 * checkpoint/): opening files with the right driver, typed scalar
 * attributes, creating chunked Fletcher32 datasets and writing one rank's
 * hyperslab ("piece") of them, describing and reading datasets, and turning
 * the HDF5 error stack into one line.
 *
 * A piece is the unit the writer is built on: a dataset (name, global
 * shape, chunk shape, storage type, partition attribute) plus this rank's
 * hyperslab of it (offset, count; a zero count writes nothing) and the
 * data of that box, row-major.  Every rank of a parallel file creates every
 * dataset in the same order with the same description (creation is
 * collective in parallel HDF5) and writes its own hyperslab; only the
 * hyperslab differs between ranks.  ZeRO-1 sharding of the moments will be
 * a different hyperslab per rank, nothing more.
 */
#ifndef TANDEM_CHECKPOINT_CKPT_H5_H
#define TANDEM_CHECKPOINT_CKPT_H5_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_H5_MAX_DIMS 4

/* Storage types.  BF16: uint16 with the attribute dtype="bfloat16".  U8:
 * raw bytes (the files of /tokenizer).  I8: int8, read and written as is
 * (the quantized weights of docs/checkpoint.md, attribute dtype="int8_g32"). */
typedef enum { CKPT_H5_F32, CKPT_H5_BF16, CKPT_H5_F16, CKPT_H5_U64, CKPT_H5_U8, CKPT_H5_I8, CKPT_H5_OTHER } CkptH5Type;

/* Bytes of one element on disk, and in memory (float types are float32 in
 * memory unless a piece says raw). */
static inline size_t ckpt_h5_disk_size(CkptH5Type t)
{
    return t == CKPT_H5_U64 ? 8 : t == CKPT_H5_F32 ? 4 : t == CKPT_H5_U8 || t == CKPT_H5_I8 ? 1 : 2;
}
static inline size_t ckpt_h5_mem_size(CkptH5Type t)
{
    return t == CKPT_H5_U64 ? 8 : t == CKPT_H5_U8 || t == CKPT_H5_I8 ? 1 : 4;
}

/* Switches HDF5's automatic error printing off (once per process). */
void ckpt_h5_init(void);

/* Creates (truncates) path for writing.  comm: pointer to an MPI_Comm for
 * the MPI-IO driver (every rank of it calls), NULL for the POSIX driver.
 * Returns the file id or -1. */
hid_t ckpt_h5_create(const char *path, void *comm);
/* Opens path read-only with the POSIX driver; -1 on failure. */
hid_t ckpt_h5_open(const char *path);

/* One line describing why the last HDF5 call failed, from the error stack:
 * "checksum mismatch (Fletcher32)", "file is truncated", or the innermost
 * message.  Clears the stack. */
void ckpt_h5_why(char *out, size_t n);

/* Attributes of an object (file, group or dataset id).  put_*: collective
 * in a parallel file (same values on every rank); 0 or -1. */
int ckpt_h5_put_str(hid_t obj, const char *name, const char *s);
int ckpt_h5_put_i64(hid_t obj, const char *name, int64_t v);
int ckpt_h5_put_i64s(hid_t obj, const char *name, const int64_t *v, size_t n);
int ckpt_h5_put_f64(hid_t obj, const char *name, double v);
/* get_*: 0 ok; -1 missing; -2 present but of the wrong type/shape. */
int ckpt_h5_get_str(hid_t obj, const char *name, char **out);   /* td_malloc'd */
int ckpt_h5_get_i64(hid_t obj, const char *name, int64_t *v);
int ckpt_h5_get_f64(hid_t obj, const char *name, double *v);
/* Integer array attribute of at most cap elements; *n gets the count. */
int ckpt_h5_get_i64s(hid_t obj, const char *name, int64_t *v, size_t cap, size_t *n);
/* Whether path (relative to loc, no leading '/') names a link, walking
 * the intermediate groups. */
bool ckpt_h5_exists(hid_t loc, const char *path);
/* Creates the group path (and its parents); returns its id or -1.
 * Collective in a parallel file. */
hid_t ckpt_h5_group(hid_t file, const char *path);

typedef struct {
    const char *name;                 /* dataset path, no leading '/' */
    int ndim;
    hsize_t shape[CKPT_H5_MAX_DIMS];  /* global */
    hsize_t chunk[CKPT_H5_MAX_DIMS];
    hsize_t off[CKPT_H5_MAX_DIMS];    /* this rank's hyperslab ... */
    hsize_t cnt[CKPT_H5_MAX_DIMS];    /* ... (any zero: nothing to write) */
    const void *data;                 /* float32 box (F32/BF16/F16), uint64 (U64), bytes (U8) or int8 (I8), row-major */
    CkptH5Type type;
    bool raw;                         /* BF16/F16: data already holds the 16-bit values (no conversion) */
    const char *partition;            /* attribute; NULL: none */
    const char *dtype_attr;           /* attribute dtype (I8: "int8_g32"); NULL: the type's own (BF16: "bfloat16") */
} CkptPiece;

/* Creates the dataset of pc (chunked, Fletcher32, no fill pass) with its
 * attributes (partition; dtype="bfloat16" for BF16).  Collective in a
 * parallel file.  Returns the dataset id, or -1 with the reason in err. */
hid_t ckpt_h5_create_dataset(hid_t file, const CkptPiece *pc, char *err, size_t err_len);
/* Writes this rank's box of pc into ds with H5Dwrite (float32 converted to
 * the storage type).  collective: parallel file (every rank calls, in the
 * same order; an empty box takes part with an empty selection).  0, or -1
 * with the reason in err. */
int ckpt_h5_write_box(hid_t ds, const CkptPiece *pc, bool collective, char *err, size_t err_len);

typedef struct {
    int ndim;
    hsize_t shape[CKPT_H5_MAX_DIMS];
    hsize_t chunk[CKPT_H5_MAX_DIMS];  /* zeros when not chunked */
    CkptH5Type type;
    char type_name[16];               /* "float32", "bfloat16", "float16", "uint64", "float64", ... */
    size_t elem;                      /* bytes per element on disk */
    bool fletcher32;
    int n_filters;
    size_t stored_bytes;
} CkptH5Desc;

/* Describes dataset `name`: 0, -1 when absent (or not a dataset). */
int ckpt_h5_describe(hid_t file, const char *name, CkptH5Desc *d);

/* Reads the box [off, off + cnt) of dataset `name` whose description is d
 * into out with H5Dread: float32 for F32/BF16/F16 (upcast), uint64 for
 * U64, bytes for U8.  0, or -1 with the reason in err ("checksum mismatch ...").  The
 * fast path is checkpoint/ckpt_io.h; this one serves everything else. */
int ckpt_h5_read_box(hid_t file, const char *name, const CkptH5Desc *d, const hsize_t *off,
                     const hsize_t *cnt, void *out, char *err, size_t err_len);

#endif

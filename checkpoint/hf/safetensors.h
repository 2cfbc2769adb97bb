/* checkpoint/hf/safetensors.h - reading safetensors, the Hugging Face
 * weight format: one file, or a sharded set listed by
 * model.safetensors.index.json, memory-mapped read-only.
 *
 * A file is
 *     8 bytes      N, little-endian u64: the header length
 *     N bytes      header: a UTF-8 JSON object
 *                    {"__metadata__": {"key": "value", ...},          (optional)
 *                     "name": {"dtype": "BF16", "shape": [E, I, H],
 *                              "data_offsets": [begin, end]}, ...}
 *     the rest     the data section; tensor bytes at [begin, end) of it,
 *                  little-endian, row-major (C order)
 *
 * Everything is validated at open, as the reference implementation does
 * (huggingface/safetensors, safetensors/src/tensor.rs) and a little more
 * (docs/import.md lists each rule and its message): the header length is at
 * most 100,000,000 bytes and inside the file; the header is valid UTF-8 and
 * one JSON object; __metadata__ maps strings to strings; each tensor has a
 * known dtype, a shape of at most ST_MAX_DIMS non-negative integers and
 * data_offsets [begin, end] with end - begin = numel x element size
 * (overflow-checked); sorted by begin, tensors are contiguous from 0 and
 * cover the data section exactly; no name appears twice.  A sharded index
 * must name existing files (plain names inside the directory), every name
 * in its weight_map must be in the file it names, every tensor of every
 * file must be in the weight_map, and no tensor may be in two files.
 * After a successful open no read can leave the map.
 *
 * A refused file gives one line in err, naming the file and the problem:
 *     model-00002-of-00002.safetensors: tensor 'x': data_offsets [10, 20] overlap tensor 'y' [0, 16]
 *
 * Ownership: StCheckpoint owns its maps, names and metadata; tensor data
 * pointers point into the maps and live until st_close.  The files must not
 * change while open (a file truncated under a live map raises SIGBUS, as
 * with any mmap reader).  After st_open returns, every function here is
 * read-only on the StCheckpoint and may be called from several threads.
 */
#ifndef TANDEM_CHECKPOINT_HF_SAFETENSORS_H
#define TANDEM_CHECKPOINT_HF_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8                   /* rank limit of a tensor's shape */
#define ST_MAX_HEADER 100000000u        /* bytes, as the reference (MAX_HEADER_SIZE) */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

/* Element types, in the reference's order.  Only F32, F16, BF16 and F8_E4M3
 * convert to float32 (st_dtype_to_f32); the others are parsed, validated
 * and exposed as raw bytes.  Sub-byte types (F4, F6_E2M3, F6_E3M2) are
 * refused by name. */
typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_C64, ST_N_DTYPES
} StDtype;

typedef struct {
    char *name;                    /* owned */
    StDtype dtype;
    int ndim;                      /* 0 (a scalar) .. ST_MAX_DIMS */
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;                /* product of shape (1 for a scalar) */
    uint64_t begin, end;           /* data_offsets, relative to the data section */
    const unsigned char *data;     /* first byte, inside the map; any alignment */
    size_t nbytes;                 /* end - begin */
    bool aligned;                  /* data is aligned for the element type */
    int file;                      /* index in StCheckpoint.files */
} StTensor;

typedef struct {
    char *path;                    /* owned: as opened (directory joined) */
    const unsigned char *map;      /* the whole file (or the borrowed buffer) */
    size_t size;                   /* bytes */
    bool mapped;                   /* map came from mmap (st_close unmaps it) */
    size_t header_len;             /* N; the data section starts at 8 + N */
    size_t n_meta;                 /* __metadata__ pairs, sorted by key */
    char **meta_key, **meta_value; /* owned */
} StFile;

typedef struct {
    int n_files;
    StFile *files;                 /* owned; sorted by path for a sharded set */
    size_t n_tensors;
    StTensor *tensors;             /* owned; sorted by name (strcmp) */
    bool sharded;                  /* opened through model.safetensors.index.json */
} StCheckpoint;

/* Opens path: a .safetensors file, a model.safetensors.index.json, or a
 * directory holding model.safetensors (preferred, as transformers does) or
 * model.safetensors.index.json.  Validates everything (see above).
 * Returns 0, or -1 with one line in err (st is then zeroed; st_close is
 * still fine). */
int st_open(StCheckpoint *st, const char *path, char *err, size_t err_len);

/* Parses and validates len bytes of one safetensors file held in memory
 * (borrowed: buf must outlive st; not copied, not freed).  label stands for
 * the file name in messages and StFile.path.  Same contract as st_open. */
int st_open_buffer(StCheckpoint *st, const void *buf, size_t len, const char *label, char *err,
                   size_t err_len);

/* Unmaps and frees; a zeroed StCheckpoint is fine; safe twice. */
void st_close(StCheckpoint *st);

/* The tensor called name, or NULL.  Binary search over the sorted names. */
const StTensor *st_find(const StCheckpoint *st, const char *name);

/* Value of __metadata__[key] in file f (0 for a single file), or NULL. */
const char *st_metadata(const StCheckpoint *st, int f, const char *key);

/* "F32", "BF16", ...; size in bytes of one element; name -> dtype (0, or -1
 * for a name that is not a whole-byte safetensors dtype). */
const char *st_dtype_name(StDtype t);
size_t st_dtype_size(StDtype t);
int st_dtype_parse(const char *s, StDtype *t);
/* True for the types st_read_*_f32 convert (exactly): F32, F16, BF16, F8_E4M3. */
bool st_dtype_to_f32(StDtype t);

/* The tensor's raw bytes (t->nbytes of them), aligned for its element
 * type: the pointer into the map when t->aligned (then *copy = NULL), else
 * a td_malloc'ed aligned copy, returned in *copy too, that the caller
 * releases with td_free.  Misaligned data is never read through a typed
 * pointer. */
const void *st_tensor_bytes(const StTensor *t, void **copy);

/* Reads the box start[d] .. start[d] + count[d] (d < t->ndim) of t,
 * converted to float32, into out (prod(count) floats, row-major over the
 * box; overwritten).  Returns 0, or -1 with one line in err (a box outside
 * the shape, or a dtype that does not convert).  A rank reads its tp/ep
 * slice with this: only the pages of the box are touched. */
int st_read_slice_f32(const StTensor *t, const uint64_t *start, const uint64_t *count, float *out,
                      char *err, size_t err_len);
/* The whole tensor (n must be t->numel). */
int st_read_f32(const StTensor *t, float *out, size_t n, char *err, size_t err_len);
/* Rows [begin, end) along dimension dim, every index of the other
 * dimensions: out holds numel / shape[dim] * (end - begin) floats. */
int st_read_range_f32(const StTensor *t, int dim, uint64_t begin, uint64_t end, float *out, char *err,
                      size_t err_len);
/* The same box as raw little-endian bytes of the stored type (no
 * conversion; out needs no alignment): prod(count) x element size bytes. */
int st_read_slice_raw(const StTensor *t, const uint64_t *start, const uint64_t *count, void *out,
                      char *err, size_t err_len);

#endif

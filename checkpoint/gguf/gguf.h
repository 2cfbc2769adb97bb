/* checkpoint/gguf/gguf.h - writing GGUF v3, the file format of ggml and
 * llama.cpp (written from ggml's docs/gguf.md; docs/gguf.md of tandem
 * describes what tandem writes).
 *
 * A file is, all integers little-endian:
 *   header   u32 magic "GGUF" (0x46554747), u32 version 3,
 *            u64 n_tensors, u64 n_kv
 *   kv       n_kv times: string key, u32 value type, value
 *              string = u64 byte length + UTF-8 bytes (no NUL)
 *              array  = u32 element type, u64 count, the elements
 *   infos    n_tensors times: string name, u32 n_dims, u64 ne[n_dims]
 *            (ne[0] the innermost, fastest-varying dimension: a row-major
 *            [rows, cols] matrix has ne = {cols, rows}), u32 ggml type,
 *            u64 offset of its data from the start of the data section
 *            (a multiple of the alignment)
 *   padding  zeros to the next multiple of the alignment (32)
 *   data     each tensor's bytes at its offset, zero-padded to the
 *            alignment
 *
 * Use: gguf_open, then every key (gguf_kv_*) and tensor info
 * (gguf_add_tensor) in the order they are to appear, then gguf_begin_data
 * (writes header, keys and infos), then each tensor's bytes in the order
 * they were added (gguf_write_tensor, whole or in pieces), then gguf_close
 * (checks every byte was written, flushes, fsyncs and renames PATH.tmp to
 * PATH).  gguf_abort removes PATH.tmp.  Keys and infos are kept in memory
 * (a tokenizer of 150k tokens and merges is a few MB); tensor data streams.
 *
 * Errors: the kv and info calls cannot fail (bad use is a TD_CHECK); file
 * operations return 0 or -1 with one line in err naming the file.  A
 * GgufWriter belongs to one thread.
 */
#ifndef TANDEM_CHECKPOINT_GGUF_GGUF_H
#define TANDEM_CHECKPOINT_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC 0x46554747u   /* "GGUF" read as a little-endian u32 */
#define GGUF_VERSION 3
#define GGUF_ALIGN 32            /* general.alignment's default */
#define GGUF_MAX_DIMS 4

/* Value types of the kv section (gguf.md, enum gguf_type). */
typedef enum {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12,
} GgufType;

/* Tensor types tandem writes (ggml.h, enum ggml_type). */
typedef enum {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q8_0 = 8,   /* blocks of 32 along ne[0]: f16 scale + 32 int8 (34 bytes) */
} GgmlType;

typedef struct GgufWriter GgufWriter;

/* Bytes of a tensor of type t and shape ne[0..n_dims); for Q8_0 ne[0] must
 * be a multiple of 32 (TD_CHECK). */
size_t gguf_tensor_bytes(GgmlType t, int n_dims, const uint64_t *ne);
/* "F32", "F16", "Q8_0". */
const char *gguf_type_name(GgmlType t);

/* Creates PATH.tmp for writing.  Returns 0 and *w, or -1 with err. */
int gguf_open(GgufWriter **w, const char *path, char *err, size_t err_len);

/* Scalar keys. */
void gguf_kv_u32(GgufWriter *w, const char *key, uint32_t v);
void gguf_kv_i32(GgufWriter *w, const char *key, int32_t v);
void gguf_kv_f32(GgufWriter *w, const char *key, float v);
void gguf_kv_bool(GgufWriter *w, const char *key, bool v);
void gguf_kv_str(GgufWriter *w, const char *key, const char *s, size_t len);
/* Arrays: gguf_kv_array opens one of n elements of type elem; then exactly
 * n calls of the matching gguf_arr_* follow (checked when the next key,
 * tensor or gguf_begin_data comes). */
void gguf_kv_array(GgufWriter *w, const char *key, GgufType elem, uint64_t n);
void gguf_arr_str(GgufWriter *w, const char *s, size_t len);
void gguf_arr_i32(GgufWriter *w, int32_t v);
void gguf_arr_f32(GgufWriter *w, float v);

/* Declares the next tensor: name (< 64 bytes, as ggml requires), shape
 * ne[0..n_dims) innermost first, type.  Offsets follow in order. */
void gguf_add_tensor(GgufWriter *w, const char *name, int n_dims, const uint64_t *ne, GgmlType t);

/* Writes the header, the keys and the tensor infos.  0 or -1 with err. */
int gguf_begin_data(GgufWriter *w, char *err, size_t err_len);
/* Appends n bytes of the current tensor's data; once a tensor's bytes are
 * complete its padding is written and the next tensor begins.  Writing
 * more than the declared size is a TD_CHECK.  0 or -1 with err. */
int gguf_write_tensor(GgufWriter *w, const void *data, size_t n, char *err, size_t err_len);
/* Checks every tensor is complete, flushes, fsyncs, renames PATH.tmp to
 * PATH, frees w.  0 or -1 with err (PATH.tmp is then removed). */
int gguf_close(GgufWriter *w, char *err, size_t err_len);
/* Removes PATH.tmp and frees w (NULL is fine). */
void gguf_abort(GgufWriter *w);

#endif

/* checkpoint/gguf/gguf.c - the GGUF v3 writer (gguf.h).
 *
 * Reference: ggml docs/gguf.md (file structure, types) and ggml/src/gguf.cpp
 * (gguf_write_to_buf: the order of the sections, the alignment padding
 * after the infos and after each tensor).  The host must be little-endian
 * (checked at open): every integer is written as its memory image.
 */
#include "checkpoint/gguf/gguf.h"
#include "core/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    unsigned char *p;
    size_t n, cap;
} Buf;

typedef struct {
    uint64_t bytes, offset;
} TensorSlot;

struct GgufWriter {
    char *path, *tmp;
    FILE *f;
    Buf kv, info;
    uint64_t n_kv;
    TensorSlot *t;
    size_t n_t, cap_t;
    uint64_t data_bytes;     /* offset of the next tensor (sum of padded sizes) */
    GgufType arr_elem;       /* open array: element type and elements still due */
    uint64_t arr_left;
    bool began;
    size_t cur;              /* tensor being written */
    uint64_t cur_done;       /* its bytes written so far */
};

static void buf_put(Buf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = td_malloc(cap);
        if (b->n) memcpy(p, b->p, b->n);
        td_free(b->p);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void put_u32(Buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void put_u64(Buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void put_str(Buf *b, const char *s, size_t len)
{
    put_u64(b, len);
    buf_put(b, s, len);
}

size_t gguf_tensor_bytes(GgmlType t, int n_dims, const uint64_t *ne)
{
    TD_CHECK(n_dims >= 1 && n_dims <= GGUF_MAX_DIMS, "gguf: %d dimensions", n_dims);
    uint64_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    switch (t) {
    case GGML_TYPE_F32: return (size_t)n * 4;
    case GGML_TYPE_F16: return (size_t)n * 2;
    case GGML_TYPE_Q8_0:
        TD_CHECK(ne[0] % 32 == 0, "gguf: Q8_0 row of %llu elements is not a multiple of 32",
                 (unsigned long long)ne[0]);
        return (size_t)(n / 32) * 34;
    }
    TD_CHECK(0, "gguf: unknown ggml type %d", (int)t);
    return 0;
}

const char *gguf_type_name(GgmlType t)
{
    switch (t) {
    case GGML_TYPE_F32: return "F32";
    case GGML_TYPE_F16: return "F16";
    case GGML_TYPE_Q8_0: return "Q8_0";
    }
    return "?";
}

int gguf_open(GgufWriter **out, const char *path, char *err, size_t err_len)
{
    const uint32_t one = 1;
    TD_CHECK(*(const unsigned char *)&one == 1, "gguf: the writer needs a little-endian host");
    GgufWriter *w = td_calloc(sizeof *w);
    w->path = td_strdup(path);
    size_t n = strlen(path) + 5;
    w->tmp = td_malloc(n);
    snprintf(w->tmp, n, "%s.tmp", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        snprintf(err, err_len, "%s: cannot create: %s", w->tmp, strerror(errno));
        td_free(w->path);
        td_free(w->tmp);
        td_free(w);
        return -1;
    }
    *out = w;
    return 0;
}

/* Every key, tensor or the data section ends the array before it. */
static void arr_closed(const GgufWriter *w)
{
    TD_CHECK(w->arr_left == 0, "gguf: array still expects %llu elements", (unsigned long long)w->arr_left);
    TD_CHECK(!w->began, "gguf: keys and tensors must come before gguf_begin_data");
}

static void kv_head(GgufWriter *w, const char *key, GgufType t)
{
    arr_closed(w);
    put_str(&w->kv, key, strlen(key));
    put_u32(&w->kv, (uint32_t)t);
    w->n_kv++;
}

void gguf_kv_u32(GgufWriter *w, const char *key, uint32_t v)
{
    kv_head(w, key, GGUF_U32);
    put_u32(&w->kv, v);
}

void gguf_kv_i32(GgufWriter *w, const char *key, int32_t v)
{
    kv_head(w, key, GGUF_I32);
    buf_put(&w->kv, &v, 4);
}

void gguf_kv_f32(GgufWriter *w, const char *key, float v)
{
    kv_head(w, key, GGUF_F32);
    buf_put(&w->kv, &v, 4);
}

void gguf_kv_bool(GgufWriter *w, const char *key, bool v)
{
    kv_head(w, key, GGUF_BOOL);
    unsigned char b = v ? 1 : 0;
    buf_put(&w->kv, &b, 1);
}

void gguf_kv_str(GgufWriter *w, const char *key, const char *s, size_t len)
{
    kv_head(w, key, GGUF_STRING);
    put_str(&w->kv, s, len);
}

void gguf_kv_array(GgufWriter *w, const char *key, GgufType elem, uint64_t n)
{
    TD_CHECK(elem == GGUF_STRING || elem == GGUF_I32 || elem == GGUF_F32, "gguf: array of type %d", (int)elem);
    kv_head(w, key, GGUF_ARRAY);
    put_u32(&w->kv, (uint32_t)elem);
    put_u64(&w->kv, n);
    w->arr_elem = elem;
    w->arr_left = n;
}

static void arr_elem(GgufWriter *w, GgufType t)
{
    TD_CHECK(w->arr_left > 0, "gguf: array element beyond its declared count");
    TD_CHECK(w->arr_elem == t, "gguf: array element of type %d in an array of %d", (int)t, (int)w->arr_elem);
    w->arr_left--;
}

void gguf_arr_str(GgufWriter *w, const char *s, size_t len)
{
    arr_elem(w, GGUF_STRING);
    put_str(&w->kv, s, len);
}

void gguf_arr_i32(GgufWriter *w, int32_t v)
{
    arr_elem(w, GGUF_I32);
    buf_put(&w->kv, &v, 4);
}

void gguf_arr_f32(GgufWriter *w, float v)
{
    arr_elem(w, GGUF_F32);
    buf_put(&w->kv, &v, 4);
}

void gguf_add_tensor(GgufWriter *w, const char *name, int n_dims, const uint64_t *ne, GgmlType t)
{
    arr_closed(w);
    size_t len = strlen(name);
    TD_CHECK(len > 0 && len < 64, "gguf: tensor name '%s' must have 1-63 bytes", name);
    uint64_t bytes = gguf_tensor_bytes(t, n_dims, ne);
    put_str(&w->info, name, len);
    put_u32(&w->info, (uint32_t)n_dims);
    for (int i = 0; i < n_dims; i++) put_u64(&w->info, ne[i]);
    put_u32(&w->info, (uint32_t)t);
    put_u64(&w->info, w->data_bytes);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        TensorSlot *s = td_malloc(cap * sizeof *s);
        if (w->n_t) memcpy(s, w->t, w->n_t * sizeof *s);
        td_free(w->t);
        w->t = s;
        w->cap_t = cap;
    }
    w->t[w->n_t].bytes = bytes;
    w->t[w->n_t].offset = w->data_bytes;
    w->n_t++;
    w->data_bytes += td_round_up(bytes, GGUF_ALIGN);
}

static int put(GgufWriter *w, const void *p, size_t n, char *err, size_t err_len)
{
    if (n && fwrite(p, 1, n, w->f) != n) {
        snprintf(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

static int put_zeros(GgufWriter *w, size_t n, char *err, size_t err_len)
{
    static const unsigned char z[GGUF_ALIGN];
    return put(w, z, n, err, err_len);
}

int gguf_begin_data(GgufWriter *w, char *err, size_t err_len)
{
    arr_closed(w);
    Buf h = { 0 };
    put_u32(&h, GGUF_MAGIC);
    put_u32(&h, GGUF_VERSION);
    put_u64(&h, w->n_t);
    put_u64(&h, w->n_kv);
    size_t head = h.n + w->kv.n + w->info.n;
    int rc = put(w, h.p, h.n, err, err_len) || put(w, w->kv.p, w->kv.n, err, err_len) ||
             put(w, w->info.p, w->info.n, err, err_len) ||
             put_zeros(w, td_round_up(head, GGUF_ALIGN) - head, err, err_len) ? -1 : 0;
    td_free(h.p);
    w->began = true;
    w->cur = 0;
    w->cur_done = 0;
    return rc;
}

int gguf_write_tensor(GgufWriter *w, const void *data, size_t n, char *err, size_t err_len)
{
    TD_CHECK(w->began, "gguf: tensor data before gguf_begin_data");
    const unsigned char *p = data;
    while (n > 0) {
        TD_CHECK(w->cur < w->n_t, "gguf: more tensor data than the %zu tensors declared", w->n_t);
        const TensorSlot *s = &w->t[w->cur];
        size_t take = (size_t)td_min(n, s->bytes - w->cur_done);
        if (put(w, p, take, err, err_len)) return -1;
        p += take;
        n -= take;
        w->cur_done += take;
        if (w->cur_done == s->bytes) {
            if (put_zeros(w, td_round_up(s->bytes, GGUF_ALIGN) - s->bytes, err, err_len)) return -1;
            w->cur++;
            w->cur_done = 0;
        }
    }
    /* zero-byte tensors complete at once */
    while (w->cur < w->n_t && w->t[w->cur].bytes == 0) w->cur++;
    return 0;
}

static void writer_free(GgufWriter *w)
{
    td_free(w->kv.p);
    td_free(w->info.p);
    td_free(w->t);
    td_free(w->path);
    td_free(w->tmp);
    td_free(w);
}

int gguf_close(GgufWriter *w, char *err, size_t err_len)
{
    int rc = 0;
    if (!w->began || w->cur != w->n_t) {
        snprintf(err, err_len, "%s: %zu of %zu tensors written", w->tmp, w->began ? w->cur : 0, w->n_t);
        rc = -1;
    }
    if (!rc && (fflush(w->f) || fsync(fileno(w->f)))) {
        snprintf(err, err_len, "%s: flush failed: %s", w->tmp, strerror(errno));
        rc = -1;
    }
    if (fclose(w->f) && !rc) {
        snprintf(err, err_len, "%s: close failed: %s", w->tmp, strerror(errno));
        rc = -1;
    }
    if (!rc && rename(w->tmp, w->path)) {
        snprintf(err, err_len, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
        rc = -1;
    }
    if (rc) unlink(w->tmp);
    writer_free(w);
    return rc;
}

void gguf_abort(GgufWriter *w)
{
    if (!w) return;
    fclose(w->f);
    unlink(w->tmp);
    writer_free(w);
}

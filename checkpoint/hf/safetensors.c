/* checkpoint/hf/safetensors.c - the safetensors reader (safetensors.h;
 * rules and messages: docs/import.md).
 *
 * Open is parse, then validate, then publish:
 *   1. map the file (or take the buffer); the 8-byte length N must satisfy
 *      N <= ST_MAX_HEADER and 8 + N <= file size;
 *   2. the header must be UTF-8, and one JSON object (cJSON) followed only
 *      by whitespace (the reference pads it with spaces to a multiple of 8);
 *   3. each entry: "__metadata__" (string -> string) or a tensor
 *      {dtype, shape, data_offsets}; numbers must be integers in [0, 2^53)
 *      (cJSON holds them as doubles, exact below 2^53), numel and its byte
 *      size are overflow-checked;
 *   4. sorted by (begin, end) as the reference sorts them, each tensor must
 *      start where the previous one ended (the first at 0), end inside the
 *      data section, and hold exactly numel x element size bytes; the last
 *      one must end at the end of the file;
 *   5. names sorted; a repeated name is refused.
 * A sharded set opens every file of the index this way, then cross-checks
 * the weight_map against what the files hold.
 *
 * Reads walk the requested box as runs of contiguous elements (trailing
 * dimensions taken whole are merged into one run) and convert each run; a
 * run whose source is not aligned for its element type is first copied
 * into an aligned scratch block.
 */
#include "checkpoint/hf/safetensors.h"
#include "core/common.h"
#include "core/dtype.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

#define JSON_INT_MAX 9007199254740992.0   /* 2^53: cJSON doubles are exact below it */

static const struct { const char *name; size_t size; } DTYPES[ST_N_DTYPES] = {
    [ST_BOOL] = { "BOOL", 1 },       [ST_U8] = { "U8", 1 },           [ST_I8] = { "I8", 1 },
    [ST_F8_E5M2] = { "F8_E5M2", 1 }, [ST_F8_E4M3] = { "F8_E4M3", 1 }, [ST_F8_E8M0] = { "F8_E8M0", 1 },
    [ST_I16] = { "I16", 2 },         [ST_U16] = { "U16", 2 },         [ST_F16] = { "F16", 2 },
    [ST_BF16] = { "BF16", 2 },       [ST_I32] = { "I32", 4 },         [ST_U32] = { "U32", 4 },
    [ST_F32] = { "F32", 4 },         [ST_F64] = { "F64", 8 },         [ST_I64] = { "I64", 8 },
    [ST_U64] = { "U64", 8 },         [ST_C64] = { "C64", 8 },
};

const char *st_dtype_name(StDtype t) { return (unsigned)t < ST_N_DTYPES ? DTYPES[t].name : "?"; }
size_t st_dtype_size(StDtype t) { return (unsigned)t < ST_N_DTYPES ? DTYPES[t].size : 0; }

int st_dtype_parse(const char *s, StDtype *t)
{
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(s, DTYPES[i].name)) {
            *t = (StDtype)i;
            return 0;
        }
    return -1;
}

bool st_dtype_to_f32(StDtype t) { return t == ST_F32 || t == ST_F16 || t == ST_BF16 || t == ST_F8_E4M3; }

/* ---------------------------------------------------------------- messages */

static int fail(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A name as it may appear in a one-line message: printable ASCII kept,
 * everything else as \xNN, cut at about 100 characters. */
typedef struct { char s[128]; } Quoted;
static Quoted quoted(const char *name)
{
    Quoted q;
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)name; *p && o + 8 < sizeof q.s; p++) {
        if (o >= 100) {
            memcpy(q.s + o, "...", 3);
            o += 3;
            break;
        }
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') q.s[o++] = (char)*p;
        else o += (size_t)snprintf(q.s + o, sizeof q.s - o, "\\x%02x", *p);
    }
    q.s[o] = 0;
    return q;
}
#define Q(name) (quoted(name).s)

/* "[2, 3, 4]" */
typedef struct { char s[ST_MAX_DIMS * 22 + 4]; } ShapeStr;
static ShapeStr shape_str(const uint64_t *shape, int ndim)
{
    ShapeStr r;
    size_t o = 0;
    r.s[o++] = '[';
    for (int d = 0; d < ndim; d++)
        o += (size_t)snprintf(r.s + o, sizeof r.s - o, d ? ", %llu" : "%llu", (unsigned long long)shape[d]);
    snprintf(r.s + o, sizeof r.s - o, "]");
    return r;
}

/* ---------------------------------------------------------------- header parsing */

/* Well-formed UTF-8 as Rust's str::from_utf8 (and RFC 3629) define it: no
 * overlong forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xbf;    /* allowed range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) len = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;     /* overlong */
            if (c == 0xed) hi = 0x9f;     /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;     /* overlong */
            if (c == 0xf4) hi = 0x8f;     /* > U+10FFFF */
        } else return false;
        if (n - i < len) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80) return false;
        i += len;
    }
    return true;
}

/* A JSON number that is an integer in [0, 2^53). */
static bool json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double x = v->valuedouble;
    if (!(x >= 0.0 && x < JSON_INT_MAX) || x != (double)(uint64_t)x) return false;
    *out = (uint64_t)x;
    return true;
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* Fills t from one header entry (everything but data, aligned, file). */
static int parse_tensor(StTensor *t, const cJSON *e, const char *path, char *err, size_t err_len)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return fail(err, err_len, "%s: tensor '%s': header entry is not an object", path, Q(name));
    const cJSON *dt = NULL, *sh = NULL, *off = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = !strcmp(c->string, "dtype") ? &dt : !strcmp(c->string, "shape") ? &sh
                           : !strcmp(c->string, "data_offsets") ? &off : NULL;
        if (!slot) continue;    /* the reference ignores unknown fields */
        if (*slot) return fail(err, err_len, "%s: tensor '%s': '%s' given twice", path, Q(name), c->string);
        *slot = c;
    }
    if (!dt || !sh || !off)
        return fail(err, err_len, "%s: tensor '%s': missing '%s'", path, Q(name),
                    !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!cJSON_IsString(dt)) return fail(err, err_len, "%s: tensor '%s': dtype is not a string", path, Q(name));
    if (st_dtype_parse(dt->valuestring, &t->dtype) != 0) {
        const char *s = dt->valuestring;
        if (!strcmp(s, "F4") || !strcmp(s, "F6_E2M3") || !strcmp(s, "F6_E3M2"))
            return fail(err, err_len, "%s: tensor '%s': dtype %s (sub-byte) is not supported", path, Q(name), s);
        return fail(err, err_len, "%s: tensor '%s': unknown dtype '%s'", path, Q(name), Q(s));
    }
    if (!cJSON_IsArray(sh)) return fail(err, err_len, "%s: tensor '%s': shape is not an array", path, Q(name));
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return fail(err, err_len, "%s: tensor '%s': shape has %d dimensions, more than %d", path, Q(name), nd,
                    ST_MAX_DIMS);
    t->ndim = nd;
    t->numel = 1;
    int d = 0;
    for (const cJSON *c = sh->child; c; c = c->next, d++) {
        if (!json_u64(c, &t->shape[d]))
            return fail(err, err_len, "%s: tensor '%s': shape[%d] is not an integer in [0, 2^53)", path, Q(name), d);
        if (!mul_ok(t->numel, t->shape[d], &t->numel))   /* the dimensions read so far */
            return fail(err, err_len, "%s: tensor '%s': shape %s%s overflows 64 bits", path, Q(name),
                        shape_str(t->shape, d + 1).s, d + 1 < nd ? " (and more)" : "");
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_u64(off->child, &t->begin) ||
        !json_u64(off->child->next, &t->end))
        return fail(err, err_len, "%s: tensor '%s': data_offsets is not [begin, end] of integers in [0, 2^53)", path,
                    Q(name));
    uint64_t bytes;
    if (!mul_ok(t->numel, DTYPES[t->dtype].size, &bytes))
        return fail(err, err_len, "%s: tensor '%s': shape %s of %s overflows 64 bits", path, Q(name),
                    shape_str(t->shape, nd).s, DTYPES[t->dtype].name);
    if (t->end < t->begin)
        return fail(err, err_len, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path, Q(name),
                    (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != bytes)
        return fail(err, err_len, "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                    path, Q(name), shape_str(t->shape, nd).s, DTYPES[t->dtype].name, (unsigned long long)bytes,
                    (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)(t->end - t->begin));
    return 0;
}

typedef struct { char *key, *value; } MetaPair;
static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const MetaPair *)a)->key, ((const MetaPair *)b)->key);
}

/* __metadata__ -> f->meta_key / meta_value, sorted by key (a sort, not a
 * pairwise scan, finds repeated keys: the header may hold millions). */
static int parse_metadata(StFile *f, const cJSON *m, char *err, size_t err_len)
{
    if (!cJSON_IsObject(m)) return fail(err, err_len, "%s: __metadata__ is not an object", f->path);
    size_t n = 0;
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return fail(err, err_len, "%s: __metadata__ must map strings to strings ('%s' is not a string)", f->path,
                        Q(c->string));
        n++;
    }
    MetaPair *mp = td_malloc((n + 1) * sizeof *mp);
    size_t k = 0;
    for (const cJSON *c = m->child; c; c = c->next, k++) mp[k] = (MetaPair){ c->string, c->valuestring };
    qsort(mp, n, sizeof *mp, cmp_meta);
    for (k = 1; k < n; k++)
        if (!strcmp(mp[k - 1].key, mp[k].key)) {
            int rc = fail(err, err_len, "%s: __metadata__ key '%s' appears twice", f->path, Q(mp[k].key));
            td_free(mp);
            return rc;
        }
    f->meta_key = td_malloc((n + 1) * sizeof(char *));
    f->meta_value = td_malloc((n + 1) * sizeof(char *));
    for (k = 0; k < n; k++) {
        f->meta_key[k] = td_strdup(mp[k].key);
        f->meta_value[k] = td_strdup(mp[k].value);
    }
    f->n_meta = n;
    td_free(mp);
    return 0;
}

static int cmp_offsets(const void *a, const void *b)
{
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}

/* Step 4 of the file comment: contiguity and coverage, in offset order. */
static int check_layout(StTensor *ts, size_t n, size_t data_len, const char *path, char *err, size_t err_len)
{
    StTensor **order = td_malloc((n + 1) * sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = &ts[i];
    qsort(order, n, sizeof *order, cmp_offsets);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const StTensor *t = order[i], *prev = i ? order[i - 1] : NULL;
        if (t->end > data_len)
            rc = fail(err, err_len,
                      "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the %zu-byte data section "
                      "(file truncated?)",
                      path, Q(t->name), (unsigned long long)t->begin, (unsigned long long)t->end, data_len);
        else if (t->begin < at)
            rc = fail(err, err_len, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]", path,
                      Q(t->name), (unsigned long long)t->begin, (unsigned long long)t->end, Q(prev->name),
                      (unsigned long long)prev->begin, (unsigned long long)prev->end);
        else if (t->begin > at && prev)
            rc = fail(err, err_len,
                      "%s: tensor '%s': data_offsets [%llu, %llu] leave a gap of %llu bytes after tensor '%s' "
                      "(offsets must be contiguous)",
                      path, Q(t->name), (unsigned long long)t->begin, (unsigned long long)t->end,
                      (unsigned long long)(t->begin - at), Q(prev->name));
        else if (t->begin > at)
            rc = fail(err, err_len,
                      "%s: tensor '%s': data_offsets [%llu, %llu]: the first tensor must begin at 0 (offsets must "
                      "be contiguous)",
                      path, Q(t->name), (unsigned long long)t->begin, (unsigned long long)t->end);
        at = t->end;
    }
    if (rc == 0 && at != data_len)
        rc = fail(err, err_len,
                  "%s: the tensors cover %llu bytes of the %zu-byte data section: %llu bytes at the end belong to "
                  "no tensor",
                  path, (unsigned long long)at, data_len, (unsigned long long)(data_len - at));
    td_free(order);
    return rc;
}

static void file_free(StFile *f)
{
    for (size_t k = 0; k < f->n_meta; k++) {
        td_free(f->meta_key[k]);
        td_free(f->meta_value[k]);
    }
    td_free(f->meta_key);
    td_free(f->meta_value);
    if (f->mapped && f->map) munmap((void *)f->map, f->size);
    td_free(f->path);
    memset(f, 0, sizeof *f);
}

static void tensors_free(StTensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++) td_free(ts[i].name);
    td_free(ts);
}

/* Parses and validates file f (f->map, f->size, f->path set).  On success
 * *out holds its tensors (td_malloc'ed, sorted by name), their data
 * pointers set, file index fi. */
static int parse_file(StFile *f, int fi, StTensor **out, size_t *n_out, char *err, size_t err_len)
{
    *out = NULL;
    *n_out = 0;
    if (f->size < 8)
        return fail(err, err_len, "%s: %zu bytes: too short for the 8-byte header length (file truncated?)", f->path,
                    f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->map[i];
    if (n > ST_MAX_HEADER)
        return fail(err, err_len, "%s: header length %llu exceeds the limit of %u bytes (not a safetensors file?)",
                    f->path, (unsigned long long)n, ST_MAX_HEADER);
    if (n > f->size - 8)
        return fail(err, err_len, "%s: header length %llu runs past the end of the %zu-byte file (file truncated?)",
                    f->path, (unsigned long long)n, f->size);
    f->header_len = (size_t)n;
    const unsigned char *hdr = f->map + 8;
    if (!utf8_valid(hdr, f->header_len)) return fail(err, err_len, "%s: header is not valid UTF-8", f->path);
    /* cJSON reads a bounded buffer, but a NUL-terminated copy keeps every
     * path of it inside our allocation */
    char *text = td_malloc(f->header_len + 1);
    memcpy(text, hdr, f->header_len);
    text[f->header_len] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, f->header_len, &end, 0);
    int rc = 0;
    if (!root) {
        /* cJSON leaves the error position in end (its global error
         * pointer is shared between threads) */
        rc = fail(err, err_len, "%s: header is not JSON (error near byte %zu)", f->path,
                  (size_t)(end && end >= text ? end - text : 0));
        td_free(text);
        return rc;
    }
    for (const char *p = end; p < text + f->header_len && rc == 0; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            rc = fail(err, err_len, "%s: header has bytes after its JSON object (at byte %zu)", f->path,
                      (size_t)(p - text));
    if (rc == 0 && !cJSON_IsObject(root)) rc = fail(err, err_len, "%s: header is not a JSON object", f->path);
    /* the array grows as entries pass validation: a huge header of junk
     * entries fails at its first one without a huge allocation */
    size_t cap = 16, nt = 0;
    StTensor *ts = td_calloc(cap * sizeof *ts);
    bool seen_meta = false;
    for (const cJSON *e = rc == 0 ? root->child : NULL; e && rc == 0; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (seen_meta) rc = fail(err, err_len, "%s: __metadata__ appears twice", f->path);
            else rc = parse_metadata(f, e, err, err_len);
            seen_meta = true;
            continue;
        }
        if (nt == cap) {
            StTensor *grown = td_calloc(2 * cap * sizeof *ts);
            memcpy(grown, ts, cap * sizeof *ts);
            td_free(ts);
            ts = grown;
            cap *= 2;
        }
        StTensor *t = &ts[nt];
        rc = parse_tensor(t, e, f->path, err, err_len);
        t->name = td_strdup(e->string);
        nt++;
    }
    cJSON_Delete(root);
    td_free(text);
    size_t data_len = f->size - 8 - f->header_len;
    if (rc == 0) rc = check_layout(ts, nt, data_len, f->path, err, err_len);
    if (rc == 0) {
        qsort(ts, nt, sizeof *ts, cmp_names);
        for (size_t i = 1; i < nt && rc == 0; i++)
            if (!strcmp(ts[i - 1].name, ts[i].name))
                rc = fail(err, err_len, "%s: tensor '%s' appears twice in the header", f->path, Q(ts[i].name));
    }
    if (rc != 0) {
        tensors_free(ts, nt);
        return rc;
    }
    for (size_t i = 0; i < nt; i++) {
        StTensor *t = &ts[i];
        t->data = f->map + 8 + f->header_len + t->begin;
        t->nbytes = (size_t)(t->end - t->begin);
        t->aligned = (uintptr_t)t->data % DTYPES[t->dtype].size == 0;
        t->file = fi;
    }
    *out = ts;
    *n_out = nt;
    return 0;
}

/* ---------------------------------------------------------------- opening */

static int map_file(StFile *f, const char *path, char *err, size_t err_len)
{
    f->path = td_strdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return fail(err, err_len, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size >= 8) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(err, err_len, "%s: cannot map %zu bytes: %s", path, f->size, strerror(e));
        }
        f->map = m;
        f->mapped = true;
    } else {
        /* too short to map usefully: parse_file refuses it by its size */
        static const unsigned char nothing[8];
        f->map = nothing;
    }
    close(fd);
    return 0;
}

void st_close(StCheckpoint *st)
{
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) file_free(&st->files[i]);
    td_free(st->files);
    tensors_free(st->tensors, st->n_tensors);
    memset(st, 0, sizeof *st);
}

static int open_single(StCheckpoint *st, StFile *f, char *err, size_t err_len)
{
    st->n_files = 1;
    st->files = f;
    int rc = parse_file(f, 0, &st->tensors, &st->n_tensors, err, err_len);
    if (rc != 0) st_close(st);
    return rc;
}

int st_open_buffer(StCheckpoint *st, const void *buf, size_t len, const char *label, char *err, size_t err_len)
{
    memset(st, 0, sizeof *st);
    StFile *f = td_calloc(sizeof *f);
    f->path = td_strdup(label);
    f->map = buf;
    f->size = len;
    return open_single(st, f, err, err_len);
}

static bool is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct { const char *tensor, *file; } MapEntry;
static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const MapEntry *)a)->tensor, ((const MapEntry *)b)->tensor);
}

/* A weight_map value must be a plain file name inside the directory. */
static bool plain_name(const char *s) { return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, ".."); }

/* Cross-checks the weight_map (sorted entries) against the tensors of
 * every file (st->tensors, sorted by name). */
static int check_weight_map(const StCheckpoint *st, const MapEntry *me, size_t nm, const char *ipath, char *err,
                            size_t err_len)
{
    size_t i = 0, j = 0;
    while (i < nm || j < st->n_tensors) {
        int c = i == nm ? 1 : j == st->n_tensors ? -1 : strcmp(me[i].tensor, st->tensors[j].name);
        if (c < 0)
            return fail(err, err_len, "%s: weight_map puts tensor '%s' in '%s', which does not hold it", ipath,
                        Q(me[i].tensor), Q(me[i].file));
        const StTensor *t = &st->tensors[j];
        const char *tf = strrchr(st->files[t->file].path, '/');
        tf = tf ? tf + 1 : st->files[t->file].path;
        if (c > 0)
            return fail(err, err_len, "%s: tensor '%s' of '%s' is missing from weight_map", ipath, Q(t->name), Q(tf));
        if (strcmp(me[i].file, tf))
            return fail(err, err_len, "%s: weight_map puts tensor '%s' in '%s', but it is in '%s'", ipath,
                        Q(t->name), Q(me[i].file), Q(tf));
        i++;
        j++;
    }
    return 0;
}

/* The parsed model.safetensors.index.json: its weight_map entries sorted by
 * tensor name (pointers into root), and the distinct file names, sorted. */
typedef struct {
    char *text;
    cJSON *root;
    MapEntry *me;
    size_t nm;
    const char **files;
    size_t nf;
} WeightMap;

static void weight_map_free(WeightMap *w)
{
    td_free(w->me);
    td_free(w->files);
    cJSON_Delete(w->root);
    td_free(w->text);
    memset(w, 0, sizeof *w);
}

static int read_index(WeightMap *w, const char *ipath, char *err, size_t err_len)
{
    memset(w, 0, sizeof *w);
    StFile idx = { 0 };
    int rc = map_file(&idx, ipath, err, err_len);
    if (rc == 0) {
        w->text = td_malloc(idx.size + 1);
        if (idx.size) memcpy(w->text, idx.map, idx.size);
        w->text[idx.size] = 0;
    }
    file_free(&idx);
    if (rc != 0) return rc;
    /* the whole file: one JSON value, then only whitespace */
    if (utf8_valid((const unsigned char *)w->text, strlen(w->text))) w->root = cJSON_ParseWithOpts(w->text, NULL, 1);
    const cJSON *wm = w->root ? cJSON_GetObjectItemCaseSensitive(w->root, "weight_map") : NULL;
    if (!cJSON_IsObject(w->root)) return fail(err, err_len, "%s: not a JSON object", ipath);
    if (!cJSON_IsObject(wm)) return fail(err, err_len, "%s: no \"weight_map\" object", ipath);
    size_t cap = (size_t)cJSON_GetArraySize(wm);
    w->me = td_calloc((cap + 1) * sizeof *w->me);
    w->files = td_calloc((cap + 1) * sizeof *w->files);
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!cJSON_IsString(c)) return fail(err, err_len, "%s: weight_map['%s'] is not a file name", ipath, Q(c->string));
        if (!plain_name(c->valuestring))
            return fail(err, err_len, "%s: weight_map['%s'] names '%s', not a file of the directory", ipath,
                        Q(c->string), Q(c->valuestring));
        w->me[w->nm++] = (MapEntry){ c->string, c->valuestring };
        w->files[w->nf++] = c->valuestring;
    }
    if (w->nm == 0) return fail(err, err_len, "%s: weight_map is empty", ipath);
    qsort(w->me, w->nm, sizeof *w->me, cmp_entry);
    for (size_t i = 1; i < w->nm; i++)
        if (!strcmp(w->me[i - 1].tensor, w->me[i].tensor))
            return fail(err, err_len, "%s: weight_map lists tensor '%s' twice", ipath, Q(w->me[i].tensor));
    qsort(w->files, w->nf, sizeof *w->files, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < w->nf; i++)
        if (!u || strcmp(w->files[u - 1], w->files[i])) w->files[u++] = w->files[i];
    w->nf = u;
    return 0;
}

/* Opens and validates every file of the map into st (files, tensors
 * sorted by name); refuses a tensor found in two files. */
static int open_shards(StCheckpoint *st, const char *dir, const char *ipath, const WeightMap *w, char *err,
                       size_t err_len)
{
    st->sharded = true;
    st->files = td_calloc(w->nf * sizeof *st->files);
    StTensor **per = td_calloc(w->nf * sizeof *per);
    size_t *per_n = td_calloc(w->nf * sizeof *per_n), total = 0;
    int rc = 0;
    for (size_t i = 0; i < w->nf && rc == 0; i++) {
        size_t len = strlen(dir) + strlen(w->files[i]) + 2;
        char *p = td_malloc(len);
        snprintf(p, len, "%s/%s", dir, w->files[i]);
        st->n_files = (int)i + 1;
        if (!exists(p)) rc = fail(err, err_len, "%s: weight_map names '%s', which does not exist", ipath, Q(w->files[i]));
        else rc = map_file(&st->files[i], p, err, err_len);
        if (rc == 0) rc = parse_file(&st->files[i], (int)i, &per[i], &per_n[i], err, err_len);
        total += per_n[i];
        td_free(p);
    }
    if (rc == 0) {
        st->tensors = td_malloc((total + 1) * sizeof *st->tensors);
        for (size_t i = 0; i < w->nf; i++) {
            memcpy(st->tensors + st->n_tensors, per[i], per_n[i] * sizeof *per[i]);   /* names move too */
            st->n_tensors += per_n[i];
            td_free(per[i]);
            per[i] = NULL;
            per_n[i] = 0;
        }
        qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_names);
        for (size_t i = 1; i < st->n_tensors && rc == 0; i++)
            if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name))
                rc = fail(err, err_len, "%s: tensor '%s' is in both '%s' and '%s'", ipath, Q(st->tensors[i].name),
                          st->files[st->tensors[i - 1].file].path, st->files[st->tensors[i].file].path);
    }
    for (size_t i = 0; i < w->nf; i++) tensors_free(per[i], per_n[i]);
    td_free(per);
    td_free(per_n);
    return rc;
}

static int open_index(StCheckpoint *st, const char *dir, const char *ipath, char *err, size_t err_len)
{
    WeightMap w;
    int rc = read_index(&w, ipath, err, err_len);
    if (rc == 0) rc = open_shards(st, dir, ipath, &w, err, err_len);
    if (rc == 0) rc = check_weight_map(st, w.me, w.nm, ipath, err, err_len);
    weight_map_free(&w);
    if (rc != 0) st_close(st);
    return rc;
}

static int open_file(StCheckpoint *st, const char *path, char *err, size_t err_len)
{
    StFile *f = td_calloc(sizeof *f);
    int rc = map_file(f, path, err, err_len);
    if (rc == 0) return open_single(st, f, err, err_len);
    file_free(f);
    td_free(f);
    return rc;
}

int st_open(StCheckpoint *st, const char *path, char *err, size_t err_len)
{
    memset(st, 0, sizeof *st);
    size_t len = strlen(path), cap = len + sizeof ST_INDEX_NAME + 2;
    while (len > 1 && path[len - 1] == '/') len--;
    char *dir = td_malloc(cap), *p = td_malloc(cap);
    snprintf(dir, cap, "%.*s", (int)len, path);
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    int rc;
    if (is_dir(dir)) {
        snprintf(p, cap, "%s/%s", dir, ST_SINGLE_NAME);
        if (exists(p)) rc = open_file(st, p, err, err_len);
        else {
            snprintf(p, cap, "%s/%s", dir, ST_INDEX_NAME);
            if (exists(p)) rc = open_index(st, dir, p, err, err_len);
            else rc = fail(err, err_len, "%s: no %s or %s in this directory", dir, ST_SINGLE_NAME, ST_INDEX_NAME);
        }
    } else if (!strcmp(base, ST_INDEX_NAME)) {
        /* the shards live beside the index */
        if (base == dir) snprintf(p, cap, ".");
        else if (base == dir + 1) snprintf(p, cap, "/");
        else snprintf(p, cap, "%.*s", (int)(base - 1 - dir), dir);
        rc = open_index(st, p, dir, err, err_len);
    } else {
        rc = open_file(st, dir, err, err_len);
    }
    td_free(p);
    td_free(dir);
    return rc;
}

const StTensor *st_find(const StCheckpoint *st, const char *name)
{
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->tensors[mid].name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const char *st_metadata(const StCheckpoint *st, int f, const char *key)
{
    if (f < 0 || f >= st->n_files) return NULL;
    const StFile *fl = &st->files[f];
    for (size_t k = 0; k < fl->n_meta; k++)
        if (!strcmp(fl->meta_key[k], key)) return fl->meta_value[k];
    return NULL;
}

/* ---------------------------------------------------------------- reading */

const void *st_tensor_bytes(const StTensor *t, void **copy)
{
    *copy = NULL;
    if (t->aligned) return t->data;
    *copy = td_malloc(t->nbytes ? t->nbytes : 1);
    memcpy(*copy, t->data, t->nbytes);
    return *copy;
}

enum { SCRATCH = 4096 };   /* elements per aligned block of a misaligned run */

/* n elements of type dt at src (any alignment) -> float32 at dst. */
static void convert_run(float *dst, const unsigned char *src, size_t n, StDtype dt)
{
    if (dt == ST_F32) {
        memcpy(dst, src, n * 4);   /* byte copy: no typed read of src */
        return;
    }
    if (dt == ST_F8_E4M3) {
        dtype_f8e4m3_to_f32(dst, src, n);
        return;
    }
    /* 16-bit: convert in place when aligned, else through an aligned block */
    void (*conv)(float *restrict, const uint16_t *restrict, size_t) =
        dt == ST_BF16 ? dtype_bf16_to_f32 : dtype_f16_to_f32;
    if ((uintptr_t)src % 2 == 0) {
        conv(dst, (const uint16_t *)(const void *)src, n);
        return;
    }
    uint16_t block[SCRATCH];
    for (size_t i = 0; i < n; i += SCRATCH) {
        size_t m = td_min(SCRATCH, n - i);
        memcpy(block, src + 2 * i, 2 * m);
        conv(dst + i, block, m);
    }
}

static int check_box(const StTensor *t, const uint64_t *start, const uint64_t *count, char *err, size_t err_len)
{
    for (int d = 0; d < t->ndim; d++)
        if (start[d] > t->shape[d] || count[d] > t->shape[d] - start[d])
            return fail(err, err_len, "tensor '%s': slice at %s of extent %s lies outside its shape %s", Q(t->name),
                        shape_str(start, t->ndim).s, shape_str(count, t->ndim).s, shape_str(t->shape, t->ndim).s);
    return 0;
}

/* Walks the box as contiguous runs: calls run(ctx, element offset in t,
 * element offset in the box, length) in row-major order. */
typedef void (*RunFn)(void *ctx, size_t src_el, size_t dst_el, size_t n);
static void walk_box(const StTensor *t, const uint64_t *start, const uint64_t *count, RunFn run, void *ctx)
{
    int nd = t->ndim;
    for (int d = 0; d < nd; d++)
        if (count[d] == 0) return;
    if (nd == 0) {
        run(ctx, 0, 0, 1);
        return;
    }
    /* dims [inner, nd) are taken whole: one run spans them and count[inner-1] */
    int inner = nd;
    while (inner > 1 && start[inner - 1] == 0 && count[inner - 1] == t->shape[inner - 1]) inner--;
    uint64_t stride[ST_MAX_DIMS];
    stride[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) stride[d] = stride[d + 1] * t->shape[d + 1];
    int rd = inner - 1;                         /* the run's outermost dimension */
    size_t len = (size_t)(count[rd] * stride[rd]);
    uint64_t idx[ST_MAX_DIMS] = { 0 };          /* over dims [0, rd) */
    size_t dst = 0;
    for (;;) {
        uint64_t src = start[rd] * stride[rd];
        for (int d = 0; d < rd; d++) src += (start[d] + idx[d]) * stride[d];
        run(ctx, (size_t)src, dst, len);
        dst += len;
        int d = rd - 1;
        while (d >= 0 && ++idx[d] == count[d]) idx[d--] = 0;
        if (d < 0) break;
    }
}

typedef struct { const StTensor *t; float *out; } F32Ctx;
static void run_f32(void *ctx, size_t src_el, size_t dst_el, size_t n)
{
    F32Ctx *c = ctx;
    size_t es = DTYPES[c->t->dtype].size;
    convert_run(c->out + dst_el, c->t->data + src_el * es, n, c->t->dtype);
}

typedef struct { const StTensor *t; unsigned char *out; } RawCtx;
static void run_raw(void *ctx, size_t src_el, size_t dst_el, size_t n)
{
    RawCtx *c = ctx;
    size_t es = DTYPES[c->t->dtype].size;
    memcpy(c->out + dst_el * es, c->t->data + src_el * es, n * es);
}

int st_read_slice_f32(const StTensor *t, const uint64_t *start, const uint64_t *count, float *out, char *err,
                      size_t err_len)
{
    if (!st_dtype_to_f32(t->dtype))
        return fail(err, err_len, "tensor '%s': dtype %s does not convert to float32", Q(t->name),
                    DTYPES[t->dtype].name);
    if (check_box(t, start, count, err, err_len) != 0) return -1;
    F32Ctx c = { t, out };
    walk_box(t, start, count, run_f32, &c);
    return 0;
}

int st_read_slice_raw(const StTensor *t, const uint64_t *start, const uint64_t *count, void *out, char *err,
                      size_t err_len)
{
    if (check_box(t, start, count, err, err_len) != 0) return -1;
    RawCtx c = { t, out };
    walk_box(t, start, count, run_raw, &c);
    return 0;
}

int st_read_f32(const StTensor *t, float *out, size_t n, char *err, size_t err_len)
{
    if (n != t->numel)
        return fail(err, err_len, "tensor '%s': %llu elements, not the %zu asked for", Q(t->name),
                    (unsigned long long)t->numel, n);
    uint64_t start[ST_MAX_DIMS] = { 0 };
    return st_read_slice_f32(t, start, t->shape, out, err, err_len);
}

int st_read_range_f32(const StTensor *t, int dim, uint64_t begin, uint64_t end, float *out, char *err,
                      size_t err_len)
{
    if (dim < 0 || dim >= t->ndim || end < begin)
        return fail(err, err_len, "tensor '%s': no range [%llu, %llu) along dimension %d of shape %s", Q(t->name),
                    (unsigned long long)begin, (unsigned long long)end, dim, shape_str(t->shape, t->ndim).s);
    uint64_t start[ST_MAX_DIMS] = { 0 }, count[ST_MAX_DIMS];
    memcpy(count, t->shape, sizeof count);
    start[dim] = begin;
    count[dim] = end - begin;
    return st_read_slice_f32(t, start, count, out, err, err_len);
}

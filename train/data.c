/* train/data.c - token files, `tandem data prepare` and the loader (data.h). */
#include "train/data.h"
#include "core/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = { 'T', 'N', 'D', 'M', 'T', 'O', 'K', '1' };

static uint32_t rd32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)v); wr32(p + 4, (uint32_t)(v >> 32)); }

int tokfile_open(TokenFile *f, const char *path, char *err, size_t err_len)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open token file: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < DATA_HEADER_BYTES) {
        close(fd);
        snprintf(err, err_len, "%s: not a token file (shorter than its %d-byte header)", path, DATA_HEADER_BYTES);
        return -1;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
        return -1;
    }
    const uint8_t *h = m;
    f->map = m;
    f->map_len = (size_t)st.st_size;
    const char *why = NULL;
    if (memcmp(h, MAGIC, 8)) why = "bad magic (not made by `tandem data prepare`)";
    else if (rd32(h + 8) != 1) why = "unsupported version";
    else {
        f->width = rd32(h + 12);
        f->count = rd64(h + 16);
        f->n_val = rd64(h + 24);
        f->vocab = rd32(h + 32);
        if (f->width != 1 && f->width != 2 && f->width != 4) why = "bad token width";
        else if (f->count > (f->map_len - DATA_HEADER_BYTES) / f->width) why = "truncated (fewer tokens than its header says)";
        else if (f->n_val > f->count) why = "validation split larger than the file";
        else if (f->count - f->n_val < 2) why = "fewer than 2 training tokens";
        else {
            uint64_t end = DATA_HEADER_BYTES + f->count * f->width;
            f->tok_json_len = rd32(h + 36);
            f->tok_config_len = rd32(h + 40);
            if ((uint64_t)f->tok_json_len + f->tok_config_len > f->map_len - end)
                why = "truncated (its tokenizer files are cut)";
            else if (f->tok_config_len && !f->tok_json_len)
                why = "bad tokenizer section (tokenizer_config.json without tokenizer.json)";
            else {
                if (f->tok_json_len) f->tok_json = (const char *)h + end;
                if (f->tok_config_len) f->tok_config = (const char *)h + end + f->tok_json_len;
            }
        }
    }
    if (why) {
        snprintf(err, err_len, "%s: %s", path, why);
        tokfile_close(f);
        return -1;
    }
    f->tokens = h + DATA_HEADER_BYTES;
    return 0;
}

void tokfile_close(TokenFile *f)
{
    if (f->map) munmap((void *)f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

TokenStream tokfile_train(const TokenFile *f) { return (TokenStream){ f, 0, f->count - f->n_val }; }
TokenStream tokfile_val(const TokenFile *f) { return (TokenStream){ f, f->count - f->n_val, f->n_val }; }

/* ---------------------------------------------------------------- prepare */

typedef struct { char **v; int n, cap; } PathList;

static void list_add(PathList *l, const char *p)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **nv = td_malloc((size_t)cap * sizeof(char *));
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof(char *));
        td_free(l->v);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = td_strdup(p);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int collect(PathList *out, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        td_error("data prepare: input %s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode)) {
        list_add(out, path);
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        td_error("data prepare: input %s is neither a file nor a directory", path);
        return -1;
    }
    DIR *d = opendir(path);
    if (!d) {
        td_error("data prepare: cannot read directory %s: %s", path, strerror(errno));
        return -1;
    }
    PathList names = { 0 };
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat")) continue;
        char *full = td_sprintf("%s/%s", path, e->d_name);
        struct stat ls;
        if (lstat(full, &ls) == 0 && S_ISREG(ls.st_mode)) list_add(&names, full);  /* skip symlinks, subdirs */
        td_free(full);
    }
    closedir(d);
    if (names.n) qsort(names.v, (size_t)names.n, sizeof(char *), cmp_str);
    for (int i = 0; i < names.n; i++) {
        list_add(out, names.v[i]);
        td_free(names.v[i]);
    }
    td_free(names.v);
    return 0;
}

static int read_all(const char *path, uint8_t **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        td_error("data prepare: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        td_error("data prepare: cannot size %s: %s", path, strerror(errno));
        fclose(f);
        return -1;
    }
    *buf = td_malloc(n > 0 ? (size_t)n : 1);
    *len = n > 0 ? fread(*buf, 1, (size_t)n, f) : 0;
    bool short_read = *len != (size_t)n || ferror(f);   /* a read error must not cut the data */
    fclose(f);
    if (short_read) {
        td_error("data prepare: reading %s gave %zu of its %ld bytes", path, *len, n);
        return -1;
    }
    return 0;
}

uint32_t data_token_width(int64_t V) { return V <= 256 ? 1 : V <= 65536 ? 2 : 4; }

/* The tokens of one input file: its bytes, or the tokenizer's ids. */
typedef struct {
    uint8_t *bytes;
    TokIds ids;
    size_t n;
} FileTokens;

static int file_tokens(FileTokens *ft, const char *path, const Tokenizer *tok, bool add_special)
{
    memset(ft, 0, sizeof *ft);
    size_t len;
    if (read_all(path, &ft->bytes, &len)) return -1;
    if (!tok) {
        ft->n = len;
        return 0;
    }
    char err[256];
    int rc = tok_encode(tok, (const char *)ft->bytes, len, add_special, &ft->ids, err, sizeof err);
    td_free(ft->bytes);
    ft->bytes = NULL;
    if (rc) {
        td_error("data prepare: %s: %s", path, err);
        return -1;
    }
    ft->n = ft->ids.n;
    return 0;
}

/* Writes tokens [a, b) of ft at `width` bytes each. */
static bool write_tokens(FILE *f, const FileTokens *ft, size_t a, size_t b, uint32_t width)
{
    if (ft->bytes) return fwrite(ft->bytes + a, 1, b - a, f) == b - a;
    uint8_t buf[4096];
    size_t k = 0;
    for (size_t i = a; i < b; i++) {
        uint32_t v = (uint32_t)ft->ids.ids[i];
        for (uint32_t j = 0; j < width; j++) buf[k++] = (uint8_t)(v >> (8 * j));
        if (k + 4 > sizeof buf) {
            if (fwrite(buf, 1, k, f) != k) return false;
            k = 0;
        }
    }
    return fwrite(buf, 1, k, f) == k;
}

int data_prepare(const char *const *inputs, int n_inputs, const char *output, double val_fraction,
                 const Tokenizer *tok, bool add_special)
{
    if (n_inputs < 1) {
        td_error("data prepare: no --input given");
        return -1;
    }
    if (!(val_fraction >= 0 && val_fraction < 1)) {
        td_error("data prepare: --val-fraction must be in [0, 1) (got %g)", val_fraction);
        return -1;
    }
    PathList files = { 0 };
    int rc = 0;
    for (int i = 0; i < n_inputs && rc == 0; i++) rc = collect(&files, inputs[i]);
    /* two passes: train parts of every file, then validation parts */
    FileTokens *ft = td_calloc((size_t)(files.n + 1) * sizeof(FileTokens));
    uint64_t total = 0, n_val = 0;
    for (int i = 0; i < files.n && rc == 0; i++) {
        rc = file_tokens(&ft[i], files.v[i], tok, add_special);
        total += ft[i].n;
        n_val += (uint64_t)((double)ft[i].n * val_fraction);
    }
    if (tok && tok_is_byte_level(tok)) tok = NULL;   /* its ids are the bytes */
    int64_t V = tok ? tok_vocab_size(tok) : 256;
    uint32_t width = data_token_width(V);
    size_t tj_len = 0, tc_len = 0;
    const char *tj = tok ? tok_json_text(tok, &tj_len) : NULL, *tcfg = tok ? tok_config_text(tok, &tc_len) : NULL;
    if (rc == 0 && (tj_len > UINT32_MAX || tc_len > UINT32_MAX)) {
        td_error("data prepare: the tokenizer's files are larger than 4 GiB");
        rc = -1;
    }
    if (rc == 0 && total < 2) {
        td_error("data prepare: the inputs hold %llu tokens; nothing to train on", (unsigned long long)total);
        rc = -1;
    }
    if (rc == 0 && total - n_val < 2) {
        td_error("data prepare: --val-fraction %g leaves fewer than 2 training tokens", val_fraction);
        rc = -1;
    }
    if (rc == 0) {
        char *tmp = td_sprintf("%s.tmp", output);
        FILE *f = fopen(tmp, "wb");
        if (!f) {
            td_error("data prepare: cannot write %s: %s", tmp, strerror(errno));
            rc = -1;
        } else {
            uint8_t h[DATA_HEADER_BYTES] = { 0 };
            memcpy(h, MAGIC, 8);
            wr32(h + 8, 1);
            wr32(h + 12, width);
            wr64(h + 16, total);
            wr64(h + 24, n_val);
            wr32(h + 32, (uint32_t)V);
            wr32(h + 36, (uint32_t)(tj ? tj_len : 0));
            wr32(h + 40, (uint32_t)(tcfg ? tc_len : 0));
            bool ok = fwrite(h, 1, sizeof h, f) == sizeof h;
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < files.n; i++) {
                    size_t nv = (size_t)((double)ft[i].n * val_fraction), nt = ft[i].n - nv;
                    ok &= pass == 0 ? write_tokens(f, &ft[i], 0, nt, width) : write_tokens(f, &ft[i], nt, ft[i].n, width);
                }
            if (tj) ok &= fwrite(tj, 1, tj_len, f) == tj_len;
            if (tcfg) ok &= fwrite(tcfg, 1, tc_len, f) == tc_len;
            ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
            ok &= fclose(f) == 0;
            if (!ok || rename(tmp, output) != 0) {
                td_error("data prepare: writing %s failed: %s", output, strerror(errno));
                unlink(tmp);
                rc = -1;
            } else {
                td_info("data prepare: %d files, %llu tokens (%llu train, %llu validation; V = %lld, %u-byte tokens) -> %s",
                        files.n, (unsigned long long)total, (unsigned long long)(total - n_val),
                        (unsigned long long)n_val, (long long)V, width, output);
            }
        }
        td_free(tmp);
    }
    for (int i = 0; i < files.n; i++) {
        td_free(ft[i].bytes);
        tok_ids_free(&ft[i].ids);
        td_free(files.v[i]);
    }
    td_free(ft);
    td_free(files.v);
    return rc;
}

/* ---------------------------------------------------------------- loader */

void loader_init(Loader *l, TokenStream s, size_t B, size_t T, size_t dp, size_t dp_rank,
                 bool shuffle, uint64_t seed)
{
    memset(l, 0, sizeof *l);
    l->s = s;
    l->B = B;
    l->T = T;
    l->row0 = dp_rank * B / dp;
    l->rows = (dp_rank + 1) * B / dp - l->row0;
    l->shuffle = shuffle;
    rng_seed(&l->rng, seed ^ 0xda7a5eedULL);
}

void loader_next(Loader *l, int32_t *ids, int32_t *targets)
{
    const uint64_t n = l->s.len, T = l->T;
    for (size_t r = 0; r < l->B; r++) {
        uint64_t start;
        if (l->shuffle) start = rng_below(&l->rng, n);   /* every rank draws all B */
        else start = ((((uint64_t)l->cursor * l->B) + r) * T) % n;
        if (r < l->row0 || r >= l->row0 + l->rows) continue;
        int32_t *x = ids + (r - l->row0) * T, *y = targets + (r - l->row0) * T;
        for (uint64_t j = 0; j < T; j++) {
            x[j] = tokfile_get(l->s.f, l->s.begin + (start + j) % n);
            y[j] = tokfile_get(l->s.f, l->s.begin + (start + j + 1) % n);
        }
    }
    l->cursor++;
}

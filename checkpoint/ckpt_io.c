/* checkpoint/ckpt_io.c - chunk-level writes and reads on the thread pool,
 * HDF5's Fletcher32 (ckpt_io.h).
 *
 * Fletcher32 as HDF5 computes it (H5_checksum_fletcher32): the data is a
 * sequence of n big-endian 16-bit words w_i (an odd last byte is the high
 * byte of a last word); sum1 = sum w_i, sum2 = sum of the running sum1
 * after each word = sum (n - i) w_i, both folded with x = (x & 0xffff) +
 * (x >> 16).  Folding keeps a value congruent mod 65535 and never turns a
 * positive value into 0, so the stored 16-bit sums are 0 when every word
 * is 0, and otherwise the residue mod 65535 written as 1..65535.  The
 * checksum is (sum2 << 16) | sum1.  Computing the two sums per block of
 * 128 words (a = sum w_j, c = sum j w_j; the block adds k * sum1 + k a - c
 * to sum2) lets the compiler vectorize the inner loop.
 */
#include "checkpoint/ckpt_io.h"
#include "checkpoint/ckpt.h"
#include "core/common.h"
#include "core/dtype.h"
#include "core/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define FL_BLOCK 128   /* words per block: j * w_j sums stay below 2^32 */

uint32_t ckpt_fletcher32(const void *data, size_t len)
{
    const uint8_t *p = data;
    size_t nw = len / 2;
    uint64_t s1 = 0, s2 = 0;
    bool any = false;
    size_t i = 0;
    for (; i + FL_BLOCK <= nw; i += FL_BLOCK) {
        const uint8_t *q = p + 2 * i;
        uint32_t a = 0, c = 0;
        for (uint32_t j = 0; j < FL_BLOCK; j++) {
            uint16_t v;
            memcpy(&v, q + 2 * j, 2);
#if CKPT_IO_NATIVE
            uint32_t w = __builtin_bswap16(v);   /* big-endian words */
#else
            uint32_t w = v;
#endif
            a += w;
            c += j * w;
        }
        s2 = (s2 + FL_BLOCK * s1 + (uint64_t)FL_BLOCK * a - c) % 65535;
        s1 = (s1 + a) % 65535;
        any |= a != 0;
    }
    for (; i < nw; i++) {
        uint32_t w = ((uint32_t)p[2 * i] << 8) | p[2 * i + 1];
        s1 = (s1 + w) % 65535;
        s2 = (s2 + s1) % 65535;
        any |= w != 0;
    }
    if (len & 1) {
        uint32_t w = (uint32_t)p[len - 1] << 8;
        s1 = (s1 + w) % 65535;
        s2 = (s2 + s1) % 65535;
        any |= w != 0;
    }
    if (!any) return 0;
    uint32_t f1 = s1 ? (uint32_t)s1 : 65535u, f2 = s2 ? (uint32_t)s2 : 65535u;
    return (f2 << 16) | f1;
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The stored checksum matches the data (HDF5 also accepts the byte-swapped
 * form written by HDF5 < 1.6.3 on little-endian machines). */
static bool checksum_ok(const void *data, size_t n, const unsigned char *stored)
{
    uint32_t want = get_le32(stored), got = ckpt_fletcher32(data, n);
    uint32_t rev = ((got & 0x00ff00ffu) << 8) | ((got >> 8) & 0x00ff00ffu);
    return want == got || want == rev;
}

/* ---------------------------------------------------------------- boxes */

typedef enum { CV_SAME, CV_F32_BF16, CV_F32_F16, CV_BF16_F32, CV_F16_F32 } Conv;

static size_t storage_bytes(CkptH5Type t) { return ckpt_h5_disk_size(t); }

static void convert_row(void *dst, const void *src, size_t n, Conv cv, size_t esize)
{
    switch (cv) {
    case CV_SAME: memcpy(dst, src, n * esize); break;
    case CV_F32_BF16: {
        const float *x = src;
        uint16_t *y = dst;
        for (size_t i = 0; i < n; i++) y[i] = dtype_bf16_from_f32(x[i]);
        break;
    }
    case CV_F32_F16: {
        const float *x = src;
        uint16_t *y = dst;
        for (size_t i = 0; i < n; i++) y[i] = dtype_f16_from_f32(x[i]);
        break;
    }
    case CV_BF16_F32: {
        const uint16_t *x = src;
        float *y = dst;
        for (size_t i = 0; i < n; i++) y[i] = dtype_f32_from_bf16(x[i]);
        break;
    }
    case CV_F16_F32: {
        const uint16_t *x = src;
        float *y = dst;
        for (size_t i = 0; i < n; i++) y[i] = dtype_f32_from_f16(x[i]);
        break;
    }
    }
}

/* Copies the box of extent cnt from src (row-major, dims sdim, box at
 * soff) to dst (dims ddim, at doff), converting: src elements of ssize
 * bytes, dst of dsize. */
static void copy_box(void *dst, const hsize_t *ddim, const hsize_t *doff, size_t dsize, const void *src,
                     const hsize_t *sdim, const hsize_t *soff, size_t ssize, const hsize_t *cnt, int ndim, Conv cv)
{
    size_t ds[CKPT_H5_MAX_DIMS], ss[CKPT_H5_MAX_DIMS], idx[CKPT_H5_MAX_DIMS] = { 0 };
    ds[ndim - 1] = ss[ndim - 1] = 1;
    for (int i = ndim - 2; i >= 0; i--) {
        ds[i] = ds[i + 1] * (size_t)ddim[i + 1];
        ss[i] = ss[i + 1] * (size_t)sdim[i + 1];
    }
    size_t row = (size_t)cnt[ndim - 1], nrows = 1;
    for (int i = 0; i < ndim - 1; i++) nrows *= (size_t)cnt[i];
    for (size_t r = 0; r < nrows; r++) {
        size_t d = (size_t)doff[ndim - 1], s = (size_t)soff[ndim - 1];
        for (int i = 0; i < ndim - 1; i++) {
            d += ((size_t)doff[i] + idx[i]) * ds[i];
            s += ((size_t)soff[i] + idx[i]) * ss[i];
        }
        convert_row((char *)dst + d * dsize, (const char *)src + s * ssize, row, cv, dsize);
        for (int i = ndim - 2; i >= 0; i--) {
            if (++idx[i] < cnt[i]) break;
            idx[i] = 0;
        }
    }
}

/* ---------------------------------------------------------------- writing */

void ckpt_io_scratch_free(CkptIoScratch *s)
{
    td_free(s->buf);
    s->buf = NULL;
    s->bytes = 0;
}

#define WRITEBACK_EVERY (64u << 20)

/* Streams the file to the disk while the save goes on: once another
 * WRITEBACK_EVERY bytes have been written, the range before the previous
 * kick is waited for and dropped from the page cache, and writeback of the
 * new range is started.  The final fsync then finds little left, and the
 * page cache stays a few windows large, its pages recycled (fresh pages
 * are slow to fault in on some virtual machines). */
static void kick_writeback(CkptIoScratch *s, size_t bytes)
{
    s->pending += bytes;
    if (s->fd < 0 || s->pending < WRITEBACK_EVERY) return;
    s->pending = 0;
#ifdef SYNC_FILE_RANGE_WRITE
    struct stat sb;
    if (fstat(s->fd, &sb)) return;
    off_t end = sb.st_size;
    if (s->started > s->dropped &&
        sync_file_range(s->fd, s->dropped, s->started - s->dropped,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) == 0) {
        posix_fadvise(s->fd, s->dropped, s->started - s->dropped, POSIX_FADV_DONTNEED);
        s->dropped = s->started;
    }
    if (end > s->started && sync_file_range(s->fd, s->started, end - s->started, SYNC_FILE_RANGE_WRITE) == 0)
        s->started = end;
#endif
}

/* Fresh pages are expensive to fault in on some virtual machines; ask for
 * huge pages on big scratch buffers (a hint, ignored where unsupported). */
static void hint_huge(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (e > a + (2u << 20)) madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

static unsigned char *scratch(CkptIoScratch *s, size_t bytes)
{
    if (s->bytes < bytes) {
        td_free(s->buf);
        s->buf = td_malloc(bytes);
        s->bytes = bytes;
        hint_huge(s->buf, bytes);
    }
    return s->buf;
}

typedef struct {
    const CkptPiece *pc;
    hsize_t grid[CKPT_H5_MAX_DIMS];
    size_t first, slot, chunk_bytes;
    unsigned char *buf;
} WriteCtx;

static void chunk_origin(const WriteCtx *w, size_t ci, hsize_t *coff)
{
    const CkptPiece *pc = w->pc;
    for (int i = pc->ndim - 1; i >= 0; i--) {
        coff[i] = (ci % w->grid[i]) * pc->chunk[i];
        ci /= w->grid[i];
    }
}

static void prep_chunks(void *vctx, size_t b, size_t e, int tid)
{
    (void)tid;
    const WriteCtx *w = vctx;
    const CkptPiece *pc = w->pc;
    static const hsize_t zero[CKPT_H5_MAX_DIMS] = { 0 };
    Conv cv = pc->raw ? CV_SAME : pc->type == CKPT_H5_BF16 ? CV_F32_BF16 : pc->type == CKPT_H5_F16 ? CV_F32_F16 : CV_SAME;
    size_t dsize = storage_bytes(pc->type), ssize = pc->raw ? dsize : ckpt_h5_mem_size(pc->type);
    for (size_t j = b; j < e; j++) {
        unsigned char *dst = w->buf + j * w->slot;
        hsize_t coff[CKPT_H5_MAX_DIMS], ext[CKPT_H5_MAX_DIMS];
        chunk_origin(w, w->first + j, coff);
        bool edge = false;
        for (int i = 0; i < pc->ndim; i++) {
            ext[i] = pc->chunk[i] < pc->shape[i] - coff[i] ? pc->chunk[i] : pc->shape[i] - coff[i];
            edge |= ext[i] < pc->chunk[i];
        }
        if (edge) memset(dst, 0, w->chunk_bytes);   /* HDF5 stores whole chunks */
        copy_box(dst, pc->chunk, zero, dsize, pc->data, pc->shape, coff, ssize, ext, pc->ndim, cv);
        put_le32(dst + w->chunk_bytes, ckpt_fletcher32(dst, w->chunk_bytes));
    }
}

/* One batch of prepared chunks to store, on the writer thread (the only
 * thread calling HDF5 while it runs). */
typedef struct {
    hid_t ds;
    const WriteCtx *w;
    const unsigned char *buf;
    size_t first, n;
    CkptIoScratch *s;
    int rc;
    char why[300];
} WriteJob;

static void *write_batch(void *arg)
{
    WriteJob *j = arg;
    const WriteCtx *w = j->w;
    j->rc = 0;
    for (size_t k = 0; k < j->n; k++) {
        hsize_t coff[CKPT_H5_MAX_DIMS];
        chunk_origin(w, j->first + k, coff);
        if (H5Dwrite_chunk(j->ds, H5P_DEFAULT, 0, coff, w->chunk_bytes + 4, j->buf + k * w->slot) < 0) {
            ckpt_h5_why(j->why, sizeof j->why);
            j->rc = -1;
            return NULL;
        }
    }
    kick_writeback(j->s, j->n * (w->chunk_bytes + 4));
    return NULL;
}

/* Batches of chunks are prepared by the pool into one half of the scratch
 * buffer while a writer thread stores the previous batch from the other
 * half.  The writer is the only thread in HDF5 meanwhile: the main thread
 * makes no HDF5 call until it has joined it (HDF5 is not built
 * thread-safe; ckpt.h), and pthread_create / pthread_join order the two
 * threads' calls. */
int ckpt_io_write_chunks(hid_t ds, const CkptPiece *pc, CkptIoScratch *s, char *err, size_t err_len)
{
    WriteCtx w = { pc, { 0 }, 0, 0, storage_bytes(pc->type), NULL };
    size_t n_chunks = 1;
    for (int i = 0; i < pc->ndim; i++) {
        w.grid[i] = (pc->shape[i] + pc->chunk[i] - 1) / pc->chunk[i];
        n_chunks *= (size_t)w.grid[i];
        w.chunk_bytes *= (size_t)pc->chunk[i];
    }
    w.slot = td_round_up(w.chunk_bytes + 4, TD_ALIGN);
    /* a chunk per thread, at least 16 MiB per batch when chunks are small */
    size_t per = td_max((size_t)pool_threads(), (16u << 20) / w.slot);
    per = td_min(td_max(per, 1), n_chunks);
    unsigned char *half[2];
    half[0] = scratch(s, 2 * per * w.slot);
    half[1] = half[0] + per * w.slot;
    w.buf = half[0];
    w.first = 0;
    pool_for(per, 1, prep_chunks, &w);
    int cur = 0;
    for (size_t c0 = 0; c0 < n_chunks; c0 += per, cur ^= 1) {
        WriteJob job = { ds, &w, half[cur], c0, td_min(per, n_chunks - c0), s, 0, "" };
        size_t next = c0 + per;
        pthread_t th;
        bool threaded = next < n_chunks && pthread_create(&th, NULL, write_batch, &job) == 0;
        if (!threaded) write_batch(&job);
        if (next < n_chunks) {
            w.buf = half[cur ^ 1];
            w.first = next;
            pool_for(td_min(per, n_chunks - next), 1, prep_chunks, &w);
        }
        if (threaded) pthread_join(th, NULL);
        if (job.rc) {
            snprintf(err, err_len, "cannot write dataset /%s: %s", pc->name, job.why);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    size_t name;               /* index into the reader's name pool */
    int ndim;
    CkptH5Type type;
    hsize_t coff[CKPT_H5_MAX_DIMS], cdim[CKPT_H5_MAX_DIMS];   /* chunk origin and shape */
    hsize_t boff[CKPT_H5_MAX_DIMS], bcnt[CKPT_H5_MAX_DIMS];   /* destination box */
    void *out;
    off_t addr;
    size_t stored;             /* chunk bytes + 4 */
    bool direct;               /* a contiguous, unconverted part of out */
    size_t dst_off;            /* element of out where the chunk starts (direct) */
    int status;                /* 0, or an errno-like code; EILSEQ: checksum */
} Task;

struct CkptIoRead {
    int fd;
    hid_t file;
    bool usable;               /* no user block: chunk addresses are file offsets */
    Task *t;
    size_t n, cap;
    char (*names)[CKPT_NAME_MAX];
    size_t n_names, cap_names;
    unsigned char *bufs;       /* one chunk buffer per thread */
    size_t buf_bytes;
};

CkptIoRead *ckpt_io_read_new(const char *path, hid_t file, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    CkptIoRead *r = td_calloc(sizeof *r);
    r->fd = fd;
    r->file = file;
    /* chunk addresses are file offsets only without a user block; when
     * that cannot be asked, every read goes through H5Dread instead */
    hsize_t ub = 1;
    hid_t fcpl = H5Fget_create_plist(file);
    if (fcpl >= 0) {
        if (H5Pget_userblock(fcpl, &ub) < 0) ub = 1;
        H5Pclose(fcpl);
    }
    H5Eclear2(H5E_DEFAULT);
    r->usable = ub == 0;
    return r;
}

void ckpt_io_read_free(CkptIoRead *r)
{
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    td_free(r->t);
    td_free(r->names);
    td_free(r->bufs);
    td_free(r);
}

static size_t pool_name(CkptIoRead *r, const char *name)
{
    if (r->n_names && !strcmp(r->names[r->n_names - 1], name)) return r->n_names - 1;
    if (r->n_names == r->cap_names) {
        r->cap_names = r->cap_names ? 2 * r->cap_names : 64;
        char(*nn)[CKPT_NAME_MAX] = td_malloc(r->cap_names * CKPT_NAME_MAX);
        if (r->n_names) memcpy(nn, r->names, r->n_names * CKPT_NAME_MAX);
        td_free(r->names);
        r->names = nn;
    }
    TD_CHECK(!td_snprintf(r->names[r->n_names], CKPT_NAME_MAX, "%s", name), "dataset name %s: over %d bytes", name,
             CKPT_NAME_MAX - 1);
    return r->n_names++;
}

static Task *new_task(CkptIoRead *r)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        Task *nt = td_malloc(r->cap * sizeof(Task));
        if (r->n) memcpy(nt, r->t, r->n * sizeof(Task));
        td_free(r->t);
        r->t = nt;
    }
    Task *t = &r->t[r->n++];
    memset(t, 0, sizeof *t);
    return t;
}

static void fmt_coords(char *out, size_t n, int ndim, const hsize_t *c)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%llu", i ? "," : "", (unsigned long long)c[i]);
    if (k < n) snprintf(out + k, n - k, "]");
}

int ckpt_io_read_add(CkptIoRead *r, const char *name, const CkptH5Desc *d, const hsize_t *off, const hsize_t *cnt,
                     void *out, char *err, size_t err_len)
{
    const int nd = d->ndim;
    size_t total = 1;
    for (int i = 0; i < nd; i++) total *= (size_t)cnt[i];
    if (total == 0) return 0;
    bool chunked = nd >= 1 && d->chunk[0] > 0;
    if (!CKPT_IO_NATIVE || !r->usable || !chunked || d->n_filters != 1 || !d->fletcher32 || d->type == CKPT_H5_OTHER)
        return ckpt_h5_read_box(r->file, name, d, off, cnt, out, err, err_len);

    size_t chunk_bytes = storage_bytes(d->type);
    hsize_t lo[CKPT_H5_MAX_DIMS], hi[CKPT_H5_MAX_DIMS], c[CKPT_H5_MAX_DIMS];
    size_t n_chunks = 1;
    for (int i = 0; i < nd; i++) {
        chunk_bytes *= (size_t)d->chunk[i];
        lo[i] = off[i] / d->chunk[i];
        hi[i] = (off[i] + cnt[i] - 1) / d->chunk[i];
        c[i] = lo[i];
        n_chunks *= (size_t)(hi[i] - lo[i] + 1);
    }
    hid_t ds = H5Dopen2(r->file, name, H5P_DEFAULT);
    if (ds < 0) return ckpt_h5_read_box(r->file, name, d, off, cnt, out, err, err_len);
    size_t first = r->n;
    bool fallback = false;
    size_t bstride[CKPT_H5_MAX_DIMS];
    bstride[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) bstride[i] = bstride[i + 1] * (size_t)cnt[i + 1];
    size_t pname = pool_name(r, name);
    for (size_t k = 0; k < n_chunks && !fallback; k++) {
        Task *t = new_task(r);
        t->name = pname;
        t->ndim = nd;
        t->type = d->type;
        t->out = out;
        for (int i = 0; i < nd; i++) {
            t->coff[i] = c[i] * d->chunk[i];
            t->cdim[i] = d->chunk[i];
            t->boff[i] = off[i];
            t->bcnt[i] = cnt[i];
        }
        unsigned mask = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (H5Dget_chunk_info_by_coord(ds, t->coff, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF) {
            H5Eclear2(H5E_DEFAULT);
            char at[96];
            fmt_coords(at, sizeof at, nd, t->coff);
            snprintf(err, err_len, "dataset /%s: the chunk at %s is missing (the file is incomplete)", name, at);
            H5Dclose(ds);
            r->n = first;
            return -1;
        }
        if (mask != 0 || size != chunk_bytes + 4) {
            fallback = true;   /* stored some other way: let HDF5 decode it */
            break;
        }
        t->addr = (off_t)addr;
        t->stored = (size_t)size;
        /* direct: whole chunk inside the box, contiguous there, no conversion */
        bool inside = true;
        for (int i = 0; i < nd; i++)
            inside &= t->coff[i] >= off[i] && t->coff[i] + t->cdim[i] <= off[i] + cnt[i];
        int split = 0;
        while (split < nd - 1 && t->cdim[split] == 1) split++;
        bool contiguous = true;
        for (int i = split + 1; i < nd; i++) contiguous &= t->cdim[i] == cnt[i];
        t->direct = inside && contiguous &&
                    (d->type == CKPT_H5_F32 || d->type == CKPT_H5_U64 || d->type == CKPT_H5_U8 || d->type == CKPT_H5_I8);
        t->dst_off = 0;
        for (int i = 0; i < nd; i++) t->dst_off += (size_t)(t->coff[i] - off[i]) * bstride[i];
        for (int i = nd - 1; i >= 0; i--) {   /* next chunk coordinate */
            if (++c[i] <= hi[i]) break;
            c[i] = lo[i];
        }
    }
    H5Dclose(ds);
    if (fallback) {
        r->n = first;
        return ckpt_h5_read_box(r->file, name, d, off, cnt, out, err, err_len);
    }
    return 0;
}

typedef struct {
    CkptIoRead *r;
    size_t *range;   /* thread i: tasks [range[i], range[i+1]) */
    size_t slot;
} RunCtx;

static int read_full(int fd, struct iovec *iov, int n_iov, off_t at, size_t want)
{
    size_t got = 0;
    while (got < want) {
        ssize_t k = preadv(fd, iov, n_iov, at + (off_t)got);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno ? errno : EIO;
        }
        if (k == 0) return ENODATA;   /* past the end: truncated */
        got += (size_t)k;
        /* advance the iovecs past what was read */
        size_t adv = (size_t)k;
        while (n_iov > 0 && adv >= iov[0].iov_len) {
            adv -= iov[0].iov_len;
            iov++;
            n_iov--;
        }
        if (n_iov > 0) {
            iov[0].iov_base = (char *)iov[0].iov_base + adv;
            iov[0].iov_len -= adv;
        }
    }
    return 0;
}

static void run_task(Task *t, int fd, unsigned char *buf)
{
    size_t n = t->stored - 4;
    if (t->direct) {
        size_t esize = ckpt_h5_mem_size(t->type);
        unsigned char *dst = (unsigned char *)t->out + t->dst_off * esize, crc[4];
        struct iovec iov[2] = { { dst, n }, { crc, 4 } };
        t->status = read_full(fd, iov, 2, t->addr, t->stored);
        if (!t->status && !checksum_ok(dst, n, crc)) t->status = EILSEQ;
        return;
    }
    struct iovec iov[1] = { { buf, t->stored } };
    t->status = read_full(fd, iov, 1, t->addr, t->stored);
    if (t->status) return;
    if (!checksum_ok(buf, n, buf + n)) {
        t->status = EILSEQ;
        return;
    }
    /* scatter the part of the chunk inside the box */
    hsize_t lo[CKPT_H5_MAX_DIMS], ext[CKPT_H5_MAX_DIMS], in_chunk[CKPT_H5_MAX_DIMS], in_box[CKPT_H5_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        hsize_t a = t->coff[i] > t->boff[i] ? t->coff[i] : t->boff[i];
        hsize_t e1 = t->coff[i] + t->cdim[i], e2 = t->boff[i] + t->bcnt[i];
        lo[i] = a;
        ext[i] = (e1 < e2 ? e1 : e2) - a;
        in_chunk[i] = lo[i] - t->coff[i];
        in_box[i] = lo[i] - t->boff[i];
    }
    Conv cv = t->type == CKPT_H5_BF16 ? CV_BF16_F32 : t->type == CKPT_H5_F16 ? CV_F16_F32 : CV_SAME;
    size_t ssize = storage_bytes(t->type), dsize = ckpt_h5_mem_size(t->type);
    copy_box(t->out, t->bcnt, in_box, dsize, buf, t->cdim, in_chunk, ssize, ext, t->ndim, cv);
}

static void run_range(void *vctx, size_t b, size_t e, int tid)
{
    (void)tid;
    const RunCtx *c = vctx;
    for (size_t th = b; th < e; th++)   /* part th has buffer th */
        for (size_t k = c->range[th]; k < c->range[th + 1]; k++)
            run_task(&c->r->t[k], c->r->fd, c->r->bufs + th * c->slot);
}

static int cmp_task(const void *a, const void *b)
{
    off_t x = ((const Task *)a)->addr, y = ((const Task *)b)->addr;
    return x < y ? -1 : x > y;
}

int ckpt_io_read_run(CkptIoRead *r, char *err, size_t err_len)
{
    if (r->n == 0) return 0;
    /* file order, then an even split of the bytes over the threads */
    qsort(r->t, r->n, sizeof *r->t, cmp_task);
    size_t T = (size_t)pool_threads(), total = 0, slot = 0;
    for (size_t k = 0; k < r->n; k++) {
        total += r->t[k].stored;
        if (!r->t[k].direct) slot = td_max(slot, td_round_up(r->t[k].stored, TD_ALIGN));
    }
    T = td_min(T, r->n);
    if (slot) {
        r->bufs = td_malloc(T * slot);
        hint_huge(r->bufs, T * slot);
    }
    size_t *range = td_malloc((T + 1) * sizeof(size_t));
    range[0] = 0;
    size_t acc = 0, k = 0;
    for (size_t th = 1; th < T; th++) {
        while (k < r->n && acc + r->t[k].stored / 2 < total * th / T) acc += r->t[k++].stored;
        range[th] = k;
    }
    range[T] = r->n;
    /* Tell the kernel what comes: the whole span, in file order. */
    off_t span0 = r->t[0].addr, span1 = r->t[r->n - 1].addr + (off_t)r->t[r->n - 1].stored;
    posix_fadvise(r->fd, span0, span1 - span0, POSIX_FADV_SEQUENTIAL);
    posix_fadvise(r->fd, span0, span1 - span0, POSIX_FADV_WILLNEED);
    RunCtx c = { r, range, slot };
    pool_for(T, 1, run_range, &c);
    td_free(range);
    td_free(r->bufs);
    r->bufs = NULL;
    for (size_t i = 0; i < r->n; i++) {
        const Task *t = &r->t[i];
        if (!t->status) continue;
        const char *name = r->names[t->name];
        char at[96];
        fmt_coords(at, sizeof at, t->ndim, t->coff);
        if (t->status == EILSEQ)
            snprintf(err, err_len, "checksum mismatch in dataset /%s (Fletcher32, chunk at %s): the data is corrupt",
                     name, at);
        else if (t->status == ENODATA)
            snprintf(err, err_len, "dataset /%s: the chunk at %s lies past the end of the file: the file is truncated",
                     name, at);
        else
            snprintf(err, err_len, "dataset /%s: read error: %s", name, strerror(t->status));
        return -1;
    }
    return 0;
}

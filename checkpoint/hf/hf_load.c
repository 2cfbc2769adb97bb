/* checkpoint/hf/hf_load.c - direct loads and imports of Hugging Face
 * directories (hf_load.h).
 *
 * Both validate the whole directory first (hf_model_open), then read
 * tensor by tensor through the mapping with pread (hf_read_box: nothing of
 * the files stays in the process, which holds the model it builds, a
 * load, or two tensors, an import), while a read-ahead thread
 * (hf_ahead_start) keeps about READ_AHEAD bytes of the next tensors
 * requested from the disk (posix_fadvise WILLNEED), so the disk keeps
 * reading while the pool converts.  A load widens bf16 straight into the
 * model's weights (streaming stores, hf_map.c), which it first asks to be
 * backed by huge pages, and which the read-ahead thread faults in ahead
 * of the reads.
 */
#include "checkpoint/hf/hf_load.h"
#include "checkpoint/hf/hf_map.h"
#include "comm/comm.h"
#include "core/common.h"

#include <cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static CkptDtype dtype_of_name(const char *s)
{
    return !strcmp(s, "bfloat16") ? CKPT_BF16 : !strcmp(s, "float16") ? CKPT_F16 : CKPT_F32;
}

int hf_read_config(const char *dir, ModelConfig *cfg, CkptMeta *meta, char *err, size_t err_len)
{
    HfConfig c;
    if (hf_config_read(&c, dir, err, err_len)) return -1;
    *cfg = c.cfg;
    if (meta) {
        memset(meta, 0, sizeof *meta);
        meta->format_version = CKPT_FORMAT_VERSION;
        meta->world = meta->dp = meta->tp = meta->pp = meta->ep = meta->cp = 1;
        meta->dtype = dtype_of_name(c.dtype);
    }
    hf_config_free(&c);
    return 0;
}

static void print_notes(const char *dir, const char *notes)
{
    if (notes[0] && comm_rank() == 0) td_info("note: %s: %s", dir, notes);
}

/* The weights a load writes are usually fresh memory (model_init's
 * calloc, never touched): faulting them in 4 KiB at a time costs more CPU
 * than the reads on a virtual machine; ask for 2 MiB pages (a hint:
 * ignored where unsupported, and for pages already there). */
static void hint_huge(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = 2u << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + n) & ~(huge - 1);
    if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

/* Bytes kept requested from the disk ahead of the tensor being read. */
#define READ_AHEAD (64u << 20)

static const size_t zero[PARAM_MAX_DIMS] = { 0 };

typedef struct {
    const HfBinding **b;
    const size_t *const *off, *const *cnt;
} Boxes;

static const HfBinding *box_at(void *ctx, int i, const size_t **off, const size_t **cnt)
{
    const Boxes *x = ctx;
    *off = x->off[i];
    *cnt = x->cnt[i];
    return x->b[i];
}

int hf_load(const char *dir, Model *m, char *err, size_t err_len)
{
    HfModel h;
    if (hf_model_open(&h, dir, err, err_len)) return -1;
    int rc = -1, n = m->n_params;
    const HfBinding **bs = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *bs);
    const size_t **offs = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *offs);
    const size_t **cnts = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *cnts);
    char *a = config_to_json(&h.hc.cfg), *b = config_to_json(&m->cfg);
    bool same = !strcmp(a, b);
    td_free(a);
    td_free(b);
    if (!same) {
        snprintf(err, err_len, "%s: config.json describes another model than the one being loaded", dir);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        Param *p = &m->params[i];
        bs[i] = hf_model_find(&h, p->name);
        offs[i] = p->loff;
        cnts[i] = p->lshape;
        if (!bs[i]) {
            snprintf(err, err_len, "%s: no HF tensor maps %s", dir, p->name);
            goto out;
        }
    }
    print_notes(dir, h.notes);
    hint_huge(m->w, m->n_w * sizeof(float));
    Boxes x = { bs, offs, cnts };
    void **dst = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *dst);
    size_t *dst_bytes = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *dst_bytes);
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < m->params[i].ndim; d++) numel *= m->params[i].lshape[d];
        dst[i] = m->params[i].w;
        dst_bytes[i] = numel * sizeof(float);
    }
    HfAhead *ra = hf_ahead_start(&h, READ_AHEAD, n, box_at, &x, dst, dst_bytes);
    for (int i = 0; i < n; i++) {
        hf_ahead_at(ra, i);
        if (hf_read_box(&h, bs[i], offs[i], cnts[i], m->params[i].w, false, err, err_len)) {
            hf_ahead_stop(ra);
            td_free(dst);
            td_free(dst_bytes);
            goto out;
        }
    }
    hf_ahead_stop(ra);
    td_free(dst);
    td_free(dst_bytes);
    rc = 0;
out:
    td_free(bs);
    td_free(offs);
    td_free(cnts);
    hf_model_close(&h);
    return rc;
}

/* The storage type for dir's matrices: their common 16-bit type, else f32. */
static CkptDtype native_dtype(const HfModel *h)
{
    int bf = 0, f16 = 0, other = 0;
    for (int i = 0; i < h->n_b; i++) {
        if (h->b[i].ndim < 2) continue;
        bf += h->b[i].dtype == ST_BF16;
        f16 += h->b[i].dtype == ST_F16;
        other += h->b[i].dtype != ST_BF16 && h->b[i].dtype != ST_F16;
    }
    return other ? CKPT_F32 : bf && !f16 ? CKPT_BF16 : f16 && !bf ? CKPT_F16 : CKPT_F32;
}

/* The read of the next tensor, on its own thread. */
typedef struct {
    const HfModel *h;
    const HfBinding *b;
    const size_t *off, *cnt;
    void *out;
    bool raw;
    int rc;
    char err[512];
} ReadJob;

static void *read_job(void *arg)
{
    ReadJob *j = arg;
    j->rc = hf_read_box_serial(j->h, j->b, j->off, j->cnt, j->out, j->raw, j->err, sizeof j->err);
    return NULL;
}

/* Whether an import stores b's values as read: 16-bit matrices kept in
 * their own type (no conversion, half the buffer). */
static bool import_raw(const HfBinding *b, CkptDtype dtype)
{
    return b->ndim >= 2 && ((dtype == CKPT_BF16 && b->dtype == ST_BF16) || (dtype == CKPT_F16 && b->dtype == ST_F16));
}

int hf_import(const char *dir, const char *out, const CkptDtype *dtype_opt, HfImportReport *rep, char *err,
              size_t err_len)
{
    double t0 = td_now();
    HfModel h;
    if (hf_model_open(&h, dir, err, err_len)) return -1;
    CkptDtype dtype = dtype_opt ? *dtype_opt : native_dtype(&h);
    CkptTokFiles tok;
    CkptStream *s = NULL;
    void *buf = NULL, *buf2 = NULL;
    HfAhead *ra = NULL;
    const HfBinding **bs = NULL;
    size_t (*shapes)[PARAM_MAX_DIMS] = NULL;
    const size_t **offs = NULL, **cnts = NULL;
    int rc = -1;
    size_t read = 0, largest = 0;
    if (ckpt_tok_files_from_dir(dir, &tok, err, err_len)) goto out;
    if (ckpt_stream_open(&s, out, &h.hc.cfg, &tok, err, err_len)) goto out;
    if (ckpt_stream_root_attr(s, "hf_architecture", h.hc.fam->architecture, err, err_len) ||
        ckpt_stream_root_attr(s, "hf_layout", h.layout == HF_V4 ? "v4" : "v5", err, err_len) ||
        ckpt_stream_root_attr(s, "hf_config", h.hc.text, err, err_len))
        goto out;
    print_notes(dir, h.notes);
    int n = ckpt_stream_count(s);
    /* every tensor whole, in the plan's order */
    bs = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *bs);
    shapes = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *shapes);
    offs = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *offs);
    cnts = td_calloc((size_t)td_max((size_t)n, 1) * sizeof *cnts);
    for (int i = 0; i < n; i++) {
        int nd;
        const char *name = ckpt_stream_tensor(s, i, &nd, shapes[i]);
        bs[i] = hf_model_find(&h, name);
        offs[i] = zero;
        cnts[i] = shapes[i];
        if (!bs[i]) {
            snprintf(err, err_len, "%s: no HF tensor maps %s", dir, name);
            goto out;
        }
    }
    /* one buffer, of the largest tensor, for all (allocating one per tensor
     * leaves glibc's heap holding the sum of their sizes) */
    size_t buf_bytes = 1;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < bs[i]->ndim; d++) numel *= shapes[i][d];
        buf_bytes = td_max(buf_bytes, numel * (import_raw(bs[i], dtype) ? 2 : 4));
        largest = td_max(largest, bs[i]->ndim >= 2 && dtype != CKPT_F32 ? numel * 2 : numel * 4);
    }
    /* two buffers: tensor i+1 is read (a reader thread) while tensor i is
     * written (the main thread and the pool) */
    buf = td_malloc(buf_bytes);
    buf2 = n > 1 ? td_malloc(buf_bytes) : NULL;
    void *bufs[2] = { buf, buf2 };
    Boxes x = { bs, offs, cnts };
    ra = hf_ahead_start(&h, READ_AHEAD, n, box_at, &x, NULL, NULL);
    hf_ahead_at(ra, 0);
    if (n > 0 && hf_read_box(&h, bs[0], zero, shapes[0], buf, import_raw(bs[0], dtype), err, err_len)) goto out;
    for (int i = 0; i < n; i++) {
        const HfBinding *b = bs[i];
        for (int k = 0; k < b->n_src; k++) read += b->src[k]->nbytes;
        ReadJob job = { &h, i + 1 < n ? bs[i + 1] : NULL, zero, i + 1 < n ? shapes[i + 1] : NULL, bufs[(i + 1) & 1],
                        i + 1 < n && import_raw(bs[i + 1], dtype), 0, "" };
        pthread_t th;
        bool threaded = false;
        if (job.b) {
            hf_ahead_at(ra, i + 1);
            threaded = pthread_create(&th, NULL, read_job, &job) == 0;
        }
        int w = ckpt_stream_put(s, b->tandem, bufs[i & 1], import_raw(b, dtype), dtype, "hf_dtype",
                                st_dtype_name(b->dtype), err, err_len);
        if (job.b && !threaded) read_job(&job);
        if (threaded) pthread_join(th, NULL);
        if (w) goto out;
        if (job.rc) {
            snprintf(err, err_len, "%s", job.err);
            goto out;
        }
    }
    hf_ahead_stop(ra);
    ra = NULL;
    rc = ckpt_stream_close(s, true, err, err_len);
    s = NULL;
    if (!rc && rep) {
        memset(rep, 0, sizeof *rep);
        rep->bytes_read = read;
        rep->largest = largest;
        rep->seconds = td_now() - t0;
        rep->dtype = dtype;
        rep->layout = h.layout == HF_V4 ? "v4" : "v5";
        snprintf(rep->architecture, sizeof rep->architecture, "%s", h.hc.fam->architecture);
        rep->n_tensors = n;
        rep->tokenizer = tok.tokenizer_json != NULL;
    }
out:
    hf_ahead_stop(ra);
    td_free(buf);
    td_free(buf2);
    td_free(bs);
    td_free(shapes);
    td_free(offs);
    td_free(cnts);
    if (s) ckpt_stream_close(s, false, NULL, 0);
    ckpt_tok_files_free(&tok);
    hf_model_close(&h);
    return rc;
}

/* checkpoint/hf/hf_load.c - direct loads and imports of Hugging Face
 * directories (hf_load.h).
 *
 * Both validate the whole directory first (hf_model_open), then read
 * tensor by tensor through the mapping, prefetching each tensor's pages
 * (madvise WILLNEED) and dropping them from the resident set once read, so
 * the process holds the model it builds (a load) or one tensor (an
 * import), not the files.
 */
#include "checkpoint/hf/hf_load.h"
#include "checkpoint/hf/hf_map.h"
#include "comm/comm.h"
#include "core/common.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>

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
        meta->world = meta->dp = meta->tp = meta->pp = meta->ep = 1;
        meta->dtype = dtype_of_name(c.dtype);
    }
    hf_config_free(&c);
    return 0;
}

static void print_notes(const char *dir, const char *notes)
{
    if (notes[0] && comm_rank() == 0) td_info("note: %s: %s", dir, notes);
}

int hf_load(const char *dir, Model *m, char *err, size_t err_len)
{
    HfModel h;
    if (hf_model_open(&h, dir, err, err_len)) return -1;
    int rc = -1;
    char *a = config_to_json(&h.hc.cfg), *b = config_to_json(&m->cfg);
    bool same = !strcmp(a, b);
    td_free(a);
    td_free(b);
    if (!same) {
        snprintf(err, err_len, "%s: config.json describes another model than the one being loaded", dir);
        goto out;
    }
    print_notes(dir, h.notes);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        const HfBinding *bd = hf_model_find(&h, p->name);
        if (!bd) {
            snprintf(err, err_len, "%s: no HF tensor maps %s", dir, p->name);
            goto out;
        }
        hf_prefetch(bd);
        int r = hf_read_box(&h, bd, p->loff, p->lshape, p->w, false, err, err_len);
        hf_release(bd);
        if (r) goto out;
    }
    rc = 0;
out:
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

int hf_import(const char *dir, const char *out, const CkptDtype *dtype_opt, HfImportReport *rep, char *err,
              size_t err_len)
{
    double t0 = td_now();
    HfModel h;
    if (hf_model_open(&h, dir, err, err_len)) return -1;
    CkptDtype dtype = dtype_opt ? *dtype_opt : native_dtype(&h);
    CkptTokFiles tok;
    CkptStream *s = NULL;
    void *buf = NULL;
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
    for (int i = 0; i < n; i++) {
        int ndim;
        size_t shape[PARAM_MAX_DIMS], zero[PARAM_MAX_DIMS] = { 0 }, numel = 1;
        const char *name = ckpt_stream_tensor(s, i, &ndim, shape);
        const HfBinding *b = hf_model_find(&h, name);
        if (!b) {
            snprintf(err, err_len, "%s: no HF tensor maps %s", dir, name);
            goto out;
        }
        for (int d = 0; d < ndim; d++) numel *= shape[d];
        /* 16-bit matrices stored as they are: no conversion, half the buffer */
        bool raw = ndim >= 2 && ((dtype == CKPT_BF16 && b->dtype == ST_BF16) || (dtype == CKPT_F16 && b->dtype == ST_F16));
        size_t bytes = numel * (raw ? 2 : 4);
        largest = td_max(largest, ndim >= 2 && dtype != CKPT_F32 ? numel * 2 : numel * 4);
        buf = td_malloc(td_max(bytes, 1));
        hf_prefetch(b);
        int r = hf_read_box(&h, b, zero, shape, buf, raw, err, err_len);
        hf_release(b);
        for (int k = 0; k < b->n_src; k++) read += b->src[k]->nbytes;
        if (r || ckpt_stream_put(s, name, buf, raw, dtype, "hf_dtype", st_dtype_name(b->dtype), err, err_len)) goto out;
        td_free(buf);
        buf = NULL;
    }
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
    td_free(buf);
    if (s) ckpt_stream_close(s, false, NULL, 0);
    ckpt_tok_files_free(&tok);
    hf_model_close(&h);
    return rc;
}

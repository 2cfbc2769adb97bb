/* checkpoint/hf/hf_map.c - validation of an HF directory against its
 * family's tables and the tandem parameter table, and box reads
 * (hf_map.h).
 *
 * The tandem parameters come from model_param_table (one process, every
 * stage): the engine's own list for the mapped config, so biases, q/k
 * norms, dense or MoE layers and the shared expert exist exactly when the
 * config says.  Each is expanded through its family row into HF names;
 * a layout is accepted when every name is in the files and every file
 * tensor was claimed (or is a skip).
 */
#include "checkpoint/hf/hf_map.h"
#include "core/common.h"
#include "core/model/topology.h"
#include "core/pool.h"

#include "core/dtype.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if (defined(__AVX512F__) || defined(__AVX2__)) && !defined(TANDEM_PORTABLE)
#include <immintrin.h>
#endif

#define HF_NAME_MAX 256

/* ---------------------------------------------------------------- rules */

const HfTensor *hf_rule_for(const HfFamily *fam, HfLayout layout, const char *tandem, int *layer)
{
    for (int t = 0; fam->tensors[t]; t++)
        for (const HfTensor *r = fam->tensors[t]; r->tandem; r++) {
            int l = -1;
            if ((r->layouts & layout) && hf_pattern_match(r->tandem, tandem, 1 << 30, &l, NULL)) {
                *layer = l;
                return r;
            }
        }
    return NULL;
}

int hf_expand(const HfTensor *r, int layer, int ndim, const size_t *shape, HfEachFn fn, void *ctx)
{
    char name[HF_NAME_MAX];
    uint64_t s[ST_MAX_DIMS];
    int n = 0;
    switch (r->how) {
    case HFT_COPY:
    case HFT_PART:
        for (int i = 0; i < ndim; i++) s[i] = shape[i];
        if (r->how == HFT_PART) s[r->dim] *= r->parts;
        if (hf_pattern_fill(name, sizeof name, r->hf, layer, 0)) return -1;
        if (fn(ctx, name, ndim, s, -1)) return -1;
        return 1;
    case HFT_STACK:
        for (int i = 1; i < ndim; i++) s[i - 1] = shape[i];
        for (size_t e = 0; e < shape[0]; e++, n++) {
            if (hf_pattern_fill(name, sizeof name, r->hf, layer, (int)e)) return -1;
            if (fn(ctx, name, ndim - 1, s, (int)e)) return -1;
        }
        return n;
    }
    return -1;
}

/* ---------------------------------------------------------------- validation */

static void fmt_shape(char *out, size_t n, int ndim, const uint64_t *s)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(out + k, n - k, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
    if (k < n) snprintf(out + k, n - k, "]");
}

/* One layout tried against the files. */
typedef struct {
    const StCheckpoint *st;
    bool *claimed;             /* per file tensor */
    int missing, bad;
    char first_missing[HF_NAME_MAX];
    char first_bad[1024];
    /* when building */
    const StTensor **src;
    int n_src;
    const int *fp8_block;      /* quantization_config fp8 block (0, 0: none) */
    const StTensor **scales;   /* when building: parallel to src */
} Try;

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static int try_one(void *vctx, const char *hf_name, int ndim, const uint64_t *shape, int expert)
{
    (void)expert;
    Try *t = vctx;
    const StTensor *x = st_find(t->st, hf_name);
    if (!x) {
        if (!t->missing++) snprintf(t->first_missing, sizeof t->first_missing, "%s", hf_name);
        if (t->src) t->src[t->n_src++] = NULL;
        return 0;
    }
    t->claimed[x - t->st->tensors] = true;
    if (x->dtype == ST_F8_E4M3) {   /* its block scale belongs to it, whatever else is wrong */
        char sn[HF_NAME_MAX + 16];
        snprintf(sn, sizeof sn, "%s_scale_inv", hf_name);
        const StTensor *sc = st_find(t->st, sn);
        if (sc) t->claimed[sc - t->st->tensors] = true;
    }
    if (t->scales) t->scales[t->n_src] = NULL;
    if (t->src) t->src[t->n_src++] = x;
    char got[128], want[128];
    bool same = x->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = x->shape[i] == shape[i];
    const bool fp8 = t->fp8_block[0] > 0;
    if (!same && !t->bad++) {
        fmt_shape(got, sizeof got, x->ndim, x->shape);
        fmt_shape(want, sizeof want, ndim, shape);
        snprintf(t->first_bad, sizeof t->first_bad, "tensor '%s': shape %s does not match the config's %s", hf_name,
                 got, want);
    } else if (same && x->dtype == ST_F8_E4M3 && fp8) {
        /* its block scale: <name>_scale_inv, float, [ceil(rows / b0), ceil(cols / b1)] */
        char sname[HF_NAME_MAX + 16];
        snprintf(sname, sizeof sname, "%s_scale_inv", hf_name);
        const StTensor *sc = st_find(t->st, sname);
        uint64_t ws[2] = { 0, 0 };
        if (ndim == 2) {
            ws[0] = ceil_div(shape[0], (uint64_t)t->fp8_block[0]);
            ws[1] = ceil_div(shape[1], (uint64_t)t->fp8_block[1]);
        }
        if (ndim != 2) {
            if (!t->bad++)
                snprintf(t->first_bad, sizeof t->first_bad, "tensor '%s': F8_E4M3 of rank %d (block scales are for "
                         "2-D weights)", hf_name, ndim);
        } else if (!sc) {
            if (!t->bad++)
                snprintf(t->first_bad, sizeof t->first_bad, "tensor '%s': F8_E4M3 without its block scale '%s'",
                         hf_name, sname);
        } else if (sc->ndim != 2 || sc->shape[0] != ws[0] || sc->shape[1] != ws[1]) {
            if (!t->bad++) {
                fmt_shape(got, sizeof got, sc->ndim, sc->shape);
                fmt_shape(want, sizeof want, 2, ws);
                snprintf(t->first_bad, sizeof t->first_bad, "tensor '%.160s': shape %s is not %s (blocks of %dx%d of '%.160s')",
                         sname, got, want, t->fp8_block[0], t->fp8_block[1], hf_name);
            }
        } else if (sc->dtype != ST_F32 && sc->dtype != ST_BF16 && sc->dtype != ST_F16) {
            if (!t->bad++)
                snprintf(t->first_bad, sizeof t->first_bad, "tensor '%s': dtype %s is not a float type (F32, BF16, F16)",
                         sname, st_dtype_name(sc->dtype));
        } else if (t->scales) {
            t->scales[t->n_src - 1] = sc;
        }
    } else if (same && x->dtype != ST_F32 && x->dtype != ST_BF16 && x->dtype != ST_F16 && !t->bad++) {
        if (x->dtype == ST_F8_E4M3)
            snprintf(t->first_bad, sizeof t->first_bad,
                     "tensor '%s': dtype F8_E4M3 but config.json has no fp8 quantization_config (its block size)", hf_name);
        else if (x->dtype == ST_F8_E5M2)
            snprintf(t->first_bad, sizeof t->first_bad,
                     "tensor '%s': dtype F8_E5M2 (a quantized checkpoint) is not supported (F8_E4M3 with block scales is)",
                     hf_name);
        else
            snprintf(t->first_bad, sizeof t->first_bad, "tensor '%s': dtype %s is not a float type (F32, F16, BF16)",
                     hf_name, st_dtype_name(x->dtype));
    }
    return 0;
}

/* Maps every param under layout into t (src filled when t->src). */
static int map_layout(const HfFamily *fam, HfLayout layout, const Param *ps, int np, Try *t, char *err, size_t err_len)
{
    for (int i = 0; i < np; i++) {
        int layer;
        const HfTensor *r = hf_rule_for(fam, layout, ps[i].name, &layer);
        if (!r) {
            snprintf(err, err_len, "%s has no %s row for tandem parameter %s (a table bug)", fam->architecture,
                     layout == HF_V4 ? "v4" : "v5", ps[i].name);
            return -1;
        }
        if (hf_expand(r, layer, ps[i].ndim, ps[i].shape, try_one, t) < 0) {
            snprintf(err, err_len, "%s: an HF name of %s is too long", fam->architecture, ps[i].name);
            return -1;
        }
    }
    return 0;
}

/* File tensors neither claimed nor skipped; the first one's name in *first,
 * the skips' notes appended to notes. */
static int unexpected(const StCheckpoint *st, const bool *claimed, const HfFamily *fam, int n_layers, char *first,
                      size_t first_len, char *notes, size_t notes_len)
{
    int n = 0;
    bool noted[16] = { false };
    for (size_t i = 0; i < st->n_tensors; i++) {
        if (claimed[i]) continue;
        int s = 0;
        while (fam->skips[s].hf && !hf_pattern_match(fam->skips[s].hf, st->tensors[i].name, n_layers, NULL, NULL)) s++;
        if (fam->skips[s].hf) {
            if (notes && s < 16 && !noted[s]) {
                size_t k = strlen(notes);
                snprintf(notes + k, notes_len - k, "%sread past %s (%s)", k ? "; " : "", st->tensors[i].name,
                         fam->skips[s].note);
                noted[s] = true;
            }
            continue;
        }
        if (!n++) snprintf(first, first_len, "%s", st->tensors[i].name);
    }
    return n;
}

void hf_model_close(HfModel *h)
{
    if (!h) return;
    for (int i = 0; h->fd && i < h->st.n_files; i++)
        if (h->fd[i] >= 0) close(h->fd[i]);
    td_free(h->fd);
    hf_config_free(&h->hc);
    st_close(&h->st);
    td_free(h->b);
    td_free(h->src);
    td_free(h->scales);
    memset(h, 0, sizeof *h);
}

int hf_model_open(HfModel *h, const char *dir, char *err, size_t err_len)
{
    memset(h, 0, sizeof *h);
    if (hf_config_read(&h->hc, dir, err, err_len)) return -1;
    if (st_open(&h->st, dir, err, err_len)) {
        hf_model_close(h);
        return -1;
    }
    const HfFamily *fam = h->hc.fam;
    const ModelConfig *cfg = &h->hc.cfg;
    Topology t1;
    topo_single(&t1, cfg);
    Param *ps;
    int np = model_param_table(cfg, &t1, &ps);
    bool *claimed = td_calloc(td_max(h->st.n_tensors, 1));
    Try best = { 0 };
    HfLayout best_layout = HF_V4;
    int best_score = -1;
    char best_unexp[HF_NAME_MAX] = "";
    int best_n_unexp = 0;
    int rc = -1;
    for (int lay = HF_V4; lay <= HF_V5; lay <<= 1) {
        if (!(fam->layouts & lay)) continue;
        Try t = { &h->st, claimed, 0, 0, "", "", NULL, 0, h->hc.fp8_block, NULL };
        memset(claimed, 0, h->st.n_tensors);
        if (map_layout(fam, (HfLayout)lay, ps, np, &t, err, err_len)) goto out;
        char first[HF_NAME_MAX] = "";
        int nu = unexpected(&h->st, claimed, fam, cfg->num_hidden_layers, first, sizeof first, NULL, 0);
        int score = t.missing + nu;
        if (best_score < 0 || score < best_score) {
            best = t;
            best_layout = (HfLayout)lay;
            best_score = score;
            snprintf(best_unexp, sizeof best_unexp, "%s", first);
            best_n_unexp = nu;
        }
    }
    const char *lname = best_layout == HF_V4 ? "v4" : "v5";
    if (best_score > 0) {
        char m[400] = "", u[400] = "";
        if (best.missing)
            snprintf(m, sizeof m, "missing tensor '%s'%s", best.first_missing,
                     best.missing > 1 ? " (and more)" : "");
        if (best_n_unexp)
            snprintf(u, sizeof u, "%sunexpected tensor '%s'%s (mapped by no %s row)", best.missing ? "; " : "",
                     best_unexp, best_n_unexp > 1 ? " (and more)" : "", fam->architecture);
        snprintf(err, err_len, "%s: the tensors do not match %s (closest: the %s layout, %d missing, %d unexpected): %s%s",
                 dir, fam->architecture, lname, best.missing, best_n_unexp, m, u);
        goto out;
    }
    if (best.bad) {
        snprintf(err, err_len, "%s: %s", dir, best.first_bad);
        goto out;
    }
    /* build the bindings for the chosen layout */
    h->layout = best_layout;
    size_t n_src = 0;
    for (int i = 0; i < np; i++) n_src += ps[i].ndim > 0 ? (ps[i].shape[0] > 0 ? ps[i].shape[0] : 1) : 1;
    h->src = td_calloc(td_max(n_src, 1) * sizeof *h->src);
    h->scales = td_calloc(td_max(n_src, 1) * sizeof *h->scales);
    h->b = td_calloc((size_t)td_max((size_t)np, 1) * sizeof *h->b);
    Try t = { &h->st, claimed, 0, 0, "", "", h->src, 0, h->hc.fp8_block, h->scales };
    memset(claimed, 0, h->st.n_tensors);
    for (int i = 0; i < np; i++) {
        HfBinding *b = &h->b[h->n_b++];
        snprintf(b->tandem, sizeof b->tandem, "%s", ps[i].name);
        b->rule = hf_rule_for(fam, h->layout, ps[i].name, &b->layer);
        b->ndim = ps[i].ndim;
        memcpy(b->shape, ps[i].shape, sizeof b->shape);
        int first = t.n_src;
        hf_expand(b->rule, b->layer, b->ndim, b->shape, try_one, &t);
        b->src = h->src + first;
        b->scale = h->scales + first;
        b->n_src = t.n_src - first;
        b->dtype = b->src[0]->dtype;
        for (int k = 1; k < b->n_src; k++)
            if (b->src[k]->dtype != b->dtype) b->dtype = ST_F32;
    }
    h->fd = td_malloc((size_t)td_max((size_t)h->st.n_files, 1) * sizeof *h->fd);
    for (int i = 0; i < h->st.n_files; i++) h->fd[i] = -1;
    for (int i = 0; i < h->st.n_files; i++) {
        h->fd[i] = open(h->st.files[i].path, O_RDONLY | O_CLOEXEC);
        if (h->fd[i] < 0) {
            snprintf(err, err_len, "%s: cannot open: %s", h->st.files[i].path, strerror(errno));
            goto out;
        }
    }
    snprintf(h->notes, sizeof h->notes, "%s", h->hc.notes);
    char dummy[HF_NAME_MAX];
    unexpected(&h->st, claimed, fam, cfg->num_hidden_layers, dummy, sizeof dummy, h->notes, sizeof h->notes);
    rc = 0;
out:
    td_free(claimed);
    td_free(ps);
    if (rc) hf_model_close(h);
    return rc;
}

const HfBinding *hf_model_find(const HfModel *h, const char *tandem)
{
    for (int i = 0; i < h->n_b; i++)
        if (!strcmp(h->b[i].tandem, tandem)) return &h->b[i];
    return NULL;
}

/* ---------------------------------------------------------------- reading */

/* ---------------------------------------------------------------- reading */

#define BOUNCE (256u << 10)   /* bytes converted at a time */

static int read_full(int fd, void *dst, size_t n, off_t at)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (char *)dst + got, n - got, at + (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : ENODATA;
        got += (size_t)k;
    }
    return 0;
}

/* bf16 -> float32 as dtype_bf16_to_f32 (the bits shifted up by 16, so
 * every path gives the same bits), with non-temporal stores: the
 * destination of a load is far larger than the caches and is not read
 * again soon, so streaming stores skip reading each line before writing
 * it.  The fence makes the stores visible before the pool's hand-off. */
static void widen_bf16_stream(float *restrict y, const uint16_t *restrict x, size_t n)
{
#if (defined(__AVX512F__) || defined(__AVX2__)) && !defined(TANDEM_PORTABLE)
#if defined(__AVX512F__)
    enum { V = 16 };
#else
    enum { V = 8 };
#endif
    size_t i = 0;
    while (i < n && ((uintptr_t)(y + i) & (V * 4 - 1))) i++;
    if (n - i < 4 * V) {
        dtype_bf16_to_f32(y, x, n);
        return;
    }
    dtype_bf16_to_f32(y, x, i);
    for (; i + V <= n; i += V) {
#if defined(__AVX512F__)
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)));
        _mm512_stream_si512((void *)(y + i), _mm512_slli_epi32(v, 16));
#else
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(x + i)));
        _mm256_stream_si256((__m256i *)(void *)(y + i), _mm256_slli_epi32(v, 16));
#endif
    }
    _mm_sfence();
    dtype_bf16_to_f32(y + i, x + i, n - i);
#else
    dtype_bf16_to_f32(y, x, n);
#endif
}

/* n elements of t's dtype at file offset `at` -> out: raw bytes, or float32. */
static int read_run(const HfModel *h, const StTensor *t, off_t at, size_t n, void *out, bool raw, char *err,
                    size_t err_len)
{
    const int fd = h->fd[t->file];
    const size_t esize = st_dtype_size(t->dtype);
    int e = 0;
    if (raw || t->dtype == ST_F32) {
        e = read_full(fd, out, n * esize, at);
    } else {
        uint16_t bounce[BOUNCE / 2];
        float *y = out;
        for (size_t i = 0; i < n && !e; i += BOUNCE / 2) {
            size_t m = td_min(BOUNCE / 2, n - i);
            e = read_full(fd, bounce, m * 2, at + (off_t)(i * 2));
            if (e) break;
            if (t->dtype == ST_BF16) widen_bf16_stream(y + i, bounce, m);
            else dtype_f16_to_f32(y + i, bounce, m);
        }
    }
    if (e) {
        snprintf(err, err_len, "%s: tensor '%s': %s", h->st.files[t->file].path, t->name,
                 e == ENODATA ? "the file ends early (truncated while open?)" : strerror(e));
        return -1;
    }
    return 0;
}

/* The box of a 2-D F8_E4M3 tensor t with block scale sc into out as
 * float32: y = f32(q) * s[r / b0][c / b1], one float32 product per value,
 * as DeepSeek's weight_dequant (x.float() * s) does.  Rows are read in
 * runs of whole rows when the box takes every column. */
static int read_f8_box(const HfModel *h, const StTensor *t, const StTensor *sc, const uint64_t *start,
                       const uint64_t *count, float *out, char *err, size_t err_len)
{
    const uint64_t cols = t->shape[1], b0 = (uint64_t)h->hc.fp8_block[0], b1 = (uint64_t)h->hc.fp8_block[1];
    const uint64_t c0 = start[1], nc = count[1];
    if (!nc || !count[0]) return 0;
    const uint64_t s0 = c0 / b1, ns = (c0 + nc - 1) / b1 - s0 + 1;
    const off_t base = (off_t)(t->data - h->st.files[t->file].map);
    const uint64_t rows_per = nc == cols ? td_max(1, (BOUNCE) / cols) : 1;
    uint8_t *q = td_malloc((size_t)(rows_per * nc));
    float *srow = td_malloc((size_t)ns * sizeof(float));
    uint64_t srow_at = UINT64_MAX;
    int rc = 0;
    for (uint64_t r = start[0]; r < start[0] + count[0] && !rc;) {
        uint64_t n = td_min(rows_per, start[0] + count[0] - r);
        int e = read_full(h->fd[t->file], q, (size_t)(n * nc), base + (off_t)(r * cols + c0));
        if (e) {
            snprintf(err, err_len, "%s: tensor '%s': %s", h->st.files[t->file].path, t->name,
                     e == ENODATA ? "the file ends early (truncated while open?)" : strerror(e));
            rc = -1;
            break;
        }
        for (uint64_t i = 0; i < n && !rc; i++) {
            const uint64_t row = r + i;
            if (row / b0 != srow_at) {   /* the scales of this block row, over the box's columns */
                srow_at = row / b0;
                uint64_t ss[2] = { srow_at, s0 }, sn[2] = { 1, ns };
                rc = st_read_slice_f32(sc, ss, sn, srow, err, err_len);
            }
            float *y = out + (size_t)((row - start[0]) * nc);
            const uint8_t *qr = q + (size_t)(i * nc);
            for (uint64_t j = 0; j < nc && !rc; j++)
                y[j] = dtype_f32_from_f8e4m3(qr[j]) * srow[(c0 + j) / b1 - s0];
        }
        r += n;
    }
    td_free(q);
    td_free(srow);
    return rc;
}

/* The box [start, start + count) of HF tensor t into out (row-major box),
 * as runs: the trailing dims the box takes whole merge with the last one
 * it cuts into one contiguous run.  sc: t's F8 block scale (or NULL). */
static int read_tensor_box(const HfModel *h, const StTensor *t, const StTensor *sc, const uint64_t *start,
                           const uint64_t *count, void *out, bool raw, char *err, size_t err_len)
{
    const int nd = t->ndim;
    for (int i = 0; i < nd; i++)
        if (start[i] + count[i] > t->shape[i]) {
            snprintf(err, err_len, "tensor '%s': box outside its shape", t->name);
            return -1;
        }
    if (!raw && t->dtype == ST_F8_E4M3 && sc && nd == 2) return read_f8_box(h, t, sc, start, count, out, err, err_len);
    if (!raw && t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
        snprintf(err, err_len, "tensor '%s': dtype %s does not convert to float32", t->name, st_dtype_name(t->dtype));
        return -1;
    }
    const size_t esize = st_dtype_size(t->dtype), osize = raw ? esize : 4;
    const off_t base = (off_t)(t->data - h->st.files[t->file].map);
    size_t stride[ST_MAX_DIMS];
    if (nd) stride[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) stride[i] = stride[i + 1] * (size_t)t->shape[i + 1];
    int k = nd - 1;   /* the run: dims k.. (k cut, the ones after it whole) */
    while (k > 0 && start[k] == 0 && count[k] == t->shape[k]) k--;
    size_t run = nd ? (size_t)count[k] * stride[k] : 1, outer = 1;
    for (int i = 0; i < k; i++) outer *= (size_t)count[i];
    if (nd == 0 || run == 0 || outer == 0) return nd == 0 ? read_run(h, t, base, 1, out, raw, err, err_len) : 0;
    size_t idx[ST_MAX_DIMS] = { 0 };
    for (size_t r = 0; r < outer; r++) {
        size_t el = (size_t)start[k] * stride[k];
        for (int i = 0; i < k; i++) el += (size_t)(start[i] + idx[i]) * stride[i];
        if (read_run(h, t, base + (off_t)(el * esize), run, (char *)out + r * run * osize, raw, err, err_len))
            return -1;
        for (int i = k - 1; i >= 0; i--) {
            if (++idx[i] < count[i]) break;
            idx[i] = 0;
        }
    }
    return 0;
}

/* One contiguous piece of a box: tandem box [off, off + cnt) into out. */
static int read_piece(const HfModel *h, const HfBinding *b, const uint64_t *off, const uint64_t *cnt, void *out,
                      bool raw, char *err, size_t err_len)
{
    const int nd = b->ndim;
    const size_t esize = raw ? 2 : 4;
    uint64_t s[ST_MAX_DIMS], c[ST_MAX_DIMS];
    switch (b->rule->how) {
    case HFT_COPY:
    case HFT_PART:
        for (int i = 0; i < nd; i++) {
            s[i] = off[i];
            c[i] = cnt[i];
        }
        if (b->rule->how == HFT_PART) s[b->rule->dim] += (uint64_t)b->rule->part * b->shape[b->rule->dim];
        return read_tensor_box(h, b->src[0], b->scale[0], s, c, out, raw, err, err_len);
    case HFT_STACK: {
        size_t inner = 1;
        for (int i = 1; i < nd; i++) {
            s[i - 1] = off[i];
            c[i - 1] = cnt[i];
            inner *= (size_t)cnt[i];
        }
        for (uint64_t e = off[0]; e < off[0] + cnt[0]; e++) {
            char *dst = (char *)out + (size_t)(e - off[0]) * inner * esize;
            if (read_tensor_box(h, b->src[e], b->scale[e], s, c, dst, raw, err, err_len)) return -1;
        }
        return 0;
    }
    }
    return -1;
}

typedef struct {
    const HfModel *h;
    const HfBinding *b;
    const size_t *off, *cnt;
    void *out;
    bool raw;
    size_t per, split1, inner0, inner1;   /* pieces: dim-0 blocks of `per`, or dim-1 blocks within one dim-0 index */
    int rc;
    char err[512];
} ReadCtx;

static void read_range(void *vctx, size_t p0, size_t p1, int tid)
{
    (void)tid;
    ReadCtx *c = vctx;
    const HfBinding *b = c->b;
    const size_t esize = c->raw ? 2 : 4;
    for (size_t p = p0; p < p1; p++) {
        uint64_t off[PARAM_MAX_DIMS], cnt[PARAM_MAX_DIMS];
        for (int i = 0; i < b->ndim; i++) {
            off[i] = c->off[i];
            cnt[i] = c->cnt[i];
        }
        size_t at;
        if (c->split1) {   /* index p / split1 of dim 0, block p % split1 of dim 1 */
            size_t i0 = p / c->split1, j = p % c->split1, n1 = c->cnt[1];
            size_t lo = n1 * j / c->split1, hi = n1 * (j + 1) / c->split1;
            off[0] += i0;
            cnt[0] = 1;
            off[1] += lo;
            cnt[1] = hi - lo;
            at = i0 * c->inner0 + lo * c->inner1;
        } else {
            size_t lo = p * c->per, hi = td_min(lo + c->per, c->cnt[0]);
            off[0] += lo;
            cnt[0] = hi - lo;
            at = lo * c->inner0;
        }
        char why[512];
        if (cnt[0] && (b->ndim < 2 || cnt[1]) &&
            read_piece(c->h, b, off, cnt, (char *)c->out + at * esize, c->raw, why, sizeof why)) {
            /* several threads may fail: keep one message (any one names the tensor) */
            if (!c->rc) {
                c->rc = -1;
                snprintf(c->err, sizeof c->err, "%s", why);
            }
        }
    }
}

int hf_read_box(const HfModel *h, const HfBinding *b, const size_t *off, const size_t *cnt, void *out, bool raw,
                char *err, size_t err_len)
{
    if (raw && b->dtype != ST_BF16 && b->dtype != ST_F16) {
        snprintf(err, err_len, "%s: a raw 16-bit read of %s data", b->tandem, st_dtype_name(b->dtype));
        return -1;
    }
    ReadCtx c = { h, b, off, cnt, out, raw, 1, 0, 1, 1, 0, "" };
    if (b->ndim == 0) return read_piece(h, b, (uint64_t[1]){ 0 }, (uint64_t[1]){ 1 }, out, raw, err, err_len);
    for (int i = 1; i < b->ndim; i++) c.inner0 *= cnt[i];
    for (int i = 2; i < b->ndim; i++) c.inner1 *= cnt[i];
    const size_t esize = raw ? 2 : 4, bytes = c.inner0 * cnt[0] * esize;
    const size_t T = (size_t)pool_threads(), piece = 4u << 20;
    size_t pieces = td_max(1, bytes / piece);
    if (T > 1 && pieces > 1) pieces = td_max(pieces, 2 * T);
    size_t n;
    if (pieces <= 1) {
        c.per = cnt[0];
        n = 1;
    } else if (cnt[0] >= pieces || b->ndim < 2) {
        c.per = (cnt[0] + pieces - 1) / pieces;
        n = (cnt[0] + c.per - 1) / c.per;
    } else {   /* few dim-0 rows of many bytes (experts): split dim 1 too */
        c.split1 = td_min(cnt[1], (pieces + cnt[0] - 1) / cnt[0]);
        n = cnt[0] * c.split1;
    }
    pool_for(n, 1, read_range, &c);
    if (c.rc) snprintf(err, err_len, "%s", c.err);
    return c.rc;
}

int hf_read_box_serial(const HfModel *h, const HfBinding *b, const size_t *off, const size_t *cnt, void *out,
                       bool raw, char *err, size_t err_len)
{
    if (raw && b->dtype != ST_BF16 && b->dtype != ST_F16) {
        snprintf(err, err_len, "%s: a raw 16-bit read of %s data", b->tandem, st_dtype_name(b->dtype));
        return -1;
    }
    uint64_t o[PARAM_MAX_DIMS] = { 0 }, c[PARAM_MAX_DIMS] = { 1, 1, 1 };
    for (int i = 0; i < b->ndim; i++) {
        o[i] = off[i];
        c[i] = cnt[i];
    }
    return read_piece(h, b, o, c, out, raw, err, err_len);
}

/* ---------------------------------------------------------------- read-ahead */

#define ADVISE_PIECE (2u << 20)   /* bytes per posix_fadvise(WILLNEED) call */

static size_t advise_range(const HfModel *h, const StTensor *t, size_t from, size_t n)
{
    if (!n) return 0;
    off_t base = (off_t)(t->data - h->st.files[t->file].map);
    /* Linux reads at most the device's read-ahead size (read_ahead_kb) per
     * WILLNEED call; a tensor's bytes are asked for in pieces below it */
    for (size_t at = 0; at < n; at += ADVISE_PIECE)
        posix_fadvise(h->fd[t->file], base + (off_t)(from + at), (off_t)td_min(ADVISE_PIECE, n - at),
                      POSIX_FADV_WILLNEED);
    return n;
}

size_t hf_prefetch(const HfModel *h, const HfBinding *b, const size_t *off, const size_t *cnt)
{
    size_t n = 0;
    if (b->rule->how == HFT_STACK) {
        for (size_t e = off[0]; e < off[0] + cnt[0] && e < (size_t)b->n_src; e++)
            n += advise_range(h, b->src[e], 0, b->src[e]->nbytes);
        return n;
    }
    const StTensor *t = b->src[0];
    size_t rows = t->ndim ? (size_t)t->shape[0] : 1, row = rows ? t->nbytes / rows : 0;
    size_t r0 = 0, r1 = rows;
    bool dim0_only = b->rule->how == HFT_COPY && b->ndim >= 1;   /* a box of rows: only those */
    for (int i = 1; dim0_only && i < b->ndim; i++) dim0_only = off[i] == 0 && cnt[i] == b->shape[i];
    if (dim0_only) {
        r0 = off[0];
        r1 = off[0] + cnt[0];
    }
    return advise_range(h, t, r0 * row, (r1 - r0) * row);
}

/* The read-ahead thread: it requests boxes next, next + 1, ... while
 * the bytes requested beyond the box being read (cur) stay under `ahead`,
 * and sleeps on `moved` when the window is full until the reader moves on
 * or stops. */
struct HfAhead {
    const HfModel *h;
    size_t ahead;
    int n;
    HfBoxFn at;
    void *ctx;
    void *const *dst;    /* per box: where it will be read to (or NULL: not touched) */
    const size_t *dst_bytes;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t moved;
    int cur, next;       /* box being read; first box not yet requested */
    size_t *sz;          /* bytes requested per box (0 until requested) */
    size_t beyond;       /* sum of sz over boxes (cur, next) */
    bool stop;
};

/* Faults in (allocates and zeroes) the fresh pages of [p, p + n) without
 * writing them, as a write would (MADV_POPULATE_WRITE, Linux 5.14; a
 * no-op where unsupported): the page faults of a load's destination then
 * happen on the read-ahead thread while the reader waits for the disk,
 * not in the conversion.  The pages at either end may hold other data
 * being written meanwhile: populating never changes what a page holds. */
static void populate(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    const uintptr_t pg = 4096;
    uintptr_t a = (uintptr_t)p & ~(pg - 1), e = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
    if (p && n) madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}

static void *ahead_main(void *arg)
{
    HfAhead *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && (a->next >= a->n || a->beyond >= a->ahead)) pthread_cond_wait(&a->moved, &a->mu);
        if (a->stop) break;
        int k = a->next++;
        pthread_mutex_unlock(&a->mu);
        const size_t *off, *cnt;
        const HfBinding *b = a->at(a->ctx, k, &off, &cnt);
        size_t bytes = hf_prefetch(a->h, b, off, cnt);
        if (a->dst) populate(a->dst[k], a->dst_bytes[k]);
        pthread_mutex_lock(&a->mu);
        a->sz[k] = bytes;
        if (k > a->cur) a->beyond += bytes;
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

HfAhead *hf_ahead_start(const HfModel *h, size_t ahead, int n, HfBoxFn at, void *ctx, void *const *dst,
                        const size_t *dst_bytes)
{
    if (n <= 0 || ahead == 0) return NULL;
    HfAhead *a = td_calloc(sizeof *a);
    *a = (HfAhead){ .h = h, .ahead = ahead, .n = n, .at = at, .ctx = ctx, .dst = dst, .dst_bytes = dst_bytes,
                    .cur = -1 };
    a->sz = td_calloc((size_t)n * sizeof *a->sz);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->moved, NULL);
    if (pthread_create(&a->th, NULL, ahead_main, a) != 0) {
        pthread_cond_destroy(&a->moved);
        pthread_mutex_destroy(&a->mu);
        td_free(a->sz);
        td_free(a);
        return NULL;
    }
    return a;
}

void hf_ahead_at(HfAhead *a, int i)
{
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    for (int k = a->cur + 1; k <= i && k < a->next; k++) a->beyond -= a->sz[k];
    if (i > a->cur) a->cur = i;
    if (a->next < a->cur) a->next = a->cur;   /* fell behind: from the box being read on */
    pthread_cond_signal(&a->moved);
    pthread_mutex_unlock(&a->mu);
}

void hf_ahead_stop(HfAhead *a)
{
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_signal(&a->moved);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->th, NULL);
    pthread_cond_destroy(&a->moved);
    pthread_mutex_destroy(&a->mu);
    td_free(a->sz);
    td_free(a);
}

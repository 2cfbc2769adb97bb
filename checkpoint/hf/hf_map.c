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

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
    char first_bad[512];
    /* when building */
    const StTensor **src;
    int n_src;
} Try;

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
    if (t->src) t->src[t->n_src++] = x;
    char got[128], want[128];
    bool same = x->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = x->shape[i] == shape[i];
    if (!same && !t->bad++) {
        fmt_shape(got, sizeof got, x->ndim, x->shape);
        fmt_shape(want, sizeof want, ndim, shape);
        snprintf(t->first_bad, sizeof t->first_bad, "tensor '%s': shape %s does not match the config's %s", hf_name,
                 got, want);
    } else if (same && x->dtype != ST_F32 && x->dtype != ST_BF16 && x->dtype != ST_F16 && !t->bad++) {
        if (x->dtype == ST_F8_E4M3 || x->dtype == ST_F8_E5M2)
            snprintf(t->first_bad, sizeof t->first_bad,
                     "tensor '%s': dtype %s (a quantized checkpoint) is not supported for this architecture", hf_name,
                     st_dtype_name(x->dtype));
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
    hf_config_free(&h->hc);
    st_close(&h->st);
    td_free(h->b);
    td_free(h->src);
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
        Try t = { &h->st, claimed, 0, 0, "", "", NULL, 0 };
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
    h->b = td_calloc((size_t)td_max((size_t)np, 1) * sizeof *h->b);
    Try t = { &h->st, claimed, 0, 0, "", "", h->src, 0 };
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
        b->n_src = t.n_src - first;
        b->dtype = b->src[0]->dtype;
        for (int k = 1; k < b->n_src; k++)
            if (b->src[k]->dtype != b->dtype) b->dtype = ST_F32;
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

/* One contiguous piece of a box: tandem box [off, off + cnt) into out. */
static int read_piece(const HfBinding *b, const uint64_t *off, const uint64_t *cnt, void *out, bool raw, char *err,
                      size_t err_len)
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
        return raw ? st_read_slice_raw(b->src[0], s, c, out, err, err_len)
                   : st_read_slice_f32(b->src[0], s, c, out, err, err_len);
    case HFT_STACK: {
        size_t inner = 1;
        for (int i = 1; i < nd; i++) {
            s[i - 1] = off[i];
            c[i - 1] = cnt[i];
            inner *= (size_t)cnt[i];
        }
        for (uint64_t e = off[0]; e < off[0] + cnt[0]; e++) {
            char *dst = (char *)out + (size_t)(e - off[0]) * inner * esize;
            const StTensor *x = b->src[e];
            int rc = raw ? st_read_slice_raw(x, s, c, dst, err, err_len) : st_read_slice_f32(x, s, c, (float *)dst, err, err_len);
            if (rc) return rc;
        }
        return 0;
    }
    }
    return -1;
}

typedef struct {
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
            read_piece(b, off, cnt, (char *)c->out + at * esize, c->raw, why, sizeof why)) {
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
    (void)h;
    if (raw && b->dtype != ST_BF16 && b->dtype != ST_F16) {
        snprintf(err, err_len, "%s: a raw 16-bit read of %s data", b->tandem, st_dtype_name(b->dtype));
        return -1;
    }
    ReadCtx c = { b, off, cnt, out, raw, 1, 0, 1, 1, 0, "" };
    if (b->ndim == 0) return read_piece(b, (uint64_t[1]){ 0 }, (uint64_t[1]){ 1 }, out, raw, err, err_len);
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

/* ---------------------------------------------------------------- page cache */

static void advise(const StTensor *t, int how)
{
    if (!t || !t->nbytes) return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)t->data, e = a + t->nbytes;
    uintptr_t a0 = a & ~(uintptr_t)(pg - 1);
    /* MADV_DONTNEED on whole pages only: never a page a neighbour still reads */
    if (how == MADV_DONTNEED) {
        a0 = (a + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
        e &= ~(uintptr_t)(pg - 1);
    }
    if (e > a0) madvise((void *)a0, e - a0, how);
}

void hf_prefetch(const HfBinding *b)
{
    for (int i = 0; i < b->n_src; i++) advise(b->src[i], MADV_WILLNEED);
}

void hf_release(const HfBinding *b)
{
    for (int i = 0; i < b->n_src; i++) advise(b->src[i], MADV_DONTNEED);
}

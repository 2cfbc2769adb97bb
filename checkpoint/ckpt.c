/* checkpoint/ckpt.c - saving, loading, verifying and inspecting tandem
 * checkpoints (ckpt.h; format: docs/checkpoint.md, SPEC section 4).
 *
 * The writer works from a plan: every tensor of the model under the
 * recording topology (all pipeline stages, from model_param_table), with
 * its global shape, its chunk shape (the shard shape of that topology,
 * capped) and its partition string.  Every rank walks the same plan in the
 * same order (dataset creation is collective in parallel HDF5) and supplies
 * its own hyperslab: the slice its Param owns if it is the one rank that
 * writes those elements, nothing otherwise.
 *
 * The reader validates first and reads second: root attributes, the
 * config (equal to the model's), then each dataset this rank needs
 * (presence, shape, dtype); only then the hyperslabs of this rank's
 * Params are read into the model.  Ranks agree on the outcome.
 */
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_h5.h"
#include "checkpoint/ckpt_io.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/hf_load.h"
#include "checkpoint/ckpt_q8.h"
#include "comm/comm.h"
#include "core/common.h"
#include "core/dtype.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Chunks hold at most this many bytes (float32): big enough for streaming
 * bandwidth, small enough that a reader of another topology does not
 * decode much more than it needs. */
#define CKPT_CHUNK_BYTES (8u << 20)
#define ERR_MAX 512

/* Every dataset name tandem writes fits: the longest is a moment,
 * "optimizer/exp_avg_sq/" + a parameter name. */
_Static_assert(CKPT_NAME_MAX >= PARAM_NAME_MAX + sizeof "optimizer/exp_avg_sq/", "CKPT_NAME_MAX too small");

const char *ckpt_dtype_name(CkptDtype t)
{
    return t == CKPT_BF16 ? "bfloat16" : t == CKPT_F16 ? "float16" : "float32";
}

int ckpt_dtype_parse(const char *s, CkptDtype *t)
{
    if (!strcmp(s, "f32") || !strcmp(s, "float32")) *t = CKPT_F32;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *t = CKPT_BF16;
    else if (!strcmp(s, "f16") || !strcmp(s, "float16")) *t = CKPT_F16;
    else return -1;
    return 0;
}

static CkptH5Type h5type_of(CkptDtype t)
{
    return t == CKPT_BF16 ? CKPT_H5_BF16 : t == CKPT_F16 ? CKPT_H5_F16 : CKPT_H5_F32;
}

void ckpt_state_free(CkptState *st)
{
    if (!st) return;
    td_free(st->rank_rng);
    td_free(st->run_config);
    st->rank_rng = NULL;
    st->run_config = NULL;
    st->n_rank_rng = 0;
    ckpt_tok_files_free(&st->tok);
}

/* ---------------------------------------------------------------- tokenizer files */

/* The datasets of /tokenizer, in CkptTokFiles order. */
#define TOK_FILES 3
static const char *const g_tok_names[TOK_FILES] = { "tokenizer.json", "tokenizer_config.json",
                                                    "generation_config.json" };
#define TOK_CHUNK (1u << 20)   /* bytes per chunk */

static char **tok_text(CkptTokFiles *t, int i, size_t **len)
{
    switch (i) {
    case 0: *len = &t->tokenizer_json_len; return &t->tokenizer_json;
    case 1: *len = &t->tokenizer_config_len; return &t->tokenizer_config;
    default: *len = &t->generation_config_len; return &t->generation_config;
    }
}

void ckpt_tok_files_free(CkptTokFiles *t)
{
    if (!t) return;
    td_free(t->tokenizer_json);
    td_free(t->tokenizer_config);
    td_free(t->generation_config);
    memset(t, 0, sizeof *t);
}

/* Which /tokenizer datasets the file has (have[i]), each checked to be 1-D
 * uint8 (d[i] describes it). */
static int tok_validate(hid_t f, const char *path, CkptH5Desc *d, bool *have, char *err, size_t err_len)
{
    char name[CKPT_NAME_MAX];
    for (int i = 0; i < TOK_FILES; i++) {
        snprintf(name, sizeof name, "tokenizer/%s", g_tok_names[i]);
        have[i] = ckpt_h5_exists(f, name) && ckpt_h5_describe(f, name, &d[i]) == 0;
        if (have[i] && (d[i].type != CKPT_H5_U8 || d[i].ndim != 1)) {
            snprintf(err, err_len, "%s: dataset /%s: expected 1-D uint8 (the file's bytes), found %s with %d dims",
                     path, name, d[i].type_name, d[i].ndim);
            return -1;
        }
    }
    return 0;
}

/* Allocates out's texts for the datasets tok_validate found and queues
 * their reads on rd (or reads them at once when rd is NULL). */
static int tok_read(hid_t f, CkptIoRead *rd, const CkptH5Desc *d, const bool *have, CkptTokFiles *out, char *err,
                    size_t err_len)
{
    char name[CKPT_NAME_MAX];
    for (int i = 0; i < TOK_FILES; i++) {
        if (!have[i] || d[i].shape[0] == 0) continue;
        size_t *len, n = (size_t)d[i].shape[0];
        char **txt = tok_text(out, i, &len);
        *txt = td_calloc(n + 1);
        *len = n;
        snprintf(name, sizeof name, "tokenizer/%s", g_tok_names[i]);
        hsize_t off[1] = { 0 }, cnt[1] = { n };
        int rc = rd ? ckpt_io_read_add(rd, name, &d[i], off, cnt, *txt, err, err_len)
                    : ckpt_h5_read_box(f, name, &d[i], off, cnt, *txt, err, err_len);
        if (rc) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the plan */

typedef struct {
    char name[PARAM_NAME_MAX];
    int ndim;
    hsize_t shape[PARAM_MAX_DIMS], chunk[PARAM_MAX_DIMS];
    char partition[64];
} Entry;

typedef struct {
    Entry *e;
    int n;
} Plan;

/* Chunk shape for a shard of shape ls: the shard itself while it fits in
 * CKPT_CHUNK_BYTES, else dims cut from the first one, preferring a divisor
 * of the shard (chunk boundaries then fall on shard boundaries) unless
 * that makes chunks tiny. */
static void chunk_shape(hsize_t *chunk, const size_t *ls, int ndim)
{
    const size_t cap = CKPT_CHUNK_BYTES / sizeof(float);
    for (int i = 0; i < ndim; i++) chunk[i] = ls[i] ? ls[i] : 1;
    for (int d = 0; d < ndim; d++) {
        size_t rest = 1;
        for (int i = d + 1; i < ndim; i++) rest *= (size_t)chunk[i];
        if ((size_t)chunk[d] * rest <= cap) break;
        if (rest > cap) {       /* even one index of this dim is too big: cut the next dims */
            chunk[d] = 1;
            continue;
        }
        size_t n = (size_t)chunk[d], q = cap / rest;
        while (q > 1 && n % q) q--;
        if (q * rest < cap / 4) {   /* no good divisor: even split */
            size_t parts = (n * rest + cap - 1) / cap;
            q = (n + parts - 1) / parts;
        }
        chunk[d] = q;
        break;
    }
}

static void plan_free(Plan *pl)
{
    td_free(pl->e);
    pl->e = NULL;
    pl->n = 0;
}

/* Every tensor of cfg under topology t (its dp, tp, pp, ep and stage split),
 * in checkpoint order (stage by stage: embedding, layers, norm, lm_head). */
static int plan_build(Plan *pl, const ModelConfig *cfg, const Topology *t, char *err, size_t err_len)
{
    int stages[TOPO_MAX_PP];
    for (int s = 0; s < t->pp; s++) stages[s] = t->stage_begin[s + 1] - t->stage_begin[s];
    pl->n = 0;
    pl->e = NULL;
    int cap = 0;
    for (int s = 0; s < t->pp; s++) {
        Topology ts;
        if (topo_init(&ts, cfg, t->dp, t->tp, t->pp, t->ep, t->cp, s * t->dp * t->cp * t->tp, stages, err, err_len))
            return -1;
        Param *ps;
        int np = model_param_table(cfg, &ts, &ps);
        if (pl->n + np > cap) {
            cap = 2 * (pl->n + np);
            Entry *ne = td_malloc((size_t)cap * sizeof(Entry));
            if (pl->n) memcpy(ne, pl->e, (size_t)pl->n * sizeof(Entry));
            td_free(pl->e);
            pl->e = ne;
        }
        for (int i = 0; i < np; i++) {
            const Param *p = &ps[i];
            if (p->tied_copy) continue;   /* its source, model/embed_tokens on stage 0, is saved */
            Entry *e = &pl->e[pl->n++];
            memset(e, 0, sizeof *e);
            snprintf(e->name, sizeof e->name, "%s", p->name);
            e->ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) e->shape[d] = p->shape[d];
            chunk_shape(e->chunk, p->lshape, p->ndim);
            param_partition(p, &ts, e->partition, sizeof e->partition);
        }
        td_free(ps);
    }
    return 0;
}

static void fmt_shape(char *out, size_t n, int ndim, const hsize_t *s)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%llu", i ? "," : "", (unsigned long long)s[i]);
    if (k < n) snprintf(out + k, n - k, "]");
}

/* ---------------------------------------------------------------- ranks agreeing */

/* In a parallel save/load: -1 on every rank if rc < 0 on any. */
static int agree(bool parallel, int rc)
{
    if (!parallel) return rc < 0 ? -1 : 0;
    int32_t v = rc < 0 ? -1 : 0;
    comm_allreduce_min_i32(COMM_WORLD, &v, 1);
    return v;
}

/* After a failed agree(): every rank gets the message of the lowest failing
 * rank in err. */
static void share_error(bool parallel, bool failed_here, char *err, size_t err_len)
{
    if (!parallel) return;
    int32_t who = failed_here ? comm_rank() : INT32_MAX;
    comm_allreduce_min_i32(COMM_WORLD, &who, 1);
    char msg[ERR_MAX] = "";
    if (failed_here && who == comm_rank()) snprintf(msg, sizeof msg, "%s", err);
    comm_bcast(COMM_WORLD, msg, sizeof msg, who);
    if (!failed_here || who != comm_rank()) snprintf(err, err_len, "%s", msg);
}

/* ---------------------------------------------------------------- saving */

static int fsync_path(const char *path, bool dir)
{
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* The directory of path (td_malloc'd). */
static char *dir_of(const char *path)
{
    char *out = td_strdup(path[0] ? path : ".");
    char *s = strrchr(out, '/');
    if (!s) {
        td_free(out);
        return td_strdup(".");
    }
    if (s == out) out[1] = 0;
    else *s = 0;
    return out;
}

/* Whether this rank writes the elements of its slice of p: one rank per
 * element.  Replicas across dp (and across tp for tensors tp does not
 * split) stay silent; expert tensors are split over the ep ranks of the
 * first expert group (dp ranks 0 .. ep-1). */
static bool writes_param(const Param *p, const Topology *t)
{
    int holders = p->ep_dim >= 0 ? t->ep : 1;
    if (t->dp_rank >= holders || t->cp_rank != 0) return false;   /* cp ranks are replicas too */
    if (p->tp_dim < 0 && t->tp_rank != 0) return false;
    return true;
}

typedef struct {
    hid_t f;
    bool parallel;
    const char *path;
    CkptIoScratch scratch;
    char err[ERR_MAX];
    bool quiet;              /* failures leave "<path>: <why>" in err instead of printing it */
} Writer;

/* A failure of the writer: printed, or kept in w->err (quiet). */
static void writer_fail(Writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void writer_fail(Writer *w, const char *fmt, ...)
{
    char msg[ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->quiet) snprintf(w->err, sizeof w->err, "%s", msg);
    else td_error("%s", msg);
}

/* Creates the dataset of pc and writes this rank's box of it, on every
 * rank; 0 or -1 agreed by all.  A single process holding the whole tensor
 * writes finished chunks (ckpt_io.h); a parallel job writes hyperslabs
 * collectively through HDF5's filter pipeline. */
static int put_piece(Writer *w, const CkptPiece *pc)
{
    int rc = -1;
    hid_t ds = ckpt_h5_create_dataset(w->f, pc, w->err, sizeof w->err);
    if (ds >= 0) {
        bool direct = !w->parallel && CKPT_IO_NATIVE;   /* this process holds the whole tensor */
        for (int i = 0; i < pc->ndim; i++) direct &= pc->off[i] == 0 && pc->cnt[i] == pc->shape[i];
        rc = direct ? ckpt_io_write_chunks(ds, pc, &w->scratch, w->err, sizeof w->err)
                    : ckpt_h5_write_box(ds, pc, w->parallel, w->err, sizeof w->err);
        if (H5Dclose(ds) < 0 && !rc) {
            ckpt_h5_why(w->err, sizeof w->err);
            rc = -1;
        }
    }
    if (rc) writer_fail(w, "%s: %.400s", w->path, w->err);
    return agree(w->parallel, rc);
}

/* Writes /tokenizer from tok, a dataset per file present (rank 0's in a
 * parallel save: the lengths are broadcast so that every rank creates the
 * same datasets; rank 0 writes the bytes).  No file, no group. */
static int write_tok(Writer *w, bool parallel, const CkptTokFiles *tok)
{
    bool root = !parallel || comm_rank() == 0;
    int64_t len[TOK_FILES] = { 0, 0, 0 };
    const char *txt[TOK_FILES] = { NULL, NULL, NULL };
    if (root && tok) {
        CkptTokFiles *t = (CkptTokFiles *)tok;
        for (int i = 0; i < TOK_FILES; i++) {
            size_t *n;
            txt[i] = *tok_text(t, i, &n);
            len[i] = txt[i] ? (int64_t)*n : 0;
        }
    }
    if (parallel) comm_bcast(COMM_WORLD, len, sizeof len, 0);
    char name[CKPT_NAME_MAX];
    for (int i = 0; i < TOK_FILES; i++) {
        if (len[i] <= 0) continue;   /* absent (an empty file is not stored) */
        CkptPiece pc;
        memset(&pc, 0, sizeof pc);
        snprintf(name, sizeof name, "tokenizer/%s", g_tok_names[i]);
        pc.name = name;
        pc.ndim = 1;
        pc.shape[0] = (hsize_t)len[i];
        pc.chunk[0] = (hsize_t)td_min((size_t)len[i], TOK_CHUNK);
        pc.cnt[0] = root ? (hsize_t)len[i] : 0;
        pc.data = txt[i];
        pc.type = CKPT_H5_U8;
        if (put_piece(w, &pc)) return -1;
    }
    return 0;
}

/* The moments / weights of plan entry e for this rank as a piece. */
static void piece_of(CkptPiece *pc, const Entry *e, const char *name, const Model *m, const float *slab,
                     bool whole, CkptH5Type type)
{
    memset(pc, 0, sizeof *pc);
    pc->name = name;
    pc->ndim = e->ndim;
    for (int d = 0; d < e->ndim; d++) {
        pc->shape[d] = e->shape[d];
        pc->chunk[d] = e->chunk[d];
    }
    pc->type = type;
    pc->partition = e->partition;
    const Param *p = model_param((Model *)m, e->name);
    TD_CHECK(!whole || p, "checkpoint: the model has no %s", e->name);
    if (!p || (!whole && !writes_param(p, &m->topo))) return;   /* cnt stays 0 */
    for (int d = 0; d < e->ndim; d++) {
        pc->off[d] = whole ? 0 : p->loff[d];
        pc->cnt[d] = whole ? p->shape[d] : p->lshape[d];
    }
    pc->data = slab + p->offset;
}

static int write_root(Writer *w, const ModelConfig *model_cfg, const CkptState *st, const Topology *rec)
{
    hid_t f = w->f;
    char *cfg = config_to_json(model_cfg);
    int rc = ckpt_h5_put_str(f, "format", CKPT_FORMAT) || ckpt_h5_put_i64(f, "format_version", CKPT_FORMAT_VERSION) ||
             ckpt_h5_put_str(f, "config", cfg) || ckpt_h5_put_i64(f, "step", st ? st->step : 0) ||
             ckpt_h5_put_i64(f, "tokens_seen", st ? st->tokens_seen : 0);
    td_free(cfg);
    const char *what = "root attributes";
    if (!rc) {
        what = "group /topology";
        hid_t g = ckpt_h5_group(f, "topology");
        int64_t stages[TOPO_MAX_PP];
        for (int s = 0; s < rec->pp; s++) stages[s] = rec->stage_begin[s + 1] - rec->stage_begin[s];
        rc = g < 0 || ckpt_h5_put_i64(g, "world_size", rec->world) || ckpt_h5_put_i64(g, "dp", rec->dp) ||
             ckpt_h5_put_i64(g, "tp", rec->tp) || ckpt_h5_put_i64(g, "pp", rec->pp) ||
             ckpt_h5_put_i64(g, "ep", rec->ep) || ckpt_h5_put_i64(g, "cp", rec->cp) || ckpt_h5_put_i64s(g, "stage_layers", stages, (size_t)rec->pp);
        if (g >= 0) H5Gclose(g);
    }
    if (rc) {
        ckpt_h5_why(w->err, sizeof w->err);
        writer_fail(w, "%s: cannot write the %s: %.400s", w->path, what, w->err);
    }
    return agree(w->parallel, rc ? -1 : 0);
}

static int write_state(Writer *w, const CkptState *st, const Topology *rec, bool whole)
{
    CkptState zero;
    memset(&zero, 0, sizeof zero);
    if (!st) st = &zero;
    hid_t g = ckpt_h5_group(w->f, "optimizer");
    int rc = g < 0 || ckpt_h5_put_f64(g, "beta1", st->beta1) || ckpt_h5_put_f64(g, "beta2", st->beta2) ||
             ckpt_h5_put_f64(g, "eps", st->adam_eps) || ckpt_h5_put_f64(g, "weight_decay", st->weight_decay) ||
             ckpt_h5_put_i64(g, "step", st->adam_step) || ckpt_h5_put_f64(g, "lr", st->lr);
    if (g >= 0) H5Gclose(g);
    const char *what = "/optimizer";
    if (!rc) {
        what = "/trainer";
        g = ckpt_h5_group(w->f, "trainer");
        rc = g < 0 || ckpt_h5_put_i64(g, "step", st->step) || ckpt_h5_put_i64(g, "tokens_seen", st->tokens_seen) ||
             ckpt_h5_put_i64(g, "micro_batches", st->micro_batches) || ckpt_h5_put_f64(g, "lr", st->lr) ||
             (st->run_config && ckpt_h5_put_str(g, "run_config", st->run_config));
        if (g >= 0) H5Gclose(g);
    }
    if (rc) {
        ckpt_h5_why(w->err, sizeof w->err);
        td_error("%s: cannot write the attributes of %s: %s", w->path, what, w->err);
    }
    if (agree(w->parallel, rc ? -1 : 0)) return -1;

    bool root = whole || !w->parallel || comm_rank() == 0;
    CkptPiece pc;
    memset(&pc, 0, sizeof pc);
    pc.name = "trainer/data_rng";
    pc.ndim = 1;
    pc.shape[0] = pc.chunk[0] = 4;
    pc.cnt[0] = root ? 4 : 0;
    pc.data = st->data_rng;
    pc.type = CKPT_H5_U64;
    if (put_piece(w, &pc)) return -1;

    /* rank_rng: each rank its own row, or rank 0 the whole table */
    bool own_row = st->n_rank_rng == 1 && st->rank_rng && w->parallel && !whole;
    size_t rows = own_row ? (size_t)rec->world : (size_t)(st->n_rank_rng > 0 && st->rank_rng ? st->n_rank_rng : 1);
    uint64_t *zeros = NULL;
    memset(&pc, 0, sizeof pc);
    pc.name = "trainer/rank_rng";
    pc.ndim = 2;
    pc.shape[0] = pc.chunk[0] = rows;
    pc.shape[1] = pc.chunk[1] = 4;
    pc.type = CKPT_H5_U64;
    pc.cnt[1] = 4;
    if (own_row) {
        pc.off[0] = (hsize_t)comm_rank();
        pc.cnt[0] = 1;
        pc.data = st->rank_rng;
    } else if (root) {
        pc.cnt[0] = rows;
        pc.data = st->rank_rng && st->n_rank_rng > 0 ? (const void *)st->rank_rng
                                                     : (const void *)(zeros = td_calloc(rows * 4 * sizeof(uint64_t)));
    } else {
        pc.cnt[0] = 0;
    }
    rc = put_piece(w, &pc);
    td_free(zeros);
    return rc;
}

static int save_impl(const char *path, const Model *m, const float *ea, const float *eas, const CkptState *st,
                     CkptDtype dtype, const Topology *rec, bool whole)
{
    bool parallel = !whole && m->topo.world > 1;
    if (parallel && (!comm_active() || comm_size() != m->topo.world)) {
        td_error("%s: the model is split over %d ranks but the job has %d", path, m->topo.world, comm_size());
        return -1;
    }
    TD_CHECK((ea == NULL) == (eas == NULL), "ckpt_save: exp_avg and exp_avg_sq go together");
    Writer w = { -1, parallel, path, { NULL, 0, -1, 0, 0, 0 }, "", false };
    Plan pl = { NULL, 0 };
    char err[ERR_MAX];
    if (plan_build(&pl, &m->cfg, rec, err, sizeof err)) {
        td_error("%s: %s", path, err);
        return -1;
    }
    char *tmp = td_sprintf("%s.tmp", path);
    bool root = !parallel || comm_rank() == 0;
    int rc = -1;

    w.f = ckpt_h5_create(tmp, parallel ? comm_mpi_handle(COMM_WORLD) : NULL);
    if (w.f < 0) {
        ckpt_h5_why(w.err, sizeof w.err);
        td_error("%s: cannot create %s: %s (%s)", path, tmp, w.err, strerror(errno));
    }
    if (agree(parallel, w.f < 0 ? -1 : 0)) goto out;
    /* a single writer starts the disk early (ckpt_io_write_chunks), so the
     * final fsync has little left to do */
    if (!parallel) w.scratch.fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (write_root(&w, &m->cfg, st, rec)) goto out;
    if (write_tok(&w, parallel, st ? &st->tok : NULL)) goto out;

    char name[CKPT_NAME_MAX];
    for (int i = 0; i < pl.n; i++) {
        const Entry *e = &pl.e[i];
        CkptPiece pc;
        piece_of(&pc, e, e->name, m, m->w, whole, e->ndim >= 2 ? h5type_of(dtype) : CKPT_H5_F32);
        if (put_piece(&w, &pc)) goto out;
    }
    if (ea) {
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < pl.n; i++) {
                const Entry *e = &pl.e[i];
                snprintf(name, sizeof name, "optimizer/%s/%s", k ? "exp_avg_sq" : "exp_avg", e->name);
                CkptPiece pc;
                piece_of(&pc, e, name, m, k ? eas : ea, whole, CKPT_H5_F32);
                if (put_piece(&w, &pc)) goto out;
            }
        }
        if (write_state(&w, st, rec, whole)) goto out;
    }

    /* Flush and close (collective), then make the bytes durable before the
     * rename publishes them. */
    int frc = H5Fflush(w.f, H5F_SCOPE_GLOBAL) < 0 ? -1 : 0;
    frc |= H5Fclose(w.f) < 0 ? -1 : 0;
    w.f = -1;
    if (frc) {
        ckpt_h5_why(w.err, sizeof w.err);
        td_error("%s: cannot flush %s: %s", path, tmp, w.err);
    }
    if (agree(parallel, frc)) goto out;
    int prc = 0;
    if (root) {
        char *dir = dir_of(path);
        if (fsync_path(tmp, false) || rename(tmp, path) || fsync_path(dir, true)) {
            td_error("%s: cannot publish %s: %s", path, tmp, strerror(errno));
            prc = -1;
        }
        td_free(dir);
    }
    rc = agree(parallel, prc);
out:
    if (w.f >= 0) H5Fclose(w.f);
    ckpt_io_scratch_free(&w.scratch);
    if (w.scratch.fd >= 0) close(w.scratch.fd);
    if (rc && root) unlink(tmp);
    td_free(tmp);
    plan_free(&pl);
    return rc;
}

int ckpt_save(const char *path, const Model *m, const float *exp_avg, const float *exp_avg_sq,
              const CkptState *st, CkptDtype dtype)
{
    return save_impl(path, m, exp_avg, exp_avg_sq, st, dtype, &m->topo, m->topo.world == 1);
}

int ckpt_export(const char *path, const Model *m, const float *exp_avg, const float *exp_avg_sq,
                const CkptState *st, CkptDtype dtype, const Topology *as)
{
    TD_CHECK(m->topo.world == 1, "ckpt_export: the model must hold whole tensors (one rank)");
    return save_impl(path, m, exp_avg, exp_avg_sq, st, dtype, as ? as : &m->topo, true);
}

/* ---------------------------------------------------------------- streaming writes */

struct CkptStream {
    Writer w;
    Plan pl;
    bool *done;
    char *path, *tmp;   /* owned */
};

static void stream_discard(CkptStream *s)
{
    if (s->w.f >= 0) H5Fclose(s->w.f);
    s->w.f = -1;
    ckpt_io_scratch_free(&s->w.scratch);
    if (s->w.scratch.fd >= 0) close(s->w.scratch.fd);
    s->w.scratch.fd = -1;
    unlink(s->tmp);
}

int ckpt_stream_open(CkptStream **out, const char *path, const ModelConfig *cfg, const CkptTokFiles *tok, char *err,
                     size_t err_len)
{
    *out = NULL;
    CkptStream *s = td_calloc(sizeof *s);
    s->path = td_strdup(path);
    s->tmp = td_sprintf("%s.tmp", path);
    s->w = (Writer){ -1, false, s->path, { NULL, 0, -1, 0, 0, 0 }, "", true };
    Topology t;
    topo_single(&t, cfg);
    char why[ERR_MAX];
    if (plan_build(&s->pl, cfg, &t, why, sizeof why)) {
        snprintf(err, err_len, "%s: %s", path, why);
        td_free(s->path);
        td_free(s->tmp);
        td_free(s);
        return -1;
    }
    s->done = td_calloc((size_t)td_max((size_t)s->pl.n, 1));
    s->w.f = ckpt_h5_create(s->tmp, NULL);
    if (s->w.f < 0) {
        ckpt_h5_why(why, sizeof why);
        snprintf(err, err_len, "%s: cannot create %s: %s (%s)", path, s->tmp, why, strerror(errno));
        ckpt_stream_close(s, false, NULL, 0);
        return -1;
    }
    s->w.scratch.fd = open(s->tmp, O_RDONLY | O_CLOEXEC);
    if (write_root(&s->w, cfg, NULL, &t) || write_tok(&s->w, false, tok)) {
        snprintf(err, err_len, "%s", s->w.err);
        ckpt_stream_close(s, false, NULL, 0);
        return -1;
    }
    *out = s;
    return 0;
}

int ckpt_stream_count(const CkptStream *s) { return s->pl.n; }

const char *ckpt_stream_tensor(const CkptStream *s, int i, int *ndim, size_t *shape)
{
    const Entry *e = &s->pl.e[i];
    *ndim = e->ndim;
    for (int d = 0; d < e->ndim; d++) shape[d] = (size_t)e->shape[d];
    return e->name;
}

int ckpt_stream_put(CkptStream *s, const char *name, const void *data, bool raw, CkptDtype dtype,
                    const char *attr_key, const char *attr_val, char *err, size_t err_len)
{
    int i = 0;
    while (i < s->pl.n && strcmp(s->pl.e[i].name, name)) i++;
    if (i == s->pl.n || s->done[i]) {
        snprintf(err, err_len, "%s: tensor %s %s", s->path, name, i == s->pl.n ? "is not in the model" : "written twice");
        return -1;
    }
    const Entry *e = &s->pl.e[i];
    CkptPiece pc;
    memset(&pc, 0, sizeof pc);
    pc.name = e->name;
    pc.ndim = e->ndim;
    for (int d = 0; d < e->ndim; d++) {
        pc.shape[d] = pc.cnt[d] = e->shape[d];
        pc.chunk[d] = e->chunk[d];
    }
    pc.type = e->ndim >= 2 ? h5type_of(dtype) : CKPT_H5_F32;
    pc.raw = raw;
    if (raw && pc.type != CKPT_H5_BF16 && pc.type != CKPT_H5_F16) {
        snprintf(err, err_len, "%s: tensor %s: raw 16-bit data for a %s dataset", s->path, name,
                 ckpt_dtype_name(e->ndim >= 2 ? dtype : CKPT_F32));
        return -1;
    }
    pc.partition = e->partition;
    pc.data = data;
    if (put_piece(&s->w, &pc)) {
        snprintf(err, err_len, "%s", s->w.err);
        return -1;
    }
    if (attr_key) {
        hid_t ds = H5Dopen2(s->w.f, e->name, H5P_DEFAULT);
        int rc = ds < 0 || ckpt_h5_put_str(ds, attr_key, attr_val);
        if (ds >= 0) H5Dclose(ds);
        if (rc) {
            ckpt_h5_why(s->w.err, sizeof s->w.err);
            snprintf(err, err_len, "%s: dataset /%s: cannot write attribute %s: %s", s->path, e->name, attr_key, s->w.err);
            return -1;
        }
    }
    s->done[i] = true;
    H5garbage_collect();
    return 0;
}

int ckpt_stream_root_attr(CkptStream *s, const char *key, const char *value, char *err, size_t err_len)
{
    if (ckpt_h5_put_str(s->w.f, key, value)) {
        ckpt_h5_why(s->w.err, sizeof s->w.err);
        snprintf(err, err_len, "%s: cannot write attribute %s: %s", s->path, key, s->w.err);
        return -1;
    }
    return 0;
}

int ckpt_stream_close(CkptStream *s, bool commit, char *err, size_t err_len)
{
    if (!s) return 0;
    int rc = 0;
    for (int i = 0; commit && i < s->pl.n; i++)
        if (!s->done[i]) {
            snprintf(err, err_len, "%s: tensor %s was never written: nothing saved", s->path, s->pl.e[i].name);
            commit = false;
            rc = -1;
        }
    if (commit) {
        int frc = H5Fflush(s->w.f, H5F_SCOPE_GLOBAL) < 0 ? -1 : 0;
        frc |= H5Fclose(s->w.f) < 0 ? -1 : 0;
        s->w.f = -1;
        char *dir = dir_of(s->path);
        if (frc) {
            ckpt_h5_why(s->w.err, sizeof s->w.err);
            snprintf(err, err_len, "%s: cannot flush %s: %s", s->path, s->tmp, s->w.err);
            rc = -1;
        } else if (fsync_path(s->tmp, false) || rename(s->tmp, s->path) || fsync_path(dir, true)) {
            snprintf(err, err_len, "%s: cannot publish %s: %s", s->path, s->tmp, strerror(errno));
            rc = -1;
        }
        td_free(dir);
    }
    if (!commit || rc) stream_discard(s);
    else {
        ckpt_io_scratch_free(&s->w.scratch);
        if (s->w.scratch.fd >= 0) close(s->w.scratch.fd);
    }
    plan_free(&s->pl);
    td_free(s->done);
    td_free(s->path);
    td_free(s->tmp);
    td_free(s);
    return rc;
}

/* ---------------------------------------------------------------- opening and root checks */

/* Opens path read-only with a one-line reason on failure. */
static hid_t open_checked(const char *path, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(path, &sb)) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "%s: is a directory (give a checkpoint file, a run directory with latest, or a Hugging "
                 "Face model directory: config.json and safetensors)", path);
        return -1;
    }
    hid_t f = ckpt_h5_open(path);
    if (f < 0) {
        char why[300];
        ckpt_h5_why(why, sizeof why);
        if (strstr(why, "truncated"))
            snprintf(err, err_len, "%s: file is truncated (%lld bytes): refusing to read it", path,
                     (long long)sb.st_size);
        else
            snprintf(err, err_len, "%s: not a readable HDF5 file (truncated or corrupt?): %s", path, why);
    }
    return f;
}

/* format, format_version, config (parsed into cfg, text into *cfg_json if
 * not NULL). */
static int check_root(hid_t f, const char *path, ModelConfig *cfg, char **cfg_json, char *err, size_t err_len)
{
    char *s = NULL;
    int r = ckpt_h5_get_str(f, "format", &s);
    if (r) {
        snprintf(err, err_len, "%s: attribute format %s: not a tandem checkpoint", path,
                 r == -1 ? "is missing" : "is not a string");
        return -1;
    }
    if (strcmp(s, CKPT_FORMAT)) {
        snprintf(err, err_len, "%s: attribute format is \"%.60s\", expected \"%s\"", path, s, CKPT_FORMAT);
        td_free(s);
        return -1;
    }
    td_free(s);
    int64_t v;
    r = ckpt_h5_get_i64(f, "format_version", &v);
    if (r) {
        snprintf(err, err_len, "%s: attribute format_version %s", path,
                 r == -1 ? "is missing" : "is not an integer");
        return -1;
    }
    if (v != CKPT_FORMAT_VERSION) {
        snprintf(err, err_len, "%s: attribute format_version is %lld; this tandem reads version %d", path,
                 (long long)v, CKPT_FORMAT_VERSION);
        return -1;
    }
    s = NULL;
    r = ckpt_h5_get_str(f, "config", &s);
    if (r) {
        snprintf(err, err_len, "%s: attribute config %s", path, r == -1 ? "is missing" : "is not a string");
        return -1;
    }
    char why[300];
    if (config_parse(cfg, s, why, sizeof why)) {
        snprintf(err, err_len, "%s: attribute config: %s", path, why);
        td_free(s);
        return -1;
    }
    if (cfg_json) *cfg_json = s;
    else td_free(s);
    return 0;
}

/* First key whose value differs between two configs, NULL when equal. */
static const char *config_diff(const ModelConfig *a, const ModelConfig *b, char *key, size_t n)
{
    char *ja = config_to_json(a), *jb = config_to_json(b);
    cJSON *oa = cJSON_Parse(ja), *ob = cJSON_Parse(jb);
    const char *res = NULL;
    for (cJSON *it = oa ? oa->child : NULL; it && !res; it = it->next) {
        cJSON *o = cJSON_GetObjectItemCaseSensitive(ob, it->string);
        if (!o || !cJSON_Compare(it, o, 1)) {
            snprintf(key, n, "%s", it->string);
            res = key;
        }
    }
    if (!res && strcmp(ja, jb)) {
        snprintf(key, n, "?");
        res = key;
    }
    cJSON_Delete(oa);
    cJSON_Delete(ob);
    td_free(ja);
    td_free(jb);
    return res;
}

static int read_meta(hid_t f, const char *path, CkptMeta *meta, char *err, size_t err_len)
{
    memset(meta, 0, sizeof *meta);
    meta->format_version = CKPT_FORMAT_VERSION;
    if (ckpt_h5_get_i64(f, "step", &meta->step) || ckpt_h5_get_i64(f, "tokens_seen", &meta->tokens_seen)) {
        snprintf(err, err_len, "%s: attribute %s is missing or not an integer", path,
                 ckpt_h5_get_i64(f, "step", &meta->step) ? "step" : "tokens_seen");
        return -1;
    }
    if (!ckpt_h5_exists(f, "topology")) {
        snprintf(err, err_len, "%s: group /topology is missing", path);
        return -1;
    }
    hid_t g = H5Gopen2(f, "topology", H5P_DEFAULT);
    static const char *keys[5] = { "world_size", "dp", "tp", "pp", "ep" };
    int *dst[5] = { &meta->world, &meta->dp, &meta->tp, &meta->pp, &meta->ep };
    int rc = 0;
    for (int i = 0; i < 5 && !rc; i++) {
        int64_t v;
        if (g < 0 || ckpt_h5_get_i64(g, keys[i], &v) || v < 1 || v > INT32_MAX) {
            snprintf(err, err_len, "%s: attribute /topology/%s is missing or invalid", path, keys[i]);
            rc = -1;
        } else {
            *dst[i] = (int)v;
        }
    }
    /* cp (SPEC section 12): absent in checkpoints from before it, 1 */
    int64_t cp = 1;
    if (!rc && ckpt_h5_get_i64(g, "cp", &cp) == 0 && (cp < 1 || cp > INT32_MAX)) {
        snprintf(err, err_len, "%s: attribute /topology/cp is invalid", path);
        rc = -1;
    }
    meta->cp = (int)cp;
    if (g >= 0) H5Gclose(g);
    if (rc) return -1;
    CkptH5Desc d;
    meta->dtype = CKPT_F32;
    if (ckpt_h5_describe(f, "model/embed_tokens", &d) == 0)
        meta->dtype = d.type == CKPT_H5_BF16 ? CKPT_BF16 : d.type == CKPT_H5_F16 ? CKPT_F16 : CKPT_F32;
    meta->has_optimizer = ckpt_h5_exists(f, "optimizer");
    meta->has_trainer = ckpt_h5_exists(f, "trainer");
    return 0;
}

bool ckpt_is_hf_dir(const char *path) { return hf_is_dir(path); }

int ckpt_read_config(const char *path, ModelConfig *cfg, CkptMeta *meta, char *err, size_t err_len)
{
    if (hf_is_dir(path)) return hf_read_config(path, cfg, meta, err, err_len);
    hid_t f = open_checked(path, err, err_len);
    if (f < 0) return -1;
    int rc = check_root(f, path, cfg, NULL, err, err_len);
    CkptMeta tmp;
    if (!rc) rc = read_meta(f, path, meta ? meta : &tmp, err, err_len);
    H5Fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- dataset checks */

/* Dataset `name` exists, has rank ndim and the given shape, and a float
 * type tandem reads (float32, float16, bfloat16) -- or, when q8_ok, int8
 * g32 with its scales (a quantized checkpoint, ckpt_serve.h); fills d. */
static int check_float_dataset(hid_t f, const char *path, const char *name, int ndim, const size_t *shape,
                               CkptH5Desc *d, bool q8_ok, char *err, size_t err_len)
{
    if (ckpt_h5_describe(f, name, d)) {
        snprintf(err, err_len, "%s: dataset /%s is missing", path, name);
        return -1;
    }
    hsize_t want[CKPT_H5_MAX_DIMS];
    bool same = d->ndim == ndim;
    for (int i = 0; i < ndim; i++) {
        want[i] = shape[i];
        if (same && d->shape[i] != want[i]) same = false;
    }
    if (!same) {
        char got[96], exp[96];
        fmt_shape(got, sizeof got, d->ndim < 0 ? 0 : d->ndim, d->shape);
        fmt_shape(exp, sizeof exp, ndim, want);
        snprintf(err, err_len, "%s: dataset /%s: shape %s does not match the config %s", path, name, got, exp);
        return -1;
    }
    if (d->type == CKPT_H5_I8) {
        CkptH5Desc sd;
        if (q8_ok) return ckpt_q8_check(f, path, name, ndim, shape, &sd, err, err_len);
        snprintf(err, err_len,
                 "%s: dataset /%s is int8 (a quantized serving checkpoint): this needs float weights; use the float "
                 "checkpoint it was quantized from",
                 path, name);
        return -1;
    }
    if (d->type != CKPT_H5_F32 && d->type != CKPT_H5_BF16 && d->type != CKPT_H5_F16) {
        snprintf(err, err_len, "%s: dataset /%s: dtype %s is not float32, float16 or bfloat16", path, name,
                 d->type_name);
        return -1;
    }
    return 0;
}

static int check_u64_dataset(hid_t f, const char *path, const char *name, int ndim, const hsize_t *shape,
                             bool any_rows, CkptH5Desc *d, char *err, size_t err_len)
{
    if (ckpt_h5_describe(f, name, d)) {
        snprintf(err, err_len, "%s: dataset /%s is missing", path, name);
        return -1;
    }
    bool ok = d->ndim == ndim && d->type == CKPT_H5_U64;
    for (int i = any_rows ? 1 : 0; ok && i < ndim; i++) ok = d->shape[i] == shape[i];
    if (!ok) {
        char exp[96];
        fmt_shape(exp, sizeof exp, ndim, shape);
        snprintf(err, err_len, "%s: dataset /%s: expected uint64 %s%s, found %s", path, name,
                 any_rows ? "[*," : "", any_rows ? exp + 3 : exp, d->type_name);
        return -1;
    }
    return 0;
}

/* Trainer and optimizer attributes into st (datasets are read separately). */
static int read_state_attrs(hid_t f, const char *path, CkptState *st, char *err, size_t err_len)
{
    hid_t g = H5Gopen2(f, "optimizer", H5P_DEFAULT);
    const char *bad = NULL;
    if (g < 0) bad = "/optimizer";
    else {
        if (ckpt_h5_get_f64(g, "beta1", &st->beta1)) bad = "/optimizer/beta1";
        else if (ckpt_h5_get_f64(g, "beta2", &st->beta2)) bad = "/optimizer/beta2";
        else if (ckpt_h5_get_f64(g, "eps", &st->adam_eps)) bad = "/optimizer/eps";
        else if (ckpt_h5_get_f64(g, "weight_decay", &st->weight_decay)) bad = "/optimizer/weight_decay";
        else if (ckpt_h5_get_i64(g, "step", &st->adam_step)) bad = "/optimizer/step";
        H5Gclose(g);
    }
    if (!bad) {
        g = H5Gopen2(f, "trainer", H5P_DEFAULT);
        if (g < 0) bad = "/trainer";
        else {
            if (ckpt_h5_get_i64(g, "step", &st->step)) bad = "/trainer/step";
            else if (ckpt_h5_get_i64(g, "tokens_seen", &st->tokens_seen)) bad = "/trainer/tokens_seen";
            else if (ckpt_h5_get_i64(g, "micro_batches", &st->micro_batches)) bad = "/trainer/micro_batches";
            else if (ckpt_h5_get_f64(g, "lr", &st->lr)) bad = "/trainer/lr";
            td_free(st->run_config);
            st->run_config = NULL;
            if (!bad && ckpt_h5_get_str(g, "run_config", &st->run_config) == -2) bad = "/trainer/run_config";
            H5Gclose(g);
        }
    }
    if (bad) {
        snprintf(err, err_len, "%s: attribute or group %s is missing or invalid", path, bad);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- loading */

typedef struct {
    CkptH5Desc w, ea, eas;
} ParamDesc;

/* The /tokenizer datasets a load found. */
typedef struct {
    CkptH5Desc d[TOK_FILES];
    bool have[TOK_FILES];
} TokDesc;

static int load_validate(hid_t f, const char *path, const Model *m, bool moments, CkptState *st, ParamDesc *pd,
                         CkptH5Desc *drng, CkptH5Desc *rrng, bool *trainer, TokDesc *td, char *err, size_t err_len)
{
    ModelConfig cfg;
    if (check_root(f, path, &cfg, NULL, err, err_len)) return -1;
    char key[64];
    if (config_diff(&cfg, &m->cfg, key, sizeof key)) {
        snprintf(err, err_len, "%s: attribute config: \"%s\" differs from the model being loaded", path, key);
        return -1;
    }
    CkptMeta meta;
    if (read_meta(f, path, &meta, err, err_len)) return -1;
    char name[CKPT_NAME_MAX];
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        if (check_float_dataset(f, path, p->name, p->ndim, p->shape, &pd[i].w, false, err, err_len)) return -1;
        if (!moments) continue;
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "optimizer/%s/%s", k ? "exp_avg_sq" : "exp_avg", p->name);
            if (!meta.has_optimizer) {
                snprintf(err, err_len, "%s: group /optimizer is missing (a weights-only checkpoint cannot resume training)",
                         path);
                return -1;
            }
            if (check_float_dataset(f, path, name, p->ndim, p->shape, k ? &pd[i].eas : &pd[i].ea, false, err, err_len))
                return -1;
        }
    }
    *trainer = meta.has_trainer && meta.has_optimizer;
    if (moments && !*trainer) {
        snprintf(err, err_len, "%s: group /%s is missing", path, meta.has_optimizer ? "trainer" : "optimizer");
        return -1;
    }
    if (st && *trainer) {
        if (read_state_attrs(f, path, st, err, err_len)) return -1;
        static const hsize_t s4[1] = { 4 }, s24[2] = { 1, 4 };
        if (check_u64_dataset(f, path, "trainer/data_rng", 1, s4, false, drng, err, err_len)) return -1;
        if (check_u64_dataset(f, path, "trainer/rank_rng", 2, s24, true, rrng, err, err_len)) return -1;
    }
    if (st) {
        st->step = meta.step;
        st->tokens_seen = meta.tokens_seen;
        if (tok_validate(f, path, td->d, td->have, err, err_len)) return -1;
    }
    return 0;
}

static int queue_param(CkptIoRead *rd, const char *name, const CkptH5Desc *d, const Param *p, float *dst, char *err,
                       size_t err_len)
{
    hsize_t off[CKPT_H5_MAX_DIMS], cnt[CKPT_H5_MAX_DIMS];
    for (int i = 0; i < p->ndim; i++) {
        off[i] = p->loff[i];
        cnt[i] = p->lshape[i];
    }
    return ckpt_io_read_add(rd, name, d, off, cnt, dst, err, err_len);
}

/* Reads this rank's boxes: every chunk they touch, once, on the pool. */
static int load_data(hid_t f, const char *path, Model *m, float *ea, float *eas, CkptState *st, const ParamDesc *pd,
                     const CkptH5Desc *drng, const CkptH5Desc *rrng, bool trainer, const TokDesc *td, char *err,
                     size_t err_len)
{
    char name[CKPT_NAME_MAX], why[ERR_MAX];
    CkptIoRead *rd = ckpt_io_read_new(path, f, err, err_len);
    if (!rd) return -1;
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        if (queue_param(rd, p->name, &pd[i].w, p, m->w + p->offset, why, sizeof why)) goto fail;
        for (int k = 0; ea && k < 2; k++) {
            snprintf(name, sizeof name, "optimizer/%s/%s", k ? "exp_avg_sq" : "exp_avg", p->name);
            if (queue_param(rd, name, k ? &pd[i].eas : &pd[i].ea, p, (k ? eas : ea) + p->offset, why, sizeof why))
                goto fail;
        }
    }
    if (st && trainer) {
        hsize_t off[2] = { 0, 0 }, cnt4[1] = { 4 };
        td_free(st->rank_rng);
        st->n_rank_rng = (int)rrng->shape[0];
        st->rank_rng = td_calloc(rrng->shape[0] * 4 * sizeof(uint64_t));
        if (ckpt_io_read_add(rd, "trainer/data_rng", drng, off, cnt4, st->data_rng, why, sizeof why) ||
            ckpt_io_read_add(rd, "trainer/rank_rng", rrng, off, rrng->shape, st->rank_rng, why, sizeof why))
            goto fail;
        st->has_trainer = true;
    }
    if (st && tok_read(f, rd, td->d, td->have, &st->tok, why, sizeof why)) goto fail;
    if (ckpt_io_read_run(rd, why, sizeof why)) goto fail;
    ckpt_io_read_free(rd);
    return 0;
fail:
    ckpt_io_read_free(rd);
    snprintf(err, err_len, "%s: %s", path, why);
    return -1;
}

/* ckpt_load of a Hugging Face directory: weights (this rank's slices) and
 * its tokenizer files; no optimizer or trainer state. */
static int load_hf(const char *path, Model *m, bool moments, CkptState *st, bool parallel, char *err, size_t err_len)
{
    int rc = 0;
    if (moments) {
        snprintf(err, err_len, "%s: a Hugging Face directory holds no optimizer state (start from it with init_from, "
                 "or import it: tandem ckpt import)", path);
        rc = -1;
    }
    if (!rc && st) rc = ckpt_tok_files_from_dir(path, &st->tok, err, err_len);
    if (!rc) rc = hf_load(path, m, err, err_len);
    bool failed_here = rc != 0;
    rc = agree(parallel, rc);
    if (rc) {
        share_error(parallel, failed_here, err, err_len);
        memset(m->w, 0, m->n_w * sizeof(float));
        if (st) {
            ckpt_state_free(st);
            memset(st, 0, sizeof *st);
        }
    }
    return rc;
}

int ckpt_load(const char *path, Model *m, float *exp_avg, float *exp_avg_sq, CkptState *st, char *err,
              size_t err_len)
{
    TD_CHECK((exp_avg == NULL) == (exp_avg_sq == NULL), "ckpt_load: exp_avg and exp_avg_sq go together");
    bool parallel = m->topo.world > 1;
    if (parallel && (!comm_active() || comm_size() != m->topo.world)) {
        snprintf(err, err_len, "%s: the model is split over %d ranks but the job has %d", path, m->topo.world,
                 comm_size());
        return -1;
    }
    if (st) memset(st, 0, sizeof *st);
    if (hf_is_dir(path)) return load_hf(path, m, exp_avg != NULL, st, parallel, err, err_len);
    ParamDesc *pd = td_calloc((size_t)td_max((size_t)m->n_params, 1) * sizeof(ParamDesc));
    CkptH5Desc drng, rrng;
    TokDesc td;
    memset(&td, 0, sizeof td);
    bool trainer = false;
    int rc = 0;
    hid_t f = open_checked(path, err, err_len);
    if (f < 0) rc = -1;
    if (!rc)
        rc = load_validate(f, path, m, exp_avg != NULL, st, pd, &drng, &rrng, &trainer, &td, err, err_len);
    bool failed_here = rc != 0;
    rc = agree(parallel, rc);
    if (rc) {
        share_error(parallel, failed_here, err, err_len);
        goto out;
    }
    rc = load_data(f, path, m, exp_avg, exp_avg_sq, st, pd, &drng, &rrng, trainer, &td, err, err_len);
    failed_here = rc != 0;
    rc = agree(parallel, rc);
    if (rc) {
        /* never leave a partial model behind */
        share_error(parallel, failed_here, err, err_len);
        memset(m->w, 0, m->n_w * sizeof(float));
        if (exp_avg) {
            memset(exp_avg, 0, m->n_w * sizeof(float));
            memset(exp_avg_sq, 0, m->n_w * sizeof(float));
        }
        if (st) {
            ckpt_state_free(st);
            memset(st, 0, sizeof *st);
        }
    }
out:
    if (f >= 0) H5Fclose(f);
    td_free(pd);
    return rc;
}

/* ---------------------------------------------------------------- listing and verifying */

typedef struct {
    char (*names)[CKPT_NAME_MAX];
    int n, cap;
    char too_long[CKPT_NAME_MAX];   /* the start of a name that does not fit, "" if none */
} NameList;

static herr_t visit_cb(hid_t g, const char *name, const H5L_info_t *info, void *data)
{
    (void)g;
    (void)info;
    NameList *l = data;
    if (strlen(name) >= CKPT_NAME_MAX) {   /* no tandem name is that long: say so, do not cut it */
        if (!l->too_long[0]) memcpy(l->too_long, name, sizeof l->too_long - 1);   /* its start, for the message */
        return 0;
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        char(*nn)[CKPT_NAME_MAX] = td_malloc((size_t)l->cap * CKPT_NAME_MAX);
        if (l->n) memcpy(nn, l->names, (size_t)l->n * CKPT_NAME_MAX);
        td_free(l->names);
        l->names = nn;
    }
    snprintf(l->names[l->n++], CKPT_NAME_MAX, "%s", name);
    return 0;
}

/* Every dataset of the file (names without '/'), in checkpoint order:
 * weights as the plan lists them, then exp_avg, exp_avg_sq, the trainer's,
 * then anything else by name. */
typedef struct {
    const char *name;
    long rank;
} Ranked;

static int cmp_ranked(const void *a, const void *b)
{
    const Ranked *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

static long canonical_rank(const Plan *pl, const char *name)
{
    long n = pl->n;
    const char *base = name;
    long group = 0;
    if (!strncmp(name, "optimizer/exp_avg/", 18)) base = name + 18, group = 1;
    else if (!strncmp(name, "optimizer/exp_avg_sq/", 21)) base = name + 21, group = 2;
    else if (!strcmp(name, "trainer/data_rng")) return 3 * n;
    else if (!strcmp(name, "trainer/rank_rng")) return 3 * n + 1;
    for (long i = 0; i < n; i++)
        if (!strcmp(pl->e[i].name, base)) return group * n + i;
    return 3 * n + 2;
}

/* Returns the count, or -1 with err (the walk failed, or a name is longer
 * than any of tandem's: listing it cut would drop it from info and verify
 * without a word). */
static int list_datasets(hid_t f, const ModelConfig *cfg, Ranked **out, NameList *names, const char *path,
                         char *err, size_t err_len)
{
    memset(names, 0, sizeof *names);
    *out = NULL;
    if (H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, visit_cb, names) < 0 || names->too_long[0]) {
        if (names->too_long[0])
            snprintf(err, err_len, "%s: the object /%.*s... has a name of %d bytes or more; tandem's are shorter",
                     path, 60, names->too_long, CKPT_NAME_MAX);
        else {
            char why[ERR_MAX];
            ckpt_h5_why(why, sizeof why);
            snprintf(err, err_len, "%s: cannot list the datasets: %s", path, why);
        }
        td_free(names->names);
        names->names = NULL;
        return -1;
    }
    Plan pl;
    Topology t;
    topo_single(&t, cfg);
    char perr[256];
    if (plan_build(&pl, cfg, &t, perr, sizeof perr)) pl.n = 0;   /* then ranked by name only */
    Ranked *r = td_malloc((size_t)td_max((size_t)names->n, 1) * sizeof(Ranked));
    int n = 0;
    for (int i = 0; i < names->n; i++) {
        /* datasets only (groups are skipped) */
        H5I_type_t ty = H5I_BADID;
        hid_t o = H5Oopen(f, names->names[i], H5P_DEFAULT);
        if (o >= 0) {
            ty = H5Iget_type(o);
            H5Oclose(o);
        }
        if (ty != H5I_DATASET) continue;
        r[n].name = names->names[i];
        r[n].rank = canonical_rank(&pl, names->names[i]);
        n++;
    }
    H5Eclear2(H5E_DEFAULT);
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    plan_free(&pl);
    *out = r;
    return n;
}

int ckpt_info(const char *path, CkptInfo *info, char *err, size_t err_len)
{
    memset(info, 0, sizeof *info);
    hid_t f = open_checked(path, err, err_len);
    if (f < 0) return -1;
    int rc = check_root(f, path, &info->cfg, &info->config_json, err, err_len);
    if (!rc) rc = read_meta(f, path, &info->meta, err, err_len);
    if (!rc && info->meta.has_optimizer && info->meta.has_trainer) {
        char why[ERR_MAX];
        if (read_state_attrs(f, path, &info->st, why, sizeof why) == 0) info->st.has_trainer = true;
    }
    if (!rc) {
        Ranked *r;
        NameList names;
        int n = list_datasets(f, &info->cfg, &r, &names, path, err, err_len);
        if (n < 0) rc = -1;
        if (n < 0) n = 0;
        info->tensors = td_calloc((size_t)td_max((size_t)n, 1) * sizeof(CkptTensor));
        for (int i = 0; i < n; i++) {
            CkptTensor *t = &info->tensors[info->n_tensors];
            CkptH5Desc d;
            if (ckpt_h5_describe(f, r[i].name, &d)) continue;
            snprintf(t->name, sizeof t->name, "%s", r[i].name);
            t->ndim = d.ndim < 0 ? 0 : d.ndim;
            t->numel = 1;
            for (int k = 0; k < t->ndim; k++) {
                t->shape[k] = (size_t)d.shape[k];
                t->chunk[k] = (size_t)d.chunk[k];
                t->numel *= t->shape[k];
            }
            snprintf(t->dtype, sizeof t->dtype, "%s", d.type_name);
            t->bytes = t->numel * d.elem;
            t->stored_bytes = d.stored_bytes;
            hid_t ds = H5Dopen2(f, r[i].name, H5P_DEFAULT);
            char *part = NULL;
            if (ds >= 0 && ckpt_h5_get_str(ds, "partition", &part) == 0) {
                snprintf(t->partition, sizeof t->partition, "%s", part);
                td_free(part);
            }
            if (ds >= 0) H5Dclose(ds);
            info->n_tensors++;
        }
        td_free(r);
        td_free(names.names);
        struct stat sb;
        if (!stat(path, &sb)) info->file_bytes = (size_t)sb.st_size;
    }
    H5Fclose(f);
    if (rc) ckpt_info_free(info);
    return rc;
}

void ckpt_info_free(CkptInfo *info)
{
    td_free(info->config_json);
    td_free(info->tensors);
    ckpt_state_free(&info->st);
    memset(info, 0, sizeof *info);
}

/* Reads dataset name in blocks along dim 0 (every byte passes the
 * checksum); keeps memory to about one block. */
static int read_all(hid_t f, const char *path, const char *name, const CkptH5Desc *d, char *err, size_t err_len)
{
    if (d->type == CKPT_H5_OTHER || d->ndim < 1) return 0;   /* not ours: nothing to check */
    size_t row = 1;
    for (int i = 1; i < d->ndim; i++) row *= (size_t)d->shape[i];
    size_t esize = ckpt_h5_mem_size(d->type);
    size_t rows = td_max(1, (64u << 20) / td_max(row * esize, 1));
    if (d->chunk[0]) rows = td_max(rows / d->chunk[0], 1) * d->chunk[0];
    rows = td_min(rows, (size_t)d->shape[0]);
    void *buf = td_malloc(td_max(rows * row * esize, 1));
    hsize_t off[CKPT_H5_MAX_DIMS] = { 0 }, cnt[CKPT_H5_MAX_DIMS];
    for (int i = 0; i < d->ndim; i++) cnt[i] = d->shape[i];
    int rc = 0;
    char why[ERR_MAX];
    for (size_t r0 = 0; r0 < d->shape[0] && !rc; r0 += rows) {
        off[0] = r0;
        cnt[0] = td_min(rows, (size_t)d->shape[0] - r0);
        if (ckpt_h5_read_box(f, name, d, off, cnt, buf, why, sizeof why)) {
            snprintf(err, err_len, "%s: %s", path, why);
            rc = -1;
        }
    }
    td_free(buf);
    return rc;
}

int ckpt_verify(const char *path, char *err, size_t err_len)
{
    ModelConfig cfg;
    hid_t f = open_checked(path, err, err_len);
    if (f < 0) return -1;
    CkptMeta meta;
    int rc = check_root(f, path, &cfg, NULL, err, err_len);
    if (!rc) rc = read_meta(f, path, &meta, err, err_len);
    if (!rc && meta.world != meta.dp * meta.tp * meta.pp * meta.cp) {
        snprintf(err, err_len, "%s: /topology: world_size %d is not dp*tp*pp*cp = %d", path, meta.world,
                 meta.dp * meta.tp * meta.pp * meta.cp);
        rc = -1;
    }
    Plan pl = { NULL, 0 };
    Topology t;
    if (!rc) {
        topo_single(&t, &cfg);
        rc = plan_build(&pl, &cfg, &t, err, err_len);
    }
    /* structure: every tensor of the config, with the partition attribute;
     * the optimizer's when /optimizer exists; the trainer's when /trainer does */
    char name[CKPT_NAME_MAX];
    for (int i = 0; !rc && i < pl.n; i++) {
        const Entry *e = &pl.e[i];
        size_t shape[PARAM_MAX_DIMS];
        for (int k = 0; k < e->ndim; k++) shape[k] = (size_t)e->shape[k];
        CkptH5Desc d;
        rc = check_float_dataset(f, path, e->name, e->ndim, shape, &d, true, err, err_len);
        if (!rc) {
            hid_t ds = H5Dopen2(f, e->name, H5P_DEFAULT);
            char *part = NULL;
            if (ckpt_h5_get_str(ds, "partition", &part)) {
                snprintf(err, err_len, "%s: dataset /%s: attribute partition is missing", path, e->name);
                rc = -1;
            }
            td_free(part);
            H5Dclose(ds);
        }
        for (int k = 0; !rc && meta.has_optimizer && k < 2; k++) {
            snprintf(name, sizeof name, "optimizer/%s/%s", k ? "exp_avg_sq" : "exp_avg", e->name);
            rc = check_float_dataset(f, path, name, e->ndim, shape, &d, false, err, err_len);
        }
    }
    if (!rc && meta.has_trainer) {
        CkptState st;
        memset(&st, 0, sizeof st);
        CkptH5Desc d;
        static const hsize_t s4[1] = { 4 }, s24[2] = { 1, 4 };
        rc = read_state_attrs(f, path, &st, err, err_len);
        if (!rc) rc = check_u64_dataset(f, path, "trainer/data_rng", 1, s4, false, &d, err, err_len);
        if (!rc) rc = check_u64_dataset(f, path, "trainer/rank_rng", 2, s24, true, &d, err, err_len);
        ckpt_state_free(&st);
    }
    /* tokenizer files: 1-D uint8, and each is JSON */
    if (!rc) {
        TokDesc td;
        CkptTokFiles tok;
        memset(&tok, 0, sizeof tok);
        rc = tok_validate(f, path, td.d, td.have, err, err_len);
        char why[ERR_MAX];
        if (!rc && tok_read(f, NULL, td.d, td.have, &tok, why, sizeof why)) {
            snprintf(err, err_len, "%s: %s", path, why);
            rc = -1;
        }
        for (int i = 0; !rc && i < TOK_FILES; i++) {
            size_t *len;
            char *txt = *tok_text(&tok, i, &len);
            cJSON *j = txt ? cJSON_ParseWithLength(txt, *len) : NULL;
            if (txt && !j) {
                snprintf(err, err_len, "%s: dataset /tokenizer/%s: not JSON (error near byte %ld)", path,
                         g_tok_names[i], (long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - txt : 0));
                rc = -1;
            }
            cJSON_Delete(j);
        }
        ckpt_tok_files_free(&tok);
    }
    /* data: every dataset in full */
    if (!rc) {
        Ranked *r;
        NameList names;
        int n = list_datasets(f, &cfg, &r, &names, path, err, err_len);
        if (n < 0) rc = -1;
        for (int i = 0; i < n && !rc; i++) {
            CkptH5Desc d;
            if (ckpt_h5_describe(f, r[i].name, &d)) continue;
            rc = read_all(f, path, r[i].name, &d, err, err_len);
        }
        td_free(r);
        td_free(names.names);
    }
    plan_free(&pl);
    H5Fclose(f);
    return rc;
}

/* The box [off, off + cnt) of int8 g32 dataset name (described by d; whole
 * rows) into q and its scales into s, both checked: the loader's rules
 * (ckpt_q8_check, ckpt_q8_check_values).  *rows, *K: the box's rows and
 * their length.  0, or -1 with one line in err. */
static int read_q8_box(hid_t f, const char *path, const char *name, const CkptH5Desc *d, const hsize_t *off,
                       const hsize_t *cnt, int8_t *q, float *s, char *err, size_t err_len)
{
    const int last = d->ndim - 1;
    if (d->ndim < 1 || off[last] != 0 || cnt[last] != d->shape[last]) {
        snprintf(err, err_len, "%s: dataset /%s: int8 is read in whole rows", path, name);
        return -1;
    }
    size_t shape[CKPT_H5_MAX_DIMS], n = 1;
    for (int i = 0; i < d->ndim; i++) {
        shape[i] = (size_t)d->shape[i];
        n *= (size_t)cnt[i];
    }
    CkptH5Desc sd;
    if (ckpt_q8_check(f, path, name, d->ndim, shape, &sd, err, err_len)) return -1;
    const size_t K = shape[last], G = dtype_q8_groups(K);
    hsize_t soff[CKPT_H5_MAX_DIMS], scnt[CKPT_H5_MAX_DIMS];
    memcpy(soff, off, sizeof soff);
    memcpy(scnt, cnt, sizeof scnt);
    scnt[last] = G;
    char sname[CKPT_NAME_MAX + 8], why[ERR_MAX];
    snprintf(sname, sizeof sname, "%s.scale", name);
    if (ckpt_h5_read_box(f, name, d, off, cnt, q, why, sizeof why) ||
        ckpt_h5_read_box(f, sname, &sd, soff, scnt, s, why, sizeof why)) {
        snprintf(err, err_len, "%s: %s", path, why);
        return -1;
    }
    size_t row0 = 0;   /* the box's first row, for the message */
    for (int i = 0; i < last; i++) row0 = row0 * (size_t)d->shape[i] + (size_t)off[i];
    return ckpt_q8_check_values(path, name, q, s, n / K, K, row0, d->ndim >= 2 ? shape[last - 1] : 1, d->ndim == 3,
                                err, err_len);
}

int ckpt_read_box_f32(hid_t f, const char *path, const char *name, const CkptH5Desc *d, const hsize_t *off,
                      const hsize_t *cnt, float *out, char *err, size_t err_len)
{
    if (d->type != CKPT_H5_I8) {
        char why[ERR_MAX];
        if (d->type != CKPT_H5_F32 && d->type != CKPT_H5_BF16 && d->type != CKPT_H5_F16) {
            snprintf(err, err_len, "%s: dataset /%s: dtype %s is not float32, float16, bfloat16 or int8 g32", path,
                     name, d->type_name);
            return -1;
        }
        if (!ckpt_h5_read_box(f, name, d, off, cnt, out, why, sizeof why)) return 0;
        snprintf(err, err_len, "%s: %s", path, why);
        return -1;
    }
    size_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= (size_t)cnt[i];
    const size_t K = d->ndim >= 1 ? (size_t)d->shape[d->ndim - 1] : 1, G = dtype_q8_groups(K), rows = n / td_max(K, 1);
    int8_t *q = td_malloc(td_max(n, 1));
    float *sc = td_malloc(td_max(rows * G, 1) * sizeof(float));
    const int rc = read_q8_box(f, path, name, d, off, cnt, q, sc, err, err_len);
    for (size_t r = 0; r < rows && !rc; r++) dtype_q8_dequantize_row(out + r * K, q + r * K, sc + r * G, K);
    td_free(q);
    td_free(sc);
    return rc;
}

float *ckpt_read_tensor(const char *path, const char *name, size_t *numel, char *err, size_t err_len)
{
    hid_t f = open_checked(path, err, err_len);
    if (f < 0) return NULL;
    float *out = NULL;
    CkptH5Desc d;
    if (ckpt_h5_describe(f, name, &d)) {
        snprintf(err, err_len, "%s: dataset /%s is missing", path, name);
    } else {
        size_t n = 1;
        hsize_t off[CKPT_H5_MAX_DIMS] = { 0 };
        for (int i = 0; i < d.ndim; i++) n *= (size_t)d.shape[i];
        out = td_malloc(td_max(n, 1) * sizeof(float));
        if (ckpt_read_box_f32(f, path, name, &d, off, d.shape, out, err, err_len)) {
            td_free(out);
            out = NULL;
        } else {
            *numel = n;
        }
    }
    H5Fclose(f);
    return out;
}

int ckpt_read_q8_tensor(const char *path, const char *name, int8_t **q, float **s, size_t *rows, size_t *K,
                        char *err, size_t err_len)
{
    *q = NULL;
    *s = NULL;
    hid_t f = open_checked(path, err, err_len);
    if (f < 0) return -1;
    CkptH5Desc d;
    int rc = -1;
    if (ckpt_h5_describe(f, name, &d) || d.type != CKPT_H5_I8 || d.ndim < 1) {
        snprintf(err, err_len, "%s: dataset /%s is not an int8 tensor", path, name);
    } else {
        size_t n = 1;
        for (int i = 0; i < d.ndim; i++) n *= (size_t)d.shape[i];
        *K = (size_t)d.shape[d.ndim - 1];
        *rows = n / td_max(*K, 1);
        hsize_t off[CKPT_H5_MAX_DIMS] = { 0 };
        *q = td_malloc(td_max(n, 1));
        *s = td_malloc(td_max(*rows * dtype_q8_groups(*K), 1) * sizeof(float));
        rc = read_q8_box(f, path, name, &d, off, d.shape, *q, *s, err, err_len);
    }
    if (rc) {
        td_free(*q);
        td_free(*s);
        *q = NULL;
        *s = NULL;
    }
    H5Fclose(f);
    return rc;
}

/* Reads path whole into a NUL-terminated td_malloc'd buffer: 1 read, 0
 * absent or empty, -1 unreadable or not a regular file (err set). */
static int slurp(const char *path, char **out, size_t *len, char *err, size_t err_len)
{
    *out = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        return -1;
    }
    int r = td_read_file(path, 0, out, len, err, err_len);
    if (r) return r > 0 ? 0 : -1;
    if (*len == 0) {   /* empty: as absent */
        td_free(*out);
        *out = NULL;
        return 0;
    }
    return 1;
}

int ckpt_tok_files_from_dir(const char *hf_dir, CkptTokFiles *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < TOK_FILES; i++) {
        size_t *len;
        char **txt = tok_text(out, i, &len);
        char *path = td_sprintf("%s/%s", hf_dir, g_tok_names[i]);
        int r = slurp(path, txt, len, err, err_len);
        td_free(path);
        if (r < 0) {
            ckpt_tok_files_free(out);
            return -1;
        }
    }
    return 0;
}

int ckpt_read_tok_files(const char *ckpt_path, CkptTokFiles *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    struct stat sb;
    char *latest = td_sprintf("%s/latest", ckpt_path), *file = NULL;
    bool is_dir = stat(ckpt_path, &sb) == 0 && S_ISDIR(sb.st_mode), run_dir = is_dir && lstat(latest, &sb) == 0;
    td_free(latest);
    /* a directory without latest: an HF model directory, or one holding just the tokenizer files */
    if (is_dir && !run_dir) return ckpt_tok_files_from_dir(ckpt_path, out, err, err_len);
    if (run_dir) {   /* its latest */
        char target[PATH_MAX];
        char *link = td_sprintf("%s/latest", ckpt_path);
        ssize_t k = readlink(link, target, sizeof target - 1);
        td_free(link);
        if (k < 0) {
            snprintf(err, err_len, "%s: cannot read the latest link: %s", ckpt_path, strerror(errno));
            return -1;
        }
        target[k] = 0;
        file = target[0] == '/' ? td_strdup(target) : td_sprintf("%s/%s", ckpt_path, target);
    } else {
        file = td_strdup(ckpt_path);
    }
    hid_t f = open_checked(file, err, err_len);
    if (f < 0) {
        td_free(file);
        return -1;
    }
    ModelConfig cfg;
    TokDesc td;
    int rc = check_root(f, file, &cfg, NULL, err, err_len);
    if (!rc) rc = tok_validate(f, file, td.d, td.have, err, err_len);
    char why[ERR_MAX];
    if (!rc && tok_read(f, NULL, td.d, td.have, out, why, sizeof why)) {
        snprintf(err, err_len, "%s: %s", file, why);
        rc = -1;
    }
    H5Fclose(f);
    td_free(file);
    if (rc) ckpt_tok_files_free(out);
    return rc;
}

/* ---------------------------------------------------------------- run directories */

int ckpt_set_latest(const char *dir, const char *file_name)
{
    char *tmp = td_sprintf("%s/.latest.tmp.%d", dir, (int)getpid()), *dst = td_sprintf("%s/latest", dir);
    unlink(tmp);
    bool bad = symlink(file_name, tmp) || rename(tmp, dst);
    if (bad) {
        td_error("%s: cannot point latest at %s: %s", dir, file_name, strerror(errno));
        unlink(tmp);
    }
    td_free(tmp);
    td_free(dst);
    if (bad) return -1;
    if (fsync_path(dir, true)) {
        td_error("%s: cannot sync the directory: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_resolve(const char *dir_or_file, char *out, size_t out_len)
{
    struct stat sb;
    if (stat(dir_or_file, &sb)) {
        td_error("%s: %s", dir_or_file, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (td_snprintf(out, out_len, "%s", dir_or_file)) {
            td_error("%s: the path is too long (%zu bytes; at most %zu)", dir_or_file, strlen(dir_or_file), out_len - 1);
            return -1;
        }
        return 0;
    }
    char link[PATH_MAX], target[PATH_MAX];
    if (td_snprintf(link, sizeof link, "%s/latest", dir_or_file)) {
        td_error("%s: the path is too long", dir_or_file);
        return -1;
    }
    if (lstat(link, &sb) != 0 && hf_is_dir(dir_or_file)) {   /* a Hugging Face model directory: itself */
        if (td_snprintf(out, out_len, "%s", dir_or_file)) {
            td_error("%s: the path is too long (%zu bytes; at most %zu)", dir_or_file, strlen(dir_or_file), out_len - 1);
            return -1;
        }
        size_t n = strlen(out);
        while (n > 1 && out[n - 1] == '/') out[--n] = 0;
        return 0;
    }
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) {
        td_error("%s: no checkpoint: %s: %s", dir_or_file, link, strerror(errno));
        return -1;
    }
    target[n] = 0;
    if (target[0] == '/' ? td_snprintf(out, out_len, "%s", target)
                         : td_snprintf(out, out_len, "%s/%s", dir_or_file, target)) {
        td_error("%s: latest points at %s: the path is too long (at most %zu bytes)", dir_or_file, target, out_len - 1);
        return -1;
    }
    if (stat(out, &sb)) {
        td_error("%s: latest points at %s: %s", dir_or_file, out, strerror(errno));
        return -1;
    }
    return 0;
}

typedef struct {
    long long step;
    char name[256];
} StepFile;

static int cmp_step(const void *a, const void *b)
{
    long long x = ((const StepFile *)a)->step, y = ((const StepFile *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;   /* newest first */
}

/* step number of "step_<digits>.h5" (or with .tmp when tmp), -1 otherwise */
static long long step_of(const char *name, bool tmp)
{
    if (strncmp(name, "step_", 5)) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return -1;
    char *end;
    long long s = strtoll(p, &end, 10);
    return !strcmp(end, tmp ? ".h5.tmp" : ".h5") ? s : -1;
}

int ckpt_prune(const char *dir, int keep_last)
{
    if (keep_last <= 0) return 0;
    char keep[PATH_MAX] = "", *link = td_sprintf("%s/latest", dir);
    ssize_t ln = readlink(link, keep, sizeof keep - 1);
    td_free(link);
    keep[ln > 0 ? ln : 0] = 0;
    const char *keep_base = strrchr(keep, '/') ? strrchr(keep, '/') + 1 : keep;
    DIR *d = opendir(dir);
    if (!d) {
        td_error("%s: cannot list: %s", dir, strerror(errno));
        return -1;
    }
    StepFile *files = NULL;
    size_t n = 0, cap = 0;
    int deleted = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (strlen(de->d_name) >= sizeof files->name) continue;
        if (step_of(de->d_name, true) >= 0 || !strncmp(de->d_name, ".latest.tmp.", 12)) {
            /* a save, or a switch of latest, that never finished */
            char *path = td_sprintf("%s/%s", dir, de->d_name);
            if (!unlink(path)) deleted++;
            td_free(path);
            continue;
        }
        long long s = step_of(de->d_name, false);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            StepFile *nf = td_malloc(cap * sizeof *nf);
            if (n) memcpy(nf, files, n * sizeof *nf);
            td_free(files);
            files = nf;
        }
        files[n].step = s;
        snprintf(files[n].name, sizeof files[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (n) qsort(files, n, sizeof *files, cmp_step);
    for (size_t i = (size_t)keep_last; i < n; i++) {
        if (!strcmp(files[i].name, keep_base)) continue;
        char *path = td_sprintf("%s/%s", dir, files[i].name);
        if (unlink(path) == 0) deleted++;
        td_free(path);
    }
    td_free(files);
    if (deleted && fsync_path(dir, true)) {
        td_error("%s: cannot sync the directory: %s", dir, strerror(errno));
        return -1;
    }
    return deleted;
}

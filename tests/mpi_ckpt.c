/* tests/mpi_ckpt.c - checkpoint test driver (built as build/tests/mpi_ckpt),
 * run by tests/mpi/ckpt.sh under mpirun and by tests/cli/ckpt*.sh.
 *
 *   matrix-write DIR      every layout of this world size (np = 1, 2, 4)
 *                         saves three small models (weights from
 *                         model_init_weights and fill_weights, synthetic AdamW moments,
 *                         trainer state; some in bf16 / f16)
 *   matrix-read DIR       every file of DIR is loaded under every layout of
 *                         this world size and compared bit for bit with a
 *                         freshly initialised model and the synthetic
 *                         moments; then a corrupted copy must be refused by
 *                         every rank with the same message and zeroed weights
 *   save OUT --config JSON [--seed S] [--moments] [--dtype D] [--step N]
 *                         a single-process checkpoint without the trainer
 *   loop DIR --config JSON [--keep K]
 *                         save step_N.h5, point latest at it, prune; forever
 *                         (the crash test kills it with SIGKILL)
 *   load CKPT [--moments] load in one process; exit 0 / 1 (error printed)
 *   loss CKPT IDS.bin B T tandem's training loss (SPEC section 2) of the
 *                         batch in IDS.bin (B*T int32 ids, then B*T int32
 *                         targets) on the model loaded from CKPT
 *
 * Synthetic weights come from model_init_weights(seed), vectors replaced by
 * a function of (tensor name, global element index): topology-independent by
 * construction; the moments are a function of
 * (tensor name, global element index); rank r's RNG row is {4r+1 .. 4r+4}.
 */
#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "core/model/backprop.h"
#include "core/common.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "core/rng.h"

#include <dirent.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEED 42

/* Three small models: A has a dense first layer, shared experts, untied
 * head, GQA 2:1 (tp <= 2); B is tied, MHA (tp up to 4); C has the
 * Hugging Face families' tensors (q/k/v/o biases, full-width q/k norms,
 * head_dim != d/H, a gated shared expert of its own width, MoE layers 1
 * and 3 by decoder_sparse_step). */
#define N_CFG 3
static const char *g_cfg_json[N_CFG] = {
    "{\"vocab_size\":40,\"hidden_size\":16,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"intermediate_size\":16,\"moe_intermediate_size\":8,\"num_local_experts\":4,"
    "\"num_experts_per_tok\":2,\"n_shared_experts\":1,\"first_k_dense_replace\":1,\"max_position_embeddings\":64}",
    "{\"vocab_size\":36,\"hidden_size\":16,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":4,\"moe_intermediate_size\":8,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
    "\"tie_word_embeddings\":true,\"max_position_embeddings\":64}",
    "{\"vocab_size\":40,\"hidden_size\":16,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"head_dim\":6,\"intermediate_size\":16,\"moe_intermediate_size\":8,"
    "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"attention_bias\":true,\"qk_norm\":\"full\","
    "\"shared_expert_intermediate_size\":12,\"shared_expert_gate\":true,\"decoder_sparse_step\":2,"
    "\"max_position_embeddings\":64}",
};

/* (dp, tp, pp, ep) candidates; those that do not divide a model are skipped. */
static const int g_layouts[][4] = {
    { 1, 1, 1, 1 },
    { 2, 1, 1, 2 }, { 1, 2, 1, 1 }, { 1, 1, 2, 1 }, { 2, 1, 1, 1 },
    { 4, 1, 1, 4 }, { 4, 1, 1, 2 }, { 2, 2, 1, 2 }, { 1, 4, 1, 1 }, { 1, 1, 4, 1 },
    { 2, 1, 2, 2 }, { 1, 2, 2, 1 }, { 2, 2, 1, 1 },
};
#define N_LAYOUTS (int)(sizeof g_layouts / sizeof g_layouts[0])

static int g_rank, g_world;
static double g_load_s;  /* time inside ckpt_load */

#define FAIL(...)                                                   \
    do {                                                            \
        fprintf(stderr, "[rank %d] mpi_ckpt: FAIL: ", g_rank);      \
        fprintf(stderr, __VA_ARGS__);                               \
        fputc('\n', stderr);                                        \
    } while (0)

/* ---------------------------------------------------------------- synthetic state */

static size_t global_index(const Param *p, size_t i)
{
    size_t ls1 = p->ndim > 1 ? p->lshape[1] : 1, ls2 = p->ndim > 2 ? p->lshape[2] : 1;
    size_t gs1 = p->ndim > 1 ? p->shape[1] : 1, gs2 = p->ndim > 2 ? p->shape[2] : 1;
    size_t o1 = p->ndim > 1 ? p->loff[1] : 0, o2 = p->ndim > 2 ? p->loff[2] : 0;
    size_t a = i / (ls1 * ls2), b = (i / ls2) % ls1, c = i % ls2;
    return ((a + p->loff[0]) * gs1 + (b + o1)) * gs2 + (c + o2);
}

static float moment_at(const char *name, int k, size_t g)
{
    double u = rng_uniform_at(rng_hash_str(name) ^ (k ? 0x5151u : 0xa2a2u), g);
    return k ? (float)(u * 1e-4) : (float)((u - 0.5) * 1e-2);
}

static void fill_moments(const Model *m, float *ea, float *eas)
{
    for (int i = 0; i < m->n_params; i++) {
        const Param *p = &m->params[i];
        for (size_t j = 0; j < p->numel; j++) {
            size_t g = global_index(p, j);
            ea[p->offset + j] = moment_at(p->name, 0, g);
            eas[p->offset + j] = moment_at(p->name, 1, g);
        }
    }
}

/* Weights: model_init_weights, with every vector (norm 1, bias 0 there)
 * replaced by a function of (name, global index), so that a misplaced
 * slice of one shows. */
static void fill_weights(Model *m)
{
    model_init_weights(m, SEED);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        if (p->ndim != 1) continue;
        for (size_t j = 0; j < p->numel; j++)
            p->w[j] = 1.0f + (float)rng_uniform_at(rng_hash_str(p->name) ^ 0x7777u, global_index(p, j));
    }
}

/* Tokenizer files: rank 0 passes them, the other ranks none (a parallel
 * save writes rank 0's); every rank must load them back. */
/* A tokenizer the commands can use on these models: SentencePiece-style
 * BPE whose vocabulary is the 256 byte tokens <0x00>..<0xFF> at their byte
 * values, no merges: every character falls back to its bytes, so a text's
 * ids are its bytes, as without a tokenizer. */
static char g_tok_json[256 * 16 + 256];
static size_t g_tok_json_len;

static void make_tok_json(void)
{
    size_t k = (size_t)snprintf(g_tok_json, sizeof g_tok_json, "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                                                                 "\"merges\": [], \"vocab\": {");
    for (int b = 0; b < 256; b++)
        k += (size_t)snprintf(g_tok_json + k, sizeof g_tok_json - k, "%s\"<0x%02X>\": %d", b ? ", " : "", b, b);
    k += (size_t)snprintf(g_tok_json + k, sizeof g_tok_json - k, "}}, \"decoder\": {\"type\": \"ByteFallback\"}}");
    g_tok_json_len = k;
}
static const char g_gen_json[] = "{\"eos_token_id\": 2}";

static void fill_state(CkptState *st, uint64_t own[1][4], int64_t step)
{
    memset(st, 0, sizeof *st);
    st->step = step;
    st->tokens_seen = step * 1000;
    st->micro_batches = step * 3;
    for (int i = 0; i < 4; i++) st->data_rng[i] = 11u * (uint64_t)(i + 1);
    for (int i = 0; i < 4; i++) own[0][i] = 4u * (uint64_t)g_rank + (uint64_t)i + 1;
    st->n_rank_rng = 1;
    st->rank_rng = own;
    st->lr = 1e-3;
    st->beta1 = 0.9;
    st->beta2 = 0.95;
    st->adam_eps = 1e-8;
    st->weight_decay = 0.1;
    st->adam_step = step;
    st->run_config = "{\"tag\":\"mpi_ckpt\"}";
    if (g_rank == 0) {
        if (!g_tok_json_len) make_tok_json();
        st->tok.tokenizer_json = g_tok_json;
        st->tok.tokenizer_json_len = g_tok_json_len;
        st->tok.generation_config = (char *)g_gen_json;
        st->tok.generation_config_len = sizeof g_gen_json - 1;
    }
}

static int parse_cfg(ModelConfig *cfg, const char *json)
{
    char err[256];
    if (config_parse(cfg, json, err, sizeof err)) {
        td_error("%s", err);
        return -1;
    }
    return 0;
}

/* Topology of layout l for this rank; -1 when it does not fit the model or the world. */
static int layout_topo(Topology *t, const ModelConfig *cfg, int l)
{
    const int *L = g_layouts[l];
    if (L[0] * L[1] * L[2] != g_world) return -1;
    char err[256];
    return topo_init(t, cfg, L[0], L[1], L[2], L[3], 1, g_rank, NULL, err, sizeof err);
}

/* ---------------------------------------------------------------- matrix */

static int matrix_write(const char *dir)
{
    int n = 0, bad = 0;
    for (int c = 0; c < N_CFG; c++) {
        ModelConfig cfg;
        if (parse_cfg(&cfg, g_cfg_json[c])) return 1;
        int k = 0;
        for (int l = 0; l < N_LAYOUTS; l++) {
            Topology t;
            if (layout_topo(&t, &cfg, l)) continue;
            const int *L = g_layouts[l];
            /* also bfloat16 for the first layout of each world size, float16
             * for the second */
            int extra = k == 0 ? CKPT_BF16 : k == 1 ? CKPT_F16 : -1;
            k++;
            for (int dt = 0; dt < 3; dt++) {
                if (dt != CKPT_F32 && dt != extra) continue;
                Model m;
                model_init(&m, &cfg, &t, false, 16);
                fill_weights(&m);
                float *ea = td_calloc(m.n_w * sizeof(float)), *eas = td_calloc(m.n_w * sizeof(float));
                fill_moments(&m, ea, eas);
                CkptState st;
                uint64_t own[1][4];
                fill_state(&st, own, 100 + g_world);
                char path[1024];
                snprintf(path, sizeof path, "%s/%c_w%d_dp%dtp%dpp%dep%d_%s.h5", dir, 'A' + c, g_world, L[0], L[1],
                         L[2], L[3], dt == 0 ? "f32" : dt == 1 ? "bf16" : "f16");
                if (ckpt_save(path, &m, ea, eas, &st, dt == 0 ? CKPT_F32 : dt == 1 ? CKPT_BF16 : CKPT_F16)) bad++;
                n++;
                td_free(ea);
                td_free(eas);
                model_free(&m);
            }
        }
    }
    if (g_rank == 0) printf("matrix-write np=%d: %d checkpoints written, %d failed\n", g_world, n, bad);
    return bad ? 1 : 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* What every file must load as under one layout: a fresh model and the
 * synthetic moments (built once per layout, compared with many files). */
typedef struct {
    Model m;
    float *ea, *eas;
} Ref;

static void ref_init(Ref *r, const ModelConfig *cfg, const Topology *t)
{
    model_init(&r->m, cfg, t, false, 16);
    fill_weights(&r->m);
    r->ea = td_calloc(r->m.n_w * sizeof(float));
    r->eas = td_calloc(r->m.n_w * sizeof(float));
    fill_moments(&r->m, r->ea, r->eas);
}

static void ref_free(Ref *r)
{
    model_free(&r->m);
    td_free(r->ea);
    td_free(r->eas);
}

/* Loads path under the reference's topology and compares everything with
 * it; returns the number of mismatching tensors on this rank. */
static int check_load(const char *path, const Ref *ref, CkptDtype dt, int saved_world)
{
    const Topology *t = &ref->m.topo;
    Model m;
    model_init(&m, &ref->m.cfg, t, false, 16);
    float *ea = td_calloc(m.n_w * sizeof(float)), *eas = td_calloc(m.n_w * sizeof(float));
    const float *rea = ref->ea, *reas = ref->eas;
    CkptState st;
    memset(&st, 0, sizeof st);
    char err[512];
    int bad = 0;
    double t0 = td_now();
    int lrc = ckpt_load(path, &m, ea, eas, &st, err, sizeof err);
    g_load_s += td_now() - t0;
    if (lrc) {
        FAIL("%s", err);
        bad++;
        goto out;
    }
    for (int i = 0; i < m.n_params; i++) {
        const Param *p = &m.params[i], *q = &ref->m.params[i];
        for (size_t j = 0; j < p->numel; j++) {
            float want = q->w[j];
            if (p->ndim >= 2 && dt == CKPT_BF16) want = dtype_f32_from_bf16(dtype_bf16_from_f32(want));
            if (p->ndim >= 2 && dt == CKPT_F16) want = dtype_f32_from_f16(dtype_f16_from_f32(want));
            if (memcmp(&p->w[j], &want, sizeof want) || memcmp(&ea[p->offset + j], &rea[p->offset + j], 4) ||
                memcmp(&eas[p->offset + j], &reas[p->offset + j], 4)) {
                FAIL("%s under dp%d tp%d pp%d ep%d: %s element %zu: w %a (want %a) m %a (%a) v %a (%a)", path, t->dp,
                     t->tp, t->pp, t->ep, p->name, j, (double)p->w[j], (double)want, (double)ea[p->offset + j],
                     (double)rea[p->offset + j], (double)eas[p->offset + j], (double)reas[p->offset + j]);
                bad++;
                break;
            }
        }
    }
    if (!st.has_trainer || st.step != 100 + saved_world || st.micro_batches != 3 * st.step ||
        st.data_rng[3] != 44 || st.n_rank_rng != saved_world || !st.run_config ||
        strcmp(st.run_config, "{\"tag\":\"mpi_ckpt\"}")) {
        FAIL("%s: trainer state differs (step %lld, rows %d)", path, (long long)st.step, st.n_rank_rng);
        bad++;
    }
    if (!g_tok_json_len) make_tok_json();
    if (!st.tok.tokenizer_json || st.tok.tokenizer_json_len != g_tok_json_len ||
        memcmp(st.tok.tokenizer_json, g_tok_json, g_tok_json_len) || st.tok.tokenizer_config ||
        !st.tok.generation_config || strcmp(st.tok.generation_config, g_gen_json)) {
        FAIL("%s: the tokenizer files differ from rank 0's (tokenizer.json %zu bytes)", path, st.tok.tokenizer_json_len);
        bad++;
    }
    for (int r = 0; r < st.n_rank_rng && !bad; r++)
        for (int i = 0; i < 4; i++)
            if (st.rank_rng[r][i] != 4u * (uint64_t)r + (uint64_t)i + 1) {
                FAIL("%s: rank_rng[%d][%d] = %llu", path, r, i, (unsigned long long)st.rank_rng[r][i]);
                bad++;
                break;
            }
out:
    ckpt_state_free(&st);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    return bad;
}

/* Copies src to dst with one byte flipped inside the first chunk of dataset
 * name (none when name is NULL). */
static int corrupt_copy(const char *src, const char *dst, const char *name)
{
    if (!name) {
        FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
        if (!in || !out) return -1;
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        fclose(in);
        return fclose(out) ? -1 : 0;
    }
    hid_t f = H5Fopen(src, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    hsize_t off[4];
    unsigned mask;
    haddr_t addr = 0;
    hsize_t size = 0;
    hid_t sp = H5Dget_space(ds);
    herr_t rc = H5Dget_chunk_info(ds, sp, 0, off, &mask, &addr, &size);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
    if (rc < 0 || size < 8) return -1;
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out) return -1;
    char buf[65536];
    size_t n, pos = 0, target = (size_t)addr + (size_t)size / 2;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (target >= pos && target < pos + n) buf[target - pos] ^= 0x10;
        fwrite(buf, 1, n, out);
        pos += n;
    }
    fclose(in);
    return fclose(out) ? -1 : 0;
}

static int matrix_read(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        td_error("%s: cannot list", dir);
        return 1;
    }
    char *files[256];
    int nf = 0;
    for (struct dirent *de; (de = readdir(d)) && nf < 256;) {
        size_t len = strlen(de->d_name);
        if (len > 3 && !strcmp(de->d_name + len - 3, ".h5") && de->d_name[0] >= 'A' && de->d_name[0] < 'A' + N_CFG)
            files[nf++] = td_strdup(de->d_name);
    }
    closedir(d);
    qsort(files, (size_t)nf, sizeof *files, cmp_str);
    int loads = 0, bad = 0;
    for (int c = 0; c < N_CFG; c++) {
        ModelConfig cfg;
        if (parse_cfg(&cfg, g_cfg_json[c])) return 1;
        for (int l = 0; l < N_LAYOUTS; l++) {
            Topology t;
            if (layout_topo(&t, &cfg, l)) continue;
            Ref ref;
            ref_init(&ref, &cfg, &t);
            for (int i = 0; i < nf; i++) {
                if (files[i][0] != 'A' + c) continue;
                char path[1024], err[512];
                snprintf(path, sizeof path, "%s/%s", dir, files[i]);
                ModelConfig fcfg;
                CkptMeta meta;
                if (ckpt_read_config(path, &fcfg, &meta, err, sizeof err)) {
                    FAIL("%s", err);
                    bad++;
                    continue;
                }
                CkptDtype dt = strstr(files[i], "_bf16") ? CKPT_BF16 : strstr(files[i], "_f16") ? CKPT_F16 : CKPT_F32;
                if (meta.dtype != dt) {
                    FAIL("%s: dtype %s", path, ckpt_dtype_name(meta.dtype));
                    bad++;
                }
                bad += check_load(path, &ref, dt, meta.world);
                loads++;
            }
            ref_free(&ref);
        }
    }
    /* A corrupt file: every rank refuses it with the same message, and
     * nobody keeps partial weights. */
    char src[1024], bad_path[1024];
    snprintf(src, sizeof src, "%s/A_w1_dp1tp1pp1ep1_f32.h5", dir);
    snprintf(bad_path, sizeof bad_path, "%s/corrupt_np%d.h5x", dir, g_world);
    const char *victim = "model/layers/2/mlp/experts/down_proj";
    int crc = g_rank == 0 ? corrupt_copy(src, bad_path, victim) : 0;
    comm_barrier(COMM_WORLD);
    if (crc) {
        FAIL("cannot make a corrupt copy of %s", src);
        bad++;
    } else {
        ModelConfig cfg;
        parse_cfg(&cfg, g_cfg_json[0]);
        for (int l = 0; l < N_LAYOUTS; l++) {
            Topology t;
            if (layout_topo(&t, &cfg, l)) continue;
            Model m;
            model_init(&m, &cfg, &t, false, 16);
            for (size_t j = 0; j < m.n_w; j++) m.w[j] = 7.0f;
            char err[512] = "";
            int rc = ckpt_load(bad_path, &m, NULL, NULL, NULL, err, sizeof err);
            size_t nonzero = 0;
            for (size_t j = 0; j < m.n_w; j++) nonzero += m.w[j] != 0.0f;
            if (rc == 0 || !strstr(err, "checksum mismatch") || !strstr(err, victim) || nonzero) {
                FAIL("corrupt file under dp%d tp%d pp%d ep%d: rc %d, %zu weights left, message \"%s\"", t.dp, t.tp,
                     t.pp, t.ep, rc, nonzero, err);
                bad++;
            }
            model_free(&m);
            loads++;
        }
    }
    /* A dataset missing from the last layer: only the last pipeline stage
     * looks at it, yet every rank refuses the file with its message and
     * keeps its weights untouched (validation precedes any read). */
    char gap_path[1024];
    snprintf(gap_path, sizeof gap_path, "%s/missing_np%d.h5x", dir, g_world);
    const char *gone = "model/layers/3/mlp/experts/up_proj";
    crc = 0;
    if (g_rank == 0) {
        crc = corrupt_copy(src, gap_path, NULL);
        hid_t f = crc ? -1 : H5Fopen(gap_path, H5F_ACC_RDWR, H5P_DEFAULT);
        crc = f < 0 || H5Ldelete(f, gone, H5P_DEFAULT) < 0 ? -1 : 0;
        if (f >= 0) H5Fclose(f);
    }
    comm_barrier(COMM_WORLD);
    if (crc) {
        FAIL("cannot make a copy of %s without %s", src, gone);
        bad++;
    } else {
        ModelConfig cfg;
        parse_cfg(&cfg, g_cfg_json[0]);
        for (int l = 0; l < N_LAYOUTS; l++) {
            Topology t;
            if (layout_topo(&t, &cfg, l)) continue;
            Model m;
            model_init(&m, &cfg, &t, false, 16);
            for (size_t j = 0; j < m.n_w; j++) m.w[j] = 7.0f;
            char err[512] = "";
            int rc = ckpt_load(gap_path, &m, NULL, NULL, NULL, err, sizeof err);
            size_t kept = 0;
            for (size_t j = 0; j < m.n_w; j++) kept += m.w[j] == 7.0f;
            if (rc == 0 || !strstr(err, "is missing") || !strstr(err, gone) || kept != m.n_w) {
                FAIL("file without %s under dp%d tp%d pp%d ep%d: rc %d, %zu of %zu weights kept, message \"%s\"", gone,
                     t.dp, t.tp, t.pp, t.ep, rc, kept, m.n_w, err);
                bad++;
            }
            model_free(&m);
            loads++;
        }
    }
    double tot[2] = { (double)bad, (double)loads };
    comm_allreduce_f64(COMM_WORLD, tot, 2);
    if (g_rank == 0)
        printf("matrix-read np=%d: %d files, %.0f loads over all ranks, %.0f mismatches (rank 0: %.2f s in ckpt_load)\n",
               g_world, nf, tot[1], tot[0], g_load_s);
    for (int i = 0; i < nf; i++) td_free(files[i]);
    return tot[0] > 0 ? 1 : 0;
}

/* ---------------------------------------------------------------- single-process helpers */

static const char *opt(int argc, char **argv, const char *name, const char *dflt)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return dflt;
}

static bool flag(int argc, char **argv, const char *name)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
}

static int save_one(const char *path, const ModelConfig *cfg, uint64_t seed, bool moments, CkptDtype dt, int64_t step)
{
    Topology t;
    topo_single(&t, cfg);
    Model m;
    model_init(&m, cfg, &t, false, 16);
    model_init_weights(&m, seed);
    float *ea = NULL, *eas = NULL;
    if (moments) {
        ea = td_calloc(m.n_w * sizeof(float));
        eas = td_calloc(m.n_w * sizeof(float));
        fill_moments(&m, ea, eas);
    }
    CkptState st;
    uint64_t own[1][4];
    fill_state(&st, own, step);
    int rc = ckpt_save(path, &m, ea, eas, &st, dt);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    return rc ? 1 : 0;
}

static int cmd_save(int argc, char **argv)
{
    ModelConfig cfg;
    if (argc < 2 || parse_cfg(&cfg, opt(argc, argv, "--config", g_cfg_json[0]))) return 2;
    CkptDtype dt = CKPT_F32;
    if (ckpt_dtype_parse(opt(argc, argv, "--dtype", "f32"), &dt)) return 2;
    return save_one(argv[1], &cfg, strtoull(opt(argc, argv, "--seed", "42"), NULL, 10), flag(argc, argv, "--moments"),
                    dt, strtoll(opt(argc, argv, "--step", "1"), NULL, 10));
}

static int cmd_loop(int argc, char **argv)
{
    ModelConfig cfg;
    if (argc < 2 || parse_cfg(&cfg, opt(argc, argv, "--config", g_cfg_json[0]))) return 2;
    const char *dir = argv[1];
    int keep = atoi(opt(argc, argv, "--keep", "2"));
    mkdir(dir, 0755);
    char link[1024], target[256];
    snprintf(link, sizeof link, "%s/latest", dir);
    ssize_t n = readlink(link, target, sizeof target - 1);
    long long step = 1;
    if (n > 0) {
        target[n] = 0;
        step = atoll(target + 5) + 1;   /* step_%08lld.h5 */
    }
    /* one model for the whole loop: the time goes to saving */
    Topology t;
    topo_single(&t, &cfg);
    Model m;
    model_init(&m, &cfg, &t, false, 16);
    model_init_weights(&m, SEED);
    float *ea = td_calloc(m.n_w * sizeof(float)), *eas = td_calloc(m.n_w * sizeof(float));
    fill_moments(&m, ea, eas);
    int rc = 0;
    for (;; step++) {
        char name[64], path[1200];
        snprintf(name, sizeof name, "step_%08lld.h5", step);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        m.w[0] = (float)step;   /* every checkpoint differs */
        CkptState st;
        uint64_t own[1][4];
        fill_state(&st, own, step);
        if (ckpt_save(path, &m, ea, eas, &st, CKPT_F32) || ckpt_set_latest(dir, name) || ckpt_prune(dir, keep) < 0) {
            rc = 1;
            break;
        }
        printf("saved %s\n", name);
        fflush(stdout);
    }
    td_free(ea);
    td_free(eas);
    model_free(&m);
    return rc;
}

static int load_model(const char *arg, Model *m, bool moments, float **ea, float **eas)
{
    char path[1024], err[512];
    if (ckpt_resolve(arg, path, sizeof path)) return 1;
    ModelConfig cfg;
    if (ckpt_read_config(path, &cfg, NULL, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    Topology t;
    topo_single(&t, &cfg);
    model_init(m, &cfg, &t, true, 16);
    if (moments) {
        *ea = td_calloc(m->n_w * sizeof(float));
        *eas = td_calloc(m->n_w * sizeof(float));
    }
    CkptState st;
    memset(&st, 0, sizeof st);
    int rc = ckpt_load(path, m, moments ? *ea : NULL, moments ? *eas : NULL, &st, err, sizeof err);
    ckpt_state_free(&st);
    if (rc) {
        td_error("%s", err);
        return 1;
    }
    model_pack(m);
    return 0;
}

static int cmd_load(int argc, char **argv)
{
    if (argc < 2) return 2;
    Model m;
    memset(&m, 0, sizeof m);
    float *ea = NULL, *eas = NULL;
    int rc = load_model(argv[1], &m, flag(argc, argv, "--moments"), &ea, &eas);
    if (!rc) printf("loaded %s: %d tensors\n", argv[1], m.n_params);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    return rc;
}

static int cmd_loss(int argc, char **argv)
{
    if (argc < 5) return 2;
    size_t B = (size_t)atol(argv[3]), T = (size_t)atol(argv[4]), N = B * T;
    int32_t *ids = td_malloc(2 * N * sizeof(int32_t));
    FILE *f = fopen(argv[2], "rb");
    size_t got = f ? fread(ids, sizeof(int32_t), 2 * N, f) : 0;
    if (f) fclose(f);
    if (got != 2 * N) {
        td_error("%s: expected %zu int32 values", argv[2], 2 * N);
        td_free(ids);
        return 1;
    }
    Model m;
    memset(&m, 0, sizeof m);
    if (load_model(argv[1], &m, false, NULL, NULL)) {
        td_free(ids);
        model_free(&m);
        return 1;
    }
    TrainActs a;
    model_train_acts_init(&a, &m, B, T, RECOMPUTE_NONE);
    LossParts lp;
    memset(&lp, 0, sizeof lp);
    model_train_forward(&m, &a, ids, ids + N, N, &lp);
    double loss = lp.ce_sum / (double)N + m.cfg.router_aux_loss_coef * lp.aux + m.cfg.router_z_loss_coef * lp.z;
    printf("%.10g\n", loss);
    model_train_acts_free(&a);
    model_free(&m);
    td_free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    if (comm_init(&argc, &argv)) return 1;
    g_rank = comm_rank();
    g_world = comm_size();
    pool_init(1);
    int rc = 2;
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "matrix-write") && argc > 2) rc = matrix_write(argv[2]);
    else if (!strcmp(cmd, "matrix-read") && argc > 2) rc = matrix_read(argv[2]);
    else if (!strcmp(cmd, "save")) rc = cmd_save(argc - 1, argv + 1);
    else if (!strcmp(cmd, "loop")) rc = cmd_loop(argc - 1, argv + 1);
    else if (!strcmp(cmd, "load")) rc = cmd_load(argc - 1, argv + 1);
    else if (!strcmp(cmd, "loss")) rc = cmd_loss(argc - 1, argv + 1);
    else fprintf(stderr, "usage: mpi_ckpt matrix-write|matrix-read DIR | save OUT | loop DIR | load CKPT | loss CKPT IDS B T\n");
    pool_free();
    comm_finalize();
    return rc;
}

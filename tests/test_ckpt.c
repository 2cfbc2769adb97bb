/* tests/test_ckpt.c - HDF5 checkpoints (checkpoint/ckpt.h) in one process:
 * HDF5's Fletcher32, save/load round trips bit for bit,
 * the recorded topology (partitions, chunks), reads of arbitrary boxes,
 * every refusal (version, format, missing dataset, shape, dtype, config,
 * corrupt byte, truncation) with its own message and nothing loaded, and
 * the run-directory helpers (latest, resolve, prune).
 * Loads under other topologies (1, 2 and 4 ranks) are tests/mpi/ckpt.sh.
 */
#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_io.h"
#include "core/common.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "core/rng.h"
#include "tests/fixture.h"

static char g_dir[256];

static void setup(void)
{
    pool_init(2);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* Each test runs in its own process with its own temporary directory. */
static void teardown(void)
{
    if (!g_dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_ckpt: cannot remove %s\n", g_dir);
    pool_free();
}

TestSuite(ckpt, .init = setup, .fini = teardown);

/* Dense first layer, shared experts, GQA; every tensor kind of SPEC section 4. */
static const char *CFG =
    "{\"vocab_size\":40,\"hidden_size\":16,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_local_experts\":4,"
    "\"num_experts_per_tok\":2,\"n_shared_experts\":1,\"first_k_dense_replace\":1,\"max_position_embeddings\":32}";

static const char *tmp_path(const char *name)
{
    static char buf[512];
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/tandem_test_ckpt_XXXXXX");
        cr_assert(mkdtemp(g_dir), "mkdtemp");
    }
    snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
    return buf;
}

typedef struct {
    Model m;
    float *ea, *eas;
    CkptState st;
    uint64_t rows[3][4];
} Saved;

static void cfg_of(ModelConfig *cfg, const char *json)
{
    char err[256];
    cr_assert(config_parse(cfg, json, err, sizeof err) == 0, "%s", err);
}

static void make_model(Saved *s, const char *json, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    ModelConfig cfg;
    cfg_of(&cfg, json);
    Topology t;
    topo_single(&t, &cfg);
    model_init(&s->m, &cfg, &t, false, 16);
    model_init_weights(&s->m, seed);
    s->ea = td_malloc(s->m.n_w * sizeof(float));
    s->eas = td_malloc(s->m.n_w * sizeof(float));
    fixture_fill(s->ea, s->m.n_w, seed + 1, -1e-2f, 1e-2f);
    fixture_fill(s->eas, s->m.n_w, seed + 2, 0.0f, 1e-4f);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++) s->rows[r][i] = 100u * (uint64_t)r + (uint64_t)i;
    CkptState *st = &s->st;
    st->step = 17;
    st->tokens_seen = 17 * 640;
    st->micro_batches = 34;
    st->data_rng[0] = 0xdeadbeefULL;
    st->data_rng[3] = ~0ULL;
    st->n_rank_rng = 3;
    st->rank_rng = s->rows;
    st->lr = 2.5e-4;
    st->beta1 = 0.9;
    st->beta2 = 0.95;
    st->adam_eps = 1e-8;
    st->weight_decay = 0.1;
    st->adam_step = 17;
    st->run_config = "{\"lr\":0.00025}";
}

static void free_saved(Saved *s)
{
    model_free(&s->m);
    td_free(s->ea);
    td_free(s->eas);
}

/* A fresh single-process model of the file's config with every weight 7. */
static void fresh(Model *m, const char *path)
{
    ModelConfig cfg;
    char err[512];
    cr_assert(ckpt_read_config(path, &cfg, NULL, err, sizeof err) == 0, "%s", err);
    Topology t;
    topo_single(&t, &cfg);
    model_init(m, &cfg, &t, false, 16);
    for (size_t i = 0; i < m->n_w; i++) m->w[i] = 7.0f;
}

static size_t count_equal(const float *x, size_t n, float v)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += x[i] == v;
    return k;
}

/* ---------------------------------------------------------------- Fletcher32 */

/* HDF5's own pipeline writes the checksums; ours must agree with each. */
Test(ckpt, fletcher32_matches_hdf5)
{
    const char *path = tmp_path("fletcher.h5");
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    static const hsize_t sizes[] = { 1, 2, 3, 127, 128, 129, 255, 256, 1000, 4099, 65536, 100003 };
    uint8_t *data = td_malloc(200000);
    for (size_t i = 0; i < 200000; i++) data[i] = (uint8_t)(rng_mix64(i) >> 13);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (int pattern = 0; pattern < 3; pattern++) {
            /* random bytes, zeros (HDF5 stores 0), 0xff (sums of 65535) */
            if (pattern == 1) memset(data, 0, sizes[k]);
            if (pattern == 2) memset(data, 0xff, sizes[k]);
            char name[32];
            snprintf(name, sizeof name, "d%zu_%d", k, pattern);
            hid_t sp = H5Screate_simple(1, &sizes[k], NULL);
            hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
            H5Pset_chunk(dcpl, 1, &sizes[k]);
            H5Pset_fletcher32(dcpl);
            hid_t ds = H5Dcreate2(f, name, H5T_NATIVE_UINT8, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
            cr_assert(H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
            H5Dflush(ds);
            hsize_t off = 0, nbytes = 0;
            cr_assert(H5Dget_chunk_storage_size(ds, &off, &nbytes) >= 0);
            cr_assert_eq(nbytes, sizes[k] + 4);
            uint8_t *raw = td_malloc(nbytes);
            uint32_t mask = 0;
            cr_assert(H5Dread_chunk(ds, H5P_DEFAULT, &off, &mask, raw) >= 0);
            uint32_t stored = (uint32_t)raw[sizes[k]] | (uint32_t)raw[sizes[k] + 1] << 8 |
                              (uint32_t)raw[sizes[k] + 2] << 16 | (uint32_t)raw[sizes[k] + 3] << 24;
            cr_expect_eq(ckpt_fletcher32(raw, sizes[k]), stored, "%llu bytes, pattern %d: ours %08x, HDF5 %08x",
                         (unsigned long long)sizes[k], pattern, ckpt_fletcher32(raw, sizes[k]), stored);
            td_free(raw);
            H5Dclose(ds);
            H5Pclose(dcpl);
            H5Sclose(sp);
            for (size_t i = 0; i < 200000; i++) data[i] = (uint8_t)(rng_mix64(i) >> 13);
        }
    }
    td_free(data);
    H5Fclose(f);
}

/* ---------------------------------------------------------------- round trips */

Test(ckpt, roundtrip_is_bitwise)
{
    Saved s;
    make_model(&s, CFG, 3);
    const char *path = tmp_path("rt.h5");
    cr_assert(ckpt_save(path, &s.m, s.ea, s.eas, &s.st, CKPT_F32) == 0);
    struct stat sb;
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_expect(stat(tmp, &sb) != 0, "the temporary file is renamed away");

    Model m;
    fresh(&m, path);
    float *ea = td_calloc(m.n_w * sizeof(float)), *eas = td_calloc(m.n_w * sizeof(float));
    CkptState st;
    memset(&st, 0, sizeof st);
    char err[512];
    cr_assert(ckpt_load(path, &m, ea, eas, &st, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < m.n_params; i++) {
        const Param *p = &m.params[i];
        EXPECT_BITWISE(p->w, s.m.params[i].w, p->numel, p->name);
        EXPECT_BITWISE(ea + p->offset, s.ea + p->offset, p->numel, "exp_avg");
        EXPECT_BITWISE(eas + p->offset, s.eas + p->offset, p->numel, "exp_avg_sq");
    }
    cr_expect(st.has_trainer);
    cr_expect_eq(st.step, 17);
    cr_expect_eq(st.tokens_seen, 17 * 640);
    cr_expect_eq(st.micro_batches, 34);
    cr_expect_eq(st.data_rng[0], 0xdeadbeefULL);
    cr_expect_eq(st.data_rng[3], ~0ULL);
    cr_expect_eq(st.adam_step, 17);
    cr_expect(st.lr == 2.5e-4 && st.beta1 == 0.9 && st.beta2 == 0.95 && st.adam_eps == 1e-8 && st.weight_decay == 0.1);
    cr_assert_eq(st.n_rank_rng, 3);
    cr_expect(!memcmp(st.rank_rng, s.rows, sizeof s.rows), "rank_rng table");
    cr_expect_str_eq(st.run_config, "{\"lr\":0.00025}");

    cr_expect(ckpt_verify(path, err, sizeof err) == 0, "%s", err);
    ckpt_state_free(&st);
    ckpt_state_free(&st);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    free_saved(&s);
}

static void check_16bit(CkptDtype dt, const char *name)
{
    Saved s;
    make_model(&s, CFG, 5);
    const char *path = tmp_path(name);
    cr_assert(ckpt_save(path, &s.m, NULL, NULL, &s.st, dt) == 0);
    CkptMeta meta;
    ModelConfig cfg;
    char err[512];
    cr_assert(ckpt_read_config(path, &cfg, &meta, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(meta.dtype, dt);
    cr_expect(!meta.has_optimizer && !meta.has_trainer, "weights only");
    cr_expect_eq(meta.step, 17, "step kept without the trainer state");
    Model m;
    fresh(&m, path);
    cr_assert(ckpt_load(path, &m, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < m.n_params; i++) {
        const Param *p = &m.params[i], *q = &s.m.params[i];
        float *want = fixture_copy(q->w, q->numel);
        if (p->ndim >= 2)   /* matrices stored in 16 bits, norms in float32 */
            for (size_t j = 0; j < p->numel; j++)
                want[j] = dt == CKPT_BF16 ? dtype_f32_from_bf16(dtype_bf16_from_f32(want[j]))
                                          : dtype_f32_from_f16(dtype_f16_from_f32(want[j]));
        EXPECT_BITWISE(p->w, want, p->numel, p->name);
        td_free(want);
    }
    cr_expect(ckpt_verify(path, err, sizeof err) == 0, "%s", err);
    CkptInfo info;
    cr_assert(ckpt_info(path, &info, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < info.n_tensors; i++) {
        const CkptTensor *t = &info.tensors[i];
        const char *want = t->ndim >= 2 ? ckpt_dtype_name(dt) : "float32";
        cr_expect_str_eq(t->dtype, want, "%s", t->name);
        cr_expect_eq(t->bytes, t->numel * (t->ndim >= 2 ? 2 : 4));
    }
    ckpt_info_free(&info);
    model_free(&m);
    free_saved(&s);
}

Test(ckpt, bf16_checkpoint_upcasts_on_load) { check_16bit(CKPT_BF16, "bf16.h5"); }
Test(ckpt, f16_checkpoint_upcasts_on_load) { check_16bit(CKPT_F16, "f16.h5"); }

Test(ckpt, weights_only_cannot_resume)
{
    Saved s;
    make_model(&s, CFG, 9);
    const char *path = tmp_path("wo.h5");
    cr_assert(ckpt_save(path, &s.m, NULL, NULL, &s.st, CKPT_F32) == 0);
    Model m;
    fresh(&m, path);
    float *ea = td_calloc(m.n_w * sizeof(float)), *eas = td_calloc(m.n_w * sizeof(float));
    CkptState st;
    memset(&st, 0, sizeof st);
    char err[512];
    cr_expect(ckpt_load(path, &m, ea, eas, &st, err, sizeof err) != 0);
    cr_expect(strstr(err, "/optimizer is missing"), "message: %s", err);
    cr_expect_eq(count_equal(m.w, m.n_w, 7.0f), m.n_w, "nothing loaded");
    cr_expect(ckpt_load(path, &m, NULL, NULL, &st, err, sizeof err) == 0, "%s", err);
    cr_expect(!st.has_trainer);
    cr_expect_eq(st.step, 17);
    ckpt_state_free(&st);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    free_saved(&s);
}

/* ---------------------------------------------------------------- topology and chunks */

static const CkptTensor *tensor(const CkptInfo *info, const char *name)
{
    for (int i = 0; i < info->n_tensors; i++)
        if (!strcmp(info->tensors[i].name, name)) return &info->tensors[i];
    cr_assert_fail("no tensor %s", name);
    return NULL;
}

Test(ckpt, export_records_the_topology)
{
    Saved s;
    make_model(&s, CFG, 11);
    const char *path = tmp_path("topo.h5");
    Topology as;
    char err[512];
    cr_assert(topo_init(&as, &s.m.cfg, 2, 2, 3, 2, 1, 0, NULL, err, sizeof err) == 0, "%s", err);
    cr_assert(ckpt_export(path, &s.m, s.ea, s.eas, &s.st, CKPT_F32, &as) == 0);
    CkptInfo info;
    cr_assert(ckpt_info(path, &info, err, sizeof err) == 0, "%s", err);
    cr_expect(info.meta.world == 12 && info.meta.dp == 2 && info.meta.tp == 2 && info.meta.pp == 3 && info.meta.ep == 2);
    const CkptTensor *q = tensor(&info, "model/layers/0/self_attn/q_proj");
    cr_expect_str_eq(q->partition, "pp,tp:0");
    cr_expect(q->chunk[0] == 8 && q->chunk[1] == 16, "chunk = the tp shard [8,16]: [%zu,%zu]", q->chunk[0], q->chunk[1]);
    const CkptTensor *o = tensor(&info, "model/layers/1/self_attn/o_proj");
    cr_expect_str_eq(o->partition, "pp,tp:1");
    cr_expect(o->chunk[0] == 16 && o->chunk[1] == 8);
    const CkptTensor *e = tensor(&info, "model/layers/2/mlp/experts/down_proj");
    cr_expect_str_eq(e->partition, "pp,ep:0,tp:2");
    cr_expect(e->chunk[0] == 2 && e->chunk[1] == 16 && e->chunk[2] == 4);
    cr_expect_str_eq(tensor(&info, "model/layers/2/mlp/gate")->partition, "pp");
    cr_expect_str_eq(tensor(&info, "model/embed_tokens")->partition, "pp");
    cr_expect_str_eq(tensor(&info, "optimizer/exp_avg/model/layers/2/mlp/experts/up_proj")->partition, "pp,ep:0,tp:1");
    /* weights, two moments each, data_rng, rank_rng */
    cr_expect_eq(info.n_tensors, 3 * s.m.n_params + 2);
    cr_expect_str_eq(info.tensors[0].name, "model/embed_tokens", "model order");
    cr_expect_str_eq(info.tensors[info.n_tensors - 1].name, "trainer/rank_rng");
    ckpt_info_free(&info);

    /* and it loads back, whole, bit for bit */
    Model m;
    fresh(&m, path);
    cr_assert(ckpt_load(path, &m, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    EXPECT_BITWISE(m.w, s.m.w, m.n_w, "weights");
    model_free(&m);

    /* a topology that does not divide the model is refused by topo_init */
    cr_expect(topo_init(&as, &s.m.cfg, 1, 4, 1, 1, 1, 0, NULL, err, sizeof err) != 0);
    cr_expect(strstr(err, "tp=4 does not divide num_key_value_heads=2"), "%s", err);
    free_saved(&s);
}

Test(ckpt, big_tensors_get_capped_chunks)
{
    /* [4099, 1024] float32 = 16 MiB, a prime row count: no divisor of 4099
     * fits in 8 MiB, so the rows are split evenly in 3 (1367 rows, 5.3 MiB);
     * [4096, 1024] splits in halves */
    static const char *cfgs[2] = {
        "{\"vocab_size\":4099,\"hidden_size\":1024,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
        "\"moe_intermediate_size\":8,\"num_local_experts\":2,\"num_experts_per_tok\":1,\"max_position_embeddings\":16,"
        "\"tie_word_embeddings\":true}",
        "{\"vocab_size\":4096,\"hidden_size\":1024,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
        "\"moe_intermediate_size\":8,\"num_local_experts\":2,\"num_experts_per_tok\":1,\"max_position_embeddings\":16,"
        "\"tie_word_embeddings\":true}",
    };
    for (int c = 0; c < 2; c++) {
        ModelConfig cfg;
        cfg_of(&cfg, cfgs[c]);
        Topology t;
        topo_single(&t, &cfg);
        Model m;
        model_init(&m, &cfg, &t, false, 16);
        model_init_weights(&m, 1);
        const char *path = tmp_path("big.h5");
        cr_assert(ckpt_save(path, &m, NULL, NULL, NULL, CKPT_F32) == 0);
        CkptInfo info;
        char err[512];
        cr_assert(ckpt_info(path, &info, err, sizeof err) == 0, "%s", err);
        const CkptTensor *e = tensor(&info, "model/embed_tokens");
        size_t want = c == 0 ? 1367 : 2048;
        cr_expect(e->chunk[0] == want && e->chunk[1] == 1024, "chunk [%zu,%zu]", e->chunk[0], e->chunk[1]);
        ckpt_info_free(&info);
        Model back;
        fresh(&back, path);
        cr_assert(ckpt_load(path, &back, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        EXPECT_BITWISE(back.w, m.w, m.n_w, "weights");
        cr_expect(ckpt_verify(path, err, sizeof err) == 0, "%s", err);
        model_free(&back);
        model_free(&m);
    }
}

/* The chunk reader serves any box: partial chunks, edges, conversions. */
Test(ckpt, reads_arbitrary_boxes)
{
    Saved s;
    make_model(&s, CFG, 13);
    Topology as;
    char err[512];
    /* chunks of the expert tensors: [1, 4, 16] (ep=4, tp=2) */
    cr_assert(topo_init(&as, &s.m.cfg, 4, 2, 1, 4, 1, 0, NULL, err, sizeof err) == 0, "%s", err);
    for (int dt = 0; dt < 3; dt++) {
        const char *path = tmp_path("boxes.h5");
        cr_assert(ckpt_export(path, &s.m, NULL, NULL, NULL, (CkptDtype)dt, &as) == 0);
        hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        const Param *p = model_param(&s.m, "model/layers/2/mlp/experts/up_proj");   /* [4, 8, 16] */
        CkptH5Desc d;
        cr_assert(ckpt_h5_describe(f, p->name, &d) == 0);
        for (int k = 0; k < 40; k++) {
            hsize_t off[3], cnt[3];
            for (int i = 0; i < 3; i++) {
                off[i] = rng_mix64((uint64_t)k * 7 + (uint64_t)i) % p->shape[i];
                cnt[i] = 1 + rng_mix64((uint64_t)k * 13 + (uint64_t)i) % (p->shape[i] - off[i]);
            }
            size_t n = (size_t)(cnt[0] * cnt[1] * cnt[2]);
            float *got = td_malloc(n * sizeof(float));
            CkptIoRead *r = ckpt_io_read_new(path, f, err, sizeof err);
            cr_assert(r);
            cr_assert(ckpt_io_read_add(r, p->name, &d, off, cnt, got, err, sizeof err) == 0, "%s", err);
            cr_assert(ckpt_io_read_run(r, err, sizeof err) == 0, "%s", err);
            ckpt_io_read_free(r);
            size_t j = 0;
            for (hsize_t a = 0; a < cnt[0]; a++)
                for (hsize_t b = 0; b < cnt[1]; b++)
                    for (hsize_t c = 0; c < cnt[2]; c++, j++) {
                        float w = p->w[((off[0] + a) * p->shape[1] + off[1] + b) * p->shape[2] + off[2] + c];
                        if (dt == CKPT_BF16) w = dtype_f32_from_bf16(dtype_bf16_from_f32(w));
                        if (dt == CKPT_F16) w = dtype_f32_from_f16(dtype_f16_from_f32(w));
                        cr_assert(!memcmp(&got[j], &w, 4), "dtype %d box %d: element %zu: %a vs %a", dt, k, j,
                                  (double)got[j], (double)w);
                    }
            td_free(got);
        }
        H5Fclose(f);
    }
    free_saved(&s);
}

/* ---------------------------------------------------------------- refusals */

typedef void (*Damage)(const char *path);

static void set_version(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = 2;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
}

static void set_format(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(f, "format");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 8);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "format", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, "pytorch");
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
}

static void drop_dataset(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "model/layers/1/self_attn/q_proj", H5P_DEFAULT);
    H5Fclose(f);
}

static void replace_dataset(const char *path, hsize_t rows, hid_t type)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "model/layers/1/self_attn/q_proj", H5P_DEFAULT);
    hsize_t dims[2] = { rows, 16 };
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t ds = H5Dcreate2(f, "model/layers/1/self_attn/q_proj", type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    double zeros[16 * 16] = { 0 };
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(f);
}

static void reshape(const char *path) { replace_dataset(path, 8, H5T_IEEE_F32LE); }
static void retype(const char *path) { replace_dataset(path, 16, H5T_IEEE_F64LE); }

static void flip_byte(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "model/layers/2/mlp/experts/down_proj", H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    hsize_t off[3];
    unsigned mask;
    haddr_t addr;
    hsize_t size;
    cr_assert(H5Dget_chunk_info(ds, sp, 0, off, &mask, &addr, &size) >= 0);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
    FILE *fp = fopen(path, "r+b");
    fseek(fp, (long)(addr + size / 3), SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, (long)(addr + size / 3), SEEK_SET);
    fputc(c ^ 0x01, fp);
    fclose(fp);
}

static void cut_in_half(const char *path)
{
    struct stat sb;
    stat(path, &sb);
    cr_assert(truncate(path, sb.st_size / 2) == 0);
}

static void refused(Damage damage, const char *file, const char *want1, const char *want2, bool zeroed)
{
    Saved s;
    make_model(&s, CFG, 21);
    const char *p = tmp_path(file);
    char path[512];
    snprintf(path, sizeof path, "%s", p);
    cr_assert(ckpt_save(path, &s.m, s.ea, s.eas, &s.st, CKPT_F32) == 0);
    /* the model that will be refused the file */
    Model m;
    fresh(&m, path);
    damage(path);
    float *ea = td_malloc(m.n_w * sizeof(float)), *eas = td_malloc(m.n_w * sizeof(float));
    for (size_t i = 0; i < m.n_w; i++) ea[i] = eas[i] = 7.0f;
    CkptState st;
    memset(&st, 0, sizeof st);
    char err[512] = "";
    cr_expect(ckpt_load(path, &m, ea, eas, &st, err, sizeof err) != 0, "%s: loaded", file);
    cr_expect(strstr(err, want1) && strstr(err, want2), "%s: message \"%s\" lacks \"%s\" / \"%s\"", file, err, want1,
              want2);
    cr_expect(strstr(err, path), "%s: message names the file: %s", file, err);
    cr_expect(!strchr(err, '\n'), "one line");
    /* nothing loaded: untouched when the metadata was wrong, zeros (never a
     * partial model) after a failed data read */
    float v = zeroed ? 0.0f : 7.0f;
    cr_expect_eq(count_equal(m.w, m.n_w, v), m.n_w, "%s: weights not all %g", file, (double)v);
    cr_expect_eq(count_equal(ea, m.n_w, v), m.n_w, "%s: moments not all %g", file, (double)v);
    cr_expect(st.rank_rng == NULL && st.run_config == NULL);
    char verr[512] = "";
    cr_expect(ckpt_verify(path, verr, sizeof verr) != 0, "%s: verify accepted it", file);
    cr_expect(strstr(verr, want1), "%s: verify says \"%s\"", file, verr);
    td_free(ea);
    td_free(eas);
    model_free(&m);
    free_saved(&s);
}

Test(ckpt, refuses_other_format_version)
{
    refused(set_version, "v2.h5", "attribute format_version is 2", "reads version 1", false);
}
Test(ckpt, refuses_other_format) { refused(set_format, "fmt.h5", "attribute format is \"pytorch\"", "tandem", false); }
Test(ckpt, refuses_missing_dataset)
{
    refused(drop_dataset, "miss.h5", "dataset /model/layers/1/self_attn/q_proj is missing", "", false);
}
Test(ckpt, refuses_wrong_shape)
{
    refused(reshape, "shape.h5", "dataset /model/layers/1/self_attn/q_proj: shape [8,16] does not match the config [16,16]",
            "", false);
}
Test(ckpt, refuses_wrong_dtype)
{
    refused(retype, "dtype.h5", "dataset /model/layers/1/self_attn/q_proj: dtype float64", "", false);
}
Test(ckpt, refuses_corrupt_byte)
{
    refused(flip_byte, "corrupt.h5", "checksum mismatch in dataset /model/layers/2/mlp/experts/down_proj", "", true);
}
Test(ckpt, refuses_truncated_file) { refused(cut_in_half, "trunc.h5", "truncated", "", false); }

Test(ckpt, refuses_other_config)
{
    Saved s;
    make_model(&s, CFG, 23);
    const char *path = tmp_path("cfg.h5");
    cr_assert(ckpt_save(path, &s.m, NULL, NULL, NULL, CKPT_F32) == 0);
    ModelConfig cfg = s.m.cfg;
    cfg.rope_theta = 500000.0;   /* same shapes, another model */
    Topology t;
    topo_single(&t, &cfg);
    Model m;
    model_init(&m, &cfg, &t, false, 16);
    char err[512];
    cr_expect(ckpt_load(path, &m, NULL, NULL, NULL, err, sizeof err) != 0);
    cr_expect(strstr(err, "attribute config: \"rope_theta\" differs"), "%s", err);
    cr_expect(ckpt_read_config(tmp_path("does_not_exist.h5"), &cfg, NULL, err, sizeof err) != 0);
    cr_expect(strstr(err, "No such file"), "%s", err);
    model_free(&m);
    free_saved(&s);
}

/* ---------------------------------------------------------------- run directories */

static void touch(const char *dir, const char *name)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    fclose(f);
}

static bool exists(const char *dir, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

Test(ckpt, latest_resolve_prune)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tmp_path("run"));
    mkdir(dir, 0755);
    char out[700];
    cr_expect(ckpt_resolve(dir, out, sizeof out) != 0, "no latest yet");
    for (int s = 1; s <= 6; s++) {
        char name[64];
        snprintf(name, sizeof name, "step_%08d.h5", s * 10);
        touch(dir, name);
    }
    touch(dir, "step_00000070.h5.tmp");   /* a save that was killed */
    touch(dir, "notes.txt");
    cr_assert(ckpt_set_latest(dir, "step_00000020.h5") == 0);
    cr_assert(ckpt_resolve(dir, out, sizeof out) == 0);
    char want[700];
    snprintf(want, sizeof want, "%s/step_00000020.h5", dir);
    cr_expect_str_eq(out, want);
    cr_assert(ckpt_resolve(want, out, sizeof out) == 0);
    cr_expect_str_eq(out, want, "a file resolves to itself");
    char link[700], target[64];
    snprintf(link, sizeof link, "%s/latest", dir);
    ssize_t n = readlink(link, target, sizeof target - 1);
    cr_assert(n > 0);
    target[n] = 0;
    cr_expect_str_eq(target, "step_00000020.h5", "relative link");
    /* keep 2: 60 and 50, plus 20 (latest); 10, 30, 40 and the .tmp go */
    cr_expect_eq(ckpt_prune(dir, 2), 4);
    cr_expect(exists(dir, "step_00000060.h5") && exists(dir, "step_00000050.h5") && exists(dir, "step_00000020.h5"));
    cr_expect(!exists(dir, "step_00000010.h5") && !exists(dir, "step_00000030.h5") && !exists(dir, "step_00000040.h5"));
    cr_expect(!exists(dir, "step_00000070.h5.tmp") && exists(dir, "notes.txt"));
    cr_expect_eq(ckpt_prune(dir, 0), 0, "keep_last 0 keeps everything");
    cr_assert(ckpt_set_latest(dir, "step_00000060.h5") == 0);
    cr_assert(ckpt_resolve(dir, out, sizeof out) == 0);
    snprintf(want, sizeof want, "%s/step_00000060.h5", dir);
    cr_expect_str_eq(out, want);
}

/* A property-list call that fails is named with the dataset: H5Pset_chunk
 * refuses a chunk with a zero dimension (it used to be ignored, and the
 * error was H5Dcreate's, about filters on an unchunked layout). */
Test(ckpt, failed_property_call_is_named_with_the_dataset)
{
    hid_t f = ckpt_h5_create(tmp_path("plist.h5"), NULL);
    cr_assert(f >= 0, "cannot create the file");
    float data[8] = { 0 };
    CkptPiece pc = { .name = "bad/chunk", .ndim = 2, .shape = { 2, 4 }, .chunk = { 2, 0 }, .cnt = { 2, 4 },
                     .data = data, .type = CKPT_H5_F32 };
    char err[512] = "";
    hid_t ds = ckpt_h5_create_dataset(f, &pc, err, sizeof err);
    cr_assert(ds < 0, "a dataset with a zero chunk dimension was created");
    cr_assert(strstr(err, "dataset /bad/chunk") && strstr(err, "H5Pset_chunk failed"), "message \"%s\"", err);
    /* the next failure is not blamed on it */
    pc.name = "good";
    pc.chunk[1] = 4;
    ds = ckpt_h5_create_dataset(f, &pc, err, sizeof err);
    cr_assert(ds >= 0, "%s", err);
    H5Dclose(ds);
    H5Fclose(f);
}

/* ---------------------------------------------------------------- tokenizer files */

static void write_text(const char *path, const char *s, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    cr_assert(fwrite(s, 1, n, f) == n);
    fclose(f);
}

/* A tokenizer.json of 2.5 MiB (three 1 MiB chunks, the last partial), a
 * small tokenizer_config.json, an empty generation_config.json (absent):
 * saved, verified, listed, loaded and read back byte for byte; absent files
 * stay NULL; a tokenizer.json that is not JSON fails ckpt_verify. */
Test(ckpt, tokenizer_files_roundtrip)
{
    size_t n = (5u << 20) / 2 + 77;
    char *big = td_malloc(n);
    static const char head[] = "{\"model\": {\"vocab\": \"", tail[] = "\"}}";
    memcpy(big, head, sizeof head - 1);
    for (size_t i = sizeof head - 1; i < n; i++) big[i] = (char)('a' + (i * 131u + (i >> 13)) % 26);
    memcpy(big + n - (sizeof tail - 1), tail, sizeof tail - 1);
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tmp_path("hfdir"));
    mkdir(dir, 0755);
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    write_text(p, big, n);
    const char *cfgtxt = "{\"chat_template\": \"{{ x }}\"}";
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_text(p, cfgtxt, strlen(cfgtxt));
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    write_text(p, "", 0);   /* empty: as absent */

    char err[512];
    CkptTokFiles tf;
    cr_assert(ckpt_tok_files_from_dir(dir, &tf, err, sizeof err) == 0, "%s", err);
    cr_assert(tf.tokenizer_json && tf.tokenizer_json_len == n && !memcmp(tf.tokenizer_json, big, n));
    cr_assert(tf.tokenizer_config && tf.tokenizer_config_len == strlen(cfgtxt));
    cr_expect(tf.tokenizer_config[tf.tokenizer_config_len] == 0, "NUL-terminated");
    cr_expect(tf.generation_config == NULL && tf.generation_config_len == 0);

    Saved s;
    make_model(&s, CFG, 5);
    s.st.tok = tf;   /* borrowed by the save */
    char path[700], again[700], none[700];
    snprintf(path, sizeof path, "%s", tmp_path("tok.h5"));
    snprintf(again, sizeof again, "%s", tmp_path("tok2.h5"));
    snprintf(none, sizeof none, "%s", tmp_path("notok.h5"));
    cr_assert(ckpt_save(path, &s.m, NULL, NULL, &s.st, CKPT_BF16) == 0);
    cr_expect(ckpt_verify(path, err, sizeof err) == 0, "%s", err);

    CkptTokFiles back;
    cr_assert(ckpt_read_tok_files(path, &back, err, sizeof err) == 0, "%s", err);
    cr_expect(back.tokenizer_json_len == n && !memcmp(back.tokenizer_json, big, n), "tokenizer.json byte for byte");
    cr_expect(back.tokenizer_config_len == strlen(cfgtxt) && !strcmp(back.tokenizer_config, cfgtxt));
    cr_expect(back.generation_config == NULL);
    ckpt_tok_files_free(&back);
    ckpt_tok_files_free(&back);   /* safe twice */

    /* ckpt_load fills st.tok (owned) */
    Model m;
    fresh(&m, path);
    CkptState st;
    memset(&st, 0, sizeof st);
    cr_assert(ckpt_load(path, &m, NULL, NULL, &st, err, sizeof err) == 0, "%s", err);
    cr_expect(st.tok.tokenizer_json_len == n && !memcmp(st.tok.tokenizer_json, big, n));
    cr_expect(st.tok.tokenizer_config && !strcmp(st.tok.tokenizer_config, cfgtxt));
    /* and a save from that state carries them on */
    cr_assert(ckpt_save(again, &m, NULL, NULL, &st, CKPT_F32) == 0);
    ckpt_state_free(&st);
    ckpt_state_free(&st);
    cr_assert(ckpt_read_tok_files(again, &back, err, sizeof err) == 0, "%s", err);
    cr_expect(back.tokenizer_json_len == n && !memcmp(back.tokenizer_json, big, n));
    ckpt_tok_files_free(&back);

    /* a checkpoint without a tokenizer: 0 and NULLs */
    s.st.tok = (CkptTokFiles){ 0 };
    cr_assert(ckpt_save(none, &s.m, NULL, NULL, &s.st, CKPT_F32) == 0);
    cr_assert(ckpt_read_tok_files(none, &back, err, sizeof err) == 0, "%s", err);
    cr_expect(!back.tokenizer_json && !back.tokenizer_config && !back.generation_config);
    /* the HF directory is read like a checkpoint */
    cr_assert(ckpt_read_tok_files(dir, &back, err, sizeof err) == 0, "%s", err);
    cr_expect(back.tokenizer_json_len == n);
    ckpt_tok_files_free(&back);

    CkptInfo in;
    cr_assert(ckpt_info(path, &in, err, sizeof err) == 0, "%s", err);
    int found = 0;
    for (int i = 0; i < in.n_tensors; i++)
        if (!strcmp(in.tensors[i].name, "tokenizer/tokenizer.json"))
            found = in.tensors[i].numel == n && !strcmp(in.tensors[i].dtype, "uint8");
    cr_expect(found, "ckpt_info lists /tokenizer/tokenizer.json as uint8 [n]");
    ckpt_info_free(&in);

    /* not JSON: refused by verify, naming the dataset */
    tf.tokenizer_json[0] = '#';
    s.st.tok = tf;
    char bad[700];
    snprintf(bad, sizeof bad, "%s", tmp_path("badtok.h5"));
    cr_assert(ckpt_save(bad, &s.m, NULL, NULL, &s.st, CKPT_F32) == 0);
    cr_expect(ckpt_verify(bad, err, sizeof err) != 0 && strstr(err, "/tokenizer/tokenizer.json: not JSON"), "%s", err);

    ckpt_tok_files_free(&tf);
    model_free(&m);
    free_saved(&s);
    td_free(big);
}

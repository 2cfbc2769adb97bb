/* tests/test_safetensors.c - the safetensors reader (checkpoint/hf/safetensors.h):
 *   - files the Python writer made (tests/ref/fixtures_safetensors.py, the
 *     reference layout): every dtype read back as Python wrote it, float32
 *     conversions bit for bit, boxes and ranges against numpy slicing, raw
 *     slices byte for byte, the sharded v5 bf16 Qwen2-MoE and the v4 f32
 *     Mixtral of tests/ref/hf_ref.py tensor by tensor;
 *   - files this test writes: data not aligned for its type (the copy
 *     path), and every malformation, each refused with one line naming the
 *     file and the problem, nothing left open;
 *   - inputs the fuzzer found (tests/fuzz/fuzz_safetensors.c), kept here.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/hf/safetensors.h"
#include "core/common.h"
#include "core/dtype.h"
#include "tests/fixture.h"

static char g_dir[256];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/tandem_test_st_XXXXXX");
    if (!mkdtemp(g_dir)) g_dir[0] = 0;
}

static void teardown(void)
{
    if (!g_dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_safetensors: cannot remove %s\n", g_dir);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

static const char *tmp(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* A safetensors file: the length field (len_field, or the header's own
 * length when 0), the header as given (no padding), then the data. */
static void write_st_len(const char *path, const char *header, uint64_t len_field, const void *data, size_t n)
{
    size_t h = strlen(header);
    uint64_t L = len_field ? len_field : h;
    unsigned char *b = td_malloc(8 + h + n + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(L >> (8 * i));
    memcpy(b + 8, header, h);
    if (n) memcpy(b + 8 + h, data, n);
    write_bytes(path, b, 8 + h + n);
    td_free(b);
}

static void write_st(const char *path, const char *header, const void *data, size_t n)
{
    write_st_len(path, header, 0, data, n);
}

/* Opening path fails with one line that contains want and names `names`,
 * and leaves st empty. */
static void expect_refused(const char *path, const char *names, const char *want)
{
    StCheckpoint st;
    char err[512] = "";
    cr_expect(st_open(&st, path, err, sizeof err) != 0, "%s: opened", path);
    cr_expect(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
    cr_expect(strstr(err, names) != NULL, "message \"%s\" does not name %s", err, names);
    cr_expect(!strchr(err, '\n'), "one line: %s", err);
    cr_expect(st.n_tensors == 0 && st.files == NULL && st.tensors == NULL, "nothing left open");
    st_close(&st);
    EXPECT_NO_LEAKS();
}

static void open_ok(StCheckpoint *st, const char *path)
{
    char err[512] = "";
    cr_assert(st_open(st, path, err, sizeof err) == 0, "%s: %s", path, err);
}

/* ---------------------------------------------------------------- what Python wrote */

/* floats equal bit for bit, NaN matching NaN */
static void expect_same_floats(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        cr_assert(memcmp(&a[i], &b[i], 4) == 0, "%s[%zu]: %a, want %a", what, i, (double)a[i], (double)b[i]);
    }
}

static void expect_raw(const StTensor *t, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "raw/%s", name);
    size_t n;
    int32_t *want = fixture_i32("st_expect.h5", key, &n);
    cr_assert_eq(n, t->nbytes, "%s: %zu bytes, want %zu", name, t->nbytes, n);
    void *copy;
    const unsigned char *b = st_tensor_bytes(t, &copy);
    for (size_t i = 0; i < n; i++) cr_assert_eq(b[i], (unsigned char)want[i], "%s byte %zu", name, i);
    td_free(copy);
    td_free(want);
}

Test(safetensors, reads_every_dtype_as_python_wrote_it)
{
    StCheckpoint st;
    open_ok(&st, fixture_path("st_dtypes.safetensors"));
    cr_expect_eq(st.n_files, 1);
    cr_expect(!st.sharded);
    cr_expect_str_eq(st_metadata(&st, 0, "format"), "pt");
    cr_expect_str_eq(st_metadata(&st, 0, "note"), "fixture");
    cr_expect_null(st_metadata(&st, 0, "absent"));
    static const struct { const char *name; StDtype dt; int ndim; uint64_t shape[3]; } want[] = {
        { "experts.f32", ST_F32, 3, { 5, 6, 7 } }, { "experts.bf16", ST_BF16, 3, { 5, 6, 7 } },
        { "experts.f16", ST_F16, 3, { 5, 6, 7 } }, { "vec.f64", ST_F64, 1, { 9 } },
        { "mat.i8", ST_I8, 2, { 3, 5 } },          { "mat.u8", ST_U8, 2, { 2, 7 } },
        { "mat.i16", ST_I16, 2, { 4, 3 } },        { "ids.i32", ST_I32, 1, { 6 } },
        { "ids.i64", ST_I64, 2, { 2, 2 } },        { "mask.bool", ST_BOOL, 2, { 3, 3 } },
        { "scalar.f32", ST_F32, 0, { 0 } },        { "empty.f32", ST_F32, 2, { 0, 3 } },
        { "edge.f16", ST_F16, 1, { 6 } },          { "edge.bf16", ST_BF16, 1, { 6 } },
        { "all.f8", ST_F8_E4M3, 2, { 16, 16 } },
    };
    size_t n_want = sizeof want / sizeof want[0];
    cr_expect_eq(st.n_tensors, n_want);
    for (size_t i = 0; i + 1 < st.n_tensors; i++)
        cr_expect(strcmp(st.tensors[i].name, st.tensors[i + 1].name) < 0, "sorted by name");
    for (size_t k = 0; k < n_want; k++) {
        const StTensor *t = st_find(&st, want[k].name);
        cr_assert(t, "%s missing", want[k].name);
        cr_expect_eq(t->dtype, want[k].dt, "%s: dtype %s", want[k].name, st_dtype_name(t->dtype));
        cr_expect_eq(t->ndim, want[k].ndim, "%s: ndim", want[k].name);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            cr_expect_eq(t->shape[d], want[k].shape[d], "%s: shape[%d]", want[k].name, d);
            numel *= want[k].shape[d];
        }
        cr_expect_eq(t->numel, numel, "%s: numel", want[k].name);
        cr_expect_eq(t->nbytes, numel * st_dtype_size(t->dtype));
        cr_expect(t->aligned, "%s: the reference layout aligns every tensor", want[k].name);
        if (numel) expect_raw(t, want[k].name);
        char err[256] = "";
        float *y = td_malloc((numel + 1) * sizeof(float));
        if (st_dtype_to_f32(t->dtype)) {
            cr_assert(st_read_f32(t, y, numel, err, sizeof err) == 0, "%s: %s", want[k].name, err);
            if (numel) {
                char key[128];
                snprintf(key, sizeof key, "f32/%s", want[k].name);
                size_t n;
                float *ref = fixture_f32("st_expect.h5", key, &n);
                cr_assert_eq(n, numel);
                expect_same_floats(y, ref, n, want[k].name);
                td_free(ref);
            }
        } else {
            cr_expect(st_read_f32(t, y, numel, err, sizeof err) != 0, "%s converted", want[k].name);
            cr_expect(strstr(err, "does not convert to float32") && strstr(err, st_dtype_name(t->dtype)), "%s", err);
        }
        td_free(y);
    }
    cr_expect_null(st_find(&st, "experts"), "no prefix matches");
    cr_expect_null(st_find(&st, "zzz"));
    const StTensor *s = st_find(&st, "scalar.f32");
    float v = 0;
    char err[256];
    cr_assert(st_read_f32(s, &v, 1, err, sizeof err) == 0);
    cr_expect_eq(v, 2.5f);
    cr_expect(st_read_f32(s, &v, 2, err, sizeof err) != 0 && strstr(err, "1 elements, not the 2"), "%s", err);
    st_close(&st);
    st_close(&st);   /* safe twice */
    EXPECT_NO_LEAKS();
}

Test(safetensors, boxes_and_ranges_match_numpy_slicing)
{
    static const char *const names[] = { "experts.f32", "experts.bf16", "experts.f16" };
    StCheckpoint st;
    open_ok(&st, fixture_path("st_dtypes.safetensors"));
    int n = (int)fixture_attr("st_expect.h5", "n_slices");
    cr_assert(n >= 27);
    char err[256];
    for (int i = 0; i < n; i++) {
        char key[64];
        size_t k;
        snprintf(key, sizeof key, "slice/%d/which", i);
        int32_t *which = fixture_i32("st_expect.h5", key, &k);
        snprintf(key, sizeof key, "slice/%d/start", i);
        int32_t *s32 = fixture_i32("st_expect.h5", key, &k);
        snprintf(key, sizeof key, "slice/%d/count", i);
        int32_t *c32 = fixture_i32("st_expect.h5", key, &k);
        uint64_t start[3], count[3], numel = 1;
        for (int d = 0; d < 3; d++) {
            start[d] = (uint64_t)s32[d];
            count[d] = (uint64_t)c32[d];
            numel *= count[d];
        }
        const StTensor *t = st_find(&st, names[which[0]]);
        cr_assert(t);
        float *y = td_malloc((numel + 1) * sizeof(float));
        unsigned char *raw = td_malloc(numel * st_dtype_size(t->dtype) + 1);
        cr_assert(st_read_slice_f32(t, start, count, y, err, sizeof err) == 0, "slice %d: %s", i, err);
        cr_assert(st_read_slice_raw(t, start, count, raw, err, sizeof err) == 0, "slice %d: %s", i, err);
        if (numel) {
            snprintf(key, sizeof key, "slice/%d/want", i);
            float *want = fixture_f32("st_expect.h5", key, &k);
            cr_assert_eq(k, numel, "slice %d", i);
            char what[64];
            snprintf(what, sizeof what, "slice %d of %s", i, names[which[0]]);
            EXPECT_BITWISE(y, want, numel, what);
            snprintf(key, sizeof key, "slice/%d/raw", i);
            int32_t *rb = fixture_i32("st_expect.h5", key, &k);
            cr_assert_eq(k, numel * st_dtype_size(t->dtype));
            for (size_t b = 0; b < k; b++) cr_assert_eq(raw[b], (unsigned char)rb[b], "%s: raw byte %zu", what, b);
            td_free(rb);
            td_free(want);
        }
        /* a range along one dimension is the box with the others whole */
        for (int d = 0; d < 3; d++) {
            uint64_t b0 = t->shape[d] / 3, e0 = t->shape[d] - 1;
            uint64_t bs[3] = { 0, 0, 0 }, bc[3] = { t->shape[0], t->shape[1], t->shape[2] };
            bs[d] = b0;
            bc[d] = e0 - b0;
            size_t m = (size_t)(bc[0] * bc[1] * bc[2]);
            float *r1 = td_malloc(m * sizeof(float)), *r2 = td_malloc(m * sizeof(float));
            cr_assert(st_read_range_f32(t, d, b0, e0, r1, err, sizeof err) == 0, "%s", err);
            cr_assert(st_read_slice_f32(t, bs, bc, r2, err, sizeof err) == 0, "%s", err);
            EXPECT_BITWISE(r1, r2, m, "range == box");
            td_free(r1);
            td_free(r2);
        }
        td_free(y);
        td_free(raw);
        td_free(which);
        td_free(s32);
        td_free(c32);
    }
    /* boxes outside the shape are refused, naming the tensor */
    const StTensor *t = st_find(&st, "experts.f32");
    float y[64];
    uint64_t s1[3] = { 4, 0, 0 }, c1[3] = { 2, 1, 1 }, s2[3] = { 0, 0, 8 }, c2[3] = { 1, 1, 0 };
    uint64_t s3[3] = { 0, 0, 1 }, c3[3] = { 1, 1, UINT64_MAX };
    cr_expect(st_read_slice_f32(t, s1, c1, y, err, sizeof err) != 0 && strstr(err, "outside its shape [5, 6, 7]") &&
              strstr(err, "experts.f32"), "%s", err);
    cr_expect(st_read_slice_f32(t, s2, c2, y, err, sizeof err) != 0, "start past the end, even when empty");
    cr_expect(st_read_slice_raw(t, s3, c3, y, err, sizeof err) != 0, "count overflowing start + count");
    cr_expect(st_read_range_f32(t, 3, 0, 1, y, err, sizeof err) != 0 && strstr(err, "dimension 3"), "%s", err);
    cr_expect(st_read_range_f32(t, 0, 3, 2, y, err, sizeof err) != 0, "end before begin");
    st_close(&st);
    EXPECT_NO_LEAKS();
}

/* Every tensor of an HF directory made by tests/ref/hf_ref.py equals what
 * Python wrote, and no tensor is unexpected. */
static void check_hf_dir(const char *dir, const char *tag, int n_files, bool sharded)
{
    StCheckpoint st;
    open_ok(&st, fixture_path(dir));
    cr_expect_eq(st.n_files, n_files);
    cr_expect_eq(st.sharded, sharded);
    char key[160];
    snprintf(key, sizeof key, "n_%s", tag);
    cr_expect_eq((double)st.n_tensors, fixture_attr("st_expect.h5", key), "%s: %zu tensors", dir, st.n_tensors);
    bool used[8] = { false };
    for (size_t i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        snprintf(key, sizeof key, "%s/%s", tag, t->name);
        size_t n;
        float *want = fixture_f32("st_expect.h5", key, &n);
        cr_assert_eq(n, t->numel, "%s", t->name);
        float *y = td_malloc(n * sizeof(float));
        char err[256];
        cr_assert(st_read_f32(t, y, n, err, sizeof err) == 0, "%s", err);
        EXPECT_BITWISE(y, want, n, t->name);
        cr_expect(st_find(&st, t->name) == t);
        used[t->file] = true;
        td_free(y);
        td_free(want);
    }
    for (int f = 0; f < n_files; f++) cr_expect(used[f], "file %d holds tensors", f);
    st_close(&st);
}

Test(safetensors, reads_a_sharded_v5_bf16_qwen2_moe_as_python_wrote_it)
{
    check_hf_dir("st_hf_q2", "hf_q2", 3, true);
    /* the fused experts as a rank reads them: experts [2, 6) (ep), and the
     * up half of gate_up_proj, rows [I, 2I) (the split tandem's import makes) */
    StCheckpoint st;
    open_ok(&st, fixture_path("st_hf_q2/model.safetensors.index.json"));   /* the index path opens too */
    const StTensor *t = st_find(&st, "model.layers.2.mlp.experts.gate_up_proj");
    cr_assert(t && t->dtype == ST_BF16 && t->ndim == 3);
    uint64_t E = t->shape[0], I2 = t->shape[1], d = t->shape[2];
    cr_expect(E == 8 && I2 == 64 && d == 64);
    size_t n;
    float *all = fixture_f32("st_expect.h5", "hf_q2/model.layers.2.mlp.experts.gate_up_proj", &n);
    uint64_t s[3] = { 2, I2 / 2, 0 }, c[3] = { 4, I2 / 2, d };
    float *y = td_malloc(4 * 32 * 64 * sizeof(float));
    char err[256];
    cr_assert(st_read_slice_f32(t, s, c, y, err, sizeof err) == 0, "%s", err);
    for (uint64_t e = 0; e < 4; e++)
        for (uint64_t r = 0; r < I2 / 2; r++)
            for (uint64_t k = 0; k < d; k++) {
                float want = all[((e + 2) * I2 + I2 / 2 + r) * d + k];
                cr_assert(memcmp(&y[(e * (I2 / 2) + r) * d + k], &want, 4) == 0, "[%lu, %lu, %lu]",
                          (unsigned long)e, (unsigned long)r, (unsigned long)k);
            }
    td_free(y);
    td_free(all);
    st_close(&st);
    EXPECT_NO_LEAKS();
}

Test(safetensors, reads_a_v4_f32_mixtral_as_python_wrote_it)
{
    check_hf_dir("st_hf_mx", "hf_mx", 1, false);
    EXPECT_NO_LEAKS();
}

/* ---------------------------------------------------------------- alignment */

/* A header of odd length (legal: only the reference's writer pads) puts the
 * data at an odd address: F32 and BF16 values must come through the copy
 * path, never a misaligned typed read (UBSan's alignment check watches). */
Test(safetensors, copies_data_not_aligned_for_its_type)
{
    float f[6] = { 1.5f, -2.25f, 3.0e-38f, 65504.0f, -0.0f, 7.0f };
    uint16_t b[6];
    for (int i = 0; i < 6; i++) b[i] = dtype_bf16_from_f32(f[i] * 3.0f);
    unsigned char data[24 + 12 + 1];
    memcpy(data, f, 24);
    memcpy(data + 24, b, 12);
    data[36] = 0x38;   /* F8_E4M3 1.0 */
    char hdr[256];
    snprintf(hdr, sizeof hdr, "%s",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[6],\"data_offsets\":[24,36]},"
             "\"c\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[36,37]}}");
    if (strlen(hdr) % 2 == 0) strcat(hdr, " ");   /* an odd length: the data starts at an odd address */
    const char *path = tmp("odd.safetensors");
    write_st(path, hdr, data, sizeof data);
    StCheckpoint st;
    open_ok(&st, path);
    const StTensor *a = st_find(&st, "a"), *bt = st_find(&st, "b"), *c = st_find(&st, "c");
    cr_assert(a && bt && c);
    cr_expect(!a->aligned && !bt->aligned && c->aligned, "alignment flags");
    void *copy;
    const void *p = st_tensor_bytes(a, &copy);
    cr_expect(copy != NULL && p == copy && p != (const void *)a->data, "a misaligned tensor is copied");
    cr_expect((uintptr_t)p % 4 == 0);
    float fa[6];
    memcpy(fa, p, 24);
    EXPECT_BITWISE(fa, f, 6, "the copy");
    td_free(copy);
    float y[6], want[6];
    char err[256];
    cr_assert(st_read_f32(a, y, 6, err, sizeof err) == 0, "%s", err);
    EXPECT_BITWISE(y, f, 6, "F32 at an odd address");
    cr_assert(st_read_f32(bt, y, 6, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 6; i++) want[i] = dtype_f32_from_bf16(b[i]);
    EXPECT_BITWISE(y, want, 6, "BF16 at an odd address");
    uint64_t s[2] = { 1, 1 }, cn[2] = { 1, 2 };
    cr_assert(st_read_slice_f32(a, s, cn, y, err, sizeof err) == 0);
    cr_expect(y[0] == f[4] && y[1] == f[5], "a box at an odd address");
    cr_assert(st_read_f32(c, y, 1, err, sizeof err) == 0 && y[0] == 1.0f);
    /* a long misaligned BF16 run crosses the scratch block's size */
    enum { N = 10000 };
    unsigned char *big = td_malloc(2 * N + 2);
    uint16_t *vals = td_malloc(N * sizeof *vals);
    for (int i = 0; i < N; i++) vals[i] = (uint16_t)(0x3f80 + (i % 4000));
    big[0] = 7;
    memcpy(big + 1, vals, 2 * N);
    char h2[256];
    snprintf(h2, sizeof h2,
             "{\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"v\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[1,%d]}}  ",
             N, 1 + 2 * N);
    const char *p2 = tmp("odd2.safetensors");
    write_st(p2, h2, big, 1 + 2 * N);
    StCheckpoint s2;
    open_ok(&s2, p2);
    const StTensor *v = st_find(&s2, "v");
    cr_assert(v);
    cr_expect(v->aligned == ((uintptr_t)v->data % 2 == 0));
    float *yy = td_malloc(N * sizeof(float)), *ww = td_malloc(N * sizeof(float));
    dtype_bf16_to_f32(ww, vals, N);
    cr_assert(st_read_f32(v, yy, N, err, sizeof err) == 0);
    EXPECT_BITWISE(yy, ww, N, "long BF16 run");
    td_free(yy);
    td_free(ww);
    td_free(big);
    td_free(vals);
    st_close(&s2);
    st_close(&st);
    EXPECT_NO_LEAKS();
}

Test(safetensors, opens_a_buffer_and_an_empty_file)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"}}";
    unsigned char buf[64];
    size_t h = strlen(hdr);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, hdr, h);
    StCheckpoint st;
    char err[256] = "";
    cr_assert(st_open_buffer(&st, buf, 8 + h, "mem", err, sizeof err) == 0, "%s", err);
    cr_expect_eq(st.n_tensors, 0);
    cr_expect_str_eq(st_metadata(&st, 0, "format"), "pt");
    st_close(&st);
    /* the reference's serialisation of nothing: "{}" padded to 8 */
    write_st(tmp("empty.safetensors"), "{}      ", NULL, 0);
    open_ok(&st, tmp("empty.safetensors"));
    cr_expect_eq(st.n_tensors, 0);
    st_close(&st);
    cr_expect(st_open_buffer(&st, NULL, 0, "nothing", err, sizeof err) != 0 && strstr(err, "nothing: 0 bytes"),
              "%s", err);
    EXPECT_NO_LEAKS();
}

/* ---------------------------------------------------------------- refusals */

#define T1 "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}"
static const unsigned char ZEROS[256];

static void refused_header(const char *header, size_t data_len, const char *want)
{
    const char *p = tmp("bad.safetensors");
    write_st(p, header, ZEROS, data_len);
    expect_refused(p, p, want);
}

Test(safetensors, refuses_a_header_length_beyond_the_file)
{
    const char *p = tmp("len.safetensors");
    write_st_len(p, T1, strlen(T1) + 1000, ZEROS, 24);
    expect_refused(p, p, "runs past the end of the");
    write_st_len(p, T1, (uint64_t)ST_MAX_HEADER + 1, ZEROS, 24);
    expect_refused(p, p, "exceeds the limit of 100000000 bytes");
    write_st_len(p, T1, UINT64_MAX, ZEROS, 24);
    expect_refused(p, p, "exceeds the limit");
    write_bytes(p, "\x05\0\0", 3);
    expect_refused(p, p, "too short for the 8-byte header length");
}

Test(safetensors, refuses_a_header_that_is_not_a_json_object)
{
    refused_header("{\"t\":{\"dtype\":\"F32\",", 0, "header is not JSON");
    refused_header("[1, 2, 3]", 0, "header is not a JSON object");
    refused_header("\"text\"", 0, "header is not a JSON object");
    refused_header("{}  xyz", 0, "header has bytes after its JSON object");
    refused_header("{}\x01", 0, "header has bytes after its JSON object");
    refused_header("{\"\xff\xfe\":1}", 0, "header is not valid UTF-8");
    refused_header("{\"\xed\xa0\x80\":1}", 0, "not valid UTF-8");   /* a surrogate */
    refused_header("{\"\xc0\xaf\":1}", 0, "not valid UTF-8");       /* overlong '/' */
    refused_header("{\"t\":5}", 0, "tensor 't': header entry is not an object");
}

Test(safetensors, refuses_offsets_that_are_not_contiguous)
{
    refused_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                   20, "tensor 'b': data_offsets [12, 20] leave a gap of 4 bytes after tensor 'a'");
    refused_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                   "the first tensor must begin at 0");
}

Test(safetensors, refuses_overlapping_offsets)
{
    refused_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                   16, "data_offsets [8, 16] overlap tensor 'a' [0, 16]");
    /* the same range twice */
    refused_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                   8, "overlap tensor");
}

Test(safetensors, refuses_offsets_past_the_end_and_uncovered_bytes)
{
    refused_header(T1, 20, "tensor 't': data_offsets [0, 24] run past the end of the 20-byte data section");
    refused_header(T1, 30, "the tensors cover 24 bytes of the 30-byte data section: 6 bytes at the end belong to no tensor");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                   "data_offsets [8, 0] end before they begin");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                   "data_offsets is not [begin, end]");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 8,
                   "data_offsets is not [begin, end]");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e300]}}", 8,
                   "data_offsets is not [begin, end]");
}

Test(safetensors, refuses_a_size_that_does_not_match_the_shape)
{
    refused_header("{\"t\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "tensor 't': shape [2, 3] of BF16 needs 12 bytes but data_offsets [0, 24] hold 24");
}

Test(safetensors, refuses_a_duplicate_name)
{
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   8, "tensor 't' appears twice in the header");
    refused_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ appears twice");
    refused_header("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "__metadata__ key 'k' appears twice");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                   "'dtype' given twice");
}

Test(safetensors, refuses_a_bad_dtype)
{
    refused_header("{\"t\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 't': unknown dtype 'F7'");
    refused_header("{\"t\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'f32'");
    refused_header("{\"t\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, "dtype F4 (sub-byte) is not supported");
    refused_header("{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not a string");
    refused_header("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 't': missing 'dtype'");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "missing 'data_offsets'");
}

Test(safetensors, refuses_negative_fractional_huge_or_too_many_dimensions)
{
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                   "tensor 't': shape[0] is not an integer in [0, 2^53)");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,4]}}", 4, "shape[1] is not an integer");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", 4, "shape[0] is not an integer");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[9007199254740993],\"data_offsets\":[0,4]}}", 4,
                   "shape[0] is not an integer in [0, 2^53)");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4,
                   "shape [4294967296, 4294967296] (and more) overflows 64 bits");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,4]}}", 4,
                   "of F32 overflows 64 bits");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                   "shape has 9 dimensions, more than 8");
    refused_header("{\"t\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4, "shape is not an array");
    /* a zero dimension makes any other one harmless: the reference accepts it */
    const char *p = tmp("zero.safetensors");
    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[0,4503599627370496],\"data_offsets\":[0,0]}}", NULL, 0);
    StCheckpoint st;
    open_ok(&st, p);
    cr_expect(st.n_tensors == 1 && st.tensors[0].numel == 0);
    st_close(&st);
}

Test(safetensors, refuses_metadata_that_is_not_string_to_string)
{
    refused_header("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__ must map strings to strings ('format' is not a string)");
    refused_header("{\"__metadata__\":[\"pt\"]}", 0, "__metadata__ is not an object");
}

Test(safetensors, refuses_a_truncated_file)
{
    /* a file Python wrote, cut: inside the data, then inside the header */
    const char *src = fixture_path("st_hf_mx/model.safetensors");
    FILE *f = fopen(src, "rb");
    cr_assert(f, "%s", src);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = td_malloc((size_t)n);
    cr_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    const char *p1 = tmp("cut1.safetensors"), *p2 = tmp("cut2.safetensors"), *p3 = tmp("cut3.safetensors");
    write_bytes(p1, b, (size_t)n - 100);
    write_bytes(p2, b, 500);
    write_bytes(p3, b, 5);
    td_free(b);
    expect_refused(p1, p1, "run past the end of the");
    expect_refused(p2, p2, "header length");
    expect_refused(p3, p3, "too short");
    expect_refused(tmp("absent.safetensors"), "absent.safetensors", "cannot open: No such file or directory");
    expect_refused(g_dir, g_dir, "no model.safetensors or model.safetensors.index.json in this directory");
}

/* ---------------------------------------------------------------- sharded sets */

static const char *make_shards(const char *sub, const char *index_json)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    cr_assert(mkdir(dir, 0755) == 0);
    char p[600];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    write_st(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", ZEROS, 8);
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_st(p, "{\"z\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", ZEROS, 4);
    snprintf(p, sizeof p, "%s/%s", dir, ST_INDEX_NAME);
    write_bytes(p, index_json, strlen(index_json));
    return dir;
}

Test(safetensors, opens_a_consistent_index)
{
    const char *dir = make_shards("ok", "{\"metadata\":{\"total_size\":12},\"weight_map\":"
                                        "{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"b.safetensors\"}}");
    StCheckpoint st;
    open_ok(&st, dir);
    cr_expect(st.sharded && st.n_files == 2 && st.n_tensors == 3);
    cr_expect(st_find(&st, "z")->file == 1 && st_find(&st, "x")->file == 0);
    st_close(&st);
    EXPECT_NO_LEAKS();
}

static void refused_index(const char *sub, const char *index_json, const char *want)
{
    const char *dir = make_shards(sub, index_json);
    char ipath[600];
    snprintf(ipath, sizeof ipath, "%s/%s", dir, ST_INDEX_NAME);
    expect_refused(dir, ipath, want);
}

Test(safetensors, refuses_an_index_naming_a_missing_file)
{
    refused_index("mf", "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"c.safetensors\"}}",
                  "weight_map names 'c.safetensors', which does not exist");
}

Test(safetensors, refuses_an_index_naming_a_tensor_its_file_lacks)
{
    refused_index("mt", "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"w\":\"a.safetensors\","
                        "\"z\":\"b.safetensors\"}}",
                  "weight_map puts tensor 'w' in 'a.safetensors', which does not hold it");
    refused_index("mt2", "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\",\"z\":\"b.safetensors\"}}",
                  "weight_map puts tensor 'y' in 'b.safetensors', but it is in 'a.safetensors'");
}

Test(safetensors, refuses_a_tensor_missing_from_the_index)
{
    refused_index("mi", "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"b.safetensors\"}}",
                  "tensor 'y' of 'a.safetensors' is missing from weight_map");
}

Test(safetensors, refuses_a_tensor_in_two_shards)
{
    const char *dir = make_shards("two", "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\","
                                         "\"z\":\"b.safetensors\"}}");
    char p[600];
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_st(p, "{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"z\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}", ZEROS, 8);
    snprintf(p, sizeof p, "%s/%s", dir, ST_INDEX_NAME);
    expect_refused(dir, p, "tensor 'y' is in both");
}

Test(safetensors, refuses_a_malformed_index)
{
    refused_index("e1", "{\"weight_map\":{\"x\":\"../a.safetensors\"}}",
                  "weight_map['x'] names '../a.safetensors', not a file of the directory");
    refused_index("e2", "{\"weight_map\":{\"x\":\"/etc/passwd\"}}", "not a file of the directory");
    refused_index("e3", "{\"weight_map\":{\"x\":3}}", "weight_map['x'] is not a file name");
    refused_index("e4", "{\"metadata\":{}}", "no \"weight_map\" object");
    refused_index("e5", "{\"weight_map\":{}}", "weight_map is empty");
    refused_index("e6", "not json", "not a JSON object");
    refused_index("e7", "{\"weight_map\":{\"x\":\"a.safetensors\",\"x\":\"a.safetensors\",\"y\":\"a.safetensors\","
                        "\"z\":\"b.safetensors\"}}",
                  "weight_map lists tensor 'x' twice");
    /* a shard that is itself damaged is named */
    const char *dir = make_shards("e8", "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\","
                                        "\"z\":\"b.safetensors\"}}");
    char p[600];
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_st(p, "{\"z\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", ZEROS, 2);
    expect_refused(dir, p, "run past the end");
}

/* ---------------------------------------------------------------- names in messages */

Test(safetensors, quotes_unprintable_names_on_one_line)
{
    refused_header("{\"a\\nb\":{\"dtype\":\"F9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                   "tensor 'a\\x0ab': unknown dtype 'F9'");
}

/* ---------------------------------------------------------------- the fuzz corpus */

/* Every input of tests/fuzz/corpus/safetensors (the seeds and what the
 * fuzzer kept, crashes included once fixed) is refused with one line or
 * read whole without leaving the map (ASan in make asan-test). */
Test(safetensors, replays_the_fuzz_corpus)
{
    const char *dir = "tests/fuzz/corpus/safetensors";
    DIR *d = opendir(dir);
    cr_assert(d, "%s: run the unit tests from the repository root", dir);
    int n = 0, accepted = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        StCheckpoint st;
        char err[512] = "";
        n++;
        if (st_open(&st, p, err, sizeof err) != 0) {
            cr_expect(err[0] && !strchr(err, '\n') && strstr(err, p), "%s: \"%s\"", p, err);
            continue;
        }
        accepted++;
        for (size_t i = 0; i < st.n_tensors; i++) {
            const StTensor *t = &st.tensors[i];
            unsigned char *raw = td_malloc(t->nbytes + 1);
            uint64_t start[ST_MAX_DIMS] = { 0 };
            cr_expect(st_read_slice_raw(t, start, t->shape, raw, err, sizeof err) == 0, "%s: %s", p, err);
            td_free(raw);
            if (st_dtype_to_f32(t->dtype)) {
                float *y = td_malloc(t->numel * sizeof(float) + 1);
                cr_expect(st_read_f32(t, y, t->numel, err, sizeof err) == 0, "%s: %s", p, err);
                td_free(y);
            }
        }
        st_close(&st);
    }
    closedir(d);
    cr_expect(n >= 7 && accepted >= 5, "%d inputs, %d accepted", n, accepted);
    EXPECT_NO_LEAKS();
}

/* The same for tests/fuzz/corpus/st_index: each input is the index of the
 * two shards fuzz_st_index.c opens it against. */
Test(safetensors, replays_the_index_fuzz_corpus)
{
    const char *dir = "tests/fuzz/corpus/st_index";
    DIR *d = opendir(dir);
    cr_assert(d, "%s: run the unit tests from the repository root", dir);
    unsigned char data[14];
    for (int i = 0; i < 14; i++) data[i] = (unsigned char)(i * 37);
    write_st(tmp("a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                   "\"y\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}", data, 14);
    write_st(tmp("b.safetensors"), "{\"z\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}", data, 2);
    int n = 0, accepted = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[512], buf[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        cr_assert(f);
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        write_bytes(tmp(ST_INDEX_NAME), buf, len);
        StCheckpoint st;
        char err[512] = "";
        n++;
        if (st_open(&st, g_dir, err, sizeof err) != 0) {
            cr_expect(err[0] && !strchr(err, '\n'), "%s: \"%s\"", p, err);
            continue;
        }
        accepted++;
        cr_expect(st.n_tensors == 3, "%s: a consistent index lists all three", p);
        st_close(&st);
    }
    closedir(d);
    cr_expect(n >= 4 && accepted >= 1, "%d inputs, %d accepted", n, accepted);
    EXPECT_NO_LEAKS();
}

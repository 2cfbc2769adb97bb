/* tests/fixture.c - fixture reading and comparison (fixture.h). */
#include "tests/fixture.h"
#include "core/common.h"
#include "core/model/config.h"
#include "core/rng.h"

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fixture_dir(void)
{
    const char *d = getenv("TANDEM_FIXTURES");
    return d ? d : "build/fixtures";
}

const char *fixture_path(const char *file)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", fixture_dir(), file);
    return buf;
}

static void *read_ds(const char *file, const char *name, hid_t memtype, size_t elem, size_t *n)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    const char *path = fixture_path(file);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    TD_CHECK(f >= 0, "fixture %s missing: run tests/run.sh (it generates fixtures with PyTorch)", path);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    TD_CHECK(ds >= 0, "fixture %s has no dataset %s", path, name);
    hid_t sp = H5Dget_space(ds);
    hssize_t cnt = H5Sget_simple_extent_npoints(sp);
    void *buf = td_malloc((size_t)(cnt > 0 ? cnt : 1) * elem);
    TD_CHECK(H5Dread(ds, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0,
             "fixture %s: cannot read %s", path, name);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
    *n = (size_t)cnt;
    return buf;
}

float *fixture_f32(const char *file, const char *name, size_t *n)
{
    return read_ds(file, name, H5T_NATIVE_FLOAT, sizeof(float), n);
}

int32_t *fixture_i32(const char *file, const char *name, size_t *n)
{
    return read_ds(file, name, H5T_NATIVE_INT32, sizeof(int32_t), n);
}

double fixture_attr(const char *file, const char *name)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    const char *path = fixture_path(file);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    TD_CHECK(f >= 0, "fixture %s missing", path);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    TD_CHECK(a >= 0, "fixture %s has no attribute %s", path, name);
    double v = 0;
    TD_CHECK(H5Aread(a, H5T_NATIVE_DOUBLE, &v) >= 0, "fixture %s: cannot read attribute %s", path, name);
    H5Aclose(a);
    H5Fclose(f);
    return v;
}

double fixture_err(const float *a, const float *b, size_t n, double atol, double rtol, size_t *worst)
{
    double e = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            *worst = i;
            return INFINITY;
        }
        double r = fabs((double)a[i] - (double)b[i]) / (atol + rtol * fabs((double)b[i]));
        if (r > e) {
            e = r;
            *worst = i;
        }
    }
    return e;
}

void fixture_fill(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t key = rng_mix64(seed ^ 0x7465737466696c6cULL);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)rng_uniform_at(key, i);
}

float fixture_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

float *fixture_rand(size_t n, uint64_t seed, float lo, float hi)
{
    float *x = td_malloc((n > 0 ? n : 1) * sizeof(float));
    fixture_fill(x, n, seed, lo, hi);
    return x;
}

float *fixture_copy(const float *x, size_t n)
{
    float *y = td_malloc((n > 0 ? n : 1) * sizeof(float));
    if (n) memcpy(y, x, n * sizeof(float));
    return y;
}

void fixture_fd(double *g, FixtureLossFn f, void *ctx, double *x, size_t n, double h)
{
    for (size_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(x, ctx);
        x[i] = x0 - h;
        double fm = f(x, ctx);
        x[i] = x0;
        g[i] = (fp - fm) / (2.0 * h);
    }
}

size_t fixture_first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]) || !isfinite(b[i]) || memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return n;
}

float *fixture_case_f32(const char *file, int c, const char *name, size_t *n)
{
    char path[256];
    size_t cnt;
    snprintf(path, sizeof path, "c%d/%s", c, name);
    float *x = fixture_f32(file, path, &cnt);
    if (n) *n = cnt;
    return x;
}

int32_t *fixture_case_i32(const char *file, int c, const char *name, size_t *n)
{
    char path[256];
    size_t cnt;
    snprintf(path, sizeof path, "c%d/%s", c, name);
    int32_t *x = fixture_i32(file, path, &cnt);
    if (n) *n = cnt;
    return x;
}

void fixture_model(Model *m, const char *config_json, uint64_t seed)
{
    ModelConfig cfg;
    char err[256];
    TD_CHECK(config_parse(&cfg, config_json, err, sizeof err) == 0, "fixture_model: %s", err);
    Topology t;
    topo_single(&t, &cfg);
    model_init(m, &cfg, &t, false, 16);
    model_init_weights(m, seed);
}

void fixture_gqa_serving(Model *m, Model *s, const char *keys, int max_positions, uint64_t seed, Dtype w, Dtype kv)
{
    char js[512];
    snprintf(js, sizeof js,
             "{\"vocab_size\": 64, \"hidden_size\": 64, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, %s,"
             " \"moe_intermediate_size\": 32, \"num_local_experts\": 4,"
             " \"num_experts_per_tok\": 2, \"max_position_embeddings\": %d}",
             keys, max_positions);
    fixture_model(m, js, seed);
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        if (p->ndim == 1 && p->w)
            for (size_t j = 0; j < p->numel; j++) p->w[j] += 0.3f * (float)sin(0.7 * (double)j + i);
    }
    const ModelDtypes dt = { w, w, w, w };
    model_init_serving(s, &m->cfg, &m->topo, 16, &dt);
    model_quantize_from(s, m);
    s->attn.kv = kv;
}

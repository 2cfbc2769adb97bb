/* checkpoint/ckpt_model.c - checkpoint to ready model; small HDF5 outputs
 * (ckpt_model.h). */
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt.h"
#include "core/common.h"
#include "core/tok/tokenizer.h"

#include <cJSON.h>
#include <errno.h>
#include <hdf5.h>
#include <stdlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ckpt_model_open(const char *path, Model *m, Topology *topo, bool with_grads, size_t kv_block,
                    char *err, size_t err_len)
{
    char file[PATH_MAX], latest[PATH_MAX];
    struct stat st;
    if (td_snprintf(latest, sizeof latest, "%s/latest", path)) {
        snprintf(err, err_len, "%s: the path is too long", path);
        return -1;
    }
    bool is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if ((is_dir && lstat(latest, &st) != 0 && !ckpt_is_hf_dir(path)) || (!is_dir && access(path, R_OK) != 0)) {
        snprintf(err, err_len, "%s: no checkpoint there (expected a .h5 file, a run directory with a latest, or a "
                 "Hugging Face model directory)", path);
        return -1;
    }
    if (ckpt_resolve(path, file, sizeof file)) {   /* prints its own line */
        err[0] = 0;
        return -1;
    }
    ModelConfig cfg;
    if (ckpt_read_config(file, &cfg, NULL, err, err_len)) return -1;
    Topology single;
    if (!topo) {
        topo_single(&single, &cfg);
        topo = &single;
    }
    model_init(m, &cfg, topo, with_grads, kv_block);
    if (ckpt_load(file, m, NULL, NULL, NULL, err, err_len)) {
        model_free(m);
        return -1;
    }
    model_pack(m);
    return 0;
}

int ckpt_open_tokenizer(const char *ckpt_or_hf_dir, Tokenizer **out, char *err, size_t err_len)
{
    *out = NULL;
    CkptTokFiles tf;
    if (ckpt_read_tok_files(ckpt_or_hf_dir, &tf, err, err_len)) return -1;
    int rc = 0;
    if (tf.tokenizer_json) {
        char why[512];
        rc = tok_load_mem(out, tf.tokenizer_json, tf.tokenizer_json_len, tf.tokenizer_config, tf.tokenizer_config_len,
                          why, sizeof why);
        if (rc) snprintf(err, err_len, "%s: tokenizer: %s", ckpt_or_hf_dir, why);
    } else
        *out = tok_byte_level();
    ckpt_tok_files_free(&tf);
    return rc;
}

int ckpt_open_tokenizer_arg(const char *path, Tokenizer **out, char *err, size_t err_len)
{
    struct stat st;
    char latest[PATH_MAX];
    *out = NULL;
    if (td_snprintf(latest, sizeof latest, "%s/latest", path)) {
        snprintf(err, err_len, "%s: the path is too long", path);
        return -1;
    }
    if (stat(path, &st) != 0) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode) && lstat(latest, &st) != 0) return tok_load_dir(out, path, err, err_len);
    return ckpt_open_tokenizer(path, out, err, err_len);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* generation_config.json's eos_token_id (an integer or a list of them)
 * appended to ids; 0 or -1 with err. */
static int gen_config_eos(const char *text, size_t len, int32_t V, TokIds *ids, char *err, size_t n)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    int rc = 0;
    if (!cJSON_IsObject(j)) {
        snprintf(err, n, "generation_config.json: not a JSON object");
        rc = -1;
    } else {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *one = e;
        if (cJSON_IsArray(e)) one = e->child;
        else if (e && cJSON_IsNull(e)) one = NULL;
        for (; one && rc == 0; one = cJSON_IsArray(e) ? one->next : NULL) {
            double v = cJSON_IsNumber(one) ? one->valuedouble : -1;
            if (!(v >= 0 && v < V && v == (double)(int32_t)v)) {
                snprintf(err, n, "generation_config.json: eos_token_id must be token ids in [0, %d)", (int)V);
                rc = -1;
            } else {
                tok_ids_push(ids, (int32_t)v);
            }
        }
    }
    cJSON_Delete(j);
    return rc;
}

int ckpt_open_text(const char *ckpt_or_hf_dir, bool required, CkptText *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    CkptTokFiles *tf = &out->files;
    if (ckpt_read_tok_files(ckpt_or_hf_dir, tf, err, err_len)) return -1;
    int rc = 0;
    char why[512];
    if (tf->tokenizer_json) {
        rc = tok_load_mem(&out->tok, tf->tokenizer_json, tf->tokenizer_json_len, tf->tokenizer_config,
                          tf->tokenizer_config_len, why, sizeof why);
        if (rc) snprintf(err, err_len, "%s: tokenizer: %s", ckpt_or_hf_dir, why);
    } else if (required) {
        snprintf(err, err_len, "%s holds no tokenizer (no tokenizer.json; a tandem checkpoint: no /tokenizer)",
                 ckpt_or_hf_dir);
        rc = -1;
    } else
        out->tok = tok_byte_level();
    TokIds ids = { 0 };
    if (rc == 0) {
        size_t n;
        const int32_t *s = tok_stop_ids(out->tok, &n);
        for (size_t i = 0; i < n; i++) {
            tok_ids_push(&ids, s[i]);
        }
        /* the ids a model can emit: the tokenizer's, or without one (ids
         * are ids) the model's vocab_size */
        int32_t V = tok_vocab_size(out->tok);
        if (tf->generation_config && tok_is_byte_level(out->tok)) {
            char file[PATH_MAX];
            ModelConfig cfg;
            if (ckpt_resolve(ckpt_or_hf_dir, file, sizeof file) == 0 &&
                ckpt_read_config(file, &cfg, NULL, why, sizeof why) == 0 && cfg.vocab_size > V)
                V = cfg.vocab_size;
        }
        if (tf->generation_config &&
            gen_config_eos(tf->generation_config, tf->generation_config_len, V, &ids, why, sizeof why)) {
            snprintf(err, err_len, "%s: %s", ckpt_or_hf_dir, why);
            rc = -1;
        }
    }
    if (rc) {
        tok_ids_free(&ids);
        ckpt_text_free(out);
        return -1;
    }
    if (ids.n) qsort(ids.ids, ids.n, sizeof(int32_t), cmp_i32);
    size_t k = 0;
    for (size_t i = 0; i < ids.n; i++)
        if (k == 0 || ids.ids[i] != ids.ids[k - 1]) ids.ids[k++] = ids.ids[i];
    out->stop_ids = ids.ids;
    out->n_stop_ids = k;
    return 0;
}

void ckpt_text_free(CkptText *t)
{
    tok_free(t->tok);
    td_free(t->stop_ids);
    ckpt_tok_files_free(&t->files);
    memset(t, 0, sizeof *t);
}

int h5_write_matrix(const char *path, const char *name, const float *data, size_t rows, size_t cols,
                    const char *attr, double attr_value, char *err, size_t err_len)
{
    char tmp[PATH_MAX];
    if (td_snprintf(tmp, sizeof tmp, "%s.tmp", path)) {   /* the system's limit: it could not be opened */
        snprintf(err, err_len, "%s: the path is longer than %d bytes", path, PATH_MAX - 5);
        return -1;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) {
        snprintf(err, err_len, "%s: cannot create", tmp);
        return -1;
    }
    hsize_t dims[2] = { rows, cols };
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t w = ds >= 0 && rows > 0 && cols > 0 ? H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : 0;
    herr_t a = 0;
    if (attr) {
        hid_t as = H5Screate(H5S_SCALAR);
        hid_t at = H5Acreate2(f, attr, H5T_IEEE_F64LE, as, H5P_DEFAULT, H5P_DEFAULT);
        a = at >= 0 ? H5Awrite(at, H5T_NATIVE_DOUBLE, &attr_value) : -1;
        if (at >= 0) H5Aclose(at);
        H5Sclose(as);
    }
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(sp);
    herr_t c = H5Fclose(f);
    if (ds < 0 || w < 0 || a < 0 || c < 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        snprintf(err, err_len, "%s: writing dataset /%s failed", path, name);
        return -1;
    }
    return 0;
}

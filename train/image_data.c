/* train/image_data.c - image rows of the training batches (image_data.h). */
#include "train/image_data.h"
#include "core/common.h"
#include "core/model/vision.h"
#include "core/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* tok(text + "\n") appended to out; -1 with err. */
static int encode_line(const Tokenizer *tok, const char *text, TokIds *out, char *err, size_t n)
{
    char *s = td_sprintf("%s\n", text);
    int rc = tok_encode(tok, s, strlen(s), false, out, err, n);
    td_free(s);
    return rc;
}

int image_loader_init(ImageLoader *il, const char *path, const ModelConfig *cfg, const Tokenizer *tok,
                      double fraction, size_t B, size_t T, size_t dp, size_t dp_rank, bool shuffle, uint64_t seed,
                      char *err, size_t err_len)
{
    memset(il, 0, sizeof *il);
    const size_t P = vision_tokens_per_image(cfg);
    if (!P) {
        snprintf(err, err_len, "images %s: the model has no vision tower (no vision_config)", path);
        return -1;
    }
    const VisionConfig *v = &cfg->vision_config;
    float mean[3], std[3];
    for (int c = 0; c < 3; c++) {
        mean[c] = (float)v->image_mean[c];
        std[c] = (float)v->image_std[c];
    }
    if (image_set_load(&il->set, path, (size_t)v->image_size, mean, std, err, err_len)) return -1;
    const size_t n = il->set.n;
    il->ids = td_calloc(n * sizeof(int32_t *));
    il->len = td_calloc(n * sizeof(size_t));
    il->n_answer = td_calloc(n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        const ImageExample *e = &il->set.ex[i];
        TokIds q = { 0 }, a = { 0 };
        char why[256];
        int rc = encode_line(tok, e->prompt, &q, why, sizeof why);
        if (!rc) rc = encode_line(tok, e->answer, &a, why, sizeof why);
        size_t len = P + q.n + a.n;
        if (rc) snprintf(err, err_len, "images %s: example %zu (%s): %s", path, i + 1, e->image, why);
        else if (len > T + 1) {
            snprintf(err, err_len, "images %s: example %zu (%s) needs %zu tokens (%zu image, %zu prompt, %zu answer), "
                     "more than seq_len + 1 = %zu", path, i + 1, e->image, len, P, q.n, a.n, T + 1);
            rc = -1;
        }
        for (size_t j = 0; !rc && j < q.n + a.n; j++) {
            int32_t id = j < q.n ? q.ids[j] : a.ids[j - q.n];
            if (id == cfg->image_token_index) {
                snprintf(err, err_len, "images %s: example %zu (%s): its text holds the image placeholder id %d",
                         path, i + 1, e->image, id);
                rc = -1;
            }
        }
        if (!rc) {
            il->ids[i] = td_malloc(len * sizeof(int32_t));
            for (size_t j = 0; j < P; j++) il->ids[i][j] = cfg->image_token_index;
            memcpy(il->ids[i] + P, q.ids, q.n * sizeof(int32_t));
            memcpy(il->ids[i] + P + q.n, a.ids, a.n * sizeof(int32_t));
            il->len[i] = len;
            il->n_answer[i] = a.n;
        }
        tok_ids_free(&q);
        tok_ids_free(&a);
        if (rc) {
            image_loader_free(il);
            return -1;
        }
    }
    il->B = B;
    il->T = T;
    il->P = P;
    il->row0 = dp_rank * B / dp;
    il->rows = (dp_rank + 1) * B / dp - il->row0;
    il->fraction = fraction;
    il->shuffle = shuffle;
    il->seed = seed;
    il->is_img = td_calloc(B * sizeof(bool));
    for (size_t r = 0; r < B; r++) {
        il->is_img[r] = floor((double)(r + 1) * fraction) > floor((double)r * fraction);
        il->K += il->is_img[r];
    }
    return 0;
}

void image_loader_free(ImageLoader *il)
{
    for (size_t i = 0; il->ids && i < il->set.n; i++) td_free(il->ids[i]);
    td_free(il->ids);
    td_free(il->len);
    td_free(il->n_answer);
    td_free(il->is_img);
    image_set_free(&il->set);
    memset(il, 0, sizeof *il);
}

size_t image_loader_fill(const ImageLoader *il, int64_t cursor, int32_t *ids, int32_t *targets, float *w,
                         float *pixels, double *n_scored)
{
    const size_t T = il->T, n = il->set.n, px = 3 * il->set.S * il->set.S;
    Rng r;
    rng_seed(&r, rng_mix64((uint64_t)il->seed ^ 0x1a6e5eedULL) ^ rng_mix64((uint64_t)cursor + 1));
    size_t k = 0, n_img = 0;
    double scored = 0;
    for (size_t row = 0; row < il->B; row++) {
        const bool mine = row >= il->row0 && row < il->row0 + il->rows;
        const size_t lr = row - il->row0;
        if (!il->is_img[row]) {   /* a text row: every target scored */
            scored += (double)T;
            if (mine)
                for (size_t t = 0; t < T; t++) w[lr * T + t] = 1.0f;
            continue;
        }
        /* every rank draws every image row's example, in row order */
        size_t e = il->shuffle ? (size_t)rng_below(&r, n) : (size_t)(((uint64_t)cursor * il->K + k) % n);
        k++;
        scored += (double)il->n_answer[e];
        if (!mine) continue;
        const int32_t *s = il->ids[e];
        const size_t len = il->len[e], a0 = len - il->n_answer[e];   /* the answer: tokens [a0, len) */
        int32_t *x = ids + lr * T, *y = targets + lr * T;
        float *wr = w + lr * T;
        for (size_t t = 0; t < T; t++) {
            x[t] = t < len ? s[t] : 0;
            y[t] = t + 1 < len ? s[t + 1] : 0;
            wr[t] = t + 1 >= a0 && t + 1 < len ? 1.0f : 0.0f;   /* target t is token t + 1 */
        }
        memcpy(pixels + n_img * px, image_set_pixels(&il->set, e), px * sizeof(float));
        n_img++;
    }
    *n_scored = scored;
    return n_img;
}

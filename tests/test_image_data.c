/* tests/test_image_data.c - image rows of the training batches
 * (train/image_data.h) over an image set (core/image/image_set.h): the row
 * layout (placeholders, prompt, answer, padding), the scored targets (the
 * answer's only), the pixels (what image_to_pixels gives), the global count
 * of scored targets, and dp: each rank's rows are the single process's
 * rows, the same examples. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/image/image.h"
#include "core/image/shapes.h"
#include "core/model/config.h"
#include "core/tok/tokenizer.h"
#include "tests/fixture.h"
#include "train/image_data.h"

TestSuite(image_data);

/* A set of two images, three lines, in a fresh directory. */
static void write_set(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/tandem-image-data-XXXXXX");
    cr_assert(mkdtemp(dir));
    Shape s[2] = { { 0, 1, 20, 3, 5 }, { 2, 4, 30, 10, 2 } };   /* a green circle, a magenta triangle */
    for (int i = 0; i < 2; i++) {
        Image im;
        shapes_render(&s[i], &im);
        char p[256], err[256];
        snprintf(p, sizeof p, "%s/im%d.png", dir, i);
        cr_assert(image_write_png(p, &im, err, sizeof err) == 0, "%s", err);
        image_free(&im);
    }
    char p[256];
    snprintf(p, sizeof p, "%s/shapes.jsonl", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"image\": \"im0.png\", \"prompt\": \"Q?\", \"answer\": \"green\"}\n"
               "{\"image\": \"im0.png\", \"prompt\": \"S?\", \"answer\": \"circle\", \"extra\": 1}\n"
               "{\"image\": \"im1.png\", \"prompt\": \"Q?\", \"answer\": \"magenta\"}\n");
    fclose(f);
}

Test(image_data, rows_hold_placeholders_prompt_answer_and_only_the_answer_is_scored)
{
    char dir[64], err[512];
    write_set(dir, sizeof dir);
    ModelConfig cfg;
    cr_assert(config_parse(&cfg, "{\"vocab_size\": 257, \"hidden_size\": 32, \"num_hidden_layers\": 1, "
                           "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"first_k_dense_replace\": 1, "
                           "\"image_token_index\": 256, \"vision_config\": {\"hidden_size\": 32, "
                           "\"intermediate_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                           "\"image_size\": 16, \"patch_size\": 8}}", err, sizeof err) == 0, "%s", err);
    Tokenizer *tok = tok_byte_level();
    const size_t B = 4, T = 24, P = 4, S = 16, px = 3 * S * S;
    ImageLoader one, r0, r1;
    cr_assert(image_loader_init(&one, dir, &cfg, tok, 0.5, B, T, 1, 0, false, 7, err, sizeof err) == 0, "%s", err);
    cr_assert(image_loader_init(&r0, dir, &cfg, tok, 0.5, B, T, 2, 0, false, 7, err, sizeof err) == 0, "%s", err);
    cr_assert(image_loader_init(&r1, dir, &cfg, tok, 0.5, B, T, 2, 1, false, 7, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(one.set.n, 3);
    cr_expect_eq(one.set.n_img, 2, "the two lines of im0.png share its pixels");
    cr_expect_eq(one.K, 2, "image rows: 1 and 3 of 4");
    /* the reference pixels of each image */
    float ref[2][3 * 16 * 16], mean[3] = { 0.5f, 0.5f, 0.5f }, sd[3] = { 0.5f, 0.5f, 0.5f };
    for (int i = 0; i < 2; i++) {
        char p[256];
        Image im;
        snprintf(p, sizeof p, "%s/im%d.png", dir, i);
        cr_assert(image_load(p, NULL, &im, err, sizeof err) == 0);
        image_to_pixels(&im, S, mean, sd, ref[i]);
        image_free(&im);
    }
    static const char *const q[3] = { "Q?\n", "S?\n", "Q?\n" }, *const a[3] = { "green\n", "circle\n", "magenta\n" };
    const int img_of[3] = { 0, 0, 1 };
    int32_t ids[4 * 24], tg[4 * 24], ids2[4 * 24], tg2[4 * 24];
    float w[4 * 24], w2[4 * 24], pix[4 * 3 * 16 * 16], pix2[4 * 3 * 16 * 16];
    for (int64_t cur = 0; cur < 3; cur++) {
        for (size_t i = 0; i < B * T; i++) ids[i] = tg[i] = 7;   /* the text loader's tokens */
        double ns;
        size_t n_img = image_loader_fill(&one, cur, ids, tg, w, pix, &ns);
        cr_assert_eq(n_img, 2);
        double want_ns = 2.0 * T;   /* two text rows score every target */
        for (size_t k = 0; k < 2; k++) {
            const size_t row = 2 * k + 1, e = (size_t)((cur * 2 + (int64_t)k) % 3);
            const size_t lq = strlen(q[e]), la = strlen(a[e]), len = P + lq + la;
            int32_t seq[24] = { 0 };
            for (size_t t = 0; t < P; t++) seq[t] = 256;
            for (size_t t = 0; t < lq; t++) seq[P + t] = (unsigned char)q[e][t];
            for (size_t t = 0; t < la; t++) seq[P + lq + t] = (unsigned char)a[e][t];
            for (size_t t = 0; t < T; t++) {
                cr_expect_eq(ids[row * T + t], t < len ? seq[t] : 0, "step %lld row %zu ids[%zu]", (long long)cur, row, t);
                cr_expect_eq(tg[row * T + t], t + 1 < len ? seq[t + 1] : 0, "targets[%zu]", t);
                cr_expect_eq(w[row * T + t], t + 1 >= P + lq && t + 1 < len ? 1.0f : 0.0f, "w[%zu]", t);
            }
            want_ns += (double)la;
            cr_expect(memcmp(pix + k * px, ref[img_of[e]], px * sizeof(float)) == 0, "row %zu's pixels", row);
        }
        for (size_t t = 0; t < T; t++) cr_expect(ids[t] == 7 && w[t] == 1.0f, "text row 0 kept, every target scored");
        cr_expect_eq(ns, want_ns, "scored targets %g, want %g", ns, want_ns);
        /* dp = 2: rank 0 rows 0-1, rank 1 rows 2-3, the same examples and count */
        double n0, n1;
        size_t a0 = image_loader_fill(&r0, cur, ids2, tg2, w2, pix2, &n0);
        cr_expect_eq(a0, 1);
        cr_expect(memcmp(ids2 + T, ids + T, T * sizeof(int32_t)) == 0 && memcmp(w2 + T, w + T, T * sizeof(float)) == 0 &&
                  memcmp(pix2, pix, px * sizeof(float)) == 0, "dp rank 0 = rows 0-1");
        size_t a1 = image_loader_fill(&r1, cur, ids2, tg2, w2, pix2, &n1);
        cr_expect_eq(a1, 1);
        cr_expect(memcmp(ids2 + T, ids + 3 * T, T * sizeof(int32_t)) == 0 &&
                  memcmp(tg2 + T, tg + 3 * T, T * sizeof(int32_t)) == 0 &&
                  memcmp(pix2, pix + px, px * sizeof(float)) == 0, "dp rank 1 = rows 2-3");
        cr_expect(n0 == ns && n1 == ns, "every rank knows the global count");
    }
    /* an example longer than seq_len + 1 is refused by name */
    ImageLoader tiny;
    cr_expect(image_loader_init(&tiny, dir, &cfg, tok, 0.5, B, 11, 1, 0, false, 7, err, sizeof err) == -1);
    cr_expect(strstr(err, "needs 13 tokens") && strstr(err, "seq_len + 1 = 12"), "%s", err);
    image_loader_free(&one);
    image_loader_free(&r0);
    image_loader_free(&r1);
    tok_free(tok);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert(system(cmd) == 0);
    EXPECT_NO_LEAKS();
}

/* bench/vision_bench.c - images per second through the image path
 * (bench/vision.sh runs it; `make bench`):
 *
 *   vision_bench MODEL.json FILE... [--reps R] [--threads T]
 *
 * MODEL.json is a model config with a vision_config.  Each FILE (PNG or
 * JPEG) is read into memory once; then, R times over all files (best pass
 * kept: shared machines are noisy):
 *   decode      image_decode (libpng / libjpeg-turbo), per format
 *   pixels      image_to_pixels to image_size x image_size, normalised
 *   encode      model_vision_encode (the tower and projector, random
 *               weights) of batches of 1 and of 8 images, T threads
 * and prints one line for the script:
 *   vision_bench png_per_s=.. jpeg_per_s=.. pixels_per_s=.. encode1_per_s=.. encode8_per_s=.. tokens_per_image=P
 */
#include "core/common.h"
#include "core/image/image.h"
#include "core/model/config.h"
#include "core/model/model.h"
#include "core/model/topology.h"
#include "core/model/vision.h"
#include "core/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    TD_CHECK(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = td_malloc((size_t)len + 1);
    TD_CHECK(fread(b, 1, (size_t)len, f) == (size_t)len, "cannot read %s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: vision_bench MODEL.json FILE... [--reps R] [--threads T]\n");
        return 2;
    }
    int reps = 3, threads = 1, nf = 0;
    const char **files = td_malloc((size_t)argc * sizeof *files);
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else files[nf++] = argv[i];
    }
    pool_init(threads);
    size_t jn;
    char *js = (char *)slurp(argv[1], &jn);
    js[jn] = 0;
    ModelConfig cfg;
    char err[512];
    TD_CHECK(config_parse(&cfg, js, err, sizeof err) == 0, "%s: %s", argv[1], err);
    TD_CHECK(config_vision(&cfg), "%s has no vision_config", argv[1]);
    Topology t;
    topo_single(&t, &cfg);
    Model m;
    model_init(&m, &cfg, &t, false, 16);
    model_init_weights(&m, 7);
    const size_t S = (size_t)cfg.vision_config.image_size, P = vision_tokens_per_image(&cfg), d = m.d;
    float mean[3], sd[3];
    for (int c = 0; c < 3; c++) mean[c] = (float)cfg.vision_config.image_mean[c], sd[c] = (float)cfg.vision_config.image_std[c];

    uint8_t **buf = td_malloc((size_t)nf * sizeof *buf);
    size_t *len = td_malloc((size_t)nf * sizeof *len);
    int n_png = 0, n_jpg = 0;
    for (int i = 0; i < nf; i++) {
        buf[i] = slurp(files[i], &len[i]);
        if (len[i] >= 2 && buf[i][0] == 0xFF && buf[i][1] == 0xD8) n_jpg++;
        else n_png++;
    }
    double best_png = 1e30, best_jpg = 1e30, best_px = 1e30, best_e1 = 1e30, best_e8 = 1e30;
    float *px = td_malloc(8 * 3 * S * S * sizeof(float)), *out = td_malloc(8 * P * d * sizeof(float));
    Image im;
    for (int r = 0; r < reps; r++) {
        double tp = 0, tj = 0, tx = 0;
        for (int i = 0; i < nf; i++) {
            double t0 = td_now();
            TD_CHECK(image_decode(buf[i], len[i], NULL, &im, err, sizeof err) == 0, "%s: %s", files[i], err);
            double t1 = td_now();
            image_to_pixels(&im, S, mean, sd, px + (size_t)(i % 8) * 3 * S * S);
            double t2 = td_now();
            if (buf[i][0] == 0xFF) tj += t1 - t0;
            else tp += t1 - t0;
            tx += t2 - t1;
            image_free(&im);
        }
        if (n_png && tp < best_png) best_png = tp;
        if (n_jpg && tj < best_jpg) best_jpg = tj;
        if (tx < best_px) best_px = tx;
        double t0 = td_now();
        for (int i = 0; i < 8; i++) model_vision_encode(&m, px + (size_t)i * 3 * S * S, 1, out);
        double t1 = td_now();
        model_vision_encode(&m, px, 8, out);
        double t2 = td_now();
        if ((t1 - t0) / 8 < best_e1) best_e1 = (t1 - t0) / 8;
        if ((t2 - t1) / 8 < best_e8) best_e8 = (t2 - t1) / 8;
    }
    printf("vision_bench png_per_s=%.1f jpeg_per_s=%.1f pixels_per_s=%.1f encode1_per_s=%.2f encode8_per_s=%.2f "
           "tokens_per_image=%zu\n",
           n_png ? n_png / best_png : 0.0, n_jpg ? n_jpg / best_jpg : 0.0, nf / best_px, 1.0 / best_e1, 1.0 / best_e8, P);
    for (int i = 0; i < nf; i++) td_free(buf[i]);
    td_free(buf);
    td_free(len);
    td_free(px);
    td_free(out);
    td_free(files);
    td_free(js);
    model_free(&m);
    pool_free();
    return 0;
}

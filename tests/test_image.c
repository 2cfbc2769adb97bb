/* tests/test_image.c - the image decoders, limits, resize and writer
 * (core/image/image.h) and the shapes task (core/image/shapes.h):
 *   - every PNG layout (8-bit RGB, RGBA, gray, gray + alpha, 1-bit gray,
 *     8- and 4-bit palette with tRNS, 16-bit RGB / gray / RGBA, Adam7) and
 *     JPEG (4:4:4, 4:2:0, progressive, gray) of tests/ref/fixtures_image.py
 *     decoded to exactly the pixels PIL's convert("RGB") finds (or, for the
 *     files written by hand, the source pixels);
 *   - the refusals: empty, not an image, truncated, corrupt, zero-sized,
 *     decompression bombs (a header of 100000 x 100000 pixels in 1 kB), CMYK,
 *     each one line with the expected words, nothing allocated left;
 *   - byte and pixel limits at their edges, from memory and from a file;
 *   - the bilinear resize + normalisation against PyTorch's F.interpolate;
 *   - PNG writing read back; the shapes' pixels;
 *   - inputs the fuzzer found (tests/fuzz/corpus/image), replayed.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/image/image.h"
#include "core/image/shapes.h"
#include "core/rng.h"
#include "tests/fixture.h"

TestSuite(image);

static const char *const CASES[] = {
    "rgb8.png", "rgba8.png", "gray8.png", "graya8.png", "gray1.png", "pal8.png", "pal4_trns.png", "rgb16.png",
    "gray16.png", "rgba16.png", "adam7.png", "q90.jpg", "q75_420.jpg", "progressive.jpg", "gray.jpg",
};

static const char *img_path(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/image/%s", fixture_dir(), name);
    return p[k];
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "fixture %s missing (run tests/ref/fixtures_image.py)", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = td_malloc((size_t)len + 1);
    cr_assert(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* im's pixels against rgb/<name> of image_expect.h5, exactly. */
static void expect_pixels(const Image *im, const char *name)
{
    char ds[128];
    snprintf(ds, sizeof ds, "rgb/%s", name);
    size_t n;
    float *want = fixture_f32("image_expect.h5", ds, &n);
    cr_assert_eq(n, (size_t)im->w * im->h * 3, "%s: %dx%d decoded, reference has %zu values", name, im->w, im->h, n);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if ((float)im->rgb[i] != want[i] && !bad++) first = i;
    cr_expect_eq(bad, 0, "%s: %zu of %zu values differ from the reference; first at %zu (pixel %zu, channel %zu): "
                 "%u vs %.0f", name, bad, n, first, first / 3, first % 3, first < n ? im->rgb[first] : 0,
                 first < n ? want[first] : 0.0f);
    td_free(want);
}

Test(image, decodes_every_layout_as_the_reference)
{
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        Image im;
        char err[256] = "";
        int rc = image_load(img_path(CASES[c]), NULL, &im, err, sizeof err);
        cr_assert_eq(rc, 0, "%s refused: %s", CASES[c], err);
        cr_expect(im.w == 37 && im.h == 23, "%s: %dx%d, want 37x23", CASES[c], im.w, im.h);
        expect_pixels(&im, CASES[c]);
        image_free(&im);
        image_free(&im);   /* twice is safe */
    }
    EXPECT_NO_LEAKS();
}

Test(image, decode_from_memory_equals_load)
{
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        size_t n;
        uint8_t *b = read_all(img_path(CASES[c]), &n);
        Image a, m;
        char err[256] = "";
        cr_assert_eq(image_load(img_path(CASES[c]), NULL, &a, err, sizeof err), 0, "%s", err);
        cr_assert_eq(image_decode(b, n, NULL, &m, err, sizeof err), 0, "%s", err);
        cr_expect(a.w == m.w && a.h == m.h && !memcmp(a.rgb, m.rgb, (size_t)a.w * a.h * 3), "%s", CASES[c]);
        image_free(&a);
        image_free(&m);
        td_free(b);
    }
    EXPECT_NO_LEAKS();
}

Test(image, refuses_broken_input_with_one_line)
{
    static const struct { const char *file, *words; } BAD[] = {
        { "bad_empty.png", "empty image (0 bytes)" },
        { "bad_text.png", "not a PNG or JPEG image (it starts with \"hello, I\")" },
        { "bad_trunc.png", "truncated PNG" },
        { "bad_noiend.png", "truncated PNG" },
        { "bad_crc.png", "corrupt PNG" },
        { "bad_bomb.png", "PNG of 100000x100000 pixels: more than the limit of pixels (16777216)" },
        { "bad_zero.png", "corrupt PNG" },
        { "bad_sig.png", "corrupt PNG" },
        { "bad_trunc.jpg", "truncated JPEG" },
        { "bad_garbled.jpg", "corrupt JPEG" },
        { "bad_bomb.jpg", "JPEG of 60000x60000 pixels: more than the limit of pixels (16777216)" },
        { "bad_zero.jpg", "JPEG" },
        { "bad_soi.jpg", "JPEG: Premature end of JPEG file" },
        { "bad_cmyk.jpg", "CMYK images are not supported" },
    };
    for (size_t c = 0; c < sizeof BAD / sizeof *BAD; c++) {
        size_t n;
        uint8_t *b = read_all(img_path(BAD[c].file), &n);
        Image im = { 7, 7, (uint8_t *)&im };   /* overwritten (zeroed) on refusal */
        char err[256] = "";
        double t0 = td_now();
        int rc = image_decode(b, n, NULL, &im, err, sizeof err);
        cr_expect_eq(rc, -1, "%s: accepted (%dx%d)", BAD[c].file, im.w, im.h);
        cr_expect(strstr(err, BAD[c].words), "%s: error '%s' lacks '%s'", BAD[c].file, err, BAD[c].words);
        cr_expect(err[0] && !strchr(err, '\n'), "%s: error is not one line: '%s'", BAD[c].file, err);
        cr_expect(!im.rgb && !im.w && !im.h, "%s: refused image not zeroed", BAD[c].file);
        /* A bomb is refused from its header: no time spent inflating (bound generous for a loaded machine). */
        cr_expect(td_now() - t0 < 2.0, "%s: refusal took %.2f s", BAD[c].file, td_now() - t0);
        if (rc == 0) image_free(&im);
        /* From a file: the same words, and the path named. */
        char err2[600] = "";
        cr_expect_eq(image_load(img_path(BAD[c].file), NULL, &im, err2, sizeof err2), -1);
        cr_expect(strstr(err2, BAD[c].file) && strstr(err2, BAD[c].words), "%s: load error '%s'", BAD[c].file, err2);
        td_free(b);
    }
    Image im;
    char err[256];
    cr_expect_eq(image_load("/nonexistent/x.png", NULL, &im, err, sizeof err), -1);
    cr_expect(strstr(err, "/nonexistent/x.png: cannot open"), "%s", err);
    cr_expect_eq(image_load("/tmp", NULL, &im, err, sizeof err), -1);
    cr_expect(strstr(err, "not a regular file"), "%s", err);
    EXPECT_NO_LEAKS();
}

Test(image, limits_on_bytes_and_pixels_at_their_edges)
{
    const char *names[2] = { "rgb8.png", "q90.jpg" };   /* 37 x 23 = 851 pixels */
    for (int k = 0; k < 2; k++) {
        size_t n;
        uint8_t *b = read_all(img_path(names[k]), &n);
        Image im;
        char err[600];
        ImageLimits px_lo = { 0, 850 }, px_ok = { 0, 851 }, by_lo = { n - 1, 0 }, by_ok = { n, 0 };
        cr_expect_eq(image_decode(b, n, &px_lo, &im, err, sizeof err), -1, "%s: 851 pixels under a limit of 850", names[k]);
        cr_expect(strstr(err, "37x23 pixels: more than the limit of pixels (850)"), "%s", err);
        cr_expect_eq(image_decode(b, n, &px_ok, &im, err, sizeof err), 0, "%s", err);
        image_free(&im);
        cr_expect_eq(image_decode(b, n, &by_lo, &im, err, sizeof err), -1);
        char want[128];
        snprintf(want, sizeof want, "image of %zu bytes is over the limit of %zu bytes", n, n - 1);
        cr_expect(strstr(err, want), "'%s' lacks '%s'", err, want);
        cr_expect_eq(image_load(img_path(names[k]), &by_lo, &im, err, sizeof err), -1);
        cr_expect(strstr(err, want), "load: '%s' lacks '%s'", err, want);
        cr_expect_eq(image_decode(b, n, &by_ok, &im, err, sizeof err), 0, "%s", err);
        image_free(&im);
        td_free(b);
    }
    ImageLimits d = image_limits(NULL);
    cr_expect(d.max_bytes == (size_t)16 << 20 && d.max_pixels == (size_t)4096 * 4096);
    EXPECT_NO_LEAKS();
}

Test(image, resize_and_normalise_match_pytorch)
{
    Image im;
    char err[256];
    cr_assert_eq(image_load(img_path("rgb8.png"), NULL, &im, err, sizeof err), 0, "%s", err);
    size_t n3;
    float *mean = fixture_f32("image_expect.h5", "mean", &n3), *sd = fixture_f32("image_expect.h5", "std", &n3);
    int n_resize = (int)fixture_attr("image_expect.h5", "n_resize");
    for (int k = 0; k < n_resize; k++) {
        size_t n;
        char ds[64];
        snprintf(ds, sizeof ds, "resize/%d/pixels", k);
        float *want = fixture_f32("image_expect.h5", ds, &n);
        size_t S = (size_t)lround(sqrt((double)(n / 3)));
        cr_assert_eq(S * S * 3, n);
        float *got = td_malloc(n * sizeof(float)), *again = td_malloc(n * sizeof(float));
        image_to_pixels(&im, S, mean, sd, got);
        /* Same formula as PyTorch's kernel, float32 throughout: only the
         * order of the 4-tap sum differs (at most a few ulp of 255 before
         * dividing by 255 * std ~ 68). */
        EXPECT_CLOSE(got, want, n, 2e-6, 2e-6, ds);
        image_to_pixels(&im, S, mean, sd, again);
        EXPECT_BITWISE(got, again, n, "the same call twice");
        td_free(got);
        td_free(again);
        td_free(want);
    }
    /* size == the image's side: every pixel copied exactly, then normalised. */
    Image sq = { 5, 5, td_malloc(75) };
    for (int i = 0; i < 75; i++) sq.rgb[i] = (uint8_t)(i * 37 % 256);
    float out[75];
    image_to_pixels(&sq, 5, mean, sd, out);
    for (int y = 0; y < 5; y++)
        for (int x = 0; x < 5; x++)
            for (int c = 0; c < 3; c++)
                cr_expect_eq(out[(c * 5 + y) * 5 + x], ((float)sq.rgb[(y * 5 + x) * 3 + c] / 255.0f - mean[c]) / sd[c]);
    image_free(&sq);
    image_free(&im);
    td_free(mean);
    td_free(sd);
    EXPECT_NO_LEAKS();
}

Test(image, png_written_reads_back_exactly)
{
    char path[] = "/tmp/tandem_test_image_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    Image im = { 41, 19, td_malloc(41 * 19 * 3) };
    Rng r;
    rng_seed(&r, 5);
    for (size_t i = 0; i < 41 * 19 * 3; i++) im.rgb[i] = (uint8_t)rng_below(&r, 256);
    char err[256];
    cr_assert_eq(image_write_png(path, &im, err, sizeof err), 0, "%s", err);
    Image back;
    cr_assert_eq(image_load(path, NULL, &back, err, sizeof err), 0, "%s", err);
    cr_expect(back.w == 41 && back.h == 19 && !memcmp(back.rgb, im.rgb, 41 * 19 * 3));
    unlink(path);
    cr_expect_eq(image_write_png("/nonexistent/dir/x.png", &im, err, sizeof err), -1);
    cr_expect(strstr(err, "/nonexistent/dir/x.png: cannot create"), "%s", err);
    image_free(&back);
    image_free(&im);
    EXPECT_NO_LEAKS();
}

/* Every painted pixel has the shape's colour, every other is black, the
 * painted pixels fill the box's extent (size across, in the box), and the
 * area is the shape's: size^2, pi size^2 / 4, size^2 / 2. */
Test(image, shapes_are_what_they_say)
{
    Rng r;
    rng_seed(&r, 11);
    int seen_shape[SHAPES_N_SHAPE] = { 0 }, seen_color[SHAPES_N_COLOR] = { 0 };
    for (int i = 0; i < 300; i++) {
        Shape s;
        shapes_sample(&r, &s);
        cr_assert(s.size >= SHAPES_MIN && s.size <= SHAPES_MAX && s.x >= 0 && s.y >= 0 &&
                  s.x + s.size <= SHAPES_SIZE && s.y + s.size <= SHAPES_SIZE, "shape %d outside", i);
        seen_shape[s.shape]++;
        seen_color[s.color]++;
        Image im;
        shapes_render(&s, &im);
        int area = 0, x0 = 99, x1 = -1, y0 = 99, y1 = -1;
        for (int y = 0; y < 64; y++)
            for (int x = 0; x < 64; x++) {
                const uint8_t *p = im.rgb + (y * 64 + x) * 3;
                if (!p[0] && !p[1] && !p[2]) continue;
                cr_assert(!memcmp(p, shapes_color_rgb[s.color], 3), "image %d pixel (%d,%d) not %s", i, x, y,
                          shapes_color_names[s.color]);
                area++;
                x0 = x < x0 ? x : x0, x1 = x > x1 ? x : x1, y0 = y < y0 ? y : y0, y1 = y > y1 ? y : y1;
            }
        double S = s.size, want = s.shape == 0 ? M_PI * S * S / 4 : s.shape == 1 ? S * S : S * S / 2;
        /* discretisation: a perimeter's worth of pixels at most */
        cr_expect(fabs(area - want) <= (s.shape == 1 ? 0 : 2 * S), "image %d (%s %d): area %d, want ~%.0f", i,
                  shapes_shape_names[s.shape], s.size, area, want);
        cr_expect(x0 >= s.x && x1 < s.x + s.size && y0 >= s.y && y1 < s.y + s.size, "image %d outside its box", i);
        cr_expect(x1 - x0 + 1 >= s.size - 1, "image %d: %d across, size %d", i, x1 - x0 + 1, s.size);
        if (s.shape == 2) {   /* pointing up: the top row narrower than the bottom row */
            int top = 0, bottom = 0;
            for (int x = 0; x < 64; x++) top += im.rgb[(y0 * 64 + x) * 3] | im.rgb[(y0 * 64 + x) * 3 + 1] | im.rgb[(y0 * 64 + x) * 3 + 2] ? 1 : 0;
            for (int x = 0; x < 64; x++) bottom += im.rgb[(y1 * 64 + x) * 3] | im.rgb[(y1 * 64 + x) * 3 + 1] | im.rgb[(y1 * 64 + x) * 3 + 2] ? 1 : 0;
            cr_expect(top <= 2 && bottom >= s.size - 1, "triangle %d: top row %d, bottom %d", i, top, bottom);
        }
        image_free(&im);
    }
    for (int k = 0; k < SHAPES_N_SHAPE; k++) cr_expect(seen_shape[k] > 60, "shape %d drawn %d times of 300", k, seen_shape[k]);
    for (int k = 0; k < SHAPES_N_COLOR; k++) cr_expect(seen_color[k] > 20, "colour %d drawn %d times of 300", k, seen_color[k]);
    EXPECT_NO_LEAKS();
}

/* Inputs the fuzzer (tests/fuzz/fuzz_image.c) found: each decodes or is
 * refused with one line, and nothing is left allocated. */
Test(image, fuzz_corpus_replays)
{
    const char *dir = "tests/fuzz/corpus/image";
    DIR *d = opendir(dir);
    if (!d) cr_skip_test("%s absent (run from the repository root)", dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        size_t len;
        uint8_t *b = read_all(p, &len);
        Image im;
        char err[256] = "";
        ImageLimits lim = { 0, 1 << 20 };
        if (image_decode(b, len, &lim, &im, err, sizeof err)) cr_expect(err[0] && !strchr(err, '\n'), "%s: '%s'", p, err);
        else image_free(&im);
        td_free(b);
        n++;
    }
    closedir(d);
    cr_expect(n > 0, "%s is empty", dir);
    EXPECT_NO_LEAKS();
}

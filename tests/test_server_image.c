/* tests/test_server_image.c - image content parts of chat requests
 * (infer/server/server_image.h):
 *   - base64 against RFC 4648's test vectors and Python's base64 of real
 *     files (one wrapped at 76 columns by encodebytes), and its refusals;
 *   - data URLs: PNG and JPEG decoded to the bytes' pixels; http:, other
 *     schemes, other media types, non-base64, garbage and oversized data
 *     refused with one line;
 *   - messages: image parts flattened to "<image>" in the text, in order,
 *     pixels equal to image_to_pixels of each decoded file; a model without
 *     a vision tower, too many images, a bad image named by message and
 *     part; the placeholder count checked and expanded.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/image/image.h"
#include "infer/server/server_image.h"
#include "tests/fixture.h"

TestSuite(server_image);

static char *read_file(const char *name, size_t *n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/image/%s", fixture_dir(), name);
    FILE *f = fopen(p, "rb");
    cr_assert(f, "fixture %s missing (tests/ref/fixtures_image.py)", p);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = td_malloc((size_t)len + 1);
    cr_assert(fread(b, 1, (size_t)len, f) == (size_t)len);
    b[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* "data:<type>;base64," + Python's base64 of the file (td_malloc'd). */
static char *data_url(const char *type, const char *b64name)
{
    size_t n;
    char *b = read_file(b64name, &n);
    char *u = td_sprintf("data:%s;base64,%s", type, b);
    td_free(b);
    return u;
}

Test(server_image, base64_rfc4648_vectors_and_python)
{
    static const char *const V[][2] = { { "", "" }, { "f", "Zg==" }, { "fo", "Zm8=" }, { "foo", "Zm9v" },
                                         { "foob", "Zm9vYg==" }, { "fooba", "Zm9vYmE=" }, { "foobar", "Zm9vYmFy" } };
    uint8_t out[16];
    char why[200];
    for (size_t i = 0; i < 7; i++) {
        size_t n = 99;
        cr_assert_eq(api_base64_decode(V[i][1], strlen(V[i][1]), out, &n, why, sizeof why), 0, "%s: %s", V[i][1], why);
        cr_expect(n == strlen(V[i][0]) && !memcmp(out, V[i][0], n), "%s decoded to %zu bytes", V[i][1], n);
    }
    size_t n;
    cr_expect_eq(api_base64_decode("Zm9vYg", 6, out, &n, why, sizeof why), 0, "unpadded: %s", why);
    cr_expect(n == 4 && !memcmp(out, "foob", 4));
    const char *bad[] = { "Zm9v!", "Z", "Zm9vY", "Zg==Zg==", "Z===", "=Zg=", "Zm9vYg=" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = 0;
        cr_expect_eq(api_base64_decode(bad[i], strlen(bad[i]), out, &n, why, sizeof why), -1, "'%s' accepted", bad[i]);
        cr_expect(strstr(why, "base64"), "'%s': %s", bad[i], why);
    }
    const char *files[][2] = { { "rgb8.png", "rgb8.png.b64" }, { "q90.jpg", "q90.jpg.b64" } };
    for (int k = 0; k < 2; k++) {
        size_t fn, bn;
        char *raw = read_file(files[k][0], &fn), *b64 = read_file(files[k][1], &bn);
        uint8_t *dec = td_malloc(bn);
        cr_assert_eq(api_base64_decode(b64, bn, dec, &n, why, sizeof why), 0, "%s: %s", files[k][1], why);
        cr_expect(n == fn && !memcmp(dec, raw, fn), "%s: %zu bytes, want %zu", files[k][1], n, fn);
        td_free(dec);
        td_free(raw);
        td_free(b64);
    }
    EXPECT_NO_LEAKS();
}

Test(server_image, data_urls_decode_and_refuse)
{
    const char *names[][3] = { { "image/png", "rgb8.png.b64", "rgb8.png" }, { "image/jpeg", "q90.jpg.b64", "q90.jpg" },
                               { "IMAGE/JPG", "q90.jpg.b64", "q90.jpg" } };
    char why[600];
    for (int k = 0; k < 3; k++) {
        char *u = data_url(names[k][0], names[k][1]);
        Image a, b;
        cr_assert_eq(api_image_from_url(u, NULL, &a, why, sizeof why), 0, "%s: %s", names[k][0], why);
        char p[512];
        snprintf(p, sizeof p, "%s/image/%s", fixture_dir(), names[k][2]);
        cr_assert_eq(image_load(p, NULL, &b, why, sizeof why), 0, "%s", why);
        cr_expect(a.w == b.w && a.h == b.h && !memcmp(a.rgb, b.rgb, (size_t)a.w * a.h * 3), "%s", names[k][0]);
        image_free(&a);
        image_free(&b);
        td_free(u);
    }
    char *png = data_url("image/png", "rgb8.png.b64");
    char *ptype = td_sprintf("data:image/png;charset=x;base64,%s", png + strlen("data:image/png;base64,"));
    Image im;
    cr_expect_eq(api_image_from_url(ptype, NULL, &im, why, sizeof why), 0, "parameters before base64: %s", why);
    image_free(&im);
    ImageLimits small = { 500, 0 };
    static const struct { const char *url, *words; } BAD[] = {
        { "http://example.com/cat.png", "only data: URLs are accepted" },
        { "https://example.com/cat.png", "does not fetch https: URLs" },
        { "file:///etc/passwd", "only data: URLs are accepted" },
        { "cat.png", "not a data: URL" },
        { "data:image/png;base64", "no ','" },
        { "data:image/gif;base64,R0lGODlh", "'image/gif': only image/png and image/jpeg" },
        { "data:text/plain,hello", "'text/plain'" },
        { "data:image/png,rawbytes", "not base64" },
        { "data:image/png;base64,!!!!", "invalid character at offset 0" },
        { "data:image/png;base64,aGVsbG8gd29ybGQ=", "not a PNG or JPEG image (it starts with \"hello wo\")" },
        { "data:image/png;base64,", "empty image (0 bytes)" },
        { "data:image/png;base64,iVBORw0KGgo=", "truncated PNG (8 bytes): the data ends early" },
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        why[0] = 0;
        cr_expect_eq(api_image_from_url(BAD[i].url, NULL, &im, why, sizeof why), -1, "%s accepted", BAD[i].url);
        cr_expect(strstr(why, BAD[i].words) && !strchr(why, '\n'), "%s: '%s' lacks '%s'", BAD[i].url, why, BAD[i].words);
        cr_expect(!im.rgb);
    }
    cr_expect_eq(api_image_from_url(png, &small, &im, why, sizeof why), -1);
    cr_expect(strstr(why, "over the limit of 500 bytes"), "%s", why);
    td_free(ptype);
    td_free(png);
    EXPECT_NO_LEAKS();
}

static const ApiVision VIS = { .tokens = 4, .token_id = 9, .size = 8, .mean = { 0.5f, 0.4f, 0.3f },
                               .std = { 0.2f, 0.25f, 0.3f } };

Test(server_image, messages_flattened_and_pixels_in_order)
{
    char *png = data_url("image/png", "rgb8.png.b64"), *jpg = data_url("image/jpeg", "q90.jpg.b64");
    char *body = td_sprintf("[{\"role\": \"system\", \"content\": \"be brief\"},"
                            " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"compare\"},"
                            " {\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}},"
                            " {\"type\": \"image_url\", \"image_url\": \"%s\"}, {\"type\": \"text\", \"text\": \"please\"}]},"
                            " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"only text\"}]}]",
                            png, jpg);
    cJSON *m = cJSON_Parse(body);
    cr_assert(m);
    float *px;
    size_t n_img;
    char why[600] = "";
    cr_assert_eq(api_images_collect(m, &VIS, 100, true, &px, &n_img, why, sizeof why), 0, "%s", why);
    cr_expect_eq(n_img, 2);
    cJSON *c1 = cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "content");
    cr_expect(cJSON_IsString(c1) && !strcmp(c1->valuestring, "compare\n<image>\n<image>\nplease"), "flattened: %s",
              cJSON_IsString(c1) ? c1->valuestring : "(not a string)");
    cr_expect(cJSON_IsArray(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "content")), "a text-only message is left as it is");
    const char *files[2] = { "rgb8.png", "q90.jpg" };
    for (int k = 0; k < 2; k++) {
        char p[512];
        snprintf(p, sizeof p, "%s/image/%s", fixture_dir(), files[k]);
        Image im;
        cr_assert_eq(image_load(p, NULL, &im, why, sizeof why), 0);
        float want[3 * 8 * 8];
        image_to_pixels(&im, 8, VIS.mean, VIS.std, want);
        EXPECT_BITWISE(px + k * 3 * 8 * 8, want, 3 * 8 * 8, files[k]);
        image_free(&im);
    }
    td_free(px);
    cJSON_Delete(m);

    /* the placeholders: 2 images, 2 ids 9 -> 4 copies each, in place */
    TokIds ids = { 0 };
    int32_t seq[] = { 1, 9, 2, 9, 3 };
    for (int i = 0; i < 5; i++) tok_ids_push(&ids, seq[i]);
    cr_assert_eq(api_images_expand(&ids, &VIS, 2, why, sizeof why), 0, "%s", why);
    int32_t want_ids[] = { 1, 9, 9, 9, 9, 2, 9, 9, 9, 9, 3 };
    cr_expect(ids.n == 11 && !memcmp(ids.ids, want_ids, sizeof want_ids), "expanded to %zu ids", ids.n);
    cr_expect_eq(api_images_expand(&ids, &VIS, 2, why, sizeof why), -1, "8 placeholders for 2 images");
    cr_expect(strstr(why, "2 images, but the rendered prompt holds 8 image placeholder tokens (id 9)"), "%s", why);
    tok_ids_free(&ids);
    int32_t text_only[] = { 1, 9, 3 };
    for (int i = 0; i < 3; i++) tok_ids_push(&ids, text_only[i]);
    cr_expect_eq(api_images_expand(&ids, &VIS, 0, why, sizeof why), -1, "a text that spells <image>");
    cr_expect(strstr(why, "but no image"), "%s", why);
    ApiVision none = { 0 };
    cr_expect_eq(api_images_expand(&ids, &none, 0, why, sizeof why), 0, "a model without images: id 9 is text");
    tok_ids_free(&ids);
    td_free(body);
    td_free(png);
    td_free(jpg);
    EXPECT_NO_LEAKS();
}

Test(server_image, messages_refused_naming_the_part)
{
    char *png = data_url("image/png", "rgb8.png.b64");
    struct { const char *fmt; const ApiVision *v; size_t context; const char *words; } BAD[] = {
        { "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}]}]",
          NULL, 100, "messages[0].content[0]: this model takes no images (it has no vision tower)" },
        { "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
          "\"x\"}, {\"type\": \"image_url\", \"image_url\": {\"url\": \"http://x/y.png\"}}]}]%s",
          &VIS, 100, "messages[1].content[1]: only data: URLs are accepted" },
        { "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": "
          "\"data:image/png;base64,aGVsbG8=\"}}]}]%s", &VIS, 100, "messages[0].content[0]: not a PNG or JPEG image" },
        { "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"uri\": \"x\"}}]}]%s",
          &VIS, 100, "messages[0].content[0]: an image_url part needs" },
        { "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}, "
          "{\"type\": \"input_audio\"}]}]", &VIS, 100, "messages[0].content[1]: a part of type 'input_audio'" },
        { "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}]}]",
          &VIS, 4, "1 images of 4 tokens each do not fit the model's context of 4 positions" },
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        char *body = td_sprintf(BAD[i].fmt, strstr(BAD[i].fmt, "%s") ? png : "");
        cJSON *m = cJSON_Parse(body);
        cr_assert(m, "case %zu: bad JSON", i);
        ApiVision none = { 0 };
        float *px = (float *)1;
        size_t n_img = 7;
        char why[600] = "";
        cr_expect_eq(api_images_collect(m, BAD[i].v ? BAD[i].v : &none, BAD[i].context, true, &px, &n_img, why,
                                        sizeof why), -1, "case %zu accepted", i);
        cr_expect(strstr(why, BAD[i].words) && !strchr(why, '\n'), "case %zu: '%s' lacks '%s'", i, why, BAD[i].words);
        cr_expect(!px && !n_img, "case %zu: pixels left", i);
        cJSON_Delete(m);
        td_free(body);
    }
    /* more images than the server takes: refused before any is decoded */
    ApiVision two = VIS;
    two.max_images = 2;
    char *body = td_sprintf("[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": \"%s\"}, "
                            "{\"type\": \"image_url\", \"image_url\": \"%s\"}, {\"type\": \"image_url\", \"image_url\": "
                            "\"data:image/png;base64,garbage\"}]}]", png, png);
    cJSON *m = cJSON_Parse(body);
    float *px;
    size_t n_img;
    char why[600];
    cr_expect_eq(api_images_collect(m, &two, 100, true, &px, &n_img, why, sizeof why), -1);
    cr_expect(strstr(why, "3 images; the server takes at most 2 per request"), "%s", why);
    cJSON_Delete(m);
    td_free(body);
    td_free(png);
    EXPECT_NO_LEAKS();
}

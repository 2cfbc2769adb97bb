/* tests/fuzz/fuzz_image.c - libFuzzer harness for the image decoders
 * (core/image: the PNG path through libpng, the JPEG path through
 * libjpeg-turbo, the format sniffing and the limits).
 *
 * Each input is one whole file, decoded from an exact-size heap copy (so
 * AddressSanitizer sees any read past its end) under a pixel limit of 2^20
 * (so a valid but huge header is refused instead of filling memory).  An
 * accepted image must have its declared size, every byte of its buffer is
 * read, and it is resized to 7 x 7 (every source pixel index in bounds); a
 * refusal must be one non-empty line and leave nothing allocated.
 *
 *   make fuzz-image [FUZZ_TIME=120]     (corpus: tests/fuzz/corpus/image;
 *                                        seeds: tests/fuzz/seeds_image.py)
 */
#include "core/common.h"
#include "core/image/image.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (size) memcpy(buf, data, size);
    ImageLimits lim = { 1 << 20, 1 << 20 };
    Image im;
    char err[256] = "";
    size_t before = td_mem_current();
    if (image_decode(buf, size, &lim, &im, err, sizeof err)) {
        if (!err[0] || strchr(err, '\n')) abort();         /* a refusal is one line */
        if (im.rgb || im.w || im.h) abort();                /* and leaves an empty image */
        if (td_mem_current() != before) abort();            /* and nothing allocated */
        free(buf);
        return 0;
    }
    if (im.w <= 0 || im.h <= 0 || (size_t)im.w * im.h > lim.max_pixels) abort();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < (size_t)im.w * im.h * 3; i++) sink ^= im.rgb[i];
    (void)sink;
    static const float mean[3] = { 0.5f, 0.5f, 0.5f }, sd[3] = { 0.25f, 0.25f, 0.25f };
    float px[3 * 7 * 7];
    image_to_pixels(&im, 7, mean, sd, px);
    for (size_t i = 0; i < sizeof px / sizeof *px; i++)
        if (!(px[i] >= -2.0f && px[i] <= 2.0f)) abort();   /* (v/255 - 0.5) / 0.25 lies in [-2, 2] */
    image_free(&im);
    free(buf);
    return 0;
}

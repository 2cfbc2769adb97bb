/* core/image/image_png.h - PNG through libpng (image.h's decoder and
 * writer for that format; callers use image.h). */
#ifndef TANDEM_CORE_IMAGE_IMAGE_PNG_H
#define TANDEM_CORE_IMAGE_IMAGE_PNG_H

#include "core/image/image.h"

#include <stdbool.h>

/* True when buf starts with the 8-byte PNG signature. */
bool image_png_sniff(const uint8_t *buf, size_t n);
/* Decodes a PNG within lim (resolved: no zero fields) to RGB; as image_decode. */
int image_png_decode(const uint8_t *buf, size_t n, const ImageLimits *lim, Image *out, char *err, size_t err_len);
/* As image_write_png. */
int image_png_write(const char *path, const Image *im, char *err, size_t err_len);

#endif

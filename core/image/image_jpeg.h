/* core/image/image_jpeg.h - JPEG through libjpeg-turbo (image.h's decoder
 * for that format; callers use image.h). */
#ifndef TANDEM_CORE_IMAGE_IMAGE_JPEG_H
#define TANDEM_CORE_IMAGE_IMAGE_JPEG_H

#include "core/image/image.h"

#include <stdbool.h>

/* True when buf starts with a JPEG SOI marker followed by a marker (FF D8 FF). */
bool image_jpeg_sniff(const uint8_t *buf, size_t n);
/* Decodes a baseline or progressive JPEG within lim (resolved) to RGB; as image_decode. */
int image_jpeg_decode(const uint8_t *buf, size_t n, const ImageLimits *lim, Image *out, char *err, size_t err_len);

#endif

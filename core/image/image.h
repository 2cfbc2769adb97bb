/* core/image/image.h - images in and out: PNG and JPEG decoding (libpng,
 * libjpeg-turbo) to 8-bit RGB, the limits that refuse oversized input from
 * its header before any pixel is decoded, the deterministic bilinear resize
 * and normalisation that turn an image into the vision tower's pixels, and
 * PNG writing (SPEC section 13; docs/vision.md).
 *
 * Conversion to RGB (what PIL's Image.convert("RGB") gives): gray is
 * replicated into R, G and B; palette entries are looked up; an alpha
 * channel (or a tRNS chunk) is dropped, not composited; 16-bit samples keep
 * their high byte; interlaced PNGs are de-interlaced; gray and YCbCr JPEGs
 * are converted by libjpeg.  CMYK JPEGs are refused.
 *
 * Refusals (one line in err, no allocation left behind): an empty buffer,
 * more than max_bytes, a buffer that is neither PNG nor JPEG (by its magic
 * bytes), a header that declares zero or more than max_pixels pixels, and
 * any error or warning of the decoder (truncated or corrupt data).
 *
 * Every function here is reentrant (no globals): the server decodes several
 * requests' images at once.
 */
#ifndef TANDEM_CORE_IMAGE_IMAGE_H
#define TANDEM_CORE_IMAGE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* 0 in a field = its default. */
typedef struct { size_t max_bytes, max_pixels; } ImageLimits;
#define IMAGE_DEFAULT_MAX_BYTES  ((size_t)16 << 20)        /* 16 MiB of encoded data */
#define IMAGE_DEFAULT_MAX_PIXELS ((size_t)4096 * 4096)     /* w * h */

/* rgb: h * w * 3 bytes, row-major, R G B; owned (image_free). */
typedef struct { int w, h; uint8_t *rgb; } Image;

/* Decodes buf[0..n) (PNG or JPEG, told by its first bytes) into *out.
 * lim may be NULL (defaults).  Returns 0, or -1 with one line in err naming
 * the problem (*out is then zeroed and owns nothing). */
int image_decode(const uint8_t *buf, size_t n, const ImageLimits *lim, Image *out, char *err, size_t err_len);
/* image_decode of a file's bytes; the file's size is checked against
 * max_bytes before it is read.  err names the path. */
int image_load(const char *path, const ImageLimits *lim, Image *out, char *err, size_t err_len);
/* Releases im->rgb; safe on a zeroed Image and twice. */
void image_free(Image *im);

/* Bilinear resize of im to size x size (half-pixel centres, as PyTorch's
 * F.interpolate(mode="bilinear", align_corners=False, antialias=False):
 * source coordinate (x + 0.5) * w / size - 0.5, clamped at the edges; the
 * aspect ratio is not kept), then per channel
 *     out[c][y][x] = (v / 255 - mean[c]) / std[c].
 * out: (3, size, size) floats, overwritten.  Deterministic: the same bits
 * for the same image on every call and thread. */
void image_to_pixels(const Image *im, size_t size, const float mean[3], const float std[3], float *out);

/* Writes im as an 8-bit RGB PNG.  Returns 0, or -1 with one line in err. */
int image_write_png(const char *path, const Image *im, char *err, size_t err_len);

/* The limits in force: lim's fields, or the defaults where 0 (lim may be NULL). */
ImageLimits image_limits(const ImageLimits *lim);

#endif

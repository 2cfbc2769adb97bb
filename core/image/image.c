/* core/image/image.c - the image API (image.h): the format told by the
 * first bytes, the limits, files, and the resize + normalisation of the
 * vision tower's input.  The codecs are image_png.c and image_jpeg.c.
 *
 * Resize: bilinear with half-pixel centres, the arithmetic of PyTorch's
 * upsample_bilinear2d (align_corners=False, no antialias):
 *     scale = in / out (float),  s = max(scale * (o + 0.5) - 0.5, 0),
 *     i0 = (int)s, i1 = min(i0 + 1, in - 1), l1 = s - i0, l0 = 1 - l1,
 *     v = l0y * (l0x * p[i0y][i0x] + l1x * p[i0y][i1x])
 *       + l1y * (l0x * p[i1y][i0x] + l1x * p[i1y][i1x]).
 * When in == out every source coordinate is an integer and the pixels are
 * copied exactly.
 */
#include "core/image/image.h"
#include "core/common.h"
#include "core/image/image_jpeg.h"
#include "core/image/image_png.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

ImageLimits image_limits(const ImageLimits *lim)
{
    ImageLimits l = { IMAGE_DEFAULT_MAX_BYTES, IMAGE_DEFAULT_MAX_PIXELS };
    if (lim && lim->max_bytes) l.max_bytes = lim->max_bytes;
    if (lim && lim->max_pixels) l.max_pixels = lim->max_pixels;
    return l;
}

int image_decode(const uint8_t *buf, size_t n, const ImageLimits *lim, Image *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    ImageLimits l = image_limits(lim);
    if (!n) {
        snprintf(err, err_len, "empty image (0 bytes)");
        return -1;
    }
    if (n > l.max_bytes) {
        snprintf(err, err_len, "image of %zu bytes is over the limit of %zu bytes", n, l.max_bytes);
        return -1;
    }
    if (image_png_sniff(buf, n)) return image_png_decode(buf, n, &l, out, err, err_len);
    if (image_jpeg_sniff(buf, n)) return image_jpeg_decode(buf, n, &l, out, err, err_len);
    /* Name what it starts with: the first bytes, printable or in hex. */
    char head[40] = "";
    size_t k = 0;
    for (size_t i = 0; i < n && i < 8 && k + 5 < sizeof head; i++)
        k += (size_t)snprintf(head + k, sizeof head - k, buf[i] >= 0x20 && buf[i] < 0x7f ? "%c" : "\\x%02x", buf[i]);
    snprintf(err, err_len, "not a PNG or JPEG image (it starts with \"%s\")", head);
    return -1;
}

int image_load(const char *path, const ImageLimits *lim, Image *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    ImageLimits l = image_limits(lim);
    /* the size is checked before anything is read (a bomb of a file is
     * never loaded); td_read_file bounds it again should the file grow */
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        return -1;
    }
    if ((size_t)st.st_size > l.max_bytes) {
        snprintf(err, err_len, "%s: image of %zu bytes is over the limit of %zu bytes", path, (size_t)st.st_size,
                 l.max_bytes);
        return -1;
    }
    char *text = NULL;
    size_t n = 0;
    int r = td_read_file(path, l.max_bytes, &text, &n, err, err_len);
    if (r) {
        if (r > 0) snprintf(err, err_len, "%s: cannot open: %s", path, strerror(ENOENT));
        return -1;
    }
    uint8_t *buf = (uint8_t *)text;
    char e[256];
    int rc = image_decode(buf, n, &l, out, e, sizeof e);
    td_free(buf);
    if (rc) snprintf(err, err_len, "%s: %s", path, e);
    return rc;
}

void image_free(Image *im)
{
    if (!im) return;
    td_free(im->rgb);
    im->rgb = NULL;
    im->w = im->h = 0;
}

/* Source index pair and weights of output coordinate o along one axis. */
static void resize_axis(size_t o, size_t in, size_t out, size_t *i0, size_t *i1, float *l0, float *l1)
{
    float scale = (float)in / (float)out;
    float s = scale * ((float)o + 0.5f) - 0.5f;
    if (s < 0) s = 0;
    size_t i = (size_t)s;
    if (i > in - 1) i = in - 1;
    *i0 = i;
    *i1 = i < in - 1 ? i + 1 : i;
    *l1 = s - (float)i;
    *l0 = 1.0f - *l1;
}

void image_to_pixels(const Image *im, size_t size, const float mean[3], const float std[3], float *out)
{
    TD_CHECK(im && im->rgb && im->w > 0 && im->h > 0 && size > 0, "image_to_pixels: empty image or size");
    const size_t W = (size_t)im->w, H = (size_t)im->h;
    for (size_t y = 0; y < size; y++) {
        size_t y0, y1;
        float ly0, ly1;
        resize_axis(y, H, size, &y0, &y1, &ly0, &ly1);
        for (size_t x = 0; x < size; x++) {
            size_t x0, x1;
            float lx0, lx1;
            resize_axis(x, W, size, &x0, &x1, &lx0, &lx1);
            const uint8_t *p00 = im->rgb + (y0 * W + x0) * 3, *p01 = im->rgb + (y0 * W + x1) * 3;
            const uint8_t *p10 = im->rgb + (y1 * W + x0) * 3, *p11 = im->rgb + (y1 * W + x1) * 3;
            for (size_t c = 0; c < 3; c++) {
                float v = ly0 * (lx0 * (float)p00[c] + lx1 * (float)p01[c])
                        + ly1 * (lx0 * (float)p10[c] + lx1 * (float)p11[c]);
                out[(c * size + y) * size + x] = (v / 255.0f - mean[c]) / std[c];
            }
        }
    }
}

int image_write_png(const char *path, const Image *im, char *err, size_t err_len)
{
    return image_png_write(path, im, err, err_len);
}

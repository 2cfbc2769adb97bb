/* core/image/image_png.c - PNG decoding and writing through libpng
 * (image_png.h).
 *
 * libpng reports errors by calling our error function, which records the
 * message and longjmps back to the setjmp in the caller; everything
 * allocated before the jump is held in volatile locals and released there.
 * The image is read from memory by a callback that refuses to read past the
 * end of the buffer (a truncated file), and the whole file is read, IEND
 * included.  Width and height are checked against the limits after the
 * header (png_read_info) and before a byte of pixel data is inflated, so a
 * small file that declares a huge image (a decompression bomb) costs
 * nothing.
 */
#include "core/image/image_png.h"
#include "core/common.h"

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const uint8_t *buf;
    size_t n, off;
    bool truncated;     /* a read past the end of the buffer */
    char msg[160];
} PngCtx;

static void png_ctx_error(png_structp png, png_const_charp msg)
{
    PngCtx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

/* Warnings (an incorrect sRGB profile, a bad ancillary chunk's CRC) change
 * no pixel: libpng skips what it warns about. */
static void png_ctx_warn(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static void png_ctx_read(png_structp png, png_bytep dst, size_t len)
{
    PngCtx *c = png_get_io_ptr(png);
    if (len > c->n - c->off) {
        c->truncated = true;
        png_error(png, "the data ends early");
    }
    memcpy(dst, c->buf + c->off, len);
    c->off += len;
}

bool image_png_sniff(const uint8_t *buf, size_t n)
{
    return n >= 8 && !png_sig_cmp(buf, 0, 8);
}

/* The first chunk whose declared length runs past the data, or -1.
 * libpng allocates (and clears) a text chunk's declared length before it
 * reads it: a 124-byte file declaring a 1.9 GB zTXt took 1.9 GB. */
static long chunk_past_end(const uint8_t *buf, size_t n, uint32_t *len, char type[5])
{
    size_t o = 8;
    if (n < 16 || png_sig_cmp(buf, 0, 8) || memcmp(buf + 12, "IHDR", 4)) return -1;   /* libpng's to name */
    while (o + 8 <= n) {
        const uint32_t L = (uint32_t)buf[o] << 24 | (uint32_t)buf[o + 1] << 16 | (uint32_t)buf[o + 2] << 8 | buf[o + 3];
        bool letters = true;   /* a chunk type is four ASCII letters; anything else is libpng's to refuse */
        for (int i = 0; i < 4; i++) {
            const uint8_t c = buf[o + 4 + i];
            letters &= (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
        }
        if (!letters) return -1;
        if ((uint64_t)L + 12 > n - o) {
            *len = L;
            memcpy(type, buf + o + 4, 4);
            type[4] = 0;
            return (long)o;
        }
        if (!memcmp(buf + o + 4, "IEND", 4)) break;   /* what follows the image is not read */
        o += 12 + (size_t)L;
    }
    return -1;
}

int image_png_decode(const uint8_t *buf, size_t n, const ImageLimits *lim, Image *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    uint32_t clen;
    char ctype[5];
    const long at = chunk_past_end(buf, n, &clen, ctype);
    if (at >= 0) {
        snprintf(err, err_len, "truncated PNG (%zu bytes): chunk %s at byte %ld declares %u bytes", n, ctype, at,
                 (unsigned)clen);
        return -1;
    }
    PngCtx ctx = { .buf = buf, .n = n };
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_ctx_error, png_ctx_warn);
    if (!png) {
        snprintf(err, err_len, "PNG: libpng could not start");
        return -1;
    }
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    if (!info || setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, info ? &info : NULL, NULL);
        td_free(rgb);
        td_free(rows);
        if (ctx.truncated) snprintf(err, err_len, "truncated PNG (%zu bytes): %s", n, ctx.msg);
        else snprintf(err, err_len, "corrupt PNG: %s", ctx.msg[0] ? ctx.msg : "libpng could not start");
        return -1;
    }
    /* Our pixel limit decides, with its own message: libpng's per-side
     * limit (1,000,000 by default) is lifted to the format's maximum. */
    png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    png_set_read_fn(png, &ctx, png_ctx_read);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int depth = png_get_bit_depth(png, info), type = png_get_color_type(png, info);
    if (!w || !h || (uint64_t)w * h > lim->max_pixels) {
        snprintf(err, err_len, "PNG of %ux%u pixels: %s", (unsigned)w, (unsigned)h,
                 !w || !h ? "the image is empty" : "more than the limit of pixels");
        if (w && h)
            snprintf(err + strlen(err), err_len - strlen(err), " (%zu)", lim->max_pixels);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    /* To 8-bit RGB, as PIL's convert("RGB"): palette and low-depth gray
     * expanded, 16 bits cut to the high byte, alpha (or tRNS) dropped, gray
     * replicated. */
    png_set_expand(png);
    if (depth == 16) png_set_strip_16(png);
    png_set_strip_alpha(png);
    if (!(type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) png_error(png, "unexpected row layout after conversion to RGB");
    rgb = td_malloc((size_t)w * h * 3);
    rows = td_malloc((size_t)h * sizeof *rows);
    for (size_t y = 0; y < h; y++) rows[y] = rgb + y * (size_t)w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    td_free(rows);
    out->w = (int)w;
    out->h = (int)h;
    out->rgb = rgb;
    return 0;
}

typedef struct {
    char msg[160];
} PngWriteCtx;

static void png_write_error(png_structp png, png_const_charp msg)
{
    PngWriteCtx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

int image_png_write(const char *path, const Image *im, char *err, size_t err_len)
{
    TD_CHECK(im && im->rgb && im->w > 0 && im->h > 0, "image_write_png: empty image");
    FILE *volatile f = fopen(path, "wb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    PngWriteCtx ctx = { { 0 } };
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, png_write_error, png_ctx_warn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *volatile rows = NULL;
    if (!png || !info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, info ? &info : NULL);
        td_free(rows);
        fclose(f);
        snprintf(err, err_len, "%s: PNG write failed: %s", path, ctx.msg[0] ? ctx.msg : "libpng could not start");
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)im->w, (png_uint_32)im->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    rows = td_malloc((size_t)im->h * sizeof *rows);
    for (size_t y = 0; y < (size_t)im->h; y++) rows[y] = im->rgb + y * (size_t)im->w * 3;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    td_free(rows);
    if (fclose(f)) {
        snprintf(err, err_len, "%s: PNG write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

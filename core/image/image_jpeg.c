/* core/image/image_jpeg.c - JPEG decoding through libjpeg-turbo
 * (image_jpeg.h).
 *
 * libjpeg's error_exit is replaced by one that formats the message and
 * longjmps back to the setjmp in image_jpeg_decode, where the decompressor
 * and our buffer are released.  Its warnings (the data ends early, corrupt
 * entropy-coded data, extraneous bytes) are errors here too: libjpeg would
 * otherwise fill the missing part of a truncated file with gray and carry
 * on.  The header (jpeg_read_header) gives width and height, checked
 * against the limits before jpeg_start_decompress allocates anything for
 * the pixels; a progressive file may not have more than JPEG_MAX_SCANS
 * scans (a small file of many empty scans costs a full pass each).
 */
#include "core/image/image_jpeg.h"
#include "core/common.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>
/* jpeglib.h needs stdio.h's FILE first */
#include <jpeglib.h>

#define JPEG_MAX_SCANS 500

typedef struct {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jmp;
    char msg[JMSG_LENGTH_MAX + 32];
} JpegCtx;

static void jpeg_ctx_exit(j_common_ptr cinfo)
{
    JpegCtx *c = (JpegCtx *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, c->msg);
    longjmp(c->jmp, 1);
}

/* level < 0: a warning (recoverable corrupt data), an error here; level >=
 * 0: trace messages, never printed. */
static void jpeg_ctx_message(j_common_ptr cinfo, int level)
{
    if (level < 0) jpeg_ctx_exit(cinfo);
}

static void jpeg_ctx_progress(j_common_ptr cinfo)
{
    JpegCtx *c = (JpegCtx *)cinfo->err;
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (cinfo->is_decompressor && d->input_scan_number > JPEG_MAX_SCANS) {
        snprintf(c->msg, sizeof c->msg, "more than %d progressive scans", JPEG_MAX_SCANS);
        longjmp(c->jmp, 1);
    }
}

bool image_jpeg_sniff(const uint8_t *buf, size_t n)
{
    return n >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF;
}

int image_jpeg_decode(const uint8_t *buf, size_t n, const ImageLimits *lim, Image *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    struct jpeg_decompress_struct cinfo;
    JpegCtx ctx;
    memset(&ctx, 0, sizeof ctx);
    cinfo.err = jpeg_std_error(&ctx.pub);
    ctx.pub.error_exit = jpeg_ctx_exit;
    ctx.pub.emit_message = jpeg_ctx_message;
    uint8_t *volatile rgb = NULL;
    if (setjmp(ctx.jmp)) {
        jpeg_destroy_decompress(&cinfo);
        td_free(rgb);
        snprintf(err, err_len, "%s JPEG: %s",
                 strstr(ctx.msg, "Premature end") ? "truncated" : "corrupt", ctx.msg);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    ctx.progress.progress_monitor = jpeg_ctx_progress;
    cinfo.progress = &ctx.progress;
    jpeg_mem_src(&cinfo, buf, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    JDIMENSION w = cinfo.image_width, h = cinfo.image_height;
    if (!w || !h || (uint64_t)w * h > lim->max_pixels) {
        snprintf(err, err_len, "JPEG of %ux%u pixels: %s", (unsigned)w, (unsigned)h,
                 !w || !h ? "the image is empty" : "more than the limit of pixels");
        if (w && h) snprintf(err + strlen(err), err_len - strlen(err), " (%zu)", lim->max_pixels);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        snprintf(err, err_len, "JPEG: CMYK images are not supported (convert to RGB first)");
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3 || cinfo.output_width != w || cinfo.output_height != h) {
        snprintf(ctx.msg, sizeof ctx.msg, "unexpected output layout");
        longjmp(ctx.jmp, 1);
    }
    rgb = td_malloc((size_t)w * h * 3);
    while (cinfo.output_scanline < h) {
        JSAMPROW row = rgb + (size_t)cinfo.output_scanline * w * 3;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
            snprintf(ctx.msg, sizeof ctx.msg, "no scanline decoded at row %u", (unsigned)cinfo.output_scanline);
            longjmp(ctx.jmp, 1);
        }
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    out->w = (int)w;
    out->h = (int)h;
    out->rgb = rgb;
    return 0;
}

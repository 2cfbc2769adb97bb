/* core/image/image_set.h - a set of image questions and answers: a JSONL
 * file (what `tandem data images` writes, DIR/shapes.jsonl) of objects
 * with at least the string fields "image" (a PNG or JPEG file name,
 * relative to the file's directory), "prompt" and "answer"; other fields
 * are ignored.  Each line's image is decoded once and kept resized and
 * normalised as the model's vision_config says, so the trainer
 * (train/image_data.h) and `tandem eval-vision` read the same pixels.
 */
#ifndef TANDEM_CORE_IMAGE_IMAGE_SET_H
#define TANDEM_CORE_IMAGE_IMAGE_SET_H

#include <stddef.h>

typedef struct {
    char *image, *prompt, *answer;   /* owned; image as the line says */
    size_t pix;                      /* index of its pixels in ImageSet.pixels */
} ImageExample;

typedef struct {
    ImageExample *ex;
    size_t n;
    size_t n_img;                    /* distinct images */
    size_t S;                        /* image side of the pixels */
    float *pixels;                   /* (n_img, 3, S, S) */
} ImageSet;

/* Largest pixel cache image_set_load builds (bytes). */
#define IMAGE_SET_MAX_BYTES ((size_t)1 << 30)

/* path: a directory holding shapes.jsonl, or a JSONL file.  Every line is
 * checked (an object with the three strings; the image a plain file name
 * or relative path without "..", decoded under core/image's limits) and
 * the images resized to S and normalised with mean / std.  0, or -1 with
 * one line in err naming the file and line. */
int image_set_load(ImageSet *s, const char *path, size_t S, const float mean[3], const float std[3], char *err,
                   size_t err_len);
void image_set_free(ImageSet *s);
/* The pixels (3, S, S) of example i. */
const float *image_set_pixels(const ImageSet *s, size_t i);

#endif

/* train/image_data.h - image questions and answers in the training batches
 * (run keys `images`, `image_fraction`; docs/vision.md, "Training").
 *
 * Micro-batch i (the text loader's cursor), global row r of B is an image
 * row when floor((r + 1) f) > floor(r f), f = image_fraction: round(B f)
 * rows spread over the batch; the others keep the text loader's window.
 * The k-th image row of micro-batch i takes example
 *     shuffle=false: (i K + k) mod n        (K image rows per micro-batch)
 *     shuffle=true:  uniform, drawn by a generator seeded with (seed, i)
 * so every rank knows the whole batch (and its count of scored tokens)
 * without communication, and resuming at a cursor draws the same examples.
 * An image row is the image's P placeholders (image_token_index), the
 * prompt's tokens then the answer's: tok(prompt + "\n"), tok(answer + "\n")
 * (no special tokens), padded with id 0; only the answer's tokens (the
 * targets at their positions) are scored.  A text row scores every token.
 */
#ifndef TANDEM_TRAIN_IMAGE_DATA_H
#define TANDEM_TRAIN_IMAGE_DATA_H

#include "core/image/image_set.h"
#include "core/model/config.h"
#include "core/tok/tokenizer.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    ImageSet set;
    int32_t **ids;          /* per example: P placeholders, prompt, answer tokens */
    size_t *len, *n_answer; /* per example: tokens, of which the last n_answer are the answer */
    size_t B, T, P, row0, rows, K;   /* global rows, sequence length, image tokens, this rank's rows, image rows */
    double fraction;
    bool shuffle;
    uint64_t seed;
    bool *is_img;           /* (B) global rows that are image rows */
} ImageLoader;

/* Loads path (a `tandem data images` directory or a JSONL file) for the
 * model of cfg (its vision_config sizes and normalises the pixels),
 * tokenising with tok.  0, or -1 with one line in err: no tower, an
 * example longer than seq_len + 1 tokens, a bad file or line. */
int image_loader_init(ImageLoader *il, const char *path, const ModelConfig *cfg, const Tokenizer *tok,
                      double fraction, size_t B, size_t T, size_t dp, size_t dp_rank, bool shuffle, uint64_t seed,
                      char *err, size_t err_len);
void image_loader_free(ImageLoader *il);

/* Micro-batch `cursor`: overwrites this rank's image rows of ids and
 * targets (rows x T, as loader_next filled them), writes w (rows x T: 1
 * for a scored target, 0 otherwise) and the pixels of its image rows in
 * row order (up to rows images of 3 S S).  Returns the images written;
 * *n_scored is the scored targets of the whole micro-batch (all ranks). */
size_t image_loader_fill(const ImageLoader *il, int64_t cursor, int32_t *ids, int32_t *targets, float *w,
                         float *pixels, double *n_scored);

#endif

/* infer/server/server_image.h - the images of a chat request (SPEC
 * section 13, docs/vision.md): content parts
 *     {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
 * (or image/jpeg; "image_url" may also be the URL string itself) decoded
 * under the server's limits (core/image), resized and normalised as the
 * model's vision_config says, and the placeholders that stand for them in
 * the prompt.  Only data: URLs are accepted: the server fetches nothing.
 *
 * A message that holds an image part has its content flattened, for the
 * chat template, into one string: its parts in order, each text part's
 * text and "<image>" (API_IMAGE_PLACEHOLDER) for each image, joined by
 * "\n" (vLLM's rendering of content parts for templates that take string
 * content; the LLaVA prompt "<image>\nWhat is this?").  The model's
 * tokenizer maps "<image>" to image_token_index; after encoding, each such
 * id is expanded to the image's tokens_per_image copies, which the engine
 * replaces by the image's vectors.  Messages without images are left as
 * they are.
 *
 * Pure and thread-safe: every function works on its arguments only.
 */
#ifndef TANDEM_INFER_SERVER_SERVER_IMAGE_H
#define TANDEM_INFER_SERVER_SERVER_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "core/image/image.h"
#include "core/tok/tokenizer.h"

#define API_IMAGE_PLACEHOLDER "<image>"
#define API_DEFAULT_MAX_IMAGES 16   /* per request */

/* What the model takes (set once at server start). */
typedef struct {
    size_t tokens;          /* placeholder tokens per image (vision_tokens_per_image); 0: no images */
    int32_t token_id;       /* image_token_index */
    size_t size;            /* S: images are resized to S x S */
    float mean[3], std[3];  /* normalisation (vision_config.image_mean / image_std) */
    ImageLimits limits;     /* bytes and pixels of one encoded image */
    int max_images;         /* per request (0: API_DEFAULT_MAX_IMAGES) */
} ApiVision;

/* Decodes the bytes of a data URL "data:image/png;base64,..." (or
 * image/jpeg, image/jpg; the format is then told by the bytes) within lim.
 * Returns 0 and *out (image_free), or -1 with one line in why. */
int api_image_from_url(const char *url, const ImageLimits *lim, Image *out, char *why, size_t why_len);

/* Standard base64 (RFC 4648, '=' padding; ASCII whitespace skipped) of
 * s[0..n) into out (room for 3 * n / 4 + 3 bytes); *out_n the bytes
 * written.  -1 with why naming the offset of a bad character. */
int api_base64_decode(const char *s, size_t n, uint8_t *out, size_t *out_n, char *why, size_t why_len);

/* Walks messages (a JSON array the caller owns; modified in place): every
 * message whose content list holds an image_url part gets its content
 * flattened as above, and its images are decoded and turned into pixels in
 * the order they appear.  pixels: td_malloc'd (n_img, 3, S, S), NULL when
 * there are none (or when want_pixels is false: the images are still
 * decoded, so a bad one is refused).  context: the model's positions (n_img
 * x tokens must leave room for text).  Returns 0, or -1 with one line in
 * why naming the message and part ("messages[0].content[1]: ..."). */
int api_images_collect(cJSON *messages, const ApiVision *v, size_t context, bool want_pixels, float **pixels,
                       size_t *n_img, char *why, size_t why_len);

/* After encoding: the prompt must hold exactly n_img ids token_id (one per
 * image, where the template placed "<image>"); each is expanded to
 * v->tokens copies, in place.  For a model without images (v->tokens 0)
 * nothing is done.  -1 with why when the count differs (text that spells
 * "<image>" itself, or a template or tokenizer that dropped or split it). */
int api_images_expand(TokIds *ids, const ApiVision *v, size_t n_img, char *why, size_t why_len);

#endif

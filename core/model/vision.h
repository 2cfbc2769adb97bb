/* core/model/vision.h - the vision tower and projector of a LLaVA-style
 * model (docs/vision.md), built from the core ops with forward and
 * backward, so the trainer trains it and the engine serves it.
 *
 *   pixels (n_img, 3, S, S), normalised (core/image/image.h)
 *   patches (R, 3 p p), R = n_img P, P = (S / p)^2, row img P + py S/p + px,
 *       column c p p + ky p + kx (a Conv2d of stride p, weight [Dv, 3, p, p])
 *   x = patches Wpe^T + bpe + pos[row mod P]
 *   per layer (pre-norm, bidirectional attention over an image's P rows):
 *       h1 = layernorm(x, ln1);  q, k, v = h1 W^T + b;  att = attention_bidir(q, k, v)
 *       x = x + att Wo^T + bo
 *       h2 = layernorm(x, ln2);  x = x + gelu(h2 W1^T + b1) W2^T + b2
 *   hp = layernorm(x, post_layernorm)
 *   out (R, d) = gelu(hp P1^T + c1) P2^T + c2         (the projector)
 *
 * The out rows take the place of the image placeholder tokens
 * (image_token_index) in the language model's input, image after image,
 * in the order the placeholders appear (model_vision_scatter).
 *
 * Tensor parallelism splits the heads (q/k/v rows, o columns), fc1 rows /
 * fc2 columns and the projector's linear_1 rows / linear_2 columns, like
 * the language model; the row-parallel outputs are summed over tp
 * (ModelComm.tp_allreduce) before their bias.  Every op is row-invariant
 * and an image's rows depend only on its pixels: encoding an image alone
 * or in a batch gives the same bits.
 */
#ifndef TANDEM_CORE_MODEL_VISION_H
#define TANDEM_CORE_MODEL_VISION_H

#include "core/model/model.h"

/* Placeholder tokens (and out rows) per image: (S / p)^2; 0 without a tower. */
size_t vision_tokens_per_image(const ModelConfig *cfg);

/* Activations of the vision tower for up to max_img images, kept for
 * backward.  Owned buffers (vision_acts_init / vision_acts_free). */
typedef struct VisionActs {
    size_t max_img, n_img, R;   /* capacity, images of the last forward, their rows */
    size_t n_layers;            /* Lv of the buffers */
    bool shared;                /* model_vision_encode's: one layer's buffers for every layer, no backward */
    float *patches;             /* (R, 3 p p) */
    float **x;                  /* Lv + 1 residual streams (R, Dv) */
    float **h1, **mu1, **rs1, **q, **k, **v, **att, **lse, **x_mid, **h2, **mu2, **rs2, **f1, **g1;
    void **kv;                  /* per layer: n_img KV blocks of bs = P rounded up to 16 */
    int32_t *blocks;            /* block i = image i */
    AttnSeq *seqs;              /* image i = rows [i P, (i + 1) P), positions 0.. */
    float *hp, *mup, *rsp;      /* post_layernorm (R, Dv) (R) (R) */
    float *a1, *ga1;            /* projector hidden before and after GELU (R, d local) */
    float *out;                 /* (R, d) the image vectors */
    /* backward scratch */
    float *dout;                /* (R, d) the gradient of out (model_train_backward gathers it) */
    float *dx, *dxm, *dh, *dq, *dk, *dv, *datt, *df, *dg, *dhp, *da1, *dga1;
} VisionActs;

/* Buffers for up to max_img images of m's tower; a zeroed struct when m has
 * none. */
void vision_acts_init(VisionActs *a, const Model *m, size_t max_img);
void vision_acts_free(VisionActs *a);

/* a->out (n_img P, d) = the tower and projector on pixels (n_img, 3, S, S);
 * every activation kept in a for vision_backward. */
void vision_forward(const Model *m, VisionActs *a, const float *pixels, size_t n_img);
/* From dout (n_img P, d), the gradient of a->out of the last forward: adds
 * into the gradients of every vision and projector Param. */
void vision_backward(Model *m, VisionActs *a, const float *dout);

/* pixels: n_img x 3 x S x S (S = vision_config.image_size), out: n_img x
 * tokens x hidden (overwritten).  The serving entry point: vision_forward
 * on buffers of its own, allocated for the call: one layer's activations,
 * reused by every layer, and no backward scratch. */
void model_vision_encode(const Model *m, const float *pixels, size_t n_img, float *out);

/* x (n, d): each row whose id is image_token_index takes the next row of img
 * (n_img_rows, d), in order.  The placeholders must number n_img_rows
 * (checked). */
void model_vision_scatter(const Model *m, float *x, const int32_t *ids, size_t n, const float *img,
                          size_t n_img_rows);
/* The inverse for backward: dimg (n_img_rows, d) = the rows of dx at the
 * placeholders, in order; those rows of dx are then zeroed (the
 * placeholder's embedding is not used, so gets no gradient). */
void model_vision_gather(const Model *m, float *dimg, float *dx, const int32_t *ids, size_t n,
                         size_t n_img_rows);

#endif

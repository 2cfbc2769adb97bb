/* core/ops/rope.h - rotary position embedding, rotate-half convention of HF
 * Llama: pairs (i, i + hd/2) of each head are rotated by angle
 * pos * inv_freq_i, inv_freq_i = theta^(-2i/hd):
 *   x'_i        = x_i c - x_{i+hd/2} s
 *   x'_{i+hd/2} = x_{i+hd/2} c + x_i s
 * The table holds cos/sin for every position up to max_pos, computed as HF
 * does in float32 (inv_freq, then pos * inv_freq, then cos/sin).
 *
 * Scaling (HF `rope_scaling`, transformers modeling_rope_utils.py), any
 * family: "linear" divides inv_freq by factor; "yarn" (YaRN, arXiv
 * 2309.00071, HF _compute_yarn_parameters) blends the interpolated
 * inv_freq / factor and the extrapolated inv_freq along a linear ramp over
 * the dimensions [low, high] found from beta_fast / beta_slow rotations at
 * original_max_position_embeddings, and multiplies cos and sin by the
 * attention factor (given, or 0.1 ln(factor) + 1, or with mscale and
 * mscale_all_dim the ratio of the two such terms).  All in float32 in HF's
 * order of operations; the scalar set-up (the ramp's ends, the attention
 * factor) in double, as Python computes it.
 */
#ifndef TANDEM_CORE_OPS_ROPE_H
#define TANDEM_CORE_OPS_ROPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_YARN } RopeScalingType;

/* HF rope_scaling.  0 in a field means "absent" (HF treats 0 and absent
 * alike for each of them: `or 32`, `if mscale and mscale_all_dim`). */
typedef struct {
    RopeScalingType type;
    double factor;                           /* linear, yarn: > 0 */
    int original_max_position_embeddings;    /* yarn: the pretraining context (0: max_position_embeddings) */
    double beta_fast, beta_slow;             /* yarn: 0 = 32, 1 */
    double mscale, mscale_all_dim;           /* yarn: 0 = absent */
    double attention_factor;                 /* yarn: 0 = derived from factor (and mscale) */
    bool no_truncate;                        /* yarn: HF "truncate": false (the ramp's ends not rounded) */
} RopeScaling;

typedef struct {
    float *cos, *sin;   /* owned, (max_pos, hd/2) */
    size_t max_pos, half;
} RopeTable;

/* Plain RoPE (no scaling). */
void rope_table_init(RopeTable *t, size_t max_pos, size_t hd, double theta);
/* Bytes rope_table_init allocates. */
static inline size_t rope_table_bytes(size_t max_pos, size_t hd) { return 2 * max_pos * (hd / 2) * sizeof(float); }
/* With scaling s (NULL or type NONE: plain).  For yarn an absent
 * original_max_position_embeddings means max_pos. */
void rope_table_init_scaled(RopeTable *t, size_t max_pos, size_t hd, double theta, const RopeScaling *s);
void rope_table_free(RopeTable *t);

/* The inverse frequencies HF computes (hd/2 float32 values) for scaling s
 * (NULL: plain); max_pos as for rope_table_init_scaled. */
void rope_inv_freq(float *inv, size_t hd, double theta, const RopeScaling *s, size_t max_pos);
/* YaRN's cos/sin multiplier (HF attention_scaling): 1 unless yarn. */
double rope_attention_factor(const RopeScaling *s);
/* HF yarn_get_mscale: 1 when scale <= 1, else 0.1 m ln(scale) + 1. */
double rope_yarn_mscale(double scale, double m);
/* DeepSeek-V3's factor on the softmax scale (modeling_deepseek_v3
 * attention __init__): mscale^2 with mscale = yarn_get_mscale(factor,
 * mscale_all_dim) when s is yarn with mscale_all_dim set, else 1. */
double rope_softmax_scale_factor(const RopeScaling *s);

/* Rotates x (N, n_heads * hd) in place; row t is at position pos[t]
 * (0 <= pos[t] < max_pos, validated by the caller).  hd must be even. */
void rope_forward(float *x, const int32_t *restrict pos, const RopeTable *t,
                  size_t N, size_t n_heads, size_t hd);
/* In place: dx = R(pos)^T dy, i.e. rotates the gradient back. */
void rope_backward(float *dx, const int32_t *restrict pos, const RopeTable *t,
                   size_t N, size_t n_heads, size_t hd);

/* The rotation of rope_forward on part of each head: dims [off, off + hd)
 * of head h of row r, which starts at x + (r n_heads + h) stride (MLA's
 * rope part, after its no-RoPE dims).  interleave: pairs (2i, 2i + 1)
 * instead of (i, i + hd/2), by the same angle pos * inv_freq_i (HF
 * DeepSeek-V3's rope_interleave, up to a permutation of the dims that
 * queries and keys share).  rope_forward(x, ..., hd) is
 * rope_forward_at(x, ..., hd, 0, hd, false), bit for bit. */
void rope_forward_at(float *x, const int32_t *restrict pos, const RopeTable *t, size_t N, size_t n_heads,
                     size_t stride, size_t off, size_t hd, bool interleave);
void rope_backward_at(float *dx, const int32_t *restrict pos, const RopeTable *t, size_t N, size_t n_heads,
                      size_t stride, size_t off, size_t hd, bool interleave);

#endif

/* core/ops/rope.h - rotary position embedding, rotate-half convention of HF
 * Llama: pairs (i, i + hd/2) of each head are rotated by angle
 * pos * inv_freq_i, inv_freq_i = theta^(-2i/hd):
 *   x'_i        = x_i c - x_{i+hd/2} s
 *   x'_{i+hd/2} = x_{i+hd/2} c + x_i s
 * The table holds cos/sin for every position up to max_pos, computed as HF
 * does in float32 (inv_freq, then pos * inv_freq, then cos/sin).
 */
#ifndef TANDEM_CORE_OPS_ROPE_H
#define TANDEM_CORE_OPS_ROPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    float *cos, *sin;   /* owned, (max_pos, hd/2) */
    size_t max_pos, half;
} RopeTable;

void rope_table_init(RopeTable *t, size_t max_pos, size_t hd, double theta);
/* Bytes rope_table_init allocates. */
static inline size_t rope_table_bytes(size_t max_pos, size_t hd) { return 2 * max_pos * (hd / 2) * sizeof(float); }
void rope_table_free(RopeTable *t);

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

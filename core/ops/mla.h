/* core/ops/mla.h - the two absorbed products of multi-head latent attention
 * (DeepSeek-V2/V3; docs/mla.md), per row and head:
 *
 *   kv_b_proj [H (nope + v), r], per head h: W_uk_h = rows [h (nope + v),
 *   h (nope + v) + nope) (nope x r), W_uv_h = the next v rows (v x r).
 *
 *   absorb_q:  ql_h = [ q_nope_h W_uk_h , q_rope_h ]     (r + rope values)
 *   absorb_o:  a_h  = W_uv_h ol_h                        (v values from r)
 *
 * so that attention runs on keys [c_kv, k_rope] and values c_kv (one kv
 * head, core/ops/attention.h's v_in_k), and q_nope_h . k_nope_h =
 * ql_h[:r] . c_kv, W_uv_h (p . c_kv) = p . v_h: the naive form's
 * result, in other roundings.
 *
 * Arithmetic (a row's result depends only on the row, any thread count):
 * ql_h[j] is one FMA chain over n = 0..nope-1 in order; a_h[i] is
 * vec_dot(W_uv_h[i], ol_h) (core/ops/vec.h).  Backward: dq_nope_h[n] +=
 * vec_dot(W_uk_h[n], dql_h); dol_h[j] += the chain over i of da_h[i]
 * W_uv_h[i][j]; weight gradients are chains over rows in order, threads
 * split by head, so they are deterministic.
 *
 * Shapes: q (N, H (nope + rope)), ql (N, H (r + rope)), ol (N, H r),
 * a (N, H v), w / dw: kv_b_proj and its gradient (H (nope + v), r), H the
 * local heads.
 */
#ifndef TANDEM_CORE_OPS_MLA_H
#define TANDEM_CORE_OPS_MLA_H

#include <stddef.h>

typedef struct {
    size_t H, nope, rope, v, r;
} MlaDims;

/* Overwrites ql. */
void mla_absorb_q_forward(float *ql, const float *restrict q, const float *restrict w, size_t N,
                          const MlaDims *d);
/* Adds into dq (N, H (nope + rope)) and dw (its W_uk rows). */
void mla_absorb_q_backward(float *dq, float *dw, const float *restrict dql, const float *restrict q,
                           const float *restrict w, size_t N, const MlaDims *d);
/* Overwrites a. */
void mla_absorb_o_forward(float *a, const float *restrict ol, const float *restrict w, size_t N,
                          const MlaDims *d);
/* Adds into dol (N, H r) and dw (its W_uv rows). */
void mla_absorb_o_backward(float *dol, float *dw, const float *restrict da, const float *restrict ol,
                           const float *restrict w, size_t N, const MlaDims *d);

#endif

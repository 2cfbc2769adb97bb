/* core/ops/moe.h - Mixture-of-Experts routing, dispatch/combine and the router
 * losses (SPEC section 2).
 *
 * Router:   p = softmax(logits) (float32), logits = h gate^T (via linear);
 *           top-k experts by p, ties to the lower index; w_j = p[idx_j],
 *           renormalised w_j /= sum_i w_i when norm_topk_prob.
 * Sigmoid router (DeepSeek-V3, transformers DeepseekV3TopkRouter):
 *           s = sigmoid(logits); choice c = s + bias (bias: the
 *           e_score_correction_bias, or none); the E experts form n_group
 *           groups of E/n_group, a group's score is the sum of its two best
 *           c, the topk_group best groups are kept (ties to the lower
 *           index) and the others' c set to -inf; top-k of c (ties to the
 *           lower index); w_j = scale * s[idx_j] / (sum_i s[idx_i] + 1e-20)
 *           when norm_topk_prob, else scale * s[idx_j].  The weights come
 *           from the unbiased s: the bias moves the choice only.
 * Dispatch: the N*k (token, slot) pairs are grouped by expert (stable in
 *           token order), so expert e runs one GEMM over its rows
 *           [offsets[e], offsets[e+1]) of the dispatched buffer.  Dropless.
 * Combine:  y_t = sum_j w_tj * eo[row(t, j)], slots in order j = 0..k-1,
 *           as a chain of FMAs from zero.
 * Losses (per micro-batch, N_tot tokens over all data-parallel ranks):
 *   aux = E / (N_tot k) * sum_e count_e P_e,  P_e = sum_t p_te / N_tot
 *         (gradient through P_e only)
 *   z   = sum_t lse_t^2 / N_tot,  lse_t = logsumexp of router logits of t
 */
#ifndef TANDEM_CORE_OPS_MOE_H
#define TANDEM_CORE_OPS_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* probs (N, E), lse (N) overwritten from logits (N, E); topk_idx, topk_w
 * (N, k) overwritten.  k <= E. */
void moe_router_forward(float *probs, float *lse, int32_t *topk_idx, float *topk_w,
                        const float *restrict logits, size_t N, size_t E, size_t k,
                        bool norm_topk);
/* Adds into dprobs (N, E) the gradient of the top-k weights dtopk_w (N, k). */
void moe_topk_backward(float *dprobs, const float *restrict dtopk_w, const float *restrict probs,
                       const int32_t *restrict topk_idx, size_t N, size_t E, size_t k,
                       bool norm_topk);

/* The sigmoid router's choice (see the file comment). */
typedef struct {
    size_t n_group, topk_group;   /* 1, 1: no groups */
    bool norm_topk;
    float scale;                  /* routed_scaling_factor */
} MoeSigmoidRouter;

/* scores (N, E) = sigmoid(logits (N, E)), overwritten; topk_idx, topk_w
 * (N, k) overwritten, slots in descending order of the choice score.
 * bias (E) or NULL (no correction).  k <= topk_group * E / n_group.
 * Row-invariant; uses the pool over rows. */
void moe_router_sigmoid_forward(float *scores, int32_t *topk_idx, float *topk_w, const float *restrict logits,
                                const float *restrict bias, size_t N, size_t E, size_t k, const MoeSigmoidRouter *r);
/* Adds into dscores (N, E) the gradient of the weights dtopk_w (N, k), the
 * choice fixed: through w_j = scale s_j / (S + 1e-20), S = sum_i s_i (or
 * w_j = scale s_j). */
void moe_sigmoid_topk_backward(float *dscores, const float *restrict dtopk_w, const float *restrict scores,
                               const int32_t *restrict topk_idx, size_t N, size_t E, size_t k,
                               const MoeSigmoidRouter *r);
/* dlogits (N, E) += dscores * s (1 - s), s = scores. */
void moe_sigmoid_backward(float *dlogits, const float *restrict dscores, const float *restrict scores,
                          size_t N, size_t E);

/* Sequence-wise balance loss of DeepSeek-V3 (its eq. 17-20), for one
 * sequence of T rows (scores (T, E), topk_idx (T, k)):
 *   f_e = E / (k T) * #{(t, j): idx_tj = e},  P_e = 1/T sum_t s_te / sum_i s_ti
 *   bal = sum_e f_e P_e          (f a constant: gradient through P only)
 * Returns bal. */
double moe_seq_balance(const float *restrict scores, const int32_t *restrict topk_idx, size_t T, size_t E,
                       size_t k);
/* dscores (T, E) += dbal * d bal / d scores for the same sequence. */
void moe_seq_balance_backward(float *dscores, float dbal, const float *restrict scores,
                              const int32_t *restrict topk_idx, size_t T, size_t E, size_t k);

/* Grouping of the N*k (token, slot) pairs by expert.  Arrays are owned by
 * the caller: offsets (E+1), src (N*k), slot_row (N*k). */
typedef struct {
    int32_t *offsets;   /* rows of expert e: [offsets[e], offsets[e+1]) */
    int32_t *src;       /* token of dispatched row i */
    int32_t *slot_row;  /* dispatched row of (t, j) at [t*k + j] */
} MoePlan;

void moe_plan_build(MoePlan *p, const int32_t *restrict topk_idx, size_t N, size_t E, size_t k);
/* xd[i] = x[src[i]]  (N*k, d), overwritten. */
void moe_dispatch_forward(float *xd, const float *restrict x, const MoePlan *p,
                          size_t N, size_t k, size_t d);
/* dx[t] += sum_j dxd[slot_row[t,j]], slots in order. */
void moe_dispatch_backward(float *dx, const float *restrict dxd, const MoePlan *p,
                           size_t N, size_t k, size_t d);
/* y[t] = sum_j w[t,j] eo[slot_row[t,j]]  (N, d), overwritten. */
void moe_combine_forward(float *y, const float *restrict eo, const float *restrict topk_w,
                         const MoePlan *p, size_t N, size_t k, size_t d);
/* deo[slot_row[t,j]] += w[t,j] dy[t];  dw[t,j] += dy[t] . eo[slot_row[t,j]] */
void moe_combine_backward(float *deo, float *dtopk_w, const float *restrict dy,
                          const float *restrict eo, const float *restrict topk_w,
                          const MoePlan *p, size_t N, size_t k, size_t d);

/* Local statistics for the aux loss, in double so that sums over ranks
 * match the single-process sums closely: count[e] = number of (t, j)
 * routed to e, psum[e] = sum_t p_te.  Overwrites count and psum (E).  Summing them
 * over data-parallel ranks gives the micro-batch's statistics. */
void moe_aux_stats(double *count, double *psum, const float *restrict probs,
                   const int32_t *restrict topk_idx, size_t N, size_t E, size_t k);
/* aux from global statistics. */
float moe_aux_loss(const double *count, const double *psum, size_t N_tot, size_t E, size_t k);
/* dprobs[t,e] += daux * E / (N_tot k) * count_e / N_tot  (N local rows). */
void moe_aux_backward(float *dprobs, float daux, const double *restrict count,
                      size_t N, size_t N_tot, size_t E, size_t k);
/* Local part of z: sum_t lse_t^2 over the N local rows. */
float moe_z_sum(const float *restrict lse, size_t N);
/* dlogits[t,e] += dz * 2 lse_t p_te / N_tot. */
void moe_z_backward(float *dlogits, float dz, const float *restrict lse,
                    const float *restrict probs, size_t N, size_t N_tot, size_t E);

#endif

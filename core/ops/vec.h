/* core/ops/vec.h - row reductions with a fixed summation order.
 *
 * Every reduction in the model (RMSNorm's sum of squares, dot products in
 * backward passes, softmax sums) goes through these, so a row's result
 * depends only on the row: 16 lane-wise partial chains (lane j takes the
 * elements i = j mod 16, accumulated in order), combined by a fixed pairwise
 * tree, then the tail (n mod 16 elements) added in order.  The lane loops
 * are written so that GCC vectorises them without reassociating anything.
 */
#ifndef TANDEM_CORE_OPS_VEC_H
#define TANDEM_CORE_OPS_VEC_H

#include <math.h>
#include <stddef.h>

#define VEC_LANES 16

static inline float vec_lanes_combine(float *acc)
{
    for (int w = VEC_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] = acc[j] + acc[j + w];
    return acc[0];
}

/* sum_i x[i] * y[i] */
static inline float vec_dot(const float *x, const float *y, size_t n)
{
    float acc[VEC_LANES] = { 0 };
    size_t i = 0;
    for (; i + VEC_LANES <= n; i += VEC_LANES)
        for (int j = 0; j < VEC_LANES; j++) acc[j] = fmaf(x[i + j], y[i + j], acc[j]);
    float s = vec_lanes_combine(acc);
    for (; i < n; i++) s = fmaf(x[i], y[i], s);
    return s;
}

/* sum_i x[i] */
static inline float vec_sum(const float *x, size_t n)
{
    float acc[VEC_LANES] = { 0 };
    size_t i = 0;
    for (; i + VEC_LANES <= n; i += VEC_LANES)
        for (int j = 0; j < VEC_LANES; j++) acc[j] += x[i + j];
    float s = vec_lanes_combine(acc);
    for (; i < n; i++) s += x[i];
    return s;
}

/* max_i x[i] (n >= 1) */
static inline float vec_max(const float *x, size_t n)
{
    float m = x[0];
    for (size_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

#endif

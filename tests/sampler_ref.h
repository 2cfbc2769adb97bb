/* tests/sampler_ref.h - the sampler as it was before selection replaced
 * sorting (infer/sampler.c until issue 12): qsort of all V ids, descending
 * by logit, ties to the lower id, then the same arithmetic; alternatives by
 * repeated linear selection.  The reference of tests/test_sampler.c and
 * the "before" of bench/sampler.c; header-only (static), one copy. */
#ifndef TANDEM_TESTS_SAMPLER_REF_H
#define TANDEM_TESTS_SAMPLER_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/common.h"
#include "core/ops/softmax.h"
#include "infer/sampler.h"

static const float *g_key;
static inline int ref_cmp(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = g_key[i], y = g_key[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

static inline void ref_pick(Sampled *out, const float *logits, size_t V, const SamplingParams *p, Rng *rng, int n_top)
{
    float *prob = td_malloc(V * sizeof(float));
    int32_t *order = td_malloc(V * sizeof(int32_t));
    int32_t id = 0;
    if (p->temperature <= 0) {
        for (size_t j = 1; j < V; j++)
            if (logits[j] > logits[id]) id = (int32_t)j;
    } else {
        for (size_t j = 0; j < V; j++) order[j] = (int32_t)j;
        g_key = logits;
        qsort(order, V, sizeof(int32_t), ref_cmp);
        size_t n = p->top_k > 0 && (size_t)p->top_k < V ? (size_t)p->top_k : V;
        double m = logits[order[0]], s = 0;
        for (size_t i = 0; i < n; i++) {
            prob[i] = (float)exp(((double)logits[order[i]] - m) / p->temperature);
            s += prob[i];
        }
        if (p->top_p < 1.0) {
            double c = 0;
            for (size_t i = 0; i < n; i++) {
                c += prob[i] / s;
                if (c >= p->top_p) {
                    n = i + 1;
                    break;
                }
            }
            s = 0;
            for (size_t i = 0; i < n; i++) s += prob[i];
        }
        double u = rng_double(rng) * s, c = 0;
        id = order[n - 1];
        for (size_t i = 0; i < n; i++) {
            c += prob[i];
            if (u < c) {
                id = order[i];
                break;
            }
        }
    }
    out->id = id;
    float lse;
    logsoftmax_xent_forward(&out->logp, &lse, logits, &id, 1, V);
    out->n_top = 0;
    if (n_top > 0) {
        if (n_top > SAMPLER_TOP_MAX) n_top = SAMPLER_TOP_MAX;
        if ((size_t)n_top > V) n_top = (int)V;
        for (int t = 0; t < n_top; t++) {
            int32_t best = -1;
            for (size_t j = 0; j < V; j++) {
                bool taken = false;
                for (int u2 = 0; u2 < t; u2++) taken |= out->top_id[u2] == (int32_t)j;
                if (!taken && (best < 0 || logits[j] > logits[best])) best = (int32_t)j;
            }
            out->top_id[t] = best;
            out->top_logp[t] = logits[best] - lse;
        }
        out->n_top = n_top;
    }
    td_free(prob);
    td_free(order);
}

#endif

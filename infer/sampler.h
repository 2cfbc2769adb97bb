/* infer/sampler.h - choosing the next token.
 *
 * temperature 0 is greedy (argmax, ties to the lower id).  Otherwise the
 * distribution softmax(logits / temperature) is cut to the top_k ids
 * (0 = all) and then to the smallest prefix of them whose probability
 * reaches top_p, and one id is drawn with the request's own generator, so
 * the same seed gives the same tokens whatever else the engine runs.
 *
 * The reported log-probability is always the model's own,
 * log_softmax(logits)[id] at temperature 1, computed by the same op as the
 * trainer's cross-entropy (core/ops/softmax.h), so generate, serve, score and
 * training agree bit for bit.
 */
#ifndef TANDEM_INFER_SAMPLER_H
#define TANDEM_INFER_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"

typedef struct {
    double temperature;   /* 0: greedy */
    int top_k;            /* 0: no limit */
    double top_p;         /* 1: no limit */
} SamplingParams;

#define SAMPLER_TOP_MAX 20

typedef struct {
    int32_t id;
    float logp;
    int n_top;                          /* alternatives filled */
    int32_t top_id[SAMPLER_TOP_MAX];
    float top_logp[SAMPLER_TOP_MAX];
} Sampled;

/* Picks from logits (V, no NaN).  scratch: sampler_scratch_bytes(V)
 * bytes (20 V + 64), owned by the caller, one pick at a time.  n_top
 * alternatives (<= SAMPLER_TOP_MAX) by log-probability, ties to the lower
 * id.  O(V) per pick (radix selection and sorting, sampler.c). */
void sampler_pick(Sampled *out, const float *logits, size_t V, const SamplingParams *p, Rng *rng,
                  int n_top, void *scratch);
size_t sampler_scratch_bytes(size_t V);

#endif

/* tests/test_sampler.c - the sampler (infer/sampler.h) against the
 * qsort-based version it replaced, kept here as the reference: the same
 * ids, the same log-probabilities, the same alternatives in the same order,
 * bit for bit, and the same use of the generator, on many random vectors
 * (with many ties, -0 and +0, masked -inf logits) and parameter sets.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/ops/softmax.h"
#include "core/rng.h"
#include "infer/sampler.h"

#include "tests/sampler_ref.h"

/* ------------------------------------------------------------ vectors */

enum { KIND_NORMAL, KIND_FEW_VALUES, KIND_ALL_EQUAL, KIND_ZEROS, KIND_MASKED, KIND_SPREAD, N_KINDS };

static void fill(float *x, size_t V, int kind, Rng *g)
{
    for (size_t j = 0; j < V; j++) {
        double u = rng_double(g), n = rng_normal_at(rng_next(g), j);
        switch (kind) {
        case KIND_NORMAL: x[j] = (float)(3.0 * n); break;
        case KIND_FEW_VALUES: x[j] = (float)floor(u * 6) * 0.5f - 1.0f; break;   /* 6 values: ties everywhere */
        case KIND_ALL_EQUAL: x[j] = 1.25f; break;
        case KIND_ZEROS: x[j] = u < 0.5 ? -0.0f : u < 0.8 ? 0.0f : (float)n; break;   /* -0 == +0 */
        case KIND_MASKED: x[j] = u < 0.7 ? -INFINITY : (float)(2.0 * n); break;
        default: x[j] = (float)(n * exp(8 * u));   /* wide exponent range, negatives too */
        }
    }
    if (kind == KIND_MASKED) x[rng_below(g, V)] = 0.5f;   /* at least one finite */
}

static bool same_bits(float a, float b) { return !memcmp(&a, &b, sizeof a); }

/* Every parameter set on one vector; returns how many picks were compared. */
static int compare_all(const float *x, size_t V, uint64_t seed, void *scratch, const char *what)
{
    static const double temps[] = { 0, 0.3, 1.0, 1.7 };
    static const double tops_p[] = { 1.0, 0.95, 0.5, 1e-9 };
    const int tops_k[] = { 0, 1, 2, 7, 33, 50, (int)V - 1, (int)V, (int)V + 5 };
    static const int n_tops[] = { 0, 1, 5, 20 };
    int n = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t c = 0; c < sizeof tops_k / sizeof tops_k[0]; c++) {
                if (tops_k[c] < 0) continue;
                SamplingParams sp = { temps[a], tops_k[c], tops_p[b] };
                int nt = n_tops[(a + b + c) % 4];
                Rng r1, r2;
                rng_seed(&r1, seed + 31 * c + 7 * b + a);
                r2 = r1;
                Sampled s1, s2;
                memset(&s1, 0, sizeof s1);
                memset(&s2, 0, sizeof s2);
                ref_pick(&s1, x, V, &sp, &r1, nt);
                sampler_pick(&s2, x, V, &sp, &r2, nt, scratch);
                cr_assert_eq(s2.id, s1.id, "%s V=%zu T=%g top_k=%d top_p=%g: id %d, reference %d", what, V,
                             sp.temperature, sp.top_k, sp.top_p, s2.id, s1.id);
                cr_assert(same_bits(s2.logp, s1.logp), "%s V=%zu: logp %.9g, reference %.9g", what, V, s2.logp,
                          s1.logp);
                cr_assert(!memcmp(r1.s, r2.s, sizeof r1.s), "%s V=%zu: the generator was used differently", what, V);
                cr_assert_eq(s2.n_top, s1.n_top, "%s V=%zu: %d alternatives, reference %d", what, V, s2.n_top,
                             s1.n_top);
                for (int t = 0; t < s1.n_top; t++) {
                    cr_assert_eq(s2.top_id[t], s1.top_id[t], "%s V=%zu n_top=%d: alternative %d is %d, reference %d",
                                 what, V, nt, t, s2.top_id[t], s1.top_id[t]);
                    cr_assert(same_bits(s2.top_logp[t], s1.top_logp[t]), "%s V=%zu: alternative %d logp", what, V, t);
                }
                n++;
            }
    return n;
}

static const char *const g_kind_names[N_KINDS] = { "normal", "few values", "all equal", "zeros", "masked",
                                                    "spread" };

Test(sampler, matches_the_sort_based_version_bit_for_bit)
{
    static const size_t sizes[] = { 1, 2, 3, 5, 16, 31, 33, 64, 100, 257, 1000, 2049, 5000 };
    Rng g;
    rng_seed(&g, 2024);
    size_t vmax = 5000;
    float *x = td_malloc(vmax * sizeof(float));
    void *scratch = td_malloc(sampler_scratch_bytes(vmax));
    int picks = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < N_KINDS; kind++)
            for (int rep = 0; rep < 3; rep++) {
                fill(x, sizes[si], kind, &g);
                picks += compare_all(x, sizes[si], rng_next(&g), scratch, g_kind_names[kind]);
            }
    cr_assert(picks > 10000, "only %d picks compared", picks);
    td_free(scratch);
    td_free(x);
}

/* A vocabulary of Qwen's size, where the radix passes do all their work. */
Test(sampler, matches_at_a_large_vocabulary)
{
    const size_t V = 152064;
    Rng g;
    rng_seed(&g, 99);
    float *x = td_malloc(V * sizeof(float));
    void *scratch = td_malloc(sampler_scratch_bytes(V));
    for (int kind = 0; kind < N_KINDS; kind++) {
        if (kind == KIND_ALL_EQUAL) continue;
        fill(x, V, kind, &g);
        SamplingParams sp[] = { { 1.0, 0, 1.0 }, { 0.8, 0, 0.9 }, { 1.0, 50, 1.0 }, { 0.7, 1000, 0.95 }, { 0, 0, 1 } };
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            Rng r1, r2;
            rng_seed(&r1, 5 + i);
            r2 = r1;
            Sampled s1, s2;
            ref_pick(&s1, x, V, &sp[i], &r1, 20);
            sampler_pick(&s2, x, V, &sp[i], &r2, 20, scratch);
            cr_assert_eq(s2.id, s1.id, "%s, set %zu: id %d, reference %d", g_kind_names[kind], i, s2.id, s1.id);
            cr_assert(same_bits(s2.logp, s1.logp));
            cr_assert(!memcmp(r1.s, r2.s, sizeof r1.s));
            for (int t = 0; t < 20; t++)
                cr_assert_eq(s2.top_id[t], s1.top_id[t], "%s, set %zu: alternative %d", g_kind_names[kind], i, t);
        }
    }
    td_free(scratch);
    td_free(x);
}

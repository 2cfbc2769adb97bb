/* infer/sampler.c - next-token choice and log-probabilities (sampler.h).
 *
 * The candidates are ranked by logit, descending, ties to the lower id;
 * the probabilities, their sums and the draw are computed in that order,
 * so the ranking is part of the result.  It is found without comparison
 * sorts.  Each logit becomes a 32-bit key whose unsigned order is the
 * descending order of the logits (-0 and +0 are one key: they compare
 * equal, and either gives the same probability), and an entry is
 * key << 32 | id: entries in unsigned order are the ranking, ties to the
 * lower id.
 *   - The top k (top_k, the n_top alternatives): radix selection finds
 *     the k-th key (histograms of 11, 11 and 10 bits); the entries below it
 *     and the first ties at it are gathered and sorted.
 *   - A whole ranking (top_k = 0: the nucleus and the draw run over all
 *     V): an LSD radix sort on the key (3 passes of 11 bits) of the
 *     entries made in id order; it is stable, so ties keep ascending ids.
 * O(V) per token instead of qsort's O(V log V) comparisons through a
 * function pointer; tests/test_sampler.c checks the result bit for bit
 * against the qsort version it replaced (tests/sampler_ref.h), and
 * bench/sampler.c times both.  NaN logits have no order: not supported.
 */
#include "infer/sampler.h"
#include "core/ops/softmax.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Scratch: prob (V floats) and two arrays of V entries (the radix passes
 * go back and forth between them). */
size_t sampler_scratch_bytes(size_t V) { return V * (sizeof(float) + 2 * sizeof(uint64_t)) + 64; }

/* Unsigned order of the key = descending order of x. */
static inline uint32_t desc_key(float x)
{
    if (x == 0.0f) x = 0.0f;   /* -0 == +0 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? u : ~(u | 0x80000000u);
}

/* The logit of an entry (+0 for either zero). */
static inline float entry_logit(uint64_t e)
{
    uint32_t k = (uint32_t)(e >> 32);
    uint32_t u = (k & 0x80000000u) ? k : ~k & 0x7fffffffu;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline int32_t entry_id(uint64_t e) { return (int32_t)(uint32_t)e; }

#define RADIX_SIZE 2048u   /* 11-bit digits of the key: 3 passes */

/* Stable LSD radix sort of n entries by their key (the high 32 bits).
 * The entries start in *a; *a points at the sorted ones on return (the
 * original array or b). */
static void radix_sort(uint64_t **a, uint64_t *b, size_t n)
{
    static const int shift[3] = { 32, 43, 54 };
    size_t hist[3][RADIX_SIZE];
    uint64_t *x = *a, *y = b;
    memset(hist, 0, sizeof hist);
    for (size_t j = 0; j < n; j++) {
        uint64_t e = x[j];
        hist[0][(e >> 32) & (RADIX_SIZE - 1)]++;
        hist[1][(e >> 43) & (RADIX_SIZE - 1)]++;
        hist[2][e >> 54]++;
    }
    for (int p = 0; p < 3; p++) {
        size_t *h = hist[p], sum = 0;
        if (h[(x[0] >> shift[p]) & (RADIX_SIZE - 1)] == n) continue;   /* one digit for all: nothing moves */
        for (size_t d = 0; d < RADIX_SIZE; d++) {
            size_t c = h[d];
            h[d] = sum;
            sum += c;
        }
        for (size_t j = 0; j < n; j++) y[h[(x[j] >> shift[p]) & (RADIX_SIZE - 1)]++] = x[j];
        uint64_t *t = x;
        x = y;
        y = t;
    }
    *a = x;
}

/* The k-th smallest (1-based) key of the n entries: radix selection,
 * digit by digit from the top, narrowing to the keys that share the digits
 * found so far (copied into tmp, which n keys fit). */
static uint32_t kth_key(const uint64_t *e, size_t n, size_t k, uint32_t *tmp)
{
    size_t hist[RADIX_SIZE];
    memset(hist, 0, sizeof hist);
    for (size_t j = 0; j < n; j++) hist[e[j] >> 53]++;   /* key bits 21..31 */
    size_t d = 0, before = 0;
    while (before + hist[d] < k) before += hist[d++];
    uint32_t prefix = (uint32_t)d << 21;
    k -= before;
    size_t m = 0;
    for (size_t j = 0; j < n; j++)
        if ((uint32_t)(e[j] >> 53) == d) tmp[m++] = (uint32_t)(e[j] >> 32);
    static const int shift[2] = { 10, 0 }, bits[2] = { 11, 10 };
    for (int p = 0; p < 2; p++) {
        const uint32_t mask = (1u << bits[p]) - 1;
        memset(hist, 0, sizeof hist);
        for (size_t j = 0; j < m; j++) hist[(tmp[j] >> shift[p]) & mask]++;
        d = 0;
        before = 0;
        while (before + hist[d] < k) before += hist[d++];
        prefix |= (uint32_t)d << shift[p];
        k -= before;
        if (p == 1) break;
        size_t w = 0;   /* keep the keys that match so far (in place: w <= j) */
        for (size_t j = 0; j < m; j++)
            if (((tmp[j] >> shift[p]) & mask) == d) tmp[w++] = tmp[j];
        m = w;
    }
    return prefix;
}

/* The k best entries (1 <= k <= V) of e (V, in id order) in rank order
 * into out (k entries).  e is clobbered (it is the radix sort's second
 * buffer); tmp (V keys) is scratch.  Ties at the k-th key take the lower
 * ids, as the ranking does. */
static void top_k(uint64_t *out, size_t k, uint64_t *e, size_t V, uint32_t *tmp)
{
    uint32_t t = kth_key(e, V, k, tmp);
    size_t n = 0;
    for (size_t j = 0; j < V; j++)   /* below the k-th key: all in */
        if ((uint32_t)(e[j] >> 32) < t) out[n++] = e[j];
    for (size_t j = 0; j < V && n < k; j++)   /* at it: the lower ids first */
        if ((uint32_t)(e[j] >> 32) == t) out[n++] = e[j];
    if (k <= 32) {   /* entries are distinct: any sort gives the ranking */
        for (size_t a = 1; a < k; a++) {
            uint64_t x = out[a];
            size_t b = a;
            for (; b > 0 && out[b - 1] > x; b--) out[b] = out[b - 1];
            out[b] = x;
        }
        return;
    }
    uint64_t *s = out;
    radix_sort(&s, e, k);
    if (s != out) memcpy(out, s, k * sizeof *out);
}

static void make_entries(uint64_t *e, const float *logits, size_t V)
{
    for (size_t j = 0; j < V; j++) e[j] = (uint64_t)desc_key(logits[j]) << 32 | j;
}

void sampler_pick(Sampled *out, const float *logits, size_t V, const SamplingParams *p, Rng *rng,
                  int n_top, void *scratch)
{
    float *prob = scratch;
    uint64_t *ea = (uint64_t *)(((uintptr_t)(prob + V) + 7) & ~(uintptr_t)7), *eb = ea + V;
    if (n_top > SAMPLER_TOP_MAX) n_top = SAMPLER_TOP_MAX;
    if (n_top > 0 && (size_t)n_top > V) n_top = (int)V;
    int32_t id = 0;
    const uint64_t *rank = NULL;   /* rank[0..ranked): the best entries in order */
    size_t ranked = 0;
    if (p->temperature <= 0) {
        for (size_t j = 1; j < V; j++)
            if (logits[j] > logits[id]) id = (int32_t)j;
    } else {
        size_t n = p->top_k > 0 && (size_t)p->top_k < V ? (size_t)p->top_k : V;
        uint64_t *r = ea;
        make_entries(ea, logits, V);
        if (n < V) {
            top_k(eb, n, ea, V, (uint32_t *)prob);   /* prob is free until the top k are known */
            r = eb;
        } else {
            radix_sort(&r, eb, V);
        }
        rank = r;
        ranked = n;
        double m = entry_logit(r[0]), s = 0;
        for (size_t i = 0; i < n; i++) {
            prob[i] = (float)exp(((double)entry_logit(r[i]) - m) / p->temperature);
            s += prob[i];
        }
        if (p->top_p < 1.0) {   /* smallest prefix reaching top_p */
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
        id = entry_id(r[n - 1]);
        for (size_t i = 0; i < n; i++) {
            c += prob[i];
            if (u < c) {
                id = entry_id(r[i]);
                break;
            }
        }
    }
    out->id = id;
    float lse;
    logsoftmax_xent_forward(&out->logp, &lse, logits, &id, 1, V);
    out->n_top = 0;
    if (n_top > 0) {
        /* the n_top best by logit, ties to the lower id: the head of the
         * ranking when there is one, else a selection of their own */
        if ((size_t)n_top > ranked) {   /* greedy, or top_k below n_top: select them */
            make_entries(ea, logits, V);
            top_k(eb, (size_t)n_top, ea, V, (uint32_t *)prob);
            rank = eb;
        }
        for (int t = 0; t < n_top; t++) {
            int32_t b = entry_id(rank[t]);
            out->top_id[t] = b;
            out->top_logp[t] = logits[b] - lse;
        }
        out->n_top = n_top;
    }
}

/* tests/fixture.h - helpers shared by the Criterion tests: reading the
 * PyTorch fixtures (HDF5 files written by the tests/ref/fixtures_<name>.py
 * scripts with h5py) and comparing arrays with a stated tolerance, printing
 * the worst index.
 */
#ifndef TANDEM_TESTS_FIXTURE_H
#define TANDEM_TESTS_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "core/model/model.h"

/* Directory of the fixtures ($TANDEM_FIXTURES, default build/fixtures). */
const char *fixture_dir(void);
/* Path of a fixture file inside fixture_dir() (static buffer). */
const char *fixture_path(const char *file);

/* Reads dataset `name` of `file` (relative to fixture_dir) as float32 (any
 * stored float type is converted).  Returns a td_malloc'd array and its
 * element count in *n; aborts the test with a message when missing. */
float *fixture_f32(const char *file, const char *name, size_t *n);
int32_t *fixture_i32(const char *file, const char *name, size_t *n);
/* Scalar attribute of the root group (e.g. sizes written by the script). */
double fixture_attr(const char *file, const char *name);

/* Max over i of |a - b| / (atol + rtol |b|); <= 1 means within tolerance.
 * NaN or Inf in either array counts as a failure (returns +inf).  Writes the
 * worst index into *worst. */
double fixture_err(const float *a, const float *b, size_t n, double atol, double rtol, size_t *worst);

/* Criterion assertion: a (ours) against b (reference) within atol + rtol|b|,
 * printing the worst index and both values on failure. */
#define EXPECT_CLOSE(a, b, n, atol, rtol, what)                                      \
    do {                                                                             \
        size_t w_ = 0;                                                               \
        double e_ = fixture_err((a), (b), (n), (atol), (rtol), &w_);                 \
        cr_expect(e_ <= 1.0, "%s: worst index %zu: got %.9g, want %.9g (err %.3g of tol)", \
                  (what), w_, (double)(a)[w_], (double)(b)[w_], e_);                 \
    } while (0)

/* ---------------------------------------------------------------- helpers
 * Shared by the op tests (tests/test_<module>.c): deterministic inputs,
 * central finite differences in double, bitwise comparison. */

/* Dataset "c<c>/<name>" (case c of a fixture file, as the tests/ref
 * scripts write them); like fixture_f32 / fixture_i32.  n may be NULL. */
float *fixture_case_f32(const char *file, int c, const char *name, size_t *n);
int32_t *fixture_case_i32(const char *file, int c, const char *name, size_t *n);

/* x[i] uniform in [lo, hi) from (seed, i) (rng_uniform_at of core/rng.h),
 * so a test's inputs do not depend on the order it draws them in. */
void fixture_fill(float *x, size_t n, uint64_t seed, float lo, float hi);
/* td_malloc'd array of n floats filled by fixture_fill. */
float *fixture_rand(size_t n, uint64_t seed, float lo, float hi);
/* td_malloc'd copy of n floats. */
float *fixture_copy(const float *x, size_t n);
/* v rounded to bfloat16 and back (SPEC section 4: the upper 16 bits,
 * nearest even; finite v), written out here so that a test's reference
 * does not call core/dtype.h's conversion it checks. */
float fixture_bf16(float v);

/* m: a one-process training model of the config JSON with the weights of
 * model_init_weights(seed), not yet packed (a test changes them, then
 * calls model_pack).  A config that does not parse aborts with its error. */
void fixture_model(Model *m, const char *config_json, uint64_t seed);

/* The small GQA MoE model of the fused attention block's tests (vocab 64,
 * hidden 64, 2 layers, 8 heads on 4 kv heads, 4 experts of 32, top 2,
 * max_positions positions) with the config keys `keys` added (e.g.
 * "\"head_dim\": 16"): m its training model with model_init_weights(seed)
 * and its biases and norm weights moved off their initial 0 and 1 (so that
 * reading another head's slice of them shows), s its serving copy with
 * every matrix in w and the KV cache in kv.  Both model_free'd by the test. */
void fixture_gqa_serving(Model *m, Model *s, const char *keys, int max_positions, uint64_t seed, Dtype w, Dtype kv);

/* Scalar function of n doubles, for finite differences. */
typedef double (*FixtureLossFn)(const double *x, void *ctx);
/* Central differences in double: g[i] = (f(x + h e_i) - f(x - h e_i)) / 2h.
 * x is modified during the call and restored exactly. */
void fixture_fd(double *g, FixtureLossFn f, void *ctx, double *x, size_t n, double h);

/* First index where a and b differ bitwise or either is NaN/Inf; n when all
 * n elements are identical finite floats. */
size_t fixture_first_diff(const float *a, const float *b, size_t n);

/* Criterion assertion for the end of a test body: everything the test
 * td_malloc'd was td_free'd (needs core/common.h; each test runs in its own
 * process, so the count starts at 0).  Not in a suite's .fini: Criterion
 * only warns about failures there. */
#define EXPECT_NO_LEAKS()                                                            \
    cr_expect_eq(td_mem_current(), 0, "test leaked %zu bytes of td_malloc memory",  \
                 td_mem_current())

/* Criterion assertion: a and b bit-identical (and finite), printing the
 * first differing index and both values (decimal and hex-float). */
#define EXPECT_BITWISE(a, b, n, what)                                                \
    do {                                                                             \
        size_t n_ = (n);                                                             \
        size_t i_ = fixture_first_diff((a), (b), n_);                                \
        cr_expect(i_ == n_, "%s: not bit-identical at index %zu of %zu: %.9g (%a) vs %.9g (%a)", \
                  (what), i_, n_, i_ < n_ ? (double)(a)[i_] : 0.0,                   \
                  i_ < n_ ? (double)(a)[i_] : 0.0, i_ < n_ ? (double)(b)[i_] : 0.0,  \
                  i_ < n_ ? (double)(b)[i_] : 0.0);                                  \
    } while (0)

#endif

/* core/rng.h - random numbers.
 *
 * rng_hash: a counter-based generator (splitmix64 finaliser over a key and a
 * counter).  Weight initialisation draws element i of a tensor from
 * (seed, tensor name, i), so every rank of every topology produces exactly
 * the values of the global tensor it owns.
 *
 * Rng: a small stateful generator (xoshiro256**) for data order and
 * sampling; its state is four 64-bit words, saved in checkpoints.
 */
#ifndef TANDEM_CORE_RNG_H
#define TANDEM_CORE_RNG_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t rng_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* FNV-1a of a string, for keying tensors by name. */
uint64_t rng_hash_str(const char *s);
/* Uniform in (0, 1) from (key, counter). */
double rng_uniform_at(uint64_t key, uint64_t counter);
/* Standard normal from (key, i): Box-Muller on counters 2i and 2i+1. */
double rng_normal_at(uint64_t key, uint64_t i);

typedef struct { uint64_t s[4]; } Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_next(Rng *r);
/* Uniform double in [0, 1). */
double rng_double(Rng *r);
/* Uniform integer in [0, n), n >= 1 (unbiased). */
uint64_t rng_below(Rng *r, uint64_t n);

#endif

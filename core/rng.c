/* core/rng.c - counter-based and stateful random numbers (rng.h). */
#include "core/rng.h"

#include <math.h>

uint64_t rng_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

double rng_uniform_at(uint64_t key, uint64_t counter)
{
    uint64_t z = rng_mix64(key ^ rng_mix64(counter));
    return ((double)(z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double rng_normal_at(uint64_t key, uint64_t i)
{
    double u1 = rng_uniform_at(key, 2 * i), u2 = rng_uniform_at(key, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void rng_seed(Rng *r, uint64_t seed)
{
    uint64_t z = seed;
    for (int i = 0; i < 4; i++) {
        z += 0x9e3779b97f4a7c15ULL;
        r->s[i] = rng_mix64(z);
    }
}

uint64_t rng_next(Rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double rng_double(Rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t rng_below(Rng *r, uint64_t n)
{
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r); while (x >= lim);
    return x % n;
}

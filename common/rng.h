/*
 * common/rng.h — deterministic pseudo-random numbers (xoshiro256**, seeded by splitmix64).
 * A stream is a value type; derive independent streams per tensor with kl_rng_seed(seed, id).
 */
#ifndef KL_COMMON_RNG_H
#define KL_COMMON_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct kl_rng {
    uint64_t s[4];
} kl_rng;

static inline uint64_t kl_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Stream for (seed, stream_id): equal inputs give equal sequences on every machine. */
static inline void kl_rng_seed(kl_rng *r, uint64_t seed, uint64_t stream_id)
{
    uint64_t x = seed ^ (stream_id * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = kl_splitmix64(&x);
}

static inline uint64_t kl_rng_next(kl_rng *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, 1). */
static inline double kl_rng_uniform(kl_rng *r)
{
    return (double)(kl_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Two independent standard normal samples (Box-Muller). */
static inline void kl_rng_normal2(kl_rng *r, float *a, float *b)
{
    double u1 = kl_rng_uniform(r), u2 = kl_rng_uniform(r);
    double rad = sqrt(-2.0 * log(1.0 - u1));
    *a = (float)(rad * cos(6.283185307179586 * u2));
    *b = (float)(rad * sin(6.283185307179586 * u2));
}

#endif

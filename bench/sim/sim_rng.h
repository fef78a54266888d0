/* The simulator's own PRNG: xoshiro256** seeded by splitmix64, so that a
 * seed gives the same arrivals on every machine and libc (rand() and
 * random() differ between libcs). Distributions take draws from it only. */
#ifndef SIM_RNG_H
#define SIM_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} sim_rng_t;

static inline uint64_t sim_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline void sim_rng_seed(sim_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = sim_splitmix64(&seed);
}

static inline uint64_t sim_rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t sim_rng_next(sim_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = sim_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sim_rng_rotl(s[3], 45);
    return result;
}

/* Uniform in (0, 1): never 0, so log() is always finite. */
static inline double sim_rng_unit(sim_rng_t *r)
{
    return ((double)(sim_rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

/* Exponential with mean 1. */
static inline double sim_rng_exp(sim_rng_t *r)
{
    return -log(sim_rng_unit(r));
}

static inline double sim_rng_normal(sim_rng_t *r)
{
    double u = sim_rng_unit(r), v = sim_rng_unit(r);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Gamma(shape, scale 1/shape): mean 1, coefficient of variation
 * 1/sqrt(shape). Marsaglia and Tsang; shape < 1 by the boost
 * Gamma(a) = Gamma(a + 1) * U^(1/a). */
static inline double sim_rng_gamma_mean1(sim_rng_t *r, double shape)
{
    double boost = 1, a = shape;
    if (a < 1) {
        boost = pow(sim_rng_unit(r), 1 / a);
        a += 1;
    }
    double d = a - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x, v;
        do {
            x = sim_rng_normal(r);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = sim_rng_unit(r);
        if (u < 1 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1 - v + log(v)))
            return d * v * boost / shape;
    }
}

#endif

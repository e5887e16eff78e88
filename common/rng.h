/* rng: the project's one pseudo-random mixer, splitmix64 (written from its published
 * recurrence). Every seeded decision (batch plan permutations, anchors, synthetic slot contents,
 * random checkpoints, sampled prompts) derives from it, so results are the same on every run and
 * machine. Header-only, pure functions; thread-safe.
 */
#ifndef DFLASH_RNG_H
#define DFLASH_RNG_H

#include <math.h>
#include <stdint.h>

#define RNG_GOLDEN 0x9e3779b97f4a7c15ull

/* A well-mixed 64-bit hash of x: the splitmix64 output for state x. */
static inline uint64_t rng_hash64(uint64_t x)
{
    x += RNG_GOLDEN;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* h with the value v folded in: an order-sensitive 64-bit digest built one value at a time
 * (start from any constant, h = rng_hash64_fold(h, v) per value). The plan identity that the
 * broker journals (batch_plan_identity, shard_identity) is built with it: never change it. */
static inline uint64_t rng_hash64_fold(uint64_t h, uint64_t v)
{
    return rng_hash64(h ^ rng_hash64(v));
}

/* The next value of the stream *state (advances it): splitmix64. */
static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t r = rng_hash64(*state);
    *state += RNG_GOLDEN;
    return r;
}

/* Uniform in (0, 1): (k + 0.5) / 2^52 for 52 random bits k, every value exact, so never 0 or
 * 1. (With 53 bits the largest, 1 - 2^-54, rounded to 1.0: test_rng.) */
static inline double rng_uniform01(uint64_t *state)
{
    return ((double)(rng_next(state) >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

/* Two independent standard normals from the stream *state (Box-Muller on two draws of
 * rng_uniform01, which is never 0 or 1, so the logarithm is finite and negative). */
static inline void rng_normal_pair(uint64_t *state, double *z0, double *z1)
{
    double r = sqrt(-2.0 * log(rng_uniform01(state)));
    double t = 6.283185307179586 * rng_uniform01(state);
    *z0 = r * cos(t);
    *z1 = r * sin(t);
}

#endif

/* rng: the project's one pseudo-random mixer, splitmix64 (written from its published
 * recurrence). Every seeded decision (batch plan permutations, anchors, synthetic slot contents,
 * random checkpoints, sampled prompts) derives from it, so results are the same on every run and
 * machine. Header-only, pure functions; thread-safe.
 */
#ifndef DFLASH_RNG_H
#define DFLASH_RNG_H

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

/* The next value of the stream *state (advances it): splitmix64. */
static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t r = rng_hash64(*state);
    *state += RNG_GOLDEN;
    return r;
}

/* Uniform in (0, 1) with 53 random bits. */
static inline double rng_uniform01(uint64_t *state)
{
    return ((double)(rng_next(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

#endif

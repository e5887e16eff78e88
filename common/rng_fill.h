/* rng_fill: large arrays of rng.h draws on several threads, with the values of drawing them one
 * by one. splitmix64's state after k draws is the starting state plus k * RNG_GOLDEN, so each
 * thread jumps to the start of its slice; the values do not depend on the thread count, and the
 * stream is left where one-by-one drawing leaves it. Callers: the drafter's fresh weights
 * (dflash_model: 1 G values at Qwen3-8B's size took ~40 s on one thread) and the synthetic
 * training task's tables (dflash_task).
 */
#ifndef DFLASH_RNG_FILL_H
#define DFLASH_RNG_FILL_H

#include <stddef.h>
#include <stdint.h>

typedef enum rng_fill_kind {
    RNG_FILL_UNIFORM,      /* uniform in [-scale, scale): one draw per value, in pairs */
    RNG_FILL_NORMAL,       /* normal, sd scale: both values of each Box-Muller pair */
    RNG_FILL_NORMAL_FIRST, /* normal, sd scale: the first value of a pair per value */
} rng_fill_kind;

/* out[0 .. n) as the loop below would draw them from *state, which is then advanced past them:
 *   UNIFORM, NORMAL: for k in 0, 2, 4, ..: a, b = two uniforms (2 u - 1) or
 *     rng_normal_pair; out[k] = a * scale, out[k + 1] = b * scale (an odd n draws b unused);
 *   NORMAL_FIRST: for each k: a, unused = rng_normal_pair; out[k] = a * scale.
 * Each value is computed in double and rounded to float once. */
void rng_fill(uint64_t *state, float *out, size_t n, double scale, rng_fill_kind kind);

#endif

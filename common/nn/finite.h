/* finite: the check that weights read from a checkpoint are numbers. A NaN or an infinity in a
 * weight (an f16 conversion that overflowed, a diverged run's save) poisons every activation
 * downstream; the loaders refuse it by name instead (target_model.c as the target's tensors are
 * converted, dflash_ckpt.c as a drafter checkpoint's are). Pure, any thread.
 */
#ifndef DFLASH_NN_FINITE_H
#define DFLASH_NN_FINITE_H

#include <math.h>
#include <stddef.h>

/* The index of the first NaN or infinity among x[0, n), or n when every value is finite. */
static inline size_t finite_first_bad(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

#endif

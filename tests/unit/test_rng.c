/* test_rng: rng.h's draws. rng_uniform01 stays strictly inside (0, 1) at the extremes of its
 * bits, and rng_normal_pair gives finite standard normals: 2^24 pairs, every one finite, mean
 * and variance within 4 standard errors of 0 and 1, the share beyond 3 sd near 0.27%. (A
 * single-precision Box-Muller that took the logarithm of a uniform rounding above 1 put ~60
 * NaNs in each of bench-drafter's 622M-value tables on 2026-12-02; at 1e-7 a draw, 2^25 draws
 * would meet it about 3 times.) rng_fill, drawing on threads, gives the values and the stream
 * state of the one-by-one loops its header states, for each kind, at counts that are odd, even,
 * under one thread's slice and cut into uneven slices.
 */
#include "check.h"
#include "rng.h"
#include "rng_fill.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* rng_fill's stated loop, one value after the other */
static void fill_serial(uint64_t *st, float *out, size_t n, double scale, rng_fill_kind kind) {
    for (size_t k = 0; k < n; k += kind == RNG_FILL_NORMAL_FIRST ? 1 : 2) {
        double a, b;
        if (kind == RNG_FILL_UNIFORM)
            a = 2.0 * rng_uniform01(st) - 1.0, b = 2.0 * rng_uniform01(st) - 1.0;
        else
            rng_normal_pair(st, &a, &b);
        out[k] = (float)(a * scale);
        if (kind != RNG_FILL_NORMAL_FIRST && k + 1 < n) out[k + 1] = (float)(b * scale);
    }
}

static void check_fill(void) {
    const size_t sizes[] = {1, 2, 7, 1000, (1u << 20) + 1, 3u * (1u << 20) + 6, 5u << 21};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int kind = RNG_FILL_UNIFORM; kind <= RNG_FILL_NORMAL_FIRST; kind++) {
            size_t n = sizes[i];
            float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
            uint64_t sa = 99 + i, sb = 99 + i;
            double scale = kind == RNG_FILL_UNIFORM ? 1.0 : 0.02;
            rng_fill(&sa, a, n, scale, (rng_fill_kind)kind);
            fill_serial(&sb, b, n, scale, (rng_fill_kind)kind);
            size_t bad = 0;
            for (size_t k = 0; k < n; k++)
                bad += a[k] != b[k];
            if (bad) printf("rng_fill n %zu kind %d: %zu values differ\n", n, kind, bad);
            CHECK_EQ_INT((long)bad, 0);
            CHECK(sa == sb);
            free(a), free(b);
        }
}

/* rng_uniform01's value for a raw 64-bit output r (its formula applied to r) */
static double uniform_of(uint64_t r) {
    return ((double)(r >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

int main(void) {
    check_fill();
    /* the formula's extremes: the smallest and largest raw outputs */
    CHECK(uniform_of(0) > 0.0);
    CHECK(uniform_of(UINT64_MAX) < 1.0);
    CHECK(log(uniform_of(UINT64_MAX)) < 0.0);
    /* and the function applies it: same value from the same state */
    uint64_t a = 12345, b = 12345;
    CHECK(rng_uniform01(&a) == uniform_of(rng_next(&b)));

    uint64_t st = RNG_GOLDEN;
    const long n = 1L << 24;
    long bad = 0, tail = 0;
    double sum = 0, sum2 = 0;
    for (long i = 0; i < n; i++) {
        double z[2];
        rng_normal_pair(&st, &z[0], &z[1]);
        for (int k = 0; k < 2; k++) {
            if (!isfinite(z[k])) bad++;
            sum += z[k], sum2 += z[k] * z[k];
            tail += fabs(z[k]) > 3.0;
        }
    }
    const double m = 2.0 * (double)n, mean = sum / m, var = sum2 / m - mean * mean;
    printf("2^25 normals: %ld not finite, mean %.2e, variance %.6f, beyond 3 sd %.4f%%\n", bad,
           mean, var, 100.0 * (double)tail / m);
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(mean, 0.0, 4.0 / sqrt(m));
    CHECK_NEAR(var, 1.0, 4.0 * sqrt(2.0 / m));
    CHECK_NEAR((double)tail / m, 0.0026998, 4.0 * sqrt(0.0027 / m));
    CHECK_DONE();
}

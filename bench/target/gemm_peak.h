/* gemm_peak.h: the bf16 GEMM rate the benches report MFU against, measured in the same run
 * (header-only; bench-target and bench-drafter include it after ops.h and monotime.h).
 *
 * gemm_peak_tflops(ops, ctx): an 8192^3 linear_fwd on random data (uniform in [-0.5, 0.5)),
 * 3 warm-up calls, then the best of 3 timings of 10 calls between stream syncs; TFLOP/s.
 */
#ifndef DFLASH_BENCH_GEMM_PEAK_H
#define DFLASH_BENCH_GEMM_PEAK_H

#include <stdint.h>
#include <stdlib.h>

static double gemm_peak_tflops(const nn_ops *O, nn_ctx *C) {
    const int N = 8192;
    size_t n = (size_t)N * N;
    float *h = malloc(n * sizeof(float));
    if (!h) return 0.0;
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    void *x = O->alloc(C, n * O->act_bytes), *w = O->alloc(C, n * O->act_bytes);
    void *y = O->alloc(C, n * O->act_bytes);
    O->upload(C, x, h, n);
    O->upload(C, w, h, n);
    free(h);
    for (int i = 0; i < 3; i++)
        O->linear_fwd(C, y, x, w, NULL, N, N, N);
    O->sync(C);
    double best = 1e9;
    for (int b = 0; b < 3; b++) {
        double t0 = monotime_s();
        for (int i = 0; i < 10; i++)
            O->linear_fwd(C, y, x, w, NULL, N, N, N);
        O->sync(C);
        double t = (monotime_s() - t0) / 10;
        if (t < best) best = t;
    }
    O->free(C, x), O->free(C, w), O->free(C, y);
    return 2.0 * N * N * (double)N / best / 1e12;
}

#endif

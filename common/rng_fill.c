/* rng_fill: see rng_fill.h. Slices of at least a million values, one thread each (up to 32;
 * slice 0 on the caller's thread), every slice starting on a pair so no pair straddles two. */
#include "rng_fill.h"

#include "rng.h"

#include <pthread.h>
#include <unistd.h>

typedef struct fill_slice {
    uint64_t s0; /* the stream's state at value 0 */
    float *out;
    size_t lo, hi; /* values [lo, hi); lo even */
    double scale;
    rng_fill_kind kind;
} fill_slice;

static void *fill_run(void *arg) {
    const fill_slice *f = arg;
    if (f->kind == RNG_FILL_NORMAL_FIRST) { /* value k: draws 2k and 2k + 1 */
        uint64_t st = f->s0 + 2 * (uint64_t)f->lo * RNG_GOLDEN;
        for (size_t k = f->lo; k < f->hi; k++) {
            double a, unused;
            rng_normal_pair(&st, &a, &unused);
            f->out[k] = (float)(a * f->scale);
        }
        return NULL;
    }
    uint64_t st = f->s0 + (uint64_t)f->lo * RNG_GOLDEN; /* values k, k + 1: draws k, k + 1 */
    for (size_t k = f->lo; k < f->hi; k += 2) {
        double a, b;
        if (f->kind == RNG_FILL_NORMAL)
            rng_normal_pair(&st, &a, &b);
        else
            a = 2.0 * rng_uniform01(&st) - 1.0, b = 2.0 * rng_uniform01(&st) - 1.0;
        f->out[k] = (float)(a * f->scale);
        if (k + 1 < f->hi) f->out[k + 1] = (float)(b * f->scale);
    }
    return NULL;
}

enum { FILL_THREADS_MAX = 32, FILL_SLICE_MIN = 1 << 20 };

void rng_fill(uint64_t *state, float *out, size_t n, double scale, rng_fill_kind kind) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = cores < 1 ? 1 : (size_t)cores;
    if (nt > FILL_THREADS_MAX) nt = FILL_THREADS_MAX;
    if (nt > n / FILL_SLICE_MIN) nt = n / FILL_SLICE_MIN ? n / FILL_SLICE_MIN : 1;
    size_t per = ((n + nt - 1) / nt + 1) & ~(size_t)1; /* even, nt * per >= n */
    fill_slice f[FILL_THREADS_MAX];
    pthread_t th[FILL_THREADS_MAX];
    int started[FILL_THREADS_MAX] = {0};
    for (size_t i = 0; i < nt; i++) {
        size_t lo = i * per < n ? i * per : n, hi = lo + per < n ? lo + per : n;
        f[i] = (fill_slice){*state, out, lo, hi, scale, kind};
        /* slice 0 runs on this thread below; a thread that cannot start runs here */
        if (i > 0) started[i] = pthread_create(&th[i], NULL, fill_run, &f[i]) == 0;
        if (i > 0 && !started[i]) fill_run(&f[i]);
    }
    fill_run(&f[0]);
    for (size_t i = 1; i < nt; i++)
        if (started[i]) pthread_join(th[i], NULL);
    size_t draws = kind == RNG_FILL_NORMAL_FIRST ? 2 * n : (n + 1) & ~(size_t)1;
    *state += (uint64_t)draws * RNG_GOLDEN;
}

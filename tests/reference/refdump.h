/* refdump: reads the tensor dumps the PyTorch reference scripts write (refdump.py has the
 * format: magic "DFREFDMP", u32 version 1, u32 count, then named f32/i32 tensors) and compares
 * our outputs with them.
 *
 * Header-only, for the test programs in tests/reference/. Lookups of a missing tensor or one of
 * the wrong size print the name and exit(2): a broken dump is a failed test, never a pass.
 * Relative error of ours against the reference b: max|a - b| / max(max|b|, 1e-30); two equal
 * infinities count as equal, any other non-finite value makes the error infinite.
 */
#ifndef DFLASH_TEST_REFDUMP_H
#define DFLASH_TEST_REFDUMP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REFDUMP_MAGIC "DFREFDMP"
#define REFDUMP_VERSION 1u

enum { REFDUMP_F32 = 0, REFDUMP_I32 = 1 };

typedef struct refdump_tensor {
    char *name;
    uint32_t dtype, ndim;
    int64_t dims[8];
    size_t numel;
    void *data; /* 4-byte elements */
} refdump_tensor;

typedef struct refdump {
    uint32_t n;
    refdump_tensor *t;
} refdump;

static inline void refdump_free(refdump **dp) {
    if (!dp || !*dp) return;
    refdump *d = *dp;
    for (uint32_t i = 0; i < d->n; i++)
        free(d->t[i].name), free(d->t[i].data);
    free(d->t);
    free(d);
    *dp = NULL;
}

/* Loads a whole dump; NULL (with a message on stderr) if the file is missing or malformed. */
static inline refdump *refdump_load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "refdump: cannot open %s\n", path);
        return NULL;
    }
    char magic[8];
    uint32_t hdr[2];
    refdump *d = calloc(1, sizeof(*d));
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, REFDUMP_MAGIC, 8) != 0 ||
        fread(hdr, 4, 2, f) != 2 || hdr[0] != REFDUMP_VERSION || hdr[1] > 100000) {
        fprintf(stderr, "refdump: %s: bad magic or version\n", path);
        goto fail;
    }
    d->t = calloc(hdr[1] ? hdr[1] : 1, sizeof(refdump_tensor));
    for (uint32_t i = 0; i < hdr[1]; i++, d->n++) {
        refdump_tensor *t = &d->t[i];
        uint32_t len;
        if (fread(&len, 4, 1, f) != 1 || len == 0 || len > 4096) goto bad;
        t->name = calloc(len + 1, 1);
        uint32_t dn[2];
        if (fread(t->name, 1, len, f) != len || fread(dn, 4, 2, f) != 2) goto bad;
        t->dtype = dn[0], t->ndim = dn[1];
        if (t->dtype > REFDUMP_I32 || t->ndim > 8) goto bad;
        if (t->ndim && fread(t->dims, 8, t->ndim, f) != t->ndim) goto bad;
        t->numel = 1;
        for (uint32_t k = 0; k < t->ndim; k++) {
            if (t->dims[k] < 0 || t->dims[k] > (1ll << 32)) goto bad;
            t->numel *= (size_t)t->dims[k];
        }
        t->data = malloc(t->numel ? t->numel * 4 : 4);
        if (t->numel && fread(t->data, 4, t->numel, f) != t->numel) goto bad;
    }
    fclose(f);
    return d;
bad:
    fprintf(stderr, "refdump: %s: truncated or malformed tensor %u\n", path, d->n);
fail:
    fclose(f);
    if (d->t) d->n++; /* free the partly read entry too */
    refdump_free(&d);
    return NULL;
}

static inline const refdump_tensor *refdump_find(const refdump *d, const char *name) {
    for (uint32_t i = 0; i < d->n; i++)
        if (strcmp(d->t[i].name, name) == 0) return &d->t[i];
    return NULL;
}

static inline const void *refdump_get_(const refdump *d, const char *name, uint32_t dtype,
                                       size_t numel) {
    const refdump_tensor *t = refdump_find(d, name);
    if (!t || t->dtype != dtype || (numel && t->numel != numel)) {
        fprintf(stderr, "refdump: tensor %s %s\n", name,
                !t                  ? "missing"
                : t->dtype != dtype ? "has the wrong dtype"
                                    : "has the wrong size");
        exit(2);
    }
    return t->data;
}

/* The data of tensor `name`, which must exist with that dtype and (if numel > 0) size. */
static inline float *refdump_f32(const refdump *d, const char *name, size_t numel) {
    return (float *)refdump_get_(d, name, REFDUMP_F32, numel);
}
static inline int32_t *refdump_i32(const refdump *d, const char *name, size_t numel) {
    return (int32_t *)refdump_get_(d, name, REFDUMP_I32, numel);
}
/* dims[k] of tensor `name` (exit(2) if missing). */
static inline int refdump_dim(const refdump *d, const char *name, uint32_t k) {
    const refdump_tensor *t = refdump_find(d, name);
    if (!t || k >= t->ndim) {
        fprintf(stderr, "refdump: tensor %s missing or has no dim %u\n", name, k);
        exit(2);
    }
    return (int)t->dims[k];
}
static inline float refdump_scalar(const refdump *d, const char *name) {
    return refdump_f32(d, name, 1)[0];
}

static inline double refdump_rel_err(const float *a, const float *b, size_t n) {
    double diff = 0.0, bmax = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            if (a[i] == b[i]) continue; /* the same infinity */
            return INFINITY;
        }
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > diff) diff = e;
        if (fabs(b[i]) > bmax) bmax = fabs(b[i]);
    }
    return diff / (bmax > 1e-30 ? bmax : 1e-30);
}

/* Compares ours[n] with reference tensor `name`, prints one line; returns 1 on mismatch. */
static inline int refdump_check(const refdump *d, const char *name, const float *ours, size_t n,
                                double tol) {
    const float *ref = refdump_f32(d, name, n);
    double e = refdump_rel_err(ours, ref, n);
    printf("  %-32s n=%-8zu max rel err %.2e  %s\n", name, n, e, e <= tol ? "ok" : "MISMATCH");
    return e <= tol ? 0 : 1;
}

/* Compares ours[n] with reference tensor `name` element by element, each against its own size
 * (a table whose entries span orders of magnitude, like RoPE's frequencies: the largest one's
 * scale would hide a wrong small one); prints one line; returns 1 on mismatch. */
static inline int refdump_check_each(const refdump *d, const char *name, const float *ours,
                                     size_t n, double tol) {
    const float *ref = refdump_f32(d, name, n);
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        double r = refdump_rel_err(ours + i, ref + i, 1);
        if (!(r <= e)) e = r; /* NaN too */
    }
    printf("  %-32s n=%-8zu max rel err %.2e each  %s\n", name, n, e, e <= tol ? "ok" : "MISMATCH");
    return e <= tol ? 0 : 1;
}

/* Same for int32 tensors: exact equality; returns 1 on any difference. */
static inline int refdump_check_i32(const refdump *d, const char *name, const int32_t *ours,
                                    size_t n) {
    const int32_t *ref = refdump_i32(d, name, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += ours[i] != ref[i];
    printf("  %-32s n=%-8zu %zu differ  %s\n", name, n, bad, bad ? "MISMATCH" : "ok");
    return bad ? 1 : 0;
}

#endif

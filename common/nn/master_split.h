/* master_split: an fp32 master weight stored as two 16-bit halves, for backends whose weights are
 * bf16 (the cuda backend's matrices). The high half, rounded to nearest by the low one, is the
 * bf16 weight the ops read; the low half is the fp32 value's low 16 bits. Together they give
 * the fp32 master back bit for bit, so the optimizer keeps an exact fp32 master while storing 2
 * bytes per parameter beside the bf16 weight instead of 4 (and AdamW moves 26 bytes per matrix
 * element instead of 28).
 *
 * Rounding: to nearest, ties toward zero (the low half exactly 0x8000 keeps the high half),
 * where round-to-nearest-even would round up when the high half is odd: RNE cannot be decoded
 * from the two halves (both ties around an even high half give it). That changes the bf16
 * weight by one unit in the last place for one fp32 value in 2^17, and never the master. A NaN
 * stays a NaN (not bit for bit); an infinity, and a finite value that rounds to one, come back
 * exactly.
 *
 * Header-only so that the host (dflash_model.c: uploads, downloads, checkpoints) and the device
 * (ops_cuda_optim.cu: AdamW) split and join with the same code. */
#ifndef DFLASH_NN_MASTER_SPLIT_H
#define DFLASH_NN_MASTER_SPLIT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define NN_HOST_DEVICE __host__ __device__
#else
#define NN_HOST_DEVICE
#endif

/* The high half (bf16 bits) of fp32 bits u; the low half is (uint16_t)u. */
static inline NN_HOST_DEVICE uint16_t nn_master_hi(uint32_t u) {
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) /* NaN: quiet, any payload */
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u >> 16) + ((u & 0xffffu) > 0x8000u));
}

/* The fp32 bits the halves hi, lo came from. */
static inline NN_HOST_DEVICE uint32_t nn_master_join(uint16_t hi, uint16_t lo) {
    return ((uint32_t)(uint16_t)(hi - (lo > 0x8000u)) << 16) | lo;
}

/* Host loops over n values: fp32 src into the halves hi, lo; and the halves back into fp32 dst,
 * which may share its first bytes with lo (the loop runs backwards, so dst[j] overwrites only
 * halves already read: lo = (uint16_t *)dst stages a chunk's low halves in place). */
static inline void nn_master_split_n(const float *src, uint16_t *hi, uint16_t *lo, size_t n) {
    for (size_t j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, src + j, sizeof u);
        hi[j] = nn_master_hi(u), lo[j] = (uint16_t)u;
    }
}
static inline void nn_master_join_n(const uint16_t *hi, const uint16_t *lo, float *dst, size_t n) {
    for (size_t j = n; j-- > 0;) {
        uint32_t u = nn_master_join(hi[j], lo[j]);
        memcpy(dst + j, &u, sizeof u);
    }
}

#endif

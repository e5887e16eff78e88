/* attn_spans: device helpers shared by the two cuda attention implementations
 * (ops_cuda_attn.cu on CUDA cores, ops_cuda_attn_tc.cu on tensor cores). Header-only because
 * device functions are not linked across translation units in this build (no -rdc). */
#ifndef DFLASH_ATTN_SPANS_CUH
#define DFLASH_ATTN_SPANS_CUH

#include "ops.h"

#include <stdint.h>

/* The key ranges of one block span as up to two disjoint ascending [begin, end) pairs in r
 * (ops_cpu.c's block_key_ranges); returns how many (0 for a padding block). */
__device__ __forceinline__ int attn_span_ranges(const nn_block_span *sp, int B, int r[4])
{
    nn_block_span s = *sp;
    if (!s.keep) return 0;
    int c0 = s.ctx_begin, c1 = s.ctx_end, b0 = s.blk_begin, b1 = s.blk_begin + B;
    if (c1 <= c0) {
        r[0] = b0, r[1] = b1;
        return B > 0 ? 1 : 0;
    }
    if (B <= 0) {
        r[0] = c0, r[1] = c1;
        return 1;
    }
    if (c1 < b0 || b1 < c0) {
        if (c0 < b0) r[0] = c0, r[1] = c1, r[2] = b0, r[3] = b1;
        else r[0] = b0, r[1] = b1, r[2] = c0, r[3] = c1;
        return 2;
    }
    r[0] = c0 < b0 ? c0 : b0;
    r[1] = c1 > b1 ? c1 : b1;
    return 1;
}

/* Index of the last sequence s with seq_off[s] <= t (binary search; seq_off non-decreasing). */
__device__ __forceinline__ int attn_seq_of(const int32_t *seq_off, int n_seqs, int t)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seq_off[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

#endif

/* attn_spans: what the cuda attention files share (ops_cuda_attn.cu on CUDA cores,
 * ops_cuda_attn_mma.cu and ops_cuda_attn_bwd.cu on mma.sync tensor cores, the wgmma files):
 *   - device helpers: the key ranges of a block span, the sequence of a token, a CTA's query
 *     tokens and key ranges, a query row's key limits, cp.async tile loads (row-major, or the
 *     core-matrix layout of the wgmma kernels), bf16 packing, and
 *     D = rowsum(dO * O) of a row tile;
 *   - the DFLASH_CUDA_ATTN kernel choice (parsed once in ops_cuda_attn.cu) and the internal
 *     launchers of the mma.sync and wgmma files (ops_cuda.h belongs to the vtable and lists the
 *     others).
 * Header-only device code because device functions are not linked across translation units in
 * this build (no -rdc). */
#ifndef DFLASH_ATTN_SPANS_CUH
#define DFLASH_ATTN_SPANS_CUH

#include "cp_async.cuh"
#include "ops.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* DFLASH_CUDA_ATTN: unset, empty or "fused" (any unknown value too): the mma.sync forwards
 * (ops_cuda_attn_mma.cu; each after the wgmma kernel of ops_cuda_attn_wgmma.cu, which
 * DFLASH_CUDA_ATTN_CAUSAL and DFLASH_CUDA_ATTN_BLOCK select or turn off) and the fused block
 * backward of ops_cuda_attn_bwd.cu (the mma.sync pair where it does not apply); "mma": the mma.sync
 * kernels for all three ops (dq and dk/dv as two kernels, the default before the fused one);
 * "simple": CUDA cores only. (The WMMA kernels and their modes tc_wmma, tc_sync, tc_v1, tc_nod and
 * mma_dq left the tree after 7beb742, superseded by the mma.sync ones for the same shapes.) */
enum { ATTN_SIMPLE = 0, ATTN_MMA, ATTN_FUSED };
int cuda_attn_mode(void);

/* 16-byte alignment, which the tensor-core kernels' vector and tensor copies need of a buffer */
static inline bool attn_al16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

/* ops_cuda_attn_mma.cu; each returns 0 when it launched, -1 when the shape or alignment is not
 * one it handles (the caller falls back). causal: seq_off/n_seqs/T; else spans/n_blocks/B/Tk. */
int cuda_mma_attention_init(void);
int cuda_mma_attention_fwd(cudaStream_t st, __nv_bfloat16 *out, float *lse,
                           const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                           const __nv_bfloat16 *v, const int32_t *seq_off, int n_seqs, int T,
                           const nn_block_span *spans, int n_blocks, int B, int Tk, int H, int Hk,
                           int d);
/* dq of attention_block_bwd; D = rowsum(dO * O) per row into dsave[H, Q] when not NULL */
int cuda_mma_attention_dq(cudaStream_t st, __nv_bfloat16 *dq, float *dsave,
                          const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                          const __nv_bfloat16 *out, const float *lse, const nn_block_span *spans,
                          int n_blocks, int B, int Tk, int H, int Hk, int d);

/* dk and dv of attention_block_bwd from the D saved by cuda_mma_attention_dq (required); acc,
 * tickets, split_max, vps: the split scratch and schedule of ops_cuda_attn_split.cu (acc NULL: one
 * piece per key tile of 64). */
int cuda_mma_attention_dkdv(cudaStream_t st, __nv_bfloat16 *dk, __nv_bfloat16 *dv, float *acc,
                            int *tickets, int split_max, int vps, const float *dsave,
                            const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                            const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse,
                            const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                            int Hk, int d);

/* ops_cuda_attn_wgmma.cu (sm_90a): the causal forward on wgmma; returns -1 when the shape,
 * alignment, device or DFLASH_CUDA_ATTN_CAUSAL rule it out (the caller falls back). Its init
 * never fails: without a usable sm_90a image the kernel just stays unused. */
int cuda_wg_attention_init(void);
int cuda_wg_attention_causal_fwd(cudaStream_t st, __nv_bfloat16 *out, const __nv_bfloat16 *q,
                                 const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                 const int32_t *seq_off, int n_seqs, int T, int H, int Hk, int d);
/* the block forward on wgmma (d 128, B x group <= 64 rows, 3 B <= 64); -1 likewise, or when
 * DFLASH_CUDA_ATTN_BLOCK names another kernel. out, lse as cuda_mma_attention_fwd's. */
int cuda_wg_attention_block_fwd(cudaStream_t st, __nv_bfloat16 *out, float *lse,
                                const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const nn_block_span *spans, int n_blocks,
                                int B, int Tk, int H, int Hk, int d);

/* ops_cuda_attn_bwd.cu: the fused block backward (dq, dk, dv in one key-major pass; dq through
 * fp32 atomics into a per-device scratch). acc, tickets, split_max, vps as for
 * cuda_mma_attention_dkdv; dsave: [H, Q] fp32 scratch it fills with D = rowsum(dO * O). Returns
 * 0 when it queued the work, -1 when the shape, alignment or scratch is not one it handles.
 * init: kernel attributes, and the dq scratch (128 MiB) when the mode is ATTN_FUSED. */
int cuda_bwd_attention_init(void);
/* DFLASH_CUDA_ATTN_SPLIT=N (N >= 1) from the environment (ops_cuda_attn_split.cu), 0 when unset:
 * the fused backward then picks its own piece length (cuda_bwd_attention_block_bwd) */
int cuda_attn_split_env(void);
#define ATTN_SPLIT_MAX 32 /* the most pieces a key tile's dk, dv are split into */
/* The current device's SM count, asked of the driver once per device (ops_cuda_attn_bwd.cu);
 * 0 when the driver does not say */
int cuda_attn_sm_count(void);
/* grows the dq scratch to q_h_d fp32 (Q H d of the largest call); -1: no memory */
int cuda_bwd_attention_plan(size_t q_h_d);
int cuda_bwd_attention_block_bwd(cudaStream_t st, __nv_bfloat16 *dq, __nv_bfloat16 *dk,
                                 __nv_bfloat16 *dv, float *acc, int *tickets, int split_max,
                                 int vps, float *dsave, const __nv_bfloat16 *dout,
                                 const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                 const __nv_bfloat16 *v, const __nv_bfloat16 *out,
                                 const float *lse, const nn_block_span *spans, int n_blocks,
                                 int B, int Tk, int H, int Hk, int d);

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

/* Query tile `tile` of a launch: its tokens [t_a, t_a + R) and the union of their key ranges
 * (nr pairs in rng). causal (seq_off != NULL): RT consecutive tokens of [0, T); tokens outside
 * [seq_off[0], seq_off[n_seqs]) have no keys; the range starts at the first token's sequence.
 * block: tiles never straddle blocks (tiles_per_block tiles of RT tokens per block of B). */
__device__ __forceinline__ void attn_tile_keys(const int32_t *seq_off, int n_seqs, int T,
                                               const nn_block_span *spans, int B, int RT,
                                               int tiles_per_block, int tile, int &t_a, int &R,
                                               int &nr, int rng[4])
{
    nr = 0;
    if (seq_off) {
        t_a = tile * RT;
        R = min(RT, T - t_a);
        int lo = max(t_a, seq_off[0]), hi = min(t_a + R, seq_off[n_seqs]);
        if (lo < hi) {
            rng[0] = seq_off[attn_seq_of(seq_off, n_seqs, lo)];
            rng[1] = hi;
            nr = 1;
        }
    } else {
        int blk = tile / tiles_per_block, rt = tile % tiles_per_block;
        t_a = blk * B + rt * RT;
        R = min(RT, B - rt * RT);
        nr = attn_span_ranges(spans + blk, B, rng);
    }
}

/* Keys [kb, ke) that query token t may see before its tile's ranges are applied: causal
 * (seq_off != NULL) its sequence up to itself, nothing outside the sequences; block: all Tk. */
__device__ __forceinline__ void attn_row_keys(const int32_t *seq_off, int n_seqs, int Tk, int t,
                                              int &kb, int &ke)
{
    kb = 0, ke = 0;
    if (!seq_off)
        ke = Tk;
    else if (t >= seq_off[0] && t < seq_off[n_seqs])
        kb = seq_off[attn_seq_of(seq_off, n_seqs, t)], ke = t + 1;
}

/* ROWS rows of D bf16 into shared memory (stride D+8) in 16-byte pieces; row r comes from
 * src + off(r) or is zero when off(r) < 0. With async (cp.async, zero-filling padding rows) the
 * pieces are left in flight: the caller commits and waits before the barrier that publishes
 * the tile; without, plain loads and stores. */
template <int D, int ROWS = 64, typename F>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *dst, const __nv_bfloat16 *src, F off,
                                          int async)
{
    constexpr int LD = D + 8, VPR = D / 8;
    for (int idx = threadIdx.x; idx < ROWS * VPR; idx += blockDim.x) {
        int r = idx / VPR, c = idx % VPR;
        long long o = off(r);
        if (async) {
            cp_async16(dst + r * LD + c * 8, o >= 0 ? (const void *)(src + o + c * 8) : src,
                       o >= 0 ? 16 : 0);
        } else {
            uint4 val = make_uint4(0, 0, 0, 0);
            if (o >= 0) val = *(const uint4 *)(src + o + c * 8);
            *(uint4 *)(dst + r * LD + c * 8) = val;
        }
    }
}

/* cp.async of ROWS rows of D bf16 into a core-matrix tile: chunk i (16 bytes) of the tile is
 * column block (i / 8) % (D / 8) of row 8 (i / D) + i % 8, at byte 16 i; row r comes from
 * src + off(r), or is zero when off(r) < 0. Left in flight (the caller commits). */
template <int D, int ROWS, typename F>
__device__ __forceinline__ void load_cm(unsigned char *dst, const __nv_bfloat16 *src, F off,
                                        int tid, int nth)
{
    constexpr int CPR = D / 8;
    for (int i = tid; i < ROWS * CPR; i += nth) {
        int r = i / (8 * CPR) * 8 + i % 8, c = (i / 8) % CPR;
        long long o = off(r);
        cp_async16(dst + 16 * i, o >= 0 ? (const void *)(src + o + c * 8) : src, o >= 0 ? 16 : 0);
    }
}

/* load_cm of two tiles whose rows come from the same offsets (src0 + off(r) into dst0, src1 +
 * off(r) into dst1): off is evaluated once per row piece. */
template <int D, int ROWS, typename F>
__device__ __forceinline__ void load_cm2(unsigned char *dst0, const __nv_bfloat16 *src0,
                                         unsigned char *dst1, const __nv_bfloat16 *src1, F off,
                                         int tid, int nth)
{
    constexpr int CPR = D / 8;
    for (int i = tid; i < ROWS * CPR; i += nth) {
        int r = i / (8 * CPR) * 8 + i % 8, c = (i / 8) % CPR;
        long long o = off(r);
        const bool in = o >= 0;
        cp_async16(dst0 + 16 * i, in ? (const void *)(src0 + o + c * 8) : src0, in ? 16 : 0);
        cp_async16(dst1 + 16 * i, in ? (const void *)(src1 + o + c * 8) : src1, in ? 16 : 0);
    }
}

/* 4 bytes global -> shared through cp.async (.ca); src_bytes 0 zero-fills. */
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* D_r = rowsum(dO_r * O_r) for NROWS rows starting at r0 of a shared dO tile (stride D+8) and
 * O in global memory (orow(r) gives its row, NULL for a padding row), plus lse_r; lane 0 writes
 * Dr[r], Lr[r]. Loads of all rows are issued before the reductions. One warp. */
template <int D, int NROWS, typename F, typename G>
__device__ __forceinline__ void rows_D(const __nv_bfloat16 *dOs, int r0, F orow, G lse_of,
                                       float *Dr, float *Lr)
{
    constexpr int LD = D + 8, EPL = D / 32;
    const int lane = threadIdx.x % 32;
    float acc[NROWS];
#pragma unroll
    for (int i = 0; i < NROWS; i++) {
        const __nv_bfloat16 *o = orow(r0 + i);
        acc[i] = 0.0f;
        if (o) {
#pragma unroll
            for (int e = 0; e < EPL; e += 2) {
                float2 ov =
                    __bfloat1622float2(*(const __nv_bfloat162 *)(o + lane * EPL + e));
                float2 dv = __bfloat1622float2(
                    *(const __nv_bfloat162 *)(dOs + (r0 + i) * LD + lane * EPL + e));
                acc[i] += ov.x * dv.x + ov.y * dv.y;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NROWS; i++) {
        float v = acc[i];
        for (int off = 16; off > 0; off >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) Dr[r0 + i] = v, Lr[r0 + i] = lse_of(r0 + i);
    }
}

/* Whether block blk (spans[blk]) sees any key of [k0, k1). */
__device__ __forceinline__ bool attn_block_hits(const nn_block_span *spans, int blk, int B,
                                                int k0, int k1)
{
    int rg[4];
    int n = attn_span_ranges(spans + blk, B, rg);
    for (int r = 0; r < n; r++)
        if (rg[2 * r] < k1 && rg[2 * r + 1] > k0) return true;
    return false;
}

/* dk/dv work split (key-major kernels; one CTA per key tile [k0, k0 + kt) and piece blockIdx.z):
 * counts the blocks that see the tile (all threads; contains barriers), cuts them into nsplit
 * pieces of ~vps consecutive hitting blocks (1 piece without split or at most vps hits) and gives
 * this piece's hit indices [h_lo, h_hi). Returns false when the piece has nothing (uniform). */
__device__ __forceinline__ bool attn_split_piece(const nn_block_span *spans, int n_blocks, int B,
                                                 int k0, int kt, bool split, int split_max,
                                                 int vps, int &nsplit, int &h_lo, int &h_hi)
{
    __shared__ int s_nhit;
    if (threadIdx.x == 0) s_nhit = 0;
    __syncthreads();
    int cnt = 0;
    for (int blk = threadIdx.x; blk < n_blocks; blk += blockDim.x)
        cnt += attn_block_hits(spans, blk, B, k0, k0 + kt) ? 1 : 0;
    if (cnt) atomicAdd(&s_nhit, cnt);
    __syncthreads();
    const int n_hit = s_nhit, piece = blockIdx.z;
    nsplit = 1;
    if (split && n_hit > vps) nsplit = min(split_max, (n_hit + vps - 1) / vps);
    h_lo = (int)((long long)n_hit * piece / nsplit);
    h_hi = (int)((long long)n_hit * (piece + 1) / nsplit);
    return piece < nsplit;
}

/* The next block after blk that sees [k0, k1), counting hit_i; -1 when none is left below
 * h_hi. */
__device__ __forceinline__ int attn_next_hit(const nn_block_span *spans, int n_blocks, int B,
                                             int k0, int k1, int blk, int &hit_i, int h_hi)
{
    while (++blk < n_blocks && hit_i + 1 < h_hi)
        if (attn_block_hits(spans, blk, B, k0, k1)) {
            hit_i++;
            return blk;
        }
    return -1;
}

/* The block of hit index n (0-based) among the blocks that see [k0, k1), -1 if fewer: 32
 * blocks per step through a warp ballot. All lanes of the warp. */
__device__ __forceinline__ int attn_nth_hit(const nn_block_span *spans, int n_blocks, int B,
                                            int k0, int k1, int n)
{
    const int lane = threadIdx.x % 32;
    for (int b0 = 0; b0 < n_blocks; b0 += 32) {
        int blk = b0 + lane;
        unsigned m = __ballot_sync(0xffffffffu,
                                   blk < n_blocks && attn_block_hits(spans, blk, B, k0, k1));
        int c = __popc(m);
        if (n < c) {
            for (int i = 0; i < n; i++)
                m &= m - 1;
            return b0 + __ffs(m) - 1;
        }
        n -= c;
    }
    return -1;
}

/* End of a split piece, after its fp32 partials went into acc (dk at acc, dv at acc + plane):
 * the last piece of the tile (ticket counts the pieces) converts rows [k0, k0 + kt) to bf16 dk,
 * dv and zeroes acc and the ticket again. All threads of the CTA. */
template <int D>
__device__ __forceinline__ void attn_split_finish(float *acc, size_t plane, int *ticket,
                                                  int nsplit, int k0, int kt, int Tk, int Hk,
                                                  int hk, __nv_bfloat16 *dk, __nv_bfloat16 *dv)
{
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(ticket, 1) == nsplit - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    /* U float4 per thread in flight: one load at a time made the last piece wait U times as
     * long for L2 */
    constexpr int V4 = D / 4, U = 4;
    const int n = 2 * kt * V4;
    /* element idx: its float4 of acc (NULL past the end or Tk) and its bf16 offset */
    auto at = [&](int idx, size_t &off) {
        const int which = idx / (kt * V4), rem = idx % (kt * V4), key = k0 + rem / V4;
        off = ((size_t)key * Hk + hk) * D + (rem % V4) * 4;
        return idx < n && key < Tk ? (float4 *)(acc + which * plane + off) : (float4 *)NULL;
    };
    for (int i0 = threadIdx.x; i0 < n; i0 += U * blockDim.x) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            size_t off;
            const float4 *g = at(i0 + u * blockDim.x, off);
            if (g) v[u] = __ldcg(g);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            size_t off;
            float4 *g = at(i0 + u * blockDim.x, off);
            if (!g) continue;
            __stcg(g, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
            __nv_bfloat16 *dst = (i0 + u * blockDim.x >= kt * V4 ? dv : dk) + off;
            *(uint2 *)dst = make_uint2(pack_bf16x2(v[u].x, v[u].y), pack_bf16x2(v[u].z, v[u].w));
        }
    }
    if (threadIdx.x == 0) *ticket = 0;
}

#endif

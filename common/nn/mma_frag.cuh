/* mma_frag: warp-level building blocks of the attention kernels (ops_cuda_attn_mma.cu,
 * ops_cuda_attn_bwd.cu; ops_cuda_attn_wgmma.cu and ops_cuda_attn_wgbwd.cu use the PTX wrappers,
 * the quad reductions, the online softmax and the backward's visit helpers): PTX wrappers for
 * mma.sync.m16n8k16 (bf16 in, fp32 accumulate), ldmatrix(.trans), ex2, quad
 * reductions, and fragment helpers: zeroed accumulators, A fragments of a shared tile, products
 * against shared rows (X^T as B) or through ldmatrix.trans (P X), bf16 row stores staged through
 * shared memory, and the lane-pair swap that turns two C-layout halves into 4 consecutive
 * columns (float4 atomics); the online softmax of one key tile; the visit order and row loads of
 * the key-major backward kernels. Layouts: the m16n8k16 fragment layouts of the PTX ISA; a thread holds rows g = lane / 4 and g + 8, columns 2 (lane % 4) .. + 1 of each
 * C tile. Header-only device code (no -rdc in this build); every function runs on one warp.
 */
#ifndef DFLASH_MMA_FRAG_CUH
#define DFLASH_MMA_FRAG_CUH

#include "attn_spans.cuh"

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16; /* as in the .cu files that include this */

/* ---- PTX wrappers ---- */

/* c += a b: one m16n8k16 bf16 product, fp32 accumulators */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8 */
__device__ __forceinline__ void ldsm4(uint32_t r[4], const bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

__device__ __forceinline__ void ldsm4t(uint32_t r[4], const bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ---- fragment-level building blocks (one warp, 16 rows) ---- */

/* A fragments of the 16 x 16 block at (row r0, column c0) of a row-major bf16 tile (stride LD) */
template <int LD>
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16 *s, int r0, int c0) {
    const int lane = threadIdx.x % 32;
    ldsm4(a, s + (r0 + lane % 16) * LD + c0 + 8 * (lane / 16));
}

/* acc[m][n][.] += A_m (16 x 16 at k-step kk, m < MT m-tiles) times X^T for NT n-tiles of 8
 * rows of X (row-major, stride LD: X row n is column n of the B operand, so ldmatrix without
 * trans); each B fragment serves all MT m-tiles */
template <int MT, int NT, int LD>
__device__ __forceinline__ void mma_abt(float (*acc)[NT][4], const uint32_t (*a)[4], const bf16 *X,
                                        int kk) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm4(b, X + (np * 16 + lane % 8 + 8 * (lane / 16)) * LD + kk * 16 + 8 * ((lane / 8) % 2));
#pragma unroll
        for (int m = 0; m < MT; m++) {
            mma16816(acc[m][2 * np], a[m], b[0], b[1]);
            mma16816(acc[m][2 * np + 1], a[m], b[2], b[3]);
        }
    }
}

/* acc[m][D/8][.] += P_m X for MT m-tiles, P_m 16 x 16 NK in C layout (p[m][2 NK][4], fp32,
 * converted to bf16 A fragments here: the C layout of n-tiles 2 kk, 2 kk + 1 is the A layout of
 * k-step kk) and X the 16 NK rows of D (stride D + 8) it multiplies (ldmatrix.trans) */
template <int D, int NK, int MT>
__device__ __forceinline__ void mma_px(float (*acc)[D / 8][4], const float (*p)[2 * NK][4],
                                       const bf16 *X) {
    constexpr int LD = D + 8;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            a[m][0] = pack_bf16x2(p[m][2 * kk][0], p[m][2 * kk][1]);
            a[m][1] = pack_bf16x2(p[m][2 * kk][2], p[m][2 * kk][3]);
            a[m][2] = pack_bf16x2(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
            a[m][3] = pack_bf16x2(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            ldsm4t(b, X + (kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * LD + dp * 16 +
                          8 * (lane / 16));
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma16816(acc[m][2 * dp], a[m], b[0], b[1]);
                mma16816(acc[m][2 * dp + 1], a[m], b[2], b[3]);
            }
        }
    }
}

/* The warp's 16 rows rb .. rb + 15 (acc in C layout) times mul[row g, row g + 8] as bf16 to
 * global memory (dst(r) gives CTA row r's destination, NULL to skip), staged through those rows
 * of the shared tile St (stride D + 8, rows nobody else reads) for 16-byte stores. */
template <int D, typename F>
__device__ __forceinline__ void store_rows(const float acc[D / 8][4], const float mul[2], bf16 *St,
                                           int rb, F dst) {
    constexpr int LD = D + 8, VPR = D / 8;
    const int lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    bf16 *w = St + rb * LD;
    __syncwarp();
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        *(uint32_t *)(w + g * LD + dt * 8 + 2 * tg) =
            pack_bf16x2(acc[dt][0] * mul[0], acc[dt][1] * mul[0]);
        *(uint32_t *)(w + (g + 8) * LD + dt * 8 + 2 * tg) =
            pack_bf16x2(acc[dt][2] * mul[1], acc[dt][3] * mul[1]);
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * VPR; idx += 32) {
        int r = idx / VPR, c = idx % VPR;
        bf16 *d = dst(rb + r);
        if (d) *(uint4 *)(d + c * 8) = *(const uint4 *)(w + r * LD + c * 8);
    }
}

/* The 4 consecutive columns 2 tg' .. 2 tg' + 3 (tg' = tg & ~1) of row g (even tg) or g + 8
 * (odd tg) of a C fragment pair held by lanes tg, tg ^ 1. All lanes. */
__device__ __forceinline__ float4 swap_pairs(const float c[4], int odd) {
    float x = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
    float y = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
    return odd ? make_float4(x, y, c[2], c[3]) : make_float4(c[0], c[1], x, y);
}

/* End of a key-major CTA that owns keys [k0, k0 + kt) of kv head hk, warp w keys k0 + 16 w ..
 * + 15 (its dk, dv in C layout, fp32): one piece (nsplit 1): bf16 rows into gdk, gdv, staged
 * through Ks, Vs (no longer read: the caller waited for all cp.async and synchronised); split:
 * float4 atomics of the partials into acc (dk plane, then dv plane, Tk Hk D each), then the last
 * piece of the tile (ticket) converts (attn_split_finish). All threads of the CTA. */
/* Zeroes N accumulator fragments (e.g. a warp's dk or dv of D / 8 column blocks). */
template <int N> __device__ __forceinline__ void frag_zero(float (&acc)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[j][e] = 0.0f;
}

template <int D>
__device__ __forceinline__ void dkdv_tile_out(const float dk[D / 8][4], const float dv[D / 8][4],
                                              bf16 *Ks, bf16 *Vs, int nsplit, int k0, int kt,
                                              int Tk, int Hk, int hk, bf16 *gdk, bf16 *gdv,
                                              float *acc, int *ticket) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const float one[2] = {1.0f, 1.0f};
    auto key_row = [&](bf16 *base, int r) -> bf16 * {
        return k0 + r < Tk ? base + ((size_t)(k0 + r) * Hk + hk) * D : NULL;
    };
    if (nsplit == 1) {
        store_rows<D>(dk, one, Ks, warp * 16, [&](int r) { return key_row(gdk, r); });
        store_rows<D>(dv, one, Vs, warp * 16, [&](int r) { return key_row(gdv, r); });
        return;
    }
    const size_t plane = (size_t)Tk * Hk * D;
    /* float4 atomics: lanes tg, tg ^ 1 swap halves, even tg adds row g, odd tg row g + 8 */
    const int odd = tg & 1, key = k0 + warp * 16 + g + 8 * odd;
    float *pk = acc + ((size_t)key * Hk + hk) * D + 2 * (tg - odd);
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        float4 ak = swap_pairs(dk[dt], odd), av = swap_pairs(dv[dt], odd);
        if (key < Tk) {
            atomicAdd((float4 *)(pk + dt * 8), ak);
            atomicAdd((float4 *)(pk + plane + dt * 8), av);
        }
    }
    attn_split_finish<D>(acc, plane, ticket, nsplit, k0, kt, Tk, Hk, hk, gdk, gdv);
}

/* Online softmax of one tile of NKEYS keys from kb for the thread's rows g, g + 8 (s: raw Q K^T
 * in the accumulator layout of mma.sync, the same as wgmma's per warp): masks keys outside
 * [lo, hi) unless full, updates the running max m (log2 domain) and the partial sums l, leaves
 * P = exp2(s scale log2e - m) in s and in corr the factor the output rows must be rescaled by
 * (the caller's: the wgmma kernel while O may still be accumulating). */
template <int NKEYS>
__device__ __forceinline__ void online_softmax(float (&s)[NKEYS / 8][4], float m[2], float l[2],
                                           float corr[2], int kb, const int lo[2], const int hi[2],
                                           bool full, float sl2) {
    const int tg = threadIdx.x % 4;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NKEYS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = kb + n * 8 + 2 * tg + (e & 1), r = e / 2;
            if (!full && (key < lo[r] || key >= hi[r])) s[n][e] = -INFINITY;
            mx[r] = fmaxf(mx[r], s[n][e]);
        }
    float sub[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mn = fmaxf(m[r], quad_max(mx[r]) * sl2);
        corr[r] = mn == -INFINITY ? 1.0f : ex2(m[r] - mn);
        sub[r] = mn == -INFINITY ? 0.0f : mn;
        m[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < NKEYS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = ex2(fmaf(s[n][e], sl2, -sub[e / 2]));
            s[n][e] = p;
            sum[e / 2] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++)
        l[r] = l[r] * corr[r] + sum[r];
}

/* ---- visits of the key-major backward kernels (k_mma_dkdv, k_bwd_fused) ---- */

/* One visit: query rows [cb, cb + ROWS) of block blk (blk < 0: none); hit_i is the block's index
 * among those that see the CTA's key tile. */
typedef struct visit_item {
    int blk, cb, hit_i;
} visit_item;

/* The visit after it: the next chunk of ROWS rows of the block (B tokens x group heads), else
 * the first chunk of the next block that sees keys [k0, k0 + kt), within the piece's hits
 * [.., h_hi). */
template <int ROWS>
__device__ __forceinline__ visit_item visit_next(const nn_block_span *spans, int n_blocks, int B,
                                                 int group, visit_item it, int k0, int kt,
                                                 int h_hi) {
    if (it.blk >= 0 && it.cb + ROWS < B * group) {
        it.cb += ROWS;
        return it;
    }
    it.blk = attn_next_hit(spans, n_blocks, B, k0, k0 + kt, it.blk, it.hit_i, h_hi);
    it.cb = 0;
    return it;
}

/* cp.async of a visit's Q and dO rows (q, dout [Q, H, D]) into Qs, dOs (padding rows
 * zero-filled), row-major with stride D + 8; its saved D and lse (dsave, lse [H, Q]; lse times
 * log2 e) into Dr, Lr with plain loads (padding rows: 0 and +INF). Left in flight (the caller
 * commits). All threads of the CTA. (The wgmma kernel has its own: wgb_visit_load.) */
template <int D, int ROWS>
__device__ __forceinline__ void visit_issue(const bf16 *q, const bf16 *dout, const float *dsave,
                                            const float *lse, int n_blocks, int B, int H,
                                            int group, visit_item it, int hk, bf16 *Qs,
                                            bf16 *dOs, float *Dr, float *Lr) {
    const int Q = n_blocks * B, nrows = min(ROWS, B * group - it.cb);
    auto qoff = [&](int r) -> long long {
        if (r >= nrows) return -1;
        int qr = it.cb + r, t = it.blk * B + qr / group, h = hk * group + qr % group;
        return ((long long)t * H + h) * D;
    };
    load_tile<D, ROWS>(Qs, q, qoff, 1);
    load_tile<D, ROWS>(dOs, dout, qoff, 1);
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) {
        float Dv = 0.0f, L = INFINITY;
        if (r < nrows) {
            int qr = it.cb + r, t = it.blk * B + qr / group, h = hk * group + qr % group;
            Dv = dsave[(size_t)h * Q + t], L = lse[(size_t)h * Q + t] * 1.4426950408889634f;
        }
        Dr[r] = Dv, Lr[r] = L;
    }
}

#endif

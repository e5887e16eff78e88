/* ops_cuda_attn_tc: tensor-core (WMMA bf16 16x16x16, fp32 accumulate) attention kernels for
 * head dims 64 and 128. With DFLASH_CUDA_ATTN=tc_wmma (the default before the mma.sync kernels
 * of ops_cuda_attn_mma.cu) they run everything; otherwise the mma.sync kernels take the forwards,
 * and cuda_tc_attention_block_bwd (this file, which owns the split scratch and saved D) hands the
 * block backward to the fused kernel of ops_cuda_attn_bwd.cu (default), else to the mma.sync dq
 * and dk/dv, keeping the WMMA kernels for what those decline. ops_cuda_attn.cu falls back to its
 * CUDA-core kernels for other shapes, unaligned pointers, or DFLASH_CUDA_ATTN=simple.
 *
 * Rows: a CTA owns 64 query rows = RT tokens x the `group` query heads of kv head hk (as in
 * ops_cuda_attn.cu); a warp owns 16 of them. Keys stream through shared memory in tiles of 64.
 *   forward (causal or block): two passes over the keys. Pass 1: S = Q K^T (WMMA), per row the
 *     running max and sum give lse. Pass 2: S again, P = exp(S - lse) in bf16, O += P V with
 *     the accumulators in WMMA fragments (no rescaling of fragments is ever needed: P is final).
 *     Costs one extra Q K^T (3 products instead of 2) for never touching fragment layouts.
 *   dq (block): S = Q K^T, dP = dO V^T, dS = P (dP - D) scale in bf16, dQ += dS K.
 *   dk/dv (block, key-major): a CTA owns 64 keys of one kv head, 8 warps (16 keys x half the
 *     head dim each); for every block that sees any of its keys, per chunk of 64 query rows:
 *     S^T = K Q^T, dP^T = V dO^T, P^T and dS^T in bf16, dV += P^T dO, dK += dS^T Q. Keys
 *     nobody sees get 0. Work split (default): a context key tile is seen by hundreds of blocks
 *     while a block's own keys by one, so one CTA per tile left the SMs idle behind the few
 *     heaviest tiles. Now a tile seen by more than N query blocks (DFLASH_CUDA_ATTN_SPLIT, 40)
 *     is cut into up to 32 pieces (blockIdx.z) of ~N consecutive hitting blocks; pieces add
 *     fp32 partials into a per-device accumulator (float4 atomics) and the last piece to finish
 *     (a ticket per tile) writes bf16 and zeroes the accumulator again. Tiles under N keep one
 *     writer and no atomics. The sum order of the pieces varies: dk/dv are not bitwise
 *     reproducible run to run (fp32 sums, bf16 out). D = rowsum(dO * O) is saved per query row
 *     by the dq kernel ([H, Q] scratch of the same allocation) and read back by dk/dv instead
 *     of being recomputed (with a load of O) on every visit.
 *   DFLASH_CUDA_ATTN=tc_v1: the previous schedule (one CTA per key tile, D recomputed);
 *   =tc_nod: split without the saved D; both for bisecting.
 * Masks and the zero / +INF conventions are those of ops_cuda_attn.cu and ops_cpu.c.
 * Shared-memory row strides are padded (bf16 D+8, fp32 68) to spread banks; every WMMA pointer is
 * 32-byte aligned by construction. P (and P^T, dS^T) are written as bf16 over the first half of
 * the fp32 score rows they come from (read, barrier, write), which keeps 3 forward CTAs / 2 dk-dv
 * CTAs resident per SM. Tiles come in through cp.async (every 16-byte piece in flight at once,
 * padding rows zero-filled); DFLASH_CUDA_ATTN=tc_sync uses plain loads instead, =simple the
 * CUDA-core kernels of ops_cuda_attn.cu.
 */
#include "attn_spans.cuh"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define TQ 64 /* query rows per CTA */
#define TK 64 /* keys per tile */
#define SL 68 /* fp32 score row stride */
#define PL 72 /* bf16 probability row stride */

typedef struct tc_args {
    bf16 *out; /* out, or dq */
    float *lse;
    const bf16 *q, *k, *v, *dout, *o;
    const float *lse_in;
    bf16 *dk, *dv;
    const int32_t *seq_off;
    int n_seqs, causal;
    const nn_block_span *spans;
    int n_blocks, B, T, Tk, H, Hk, group, RT, tiles_per_block;
    int async_copy; /* 1: tiles via cp.async (all in flight at once); 0: plain loads */
    float scale;
    /* dk/dv work split (k_tc_dkdv): a key tile seen by more than `vps` query blocks is cut into
     * up to `split_max` pieces (blockIdx.z) whose fp32 partial sums meet in `acc` (dk at acc,
     * dv at acc + Tk*Hk*D, all zero between launches); the last piece of a tile (ticket) writes
     * bf16 and zeroes its part of acc again. acc NULL: no split (one CTA per key tile). */
    float *acc;
    int *tickets;
    /* D = rowsum(dO * O) per query row, [H, Q] like lse: written by k_tc_dq, read by k_tc_dkdv
     * (same stream, after it) instead of recomputing D on every key-tile visit; NULL: recompute */
    float *dsave;
    int split_max, vps;
} tc_args;

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_at;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Completes the cp.async pieces of load_tile(..., async) in flight (before the barrier that
 * publishes the tiles); nothing with plain loads. */
__device__ __forceinline__ void tile_wait(int async) {
    if (async) {
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
}

/* The CTA's tokens and key ranges (attn_tile_keys). */
__device__ __forceinline__ void tile_setup(const tc_args &a, int &t_a, int &R, int &nr,
                                           int rng[4]) {
    attn_tile_keys(a.causal ? a.seq_off : NULL, a.n_seqs, a.T, a.spans, a.B, a.RT,
                   a.tiles_per_block, blockIdx.x, t_a, R, nr, rng);
}

template <int D> static size_t fwd_smem(void) {
    return (size_t)3 * TQ * (D + 8) * 2 + (size_t)TQ * SL * 4 + 2 * TQ * 4;
}

template <int D> __global__ void __launch_bounds__(128) k_tc_fwd(tc_args a) {
    constexpr int LD = D + 8, NF = D / 16;
    extern __shared__ __align__(128) unsigned char sm_raw[];
    bf16 *Qs = (bf16 *)sm_raw, *Ks = Qs + TQ * LD, *Vs = Ks + TK * LD;
    float *S = (float *)(Vs + TK * LD);
    int *kbeg = (int *)(S + TQ * SL), *kend = kbeg + TQ;
    /* a warp's P rows (bf16, stride 2 SL) alias the first half of its own S rows: each lane
     * reads its S values into registers, __syncwarp, then writes P */
    bf16 *Pw = (bf16 *)(S + (threadIdx.x / 32) * 16 * SL);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hk = blockIdx.y;
    const int H = a.H, Hk = a.Hk, group = a.group;
    int t_a, R, nr, rng[4] = {0, 0, 0, 0};
    tile_setup(a, t_a, R, nr, rng);
    const int NR = R * group;
    for (int r = threadIdx.x; r < TQ; r += blockDim.x) {
        int kb = 0, ke = 0;
        if (r < NR)
            attn_row_keys(a.causal ? a.seq_off : NULL, a.n_seqs, a.Tk, t_a + r / group, kb, ke);
        kbeg[r] = kb, kend[r] = ke;
    }
    load_tile<D>(
        Qs, a.q,
        [&](int r) -> long long {
            if (r >= NR) return -1;
            int t = t_a + r / group, h = hk * group + r % group;
            return ((long long)t * H + h) * D;
        },
        a.async_copy);
    tile_wait(a.async_copy);

    const int row = warp * 16 + lane / 2, c0 = (lane % 2) * 32; /* this lane's softmax slice */
    float m = -INFINITY, l = 0.0f, lse = INFINITY;
    frag_c o[NF];
#pragma unroll
    for (int j = 0; j < NF; j++)
        wmma::fill_fragment(o[j], 0.0f);

    for (int pass = 0; pass < 2; pass++) {
        for (int ri = 0; ri < nr; ri++) {
            int r0 = rng[2 * ri], r1 = rng[2 * ri + 1];
            for (int kb = r0; kb < r1; kb += TK) {
                __syncthreads();
                auto koff = [&](int r) -> long long {
                    return kb + r < r1 ? ((long long)(kb + r) * Hk + hk) * D : -1;
                };
                load_tile<D>(Ks, a.k, koff, a.async_copy);
                if (pass == 1) load_tile<D>(Vs, a.v, koff, a.async_copy);
                tile_wait(a.async_copy);
                __syncthreads();
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    frag_c s;
                    wmma::fill_fragment(s, 0.0f);
#pragma unroll
                    for (int kk = 0; kk < NF; kk++) {
                        frag_a qa;
                        frag_bt kt;
                        wmma::load_matrix_sync(qa, Qs + warp * 16 * LD + kk * 16, LD);
                        wmma::load_matrix_sync(kt, Ks + n * 16 * LD + kk * 16, LD);
                        wmma::mma_sync(s, qa, kt, s);
                    }
                    wmma::store_matrix_sync(S + warp * 16 * SL + n * 16, s, SL,
                                            wmma::mem_row_major);
                }
                __syncwarp();
                float sv[32];
                {
                    const float4 *s4 = (const float4 *)(S + row * SL + c0);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        float4 f = s4[i];
                        sv[4 * i] = f.x, sv[4 * i + 1] = f.y, sv[4 * i + 2] = f.z,
                               sv[4 * i + 3] = f.w;
                    }
                }
                /* visible columns of this lane's slice: [vlo, vhi) */
                int base = kb + c0;
                int vlo = max(0, kbeg[row] - base), vhi = min(32, min(r1, kend[row]) - base);
                if (pass == 0) {
                    float tmax = -INFINITY;
#pragma unroll
                    for (int c = 0; c < 32; c++)
                        if (c >= vlo && c < vhi) tmax = fmaxf(tmax, sv[c] * a.scale);
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
                    float mn = fmaxf(m, tmax), part = 0.0f;
                    if (mn != -INFINITY) {
#pragma unroll
                        for (int c = 0; c < 32; c++)
                            if (c >= vlo && c < vhi) part += __expf(sv[c] * a.scale - mn);
                    }
                    part += __shfl_xor_sync(0xffffffffu, part, 1);
                    if (mn != -INFINITY) {
                        l = l * __expf(m - mn) + part;
                        m = mn;
                    }
                } else {
                    bool fin = isfinite(lse);
                    uint32_t pw[16];
#pragma unroll
                    for (int c = 0; c < 32; c += 2) {
                        float p0 =
                            fin && c >= vlo && c < vhi ? __expf(sv[c] * a.scale - lse) : 0.0f;
                        float p1 = fin && c + 1 >= vlo && c + 1 < vhi
                                       ? __expf(sv[c + 1] * a.scale - lse)
                                       : 0.0f;
                        pw[c / 2] = pack_bf16x2(p0, p1);
                    }
                    __syncwarp(); /* every lane of the warp has read its S values */
                    uint4 *prow = (uint4 *)(Pw + (lane / 2) * (2 * SL) + c0);
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        prow[i] =
                            make_uint4(pw[4 * i], pw[4 * i + 1], pw[4 * i + 2], pw[4 * i + 3]);
                    __syncwarp();
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        frag_a pa;
                        wmma::load_matrix_sync(pa, Pw + kk * 16, 2 * SL);
#pragma unroll
                        for (int j = 0; j < NF; j++) {
                            frag_b vb;
                            wmma::load_matrix_sync(vb, Vs + kk * 16 * LD + j * 16, LD);
                            wmma::mma_sync(o[j], pa, vb, o[j]);
                        }
                    }
                }
                __syncwarp();
            }
        }
        if (pass == 0) lse = l > 0.0f ? m + logf(l) : INFINITY;
    }
    /* O is already normalised (P used the final lse); stage each fragment through S */
    float *st = S + warp * 16 * SL;
#pragma unroll
    for (int j = 0; j < NF; j++) {
        __syncwarp();
        wmma::store_matrix_sync(st, o[j], SL, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            int rr = e / 16, cc = e % 16, r = warp * 16 + rr;
            if (r < NR) {
                int t = t_a + r / group, h = hk * group + r % group;
                a.out[((size_t)t * H + h) * D + j * 16 + cc] = __float2bfloat16(st[rr * SL + cc]);
            }
        }
    }
    if (!a.causal && a.lse && lane % 2 == 0 && row < NR) {
        int t = t_a + row / group, h = hk * group + row % group;
        a.lse[(size_t)h * a.n_blocks * a.B + t] = lse;
    }
}

template <int D> static size_t dq_smem(void) {
    return (size_t)4 * TQ * (D + 8) * 2 + (size_t)2 * TQ * SL * 4 + (size_t)TQ * PL * 2 +
           2 * TQ * 4;
}

template <int D> __global__ void __launch_bounds__(128) k_tc_dq(tc_args a) {
    constexpr int LD = D + 8, NF = D / 16;
    extern __shared__ __align__(128) unsigned char sm_raw[];
    bf16 *Qs = (bf16 *)sm_raw, *dOs = Qs + TQ * LD, *Ks = dOs + TQ * LD, *Vs = Ks + TK * LD;
    float *S = (float *)(Vs + TK * LD), *dP = S + TQ * SL;
    bf16 *dS = (bf16 *)(dP + TQ * SL);
    float *Dr = (float *)(dS + TQ * PL), *Lr = Dr + TQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hk = blockIdx.y;
    const int H = a.H, Hk = a.Hk, group = a.group, Q = a.n_blocks * a.B;
    int t_a, R, nr, rng[4] = {0, 0, 0, 0};
    tile_setup(a, t_a, R, nr, rng);
    const int NR = R * group;
    auto qoff = [&](int r) -> long long {
        if (r >= NR) return -1;
        int t = t_a + r / group, h = hk * group + r % group;
        return ((long long)t * H + h) * D;
    };
    load_tile<D>(Qs, a.q, qoff, a.async_copy);
    load_tile<D>(dOs, a.dout, qoff, a.async_copy);
    tile_wait(a.async_copy);
    __syncthreads();
    rows_D<D, 16>(
        dOs, warp * 16,
        [&](int r) -> const bf16 * {
            if (r >= NR) return NULL;
            int t = t_a + r / group, h = hk * group + r % group;
            return a.o + ((size_t)t * H + h) * D;
        },
        [&](int r) -> float {
            if (r >= NR) return INFINITY;
            int t = t_a + r / group, h = hk * group + r % group;
            return a.lse_in[(size_t)h * Q + t];
        },
        Dr, Lr);
    __syncwarp();
    if (a.dsave && lane < 16 && warp * 16 + lane < NR) {
        int r = warp * 16 + lane, t = t_a + r / group, h = hk * group + r % group;
        a.dsave[(size_t)h * Q + t] = Dr[r];
    }
    const int row = warp * 16 + lane / 2, c0 = (lane % 2) * 32;
    frag_c dq[NF];
#pragma unroll
    for (int j = 0; j < NF; j++)
        wmma::fill_fragment(dq[j], 0.0f);
    for (int ri = 0; ri < nr; ri++) {
        int r0 = rng[2 * ri], r1 = rng[2 * ri + 1];
        for (int kb = r0; kb < r1; kb += TK) {
            __syncthreads();
            auto koff = [&](int r) -> long long {
                return kb + r < r1 ? ((long long)(kb + r) * Hk + hk) * D : -1;
            };
            load_tile<D>(Ks, a.k, koff, a.async_copy);
            load_tile<D>(Vs, a.v, koff, a.async_copy);
            tile_wait(a.async_copy);
            __syncthreads();
#pragma unroll
            for (int n = 0; n < 4; n++) {
                frag_c s, dp;
                wmma::fill_fragment(s, 0.0f);
                wmma::fill_fragment(dp, 0.0f);
#pragma unroll
                for (int kk = 0; kk < NF; kk++) {
                    frag_a qa, da;
                    frag_bt kt, vt;
                    wmma::load_matrix_sync(qa, Qs + warp * 16 * LD + kk * 16, LD);
                    wmma::load_matrix_sync(da, dOs + warp * 16 * LD + kk * 16, LD);
                    wmma::load_matrix_sync(kt, Ks + n * 16 * LD + kk * 16, LD);
                    wmma::load_matrix_sync(vt, Vs + n * 16 * LD + kk * 16, LD);
                    wmma::mma_sync(s, qa, kt, s);
                    wmma::mma_sync(dp, da, vt, dp);
                }
                wmma::store_matrix_sync(S + warp * 16 * SL + n * 16, s, SL, wmma::mem_row_major);
                wmma::store_matrix_sync(dP + warp * 16 * SL + n * 16, dp, SL, wmma::mem_row_major);
            }
            __syncwarp();
            {
                float L = Lr[row], Dv = Dr[row];
                bool fin = row < NR && isfinite(L);
                for (int c = 0; c < 32; c++) {
                    int key = kb + c0 + c;
                    float p = 0.0f;
                    if (fin && key < r1) p = expf(S[row * SL + c0 + c] * a.scale - L);
                    dS[row * PL + c0 + c] =
                        __float2bfloat16(p * (dP[row * SL + c0 + c] - Dv) * a.scale);
                }
            }
            __syncwarp();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                frag_a sa;
                wmma::load_matrix_sync(sa, dS + warp * 16 * PL + kk * 16, PL);
#pragma unroll
                for (int j = 0; j < NF; j++) {
                    frag_b kbf;
                    wmma::load_matrix_sync(kbf, Ks + kk * 16 * LD + j * 16, LD);
                    wmma::mma_sync(dq[j], sa, kbf, dq[j]);
                }
            }
        }
    }
    float *st = S + warp * 16 * SL;
#pragma unroll
    for (int j = 0; j < NF; j++) {
        __syncwarp();
        wmma::store_matrix_sync(st, dq[j], SL, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            int rr = e / 16, cc = e % 16, r = warp * 16 + rr;
            if (r < NR) {
                int t = t_a + r / group, h = hk * group + r % group;
                a.out[((size_t)t * H + h) * D + j * 16 + cc] = __float2bfloat16(st[rr * SL + cc]);
            }
        }
    }
}

template <int D> static size_t kv_smem_tc(void) {
    return (size_t)4 * 64 * (D + 8) * 2 + (size_t)2 * 64 * SL * 4 + 2 * 64 * 4;
}

template <int D> __global__ void __launch_bounds__(256, 2) k_tc_dkdv(tc_args a) {
    constexpr int LD = D + 8, NFH = D / 32;
    extern __shared__ __align__(128) unsigned char sm_raw[];
    bf16 *Ks = (bf16 *)sm_raw, *Vs = Ks + 64 * LD, *Qs = Vs + 64 * LD, *dOs = Qs + 64 * LD;
    float *ST = (float *)(dOs + 64 * LD), *dPT = ST + 64 * SL;
    /* P^T and dS^T (bf16, stride 2 SL) alias S^T and dP^T: read into registers, barrier, write */
    bf16 *PT = (bf16 *)ST, *dST = (bf16 *)dPT;
    float *Dr = dPT + 64 * SL, *Lr = Dr + 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hk = blockIdx.y;
    const int H = a.H, Hk = a.Hk, group = a.group, B = a.B, Q = a.n_blocks * B;
    const int kt0 = blockIdx.x * TK, kg = warp % 4, dh = warp / 4;
    /* how many query blocks see this key tile, hence how many pieces it is cut into */
    int nsplit, h_lo, h_hi;
    if (!attn_split_piece(a.spans, a.n_blocks, B, kt0, TK, a.acc != NULL, a.split_max, a.vps,
                          nsplit, h_lo, h_hi))
        return; /* uniform over the CTA */
    auto kvoff = [&](int r) -> long long {
        return kt0 + r < a.Tk ? ((long long)(kt0 + r) * Hk + hk) * D : -1;
    };
    load_tile<D>(Ks, a.k, kvoff, a.async_copy);
    load_tile<D>(Vs, a.v, kvoff, a.async_copy);
    tile_wait(a.async_copy);
    frag_c dk[NFH], dv[NFH];
#pragma unroll
    for (int j = 0; j < NFH; j++)
        wmma::fill_fragment(dk[j], 0.0f), wmma::fill_fragment(dv[j], 0.0f);
    const int NRB = B * group;
    int hit_i = -1; /* index of the current block among all blocks that see this tile */
    for (int blk = -1;;) {
        blk = attn_next_hit(a.spans, a.n_blocks, B, kt0, kt0 + TK, blk, hit_i, h_hi);
        if (blk < 0) break;
        if (hit_i < h_lo) continue;
        int rng[4];
        int nr = attn_span_ranges(a.spans + blk, B, rng);
        for (int cb = 0; cb < NRB; cb += 64) {
            int nrows = min(64, NRB - cb);
            auto qoff = [&](int r) -> long long {
                if (r >= nrows) return -1;
                int qr = cb + r, t = blk * B + qr / group, h = hk * group + qr % group;
                return ((long long)t * H + h) * D;
            };
            __syncthreads();
            load_tile<D>(Qs, a.q, qoff, a.async_copy);
            load_tile<D>(dOs, a.dout, qoff, a.async_copy);
            if (a.dsave) {
                if (threadIdx.x < 64) {
                    int r = threadIdx.x;
                    float Dv = 0.0f, L = INFINITY;
                    if (r < nrows) {
                        int qr = cb + r, t = blk * B + qr / group, h = hk * group + qr % group;
                        Dv = a.dsave[(size_t)h * Q + t], L = a.lse_in[(size_t)h * Q + t];
                    }
                    Dr[r] = Dv, Lr[r] = L;
                }
                tile_wait(a.async_copy);
                __syncthreads();
            } else {
                tile_wait(a.async_copy);
                __syncthreads();
                rows_D<D, 8>(
                    dOs, warp * 8,
                    [&](int r) -> const bf16 * {
                        if (r >= nrows) return NULL;
                        int qr = cb + r, t = blk * B + qr / group, h = hk * group + qr % group;
                        return a.o + ((size_t)t * H + h) * D;
                    },
                    [&](int r) -> float {
                        if (r >= nrows) return INFINITY;
                        int qr = cb + r, t = blk * B + qr / group, h = hk * group + qr % group;
                        return a.lse_in[(size_t)h * Q + t];
                    },
                    Dr, Lr);
            }
            /* S^T = K Q^T and dP^T = V dO^T: warp (kg, dh) does key block kg, row blocks
             * 2 dh and 2 dh + 1 */
#pragma unroll
            for (int rb2 = 0; rb2 < 2; rb2++) {
                int rb = 2 * dh + rb2;
                frag_c s, dp;
                wmma::fill_fragment(s, 0.0f);
                wmma::fill_fragment(dp, 0.0f);
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    frag_a ka, va;
                    frag_bt qt, ot;
                    wmma::load_matrix_sync(ka, Ks + kg * 16 * LD + kk * 16, LD);
                    wmma::load_matrix_sync(va, Vs + kg * 16 * LD + kk * 16, LD);
                    wmma::load_matrix_sync(qt, Qs + rb * 16 * LD + kk * 16, LD);
                    wmma::load_matrix_sync(ot, dOs + rb * 16 * LD + kk * 16, LD);
                    wmma::mma_sync(s, ka, qt, s);
                    wmma::mma_sync(dp, va, ot, dp);
                }
                wmma::store_matrix_sync(ST + kg * 16 * SL + rb * 16, s, SL, wmma::mem_row_major);
                wmma::store_matrix_sync(dPT + kg * 16 * SL + rb * 16, dp, SL, wmma::mem_row_major);
            }
            __syncthreads();
            { /* P^T, dS^T: thread -> key tid / 4, rows (tid % 4) * 16 .. + 16 */
                int key = threadIdx.x / 4, rb0 = (threadIdx.x % 4) * 16, gk = kt0 + key;
                bool kvis = false;
                for (int r = 0; r < nr; r++)
                    if (gk >= rng[2 * r] && gk < rng[2 * r + 1]) kvis = true;
                kvis = kvis && gk < a.Tk;
                float sv[16], dpv[16];
                const float4 *s4 = (const float4 *)(ST + key * SL + rb0);
                const float4 *d4 = (const float4 *)(dPT + key * SL + rb0);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 f = s4[i], g = d4[i];
                    sv[4 * i] = f.x, sv[4 * i + 1] = f.y, sv[4 * i + 2] = f.z, sv[4 * i + 3] = f.w;
                    dpv[4 * i] = g.x, dpv[4 * i + 1] = g.y, dpv[4 * i + 2] = g.z,
                            dpv[4 * i + 3] = g.w;
                }
                uint32_t pw[8], sw[8];
#pragma unroll
                for (int c = 0; c < 16; c += 2) {
                    float p[2], ds[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        int r = rb0 + c + u;
                        float L = Lr[r];
                        p[u] = kvis && r < nrows && isfinite(L) ? __expf(sv[c + u] * a.scale - L)
                                                                : 0.0f;
                        ds[u] = p[u] * (dpv[c + u] - Dr[r]) * a.scale;
                    }
                    pw[c / 2] = pack_bf16x2(p[0], p[1]);
                    sw[c / 2] = pack_bf16x2(ds[0], ds[1]);
                }
                __syncthreads(); /* all of S^T and dP^T has been read */
                uint4 *pp = (uint4 *)(PT + key * (2 * SL) + rb0);
                uint4 *sp = (uint4 *)(dST + key * (2 * SL) + rb0);
                pp[0] = make_uint4(pw[0], pw[1], pw[2], pw[3]);
                pp[1] = make_uint4(pw[4], pw[5], pw[6], pw[7]);
                sp[0] = make_uint4(sw[0], sw[1], sw[2], sw[3]);
                sp[1] = make_uint4(sw[4], sw[5], sw[6], sw[7]);
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                frag_a pa, sa;
                wmma::load_matrix_sync(pa, PT + kg * 16 * (2 * SL) + kk * 16, 2 * SL);
                wmma::load_matrix_sync(sa, dST + kg * 16 * (2 * SL) + kk * 16, 2 * SL);
#pragma unroll
                for (int j = 0; j < NFH; j++) {
                    frag_b ob, qb;
                    int col = dh * (D / 2) + j * 16;
                    wmma::load_matrix_sync(ob, dOs + kk * 16 * LD + col, LD);
                    wmma::load_matrix_sync(qb, Qs + kk * 16 * LD + col, LD);
                    wmma::mma_sync(dv[j], pa, ob, dv[j]);
                    wmma::mma_sync(dk[j], sa, qb, dk[j]);
                }
            }
        }
    }
    __syncthreads();
    float *st = ST + warp * 256; /* 16 x 16 staging per warp */
    auto put = [&](const frag_c &f, bf16 *dst, int col) {
        __syncwarp();
        wmma::store_matrix_sync(st, f, 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            int rr = e / 16, cc = e % 16, key = kt0 + kg * 16 + rr;
            if (key < a.Tk) dst[((size_t)key * Hk + hk) * D + col + cc] = __float2bfloat16(st[e]);
        }
    };
    if (nsplit == 1) {
#pragma unroll
        for (int j = 0; j < NFH; j++) {
            put(dk[j], a.dk, dh * (D / 2) + j * 16);
            put(dv[j], a.dv, dh * (D / 2) + j * 16);
        }
        return;
    }
    /* split: add this piece's fp32 partials into acc; the last piece of the tile converts */
    const size_t plane = (size_t)a.Tk * Hk * D;
    auto add = [&](const frag_c &f, float *dst, int col) {
        __syncwarp();
        wmma::store_matrix_sync(st, f, 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 64; e += 32) {
            int rr = e / 4, cc = (e % 4) * 4, key = kt0 + kg * 16 + rr;
            if (key < a.Tk)
                atomicAdd((float4 *)(dst + ((size_t)key * Hk + hk) * D + col + cc),
                          *(const float4 *)(st + rr * 16 + cc));
        }
    };
#pragma unroll
    for (int j = 0; j < NFH; j++) {
        add(dk[j], a.acc, dh * (D / 2) + j * 16);
        add(dv[j], a.acc + plane, dh * (D / 2) + j * 16);
    }
    attn_split_finish<D>(a.acc, plane, a.tickets + (size_t)blockIdx.y * gridDim.x + blockIdx.x,
                         nsplit, kt0, TK, a.Tk, Hk, hk, a.dk, a.dv);
}

/* ------------------------------------------------------------------------------------------ */

/* The kernel choice (attn_spans.cuh); the mma.sync modes use this file's split schedule (scratch,
 * saved D) and its dk/dv as the fallback, i.e. the WMMA default. */
static int tc_mode(void) {
    int m = cuda_attn_mode();
    return m >= ATTN_MMA ? ATTN_TC : m;
}

/* Query blocks per dk/dv piece (the split of k_tc_dkdv and k_mma_dkdv): DFLASH_CUDA_ATTN_SPLIT=N
 * in the environment (N >= 1; tests use a small N so that their few blocks still get cut),
 * default 40 for the WMMA kernel and 80 for the mma.sync one (its visits are cheaper, so fewer
 * pieces and atomics pay: measured 5.35 against 5.72 ms for the whole block backward); the
 * wgmma backward's sorted pieces, 2 N blocks long, are shorter in a small call when N is not
 * given (ops_cuda_attn_bwd.cu's bwd_piece_len). */
int cuda_attn_split_env(void) {
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN_SPLIT");
        n = e && atoi(e) >= 1 ? atoi(e) : 0;
    }
    return n;
}

static int tc_vps(void) {
    int m = cuda_attn_mode(), n = cuda_attn_split_env();
    return n ? n : m == ATTN_MMA || m == ATTN_FUSED ? 80 : 40;
}

static bool al16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

static bool tc_usable(int H, int Hk, int d, const void *p1, const void *p2, const void *p3,
                      const void *p4, const void *p5) {
    if (!tc_mode() || (d != 64 && d != 128) || Hk <= 0 || H % Hk || H / Hk > TQ) return false;
    return al16(p1) && al16(p2) && al16(p3) && al16(p4) && al16(p5);
}

/* The dk/dv split's fp32 accumulator and tickets, one set per device, allocated (zeroed) by
 * cuda_tc_attention_init, i.e. in nn_cuda_new, grown by cuda_tc_attention_plan (the
 * attention_block_plan op, at a model's creation), never during a step, and kept for the life
 * of the process. Capacity at init SPLIT_ELEMS elements per tensor (Tk * Hk * d <= 16 Mi:
 * 128 MiB for dk + dv), SPLIT_DROWS rows of D and SPLIT_TICKETS key tiles x kv heads; a larger
 * call runs unsplit (one CTA per key tile, the tc_v1 schedule: several times slower). The kernels leave both zeroed, so calls need no memset; two streams must not
 * run attention_block_bwd on one device at the same time (one trainer per device does not). */
#define SPLIT_ELEMS (16u << 20)
#define SPLIT_TICKETS 65536
#define SPLIT_DEVICES 64
#define SPLIT_DROWS (4u << 20) /* H * Q rows of D (16 MiB) */
static float *g_split_acc[SPLIT_DEVICES], *g_split_d[SPLIT_DEVICES];
static int *g_split_tickets[SPLIT_DEVICES];
static size_t g_split_cap[SPLIT_DEVICES][3]; /* elements per tensor, D rows, tickets */

/* The split buffers with room for at least these sizes on the current device: larger ones
 * replace the old set (start-up only: it waits for the device); -1 (old set kept) when there is
 * no memory. */
static int split_alloc(size_t elems, size_t drows, size_t tickets) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= SPLIT_DEVICES) return -1;
    size_t *cap = g_split_cap[dev];
    if (g_split_acc[dev] && cap[0] >= elems && cap[1] >= drows && cap[2] >= tickets) return 0;
    if (elems < cap[0]) elems = cap[0];
    if (drows < cap[1]) drows = cap[1];
    if (tickets < cap[2]) tickets = cap[2];
    float *acc = NULL, *dd = NULL;
    int *tk = NULL;
    if (cudaMalloc((void **)&acc, 2 * elems * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&dd, drows * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&tk, tickets * sizeof(int)) != cudaSuccess ||
        cudaMemset(acc, 0, 2 * elems * sizeof(float)) != cudaSuccess ||
        cudaMemset(tk, 0, tickets * sizeof(int)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        if (acc) cudaFree(acc);
        if (dd) cudaFree(dd);
        if (tk) cudaFree(tk);
        (void)cudaGetLastError();
        return -1;
    }
    if (g_split_acc[dev]) {
        CUDA_CHECK(cudaFree(g_split_acc[dev]));
        CUDA_CHECK(cudaFree(g_split_d[dev]));
        CUDA_CHECK(cudaFree(g_split_tickets[dev]));
    }
    g_split_acc[dev] = acc, g_split_tickets[dev] = tk, g_split_d[dev] = dd;
    cap[0] = elems, cap[1] = drows, cap[2] = tickets;
    return 0;
}

int cuda_tc_attention_plan(int max_q, int max_tk, int H, int Hk, int d) {
    if (tc_mode() != ATTN_TC && tc_mode() != ATTN_TC_NOD) return 0;
    if (max_q < 1 || max_tk < 1) return 0;
    return split_alloc((size_t)max_tk * Hk * d, (size_t)H * max_q,
                       (size_t)((max_tk + TK - 1) / TK) * Hk);
}

int cuda_tc_attention_init(void) {
    int bad = 0;
    /* without the split buffers (no memory) block_bwd runs unsplit: not an error */
    if (tc_mode() == ATTN_TC || tc_mode() == ATTN_TC_NOD)
        (void)split_alloc(SPLIT_ELEMS, SPLIT_DROWS, SPLIT_TICKETS);
    bad |= cudaFuncSetAttribute(k_tc_fwd<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)fwd_smem<64>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_tc_fwd<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)fwd_smem<128>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_tc_dq<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)dq_smem<64>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_tc_dq<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)dq_smem<128>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_tc_dkdv<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)kv_smem_tc<64>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_tc_dkdv<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)kv_smem_tc<128>()) != cudaSuccess;
    return bad ? -1 : 0;
}

int cuda_tc_attention_causal_fwd(cudaStream_t st, bf16 *out, const bf16 *q, const bf16 *k,
                                 const bf16 *v, const int32_t *seq_off, int n_seqs, int T, int H,
                                 int Hk, int d) {
    if (!tc_usable(H, Hk, d, out, q, k, v, q) || n_seqs <= 0 || T <= 0) return -1;
    tc_args a = {};
    a.async_copy = tc_mode() >= ATTN_TC;
    a.out = out, a.q = q, a.k = k, a.v = v, a.seq_off = seq_off, a.n_seqs = n_seqs, a.causal = 1;
    a.T = T, a.Tk = T, a.H = H, a.Hk = Hk, a.group = H / Hk, a.RT = TQ / a.group;
    a.scale = 1.0f / sqrtf((float)d);
    dim3 grid((T + a.RT - 1) / a.RT, Hk);
    if (d == 64)
        k_tc_fwd<64><<<grid, 128, fwd_smem<64>(), st>>>(a);
    else
        k_tc_fwd<128><<<grid, 128, fwd_smem<128>(), st>>>(a);
    CUDA_CHECK_LAUNCH();
    return 0;
}

static tc_args tc_block_args(const nn_block_span *spans, int n_blocks, int B, int Tk, int H, int Hk,
                             int d) {
    tc_args a = {};
    a.async_copy = tc_mode() >= ATTN_TC;
    a.spans = spans, a.n_blocks = n_blocks, a.B = B, a.T = n_blocks * B, a.Tk = Tk;
    a.H = H, a.Hk = Hk, a.group = H / Hk;
    a.RT = TQ / a.group < B ? TQ / a.group : B;
    a.tiles_per_block = (B + a.RT - 1) / a.RT;
    a.scale = 1.0f / sqrtf((float)d);
    return a;
}

int cuda_tc_attention_block_fwd(cudaStream_t st, bf16 *out, float *lse, const bf16 *q,
                                const bf16 *k, const bf16 *v, const nn_block_span *spans,
                                int n_blocks, int B, int Tk, int H, int Hk, int d) {
    if (!tc_usable(H, Hk, d, out, q, k, v, q) || n_blocks <= 0 || B <= 0) return -1;
    tc_args a = tc_block_args(spans, n_blocks, B, Tk, H, Hk, d);
    a.out = out, a.lse = lse, a.q = q, a.k = k, a.v = v;
    dim3 grid(n_blocks * a.tiles_per_block, Hk);
    if (d == 64)
        k_tc_fwd<64><<<grid, 128, fwd_smem<64>(), st>>>(a);
    else
        k_tc_fwd<128><<<grid, 128, fwd_smem<128>(), st>>>(a);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int cuda_tc_attention_block_bwd(cudaStream_t st, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                                const float *lse, const nn_block_span *spans, int n_blocks, int B,
                                int Tk, int H, int Hk, int d) {
    if (!tc_usable(H, Hk, d, dq, q, k, v, dout) || !al16(dk) || !al16(dv) || !al16(out) ||
        n_blocks <= 0 || B <= 0 || Tk <= 0)
        return -1;
    tc_args a = tc_block_args(spans, n_blocks, B, Tk, H, Hk, d);
    a.out = dq, a.q = q, a.k = k, a.v = v, a.dout = dout, a.o = out, a.lse_in = lse;
    a.dk = dk, a.dv = dv;
    int n_kt = (Tk + TK - 1) / TK, dev = 0;
    a.split_max = 1, a.vps = tc_vps();
    if ((tc_mode() == ATTN_TC || tc_mode() == ATTN_TC_NOD) && cudaGetDevice(&dev) == cudaSuccess && dev >= 0 &&
        dev < SPLIT_DEVICES && g_split_acc[dev] && (size_t)Tk * Hk * d <= g_split_cap[dev][0] &&
        (size_t)n_kt * Hk <= g_split_cap[dev][2]) {
        a.acc = g_split_acc[dev], a.tickets = g_split_tickets[dev];
        a.split_max = (n_blocks + a.vps - 1) / a.vps;
        if (a.split_max > ATTN_SPLIT_MAX) a.split_max = ATTN_SPLIT_MAX;
        if (a.split_max < 1) a.split_max = 1;
        if (tc_mode() == ATTN_TC && (size_t)H * n_blocks * B <= g_split_cap[dev][1])
            a.dsave = g_split_d[dev];
    }
    dim3 gq(n_blocks * a.tiles_per_block, Hk), gk(n_kt, Hk, a.split_max);
    if (cuda_attn_mode() == ATTN_FUSED &&
        cuda_bwd_attention_block_bwd(st, dq, dk, dv, a.acc, a.tickets, a.split_max, a.vps, a.dsave,
                                     dout, q, k, v, out, lse, spans, n_blocks, B, Tk, H, Hk,
                                     d) == 0)
        return 0;
    bool mma_dq = cuda_attn_mode() >= ATTN_MMA &&
                  cuda_mma_attention_dq(st, dq, a.dsave, dout, q, k, v, out, lse, spans, n_blocks,
                                        B, Tk, H, Hk, d) == 0;
    if (mma_dq && (cuda_attn_mode() == ATTN_MMA || cuda_attn_mode() == ATTN_FUSED) &&
        cuda_mma_attention_dkdv(st, dk, dv, a.acc, a.tickets, a.split_max, a.vps, a.dsave, dout,
                                q, k, v, lse, spans, n_blocks, B, Tk, H, Hk, d) == 0)
        return 0;
    if (d == 64) {
        if (!mma_dq) k_tc_dq<64><<<gq, 128, dq_smem<64>(), st>>>(a);
        CUDA_CHECK_LAUNCH();
        k_tc_dkdv<64><<<gk, 256, kv_smem_tc<64>(), st>>>(a);
    } else {
        if (!mma_dq) k_tc_dq<128><<<gq, 128, dq_smem<128>(), st>>>(a);
        CUDA_CHECK_LAUNCH();
        k_tc_dkdv<128><<<gk, 256, kv_smem_tc<128>(), st>>>(a);
    }
    CUDA_CHECK_LAUNCH();
    return 0;
}

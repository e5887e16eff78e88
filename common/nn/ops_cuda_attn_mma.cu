/* ops_cuda_attn_mma: FA2-style attention kernels on mma.sync.m16n8k16 (bf16 in, fp32
 * accumulate) for head dims 64 and 128: the causal and block forwards (one kernel) and the block
 * backward (dq; dk/dv). ops_cuda_attn.cu calls these first (DFLASH_CUDA_ATTN unset: the
 * forwards, and the block backward where the fused one of ops_cuda_attn_bwd.cu does not apply;
 * "mma": all three) and falls back when they return -1 (other head dims,
 * buffers not 16-byte aligned, no sequence, no split scratch for dk/dv). On sm_90 the wgmma
 * forwards of ops_cuda_attn_wgmma.cu run before these where they apply (DFLASH_CUDA_ATTN_CAUSAL,
 * DFLASH_CUDA_ATTN_BLOCK select these instead).
 *
 * Rows: as in ops_cuda_attn.cu, a CTA owns TQ query rows = RT tokens x the `group` query heads
 * of kv head hk (row r: token t_a + r / group, head hk * group + r % group); every row of a CTA
 * shares one key set up to a per-row causal limit. A warp owns MT m16 tiles of 16 rows (MT 1 or
 * 2): each thread holds rows g = lane / 4 and g + 8 of each (the mma C layout) and all per-row
 * softmax state (m, l) lives in registers, reduced over the 4 lanes of a quad.
 * Keys stream through shared memory in tiles of KT = 64 (K and V, rows padded to D + 8 bf16, so
 * ldmatrix of 8 rows hits 8 distinct 16-byte bank groups), double buffered with cp.async: tile
 * i + 1 is in flight while tile i is computed. A tile starts at its range's begin (not aligned);
 * keys past the range end are zero-filled and masked.
 *   forward: with MT 1, Q's A fragments are loaded once (ldmatrix; Q is staged in the second
 *     K/V stage, so the CTA needs only the 2 x 2 tiles: 70 KB at d 128) and kept in registers;
 *     with MT 2 they are re-read from Q's own shared rows per tile (registers). Per tile
 *     S = Q K^T (K rows are the B operand as stored: ldmatrix), online softmax in the log2
 *     domain (running max m, per-thread partial sums l; O rescaled in registers when m grows),
 *     P = exp2(S - m) converted to bf16 A fragments in registers (the C layout of two n8 tiles
 *     is the A layout of one k16 step), O += P V (V through ldmatrix.trans). Tiles where every
 *     row of the warp sees every key skip the mask; tiles no row of the warp sees are skipped.
 *     End: O / l staged through shared memory for 16-byte stores; lse = (m + log2 l) ln 2
 *     (block mode); rows without keys: 0 and +INF. Causal CTAs run in reverse token order
 *     (longest rows first). CTA shapes (NW warps x MT m-tiles of 16 rows per warp): block
 *     forward 4 x 1 (a block of 16 tokens x 4 heads is one CTA; 168 registers, 3 CTAs per SM);
 *     causal 4 x 2 (128 rows sharing each K/V tile; MT 2: every K/V fragment serves two
 *     m-tiles, half the ldmatrix per mma, Q re-read from shared memory; 255 registers with a
 *     20-byte spill, 2 CTAs per SM). Others for comparison: DFLASH_CUDA_ATTN_CAUSAL=8x16 or
 *     4x16, DFLASH_CUDA_ATTN_BLOCK=2x32.
 *   dq: Q and dO A fragments in registers (242 registers at d 128; shared memory, 105 KB, limits
 *     it to 2 CTAs per SM anyway); D = rowsum(dO * O) and lse per row first (rows_D; D also saved to dsave for dk/dv).
 *     Per tile S = Q K^T, dP = dO V^T, P = exp2(S log2e scale - lse log2e),
 *     dS = P (dP - D) scale as bf16 A fragments, dq += dS K (K through ldmatrix.trans).
 *   dk/dv (key-major): a CTA owns KT keys (warp w: keys 16 w ..; the m16 rows of its products)
 *     and visits the blocks that see them, with the work split of ops_cuda_attn_split.cu (a tile
 *     seen by many blocks is cut into pieces whose fp32 partials meet in its scratch; the last
 *     piece converts; attn_split_* in attn_spans.cuh). Per visit of 64 query rows (two halves
 *     of 32 to bound registers): S^T = K Q^T, dP^T = V dO^T, P^T from the saved lse, dS^T with
 *     the saved D, dV += P^T dO, dK += dS^T Q, all from registers; the next visit's Q, dO, D,
 *     lse load (cp.async) during this one; a piece starts at its first hit through a warp
 *     ballot (attn_nth_hit); split partials go out as float4 atomics (lane pairs swap halves).
 *     248 registers at d 128 (2 CTAs per SM). Blocks per piece: 80 by default (split_vps).
 * Masks and the zero / +INF conventions are those of ops_cuda_attn.cu and ops_cpu.c. dk/dv of
 * split tiles are not bitwise reproducible run to run (fp32 atomics).
 */
#include "attn_spans.cuh"
#include "mma_frag.cuh"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define KT 64 /* keys per tile */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef struct mma_args {
    bf16 *out;  /* out, or dq */
    float *lse; /* block forward (may be NULL) */
    const bf16 *q, *k, *v, *dout, *o;
    const float *lse_in; /* dq */
    float *dsave;        /* dq: D per row [H, Q] (may be NULL) */
    const int32_t *seq_off; /* causal when not NULL */
    int n_seqs;
    const nn_block_span *spans;
    int n_blocks, B, T, Tk, H, Hk, group, RT, tiles_per_block;
    float scale;
    /* dk/dv: outputs and ops_cuda_attn_split.cu's scratch (acc NULL: one piece per key tile) */
    bf16 *dk, *dv;
    float *acc;
    int *tickets;
    int split_max, vps;
} mma_args;

/* The i-th key tile of a CTA's ranges: keys [kb, kb + KT) of the range ending at re. */
__device__ __forceinline__ void tile_of(const int rng[4], int nr, int i, int &kb, int &re) {
    int n0 = (rng[1] - rng[0] + KT - 1) / KT;
    if (i < n0 || nr < 2) kb = rng[0] + i * KT, re = rng[1];
    else kb = rng[2] + (i - n0) * KT, re = rng[3];
}

__device__ __forceinline__ int tiles_of(const int rng[4], int nr) {
    int n = 0;
    for (int r = 0; r < nr; r++)
        n += (rng[2 * r + 1] - rng[2 * r] + KT - 1) / KT;
    return n;
}

/* cp.async of key tile i (K and V rows of kv head hk) into buffer stage */
template <int D>
__device__ __forceinline__ void issue_kv(const mma_args &a, const int rng[4], int nr, int i,
                                         int hk, bf16 *Ks, bf16 *Vs) {
    int kb, re;
    tile_of(rng, nr, i, kb, re);
    auto off = [&](int r) -> long long {
        return kb + r < re ? ((long long)(kb + r) * a.Hk + hk) * D : -1;
    };
    load_tile<D, KT>(Ks, a.k, off, 1);
    load_tile<D, KT>(Vs, a.v, off, 1);
}

/* Global row of CTA query row r (tokens from t_a, heads of kv head hk), NULL past NR. */
__device__ __forceinline__ bf16 *query_row(const mma_args &a, bf16 *base, int r, int t_a, int NR,
                                           int hk, int D) {
    if (r >= NR) return NULL;
    int t = t_a + r / a.group, h = hk * a.group + r % a.group;
    return base + ((size_t)t * a.H + h) * D;
}

/* ---- forward (causal or block) ---- */

/* Online softmax of one m-tile's scores s (raw Q K^T, C layout) for key tile kb: masks keys
 * outside [lo, hi) of rows g, g + 8 unless full, updates the running max m (log2 domain) and
 * partial sums l, rescales o, and leaves P = exp2(s scale log2e - m) in s. */
template <int D>
__device__ __forceinline__ void softmax_tile(float (&s)[KT / 8][4], float m[2], float l[2],
                                             float o[D / 8][4], int kb, const int lo[2],
                                             const int hi[2], bool full, float sl2) {
    float corr[2];
    online_softmax<KT>(s, m, l, corr, kb, lo, hi, full, sl2);
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        o[dt][0] *= corr[0], o[dt][1] *= corr[0];
        o[dt][2] *= corr[1], o[dt][3] *= corr[1];
    }
}

/* K, V tile buffers: stage s holds K at kv + 2 s KT LD and V right after it; with MT == 2
 * Q has its own rows after them */
template <int D> static size_t fwd_smem(int mt, int nw) {
    return (size_t)(4 * KT + (mt == 2 ? 32 * nw : 0)) * (D + 8) * sizeof(bf16);
}

/* NW warps of MT m-tiles (16 MT rows) each. MT 1: Q fragments in registers, Q staged in stage 1;
 * 4 warps: 3 CTAs per SM (<= 168 registers, 70 KB), 8 warps: one. MT 2: each K/V fragment
 * serves 2 m-tiles (half the ldmatrix per mma), Q re-read from its own shared rows, 2 CTAs. */
template <int D, int NW, int MT>
__global__ void __launch_bounds__(NW * 32, MT == 2 ? 2 : NW == 4 ? 3 : 1) k_mma_fwd(mma_args a) {
    constexpr int LD = D + 8, RW = 16 * MT, TQ = RW * NW;
    static_assert(MT == 2 || TQ <= 2 * KT, "Q is staged in the second K/V stage");
    extern __shared__ __align__(128) unsigned char sm_raw[];
    bf16 *KV = (bf16 *)sm_raw, *Qs = KV + (MT == 1 ? 2 : 4) * KT * LD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int hk = blockIdx.y, group = a.group;
    const int tile = a.seq_off ? gridDim.x - 1 - blockIdx.x : blockIdx.x; /* long rows first */
    int t_a, R, nr, rng[4] = {0, 0, 0, 0};
    attn_tile_keys(a.seq_off, a.n_seqs, a.T, a.spans, a.B, a.RT, a.tiles_per_block, tile, t_a, R,
                   nr, rng);
    const int NR = R * group;
    int klo[MT][2], khi[MT][2]; /* keys of rows g, g + 8 of each m-tile of this warp */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = warp * RW + mt * 16 + g + 8 * i;
            klo[mt][i] = 0, khi[mt][i] = 0;
            if (r < NR)
                attn_row_keys(a.seq_off, a.n_seqs, a.Tk, t_a + r / group, klo[mt][i], khi[mt][i]);
        }
    load_tile<D, TQ>(
        Qs, a.q,
        [&](int r) -> long long {
            if (r >= NR) return -1;
            int t = t_a + r / group, h = hk * group + r % group;
            return ((long long)t * a.H + h) * D;
        },
        1);
    cp_commit();
    const int n_tiles = tiles_of(rng, nr);
    if (n_tiles > 0) issue_kv<D>(a, rng, nr, 0, hk, KV, KV + KT * LD);
    cp_commit();
    cp_wait_prev();
    __syncthreads();
    uint32_t qf[D / 16][4]; /* MT 1 only */
    if (MT == 1) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            frag_a<LD>(qf[kk], Qs, warp * 16, kk * 16);
        __syncthreads(); /* stage 1 is refilled next */
    }

    const float sl2 = a.scale * LOG2E;
    float m[MT][2], l[MT][2], o[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
    }

    for (int i = 0; i < n_tiles; i++) {
        const int st = i % 2;
        if (i + 1 < n_tiles) {
            bf16 *nk = KV + (1 - st) * 2 * KT * LD;
            issue_kv<D>(a, rng, nr, i + 1, hk, nk, nk + KT * LD);
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        int kb, re;
        tile_of(rng, nr, i, kb, re);
        int lo[MT][2], hi[MT][2];
        bool full = true, any = false;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                lo[mt][r] = klo[mt][r], hi[mt][r] = min(khi[mt][r], re);
                full = full && kb >= lo[mt][r] && kb + KT <= hi[mt][r];
                any = any || (lo[mt][r] < hi[mt][r] && kb < hi[mt][r] && kb + KT > lo[mt][r]);
            }
        full = __all_sync(0xffffffffu, full);
        if (__any_sync(0xffffffffu, any)) {
            const bf16 *Kt = KV + st * 2 * KT * LD, *Vt = Kt + KT * LD;
            float s[MT][KT / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < KT / 8; n++)
                    s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (MT == 1)
                        qa[mt][0] = qf[kk][0], qa[mt][1] = qf[kk][1], qa[mt][2] = qf[kk][2],
                        qa[mt][3] = qf[kk][3];
                    else
                        frag_a<LD>(qa[mt], Qs, warp * RW + mt * 16, kk * 16);
                }
                mma_abt<MT, KT / 8, LD>(s, qa, Kt, kk);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                softmax_tile<D>(s[mt], m[mt], l[mt], o[mt], kb, lo[mt], hi[mt], full, sl2);
            mma_px<D, KT / 16, MT>(o, s, Vt);
        }
        __syncthreads(); /* the stage is refilled by the next iteration */
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2], lse[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = quad_sum(l[mt][r]);
            inv[r] = lt > 0.0f ? 1.0f / lt : 0.0f;
            lse[r] = lt > 0.0f ? (m[mt][r] + log2f(lt)) * LN2 : INFINITY;
        }
        const int rb = warp * RW + mt * 16;
        store_rows<D>(o[mt], inv, Qs, rb,
                      [&](int r) { return query_row(a, a.out, r, t_a, NR, hk, D); });
        if (!a.seq_off && a.lse && tg == 0) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int row = rb + g + 8 * r;
                if (row >= NR) continue;
                int t = t_a + row / group, h = hk * group + row % group;
                a.lse[(size_t)h * a.n_blocks * a.B + t] = lse[r];
            }
        }
    }
}

/* ---- block backward: dq ---- */

#define DQ_WARPS 4

template <int D> static size_t dq_smem(void) {
    return (size_t)(2 * 16 * DQ_WARPS + 4 * KT) * (D + 8) * sizeof(bf16) +
           2 * 16 * DQ_WARPS * sizeof(float);
}

template <int D> __global__ void __launch_bounds__(DQ_WARPS * 32) k_mma_dq(mma_args a) {
    constexpr int LD = D + 8, TQ = 16 * DQ_WARPS;
    extern __shared__ __align__(128) unsigned char sm_raw[];
    bf16 *Qs = (bf16 *)sm_raw, *dOs = Qs + TQ * LD, *Ks = dOs + TQ * LD, *Vs = Ks + 2 * KT * LD;
    float *Dr = (float *)(Vs + 2 * KT * LD), *Lr = Dr + TQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int hk = blockIdx.y, group = a.group, Q = a.n_blocks * a.B;
    int t_a, R, nr, rng[4] = {0, 0, 0, 0};
    attn_tile_keys(NULL, 0, a.T, a.spans, a.B, a.RT, a.tiles_per_block, blockIdx.x, t_a, R, nr,
                   rng);
    const int NR = R * group;
    auto qoff = [&](int r) -> long long {
        if (r >= NR) return -1;
        int t = t_a + r / group, h = hk * group + r % group;
        return ((long long)t * a.H + h) * D;
    };
    load_tile<D, TQ>(Qs, a.q, qoff, 1);
    load_tile<D, TQ>(dOs, a.dout, qoff, 1);
    cp_commit();
    const int n_tiles = tiles_of(rng, nr);
    if (n_tiles > 0) issue_kv<D>(a, rng, nr, 0, hk, Ks, Vs);
    cp_commit();
    cp_wait_prev();
    __syncthreads();
    rows_D<D, 16>(
        dOs, warp * 16,
        [&](int r) -> const bf16 * {
            if (r >= NR) return NULL;
            int t = t_a + r / group, h = hk * group + r % group;
            return a.o + ((size_t)t * a.H + h) * D;
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
    float Dv[2], L2[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = warp * 16 + g + 8 * r;
        Dv[r] = Dr[row];
        L2[r] = Lr[row] * LOG2E; /* +INF (no keys, padding row): P = 0 */
    }
    uint32_t qf[D / 16][4], df[D / 16][4]; /* A fragments, kept (smem limits to 2 CTAs/SM) */
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        frag_a<LD>(qf[kk], Qs, warp * 16, kk * 16);
        frag_a<LD>(df[kk], dOs, warp * 16, kk * 16);
    }
    const float sl2 = a.scale * LOG2E;
    float dq[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
        dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

    for (int i = 0; i < n_tiles; i++) {
        const int st = i % 2;
        if (i + 1 < n_tiles)
            issue_kv<D>(a, rng, nr, i + 1, hk, Ks + (1 - st) * KT * LD, Vs + (1 - st) * KT * LD);
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        int kb, re;
        tile_of(rng, nr, i, kb, re);
        const bf16 *Kt = Ks + st * KT * LD, *Vt = Vs + st * KT * LD;
        float s[KT / 8][4], dp[KT / 8][4];
#pragma unroll
        for (int n = 0; n < KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[n][e] = 0.0f, dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            mma_abt<1, KT / 8, LD>(&s, &qf[kk], Kt, kk);
            mma_abt<1, KT / 8, LD>(&dp, &df[kk], Vt, kk);
        }
#pragma unroll
        for (int n = 0; n < KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kb + n * 8 + 2 * tg + (e & 1), r = e / 2;
                float p = key < re ? ex2(fmaf(s[n][e], sl2, -L2[r])) : 0.0f;
                s[n][e] = p * (dp[n][e] - Dv[r]) * a.scale; /* dS */
            }
        mma_px<D, KT / 16, 1>(&dq, &s, Kt);
        __syncthreads(); /* the stage is refilled by the next iteration */
    }
    const float one[2] = {1.0f, 1.0f};
    store_rows<D>(dq, one, Qs, warp * 16,
                  [&](int r) { return query_row(a, a.out, r, t_a, NR, hk, D); });
}

/* ---- block backward: dk, dv (key-major) ---- */

#define KV_WARPS 4 /* 16 keys each: KT keys per CTA */
#define KV_ROWS 64 /* query rows per visit chunk */

template <int D> static size_t kv_smem(void) {
    return (size_t)(2 * KT + 4 * KV_ROWS) * (D + 8) * sizeof(bf16) +
           4 * KV_ROWS * sizeof(float);
}

/* A CTA owns KT keys of kv head hk (warp w: keys 16 w .. 16 w + 15, the m16 rows of its
 * products) and piece blockIdx.z of the blocks that see them. Per visit (64 query rows, in two
 * halves of 32): S^T = K Q^T and dP^T = V dO^T (K, V A fragments from shared memory; Q, dO rows
 * as the B operand), P^T = exp2(S^T scale log2e - lse log2e) for keys the block sees,
 * dS^T = P^T (dP^T - D) scale, then dV += P^T dO and dK += dS^T Q from registers
 * (ldmatrix.trans of dO, Q). The next visit's Q, dO, D, lse load (cp.async) during this one.
 * End: one piece: bf16 rows; split: float2 atomics into acc, the last piece converts. */
template <int D> __global__ void __launch_bounds__(KV_WARPS * 32) k_mma_dkdv(mma_args a) {
    constexpr int LD = D + 8;
    extern __shared__ __align__(128) unsigned char sm_raw[];
    bf16 *Ks = (bf16 *)sm_raw, *Vs = Ks + KT * LD;
    bf16 *Qs = Vs + KT * LD, *dOs = Qs + 2 * KV_ROWS * LD; /* 2 stages each */
    float *Dr = (float *)(dOs + 2 * KV_ROWS * LD), *Lr = Dr + 2 * KV_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int hk = blockIdx.y, k0 = blockIdx.x * KT;
    int nsplit, h_lo, h_hi;
    if (!attn_split_piece(a.spans, a.n_blocks, a.B, k0, KT, a.acc != NULL, a.split_max, a.vps,
                          nsplit, h_lo, h_hi))
        return; /* uniform over the CTA */
    auto kvoff = [&](int r) -> long long {
        return k0 + r < a.Tk ? ((long long)(k0 + r) * a.Hk + hk) * D : -1;
    };
    load_tile<D, KT>(Ks, a.k, kvoff, 1);
    load_tile<D, KT>(Vs, a.v, kvoff, 1);
    visit_item it = {-1, 0, h_lo};
    if (h_lo < h_hi) it.blk = attn_nth_hit(a.spans, a.n_blocks, a.B, k0, k0 + KT, h_lo);
    if (it.blk >= 0)
        visit_issue<D, KV_ROWS>(a.q, a.dout, a.dsave, a.lse_in, a.n_blocks, a.B, a.H, a.group, it,
                                hk, Qs, dOs, Dr, Lr);
    cp_commit();

    const float sl2 = a.scale * LOG2E;
    float dk[D / 8][4], dv[D / 8][4];
    frag_zero(dk);
    frag_zero(dv);

    for (int i = 0; it.blk >= 0; i++) {
        const int st = i % 2;
        visit_item nx =
            visit_next<KV_ROWS>(a.spans, a.n_blocks, a.B, a.group, it, k0, KT, h_hi);
        if (nx.blk >= 0)
            visit_issue<D, KV_ROWS>(a.q, a.dout, a.dsave, a.lse_in, a.n_blocks, a.B, a.H,
                                    a.group, nx, hk, Qs + (1 - st) * KV_ROWS * LD,
                                    dOs + (1 - st) * KV_ROWS * LD, Dr + (1 - st) * KV_ROWS,
                                    Lr + (1 - st) * KV_ROWS);
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        bool kvis[2];
        {
            int rng[4];
            int nr = attn_span_ranges(a.spans + it.blk, a.B, rng);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int key = k0 + warp * 16 + g + 8 * r;
                kvis[r] = false;
                for (int j = 0; j < nr; j++)
                    kvis[r] = kvis[r] || (key >= rng[2 * j] && key < rng[2 * j + 1]);
                kvis[r] = kvis[r] && key < a.Tk;
            }
        }
        if (__any_sync(0xffffffffu, kvis[0] || kvis[1])) {
            const bf16 *Qt = Qs + st * KV_ROWS * LD, *dOt = dOs + st * KV_ROWS * LD;
            const float *Dt = Dr + st * KV_ROWS, *Lt = Lr + st * KV_ROWS;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int r0 = half * 32;
                if (r0 >= a.B * a.group - it.cb) break; /* padding rows only */
                float s[4][4], dp[4][4];
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[n][e] = 0.0f, dp[n][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    uint32_t ka[4], va[4];
                    frag_a<LD>(ka, Ks, warp * 16, kk * 16);
                    frag_a<LD>(va, Vs, warp * 16, kk * 16);
                    mma_abt<1, 4, LD>(&s, &ka, Qt + r0 * LD, kk);
                    mma_abt<1, 4, LD>(&dp, &va, dOt + r0 * LD, kk);
                }
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = r0 + n * 8 + 2 * tg + (e & 1);
                        float p = kvis[e / 2] ? ex2(fmaf(s[n][e], sl2, -Lt[row])) : 0.0f;
                        s[n][e] = p;
                        dp[n][e] = p * (dp[n][e] - Dt[row]) * a.scale; /* dS^T */
                    }
                mma_px<D, 2, 1>(&dv, &s, dOt + r0 * LD);
                mma_px<D, 2, 1>(&dk, &dp, Qt + r0 * LD);
            }
        }
        __syncthreads(); /* the stage is refilled by the next iteration */
        it = nx;
    }
    cp_wait_all(); /* K, V of a CTA without visits may still be landing: staging reuses them */
    __syncthreads();
    dkdv_tile_out<D>(dk, dv, Ks, Vs, nsplit, k0, KT, a.Tk, a.Hk, hk, a.dk, a.dv, a.acc,
                     a.tickets + (size_t)blockIdx.y * gridDim.x + blockIdx.x);
}

/* ------------------------------------------------------------------------------------------ */

/* Shape of the forward's CTAs, warps x rows per warp, as NW * 16 + MT (MT: m-tiles per warp):
 * causal DFLASH_CUDA_ATTN_CAUSAL = 4x32 (default; the wgmma kernel of ops_cuda_attn_wgmma.cu
 * runs before it unless the variable names one of these), 8x16 or 4x16; block
 * DFLASH_CUDA_ATTN_BLOCK = 4x16 (default; the wgmma block kernel runs before it unless the
 * variable names one of these or "mma") or 2x32. Measured on the H200 (bench/cuda_ops/NOTES.md):
 * causal 4x32 1.53 ms, 8x16 1.63, 4x16 1.71; block 4x16 1.20 ms, 2x32 1.99. */
static int parse_shape(const char *var, int dflt) {
    const char *e = getenv(var);
    if (!e) return dflt;
    if (strcmp(e, "8x16") == 0) return 8 * 16 + 1;
    if (strcmp(e, "4x16") == 0) return 4 * 16 + 1;
    if (strcmp(e, "4x32") == 0) return 4 * 16 + 2;
    if (strcmp(e, "2x32") == 0) return 2 * 16 + 2;
    return dflt;
}

static int fwd_shape(bool causal) {
    static int shape[2] = {-1, -1};
    if (shape[causal] < 0)
        shape[causal] = causal ? parse_shape("DFLASH_CUDA_ATTN_CAUSAL", 4 * 16 + 2)
                               : parse_shape("DFLASH_CUDA_ATTN_BLOCK", 4 * 16 + 1);
    return shape[causal];
}

/* The forward kernel <D, NW, MT>: its shared-memory limit (init) or a launch */
template <int D, int NW, int MT> static int fwd_attr(void) {
    return cudaFuncSetAttribute(k_mma_fwd<D, NW, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)fwd_smem<D>(MT, NW)) != cudaSuccess;
}

template <int D, int NW, int MT>
static void fwd_launch(cudaStream_t st, dim3 grid, const mma_args &a) {
    k_mma_fwd<D, NW, MT><<<grid, NW * 32, fwd_smem<D>(MT, NW), st>>>(a);
}

template <int D> static void fwd_launch(cudaStream_t st, dim3 grid, const mma_args &a, int shape) {
    if (shape == 4 * 16 + 1) fwd_launch<D, 4, 1>(st, grid, a);
    else if (shape == 4 * 16 + 2) fwd_launch<D, 4, 2>(st, grid, a);
    else if (shape == 2 * 16 + 2) fwd_launch<D, 2, 2>(st, grid, a);
    else fwd_launch<D, 8, 1>(st, grid, a);
}

static bool mma_usable(int H, int Hk, int d, int rows) {
    return (d == 64 || d == 128) && Hk > 0 && H % Hk == 0 && H / Hk <= rows;
}

int cuda_mma_attention_init(void) {
    int bad = 0;
    bad |= fwd_attr<64, 4, 1>() | fwd_attr<64, 8, 1>() | fwd_attr<64, 4, 2>() |
           fwd_attr<64, 2, 2>();
    bad |= fwd_attr<128, 4, 1>() | fwd_attr<128, 8, 1>() | fwd_attr<128, 4, 2>() |
           fwd_attr<128, 2, 2>();
    bad |= cudaFuncSetAttribute(k_mma_dq<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)dq_smem<64>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_mma_dq<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)dq_smem<128>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_mma_dkdv<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)kv_smem<64>()) != cudaSuccess;
    bad |= cudaFuncSetAttribute(k_mma_dkdv<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)kv_smem<128>()) != cudaSuccess;
    return bad ? -1 : 0;
}

/* Row tiling of a block launch: RT tokens of one block per CTA of `rows` rows. */
static void block_tiling(mma_args &a, const nn_block_span *spans, int n_blocks, int B, int Tk,
                         int H, int Hk, int d, int rows) {
    a.spans = spans, a.n_blocks = n_blocks, a.B = B, a.T = n_blocks * B, a.Tk = Tk;
    a.H = H, a.Hk = Hk, a.group = H / Hk;
    a.RT = rows / a.group < B ? rows / a.group : B;
    a.tiles_per_block = (B + a.RT - 1) / a.RT;
    a.scale = 1.0f / sqrtf((float)d);
}

int cuda_mma_attention_fwd(cudaStream_t st, bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                           const bf16 *v, const int32_t *seq_off, int n_seqs, int T,
                           const nn_block_span *spans, int n_blocks, int B, int Tk, int H, int Hk,
                           int d) {
    const int shape = fwd_shape(seq_off != NULL);
    const int rows = shape / 16 * 16 * (shape % 16);
    if (!mma_usable(H, Hk, d, rows) || !attn_al16(out) || !attn_al16(q) || !attn_al16(k) ||
        !attn_al16(v))
        return -1;
    mma_args a = {};
    a.out = out, a.lse = lse, a.q = q, a.k = k, a.v = v;
    int n_tiles;
    if (seq_off) {
        if (n_seqs <= 0 || T <= 0) return -1;
        a.seq_off = seq_off, a.n_seqs = n_seqs, a.T = T, a.Tk = T, a.H = H, a.Hk = Hk;
        a.group = H / Hk, a.RT = rows / a.group, a.scale = 1.0f / sqrtf((float)d);
        n_tiles = (T + a.RT - 1) / a.RT;
    } else {
        if (n_blocks <= 0 || B <= 0) return -1;
        block_tiling(a, spans, n_blocks, B, Tk, H, Hk, d, rows);
        n_tiles = n_blocks * a.tiles_per_block;
    }
    dim3 grid(n_tiles, Hk);
    if (d == 64) fwd_launch<64>(st, grid, a, shape);
    else fwd_launch<128>(st, grid, a, shape);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int cuda_mma_attention_dq(cudaStream_t st, bf16 *dq, float *dsave, const bf16 *dout,
                          const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                          const float *lse, const nn_block_span *spans, int n_blocks, int B,
                          int Tk, int H, int Hk, int d) {
    if (!mma_usable(H, Hk, d, 16 * DQ_WARPS) || n_blocks <= 0 || B <= 0 || !attn_al16(dq) ||
        !attn_al16(dout) || !attn_al16(q) || !attn_al16(k) || !attn_al16(v) || !attn_al16(out))
        return -1;
    mma_args a = {};
    block_tiling(a, spans, n_blocks, B, Tk, H, Hk, d, 16 * DQ_WARPS);
    a.out = dq, a.dsave = dsave, a.q = q, a.k = k, a.v = v, a.dout = dout, a.o = out;
    a.lse_in = lse;
    dim3 grid(n_blocks * a.tiles_per_block, Hk);
    if (d == 64) k_mma_dq<64><<<grid, 32 * DQ_WARPS, dq_smem<64>(), st>>>(a);
    else k_mma_dq<128><<<grid, 32 * DQ_WARPS, dq_smem<128>(), st>>>(a);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int cuda_mma_attention_dkdv(cudaStream_t st, bf16 *dk, bf16 *dv, float *acc, int *tickets,
                            int split_max, int vps, const float *dsave, const bf16 *dout,
                            const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
                            const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                            int Hk, int d) {
    if (!mma_usable(H, Hk, d, KV_ROWS) || !dsave || n_blocks <= 0 || B <= 0 || Tk <= 0 ||
        !attn_al16(dk) || !attn_al16(dv) || !attn_al16(dout) || !attn_al16(q) || !attn_al16(k) ||
        !attn_al16(v))
        return -1;
    mma_args a = {};
    block_tiling(a, spans, n_blocks, B, Tk, H, Hk, d, KV_ROWS);
    a.dk = dk, a.dv = dv, a.acc = acc, a.tickets = tickets, a.dsave = (float *)dsave;
    a.split_max = acc ? split_max : 1, a.vps = vps;
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.lse_in = lse;
    dim3 grid((Tk + KT - 1) / KT, Hk, a.split_max);
    if (d == 64) k_mma_dkdv<64><<<grid, 32 * KV_WARPS, kv_smem<64>(), st>>>(a);
    else k_mma_dkdv<128><<<grid, 32 * KV_WARPS, kv_smem<128>(), st>>>(a);
    CUDA_CHECK_LAUNCH();
    return 0;
}

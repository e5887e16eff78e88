/* ops_cuda_attn_bwd: the fused DFlash block-attention backward (dq, dk, dv in one key-major
 * pass) on mma.sync.m16n8k16, for head dim 128: the default (DFLASH_CUDA_ATTN unset or "fused";
 * see cuda_attn_mode). cuda_tensor_attention_block_bwd (ops_cuda_attn_split.cu) calls it first and
 * falls back to the mma.sync pair of ops_cuda_attn_mma.cu when it returns -1 (other head dims,
 * unaligned buffers, no scratch, a shape over the scratch); DFLASH_CUDA_ATTN=mma keeps the pair.
 * On Hopper the same pass runs on wgmma by default (k_wgb_fused, ops_cuda_attn_wgbwd.cu; its
 * comment says how it differs) with the launches, scratch and split of this file around it, and
 * this kernel where it cannot run (no sm_90a); DFLASH_CUDA_ATTN_BWD=mma chooses this kernel,
 * =wgmma_seq the wgmma kernel without its overlap of visits (see bwd_kernel).
 *
 * Why: the pair k_mma_dq + k_mma_dkdv computes S and dP twice (7 products per row and key);
 * here each (key tile, block) visit computes them once and makes all three gradients (5):
 *   S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - D)
 *   scale, dV += P^T dO, dK += dS^T Q (P^T, dS^T from registers, as k_mma_dkdv), and
 *   dQ += dS K: dS^T goes to shared memory as bf16 (ds, [key][row], stride 72: conflict-free
 *   32-bit stores and ldmatrix), the CTA synchronises, warp w takes m-tile w % 4 of the visit's
 *   rows and a quarter (8 warps) or all (4) of the columns (A: ldmatrix.trans of ds; B: K rows
 *   through ldmatrix.trans, as P V in the forward), skipping the key-steps of warps whose 16
 *   keys this block cannot see (act[]), and adds its fp32 tile into dqacc [Q, H, d].
 * How dq leaves a visit (DFLASH_CUDA_ATTN_FUSED_DQ; timings in bench/cuda_ops/NOTES.md):
 *   bulk (default, 8 warps): the warp stages its 16 x 64 tile (stride 72: conflict-free float2
 *     stores), fences for the async proxy, and lanes 0..15 each hand one 256-byte row piece to
 *     the bulk-copy engine (cp.reduce.async.bulk .add.f32), waiting for their previous one to
 *     have left the staging tile first; all bulk groups complete before the CTA ends;
 *   staged: the same tile in 32-column passes (in the visit's Q / dO stage, free by then) read
 *     back row-major for float4 atomics that cover whole 128-byte row pieces;
 *   direct: float4 atomics from the C layout (lane pairs swap halves: 16 rows x 32 B per warp
 *     instruction); the L2 request count made it the slowest.
 * Launches (same stream): k_bwd_rowD (D = rowsum(dO * O) per row into dsave [H, Q], one warp
 * per row), k_bwd_fused, k_bwd_dq_out (dqacc to bf16 dq, times the scale where k_wgb_fused,
 * which sums dS unscaled, ran; and dqacc zeroed again for the next call: it is zero between
 * calls, as the split scratch).
 * CTA (DFLASH_CUDA_ATTN_FUSED = keys x phase-A rows): 128x64 (default) / 128x32: 8 warps own
 * KT = 128 keys of kv head hk, one CTA per SM (251 registers; 155 KB of shared memory, 191 KB
 * with the bulk staging); 64x64 / 64x32: 4 warps, 64 keys, 2 CTAs per SM (112 KB), twice the
 * dq atomics. Warp w holds keys 16 w .. 16 w + 15 (the m16 rows of S^T) and dk, dv of them in
 * registers. The CTA takes piece blockIdx.z of the blocks that see its keys: by hit index
 * (attn_split_piece, this kernel's default) or by block ranges (DFLASH_CUDA_ATTN_FUSED_PIECES=
 * blocks: bwd_piece_blocks, so that CTAs running together add into the same dq rows; the wgmma
 * kernel's default is =sorted, the same pieces run heaviest first: see its file); blocks per
 * piece DFLASH_CUDA_ATTN_SPLIT. A visit is 64 query rows (16 tokens x 4 heads at group 4);
 * phase A (S^T, dP^T, dV, dK) in one pass of 64 rows or two of 32. Per visit two barriers: the
 * first publishes the visit's Q, dO, D, lse stage and frees the other one, whose cp.async for
 * the next visit starts right after it; the second publishes ds for dQ.
 * Not bitwise reproducible run to run: dq (fp32 sums from every key tile of a row, in any
 * order), and dk, dv of split tiles (as in k_mma_dkdv); each is one fp32 sum rounded to bf16
 * once. dqacc: 128 MiB (Q H d <= 32 Mi fp32) per device, allocated in cuda_bwd_attention_init
 * (nn_cuda_new) in the fused mode and grown by cuda_bwd_attention_plan (the attention_block_plan
 * op, at a model's creation) to its largest Q, never in a step; one block backward at a time per
 * device (shared scratch). Masks and the zero / +INF conventions are those of ops_cuda_attn.cu and
 * ops_cpu.c (rows without keys: dq 0; keys nobody sees: dk, dv 0).
 */
#include "attn_bwd.cuh" /* bwd_args, the split into pieces, the bulk dQ out */
#include "attn_spans.cuh"
#include "mma_frag.cuh"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PLD (FROWS + 8) /* ds row stride (bf16) */

/* D = rowsum(dO * O) of row (t, h) into dsave[h Q + t]; one warp per row, rows t H + h. */
template <int D> __global__ void __launch_bounds__(256) k_bwd_rowD(bwd_args a) {
    const int Q = a.n_blocks * a.B, lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * 8 + threadIdx.x / 32;
    if (row >= (long long)Q * a.H) return;
    const int t = (int)(row / a.H), h = (int)(row % a.H);
    constexpr int EPL = D / 32;
    const bf16 *o = a.o + row * D + lane * EPL, *d = a.dout + row * D + lane * EPL;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; e += 2) {
        float2 ov = __bfloat1622float2(*(const __nv_bfloat162 *)(o + e));
        float2 dv = __bfloat1622float2(*(const __nv_bfloat162 *)(d + e));
        s += ov.x * dv.x + ov.y * dv.y;
    }
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) a.dsave_w[(size_t)h * Q + t] = s;
}

/* dq = bf16(mul dqacc); dqacc = 0 again. n4: elements / 4; a thread takes 4 float4 of its CTA's
 * 1024 (loads first, streaming). */
__global__ void __launch_bounds__(256) k_bwd_dq_out(float *dqacc, bf16 *dq, size_t n4, float mul) {
    const size_t i0 = (size_t)blockIdx.x * 1024 + threadIdx.x;
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (i0 + 256 * u < n4) v[u] = __ldcs((const float4 *)dqacc + i0 + 256 * u);
#pragma unroll
    for (int u = 0; u < 4; u++) {
        size_t i = i0 + 256 * u;
        if (i >= n4) continue;
        __stcs((float4 *)dqacc + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        __stcs((uint2 *)(dq + 4 * i), make_uint2(pack_bf16x2(mul * v[u].x, mul * v[u].y),
                                                 pack_bf16x2(mul * v[u].z, mul * v[u].w)));
    }
}

/* K, V (16 NW keys), 2 stages of Q and dO rows, ds, 2 stages of D and lse; ST 2: the bulk dQ
 * staging, 16 x BLD fp32 per warp */
template <int D> static size_t bwd_smem(int nw, int st) {
    return (size_t)(2 * 16 * nw + 4 * FROWS) * (D + 8) * sizeof(bf16) +
           (size_t)16 * nw * PLD * sizeof(bf16) + 4 * FROWS * sizeof(float) +
           (st == 2 ? (size_t)nw * 16 * BLD * sizeof(float) : 0);
}

#define SLD 40 /* row stride (fp32) of a warp's dQ staging tile: 16 rows x 32 columns */

/* dQ of one visit (after the barrier that publishes ds): warp w takes m-tile w % 4 (rows
 * 16 (w % 4) .. of the visit) and columns [c0, c0 + CW), CW = 4 D / NW; its k-steps are the
 * active warps' 16 keys each (A fragments of ds loaded once). Out through float4 atomics into
 * dqacc: ST 0, from the C layout in passes of 64 columns (lane pairs swap halves: 16 rows x 32 B
 * per warp instruction); ST 1, in passes of 32 columns staged through the warp's own tile stg
 * (16 x SLD fp32; float2 stores, conflict-free) and read back row-major, so that each warp
 * instruction adds 4 whole 128-byte rows pieces; ST 2 (NW 8), staged in one 64-column pass
 * (16 x BLD) and added by the bulk-copy engine, one 256-byte row piece per lane of lanes 0..15
 * (cp.reduce.async.bulk .add.f32; a lane waits for its previous one to have read stg first). */
template <int D, int NW, int ST>
__device__ __forceinline__ void bwd_dq_visit(const bwd_args &a, visit_item it, int hk, int nrows,
                                             const bf16 *Ks, const bf16 *ds, const int *act,
                                             float *stg) {
    constexpr int LD = D + 8, MT = FROWS / 16, CW = D * MT / NW, PW = ST == 1 ? 32 : 64;
    static_assert(ST != 2 || CW == 64, "bulk: one 64-column pass");
    constexpr int NP = CW / PW, NT = PW / 8;
    static_assert(NP >= 1 && CW % PW == 0, "column passes");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int mt = warp % MT, c0 = (warp / MT) * CW;
    if (mt * 16 >= nrows) return; /* padding rows only (warp-uniform) */
    auto row_ptr = [&](int row) -> float * {
        float *p = bwd_dq_row<D>(a, it, hk, nrows, row);
        return p ? p + c0 : NULL;
    };
    const int odd = tg & 1;
    float *dst[4]; /* ST 0: dst[0], row g or g + 8; ST 1: rows 4 j + lane / 8 of the m-tile;
                    * ST 2: dst[0], row lane (lanes < 16) */
    if (ST == 2) {
        dst[0] = lane < 16 ? row_ptr(mt * 16 + lane) : NULL;
    } else if (!ST) {
        dst[0] = row_ptr(mt * 16 + g + 8 * odd);
        if (dst[0]) dst[0] += 2 * (tg - odd);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            dst[j] = row_ptr(mt * 16 + 4 * j + lane / 8);
            if (dst[j]) dst[j] += 4 * (lane % 8);
        }
    }
    /* dS rows mt * 16 .., keys 16 kk .. (ds holds dS^T: .trans); HA: kept over the passes */
    constexpr int HA = NW == 4 ? NW : 1;
    uint32_t af[HA][4];
    auto load_a = [&](uint32_t *f, int kk) {
        ldsm4t(f,
               ds + (kk * 16 + lane % 8 + 8 * (lane / 16)) * PLD + mt * 16 + 8 * ((lane / 8) % 2));
    };
    if (HA > 1) {
#pragma unroll
        for (int kk = 0; kk < HA; kk++)
            if (act[kk]) load_a(af[kk], kk);
    }
#pragma unroll
    for (int p = 0; p < NP; p++) {
        float acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NW; kk++) {
            if (!act[kk]) continue; /* uniform */
            uint32_t *fa = af[HA > 1 ? kk : 0];
            if (HA == 1) load_a(fa, kk);
#pragma unroll
            for (int dp = 0; dp < NT / 2; dp++) {
                uint32_t b[4];
                ldsm4t(b, Ks + (kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * LD + c0 + p * PW +
                              dp * 16 + 8 * (lane / 16));
                mma16816(acc[2 * dp], fa, b[0], b[1]);
                mma16816(acc[2 * dp + 1], fa, b[2], b[3]);
            }
        }
        if (ST == 2) {
            bwd_dq_bulk<NT>(acc, stg, dst[0]);
        } else if (!ST) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                float4 v = swap_pairs(acc[n], odd);
                if (dst[0]) atomicAdd((float4 *)(dst[0] + p * PW + n * 8), v);
            }
        } else {
            __syncwarp(); /* the previous pass has read stg */
#pragma unroll
            for (int n = 0; n < NT; n++) {
                *(float2 *)(stg + g * SLD + n * 8 + 2 * tg) = make_float2(acc[n][0], acc[n][1]);
                *(float2 *)(stg + (g + 8) * SLD + n * 8 + 2 * tg) =
                    make_float2(acc[n][2], acc[n][3]);
            }
            __syncwarp();
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float4 v = *(const float4 *)(stg + (4 * j + lane / 8) * SLD + 4 * (lane % 8));
                if (dst[j]) atomicAdd((float4 *)(dst[j] + p * PW), v);
            }
        }
    }
}

/* The fused kernel (see the file comment): NW warps, KT = 16 NW keys per CTA; AH phase-A
 * passes per visit (1 or 2). */
template <int D, int NW, int AH, int ST>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1) k_bwd_fused(bwd_args a) {
    constexpr int LD = D + 8, RH = FROWS / AH, KT = 16 * NW;
    extern __shared__ __align__(128) unsigned char sm_raw[];
    __shared__ int act[NW];
    bf16 *Ks = (bf16 *)sm_raw, *Vs = Ks + KT * LD;
    bf16 *Qs = Vs + KT * LD, *dOs = Qs + 2 * FROWS * LD; /* 2 stages each */
    bf16 *ds = dOs + 2 * FROWS * LD;                     /* dS^T [KT][PLD] */
    float *Dr = (float *)(ds + KT * PLD), *Lr = Dr + 2 * FROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int hk = blockIdx.y, k0 = blockIdx.x * KT;
    int nsplit, h_lo, h_hi;
    if (a.by_block ? !bwd_piece_blocks(a.spans, a.n_blocks, a.B, k0, KT, nsplit, h_lo, h_hi)
                   : !attn_split_piece(a.spans, a.n_blocks, a.B, k0, KT, a.acc != NULL, a.split_max,
                                       a.vps, nsplit, h_lo, h_hi))
        return; /* uniform over the CTA */
    auto kvoff = [&](int r) -> long long {
        return k0 + r < a.Tk ? ((long long)(k0 + r) * a.Hk + hk) * D : -1;
    };
    load_tile<D, KT>(Ks, a.k, kvoff, 1);
    load_tile<D, KT>(Vs, a.v, kvoff, 1);
    visit_item it = {-1, 0, h_lo};
    if (h_lo < h_hi) it.blk = attn_nth_hit(a.spans, a.n_blocks, a.B, k0, k0 + KT, h_lo);
    if (it.blk >= 0)
        visit_issue<D, FROWS>(a.q, a.dout, a.dsave, a.lse, a.n_blocks, a.B, a.H, a.group, it, hk,
                              Qs, dOs, Dr, Lr);
    cp_commit();

    const float sl2 = a.scale * FLOG2E;
    float dk[D / 8][4], dv[D / 8][4];
    frag_zero(dk);
    frag_zero(dv);

    for (int i = 0; it.blk >= 0; i++) {
        const int st = i % 2;
        cp_wait_all();
        /* stage st is complete for all threads, and all are done with the previous visit
         * (stage 1 - st, ds, act, the dQ staging in stage 1 - st) */
        __syncthreads();
        visit_item nx = visit_next<FROWS>(a.spans, a.n_blocks, a.B, a.group, it, k0, KT, h_hi);
        if (nx.blk >= 0)
            visit_issue<D, FROWS>(a.q, a.dout, a.dsave, a.lse, a.n_blocks, a.B, a.H, a.group, nx,
                                  hk, Qs + (1 - st) * FROWS * LD, dOs + (1 - st) * FROWS * LD,
                                  Dr + (1 - st) * FROWS, Lr + (1 - st) * FROWS);
        cp_commit();
        const int nrows = min(FROWS, a.B * a.group - it.cb);
        bool kvis[2];
        bwd_keys_seen(a.spans + it.blk, a.B, a.Tk, k0 + warp * 16, kvis);
        const bool on = __any_sync(0xffffffffu, kvis[0] || kvis[1]);
        if (on) {
            const bf16 *Qt = Qs + st * FROWS * LD, *dOt = dOs + st * FROWS * LD;
            const float *Dt = Dr + st * FROWS, *Lt = Lr + st * FROWS;
#pragma unroll
            for (int half = 0; half < AH; half++) {
                const int r0 = half * RH;
                if (r0 >= nrows) break; /* padding rows only */
                float s[RH / 8][4], dp[RH / 8][4];
#pragma unroll
                for (int n = 0; n < RH / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[n][e] = 0.0f, dp[n][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    uint32_t ka[4], va[4];
                    frag_a<LD>(ka, Ks, warp * 16, kk * 16);
                    frag_a<LD>(va, Vs, warp * 16, kk * 16);
                    mma_abt<1, RH / 8, LD>(&s, &ka, Qt + r0 * LD, kk);
                    mma_abt<1, RH / 8, LD>(&dp, &va, dOt + r0 * LD, kk);
                }
#pragma unroll
                for (int n = 0; n < RH / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = r0 + n * 8 + 2 * tg + (e & 1);
                        float p = kvis[e / 2] ? ex2(fmaf(s[n][e], sl2, -Lt[row])) : 0.0f;
                        s[n][e] = p;
                        dp[n][e] = p * (dp[n][e] - Dt[row]) * a.scale; /* dS^T */
                    }
                mma_px<D, RH / 16, 1>(&dv, &s, dOt + r0 * LD);
                mma_px<D, RH / 16, 1>(&dk, &dp, Qt + r0 * LD);
                /* dS^T rows (keys) g, g + 8 of this warp, columns (query rows) r0 + 8 n + 2 tg */
                bf16 *w = ds + (warp * 16 + g) * PLD + r0 + 2 * tg;
#pragma unroll
                for (int n = 0; n < RH / 8; n++) {
                    *(uint32_t *)(w + n * 8) = pack_bf16x2(dp[n][0], dp[n][1]);
                    *(uint32_t *)(w + 8 * PLD + n * 8) = pack_bf16x2(dp[n][2], dp[n][3]);
                }
            }
        }
        if (lane == 0) act[warp] = on;
        __syncthreads(); /* ds and act are complete; stage st is no longer read: dQ staging */
        float *stg = ST == 2 ? Lr + 2 * FROWS + warp * 16 * BLD
                             : (float *)((warp < NW / 2 ? Qs : dOs) + st * FROWS * LD) +
                                   (warp % (NW / 2)) * 16 * SLD;
        bwd_dq_visit<D, NW, ST>(a, it, hk, nrows, Ks, ds, act, stg);
        it = nx;
    }
    cp_wait_all(); /* K, V of a CTA without visits may still be landing: staging reuses them */
    if (ST == 2) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    __syncthreads();
    dkdv_tile_out<D>(dk, dv, Ks, Vs, nsplit, k0, KT, a.Tk, a.Hk, hk, a.dk, a.dv, a.acc,
                     a.tickets + (size_t)blockIdx.y * gridDim.x + blockIdx.x);
}

/* ------------------------------------------------------------------------------------------ */

#define DQACC_ELEMS (32u << 20) /* Q * H * d fp32 of dqacc at init: 128 MiB */
#define DQACC_DEVICES 64
static float *g_dqacc[DQACC_DEVICES];
static size_t g_dqacc_cap[DQACC_DEVICES]; /* elements */
/* the sorted schedule's items (WGB_PLAN_MAX) and work counters (2 ints after them) */
static bwd_item *g_plan[DQACC_DEVICES];

/* g_plan of the current device (start-up only); without it the wgmma kernel takes pieces by
 * block ranges in grid order */
static void plan_alloc(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DQACC_DEVICES || g_plan[dev]) {
        (void)cudaGetLastError();
        return;
    }
    if (cuda_malloc((void **)&g_plan[dev], WGB_PLAN_MAX * sizeof(bwd_item) + 2 * sizeof(int)) !=
        cudaSuccess) {
        g_plan[dev] = NULL;
        (void)cudaGetLastError();
    }
}

/* dqacc of at least `elems` fp32 (zeroed) on the current device: a larger one replaces the old
 * (start-up only: it waits for the device). -1 (old scratch kept) when there is no memory. */
static int dqacc_alloc(size_t elems) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DQACC_DEVICES) return -1;
    if (g_dqacc[dev] && g_dqacc_cap[dev] >= elems) return 0;
    float *p = NULL;
    if (cuda_malloc((void **)&p, elems * sizeof(float)) != cudaSuccess ||
        cudaMemset(p, 0, elems * sizeof(float)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        if (p) cudaFree(p);
        (void)cudaGetLastError();
        return -1;
    }
    if (g_dqacc[dev]) CUDA_CHECK(cudaFree(g_dqacc[dev]));
    g_dqacc[dev] = p, g_dqacc_cap[dev] = elems;
    return 0;
}

/* Kernel variant as NW * 4 + AH + 100 ST. DFLASH_CUDA_ATTN_FUSED: CTA shape, keys x phase-A
 * rows: 64x32 (4 warps, two passes of 32 rows), 64x64, 128x32 (8 warps, one CTA per SM), 128x64
 * (default); DFLASH_CUDA_ATTN_FUSED_DQ: how dq leaves a visit: direct (ST 0), staged (ST 1)
 * or bulk (ST 2, default; 8 warps only, staged with 4). */
static int bwd_variant(void) {
    static int v = 0;
    if (!v) {
        const char *e = getenv("DFLASH_CUDA_ATTN_FUSED"), *q = getenv("DFLASH_CUDA_ATTN_FUSED_DQ");
        int shape = !e                         ? 8 * 4 + 1
                    : strcmp(e, "64x32") == 0  ? 4 * 4 + 2
                    : strcmp(e, "64x64") == 0  ? 4 * 4 + 1
                    : strcmp(e, "128x32") == 0 ? 8 * 4 + 2
                                               : 8 * 4 + 1;
        int st = !q ? 2 : strcmp(q, "direct") == 0 ? 0 : strcmp(q, "staged") == 0 ? 1 : 2;
        if (st == 2 && shape / 4 != 8) st = 1;
        v = shape + 100 * st;
    }
    return v;
}

/* DFLASH_CUDA_ATTN_BWD: which kernel makes dq, dk, dv: "wgmma" (k_wgb_fused of
 * ops_cuda_attn_wgbwd.cu, dQ of a visit overlapping the next, its warpgroups without CTA
 * barriers where they can (PP, DFLASH_CUDA_ATTN_PP), where the device runs sm_90a code, else
 * k_bwd_fused), "wgmma_seq" (the same, one visit after the other) or "mma"
 * (k_bwd_fused, with the shape of bwd_variant). Unset or anything else: BWD_DEFAULT. */
enum { BWD_MMA = 0, BWD_WGMMA = 1, BWD_WGMMA_SEQ = 2 };
#define BWD_DEFAULT BWD_WGMMA
static int bwd_kernel(void) {
    static int k = -1;
    if (k < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN_BWD");
        k = !e                           ? BWD_DEFAULT
            : strcmp(e, "wgmma") == 0     ? BWD_WGMMA
            : strcmp(e, "wgmma_seq") == 0 ? BWD_WGMMA_SEQ
            : strcmp(e, "mma") == 0       ? BWD_MMA
                                          : BWD_DEFAULT;
    }
    return k;
}

/* DFLASH_CUDA_ATTN_FUSED_PIECES: hits (the split of attn_split_piece), blocks
 * (bwd_piece_blocks) or sorted (block ranges, heaviest first through k_bwd_plan: the wgmma
 * kernel only, blocks for k_bwd_fused); unset: sorted for the wgmma kernel, hits for
 * k_bwd_fused (kern). A BWD_PIECES_* value. */
static int bwd_pieces(int kern) {
    static int b = -2;
    if (b == -2) {
        const char *e = getenv("DFLASH_CUDA_ATTN_FUSED_PIECES");
        b = !e                         ? -1
            : strcmp(e, "blocks") == 0 ? BWD_PIECES_BLOCKS
            : strcmp(e, "sorted") == 0 ? BWD_PIECES_SORTED
                                       : BWD_PIECES_HITS;
    }
    if (b < 0) return kern == BWD_MMA ? BWD_PIECES_HITS : BWD_PIECES_SORTED;
    return kern == BWD_MMA && b == BWD_PIECES_SORTED ? BWD_PIECES_BLOCKS : b;
}

template <int NW, int AH, int ST> static int bwd_attr(void) {
    return cudaFuncSetAttribute(k_bwd_fused<128, NW, AH, ST>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bwd_smem<128>(NW, ST)) != cudaSuccess ||
           cudaFuncSetAttribute(k_bwd_fused<128, NW, AH, ST>,
                                cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess;
}

template <int NW, int AH, int ST> static void bwd_launch(cudaStream_t st, const bwd_args &a) {
    dim3 grid((a.Tk + 16 * NW - 1) / (16 * NW), a.Hk, a.split_max);
    k_bwd_fused<128, NW, AH, ST><<<grid, 32 * NW, bwd_smem<128>(NW, ST), st>>>(a);
}

template <int ST> static void bwd_launch(cudaStream_t st, const bwd_args &a, int shape) {
    if (shape == 4 * 4 + 2)
        bwd_launch<4, 2, ST>(st, a);
    else if (shape == 4 * 4 + 1)
        bwd_launch<4, 1, ST>(st, a);
    else if (shape == 8 * 4 + 2)
        bwd_launch<8, 2, ST>(st, a);
    else
        bwd_launch<8, 1, ST>(st, a);
}

template <int ST> static int bwd_attrs(void) {
    return bwd_attr<4, 2, ST>() | bwd_attr<4, 1, ST>() | bwd_attr<8, 2, ST>() |
           bwd_attr<8, 1, ST>();
}

static void bwd_launch_bulk(cudaStream_t st, const bwd_args &a, int shape) {
    if (shape == 8 * 4 + 2)
        bwd_launch<8, 2, 2>(st, a);
    else
        bwd_launch<8, 1, 2>(st, a);
}

int cuda_bwd_attention_init(void) {
    if (bwd_attrs<0>() | bwd_attrs<1>() | bwd_attr<8, 2, 2>() | bwd_attr<8, 1, 2>()) return -1;
    (void)cuda_wgb_attention_init(); /* never fails: without sm_90a k_bwd_fused serves */
    if (cuda_attn_mode() != ATTN_FUSED) return 0;
    (void)dqacc_alloc(DQACC_ELEMS); /* without it block_bwd runs the mma.sync pair: no error */
    plan_alloc();
    return 0;
}

int cuda_bwd_attention_plan(size_t q_h_d) {
    return cuda_attn_mode() == ATTN_FUSED ? dqacc_alloc(q_h_d) : 0;
}

/* cuda_attn_sm_count (attn_spans.cuh): cached per device, 0 until the driver answers */
int cuda_attn_sm_count(void) {
    static int sms[DQACC_DEVICES]; /* 0: not asked yet (or the driver said nothing) */
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
    if (dev < DQACC_DEVICES && sms[dev] > 0) return sms[dev];
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    if (dev < DQACC_DEVICES) sms[dev] = n;
    return n;
}

/* The sorted schedule's piece length in blocks: longest (at most len_max) where the call has
 * visits enough, but no longer than 2/3 of the visits an SM gets on average, so that the
 * heaviest pieces (the first context tiles, which every block sees) do not outlast the others.
 * Measured on the H200 at 768 tokens / 256 anchors (~62 visits per SM): the call 0.50 ms with
 * 160-block pieces, 0.39 with 40 (this rule's 41: the same 7 pieces), 0.40 with 31, 0.43 with
 * 16; at 3072/512 and 4 x 768 / 256 the rule keeps 160, which was best there (4 x 768: 1.45
 * ms against 1.57 with 80). The visits are estimated from the shape as each block seeing half
 * the context: n_blocks (ctx / 2 / 128 + 1) per kv head, ctx = Tk - n_blocks B (packed
 * sequences see less: an overestimate, which errs towards long pieces). A given
 * DFLASH_CUDA_ATTN_SPLIT keeps len_max. */
static int bwd_piece_len(int len_max, int n_blocks, int B, int Tk, int Hk) {
    const int nsm = cuda_attn_sm_count();
    if (cuda_attn_split_env() || nsm <= 0) return len_max;
    const long long ctx = (long long)Tk - (long long)n_blocks * B;
    const long long visits = (long long)n_blocks * ((ctx > 0 ? ctx : 0) / (2 * WGB_KEYS) + 1);
    const long long len = visits * Hk * 2 / (3 * nsm);
    return (int)(len < 16 ? 16 : len < len_max ? len : len_max);
}

int cuda_bwd_attention_block_bwd(cudaStream_t st, bf16 *dq, bf16 *dk, bf16 *dv, float *acc,
                                 int *tickets, int split_max, int vps, float *dsave,
                                 const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                                 const bf16 *out, const float *lse, const nn_block_span *spans,
                                 int n_blocks, int B, int Tk, int H, int Hk, int d) {
    int dev = 0;
    if (d != 128 || Hk <= 0 || H % Hk || H / Hk > FROWS || !dsave || n_blocks <= 0 || B <= 0 ||
        (long long)B * (H / Hk) >= (1 << 20) || /* rows per block: bwd_div_small's range */
        Tk <= 0 || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DQACC_DEVICES ||
        !g_dqacc[dev] || (size_t)n_blocks * B * H * d > g_dqacc_cap[dev])
        return -1;
    if (!attn_al16(dq) || !attn_al16(dk) || !attn_al16(dv) || !attn_al16(dout) || !attn_al16(q) ||
        !attn_al16(k) || !attn_al16(v) || !attn_al16(out))
        return -1;
    bwd_args a = {};
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.o = out, a.lse = lse;
    a.dsave = dsave, a.dsave_w = dsave, a.dqacc = g_dqacc[dev], a.acc = acc, a.tickets = tickets;
    a.dq = dq, a.dk = dk, a.dv = dv, a.spans = spans;
    a.n_blocks = n_blocks, a.B = B, a.Tk = Tk, a.H = H, a.Hk = Hk, a.group = H / Hk;
    a.inv_group = 1.0f / (float)a.group;
    a.split_max = acc ? split_max : 1, a.vps = vps;
    a.scale = 1.0f / sqrtf((float)d);
    const size_t rows = (size_t)n_blocks * B * H;
    k_bwd_rowD<128><<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
    const int kern = bwd_kernel(), var = bwd_variant();
    a.by_block = bwd_pieces(kern);
    if (a.by_block == BWD_PIECES_SORTED) {
        /* pieces of about 2 vps blocks: with the pieces run heaviest first, fewer and longer
         * ones cost less (per piece: K, V, the first loads, the dk, dv atomics); unless
         * DFLASH_CUDA_ATTN_SPLIT says, a small call's are shorter (bwd_piece_len) */
        const int nx = (Tk + WGB_KEYS - 1) / WGB_KEYS;
        const int len = bwd_piece_len(2 * (vps > 0 ? vps : 1), n_blocks, B, Tk, Hk);
        if (acc) a.split_max = min(ATTN_SPLIT_MAX, (n_blocks + len - 1) / len);
        if (g_plan[dev] && (long long)nx * a.split_max <= WGB_PLAN_MAX && n_blocks < (1 << 19))
            a.items = g_plan[dev], a.work = (int *)(g_plan[dev] + WGB_PLAN_MAX);
        else
            a.by_block = BWD_PIECES_BLOCKS, a.split_max = acc ? split_max : 1;
    }
    float dq_mul = a.scale; /* k_wgb_fused sums dS K with dS unscaled */
    if (kern == BWD_MMA || cuda_wgb_attention_launch(st, &a, kern == BWD_WGMMA) != 0) {
        dq_mul = 1.0f;
        a.by_block = bwd_pieces(BWD_MMA); /* k_bwd_fused, with its own pieces */
        a.split_max = acc ? split_max : 1;
        if (var >= 200)
            bwd_launch_bulk(st, a, var - 200);
        else if (var >= 100)
            bwd_launch<1>(st, a, var - 100);
        else
            bwd_launch<0>(st, a, var);
    }
    CUDA_CHECK_LAUNCH();
    const size_t n4 = rows * d / 4;
    k_bwd_dq_out<<<(unsigned)((n4 + 1023) / 1024), 256, 0, st>>>(a.dqacc, dq, n4, dq_mul);
    CUDA_CHECK_LAUNCH();
    return 0;
}

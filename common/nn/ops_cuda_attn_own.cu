/* ops_cuda_attn_own: the block backward's own keys in a kernel of their own, for head dim 128.
 *
 * Why: in DFlash training a block's queries see the context before its anchor and their own
 * block's B keys, and the keys are laid out [context ; block 0 ; block 1 ; ...], so block j's
 * own keys are rows Kc + j B .. + B - 1 (Kc = Tk - n_blocks B) and nobody else sees them. The
 * key-major fused backward (ops_cuda_attn_bwd.cu, ops_cuda_attn_wgbwd.cu) visits those keys as
 * 128-key tiles of 8 blocks, each block's visit computing all 128 keys for its 16: ~7% of its
 * visits for ~1% of the products (ncu: k_wgb_fused 1.22 -> 1.09 ms without them). Here they
 * cost one small CTA per (block, kv head), which also does k_bwd_rowD's work and sets dqacc in
 * place of the zero fill that k_bwd_dq_out otherwise leaves for the next call.
 *
 * How (cuda_bwd_attention_block_bwd runs these where the sorted k_wgb_fused schedule runs, on
 * its stream; Kc_al = Kc rounded up to its 128-key tiles):
 *   k_own_spans (one CTA, first): checks that the spans have that layout (block j's own keys at
 *     Kc + j B, no kept context past Kc; *ok) and writes the spans k_wgb_fused then reads: the
 *     same contexts with no own keys (blk_begin -1, see attn_span_ranges), or, without the
 *     layout, the spans unchanged. k_bwd_plan then makes no item for the tiles from Kc_al on
 *     (bwd_args.tail_ok): their dk, dv are written here only. Keys Kc .. Kc_al - 1 share a tile
 *     with the context, whose end writes zero dk, dv for them: k_bwd_own leaves theirs in side
 *     planes and k_own_tail copies them over after k_wgb_fused.
 *   k_bwd_own (second, in place of k_bwd_rowD): persistent CTAs of 4 warps (2 per SM), each
 *     taking items (block j, kv head hk) in turn, the next item's loads (cp.async into the
 *     other of two stages; O into registers) in flight while one computes. An item: the
 *     block's R = B x group query rows (row r: token j B + r / group, head hk group + r % group;
 *     R <= 64, B <= 16) and its B own keys. Every item: D = rowsum(dO O) of its rows into dsave
 *     (dO from the stage, O by rows, each lane 4 columns). With the layout,
 *     warp w, rows 16 w .. + 15, on mma.sync.m16n8k16 (mma_frag.cuh), key-major as the fused
 *     kernels:
 *       S^T = K Q^T, dP^T = V dO^T (16 keys x 16 rows, 8 k-steps of d), P^T = exp2(S^T scale
 *       log2e - lse log2e) (0 for padding rows, keys past B, a padding block), dS^T = P^T
 *       (dP^T - D); dV_w = P^T dO_w, dK_w = dS^T Q_w (summed over the 4 warps through shared
 *       memory in a fixed order, dK times the scale, rounded once to bf16 into dk, dv: the only
 *       contributions those keys have); dQ_w = dS K (A = dS from dS^T's registers by
 *       movmatrix.trans), staged row-major and written as its rows' dqacc start (times own_mul:
 *       dqacc holds k_wgb_fused's unscaled sums, to which it adds; k_bwd_dq_out scales).
 *     Without the layout the rows' dqacc start at zero: the kernel is k_bwd_rowD plus the zero
 *     fill that k_bwd_dq_out then leaves out.
 *   Numerics as the fused kernels: P, dS rounded to bf16 as the products' inputs, fp32 sums.
 * Earlier forms (bench/cuda_ops/NOTES.md, "The own keys in a kernel of their own"): after the
 * fused kernel, writing dq (one dqacc load at a time: 1.78 ms; loads first: 164 us); before it,
 * one item per CTA (174 us at 2.2 TB/s, the CTAs of a wave loading and computing in step).
 */
#include "attn_bwd.cuh"
#include "attn_spans.cuh"
#include "mma_frag.cuh"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <stdint.h>

#define OWN_D 128
#define OWN_LD (OWN_D + 8)   /* bf16 row stride of the shared Q, dO, K, V tiles */
#define OWN_RED (OWN_D + 4)  /* fp32 row stride of a warp's dK or dV partial (conflict-free) */
#define OWN_ROWS 64          /* query rows per CTA (4 warps x 16) */
#define OWN_KEYS 16          /* own keys per CTA (one m16 tile) */
#define OWN_STAGE ((size_t)(2 * OWN_ROWS + 2 * OWN_KEYS) * OWN_LD * sizeof(bf16)) /* Q dO K V */
#define OWN_SMEM (2 * OWN_STAGE + OWN_ROWS * sizeof(float))                        /* + Ds */

static_assert((size_t)OWN_ROWS * OWN_RED * sizeof(float) <=
                  (size_t)2 * OWN_ROWS * OWN_LD * sizeof(bf16),
              "the partials and the dQ rows fit where Q and dO were");

__global__ void __launch_bounds__(1024) k_own_spans(const nn_block_span *spans, nn_block_span *out,
                                                    int *ok, int n_blocks, int B, int Kc) {
    bool good = true;
    for (int j = threadIdx.x; j < n_blocks; j += blockDim.x) {
        const nn_block_span s = spans[j];
        good = good && s.blk_begin == Kc + j * B && (!s.keep || s.ctx_end <= s.ctx_begin ||
                                                     (s.ctx_begin >= 0 && s.ctx_end <= Kc));
    }
    good = __syncthreads_and(good);
    for (int j = threadIdx.x; j < n_blocks; j += blockDim.x) {
        nn_block_span s = spans[j];
        if (good) s.keep = s.keep && s.ctx_end > s.ctx_begin, s.blk_begin = -1; /* contexts */
        out[j] = s;
    }
    if (threadIdx.x == 0) *ok = good;
}

/* dk, dv rows Kc .. Kc_al - 1 (below Tk) from k_bwd_own's side planes (row key - Kc), where *ok:
 * after the fused kernel, whose tile Kc_al - 128 .. wrote zero there. One thread per 8 columns. */
__global__ void k_own_tail(const int *ok, const bf16 *side, bf16 *dk, bf16 *dv, int Kc, int n,
                           int Hk) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x, per = Hk * (OWN_D / 8);
    if (!*ok || e >= 2 * n * per) return;
    const int p = e / (n * per), f = e % (n * per), key = f / per;
    const int hk = f % per / (OWN_D / 8), c = f % (OWN_D / 8) * 8;
    const size_t src = ((size_t)key * Hk + hk) * OWN_D + c;
    const size_t dst = ((size_t)(Kc + key) * Hk + hk) * OWN_D + c;
    *(uint4 *)((p ? dv : dk) + dst) = *(const uint4 *)(side + (size_t)p * OWN_SIDE * Hk * OWN_D +
                                                        src);
}

/* movmatrix: the transpose of the 8 x 8 bf16 matrix whose fragment x is (ldmatrix layout) */
__device__ __forceinline__ uint32_t movt(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* The 4 warps' fp32 partials (C layout, 16 keys x 128, in red) summed in warp order, times mul,
 * rounded to bf16 rows key0 + i (i < nk) of dst [Tk, Hk, 128] at kv head hk, or of the side
 * plane [OWN_SIDE, Hk, 128] at row key - Kc for keys below Kc_al. All threads. */
__device__ __forceinline__ void own_keys_out(const float *red, bf16 *dst, bf16 *side, int Kc,
                                             int Kc_al, int key0, int nk, int Hk, int hk,
                                             float mul) {
    const int i = threadIdx.x / 8, c0 = threadIdx.x % 8 * 16;
    if (i >= nk) return;
    float s[16];
#pragma unroll
    for (int e = 0; e < 16; e++)
        s[e] = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const float *p = red + (w * OWN_KEYS + i) * OWN_RED + c0;
#pragma unroll
        for (int e = 0; e < 16; e += 4) {
            const float4 v = *(const float4 *)(p + e);
            s[e] += v.x, s[e + 1] += v.y, s[e + 2] += v.z, s[e + 3] += v.w;
        }
    }
    uint4 o[2];
    uint32_t *u = (uint32_t *)o;
#pragma unroll
    for (int e = 0; e < 8; e++)
        u[e] = pack_bf16x2(mul * s[2 * e], mul * s[2 * e + 1]);
    const int key = key0 + i;
    uint4 *g = (uint4 *)(key < Kc_al ? side + ((size_t)(key - Kc) * Hk + hk) * OWN_D + c0
                                     : dst + ((size_t)key * Hk + hk) * OWN_D + c0);
    g[0] = o[0], g[1] = o[1];
}

/* A warp's 16 x 128 partial (C layout) into its slice of red. */
__device__ __forceinline__ void own_red_store(float *red, const float (&acc)[OWN_D / 8][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4, w = threadIdx.x / 32;
    float *p = red + w * OWN_KEYS * OWN_RED;
#pragma unroll
    for (int n = 0; n < OWN_D / 8; n++) {
        *(float2 *)(p + g * OWN_RED + 8 * n + 2 * tg) = make_float2(acc[n][0], acc[n][1]);
        *(float2 *)(p + (g + 8) * OWN_RED + 8 * n + 2 * tg) = make_float2(acc[n][2], acc[n][3]);
    }
}

/* The CTA's R dqacc rows (row r at off(r)) set to mul stg (its rows row-major, stride OWN_RED)
 * or to zero (stg NULL). All threads. */
/* Offset of CTA row r (r < R) of item (block j, kv head hk) in q, dout, o and dqacc [Q, H, 128] */
__device__ __forceinline__ size_t own_off(const bwd_args &a, int j, int hk, int r) {
    return ((size_t)(j * a.B + r / a.group) * a.H + hk * a.group + r % a.group) * OWN_D;
}

/* The item's R dqacc rows set to mul stg (its rows row-major, stride OWN_RED) or to zero (stg
 * NULL). All threads. */
__device__ __forceinline__ void own_dqacc_rows(const bwd_args &a, int j, int hk, int R, float mul,
                                               const float *stg) {
    constexpr int C4 = OWN_D / 4;
    for (int e = threadIdx.x; e < R * C4; e += blockDim.x) {
        const int r = e / C4, c = e % C4 * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (stg) {
            x = *(const float4 *)(stg + r * OWN_RED + c);
            x.x *= mul, x.y *= mul, x.z *= mul, x.w *= mul;
        }
        *(float4 *)(a.dqacc + own_off(a, j, hk, r) + c) = x;
    }
}

/* The item's dO (and, with own, Q rows and K, V keys) into a stage by cp.async (zero past R and
 * B), not committed. All threads. */
__device__ __forceinline__ void own_issue(const bwd_args &a, bf16 *stage, int j, int hk, int R,
                                          int Kc, bool own) {
    bf16 *Qs = stage, *dOs = Qs + OWN_ROWS * OWN_LD, *Ks = dOs + OWN_ROWS * OWN_LD;
    bf16 *Vs = Ks + OWN_KEYS * OWN_LD;
    for (int e = threadIdx.x; e < OWN_ROWS * (OWN_D / 8); e += blockDim.x) {
        const int r = e / (OWN_D / 8), c = e % (OWN_D / 8) * 8;
        const bool in = r < R;
        const size_t o = in ? own_off(a, j, hk, r) + c : 0;
        cp_async16(dOs + r * OWN_LD + c, a.dout + o, in ? 16 : 0);
        if (own) cp_async16(Qs + r * OWN_LD + c, a.q + o, in ? 16 : 0);
    }
    for (int e = threadIdx.x; own && e < OWN_KEYS * (OWN_D / 8); e += blockDim.x) {
        const int i = e / (OWN_D / 8), c = e % (OWN_D / 8) * 8;
        const bool in = i < a.B;
        const size_t o = in ? ((size_t)(Kc + j * a.B + i) * a.Hk + hk) * OWN_D + c : 0;
        cp_async16(Ks + i * OWN_LD + c, a.k + o, in ? 16 : 0);
        cp_async16(Vs + i * OWN_LD + c, a.v + o, in ? 16 : 0);
    }
}

/* O of the warp's rows 16 w .. + 15 of item (j, hk), each lane its 4 columns, into registers
 * (all 16 loads issued before any is used). One warp. */
__device__ __forceinline__ void own_o_load(const bwd_args &a, uint2 (&ov)[16], int j, int hk,
                                           int R) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int r = 16 * w + i;
        ov[i] = r < R ? *(const uint2 *)(a.o + own_off(a, j, hk, r) + 4 * lane)
                      : make_uint2(0u, 0u);
    }
}

/* D = rowsum(dO O) of the warp's rows (dO in the stage, O in ov) into Ds and dsave [H, Q] (rows
 * < R). One warp. */
__device__ __forceinline__ void own_rowD(const bwd_args &a, const uint2 (&ov)[16], const bf16 *dOs,
                                         float *Ds, int R, int j, int hk) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, Q = a.n_blocks * a.B;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int r = 16 * w + i;
        const uint2 dv = *(const uint2 *)(dOs + r * OWN_LD + 4 * lane);
        const float2 o0 = __bfloat1622float2(*(const __nv_bfloat162 *)&ov[i].x);
        const float2 o1 = __bfloat1622float2(*(const __nv_bfloat162 *)&ov[i].y);
        const float2 d0 = __bfloat1622float2(*(const __nv_bfloat162 *)&dv.x);
        const float2 d1 = __bfloat1622float2(*(const __nv_bfloat162 *)&dv.y);
        float t = o0.x * d0.x + o0.y * d0.y + o1.x * d1.x + o1.y * d1.y;
#pragma unroll
        for (int sh = 16; sh > 0; sh >>= 1)
            t += __shfl_xor_sync(0xffffffffu, t, sh);
        if (lane == 0) {
            Ds[r] = t;
            const int h = hk * a.group + r % a.group, t0 = j * a.B + r / a.group;
            if (r < R) a.dsave_w[(size_t)h * Q + t0] = t;
        }
    }
    __syncwarp();
}

/* The own keys' work of one item (block j, kv head hk) from its stage (Q, dO, K, V), Ds and the
 * lse of the thread's rows (see the file comment); red lies over the stage's Q and dO. All
 * threads; contains barriers. */
__device__ __forceinline__ void own_item(const bwd_args &a, const bf16 *stage, const float *Ds,
                                         float *red, int j, int hk, int R, bool keep,
                                         const float (&lse2)[2][2], int Kc, int Kc_al, bf16 *side,
                                         float own_mul) {
    const bf16 *Qs = stage, *dOs = Qs + OWN_ROWS * OWN_LD, *Ks = dOs + OWN_ROWS * OWN_LD;
    const bf16 *Vs = Ks + OWN_KEYS * OWN_LD;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, tg = lane % 4;
    const int B = a.B, key0 = Kc + j * B;
    /* S^T and dP^T: 16 keys x the warp's 16 rows */
    float s[1][2][4], dp[1][2][4];
    frag_zero(s[0]);
    frag_zero(dp[0]);
#pragma unroll
    for (int kk = 0; kk < OWN_D / 16; kk++) {
        uint32_t ak[1][4], av[1][4];
        frag_a<OWN_LD>(ak[0], Ks, 0, 16 * kk);
        frag_a<OWN_LD>(av[0], Vs, 0, 16 * kk);
        mma_abt<1, 2, OWN_LD>(s, ak, Qs + 16 * w * OWN_LD, kk);
        mma_abt<1, 2, OWN_LD>(dp, av, dOs + 16 * w * OWN_LD, kk);
    }
    const float sl2 = a.scale * FLOG2E;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = g + 8 * (e / 2), c = e % 2, r = 16 * w + 8 * n + 2 * tg + c;
            const bool vis = keep && key < B && r < R;
            const float p = vis ? ex2(s[0][n][e] * sl2 - lse2[n][c]) : 0.0f;
            s[0][n][e] = p;                          /* P^T */
            dp[0][n][e] = p * (dp[0][n][e] - Ds[r]); /* dS^T */
        }
    /* dV_w = P^T dO_w, dK_w = dS^T Q_w: the warp's rows as the k dimension */
    float dv[1][OWN_D / 8][4], dk[1][OWN_D / 8][4];
    frag_zero(dv[0]);
    frag_zero(dk[0]);
    mma_px<OWN_D, 1, 1>(dv, s, dOs + 16 * w * OWN_LD);
    mma_px<OWN_D, 1, 1>(dk, dp, Qs + 16 * w * OWN_LD);
    __syncthreads(); /* Q, dO read by every warp: red may take their place */
    own_red_store(red, dv[0]);
    __syncthreads();
    own_keys_out(red, a.dv, side + (size_t)OWN_SIDE * a.Hk * OWN_D, Kc, Kc_al, key0, B, a.Hk, hk,
                 1.0f);
    __syncthreads();
    own_red_store(red, dk[0]);
    __syncthreads();
    own_keys_out(red, a.dk, side, Kc, Kc_al, key0, B, a.Hk, hk, a.scale);
    /* dQ_w = dS K: A = dS (rows x keys), the transposes of dS^T's 8 x 8 quarters */
    uint32_t ads[4];
    ads[0] = movt(pack_bf16x2(dp[0][0][0], dp[0][0][1])); /* rows 0-7, keys 0-7 */
    ads[1] = movt(pack_bf16x2(dp[0][1][0], dp[0][1][1])); /* rows 8-15, keys 0-7 */
    ads[2] = movt(pack_bf16x2(dp[0][0][2], dp[0][0][3])); /* rows 0-7, keys 8-15 */
    ads[3] = movt(pack_bf16x2(dp[0][1][2], dp[0][1][3])); /* rows 8-15, keys 8-15 */
    float dq[OWN_D / 8][4];
    frag_zero(dq);
#pragma unroll
    for (int dpair = 0; dpair < OWN_D / 16; dpair++) {
        uint32_t b[4];
        ldsm4t(b, Ks + (lane % 8 + 8 * ((lane / 8) % 2)) * OWN_LD + dpair * 16 + 8 * (lane / 16));
        mma16816(dq[2 * dpair], ads, b[0], b[1]);
        mma16816(dq[2 * dpair + 1], ads, b[2], b[3]);
    }
    /* the warp's dQ rows staged row-major over red (dk is out), then written as dqacc's start */
    __syncthreads();
#pragma unroll
    for (int n = 0; n < OWN_D / 8; n++) {
        float *p = red + (16 * w + g) * OWN_RED + 8 * n + 2 * tg;
        *(float2 *)p = make_float2(dq[n][0], dq[n][1]);
        *(float2 *)(p + 8 * OWN_RED) = make_float2(dq[n][2], dq[n][3]);
    }
    __syncthreads();
    own_dqacc_rows(a, j, hk, R, own_mul, red);
}

/* Persistent CTAs take items it = blockIdx.x, + gridDim.x, ... (block it / Hk, kv head it % Hk),
 * each item's loads issued one item ahead into the other of two stages, so that the memory is
 * busy while an item computes (one item per CTA, 5 CTAs per SM: 174 us at 2.2 TB/s for the
 * step's 4096 items, the CTAs of a wave loading and computing in step). */
__global__ void __launch_bounds__(128, 2) k_bwd_own(bwd_args a, const int *ok, int Kc, int Kc_al,
                                                    bf16 *side, float own_mul) {
    extern __shared__ __align__(16) unsigned char own_sm[];
    bf16 *stages = (bf16 *)own_sm;
    float *Ds = (float *)(own_sm + 2 * OWN_STAGE);
    const int n_items = a.n_blocks * a.Hk, R = a.B * a.group, Q = a.n_blocks * a.B;
    const int w = threadIdx.x / 32, tg = threadIdx.x % 4;
    const bool own = *ok; /* else the fused kernel visits every key */
    int it = blockIdx.x;
    if (it >= n_items) return;
    uint2 ov[16];
    own_issue(a, stages, it / a.Hk, it % a.Hk, R, Kc, own);
    cp_commit();
    own_o_load(a, ov, it / a.Hk, it % a.Hk, R);
    for (int st = 0; it < n_items; it += gridDim.x, st ^= 1) {
        const int j = it / a.Hk, hk = it % a.Hk, nxt = it + gridDim.x;
        bf16 *stage = stages + (size_t)st * (OWN_STAGE / sizeof(bf16));
        if (nxt < n_items)
            own_issue(a, stages + (size_t)(st ^ 1) * (OWN_STAGE / sizeof(bf16)), nxt / a.Hk,
                      nxt % a.Hk, R, Kc, own);
        cp_commit(); /* maybe empty: the wait below leaves the newest group in flight */
        /* lse of the thread's rows 16 w + 8 n + 2 tg + e (columns of S^T), scaled for exp2 */
        float lse2[2][2];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 16 * w + 8 * n + 2 * tg + e;
                const size_t o = (size_t)(hk * a.group + r % a.group) * Q + j * a.B + r / a.group;
                lse2[n][e] = own && r < R ? a.lse[o] * FLOG2E : 0.0f;
            }
        const bool keep = a.spans[j].keep != 0; /* the caller's spans (a.spans is theirs) */
        cp_wait_prev();
        __syncthreads();
        own_rowD(a, ov, stage + OWN_ROWS * OWN_LD, Ds, R, j, hk);
        if (nxt < n_items) own_o_load(a, ov, nxt / a.Hk, nxt % a.Hk, R);
        if (own)
            own_item(a, stage, Ds, (float *)stage, j, hk, R, keep, lse2, Kc, Kc_al, side, own_mul);
        else /* D only: dqacc's rows start at zero for the fused kernel */
            own_dqacc_rows(a, j, hk, R, 0.0f, NULL);
        __syncthreads(); /* the stage, red and Ds are free for the item after next */
    }
}

void cuda_own_spans(cudaStream_t st, const nn_block_span *spans, nn_block_span *out, int *ok,
                    int n_blocks, int B, int Kc) {
    k_own_spans<<<1, 1024, 0, st>>>(spans, out, ok, n_blocks, B, Kc);
    CUDA_CHECK_LAUNCH();
}

static int g_own_grid = -1; /* persistent CTAs of k_bwd_own (0: its shared memory refused) */

int cuda_bwd_own_init(void) {
    if (g_own_grid >= 0) return g_own_grid > 0 ? 0 : -1;
    int dev = 0, nsm = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaFuncSetAttribute(k_bwd_own, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)OWN_SMEM) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_bwd_own, 128, OWN_SMEM) !=
            cudaSuccess ||
        per < 1) {
        (void)cudaGetLastError();
        g_own_grid = 0;
        return -1;
    }
    g_own_grid = nsm * per;
    return 0;
}

void cuda_bwd_own(cudaStream_t st, const bwd_args *a, const int *ok, int Kc, int Kc_al,
                  bf16 *side, float own_mul) {
    assert(g_own_grid > 0 && Kc_al - Kc <= OWN_SIDE && a->Hk <= OWN_SIDE_HK);
    const int items = a->n_blocks * a->Hk, grid = items < g_own_grid ? items : g_own_grid;
    k_bwd_own<<<grid, 128, OWN_SMEM, st>>>(*a, ok, Kc, Kc_al, side, own_mul);
    CUDA_CHECK_LAUNCH();
}

void cuda_own_tail(cudaStream_t st, const int *ok, const bf16 *side, bf16 *dk, bf16 *dv, int Kc,
                   int Kc_al, int Tk, int Hk) {
    const int n = min(Kc_al, Tk) - Kc, th = 2 * n * Hk * (OWN_D / 8);
    if (n <= 0) return;
    k_own_tail<<<(th + 255) / 256, 256, 0, st>>>(ok, side, dk, dv, Kc, n, Hk);
    CUDA_CHECK_LAUNCH();
}

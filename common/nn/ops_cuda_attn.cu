/* ops_cuda_attn: attention kernels of the cuda backend (bf16 in and out, fp32 inside).
 *
 * Query-major kernel k_attn_q<MAXD, MODE> (causal forward, block forward, block backward dq):
 *   one CTA = a tile of up to RT query tokens x the `group` query heads of one kv head hk
 *   (NR = RT * group <= 64 query rows, all sharing one key set up to a per-row causal limit);
 *   8 warps, a warp owns rows w, w+8, ... (<= 8 rows, state in registers). Keys stream through
 *   shared memory in tiles of 32 (K and V as fp32, rows padded to d+1 floats: no bank
 *   conflicts when lane j reads key j). Per tile and row, lane j scores key j; online softmax
 *   (running max m, per-lane partial sums l, output o[d] spread over the lanes, rescaled when m
 *   grows); the P.V product broadcasts p_j with shuffles. Never materialises scores beyond one
 *   32-key tile per row.
 *     causal:  row t of sequence s sees [seq_off[s], t]; tokens outside
 *              [seq_off[0], seq_off[n_seqs]) get 0. The CTA's key range is the union of its
 *              rows' ranges; each row masks the rest.
 *     block:   the rows of block j (tiles never straddle blocks) see the span's context range
 *              and their own B rows (merged when they overlap: each key once, as ops_cpu.c);
 *              keep == 0 or no key: out 0, lse +INF.
 *     dq:      P recomputed from the saved lse, dP = dout . v, dS = P (dP - D) scale with
 *              D = rowsum(dout * out), dq = dS . K.
 * Key-major kernel k_attn_kv<MAXD> (block backward dk, dv): one CTA = 32 keys x one kv head,
 *   4 warps; it scans all spans, and for every block that sees any of its keys processes that
 *   block's B * group query rows in chunks of 32: S and dP (32 x 32) into shared memory, then
 *   each thread accumulates dv[key][x] += P^T dout, dk[key][x] += dS^T q for its (key, dims) in
 *   registers. No atomics: every dk/dv row has one writer, keys nobody sees get 0; deterministic.
 * Stream: the caller's. Shapes are checked in the launchers; d <= 256, even. The launchers try
 * the tensor-core kernels first (d 64 / 128, aligned buffers): by default the wgmma causal
 * and block forwards of ops_cuda_attn_wgmma.cu (Hopper), the mma.sync kernels of
 * ops_cuda_attn_mma.cu and the block backward of ops_cuda_attn_split.cu (the fused kernel of
 * ops_cuda_attn_bwd.cu, d 128, else the mma.sync pair); DFLASH_CUDA_ATTN (parsed here,
 * cuda_attn_mode; values in attn_spans.cuh) picks another set for bisecting,
 * DFLASH_CUDA_ATTN_CAUSAL a causal forward, DFLASH_CUDA_ATTN_BLOCK a block forward (wgmma, or
 * mma for the mma.sync one).
 */
#include "attn_spans.cuh"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define QROWS 64 /* query rows (tokens x heads of a group) per CTA */
#define KTILE 32 /* keys per shared-memory tile */
#define QWARPS 8
#define KVROWS 32 /* query rows per chunk in the key-major kernel */

enum { MODE_CAUSAL = 0, MODE_BLOCK = 1, MODE_DQ = 2 };

typedef struct attn_args {
    bf16 *out;  /* fwd: out[T,H,d]; dq mode: dq[Q,H,d] */
    float *lse; /* fwd block: lse[H,Q] (may be NULL) */
    const bf16 *q, *k, *v;
    const bf16 *dout, *o; /* dq mode */
    const float *lse_in;  /* dq mode */
    const int32_t *seq_off;
    int n_seqs;
    const nn_block_span *spans;
    int n_blocks, B;
    int T, Tk, H, Hk, d, group;
    int RT, tiles_per_block;
    float scale;
} attn_args;

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum_a(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

int cuda_attn_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN");
        mode = !e || !*e                   ? ATTN_FUSED
               : strcmp(e, "simple") == 0 ? ATTN_SIMPLE
               : strcmp(e, "mma") == 0    ? ATTN_MMA
                                          : ATTN_FUSED;
    }
    return mode;
}

static size_t q_smem(int d, int mode) {
    size_t rows = mode == MODE_DQ ? 2 * QROWS : QROWS;
    return (rows * d + 2 * KTILE * (size_t)(d + 1)) * sizeof(float);
}

template <int MAXD, int MODE> __global__ void __launch_bounds__(QWARPS * 32) k_attn_q(attn_args a) {
    constexpr int DPL = (MAXD + 31) / 32; /* dims per lane */
    constexpr int RPW = QROWS / QWARPS;   /* rows per warp */
    extern __shared__ float smem[];
    const int d = a.d, dp1 = d + 1, group = a.group, H = a.H, Hk = a.Hk;
    float *Qs = smem;                                    /* [QROWS][d] */
    float *dOs = Qs + QROWS * d;                         /* [QROWS][d] (dq mode) */
    float *Ks = MODE == MODE_DQ ? dOs + QROWS * d : dOs; /* [KTILE][d+1] */
    float *Vs = Ks + KTILE * dp1;
    const int hk = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    /* this CTA's tokens [t_a, t_a + R) and its key ranges */
    int t_a, R, nr = 0, rng[4] = {0, 0, 0, 0};
    attn_tile_keys(MODE == MODE_CAUSAL ? a.seq_off : NULL, a.n_seqs, a.T, a.spans, a.B, a.RT,
                   a.tiles_per_block, blockIdx.x, t_a, R, nr, rng);
    const int NR = R * group;

    /* per-row setup */
    int kbeg[RPW], kend[RPW];
    float m[RPW], l[RPW], acc[RPW][DPL], rlse[RPW], rD[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int qr = warp + QWARPS * rr;
        m[rr] = -INFINITY, l[rr] = 0.0f, rlse[rr] = INFINITY, rD[rr] = 0.0f;
        kbeg[rr] = 0, kend[rr] = 0;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            acc[rr][i] = 0.0f;
        if (qr < NR) /* block: the tile's ranges alone decide */
            attn_row_keys(MODE == MODE_CAUSAL ? a.seq_off : NULL, a.n_seqs, a.Tk,
                          t_a + qr / group, kbeg[rr], kend[rr]);
    }
    for (int idx = threadIdx.x; idx < NR * d; idx += blockDim.x) {
        int qr = idx / d, x = idx % d;
        int t = t_a + qr / group, h = hk * group + qr % group;
        size_t off = ((size_t)t * H + h) * d + x;
        Qs[qr * d + x] = __bfloat162float(a.q[off]);
        if (MODE == MODE_DQ) dOs[qr * d + x] = __bfloat162float(a.dout[off]);
    }
    if (MODE == MODE_DQ) {
        __syncthreads();
        int Q = a.n_blocks * a.B;
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int qr = warp + QWARPS * rr;
            if (qr >= NR) continue;
            int t = t_a + qr / group, h = hk * group + qr % group;
            const bf16 *orow = a.o + ((size_t)t * H + h) * d;
            float s = 0.0f;
            for (int x = lane; x < d; x += 32)
                s += dOs[qr * d + x] * __bfloat162float(orow[x]);
            rD[rr] = warp_sum_a(s);
            rlse[rr] = a.lse_in[(size_t)h * Q + t];
        }
    }

    for (int r = 0; r < nr; r++) {
        int r0 = rng[2 * r], r1 = rng[2 * r + 1];
        for (int kb = r0; kb < r1; kb += KTILE) {
            __syncthreads();
            for (int idx = threadIdx.x; idx < KTILE * d; idx += blockDim.x) {
                int j = idx / d, x = idx % d, key = kb + j;
                float kv = 0.0f, vv = 0.0f;
                if (key < r1) {
                    size_t off = ((size_t)key * Hk + hk) * d + x;
                    kv = __bfloat162float(a.k[off]);
                    vv = __bfloat162float(a.v[off]);
                }
                Ks[j * dp1 + x] = kv;
                Vs[j * dp1 + x] = vv;
            }
            __syncthreads();
            /* scores (and dP) of key kb + lane for each row of this warp */
            float s[RPW], dpv[RPW];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++)
                s[rr] = 0.0f, dpv[rr] = 0.0f;
            const float *krow = Ks + lane * dp1, *vrow = Vs + lane * dp1;
            for (int x = 0; x < d; x++) {
                float kx = krow[x];
                float vx = MODE == MODE_DQ ? vrow[x] : 0.0f;
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
                    int qr = warp + QWARPS * rr;
                    s[rr] += Qs[qr * d + x] * kx;
                    if (MODE == MODE_DQ) dpv[rr] += dOs[qr * d + x] * vx;
                }
            }
            int key = kb + lane;
            float pv[RPW];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                int qr = warp + QWARPS * rr;
                bool vis = qr < NR && key < r1 && key >= kbeg[rr] && key < kend[rr];
                if (MODE == MODE_DQ) {
                    float p = vis && isfinite(rlse[rr]) ? expf(s[rr] * a.scale - rlse[rr]) : 0.0f;
                    pv[rr] = p * (dpv[rr] - rD[rr]) * a.scale; /* dS */
                } else {
                    float sc = vis ? s[rr] * a.scale : -INFINITY;
                    float tmax = warp_max(sc);
                    if (tmax == -INFINITY) {
                        pv[rr] = 0.0f;
                        continue;
                    }
                    float mn = fmaxf(m[rr], tmax);
                    float corr = expf(m[rr] - mn);
                    float p = expf(sc - mn);
                    l[rr] = l[rr] * corr + p;
                    m[rr] = mn;
#pragma unroll
                    for (int i = 0; i < DPL; i++)
                        acc[rr][i] *= corr;
                    pv[rr] = p;
                }
            }
            /* acc[rr][x] += sum_j pv_j * (V or K)[j][x], x = lane + 32 i */
            const float *src = MODE == MODE_DQ ? Ks : Vs;
            for (int j = 0; j < KTILE; j++) {
                float col[DPL];
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    int x = lane + 32 * i;
                    col[i] = x < d ? src[j * dp1 + x] : 0.0f;
                }
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
                    float pj = __shfl_sync(0xffffffffu, pv[rr], j);
#pragma unroll
                    for (int i = 0; i < DPL; i++)
                        acc[rr][i] += pj * col[i];
                }
            }
        }
    }

    /* write the rows */
    int Q = a.n_blocks * a.B;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int qr = warp + QWARPS * rr;
        if (qr >= NR) continue;
        int t = t_a + qr / group, h = hk * group + qr % group;
        bf16 *orow = a.out + ((size_t)t * H + h) * d;
        float inv = 1.0f, lse = INFINITY;
        if (MODE != MODE_DQ) {
            float lt = warp_sum_a(l[rr]);
            if (lt > 0.0f)
                inv = 1.0f / lt, lse = m[rr] + logf(lt);
            else
                inv = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int x = lane + 32 * i;
            if (x < d) orow[x] = __float2bfloat16(acc[rr][i] * inv);
        }
        if (MODE == MODE_BLOCK && a.lse && lane == 0) a.lse[(size_t)h * Q + t] = lse;
    }
}

static size_t kv_smem(int d) {
    return (2 * KTILE * (size_t)(d + 1) + 2 * KVROWS * (size_t)d + 2 * KVROWS * (KTILE + 1) +
            2 * KVROWS) *
           sizeof(float);
}

template <int MAXD>
__global__ void __launch_bounds__(128) k_attn_kv(attn_args a, bf16 *dk_out, bf16 *dv_out) {
    constexpr int DPT = MAXD / 4; /* dims per thread of the dk/dv accumulators */
    extern __shared__ float smem[];
    const int d = a.d, dp1 = d + 1, group = a.group, H = a.H, Hk = a.Hk, B = a.B;
    const int Q = a.n_blocks * B;
    float *Ks = smem;             /* [KTILE][d+1] */
    float *Vs = Ks + KTILE * dp1; /* [KTILE][d+1] */
    float *Qs = Vs + KTILE * dp1; /* [KVROWS][d] */
    float *dOs = Qs + KVROWS * d; /* [KVROWS][d] */
    float *Ps = dOs + KVROWS * d; /* [KVROWS][KTILE+1] */
    float *dSs = Ps + KVROWS * (KTILE + 1);
    float *Ds = dSs + KVROWS * (KTILE + 1); /* [KVROWS] */
    float *Ls = Ds + KVROWS;                /* [KVROWS] */
    const int hk = blockIdx.y, kt0 = blockIdx.x * KTILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int idx = threadIdx.x; idx < KTILE * d; idx += blockDim.x) {
        int j = idx / d, x = idx % d, key = kt0 + j;
        float kv = 0.0f, vv = 0.0f;
        if (key < a.Tk) {
            size_t off = ((size_t)key * Hk + hk) * d + x;
            kv = __bfloat162float(a.k[off]);
            vv = __bfloat162float(a.v[off]);
        }
        Ks[j * dp1 + x] = kv;
        Vs[j * dp1 + x] = vv;
    }
    float dk[DPT], dv[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++)
        dk[i] = 0.0f, dv[i] = 0.0f;

    const int NRB = B * group;
    for (int blk = 0; blk < a.n_blocks; blk++) {
        int rng[4];
        int nr = attn_span_ranges(a.spans + blk, B, rng);
        bool hit = false, kvis = false; /* kvis: this thread's key (lane) is seen */
        for (int r = 0; r < nr; r++) {
            if (rng[2 * r] < kt0 + KTILE && rng[2 * r + 1] > kt0) hit = true;
            int key = kt0 + lane;
            if (key >= rng[2 * r] && key < rng[2 * r + 1]) kvis = true;
        }
        if (!hit) continue; /* uniform over the CTA */
        for (int c0 = 0; c0 < NRB; c0 += KVROWS) {
            int nrows = min(KVROWS, NRB - c0);
            __syncthreads(); /* previous chunk's readers are done */
            for (int idx = threadIdx.x; idx < KVROWS * d; idx += blockDim.x) {
                int r = idx / d, x = idx % d;
                float qv = 0.0f, ov = 0.0f;
                if (r < nrows) {
                    int qr = c0 + r;
                    int t = blk * B + qr / group, h = hk * group + qr % group;
                    size_t off = ((size_t)t * H + h) * d + x;
                    qv = __bfloat162float(a.q[off]);
                    ov = __bfloat162float(a.dout[off]);
                }
                Qs[r * d + x] = qv;
                dOs[r * d + x] = ov;
            }
            __syncthreads();
            for (int r = warp; r < KVROWS; r += 4) { /* D and lse of each row */
                float s = 0.0f, L = INFINITY;
                if (r < nrows) {
                    int qr = c0 + r;
                    int t = blk * B + qr / group, h = hk * group + qr % group;
                    const bf16 *orow = a.o + ((size_t)t * H + h) * d;
                    for (int x = lane; x < d; x += 32)
                        s += dOs[r * d + x] * __bfloat162float(orow[x]);
                    L = a.lse_in[(size_t)h * Q + t];
                }
                s = warp_sum_a(s);
                if (lane == 0) Ds[r] = s, Ls[r] = L;
            }
            __syncthreads();
            /* S and dP: thread (key = lane, rows warp + 4 i) */
            const float *krow = Ks + lane * dp1, *vrow = Vs + lane * dp1;
#pragma unroll
            for (int i = 0; i < KVROWS / 4; i++) {
                int r = warp + 4 * i;
                float s = 0.0f, dp = 0.0f;
                for (int x = 0; x < d; x++) {
                    s += Qs[r * d + x] * krow[x];
                    dp += dOs[r * d + x] * vrow[x];
                }
                float L = Ls[r];
                float p = (r < nrows && kvis && kt0 + lane < a.Tk && isfinite(L))
                              ? expf(s * a.scale - L)
                              : 0.0f;
                Ps[r * (KTILE + 1) + lane] = p;
                dSs[r * (KTILE + 1) + lane] = p * (dp - Ds[r]) * a.scale;
            }
            __syncthreads();
            /* dv[key][x] += sum_r P[r][key] dO[r][x], dk[key][x] += sum_r dS[r][key] Q[r][x],
             * x = warp + 4 i */
            for (int r = 0; r < nrows; r++) {
                float p = Ps[r * (KTILE + 1) + lane], ds = dSs[r * (KTILE + 1) + lane];
#pragma unroll
                for (int i = 0; i < DPT; i++) {
                    int x = warp + 4 * i;
                    if (x < d) {
                        dv[i] += p * dOs[r * d + x];
                        dk[i] += ds * Qs[r * d + x];
                    }
                }
            }
        }
    }
    /* transpose through shared memory for coalesced stores */
    __syncthreads();
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int x = warp + 4 * i;
        if (x < d) Ks[lane * dp1 + x] = dk[i], Vs[lane * dp1 + x] = dv[i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < KTILE * d; idx += blockDim.x) {
        int j = idx / d, x = idx % d, key = kt0 + j;
        if (key < a.Tk) {
            size_t off = ((size_t)key * Hk + hk) * d + x;
            dk_out[off] = __float2bfloat16(Ks[j * dp1 + x]);
            dv_out[off] = __float2bfloat16(Vs[j * dp1 + x]);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* launchers */

template <int MODE> static void launch_q(cudaStream_t st, const attn_args &a, dim3 grid) {
    size_t sm = q_smem(a.d, MODE);
    if (a.d <= 32)
        k_attn_q<32, MODE><<<grid, QWARPS * 32, sm, st>>>(a);
    else if (a.d <= 64)
        k_attn_q<64, MODE><<<grid, QWARPS * 32, sm, st>>>(a);
    else if (a.d <= 128)
        k_attn_q<128, MODE><<<grid, QWARPS * 32, sm, st>>>(a);
    else
        k_attn_q<256, MODE><<<grid, QWARPS * 32, sm, st>>>(a);
    CUDA_CHECK_LAUNCH();
}

static void launch_kv(cudaStream_t st, const attn_args &a, dim3 grid, bf16 *dk, bf16 *dv) {
    size_t sm = kv_smem(a.d);
    if (a.d <= 32)
        k_attn_kv<32><<<grid, 128, sm, st>>>(a, dk, dv);
    else if (a.d <= 64)
        k_attn_kv<64><<<grid, 128, sm, st>>>(a, dk, dv);
    else if (a.d <= 128)
        k_attn_kv<128><<<grid, 128, sm, st>>>(a, dk, dv);
    else
        k_attn_kv<256><<<grid, 128, sm, st>>>(a, dk, dv);
    CUDA_CHECK_LAUNCH();
}

template <int MAXD, int MODE> static int set_q_attr(void) {
    return cudaFuncSetAttribute(k_attn_q<MAXD, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)q_smem(MAXD, MODE)) != cudaSuccess;
}

template <int MAXD> static int set_kv_attr(void) {
    return cudaFuncSetAttribute(k_attn_kv<MAXD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)kv_smem(MAXD)) != cudaSuccess;
}

int cuda_attention_init(void) {
    int bad = 0;
    bad |= set_q_attr<32, MODE_CAUSAL>() | set_q_attr<64, MODE_CAUSAL>() |
           set_q_attr<128, MODE_CAUSAL>() | set_q_attr<256, MODE_CAUSAL>();
    bad |= set_q_attr<32, MODE_BLOCK>() | set_q_attr<64, MODE_BLOCK>() |
           set_q_attr<128, MODE_BLOCK>() | set_q_attr<256, MODE_BLOCK>();
    bad |= set_q_attr<32, MODE_DQ>() | set_q_attr<64, MODE_DQ>() | set_q_attr<128, MODE_DQ>() |
           set_q_attr<256, MODE_DQ>();
    bad |= set_kv_attr<32>() | set_kv_attr<64>() | set_kv_attr<128>() | set_kv_attr<256>();
    cuda_attn_split_init();
    bad |= cuda_mma_attention_init() != 0;
    bad |= cuda_wg_attention_init() != 0;
    bad |= cuda_bwd_attention_init() != 0;
    return bad ? -1 : 0;
}

void cuda_attention_block_plan(int max_q, int max_tk, int H, int Hk, int d) {
    if (cuda_attn_split_plan(max_q, max_tk, H, Hk, d) != 0 ||
        cuda_bwd_attention_plan((size_t)max_q * H * d) != 0)
        fprintf(stderr, "ops_cuda: no memory for the attention backward's scratch at %d query "
                        "and %d key rows: larger steps take a slower path\n",
                max_q, max_tk);
}

static_assert(CUDA_ATTN_MAX_Q_PER_KV <= QROWS, "a group of query heads fits a tile");

/* nn_ops_check_heads refused other shapes when the model was made */
static void check_heads(int H, int Hk, int d) {
    assert(Hk > 0 && H % Hk == 0 && H / Hk <= CUDA_ATTN_MAX_Q_PER_KV);
    assert(d > 0 && d <= CUDA_ATTN_MAX_HEAD_DIM && d % 2 == 0);
    (void)H, (void)Hk, (void)d;
}

void cuda_attention_causal_fwd(cudaStream_t st, bf16 *out, const bf16 *q, const bf16 *k,
                               const bf16 *v, const int32_t *seq_off, int n_seqs, int T, int H,
                               int Hk, int d) {
    check_heads(H, Hk, d);
    if (T <= 0) return;
    if (cuda_attn_mode() >= ATTN_MMA &&
        cuda_wg_attention_causal_fwd(st, out, q, k, v, seq_off, n_seqs, T, H, Hk, d) == 0)
        return;
    if (cuda_attn_mode() >= ATTN_MMA && cuda_mma_attention_fwd(st, out, NULL, q, k, v, seq_off,
                                                               n_seqs, T, NULL, 0, 0, T, H, Hk,
                                                               d) == 0)
        return;
    if (n_seqs <= 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)T * H * d * sizeof(bf16), st));
        return;
    }
    attn_args a = {};
    a.out = out, a.q = q, a.k = k, a.v = v, a.seq_off = seq_off, a.n_seqs = n_seqs;
    a.T = T, a.Tk = T, a.H = H, a.Hk = Hk, a.d = d, a.group = H / Hk;
    a.RT = QROWS / a.group;
    a.scale = 1.0f / sqrtf((float)d);
    dim3 grid((T + a.RT - 1) / a.RT, Hk);
    launch_q<MODE_CAUSAL>(st, a, grid);
}

static attn_args block_args(const nn_block_span *spans, int n_blocks, int B, int Tk, int H, int Hk,
                            int d) {
    attn_args a = {};
    a.spans = spans, a.n_blocks = n_blocks, a.B = B;
    a.T = n_blocks * B, a.Tk = Tk, a.H = H, a.Hk = Hk, a.d = d, a.group = H / Hk;
    a.RT = QROWS / a.group < B ? QROWS / a.group : B;
    a.tiles_per_block = (B + a.RT - 1) / a.RT;
    a.scale = 1.0f / sqrtf((float)d);
    return a;
}

void cuda_attention_block_fwd(cudaStream_t st, bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                              const bf16 *v, const nn_block_span *spans, int n_blocks, int B,
                              int Tk, int H, int Hk, int d) {
    check_heads(H, Hk, d);
    if (n_blocks <= 0 || B <= 0) return;
    if (cuda_attn_mode() >= ATTN_MMA && cuda_wg_attention_block_fwd(st, out, lse, q, k, v, spans,
                                                                    n_blocks, B, Tk, H, Hk,
                                                                    d) == 0)
        return;
    if (cuda_attn_mode() >= ATTN_MMA && cuda_mma_attention_fwd(st, out, lse, q, k, v, NULL, 0, 0,
                                                               spans, n_blocks, B, Tk, H, Hk,
                                                               d) == 0)
        return;
    attn_args a = block_args(spans, n_blocks, B, Tk, H, Hk, d);
    a.out = out, a.lse = lse, a.q = q, a.k = k, a.v = v;
    dim3 grid(n_blocks * a.tiles_per_block, Hk);
    launch_q<MODE_BLOCK>(st, a, grid);
}

void cuda_attention_block_bwd(cudaStream_t st, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                              const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                              const float *lse, const nn_block_span *spans, int n_blocks, int B,
                              int Tk, int H, int Hk, int d) {
    check_heads(H, Hk, d);
    assert(lse);
    if (Tk > 0 && (n_blocks <= 0 || B <= 0)) {
        CUDA_CHECK(cudaMemsetAsync(dk, 0, (size_t)Tk * Hk * d * sizeof(bf16), st));
        CUDA_CHECK(cudaMemsetAsync(dv, 0, (size_t)Tk * Hk * d * sizeof(bf16), st));
        return;
    }
    if (n_blocks <= 0 || B <= 0) return;
    if (cuda_tensor_attention_block_bwd(st, dq, dk, dv, dout, q, k, v, out, lse, spans, n_blocks,
                                        B, Tk, H, Hk, d) == 0)
        return;
    attn_args a = block_args(spans, n_blocks, B, Tk, H, Hk, d);
    a.out = dq, a.q = q, a.k = k, a.v = v, a.dout = dout, a.o = out, a.lse_in = lse;
    dim3 gq(n_blocks * a.tiles_per_block, Hk);
    launch_q<MODE_DQ>(st, a, gq);
    if (Tk > 0) {
        dim3 gk((Tk + KTILE - 1) / KTILE, Hk);
        launch_kv(st, a, gk, dk, dv);
    }
}

/* ops_cuda_norm: the cuda backend's normalisations, with their kernels: RMSNorm (ops.h
 * rmsnorm_fwd, rmsnorm_bwd), the RoPE table (rope_table) and per-head RMSNorm + RoPE
 * (head_norm_rope_fwd, head_norm_rope_bwd; the target's qkv_norm_rope_fwd).
 *
 * Choices where ops.h leaves room (matching ops_cpu.c): RMSNorm's rstd may be NULL in backward
 * (recomputed with eps 1e-6), and its dw sums go through c->stage in a fixed order where rstd is
 * given; rope_table's angles are (float)pos * inv_freq, their cos and sin from sincosf.
 *
 * Streams: every op queues its kernels on c->stream; rmsnorm_bwd's dw sums through c->stage run
 * on the main stream only (MAIN_STREAM_ONLY). nn_cuda_new raises the pipelined kernels'
 * shared-memory limits once per context (cu_norm_pipe_attrs). Called through the vtable
 * (ops_cuda.cu) by the host thread that owns the context.
 */
#include "ops_cuda_ctx.cuh"

#include "cp_async.cuh"
#include "cuda_elem.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <stdint.h>

/* RMSNorm: one warp per row. out = bf16(bf16(x * rstd) * w) (HF Qwen3RMSNorm). */

/* vec: C % 8 == 0 and every row 16-byte aligned: each lane reads 8 elements at a time (the
 * sum of squares is then added in another order than the scalar loop's: same accuracy, other
 * last bits). */
__global__ void k_rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int R, int C,
                              float eps, int vec) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *xr = x + (size_t)r * C;
    bf16 *orow = out + (size_t)r * C;
    float ss = 0.0f;
    if (vec) {
        for (int i = lane * 8; i < C; i += 256) {
            float v[8];
            load8(xr + i, v);
#pragma unroll
            for (int k = 0; k < 8; k++)
                ss += v[k] * v[k];
        }
    } else {
        for (int i = lane; i < C; i += 32) {
            float v = __bfloat162float(xr[i]);
            ss += v * v;
        }
    }
    ss = warp_sum(ss);
    float rs = rsqrtf(ss / (float)C + eps);
    if (rstd && lane == 0) rstd[r] = rs;
    if (vec) {
        for (int i = lane * 8; i < C; i += 256) {
            float v[8], g[8];
            load8(xr + i, v);
            load8(w + i, g);
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = __bfloat162float(__float2bfloat16(v[k] * rs)) * g[k];
            store8(orow + i, v);
        }
        return;
    }
    for (int i = lane; i < C; i += 32) {
        float n = __bfloat162float(__float2bfloat16(__bfloat162float(xr[i]) * rs));
        orow[i] = __float2bfloat16(n * __bfloat162float(w[i]));
    }
}

/* The one-pass row kernels (k_rmsnorm_fwd_pipe, k_rmsnorm_bwd_pipe), for rows of C = 8 *
 * blockDim.x (a multiple of 256, at most 8192) and 16-byte aligned rows: thread t owns columns
 * 8t .. 8t + 7 of rows blockIdx.x, + gridDim.x, ..., keeps w in registers and reads each element
 * once; the block adds the row's sums. Each thread's 16 bytes of its next NORM_STAGES - 1 rows
 * are already on their way into shared memory (cp.async, one commit group per row), so a block
 * keeps rows in flight through its reductions and stores; a thread reads back only the bytes
 * it copied (no barrier for the data). Shared memory: NORM_STAGES x arrays x C x 2 bytes. Against
 * loading each row after the last one's store: the forward 8% faster in the drafter's step, the
 * backward the same (bench/cuda_ops/NOTES.md, "RMSNorm rows ahead"). */
#define NORM_STAGES 4

/* Row stage s: the thread's 16 bytes at `at` of each of the N arrays, when ok; one commit group
 * either way, so that there is one group per row. */
template <int N>
static __device__ __forceinline__ void norm_stage_issue(uint4 *stg, int s, const bf16 *const *a,
                                                        size_t at, bool ok) {
    const int nt = blockDim.x, t = threadIdx.x;
    if (ok)
#pragma unroll
        for (int k = 0; k < N; k++)
            cp_async16(&stg[(s * N + k) * nt + t], a[k] + at, 16);
    cp_commit();
}

/* Array k of row stage s, as 8 floats. */
template <int N>
static __device__ __forceinline__ void norm_stage_read(const uint4 *stg, int s, int k, float f[8]) {
    load8(reinterpret_cast<const bf16 *>(&stg[(s * N + k) * blockDim.x + threadIdx.x]), f);
}

/* out = rmsnorm(x) * w, rstd saved when not NULL; out may equal x (a row is read before it
 * is stored; the rows ahead are other rows) */
__global__ void __launch_bounds__(1024) k_rmsnorm_fwd_pipe(bf16 *out, float *rstd, const bf16 *x,
                                                           const bf16 *w, int R, int C, float eps) {
    extern __shared__ uint4 stg[];
    __shared__ float part[32];
    int t = threadIdx.x, lane = t % 32, warp = t / 32, nwarps = blockDim.x / 32, col = 8 * t;
    const int g = gridDim.x;
    float gw[8];
    load8(w + col, gw);
    for (int k = 0; k < NORM_STAGES - 1; k++) {
        int r = blockIdx.x + k * g;
        norm_stage_issue<1>(stg, k, &x, (size_t)r * C + col, r < R);
    }
    for (int r = blockIdx.x, s = 0; r < R; r += g, s = (s + 1) % NORM_STAGES) {
        int ra = r + (NORM_STAGES - 1) * g; /* into the stage this thread read last */
        norm_stage_issue<1>(stg, (s + NORM_STAGES - 1) % NORM_STAGES, &x, (size_t)ra * C + col,
                            ra < R);
        cp_wait<NORM_STAGES - 1>(); /* row r's group */
        float v[8], ss = 0.0f;
        norm_stage_read<1>(stg, s, 0, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            ss += v[k] * v[k];
        ss = warp_sum(ss);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        ss = 0.0f;
        for (int i = 0; i < nwarps; i++)
            ss += part[i];
        __syncthreads(); /* part is rewritten by the next row */
        float rs = rsqrtf(ss / (float)C + eps);
        if (rstd && t == 0) rstd[r] = rs;
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = __bfloat162float(__float2bfloat16(v[k] * rs)) * gw[k];
        store8(out + (size_t)r * C + col, v);
    }
    cp_wait<0>();
}

/* Blocks for a grid-stride kernel k over n items, one item per block at least: one wave (SMs
 * x the blocks of `threads` threads and smem dynamic bytes that fit on one), or n. */
template <typename K> static int wave_grid(nn_ctx *c, K k, int threads, size_t smem, int n) {
    int per_sm = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, smem) != cudaSuccess ||
        per_sm < 1)
        per_sm = 1;
    return c->sms * per_sm < n ? c->sms * per_sm : n;
}

void cu_rmsnorm_fwd(nn_ctx *c, nn_buf *out, float *rstd, const nn_buf *x, const nn_buf *w, int R,
                    int C, float eps) {
    assert(R >= 0 && C > 0);
    if (R == 0) return;
    if (C % 256 == 0 && C <= 8192 && vec_ok(out, x, w)) {
        size_t smem = (size_t)NORM_STAGES * C * sizeof(bf16);
        k_rmsnorm_fwd_pipe<<<wave_grid(c, k_rmsnorm_fwd_pipe, C / 8, smem, R), C / 8, smem,
                             c->stream>>>((bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)w, R,
                                          C, eps);
        CUDA_CHECK_LAUNCH();
        return;
    }
    int vec = C % 8 == 0 && vec_ok(out, x, w);
    k_rmsnorm_fwd<<<(R + 7) / 8, 256, 0, c->stream>>>((bf16 *)out, rstd, (const bf16 *)x,
                                                      (const bf16 *)w, R, C, eps, vec);
    CUDA_CHECK_LAUNCH();
}

/* dx = rs * (dy*w - xhat * mean(dy*w*xhat)) (+ dres), xhat = x*rs (fp32). One warp per row. dx
 * may equal dy or dres: each lane reads its elements before writing them. */
template <bool VEC>
__global__ void k_rmsnorm_bwd_dx(bf16 *dx, const bf16 *dy, const bf16 *x, const bf16 *w,
                                 const float *rstd, int R, int C, const bf16 *dres) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= R) return;
    const bf16 *xr = x + (size_t)r * C, *dyr = dy + (size_t)r * C;
    const bf16 *dr = dres ? dres + (size_t)r * C : NULL;
    bf16 *dxr = dx + (size_t)r * C;
    float rs;
    if (rstd)
        rs = rstd[r];
    else {
        float ss = 0.0f;
        for (int i = lane; i < C; i += 32) {
            float v = __bfloat162float(xr[i]);
            ss += v * v;
        }
        rs = rsqrtf(warp_sum(ss) / (float)C + 1e-6f);
    }
    float dot = 0.0f;
    if constexpr (VEC) { /* 8 elements per lane and load, as k_rmsnorm_fwd's vector path */
        for (int i = lane * 8; i < C; i += 256) {
            float g[8], wv[8], xv[8];
            load8(dyr + i, g), load8(w + i, wv), load8(xr + i, xv);
#pragma unroll
            for (int e = 0; e < 8; e++)
                dot += g[e] * wv[e] * xv[e] * rs;
        }
        float mean = warp_sum(dot) / (float)C;
        for (int i = lane * 8; i < C; i += 256) {
            float g[8], wv[8], xv[8], o[8], res[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            load8(dyr + i, g), load8(w + i, wv), load8(xr + i, xv);
            if (dr) load8(dr + i, res);
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[e] = rs * (g[e] * wv[e] - xv[e] * rs * mean) + res[e];
            store8(dxr + i, o);
        }
    } else {
        for (int i = lane; i < C; i += 32)
            dot += __bfloat162float(dyr[i]) * __bfloat162float(w[i]) * __bfloat162float(xr[i]) *
                   rs;
        float mean = warp_sum(dot) / (float)C;
        for (int i = lane; i < C; i += 32) {
            float xv = __bfloat162float(xr[i]);
            float v = rs * (__bfloat162float(dyr[i]) * __bfloat162float(w[i]) - xv * rs * mean);
            dxr[i] = __float2bfloat16(v + (dr ? __bfloat162float(dr[i]) : 0.0f));
        }
    }
}

/* dw[c] += sum over a chunk of rows of dy * x * rs: thread per column, blockIdx.y per chunk. */
__global__ void k_rmsnorm_bwd_dw(float *dw, const bf16 *dy, const bf16 *x, const float *rstd, int R,
                                 int C) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(R, r0 + COLSUM_ROWS);
    float s = 0.0f;
    for (int r = r0; r < r1; r++) {
        float xv = __bfloat162float(x[(size_t)r * C + col]);
        float rs;
        if (rstd)
            rs = rstd[r];
        else {
            float ss = 0.0f; /* slow path, only when the caller kept no rstd */
            for (int i = 0; i < C; i++) {
                float v = __bfloat162float(x[(size_t)r * C + i]);
                ss += v * v;
            }
            rs = rsqrtf(ss / (float)C + 1e-6f);
        }
        s += __bfloat162float(dy[(size_t)r * C + col]) * xv * rs;
    }
    atomicAdd(dw + col, s);
}

/* dx (+ dres where RES) and dw in one pass with rstd saved: each thread sums its columns' dw over
 * the block's rows in registers and stores them to dw_part[block, C] at the end, which
 * k_norm_dw_sum adds into dw (when dw is wanted). dx may equal dy or dres (a row is read before
 * its dx is stored; the rows ahead are other rows). rstd comes NORM_STAGES - 1 rows ahead into a
 * register ring, and the warps' partial dots are double-buffered so that a row needs one barrier.
 * Against one atomicAdd per column and block into dw (all blocks added the same C columns at once
 * at their end: the drain took ~28% of ncu's stall samples, the rstd load of the row's own
 * iteration 27%): 91-112 -> 62 us per launch at 8192 x 4096, 2.35 -> 1.65 ms per 2 drafter
 * steps (H200; bench/cuda_ops/NOTES.md, "RMSNorm's backward without the dw atomics"). */
template <bool RES>
__global__ void __launch_bounds__(1024) k_rmsnorm_bwd_pipe(bf16 *dx, float *dw_part,
                                                           const bf16 *dy, const bf16 *x,
                                                           const bf16 *w, const float *rstd,
                                                           int R, int C, const bf16 *dres) {
    constexpr int N = RES ? 3 : 2;
    extern __shared__ uint4 stg[];
    __shared__ float part[2][32];
    const bf16 *const src[3] = {dy, x, dres};
    int t = threadIdx.x, lane = t % 32, warp = t / 32, nwarps = blockDim.x / 32, col = 8 * t;
    const int g = gridDim.x;
    float wv[8], acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, rq[NORM_STAGES - 1];
    load8(w + col, wv);
    for (int k = 0; k < NORM_STAGES - 1; k++) {
        int r = blockIdx.x + k * g;
        norm_stage_issue<N>(stg, k, src, (size_t)r * C + col, r < R);
    }
#pragma unroll
    for (int k = 0; k < NORM_STAGES - 1; k++) {
        int r = blockIdx.x + k * g;
        rq[k] = r < R ? rstd[r] : 0.0f;
    }
    for (int r = blockIdx.x, s = 0, p = 0; r < R; r += g, s = (s + 1) % NORM_STAGES, p ^= 1) {
        int ra = r + (NORM_STAGES - 1) * g; /* into the stage this thread read last */
        const float rs = rq[0];
#pragma unroll
        for (int k = 0; k < NORM_STAGES - 2; k++)
            rq[k] = rq[k + 1];
        rq[NORM_STAGES - 2] = ra < R ? rstd[ra] : 0.0f;
        norm_stage_issue<N>(stg, (s + NORM_STAGES - 1) % NORM_STAGES, src, (size_t)ra * C + col,
                            ra < R);
        cp_wait<NORM_STAGES - 1>(); /* row r's group */
        float gv[8], xv[8], res[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dot = 0.0f;
        norm_stage_read<N>(stg, s, 0, gv);
        norm_stage_read<N>(stg, s, 1, xv);
        if (RES) norm_stage_read<N>(stg, s, 2, res);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            xv[e] *= rs; /* xhat */
            acc[e] += gv[e] * xv[e];
            dot += gv[e] * wv[e] * xv[e];
        }
        dot = warp_sum(dot);
        if (lane == 0) part[p][warp] = dot; /* part[p] is next written two rows on */
        __syncthreads();
        float mean = 0.0f;
        for (int i = 0; i < nwarps; i++)
            mean += part[p][i];
        mean /= (float)C;
#pragma unroll
        for (int e = 0; e < 8; e++)
            gv[e] = rs * (gv[e] * wv[e] - xv[e] * mean) + res[e];
        store8(dx + (size_t)r * C + col, gv);
    }
    cp_wait<0>();
    if (dw_part) {
        float4 *o = reinterpret_cast<float4 *>(dw_part + (size_t)blockIdx.x * C + col);
        o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}

/* dw[c] += the sum over b < G of part[b, c], in a fixed order (the same bits every run): a block
 * of 256 threads takes 32 columns, its 8 warps every 8th b, then warp 0 adds the 8 sums. */
__global__ void __launch_bounds__(256) k_norm_dw_sum(float *dw, const float *part, int G, int C) {
    __shared__ float sum[8][32];
    const int lane = threadIdx.x % 32, g = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
    float s = 0.0f;
#pragma unroll 4
    for (int b = g; b < G; b += 8)
        s += part[(size_t)b * C + c];
    sum[g][lane] = s;
    __syncthreads();
    if (g == 0) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++)
            t += sum[k][lane];
        dw[c] += t;
    }
}

/* The pipelined backward and, with dw, its column sum (the partials in c->stage). */
static void norm_bwd_pipe_launch(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy,
                                 const nn_buf *x, const nn_buf *w, const float *rstd, int R, int C,
                                 const nn_buf *dres) {
    const size_t smem = (size_t)NORM_STAGES * (dres ? 3 : 2) * C * sizeof(bf16);
    const int G = dres ? wave_grid(c, k_rmsnorm_bwd_pipe<true>, C / 8, smem, R)
                       : wave_grid(c, k_rmsnorm_bwd_pipe<false>, C / 8, smem, R);
    float *part = NULL;
    if (dw) {
        MAIN_STREAM_ONLY(c); /* the partial sums go to c->stage */
        assert((size_t)G * C <= STAGE_FLOATS);
        part = c->stage;
    }
    if (dres)
        k_rmsnorm_bwd_pipe<true><<<G, C / 8, smem, c->stream>>>(
            (bf16 *)dx, part, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rstd, R, C,
            (const bf16 *)dres);
    else
        k_rmsnorm_bwd_pipe<false><<<G, C / 8, smem, c->stream>>>(
            (bf16 *)dx, part, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rstd, R, C,
            NULL);
    CUDA_CHECK_LAUNCH();
    if (part) {
        k_norm_dw_sum<<<C / 32, 256, 0, c->stream>>>(dw, part, G, C);
        CUDA_CHECK_LAUNCH();
    }
}

/* The pipelined kernels may take the shared memory of rows of up to 8192 on the current device
 * (nn_cuda_new, once per context, as the attention kernels' limits) */
bool cu_norm_pipe_attrs(void) {
    const int row = 8192 * (int)sizeof(bf16);
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    return cudaFuncSetAttribute(k_rmsnorm_fwd_pipe, a, NORM_STAGES * row) == cudaSuccess &&
           cudaFuncSetAttribute(k_rmsnorm_bwd_pipe<false>, a, NORM_STAGES * 2 * row) ==
               cudaSuccess &&
           cudaFuncSetAttribute(k_rmsnorm_bwd_pipe<true>, a, NORM_STAGES * 3 * row) == cudaSuccess;
}

void cu_rmsnorm_bwd(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                    const nn_buf *w, const float *rstd, int R, int C, const nn_buf *dres) {
    assert(R >= 0 && C > 0);
    if (R == 0) return;
    if (rstd && C % 256 == 0 && C <= 8192 && vec_ok(dx, dy, x) &&
        vec_ok(w, w, dres ? dres : w)) {
        norm_bwd_pipe_launch(c, dx, dw, dy, x, w, rstd, R, C, dres);
        return;
    }
    if (dw) { /* before dx: dx may overwrite dy */
        dim3 g((C + 127) / 128, (R + COLSUM_ROWS - 1) / COLSUM_ROWS);
        assert(g.y <= 65535);
        k_rmsnorm_bwd_dw<<<g, 128, 0, c->stream>>>(dw, (const bf16 *)dy, (const bf16 *)x, rstd, R,
                                                   C);
        CUDA_CHECK_LAUNCH();
    }
    if (C % 8 == 0 && vec_ok(dx, dy, x) && vec_ok(w, w, dres ? dres : w))
        k_rmsnorm_bwd_dx<true><<<(R + 7) / 8, 256, 0, c->stream>>>(
            (bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rstd, R, C,
            (const bf16 *)dres);
    else
        k_rmsnorm_bwd_dx<false><<<(R + 7) / 8, 256, 0, c->stream>>>(
            (bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rstd, R, C,
            (const bf16 *)dres);
    CUDA_CHECK_LAUNCH();
}

/* ------------------------------------------------------------------------------------------ */
/* RoPE. rope_table fills rot[T, d] (ops.h: per token [cos | sin] of d/2 angles each) once per
 * batch, a block per token, with sincosf of (float)pos * inv_freq; the kernels below read their
 * tokens' rows (a few MB, from L2) instead of evaluating sincosf themselves, so every RoPE op of
 * a batch rotates by the very same values.
 * Per-head RMSNorm + RoPE, forward: one block per token. Vector path (d % 8 == 0, 16 <= d <=
 * 256, 32 % (d / 8) == 0, 16-byte aligned rows and table; so d is a power of two): a group of
 * L = d / 16 lanes owns a head row, lane j both columns of its RoPE pairs (8 j .. 8 j + 7 and
 * d / 2 + 8 j ..: the rotation needs no partner shuffle), and a lane loads its pairs' cos and
 * sin once per token (rope_lane: four 16-byte loads); the group reduces the sum of squares by
 * shuffles, so every lane of the warp runs every shuffle and only loads and stores are
 * predicated. Scalar path: a warp per row. Forward values: n = bf16(bf16(x rstd) w), then the
 * rotation on n (what rmsnorm then RoPE would give). Users: the drafter's q and k
 * (head_norm_rope_fwd/bwd) and the target's fused q|k|v split (qkv_norm_rope_fwd: rows past
 * the roped ones are v, copied). */

__global__ void k_rope_table(float *rot, const int32_t *pos, const float *inv_freq, int half) {
    float *r = rot + (size_t)blockIdx.x * 2 * half;
    const int32_t p = pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        sincosf((float)p * inv_freq[i], &r[half + i], &r[i]);
}

void cu_rope_table(nn_ctx *c, float *rot, const int32_t *pos, const float *inv_freq, int T, int d) {
    assert(T >= 0 && d > 0 && d % 2 == 0);
    if (T == 0) return;
    k_rope_table<<<T, d / 2 < 128 ? d / 2 : 128, 0, c->stream>>>(rot, pos, inv_freq, d / 2);
    CUDA_CHECK_LAUNCH();
}

/* The vector paths' lane share of one token's table row r: cs[e], sn[e] = the cos and sin of
 * angle i0 + e (i0 % 4 == 0, r 16-byte aligned). */
__device__ __forceinline__ void rope_lane(const float *r, int half, int i0, float cs[8],
                                          float sn[8]) {
    const float4 *c4 = reinterpret_cast<const float4 *>(r + i0);
    const float4 *s4 = reinterpret_cast<const float4 *>(r + half + i0);
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const float4 cv = __ldg(c4 + k), sv = __ldg(s4 + k);
        cs[4 * k] = cv.x, cs[4 * k + 1] = cv.y, cs[4 * k + 2] = cv.z, cs[4 * k + 3] = cv.w;
        sn[4 * k] = sv.x, sn[4 * k + 1] = sv.y, sn[4 * k + 2] = sv.z, sn[4 * k + 3] = sv.w;
    }
}

/* The sum of squares of a head row held as RoPE pairs (x1: a lane's columns 8 j .., x2: d / 2 +
 * 8 j ..) over its group of L lanes, in every lane: one contraction for the norm + RoPE forward
 * and backward, so that both compute the same rstd. */
__device__ __forceinline__ float pairs_sumsq(const float x1[8], const float x2[8], int L) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++)
        ss = fmaf(x1[e], x1[e], fmaf(x2[e], x2[e], ss));
    return group_sum(ss, L);
}

/* One token's head rows [0, rows) of src (d each), rotated by its table row rot: row r goes to
 * dst_of(r), normed with w_of(r) (none when NULL) and rotated when r < roped, copied
 * otherwise. */
template <bool VEC, typename Dst, typename Wt>
__device__ void norm_rope_rows(Dst dst_of, Wt w_of, const bf16 *src, const float *rot, int rows,
                               int roped, int d, float eps) {
    const int half = d / 2, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    if constexpr (VEC) {
        const int L = d / 16, per_warp = 32 / L, j = lane % L, c1 = 8 * j, c2 = half + 8 * j;
        const float inv_d = 1.0f / (float)d; /* exact: d is a power of two here */
        float cs[8], sn[8];                  /* of the lane's pairs c1 + e */
        rope_lane(rot, half, c1, cs, sn);
#pragma unroll 4
        for (int r0 = warp * per_warp; r0 < rows; r0 += nw * per_warp) {
            const int r = r0 + lane / L;
            const bool valid = r < rows, rot_row = r < roped;
            float x1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (valid) load8(src + (size_t)r * d + c1, x1), load8(src + (size_t)r * d + c2, x2);
            const float ss = pairs_sumsq(x1, x2, L);
            const bf16 *w = valid && rot_row ? w_of(r) : NULL;
            if (w) {
                float g1[8], g2[8], rs = rsqrtf(ss * inv_d + eps);
                load8(w + c1, g1), load8(w + c2, g2);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    x1[e] = __bfloat162float(__float2bfloat16(
                        __bfloat162float(__float2bfloat16(x1[e] * rs)) * g1[e]));
                    x2[e] = __bfloat162float(__float2bfloat16(
                        __bfloat162float(__float2bfloat16(x2[e] * rs)) * g2[e]));
                }
            }
            float o1[8], o2[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                o1[e] = rot_row ? fmaf(x2[e], -sn[e], x1[e] * cs[e]) : x1[e];
                o2[e] = rot_row ? fmaf(x1[e], sn[e], x2[e] * cs[e]) : x2[e];
            }
            if (valid) store8(dst_of(r) + c1, o1), store8(dst_of(r) + c2, o2);
        }
    } else {
        for (int r = warp; r < rows; r += nw) {
            const bf16 *x = src + (size_t)r * d;
            bf16 *o = dst_of(r);
            if (r >= roped) {
                for (int i = lane; i < d; i += 32)
                    o[i] = x[i];
                continue;
            }
            const bf16 *w = w_of(r);
            float rs = 1.0f;
            if (w) {
                float ss = 0.0f;
                for (int i = lane; i < d; i += 32) {
                    float f = __bfloat162float(x[i]);
                    ss += f * f;
                }
                rs = rsqrtf(warp_sum(ss) / (float)d + eps);
            }
            auto normed = [&](int i) -> float {
                float f = __bfloat162float(x[i]);
                if (!w) return f;
                return __bfloat162float(__float2bfloat16(
                    __bfloat162float(__float2bfloat16(f * rs)) * __bfloat162float(w[i])));
            };
            for (int i = lane; i < half; i += 32) {
                float x1 = normed(i), x2 = normed(i + half), cs = rot[i], sn = rot[half + i];
                o[i] = __float2bfloat16(x1 * cs - x2 * sn);
                o[i + half] = __float2bfloat16(x2 * cs + x1 * sn);
            }
        }
    }
}

/* The vector paths' condition on d (the rows' and the table's alignment are checked apart). */
static bool norm_rope_vec(int d) {
    return d % 8 == 0 && d >= 16 && d <= 256 && 32 % (d / 8) == 0;
}

template <bool VEC>
__global__ void k_head_norm_rope_fwd(bf16 *out, const bf16 *x, const bf16 *w, const float *rot,
                                     int nh, int d, float eps) {
    const int t = blockIdx.x;
    const size_t base = (size_t)t * nh * d;
    norm_rope_rows<VEC>([&](int r) { return out + base + (size_t)r * d; },
                        [&](int) { return w; }, x + base, rot + (size_t)t * d, nh, nh, d, eps);
}

void cu_head_norm_rope_fwd(nn_ctx *c, nn_buf *out, const nn_buf *x, const nn_buf *w,
                           const float *rot, int T, int nh, int d, float eps) {
    assert(T >= 0 && nh > 0 && d > 0 && d % 2 == 0);
    if (T == 0) return;
    if (norm_rope_vec(d) && vec_ok(out, x, w) && vec_ok(rot, rot, rot))
        k_head_norm_rope_fwd<true><<<T, 128, 0, c->stream>>>((bf16 *)out, (const bf16 *)x,
                                                             (const bf16 *)w, rot, nh, d, eps);
    else
        k_head_norm_rope_fwd<false><<<T, 128, 0, c->stream>>>((bf16 *)out, (const bf16 *)x,
                                                              (const bf16 *)w, rot, nh, d, eps);
    CUDA_CHECK_LAUNCH();
}

/* Backward, vector path only (d as above): each warp takes tokens in turn (grid-stride over
 * all warps), with no block barrier inside the loop. Lane j of a row's d / 16 lanes holds both
 * columns of its RoPE pairs, 8 j .. 8 j + 7 and d / 2 + 8 j .., so the rotation by -angle needs
 * no partner shuffle, and a warp takes 32 / (d / 16) head rows at a time; the lane loads its
 * pairs' cos and sin once per token (rope_lane) and keeps them in registers. Per head row: g =
 * the rotation by -angle of dy (fp32), rs from x, xhat = x rs, dx = rs (g w - xhat mean(g w
 * xhat)); each lane sums g xhat over its rows for its 16 columns, the block adds them in shared
 * memory and then into dw with one atomic per column. d is a power of two on this path
 * (norm_rope_vec), so the means multiply by the exact 1 / d. The kernel before it (a lane per 8
 * columns, the partner's by shuffles, 2 rows per warp at d 128; ncu: instruction- and
 * latency-bound) took 1.26 ms per 2 drafter steps against this one's 1.16 (H200, 7153511). */
__global__ void __launch_bounds__(128, 5)
    k_head_norm_rope_bwd_pairs(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const bf16 *w,
                               const float *rot, int T, int nh, int d, float eps) {
    extern __shared__ float dws[]; /* dw partial [d], then w [d] in fp32 */
    const int half = d / 2, L = d / 16, per_warp = 32 / L, lane = threadIdx.x % 32;
    const int nw = blockDim.x / 32, j = lane % L, c1 = 8 * j, c2 = half + 8 * j;
    const float inv_d = 1.0f / (float)d;
    float a1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float *ws = dws + d; /* w read per row (with 5 CTAs per SM: 96 registers, no spills) */
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        dws[i] = 0.0f, ws[i] = __bfloat162float(w[i]);
    __syncthreads();
    for (int t = blockIdx.x * nw + threadIdx.x / 32; t < T; t += gridDim.x * nw) {
        float cs[8], sn[8];
        rope_lane(rot + (size_t)t * d, half, c1, cs, sn);
        for (int r0 = 0; r0 < nh; r0 += per_warp) {
            const int r = r0 + lane / L;
            const bool valid = r < nh;
            const size_t off = ((size_t)t * nh + r) * d;
            float x1[8], x2[8], g1[8], g2[8];
            if (valid) {
                load8(x + off + c1, x1), load8(x + off + c2, x2);
                load8(dy + off + c1, g1), load8(dy + off + c2, g2);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    x1[e] = x2[e] = g1[e] = g2[e] = 0.0f;
            }
            const float rs = rsqrtf(pairs_sumsq(x1, x2, L) * inv_d + eps);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float a = g1[e], b = g2[e]; /* dy of the pair */
                g1[e] = fmaf(b, sn[e], a * cs[e]);
                g2[e] = fmaf(-a, sn[e], b * cs[e]);
            }
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                x1[e] *= rs, x2[e] *= rs; /* xhat */
                /* dw sums: 0 for invalid rows (x, dy read as 0) */
                a1[e] = fmaf(g1[e], x1[e], a1[e]), a2[e] = fmaf(g2[e], x2[e], a2[e]);
                g1[e] *= ws[c1 + e], g2[e] *= ws[c2 + e];
                dot = fmaf(g1[e], x1[e], fmaf(g2[e], x2[e], dot));
            }
            const float mean = group_sum(dot, L) * inv_d;
#pragma unroll
            for (int e = 0; e < 8; e++)
                g1[e] = rs * fmaf(-x1[e], mean, g1[e]), g2[e] = rs * fmaf(-x2[e], mean, g2[e]);
            if (valid) store8(dx + off + c1, g1), store8(dx + off + c2, g2);
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        atomicAdd(&dws[c1 + e], a1[e]), atomicAdd(&dws[c2 + e], a2[e]);
    __syncthreads();
    for (int i = threadIdx.x; i < d && dw; i += blockDim.x)
        atomicAdd(dw + i, dws[i]);
}

/* The scalar path: a warp per head row, dw by one atomic per element and row (slow; for head
 * dims the vector path does not take). */
__global__ void k_head_norm_rope_bwd_scalar(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x,
                                            const bf16 *w, const float *rot, int T, int nh, int d,
                                            float eps) {
    const int half = d / 2, lane = threadIdx.x % 32;
    const size_t rows = (size_t)T * nh;
    for (size_t r = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += (size_t)gridDim.x * blockDim.x / 32) {
        const bf16 *xr = x + r * d, *dyr = dy + r * d;
        const float *rr = rot + r / nh * d;
        float ss = 0.0f, dot = 0.0f;
        for (int i = lane; i < d; i += 32) {
            float f = __bfloat162float(xr[i]);
            ss += f * f;
        }
        const float rs = rsqrtf(warp_sum(ss) / (float)d + eps);
        auto grad = [&](int i, float *g1, float *g2) { /* the rotation by -angle of pair i */
            float cs = rr[i], sn = rr[half + i];
            float a = __bfloat162float(dyr[i]), b = __bfloat162float(dyr[i + half]);
            *g1 = a * cs + b * sn, *g2 = b * cs - a * sn;
        };
        for (int i = lane; i < half; i += 32) {
            float g1, g2;
            grad(i, &g1, &g2);
            dot += g1 * __bfloat162float(w[i]) * __bfloat162float(xr[i]) * rs +
                   g2 * __bfloat162float(w[i + half]) * __bfloat162float(xr[i + half]) * rs;
        }
        const float mean = warp_sum(dot) / (float)d;
        for (int i = lane; i < half; i += 32) {
            float g[2], xv[2] = {__bfloat162float(xr[i]), __bfloat162float(xr[i + half])};
            grad(i, &g[0], &g[1]);
            for (int k = 0; k < 2; k++) {
                int col = i + k * half;
                dx[r * d + col] =
                    __float2bfloat16(rs * (g[k] * __bfloat162float(w[col]) - xv[k] * rs * mean));
                if (dw) atomicAdd(dw + col, g[k] * xv[k] * rs);
            }
        }
    }
}

void cu_head_norm_rope_bwd(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
                           const nn_buf *w, const float *rot, int T, int nh, int d, float eps) {
    assert(T >= 0 && nh > 0 && d > 0 && d % 2 == 0);
    if (T == 0) return;
    if (norm_rope_vec(d) && vec_ok(dx, dy, x) && vec_ok(w, rot, rot)) {
        assert(d % 16 == 0 && 32 % (d / 16) == 0); /* every norm_rope_vec d is the kernel's */
        size_t smem = 2 * sizeof(float) * (size_t)d; /* dw partial, w */
        int blocks = wave_grid(c, k_head_norm_rope_bwd_pairs, 128, smem, (T + 3) / 4);
        k_head_norm_rope_bwd_pairs<<<blocks, 128, smem, c->stream>>>(
            (bf16 *)dx, dw, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rot, T, nh, d, eps);
    } else {
        size_t rows = (size_t)T * nh;
        k_head_norm_rope_bwd_scalar<<<grid_for(rows * 32, 256), 256, 0, c->stream>>>(
            (bf16 *)dx, dw, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rot, T, nh, d, eps);
    }
    CUDA_CHECK_LAUNCH();
}

/* The target's fused q|k|v split: per token, rows [0, H) are q, [H, H + Hk) k (both normed
 * with qn or kn when qn is set, and rotated), [H + Hk, H + 2 Hk) v (copied). */
template <bool VEC>
__global__ void k_qkv_norm_rope(bf16 *__restrict__ q, bf16 *__restrict__ k, bf16 *__restrict__ v,
                                const bf16 *__restrict__ qkv, const bf16 *__restrict__ qn,
                                const bf16 *__restrict__ kn, const float *rot, int H, int Hk, int d,
                                float eps) {
    const int t = blockIdx.x;
    auto dst_of = [&](int r) -> bf16 * {
        if (r < H) return q + ((size_t)t * H + r) * d;
        if (r < H + Hk) return k + ((size_t)t * Hk + r - H) * d;
        return v + ((size_t)t * Hk + r - H - Hk) * d;
    };
    auto w_of = [&](int r) -> const bf16 * { return r < H ? qn : kn; };
    norm_rope_rows<VEC>(dst_of, w_of, qkv + (size_t)t * (H + 2 * Hk) * d, rot + (size_t)t * d,
                        H + 2 * Hk, H + Hk, d, eps);
}

void cu_qkv_norm_rope_fwd(nn_ctx *c, nn_buf *q, nn_buf *k, nn_buf *v, const nn_buf *qkv,
                          const nn_buf *qn, const nn_buf *kn, const float *rot, int T, int H,
                          int Hk, int d, float eps) {
    assert(T >= 0 && H > 0 && Hk > 0 && d > 0 && d % 2 == 0 && (qn == NULL) == (kn == NULL));
    if (T == 0) return;
    bool vec = norm_rope_vec(d) && vec_ok(q, k, v) && vec_ok(qkv, qn ? qn : qkv, kn ? kn : qkv) &&
               vec_ok(rot, rot, rot);
    if (vec)
        k_qkv_norm_rope<true><<<T, 256, 0, c->stream>>>(
            (bf16 *)q, (bf16 *)k, (bf16 *)v, (const bf16 *)qkv, (const bf16 *)qn,
            (const bf16 *)kn, rot, H, Hk, d, eps);
    else
        k_qkv_norm_rope<false><<<T, 256, 0, c->stream>>>(
            (bf16 *)q, (bf16 *)k, (bf16 *)v, (const bf16 *)qkv, (const bf16 *)qn,
            (const bf16 *)kn, rot, H, Hk, d, eps);
    CUDA_CHECK_LAUNCH();
}

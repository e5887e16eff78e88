/* ops_cuda: the cuda backend of ops.h (its vtable), everything but attention (ops_cuda_attn.cu),
 * the optimizer's kernels (ops_cuda_optim.cu) and the linear ops (ops_cuda_linear.cu).
 *
 * Types: nn_buf = bf16, also the matrices' weight gradients (ops.h); vector weight gradients,
 * master weights, moments, rstd, lse, loss sums fp32.
 * Every kernel computes in fp32 and rounds once when it stores a bf16.
 *
 * Context (nn_cuda_new): a main stream (and, with DFLASH_CUDA_SIDE_STREAM=1, a side one: ops.h
 * side_begin), one cuBLASLt handle, a 32 MiB cuBLASLt workspace, a 32 MiB fp32 staging buffer for
 * upload/download conversions, and a small cache of cuBLASLt descriptors + chosen algorithm per
 * matmul shape (ops_cuda_linear.cu). cuda_attention_init adds, once per device, the fp32 scratch of
 * attention_block_bwd (144 MiB of dk/dv split partials and saved D rows, 128 MiB of fused-backward
 * dq), which attention_block_plan grows to a model's largest step when the model is created.
 * Nothing else is allocated after nn_cuda_new except by the caller through alloc (and, while
 * tuning, a timing copy of a new shape's output).
 *
 * Choices where ops.h leaves room (matching ops_cpu.c): rows of weight <= 0 give no loss and
 * dh = 0; correct[] is written for every row; argmax ties take the first index; RMSNorm's rstd
 * may be NULL in backward (recomputed with eps 1e-6), and its dw sums go through c->stage in a
 * fixed order where rstd is given; rope_table's angles are
 * (float)pos * inv_freq, their cos and sin from sincosf.
 * lm_head_xent keeps bf16 logits of chunk rows in the caller's scratch [chunk, V] bf16 (their
 * unnormalised exponentials overwrite them in place) and each row's dh factor in c->stage (so it
 * runs on the main stream); lm_head_argmax uses the scratch as fp32 logits of chunk/2 rows (so
 * chunk must be >= 2).
 *
 * Streams: every op queues work on c->stream (the main stream, or the side one between side_begin
 * and side_end) and returns; download, download_raw and sync wait for both. Ops using the
 * context's scratch assert that they run on the main stream (MAIN_STREAM_ONLY).
 */
#include "ops_cuda.h"
#include "ops_cuda_ctx.cuh"

#include "cp_async.cuh"
#include "cuda_elem.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every host wait for the whole stream goes through here, so stream_drains counts them. It
 * waits for the side stream too. */
static void drain(nn_ctx *c) {
    c->drains++;
    CUDA_CHECK(cudaStreamSynchronize(c->main));
    if (c->side_used) CUDA_CHECK(cudaStreamSynchronize(c->side));
}

void cuda_check_at(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", file, line, cudaGetErrorName(e),
            cudaGetErrorString(e), what);
    fprintf(stderr, "hint: check the device with nvidia-smi and the shapes passed to the op\n");
    abort();
}

/* ------------------------------------------------------------------------------------------ */
/* memory */

static long g_allocs; /* ops.h allocs: cuda_malloc and cu_host_alloc calls, all devices */

static void count_alloc(void) {
    __atomic_fetch_add(&g_allocs, 1, __ATOMIC_RELAXED);
}

cudaError_t cuda_malloc(void **p, size_t bytes) {
    count_alloc();
    return cudaMalloc(p, bytes);
}

static long cu_allocs(nn_ctx *c) {
    (void)c;
    return __atomic_load_n(&g_allocs, __ATOMIC_RELAXED);
}

static void *cu_alloc(nn_ctx *c, size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 256;
    if (cuda_malloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "ops_cuda: cudaMalloc of %zu bytes failed\n", bytes);
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
    return p;
}

static void cu_free(nn_ctx *c, void *p) {
    if (!p) return;
    drain(c);
    CUDA_CHECK(cudaFree(p));
}

__global__ void k_f32_to_bf16(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

__global__ void k_bf16_to_f32(float *dst, const bf16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

static void cu_upload(nn_ctx *c, nn_buf *dst, const float *src, size_t n) {
    MAIN_STREAM_ONLY(c); /* c->stage */
    bf16 *d = (bf16 *)dst;
    for (size_t o = 0; o < n; o += STAGE_FLOATS) {
        size_t m = n - o < STAGE_FLOATS ? n - o : STAGE_FLOATS;
        CUDA_CHECK(cudaMemcpyAsync(c->stage, src + o, m * sizeof(float), cudaMemcpyHostToDevice,
                                   c->stream));
        k_f32_to_bf16<<<grid_for(m, 256), 256, 0, c->stream>>>(d + o, c->stage, m);
        CUDA_CHECK_LAUNCH();
    }
    /* the staging buffer is reused by the next call: the host source may be pageable and
     * reused by the caller at once, so wait until the copies have been consumed */
    drain(c);
}

static void cu_download(nn_ctx *c, float *dst, const nn_buf *src, size_t n) {
    MAIN_STREAM_ONLY(c); /* c->stage */
    const bf16 *s = (const bf16 *)src;
    for (size_t o = 0; o < n; o += STAGE_FLOATS) {
        size_t m = n - o < STAGE_FLOATS ? n - o : STAGE_FLOATS;
        k_bf16_to_f32<<<grid_for(m, 256), 256, 0, c->stream>>>(c->stage, s + o, m);
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cudaMemcpyAsync(dst + o, c->stage, m * sizeof(float), cudaMemcpyDeviceToHost,
                                   c->stream));
    }
    drain(c);
}

static void cu_upload_raw(nn_ctx *c, void *dst, const void *src, size_t bytes) {
    /* pageable source: returns once the source has been staged, so the caller may reuse it */
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cu_download_raw(nn_ctx *c, void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    drain(c);
}

static void cu_copy(nn_ctx *c, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cu_copy2d(nn_ctx *c, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                      size_t width, size_t rows) {
    if (width && rows)
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                     cudaMemcpyDeviceToDevice, c->stream));
}

/* Rows moved by index, one block per row, in words of W bytes (16 when rows and pointers allow,
 * else 4, else 1): rows_scatter (GATHER false: dst row rows[i] = src row i) and embedding_fwd
 * (GATHER: dst row i = src row rows[i]). */
template <typename W, bool GATHER>
__global__ void k_rows_move(W *dst, const int32_t *rows, const W *src, size_t words) {
    const size_t i = blockIdx.x, r = (size_t)rows[blockIdx.x];
    const W *s = src + (GATHER ? r : i) * words;
    W *d = dst + (GATHER ? i : r) * words;
    for (size_t k = threadIdx.x; k < words; k += blockDim.x)
        d[k] = s[k];
}

template <bool GATHER>
static void rows_move(nn_ctx *c, void *dst, const int32_t *rows, const void *src, int n,
                      size_t row_bytes) {
    if (n <= 0 || !row_bytes) return;
    uintptr_t al = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)row_bytes;
    if (al % 16 == 0)
        k_rows_move<uint4, GATHER><<<n, 128, 0, c->stream>>>((uint4 *)dst, rows,
                                                             (const uint4 *)src, row_bytes / 16);
    else if (al % 4 == 0)
        k_rows_move<uint32_t, GATHER><<<n, 128, 0, c->stream>>>(
            (uint32_t *)dst, rows, (const uint32_t *)src, row_bytes / 4);
    else
        k_rows_move<uint8_t, GATHER><<<n, 128, 0, c->stream>>>((uint8_t *)dst, rows,
                                                               (const uint8_t *)src, row_bytes);
    CUDA_CHECK_LAUNCH();
}

static void cu_rows_scatter(nn_ctx *c, void *dst, const int32_t *rows, const void *src, int n,
                            size_t row_bytes) {
    rows_move<false>(c, dst, rows, src, n, row_bytes);
}

static void cu_zero(nn_ctx *c, void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
}

static void cu_sync(nn_ctx *c) {
    drain(c);
}

/* asynchronous host traffic: pinned host buffers, fences, cross-stream order */

static void *cu_stream(nn_ctx *c) {
    return (void *)c->main;
}

static void *cu_host_alloc(nn_ctx *c, size_t bytes) {
    (void)c;
    void *p = NULL;
    count_alloc();
    if (cudaMallocHost(&p, bytes ? bytes : 64) != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "ops_cuda: cudaMallocHost of %zu bytes failed\n", bytes);
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 64);
    return p;
}

static void cu_host_free(nn_ctx *c, void *p) {
    if (!p) return;
    drain(c); /* a queued copy may still target it */
    CUDA_CHECK(cudaFreeHost(p));
}

static void cu_download_raw_async(nn_ctx *c, void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
}

/* A fence covers both streams: an event on each (the side's once it has been used). */
static void cu_fence_record(nn_ctx *c, int k) {
    assert(k >= 0 && k < NN_FENCES && c->stream == c->main);
    CUDA_CHECK(cudaEventRecord(c->fence[k], c->main));
    if (c->side_used) CUDA_CHECK(cudaEventRecord(c->fence_side[k], c->side));
    c->fence_used[k] = true;
}

static void cu_fence_wait(nn_ctx *c, int k) {
    assert(k >= 0 && k < NN_FENCES);
    if (!c->fence_used[k]) return;
    CUDA_CHECK(cudaEventSynchronize(c->fence[k]));
    if (c->side_used) CUDA_CHECK(cudaEventSynchronize(c->fence_side[k]));
}

static long cu_stream_drains(nn_ctx *c) {
    return c->drains;
}

static void cu_order_after(nn_ctx *c, void *stream) {
    if (!stream || stream == (void *)c->main) return;
    CUDA_CHECK(cudaEventRecord(c->order_ev, c->main));
    CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, c->order_ev, 0));
}

/* The side stream (ops.h): side_begin forks it from the main stream by an event; marks and the
 * last event let the main stream wait for stages of it later. Without a side stream every call
 * but side_begin's switch is a no-op and the work stays on the main stream. */
static void cu_side_begin(nn_ctx *c) {
    if (!c->side || c->stream == c->side) return;
    CUDA_CHECK(cudaEventRecord(c->side_fork, c->main));
    CUDA_CHECK(cudaStreamWaitEvent(c->side, c->side_fork, 0));
    c->stream = c->side;
    c->side_used = true;
}

static void cu_side_mark(nn_ctx *c, int k) {
    assert(k >= 0 && k < NN_SIDE_MARKS);
    if (c->stream != c->side || !c->side) return;
    CUDA_CHECK(cudaEventRecord(c->side_marks[k], c->side));
    c->mark_used[k] = true;
}

static void cu_side_end(nn_ctx *c) {
    if (c->stream != c->side || !c->side) return;
    CUDA_CHECK(cudaEventRecord(c->side_last, c->side));
    c->last_used = true;
    c->stream = c->main;
}

static void cu_side_wait(nn_ctx *c, int k) {
    assert(k < NN_SIDE_MARKS && c->stream == c->main);
    bool used = k < 0 ? c->last_used : c->mark_used[k];
    if (c->side && used)
        CUDA_CHECK(cudaStreamWaitEvent(c->main, k < 0 ? c->side_last : c->side_marks[k], 0));
}

/* ------------------------------------------------------------------------------------------ */
/* embedding: out[T,D] = table[ids[t], :], a row gather (rows_move) */

static void cu_embedding_fwd(nn_ctx *c, nn_buf *out, const int32_t *ids, const nn_buf *table, int T,
                             int D) {
    assert(T >= 0 && D > 0);
    rows_move<true>(c, out, ids, table, T, (size_t)D * sizeof(bf16));
}

/* ------------------------------------------------------------------------------------------ */
/* 8-wide (16-byte) access of the memory-bound kernels below: load8 / store8 (cuda_elem.cuh) */
static bool vec_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DFLASH_CUDA_VEC");
        on = !(e && !strcmp(e, "0"));
    }
    return on != 0;
}

/* True when 8-wide access is allowed for all of these pointers. */
static bool vec_ok(const void *a, const void *b, const void *c) {
    return vec_enabled() && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

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

static void cu_rmsnorm_fwd(nn_ctx *c, nn_buf *out, float *rstd, const nn_buf *x, const nn_buf *w,
                           int R, int C, float eps) {
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
static bool norm_pipe_attrs(void) {
    const int row = 8192 * (int)sizeof(bf16);
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    return cudaFuncSetAttribute(k_rmsnorm_fwd_pipe, a, NORM_STAGES * row) == cudaSuccess &&
           cudaFuncSetAttribute(k_rmsnorm_bwd_pipe<false>, a, NORM_STAGES * 2 * row) ==
               cudaSuccess &&
           cudaFuncSetAttribute(k_rmsnorm_bwd_pipe<true>, a, NORM_STAGES * 3 * row) == cudaSuccess;
}

static void cu_rmsnorm_bwd(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy, const nn_buf *x,
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

static void cu_rope_table(nn_ctx *c, float *rot, const int32_t *pos, const float *inv_freq, int T,
                          int d) {
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

static void cu_head_norm_rope_fwd(nn_ctx *c, nn_buf *out, const nn_buf *x, const nn_buf *w,
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

static void cu_head_norm_rope_bwd(nn_ctx *c, nn_buf *dx, float *dw, const nn_buf *dy,
                                  const nn_buf *x, const nn_buf *w, const float *rot, int T, int nh,
                                  int d, float eps) {
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

static void cu_qkv_norm_rope_fwd(nn_ctx *c, nn_buf *q, nn_buf *k, nn_buf *v, const nn_buf *qkv,
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

/* ------------------------------------------------------------------------------------------ */
/* SwiGLU: elementwise, memory-bound. Each thread moves 16 bytes (8 bf16) per load and
 * store when every pointer is 16-byte aligned (vec_ok, load8/store8 above) and F % 8 == 0 (8
 * elements stay in one row); the scalar loop takes the rest (and everything
 * when DFLASH_CUDA_VEC=0 is set, for bisecting). The arithmetic per element is the same either
 * way, so both paths give the same bits. Gate and up come from one [R, 2F] buffer (gate in the
 * first F columns of each row, up in the last F), the output of one fused product. */

/* swiglu_val(g, u): cuda_elem.cuh */

/* dgate = dy u s (1 + g (1 - s)), dup = dy g s with s = sigmoid(g), element i; s by __expf and
 * __fdividef as in swiglu_val (0 where g < -87, the true s under 2e-38): the backward's pass
 * took 2.30-2.31 ms per 2 drafter steps against 2.46-2.48 with expf and an IEEE division (H200,
 * 1dfa2e0). */
__device__ __forceinline__ void swiglu_grad(float dy, float g, float u, float *dg, float *du) {
    float s = __fdividef(1.0f, 1.0f + __expf(-g));
    *dg = dy * u * s * (1.0f + g * (1.0f - s));
    *du = dy * g * s;
}

/* Offset in gu[R, 2F] of gate element i of out[R, F] (its up element is F further). */
__device__ __forceinline__ size_t swiglu_at(size_t i, int F) {
    return i + i / (size_t)F * (size_t)F;
}

/* The same for the 8-wide item i (F % 8 == 0). I32 (the item count below 2^32): by a 32-bit
 * division, a few instructions where the 64-bit one is a long emulated sequence (~1% of the
 * passes' time in the drafter's step, H200). */
template <bool I32> __device__ __forceinline__ size_t swiglu_at8(size_t i, int F) {
    if (!I32) return swiglu_at(8 * i, F);
    const unsigned f8 = (unsigned)F / 8u, row = (unsigned)i / f8;
    return 8 * i + (size_t)row * (size_t)F;
}

template <bool I32>
__global__ void k_swiglu_fwd(bf16 *out, const bf16 *gu, int F, size_t n, int vec) {
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x,
           stride = (size_t)gridDim.x * blockDim.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        size_t g = swiglu_at8<I32>(i, F);
        float x[8], y[8];
        load8(gu + g, x);
        load8(gu + g + F, y);
#pragma unroll
        for (int k = 0; k < 8; k++)
            x[k] = swiglu_val(x[k], y[k]);
        store8(out + 8 * i, x);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride) {
        size_t g = swiglu_at(i, F);
        out[i] = __float2bfloat16(swiglu_val(__bfloat162float(gu[g]), __bfloat162float(gu[g + F])));
    }
}

template <bool I32>
__global__ void k_swiglu_bwd(bf16 *dgu, const bf16 *dout, const bf16 *gu, int F, size_t n,
                             int vec) {
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x,
           stride = (size_t)gridDim.x * blockDim.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        size_t g = swiglu_at8<I32>(i, F);
        float dy[8], gg[8], uu[8], a[8], b[8];
        load8(dout + 8 * i, dy);
        load8(gu + g, gg);
        load8(gu + g + F, uu);
#pragma unroll
        for (int k = 0; k < 8; k++)
            swiglu_grad(dy[k], gg[k], uu[k], &a[k], &b[k]);
        store8(dgu + g, a);
        store8(dgu + g + F, b);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride) {
        size_t g = swiglu_at(i, F);
        float a, b;
        swiglu_grad(__bfloat162float(dout[i]), __bfloat162float(gu[g]),
                    __bfloat162float(gu[g + F]), &a, &b);
        dgu[g] = __float2bfloat16(a);
        dgu[g + F] = __float2bfloat16(b);
    }
}

/* whether the 8-wide items of n elements can be indexed in 32 bits (swiglu_at8) */
static bool swiglu_i32(size_t n) {
    return n / 8 < ((size_t)1 << 32);
}

static void cu_swiglu_fwd(nn_ctx *c, nn_buf *out, const nn_buf *gu, int R, int F) {
    size_t n = (size_t)R * F;
    if (n == 0) return;
    int vec = F % 8 == 0 && vec_ok(out, gu, gu);
    const unsigned grid = grid_for(vec ? (n + 7) / 8 : n, 256);
    if (swiglu_i32(n))
        k_swiglu_fwd<true><<<grid, 256, 0, c->stream>>>((bf16 *)out, (const bf16 *)gu, F, n, vec);
    else
        k_swiglu_fwd<false><<<grid, 256, 0, c->stream>>>((bf16 *)out, (const bf16 *)gu, F, n, vec);
    CUDA_CHECK_LAUNCH();
}

static void cu_swiglu_bwd(nn_ctx *c, nn_buf *dgu, const nn_buf *dout, const nn_buf *gu, int R,
                          int F) {
    size_t n = (size_t)R * F;
    if (n == 0) return;
    int vec = F % 8 == 0 && vec_ok(dgu, dout, gu);
    const unsigned grid = grid_for(vec ? (n + 7) / 8 : n, 256);
    if (swiglu_i32(n))
        k_swiglu_bwd<true><<<grid, 256, 0, c->stream>>>((bf16 *)dgu, (const bf16 *)dout,
                                                        (const bf16 *)gu, F, n, vec);
    else
        k_swiglu_bwd<false><<<grid, 256, 0, c->stream>>>((bf16 *)dgu, (const bf16 *)dout,
                                                         (const bf16 *)gu, F, n, vec);
    CUDA_CHECK_LAUNCH();
}

/* ------------------------------------------------------------------------------------------ */
/* attention: ops_cuda_attn.cu */

static void cu_attention_causal_fwd(nn_ctx *c, nn_buf *out, const nn_buf *q, const nn_buf *k,
                                    const nn_buf *v, const int32_t *seq_off, int n_seqs, int T,
                                    int H, int Hk, int d) {
    MAIN_STREAM_ONLY(c);
    cuda_attention_causal_fwd(c->stream, (bf16 *)out, (const bf16 *)q, (const bf16 *)k,
                              (const bf16 *)v, seq_off, n_seqs, T, H, Hk, d);
}

static void cu_attention_block_fwd(nn_ctx *c, nn_buf *out, float *lse, const nn_buf *q,
                                   const nn_buf *k, const nn_buf *v, const nn_block_span *spans,
                                   int n_blocks, int B, int Tk, int H, int Hk, int d) {
    MAIN_STREAM_ONLY(c);
    cuda_attention_block_fwd(c->stream, (bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                             (const bf16 *)v, spans, n_blocks, B, Tk, H, Hk, d);
}

static void cu_attention_block_plan(nn_ctx *c, int max_q, int max_tk, int H, int Hk, int d) {
    drain(c); /* the scratch it replaces may be in use by queued work */
    cuda_attention_block_plan(max_q, max_tk, H, Hk, d);
}

static void cu_attention_block_bwd(nn_ctx *c, nn_buf *dq, nn_buf *dk, nn_buf *dv,
                                   const nn_buf *dout, const nn_buf *q, const nn_buf *k,
                                   const nn_buf *v, const nn_buf *out, const float *lse,
                                   const nn_block_span *spans, int n_blocks, int B, int Tk, int H,
                                   int Hk, int d) {
    MAIN_STREAM_ONLY(c);
    cuda_attention_block_bwd(c->stream, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout,
                             (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)out,
                             lse, spans, n_blocks, B, Tk, H, Hk, d);
}

/* ------------------------------------------------------------------------------------------ */
/* lm_head + cross-entropy. Per chunk of n rows: bf16 logits[n, V] = h W^T (cuBLASLt, fp32
 * accumulation, one rounding) in the scratch; one block per row reads it once: max / sum-exp /
 * argmax, loss, and E = exp(logit - shift) in place as bf16 (k_xent_rows below); then dh = E W
 * (cuBLASLt) and dh's rows times g / Z (k_xent_scale). bf16 logits, as PyTorch's
 * autocast gives them, move half the bytes of fp32 ones through the memory-bound softmax pass
 * (with the drafter's loss-row selection: 33.7 -> 28.4 ms per 3072/512 step, bench/RESULTS.md;
 * the two were not timed apart). lm_head_argmax keeps fp32 logits (chunk / 2 rows of them in the
 * bf16 scratch) so that greedy decoding sees no ties made by rounding. */

#define XENT_THREADS 512

/* Running (max m, sum s of 2^(x - m), argmax i) of values x in the log2 domain (the loss
 * scales logits by log2 e first; the argmax uses s = 0). */
struct msi {
    float m, s;
    int i;
};

__device__ __forceinline__ msi msi_merge(msi a, msi b) {
    msi r;
    if (b.m > a.m || (b.m == a.m && b.i < a.i)) {
        r.m = b.m;
        r.i = b.i;
    } else {
        r.m = a.m;
        r.i = a.i;
    }
    float sa = a.m == -INFINITY ? 0.0f : a.s * exp2f(a.m - r.m);
    float sb = b.m == -INFINITY ? 0.0f : b.s * exp2f(b.m - r.m);
    r.s = sa + sb;
    return r;
}

/* Block-wide reduction of (max, sum exp, argmax); every thread gets the result. */
__device__ msi block_msi(msi v) {
    __shared__ float sm[32], ss[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        msi w;
        w.m = __shfl_xor_sync(0xffffffffu, v.m, o);
        w.s = __shfl_xor_sync(0xffffffffu, v.s, o);
        w.i = __shfl_xor_sync(0xffffffffu, v.i, o);
        v = msi_merge(v, w);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* the shared slots may still be read by a previous call */
    if (lane == 0) sm[warp] = v.m, ss[warp] = v.s, si[warp] = v.i;
    __syncthreads();
    msi r = {-INFINITY, 0.0f, 0x7fffffff};
    for (int i = 0; i < nw; i++) {
        msi w = {sm[i], ss[i], si[i]};
        r = msi_merge(r, w);
    }
    return r;
}

/* One row of bf16 logits (as PyTorch's bf16 autocast leaves them), read once. The row's first
 * segment (each thread's first load) gives a shift c = its max m0 + XENT_SHIFT (log2 domain:
 * x = logit log2 e); one pass then keeps max / argmax by comparisons and the sum S of
 * E = 2^(x - c) (one exp2f per logit) and, when dh is wanted, writes E over the logits in
 * place. The unnormalised E spares the pass a second read of the row (each row came from DRAM
 * twice before): with Z = S, dlogits = g (E / Z - onehot) = (g / Z) (E - Z onehot), so the
 * pass rewrites the label's element as E - Z once the row is done and leaves g / Z in
 * dh_scale[row], which k_xent_scale applies to dh = E W after the product (E rounds to bf16
 * before the division and dh rounds twice, where the two-read pass rounded dlogits after it:
 * both at bf16 level). The loss and argmax come from the exact max and S (msi below). Safety:
 * E, S and the product stay finite while every x <= c + XENT_SAFE (E <= 2^96); a row with a
 * larger logit (over ~89 nats above m0) takes a fallback that reads the row again, takes x back
 * from E as c + log2 E (E = inf, over ~111 nats above m0: the row's max), and writes normalised
 * dlogits with scale 1. E flushes to 0 for logits over ~70 nats below m0 (each under 2^-101 of
 * the row's sum). Ties of the argmax take the first index (ascending per thread, msi_merge). */
#define XENT_LOG2E 1.4426950408889634f
#define XENT_LN2 0.6931471805599453f
#define XENT_SHIFT 32.0f
#define XENT_SAFE 96.0f

template <bool VEC> __device__ __forceinline__ void xent_load(const bf16 *p, float x[8]) {
    if (VEC)
        load8(p, x);
    else
        x[0] = __bfloat162float(*p);
}

template <bool VEC> __device__ __forceinline__ void xent_store(bf16 *p, const float x[8]) {
    if (VEC)
        store8(p, x);
    else
        *p = __float2bfloat16(x[0]);
}

/* The fallback's value of element x (log2 domain) from what the row holds: the logit itself
 * when nothing was written, else E = 2^(x - c). */
__device__ __forceinline__ float xent_back(float held, bool wrote, float c, float row_max) {
    if (!wrote) return held * XENT_LOG2E;
    return isinf(held) ? row_max : c + log2f(held);
}

template <bool VEC>
__global__ void __launch_bounds__(XENT_THREADS)
    k_xent_rows(bf16 *logits, int V, int r0, const int32_t *labels, const float *weights,
                int32_t *correct, float *out_sums, float inv_norm, float *dh_scale) {
    int i = blockIdx.x, r = r0 + i;
    bf16 *L = logits + (size_t)i * V;
    const int step = VEC ? 8 : 1, stride = XENT_THREADS * step, lab = labels[r];
    const float w = weights[r], g = w > 0.0f ? w * inv_norm : 0.0f;
    const float xlab = __bfloat162float(L[lab]); /* read before the barrier below: no E yet */
    const bool write = dh_scale != NULL;
    float x[8];
    int j = threadIdx.x * step;
    float m0 = -INFINITY;
    if (j < V) {
        xent_load<VEC>(L + j, x);
#pragma unroll
        for (int e = 0; e < step; e++)
            m0 = fmaxf(m0, x[e] * XENT_LOG2E);
    }
    const msi first = {m0, 0.0f, 0};
    const float c = block_msi(first).m + XENT_SHIFT;
    float mx = -INFINITY, s = 0.0f;
    int ix = 0x7fffffff;
    bool over = false;
    while (j < V) {
#pragma unroll
        for (int e = 0; e < step; e++) {
            float xe = x[e] * XENT_LOG2E;
            if (xe > mx) mx = xe, ix = j + e;
            over |= xe - c > XENT_SAFE;
            x[e] = exp2f(xe - c);
            s += x[e];
            x[e] = w > 0.0f ? x[e] : 0.0f; /* a row without loss: dh 0 */
        }
        if (write) xent_store<VEC>(L + j, x);
        j += stride;
        if (j < V) xent_load<VEC>(L + j, x);
    }
    /* the thread's sum relative to its own max, for msi_merge (s >= 2^(mx - c) unless all of
     * the thread's values lie so far below c that their fp32 exponentials underflow) */
    msi v = {mx, s > 0.0f ? exp2f(log2f(s) + c - mx) : 0.0f, ix};
    msi t = block_msi(v);
    over = __syncthreads_or(over);
    float scale = 0.0f;
    if (over && w > 0.0f) {
        /* the fallback: S again, relative to the exact max, from the values the row holds */
        float s2 = 0.0f;
        for (int k = threadIdx.x * step; k < V; k += stride) {
            xent_load<VEC>(L + k, x);
#pragma unroll
            for (int e = 0; e < step; e++)
                s2 += exp2f(xent_back(x[e], write, c, t.m) - t.m);
        }
        msi v2 = {t.m, s2, t.i};
        t = block_msi(v2);
        if (write) {
            float lse = t.m + log2f(t.s);
            for (int k = threadIdx.x * step; k < V; k += stride) {
                xent_load<VEC>(L + k, x);
#pragma unroll
                for (int e = 0; e < step; e++)
                    x[e] = exp2f(xent_back(x[e], true, c, t.m) - lse) * g -
                           (k + e == lab ? g : 0.0f);
                xent_store<VEC>(L + k, x);
            }
        }
        scale = 1.0f;
    }
    if (threadIdx.x == 0) {
        if (correct) correct[r] = t.i == lab;
        if (w > 0.0f) {
            float loss = w * ((t.m + log2f(t.s)) * XENT_LN2 - xlab);
            atomicAdd(out_sums, loss);
            atomicAdd(out_sums + 1, w);
        }
        if (write) {
            if (!over && w > 0.0f) {
                /* Z = S = t.s 2^(t.m - c); the label's E computed as its writer did */
                float z = t.s * exp2f(t.m - c);
                L[lab] = __float2bfloat16(exp2f(xlab * XENT_LOG2E - c) - z);
                scale = g / z;
            }
            dh_scale[i] = scale;
        }
    }
}

/* dh[r, :] *= scale[r] over n rows of D (bf16 in place; 8 wide when VEC). */
template <bool VEC> __global__ void k_xent_scale(bf16 *dh, const float *scale, int n, int D) {
    const int step = VEC ? 8 : 1;
    const size_t items = (size_t)n * D / step;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < items;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t at = k * step;
        float f = scale[at / D], x[8];
        xent_load<VEC>(dh + at, x);
#pragma unroll
        for (int e = 0; e < step; e++)
            x[e] *= f;
        xent_store<VEC>(dh + at, x);
    }
}

__global__ void k_argmax_rows(int32_t *out, const float *logits, int V, int r0) {
    const float *L = logits + (size_t)blockIdx.x * V;
    msi v = {-INFINITY, 0.0f, 0x7fffffff};
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = L[j];
        if (x > v.m) v.m = x, v.i = j; /* ascending j per thread: first max kept */
    }
    v.s = 0.0f;
    msi t = block_msi(v);
    if (threadIdx.x == 0) out[r0 + blockIdx.x] = t.i;
}

static void cu_lm_head_xent(nn_ctx *c, nn_buf *dh, float *out_sums, int32_t *correct,
                            const nn_buf *h, const nn_buf *W, const int32_t *labels,
                            const float *weights, float inv_norm, nn_buf *scratch, int Q, int D,
                            int V, int chunk) {
    assert(chunk >= 2 && V > 0 && D > 0 && Q >= 0);
    CUDA_CHECK(cudaMemsetAsync(out_sums, 0, 2 * sizeof(float), c->stream));
    bf16 *logits = (bf16 *)scratch;
    const bf16 *hb = (const bf16 *)h;
    const bool vec = V % 8 == 0 && vec_ok(scratch, scratch, scratch);
    float *scale = NULL; /* per row of a chunk: dh's factor g / Z (k_xent_rows) */
    if (dh) {
        MAIN_STREAM_ONLY(c); /* the scales go to c->stage */
        assert((size_t)chunk <= STAGE_FLOATS);
        scale = c->stage;
    }
    for (int r0 = 0; r0 < Q; r0 += chunk) {
        int n = Q - r0 < chunk ? Q - r0 : chunk;
        cu_lt_matmul(c, 1, 0, V, n, D, W, D, hb + (size_t)r0 * D, D, logits, V, 0, 0.0f);
        if (vec)
            k_xent_rows<true><<<n, XENT_THREADS, 0, c->stream>>>(
                logits, V, r0, labels, weights, correct, out_sums, inv_norm, scale);
        else
            k_xent_rows<false><<<n, XENT_THREADS, 0, c->stream>>>(
                logits, V, r0, labels, weights, correct, out_sums, inv_norm, scale);
        CUDA_CHECK_LAUNCH();
        if (!dh) continue;
        bf16 *dr = (bf16 *)dh + (size_t)r0 * D;
        cu_lt_matmul(c, 0, 0, D, n, V, W, D, logits, V, dr, D, 0, 0.0f);
        const int vd = D % 8 == 0 && vec_ok(dr, dr, dr) ? 8 : 1;
        const unsigned grid = grid_for((size_t)n * D / vd, 256);
        if (vd == 8)
            k_xent_scale<true><<<grid, 256, 0, c->stream>>>(dr, scale, n, D);
        else
            k_xent_scale<false><<<grid, 256, 0, c->stream>>>(dr, scale, n, D);
        CUDA_CHECK_LAUNCH();
    }
}

static void cu_lm_head_argmax(nn_ctx *c, int32_t *out, const nn_buf *h, const nn_buf *W,
                              nn_buf *scratch, int Q, int D, int V, int chunk) {
    assert(chunk >= 2 && V > 0 && D > 0 && Q >= 0);
    int rows = chunk / 2;
    float *logits = (float *)scratch;
    const bf16 *hb = (const bf16 *)h;
    for (int r0 = 0; r0 < Q; r0 += rows) {
        int n = Q - r0 < rows ? Q - r0 : rows;
        cu_lt_matmul(c, 1, 0, V, n, D, W, D, hb + (size_t)r0 * D, D, logits, V, 1, 0.0f);
        k_argmax_rows<<<n, XENT_THREADS, 0, c->stream>>>(out, logits, V, r0);
        CUDA_CHECK_LAUNCH();
    }
}

/* ------------------------------------------------------------------------------------------ */
/* optimizer: ops_cuda_optim.cu */

static void cu_sumsq(nn_ctx *c, float *out, const nn_buf *ga, size_t na, const float *g,
                     size_t n) {
    MAIN_STREAM_ONLY(c); /* the partials go to c->stage */
    cuda_sumsq(c->stream, out, c->stage, STAGE_FLOATS, (const bf16 *)ga, na, g, n);
}

static void cu_adamw(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps, float wd,
                     float grad_scale, int t) {
    cuda_adamw(c->stream, p, (bf16 *)p_act, g, m, v, n, lr, beta1, beta2, eps, wd, grad_scale,
               NULL, 0.0f, t);
}

static void cu_adamw_clip(nn_ctx *c, float *p, nn_buf *p_act, const float *g, float *m, float *v,
                          size_t n, float lr, float beta1, float beta2, float eps, float wd,
                          const float *sumsq, float clip, int t) {
    cuda_adamw(c->stream, p, (bf16 *)p_act, g, m, v, n, lr, beta1, beta2, eps, wd, 1.0f, sumsq,
               clip, t);
}

static void cu_adamw_clip_act(nn_ctx *c, float *p, nn_buf *p_act, uint16_t *p_lo,
                              const nn_buf *g, float *m, float *v, size_t n, float lr,
                              float beta1, float beta2, float eps, float wd, const float *sumsq,
                              float clip, int t) {
    assert(!p && p_act && p_lo); /* master_split */
    (void)p;
    cuda_adamw_split(c->stream, (bf16 *)p_act, p_lo, (const bf16 *)g, m, v, n, lr, beta1, beta2,
                     eps, wd, sumsq, clip, t);
}

static void cu_scale_f32(nn_ctx *c, float *x, size_t n, float a) {
    cuda_scale(c->stream, x, NULL, n, a);
}

static void cu_scale_act(nn_ctx *c, nn_buf *x, size_t n, float a) {
    cuda_scale(c->stream, NULL, (bf16 *)x, n, a);
}

static void cu_f32_to_act(nn_ctx *c, nn_buf *dst, const float *src, size_t n) {
    if (n == 0) return;
    k_f32_to_bf16<<<grid_for(n, 256), 256, 0, c->stream>>>((bf16 *)dst, src, n);
    CUDA_CHECK_LAUNCH();
}

/* ------------------------------------------------------------------------------------------ */

static nn_ops make_ops(void) {
    nn_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.act_bytes = sizeof(bf16);
    o.master_split = true;
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.upload = cu_upload;
    o.download = cu_download;
    o.upload_raw = cu_upload_raw;
    o.download_raw = cu_download_raw;
    o.copy = cu_copy;
    o.copy2d = cu_copy2d;
    o.rows_scatter = cu_rows_scatter;
    o.matmul_tune = cu_matmul_tune;
    o.zero = cu_zero;
    o.sync = cu_sync;
    o.embedding_fwd = cu_embedding_fwd;
    o.rmsnorm_fwd = cu_rmsnorm_fwd;
    o.linear_fwd = cu_linear_fwd;
    o.linear_fwd_res = cu_linear_fwd_res;
    o.rope_table = cu_rope_table;
    o.head_norm_rope_fwd = cu_head_norm_rope_fwd;
    o.qkv_norm_rope_fwd = cu_qkv_norm_rope_fwd;
    o.attention_causal_fwd = cu_attention_causal_fwd;
    o.attention_block_fwd = cu_attention_block_fwd;
    o.swiglu_fwd = cu_swiglu_fwd;
    o.rmsnorm_bwd = cu_rmsnorm_bwd;
    o.linear_bwd = cu_linear_bwd;
    o.head_norm_rope_bwd = cu_head_norm_rope_bwd;
    o.swiglu_bwd = cu_swiglu_bwd;
    o.attention_block_bwd = cu_attention_block_bwd;
    o.attention_block_plan = cu_attention_block_plan;
    o.lm_head_xent = cu_lm_head_xent;
    o.lm_head_argmax = cu_lm_head_argmax;
    o.sumsq = cu_sumsq;
    o.adamw = cu_adamw;
    o.f32_to_act = cu_f32_to_act;
    o.stream = cu_stream;
    o.host_alloc = cu_host_alloc;
    o.host_free = cu_host_free;
    o.download_raw_async = cu_download_raw_async;
    o.fence_record = cu_fence_record;
    o.fence_wait = cu_fence_wait;
    o.order_after = cu_order_after;
    o.side_begin = cu_side_begin;
    o.side_mark = cu_side_mark;
    o.side_end = cu_side_end;
    o.side_wait = cu_side_wait;
    o.stream_drains = cu_stream_drains;
    o.allocs = cu_allocs;
    o.adamw_clip = cu_adamw_clip;
    o.adamw_clip_act = cu_adamw_clip_act;
    o.scale_f32 = cu_scale_f32;
    o.scale_act = cu_scale_act;
    return o;
}

static const nn_ops cuda_ops = make_ops();

extern "C" const nn_ops *nn_cuda_ops(void) {
    return &cuda_ops;
}

static bool events_new(nn_ctx *c) {
    cudaEvent_t *evs[2 * NN_FENCES + NN_SIDE_MARKS + 3];
    int n = 0;
    for (int k = 0; k < NN_FENCES; k++)
        evs[n++] = &c->fence[k], evs[n++] = &c->fence_side[k];
    for (int k = 0; k < NN_SIDE_MARKS; k++)
        evs[n++] = &c->side_marks[k];
    evs[n++] = &c->order_ev, evs[n++] = &c->side_fork, evs[n++] = &c->side_last;
    for (int i = 0; i < n; i++)
        if (cudaEventCreateWithFlags(evs[i], cudaEventDisableTiming) != cudaSuccess) return false;
    return true;
}

static void events_destroy(nn_ctx *c) {
    cudaEvent_t evs[] = {c->order_ev, c->side_fork, c->side_last};
    for (cudaEvent_t e : evs)
        if (e) cudaEventDestroy(e);
    for (int k = 0; k < NN_FENCES; k++) {
        if (c->fence[k]) cudaEventDestroy(c->fence[k]);
        if (c->fence_side[k]) cudaEventDestroy(c->fence_side[k]);
    }
    for (int k = 0; k < NN_SIDE_MARKS; k++)
        if (c->side_marks[k]) cudaEventDestroy(c->side_marks[k]);
}

/* The main stream, and with DFLASH_CUDA_SIDE_STREAM=1 the side stream: with both, the main one
 * runs at the highest priority and the side one at the lowest, so the side's blocks take the
 * multiprocessors the main stream's kernels leave idle. Off by default until its time on the
 * H200 is measured (bench/cuda_ops/side_gpu.sh). */
static bool streams_new(nn_ctx *c) {
    const char *e = getenv("DFLASH_CUDA_SIDE_STREAM");
    bool side = e && !strcmp(e, "1");
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) return false;
    if (cudaStreamCreateWithPriority(&c->main, cudaStreamNonBlocking, side ? greatest : 0) !=
        cudaSuccess)
        return false;
    c->stream = c->main;
    return !side ||
           cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, least) == cudaSuccess;
}

extern "C" nn_ctx *nn_cuda_new(int device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        (void)cudaGetLastError();
        fprintf(stderr, "ops_cuda: no CUDA device %d (%d found)\n", device, n);
        return NULL;
    }
    nn_ctx *c = (nn_ctx *)calloc(1, sizeof *c);
    if (!c) return NULL;
    c->device = device;
    c->tune = cu_lt_tune_env();
    if (cudaSetDevice(device) != cudaSuccess ||
        !streams_new(c) ||
        cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS ||
        cuda_malloc(&c->ws, LT_WORKSPACE) != cudaSuccess ||
        cuda_malloc((void **)&c->stage, STAGE_FLOATS * sizeof(float)) != cudaSuccess ||
        !events_new(c) ||
        cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        !norm_pipe_attrs() || cuda_attention_init() != 0) {
        fprintf(stderr, "ops_cuda: cannot set up device %d: %s\n", device,
                cudaGetErrorString(cudaGetLastError()));
        nn_cuda_destroy(&c);
        return NULL;
    }
    return c;
}

extern "C" void nn_cuda_destroy(nn_ctx **cp) {
    if (!cp || !*cp) return;
    nn_ctx *c = *cp;
    if (c->main) cudaStreamSynchronize(c->main);
    if (c->side) cudaStreamSynchronize(c->side);
    for (int i = 0; i < LT_CACHE; i++)
        if (c->cache[i].used) {
            cublasLtMatmulDescDestroy(c->cache[i].op);
            cublasLtMatrixLayoutDestroy(c->cache[i].A);
            cublasLtMatrixLayoutDestroy(c->cache[i].B);
            cublasLtMatrixLayoutDestroy(c->cache[i].C);
        }
    if (c->ws) cudaFree(c->ws);
    if (c->stage) cudaFree(c->stage);
    if (c->lt) cublasLtDestroy(c->lt);
    events_destroy(c);
    if (c->side) cudaStreamDestroy(c->side);
    if (c->main) cudaStreamDestroy(c->main);
    free(c);
    *cp = NULL;
}

extern "C" void *nn_cuda_stream(nn_ctx *c) {
    return c ? (void *)c->main : NULL;
}

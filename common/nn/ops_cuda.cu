/* ops_cuda: the cuda backend of ops.h: its vtable (make_ops), the context (nn_cuda_new), memory,
 * copies and row moves, fences and the side stream, SwiGLU, and the ops that hand over to the
 * attention (ops_cuda_attn.cu) and optimizer (ops_cuda_optim.cu) kernels. The other ops have files
 * of their own: linear via cuBLASLt (ops_cuda_linear.cu), the norms and RoPE (ops_cuda_norm.cu),
 * lm_head with the loss or argmax (ops_cuda_xent.cu); they share the context struct through
 * ops_cuda_ctx.cuh.
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
 * Streams: every op queues work on c->stream (the main stream, or the side one between side_begin
 * and side_end) and returns; download, download_raw and sync wait for both. Ops using the
 * context's scratch assert that they run on the main stream (MAIN_STREAM_ONLY).
 */
#include "ops_cuda.h"
#include "config.h"
#include "ops_cuda_ctx.cuh"

#include "cuda_elem.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
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
/* 8-wide (16-byte) access of the memory-bound kernels (SwiGLU below, ops_cuda_norm.cu,
 * ops_cuda_xent.cu): load8 / store8 (cuda_elem.cuh), where vec_ok (ops_cuda_ctx.cuh) allows */
bool cu_vec_enabled(void) {
    static int on = -1;
    if (on < 0) {
        on = (int)config_env_int("DFLASH_CUDA_VEC", 0, 1, 1);
    }
    return on != 0;
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

static void cu_grad_accumulate(nn_ctx *c, float *acc, const nn_buf *ga, size_t na,
                               const float *g, size_t n, float a, int first) {
    cuda_grad_accumulate(c->stream, acc, (const bf16 *)ga, na, g, n, a, first);
}

static void cu_grad_average(nn_ctx *c, nn_buf *ga, size_t na, float *g, size_t n,
                            const float *acc, float a, float s) {
    cuda_grad_average(c->stream, (bf16 *)ga, na, g, n, acc, a, s);
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
    o.max_head_dim = CUDA_ATTN_MAX_HEAD_DIM;
    o.max_q_per_kv = CUDA_ATTN_MAX_Q_PER_KV;
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
    o.grad_accumulate = cu_grad_accumulate;
    o.grad_average = cu_grad_average;
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
    bool side = config_env_int("DFLASH_CUDA_SIDE_STREAM", 0, 1, 0);
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) return false;
    if (cudaStreamCreateWithPriority(&c->main, cudaStreamNonBlocking, side ? greatest : 0) !=
        cudaSuccess)
        return false;
    c->stream = c->main;
    return !side ||
           cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, least) == cudaSuccess;
}

extern "C" int nn_cuda_device_count(void) {
    int n = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (e == cudaSuccess) return n;
    if (e == cudaErrorNoDevice) return 0;
    /* without libcuda the runtime says "insufficient driver" (or finds a stub library); the
     * driver version is then 0 */
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    if ((e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary) && driver == 0) return 0;
    fprintf(stderr, "ops_cuda: a CUDA driver is installed but cannot count the devices: %s "
            "(the driver supports CUDA %d.%d, the runtime is %d.%d)\n", cudaGetErrorString(e),
            driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return -1;
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
        !cu_norm_pipe_attrs() || cuda_attention_init() != 0) {
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

/* ops_cuda_xent: the cuda backend's lm_head with cross-entropy (ops.h lm_head_xent) and with
 * argmax (lm_head_argmax), with their kernels; the products go through cu_lt_matmul
 * (ops_cuda_linear.cu).
 *
 * Choices where ops.h leaves room (matching ops_cpu.c): rows of weight <= 0 give no loss and
 * dh = 0; correct[] is written for every row; argmax ties take the first index.
 * lm_head_xent keeps bf16 logits of chunk rows in the caller's scratch [chunk, V] bf16 (their
 * unnormalised exponentials overwrite them in place) and each row's dh factor in c->stage (so it
 * runs on the main stream); lm_head_argmax uses the scratch as fp32 logits of chunk/2 rows (so
 * chunk must be >= 2).
 *
 * Streams: the products and lm_head_xent's dh factors (c->stage) run on the main stream only
 * (MAIN_STREAM_ONLY); the kernels are queued on c->stream. Called through the vtable
 * (ops_cuda.cu) by the host thread that owns the context.
 */
#include "ops_cuda_ctx.cuh"

#include "cuda_elem.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <math.h>
#include <stdint.h>

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

void cu_lm_head_xent(nn_ctx *c, nn_buf *dh, float *out_sums, int32_t *correct, const nn_buf *h,
                     const nn_buf *W, const int32_t *labels, const float *weights, float inv_norm,
                     nn_buf *scratch, int Q, int D, int V, int chunk) {
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

void cu_lm_head_argmax(nn_ctx *c, int32_t *out, const nn_buf *h, const nn_buf *W, nn_buf *scratch,
                       int Q, int D, int V, int chunk) {
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

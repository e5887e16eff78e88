/* ops_cuda_optim: the cuda backend's optimizer kernels (ops.h sumsq, adamw, adamw_clip,
 * adamw_clip_act, scale_f32, scale_act), launched by ops_cuda.cu's vtable on the stream it
 * passes (the main one, or the side one for AdamW: these kernels use no context scratch, except
 * sumsq's partials, which the caller provides).
 *
 * sumsq: two fixed-order passes, no float atomics, so every run and every data-parallel rank
 * holding the same gradients gets the same bits. AdamW: memory-bound (30 bytes per element with
 * an fp32 gradient, 28 with bf16), 16-byte accesses where aligned; with sumsq given, the global
 * norm's clipping factor is read on the device (no host round trip). Every kernel computes in
 * fp32 and rounds once when it stores a bf16.
 */
#include "ops_cuda.h"

#include "cuda_elem.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <assert.h>
#include <math.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

/* Sum of squares in two fixed-order passes (no float atomics): every run, and every rank of a
 * data-parallel group holding the same gradients, gets the same bits, so the clipping factor
 * (and thus the weights) agree bit for bit. Pass 1: block b writes its partial to part[b]: each
 * thread sums its share of the bf16 part ga[na] then of the fp32 part g[n]; with vec (both
 * 16-byte aligned) 16-byte loads (8 bf16, 4 fp32), then what is left (the tails, or
 * everything) one element at a time. */
__global__ void k_sumsq(float *part, const bf16 *ga, size_t na, const float *g, size_t n,
                        int vec) {
    float s = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x, t0 = blockIdx.x * (size_t)blockDim.x +
                                                                threadIdx.x;
    const size_t na8 = vec ? na / 8 : 0, n4 = vec ? n / 4 : 0;
    for (size_t i = t0; i < na8; i += stride) {
        float x[8];
        load8(ga + 8 * i, x);
#pragma unroll
        for (int e = 0; e < 8; e++)
            s += x[e] * x[e];
    }
    for (size_t i = na8 * 8 + t0; i < na; i += stride) {
        float x = __bfloat162float(ga[i]);
        s += x * x;
    }
    const float4 *g4 = reinterpret_cast<const float4 *>(g);
    for (size_t i = t0; i < n4; i += stride) {
        float4 x = g4[i];
        s += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    for (size_t i = n4 * 4 + t0; i < n; i += stride)
        s += g[i] * g[i];
    float t = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

/* Pass 2, one block of SUMSQ_BLOCKS threads: out[0] = sum of part[0..nb). */
__global__ void k_sum_parts(float *out, const float *part, unsigned nb) {
    float t = block_sum(threadIdx.x < nb ? part[threadIdx.x] : 0.0f);
    if (threadIdx.x == 0) out[0] = t;
}

#define SUMSQ_BLOCKS 1024u

void cuda_sumsq(cudaStream_t st, float *out, float *part, size_t part_cap, const bf16 *ga,
                size_t na, const float *g, size_t n) {
    if (na + n == 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), st));
        return;
    }
    int vec = (((uintptr_t)ga | (uintptr_t)g) & 15u) == 0;
    unsigned blocks = grid_for(vec ? na / 8 + n / 4 + 1 : na + n, 256);
    if (blocks > SUMSQ_BLOCKS) blocks = SUMSQ_BLOCKS;
    assert(part_cap >= blocks);
    (void)part_cap;
    k_sumsq<<<blocks, 256, 0, st>>>(part, ga, na, g, n, vec);
    CUDA_CHECK_LAUNCH();
    k_sum_parts<<<1, SUMSQ_BLOCKS, 0, st>>>(out, part, blocks);
    CUDA_CHECK_LAUNCH();
}

/* One AdamW element update: moments m, v and master p in place; returns the new p. */
__device__ __forceinline__ float adamw_one(float &p, float g, float &m, float &v, float beta1,
                                           float beta2, float eps, float decay, float step,
                                           float bc2_sqrt) {
    m = beta1 * m + (1.0f - beta1) * g;
    v = beta2 * v + (1.0f - beta2) * g * g;
    p = p * decay - step * m / (sqrtf(v) / bc2_sqrt + eps);
    return p;
}

/* Four gradient elements from index 4i (G float or bf16), widened to fp32. */
__device__ __forceinline__ float4 grad4(const float *g, size_t i) {
    return reinterpret_cast<const float4 *>(g)[i];
}
__device__ __forceinline__ float4 grad4(const bf16 *g, size_t i) {
    uint2 u = reinterpret_cast<const uint2 *>(g)[i];
    float2 lo = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
    float2 hi = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float grad1(const float *g, size_t i) { return g[i]; }
__device__ __forceinline__ float grad1(const bf16 *g, size_t i) { return __bfloat162float(g[i]); }

/* grad_scale is used as given, or, with sumsq non-NULL, taken from the device-side global norm
 * (adamw_clip: no host round trip). G: the gradient's type (fp32, or bf16 for the matrices).
 * VEC: 4 elements per thread with 16-byte loads and stores (p, m, v 16-byte, g 4 elements and
 * p_act 8-byte aligned: the caller checks), the n % 4 tail scalar by the first threads. The
 * update is memory-bound (30 bytes per element with an fp32 gradient, 28 with bf16). */
template <bool VEC, typename G>
__global__ void k_adamw(float *p, bf16 *p_act, const G *g, float *m, float *v, size_t n,
                        float beta1, float beta2, float eps, float decay, float step,
                        float bc2_sqrt, float grad_scale, const float *sumsq, float clip) {
    if (sumsq) grad_scale = NN_CLIP_SCALE(sumsq[0], clip);
    const size_t stride = (size_t)gridDim.x * blockDim.x, t0 = blockIdx.x * (size_t)blockDim.x +
                                                                threadIdx.x;
    size_t done = 0;
    if (VEC) {
        const size_t n4 = n / 4;
        for (size_t i = t0; i < n4; i += stride) {
            float4 pi = reinterpret_cast<float4 *>(p)[i], gi = grad4(g, i);
            float4 mi = reinterpret_cast<float4 *>(m)[i], vi = reinterpret_cast<float4 *>(v)[i];
            adamw_one(pi.x, gi.x * grad_scale, mi.x, vi.x, beta1, beta2, eps, decay, step,
                      bc2_sqrt);
            adamw_one(pi.y, gi.y * grad_scale, mi.y, vi.y, beta1, beta2, eps, decay, step,
                      bc2_sqrt);
            adamw_one(pi.z, gi.z * grad_scale, mi.z, vi.z, beta1, beta2, eps, decay, step,
                      bc2_sqrt);
            adamw_one(pi.w, gi.w * grad_scale, mi.w, vi.w, beta1, beta2, eps, decay, step,
                      bc2_sqrt);
            reinterpret_cast<float4 *>(p)[i] = pi;
            reinterpret_cast<float4 *>(m)[i] = mi;
            reinterpret_cast<float4 *>(v)[i] = vi;
            if (p_act) {
                __nv_bfloat162 lo = __floats2bfloat162_rn(pi.x, pi.y);
                __nv_bfloat162 hi = __floats2bfloat162_rn(pi.z, pi.w);
                uint2 pk;
                pk.x = *reinterpret_cast<uint32_t *>(&lo);
                pk.y = *reinterpret_cast<uint32_t *>(&hi);
                reinterpret_cast<uint2 *>(p_act)[i] = pk;
            }
        }
        done = n4 * 4;
    }
    for (size_t i = done + t0; i < n; i += stride) {
        float pi = adamw_one(p[i], grad1(g, i) * grad_scale, m[i], v[i], beta1, beta2, eps, decay,
                             step, bc2_sqrt);
        if (p_act) p_act[i] = __float2bfloat16(pi);
    }
}

template <typename G>
static void adamw_launch(cudaStream_t st, float *p, bf16 *p_act, const G *g, float *m, float *v,
                         size_t n, float beta1, float beta2, float eps, float decay, float step,
                         float bc2_sqrt, float grad_scale, const float *sumsq, float clip) {
    uintptr_t al = (uintptr_t)p | (uintptr_t)m | (uintptr_t)v;
    if (al % 16 == 0 && (uintptr_t)g % (4 * sizeof(G)) == 0 && (uintptr_t)p_act % 8 == 0)
        k_adamw<true, G><<<grid_for(n / 4 + 1, 256), 256, 0, st>>>(
            p, p_act, g, m, v, n, beta1, beta2, eps, decay, step, bc2_sqrt, grad_scale, sumsq,
            clip);
    else
        k_adamw<false, G><<<grid_for(n, 256), 256, 0, st>>>(
            p, p_act, g, m, v, n, beta1, beta2, eps, decay, step, bc2_sqrt, grad_scale, sumsq,
            clip);
    CUDA_CHECK_LAUNCH();
}

void cuda_adamw(cudaStream_t st, float *p, bf16 *p_act, const float *g, const bf16 *g_bf16,
                float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
                float wd, float grad_scale, const float *sumsq, float clip, int t) {
    assert(t >= 1 && (g != NULL) != (g_bf16 != NULL));
    if (n == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, t));
    float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
    float step = lr / bc1, decay = 1.0f - lr * wd;
    if (g)
        adamw_launch(st, p, p_act, g, m, v, n, beta1, beta2, eps, decay, step, bc2_sqrt,
                     grad_scale, sumsq, clip);
    else
        adamw_launch(st, p, p_act, g_bf16, m, v, n, beta1, beta2, eps, decay, step, bc2_sqrt,
                     grad_scale, sumsq, clip);
}

/* x *= a, in fp32, rounded once where T is bf16 */
__device__ __forceinline__ void scale_one(float &x, float a) { x *= a; }
__device__ __forceinline__ void scale_one(bf16 &x, float a) {
    x = __float2bfloat16(__bfloat162float(x) * a);
}
template <typename T> __global__ void k_scale(T *x, size_t n, float a) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        scale_one(x[i], a);
}

void cuda_scale(cudaStream_t st, float *x, bf16 *x_bf16, size_t n, float a) {
    if (n == 0) return;
    if (x)
        k_scale<float><<<grid_for(n, 256), 256, 0, st>>>(x, n, a);
    else
        k_scale<bf16><<<grid_for(n, 256), 256, 0, st>>>(x_bf16, n, a);
    CUDA_CHECK_LAUNCH();
}

/* ops_cuda_optim: the cuda backend's optimizer kernels (ops.h sumsq, adamw, adamw_clip,
 * adamw_clip_act, scale_f32, scale_act, grad_accumulate, grad_average), launched by ops_cuda.cu's vtable on the stream it
 * passes (the main one, or the side one for AdamW: these kernels use no context scratch, except
 * sumsq's partials, which the caller provides).
 *
 * sumsq: two fixed-order passes, no float atomics, so every run and every data-parallel rank
 * holding the same gradients gets the same bits. AdamW: memory-bound, 16-byte accesses where
 * aligned: the vectors' (k_adamw) 30 bytes per element (fp32 master, gradient and moments, the
 * bf16 copy), the matrices' (k_adamw_split) 26 (the master split into the bf16 weight and its
 * low half, master_split.h; bf16 gradient; fp32 moments); with sumsq given, the global norm's
 * clipping factor is read on the device (no host round trip). Every kernel computes in fp32
 * and rounds once when it stores a bf16 (the split master's high half: master_split.h's
 * rounding).
 */
#include "ops_cuda.h"

#include "cuda_elem.cuh"
#include "master_split.h"

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

/* grad_scale is used as given, or, with sumsq non-NULL, taken from the device-side global norm
 * (adamw_clip: no host round trip). VEC: 4 elements per thread with 16-byte loads and stores
 * (p, m, v, g 16-byte and p_act 8-byte aligned: the caller checks), the n % 4 tail scalar by
 * the first threads. The update is memory-bound: 30 bytes per element (the vectors: fp32
 * master, gradient and moments, and the bf16 copy). */
template <bool VEC>
__global__ void k_adamw(float *p, bf16 *p_act, const float *g, float *m, float *v, size_t n,
                        float beta1, float beta2, float eps, float decay, float step,
                        float bc2_sqrt, float grad_scale, const float *sumsq, float clip) {
    if (sumsq) grad_scale = NN_CLIP_SCALE(sumsq[0], clip);
    const size_t stride = (size_t)gridDim.x * blockDim.x, t0 = blockIdx.x * (size_t)blockDim.x +
                                                                threadIdx.x;
    size_t done = 0;
    if (VEC) {
        const size_t n4 = n / 4;
        for (size_t i = t0; i < n4; i += stride) {
            float4 pi = reinterpret_cast<float4 *>(p)[i];
            float4 gi = reinterpret_cast<const float4 *>(g)[i];
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
        float pi = adamw_one(p[i], g[i] * grad_scale, m[i], v[i], beta1, beta2, eps, decay, step,
                             bc2_sqrt);
        if (p_act) p_act[i] = __float2bfloat16(pi);
    }
}

/* One AdamW element update of a split master (master_split.h): hi (bf16 bits) and lo in, out. */
__device__ __forceinline__ void adamw_split_one(uint16_t &hi, uint16_t &lo, float g, float &m,
                                                float &v, float beta1, float beta2, float eps,
                                                float decay, float step, float bc2_sqrt) {
    float p = __uint_as_float(nn_master_join(hi, lo));
    adamw_one(p, g, m, v, beta1, beta2, eps, decay, step, bc2_sqrt);
    const uint32_t u = __float_as_uint(p);
    hi = nn_master_hi(u), lo = (uint16_t)u;
}

/* The matrices' AdamW: bf16 gradient g, the master split into the bf16 weights p_hi and the low
 * halves p_lo (26 bytes per element). VEC: 8 elements per thread, every access 16 bytes (p_hi,
 * p_lo, g, m, v 16-byte aligned: the caller checks), the n % 8 tail scalar. The clipping
 * factor as k_adamw's. */
template <bool VEC>
__global__ void k_adamw_split(uint16_t *p_hi, uint16_t *p_lo, const bf16 *g, float *m, float *v,
                              size_t n, float beta1, float beta2, float eps, float decay,
                              float step, float bc2_sqrt, const float *sumsq, float clip) {
    const float grad_scale = NN_CLIP_SCALE(sumsq[0], clip);
    const size_t stride = (size_t)gridDim.x * blockDim.x, t0 = blockIdx.x * (size_t)blockDim.x +
                                                                threadIdx.x;
    size_t done = 0;
    if (VEC) {
        const size_t n8 = n / 8;
        for (size_t i = t0; i < n8; i += stride) {
            union {
                uint4 q;
                uint16_t h[8];
            } hi, lo;
            hi.q = reinterpret_cast<const uint4 *>(p_hi)[i];
            lo.q = reinterpret_cast<const uint4 *>(p_lo)[i];
            float gi[8];
            load8(g + 8 * i, gi);
            float4 *m4 = reinterpret_cast<float4 *>(m) + 2 * i;
            float4 *v4 = reinterpret_cast<float4 *>(v) + 2 * i;
            float4 mv[4] = {m4[0], m4[1], v4[0], v4[1]};
            float *mf = reinterpret_cast<float *>(&mv[0]), *vf = reinterpret_cast<float *>(&mv[2]);
#pragma unroll
            for (int e = 0; e < 8; e++)
                adamw_split_one(hi.h[e], lo.h[e], gi[e] * grad_scale, mf[e], vf[e], beta1, beta2,
                                eps, decay, step, bc2_sqrt);
            reinterpret_cast<uint4 *>(p_hi)[i] = hi.q;
            reinterpret_cast<uint4 *>(p_lo)[i] = lo.q;
            m4[0] = mv[0], m4[1] = mv[1], v4[0] = mv[2], v4[1] = mv[3];
        }
        done = n8 * 8;
    }
    for (size_t i = done + t0; i < n; i += stride)
        adamw_split_one(p_hi[i], p_lo[i], __bfloat162float(g[i]) * grad_scale, m[i], v[i], beta1,
                        beta2, eps, decay, step, bc2_sqrt);
}

/* The step size and decay of AdamW step t (bias corrections in double, as the cpu's). */
struct adamw_consts {
    float step, decay, bc2_sqrt;
};
static adamw_consts adamw_consts_of(float lr, float beta1, float beta2, float wd, int t) {
    float bc1 = (float)(1.0 - pow((double)beta1, t));
    float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
    return adamw_consts{lr / bc1, 1.0f - lr * wd, bc2_sqrt};
}

void cuda_adamw(cudaStream_t st, float *p, bf16 *p_act, const float *g, float *m, float *v,
                size_t n, float lr, float beta1, float beta2, float eps, float wd,
                float grad_scale, const float *sumsq, float clip, int t) {
    assert(t >= 1);
    if (n == 0) return;
    const adamw_consts k = adamw_consts_of(lr, beta1, beta2, wd, t);
    uintptr_t al = (uintptr_t)p | (uintptr_t)m | (uintptr_t)v | (uintptr_t)g;
    if (al % 16 == 0 && (uintptr_t)p_act % 8 == 0)
        k_adamw<true><<<grid_for(n / 4 + 1, 256), 256, 0, st>>>(
            p, p_act, g, m, v, n, beta1, beta2, eps, k.decay, k.step, k.bc2_sqrt, grad_scale,
            sumsq, clip);
    else
        k_adamw<false><<<grid_for(n, 256), 256, 0, st>>>(p, p_act, g, m, v, n, beta1, beta2, eps,
                                                         k.decay, k.step, k.bc2_sqrt, grad_scale,
                                                         sumsq, clip);
    CUDA_CHECK_LAUNCH();
}

void cuda_adamw_split(cudaStream_t st, bf16 *p_hi, uint16_t *p_lo, const bf16 *g, float *m,
                      float *v, size_t n, float lr, float beta1, float beta2, float eps, float wd,
                      const float *sumsq, float clip, int t) {
    assert(t >= 1 && sumsq);
    if (n == 0) return;
    const adamw_consts k = adamw_consts_of(lr, beta1, beta2, wd, t);
    uint16_t *hi = reinterpret_cast<uint16_t *>(p_hi);
    uintptr_t al = (uintptr_t)p_hi | (uintptr_t)p_lo | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v;
    if (al % 16 == 0)
        k_adamw_split<true><<<grid_for(n / 8 + 1, 256), 256, 0, st>>>(
            hi, p_lo, g, m, v, n, beta1, beta2, eps, k.decay, k.step, k.bc2_sqrt, sumsq, clip);
    else
        k_adamw_split<false><<<grid_for(n, 256), 256, 0, st>>>(
            hi, p_lo, g, m, v, n, beta1, beta2, eps, k.decay, k.step, k.bc2_sqrt, sumsq, clip);
    CUDA_CHECK_LAUNCH();
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

/* Gradient accumulation (ops.h grad_accumulate / grad_average): elementwise over a bf16 or an
 * fp32 part, in fp32, a bf16 rounded once when stored. Memory-bound like the scale above. */
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void narrow(float &d, float x) { d = x; }
__device__ __forceinline__ void narrow(bf16 &d, float x) { d = __float2bfloat16(x); }

template <typename T>
__global__ void k_grad_acc(float *acc, const T *g, size_t n, float a, int first) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        acc[i] = first ? a * widen(g[i]) : acc[i] + a * widen(g[i]);
}

template <typename T>
__global__ void k_grad_avg(T *g, const float *acc, size_t n, float a, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        narrow(g[i], (a != 0.0f ? acc[i] + a * widen(g[i]) : acc[i]) * s);
}

void cuda_grad_accumulate(cudaStream_t st, float *acc, const bf16 *ga, size_t na, const float *g,
                          size_t n, float a, int first) {
    if (na) k_grad_acc<bf16><<<grid_for(na, 256), 256, 0, st>>>(acc, ga, na, a, first);
    if (n) k_grad_acc<float><<<grid_for(n, 256), 256, 0, st>>>(acc + na, g, n, a, first);
    CUDA_CHECK_LAUNCH();
}

void cuda_grad_average(cudaStream_t st, bf16 *ga, size_t na, float *g, size_t n,
                       const float *acc, float a, float s) {
    if (na) k_grad_avg<bf16><<<grid_for(na, 256), 256, 0, st>>>(ga, acc, na, a, s);
    if (n) k_grad_avg<float><<<grid_for(n, 256), 256, 0, st>>>(g, acc + na, n, a, s);
    CUDA_CHECK_LAUNCH();
}

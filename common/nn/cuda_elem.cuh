/* cuda_elem: device helpers shared by the cuda backend's memory-bound kernels (ops_cuda.cu,
 * ops_cuda_linear.cu, ops_cuda_norm.cu, ops_cuda_xent.cu, ops_cuda_optim.cu; also
 * bench/cuda_ops/wg_gemm_probe.cu): grid sizes for grid-stride loops,
 * 16-byte loads and stores of 8 bf16, warp and block sums in a fixed order, SwiGLU's value.
 * Header-only (static inline); include from .cu files.
 */
#ifndef DFLASH_NN_CUDA_ELEM_CUH
#define DFLASH_NN_CUDA_ELEM_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stddef.h>

/* Blocks of `threads` for a grid-stride loop over n items: one item per thread, capped (the
 * loops cover the rest); at least 1. */
static inline unsigned grid_for(size_t n, unsigned threads) {
    size_t g = (n + threads - 1) / threads;
    if (g > 65535u * 16u) g = 65535u * 16u;
    return g ? (unsigned)g : 1u;
}

/* 16-byte (8 x bf16) loads and stores (16-byte aligned p). */
static __device__ __forceinline__ void load8(const __nv_bfloat16 *p, float f[8]) {
    uint4 v = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}

static __device__ __forceinline__ void store8(__nv_bfloat16 *p, const float f[8]) {
    uint4 v;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&v);
#pragma unroll
    for (int k = 0; k < 4; k++)
        h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    *reinterpret_cast<uint4 *>(p) = v;
}

/* The sum of v over aligned groups of L lanes (L a power of two, at most 32), in every lane of
 * the group: butterfly steps unrolled, the ones at or past L skipped (warp-uniform). */
static __device__ __forceinline__ float group_sum(float v, int L) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < L) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum of v over the warp's 32 lanes, in every lane (butterfly: the same order each run). */
static __device__ __forceinline__ float warp_sum(float v) {
    return group_sum(v, 32);
}

/* The sum of s over the block, in a fixed order, valid in thread 0. */
static __device__ float block_sum(float s) {
    s = warp_sum(s);
    __shared__ float w[32];
    if (threadIdx.x % 32 == 0) w[threadIdx.x / 32] = s;
    __syncthreads();
    float t = 0.0f;
    if (threadIdx.x == 0)
        for (int i = 0; i < (int)blockDim.x / 32; i++)
            t += w[i];
    return t;
}

/* SwiGLU of one element: silu(g) u, the arithmetic of swiglu_fwd (one function, so that a
 * kernel fusing it elsewhere gives the same bits). __expf and __fdividef: with expf and an IEEE
 * division the pass was bound by their instructions (swiglu_fwd 1.77 -> 1.38 ms per 2 drafter
 * steps, H200; the bf16 outputs' error against the cpu unchanged). __fdividef gives 0 where
 * 1 + e^-g passes 2^126 (g < -87), where silu(g) u is under 1e-36 |u|. */
static __device__ __forceinline__ float swiglu_val(float g, float u) {
    return __fdividef(g, 1.0f + __expf(-g)) * u;
}

#endif

/* cp_async: the Ampere-style asynchronous copies global -> shared (cp.async, 16 bytes per thread
 * and instruction) and their commit groups, shared by the attention kernels (attn_spans.cuh,
 * mma_frag.cuh, wgmma.cuh) and the RMSNorm row kernels of ops_cuda_norm.cu that keep rows in
 * flight through shared memory. sm_80 and later. Header-only device code (no -rdc in this build).
 */
#ifndef DFLASH_CP_ASYNC_CUH
#define DFLASH_CP_ASYNC_CUH

#include <cuda_runtime.h>

/* 16 bytes global -> shared through cp.async; src_bytes 0 zero-fills. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* closes the thread's current group of cp.async */
__device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* all of the thread's groups but the newest N are complete */
template <int N> __device__ __forceinline__ void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* all groups but the newest one are complete */
__device__ __forceinline__ void cp_wait_prev(void) {
    cp_wait<1>();
}

__device__ __forceinline__ void cp_wait_all(void) {
    cp_wait<0>();
}

#endif

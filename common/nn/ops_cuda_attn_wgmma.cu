/* ops_cuda_attn_wgmma: the causal attention forward on Hopper warpgroup MMA (wgmma, sm_90a),
 * head dims 64 and 128, bf16 in and out, fp32 inside. ops_cuda_attn.cu calls it first for
 * attention_causal_fwd in the default mode and falls back to the mma.sync kernel of
 * ops_cuda_attn_mma.cu when it returns -1 (another head dim, a group wider than a CTA, buffers
 * not 16-byte aligned, a device without sm_90a code, or DFLASH_CUDA_ATTN_CAUSAL naming a
 * mma.sync shape such as 4x32). This file alone builds for sm_90a (common/CMakeLists.txt).
 *
 * Rows: as in ops_cuda_attn_mma.cu, a CTA owns TQ = 64 NWG query rows = RT tokens x the `group`
 * query heads of kv head hk (row r: token t_a + r / group, head hk * group + r % group) and
 * every row shares one key range up to its own causal limit. Warpgroup w (128 threads) owns rows
 * 64 w .. 64 w + 63, the M = 64 of its wgmma; in its accumulators (the mma.sync C layout per
 * warp) thread (warp q, lane l) holds rows 16 q + l / 4 and + 8, columns 8 j + 2 (l % 4) + {0, 1}
 * of every 8-column block j. Softmax state (m, l) of those two rows lives in registers, reduced
 * over the 4 lanes of a quad.
 * Shared memory, all in the no-swizzle core-matrix layout (a core matrix = 8 rows x 16 bytes,
 * 128 contiguous bytes; tile element (row, col) at byte ((row / 8) (D / 8) + col / 8) 128 +
 * (row % 8) 16 + (col % 8) 2, so 16-byte chunk i of a tile sits at byte 16 i): Q (TQ x D) and
 * NS = 3 stages of K and V (KT x D each), loaded with cp.async (zero-filled past the range end).
 * Q and K are K-major operands (d contiguous) of S = Q K^T; V is the MN-major B operand of
 * O += P V (d contiguous, the transpose bit set). Descriptor strides: along K (LBO) and along M/N
 * (SBO) core matrices: Q, K 128 and 16 D bytes; V 16 D and 128 bytes.
 * Per key tile i (keys kb = begin + i KT ..): wait for the tile, one CTA barrier (it frees the
 * stage the next refill overwrites), issue that refill, then per warpgroup: S = Q K^T (D / 16
 * wgmma m64nKTk16, both operands from shared memory), online softmax in the log2 domain (mask
 * only where the tile is not wholly inside every row's keys), P = exp2(S - m) packed to bf16 A
 * fragments in registers (the accumulator layout of two 8-column blocks is the A layout of one
 * k16 step), O += P V (KT / 16 wgmma m64nDk16, A from registers).
 *   plain (PIPE false): those steps in order, 2 tiles in flight; a warpgroup skips tiles none
 *     of its rows sees (bounds reduced over its rows once).
 *   PIPE: S of tile i and P V of tile i - 1 are issued back to back and the softmax of tile i
 *     runs while P V of tile i - 1 does (O is rescaled after it); 1 tile in flight (the third
 *     stage is the one P V still reads); every warpgroup computes every tile of the CTA (masked
 *     where unseen), since wgmma in flight across a branch is serialised by ptxas.
 * End: O / l staged through shared memory for 16-byte stores; rows without keys give 0. CTAs
 * run in reverse token order (longest rows first).
 * Shapes (DFLASH_CUDA_ATTN_CAUSAL; NWG x KT, p: PIPE): wg3x64p (default), wg2x128p, wg2x128,
 * wg2x64, wg3x64; d 64 always uses wg2x128. Measured on the H200 (bench/cuda_ops/NOTES.md,
 * 4 x 3072 tokens, H 32 / 8, d 128): wg3x64p 263 TFLOP/s, wg2x128p 213, wg3x64 182,
 * wg2x128 166, wg2x64 165; mma.sync 4x32 201.
 * Resources (ptxas, d 128): wg3x64p 167 registers, 144 KB shared; wg2x128p 244, 224 KB; one CTA
 * per SM.
 * Stream: the caller's. One CTA per SM (launch bounds NWG x 128, 1).
 */
#include "attn_spans.cuh"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

typedef __nv_bfloat16 bf16;

#define NS 3 /* K/V stages */
#define LOG2E 1.4426950408889634f

typedef struct wg_args {
    bf16 *out;
    const bf16 *q, *k, *v;
    const int32_t *seq_off;
    int n_seqs, T, H, Hk, group, RT;
    float scale;
    uint32_t lbo_qk, sbo_qk, lbo_v, sbo_v; /* descriptor strides in bytes */
} wg_args;

/* Device code needs sm_90a; other targets (none in this build) get an empty kernel. */
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_DEVICE 1
#else
#define WG_DEVICE 0
#endif

/* ---- PTX wrappers ---- */

/* Shared-memory matrix descriptor, no swizzle: start address, LBO and SBO in 16-byte units. */
__device__ __forceinline__ uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* all but the newest N committed groups are complete */
template <int N> __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pins an accumulator register after wg_wait0: later reads cannot move above the wait. */
__device__ __forceinline__ void wg_pin(float &x) {
    asm volatile("" : "+f"(x)::"memory");
}

template <int N> __device__ __forceinline__ void wg_pin_all(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
        wg_pin(d[j][0]), wg_pin(d[j][1]), wg_pin(d[j][2]), wg_pin(d[j][3]);
}

/* cp.async copies of this thread are visible to the tensor cores (async proxy) after the
 * following barrier */
__device__ __forceinline__ void fence_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* d (64 x N, the warpgroup's accumulators) = A B (first) or += A B: A = 64 x 16 and B^T = N x 16,
 * both K-major in shared memory (descriptors da, db). */
template <int N>
__device__ __forceinline__ void wg_ss_first(float (&d)[N / 8][4], uint64_t da, uint64_t db);
template <int N>
__device__ __forceinline__ void wg_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db);
/* d (64 x N) += A B: A = 64 x 16 bf16 fragments in registers (the mma.sync A layout per warp),
 * B = 16 x N MN-major in shared memory (descriptor db, transposed). */
template <int N>
__device__ __forceinline__ void wg_rs_t(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db);

#if WG_DEVICE

template <>
__device__ __forceinline__ void wg_ss_first<64>(float (&d)[8][4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), "=f"(d[1][0]),
                   "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]), "=f"(d[2][0]), "=f"(d[2][1]),
                   "=f"(d[2][2]), "=f"(d[2][3]), "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]),
                   "=f"(d[3][3]), "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]),
                   "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]), "=f"(d[6][0]),
                   "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), "=f"(d[7][0]), "=f"(d[7][1]),
                   "=f"(d[7][2]), "=f"(d[7][3])
                 : "l"(da), "l"(db), "r"(0)
                 : "memory");
}

template <> __device__ __forceinline__ void wg_ss<64>(float (&d)[8][4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(da), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_rs_t<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_ss_first<128>(float (&d)[16][4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), "=f"(d[1][0]),
                   "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]), "=f"(d[2][0]), "=f"(d[2][1]),
                   "=f"(d[2][2]), "=f"(d[2][3]), "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]),
                   "=f"(d[3][3]), "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]),
                   "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]), "=f"(d[6][0]),
                   "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), "=f"(d[7][0]), "=f"(d[7][1]),
                   "=f"(d[7][2]), "=f"(d[7][3]), "=f"(d[8][0]), "=f"(d[8][1]), "=f"(d[8][2]),
                   "=f"(d[8][3]), "=f"(d[9][0]), "=f"(d[9][1]), "=f"(d[9][2]), "=f"(d[9][3]),
                   "=f"(d[10][0]), "=f"(d[10][1]), "=f"(d[10][2]), "=f"(d[10][3]), "=f"(d[11][0]),
                   "=f"(d[11][1]), "=f"(d[11][2]), "=f"(d[11][3]), "=f"(d[12][0]), "=f"(d[12][1]),
                   "=f"(d[12][2]), "=f"(d[12][3]), "=f"(d[13][0]), "=f"(d[13][1]), "=f"(d[13][2]),
                   "=f"(d[13][3]), "=f"(d[14][0]), "=f"(d[14][1]), "=f"(d[14][2]), "=f"(d[14][3]),
                   "=f"(d[15][0]), "=f"(d[15][1]), "=f"(d[15][2]), "=f"(d[15][3])
                 : "l"(da), "l"(db), "r"(0)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_ss<128>(float (&d)[16][4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
                   "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]),
                   "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]),
                   "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]),
                   "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "l"(da), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_rs_t<128>(float (&d)[16][4], const uint32_t (&a)[4],
                                             uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                   "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]),
                   "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),
                   "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),
                   "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
                   "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]),
                   "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]),
                   "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]),
                   "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
                 : "memory");
}

#endif /* WG_DEVICE */

/* cp.async of ROWS rows of D bf16 into a core-matrix tile: chunk i (16 bytes) of the tile is
 * column block (i / 8) % (D / 8) of row 8 (i / D) + i % 8, at byte 16 i; row r comes from
 * src + off(r), or is zero when off(r) < 0. Left in flight (the caller commits). */
template <int D, int ROWS, typename F>
__device__ __forceinline__ void load_cm(unsigned char *dst, const bf16 *src, F off) {
    constexpr int CPR = D / 8;
    for (int i = threadIdx.x; i < ROWS * CPR; i += blockDim.x) {
        int r = i / (8 * CPR) * 8 + i % 8, c = (i / 8) % CPR;
        long long o = off(r);
        cp_async16(dst + 16 * i, o >= 0 ? (const void *)(src + o + c * 8) : src, o >= 0 ? 16 : 0);
    }
}

/* K and V rows of keys [kb, kb + KT) of kv head hk into stage st (K at st, V after it) */
template <int D, int KT>
__device__ __forceinline__ void issue_kv(const wg_args &a, int kb, int re, int hk,
                                         unsigned char *st) {
    auto off = [&](int r) -> long long {
        return kb + r < re ? ((long long)(kb + r) * a.Hk + hk) * D : -1;
    };
    load_cm<D, KT>(st, a.k, off);
    load_cm<D, KT>(st + KT * D * 2, a.v, off);
}

template <int D, int NWG, int KT> static size_t wg_smem(void) {
    return (size_t)(64 * NWG + NS * 2 * KT) * D * sizeof(bf16) + 4 * NWG * 4 * sizeof(int);
}

/* Online softmax of one key tile for the thread's rows g, g + 8 (s: raw Q K^T, accumulator
 * layout): masks keys outside [lo, hi) unless full, updates the running max m (log2 domain) and
 * partial sums l, leaves P = exp2(s scale log2e - m) in s and the factor O must be rescaled by
 * in corr (wg_rescale: O may still be accumulating meanwhile). */
template <int KT>
__device__ __forceinline__ void wg_softmax(float (&s)[KT / 8][4], float m[2], float l[2],
                                           float corr[2], int kb, const int lo[2], const int hi[2],
                                           bool full, float sl2) {
    const int tg = threadIdx.x % 4;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = kb + n * 8 + 2 * tg + (e & 1), r = e / 2;
            if (!full && (key < lo[r] || key >= hi[r])) s[n][e] = -INFINITY;
            mx[r] = fmaxf(mx[r], s[n][e]);
        }
    float sub[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mn = fmaxf(m[r], quad_max(mx[r]) * sl2);
        corr[r] = mn == -INFINITY ? 1.0f : ex2(m[r] - mn);
        sub[r] = mn == -INFINITY ? 0.0f : mn;
        m[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = ex2(fmaf(s[n][e], sl2, -sub[e / 2]));
            s[n][e] = p;
            sum[e / 2] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++)
        l[r] = l[r] * corr[r] + sum[r];
}

/* O *= corr per row, and P (s) packed into bf16 A fragments pa (the C layout of 8-column blocks
 * 2 kk, 2 kk + 1 is the A layout of k16 step kk) */
template <int D, int KT>
__device__ __forceinline__ void wg_rescale(float (&o)[D / 8][4], const float corr[2],
                                           const float (&s)[KT / 8][4],
                                           uint32_t (&pa)[KT / 16][4]) {
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        o[dt][0] *= corr[0], o[dt][1] *= corr[0];
        o[dt][2] *= corr[1], o[dt][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++) {
        pa[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

/* S = Q K^T of one key tile into s (issued and committed, not waited for) */
template <int D, int KT>
__device__ __forceinline__ void wg_issue_s(float (&s)[KT / 8][4], uint64_t dq, uint64_t dk) {
    wg_ss_first<KT>(s, dq, dk);
#pragma unroll
    for (int kk = 1; kk < D / 16; kk++) /* k16 step: 2 core matrices (256 bytes) along d */
        wg_ss<KT>(s, dq + kk * 16, dk + kk * 16);
    wg_commit();
}

/* O += P V of one key tile (issued and committed, not waited for) */
template <int D, int KT>
__device__ __forceinline__ void wg_issue_pv(float (&o)[D / 8][4], const uint32_t (&pa)[KT / 16][4],
                                            uint64_t dv) {
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++) /* k16 step: 16 keys = 2 core-matrix rows */
        wg_rs_t<D>(o, pa[kk], dv + kk * (2 * (D / 8) * 128 / 16));
    wg_commit();
}

template <int N> __device__ __forceinline__ void wg_pin_u(uint32_t (&x)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(x[j][e])::"memory");
}

/* min (op 0) or max (op 1) over the 32 lanes */
__device__ __forceinline__ int warp_minmax(int v, int op) {
    for (int o = 16; o > 0; o >>= 1) {
        int w = __shfl_xor_sync(0xffffffffu, v, o);
        v = op ? max(v, w) : min(v, w);
    }
    return v;
}

/* One CTA: TQ = 64 NWG query rows (RT tokens x group heads of kv head blockIdx.y), NWG
 * warpgroups of 64 rows; keys in tiles of KT through NS stages. */
template <int D, int NWG, int KT, bool PIPE>
__global__ void __launch_bounds__(NWG * 128, 1) k_wg_causal(wg_args a) {
#if WG_DEVICE
    constexpr int TQ = 64 * NWG, CPR = D / 8, TILE_B = KT * D * 2, LD = D + 8;
    extern __shared__ __align__(1024) unsigned char sm[];
    unsigned char *Qs = sm, *KV = sm + TQ * D * 2;
    int *red = (int *)(KV + NS * 2 * TILE_B); /* [warp][4] bounds */
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, wq = warp % 4;
    const int lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int hk = blockIdx.y, group = a.group;
    const int tile = gridDim.x - 1 - blockIdx.x; /* long rows first */
    int t_a, R, nr, rng[4] = {0, 0, 0, 0};
    attn_tile_keys(a.seq_off, a.n_seqs, a.T, NULL, 0, a.RT, 1, tile, t_a, R, nr, rng);
    const int NR = R * group;
    load_cm<D, TQ>(Qs, a.q, [&](int r) -> long long {
        if (r >= NR) return -1;
        int t = t_a + r / group, h = hk * group + r % group;
        return ((long long)t * a.H + h) * D;
    });
    /* tiles in flight ahead of the one computed: 2, or 1 with PIPE (whose P V of tile i - 1
     * still reads stage i - 1 while tile i is computed) */
    constexpr int DIST = PIPE ? 1 : 2;
    const int n_tiles = nr ? (rng[1] - rng[0] + KT - 1) / KT : 0;
#pragma unroll
    for (int j = 0; j < DIST; j++) {
        if (j < n_tiles) issue_kv<D, KT>(a, rng[0] + j * KT, rng[1], hk, KV + j * 2 * TILE_B);
        cp_commit();
    }

    /* keys [lo, hi) of rows g, g + 8 of this warp; the warpgroup's bounds: any key of a tile
     * is seen only inside [lo_any, hi_any) (rows with keys), every row sees [lo_all, hi_all) */
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = 64 * wg + 16 * wq + g + 8 * i;
        lo[i] = 0, hi[i] = 0;
        if (r < NR) attn_row_keys(a.seq_off, a.n_seqs, a.T, t_a + r / group, lo[i], hi[i]);
    }
    {
        bool k0 = lo[0] < hi[0], k1 = lo[1] < hi[1];
        int v[4] = {min(k0 ? lo[0] : INT_MAX, k1 ? lo[1] : INT_MAX),
                    max(k0 ? hi[0] : INT_MIN, k1 ? hi[1] : INT_MIN), max(lo[0], lo[1]),
                    min(hi[0], hi[1])};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int w = warp_minmax(v[j], j == 1 || j == 2);
            if (lane == 0) red[warp * 4 + j] = w;
        }
    }
    __syncthreads();
    int lo_any = INT_MAX, hi_any = INT_MIN, lo_all = INT_MIN, hi_all = INT_MAX;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const int *b = red + (4 * wg + w) * 4;
        lo_any = min(lo_any, b[0]), hi_any = max(hi_any, b[1]);
        lo_all = max(lo_all, b[2]), hi_all = min(hi_all, b[3]);
    }

    const float sl2 = a.scale * LOG2E;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    const uint64_t dq = wg_desc(Qs + wg * 64 * D * 2, a.lbo_qk, a.sbo_qk);

    /* per tile: wait for it, one CTA barrier (after it the stage that tile i + DIST refills, that
     * of tile i - 1, or i - 2 with PIPE, is free), issue that refill */
    auto next_tile = [&](int i) {
        cp_wait<DIST - 1>();
        fence_async_smem();
        __syncthreads();
        if (i + DIST < n_tiles)
            issue_kv<D, KT>(a, rng[0] + (i + DIST) * KT, rng[1], hk,
                            KV + ((i + DIST) % NS) * 2 * TILE_B);
        cp_commit();
    };
    uint32_t pa[KT / 16][4];
    float s[KT / 8][4], corr[2];
    if constexpr (!PIPE) {
        for (int i = 0; i < n_tiles; i++) {
            next_tile(i);
            const int kb = rng[0] + i * KT, ke = min(kb + KT, rng[1]);
            if (!(kb < hi_any && ke > lo_any)) continue; /* uniform over the warpgroup */
            const bool full = kb >= lo_all && kb + KT <= hi_all && kb + KT <= rng[1];
            const unsigned char *Kt = KV + (i % NS) * 2 * TILE_B, *Vt = Kt + TILE_B;
            wg_fence();
            wg_issue_s<D, KT>(s, dq, wg_desc(Kt, a.lbo_qk, a.sbo_qk));
            wg_wait<0>();
            wg_pin_all(s);
            wg_softmax<KT>(s, m, l, corr, kb, lo, hi, full, sl2);
            wg_rescale<D, KT>(o, corr, s, pa);
            wg_fence();
            wg_issue_pv<D, KT>(o, pa, wg_desc(Vt, a.lbo_v, a.sbo_v));
            wg_wait<0>();
            wg_pin_all(o);
            wg_pin_u(pa);
        }
    } else if (n_tiles > 0) {
        /* PIPE: S of tile i and P V of tile i - 1 are issued together, the softmax of tile i
         * runs while P V does; every warpgroup computes every tile (the ones it does not see
         * are masked: a branch around wgmma in flight would serialise them) */
        uint64_t pv = 0;
        auto step = [&](int i, auto with_pv) {
            next_tile(i);
            const int kb = rng[0] + i * KT;
            const bool full = kb >= lo_all && kb + KT <= hi_all && kb + KT <= rng[1];
            const unsigned char *Kt = KV + (i % NS) * 2 * TILE_B, *Vt = Kt + TILE_B;
            wg_fence();
            wg_issue_s<D, KT>(s, dq, wg_desc(Kt, a.lbo_qk, a.sbo_qk));
            if constexpr (decltype(with_pv)::value) {
                wg_issue_pv<D, KT>(o, pa, pv);
                wg_wait<1>();
            } else {
                wg_wait<0>();
            }
            wg_pin_all(s);
            wg_softmax<KT>(s, m, l, corr, kb, lo, hi, full, sl2);
            wg_wait<0>();
            wg_pin_all(o);
            wg_pin_u(pa);
            wg_rescale<D, KT>(o, corr, s, pa);
            pv = wg_desc(Vt, a.lbo_v, a.sbo_v);
        };
        step(0, std::false_type());
        for (int i = 1; i < n_tiles; i++)
            step(i, std::true_type());
        wg_fence();
        wg_issue_pv<D, KT>(o, pa, pv);
        wg_wait<0>();
        wg_pin_all(o);
        wg_pin_u(pa);
    }
    cp_wait<0>();
    __syncthreads(); /* shared memory is free: stage the output rows (stride LD) */

    bf16 *St = (bf16 *)sm + (64 * wg + 16 * wq) * LD;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = quad_sum(l[r]);
        inv[r] = lt > 0.0f ? 1.0f / lt : 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        *(uint32_t *)(St + g * LD + dt * 8 + 2 * tg) =
            pack_bf16x2(o[dt][0] * inv[0], o[dt][1] * inv[0]);
        *(uint32_t *)(St + (g + 8) * LD + dt * 8 + 2 * tg) =
            pack_bf16x2(o[dt][2] * inv[1], o[dt][3] * inv[1]);
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * CPR; idx += 32) {
        int rr = idx / CPR, c = idx % CPR, r = 64 * wg + 16 * wq + rr;
        if (r >= NR) continue;
        int t = t_a + r / group, h = hk * group + r % group;
        *(uint4 *)(a.out + ((size_t)t * a.H + h) * D + c * 8) =
            *(const uint4 *)(St + rr * LD + c * 8);
    }
#else
    (void)a;
#endif
}

/* ------------------------------------------------------------------------------------------ */

enum { WG_OFF = 0, WG_2x128, WG_2x64, WG_3x64, WG_2x128P, WG_3x64P };

/* DFLASH_CUDA_ATTN_CAUSAL: unset, empty or "wgmma": the default shape; wg2x128, wg2x64, wg3x64,
 * wg2x128p, wg3x64p (p: PIPE): that one; anything else (a mma.sync shape such as 4x32): off. */
static int wg_shape(void) {
    static int shape = -1;
    if (shape < 0) {
        const char *e = getenv("DFLASH_CUDA_ATTN_CAUSAL");
        if (!e || !*e || strcmp(e, "wgmma") == 0)
            shape = WG_2x128;
        else if (strcmp(e, "wg2x128") == 0)
            shape = WG_2x128;
        else if (strcmp(e, "wg2x64") == 0)
            shape = WG_2x64;
        else if (strcmp(e, "wg3x64") == 0)
            shape = WG_3x64;
        else if (strcmp(e, "wg2x128p") == 0)
            shape = WG_2x128P;
        else if (strcmp(e, "wg3x64p") == 0)
            shape = WG_3x64P;
        else
            shape = WG_OFF;
    }
    return shape;
}

static int g_wg_ready; /* 1: the kernels' limits are set and the device runs sm_90a code */

template <int D, int NWG, int KT, bool PIPE> static int wg_attr(void) {
    return cudaFuncSetAttribute(k_wg_causal<D, NWG, KT, PIPE>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)wg_smem<D, NWG, KT>()) != cudaSuccess;
}

int cuda_wg_attention_init(void) {
    int dev, major = 0, minor = 0;
    g_wg_ready = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (major != 9 || minor != 0) return 0; /* sm_90a code runs on compute capability 9.0 only */
    int bad = wg_attr<64, 2, 128, false>() | wg_attr<128, 2, 128, false>() |
              wg_attr<128, 2, 64, false>() | wg_attr<128, 3, 64, false>() |
              wg_attr<128, 2, 128, true>() | wg_attr<128, 3, 64, true>();
    if (bad) {
        (void)cudaGetLastError(); /* no usable image: the mma.sync kernels serve */
        return 0;
    }
    g_wg_ready = 1;
    return 0;
}

template <int D, int NWG, int KT, bool PIPE>
static void wg_launch(cudaStream_t st, wg_args &a, int T) {
    a.RT = 64 * NWG / a.group;
    dim3 grid((T + a.RT - 1) / a.RT, a.Hk);
    k_wg_causal<D, NWG, KT, PIPE><<<grid, NWG * 128, wg_smem<D, NWG, KT>(), st>>>(a);
}

int cuda_wg_attention_causal_fwd(cudaStream_t st, bf16 *out, const bf16 *q, const bf16 *k,
                                 const bf16 *v, const int32_t *seq_off, int n_seqs, int T, int H,
                                 int Hk, int d) {
    const int shape = wg_shape();
    const int rows = (shape == WG_3x64 || shape == WG_3x64P) && d == 128 ? 192 : 128;
    if (!g_wg_ready || shape == WG_OFF || (d != 64 && d != 128) || Hk <= 0 || H % Hk != 0 ||
        H / Hk > rows || n_seqs <= 0 || T <= 0)
        return -1;
    const uintptr_t al = (uintptr_t)out | (uintptr_t)q | (uintptr_t)k | (uintptr_t)v;
    if (al & 15u) return -1;
    wg_args a = {};
    a.out = out, a.q = q, a.k = k, a.v = v, a.seq_off = seq_off, a.n_seqs = n_seqs, a.T = T;
    a.H = H, a.Hk = Hk, a.group = H / Hk, a.scale = 1.0f / sqrtf((float)d);
    a.lbo_qk = 128, a.sbo_qk = 16 * d, a.lbo_v = 16 * d, a.sbo_v = 128;
    if (d == 64)
        wg_launch<64, 2, 128, false>(st, a, T);
    else if (shape == WG_2x64)
        wg_launch<128, 2, 64, false>(st, a, T);
    else if (shape == WG_3x64)
        wg_launch<128, 3, 64, false>(st, a, T);
    else if (shape == WG_2x128P)
        wg_launch<128, 2, 128, true>(st, a, T);
    else if (shape == WG_3x64P)
        wg_launch<128, 3, 64, true>(st, a, T);
    else
        wg_launch<128, 2, 128, false>(st, a, T);
    CUDA_CHECK_LAUNCH();
    return 0;
}

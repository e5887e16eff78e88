/* wgmma: the Hopper warpgroup-MMA building blocks (sm_90a) that the wgmma attention kernels share
 * (ops_cuda_attn_wgmma.cu, the causal forward; ops_cuda_attn_wgbwd.cu, the block backward):
 * PTX wrappers for wgmma.mma_async (m64nNk16, bf16 in, fp32 accumulators; A and B from shared
 * memory through descriptors, or A from registers), its fence / commit / wait, the packing of
 * accumulators into register A fragments (wg_pack_a), mbarriers (with expected transaction
 * bytes, or arrivals on the completion of a thread's cp.async), tensor copies (TMA,
 * cp.async.bulk.tensor of 3 or 4 dimensions onto an mbarrier), tensor reductions
 * (cp.reduce.async.bulk.tensor, 3 dimensions), the async-proxy fence (load_cm, the cp.async
 * loads into the core-matrix layout, is in attn_spans.cuh).
 * Layout (no swizzle): a core matrix is 8 rows x 16 bytes, 128 contiguous bytes; a tile of ROWS
 * rows x D bf16 puts element (row, col) at byte ((row / 8) (D / 8) + col / 8) 128 + (row % 8) 16
 * + (col % 8) 2. A descriptor's LBO is the byte distance between core matrices adjacent along
 * K, its SBO between those adjacent along M or N: a K-major operand (the contiguous 16 bytes run
 * along K) of such a tile has LBO 128 and SBO 16 D; an MN-major one (the transpose bit set) LBO
 * 16 D and SBO 128, D being the tile's width in elements.
 * Also: 5-dimensional tensor copies, setmaxnreg, and descriptors of the 128-byte-swizzled layout
 * (wg_desc_sw128, wg_issue_s_sw) for the block forward's producer kernel and the block
 * backward's Q, dO tiles.
 * Accumulators: per warp the mma.sync C layout (thread lane holds rows 16 (warp % 4) + lane / 4
 * and + 8, columns 8 j + 2 (lane % 4) + {0, 1}); A from registers: the mma.sync A layout.
 * Header-only device code (no -rdc in this build), plus two host helpers, wg_device_runs_sm90a
 * and wg_tensor_map_encoder; include only from sm_90a translation units.
 */
#ifndef DFLASH_WGMMA_CUH
#define DFLASH_WGMMA_CUH

#include "attn_spans.cuh"
#include "mma_frag.cuh"

#include <cuda.h> /* CUtensorMap (the encoder is found through the runtime) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

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

/* The same for a 128-byte-swizzled layout (rows of 128 bytes, 16-byte chunk c of row r at chunk
 * c ^ (r % 8), in 1024-byte-aligned groups of 8 rows; the layout of tensor copies with
 * CU_TENSOR_MAP_SWIZZLE_128B). K-major: SBO 1024 between 8-row groups, LBO unused (16);
 * MN-major: LBO between 64-element column blocks, SBO 1024 between 8-row groups along K. */
__device__ __forceinline__ uint64_t wg_desc_sw128(const void *p, uint32_t lbo, uint32_t sbo) {
    return wg_desc(p, lbo, sbo) | (1ull << 62);
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

/* mbarriers (MODE 2): init by one thread, arrive, and wait for the completion of the phase of
 * the given parity */
__device__ __forceinline__ void mb_init(uint64_t *b, int count) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}

__device__ __forceinline__ void mb_arrive(uint64_t *b) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a)
                 : "memory");
}

__device__ __forceinline__ void mb_wait(uint64_t *b, int parity) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(b), done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* mbarrier arrival made by the completion of all prior cp.async of this thread; not counted in
 * advance (.noinc): mb_init's count includes it */
__device__ __forceinline__ void mb_arrive_cp_async(uint64_t *b) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}

/* mbarrier arrival that also expects tx bytes of asynchronous copies in the current phase */
__device__ __forceinline__ void mb_arrive_tx(uint64_t *b, uint32_t tx) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(tx)
                 : "memory");
}

/* mb_init's barriers are visible to the async proxy (the tensor-copy engine) after the following
 * barrier */
__device__ __forceinline__ void mb_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* A tensor copy as tma_load_3d (below) with a 5-dimensional map */
__device__ __forceinline__ void tma_load_5d(void *dst, const void *map, int c0, int c1, int c2,
                                            int c3, int c4, uint64_t *b) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
        ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2),
        "r"(c3), "r"(c4), "r"((uint32_t)__cvta_generic_to_shared(b))
        : "memory");
}

/* This warpgroup's register limit per thread becomes N (all its threads; N a multiple of 8 in
 * 24 .. 256): inc waits until the CTA's pool, fixed at launch, has the registers that another
 * warpgroup's dec gave back. */
template <int N> __device__ __forceinline__ void wg_setmaxnreg_inc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void wg_setmaxnreg_dec(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* Tensor copy (TMA) of the box of tensor map *map at element coordinates (c0, c1, c2) into
 * shared memory at dst; its bytes complete on mbarrier b. map: a kernel parameter
 * (__grid_constant__) or global memory. One thread. */
__device__ __forceinline__ void tma_load_3d(void *dst, const void *map, int c0, int c1, int c2,
                                            uint64_t *b) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"((uint32_t)__cvta_generic_to_shared(b))
        : "memory");
}

/* tma_load_3d with a 4-dimensional map */
__device__ __forceinline__ void tma_load_4d(void *dst, const void *map, int c0, int c1, int c2,
                                            int c3, uint64_t *b) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"((uint32_t)__cvta_generic_to_shared(b))
        : "memory");
}

/* Tensor reduction (TMA): the box of tensor map *map at element coordinates (c0, c1, c2) +=
 * the box at src in shared memory (laid out, and swizzled, as the map says), element type and
 * operation add as the map's type allows (f32 here); added to this thread's open bulk group,
 * not committed; src must not change before bulk_wait_read. One thread. */
__device__ __forceinline__ void tma_red_add_3d(const void *map, int c0, int c1, int c2,
                                               const void *src) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group"
                 " [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
                 "r"(c0), "r"(c1), "r"(c2), "r"((uint32_t)__cvta_generic_to_shared(src))
                 : "memory");
}

/* d (64 x N, the warpgroup's accumulators) = A B (first) or += A B: A = 64 x 16 and B^T = N x 16,
 * both K-major in shared memory (descriptors da, db). */
template <int N>
__device__ __forceinline__ void wg_ss_first(float (&d)[N / 8][4], uint64_t da, uint64_t db);
template <int N>
__device__ __forceinline__ void wg_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db);
/* d (64 x N) = A B (first) or += A B with both operands MN-major in shared memory (the transpose
 * bits set): A^T = 16 x 64 and B = 16 x N, each stored with M or N contiguous. */
template <int N>
__device__ __forceinline__ void wg_ss_tt_first(float (&d)[N / 8][4], uint64_t da, uint64_t db);
template <int N>
__device__ __forceinline__ void wg_ss_tt(float (&d)[N / 8][4], uint64_t da, uint64_t db);
/* d (64 x N) += A B: A = 64 x 16 bf16 fragments in registers (the mma.sync A layout per warp),
 * B = 16 x N MN-major in shared memory (descriptor db, transposed). */
template <int N>
__device__ __forceinline__ void wg_rs_t(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db);

#if WG_DEVICE

/* The accumulator operands of one wgmma, constraint K ("+f" or "=f") on each of d[8][4] or
 * d[16][4], and the instruction text's matching register lists. */
#define WG_ACC8(K, d) \
    K(d[0][0]), K(d[0][1]), K(d[0][2]), K(d[0][3]), K(d[1][0]), K(d[1][1]), K(d[1][2]), \
    K(d[1][3]), K(d[2][0]), K(d[2][1]), K(d[2][2]), K(d[2][3]), K(d[3][0]), K(d[3][1]), \
    K(d[3][2]), K(d[3][3]), K(d[4][0]), K(d[4][1]), K(d[4][2]), K(d[4][3]), K(d[5][0]), \
    K(d[5][1]), K(d[5][2]), K(d[5][3]), K(d[6][0]), K(d[6][1]), K(d[6][2]), K(d[6][3]), \
    K(d[7][0]), K(d[7][1]), K(d[7][2]), K(d[7][3])
#define WG_ACC16(K, d) \
    WG_ACC8(K, d), K(d[8][0]), K(d[8][1]), K(d[8][2]), K(d[8][3]), K(d[9][0]), K(d[9][1]), \
    K(d[9][2]), K(d[9][3]), K(d[10][0]), K(d[10][1]), K(d[10][2]), K(d[10][3]), K(d[11][0]), \
    K(d[11][1]), K(d[11][2]), K(d[11][3]), K(d[12][0]), K(d[12][1]), K(d[12][2]), K(d[12][3]), \
    K(d[13][0]), K(d[13][1]), K(d[13][2]), K(d[13][3]), K(d[14][0]), K(d[14][1]), K(d[14][2]), \
    K(d[14][3]), K(d[15][0]), K(d[15][1]), K(d[15][2]), K(d[15][3])
#define WG_REGS32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
/* scale-d predicate from operand P, then one wgmma of shape SHAPE on the registers REGS with the
 * A and B operands (and immediates) of TAIL */
#define WG_ASM(P, SHAPE, REGS, TAIL)                                                               \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE            \
    ".f32.bf16.bf16 " REGS ", " TAIL ";\n}\n"

template <>
__device__ __forceinline__ void wg_ss_first<64>(float (&d)[8][4], uint64_t da, uint64_t db) {
    asm volatile(WG_ASM(34, "m64n64k16", WG_REGS32, "%32, %33, p, 1, 1, 0, 0")
                 : WG_ACC8("=f", d)
                 : "l"(da), "l"(db), "r"(0)
                 : "memory");
}

template <> __device__ __forceinline__ void wg_ss<64>(float (&d)[8][4], uint64_t da, uint64_t db) {
    asm volatile(WG_ASM(34, "m64n64k16", WG_REGS32, "%32, %33, p, 1, 1, 0, 0")
                 : WG_ACC8("+f", d)
                 : "l"(da), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_rs_t<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(WG_ASM(37, "m64n64k16", WG_REGS32, "{%32, %33, %34, %35}, %36, p, 1, 1, 1")
                 : WG_ACC8("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_ss_first<128>(float (&d)[16][4], uint64_t da, uint64_t db) {
    asm volatile(WG_ASM(66, "m64n128k16", WG_REGS64, "%64, %65, p, 1, 1, 0, 0")
                 : WG_ACC16("=f", d)
                 : "l"(da), "l"(db), "r"(0)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_ss<128>(float (&d)[16][4], uint64_t da, uint64_t db) {
    asm volatile(WG_ASM(66, "m64n128k16", WG_REGS64, "%64, %65, p, 1, 1, 0, 0")
                 : WG_ACC16("+f", d)
                 : "l"(da), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_rs_t<128>(float (&d)[16][4], const uint32_t (&a)[4],
                                             uint64_t db) {
    asm volatile(WG_ASM(69, "m64n128k16", WG_REGS64, "{%64, %65, %66, %67}, %68, p, 1, 1, 1")
                 : WG_ACC16("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_ss_tt_first<64>(float (&d)[8][4], uint64_t da, uint64_t db) {
    asm volatile(WG_ASM(34, "m64n64k16", WG_REGS32, "%32, %33, p, 1, 1, 1, 1")
                 : WG_ACC8("=f", d)
                 : "l"(da), "l"(db), "r"(0)
                 : "memory");
}

template <>
__device__ __forceinline__ void wg_ss_tt<64>(float (&d)[8][4], uint64_t da, uint64_t db) {
    asm volatile(WG_ASM(34, "m64n64k16", WG_REGS32, "%32, %33, p, 1, 1, 1, 1")
                 : WG_ACC8("+f", d)
                 : "l"(da), "l"(db), "r"(1)
                 : "memory");
}

#endif /* WG_DEVICE */

/* S = Q K^T of one key tile into s (issued and committed, not waited for). k16 step: 2 core
 * matrices along d, 256 bytes in the layout above; BSTEP: the B descriptor's step (16-byte
 * units) where B lies in another layout */
template <int D, int KT, int BSTEP = 16>
__device__ __forceinline__ void wg_issue_s(float (&s)[KT / 8][4], uint64_t dq, uint64_t dk) {
    wg_ss_first<KT>(s, dq, dk);
#pragma unroll
    for (int kk = 1; kk < D / 16; kk++)
        wg_ss<KT>(s, dq + kk * 16, dk + kk * BSTEP);
    wg_commit();
}

/* wg_issue_s with B (KT rows x D) in the 128-byte-swizzled layout (D / 64 blocks of KT rows of
 * 128 bytes; db = wg_desc_sw128(tile, 16, 1024), K-major): k16 step kk at 32 (kk % 4) bytes
 * into the rows of block kk / 4 */
template <int D, int KT>
__device__ __forceinline__ void wg_issue_s_sw(float (&s)[KT / 8][4], uint64_t dq, uint64_t db) {
    wg_ss_first<KT>(s, dq, db);
#pragma unroll
    for (int kk = 1; kk < D / 16; kk++)
        wg_ss<KT>(s, dq + kk * 16, db + (kk / 4) * (KT * 128 / 16) + (kk % 4) * 2);
    wg_commit();
}

/* O += P V of one key tile (issued and committed, not waited for). k16 step: 16 keys, 2
 * core-matrix rows of the layout above; BSTEP as for wg_issue_s */
template <int D, int KT, int BSTEP = 2 * (D / 8) * 128 / 16>
__device__ __forceinline__ void wg_issue_pv(float (&o)[D / 8][4], const uint32_t (&pa)[KT / 16][4],
                                            uint64_t dv) {
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++)
        wg_rs_t<D>(o, pa[kk], dv + kk * BSTEP);
    wg_commit();
}

/* bf16 A fragments of k16 steps 0 .. N / 2 - 1 from C-layout accumulators of N 8-column blocks
 * (the C layout of blocks 2 kk, 2 kk + 1 is the A layout of step kk): P for P V, dS for dS Q */
template <int N>
__device__ __forceinline__ void wg_pack_a(uint32_t (&f)[N / 2][4], const float (&c)[N][4]) {
#pragma unroll
    for (int kk = 0; kk < N / 2; kk++) {
        f[kk][0] = pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
        f[kk][1] = pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
        f[kk][2] = pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        f[kk][3] = pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
}

template <int N> __device__ __forceinline__ void wg_pin_u(uint32_t (&x)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(x[j][e])::"memory");
}

/* Host side: whether the current device runs this build's sm_90a code (compute capability 9.0
 * exactly); false, with the CUDA error cleared, when the device cannot be queried. */
static inline bool wg_device_runs_sm90a(void) {
    int dev, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
}

/* cuTensorMapEncodeTiled (driver API), found through the runtime: the encoder of the tensor
 * maps of the tensor copies; NULL (the CUDA error cleared) where the driver has none. */
typedef CUresult (*wg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                 const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                 const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static inline wg_encode_fn wg_tensor_map_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult qr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &qr) == cudaSuccess &&
        qr == cudaDriverEntryPointSuccess)
        return (wg_encode_fn)fn;
    (void)cudaGetLastError();
    return NULL;
}

/* The 128-byte-swizzled map of a bf16 tensor [tokens, heads, 128] (row-major): dims (64, heads,
 * tokens, 2), the last one the two 64-column halves of a row (stride 128 bytes), box
 * 64 x box_heads x box_tokens x box_halves; a tile lands as box_halves blocks of rows of 128
 * bytes, as the wgmma descriptors of SWIZZLE_128B read them. 0, or -1 where enc refuses. */
static inline int wg_map_sw128(wg_encode_fn enc, CUtensorMap *map, const void *base, int heads,
                               int tokens, int box_heads, int box_tokens, int box_halves) {
    const cuuint64_t row = 128 * 2, h = (cuuint64_t)heads; /* bytes of one head's row */
    const cuuint64_t dims[4] = {64, h, (cuuint64_t)tokens, 2};
    const cuuint64_t strides[3] = {row, h * row, 64 * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_heads, (cuuint32_t)box_tokens,
                               (cuuint32_t)box_halves};
    const cuuint32_t one[4] = {1, 1, 1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dims, strides, box, one,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

#endif

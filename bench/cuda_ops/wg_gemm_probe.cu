/* wg_gemm_probe: can a GEMM of our own match cuBLASLt's joules per FLOP at the power limit?
 *
 * A one-off measurement behind bench/cuda_ops/NOTES.md, "A GEMM of our own at the limit". What
 * is left between the drafter step and 1.3x PyTorch lies in fusions that cuBLASLt cannot do
 * (SwiGLU into the gate|up product's epilogue, the softmax statistics into the lm_head's), and
 * at the board's 700 W limit a product's time is its energy. Such fusions pay only if a kernel
 * of ours spends about cuBLASLt's joules per FLOP. This program times a plain one against
 * cuBLASLt (the best of the heuristic's 8 by a cool timing, as ops_cuda picks) on the step's
 * largest shapes: cool (median of 5 runs) and sustained (SECONDS, default 1.5, after 0.3 s of
 * heating; joules from NVML's counter, ../target/energy.h), and checks its output against
 * cuBLASLt's. Usage: wg_gemm_probe [SECONDS [swiglu]]; `swiglu` times only the fusion that
 * the kernel is for (swiglu_test).
 *
 * The kernel: Y[M, N] = X[M, K] W[N, K]^T (row-major bf16, fp32 accumulation; linear_fwd's
 * product). Persistent CTAs of 3 warpgroups: a producer (one thread issues the tensor copies:
 * X tiles of 128 x 64 and W tiles of 256 x 64, 128-byte swizzled, STAGES deep) and two
 * consumers, each 64 rows x 256 columns, releasing a stage when its wgmma group completes;
 * tiles in groups of 16 along M for L2 reuse; one m64n256k16 wgmma per k16 step. Template
 * choices, each a variant timed in some call (bench/RESULTS.md): STAGES; the epilogue (EPI_*,
 * see the kernel); clusters of 2 CTAs sharing the W tile by multicast. The variants list holds
 * the last call's (EPI_NONE: the product without its epilogue, a bound, not a product; the
 * clusters of 2 stay in the kernel, last timed in call 7); the variants of earlier calls (direct
 * or row-staged stores, two m64n128k16 per k16 step) are in the commits that RESULTS names. The
 * SwiGLU kernel ran in the drafter step in ba96453 (reverted). Not built by CMake:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. -Icommon/nn bench/cuda_ops/wg_gemm_probe.cu \
 *     -o wg_gemm_probe -lcublasLt -lcuda -ldl
 */
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_elem.cuh"
#include "probe_check.h"
#include "wgmma.cuh"

#include "../target/energy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <unistd.h>

#define BM 128
#define BN 256
#define BK 64
#define GROUP_M 16
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)

enum { EPI_TMA, EPI_TMA_HALF, EPI_NONE }; /* the epilogues (see the kernel) */

/* The staging of epilogue epi, and the shared memory of a variant: its stages, the staging,
 * the alignment slack and the barriers */
__host__ __device__ constexpr int staging_bytes(int epi) {
    return epi == EPI_TMA ? BM * BN * 2 : epi == EPI_TMA_HALF ? BM * BN : 0;
}
static constexpr int smem_bytes(int stages, int epi) {
    return stages * (A_BYTES + B_BYTES) + staging_bytes(epi) + 1024 + 2 * stages * 8;
}

struct tile_of {
    int m0, n0;
};

/* Tile t of tm x tn in groups of GROUP_M tiles along M (M fastest inside a group) */
__device__ __forceinline__ tile_of tile_at(int t, int tm, int tn) {
    int per_group = GROUP_M * tn, g = t / per_group, r = t % per_group;
    int rows = min(GROUP_M, tm - g * GROUP_M);
    tile_of o;
    o.m0 = (g * GROUP_M + r % rows) * BM;
    o.n0 = (r / rows) * BN;
    return o;
}

/* Tensor store (TMA) of the box at smem src to tensor map *map at (c0, c1), in this thread's
 * bulk group; bulk_commit closes the group, bulk_wait_read waits until no group of this thread
 * still reads shared memory. */
__device__ __forceinline__ void tma_store_2d(const void *map, int c0, int c1, const void *src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"((uint32_t)__cvta_generic_to_shared(src))
                 : "memory");
}
__device__ __forceinline__ void bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* tma_load_3d delivered to the same offset in every CTA of the cluster in mask, each CTA's
 * barrier at b's offset receiving its bytes */
__device__ __forceinline__ void tma_load_3d_mc(void *dst, const void *map, int c0, int c1, int c2,
                                               uint64_t *b, uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
        ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2),
        "r"((uint32_t)__cvta_generic_to_shared(b)), "h"(mask)
        : "memory");
}

/* arrival on the barrier at b's offset in cluster CTA rank */
__device__ __forceinline__ void mb_arrive_cluster(uint64_t *b, int rank) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(b), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(r)
                 : "memory");
}

__device__ __forceinline__ void cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ int cluster_rank(void) {
    int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

/* The 128 accumulator operands of an m64n256 wgmma (d[32][4]) and their register list */
#define WG_ACC32(K, d) WG_ACC16(K, d), WG_ACC16(K, (d + 16))
#define WG_REGS128 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
    "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, " \
    "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, " \
    "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

/* d (64 x 256) = A B + (add ? d : 0), both K-major in shared memory, the scale-d predicate taken
 * at run time: the first k16 step of a tile is the same code as the others (two code paths
 * made ptxas insert warpgroup waits); one wgmma reads the A fragment once for all 256 columns */
__device__ __forceinline__ void wg_ss256_scaled(float (&d)[32][4], uint64_t da, uint64_t db,
                                                int add) {
#if WG_DEVICE
    asm volatile(WG_ASM(130, "m64n256k16", WG_REGS128, "%128, %129, p, 1, 1, 0, 0")
                 : WG_ACC32("+f", d)
                 : "l"(da), "l"(db), "r"(add)
                 : "memory");
#endif
}

/* Releases a stage (its empty barrier): one arrival per consumer warpgroup, on this CTA's
 * barrier and (CL 2) on the peer's, whose producer multicasts into this CTA's stage too */
template <int CL> __device__ __forceinline__ void release_stage(uint64_t *empty, int rank) {
    mb_arrive(empty);
    if (CL == 2) mb_arrive_cluster(empty, rank ^ 1);
}

/* silu(g) u of the bf16-rounded g and u, as swiglu_fwd computes it from the stored product */
__device__ __forceinline__ float swiglu_of(float g, float u) {
    return swiglu_val(__bfloat162float(__float2bfloat16(g)), __bfloat162float(__float2bfloat16(u)));
}

/* The pass the fusion saves: a[M, F] = silu(gu[:, :F]) gu[:, F:], 8 columns per thread (the
 * vector path of ops_cuda.cu's k_swiglu_fwd, which is not reachable from here) */
__global__ void k_swiglu_pass(const __nv_bfloat16 *gu, __nv_bfloat16 *a, int M, int F) {
    size_t n8 = (size_t)M * F / 8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (F / 8), c = i % (F / 8) * 8;
        float g[8], u[8];
        load8(&gu[r * 2 * F + c], g);
        load8(&gu[r * 2 * F + F + c], u);
#pragma unroll
        for (int e = 0; e < 8; e++)
            g[e] = swiglu_val(g[e], u[e]);
        store8(&a[r * F + c], g);
    }
}

__device__ float g_sink; /* EPI_NONE's store (never made) */

/* CL = 2: clusters of two CTAs on vertically adjacent tiles (the same W tile): each loads its own
 * X tile and one half of the W tile, multicast to both; a stage is free when the consumers of both
 * CTAs are done with it. EPI: EPI_TMA stages the accumulators as 64 x 64 swizzled boxes and stores
 * them by tensor copies, waited for only before the next tile's staging; EPI_TMA_HALF the same two
 * boxes at a time, in half the shared memory; EPI_NONE stores nothing (a measurement of what
 * the epilogue costs: the product's time and joules without it; its output is not checked).
 * EPI_NONE adds each tile's accumulators into a sum that a store depends on: a first form
 * without a reader of the accumulators ran the lm_head at 1,010 TFLOP/s, as if ptxas had
 * dropped the wgmmas. SWIGLU (with EPI_TMA_HALF, CL 1): W is [gate; up] (N = 2F rows), a
 * tile's 256 columns are the 128 gate rows of features f0 = n0 / 2 .. + 127 and the
 * matching up rows, by two tensor copies of 128 rows (mw boxes of 128); the epilogue stores both
 * into Y [M, 2F] and silu(gate) up, from their bf16 values, into A [M, F] (map ma). */
template <int STAGES, int EPI, int CL, bool SWIGLU = false>
__global__ void __launch_bounds__(384, 1)
    k_wg_gemm(const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw,
              const __grid_constant__ CUtensorMap my, const __grid_constant__ CUtensorMap ma, int M,
              int N, int K) {
#if WG_DEVICE
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sa = smem, *sb = smem + STAGES * A_BYTES;
    uint8_t *stg = sb + STAGES * B_BYTES;
    const int stg_bytes = staging_bytes(EPI);
    uint64_t *full = (uint64_t *)(stg + stg_bytes), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int rank = CL == 2 ? cluster_rank() : 0;
    /* work items: tiles (CL 1) or vertical pairs of tiles (CL 2), one per CTA group of CL */
    const int tm = M / (BM * CL), tn = (N + BN - 1) / BN, items = tm * tn, kb = K / BK;
    const int first = blockIdx.x / CL, step = gridDim.x / CL;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++)
            mb_init(&full[s], 1), mb_init(&empty[s], 2 * CL);
        mb_init_fence();
    }
    __syncthreads();
    if (CL == 2) cluster_sync();
    if (wg == 0) {
        wg_setmaxnreg_dec<24>();
        if (tid == 0) {
            long i = 0;
            for (int t = first; t < items; t += step) {
                tile_of o = tile_at(t, tm, tn);
                int m0 = o.m0 * CL + rank * BM;
                for (int k = 0; k < kb; k++, i++) {
                    int s = (int)(i % STAGES);
                    if (i >= STAGES) mb_wait(&empty[s], (int)((i / STAGES - 1) & 1));
                    mb_arrive_tx(&full[s], A_BYTES + B_BYTES);
                    tma_load_3d(sa + s * A_BYTES, &mx, 0, m0, k, &full[s]);
                    if (SWIGLU) {
                        tma_load_3d(sb + s * B_BYTES, &mw, 0, o.n0 / 2, k, &full[s]);
                        tma_load_3d(sb + s * B_BYTES + B_BYTES / 2, &mw, 0, N / 2 + o.n0 / 2, k,
                                    &full[s]);
                    } else if (CL == 1)
                        tma_load_3d(sb + s * B_BYTES, &mw, 0, o.n0, k, &full[s]);
                    else
                        tma_load_3d_mc(sb + s * B_BYTES + rank * (B_BYTES / 2), &mw, 0,
                                       o.n0 + rank * (BN / 2), k, &full[s], 3);
                }
            }
        }
        __syncwarp();
        if (CL == 2) cluster_sync(); /* the peer's last arrivals land before either exits */
        return;
    }
    wg_setmaxnreg_inc<240>();
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;
    float acc[32][4]; /* columns 8 j .. 8 j + 7 in acc[j] */
    float sink = 0.0f; /* EPI_NONE */
    long i = 0;
    for (int t = first; t < items; t += step) {
        tile_of o = tile_at(t, tm, tn);
        const int m0 = o.m0 * CL + rank * BM;
        for (int k = 0; k < kb; k++, i++) {
            int s = (int)(i % STAGES);
            mb_wait(&full[s], (int)((i / STAGES) & 1));
            uint64_t da = wg_desc_sw128(sa + s * A_BYTES + c * 64 * 128, 16, 1024);
            uint64_t db = wg_desc_sw128(sb + s * B_BYTES, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wg_ss256_scaled(acc, da + kk * 2, db + kk * 2, k > 0 || kk > 0);
            wg_commit();
            wg_wait<1>();
            if (k > 0 && tid == 0) release_stage<CL>(&empty[(i - 1) % STAGES], rank);
        }
        wg_wait<0>();
        wg_pin_all<32>(acc);
        if (EPI == EPI_NONE)
#pragma unroll
            for (int j = 0; j < 32; j++)
                sink += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
        if (tid == 0) release_stage<CL>(&empty[(i - 1) % STAGES], rank);
        int rr = 16 * warp + lane / 4; /* this thread's first row in the consumer's 64 */
        /* 64 x 64 boxes, 128-byte swizzled: element (row, col) of box col / 64 at row * 128
         * + ((col % 64 / 8) ^ (row % 8)) * 16 + col % 8 * 2; EPI_TMA stages the consumer's
         * four at once, EPI_TMA_HALF two at a time (half the staging, for a fourth stage) */
        constexpr int per_pass = EPI == EPI_TMA ? 4 : 2;
        /* SWIGLU: gate, up, silu(g) u; EPI_NONE: none */
        constexpr int passes = EPI == EPI_NONE ? 0 : SWIGLU ? 3 : 4 / per_pass;
        uint8_t *mine = stg + c * per_pass * 8192;
#pragma unroll
        for (int pass = 0; pass < passes; pass++) {
            if (tid == 0) bulk_wait_read(); /* the staged boxes before are read */
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
#pragma unroll
            for (int jj = 0; jj < 8 * per_pass; jj++) {
                int j = SWIGLU ? (pass == 1 ? 16 : 0) + jj : pass * 8 * per_pass + jj;
                float v[4] = {acc[j][0], acc[j][1], acc[j][2], acc[j][3]};
                if (SWIGLU && pass == 2)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        v[e] = swiglu_of(acc[jj][e], acc[jj + 16][e]);
                uint8_t *box = mine + (jj / 8) * 8192;
                int ch = jj % 8, cb = 4 * (lane % 4);
                *(__nv_bfloat162 *)(box + rr * 128 + ((ch ^ (rr % 8)) * 16) + cb) =
                    __floats2bfloat162_rn(v[0], v[1]);
                *(__nv_bfloat162 *)(box + (rr + 8) * 128 + ((ch ^ ((rr + 8) % 8)) * 16) +
                                    cb) = __floats2bfloat162_rn(v[2], v[3]);
            }
            fence_async_smem();
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
            if (tid == 0) {
                for (int b = 0; b < per_pass; b++) {
                    int col = SWIGLU ? (pass == 1 ? N / 2 : 0) + o.n0 / 2 + 64 * b
                                     : o.n0 + 64 * (pass * per_pass + b);
                    const CUtensorMap *map = SWIGLU && pass == 2 ? &ma : &my;
                    if (col < (SWIGLU && pass == 2 ? N / 2 : N))
                        tma_store_2d(map, col, m0 + c * 64, mine + b * 8192);
                }
                bulk_commit();
            }
        }
    }
    if (tid == 0) bulk_wait_read();
    if (EPI == EPI_NONE && sink == 1.25e-38f) g_sink = sink; /* never true: keeps the sum */
    if (CL == 2) cluster_sync();
#endif
}

/* The K-blocked, 128-byte-swizzled map of a row-major [rows, K] bf16 matrix: dims (64, rows,
 * K / 64), box 64 x box_rows x 1 */
static CUtensorMap kblock_map(wg_encode_fn enc, const void *base, int rows, int K, int box_rows) {
    CUtensorMap m;
    const cuuint64_t dims[3] = {64, (cuuint64_t)rows, (cuuint64_t)(K / 64)};
    const cuuint64_t strides[2] = {(cuuint64_t)K * 2, 128};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, one[3] = {1, 1, 1};
    CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, one,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        printf("tensor map refused (rows %d K %d)\n", rows, K);
        exit(1);
    }
    return m;
}

/* The 128-byte-swizzled map of the row-major [M, N] bf16 output, boxes of 64 x 64 */
static CUtensorMap store_map(wg_encode_fn enc, const void *base, int M, int N) {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)N, (cuuint64_t)M}, strides[1] = {(cuuint64_t)N * 2};
    const cuuint32_t box[2] = {64, 64}, one[2] = {1, 1};
    if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, one,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        printf("tensor map refused (output %d x %d)\n", M, N);
        exit(1);
    }
    return m;
}

static cublasLtHandle_t lt;
static void *ws;
static size_t ws_bytes = 32 << 20;
static int g_sms;
static bench_energy g_en;

struct product {
    const char *name;
    int M, N, K;
    __nv_bfloat16 *X, *W, *Y, *Yref;
    CUtensorMap mx, mw, mw_half, my; /* W by 256 rows (CL 1) or 128 (CL 2); Y by 64 x 64 */
    probe_linear lin; /* cuBLASLt's description; algo: the best of 8 by a cool timing */
    cublasLtMatmulAlgo_t algo;
};

/* The variants timed: stages, epilogue, cluster size */
typedef void (*gemm_kernel)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, int, int, int);
struct variant {
    const char *name;
    gemm_kernel kernel;
    int smem, cl;
};
#define VARIANT(S, E, CL) \
    { #S " stages " #E " cl " #CL, (gemm_kernel)k_wg_gemm<S, E, CL>, \
      smem_bytes(S, E), CL }
static const variant variants[] = {VARIANT(3, EPI_TMA, 1), VARIANT(4, EPI_TMA_HALF, 1),
                                   VARIANT(4, EPI_NONE, 1)};
#define N_VARIANTS 3

/* Clusters of each variant that fit on the device at once (cudaOccupancyMaxActiveClusters):
 * a persistent grid of more would leave some waiting for others to finish all their work */
static int g_max_clusters[16];

/* The launch of variant v on a grid of `clusters` clusters; a plain launch for cluster 1 (call
 * 5's launches of size 1 with the attribute read slower, on another board: not isolated).
 * cfg points into *at. */
static cudaLaunchConfig_t launch_of(int v, int clusters, cudaLaunchAttribute *at) {
    const variant &w = variants[v];
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(clusters * w.cl);
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = (size_t)w.smem;
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = (unsigned)w.cl, at->val.clusterDim.y = 1, at->val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = w.cl > 1;
    return cfg;
}

static void run_ours(const product &p, int v) {
    const variant &w = variants[v];
    int items = (p.M / (BM * w.cl)) * ((p.N + BN - 1) / BN);
    const CUtensorMap *mw = w.cl == 2 ? &p.mw_half : &p.mw;
    void *args[] = {(void *)&p.mx, (void *)mw,   (void *)&p.my, (void *)&p.my,
                    (void *)&p.M,  (void *)&p.N, (void *)&p.K};
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg = launch_of(v, std::min(items, g_max_clusters[v]), &at);
    CK(cudaLaunchKernelExC(&cfg, (const void *)w.kernel, args));
}

static void find_max_clusters(void) {
    for (int v = 0; v < N_VARIANTS; v++) {
        const variant &w = variants[v];
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = launch_of(v, g_sms / w.cl, &at);
        cfg.numAttrs = 1; /* the occupancy query needs the cluster shape, 1 included */
        int n = 0;
        CK(cudaOccupancyMaxActiveClusters(&n, (const void *)w.kernel, &cfg));
        g_max_clusters[v] = w.cl > 1 ? n : g_sms;
        printf("%-22s at most %d clusters of %d at once\n", w.name, n, w.cl);
    }
}

static void run_lt(const product &p, __nv_bfloat16 *out) {
    float one = 1, zero = 0;
    LK(cublasLtMatmul(lt, p.lin.op, &one, p.W, p.lin.a, p.X, p.lin.b, &zero, out, p.lin.c, out,
                      p.lin.c, &p.algo, ws, ws_bytes, 0));
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

template <class F> static float cool_ms(F body) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> v;
    for (int r = 0; r < 5; r++) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(a));
        body();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms);
    }
    std::sort(v.begin(), v.end());
    return v[2];
}

/* ms and J per call over ~sec seconds of back-to-back calls, after 0.3 s of heating */
template <class F> static void sustained(F body, double sec, double *ms, double *j) {
    for (double t0 = now_s(); now_s() - t0 < 0.3;) {
        body();
        CK(cudaDeviceSynchronize());
    }
    double t0 = now_s(), j0 = bench_energy_j(&g_en);
    long calls = 0;
    while (now_s() - t0 < sec) {
        for (int r = 0; r < 4; r++)
            body();
        CK(cudaDeviceSynchronize());
        calls += 4;
    }
    double t1 = now_s(), j1 = bench_energy_j(&g_en);
    *ms = (t1 - t0) * 1e3 / calls, *j = (j1 - j0) / calls;
}

static void setup(product &p, wg_encode_fn enc) {
    CK(cudaMalloc(&p.X, (size_t)p.M * p.K * 2));
    CK(cudaMalloc(&p.W, (size_t)p.N * p.K * 2));
    CK(cudaMalloc(&p.Y, (size_t)p.M * p.N * 2));
    CK(cudaMalloc(&p.Yref, (size_t)p.M * p.N * 2));
    probe_fill<<<1024, 256>>>(p.X, (size_t)p.M * p.K, 11, 0.25f);
    probe_fill<<<1024, 256>>>(p.W, (size_t)p.N * p.K, 12, 0.25f);
    p.mx = kblock_map(enc, p.X, p.M, p.K, BM);
    p.mw = kblock_map(enc, p.W, p.N, p.K, BN);
    p.mw_half = kblock_map(enc, p.W, p.N, p.K, BN / 2);
    p.my = store_map(enc, p.Y, p.M, p.N);
    p.lin = probe_linear_make(p.M, p.N, p.K);
    cublasLtMatmulHeuristicResult_t res[8];
    int found = probe_linear_candidates(lt, p.lin, ws_bytes, res, 8);
    float best = INFINITY;
    int pick = 0;
    for (int c = 0; c < found; c++) {
        p.algo = res[c].algo;
        float ms = cool_ms([&] { run_lt(p, p.Yref); });
        if (ms < best) best = ms, pick = c;
    }
    p.algo = res[pick].algo;
}

/* max |x - ref| over n bf16 values on the device, relative to max |ref| */
static double rel_error(const __nv_bfloat16 *x_d, const __nv_bfloat16 *ref_d, size_t n) {
    std::vector<__nv_bfloat16> a(n), b(n);
    CK(cudaMemcpy(a.data(), x_d, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), ref_d, n * 2, cudaMemcpyDeviceToHost));
    double d = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double x = __bfloat162float(a[i]), r = __bfloat162float(b[i]);
        if (!(std::fabs(x - r) <= d)) d = std::fabs(x - r); /* NaN propagates */
        ref = std::max(ref, std::fabs(r));
    }
    return d / ref;
}

/* max |ours - cuBLASLt| over all outputs, relative to max |cuBLASLt| */
static double check(const product &p) {
    return rel_error(p.Y, p.Yref, (size_t)p.M * p.N);
}

/* The fusion the kernel is for, measured: the gate|up product with SwiGLU in its epilogue
 * (k_wg_gemm's SWIGLU) against the product, then k_swiglu_pass over its output (cuBLASLt's
 * and ours, variant 1: 4 stages), each sustained as one unit; outputs checked against
 * cuBLASLt + pass.
 * Returns false where an output differs. */
static bool swiglu_test(wg_encode_fn enc, double sec) {
    product p = {"gate|up + SwiGLU 8192 x 24576 x 4096", 8192, 24576, 4096};
    setup(p, enc);
    const int F = p.N / 2;
    const size_t na = (size_t)p.M * F;
    __nv_bfloat16 *A, *Aref;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&Aref, na * 2));
    CUtensorMap ma = store_map(enc, A, p.M, F);
    gemm_kernel fused = (gemm_kernel)k_wg_gemm<4, EPI_TMA_HALF, 1, true>;
    const int smem = smem_bytes(4, EPI_TMA_HALF);
    CK(cudaFuncSetAttribute((const void *)fused, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem));
    auto pass = [&](const __nv_bfloat16 *gu, __nv_bfloat16 *a) {
        k_swiglu_pass<<<g_sms * 8, 256>>>(gu, a, p.M, F);
        CK(cudaGetLastError());
    };
    auto run_fused = [&] {
        int tiles = (p.M / BM) * (p.N / BN);
        void *args[] = {(void *)&p.mx, (void *)&p.mw_half, (void *)&p.my, (void *)&ma,
                        (void *)&p.M,  (void *)&p.N,       (void *)&p.K};
        CK(cudaLaunchKernel((const void *)fused, dim3(std::min(tiles, g_sms)), dim3(384), args,
                            (size_t)smem, 0));
    };
    run_lt(p, p.Yref);
    pass(p.Yref, Aref);
    CK(cudaMemset(p.Y, 0xff, (size_t)p.M * p.N * 2));
    CK(cudaMemset(A, 0xff, na * 2));
    run_fused();
    CK(cudaDeviceSynchronize());
    double e_gu = check(p), e_a = rel_error(A, Aref, na);
    bool good = e_gu < 1e-2 && e_a < 1e-2;
    printf("%s: fused gate|up max error / max |ref| %.2e, SwiGLU %.2e %s\n", p.name, e_gu, e_a,
           good ? "ok" : "FAILED");
    const char *names[3] = {"cuBLASLt + pass", "ours + pass", "ours fused"};
    auto body = [&](int b) {
        if (b == 0) run_lt(p, p.Y), pass(p.Y, A);
        else if (b == 1) run_ours(p, 1), pass(p.Y, A);
        else run_fused();
    };
    for (int round = 0; good && round < 2; round++) {
        double ms[3], j[3];
        for (int q = 0; q < 3; q++) {
            int b = round ? 2 - q : q;
            sustained([&] { body(b); }, sec, &ms[b], &j[b]);
        }
        printf("  round %d:", round);
        for (int b = 0; b < 3; b++)
            printf(" | %s %.3f ms, %.4f J (%.0f W), J / first's %.3f", names[b], ms[b], j[b],
                   j[b] / ms[b] * 1e3, j[b] / j[0]);
        printf("\n");
    }
    if (good) {
        CK(cudaDeviceSynchronize());
        usleep(200000);
        printf("  cool:");
        for (int b = 0; b < 3; b++)
            printf(" | %s %.3f ms", names[b], cool_ms([&] { body(b); }));
        printf("\n");
    }
    CK(cudaFree(p.X)), CK(cudaFree(p.W)), CK(cudaFree(p.Y)), CK(cudaFree(p.Yref));
    CK(cudaFree(A)), CK(cudaFree(Aref));
    return good;
}

int main(int argc, char **argv) {
    double sec = argc > 1 ? atof(argv[1]) : 1.5;
    if (!wg_device_runs_sm90a()) {
        printf("wg_gemm_probe: needs an sm_90 device\n");
        return 77;
    }
    wg_encode_fn enc = wg_tensor_map_encoder();
    if (!enc || bench_energy_open(&g_en, 0) != 0) return 1;
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    for (const variant &v : variants)
        CK(cudaFuncSetAttribute((const void *)v.kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_bytes));
    find_max_clusters();
    if (argc > 2 && strcmp(argv[2], "swiglu") == 0) return swiglu_test(enc, sec) ? 0 : 1;
    std::vector<product> ps = {{"check 256 x 512 x 128", 256, 512, 128},
                               {"check 512 x 600 x 4096", 512, 600, 4096},
                               {"q/o 8192 x 4096 x 4096", 8192, 4096, 4096},
                               {"gate|up 8192 x 24576 x 4096", 8192, 24576, 4096},
                               {"down 8192 x 4096 x 12288", 8192, 4096, 12288},
                               {"lm_head 7680 x 151936 x 4096", 7680, 151936, 4096}};
    printf("tile %d x %d x %d, %d SMs, board limit %.0f W, %.1f s sustained\n", BM, BN, BK,
           g_sms, g_en.limit_w, sec);
    bool ok = true;
    for (product &p : ps) {
        setup(p, enc);
        run_lt(p, p.Yref);
        bool good = true;
        for (int v = 0; v < N_VARIANTS; v++) {
            CK(cudaMemset(p.Y, 0xff, (size_t)p.M * p.N * 2)); /* NaN where nothing is stored */
            run_ours(p, v);
            CK(cudaDeviceSynchronize());
            if (variants[v].kernel == (gemm_kernel)k_wg_gemm<4, EPI_NONE, 1>) {
                printf("%-30s %-18s stores nothing: not checked\n", p.name, variants[v].name);
                continue;
            }
            double err = check(p);
            good = good && err < 1e-2;
            printf("%-30s %-18s max error / max |ref| %.2e %s\n", p.name, variants[v].name, err,
                   err < 1e-2 ? "ok" : "FAILED");
        }
        ok = ok && good;
        double flop = 2.0 * p.M * p.N * p.K;
        for (int round = 0; good && p.M >= 1024 && round < 2; round++) {
            double ms[N_VARIANTS + 1], j[N_VARIANTS + 1];
            for (int q = 0; q <= N_VARIANTS; q++) {
                int v = round ? N_VARIANTS - q : q; /* cuBLASLt is v == N_VARIANTS */
                if (v == N_VARIANTS)
                    sustained([&] { run_lt(p, p.Y); }, sec, &ms[v], &j[v]);
                else
                    sustained([&] { run_ours(p, v); }, sec, &ms[v], &j[v]);
            }
            printf("  round %d: cuBLASLt %.3f ms, %.4f J (%.3f pJ/FLOP, %.0f W)", round,
                   ms[N_VARIANTS], j[N_VARIANTS], j[N_VARIANTS] / flop * 1e12,
                   j[N_VARIANTS] / ms[N_VARIANTS] * 1e3);
            for (int v = 0; v < N_VARIANTS; v++)
                printf(" | %s %.3f ms, %.4f J (%.0f W), J / cuBLASLt's %.3f", variants[v].name,
                       ms[v], j[v], j[v] / ms[v] * 1e3, j[v] / j[N_VARIANTS]);
            printf("\n");
        }
        for (int round = 0; good && p.M >= 1024 && round < 1; round++) {
            CK(cudaDeviceSynchronize());
            usleep(200000); /* a cooler board for the cool timings */
            printf("  cool: cuBLASLt %.3f ms", cool_ms([&] { run_lt(p, p.Y); }));
            for (int v = 0; v < N_VARIANTS; v++)
                printf(" | %s %.3f ms", variants[v].name, cool_ms([&] { run_ours(p, v); }));
            printf("\n");
        }
        CK(cudaFree(p.X)), CK(cudaFree(p.W)), CK(cudaFree(p.Y)), CK(cudaFree(p.Yref));
    }
    return ok ? 0 : 1;
}

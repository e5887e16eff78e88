/* wg_gemm: a bf16 GEMM of our own on Hopper tensor copies and wgmma (sm_90a), for the products
 * whose epilogue cuBLASLt cannot do. Y[M, N] = X[M, K] W[N, K]^T (row-major, both operands
 * K-major: linear_fwd's product), fp32 accumulation, one rounding to bf16.
 *
 * Why: at the H200's 700 W limit a product's time is its energy; this kernel spends cuBLASLt's
 * joules per FLOP within 1-2% on the drafter's layer shapes (bench/cuda_ops/NOTES.md, "A GEMM of
 * our own at the limit"), so a memory pass folded into its epilogue pays. The SWIGLU epilogue
 * (ops_cuda_wg_gemm.cu's linear_swiglu_fwd) stores the gate|up product and silu(gate) up at once,
 * saving swiglu_fwd's read of the product.
 *
 * The kernel: persistent CTAs of 3 warpgroups. A producer (one thread) issues the tensor copies
 * of X tiles 128 x 64 and W tiles 256 x 64, 128-byte swizzled, STAGES deep; two consumers take
 * 64 rows x 256 columns each, one m64n256k16 wgmma per k16 step, releasing a stage when their
 * wgmma group completes. Tiles go in groups of WGG_GROUP_M along M for L2 reuse. The epilogue
 * stages the accumulators as 64 x 64 swizzled boxes and stores them by tensor stores, waited for
 * only before the next staging: EPI_TMA all four boxes of a consumer at once, EPI_TMA_HALF two at
 * a time in half the shared memory (which leaves room for a fourth stage). Rows past M and
 * columns past N are read as zeros and never stored (the tensor maps' bounds).
 * SWIGLU (EPI_TMA_HALF): W is [gate; up] (N = 2F rows, F % 128 == 0); a tile's 256 columns are
 * the 128 gate rows of features f0 = n0 / 2 .. + 127 and the matching up rows (two copies of 128
 * rows, map mw of boxes of 128); the epilogue stores both into Y [M, 2F] and silu(g) u of their
 * bf16 values, as swiglu_fwd computes it from the stored product, into A [M, F] (map ma).
 * Shapes: K % 64 == 0, rows 16-byte aligned (wgg_*_map refuse the rest).
 *
 * Header-only, include from sm_90a translation units (wgmma.cuh); also used by
 * bench/cuda_ops/wg_gemm_probe.cu, which times its variants against cuBLASLt.
 */
#ifndef DFLASH_WG_GEMM_CUH
#define DFLASH_WG_GEMM_CUH

#include "cuda_elem.cuh"
#include "wgmma.cuh"

#define WGG_BM 128
#define WGG_BN 256
#define WGG_BK 64
#define WGG_GROUP_M 16
#define WGG_A_BYTES (WGG_BM * WGG_BK * 2)
#define WGG_B_BYTES (WGG_BN * WGG_BK * 2)
#define WGG_THREADS 384

enum { EPI_TMA, EPI_TMA_HALF }; /* the epilogues (above) */

/* The staging of epilogue epi, and the shared memory of a variant: its stages, the staging,
 * the alignment slack and the barriers */
__host__ __device__ constexpr int wgg_staging_bytes(int epi) {
    return epi == EPI_TMA ? WGG_BM * WGG_BN * 2 : WGG_BM * WGG_BN;
}
__host__ __device__ constexpr int wgg_smem_bytes(int stages, int epi) {
    return stages * (WGG_A_BYTES + WGG_B_BYTES) + wgg_staging_bytes(epi) + 1024 + 2 * stages * 8;
}

/* Tiles of an M x N product: tm x tn, the last row and column of tiles possibly partial */
static inline int wgg_tiles(int M, int N) {
    return ((M + WGG_BM - 1) / WGG_BM) * ((N + WGG_BN - 1) / WGG_BN);
}

struct wgg_tile {
    int m0, n0;
};

/* Tile t of tm x tn in groups of WGG_GROUP_M tiles along M (M fastest inside a group) */
__device__ __forceinline__ wgg_tile wgg_tile_at(int t, int tm, int tn) {
    int per_group = WGG_GROUP_M * tn, g = t / per_group, r = t % per_group;
    int rows = min(WGG_GROUP_M, tm - g * WGG_GROUP_M);
    wgg_tile o;
    o.m0 = (g * WGG_GROUP_M + r % rows) * WGG_BM;
    o.n0 = (r / rows) * WGG_BN;
    return o;
}

/* Tensor store (TMA) of the box at smem src to tensor map *map at (c0, c1), in this thread's
 * bulk group; wgg_bulk_commit closes the group, wgg_bulk_wait_read waits until no group of this
 * thread still reads shared memory. */
__device__ __forceinline__ void wgg_tma_store_2d(const void *map, int c0, int c1, const void *src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"((uint32_t)__cvta_generic_to_shared(src))
                 : "memory");
}
__device__ __forceinline__ void wgg_bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void wgg_bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
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

/* silu(g) u of the bf16-rounded g and u, as swiglu_fwd computes it from the stored product */
__device__ __forceinline__ float wgg_swiglu_of(float g, float u) {
    return swiglu_val(__bfloat162float(__float2bfloat16(g)), __bfloat162float(__float2bfloat16(u)));
}

/* The kernel (above). Maps: mx, mw by wgg_kblock_map (boxes of WGG_BM rows of X; WGG_BN rows of
 * W, or WGG_BN / 2 with SWIGLU), my and ma by wgg_store_map (ma read only with SWIGLU). Launch
 * with WGG_THREADS threads, wgg_smem_bytes(STAGES, EPI) of dynamic shared memory and at most
 * wgg_tiles(M, N) CTAs. */
template <int STAGES, int EPI, bool SWIGLU = false>
__global__ void __launch_bounds__(WGG_THREADS, 1)
    k_wg_gemm(const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw,
              const __grid_constant__ CUtensorMap my, const __grid_constant__ CUtensorMap ma, int M,
              int N, int K) {
#if WG_DEVICE
    static_assert(!SWIGLU || EPI == EPI_TMA_HALF, "the SwiGLU epilogue stages two boxes a pass");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sa = smem, *sb = smem + STAGES * WGG_A_BYTES;
    uint8_t *stg = sb + STAGES * WGG_B_BYTES;
    uint64_t *full = (uint64_t *)(stg + wgg_staging_bytes(EPI)), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int tm = (M + WGG_BM - 1) / WGG_BM, tn = (N + WGG_BN - 1) / WGG_BN, items = tm * tn;
    const int kb = K / WGG_BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++)
            mb_init(&full[s], 1), mb_init(&empty[s], 2);
        mb_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        wg_setmaxnreg_dec<24>();
        if (tid == 0) {
            long i = 0;
            for (int t = blockIdx.x; t < items; t += gridDim.x) {
                wgg_tile o = wgg_tile_at(t, tm, tn);
                for (int k = 0; k < kb; k++, i++) {
                    int s = (int)(i % STAGES);
                    if (i >= STAGES) mb_wait(&empty[s], (int)((i / STAGES - 1) & 1));
                    mb_arrive_tx(&full[s], WGG_A_BYTES + WGG_B_BYTES);
                    tma_load_3d(sa + s * WGG_A_BYTES, &mx, 0, o.m0, k, &full[s]);
                    uint8_t *b = sb + s * WGG_B_BYTES;
                    if (SWIGLU) {
                        tma_load_3d(b, &mw, 0, o.n0 / 2, k, &full[s]);
                        tma_load_3d(b + WGG_B_BYTES / 2, &mw, 0, N / 2 + o.n0 / 2, k, &full[s]);
                    } else {
                        tma_load_3d(b, &mw, 0, o.n0, k, &full[s]);
                    }
                }
            }
        }
        __syncwarp();
        return;
    }
    wg_setmaxnreg_inc<240>();
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;
    float acc[32][4]; /* columns 8 j .. 8 j + 7 in acc[j] */
    long i = 0;
    for (int t = blockIdx.x; t < items; t += gridDim.x) {
        wgg_tile o = wgg_tile_at(t, tm, tn);
        for (int k = 0; k < kb; k++, i++) {
            int s = (int)(i % STAGES);
            mb_wait(&full[s], (int)((i / STAGES) & 1));
            uint64_t da = wg_desc_sw128(sa + s * WGG_A_BYTES + c * 64 * 128, 16, 1024);
            uint64_t db = wg_desc_sw128(sb + s * WGG_B_BYTES, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < WGG_BK / 16; kk++)
                wg_ss256_scaled(acc, da + kk * 2, db + kk * 2, k > 0 || kk > 0);
            wg_commit();
            wg_wait<1>();
            if (k > 0 && tid == 0) mb_arrive(&empty[(i - 1) % STAGES]);
        }
        wg_wait<0>();
        wg_pin_all<32>(acc);
        if (tid == 0) mb_arrive(&empty[(i - 1) % STAGES]);
        int rr = 16 * warp + lane / 4; /* this thread's first row in the consumer's 64 */
        /* 64 x 64 boxes, 128-byte swizzled: element (row, col) of box col / 64 at row * 128
         * + ((col % 64 / 8) ^ (row % 8)) * 16 + col % 8 * 2 */
        constexpr int per_pass = EPI == EPI_TMA ? 4 : 2;
        constexpr int passes = SWIGLU ? 3 : 4 / per_pass; /* SWIGLU: gate, up, silu(g) u */
        uint8_t *mine = stg + c * per_pass * 8192;
#pragma unroll
        for (int pass = 0; pass < passes; pass++) {
            if (tid == 0) wgg_bulk_wait_read(); /* the staged boxes before are read */
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
#pragma unroll
            for (int jj = 0; jj < 8 * per_pass; jj++) {
                int j = SWIGLU ? (pass == 1 ? 16 : 0) + jj : pass * 8 * per_pass + jj;
                float v[4] = {acc[j][0], acc[j][1], acc[j][2], acc[j][3]};
                if (SWIGLU && pass == 2)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        v[e] = wgg_swiglu_of(acc[jj][e], acc[jj + 16][e]);
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
                        wgg_tma_store_2d(map, col, o.m0 + c * 64, mine + b * 8192);
                }
                wgg_bulk_commit();
            }
        }
    }
    if (tid == 0) wgg_bulk_wait_read();
#endif
}

/* Host side. The K-blocked, 128-byte-swizzled map of a row-major [rows, K] bf16 matrix: dims
 * (64, rows, K / 64), box 64 x box_rows x 1. 0, or -1 where the shape or the alignment does not
 * allow it (K % 64, base not 16-byte aligned) or enc refuses. */
static inline int wgg_kblock_map(wg_encode_fn enc, CUtensorMap *m, const void *base, int rows,
                                 int K, int box_rows) {
    if (K % 64 != 0 || rows <= 0 || (uintptr_t)base % 16 != 0) return -1;
    const cuuint64_t dims[3] = {64, (cuuint64_t)rows, (cuuint64_t)(K / 64)};
    const cuuint64_t strides[2] = {(cuuint64_t)K * 2, 128};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, one[3] = {1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, one,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* The 128-byte-swizzled map of a row-major [M, N] bf16 output, boxes of 64 x 64. 0, or -1
 * (N % 8, base not 16-byte aligned, or enc refuses). */
static inline int wgg_store_map(wg_encode_fn enc, CUtensorMap *m, const void *base, int M, int N) {
    if (N % 8 != 0 || M <= 0 || (uintptr_t)base % 16 != 0) return -1;
    const cuuint64_t dims[2] = {(cuuint64_t)N, (cuuint64_t)M}, strides[1] = {(cuuint64_t)N * 2};
    const cuuint32_t box[2] = {64, 64}, one[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, one,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

#endif

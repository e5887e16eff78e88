/* wg_gemm_probe: can a GEMM of our own match cuBLASLt's joules per FLOP at the power limit?
 *
 * A one-off measurement behind bench/cuda_ops/NOTES.md, "A GEMM of our own at the limit". What
 * is left between the drafter step and 1.3x PyTorch lies in fusions that cuBLASLt cannot do
 * (SwiGLU into the gate|up product's epilogue, the softmax statistics into the lm_head's), and
 * at the board's 700 W limit a product's time is its energy. Such fusions pay only if a kernel
 * of ours spends about cuBLASLt's joules per FLOP. This program times a plain one against
 * cuBLASLt (the best of the heuristic's 8 by a cool timing, as ops_cuda picks) on the step's
 * largest shapes: cool (median of 5 runs) and sustained (~1.5 s after 0.3 s of heating, joules
 * from NVML's counter, ../target/energy.h), and checks its output against cuBLASLt's.
 *
 * The kernel: Y[M, N] = X[M, K] W[N, K]^T (row-major bf16, fp32 accumulation; linear_fwd's
 * product). Persistent CTAs of 3 warpgroups: a producer (one thread issues the tensor copies:
 * X tiles of 128 x 64 and W tiles of 256 x 64, 128-byte swizzled, STAGES deep) and two
 * consumers, each 64 rows x 256 columns as two m64n128k16 wgmma per k16 step, releasing a
 * stage when its wgmma group completes; tiles in groups of 16 along M for L2 reuse; the
 * epilogue stores bf16 pairs from the accumulators (no staging). Not built by CMake:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. -Icommon/nn bench/cuda_ops/wg_gemm_probe.cu \
 *     -o wg_gemm_probe -lcublasLt -lcuda -ldl
 */
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "probe_check.h"
#include "wgmma.cuh"

#include "../target/energy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <unistd.h>

#define BM 128
#define BN 256
#define BK 64
#define GROUP_M 16
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define STG_ROW (BN * 2 + 16) /* a staged output row: 16 bytes of padding against bank conflicts */
#define STG_BYTES (BM * STG_ROW)

/* Shared memory of a variant: STAGES stages, plus the output staging where STAGED */
static constexpr int smem_bytes(int stages, bool staged) {
    return stages * (A_BYTES + B_BYTES) + (staged ? STG_BYTES : 0) + 1024 + 2 * stages * 8;
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

/* d (64 x 128) = A B + (add ? d : 0), both K-major in shared memory: wg_ss<128> with the
 * scale-d predicate taken at run time, so that the first k16 step of a tile is the same code
 * as the others (two code paths made ptxas insert warpgroup waits) */
__device__ __forceinline__ void wg_ss128_scaled(float (&d)[16][4], uint64_t da, uint64_t db,
                                                int add) {
#if WG_DEVICE
    asm volatile(WG_ASM(66, "m64n128k16", WG_REGS64, "%64, %65, p, 1, 1, 0, 0")
                 : WG_ACC16("+f", d)
                 : "l"(da), "l"(db), "r"(add)
                 : "memory");
#endif
}

template <int STAGES, bool STAGED>
__global__ void __launch_bounds__(384, 1)
    k_wg_gemm(const __grid_constant__ CUtensorMap mx, const __grid_constant__ CUtensorMap mw,
              __nv_bfloat16 *y, int M, int N, int K) {
#if WG_DEVICE
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sa = smem, *sb = smem + STAGES * A_BYTES;
    uint8_t *stg = sb + STAGES * B_BYTES; /* STG_BYTES where STAGED */
    uint64_t *full = (uint64_t *)(stg + (STAGED ? STG_BYTES : 0)), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int tm = M / BM, tn = (N + BN - 1) / BN, tiles = tm * tn, kb = K / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++)
            mb_init(&full[s], 1), mb_init(&empty[s], 2);
        mb_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        wg_setmaxnreg_dec<24>();
        if (tid != 0) return;
        long i = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            tile_of o = tile_at(t, tm, tn);
            for (int k = 0; k < kb; k++, i++) {
                int s = (int)(i % STAGES);
                if (i >= STAGES) mb_wait(&empty[s], (int)((i / STAGES - 1) & 1));
                mb_arrive_tx(&full[s], A_BYTES + B_BYTES);
                tma_load_3d(sa + s * A_BYTES, &mx, 0, o.m0, k, &full[s]);
                tma_load_3d(sb + s * B_BYTES, &mw, 0, o.n0, k, &full[s]);
            }
        }
        return;
    }
    wg_setmaxnreg_inc<240>();
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;
    float acc0[16][4], acc1[16][4];
    long i = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        tile_of o = tile_at(t, tm, tn);
        for (int k = 0; k < kb; k++, i++) {
            int s = (int)(i % STAGES);
            mb_wait(&full[s], (int)((i / STAGES) & 1));
            uint64_t da = wg_desc_sw128(sa + s * A_BYTES + c * 64 * 128, 16, 1024);
            uint64_t db0 = wg_desc_sw128(sb + s * B_BYTES, 16, 1024);
            uint64_t db1 = wg_desc_sw128(sb + s * B_BYTES + 128 * 128, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                int add = k > 0 || kk > 0;
                wg_ss128_scaled(acc0, da + kk * 2, db0 + kk * 2, add);
                wg_ss128_scaled(acc1, da + kk * 2, db1 + kk * 2, add);
            }
            wg_commit();
            wg_wait<1>();
            if (k > 0 && tid == 0) mb_arrive(&empty[(i - 1) % STAGES]);
        }
        wg_wait<0>();
        wg_pin_all<16>(acc0);
        wg_pin_all<16>(acc1);
        if (tid == 0) mb_arrive(&empty[(i - 1) % STAGES]);
        int rr = 16 * warp + lane / 4; /* this thread's first row in the consumer's 64 */
        if (!STAGED) {
            int r = o.m0 + c * 64 + rr;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                int col = o.n0 + 8 * j + 2 * (lane % 4);
                const float *a = j < 16 ? acc0[j] : acc1[j - 16];
                if (col < N) {
                    *(__nv_bfloat162 *)&y[(size_t)r * N + col] =
                        __floats2bfloat162_rn(a[0], a[1]);
                    *(__nv_bfloat162 *)&y[(size_t)(r + 8) * N + col] =
                        __floats2bfloat162_rn(a[2], a[3]);
                }
            }
            continue;
        }
        /* staged: the consumer's 64 x 256 bf16 into its rows of stg, then 16-byte stores of
         * whole rows (named barrier 1 + c: this consumer's 128 threads) */
        uint8_t *mine = stg + c * 64 * STG_ROW;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const float *a = j < 16 ? acc0[j] : acc1[j - 16];
            int cb = (8 * j + 2 * (lane % 4)) * 2;
            *(__nv_bfloat162 *)(mine + rr * STG_ROW + cb) = __floats2bfloat162_rn(a[0], a[1]);
            *(__nv_bfloat162 *)(mine + (rr + 8) * STG_ROW + cb) =
                __floats2bfloat162_rn(a[2], a[3]);
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
#pragma unroll 4
        for (int q = tid; q < 64 * (BN / 8); q += 128) {
            int row = q / (BN / 8), col = o.n0 + (q % (BN / 8)) * 8;
            if (col < N)
                *(uint4 *)&y[(size_t)(o.m0 + c * 64 + row) * N + col] =
                    *(const uint4 *)(mine + row * STG_ROW + (q % (BN / 8)) * 16);
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
    }
#endif
}

__global__ void fill(__nv_bfloat16 *x, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        x[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.25f);
    }
}

/* The K-blocked, 128-byte-swizzled map of a row-major [rows, K] bf16 matrix: dims (64, rows,
 * K / 64), box 64 x box_rows x 1 */
static CUtensorMap kblock_map(wg_encode_fn enc, const void *base, int rows, int K, int box_rows) {
    CUtensorMap m;
    const cuuint64_t dims[3] = {64, (cuuint64_t)rows, (cuuint64_t)(K / 64)};
    const cuuint64_t strides[2] = {(cuuint64_t)K * 2, 128};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, one[3] = {1, 1, 1};
    if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, one,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        printf("tensor map refused (rows %d K %d)\n", rows, K);
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
    CUtensorMap mx, mw;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

/* The variants timed: stages and epilogue */
struct variant {
    const char *name;
    void (*kernel)(CUtensorMap, CUtensorMap, __nv_bfloat16 *, int, int, int);
    int smem;
};
#define VARIANT(S, STG) \
    { #S " stages, " #STG, (void (*)(CUtensorMap, CUtensorMap, __nv_bfloat16 *, int, int, \
                                     int))k_wg_gemm<S, STG>, smem_bytes(S, STG) }
static const variant variants[] = {VARIANT(4, false), VARIANT(3, false), VARIANT(3, true)};
#define N_VARIANTS 3

static void run_ours(const product &p, int v) {
    int tiles = (p.M / BM) * ((p.N + BN - 1) / BN);
    const variant &w = variants[v];
    void *args[] = {(void *)&p.mx, (void *)&p.mw, (void *)&p.Y, (void *)&p.M, (void *)&p.N,
                    (void *)&p.K};
    CK(cudaLaunchKernel((const void *)w.kernel, dim3(std::min(tiles, g_sms)), dim3(384), args,
                        (size_t)w.smem, 0));
}

static void run_lt(const product &p, __nv_bfloat16 *out) {
    float one = 1, zero = 0;
    LK(cublasLtMatmul(lt, p.op, &one, p.W, p.la, p.X, p.lb, &zero, out, p.lc, out, p.lc, &p.algo,
                      ws, ws_bytes, 0));
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
    fill<<<1024, 256>>>(p.X, (size_t)p.M * p.K, 11);
    fill<<<1024, 256>>>(p.W, (size_t)p.N * p.K, 12);
    p.mx = kblock_map(enc, p.X, p.M, p.K, BM);
    p.mw = kblock_map(enc, p.W, p.N, p.K, BN);
    /* cuBLASLt, column-major: Y^T (N x M) = op_T(W: K x N) X^T (K x M), as ops_cuda runs it */
    LK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    LK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, p.K, p.N, p.K));
    LK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, p.K, p.M, p.K));
    LK(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_16BF, p.N, p.M, p.N));
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[8];
    int found = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 8, res, &found));
    LK(cublasLtMatmulPreferenceDestroy(pref));
    float best = INFINITY;
    int pick = 0;
    for (int c = 0; c < found; c++) {
        p.algo = res[c].algo;
        float ms = cool_ms([&] { run_lt(p, p.Yref); });
        if (ms < best) best = ms, pick = c;
    }
    p.algo = res[pick].algo;
}

/* max |ours - cuBLASLt| over all outputs, relative to max |cuBLASLt| */
static double check(const product &p) {
    size_t n = (size_t)p.M * p.N;
    std::vector<__nv_bfloat16> a(n), b(n);
    CK(cudaMemcpy(a.data(), p.Y, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), p.Yref, n * 2, cudaMemcpyDeviceToHost));
    double d = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double x = __bfloat162float(a[i]), r = __bfloat162float(b[i]);
        if (!(std::fabs(x - r) <= d)) d = std::fabs(x - r); /* NaN propagates */
        ref = std::max(ref, std::fabs(r));
    }
    return d / ref;
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
    std::vector<product> ps = {{"check 256 x 512 x 128", 256, 512, 128},
                               {"check 384 x 600 x 4096", 384, 600, 4096},
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
